/* bench.c - `inferd bench`: engine throughput without HTTP, through engine.h only (so it
 * measures any backend the same way).
 *
 *  prefill  one sequence of P tokens, fed in chunks of --ubatch tokens per step (the budget
 *           the server uses); tok/s = P / wall time of all chunks (after one untimed
 *           warm-up prompt).
 *  decode   B sequences in B slots, each first given a prompt of --context tokens (default
 *           DECODE_PROMPT; fed in --ubatch chunks) and DECODE_WARMUP decode steps, untimed (a
 *           backend may capture a graph per batch size), then --gen timed steps that each
 *           carry one new token for every sequence; aggregate tok/s = B * gen / wall time of
 *           those steps.  --context sets how many keys each decode token attends to.
 *  verify   (--draft K) the decode test's steps as speculative decoding's verifications: each
 *           sequence feeds its token and K drafted ones and samples all K + 1 positions, then
 *           moves on by one position (every draft rejected: the rollback).  What a verification
 *           costs does not depend on what it accepts, so the row's tok/s is that of every draft
 *           accepted (K + 1 tokens per sequence and step), and the lines after the table give the
 *           tok/s at acceptance rates 0, 1/4, 1/2, 3/4 and 1 (1 + rate x K tokens per step)
 *           beside the plain decode's.
 *  draft    (--draft K --model-draft FILE) the draft model's side of speculative decoding: the
 *           decode test on the draft model, B sequences one token per step, which is what each
 *           of the K rounds of drafting costs; the lines after the table then count a
 *           speculative step as K draft steps plus one verification and give its tok/s at the
 *           same acceptance rates.
 *  spec     (--draft K --accept LIST) speculative decoding run end to end at known acceptance:
 *           B sequences first decode --gen x (K + 1) tokens greedily (untimed: the target's own
 *           continuation), then from the same point --gen timed steps verify K drafts each
 *           (engine_verify_accept, fewer near the continuation's end), whose tokens are the
 *           continuation's with each one kept with probability P/100 (a wrong token otherwise)
 *           for every P of LIST, so that what is accepted follows the target; the accepted
 *           tokens are checked against the continuation (differences are counted: a verify
 *           step's logits may round apart from a decode step's).  With --model-draft the draft
 *           model's engine sits beside the target's on the device (its KV pool its rows', the
 *           target's what is left, as serve runs them) and drafts every step through the
 *           draft-model proposer (its K rounds and the catch-up after each verification) before
 *           its drafts are replaced by the continuation's: the draft model's cost at that
 *           acceptance.  tok/s = accepted + 1 per sequence and step over the wall time; the
 *           lines after the table give acceptance, tokens per step and the ratio to the decode
 *           row of the same batch.
 *  embed    an embedding model (an encoder, whose steps are all embeddings, or any model with
 *           --pooling): what an embedding server does instead of prefill and decode.  For each
 *           --prompt T (default 128) and --batch N (default 1,8,64,512): N inputs of T tokens
 *           each (input i starts at token i of the random ids), packed whole into steps of at
 *           most --ubatch tokens (at least one input a step), each pooled as the file or
 *           --pooling says (L2-normalised where the server normalises) with no K/V kept
 *           between steps; one untimed step first.  tok/s = N * T / wall time of all the
 *           steps, and embeddings/s = N / that time.  The engine's GPU memory line (cuda:
 *           weights, KV cache) is its log line at creation, on stderr.
 * Tokens are random ids (seeded), greedy sampling: the values do not change the work done.
 * Each measurement is printed as a table row, then (after the table) as one JSON line that
 * starts with '{', for scripts. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_common.h"
#include "base/rng.h"
#include "base/timing.h"
#include "sched/proposer.h"

#define CMD "bench"
#define MAX_LIST 16
#define DECODE_PROMPT 16 /* tokens each decode sequence starts with */
#define DECODE_WARMUP 2  /* untimed decode steps first (graph capture, caches) */

typedef struct bench_opts {
    const char *model_path, *device;
    int prompts[MAX_LIST], n_prompts;
    int batches[MAX_LIST], n_batches;
    int n_gen, n_threads, ubatch, reps;
    int context; /* prompt tokens before the decode steps */
    int draft;   /* verify test: drafted tokens per sequence and step (0: no verify test) */
    const char *draft_model; /* draft test: the draft model (--model-draft), or NULL */
    int accept[MAX_LIST], n_accept; /* spec test: percent of drafted tokens the target's own */
    bool deterministic; /* engine_config.deterministic: measures what --deterministic costs */
    int tensor_parallel; /* engine_config.tensor_parallel (--tensor-parallel / --tp) */
    int pooling;        /* --pooling: engine_pooling + 1, 0: the model's (embed test: see above) */
    bool prompts_set, batches_set; /* the lists were given (the embed test has its own defaults) */
} bench_opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: inferd bench -m MODEL.gguf [options]\n"
            "  --device D      auto | cpu | cuda (default cpu)\n"
            "  --prompt LIST   prefill lengths (default 512,2048)\n"
            "  --batch LIST    decode batch sizes (default 1,4,8,16,32,64)\n"
            "  --gen N         timed decode steps per batch size (default 128)\n"
            "  --context N     prompt tokens of each decode sequence before its timed steps (default 16)\n"
            "  --ubatch N      most tokens per prefill step (default 512)\n"
            "  --reps N        repetitions of each measurement, best kept (default 3)\n"
            "  --draft K       also time speculative verification of K drafted tokens per sequence (default 0: off)\n"
            "  --model-draft F with --draft: also time drafting with the draft model F (same vocabulary)\n"
            "  --accept LIST   with --draft: also run speculative decoding whose drafts are the model's own\n"
            "                  greedy tokens with these probabilities, in percent (e.g. 0,50,80,100)\n"
            "  --threads N     CPU threads (default: all cores)\n"
            "  --deterministic the batch-invariant kernels of serve --deterministic\n"
            "  --tensor-parallel N, --tp N  split the model across N GPUs (--device cuda; default 1)\n"
            "  --pooling P     time embeddings (none | mean | cls | last | rank) instead of prefill and\n"
            "                  decode: N inputs (--batch, default 1,8,64,512) of T tokens (--prompt,\n"
            "                  default 128) in steps of --ubatch tokens; an encoder always does, pooled\n"
            "                  as its file says unless --pooling\n");
}

