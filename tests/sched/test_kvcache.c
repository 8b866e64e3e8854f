/* test_kvcache.c - the KV block allocator and prefix cache alone: block states and counts,
 * hits at every boundary, LRU eviction from a chain's tail, copy-on-write, fragmented reuse,
 * that a hash match is verified against the tokens, and the rollback of speculative drafts; the
 * sliding-window instance: blocks let go as positions leave the window, windows found again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sched/kvcache.h"

#define B ENGINE_KV_BLOCK

/* n tokens: a conversation `id` (first token), then a pattern. */
static void tokens(int32_t *t, int n, int id)
{
    for (int i = 0; i < n; i++) t[i] = i == 0 ? id : 1000 + (i * 7) % 31;
}

static void assert_counts(const kvcache *c, int used, int cached, int free_)
{
    kvcache_counts k = kvcache_count(c);
    assert_int_equal(k.used, used);
    assert_int_equal(k.cached, cached);
    assert_int_equal(k.free, free_);
}

/* A sequence that computed n tokens: blocks, commit; left running (not released). */
static void run_seq(kvcache *c, kv_seq *q, const int32_t *t, int n)
{
    assert_true(kv_seq_init(q, c));
    kvcache_match(c, q, t, n);
    assert_true(kvcache_grow(c, q, n));
    kvcache_commit(c, q, t, n);
}

static void test_grow_release_counts(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(8, 4, 0);
    kv_seq q;
    assert_true(kv_seq_init(&q, c));
    assert_counts(c, 0, 0, 8);
    assert_true(kvcache_grow(c, &q, 1));
    assert_int_equal(q.n_blocks, 1);
    assert_true(kvcache_grow(c, &q, B)); /* still one block */
    assert_int_equal(q.n_blocks, 1);
    assert_true(kvcache_grow(c, &q, B + 1));
    assert_int_equal(q.n_blocks, 2);
    assert_false(kvcache_grow(c, &q, 4 * B + 1)); /* wider than a table: refused, nothing taken */
    assert_int_equal(q.n_blocks, 2);
    assert_counts(c, 2, 0, 6);
    kvcache_release(c, &q); /* nothing committed: both free again */
    assert_counts(c, 0, 0, 8);
    kv_seq_free(&q);
    kvcache_free(c);
}

static void test_all_or_nothing_when_full(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(4, 4, 0);
    kv_seq a, b;
    assert_true(kv_seq_init(&a, c));
    assert_true(kv_seq_init(&b, c));
    assert_true(kvcache_grow(c, &a, 3 * B));
    assert_false(kvcache_grow(c, &b, 2 * B)); /* one left, two asked: none taken */
    assert_int_equal(b.n_blocks, 0);
    assert_int_equal(kvcache_available(c), 1);
    assert_true(kvcache_grow(c, &b, B));
    assert_int_equal(kvcache_available(c), 0);
    kvcache_release(c, &a);
    kvcache_release(c, &b);
    kv_seq_free(&a);
    kv_seq_free(&b);
    kvcache_free(c);
}

/* Hits at every boundary: a prompt ending inside a block reuses the full blocks before it; one
 * ending exactly on a block edge reuses all its blocks; only full blocks are ever shared. */
static void test_prefix_hits_at_boundaries(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(16, 8, 0);
    int32_t t[8 * B];
    tokens(t, 8 * B, 5);
    kv_seq a;
    run_seq(c, &a, t, 2 * B + 10); /* 2 full blocks indexed, the third partial */
    kvcache_release(c, &a);
    assert_counts(c, 0, 2, 14);

    kv_seq q;
    assert_true(kv_seq_init(&q, c));
    assert_int_equal(kvcache_match(c, &q, t, B - 1), 0); /* shorter than a block: nothing */
    assert_int_equal(kvcache_match(c, &q, t, B), B);     /* exactly one block edge */
    kvcache_release(c, &q);
    assert_int_equal(kvcache_match(c, &q, t, 2 * B + 5), 2 * B); /* ends inside the third block */
    assert_counts(c, 2, 0, 14);                                  /* the hit took them out of the LRU */
    assert_true(kvcache_grow(c, &q, 3 * B));
    assert_int_equal(q.n_blocks, 3);
    kvcache_release(c, &q);
    assert_int_equal(kvcache_match(c, &q, t, 3 * B), 2 * B); /* the partial block was never indexed */
    kvcache_release(c, &q);

    /* Another conversation shares nothing, even with the same tokens after the first. */
    int32_t u[3 * B];
    tokens(u, 3 * B, 6);
    assert_int_equal(kvcache_match(c, &q, u, 3 * B), 0);
    /* A different token in block 2 stops the hit at block 1. */
    int32_t v[3 * B];
    memcpy(v, t, sizeof v);
    v[B + 3] = 77;
    assert_int_equal(kvcache_match(c, &q, v, 3 * B), B);
    kvcache_release(c, &q);
    kv_seq_free(&q);
    kv_seq_free(&a);
    kvcache_free(c);
}

