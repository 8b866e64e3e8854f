/* gemma4.c - Gemma 4 (text; E2B/E4B, 31B): gemma3's line (sandwich norms, QK norm, GeGLU,
 * sqrt(n_embd) embeddings, soft-capped logits) with
 *   - the sliding / full pattern read from attention.sliding_window_pattern (one bool a layer);
 *   - a full layer's own head_dim (key_length vs key_length_swa) and, per layer, kv heads and
 *     FFN width (head_count_kv, feed_forward_length may be arrays);
 *   - RoPE: sliding layers base rope.freq_base_swa on their whole head; full layers the file's
 *     base with rope_freqs, whose 1e30 entries leave all but the first pairs unrotated
 *     ("proportional" partial RoPE);
 *   - v normed per head without a weight, attention scale 1 (no query_pre_attn_scalar);
 *   - the last attention.shared_kv_layers layers compute no K/V: they read the last earlier
 *     layer of their kind's;
 *   - per-layer embeddings (the E models): a token table and a projection of the embeddings,
 *     gated into the residual after each layer;
 *   - layer_output_scale: the residual stream times a scalar after each layer.
 * Norm weights are used as stored (the converter adds nothing).  With expert_count set (the
 * 26B-A4B) every layer runs experts beside its dense MLP (ARCH_FFN_GLU_MOE, moe_pattern) and a
 * layer without attn_v takes V from the K projection (attention_k_eq_v). */
#include <stddef.h>

#include "model/arch.h"
#include "model/model.h"

#define HP(field) offsetof(model_hparams, field)
#define LY(field) offsetof(model_layer, field)
static const arch_key gemma4_keys[] = {
    {"context_length", ARCH_KEY_INT, HP(n_ctx_train), true, 0, 0},
    {"embedding_length", ARCH_KEY_INT, HP(n_embd), true, 0, 0},
    {"block_count", ARCH_KEY_INT, HP(n_layer), true, 0, 0},
    {"feed_forward_length", ARCH_KEY_INT, HP(n_ff), true, 0, LY(n_ff)},
    {"attention.head_count", ARCH_KEY_INT, HP(n_head), true, 0, 0},
    {"attention.head_count_kv", ARCH_KEY_INT, HP(n_head_kv), false, 0, LY(n_head_kv)},
    {"attention.key_length", ARCH_KEY_INT, HP(head_dim), true, 0, 0},
    {"attention.key_length_swa", ARCH_KEY_INT, HP(head_dim_swa), false, 0, 0},
    {"attention.layer_norm_rms_epsilon", ARCH_KEY_FLOAT, HP(rms_eps), true, 0, 0},
    {"rope.freq_base", ARCH_KEY_FLOAT, HP(rope_base), false, 10000.0f, 0},
    {"attention.sliding_window", ARCH_KEY_INT, HP(n_swa), true, 0, 0},
    {"rope.freq_base_swa", ARCH_KEY_FLOAT, HP(rope_base_swa), false, 0, 0},
    {"final_logit_softcapping", ARCH_KEY_FLOAT, HP(logit_softcap), false, 0, 0},
    {"attention.shared_kv_layers", ARCH_KEY_COUNT, HP(n_kv_shared), false, 0, 0},
    {"embedding_length_per_layer_input", ARCH_KEY_COUNT, HP(n_embd_ple), false, 0, 0},
    /* the 26B-A4B: experts beside the dense MLP when expert_count is set */
    {"expert_count", ARCH_KEY_COUNT, HP(n_expert), false, 0, 0},
    {"expert_used_count", ARCH_KEY_COUNT, HP(n_expert_used), false, 0, 0},
    {"expert_feed_forward_length", ARCH_KEY_COUNT, HP(n_ff_exp), false, 0, 0},
    {0},
};