enum {
    OPT_DEVICE = 256, OPT_PROMPT, OPT_BATCH, OPT_GEN, OPT_UBATCH, OPT_REPS, OPT_THREADS, OPT_CONTEXT, OPT_DRAFT,
    OPT_DETERMINISTIC, OPT_MODEL_DRAFT, OPT_POOLING, OPT_TP, OPT_ACCEPT
};

static int parse_args(int argc, char **argv, bench_opts *o)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},     {"device", required_argument, NULL, OPT_DEVICE},
        {"prompt", required_argument, NULL, OPT_PROMPT}, {"batch", required_argument, NULL, OPT_BATCH},
        {"gen", required_argument, NULL, OPT_GEN},   {"ubatch", required_argument, NULL, OPT_UBATCH},
        {"reps", required_argument, NULL, OPT_REPS}, {"threads", required_argument, NULL, OPT_THREADS},
        {"context", required_argument, NULL, OPT_CONTEXT}, {"draft", required_argument, NULL, OPT_DRAFT},
        {"model-draft", required_argument, NULL, OPT_MODEL_DRAFT}, {"deterministic", no_argument, NULL, OPT_DETERMINISTIC},
        {"pooling", required_argument, NULL, OPT_POOLING}, {"tensor-parallel", required_argument, NULL, OPT_TP},
        {"tp", required_argument, NULL, OPT_TP},             {"accept", required_argument, NULL, OPT_ACCEPT},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
    };
    *o = (bench_opts){.device = "cpu", .prompts = {512, 2048}, .n_prompts = 2,
                      .batches = {1, 4, 8, 16, 32, 64}, .n_batches = 6, .n_gen = 128,
                      .ubatch = 512, .reps = 3, .context = DECODE_PROMPT};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case OPT_DEVICE: o->device = optarg; break;
        case OPT_PROMPT:
            ok = (o->n_prompts = cli_parse_int_list(CMD, "--prompt", optarg, 1 << 20, o->prompts, MAX_LIST)) > 0;
            o->prompts_set = true;
            break;
        case OPT_BATCH:
            ok = (o->n_batches = cli_parse_int_list(CMD, "--batch", optarg, 4096, o->batches, MAX_LIST)) > 0;
            o->batches_set = true;
            break;
        case OPT_GEN: ok = cli_parse_int(CMD, "--gen", optarg, 1, 1 << 20, &o->n_gen); break;
        case OPT_UBATCH: ok = cli_parse_int(CMD, "--ubatch", optarg, 1, 1 << 20, &o->ubatch); break;
        case OPT_REPS: ok = cli_parse_int(CMD, "--reps", optarg, 1, 1000, &o->reps); break;
        case OPT_THREADS: ok = cli_parse_int(CMD, "--threads", optarg, 1, 1024, &o->n_threads); break;
        case OPT_CONTEXT: ok = cli_parse_int(CMD, "--context", optarg, 1, 1 << 20, &o->context); break;
        case OPT_DRAFT: ok = cli_parse_int(CMD, "--draft", optarg, 0, 64, &o->draft); break;
        case OPT_DETERMINISTIC: o->deterministic = true; break;
        case OPT_TP: ok = cli_parse_int(CMD, "--tensor-parallel", optarg, 1, 8, &o->tensor_parallel); break;
        case OPT_MODEL_DRAFT: o->draft_model = optarg; break;
        case OPT_ACCEPT: ok = (o->n_accept = cli_parse_int_list(CMD, "--accept", optarg, 100, o->accept, MAX_LIST)) > 0; break;
        case OPT_POOLING:
            if ((o->pooling = engine_pooling_parse(optarg) + 1) == 0) {
                fprintf(stderr, "inferd bench: --pooling: '%s' is none of none, mean, cls, last, rank\n", optarg);
                ok = false;
            }
            break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
        if (!ok) return 2;
    }
    if (o->draft_model && o->draft < 1) {
        fprintf(stderr, "inferd bench: --model-draft times drafting K tokens: give --draft K too\n");
        return 2;
    }
    if (o->n_accept && o->draft < 1) {
        fprintf(stderr, "inferd bench: --accept runs speculative decoding of K drafts: give --draft K too\n");
        return 2;
    }
    if (!o->model_path || optind != argc) {
        fprintf(stderr, "inferd bench: %s\n", o->model_path ? "unexpected argument" : "-m MODEL.gguf is required");
        usage(stderr);
        return 2;
    }
    return 0;
}

static int max_of(const int *v, int n)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > m) m = v[i];
    return m;
}

