/* gbnf.c - GBNF text -> the byte-level rules of grammar_impl.h.
 *
 * Groups, repetitions and character classes become anonymous rules, so every repeated or
 * optional thing is one REF or REP element.  Unbounded repetition uses right recursion
 * (`r ::= x r | `), which the matcher runs without growing its stack (a REF that ends an
 * alternative is a tail call); bounded repetition x{m,n} (n >= 2) is one REP element, not n
 * copies, so that its positions, and the token tables built for them, do not multiply.
 * Character classes over code points become alternatives of UTF-8 byte-set sequences that
 * accept exactly the encodings of the class (no overlongs, no surrogates). */
#include "grammar_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct vec_elem {
    gelem *v;
    int n, cap;
} vec_elem;

typedef struct rule_def {
    char *name; /* NULL: anonymous */
    size_t name_len;
    vec_elem body;
    bool defined;
} rule_def;

typedef struct parser {
    const char *s, *end;
    rule_def *rules;
    int n_rules, cap_rules;
    gbyteset *sets;
    int n_sets, cap_sets;
    int total_elems;
    int depth;
    char *err;
    size_t errlen;
    bool failed;
} parser;

#define MAX_NESTING 200

static void fail(parser *p, const char *fmt, const char *what)
{
    if (p->failed) return;
    p->failed = true;
    char msg[160];
    snprintf(msg, sizeof msg, fmt, what ? what : "");
    size_t len = (size_t)(p->end - p->s);
    snprintf(p->err, p->errlen, "grammar: %s%s", msg, len ? "" : " (at the end)");
}

static bool push_elem(parser *p, vec_elem *v, gelem e)
{
    if (p->failed) return false;
    if (++p->total_elems > GRAMMAR_MAX_ELEMS) {
        fail(p, "more than %s elements", "200000");
        return false;
    }
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        gelem *n = realloc(v->v, (size_t)cap * sizeof *n);
        if (!n) {
            fail(p, "out of memory%s", NULL);
            return false;
        }
        v->v = n;
        v->cap = cap;
    }
    v->v[v->n++] = e;
    return true;
}

static bool push(parser *p, vec_elem *v, uint8_t type, int32_t val)
{
    return push_elem(p, v, (gelem){.type = type, .v = val});
}

static int new_rule(parser *p, const char *name, size_t len)
{
    if (p->failed) return -1;
    if (p->n_rules >= GRAMMAR_MAX_RULES) {
        fail(p, "more than %s rules", "20000");
        return -1;
    }
    if (p->n_rules == p->cap_rules) {
        int cap = p->cap_rules ? p->cap_rules * 2 : 16;
        rule_def *n = realloc(p->rules, (size_t)cap * sizeof *n);
        if (!n) {
            fail(p, "out of memory%s", NULL);
            return -1;
        }
        p->rules = n;
        p->cap_rules = cap;
    }
    rule_def *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = malloc(len + 1);
        if (!r->name) {
            fail(p, "out of memory%s", NULL);
            return -1;
        }
        memcpy(r->name, name, len);
        r->name[len] = 0;
        r->name_len = len;
    } else {
        r->defined = true;
    }
    return p->n_rules++;
}

static int rule_id(parser *p, const char *name, size_t len)
{
    for (int i = 0; i < p->n_rules; i++)
        if (p->rules[i].name && p->rules[i].name_len == len && !memcmp(p->rules[i].name, name, len)) return i;
    return new_rule(p, name, len);
}

static int add_set(parser *p, const gbyteset *s)
{
    for (int i = 0; i < p->n_sets; i++) /* few distinct sets: literals reuse theirs */
        if (!memcmp(&p->sets[i], s, sizeof *s)) return i;
    if (p->n_sets == p->cap_sets) {
        int cap = p->cap_sets ? p->cap_sets * 2 : 64;
        gbyteset *n = realloc(p->sets, (size_t)cap * sizeof *n);
        if (!n) {
            fail(p, "out of memory%s", NULL);
            return -1;
        }
        p->sets = n;
        p->cap_sets = cap;
    }
    p->sets[p->n_sets] = *s;
    return p->n_sets++;
}

