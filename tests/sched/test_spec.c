/* test_spec.c - speculative decoding (n-gram and draft-model drafts, verification in the step,
 * acceptance, rollback) on the CPU engine over a real trained model (stories260K); built twice,
 * test_spec (n-gram, acceptance) and test_spec_draft (-DSPEC_DRAFT_MODEL: the draft model):
 *   - the drafters alone (ngram_draft) and behind the proposer seam (proposer.h): the draft
 *     model's drafts are its greedy continuation, batched over rows, after rollbacks and
 *     resets;
 *   - a draft model (stories260K as its own draft: every greedy draft accepted; a random model
 *     of the same vocabulary: few) gives the outputs of decoding without drafts, greedy and
 *     sampled, at batch sizes 1 and 4, with stop strings, grammars and a cancelled neighbour;
 *     mismatched tokenizers and engines are refused;
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
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "grammar/grammar.h"
#include "sched/ngram.h"
#include "sched/proposer.h"
#include "synth/mkmodel.h"
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
    engine *self_draft; /* stories260K again, as its own draft model (N_SLOTS rows, no max_draft) */
    int draft_min;      /* sched_config.draft_min of the speculative runs (0 but in one test) */
    bool gate;          /* the speculative runs keep the off-switch (spec_no_gate false): one test */
    char path[1200];    /* stories260K's */
} fixture;

/* An engine of m with n rows of CTX positions: a target (max_draft DRAFT_MAX) or a draft (0). */
static engine *open_engine(const model *m, int n, int max_draft)
{
    engine_config cfg = {.n_slots = n, .ctx_per_slot = CTX, .max_batch_tokens = 256, .n_threads = 1,
                         .max_draft = max_draft};
    char err[256];
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    return e;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    const char *env = getenv("INFERD_SHARED_DIR");
    char err[256];
    snprintf(f->path, sizeof f->path, "%s/models/stories260K.gguf", env && *env ? env : INFERD_SHARED_DIR);
    if (!(f->m = model_load(f->path, err, sizeof err))) {
        print_message("skipping: cannot load %s: %s\n", f->path, err);
        return 0;
    }
    if (!(f->tok = tokenizer_load(f->m->gguf, err, sizeof err))) fail_msg("tokenizer: %s", err);
    f->e = open_engine(f->m, N_SLOTS, DRAFT_MAX);
    f->self_draft = open_engine(f->m, N_SLOTS, 0);
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    if (f->self_draft) engine_free(f->self_draft);
    engine_free(f->e);
    tokenizer_free(f->tok);
    model_free(f->m);
    free(f);
    return 0;
}

#ifndef SPEC_DRAFT_MODEL
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

#endif

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

/* Runs every job at once through a scheduler over engine e (and draft, for SCHED_SPEC_DRAFT);
 * the outcomes in o. */
static void run_jobs(fixture *f, engine *e, sched_spec spec, engine *draft, const job *jobs, int n, outcome *o,
                     sched_stats *st)
{
    sched_config cfg = {.n_slots = engine_get_config(e)->n_slots, .ctx_per_slot = CTX, .max_batch_tokens = 256,
                        .queue_size = 64, .spec = spec, .draft_max = DRAFT_MAX, .draft = draft,
                        .draft_min = f->draft_min, .spec_no_gate = !f->gate};
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
        fail_msg("%s, job %d: speculative output differs:\n  off (%d tokens, %s): %.*s\n  on  (%d tokens, %s): %.*s",
                 what, i, a->n, sched_finish_name(a->finish), (int)a->len, a->text, b->n, sched_finish_name(b->finish),
                 (int)b->len, b->text);
    for (int t = 0; t < a->n; t++) {
        if (fabsf(a->logprobs[t] - b->logprobs[t]) > 1e-5f || a->top1[t] != b->top1[t])
            fail_msg("%s, job %d: token %d's logprobs differ (%g vs %g)", what, i, t, a->logprobs[t], b->logprobs[t]);
    }
}

/* Runs jobs without and with speculation (spec, drafted by `draft` for SCHED_SPEC_DRAFT) on
 * engine e, checks every output equal; returns the speculative run's statistics. */
