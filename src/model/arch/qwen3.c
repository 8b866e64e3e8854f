/* qwen3.c - Qwen3 (dense): llama's blocks with every head of q and k RMS-normed before RoPE,
 * no biases, NeoX RoPE, and a head dimension of its own (attention.key_length). */
#include "model/arch.h"

const arch_desc arch_qwen3 = {
    .name = "qwen3",
    ARCH_DENSE_LISTS,
    .rope = ARCH_ROPE_NEOX,
    .pattern = {{.norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_FULL, .attn_extras = ARCH_ATTN_QK_NORM,
                 .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU}},
    .pattern_len = 1,
};
