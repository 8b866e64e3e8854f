/* nomic_bert.c - nomic-embed-text v1 / v1.5 as llama.cpp converts them (nomic-bert): bert's
 * encoder (token + token-type-0 embeddings and a LayerNorm, post-LN layers, bidirectional
 * attention, no output norm, no LM head) with rotary positions instead of a position table
 * (NeoX halves, rope.freq_base: 1000 in those models), one fused attn_qkv (rows q, k, v) and
 * no attention biases, and a SwiGLU feed-forward: down(silu(gate x) * up x), which is the
 * model's fc2(fc11(x) * silu(fc12(x))) with fc11 -> ffn_up, fc12 -> ffn_gate.  Pooled as its
 * GGUF says (mean).  Its Matryoshka truncation (v1.5) is the server's `dimensions`: the model
 * card's layer_norm before the cut is a centring, done by api_embed.c. */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)
static const arch_key nomic_rope_keys[] = {
    {"rope.freq_base", ARCH_KEY_FLOAT, HP(rope_base), false, 10000.0f, 0}, /* llama.cpp's default too */
    {0},
};

#define G(field) offsetof(model, field)
const arch_tensor arch_encoder_globals[] = {
    {"token_embd.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(tok_embd), 0, false, false},
    {"token_types.weight", ARCH_DIM_EMBD, ARCH_DIM_TOKEN_TYPES, ARCH_DIM_NONE, G(tok_types), 0, false, false},
    {"token_embd_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(embd_norm), 0, false, true},
    {"token_embd_norm.bias", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(embd_norm_b), 0, false, true},
    {0},
};

#define L(field) offsetof(model_layer, field)
static const arch_tensor nomic_layer_tensors[] = {
    {"attn_qkv.weight", ARCH_DIM_EMBD, ARCH_DIM_QKV, ARCH_DIM_NONE, L(wqkv), 0, false, false},
    {"attn_output.weight", ARCH_DIM_Q, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(wo), 0, false, false},
    ARCH_POST_LN_NORM("attn_output", attn_out_norm, attn_out_norm_b),
    {"ffn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, L(w_gate), 0, false, false},
    {"ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, L(w_up), 0, false, false},
    {"ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(w_down), 0, false, false},
    ARCH_POST_LN_NORM("layer_output", ffn_out_norm, ffn_out_norm_b),
    {0},
};

const arch_desc arch_nomic_bert = {
    .name = "nomic-bert",
    .keys = arch_bert_keys,
    .more_keys = {nomic_rope_keys},
    .globals = arch_encoder_globals,
    .layer_tensors = nomic_layer_tensors,
    .rope = ARCH_ROPE_NEOX,
    .pattern = {{.norm = ARCH_NORM_POST_LN, .attn = ARCH_ATTN_FULL,
                 .attn_extras = ARCH_ATTN_FUSED_QKV | ARCH_ATTN_BIDIR, .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU}},
    .pattern_len = 1,
    .encoder = true,
    .dims_centred = true,
};
