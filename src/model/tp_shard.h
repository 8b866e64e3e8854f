/* tp_shard.h - the sharding arithmetic of tensor parallelism (issue 16): which part of the model
 * each of N GPUs holds, and what it costs in memory.  Pure arithmetic on the model's shape: no
 * CUDA, no NCCL, so the CPU unit tests check it in CI.
 *
 * The split is Megatron-style, two all-reduces per layer:
 *   - attention: Q, K and V are split by columns (whole heads per GPU), so each GPU computes
 *     attention for its own heads with no communication; the output projection wo is split by
 *     rows (its input, the concatenated heads), each GPU produces a partial [n_embd] sum, and one
 *     all-reduce adds them.
 *   - FFN: gate and up are split by columns (a range of the n_ff hidden units), SiLU(gate)*up is
 *     local, down is split by rows (the same n_ff range as its input), one all-reduce.
 *   - KV heads go with the query heads that read them.  GQA with fewer KV heads than GPUs
 *     replicates a KV head on every GPU whose query heads use it (its K/V weights and its cache).
 *   - the embedding and the LM head are split by vocabulary rows; only token ids (or one
 *     (max, argmax) pair per shard) leave the GPUs for sampling.
 * A row-split input must land on whole quantisation blocks (256 inputs for the K-quants, 32 for
 * Q4_0/Q8_0): a GPU's slice of a quantised row cannot start inside a block. */
#ifndef INFERD_TP_SHARD_H
#define INFERD_TP_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/ggml_types.h"
#include "model/model.h"

#define TP_MAX_GPUS 8 /* one host's NVLink domain (HGX boards have 8) */

/* What the plan needs of a model: its hyper-parameters and the storage type of each matrix. */
typedef struct tp_shape {
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    bool tied_output;                     /* the LM head is the embedding (one tensor) */
    ggml_type wq, wk, wv, wo;             /* per-layer attention matrices */
    ggml_type w_gate, w_up, w_down;       /* per-layer FFN matrices */
    ggml_type tok_embd, output;           /* output unused when tied_output */
    int kv_elem_bytes;                    /* bytes of one cached K or V value (2: the CUDA engine's FP16) */
} tp_shape;

typedef struct tp_range { int begin, end; } tp_range; /* [begin, end) */

/* One GPU's shard. */
typedef struct tp_rank {
    tp_range q_heads;       /* query heads (columns of wq, rows-input of wo: q_heads x head_dim) */
    tp_range kv_heads;      /* KV heads it holds (columns of wk/wv, its KV cache) */
    tp_range ffn;           /* hidden units: columns of gate/up, input rows of down */
    tp_range vocab;         /* rows of the embedding and of the LM head */
    size_t weight_bytes;    /* all its weights, norms (replicated, F32) included */
    size_t replicated_bytes;/* of which held by every GPU: the norms, and KV weights shared with others */
    size_t kv_bytes_per_token; /* its K and V cache for one token, all layers */
} tp_rank;

typedef struct tp_plan {
    int n_gpus;
    int kv_replicas;        /* GPUs holding each KV head: 1 when the KV heads are split */
    size_t total_weight_bytes;     /* the unsplit model, as one GPU holds it (N=1) */
    size_t total_kv_bytes_per_token;
    tp_rank rank[TP_MAX_GPUS];
} tp_plan;

/* The shape of a loaded model. */
void tp_shape_from_model(const model *m, int kv_elem_bytes, tp_shape *out);

/* Plan the split of `s` over n_gpus.  0, or -1 with a message a user can act on in err (which
 * names the quantity that does not divide and the counts that would). */
int tp_plan_make(const tp_shape *s, int n_gpus, tp_plan *out, char *err, size_t errlen);

/* One line per GPU ("GPU 1: heads 16-31, kv heads 4-7, ffn 7168-14335, vocab ..., weights 2.31
 * GiB, KV 64.0 KiB/token") written into buf; returns buf. */
const char *tp_plan_describe_rank(const tp_plan *p, int rank, char *buf, size_t cap);

/* "2.31 GiB" from 1 GiB up, else "12.5 MiB" (a test model's plan is not all zeros). */
const char *tp_bytes_text(double bytes, char *buf, size_t cap);

/* The layer features a sharded model may use (the dense llama / qwen2 / qwen3 families): pre-norm
 * blocks of full causal attention with q/k/v biases or per-head q/k norms and a SiLU GLU.  The
 * rest (MoE, the hybrids, sliding windows, sandwich norms, encoders, fused or biased outputs) is
 * refused by name (tp_view_make), not split wrong. */
#define TP_FEATURES (ARCH_F_NORM_PRE | ARCH_F_ATTN_FULL | ARCH_F_QKV_BIAS | ARCH_F_QK_NORM | ARCH_F_FFN_GLU | ARCH_F_ACT_SILU)

/* One GPU's part of a model, as a model of its own that a single-GPU engine loads unchanged:
 * the same families and globals, every layer holding only rank r's query and KV heads and FFN
 * units (hp.n_head, hp.n_head_kv, hp.n_ff and each layer's n_head_kv and n_ff are the rank's).
 * Row splits (wq, wk, wv, their biases, w_gate, w_up) are views into the full model's rows;
 * column splits (wo's and w_down's inputs) are repacked rows, whole quantisation blocks each,
 * owned here.  The embedding, the LM head and the norms are the full model's (replicated: the
 * vocabulary split of the plan is not used yet).  The full model must outlive the view. */
typedef struct tp_view {
    model m;                /* m.gguf NULL: the full model owns the file */
    unsigned char *packed;  /* the column slices of every layer, one allocation */
    size_t packed_bytes;
} tp_view;

/* Rank r's view of m under plan p (made for m).  0, or -1 with a message naming the feature or
 * the KV layout that tensor parallelism does not split yet. */
int tp_view_make(const model *m, const tp_plan *p, int r, tp_view *out, char *err, size_t errlen);
void tp_view_free(tp_view *v);
/* Frees the repacked column slices once an engine has uploaded them: the view's wo and w_down
 * then have no data (its shapes stay). */
void tp_view_drop_packed(tp_view *v);

#endif
