/* cpu_ops.h - the float32 building blocks of the CPU forward pass.
 *
 * Every kernel computes each output element with one fixed sequence of float operations that
 * depends only on that element's inputs: the result for a token does not change with the
 * batch it travels in or the number of threads. */
#ifndef INFERD_CPU_OPS_H
#define INFERD_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "cpu_pool.h"

/* out = x / rms(x) * weight over n floats (weight NULL: 1; out may alias x). */
void cpu_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);

/* out = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias over n floats (out may alias x):
 * a LayerNorm (bert), its moments summed in double. */
void cpu_layernorm(float *out, const float *x, const float *weight, const float *bias, int n, float eps);

/* x = x * Phi(x), the exact (erf) GELU, elementwise. */
void cpu_gelu_erf(float *x, int n);

/* In-place softmax over n floats. */
void cpu_softmax(float *x, int n);

/* ARCH_ROUTER_SOFTMAX_TOPK for one token: softmax over the n_expert router logits (in place),
 * the k most probable experts (ties: the lower id) in ids[0..k), their probabilities
 * renormalised to sum to 1 in weights[0..k). */
void cpu_moe_route(float *logits, int n_expert, int k, int32_t *ids, float *weights);

/* ARCH_ROUTER_TOPK_SOFTMAX for one token: the k largest router logits (ties: the lower id) in
 * ids[0..k), the softmax over those k alone in weights[0..k). */
void cpu_moe_route_topk_softmax(const float *logits, int n_expert, int k, int32_t *ids, float *weights);

/* ARCH_ROUTER_SIGMOID_BIAS, and DeepSeek's routers, for one token: scores = sigmoid(logits)
 * (softmax: softmax(logits)) in place, the k experts of the highest score + bias[x] (ties: the
 * lower id) in ids[0..k), their unbiased scores renormalised to sum to 1 (unless raw) and
 * times scale in weights[0..k).  With n_group > 1 groups (ARCH_FFN_EXPERT_GROUPS) only the
 * experts of the topk_group best groups compete, the others counting as 0 (transformers'
 * masked_fill); a group scores the sum of its two best biased scores, or with softmax its
 * best score (DeepSeek V3's and V2's rules; ties: the lower group). */
typedef struct cpu_score_router {
    const float *bias; /* [n_expert]: only chooses (NULL: none) */
    int n_expert, k;
    float scale;
    bool softmax, raw;
    int n_group, topk_group;
    float *choice; /* n_expert + n_group floats of scratch when n_group > 1 */
} cpu_score_router;
void cpu_moe_route_scored(const cpu_score_router *r, float *logits, int32_t *ids, float *weights);

/* x = silu(x) * y elementwise (SwiGLU's gate). */
void cpu_swiglu(float *x, const float *y, int n);

/* x = gelu_tanh(x) * y elementwise (GeGLU's gate): the exact tanh formula, as transformers'
 * gelu_pytorch_tanh (no lookup table). */
void cpu_geglu(float *x, const float *y, int n);

/* x = gelu_erf(x) * y elementwise (jina-bert-v2's GEGLU: the exact GELU). */
void cpu_geglu_erf(float *x, const float *y, int n);

/* x = gelu_tanh(x) elementwise (Gemma 4's per-layer embedding gate). */
void cpu_gelu(float *x, int n);

/* ARCH_ACT_SWIGLU_CLAMP: x = (clamp(y, -7, 7) + 1) * g * sigmoid(1.702 g) with g = min(x, 7),
 * elementwise (gpt-oss's expert activation; x the gate, y the up projection). */
void cpu_swiglu_clamp(float *x, const float *y, int n);

/* x = cap * tanh(x / cap) elementwise (Gemma's final logit soft-cap). */
void cpu_softcap(float *x, int n, float cap);

/* out[t][r] = dot(w row r, x[t]) (+ bias[r]) for t < n_tok, r < w->ne1; rows of x are
 * w->ne0 floats apart, rows of out w->ne1 floats apart.  Parallel over weight rows, with all
 * tokens handled while a row is hot, so each weight row is read once per call. */
typedef struct cpu_matmul {
    float *out;
    const float *x;
    int n_tok;
    const model_tensor *w;
    const float *bias; /* NULL: none */
} cpu_matmul;
void cpu_matmul_run(cpu_pool *pool, const cpu_matmul *mm);

/* Rotary position embedding of one token's heads (n_head * head_dim floats), in place, over
 * the first n_rot dimensions of each head (partial RoPE; the rest pass unchanged).  Pair i
 * (i < n_rot/2) turns by pos / scale * f_i / freq_div[i], f_i = base^(-2i/n_rot), its cos and
 * sin times attn_factor; pairs are (2i, 2i+1) normally and (i, i + n_rot/2) in the NeoX layout.
 * With YaRN (yarn_factor > 0) f_i becomes f_i * (1 - r) + f_i / yarn_factor * r,
 * r = clamp((i - low) / (high - low), 0, 1) (model_hparams). */
