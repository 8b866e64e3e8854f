/* jinja.c - a sandboxed Jinja2 interpreter for chat templates (see jinja.h).
 *
 * Three stages in one file: a lexer that turns the source into text pieces and tag tokens
 * (applying whitespace control, trim_blocks and lstrip_blocks there, as Jinja does), a
 * recursive-descent parser into an immutable node tree, and a tree-walking evaluator.
 *
 * Memory: everything a render allocates lives in one arena freed at the end, so an error
 * anywhere can unwind with longjmp without leaking, and the arena's size is the memory bound.
 * Values are small structs passed by value; strings, lists and dicts are arena-owned and never
 * mutated after construction (the sandbox is immutable, like HF's), except namespace() objects,
 * which `{% set ns.x = ... %}` writes, and which is why templates use them.
 *
 * Semantics follow Python jinja2 3.1 where chat templates can see the difference: Undefined
 * prints as "" and iterates as empty but fails on attribute access, arithmetic and tojson;
 * None is not iterable ("argument of type 'NoneType' is not iterable"); str + non-str is a
 * TypeError; strings are indexed by code point; printing a list or dict gives Python's repr. */
#include "jinja.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================================ arena */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    max_align_t data[];
} arena_chunk;

typedef struct marks marks;

typedef struct arena {
    arena_chunk *head;
    size_t total, limit;
    jmp_buf *fail;     /* where an exhausted arena jumps (NULL: return NULL) */
    char *err;         /* the message buffer of the failing call */
    size_t errlen;
    marks *marks;      /* a render's protected texts (NULL: none followed) */
} arena;

static void arena_fail(arena *a, const char *msg)
{
    snprintf(a->err, a->errlen, "%s", msg);
    longjmp(*a->fail, 1);
}

static void arena_free(arena *a)
{
    for (arena_chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->head = NULL;
}

static void *arena_alloc(arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > a->limit || cap < n) {
            snprintf(a->err, a->errlen, "template memory limit exceeded (%zu bytes)", a->limit);
            longjmp(*a->fail, 1);
        }
        arena_chunk *c = malloc(sizeof *c + cap);
        if (!c) {
            snprintf(a->err, a->errlen, "out of memory");
            longjmp(*a->fail, 1);
        }
        c->cap = cap;
        c->used = 0;
        a->total += cap;
        /* A big block gets its own chunk behind the head, so the head's free room stays. */
        if (a->head && n > 65536) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
        c->used = n;
        return c->data;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

/* ---- provenance of protected text ---------------------------------------------------------
 * Where the request's data (the context's strings) holds a text the caller protects (a control
 * token's, for the chat prompt), the byte range is marked by its address.  Values share bytes
 * (a slice points into its string), so only a copy needs to carry marks along: every copy of
 * bytes goes through sb_add, sb_reserve or arena_strdup, which copy the marks of what they copy,
 * and at the end the marks inside the output say where the request wrote protected text, however
 * the template cut, joined or escaped it.  Without marks (no protected text in the request, the
 * usual case) a copy costs one test. */
typedef struct mark {
    const char *p;
    size_t n;
} mark;

struct marks {
    mark *v;
    size_t n, cap;
    const char *lo, *hi; /* every mark lies in [lo, hi): most copies (a byte from the stack, the
                          * template's own text) are told apart by this alone */
    uint64_t *steps;     /* the render's step counter: scanning the marks is work */
};

static void marks_cover(marks *m, const char *p, size_t n)
{
    if (!m->lo || p < m->lo) m->lo = p;
    if (!m->hi || p + n > m->hi) m->hi = p + n;
}

#define MARKS_MAX ((size_t)1 << 20)

static void marks_add(arena *a, const char *p, size_t n)
{
    marks *m = a->marks;
    if (m->n == m->cap) {
        if (m->n >= MARKS_MAX) arena_fail(a, "too many protected texts (control tokens) in the request");
        size_t cap = m->cap ? m->cap * 2 : 64;
        mark *v = realloc(m->v, cap * sizeof *v);
        if (!v) arena_fail(a, "out of memory");
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = (mark){p, n};
    marks_cover(m, p, n);
}

/* The marks of src[0..n) are now also at dst (a copy), or only there (move: src is let go). */
static void marks_copy(arena *a, const char *dst, const char *src, size_t n, bool move)
{
    marks *m = a->marks;
    if (!m || !m->n || !n || src >= m->hi || src + n <= m->lo) return;
    *m->steps += m->n / 128;
    for (size_t i = 0, k = m->n; i < k; i++) {
        const char *p = m->v[i].p;
        if (p < src || p >= src + n) continue;
        size_t len = m->v[i].n < (size_t)(src + n - p) ? m->v[i].n : (size_t)(src + n - p);
        if (move) {
            m->v[i].p = dst + (p - src);
            marks_cover(m, m->v[i].p, m->v[i].n);
        } else {
            marks_add(a, dst + (p - src), len);
        }
    }
}

static char *arena_strdup(arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    marks_copy(a, p, s, n, false);
    return p;
}

/* A growable byte string in the arena (doubling: at most twice the final size is wasted). */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_reserve(arena *a, sbuf *b, size_t more)
{
    if (b->cap - b->n >= more) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->n < more) cap *= 2;
    char *p = arena_alloc(a, cap);
    if (b->n) memcpy(p, b->p, b->n);
    marks_copy(a, p, b->p, b->n, true); /* a buffer being built is nobody's value yet */
    b->p = p;
    b->cap = cap;
}

static void sb_add(arena *a, sbuf *b, const char *s, size_t n)
{
    sb_reserve(a, b, n + 1);
    if (n) memcpy(b->p + b->n, s, n);
    marks_copy(a, b->p + b->n, s, n, false);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_addc(arena *a, sbuf *b, char c) { sb_add(a, b, &c, 1); }
static void sb_adds(arena *a, sbuf *b, const char *s) { sb_add(a, b, s, strlen(s)); }

/* ================================================================================ values */

typedef enum vtype {
    V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_MACRO, V_FUNC
} vtype;

struct node;
struct frame;
typedef struct jlist jlist;
typedef struct jdict jdict;

typedef struct val {
    vtype t;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        jlist *l;
        jdict *d;
        struct { const struct node *def; struct frame *scope; } m; /* a macro and its scope */
        int fn;                                                    /* a global function */
        const char *undef_name;                                    /* what was missing */
    } u;
} val;

struct jlist {
    val *v;
    size_t n;
    bool tuple; /* printed as (a, b) */
};

typedef struct kv {
    const char *k;
    size_t kn;
    val v;
} kv;

struct jdict {
    kv *e;
    size_t n, cap;
    bool ns; /* a namespace(): the one mutable object */
};

static val v_undef(const char *name) { return (val){.t = V_UNDEF, .u.undef_name = name}; }
static val v_none(void) { return (val){.t = V_NONE}; }
static val v_bool(bool b) { return (val){.t = V_BOOL, .u.b = b}; }
static val v_int(int64_t i) { return (val){.t = V_INT, .u.i = i}; }
static val v_float(double f) { return (val){.t = V_FLOAT, .u.f = f}; }
static val v_str(const char *p, size_t n) { return (val){.t = V_STR, .u.s = {p, n}}; }

/* ================================================================================ tokens */

typedef enum tok_kind {
    T_EOF, T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING,
    T_INT, T_FLOAT, T_OP
} tok_kind;

typedef struct token {
    tok_kind k;
    int line;
    const char *p; /* T_TEXT, T_NAME, T_OP: into the source; T_STRING: unescaped copy */
    size_t n;
    int64_t i;
    double f;
} token;

typedef struct node node;

struct jinja_tmpl {
    arena mem;
    node *root;
    char *src; /* normalised source, kept for jinja_mentions */
    size_t src_len;
};

typedef struct lexer {
    arena *a;
    const char *s;
    size_t n, pos;
    int line;
    token *toks;
    size_t nt, cap;
    char *err;
    size_t errlen;
    jmp_buf *fail;
} lexer;

static void lex_fail(lexer *lx, const char *fmt, ...)
{
    int k = snprintf(lx->err, lx->errlen, "line %d: ", lx->line);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < lx->errlen) vsnprintf(lx->err + k, lx->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(*lx->fail, 1);
}

static token *lex_push(lexer *lx, tok_kind k, const char *p, size_t n)
{
    if (lx->nt == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        token *t = arena_alloc(lx->a, cap * sizeof *t);
        if (lx->nt) memcpy(t, lx->toks, lx->nt * sizeof *t);
        lx->toks = t;
        lx->cap = cap;
    }
    token *t = &lx->toks[lx->nt++];
    *t = (token){.k = k, .line = lx->line, .p = p, .n = n};
    return t;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_name_start(char c) { return isalpha((unsigned char)c) || c == '_'; }
static bool is_name_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

static void count_lines(lexer *lx, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) lx->line += lx->s[i] == '\n';
}

/* Appends the UTF-8 encoding of code point cp. */
static void utf8_put(arena *a, sbuf *b, uint32_t cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | cp >> 6); u[1] = (char)(0x80 | (cp & 63)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12); u[1] = (char)(0x80 | ((cp >> 6) & 63));
        u[2] = (char)(0x80 | (cp & 63)); n = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18); u[1] = (char)(0x80 | ((cp >> 12) & 63));
        u[2] = (char)(0x80 | ((cp >> 6) & 63)); u[3] = (char)(0x80 | (cp & 63)); n = 4;
    }
    sb_add(a, b, u, n);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal with Python's escapes (\n \t \\ \' \" \xHH \uXXXX \UXXXXXXXX); an unknown
 * escape stays as written, as in Python. */
static void lex_string(lexer *lx)
{
    char q = lx->s[lx->pos++];
    sbuf b = {0};
    sb_reserve(lx->a, &b, 1);
    b.p[0] = 0;
    for (;;) {
        if (lx->pos >= lx->n) lex_fail(lx, "unterminated string");
        char c = lx->s[lx->pos++];
        if (c == q) break;
        if (c == '\n') lx->line++;
        if (c != '\\') {
            sb_addc(lx->a, &b, c);
            continue;
        }
        if (lx->pos >= lx->n) lex_fail(lx, "unterminated string");
        char e = lx->s[lx->pos++];
        int nd = 0;
        switch (e) {
        case 'n': sb_addc(lx->a, &b, '\n'); break;
        case 't': sb_addc(lx->a, &b, '\t'); break;
        case 'r': sb_addc(lx->a, &b, '\r'); break;
        case 'b': sb_addc(lx->a, &b, '\b'); break;
        case 'f': sb_addc(lx->a, &b, '\f'); break;
        case 'v': sb_addc(lx->a, &b, '\v'); break;
        case 'a': sb_addc(lx->a, &b, '\a'); break;
        case '0': sb_addc(lx->a, &b, '\0'); break;
        case '\\': case '\'': case '"': sb_addc(lx->a, &b, e); break;
        case '\n': lx->line++; break;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default: sb_addc(lx->a, &b, '\\'); sb_addc(lx->a, &b, e); break;
        }
        if (nd) {
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = lx->pos < lx->n ? hexval(lx->s[lx->pos]) : -1;
                if (h < 0) lex_fail(lx, "bad \\%c escape in a string", e);
                cp = cp * 16 + (uint32_t)h;
                lx->pos++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) lex_fail(lx, "bad code point in a string");
            utf8_put(lx->a, &b, cp);
        }
    }
    token *t = lex_push(lx, T_STRING, b.p, b.n);
    (void)t;
}

/* Tokens inside a tag, up to its closer ("}}" or "%}", optionally with '-' or '+' before it).
 * Returns the position just after the closer and whether it strips or keeps (+) what
 * follows. */
static void lex_tag(lexer *lx, const char *closer, bool *strip_after, bool *keep_after)
{
    int depth = 0; /* brackets: "}}" inside a dict literal is not the closer */
    for (;;) {
        while (lx->pos < lx->n && is_ws(lx->s[lx->pos])) {
            if (lx->s[lx->pos] == '\n') lx->line++;
            lx->pos++;
        }
        if (lx->pos >= lx->n) lex_fail(lx, "unclosed tag (missing %s)", closer);
        const char *p = lx->s + lx->pos;
        size_t rest = lx->n - lx->pos;
        if (depth == 0) {
            bool minus = p[0] == '-' && rest >= 3 && memcmp(p + 1, closer, 2) == 0;
            bool plus = p[0] == '+' && rest >= 3 && memcmp(p + 1, closer, 2) == 0;
            if (minus || plus || (rest >= 2 && memcmp(p, closer, 2) == 0)) {
                lx->pos += (minus || plus) ? 3 : 2;
                *strip_after = minus;
                *keep_after = plus;
                return;
            }
        }
        char c = p[0];
        if (c == '\'' || c == '"') {
            lex_string(lx);
        } else if (is_name_start(c)) {
            size_t k = 1;
            while (k < rest && is_name_char(p[k])) k++;
            lex_push(lx, T_NAME, p, k);
            lx->pos += k;
        } else if (isdigit((unsigned char)c)) {
            size_t k = 0;
            bool fl = false;
            char num[64];
            size_t nn = 0;
            while (k < rest && (isdigit((unsigned char)p[k]) || p[k] == '_')) {
                if (p[k] != '_' && nn < 63) num[nn++] = p[k];
                k++;
            }
            if (k + 1 < rest && p[k] == '.' && isdigit((unsigned char)p[k + 1])) {
                fl = true;
                num[nn < 63 ? nn++ : nn] = '.';
                k++;
                while (k < rest && (isdigit((unsigned char)p[k]) || p[k] == '_')) {
                    if (p[k] != '_' && nn < 63) num[nn++] = p[k];
                    k++;
                }
            }
            if (k < rest && (p[k] == 'e' || p[k] == 'E')) {
                size_t e = k + 1;
                if (e < rest && (p[e] == '+' || p[e] == '-')) e++;
                if (e < rest && isdigit((unsigned char)p[e])) {
                    fl = true;
                    for (size_t j = k; j < e && nn < 63; j++) num[nn++] = p[j];
                    k = e;
                    while (k < rest && isdigit((unsigned char)p[k])) {
                        if (nn < 63) num[nn++] = p[k];
                        k++;
                    }
                }
            }
            num[nn] = 0;
            token *t = lex_push(lx, fl ? T_FLOAT : T_INT, p, k);
            if (fl) {
                t->f = strtod(num, NULL);
            } else {
                char *end;
                unsigned long long v = strtoull(num, &end, 10);
                if (nn > 18 && (nn > 19 || v > (unsigned long long)INT64_MAX))
                    lex_fail(lx, "integer literal too large");
                t->i = (int64_t)v;
            }
            lx->pos += k;
        } else {
            static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
            size_t len = 1;
            for (int o = 0; ops2[o]; o++)
                if (rest >= 2 && memcmp(p, ops2[o], 2) == 0) len = 2;
            if (len == 1 && !strchr("+-*/%~<>=()[]{},.:|", c))
                lex_fail(lx, "unexpected character '%c' in a tag", isprint((unsigned char)c) ? c : '?');
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            lex_push(lx, T_OP, p, len);
            lx->pos += len;
        }
    }
}

/* Strips trailing spaces and tabs of the text back to the start of its line, when only those
 * stand between the line start and the tag (lstrip_blocks). */
static size_t lstrip_line(const char *s, size_t start, size_t end)
{
    size_t k = end;
    while (k > start && (s[k - 1] == ' ' || s[k - 1] == '\t')) k--;
    if (k > 0 && s[k - 1] == '\n') return k;
    if (k == 0) return k; /* the very start of the template is a line start */
    return end;
}

static void lex_all(lexer *lx)
{
    bool strip_next = false; /* the previous tag ended with '-': strip leading whitespace */
    while (lx->pos < lx->n) {
        size_t start = lx->pos, k = start;
        const char *tag = NULL;
        while (k + 1 < lx->n) {
            if (lx->s[k] == '{' && (lx->s[k + 1] == '{' || lx->s[k + 1] == '%' || lx->s[k + 1] == '#')) {
                tag = lx->s + k;
                break;
            }
            k++;
        }
        size_t text_end = tag ? k : lx->n;
        size_t ts = start, te = text_end;
        if (strip_next)
            while (ts < te && is_ws(lx->s[ts])) ts++;
        strip_next = false;
        char mod = tag && text_end + 2 < lx->n ? lx->s[text_end + 2] : 0;
        if (tag && mod == '-') {
            while (te > ts && is_ws(lx->s[te - 1])) te--;
        } else if (tag && tag[1] != '{' && mod != '+') {
            te = lstrip_line(lx->s, ts, te);
        }
        if (te > ts) lex_push(lx, T_TEXT, lx->s + ts, te - ts);
        count_lines(lx, start, text_end);
        if (!tag) {
            lx->pos = lx->n;
            break;
        }
        lx->pos = text_end + 2 + (mod == '-' || mod == '+');
        bool strip_after = false, keep_after = false, block = tag[1] != '{';
        if (tag[1] == '#') {
            const char *endc = NULL;
            for (size_t j = lx->pos; j + 1 < lx->n; j++)
                if (lx->s[j] == '#' && lx->s[j + 1] == '}') {
                    endc = lx->s + j;
                    break;
                }
            if (!endc) lex_fail(lx, "unclosed comment");
            size_t e = (size_t)(endc - lx->s);
            strip_after = e > lx->pos && lx->s[e - 1] == '-';
            keep_after = e > lx->pos && lx->s[e - 1] == '+';
            count_lines(lx, lx->pos, e + 2);
            lx->pos = e + 2;
        } else {
            size_t first_tok = lx->nt;
            lex_push(lx, block ? T_BLOCK_BEGIN : T_VAR_BEGIN, tag, 2);
            lex_tag(lx, block ? "%}" : "}}", &strip_after, &keep_after);
            lex_push(lx, block ? T_BLOCK_END : T_VAR_END, NULL, 0);
            /* {% raw %}: everything up to {% endraw %} is text. */
            if (block && lx->nt == first_tok + 3 && lx->toks[first_tok + 1].k == T_NAME &&
                lx->toks[first_tok + 1].n == 3 && memcmp(lx->toks[first_tok + 1].p, "raw", 3) == 0) {
                lx->nt = first_tok;
                size_t j = lx->pos, body = lx->pos;
                for (;; j++) {
                    if (j + 1 >= lx->n) lex_fail(lx, "missing {%% endraw %%}");
                    if (lx->s[j] != '{' || lx->s[j + 1] != '%') continue;
                    size_t q = j + 2;
                    bool m = q < lx->n && lx->s[q] == '-';
                    if (q < lx->n && (lx->s[q] == '-' || lx->s[q] == '+')) q++;
                    while (q < lx->n && is_ws(lx->s[q])) q++;
                    if (q + 6 > lx->n || memcmp(lx->s + q, "endraw", 6) != 0) continue;
                    q += 6;
                    while (q < lx->n && is_ws(lx->s[q])) q++;
                    bool m2 = q < lx->n && lx->s[q] == '-';
                    if (q < lx->n && (lx->s[q] == '-' || lx->s[q] == '+')) q++;
                    if (q + 2 > lx->n || lx->s[q] != '%' || lx->s[q + 1] != '}') continue;
                    size_t bs = body, be = j;
                    if (strip_after) while (bs < be && is_ws(lx->s[bs])) bs++;
                    else if (!keep_after && bs < be && lx->s[bs] == '\n') bs++;
                    if (m) while (be > bs && is_ws(lx->s[be - 1])) be--;
                    else be = lstrip_line(lx->s, bs, be);
                    if (be > bs) lex_push(lx, T_TEXT, lx->s + bs, be - bs);
                    count_lines(lx, body, q + 2);
                    lx->pos = q + 2;
                    strip_after = m2;
                    keep_after = false;
                    break;
                }
            }
        }
        if (strip_after) {
            strip_next = true;
        } else if (block && !keep_after && lx->pos < lx->n && lx->s[lx->pos] == '\n') {
            lx->pos++; /* trim_blocks */
            lx->line++;
        }
    }
    lex_push(lx, T_EOF, NULL, 0);
}

