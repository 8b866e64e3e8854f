/* cpu_ops.c - float32 kernels of the CPU forward pass (see cpu_ops.h). */
#include "cpu_ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "model/quant.h"

void cpu_rmsnorm(float *out, const float *x, const float *weight, int n, float eps)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    if (weight)
        for (int i = 0; i < n; i++) out[i] = weight[i] * (scale * x[i]);
    else
        for (int i = 0; i < n; i++) out[i] = scale * x[i];
}

void cpu_layernorm(float *out, const float *x, const float *weight, const float *bias, int n, float eps)
{
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
    double scale = 1.0 / sqrt(var / n + (double)eps);
    for (int i = 0; i < n; i++) out[i] = (float)(((double)x[i] - mean) * scale) * weight[i] + bias[i];
}

void cpu_gelu_erf(float *x, int n)
{
    for (int i = 0; i < n; i++) x[i] = (float)(0.5 * x[i] * (1.0 + erf(x[i] * M_SQRT1_2)));
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

/* The k largest of v[x] + (bias ? bias[x] : 0) over n values (ties: the lower index) into
 * ids[0..k), largest first. */
static void top_k(const float *v, const float *bias, int n, int k, int32_t *ids)
{
    for (int j = 0; j < k; j++) { /* k is small (2..8): k passes beat a sort */
        int best = -1;
        float best_v = 0.0f;
        for (int x = 0; x < n; x++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= ids[i] == x;
            const float vx = v[x] + (bias ? bias[x] : 0.0f);
            if (!taken && (best < 0 || vx > best_v)) best = x, best_v = vx;
        }
        ids[j] = best;
    }
}

/* weights[j] = v[ids[j]] / their sum * scale. */
static void renormalise(const float *v, const int32_t *ids, int k, float scale, float *weights)
{
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += weights[j] = v[ids[j]];
    for (int j = 0; j < k; j++) weights[j] = weights[j] / sum * scale;
}

void cpu_moe_route(float *logits, int n_expert, int k, int32_t *ids, float *weights)
{
    cpu_softmax(logits, n_expert);
    top_k(logits, NULL, n_expert, k, ids);
    renormalise(logits, ids, k, 1.0f, weights);
}

/* A group's score over its n biased scores v: the sum of its two best, or its best (max_only). */
static float group_score(const float *v, int n, bool max_only)
{
    float first = v[0], second = -INFINITY;
    for (int i = 1; i < n; i++) {
        if (v[i] > first) second = first, first = v[i];
        else if (v[i] > second) second = v[i];
    }
    return max_only || n < 2 ? first : first + second;
}

/* choice[x] = scores[x] + bias[x] inside the topk_group best groups, 0 outside.  The group
 * scores sit after the n_expert choices; a kept group's is set to -inf as it is taken (the
 * scores are finite), so the next pass takes the best of the rest. */
static void group_mask(const cpu_score_router *r, const float *scores)
{
    const int per = r->n_expert / r->n_group;
    float *best = r->choice + r->n_expert;
    for (int x = 0; x < r->n_expert; x++) r->choice[x] = scores[x] + (r->bias ? r->bias[x] : 0.0f);
    for (int g = 0; g < r->n_group; g++) best[g] = group_score(r->choice + (size_t)g * per, per, r->softmax);
    for (int j = 0; j < r->topk_group; j++) {
        int top = 0;
        for (int g = 1; g < r->n_group; g++)
            if (best[g] > best[top]) top = g;
        best[top] = -INFINITY;
    }
    for (int g = 0; g < r->n_group; g++)
        if (best[g] != -INFINITY)
            for (int x = g * per; x < (g + 1) * per; x++) r->choice[x] = 0.0f;
}

void cpu_moe_route_scored(const cpu_score_router *r, float *logits, int32_t *ids, float *weights)
{
    if (r->softmax) cpu_softmax(logits, r->n_expert);
    else
        for (int x = 0; x < r->n_expert; x++) logits[x] = 1.0f / (1.0f + expf(-logits[x]));
    if (r->n_group > 1) {
        group_mask(r, logits);
        top_k(r->choice, NULL, r->n_expert, r->k, ids);
    } else {
        top_k(logits, r->bias, r->n_expert, r->k, ids);
    }
    if (r->raw)
        for (int j = 0; j < r->k; j++) weights[j] = logits[ids[j]] * r->scale;
    else renormalise(logits, ids, r->k, r->scale, weights);
}

void cpu_moe_route_topk_softmax(const float *logits, int n_expert, int k, int32_t *ids, float *weights)
{
    top_k(logits, NULL, n_expert, k, ids);
    for (int j = 0; j < k; j++) weights[j] = logits[ids[j]];
    cpu_softmax(weights, k);
}

void cpu_swiglu(float *x, const float *y, int n)
{
    for (int i = 0; i < n; i++) x[i] = x[i] * (1.0f / (1.0f + expf(-x[i]))) * y[i];
}

/* The exact tanh GELU (transformers' gelu_pytorch_tanh). */
static float gelu_tanh(float x)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

void cpu_geglu(float *x, const float *y, int n)
{
    for (int i = 0; i < n; i++) x[i] = gelu_tanh(x[i]) * y[i];
}

void cpu_geglu_erf(float *x, const float *y, int n)
{
    cpu_gelu_erf(x, n);
    for (int i = 0; i < n; i++) x[i] *= y[i];
}

void cpu_gelu(float *x, int n)
{
    for (int i = 0; i < n; i++) x[i] = gelu_tanh(x[i]);
}

void cpu_swiglu_clamp(float *x, const float *y, int n)
{
    const float limit = ARCH_SWIGLU_CLAMP_LIMIT, alpha = ARCH_SWIGLU_CLAMP_ALPHA; /* gpt-oss's swiglu_limit and alpha */
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
    const int rot = r->n_rot ? r->n_rot : r->head_dim, half = rot / 2;
    const float p = (float)pos / r->scale;
    const float mscale = r->attn_factor != 0.0f ? r->attn_factor : 1.0f;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf(r->base, (float)(2 * i) / (float)rot);
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
           (size_t)(j % ENGINE_KV_BLOCK) * (size_t)at->row_stride;
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

/* ALiBi's slope of head h of n (ggml_soft_max_ext's): m0^(h+1) for the first 2^floor(log2 n)
 * heads, m0 = 2^(-max_bias / that power), then the odd powers of m1 = 2^(-max_bias / 2 / it). */
static float alibi_slope(int h, int n_head, float max_bias)
{
    int n_log2 = 1;
    while (n_log2 * 2 <= n_head) n_log2 *= 2;
    const double m0 = pow(2.0, -max_bias / n_log2), m1 = pow(2.0, -max_bias / 2.0 / n_log2);
    return (float)(h < n_log2 ? pow(m0, h + 1) : pow(m1, 2 * (h - n_log2) + 1));
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
        const int end = at->n_keys ? at->n_keys[t] : at->pos[t] + 1; /* keys before end */
        const int first = at->window && at->pos[t] >= at->window ? at->pos[t] - at->window + 1 : 0;
        const int n_pos = end - first;
        const float slope = at->alibi_max > 0 ? alibi_slope(h, at->n_head, at->alibi_max) : 0.0f;
        for (int j = 0; j < n_pos; j++) {
            const float *k = at->key_cache + kv_row(at, table, first + j) + head;
            float score = 0.0f;
            for (int i = 0; i < hd; i++) score += q[i] * k[i];
            att[j] = score / at->score_div - slope * (float)abs(at->pos[t] - (first + j));
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
        const int end = at->n_keys ? at->n_keys[t] : at->pos[t] + 1;
        const int first = at->window && at->pos[t] >= at->window ? at->pos[t] - at->window + 1 : 0;
        work += (int64_t)(end - first) * at->n_head * at->head_dim;
    }
    if (work < PARALLEL_MIN_WORK)
        attention_items((void *)at, 0, at->n_tok * at->n_head, 0);
    else
        cpu_pool_run(pool, attention_items, (void *)at, at->n_tok * at->n_head);
}

void cpu_conv1d_step(float *x, float *window, const float *w, int chan, int taps)
{
    for (int c = 0; c < chan; c++) {
        const float *wc = w + (size_t)c * taps;
        float acc = 0.0f;
        for (int j = 0; j < taps - 1; j++) acc += wc[j] * window[(size_t)j * chan + c];
        acc += wc[taps - 1] * x[c];
        for (int j = 0; j + 1 < taps - 1; j++) window[(size_t)j * chan + c] = window[(size_t)(j + 1) * chan + c];
        if (taps > 1) window[(size_t)(taps - 2) * chan + c] = x[c];
        x[c] = acc / (1.0f + expf(-acc));
    }
}

void cpu_l2norm(float *x, int n)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

long cpu_delta_scratch(int d, int chunk) { return chunk ? (long)chunk * (2 + chunk + 3 * (long)d) : d; }

/* The head's state, q/k head and the rows of token t (delta_head, delta_head_chunked). */
static float *head_state(const cpu_delta *dr, int seq, int h)
{
    return dr->state + (size_t)dr->seq_state[seq] * (size_t)dr->slot_stride + (size_t)dr->layer_off +
           (size_t)h * dr->d * dr->d;
}

static int k_head_of(const cpu_delta *dr, int h)
{
    const int per_k = dr->v_heads / dr->k_heads;
    return dr->grouped ? h / per_k : h % dr->k_heads;
}

static const float *token_vec(const cpu_delta *dr, int t, long off, int head)
{
    return dr->qkv + (size_t)t * (size_t)dr->stride + (size_t)off + (size_t)head * dr->d;
}

/* One v head of one sequence through its tokens, one at a time. */
static void delta_head(const cpu_delta *dr, int seq, int h, float *kv)
{
    const int d = dr->d, kh = k_head_of(dr, h);
    float *S = head_state(dr, seq, h);
    for (int t = dr->seq_first[seq]; t < dr->seq_first[seq] + dr->seq_tokens[seq]; t++) {
        const float *q = token_vec(dr, t, dr->q_off, kh), *k = token_vec(dr, t, dr->k_off, kh);
        const float *v = token_vec(dr, t, dr->v_off, h);
        const float decay = expf(dr->g[(size_t)t * dr->v_heads + h]), beta = dr->beta[(size_t)t * dr->v_heads + h];
        for (int j = 0; j < d; j++) kv[j] = 0.0f;
        for (int i = 0; i < d; i++) { /* S = decay S, and kv = S^T k of the decayed state */
            float *Si = S + (size_t)i * d;
            for (int j = 0; j < d; j++) {
                Si[j] *= decay;
                kv[j] += Si[j] * k[i];
            }
        }
        for (int j = 0; j < d; j++) kv[j] = beta * (v[j] - kv[j]); /* now the update's delta */
        float *o = dr->out + (size_t)t * dr->v_heads * d + (size_t)h * d;
        for (int j = 0; j < d; j++) o[j] = 0.0f;
        for (int i = 0; i < d; i++) {
            float *Si = S + (size_t)i * d;
            for (int j = 0; j < d; j++) {
                Si[j] += k[i] * kv[j];
                o[j] += Si[j] * q[i];
            }
        }
    }
}

static float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One chunk of n tokens from token t0 with the state S0 it starts from.  G: the cumulative log
 * decay; T: (I - A)^-1 - I for A[a][b] = -beta_a (k_a . k_b) exp(G_a - G_b), b < a, by forward
 * substitution (the UT transform); then U = (I + T) beta v and W = (I + T) beta exp(G) k, the
 * chunk's new values v_new = U - W S0, its outputs exp(G_a) q_a S0 + sum over b <= a of
 * (q_a . k_b) exp(G_a - G_b) v_new_b, and the state after it,
 * S0 exp(G_last) + sum over b of k_b exp(G_last - G_b) v_new_b^T. */
static void delta_chunk(const cpu_delta *dr, int h, int t0, int n, float *S, float *scratch)
{
    const int d = dr->d, C = dr->chunk, kh = k_head_of(dr, h);
    float *G = scratch, *row = G + C, *T = row + C, *U = T + (size_t)C * C, *W = U + (size_t)C * d,
          *Vn = W + (size_t)C * d;
    const float *g = dr->g + h, *beta = dr->beta + h;
    float acc = 0.0f;
    for (int a = 0; a < n; a++) G[a] = acc += g[(size_t)(t0 + a) * dr->v_heads];
    for (int a = 0; a < n; a++) {
        const float *ka = token_vec(dr, t0 + a, dr->k_off, kh);
        const float ba = beta[(size_t)(t0 + a) * dr->v_heads];
        for (int b = 0; b < a; b++)
            row[b] = -ba * dot(ka, token_vec(dr, t0 + b, dr->k_off, kh), d) * expf(G[a] - G[b]);
        for (int b = 0; b < a; b++) { /* T[a][b] = A[a][b] + sum over b < m < a of A[a][m] T[m][b] */
            float t = row[b];
            for (int m = b + 1; m < a; m++) t += row[m] * T[(size_t)m * C + b];
            T[(size_t)a * C + b] = t;
        }
    }
    for (int a = 0; a < n; a++) {
        float *u = U + (size_t)a * d, *w = W + (size_t)a * d;
        for (int j = 0; j < d; j++) u[j] = w[j] = 0.0f;
        for (int b = 0; b <= a; b++) {
            const float c = b == a ? 1.0f : T[(size_t)a * C + b], bb = beta[(size_t)(t0 + b) * dr->v_heads] * c;
            const float *vb = token_vec(dr, t0 + b, dr->v_off, h), *kb = token_vec(dr, t0 + b, dr->k_off, kh);
            const float eg = bb * expf(G[b]);
            for (int j = 0; j < d; j++) {
                u[j] += bb * vb[j];
                w[j] += eg * kb[j];
            }
        }
        float *vn = Vn + (size_t)a * d;
        for (int j = 0; j < d; j++) vn[j] = u[j];
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) vn[j] -= w[i] * S[(size_t)i * d + j];
    }
    for (int a = 0; a < n; a++) {
        const float *qa = token_vec(dr, t0 + a, dr->q_off, kh);
        float *o = dr->out + (size_t)(t0 + a) * dr->v_heads * d + (size_t)h * d;
        const float ea = expf(G[a]);
        for (int j = 0; j < d; j++) o[j] = 0.0f;
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) o[j] += qa[i] * S[(size_t)i * d + j];
        for (int j = 0; j < d; j++) o[j] *= ea;
        for (int b = 0; b <= a; b++) {
            const float c = dot(qa, token_vec(dr, t0 + b, dr->k_off, kh), d) * expf(G[a] - G[b]);
            for (int j = 0; j < d; j++) o[j] += c * Vn[(size_t)b * d + j];
        }
    }
    const float last = G[n - 1], el = expf(last);
    for (int i = 0; i < d * d; i++) S[i] *= el;
    for (int b = 0; b < n; b++) {
        const float *kb = token_vec(dr, t0 + b, dr->k_off, kh);
        const float e = expf(last - G[b]);
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) S[(size_t)i * d + j] += kb[i] * e * Vn[(size_t)b * d + j];
    }
}