static bool push_byte_range(parser *p, vec_elem *v, unsigned lo, unsigned hi)
{
    gbyteset s = {{0}};
    for (unsigned b = lo; b <= hi; b++) s.w[b >> 5] |= 1u << (b & 31);
    int id = add_set(p, &s);
    return id >= 0 && push(p, v, GE_BYTES, id);
}

static int utf8_encode(uint32_t c, unsigned char *o)
{
    if (c < 0x80) { o[0] = (unsigned char)c; return 1; }
    if (c < 0x800) { o[0] = (unsigned char)(0xC0 | (c >> 6)); o[1] = (unsigned char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (c >> 12));
        o[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (c >> 18));
    o[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (c & 0x3F));
    return 4;
}

/* ---- code-point ranges -> UTF-8 byte-range sequences --------------------------------------- */

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

/* Splits [lo, hi] (no surrogates inside) until each piece's encodings are one byte-range per
 * position, then adds each piece as one alternative of rule r. */
static void emit_utf8_range(parser *p, vec_elem *body, uint32_t lo, uint32_t hi, bool *first)
{
    static const uint32_t max_len[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int k = 0; k < 3; k++) /* split at encoding-length boundaries */
        if (lo <= max_len[k] && hi > max_len[k]) {
            emit_utf8_range(p, body, lo, max_len[k], first);
            emit_utf8_range(p, body, max_len[k] + 1, hi, first);
            return;
        }
    unsigned char a[4], b[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    /* Each continuation byte carries 6 bits: a range is one sequence of byte ranges when, at
     * every level, it covers whole blocks below the first position where lo and hi differ. */
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * (n - i))) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                emit_utf8_range(p, body, lo, (lo | m), first);
                emit_utf8_range(p, body, (lo | m) + 1, hi, first);
                return;
            }
            if ((hi & m) != m) {
                emit_utf8_range(p, body, lo, (hi & ~m) - 1, first);
                emit_utf8_range(p, body, hi & ~m, hi, first);
                return;
            }
        }
    }
    if (!*first) push(p, body, GE_ALT, 0);
    *first = false;
    for (int i = 0; i < n; i++) push_byte_range(p, body, a[i], b[i]);
}

