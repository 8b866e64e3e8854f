// mvbench.cu - the batch-1 matvec kernels (matvec_q4_k_1, matvec_q6_k_1, glu_q4_k_1 and the
// IQ4_XS ones of src/gpu/kernels/matvec.cuh, compiled here from the same source) against variants
// of their layout, on the Llama-3.1-8B, Qwen2.5-1.5B and Gemma-4-31B (g4) shapes: each timed back to back in a CUDA graph
// over enough weight copies (>= 256 MB) that L2 holds none of them, and its output compared
// bit for bit with the engine kernel's.  A measuring tool for docs/benchmarks.md, not part of
// the build: scripts/device-bundle compiles it with nvcc (CUDA runtime API) into
// .carry/bin/mvbench and `scripts/gpu-check mvbench` runs it.  Usage: mvbench [SHAPE-SUBSTRING...]
// [+VARIANT-SUBSTRING...] (variants named: those and main's kernel only)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include "../src/gpu/gpu_kernel_names.h"
#undef GPU_MATVEC_KERNELS
#define GPU_MATVEC_KERNELS(X) X(matvec_q4_k_1, glu_q4_k_1, Q4_K, 1) X(matvec_q6_k_1, glu_q6_k_1, Q6_K, 1) \
    X(matvec_iq4_xs_1, glu_iq4_xs_1, IQ4_XS, 1)
#undef GPU_MATVEC_ROPE_KERNELS
#define GPU_MATVEC_ROPE_KERNELS(X)
#undef GPU_MATVEC_DP4A_KERNELS
#define GPU_MATVEC_DP4A_KERNELS(X)
#undef GPU_DEQUANT_KERNELS
#define GPU_DEQUANT_KERNELS(X)
#undef GPU_MATVEC_NORM_KERNELS
#define GPU_MATVEC_NORM_KERNELS(X)
#include "../src/gpu/kernels/matvec.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

// Q4_K with the 16-byte header read as one uint4 (d, dmin, 12 scale bytes): same values.
__device__ __forceinline__ q4k_h q4k_h_setup_v(const uint8_t *row, int c)
{
    const uint8_t *b = row + (size_t)(c >> 3) * 144;
    const int s = c & 7;
    const uint4 hv = __ldg((const uint4 *)b);
    const uint32_t hw[4] = {hv.x, hv.y, hv.z, hv.w};
    // scale bytes q[0..11] = bytes 4..15 of the block = words 1..3
    auto qb = [&](int j) -> uint32_t {
        const uint32_t w = j < 4 ? hw[1] : j < 8 ? hw[2] : hw[3];
        return (w >> (8 * (j & 3))) & 0xFF;
    };
    float sc, mn;
    if (s < 4) {
        sc = (float)(qb(s) & 63);
        mn = (float)(qb(s + 4) & 63);
    } else {
        sc = (float)((qb(s + 4) & 0xF) | ((qb(s - 4) >> 6) << 4));
        mn = (float)((qb(s + 4) >> 4) | ((qb(s) >> 6) << 4));
    }
    const float d = half_bits_to_float((uint16_t)(hw[0] & 0xFFFF)) * sc * ((s & 1) ? 0.0625f : 1.0f);
    return {__float2half2_rn(d), __float2half2_rn(-half_bits_to_float((uint16_t)(hw[0] >> 16)) * mn),
            (s & 1) ? 0x00F000F0u : 0x000F000Fu, b + 16 + 32 * (s >> 1)};
}

template <int T, bool HDR>
__device__ __forceinline__ void chunk_v(const uint8_t *row, int c, __half2 w[16])
{
    if constexpr (T == T_Q4_K && HDR) {
        const q4k_h p = q4k_h_setup_v(row, c);
        const uint4 *qp = (const uint4 *)p.qs;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint4 v = __ldg(qp + i);
            const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) q4k_h_word(p, u[j], &w[8 * i + 2 * j]);
        }
    } else {
        load_chunk_h<T>(row, c, w);
    }
}

// One chunk's products (chunk_dots' weights and sums) with the inputs from shared memory as FP32
// (stage_x32's layout: chunk c's 32 inputs as 8 float4, the i-th at i ^ (c & 7)).
template <int NR>
__device__ __forceinline__ void chunk_dots_x32(float w[NR][32], int c, float s[NR])
{
    extern __shared__ float4 xs32[];
    const float4 *xf = xs32 + 8 * c;
#pragma unroll
    for (int r = 0; r < NR; r++) s[r] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float4 f = xf[j ^ (c & 7)];
#pragma unroll
        for (int r = 0; r < NR; r++) {
            s[r] += w[r][4 * j] * f.x + w[r][4 * j + 1] * f.y;
            s[r] += w[r][4 * j + 2] * f.z + w[r][4 * j + 3] * f.w;
        }
    }
}

