/* unicode.h - the little Unicode the tokenizers need: UTF-8 decoding that never fails (an
 * invalid byte is reported as such, length 1) and general-category classes per code point,
 * from tables generated out of UnicodeData.txt (scripts/gen_unicode.py -> unicode_data.c). */
#ifndef INFERD_UNICODE_H
#define INFERD_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Class bits of a code point (several may be set: a space separator is also UCP_SPACE). */
enum {
    UCP_LETTER = 1,   /* \p{L} */
    UCP_NUMBER = 2,   /* \p{N} */
    UCP_PUNCT = 4,    /* \p{P} */
    UCP_SYMBOL = 8,   /* \p{S} */
    UCP_MARK = 16,    /* \p{M} */
    UCP_SPACE = 32,   /* \s: the White_Space property */
    UCP_CONTROL = 64, /* Cc, Cf */
};

/* Returned by unicode_decode for a byte that does not start a valid sequence. */
#define UNICODE_INVALID 0xFFFFFFFFu

typedef struct unicode_range {
    uint32_t lo, hi;
    uint8_t flags;
} unicode_range;

extern const unicode_range unicode_ranges[];
extern const size_t unicode_n_ranges;
extern const uint8_t unicode_latin1[256];

/* UCP_* bits of cp (0 for unassigned, out-of-range or UNICODE_INVALID). */
unsigned unicode_flags(uint32_t cp);

/* Length of the UTF-8 sequence announced by lead byte b (1 for bytes that cannot lead). */
int unicode_seq_len(unsigned char b);
/* Decode one character of s[0..n) (n >= 1). Returns the bytes consumed (1..4) and the code point
 * in *cp; a malformed, overlong, surrogate or truncated sequence consumes 1 byte and gives
 * UNICODE_INVALID. */
int unicode_decode(const char *s, size_t n, uint32_t *cp);
/* Encode cp (<= 0x10FFFF) into out; returns 1..4 bytes. */
int unicode_encode(uint32_t cp, char out[4]);
/* Length of the longest prefix of s[0..n) that does not end inside an incomplete but so far valid
 * UTF-8 sequence: the bytes after it could still be completed by more input. */
size_t unicode_complete_prefix(const char *s, size_t n);

#endif