static int cmp_range(const void *x, const void *y)
{
    const cprange *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* A class as a rule: single-byte code points share one byte set; the rest by UTF-8 length. */
static int class_rule(parser *p, cprange *r, int n, bool negate)
{
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    cprange pos[260];
    int np = 0;
    if (negate) {
        uint32_t next = 0;
        for (int i = 0; i < m && np < 258; i++) {
            if (r[i].lo > next) pos[np++] = (cprange){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= 0x10FFFF) pos[np++] = (cprange){next, 0x10FFFF};
    } else {
        for (int i = 0; i < m && np < 258; i++) pos[np++] = r[i];
    }
    int id = new_rule(p, NULL, 0);
    if (id < 0) return -1;
    vec_elem body = {0};
    bool first = true;
    gbyteset ascii = {{0}};
    bool any_ascii = false;
    for (int i = 0; i < np; i++) {
        for (uint32_t c = pos[i].lo; c <= pos[i].hi && c < 0x80; c++) {
            ascii.w[c >> 5] |= 1u << (c & 31);
            any_ascii = true;
        }
    }
    if (any_ascii) {
        int s = add_set(p, &ascii);
        if (s >= 0) push(p, &body, GE_BYTES, s);
        first = false;
    }
    for (int i = 0; i < np && !p->failed; i++) {
        uint32_t lo = pos[i].lo < 0x80 ? 0x80 : pos[i].lo, hi = pos[i].hi;
        if (lo > hi) continue;
        /* surrogates have no UTF-8 encoding */
        if (lo < 0xD800 && hi >= 0xD800) {
            if (hi > 0xDFFF) emit_utf8_range(p, &body, 0xE000, hi, &first);
            hi = 0xD7FF;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            lo = 0xE000;
            if (lo > hi) continue;
        }
        emit_utf8_range(p, &body, lo, hi, &first);
    }
    if (first) { /* an empty class never matches: a set with no byte */
        gbyteset none = {{0}};
        int s = add_set(p, &none);
        if (s >= 0) push(p, &body, GE_BYTES, s);
    }
    push(p, &body, GE_END, 0);
    p->rules[id].body = body;
    return p->failed ? -1 : id;
}

/* ---- the text ---------------------------------------------------------------------------- */

static void skip_space(parser *p)
{
    while (p->s < p->end) {
        char c = *p->s;
        if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->s++;
        } else {
            break;
        }
    }
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static size_t name_len_at(const parser *p, const char *s)
{
    const char *e = s;
    while (e < p->end && is_name_char(*e)) e++;
    return (size_t)(e - s);
}

/* At `name ::=`: the start of the next rule, which ends the current one. */
static bool at_rule_start(const parser *p)
{
    size_t n = name_len_at(p, p->s);
    if (!n) return false;
    const char *e = p->s + n;
    while (e < p->end && (*e == ' ' || *e == '\t')) e++;
    return p->end - e >= 3 && !memcmp(e, "::=", 3);
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (escapes decoded, UTF-8 read). */
static bool read_char(parser *p, uint32_t *out)
{
    if (p->s >= p->end) {
        fail(p, "unterminated literal or class%s", NULL);
        return false;
    }
    unsigned char c = (unsigned char)*p->s++;
    if (c == '\\') {
        if (p->s >= p->end) {
            fail(p, "dangling escape%s", NULL);
            return false;
        }
        char e = *p->s++;
        int digits = 0;
        switch (e) {
        case 'n': *out = '\n'; return true;
        case 't': *out = '\t'; return true;
        case 'r': *out = '\r'; return true;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *out = (unsigned char)e; return true;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: {
            char what[2] = {e, 0};
            fail(p, "unknown escape \\%s", what);
            return false;
        }
        }
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = p->s < p->end ? hex_val(*p->s) : -1;
            if (h < 0) {
                fail(p, "bad hex escape%s", NULL);
                return false;
            }
            v = v * 16 + (uint32_t)h;
            p->s++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
            fail(p, "escape is not a Unicode scalar value%s", NULL);
            return false;
        }
        *out = v;
        return true;
    }
    if (c < 0x80) {
        *out = c;
        return true;
    }
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    uint32_t v = c & (n == 3 ? 0x07 : n == 2 ? 0x0F : 0x1F);
    if (n < 0 || p->end - p->s < n) {
        fail(p, "invalid UTF-8 in the grammar%s", NULL);
        return false;
    }
    for (int i = 0; i < n; i++) {
        unsigned char d = (unsigned char)*p->s++;
        if ((d & 0xC0) != 0x80) {
            fail(p, "invalid UTF-8 in the grammar%s", NULL);
            return false;
        }
        v = (v << 6) | (d & 0x3F);
    }
    *out = v;
    return true;
}

static bool parse_alternatives(parser *p, vec_elem *body, bool nested);

/* Wraps body[from..] into an anonymous rule when it is more than one element. */
static int wrap_last(parser *p, vec_elem *body, int from)
{
    if (body->n - from == 1 && body->v[from].type == GE_REF) { /* already one rule: take it out */
        body->n = from;
        p->total_elems--;
        return body->v[from].v;
    }
    int id = new_rule(p, NULL, 0);
    if (id < 0) return -1;
    vec_elem nb = {0};
    for (int i = from; i < body->n; i++) push_elem(p, &nb, body->v[i]);
    push(p, &nb, GE_END, 0);
    p->rules[id].body = nb;
    p->total_elems -= body->n - from;
    body->n = from;
    return p->failed ? -1 : id;
}

/* r{min,max} (max < 0: unbounded) appended to body: one REP element for a bounded count of
 * two or more, REF elements otherwise. */
static void repeat(parser *p, vec_elem *body, int r, int min, int max)
{
    if (max >= 2 || (max < 0 && min >= 2)) {
        push_elem(p, body, (gelem){.type = GE_REP, .lo = (uint16_t)min, .hi = (uint16_t)(max < 0 ? min : max), .v = r});
        if (max >= 0) return;
        min = 0; /* then r* */
    }
    for (int i = 0; i < min; i++) push(p, body, GE_REF, r);
    if (max < 0) { /* star ::= r star | */
        int star = new_rule(p, NULL, 0);
        if (star < 0) return;
        vec_elem sb = {0};
        push(p, &sb, GE_REF, r);
        push(p, &sb, GE_REF, star);
        push(p, &sb, GE_ALT, 0);
        push(p, &sb, GE_END, 0);
        p->rules[star].body = sb;
        push(p, body, GE_REF, star);
        return;
    }
    /* opt_k ::= r opt_{k-1} | ; built innermost first */
    int inner = -1;
    for (int k = 0; k < max - min && !p->failed; k++) {
        int o = new_rule(p, NULL, 0);
        if (o < 0) return;
        vec_elem ob = {0};
        push(p, &ob, GE_REF, r);
        if (inner >= 0) push(p, &ob, GE_REF, inner);
        push(p, &ob, GE_ALT, 0);
        push(p, &ob, GE_END, 0);
        p->rules[o].body = ob;
        inner = o;
    }
    if (inner >= 0) push(p, body, GE_REF, inner);
}

static int parse_int(parser *p)
{
    int v = 0, n = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9' && n < 9) {
        v = v * 10 + (*p->s++ - '0');
        n++;
    }
    return n ? v : -1;
}

static bool parse_postfix(parser *p, vec_elem *body, int from)
{
    while (p->s < p->end && !p->failed) {
        char c = *p->s;
        int min, max;
        if (c == '*') { min = 0; max = -1; }
        else if (c == '+') { min = 1; max = -1; }
        else if (c == '?') { min = 0; max = 1; }
        else if (c == '{') {
            p->s++;
            skip_space(p);
            min = parse_int(p);
            skip_space(p);
            max = min;
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                skip_space(p);
                max = p->s < p->end && *p->s == '}' ? -1 : parse_int(p);
                if (max == -1 && !(p->s < p->end && *p->s == '}')) min = -1;
                skip_space(p);
            }
            if (min < 0 || p->s >= p->end || *p->s != '}' || (max >= 0 && max < min)) {
                fail(p, "bad repetition {m,n}%s", NULL);
                return false;
            }
            if (min > GRAMMAR_MAX_REPEAT || max > GRAMMAR_MAX_REPEAT) {
                fail(p, "repetition count above %s", "1000");
                return false;
            }
        } else {
            return true;
        }
        p->s++;
        if (body->n == from) {
            fail(p, "repetition operator with nothing before it%s", NULL);
            return false;
        }
        int r = wrap_last(p, body, from);
        if (r < 0) return false;
        repeat(p, body, r, min, max);
        skip_space(p);
    }
    return !p->failed;
}