/* ================================================================================ parser */

typedef struct str {
    const char *p;
    size_t n;
} str;

typedef enum nkind {
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_BIN, N_COND,
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK,
    N_FILTER_BLOCK, N_BREAK, N_CONTINUE
} nkind;

typedef enum binop {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
    OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE, OP_IN, OP_NOTIN
} binop;

struct node {
    nkind k;
    int line;
    int op;       /* N_BIN: binop; N_TEST: negated; N_FOR: has a loop filter */
    str name;     /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_MACRO, N_SET_BLOCK */
    node *a, *b, *c;
    node **kids;  /* N_LIST/N_TUPLE items, call/filter/test args, N_BODY statements,
                     N_DICT keys and values interleaved, N_MACRO defaults */
    size_t nkids;
    str *kw;      /* keyword argument names (their values: kids[nkids - nkw ..]) */
    size_t nkw;
    str *params;  /* N_MACRO / N_CALL_BLOCK parameter names, N_FOR / N_SET targets */
    size_t nparams;
    val lit;
};

typedef struct parser {
    arena *a;
    token *t;
    size_t pos;
    int depth;
    char *err;
    size_t errlen;
    jmp_buf *fail;
} parser;

#define PARSE_MAX_DEPTH 200

static void parse_fail(parser *ps, const char *fmt, ...)
{
    int k = snprintf(ps->err, ps->errlen, "line %d: ", ps->t[ps->pos].line);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < ps->errlen) vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(*ps->fail, 1);
}

static token *cur(parser *ps) { return &ps->t[ps->pos]; }

static bool tok_is(const token *t, tok_kind k, const char *s)
{
    return t->k == k && (!s || (t->n == strlen(s) && memcmp(t->p, s, t->n) == 0));
}
static bool is_op(parser *ps, const char *s) { return tok_is(cur(ps), T_OP, s); }
static bool is_name(parser *ps, const char *s) { return tok_is(cur(ps), T_NAME, s); }
static bool str_eq(str s, const char *c) { return s.n == strlen(c) && memcmp(s.p, c, s.n) == 0; }

static bool accept_op(parser *ps, const char *s)
{
    if (!is_op(ps, s)) return false;
    ps->pos++;
    return true;
}

static bool accept_name(parser *ps, const char *s)
{
    if (!is_name(ps, s)) return false;
    ps->pos++;
    return true;
}

static const char *tok_desc(const token *t)
{
    switch (t->k) {
    case T_EOF: return "end of template";
    case T_TEXT: return "text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_NAME: return "a name";
    case T_STRING: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: return "an operator";
    }
}

static void expect_op(parser *ps, const char *s)
{
    if (!accept_op(ps, s)) parse_fail(ps, "expected '%s', got %s", s, tok_desc(cur(ps)));
}

static str expect_ident(parser *ps)
{
    token *t = cur(ps);
    if (t->k != T_NAME) parse_fail(ps, "expected a name, got %s", tok_desc(t));
    ps->pos++;
    return (str){t->p, t->n};
}

static node *mk(parser *ps, nkind k)
{
    node *n = arena_alloc(ps->a, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = cur(ps)->line;
    return n;
}

/* A growing node list while parsing (copied into the node when done). */
typedef struct nlist {
    node **v;
    size_t n, cap;
} nlist;

static void nl_push(arena *a, nlist *l, node *x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        node **v = arena_alloc(a, cap * sizeof *v);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static node *parse_expr(parser *ps);
static node *parse_or(parser *ps);
static node *parse_unary(parser *ps, bool with_filter);

static void depth_in(parser *ps)
{
    if (++ps->depth > PARSE_MAX_DEPTH) parse_fail(ps, "template nested too deeply");
}

/* Call arguments after '(': positional then name=value; fills kids/nkids/kw/nkw. */
static void parse_args(parser *ps, node *n)
{
    nlist pos = {0}, kwv = {0};
    str *kw = NULL;
    size_t nkw = 0, kwcap = 0;
    while (!accept_op(ps, ")")) {
        if (pos.n + kwv.n) expect_op(ps, ",");
        if (accept_op(ps, ")")) break; /* trailing comma */
        if (cur(ps)->k == T_NAME && tok_is(&ps->t[ps->pos + 1], T_OP, "=")) {
            if (nkw == kwcap) {
                kwcap = kwcap ? kwcap * 2 : 4;
                str *k2 = arena_alloc(ps->a, kwcap * sizeof *k2);
                if (nkw) memcpy(k2, kw, nkw * sizeof *k2);
                kw = k2;
            }
            kw[nkw++] = expect_ident(ps);
            ps->pos++;
            nl_push(ps->a, &kwv, parse_expr(ps));
        } else {
            if (kwv.n) parse_fail(ps, "positional argument after a keyword argument");
            nl_push(ps->a, &pos, parse_expr(ps));
        }
    }
    for (size_t i = 0; i < kwv.n; i++) nl_push(ps->a, &pos, kwv.v[i]);
    n->kids = pos.v;
    n->nkids = pos.n;
    n->kw = kw;
    n->nkw = nkw;
}

static node *parse_primary(parser *ps)
{
    token *t = cur(ps);
    node *n;
    switch (t->k) {
    case T_NAME:
        ps->pos++;
        n = mk(ps, N_LIT);
        if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "True")) n->lit = v_bool(true);
        else if (tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "False")) n->lit = v_bool(false);
        else if (tok_is(t, T_NAME, "none") || tok_is(t, T_NAME, "None")) n->lit = v_none();
        else {
            n->k = N_NAME;
            n->name = (str){t->p, t->n};
        }
        return n;
    case T_STRING: {
        /* Adjacent literals concatenate, as in Python. */
        sbuf b = {0};
        sb_add(ps->a, &b, t->p, t->n);
        ps->pos++;
        while (cur(ps)->k == T_STRING) {
            sb_add(ps->a, &b, cur(ps)->p, cur(ps)->n);
            ps->pos++;
        }
        n = mk(ps, N_LIT);
        n->lit = v_str(b.p ? b.p : "", b.n);
        return n;
    }
    case T_INT:
        ps->pos++;
        n = mk(ps, N_LIT);
        n->lit = v_int(t->i);
        return n;
    case T_FLOAT:
        ps->pos++;
        n = mk(ps, N_LIT);
        n->lit = v_float(t->f);
        return n;
    case T_OP:
        if (accept_op(ps, "(")) {
            if (accept_op(ps, ")")) return mk(ps, N_TUPLE);
            node *e = parse_expr(ps);
            if (!is_op(ps, ",")) {
                expect_op(ps, ")");
                return e;
            }
            nlist items = {0};
            nl_push(ps->a, &items, e);
            while (accept_op(ps, ",")) {
                if (is_op(ps, ")")) break;
                nl_push(ps->a, &items, parse_expr(ps));
            }
            expect_op(ps, ")");
            n = mk(ps, N_TUPLE);
            n->kids = items.v;
            n->nkids = items.n;
            return n;
        }
        if (accept_op(ps, "[")) {
            nlist items = {0};
            while (!accept_op(ps, "]")) {
                if (items.n) expect_op(ps, ",");
                if (accept_op(ps, "]")) break;
                nl_push(ps->a, &items, parse_expr(ps));
            }
            n = mk(ps, N_LIST);
            n->kids = items.v;
            n->nkids = items.n;
            return n;
        }
        if (accept_op(ps, "{")) {
            nlist items = {0};
            while (!accept_op(ps, "}")) {
                if (items.n) expect_op(ps, ",");
                if (accept_op(ps, "}")) break;
                nl_push(ps->a, &items, parse_expr(ps));
                expect_op(ps, ":");
                nl_push(ps->a, &items, parse_expr(ps));
            }
            n = mk(ps, N_DICT);
            n->kids = items.v;
            n->nkids = items.n;
            return n;
        }
        break;
    default: break;
    }
    parse_fail(ps, "unexpected %s in an expression", tok_desc(t));
    return NULL;
}

static node *parse_postfix(parser *ps, node *n)
{
    for (;;) {
        if (accept_op(ps, ".")) {
            node *a = mk(ps, N_ATTR);
            a->a = n;
            if (cur(ps)->k == T_INT) { /* x.0 is x[0] */
                a->k = N_ITEM;
                a->b = mk(ps, N_LIT);
                a->b->lit = v_int(cur(ps)->i);
                ps->pos++;
            } else {
                a->name = expect_ident(ps);
            }
            n = a;
        } else if (accept_op(ps, "[")) {
            node *lo = NULL, *hi = NULL, *step = NULL;
            bool slice = false;
            if (!is_op(ps, ":")) lo = parse_expr(ps);
            if (accept_op(ps, ":")) {
                slice = true;
                if (!is_op(ps, "]") && !is_op(ps, ":")) hi = parse_expr(ps);
                if (accept_op(ps, ":") && !is_op(ps, "]")) step = parse_expr(ps);
            }
            expect_op(ps, "]");
            node *s = mk(ps, slice ? N_SLICE : N_ITEM);
            s->a = n;
            if (slice) {
                node **k = arena_alloc(ps->a, 3 * sizeof *k);
                k[0] = lo, k[1] = hi, k[2] = step;
                s->kids = k;
                s->nkids = 3;
            } else {
                if (!lo) parse_fail(ps, "empty subscript");
                s->b = lo;
            }
            n = s;
        } else if (accept_op(ps, "(")) {
            node *c = mk(ps, N_CALL);
            c->a = n;
            parse_args(ps, c);
            n = c;
        } else {
            return n;
        }
    }
}

/* Whether the current token can start a test's single bare argument (`is divisibleby 3`). */
static bool test_arg_follows(parser *ps)
{
    token *t = cur(ps);
    if (t->k == T_STRING || t->k == T_INT || t->k == T_FLOAT) return true;
    if (t->k == T_OP) return tok_is(t, T_OP, "(") || tok_is(t, T_OP, "[") || tok_is(t, T_OP, "{");
    if (t->k != T_NAME) return false;
    static const char *const stop[] = {"else", "or", "and", "if", "in", "is", "not", NULL};
    for (int i = 0; stop[i]; i++)
        if (tok_is(t, T_NAME, stop[i])) return false;
    return true;
}

static node *parse_filters(parser *ps, node *n)
{
    for (;;) {
        if (accept_op(ps, "|")) {
            node *f = mk(ps, N_FILTER);
            f->a = n;
            f->name = expect_ident(ps);
            if (accept_op(ps, "(")) parse_args(ps, f);
            n = f;
        } else if (accept_name(ps, "is")) {
            node *t = mk(ps, N_TEST);
            t->op = accept_name(ps, "not");
            t->a = n;
            t->name = expect_ident(ps);
            if (accept_op(ps, "(")) {
                parse_args(ps, t);
            } else if (test_arg_follows(ps)) {
                node **k = arena_alloc(ps->a, sizeof *k);
                k[0] = parse_postfix(ps, parse_primary(ps));
                t->kids = k;
                t->nkids = 1;
            }
            n = t;
        } else {
            return n;
        }
    }
}

static node *parse_unary(parser *ps, bool with_filter)
{
    depth_in(ps);
    node *n;
    if (accept_op(ps, "-")) {
        n = mk(ps, N_NEG);
        n->a = parse_unary(ps, false);
    } else if (accept_op(ps, "+")) {
        n = mk(ps, N_POS);
        n->a = parse_unary(ps, false);
    } else {
        n = parse_postfix(ps, parse_primary(ps));
    }
    if (with_filter) n = parse_filters(ps, n);
    ps->depth--;
    return n;
}

