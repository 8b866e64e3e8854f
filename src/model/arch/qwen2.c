/* qwen2.c - Qwen2 / Qwen2.5: llama's blocks with biases on the q, k and v projections and
 * NeoX RoPE (rotate halves). */
#include "model/arch.h"

const arch_desc arch_qwen2 = {
    .name = "qwen2",
    ARCH_DENSE_LISTS,
    .rope = ARCH_ROPE_NEOX,
    .pattern = {{.norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_FULL, .attn_extras = ARCH_ATTN_QKV_BIAS,
                 .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU}},
    .pattern_len = 1,
};