// row_dots (MT = 1) with the chunk decoder chosen; the same sums in the same order.
template <int T, int NR, bool HDR, int SX = 0>
__device__ __forceinline__ void row_dots_v(const uint8_t *const rows[NR], const __half *xr, int k, float acc[NR])
{
    extern __shared__ uint4 xs[];
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    const int nchunks = k / 32;
    for (int c = lane; c < nchunks; c += WARP) {
        __half2 wh[NR][16];
#pragma unroll
        for (int r = 0; r < NR; r++) chunk_v<T, HDR>(rows[r], c, wh[r]);
        float w[NR][32];
        chunk_weights<NR>(wh, w);
        const uint4 *xp = (const uint4 *)(xr + 32 * c);
        const uint4 *xsp = xs + 4 * c;
        const int sw = (c >> 1) & 3;
        float s[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) s[r] = 0.0f;
        if constexpr (SX == 2) {
            chunk_dots_x32<NR>(w, c, s);
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint4 v = SX ? xsp[j ^ sw] : xp[j];
                const __half2 *h = (const __half2 *)&v;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 f = __half22float2(h[e]);
#pragma unroll
                    for (int r = 0; r < NR; r++) s[r] += w[r][8 * j + 2 * e] * f.x + w[r][8 * j + 2 * e + 1] * f.y;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) acc[r] += s[r];
    }
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = warp_sum(acc[r]);
}

// x (k halves) into shared memory, uint4 4c + j at 4c + (j ^ ((c >> 1) & 3)): a warp's 16-byte
// reads of 32 consecutive chunks then meet no bank conflict.
__device__ __forceinline__ void stage_x(const __half *x, int k)
{
    extern __shared__ uint4 xs[];
    const uint4 *x4 = (const uint4 *)x;
    for (int u = threadIdx.x; u < k / 8; u += blockDim.x) {
        const int c = u >> 2, j = u & 3;
        xs[4 * c + (j ^ ((c >> 1) & 3))] = __ldg(x4 + u);
    }
    __syncthreads();
}

// x as FP32, float4 8c + j at 8c + (j ^ (c & 7)): no conversion of inputs in the loop
__device__ __forceinline__ void stage_x32(const __half *x, int k)
{
    extern __shared__ float4 xs32[];
    float4 *xf = xs32;
    const uint2 *x2 = (const uint2 *)x;
    for (int u = threadIdx.x; u < k / 4; u += blockDim.x) {
        const int c = u >> 3, j = u & 7;
        const uint2 v = __ldg(x2 + u);
        const float2 a = __half22float2(*(const __half2 *)&v.x), b = __half22float2(*(const __half2 *)&v.y);
        xf[8 * c + (j ^ (c & 7))] = make_float4(a.x, a.y, b.x, b.y);
    }
    __syncthreads();
}

// Activations staged in shared memory first: SX 1 as FP16 (stage_x), 2 as FP32 (stage_x32).
template <int T, int W, bool HDR, int SX = 1>
__global__ void __launch_bounds__(W * 32) mv_sx(matvec_args a)
{
    if (SX == 2) stage_x32(a.x, a.k); else stage_x(a.x, a.k);
    const int n0 = blockIdx.y * W + (threadIdx.x >> 5);
    if (n0 >= a.seg[0].n) return;
    const uint8_t *rows[1] = {a.seg[0].w + (size_t)n0 * a.row_bytes};
    float acc[1];
    row_dots_v<T, 1, HDR, SX>(rows, a.x, a.k, acc);
    if ((threadIdx.x & 31) == 0) a.seg[0].y[n0] = acc[0];
}

template <int T, int W, bool HDR, int SX = 1>
__global__ void __launch_bounds__(W * 32) glu_sx(matvec_args a)
{
    if (SX == 2) stage_x32(a.x, a.k); else stage_x(a.x, a.k);
    const int n = blockIdx.y * W + (threadIdx.x >> 5);
    if (n >= a.seg[0].n) return;
    const uint8_t *rows[2] = {a.seg[0].w + (size_t)n * a.row_bytes, a.seg[1].w + (size_t)n * a.row_bytes};
    float gu[2];
    row_dots_v<T, 2, HDR, SX>(rows, a.x, a.k, gu);
    if ((threadIdx.x & 31) == 0) a.yh[n] = __float2half_rn(glu_act(gu[0], gu[1], a.glu_limit, a.glu_alpha, a.glu_gelu));
}

template <int NR, int PREF, bool HS>
__device__ __forceinline__ void rd_iq4(const uint8_t *const rows[NR], const __half *xr, int k, float acc[NR]);

// Warp w of block b takes rows NR (b W + w) .. + NR - 1.  IQV >= 0: IQ4_XS's rd_iq4 with PREF
// IQV & 3, HS IQV >> 2 (past the last row: the last again, not written).
template <int T, int W, int NR, bool HDR, int IQV = -1>
__global__ void __launch_bounds__(W * 32) mv_v(matvec_args a)
{
    const int n0 = (blockIdx.y * W + (threadIdx.x >> 5)) * NR;
    if (n0 >= a.seg[0].n) return;
    const uint8_t *rows[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) rows[r] = a.seg[0].w + (size_t)min(n0 + r, a.seg[0].n - 1) * a.row_bytes;
    float acc[NR];
    if constexpr (IQV >= 0)
        rd_iq4<NR, IQV & 3, (IQV >> 2) != 0>(rows, a.x, a.k, acc);
    else
        row_dots_v<T, NR, HDR>(rows, a.x, a.k, acc);
    if ((threadIdx.x & 31) != 0) return;
#pragma unroll
    for (int r = 0; r < NR; r++)
        if (n0 + r < a.seg[0].n) a.seg[0].y[n0 + r] = acc[r];
}

