/* schema.c - JSON schema -> GBNF text, and the other front ends that produce GBNF (json_object,
 * choices, the tool-call builder).  One rule per subschema (`s<N>`), shared primitives once.
 * Every keyword is either compiled, or an annotation that constrains nothing, or refused by
 * name: a schema is never half-enforced. */
#include "grammar_internal.h"
#include "grammar_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_MAX_DEPTH 64
#define SCHEMA_MAX_RULES 5000
#define SCHEMA_MAX_ENUM 10000

/* Shared rules, emitted once each: whitespace (a tool call's arguments need no layout: at most
 * a space, since a model left free to spend tokens on whitespace does, a random one hundreds),
 * then the rest. */
static const char WS_GBNF[] = "ws ::= | \" \" | \"\\n\" [ \\t]{0,12}\n";
static const char WS_CALL_GBNF[] = "ws ::= | \" \"\n";
static const char PRIM_GBNF[] =
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    /* char*: one position for every character (a bounded repetition would make each count a
     * position of its own, each with its token table) */
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "int ::= \"-\"? uint\n"
    "uint ::= \"0\" | [1-9] [0-9]{0,15}\n"
    "frac ::= (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,3})?\n"
    "number ::= int frac\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    /* calendar-exact: years 1000-9999, 30-day months end at 30, February at 28 */
    "date ::= [1-9] [0-9]{3} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
    "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )\n"
    "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
    "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
    "hex ::= [0-9a-fA-F]\n";

typedef struct sc {
    bytebuf out;
    const cJSON *root;
    int n_rules;
    struct { char *ref; int rule; } refs[256];
    int n_refs;
    int depth;
    char *err;
    size_t errlen;
    bool failed;
    const char *prefix; /* rule-name prefix, so builder alternatives do not collide */
} sc;

static void sc_fail(sc *c, const char *fmt, const char *what)
{
    if (c->failed) return;
    c->failed = true;
    char m[200];
    snprintf(m, sizeof m, fmt, what);
    snprintf(c->err, c->errlen, "json_schema: %s", m);
}

void gbnf_literal(bytebuf *out, const char *s, size_t len)
{
    bytebuf_puts(out, "\"");
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') bytebuf_printf(out, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) bytebuf_printf(out, "\\x%02x", ch);
        else bytebuf_append(out, &s[i], 1);
    }
    bytebuf_puts(out, "\"");
}

static int new_rule(sc *c)
{
    if (++c->n_rules > SCHEMA_MAX_RULES) {
        sc_fail(c, "more than %s subschemas", "5000");
        return -1;
    }
    return c->n_rules - 1;
}

static int compile(sc *c, const cJSON *s);

/* A literal JSON value (enum/const member) in its compact encoding. */
static void json_literal(sc *c, bytebuf *b, const cJSON *v)
{
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt) {
        sc_fail(c, "out of memory%s", "");
        return;
    }
    gbnf_literal(b, txt, strlen(txt));
    free(txt);
}

static bool is_annotation(const char *k)
{
    static const char *const ann[] = {"title", "description", "$schema", "$id", "$comment", "examples", "default",
                                      "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict",
                                      "name", NULL};
    for (int i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i])) return true;
    return false;
}

static bool known_keyword(const char *k)
{
    static const char *const kw[] = {"type", "properties", "required", "additionalProperties", "items",
                                     "prefixItems", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf",
                                     "allOf", "$ref", "nullable", "minLength", "maxLength", "pattern", "format",
                                     "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    for (int i = 0; kw[i]; i++)
        if (!strcmp(k, kw[i])) return true;
    return is_annotation(k);
}

static bool get_count(sc *c, const cJSON *s, const char *key, long *out, long dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = dflt;
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != floor(v->valuedouble)) {
        sc_fail(c, "%s must be a non-negative integer", key);
        return false;
    }
    *out = (long)v->valuedouble;
    return true;
}

/* ---- integers in a range -------------------------------------------------------------------- */