static sched_stats compare_spec(fixture *f, engine *e, sched_spec spec, engine *draft, const job *jobs, int n,
                                const char *what)
{
    outcome *off = calloc((size_t)n, sizeof *off), *on = calloc((size_t)n, sizeof *on);
    sched_stats st_off, st_on;
    run_jobs(f, e, SCHED_SPEC_OFF, NULL, jobs, n, off, &st_off);
    run_jobs(f, e, spec, draft, jobs, n, on, &st_on);
    for (int i = 0; i < n; i++) assert_same(&off[i], &on[i], what, i);
    /* every request finished: no position is held (a hybrid's rewinds give theirs back too) */
    assert_int_equal(st_off.kv_tokens_used, 0);
    assert_int_equal(st_on.kv_tokens_used, 0);
    assert_int_equal(st_off.spec_draft_tokens, 0);
    assert_true(st_on.spec_accepted_tokens <= st_on.spec_draft_tokens);
    print_message("%s: %d requests, %llu steps without drafts, %llu with; %llu of %llu drafted tokens accepted\n", what,
                  n, (unsigned long long)st_off.steps, (unsigned long long)st_on.steps,
                  (unsigned long long)st_on.spec_accepted_tokens, (unsigned long long)st_on.spec_draft_tokens);
    /* the per-proposer counters are the totals' */
    assert_int_equal(st_on.spec_proposer_draft[spec], st_on.spec_draft_tokens);
    assert_int_equal(st_on.spec_proposer_accepted[spec], st_on.spec_accepted_tokens);
    free(off);
    free(on);
    return st_on;
}

#ifndef SPEC_DRAFT_MODEL
static sched_stats compare_on(fixture *f, engine *e, const job *jobs, int n, const char *what)
{
    return compare_spec(f, e, SCHED_SPEC_NGRAM, NULL, jobs, n, what);
}

static uint64_t compare(fixture *f, const job *jobs, int n, const char *what)
{
    return compare_on(f, f->e, jobs, n, what).spec_accepted_tokens;
}

#endif

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

/* A grammar of sentences from a few of the stories' words: drafts often leave it. */
static grammar *words_grammar(void)
{
    char err[256];
    static const char re[] = "( (the|a|cat|dog|sat|on|mat|big|ran|and)){4,40}\\.";
    grammar *g = grammar_from_regex(re, strlen(re), err, sizeof err);
    if (!g) fail_msg("grammar: %s", err);
    return g;
}

/* An engine whose KV pool is 1 MiB (25 blocks): four rows of ~225 tokens (8 blocks each) do not
 * fit, so running requests are preempted. */
static engine *open_small_pool(const model *m)
{
    engine_config cfg = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = 256, .n_threads = 1,
                         .max_draft = DRAFT_MAX, .kv_cache_mb = 1};
    char err[256];
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    return e;
}

#ifndef SPEC_DRAFT_MODEL
static void test_greedy_identical(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    job jobs[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++)
        jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 40 + 8 * (i % 4), .no_spec = i % 5 == 4};
    assert_true(compare(f, jobs, N_PROMPTS, "greedy") > 0);
    /* with the off-switch, which drafts where steps measured faster: the same outputs (what it
     * drafts depends on timing, so nothing is asserted about it) */
    f->gate = true;
    compare(f, jobs, N_PROMPTS, "greedy, off-switch on");
    f->gate = false;
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
    run_jobs(f, f->e, SCHED_SPEC_OFF, NULL, jobs, N_PROMPTS, plain, &st);
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
    grammar *g = words_grammar();
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
    engine *small = open_small_pool(f->m);
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

#endif

#ifdef SPEC_DRAFT_MODEL
/* ---- the proposer seam ------------------------------------------------------------------ */

/* The greedy continuation of toks[0..n-1] on engine e (row 0, cleared): k tokens into out. */
static void greedy_after(engine *e, const int32_t *toks, int n, int k, int32_t *out)
{
    sampling_params sp;
    sampling_params_default(&sp);
    char err[256];
    engine_result res;
    engine_slot_clear(e, 0);
    engine_seq q = {.slot = 0, .tokens = toks, .n_tokens = n, .pos = 0, .want_token = true, .sp = &sp};
    for (int j = 0; j < k; j++) {
        if (engine_step(e, &q, 1, &res, err, sizeof err) != 0) fail_msg("step: %s", err);
        out[j] = res.token;
        q = (engine_seq){.slot = 0, .tokens = &out[j], .n_tokens = 1, .pos = n + j, .want_token = true, .sp = &sp};
    }
    engine_slot_clear(e, 0);
}

