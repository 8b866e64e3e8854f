/* model.h - a loaded model: architecture hyper-parameters and the weight tensors, bound by
 * name from a validated GGUF file.  Weights are not converted: each model_tensor points into the
 * gguf_file's copy of the file (model_load: gguf_load, which a change to the file on disk
 * cannot reach) in its stored (possibly quantised) form.  Backends read these; nothing here
 * computes. */
#ifndef INFERD_MODEL_H
#define INFERD_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arch.h"
#include "ggml_types.h"
#include "gguf.h"

const char *model_arch_name(model_arch a);

/* A 1-D, 2-D or 3-D weight.  For a matrix, ne0 = input features (row length, contiguous) and
 * ne1 = output features (number of rows); a 3-D tensor is ne2 such matrices one after the
 * other (the experts of a MoE layer: model_tensor_slice picks one).  Absent optional tensors
 * have data == NULL. */
typedef struct model_tensor {
    const void *data;
    ggml_type type;
    int64_t ne0, ne1;
    int64_t ne2; /* slices: 1 for a matrix or a vector */
    size_t row_bytes; /* ggml_row_bytes(type, ne0) */
    const char *name;
} model_tensor;

/* Slice i (< t->ne2) of a 3-D tensor as a matrix of its own. */
static inline model_tensor model_tensor_slice(const model_tensor *t, int64_t i)
{
    model_tensor s = *t;
    s.data = (const char *)t->data + (size_t)i * (size_t)t->ne1 * t->row_bytes;
    s.ne2 = 1;
    return s;
}

/* A layer: its recipe and the tensors the recipe binds (the others stay zeroed). */
typedef struct model_layer {
    arch_layer recipe;
    model_tensor attn_norm;      /* pre-norm: [n_embd] */
    model_tensor wq, wk, wv, wo; /* [n_embd -> n_head*head_dim], [.. -> n_head_kv*head_dim] x2, [n_head*head_dim -> n_embd] */
    model_tensor wqkv;           /* fused qkv: [n_embd -> q rows, k rows, v rows] instead of wq, wk, wv */
    model_tensor bq, bk, bv;     /* qkv bias */
    model_tensor q_norm, k_norm; /* qk norm: [head_dim] */
    model_tensor attn_post_norm; /* post-norm: [n_embd] */
    model_tensor ffn_norm;       /* pre-norm: [n_embd] */
    model_tensor w_gate, w_up;   /* [n_embd -> n_ff]; fused gate/up: w_up alone, [n_embd -> 2*n_ff] */
    model_tensor w_down;         /* [n_ff -> n_embd] */
    model_tensor ffn_post_norm;  /* post-norm: [n_embd] */
    model_tensor ffn_gate_inp;   /* MoE router: [n_embd -> n_expert] */
    model_tensor ffn_gate_exps, ffn_up_exps; /* MoE: n_expert x [n_embd -> n_ff_exp] */
    model_tensor ffn_down_exps;  /* MoE: n_expert x [n_ff_exp -> n_embd] */
    model_tensor exp_probs_b;    /* sigmoid router: [n_expert] bias for choosing experts only */
    model_tensor ffn_gate_shexp, ffn_up_shexp; /* shared expert: [n_embd -> n_ff_exp*n_expert_shared] */
    model_tensor ffn_down_shexp; /* [n_ff_exp*n_expert_shared -> n_embd] */
} model_layer;

typedef struct model_hparams {
    model_arch arch; /* the registry's id of desc */
    int n_vocab;
    int n_ctx_train;
    int n_embd;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim; /* usually n_embd / n_head; qwen3 states it via attention.key_length */
    int n_ff;
    int n_expert;      /* MoE (0 otherwise): experts per layer, */
    int n_expert_used; /* how many run per token (top-k), */
    int n_ff_exp;      /* and one expert's hidden width */
    int n_expert_shared;        /* shared experts (their GLU is n_ff_exp times this wide) */
    float expert_weights_scale; /* sigmoid router: the chosen weights times this (1 = none) */
    int n_dense_lead;           /* layers before the MoE ones that run desc->leading */
    int n_nextn;                /* NextN (MTP) layers at the end of the file: not run, not counted in n_layer */
    int n_rot;                  /* RoPE turns the first n_rot dims of a head (default head_dim) */
    int n_ctx_orig;             /* LongRoPE: the context the short factors are for */
    float rope_attn_factor;     /* LongRoPE: cos and sin times this (1 = none) */
    float rms_eps;
    float rope_base;      /* rope.freq_base, default 10000 */
    float rope_scale;     /* linear scaling factor (1 = none) from rope.scaling.factor when type=linear */
    bool rope_neox;       /* rotate halves (qwen) instead of adjacent pairs (llama) */
    bool tied_output;     /* output.weight absent: LM head is token_embd */
} model_hparams;

typedef struct model {
    gguf_file *gguf; /* owned */
    const arch_desc *desc; /* the family: keys, tensors, recipe */
    model_hparams hp;
    char name[128]; /* general.name or file basename */
    model_tensor tok_embd;    /* [n_embd x n_vocab] (row per token) */
    model_tensor output_norm; /* [n_embd] */
    model_tensor output;      /* [n_embd -> n_vocab]; == tok_embd when tied */
    model_tensor rope_freqs;  /* optional [head_dim/2] F32 divisors (Llama 3.1 rope scaling) */
    model_tensor rope_factors_short, rope_factors_long; /* LongRoPE (phi3): [n_rot/2] divisors */
    model_layer *layers;      /* n_layer */
    size_t weight_bytes;      /* sum of all tensor bytes used */
} model;

/* Load + validate (architecture known, required keys present, every required tensor present
 * with the shape the hyper-parameters imply and a supported type). Errors start with the path
 * ("PATH: reason"; callers print them as they are) and name the key or tensor. */
model *model_load(const char *path, char *err, size_t errlen);
/* Same over an already-open gguf (takes ownership of f, also on failure). */
model *model_from_gguf(gguf_file *f, char *err, size_t errlen);
void model_free(model *m);

/* A backend that implements the recipe features `supported` checks a model with this when
 * its engine is created: -1 and "the <backend> backend does not implement <feature> (layer
 * N of <family>)" for the first layer that needs another one, else 0. */
int model_check_features(const model *m, arch_features supported, const char *backend, char *err, size_t errlen);
/* What layer il needs: its recipe's features and those the hyper-parameters add
 * (ARCH_F_ROPE_PARTIAL, ARCH_F_ROPE_LONGROPE). */
arch_features model_layer_features(const model *m, int il);

#endif
