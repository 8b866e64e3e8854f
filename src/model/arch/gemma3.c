/* gemma3.c - Gemma 3 (1B-27B, text): five sliding-window layers to one full, each with a
 * norm before and after both blocks (sandwich), per-head QK norm, NeoX RoPE with base 10k on
 * the sliding layers and the file's base (1M) with its linear scaling on the full ones, a
 * GeGLU feed-forward (tanh GELU), token embeddings times sqrt(n_embd), the LM head tied to
 * them and its logits soft-capped: c * tanh(logits / c).
 *
 * Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores 1 + w in the GGUF, so
 * the norms here are plain.  The GGUF has no query_pre_attn_scalar: it is head_dim except in
 * the 27B (62 layers), whose is n_embd / n_head (llama.cpp does the same). */
#include "model/arch.h"
#include "model/model.h"

#define GEMMA3_SLIDING                                                                             \
    {.norm = ARCH_NORM_SANDWICH, .attn = ARCH_ATTN_SLIDING, .attn_extras = ARCH_ATTN_QK_NORM,       \
     .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_GELU_TANH}

static float gemma3_attn_scalar(const model_hparams *hp)
{
    return hp->n_layer == 62 ? (float)(hp->n_embd / hp->n_head) : (float)hp->head_dim;
}

const arch_desc arch_gemma3 = {
    .name = "gemma3",
    ARCH_DENSE_LISTS,
    .more_keys = {arch_swa_keys},
    .rope = ARCH_ROPE_NEOX,
    .pattern = {GEMMA3_SLIDING, GEMMA3_SLIDING, GEMMA3_SLIDING, GEMMA3_SLIDING, GEMMA3_SLIDING,
                {.norm = ARCH_NORM_SANDWICH, .attn = ARCH_ATTN_FULL, .attn_extras = ARCH_ATTN_QK_NORM,
                 .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_GELU_TANH}},
    .pattern_len = 6,
    .swa_rope = ARCH_SWA_ROPE_LOCAL,
    .embed_scale = true,
    .attn_scalar = gemma3_attn_scalar,
};
