/* test_swa.c - the sliding layers' own KV pool (docs/sliding-kv.md) through the scheduler on the
 * CPU engine (or, with a second argument "cuda", the CUDA engine), over the reference models
 * with sliding-window layers (../shared/reference: gemma3, gemma4, gpt-oss; window 8) and two
 * synthetic ones: `mk_gemma3` (mkmodel's gemma3, 5 sliding layers : 1 full, window 40, head_dim
 * 64: the GPU's flash and tensor-core decode kernels) and `g4_w128` (a gemma4 of 2 sliding
 * layers : 1 full as gpt-oss alternates them, window 128, head_dim 64 / 128, the last 3 of 6
 * layers reading earlier layers' K/V).  Every run is compared token for token with the same
 * requests on an engine without a sliding pool (engine_config.no_swa_pool: every layer's K/V
 * kept, as before; what the reference tests check against HF at their shapes), tokens and
 * logprobs bit for bit (both engines --deterministic, so that the GPU's results do not depend
 * on how the scheduler batched and chunked them; the CPU's never do):
 *   - long greedy generations past the window, four sequences in one continuous batch, with
 *     a sliding pool far smaller than the sequences would need without freeing; a request never
 *     holds more sliding blocks than its ring, and every block is back at the end;
 *   - the same with speculative decoding (drafts verified and rolled back in both pools);
 *   - prefix-cache hits on prompts longer than the window (a chat's next turn; a whole prompt
 *     cached, copy-on-write in both pools), and a hit cut short where its window was evicted;
 *   - preemption when the full pool runs short. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "../model/tiny_model.h"
#include "backend/backend.h"
#include "base/log.h"
#include "model/gguf.h"
#include "synth/gguf_write.h"
#include "sched/sched.h"
#include "text/tokenizer.h"

#define N_SLOTS 4
#define N_JOBS 4
#define CTX 1024
#define BATCH 64
#define DRAFT_MAX 4
#define MAX_OUT 800

typedef struct fixture {
    const char *name;
    model *m;
    void *image; /* a tiny_model's GGUF image, which the model reads */
    tokenizer *tok;
    void *vocab_mem; /* a stand-in vocabulary's GGUF image, when the model's own does not load */
    gguf_file *vocab;
    engine *plain, *swa; /* without and with the sliding pool */
} fixture;

static engine_device g_device = ENGINE_DEVICE_CPU;

static engine *try_engine(const fixture *f, bool no_swa_pool, size_t kv_cache_mb, char *err, size_t errlen)
{
    engine_config cfg = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = BATCH, .n_threads = 1,
                         .max_draft = DRAFT_MAX, .no_swa_pool = no_swa_pool, .kv_cache_mb = kv_cache_mb,
                         .deterministic = true};
    return engine_open(g_device, f->m, &cfg, err, errlen);
}

static engine *open_engine(const fixture *f, bool no_swa_pool, size_t kv_cache_mb)
{
    char err[512];
    engine *e = try_engine(f, no_swa_pool, kv_cache_mb, err, sizeof err);
    if (!e) fail_msg("%s: engine: %s", f->name, err);
    return e;
}

/* An SPM vocabulary of the model's size ("<unk>", "<s>", "</s>", then one word per id), for a
 * model whose own tokenizer this build does not load (gemma4's): the scheduler needs one to
 * turn ids into text, and these tests look at ids only. */
static tokenizer *stand_in_vocab(fixture *f, char *err, size_t errlen)
{
    const int n = f->m->hp.n_vocab;
    const char **tokens = calloc((size_t)n, sizeof *tokens);
    char (*words)[16] = calloc((size_t)n, sizeof *words);
    float *scores = calloc((size_t)n, sizeof *scores);
    int32_t *types = calloc((size_t)n, sizeof *types);
    assert_true(tokens && words && scores && types && n > 3);
    for (int i = 0; i < n; i++) {
        snprintf(words[i], sizeof words[i], "\xE2\x96\x81w%d", i);
        tokens[i] = i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : words[i];
        types[i] = i == 0 ? 2 : i < 3 ? 3 : 1;
        scores[i] = -(float)i;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, n);
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, n);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    size_t size = 0;
    assert_int_equal(gguf_writer_write_mem(w, &f->vocab_mem, &size), 0);
    gguf_writer_free(w);
    free(tokens);
    free(words);
    free(scores);
    free(types);
    if (!(f->vocab = gguf_open_memory(f->vocab_mem, size, err, errlen))) return NULL;
    print_message("%s: its own tokenizer does not load here: a stand-in vocabulary of %d ids\n", f->name, n);
    return tokenizer_load(f->vocab, err, errlen);
}

