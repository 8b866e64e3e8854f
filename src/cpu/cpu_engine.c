/* cpu_engine.c - the CPU reference backend of engine.h.
 *
 * A step flattens its sequences into one batch of tokens, each with its own sequence and
 * position, and runs the transformer over the whole batch layer by layer (so each weight row
 * is read once per step).  K/V are kept in float32 in a pool of blocks (engine.h), reached
 * through each sequence's block table; the LM head runs only for the
 * tokens whose logits somebody wants, and the sampler (sampling.h) picks the next token.
 * A layer is composed from its recipe (model/arch.h) in forward_layer(): each residual block
 * (attention, feed-forward) with the norms its placement asks for, one function per block
 * variant, read top to bottom; cpu_ops.c has the kernels. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "cpu.h"
#include "sampling.h"
#include "model/quant.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

/* Engine settings beyond these are mistakes, not configurations; bounding them keeps every
 * size product below within 64 bits. */
#define CFG_MAX (1 << 24)
#define LOGITS_MIN_ROWS 16

typedef struct cpu_engine {
    engine base; /* first: engine.c sees only this */
    cpu_pool *pool;
    int q_dim, kv_dim;

    /* K and V as [block][layer][row][kv_dim]; per row (slot), the tokens fed so far.  A model
     * with sliding-window layers keeps theirs in a second pool of the same layout (key_swa,
     * value_swa; engine.h), unless the config asks for one pool.  A model of latent attention
     * (latent_kv) keeps one cache, its rows [latent | RoPE key], and no V. */
    float *key_cache, *value_cache, *key_swa, *value_swa;
    bool latent_kv;
    int n_blocks, n_blocks_swa, table_width; /* pool blocks; blocks of one sequence's table */
    /* Layers with K/V (all but linear ones, and the MTP block when it runs) in each pool;
     * kv_layer[il] is layer il's index among those of its pool, kv_swa[il] whether that pool is
     * the sliding one. */
    int n_kv_layers, n_swa_layers;
    int *kv_layer;
    bool *kv_swa;
    int32_t *history; /* [slot][ctx_per_slot] */
    int *slot_len;    /* tokens of history */

    /* The batch being computed, one entry per token, and the block table of each sequence
     * ([seq][table_width], at most n_slots sequences per step). */
    int32_t *tok_id;
    int *tok_seq, *tok_pos;
    int *tok_keys; /* bidirectional attention: the length of each token's sequence */
    int32_t *tables, *tables_swa;
    int *out_tok; /* batch token of each LM-head row */
    int *out_seq; /* its sequence */

    /* Activations, [max_batch_tokens][width]. */
    float *x;       /* residual stream, n_embd */
    float *xb;      /* normed input / attention output, max(n_embd, q_dim) */
    float *xb2;     /* projection output before the residual add, n_embd */
    float *q, *k, *v;
    float *hb, *hb2; /* FFN gate and up, max(n_ff, n_ff_exp) */
    /* MoE (empty for dense models): router logits [tok][n_expert], each token's chosen experts
     * and weights [tok][n_expert_used], and one expert's group of tokens: their batch index,
     * weight, gathered inputs and outputs. */
    float *router;
    int32_t *moe_ids;
    float *moe_weights;
    int *group_tok;
    float *group_weight, *group_x, *group_y;
    float *moe_in, *moe_out; /* experts beside a dense MLP: their input and summed output [tok][n_embd] */
    /* Per-layer embeddings (Gemma 4; empty otherwise): each token's inputs of every layer
     * [tok][n_layer * n_embd_ple], and one layer's gate [tok][n_embd_ple]. */
    float *ple, *ple_gate;
    /* Hybrid models (empty otherwise).  The recurrent state: per state slot, per linear layer
     * the conv window [(taps-1) x ssm_chan] then the delta state [v heads x d x d]; the
     * positions each slot holds; each layer's index among the linear ones (-1: full).  Per
     * sequence of the step its first token, token count and state slot.  Activations: the
     * q/k/v channels (conv input, then output), the output gate z, beta and log decay per v head
     * (raw projections in ssm_raw), the delta rule's scratch. */
    float *state;
    int *state_len;
    int *lin_index;
    size_t conv_floats, layer_floats, slot_floats;
    int ssm_chan;
    int *seq_first, *seq_tokens, *seq_state, n_step_seqs;
    float *ssm_mix, *ssm_z, *ssm_beta, *ssm_g, *ssm_raw, *delta_scratch;
    /* Gated attention: the [query | gate] projection of each head; the shared expert's gate. */
    float *qg;
    float *shexp_gate;
    /* Latent attention (empty otherwise): every head's query [tok][n_head x (nope + rope)],
     * one head's gathered inputs and outputs of its per-head projections, the attention's
     * output in latent space [tok][n_head x (kv_lora + rope)]; the router's group scratch. */
    float *mla_q, *mla_in, *mla_out, *mla_att;
    float *router_choice;
    /* The MTP block (engine_config.mtp; empty otherwise): its input rows [enorm(embedding) |
     * hnorm(hidden)], [tok][2 n_embd].  The block is layer n_layer to the blocks above: its K/V
     * one more layer of the main pool (kv_layer[n_layer]). */
    float *mtp_in;
    float *scores;   /* attention scratch, n_threads x ctx_per_slot */
    float *logits;   /* LM head rows, n_slots x n_vocab */
    int logits_rows;
    void *sample_scratch;
} cpu_engine;

/* Only attention layers keep K/V: a block of a pool holds its layers' (swa: the sliding pool). */
static size_t kv_block_floats(const cpu_engine *e, bool swa)
{
    return (size_t)(swa ? e->n_swa_layers : e->n_kv_layers) * ENGINE_KV_BLOCK * (size_t)e->kv_dim;
}

/* Offset of (block, layer il, row) in the K/V caches of layer il's pool. */
static size_t kv_index(const cpu_engine *e, int32_t block, int il, int row)
{
    return (size_t)block * kv_block_floats(e, e->kv_swa[il]) +
           ((size_t)e->kv_layer[il] * ENGINE_KV_BLOCK + (size_t)row) * (size_t)e->kv_dim;
}

/* The block tables of layer il's pool, [seq][table_width]. */
static int32_t *kv_tables(const cpu_engine *e, int il) { return e->kv_swa[il] ? e->tables_swa : e->tables; }

/* Where token t's K/V go: its sequence's block of its position. */
static size_t kv_token_index(const cpu_engine *e, int t, int layer)
{
    int p = e->tok_pos[t];
    int32_t block = kv_tables(e, layer)[(size_t)e->tok_seq[t] * e->table_width + p / ENGINE_KV_BLOCK];
    return kv_index(e, block, layer, p % ENGINE_KV_BLOCK);
}

/* ---- forward pass ------------------------------------------------------------------------ */

static void matmul(cpu_engine *e, float *out, const float *x, int n_tok, const model_tensor *w,
                   const model_tensor *bias)
{
    cpu_matmul mm = {.out = out, .x = x, .n_tok = n_tok, .w = w, .bias = bias ? bias->data : NULL};
    cpu_matmul_run(e->pool, &mm);
}

static void embed_rows(const model_tensor *emb, const int32_t *ids, int n_tok, float *out, float scale)
{
    for (int t = 0; t < n_tok; t++) {
        float *x = out + (size_t)t * emb->ne0;
        quant_dequantize_row(emb->type, (const char *)emb->data + (size_t)ids[t] * emb->row_bytes, x, emb->ne0);
        if (scale != 1.0f)
            for (int64_t i = 0; i < emb->ne0; i++) x[i] *= scale;
    }
}

/* Gemma 4's per-layer inputs: ple[t] = (rmsnorm(proj·x[t] / sqrt(n_embd)) * proj_norm, per layer,
 * + the token's per-layer embeddings * sqrt(n_embd_ple)) / sqrt(2), x the scaled embeddings. */
static void per_layer_inputs(cpu_engine *e, int n_tok)
{
    const model *m = e->base.m;
    const int P = m->hp.n_embd_ple, all = P * m->hp.n_layer;
    embed_rows(&m->ple_tok_embd, e->tok_id, n_tok, e->hb, sqrtf((float)P));
    matmul(e, e->ple, e->x, n_tok, &m->ple_model_proj, NULL);
    const float proj_scale = 1.0f / sqrtf((float)m->hp.n_embd), input_scale = (float)M_SQRT1_2;
    for (size_t i = 0; i < (size_t)n_tok * all; i++) e->ple[i] *= proj_scale;
    for (size_t r = 0; r < (size_t)n_tok * m->hp.n_layer; r++)
        cpu_rmsnorm(e->ple + r * P, e->ple + r * P, m->ple_proj_norm.data, P, m->hp.rms_eps);
    for (size_t i = 0; i < (size_t)n_tok * all; i++) e->ple[i] = (e->ple[i] + e->hb[i]) * input_scale;
}

/* x[t] = the token's embedding row (times Gemma's scale; Gemma 4's per-layer inputs beside);
 * an encoder adds its position's row (bert; a rotary one, nomic-bert, has no table) and token
 * type 0's (one segment: what an embedding request is) and LayerNorms the sum. */
static void embed_tokens(cpu_engine *e, int n_tok)
{
    const model *m = e->base.m;
    embed_rows(&m->tok_embd, e->tok_id, n_tok, e->x, m->desc->embed_scale ? m->hp.embd_scale : 1.0f);
    if (m->hp.n_embd_ple > 0) per_layer_inputs(e, n_tok);
    if (!m->hp.encoder) return;
    const int dim = m->hp.n_embd;
    for (int t = 0; t < n_tok; t++) {
        float *x = e->x + (size_t)t * dim, *add = e->xb;
        if (m->pos_embd.data) {
            quant_dequantize_row(m->pos_embd.type,
                                 (const char *)m->pos_embd.data + (size_t)e->tok_pos[t] * m->pos_embd.row_bytes, add, dim);
            for (int i = 0; i < dim; i++) x[i] += add[i];
        }
        quant_dequantize_row(m->tok_types.type, m->tok_types.data, add, dim);
        for (int i = 0; i < dim; i++) x[i] += add[i];
        cpu_layernorm(x, x, m->embd_norm.data, m->embd_norm_b.data, dim, m->hp.rms_eps);
    }
}

