/* statecache.h - the recurrent-state slots of a hybrid model (engine.h: engine_seq.state) and
 * the snapshots of prefixes kept in some of them.  Pure bookkeeping (no tensors, no engine, no
 * locks), the scheduler's, beside the KV block allocator (kvcache.h).
 *
 * A slot is in one of three states:
 *   - running:  the state of one running sequence (statecache_take .. statecache_put);
 *   - snapshot: a copy of some sequence's state after the first n tokens of a prefix (n a
 *               multiple of ENGINE_KV_BLOCK), kept with those tokens in least-recently-used
 *               order, at most max_snapshots of them; reused (copied into a running slot) by
 *               a sequence whose prompt starts with the same tokens;
 *   - free.
 * The pool has room for one running slot per row plus the snapshots, so a row never waits
 * for a slot; a snapshot that needs a slot when none is free evicts the oldest one. */
#ifndef INFERD_SCHED_STATECACHE_H
#define INFERD_SCHED_STATECACHE_H

#include <stdint.h>

typedef struct statecache statecache;

typedef struct statecache_counts {
    int running, snapshots, free;
} statecache_counts;

/* n_slots engine state slots, at most max_snapshots of them snapshots (the rest, at least one
 * per row, for running sequences).  NULL when memory ran out or the numbers make no sense. */
statecache *statecache_create(int n_slots, int max_snapshots);
void statecache_free(statecache *c);

/* A free slot for a running sequence, or -1 when every slot runs (cannot happen with at most
 * n_slots - max_snapshots rows running). */
int statecache_take(statecache *c);
/* A running slot goes back to the free ones. */
void statecache_put(statecache *c, int slot);

/* The longest snapshot of tokens[0..n) with n <= max_tokens: its slot and *n_tokens, or -1.
 * A hit moves the snapshot to the most recently used end. */
int statecache_lookup(statecache *c, const int32_t *tokens, int max_tokens, int *n_tokens);
/* A slot to hold the state after tokens[0..n_tokens): a free one, or the least recently used
 * snapshot's.  -1 when the same prefix has a snapshot already (nothing to copy), when no
 * snapshots are kept, or when memory ran out.  The caller copies the state in at once. */
int statecache_snapshot(statecache *c, const int32_t *tokens, int n_tokens);

/* Forgets the snapshot in `slot` if it still holds tokens[0..n_tokens) (it may have been
 * evicted and reused since). */
void statecache_drop(statecache *c, int slot, const int32_t *tokens, int n_tokens);

statecache_counts statecache_count(const statecache *c);

#endif