static int encode(const fixture *f, const char *text, int32_t *ids, int cap)
{
    int n = tokenizer_encode(f->tok, text, strlen(text), true, false, ids, cap);
    assert_true(n > 0 && n <= cap);
    return n;
}

/* The n-gram proposer through the seam is ngram_draft, row by row; it keeps no state. */
static void test_proposer_ngram(void **state)
{
    (void)state;
    proposer *p = proposer_ngram_new();
    assert_non_null(p);
    assert_string_equal(proposer_name(p), "ngram");
    const int32_t a[] = {7, 8, 9, 1, 2, 3, 4, 9, 5, 6, 7, 8, 9}, b[] = {1, 2, 3, 4};
    int32_t da[8], db[8], want[8];
    sampling_params sp;
    sampling_params_default(&sp);
    proposer_row rows[2] = {{.slot = 0, .toks = a, .n_toks = 13, .k_max = 4, .sp = &sp, .draft = da},
                            {.slot = 1, .toks = b, .n_toks = 4, .k_max = 8, .sp = &sp, .draft = db, .n_draft = 5}};
    proposer_draft(p, rows, 2);
    assert_int_equal(rows[0].n_draft, ngram_draft(a, 13, 4, want));
    assert_memory_equal(da, want, 4 * sizeof *da);
    assert_int_equal(rows[1].n_draft, 0); /* no match: reset to 0 whatever it held */
    proposer_keep(p, 0, 3);
    proposer_reset(p, 1);
    proposer_free(p);
}

/* The draft-model proposer (stories260K drafting for itself): a row's drafts are the greedy
 * continuation of its tokens; rows draft together as they would alone; after proposer_keep
 * rolls a row back past rejected drafts and a correction follows, the drafts continue the new
 * sequence; after proposer_reset another sequence takes the row; p_min cuts drafts short. */
static void test_proposer_draft_model(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    char err[256];
    proposer *p = proposer_draft_model_new(f->self_draft, 0, err, sizeof err);
    if (!p) fail_msg("proposer: %s", err);
    assert_string_equal(proposer_name(p), "draft");
    sampling_params sp;
    sampling_params_default(&sp);
    enum { K = 5 };
    int32_t t0[CTX], t1[CTX], g0[K + 1], g1[K + 1], d0[K], d1[K], want[K];
    int n0 = encode(f, PROMPTS[0], t0, CTX - 16), n1 = encode(f, PROMPTS[1], t1, CTX - 16);
    /* each row's pending token is the prompt's first greedy token; the drafts the rest */
    greedy_after(f->e, t0, n0, K + 1, g0);
    greedy_after(f->e, t1, n1, K + 1, g1);
    t0[n0++] = g0[0];
    t1[n1++] = g1[0];
    proposer_row rows[2] = {{.slot = 2, .toks = t0, .n_toks = n0, .k_max = K, .sp = &sp, .draft = d0},
                            {.slot = 1, .toks = t1, .n_toks = n1, .k_max = K, .sp = &sp, .draft = d1}};
    proposer_reset(p, 2);
    proposer_reset(p, 1);
    proposer_draft(p, rows, 2);
    assert_int_equal(rows[0].n_draft, K);
    assert_int_equal(rows[1].n_draft, K);
    assert_memory_equal(d0, g0 + 1, K * sizeof *d0);
    assert_memory_equal(d1, g1 + 1, K * sizeof *d1);

    /* row 2: two drafts accepted, the third rejected for another token (a correction) */
    proposer_keep(p, 2, n0 + 2);
    memcpy(t0 + n0, d0, 2 * sizeof *t0);
    n0 += 2;
    t0[n0++] = (g0[3] + 1) % f->m->hp.n_vocab;
    greedy_after(f->e, t0, n0, K, want);
    rows[0].n_toks = n0;
    proposer_draft(p, rows, 1);
    assert_int_equal(rows[0].n_draft, K);
    assert_memory_equal(d0, want, K * sizeof *d0);

    /* row 1 gets another sequence: row 2's first one, from its prompt */
    proposer_reset(p, 1);
    rows[1] = (proposer_row){.slot = 1, .toks = t0, .n_toks = n0, .k_max = 3, .sp = &sp, .draft = d1};
    proposer_draft(p, &rows[1], 1);
    assert_int_equal(rows[1].n_draft, 3);
    assert_memory_equal(d1, want, 3 * sizeof *d1);
    proposer_free(p);

    /* p_min: each kept draft had at least that probability, so drafts are prefixes of the
     * uncut ones, and a high bar cuts some short */
    p = proposer_draft_model_new(f->self_draft, 0.9f, err, sizeof err);
    if (!p) fail_msg("proposer: %s", err);
    int cut = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        int32_t t[CTX], g[K + 1], d[K];
        int n = encode(f, PROMPTS[i], t, CTX - 16);
        greedy_after(f->e, t, n, K + 1, g);
        t[n++] = g[0];
        proposer_row row = {.slot = 0, .toks = t, .n_toks = n, .k_max = K, .sp = &sp, .draft = d};
        proposer_reset(p, 0);
        proposer_draft(p, &row, 1);
        assert_memory_equal(d, g + 1, (size_t)row.n_draft * sizeof *d);
        cut += row.n_draft < K;
    }
    print_message("p_min 0.9: %d of %d drafts cut short\n", cut, N_PROMPTS);
    assert_true(cut > 0);
    proposer_free(p);
}

