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

/* out = x / rms(x) * weight over n floats (out may alias x). */
void cpu_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);

/* In-place softmax over n floats. */
void cpu_softmax(float *x, int n);

/* ARCH_ROUTER_SOFTMAX_TOPK for one token: softmax over the n_expert router logits (in place),
 * the k most probable experts (ties: the lower id) in ids[0..k), their probabilities
 * renormalised to sum to 1 in weights[0..k). */
void cpu_moe_route(float *logits, int n_expert, int k, int32_t *ids, float *weights);

/* ARCH_ROUTER_TOPK_SOFTMAX for one token: the k largest router logits (ties: the lower id) in
 * ids[0..k), the softmax over those k alone in weights[0..k). */
void cpu_moe_route_topk_softmax(const float *logits, int n_expert, int k, int32_t *ids, float *weights);

/* x = silu(x) * y elementwise (SwiGLU's gate). */
void cpu_swiglu(float *x, const float *y, int n);

/* x = gelu_tanh(x) * y elementwise (GeGLU's gate): the exact tanh formula, as transformers'
 * gelu_pytorch_tanh (no lookup table). */
void cpu_geglu(float *x, const float *y, int n);

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

/* Rotary position embedding of one token's heads (n_head * head_dim floats), in place.
 * Pair i (i < head_dim/2) turns by pos / scale * f_i / freq_div[i], f_i = base^(-2i/head_dim);
 * pairs are (2i, 2i+1) normally and (i, i + head_dim/2) in the NeoX layout.  With YaRN
 * (yarn_factor > 0) f_i becomes f_i * (1 - r) + f_i / yarn_factor * r, r = clamp((i - low) /
 * (high - low), 0, 1), and cos/sin are times yarn_attn_factor (model_hparams). */
typedef struct cpu_rope {
    int head_dim;
    bool neox;
    float base;
    float scale;          /* linear position scaling, 1 = none */
    const float *freq_div; /* head_dim/2 divisors (rope_freqs) or NULL */
    float yarn_factor, yarn_low, yarn_high, yarn_attn_factor; /* yarn_factor 0: no YaRN */
} cpu_rope;
void cpu_rope_apply(const cpu_rope *r, float *vec, int n_head, int pos);

/* Causal grouped-query attention of a batch of tokens over their sequences' K/V blocks.
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
    const int32_t *tables;
    int table_width;
    int n_tok;
    const int *seq, *pos;
    int n_head, n_head_kv, head_dim;
    int window;        /* 0: every earlier position; else the last `window` */
    float score_div;   /* scores are q.k / score_div (sqrt(head_dim), or of query_pre_attn_scalar) */
    const float *sinks; /* [n_head] logits that join each softmax's denominator, or NULL */
    float *scores;    /* n_threads * scores_stride floats of scratch */
    int scores_stride; /* >= the largest pos + 1 */
} cpu_attention;
void cpu_attention_run(cpu_pool *pool, const cpu_attention *at);

#endif