static bool parse_sequence(parser *p, vec_elem *body, bool nested)
{
    for (;;) {
        skip_space(p);
        if (p->s >= p->end || p->failed) return !p->failed;
        char c = *p->s;
        if (c == '|' || (nested && c == ')')) return true;
        if (!nested && at_rule_start(p)) return true;
        int from = body->n;
        if (c == '"') {
            p->s++;
            while (p->s < p->end && *p->s != '"' && !p->failed) {
                uint32_t cp;
                if (!read_char(p, &cp)) return false;
                unsigned char u[4];
                int n = utf8_encode(cp, u);
                for (int i = 0; i < n; i++) push_byte_range(p, body, u[i], u[i]);
            }
            if (p->s >= p->end) {
                fail(p, "unterminated literal%s", NULL);
                return false;
            }
            p->s++;
        } else if (c == '[') {
            p->s++;
            bool neg = p->s < p->end && *p->s == '^';
            if (neg) p->s++;
            cprange r[256];
            int n = 0;
            while (p->s < p->end && *p->s != ']' && !p->failed) {
                uint32_t lo, hi;
                if (!read_char(p, &lo)) return false;
                hi = lo;
                if (p->end - p->s >= 2 && *p->s == '-' && p->s[1] != ']') {
                    p->s++;
                    if (!read_char(p, &hi)) return false;
                    if (hi < lo) {
                        fail(p, "class range out of order%s", NULL);
                        return false;
                    }
                }
                if (n == 256) {
                    fail(p, "more than %s ranges in a class", "256");
                    return false;
                }
                r[n++] = (cprange){lo, hi};
            }
            if (p->s >= p->end) {
                fail(p, "unterminated class%s", NULL);
                return false;
            }
            p->s++;
            int id = class_rule(p, r, n, neg);
            if (id < 0) return false;
            push(p, body, GE_REF, id);
        } else if (c == '.') {
            p->s++;
            cprange r = {0, 0x10FFFF};
            int id = class_rule(p, &r, 1, false);
            if (id < 0) return false;
            push(p, body, GE_REF, id);
        } else if (c == '(') {
            p->s++;
            if (++p->depth > MAX_NESTING) {
                fail(p, "groups nested deeper than %s", "200");
                return false;
            }
            int id = new_rule(p, NULL, 0);
            if (id < 0) return false;
            vec_elem gb = {0};
            bool ok = parse_alternatives(p, &gb, true);
            p->rules[id].body = gb;
            p->depth--;
            if (!ok) return false;
            if (p->s >= p->end || *p->s != ')') {
                fail(p, "missing )%s", NULL);
                return false;
            }
            p->s++;
            push(p, body, GE_REF, id);
        } else if (is_name_char(c)) {
            size_t n = name_len_at(p, p->s);
            int id = rule_id(p, p->s, n);
            p->s += n;
            if (id < 0) return false;
            push(p, body, GE_REF, id);
        } else {
            char what[2] = {c, 0};
            fail(p, "unexpected '%s'", what);
            return false;
        }
        if (!parse_postfix(p, body, from)) return false;
    }
}