/* ---- draft-model speculation in the scheduler ------------------------------------------- */

static void greedy_jobs(job *jobs, int n, int max_tokens)
{
    for (int i = 0; i < n; i++)
        jobs[i] = (job){.prompt = PROMPTS[i % N_PROMPTS], .max_tokens = max_tokens + 4 * (i % 5), .no_spec = i % 5 == 4};
}

/* stories260K as its own draft: outputs equal decoding without drafts at batch sizes 4 and 1,
 * and every greedy draft is accepted (the draft's argmax is the target's: the CPU's logits of
 * a position do not depend on the step that computes them), which is a check of the draft's
 * K/V bookkeeping at every step.  Prompts come twice, so the target reads later ones from its
 * prefix cache while the draft model computes them whole.  With --draft-min 3 no verification
 * carries fewer than 3 drafts. */
static void test_draft_self_greedy(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    job jobs[N_PROMPTS];
    greedy_jobs(jobs, N_PROMPTS, 40);
    for (int i = 0; i < N_PROMPTS; i++) jobs[i].prompt = PROMPTS[i % (N_PROMPTS / 2)];
    sched_stats st = compare_spec(f, f->e, SCHED_SPEC_DRAFT, f->self_draft, jobs, N_PROMPTS, "self draft, 4 rows");
    assert_true(st.spec_draft_tokens > 0);
    assert_int_equal(st.spec_accepted_tokens, st.spec_draft_tokens);
    assert_true(st.prefix_hit_tokens > 0);
    f->draft_min = 3;
    st = compare_spec(f, f->e, SCHED_SPEC_DRAFT, f->self_draft, jobs, N_PROMPTS / 2, "self draft, draft-min 3");
    f->draft_min = 0;
    assert_true(st.spec_verifies > 0 && st.spec_draft_tokens >= 3 * st.spec_verifies);
    engine *t1 = open_engine(f->m, 1, DRAFT_MAX), *d1 = open_engine(f->m, 1, 0);
    st = compare_spec(f, t1, SCHED_SPEC_DRAFT, d1, jobs, 5, "self draft, 1 row");
    assert_true(st.spec_draft_tokens > 0);
    assert_int_equal(st.spec_accepted_tokens, st.spec_draft_tokens);
    engine_free(d1);
    engine_free(t1);
}

/* Preemption under draft-model speculation (the KV pool of test_greedy_preempted): a preempted
 * request is recomputed, perhaps in another row, whose draft K/V start afresh; outputs equal,
 * every greedy draft accepted, every block back. */
static void test_draft_preempted(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    engine *small = open_small_pool(f->m);
    job jobs[5];
    for (int i = 0; i < 5; i++) jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 200, .ignore_eos = true};
    sched_stats st = compare_spec(f, small, SCHED_SPEC_DRAFT, f->self_draft, jobs, 5, "self draft, preempted");
    assert_true(st.preemptions > 0);
    assert_true(st.spec_draft_tokens > 0);
    assert_int_equal(st.spec_accepted_tokens, st.spec_draft_tokens);
    assert_int_equal(st.kv_blocks_used, 0);
    engine_free(small);
}

