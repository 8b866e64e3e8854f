/* utf8.c - see utf8.h.  Validation follows RFC 3629 (table 3-7 of the Unicode standard). */
#include "utf8.h"

#include <stdint.h>

static bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

/* Bytes a sequence starting with lead byte c announces; 0 for a byte that cannot start one. */
static int seq_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Length of the valid sequence at s[0..n), or 0 when it is invalid or truncated.  The second
 * byte's range is what rules out overlongs, surrogates and values above U+10FFFF. */
static size_t valid_seq(const unsigned char *s, size_t n)
{
    int len = seq_len(s[0]);
    if (len == 0 || (size_t)len > n) return 0;
    if (len == 1) return 1;
    unsigned char lo = 0x80, hi = 0xBF;
    if (s[0] == 0xE0) lo = 0xA0;
    else if (s[0] == 0xED) hi = 0x9F;
    else if (s[0] == 0xF0) lo = 0x90;
    else if (s[0] == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if (!is_cont(s[i])) return 0;
    return (size_t)len;
}

size_t utf8_complete_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    /* Look back over at most 3 continuation bytes for the lead byte of the last character. */
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = u[n - back];
        if (is_cont(c)) continue;
        int len = seq_len(c);
        return (len > 1 && (size_t)len > back) ? n - back : n;
    }
    return n;
}

bool utf8_append_valid(textbuf *b, const char *s, size_t n)
{
    static const char replacement[] = "\xEF\xBF\xBD";
    const unsigned char *u = (const unsigned char *)s;
    size_t run = 0; /* start of the current run of valid bytes, appended in one go */
    size_t i = 0;
    while (i < n) {
        size_t len = valid_seq(u + i, n - i);
        if (len) {
            i += len;
            continue;
        }
        if (!textbuf_append(b, s + run, i - run) || !textbuf_append(b, replacement, 3)) return false;
        i++;
        /* A broken sequence and the continuation bytes that follow it become one U+FFFD. */
        while (i < n && is_cont(u[i])) i++;
        run = i;
    }
    return textbuf_append(b, s + run, n - run);
}

bool utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t len = valid_seq(u + i, n - i);
        if (!len) return false;
        i += len;
    }
    return true;
}
