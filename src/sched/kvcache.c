/* kvcache.c - see kvcache.h: the block pool's three lists (used blocks are on none), the
 * content-addressed index of full blocks, and per-sequence block tables. */
#include "kvcache.h"

#include <stdlib.h>
#include <string.h>

#define B ENGINE_KV_BLOCK
#define NONE (-1)

typedef struct kv_block {
    int32_t refs;
    int32_t prev, next; /* the LRU list (cached) or the free list (next only) */
    int32_t chain;      /* next block in the same index bucket */
    bool indexed;
    uint64_t key, parent; /* valid once committed (kept for private duplicates too) */
} kv_block;

struct kvcache {
    int n_blocks, max_per_seq;
    uint64_t salt;
    kv_block *b;
    int32_t *tokens;  /* [n_blocks][B]: an indexed block's tokens, to verify a hit */
    int32_t *buckets; /* index heads, mask + 1 of them */
    uint32_t mask;
    int32_t free_head;
    int32_t lru_head, lru_tail; /* head: least recently used */
    int n_free, n_cached;
};

/* ---- keys and the index ------------------------------------------------------------------ */

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* The key of a block whose parent's key is `parent`: names the whole prefix.  Never 0, which
 * stands for "no parent". */
static uint64_t block_key(const kvcache *c, uint64_t parent, const int32_t *t)
{
    uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ull) ^ c->salt;
    for (int i = 0; i < B; i++) h = mix(h ^ (uint32_t)t[i]);
    return h ? h : 1;
}

static int32_t index_find(const kvcache *c, uint64_t parent, const int32_t *t)
{
    uint64_t key = block_key(c, parent, t);
    for (int32_t id = c->buckets[key & c->mask]; id != NONE; id = c->b[id].chain) {
        const kv_block *k = &c->b[id];
        if (k->key == key && k->parent == parent && !memcmp(c->tokens + (size_t)id * B, t, B * sizeof *t)) return id;
    }
    return NONE;
}

static void index_add(kvcache *c, int32_t id, const int32_t *t)
{
    kv_block *k = &c->b[id];
    memcpy(c->tokens + (size_t)id * B, t, B * sizeof *t);
    k->indexed = true;
    k->chain = c->buckets[k->key & c->mask];
    c->buckets[k->key & c->mask] = id;
}

static void index_remove(kvcache *c, int32_t id)
{
    int32_t *link = &c->buckets[c->b[id].key & c->mask];
    while (*link != id) link = &c->b[*link].chain;
    *link = c->b[id].chain;
    c->b[id].indexed = false;
}

/* ---- the lists ------------------------------------------------------------------------------- */

static void lru_unlink(kvcache *c, int32_t id)
{
    kv_block *k = &c->b[id];
    if (k->prev != NONE) c->b[k->prev].next = k->next;
    else c->lru_head = k->next;
    if (k->next != NONE) c->b[k->next].prev = k->prev;
    else c->lru_tail = k->prev;
    k->prev = k->next = NONE;
    c->n_cached--;
}

static void lru_append(kvcache *c, int32_t id)
{
    kv_block *k = &c->b[id];
    k->prev = c->lru_tail;
    k->next = NONE;
    if (c->lru_tail != NONE) c->b[c->lru_tail].next = id;
    else c->lru_head = id;
    c->lru_tail = id;
    c->n_cached++;
}

/* A block for new K/V: a free one, else the least recently used cached one (forgotten). */
static int32_t block_take_fresh(kvcache *c)
{
    int32_t id = c->free_head;
    if (id != NONE) {
        c->free_head = c->b[id].next;
        c->n_free--;
    } else if ((id = c->lru_head) != NONE) {
        lru_unlink(c, id);
        index_remove(c, id);
    } else {
        return NONE;
    }
    c->b[id].refs = 1;
    c->b[id].next = NONE;
    return id;
}

static void block_ref(kvcache *c, int32_t id)
{
    if (c->b[id].refs++ == 0) lru_unlink(c, id); /* a cached block back in use */
}

