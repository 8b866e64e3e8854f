/* llama.c - Llama 2/3.x, TinyLlama, SmolLM, Mistral: pre-norm blocks of full attention and a
 * SwiGLU feed-forward, RoPE on adjacent pairs, the LM head tied or not. */
#include "model/arch.h"

const arch_desc arch_llama = {
    .name = "llama",
    ARCH_DENSE_LISTS,
    .rope = ARCH_ROPE_NORMAL,
    .pattern = {{.norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_FULL, .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU}},
    .pattern_len = 1,
};
