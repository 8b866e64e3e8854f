/* json_reprint.h - a JSON value re-printed as it arrives, byte by byte, the way
 * cJSON_PrintUnformatted prints what cJSON_Parse read: no whitespace between tokens, strings
 * with cJSON's escapes (\" \\ \b \f \n \r \t, \u00XX for other control characters, everything
 * else as UTF-8), numbers as cJSON prints them.
 *
 * Why: a streamed tool call's arguments go out as the model writes them (chat_parse.c), and
 * their fragments must add up to exactly the arguments a non-streamed reply carries, which
 * are cJSON's print of the parsed object.  So each token is printed as soon as it is decided:
 * punctuation and string characters at once, a number or literal when the byte after it ends
 * it, an escape when complete.  Input that is not JSON stops the output where it broke (what
 * went out is then a prefix of valid JSON text).
 *
 * Pure: no allocation but the output's. */
#ifndef INFERD_JSON_REPRINT_H
#define INFERD_JSON_REPRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/bytebuf.h"

#define JSON_REPRINT_DEPTH 128 /* deeper values fail (no tool's arguments nest this far) */
#define JSON_REPRINT_TOKEN 64  /* a number or literal longer than this fails (cJSON reads 63) */

typedef struct json_reprint {
    uint8_t expect;        /* what may come between tokens (json_reprint.c's EXPECT_*) */
    uint8_t token;         /* the token being read (TOKEN_*) */
    bool key;              /* the string being read is an object key */
    bool escape;           /* string: after a backslash */
    int8_t hex;            /* string: \u digits read (0..4); -1 outside \u */
    bool nul;              /* string: a \u0000 ended its text (cJSON's strings are C strings) */
    uint32_t unit, high;   /* the \u code unit being read; a high surrogate waiting for its low */
    int depth;
    char stack[JSON_REPRINT_DEPTH]; /* '{' or '[' per open container */
    char held[JSON_REPRINT_TOKEN];  /* the number, literal or escape read so far, as written */
    size_t n_held;
} json_reprint;

void json_reprint_init(json_reprint *r);
/* Reads s[0..n) and appends to out what is decided (out's own flag says when memory ran out).
 * Returns the bytes read: fewer than n when the value ended (or failed) inside s. */
size_t json_reprint_feed(json_reprint *r, const char *s, size_t n, bytebuf *out);
bool json_reprint_done(const json_reprint *r);   /* the whole value was read */
bool json_reprint_failed(const json_reprint *r); /* not JSON: nothing more is printed */
/* The bytes read but not yet printed (a number, literal or escape still open), as written. */
const char *json_reprint_held(const json_reprint *r, size_t *len);

#endif
