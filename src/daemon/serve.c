/* serve.c - `inferd serve`: options (command line over config file), logging, listen, load the
 * model, warm the engine up, tell systemd, run until SIGINT/SIGTERM, then drain gracefully.
 *
 * The server listens before the model loads so that /health can answer 503 meanwhile.  The
 * main thread then sleeps in a libuv loop whose only job is signals; libuv turns them into
 * callbacks on this thread, so no work happens in a signal handler.
 *
 * systemd (Type=notify, see notify.h): STATUS= at each loading phase; READY=1 only once the
 * model is loaded, the engine has run its warm-up steps (CUDA graphs captured) and our own
 * GET /health has answered 200; WATCHDOG=1 from the scheduler's loop; STOPPING=1 on shutdown. */
#include <errno.h>
#include <pthread.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "config.h"
#include "keyfile.h"
#include "serve.h"
#include "backend/backend.h"
#include "engine/engine.h"
#include "gpu/gpu.h"
#include "model/tp_shard.h"
#include "base/log.h"
#include "text/chat.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "notify.h"
#include "opts.h"
#include "sched/sched.h"
#include "http/server.h"
#include "base/timing.h"
#include "base/file.h"
#include "base/hash.h"
#include "text/chat_parse.h"
#include "text/jinja.h"

/* Everything the running server owns, torn down in reverse order by serve_close. */
typedef struct serve_state {
    uv_loop_t loop;
    uv_signal_t sigint, sigterm, sighup;
    uv_async_t fatal_async; /* the scheduler's on_fatal, carried to this loop */
    int signal; /* the first shutdown signal received, 0 while running */
    bool fatal; /* the engine failed for good: exit non-zero so systemd restarts us */
    server *sv;
    model *m;
    tokenizer *tok;
    engine *e;
    /* --speculative draft: the draft model, its tokenizer (compared with the target's) and
     * its engine; NULL otherwise */
    model *draft_m;
    tokenizer *draft_tok;
    engine *draft_e;
    sched *s;
    char alias[OPTS_STR_MAX];
    char fingerprint[64]; /* --deterministic: system_fingerprint (set_fingerprint) */
    int ctx;
    chat_template_kind tmpl;
    jinja_tmpl *jinja, *jinja_tools;
    char *tmpl_src; /* the Jinja source in use (tool-call syntax and thinking are read from it) */
} serve_state;

/* Exit status for a bad configuration file: sysexits' EX_CONFIG, which systemd shows as
 * "status=78/CONFIG" (and the unit does not restart on). */
#define SERVE_EXIT_CONFIG 78

static void on_signal(uv_signal_t *h, int signum)
{
    serve_state *st = h->data;
    if (!st->signal) st->signal = signum;
    uv_stop(h->loop);
}

/* SIGHUP: logrotate has moved the log file away; start a new one at the configured path. */
static void on_hup(uv_signal_t *h, int signum)
{
    (void)h;
    (void)signum;
    int rc = log_reopen();
    if (rc < 0) log_error("SIGHUP: cannot reopen the log file; still writing to the old one");
    else if (rc == 0) log_info("SIGHUP: log file reopened");
    else log_info("SIGHUP: logging to stderr, no log file to reopen");
}

/* Runs on the scheduler thread (sched_config.on_fatal): every request has failed already. */
static void engine_fatal(void *ctx, const char *error)
{
    (void)error; /* logged by the scheduler */
    uv_async_send(&((serve_state *)ctx)->fatal_async);
}

static void on_fatal_async(uv_async_t *h)
{
    serve_state *st = h->data;
    st->fatal = true;
    uv_stop(h->loop);
}

/* Runs on the scheduler thread (sched_config.heartbeat): a wedged engine step stops it. */
static void watchdog_beat(void *ctx)
{
    (void)ctx;
    notify_watchdog();
}

static bool signalled(serve_state *st)
{
    uv_run(&st->loop, UV_RUN_NOWAIT); /* deliver a signal that came in while we were busy */
    return st->signal != 0;
}

