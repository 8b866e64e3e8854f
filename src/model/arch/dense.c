/* dense.c - the key and tensor lists every dense transformer of the llama line shares
 * (ARCH_DENSE_LISTS in arch.h).  Its own file because it binds into model.h's structs, which
 * include arch.h: the registry (arch.c) stays below the model. */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)

/* In the order they were always checked, so the first missing key named stays the same. */
const arch_key arch_dense_keys[] = {
    {"context_length", ARCH_KEY_INT, HP(n_ctx_train), true, 0, 0},
    {"embedding_length", ARCH_KEY_INT, HP(n_embd), true, 0, 0},
    {"block_count", ARCH_KEY_INT, HP(n_layer), true, 0, 0},
    {"feed_forward_length", ARCH_KEY_INT, HP(n_ff), false, 0, 0}, /* required by GLU layers (model.c) */
    {"attention.head_count", ARCH_KEY_INT, HP(n_head), true, 0, 0},
    {"attention.head_count_kv", ARCH_KEY_INT, HP(n_head_kv), false, 0, 0},
    {"attention.key_length", ARCH_KEY_INT, HP(head_dim), false, 0, 0},
    {"attention.layer_norm_rms_epsilon", ARCH_KEY_FLOAT, HP(rms_eps), true, 0, 0},
    {"rope.freq_base", ARCH_KEY_FLOAT, HP(rope_base), false, 10000.0f, 0},
    /* below head_dim: RoPE turns that many dims of each head (ARCH_ATTN_ROPE_PARTIAL) */
    {"rope.dimension_count", ARCH_KEY_INT, HP(n_rot), false, 0, 0},
    {0},
};

/* A MoE family's: how many experts, how many run per token, and one expert's hidden width. */
const arch_key arch_moe_keys[] = {
    {"expert_count", ARCH_KEY_INT, HP(n_expert), true, 0, 0},
    {"expert_used_count", ARCH_KEY_INT, HP(n_expert_used), true, 0, 0},
    {"expert_feed_forward_length", ARCH_KEY_INT, HP(n_ff_exp), true, 0, 0},
    {0},
};

/* A family with sliding-window layers: the window (a sliding layer without one is not a
 * model), the local RoPE base (absent: the global one) and the final logit soft-cap (absent:
 * none). */
const arch_key arch_swa_keys[] = {
    {"attention.sliding_window", ARCH_KEY_INT, HP(n_swa), true, 0, 0},
    {"rope.freq_base_swa", ARCH_KEY_FLOAT, HP(rope_base_swa), false, 0, 0},
    {"final_logit_softcapping", ARCH_KEY_FLOAT, HP(logit_softcap), false, 0, 0},
    {0},
};

#define G(field) offsetof(model, field)
const arch_tensor arch_dense_globals[] = {
    {"token_embd.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(tok_embd), 0, false, false},
    {"output_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(output_norm), 0, false, true},
    {"output.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(output), 0, true, false}, /* absent: tied */
    {"rope_freqs.weight", ARCH_DIM_HALF_HEAD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(rope_freqs), 0, true, true},
    {0},
};

#define L(field) offsetof(model_layer, field)
const arch_tensor arch_dense_layer_tensors[] = {
    {"attn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(attn_norm), ARCH_F_NORM_PRE | ARCH_F_NORM_SANDWICH, false, true},
    ARCH_ATTN_PROJECTIONS,
    {"attn_q_norm.weight", ARCH_DIM_HEAD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(q_norm), ARCH_F_QK_NORM, false, true},
    {"attn_k_norm.weight", ARCH_DIM_HEAD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(k_norm), ARCH_F_QK_NORM, false, true},
    {"post_attention_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(attn_post_norm), ARCH_F_NORM_POST | ARCH_F_NORM_SANDWICH, false, true},
    {"ffn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(ffn_norm), ARCH_F_NORM_PRE | ARCH_F_NORM_SANDWICH, false, true},
    {"ffn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, L(w_gate), ARCH_F_FFN_GLU, false, false},
    {"ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, L(w_up), ARCH_F_FFN_GLU, false, false},
    {"ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(w_down), ARCH_F_FFN_GLU, false, false},
    /* MoE: the router [n_embd -> n_expert] and the experts' GLUs, one matrix per slice */
    {"ffn_gate_inp.weight", ARCH_DIM_EMBD, ARCH_DIM_EXPERT, ARCH_DIM_NONE, L(ffn_gate_inp), ARCH_F_FFN_MOE, false, false},
    {"ffn_gate_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, L(ffn_gate_exps), ARCH_F_FFN_MOE, false, false},
    {"ffn_up_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, L(ffn_up_exps), ARCH_F_FFN_MOE, false, false},
    {"ffn_down_exps.weight", ARCH_DIM_FF_EXP, ARCH_DIM_EMBD, ARCH_DIM_EXPERT, L(ffn_down_exps), ARCH_F_FFN_MOE, false, false},
    {"post_ffw_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(ffn_post_norm), ARCH_F_NORM_POST | ARCH_F_NORM_SANDWICH, false, true},
    {0},
};
