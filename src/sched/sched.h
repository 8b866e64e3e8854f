/* sched.h - the continuous-batching scheduler: the only owner of the engine.
 *
 * HTTP threads submit requests (already validated and tokenized); one scheduler thread (a
 * libuv loop woken by uv_async) admits them into free KV slots, plans each step (packed
 * prefill chunks under a token budget + one decode token for every running slot), calls
 * engine_step(), and turns sampled tokens into text: incremental detokenization that never
 * splits UTF-8, stop strings matched across token boundaries and never leaked, EOS/EOT,
 * max_tokens, context full.  Output goes into a per-request outbox that the HTTP side drains;
 * the scheduler calls the request's wake callback (from its own thread) whenever the outbox
 * gains something, so the HTTP side can resume a suspended connection.
 *
 * One sched_req is one choice: the HTTP layer submits n of them for n > 1. */
#ifndef INFERD_SCHED_H
#define INFERD_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"

typedef struct sched sched;
typedef struct sched_req sched_req;

/* Speculative decoding: what drafts the tokens each decode step verifies (sched.c). */
typedef enum sched_spec {
    SCHED_SPEC_OFF = 0, /* one token per decode step */
    SCHED_SPEC_NGRAM,   /* prompt lookup over the sequence's own tokens (ngram.h) */
    SCHED_SPEC_DRAFT,   /* a draft model of the same vocabulary (sched_config.draft, draftmodel.c) */
    SCHED_SPEC_MTP,     /* the model's own MTP block, in the engine (engine_has_mtp, mtp.c) */
} sched_spec;
#define SCHED_SPEC_COUNT 4

const char *sched_spec_name(sched_spec spec); /* "off", "ngram", "draft", "mtp" */

typedef struct sched_config {
    int n_slots;          /* must equal the engine's */
    int ctx_per_slot;     /* must equal the engine's */
    int max_batch_tokens; /* prefill token budget per step (the engine's max) */
    int queue_size;       /* waiting requests beyond the running ones; more -> SCHED_E_QUEUE_FULL */
    /* Prefill-only work (embeddings, rerank) beside running decodes: a step that carries decode
     * rows carries at most this many prefill-only tokens on average (a credit each such step
     * earns, banked up to max_batch_tokens, so one longer embedding still runs once enough is
     * banked); steps without decodes are bounded by max_batch_tokens alone.  0: no bound.  Why
     * a bound, and why on average: sched.c, plan_step. */
    int embed_step_tokens;
    bool no_prefix_cache; /* every prompt computed whole (benchmarks' baseline) */
    /* Admission is first-fit over the waiting queue (sched.c: admit): a later request that fits
     * may be admitted while the oldest waiting one cannot be yet, at most this many times for
     * one oldest request; then admission waits for it.  0: n_slots; < 0: strict FIFO. */
    int max_head_passes;
    /* Speculative decoding: a decode step of a request that speculates feeds its pending token
     * and up to draft_max drafted ones (at most the engine's max_draft) and keeps the drafts the
     * target's own samples confirm (engine_verify_accept), so the output is the one decoding
     * without drafts gives.  The draft length adapts per request: it shrinks when drafts are
     * rejected, pauses after repeated misses, and grows back when they are accepted.  A model
     * with recurrent state needs n_slots more state slots: each row's state from before its
     * verification, brought back after a rejected draft (sched.c: spec_rewind); sched_create
     * refuses it without them.  The drafters sit behind one seam (proposer.h). */
    sched_spec spec;
    int draft_max;
    int draft_min; /* a draft shorter than this is not verified (the row decodes plainly); 0: any; at most draft_max */
    /* SCHED_SPEC_DRAFT: the draft model's engine, with this engine's n_slots and ctx_per_slot,
     * a vocabulary of the same size (the caller compares the tokenizers: tokenizer_compatible)
     * and every row's fixed blocks in its KV pool.  It stays the caller's (freed after
     * sched_destroy).  draft_p_min: a row's draft stops before a token the draft model gives
     * less than this probability (0: never). */
    engine *draft;
    float draft_p_min;
    /* No off-switch by measured speed (sched.c: spec_gate_allows): every step drafts where its
     * requests may.  For tests whose schedule (and so whose counts) must not depend on how long
     * steps take. */
    bool spec_no_gate;
    /* Optional liveness hook (the systemd watchdog): called on the scheduler thread every
     * heartbeat_ms (0 = never) by a timer of the scheduler's own loop, so the calls stop
     * while an engine step is wedged.  The scheduler knows nothing of what it does. */
    void (*heartbeat)(void *ctx);
    void *heartbeat_ctx;
    unsigned heartbeat_ms;
    /* Optional: called once, on the scheduler thread, when the engine reports ENGINE_FATAL.
     * By then every request has finished with SCHED_FINISH_ERROR and new submits get
     * SCHED_E_SHUTDOWN; the owner should shut down and exit non-zero. */
    void (*on_fatal)(void *ctx, const char *error);
    void *on_fatal_ctx;
} sched_config;