static node *mk_bin(parser *ps, binop op, node *a, node *b)
{
    node *n = mk(ps, N_BIN);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *parse_pow(parser *ps)
{
    node *n = parse_unary(ps, true);
    while (accept_op(ps, "**")) n = mk_bin(ps, OP_POW, n, parse_unary(ps, true));
    return n;
}

static node *parse_math2(parser *ps)
{
    node *n = parse_pow(ps);
    for (;;) {
        if (accept_op(ps, "*")) n = mk_bin(ps, OP_MUL, n, parse_pow(ps));
        else if (accept_op(ps, "/")) n = mk_bin(ps, OP_DIV, n, parse_pow(ps));
        else if (accept_op(ps, "//")) n = mk_bin(ps, OP_FLOORDIV, n, parse_pow(ps));
        else if (accept_op(ps, "%")) n = mk_bin(ps, OP_MOD, n, parse_pow(ps));
        else return n;
    }
}

static node *parse_concat(parser *ps)
{
    node *n = parse_math2(ps);
    while (accept_op(ps, "~")) n = mk_bin(ps, OP_CONCAT, n, parse_math2(ps));
    return n;
}

static node *parse_math1(parser *ps)
{
    node *n = parse_concat(ps);
    for (;;) {
        if (accept_op(ps, "+")) n = mk_bin(ps, OP_ADD, n, parse_concat(ps));
        else if (accept_op(ps, "-")) n = mk_bin(ps, OP_SUB, n, parse_concat(ps));
        else return n;
    }
}

/* Chained comparisons (a < b < c) are evaluated pairwise and joined with 'and', as Python. */
static node *parse_compare(parser *ps)
{
    node *n = parse_math1(ps), *chain = NULL;
    for (;;) {
        binop op;
        if (accept_op(ps, "==")) op = OP_EQ;
        else if (accept_op(ps, "!=")) op = OP_NE;
        else if (accept_op(ps, "<")) op = OP_LT;
        else if (accept_op(ps, ">")) op = OP_GT;
        else if (accept_op(ps, "<=")) op = OP_LE;
        else if (accept_op(ps, ">=")) op = OP_GE;
        else if (accept_name(ps, "in")) op = OP_IN;
        else if (is_name(ps, "not") && tok_is(&ps->t[ps->pos + 1], T_NAME, "in")) {
            ps->pos += 2;
            op = OP_NOTIN;
        } else {
            return chain ? chain : n;
        }
        node *rhs = parse_math1(ps);
        node *cmp = mk_bin(ps, op, n, rhs);
        if (chain) {
            node *and = mk(ps, N_AND);
            and->a = chain;
            and->b = cmp;
            chain = and;
        } else {
            chain = cmp;
        }
        n = rhs;
    }
}

static node *parse_not(parser *ps)
{
    if (accept_name(ps, "not")) {
        depth_in(ps);
        node *n = mk(ps, N_NOT);
        n->a = parse_not(ps);
        ps->depth--;
        return n;
    }
    return parse_compare(ps);
}

static node *parse_and(parser *ps)
{
    node *n = parse_not(ps);
    while (accept_name(ps, "and")) {
        node *x = mk(ps, N_AND);
        x->a = n;
        x->b = parse_not(ps);
        n = x;
    }
    return n;
}

static node *parse_or(parser *ps)
{
    node *n = parse_and(ps);
    while (accept_name(ps, "or")) {
        node *x = mk(ps, N_OR);
        x->a = n;
        x->b = parse_and(ps);
        n = x;
    }
    return n;
}

static node *parse_expr(parser *ps)
{
    depth_in(ps);
    node *n = parse_or(ps);
    while (accept_name(ps, "if")) {
        node *c = mk(ps, N_COND);
        c->a = n;
        c->b = parse_or(ps);
        if (accept_name(ps, "else")) c->c = parse_expr(ps);
        n = c;
    }
    ps->depth--;
    return n;
}

/* An expression, or several separated by commas (a tuple without parentheses). */
static node *parse_tuple_expr(parser *ps)
{
    node *e = parse_expr(ps);
    if (!is_op(ps, ",")) return e;
    nlist items = {0};
    nl_push(ps->a, &items, e);
    while (accept_op(ps, ",")) nl_push(ps->a, &items, parse_expr(ps));
    node *n = mk(ps, N_TUPLE);
    n->kids = items.v;
    n->nkids = items.n;
    return n;
}

/* ---- statements -------------------------------------------------------------------------- */

static void expect_block_end(parser *ps)
{
    if (cur(ps)->k != T_BLOCK_END) parse_fail(ps, "expected '%%}', got %s", tok_desc(cur(ps)));
    ps->pos++;
}

/* Parses statements until a block tag whose keyword is one of `ends` (NULL-terminated); leaves
 * the position on that keyword.  ends == NULL: until the end of the template. */
static node *parse_body(parser *ps, const char *const *ends);

static bool at_end_tag(parser *ps, const char *const *ends)
{
    if (cur(ps)->k != T_BLOCK_BEGIN || !ends) return false;
    token *kw = &ps->t[ps->pos + 1];
    for (int i = 0; ends[i]; i++)
        if (tok_is(kw, T_NAME, ends[i])) return true;
    return false;
}

static void params_push(parser *ps, node *n, str s)
{
    str *p = arena_alloc(ps->a, (n->nparams + 1) * sizeof *p);
    if (n->nparams) memcpy(p, n->params, n->nparams * sizeof *p);
    p[n->nparams++] = s;
    n->params = p;
}

/* Macro parameters "(a, b=1, ...)": names in params, defaults (or NULL) in kids. */
static void parse_params(parser *ps, node *n)
{
    nlist defs = {0};
    expect_op(ps, "(");
    while (!accept_op(ps, ")")) {
        if (n->nparams) expect_op(ps, ",");
        if (accept_op(ps, ")")) break;
        params_push(ps, n, expect_ident(ps));
        nl_push(ps->a, &defs, accept_op(ps, "=") ? parse_expr(ps) : NULL);
    }
    n->kids = defs.v;
    n->nkids = defs.n;
}

static void end_tag(parser *ps, const char *name)
{
    ps->pos++; /* {% */
    if (!accept_name(ps, name)) parse_fail(ps, "expected '%s'", name);
    expect_block_end(ps);
}

static node *parse_statement(parser *ps)
{
    ps->pos++; /* {% */
    token *kw = cur(ps);
    if (kw->k != T_NAME) parse_fail(ps, "expected a statement name, got %s", tok_desc(kw));
    str w = expect_ident(ps);
    node *n;
    depth_in(ps);
    if (str_eq(w, "if")) {
        n = mk(ps, N_IF);
        n->a = parse_expr(ps);
        expect_block_end(ps);
        static const char *const e1[] = {"elif", "else", "endif", NULL};
        n->b = parse_body(ps, e1);
        node *tail = n;
        for (;;) {
            ps->pos++; /* {% */
            if (accept_name(ps, "elif")) {
                node *x = mk(ps, N_IF);
                x->a = parse_expr(ps);
                expect_block_end(ps);
                x->b = parse_body(ps, e1);
                tail->c = x;
                tail = x;
            } else if (accept_name(ps, "else")) {
                expect_block_end(ps);
                static const char *const e2[] = {"endif", NULL};
                tail->c = parse_body(ps, e2);
                end_tag(ps, "endif");
                break;
            } else {
                accept_name(ps, "endif");
                expect_block_end(ps);
                break;
            }
        }
    } else if (str_eq(w, "for")) {
        n = mk(ps, N_FOR);
        do params_push(ps, n, expect_ident(ps));
        while (accept_op(ps, ","));
        if (!accept_name(ps, "in")) parse_fail(ps, "expected 'in' in a for loop");
        /* The iterable stops before a loop filter's 'if' (a conditional expression cannot
         * appear here without parentheses, as in Jinja). */
        n->a = parse_or(ps);
        if (accept_name(ps, "if")) {
            n->op = 1;
            n->c = parse_or(ps);
        }
        if (accept_name(ps, "recursive")) parse_fail(ps, "recursive loops are not supported");
        expect_block_end(ps);
        static const char *const e1[] = {"else", "endfor", NULL};
        n->b = parse_body(ps, e1);
        ps->pos++;
        if (accept_name(ps, "else")) {
            expect_block_end(ps);
            static const char *const e2[] = {"endfor", NULL};
            node *els = parse_body(ps, e2);
            node **k = arena_alloc(ps->a, sizeof *k);
            k[0] = els;
            n->kids = k;
            n->nkids = 1;
            ps->pos++;
        }
        if (!accept_name(ps, "endfor")) parse_fail(ps, "expected 'endfor'");
        expect_block_end(ps);
    } else if (str_eq(w, "set")) {
        n = mk(ps, N_SET);
        str first = expect_ident(ps);
        if (accept_op(ps, ".")) { /* ns.attr = ... */
            n->name = first;
            params_push(ps, n, expect_ident(ps));
            n->op = 1;
        } else {
            params_push(ps, n, first);
            while (accept_op(ps, ",")) params_push(ps, n, expect_ident(ps));
        }
        if (accept_op(ps, "=")) {
            n->a = parse_tuple_expr(ps);
            expect_block_end(ps);
        } else {
            if (n->op || n->nparams != 1) parse_fail(ps, "a block set assigns one name");
            n->k = N_SET_BLOCK;
            if (is_op(ps, "|")) { /* {% set x | filter %}: the filter applies to the body */
                node *hole = mk(ps, N_LIT);
                hole->lit = v_undef(NULL);
                n->c = parse_filters(ps, hole);
            }
            expect_block_end(ps);
            static const char *const e[] = {"endset", NULL};
            n->b = parse_body(ps, e);
            end_tag(ps, "endset");
        }
    } else if (str_eq(w, "macro")) {
        n = mk(ps, N_MACRO);
        n->name = expect_ident(ps);
        parse_params(ps, n);
        expect_block_end(ps);
        static const char *const e[] = {"endmacro", NULL};
        n->b = parse_body(ps, e);
        end_tag(ps, "endmacro");
    } else if (str_eq(w, "call")) {
        n = mk(ps, N_CALL_BLOCK);
        if (is_op(ps, "(")) parse_params(ps, n);
        n->a = parse_expr(ps);
        if (n->a->k != N_CALL) parse_fail(ps, "{%% call %%} needs a macro call");
        expect_block_end(ps);
        static const char *const e[] = {"endcall", NULL};
        n->b = parse_body(ps, e);
        end_tag(ps, "endcall");
    } else if (str_eq(w, "filter")) {
        n = mk(ps, N_FILTER_BLOCK);
        node *hole = mk(ps, N_LIT);
        hole->lit = v_undef(NULL);
        node *f = mk(ps, N_FILTER); /* the first filter comes without its '|' */
        f->a = hole;
        f->name = expect_ident(ps);
        if (accept_op(ps, "(")) parse_args(ps, f);
        n->c = parse_filters(ps, f);
        expect_block_end(ps);
        static const char *const e[] = {"endfilter", NULL};
        n->b = parse_body(ps, e);
        end_tag(ps, "endfilter");
    } else if (str_eq(w, "generation") || str_eq(w, "with")) {
        /* HF's {% generation %} marks assistant text for masks: it renders its body.  A bare
         * {% with %} scopes its body. */
        bool gen = str_eq(w, "generation");
        if (!gen && cur(ps)->k != T_BLOCK_END) parse_fail(ps, "{%% with %%} with assignments is not supported");
        expect_block_end(ps);
        static const char *const eg[] = {"endgeneration", NULL}, *const ew[] = {"endwith", NULL};
        n = parse_body(ps, gen ? eg : ew);
        end_tag(ps, gen ? "endgeneration" : "endwith");
    } else if (str_eq(w, "break") || str_eq(w, "continue")) {
        n = mk(ps, str_eq(w, "break") ? N_BREAK : N_CONTINUE);
        expect_block_end(ps);
    } else {
        ps->pos--;
        parse_fail(ps, "unknown statement '%.*s'", (int)(w.n > 40 ? 40 : w.n), w.p);
        n = NULL;
    }
    ps->depth--;
    return n;
}

static node *parse_body(parser *ps, const char *const *ends)
{
    nlist st = {0};
    node *body = mk(ps, N_BODY);
    for (;;) {
        token *t = cur(ps);
        if (t->k == T_EOF) {
            if (ends) parse_fail(ps, "unexpected end of template: missing {%% %s %%}", ends[0]);
            break;
        }
        if (at_end_tag(ps, ends)) break;
        if (t->k == T_TEXT) {
            node *x = mk(ps, N_TEXT);
            x->lit = v_str(t->p, t->n);
            ps->pos++;
            nl_push(ps->a, &st, x);
        } else if (t->k == T_VAR_BEGIN) {
            ps->pos++;
            node *x = mk(ps, N_OUTPUT);
            x->a = parse_tuple_expr(ps);
            if (cur(ps)->k != T_VAR_END) parse_fail(ps, "expected '}}', got %s", tok_desc(cur(ps)));
            ps->pos++;
            nl_push(ps->a, &st, x);
        } else if (t->k == T_BLOCK_BEGIN) {
            token *kw = &ps->t[ps->pos + 1];
            static const char *const stray[] = {"endif", "endfor", "else", "elif", "endset",
                                                "endmacro", "endcall", "endfilter", NULL};
            for (int i = 0; stray[i]; i++)
                if (tok_is(kw, T_NAME, stray[i]))
                    parse_fail(ps, "unexpected '%s'", stray[i]);
            nl_push(ps->a, &st, parse_statement(ps));
        } else {
            parse_fail(ps, "unexpected %s", tok_desc(t));
        }
    }
    body->kids = st.v;
    body->nkids = st.n;
    return body;
}

/* Newlines as Jinja normalises them (\r\n and \r become \n), less one trailing newline
 * (keep_trailing_newline is off). */
static char *normalise_source(arena *a, const char *src, size_t len, size_t *out_len)
{
    char *o = arena_alloc(a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            o[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            o[n++] = src[i];
        }
    }
    if (n && o[n - 1] == '\n') n--;
    o[n] = 0;
    *out_len = n;
    return o;
}

/* The arena longjmps here on any error; only the job pointer crosses setjmp. */
typedef struct parse_job {
    jinja_tmpl *t;
    const char *src;
    size_t len;
    char *err;
    size_t errlen;
} parse_job;

static void parse_run(parse_job *j, jmp_buf *fail)
{
    jinja_tmpl *t = j->t;
    t->mem = (arena){.limit = 64u << 20, .fail = fail, .err = j->err, .errlen = j->errlen};
    t->src = normalise_source(&t->mem, j->src ? j->src : "", j->src ? j->len : 0, &t->src_len);
    lexer lx = {.a = &t->mem, .s = t->src, .n = t->src_len, .line = 1, .err = j->err,
                .errlen = j->errlen, .fail = fail};
    lex_all(&lx);
    parser ps = {.a = &t->mem, .t = lx.toks, .err = j->err, .errlen = j->errlen, .fail = fail};
    t->root = parse_body(&ps, NULL);
    t->mem.fail = NULL;
}

static bool parse_guarded(parse_job *j)
{
    jmp_buf fail;
    parse_job *volatile vj = j;
    if (setjmp(fail)) return false;
    parse_run(vj, &fail);
    return true;
}

jinja_tmpl *jinja_parse(const char *src, size_t len, char *err, size_t errlen)
{
    char dummy[1];
    if (!err || !errlen) err = dummy, errlen = sizeof dummy;
    err[0] = 0;
    jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    parse_job j = {t, src, len, err, errlen};
    if (!parse_guarded(&j)) {
        arena_free(&t->mem);
        free(t);
        return NULL;
    }
    return t;
}

void jinja_free(jinja_tmpl *t)
{
    if (!t) return;
    arena_free(&t->mem);
    free(t);
}

int jinja_mentions(const jinja_tmpl *t, const char *name)
{
    size_t n = strlen(name);
    if (!t || !n) return 0;
    for (const char *p = t->src; (p = memmem(p, t->src_len - (size_t)(p - t->src), name, n)); p++) {
        bool left = p == t->src || !is_name_char(p[-1]);
        bool right = (size_t)(p - t->src) + n >= t->src_len || !is_name_char(p[n]);
        if (left && right) return 1;
    }
    return 0;
}

/* ================================================================================ render */

typedef struct frame {
    struct frame *parent;
    kv *v;
    size_t n, cap;
} frame;

typedef enum gfunc { F_RANGE, F_NAMESPACE, F_RAISE, F_STRFTIME, F_DICT, F_CALLER_NONE } gfunc;

typedef struct rctx {
    arena a;
    jmp_buf *fail;
    char *err;
    size_t errlen;
    sbuf *out;
    size_t max_output;
    uint64_t steps, max_steps;
    int depth, max_depth;
    struct timespec deadline; /* the render fails past it (checked every 4096 steps) */
    uint64_t next_clock;      /* the step count at which the clock is read next */
    const struct tm *now;
    int line;
    int loop_ctl;            /* 1: break, 2: continue, pending */
    const node *caller_body; /* the {% call %} body that caller() renders */
    const node *caller_def;
    frame *caller_scope;
    const jinja_opts *opts; /* protect_at, trusted */
    marks marks;
} rctx;

/* Ends the render with a message: longjmp back to jinja_render (never returns). */
static void rfail(rctx *rc, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void rfail(rctx *rc, const char *fmt, ...)
{
    int k = snprintf(rc->err, rc->errlen, "line %d: ", rc->line);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < rc->errlen) vsnprintf(rc->err + k, rc->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(*rc->fail, 1);
}

static void check_clock(rctx *rc)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > rc->deadline.tv_sec || (now.tv_sec == rc->deadline.tv_sec && now.tv_nsec > rc->deadline.tv_nsec))
        rfail(rc, "template evaluation time limit exceeded");
    rc->next_clock = rc->steps + 4096;
}

static void step(rctx *rc)
{
    if (++rc->steps > rc->max_steps)
        rfail(rc, "template evaluation limit exceeded (%llu steps)", (unsigned long long)rc->max_steps);
    if (rc->steps >= rc->next_clock) check_clock(rc);
}

/* Work in proportion to bytes compared or searched (one step per 64): a step is one node, but
 * comparing two 4 MB strings is a million times the work of comparing two short ones, and
 * a loop of such comparisons must reach the limit as soon as its time does. */
static void work(rctx *rc, size_t bytes)
{
    rc->steps += bytes / 64;
    step(rc);
}

/* Enters one level of a recursive walk over a value (equality, order, repr, tojson): a list
 * nested 100,000 deep is a template's to build but must not overflow the C stack. */
static void walk_in(rctx *rc, const char *what)
{
    step(rc);
    if (++rc->depth > rc->max_depth) rfail(rc, "value nested too deeply for %s (depth %d)", what, rc->max_depth);
}

static const char *type_name(val v)
{
    switch (v.t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return "list";
    case V_DICT: return v.u.d->ns ? "Namespace" : "dict";
    case V_MACRO: return "Macro";
    default: return "function";
    }
}

static void fail_undefined(rctx *rc, val v)
{
    if (v.u.undef_name) rfail(rc, "'%s' is undefined", v.u.undef_name);
    rfail(rc, "an undefined value was used");
}

/* ---- containers -------------------------------------------------------------------------- */

static jlist *list_new(rctx *rc, size_t n)
{
    jlist *l = arena_alloc(&rc->a, sizeof *l);
    l->n = n;
    l->tuple = false;
    l->v = n ? arena_alloc(&rc->a, n * sizeof *l->v) : NULL;
    return l;
}

static val v_list(jlist *l) { return (val){.t = V_LIST, .u.l = l}; }

/* A list being built (growing by doubling). */
typedef struct vbuild {
    val *v;
    size_t n, cap;
} vbuild;

static void vb_push(rctx *rc, vbuild *b, val x)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8;
        val *v = arena_alloc(&rc->a, cap * sizeof *v);
        if (b->n) memcpy(v, b->v, b->n * sizeof *v);
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = x;
}

static val vb_list(rctx *rc, vbuild *b)
{
    jlist *l = arena_alloc(&rc->a, sizeof *l);
    l->v = b->v;
    l->n = b->n;
    l->tuple = false;
    return v_list(l);
}

static jdict *dict_new(rctx *rc)
{
    jdict *d = arena_alloc(&rc->a, sizeof *d);
    memset(d, 0, sizeof *d);
    return d;
}

static val *dict_find(rctx *rc, const jdict *d, const char *k, size_t kn)
{
    work(rc, d->n * 4 + kn); /* a lookup costs in proportion to the dict */
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].kn == kn && memcmp(d->e[i].k, k, kn) == 0) return &d->e[i].v;
    return NULL;
}

static void dict_set(rctx *rc, jdict *d, const char *k, size_t kn, val v)
{
    val *old = dict_find(rc, d, k, kn);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        kv *e = arena_alloc(&rc->a, cap * sizeof *e);
        if (d->n) memcpy(e, d->e, d->n * sizeof *e);
        d->e = e;
        d->cap = cap;
    }
    d->e[d->n++] = (kv){k, kn, v};
}

static void dict_sets(rctx *rc, jdict *d, const char *k, val v) { dict_set(rc, d, k, strlen(k), v); }

static val *frame_find(frame *f, str name)
{
    for (; f; f = f->parent)
        for (size_t i = 0; i < f->n; i++)
            if (f->v[i].kn == name.n && memcmp(f->v[i].k, name.p, name.n) == 0) return &f->v[i].v;
    return NULL;
}

static void frame_set(rctx *rc, frame *f, str name, val v)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->v[i].kn == name.n && memcmp(f->v[i].k, name.p, name.n) == 0) {
            f->v[i].v = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        kv *e = arena_alloc(&rc->a, cap * sizeof *e);
        if (f->n) memcpy(e, f->v, f->n * sizeof *e);
        f->v = e;
        f->cap = cap;
    }
    f->v[f->n++] = (kv){name.p, name.n, v};
}

