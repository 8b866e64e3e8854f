/* test_stop.c - the stop-string matcher and the UTF-8 rules of src/sched, on their own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sched/stopstr.h"
#include "base/utf8.h"

/* Feeds the pieces one by one; records after each piece what had been released so far. */
typedef struct run_result {
    char out[256];
    size_t released_after[16];
    bool matched;
    int matched_at; /* index of the piece that completed the stop string, or -1 */
    int which;      /* stopstr's matched_index, or -1 */
} run_result;

static void run_pieces(const char *const *stops, int n_stop, const char *const *pieces, int n,
                       bool flush, run_result *r)
{
    stopstr m;
    assert_true(stopstr_init(&m, stops, n_stop));
    bytebuf out = {0};
    r->matched = false;
    r->matched_at = -1;
    for (int i = 0; i < n; i++) {
        bool oom;
        bool hit = stopstr_feed(&m, pieces[i], strlen(pieces[i]), &out, &oom);
        assert_false(oom);
        if (hit && !r->matched) r->matched_at = i;
        r->matched |= hit;
        r->released_after[i] = out.len;
    }
    if (flush) assert_true(stopstr_flush(&m, &out));
    assert_true(out.len < sizeof r->out);
    memcpy(r->out, out.data ? out.data : "", out.len);
    r->out[out.len] = 0;
    assert_true(utf8_valid(r->out, out.len));
    bytebuf_free(&out);
    r->which = m.matched ? m.matched_index : -1;
    stopstr_free(&m);
}

static void test_no_stops_passes_through(void **state)
{
    (void)state;
    const char *pieces[] = {"Hello", ", ", "world"};
    run_result r;
    run_pieces(NULL, 0, pieces, 3, false, &r);
    assert_false(r.matched);
    assert_string_equal(r.out, "Hello, world");
    assert_int_equal(r.released_after[0], 5); /* nothing held without stop strings */
}

static void test_stop_inside_one_piece(void **state)
{
    (void)state;
    const char *stops[] = {"END"};
    const char *pieces[] = {"abc", "xENDy", "more"};
    run_result r;
    run_pieces(stops, 1, pieces, 3, true, &r);
    assert_true(r.matched);
    assert_int_equal(r.matched_at, 1);
    assert_string_equal(r.out, "abcx");
}

static void test_stop_split_over_three_pieces(void **state)
{
    (void)state;
    const char *stops[] = {"STOP"};
    const char *pieces[] = {"one S", "T", "OP two"};
    run_result r;
    run_pieces(stops, 1, pieces, 3, true, &r);
    assert_true(r.matched);
    assert_int_equal(r.matched_at, 2);
    assert_string_equal(r.out, "one ");
    /* "S" and "ST" were held back, never released. */
    assert_int_equal(r.released_after[0], 4);
    assert_int_equal(r.released_after[1], 4);
}

static void test_overlapping_prefix(void **state)
{
    (void)state;
    /* "aab" inside "aaab": a naive matcher that restarts after the failed "aaa" misses it. */
    const char *stops[] = {"aab"};
    const char *pieces[] = {"a", "a", "a", "b", "zzz"};
    run_result r;
    run_pieces(stops, 1, pieces, 5, true, &r);
    assert_true(r.matched);
    assert_int_equal(r.matched_at, 3);
    assert_string_equal(r.out, "a");
    assert_int_equal(r.released_after[0], 0);
    assert_int_equal(r.released_after[1], 0);
    assert_int_equal(r.released_after[2], 1); /* "aaa": only the first 'a' is decided */
}

static void test_false_start_is_released(void **state)
{
    (void)state;
    const char *stops[] = {"</s>"};
    const char *pieces[] = {"x </", "b> y", " <"};
    run_result r;
    run_pieces(stops, 1, pieces, 3, false, &r);
    assert_false(r.matched);
    assert_int_equal(r.released_after[0], 2);          /* "</" held */
    assert_int_equal(r.released_after[1], 8);          /* "</b> y" decided */
    assert_string_equal(r.out, "x </b> y ");           /* "<" still held */
}

