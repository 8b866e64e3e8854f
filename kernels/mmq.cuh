// mmq.cuh - matrix products on the quantised weights with tensor cores, for more activation
// rows than the matvec kernels serve (batched decode, prefill): y[m][n] (+)= W[n] . x[m].
//
// No FP16 copy of W exists anywhere: each warp decodes the weights of its mma fragments
// straight from the GGUF blocks into registers (load_oct_h, the same FP16 values load_chunk_h
// gives the matvec kernels), and the activations are staged in shared memory by cp.async.
//
// The weights are mma's A operand (16 weight rows per warp: the output features), the
// activations its B operand (8 activation rows per n-tile), so a block of 16 activation rows
// wastes nothing.  Inside a 32-input chunk the k order is permuted the same way for A and B
// (the product does not care): lane (g, t) holds inputs 8t..8t+7 of its rows, so a lane's
// A fragment is one quarter-chunk of two weight rows and its B fragment one 16-byte load.
//   mma k16 slice 0 of the chunk: logical k {2t, 2t+1, 2t+8, 2t+9} = physical 8t + {0,1,2,3}
//   mma k16 slice 1:              the same logical k                 = physical 8t + {4,5,6,7}
//
// Grid: x over blocks of MMQ_ROWS weight rows, y over blocks of BM activation rows, z over
// splits of k.  With one split the epilogue (bias, residual add, or SwiGLU of gate and up)
// is applied here; with several (a grid too small to fill the GPU), every split writes its
// partial sums and mmq_reduce adds them in split order, so the result is deterministic.
#pragma once
#include "quant.cuh"
#include "../src/gpu/gpu_shared.h"

#define MMQ_WARPS 8
#define MMQ_ROWS (16 * MMQ_WARPS)
#define MMQ_XSTRIDE (MMQ_KT + 32) // halves per staged row: fragment loads free of bank conflicts

__device__ __forceinline__ int mmq_pad(int n) { return (n + 15) & ~15; }

__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared, or zeros when !valid (rows past m, inputs past the split).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *(const uint32_t *)&h; }

