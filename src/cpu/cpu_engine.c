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
    cpu_rope rope;
    int q_dim, kv_dim;

    /* K and V as [block][layer][row][kv_dim]; per row (slot), the tokens fed so far. */
    float *key_cache, *value_cache;
    int n_blocks, table_width; /* pool blocks; blocks of one sequence's table */
    int32_t *history; /* [slot][ctx_per_slot] */
    int *slot_len;    /* tokens of history */

    /* The batch being computed, one entry per token, and the block table of each sequence
     * ([seq][table_width], at most n_slots sequences per step). */
    int32_t *tok_id;
    int *tok_seq, *tok_pos;
    int32_t *tables;
    int *out_tok; /* batch token of each LM-head row */
    int *out_seq; /* its sequence */

    /* Activations, [max_batch_tokens][width]. */
    float *x;       /* residual stream, n_embd */
    float *xb;      /* normed input / attention output, max(n_embd, q_dim) */
    float *xb2;     /* projection output before the residual add, n_embd */
    float *q, *k, *v;
    float *qkv;      /* a fused projection's output, q_dim + 2 kv_dim (empty unless fused) */
    float *hb, *hb2; /* FFN gate and up, the widest GLU's (twice n_ff when fused) */
    /* MoE (empty for dense models): router logits [tok][n_expert], each token's chosen experts
     * and weights [tok][n_expert_used], and one expert's group of tokens: their batch index,
     * weight, gathered inputs and outputs. */
    float *router;
    int32_t *moe_ids;
    float *moe_weights;
    int *group_tok;
    float *group_weight, *group_x, *group_y;
    float *scores;   /* attention scratch, n_threads x ctx_per_slot */
    float *logits;   /* LM head rows, n_slots x n_vocab */
    int logits_rows;
    void *sample_scratch;
} cpu_engine;

static size_t kv_block_floats(const cpu_engine *e)
{
    return (size_t)e->base.m->hp.n_layer * ENGINE_KV_BLOCK * (size_t)e->kv_dim;
}

/* Offset of (block, layer, row) in the K/V caches. */
static size_t kv_index(const cpu_engine *e, int32_t block, int layer, int row)
{
    return (size_t)block * kv_block_floats(e) + ((size_t)layer * ENGINE_KV_BLOCK + (size_t)row) * (size_t)e->kv_dim;
}

/* Where token t's K/V go: its sequence's block of its position. */
static size_t kv_token_index(const cpu_engine *e, int t, int layer)
{
    int p = e->tok_pos[t];
    int32_t block = e->tables[(size_t)e->tok_seq[t] * e->table_width + p / ENGINE_KV_BLOCK];
    return kv_index(e, block, layer, p % ENGINE_KV_BLOCK);
}

/* ---- forward pass ------------------------------------------------------------------------ */

static void embed_tokens(cpu_engine *e, int n_tok)
{
    const model_tensor *emb = &e->base.m->tok_embd;
    for (int t = 0; t < n_tok; t++) {
        const char *row = (const char *)emb->data + (size_t)e->tok_id[t] * emb->row_bytes;
        quant_dequantize_row(emb->type, row, e->x + (size_t)t * emb->ne0, emb->ne0);
    }
}

static void matmul(cpu_engine *e, float *out, const float *x, int n_tok, const model_tensor *w,
                   const model_tensor *bias)
{
    cpu_matmul mm = {.out = out, .x = x, .n_tok = n_tok, .w = w, .bias = bias ? bias->data : NULL};
    cpu_matmul_run(e->pool, &mm);
}

/* ---- blocks: one function each, composed by the layer's recipe (model_layer.recipe) ---- */

/* The recipe features this backend runs; engine creation refuses a model needing others. */
#define CPU_FEATURES                                                                               \
    (ARCH_F_NORM_PRE | ARCH_F_NORM_POST | ARCH_F_NORM_SANDWICH | ARCH_F_ATTN_FULL | ARCH_F_QKV_BIAS |  \
     ARCH_F_QK_NORM | ARCH_F_FFN_GLU | ARCH_F_FFN_MOE | ARCH_F_ACT_SILU | ARCH_F_ROUTER_SOFTMAX_TOPK |         \
     ARCH_F_FUSED_QKV | ARCH_F_FUSED_GATE_UP | ARCH_F_ROUTER_SIGMOID_BIAS | ARCH_F_SHARED_EXPERT |           \
     ARCH_F_ROPE_PARTIAL | ARCH_F_ROPE_LONGROPE)