static void delta_head_chunked(const cpu_delta *dr, int seq, int h, float *scratch)
{
    float *S = head_state(dr, seq, h);
    const int end = dr->seq_first[seq] + dr->seq_tokens[seq];
    for (int t0 = dr->seq_first[seq]; t0 < end; t0 += dr->chunk)
        delta_chunk(dr, h, t0, end - t0 < dr->chunk ? end - t0 : dr->chunk, S, scratch);
}

static void delta_items(void *ctx, int begin, int end, int thread)
{
    const cpu_delta *dr = ctx;
    float *scratch = dr->scratch + (size_t)thread * (size_t)cpu_delta_scratch(dr->d, dr->chunk);
    for (int item = begin; item < end; item++) {
        if (dr->chunk) delta_head_chunked(dr, item / dr->v_heads, item % dr->v_heads, scratch);
        else delta_head(dr, item / dr->v_heads, item % dr->v_heads, scratch);
    }
}

void cpu_delta_run(cpu_pool *pool, const cpu_delta *dr)
{
    int64_t n_tok = 0;
    for (int s = 0; s < dr->n_seqs; s++) n_tok += dr->seq_tokens[s];
    if (n_tok * dr->v_heads * dr->d * dr->d * 2 < PARALLEL_MIN_WORK)
        delta_items((void *)dr, 0, dr->n_seqs * dr->v_heads, 0);
    else
        cpu_pool_run(pool, delta_items, (void *)dr, dr->n_seqs * dr->v_heads);
}