/* The fixture's tokenizer and engines, once f->m is loaded.  On the GPU, a model or machine
 * the CUDA engine refuses (no device) skips the tests. */
static int setup_engines(fixture *f)
{
    char err[512];
    if (!(f->tok = tokenizer_load(f->m->gguf, err, sizeof err)) && !(f->tok = stand_in_vocab(f, err, sizeof err)))
        fail_msg("tokenizer: %s", err);
    if (g_device != ENGINE_DEVICE_CPU && !(f->plain = try_engine(f, true, 0, err, sizeof err))) {
        print_message("skipping %s: the cuda engine: %s\n", f->name, err);
        model_free(f->m);
        f->m = NULL;
        return 0;
    }
    if (!f->plain) f->plain = open_engine(f, true, 0);
    f->swa = open_engine(f, false, 0);
    log_set_level(LOG_WARN);
    return 0;
}

static int setup_model(void **state, const char *name)
{
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    f->name = name;
    const char *env = getenv("INFERD_SHARED_DIR");
    char path[1200], err[256];
    snprintf(path, sizeof path, "%s/reference/%s.gguf", env && *env ? env : INFERD_SHARED_DIR, name);
    if (!(f->m = model_load(path, err, sizeof err))) {
        print_message("skipping: cannot load %s: %s\n", path, err);
        return 0;
    }
    return setup_engines(f);
}

static int setup_gemma3(void **state) { return setup_model(state, "gemma3"); }
static int setup_gemma4(void **state) { return setup_model(state, "gemma4"); }
static int setup_gpt_oss(void **state) { return setup_model(state, "gpt-oss"); }

/* mkmodel's gemma3 (its tokenizer, learned from the built-in corpus): 6 layers of n_embd 128,
 * 2 heads of 64 over 1 kv head, window 40, F16 (small: the CPU runs it too). */
static int setup_mk_gemma3(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    f->name = "mk_gemma3";
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    mkmodel_set_arch(&cfg, MODEL_ARCH_GEMMA3);
    cfg.n_embd = 128, cfg.n_layer = 6, cfg.n_head = 2, cfg.n_head_kv = 1, cfg.head_dim = 64, cfg.n_ff = 256;
    cfg.n_vocab = 512, cfg.n_ctx = CTX, cfg.n_swa = 40, cfg.ftype = MKMODEL_F16, cfg.seed = 27;
    char err[512];
    if (!(f->m = tiny_mkmodel_load(&cfg, err, sizeof err))) fail_msg("mkmodel: %s", err);
    return setup_engines(f);
}

/* A tiny_model gemma4 (the stand-in vocabulary): 6 layers of n_embd 128, 2 query heads, sliding
 * layers of head_dim 64 over 1 kv head with a window of 128, full ones of 128, two sliding to one
 * full (gpt-oss's alternation, at its window), the last 3 reading earlier layers' K/V; F16. */
static int setup_g4_w128(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    f->name = "g4_w128";
    tiny_spec s = tiny_spec_default();
    s.arch = "gemma4";
    s.n_vocab = 512, s.n_embd = 128, s.n_layer = 6, s.n_head = 2, s.n_head_kv = 1, s.n_ff = 256, s.n_ctx = CTX;
    s.n_swa = 128, s.g4_head_dim_full = 128, s.g4_n_kv_full = 1, s.g4_ple = 32, s.g4_kv_shared = 3;
    s.tied = true, s.wtype = GGML_TYPE_F16, s.seed = 128;
    size_t size;
    char err[512];
    f->image = tiny_model_build(&s, &size);
    assert_non_null(f->image);
    if (!(f->m = tiny_model_load(f->image, size, err, sizeof err))) fail_msg("%s", err);
    return setup_engines(f);
}

