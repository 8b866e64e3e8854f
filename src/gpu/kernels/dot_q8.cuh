// dot_q8.cuh - dot products of K-quant weight rows with q8 activations on the integer units
// (dp4a: four int8 x int8 products and their sum in one instruction), for one activation row;
// and quantize_q8, which makes those activations where no RMSNorm made them.
//
// Why: with the FP16 decode of quant.cuh the batch-1 matvecs were measured issue bound (~12.7
// lane instructions per weight, docs/benchmarks.md), not short of bytes in flight.  Here the
// activation row is quantised once per product (q8_block_store: an int8 per input, a scale and
// the sum per 32), a word of weight quants meets four activations in one dp4a, and the formats'
// scales (and Q4_K's mins, through the blocks' sums) are applied once per 16 or 32 products in
// FP32: about 1.5 instructions per weight, 2 with the remainders.  8 bits alone (the q8 build,
// as llama.cpp) round an input by up to 1/254 of its block's largest, ~1 % of a product, which
// flipped up to 5 of 88 greedy tokens of the tiny random test models against the CPU (emulated);
// the default build adds each input's remainder as a second int8 (lo, a second dp4a per word):
// 1/64516 of the block's largest, FP16's precision, the test models' logits as before.
//
// A lane takes a unit of 64 weights of a row, every byte it loads used whole: Q4_K sub-blocks
// 2p and 2p + 1 of a super-block (the 32 bytes that hold both, low and high nibbles), Q6_K
// rows l = 16lh .. 16lh + 15 of the four quarters of half hh (16 bytes of ql low + high, 16 of
// ql's other row, 16 of qh).  Per unit the sums are FP32 of exact integer sums, added in a
// fixed order, so a row's result does not depend on the launch.
#pragma once
#include "quant.cuh"

// DOT_Q8_LEVELS: 2 where q8_block_store keeps the remainders (lo), else 1.  A row of k inputs
// lies as xq[0, k) the q, xq[k, 2k) the lo (common.cuh: q8_block_store); level 1's sums count
// 1/254 of level 0's.
#define DOT_Q8_LEVELS (DOT_Q8_LO ? 2 : 1)