#define G(field) offsetof(model, field)
static const arch_tensor gemma4_globals[] = {
    {"token_embd.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(tok_embd), 0, false, false},
    {"output_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(output_norm), 0, false, true},
    {"output.weight", ARCH_DIM_EMBD, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(output), 0, true, false},
    {"rope_freqs.weight", ARCH_DIM_HALF_HEAD, ARCH_DIM_NONE, ARCH_DIM_NONE, G(rope_freqs), 0, true, true},
    /* the per-layer embeddings: optional here, required by the loader when n_embd_ple > 0 */
    {"per_layer_token_embd.weight", ARCH_DIM_PLE_ALL, ARCH_DIM_VOCAB, ARCH_DIM_NONE, G(ple_tok_embd), 0, true, false},
    {"per_layer_model_proj.weight", ARCH_DIM_EMBD, ARCH_DIM_PLE_ALL, ARCH_DIM_NONE, G(ple_model_proj), 0, true, false},
    {"per_layer_proj_norm.weight", ARCH_DIM_PLE, ARCH_DIM_NONE, ARCH_DIM_NONE, G(ple_proj_norm), 0, true, true},
    {0},
};

/* attn_k, attn_v and attn_k_norm are absent from the KV-shared layers: optional here, the
 * loader requires them of every layer that computes its own K/V (attn_v not: a layer without
 * it takes V from the K projection, the 26B-A4B's full layers). */
static const arch_tensor gemma4_layer_tensors[] = {
    {"attn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(attn_norm), 0, false, true},
    {"attn_q.weight", ARCH_DIM_EMBD, ARCH_DIM_Q, ARCH_DIM_NONE, LY(wq), 0, false, false},
    {"attn_k.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, ARCH_DIM_NONE, LY(wk), 0, true, false},
    {"attn_v.weight", ARCH_DIM_EMBD, ARCH_DIM_KV, ARCH_DIM_NONE, LY(wv), 0, true, false},
    {"attn_output.weight", ARCH_DIM_Q, ARCH_DIM_EMBD, ARCH_DIM_NONE, LY(wo), 0, false, false},
    {"attn_q_norm.weight", ARCH_DIM_HEAD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(q_norm), 0, false, true},
    {"attn_k_norm.weight", ARCH_DIM_HEAD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(k_norm), 0, true, true},
    {"post_attention_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(attn_post_norm), 0, false, true},
    {"ffn_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(ffn_norm), 0, false, true},
    {"ffn_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, LY(w_gate), 0, false, false},
    {"ffn_up.weight", ARCH_DIM_EMBD, ARCH_DIM_FF, ARCH_DIM_NONE, LY(w_up), 0, false, false},
    {"ffn_down.weight", ARCH_DIM_FF, ARCH_DIM_EMBD, ARCH_DIM_NONE, LY(w_down), 0, false, false},
    {"post_ffw_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(ffn_post_norm), 0, false, true},
    {"layer_output_scale.weight", ARCH_DIM_ONE, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(out_scale), 0, true, true},
    {"inp_gate.weight", ARCH_DIM_EMBD, ARCH_DIM_PLE, ARCH_DIM_NONE, LY(ple_gate), 0, true, false},
    {"proj.weight", ARCH_DIM_PLE, ARCH_DIM_EMBD, ARCH_DIM_NONE, LY(ple_proj), 0, true, false},
    {"post_norm.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(ple_post_norm), 0, true, true},
    /* the experts beside the dense MLP (ARCH_FFN_GLU_MOE) */
    {"ffn_gate_inp.weight", ARCH_DIM_EMBD, ARCH_DIM_EXPERT, ARCH_DIM_NONE, LY(ffn_gate_inp), ARCH_F_FFN_GLU_MOE, false, false},
    {"ffn_gate_inp.scale", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(router_scale), ARCH_F_FFN_GLU_MOE, false, true},
    {"ffn_gate_up_exps.weight", ARCH_DIM_EMBD, ARCH_DIM_FF_EXP2, ARCH_DIM_EXPERT, LY(ffn_gate_up_exps), ARCH_F_FFN_GLU_MOE, false, false},
    {"ffn_down_exps.weight", ARCH_DIM_FF_EXP, ARCH_DIM_EMBD, ARCH_DIM_EXPERT, LY(ffn_down_exps), ARCH_F_FFN_GLU_MOE, false, false},
    {"ffn_down_exps.scale", ARCH_DIM_EXPERT, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(expert_scale), ARCH_F_FFN_GLU_MOE, false, true},
    {"pre_ffw_norm_2.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(ffn_pre_norm_2), ARCH_F_FFN_GLU_MOE, false, true},
    {"post_ffw_norm_1.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(ffn_post_norm_1), ARCH_F_FFN_GLU_MOE, false, true},
    {"post_ffw_norm_2.weight", ARCH_DIM_EMBD, ARCH_DIM_NONE, ARCH_DIM_NONE, LY(ffn_post_norm_2), ARCH_F_FFN_GLU_MOE, false, true},
    {0},
};

static float gemma4_attn_scalar(const model_hparams *hp)
{
    (void)hp;
    return 1.0f; /* scores are q.k as they are: the q and k norms set their scale */
}

#define GEMMA4_LAYER(kind, ffn_kind)                                                               \
    {.norm = ARCH_NORM_SANDWICH, .attn = kind, .attn_extras = ARCH_ATTN_QK_NORM | ARCH_ATTN_V_NORM, \
     .ffn = ffn_kind, .act = ARCH_ACT_GELU_TANH, .router = ARCH_ROUTER_SCALED}

static const arch_layer gemma4_moe_pattern[] = {GEMMA4_LAYER(ARCH_ATTN_SLIDING, ARCH_FFN_GLU_MOE),
                                                GEMMA4_LAYER(ARCH_ATTN_FULL, ARCH_FFN_GLU_MOE)};

const arch_desc arch_gemma4 = {
    .name = "gemma4",
    .keys = gemma4_keys,
    .globals = gemma4_globals,
    .layer_tensors = gemma4_layer_tensors,
    .rope = ARCH_ROPE_NEOX,
    .pattern = {GEMMA4_LAYER(ARCH_ATTN_SLIDING, ARCH_FFN_GLU), GEMMA4_LAYER(ARCH_ATTN_FULL, ARCH_FFN_GLU)},
    .pattern_len = 2,
    .swa_rope = ARCH_SWA_ROPE_LOCAL,
    .embed_scale = true,
    .attn_scalar = gemma4_attn_scalar,
    .pattern_key = "attention.sliding_window_pattern",
    .moe_pattern = gemma4_moe_pattern,
    .v_from_k = true,
};
