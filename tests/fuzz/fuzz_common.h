/* fuzz_common.h - what every fuzz target shares.
 *
 * Each tests/fuzz/fuzz_<name>.c defines LLVMFuzzerTestOneInput (and, when it needs set-up,
 * LLVMFuzzerInitialize).  The same file is built twice: with libFuzzer (meson -Dfuzz=true,
 * clang) to search for crashes, and with replay.c's main() in the normal build, where it runs
 * every seed and every saved crash as a unit test.
 *
 * A target splits its one input into typed fields with fz_in so that mutations stay
 * meaningful (a flag byte stays a flag byte), and checks invariants with FZ_CHECK: a broken
 * invariant aborts, which libFuzzer reports as a crash and the replay test as a failure. */
#ifndef INFERD_FUZZ_COMMON_H
#define INFERD_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FZ_CHECK(cond)                                                                          \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);        \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

/* The rest of a fuzz input, consumed front to back.  Reads past the end give zeros/empty. */
typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

static inline uint8_t fz_u8(fz_in *in)
{
    if (in->n == 0) return 0;
    in->n--;
    return *in->p++;
}

static inline uint32_t fz_u32(fz_in *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8(in) << (8 * i);
    return v;
}

/* Bytes up to the next NUL (consumed, not included) or the end: a field a seed can be written
 * with printf '...\0...'. */
static inline const char *fz_field(fz_in *in, size_t *len)
{
    const char *s = (const char *)in->p;
    const uint8_t *nul = memchr(in->p, 0, in->n);
    size_t l = nul ? (size_t)(nul - in->p) : in->n;
    in->p += l + (nul ? 1 : 0);
    in->n -= l + (nul ? 1 : 0);
    *len = l;
    return s;
}

/* A NUL-terminated malloc'd copy of s[0..n) (the APIs under test take C strings). */
static inline char *fz_strndup(const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (!c) abort();
    memcpy(c, s, n);
    c[n] = 0;
    return c;
}

/* Reads n bytes at p, so that ASan checks the whole range, in a way the compiler must keep. */
static inline void fz_touch(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= b[i];
    __asm__ volatile("" : : "r"(x)); /* x is "used": the loop stays */
}

/* Independent UTF-8 validity check (RFC 3629: shortest form, no surrogates, <= U+10FFFF),
 * written from the definition rather than shared with src/, so the targets can compare. */
static inline bool fz_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        uint32_t cp = len == 1 ? c : c & (0x7F >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

#endif
