/* engine.h - the one interface between scheduling and math.
 *
 * K/V memory is a pool of fixed-size blocks (ENGINE_KV_BLOCK tokens each, every layer's K and
 * V of those positions).  The scheduler hands the engine a batch of sequences.  Each sequence
 * has a row (its `slot`, 0 .. n_slots-1: at most n_slots run at once) and a block table: the
 * blocks that hold its positions 0, 1, ... in order.  It brings new tokens that start at a
 * given position; the engine writes their K/V through the block table, attends through it,
 * and for each sequence that asks, samples one token from the logits of its last new token.
 * A step may mix prompt chunks (many tokens) and decode tokens (one token) of different
 * sequences: backends pack them as they see fit.  Which blocks a sequence uses, and which
 * sequences share a block (a cached prefix), is the caller's business: the engine never
 * allocates blocks and only ever writes the positions a step carries.
 *
 * Sliding-window models (layers with model_layer.window > 0: gemma3, gemma4, gpt-oss) may have a
 * second pool for those layers' K/V (engine_kv_blocks_swa() > 0; 0: every layer's K/V are in
 * the one pool, as for any other model).  A sequence then has a second block table,
 * engine_seq.blocks_swa, indexed like `blocks`; a query at position p of a sliding layer reads
 * only keys from engine_swa_first_key(p, window) on, so the entries of blocks wholly before the
 * window of a step's first query may be -1: the caller frees them (docs/sliding-kv.md).
 *
 * Hybrid models (a layer recipe with gated DeltaNet layers, engine_state_bytes() > 0) also
 * keep, per sequence, a recurrent state that is not a list of positions: conv and delta
 * state of every linear layer.  The engine holds a pool of state slots (engine_config
 * n_states); which slot a sequence uses, and which slots hold snapshots of a prefix, is the
 * caller's business, as with KV blocks.  A state slot holds the state after some number of
 * positions: a step at position 0 starts it afresh, a step at any other position must start
 * exactly where the slot's state ends (else ENGINE_EINVAL: a recurrence cannot rewind), and
 * engine_state_copy copies one slot (state and length) into another.
 *
 * The engine keeps each row's token history (every token fed at positions 0..pos+n-1) so
 * that repetition penalties need nothing from the caller; a sequence whose first positions
 * come from cached blocks brings them in `history`.  Sampling randomness is a pure function
 * of (seed, position of the sampled token), so a request replays identically whatever else
 * is in the batch, on whichever backend, and after being preempted and recomputed.
 *
 * Threading: all calls come from one thread (the scheduler's). */
#ifndef INFERD_ENGINE_H
#define INFERD_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#define ENGINE_MAX_TOP_LOGPROBS 20

typedef struct sampling_params {
    float temperature; /* <= 0: greedy (argmax, lowest id on ties) */
    int top_k;         /* <= 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    uint64_t seed;
    float repeat_penalty;    /* 1: off (llama.cpp style, over the last penalty_last_n tokens) */
    float presence_penalty;  /* 0: off (OpenAI style, same window) */
    float frequency_penalty; /* 0: off */
    int penalty_last_n;      /* window for the three penalties; 0 = penalties off, -1 = whole history */
    const int32_t *bias_ids; /* logit_bias: added to the logits before everything else */
    const float *bias_vals;
    int n_bias;
    int n_top_logprobs; /* 0..ENGINE_MAX_TOP_LOGPROBS alternatives; <0: no logprobs at all */
} sampling_params;

void sampling_params_default(sampling_params *sp); /* greedy, no penalties, no logprobs */

/* Tokens per KV block.  32 = one warp's tile of keys in the GPU attention, so a tile never
 * straddles two blocks; small enough that a prefix cache loses at most 31 tokens per prompt. */
#define ENGINE_KV_BLOCK 32

/* How an embedding sequence's final hidden states become its answer; the values are those of
 * GGUF's <arch>.pooling_type (model_hparams.pooling). */
