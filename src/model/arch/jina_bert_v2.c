/* jina_bert_v2.c - jina-embeddings-v2 (small / base en, and the other languages' bases) as
 * llama.cpp converts them (jina-bert-v2): bert's encoder (token + token-type-0 embeddings and a
 * LayerNorm, post-LN layers, bidirectional attention with q/k/v/output biases, no output norm, no
 * LM head) without any position table: ALiBi instead, each score q.k / sqrt(d) - m_h |i - j|
 * with ggml's slopes for a maximum bias of 8; and a GEGLU feed-forward whose gate and up are one
 * ffn_up of 2 n_ff rows, gate first (the model's gated_layers, no bias), down(gelu(gate x) * up x)
 * + b_down with the exact GELU (the model's nn.GELU; llama.cpp's graph takes the tanh form).
 * Pooled as its GGUF says (mean).  The code model's extra norms (attn_q_norm / attn_k_norm over
 * the whole projection, attn_norm_2) and a biased ffn_up are not run: a file with them is
 * refused by name. */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define L(field) offsetof(model_layer, field)
static const arch_tensor jina_layer_tensors[] = {
    ARCH_ATTN_PROJECTIONS,
    {"attn_output.bias", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(bo), 0, false, true},
    ARCH_POST_LN_NORM("attn_output", attn_out_norm, attn_out_norm_b),
    {"ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF2, ARCH_DIM_NONE, L(w_gate_up), 0, false, false},
    {"ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(w_down), 0, false, false},
    {"ffn_down.bias", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(b_down), 0, false, true},
    ARCH_POST_LN_NORM("layer_output", ffn_out_norm, ffn_out_norm_b),
    {0},
};

static const char *const jina_unsupported[] = {
    "attn_q_norm.weight", "attn_k_norm.weight", "attn_norm_2.weight", "ffn_gate.weight", "ffn_up.bias", NULL,
};

const arch_desc arch_jina_bert_v2 = {
    .name = "jina-bert-v2",
    .keys = arch_bert_keys,
    .globals = arch_encoder_globals,
    .layer_tensors = jina_layer_tensors,
    .unsupported = jina_unsupported,
    .rope = ARCH_ROPE_NONE,
    .pattern = {{.norm = ARCH_NORM_POST_LN, .attn = ARCH_ATTN_FULL,
                 .attn_extras = ARCH_ATTN_QKV_BIAS | ARCH_ATTN_OUT_BIAS | ARCH_ATTN_BIDIR | ARCH_ATTN_ALIBI,
                 .ffn = ARCH_FFN_GLU, .ffn_extras = ARCH_FFN_FUSED_GATE_UP, .act = ARCH_ACT_GELU_ERF}},
    .pattern_len = 1,
    .encoder = true,
};
