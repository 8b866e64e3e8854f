/* regex.c - a practical regex subset -> a GBNF expression (grammar_from_regex, JSON-schema
 * `pattern`).  Literals, ., [classes] with ranges and \d \w \s, \d \w \s \D \W \S, groups,
 * (?:...), |, * + ? {m} {m,} {m,n} (a lazy ? after them is accepted and changes nothing);
 * ^ at the start and $ at the end anchor what is anchored anyway.  Backreferences,
 * lookarounds and other (? groups are refused by name.  In JSON mode the text is the inside
 * of a JSON string: " and \ are written escaped and control characters never appear. */
#include "grammar_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct rx {
    const char *s, *end;
    bytebuf *out;
    bool json;
    int depth;
    char *err;
    size_t errlen;
    bool failed;
} rx;

static void rx_fail(rx *r, const char *msg)
{
    if (!r->failed) snprintf(r->err, r->errlen, "regex: %s", msg);
    r->failed = true;
}

/* One code point as a GBNF literal (JSON mode: its JSON-escaped form). */
static void lit(rx *r, uint32_t c)
{
    if (r->json && (c == '"' || c == '\\')) {
        bytebuf_puts(r->out, c == '"' ? "\"\\\\\\\"\"" : "\"\\\\\\\\\"");
        return;
    }
    if (r->json && c < 0x20) {
        bytebuf_printf(r->out, "\"\\\\u%04x\"", (unsigned)c);
        return;
    }
    bytebuf_printf(r->out, c < 0x10000 ? "\"\\u%04x\"" : "\"\\U%08x\"", (unsigned)c);
}

typedef struct crange {
    uint32_t lo, hi;
} crange;

static int add_range(crange *rs, int n, uint32_t lo, uint32_t hi)
{
    if (n < 120) rs[n++] = (crange){lo, hi};
    return n;
}

static int shorthand(crange *rs, int n, char c, bool *neg)
{
    *neg = c == 'D' || c == 'W' || c == 'S';
    switch (c) {
    case 'd': case 'D': return add_range(rs, n, '0', '9');
    case 'w': case 'W':
        n = add_range(rs, n, '0', '9');
        n = add_range(rs, n, 'a', 'z');
        n = add_range(rs, n, 'A', 'Z');
        return add_range(rs, n, '_', '_');
    case 's': case 'S':
        n = add_range(rs, n, ' ', ' ');
        return add_range(rs, n, '\t', '\r');
    }
    return -1;
}

/* A class [ranges] (negated or not) as GBNF; JSON mode keeps ", \ and controls out. */
static void emit_class(rx *r, const crange *rs, int n, bool neg)
{
    bytebuf_puts(r->out, neg ? "[^" : "[");
    for (int i = 0; i < n; i++) {
        uint32_t lo = rs[i].lo, hi = rs[i].hi;
        if (!neg && r->json) { /* cut the excluded characters out of a positive class */
            if (hi < 0x20) continue;
            if (lo < 0x20) lo = 0x20;
        }
        bytebuf_printf(r->out, lo < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)lo);
        if (hi != lo) bytebuf_printf(r->out, hi < 0x10000 ? "-\\u%04x" : "-\\U%08x", (unsigned)hi);
    }
    if (neg && r->json) bytebuf_puts(r->out, "\"\\\\\\x00-\\x1f");
    bytebuf_puts(r->out, "]");
}

static uint32_t rx_char(rx *r)
{
    unsigned char c = (unsigned char)*r->s++;
    if (c < 0x80) return c;
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    uint32_t v = c & (0x3F >> n);
    for (int i = 0; i < n && r->s < r->end; i++) v = (v << 6) | ((unsigned char)*r->s++ & 0x3F);
    if (!n || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        rx_fail(r, "invalid UTF-8");
        return '?';
    }
    return v;
}

static uint32_t escape_char(char e)
{
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    }
    return (unsigned char)e;
}

static bool escape_ok(char e)
{
    return strchr("ntrfv0\\.^$|?*+()[]{}/-\"' ", e) != NULL;
}

static void parse_class(rx *r)
{
    crange rs[128];
    int n = 0;
    bool neg = r->s < r->end && *r->s == '^';
    if (neg) r->s++;
    bool first = true;
    while (r->s < r->end && (*r->s != ']' || first) && !r->failed) {
        first = false;
        uint32_t lo;
        if (*r->s == '\\' && r->end - r->s >= 2) {
            char e = r->s[1];
            r->s += 2;
            bool sneg;
            int m = shorthand(rs, n, e, &sneg);
            if (m >= 0) {
                if (sneg) {
                    rx_fail(r, "\\D, \\W and \\S inside a class are not supported");
                    return;
                }
                n = m;
                continue;
            }
            if (!escape_ok(e)) {
                rx_fail(r, "unsupported escape in a class");
                return;
            }
            lo = escape_char(e);
        } else {
            lo = rx_char(r);
        }
        uint32_t hi = lo;
        if (r->end - r->s >= 2 && *r->s == '-' && r->s[1] != ']') {
            r->s++;
            if (*r->s == '\\' && r->end - r->s >= 2) {
                if (!escape_ok(r->s[1])) {
                    rx_fail(r, "unsupported escape in a class");
                    return;
                }
                hi = escape_char(r->s[1]);
                r->s += 2;
            } else {
                hi = rx_char(r);
            }
            if (hi < lo) {
                rx_fail(r, "class range out of order");
                return;
            }
        }
        n = add_range(rs, n, lo, hi);
    }
    if (r->s >= r->end) {
        rx_fail(r, "unterminated class");
        return;
    }
    r->s++;
    if (r->json && !neg) {
        /* drop " and \ from positive classes by splitting the ranges around them */
        crange cut[128];
        int m = 0;
        for (int i = 0; i < n; i++) {
            uint32_t lo = rs[i].lo, hi = rs[i].hi;
            const uint32_t bad[] = {'"', '\\'};
            for (int b = 0; b < 2; b++) {
                if (lo <= bad[b] && bad[b] <= hi) {
                    if (lo < bad[b]) m = add_range(cut, m, lo, bad[b] - 1);
                    lo = bad[b] + 1;
                }
            }
            if (lo <= hi) m = add_range(cut, m, lo, hi);
        }
        if (m == 0) {
            rx_fail(r, "a class of only \" and \\ cannot be generated inside a JSON string");
            return;
        }
        emit_class(r, cut, m, false);
        return;
    }
    emit_class(r, rs, n, neg);
}

