/* sampling.h - choose the next token from one row of logits, on the CPU.
 *
 * This is the CPU engine's sampler and the reference the GPU sampler is checked against, so
 * the order of operations is part of the contract:
 *
 *   0. allowed mask (constrained decoding, when given): l[id] = -inf for every token whose
 *      bit is clear, so the rest of the pipeline (and the logprobs) sees only allowed tokens
 *   1. logit_bias:  l[id] += bias                       (ids outside the vocabulary ignored)
 *   2. penalties over the window (the last penalty_last_n tokens of the history, all of it
 *      when -1, none when 0), for each distinct token t seen c(t) times there:
 *        repeat    (llama.cpp)  l[t] = l[t] > 0 ? l[t] / repeat_penalty : l[t] * repeat_penalty
 *        presence  (OpenAI)     l[t] -= presence_penalty
 *        frequency (OpenAI)     l[t] -= frequency_penalty * c(t)
 *   3. logprobs: log-softmax at temperature 1 of the logits after steps 1-2 (the "processed"
 *      logits; temperature and the filters below do not change them).  The chosen token's
 *      logprob and the n_top_logprobs most likely tokens (descending, lowest id on ties).
 *   4. temperature <= 0: greedy, the argmax of the processed logits, lowest id on ties.
 *      Otherwise p ∝ exp(l / temperature) over the candidates sorted by descending logit
 *      (lowest id on ties), then in this order:
 *        top_k  keep the k most likely (k <= 0: all)
 *        top_p  keep the shortest prefix whose probability mass (renormalised over what
 *               top_k kept) reaches top_p (always at least one token)
 *        min_p  keep the tokens with p >= min_p * p_max
 *      and draw by inverse CDF over the kept, renormalised distribution with
 *      u = sampling_uniform(seed, position).
 *
 * `position` is the position the sampled token will occupy in its sequence (the position of
 * the last fed token + 1), so a request replays identically whatever it is batched with.
 * The sampler allocates nothing: the caller provides sampling_scratch_bytes(n_vocab) bytes. */
#ifndef INFERD_SAMPLING_H
#define INFERD_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

size_t sampling_scratch_bytes(int n_vocab);

/* The greedy pick of n raw logits: the largest, lowest id on ties, NaN never chosen over a
 * number (step 4's choice, and the MTP block's drafts). */
int sampling_argmax(const float *logits, int n);

/* Uniform double in [0, 1): a pure function of (seed, position) (splitmix64 of both). */
double sampling_uniform(uint64_t seed, int64_t position);

typedef struct sampling_input {
    float *logits;            /* n_vocab raw logits; modified in place (steps 1-2) */
    int n_vocab;
    const int32_t *history;   /* tokens fed so far (for penalties) */
    int n_history;
    int64_t position;         /* where the sampled token will sit: seeds the draw */
    const sampling_params *sp;
    const uint32_t *allowed;  /* NULL or ceil(n_vocab/32) words (engine_seq.allowed) */
} sampling_input;

/* Fills *out (token, logprob and top logprobs when sp->n_top_logprobs >= 0, else logprob 0 and
 * n_top 0).  scratch: sampling_scratch_bytes(n_vocab) bytes, suitably aligned (malloc'd). */
void sampling_sample(const sampling_input *in, void *scratch, engine_result *out);

#endif
