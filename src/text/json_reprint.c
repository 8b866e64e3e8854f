/* json_reprint.c - a JSON value re-printed as cJSON would print it, as it arrives (see
 * json_reprint.h).
 *
 * The grammar is JSON's pushdown automaton: between tokens `expect` says what may come (a
 * value, a key, a colon, a comma or the close of the open container); inside a token the
 * bytes are a string's (printed as they come, escapes decoded and re-escaped the way cJSON's
 * print_string_ptr does), or a number's or literal's (held until the byte after them, then
 * printed through cJSON itself, so that 1.50 comes out as 1.5 exactly as in a whole reply).
 * What cJSON's parser refuses is refused here at the same byte: lone surrogates, unknown
 * escapes, trailing commas, numbers strtod does not read whole. */
#include "json_reprint.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

enum {
    EXPECT_VALUE,
    EXPECT_VALUE_OR_CLOSE,
    EXPECT_KEY,
    EXPECT_KEY_OR_CLOSE,
    EXPECT_COLON,
    EXPECT_COMMA_OR_CLOSE,
    EXPECT_DONE,
    EXPECT_FAIL
};
enum { TOKEN_NONE, TOKEN_STRING, TOKEN_NUMBER, TOKEN_LITERAL };

void json_reprint_init(json_reprint *r)
{
    memset(r, 0, sizeof *r);
    r->expect = EXPECT_VALUE;
    r->hex = -1;
}

bool json_reprint_done(const json_reprint *r) { return r->expect == EXPECT_DONE; }
bool json_reprint_failed(const json_reprint *r) { return r->expect == EXPECT_FAIL; }

const char *json_reprint_held(const json_reprint *r, size_t *len)
{
    *len = r->n_held;
    return r->held;
}

static void fail(json_reprint *r) { r->expect = EXPECT_FAIL; }

static void hold(json_reprint *r, char c)
{
    if (r->n_held == sizeof r->held)
        fail(r);
    else
        r->held[r->n_held++] = c;
}

static void after_value(json_reprint *r) { r->expect = r->depth == 0 ? EXPECT_DONE : EXPECT_COMMA_OR_CLOSE; }