/* out = rmsnorm(x) * w for n_tok rows of n_embd floats. */
static void norm_rows(const cpu_engine *e, float *out, const float *x, const model_tensor *w, int n_tok)
{
    const int dim = e->base.m->hp.n_embd;
    for (int t = 0; t < n_tok; t++)
        cpu_rmsnorm(out + (size_t)t * dim, x + (size_t)t * dim, w->data, dim, e->base.m->hp.rms_eps);
}

/* QK norm: every head of q and k normalised on its own before RoPE. */
static void head_rmsnorm(float *vec, int n_head, int head_dim, const model_tensor *w, float eps)
{
    for (int h = 0; h < n_head; h++) cpu_rmsnorm(vec + (size_t)h * head_dim, vec + (size_t)h * head_dim, w->data, head_dim, eps);
}

/* q, k, v = w{q,k,v}·xb (+ bias), or split from the rows of one fused wqkv·xb. */
static void project_qkv(cpu_engine *e, const model_layer *ly, int n_tok)
{
    if (ly->recipe.attn_extras & ARCH_ATTN_FUSED_QKV) {
        const size_t q = (size_t)e->q_dim, kv = (size_t)e->kv_dim, w = q + 2 * kv;
        matmul(e, e->qkv, e->xb, n_tok, &ly->wqkv, NULL);
        for (size_t t = 0; t < (size_t)n_tok; t++) {
            memcpy(e->q + t * q, e->qkv + t * w, q * sizeof(float));
            memcpy(e->k + t * kv, e->qkv + t * w + q, kv * sizeof(float));
            memcpy(e->v + t * kv, e->qkv + t * w + q + kv, kv * sizeof(float));
        }
        return;
    }
    const bool bias = ly->recipe.attn_extras & ARCH_ATTN_QKV_BIAS;
    matmul(e, e->q, e->xb, n_tok, &ly->wq, bias ? &ly->bq : NULL);
    matmul(e, e->k, e->xb, n_tok, &ly->wk, bias ? &ly->bk : NULL);
    matmul(e, e->v, e->xb, n_tok, &ly->wv, bias ? &ly->bv : NULL);
}

/* Full causal attention: xb2 = wo · attend(rope(q), rope(k), v) with q, k, v from
 * project_qkv (heads of q and k normed first when the recipe says so). */
static void attention_full(cpu_engine *e, int il, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const model_layer *ly = &e->base.m->layers[il];
    const bool qk_norm = ly->recipe.attn_extras & ARCH_ATTN_QK_NORM;
    const int hd = hp->head_dim;
    project_qkv(e, ly, n_tok);
    for (int t = 0; t < n_tok; t++) {
        float *q = e->q + (size_t)t * e->q_dim, *k = e->k + (size_t)t * e->kv_dim;
        if (qk_norm) {
            head_rmsnorm(q, hp->n_head, hd, &ly->q_norm, hp->rms_eps);
            head_rmsnorm(k, hp->n_head_kv, hd, &ly->k_norm, hp->rms_eps);
        }
        cpu_rope_apply(&e->rope, q, hp->n_head, e->tok_pos[t]);
        cpu_rope_apply(&e->rope, k, hp->n_head_kv, e->tok_pos[t]);
        /* K/V of the whole batch go into the cache before any token attends, so a prompt in
         * one step sees exactly what it would see fed token by token. */
        size_t at = kv_token_index(e, t, il);
        memcpy(e->key_cache + at, k, (size_t)e->kv_dim * sizeof(float));
        memcpy(e->value_cache + at, e->v + (size_t)t * e->kv_dim, (size_t)e->kv_dim * sizeof(float));
    }
    size_t layer_base = kv_index(e, 0, il, 0);
    cpu_attention at = {
        .out = e->xb, .q = e->q,
        .key_cache = e->key_cache + layer_base, .value_cache = e->value_cache + layer_base,
        .block_stride = (long)kv_block_floats(e), .tables = e->tables, .table_width = e->table_width,
        .n_tok = n_tok, .seq = e->tok_seq, .pos = e->tok_pos,
        .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hd,
        .scores = e->scores, .scores_stride = e->base.cfg.ctx_per_slot,
    };
    cpu_attention_run(e->pool, &at);
    matmul(e, e->xb2, e->xb, n_tok, &ly->wo, NULL);
}

/* out = down · (silu(gate·x) * up·x) for n rows of x, gate and up n_ff wide (hb, hb2 hold
 * them); ARCH_ACT_SILU, the one activation run here. */
