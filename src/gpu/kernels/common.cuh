// common.cuh - small device helpers shared by every kernel file.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include "../gpu_shared.h"

#define WARP 32

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024).  `sh` holds 32 floats.
// Every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

// rsqrt(mean(x[0..n)^2) + eps) summed in one fixed order whatever the block size: that of
// VT = gpu_rms_threads(n) threads, thread v summing x[v], x[v + VT], ... in turn, each warp's
// sums by warp_sum's butterfly, then the VT / 32 warp totals the same way.  A block of fewer
// threads (at least VT / 4) plays VT / blockDim of those threads each, a block of more leaves
// the rest idle; so the rmsnorm kernel and the products that fuse it (matvec.cuh) get the same
// bits.  `sh` holds 32 floats; every thread gets the scale.
__device__ __forceinline__ float rms_scale(const float *x, int n, float eps, float *sh)
{
    const int VT = gpu_rms_threads(n), R = blockDim.x, lane = threadIdx.x & 31;
    float ss[4];
#pragma unroll
    for (int j = 0; j < 4; j++) { // every load of the row in flight before the sums
        const int v = j * R + threadIdx.x;
        ss[j] = 0.0f;
        if (v < VT)
            for (int i = v; i < n; i += VT) ss[j] = fmaf(x[i], x[i], ss[j]);
    }
    __syncthreads(); // sh is free (a caller's earlier use of it is over)
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (j * R >= VT) break; // uniform over the block
        const int v = j * R + threadIdx.x;
        const float s = warp_sum(ss[j]);
        if (lane == 0 && v < VT) sh[v >> 5] = s;
    }
    __syncthreads();
    const float tot = warp_sum(lane < VT / 32 ? sh[lane] : 0.0f);
    return rsqrtf(tot / (float)n + eps);
}

__device__ __forceinline__ float half_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Loads of 16-bit fields from blocks that are only 2-byte aligned (Q4_0, Q8_0, Q6_K).
__device__ __forceinline__ uint16_t ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }
