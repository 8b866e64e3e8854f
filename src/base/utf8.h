/* utf8.h - UTF-8 as RFC 3629 and table 3-7 of the Unicode standard define it: no overlongs,
 * no surrogates, nothing above U+10FFFF.
 *
 * One replacement policy for every place that turns bytes into text (the detokenizer, the
 * stop-string matcher, JSON encoding): each maximal ill-formed subpart becomes one U+FFFD, as
 * the Unicode standard recommends (section 3.9, "U+FFFD Substitution of Maximal Subparts") and
 * as browsers and Python's "replace" decoder do.  A maximal subpart is the longest run that
 * starts a well-formed sequence (a lead byte and the continuation bytes it may still take), or
 * else a single byte. */
#ifndef INFERD_BASE_UTF8_H
#define INFERD_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bytebuf.h"

/* The code point utf8_decode reports for an ill-formed subpart. */
#define UTF8_INVALID 0xFFFFFFFFu

/* Decodes one character of s[0..n) (n >= 1): returns its length (1..4) and sets *cp; for an
 * ill-formed subpart (a truncated sequence at the end included) returns the subpart's length
 * (1..3) and sets *cp = UTF8_INVALID. */
int utf8_decode(const char *s, size_t n, uint32_t *cp);
/* Encodes cp (<= 0x10FFFF) into out; returns 1..4. */
int utf8_encode(uint32_t cp, char out[4]);

/* true when s[0..n) is well-formed. */
bool utf8_valid(const char *s, size_t n);

/* Length of the longest prefix of s[0..n) that does not end inside a character whose
 * remaining bytes may still arrive: a trailing well-formed but incomplete sequence is cut
 * off.  Everything else (complete, or ill-formed whatever follows) is kept. */
size_t utf8_complete_prefix(const char *s, size_t n);

/* Appends s[0..n) to b with each maximal ill-formed subpart replaced by U+FFFD.  false when
 * memory ran out. */
bool utf8_append_valid(bytebuf *b, const char *s, size_t n);

/* The same into out[0..cap): returns the bytes written.  A character that does not fit in
 * what is left of cap ends the copy (cap = 3 * n is always enough). */
size_t utf8_copy_valid(const char *s, size_t n, char *out, size_t cap);

#endif
