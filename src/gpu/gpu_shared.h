/* gpu_shared.h - plain structs shared by the host code (C) and the kernels (CUDA C++).
 * Only fixed-width fields, laid out identically by both compilers. */
#ifndef INFERD_GPU_SHARED_H
#define INFERD_GPU_SHARED_H

#include <stdint.h>

#define GPU_MAX_TOP 20 /* == ENGINE_MAX_TOP_LOGPROBS */

#ifdef __CUDACC__
typedef __half gpu_half;
#else
typedef uint16_t gpu_half;
#endif

/* matvec_<type>_<rows>: y[m][n] (+)= sum_k W[n][k] x[m][k] (+ bias[n]). */
typedef struct matvec_args {
    const uint8_t *w; /* n rows of row_bytes */
    unsigned long long row_bytes;
    int k, n, m;     /* inputs per row (multiple of 32), outputs, activation rows */
    int ldx, ldy;
    int accumulate;  /* 1: y += W x (residual) */
    const float *x;  /* [m][ldx] */
    float *y;        /* [m][ldy] */
    const float *bias; /* [n] or NULL */
} matvec_args;

/* kv_store: this step's K and V ([t][n_kv*hd] f32) into the FP16 caches of each token's slot
 * at its position.  Cache layout: [slot][layer][kv_head][ctx][hd]. */
typedef struct kv_store_args {
    const float *k, *v;
    gpu_half *kc, *vc;
    const int32_t *slot, *pos;
    int n_layer, layer, n_kv, ctx, hd;
} kv_store_args;

typedef struct attn_args {
    const float *q; /* [t][n_head][hd] */
    const gpu_half *kc, *vc;
    const int32_t *slot, *pos;
    int n_layer, layer, n_head, n_kv, ctx, hd;
    int gb;      /* query heads per block (a divisor of n_head/n_kv, at most 8) */
    int n_split; /* key ranges per query (split-K) */
    float scale; /* 1/sqrt(hd) */
    float *part_o;  /* [t][n_head][n_split][hd] */
    float *part_ml; /* [t][n_head][n_split][2] */
} attn_args;

/* One logits row of a step: which packed token it comes from and how to sample it. */
typedef struct gpu_sample_row {
    int32_t token_index; /* row of the packed activations */
    int32_t slot;
    int32_t hist_end; /* tokens of the slot's history so far (position of the last one + 1) */
    int32_t want;     /* 1: sample a token; 0: logits only / padding */
    float temperature, top_p, min_p;
    int32_t top_k;
    float repeat_penalty, presence_penalty, frequency_penalty;
    int32_t penalty_last_n; /* -1: whole history */
    int32_t n_top;          /* < 0: no logprobs */
    int32_t bias_off, n_bias;
    int32_t pad_;
    uint64_t seed;
} gpu_sample_row;

typedef struct gpu_bias {
    int32_t id;
    float val;
} gpu_bias;

typedef struct gpu_sample_out {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[GPU_MAX_TOP];
    float top_logprobs[GPU_MAX_TOP];
} gpu_sample_out;


typedef struct sample_args {
    const float *logits; /* [rows][n_vocab] raw */
    float *work;         /* [rows][n_vocab] processed logits (scratch) */
    int32_t *counts;     /* [rows][n_vocab] zero on entry and on exit (penalty counting) */
    const gpu_sample_row *rows;
    const gpu_bias *bias; /* rows' logit_bias entries, at rows[i].bias_off */
    const int32_t *hist; /* [slot][ctx] */
    int ctx, n_vocab;
    gpu_sample_out *out;
} sample_args;

#endif
