// elementwise.cuh - the per-token operations of a transformer layer: RMSNorm, RoPE, SwiGLU,
// bias, K/V stores into the slot caches, and the small copies between them.
#pragma once
#include "common.cuh"
#include "../src/gpu/gpu_shared.h"

// y[r] = x[r] / rms(x[r]) * w, one block per row of n; y may alias x.  yh (optional) gets
// the same values in FP16 for cuBLAS.
extern "C" __global__ void rmsnorm(const float *x, const float *w, float *y, __half *yh, int n,
                                   float eps)
{
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    float scale = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * scale * w[i];
        y[(size_t)blockIdx.x * n + i] = v;
        if (yh) yh[(size_t)blockIdx.x * n + i] = __float2half(v);
    }
}

// Rotary embedding in place on [t][n_heads][hd], grid (tokens, heads), hd/2 pairs per head.
// Position p rotates pair i by p * scale * base^(-2i/hd) / freq_div[i].  NeoX rotates
// (i, i + hd/2); the original Llama layout rotates (2i, 2i+1).
extern "C" __global__ void rope(float *v, int n_heads, int hd, const int *pos, float base,
                                float scale, const float *freq_div, int neox)
{
    int t = blockIdx.x, h = blockIdx.y;
    float *p = v + ((size_t)t * n_heads + h) * hd;
    float fp = (float)pos[t] * scale;
    for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) {
        float inv = powf(base, -2.0f * (float)i / (float)hd);
        if (freq_div) inv /= freq_div[i];
        float s, c;
        sincosf(fp * inv, &s, &c);
        int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
        float x0 = p[a], x1 = p[b];
        p[a] = x0 * c - x1 * s;
        p[b] = x0 * s + x1 * c;
    }
}

// Scatter this step's K and V into the slot caches (gpu_shared.h: kv_store_args).
extern "C" __global__ void kv_store(kv_store_args a)
{
    int t = blockIdx.x, kv_dim = a.n_kv * a.hd;
    size_t base = (((size_t)a.slot[t] * a.n_layer + a.layer) * a.n_kv) * a.ctx;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        int h = i / a.hd, d = i - h * a.hd;
        size_t off = ((base + (size_t)h * a.ctx) + a.pos[t]) * a.hd + d;
        a.kc[off] = __float2half(a.k[(size_t)t * kv_dim + i]);
        a.vc[off] = __float2half(a.v[(size_t)t * kv_dim + i]);
    }
}

// Token history per slot (for repetition penalties): hist[slot][pos] = tok.
extern "C" __global__ void hist_store(int *hist, int ctx, const int *tok, const int *slot,
                                      const int *pos, int n)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) hist[(size_t)slot[t] * ctx + pos[t]] = tok[t];
}

// g = silu(g) * u over n elements.
extern "C" __global__ void swiglu(float *g, const float *u, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = g[i];
        g[i] = x / (1.0f + __expf(-x)) * u[i];
    }
}

extern "C" __global__ void to_f16(const float *x, __half *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2half(x[i]);
}

// y[r][i] += bias[i] for rows of n.
extern "C" __global__ void add_bias(float *y, const float *bias, int n, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % n];
}

// out[r] = x[idx[r]] for rows of n (the rows whose logits are wanted).
extern "C" __global__ void gather_rows(const float *x, const int *idx, int idx_stride, float *out, int n)
{
    int r = blockIdx.x;
    const float *src = x + (size_t)idx[(size_t)r * idx_stride] * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[(size_t)r * n + i] = src[i];
}