/* ---- blocks: one function each, composed by the layer's recipe (model_layer.recipe) ---- */

/* The recipe features this backend runs; engine creation refuses a model needing others. */
#define CPU_FEATURES                                                                               \
    (ARCH_F_NORM_PRE | ARCH_F_NORM_POST | ARCH_F_NORM_SANDWICH | ARCH_F_ATTN_FULL | ARCH_F_ATTN_SLIDING |  \
     ARCH_F_QKV_BIAS | ARCH_F_QK_NORM | ARCH_F_FFN_GLU | ARCH_F_FFN_MOE | ARCH_F_ACT_SILU |                \
     ARCH_F_ACT_GELU_TANH | ARCH_F_ROUTER_SOFTMAX_TOPK | ARCH_F_V_NORM | ARCH_F_FFN_GLU_MOE |              \
     ARCH_F_ROUTER_SCALED | ARCH_F_ATTN_LINEAR | ARCH_F_ATTN_OUT_GATE | ARCH_F_ROPE_PARTIAL |              \
     ARCH_F_SHARED_EXPERT | ARCH_F_NORM_POST_LN | ARCH_F_ATTN_OUT_BIAS | ARCH_F_ATTN_BIDIR | ARCH_F_FFN_MLP | \
     ARCH_F_ACT_GELU_ERF | ARCH_F_ATTN_SINKS | ARCH_F_FFN_BIAS | ARCH_F_ACT_SWIGLU_CLAMP |                \
     ARCH_F_ROUTER_TOPK_SOFTMAX | ARCH_F_FUSED_QKV | ARCH_F_FUSED_GATE_UP | ARCH_F_ROUTER_SIGMOID_BIAS |       \
     ARCH_F_ROPE_LONGROPE | ARCH_F_ATTN_MLA | ARCH_F_EXPERT_GROUPS | ARCH_F_ALIBI)

/* out = rmsnorm(x) * w for n_tok rows of n_embd floats. */
static void norm_rows(const cpu_engine *e, float *out, const float *x, const model_tensor *w, int n_tok)
{
    const int dim = e->base.m->hp.n_embd;
    for (int t = 0; t < n_tok; t++)
        cpu_rmsnorm(out + (size_t)t * dim, x + (size_t)t * dim, w->data, dim, e->base.m->hp.rms_eps);
}

/* QK (and V) norm: every head normalised on its own (w NULL: no weight). */
static void head_rmsnorm(float *vec, int n_head, int head_dim, const float *w, float eps)
{
    for (int h = 0; h < n_head; h++) cpu_rmsnorm(vec + (size_t)h * head_dim, vec + (size_t)h * head_dim, w, head_dim, eps);
}

/* An output-gated layer's wq gives [query | gate] per head: the queries go to q, the gates
 * stay in qg for gate_heads. */
static void split_query_gate(cpu_engine *e, int n_tok)
{
    const int hd = e->base.m->hp.head_dim;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < e->base.m->hp.n_head; h++)
            memcpy(e->q + (size_t)t * e->q_dim + (size_t)h * hd, e->qg + (size_t)t * 2 * e->q_dim + (size_t)h * 2 * hd,
                   (size_t)hd * sizeof(float));
}

/* out *= sigmoid(gate), head by head (ARCH_ATTN_OUT_GATE). */
static void gate_heads(cpu_engine *e, int n_tok)
{
    const int hd = e->base.m->hp.head_dim;
    for (int t = 0; t < n_tok; t++) {
        for (int h = 0; h < e->base.m->hp.n_head; h++) {
            float *out = e->xb + (size_t)t * e->q_dim + (size_t)h * hd;
            const float *gate = e->qg + (size_t)t * 2 * e->q_dim + (size_t)h * 2 * hd + hd;
            for (int i = 0; i < hd; i++) out[i] *= 1.0f / (1.0f + expf(-gate[i]));
        }
    }
}

/* This batch's K and V of layer il, stored through the block tables: k = rope(norm(wk·xb)),
 * v = wv·xb, or wk·xb in a layer without wv (+ bias; normed without a weight when the recipe
 * says so).  The whole batch goes into the cache before any token attends, so a prompt in one
 * step sees exactly what it would see fed token by token. */
static void store_kv(cpu_engine *e, int il, int n_tok, const cpu_rope *rope)
{
    const model_hparams *hp = &e->base.m->hp;
    const model_layer *ly = &e->base.m->layers[il];
    const bool bias = ly->recipe.attn_extras & ARCH_ATTN_QKV_BIAS;
    const int hd = ly->head_dim, kv_w = ly->n_head_kv * hd;
    matmul(e, e->k, e->xb, n_tok, &ly->wk, bias ? &ly->bk : NULL);
    if (ly->wv.data) matmul(e, e->v, e->xb, n_tok, &ly->wv, bias ? &ly->bv : NULL);
    else memcpy(e->v, e->k, (size_t)n_tok * kv_w * sizeof(float)); /* attention_k_eq_v: V is the K projection */
    for (int t = 0; t < n_tok; t++) {
        float *k = e->k + (size_t)t * kv_w, *v = e->v + (size_t)t * kv_w;
        if (ly->recipe.attn_extras & ARCH_ATTN_QK_NORM) head_rmsnorm(k, ly->n_head_kv, hd, ly->k_norm.data, hp->rms_eps);
        if (ly->recipe.attn_extras & ARCH_ATTN_V_NORM) head_rmsnorm(v, ly->n_head_kv, hd, NULL, hp->rms_eps);
        if (e->base.m->desc->rope != ARCH_ROPE_NONE) cpu_rope_apply(rope, k, ly->n_head_kv, e->tok_pos[t]);
        size_t at = kv_token_index(e, t, il);
        memcpy((e->kv_swa[il] ? e->key_swa : e->key_cache) + at, k, (size_t)kv_w * sizeof(float));
        memcpy((e->kv_swa[il] ? e->value_swa : e->value_cache) + at, v, (size_t)kv_w * sizeof(float));
    }
}

/* Causal softmax attention, full or over the layer's sliding window (model_layer.window):
 * xb2 = wo · attend(rope(q), K, V) (+ output bias) with q = wq·xb (+ bias; its heads normed
 * first when the recipe says so), RoPE with the layer's base, scaling and factors (and the
 * model's YaRN), over the K/V of this layer or, in a KV-shared layer, of its kv_source (which
 * computed them earlier in this step); each head's sink logit in its softmax when it has one. */
static void attention_softmax(cpu_engine *e, int il, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const model_layer *ly = &e->base.m->layers[il];
    const unsigned extras = ly->recipe.attn_extras;
    const bool bias = extras & ARCH_ATTN_QKV_BIAS, gated = extras & ARCH_ATTN_OUT_GATE;
    const int hd = ly->head_dim, q_w = hp->n_head * hd;
    const int n_rot = ly->recipe.attn_extras & ARCH_ATTN_ROPE_PARTIAL ? hp->n_rot : hd;
    const cpu_rope rope = {.head_dim = hd, .n_rot = n_rot, .neox = hp->rope_neox, .base = ly->rope_base,
                           .scale = ly->rope_scale,
                           .freq_div = model_rope_freqs(e->base.m, ly, e->base.cfg.ctx_per_slot),
                           .attn_factor = hp->rope_attn_factor, .yarn_factor = hp->yarn_factor,
                           .yarn_low = hp->yarn_low, .yarn_high = hp->yarn_high};
    if (gated) {
        matmul(e, e->qg, e->xb, n_tok, &ly->wq, NULL);
        split_query_gate(e, n_tok);
    } else {
        matmul(e, e->q, e->xb, n_tok, &ly->wq, bias ? &ly->bq : NULL);
    }
    for (int t = 0; t < n_tok; t++) {
        float *q = e->q + (size_t)t * q_w;
        if (ly->recipe.attn_extras & ARCH_ATTN_QK_NORM) head_rmsnorm(q, hp->n_head, hd, ly->q_norm.data, hp->rms_eps);
        if (e->base.m->desc->rope != ARCH_ROPE_NONE) cpu_rope_apply(&rope, q, hp->n_head, e->tok_pos[t]);
    }
    if (ly->kv_source == il) store_kv(e, il, n_tok, &rope);
    const int src = ly->kv_source;
    const bool swa = e->kv_swa[src];
    size_t layer_base = kv_index(e, 0, src, 0);
    cpu_attention at = {
        .out = e->xb, .q = e->q,
        .key_cache = (swa ? e->key_swa : e->key_cache) + layer_base,
        .value_cache = (swa ? e->value_swa : e->value_cache) + layer_base,
        .block_stride = (long)kv_block_floats(e, swa), .row_stride = e->kv_dim, .tables = kv_tables(e, src),
        .table_width = e->table_width, .n_tok = n_tok, .seq = e->tok_seq, .pos = e->tok_pos,
        .n_head = hp->n_head, .n_head_kv = ly->n_head_kv, .head_dim = hd,
        .window = ly->window, .score_div = sqrtf(hp->attn_scalar),
        .sinks = extras & ARCH_ATTN_SINKS ? ly->attn_sinks.data : NULL,
        .scores = e->scores, .scores_stride = e->base.cfg.ctx_per_slot,
        .n_keys = extras & ARCH_ATTN_BIDIR ? e->tok_keys : NULL,
        .alibi_max = extras & ARCH_ATTN_ALIBI ? ARCH_ALIBI_MAX_BIAS : 0.0f,
    };
    cpu_attention_run(e->pool, &at);
    if (gated) gate_heads(e, n_tok);
    matmul(e, e->xb2, e->xb, n_tok, &ly->wo, extras & ARCH_ATTN_OUT_BIAS ? &ly->bo : NULL);
}

/* out[t] = w · in[t] for one head of n_tok tokens, w a head's slice of a per-head tensor:
 * the head's in_w floats at in_off of each row of `in` (in_stride apart) are gathered, and the
 * w->ne1 results land at out_off of each row of `out` (out_stride apart). */
typedef struct head_proj {
    const model_tensor *w;
    int head;
    const float *in;
    int in_stride, in_off;
    float *out;
    int out_stride, out_off;
} head_proj;

