/* utf8.c - see utf8.h. */
#include "utf8.h"

#include <string.h>

static const char replacement[] = "\xEF\xBF\xBD";

static bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

/* Bytes a sequence starting with c announces; 0 for a byte that cannot start one. */
static int lead_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Range of the byte after lead c: it is what rules out overlongs, surrogates and values
 * above U+10FFFF (the later bytes are plain 80..BF). */
static bool second_ok(unsigned char c, unsigned char b)
{
    unsigned char lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    return b >= lo && b <= hi;
}

/* How many bytes of s[0..n) belong to a well-formed (possibly unfinished) prefix of the
 * sequence s starts, and its announced length in *want (0 for a byte that cannot lead). */
static size_t prefix_len(const unsigned char *s, size_t n, int *want)
{
    *want = lead_len(s[0]);
    if (*want <= 1) return *want == 1 ? 1 : 0;
    size_t k = 1;
    while (k < (size_t)*want && k < n && (k == 1 ? second_ok(s[0], s[1]) : is_cont(s[k]))) k++;
    return k;
}

int utf8_decode(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    int want;
    size_t k = prefix_len(u, n, &want);
    if (want == 0 || k < (size_t)want) {
        *cp = UTF8_INVALID;
        return k ? (int)k : 1;
    }
    uint32_t c = want == 1 ? u[0] : u[0] & (0x7Fu >> want);
    for (int i = 1; i < want; i++) c = (c << 6) | (u[i] & 0x3F);
    *cp = c;
    return want;
}

int utf8_encode(uint32_t cp, char out[4])
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

bool utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)utf8_decode(s + i, n - i, &cp);
        if (cp == UTF8_INVALID) return false;
    }
    return true;
}

size_t utf8_complete_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    /* Only the last 3 bytes can belong to an unfinished sequence: find its lead byte. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        size_t i = n - back;
        if (is_cont(u[i])) continue;
        int want;
        size_t k = prefix_len(u + i, back, &want);
        /* Held back only while what is there is all a well-formed start of a longer sequence. */
        return want > 1 && k == back && (size_t)want > back ? i : n;
    }
    return n;
}

bool utf8_append_valid(bytebuf *b, const char *s, size_t n)
{
    size_t run = 0; /* start of the current run of valid bytes, appended in one go */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = (size_t)utf8_decode(s + i, n - i, &cp);
        if (cp != UTF8_INVALID) {
            i += len;
            continue;
        }
        if (!bytebuf_append(b, s + run, i - run) || !bytebuf_append(b, replacement, 3)) return false;
        i += len;
        run = i;
    }
    return bytebuf_append(b, s + run, n - run);
}

size_t utf8_copy_valid(const char *s, size_t n, char *out, size_t cap)
{
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = (size_t)utf8_decode(s + i, n - i, &cp);
        const char *src = cp == UTF8_INVALID ? replacement : s + i;
        size_t out_len = cp == UTF8_INVALID ? 3 : len;
        if (w + out_len > cap) break;
        memcpy(out + w, src, out_len);
        w += out_len;
        i += len;
    }
    return w;
}
