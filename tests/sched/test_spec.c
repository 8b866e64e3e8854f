/* test_spec.c - speculative decoding (n-gram drafts, verification in the step, acceptance,
 * rollback) on the CPU engine over a real trained model (stories260K):
 *   - the drafter alone (ngram_draft);
 *   - greedy requests give the tokens, text, finish and logprobs of decoding without drafts,
 *     over many prompts in one continuous batch where speculating and non-speculating
 *     requests share steps, with stop strings and with a grammar, and drafts are accepted;
 *   - sampled requests likewise, seed for seed;
 *   - the acceptance rule keeps the target's distribution: over many seeds, the verification's
 *     first token and, where the draft was accepted, the token after it follow the
 *     probabilities of a plain step's logits (chi-square, p < 1e-4 fails: deterministic seeds,
 *     so the outcome is fixed, not flaky). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "grammar/grammar.h"
#include "sched/ngram.h"
#include "sched/sched.h"
#include "text/tokenizer.h"

#define N_SLOTS 4
#define CTX 256
#define DRAFT_MAX 6
#define MAX_OUT 200

typedef struct fixture {
    model *m;
    tokenizer *tok;
    engine *e;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    const char *env = getenv("INFERD_SHARED_DIR");
    char path[1200], err[256];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", env && *env ? env : INFERD_SHARED_DIR);
    if (!(f->m = model_load(path, err, sizeof err))) {
        print_message("skipping: cannot load %s: %s\n", path, err);
        return 0;
    }
    if (!(f->tok = tokenizer_load(f->m->gguf, err, sizeof err))) fail_msg("tokenizer: %s", err);
    engine_config cfg = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = 256, .n_threads = 1,
                         .max_draft = DRAFT_MAX};
    if (!(f->e = engine_open(ENGINE_DEVICE_CPU, f->m, &cfg, err, sizeof err))) fail_msg("engine: %s", err);
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    engine_free(f->e);
    tokenizer_free(f->tok);
    model_free(f->m);
    free(f);
    return 0;
}

/* ---- the drafter ------------------------------------------------------------------------ */

static void test_ngram_draft(void **state)
{
    (void)state;
    int32_t d[8];
    /* the longest suffix (3: 7 8 9) wins over a later match of its last token alone */
    const int32_t a[] = {7, 8, 9, 1, 2, 3, 4, 9, 5, 6, 7, 8, 9};
    assert_int_equal(ngram_draft(a, 13, 4, d), 4);
    assert_memory_equal(d, ((int32_t[]){1, 2, 3, 4}), 4 * sizeof *d);
    /* capped by k_max and by the end of the tokens */
    assert_int_equal(ngram_draft(a, 13, 2, d), 2);
    const int32_t b[] = {1, 2, 3, 1, 2};
    assert_int_equal(ngram_draft(b, 5, 8, d), 3); /* "1 2" at 0, followed by 3 1 2 */
    assert_memory_equal(d, ((int32_t[]){3, 1, 2}), 3 * sizeof *d);
    /* the latest occurrence: after "5" came 6 the first time, 8 the second */
    const int32_t c[] = {5, 6, 0, 5, 8, 0, 5};
    assert_int_equal(ngram_draft(c, 7, 1, d), 1);
    assert_int_equal(d[0], 8);
    const int32_t none[] = {1, 2, 3, 4};
    assert_int_equal(ngram_draft(none, 4, 8, d), 0);
    assert_int_equal(ngram_draft(b, 5, 0, d), 0);
    assert_int_equal(ngram_draft(b, 1, 4, d), 0);
}

/* ---- one request's whole output --------------------------------------------------------- */

typedef struct outcome {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int wakes;
    char text[4096];
    size_t len;
    int32_t ids[MAX_OUT];
    float logprobs[MAX_OUT];
    int32_t top1[MAX_OUT];
    int n;
    sched_finish finish;
    int stop_string;
} outcome;

