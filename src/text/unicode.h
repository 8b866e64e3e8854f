/* unicode.h - the little Unicode the tokenizers need beyond UTF-8 itself (base/utf8.h):
 * general-category classes per code point, from tables generated out of UnicodeData.txt
 * (scripts/gen_unicode.py -> unicode_data.c), and NFC normalization (scripts/gen_unicode.py
 * --nfc -> unicode_nfc_data.c). */
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
    UCP_UPPER = 128,  /* Lu, Lt (with UCP_LETTER) */
    UCP_LOWER = 256,  /* Ll (with UCP_LETTER); a letter with neither is Lm or Lo */
};

typedef struct unicode_range {
    uint32_t lo, hi;
    uint16_t flags;
} unicode_range;

extern const unicode_range unicode_ranges[];
extern const size_t unicode_n_ranges;
extern const uint16_t unicode_latin1[256];

/* NFC tables (unicode_nfc_data.c). */
typedef struct unicode_ccc_range {
    uint32_t lo, hi;
    uint8_t ccc; /* canonical combining class, nonzero */
} unicode_ccc_range;
typedef struct unicode_decomp_entry {
    uint32_t cp;
    uint16_t off; /* into unicode_decomp_cps */
    uint8_t len;
} unicode_decomp_entry;
typedef struct unicode_comp_pair {
    uint32_t first, second, composite;
} unicode_comp_pair;
typedef struct unicode_cp_range {
    uint32_t lo, hi;
} unicode_cp_range;

extern const char unicode_nfc_version[];
extern const unicode_ccc_range unicode_ccc[];
extern const size_t unicode_n_ccc;
extern const unicode_decomp_entry unicode_decomp[];
extern const size_t unicode_n_decomp;
extern const uint32_t unicode_decomp_cps[];
extern const unicode_comp_pair unicode_comp[];
extern const size_t unicode_n_comp;
extern const unicode_cp_range unicode_nfc_touch[];
extern const size_t unicode_n_nfc_touch;

/* UCP_* bits of cp (0 for unassigned, out-of-range or UTF8_INVALID). */
unsigned unicode_flags(uint32_t cp);


/* NFC (canonical decomposition, canonical ordering, canonical composition) of the UTF-8 text
 * s[0..n).  Bytes that are not valid UTF-8 are kept as they are and block composition across
 * them.  Returns 0 with *out = NULL when s is already in NFC (the common case: no allocation),
 * 0 with a malloc'd *out of *out_len bytes otherwise, -1 when out of memory. */
int unicode_nfc(const char *s, size_t n, char **out, size_t *out_len);

#endif
