/* test_statecache.c - the recurrent-state slots and prefix snapshots (sched/statecache.c):
 * running slots are handed out and taken back, snapshots are found by their longest matching
 * prefix within a length, kept least recently used within their bound, deduplicated and
 * dropped only while they still hold what the dropper made. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "sched/statecache.h"

static int32_t toks[256];

static void fill(void)
{
    for (int i = 0; i < 256; i++) toks[i] = (i * 7) % 13;
}

static void test_running_slots(void **state)
{
    (void)state;
    statecache *c = statecache_create(6, 2);
    assert_non_null(c);
    int got[4];
    for (int i = 0; i < 4; i++) {
        got[i] = statecache_take(c);
        assert_true(got[i] >= 0 && got[i] < 6);
        for (int j = 0; j < i; j++) assert_int_not_equal(got[i], got[j]);
    }
    statecache_counts n = statecache_count(c);
    assert_int_equal(n.running, 4);
    assert_int_equal(n.free, 2);
    statecache_put(c, got[1]);
    statecache_put(c, got[1]); /* twice: nothing more */
    assert_int_equal(statecache_count(c).running, 3);
    assert_int_equal(statecache_take(c), got[1]); /* the lowest free slot again */
    for (int i = 0; i < 4; i++) statecache_put(c, got[i]);
    n = statecache_count(c);
    assert_int_equal(n.running, 0);
    assert_int_equal(n.free, 6);
    assert_null(statecache_create(2, 2)); /* no slot left for a row */
    statecache_free(c);
}

static void test_snapshots(void **state)
{
    (void)state;
    fill();
    statecache *c = statecache_create(4, 2);
    int run = statecache_take(c), at = -1;
    int a = statecache_snapshot(c, toks, 32), b = statecache_snapshot(c, toks, 96);
    assert_true(a >= 0 && b >= 0 && a != b && a != run && b != run);
    assert_int_equal(statecache_snapshot(c, toks, 32), -1); /* the same prefix: kept once */
    assert_int_equal(statecache_lookup(c, toks, 95, &at), a);   /* the longest within 95 tokens */
    assert_int_equal(at, 32);
    assert_int_equal(statecache_lookup(c, toks, 200, &at), b);
    assert_int_equal(at, 96);
    assert_int_equal(statecache_lookup(c, toks, 31, &at), -1);
    int32_t other[96];
    memcpy(other, toks, sizeof other);
    other[40] = 99; /* differs inside b's prefix, not a's */
    assert_int_equal(statecache_lookup(c, other, 96, &at), a);
    /* a third snapshot evicts the least recently used (a was looked up last: b goes) */
    int third = statecache_snapshot(c, other, 64);
    assert_int_equal(third, b);
    assert_int_equal(statecache_count(c).snapshots, 2);
    assert_int_equal(statecache_lookup(c, toks, 200, &at), a);
    /* dropped only while it holds what was snapshotted */
    statecache_drop(c, third, toks, 64); /* other tokens: stays */
    assert_int_equal(statecache_count(c).snapshots, 2);
    statecache_drop(c, third, other, 64);
    assert_int_equal(statecache_count(c).snapshots, 1);
    /* rows take free slots first, a snapshot's only when none is free */
    int r2 = statecache_take(c), r3 = statecache_take(c);
    assert_true(r2 >= 0 && r3 >= 0);
    assert_int_equal(statecache_count(c).snapshots, 1);
    assert_int_equal(statecache_take(c), a); /* more rows than it was sized for: the snapshot goes */
    assert_int_equal(statecache_count(c).snapshots, 0);
    statecache_free(c);
    statecache *none = statecache_create(2, 0);
    assert_int_equal(statecache_snapshot(none, toks, 32), -1); /* no snapshots kept */
    statecache_free(none);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_running_slots), cmocka_unit_test(test_snapshots)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
