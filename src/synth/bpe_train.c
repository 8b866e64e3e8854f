/* bpe_train.c - byte-level BPE training (see bpe_train.h).
 *
 * The corpus is reduced to its distinct words with their frequencies; each word is a list
 * of symbol ids (initially its bytes).  Pair frequencies live in a hash table, and a lazy
 * max-heap finds the best pair: every time a pair's count changes the new (count, pair) is
 * pushed, and popped entries whose count is stale are dropped.  Merging a pair rewrites the
 * words that contain it, after taking their pairs out of the counts and before putting the
 * new pairs back. */
#include "bpe_train.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/heap.h"

#define WORD_MAX_BYTES 64 /* longer runs are cut: keeps pathological inputs cheap */

int bpe_byte_text(unsigned char b, char *out)
{
    /* GPT-2: printable Latin-1 bytes stand for themselves, the others (controls, space,
     * DEL, NBSP, soft hyphen) are shifted to U+0100.. in byte order. */
    unsigned cp;
    bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    if (printable) {
        cp = b;
    } else {
        unsigned n = 0;
        for (unsigned c = 0; c < b; c++)
            if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae)) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}


/* ---- the training state ---------------------------------------------------------------------- */
typedef struct word {
    int32_t *sym;
    int len;
    int64_t freq;
} word;

typedef struct heap_ent {
    int64_t count;
    uint64_t pair;
} heap_ent;

/* Heap order: higher count first, then the smaller pair key (deterministic ties). */
static bool heap_before(const heap_ent *x, const heap_ent *y)
{
    return x->count > y->count || (x->count == y->count && x->pair < y->pair);
}

HEAP_DEFINE(pair_heap, heap_ent, heap_before)

typedef struct trainer {
    word *words;
    int n_words, cap_words, cap_off;
    int32_t *word_index; /* open addressing over words by bytes (during splitting) */
    size_t word_index_cap;
    const char *text;    /* word bytes are re-read from the text while splitting */
    size_t *word_off;    /* first occurrence of each word, for the byte comparison */

    uint64_t *pair_keys; /* open addressing; UINT64_MAX = empty */
    int64_t *pair_counts;
    size_t pair_cap, pair_used;

    pair_heap heap; /* lazy: stale entries are skipped when popped */

    char **tokens;
    int n_tokens, cap_tokens;
    int32_t *tok_index; /* open addressing over token texts */
    size_t tok_index_cap;

    char **merges;
    int n_merges, cap_merges;
    bool oom;
} trainer;

static bool grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return true;
    int c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---- pair counts + lazy heap ------------------------------------------------------------------ */
static size_t pair_slot(const trainer *t, uint64_t key)
{
    size_t mask = t->pair_cap - 1, i = hash_u64(key) & mask;
    while (t->pair_keys[i] != UINT64_MAX && t->pair_keys[i] != key) i = (i + 1) & mask;
    return i;
}

static bool pair_table_grow(trainer *t)
{
    size_t old_cap = t->pair_cap;
    uint64_t *old_keys = t->pair_keys;
    int64_t *old_counts = t->pair_counts;
    size_t cap = old_cap ? old_cap * 2 : 1 << 14;
    t->pair_keys = malloc(cap * sizeof *t->pair_keys);
    t->pair_counts = malloc(cap * sizeof *t->pair_counts);
    if (!t->pair_keys || !t->pair_counts) {
        free(t->pair_keys);
        free(t->pair_counts);
        t->pair_keys = old_keys;
        t->pair_counts = old_counts;
        return false;
    }
    memset(t->pair_keys, 0xff, cap * sizeof *t->pair_keys);
    t->pair_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old_keys[i] == UINT64_MAX) continue;
        size_t s = pair_slot(t, old_keys[i]);
        t->pair_keys[s] = old_keys[i];
        t->pair_counts[s] = old_counts[i];
    }
    free(old_keys);
    free(old_counts);
    return true;
}

static void pair_add(trainer *t, int32_t a, int32_t b, int64_t delta)
{
    if (t->oom) return;
    if ((t->pair_used + 1) * 2 > t->pair_cap && !pair_table_grow(t)) {
        t->oom = true;
        return;
    }
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t s = pair_slot(t, key);
    if (t->pair_keys[s] == UINT64_MAX) {
        t->pair_keys[s] = key;
        t->pair_counts[s] = 0;
        t->pair_used++;
    }
    t->pair_counts[s] += delta;
    if (delta > 0 && !pair_heap_push(&t->heap, (heap_ent){t->pair_counts[s], key})) t->oom = true;
}

static int64_t pair_count(const trainer *t, uint64_t key)
{
    size_t s = pair_slot(t, key);
    return t->pair_keys[s] == UINT64_MAX ? 0 : t->pair_counts[s];
}