static frame *frame_new(rctx *rc, frame *parent)
{
    frame *f = arena_alloc(&rc->a, sizeof *f);
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

/* ---- text of values ---------------------------------------------------------------------- */

/* Python's repr(float): the shortest text that reads back the same, fixed notation for
 * exponents in [-4, 16), else scientific; integral values keep ".0". */
static void float_repr(double f, char *buf, size_t cap)
{
    if (isnan(f)) { snprintf(buf, cap, "nan"); return; }
    if (isinf(f)) { snprintf(buf, cap, f < 0 ? "-inf" : "inf"); return; }
    char e[64];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    snprintf(e, sizeof e, "%.*e", prec - 1, f);
    const char *ep = strchr(e, 'e');
    int exp = ep ? atoi(ep + 1) : 0;
    if (exp >= -4 && exp < 16) {
        int dec = prec - 1 - exp;
        snprintf(buf, cap, "%.*f", dec > 0 ? dec : 0, f);
        if (!strchr(buf, '.')) strncat(buf, ".0", cap - strlen(buf) - 1);
    } else {
        snprintf(buf, cap, "%s", e);
    }
}

static void put_repr(rctx *rc, sbuf *b, val v);

static void put_str(rctx *rc, sbuf *b, val v)
{
    char num[64];
    switch (v.t) {
    case V_UNDEF: return;
    case V_NONE: sb_adds(&rc->a, b, "None"); return;
    case V_BOOL: sb_adds(&rc->a, b, v.u.b ? "True" : "False"); return;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); sb_adds(&rc->a, b, num); return;
    case V_FLOAT: float_repr(v.u.f, num, sizeof num); sb_adds(&rc->a, b, num); return;
    case V_STR: sb_add(&rc->a, b, v.u.s.p, v.u.s.n); return;
    default: put_repr(rc, b, v); return;
    }
}

static void put_repr(rctx *rc, sbuf *b, val v)
{
    walk_in(rc, "repr");
    switch (v.t) {
    case V_STR: {
        bool sq = memchr(v.u.s.p, '\'', v.u.s.n) == NULL || memchr(v.u.s.p, '"', v.u.s.n) != NULL;
        char q = sq ? '\'' : '"';
        sb_addc(&rc->a, b, q);
        size_t run = 0; /* as in json_string */
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char c = (unsigned char)v.u.s.p[i];
            if (c >= 0x20 && c != 0x7f && c != '\\' && c != (unsigned char)q) continue;
            sb_add(&rc->a, b, v.u.s.p + run, i - run);
            run = i + 1;
            char esc[8];
            if (c == '\\' || c == (unsigned char)q) { sb_addc(&rc->a, b, '\\'); sb_addc(&rc->a, b, (char)c); }
            else if (c == '\n') sb_adds(&rc->a, b, "\\n");
            else if (c == '\r') sb_adds(&rc->a, b, "\\r");
            else if (c == '\t') sb_adds(&rc->a, b, "\\t");
            else { snprintf(esc, sizeof esc, "\\x%02x", c); sb_adds(&rc->a, b, esc); }
        }
        sb_add(&rc->a, b, v.u.s.p + run, v.u.s.n - run);
        sb_addc(&rc->a, b, q);
        break;
    }
    case V_LIST: {
        bool tuple = v.u.l->tuple;
        sb_addc(&rc->a, b, tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_adds(&rc->a, b, ", ");
            put_repr(rc, b, v.u.l->v[i]);
        }
        if (tuple && v.u.l->n == 1) sb_addc(&rc->a, b, ',');
        sb_addc(&rc->a, b, tuple ? ')' : ']');
        break;
    }
    case V_DICT:
        if (v.u.d->ns) sb_adds(&rc->a, b, "<Namespace ");
        sb_addc(&rc->a, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sb_adds(&rc->a, b, ", ");
            put_repr(rc, b, v_str(v.u.d->e[i].k, v.u.d->e[i].kn));
            sb_adds(&rc->a, b, ": ");
            put_repr(rc, b, v.u.d->e[i].v);
        }
        sb_addc(&rc->a, b, '}');
        if (v.u.d->ns) sb_addc(&rc->a, b, '>');
        break;
    case V_MACRO: sb_adds(&rc->a, b, "<Macro>"); break;
    case V_FUNC: sb_adds(&rc->a, b, "<function>"); break;
    default: put_str(rc, b, v); break;
    }
    rc->depth--;
}

static str to_str(rctx *rc, val v)
{
    if (v.t == V_STR) return (str){v.u.s.p, v.u.s.n};
    sbuf b = {0};
    put_str(rc, &b, v);
    return (str){b.p ? b.p : "", b.n};
}

static val v_strbuf(sbuf *b) { return v_str(b->p ? b->p : "", b->n); }

/* json.dumps(x, ensure_ascii=False, indent=indent, separators=sep, sort_keys=sort). */
typedef struct json_fmt {
    int indent; /* -1: none */
    str item_sep, key_sep;
    bool sort_keys;
} json_fmt;

static void json_string(rctx *rc, sbuf *b, const char *p, size_t n)
{
    sb_addc(&rc->a, b, '"');
    size_t run = 0; /* bytes copied as they are go in runs, so that their marks go along */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sb_add(&rc->a, b, p + run, i - run);
        run = i + 1;
        char esc[8];
        switch (c) {
        case '"': sb_adds(&rc->a, b, "\\\""); break;
        case '\\': sb_adds(&rc->a, b, "\\\\"); break;
        case '\n': sb_adds(&rc->a, b, "\\n"); break;
        case '\r': sb_adds(&rc->a, b, "\\r"); break;
        case '\t': sb_adds(&rc->a, b, "\\t"); break;
        case '\b': sb_adds(&rc->a, b, "\\b"); break;
        case '\f': sb_adds(&rc->a, b, "\\f"); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_adds(&rc->a, b, esc);
        }
    }
    sb_add(&rc->a, b, p + run, n - run);
    sb_addc(&rc->a, b, '"');
}

static void json_newline(rctx *rc, sbuf *b, const json_fmt *f, int level)
{
    if (f->indent < 0) return;
    sb_addc(&rc->a, b, '\n');
    for (int i = 0; i < level * f->indent; i++) sb_addc(&rc->a, b, ' ');
}

static int kv_cmp(const void *x, const void *y)
{
    const kv *a = x, *b = y;
    size_t n = a->kn < b->kn ? a->kn : b->kn;
    int c = memcmp(a->k, b->k, n);
    return c ? c : (a->kn > b->kn) - (a->kn < b->kn);
}

static void json_dump(rctx *rc, sbuf *b, val v, const json_fmt *f, int level)
{
    walk_in(rc, "tojson");
    char num[64];
    switch (v.t) {
    case V_NONE: sb_adds(&rc->a, b, "null"); break;
    case V_BOOL: sb_adds(&rc->a, b, v.u.b ? "true" : "false"); break;
    case V_INT: put_str(rc, b, v); break;
    case V_FLOAT:
        if (isnan(v.u.f)) sb_adds(&rc->a, b, "NaN");
        else if (isinf(v.u.f)) sb_adds(&rc->a, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else { float_repr(v.u.f, num, sizeof num); sb_adds(&rc->a, b, num); }
        break;
    case V_STR: json_string(rc, b, v.u.s.p, v.u.s.n); break;
    case V_LIST:
        if (!v.u.l->n) { sb_adds(&rc->a, b, "[]"); break; }
        sb_addc(&rc->a, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_add(&rc->a, b, f->item_sep.p, f->item_sep.n);
            json_newline(rc, b, f, level + 1);
            json_dump(rc, b, v.u.l->v[i], f, level + 1);
        }
        json_newline(rc, b, f, level);
        sb_addc(&rc->a, b, ']');
        break;
    case V_DICT: {
        if (v.u.d->ns) rfail(rc, "Object of type Namespace is not JSON serializable");
        if (!v.u.d->n) { sb_adds(&rc->a, b, "{}"); break; }
        kv *e = v.u.d->e;
        if (f->sort_keys) {
            e = arena_alloc(&rc->a, v.u.d->n * sizeof *e);
            memcpy(e, v.u.d->e, v.u.d->n * sizeof *e);
            qsort(e, v.u.d->n, sizeof *e, kv_cmp);
        }
        sb_addc(&rc->a, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sb_add(&rc->a, b, f->item_sep.p, f->item_sep.n);
            json_newline(rc, b, f, level + 1);
            json_string(rc, b, e[i].k, e[i].kn);
            sb_add(&rc->a, b, f->key_sep.p, f->key_sep.n);
            json_dump(rc, b, e[i].v, f, level + 1);
        }
        json_newline(rc, b, f, level);
        sb_addc(&rc->a, b, '}');
        break;
    }
    default: rfail(rc, "Object of type %s is not JSON serializable", type_name(v));
    }
    rc->depth--;
}

/* ---- truth, equality, order -------------------------------------------------------------- */

static bool truthy(val v)
{
    switch (v.t) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s.n != 0;
    case V_LIST: return v.u.l->n != 0;
    case V_DICT: return v.u.d->ns || v.u.d->n != 0;
    default: return true;
    }
}

static bool is_num(val v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }
static double num_f(val v) { return v.t == V_FLOAT ? v.u.f : v.t == V_INT ? (double)v.u.i : v.u.b; }
static int64_t num_i(val v) { return v.t == V_INT ? v.u.i : v.u.b; }

static bool val_eq(rctx *rc, val a, val b);