static void on_wake(void *ctx)
{
    outcome *o = ctx;
    pthread_mutex_lock(&o->mu);
    o->wakes++;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* Drains r into o until its finish (60 s at most: generous for a loaded 2-core machine). */
static void collect(outcome *o, sched_req *r)
{
    time_t deadline = time(NULL) + 60;
    for (;;) {
        pthread_mutex_lock(&o->mu);
        int seen = o->wakes;
        pthread_mutex_unlock(&o->mu);
        sched_output out;
        bool done = false;
        while (sched_req_take(r, &out)) {
            assert_true(o->len + out.text_len < sizeof o->text);
            if (out.text_len) memcpy(o->text + o->len, out.text, out.text_len);
            o->len += out.text_len;
            for (int i = 0; i < out.n_tokens && o->n < MAX_OUT; i++, o->n++) {
                o->ids[o->n] = out.tokens[i].token;
                o->logprobs[o->n] = out.tokens[i].logprob;
                o->top1[o->n] = out.tokens[i].n_top > 0 ? out.tokens[i].top_ids[0] : -1;
            }
            if (out.finish != SCHED_FINISH_NONE) {
                o->finish = out.finish;
                o->stop_string = out.stop_string;
                done = true;
            }
            sched_output_clear(&out);
        }
        if (done) return;
        struct timespec until = {.tv_sec = time(NULL) + 1};
        pthread_mutex_lock(&o->mu);
        if (o->wakes == seen) pthread_cond_timedwait(&o->cv, &o->mu, &until);
        pthread_mutex_unlock(&o->mu);
        if (time(NULL) > deadline) fail_msg("a request did not finish within 60 s");
    }
}

typedef struct job {
    const char *prompt;
    int max_tokens;
    float temperature;
    uint64_t seed;
    const char *stop;
    grammar *g;
    bool no_spec;
    bool ignore_eos;
} job;

/* Runs every job at once through a scheduler over the fixture's engine; the outcomes in o. */
static void run_jobs(fixture *f, engine *e, sched_spec spec, const job *jobs, int n, outcome *o, sched_stats *st)
{
    sched_config cfg = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = 256, .queue_size = 64,
                        .spec = spec, .draft_max = DRAFT_MAX};
    char err[256];
    sched *s = sched_create(e, f->tok, &cfg, err, sizeof err);
    if (!s) fail_msg("sched_create: %s", err);
    sched_req **r = calloc((size_t)n, sizeof *r);
    int32_t ids[CTX];
    for (int i = 0; i < n; i++) {
        memset(&o[i], 0, sizeof o[i]);
        pthread_mutex_init(&o[i].mu, NULL);
        pthread_cond_init(&o[i].cv, NULL);
        int n_ids = tokenizer_encode(f->tok, jobs[i].prompt, strlen(jobs[i].prompt), true, false, ids, CTX);
        assert_true(n_ids > 0 && n_ids + jobs[i].max_tokens <= CTX);
        sched_params p = {.prompt = ids, .n_prompt = n_ids, .max_tokens = jobs[i].max_tokens,
                          .want_logprobs = true, .grammar = jobs[i].g, .no_speculative = jobs[i].no_spec,
                          .ignore_eos = jobs[i].ignore_eos};
        sampling_params_default(&p.sp);
        p.sp.temperature = jobs[i].temperature;
        p.sp.seed = jobs[i].seed;
        p.sp.n_top_logprobs = 2;
        if (jobs[i].stop) p.stop[p.n_stop++] = jobs[i].stop;
        assert_int_equal(sched_submit(s, &p, on_wake, &o[i], &r[i]), SCHED_OK);
    }
    for (int i = 0; i < n; i++) {
        collect(&o[i], r[i]);
        sched_req_release(r[i]);
        pthread_mutex_destroy(&o[i].mu);
        pthread_cond_destroy(&o[i].cv);
    }
    sched_get_stats(s, st);
    sched_destroy(s);
    free(r);
}

static void assert_same(const outcome *a, const outcome *b, const char *what, int i)
{
    if (a->n != b->n || memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids) != 0 || a->len != b->len ||
        memcmp(a->text, b->text, a->len) != 0 || a->finish != b->finish || a->stop_string != b->stop_string)
        fail_msg("%s, job %d: speculative output differs:\n  off   (%d tokens, %s): %.*s\n  ngram (%d tokens, %s): %.*s",
                 what, i, a->n, sched_finish_name(a->finish), (int)a->len, a->text, b->n, sched_finish_name(b->finish),
                 (int)b->len, b->text);
    for (int t = 0; t < a->n; t++) {
        if (fabsf(a->logprobs[t] - b->logprobs[t]) > 1e-5f || a->top1[t] != b->top1[t])
            fail_msg("%s, job %d: token %d's logprobs differ (%g vs %g)", what, i, t, a->logprobs[t], b->logprobs[t]);
    }
}

/* Runs jobs without and with speculation on engine e, checks every output equal; returns the
 * speculative run's statistics. */