static void block_unref(kvcache *c, int32_t id)
{
    kv_block *k = &c->b[id];
    if (--k->refs > 0) return;
    if (k->indexed) {
        lru_append(c, id);
    } else {
        k->next = c->free_head;
        c->free_head = id;
        c->n_free++;
    }
}

/* ---- the interface ------------------------------------------------------------------------------ */

kvcache *kvcache_create(int n_blocks, int max_blocks_per_seq, uint64_t salt)
{
    if (n_blocks < 1 || max_blocks_per_seq < 1) return NULL;
    kvcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    uint32_t n_buckets = 16;
    while (n_buckets < 2u * (uint32_t)n_blocks && n_buckets < (1u << 30)) n_buckets <<= 1;
    c->n_blocks = n_blocks;
    c->max_per_seq = max_blocks_per_seq;
    c->salt = salt;
    c->mask = n_buckets - 1;
    c->b = calloc((size_t)n_blocks, sizeof *c->b);
    c->tokens = malloc((size_t)n_blocks * B * sizeof *c->tokens);
    c->buckets = malloc(n_buckets * sizeof *c->buckets);
    if (!c->b || !c->tokens || !c->buckets) {
        kvcache_free(c);
        return NULL;
    }
    for (uint32_t i = 0; i < n_buckets; i++) c->buckets[i] = NONE;
    for (int i = 0; i < n_blocks; i++) /* free list in id order: the lowest ids are used first */
        c->b[i] = (kv_block){.prev = NONE, .next = i + 1 < n_blocks ? i + 1 : NONE, .chain = NONE};
    c->free_head = 0;
    c->n_free = n_blocks;
    c->lru_head = c->lru_tail = NONE;
    return c;
}

void kvcache_free(kvcache *c)
{
    if (!c) return;
    free(c->b);
    free(c->tokens);
    free(c->buckets);
    free(c);
}

bool kv_seq_init(kv_seq *q, const kvcache *c)
{
    *q = (kv_seq){0};
    q->blocks = malloc((size_t)c->max_per_seq * sizeof *q->blocks);
    return q->blocks != NULL;
}

void kv_seq_free(kv_seq *q)
{
    free(q->blocks);
    *q = (kv_seq){0};
}

int kvcache_available(const kvcache *c) { return c->n_free + c->n_cached; }

kvcache_counts kvcache_count(const kvcache *c)
{
    return (kvcache_counts){.used = c->n_blocks - c->n_free - c->n_cached, .cached = c->n_cached, .free = c->n_free};
}

int kvcache_match(kvcache *c, kv_seq *q, const int32_t *tokens, int n_tokens)
{
    while (q->n_blocks < c->max_per_seq && (q->n_blocks + 1) * B <= n_tokens) {
        int32_t id = index_find(c, q->key, tokens + (size_t)q->n_blocks * B);
        if (id == NONE) break;
        block_ref(c, id);
        q->blocks[q->n_blocks++] = id;
        q->key = c->b[id].key;
        q->n_hashed = q->n_blocks;
    }
    return q->n_blocks * B;
}

bool kvcache_grow(kvcache *c, kv_seq *q, int n_tokens)
{
    int want = (n_tokens + B - 1) / B;
    if (want > c->max_per_seq) return false;
    if (want - q->n_blocks > kvcache_available(c)) return false;
    while (q->n_blocks < want) q->blocks[q->n_blocks++] = block_take_fresh(c);
    return true;
}

int kvcache_cow(kvcache *c, kv_seq *q, int index, int32_t *src)
{
    int32_t old = q->blocks[index];
    if (!c->b[old].indexed && c->b[old].refs == 1) return 0;
    int32_t fresh = block_take_fresh(c);
    if (fresh == NONE) return -1;
    q->blocks[index] = fresh;
    *src = old;
    /* a hashed block's parent is the key before it, even where that block is gone (-1) */
    const uint64_t parent = c->b[old].parent;
    /* The old block stays as it is until its next fresh use, which comes after the caller's
     * copy (the scheduler copies at once; a GPU copy is ordered before any later step). */
    block_unref(c, old);
    if (q->n_hashed > index) {
        q->n_hashed = index;
        q->key = parent;
    }
    return 1;
}

