/* deepseek2.c - DeepSeek V2 / V2-Lite / V3 / R1, Kimi K2 (GGUF "deepseek2"): multi-head latent
 * attention and a routed MoE after leading_dense_block_count dense layers.
 *
 * Attention (ARCH_ATTN_MLA): q = wq_b(rmsnorm(wq_a x)) (q LoRA; wq x when q_lora_rank is 0),
 * per head [nope | rope]; [c | k_rope] = wkv_a x, the latent c RMS-normed; per head the key is
 * [wk_b^T c | rope(k_rope)] and the value wv_b c; RoPE (adjacent pairs: the checkpoints'
 * interleaved layout) turns only the rope parts, with YaRN whose mscale scales the scores
 * (ARCH_YARN_MSCALE).  llama.cpp's converter writes the K/V up-projection split per head
 * (attn_k_b, attn_v_b) and declares the attention as one shared head: key_length = kv_lora +
 * rope, value_length = kv_lora, head_count_kv 1, the per-head sizes in key_length_mla /
 * value_length_mla (model.c: check_mla).  A file of the older converter (one fused attn_kv_b)
 * is refused by name.
 *
 * Feed-forward: dense SwiGLU in the first leading layers, then experts routed by softmax (V2)
 * or sigmoid scores with a selection bias (V3: expert_gating_func 2), within the best
 * expert groups (expert_group_count / expert_group_used_count: ARCH_FFN_EXPERT_GROUPS),
 * renormalised when expert_weights_norm (absent: not, as V2), times expert_weights_scale; plus
 * the shared experts (expert_shared_count of them fused in one GLU), ungated.  The norm before
 * the feed-forward is ffn_norm.  An MTP block at the end (nextn_predict_layers) is not run (model.c). */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)
static const arch_key deepseek2_keys[] = {
    {"expert_shared_count", ARCH_KEY_INT, HP(n_expert_shared), true, 0, 0},
    {"expert_weights_scale", ARCH_KEY_FLOAT, HP(expert_weights_scale), false, 0, 0},
    {"leading_dense_block_count", ARCH_KEY_COUNT, HP(n_dense_lead), false, 0, 0},
    {"expert_gating_func", ARCH_KEY_COUNT, HP(expert_gating), false, 0, 0},
    {"expert_group_count", ARCH_KEY_COUNT, HP(n_expert_groups), false, 0, 0},
    {"expert_group_used_count", ARCH_KEY_COUNT, HP(n_group_used), false, 0, 0},
    {"attention.q_lora_rank", ARCH_KEY_COUNT, HP(q_lora_rank), false, 0, 0},
    {"attention.kv_lora_rank", ARCH_KEY_INT, HP(kv_lora_rank), true, 0, 0},
    {"attention.key_length_mla", ARCH_KEY_INT, HP(key_length_mla), false, 0, 0},
    {"attention.value_length_mla", ARCH_KEY_INT, HP(value_length_mla), false, 0, 0},
    {"attention.value_length", ARCH_KEY_INT, HP(value_length), false, 0, 0},
    {0},
};