// main's kernel held to 32 registers (8 blocks of 8 warps an SM instead of 6)
template <int T>
__global__ void __launch_bounds__(256, 8) mv_occ(matvec_args a)
{
    const int n0 = blockIdx.y * 8 + (threadIdx.x >> 5);
    if (n0 >= a.seg[0].n) return;
    const uint8_t *rows[1] = {a.seg[0].w + (size_t)n0 * a.row_bytes};
    float acc[1];
    row_dots_v<T, 1, false>(rows, a.x, a.k, acc);
    if ((threadIdx.x & 31) == 0) a.seg[0].y[n0] = acc[0];
}

// The residual product over the carried norm, the engine's (matvec_res_<type>): the same sums
// as main's plain kernel, y += W x into a zeroed y (fmaf(1, s, 0) = s: the same bits)
template <int T>
__global__ void __launch_bounds__(256) mv_res(matvec_args a) { matvec_body<T, 1, false, false, NORM_OUT>(a); }

template <int T, int W, bool HDR>
__global__ void __launch_bounds__(W * 32) glu_v(matvec_args a)
{
    const int n = blockIdx.y * W + (threadIdx.x >> 5);
    if (n >= a.seg[0].n) return;
    const uint8_t *rows[2] = {a.seg[0].w + (size_t)n * a.row_bytes, a.seg[1].w + (size_t)n * a.row_bytes};
    float gu[2];
    row_dots_v<T, 2, HDR>(rows, a.x, a.k, gu);
    if ((threadIdx.x & 31) != 0) return;
    a.yh[n] = __float2half_rn(glu_act(gu[0], gu[1], a.glu_limit, a.glu_alpha, a.glu_gelu));
}

// MMA 0: the FP32 products of row_dots (load_chunk_h, FFMA); 1: row_dots_mma decoding the
// whole chunk before its 8 mma, as main did before the word-at-a-time decode (the same weights).
template <int MMA>
__global__ void __launch_bounds__(256) mv_iq4(matvec_args a)
{
    const int n = blockIdx.y * 8 + (threadIdx.x >> 5);
    if (n >= a.seg[0].n) return;
    const uint8_t *rows[1] = {a.seg[0].w + (size_t)n * a.row_bytes};
    float acc[1][1];
    if (MMA) row_dots_mma<T_IQ4_XS, 1, false>(rows, a, 0, acc); else row_dots<T_IQ4_XS, 1, 1>(rows, a, 0, acc);
    if ((threadIdx.x & 31) == 0) a.seg[0].y[n] = acc[0][0];
}

// Two weight rows a warp on the tensor cores (rows g and g + 8 of A: the GLU's layout for the
// plain product), so every mma keeps two rows' sums and each input chunk serves both.
__global__ void __launch_bounds__(256) mv_iq4_2rows(matvec_args a)
{
    const int n0 = 2 * (blockIdx.y * 8 + (threadIdx.x >> 5));
    if (n0 >= a.seg[0].n) return;
    const uint8_t *rows[2] = {a.seg[0].w + (size_t)n0 * a.row_bytes, a.seg[0].w + (size_t)min(n0 + 1, a.seg[0].n - 1) * a.row_bytes};
    float acc[2][1];
    row_dots_mma<T_IQ4_XS, 2>(rows, a, 0, acc);
    if ((threadIdx.x & 31) != 0) return;
    a.seg[0].y[n0] = acc[0][0];
    if (n0 + 1 < a.seg[0].n) a.seg[0].y[n0 + 1] = acc[1][0];
}

// IQ4_XS variants of row_dots_mma (issue 28, fifteenth session): NR rows a warp in NP = (NR + 1) / 2
// pairs of A rows g and g + 8 (a pair's mma chains share the lane's input words: one input load for
// up to NR rows); PREF 1: the next chunk's raw quants and header loaded before this chunk's decode
// (2: its inputs too); HS: the sub-block scale in FP16 arithmetic (iq4xs_h_scale_h, the same bits).
// Per row the same mma chains as main's: NR 1, PREF 0, HS 0 is main's code.
template <int NR, int PREF, bool HS>
__device__ __forceinline__ void rd_iq4(const uint8_t *const rows[NR], const __half *xr, int k, float acc[NR])
{
    constexpr int NP = (NR + 1) / 2;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float d[NP][2][4];
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 4; e++) d[p][h][e] = 0.0f;
    const int nchunks = k / 32;
    iq4xs_raw q[NR];
    uint32_t xw[16];
    if (PREF) {
        const int c = min(lane, nchunks - 1);
#pragma unroll
        for (int r = 0; r < NR; r++) q[r] = iq4xs_load(rows[r], c);
        if (PREF >= 2) load_x_words((const uint4 *)(xr + 32 * c), lane < nchunks, xw);
    }
    for (int c0 = 0; c0 < nchunks; c0 += WARP) {
        const bool live = c0 + lane < nchunks;
        const int c = live ? c0 + lane : nchunks - 1;
        if (!PREF)
#pragma unroll
            for (int r = 0; r < NR; r++) q[r] = iq4xs_load(rows[r], c);
        if (PREF < 2) load_x_words((const uint4 *)(xr + 32 * c), live, xw);
        iq4xs_raw qn[NR];
        uint32_t xn[16];
        if (PREF) {
            const int cn = min(c0 + WARP + lane, nchunks - 1);
#pragma unroll
            for (int r = 0; r < NR; r++) qn[r] = iq4xs_load(rows[r], cn);
            if (PREF >= 2) load_x_words((const uint4 *)(xr + 32 * cn), c0 + WARP + lane < nchunks, xn);
        }
        __half2 dl[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) dl[r] = HS ? iq4xs_h_scale_h(q[r].h, c & 7) : iq4xs_h_scale(q[r].h, c & 7);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 p[NR][4];
#pragma unroll
            for (int r = 0; r < NR; r++) iq4_h_word(q[r].u[i], dl[r], &p[r][0], &p[r][2]);
#pragma unroll
            for (int pp = 0; pp < NP; pp++)
                iq4_word_mma(d[pp], p[2 * pp], p[min(2 * pp + 1, NR - 1)], 2 * pp + 1 < NR, xw, i);
        }
        if (PREF) {
#pragma unroll
            for (int r = 0; r < NR; r++) q[r] = qn[r];
            if (PREF >= 2)
#pragma unroll
                for (int j = 0; j < 16; j++) xw[j] = xn[j];
        }
    }
    const bool diag = t == (g >> 1);
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const int pp = r / 2, e = r & 1;
        const float v = (g & 1) ? d[pp][0][2 * e + 1] + d[pp][1][2 * e + 1] : d[pp][0][2 * e] + d[pp][1][2 * e];
        acc[r] = warp_sum(diag ? v : 0.0f);
    }
}

