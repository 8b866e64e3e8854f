/* words.c - see words.h. */
#include "words.h"

#include <stdlib.h>
#include <string.h>

static bool is_word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

typedef struct span {
    const char *p;
    int n, freq;
} span;

static int span_cmp_text(const void *a, const void *b)
{
    const span *x = a, *y = b;
    int n = x->n < y->n ? x->n : y->n, c = memcmp(x->p, y->p, (size_t)n);
    return c ? c : x->n - y->n;
}

static int span_cmp_freq(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->freq != y->freq) return y->freq - x->freq;
    return span_cmp_text(a, b);
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void words_free(words_list *l)
{
    for (int i = 0; l->word && i < l->n; i++) free(l->word[i]);
    free(l->word);
    free(l->freq);
    free(l->sorted);
    memset(l, 0, sizeof *l);
}

int words_collect(const char *text, size_t len, int max_words, words_list *out)
{
    memset(out, 0, sizeof *out);
    /* Every occurrence, then sorted by text so equal words are adjacent and counted. */
    size_t cap = len / (WORDS_MIN_LEN + 1) + 1, n_occ = 0;
    span *occ = malloc(cap * sizeof *occ);
    if (!occ) return -1;
    for (size_t i = 0; i < len;) {
        if (text[i] == '#' && (i == 0 || text[i - 1] == '\n')) { /* a comment line */
            while (i < len && text[i] != '\n') i++;
            continue;
        }
        if (!is_word_byte((unsigned char)text[i])) {
            i++;
            continue;
        }
        size_t j = i;
        bool lower = true;
        while (j < len && is_word_byte((unsigned char)text[j])) {
            lower = lower && text[j] >= 'a' && text[j] <= 'z';
            j++;
        }
        if (lower && j - i >= WORDS_MIN_LEN && j - i <= WORDS_MAX_LEN && n_occ < cap)
            occ[n_occ++] = (span){text + i, (int)(j - i), 1};
        i = j;
    }
    qsort(occ, n_occ, sizeof *occ, span_cmp_text);
    size_t n_distinct = 0;
    for (size_t i = 0; i < n_occ; i++) {
        if (n_distinct > 0 && span_cmp_text(&occ[n_distinct - 1], &occ[i]) == 0)
            occ[n_distinct - 1].freq++;
        else
            occ[n_distinct++] = occ[i];
    }
    qsort(occ, n_distinct, sizeof *occ, span_cmp_freq);
    int n = (int)(n_distinct < (size_t)max_words ? n_distinct : (size_t)max_words);
    out->word = calloc((size_t)n + 1, sizeof *out->word);
    out->freq = calloc((size_t)n + 1, sizeof *out->freq);
    out->sorted = calloc((size_t)n + 1, sizeof *out->sorted);
    bool ok = out->word && out->freq && out->sorted;
    for (int i = 0; ok && i < n; i++) {
        ok = (out->word[i] = strndup(occ[i].p, (size_t)occ[i].n)) != NULL;
        out->freq[i] = occ[i].freq;
        out->sorted[i] = out->word[i];
        out->n = i + 1;
    }
    free(occ);
    if (!ok) {
        words_free(out);
        return -1;
    }
    qsort(out->sorted, (size_t)out->n, sizeof *out->sorted, str_cmp);
    return 0;
}

char *words_corpus(const words_list *l, size_t *len)
{
    size_t total = 1;
    for (int i = 0; i < l->n; i++) total += (strlen(l->word[i]) + 1) * 10;
    char *s = malloc(total), *p = s;
    if (!s) return NULL;
    for (int i = 0; i < l->n; i++) {
        int reps = l->freq[i] < 2 ? 2 : l->freq[i] > 10 ? 10 : l->freq[i];
        size_t n = strlen(l->word[i]);
        for (int r = 0; r < reps; r++) {
            *p++ = ' ';
            memcpy(p, l->word[i], n);
            p += n;
        }
    }
    *p = '\0';
    *len = (size_t)(p - s);
    return s;
}

bool words_has(const words_list *l, const char *w, size_t n)
{
    int lo = 0, hi = l->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const char *s = l->sorted[mid];
        int c = strncmp(s, w, n);
        if (c == 0) c = s[n] == '\0' ? 0 : 1; /* s is longer than w */
        if (c == 0) return true;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return false;
}