/* One decoded character of a string, escaped as cJSON prints it. */
static void put_char(json_reprint *r, uint32_t cp, bytebuf *out)
{
    static const char named[] = {
        ['"'] = '"', ['\\'] = '\\', ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    if (r->nul) return;
    if (cp == 0) { /* cJSON keeps the string up to here */
        r->nul = true;
        return;
    }
    if (cp < sizeof named && named[cp]) {
        char e[2] = {'\\', named[cp]};
        bytebuf_append(out, e, 2);
    } else if (cp < 0x20) {
        bytebuf_printf(out, "\\u%04x", (unsigned)cp);
    } else {
        char u[4];
        bytebuf_append(out, u, (size_t)utf8_encode(cp, u));
    }
}

/* A \u code unit is complete: a character, half of a surrogate pair, or a refusal. */
static void code_unit(json_reprint *r, bytebuf *out)
{
    uint32_t u = r->unit;
    if (r->high) {
        if (u < 0xDC00 || u > 0xDFFF) {
            fail(r);
            return;
        }
        put_char(r, 0x10000 + (((r->high & 0x3FF) << 10) | (u & 0x3FF)), out);
        r->high = 0;
    } else if (u >= 0xDC00 && u <= 0xDFFF) { /* a low half alone */
        fail(r);
        return;
    } else if (u >= 0xD800 && u <= 0xDBFF) {
        r->high = u;
        return; /* the escape stays held until its low half */
    } else {
        put_char(r, u, out);
    }
    r->n_held = 0;
}

static void string_byte(json_reprint *r, unsigned char c, bytebuf *out)
{
    if (r->hex >= 0) {
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (v < 0) {
            fail(r);
            return;
        }
        hold(r, (char)c);
        r->unit = r->unit * 16 + (uint32_t)v;
        if (++r->hex == 4) {
            r->hex = -1;
            code_unit(r, out);
        }
        return;
    }
    if (r->escape) {
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *e = c ? strchr(from, c) : NULL;
        r->escape = false;
        if (c == 'u') {
            hold(r, 'u');
            r->hex = 0;
            r->unit = 0;
            return;
        }
        if (!e || r->high) { /* a high surrogate must be followed by \u */
            fail(r);
            return;
        }
        put_char(r, (unsigned char)to[e - from], out);
        r->n_held = 0;
        return;
    }
    if (r->high && c != '\\') {
        fail(r);
        return;
    }
    if (c == '\\') {
        r->escape = true;
        hold(r, '\\');
    } else if (c == '"') {
        bytebuf_append(out, "\"", 1);
        r->token = TOKEN_NONE;
        if (r->key)
            r->expect = EXPECT_COLON;
        else
            after_value(r);
    } else if (c < 0x20) {
        put_char(r, c, out); /* cJSON reads raw control characters and prints them escaped */
    } else if (!r->nul) {
        bytebuf_append(out, &c, 1); /* bytes as they are: cJSON neither decodes nor checks UTF-8 */
    }
}

/* The byte after a number or literal: print it as cJSON would, or refuse it. */
static void end_scalar(json_reprint *r, bytebuf *out)
{
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(r->held, r->n_held, &end, false);
    char *text = v && end == r->held + r->n_held ? cJSON_PrintUnformatted(v) : NULL;
    cJSON_Delete(v);
    r->token = TOKEN_NONE;
    r->n_held = 0;
    if (!text) {
        fail(r);
        return;
    }
    bytebuf_puts(out, text);
    free(text);
    after_value(r);
}

static void open_container(json_reprint *r, char c, bytebuf *out)
{
    if (r->depth == JSON_REPRINT_DEPTH) {
        fail(r);
        return;
    }
    r->stack[r->depth++] = c;
    bytebuf_append(out, &c, 1);
    r->expect = c == '{' ? EXPECT_KEY_OR_CLOSE : EXPECT_VALUE_OR_CLOSE;
}

static void close_container(json_reprint *r, char c, bytebuf *out)
{
    if (r->depth == 0 || r->stack[r->depth - 1] != (c == '}' ? '{' : '[')) {
        fail(r);
        return;
    }
    r->depth--;
    bytebuf_append(out, &c, 1);
    after_value(r);
}

static void open_string(json_reprint *r, bool key, bytebuf *out)
{
    bytebuf_append(out, "\"", 1);
    r->token = TOKEN_STRING;
    r->key = key;
    r->escape = r->nul = false;
    r->hex = -1;
    r->high = 0;
}

static void value_start(json_reprint *r, char c, bytebuf *out)
{
    if (c == '{' || c == '[')
        open_container(r, c, out);
    else if (c == '"')
        open_string(r, false, out);
    else if (c == '-' || (c >= '0' && c <= '9'))
        r->token = TOKEN_NUMBER, hold(r, c);
    else if (c == 't' || c == 'f' || c == 'n')
        r->token = TOKEN_LITERAL, hold(r, c);
    else
        fail(r);
}

/* A byte between tokens (not whitespace). */
static void between(json_reprint *r, char c, bytebuf *out)
{
    switch (r->expect) {
    case EXPECT_KEY_OR_CLOSE:
        if (c == '}') {
            close_container(r, c, out);
            return;
        }
        /* fall through */
    case EXPECT_KEY:
        if (c == '"') open_string(r, true, out);
        else fail(r);
        return;
    case EXPECT_COLON:
        if (c != ':') {
            fail(r);
            return;
        }
        bytebuf_append(out, ":", 1);
        r->expect = EXPECT_VALUE;
        return;
    case EXPECT_COMMA_OR_CLOSE:
        if (c == '}' || c == ']') {
            close_container(r, c, out);
            return;
        }
        if (c != ',') {
            fail(r);
            return;
        }
        bytebuf_append(out, ",", 1);
        r->expect = r->stack[r->depth - 1] == '{' ? EXPECT_KEY : EXPECT_VALUE;
        return;
    case EXPECT_VALUE_OR_CLOSE:
        if (c == ']') {
            close_container(r, c, out);
            return;
        }
        /* fall through */
    default:
        value_start(r, c, out);
    }
}

static bool literal_prefix(const json_reprint *r)
{
    static const char *const words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++)
        if (r->n_held <= strlen(words[k]) && memcmp(words[k], r->held, r->n_held) == 0) return true;
    return false;
}

size_t json_reprint_feed(json_reprint *r, const char *s, size_t n, bytebuf *out)
{
    size_t i = 0;
    while (i < n && r->expect != EXPECT_DONE && r->expect != EXPECT_FAIL) {
        unsigned char c = (unsigned char)s[i];
        if (r->token == TOKEN_STRING) {
            string_byte(r, c, out);
            i++;
            continue;
        }
        if (r->token == TOKEN_NUMBER && c && strchr("0123456789+-eE.", c)) { /* what cJSON's number reads */
            hold(r, (char)c);
            i++;
            continue;
        }
        if (r->token == TOKEN_LITERAL && c >= 'a' && c <= 'z') {
            hold(r, (char)c);
            if (!literal_prefix(r)) fail(r);
            i++;
            continue;
        }
        if (r->token != TOKEN_NONE) { /* c ends the number or literal; it is read next round */
            end_scalar(r, out);
            continue;
        }
        i++;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
        between(r, (char)c, out);
    }
    return i;
}
