// common.cuh - small device helpers shared by every kernel file.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#define WARP 32

// Programmatic dependent launch (sm_90 on; gpu_kernels.c launches every kernel with it there).
// A kernel so launched may start while the kernel before it on the stream still runs, so the
// first thing every kernel does is wait for that kernel to have finished and its writes to be
// visible (griddepcontrol.wait: the same ordering as a plain launch, hence the same results),
// then let the next kernel launch (launch_dependents): its blocks are scheduled and wait on
// the SMs this grid leaves free, instead of being launched after this grid drains.  A batch-1
// step is a chain of ~200-300 short kernels whose launch gaps this takes out.  Every
// __global__ calls it first, before any early exit: a grid that exits without waiting could
// finish before the one it follows, and the grid after it would then read unfinished data.
// Where the launch did not ask for it (older GPUs, cuLaunchKernel) both are no-ops.
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_enter()
{
    pdl_wait();
    pdl_trigger();
}
// (Before its pdl_wait a kernel may read what the grids before the one ahead of it wrote: that
// grid let it launch only once all of its blocks had passed their own wait, i.e. once the grid
// before it had finished; but nothing the grid ahead writes.  attn_decode streams the K/V of
// earlier steps so: kernels/attn_decode.cuh; scripts/check-pdl allows for it.)

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

__device__ __forceinline__ float half_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Loads of 16-bit fields from blocks that are only 2-byte aligned (Q4_0, Q8_0, Q6_K).
__device__ __forceinline__ uint16_t ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }

// The q8 activations of the dp4a matvecs (dot_q8.cuh): inputs in blocks of 32, each input as
// the int8 q = rint(v / d), d = max|v| / 127, and the block as the pair (d, sum of v).  With
// DOT_Q8_LO (the default build) also lo = rint((v - d q) / (d / 254)), the rounding
// remainder in 8 bits more: v = d (q + lo / 254) to within d / 508, about FP16's precision
// instead of 8 bits'.  One warp per block, lane i holding input i: the max and the sum over
// shuffles in a fixed order, so the same inputs give the same bits wherever they are
// quantised (no atomics).
#ifndef DOT_Q8_LO
#define DOT_Q8_LO 1
#endif
__device__ __forceinline__ void q8_block_store(float v, int8_t *q, int8_t *lo, float *ds)
{
    const float amax = warp_max(fabsf(v)), sum = warp_sum(v), d = amax * (1.0f / 127.0f);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int qi = max(-127, min(127, __float2int_rn(v * inv)));
    q[threadIdx.x & 31] = (int8_t)qi;
    if (DOT_Q8_LO) lo[threadIdx.x & 31] = (int8_t)max(-127, min(127, __float2int_rn((v - d * (float)qi) * inv * 254.0f)));
    if ((threadIdx.x & 31) == 0) *(float2 *)ds = make_float2(d, sum);
}

// A head's attention sink (gpt-oss): a learned logit that takes its share of the softmax's
// denominator and adds no value.  Its term exp(sink - m) for a row whose scores' max is m
// (base2: scores and m in base 2, log2(e) folded in as the kernels' scales do); 0 without sinks.
// Added to the denominator once, where a row's output is normalised, so split-K partials and
// the warps' states merge as they always do.
__device__ __forceinline__ float attn_sink_term(const float *sinks, int h, float m, bool base2)
{
    if (!sinks) return 0.0f;
    return base2 ? exp2f(sinks[h] * 1.4426950408889634f - m) : __expf(sinks[h] - m);
}

// The logistic function of the DeltaNet gates and the shared expert's gate (deltanet.cuh,
// matvec.cuh's residual add with matvec_args.res_gate: one definition, so the same bits).
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// A GLU's output from its gate g and up u: silu(g) * u, or, limit > 0, the clamped SwiGLU
// (gpt-oss; the CPU's cpu_swiglu_clamp): g = min(g, limit), u = clamp(u, -limit, limit),
// (u + 1) * g * sigmoid(alpha g), or, gelu, GeGLU: gelu_tanh(g) * u (Gemma), the formula of
// the unfused geglu kernel (elementwise.cuh: gelu_tanh), so both give the same bits.
__device__ __forceinline__ float gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float glu_act(float g, float u, float limit, float alpha, int gelu)
{
    if (gelu) return gelu_tanh(g) * u;
    if (limit > 0.0f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return (u + 1.0f) * (g / (1.0f + __expf(-alpha * g)));
    }
    return g / (1.0f + __expf(-g)) * u;
}

// The products that carry the batch-1 step's RMSNorms (gpu_shared.h matvec_norm) scale the
// norm's input by c = 2^-norm_exp, within a factor of 2 of 2^-NORM_HEADROOM / rms, rms from ss,
// the sum of squares of the norm before: fp16(x w c) then holds |x w| / rms from about 2^-7
// to 2^21 as normal FP16 numbers (overflow would take a value two million times the previous
// rms: a residual stream's growth over one block is far from that), and smaller values lose at
// most 2^-25 / c, ~4e-6 of an rms, against FP16's 2.4e-4 of the values themselves.  A power of
// two, so c and its inverse are exact; and from the exponents alone (frexpf is exact), so the
// producer and the consumers, other kernels, get the same c whatever their rounding of a sqrt.
#define NORM_HEADROOM 6
__device__ __forceinline__ int norm_exp(float ss, int n)
{
    int e_ss, e_n;
    frexpf(ss, &e_ss);
    frexpf((float)n, &e_n);
    return (e_ss - e_n) / 2 + NORM_HEADROOM;
}