typedef enum engine_pooling {
    ENGINE_POOL_NONE = 0, /* every token's state, one after the other */
    ENGINE_POOL_MEAN = 1, /* their mean (sentence-transformers, bge, all-MiniLM) */
    ENGINE_POOL_CLS = 2,  /* the first token's */
    ENGINE_POOL_LAST = 3, /* the last token's (decoder embedders: Qwen3-Embedding) */
    /* A relevance score from the LM head at the last token: sigmoid(logit[rank_ids[0]] -
     * logit[rank_ids[1]]), the softmax of the pair (Qwen3-Reranker's "yes" against "no"). */
    ENGINE_POOL_RANK = 4,
} engine_pooling;
#define ENGINE_POOL_COUNT 5

/* "none", "mean", "cls", "last", "rank"; engine_pooling_parse: -1 for another name. */
const char *engine_pooling_name(engine_pooling p);
int engine_pooling_parse(const char *name);

/* A sequence's request for its pooled final hidden state instead of a token. */
typedef struct engine_embed {
    engine_pooling pooling;
    bool normalize;      /* L2-normalise the pooled vector (not RANK, not NONE) */
    int32_t rank_ids[2]; /* RANK: the tokens whose logits are compared (yes, no) */
    float *out;          /* engine_embed_floats() floats */
} engine_embed;

typedef struct engine_result {
    int32_t token;
    float logprob; /* log-softmax of the chosen token over the (biased, penalised) logits at T=1 */
    int n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprobs[ENGINE_MAX_TOP_LOGPROBS];
} engine_result;

typedef struct engine_seq {
    int slot;     /* the sequence's row: where its token history is kept */
    const int32_t *tokens;
    int n_tokens; /* >= 1 */
    int pos;      /* position of tokens[0]; 0 starts a fresh sequence */
    /* KV blocks of positions 0..pos+n_tokens-1: position p is row p % ENGINE_KV_BLOCK of block
     * blocks[p / ENGINE_KV_BLOCK].  NULL: the row's fixed blocks slot*B .. slot*B+B-1 (B the
     * blocks of ctx_per_slot), for tools that run one sequence per row over a pool of at least
     * n_slots*B blocks (the default CPU pool).  Blocks before pos's are only read. */
    const int32_t *blocks;
    /* With a sliding pool (engine_kv_blocks_swa() > 0): the sliding layers' blocks of the same
     * positions, ids in that pool; entries before engine_swa_first_block(pos, window) are not
     * read (-1 allowed).  NULL: the row's own ring of engine_kv_swa_ring() blocks of that pool
     * (block slot * ring + index % ring), enough for one sequence per row fed in order. */
    const int32_t *blocks_swa;
    /* Hybrid models: the state slot (0..n_states-1) holding this sequence's recurrent state.
     * Used with a block table; without one (blocks NULL) the row's own slot `slot` is. */
    int state;
    /* Tokens at positions 0..pos-1, needed when the row's history is shorter than pos (the
     * prefix came from cached blocks, or the sequence was recomputed in another row).  NULL:
     * the row was fed them. */
    const int32_t *history;
    bool want_token;
    const sampling_params *sp; /* used when want_token */
    /* Constrained decoding (when want_token): NULL samples from the whole vocabulary; else
     * ceil(n_vocab/32) words (the model's n_vocab), bit i%32 of word i/32 set when token i may
     * be sampled.  Applied before everything else (sampling.h, step 0); the caller makes sure
     * at least one token is allowed. */
    const uint32_t *allowed;
    /* Speculative verification (with want_token): sample at each of the last n_sample new
     * tokens, not only at the last (0 or 1: the last only; at most n_tokens and
     * 1 + engine_config.max_draft).  The sequence brings its pending token and n_sample - 1
     * drafted ones after it; the sample after new token j is drawn exactly as a one-token step
     * there would draw it (penalties over the history up to j, randomness of (seed, its
     * position)), so the caller accepts drafts while they equal the samples (engine_verify_accept).
     * `sampled` receives the n_sample results in order (results[i] also gets the last one);
     * `allowed`, when given, holds n_sample masks of ceil(n_vocab/32) words one after the
     * other, mask j for the sample after new token n_tokens - n_sample + j.  Rollback of the
     * rejected positions is the caller's: a later step simply starts at an earlier position
     * (K/V past a sequence's length are never read; the token history rewinds). */
    int n_sample;
    engine_result *sampled;
    /* Optional (tests/tools): when non-NULL, receives the raw logits (n_vocab floats) of the
     * last token, or of every new token (n_tokens * n_vocab) when logits_all. */
    float *logits;
    bool logits_all;
    /* Prefill-only embedding: non-NULL asks for the sequence's pooled final hidden state
     * (engine_embed) instead of a token.  The whole sequence comes in this one step (pos 0,
     * no want_token), so an encoder attends over all of it; its K/V are written to its blocks
     * but are worth nothing afterwards (the caller frees them: no decode follows). */
    const engine_embed *embed;
    /* Optional: receives the final hidden state (after the output norm, where the family has
     * one) of every new token, n_tokens * n_embd floats: what pooling reads; with hidden_row
     * k > 0 only token k-1's (n_embd floats: what cls/last pooling needs, so a GPU copies one
     * row back, not all).  engine.c points it at its own scratch for an embed sequence. */
    float *hidden;
    int hidden_row;
} engine_seq;

