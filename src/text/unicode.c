/* unicode.c - UTF-8 coding and category lookup over the generated range table. */
#include "unicode.h"

unsigned unicode_flags(uint32_t cp)
{
    if (cp < 256)
        return unicode_latin1[cp];
    if (cp > 0x10FFFF)
        return 0;
    /* The ranges cover U+0000..U+10FFFF without gaps: find the last one starting <= cp. */
    size_t lo = 0, hi = unicode_n_ranges;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (unicode_ranges[mid].lo <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return unicode_ranges[lo].flags;
}

int unicode_seq_len(unsigned char b)
{
    if (b < 0xC2)
        return 1; /* ASCII, continuation bytes and the overlong leads C0/C1 */
    if (b < 0xE0)
        return 2;
    if (b < 0xF0)
        return 3;
    if (b < 0xF5)
        return 4;
    return 1;
}

/* Bounds of the second byte of a sequence with lead b (the rest are plain 80..BF); these rule
 * out overlong forms, surrogates and code points above U+10FFFF. */
static void second_byte_range(unsigned char b, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b == 0xE0)
        *lo = 0xA0;
    else if (b == 0xED)
        *hi = 0x9F;
    else if (b == 0xF0)
        *lo = 0x90;
    else if (b == 0xF4)
        *hi = 0x8F;
}

int unicode_decode(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    int len = unicode_seq_len(u[0]);
    if (len == 1 || (size_t)len > n) {
        *cp = UNICODE_INVALID;
        return 1;
    }
    unsigned char lo, hi;
    second_byte_range(u[0], &lo, &hi);
    if (u[1] < lo || u[1] > hi) {
        *cp = UNICODE_INVALID;
        return 1;
    }
    uint32_t c = u[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *cp = UNICODE_INVALID;
            return 1;
        }
        c = (c << 6) | (u[i] & 0x3F);
    }
    *cp = c;
    return len;
}

int unicode_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t unicode_complete_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    /* Only the last 3 bytes can belong to an unfinished sequence: find its lead byte. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        size_t i = n - back;
        if ((u[i] & 0xC0) == 0x80)
            continue; /* continuation byte: keep looking for the lead */
        int len = unicode_seq_len(u[i]);
        if (len == 1 || (size_t)len <= back)
            return n; /* ASCII/invalid lead, or the sequence is already complete */
        /* Incomplete: hold it back only if what is there so far could still become valid. */
        if (back >= 2) {
            unsigned char lo, hi;
            second_byte_range(u[i], &lo, &hi);
            if (u[i + 1] < lo || u[i + 1] > hi)
                return n;
        }
        return i;
    }
    return n;
}