void kvcache_commit(kvcache *c, kv_seq *q, const int32_t *tokens, int n_tokens)
{
    while (q->n_hashed < q->n_blocks && (q->n_hashed + 1) * B <= n_tokens) {
        int32_t id = q->blocks[q->n_hashed];
        const int32_t *t = tokens + (size_t)q->n_hashed * B;
        if (id == NONE) { /* a sliding block already let go: the chain's key goes on */
            q->key = block_key(c, q->key, t);
            q->n_hashed++;
            continue;
        }
        kv_block *k = &c->b[id];
        if (!k->indexed) { /* an indexed block's key is its bucket: never rewritten */
            k->parent = q->key;
            k->key = block_key(c, q->key, t);
            if (index_find(c, q->key, t) == NONE) index_add(c, id, t);
        }
        q->key = k->key;
        q->n_hashed++;
    }
}

void kvcache_release(kvcache *c, kv_seq *q)
{
    for (int i = q->n_blocks - 1; i >= 0; i--)
        if (q->blocks[i] != NONE) block_unref(c, q->blocks[i]);
    q->n_blocks = q->n_hashed = 0;
    q->key = 0;
}

void kvcache_truncate(kvcache *c, kv_seq *q, int n_tokens)
{
    int keep = n_tokens > 0 ? (n_tokens + B - 1) / B : 0;
    if (keep < q->n_hashed) keep = q->n_hashed; /* an indexed block holds committed positions only */
    for (int i = q->n_blocks - 1; i >= keep; i--)
        if (q->blocks[i] != NONE) block_unref(c, q->blocks[i]);
    if (keep < q->n_blocks) q->n_blocks = keep;
}

void kvcache_drop_before(kvcache *c, kv_seq *q, int first)
{
    if (first > q->n_blocks) first = q->n_blocks;
    for (int i = 0; i < first; i++) { /* the oldest first: the first evicted of those indexed */
        if (q->blocks[i] == NONE) continue;
        block_unref(c, q->blocks[i]);
        q->blocks[i] = NONE;
    }
}

int kvcache_held(const kv_seq *q)
{
    int n = 0;
    for (int i = 0; i < q->n_blocks; i++) n += q->blocks[i] != NONE;
    return n;
}

/* The first block of the window that a prefix of `end` positions must still have: what the
 * query at its last position reads (a hit may recompute that position, engine.h). */
static int window_first_block(int end, int window)
{
    return engine_swa_first_block(end - 1, window);
}

int kvcache_match_window(kvcache *c, kv_seq *q, const int32_t *tokens, int n_tokens, int window)
{
    int n = n_tokens / B < c->max_per_seq ? n_tokens / B : c->max_per_seq;
    int best = 0, run = 0; /* run: the first block of the latest run of cached blocks */
    uint64_t key = 0;
    for (int i = 0; i < n; i++) {
        const int32_t *t = tokens + (size_t)i * B;
        if (index_find(c, key, t) == NONE) run = i + 1;
        else if (run <= window_first_block((i + 1) * B, window)) best = i + 1;
        key = block_key(c, key, t);
    }
    const int first = best ? window_first_block(best * B, window) : 0;
    key = 0;
    for (int i = 0; i < best; i++) {
        const int32_t *t = tokens + (size_t)i * B;
        int32_t id = i >= first ? index_find(c, key, t) : NONE; /* found in the first pass */
        if (id != NONE) block_ref(c, id);
        q->blocks[i] = id;
        key = block_key(c, key, t);
    }
    q->n_blocks = q->n_hashed = best;
    q->key = best ? key : 0;
    return best * B;
}