static int ndigits(unsigned long long v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* Same-length decimal strings a..b (digit arrays of length n) as a GBNF expression. */
static void digits_range(bytebuf *b, const char *a, const char *z, int n)
{
    if (n == 0) return;
    bool full = true;
    for (int i = 0; i < n; i++)
        if (a[i] != '0' || z[i] != '9') full = false;
    if (full) {
        bytebuf_printf(b, " [0-9]{%d}", n);
        return;
    }
    if (a[0] == z[0]) {
        bytebuf_printf(b, " \"%c\"", a[0]);
        digits_range(b, a + 1, z + 1, n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    bytebuf_printf(b, " ( \"%c\"", a[0]);
    digits_range(b, a + 1, nines, n - 1);
    if (z[0] - a[0] > 1) {
        bytebuf_printf(b, " | [%c-%c]", a[0] + 1, z[0] - 1);
        if (n > 1) bytebuf_printf(b, " [0-9]{%d}", n - 1);
    }
    bytebuf_printf(b, " | \"%c\"", z[0]);
    digits_range(b, zeros, z + 1, n - 1);
    bytebuf_puts(b, " )");
}

/* Non-negative lo..hi (hi < 0: unbounded, up to 16 digits). */
static void uint_range(bytebuf *b, unsigned long long lo, long long hi)
{
    int la = ndigits(lo), lz = hi < 0 ? 16 : ndigits((unsigned long long)hi);
    bytebuf_puts(b, "(");
    for (int L = la; L <= lz; L++) {
        unsigned long long p = 1;
        for (int i = 1; i < L; i++) p *= 10;
        unsigned long long from = L == la ? lo : p, to = hi >= 0 && L == lz ? (unsigned long long)hi : p * 10 - 1;
        char a[24], z[24];
        snprintf(a, sizeof a, "%0*llu", L, from);
        snprintf(z, sizeof z, "%0*llu", L, to);
        if (L > la) bytebuf_puts(b, " |");
        digits_range(b, a, z, L);
    }
    bytebuf_puts(b, " )");
}

static bool integer_rule(sc *c, bytebuf *b, const cJSON *s)
{
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    const cJSON *emn = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum"),
                *emx = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    /* JavaScript's safe-integer range, +-(2^53 - 1) (zod 4 writes it for every
     * z.number().int(), so the OpenAI Agents SDK's tools carry it), is no bound: a bound at or
     * past it is dropped.  9e15, not 2^53 - 1: cJSON prints 15 digits (-9.00719925474099e+15),
     * so the bound has lost its last digit when a tools array was printed and read back. */
    const double safe = 9.0e15;
    if (mn && cJSON_IsNumber(mn) && mn->valuedouble <= -safe) mn = NULL;
    if (emn && cJSON_IsNumber(emn) && emn->valuedouble <= -safe) emn = NULL;
    if (mx && cJSON_IsNumber(mx) && mx->valuedouble >= safe) mx = NULL;
    if (emx && cJSON_IsNumber(emx) && emx->valuedouble >= safe) emx = NULL;
    bool has_lo = mn || emn, has_hi = mx || emx;
    if (!has_lo && !has_hi) {
        bytebuf_puts(b, " int");
        return true;
    }
    const double lim = 1e15;
    double lo = -lim, hi = lim;
    if (mn && cJSON_IsNumber(mn)) lo = ceil(mn->valuedouble);
    if (emn && cJSON_IsNumber(emn)) lo = fmax(lo, floor(emn->valuedouble) + 1);
    if (mx && cJSON_IsNumber(mx)) hi = floor(mx->valuedouble);
    if (emx && cJSON_IsNumber(emx)) hi = fmin(hi, ceil(emx->valuedouble) - 1);
    if ((mn && !cJSON_IsNumber(mn)) || (mx && !cJSON_IsNumber(mx)) || (emn && !cJSON_IsNumber(emn)) ||
        (emx && !cJSON_IsNumber(emx)) || lo < -lim || hi > lim || lo > hi) {
        sc_fail(c, "integer bounds must be numbers within +-1e15 with minimum <= maximum%s", "");
        return false;
    }
    bytebuf_puts(b, " (");
    bool any = false;
    if (lo < 0) { /* negatives: "-" then |hi'|..|lo| */
        double nlo = hi < 0 ? -hi : 1;
        bytebuf_puts(b, " \"-\" ");
        uint_range(b, (unsigned long long)nlo, has_lo ? (long long)-lo : -1);
        any = true;
    }
    if (hi >= 0) {
        if (any) bytebuf_puts(b, " |");
        uint_range(b, lo > 0 ? (unsigned long long)lo : 0, has_hi ? (long long)hi : -1);
    }
    bytebuf_puts(b, " )");
    return true;
}

/* ---- strings --------------------------------------------------------------------------------- */

static bool string_rule(sc *c, bytebuf *b, const cJSON *s)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format"), *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    long mn, mx;
    if (!get_count(c, s, "minLength", &mn, 0) || !get_count(c, s, "maxLength", &mx, -1)) return false;
    if (mx >= 0 && mx < mn) {
        sc_fail(c, "maxLength below minLength%s", "");
        return false;
    }
    if (mn > GRAMMAR_MAX_REPEAT || mx > GRAMMAR_MAX_REPEAT) {
        sc_fail(c, "minLength/maxLength above %s", "1000");
        return false;
    }
    if ((fmt || pat) && (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))) {
        sc_fail(c, "minLength/maxLength together with %s", fmt ? "format" : "pattern");
        return false;
    }
    if (fmt && pat) {
        sc_fail(c, "format together with pattern%s", "");
        return false;
    }
    bytebuf_puts(b, " \"\\\"\"");
    if (fmt) {
        const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "";
        if (!strcmp(f, "date")) bytebuf_puts(b, " date");
        else if (!strcmp(f, "time")) bytebuf_puts(b, " time");
        else if (!strcmp(f, "date-time")) bytebuf_puts(b, " date \"T\" time");
        else if (!strcmp(f, "uuid")) bytebuf_puts(b, " hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}");
        else if (!strcmp(f, "email"))
            bytebuf_puts(b, " [a-zA-Z0-9._%+-]{1,64} \"@\" [a-zA-Z0-9-]{1,63} ( \".\" [a-zA-Z0-9-]{1,63} ){1,4}");
        else {
            sc_fail(c, "unsupported string format: %.60s", f);
            return false;
        }
    } else if (pat) {
        if (!cJSON_IsString(pat)) {
            sc_fail(c, "pattern must be a string%s", "");
            return false;
        }
        bytebuf_puts(b, " ");
        char e[200];
        if (!regex_to_gbnf(pat->valuestring, strlen(pat->valuestring), true, b, e, sizeof e)) {
            sc_fail(c, "pattern: %.150s", e);
            return false;
        }
    } else if (mx >= 0) {
        bytebuf_printf(b, " char{%ld,%ld}", mn, mx);
    } else {
        bytebuf_printf(b, " char{%ld,}", mn);
    }
    bytebuf_puts(b, " \"\\\"\"");
    return true;
}

/* ---- objects and arrays ---------------------------------------------------------------------- */

static bool object_rule(sc *c, bytebuf *b, const cJSON *s)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if ((props && !cJSON_IsObject(props)) || (req && !cJSON_IsArray(req))) {
        sc_fail(c, "properties must be an object and required an array%s", "");
        return false;
    }
    /* The properties in schema order, then required names the schema does not describe. */
    int n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) n++;
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) {
            sc_fail(c, "required must list strings%s", "");
            return false;
        }
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) n++;
    }
    if (n > 1000) {
        sc_fail(c, "more than %s properties", "1000");
        return false;
    }
    /* Extra properties: with no declared ones, additionalProperties absent/true means any;
     * with declared ones only additionalProperties (a schema or true) opens the object. */
    int extra = -1; /* rule of the extra values; -2: any value */
    if (cJSON_IsTrue(add) || (!add && n == 0)) extra = -2;
    else if (cJSON_IsObject(add)) {
        extra = compile(c, add);
        if (extra < 0) return false;
    } else if (add && !cJSON_IsFalse(add)) {
        sc_fail(c, "additionalProperties must be a boolean or a schema%s", "");
        return false;
    }
    int *kv = malloc((size_t)(n ? n : 1) * sizeof *kv);
    bool *required = calloc((size_t)(n ? n : 1), sizeof *required);
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    if (!kv || !required || !names) {
        free(kv);
        free(required);
        free(names);
        sc_fail(c, "out of memory%s", "");
        return false;
    }
    int i = 0;
    cJSON_ArrayForEach(p, props) {
        names[i] = p->string;
        if (!cJSON_IsObject(p) && !cJSON_IsBool(p)) {
            sc_fail(c, "property %.60s: a schema must be an object", p->string);
            break;
        }
        kv[i] = compile(c, p);
        i++;
        if (c->failed) break;
    }
    cJSON_ArrayForEach(r, req) {
        if (c->failed) break;
        if (props && cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) continue;
        names[i] = r->valuestring;
        kv[i++] = -2;
    }
    for (int k = 0; k < n && !c->failed; k++) {
        cJSON_ArrayForEach(r, req)
            if (!strcmp(r->valuestring, names[k])) required[k] = true;
    }
    if (c->failed) {
        free(kv);
        free(required);
        free(names);
        return false;
    }
    /* kv_k ::= "name" ws ":" ws value_k; first_k: props k.. with none written yet; rest_k: with
     * one written (each present property preceded by a comma). */
    int base = c->n_rules;
    c->n_rules += 3 * (n + 1);
    if (c->n_rules > SCHEMA_MAX_RULES) sc_fail(c, "more than %s subschemas", "5000");
    bytebuf *o = &c->out;
    for (int k = 0; k < n && !c->failed; k++) {
        bytebuf_printf(o, "%sk%d ::= ", c->prefix, base + k);
        bytebuf lit = {0};
        bytebuf_puts(&lit, "\"");
        for (const char *q = names[k]; *q; q++) { /* the key as JSON, then as a GBNF literal */
            unsigned char ch = (unsigned char)*q;
            if (ch == '"' || ch == '\\') bytebuf_printf(&lit, "\\%c", ch);
            else if (ch < 0x20) bytebuf_printf(&lit, "\\u%04x", ch);
            else bytebuf_append(&lit, q, 1);
        }
        bytebuf_puts(&lit, "\"");
        gbnf_literal(o, lit.data ? lit.data : "", lit.len);
        bytebuf_free(&lit);
        if (kv[k] == -2) bytebuf_puts(o, " ws \":\" ws value\n");
        else bytebuf_printf(o, " ws \":\" ws %ss%d\n", c->prefix, kv[k]);
    }
    const char *pf = c->prefix;
    const char *ev = extra == -2 ? "value" : NULL;
    char evbuf[48];
    if (extra >= 0) {
        snprintf(evbuf, sizeof evbuf, "%ss%d", pf, extra);
        ev = evbuf;
    }
    int F = base + n, R = base + 2 * n + 1; /* first_k = F+k, rest_k = R+k, k = 0..n */
    for (int k = n; k >= 0 && !c->failed; k--) {
        if (k == n) {
            if (ev) {
                bytebuf_printf(o, "%sr%d ::= ( \",\" ws string ws \":\" ws %s ws )*\n", pf, R + n, ev);
                bytebuf_printf(o, "%sr%d ::= ( string ws \":\" ws %s ws %sr%d )?\n", pf, F + n, ev, pf, R + n);
            } else {
                bytebuf_printf(o, "%sr%d ::= \"\"\n%sr%d ::= \"\"\n", pf, R + n, pf, F + n);
            }
            continue;
        }
        bytebuf_printf(o, "%sr%d ::= %s\",\" ws %sk%d ws%s %sr%d\n", pf, R + k, required[k] ? "" : "( ", pf, base + k,
                       required[k] ? "" : " )?", pf, R + k + 1);
        if (required[k])
            bytebuf_printf(o, "%sr%d ::= %sk%d ws %sr%d\n", pf, F + k, pf, base + k, pf, R + k + 1);
        else
            bytebuf_printf(o, "%sr%d ::= %sk%d ws %sr%d | %sr%d\n", pf, F + k, pf, base + k, pf, R + k + 1, pf, F + k + 1);
    }
    bytebuf_printf(b, " \"{\" ws %sr%d \"}\"", pf, F);
    free(kv);
    free(required);
    free(names);
    return !c->failed;
}

