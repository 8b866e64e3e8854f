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

/* ARCH_ROUTER_SIGMOID_BIAS for one token: scores = sigmoid(logits) (in place), the k experts
 * of the highest score + bias[x] (ties: the lower id) in ids[0..k), their unbiased scores
 * renormalised to sum to 1 and times scale in weights[0..k). */
typedef struct cpu_sigmoid_router {
    const float *bias; /* [n_expert]: only chooses */
    int n_expert, k;
    float scale;
} cpu_sigmoid_router;
void cpu_moe_route_sigmoid(const cpu_sigmoid_router *r, float *logits, int32_t *ids, float *weights);

/* x = silu(x) * y elementwise (SwiGLU's gate). */
void cpu_swiglu(float *x, const float *y, int n);

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
 * the first n_rot dims of each head (the rest pass through).  Pair i (i < n_rot/2) turns by
 * pos / scale * base^(-2i/n_rot) / freq_div[i], its cos and sin times attn_factor; pairs are
 * (2i, 2i+1) normally and (i, i + n_rot/2) in the NeoX layout. */
typedef struct cpu_rope {
    int head_dim;
    int n_rot;         /* even, <= head_dim */
    float attn_factor; /* 1 = none (LongRoPE's scaling) */
    bool neox;
    float base;
    float scale;          /* linear position scaling, 1 = none */
    const float *freq_div; /* n_rot/2 divisors (rope_freqs, LongRoPE factors) or NULL */
} cpu_rope;
void cpu_rope_apply(const cpu_rope *r, float *vec, int n_head, int pos);

/* Causal grouped-query attention of a batch of tokens over their sequences' K/V blocks.
 * Token t at position pos[t] of sequence seq[t] attends to positions 0..pos[t], position p
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
    float *scores;    /* n_threads * scores_stride floats of scratch */
    int scores_stride; /* >= the largest pos + 1 */
} cpu_attention;
void cpu_attention_run(cpu_pool *pool, const cpu_attention *at);

#endif
