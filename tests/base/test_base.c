/* test_base.c - the base layer: UTF-8 (one U+FFFD per maximal subpart), the byte buffer, the
 * generated heap, splitmix64, deadlines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/bytebuf.h"
#include "base/file.h"
#include "base/heap.h"
#include "base/rng.h"
#include "base/timing.h"
#include "base/utf8.h"
#include "base/workq.h"

#include <pthread.h>
#include <stdatomic.h>

static void test_utf8_complete_prefix(void **state)
{
    (void)state;
    assert_int_equal(utf8_complete_prefix("", 0), 0);
    assert_int_equal(utf8_complete_prefix("abc", 3), 3);
    assert_int_equal(utf8_complete_prefix("a\xC3", 2), 1);
    assert_int_equal(utf8_complete_prefix("a\xC3\xA9", 3), 3);
    assert_int_equal(utf8_complete_prefix("a\xE2\x82", 3), 1);
    assert_int_equal(utf8_complete_prefix("\xF0\x9F\x98", 3), 0);
    assert_int_equal(utf8_complete_prefix("\xF0\x9F\x98\x80", 4), 4);
    /* Hopeless bytes are not waited for: they become U+FFFD when appended. */
    assert_int_equal(utf8_complete_prefix("a\x80", 2), 2);
    assert_int_equal(utf8_complete_prefix("a\xFF", 2), 2);
}

static void test_utf8_append_valid_replaces_garbage(void **state)
{
    (void)state;
    bytebuf b = {0};
    /* stray continuation, 0xFF, overlong "/", surrogate U+D800, valid é: one U+FFFD per maximal
     * subpart (C0 can lead nothing and ED takes no A0, so each byte there is a subpart of its
     * own, as in the Unicode standard's table 3-9), and one for a truncated sequence E2 82. */
    const char in[] = "x\x80y\xFFz\xC0\xAF|\xED\xA0\x80|\xE2\x82|\xC3\xA9";
    assert_true(utf8_append_valid(&b, in, sizeof in - 1));
    assert_true(utf8_valid(b.data, b.len));
#define R "\xEF\xBF\xBD"
    assert_string_equal(b.data, "x" R "y" R "z" R R "|" R R R "|" R "|\xC3\xA9");
#undef R
    bytebuf_free(&b);
    assert_false(utf8_valid("\xF4\x90\x80\x80", 4)); /* above U+10FFFF */
    assert_false(utf8_valid("\xE0\x80\x80", 3));     /* overlong */
    assert_true(utf8_valid("\xF4\x8F\xBF\xBF", 4));
}

/* utf8_decode's lengths are the maximal subparts of table 3-8 of the Unicode standard. */
static void test_utf8_decode_subparts(void **state)
{
    (void)state;
    static const struct { const char *s; size_t n; int len; uint32_t cp; } cases[] = {
        {"A", 1, 1, 'A'},
        {"\xC3\xA9", 2, 2, 0xE9},
        {"\xE2\x82\xAC", 3, 3, 0x20AC},
        {"\xF0\x9F\x98\x80", 4, 4, 0x1F600},
        {"\xC3", 1, 1, UTF8_INVALID},             /* truncated at the end */
        {"\xE2\x82", 2, 2, UTF8_INVALID},         /* a well-formed start: one subpart */
        {"\xE2\x82" "A", 3, 2, UTF8_INVALID},
        {"\xF0\x9F\x98" "A", 4, 3, UTF8_INVALID},
        {"\xE0\x80\x80", 3, 1, UTF8_INVALID},     /* overlong: E0 takes A0..BF only */
        {"\xED\xA0\x80", 3, 1, UTF8_INVALID},     /* surrogate */
        {"\xF4\x90\x80\x80", 4, 1, UTF8_INVALID}, /* above U+10FFFF */
        {"\x80", 1, 1, UTF8_INVALID},
        {"\xFF", 1, 1, UTF8_INVALID},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t cp = 0;
        assert_int_equal(utf8_decode(cases[i].s, cases[i].n, &cp), cases[i].len);
        assert_int_equal(cp, cases[i].cp);
    }
    char out[4];
    assert_int_equal(utf8_encode(0x1F600, out), 4);
    assert_memory_equal(out, "\xF0\x9F\x98\x80", 4);
}

static void test_utf8_copy_valid_respects_cap(void **state)
{
    (void)state;
    char out[8];
    /* "a", then one U+FFFD for E2 82, then "b": 5 bytes; a cap of 3 stops before the U+FFFD. */
    assert_int_equal(utf8_copy_valid("a\xE2\x82" "b", 4, out, sizeof out), 5);
    assert_memory_equal(out, "a\xEF\xBF\xBD" "b", 5);
    assert_int_equal(utf8_copy_valid("a\xE2\x82" "b", 4, out, 3), 1);
}

