/* cpu_ops.c - float32 kernels of the CPU forward pass (see cpu_ops.h). */
#include "cpu_ops.h"

#include <math.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/quant.h"

void cpu_rmsnorm(float *out, const float *x, const float *weight, int n, float eps)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = weight[i] * (scale * x[i]);
}

void cpu_softmax(float *x, int n)
{
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* The k largest of score[x] + (bias ? bias[x] : 0) into ids, ties to the lower id. */
static void top_k(const float *score, const float *bias, int n, int k, int32_t *ids)
{
    for (int j = 0; j < k; j++) { /* k is small (2..8): k passes beat a sort */
        int best = -1;
        float best_v = 0.0f;
        for (int x = 0; x < n; x++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= ids[i] == x;
            float v = score[x] + (bias ? bias[x] : 0.0f);
            if (!taken && (best < 0 || v > best_v)) best = x, best_v = v;
        }
        ids[j] = best;
    }
}

/* weights[j] = score[ids[j]] * scale / their sum. */
static void renormalise(const float *score, const int32_t *ids, int k, float scale, float *weights)
{
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += weights[j] = score[ids[j]];
    for (int j = 0; j < k; j++) weights[j] = weights[j] / sum * scale;
}

void cpu_moe_route(float *logits, int n_expert, int k, int32_t *ids, float *weights)
{
    cpu_softmax(logits, n_expert);
    top_k(logits, NULL, n_expert, k, ids);
    renormalise(logits, ids, k, 1.0f, weights);
}

void cpu_moe_route_sigmoid(const cpu_sigmoid_router *r, float *logits, int32_t *ids, float *weights)
{
    for (int x = 0; x < r->n_expert; x++) logits[x] = 1.0f / (1.0f + expf(-logits[x]));
    top_k(logits, r->bias, r->n_expert, r->k, ids);
    renormalise(logits, ids, r->k, r->scale, weights);
}

void cpu_swiglu(float *x, const float *y, int n)
{
    for (int i = 0; i < n; i++) x[i] = x[i] * (1.0f / (1.0f + expf(-x[i]))) * y[i];
}

static void matmul_rows(void *ctx, int begin, int end, int thread)
{
    (void)thread;
    const cpu_matmul *mm = ctx;
    const model_tensor *w = mm->w;
    const char *rows = w->data;
    for (int r = begin; r < end; r++) {
        const void *row = rows + (size_t)r * w->row_bytes;
        float b = mm->bias ? mm->bias[r] : 0.0f;
        for (int t = 0; t < mm->n_tok; t++)
            mm->out[(size_t)t * w->ne1 + r] = quant_dot_row(w->type, row, mm->x + (size_t)t * w->ne0, w->ne0) + b;
    }
}

/* Below this many multiply-adds a hand-off to the workers (a few microseconds of wake-up)
 * costs more than it saves: the caller computes alone.  Results are the same either way. */
#define PARALLEL_MIN_WORK (64 * 1024)

void cpu_matmul_run(cpu_pool *pool, const cpu_matmul *mm)
{
    if (mm->w->ne0 * mm->w->ne1 * mm->n_tok < PARALLEL_MIN_WORK)
        matmul_rows((void *)mm, 0, (int)mm->w->ne1, 0);
    else
        cpu_pool_run(pool, matmul_rows, (void *)mm, (int)mm->w->ne1);
}

void cpu_rope_apply(const cpu_rope *r, float *vec, int n_head, int pos)
{
    const int half = r->n_rot / 2;
    const float p = (float)pos / r->scale;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf(r->base, (float)(2 * i) / (float)r->n_rot);
        if (r->freq_div) freq /= r->freq_div[i];
        float angle = p * freq, c = cosf(angle) * r->attn_factor, s = sinf(angle) * r->attn_factor;
        /* Element pair that this frequency turns: adjacent (llama) or half a head apart. */
        int a = r->neox ? i : 2 * i, b = r->neox ? i + half : 2 * i + 1;
        for (int h = 0; h < n_head; h++) {
            float *v = vec + (size_t)h * r->head_dim;
            float v0 = v[a], v1 = v[b];
            v[a] = v0 * c - v1 * s;
            v[b] = v0 * s + v1 * c;
        }
    }
}

/* Offset of position j's row in this layer of the caches. */
static size_t kv_row(const cpu_attention *at, const int32_t *table, int j)
{
    return (size_t)table[j / ENGINE_KV_BLOCK] * (size_t)at->block_stride +
           (size_t)(j % ENGINE_KV_BLOCK) * (size_t)(at->n_head_kv * at->head_dim);
}

static void attention_items(void *ctx, int begin, int end, int thread)
{
    const cpu_attention *at = ctx;
    const int hd = at->head_dim, q_dim = at->n_head * hd;
    const int group = at->n_head / at->n_head_kv;
    const float sqrt_hd = sqrtf((float)hd);
    float *att = at->scores + (size_t)thread * at->scores_stride;
    for (int item = begin; item < end; item++) {
        int t = item / at->n_head, h = item % at->n_head;
        const float *q = at->q + (size_t)t * q_dim + (size_t)h * hd;
        const int32_t *table = at->tables + (size_t)at->seq[t] * at->table_width;
        const size_t head = (size_t)(h / group) * hd;
        int n_pos = at->pos[t] + 1;
        for (int j = 0; j < n_pos; j++) {
            const float *k = at->key_cache + kv_row(at, table, j) + head;
            float score = 0.0f;
            for (int i = 0; i < hd; i++) score += q[i] * k[i];
            att[j] = score / sqrt_hd;
        }
        cpu_softmax(att, n_pos);
        float *out = at->out + (size_t)t * q_dim + (size_t)h * hd;
        for (int i = 0; i < hd; i++) out[i] = 0.0f;
        for (int j = 0; j < n_pos; j++) {
            const float *v = at->value_cache + kv_row(at, table, j) + head;
            for (int i = 0; i < hd; i++) out[i] += att[j] * v[i];
        }
    }
}

void cpu_attention_run(cpu_pool *pool, const cpu_attention *at)
{
    int64_t work = 0; /* query-key products */
    for (int t = 0; t < at->n_tok; t++) work += (int64_t)(at->pos[t] + 1) * at->n_head * at->head_dim;
    if (work < PARALLEL_MIN_WORK)
        attention_items((void *)at, 0, at->n_tok * at->n_head, 0);
    else
        cpu_pool_run(pool, attention_items, (void *)at, at->n_tok * at->n_head);
}