static bool array_rule(sc *c, bytebuf *b, const cJSON *s)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items"), *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    long mn, mx;
    if (!get_count(c, s, "minItems", &mn, 0) || !get_count(c, s, "maxItems", &mx, -1)) return false;
    if (mn > GRAMMAR_MAX_REPEAT || mx > GRAMMAR_MAX_REPEAT || (mx >= 0 && mx < mn)) {
        sc_fail(c, "minItems/maxItems: at most 1000 and minItems <= maxItems%s", "");
        return false;
    }
    int np = 0;
    int pre[64];
    if (prefix) {
        if (!cJSON_IsArray(prefix) || cJSON_GetArraySize(prefix) > 64) {
            sc_fail(c, "prefixItems must be an array of at most %s schemas", "64");
            return false;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, prefix) {
            pre[np] = compile(c, it);
            if (pre[np++] < 0) return false;
        }
    }
    char item[48] = "value";
    bool more = true; /* items after the prefix */
    if (cJSON_IsFalse(items)) more = false;
    else if (items && cJSON_IsObject(items)) {
        int r = compile(c, items);
        if (r < 0) return false;
        snprintf(item, sizeof item, "%ss%d", c->prefix, r);
    } else if (items && !cJSON_IsTrue(items)) {
        sc_fail(c, "items must be a schema or a boolean%s", "");
        return false;
    }
    if (np > 0) {
        if (mn > np || (mx >= 0 && mx < np)) {
            sc_fail(c, "minItems/maxItems together with prefixItems must allow exactly the prefix or more%s", "");
            return false;
        }
        /* the prefix in full (arrays shorter than the prefix are not generated), then the rest */
        bytebuf_puts(b, " \"[\" ws");
        for (int i = 0; i < np; i++) bytebuf_printf(b, "%s %ss%d ws", i ? " \",\" ws" : "", c->prefix, pre[i]);
        if (more) {
            if (mx < 0) bytebuf_printf(b, " ( \",\" ws %s ws )*", item);
            else if (mx > np) bytebuf_printf(b, " ( \",\" ws %s ws ){0,%ld}", item, mx - np);
        }
        bytebuf_puts(b, " \"]\"");
        return true;
    }
    if (!more) {
        if (mn > 0) {
            sc_fail(c, "items false with minItems above %s", "0");
            return false;
        }
        bytebuf_puts(b, " \"[\" ws \"]\"");
        return true;
    }
    char tail[48];
    if (mx < 0) snprintf(tail, sizeof tail, "*");
    else snprintf(tail, sizeof tail, "{%ld,%ld}", mn > 0 ? mn - 1 : 0, mx > 0 ? mx - 1 : 0);
    if (mx == 0) bytebuf_puts(b, " \"[\" ws \"]\"");
    else if (mn == 0) bytebuf_printf(b, " \"[\" ws ( %s ws ( \",\" ws %s ws )%s )? \"]\"", item, item, tail);
    else bytebuf_printf(b, " \"[\" ws %s ws ( \",\" ws %s ws )%s \"]\"", item, item, tail);
    return true;
}