static int teardown(void **state)
{
    fixture *f = *state;
    engine_free(f->plain);
    engine_free(f->swa);
    tokenizer_free(f->tok);
    gguf_close(f->vocab);
    free(f->vocab_mem);
    model_free(f->m);
    free(f->image);
    free(f);
    return 0;
}

typedef struct job {
    const int32_t *prompt;
    int n_prompt, max_tokens;
} job;

typedef struct outcome {
    int32_t ids[MAX_OUT];
    float logprobs[MAX_OUT];
    int n, cached;
    sched_finish finish;
} outcome;

typedef struct run_stats {
    sched_stats end;
    int swa_used_max; /* sliding blocks in use, the most seen while the jobs ran */
} run_stats;

/* Runs the jobs at once through scheduler s (greedy, to max_tokens), polling every millisecond
 * until all finish (300 s at most: generous for a loaded 2-core machine, where a synthetic
 * fixture's three tests, a dozen such runs, took up to 410 s together). */
static void run_on(const fixture *f, sched *s, const job *jobs, int n, outcome *o, run_stats *rs)
{
    sched_req *r[8];
    assert_true(n <= 8);
    for (int i = 0; i < n; i++) {
        memset(&o[i], 0, sizeof o[i]);
        sched_params p = {.prompt = jobs[i].prompt, .n_prompt = jobs[i].n_prompt, .max_tokens = jobs[i].max_tokens,
                          .want_logprobs = true, .ignore_eos = true};
        sampling_params_default(&p.sp);
        p.sp.n_top_logprobs = 0;
        assert_int_equal(sched_submit(s, &p, NULL, NULL, &r[i]), SCHED_OK);
    }
    memset(rs, 0, sizeof *rs);
    time_t deadline = time(NULL) + 300;
    for (int done = 0; done < n;) {
        done = 0;
        for (int i = 0; i < n; i++) {
            sched_output out;
            while (o[i].finish == SCHED_FINISH_NONE && sched_req_take(r[i], &out)) {
                for (int t = 0; t < out.n_tokens && o[i].n < MAX_OUT; t++, o[i].n++) {
                    o[i].ids[o[i].n] = out.tokens[t].token;
                    o[i].logprobs[o[i].n] = out.tokens[t].logprob;
                }
                o[i].finish = out.finish;
                if (out.finish != SCHED_FINISH_NONE) o[i].cached = out.cached_tokens;
                sched_output_clear(&out);
            }
            done += o[i].finish != SCHED_FINISH_NONE;
        }
        sched_stats st;
        sched_get_stats(s, &st);
        if (st.kv_swa_blocks_used > rs->swa_used_max) rs->swa_used_max = st.kv_swa_blocks_used;
        if (time(NULL) > deadline) fail_msg("%s: the requests did not finish within 300 s", f->name);
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    for (int i = 0; i < n; i++) sched_req_release(r[i]);
    sched_get_stats(s, &rs->end);
}

static sched *open_sched(const fixture *f, engine *e, sched_spec spec)
{
    sched_config cfg = {.n_slots = N_SLOTS, .ctx_per_slot = CTX, .max_batch_tokens = BATCH, .queue_size = 16,
                        .spec = spec, .draft_max = DRAFT_MAX, .spec_no_gate = true}; /* drafts every step */
    char err[256];
    sched *s = sched_create(e, f->tok, &cfg, err, sizeof err);
    if (!s) fail_msg("sched_create: %s", err);
    return s;
}

/* run_on through a scheduler of its own. */
static void run_jobs(const fixture *f, engine *e, sched_spec spec, const job *jobs, int n, outcome *o, run_stats *rs)
{
    sched *s = open_sched(f, e, spec);
    run_on(f, s, jobs, n, o, rs);
    sched_destroy(s);
}

static void assert_same(const fixture *f, const outcome *a, const outcome *b, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(a[i].finish, SCHED_FINISH_LENGTH);
        assert_int_equal(b[i].finish, SCHED_FINISH_LENGTH);
        int diff = 0;
        while (diff < a[i].n && diff < b[i].n && a[i].ids[diff] == b[i].ids[diff]) diff++;
        if (a[i].n != b[i].n || diff < a[i].n)
            fail_msg("%s, %s, job %d: %d and %d tokens, first difference at token %d", f->name, what, i, a[i].n,
                     b[i].n, diff);
        /* the same K/V read in the same order: the same bits */
        for (int t = 0; t < a[i].n; t++)
            if (memcmp(&a[i].logprobs[t], &b[i].logprobs[t], sizeof(float)) != 0)
                fail_msg("%s, %s, job %d: token %d's logprob %.9g vs %.9g", f->name, what, i, t, a[i].logprobs[t],
                         b[i].logprobs[t]);
    }
}