static void swiglu_ffn(cpu_engine *e, float *out, const float *x, int n, const model_tensor *gate,
                       const model_tensor *up, const model_tensor *down, int n_ff)
{
    matmul(e, e->hb, x, n, gate, NULL);
    matmul(e, e->hb2, x, n, up, NULL);
    cpu_swiglu(e->hb, e->hb2, n * n_ff);
    matmul(e, out, e->hb, n, down, NULL);
}

/* Gated feed-forward: xb2 = w_down · (silu(w_gate·xb) * w_up·xb); with gate and up fused,
 * each row of w_up·xb is [gate | up], n_ff each. */
static void ffn_glu(cpu_engine *e, int il, int n_tok)
{
    const model_layer *ly = &e->base.m->layers[il];
    const size_t n_ff = (size_t)e->base.m->hp.n_ff;
    if (!(ly->recipe.ffn_extras & ARCH_FFN_FUSED_GATE_UP)) {
        swiglu_ffn(e, e->xb2, e->xb, n_tok, &ly->w_gate, &ly->w_up, &ly->w_down, (int)n_ff);
        return;
    }
    matmul(e, e->hb2, e->xb, n_tok, &ly->w_up, NULL);
    for (size_t t = 0; t < (size_t)n_tok; t++) {
        memcpy(e->hb + t * n_ff, e->hb2 + t * 2 * n_ff, n_ff * sizeof(float));
        cpu_swiglu(e->hb + t * n_ff, e->hb2 + t * 2 * n_ff + n_ff, (int)n_ff);
    }
    matmul(e, e->xb2, e->hb, n_tok, &ly->w_down, NULL);
}

/* One expert's SwiGLU over the tokens gathered for it: group_y for the n rows of group_x. */
static void expert_glu(cpu_engine *e, const model_layer *ly, int expert, int n)
{
    const model_tensor gate = model_tensor_slice(&ly->ffn_gate_exps, expert),
                       up = model_tensor_slice(&ly->ffn_up_exps, expert),
                       down = model_tensor_slice(&ly->ffn_down_exps, expert);
    swiglu_ffn(e, e->group_y, e->group_x, n, &gate, &up, &down, e->base.m->hp.n_ff_exp);
}

/* ARCH_FFN_SHARED_EXPERT: xb2 += the shared expert's SwiGLU of xb, every token, unscaled
 * (GLM-4.5; Qwen3-Next's sigmoid-gated one is another flag). */
static void shared_expert(cpu_engine *e, const model_layer *ly, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    swiglu_ffn(e, e->group_y, e->xb, n_tok, &ly->ffn_gate_shexp, &ly->ffn_up_shexp, &ly->ffn_down_shexp,
               hp->n_ff_exp * hp->n_expert_shared);
    for (size_t i = 0; i < (size_t)n_tok * hp->n_embd; i++) e->xb2[i] += e->group_y[i];
}

/* Mixture of experts: xb2 = sum over the k experts the router picks for each token of
 * weight * expert_glu(xb).  Tokens are grouped by expert, so each expert's weights are read
 * once per step for all the tokens routed to it, and an expert nobody picked is not read at
 * all.  A token's sum runs over its experts in id order, whatever else is in the batch. */
static void ffn_moe(cpu_engine *e, int il, int n_tok)
{
    const model_hparams *hp = &e->base.m->hp;
    const model_layer *ly = &e->base.m->layers[il];
    const int dim = hp->n_embd, k = hp->n_expert_used;
    matmul(e, e->router, e->xb, n_tok, &ly->ffn_gate_inp, NULL);
    const cpu_sigmoid_router sigmoid = {.bias = ly->exp_probs_b.data, .n_expert = hp->n_expert, .k = k,
                                        .scale = hp->expert_weights_scale};
    for (int t = 0; t < n_tok; t++) {
        float *logits = e->router + (size_t)t * hp->n_expert;
        int32_t *ids = e->moe_ids + (size_t)t * k;
        float *weights = e->moe_weights + (size_t)t * k;
        if (ly->recipe.router == ARCH_ROUTER_SIGMOID_BIAS) cpu_moe_route_sigmoid(&sigmoid, logits, ids, weights);
        else cpu_moe_route(logits, hp->n_expert, k, ids, weights);
    }
    memset(e->xb2, 0, (size_t)n_tok * dim * sizeof(float));
    for (int x = 0; x < hp->n_expert; x++) {
        int n = 0;
        for (int t = 0; t < n_tok; t++) {
            for (int j = 0; j < k; j++) {
                if (e->moe_ids[(size_t)t * k + j] != x) continue;
                e->group_tok[n] = t;
                e->group_weight[n] = e->moe_weights[(size_t)t * k + j];
                memcpy(e->group_x + (size_t)n * dim, e->xb + (size_t)t * dim, (size_t)dim * sizeof(float));
                n++;
            }
        }
        if (n == 0) continue;
        expert_glu(e, ly, x, n);
        for (int i = 0; i < n; i++) {
            float *out = e->xb2 + (size_t)e->group_tok[i] * dim;
            const float *y = e->group_y + (size_t)i * dim;
            for (int d = 0; d < dim; d++) out[d] += e->group_weight[i] * y[d];
        }
    }
    if (ly->recipe.ffn_extras & ARCH_FFN_SHARED_EXPERT) shared_expert(e, ly, n_tok);
}