static const char *basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* --deterministic: "fp_" and a hash of what the guarantee is stated for (this build, the
 * backend, the model file's architecture and size), then "_det"; NULL without the flag, so the
 * responses' system_fingerprint stays null.  A client that sees the same fingerprint may expect
 * the same tokens for the same request (docs/determinism.md: the GPU model counts too). */
static const char *set_fingerprint(serve_state *st, const inferd_opts *o)
{
    if (!o->deterministic) return NULL;
    char what[512];
    int n = snprintf(what, sizeof what, "%s|%s|%s|%zu|%d", INFERD_VERSION, engine_name(st->e),
                     model_arch_name(st->m->hp.arch), st->m->weight_bytes, st->m->hp.n_vocab);
    uint64_t h = hash_bytes(what, (size_t)n < sizeof what ? (size_t)n : sizeof what - 1);
    snprintf(st->fingerprint, sizeof st->fingerprint, "fp_%016llx_det", (unsigned long long)h);
    log_info("deterministic serving: batch-invariant kernels, system_fingerprint %s", st->fingerprint);
    return st->fingerprint;
}

/* Reads a --chat-template-file (bounded: a template is text, not a model). */
static char *read_template_file(const char *path, size_t *len)
{
    char why[300];
    char *buf = file_read_all(path, (size_t)1 << 20, len, why, sizeof why);
    if (!buf) log_error("--chat-template-file %s: %s", path, why);
    return buf;
}

/* The chat template: --chat-template-file, else the GGUF's tokenizer.chat_template (and its
 * tool_use variant) run as Jinja; the named built-ins only for a file without a template, a
 * --chat-template name, or a template this interpreter cannot parse (with a warning). */
static int pick_template(const inferd_opts *o, serve_state *st)
{
    const model *m = st->m;
    char err[512];
    size_t len = 0;
    if (o->chat_template_file[0]) {
        if (!(st->tmpl_src = read_template_file(o->chat_template_file, &len))) return -1;
        if (!(st->jinja = jinja_parse(st->tmpl_src, len, err, sizeof err))) {
            log_error("--chat-template-file %s: %s", o->chat_template_file, err);
            return -1;
        }
        st->tmpl = chat_template_detect(st->tmpl_src);
        return 0;
    }
    if (o->chat_template[0]) {
        int k = chat_template_from_name(o->chat_template);
        if (k < 0) {
            log_error("--chat-template '%s' is unknown (chatml, llama2, llama3, mistral, zephyr, gemma, phi3)",
                      o->chat_template);
            return -1;
        }
        st->tmpl = (chat_template_kind)k;
        return 0;
    }
    const char *src = gguf_get_str(m->gguf, "tokenizer.chat_template", &len);
    st->tmpl_src = src ? strndup(src, len) : NULL;
    st->tmpl = chat_template_detect(st->tmpl_src);
    if (st->tmpl_src && !(st->jinja = jinja_parse(st->tmpl_src, len, err, sizeof err)))
        log_warn("the model's chat template cannot be run (%s); using the built-in '%s' template", err,
                 chat_template_name(st->tmpl));
    size_t tlen = 0;
    const char *tsrc = gguf_get_str(m->gguf, "tokenizer.chat_template.tool_use", &tlen);
    if (tsrc && !(st->jinja_tools = jinja_parse(tsrc, tlen, err, sizeof err)))
        log_warn("the model's tool_use chat template cannot be run (%s); tools use the default one", err);
    return 0;
}

static engine *create_engine(engine_device dev, const model *m, const engine_config *ec)
{
    char err[512] = "";
    engine *e = engine_open(dev, m, ec, err, sizeof err);
    if (!e) log_error("engine: %s", err);
    return e;
}

/* Decode steps of 1, 2, 4, ... up to n_slots sequences (one token each in rows of their own,
 * written to the first blocks of the pool, which hold nothing yet), then clear the rows: the CUDA engine captures its decode graph per batch bucket on first use,
 * so this moves that work (and any first-step failure) before READY=1.  On the CPU it is a
 * cheap smoke test of the engine. */
static int warm_up(engine *e, const tokenizer *tok, char *err, size_t errlen)
{
    /* A step never carries more rows than the batch budget (-b): the scheduler splits a larger
     * decode batch, so warm-up stops there too (-np 64 -b 16 failed to start before). */
    const engine_config *ec = engine_get_config(e);
    int n_slots = ec->n_slots < ec->max_batch_tokens ? ec->n_slots : ec->max_batch_tokens;
    int n_blocks = engine_kv_blocks(e);
    engine_seq *seqs = calloc((size_t)n_slots, sizeof *seqs);
    engine_result *res = calloc((size_t)n_slots, sizeof *res);
    int32_t *blocks = calloc((size_t)n_slots, sizeof *blocks);
    /* an encoder has no token to sample: it warms up on embeddings */
    const bool encoder = !engine_has_lm_head(e);
    float *pooled = encoder ? calloc((size_t)n_slots * engine_embed_floats(e, ENGINE_POOL_MEAN, 1), sizeof *pooled) : NULL;
    engine_embed *em = encoder ? calloc((size_t)n_slots, sizeof *em) : NULL;
    int rc = seqs && res && blocks && (!encoder || (pooled && em)) ? 0 : -1;
    if (rc) snprintf(err, errlen, "out of memory");
    sampling_params sp;
    sampling_params_default(&sp);
    int32_t token = tokenizer_bos(tok) >= 0 ? tokenizer_bos(tok) : 0;
    for (int b = 1, n = 1; rc == 0; b *= 2) {
        n = b < n_slots ? b : n_slots;
        for (int i = 0; i < n; i++) {
            blocks[i] = i % n_blocks; /* a pool smaller than n_slots blocks: shared, the values are not used */
            seqs[i] = (engine_seq){.slot = i, .tokens = &token, .n_tokens = 1, .blocks = &blocks[i], .state = i,
                                   .want_token = !encoder, .sp = &sp};
            if (encoder) {
                em[i] = (engine_embed){.pooling = ENGINE_POOL_MEAN, .out = pooled + (size_t)i * engine_embed_floats(e, ENGINE_POOL_MEAN, 1)};
                seqs[i].embed = &em[i];
            }
        }
        rc = engine_step(e, seqs, n, res, err, errlen);
        for (int i = 0; i < n; i++) engine_slot_clear(e, i);
        if (n == n_slots) break;
    }
    free(seqs);
    free(res);
    free(blocks);
    free(pooled);
    free(em);
    return rc;
}

/* --tensor-parallel N before the model is read: what the flags alone rule out. */
static int tp_check_flags(const inferd_opts *o)
{
    if (o->tensor_parallel > 1 && o->device == ENGINE_DEVICE_CPU) {
        log_error("--tensor-parallel %d splits a model across GPUs, and --device cpu uses none (the CPU backend "
                  "spreads over cores with --threads): use --device cuda, or --tensor-parallel 1",
                  o->tensor_parallel);
        return -1;
    }
    return 0;
}

/* --tensor-parallel N > 1 with the model loaded: the sharding plan and the per-GPU memory it
 * implies are logged and the GPUs counted (too few: refused here, before any GPU is touched);
 * the engine (gpu/gpu_tp.c) then refuses what it does not split, by name.  N = 1 never comes
 * here, so one GPU runs exactly the single-GPU path. */
static int tp_describe(const inferd_opts *o, const model *m, int ctx)
{
    int n = o->tensor_parallel;
    char err[512] = "";
    tp_shape shape;
    tp_plan plan;
    tp_shape_from_model(m, 2 /* FP16 K/V, as the CUDA engine caches them */, &shape);
    if (tp_plan_make(&shape, n, &plan, err, sizeof err) != 0) {
        log_error("%s", err);
        return -1;
    }
    size_t tokens = (size_t)o->parallel * (size_t)ctx;
    char b1[32], b2[32];
    log_info("tensor parallelism over %d GPUs: %d heads / %d KV heads%s, whole model %s of weights, "
             "KV %.1f KiB/token", n, m->hp.n_head, m->hp.n_head_kv,
             plan.kv_replicas > 1 ? " (each KV head replicated on the GPUs that read it)" : "",
             tp_bytes_text((double)plan.total_weight_bytes, b1, sizeof b1),
             (double)plan.total_kv_bytes_per_token / 1024.0);
    for (int r = 0; r < n; r++) {
        char line[256];
        log_info("  %s; KV cache for %d x %d tokens %s (plan: the engine replicates the embedding and LM head)",
                 tp_plan_describe_rank(&plan, r, line, sizeof line), o->parallel, ctx,
                 tp_bytes_text((double)(plan.rank[r].kv_bytes_per_token * tokens), b2, sizeof b2));
    }
    int found = engine_cuda_device_count(err, sizeof err); /* --device cpu was refused before the load */
    if (found < o->gpu + n) {
        log_error("tensor parallelism over %d GPUs from GPU %d needs %d GPUs and CUDA finds %d%s%s%s: use "
                  "--tensor-parallel 1", n, o->gpu, o->gpu + n, found, err[0] ? " (" : "", err, err[0] ? ")" : "");
        return -1;
    }
    return 0;
}

/* Model, tokenizer, engine, scheduler. 0 on success. */

/* The token of a one-word answer: the word itself (Qwen's "yes"), else as a word after a space
 * in a byte-level or SentencePiece vocabulary; -1 when none. */
static int32_t answer_token(const tokenizer *tok, const char *word)
{
    static const char *const forms[] = {"%s", "\xc4\xa0%s", "\xe2\x96\x81%s"}; /* x, "Gx" (byte-level), "_x" (SPM) */
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char text[32];
        snprintf(text, sizeof text, forms[i], word);
        int32_t id = tokenizer_find(tok, text);
        if (id >= 0) return id;
    }
    return -1;
}