static bool parse_alternatives(parser *p, vec_elem *body, bool nested)
{
    for (;;) {
        if (!parse_sequence(p, body, nested)) return false;
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            push(p, body, GE_ALT, 0);
            continue;
        }
        return push(p, body, GE_END, 0);
    }
}

static bool parse_rules(parser *p)
{
    skip_space(p);
    while (p->s < p->end && !p->failed) {
        size_t n = name_len_at(p, p->s);
        if (!n || !at_rule_start(p)) {
            fail(p, "expected `name ::=`%s", NULL);
            return false;
        }
        int id = rule_id(p, p->s, n);
        if (id < 0) return false;
        if (p->rules[id].defined) {
            fail(p, "rule defined twice: %.60s", p->rules[id].name);
            return false;
        }
        p->rules[id].defined = true;
        p->s += n;
        skip_space(p);
        p->s += 3; /* ::= */
        vec_elem body = {0};
        bool ok = parse_alternatives(p, &body, false);
        p->rules[id].body = body;
        if (!ok) return false;
        skip_space(p);
    }
    return !p->failed;
}

/* ---- checks: every rule defined, a root, no left recursion -------------------------------- */

/* Whether the REF or REP element e can match the empty string, given the rules' flags. */
static bool elem_nullable(const gelem *e, const uint8_t *nullable)
{
    return nullable[e->v] || (e->type == GE_REP && e->lo == 0);
}