/* Deterministic pseudo-random token ids in [0, n_vocab). */
static void random_tokens(int32_t *out, int n, int n_vocab, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = (int32_t)((seed >> 33) % (uint64_t)n_vocab);
    }
}

typedef struct measurement {
    const char *test;
    int n_prompt, batch, n_tokens; /* embed: T tokens per input, N inputs, N * T */
    double secs;
} measurement;

typedef struct bench_ctx {
    const bench_opts *o;
    const model *m;
    engine *e;
    sampling_params sp;
    measurement done[4 * MAX_LIST * MAX_LIST]; /* embed: a row per (T, N) */
    int n_done;
    engine_pooling pooling; /* the embed test's */
    int embed_tokens;       /* the embed test's tokens per input (best_of passes the inputs) */
    int min_batch_tokens;   /* make_engine: a step takes at least this many tokens */
    char draft_name[256]; /* the draft rows' model (time_draft_model) and its weights */
    size_t draft_weight_bytes;
    struct spec_count {   /* the spec test's runs, for the lines after the table */
        int batch, pct;
        bool draft_model;
        long steps, drafted, accepted, tokens, differ;
        double secs, draft_secs; /* draft_secs: of secs, in the proposer (its rounds) */
    } spec[MAX_LIST * MAX_LIST];
    int n_spec;
    char err[512];
} bench_ctx;

static double tok_per_s(const measurement *r) { return r->secs > 0 ? r->n_tokens / r->secs : 0; }

/* A table row now; the JSON line is printed with the others after the table. */
static bool is_embed(const measurement *r) { return !strcmp(r->test, "embed"); }
static double emb_per_s(const measurement *r) { return r->secs > 0 ? r->batch / r->secs : 0; }

static void report(bench_ctx *b, measurement r)
{
    printf("%-8s %8d %6d %9d %10.3f %12.1f", r.test, r.n_prompt, r.batch, r.n_tokens, r.secs, tok_per_s(&r));
    if (is_embed(&r)) printf(" %10.1f embeddings/s", emb_per_s(&r));
    putchar('\n');
    fflush(stdout);
    b->done[b->n_done++] = r;
}

/* JSON string body of s (quotes, backslashes and control bytes escaped). */
static void json_str(const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
}

static void print_json(const bench_ctx *b, const char *backend)
{
    for (int i = 0; i < b->n_done; i++) {
        const measurement *r = &b->done[i];
        printf("{\"test\":\"%s\",\"model\":\"", r->test);
        const bool draft = !strcmp(r->test, "draft");
        json_str(draft ? b->draft_name : b->m->name);
        printf("\",\"backend\":\"%s\",\"weight_bytes\":%zu,\"n_prompt\":%d,\"batch\":%d,"
               "\"n_tokens\":%d,\"seconds\":%.6f,\"tokens_per_s\":%.2f,\"deterministic\":%s",
               backend, draft ? b->draft_weight_bytes : b->m->weight_bytes, r->n_prompt, r->batch, r->n_tokens, r->secs, tok_per_s(r),
               b->o->deterministic ? "true" : "false");
        if (is_embed(r))
            printf(",\"pooling\":\"%s\",\"embeddings_per_s\":%.2f", engine_pooling_name(b->pooling), emb_per_s(r));
        printf("}\n");
    }
}

/* Prompt of n tokens into an empty slot, in steps of at most ubatch tokens; the last step
 * samples into *res.  0, or -1. */
static int prefill_slot(bench_ctx *b, int slot, const int32_t *toks, int n, engine_result *res)
{
    engine_slot_clear(b->e, slot);
    for (int pos = 0; pos < n; pos += b->o->ubatch) {
        int len = n - pos < b->o->ubatch ? n - pos : b->o->ubatch;
        engine_seq s = {.slot = slot, .tokens = toks + pos, .n_tokens = len, .pos = pos,
                        .want_token = pos + len == n, .sp = &b->sp};
        if (engine_step(b->e, &s, 1, res, b->err, sizeof b->err) != 0) return -1;
    }
    return 0;
}

/* Time one prompt of n tokens in slot 0. Seconds, or -1. */
static double time_prefill(bench_ctx *b, const int32_t *toks, int n)
{
    engine_result res;
    double t0 = timing_now_s();
    if (prefill_slot(b, 0, toks, n, &res)) return -1;
    return timing_now_s() - t0;
}

/* B sequences: a prompt of --context tokens each (slot by slot; prompt i starts at token i of
 * toks, so sequences differ) and DECODE_WARMUP steps, untimed, then n_gen timed steps, each
 * feeding every sequence its token and K drafts (K > 0: a verification of all K + 1, after
 * which the sequence moves on by one position).  Seconds, or -1. */