/* What the server answers: embeddings pooled as --pooling or the GGUF's pooling_type says, or
 * rerank scores (rank: the LM head's "yes" against "no", as Qwen3-Reranker's card scores); -1
 * for a text model; below -1 (logged) for a combination that cannot work. */
static int pick_pooling(const inferd_opts *o, const serve_state *st, int32_t rank_ids[2])
{
    const model *m = st->m;
    int pooling = o->pooling > 0 ? o->pooling - 1 : m->hp.pooling;
    if (pooling < 0 && m->hp.encoder) {
        log_warn("%s has no pooling_type: its embeddings are the mean of its hidden states (--pooling to choose)",
                 m->desc->name);
        pooling = ENGINE_POOL_MEAN;
    }
    const bool text = m->hp.pooling < 0 && !m->hp.encoder; /* a text model: it keeps generating */
    if (pooling != ENGINE_POOL_RANK) {
        if (pooling >= 0) log_info("serving embeddings (/v1/embeddings, pooling %s)%s", engine_pooling_name((engine_pooling)pooling),
                                   text ? " beside completions" : "; completions are refused (an embedding model)");
        return pooling;
    }
    if (m->hp.encoder) {
        log_error("--pooling rank: %s is an encoder; a cross-encoder's classifier head is not implemented", m->desc->name);
        return -2;
    }
    rank_ids[0] = answer_token(st->tok, "yes");
    rank_ids[1] = answer_token(st->tok, "no");
    if (rank_ids[0] < 0 || rank_ids[1] < 0) {
        log_error("--pooling rank scores the tokens 'yes' and 'no' (Qwen3-Reranker), which this vocabulary lacks");
        return -2;
    }
    log_info("serving rerank (/v1/rerank: the last token's 'yes' against 'no')%s",
             text ? " beside completions" : "; completions are refused (a reranker)");
    return pooling;
}