template <int T, int BM, bool GLU>
__device__ __forceinline__ void mmq_body(const matvec_args &a)
{
    extern __shared__ uint4 mmq_smem[];
    __half *xs = (__half *)mmq_smem; // [2 stages][BM][MMQ_XSTRIDE]
    constexpr int NJ = BM / 8, NT = GLU ? 2 : 1, CPS = MMQ_KT / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.y * BM, nchunks = a.k / 32;
    const int c_begin = blockIdx.z * a.split_chunks, c_end = min(nchunks, c_begin + a.split_chunks);

    // The warp's 16 features: n0.. of segment s (GLU: of gate, segment 0, and up, segment 1).
    int n0 = (blockIdx.x * MMQ_WARPS + warp) * 16, s = 0, prow0 = n0;
    if (!GLU)
        while (s < a.n_seg && n0 >= mmq_pad(a.seg[s].n)) n0 -= mmq_pad(a.seg[s++].n);
    const bool active = GLU ? n0 < a.seg[0].n : s < a.n_seg;
    const uint8_t *wr[NT][2];
#pragma unroll
    for (int i = 0; i < NT; i++) {
        const matvec_seg &sg = a.seg[GLU ? i : (active ? s : 0)];
        // rows past the segment read its last row (results dropped), so loads stay inside W
        wr[i][0] = sg.w + (size_t)min(n0 + g, sg.n - 1) * a.row_bytes;
        wr[i][1] = sg.w + (size_t)min(n0 + g + 8, sg.n - 1) * a.row_bytes;
    }

    float acc[NT][NJ][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    const int n_stages = (c_end - c_begin + CPS - 1) / CPS;
    auto stage = [&](int st) { // activation rows m0.. of the stage's chunks into buffer st & 1
        __half *dst = xs + (st & 1) * BM * MMQ_XSTRIDE;
        const int k0 = (c_begin + st * CPS) * 32;
        for (int i = threadIdx.x; i < BM * (MMQ_KT / 8); i += blockDim.x) {
            const int r = i / (MMQ_KT / 8), e = (i % (MMQ_KT / 8)) * 8, m = m0 + r;
            const bool ok = m < a.m && k0 + e < c_end * 32;
            cp_async16(dst + r * MMQ_XSTRIDE + e, a.x + (size_t)min(m, a.m - 1) * a.ldx + (ok ? k0 + e : 0), ok);
        }
        cp_async_commit();
    };
    if (n_stages > 0) stage(0);
    for (int st = 0; st < n_stages; st++) {
        if (st + 1 < n_stages) {
            stage(st + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __half *xb = xs + (st & 1) * BM * MMQ_XSTRIDE + 8 * t;
        const int c0 = c_begin + st * CPS;
        if (active) {
#pragma unroll
            for (int cc = 0; cc < CPS; cc++) {
                if (c0 + cc >= c_end) break;
                uint32_t af[NT][2][4]; // [tile][k16 slice][a0..a3 as pairs]
#pragma unroll
                for (int i = 0; i < NT; i++) {
                    __half2 lo[4], hi[4]; // rows g and g + 8
                    load_oct_h<T>(wr[i][0], c0 + cc, t, lo);
                    load_oct_h<T>(wr[i][1], c0 + cc, t, hi);
#pragma unroll
                    for (int sl = 0; sl < 2; sl++) {
                        af[i][sl][0] = h2_bits(lo[2 * sl]);
                        af[i][sl][1] = h2_bits(hi[2 * sl]);
                        af[i][sl][2] = h2_bits(lo[2 * sl + 1]);
                        af[i][sl][3] = h2_bits(hi[2 * sl + 1]);
                    }
                }
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    const uint4 xv = *(const uint4 *)(xb + (j * 8 + g) * MMQ_XSTRIDE + cc * 32);
#pragma unroll
                    for (int i = 0; i < NT; i++) {
                        mma_16816(acc[i][j], af[i][0], xv.x, xv.y);
                        mma_16816(acc[i][j], af[i][1], xv.z, xv.w);
                    }
                }
            }
        }
        __syncthreads(); // the buffer is refilled two stages on
    }
    if (!active) return;

    // acc[i][j][2h + e]: feature n0 + g + 8h, activation row m0 + 8j + 2t + e.
    const bool split = gridDim.z > 1;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int n = n0 + g + 8 * h, m = m0 + 8 * j + 2 * t + e;
                if (m >= a.m) continue;
                if (split) {
                    float *p = a.part + ((size_t)blockIdx.z * a.m + m) * a.part_ld;
#pragma unroll
                    for (int i = 0; i < NT; i++) p[prow0 + g + 8 * h + i * mmq_pad(a.seg[0].n)] = acc[i][j][2 * h + e];
                    continue;
                }
                if (GLU) {
                    if (n >= a.seg[0].n) continue;
                    const float gt = acc[0][j][2 * h + e], up = acc[NT - 1][j][2 * h + e];
                    a.yh[(size_t)m * a.seg[0].ldy + n] = __float2half_rn(gt / (1.0f + __expf(-gt)) * up);
                } else {
                    const matvec_seg &sg = a.seg[s];
                    if (n >= sg.n) continue;
                    float v = acc[0][j][2 * h + e] + (sg.bias ? sg.bias[n] : 0.0f);
                    float *dst = sg.y + (size_t)m * sg.ldy + n;
                    *dst = a.accumulate ? *dst + v : v;
                }
            }
}

// The splits' partial sums of a.part, added in split order, then the epilogue; one thread per
// (activation row, padded feature row).
extern "C" __global__ void mmq_reduce(matvec_args a, int glu, int n_split)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.m * a.part_ld) return;
    const int m = (int)(i / a.part_ld);
    int n = (int)(i % a.part_ld), s = 0;
    const size_t stride = (size_t)a.m * a.part_ld;
    const float *p = a.part + (size_t)m * a.part_ld;
    if (glu) {
        const int up_off = mmq_pad(a.seg[0].n);
        if (n >= a.seg[0].n) return;
        float gt = 0.0f, up = 0.0f;
        for (int z = 0; z < n_split; z++) {
            gt += p[z * stride + n];
            up += p[z * stride + up_off + n];
        }
        a.yh[(size_t)m * a.seg[0].ldy + n] = __float2half_rn(gt / (1.0f + __expf(-gt)) * up);
        return;
    }
    const int prow = n;
    while (s < a.n_seg && n >= mmq_pad(a.seg[s].n)) n -= mmq_pad(a.seg[s++].n);
    if (s >= a.n_seg || n >= a.seg[s].n) return;
    float v = 0.0f;
    for (int z = 0; z < n_split; z++) v += p[z * stride + prow];
    const matvec_seg &sg = a.seg[s];
    v += sg.bias ? sg.bias[n] : 0.0f;
    float *dst = sg.y + (size_t)m * sg.ldy + n;
    *dst = a.accumulate ? *dst + v : v;
}

#define MMQ_VARIANT(T, sfx, BM)                                                                  \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32) mmq_##sfx##_##BM(matvec_args a) \
    {                                                                                            \
        mmq_body<T, BM, false>(a);                                                               \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32) mmq_glu_##sfx##_##BM(matvec_args a) \
    {                                                                                            \
        mmq_body<T, BM, true>(a);                                                                \
    }
#define MMQ_KERNELS(T, sfx) MMQ_VARIANT(T, sfx, 16) MMQ_VARIANT(T, sfx, 32) MMQ_VARIANT(T, sfx, 64) MMQ_VARIANT(T, sfx, 128)
FOR_EACH_QUANT_TYPE(MMQ_KERNELS)