// The GLU, NF features (gate and up rows each: A rows g and g + 8 of a pair) a warp.
template <int NF, int W, int PREF, bool HS>
__global__ void __launch_bounds__(W * 32) glu_iq4v(matvec_args a)
{
    const int f0 = (blockIdx.y * W + (threadIdx.x >> 5)) * NF, nf = a.seg[0].n;
    if (f0 >= nf) return;
    const uint8_t *rows[2 * NF];
#pragma unroll
    for (int f = 0; f < NF; f++) {
        const size_t o = (size_t)min(f0 + f, nf - 1) * a.row_bytes;
        rows[2 * f] = a.seg[0].w + o, rows[2 * f + 1] = a.seg[1].w + o;
    }
    float gu[2 * NF];
    rd_iq4<2 * NF, PREF, HS>(rows, a.x, a.k, gu);
    if ((threadIdx.x & 31) != 0) return;
#pragma unroll
    for (int f = 0; f < NF; f++)
        if (f0 + f < nf) a.yh[f0 + f] = __float2half_rn(glu_act(gu[2 * f], gu[2 * f + 1], a.glu_limit, a.glu_alpha, a.glu_gelu));
}

template <int MMA>
__global__ void __launch_bounds__(256) glu_iq4(matvec_args a)
{
    const int n = blockIdx.y * 8 + (threadIdx.x >> 5);
    if (n >= a.seg[0].n) return;
    const uint8_t *rows[2] = {a.seg[0].w + (size_t)n * a.row_bytes, a.seg[1].w + (size_t)n * a.row_bytes};
    float gu[2][1];
    if (MMA) row_dots_mma<T_IQ4_XS, 2, false>(rows, a, 0, gu); else row_dots<T_IQ4_XS, 1, 2>(rows, a, 0, gu);
    if ((threadIdx.x & 31) == 0) a.yh[n] = __float2half_rn(glu_act(gu[0][0], gu[1][0], a.glu_limit, a.glu_alpha, a.glu_gelu));
}

// Two (NR) rows a warp over 1/KS of k each: warp w of a block takes row group w / KS and the
// k part w % KS (its chunks a contiguous range, lanes striding over it as row_dots does), so a
// block of W warps keeps W / KS * NR rows -- main's 8 at NR = KS -- and each input chunk a lane
// loads and converts serves NR rows.  The KS partial sums of a row meet in shared memory and are
// added in part order by the group's first warp: a fixed order, but not row_dots' (its lanes'
// chunk sequences are split), so the bits differ from main's.  GLU: NR / 2 features of gate and
// up rows (rows 2f and 2f + 1 of the group).
// SX32: the inputs from shared memory as FP32 (stage_x32's layout), not from global as FP16.
template <int T, int NR, bool SX32 = false>
__device__ __forceinline__ void row_dots_part(const uint8_t *const rows[NR], const __half *xr, int c0, int c1,
                                              float acc[NR])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    for (int c = c0 + lane; c < c1; c += WARP) {
        __half2 wh[NR][16];
#pragma unroll
        for (int r = 0; r < NR; r++) load_chunk_h<T>(rows[r], c, wh[r]);
        float w[NR][32];
        chunk_weights<NR>(wh, w);
        float s[NR];
        if constexpr (SX32) {
            chunk_dots_x32<NR>(w, c, s);
        } else {
            chunk_dots<NR>(w, xr + 32 * c, s);
        }
#pragma unroll
        for (int r = 0; r < NR; r++) acc[r] += s[r];
    }
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = warp_sum(acc[r]);
}

template <int T, int W, int NR, int KS, bool GLU, bool SX32 = false, int MINB = 0>
__global__ void __launch_bounds__(W * 32, MINB) mv_ksplit(matvec_args a)
{
    if (SX32) stage_x32(a.x, a.k);
    constexpr int G = W / KS;             // row groups a block
    constexpr int F = GLU ? NR / 2 : NR;  // output features a group
    __shared__ float part[W][NR];
    const int wi = threadIdx.x >> 5, g = wi / KS, h = wi % KS;
    const int f0 = (blockIdx.y * G + g) * F, nf = a.seg[0].n;
    const uint8_t *rows[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const int f = min(f0 + (GLU ? r / 2 : r), nf - 1);
        rows[r] = a.seg[GLU ? r & 1 : 0].w + (size_t)f * a.row_bytes;
    }
    const int nchunks = a.k / 32;
    float acc[NR];
    row_dots_part<T, NR, SX32>(rows, a.x, h * nchunks / KS, (h + 1) * nchunks / KS, acc);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int r = 0; r < NR; r++) part[wi][r] = acc[r];
    __syncthreads();
    if (h != 0 || (threadIdx.x & 31) != 0) return;
    float v[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        v[r] = part[wi][r];
#pragma unroll
        for (int i = 1; i < KS; i++) v[r] += part[wi + i][r];
    }