/* Two running sequences share a cached prefix: both reference its blocks, which stay used
 * until the last lets go, then cached. */
static void test_shared_refs(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(8, 4, 0);
    int32_t t[4 * B];
    tokens(t, 4 * B, 9);
    kv_seq a, b;
    run_seq(c, &a, t, 2 * B + 1);
    assert_true(kv_seq_init(&b, c));
    assert_int_equal(kvcache_match(c, &b, t, 2 * B + 3), 2 * B);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    assert_true(kvcache_grow(c, &b, 2 * B + 3));
    assert_int_not_equal(b.blocks[2], a.blocks[2]); /* partial blocks are private */
    assert_counts(c, 4, 0, 4);
    kvcache_release(c, &a);
    assert_counts(c, 3, 0, 5); /* a's private third block is free; the shared two still used */
    kvcache_release(c, &b);
    assert_counts(c, 0, 2, 6);
    kv_seq_free(&a);
    kv_seq_free(&b);
    kvcache_free(c);
}

/* Fresh blocks come from the free list first, then from the LRU end of the cache; a released
 * chain is evicted from its tail, so its head (the most shared part) survives longest. */
static void test_lru_eviction_order(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(6, 6, 0);
    int32_t t1[3 * B], t2[2 * B];
    tokens(t1, 3 * B, 1);
    tokens(t2, 2 * B, 2);
    kv_seq a, b, x;
    run_seq(c, &a, t1, 3 * B);
    run_seq(c, &b, t2, 2 * B);
    kvcache_release(c, &a); /* LRU: a2 a1 a0 */
    kvcache_release(c, &b); /* LRU: a2 a1 a0 b1 b0 */
    assert_counts(c, 0, 5, 1);
    assert_true(kv_seq_init(&x, c));
    assert_true(kvcache_grow(c, &x, 2 * B)); /* the free block, then a2 */
    assert_counts(c, 2, 4, 0);
    kv_seq q;
    assert_true(kv_seq_init(&q, c));
    assert_int_equal(kvcache_match(c, &q, t1, 3 * B), 2 * B); /* a0 a1 left */
    kvcache_release(c, &q);                                     /* LRU: b1 b0 a1 a0 (a touched) */
    assert_true(kvcache_grow(c, &x, 3 * B));                    /* evicts the least recent: b1 */
    assert_int_equal(kvcache_match(c, &q, t2, 2 * B), B);       /* b0 survives, b1 gone */
    kvcache_release(c, &q);
    assert_int_equal(kvcache_match(c, &q, t1, 3 * B), 2 * B);
    kvcache_release(c, &q);
    kvcache_release(c, &x);
    kv_seq_free(&a);
    kv_seq_free(&b);
    kv_seq_free(&x);
    kv_seq_free(&q);
    kvcache_free(c);
}

/* A prompt cached whole must still compute its last position: the block that holds it is
 * indexed, so the sequence gets a private copy and the index keeps the original. */
static void test_copy_on_write(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(6, 4, 0);
    int32_t t[2 * B];
    tokens(t, 2 * B, 3);
    kv_seq a, q;
    run_seq(c, &a, t, 2 * B);
    assert_true(kv_seq_init(&q, c));
    assert_int_equal(kvcache_match(c, &q, t, 2 * B), 2 * B);
    int32_t shared = q.blocks[1], src = -1;
    assert_int_equal(kvcache_cow(c, &q, 1, &src), 1);
    assert_int_equal(src, shared);
    assert_int_not_equal(q.blocks[1], shared);
    assert_int_equal(q.n_hashed, 1);
    assert_int_equal(kvcache_cow(c, &q, 1, &src), 0); /* private now: written in place */
    /* Committing the copy does not index a duplicate: the original stays the one found. */
    kvcache_commit(c, &q, t, 2 * B);
    kvcache_release(c, &a);
    kvcache_release(c, &q);
    kv_seq r;
    assert_true(kv_seq_init(&r, c));
    assert_int_equal(kvcache_match(c, &r, t, 2 * B), 2 * B);
    assert_int_equal(r.blocks[1], shared);
    kvcache_release(c, &r);
    /* Even an indexed block held by one sequence alone is copied before a write. */
    assert_int_equal(kvcache_match(c, &r, t, 2 * B), 2 * B);
    assert_int_equal(kvcache_cow(c, &r, 1, &src), 1);
    kvcache_release(c, &r);
    kv_seq_free(&a);
    kv_seq_free(&q);
    kv_seq_free(&r);
    kvcache_free(c);
}

/* Many sequences of varied lengths come and go: blocks are reused in whatever order they were
 * freed (tables end up fragmented), no block is ever in two private tables, and the counts
 * always add up. */
