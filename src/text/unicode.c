/* unicode.c - UTF-8 coding and category lookup over the generated range table. */
#include "unicode.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

/* The index of the entry of a sorted table of disjoint ranges that holds cp, or -1.  Every
 * generated table's entries begin with `uint32_t lo, hi` (as unicode_cp_range), whatever
 * follows; size is one entry's. */
static ptrdiff_t range_find(const void *table, size_t n, size_t size, uint32_t cp)
{
    const unsigned char *t = table;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (((const unicode_cp_range *)(t + mid * size))->hi < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && ((const unicode_cp_range *)(t + lo * size))->lo <= cp ? (ptrdiff_t)lo : -1;
}

unsigned unicode_flags(uint32_t cp)
{
    if (cp < 256)
        return unicode_latin1[cp];
    /* The ranges cover U+0000..U+10FFFF without gaps; beyond it, nothing. */
    ptrdiff_t k = range_find(unicode_ranges, unicode_n_ranges, sizeof *unicode_ranges, cp);
    return k < 0 ? 0 : unicode_ranges[k].flags;
}

unsigned unicode_case(uint32_t cp)
{
    ptrdiff_t k = range_find(unicode_case_ranges, unicode_n_case_ranges, sizeof *unicode_case_ranges, cp);
    return k < 0 ? 0 : unicode_case_ranges[k].flags;
}


/* ---- NFC -----------------------------------------------------------------------------------
 * UAX #15: decompose every character fully (canonical mappings only), sort each run of
 * non-starters by combining class (stable), then recompose: a character joins the last
 * starter when a primary composite exists for the pair and no character between them blocks
 * it (one of class 0, or of a class >= its own). */

/* Hangul syllables are L V [T] jamo sequences numbered arithmetically (Unicode ch. 3.12). */
enum {
    HANGUL_S_BASE = 0xAC00,
    HANGUL_L_BASE = 0x1100,
    HANGUL_V_BASE = 0x1161,
    HANGUL_T_BASE = 0x11A7, /* one below the first trailing consonant: T index 0 = none */
    HANGUL_L_COUNT = 19,
    HANGUL_V_COUNT = 21,
    HANGUL_T_COUNT = 28,
    HANGUL_N_COUNT = HANGUL_V_COUNT * HANGUL_T_COUNT,
    HANGUL_S_COUNT = HANGUL_L_COUNT * HANGUL_N_COUNT,
};

/* A byte that is not valid UTF-8 goes through normalization as this pseudo code point plus
 * the byte: class 0, no mapping, no composite, so it stays and blocks what is around it. */
#define NFC_RAW_BYTE 0x110000u

/* Every table entry starts at U+0300 or later: below it no lookup is needed. */
#define NFC_FIRST_TABLED 0x300u

static unsigned ccc_of(uint32_t cp)
{
    if (cp < NFC_FIRST_TABLED)
        return 0;
    ptrdiff_t k = range_find(unicode_ccc, unicode_n_ccc, sizeof *unicode_ccc, cp);
    return k < 0 ? 0 : unicode_ccc[k].ccc;
}

static bool nfc_touches(uint32_t cp)
{
    return cp >= NFC_FIRST_TABLED &&
           range_find(unicode_nfc_touch, unicode_n_nfc_touch, sizeof *unicode_nfc_touch, cp) >= 0;
}

static const unicode_decomp_entry *decomp_of(uint32_t cp)
{
    size_t lo = 0, hi = unicode_n_decomp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (unicode_decomp[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < unicode_n_decomp && unicode_decomp[lo].cp == cp ? &unicode_decomp[lo] : NULL;
}

/* The primary composite of a + b, or 0 when there is none. */
static uint32_t compose_pair(uint32_t a, uint32_t b)
{
    if (a - HANGUL_L_BASE < HANGUL_L_COUNT && b - HANGUL_V_BASE < HANGUL_V_COUNT)
        return HANGUL_S_BASE + ((a - HANGUL_L_BASE) * HANGUL_V_COUNT + (b - HANGUL_V_BASE)) *
                                   HANGUL_T_COUNT;
    if (a - HANGUL_S_BASE < HANGUL_S_COUNT && (a - HANGUL_S_BASE) % HANGUL_T_COUNT == 0 &&
        b - HANGUL_T_BASE - 1 < HANGUL_T_COUNT - 1)
        return a + (b - HANGUL_T_BASE);
    size_t lo = 0, hi = unicode_n_comp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const unicode_comp_pair *p = &unicode_comp[mid];
        if (p->first < a || (p->first == a && p->second < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < unicode_n_comp && unicode_comp[lo].first == a && unicode_comp[lo].second == b)
        return unicode_comp[lo].composite;
    return 0;
}

typedef struct cpvec {
    uint32_t *v;
    size_t n, cap;
} cpvec;

/* Room for `more` code points; false when out of memory. */
static bool cpvec_reserve(cpvec *a, size_t more)
{
    if (a->n + more <= a->cap)
        return true;
    size_t cap = a->cap ? a->cap : 64;
    while (cap < a->n + more)
        cap *= 2;
    uint32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v)
        return false;
    a->v = v;
    a->cap = cap;
    return true;
}

/* Appends the full canonical decomposition of cp (at most 4 code points). */
static bool decompose(uint32_t cp, cpvec *a)
{
    if (!cpvec_reserve(a, 4))
        return false;
    if (cp - HANGUL_S_BASE < HANGUL_S_COUNT) {
        uint32_t s = cp - HANGUL_S_BASE, t = s % HANGUL_T_COUNT;
        a->v[a->n++] = HANGUL_L_BASE + s / HANGUL_N_COUNT;
        a->v[a->n++] = HANGUL_V_BASE + (s % HANGUL_N_COUNT) / HANGUL_T_COUNT;
        if (t)
            a->v[a->n++] = HANGUL_T_BASE + t;
        return true;
    }
    const unicode_decomp_entry *d = cp >= 0xC0 && cp < NFC_RAW_BYTE ? decomp_of(cp) : NULL;
    if (!d) {
        a->v[a->n++] = cp;
        return true;
    }
    for (int k = 0; k < d->len; k++)
        a->v[a->n++] = unicode_decomp_cps[d->off + k];
    return true;
}

static int cmp_u64(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return a < b ? -1 : a > b;
}

/* Stable sort of v[0..n) (non-starters) by combining class.  Short runs, the only ones real
 * text has, use insertion sort; a long run (hostile input) sorts (class, position) keys so
 * that it stays O(n log n). */
static bool sort_by_class(uint32_t *v, size_t n)
{
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = v[i];
            unsigned k = ccc_of(c);
            size_t j = i;
            for (; j > 0 && ccc_of(v[j - 1]) > k; j--)
                v[j] = v[j - 1];
            v[j] = c;
        }
        return true;
    }
    uint64_t *key = malloc(n * sizeof *key);
    uint32_t *copy = malloc(n * sizeof *copy);
    if (!key || !copy) {
        free(key);
        free(copy);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        key[i] = (uint64_t)ccc_of(v[i]) << 32 | i;
        copy[i] = v[i];
    }
    qsort(key, n, sizeof *key, cmp_u64);
    for (size_t i = 0; i < n; i++)
        v[i] = copy[(uint32_t)key[i]];
    free(key);
    free(copy);
    return true;
}

static bool canonical_order(cpvec *a)
{
    for (size_t i = 0; i < a->n;) {
        if (ccc_of(a->v[i]) == 0) {
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < a->n && ccc_of(a->v[j]) != 0)
            j++;
        if (j - i > 1 && !sort_by_class(a->v + i, j - i))
            return false;
        i = j;
    }
    return true;
}

/* Canonical composition in place. */
static void compose(cpvec *a)
{
    size_t w = 0, starter = SIZE_MAX;
    unsigned last = 0; /* class of the last character kept after the starter */
    for (size_t i = 0; i < a->n; i++) {
        uint32_t c = a->v[i];
        unsigned k = ccc_of(c);
        if (starter != SIZE_MAX && (w == starter + 1 || (last != 0 && last < k))) {
            uint32_t comp = compose_pair(a->v[starter], c);
            if (comp) {
                a->v[starter] = comp;
                continue;
            }
        }
        if (k == 0)
            starter = w;
        last = k;
        a->v[w++] = c;
    }
    a->n = w;
}

int unicode_nfc(const char *s, size_t n, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = n;
    bool touched = false;
    for (size_t i = 0; i < n && !touched;) {
        uint32_t cp;
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        i += (size_t)utf8_decode(s + i, n - i, &cp);
        touched = cp != UTF8_INVALID && nfc_touches(cp);
    }
    if (!touched)
        return 0;

    cpvec a = {0};
    bool ok = true;
    for (size_t i = 0; i < n && ok;) {
        uint32_t cp;
        int len = utf8_decode(s + i, n - i, &cp);
        /* An ill-formed byte is kept as it is, one at a time (a raw-byte pseudo code point). */
        if (cp == UTF8_INVALID) len = 1;
        ok = decompose(cp == UTF8_INVALID ? NFC_RAW_BYTE + (unsigned char)s[i] : cp, &a);
        i += (size_t)len;
    }
    ok = ok && canonical_order(&a);
    char *buf = ok ? malloc(4 * a.n + 1) : NULL;
    if (!buf) {
        free(a.v);
        return -1;
    }
    compose(&a);
    size_t len = 0;
    for (size_t i = 0; i < a.n; i++) {
        if (a.v[i] >= NFC_RAW_BYTE)
            buf[len++] = (char)(a.v[i] - NFC_RAW_BYTE);
        else
            len += (size_t)utf8_encode(a.v[i], buf + len);
    }
    free(a.v);
    if (len == n && memcmp(buf, s, n) == 0) {
        free(buf); /* already normalized after all (e.g. a lone combining mark) */
        return 0;
    }
    *out = buf;
    *out_len = len;
    return 0;
}