typedef struct engine_config {
    int n_slots;     /* most sequences in one step (rows) */
    int ctx_per_slot;/* most positions of one sequence (a request's context), not a reservation */
    int max_batch_tokens; /* most tokens one step may carry (prefill chunk budget) */
    int n_threads;   /* CPU backend worker threads (0 = machine cores) */
    int device;      /* GPU ordinal (tensor parallelism: the first of its GPUs) */
    /* Tensor parallelism (CUDA only): the model split across this many GPUs, device ..
     * device + n - 1, one engine to the caller (gpu/gpu_tp.c).  0 or 1: one GPU. */
    int tensor_parallel;
    size_t vram_reserve_mb; /* GPU: leave this much free after KV allocation */
    /* Size of the KV block pool.  0: the CPU backend takes n_slots x ctx_per_slot tokens' worth
     * (what one slot per sequence used to reserve), the GPU backend the free memory left after
     * weights, buffers and vram_reserve_mb. */
    size_t kv_cache_mb;
    /* The pool holds exactly n_slots x ctx_per_slot tokens (every row its fixed blocks, what
     * engine_seq.blocks NULL reads), whatever memory is free: an engine that shares its device
     * with another (a draft model's beside its target) takes no more than its rows need.  The
     * CPU's default pool is this already; ignored with kv_cache_mb. */
    bool kv_per_row;
    /* Recurrent-state slots of a hybrid model (ignored by others): 0 takes n_slots. */
    int n_states;
    /* Most drafted tokens one sequence verifies in a step (engine_seq.n_sample - 1): the GPU
     * sizes its sampling rows for n_slots * (1 + max_draft).  0: no speculation. */
    int max_draft;
    /* --deterministic: every kernel computes a sequence's rows in an order that does not depend
     * on the batch (its size, the row's place, the prompt's chunking, prefix-cache hits), so a
     * request's tokens and logprobs are bit-identical whatever else runs (docs/determinism.md).
     * The CPU backend's kernels are row-wise already; the GPU one takes fixed paths. */
    bool deterministic;
    /* A model with sliding-window layers: keep their K/V in the one pool with the other
     * layers' (no sliding pool, engine_kv_blocks_swa() 0), as before docs/sliding-kv.md: the
     * baseline the tests compare freeing against. */
    bool no_swa_pool;
    /* Run the model's multi-token-prediction block (model.mtp; engine_mtp_step): its K/V are one
     * more layer in every block of the pool (blocks grow by that layer's share).  Refused for a
     * model without a bound MTP block; the GPU backend does not build it (engine_has_mtp). */
    bool mtp;
    bool verbose;
} engine_config;

/* Opaque: backends define it in engine_impl.h; backend/backend.h opens one. */
typedef struct engine engine;

/* The configuration the engine was created with (n_slots, ctx_per_slot, batch budget). */
const engine_config *engine_get_config(const engine *e);
/* Blocks in the KV pool (ids 0..n-1), each ENGINE_KV_BLOCK positions. */
int engine_kv_blocks(const engine *e);
/* Blocks in the sliding layers' pool (ids 0..n-1); 0: the model has no separate sliding pool
 * (no sliding layers, the backend keeps none, or no_swa_pool) and blocks_swa is ignored. */