static sched_stats compare_on(fixture *f, engine *e, const job *jobs, int n, const char *what)
{
    outcome *off = calloc((size_t)n, sizeof *off), *on = calloc((size_t)n, sizeof *on);
    sched_stats st_off, st_on;
    run_jobs(f, e, SCHED_SPEC_OFF, jobs, n, off, &st_off);
    run_jobs(f, e, SCHED_SPEC_NGRAM, jobs, n, on, &st_on);
    for (int i = 0; i < n; i++) assert_same(&off[i], &on[i], what, i);
    assert_int_equal(st_off.spec_draft_tokens, 0);
    assert_true(st_on.spec_accepted_tokens <= st_on.spec_draft_tokens);
    print_message("%s: %d requests, %llu steps without drafts, %llu with; %llu of %llu drafted tokens accepted\n", what,
                  n, (unsigned long long)st_off.steps, (unsigned long long)st_on.steps,
                  (unsigned long long)st_on.spec_accepted_tokens, (unsigned long long)st_on.spec_draft_tokens);
    free(off);
    free(on);
    return st_on;
}

static uint64_t compare(fixture *f, const job *jobs, int n, const char *what)
{
    return compare_on(f, f->e, jobs, n, what).spec_accepted_tokens;
}

static const char *const PROMPTS[] = {
    "Once upon a time, there was a little girl named Lily. Lily liked to play. Once upon a time, there was a",
    "The cat sat on the mat. The dog sat on the mat. The bird sat on the",
    "Tom and Sue went to the park. Tom and Sue played. Tom and Sue",
    "One day, a boy found a ball. The ball was red. The boy liked the ball. The ball",
    "Lily said, \"I want to play!\" Mom said, \"You can play.\" Lily said, \"I want",
    "A big dog ran. A big dog jumped. A big dog",
    "She was happy. He was happy. They were",
    "The sun was hot. The sun was big. The sun",
    "Ben had a toy car. He played with the toy car every day. One day, the toy car",
    "Once upon a time",
    "Sara and her mom went to the store to buy some food. At the store, Sara saw",
    "The little bird flew up high in the sky. The little bird flew",
};
#define N_PROMPTS ((int)(sizeof PROMPTS / sizeof PROMPTS[0]))

static void test_greedy_identical(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    job jobs[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++)
        jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 40 + 8 * (i % 4), .no_spec = i % 5 == 4};
    assert_true(compare(f, jobs, N_PROMPTS, "greedy") > 0);
}

/* Stop strings taken from the outputs themselves, so that they end requests mid-way; the
 * speculative run must end each at the same character, though the stop string often lies
 * inside a run of accepted drafts. */
static void test_greedy_stop_strings(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    job jobs[N_PROMPTS];
    outcome *plain = calloc(N_PROMPTS, sizeof *plain);
    for (int i = 0; i < N_PROMPTS; i++) jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 48};
    sched_stats st;
    run_jobs(f, f->e, SCHED_SPEC_OFF, jobs, N_PROMPTS, plain, &st);
    static char stops[N_PROMPTS][16];
    int n_stopping = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        /* a piece from the middle of the text: three characters at 60 % of it */
        size_t at = plain[i].len * 6 / 10;
        if (plain[i].len < 10) continue;
        memcpy(stops[i], plain[i].text + at, 3);
        jobs[i].stop = stops[i];
        n_stopping++;
    }
    free(plain);
    assert_true(n_stopping > N_PROMPTS / 2);
    compare(f, jobs, N_PROMPTS, "stop strings");
}

static void test_greedy_grammar(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    char err[256];
    static const char re[] = "( (the|a|cat|dog|sat|on|mat|big|ran|and)){4,40}\\.";
    grammar *g = grammar_from_regex(re, strlen(re), err, sizeof err);
    if (!g) fail_msg("grammar: %s", err);
    job jobs[6];
    for (int i = 0; i < 6; i++) jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 60, .g = g};
    compare(f, jobs, 6, "grammar");
    grammar_unref(g);
}

/* A KV pool of 1 MiB (25 blocks) for four rows of ~225 tokens (8 blocks each): running requests are
 * preempted and recomputed, drafts' blocks are taken only when free and given back after each
 * verification, and the outputs still equal those of decoding without drafts. */