static void head_matmul(cpu_engine *e, const head_proj *p, int n_tok)
{
    const model_tensor w = model_tensor_slice(p->w, p->head);
    const int in_w = (int)w.ne0, out_w = (int)w.ne1;
    for (int t = 0; t < n_tok; t++)
        memcpy(e->mla_in + (size_t)t * in_w, p->in + (size_t)t * p->in_stride + p->in_off, (size_t)in_w * sizeof(float));
    matmul(e, e->mla_out, e->mla_in, n_tok, &w, NULL);
    for (int t = 0; t < n_tok; t++)
        memcpy(p->out + (size_t)t * p->out_stride + p->out_off, e->mla_out + (size_t)t * out_w,
               (size_t)out_w * sizeof(float));
}

/* Multi-head latent attention (DeepSeek), in the absorbed form for prompts and decode alike:
 * the cache row of a token is [c | rope(k_rope)] with [c | k_rope] = wkv_a·xb and c RMS-normed
 * (kv_lora + rope floats per token and layer, whatever the head count), and each head's
 * query is taken into that space, [wk_b_h · q_nope | rope(q_rope)], so its scores against the
 * rows are q_nope·k_nope + q_rope·k_rope of the expanded form; the softmax-weighted sum of the
 * rows' latent parts times wv_b_h is the head's value output, and xb2 = wo · the heads'.
 * q = wq_b·rmsnorm(wq_a·xb) (or wq·xb), heads [nope | rope].  Scores times mscale^2 /
 * sqrt(nope + rope) (YaRN's mscale).  The sums of the rows' RoPE parts the shared attention
 * kernel also makes are not used. */
static void attention_mla(cpu_engine *e, int il, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const model_layer *ly = &e->base.m->layers[il];
    const int H = hp->n_head, nope = hp->mla_nope, rot = hp->n_rot, lat = hp->kv_lora_rank, v_w = hp->mla_v;
    const int qk = nope + rot, row = lat + rot;
    const cpu_rope rope = {.head_dim = rot, .n_rot = rot, .neox = hp->rope_neox, .base = ly->rope_base,
                           .scale = ly->rope_scale, .attn_factor = hp->rope_attn_factor,
                           .yarn_factor = hp->yarn_factor, .yarn_low = hp->yarn_low, .yarn_high = hp->yarn_high};
    if (ly->wq_a.data) {
        matmul(e, e->mla_in, e->xb, n_tok, &ly->wq_a, NULL);
        for (int t = 0; t < n_tok; t++)
            cpu_rmsnorm(e->mla_in + (size_t)t * hp->q_lora_rank, e->mla_in + (size_t)t * hp->q_lora_rank,
                        ly->q_a_norm.data, hp->q_lora_rank, hp->rms_eps);
        matmul(e, e->mla_q, e->mla_in, n_tok, &ly->wq_b, NULL);
    } else {
        matmul(e, e->mla_q, e->xb, n_tok, &ly->wq, NULL);
    }
    matmul(e, e->k, e->xb, n_tok, &ly->wkv_a, NULL);
    for (int t = 0; t < n_tok; t++) {
        float *k = e->k + (size_t)t * row;
        cpu_rmsnorm(k, k, ly->kv_a_norm.data, lat, hp->rms_eps);
        cpu_rope_apply(&rope, k + lat, 1, e->tok_pos[t]);
        memcpy(e->key_cache + kv_token_index(e, t, il), k, (size_t)row * sizeof(float));
    }
    for (int h = 0; h < H; h++) {
        const head_proj absorb = {.w = &ly->wk_b, .head = h, .in = e->mla_q, .in_stride = H * qk, .in_off = h * qk,
                                  .out = e->q, .out_stride = H * row, .out_off = h * row};
        head_matmul(e, &absorb, n_tok);
    }
    for (int t = 0; t < n_tok; t++) {
        for (int h = 0; h < H; h++) {
            float *q_rot = e->q + (size_t)t * H * row + (size_t)h * row + lat;
            memcpy(q_rot, e->mla_q + (size_t)t * H * qk + (size_t)h * qk + nope, (size_t)rot * sizeof(float));
            cpu_rope_apply(&rope, q_rot, 1, e->tok_pos[t]);
        }
    }
    const float *cache = e->key_cache + kv_index(e, 0, il, 0);
    cpu_attention at = {
        .out = e->mla_att, .q = e->q, .key_cache = cache, .value_cache = cache,
        .block_stride = (long)kv_block_floats(e, false), .row_stride = e->kv_dim, .tables = e->tables,
        .table_width = e->table_width, .n_tok = n_tok, .seq = e->tok_seq, .pos = e->tok_pos,
        .n_head = H, .n_head_kv = 1, .head_dim = row, .score_div = sqrtf((float)qk) / hp->attn_mscale2,
        .scores = e->scores, .scores_stride = e->base.cfg.ctx_per_slot,
    };
    cpu_attention_run(e->pool, &at);
    for (int h = 0; h < H; h++) {
        const head_proj value = {.w = &ly->wv_b, .head = h, .in = e->mla_att, .in_stride = H * row,
                                 .in_off = h * row, .out = e->xb, .out_stride = H * v_w, .out_off = h * v_w};
        head_matmul(e, &value, n_tok);
    }
    matmul(e, e->xb2, e->xb, n_tok, &ly->wo, NULL);
}

/* The first float of state slot `slot`'s linear layer `lin` (its conv window; the delta
 * state follows at conv_floats). */
static float *layer_state(const cpu_engine *e, int slot, int lin)
{
    return e->state + (size_t)slot * e->slot_floats + (size_t)lin * e->layer_floats;
}

/* Per token and v head: beta = sigmoid(b), g = A * softplus(a + dt_bias) (the decay is exp(g)), from the
 * separate projections (qwen35) or the fused one (qwen3next: per k head its v heads' b, then
 * their a). */
static void ssm_beta_decay(cpu_engine *e, const model_layer *ly, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const int nv = hp->ssm_vheads, per_k = nv / hp->ssm_groups;
    float *b = e->ssm_beta, *a = e->ssm_g; /* the raw projections first, in place after */
    if (ly->ssm_ba.data) {
        matmul(e, e->ssm_raw, e->xb, n_tok, &ly->ssm_ba, NULL);
        for (int t = 0; t < n_tok; t++) {
            for (int h = 0; h < nv; h++) {
                const float *group = e->ssm_raw + (size_t)t * 2 * nv + (size_t)(h / per_k) * 2 * per_k;
                b[(size_t)t * nv + h] = group[h % per_k];
                a[(size_t)t * nv + h] = group[per_k + h % per_k];
            }
        }
    } else {
        matmul(e, b, e->xb, n_tok, &ly->ssm_beta, NULL);
        matmul(e, a, e->xb, n_tok, &ly->ssm_alpha, NULL);
    }
    const float *A = ly->ssm_a.data, *dt = ly->ssm_dt.data;
    for (int t = 0; t < n_tok; t++) {
        for (int h = 0; h < nv; h++) {
            const size_t i = (size_t)t * nv + h;
            const float x = a[i] + dt[h], softplus = x > 20.0f ? x : log1pf(expf(x)); /* torch's threshold */
            b[i] = 1.0f / (1.0f + expf(-b[i]));
            a[i] = A[h] * softplus; /* the log of the decay */
        }
    }
}

/* Plain MLP with biases: xb2 = w_down · gelu(w_up·xb + b_up) + b_down (ARCH_ACT_GELU_ERF, the
 * one activation an MLP runs here). */
static void ffn_mlp(cpu_engine *e, int il, int n_tok)
{
    const model_layer *ly = &e->base.m->layers[il];
    matmul(e, e->hb, e->xb, n_tok, &ly->w_up, &ly->b_up);
    cpu_gelu_erf(e->hb, n_tok * e->base.m->hp.n_ff);
    matmul(e, e->xb2, e->hb, n_tok, &ly->w_down, &ly->b_down);
}

/* Gated DeltaNet: xb2 = out · (rmsnorm(delta_rule(q, k, v)) * silu(z)) where [q k v] =
 * silu(causal conv1d(w_qkv·xb)) with q and k L2-normed per head (q also / sqrt(d)) and
 * z = w_gate·xb.  The conv window and the delta state of the token's sequence carry over
 * from its previous step (its state slot), so a prompt split over steps gives what one step
 * gives. */
static void attention_linear(cpu_engine *e, int il, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const model_layer *ly = &e->base.m->layers[il];
    const int lin = e->lin_index[il], chan = e->ssm_chan, d = hp->ssm_state, nk = hp->ssm_groups,
              nv = hp->ssm_vheads;
    matmul(e, e->ssm_mix, e->xb, n_tok, &ly->ssm_qkv, NULL);
    matmul(e, e->ssm_z, e->xb, n_tok, &ly->ssm_gate, NULL);
    ssm_beta_decay(e, ly, n_tok);
    const float q_scale = 1.0f / sqrtf((float)d);
    for (int s = 0; s < e->n_step_seqs; s++) {
        float *window = layer_state(e, e->seq_state[s], lin);
        for (int t = e->seq_first[s]; t < e->seq_first[s] + e->seq_tokens[s]; t++) {
            float *x = e->ssm_mix + (size_t)t * chan;
            cpu_conv1d_step(x, window, ly->ssm_conv1d.data, chan, hp->ssm_conv);
            for (int h = 0; h < 2 * nk; h++) cpu_l2norm(x + (size_t)h * d, d); /* q heads, then k heads */
            for (int i = 0; i < nk * d; i++) x[i] *= q_scale;
        }
    }
    cpu_delta dr = {
        .out = e->xb, .qkv = e->ssm_mix, .stride = chan, .q_off = 0, .k_off = (long)nk * d,
        .v_off = 2 * (long)nk * d, .beta = e->ssm_beta, .g = e->ssm_g, .state = e->state,
        .slot_stride = (long)e->slot_floats, .layer_off = (long)((size_t)lin * e->layer_floats + e->conv_floats),
        .seq_first = e->seq_first, .seq_tokens = e->seq_tokens, .seq_state = e->seq_state,
        .n_seqs = e->n_step_seqs, .v_heads = nv, .k_heads = nk, .d = d, .grouped = hp->ssm_grouped,
        .scratch = e->delta_scratch,
    };
    cpu_delta_run(e->pool, &dr);
    for (int t = 0; t < n_tok; t++) {
        for (int h = 0; h < nv; h++) {
            float *o = e->xb + (size_t)t * hp->ssm_inner + (size_t)h * d;
            const float *z = e->ssm_z + (size_t)t * hp->ssm_inner + (size_t)h * d;
            cpu_rmsnorm(o, o, ly->ssm_norm.data, d, hp->rms_eps);
            for (int i = 0; i < d; i++) o[i] *= z[i] / (1.0f + expf(-z[i]));
        }
    }
    matmul(e, e->xb2, e->xb, n_tok, &ly->ssm_out, NULL);
}