static double time_decode(bench_ctx *b, int B, const int32_t *prompt, int K)
{
    engine_seq *seqs = calloc((size_t)B, sizeof *seqs);
    engine_result *res = calloc((size_t)B, sizeof *res);
    engine_result *sampled = calloc((size_t)B * (K + 1), sizeof *sampled);
    int32_t *next = calloc((size_t)B * (K + 1), sizeof *next);
    double secs = -1;
    if (!seqs || !res || !next || !sampled) {
        snprintf(b->err, sizeof b->err, "out of memory for batch %d", B);
        goto out;
    }
    int ctx = b->o->context;
    for (int i = 0; i < B; i++) {
        seqs[i] = (engine_seq){.slot = i, .want_token = true, .sp = &b->sp, .n_sample = K + 1,
                               .sampled = sampled + (size_t)i * (K + 1)};
        if (prefill_slot(b, i, prompt + i, ctx, &res[i])) goto out;
    }
    double t0 = 0;
    for (int g = 0; g < DECODE_WARMUP + b->o->n_gen; g++) {
        if (g == DECODE_WARMUP) t0 = timing_now_s();
        for (int i = 0; i < B; i++) {
            int32_t *feed = next + (size_t)i * (K + 1);
            feed[0] = res[i].token;
            for (int k = 1; k <= K; k++) feed[k] = prompt[(i + g + k) % (ctx + B)]; /* drafts: any tokens */
            seqs[i].tokens = feed;
            seqs[i].n_tokens = K + 1;
            seqs[i].pos = ctx + g;
        }
        if (engine_step(b->e, seqs, B, res, b->err, sizeof b->err) != 0) goto out;
    }
    secs = timing_now_s() - t0;
out:
    free(seqs);
    free(res);
    free(sampled);
    free(next);
    return secs;
}

/* Best of reps runs of fn; -1 on failure. */
static double best_of(int reps, double (*run)(bench_ctx *, const int32_t *, int), bench_ctx *b,
                      const int32_t *toks, int n)
{
    double best = -1;
    for (int r = 0; r < reps; r++) {
        double s = run(b, toks, n);
        if (s < 0) return -1;
        if (best < 0 || s < best) best = s;
    }
    return best;
}

static double decode_run(bench_ctx *b, const int32_t *toks, int B) { return time_decode(b, B, toks, 0); }
static double verify_run(bench_ctx *b, const int32_t *toks, int B) { return time_decode(b, B, toks, b->o->draft); }

/* The measurement of `test` at batch B, or NULL. */
static const measurement *find_done(const bench_ctx *b, const char *test, int B)
{
    for (int j = 0; j < b->n_done; j++)
        if (!strcmp(b->done[j].test, test) && b->done[j].batch == B) return &b->done[j];
    return NULL;
}

/* The verify rows against the decode rows of the same batch: tok/s at a few acceptance rates;
 * with a draft row, a speculative step costs K of its steps too. */
static void print_acceptance(const bench_ctx *b)
{
    const int K = b->o->draft, G = b->o->n_gen;
    for (int i = 0; i < b->n_done; i++) {
        const measurement *v = &b->done[i];
        if (strcmp(v->test, "verify") != 0) continue;
        const measurement *d = find_done(b, "decode", v->batch), *dr = find_done(b, "draft", v->batch);
        for (int with_draft = 0; with_draft <= (dr != NULL); with_draft++) {
            double step_s = v->secs / G + (with_draft ? K * dr->secs / G : 0); /* one speculative step */
            printf("verify batch %d, %d drafts%s: decode %.1f tok/s; at acceptance", v->batch, K,
                   with_draft ? " by the draft model" : "", d ? tok_per_s(d) : 0.0);
            for (int q = 0; q <= 4; q++) /* tokens per step and sequence: 1 + rate x K */
                printf(" %.2f: %.1f (%.2f tok/step)", q / 4.0, step_s > 0 ? v->batch * (1 + q / 4.0 * K) / step_s : 0.0,
                       1 + q / 4.0 * K);
            putchar('\n');
        }
    }
}

/* Lengths beyond the model's context (the default 2048-token prefill on a 512-token model) are
 * clamped to it, saying so: positions past the trained context measure nothing a server would
 * run. Prompts that become equal are measured once. */
static void clamp_to_context(bench_opts *o, bool embed, int n_ctx)
{
    if (n_ctx <= 0) return; /* the file does not say */
    int n = 0;
    for (int i = 0; i < o->n_prompts; i++) {
        int p = o->prompts[i];
        if (p > n_ctx) {
            fprintf(stderr, "inferd bench: %s of %d tokens is beyond the model's context (%d): measuring %d\n",
                    embed ? "an input" : "prefill", p, n_ctx, n_ctx);
            p = n_ctx;
        }
        bool seen = false;
        for (int j = 0; j < n; j++) seen = seen || o->prompts[j] == p;
        if (!seen) o->prompts[n++] = p;
    }
    o->n_prompts = n;
    if (embed) return; /* no decode steps */
    int gen_max = n_ctx - o->context - DECODE_WARMUP - o->draft; /* a verification reaches K positions further */
    if (gen_max < 1) {
        o->context = n_ctx - DECODE_WARMUP - 1 > 1 ? n_ctx - DECODE_WARMUP - 1 : 1;
        fprintf(stderr, "inferd bench: --context is beyond the model's context (%d): measuring %d\n", n_ctx, o->context);
        gen_max = n_ctx - o->context - DECODE_WARMUP - o->draft;
    }
    if (o->n_gen > gen_max && gen_max > 0) {
        fprintf(stderr, "inferd bench: %d decode steps after the %d-token prompt and %d warm-up steps are "
                        "beyond the model's context (%d): measuring %d\n", o->n_gen, o->context, DECODE_WARMUP,
                n_ctx, gen_max);
        o->n_gen = gen_max;
    }
}