/* What an element needs for its alternative to be (nullable:) empty, or (productive:) to match
 * some string at all, given the rules' flags so far. */
static bool elem_nullable_in(const parser *p, const gelem *e, const uint8_t *flags)
{
    (void)p;
    return e->type != GE_BYTES && elem_nullable(e, flags);
}

static bool elem_productive(const parser *p, const gelem *e, const uint8_t *flags)
{
    if (e->type != GE_BYTES) return flags[e->v] || (e->type == GE_REP && e->lo == 0);
    const gbyteset *set = &p->sets[e->v];
    for (int w = 0; w < 8; w++)
        if (set->w[w]) return true;
    return false; /* an empty class: [^\x00-\U0010FFFF] */
}

/* flags[r] by fixpoint: a rule is flagged when one of its alternatives has every element ok. */
static void rule_fixpoint(const parser *p, uint8_t *flags, bool (*ok)(const parser *, const gelem *, const uint8_t *))
{
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < p->n_rules; r++) {
            if (flags[r]) continue;
            const vec_elem *b = &p->rules[r].body;
            bool alt_ok = true;
            for (int i = 0; i < b->n; i++) {
                const gelem *e = &b->v[i];
                if (e->type == GE_ALT || e->type == GE_END) {
                    if (alt_ok) {
                        flags[r] = true;
                        changed = true;
                        break;
                    }
                    alt_ok = true;
                } else if (!ok(p, e, flags)) {
                    alt_ok = false;
                }
            }
        }
    }
}

/* On success *nullable_out is the per-rule nullable flags (the caller's to free). */
static bool check_rules(parser *p, int *root, uint8_t **nullable_out)
{
    *root = -1;
    for (int i = 0; i < p->n_rules; i++) {
        if (!p->rules[i].defined) {
            fail(p, "undefined rule: %.60s", p->rules[i].name);
            return false;
        }
        if (p->rules[i].name && !strcmp(p->rules[i].name, "root")) *root = i;
    }
    if (*root < 0) {
        fail(p, "no `root` rule%s", NULL);
        return false;
    }
    /* Nullable rules: an alternative is nullable when all its elements are nullable REFs or
     * REPs.  A grammar whose root matches no string at all is the client's mistake, refused
     * here rather than found when a sequence has nowhere to go. */
    int n = p->n_rules;
    uint8_t *nullable = calloc((size_t)n, sizeof *nullable);
    uint8_t *mark = calloc((size_t)n, 1); /* the DFS marks, then the productive flags */
    int *stack = malloc((size_t)n * 3 * sizeof *stack);
    if (!nullable || !mark || !stack) {
        free(nullable);
        free(mark);
        free(stack);
        fail(p, "out of memory%s", NULL);
        return false;
    }
    rule_fixpoint(p, nullable, elem_nullable_in);
    bool ok = true;
    /* Left recursion: a cycle through REFs preceded only by nullable elements.  Iterative DFS
     * (mark 1 = on the path, 2 = done); a frame is (rule, next element, whether that element
     * is at a left position: only nullable REFs before it in its alternative). */
    for (int start = 0; start < n && ok; start++) {
        if (mark[start]) continue;
        int sp = 0;
        stack[sp++] = start;
        stack[sp++] = 0;
        stack[sp++] = 1;
        mark[start] = 1;
        while (sp && ok) {
            int r = stack[sp - 3], *i = &stack[sp - 2], *left = &stack[sp - 1];
            const vec_elem *b = &p->rules[r].body;
            bool pushed = false;
            while (*i < b->n && !pushed && ok) {
                const gelem *e = &b->v[(*i)++];
                bool was_left = *left, is_ref = e->type == GE_REF || e->type == GE_REP;
                *left = e->type == GE_ALT || (was_left && is_ref && elem_nullable(e, nullable));
                if (!was_left || !is_ref) continue;
                int t = e->v;
                if (mark[t] == 1) {
                    const char *name = p->rules[t].name ? p->rules[t].name : "(a group or repetition)";
                    fail(p, "left recursion through rule %.60s", name);
                    ok = false;
                } else if (!mark[t]) {
                    mark[t] = 1;
                    stack[sp++] = t;
                    stack[sp++] = 0;
                    stack[sp++] = 1;
                    pushed = true;
                }
            }
            if (!pushed && ok) {
                mark[r] = 2;
                sp -= 3;
            }
        }
    }
    if (ok) { /* after the left recursion check, whose message says more */
        memset(mark, 0, (size_t)n);
        rule_fixpoint(p, mark, elem_productive);
        ok = mark[*root];
        if (!ok) fail(p, "matches no string: every way through `root` needs an empty character class%s", "");
    }
    if (ok) *nullable_out = nullable;
    else free(nullable);
    free(mark);
    free(stack);
    return ok;
}

