/* unicode.h - the little Unicode the tokenizers need beyond UTF-8 itself (base/utf8.h):
 * general-category classes per code point, from tables generated out of UnicodeData.txt
 * (scripts/gen_unicode.py -> unicode_data.c). */
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

typedef struct unicode_range {
    uint32_t lo, hi;
    uint8_t flags;
} unicode_range;

extern const unicode_range unicode_ranges[];
extern const size_t unicode_n_ranges;
extern const uint8_t unicode_latin1[256];

/* UCP_* bits of cp (0 for unassigned, out-of-range or UTF8_INVALID). */
unsigned unicode_flags(uint32_t cp);

#endif