/* ---- one subschema ------------------------------------------------------------------------- */

static const cJSON *resolve_ref(sc *c, const char *ref)
{
    const char *names[] = {"#/$defs/", "#/definitions/"};
    for (int i = 0; i < 2; i++) {
        size_t l = strlen(names[i]);
        if (!strncmp(ref, names[i], l)) {
            const cJSON *defs = cJSON_GetObjectItemCaseSensitive(c->root, i ? "definitions" : "$defs");
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(defs, ref + l);
            if (d) return d;
        }
    }
    if (!strcmp(ref, "#")) return c->root;
    sc_fail(c, "$ref %.80s: only #, #/$defs/NAME and #/definitions/NAME are supported and must exist", ref);
    return NULL;
}

static bool type_body(sc *c, bytebuf *b, const cJSON *s, const char *t)
{
    if (!strcmp(t, "string")) return string_rule(c, b, s);
    if (!strcmp(t, "integer")) return integer_rule(c, b, s);
    if (!strcmp(t, "number")) {
        if (cJSON_GetObjectItemCaseSensitive(s, "minimum") || cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
            cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") || cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")) {
            const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
            if (cJSON_IsNumber(mn) && mn->valuedouble == 0 && !cJSON_GetObjectItemCaseSensitive(s, "maximum") &&
                !cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") && !cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")) {
                bytebuf_puts(b, " uint frac");
                return true;
            }
            sc_fail(c, "minimum/maximum on a number (only minimum 0 is supported; use integer for ranges)%s", "");
            return false;
        }
        bytebuf_puts(b, " number");
        return true;
    }
    if (!strcmp(t, "boolean")) return bytebuf_puts(b, " boolean");
    if (!strcmp(t, "null")) return bytebuf_puts(b, " null");
    if (!strcmp(t, "object")) return object_rule(c, b, s);
    if (!strcmp(t, "array")) return array_rule(c, b, s);
    sc_fail(c, "unknown type %.60s", t);
    return false;
}