static void parse_alt(rx *r);

static void parse_atom(rx *r)
{
    char c = *r->s;
    if (c == '(') {
        r->s++;
        if (r->end - r->s >= 2 && r->s[0] == '?') {
            if (r->s[1] != ':') {
                rx_fail(r, "lookarounds and (? groups other than (?: are not supported");
                return;
            }
            r->s += 2;
        }
        if (++r->depth > 100) {
            rx_fail(r, "groups nested deeper than 100");
            return;
        }
        bytebuf_puts(r->out, "(");
        parse_alt(r);
        r->depth--;
        if (r->s >= r->end || *r->s != ')') {
            rx_fail(r, "missing )");
            return;
        }
        r->s++;
        bytebuf_puts(r->out, ")");
    } else if (c == '[') {
        r->s++;
        parse_class(r);
    } else if (c == '.') {
        r->s++;
        bytebuf_puts(r->out, r->json ? "[^\"\\\\\\x00-\\x1f]" : "[^\\n]");
    } else if (c == '\\') {
        if (r->end - r->s < 2) {
            rx_fail(r, "dangling \\");
            return;
        }
        char e = r->s[1];
        r->s += 2;
        crange rs[8];
        bool neg;
        int n = shorthand(rs, 0, e, &neg);
        if (n >= 0) {
            emit_class(r, rs, n, neg);
        } else if (e >= '1' && e <= '9') {
            rx_fail(r, "backreferences are not supported");
        } else if (!escape_ok(e)) {
            rx_fail(r, "unsupported escape");
        } else {
            lit(r, escape_char(e));
        }
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        rx_fail(r, "quantifier with nothing before it");
    } else {
        lit(r, rx_char(r));
    }
}

static void parse_quant(rx *r)
{
    if (r->s >= r->end) return;
    char c = *r->s;
    if (c == '*' || c == '+' || c == '?') {
        bytebuf_printf(r->out, "%c", c);
        r->s++;
    } else if (c == '{') {
        const char *close = memchr(r->s, '}', (size_t)(r->end - r->s));
        if (!close || close - r->s > 24) {
            rx_fail(r, "bad {m,n}");
            return;
        }
        bytebuf_append(r->out, r->s, (size_t)(close - r->s + 1)); /* the GBNF parser checks it */
        r->s = close + 1;
    } else {
        return;
    }
    if (r->s < r->end && (*r->s == '?' || *r->s == '+')) r->s++; /* lazy/possessive: same language */
    if (r->s < r->end && strchr("*+?{", *r->s)) rx_fail(r, "nested quantifier");
}

static void parse_alt(rx *r)
{
    bytebuf_puts(r->out, "(");
    for (;;) {
        bool empty = true;
        while (r->s < r->end && *r->s != '|' && *r->s != ')' && !r->failed) {
            if (*r->s == '^' || *r->s == '$') { /* anchors: the whole text is matched anyway */
                r->s++;
                continue;
            }
            bytebuf_puts(r->out, " ");
            parse_atom(r);
            parse_quant(r);
            empty = false;
        }
        if (empty) bytebuf_puts(r->out, " \"\"");
        if (r->failed || r->s >= r->end || *r->s != '|') break;
        r->s++;
        bytebuf_puts(r->out, " |");
    }
    bytebuf_puts(r->out, " )");
}

bool regex_to_gbnf(const char *re, size_t len, bool json, bytebuf *out, char *err, size_t errlen)
{
    rx r = {.s = re, .end = re + len, .out = out, .json = json, .err = err, .errlen = errlen};
    if (memchr(re, 0, len)) {
        rx_fail(&r, "contains a NUL byte");
        return false;
    }
    parse_alt(&r);
    if (!r.failed && r.s < r.end) rx_fail(&r, "unbalanced )");
    if (!r.failed && !bytebuf_ok(out)) rx_fail(&r, "out of memory");
    return !r.failed;
}

grammar *grammar_from_regex(const char *re, size_t len, char *err, size_t errlen)
{
    bytebuf b = {0};
    grammar *g = NULL;
    bytebuf_puts(&b, "root ::= ");
    if (regex_to_gbnf(re, len, false, &b, err, errlen)) {
        bytebuf_puts(&b, "\n");
        g = bytebuf_ok(&b) ? grammar_from_gbnf(b.data, b.len, err, errlen) : NULL;
        if (!g && bytebuf_ok(&b)) {
            char inner[200];
            snprintf(inner, sizeof inner, "%s", err);
            snprintf(err, errlen, "regex: %s", inner);
        }
    }
    bytebuf_free(&b);
    return g;
}