static void test_fragmented_reuse(void **state)
{
    (void)state;
    enum { NB = 40, NS = 6, W = 8 };
    kvcache *c = kvcache_create(NB, W, 0);
    kv_seq q[NS];
    int32_t t[NS][W * B];
    for (int i = 0; i < NS; i++) assert_true(kv_seq_init(&q[i], c));
    uint64_t rng = 12345;
    for (int round = 0; round < 500; round++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((rng >> 33) % NS), n = 1 + (int)((rng >> 40) % (W * B));
        if (q[i].n_blocks) {
            kvcache_release(c, &q[i]);
        } else {
            tokens(t[i], n, (int)((rng >> 50) % 3)); /* few conversations: many hits */
            kvcache_match(c, &q[i], t[i], n);
            if (kvcache_grow(c, &q[i], n)) kvcache_commit(c, &q[i], t[i], n);
            else kvcache_release(c, &q[i]);
        }
        int owners[NB] = {0};
        int used = 0;
        for (int k = 0; k < NS; k++)
            for (int b = 0; b < q[k].n_blocks; b++) {
                int32_t id = q[k].blocks[b];
                assert_true(id >= 0 && id < NB);
                if (owners[id]++ == 0) used++;
            }
        kvcache_counts kc = kvcache_count(c);
        assert_int_equal(kc.used, used);
        assert_int_equal(kc.used + kc.cached + kc.free, NB);
    }
    for (int i = 0; i < NS; i++) {
        kvcache_release(c, &q[i]);
        kv_seq_free(&q[i]);
    }
    assert_int_equal(kvcache_count(c).used, 0);
    kvcache_free(c);
}

/* Speculative rollback: a sequence that grew for drafts gives back the blocks past the
 * positions it kept, never a committed (indexed) one, and the freed blocks serve others. */
static void test_truncate_after_drafts(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(8, 8, 0);
    int32_t t[4 * B];
    tokens(t, 4 * B, 5);
    kv_seq q;
    run_seq(c, &q, t, B + 3); /* one full committed block, one partial */
    assert_int_equal(q.n_hashed, 1);
    assert_true(kvcache_grow(c, &q, 3 * B + 2)); /* a verification reaching into a fourth block */
    assert_int_equal(q.n_blocks, 4);
    assert_counts(c, 4, 0, 4);
    kvcache_truncate(c, &q, B + 5); /* few drafts accepted: two blocks kept */
    assert_int_equal(q.n_blocks, 2);
    assert_counts(c, 2, 0, 6);
    kvcache_truncate(c, &q, 2 * B); /* exactly two blocks: nothing changes */
    assert_int_equal(q.n_blocks, 2);
    kvcache_truncate(c, &q, 1); /* never below the committed block */
    assert_int_equal(q.n_blocks, 1);
    assert_int_equal(q.n_hashed, 1);
    assert_counts(c, 1, 0, 7);
    assert_true(kvcache_grow(c, &q, 2 * B + 1)); /* grows again from there */
    assert_int_equal(q.n_blocks, 3);
    kvcache_release(c, &q);
    assert_counts(c, 0, 1, 7); /* the committed block stays cached */
    kv_seq_free(&q);
    kvcache_free(c);
}

/* A sliding instance (window 40) over 10 blocks: a sequence decoding 400 positions (13 blocks)
 * holds only its window's blocks, the ones let go stay cached (committed first), and a later
 * sequence finds the latest windows again. */