/* Alternatives of a list of subschemas (anyOf/oneOf). */
static bool alternatives(sc *c, bytebuf *b, const cJSON *list, const char *kw)
{
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0) {
        sc_fail(c, "%s must be a non-empty array of schemas", kw);
        return false;
    }
    const cJSON *it;
    bool first = true;
    bytebuf_puts(b, " (");
    cJSON_ArrayForEach(it, list) {
        int r = compile(c, it);
        if (r < 0) return false;
        bytebuf_printf(b, "%s %ss%d", first ? "" : " |", c->prefix, r);
        first = false;
    }
    bytebuf_puts(b, " )");
    return true;
}

static bool schema_body(sc *c, bytebuf *b, const cJSON *s)
{
    if (cJSON_IsTrue(s)) return bytebuf_puts(b, " value");
    if (!cJSON_IsObject(s)) {
        sc_fail(c, "a schema must be an object or a boolean%s", "");
        return false;
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (!known_keyword(k->string)) {
            sc_fail(c, "unsupported JSON schema keyword: %.60s", k->string);
            return false;
        }
    }
    const cJSON *nullable = cJSON_GetObjectItemCaseSensitive(s, "nullable");
    bool null_too = cJSON_IsTrue(nullable);
    if (null_too) bytebuf_puts(b, " ( null |");
    bool ok;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        if (!cJSON_IsString(v)) {
            sc_fail(c, "$ref must be a string%s", "");
            return false;
        }
        int rule = -1;
        for (int i = 0; i < c->n_refs; i++)
            if (!strcmp(c->refs[i].ref, v->valuestring)) rule = c->refs[i].rule;
        if (rule < 0) {
            const cJSON *target = resolve_ref(c, v->valuestring);
            if (!target) return false;
            if (c->n_refs == 256) {
                sc_fail(c, "more than %s distinct $refs", "256");
                return false;
            }
            /* Name the rule before compiling the target, so that recursive refs find it. */
            rule = new_rule(c);
            if (rule < 0) return false;
            c->refs[c->n_refs].ref = v->valuestring;
            c->refs[c->n_refs++].rule = rule;
            bytebuf body = {0};
            ok = schema_body(c, &body, target);
            bytebuf_printf(&c->out, "%ss%d ::=%s\n", c->prefix, rule, body.data ? body.data : " \"\"");
            bytebuf_free(&body);
            if (!ok) return false;
        }
        bytebuf_printf(b, " %ss%d", c->prefix, rule);
        ok = true;
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        json_literal(c, b, v);
        ok = !c->failed;
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0 || cJSON_GetArraySize(v) > SCHEMA_MAX_ENUM) {
            sc_fail(c, "enum must be an array of 1 to %s values", "10000");
            return false;
        }
        const cJSON *it;
        bool first = true;
        bytebuf_puts(b, " (");
        cJSON_ArrayForEach(it, v) {
            bytebuf_puts(b, first ? " " : " | ");
            json_literal(c, b, it);
            first = false;
        }
        bytebuf_puts(b, " )");
        ok = !c->failed;
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        ok = alternatives(c, b, v, "anyOf");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        ok = alternatives(c, b, v, "oneOf");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1) {
            sc_fail(c, "allOf with other than one schema is not supported%s", "");
            return false;
        }
        ok = schema_body(c, b, cJSON_GetArrayItem(v, 0));
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        if (cJSON_IsString(v)) {
            ok = type_body(c, b, s, v->valuestring);
        } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
            const cJSON *t;
            bool first = true;
            ok = true;
            bytebuf_puts(b, " (");
            cJSON_ArrayForEach(t, v) {
                if (!cJSON_IsString(t)) {
                    sc_fail(c, "type must be a string or an array of strings%s", "");
                    return false;
                }
                if (!first) bytebuf_puts(b, " |");
                first = false;
                if (!(ok = type_body(c, b, s, t->valuestring))) break;
            }
            bytebuf_puts(b, " )");
        } else {
            sc_fail(c, "type must be a string or an array of strings%s", "");
            return false;
        }
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
               cJSON_GetObjectItemCaseSensitive(s, "additionalProperties")) {
        ok = object_rule(c, b, s);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems")) {
        ok = array_rule(c, b, s);
    } else {
        ok = bytebuf_puts(b, " value");
    }
    if (null_too) bytebuf_puts(b, " )");
    return ok && !c->failed;
}

