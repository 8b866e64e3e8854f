/* gptoss.c - gpt-oss (20b, 120b): pre-norm blocks alternating sliding-window (even layers)
 * and full (odd) attention, with biases on q, k, v and the output projection, a learned
 * "sink" logit per head in every softmax, NeoX RoPE with YaRN scaling whose correction range
 * is not rounded (the checkpoints' truncate=false), and a mixture of experts with biases
 * everywhere: the router adds one to its logits, keeps the top expert_used_count and
 * softmaxes over those; each expert is a clamped SwiGLU (ARCH_ACT_SWIGLU_CLAMP).
 *
 * Its own tensor list: llama.cpp's converter names the feed-forward's pre-norm
 * post_attention_norm (it is HF's), and the biases and sinks are gpt-oss's alone. */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)
#define L(field) offsetof(model_layer, field)

/* Beyond the dense keys: the experts and the sliding window. */
static const arch_key gptoss_keys[] = {
    {"expert_count", ARCH_KEY_INT, HP(n_expert), true, 0, 0},
    {"expert_used_count", ARCH_KEY_INT, HP(n_expert_used), true, 0, 0},
    {"expert_feed_forward_length", ARCH_KEY_INT, HP(n_ff_exp), true, 0, 0},
    {"attention.sliding_window", ARCH_KEY_INT, HP(n_swa), true, 0, 0},
    {0},
};

#define W(name, ne0, ne1, ne2, field) {name, ne0, ne1, ne2, L(field), 0, false, false}
#define F(name, ne0, ne1, field) {name, ne0, ne1, ARCH_DIM_NONE, L(field), 0, false, true}
static const arch_tensor gptoss_layer_tensors[] = {
    F("attn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, attn_norm),
    W("attn_q.weight", ARCH_DIM_EMBD, ARCH_DIM_Q, ARCH_DIM_NONE, wq),
    W("attn_k.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, ARCH_DIM_NONE, wk),
    W("attn_v.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, ARCH_DIM_NONE, wv),
    W("attn_output.weight", ARCH_DIM_Q, ARCH_DIM_EMBD, ARCH_DIM_NONE, wo),
    F("attn_q.bias", ARCH_DIM_Q, ARCH_DIM_NONE, bq),
    F("attn_k.bias", ARCH_DIM_KV, ARCH_DIM_NONE, bk),
    F("attn_v.bias", ARCH_DIM_KV, ARCH_DIM_NONE, bv),
    F("attn_output.bias", ARCH_DIM_EMBD, ARCH_DIM_NONE, bo),
    F("attn_sinks.weight", ARCH_DIM_HEADS, ARCH_DIM_NONE, attn_sinks),
    F("post_attention_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ffn_norm),
    W("ffn_gate_inp.weight", ARCH_DIM_EMBD, ARCH_DIM_EXPERT, ARCH_DIM_NONE, ffn_gate_inp),
    F("ffn_gate_inp.bias", ARCH_DIM_EXPERT, ARCH_DIM_NONE, ffn_gate_inp_b),
    W("ffn_gate_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, ffn_gate_exps),
    W("ffn_up_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, ffn_up_exps),
    W("ffn_down_exps.weight", ARCH_DIM_FF_EXP, ARCH_DIM_EMBD, ARCH_DIM_EXPERT, ffn_down_exps),
    F("ffn_gate_exps.bias", ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, ffn_gate_exps_b),
    F("ffn_up_exps.bias", ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, ffn_up_exps_b),
    F("ffn_down_exps.bias", ARCH_DIM_EMBD, ARCH_DIM_EXPERT, ffn_down_exps_b),
    {0},
};

#define GPTOSS_LAYER(kind)                                                                         \
    {.norm = ARCH_NORM_PRE, .attn = kind,                                                          \
     .attn_extras = ARCH_ATTN_QKV_BIAS | ARCH_ATTN_OUT_BIAS | ARCH_ATTN_SINKS, .ffn = ARCH_FFN_MOE,   \
     .ffn_extras = ARCH_FFN_BIAS, .act = ARCH_ACT_SWIGLU_CLAMP, .router = ARCH_ROUTER_TOPK_SOFTMAX}

const arch_desc arch_gptoss = {
    .name = "gpt-oss",
    .keys = arch_dense_keys,
    .more_keys = {gptoss_keys},
    .globals = arch_dense_globals,
    .layer_tensors = gptoss_layer_tensors,
    .rope = ARCH_ROPE_NEOX,
    .pattern = {GPTOSS_LAYER(ARCH_ATTN_SLIDING), GPTOSS_LAYER(ARCH_ATTN_FULL)},
    .pattern_len = 2,
    .swa_rope = ARCH_SWA_ROPE_SAME,
    .yarn = ARCH_YARN_UNROUNDED,
};