/* A GLU's weights: gate and up [n_embd -> n_ff], down [n_ff -> n_embd], their biases (NULL:
 * none) and the activation. */
typedef struct glu_weights {
    model_tensor gate, up, down;
    const float *gate_b, *up_b, *down_b;
    int n_ff;
    arch_act act;
} glu_weights;

/* out = down · (act(gate·x) * up·x) for n rows of x, gate and up n_ff wide (hb, hb2 hold
 * them): SwiGLU, GeGLU (tanh or, jina-bert-v2's, erf) or the clamped SwiGLU as the layer's
 * recipe says. */
static void glu_ffn(cpu_engine *e, float *out, const float *x, int n, const glu_weights *g)
{
    cpu_matmul gate = {.out = e->hb, .x = x, .n_tok = n, .w = &g->gate, .bias = g->gate_b},
               up = {.out = e->hb2, .x = x, .n_tok = n, .w = &g->up, .bias = g->up_b};
    cpu_matmul_run(e->pool, &gate);
    cpu_matmul_run(e->pool, &up);
    if (g->act == ARCH_ACT_GELU_TANH) cpu_geglu(e->hb, e->hb2, n * g->n_ff);
    else if (g->act == ARCH_ACT_GELU_ERF) cpu_geglu_erf(e->hb, e->hb2, n * g->n_ff);
    else if (g->act == ARCH_ACT_SWIGLU_CLAMP) cpu_swiglu_clamp(e->hb, e->hb2, n * g->n_ff);
    else cpu_swiglu(e->hb, e->hb2, n * g->n_ff);
    cpu_matmul down = {.out = out, .x = e->hb, .n_tok = n, .w = &g->down, .bias = g->down_b};
    cpu_matmul_run(e->pool, &down);
}

/* Gated feed-forward: xb2 = w_down · (act(w_gate·xb) * w_up·xb) (+ b_down: jina-bert-v2). */
static void ffn_glu(cpu_engine *e, int il, int n_tok)
{
    const model_layer *ly = &e->base.m->layers[il];
    const glu_weights g = {.gate = ly->w_gate, .up = ly->w_up, .down = ly->w_down, .down_b = ly->b_down.data,
                           .n_ff = ly->n_ff, .act = ly->recipe.act};
    glu_ffn(e, e->xb2, e->xb, n_tok, &g);
}

/* Row `expert` of a [width, n_expert] bias, or NULL when the layer has no expert biases. */
static const float *expert_bias(const model_layer *ly, const model_tensor *b, int expert)
{
    if (!(ly->recipe.ffn_extras & ARCH_FFN_BIAS)) return NULL;
    return (const float *)b->data + (size_t)expert * (size_t)b->ne0;
}

/* One expert's GLU over the tokens gathered for it: group_y for the n rows of group_x.  Its
 * gate and up are two matrices, or the two halves of one (ffn_gate_up_exps: gate rows first). */
static void expert_glu(cpu_engine *e, const model_layer *ly, int expert, int n)
{
    const int n_ff = e->base.m->hp.n_ff_exp;
    model_tensor gate, up;
    if (ly->ffn_gate_up_exps.data) {
        const model_tensor both = model_tensor_slice(&ly->ffn_gate_up_exps, expert);
        gate = model_tensor_rows(&both, 0, n_ff);
        up = model_tensor_rows(&both, n_ff, n_ff);
    } else {
        gate = model_tensor_slice(&ly->ffn_gate_exps, expert);
        up = model_tensor_slice(&ly->ffn_up_exps, expert);
    }
    const glu_weights g = {
        .gate = gate, .up = up, .down = model_tensor_slice(&ly->ffn_down_exps, expert),
        .gate_b = expert_bias(ly, &ly->ffn_gate_exps_b, expert),
        .up_b = expert_bias(ly, &ly->ffn_up_exps_b, expert),
        .down_b = expert_bias(ly, &ly->ffn_down_exps_b, expert),
        .n_ff = n_ff, .act = ly->recipe.act,
    };
    glu_ffn(e, e->group_y, e->group_x, n, &g);
}

/* The shared expert every token runs beside its routed ones: xb2 += shexp_glu(xb), times
 * sigmoid(gate_inp_shexp·xb) when the recipe gates it (ARCH_FFN_SHEXP_GATE: Qwen; GLM adds it
 * as it is), after the routed experts' sum. */
static void shared_expert(cpu_engine *e, const model_layer *ly, int n_tok)
{
    const int dim = e->base.m->hp.n_embd;
    const bool gated = ly->recipe.ffn_extras & ARCH_FFN_SHEXP_GATE;
    if (gated) matmul(e, e->shexp_gate, e->xb, n_tok, &ly->ffn_gate_inp_shexp, NULL);
    const glu_weights g = {.gate = ly->ffn_gate_shexp, .up = ly->ffn_up_shexp, .down = ly->ffn_down_shexp,
                           .n_ff = e->base.m->hp.n_ff_shexp, .act = ARCH_ACT_SILU};
    glu_ffn(e, e->group_y, e->xb, n_tok, &g);
    for (int t = 0; t < n_tok; t++) {
        const float g = gated ? 1.0f / (1.0f + expf(-e->shexp_gate[t])) : 1.0f;
        float *out = e->xb2 + (size_t)t * dim;
        const float *y = e->group_y + (size_t)t * dim;
        for (int d = 0; d < dim; d++) out[d] += g * y[d];
    }
}

/* out = sum over each token's routed experts (moe_ids, moe_weights) of weight *
 * expert_glu(in).  Tokens are grouped by expert, so each expert's weights are read once per
 * step for all the tokens routed to it, and an expert nobody picked is not read at all.  A
 * token's sum runs over its experts in id order, whatever else is in the batch. */
static void moe_sum(cpu_engine *e, const model_layer *ly, const float *in, float *out, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const int dim = hp->n_embd, k = hp->n_expert_used;
    memset(out, 0, (size_t)n_tok * dim * sizeof(float));
    for (int x = 0; x < hp->n_expert; x++) {
        int n = 0;
        for (int t = 0; t < n_tok; t++) {
            for (int j = 0; j < k; j++) {
                if (e->moe_ids[(size_t)t * k + j] != x) continue;
                e->group_tok[n] = t;
                e->group_weight[n] = e->moe_weights[(size_t)t * k + j];
                memcpy(e->group_x + (size_t)n * dim, in + (size_t)t * dim, (size_t)dim * sizeof(float));
                n++;
            }
        }
        if (n == 0) continue;
        expert_glu(e, ly, x, n);
        for (int i = 0; i < n; i++) {
            float *o = out + (size_t)e->group_tok[i] * dim;
            const float *y = e->group_y + (size_t)i * dim;
            for (int d = 0; d < dim; d++) o[d] += e->group_weight[i] * y[d];
        }
    }
}

/* Each token's experts and weights from the router's logits of `in` (+ its bias): softmax then
 * top-k (ARCH_ROUTER_SOFTMAX_TOPK; ARCH_ROUTER_SCALED's input scaling is done by the caller,
 * its expert scales here), top-k then softmax (ARCH_ROUTER_TOPK_SOFTMAX), or sigmoid scores
 * chosen with the selection bias (ARCH_ROUTER_SIGMOID_BIAS). */
static void moe_route(cpu_engine *e, const model_layer *ly, const float *in, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const int k = hp->n_expert_used;
    /* the scored router: sigmoid (+ bias), or DeepSeek V2's softmax where the file asks for what
     * the plain softmax top-k does not do (groups, no renormalisation, a scale) */
    const bool grouped = ly->recipe.ffn_extras & ARCH_FFN_EXPERT_GROUPS;
    const bool sigmoid = ly->recipe.router == ARCH_ROUTER_SIGMOID_BIAS;
    const bool softmax_scored = ly->recipe.router == ARCH_ROUTER_SOFTMAX_TOPK &&
                                (grouped || !hp->expert_weights_norm || hp->expert_weights_scale != 1.0f);
    const cpu_score_router scored = {.bias = ly->exp_probs_b.data, .n_expert = hp->n_expert, .k = k,
                                     .scale = hp->expert_weights_scale, .softmax = !sigmoid,
                                     .raw = !hp->expert_weights_norm, .n_group = grouped ? hp->n_expert_groups : 0,
                                     .topk_group = hp->n_group_used, .choice = e->router_choice};
    matmul(e, e->router, in, n_tok, &ly->ffn_gate_inp, ly->recipe.ffn_extras & ARCH_FFN_BIAS ? &ly->ffn_gate_inp_b : NULL);
    for (int t = 0; t < n_tok; t++) {
        int32_t *ids = e->moe_ids + (size_t)t * k;
        float *w = e->moe_weights + (size_t)t * k, *logits = e->router + (size_t)t * hp->n_expert;
        if (ly->recipe.router == ARCH_ROUTER_TOPK_SOFTMAX) cpu_moe_route_topk_softmax(logits, hp->n_expert, k, ids, w);
        else if (sigmoid || softmax_scored) cpu_moe_route_scored(&scored, logits, ids, w);
        else cpu_moe_route(logits, hp->n_expert, k, ids, w);
        if (ly->expert_scale.data)
            for (int j = 0; j < k; j++) w[j] *= ((const float *)ly->expert_scale.data)[ids[j]];
    }
}