/* Creates the engine for one phase (slots x context), replacing the previous one. */
static bool make_engine(bench_ctx *b, int n_slots, int ctx)
{
    if (b->e) engine_free(b->e);
    engine_config cfg = {.n_slots = n_slots, .ctx_per_slot = ctx, .max_batch_tokens = b->o->ubatch,
                         .n_threads = b->o->n_threads, .max_draft = b->o->draft,
                         .deterministic = b->o->deterministic, .tensor_parallel = b->o->tensor_parallel};
    if (cfg.max_batch_tokens < n_slots * DECODE_PROMPT) cfg.max_batch_tokens = n_slots * DECODE_PROMPT;
    if (cfg.max_batch_tokens < n_slots * (1 + b->o->draft)) cfg.max_batch_tokens = n_slots * (1 + b->o->draft);
    if (cfg.max_batch_tokens < b->min_batch_tokens) cfg.max_batch_tokens = b->min_batch_tokens;
    b->e = cli_engine_open(b->m, b->o->device, &cfg, b->err, sizeof b->err);
    return b->e != NULL;
}

/* The spec test's continuation length: --gen steps after DECODE_WARMUP, each at most K + 1
 * tokens, and the token after the prompt. */
static int spec_ref_len(const bench_opts *o) { return (DECODE_WARMUP + o->n_gen) * (o->draft + 1) + 1; }

/* B sequences: the prompt (--context tokens, sequence i from token i of prompt) and n_ref - 1
 * greedy decode steps: ref[i * n_ref + j] is sequence i's j-th token after its prompt. */
static int spec_reference(bench_ctx *b, int B, const int32_t *prompt, int32_t *ref, int n_ref)
{
    engine_seq *seqs = calloc((size_t)B, sizeof *seqs);
    engine_result *res = calloc((size_t)B, sizeof *res);
    int rc = seqs && res ? 0 : -1, ctx = b->o->context;
    if (rc) snprintf(b->err, sizeof b->err, "out of memory for batch %d", B);
    for (int i = 0; i < B && !rc; i++) {
        if ((rc = prefill_slot(b, i, prompt + i, ctx, &res[i]))) break;
        ref[(size_t)i * n_ref] = res[i].token;
    }
    for (int j = 0; j + 1 < n_ref && !rc; j++) {
        for (int i = 0; i < B; i++)
            seqs[i] = (engine_seq){.slot = i, .tokens = &ref[(size_t)i * n_ref + j], .n_tokens = 1, .pos = ctx + j,
                                   .want_token = true, .sp = &b->sp};
        if ((rc = engine_step(b->e, seqs, B, res, b->err, sizeof b->err))) break;
        for (int i = 0; i < B; i++) ref[(size_t)i * n_ref + j + 1] = res[i].token;
    }
    free(seqs);
    free(res);
    return rc;
}

/* One spec run (see the file's comment) of B sequences over their continuations ref, drafts
 * kept with probability pct/100; prop (or NULL) drafts first, for its cost.  The sequences'
 * K/V after their prompts are rewritten as the run goes.  Counts into *c; -1 on failure. */
static int time_spec(bench_ctx *b, proposer *prop, int B, const int32_t *prompt, const int32_t *ref, int pct,
                     struct spec_count *c)
{
    const int K = b->o->draft, ctx = b->o->context, n_ref = spec_ref_len(b->o), V = b->m->hp.n_vocab;
    const size_t row_len = (size_t)ctx + (size_t)n_ref;
    engine_seq *seqs = calloc((size_t)B, sizeof *seqs);
    engine_result *res = calloc((size_t)B, sizeof *res);
    engine_result *sampled = calloc((size_t)B * (K + 1), sizeof *sampled);
    int32_t *feed = calloc((size_t)B * (K + 1), sizeof *feed), *toks = calloc((size_t)B * row_len, sizeof *toks);
    int *n = calloc((size_t)B, sizeof *n); /* each sequence's pending token: ref[n] at position ctx + n */
    proposer_row *rows = calloc((size_t)B, sizeof *rows);
    int rc = seqs && res && sampled && feed && toks && n && rows ? 0 : -1;
    if (rc) snprintf(b->err, sizeof b->err, "out of memory for batch %d", B);
    for (int i = 0; i < B && !rc; i++) { /* the proposer reads each sequence as it stands */
        memcpy(toks + i * row_len, prompt + i, (size_t)ctx * sizeof *toks);
        memcpy(toks + i * row_len + ctx, ref + (size_t)i * n_ref, (size_t)n_ref * sizeof *toks);
        if (prop) proposer_reset(prop, i);
    }
    uint64_t rng = 0x5eedull + (uint64_t)pct * 1000003u + (uint64_t)B;
    double t0 = 0;
    for (int g = 0; g < DECODE_WARMUP + b->o->n_gen && !rc; g++) {
        if (g == DECODE_WARMUP) t0 = timing_now_s(); /* before: eager shapes' first use, the draft's prompts */
        int n_rows = 0;
        for (int i = 0; i < B; i++) {
            const int k = n_ref - 1 - n[i] < K ? n_ref - 1 - n[i] : K;
            rows[i] = (proposer_row){.slot = i, .toks = toks + i * row_len, .n_toks = ctx + n[i] + 1, .k_max = k,
                                     .sp = &b->sp, .draft = feed + (size_t)i * (K + 1) + 1};
            n_rows += k > 0;
        }
        if (prop && n_rows == B) { /* every row drafts near the end too */
            const double td = timing_now_s();
            proposer_draft(prop, rows, B);
            if (g >= DECODE_WARMUP) c->draft_secs += timing_now_s() - td;
        }
        for (int i = 0; i < B; i++) {
            int32_t *f = feed + (size_t)i * (K + 1);
            const int32_t *next = ref + (size_t)i * n_ref + n[i] + 1;
            f[0] = ref[(size_t)i * n_ref + n[i]];
            for (int j = 0; j < rows[i].k_max; j++)
                f[1 + j] = rng_unit(rng_next(&rng)) * 100.0 < pct ? next[j] : (next[j] + 1) % V;
            seqs[i] = (engine_seq){.slot = i, .tokens = f, .n_tokens = 1 + rows[i].k_max, .pos = ctx + n[i],
                                   .want_token = true, .sp = &b->sp, .n_sample = 1 + rows[i].k_max,
                                   .sampled = sampled + (size_t)i * (K + 1)};
        }
        if ((rc = engine_step(b->e, seqs, B, res, b->err, sizeof b->err))) break;
        for (int i = 0; i < B; i++) {
            const int k = rows[i].k_max, a = engine_verify_accept(feed + (size_t)i * (K + 1) + 1, k, seqs[i].sampled);
            for (int j = 0; j <= a && g >= DECODE_WARMUP; j++)
                c->differ += seqs[i].sampled[j].token != ref[(size_t)i * n_ref + n[i] + 1 + j];
            n[i] += a + 1; /* the continuation's tokens stand, the next one pending */
            if (prop) proposer_keep(prop, i, ctx + n[i]);
            if (g < DECODE_WARMUP) continue;
            c->drafted += k;
            c->accepted += a;
            c->tokens += a + 1;
        }
        c->steps += g >= DECODE_WARMUP;
    }
    c->secs = rc ? 0 : timing_now_s() - t0;
    free(seqs);
    free(res);
    free(sampled);
    free(feed);
    free(toks);
    free(n);
    free(rows);
    return rc;
}