/* Compiles s into its own rule; returns the rule number or -1. */
static int compile(sc *c, const cJSON *s)
{
    if (c->failed) return -1;
    if (++c->depth > SCHEMA_MAX_DEPTH) {
        sc_fail(c, "nested deeper than %s", "64");
        return -1;
    }
    int r = new_rule(c);
    if (r < 0) return -1;
    bytebuf body = {0};
    bool ok = schema_body(c, &body, s);
    if (ok) bytebuf_printf(&c->out, "%ss%d ::=%s\n", c->prefix, r, body.data);
    bytebuf_free(&body);
    c->depth--;
    return ok && !c->failed ? r : -1;
}

/* ---- entry points ------------------------------------------------------------------------- */

static grammar *from_text(bytebuf *b, char *err, size_t errlen)
{
    if (!bytebuf_ok(b)) {
        snprintf(err, errlen, "grammar: out of memory");
        return NULL;
    }
    return grammar_from_gbnf(b->data, b->len, err, errlen);
}

char *grammar_schema_to_gbnf(const cJSON *schema, char *err, size_t errlen)
{
    sc c = {.root = schema, .err = err, .errlen = errlen, .prefix = ""};
    int r = compile(&c, schema);
    if (r >= 0) {
        bytebuf_printf(&c.out, "root ::= s%d\n", r);
        bytebuf_puts(&c.out, WS_GBNF);
        bytebuf_puts(&c.out, PRIM_GBNF);
    }
    if (r < 0 || !bytebuf_ok(&c.out)) {
        if (!c.failed) snprintf(err, errlen, "json_schema: out of memory");
        bytebuf_free(&c.out);
        return NULL;
    }
    return bytebuf_take(&c.out, NULL);
}