#pragma unroll
    for (int f = 0; f < F; f++) {
        if (f0 + f >= nf) break;
        if (GLU)
            a.yh[f0 + f] = __float2half_rn(glu_act(v[2 * f], v[2 * f + 1], a.glu_limit, a.glu_alpha, a.glu_gelu));
        else
            a.seg[0].y[f0 + f] = v[f];
    }
}

static size_t block_bytes_of(int t) { return t == T_Q4_K ? 144 : t == T_IQ4_XS ? 136 : GPU_Q6K_BLOCK; }
static size_t row_bytes_of(int t, int k) { return (size_t)k / 256 * block_bytes_of(t); }

// Random blocks with sane FP16 scales.
static void fill(std::vector<uint8_t> &h, int t, size_t nblocks)
{
    uint64_t z = 0x9E3779B97F4A7C15ull ^ (uint64_t)rand();
    for (size_t i = 0; i + 8 <= h.size(); i += 8) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        memcpy(&h[i], &z, 8);
    }
    const size_t bs = block_bytes_of(t);
    for (size_t i = 0; i < nblocks; i++) {
        uint8_t *b = h.data() + i * bs;
        uint16_t d = 0x1C00 + (rand() & 0x3FF), m = 0x1800 + (rand() & 0x3FF);
        if (t == T_Q4_K) { memcpy(b, &d, 2); memcpy(b + 2, &m, 2); }
        else if (t == T_IQ4_XS) memcpy(b, &d, 2);
        else memcpy(b + 208, &d, 2);
    }
}

struct shape { const char *name; int t, n, k; bool glu; };

typedef void (*kfn)(matvec_args);
struct variant { const char *name; kfn f; int w, nr; bool sx; int threads = 0; }; // threads: 0 = w * 32
// A row of the variant tables for an IQ4_XS layout (mv_v's IQV = PREF + 4 HS; glu_iq4v)
#define IQ4V(name, W, NR, V) variant{name, mv_v<T_IQ4_XS, W, NR, false, V>, W, NR, false}
#define IQG(name, W, NF, PREF, HS) variant{name, glu_iq4v<NF, W, PREF, HS>, W, NF, false}