/* The spec test at every batch size and --accept rate, in a target engine of its own (after a
 * draft model's engine with --model-draft, which then drafts beside it). */
static int bench_spec(bench_ctx *b, const int32_t *toks)
{
    const bench_opts *o = b->o;
    const int max_b = max_of(o->batches, o->n_batches), n_ref = spec_ref_len(o), ctx = o->context + n_ref + o->draft;
    model *dm = NULL;
    engine *de = NULL;
    proposer *prop = NULL;
    int32_t *ref = malloc((size_t)max_b * n_ref * sizeof *ref);
    int rc = -1;
    if (b->e) engine_free(b->e);
    b->e = NULL;
    if (!ref) {
        snprintf(b->err, sizeof b->err, "out of memory for the continuations");
        goto out;
    }
    if (o->draft_model) { /* first, its pool its rows': the target's engine takes what is left */
        char err[512];
        engine_config dc = {.n_slots = max_b, .ctx_per_slot = ctx, .max_batch_tokens = o->ubatch > max_b * (o->draft + 1) ? o->ubatch : max_b * (o->draft + 1),
                            .n_threads = o->n_threads, .kv_per_row = true, .deterministic = o->deterministic};
        if (!(dm = model_load(o->draft_model, b->err, sizeof b->err))) goto out;
        if (dm->hp.n_vocab != b->m->hp.n_vocab) {
            snprintf(b->err, sizeof b->err, "--model-draft %s has a vocabulary of %d tokens, the model %d",
                     o->draft_model, dm->hp.n_vocab, b->m->hp.n_vocab);
            goto out;
        }
        if (!(de = cli_engine_open(dm, o->device, &dc, err, sizeof err)) ||
            !(prop = proposer_draft_model_new(de, 0, err, sizeof err))) {
            snprintf(b->err, sizeof b->err, "draft model: %.400s", err);
            goto out;
        }
    }
    if (!make_engine(b, max_b, ctx)) goto out;
    for (int i = 0; i < o->n_batches; i++) {
        const int B = o->batches[i];
        if (spec_reference(b, B, toks, ref, n_ref)) goto out;
        for (int a = 0; a < o->n_accept; a++) {
            struct spec_count *c = &b->spec[b->n_spec];
            *c = (struct spec_count){.batch = B, .pct = o->accept[a], .draft_model = prop != NULL};
            if (time_spec(b, prop, B, toks, ref, o->accept[a], c)) goto out;
            b->n_spec++;
            report(b, (measurement){prop ? "spec-dm" : "spec", o->context, B, (int)c->tokens, c->secs});
        }
    }
    rc = 0;
out:
    if (b->e) engine_free(b->e); /* before the draft's: the order they came in, reversed */
    b->e = NULL;
    proposer_free(prop);
    if (de) engine_free(de);
    model_free(dm);
    free(ref);
    return rc;
}