static bool val_eq_walk(rctx *rc, val a, val b)
{
    if (is_num(a) && is_num(b)) {
        if (a.t == V_FLOAT || b.t == V_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR:
        if (a.u.s.n != b.u.s.n) return false;
        if (a.u.s.p == b.u.s.p) return true;
        work(rc, a.u.s.n);
        return memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case V_LIST:
        if (a.u.l->n != b.u.l->n) return false;
        if (a.u.l == b.u.l) return true;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!val_eq(rc, a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case V_DICT:
        if (a.u.d == b.u.d) return true;
        if (a.u.d->ns || b.u.d->ns || a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            val *o = dict_find(rc, b.u.d, a.u.d->e[i].k, a.u.d->e[i].kn);
            if (!o || !val_eq(rc, a.u.d->e[i].v, *o)) return false;
        }
        return true;
    case V_MACRO: return a.u.m.def == b.u.m.def;
    case V_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

static bool val_eq(rctx *rc, val a, val b)
{
    walk_in(rc, "==");
    bool r = val_eq_walk(rc, a, b);
    rc->depth--;
    return r;
}

static int val_cmp(rctx *rc, val a, val b, const char *op);

/* <0, 0, >0; a TypeError for values Python cannot order. */
static int val_cmp_walk(rctx *rc, val a, val b, const char *op)
{
    if (is_num(a) && is_num(b)) {
        if (a.t == V_FLOAT || b.t == V_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return (x > y) - (x < y);
        }
        int64_t x = num_i(a), y = num_i(b);
        return (x > y) - (x < y);
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        work(rc, n);
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        return c ? c : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if (a.t == V_LIST && b.t == V_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (val_eq(rc, a.u.l->v[i], b.u.l->v[i])) continue;
            return val_cmp(rc, a.u.l->v[i], b.u.l->v[i], op);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    if (a.t == V_UNDEF) fail_undefined(rc, a);
    if (b.t == V_UNDEF) fail_undefined(rc, b);
    rfail(rc, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a), type_name(b));
    return 0;
}

static int val_cmp(rctx *rc, val a, val b, const char *op)
{
    walk_in(rc, op);
    int r = val_cmp_walk(rc, a, b, op);
    rc->depth--;
    return r;
}

/* ---- strings by code point --------------------------------------------------------------- */

/* Length of the UTF-8 sequence at p (an invalid byte counts as one character). */
static size_t u8_step(const char *p, size_t n)
{
    unsigned char c = (unsigned char)p[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (len > n) return 1;
    for (size_t k = 1; k < len; k++)
        if (((unsigned char)p[k] & 0xC0) != 0x80) return 1;
    return len;
}

static size_t u8_count(rctx *rc, const char *p, size_t n)
{
    work(rc, n * 8); /* a byte at a time: about eight times memcmp's cost */
    size_t c = 0;
    for (size_t i = 0; i < n; i += u8_step(p + i, n - i)) c++;
    return c;
}

/* The characters of a string as a list of one-character strings. */
static jlist *str_chars(rctx *rc, str s)
{
    jlist *l = list_new(rc, u8_count(rc, s.p, s.n));
    size_t k = 0;
    for (size_t i = 0; i < s.n;) {
        size_t m = u8_step(s.p + i, s.n - i);
        l->v[k++] = v_str(s.p + i, m);
        i += m;
    }
    return l;
}

/* What `for x in v` walks: list items, dict keys, string characters; Undefined is empty. */
static jlist *iter_list(rctx *rc, val v)
{
    switch (v.t) {
    case V_LIST: return v.u.l;
    case V_STR: return str_chars(rc, (str){v.u.s.p, v.u.s.n});
    case V_DICT: {
        jlist *l = list_new(rc, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) l->v[i] = v_str(v.u.d->e[i].k, v.u.d->e[i].kn);
        return l;
    }
    case V_UNDEF: return list_new(rc, 0);
    default: rfail(rc, "'%s' object is not iterable", type_name(v));
    }
    return NULL;
}

static bool ws_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Python's strip family: chars NULL = whitespace; which: 1 left, 2 right, 3 both. */
static str str_strip(str s, const str *chars, int which)
{
    const char *b = s.p, *e = s.p + s.n;
    if (!chars) {
        if (which & 1) while (b < e && ws_char(*b)) b++;
        if (which & 2) while (e > b && ws_char(e[-1])) e--;
    } else {
        /* chars is a set of characters, possibly multi-byte */
        for (bool moved = true; moved && (which & 1) && b < e;) {
            moved = false;
            for (size_t i = 0; i < chars->n;) {
                size_t m = u8_step(chars->p + i, chars->n - i);
                if ((size_t)(e - b) >= m && memcmp(b, chars->p + i, m) == 0) { b += m; moved = true; break; }
                i += m;
            }
        }
        for (bool moved = true; moved && (which & 2) && e > b;) {
            moved = false;
            for (size_t i = 0; i < chars->n;) {
                size_t m = u8_step(chars->p + i, chars->n - i);
                if ((size_t)(e - b) >= m && memcmp(e - m, chars->p + i, m) == 0) { e -= m; moved = true; break; }
                i += m;
            }
        }
    }
    return (str){b, (size_t)(e - b)};
}

static val str_case(rctx *rc, str s, int mode) /* 0 lower, 1 upper, 2 title, 3 capitalize */
{
    char *o = arena_strdup(&rc->a, s.p, s.n);
    bool start = true;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)o[i];
        bool alpha = isalpha(c) != 0;
        if (mode == 0) o[i] = (char)tolower(c);
        else if (mode == 1) o[i] = (char)toupper(c);
        else if (mode == 2) o[i] = (char)(start ? toupper(c) : tolower(c));
        else o[i] = (char)(i == 0 ? toupper(c) : tolower(c));
        if (mode == 2) start = !alpha && !(c & 0x80) && !isdigit(c) && c != '\'';
    }
    return v_str(o, s.n);
}

static val str_replace(rctx *rc, str s, str old, str new, int64_t count)
{
    sbuf b = {0};
    sb_reserve(&rc->a, &b, 1);
    b.p[0] = 0;
    size_t i = 0;
    int64_t done = 0;
    if (old.n == 0) { /* Python inserts `new` between characters */
        for (; i <= s.n && (count < 0 || done < count); done++) {
            sb_add(&rc->a, &b, new.p, new.n);
            if (i == s.n) { i++; break; }
            size_t m = u8_step(s.p + i, s.n - i);
            sb_add(&rc->a, &b, s.p + i, m);
            i += m;
        }
        if (i <= s.n) sb_add(&rc->a, &b, s.p + i, s.n - i);
        return v_strbuf(&b);
    }
    while (i < s.n && (count < 0 || done < count)) {
        work(rc, s.n - i);
        const char *hit = memmem(s.p + i, s.n - i, old.p, old.n);
        if (!hit) break;
        sb_add(&rc->a, &b, s.p + i, (size_t)(hit - s.p) - i);
        sb_add(&rc->a, &b, new.p, new.n);
        i = (size_t)(hit - s.p) + old.n;
        done++;
        step(rc);
    }
    sb_add(&rc->a, &b, s.p + i, s.n - i);
    return v_strbuf(&b);
}

static val str_split(rctx *rc, str s, const str *sep, int64_t maxsplit)
{
    work(rc, s.n);
    vbuild out = {0};
    size_t i = 0;
    if (!sep) { /* runs of whitespace, no empty strings */
        for (;;) {
            while (i < s.n && ws_char(s.p[i])) i++;
            if (i >= s.n) break;
            if (maxsplit >= 0 && (int64_t)out.n >= maxsplit) {
                size_t e = s.n;
                while (e > i && ws_char(s.p[e - 1])) e--;
                vb_push(rc, &out, v_str(s.p + i, e - i));
                break;
            }
            size_t st = i;
            while (i < s.n && !ws_char(s.p[i])) i++;
            vb_push(rc, &out, v_str(s.p + st, i - st));
        }
        return vb_list(rc, &out);
    }
    if (sep->n == 0) rfail(rc, "empty separator");
    for (;;) {
        const char *hit = (maxsplit < 0 || (int64_t)out.n < maxsplit) ? memmem(s.p + i, s.n - i, sep->p, sep->n) : NULL;
        if (!hit) {
            vb_push(rc, &out, v_str(s.p + i, s.n - i));
            break;
        }
        vb_push(rc, &out, v_str(s.p + i, (size_t)(hit - s.p) - i));
        i = (size_t)(hit - s.p) + sep->n;
    }
    return vb_list(rc, &out);
}

/* ---- evaluation -------------------------------------------------------------------------- */

static val eval(rctx *rc, const node *n, frame *f);
static void exec(rctx *rc, const node *n, frame *f);

static void out_add(rctx *rc, const char *p, size_t n)
{
    if (rc->out->n + n > rc->max_output)
        rfail(rc, "template output limit exceeded (%zu bytes)", rc->max_output);
    sb_add(&rc->a, rc->out, p, n);
}

/* Renders a body into a new string (macros, block set, call and filter blocks). */
static val capture(rctx *rc, const node *body, frame *f)
{
    sbuf b = {0}, *saved = rc->out;
    rc->out = &b;
    exec(rc, body, f);
    rc->out = saved;
    return v_strbuf(&b);
}

typedef struct args {
    val *pos;
    size_t npos;
    const str *kw;
    val *kwv;
    size_t nkw;
} args;

/* Evaluates a call's arguments (positional, then keyword). */
static args eval_args(rctx *rc, const node *n, frame *f)
{
    args a = {0};
    size_t np = n->nkids - n->nkw;
    a.pos = n->nkids ? arena_alloc(&rc->a, n->nkids * sizeof *a.pos) : NULL;
    for (size_t i = 0; i < n->nkids; i++) a.pos[i] = eval(rc, n->kids[i], f);
    a.npos = np;
    a.kw = n->kw;
    a.kwv = a.pos ? a.pos + np : NULL;
    a.nkw = n->nkw;
    return a;
}

/* Argument i by position or by name; NULL when absent. */
static val *arg(args *a, size_t i, const char *name)
{
    if (i < a->npos) return &a->pos[i];
    for (size_t k = 0; name && k < a->nkw; k++)
        if (str_eq(a->kw[k], name)) return &a->kwv[k];
    return NULL;
}

/* A macro parameter: by position or by its name. */
static val *arg_named(args *a, size_t i, str name)
{
    if (i < a->npos) return &a->pos[i];
    for (size_t k = 0; k < a->nkw; k++)
        if (a->kw[k].n == name.n && memcmp(a->kw[k].p, name.p, name.n) == 0) return &a->kwv[k];
    return NULL;
}

static str arg_str(rctx *rc, args *a, size_t i, const char *name, const char *what)
{
    val *v = arg(a, i, name);
    if (!v || v->t != V_STR) rfail(rc, "%s expects a string argument%s%s", what, name ? " " : "", name ? name : "");
    return (str){v->u.s.p, v->u.s.n};
}

static int64_t arg_int(rctx *rc, args *a, size_t i, const char *name, int64_t dflt, const char *what)
{
    val *v = arg(a, i, name);
    if (!v || v->t == V_NONE) return dflt;
    if (v->t != V_INT && v->t != V_BOOL) rfail(rc, "%s expects an integer argument", what);
    return num_i(*v);
}

static val call_macro(rctx *rc, val m, args *a, const node *caller_body, const node *caller_def, frame *caller_scope);
static val filter_one(rctx *rc, const node *fn, val x, frame *f);
static val chain_apply(rctx *rc, const node *n, val hole, frame *f);
static bool apply_test(rctx *rc, str name, val x, args *a);
static val call_method(rctx *rc, val obj, str name, args *a);

static val get_attr(rctx *rc, val obj, str name)
{
    if (obj.t == V_DICT) {
        val *v = dict_find(rc, obj.u.d, name.p, name.n);
        return v ? *v : v_undef(arena_strdup(&rc->a, name.p, name.n));
    }
    if (obj.t == V_UNDEF) fail_undefined(rc, obj);
    /* Python attributes of other types are methods, called through call_method. */
    return v_undef(arena_strdup(&rc->a, name.p, name.n));
}

static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + (int64_t)n : i; }

static val get_item(rctx *rc, val obj, val key)
{
    if (obj.t == V_UNDEF) fail_undefined(rc, obj);
    if (obj.t == V_DICT) {
        if (key.t != V_STR) return v_undef("item");
        val *v = dict_find(rc, obj.u.d, key.u.s.p, key.u.s.n);
        return v ? *v : v_undef(arena_strdup(&rc->a, key.u.s.p, key.u.s.n));
    }
    if ((obj.t == V_LIST || obj.t == V_STR) && (key.t == V_INT || key.t == V_BOOL)) {
        jlist *l = obj.t == V_LIST ? obj.u.l : str_chars(rc, (str){obj.u.s.p, obj.u.s.n});
        int64_t i = norm_index(num_i(key), l->n);
        if (i < 0 || i >= (int64_t)l->n) return v_undef("index out of range");
        return l->v[i];
    }
    if (obj.t == V_NONE) rfail(rc, "'NoneType' object is not subscriptable");
    return v_undef("item");
}

static val slice(rctx *rc, val obj, val lo, val hi, val st)
{
    if (obj.t == V_UNDEF) fail_undefined(rc, obj);
    if (obj.t != V_LIST && obj.t != V_STR) rfail(rc, "'%s' object is not subscriptable", type_name(obj));
    jlist *l = obj.t == V_LIST ? obj.u.l : str_chars(rc, (str){obj.u.s.p, obj.u.s.n});
    int64_t n = (int64_t)l->n, step_ = 1;
    if (st.t != V_NONE && st.t != V_UNDEF) {
        if (st.t != V_INT) rfail(rc, "slice indices must be integers");
        step_ = st.u.i;
        if (step_ == 0) rfail(rc, "slice step cannot be zero");
    }
    int64_t a, b;
    for (int k = 0; k < 2; k++) {
        val x = k ? hi : lo;
        int64_t *dst = k ? &b : &a;
        if (x.t == V_NONE || x.t == V_UNDEF) {
            *dst = step_ > 0 ? (k ? n : 0) : (k ? -1 : n - 1);
            continue;
        }
        if (x.t != V_INT) rfail(rc, "slice indices must be integers");
        int64_t i = x.u.i < 0 ? x.u.i + n : x.u.i;
        if (step_ > 0) i = i < 0 ? 0 : i > n ? n : i;
        else i = i < -1 ? -1 : i > n - 1 ? n - 1 : i;
        *dst = i;
    }
    vbuild out = {0};
    /* i stays in [-1, n]; a huge step ends the walk instead of overflowing past b */
    for (int64_t i = a; step_ > 0 ? i < b : i > b;) {
        step(rc);
        vb_push(rc, &out, l->v[i]);
        if (__builtin_add_overflow(i, step_, &i)) break;
    }
    if (obj.t == V_LIST) return vb_list(rc, &out);
    sbuf s = {0};
    sb_reserve(&rc->a, &s, 1);
    s.p[0] = 0;
    for (size_t i = 0; i < out.n; i++) sb_add(&rc->a, &s, out.v[i].u.s.p, out.v[i].u.s.n);
    return v_strbuf(&s);
}

static bool contains(rctx *rc, val hay, val needle)
{
    switch (hay.t) {
    case V_STR:
        if (needle.t != V_STR) rfail(rc, "'in <string>' requires string as left operand, not %s", type_name(needle));
        work(rc, hay.u.s.n);
        return needle.u.s.n == 0 || memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    case V_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (val_eq(rc, hay.u.l->v[i], needle)) return true;
        return false;
    case V_DICT:
        return needle.t == V_STR && dict_find(rc, hay.u.d, needle.u.s.p, needle.u.s.n) != NULL;
    case V_UNDEF: return false;
    default: rfail(rc, "argument of type '%s' is not iterable", type_name(hay));
    }
    return false;
}

static val arith(rctx *rc, binop op, val a, val b)
{
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a.t == V_UNDEF) fail_undefined(rc, a);
    if (b.t == V_UNDEF) fail_undefined(rc, b);
    if (op == OP_ADD && a.t == V_STR) {
        if (b.t != V_STR) rfail(rc, "can only concatenate str (not \"%s\") to str", type_name(b));
        sbuf s = {0};
        sb_add(&rc->a, &s, a.u.s.p, a.u.s.n);
        sb_add(&rc->a, &s, b.u.s.p, b.u.s.n);
        if (s.n > rc->max_output) rfail(rc, "string too long");
        return v_strbuf(&s);
    }
    if (op == OP_ADD && a.t == V_LIST) {
        if (b.t != V_LIST) rfail(rc, "can only concatenate list (not \"%s\") to list", type_name(b));
        jlist *l = list_new(rc, a.u.l->n + b.u.l->n);
        if (a.u.l->n) memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
        if (b.u.l->n) memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
        return v_list(l);
    }
    if (op == OP_MUL && ((a.t == V_STR || a.t == V_LIST) && (b.t == V_INT || b.t == V_BOOL))) {
        int64_t times = num_i(b);
        size_t unit = a.t == V_STR ? a.u.s.n : a.u.l->n;
        if (times > 0 && unit && (uint64_t)times > rc->max_output / unit) rfail(rc, "repetition too long");
        if (a.t == V_STR) {
            /* by doubling: 'x' * 4000000 is 22 copies, not four million */
            size_t total = times > 0 ? (size_t)times * unit : 0;
            sbuf s = {0};
            sb_reserve(&rc->a, &s, total + 1); /* no move below: the copies read s itself */
            s.p[0] = 0;
            if (total) sb_add(&rc->a, &s, a.u.s.p, a.u.s.n);
            while (s.n < total) sb_add(&rc->a, &s, s.p, s.n < total - s.n ? s.n : total - s.n);
            return v_strbuf(&s);
        }
        jlist *l = list_new(rc, times > 0 ? (size_t)times * unit : 0);
        /* [] * n has no storage to copy into (l->v may be NULL) */
        for (int64_t i = 0; unit && i < times; i++) memcpy(l->v + (size_t)i * unit, a.u.l->v, unit * sizeof *l->v);
        return v_list(l);
    }
    if (op == OP_MUL && (b.t == V_STR || b.t == V_LIST) && (a.t == V_INT || a.t == V_BOOL)) return arith(rc, op, b, a);
    if (!is_num(a) || !is_num(b))
        rfail(rc, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(a), type_name(b));
    bool fl = a.t == V_FLOAT || b.t == V_FLOAT || op == OP_DIV;
    if (!fl) {
        int64_t x = num_i(a), y = num_i(b), r;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &r)) rfail(rc, "integer overflow"); return v_int(r);
        case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) rfail(rc, "integer overflow"); return v_int(r);
        case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) rfail(rc, "integer overflow"); return v_int(r);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0) rfail(rc, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) rfail(rc, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
            return v_int(op == OP_MOD ? m : q);
        }
        case OP_POW: {
            if (y < 0) return v_float(pow((double)x, (double)y));
            r = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(r, x, &r)) rfail(rc, "integer overflow");
                if (r == 0 || r == 1) break;
                step(rc);
            }
            if (r == -1 || (r == 1 && x == -1)) r = (y % 2) ? x : 1;
            return v_int(r);
        }
        default: break;
        }
    }
    double x = num_f(a), y = num_f(b);
    switch (op) {
    case OP_ADD: return v_float(x + y);
    case OP_SUB: return v_float(x - y);
    case OP_MUL: return v_float(x * y);
    case OP_DIV: if (y == 0) rfail(rc, "division by zero"); return v_float(x / y);
    case OP_FLOORDIV: if (y == 0) rfail(rc, "float floor division by zero"); return v_float(floor(x / y));
    case OP_MOD: {
        if (y == 0) rfail(rc, "float modulo");
        double m = fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return v_float(m);
    }
    default: return v_float(pow(x, y));
    }
}

static val eval_bin(rctx *rc, const node *n, frame *f)
{
    val a = eval(rc, n->a, f), b = eval(rc, n->b, f);
    switch ((binop)n->op) {
    case OP_EQ: return v_bool(val_eq(rc, a, b));
    case OP_NE: return v_bool(!val_eq(rc, a, b));
    case OP_LT: return v_bool(val_cmp(rc, a, b, "<") < 0);
    case OP_GT: return v_bool(val_cmp(rc, a, b, ">") > 0);
    case OP_LE: return v_bool(val_cmp(rc, a, b, "<=") <= 0);
    case OP_GE: return v_bool(val_cmp(rc, a, b, ">=") >= 0);
    case OP_IN: return v_bool(contains(rc, b, a));
    case OP_NOTIN: return v_bool(!contains(rc, b, a));
    case OP_CONCAT: {
        str x = to_str(rc, a), y = to_str(rc, b);
        sbuf s = {0};
        sb_add(&rc->a, &s, x.p, x.n);
        sb_add(&rc->a, &s, y.p, y.n);
        return v_strbuf(&s);
    }
    default: return arith(rc, (binop)n->op, a, b);
    }
}

static val call_global(rctx *rc, int fn, args *a)
{
    switch ((gfunc)fn) {
    case F_RANGE: {
        int64_t lo = 0, hi, st = 1;
        if (a->npos == 1) hi = arg_int(rc, a, 0, NULL, 0, "range");
        else if (a->npos >= 2) {
            lo = arg_int(rc, a, 0, NULL, 0, "range");
            hi = arg_int(rc, a, 1, NULL, 0, "range");
            st = arg_int(rc, a, 2, NULL, 1, "range");
        } else rfail(rc, "range expected at least 1 argument");
        if (st == 0) rfail(rc, "range() arg 3 must not be zero");
        vbuild out = {0};
        for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
            step(rc);
            vb_push(rc, &out, v_int(i));
            if (__builtin_add_overflow(i, st, &i)) break; /* the next one would pass hi */
        }
        return vb_list(rc, &out);
    }
    case F_NAMESPACE:
    case F_DICT: {
        jdict *d = dict_new(rc);
        d->ns = fn == F_NAMESPACE;
        for (size_t i = 0; i < a->npos; i++) { /* namespace(a_dict) copies it */
            if (a->pos[i].t != V_DICT) rfail(rc, "%s() takes keyword arguments", fn == F_NAMESPACE ? "namespace" : "dict");
            for (size_t k = 0; k < a->pos[i].u.d->n; k++)
                dict_set(rc, d, a->pos[i].u.d->e[k].k, a->pos[i].u.d->e[k].kn, a->pos[i].u.d->e[k].v);
        }
        for (size_t i = 0; i < a->nkw; i++) dict_set(rc, d, a->kw[i].p, a->kw[i].n, a->kwv[i]);
        return (val){.t = V_DICT, .u.d = d};
    }
    case F_RAISE: {
        str m = a->npos ? to_str(rc, a->pos[0]) : (str){"", 0};
        rfail(rc, "%.*s", (int)(m.n > 1000 ? 1000 : m.n), m.p);
        break;
    }
    case F_STRFTIME: {
        str fmt = arg_str(rc, a, 0, NULL, "strftime_now");
        struct tm tmv;
        if (rc->now) {
            tmv = *rc->now;
        } else {
            time_t t = time(NULL);
            localtime_r(&t, &tmv);
        }
        char *cfmt = arena_strdup(&rc->a, fmt.p, fmt.n < 256 ? fmt.n : 256);
        char buf[512];
        size_t k = strftime(buf, sizeof buf, cfmt, &tmv);
        return v_str(arena_strdup(&rc->a, buf, k), k);
    }
    case F_CALLER_NONE: break;
    }
    rfail(rc, "not callable");
    return v_none();
}

static val eval_call(rctx *rc, const node *n, frame *f)
{
    const node *c = n->a;
    args a;
    if (c->k == N_ATTR) {
        val obj = eval(rc, c->a, f);
        /* A dict's own attributes (get, items, keys, values) win over its keys, as in
         * Python's getattr-first lookup; other dict keys may hold macros. */
        bool method = obj.t != V_DICT || str_eq(c->name, "get") || str_eq(c->name, "items") ||
                      str_eq(c->name, "keys") || str_eq(c->name, "values");
        if (method && obj.t != V_UNDEF) {
            a = eval_args(rc, n, f);
            return call_method(rc, obj, c->name, &a);
        }
    }
    if (c->k == N_NAME && str_eq(c->name, "caller") && !frame_find(f, c->name)) {
        if (!rc->caller_body) rfail(rc, "'caller' is undefined");
        a = eval_args(rc, n, f);
        frame *cf = frame_new(rc, rc->caller_scope);
        const node *def = rc->caller_def;
        for (size_t i = 0; def && i < def->nparams; i++) {
            val *v = arg_named(&a, i, def->params[i]);
            frame_set(rc, cf, def->params[i], v ? *v : def->kids[i] ? eval(rc, def->kids[i], cf) : v_undef(NULL));
        }
        const node *body = rc->caller_body;
        return capture(rc, body, cf);
    }
    val fn = eval(rc, c, f);
    a = eval_args(rc, n, f);
    if (fn.t == V_MACRO) return call_macro(rc, fn, &a, NULL, NULL, NULL);
    if (fn.t == V_FUNC) return call_global(rc, fn.u.fn, &a);
    if (fn.t == V_UNDEF) fail_undefined(rc, fn);
    rfail(rc, "'%s' object is not callable", type_name(fn));
    return v_none();
}