/* Prompts of 5 to 70 tokens (ids from the vocabulary's middle, a pattern per job). */
static int32_t g_prompts[N_JOBS][70];
static const int PROMPT_LEN[N_JOBS] = {5, 40, 70, 33};

static void make_jobs(const fixture *f, job *jobs, int max_tokens)
{
    const int n_vocab = tokenizer_n_vocab(f->tok);
    for (int j = 0; j < N_JOBS; j++) {
        for (int i = 0; i < PROMPT_LEN[j]; i++) g_prompts[j][i] = (int32_t)(n_vocab / 4 + (i * (7 + j) + 13 * j) % (n_vocab / 2));
        jobs[j] = (job){.prompt = g_prompts[j], .n_prompt = PROMPT_LEN[j], .max_tokens = max_tokens};
    }
}

/* Four sequences decoding 300 tokens each (10+ blocks; 450 for a window of 128) past the window,
 * in one batch, with a sliding pool of 6 blocks per row (12 at 128): without freeing it would
 * run out after 6 blocks each (12).
 * Then, on the same scheduler, the next turn of the first one (its 5-token prompt, 60 tokens
 * of its reply, 10 new ones): its 2 blocks are still in the full pool, but the sliding pool
 * has cycled since and their window is gone, so the hit is cut to a prefix whose window is
 * still cached (none here): fewer positions read from the cache, the same tokens. */