typedef struct cpu_rope {
    int head_dim;
    int n_rot; /* 0: head_dim */
    bool neox;
    float base;
    float scale;          /* linear position scaling, 1 = none */
    const float *freq_div; /* n_rot/2 divisors (rope_freqs, LongRoPE's factors) or NULL */
    float attn_factor;     /* YaRN's or LongRoPE's (model_hparams.rope_attn_factor); 0 is taken as 1 */
    float yarn_factor, yarn_low, yarn_high; /* yarn_factor 0: no YaRN */
} cpu_rope;
void cpu_rope_apply(const cpu_rope *r, float *vec, int n_head, int pos);

/* Gated DeltaNet, one token of its causal depthwise conv1d: x (chan floats) becomes
 * silu(sum over taps j of w[c][j] * input at t - taps + 1 + j), w [chan][taps]; window holds
 * the taps - 1 inputs before x (oldest first) and moves on by one. */
void cpu_conv1d_step(float *x, float *window, const float *w, int chan, int taps);

/* x / sqrt(sum x^2 + 1e-6) over n floats, in place (transformers' l2norm, eps inside). */
void cpu_l2norm(float *x, int n);

/* The gated delta rule over a batch: per sequence and v head h, for its tokens in order,
 *     S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
 * with S [d][d] (k index, v index) the head's state, q and k the (normed, q scaled) vectors of
 * the q/k head it reads (h mod k_heads, or h / (v_heads / k_heads) when grouped), g <= 0 the
 * log of the decay.  q, k and v of token t are at t * stride + q_off / k_off / v_off (+ head *
 * d); o goes to out [t][v heads x d].  Sequences' tokens are contiguous runs; their states are
 * at state + slot * slot_stride + layer_off.  Parallel over (sequence, v head): each runs its
 * tokens in order, so a token's result does not depend on the batch.
 *
 * chunk 0: token by token, the exact recurrence (what the engine runs: a prompt split into
 * any pieces gives the same bits).  chunk > 0: the chunked parallel form (flash-linear-
 * attention's WY / UT transform, transformers' torch_chunk_gated_delta_rule) over chunks of
 * that many tokens: per chunk the in-chunk interactions as small matrix products and one
 * state update, the same sums in another order (float rounding apart); the CPU reference of
 * the GPU's chunked prefill.  scratch: n_threads * cpu_delta_scratch(d, chunk) floats. */
typedef struct cpu_delta {
    float *out;
    const float *qkv;
    long stride, q_off, k_off, v_off;
    const float *beta, *g; /* [n_tok][v_heads] */
    float *state;
    long slot_stride, layer_off;
    const int *seq_first, *seq_tokens, *seq_state;
    int n_seqs, v_heads, k_heads, d;
    bool grouped;
    int chunk;
    float *scratch;
} cpu_delta;
long cpu_delta_scratch(int d, int chunk);
void cpu_delta_run(cpu_pool *pool, const cpu_delta *dr);

/* Grouped-query attention (causal unless n_keys says otherwise) of a batch of tokens over their sequences' K/V blocks.
 * Token t at position pos[t] of sequence seq[t] attends to positions 0..pos[t] (a sliding
 * layer: pos[t]-window+1..pos[t]; the positions before are never read), position p
 * being row p % ENGINE_KV_BLOCK of block tables[seq[t] * table_width + p / ENGINE_KV_BLOCK];
 * their K/V must already be in the cache.  The sums run over positions in order whatever the
 * blocks, so a token's result does not depend on where its K/V live.  Parallel over (token,
 * head). */
typedef struct cpu_attention {
    float *out;       /* [n_tok][n_head * head_dim] */
    const float *q;   /* [n_tok][n_head * head_dim] */
    const float *key_cache, *value_cache; /* this layer's row 0 of block 0 */
    long block_stride; /* floats between blocks in the caches */
    int row_stride;    /* floats between positions in a block (>= n_head_kv * head_dim) */
    const int32_t *tables;
    int table_width;
    int n_tok;
    const int *seq, *pos;
    int n_head, n_head_kv, head_dim;
    int window;        /* 0: every earlier position; else the last `window` */
    float score_div;   /* scores are q.k / score_div (sqrt(head_dim), or of query_pre_attn_scalar) */
    const float *sinks; /* [n_head] logits that join each softmax's denominator, or NULL */
    float *scores;    /* n_threads * scores_stride floats of scratch */
    int scores_stride; /* >= the largest pos + 1 (the largest n_keys) */
    /* NULL: causal.  Else token t attends to positions 0..n_keys[t]-1, the whole sequence
     * (bidirectional encoders), its K/V all in the cache before the call. */
    const int *n_keys;
    /* > 0: ALiBi (jina-bert-v2): score - m_h |pos - key| with ggml's slope m_h of head h for
     * this maximum bias */
    float alibi_max;
} cpu_attention;
void cpu_attention_run(cpu_pool *pool, const cpu_attention *at);

#endif