/* --speculative mtp, once the model is loaded: the model must have an MTP block (Qwen3.5's:
 * model.c bind_mtp), and the engine must run it, which only the CPU one does (checked again
 * once the engine is open: auto may land on a GPU). */
static int refuse_mtp(const model *m, const inferd_opts *o)
{
    if (!m->mtp.bound) {
        log_error("--speculative mtp: the model has no MTP block (nextn_predict_layers%s)",
                  m->hp.n_mtp > 0 ? " is set but the block's tensors are not in the file, or its family's block is "
                                    "not built: Qwen3.5's is" : " is not set");
        return -1;
    }
    if (o->device == ENGINE_DEVICE_CUDA || o->tensor_parallel > 1) {
        log_error("--speculative mtp on the GPU engine: not built yet (issue 31); the CPU engine runs the block "
                  "(--device cpu)");
        return -1;
    }
    return 0;
}

/* --speculative draft: the draft model, its tokenizer checked against the target's, and an
 * engine for it with the target's rows (tc: the target's configuration, its engine not open
 * yet), on the device the target asks for.  It opens first, with a KV pool of exactly its rows
 * (kv_per_row) and its decode graphs captured by a warm-up, so that on a GPU the target's
 * engine, sized from what is free, takes the rest and leaves the draft's alone.  *dev gets the
 * device the draft landed on (auto may fall back to the CPU): the target's. */
static int load_draft(serve_state *st, const inferd_opts *o, const engine_config *tc, engine_device *dev)
{
    char err[512] = "";
    if (o->tensor_parallel > 1) {
        log_error("--speculative draft with --tensor-parallel %d: not built (the draft model would need a GPU of "
                  "its own in the plan); use --speculative ngram", o->tensor_parallel);
        return -1;
    }
    log_info("loading the draft model %s", o->model_draft);
    if (!(st->draft_m = model_load(o->model_draft, err, sizeof err))) {
        log_error("cannot load the draft model: %s", err);
        return -1;
    }
    if (!(st->draft_tok = tokenizer_load(st->draft_m->gguf, err, sizeof err))) {
        log_error("cannot load the tokenizer of the draft model %s: %s", o->model_draft, err);
        return -1;
    }
    if (!tokenizer_compatible(st->tok, st->draft_tok, err, sizeof err)) {
        log_error("--model-draft %s cannot draft for %s: the tokenizers differ: %s", o->model_draft, o->model, err);
        return -1;
    }
    engine_config dc = {.n_slots = tc->n_slots, .ctx_per_slot = tc->ctx_per_slot,
                        .max_batch_tokens = tc->max_batch_tokens, .n_threads = tc->n_threads, .device = tc->device,
                        .kv_per_row = true, .deterministic = tc->deterministic, .verbose = tc->verbose};
    if (!(st->draft_e = engine_open((engine_device)o->device, st->draft_m, &dc, err, sizeof err))) {
        log_error("draft model engine: %s", err);
        return -1;
    }
    const bool cuda = strcmp(engine_name(st->draft_e), "cuda") == 0;
    *dev = cuda ? ENGINE_DEVICE_CUDA : ENGINE_DEVICE_CPU;
    if (cuda) {
        if (warm_up(st->draft_e, st->draft_tok, err, sizeof err) != 0) {
            log_error("draft model engine: warm-up step failed: %s", err);
            return -1;
        }
        gguf_drop_tensor_data(st->draft_m->gguf); /* its weights live on the GPU */
    }
    int n_train = st->draft_m->hp.n_ctx_train;
    if (n_train > 0 && n_train < st->ctx)
        log_warn("the draft model's training context %d is shorter than --ctx-size %d: drafts past it will mostly "
                 "be rejected (the output is unchanged)", n_train, st->ctx);
    log_info("speculative decoding: draft model %s (%s, %.1f MiB of weights, K/V %.1f MiB) on the %s engine, up to "
             "%d tokens per step", o->model_draft, st->draft_m->desc->name,
             (double)st->draft_m->weight_bytes / 1048576.0,
             (double)engine_kv_blocks(st->draft_e) * (double)engine_kv_block_bytes(st->draft_e) / 1048576.0,
             engine_name(st->draft_e), o->draft_max);
    return 0;
}