/* The draft rows under stop strings, a grammar, sampling, and max_tokens that end requests
 * inside a draft. */
static void test_draft_self_mixed(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    grammar *g = words_grammar();
    static const char *const stops[] = {" the", "ed", ".", " a"};
    job jobs[12];
    for (int i = 0; i < 12; i++) {
        jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 7 + 5 * i};
        if (i % 4 == 0) jobs[i].stop = stops[(i / 4) % 4];
        if (i % 4 == 1) jobs[i].g = g;
        if (i % 4 == 2) jobs[i].temperature = 0.8f, jobs[i].seed = 77 + (uint64_t)i;
    }
    sched_stats st = compare_spec(f, f->e, SCHED_SPEC_DRAFT, f->self_draft, jobs, 12, "self draft, mixed");
    assert_true(st.spec_accepted_tokens > 0);
    grammar_unref(g);
}

/* A random model of stories260K's vocabulary (mkmodel --vocab) drafts: its drafts are mostly
 * rejected, every rejection rolls both K/V back, and the outputs are still those without
 * drafts, greedy and sampled, at batch sizes 4 and 1. */
static void test_draft_other_model(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    char err[256], path[64];
    snprintf(path, sizeof path, "/tmp/test_spec_draft_%d.gguf", (int)getpid());
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    cfg.vocab = f->path;
    cfg.n_vocab = mkmodel_vocab_size(f->path, err, sizeof err);
    assert_true(cfg.n_vocab == f->m->hp.n_vocab);
    if (mkmodel_write(&cfg, "x", 1, path, err, sizeof err) != 0) fail_msg("mkmodel: %s", err);
    model *dm = model_load(path, err, sizeof err);
    unlink(path);
    if (!dm) fail_msg("draft model: %s", err);
    tokenizer *dt = tokenizer_load(dm->gguf, err, sizeof err);
    assert_non_null(dt);
    assert_true(tokenizer_compatible(f->tok, dt, err, sizeof err));
    engine *d4 = open_engine(dm, N_SLOTS, 0);
    job jobs[8];
    greedy_jobs(jobs, 8, 30);
    for (int i = 5; i < 8; i++) jobs[i].temperature = 0.9f, jobs[i].seed = 5 + (uint64_t)i;
    sched_stats st = compare_spec(f, f->e, SCHED_SPEC_DRAFT, d4, jobs, 8, "random draft, 4 rows");
    assert_true(st.spec_draft_tokens > 0);
    /* With --draft-min 3 the rejections halve a request's draft length no lower than 3 (a
     * shorter draft is never verified, so its length would never grow back: the request would
     * run the draft model every step for nothing), and pause it there: every request verifies
     * again after each pause, about once in 18 steps of its 120 tokens. */
    job longer[4];
    for (int i = 0; i < 4; i++) longer[i] = (job){.prompt = PROMPTS[i], .max_tokens = 120, .ignore_eos = true};
    f->draft_min = 3;
    st = compare_spec(f, f->e, SCHED_SPEC_DRAFT, d4, longer, 4, "random draft, draft-min 3");
    f->draft_min = 0;
    print_message("draft-min 3: %llu verifications\n", (unsigned long long)st.spec_verifies);
    assert_true(st.spec_draft_tokens >= 3 * st.spec_verifies);
    assert_true(st.spec_verifies >= 4 * 6);
    engine *t1 = open_engine(f->m, 1, DRAFT_MAX), *d1 = open_engine(dm, 1, 0);
    compare_spec(f, t1, SCHED_SPEC_DRAFT, d1, jobs, 4, "random draft, 1 row");
    engine_free(d1);
    engine_free(t1);
    engine_free(d4);
    tokenizer_free(dt);
    model_free(dm);
}

typedef struct canceller {
    _Atomic(sched_req *) r;
    int wakes; /* the scheduler thread's */
} canceller;

/* Cancels at the third wake: after the first token and two decodes, which verify drafts. */
static void cancel_on_wake(void *ctx)
{
    canceller *c = ctx;
    sched_req *r = atomic_load(&c->r);
    if (r && ++c->wakes >= 3) sched_req_cancel(r);
}

