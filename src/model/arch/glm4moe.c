/* glm4moe.c - GLM-4.5, GLM-4.5-Air, GLM-4.6: attention with q/k/v biases, per-head QK norm
 * (required: a file without it is refused by name) and NeoX RoPE over the first
 * rope.dimension_count (half) of each head (the loader marks the layers partial);
 * the first leading_dense_block_count layers run a dense SwiGLU, the others a MoE whose router
 * takes sigmoid scores, chooses the top expert_used_count of score + exp_probs_b (the bias
 * only chooses), renormalises the chosen scores and multiplies them by expert_weights_scale,
 * plus the shared experts' GLU (expert_shared_count of them, one GLU n_ff_exp times that wide)
 * added ungated.  The norm before the feed-forward is stored as post_attention_norm.  NextN
 * layers at the end (nextn_predict_layers) are not run (model.c, as for every family). */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)
static const arch_key glm4moe_keys[] = {
    {"expert_shared_count", ARCH_KEY_INT, HP(n_expert_shared), true, 0, 0},
    {"expert_weights_scale", ARCH_KEY_FLOAT, HP(expert_weights_scale), false, 0, 0},
    {"leading_dense_block_count", ARCH_KEY_COUNT, HP(n_dense_lead), false, 0, 0},
    {0},
};

#define DENSE_FFN ARCH_F_FFN_GLU
#define MOE_FFN ARCH_F_FFN_MOE
#define L(field) offsetof(model_layer, field)
static const arch_tensor glm4moe_layer_tensors[] = {
    {"attn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(attn_norm), 0, false, true},
    ARCH_ATTN_PROJECTIONS, /* its recipe's qkv bias binds the biases */
    {"attn_q_norm.weight", ARCH_DIM_HEAD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(q_norm), 0, false, true},
    {"attn_k_norm.weight", ARCH_DIM_HEAD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(k_norm), 0, false, true},
    {"post_attention_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(ffn_norm), 0, false, true},
    {"ffn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, L(w_gate), DENSE_FFN, false, false},
    {"ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, L(w_up), DENSE_FFN, false, false},
    {"ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(w_down), DENSE_FFN, false, false},
    {"ffn_gate_inp.weight", ARCH_DIM_EMBD, ARCH_DIM_EXPERT, ARCH_DIM_NONE, L(ffn_gate_inp), MOE_FFN, false, false},
    {"exp_probs_b.bias", ARCH_DIM_EXPERT, ARCH_DIM_NONE, ARCH_DIM_NONE, L(exp_probs_b), MOE_FFN, false, true},
    {"ffn_gate_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, L(ffn_gate_exps), MOE_FFN, false, false},
    {"ffn_up_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, L(ffn_up_exps), MOE_FFN, false, false},
    {"ffn_down_exps.weight", ARCH_DIM_FF_EXP, ARCH_DIM_EMBD, ARCH_DIM_EXPERT, L(ffn_down_exps), MOE_FFN, false, false},
    {"ffn_gate_shexp.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_SHEXP, ARCH_DIM_NONE, L(ffn_gate_shexp), MOE_FFN, false, false},
    {"ffn_up_shexp.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_SHEXP, ARCH_DIM_NONE, L(ffn_up_shexp), MOE_FFN, false, false},
    {"ffn_down_shexp.weight", ARCH_DIM_FF_SHEXP, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(ffn_down_shexp), MOE_FFN, false, false},
    {0},
};

#define GLM_ATTN .norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_FULL, .attn_extras = ARCH_ATTN_QKV_BIAS | ARCH_ATTN_QK_NORM
const arch_desc arch_glm4moe = {
    .name = "glm4moe",
    .keys = arch_dense_keys,
    .globals = arch_dense_globals,
    .more_keys = {arch_moe_keys, glm4moe_keys},
    .layer_tensors = glm4moe_layer_tensors,
    .rope = ARCH_ROPE_NEOX,
    .pattern = {{GLM_ATTN, .ffn = ARCH_FFN_MOE, .act = ARCH_ACT_SILU, .router = ARCH_ROUTER_SIGMOID_BIAS,
                 .ffn_extras = ARCH_FFN_SHARED_EXPERT}},
    .pattern_len = 1,
    .leading = {GLM_ATTN, .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU},
};
