/* qwen3next.c - Qwen3-Next (80B-A3B): qwen35moe's layers, but the DeltaNet's beta and alpha
 * come from one fused projection (ssm_ba, grouped per k head: its v heads' betas, then their
 * alphas) and its v heads stay grouped per k head as trained (Qwen3.5's converter tiles
 * them).  Files of the converter's older layout (one fused ssm_in for q, k, v and z) are
 * refused by the missing attn_qkv.weight. */
#include "model/arch.h"

const arch_desc arch_qwen3next = {
    .name = "qwen3next",
    .keys = arch_dense_keys,
    .more_keys = {arch_moe_keys, arch_shexp_keys, arch_hybrid_keys},
    .globals = arch_dense_globals,
    .layer_tensors = arch_qwen3next_layer_tensors,
    .rope = ARCH_ROPE_NEOX,
    .ssm_heads = ARCH_SSM_GROUPED,
    ARCH_HYBRID_PATTERN(ARCH_FFN_MOE, ARCH_FFN_SHARED_EXPERT | ARCH_FFN_SHEXP_GATE),
};