static void test_bytebuf(void **state)
{
    (void)state;
    bytebuf b = {0};
    assert_null(bytebuf_take(&b, NULL)); /* nothing appended */
    assert_true(bytebuf_puts(&b, "hello"));
    assert_true(bytebuf_printf(&b, " %d%s", 42, "!"));
    assert_string_equal(b.data, "hello 42!");
    bytebuf_consume(&b, 6);
    assert_string_equal(b.data, "42!");
    for (int i = 0; i < 1000; i++) bytebuf_append(&b, "xy", 2);
    assert_int_equal(b.len, 2003);
    size_t len = 0;
    char *p = bytebuf_take(&b, &len);
    assert_int_equal(len, 2003);
    assert_int_equal(strlen(p), 2003);
    assert_null(b.data);
    free(p);
    /* A failure sticks until cleared, and take hands nothing over. */
    b.failed = true;
    assert_false(bytebuf_puts(&b, "x"));
    assert_null(bytebuf_take(&b, &len));
    assert_int_equal(len, 0);
    b.failed = true;
    bytebuf_clear(&b);
    assert_true(bytebuf_puts(&b, "ok"));
    assert_string_equal(b.data, "ok");
    bytebuf_free(&b);
}

static bool int_before(const int *a, const int *b) { return *a < *b; }
HEAP_DEFINE(int_heap, int, int_before)

static void test_heap_pops_in_order(void **state)
{
    (void)state;
    int_heap h = {0};
    uint64_t r = 7;
    for (int i = 0; i < 1000; i++) assert_true(int_heap_push(&h, (int)(rng_next(&r) % 500)));
    int prev = -1;
    for (int i = 0; i < 1000; i++) {
        int v = int_heap_pop(&h);
        assert_true(v >= prev);
        prev = v;
    }
    assert_int_equal(h.n, 0);
    int_heap_free(&h);
}

static void test_rng(void **state)
{
    (void)state;
    /* The reference splitmix64 sequence from state 0 (Vigna's splitmix64.c). */
    uint64_t s = 0;
    assert_true(rng_next(&s) == 0xE220A8397B1DCDAFull);
    assert_true(rng_next(&s) == 0x6E789E6AA1B965F4ull);
    assert_true(rng_splitmix64(0) == 0xE220A8397B1DCDAFull);
    double u = rng_unit(UINT64_MAX);
    assert_true(u < 1.0 && u > 0.999);
}

static void test_timing(void **state)
{
    (void)state;
    double t0 = timing_now_ms();
    assert_true(timing_now_ms() >= t0);
    struct timespec d = timing_deadline_in(1999);
    assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    int zero = 0, one = 1;
    pthread_mutex_lock(&mu);
    assert_true(timing_wait_until_zero(&c, &mu, &zero, 1000));
    double t = timing_now_ms();
    assert_false(timing_wait_until_zero(&c, &mu, &one, 20)); /* nobody signals: times out */
    assert_true(timing_now_ms() - t >= 15);
    pthread_mutex_unlock(&mu);
}

/* Regular files are read whole and bounded; a FIFO or a directory is refused at once (opening
 * a FIFO for reading would wait for a writer). */
static void test_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/inferd-test-base-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], fifo[256], err[128];
    snprintf(path, sizeof path, "%s/f.txt", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("hello\n", f);
    fclose(f);
    size_t len = 0;
    char *text = file_read_all(path, 64, &len, err, sizeof err);
    assert_non_null(text);
    assert_int_equal(len, 6);
    assert_string_equal(text, "hello\n");
    free(text);
    assert_null(file_read_all(path, 5, &len, err, sizeof err));
    assert_non_null(strstr(err, "larger than 5"));
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_true(file_open_regular(fifo, NULL, err, sizeof err) < 0);
    assert_string_equal(err, "not a regular file");
    assert_null(file_read_all(dir, 64, NULL, err, sizeof err));
    assert_string_equal(err, "not a regular file");
    unlink(fifo);
    unlink(path);
    rmdir(dir);
}

typedef struct counted {
    workq_job job;
    _Atomic int *runs;
    pthread_t ran_on;
} counted;

static void count_one(void *arg)
{
    counted *c = arg;
    c->ran_on = pthread_self();
    atomic_fetch_add(c->runs, 1);
}

/* Every job pushed runs exactly once, on a pool thread, and workq_free runs what is still queued
 * before it returns; a push after that is refused. */
static void test_workq(void **state)
{
    (void)state;
    enum { N = 200 };
    static counted jobs[N];
    _Atomic int runs = 0;
    workq *q = workq_new(3);
    assert_non_null(q);
    for (int i = 0; i < N; i++) {
        jobs[i] = (counted){.job = {.fn = count_one, .arg = &jobs[i]}, .runs = &runs};
        assert_int_equal(workq_push(q, &jobs[i].job), 0);
    }
    workq_free(q);
    assert_int_equal(atomic_load(&runs), N);
    for (int i = 0; i < N; i++) assert_false(pthread_equal(jobs[i].ran_on, pthread_self()));
    assert_null(workq_new(0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_complete_prefix),
        cmocka_unit_test(test_utf8_append_valid_replaces_garbage),
        cmocka_unit_test(test_utf8_decode_subparts),
        cmocka_unit_test(test_utf8_copy_valid_respects_cap),
        cmocka_unit_test(test_bytebuf),
        cmocka_unit_test(test_heap_pops_in_order),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_timing),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_workq),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
