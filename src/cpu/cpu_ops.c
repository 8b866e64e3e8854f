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

/* The k largest of n values (ties: the lower index) into ids[0..k), largest first. */
static void top_k(const float *v, int n, int k, int32_t *ids)
{
    for (int j = 0; j < k; j++) { /* k is small (2..8): k passes beat a sort */
        int best = -1;
        for (int x = 0; x < n; x++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= ids[i] == x;
            if (!taken && (best < 0 || v[x] > v[best])) best = x;
        }
        ids[j] = best;
    }
}

void cpu_moe_route(float *logits, int n_expert, int k, int32_t *ids, float *weights)
{
    cpu_softmax(logits, n_expert);
    top_k(logits, n_expert, k, ids);
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += weights[j] = logits[ids[j]];
    for (int j = 0; j < k; j++) weights[j] /= sum;
}

void cpu_moe_route_topk_softmax(const float *logits, int n_expert, int k, int32_t *ids, float *weights)
{
    top_k(logits, n_expert, k, ids);
    for (int j = 0; j < k; j++) weights[j] = logits[ids[j]];
    cpu_softmax(weights, k);
}

void cpu_swiglu(float *x, const float *y, int n)
{
    for (int i = 0; i < n; i++) x[i] = x[i] * (1.0f / (1.0f + expf(-x[i]))) * y[i];
}

void cpu_geglu(float *x, const float *y, int n)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + tanhf(c * (x[i] + 0.044715f * x[i] * x[i] * x[i]))) * y[i];
}

void cpu_swiglu_clamp(float *x, const float *y, int n)
{
    const float limit = 7.0f, alpha = 1.702f; /* gpt-oss's swiglu_limit and alpha */
    for (int i = 0; i < n; i++) {
        float g = fminf(x[i], limit), u = fminf(fmaxf(y[i], -limit), limit);
        x[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
    }
}

void cpu_softcap(float *x, int n, float cap)
{
    for (int i = 0; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
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
    const int half = r->head_dim / 2;
    const float p = (float)pos / r->scale;
    const float mscale = r->yarn_factor > 0 ? r->yarn_attn_factor : 1.0f;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf(r->base, (float)(2 * i) / (float)r->head_dim);
        if (r->yarn_factor > 0) {
            float ramp = fminf(fmaxf(((float)i - r->yarn_low) / (r->yarn_high - r->yarn_low), 0.0f), 1.0f);
            freq = freq / r->yarn_factor * ramp + freq * (1.0f - ramp);
        }
        if (r->freq_div) freq /= r->freq_div[i];
        float angle = p * freq, c = cosf(angle) * mscale, s = sinf(angle) * mscale;
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

/* Softmax of x[0..n) with one more logit, `sink`, in the denominator: the sink takes its
 * share of the probability and adds no value. */
static void softmax_with_sink(float *x, int n, float sink)
{
    float max = sink;
    for (int i = 0; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = expf(sink - max);
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

static void attention_items(void *ctx, int begin, int end, int thread)
{
    const cpu_attention *at = ctx;
    const int hd = at->head_dim, q_dim = at->n_head * hd;
    const int group = at->n_head / at->n_head_kv;
    float *att = at->scores + (size_t)thread * at->scores_stride;
    for (int item = begin; item < end; item++) {
        int t = item / at->n_head, h = item % at->n_head;
        const float *q = at->q + (size_t)t * q_dim + (size_t)h * hd;
        const int32_t *table = at->tables + (size_t)at->seq[t] * at->table_width;
        const size_t head = (size_t)(h / group) * hd;
        const int first = at->window && at->pos[t] >= at->window ? at->pos[t] - at->window + 1 : 0;
        const int n_pos = at->pos[t] + 1 - first;
        for (int j = 0; j < n_pos; j++) {
            const float *k = at->key_cache + kv_row(at, table, first + j) + head;
            float score = 0.0f;
            for (int i = 0; i < hd; i++) score += q[i] * k[i];
            att[j] = score / at->score_div;
        }
        if (at->sinks) softmax_with_sink(att, n_pos, at->sinks[h]);
        else cpu_softmax(att, n_pos);
        float *out = at->out + (size_t)t * q_dim + (size_t)h * hd;
        for (int i = 0; i < hd; i++) out[i] = 0.0f;
        for (int j = 0; j < n_pos; j++) {
            const float *v = at->value_cache + kv_row(at, table, first + j) + head;
            for (int i = 0; i < hd; i++) out[i] += att[j] * v[i];
        }
    }
}

void cpu_attention_run(cpu_pool *pool, const cpu_attention *at)
{
    int64_t work = 0; /* query-key products */
    for (int t = 0; t < at->n_tok; t++) {
        int n_pos = at->window && at->pos[t] >= at->window ? at->window : at->pos[t] + 1;
        work += (int64_t)n_pos * at->n_head * at->head_dim;
    }
    if (work < PARALLEL_MIN_WORK)
        attention_items((void *)at, 0, at->n_tok * at->n_head, 0);
    else
        cpu_pool_run(pool, attention_items, (void *)at, at->n_tok * at->n_head);
}
