/* qwen3moe.c - Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): qwen3's attention (per-head
 * QK norm, NeoX RoPE, its own head dimension) and a mixture-of-experts feed-forward: a
 * router softmaxes over every expert, keeps the top expert_used_count, renormalises their
 * weights (the GGUF has no norm_topk_prob flag; the converter's checkpoints all set it) and
 * sums that many SwiGLU experts.  No shared expert. */
#include "model/arch.h"

const arch_desc arch_qwen3moe = {
    .name = "qwen3moe",
    ARCH_DENSE_LISTS,
    .more_keys = {arch_moe_keys},
    .rope = ARCH_ROPE_NEOX,
    .pattern = {{.norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_FULL, .attn_extras = ARCH_ATTN_QK_NORM,
                 .ffn = ARCH_FFN_MOE, .act = ARCH_ACT_SILU, .router = ARCH_ROUTER_SOFTMAX_TOPK}},
    .pattern_len = 1,
};
