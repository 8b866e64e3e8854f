// matvec.cuh - y[m][n] (+)= sum_k W[n][k] * x[m][k] for a few rows m, reading W in its
// quantised form exactly once per launch; plus the FP16 dequantiser that feeds cuBLAS for
// large batches, and the embedding gather (a row lookup through the same block decoder).
#pragma once
#include "quant.cuh"
#include "../src/gpu/gpu_shared.h"

#define MATVEC_WARPS 8

// One warp per output feature; lanes stride over the row's 32-weight chunks, each decoded
// once into registers and used for the MT activation rows of this block.  blockIdx.x walks
// groups of MT rows fastest, so blocks that share weight rows run together and re-read the
// weights from L2 rather than memory when m > MT.
template <int T, int MT>
__device__ __forceinline__ void matvec_body(const matvec_args &a)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.y * MATVEC_WARPS + warp;
    int m0 = blockIdx.x * MT;
    if (n >= a.n) return;
    const uint8_t *row = a.w + (size_t)n * a.row_bytes;
    const float *xr[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) xr[i] = a.x + (size_t)min(m0 + i, a.m - 1) * a.ldx;
    float acc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i] = 0.0f;
    int nchunks = a.k / 32;
    for (int c = lane; c < nchunks; c += WARP) {
        float w[32];
        load_chunk<T>(row, c, w);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const float4 *xp = (const float4 *)(xr[i] + 32 * c);
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float4 v = xp[j];
                s += w[4 * j] * v.x + w[4 * j + 1] * v.y + w[4 * j + 2] * v.z + w[4 * j + 3] * v.w;
            }
            acc[i] += s;
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        float s = warp_sum(acc[i]);
        if (lane == 0 && m0 + i < a.m) {
            float *dst = a.y + (size_t)(m0 + i) * a.ldy + n;
            if (a.bias) s += a.bias[n];
            *dst = a.accumulate ? *dst + s : s;
        }
    }
}

#define MATVEC_KERNELS(T, sfx)                                                                   \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        matvec_##sfx##_1(matvec_args a) { matvec_body<T, 1>(a); }                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        matvec_##sfx##_2(matvec_args a) { matvec_body<T, 2>(a); }                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        matvec_##sfx##_4(matvec_args a) { matvec_body<T, 4>(a); }                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        matvec_##sfx##_8(matvec_args a) { matvec_body<T, 8>(a); }
FOR_EACH_WEIGHT_TYPE(MATVEC_KERNELS)

// W (n rows of k) -> FP16 row-major [n][k], one 32-weight chunk per thread.
template <int T>
__device__ __forceinline__ void dequant_f16_body(const uint8_t *w, unsigned long long row_bytes,
                                                 int k, int n, __half *out)
{
    size_t chunks_per_row = k / 32, total = chunks_per_row * (size_t)n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / chunks_per_row;
        int c = (int)(i - r * chunks_per_row);
        float v[32];
        load_chunk<T>(w + r * row_bytes, c, v);
        __half2 h[16];
#pragma unroll
        for (int j = 0; j < 16; j++) h[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        uint4 *dst = (uint4 *)(out + r * k + 32 * (size_t)c);
#pragma unroll
        for (int j = 0; j < 4; j++) dst[j] = ((const uint4 *)h)[j];
    }
}

// Embedding gather: x[t] = dequantised row tok[t] of the table (n_embd = k).
template <int T>
__device__ __forceinline__ void embed_body(const uint8_t *w, unsigned long long row_bytes, int k,
                                           const int *tok, float *x)
{
    int t = blockIdx.x;
    const uint8_t *row = w + (size_t)tok[t] * row_bytes;
    for (int c = threadIdx.x; c < k / 32; c += blockDim.x) {
        float v[32];
        load_chunk<T>(row, c, v);
        float4 *dst = (float4 *)(x + (size_t)t * k + 32 * c);
#pragma unroll
        for (int j = 0; j < 8; j++) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    }
}

#define DEQUANT_KERNELS(T, sfx)                                                                  \
    extern "C" __global__ void dequant_f16_##sfx(const uint8_t *w, unsigned long long row_bytes, \
                                                 int k, int n, __half *out)                      \
    {                                                                                            \
        dequant_f16_body<T>(w, row_bytes, k, n, out);                                            \
    }                                                                                            \
    extern "C" __global__ void embed_##sfx(const uint8_t *w, unsigned long long row_bytes, int k, \
                                           const int *tok, float *x)                             \
    {                                                                                            \
        embed_body<T>(w, row_bytes, k, tok, x);                                                  \
    }
FOR_EACH_WEIGHT_TYPE(DEQUANT_KERNELS)