/* Mixture of experts: xb2 = the routed experts' weighted sum over xb (+ the shared expert). */
static void ffn_moe(cpu_engine *e, int il, int n_tok)
{
    const model_layer *ly = &e->base.m->layers[il];
    moe_route(e, ly, e->xb, n_tok);
    moe_sum(e, ly, e->xb, e->xb2, n_tok);
    if (ly->recipe.ffn_extras & ARCH_FFN_SHARED_EXPERT) shared_expert(e, ly, n_tok);
}

/* Gemma 4's experts beside the dense MLP: xb2 = post_1(glu(xb)) + post_2(experts(pre_2(x)))
 * with xb the block's normed input and x the residual stream; the router reads
 * rmsnorm(x) / sqrt(n_embd) * ffn_gate_inp.scale. */
static void ffn_glu_moe(cpu_engine *e, int il, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const model_layer *ly = &e->base.m->layers[il];
    const int dim = hp->n_embd;
    ffn_glu(e, il, n_tok);
    norm_rows(e, e->xb2, e->xb2, &ly->ffn_post_norm_1, n_tok);
    const float inv_sqrt_dim = 1.0f / sqrtf((float)dim);
    const float *scale = ly->router_scale.data;
    for (int t = 0; t < n_tok; t++) {
        float *r = e->moe_out + (size_t)t * dim;
        cpu_rmsnorm(r, e->x + (size_t)t * dim, NULL, dim, hp->rms_eps);
        for (int d = 0; d < dim; d++) r[d] = r[d] * inv_sqrt_dim * scale[d];
    }
    moe_route(e, ly, e->moe_out, n_tok);
    norm_rows(e, e->moe_in, e->x, &ly->ffn_pre_norm_2, n_tok);
    moe_sum(e, ly, e->moe_in, e->moe_out, n_tok);
    norm_rows(e, e->moe_out, e->moe_out, &ly->ffn_post_norm_2, n_tok);
    for (size_t i = 0; i < (size_t)n_tok * dim; i++) e->xb2[i] += e->moe_out[i];
}

/* A block reads xb (n_tok rows of n_embd) and leaves its output in xb2. */
typedef void (*cpu_block)(cpu_engine *e, int il, int n_tok);
static const cpu_block ATTENTION_BLOCKS[] = {[ARCH_ATTN_FULL] = attention_softmax,
                                             [ARCH_ATTN_SLIDING] = attention_softmax,
                                             [ARCH_ATTN_LINEAR] = attention_linear,
                                             [ARCH_ATTN_MLA] = attention_mla};
static const cpu_block FFN_BLOCKS[] = {[ARCH_FFN_GLU] = ffn_glu, [ARCH_FFN_MOE] = ffn_moe,
                                       [ARCH_FFN_GLU_MOE] = ffn_glu_moe, [ARCH_FFN_MLP] = ffn_mlp};

/* BERT's post-LN residual: x = LayerNorm(x + block(x)) with the norm's weight and bias. */
static void residual_post_ln(cpu_engine *e, cpu_block block, const model_tensor *w, const model_tensor *b, int il,
                             int n_tok)
{
    const int dim = e->base.m->hp.n_embd;
    memcpy(e->xb, e->x, (size_t)n_tok * dim * sizeof(float));
    block(e, il, n_tok);
    for (int t = 0; t < n_tok; t++) {
        float *x = e->x + (size_t)t * dim;
        const float *y = e->xb2 + (size_t)t * dim;
        for (int i = 0; i < dim; i++) x[i] += y[i];
        cpu_layernorm(x, x, w->data, b->data, dim, e->base.m->hp.rms_eps);
    }
}

/* x += post(block(pre(x))): pre/post are the norms the placement asks for (NULL: none). */
static void residual(cpu_engine *e, cpu_block block, const model_tensor *pre, const model_tensor *post, int il,
                     int n_tok)
{
    const size_t n = (size_t)n_tok * e->base.m->hp.n_embd;
    if (pre) norm_rows(e, e->xb, e->x, pre, n_tok);
    else memcpy(e->xb, e->x, n * sizeof(float));
    block(e, il, n_tok);
    if (post) norm_rows(e, e->xb2, e->xb2, post, n_tok);
    for (size_t i = 0; i < n; i++) e->x[i] += e->xb2[i];
}

/* Gemma 4's per-layer embedding of layer il: x += rmsnorm(proj · (gelu(gate · x) * ple[il])) *
 * post_norm. */
static void per_layer_embedding(cpu_engine *e, int il, int n_tok)
{
    const model *m = e->base.m;
    const model_layer *ly = &m->layers[il];
    const int P = m->hp.n_embd_ple, dim = m->hp.n_embd;
    matmul(e, e->ple_gate, e->x, n_tok, &ly->ple_gate, NULL);
    cpu_gelu(e->ple_gate, n_tok * P);
    for (int t = 0; t < n_tok; t++) {
        const float *in = e->ple + ((size_t)t * m->hp.n_layer + il) * P;
        for (int i = 0; i < P; i++) e->ple_gate[(size_t)t * P + i] *= in[i];
    }
    matmul(e, e->xb2, e->ple_gate, n_tok, &ly->ple_proj, NULL);
    norm_rows(e, e->xb2, e->xb2, &ly->ple_post_norm, n_tok);
    for (size_t i = 0; i < (size_t)n_tok * dim; i++) e->x[i] += e->xb2[i];
}

/* One layer: x += post(attention(pre(x))); x += post(ffn(pre(x))), the norms and blocks its
 * recipe names. */
static void forward_layer(cpu_engine *e, int il, int n_tok)
{
    const model_layer *ly = &e->base.m->layers[il];
    const arch_layer *r = &ly->recipe;
    if (r->norm == ARCH_NORM_POST_LN) {
        residual_post_ln(e, ATTENTION_BLOCKS[r->attn], &ly->attn_out_norm, &ly->attn_out_norm_b, il, n_tok);
        residual_post_ln(e, FFN_BLOCKS[r->ffn], &ly->ffn_out_norm, &ly->ffn_out_norm_b, il, n_tok);
        return;
    }
    const bool pre = r->norm != ARCH_NORM_POST, post = r->norm != ARCH_NORM_PRE;
    residual(e, ATTENTION_BLOCKS[r->attn], pre ? &ly->attn_norm : NULL, post ? &ly->attn_post_norm : NULL, il, n_tok);
    residual(e, FFN_BLOCKS[r->ffn], pre ? &ly->ffn_norm : NULL, post ? &ly->ffn_post_norm : NULL, il, n_tok);
    if (e->base.m->hp.n_embd_ple > 0) per_layer_embedding(e, il, n_tok);
    if (ly->out_scale.data) {
        const float s = *(const float *)ly->out_scale.data;
        for (size_t i = 0; i < (size_t)n_tok * e->base.m->hp.n_embd; i++) e->x[i] *= s;
    }
}

/* ---- a step -------------------------------------------------------------------------------- */

/* Everything that could make a step fail is checked here, before any slot changes. */
static int check_positions(const cpu_engine *e, const engine_seq *seqs, int n_seqs, char *err, size_t errlen)
{
    for (int i = 0; i < n_seqs; i++) {
        if (seqs[i].pos > e->slot_len[seqs[i].slot] && !seqs[i].history) {
            snprintf(err, errlen, "seq %d: starts at position %d but slot %d holds only %d tokens", i,
                     seqs[i].pos, seqs[i].slot, e->slot_len[seqs[i].slot]);
            return -1;
        }
        const int st = engine_seq_state(&seqs[i]);
        if (e->state && seqs[i].pos != 0 && seqs[i].pos != e->state_len[st]) {
            snprintf(err, errlen, "seq %d: starts at position %d but its state slot %d holds the state after %d "
                     "(a recurrent state cannot rewind)", i, seqs[i].pos, st, e->state_len[st]);
            return -1;
        }
    }
    return 0;
}

/* Flatten the sequences into the token batch and their block tables, and record their tokens
 * in the row history (a sequence starting before the end of its row's history rewinds it; one
 * starting past it brings the missing tokens).  Returns the number of tokens; fills the
 * LM-head row list and its length. */
static int plan_batch(cpu_engine *e, const engine_seq *seqs, int n_seqs, int *n_out)
{
    int n_tok = 0;
    *n_out = 0;
    for (int i = 0; i < n_seqs; i++) {
        const engine_seq *s = &seqs[i];
        int32_t *hist = e->history + (size_t)s->slot * e->base.cfg.ctx_per_slot;
        int have = e->slot_len[s->slot];
        if (have < s->pos) memcpy(hist + have, s->history + have, (size_t)(s->pos - have) * sizeof *hist);
        const int last = (s->pos + s->n_tokens - 1) / ENGINE_KV_BLOCK;
        for (int b = 0; b <= last; b++) e->tables[(size_t)i * e->table_width + b] = engine_seq_block(&e->base, s, b);
        if (e->n_blocks_swa) { /* the sliding table from the window of the first query on (engine.h) */
            int32_t *row = e->tables_swa + (size_t)i * e->table_width;
            const int first = engine_swa_first_block(s->pos, e->base.swa_window);
            for (int b = 0; b <= last; b++) row[b] = b < first ? -1 : engine_seq_block_swa(&e->base, s, b);
        }
        for (int j = 0; j < s->n_tokens; j++, n_tok++) {
            e->tok_id[n_tok] = s->tokens[j];
            e->tok_seq[n_tok] = i;
            e->tok_pos[n_tok] = s->pos + j;
            e->tok_keys[n_tok] = s->pos + s->n_tokens;
            hist[s->pos + j] = s->tokens[j];
            bool last = j == s->n_tokens - 1, verified = s->want_token && j >= s->n_tokens - s->n_sample;
            if ((last && (s->want_token || s->logits)) || verified || (s->logits && s->logits_all)) {
                e->out_tok[*n_out] = n_tok;
                e->out_seq[*n_out] = i;
                (*n_out)++;
            }
        }
        e->slot_len[s->slot] = s->pos + s->n_tokens;
        e->seq_first[i] = n_tok - s->n_tokens;
        e->seq_tokens[i] = s->n_tokens;
        e->seq_state[i] = engine_seq_state(s);
        if (e->state) { /* a sequence at position 0 starts from the zero state */
            float *state = e->state + (size_t)e->seq_state[i] * e->slot_floats;
            if (s->pos == 0) memset(state, 0, e->slot_floats * sizeof(float));
            e->state_len[e->seq_state[i]] = s->pos + s->n_tokens;
        }
    }
    e->n_step_seqs = n_seqs;
    return n_tok;
}