/* A block reads xb (n_tok rows of n_embd) and leaves its output in xb2. */
typedef void (*cpu_block)(cpu_engine *e, int il, int n_tok);
static const cpu_block ATTENTION_BLOCKS[] = {[ARCH_ATTN_FULL] = attention_full};
static const cpu_block FFN_BLOCKS[] = {[ARCH_FFN_GLU] = ffn_glu, [ARCH_FFN_MOE] = ffn_moe};

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

/* One layer: x += post(attention(pre(x))); x += post(ffn(pre(x))), the norms and blocks its
 * recipe names. */
static void forward_layer(cpu_engine *e, int il, int n_tok)
{
    const model_layer *ly = &e->base.m->layers[il];
    const arch_layer *r = &ly->recipe;
    const bool pre = r->norm != ARCH_NORM_POST, post = r->norm != ARCH_NORM_PRE;
    residual(e, ATTENTION_BLOCKS[r->attn], pre ? &ly->attn_norm : NULL, post ? &ly->attn_post_norm : NULL, il, n_tok);
    residual(e, FFN_BLOCKS[r->ffn], pre ? &ly->ffn_norm : NULL, post ? &ly->ffn_post_norm : NULL, il, n_tok);
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
        for (int b = 0; b <= (s->pos + s->n_tokens - 1) / ENGINE_KV_BLOCK; b++)
            e->tables[(size_t)i * e->table_width + b] = engine_seq_block(&e->base, s, b);
        for (int j = 0; j < s->n_tokens; j++, n_tok++) {
            e->tok_id[n_tok] = s->tokens[j];
            e->tok_seq[n_tok] = i;
            e->tok_pos[n_tok] = s->pos + j;
            hist[s->pos + j] = s->tokens[j];
            bool last = j == s->n_tokens - 1;
            if ((last && (s->want_token || s->logits)) || (s->logits && s->logits_all)) {
                e->out_tok[*n_out] = n_tok;
                e->out_seq[*n_out] = i;
                (*n_out)++;
            }
        }
        e->slot_len[s->slot] = s->pos + s->n_tokens;
    }
    return n_tok;
}