int main(int argc, char **argv)
{
    int dev = 0;
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, dev));
    printf("mvbench: %s, %d SMs\n", pr.name, pr.multiProcessorCount);
    const shape shapes[] = {
        {"Wq 4096x4096 q4_k", T_Q4_K, 4096, 4096, false},
        {"Wk 1024x4096 q4_k", T_Q4_K, 1024, 4096, false},
        {"down 4096x14336 q4_k", T_Q4_K, 4096, 14336, false},
        {"down 4096x14336 q6_k", T_Q6_K, 4096, 14336, false},
        {"gate+up 2x14336x4096 q4_k", T_Q4_K, 14336, 4096, true},
        {"lm_head 128256x4096 q6_k", T_Q6_K, 128256, 4096, false},
        {"1.5B Wo 1536x1536 q4_k", T_Q4_K, 1536, 1536, false},
        {"1.5B down 1536x8960 q4_k", T_Q4_K, 1536, 8960, false},
        {"1.5B lm_head 151936x1536 q6_k", T_Q6_K, 151936, 1536, false},
        {"1.5B down 1536x8960 q6_k", T_Q6_K, 1536, 8960, false},
        {"Wq 4096x4096 iq4_xs", T_IQ4_XS, 4096, 4096, false},
        {"down 4096x14336 iq4_xs", T_IQ4_XS, 4096, 14336, false},
        {"gate+up 2x14336x4096 iq4_xs", T_IQ4_XS, 14336, 4096, true},
        {"8B QKV 6144x4096 iq4_xs", T_IQ4_XS, 6144, 4096, false},
        {"g4 QKV 16384x5376 q4_k", T_Q4_K, 16384, 5376, false},
        {"g4 O 5376x8192 q4_k", T_Q4_K, 5376, 8192, false},
        {"g4 down 5376x21504 q4_k", T_Q4_K, 5376, 21504, false},
        {"g4 down 5376x21504 q6_k", T_Q6_K, 5376, 21504, false},
        {"g4 gate+up 2x21504x5376 q4_k", T_Q4_K, 21504, 5376, true},
        // which of n (the grid) and k (a row's length) parts the 8B's shapes from Gemma 4's
        {"probe 4096x8192 q4_k", T_Q4_K, 4096, 8192, false},
        {"probe 5376x4096 q4_k", T_Q4_K, 5376, 4096, false},
        {"probe 4096x5376 q4_k", T_Q4_K, 4096, 5376, false},
        {"probe 4096x21504 q4_k", T_Q4_K, 4096, 21504, false},
        {"probe 5376x14336 q4_k", T_Q4_K, 5376, 14336, false},
        {"probe 4096x21504 q6_k", T_Q6_K, 4096, 21504, false},
        {"probe 5376x14336 q6_k", T_Q6_K, 5376, 14336, false},
        {"70B O 8192x8192 q4_k", T_Q4_K, 8192, 8192, false},
        {"70B down 8192x28672 q4_k", T_Q4_K, 8192, 28672, false},
        {"70B down 8192x28672 q6_k", T_Q6_K, 8192, 28672, false},
        {"8B QKV 6144x4096 q4_k", T_Q4_K, 6144, 4096, false},
        {"8B Q+K 5120x4096 q4_k", T_Q4_K, 5120, 4096, false},
        {"g3 QKV 8192x3840 q4_k", T_Q4_K, 8192, 3840, false},
        {"g3 O 3840x4096 q4_k", T_Q4_K, 3840, 4096, false},
        {"g3 down 3840x15360 q4_k", T_Q4_K, 3840, 15360, false},
        {"g3 down 3840x15360 q6_k", T_Q6_K, 3840, 15360, false},
    };
    bool any_shape = false; // arguments: shape substrings, and +VARIANT substrings (main always runs)
    for (int i = 1; i < argc; i++) any_shape = any_shape || argv[i][0] != '+';
    for (const shape &sh : shapes) {
        bool want = !any_shape;
        for (int i = 1; i < argc; i++) want = want || (argv[i][0] != '+' && strstr(sh.name, argv[i]));
        if (!want) continue;
        const size_t rb = row_bytes_of(sh.t, sh.k), mbytes = rb * sh.n * (sh.glu ? 2 : 1);
        int copies = (int)((256ull << 20) / mbytes) + 1;
        if (copies > 32) copies = 32;
        if (copies < 2) copies = 2;
        std::vector<uint8_t> h(mbytes);
        std::vector<uint8_t *> dw(copies);
        fill(h, sh.t, mbytes / block_bytes_of(sh.t));
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&dw[c], mbytes));
            CK(cudaMemcpy(dw[c], h.data(), mbytes, cudaMemcpyHostToDevice));
        }
        std::vector<__half> hx(sh.k);
        for (int i = 0; i < sh.k; i++) hx[i] = __float2half((rand() / (float)RAND_MAX - 0.5f) * 2.0f);
        __half *dx, *dyh;
        float *dy;
        CK(cudaMalloc(&dx, sh.k * 2));
        CK(cudaMemcpy(dx, hx.data(), sh.k * 2, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dy, sh.n * 4));
        CK(cudaMalloc(&dyh, sh.n * 2));
        // the residual products' carried norm: weights 1, its input and partials written, the sum
        // of squares before (ss[0]) that of a residual of ones
        matvec_norm nm;
        memset(&nm, 0, sizeof nm);
        {
            std::vector<float> ones(sh.n, 1.0f), ss = {(float)sh.n, -1.0f};
            float *dnw, *dss, *dpart;
            __half *dxw;
            CK(cudaMalloc(&dnw, sh.n * 4));
            CK(cudaMalloc(&dss, 8));
            CK(cudaMalloc(&dpart, (sh.n / 8 + 1) * 4));
            CK(cudaMalloc(&dxw, sh.n * 2));
            CK(cudaMemcpy(dnw, ones.data(), sh.n * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dss, ss.data(), 8, cudaMemcpyHostToDevice));
            nm.w = dnw, nm.ss = dss, nm.part = dpart, nm.xw = (gpu_half *)dxw, nm.n = sh.n, nm.n_part = sh.n / 8;
            nm.eps = 1e-5f;
        }
        std::vector<variant> vs;
        if (sh.t == T_IQ4_XS) { // main: the word-at-a-time mma; against the whole-chunk mma and FP32 FFMA
            if (sh.glu)
                vs = {{"main glu (mma, words)", (kfn)glu_iq4_xs_1, 8, 1, false},
                      {"glu mma whole chunk", glu_iq4<1>, 8, 1, false},
                      {"glu fp32 ffma", glu_iq4<0>, 8, 1, false},
                      // IQ4_XS variants (rd_iq4): name, warps a block, features (rows) a warp, PREF, HS
                      IQG("v glu copy", 8, 1, 0, false), IQG("v glu hs", 8, 1, 0, true), IQG("v glu pref", 8, 1, 1, false),
                      IQG("v glu pref hs", 8, 1, 1, true), IQG("v glu pref2", 8, 1, 2, false), IQG("v glu 4w", 4, 1, 0, false),
                      IQG("v glu 2 feat", 8, 2, 0, false), IQG("v glu 2 feat 4w", 4, 2, 0, false),
                      IQG("v glu 2 feat pref", 8, 2, 1, false), IQG("v glu 2 feat pref 4w", 4, 2, 1, false)};
            else
                vs = {{"main (mma, words)", (kfn)matvec_iq4_xs_1, 8, 1, false},
                      {"mma whole chunk", mv_iq4<1>, 8, 1, false},
                      {"fp32 ffma", mv_iq4<0>, 8, 1, false},
                      {"mma 2 rows/warp", mv_iq4_2rows, 8, 2, false},
                      IQ4V("v copy", 8, 1, 0), IQ4V("v hs", 8, 1, 4), IQ4V("v pref", 8, 1, 1), IQ4V("v pref hs", 8, 1, 5),
                      IQ4V("v pref2", 8, 1, 2), IQ4V("v 4w", 4, 1, 0), IQ4V("v 2 rows 4w", 4, 2, 0), IQ4V("v 2 rows 4w hs", 4, 2, 4),
                      IQ4V("v 2 rows 4w pref", 4, 2, 1), IQ4V("v 2 rows 8w pref", 8, 2, 1), IQ4V("v 2 rows 4w pref2", 4, 2, 2),
                      IQ4V("v 4 rows 4w", 4, 4, 0), IQ4V("v 4 rows 2w", 2, 4, 0)};
        } else if (sh.glu) {
            vs = {{"main glu", (kfn)glu_q4_k_1, 8, 1, false},
                  {"glu hdr16", glu_v<T_Q4_K, 8, true>, 8, 1, false},
                  {"glu smem x", glu_sx<T_Q4_K, 8, false>, 8, 1, true},
                  {"glu smem x hdr16", glu_sx<T_Q4_K, 8, true>, 8, 1, true},
                  {"glu smem x 4w", glu_sx<T_Q4_K, 4, false>, 4, 1, true},
                  {"glu smem x fp32", glu_sx<T_Q4_K, 8, false, 2>, 8, 1, true},
                  {"glu 2 feat x k/2", mv_ksplit<T_Q4_K, 8, 4, 2, true>, 8, 1, false},
                  {"glu 2 feat x k/2 4w", mv_ksplit<T_Q4_K, 4, 4, 2, true>, 4, 1, false},
                  {"glu 1 feat x k/2 smem fp32", mv_ksplit<T_Q4_K, 8, 2, 2, true, true>, 4, 1, true, 256},
                  {"glu 2 feat x k/2 4w smem fp32", mv_ksplit<T_Q4_K, 4, 4, 2, true, true>, 4, 1, true}};
        } else if (sh.t == T_Q4_K) {
            vs = {{"main", (kfn)matvec_q4_k_1, 8, 1, false},
                  {"hdr16", mv_v<T_Q4_K, 8, 1, true>, 8, 1, false},
                  {"32 registers", mv_occ<T_Q4_K>, 8, 1, false},
                  {"smem x", mv_sx<T_Q4_K, 8, false>, 8, 1, true},
                  {"smem x hdr16", mv_sx<T_Q4_K, 8, true>, 8, 1, true},
                  {"smem x 4w", mv_sx<T_Q4_K, 4, false>, 4, 1, true},
                  {"smem x fp32", mv_sx<T_Q4_K, 8, false, 2>, 8, 1, true},
                  {"4 warps", mv_v<T_Q4_K, 4, 1, false>, 4, 1, false},
                  {"2 rows/warp", mv_v<T_Q4_K, 8, 2, false>, 8, 2, false},
                  {"2 rows/warp 4w", mv_v<T_Q4_K, 4, 2, false>, 4, 2, false},
                  {"4 rows/warp", mv_v<T_Q4_K, 8, 4, false>, 8, 4, false},
                  {"copy", mv_v<T_Q4_K, 8, 1, false>, 8, 1, false},
                  {"2 rows x k/2", mv_ksplit<T_Q4_K, 8, 2, 2, false>, 8, 1, false},
                  {"2 rows x k/2 4w", mv_ksplit<T_Q4_K, 4, 2, 2, false>, 4, 1, false},
                  {"4 rows x k/4", mv_ksplit<T_Q4_K, 8, 4, 4, false>, 8, 1, false},
                  {"2 rows x k/4 16w", mv_ksplit<T_Q4_K, 16, 2, 4, false>, 8, 1, false, 512},
                  {"2 rows x k/2 32 regs", mv_ksplit<T_Q4_K, 8, 2, 2, false, false, 8>, 8, 1, false},
                  {"4 rows x k/4 4w", mv_ksplit<T_Q4_K, 4, 4, 4, false>, 4, 1, false, 128},
                  {"2 rows x k/2 smem fp32", mv_ksplit<T_Q4_K, 8, 2, 2, false, true>, 8, 1, true},
                  {"2 rows x k/2 4w smem fp32", mv_ksplit<T_Q4_K, 4, 2, 2, false, true>, 4, 1, true},
                  {"4 rows x k/4 smem fp32", mv_ksplit<T_Q4_K, 8, 4, 4, false, true>, 8, 1, true}};
        } else {
            vs = {{"main", (kfn)matvec_q6_k_1, 8, 1, false},
                  {"copy", mv_v<T_Q6_K, 8, 1, false>, 8, 1, false},
                  {"4 warps", mv_v<T_Q6_K, 4, 1, false>, 4, 1, false},
                  {"32 registers", mv_occ<T_Q6_K>, 8, 1, false},
                  {"smem x", mv_sx<T_Q6_K, 8, false>, 8, 1, true},
                  {"smem x 4w", mv_sx<T_Q6_K, 4, false>, 4, 1, true},
                  {"2 rows/warp", mv_v<T_Q6_K, 8, 2, false>, 8, 2, false},
                  {"2 rows/warp 4w", mv_v<T_Q6_K, 4, 2, false>, 4, 2, false},
                  {"4 rows/warp", mv_v<T_Q6_K, 8, 4, false>, 8, 4, false},
                  {"2 rows x k/2", mv_ksplit<T_Q6_K, 8, 2, 2, false>, 8, 1, false},
                  {"2 rows x k/2 4w", mv_ksplit<T_Q6_K, 4, 2, 2, false>, 4, 1, false},
                  {"4 rows x k/4", mv_ksplit<T_Q6_K, 8, 4, 4, false>, 8, 1, false},
                  {"2 rows x k/4 16w", mv_ksplit<T_Q6_K, 16, 2, 4, false>, 8, 1, false, 512},
                  {"2 rows x k/2 48 regs", mv_ksplit<T_Q6_K, 8, 2, 2, false, false, 5>, 8, 1, false},
                  {"2 rows x k/2 smem fp32", mv_ksplit<T_Q6_K, 8, 2, 2, false, true>, 8, 1, true},
                  {"2 rows x k/2 4w smem fp32", mv_ksplit<T_Q6_K, 4, 2, 2, false, true>, 4, 1, true},
                  {"engine matvec_one 4w", (kfn)matvec_one_q6_k, MATVEC_ONE_WARPS, 1, false},
                  {"res: matvec_res", mv_res<T_Q6_K>, 8, 1, false}};
        }
        {
            std::vector<variant> keep = {vs[0]}; // +NAME arguments: the variants named (and main)
            bool pick = false;
            for (int i = 1; i < argc; i++) pick = pick || argv[i][0] == '+';
            for (size_t vi = 1; pick && vi < vs.size(); vi++)
                for (int i = 1; i < argc; i++)
                    if (argv[i][0] == '+' && strstr(vs[vi].name, argv[i] + 1)) {
                        keep.push_back(vs[vi]);
                        break;
                    }
            if (pick) vs = keep;
        }
        std::vector<float> ref(sh.n), got(sh.n);
        std::vector<__half> refh(sh.n), goth(sh.n);
        cudaStream_t st;
        CK(cudaStreamCreate(&st));
        printf("\n%s: %.1f MB a product, %d copies\n", sh.name, mbytes / 1e6, copies);
        for (size_t vi = 0; vi < vs.size(); vi++) {
            const variant &v = vs[vi];
            auto args = [&](int c) {
                matvec_args a;
                memset(&a, 0, sizeof a);
                a.n_seg = sh.glu ? 2 : 1;
                a.k = sh.k, a.m = 1, a.ldx = sh.k, a.row_bytes = rb, a.x = (const gpu_half *)dx, a.norm = nm;
                a.seg[0] = {dw[c], dy, nullptr, sh.n, sh.n};
                if (sh.glu) { a.seg[1] = {dw[c] + rb * sh.n, dy, nullptr, sh.n, sh.n}; a.yh = (gpu_half *)dyh; }
                return a;
            };
            const int rows_per_block = v.w * v.nr;
            dim3 grid(1, (sh.n + rows_per_block - 1) / rows_per_block);
            CK(cudaMemset(dy, 0, sh.n * 4));
            CK(cudaMemset(dyh, 0, sh.n * 2));
            const size_t smem = v.sx ? (size_t)sh.k * (strstr(v.name, "fp32") ? 4 : 2) : 0;
            if (smem > 48 * 1024) CK(cudaFuncSetAttribute((const void *)v.f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            v.f<<<grid, v.threads ? v.threads : v.w * 32, smem, st>>>(args(0));
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            int diff = 0;
            double maxd = 0.0, maxr = 0.0; // where the bits differ: the largest |got - main| over main's largest |y|
            if (sh.glu) {
                CK(cudaMemcpy(goth.data(), dyh, sh.n * 2, cudaMemcpyDeviceToHost));
                if (vi == 0) refh = goth;
                diff = memcmp(refh.data(), goth.data(), sh.n * 2) != 0;
                for (int i = 0; i < sh.n; i++) {
                    const double r = __half2float(refh[i]), g = __half2float(goth[i]);
                    maxd = fmax(maxd, fabs(g - r)), maxr = fmax(maxr, fabs(r));
                }
            } else {
                CK(cudaMemcpy(got.data(), dy, sh.n * 4, cudaMemcpyDeviceToHost));
                if (vi == 0) ref = got;
                for (int i = 0; i < sh.n; i++) {
                    diff += memcmp(&ref[i], &got[i], 4) != 0;
                    maxd = fmax(maxd, fabs((double)got[i] - ref[i])), maxr = fmax(maxr, fabs((double)ref[i]));
                }
            }
            // graph: 4 passes over the copies
            const int launches = copies * 2 < 48 ? 48 : copies * 2;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < launches; i++) v.f<<<grid, v.threads ? v.threads : v.w * 32, smem, st>>>(args(i % copies));
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaStreamSynchronize(st));
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            float best = 1e30f;
            for (int rep = 0; rep < 3; rep++) {
                CK(cudaEventRecord(e0, st));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (ms < best) best = ms;
            }
            const double us = best * 1000.0 / launches;
            if (diff)
                printf("  %-22s %8.2f us  %7.0f GB/s  DIFFERS from main (max |d| %.2e of max |y| %.2e)\n", v.name, us,
                       mbytes / us / 1e3, maxd, maxr);
            else
                printf("  %-22s %8.2f us  %7.0f GB/s  bit-identical\n", v.name, us, mbytes / us / 1e3);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
        for (auto p : dw) CK(cudaFree(p));
        CK(cudaFree((void *)nm.w));
        CK(cudaFree(nm.ss));
        CK(cudaFree(nm.part));
        CK(cudaFree(nm.xw));
        CK(cudaFree(dx));
        CK(cudaFree(dy));
        CK(cudaFree(dyh));
        CK(cudaStreamDestroy(st));
    }
    return 0;
}