static grammar *link_grammar(parser *p, int root, uint8_t *nullable, char *err, size_t errlen)
{
    grammar *g = calloc(1, sizeof *g);
    if (!g) goto oom;
    atomic_init(&g->refs, 1);
    int n_alts = 0;
    for (int r = 0; r < p->n_rules; r++) {
        g->n_elems += p->rules[r].body.n;
        for (int i = 0; i < p->rules[r].body.n; i++)
            if (p->rules[r].body.v[i].type <= GE_ALT) n_alts++;
    }
    g->elems = malloc((size_t)g->n_elems * sizeof *g->elems);
    g->alt_off = malloc((size_t)(p->n_rules + 1) * sizeof *g->alt_off);
    g->alt_pos = malloc((size_t)n_alts * sizeof *g->alt_pos);
    if (!g->elems || !g->alt_off || !g->alt_pos) goto oom;
    int e = 0, a = 0;
    for (int r = 0; r < p->n_rules; r++) {
        g->alt_off[r] = a;
        g->alt_pos[a++] = e;
        const vec_elem *b = &p->rules[r].body;
        for (int i = 0; i < b->n; i++) {
            g->elems[e++] = b->v[i];
            if (b->v[i].type == GE_ALT) g->alt_pos[a++] = e;
        }
    }
    g->alt_off[p->n_rules] = a;
    g->n_rules = p->n_rules;
    g->root = root;
    g->sets = p->sets;
    g->n_sets = p->n_sets;
    p->sets = NULL;
    g->nullable = nullable;
    return g;
oom:
    snprintf(err, errlen, "grammar: out of memory");
    free(nullable);
    if (g) {
        free(g->elems);
        free(g->alt_off);
        free(g->alt_pos);
        free(g);
    }
    return NULL;
}

grammar *grammar_from_gbnf(const char *text, size_t len, char *err, size_t errlen)
{
    parser p = {.s = text, .end = text + len, .err = err, .errlen = errlen};
    int root = -1;
    uint8_t *nullable = NULL;
    grammar *g = NULL;
    if (!text || !len) {
        snprintf(err, errlen, "grammar: empty");
        return NULL;
    }
    if (memchr(text, 0, len)) {
        snprintf(err, errlen, "grammar: contains a NUL byte");
        return NULL;
    }
    if (parse_rules(&p) && check_rules(&p, &root, &nullable)) g = link_grammar(&p, root, nullable, err, errlen);
    if (g && !grammar_check_start(g, err, errlen)) {
        grammar_unref(g);
        g = NULL;
    }
    for (int i = 0; i < p.n_rules; i++) {
        free(p.rules[i].name);
        free(p.rules[i].body.v);
    }
    free(p.rules);
    free(p.sets);
    return g;
}

grammar *grammar_ref(grammar *g)
{
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void grammar_unref(grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    grammar_tables_free(g->tables);
    free(g->elems);
    free(g->sets);
    free(g->alt_off);
    free(g->alt_pos);
    free(g->nullable);
    free(g);
}