int engine_kv_blocks_swa(const engine *e);
/* The widest sliding window of the layers in the sliding pool (0 without one). */
int engine_kv_swa_window(const engine *e);
/* Sliding blocks a row's NULL blocks_swa ring holds: enough for a window plus a step's tokens,
 * ceil((window + max_batch_tokens) / ENGINE_KV_BLOCK) + 1 (0 without a sliding pool). */
int engine_kv_swa_ring(const engine *e);
/* Bytes of one block of each pool (the sliding one's 0 without it). */
size_t engine_kv_block_bytes(const engine *e);
size_t engine_kv_block_bytes_swa(const engine *e);
/* K/V bytes a sequence of n_tokens positions holds while it decodes: its full-pool blocks plus,
 * with a sliding pool, the sliding blocks of its next query's window (engine_swa_blocks_held). */
size_t engine_kv_seq_bytes(const engine *e, int n_tokens);

/* The first key a query at position pos reads in a layer of window `window` (0: all). */
static inline int engine_swa_first_key(int pos, int window)
{
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}
/* The first block (table entry) that queries at positions >= pos read. */
static inline int engine_swa_first_block(int pos, int window)
{
    return engine_swa_first_key(pos, window) / ENGINE_KV_BLOCK;
}
/* Sliding blocks a sequence of n_tokens positions holds between decode steps: those from its
 * next query's window on (position n_tokens) through the block of that position. */
static inline int engine_swa_blocks_held(int n_tokens, int window)
{
    return n_tokens / ENGINE_KV_BLOCK - engine_swa_first_block(n_tokens, window) + 1;
}
const model *engine_model(const engine *e);
/* Floats an embedding of n_tokens tokens writes to engine_embed.out: n_embd (n_tokens * n_embd
 * for NONE, 1 for RANK). */
size_t engine_embed_floats(const engine *e, engine_pooling pooling, int n_tokens);
/* Whether the model can answer ENGINE_POOL_RANK / produce tokens at all: an encoder (bert)
 * has no LM head. */
bool engine_has_lm_head(const engine *e);

/* engine_step's return when the backend can run no further step: a fault on the device (an
 * illegal address, a failed launch or copy) leaves its CUDA context unusable, and every later
 * step fails the same way.  The caller fails the work in hand and should exit non-zero, so a
 * supervisor (systemd's Restart=on-failure) restarts the process on a fresh context. */
#define ENGINE_FATAL (-2)
#define ENGINE_EINVAL (-1)

/* Run one step. results[i] is written for seqs[i] when seqs[i].want_token.  Returns 0;
 * ENGINE_EINVAL with a message in err when this step cannot run (bad input: it leaves every slot as it was
 * before the step, so its sequences can be retried apart); or ENGINE_FATAL. */
int engine_step(engine *e, const engine_seq *seqs, int n_seqs, engine_result *results,
                char *err, size_t errlen);
/* `rounds` one-token steps of the same sequences back to back: what a draft model's rounds
 * are.  Round 0 is engine_step's of seqs, each one token that wants a token (no verification,
 * logits, hidden states or embedding); round r > 0 feeds each sequence the token round r - 1
 * sampled for it, one position further, without a mask (`allowed` applies to round 0 only).
 * results[r * n_seqs + i] is round r's sample for seqs[i], what `rounds` engine_steps would
 * give; block tables (engine_seq.blocks) cover positions up to pos + rounds - 1.  A backend
 * may run the rounds without the host between them (the GPU: its decode graph replayed, each
 * round's tokens passed on on the device, the samples read back once).  Returns as
 * engine_step does; the rounds are checked before the first runs. */
int engine_decode_rounds(engine *e, const engine_seq *seqs, int n_seqs, int rounds, engine_result *results,
                         char *err, size_t errlen);
/* Speculative acceptance for a drafter whose proposal is one token per position (n-gram,
 * prompt lookup, a draft model's argmax: q a point mass on the draft): how many of the n_draft drafts are accepted
 * given the n_draft + 1 samples of a verification step (engine_seq.sampled); the caller then
 * takes samples[0..accepted], accepted + 1 tokens (the last is the correction or the bonus).
 * For greedy rows this is the longest prefix where the target's argmax equals the draft.  For
 * sampled rows it is the rejection-sampling rule: the target's sample x' ~ p is the draft x
 * with probability p(x), the acceptance probability min(1, p(x)/q(x)) for q = 1 at x; when it
 * is not, x' is distributed as p restricted to the other tokens and renormalised, which is
 * max(0, p - q) normalised, the rule's residual.  Since a sample is a pure function of (seed,
 * position), the accepted tokens are those non-speculative decoding draws wherever the backend's
 * logits of a position do not depend on how many tokens its step carried (the CPU's). */