static val eval(rctx *rc, const node *n, frame *f)
{
    step(rc);
    if (++rc->depth > rc->max_depth) rfail(rc, "template nested too deeply (depth %d)", rc->max_depth);
    int saved_line = rc->line;
    rc->line = n->line;
    val r;
    switch (n->k) {
    case N_LIT: r = n->lit; break;
    case N_NAME: {
        val *v = frame_find(f, n->name);
        r = v ? *v : v_undef(arena_strdup(&rc->a, n->name.p, n->name.n));
        break;
    }
    case N_LIST:
    case N_TUPLE: {
        jlist *l = list_new(rc, n->nkids);
        for (size_t i = 0; i < n->nkids; i++) l->v[i] = eval(rc, n->kids[i], f);
        l->tuple = n->k == N_TUPLE;
        r = v_list(l);
        break;
    }
    case N_DICT: {
        jdict *d = dict_new(rc);
        for (size_t i = 0; i + 1 < n->nkids; i += 2) {
            val k = eval(rc, n->kids[i], f);
            if (k.t != V_STR) rfail(rc, "dict keys must be strings here");
            dict_set(rc, d, k.u.s.p, k.u.s.n, eval(rc, n->kids[i + 1], f));
        }
        r = (val){.t = V_DICT, .u.d = d};
        break;
    }
    case N_ATTR: r = get_attr(rc, eval(rc, n->a, f), n->name); break;
    case N_ITEM: r = get_item(rc, eval(rc, n->a, f), eval(rc, n->b, f)); break;
    case N_SLICE: {
        val o = eval(rc, n->a, f), parts[3];
        for (int i = 0; i < 3; i++) parts[i] = n->kids[i] ? eval(rc, n->kids[i], f) : v_none();
        r = slice(rc, o, parts[0], parts[1], parts[2]);
        break;
    }
    case N_CALL: r = eval_call(rc, n, f); break;
    case N_FILTER: r = filter_one(rc, n, eval(rc, n->a, f), f); break;
    case N_TEST: {
        val x = eval(rc, n->a, f);
        args a = eval_args(rc, n, f);
        r = v_bool(apply_test(rc, n->name, x, &a) != (n->op != 0));
        break;
    }
    case N_NEG:
    case N_POS: {
        val x = eval(rc, n->a, f);
        if (x.t == V_UNDEF) fail_undefined(rc, x);
        if (!is_num(x)) rfail(rc, "bad operand type for unary %c: '%s'", n->k == N_NEG ? '-' : '+', type_name(x));
        if (n->k == N_POS) r = x.t == V_BOOL ? v_int(x.u.b) : x;
        else if (x.t == V_FLOAT) r = v_float(-x.u.f);
        else if (num_i(x) == INT64_MIN) rfail(rc, "integer overflow");
        else r = v_int(-num_i(x));
        break;
    }
    case N_NOT: r = v_bool(!truthy(eval(rc, n->a, f))); break;
    case N_AND: {
        val x = eval(rc, n->a, f);
        r = truthy(x) ? eval(rc, n->b, f) : x;
        break;
    }
    case N_OR: {
        val x = eval(rc, n->a, f);
        r = truthy(x) ? x : eval(rc, n->b, f);
        break;
    }
    case N_BIN: r = eval_bin(rc, n, f); break;
    case N_COND:
        if (truthy(eval(rc, n->b, f))) r = eval(rc, n->a, f);
        else r = n->c ? eval(rc, n->c, f) : v_undef(NULL);
        break;
    default: rfail(rc, "not an expression"); r = v_none();
    }
    rc->line = saved_line;
    rc->depth--;
    return r;
}

static val call_macro(rctx *rc, val m, args *a, const node *caller_body, const node *caller_def, frame *caller_scope)
{
    const node *def = m.u.m.def;
    if (a->npos > def->nparams) rfail(rc, "macro '%.*s' takes %zu arguments, %zu given", (int)def->name.n, def->name.p, def->nparams, a->npos);
    for (size_t k = 0; k < a->nkw; k++) {
        bool known = false;
        for (size_t i = 0; i < def->nparams; i++)
            known = known || (def->params[i].n == a->kw[k].n && memcmp(def->params[i].p, a->kw[k].p, a->kw[k].n) == 0);
        if (!known) rfail(rc, "macro '%.*s' takes no keyword argument '%.*s'", (int)def->name.n, def->name.p, (int)a->kw[k].n, a->kw[k].p);
    }
    frame *mf = frame_new(rc, m.u.m.scope);
    for (size_t i = 0; i < def->nparams; i++) {
        val *v = arg_named(a, i, def->params[i]);
        frame_set(rc, mf, def->params[i], v ? *v : def->kids[i] ? eval(rc, def->kids[i], mf) : v_undef(arena_strdup(&rc->a, def->params[i].p, def->params[i].n)));
    }
    const node *sb = rc->caller_body, *sd = rc->caller_def;
    frame *ss = rc->caller_scope;
    rc->caller_body = caller_body;
    rc->caller_def = caller_def;
    rc->caller_scope = caller_scope;
    val r = capture(rc, def->b, mf);
    rc->caller_body = sb;
    rc->caller_def = sd;
    rc->caller_scope = ss;
    rc->loop_ctl = 0;
    return r;
}

/* Binds a loop or set target: one name, or several unpacked from a list. */
static void bind_targets(rctx *rc, frame *f, const str *names, size_t n, val v)
{
    if (n == 1) {
        frame_set(rc, f, names[0], v);
        return;
    }
    jlist *l = v.t == V_LIST ? v.u.l : v.t == V_STR ? str_chars(rc, (str){v.u.s.p, v.u.s.n}) : NULL;
    if (!l) rfail(rc, "cannot unpack non-iterable %s object", type_name(v));
    if (l->n != n) rfail(rc, "cannot unpack %zu values into %zu names", l->n, n);
    for (size_t i = 0; i < n; i++) frame_set(rc, f, names[i], l->v[i]);
}

static void exec_for(rctx *rc, const node *n, frame *f)
{
    jlist *src = iter_list(rc, eval(rc, n->a, f));
    jlist *items = src;
    if (n->op) { /* the loop filter runs before the loop, so loop.length counts what passes */
        vbuild keep = {0};
        for (size_t i = 0; i < src->n; i++) {
            frame *tf = frame_new(rc, f);
            bind_targets(rc, tf, n->params, n->nparams, src->v[i]);
            if (truthy(eval(rc, n->c, tf))) vb_push(rc, &keep, src->v[i]);
        }
        items = vb_list(rc, &keep).u.l;
    }
    for (size_t i = 0; i < items->n; i++) {
        step(rc);
        frame *it = frame_new(rc, f);
        jdict *loop = dict_new(rc);
        size_t len = items->n;
        dict_sets(rc, loop, "index", v_int((int64_t)i + 1));
        dict_sets(rc, loop, "index0", v_int((int64_t)i));
        dict_sets(rc, loop, "revindex", v_int((int64_t)(len - i)));
        dict_sets(rc, loop, "revindex0", v_int((int64_t)(len - i - 1)));
        dict_sets(rc, loop, "first", v_bool(i == 0));
        dict_sets(rc, loop, "last", v_bool(i + 1 == len));
        dict_sets(rc, loop, "length", v_int((int64_t)len));
        dict_sets(rc, loop, "depth", v_int(1));
        dict_sets(rc, loop, "depth0", v_int(0));
        dict_sets(rc, loop, "previtem", i ? items->v[i - 1] : v_undef("loop.previtem"));
        dict_sets(rc, loop, "nextitem", i + 1 < len ? items->v[i + 1] : v_undef("loop.nextitem"));
        frame_set(rc, it, (str){"loop", 4}, (val){.t = V_DICT, .u.d = loop});
        bind_targets(rc, it, n->params, n->nparams, items->v[i]);
        exec(rc, n->b, it);
        int ctl = rc->loop_ctl;
        rc->loop_ctl = 0;
        if (ctl == 1) break;
    }
    if (items->n == 0 && n->nkids) exec(rc, n->kids[0], f);
}

static void exec(rctx *rc, const node *n, frame *f)
{
    step(rc);
    if (++rc->depth > rc->max_depth) rfail(rc, "template nested too deeply (depth %d)", rc->max_depth);
    int saved_line = rc->line;
    rc->line = n->line;
    switch (n->k) {
    case N_BODY:
        for (size_t i = 0; i < n->nkids && !rc->loop_ctl; i++) exec(rc, n->kids[i], f);
        break;
    case N_TEXT: out_add(rc, n->lit.u.s.p, n->lit.u.s.n); break;
    case N_OUTPUT: {
        str s = to_str(rc, eval(rc, n->a, f));
        out_add(rc, s.p, s.n);
        break;
    }
    case N_IF:
        if (truthy(eval(rc, n->a, f))) exec(rc, n->b, f);
        else if (n->c) exec(rc, n->c, f);
        break;
    case N_FOR: exec_for(rc, n, f); break;
    case N_SET: {
        val v = eval(rc, n->a, f);
        if (n->op) {
            val *ns = frame_find(f, n->name);
            if (!ns || ns->t != V_DICT || !ns->u.d->ns)
                rfail(rc, "cannot assign attribute on non-namespace object '%.*s'", (int)n->name.n, n->name.p);
            dict_set(rc, ns->u.d, n->params[0].p, n->params[0].n, v);
        } else {
            bind_targets(rc, f, n->params, n->nparams, v);
        }
        break;
    }
    case N_SET_BLOCK: {
        val v = capture(rc, n->b, f);
        if (n->c) v = chain_apply(rc, n->c, v, f);
        frame_set(rc, f, n->params[0], v);
        break;
    }
    case N_FILTER_BLOCK: {
        str s = to_str(rc, chain_apply(rc, n->c, capture(rc, n->b, f), f));
        out_add(rc, s.p, s.n);
        break;
    }
    case N_MACRO:
        frame_set(rc, f, n->name, (val){.t = V_MACRO, .u.m = {n, f}});
        break;
    case N_CALL_BLOCK: {
        const node *call = n->a;
        val fn = eval(rc, call->a, f);
        if (fn.t != V_MACRO) rfail(rc, "{%% call %%} needs a macro");
        args a = eval_args(rc, call, f);
        str s = to_str(rc, call_macro(rc, fn, &a, n->b, n, f));
        out_add(rc, s.p, s.n);
        break;
    }
    case N_BREAK: rc->loop_ctl = 1; break;
    case N_CONTINUE: rc->loop_ctl = 2; break;
    default: rfail(rc, "not a statement");
    }
    rc->line = saved_line;
    rc->depth--;
}

/* ---- filters ----------------------------------------------------------------------------- */

/* `attribute` arguments may name nested attributes: "function.name". */
static val attr_path(rctx *rc, val x, str path)
{
    while (path.n) {
        const char *dot = memchr(path.p, '.', path.n);
        size_t k = dot ? (size_t)(dot - path.p) : path.n;
        str part = {path.p, k};
        bool digits = k > 0;
        for (size_t i = 0; i < k; i++) digits = digits && isdigit((unsigned char)part.p[i]);
        if (digits && x.t == V_LIST) x = get_item(rc, x, v_int(strtoll(arena_strdup(&rc->a, part.p, k), NULL, 10)));
        else if (x.t == V_UNDEF) return x;
        else x = get_attr(rc, x, part);
        path.p += dot ? k + 1 : k;
        path.n -= dot ? k + 1 : k;
    }
    return x;
}

static val filter_select(rctx *rc, val x, args *a, bool attr, bool keep)
{
    jlist *l = iter_list(rc, x);
    vbuild out = {0};
    str attrname = {0};
    size_t ti = 0;
    if (attr) {
        attrname = arg_str(rc, a, 0, NULL, "selectattr");
        ti = 1;
    }
    str test = {0};
    bool has_test = ti < a->npos;
    if (has_test) test = arg_str(rc, a, ti, NULL, "select");
    size_t skip = has_test ? ti + 1 : ti;
    args rest = {.pos = a->npos > skip ? a->pos + skip : NULL, .npos = a->npos > skip ? a->npos - skip : 0};
    for (size_t i = 0; i < l->n; i++) {
        val item = attr ? attr_path(rc, l->v[i], attrname) : l->v[i];
        bool ok = has_test ? apply_test(rc, test, item, &rest) : truthy(item);
        if (ok == keep) vb_push(rc, &out, l->v[i]);
    }
    return vb_list(rc, &out);
}

static val do_indent(rctx *rc, str s, str pad, bool first, bool blank)
{
    sbuf b = {0};
    sb_reserve(&rc->a, &b, 1);
    b.p[0] = 0;
    /* Python's splitlines on "\n": lines after the first get the pad unless blank. */
    size_t i = 0;
    bool line0 = true;
    while (i <= s.n) {
        const char *nl = memchr(s.p + i, '\n', s.n - i);
        size_t e = nl ? (size_t)(nl - s.p) : s.n;
        bool empty = e == i;
        if ((line0 ? first : true) && (blank || !empty) && !(line0 && !first)) sb_add(&rc->a, &b, pad.p, pad.n);
        sb_add(&rc->a, &b, s.p + i, e - i);
        if (!nl) break;
        sb_addc(&rc->a, &b, '\n');
        i = e + 1;
        line0 = false;
        if (i == s.n) break; /* a trailing newline adds no line */
    }
    return v_strbuf(&b);
}

static int sort_cmp_rc(rctx *rc, val a, val b) { return val_cmp(rc, a, b, "<"); }

/* Insertion-free merge sort (stable, like Python's), comparisons through val_cmp. */
static void merge_sort(rctx *rc, val *v, val *tmp, size_t n, const val *keys, val *ktmp, bool rev)
{
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(rc, v, tmp, h, keys, ktmp, rev);
    merge_sort(rc, v + h, tmp + h, n - h, keys ? keys + h : NULL, ktmp ? ktmp + h : NULL, rev);
    size_t i = 0, j = h, k = 0;
    val *kk = (val *)keys;
    while (i < h && j < n) {
        int c = sort_cmp_rc(rc, kk ? kk[j] : v[j], kk ? kk[i] : v[i]);
        bool take_right = rev ? c > 0 : c < 0;
        if (take_right) { tmp[k] = v[j]; if (kk) ktmp[k] = kk[j]; k++; j++; }
        else { tmp[k] = v[i]; if (kk) ktmp[k] = kk[i]; k++; i++; }
    }
    while (i < h) { tmp[k] = v[i]; if (kk) ktmp[k] = kk[i]; k++; i++; }
    while (j < n) { tmp[k] = v[j]; if (kk) ktmp[k] = kk[j]; k++; j++; }
    memcpy(v, tmp, n * sizeof *v);
    if (kk) memcpy(kk, ktmp, n * sizeof *kk);
}


static val chain_apply(rctx *rc, const node *n, val hole, frame *f)
{
    if (n->k == N_LIT) return hole;
    val x = chain_apply(rc, n->a, hole, f);
    if (n->k == N_TEST) {
        args a = eval_args(rc, n, f);
        return v_bool(apply_test(rc, n->name, x, &a) != (n->op != 0));
    }
    return filter_one(rc, n, x, f);
}

static val to_list_val(rctx *rc, val x) { return v_list(iter_list(rc, x)); }

static val filter_named(rctx *rc, str name, val x, args *a);

static val filter_one(rctx *rc, const node *fn, val x, frame *f)
{
    args a = eval_args(rc, fn, f);
    return filter_named(rc, fn->name, x, &a);
}

