/* phi3.c - Phi-3, Phi-3.5, Phi-4, Phi-4-mini: llama's blocks with q, k and v in one matrix
 * (attn_qkv, rows q then k then v) and the gate and up halves of the GLU in one (ffn_up, 2*n_ff
 * rows, gate first), NeoX RoPE over the first rope.dimension_count dims of each head (Phi-4-mini:
 * 3/4), and LongRoPE: per-pair frequency divisors, short ones for contexts up to
 * rope.scaling.original_context_length and long ones beyond, with cos and sin times
 * rope.scaling.attn_factor (the loader marks such a file's layers ARCH_ATTN_ROPE_PARTIAL and
 * ARCH_ATTN_ROPE_LONGROPE, and binds wq/wk/wv and w_gate/w_up as row ranges of the fused
 * matrices).  Phi-3's sliding_window key is ignored, as llama.cpp does (the
 * converters write it for models trained without one). */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)
static const arch_key phi3_keys[] = {
    {"rope.scaling.original_context_length", ARCH_KEY_INT, HP(n_ctx_orig), false, 0, 0},
    {"rope.scaling.attn_factor", ARCH_KEY_FLOAT, HP(rope_attn_factor), false, 0, 0},
    {0},
};

#define G(field) offsetof(model, field)
static const arch_tensor phi3_globals[] = {
    {"token_embd.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(tok_embd), 0, false, false},
    {"output_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(output_norm), 0, false, true},
    {"output.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(output), 0, true, false},
    {"rope_factors_short.weight", ARCH_DIM_HALF_ROT, ARCH_DIM_NONE, ARCH_DIM_NONE, G(rope_factors_short), 0, true, true},
    {"rope_factors_long.weight", ARCH_DIM_HALF_ROT, ARCH_DIM_NONE, ARCH_DIM_NONE, G(rope_factors_long), 0, true, true},
    {0},
};

#define L(field) offsetof(model_layer, field)
static const arch_tensor phi3_layer_tensors[] = {
    {"attn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(attn_norm), 0, false, true},
    {"attn_qkv.weight", ARCH_DIM_EMBD, ARCH_DIM_QKV, ARCH_DIM_NONE, L(wqkv), 0, false, false},
    {"attn_output.weight", ARCH_DIM_Q, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(wo), 0, false, false},
    {"ffn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, L(ffn_norm), 0, false, true},
    {"ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF2, ARCH_DIM_NONE, L(w_gate_up), 0, false, false},
    {"ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, ARCH_DIM_NONE, L(w_down), 0, false, false},
    {0},
};

const arch_desc arch_phi3 = {
    .name = "phi3",
    .keys = arch_dense_keys,
    .more_keys = {phi3_keys},
    .globals = phi3_globals,
    .layer_tensors = phi3_layer_tensors,
    .rope = ARCH_ROPE_NEOX,
    .pattern = {{.norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_FULL, .attn_extras = ARCH_ATTN_FUSED_QKV,
                 .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU, .ffn_extras = ARCH_FFN_FUSED_GATE_UP}},
    .pattern_len = 1,
};