static void word_pairs(trainer *t, const word *w, int64_t sign)
{
    for (int i = 0; i + 1 < w->len; i++) pair_add(t, w->sym[i], w->sym[i + 1], sign * w->freq);
}

/* ---- tokens ----------------------------------------------------------------------------------- */
static int32_t *tok_slot(trainer *t, const char *s)
{
    size_t mask = t->tok_index_cap - 1, i = hash_bytes(s, strlen(s)) & mask;
    while (t->tok_index[i] >= 0 && strcmp(t->tokens[t->tok_index[i]], s) != 0) i = (i + 1) & mask;
    return &t->tok_index[i];
}

static bool tok_index_rebuild(trainer *t, size_t cap)
{
    int32_t *idx = malloc(cap * sizeof *idx);
    if (!idx) return false;
    free(t->tok_index);
    t->tok_index = idx;
    t->tok_index_cap = cap;
    memset(idx, 0xff, cap * sizeof *idx);
    for (int i = 0; i < t->n_tokens; i++) *tok_slot(t, t->tokens[i]) = i;
    return true;
}

/* Id of token text s, adding it (taking ownership) when new; -1 on OOM. */
static int32_t tok_intern(trainer *t, char *s)
{
    if ((size_t)(t->n_tokens + 1) * 2 > t->tok_index_cap &&
        !tok_index_rebuild(t, t->tok_index_cap ? t->tok_index_cap * 2 : 1024)) {
        free(s);
        return -1;
    }
    int32_t *slot = tok_slot(t, s);
    if (*slot >= 0) {
        free(s);
        return *slot;
    }
    if (!grow((void **)&t->tokens, &t->cap_tokens, t->n_tokens + 1, sizeof *t->tokens)) {
        free(s);
        return -1;
    }
    t->tokens[t->n_tokens] = s;
    *slot = t->n_tokens;
    return t->n_tokens++;
}

/* ---- splitting the corpus into words ---------------------------------------------------------- */
typedef enum cclass { CC_LETTER, CC_DIGIT, CC_SPACE, CC_OTHER } cclass;

static cclass char_class(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return CC_LETTER;
    if (c >= '0' && c <= '9') return CC_DIGIT;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return CC_SPACE;
    return CC_OTHER;
}

static void add_word(trainer *t, size_t off, size_t n)
{
    if (t->oom || n == 0) return;
    if ((size_t)(t->n_words + 1) * 2 > t->word_index_cap) {
        size_t cap = t->word_index_cap ? t->word_index_cap * 2 : 4096;
        int32_t *idx = malloc(cap * sizeof *idx);
        if (!idx) {
            t->oom = true;
            return;
        }
        memset(idx, 0xff, cap * sizeof *idx);
        for (int w = 0; w < t->n_words; w++) {
            size_t i = hash_bytes(t->text + t->word_off[w], (size_t)t->words[w].len) & (cap - 1);
            while (idx[i] >= 0) i = (i + 1) & (cap - 1);
            idx[i] = w;
        }
        free(t->word_index);
        t->word_index = idx;
        t->word_index_cap = cap;
    }
    const char *s = t->text + off;
    size_t mask = t->word_index_cap - 1, i = hash_bytes(s, n) & mask;
    for (; t->word_index[i] >= 0; i = (i + 1) & mask) {
        word *w = &t->words[t->word_index[i]];
        if ((size_t)w->len == n && memcmp(t->text + t->word_off[t->word_index[i]], s, n) == 0) {
            w->freq++;
            return;
        }
    }
    if (!grow((void **)&t->words, &t->cap_words, t->n_words + 1, sizeof *t->words) ||
        !grow((void **)&t->word_off, &t->cap_off, t->n_words + 1, sizeof *t->word_off)) {
        t->oom = true;
        return;
    }
    word *w = &t->words[t->n_words];
    w->sym = malloc(n * sizeof *w->sym);
    if (!w->sym) {
        t->oom = true;
        return;
    }
    for (size_t k = 0; k < n; k++) w->sym[k] = (unsigned char)s[k];
    w->len = (int)n;
    w->freq = 1;
    t->word_off[t->n_words] = off;
    t->word_index[i] = t->n_words++;
}

/* GPT-2's split: " ?letters", " ?digits", " ?others", whitespace runs (a run followed by a
 * word gives its last space to that word). */