int engine_verify_accept(const int32_t *draft, int n_draft, const engine_result *samples);
/* ---- multi-token prediction (the model's MTP block, model.h: model_mtp) ----
 * The block guesses the token after position p from the token at p and the target's final
 * hidden state (engine_seq.hidden) of position p - 1, so it runs one position behind the
 * target: after a target step over positions a..b it "catches up" over a..b with the step's
 * tokens and the hidden rows of a-1..b-1 (the row of b kept for the next catch-up), and its
 * guess after b is draft 1.  Draft k+1 comes from draft k at the next position with the block's
 * own hidden output (hidden_out) of the position before.  The block's K/V are written at each
 * position it runs, through the sequence's block table, and a query attends over them at
 * positions 0..its own: positions of rejected drafts are simply written again by the next
 * catch-up (nothing past a length is ever read). */
typedef struct engine_mtp_seq {
    int slot;              /* the sequence's row */
    const int32_t *tokens; /* the tokens at positions pos .. pos + n_tokens - 1 */
    int n_tokens;          /* >= 1 */
    int pos;
    const int32_t *blocks; /* as engine_seq.blocks (NULL: the row's fixed blocks) */
    const float *hidden;   /* n_tokens x n_embd: the hidden state of the position before each token */
    int32_t *draft;        /* optional: n_tokens greedy guesses (argmax, lowest id on ties) */
    float *logits;         /* optional: n_tokens x n_vocab */
    float *hidden_out;     /* optional: n_tokens x n_embd, the block's own normed output */
} engine_mtp_seq;

/* Whether the engine runs the model's MTP block (engine_config.mtp on a backend that builds
 * it: the CPU one). */
bool engine_has_mtp(const engine *e);
/* One pass of the MTP block over n_seqs sequences (at most n_slots, distinct rows, at most
 * max_batch_tokens tokens in all).  0, ENGINE_EINVAL with a message (bad input, or no MTP
 * block: engine_has_mtp) or ENGINE_FATAL.  Reads nothing of the rows' target state. */
int engine_mtp_step(engine *e, const engine_mtp_seq *seqs, int n_seqs, char *err, size_t errlen);

/* Forget a row's token history (the next sequence in it starts afresh). */
void engine_slot_clear(engine *e, int slot);
/* Copies every layer's K/V of block src into block dst: copy-on-write, before a sequence
 * writes into a block that others share or that the prefix cache holds.  0, ENGINE_EINVAL
 * (ids out of range) or ENGINE_FATAL. */
int engine_kv_copy(engine *e, int dst, int src, char *err, size_t errlen);
/* The same in the sliding pool (ENGINE_EINVAL without one). */
int engine_kv_copy_swa(engine *e, int dst, int src, char *err, size_t errlen);
/* Hybrid models: copies state slot src (its state and the positions it holds) into dst: a
 * snapshot of a prefix, or one restored.  0 or ENGINE_EINVAL (ids out of range, or a model
 * without recurrent state). */
int engine_state_copy(engine *e, int dst, int src, char *err, size_t errlen);
/* Whether a caller that speculates may rewind a hybrid's verification on this backend (sched.c:
 * spec_rewind): a step verifying drafts advances the state slot over all its tokens as a
 * prompt chunk would, each position's logits those of one-token steps within the backend's
 * tolerance, and engine_state_copy is ordered with the steps around it, so a copy taken before
 * a verification and restored after a rejected draft is that state.  A property of the backend,
 * checked on its hardware (the CPU's: yes), whatever the model; whether the model has a state
 * at all is engine_state_slots(). */
bool engine_can_rewind_state(const engine *e);
/* Bytes of one state slot: 0 for a model without recurrent layers. */
size_t engine_state_bytes(const engine *e);
/* State slots in the pool (0 for a model without recurrent layers). */
int engine_state_slots(const engine *e);
void engine_free(engine *e);
const char *engine_name(const engine *e);

#endif