/* The spec runs against the decode row of their batch. */
static void print_spec(const bench_ctx *b)
{
    for (int i = 0; i < b->n_spec; i++) {
        const struct spec_count *c = &b->spec[i];
        const measurement *d = find_done(b, "decode", c->batch);
        const double tps = c->secs > 0 ? c->tokens / c->secs : 0;
        printf("spec batch %d, %d drafts%s, drafts the model's own with p %.2f: %ld of %ld accepted (%.1f %%), "
               "%.2f tok/step, %.1f tok/s = %.2fx decode (%.1f)%s\n",
               c->batch, b->o->draft, c->draft_model ? " (draft model's cost)" : "", c->pct / 100.0, c->accepted,
               c->drafted, c->drafted ? 100.0 * c->accepted / c->drafted : 0.0,
               c->steps ? (double)c->tokens / (c->steps * c->batch) : 0.0, tps, d && tok_per_s(d) > 0 ? tps / tok_per_s(d) : 0.0,
               d ? tok_per_s(d) : 0.0, c->differ ? "; some accepted tokens differ from the decoded continuation" : "");
        if (c->differ) printf("  (%ld of them: a verify step's logits rounded apart from a decode step's)\n", c->differ);
        if (c->draft_model && c->steps > 0) /* where a step's time goes: the draft's K rounds, then the rest */
            printf("  a step %.3f ms: drafting %.3f ms (%.3f ms a round), verifying and accepting %.3f ms\n",
                   1e3 * c->secs / c->steps, 1e3 * c->draft_secs / c->steps,
                   1e3 * c->draft_secs / c->steps / b->o->draft, 1e3 * (c->secs - c->draft_secs) / c->steps);
    }
}

/* Inputs of T tokens that one embed step takes: as many whole ones as --ubatch holds, >= 1. */
static int embed_per_step(const bench_opts *o, int T) { return o->ubatch / T > 1 ? o->ubatch / T : 1; }

/* One embed step's sequences, their requests and the pooled vectors (floats each). */
typedef struct embed_bufs {
    engine_seq *seqs;
    engine_embed *em;
    float *out;
    size_t floats;
} embed_bufs;

/* One step of n embedding inputs of T tokens, input i from token first + i of toks, in slots
 * 0..n-1 (each cleared: an embedding keeps nothing).  0, or -1. */
static int embed_step(bench_ctx *b, const int32_t *toks, int first, int n, int T, const embed_bufs *eb)
{
    const bool unit = b->pooling != ENGINE_POOL_NONE && b->pooling != ENGINE_POOL_RANK;
    for (int j = 0; j < n; j++) {
        engine_slot_clear(b->e, j);
        eb->em[j] = (engine_embed){.pooling = b->pooling, .normalize = unit, .rank_ids = {0, 1},
                                   .out = eb->out + (size_t)j * eb->floats};
        eb->seqs[j] = (engine_seq){.slot = j, .tokens = toks + first + j, .n_tokens = T, .pos = 0, .embed = &eb->em[j]};
    }
    return engine_step(b->e, eb->seqs, n, NULL, b->err, sizeof b->err) != 0 ? -1 : 0;
}

/* N inputs of b->embed_tokens tokens in steps of embed_per_step inputs, after one untimed step.
 * Seconds, or -1. */
static double time_embed(bench_ctx *b, const int32_t *toks, int N)
{
    const int T = b->embed_tokens, per = embed_per_step(b->o, T) < N ? embed_per_step(b->o, T) : N;
    embed_bufs eb = {.seqs = calloc((size_t)per, sizeof *eb.seqs), .em = calloc((size_t)per, sizeof *eb.em),
                     .floats = engine_embed_floats(b->e, b->pooling, T)};
    eb.out = malloc((size_t)per * eb.floats * sizeof *eb.out);
    double secs = -1;
    if (!eb.seqs || !eb.em || !eb.out) {
        snprintf(b->err, sizeof b->err, "out of memory for %d embeddings of %d tokens", per, T);
        goto out;
    }
    if (embed_step(b, toks, 0, per, T, &eb)) goto out; /* untimed */
    double t0 = timing_now_s();
    for (int i = 0; i < N; i += per)
        if (embed_step(b, toks, i, N - i < per ? N - i : per, T, &eb)) goto out;
    secs = timing_now_s() - t0;
out:
    free(eb.seqs);
    free(eb.em);
    free(eb.out);
    return secs;
}

static void print_header(const bench_ctx *b)
{
    const model *m = b->m;
    printf("model: %s (%s, %d layers, n_embd %d, vocab %d)\nweights: %.1f MiB\nbackend: %s\n\n",
           m->name, model_arch_name(m->hp.arch), m->hp.n_layer, m->hp.n_embd, m->hp.n_vocab,
           m->weight_bytes / 1048576.0, engine_name(b->e));
    printf("%-8s %8s %6s %9s %10s %12s\n", "test", "n_prompt", "batch", "n_tokens", "seconds", "tok/s");
}

/* The embed test: an engine per length T (slots for one step's inputs, T positions each), then
 * every batch of inputs at that length. */
static int bench_embed(bench_ctx *b, const int32_t *toks)
{
    const bench_opts *o = b->o;
    const int max_n = max_of(o->batches, o->n_batches);
    for (int i = 0; i < o->n_prompts; i++) {
        const int T = o->prompts[i], per = embed_per_step(o, T);
        b->embed_tokens = T;
        b->min_batch_tokens = (per < max_n ? per : max_n) * T;
        if (!make_engine(b, per < max_n ? per : max_n, T)) return -1;
        if (i == 0) print_header(b);
        for (int j = 0; j < o->n_batches; j++) {
            double s = best_of(o->reps, time_embed, b, toks, o->batches[j]);
            if (s < 0) return -1;
            report(b, (measurement){"embed", T, o->batches[j], o->batches[j] * T, s});
        }
    }
    return 0;
}