static void test_long_decode(void **state)
{
    fixture *f = *state;
    if (!f->m) skip();
    const int window = engine_kv_swa_window(f->swa), ring = engine_kv_swa_ring(f->swa);
    assert_int_equal(engine_kv_blocks_swa(f->plain), 0);
    assert_true(window > 0 && window <= 128);
    const int gen = window < 2 * ENGINE_KV_BLOCK ? 300 : 450;
    assert_true(engine_kv_blocks_swa(f->swa) < N_JOBS * (5 + gen) / ENGINE_KV_BLOCK); /* what they need without freeing */
    job jobs[N_JOBS];
    make_jobs(f, jobs, gen);
    outcome a[N_JOBS], b[N_JOBS], a1, b1;
    run_stats ra, rb;
    static int32_t turn[75];
    for (int pass = 0; pass < 2; pass++) {
        sched *s = open_sched(f, pass ? f->swa : f->plain, SCHED_SPEC_OFF);
        run_on(f, s, jobs, N_JOBS, pass ? b : a, pass ? &rb : &ra);
        memcpy(turn, g_prompts[0], 5 * sizeof *turn);
        memcpy(turn + 5, a[0].ids, 60 * sizeof *turn);
        memcpy(turn + 65, g_prompts[1], 10 * sizeof *turn);
        const job next = {.prompt = turn, .n_prompt = 75, .max_tokens = 50};
        run_stats rn;
        run_on(f, s, &next, 1, pass ? &b1 : &a1, &rn);
        assert_int_equal(rn.end.kv_swa_blocks_used, 0);
        sched_destroy(s);
    }
    assert_same(f, a, b, N_JOBS, "long decode");
    assert_int_equal(ra.end.kv_swa_blocks_total, 0);
    assert_int_equal(rb.end.kv_swa_blocks_total, engine_kv_blocks_swa(f->swa));
    assert_true(rb.swa_used_max > 0 && rb.swa_used_max <= N_SLOTS * ring);
    assert_int_equal(rb.end.kv_swa_blocks_used, 0);
    assert_int_equal(rb.end.kv_blocks_used, 0);
    print_message("%s: window %d, sliding pool %d blocks (ring %d), at most %d in use for %d sequences of up to %d tokens; "
                  "a sequence of %d tokens holds %zu bytes of K/V (%zu without the pool)\n",
                  f->name, window, engine_kv_blocks_swa(f->swa), ring, rb.swa_used_max, N_JOBS, 70 + gen, CTX,
                  engine_kv_seq_bytes(f->swa, CTX), engine_kv_seq_bytes(f->plain, CTX));
    assert_same(f, &a1, &b1, 1, "window evicted");
    print_message("%s: the next turn read %d prompt tokens from the cache without the pool, %d with it (its "
                  "window evicted)\n", f->name, a1.cached, b1.cached);
    assert_int_equal(a1.cached, 2 * ENGINE_KV_BLOCK);
    assert_true(b1.cached < a1.cached);
    /* speculative decoding: drafts' sliding blocks taken and given back with the full ones */
    run_jobs(f, f->swa, SCHED_SPEC_NGRAM, jobs, N_JOBS, b, &rb);
    assert_same(f, a, b, N_JOBS, "speculative");
    assert_int_equal(rb.end.kv_swa_blocks_used, 0);
}

/* A chat's next turn: the first request's prompt and reply as the prefix of the second, far
 * longer than the window; then the second's prompt again, cached whole (its last position is
 * recomputed in copies of the last blocks of both pools).  Same tokens as without the pool. */
static void test_prefix_hits(void **state)
{
    fixture *f = *state;
    if (!f->m) skip();
    job first[N_JOBS];
    make_jobs(f, first, 160);
    outcome a0[1];
    run_stats ra;
    run_jobs(f, f->plain, SCHED_SPEC_OFF, &first[2], 1, a0, &ra);
    /* the next turn: 70 prompt tokens + 154 of the reply (224 = 7 whole blocks) + 20 new ones;
     * then its first 224 tokens alone, cached whole */
    static int32_t turn[244];
    memcpy(turn, g_prompts[2], 70 * sizeof *turn);
    memcpy(turn + 70, a0[0].ids, 154 * sizeof *turn);
    memcpy(turn + 224, g_prompts[1], 20 * sizeof *turn);
    job jobs[3] = {first[2], {.prompt = turn, .n_prompt = 244, .max_tokens = 50},
                   {.prompt = turn, .n_prompt = 224, .max_tokens = 50}};
    /* one after the other on one scheduler per engine (the prefix cache is the scheduler's),
     * so that each finds the ones before it cached */
    outcome a[3], b[3];
    for (int pass = 0; pass < 2; pass++) {
        outcome *o = pass ? b : a;
        sched *s = open_sched(f, pass ? f->swa : f->plain, SCHED_SPEC_OFF);
        for (int j = 0; j < 3; j++) run_on(f, s, &jobs[j], 1, &o[j], &ra);
        assert_int_equal(ra.end.kv_swa_blocks_used, 0);
        sched_destroy(s);
    }
    assert_same(f, a, b, 3, "prefix hits");
    /* the next turn found the first's prompt and reply: its window's sliding blocks were kept */
    print_message("%s: the next turn read %d of 244 prompt tokens from the cache (%d without the pool), its "
                  "first 224 alone %d\n", f->name, b[1].cached, a[1].cached, b[2].cached);
    assert_int_equal(a[1].cached, 224);
    assert_int_equal(b[1].cached, 224);
    assert_int_equal(b[2].cached, 224 - 1); /* whole: the last position is recomputed, in copies */
}