/* Hand one row of logits to its sequence: copy it out if asked, sample if it is the last (or,
 * verifying drafts, one of the last n_sample: each as a one-token step there would). */
static void deliver_row(cpu_engine *e, const engine_seq *s, int tok, float *logits, engine_result *result)
{
    const int n_vocab = e->base.m->hp.n_vocab;
    const int j = e->tok_pos[tok] - s->pos; /* index of this token within the sequence */
    if (s->logits) {
        float *dst = s->logits + (s->logits_all ? (size_t)j * n_vocab : 0);
        memcpy(dst, logits, (size_t)n_vocab * sizeof(float));
    }
    const int n_sample = s->n_sample > 1 ? s->n_sample : 1, k = j - (s->n_tokens - n_sample);
    if (k < 0 || !s->want_token) return;
    const int32_t *hist = e->history + (size_t)s->slot * e->base.cfg.ctx_per_slot;
    const size_t words = ((size_t)n_vocab + 31) / 32;
    sampling_input in = {.logits = logits, .n_vocab = n_vocab, .history = hist,
                         .n_history = s->pos + j + 1, .position = s->pos + j + 1, .sp = s->sp,
                         .allowed = s->allowed ? s->allowed + (size_t)k * words : NULL};
    if (n_sample == 1) {
        sampling_sample(&in, e->sample_scratch, result);
        return;
    }
    sampling_sample(&in, e->sample_scratch, &s->sampled[k]);
    if (k == n_sample - 1 && result) *result = s->sampled[k];
}

/* Final norm + LM head for the rows somebody wants, logits_rows rows at a time. */
static void lm_head(cpu_engine *e, const engine_seq *seqs, int n_out, engine_result *results)
{
    const model *m = e->base.m;
    const int dim = m->hp.n_embd;
    for (int first = 0; first < n_out; first += e->logits_rows) {
        int n = n_out - first < e->logits_rows ? n_out - first : e->logits_rows;
        for (int r = 0; r < n; r++)
            cpu_rmsnorm(e->xb + (size_t)r * dim, e->x + (size_t)e->out_tok[first + r] * dim,
                        m->output_norm.data, dim, m->hp.rms_eps);
        matmul(e, e->logits, e->xb, n, &m->output, NULL);
        if (m->hp.logit_softcap > 0) cpu_softcap(e->logits, n * m->hp.n_vocab, m->hp.logit_softcap);
        for (int r = 0; r < n; r++) {
            int seq = e->out_seq[first + r];
            deliver_row(e, &seqs[seq], e->out_tok[first + r], e->logits + (size_t)r * m->hp.n_vocab,
                        results ? &results[seq] : NULL); /* NULL when nobody wants a token */
        }
    }
}

/* The final hidden states of the sequences that ask: x after the output norm (RMSNorm), or
 * as it is for a family without one (an encoder's last LayerNorm is its layers' own). */
static void deliver_hidden(cpu_engine *e, const engine_seq *seqs, int n_seqs)
{
    const model *m = e->base.m;
    const int dim = m->hp.n_embd;
    for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
        if (!seqs[i].hidden) continue;
        int first, rows = engine_hidden_rows(&seqs[i], &first);
        for (int j = 0; j < rows; j++) {
            float *out = seqs[i].hidden + (size_t)j * dim;
            const float *x = e->x + (size_t)(t + first + j) * dim;
            if (m->output_norm.data) cpu_rmsnorm(out, x, m->output_norm.data, dim, m->hp.rms_eps);
            else memcpy(out, x, (size_t)dim * sizeof(float));
        }
    }
}

static int cpu_step(engine *base, const engine_seq *seqs, int n_seqs, engine_result *results, char *err,
                    size_t errlen)
{
    cpu_engine *e = (cpu_engine *)base;
    if (check_positions(e, seqs, n_seqs, err, errlen) != 0) return ENGINE_EINVAL;
    int n_out;
    int n_tok = plan_batch(e, seqs, n_seqs, &n_out);
    embed_tokens(e, n_tok);
    for (int il = 0; il < base->m->hp.n_layer; il++) forward_layer(e, il, n_tok);
    deliver_hidden(e, seqs, n_seqs);
    lm_head(e, seqs, n_out, results);
    return 0;
}

/* ---- the MTP block (engine.h: engine_mtp_step) ---------------------------------------------- */

/* The batch of an MTP pass: its tokens, positions and block tables, as plan_batch lays out a
 * step's (the row histories are the target's and stay untouched). */
static int plan_mtp(cpu_engine *e, const engine_mtp_seq *seqs, int n_seqs)
{
    int n_tok = 0;
    for (int i = 0; i < n_seqs; i++) {
        const engine_mtp_seq *s = &seqs[i];
        const engine_seq as_seq = {.slot = s->slot, .blocks = s->blocks};
        const int last = (s->pos + s->n_tokens - 1) / ENGINE_KV_BLOCK;
        for (int b = 0; b <= last; b++)
            e->tables[(size_t)i * e->table_width + b] = engine_seq_block(&e->base, &as_seq, b);
        for (int j = 0; j < s->n_tokens; j++, n_tok++) {
            e->tok_id[n_tok] = s->tokens[j];
            e->tok_seq[n_tok] = i;
            e->tok_pos[n_tok] = s->pos + j;
            e->tok_keys[n_tok] = s->pos + s->n_tokens;
        }
    }
    return n_tok;
}

/* x = eh_proj · [rmsnorm(embed(tok)) * enorm | rmsnorm(h) * hnorm] for every token (llama.cpp's
 * graph_mtp: the embedding first). */
static void mtp_input(cpu_engine *e, const engine_mtp_seq *seqs, int n_seqs, int n_tok)
{
    const model *m = e->base.m;
    const size_t dim = (size_t)m->hp.n_embd;
    embed_rows(&m->mtp.embed, e->tok_id, n_tok, e->xb, 1.0f);
    for (int i = 0, t = 0; i < n_seqs; i++) {
        for (int j = 0; j < seqs[i].n_tokens; j++, t++) {
            float *row = e->mtp_in + (size_t)t * 2 * dim;
            cpu_rmsnorm(row, e->xb + (size_t)t * dim, m->mtp.enorm.data, (int)dim, m->hp.rms_eps);
            cpu_rmsnorm(row + dim, seqs[i].hidden + (size_t)j * dim, m->mtp.hnorm.data, (int)dim, m->hp.rms_eps);
        }
    }
    matmul(e, e->x, e->mtp_in, n_tok, &m->mtp.eh_proj, NULL);
}

/* The block's head for the positions whose sequence asks for something (a catch-up asks for
 * nothing: its K/V are what it is for): h' = rmsnorm(x) * head_norm (hidden_out), logits =
 * head · h', their argmax (draft), logits_rows tokens at a time. */
static void mtp_head(cpu_engine *e, const engine_mtp_seq *seqs, int n_tok)
{
    const model *m = e->base.m;
    const int dim = m->hp.n_embd, n_vocab = m->hp.n_vocab;
    int n_out = 0;
    for (int t = 0; t < n_tok; t++) {
        const engine_mtp_seq *s = &seqs[e->tok_seq[t]];
        if (!s->draft && !s->logits && !s->hidden_out) continue;
        cpu_rmsnorm(e->xb + (size_t)n_out * dim, e->x + (size_t)t * dim, m->mtp.head_norm.data, dim, m->hp.rms_eps);
        e->out_tok[n_out++] = t;
    }
    for (int first = 0; first < n_out; first += e->logits_rows) {
        const int n = n_out - first < e->logits_rows ? n_out - first : e->logits_rows;
        matmul(e, e->logits, e->xb + (size_t)first * dim, n, &m->mtp.head, NULL);
        for (int r = 0; r < n; r++) {
            const int t = e->out_tok[first + r];
            const engine_mtp_seq *s = &seqs[e->tok_seq[t]];
            const int j = e->tok_pos[t] - s->pos;
            const float *row = e->logits + (size_t)r * n_vocab, *h = e->xb + (size_t)(first + r) * dim;
            if (s->hidden_out) memcpy(s->hidden_out + (size_t)j * dim, h, (size_t)dim * sizeof(float));
            if (s->logits) memcpy(s->logits + (size_t)j * n_vocab, row, (size_t)n_vocab * sizeof(float));
            if (s->draft) s->draft[j] = sampling_argmax(row, n_vocab);
        }
    }
}

static int cpu_mtp_step(engine *base, const engine_mtp_seq *seqs, int n_seqs, char *err, size_t errlen)
{
    (void)err, (void)errlen; /* engine.c checked the batch: nothing here can fail */
    cpu_engine *e = (cpu_engine *)base;
    const int n_tok = plan_mtp(e, seqs, n_seqs);
    mtp_input(e, seqs, n_seqs, n_tok);
    forward_layer(e, base->m->hp.n_layer, n_tok);
    mtp_head(e, seqs, n_tok);
    return 0;
}

static void cpu_slot_clear(engine *base, int slot)
{
    cpu_engine *e = (cpu_engine *)base;
    /* K/V beyond slot_len are never read, so nothing else to wipe.  State slots are not rows:
     * the scheduler hands them out (a snapshot may sit in the slot of a row's number), and a
     * step at position 0 restarts one. */
    e->slot_len[slot] = 0;
}

/* Copies block src of one pool (its K and V caches, blocks of n floats) into block dst. */
/* value NULL: a latent cache, whose rows are all in key */
static void copy_block(float *key, float *value, size_t n, int dst, int src)
{
    memcpy(key + (size_t)dst * n, key + (size_t)src * n, n * sizeof(float));
    if (value) memcpy(value + (size_t)dst * n, value + (size_t)src * n, n * sizeof(float));
}

static int cpu_kv_copy(engine *base, int dst, int src, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    cpu_engine *e = (cpu_engine *)base;
    copy_block(e->key_cache, e->latent_kv ? NULL : e->value_cache, kv_block_floats(e, false), dst, src);
    return 0;
}