static int load(serve_state *st, const inferd_opts *o)
{
    char err[512] = "";
    if (tp_check_flags(o) != 0) return -1;
    if (o->speculative == OPTS_SPEC_DRAFT && !o->model_draft[0]) {
        log_error("--speculative draft needs --model-draft FILE (a smaller model of the same vocabulary)");
        return -1;
    }
    if (o->speculative != OPTS_SPEC_DRAFT && o->model_draft[0])
        log_warn("--model-draft is read only with --speculative draft: %s is not loaded", o->model_draft);
    const bool spec = o->speculative == OPTS_SPEC_NGRAM || o->speculative == OPTS_SPEC_DRAFT ||
                      o->speculative == OPTS_SPEC_MTP;
    log_info("loading %s", o->model);
    if (!(st->m = model_load(o->model, err, sizeof err))) {
        log_error("cannot load the model: %s", err); /* err starts with the path */
        return -1;
    }
    if (o->speculative == OPTS_SPEC_MTP && refuse_mtp(st->m, o) != 0) return -1;
    if (signalled(st)) return -1;
    notify_status("loading the tokenizer of %s", o->model);
    if (!(st->tok = tokenizer_load(st->m->gguf, err, sizeof err))) {
        log_error("cannot load the tokenizer of %s: %s", o->model, err);
        return -1;
    }
    char desc[512];
    tokenizer_describe(st->tok, desc, sizeof desc);
    log_info("tokenizer: %s", desc); /* where BOS comes from is a frequent question: say it once */
    int n_train = st->m->hp.n_ctx_train > 0 ? st->m->hp.n_ctx_train : 4096;
    st->ctx = o->ctx_size > 0 ? o->ctx_size : (n_train < 4096 ? n_train : 4096);
    if (st->ctx > n_train) log_warn("--ctx-size %d exceeds the model's training context %d", st->ctx, n_train);
    if (o->tensor_parallel > 1 && tp_describe(o, st->m, st->ctx) != 0) return -1;
    engine_config ec = {
        .n_slots = o->parallel,
        .ctx_per_slot = st->ctx,
        .max_batch_tokens = o->batch_tokens,
        .n_threads = o->threads,
        .device = o->gpu,
        .tensor_parallel = o->tensor_parallel,
        .kv_cache_mb = (size_t)o->kv_cache_size,
        /* a hybrid model's recurrent states: one per row, as many again for prefix snapshots, and
         * speculating one more per row, its state before a verification (sched.c: spec_rewind) */
        .n_states = (spec ? 3 : 2) * o->parallel,
        .max_draft = spec ? o->draft_max : 0,
        .mtp = o->speculative == OPTS_SPEC_MTP, /* the block's K/V beside the model's */
        .deterministic = o->deterministic,
        .verbose = o->log_level == LOG_DEBUG,
    };
    /* a split model runs on its GPUs or not at all: no quiet fall-back to the CPU (auto) */
    engine_device dev = ec.tensor_parallel > 1 ? ENGINE_DEVICE_CUDA : (engine_device)o->device;
    if (o->speculative == OPTS_SPEC_DRAFT && load_draft(st, o, &ec, &dev) != 0) return -1;
    notify_status("starting the engine (%d sequences of up to %d tokens)", o->parallel, st->ctx);
    if (!(st->e = create_engine(dev, st->m, &ec))) return -1;
    if (o->speculative == OPTS_SPEC_MTP && !engine_has_mtp(st->e)) {
        log_error("--speculative mtp on the %s engine: not built yet (issue 31); the CPU engine runs the block "
                  "(--device cpu)", engine_name(st->e));
        return -1;
    }
    /* A hybrid's verification rewinds its recurrent state by a copy and a re-feed (sched.c:
     * spec_rewind), on a backend where that has been checked (engine_can_rewind_state); the
     * others keep the earlier refusal. */
    if (spec && engine_state_slots(st->e) > 0 && !engine_can_rewind_state(st->e)) {
        log_error("--speculative %s on a model with recurrent state (%s) on the %s engine: not verified on the GPU "
                  "yet (issue 31); the CPU engine rewinds the state (--device cpu), or --speculative off",
                  o->speculative == OPTS_SPEC_MTP ? "mtp" : o->speculative == OPTS_SPEC_DRAFT ? "draft" : "ngram",
                  model_arch_name(st->m->hp.arch), engine_name(st->e));
        return -1;
    }
    if (o->speculative == OPTS_SPEC_MTP)
        log_info("speculative decoding: the model's MTP block drafts (up to %d tokens; its K/V one more layer of "
                 "every block)", o->draft_max);
    if (engine_state_slots(st->e) > 0)
        log_info("recurrent state: %d slots of %.2f MiB (%d rows + %d prefix snapshots%s)", engine_state_slots(st->e),
                 (double)engine_state_bytes(st->e) / 1048576.0, o->parallel,
                 engine_state_slots(st->e) - (spec ? 2 : 1) * o->parallel, spec ? ", and a copy per row for drafts" : "");
    if (signalled(st)) return -1;
    notify_status("warming up the %s engine", engine_name(st->e));
    if (warm_up(st->e, st->tok, err, sizeof err) != 0) {
        log_error("%s engine: warm-up step failed: %s", engine_name(st->e), err);
        return -1;
    }
    /* The CUDA engine holds the weights in GPU memory now; the host copy can go. */
    if (strcmp(engine_name(st->e), "cuda") == 0) {
        size_t freed = gguf_drop_tensor_data(st->m->gguf);
        log_info("host copy of the weights released (%.1f MiB): they live on the GPU", (double)freed / (1 << 20));
    }
    if (signalled(st)) return -1;
    sched_config sc = {.n_slots = o->parallel, .ctx_per_slot = st->ctx,
                       .max_batch_tokens = o->batch_tokens, .queue_size = o->queue_size,
                       .embed_step_tokens = o->embed_step_tokens, .max_head_passes = o->max_head_passes,
                       .no_prefix_cache = !o->prefix_cache,
                       .spec = !spec                                 ? SCHED_SPEC_OFF
                               : o->speculative == OPTS_SPEC_MTP ? SCHED_SPEC_MTP
                               : st->draft_e                     ? SCHED_SPEC_DRAFT
                                                                 : SCHED_SPEC_NGRAM,
                       .draft_max = o->draft_max, .draft_min = o->draft_min, .draft = st->draft_e,
                       .draft_p_min = (float)o->draft_p_min,
                       .on_fatal = engine_fatal, .on_fatal_ctx = st};
    /* systemd wants a ping at least every WATCHDOG_USEC; ping twice as often. */
    uint64_t wd_usec = notify_watchdog_usec(), wd_ms = wd_usec / 2000;
    if (wd_usec > 0) {
        if (wd_ms == 0) wd_ms = 1;
        sc.heartbeat = watchdog_beat;
        sc.heartbeat_ms = wd_ms > 3600000 ? 3600000u : (unsigned)wd_ms;
        log_info("systemd watchdog: pinging every %u ms from the scheduler loop", sc.heartbeat_ms);
    }
    if (!(st->s = sched_create(st->e, st->tok, &sc, err, sizeof err))) {
        log_error("cannot start the scheduler: %s", err);
        return -1;
    }
    if (pick_template(o, st) != 0) return -1;
    int32_t rank_ids[2] = {-1, -1};
    int pooling = pick_pooling(o, st, rank_ids);
    if (pooling < -1) return -1;
    snprintf(st->alias, sizeof st->alias, "%s", o->model_alias[0] ? o->model_alias : basename_of(o->model));
    const model_hparams *hp = &st->m->hp;
    server_model sm = {.card = {.arch = model_arch_name(hp->arch), .n_vocab = hp->n_vocab,
                                .n_ctx_train = hp->n_ctx_train, .n_embd = hp->n_embd,
                                .weight_bytes = st->m->weight_bytes},
                       .tok = st->tok, .s = st->s, .tmpl = st->tmpl, .alias = st->alias,
                       .fingerprint = set_fingerprint(st, o),
                       .jinja = st->jinja, .jinja_tools = st->jinja_tools,
                       .syntax = chat_syntax_detect(st->jinja ? st->tmpl_src : NULL),
                       .reasoning = o->reasoning_format == OPTS_REASONING_DEEPSEEK ||
                                    (o->reasoning_format == OPTS_REASONING_AUTO &&
                                     (chat_template_thinks(st->tmpl_src) || tokenizer_find(st->tok, "<think>") >= 0)),
                       .special_in_content = o->special_in_content,
                       .ctx_per_slot = sched_max_context(st->s),
                       .pooling = pooling, .rank_ids = {rank_ids[0], rank_ids[1]},
                       .dims_centred = st->m->desc->dims_centred,
                       .text = hp->pooling < 0 && !hp->encoder,
                       /* an encoder's positions end at its table (bert: n_ctx_train) */
                       .max_batch_tokens = hp->encoder && hp->n_ctx_train < o->batch_tokens ? hp->n_ctx_train
                                                                                           : o->batch_tokens};
    {
        sched_stats ss;
        sched_get_stats(st->s, &ss);
        log_info("KV cache: %d blocks of %d tokens (%lld tokens) for up to %d sequences of up to %d tokens; "
                 "automatic prefix caching %s",
                 ss.kv_blocks_total, ENGINE_KV_BLOCK, (long long)ss.kv_blocks_total * ENGINE_KV_BLOCK, o->parallel,
                 sm.ctx_per_slot, o->prefix_cache ? "on" : "off");
        if (ss.kv_swa_blocks_total) /* docs/sliding-kv.md: the sliding layers keep only their window */
            log_info("KV cache: the sliding-window layers' own pool: %d blocks (window %d); a sequence of %d tokens "
                     "holds %.1f MiB of K/V (%.1f MiB with every layer's K/V kept)",
                     ss.kv_swa_blocks_total, engine_kv_swa_window(st->e), sm.ctx_per_slot,
                     (double)engine_kv_seq_bytes(st->e, sm.ctx_per_slot) / 1048576.0,
                     (double)((size_t)(sm.ctx_per_slot + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK *
                              (engine_kv_block_bytes(st->e) + engine_kv_block_bytes_swa(st->e))) / 1048576.0);
    }
    server_set_ready(st->sv, &sm);
    return 0;
}

/* One GET /health to our own listening address; true on a 200.  A wildcard address is
 * reached through loopback. */
static bool health_answers(const char *host, int port)
{
    if (!host[0] || strcmp(host, "0.0.0.0") == 0) host = "127.0.0.1";
    else if (strcmp(host, "::") == 0) host = "::1";
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, service, &hints, &res) != 0) return false;
    bool ok = false;
    for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {.tv_sec = 2};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        static const char req[] = "GET /health HTTP/1.1\r\nHost: localhost\r\nUser-Agent: inferd-self-check\r\n"
                                  "Connection: close\r\n\r\n";
        char buf[32] = "";
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1)) {
            size_t got = 0;
            ssize_t n;
            while (got < sizeof buf - 1 && (n = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0) got += (size_t)n;
            buf[got] = 0;
            ok = strncmp(buf, "HTTP/1.1 200", 12) == 0 || strncmp(buf, "HTTP/1.0 200", 12) == 0;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return ok;
}

/* READY=1 promises a working server: wait (bounded) until our own /health says 200. */
static bool wait_healthy(serve_state *st, const char *host, double timeout_s)
{
    double until = timing_now_s() + timeout_s;
    while (!signalled(st)) {
        if (health_answers(host, server_port(st->sv))) return true;
        if (timing_now_s() > until) break;
        usleep(50 * 1000);
    }
    return false;
}

/* The drain is bounded by the timeout, but closing the HTTP server waits for its workers, and
 * nothing interrupts a worker inside a computation (a request's work is bounded, yet a bug or a
 * missed bound would hold the stop for as long as it runs).  So once a stop has taken the
 * timeout and this much more, the process exits on its own, saying so. */
#define SHUTDOWN_GRACE_S 10.0

static void *shutdown_watchdog(void *arg)
{
    double limit = *(const double *)arg, until = timing_now_s() + limit;
    for (double left = limit; left > 0; left = until - timing_now_s()) {
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
    log_error("shutdown: not done %.1fs after it began (a worker is still busy): exiting now", limit);
    _exit(1);
    return NULL;
}

static void start_shutdown_watchdog(double timeout_s)
{
    static double limit;
    limit = timeout_s + SHUTDOWN_GRACE_S;
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &a, shutdown_watchdog, &limit);
    if (rc != 0) log_warn("shutdown: no watchdog thread (%s): the stop waits for every worker", strerror(rc));
    pthread_attr_destroy(&a);
}

/* Graceful stop: refuse new work, let running requests finish within the timeout, close. */
static void serve_close(serve_state *st, double timeout_s)
{
    start_shutdown_watchdog(timeout_s);
    if (st->sv) server_begin_shutdown(st->sv);
    if (st->s) {
        sched_begin_shutdown(st->s);
        sched_drain(st->s, (int)(timeout_s * 1000));
    }
    /* Drained requests still have their last bytes to send; give clients a moment to read. */
    if (st->sv && !server_wait_idle(st->sv, 2000)) log_warn("closing connections that did not finish");
    server_stop(st->sv);
    sched_destroy(st->s);
    if (st->e) engine_free(st->e);
    if (st->draft_e) engine_free(st->draft_e);
    tokenizer_free(st->tok);
    tokenizer_free(st->draft_tok);
    model_free(st->m);
    model_free(st->draft_m);
    jinja_free(st->jinja);
    jinja_free(st->jinja_tools);
    free(st->tmpl_src);
}

static void close_loop(serve_state *st)
{
    uv_close((uv_handle_t *)&st->sigint, NULL);
    uv_close((uv_handle_t *)&st->sigterm, NULL);
    uv_close((uv_handle_t *)&st->sighup, NULL);
    uv_close((uv_handle_t *)&st->fatal_async, NULL); /* the scheduler thread is joined by now */
    uv_run(&st->loop, UV_RUN_DEFAULT);
    uv_loop_close(&st->loop);
}

int serve_main(int argc, char **argv)
{
    inferd_opts o;
    char err[1024];
    int rc = config_resolve(&o, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) {
        /* Logging is not set up yet; stderr reaches the terminal or the journal. */
        fprintf(stderr, "inferd serve: %s\n", err);
        return rc == CONFIG_E_FILE ? SERVE_EXIT_CONFIG : 2;
    }
    log_set_level((log_level)o.log_level);
    log_set_json(o.log_format == OPTS_LOG_JSON);
    if (o.log_file[0] && log_open_file(o.log_file) != 0) {
        fprintf(stderr, "inferd serve: cannot open --log-file %s\n", o.log_file);
        return 1;
    }
    if (!o.model[0]) {
        log_error("no model given: pass -m MODEL.gguf (see --help)");
        return 2;
    }
    log_info("inferd %s starting (pid %d), config file: %s", INFERD_VERSION, (int)getpid(),
             o.config[0] ? o.config : "none (command line only)");
    opts_log(&o);
    if (keyfile_apply(&o, err, sizeof err) != 0) {
        log_error("%s", err);
        return 1;
    }
    notify_init();
    signal(SIGPIPE, SIG_IGN); /* a client that went away must not kill the daemon */

    serve_state st = {0};
    uv_loop_init(&st.loop);
    uv_signal_init(&st.loop, &st.sigint);
    uv_signal_init(&st.loop, &st.sigterm);
    uv_signal_init(&st.loop, &st.sighup);
    st.sigint.data = st.sigterm.data = st.sighup.data = &st;
    uv_signal_start(&st.sigint, on_signal, SIGINT);
    uv_signal_start(&st.sigterm, on_signal, SIGTERM);
    uv_signal_start(&st.sighup, on_hup, SIGHUP);
    uv_async_init(&st.loop, &st.fatal_async, on_fatal_async);
    st.fatal_async.data = &st;

    server_config sc = {.host = o.host, .port = o.port, .http_threads = o.http_threads,
                        .max_body = (size_t)o.max_body, .api_key = o.api_key, .metrics = o.metrics,
                        .max_connections = (unsigned)o.max_connections,
                        .max_connections_per_ip = (unsigned)o.max_connections_per_ip,
                        .timeout_s = (unsigned)o.timeout, .stream_timeout_s = (unsigned)o.stream_timeout,
                        .always_include_usage = o.always_include_usage,
                        .refuse_hosted_tools = o.hosted_tools == OPTS_HOSTED_REFUSE,
                        .default_max_tokens = o.default_max_tokens};
    if (!(st.sv = server_start(&sc, err, sizeof err))) {
        log_error("%s", err);
        close_loop(&st);
        return 1;
    }
    notify_status("loading %s", o.model);
    double t0 = timing_now_s();
    int exit_code = 0;
    if (load(&st, &o) != 0) {
        exit_code = st.signal ? 0 : 1;
    } else if (!wait_healthy(&st, o.host, 10.0)) {
        if (!st.signal) {
            log_error("the server does not answer GET /health on %s:%d; giving up", o.host, server_port(st.sv));
            exit_code = 1;
        }
    } else {
        log_info("ready in %.1fs (GET /health answered 200): http://%s:%d, model %s (%s, %d layers, vocab %d, "
                 "%.1f MiB), engine %s, %d slots x %d tokens, chat template %s", timing_now_s() - t0, o.host,
                 server_port(st.sv), st.alias,
                 model_arch_name(st.m->hp.arch), st.m->hp.n_layer, st.m->hp.n_vocab,
                 (double)st.m->weight_bytes / (1024.0 * 1024.0), engine_name(st.e), o.parallel, st.ctx,
                 st.jinja ? (o.chat_template_file[0] ? "jinja (--chat-template-file)" : "jinja (the model's)")
                          : chat_template_name(st.tmpl));
        notify_ready();
        notify_status("serving %s on %s:%d", st.alias, o.host, server_port(st.sv));
        if (!st.signal) uv_run(&st.loop, UV_RUN_DEFAULT); /* until SIGINT/SIGTERM or a fatal engine error */
    }
    if (st.fatal) {
        log_error("the engine cannot continue: exiting with status 1 (systemd restarts the service)");
        exit_code = 1;
    }
    if (st.signal)
        log_info("received %s: shutting down (up to %gs for running requests)",
                 st.signal == SIGINT ? "SIGINT" : "SIGTERM", o.shutdown_timeout);
    notify_stopping();
    if (st.fatal) notify_status("engine failed (see the log); exiting for a restart");
    else if (exit_code != 0) notify_status("failed to start (see the log)");
    else notify_status("stopping: draining running requests (up to %gs)", o.shutdown_timeout);
    serve_close(&st, o.shutdown_timeout);
    close_loop(&st);
    log_info("stopped");
    return exit_code;
}
