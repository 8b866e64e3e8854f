/* bert.c - BERT encoders as llama.cpp converts them (bge, all-MiniLM, e5): token + absolute
 * position + token-type embeddings and a LayerNorm, then post-LN layers (x = LN(x + attn(x));
 * x = LN(x + mlp(x)), both LayerNorms with bias), bidirectional attention with q/k/v/output
 * biases, an erf-GELU MLP with biases, no output norm and no LM head: it answers embeddings,
 * pooled as its GGUF's pooling_type says. */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)
const arch_key arch_bert_keys[] = {
    {"context_length", ARCH_KEY_INT, HP(n_ctx_train), true, 0, 0},
    {"embedding_length", ARCH_KEY_INT, HP(n_embd), true, 0, 0},
    {"block_count", ARCH_KEY_INT, HP(n_layer), true, 0, 0},
    {"feed_forward_length", ARCH_KEY_INT, HP(n_ff), true, 0, 0},
    {"attention.head_count", ARCH_KEY_INT, HP(n_head), true, 0, 0},
    /* a LayerNorm's epsilon, kept where the RMSNorm families keep theirs */
    {"attention.layer_norm_epsilon", ARCH_KEY_FLOAT, HP(rms_eps), true, 0, 0},
    {0},
};

#define G(field) offsetof(model, field)
static const arch_tensor bert_globals[] = {
    {"token_embd.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(tok_embd), 0, false, false},
    {"position_embd.weight", ARCH_DIM_EMBD, ARCH_DIM_CTX, ARCH_DIM_NONE, G(pos_embd), 0, false, false},
    {"token_types.weight", ARCH_DIM_EMBD, ARCH_DIM_TOKEN_TYPES, ARCH_DIM_NONE, G(tok_types), 0, false, false},
    {"token_embd_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(embd_norm), 0, false, true},
    {"token_embd_norm.bias", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(embd_norm_b), 0, false, true},
    {0},
};

#define L(field) offsetof(model_layer, field)
static const arch_tensor bert_layer_tensors[] = {
    ARCH_ATTN_PROJECTIONS,
    {"attn_output.bias", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(bo), ARCH_F_ATTN_OUT_BIAS, false, true},
    ARCH_POST_LN_NORM("attn_output", attn_out_norm, attn_out_norm_b),
    {"ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, L(w_up), ARCH_F_FFN_MLP, false, false},
    {"ffn_up.bias", ARCH_DIM_FF, ARCH_DIM_NONE, ARCH_DIM_NONE, L(b_up), ARCH_F_FFN_MLP, false, true},
    {"ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(w_down), ARCH_F_FFN_MLP, false, false},
    {"ffn_down.bias", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(b_down), ARCH_F_FFN_MLP, false, true},
    ARCH_POST_LN_NORM("layer_output", ffn_out_norm, ffn_out_norm_b),
    {0},
};

const arch_desc arch_bert = {
    .name = "bert",
    .keys = arch_bert_keys,
    .globals = bert_globals,
    .layer_tensors = bert_layer_tensors,
    .rope = ARCH_ROPE_NONE,
    .pattern = {{.norm = ARCH_NORM_POST_LN, .attn = ARCH_ATTN_FULL,
                 .attn_extras = ARCH_ATTN_QKV_BIAS | ARCH_ATTN_OUT_BIAS | ARCH_ATTN_BIDIR, .ffn = ARCH_FFN_MLP,
                 .act = ARCH_ACT_GELU_ERF}},
    .pattern_len = 1,
    .encoder = true,
};