__device__ __forceinline__ int i4_word(const int4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint32_t u4_word(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The 64 activations of one unit at one level: four 16-byte pieces at byte offsets o, o + step,
// o + 2 step, o + 3 step of the level's row.
struct q8_pieces {
    int4 a[4];
};

__device__ __forceinline__ q8_pieces q8_load(const int8_t *lv, size_t o, int step)
{
    q8_pieces x;
#pragma unroll
    for (int i = 0; i < 4; i++) x.a[i] = __ldg((const int4 *)(lv + o + (size_t)i * step));
    return x;
}

// Word i (0..15, constant after unrolling) of a unit's activations.
__device__ __forceinline__ int q8_word(const q8_pieces &x, int i) { return i4_word(x.a[i >> 2], i & 3); }

// The 6-bit scale and min of sub-block j (kquant_scale_min) from the header's scale words
// (scales[0..3], [4..7], [8..11]), without indexing bytes (which would go through memory).
__device__ __forceinline__ int2 q4k_scale_min_words(uint32_t s03, uint32_t s47, uint32_t s8b, int j)
{
    const int sh = 8 * (j & 3);
    const uint32_t lo = s03 >> sh, mi = s47 >> sh, hi = s8b >> sh;
    return j < 4 ? make_int2((int)(lo & 63), (int)(mi & 63))
                 : make_int2((int)((hi & 15) | ((lo >> 2) & 0x30)), (int)(((hi >> 4) & 15) | ((mi >> 2) & 0x30)));
}

template <int T> __device__ float q8_dot(const uint8_t *row, int u, const matvec_args &a);

// Q4_K unit u = 4b + p: sub-blocks 2p, 2p + 1, inputs 64u .. 64u + 63 = q8 blocks 2u, 2u + 1.
// w = d sc q - dmin mn per sub-block: sum w x = d sc dx sum(q qx) - dmin mn sum(x).  The levels
// run one after the other (unroll 1) so that one level's activations are live at a time.
template <> __device__ __forceinline__ float q8_dot<T_Q4_K>(const uint8_t *row, int u, const matvec_args &a)
{
    const uint8_t *b = row + (size_t)(u >> 2) * 144;
    const int p = u & 3;
    const uint4 h = __ldg((const uint4 *)b); // d, dmin, scales[12]
    const uint4 *qp = (const uint4 *)(b + 16 + 32 * p);
    const uint4 q0 = __ldg(qp), q1 = __ldg(qp + 1);
    float f0 = 0.0f, f1 = 0.0f;
#pragma unroll 1
    for (int lv = 0; lv < DOT_Q8_LEVELS; lv++) {
        const q8_pieces x = q8_load(a.xq + (size_t)lv * a.k, 64 * (size_t)u, 16);
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t q = u4_word(i < 4 ? q0 : q1, i & 3);
            s0 = __dp4a((int)(q & 0x0F0F0F0Fu), q8_word(x, i), s0);
            s1 = __dp4a((int)((q >> 4) & 0x0F0F0F0Fu), q8_word(x, 8 + i), s1);
        }
        const float w = lv ? 1.0f / 254.0f : 1.0f;
        f0 += (float)s0 * w;
        f1 += (float)s1 * w;
    }
    const float4 ds = __ldg((const float4 *)(a.xd + 4 * (size_t)u)); // (d, sum) of blocks 2u, 2u + 1
    const int2 m0 = q4k_scale_min_words(h.y, h.z, h.w, 2 * p), m1 = q4k_scale_min_words(h.y, h.z, h.w, 2 * p + 1);
    const float2 dm = __half22float2(*(const __half2 *)&h.x);
    return dm.x * ((float)m0.x * ds.x * f0 + (float)m1.x * ds.z * f1) - dm.y * ((float)m0.y * ds.y + (float)m1.y * ds.w);
}

// Four 6-bit quants (one per byte, 0..63) less 32, as signed bytes, with no borrow between
// bytes: q | 0x80 less 0x20 is q + 96 in 96..159, and flipping bit 7 leaves q - 32.
__device__ __forceinline__ int q6_signed(uint32_t q)
{
    return (int)(((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
}

// Q6_K unit u = 4b + 2hh + lh: rows l = 16lh .. 16lh + 15 of quarters qq = 0..3 of half hh,
// inputs 256b + 128hh + 32qq + l = q8 block 8b + 4hh + qq.  w = d sc (q - 32) per 16 weights:
// sum w x = d sc dx sum((q - 32) qx).
template <> __device__ __forceinline__ float q8_dot<T_Q6_K>(const uint8_t *row, int u, const matvec_args &a)
{
    const uint8_t *b = row + (size_t)(u >> 2) * GPU_Q6K_BLOCK;
    const int hh = (u >> 1) & 1, lh = u & 1, blk = 2 * u - 2 * lh;
    const uint4 la = __ldg((const uint4 *)(b + 64 * hh + 16 * lh));       // quarters 0 (low), 2 (high)
    const uint4 lb = __ldg((const uint4 *)(b + 64 * hh + 32 + 16 * lh));  // quarters 1 (low), 3 (high)
    const uint4 hb = __ldg((const uint4 *)(b + 128 + 32 * hh + 16 * lh)); // 2 bits of each quarter
    const uint2 sc = __ldg((const uint2 *)(b + 192 + 8 * hh));             // scales[8hh + 2qq + lh]
    int w[16]; // the signed quants, word 4qq + i
#pragma unroll
    for (int qq = 0; qq < 4; qq++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t ql = u4_word(qq & 1 ? lb : la, i) >> (4 * (qq >> 1)), qh = u4_word(hb, i) >> (2 * qq);
            w[4 * qq + i] = q6_signed((ql & 0x0F0F0F0Fu) | ((qh & 0x03030303u) << 4));
        }
    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int lv = 0; lv < DOT_Q8_LEVELS; lv++) {
        const q8_pieces x = q8_load(a.xq + (size_t)lv * a.k, 32 * (size_t)blk + 16 * lh, 32);
        const float wl = lv ? 1.0f / 254.0f : 1.0f;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            int s = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) s = __dp4a(w[4 * qq + i], q8_word(x, 4 * qq + i), s);
            f[qq] += (float)s * wl;
        }
    }
    const float4 *dp = (const float4 *)(a.xd + 2 * (size_t)blk);
    const float4 d01 = __ldg(dp), d23 = __ldg(dp + 1);
    const float dx[4] = {d01.x, d01.z, d23.x, d23.z};
    float sum = 0.0f;
#pragma unroll
    for (int qq = 0; qq < 4; qq++) {
        const int scale = (int)(int8_t)(((qq < 2 ? sc.x : sc.y) >> (8 * (2 * (qq & 1) + lh))) & 0xFF);
        sum += (float)scale * dx[qq] * f[qq];
    }
    return half_bits_to_float(ld_u16(b + 208)) * sum;
}

// Dot products of NR rows (k inputs, k a multiple of 256) with the q8 row of a (a.xq, a.xd);
// one warp, lanes striding over the 64-weight units, every row's sum then over the warp.
template <int T, int NR>
__device__ __forceinline__ void row_dots_q8(const uint8_t *const rows[NR], const matvec_args &a, float acc[NR][1])
{
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r][0] = 0.0f;
    const int units = a.k / 64;
    for (int u = threadIdx.x & 31; u < units; u += WARP)
#pragma unroll
        for (int r = 0; r < NR; r++) acc[r][0] += q8_dot<T>(rows[r], u, a);
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r][0] = warp_sum(acc[r][0]);
}

// The q8 activations of one FP16 row of k inputs (k a multiple of 32; the grid covers k with
// whole warps): for the dp4a products whose input no RMSNorm quantised (rmsnorm_q8).
extern "C" __global__ void quantize_q8(const __half *x, int k, int8_t *xq, float *xd)
{
    pdl_enter();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return; // whole warps: k % 32 == 0
    q8_block_store(__half2float(x[i]), xq + (i & ~31), xq + k + (i & ~31), xd + 2 * (i >> 5));
}