grammar *grammar_from_json_schema(const cJSON *schema, char *err, size_t errlen)
{
    if (!schema) {
        snprintf(err, errlen, "json_schema: missing");
        return NULL;
    }
    char *text = grammar_schema_to_gbnf(schema, err, errlen);
    if (!text) return NULL;
    grammar *g = grammar_from_gbnf(text, strlen(text), err, errlen);
    free(text);
    return g;
}

grammar *grammar_json_object(char *err, size_t errlen)
{
    bytebuf b = {0};
    bytebuf_puts(&b, "root ::= object\n");
    bytebuf_puts(&b, WS_GBNF);
    bytebuf_puts(&b, PRIM_GBNF);
    grammar *g = from_text(&b, err, errlen);
    bytebuf_free(&b);
    return g;
}

grammar *grammar_from_choices(const char *const *choices, int n, char *err, size_t errlen)
{
    if (n < 1 || n > SCHEMA_MAX_ENUM) {
        snprintf(err, errlen, "choices: between 1 and %d strings", SCHEMA_MAX_ENUM);
        return NULL;
    }
    bytebuf b = {0};
    bytebuf_puts(&b, "root ::=");
    for (int i = 0; i < n; i++) {
        bytebuf_puts(&b, i ? " | " : " ");
        gbnf_literal(&b, choices[i], strlen(choices[i]));
        if (!choices[i][0]) bytebuf_puts(&b, " \"\"");
    }
    bytebuf_puts(&b, "\n");
    grammar *g = from_text(&b, err, errlen);
    bytebuf_free(&b);
    return g;
}

