/* engine.h - the one interface between scheduling and math.
 *
 * The scheduler hands the engine a batch of sequences.  Each sequence lives in a KV slot
 * (0 .. n_slots-1) and brings new tokens that start at a given position of that slot; the
 * engine appends their K/V to the slot, and for each sequence that asks, samples one token
 * from the logits of its last new token.  A step may mix prompt chunks (many tokens) and
 * decode tokens (one token) of different slots: backends pack them as they see fit.
 *
 * The engine keeps each slot's token history (every token fed at positions 0..pos+n-1) so
 * that repetition penalties need nothing from the caller.  Sampling randomness is a pure
 * function of (seed, position of the sampled token), so a request replays identically
 * whatever else is in the batch and on whichever backend.
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

typedef struct engine_seq {
    int slot;
    const int32_t *tokens;
    int n_tokens; /* >= 1 */
    int pos;      /* position of tokens[0] in the slot; 0 starts a fresh sequence */
    bool want_token;
    const sampling_params *sp; /* used when want_token */
    /* Constrained decoding (when want_token): NULL samples from the whole vocabulary; else
     * ceil(n_vocab/32) words (the model's n_vocab), bit i%32 of word i/32 set when token i may
     * be sampled.  Applied before everything else (sampling.h, step 0); the caller makes sure
     * at least one token is allowed. */
    const uint32_t *allowed;
    /* Optional (tests/tools): when non-NULL, receives the raw logits (n_vocab floats) of the
     * last token, or of every new token (n_tokens * n_vocab) when logits_all. */
    float *logits;
    bool logits_all;
} engine_seq;

typedef struct engine_result {
    int32_t token;
    float logprob; /* log-softmax of the chosen token over the (biased, penalised) logits at T=1 */
    int n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprobs[ENGINE_MAX_TOP_LOGPROBS];
} engine_result;

typedef struct engine_config {
    int n_slots;     /* parallel sequences */
    int ctx_per_slot;/* tokens per slot */
    int max_batch_tokens; /* most tokens one step may carry (prefill chunk budget) */
    int n_threads;   /* CPU backend worker threads (0 = machine cores) */
    int device;      /* GPU ordinal */
    size_t vram_reserve_mb; /* GPU: leave this much free after KV allocation */
    bool verbose;
} engine_config;

typedef struct engine engine; /* opaque: backends define it in engine_impl.h */

/* Which backend runs the math.  AUTO: CUDA when a usable GPU is present, else the CPU. */
typedef enum engine_device { ENGINE_DEVICE_AUTO = 0, ENGINE_DEVICE_CPU, ENGINE_DEVICE_CUDA } engine_device;

/* "auto", "cpu" or "cuda"; false for anything else. */
bool engine_device_parse(const char *name, engine_device *out);

/* Creates an engine for m on dev.  With AUTO a GPU that cannot be used (no driver, too little
 * memory) is logged as a warning and the CPU is used instead; with CPU or CUDA that backend
 * or nothing.  NULL with a message in err when no engine could be made. */
engine *engine_open(engine_device dev, const model *m, const engine_config *cfg, char *err, size_t errlen);
/* true when the CUDA backend was built and a GPU answers. */
bool engine_cuda_available(void);

/* The configuration the engine was created with (n_slots, ctx_per_slot, batch budget). */
const engine_config *engine_get_config(const engine *e);
const model *engine_model(const engine *e);

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
/* Forget a slot's contents (the next sequence in it starts at pos 0). */
void engine_slot_clear(engine *e, int slot);
void engine_free(engine *e);
const char *engine_name(const engine *e);

#endif
