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

/* Rows [first, first + n) of a matrix as a matrix of its own (a fused tensor's parts). */
static inline model_tensor model_tensor_rows(const model_tensor *t, int64_t first, int64_t n)
{
    model_tensor r = *t;
    r.data = (const char *)t->data + (size_t)first * t->row_bytes;
    r.ne1 = n;
    return r;
}

/* Slice i (< t->ne2) of a 3-D tensor as a matrix of its own. */
static inline model_tensor model_tensor_slice(const model_tensor *t, int64_t i)
{
    model_tensor s = *t;
    s.data = (const char *)t->data + (size_t)i * (size_t)t->ne1 * t->row_bytes;
    s.ne2 = 1;
    return s;
}

/* The rows of a family's layer tensor list (arch_tensor) that every attention block of the
 * dense line and of bert has: the q/k/v/output projections and, with ARCH_F_QKV_BIAS, the
 * q/k/v biases (arch/dense.c, arch/bert.c). */
#define ARCH_ATTN_PROJECTIONS                                                                                     \
    {"attn_q.weight", ARCH_DIM_EMBD, ARCH_DIM_Q, ARCH_DIM_NONE, offsetof(model_layer, wq), 0, false, false},      \
    {"attn_k.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, ARCH_DIM_NONE, offsetof(model_layer, wk), 0, false, false},     \
    {"attn_v.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, ARCH_DIM_NONE, offsetof(model_layer, wv), 0, false, false},     \
    {"attn_output.weight", ARCH_DIM_Q, ARCH_DIM_EMBD, ARCH_DIM_NONE, offsetof(model_layer, wo), 0, false, false}, \
    {"attn_q.bias", ARCH_DIM_Q, ARCH_DIM_NONE, ARCH_DIM_NONE, offsetof(model_layer, bq), ARCH_F_QKV_BIAS, false, true}, \
    {"attn_k.bias", ARCH_DIM_KV, ARCH_DIM_NONE, ARCH_DIM_NONE, offsetof(model_layer, bk), ARCH_F_QKV_BIAS, false, true}, \
    {"attn_v.bias", ARCH_DIM_KV, ARCH_DIM_NONE, ARCH_DIM_NONE, offsetof(model_layer, bv), ARCH_F_QKV_BIAS, false, true}

/* The LayerNorm (weight and bias) after a post-LN block (ARCH_F_NORM_POST_LN), norm "attn_output"
 * or "layer_output", bound at fields w and b of model_layer: the encoders' (arch/bert.c,
 * nomic_bert.c, jina_bert_v2.c). */