/* A request cancelled while it speculates: its row goes to the next request, whose output is
 * still the one without drafts (the draft model's row starts afresh). */
static void test_draft_cancel(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    engine *t1 = open_engine(f->m, 1, DRAFT_MAX), *d1 = open_engine(f->m, 1, 0);
    job after = {.prompt = PROMPTS[2], .max_tokens = 40};
    outcome plain;
    sched_stats st;
    run_jobs(f, t1, SCHED_SPEC_OFF, NULL, &after, 1, &plain, &st);
    sched_config cfg = {.n_slots = 1, .ctx_per_slot = CTX, .max_batch_tokens = 256, .queue_size = 4,
                        .spec = SCHED_SPEC_DRAFT, .draft_max = DRAFT_MAX, .draft = d1,
                        .spec_no_gate = true};
    char err[256];
    sched *s = sched_create(t1, f->tok, &cfg, err, sizeof err);
    if (!s) fail_msg("sched_create: %s", err);
    int32_t ids[CTX];
    sched_params p = {.prompt = ids, .n_prompt = encode(f, PROMPTS[0], ids, CTX / 2), .max_tokens = 200,
                      .ignore_eos = true};
    sampling_params_default(&p.sp);
    /* cancelled from its own wake callback (the scheduler thread) while it generates */
    canceller c = {.r = NULL};
    sched_req *r;
    assert_int_equal(sched_submit(s, &p, cancel_on_wake, &c, &r), SCHED_OK);
    atomic_store(&c.r, r);
    sched_output out = {0};
    sched_finish fin = SCHED_FINISH_NONE;
    for (time_t deadline = time(NULL) + 60; fin == SCHED_FINISH_NONE; sched_output_clear(&out)) {
        if (time(NULL) > deadline) fail_msg("no finish within 60 s");
        if (sched_req_take(r, &out)) fin = out.finish;
        if (out.completion_tokens > 100) sched_req_cancel(r); /* the wakes came before c.r was set */
    }
    assert_int_equal(fin, SCHED_FINISH_CANCELLED);
    sched_req_release(r);
    outcome o;
    memset(&o, 0, sizeof o);
    pthread_mutex_init(&o.mu, NULL);
    pthread_cond_init(&o.cv, NULL);
    p = (sched_params){.prompt = ids, .n_prompt = encode(f, after.prompt, ids, CTX / 2), .max_tokens = after.max_tokens,
                       .want_logprobs = true};
    sampling_params_default(&p.sp);
    p.sp.n_top_logprobs = 2;
    assert_int_equal(sched_submit(s, &p, on_wake, &o, &r), SCHED_OK);
    collect(&o, r);
    sched_req_release(r);
    sched_get_stats(s, &st);
    sched_destroy(s);
    assert_same(&plain, &o, "after a cancel", 0);
    assert_int_equal(st.requests_finished[SCHED_FINISH_CANCELLED], 1);
    assert_true(st.spec_draft_tokens > 0);
    pthread_mutex_destroy(&o.mu);
    pthread_cond_destroy(&o.cv);
    engine_free(d1);
    engine_free(t1);
}

/* Draft mode without a draft engine, with one of other rows, and a draft model whose tokenizer
 * differs (mkmodel's own, learned from text) are refused, saying what differs. */
static void test_draft_refusals(void **state)
{
    fixture *f = *state;
    if (!f->e) skip();
    char err[256], path[64];
    sched_config cfg = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = 256, .queue_size = 4,
                        .spec = SCHED_SPEC_DRAFT, .draft_max = DRAFT_MAX};
    assert_null(sched_create(f->e, f->tok, &cfg, err, sizeof err));
    assert_non_null(strstr(err, "draft model"));
    engine *d1 = open_engine(f->m, 1, 0);
    cfg.draft = d1;
    assert_null(sched_create(f->e, f->tok, &cfg, err, sizeof err));
    assert_non_null(strstr(err, "rows"));
    engine_free(d1);

    snprintf(path, sizeof path, "/tmp/test_spec_other_%d.gguf", (int)getpid());
    mkmodel_config mc;
    assert_true(mkmodel_preset("tiny", &mc));
    static const char corpus[] = "the cat sat on the mat and the dog ran to the big red ball";
    if (mkmodel_write(&mc, corpus, sizeof corpus - 1, path, err, sizeof err) != 0) fail_msg("mkmodel: %s", err);
    model *om = model_load(path, err, sizeof err);
    unlink(path);
    if (!om) fail_msg("model: %s", err);
    tokenizer *ot = tokenizer_load(om->gguf, err, sizeof err);
    assert_non_null(ot);
    assert_false(tokenizer_compatible(f->tok, ot, err, sizeof err));
    print_message("refused: %s\n", err);
    assert_non_null(strstr(err, "vocabulary"));
    assert_true(tokenizer_compatible(f->tok, f->tok, err, sizeof err));
    tokenizer_free(ot);
    model_free(om);
}

