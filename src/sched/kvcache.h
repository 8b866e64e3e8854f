/* kvcache.h - the KV block allocator and automatic prefix cache: which pool block holds which
 * positions of which sequence.  Pure bookkeeping (no tensors, no engine, no locks): the
 * scheduler owns one, and the engine only ever sees the resulting block tables.
 *
 * Every block is in exactly one of three states:
 *   - used:   referenced by one or more sequences' block tables (refs > 0);
 *   - cached: referenced by nobody but still holding the K/V of a full block that is in the
 *             prefix index, kept in least-recently-used order and reused on a hit or evicted
 *             (oldest first) when a fresh block is needed;
 *   - free:   holding nothing anyone can find.
 *
 * The prefix index is content-addressed: a full block's key is hash(parent key, salt, its
 * ENGINE_KV_BLOCK token ids), so a key names the whole prefix up to the block's end, and a new
 * sequence reuses the longest chain of cached blocks that matches its first tokens.  The salt
 * stands for anything else that changes K/V (none today: one model, positions implied by the
 * chain).  A hit is checked against the stored parent key and tokens, so a 64-bit hash
 * collision cannot hand a sequence someone else's K/V.  Only full blocks are ever indexed,
 * and a sequence never writes into a block before its own end, so an indexed block is never
 * written again; the one exception, a sequence that must recompute the last position of a
 * fully cached prompt to get its logits, asks for copy-on-write (kvcache_cow) first.
 *
 * The scheduler keeps a second instance for a model's sliding-window layers (engine.h:
 * engine_kv_blocks_swa).  There a table's blocks before the window of the sequence's next
 * query are let go as it advances (kvcache_drop_before; their entries become -1), and a block
 * let go that is indexed stays cached like any other, so the windows of recent prefixes stay
 * findable until their blocks are needed (kvcache_match_window). */
#ifndef INFERD_SCHED_KVCACHE_H
#define INFERD_SCHED_KVCACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h" /* ENGINE_KV_BLOCK */

typedef struct kvcache kvcache;

/* One sequence's block table: blocks[i] holds positions [i*B, (i+1)*B). */
typedef struct kv_seq {
    int32_t *blocks; /* capacity: the cache's max_blocks_per_seq; -1: let go (kvcache_drop_before) */
    int n_blocks;
    int n_hashed;  /* leading blocks whose key is known (matched or committed) */
    uint64_t key;  /* key of block n_hashed-1 (0 before the first) */
} kv_seq;

typedef struct kvcache_counts {
    int used, cached, free;
} kvcache_counts;

/* A cache over n_blocks pool blocks, block tables of at most max_blocks_per_seq entries. NULL
 * when memory ran out. */
kvcache *kvcache_create(int n_blocks, int max_blocks_per_seq, uint64_t salt);
void kvcache_free(kvcache *c);

/* An empty table with room for max_blocks_per_seq blocks; false when memory ran out. */
bool kv_seq_init(kv_seq *q, const kvcache *c);
void kv_seq_free(kv_seq *q);

/* Blocks a new sequence could get now (free + cached). */
int kvcache_available(const kvcache *c);
kvcache_counts kvcache_count(const kvcache *c);

/* q must be empty: takes the longest run of cached full blocks whose tokens are tokens[0..]
 * (only blocks that end within n_tokens) into q.  Returns the positions they cover. */
int kvcache_match(kvcache *c, kv_seq *q, const int32_t *tokens, int n_tokens);
/* Makes q's blocks cover positions 0..n_tokens-1, appending fresh blocks (free ones first,
 * then evicting the least recently used cached ones).  All or nothing: false, q unchanged,
 * when too few blocks are available or n_tokens exceeds the table. */
bool kvcache_grow(kvcache *c, kv_seq *q, int n_tokens);
/* Before q writes into its block `index`: when that block is indexed or shared, q gets a fresh
 * private block instead and *src says what to copy from (returns 1; the caller copies the
 * K/V); 0 when q may write in place; -1 when no block is available (q unchanged). */
int kvcache_cow(kvcache *c, kv_seq *q, int index, int32_t *src);
/* q's positions 0..n_tokens-1 hold the K/V of tokens[0..n_tokens-1]: indexes its blocks that
 * became full.  A block whose content is already indexed under another block stays private. */
void kvcache_commit(kvcache *c, kv_seq *q, const int32_t *tokens, int n_tokens);
/* Rollback after speculative verification: q keeps only the blocks covering positions
 * 0..n_tokens-1 (never fewer than its committed ones); the blocks past them, which held the
 * K/V of rejected drafts, go back (the deepest first).  Positions past n_tokens in the last
 * kept block are simply written again by the sequence's next step. */
void kvcache_truncate(kvcache *c, kv_seq *q, int n_tokens);
/* Drops q's references (the deepest block first, so a chain is evicted from its tail) and
 * empties q.  Indexed blocks nobody uses any more stay cached. */
void kvcache_release(kvcache *c, kv_seq *q);

/* Sliding pools: q lets go of its blocks 0..first-1 (their entries become -1), the oldest
 * first; indexed ones stay cached. */
void kvcache_drop_before(kvcache *c, kv_seq *q, int first);
/* Blocks q holds (its entries that are not -1). */
int kvcache_held(const kv_seq *q);
/* Sliding pools: q must be empty.  The longest prefix of tokens[0..n_tokens) (whole blocks)
 * whose window is cached: every block from engine_swa_first_block(end - 1, window) to its end
 * is indexed under the chain of tokens.  q takes those blocks (the entries before them -1),
 * committed up to there; returns the positions covered (0: none). */
int kvcache_match_window(kvcache *c, kv_seq *q, const int32_t *tokens, int n_tokens, int window);

#endif