/* Hand one row of logits to its sequence: copy it out if asked, sample if it is the last. */
static void deliver_row(cpu_engine *e, const engine_seq *s, int tok, float *logits, engine_result *result)
{
    const int n_vocab = e->base.m->hp.n_vocab;
    const int j = e->tok_pos[tok] - s->pos; /* index of this token within the sequence */
    if (s->logits) {
        float *dst = s->logits + (s->logits_all ? (size_t)j * n_vocab : 0);
        memcpy(dst, logits, (size_t)n_vocab * sizeof(float));
    }
    if (j != s->n_tokens - 1 || !s->want_token) return;
    const int32_t *hist = e->history + (size_t)s->slot * e->base.cfg.ctx_per_slot;
    sampling_input in = {.logits = logits, .n_vocab = n_vocab, .history = hist,
                         .n_history = s->pos + s->n_tokens, .position = s->pos + s->n_tokens, .sp = s->sp,
                         .allowed = s->allowed};
    sampling_sample(&in, e->sample_scratch, result);
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
        for (int r = 0; r < n; r++) {
            int seq = e->out_seq[first + r];
            deliver_row(e, &seqs[seq], e->out_tok[first + r], e->logits + (size_t)r * m->hp.n_vocab,
                        results ? &results[seq] : NULL); /* NULL when nobody wants a token */
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
    lm_head(e, seqs, n_out, results);
    return 0;
}

static void cpu_slot_clear(engine *base, int slot)
{
    cpu_engine *e = (cpu_engine *)base;
    e->slot_len[slot] = 0; /* K/V beyond slot_len are never read, so nothing else to wipe */
}

static int cpu_kv_copy(engine *base, int dst, int src, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    cpu_engine *e = (cpu_engine *)base;
    size_t n = kv_block_floats(e);
    memcpy(e->key_cache + (size_t)dst * n, e->key_cache + (size_t)src * n, n * sizeof(float));
    memcpy(e->value_cache + (size_t)dst * n, e->value_cache + (size_t)src * n, n * sizeof(float));
    return 0;
}

static void cpu_destroy(engine *base)
{
    cpu_engine *e = (cpu_engine *)base;
    cpu_pool_free(e->pool);
    void *bufs[] = {e->key_cache, e->value_cache, e->history, e->slot_len, e->tok_id, e->tok_seq,
                    e->tables, e->tok_pos, e->out_tok, e->out_seq, e->x, e->xb, e->xb2, e->q, e->k, e->v, e->qkv,
                    e->hb, e->hb2, e->scores, e->logits, e->sample_scratch, e->router, e->moe_ids,
                    e->moe_weights, e->group_tok, e->group_weight, e->group_x, e->group_y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(e);
}

static const engine_vtable CPU_VTABLE = {
    .name = "cpu",
    .step = cpu_step,
    .slot_clear = cpu_slot_clear,
    .kv_copy = cpu_kv_copy,
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
    e->q_dim = hp->n_head * hp->head_dim;
    e->kv_dim = hp->n_head_kv * hp->head_dim;
    /* LongRoPE: the short factors serve contexts up to the original one, the long ones a
     * longer context (chosen once for the engine's context, as llama.cpp does). */
    const bool long_ctx = hp->n_ctx_orig && cfg->ctx_per_slot > hp->n_ctx_orig;
    const model_tensor *factors = long_ctx && m->rope_factors_long.data    ? &m->rope_factors_long
                                  : m->rope_factors_short.data ? &m->rope_factors_short
                                                               : &m->rope_freqs;
    e->rope = (cpu_rope){.head_dim = hp->head_dim, .n_rot = hp->n_rot, .attn_factor = hp->rope_attn_factor,
                         .neox = hp->rope_neox, .base = hp->rope_base, .scale = hp->rope_scale,
                         .freq_div = factors->data};
    int n_threads = cfg->n_threads;
    if (n_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online < 1 ? 1 : online > 256 ? 256 : (int)online;
    }
    /* LM-head rows per pass: one per slot covers every sampled token in one pass; a few more
     * let logits_all requests (tests, tools) share a pass over the output weights.  A step
     * never has more rows than tokens, so max_batch_tokens caps it. */
    e->logits_rows = cfg->n_slots > LOGITS_MIN_ROWS ? cfg->n_slots : LOGITS_MIN_ROWS;
    if (e->logits_rows > cfg->max_batch_tokens) e->logits_rows = cfg->max_batch_tokens;

    const size_t B = (size_t)cfg->max_batch_tokens, slots = (size_t)cfg->n_slots, ctx = (size_t)cfg->ctx_per_slot;
    e->table_width = (cfg->ctx_per_slot + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK;
    /* The pool: a memory budget when given, else what one slot per sequence used to hold, so
     * the default takes no more memory than before and sharing only adds capacity. */
    size_t n_blocks = mul(slots, (size_t)e->table_width);
    if (cfg->kv_cache_mb) {
        size_t block_bytes = 2 * kv_block_floats(e) * sizeof(float);
        n_blocks = mul(cfg->kv_cache_mb, (size_t)1 << 20) / block_bytes;
        if (n_blocks < 1 || n_blocks > CFG_MAX) {
            snprintf(err, errlen, "--kv-cache-size %zu MiB holds %zu KV blocks of %d tokens (%.2f MiB each); "
                     "it must hold 1 to %d", cfg->kv_cache_mb, n_blocks, ENGINE_KV_BLOCK,
                     (double)block_bytes / 1048576.0, CFG_MAX);
            cpu_destroy(&e->base);
            return NULL;
        }
    }
    const size_t kv = mul(n_blocks, kv_block_floats(e));
    const size_t wide = (size_t)(hp->n_embd > e->q_dim ? hp->n_embd : e->q_dim);
    bool fused_qkv = false, fused_gate_up = false;
    for (int il = 0; il < hp->n_layer; il++) {
        fused_qkv |= (m->layers[il].recipe.attn_extras & ARCH_ATTN_FUSED_QKV) != 0;
        fused_gate_up |= (m->layers[il].recipe.ffn_extras & ARCH_FFN_FUSED_GATE_UP) != 0;
    }
    const size_t shexp = (size_t)hp->n_ff_exp * (size_t)hp->n_expert_shared;
    size_t ff = (size_t)(hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp);
    if (shexp > ff) ff = shexp;
    if (fused_gate_up) ff = 2 * (size_t)hp->n_ff > ff ? 2 * (size_t)hp->n_ff : ff;
    const size_t qkv = fused_qkv ? (size_t)e->q_dim + 2 * (size_t)e->kv_dim : 0;
    const size_t moe_tok = hp->n_expert ? B : 0; /* the MoE buffers: none for a dense model */
    const buffer_request req[] = {
        {(void **)&e->key_cache, "K cache", kv, sizeof(float)},
        {(void **)&e->value_cache, "V cache", kv, sizeof(float)},
        {(void **)&e->history, "token history", mul(slots, ctx), sizeof(int32_t)},
        {(void **)&e->slot_len, "slot table", slots, sizeof(int)},
        {(void **)&e->tok_id, "batch tokens", B, sizeof(int32_t)},
        {(void **)&e->tok_seq, "batch sequences", B, sizeof(int)},
        {(void **)&e->tables, "block tables", mul(slots, (size_t)e->table_width), sizeof(int32_t)},
        {(void **)&e->tok_pos, "batch positions", B, sizeof(int)},
        {(void **)&e->out_tok, "LM head rows", B, sizeof(int)},
        {(void **)&e->out_seq, "LM head sequences", B, sizeof(int)},
        {(void **)&e->x, "residual stream", mul(B, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->xb, "activations", mul(B, wide), sizeof(float)},
        {(void **)&e->xb2, "activations", mul(B, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->q, "queries", mul(B, (size_t)e->q_dim), sizeof(float)},
        {(void **)&e->k, "keys", mul(B, (size_t)e->kv_dim), sizeof(float)},
        {(void **)&e->v, "values", mul(B, (size_t)e->kv_dim), sizeof(float)},
        {(void **)&e->qkv, "fused qkv", mul(B, qkv), sizeof(float)},
        {(void **)&e->hb, "FFN activations", mul(B, ff), sizeof(float)},
        {(void **)&e->hb2, "FFN activations", mul(B, ff), sizeof(float)},
        {(void **)&e->router, "router logits", mul(moe_tok, (size_t)hp->n_expert), sizeof(float)},
        {(void **)&e->moe_ids, "expert choices", mul(moe_tok, (size_t)hp->n_expert_used), sizeof(int32_t)},
        {(void **)&e->moe_weights, "expert weights", mul(moe_tok, (size_t)hp->n_expert_used), sizeof(float)},
        {(void **)&e->group_tok, "expert groups", moe_tok, sizeof(int)},
        {(void **)&e->group_weight, "expert groups", moe_tok, sizeof(float)},
        {(void **)&e->group_x, "expert inputs", mul(moe_tok, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->group_y, "expert outputs", mul(moe_tok, (size_t)hp->n_embd), sizeof(float)},
        {(void **)&e->scores, "attention scores", mul((size_t)n_threads, ctx), sizeof(float)},
        {(void **)&e->logits, "logits", mul((size_t)e->logits_rows, (size_t)hp->n_vocab), sizeof(float)},
        {&e->sample_scratch, "sampler scratch", sampling_scratch_bytes(hp->n_vocab), 1},
    };
    if (allocate_buffers(req, sizeof req / sizeof req[0], err, errlen) != 0) {
        cpu_destroy(&e->base);
        return NULL;
    }
    if (n_blocks > CFG_MAX) { /* block ids are ints: only reachable with a machine of petabytes */
        snprintf(err, errlen, "%zu KV blocks, more than %d (lower -np or -c)", n_blocks, CFG_MAX);
        cpu_destroy(&e->base);
        return NULL;
    }
    e->n_blocks = (int)n_blocks;
    e->base.kv_blocks = e->n_blocks;
    e->pool = cpu_pool_create(n_threads);
    if (!e->pool) {
        snprintf(err, errlen, "cannot start %d CPU worker threads", n_threads);
        cpu_destroy(&e->base);
        return NULL;
    }
    return &e->base;
}