typedef enum sched_finish {
    SCHED_FINISH_NONE = 0, /* still running */
    SCHED_FINISH_STOP,     /* EOS/EOT or a stop string */
    SCHED_FINISH_LENGTH,   /* max_tokens or the slot's context is full */
    SCHED_FINISH_CANCELLED,/* client went away or shutdown */
    SCHED_FINISH_ERROR,    /* the engine failed this step (message in sched_output.error) */
} sched_finish;

const char *sched_finish_name(sched_finish f); /* "stop", "length", ... */

#define SCHED_MAX_STOP 4

/* What one choice asks for.  sched_submit copies everything it needs. */
typedef struct sched_params {
    const int32_t *prompt;
    int n_prompt;   /* >= 1 */
    int max_tokens; /* >= 1; prompt + max_tokens must fit sched_max_context (SCHED_E_TOO_LONG) */
    sampling_params sp;
    const char *stop[SCHED_MAX_STOP];
    int n_stop;
    bool ignore_eos;
    bool want_logprobs; /* publish each token's engine_result (sp.n_top_logprobs says how many alternatives) */
    const char *id; /* request id for logs */
    bool reserved;  /* takes one place held by sched_reserve (never SCHED_E_QUEUE_FULL) */
    /* An embedding input that rides on a place its request holds for all its inputs (the
     * place itself taken by one `reserved` input): it counts toward no capacity, so one HTTP
     * request of many inputs is one queued request, as the queue limit documents.  Only with
     * `embed` (else SCHED_E_INVALID). */
    bool shares_place;
    /* Structured output: every sampled token keeps the text within this grammar (the request
     * takes its own reference and matcher; choices share the grammar); the request ends
     * ("stop") when the grammar is complete and nothing can follow.  NULL: unconstrained. */
    grammar *grammar;
    /* Prefill-only (embeddings, rerank): non-NULL asks for the prompt's pooled final hidden
     * state (its pooling, normalize and rank_ids; `out` is ignored: the scheduler keeps its
     * own) instead of a completion.  The prompt runs whole in one step, packed with the other
     * requests' prompt chunks and decodes, in a row it holds for that step only; its KV
     * blocks go back to the pool at once (never cached: an encoder's K/V are not a causal
     * prefix).  max_tokens, sampling, stop strings and grammar are ignored.  A prompt longer
     * than max_batch_tokens can never run: SCHED_E_TOO_LONG. */
    const engine_embed *embed;
    bool no_speculative; /* opts out of the server's speculative decoding ("speculative": false) */
} sched_params;


/* Everything that happened to a request since the last sched_req_take. */
typedef struct sched_output {
    char *text; /* new completion text (valid UTF-8, never part of a stop string), malloc'd */
    size_t text_len;
    engine_result *tokens; /* tokens sampled since the last take (when want_logprobs), malloc'd;
                            * n_top is within 0..ENGINE_MAX_TOP_LOGPROBS */
    int n_tokens;
    sched_finish finish; /* != NONE once: this is the last output of the request */
    int stop_string;     /* finish STOP by a stop string: 1 + its index in sched_params.stop; else 0 */
    int prompt_tokens;
    int cached_tokens; /* of prompt_tokens, read from the prefix cache instead of computed */
    int completion_tokens;
    char error[256]; /* when finish == SCHED_FINISH_ERROR */
    /* an embedding request's answer, with its finish (STOP): engine_embed_floats() floats,
     * malloc'd */
    float *embedding;
    size_t n_embedding;
} sched_output;

void sched_output_clear(sched_output *o); /* frees text/tokens, zeroes */

typedef void (*sched_wake_fn)(void *ctx);

enum {
    SCHED_OK = 0,
    SCHED_E_QUEUE_FULL = -1, /* 429 */
    SCHED_E_SHUTDOWN = -2,   /* 503 */
    SCHED_E_TOO_LONG = -3,   /* 400: prompt + max_tokens exceed sched_max_context: could never run */
    SCHED_E_INVALID = -4,    /* 400: e.g. empty prompt */
};