#define WINDOW 40
static void test_sliding_decode(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(10, 16, 0);
    int32_t t[400];
    tokens(t, 400, 7);
    kv_seq q;
    assert_true(kv_seq_init(&q, c));
    for (int n = 1; n <= 399; n++) { /* position n-1 computed, position n next */
        assert_true(kvcache_grow(c, &q, n + 1)); /* never short: at most 3 blocks held */
        kvcache_commit(c, &q, t, n);
        kvcache_drop_before(c, &q, engine_swa_first_block(n, WINDOW));
        assert_int_equal(kvcache_held(&q), engine_swa_blocks_held(n, WINDOW));
        assert_true(kvcache_held(&q) <= (WINDOW + B - 1) / B + 1);
        for (int i = 0; i < engine_swa_first_block(n, WINDOW); i++) assert_int_equal(q.blocks[i], -1);
    }
    assert_int_equal(q.n_hashed, 399 / B);
    kvcache_counts k = kvcache_count(c);
    assert_int_equal(k.used, kvcache_held(&q));
    assert_int_equal(k.used + k.cached + k.free, 10);
    assert_true(k.cached >= 7); /* committed blocks let go are kept, not freed */
    kvcache_drop_before(c, &q, q.n_blocks);
    kvcache_release(c, &q);
    assert_counts(c, 0, 9, 1); /* block 12 was never full, so never indexed: free */

    /* A prompt of the same 400 tokens: the longest end whose window (blocks from
     * engine_swa_first_block(end - 1)) is cached: 12 blocks (384), its window blocks 10 and 11. */
    kv_seq r;
    assert_true(kv_seq_init(&r, c));
    int hit = kvcache_match_window(c, &r, t, 400, WINDOW);
    assert_int_equal(hit, 12 * B);
    assert_int_equal(r.n_blocks, 12);
    assert_int_equal(r.n_hashed, 12);
    const int first = engine_swa_first_block(hit - 1, WINDOW);
    for (int i = 0; i < 12; i++) assert_true(i < first ? r.blocks[i] == -1 : r.blocks[i] >= 0);
    assert_int_equal(kvcache_count(c).used, 12 - first);
    /* recomputing the last position: copy-on-write of block 11, its chain's key taken from the
     * copied block's parent; after the copy the sequence commits on */
    int32_t src = -1;
    assert_int_equal(kvcache_cow(c, &r, 11, &src), 1);
    assert_true(src >= 0 && r.blocks[11] != src);
    assert_int_equal(r.n_hashed, 11);
    kvcache_commit(c, &r, t, 12 * B);
    assert_int_equal(r.n_hashed, 12); /* the copy is a private duplicate of an indexed block */
    kvcache_drop_before(c, &r, r.n_blocks);
    kvcache_release(c, &r);
    assert_int_equal(kvcache_count(c).used, 0);

    /* A shorter prompt ending inside the first blocks: their windows were evicted (the pool of
     * 10 recycled blocks 0..2), and one whose tokens differ finds nothing. */
    assert_int_equal(kvcache_match_window(c, &r, t, 2 * B, WINDOW), 0);
    assert_int_equal(r.n_blocks, 0);
    int32_t other[400];
    tokens(other, 400, 8);
    assert_int_equal(kvcache_match_window(c, &r, other, 400, WINDOW), 0);

    /* Fresh blocks for another sequence evict the cached windows, oldest first: once all ten
     * are taken, nothing is found. */
    kv_seq big;
    assert_true(kv_seq_init(&big, c));
    assert_true(kvcache_grow(c, &big, 10 * B));
    assert_int_equal(kvcache_match_window(c, &r, t, 400, WINDOW), 0);
    kvcache_release(c, &big);
    kv_seq_free(&big);
    kv_seq_free(&r);
    kv_seq_free(&q);
    kvcache_free(c);
}

/* Copy-on-write where the block before is let go (-1): the chain goes on from the copied
 * block's parent key, so the sequence's next blocks are indexed under the right prefix. */
static void test_sliding_cow_after_gap(void **state)
{
    (void)state;
    kvcache *c = kvcache_create(12, 8, 0);
    int32_t t[4 * B];
    tokens(t, 4 * B, 3);
    kv_seq q, r, u;
    run_seq(c, &q, t, 3 * B);
    kvcache_drop_before(c, &q, 2); /* blocks 0 and 1 let go, cached */
    kvcache_drop_before(c, &q, q.n_blocks);
    kvcache_release(c, &q);
    assert_true(kv_seq_init(&r, c));
    assert_int_equal(kvcache_match_window(c, &r, t, 3 * B, 8), 3 * B); /* window: block 2 only */
    assert_int_equal(r.blocks[0], -1);
    assert_int_equal(r.blocks[1], -1);
    int32_t src;
    assert_int_equal(kvcache_cow(c, &r, 2, &src), 1);
    assert_int_equal(r.n_hashed, 2);
    assert_true(kvcache_grow(c, &r, 4 * B));
    kvcache_commit(c, &r, t, 4 * B); /* blocks 2 (a duplicate) and 3 (new) */
    assert_int_equal(r.n_hashed, 4);
    kvcache_drop_before(c, &r, 3);
    kvcache_release(c, &r);
    /* block 3 was indexed under the true chain: a window ending at 4 blocks is found */
    assert_true(kv_seq_init(&u, c));
    assert_int_equal(kvcache_match_window(c, &u, t, 4 * B, 8), 4 * B);
    kvcache_release(c, &u);
    kv_seq_free(&u);
    kv_seq_free(&r);
    kv_seq_free(&q);
    kvcache_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_release_counts),
        cmocka_unit_test(test_all_or_nothing_when_full),
        cmocka_unit_test(test_prefix_hits_at_boundaries),
        cmocka_unit_test(test_shared_refs),
        cmocka_unit_test(test_lru_eviction_order),
        cmocka_unit_test(test_copy_on_write),
        cmocka_unit_test(test_fragmented_reuse),
        cmocka_unit_test(test_truncate_after_drafts),
        cmocka_unit_test(test_sliding_decode),
        cmocka_unit_test(test_sliding_cow_after_gap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