static val filter_named(rctx *rc, str name, val x, args *a)
{
#define IS(s) str_eq(name, s)
    if (IS("safe") || IS("e") || IS("escape") || IS("forceescape")) {
        if (IS("safe")) return x;
        str s = to_str(rc, x);
        sbuf b = {0};
        sb_reserve(&rc->a, &b, 1);
        b.p[0] = 0;
        for (size_t i = 0; i < s.n; i++) {
            switch (s.p[i]) {
            case '&': sb_adds(&rc->a, &b, "&amp;"); break;
            case '<': sb_adds(&rc->a, &b, "&lt;"); break;
            case '>': sb_adds(&rc->a, &b, "&gt;"); break;
            case '"': sb_adds(&rc->a, &b, "&#34;"); break;
            case '\'': sb_adds(&rc->a, &b, "&#39;"); break;
            default: sb_addc(&rc->a, &b, s.p[i]);
            }
        }
        return v_strbuf(&b);
    }
    if (IS("tojson")) {
        json_fmt jf = {.indent = -1, .item_sep = {", ", 2}, .key_sep = {": ", 2}};
        val *ind = arg(a, 0, "indent");
        if (ind && ind->t == V_INT) {
            jf.indent = ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : (int)ind->u.i;
            jf.item_sep = (str){",", 1};
        }
        val *sep = arg(a, 99, "separators");
        if (sep && sep->t == V_LIST && sep->u.l->n == 2 && sep->u.l->v[0].t == V_STR && sep->u.l->v[1].t == V_STR) {
            jf.item_sep = (str){sep->u.l->v[0].u.s.p, sep->u.l->v[0].u.s.n};
            jf.key_sep = (str){sep->u.l->v[1].u.s.p, sep->u.l->v[1].u.s.n};
        }
        val *sk = arg(a, 99, "sort_keys");
        jf.sort_keys = sk && truthy(*sk);
        if (x.t == V_UNDEF) rfail(rc, "Object of type Undefined is not JSON serializable");
        sbuf b = {0};
        sb_reserve(&rc->a, &b, 1);
        json_dump(rc, &b, x, &jf, 0);
        return v_strbuf(&b);
    }
    if (IS("string")) return x.t == V_STR ? x : (val){.t = V_STR, .u.s = {to_str(rc, x).p, to_str(rc, x).n}};
    if (IS("trim")) {
        if (x.t == V_UNDEF) return v_str("", 0);
        str s = to_str(rc, x);
        val *c = arg(a, 0, "chars");
        str chars = c && c->t == V_STR ? (str){c->u.s.p, c->u.s.n} : (str){0};
        str r = str_strip(s, c && c->t == V_STR ? &chars : NULL, 3);
        return v_str(r.p, r.n);
    }
    if (IS("length") || IS("count")) {
        switch (x.t) {
        case V_STR: return v_int((int64_t)u8_count(rc, x.u.s.p, x.u.s.n));
        case V_LIST: return v_int((int64_t)x.u.l->n);
        case V_DICT: return v_int((int64_t)x.u.d->n);
        case V_UNDEF: return v_int(0);
        default: rfail(rc, "object of type '%s' has no len()", type_name(x));
        }
    }
    if (IS("first") || IS("last")) {
        jlist *l = iter_list(rc, x);
        if (!l->n) return v_undef(IS("first") ? "first" : "last");
        return IS("first") ? l->v[0] : l->v[l->n - 1];
    }
    if (IS("list")) return to_list_val(rc, x);
    if (IS("join")) {
        jlist *l = iter_list(rc, x);
        val *sepv = arg(a, 0, "d");
        val *at = arg(a, 1, "attribute");
        str sep = sepv ? to_str(rc, *sepv) : (str){"", 0};
        sbuf b = {0};
        sb_reserve(&rc->a, &b, 1);
        b.p[0] = 0;
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_add(&rc->a, &b, sep.p, sep.n);
            val item = at && at->t == V_STR ? attr_path(rc, l->v[i], (str){at->u.s.p, at->u.s.n}) : l->v[i];
            str s = to_str(rc, item);
            sb_add(&rc->a, &b, s.p, s.n);
            if (b.n > rc->max_output) rfail(rc, "string too long");
        }
        return v_strbuf(&b);
    }
    if (IS("map")) {
        jlist *l = iter_list(rc, x);
        vbuild out = {0};
        val *at = arg(a, 99, "attribute");
        if (at) {
            if (at->t != V_STR) rfail(rc, "map(attribute=) expects a string");
            val *dflt = arg(a, 99, "default");
            for (size_t i = 0; i < l->n; i++) {
                val v = attr_path(rc, l->v[i], (str){at->u.s.p, at->u.s.n});
                vb_push(rc, &out, v.t == V_UNDEF && dflt ? *dflt : v);
            }
        } else {
            str fname = arg_str(rc, a, 0, NULL, "map");
            args rest = {.pos = a->npos > 1 ? a->pos + 1 : NULL, .npos = a->npos > 1 ? a->npos - 1 : 0};
            for (size_t i = 0; i < l->n; i++) vb_push(rc, &out, filter_named(rc, fname, l->v[i], &rest));
        }
        return vb_list(rc, &out);
    }
    if (IS("select")) return filter_select(rc, x, a, false, true);
    if (IS("reject")) return filter_select(rc, x, a, false, false);
    if (IS("selectattr")) return filter_select(rc, x, a, true, true);
    if (IS("rejectattr")) return filter_select(rc, x, a, true, false);
    if (IS("items")) {
        if (x.t == V_UNDEF) return v_list(list_new(rc, 0));
        if (x.t != V_DICT) rfail(rc, "items filter expects a mapping, got %s", type_name(x));
        args none = {0};
        return call_method(rc, x, (str){"items", 5}, &none);
    }
    if (IS("dictsort")) {
        if (x.t != V_DICT) rfail(rc, "dictsort expects a mapping");
        args none = {0};
        val it = call_method(rc, x, (str){"items", 5}, &none);
        val *rev = arg(a, 2, "reverse");
        jlist *l = it.u.l;
        val *keys = arena_alloc(&rc->a, (l->n + 1) * sizeof *keys), *tmp = arena_alloc(&rc->a, (l->n + 1) * sizeof *tmp),
            *ktmp = arena_alloc(&rc->a, (l->n + 1) * sizeof *ktmp);
        for (size_t i = 0; i < l->n; i++) keys[i] = l->v[i].u.l->v[0];
        merge_sort(rc, l->v, tmp, l->n, keys, ktmp, rev && truthy(*rev));
        return it;
    }
    if (IS("default") || IS("d")) {
        val *dv = arg(a, 0, "default_value");
        val *boolean = arg(a, 1, "boolean");
        bool use = boolean && truthy(*boolean) ? !truthy(x) : x.t == V_UNDEF;
        return use ? (dv ? *dv : v_str("", 0)) : x;
    }
    if (IS("indent")) {
        val *w = arg(a, 0, "width");
        val *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
        str pad;
        if (w && w->t == V_STR) pad = (str){w->u.s.p, w->u.s.n};
        else {
            int64_t n = w ? (w->t == V_INT ? w->u.i : 4) : 4;
            if (n < 0) n = 0;
            if (n > 256) n = 256;
            char *p = arena_alloc(&rc->a, (size_t)n + 1);
            memset(p, ' ', (size_t)n);
            pad = (str){p, (size_t)n};
        }
        return do_indent(rc, to_str(rc, x), pad, first && truthy(*first), blank && truthy(*blank));
    }
    if (IS("int")) {
        int64_t dflt = arg_int(rc, a, 0, "default", 0, "int");
        if (x.t == V_INT) return x;
        if (x.t == V_BOOL) return v_int(x.u.b);
        if (x.t == V_FLOAT) return isfinite(x.u.f) && fabs(x.u.f) < 9.2e18 ? v_int((int64_t)x.u.f) : v_int(dflt);
        if (x.t == V_STR) {
            char *s = arena_strdup(&rc->a, x.u.s.p, x.u.s.n), *end;
            long long v = strtoll(s, &end, 10);
            while (*end && ws_char(*end)) end++;
            if (end != s && !*end) return v_int(v);
            double d = strtod(s, &end);
            while (*end && ws_char(*end)) end++;
            if (end != s && !*end && isfinite(d) && fabs(d) < 9.2e18) return v_int((int64_t)d);
        }
        return v_int(dflt);
    }
    if (IS("float")) {
        if (is_num(x)) return v_float(num_f(x));
        if (x.t == V_STR) {
            char *s = arena_strdup(&rc->a, x.u.s.p, x.u.s.n), *end;
            double d = strtod(s, &end);
            if (end != s && !*end) return v_float(d);
        }
        val *dv = arg(a, 0, "default");
        return dv ? *dv : v_float(0);
    }
    if (IS("abs")) {
        if (x.t == V_FLOAT) return v_float(fabs(x.u.f));
        if (x.t == V_INT || x.t == V_BOOL) {
            if (num_i(x) == INT64_MIN) rfail(rc, "integer overflow");
            return v_int(num_i(x) < 0 ? -num_i(x) : num_i(x));
        }
        rfail(rc, "bad operand type for abs(): '%s'", type_name(x));
    }
    if (IS("round")) {
        if (!is_num(x)) rfail(rc, "round expects a number");
        int64_t prec = arg_int(rc, a, 0, "precision", 0, "round");
        if (prec < 0) prec = 0;
        if (prec > 15) prec = 15;
        double m = pow(10, (double)prec), v = num_f(x) * m;
        val *method = arg(a, 1, "method");
        str meth = method && method->t == V_STR ? (str){method->u.s.p, method->u.s.n} : (str){"common", 6};
        v = str_eq(meth, "floor") ? floor(v) : str_eq(meth, "ceil") ? ceil(v) : round(v);
        return v_float(v / m);
    }
    if (IS("lower")) return str_case(rc, to_str(rc, x), 0);
    if (IS("upper")) return str_case(rc, to_str(rc, x), 1);
    if (IS("title")) return str_case(rc, to_str(rc, x), 2);
    if (IS("capitalize")) return str_case(rc, to_str(rc, x), 3);
    if (IS("replace")) {
        str s = to_str(rc, x);
        str old = to_str(rc, a->npos > 0 ? a->pos[0] : v_str("", 0));
        str new = to_str(rc, a->npos > 1 ? a->pos[1] : v_str("", 0));
        return str_replace(rc, s, old, new, arg_int(rc, a, 2, "count", -1, "replace"));
    }
    if (IS("reverse")) {
        if (x.t == V_STR) {
            args none = {0};
            (void)none;
            return slice(rc, x, v_none(), v_none(), v_int(-1));
        }
        return slice(rc, to_list_val(rc, x), v_none(), v_none(), v_int(-1));
    }
    if (IS("sort")) {
        jlist *src = iter_list(rc, x);
        jlist *l = list_new(rc, src->n);
        if (src->n) memcpy(l->v, src->v, src->n * sizeof *l->v);
        val *rev = arg(a, 0, "reverse");
        val *at = arg(a, 2, "attribute");
        val *keys = NULL, *ktmp = NULL, *tmp = arena_alloc(&rc->a, (l->n + 1) * sizeof *tmp);
        if (at && at->t == V_STR) {
            keys = arena_alloc(&rc->a, (l->n + 1) * sizeof *keys);
            ktmp = arena_alloc(&rc->a, (l->n + 1) * sizeof *ktmp);
            for (size_t i = 0; i < l->n; i++) keys[i] = attr_path(rc, l->v[i], (str){at->u.s.p, at->u.s.n});
        }
        merge_sort(rc, l->v, tmp, l->n, keys, ktmp, rev && truthy(*rev));
        return v_list(l);
    }
    if (IS("unique")) {
        jlist *l = iter_list(rc, x);
        vbuild out = {0};
        for (size_t i = 0; i < l->n; i++) {
            bool seen = false;
            for (size_t k = 0; k < out.n && !seen; k++) seen = val_eq(rc, out.v[k], l->v[i]);
            if (!seen) vb_push(rc, &out, l->v[i]);
        }
        return vb_list(rc, &out);
    }
    if (IS("sum")) {
        jlist *l = iter_list(rc, x);
        val *at = arg(a, 0, "attribute");
        val *start = arg(a, 1, "start");
        val acc = start ? *start : v_int(0);
        for (size_t i = 0; i < l->n; i++)
            acc = arith(rc, OP_ADD, acc, at && at->t == V_STR ? attr_path(rc, l->v[i], (str){at->u.s.p, at->u.s.n}) : l->v[i]);
        return acc;
    }
    if (IS("min") || IS("max")) {
        jlist *l = iter_list(rc, x);
        if (!l->n) return v_undef(IS("min") ? "min" : "max");
        val best = l->v[0];
        for (size_t i = 1; i < l->n; i++) {
            int c = val_cmp(rc, l->v[i], best, "<");
            if (IS("min") ? c < 0 : c > 0) best = l->v[i];
        }
        return best;
    }
    if (IS("wordcount")) {
        args none = {0};
        (void)none;
        return v_int((int64_t)str_split(rc, to_str(rc, x), NULL, -1).u.l->n);
    }
    if (IS("center")) {
        str s = to_str(rc, x);
        int64_t w = arg_int(rc, a, 0, "width", 80, "center");
        size_t len = u8_count(rc, s.p, s.n);
        if (w > 4096) w = 4096;
        if ((int64_t)len >= w) return x.t == V_STR ? x : v_str(s.p, s.n);
        size_t total = (size_t)w - len, left = total / 2 + (total & (size_t)w & 1);
        sbuf b = {0};
        for (size_t i = 0; i < left; i++) sb_addc(&rc->a, &b, ' ');
        sb_add(&rc->a, &b, s.p, s.n);
        for (size_t i = left; i < total; i++) sb_addc(&rc->a, &b, ' ');
        return v_strbuf(&b);
    }
    if (IS("batch") || IS("slice")) rfail(rc, "filter '%.*s' is not supported", (int)name.n, name.p);
    rfail(rc, "no filter named '%.*s'", (int)(name.n > 60 ? 60 : name.n), name.p);
    return x;
#undef IS
}

/* ---- tests ------------------------------------------------------------------------------- */

static bool apply_test(rctx *rc, str name, val x, args *a)
{
#define IS(s) str_eq(name, s)
    val *o = arg(a, 0, NULL);
    if (IS("defined")) return x.t != V_UNDEF;
    if (IS("undefined")) return x.t == V_UNDEF;
    if (IS("none")) return x.t == V_NONE;
    if (IS("string")) return x.t == V_STR;
    if (IS("mapping")) return x.t == V_DICT && !x.u.d->ns;
    if (IS("sequence")) return x.t == V_STR || x.t == V_LIST || (x.t == V_DICT && !x.u.d->ns);
    if (IS("iterable")) return x.t == V_STR || x.t == V_LIST || x.t == V_DICT || x.t == V_UNDEF;
    if (IS("number")) return is_num(x);
    if (IS("integer")) return x.t == V_INT;
    if (IS("float")) return x.t == V_FLOAT;
    if (IS("boolean")) return x.t == V_BOOL;
    if (IS("true")) return x.t == V_BOOL && x.u.b;
    if (IS("false")) return x.t == V_BOOL && !x.u.b;
    if (IS("callable")) return x.t == V_MACRO || x.t == V_FUNC;
    if (IS("lower") || IS("upper")) {
        if (x.t != V_STR) return false;
        bool any = false;
        for (size_t i = 0; i < x.u.s.n; i++) {
            unsigned char c = (unsigned char)x.u.s.p[i];
            if (isalpha(c)) {
                any = true;
                if (IS("lower") ? isupper(c) : islower(c)) return false;
            }
        }
        return any;
    }
    if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (x.t != V_INT && x.t != V_BOOL) rfail(rc, "test '%.*s' expects an integer", (int)name.n, name.p);
        int64_t v = num_i(x);
        if (IS("divisibleby")) {
            int64_t d = arg_int(rc, a, 0, "num", 1, "divisibleby");
            if (d == 0) rfail(rc, "integer division or modulo by zero");
            return d == -1 || v % d == 0;
        }
        return (v % 2 != 0) == IS("odd");
    }
    if (!o) rfail(rc, "test '%.*s' needs an argument or does not exist", (int)(name.n > 60 ? 60 : name.n), name.p);
    if (IS("eq") || IS("equalto") || IS("==")) return val_eq(rc, x, *o);
    if (IS("ne") || IS("!=")) return !val_eq(rc, x, *o);
    if (IS("lt") || IS("lessthan")) return val_cmp(rc, x, *o, "<") < 0;
    if (IS("gt") || IS("greaterthan")) return val_cmp(rc, x, *o, ">") > 0;
    if (IS("le")) return val_cmp(rc, x, *o, "<=") <= 0;
    if (IS("ge")) return val_cmp(rc, x, *o, ">=") >= 0;
    if (IS("in")) return contains(rc, *o, x);
    if (IS("sameas")) {
        if (x.t != o->t) return false;
        if (x.t == V_LIST) return x.u.l == o->u.l;
        if (x.t == V_DICT) return x.u.d == o->u.d;
        return val_eq(rc, x, *o);
    }
    rfail(rc, "no test named '%.*s'", (int)(name.n > 60 ? 60 : name.n), name.p);
    return false;
#undef IS
}

/* ---- methods ----------------------------------------------------------------------------- */

static bool affix_match(rctx *rc, str s, val pat, bool start)
{
    if (pat.t == V_LIST) {
        for (size_t i = 0; i < pat.u.l->n; i++)
            if (affix_match(rc, s, pat.u.l->v[i], start)) return true;
        return false;
    }
    if (pat.t != V_STR) rfail(rc, "%s arg must be str or a tuple of str, not %s", start ? "startswith" : "endswith", type_name(pat));
    if (pat.u.s.n > s.n) return false;
    return memcmp(start ? s.p : s.p + s.n - pat.u.s.n, pat.u.s.p, pat.u.s.n) == 0;
}

/* str.format with {} / {0} / {name} fields (no format specs). */
static val str_format(rctx *rc, str s, args *a)
{
    sbuf b = {0};
    sb_reserve(&rc->a, &b, 1);
    b.p[0] = 0;
    size_t auto_i = 0;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.p[i];
        if ((c == '{' || c == '}') && i + 1 < s.n && s.p[i + 1] == c) {
            sb_addc(&rc->a, &b, c);
            i++;
            continue;
        }
        if (c != '{') {
            sb_addc(&rc->a, &b, c);
            continue;
        }
        const char *close = memchr(s.p + i, '}', s.n - i);
        if (!close) rfail(rc, "Single '{' encountered in format string");
        str field = {s.p + i + 1, (size_t)(close - s.p) - i - 1};
        val *v = NULL;
        if (field.n == 0) v = arg(a, auto_i++, NULL);
        else if (isdigit((unsigned char)field.p[0])) v = arg(a, (size_t)strtoul(arena_strdup(&rc->a, field.p, field.n), NULL, 10), NULL);
        else for (size_t k = 0; k < a->nkw; k++) if (a->kw[k].n == field.n && memcmp(a->kw[k].p, field.p, field.n) == 0) v = &a->kwv[k];
        if (!v) rfail(rc, "format: no value for field {%.*s}", (int)(field.n > 40 ? 40 : field.n), field.p);
        str t = to_str(rc, *v);
        sb_add(&rc->a, &b, t.p, t.n);
        i = (size_t)(close - s.p);
    }
    return v_strbuf(&b);
}