static void test_greedy_preempted(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    engine_config cfg = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = 256, .n_threads = 1,
                         .max_draft = DRAFT_MAX, .kv_cache_mb = 1};
    char err[256];
    engine *small = engine_open(ENGINE_DEVICE_CPU, f->m, &cfg, err, sizeof err);
    if (!small) fail_msg("engine: %s", err);
    job jobs[6];
    for (int i = 0; i < 6; i++) jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 200, .ignore_eos = true};
    sched_stats st = compare_on(f, small, jobs, 6, "preempted");
    print_message("preempted: %d KV blocks, %llu preemptions\n", engine_kv_blocks(small),
                  (unsigned long long)st.preemptions);
    assert_true(st.preemptions > 0);
    assert_true(st.spec_accepted_tokens > 0);
    assert_int_equal(st.kv_blocks_used, 0); /* every block back once all finished */
    engine_free(small);
}

static void test_sampled_identical(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    job jobs[10];
    for (int i = 0; i < 10; i++)
        jobs[i] = (job){.prompt = PROMPTS[i % N_PROMPTS], .max_tokens = 40, .temperature = i % 2 ? 0.7f : 1.0f,
                        .seed = 1000 + (uint64_t)i};
    compare(f, jobs, 10, "sampled");
}

/* ---- the acceptance rule keeps the distribution ------------------------------------------ */

/* The chi-square statistic of counts against probabilities p (n_samples draws), bins with an
 * expectation under 5 merged into one; its degrees of freedom in *df. */
static double chi_square(const int *counts, const double *p, int n, int n_samples, int *df)
{
    double stat = 0, rest_e = 0, rest_o = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * n_samples;
        if (e < 5) {
            rest_e += e;
            rest_o += counts[i];
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    if (rest_e > 0) {
        stat += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
        bins++;
    }
    *df = bins - 1;
    return stat;
}

/* The chi-square value a statistic with df degrees of freedom exceeds with probability 1e-4
 * (Wilson-Hilferty). */
static double chi_square_limit(int df)
{
    const double z = 3.719, h = 2.0 / (9.0 * df);
    return df * pow(1 - h + z * sqrt(h), 3);
}

/* Softmax of logits at temperature t, in double. */
static void probabilities(const float *logits, int n, float t, double *p)
{
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; i++) z += p[i] = exp((logits[i] - mx) / t);
    for (int i = 0; i < n; i++) p[i] /= z;
}

static void test_rejection_sampling_distribution(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    const int V = f->m->hp.n_vocab, N = 2000;
    const float T = 1.0f;
    int32_t ctx[CTX];
    const char *text = "Once upon a time, there was a little";
    int n = tokenizer_encode(f->tok, text, strlen(text), true, false, ctx, CTX);
    assert_true(n > 2);
    /* the target's distributions after ctx and after ctx + the draft, from plain steps' logits */
    float *logits = malloc((size_t)2 * V * sizeof *logits);
    double *p0 = malloc((size_t)V * sizeof *p0), *p1 = malloc((size_t)V * sizeof *p1);
    char err[256];
    engine_seq plain = {.slot = 0, .tokens = ctx, .n_tokens = n, .logits = logits};
    assert_int_equal(engine_step(f->e, &plain, 1, NULL, err, sizeof err), 0);
    probabilities(logits, V, T, p0);
    /* the draft: the second most likely token, so that both acceptance and rejection happen often */
    int best = 0, draft = -1;
    for (int i = 1; i < V; i++) best = p0[i] > p0[best] ? i : best;
    for (int i = 0; i < V; i++)
        if (i != best && (draft < 0 || p0[i] > p0[draft])) draft = i;
    ctx[n] = draft;
    engine_slot_clear(f->e, 0);
    plain = (engine_seq){.slot = 0, .tokens = ctx, .n_tokens = n + 1, .logits = logits + V};
    assert_int_equal(engine_step(f->e, &plain, 1, NULL, err, sizeof err), 0);
    probabilities(logits + V, V, T, p1);

    /* verification steps: the prompt's last token pending, the draft after it */
    int *first = calloc((size_t)V, sizeof *first), *second = calloc((size_t)V, sizeof *second), accepted = 0;
    sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = T;
    engine_result samples[2], last;
    engine_slot_clear(f->e, 0);
    engine_seq prompt = {.slot = 0, .tokens = ctx, .n_tokens = n - 1};
    assert_int_equal(engine_step(f->e, &prompt, 1, NULL, err, sizeof err), 0);
    for (int seed = 0; seed < N; seed++) {
        sp.seed = (uint64_t)seed * 7919u + 17u;
        /* each verification rewinds to the prompt's end (its K/V stay): a rollback every time */
        int32_t feed[2] = {ctx[n - 1], draft};
        engine_seq verify = {.slot = 0, .tokens = feed, .n_tokens = 2, .pos = n - 1, .want_token = true, .sp = &sp,
                             .n_sample = 2, .sampled = samples};
        if (engine_step(f->e, &verify, 1, &last, err, sizeof err) != 0) fail_msg("verify: %s", err);
        assert_int_equal(last.token, samples[1].token);
        int a = engine_verify_accept(&feed[1], 1, samples);
        first[samples[0].token]++; /* emitted whether accepted or not: the draft or the correction */
        if (a == 1) {
            accepted++;
            second[samples[1].token]++; /* the bonus token */
        }
    }
    int df0, df1;
    double c0 = chi_square(first, p0, V, N, &df0), c1 = chi_square(second, p1, V, accepted, &df1);
    print_message("acceptance %d of %d (p(draft) = %.3f); chi-square %.1f (df %d, limit %.1f), %.1f (df %d, limit %.1f)\n",
                  accepted, N, p0[draft], c0, df0, chi_square_limit(df0), c1, df1, chi_square_limit(df1));
    assert_true(df0 >= 1 && df1 >= 1);
    assert_true(c0 < chi_square_limit(df0));
    assert_true(c1 < chi_square_limit(df1));
    /* the acceptance rate itself is p(draft): within 4 standard deviations */
    double sd = sqrt(N * p0[draft] * (1 - p0[draft]));
    assert_true(fabs(accepted - N * p0[draft]) < 4 * sd);
    free(first);
    free(second);
    free(p0);
    free(p1);
    free(logits);
}