/* A full pool of a few dozen blocks for four rows of up to ~700 tokens (22 blocks each): running
 * sequences are preempted and recomputed (mostly from the prefix cache, sliding windows
 * included), and the tokens are still those without the sliding pool and without preemption. */
static void test_preemption(void **state)
{
    fixture *f = *state;
    if (!f->m) skip();
    /* the budget: the sliding pool and about 20 full blocks (rounded up to whole MiB) */
    const size_t swa_bytes = (size_t)engine_kv_blocks_swa(f->swa) * engine_kv_block_bytes_swa(f->swa);
    const size_t mb = (swa_bytes + 20 * engine_kv_block_bytes(f->swa) + (1u << 20) - 1) >> 20;
    engine *small = open_engine(f, false, mb);
    if (engine_kv_blocks(small) >= N_JOBS * 22) {
        print_message("%s: %d full blocks in %zu MiB, too many to preempt\n", f->name, engine_kv_blocks(small), mb);
        engine_free(small);
        skip();
    }
    job jobs[N_JOBS];
    make_jobs(f, jobs, 620);
    outcome a[N_JOBS], b[N_JOBS];
    run_stats ra, rb;
    run_jobs(f, f->plain, SCHED_SPEC_OFF, jobs, N_JOBS, a, &ra);
    run_jobs(f, small, SCHED_SPEC_OFF, jobs, N_JOBS, b, &rb);
    assert_same(f, a, b, N_JOBS, "preempted");
    print_message("%s: %d full blocks, %d sliding; %llu preemptions\n", f->name, engine_kv_blocks(small),
                  engine_kv_blocks_swa(small), (unsigned long long)rb.end.preemptions);
    assert_true(rb.end.preemptions > 0);
    assert_int_equal(rb.end.kv_swa_blocks_used, 0);
    assert_int_equal(rb.end.kv_blocks_used, 0);
    engine_free(small);
}

#define MODEL_TESTS(setup)                                                          \
    cmocka_unit_test_setup_teardown(test_long_decode, setup, teardown),            \
        cmocka_unit_test_setup_teardown(test_prefix_hits, setup, teardown),        \
        cmocka_unit_test_setup_teardown(test_preemption, setup, teardown)

/* One model per run (argv[1]: gemma3, gemma4, gpt-oss, mk_gemma3 or g4_w128; meson runs each
 * as its own test, so each has its own time bound under the sanitizers), or all; argv[2]: the
 * device (cpu, the default, or cuda). */
int main(int argc, char **argv)
{
    const struct CMUnitTest gemma3[] = {MODEL_TESTS(setup_gemma3)}, gemma4[] = {MODEL_TESTS(setup_gemma4)},
                            gpt_oss[] = {MODEL_TESTS(setup_gpt_oss)}, mk_gemma3[] = {MODEL_TESTS(setup_mk_gemma3)},
                            g4_w128[] = {MODEL_TESTS(setup_g4_w128)};
    const char *only = argc > 1 ? argv[1] : "";
    if (argc > 2 && !engine_device_parse(argv[2], &g_device)) {
        fprintf(stderr, "test_swa: unknown device %s\n", argv[2]);
        return 2;
    }
    int failed = 0;
    if (!*only || !strcmp(only, "gemma3")) failed += cmocka_run_group_tests_name("gemma3", gemma3, NULL, NULL);
    if (!*only || !strcmp(only, "gemma4")) failed += cmocka_run_group_tests_name("gemma4", gemma4, NULL, NULL);
    if (!*only || !strcmp(only, "gpt-oss")) failed += cmocka_run_group_tests_name("gpt-oss", gpt_oss, NULL, NULL);
    if (!*only || !strcmp(only, "mk_gemma3")) failed += cmocka_run_group_tests_name("mk_gemma3", mk_gemma3, NULL, NULL);
    if (!*only || !strcmp(only, "g4_w128")) failed += cmocka_run_group_tests_name("g4_w128", g4_w128, NULL, NULL);
    return failed;
}