static void split_words(trainer *t, size_t len)
{
    const unsigned char *s = (const unsigned char *)t->text;
    size_t i = 0;
    while (i < len && !t->oom) {
        size_t j;
        cclass c = char_class(s[i]);
        if (c != CC_SPACE || (s[i] == ' ' && i + 1 < len && char_class(s[i + 1]) != CC_SPACE)) {
            size_t start = i;
            if (c == CC_SPACE) i++;
            cclass k = char_class(s[i]);
            for (j = i; j < len && char_class(s[j]) == k; j++) {}
            i = start;
            while (j - i > WORD_MAX_BYTES) { /* cut very long runs */
                add_word(t, i, WORD_MAX_BYTES);
                i += WORD_MAX_BYTES;
            }
            add_word(t, i, j - i);
            i = j;
            continue;
        }
        for (j = i; j < len && char_class(s[j]) == CC_SPACE; j++) {}
        if (j < len && j - i > 1) j--; /* leave the last one for the next word */
        add_word(t, i, j - i > WORD_MAX_BYTES ? WORD_MAX_BYTES : j - i);
        i += j - i > WORD_MAX_BYTES ? WORD_MAX_BYTES : j - i;
    }
}

/* ---- merging ---------------------------------------------------------------------------------- */
static bool word_has_pair(const word *w, int32_t a, int32_t b)
{
    for (int i = 0; i + 1 < w->len; i++)
        if (w->sym[i] == a && w->sym[i + 1] == b) return true;
    return false;
}

static void word_merge(word *w, int32_t a, int32_t b, int32_t id)
{
    int o = 0;
    for (int i = 0; i < w->len; i++) {
        if (i + 1 < w->len && w->sym[i] == a && w->sym[i + 1] == b) {
            w->sym[o++] = id;
            i++;
        } else {
            w->sym[o++] = w->sym[i];
        }
    }
    w->len = o;
}

static char *str_join(const char *a, const char *sep, const char *b)
{
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = malloc(la + ls + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, sep, ls);
    memcpy(s + la + ls, b, lb + 1);
    return s;
}

/* One merge of the most frequent pair; false when none is left worth merging. */
static bool merge_step(trainer *t)
{
    heap_ent best = {0, 0};
    bool found = false;
    while (t->heap.n > 0) {
        heap_ent e = pair_heap_pop(&t->heap);
        if (e.count < 2) break;
        if (pair_count(t, e.pair) == e.count) {
            best = e;
            found = true;
            break;
        }
    }
    if (!found) return false;
    int32_t a = (int32_t)(best.pair >> 32), b = (int32_t)(uint32_t)best.pair;
    char *text = str_join(t->tokens[a], "", t->tokens[b]);
    char *rule = str_join(t->tokens[a], " ", t->tokens[b]);
    if (!text || !rule ||
        !grow((void **)&t->merges, &t->cap_merges, t->n_merges + 1, sizeof *t->merges)) {
        free(text);
        free(rule);
        t->oom = true;
        return false;
    }
    /* The same text can be reached by two different splits: it stays one token. */
    int32_t id = tok_intern(t, text);
    if (id < 0) {
        free(rule);
        t->oom = true;
        return false;
    }
    t->merges[t->n_merges++] = rule;
    for (int w = 0; w < t->n_words && !t->oom; w++) {
        if (!word_has_pair(&t->words[w], a, b)) continue;
        word_pairs(t, &t->words[w], -1);
        word_merge(&t->words[w], a, b, id);
        word_pairs(t, &t->words[w], +1);
    }
    return !t->oom;
}

static void trainer_free_scratch(trainer *t)
{
    for (int w = 0; w < t->n_words; w++) free(t->words[w].sym);
    free(t->words);
    free(t->word_off);
    free(t->word_index);
    free(t->pair_keys);
    free(t->pair_counts);
    pair_heap_free(&t->heap);
    free(t->tok_index);
}

void bpe_vocab_free(bpe_vocab *v)
{
    for (int i = 0; i < v->n_tokens; i++) free(v->tokens[i]);
    for (int i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

int bpe_train(const char *text, size_t len, int max_tokens, int max_merges, bpe_vocab *out)
{
    memset(out, 0, sizeof *out);
    trainer t = {.text = text};
    for (int b = 0; b < 256 && !t.oom; b++) {
        char buf[4];
        int n = bpe_byte_text((unsigned char)b, buf);
        char *s = malloc((size_t)n + 1);
        if (!s) {
            t.oom = true;
            break;
        }
        memcpy(s, buf, (size_t)n);
        s[n] = '\0';
        if (tok_intern(&t, s) != b) t.oom = true;
    }
    if (!t.oom) split_words(&t, len);
    for (int w = 0; w < t.n_words && !t.oom; w++) word_pairs(&t, &t.words[w], +1);
    while (!t.oom && t.n_tokens < max_tokens && t.n_merges < max_merges && merge_step(&t)) {}
    trainer_free_scratch(&t);
    out->tokens = t.tokens;
    out->n_tokens = t.n_tokens;
    out->merges = t.merges;
    out->n_merges = t.n_merges;
    if (t.oom) {
        bpe_vocab_free(out);
        return -1;
    }
    return 0;
}