#endif

#ifndef SPEC_DRAFT_MODEL
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
    /* a draft_min above draft_max: no draft could ever be verified */
    cfg.draft_max = DRAFT_MAX;
    cfg.draft_min = DRAFT_MAX + 1;
    assert_null(sched_create(f->e, f->tok, &cfg, err, sizeof err));
    assert_non_null(strstr(err, "draft_min"));
    cfg.draft_min = 0;
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
    assert_null(sched_create(he, ht, &cfg, err, sizeof err)); /* one state slot: none to roll back from */
    assert_non_null(strstr(err, "and as many to roll speculation back from"));
    engine_free(he);
    tokenizer_free(ht);
    model_free(hm);
}

/* A hybrid model (transformers' qwen3_5 reference: gated DeltaNet layers) speculates: before a
 * verification the row's recurrent state is copied aside, and one that rejects a draft brings
 * it back and feeds the accepted tokens again (sched.c: spec_rewind), so greedy and sampled
 * outputs are those without drafts.  The random model's free text never repeats (every n-gram
 * draft rejected); under a grammar of repeated syllables its drafts are accepted in part. */
static void test_hybrid_speculation(void **state)
{
    fixture *f = *state;
    const char *env = getenv("INFERD_SHARED_DIR");
    char path[1200], err[256];
    snprintf(path, sizeof path, "%s/reference/qwen3_5.gguf", env && *env ? env : INFERD_SHARED_DIR);
    model *hm = model_load(path, err, sizeof err);
    if (!hm) {
        print_message("skipping: cannot load %s: %s\n", path, err);
        skip();
    }
    fixture hf = *f;
    if (!(hf.tok = tokenizer_load(hm->gguf, err, sizeof err))) fail_msg("tokenizer: %s", err);
    engine_config ec = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = 256, .n_threads = 1,
                        .max_draft = DRAFT_MAX, .n_states = 3 * N_SLOTS};
    engine *he = engine_open(ENGINE_DEVICE_CPU, hm, &ec, err, sizeof err);
    if (!he) fail_msg("hybrid engine: %s", err);
    static const char re[] = "(la |lo |li ){12}la la la\\.";
    grammar *g = grammar_from_regex(re, strlen(re), err, sizeof err);
    if (!g) fail_msg("grammar: %s", err);
    job jobs[8];
    for (int i = 0; i < 8; i++)
        jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 40 + 16 * (i % 3), .temperature = i >= 6 ? 0.8f : 0.0f,
                        .seed = 3 + (uint64_t)i, .ignore_eos = true, .g = i % 2 ? g : NULL};
    sched_stats st = compare_spec(&hf, he, SCHED_SPEC_NGRAM, NULL, jobs, 8, "hybrid qwen3_5, n-gram");
    assert_true(st.spec_draft_tokens > st.spec_accepted_tokens && st.spec_accepted_tokens > 0);
    grammar_unref(g);
    engine_free(he);
    tokenizer_free(hf.tok);
    model_free(hm);
}

/* A mkmodel qwen35 (or qwen35moe) of 4 layers with its MTP block (--mtp 1), served with its
 * engine running the block (engine_config.mtp) and its own tokenizer. */