static val call_method(rctx *rc, val obj, str name, args *a)
{
#define IS(s) str_eq(name, s)
    if (obj.t == V_STR) {
        str s = {obj.u.s.p, obj.u.s.n};
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            val *c = arg(a, 0, NULL);
            str chars = c && c->t == V_STR ? (str){c->u.s.p, c->u.s.n} : (str){0};
            work(rc, s.n);
            str r = str_strip(s, c && c->t == V_STR ? &chars : NULL, IS("strip") ? 3 : IS("lstrip") ? 1 : 2);
            return v_str(r.p, r.n);
        }
        if (IS("split")) {
            val *sep = arg(a, 0, "sep");
            str sp = sep && sep->t == V_STR ? (str){sep->u.s.p, sep->u.s.n} : (str){0};
            return str_split(rc, s, sep && sep->t == V_STR ? &sp : NULL, arg_int(rc, a, 1, "maxsplit", -1, "split"));
        }
        if (IS("startswith") || IS("endswith")) {
            val *p = arg(a, 0, NULL);
            if (!p) rfail(rc, "%.*s takes one argument", (int)name.n, name.p);
            return v_bool(affix_match(rc, s, *p, IS("startswith")));
        }
        if (IS("replace")) {
            str old = arg_str(rc, a, 0, NULL, "replace"), new = arg_str(rc, a, 1, NULL, "replace");
            return str_replace(rc, s, old, new, arg_int(rc, a, 2, "count", -1, "replace"));
        }
        if (IS("lower")) return str_case(rc, s, 0);
        if (IS("upper")) return str_case(rc, s, 1);
        if (IS("title")) return str_case(rc, s, 2);
        if (IS("capitalize")) return str_case(rc, s, 3);
        if (IS("find") || IS("count") || IS("rfind") || IS("index")) {
            str sub = arg_str(rc, a, 0, NULL, "find");
            /* rfind compares at every position (memmem is linear) */
            work(rc, IS("rfind") ? s.n * (1 + sub.n / 64) : s.n);
            if (IS("count")) {
                if (!sub.n) return v_int((int64_t)u8_count(rc, s.p, s.n) + 1);
                int64_t c = 0;
                for (const char *p = s.p; (p = memmem(p, s.n - (size_t)(p - s.p), sub.p, sub.n)); p += sub.n) c++;
                return v_int(c);
            }
            const char *hit = NULL;
            if (IS("rfind")) {
                for (size_t i = s.n + 1; i-- > 0;)
                    if (s.n - i >= sub.n && memcmp(s.p + i, sub.p, sub.n) == 0) { hit = s.p + i; break; }
            } else {
                hit = sub.n ? memmem(s.p, s.n, sub.p, sub.n) : s.p;
            }
            if (!hit && IS("index")) rfail(rc, "substring not found");
            return v_int(hit ? (int64_t)u8_count(rc, s.p, (size_t)(hit - s.p)) : -1);
        }
        if (IS("join")) {
            args j = {.pos = (val[]){obj}, .npos = 1};
            if (!a->npos) rfail(rc, "join takes one argument");
            return filter_named(rc, (str){"join", 4}, a->pos[0], &j);
        }
        if (IS("format")) return str_format(rc, s, a);
        if (IS("splitlines")) {
            str nl = {"\n", 1};
            if (!s.n) return v_list(list_new(rc, 0));
            str body = s.p[s.n - 1] == '\n' ? (str){s.p, s.n - 1} : s;
            return str_split(rc, body, &nl, -1);
        }
        if (IS("isdigit") || IS("isalpha") || IS("isspace") || IS("isalnum") || IS("islower") || IS("isupper")) {
            if (IS("islower") || IS("isupper")) return v_bool(apply_test(rc, (str){name.p + 2, name.n - 2}, obj, a));
            if (!s.n) return v_bool(false);
            for (size_t i = 0; i < s.n; i++) {
                unsigned char c = (unsigned char)s.p[i];
                bool ok = IS("isdigit") ? isdigit(c) : IS("isalpha") ? isalpha(c) : IS("isspace") ? ws_char((char)c) : isalnum(c);
                if (!ok) return v_bool(false);
            }
            return v_bool(true);
        }
        if (IS("removeprefix") || IS("removesuffix")) {
            str p = arg_str(rc, a, 0, NULL, "removeprefix");
            bool pre = IS("removeprefix");
            if (p.n <= s.n && memcmp(pre ? s.p : s.p + s.n - p.n, p.p, p.n) == 0)
                return pre ? v_str(s.p + p.n, s.n - p.n) : v_str(s.p, s.n - p.n);
            return obj;
        }
    } else if (obj.t == V_DICT && !obj.u.d->ns) {
        jdict *d = obj.u.d;
        if (IS("get")) {
            val *k = arg(a, 0, NULL), *dflt = arg(a, 1, NULL);
            if (!k) rfail(rc, "get expected at least 1 argument");
            val *v = k->t == V_STR ? dict_find(rc, d, k->u.s.p, k->u.s.n) : NULL;
            return v ? *v : dflt ? *dflt : v_none();
        }
        if (IS("items") || IS("keys") || IS("values")) {
            jlist *l = list_new(rc, d->n);
            for (size_t i = 0; i < d->n; i++) {
                val k = v_str(d->e[i].k, d->e[i].kn);
                if (IS("keys")) l->v[i] = k;
                else if (IS("values")) l->v[i] = d->e[i].v;
                else {
                    jlist *pair = list_new(rc, 2);
                    pair->tuple = true;
                    pair->v[0] = k;
                    pair->v[1] = d->e[i].v;
                    l->v[i] = v_list(pair);
                }
            }
            return v_list(l);
        }
    }
    if (obj.t == V_LIST && (IS("append") || IS("pop") || IS("insert") || IS("extend") || IS("remove")))
        rfail(rc, "access to attribute '%.*s' of 'list' object is unsafe", (int)name.n, name.p);
    if (obj.t == V_DICT && (IS("update") || IS("pop") || IS("setdefault") || IS("clear")))
        rfail(rc, "access to attribute '%.*s' of 'dict' object is unsafe", (int)name.n, name.p);
    if (obj.t == V_DICT) { /* a key holding a macro */
        val *v = dict_find(rc, obj.u.d, name.p, name.n);
        if (v && v->t == V_MACRO) return call_macro(rc, *v, a, NULL, NULL, NULL);
    }
    rfail(rc, "'%s' object has no attribute '%.*s'", type_name(obj), (int)(name.n > 60 ? 60 : name.n), name.p);
    return v_none();
#undef IS
}

/* ================================================================================ JSON in */

typedef struct jparse {
    rctx *rc;
    const char *s;
    size_t n, i;
    int depth;
    bool trusted; /* inside the value of one of opts->trusted: not the request's */
} jparse;

/* Marks the protected texts of a string from the request's data (see "provenance"). */
static void jp_protect(jparse *jp, str s)
{
    const jinja_opts *o = jp->rc->opts;
    if (!o->protect_at || jp->trusted) return;
    work(jp->rc, s.n);
    for (size_t i = 0; i < s.n;) {
        size_t len = o->protect_at(o->protect_ctx, s.p + i, s.n - i);
        if (len == 0 || len > s.n - i) {
            i++;
            continue;
        }
        marks_add(&jp->rc->a, s.p + i, len);
        i += len;
    }
}

static bool jp_trusted(const jparse *jp, str key)
{
    for (const char *const *t = jp->rc->opts->trusted; jp->depth == 1 && t && *t; t++)
        if (str_eq(key, *t)) return true;
    return false;
}

static void jp_fail(jparse *jp, const char *what)
{
    snprintf(jp->rc->err, jp->rc->errlen, "template context: %s at byte %zu", what, jp->i);
    longjmp(*jp->rc->fail, 1);
}

static void jp_ws(jparse *jp)
{
    while (jp->i < jp->n && (jp->s[jp->i] == ' ' || jp->s[jp->i] == '\t' || jp->s[jp->i] == '\n' || jp->s[jp->i] == '\r')) jp->i++;
}

static unsigned jp_hex4(jparse *jp)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = jp->i < jp->n ? hexval(jp->s[jp->i]) : -1;
        if (h < 0) jp_fail(jp, "bad \\u escape");
        v = v * 16 + (unsigned)h;
        jp->i++;
    }
    return v;
}

static str jp_string(jparse *jp)
{
    arena *a = &jp->rc->a;
    sbuf b = {0};
    sb_reserve(a, &b, 1);
    b.p[0] = 0;
    jp->i++; /* " */
    for (;;) {
        if (jp->i >= jp->n) jp_fail(jp, "unterminated string");
        char c = jp->s[jp->i++];
        if (c == '"') break;
        if ((unsigned char)c < 0x20) jp_fail(jp, "control character in a string");
        if (c != '\\') {
            sb_addc(a, &b, c);
            continue;
        }
        if (jp->i >= jp->n) jp_fail(jp, "unterminated string");
        char e = jp->s[jp->i++];
        switch (e) {
        case '"': case '\\': case '/': sb_addc(a, &b, e); break;
        case 'n': sb_addc(a, &b, '\n'); break;
        case 't': sb_addc(a, &b, '\t'); break;
        case 'r': sb_addc(a, &b, '\r'); break;
        case 'b': sb_addc(a, &b, '\b'); break;
        case 'f': sb_addc(a, &b, '\f'); break;
        case 'u': {
            unsigned cp = jp_hex4(jp);
            if (cp >= 0xD800 && cp < 0xDC00 && jp->i + 1 < jp->n && jp->s[jp->i] == '\\' && jp->s[jp->i + 1] == 'u') {
                size_t save = jp->i;
                jp->i += 2;
                unsigned lo = jp_hex4(jp);
                if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else jp->i = save;
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* a lone surrogate */
            utf8_put(a, &b, cp);
            break;
        }
        default: jp_fail(jp, "bad escape");
        }
    }
    return (str){b.p, b.n};
}

static val jp_value(jparse *jp)
{
    jp_ws(jp);
    if (jp->i >= jp->n) jp_fail(jp, "unexpected end");
    if (++jp->depth > 256) jp_fail(jp, "nested too deeply");
    step(jp->rc);
    char c = jp->s[jp->i];
    val r;
    if (c == '{') {
        jp->i++;
        jdict *d = dict_new(jp->rc);
        jp_ws(jp);
        if (jp->i < jp->n && jp->s[jp->i] == '}') jp->i++;
        else for (;;) {
            jp_ws(jp);
            if (jp->i >= jp->n || jp->s[jp->i] != '"') jp_fail(jp, "expected a key");
            str k = jp_string(jp);
            jp_ws(jp);
            if (jp->i >= jp->n || jp->s[jp->i] != ':') jp_fail(jp, "expected ':'");
            jp->i++;
            bool was = jp->trusted;
            jp->trusted = was || jp_trusted(jp, k);
            if (!jp->trusted) jp_protect(jp, k);
            dict_set(jp->rc, d, k.p, k.n, jp_value(jp));
            jp->trusted = was;
            jp_ws(jp);
            if (jp->i < jp->n && jp->s[jp->i] == ',') { jp->i++; continue; }
            if (jp->i < jp->n && jp->s[jp->i] == '}') { jp->i++; break; }
            jp_fail(jp, "expected ',' or '}'");
        }
        r = (val){.t = V_DICT, .u.d = d};
    } else if (c == '[') {
        jp->i++;
        vbuild b = {0};
        jp_ws(jp);
        if (jp->i < jp->n && jp->s[jp->i] == ']') jp->i++;
        else for (;;) {
            vb_push(jp->rc, &b, jp_value(jp));
            jp_ws(jp);
            if (jp->i < jp->n && jp->s[jp->i] == ',') { jp->i++; continue; }
            if (jp->i < jp->n && jp->s[jp->i] == ']') { jp->i++; break; }
            jp_fail(jp, "expected ',' or ']'");
        }
        r = vb_list(jp->rc, &b);
    } else if (c == '"') {
        str s = jp_string(jp);
        jp_protect(jp, s);
        r = v_str(s.p, s.n);
    } else if (jp->n - jp->i >= 4 && memcmp(jp->s + jp->i, "true", 4) == 0) {
        jp->i += 4;
        r = v_bool(true);
    } else if (jp->n - jp->i >= 5 && memcmp(jp->s + jp->i, "false", 5) == 0) {
        jp->i += 5;
        r = v_bool(false);
    } else if (jp->n - jp->i >= 4 && memcmp(jp->s + jp->i, "null", 4) == 0) {
        jp->i += 4;
        r = v_none();
    } else if (c == '-' || isdigit((unsigned char)c)) {
        size_t st = jp->i;
        bool fl = false;
        if (jp->s[jp->i] == '-') jp->i++;
        while (jp->i < jp->n && (isdigit((unsigned char)jp->s[jp->i]) || strchr(".eE+-", jp->s[jp->i]))) {
            fl = fl || strchr(".eE", jp->s[jp->i]);
            jp->i++;
        }
        char *num = arena_strdup(&jp->rc->a, jp->s + st, jp->i - st), *end;
        if (!fl) {
            errno = 0;
            long long v = strtoll(num, &end, 10);
            if (*end || end == num) jp_fail(jp, "bad number");
            r = errno == ERANGE ? v_float(strtod(num, NULL)) : v_int(v);
        } else {
            double d = strtod(num, &end);
            if (*end || end == num) jp_fail(jp, "bad number");
            r = v_float(d);
        }
    } else {
        jp_fail(jp, "unexpected character");
        r = v_none();
    }
    jp->depth--;
    return r;
}

/* ================================================================================ entry */

static int span_cmp(const void *x, const void *y)
{
    const jinja_span *a = x, *b = y;
    return (a->off > b->off) - (a->off < b->off);
}

/* The marks inside the output as sorted, merged spans (malloc'd; NULL when none). */
static jinja_span *output_spans(const rctx *rc, const sbuf *out, size_t *n_spans)
{
    *n_spans = 0;
    size_t k = 0;
    for (size_t i = 0; i < rc->marks.n; i++) k += rc->marks.v[i].p >= out->p && rc->marks.v[i].p < out->p + out->n;
    jinja_span *s = k ? malloc(k * sizeof *s) : NULL;
    if (!s) return NULL;
    k = 0;
    for (size_t i = 0; i < rc->marks.n; i++) {
        const mark *m = &rc->marks.v[i];
        if (m->p < out->p || m->p >= out->p + out->n) continue;
        size_t off = (size_t)(m->p - out->p);
        s[k++] = (jinja_span){off, m->n < out->n - off ? m->n : out->n - off};
    }
    qsort(s, k, sizeof *s, span_cmp);
    size_t w = 0;
    for (size_t i = 0; i < k; i++) {
        if (w && s[i].off <= s[w - 1].off + s[w - 1].len) {
            size_t end = s[i].off + s[i].len;
            if (end > s[w - 1].off + s[w - 1].len) s[w - 1].len = end - s[w - 1].off;
        } else {
            s[w++] = s[i];
        }
    }
    *n_spans = w;
    return s;
}

typedef struct render_job {
    const jinja_tmpl *t;
    const char *ctx;
    size_t ctx_len;
    rctx *rc;
    jinja_result *res;
} render_job;

static void render_run(render_job *j)
{
    rctx *rc = j->rc;
    frame *globals = frame_new(rc, NULL);
    static const struct {
        const char *name;
        gfunc fn;
    } fns[] = {
        {"range", F_RANGE}, {"namespace", F_NAMESPACE}, {"raise_exception", F_RAISE},
        {"strftime_now", F_STRFTIME}, {"dict", F_DICT},
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        frame_set(rc, globals, (str){fns[i].name, strlen(fns[i].name)}, (val){.t = V_FUNC, .u.fn = fns[i].fn});
    jparse jp = {.rc = rc, .s = j->ctx ? j->ctx : "{}", .n = j->ctx ? j->ctx_len : 2};
    val ctx = jp_value(&jp);
    jp_ws(&jp);
    if (ctx.t != V_DICT || jp.i != jp.n) jp_fail(&jp, "not one JSON object");
    frame *vars = frame_new(rc, globals);
    for (size_t i = 0; i < ctx.u.d->n; i++)
        frame_set(rc, vars, (str){ctx.u.d->e[i].k, ctx.u.d->e[i].kn}, ctx.u.d->e[i].v);
    frame *top = frame_new(rc, vars);
    sbuf out = {0};
    sb_reserve(&rc->a, &out, 1);
    out.p[0] = 0;
    rc->out = &out;
    exec(rc, j->t->root, top);
    jinja_result *r = j->res;
    r->protected_at = output_spans(rc, &out, &r->n_protected);
    r->text = malloc(out.n + 1);
    if (!r->text || (r->n_protected && !r->protected_at)) {
        free(r->text);
        free(r->protected_at);
        *r = (jinja_result){0};
        snprintf(rc->err, rc->errlen, "out of memory");
        return;
    }
    memcpy(r->text, out.p, out.n + 1);
    r->len = out.n;
}

static void render_guarded(render_job *j)
{
    jmp_buf fail;
    render_job *volatile vj = j;
    vj->rc->fail = &fail;
    vj->rc->a.fail = &fail;
    if (setjmp(fail)) return;
    render_run(vj);
}

int jinja_render(const jinja_tmpl *t, const char *ctx_json, size_t ctx_len, const jinja_opts *opts,
                 jinja_result *res, char *err, size_t errlen)
{
    char dummy[1];
    if (!err || !errlen) err = dummy, errlen = sizeof dummy;
    err[0] = 0;
    *res = (jinja_result){0};
    if (!t) {
        snprintf(err, errlen, "no template");
        return -1;
    }
    jinja_opts o = opts ? *opts : (jinja_opts){0};
    rctx *rc = calloc(1, sizeof *rc);
    if (!rc) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    rc->a = (arena){.limit = o.max_memory ? o.max_memory : 64u << 20, .err = err, .errlen = errlen};
    rc->err = err;
    rc->errlen = errlen;
    rc->max_output = o.max_output ? o.max_output : 8u << 20;
    rc->max_steps = o.max_steps ? o.max_steps : 10000000u;
    rc->max_depth = o.max_depth > 0 ? o.max_depth : 200;
    clock_gettime(CLOCK_MONOTONIC, &rc->deadline);
    unsigned max_ms = o.max_ms ? o.max_ms : 2000;
    rc->deadline.tv_sec += max_ms / 1000;
    rc->deadline.tv_nsec += (long)(max_ms % 1000) * 1000000L;
    if (rc->deadline.tv_nsec >= 1000000000L) rc->deadline.tv_sec++, rc->deadline.tv_nsec -= 1000000000L;
    rc->next_clock = 4096;
    rc->now = o.now;
    rc->opts = &o;
    rc->marks.steps = &rc->steps;
    if (o.protect_at) rc->a.marks = &rc->marks;
    render_job j = {.t = t, .ctx = ctx_json, .ctx_len = ctx_len, .rc = rc, .res = res};
    render_guarded(&j);
    arena_free(&rc->a);
    free(rc->marks.v);
    free(rc);
    return res->text ? 0 : -1;
}

char *jinja_render_json(const jinja_tmpl *t, const char *ctx_json, size_t ctx_len,
                        const jinja_opts *opts, size_t *out_len, char *err, size_t errlen)
{
    jinja_opts o = opts ? *opts : (jinja_opts){0};
    o.protect_at = NULL;
    jinja_result r;
    if (out_len) *out_len = 0;
    if (jinja_render(t, ctx_json, ctx_len, &o, &r, err, errlen) != 0) return NULL;
    if (out_len) *out_len = r.len;
    return r.text;
}