#define ARCH_POST_LN_NORM(norm, w, b)                                                                             \
    {norm "_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, offsetof(model_layer, w), ARCH_F_NORM_POST_LN, \
     false, true},                                                                                                \
    {norm "_norm.bias", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, offsetof(model_layer, b), ARCH_F_NORM_POST_LN,  \
     false, true}

/* A layer: its recipe and the tensors the recipe binds (the others stay zeroed). */
typedef struct model_layer {
    arch_layer recipe;
    /* What the recipe and the hyper-parameters make of this layer: the positions it attends
     * to (0: all; a sliding layer: its last `window`) and its RoPE. */
    int window;
    float rope_base, rope_scale;
    const float *rope_freqs; /* the model's rope_freqs, or NULL where this layer does without */
    /* Its shapes (the model's, except in Gemma 4: a full layer's head_dim, kv heads and FFN
     * width may differ from a sliding one's) and the layer whose K/V it attends to: itself,
     * or, past the first n_layer - n_kv_shared layers, the last earlier one of its kind. */
    int head_dim, n_head_kv, n_ff;
    int kv_source;
    model_tensor attn_norm;      /* pre-norm: [n_embd] */
    model_tensor wq, wk, wv, wo; /* [n_embd -> n_head*head_dim], [.. -> n_head_kv*head_dim] x2, [n_head*head_dim -> n_embd] */
    model_tensor wqkv;           /* ARCH_ATTN_FUSED_QKV: [n_embd -> q, k, v rows]; wq, wk, wv are its row ranges */
    model_tensor bq, bk, bv;     /* qkv bias */
    model_tensor attn_sinks;     /* attention sinks: [n_head] logits */
    model_tensor q_norm, k_norm; /* qk norm: [head_dim] */
    model_tensor attn_post_norm; /* post-norm: [n_embd] */
    model_tensor ffn_norm;       /* pre-norm: [n_embd] */
    model_tensor w_gate, w_up;   /* [n_embd -> n_ff] */
    model_tensor w_gate_up;      /* ARCH_FFN_FUSED_GATE_UP: [n_embd -> 2 n_ff]; w_gate, w_up are its halves */
    model_tensor w_down;         /* [n_ff -> n_embd] */
    model_tensor ffn_post_norm;  /* post-norm: [n_embd] */
    model_tensor ffn_gate_inp;   /* MoE router: [n_embd -> n_expert] */
    model_tensor ffn_gate_exps, ffn_up_exps; /* MoE: n_expert x [n_embd -> n_ff_exp] */
    model_tensor ffn_down_exps;  /* MoE: n_expert x [n_ff_exp -> n_embd] */
    model_tensor ffn_gate_up_exps; /* GLU beside MoE: n_expert x [n_embd -> 2 n_ff_exp] (gate rows, up rows) */
    model_tensor router_scale;   /* [n_embd]: ffn_gate_inp.scale */
    model_tensor expert_scale;   /* [n_expert]: ffn_down_exps.scale */
    model_tensor ffn_pre_norm_2, ffn_post_norm_1, ffn_post_norm_2; /* [n_embd] each */
    model_tensor out_scale;      /* [1]: the residual stream times this after the layer, or absent */
    model_tensor ple_gate;       /* per-layer embeddings: [n_embd -> n_embd_ple], */
    model_tensor ple_proj;       /* [n_embd_ple -> n_embd], */
    model_tensor ple_post_norm;  /* [n_embd] */
    model_tensor ffn_gate_inp_shexp; /* shared expert's gate (ARCH_FFN_SHEXP_GATE): [n_embd -> 1] */
    model_tensor exp_probs_b;    /* ARCH_ROUTER_SIGMOID_BIAS: [n_expert], chooses experts only */
    model_tensor ffn_gate_shexp, ffn_up_shexp; /* shared expert: [n_embd -> n_ff_shexp] */
    model_tensor ffn_down_shexp; /* [n_ff_shexp -> n_embd] */
    /* gated DeltaNet (ARCH_ATTN_LINEAR): qkv = [n_embd -> ssm channels] (q and k of group_count
     * heads of state_size, v of time_step_rank heads), the output gate z [n_embd -> inner],
     * the conv1d [conv_kernel taps x channels], per v head the decay's A (ssm_a = -exp(A_log))
     * and dt bias, beta and alpha projections [n_embd -> v heads] (qwen3next: fused in ssm_ba
     * [n_embd -> 2 x v heads], per k head its v heads' betas then alphas), the gated norm
     * [v head width] and the output projection [inner -> n_embd]. */
    model_tensor ssm_qkv, ssm_gate, ssm_conv1d, ssm_a, ssm_dt;
    model_tensor ssm_alpha, ssm_beta, ssm_ba;
    model_tensor ssm_norm, ssm_out;
    model_tensor bo;             /* attention output bias: [n_embd] */
    model_tensor b_up, b_down;   /* MLP biases: [n_ff], [n_embd] */
    model_tensor attn_out_norm, attn_out_norm_b; /* post-LN after attention: weight, bias [n_embd] */
    model_tensor ffn_out_norm, ffn_out_norm_b;   /* post-LN after the MLP */
    /* ARCH_FFN_BIAS: the router's [n_expert] and, one row per expert, [n_ff_exp] (gate, up) and
     * [n_embd] (down) */
    model_tensor ffn_gate_inp_b, ffn_gate_exps_b, ffn_up_exps_b, ffn_down_exps_b;
    /* multi-head latent attention (ARCH_ATTN_MLA): the query through a low-rank pair
     * wq_a [n_embd -> q_lora], q_a_norm [q_lora], wq_b [q_lora -> n_head x (nope + rope)] (or
     * wq when q_lora_rank is 0); wkv_a [n_embd -> kv_lora + rope] gives the latent (normed by
     * kv_a_norm [kv_lora]) and the RoPE key; per head, wk_b [nope -> kv_lora] (a query's nope
     * part into latent space: the transpose of the key up-projection) and wv_b [kv_lora ->
     * v width] (the value up-projection), n_head slices each; wo [n_head x v width -> n_embd]. */
    model_tensor wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b;
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
    int n_ff_shexp;    /* the shared expert's hidden width (0: none): its own key (Qwen), or */
    int n_expert_shared; /* n_ff_exp x expert_shared_count, the shared experts fused in one GLU (GLM) */
    float expert_weights_scale; /* ARCH_ROUTER_SIGMOID_BIAS: the chosen weights times this (1 = none) */
    int n_dense_lead;  /* leading_dense_block_count: layers that run desc->leading (0: none) */
    /* How a MoE router's file says it scores (expert_gating_func: 0 the family's, 1 softmax,
     * 2 sigmoid), whether it renormalises the chosen weights (expert_weights_norm, default
     * yes) and its expert groups (expert_group_count; 0 or 1: none) of which a token keeps
     * the best n_group_used. */
    int expert_gating;
    bool expert_weights_norm;
    int n_expert_groups, n_group_used;
    /* Multi-head latent attention (0 without): the compressed query's and the latent's
     * widths, a head's query/key part without RoPE (mla_nope; n_rot more dims turn) and its
     * value width; attention.key_length_mla / value_length_mla as the file gives them.  With
     * MLA, head_dim is kv_lora_rank + n_rot (one cache row: the latent and the RoPE key) and
     * n_head_kv is 1 (the heads share it). */
    int q_lora_rank, kv_lora_rank, mla_nope, mla_v;
    int key_length_mla, value_length_mla, value_length;
    /* ARCH_YARN_MSCALE: rope.scaling.yarn_log_multiplier, and the scores' factor mscale^2 it
     * makes (1 = none) */
    float yarn_log_mul, attn_mscale2;
    int n_rot;         /* dimensions of a head that RoPE turns (rope.dimension_count; head_dim) */
    /* gated DeltaNet (0 without linear layers): conv taps, the width of a q/k head (= a v
     * head's), q/k heads, v heads, their total width; every full_attn_interval-th layer is
     * full attention (the family's pattern length). */
    int ssm_conv, ssm_state, ssm_groups, ssm_vheads, ssm_inner;
    int full_attn_interval;
    int n_mtp;         /* nextn_predict_layers: MTP blocks stored after the n_layer that run (model.mtp) */
    bool ssm_grouped;  /* v head h reads q/k head h / (v heads / k heads), else h mod k heads */
    float rms_eps;
    float rope_base;      /* rope.freq_base, default 10000 */
    float rope_scale;     /* linear scaling factor (1 = none) from rope.scaling.factor when type=linear */
    /* YaRN (rope.scaling.type yarn; yarn_factor 0: none): pair i's frequency blends from
     * f_i (below yarn_low) to f_i / yarn_factor (above yarn_high), linear in i between, and
     * cos/sin are times rope_attn_factor, 0.1 ln(factor) + 1 */
    float yarn_factor, yarn_low, yarn_high;
    /* cos and sin times this (1 = none): YaRN's, or LongRoPE's rope.scaling.attn_factor */
    float rope_attn_factor;
    int n_ctx_orig; /* LongRoPE: the context its short factors are for (longer: the long ones) */
    bool rope_neox;       /* rotate halves (qwen) instead of adjacent pairs (llama) */
    bool tied_output;     /* output.weight absent: LM head is token_embd */
    int n_swa;            /* attention.sliding_window: a sliding layer's window (0: none) */
    float rope_base_swa;  /* rope.freq_base_swa: a sliding layer's base (ARCH_SWA_ROPE_LOCAL) */
    float logit_softcap;  /* final_logit_softcapping: logits = c * tanh(logits / c) (0: none) */
    float embd_scale;     /* token embeddings times this (1, or sqrt(n_embd): Gemma) */
    float attn_scalar;    /* query_pre_attn_scalar: scores are q.k / sqrt(this) (default head_dim) */
    int head_dim_swa;     /* attention.key_length_swa: a sliding layer's head_dim (0: head_dim) */
    int n_kv_shared;      /* attention.shared_kv_layers: the last layers reuse earlier K/V */
    int n_embd_ple;       /* embedding_length_per_layer_input: per-layer embeddings (0: none) */
    bool encoder;         /* the family is an encoder (arch_desc.encoder): no LM head */
    int n_token_types;    /* bert: rows of token_types.weight */
    /* <arch>.pooling_type (engine_pooling's values): how the model's embeddings are pooled;
     * -1 when the file does not say (a decoder made for text) */
    int pooling;
} model_hparams;

/* A multi-token-prediction (NextN) block, Qwen3.5's (llama.cpp: graph_mtp): from the main
 * model's final (output-normed) hidden state h of position p - 1 and the token at p,
 * x = eh_proj · [rmsnorm(embed(tok)) * enorm | rmsnorm(h) * hnorm], then the decoder block
 * layers[n_layer] (a full-attention layer of the family: its own K/V), then
 * logits = head · (rmsnorm(x) * head_norm): a guess at the token after p. */
typedef struct model_mtp {
    bool bound;            /* the file has the block and the family runs it (qwen35, qwen35moe) */
    model_tensor eh_proj;  /* [2 n_embd -> n_embd] */
    model_tensor enorm, hnorm; /* [n_embd] */
    model_tensor embed;    /* nextn.embed_tokens, else the model's tok_embd */
    model_tensor head_norm; /* nextn.shared_head_norm, else output_norm */
    model_tensor head;     /* nextn.shared_head_head, else output */
} model_mtp;

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
    /* Gemma 4's per-layer embeddings (n_embd_ple > 0): a token table [n_embd_ple * n_layer x
     * n_vocab], a projection of the embeddings [n_embd -> n_embd_ple * n_layer] and its norm */
    model_tensor ple_tok_embd, ple_model_proj, ple_proj_norm;
    /* encoders (bert): absolute positions [n_embd x n_ctx_train], token types [n_embd x
     * n_token_types] and the LayerNorm of their sum (weight, bias) */
    model_tensor pos_embd, tok_types, embd_norm, embd_norm_b;
    model_layer *layers;      /* n_layer, then n_mtp entries (layers[n_layer]: the MTP block when bound) */
    model_mtp mtp;
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

/* The RoPE divisors layer ly turns by in an engine of n_ctx positions per sequence: LongRoPE's
 * long factors past its original context, else the layer's own (model_layer.rope_freqs: the
 * model's rope_freqs, LongRoPE's short factors, or NULL); llama.cpp chooses so, once per
 * context. */
const float *model_rope_freqs(const model *m, const model_layer *ly, int n_ctx);

#endif
