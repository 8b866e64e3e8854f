/* hybrid.c - the key and tensor lists of the hybrid linear-attention families (Qwen3.5 dense
 * and MoE, Qwen3-Next): three gated-DeltaNet layers to one gated full-attention layer
 * (full_attention_interval), a pre-norm layout whose FFN norm the converter names
 * post_attention_norm, and, in the MoE families, a sigmoid-gated shared expert.
 * Every norm weight in these files already holds 1 + w (the converter adds the 1), except the
 * DeltaNet's gated norm, which is used as stored: both are plain RMSNorms here. */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)

const arch_key arch_shexp_keys[] = {
    {"expert_shared_feed_forward_length", ARCH_KEY_INT, HP(n_ff_shexp), true, 0, 0},
    {0},
};

const arch_key arch_hybrid_keys[] = {
    {"ssm.conv_kernel", ARCH_KEY_INT, HP(ssm_conv), true, 0, 0},
    {"ssm.state_size", ARCH_KEY_INT, HP(ssm_state), true, 0, 0},
    {"ssm.group_count", ARCH_KEY_INT, HP(ssm_groups), true, 0, 0},
    {"ssm.time_step_rank", ARCH_KEY_INT, HP(ssm_vheads), true, 0, 0},
    {"ssm.inner_size", ARCH_KEY_INT, HP(ssm_inner), true, 0, 0},
    {"full_attention_interval", ARCH_KEY_INT, HP(full_attn_interval), false, 4, 0},
    {0},
};

#define L(field) offsetof(model_layer, field)
#define FULL ARCH_F_ATTN_FULL
#define LIN ARCH_F_ATTN_LINEAR
#define NONE ARCH_DIM_NONE

/* What both layer kinds and both FFN kinds of the three families bind; each family's list
 * adds its own beta/alpha projection(s). */
#define HYBRID_LAYER_TENSORS                                                                               \
    {"attn_norm.weight", ARCH_DIM_EMBD, NONE, NONE, L(attn_norm), 0, false, true},                        \
    {"post_attention_norm.weight", ARCH_DIM_EMBD, NONE, NONE, L(ffn_norm), 0, false, true},               \
    /* gated full attention */                                                                              \
    {"attn_q.weight", ARCH_DIM_EMBD, ARCH_DIM_Q_GATE, NONE, L(wq), FULL, false, false},                     \
    {"attn_k.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, NONE, L(wk), FULL, false, false},                         \
    {"attn_v.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, NONE, L(wv), FULL, false, false},                         \
    {"attn_output.weight", ARCH_DIM_Q, ARCH_DIM_EMBD, NONE, L(wo), FULL, false, false},                     \
    {"attn_q_norm.weight", ARCH_DIM_HEAD, NONE, NONE, L(q_norm), FULL, false, true},                        \
    {"attn_k_norm.weight", ARCH_DIM_HEAD, NONE, NONE, L(k_norm), FULL, false, true},                        \
    /* gated DeltaNet */                                                                                    \
    {"attn_qkv.weight", ARCH_DIM_EMBD, ARCH_DIM_SSM_CHAN, NONE, L(ssm_qkv), LIN, false, false},             \
    {"attn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_SSM_INNER, NONE, L(ssm_gate), LIN, false, false},          \
    {"ssm_conv1d.weight", ARCH_DIM_SSM_CONV, ARCH_DIM_SSM_CHAN, NONE, L(ssm_conv1d), LIN, false, true},     \
    {"ssm_a", ARCH_DIM_SSM_VHEADS, NONE, NONE, L(ssm_a), LIN, false, true},                                 \
    {"ssm_dt.bias", ARCH_DIM_SSM_VHEADS, NONE, NONE, L(ssm_dt), LIN, false, true},                          \
    {"ssm_norm.weight", ARCH_DIM_SSM_VHEAD, NONE, NONE, L(ssm_norm), LIN, false, true},                     \
    {"ssm_out.weight", ARCH_DIM_SSM_INNER, ARCH_DIM_EMBD, NONE, L(ssm_out), LIN, false, false},             \
    /* dense FFN */                                                                                         \
    {"ffn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, NONE, L(w_gate), ARCH_F_FFN_GLU, false, false},         \
    {"ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, NONE, L(w_up), ARCH_F_FFN_GLU, false, false},             \
    {"ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, NONE, L(w_down), ARCH_F_FFN_GLU, false, false},         \
    /* MoE and the shared expert */                                                                         \
    {"ffn_gate_inp.weight", ARCH_DIM_EMBD, ARCH_DIM_EXPERT, NONE, L(ffn_gate_inp), ARCH_F_FFN_MOE, false, false}, \
    {"ffn_gate_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, L(ffn_gate_exps), ARCH_F_FFN_MOE, false, false}, \
    {"ffn_up_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP, ARCH_DIM_EXPERT, L(ffn_up_exps), ARCH_F_FFN_MOE, false, false}, \
    {"ffn_down_exps.weight", ARCH_DIM_FF_EXP, ARCH_DIM_EMBD, ARCH_DIM_EXPERT, L(ffn_down_exps), ARCH_F_FFN_MOE, false, false}, \
    {"ffn_gate_inp_shexp.weight", ARCH_DIM_EMBD, ARCH_DIM_ONE, NONE, L(ffn_gate_inp_shexp), ARCH_F_SHARED_EXPERT, false, false}, \
    {"ffn_gate_shexp.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_SHEXP, NONE, L(ffn_gate_shexp), ARCH_F_SHARED_EXPERT, false, false}, \
    {"ffn_up_shexp.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_SHEXP, NONE, L(ffn_up_shexp), ARCH_F_SHARED_EXPERT, false, false}, \
    {"ffn_down_shexp.weight", ARCH_DIM_FF_SHEXP, ARCH_DIM_EMBD, NONE, L(ffn_down_shexp), ARCH_F_SHARED_EXPERT, false, false}

/* Qwen3.5 (dense and MoE): beta and alpha from two projections. */
const arch_tensor arch_qwen35_layer_tensors[] = {
    HYBRID_LAYER_TENSORS,
    {"ssm_beta.weight", ARCH_DIM_EMBD, ARCH_DIM_SSM_VHEADS, NONE, L(ssm_beta), LIN, false, false},
    {"ssm_alpha.weight", ARCH_DIM_EMBD, ARCH_DIM_SSM_VHEADS, NONE, L(ssm_alpha), LIN, false, false},
    {0},
};

/* Qwen3-Next: one projection, grouped per k head (its v heads' betas, then their alphas). */
const arch_tensor arch_qwen3next_layer_tensors[] = {
    HYBRID_LAYER_TENSORS,
    {"ssm_ba.weight", ARCH_DIM_EMBD, ARCH_DIM_SSM_VHEADS2, NONE, L(ssm_ba), LIN, false, false},
    {0},
};