/* Starts the scheduler thread. The engine and tokenizer must outlive the scheduler. */
sched *sched_create(engine *e, const tokenizer *tok, const sched_config *cfg, char *err,
                    size_t errlen);
/* Cancels everything still running, stops the thread, frees. */
void sched_destroy(sched *s);

/* Thread-safe. On SCHED_OK *out is a request the caller must sched_req_release. wake is
 * called from the scheduler thread after new output is available (may be called once more
 * after the request finished; never after sched_req_release returns). */
int sched_submit(sched *s, const sched_params *p, sched_wake_fn wake, void *wake_ctx,
                 sched_req **out);
/* Moves pending output into *out (which the caller then clears). Returns true when anything
 * was there (text, tokens or the finish). Thread-safe. */
bool sched_req_take(sched_req *r, sched_output *out);
/* The most tokens (prompt + max_tokens) one request may ask for: ctx_per_slot, or less when
 * the whole KV pool holds less. */
int sched_max_context(const sched *s);
/* The most requests the scheduler ever holds at once (slots + queue): a request with more
 * choices can never be admitted. */
int sched_capacity(const sched *s);
/* Holds n places (running or waiting) so that n choices are admitted all or none: SCHED_OK,
 * SCHED_E_QUEUE_FULL or SCHED_E_SHUTDOWN.  Each submit with `reserved` uses one; give back
 * the unused ones with sched_unreserve.  Thread-safe. */
int sched_reserve(sched *s, int n);
void sched_unreserve(sched *s, int n);
/* The client went away: stop generating; the slot is freed at the next step. Idempotent. */
void sched_req_cancel(sched_req *r);
/* The HTTP side is done with r (after its finish was taken, or after cancel). */
void sched_req_release(sched_req *r);

/* Graceful shutdown: new submits get SCHED_E_SHUTDOWN; running requests continue. Then
 * sched_drain waits up to timeout_ms for them, cancelling what is left. */
void sched_begin_shutdown(sched *s);
void sched_drain(sched *s, int timeout_ms);

/* Latency histogram with fixed upper bounds (ms); counts[i] = observations <= bounds[i],
 * non-cumulative; counts[SCHED_HIST_BUCKETS] = the rest (+Inf). */
#define SCHED_HIST_BUCKETS 14
extern const double sched_hist_bounds_ms[SCHED_HIST_BUCKETS];
typedef struct sched_hist {
    uint64_t counts[SCHED_HIST_BUCKETS + 1];
    double sum_ms;
    uint64_t n;
} sched_hist;

typedef struct sched_stats {
    int n_slots;
    int slots_used;
    int queue_depth;
    uint64_t steps;
    uint64_t prompt_tokens_total;
    uint64_t generated_tokens_total;
    uint64_t requests_finished[5]; /* by sched_finish */
    uint64_t kv_tokens_used;       /* positions held by running sequences now */
    int kv_blocks_total, kv_blocks_used, kv_blocks_cached, kv_blocks_free; /* see kvcache.h */
    /* The sliding layers' pool (engine_kv_blocks_swa; all 0 without one), counted alike. */
    int kv_swa_blocks_total, kv_swa_blocks_used, kv_swa_blocks_cached, kv_swa_blocks_free;
    /* Hybrid models' recurrent-state slots (statecache.h; all 0 for other models). */
    int state_slots_total, state_slots_running, state_snapshots;
    uint64_t prefix_lookup_tokens; /* prompt tokens looked up in the prefix cache at admission */
    uint64_t prefix_hit_tokens;    /* of which read from cached blocks instead of computed */
    uint64_t preemptions;          /* running sequences sent back to wait for KV blocks */
    uint64_t spec_verifies;        /* decodes that verified drafted tokens */
    uint64_t spec_draft_tokens;    /* tokens drafted and verified */
    uint64_t spec_accepted_tokens; /* of which accepted (each verify also yields one token of its own) */
    /* the same two by proposer (sched_spec): only the configured one moves */
    uint64_t spec_proposer_draft[SCHED_SPEC_COUNT], spec_proposer_accepted[SCHED_SPEC_COUNT];
    sched_hist ttft;               /* submit -> first token text available */
    sched_hist itl;                /* between consecutive sampled tokens of a request */
} sched_stats;

void sched_get_stats(sched *s, sched_stats *out);

#endif