struct grammar_builder {
    bytebuf rules;
    bytebuf root;
    int n_alts;
};

grammar_builder *grammar_builder_new(void) { return calloc(1, sizeof(grammar_builder)); }

void grammar_builder_free(grammar_builder *b)
{
    if (!b) return;
    bytebuf_free(&b->rules);
    bytebuf_free(&b->root);
    free(b);
}

bool grammar_builder_add(grammar_builder *b, const char *prefix, const cJSON *schema, const char *suffix, char *err,
                         size_t errlen)
{
    char pf[32];
    snprintf(pf, sizeof pf, "a%d-", b->n_alts);
    sc c = {.root = schema, .err = err, .errlen = errlen, .prefix = pf};
    int r = -2;
    if (schema) {
        r = compile(&c, schema);
        if (r < 0) {
            bytebuf_free(&c.out);
            return false;
        }
    }
    bytebuf_puts(&b->rules, c.out.data ? c.out.data : "");
    bytebuf_free(&c.out);
    bytebuf_puts(&b->root, b->n_alts ? " |" : "");
    bytebuf_puts(&b->root, " (");
    if (prefix && *prefix) {
        bytebuf_puts(&b->root, " ");
        gbnf_literal(&b->root, prefix, strlen(prefix));
    }
    if (r >= 0) bytebuf_printf(&b->root, " %ss%d", pf, r);
    else bytebuf_puts(&b->root, " value");
    if (suffix && *suffix) {
        bytebuf_puts(&b->root, " ");
        gbnf_literal(&b->root, suffix, strlen(suffix));
    }
    bytebuf_puts(&b->root, " )");
    b->n_alts++;
    if (!bytebuf_ok(&b->rules) || !bytebuf_ok(&b->root)) {
        snprintf(err, errlen, "grammar: out of memory");
        return false;
    }
    return true;
}

grammar *grammar_builder_finish(grammar_builder *b, char *err, size_t errlen)
{
    grammar *g = NULL;
    if (!b->n_alts) {
        snprintf(err, errlen, "grammar: no alternatives");
    } else {
        bytebuf t = {0};
        bytebuf_printf(&t, "root ::=%s\n", b->root.data);
        bytebuf_puts(&t, b->rules.data ? b->rules.data : "");
        bytebuf_puts(&t, WS_CALL_GBNF);
        bytebuf_puts(&t, PRIM_GBNF);
        g = from_text(&t, err, errlen);
        bytebuf_free(&t);
    }
    grammar_builder_free(b);
    return g;
}