static engine *mtp_engine(bool moe, model **m, tokenizer **tok)
{
    mkmodel_config c;
    assert_true(mkmodel_preset(moe ? "qwen3.5-35b-a3b" : "qwen3.5-9b", &c));
    c.n_embd = 64, c.n_layer = 4, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 16, c.n_ff = 96;
    c.n_ctx = 512, c.n_vocab = 320, c.ftype = MKMODEL_Q8_0, c.n_mtp = 1;
    c.ssm_state = 16, c.ssm_groups = 2, c.ssm_vheads = 4, c.ssm_inner = 64, c.n_rot = 8;
    if (moe) c.n_expert = 8, c.n_expert_used = 2, c.n_ff_exp = 32, c.n_expert_shared = 1;
    char err[256], path[64];
    snprintf(path, sizeof path, "/tmp/test_spec_mtp_%d.gguf", (int)getpid());
    static const char corpus[] = "Once upon a time, there was a little girl named Lily. The cat sat on the mat. "
                                 "Tom and Sue went to the park. The sun was hot. A big dog ran.";
    if (mkmodel_write(&c, corpus, sizeof corpus - 1, path, err, sizeof err) != 0) fail_msg("mkmodel: %s", err);
    *m = model_load(path, err, sizeof err);
    unlink(path);
    if (!*m) fail_msg("load: %s", err);
    if (!(*tok = tokenizer_load((*m)->gguf, err, sizeof err))) fail_msg("tokenizer: %s", err);
    engine_config ec = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = 256, .n_threads = 1,
                        .max_draft = DRAFT_MAX, .n_states = 3 * N_SLOTS, .mtp = true};
    engine *e = engine_open(ENGINE_DEVICE_CPU, *m, &ec, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    return e;
}

/* --speculative mtp (SCHED_SPEC_MTP): the model's own MTP block drafts, caught up after every
 * step from the target's hidden states; greedy and sampled outputs, with a grammar and a
 * request that opts out, are those without drafts on both presets, and drafts are verified. */
static void test_mtp_speculation(void **state)
{
    fixture *f = *state;
    for (int moe = 0; moe < 2; moe++) {
        fixture mf = *f;
        model *m;
        engine *e = mtp_engine(moe, &m, &mf.tok);
        char err[256];
        static const char re[] = "(la |lo |li ){12}la la la\\.";
        grammar *g = grammar_from_regex(re, strlen(re), err, sizeof err);
        if (!g) fail_msg("grammar: %s", err);
        job jobs[8];
        for (int i = 0; i < 8; i++)
            jobs[i] = (job){.prompt = PROMPTS[i], .max_tokens = 20 + 12 * (i % 3), .temperature = i >= 6 ? 0.8f : 0.0f,
                            .seed = 7 + (uint64_t)i, .ignore_eos = true, .g = i == 3 ? g : NULL, .no_spec = i == 5};
        sched_stats st = compare_spec(&mf, e, SCHED_SPEC_MTP, NULL, jobs, 8, moe ? "mtp, qwen35moe" : "mtp, qwen35");
        assert_true(st.spec_draft_tokens > 0 && st.spec_verifies > 0);
        grammar_unref(g);
        engine_free(e);
        tokenizer_free(mf.tok);
        model_free(m);
    }
}

#endif

/* Two executables of this file (meson.build): the n-gram and acceptance tests, and with
 * SPEC_DRAFT_MODEL the draft model's, each under its own time bound (the sanitizer build runs
 * each in minutes on a loaded machine). */
int main(void)
{
#ifdef SPEC_DRAFT_MODEL
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proposer_ngram),
        cmocka_unit_test(test_proposer_draft_model),
        cmocka_unit_test(test_draft_self_greedy),
        cmocka_unit_test(test_draft_self_mixed),
        cmocka_unit_test(test_draft_preempted),
        cmocka_unit_test(test_draft_other_model),
        cmocka_unit_test(test_draft_cancel),
        cmocka_unit_test(test_draft_refusals),
    };
#else
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_draft),
        cmocka_unit_test(test_greedy_identical),
        cmocka_unit_test(test_greedy_stop_strings),
        cmocka_unit_test(test_greedy_grammar),
        cmocka_unit_test(test_greedy_preempted),
        cmocka_unit_test(test_sampled_identical),
        cmocka_unit_test(test_rejection_sampling_distribution),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_hybrid_speculation),
        cmocka_unit_test(test_mtp_speculation),
    };
#endif
    return cmocka_run_group_tests(tests, setup, teardown);
}