static int cpu_kv_copy_swa(engine *base, int dst, int src, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    cpu_engine *e = (cpu_engine *)base;
    copy_block(e->key_swa, e->value_swa, kv_block_floats(e, true), dst, src);
    return 0;
}

static int cpu_state_copy(engine *base, int dst, int src, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    cpu_engine *e = (cpu_engine *)base;
    memcpy(e->state + (size_t)dst * e->slot_floats, e->state + (size_t)src * e->slot_floats,
           e->slot_floats * sizeof(float));
    e->state_len[dst] = e->state_len[src];
    return 0;
}

static void cpu_destroy(engine *base)
{
    cpu_engine *e = (cpu_engine *)base;
    cpu_pool_free(e->pool);
    void *bufs[] = {e->key_cache, e->value_cache, e->key_swa, e->value_swa, e->kv_swa, e->tables_swa, e->history, e->slot_len, e->tok_id, e->tok_seq,
                    e->tables, e->tok_pos, e->tok_keys, e->out_tok, e->out_seq, e->x, e->xb, e->xb2, e->q, e->k, e->v,
                    e->hb, e->hb2, e->scores, e->logits, e->sample_scratch, e->router, e->moe_ids,
                    e->moe_weights, e->group_tok, e->group_weight, e->group_x, e->group_y, e->ple, e->ple_gate,
                    e->moe_in, e->moe_out, e->state, e->state_len, e->lin_index, e->kv_layer, e->seq_first,
                    e->seq_tokens, e->seq_state, e->ssm_mix, e->ssm_z, e->ssm_beta, e->ssm_g, e->ssm_raw,
                    e->delta_scratch, e->qg, e->shexp_gate, e->mla_q, e->mla_in, e->mla_out, e->mla_att,
                    e->router_choice, e->mtp_in};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(e);
}

static const engine_vtable CPU_VTABLE = {
    .name = "cpu",
    .step = cpu_step,
    .mtp_step = cpu_mtp_step,
    .slot_clear = cpu_slot_clear,
    .kv_copy = cpu_kv_copy,
    .kv_copy_swa = cpu_kv_copy_swa,
    .state_copy = cpu_state_copy,
    .rewinds_state = true, /* tests/sched/test_spec.c: test_hybrid_speculation */
    .destroy = cpu_destroy,
};

/* ---- creation ------------------------------------------------------------------------------ */

typedef struct buffer_request {
    void **ptr;
    const char *what;
    size_t count, elem;
} buffer_request;

static size_t physical_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : SIZE_MAX;
}

/* Refuse buffers larger than the machine before asking for any: with overcommit, calloc of an
 * absurd size may "succeed" and the process dies later instead of reporting.  The limit is on
 * the total, since K and V caches that each fit may not fit together; and nothing is allocated
 * (or touched, as calloc does under MALLOC_PERTURB_) for a configuration that is refused. */
static int allocate_buffers(const buffer_request *req, size_t n, char *err, size_t errlen)
{
    const size_t limit = physical_memory();
    size_t total = 0;
    bool overflow = false;
    for (size_t i = 0; i < n; i++) {
        size_t bytes;
        overflow |= req[i].count == SIZE_MAX || __builtin_mul_overflow(req[i].count, req[i].elem, &bytes) ||
                    __builtin_add_overflow(total, bytes, &total);
    }
    if (overflow || total > limit) {
        double sum = 0, big = -1;
        const char *what = "";
        for (size_t i = 0; i < n; i++) {
            double b = (double)req[i].count * (double)req[i].elem;
            sum += b;
            if (b > big) big = b, what = req[i].what;
        }
        snprintf(err, errlen, "cannot allocate the CPU buffers: %.1f MiB in all (the %s alone %.1f MiB), more "
                 "than this machine's %.1f MiB of memory (lower -np or -c)", sum / 1048576.0, what,
                 big / 1048576.0, (double)limit / 1048576.0);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!(*req[i].ptr = calloc(req[i].count ? req[i].count : 1, req[i].elem))) {
            snprintf(err, errlen, "cannot allocate the CPU %s (%.1f MiB)", req[i].what,
                     (double)req[i].count * (double)req[i].elem / 1048576.0);
            return -1;
        }
    }
    return 0;
}