/* A draft_max beyond the engine's, and a verification wider than max_draft, are refused; so
 * is speculation over a hybrid model, which cannot roll back its recurrent state. */
static void test_refusals(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    sched_config cfg = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = 256, .queue_size = 4,
                        .spec = SCHED_SPEC_NGRAM, .draft_max = DRAFT_MAX + 1};
    char err[256];
    assert_null(sched_create(f->e, f->tok, &cfg, err, sizeof err));
    assert_non_null(strstr(err, "draft_max"));
    sampling_params sp;
    sampling_params_default(&sp);
    int32_t toks[DRAFT_MAX + 2] = {1};
    engine_result res[DRAFT_MAX + 2], last;
    engine_seq q = {.slot = 0, .tokens = toks, .n_tokens = DRAFT_MAX + 2, .want_token = true, .sp = &sp,
                    .n_sample = DRAFT_MAX + 2, .sampled = res};
    assert_int_equal(engine_step(f->e, &q, 1, &last, err, sizeof err), ENGINE_EINVAL);
    assert_non_null(strstr(err, "max_draft"));

    const char *env = getenv("INFERD_SHARED_DIR");
    char path[1200];
    snprintf(path, sizeof path, "%s/reference/qwen3_5.gguf", env && *env ? env : INFERD_SHARED_DIR);
    model *hm = model_load(path, err, sizeof err);
    if (!hm) {
        print_message("hybrid refusal not checked: cannot load %s: %s\n", path, err);
        return;
    }
    tokenizer *ht = tokenizer_load(hm->gguf, err, sizeof err);
    engine_config ec = {.n_slots = 1, .ctx_per_slot = 64, .max_batch_tokens = 64, .n_threads = 1, .max_draft = 4};
    engine *he = ht ? engine_open(ENGINE_DEVICE_CPU, hm, &ec, err, sizeof err) : NULL;
    if (!he) fail_msg("hybrid engine: %s", err);
    cfg = (sched_config){.n_slots = 1, .ctx_per_slot = 64, .max_batch_tokens = 64, .queue_size = 1,
                         .spec = SCHED_SPEC_NGRAM, .draft_max = 4};
    assert_null(sched_create(he, ht, &cfg, err, sizeof err));
    assert_non_null(strstr(err, "recurrent state"));
    engine_free(he);
    tokenizer_free(ht);
    model_free(hm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_draft),
        cmocka_unit_test(test_greedy_identical),
        cmocka_unit_test(test_greedy_stop_strings),
        cmocka_unit_test(test_greedy_grammar),
        cmocka_unit_test(test_greedy_preempted),
        cmocka_unit_test(test_sampled_identical),
        cmocka_unit_test(test_rejection_sampling_distribution),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
