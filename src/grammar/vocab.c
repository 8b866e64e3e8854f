/* vocab.c - the vocabulary as the mask builder walks it: each normal token's bytes (control
 * tokens excluded; end-of-generation tokens listed apart), sorted, with the common prefix of
 * neighbours so that tokens sharing a prefix share the matcher's work. */
#include "grammar_impl.h"

#include <stdlib.h>
#include <string.h>


static const grammar_vocab *sort_vocab;
static int cmp_tokens(const void *x, const void *y)
{
    const grammar_vocab *v = sort_vocab;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    size_t la = v->len[a], lb = v->len[b];
    int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], la < lb ? la : lb);
    if (c) return c;
    return la < lb ? -1 : la > lb ? 1 : (a > b) - (a < b);
}

void grammar_vocab_free(grammar_vocab *v)
{
    if (!v) return;
    free(v->ids);
    free(v->off);
    free(v->len);
    free(v->tok);
    free(v->sbytes);
    free(v->pair_start);
    free(v->bytes);
    free(v->rank);
    free(v->eog);
    free(v);
}

int grammar_vocab_n_words(const grammar_vocab *v) { return v->n_words; }

/* Allocates v for n tokens of total bytes in all. */
static grammar_vocab *vocab_alloc(int n, size_t total)
{
    grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->n_vocab = n;
    v->n_words = (n + 31) / 32;
    v->off = malloc((size_t)n * sizeof *v->off);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->bytes = malloc(total + 1);
    v->ids = malloc((size_t)n * sizeof *v->ids);
    v->tok = malloc((size_t)n * sizeof *v->tok);
    v->sbytes = malloc(total + 1);
    v->pair_start = malloc((256 * 257 + 1) * sizeof *v->pair_start);
    v->rank = malloc((size_t)n * sizeof *v->rank);
    v->eog = malloc((size_t)n * sizeof *v->eog);
    if (!v->off || !v->len || !v->bytes || !v->ids || !v->tok || !v->sbytes || !v->pair_start || !v->rank || !v->eog) {
        grammar_vocab_free(v);
        return NULL;
    }
    return v;
}

/* Token i's bytes are in place (off, len; len 0: not a normal token): sorts, and links
 * neighbours by common prefix. */
static grammar_vocab *vocab_finish(grammar_vocab *v)
{
    for (int i = 0; i < v->n_vocab; i++) {
        v->rank[i] = -1;
        if (v->len[i]) v->ids[v->n_sorted++] = i;
    }
    sort_vocab = v; /* qsort has no context argument in C11; vocabularies are built at start-up */
    qsort(v->ids, (size_t)v->n_sorted, sizeof *v->ids, cmp_tokens);
    sort_vocab = NULL;
    size_t at = 0;
    for (int k = 0; k < v->n_sorted; k++) {
        int32_t id = v->ids[k];
        v->rank[id] = k;
        const unsigned char *b = v->bytes + v->off[id];
        int l = 0;
        if (k) {
            const struct grammar_vtok *pr = &v->tok[k - 1];
            int m = pr->len < v->len[id] ? pr->len : v->len[id];
            while (l < m && v->sbytes[pr->off + l] == b[l]) l++;
        }
        v->tok[k] = (struct grammar_vtok){id, 0, (uint32_t)at, v->len[id], (uint16_t)l};
        memcpy(v->sbytes + at, b, v->len[id]);
        at += v->len[id];
    }
    /* skip: right to left, following the skips already found over the runs that cannot be it */
    for (int k = v->n_sorted - 1; k >= 0; k--) {
        int j = k + 1;
        while (j < v->n_sorted && v->tok[j].lcp >= v->tok[k].lcp) j = v->tok[j].skip;
        v->tok[k].skip = j;
    }
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < v->n_sorted && v->sbytes[v->tok[k].off] < b) k++;
        v->byte_start[b] = k;
    }
    /* pair slots: b0 * 257 for the one-byte token b0, b0 * 257 + 1 + b1 for b0 b1 ... */
    for (int slot = 0, k = 0; slot <= 256 * 257; slot++) {
        for (; k < v->n_sorted; k++) {
            const unsigned char *tb = v->sbytes + v->tok[k].off;
            int ts = tb[0] * 257 + (v->tok[k].len > 1 ? 1 + tb[1] : 0);
            if (ts >= slot) break;
        }
        v->pair_start[slot] = k;
    }
    return v;
}

grammar_vocab *grammar_vocab_new(const tokenizer *t)
{
    int n = tokenizer_n_vocab(t);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int len = tokenizer_is_control(t, i) ? 0 : tokenizer_token_bytes(t, i, false, NULL, 0);
        if (len > 0) total += (size_t)len;
    }
    grammar_vocab *v = vocab_alloc(n, total);
    if (!v) return NULL;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        v->off[i] = (uint32_t)at;
        if (tokenizer_is_eog(t, i)) v->eog[v->n_eog++] = i;
        if (tokenizer_is_control(t, i)) continue;
        int len = tokenizer_token_bytes(t, i, false, (char *)v->bytes + at, (int)(total - at));
        if (len <= 0 || len > 65535) continue;
        v->len[i] = (uint16_t)len;
        at += (size_t)len;
    }
    return vocab_finish(v);
}

grammar_vocab *grammar_vocab_from_bytes(const char *const *tokens, const int *lens, int n, const int32_t *eog,
                                        int n_eog)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += lens[i] > 0 && lens[i] <= 65535 ? (size_t)lens[i] : 0;
    grammar_vocab *v = vocab_alloc(n, total);
    if (!v) return NULL;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        v->off[i] = (uint32_t)at;
        if (lens[i] <= 0 || lens[i] > 65535) continue;
        memcpy(v->bytes + at, tokens[i], (size_t)lens[i]);
        v->len[i] = (uint16_t)lens[i];
        at += (size_t)lens[i];
    }
    for (int i = 0; i < n_eog; i++) v->eog[v->n_eog++] = eog[i];
    return vocab_finish(v);
}