static void test_flush_releases_held_tail(void **state)
{
    (void)state;
    const char *stops[] = {"</s>"};
    const char *pieces[] = {"end </"};
    run_result r;
    run_pieces(stops, 1, pieces, 1, true, &r);
    assert_false(r.matched);
    assert_string_equal(r.out, "end </");
}

static void test_earliest_of_several_stops(void **state)
{
    (void)state;
    const char *stops[] = {"world", "", "lo w", NULL};
    const char *pieces[] = {"hel", "lo wor", "ld"};
    run_result r;
    run_pieces(stops, 4, pieces, 3, true, &r);
    assert_true(r.matched);
    assert_int_equal(r.matched_at, 1);
    assert_int_equal(r.which, 1); /* "lo w": the empty and NULL entries are not kept */
    assert_string_equal(r.out, "hel");
}

static void test_stop_at_very_start_and_after_match(void **state)
{
    (void)state;
    const char *stops[] = {"\n\n"};
    const char *pieces[] = {"\n", "\nhidden", "also hidden"};
    run_result r;
    run_pieces(stops, 1, pieces, 3, true, &r);
    assert_true(r.matched);
    assert_int_equal(r.matched_at, 1);
    assert_string_equal(r.out, "");
}

static void test_multibyte_stop_string(void **state)
{
    (void)state;
    const char *stops[] = {"\xE2\x82\xAC!"}; /* "€!" */
    const char *pieces[] = {"5 \xE2", "\x82", "\xAC", "! rest"};
    run_result r;
    run_pieces(stops, 1, pieces, 4, true, &r);
    assert_true(r.matched);
    assert_int_equal(r.matched_at, 3);
    assert_string_equal(r.out, "5 ");
}

static void test_utf8_held_until_complete(void **state)
{
    (void)state;
    const char *pieces[] = {"a\xE2", "\x82", "\xAC\x62" /* "\xACb" would read as one hex escape */, "\xF0\x9F", "\x98\x80"};
    run_result r;
    run_pieces(NULL, 0, pieces, 5, true, &r);
    assert_int_equal(r.released_after[0], 1);
    assert_int_equal(r.released_after[1], 1);
    assert_int_equal(r.released_after[2], 5);
    assert_int_equal(r.released_after[3], 5);
    assert_int_equal(r.released_after[4], 9);
    assert_string_equal(r.out, "a\xE2\x82\xAC" "b\xF0\x9F\x98\x80");
}

static void test_utf8_truncated_at_flush_becomes_replacement(void **state)
{
    (void)state;
    const char *pieces[] = {"ok\xE2\x82"};
    run_result r;
    run_pieces(NULL, 0, pieces, 1, true, &r);
    assert_string_equal(r.out, "ok\xEF\xBF\xBD");
}


static void test_too_many_stops_refused(void **state)
{
    (void)state;
    const char *stops[] = {"a", "b", "c", "d", "e"};
    stopstr m;
    assert_false(stopstr_init(&m, stops, 5));
    stopstr_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_stops_passes_through),
        cmocka_unit_test(test_stop_inside_one_piece),
        cmocka_unit_test(test_stop_split_over_three_pieces),
        cmocka_unit_test(test_overlapping_prefix),
        cmocka_unit_test(test_false_start_is_released),
        cmocka_unit_test(test_flush_releases_held_tail),
        cmocka_unit_test(test_earliest_of_several_stops),
        cmocka_unit_test(test_stop_at_very_start_and_after_match),
        cmocka_unit_test(test_multibyte_stop_string),
        cmocka_unit_test(test_utf8_held_until_complete),
        cmocka_unit_test(test_utf8_truncated_at_flush_becomes_replacement),
        cmocka_unit_test(test_too_many_stops_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