/* The draft rows: the decode test on the draft model at every batch size, into b's table. */
static int time_draft_model(bench_ctx *b, const int32_t *toks)
{
    const bench_opts *o = b->o;
    bench_ctx d = {.o = o, .sp = b->sp};
    model *dm = model_load(o->draft_model, b->err, sizeof b->err);
    int rc = -1;
    if (!dm) return -1;
    d.m = dm;
    snprintf(b->draft_name, sizeof b->draft_name, "%s", dm->name);
    b->draft_weight_bytes = dm->weight_bytes;
    if (dm->hp.n_vocab != b->m->hp.n_vocab) {
        snprintf(b->err, sizeof b->err, "--model-draft %s has a vocabulary of %d tokens, the model %d", o->draft_model,
                 dm->hp.n_vocab, b->m->hp.n_vocab);
        goto out;
    }
    if (!make_engine(&d, max_of(o->batches, o->n_batches), o->context + DECODE_WARMUP + o->n_gen)) {
        snprintf(b->err, sizeof b->err, "draft model: %.400s", d.err);
        goto out;
    }
    for (int i = 0; i < o->n_batches; i++) {
        double s = best_of(o->reps, decode_run, &d, toks, o->batches[i]);
        if (s < 0) {
            snprintf(b->err, sizeof b->err, "draft model: %.400s", d.err);
            goto out;
        }
        report(b, (measurement){"draft", o->context, o->batches[i], o->batches[i] * o->n_gen, s});
    }
    rc = 0;
out:
    if (d.e) engine_free(d.e);
    model_free(dm);
    return rc;
}

int cli_bench(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    bench_ctx b = {.o = &o};
    sampling_params_default(&b.sp);
    model *m = model_load(o.model_path, b.err, sizeof b.err);
    if (!m) {
        fprintf(stderr, "inferd bench: %s\n", b.err);
        return 1;
    }
    b.m = m;
    /* an embedding model (an encoder, a file with a pooling_type, or --pooling) is timed as an
     * embedding server runs it: the embed test instead of prefill and decode */
    const bool embed = o.pooling || m->hp.encoder || m->hp.pooling >= 0;
    int pooling = o.pooling ? o.pooling - 1 : m->hp.pooling;
    b.pooling = pooling >= 0 ? (engine_pooling)pooling : ENGINE_POOL_MEAN; /* as serve: an encoder's mean */
    if (embed && !o.prompts_set) o.prompts[0] = 128, o.n_prompts = 1;
    if (embed && !o.batches_set) {
        static const int inputs[] = {1, 8, 64, 512};
        memcpy(o.batches, inputs, sizeof inputs);
        o.n_batches = 4;
    }
    clamp_to_context(&o, embed, m->hp.n_ctx_train);
    int max_p = max_of(o.prompts, o.n_prompts), max_b = max_of(o.batches, o.n_batches);
    /* decode prompts (time_decode) and embedding inputs (time_embed) start at token i */
    size_t n_toks = (size_t)max_b + (size_t)(embed ? max_p : o.context);
    if (n_toks < (size_t)max_p) n_toks = (size_t)max_p;
    int32_t *toks = malloc(n_toks * sizeof *toks);
    rc = 1;
    if (!toks) goto out;
    random_tokens(toks, (int)n_toks, m->hp.n_vocab, 42);
    if (embed) {
        if (bench_embed(&b, toks)) goto out;
        putchar('\n');
        print_json(&b, engine_name(b.e));
        rc = 0;
        goto out;
    }

    /* Prefill: one slot as long as the longest prompt. */
    if (!make_engine(&b, 1, max_p)) goto out;
    print_header(&b);
    if (time_prefill(&b, toks, max_p < 32 ? max_p : 32) < 0) goto out; /* warm-up */
    for (int i = 0; i < o.n_prompts; i++) {
        /* untimed first: cuBLAS loads the kernels of a new GEMM shape on first use */
        if (time_prefill(&b, toks, o.prompts[i]) < 0) goto out;
        double s = best_of(o.reps, time_prefill, &b, toks, o.prompts[i]);
        if (s < 0) goto out;
        report(&b, (measurement){"prefill", o.prompts[i], 1, o.prompts[i], s});
    }
    /* Decode: as many slots as the largest batch, each just long enough. */
    if (!make_engine(&b, max_b, o.context + DECODE_WARMUP + o.n_gen + o.draft)) goto out;
    for (int i = 0; i < o.n_batches; i++) {
        double s = best_of(o.reps, decode_run, &b, toks, o.batches[i]);
        if (s < 0) goto out;
        report(&b, (measurement){"decode", o.context, o.batches[i], o.batches[i] * o.n_gen, s});
    }
    for (int i = 0; o.draft > 0 && i < o.n_batches; i++) {
        double s = best_of(o.reps, verify_run, &b, toks, o.batches[i]);
        if (s < 0) goto out;
        report(&b, (measurement){"verify", o.context, o.batches[i], o.batches[i] * o.n_gen * (1 + o.draft), s});
    }
    const char *backend = engine_name(b.e); /* a static name */
    if (o.n_accept && bench_spec(&b, toks) != 0) goto out;
    if (o.draft_model) { /* the draft model's engine alone on the device, as the model's was */
        if (b.e) engine_free(b.e);
        b.e = NULL;
        if (time_draft_model(&b, toks) != 0) goto out;
    }
    putchar('\n');
    if (o.draft > 0) {
        print_acceptance(&b);
        print_spec(&b);
        putchar('\n');
    }
    print_json(&b, backend);
    rc = 0;
out:
    if (rc) fprintf(stderr, "inferd bench: %s\n", toks ? b.err : "out of memory");
    if (b.e) engine_free(b.e);
    free(toks);
    model_free(m);
    return rc;
}
