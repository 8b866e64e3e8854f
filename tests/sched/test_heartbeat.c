/* test_heartbeat.c - the scheduler's liveness hook (sched_config.heartbeat), which feeds the
 * systemd watchdog: it ticks on the scheduler's own loop while idle and between steps, and
 * not at all while an engine step is wedged, then resumes.
 *
 * No timing assertion can fail on a slow machine: while the fake engine holds the scheduler
 * thread inside a step, no tick can run on that thread whatever the clock says; every other
 * wait is "until it happens", bounded by a generous deadline. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/log.h"
#include "synth/mkmodel.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "engine/engine_impl.h" /* a fake backend that wedges */
#include "sched/sched.h"

static model *g_model;
static tokenizer *g_tok;

/* A real tokenizer for the scheduler's detokenizer: the tiny synthetic model's. */
static int setup(void **state)
{
    (void)state;
    char path[] = "/tmp/inferd-heartbeat-XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    close(fd);
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    size_t len = 0;
    char *corpus = mkmodel_corpus("/nonexistent", 1 << 16, &len);
    char err[256];
    int rc = mkmodel_write(&cfg, corpus, len, path, err, sizeof err);
    free(corpus);
    if (rc != 0) fail_msg("mkmodel_write: %s", err);
    g_model = model_load(path, err, sizeof err);
    unlink(path); /* the model is mmapped: the mapping outlives the name */
    if (!g_model) fail_msg("model_load: %s", err);
    g_tok = tokenizer_load(g_model->gguf, err, sizeof err);
    if (!g_tok) fail_msg("tokenizer_load: %s", err);
    log_set_level(LOG_WARN);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tokenizer_free(g_tok);
    model_free(g_model);
    return 0;
}

/* ---- a fake engine whose step can be wedged -------------------------------------------- */

typedef struct wedge_engine {
    engine base;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool wedge;     /* the next step blocks until released */
    bool in_step;   /* a wedged step is holding the scheduler thread */
} wedge_engine;

static int wedge_step(engine *e, const engine_seq *seqs, int n, engine_result *res, char *err, size_t errlen)
{
    (void)seqs;
    (void)err;
    (void)errlen;
    wedge_engine *w = (wedge_engine *)e;
    pthread_mutex_lock(&w->mu);
    if (w->wedge) {
        w->in_step = true;
        pthread_cond_broadcast(&w->cv);
        while (w->wedge) pthread_cond_wait(&w->cv, &w->mu);
        w->in_step = false;
    }
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < n; i++) res[i] = (engine_result){.token = 300};
    return 0;
}

static void wedge_slot_clear(engine *e, int slot)
{
    (void)e;
    (void)slot;
}

static void wedge_destroy(engine *e) { (void)e; }

static int wedge_kv_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    (void)e, (void)dst, (void)src, (void)err, (void)errlen;
    return 0;
}

static const engine_vtable wedge_vt = {
    .name = "wedge", .step = wedge_step, .slot_clear = wedge_slot_clear, .kv_copy = wedge_kv_copy, .destroy = wedge_destroy};

/* ---- the hook -------------------------------------------------------------------------- */

static atomic_int g_beats;
static pthread_t g_beat_thread;

static void on_beat(void *ctx)
{
    (void)ctx;
    g_beat_thread = pthread_self();
    atomic_fetch_add(&g_beats, 1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Wait (bounded: 60 s, for loaded sanitizer machines) until the count passes `above`. */
static int beats_after(int above)
{
    double until = now_s() + 60;
    while (atomic_load(&g_beats) <= above && now_s() < until) usleep(1000);
    return atomic_load(&g_beats);
}

/* A scheduler over w (2 slots x 64 tokens) whose hook ticks every beat_ms. */
static sched *start(wedge_engine *w, unsigned beat_ms)
{
    *w = (wedge_engine){.base = {.vt = &wedge_vt, .m = g_model,
                                 .cfg = {.n_slots = 2, .ctx_per_slot = 64, .max_batch_tokens = 64},
                                 .kv_blocks = 4}};
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    atomic_store(&g_beats, 0);
    sched_config cfg = {.n_slots = 2, .ctx_per_slot = 64, .max_batch_tokens = 64, .queue_size = 4,
                        .heartbeat = on_beat, .heartbeat_ms = beat_ms};
    char err[256];
    sched *s = sched_create(&w->base, g_tok, &cfg, err, sizeof err);
    if (!s) fail_msg("sched_create: %s", err);
    return s;
}

static void stop(sched *s, wedge_engine *w)
{
    sched_destroy(s);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static void test_heartbeat_stops_while_wedged(void **state)
{
    (void)state;
    wedge_engine w;
    sched *s = start(&w, 5);

    /* idle: it ticks, on the scheduler thread (not ours) */
    assert_true(beats_after(2) > 2);
    assert_false(pthread_equal(g_beat_thread, pthread_self()));

    /* wedge the next step and start a request */
    pthread_mutex_lock(&w.mu);
    w.wedge = true;
    pthread_mutex_unlock(&w.mu);
    int32_t prompt[] = {1, 2, 3};
    sched_params p = {.prompt = prompt, .n_prompt = 3, .max_tokens = 4, .ignore_eos = true, .id = "t"};
    sampling_params_default(&p.sp);
    sched_req *r = NULL;
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), SCHED_OK);
    pthread_mutex_lock(&w.mu);
    while (!w.in_step) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);

    /* The scheduler thread is inside the step, so no tick can run, however long we wait
     * (20 tick periods here). */
    int frozen = atomic_load(&g_beats);
    usleep(100 * 1000);
    assert_int_equal(atomic_load(&g_beats), frozen);

    /* release: the ticks resume and the request completes */
    pthread_mutex_lock(&w.mu);
    w.wedge = false;
    pthread_cond_broadcast(&w.cv);
    pthread_mutex_unlock(&w.mu);
    assert_true(beats_after(frozen + 2) > frozen + 2);
    sched_drain(s, 60000);
    sched_output o = {0};
    sched_req_take(r, &o);
    assert_int_equal(o.finish, SCHED_FINISH_LENGTH);
    sched_output_clear(&o);
    sched_req_release(r);
    stop(s, &w);
}

/* No hook, or a zero period: no timer (and nothing breaks). */
static void test_no_heartbeat(void **state)
{
    (void)state;
    wedge_engine w;
    sched *s = start(&w, 0);
    usleep(50 * 1000);
    stop(s, &w);
    assert_int_equal(atomic_load(&g_beats), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heartbeat_stops_while_wedged),
        cmocka_unit_test(test_no_heartbeat),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