/* a * b * ... with SIZE_MAX standing for "overflowed" (then refused by allocate_buffers). */
static size_t mul(size_t a, size_t b)
{
    size_t r;
    return a == SIZE_MAX || b == SIZE_MAX || __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

static int check_config(const engine_config *cfg, char *err, size_t errlen)
{
    const struct {
        const char *name;
        int value;
    } fields[] = {{"n_slots", cfg->n_slots}, {"ctx_per_slot", cfg->ctx_per_slot},
                  {"max_batch_tokens", cfg->max_batch_tokens}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (fields[i].value < 1 || fields[i].value > CFG_MAX) {
            snprintf(err, errlen, "engine config: %s = %d is out of range [1, %d]", fields[i].name,
                     fields[i].value, CFG_MAX);
            return -1;
        }
    }
    if (cfg->n_states < 0 || cfg->n_states > CFG_MAX) {
        snprintf(err, errlen, "engine config: n_states = %d is out of range [0, %d]", cfg->n_states, CFG_MAX);
        return -1;
    }
    if (cfg->n_threads < 0 || cfg->n_threads > 1024) {
        snprintf(err, errlen, "engine config: n_threads = %d is out of range [0, 1024]", cfg->n_threads);
        return -1;
    }
    return 0;
}

engine *engine_create_cpu(const model *m, const engine_config *cfg, char *err, size_t errlen)
{
    if (check_config(cfg, err, errlen) != 0 || model_check_features(m, CPU_FEATURES, "cpu", err, errlen) != 0)
        return NULL;
    cpu_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    const model_hparams *hp = &m->hp;
    e->base = (engine){.vt = &CPU_VTABLE, .m = m, .cfg = *cfg};
    if (cfg->mtp && !m->mtp.bound) {
        snprintf(err, errlen, "engine config: mtp: the model has no MTP block (nextn_predict_layers)");
        free(e);
        return NULL;
    }
    /* the layers whose K/V the pool holds: the model's, and its MTP block when it runs */
    const int n_run = hp->n_layer + (cfg->mtp ? 1 : 0);
    /* the widest layer's: Gemma 4's full layers have their own head_dim and kv heads */
    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *ly = &m->layers[il];
        if (hp->n_head * ly->head_dim > e->q_dim) e->q_dim = hp->n_head * ly->head_dim;
        if (ly->n_head_kv * ly->head_dim > e->kv_dim) e->kv_dim = ly->n_head_kv * ly->head_dim;
    }
    int n_threads = cfg->n_threads;
    if (n_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online < 1 ? 1 : online > 256 ? 256 : (int)online;
    }
    /* LM-head rows per pass: one per slot covers every sampled token in one pass; a few more
     * let logits_all requests (tests, tools) share a pass over the output weights.  A step
     * never has more rows than tokens, so max_batch_tokens caps it. */
    const int sample_rows = cfg->n_slots * (1 + (cfg->max_draft > 0 ? cfg->max_draft : 0)); /* verification */
    e->logits_rows = sample_rows > LOGITS_MIN_ROWS ? sample_rows : LOGITS_MIN_ROWS;
    if (e->logits_rows > cfg->max_batch_tokens) e->logits_rows = cfg->max_batch_tokens;

    const size_t B = (size_t)cfg->max_batch_tokens, slots = (size_t)cfg->n_slots, ctx = (size_t)cfg->ctx_per_slot;
    e->table_width = (cfg->ctx_per_slot + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK;
    const int window = engine_swa_pool_window(m, cfg);
    size_t n_lin = 0;
    for (int il = 0; il < n_run; il++) {
        n_lin += m->layers[il].recipe.attn == ARCH_ATTN_LINEAR;
        const bool kv = m->layers[il].recipe.attn != ARCH_ATTN_LINEAR, swa = kv && window && m->layers[il].window;
        e->n_swa_layers += swa;
        e->n_kv_layers += kv && !swa;
        e->latent_kv |= m->layers[il].recipe.attn == ARCH_ATTN_MLA; /* the family's layers all are */
    }
    /* A hybrid's recurrent state, per slot and linear layer: the conv window, then the
     * delta state (v heads of d x d). */
    const size_t n_states = n_lin ? (size_t)(cfg->n_states ? cfg->n_states : cfg->n_slots) : 0;
    if (n_lin) {
        e->ssm_chan = 2 * hp->ssm_groups * hp->ssm_state + hp->ssm_inner;
        e->conv_floats = (size_t)(hp->ssm_conv - 1) * (size_t)e->ssm_chan;
        e->layer_floats = e->conv_floats + (size_t)hp->ssm_vheads * hp->ssm_state * hp->ssm_state;
        e->slot_floats = n_lin * e->layer_floats;
    }
    /* The sliding pool: every row's ring (a window plus a step's tokens, what a NULL table uses
     * and the most one sequence holds at once) and as many windows again for the prefix cache
     * (kvcache.h keeps freed sliding blocks there until they are needed). */
    const size_t n_swa = engine_swa_pool_blocks(cfg, window);
    const size_t swa_bytes = mul(n_swa, 2 * kv_block_floats(e, true) * sizeof(float));
    /* The pool: a memory budget when given (less the sliding pool), else what one slot per
     * sequence used to hold, so the default takes no more memory than before and sharing only
     * adds capacity. */
    size_t n_blocks = mul(slots, (size_t)e->table_width);
    if (cfg->kv_cache_mb) {
        size_t block_bytes = (e->latent_kv ? 1 : 2) * kv_block_floats(e, false) * sizeof(float);
        if (block_bytes == 0) block_bytes = 1; /* no full-attention layer: blocks hold nothing */
        size_t budget = mul(cfg->kv_cache_mb, (size_t)1 << 20);
        n_blocks = budget > swa_bytes ? (budget - swa_bytes) / block_bytes : 0;
        if (n_blocks < 1 || n_blocks > CFG_MAX) {
            snprintf(err, errlen, "--kv-cache-size %zu MiB holds %zu KV blocks of %d tokens (%.2f MiB each) "
                     "beside the sliding layers' %.2f MiB; it must hold 1 to %d", cfg->kv_cache_mb, n_blocks,
                     ENGINE_KV_BLOCK, (double)block_bytes / 1048576.0, (double)swa_bytes / 1048576.0, CFG_MAX);
            cpu_destroy(&e->base);
            return NULL;
        }
    }
    const size_t kv = mul(n_blocks, kv_block_floats(e, false)), kv_swa = mul(n_swa, kv_block_floats(e, true));
    size_t wide = (size_t)(hp->n_embd > e->q_dim ? hp->n_embd : e->q_dim);
    if ((size_t)hp->ssm_inner > wide) wide = (size_t)hp->ssm_inner;
    if ((size_t)hp->n_head * hp->mla_v > wide) wide = (size_t)hp->n_head * hp->mla_v; /* latent attention's output */
    const size_t mla_tok = e->latent_kv ? B : 0;
    size_t mla_in = (size_t)hp->q_lora_rank, mla_out = (size_t)hp->kv_lora_rank;
    if ((size_t)hp->mla_nope > mla_in) mla_in = (size_t)hp->mla_nope;
    if ((size_t)hp->kv_lora_rank > mla_in) mla_in = (size_t)hp->kv_lora_rank;
    if ((size_t)hp->mla_v > mla_out) mla_out = (size_t)hp->mla_v;
    size_t ff = (size_t)(hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp);
    if ((size_t)hp->n_ff_shexp > ff) ff = (size_t)hp->n_ff_shexp;
    if ((size_t)hp->n_embd_ple * hp->n_layer > ff) ff = (size_t)hp->n_embd_ple * hp->n_layer; /* per_layer_inputs */
    bool gated = false;
    for (int il = 0; il < hp->n_layer; il++) gated |= (m->layers[il].recipe.attn_extras & ARCH_ATTN_OUT_GATE) != 0;
    const size_t lin_tok = n_lin ? B : 0, nv = (size_t)hp->ssm_vheads;
    const size_t moe_tok = hp->n_expert ? B : 0; /* the MoE buffers: none for a dense model */
    const size_t ple_tok = hp->n_embd_ple ? B : 0;
    const buffer_request req[] = {
        {(void **)&e->key_cache, "K cache", kv, sizeof(float)},
        {(void **)&e->value_cache, "V cache", e->latent_kv ? 0 : kv, sizeof(float)},
        {(void **)&e->key_swa, "sliding K cache", kv_swa, sizeof(float)},
        {(void **)&e->value_swa, "sliding V cache", kv_swa, sizeof(float)},
        {(void **)&e->tables_swa, "sliding block tables", window ? mul(slots, (size_t)e->table_width) : 0, sizeof(int32_t)},
        {(void **)&e->kv_swa, "layer table", (size_t)n_run, sizeof(bool)},
        {(void **)&e->history, "token history", mul(slots, ctx), sizeof(int32_t)},
        {(void **)&e->slot_len, "slot table", slots, sizeof(int)},
        {(void **)&e->tok_id, "batch tokens", B, sizeof(int32_t)},
        {(void **)&e->tok_seq, "batch sequences", B, sizeof(int)},
        {(void **)&e->tables, "block tables", mul(slots, (size_t)e->table_width), sizeof(int32_t)},
        {(void **)&e->tok_pos, "batch positions", B, sizeof(int)},
        {(void **)&e->tok_keys, "batch sequence lengths", B, sizeof(int)},
        {(void **)&e->out_tok, "LM head rows", B, sizeof(int)},
        {(void **)&e->out_seq, "LM head sequences", B, sizeof(int)},
        {(void **)&e->x, "residual stream", mul(B, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->xb, "activations", mul(B, wide), sizeof(float)},
        {(void **)&e->xb2, "activations", mul(B, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->q, "queries", mul(B, (size_t)e->q_dim), sizeof(float)},
        {(void **)&e->k, "keys", mul(B, (size_t)e->kv_dim), sizeof(float)},
        {(void **)&e->v, "values", mul(B, (size_t)e->kv_dim), sizeof(float)},
        {(void **)&e->hb, "FFN activations", mul(B, ff), sizeof(float)},
        {(void **)&e->hb2, "FFN activations", mul(B, ff), sizeof(float)},
        {(void **)&e->router, "router logits", mul(moe_tok, (size_t)hp->n_expert), sizeof(float)},
        {(void **)&e->moe_ids, "expert choices", mul(moe_tok, (size_t)hp->n_expert_used), sizeof(int32_t)},
        {(void **)&e->moe_weights, "expert weights", mul(moe_tok, (size_t)hp->n_expert_used), sizeof(float)},
        {(void **)&e->group_tok, "expert groups", moe_tok, sizeof(int)},
        {(void **)&e->group_weight, "expert groups", moe_tok, sizeof(float)},
        {(void **)&e->group_x, "expert inputs", mul(moe_tok, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->group_y, "expert outputs", mul(moe_tok, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->moe_in, "expert inputs", mul(moe_tok, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->moe_out, "expert sums", mul(moe_tok, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->ple, "per-layer inputs", mul(ple_tok, (size_t)hp->n_embd_ple * hp->n_layer), sizeof(float)},
        {(void **)&e->ple_gate, "per-layer gates", mul(ple_tok, (size_t)hp->n_embd_ple), sizeof(float)},
        {(void **)&e->kv_layer, "layer table", (size_t)n_run, sizeof(int)},
        {(void **)&e->lin_index, "layer table", (size_t)n_run, sizeof(int)},
        {(void **)&e->state, "recurrent states", mul(n_states, e->slot_floats), sizeof(float)},
        {(void **)&e->state_len, "state table", n_states, sizeof(int)},
        {(void **)&e->seq_first, "batch sequences", slots, sizeof(int)},
        {(void **)&e->seq_tokens, "batch sequences", slots, sizeof(int)},
        {(void **)&e->seq_state, "batch sequences", slots, sizeof(int)},
        {(void **)&e->ssm_mix, "DeltaNet channels", mul(lin_tok, (size_t)e->ssm_chan), sizeof(float)},
        {(void **)&e->ssm_z, "DeltaNet gates", mul(lin_tok, (size_t)hp->ssm_inner), sizeof(float)},
        {(void **)&e->ssm_beta, "DeltaNet betas", mul(lin_tok, nv), sizeof(float)},
        {(void **)&e->ssm_g, "DeltaNet log decays", mul(lin_tok, nv), sizeof(float)},
        {(void **)&e->ssm_raw, "DeltaNet projections", mul(lin_tok, 2 * nv), sizeof(float)},
        {(void **)&e->delta_scratch, "DeltaNet scratch",
         mul((size_t)n_threads, (size_t)cpu_delta_scratch(hp->ssm_state, 0)), sizeof(float)},
        {(void **)&e->qg, "query gates", gated ? mul(B, 2 * (size_t)e->q_dim) : 0, sizeof(float)},
        {(void **)&e->shexp_gate, "shared expert gates", hp->n_ff_shexp ? B : 0, sizeof(float)},
        {(void **)&e->mla_q, "latent attention queries", mul(mla_tok, (size_t)hp->n_head * (hp->mla_nope + hp->n_rot)),
         sizeof(float)},
        {(void **)&e->mla_in, "latent attention inputs", mul(mla_tok, mla_in), sizeof(float)},
        {(void **)&e->mla_out, "latent attention outputs", mul(mla_tok, mla_out), sizeof(float)},
        {(void **)&e->mla_att, "latent attention sums", mul(mla_tok, (size_t)e->q_dim), sizeof(float)},
        {(void **)&e->router_choice, "router groups", hp->n_expert ? (size_t)hp->n_expert + hp->n_expert_groups : 0,
         sizeof(float)},
        {(void **)&e->mtp_in, "MTP inputs", cfg->mtp ? mul(B, 2 * (size_t)hp->n_embd) : 0, sizeof(float)},
        {(void **)&e->scores, "attention scores", mul((size_t)n_threads, ctx), sizeof(float)},
        {(void **)&e->logits, "logits", mul((size_t)e->logits_rows, (size_t)hp->n_vocab), sizeof(float)},
        {&e->sample_scratch, "sampler scratch", sampling_scratch_bytes(hp->n_vocab), 1},
    };
    if (allocate_buffers(req, sizeof req / sizeof req[0], err, errlen) != 0) {
        cpu_destroy(&e->base);
        return NULL;
    }
    if (n_blocks > CFG_MAX || n_swa > CFG_MAX) { /* block ids are ints: only reachable with a machine of petabytes */
        snprintf(err, errlen, "%zu KV blocks, more than %d (lower -np or -c)", n_blocks, CFG_MAX);
        cpu_destroy(&e->base);
        return NULL;
    }
    e->n_blocks = (int)n_blocks;
    e->n_blocks_swa = (int)n_swa; /* below n_blocks x the sliding share: a ring is less than a table */
    e->base.kv_blocks = e->n_blocks;
    e->base.kv_blocks_swa = e->n_blocks_swa;
    e->base.swa_window = window;
    e->base.kv_block_bytes = (e->latent_kv ? 1 : 2) * kv_block_floats(e, false) * sizeof(float);
    e->base.kv_block_bytes_swa = 2 * kv_block_floats(e, true) * sizeof(float);
    for (int il = 0, kv = 0, swa = 0, lin = 0; il < n_run; il++) {
        const bool linear = m->layers[il].recipe.attn == ARCH_ATTN_LINEAR;
        e->kv_swa[il] = !linear && window && m->layers[il].window;
        e->kv_layer[il] = linear ? -1 : e->kv_swa[il] ? swa++ : kv++;
        e->lin_index[il] = linear ? lin++ : -1;
    }
    if (n_lin) {
        e->base.n_states = (int)n_states;
        e->base.state_bytes = e->slot_floats * sizeof(float);
    } else {
        free(e->state); /* calloc'd one float for the empty request: no state without linear layers */
        e->state = NULL;
    }
    e->pool = cpu_pool_create(n_threads);
    if (!e->pool) {
        snprintf(err, errlen, "cannot start %d CPU worker threads", n_threads);
        cpu_destroy(&e->base);
        return NULL;
    }
    return &e->base;
}