#define L(field) offsetof(model_layer, field)
#define W(name, ne0, ne1, ne2, field, when, optional) {name, ne0, ne1, ne2, L(field), when, optional, false}
#define F(name, ne0, field, when) {name, ne0, ARCH_DIM_NONE, ARCH_DIM_NONE, L(field), when, false, true}
#define MLA ARCH_F_ATTN_MLA
#define DENSE ARCH_F_FFN_GLU
#define MOE ARCH_F_FFN_MOE
static const arch_tensor deepseek2_layer_tensors[] = {
    F("attn_norm.weight", ARCH_DIM_EMBD, attn_norm, 0),
    /* the query: the q LoRA pair, or one matrix (which of them: model.c, by q_lora_rank) */
    W("attn_q_a.weight", ARCH_DIM_EMBD, ARCH_DIM_Q_LORA, ARCH_DIM_NONE, wq_a, MLA, true),
    {"attn_q_a_norm.weight", ARCH_DIM_Q_LORA, ARCH_DIM_NONE, ARCH_DIM_NONE, L(q_a_norm), MLA, true, true},
    W("attn_q_b.weight", ARCH_DIM_Q_LORA, ARCH_DIM_MLA_Q, ARCH_DIM_NONE, wq_b, MLA, true),
    W("attn_q.weight", ARCH_DIM_EMBD, ARCH_DIM_MLA_Q, ARCH_DIM_NONE, wq, MLA, true),
    W("attn_kv_a_mqa.weight", ARCH_DIM_EMBD, ARCH_DIM_KV_A, ARCH_DIM_NONE, wkv_a, MLA, false),
    F("attn_kv_a_norm.weight", ARCH_DIM_KV_LORA, kv_a_norm, MLA),
    /* optional here so that a file with the fused attn_kv_b gets its own error (model.c) */
    W("attn_k_b.weight", ARCH_DIM_MLA_NOPE, ARCH_DIM_KV_LORA, ARCH_DIM_HEADS, wk_b, MLA, true),
    W("attn_v_b.weight", ARCH_DIM_KV_LORA, ARCH_DIM_MLA_V, ARCH_DIM_HEADS, wv_b, MLA, true),
    W("attn_output.weight", ARCH_DIM_MLA_O, ARCH_DIM_EMBD, ARCH_DIM_NONE, wo, MLA, false),
    F("ffn_norm.weight", ARCH_DIM_EMBD, ffn_norm, 0),
    W("ffn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, w_gate, DENSE, false),
    W("ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, w_up, DENSE, false),
    W("ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, ARCH_DIM_NONE, w_down, DENSE, false),
    W("ffn_gate_inp.weight", ARCH_DIM_EMBD, ARCH_DIM_EXPERT, ARCH_DIM_NONE, ffn_gate_inp, MOE, false),
    F("exp_probs_b.bias", ARCH_DIM_EXPERT, exp_probs_b, ARCH_F_ROUTER_SIGMOID_BIAS),
    W("ffn_gate_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, ffn_gate_exps, MOE, false),
    W("ffn_up_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, ffn_up_exps, MOE, false),
    W("ffn_down_exps.weight", ARCH_DIM_FF_EXP, ARCH_DIM_EMBD, ARCH_DIM_EXPERT, ffn_down_exps, MOE, false),
    W("ffn_gate_shexp.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_SHEXP, ARCH_DIM_NONE, ffn_gate_shexp, MOE, false),
    W("ffn_up_shexp.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_SHEXP, ARCH_DIM_NONE, ffn_up_shexp, MOE, false),
    W("ffn_down_shexp.weight", ARCH_DIM_FF_SHEXP, ARCH_DIM_EMBD, ARCH_DIM_NONE, ffn_down_shexp, MOE, false),
    {0},
};

/* The router is the file's (expert_gating_func; absent: softmax, as llama.cpp takes it), the
 * expert groups too (model.c: layer_recipe). */
#define MLA_ATTN .norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_MLA
const arch_desc arch_deepseek2 = {
    .name = "deepseek2",
    .keys = arch_dense_keys,
    .globals = arch_dense_globals,
    .more_keys = {arch_moe_keys, deepseek2_keys},
    .layer_tensors = deepseek2_layer_tensors,
    .rope = ARCH_ROPE_NORMAL,
    .pattern = {{MLA_ATTN, .ffn = ARCH_FFN_MOE, .act = ARCH_ACT_SILU, .router = ARCH_ROUTER_SOFTMAX_TOPK,
                 .ffn_extras = ARCH_FFN_SHARED_EXPERT}},
    .pattern_len = 1,
    .yarn = ARCH_YARN_MSCALE,
    .leading = {MLA_ATTN, .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU},
    .expert_weights_raw = true,
};
