// dot_q8.cuh - dot products of K-quant weight rows with q8 activations on the integer units
// (dp4a: four int8 x int8 products and their sum in one instruction), for one activation row
// (the batch-1 dp4a kernels) or 2..8 (the q8n kernels: a step of a few rows, a speculative
// verification's K + 1, reads each weight once for all of them); and quantize_q8, which makes
// those activations where no RMSNorm made them.
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

// Weight loads that leave no line in L1: a product reads its weights once, and in L1 they
// would evict the q8 activations that every warp of a block reads again for each of its rows
// (the q8n kernels' up to 8 x 2 x k bytes).
__device__ __forceinline__ uint4 ldg_stream(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t ldg_stream(const uint32_t *p)
{
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// The activations of one unit and row at both levels, loaded together (their loads in flight
// at once: the q8n kernels' rows are a chain of these).
struct q8_levels {
    q8_pieces lv[DOT_Q8_LEVELS];
};

__device__ __forceinline__ q8_levels q8_load_levels(const int8_t *xq, int k, size_t o, int step)
{
    q8_levels x;
#pragma unroll
    for (int l = 0; l < DOT_Q8_LEVELS; l++) x.lv[l] = q8_load(xq + (size_t)l * k, o, step);
    return x;
}

// A unit's weights (one lane's 64 of one row), loaded and decoded once (q8_unit_load) and then
// multiplied with the q8 activations of every row of a launch (q8_unit_dot; xq, xd that row's
// q8 form): the 2..8-row products read and decode each weight once for all their rows, and a
// row then costs its activation loads, a dp4a per 4 weights and level and a few FP32 scales.
template <int T> struct q8_unit;
template <int T> __device__ q8_unit<T> q8_unit_load(const uint8_t *row, int u);

// Q4_K unit u = 4b + p: sub-blocks 2p, 2p + 1 (the low and high nibbles of the same 32 bytes),
// inputs 64u .. 64u + 63 = q8 blocks 2u, 2u + 1.  w = d sc q - dmin mn per sub-block:
// sum w x = d sc dx sum(q qx) - dmin mn sum(x), the d sc and dmin mn products made at load.
template <> struct q8_unit<T_Q4_K> {
    int q[16];           // words 0..7: sub-block 2p's quants, 8..15: 2p + 1's
    float sc0, sc1, mn0, mn1; // d sc and dmin mn of the two sub-blocks
};

template <> __device__ __forceinline__ q8_unit<T_Q4_K> q8_unit_load<T_Q4_K>(const uint8_t *row, int u)
{
    const uint8_t *b = row + (size_t)(u >> 2) * 144;
    const int p = u & 3;
    const uint4 h = ldg_stream((const uint4 *)b); // d, dmin, scales[12]
    const uint4 *qp = (const uint4 *)(b + 16 + 32 * p);
    const uint4 q0 = ldg_stream(qp), q1 = ldg_stream(qp + 1);
    q8_unit<T_Q4_K> w;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t q = u4_word(i < 4 ? q0 : q1, i & 3);
        w.q[i] = (int)(q & 0x0F0F0F0Fu);
        w.q[8 + i] = (int)((q >> 4) & 0x0F0F0F0Fu);
    }
    const int2 m0 = q4k_scale_min_words(h.y, h.z, h.w, 2 * p), m1 = q4k_scale_min_words(h.y, h.z, h.w, 2 * p + 1);
    const float2 dm = __half22float2(*(const __half2 *)&h.x);
    w.sc0 = dm.x * (float)m0.x, w.sc1 = dm.x * (float)m1.x;
    w.mn0 = dm.y * (float)m0.y, w.mn1 = dm.y * (float)m1.y;
    return w;
}

// The two sums of a unit of two 32-input halves (q words 0..7 and 8..15) over both levels,
// level 1's counting 1/254 of level 0's.
__device__ __forceinline__ float2 q8_half_sums(const int q[16], const q8_levels &x)
{
    float f0 = 0.0f, f1 = 0.0f;
#pragma unroll
    for (int lv = 0; lv < DOT_Q8_LEVELS; lv++) {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s0 = __dp4a(q[i], q8_word(x.lv[lv], i), s0);
            s1 = __dp4a(q[8 + i], q8_word(x.lv[lv], 8 + i), s1);
        }
        const float wl = lv ? 1.0f / 254.0f : 1.0f;
        f0 += (float)s0 * wl;
        f1 += (float)s1 * wl;
    }
    return make_float2(f0, f1);
}

__device__ __forceinline__ float q8_unit_dot(const q8_unit<T_Q4_K> &w, int u, const int8_t *xq, const float *xd, int k)
{
    const float2 f = q8_half_sums(w.q, q8_load_levels(xq, k, 64 * (size_t)u, 16));
    const float4 ds = __ldg((const float4 *)(xd + 4 * (size_t)u)); // (d, sum) of blocks 2u, 2u + 1
    return w.sc0 * ds.x * f.x + w.sc1 * ds.z * f.y - (w.mn0 * ds.y + w.mn1 * ds.w);
}

// Four 6-bit quants (one per byte, 0..63) less 32, as signed bytes, with no borrow between
// bytes: q | 0x80 less 0x20 is q + 96 in 96..159, and flipping bit 7 leaves q - 32.
__device__ __forceinline__ int q6_signed(uint32_t q)
{
    return (int)(((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
}

// Q6_K unit u = 4b + 2hh + lh: rows l = 16lh .. 16lh + 15 of quarters qq = 0..3 of half hh,
// inputs 256b + 128hh + 32qq + l = q8 block 8b + 4hh + qq.  w = d sc (q - 32) per 16 weights:
// sum w x = d sc dx sum((q - 32) qx), d sc made at load.
template <> struct q8_unit<T_Q6_K> {
    int w[16];   // the signed quants, word 4qq + i
    float sc[4]; // d scales[8hh + 2qq + lh]
};

template <> __device__ __forceinline__ q8_unit<T_Q6_K> q8_unit_load<T_Q6_K>(const uint8_t *row, int u)
{
    const uint8_t *b = row + (size_t)(u >> 2) * GPU_Q6K_BLOCK;
    const int hh = (u >> 1) & 1, lh = u & 1;
    const uint4 la = ldg_stream((const uint4 *)(b + 64 * hh + 16 * lh));       // quarters 0 (low), 2 (high)
    const uint4 lb = ldg_stream((const uint4 *)(b + 64 * hh + 32 + 16 * lh));  // quarters 1 (low), 3 (high)
    const uint4 hb = ldg_stream((const uint4 *)(b + 128 + 32 * hh + 16 * lh)); // 2 bits of each quarter
    const uint32_t s0 = ldg_stream((const uint32_t *)(b + 192 + 8 * hh)), s1 = ldg_stream((const uint32_t *)(b + 196 + 8 * hh));
    const float d = half_bits_to_float(ld_u16(b + 208));
    q8_unit<T_Q6_K> w;
#pragma unroll
    for (int qq = 0; qq < 4; qq++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t ql = u4_word(qq & 1 ? lb : la, i) >> (4 * (qq >> 1)), qh = u4_word(hb, i) >> (2 * qq);
            w.w[4 * qq + i] = q6_signed((ql & 0x0F0F0F0Fu) | ((qh & 0x03030303u) << 4));
        }
        w.sc[qq] = d * (float)(int8_t)(((qq < 2 ? s0 : s1) >> (8 * (2 * (qq & 1) + lh))) & 0xFF);
    }
    return w;
}

__device__ __forceinline__ float q8_unit_dot(const q8_unit<T_Q6_K> &w, int u, const int8_t *xq, const float *xd, int k)
{
    const int lh = u & 1, blk = 2 * u - 2 * lh;
    const q8_levels x = q8_load_levels(xq, k, 32 * (size_t)blk + 16 * lh, 32);
    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int lv = 0; lv < DOT_Q8_LEVELS; lv++) {
        const float wl = lv ? 1.0f / 254.0f : 1.0f;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            int s = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) s = __dp4a(w.w[4 * qq + i], q8_word(x.lv[lv], 4 * qq + i), s);
            f[qq] += (float)s * wl;
        }
    }
    const float4 *dp = (const float4 *)(xd + 2 * (size_t)blk);
    const float4 d01 = __ldg(dp), d23 = __ldg(dp + 1);
    return w.sc[0] * d01.x * f[0] + w.sc[1] * d01.z * f[1] + w.sc[2] * d23.x * f[2] + w.sc[3] * d23.z * f[3];
}

// Q8_0 unit u: blocks 2u, 2u + 1 (34 bytes each: an FP16 scale, 32 int8), the 68 bytes at 68u,
// 4-byte aligned where the row is (k a multiple of 64): read as 17 words, block 2u's quants
// shifted into words by a byte permute.  Inputs 64u .. 64u + 63 = q8 blocks 2u, 2u + 1.
// w = d q per 32: sum w x = d dx sum(q qx).
template <> struct q8_unit<T_Q8_0> {
    int q[16];
    float d0, d1;
};

template <> __device__ __forceinline__ q8_unit<T_Q8_0> q8_unit_load<T_Q8_0>(const uint8_t *row, int u)
{
    const uint32_t *p = (const uint32_t *)(row + 68 * (size_t)u);
    uint32_t v[17];
#pragma unroll
    for (int i = 0; i < 17; i++) v[i] = ldg_stream(p + i);
    q8_unit<T_Q8_0> w;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        w.q[i] = (int)__byte_perm(v[i], v[i + 1], 0x5432); // bytes 2 + 4i .. 5 + 4i
        w.q[8 + i] = (int)v[9 + i];                        // bytes 36 + 4i ..
    }
    w.d0 = half_bits_to_float((uint16_t)(v[0] & 0xFFFFu));
    w.d1 = half_bits_to_float((uint16_t)(v[8] >> 16));
    return w;
}

__device__ __forceinline__ float q8_unit_dot(const q8_unit<T_Q8_0> &w, int u, const int8_t *xq, const float *xd, int k)
{
    const float2 f = q8_half_sums(w.q, q8_load_levels(xq, k, 64 * (size_t)u, 16));
    const float4 ds = __ldg((const float4 *)(xd + 4 * (size_t)u)); // (d, sum) of blocks 2u, 2u + 1
    return w.d0 * ds.x * f.x + w.d1 * ds.z * f.y;
}

// Dot products of NR rows (k inputs, k a multiple of 256) with activation rows m0 .. m0 + MT - 1
// in q8 form (rows past a.m: the last one again, so that no branch keeps a row's loads from
// being issued ahead of the row before; measured on the H100, a first version that skipped
// them cost ~2 ms a row in an 8B step, latency bound): row i's q and lo at a.xq + 2ki (rmsnorm_q8's and quantize_q8's
// layout), its (scale, sum) pairs at a.xd + ki / 16.  One warp, lanes striding over the 64-weight
// units; a unit's weights are loaded and decoded once for all MT rows.  A row's sum is its
// units' in lane order and then over the warp whatever MT is, so every row gets the bits the
// one-row kernel (MT 1) gives it.
template <int T, int NR, int MT>
__device__ __forceinline__ void row_dots_q8(const uint8_t *const rows[NR], const matvec_args &a, int m0, float acc[NR][MT])
{
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = 0.0f;
    const int units = a.k / 64;
    for (int u = threadIdx.x & 31; u < units; u += WARP) {
        q8_unit<T> w[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) w[r] = q8_unit_load<T>(rows[r], u);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const int row = min(m0 + i, a.m - 1); // past a.m: the last row again, never stored
            const int8_t *xq = a.xq + 2 * (size_t)a.k * row;
            const float *xd = a.xd + (size_t)(a.k / 16) * row;
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r][i] += q8_unit_dot(w[r], u, xq, xd, a.k);
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = warp_sum(acc[r][i]);
}

// The q8 activations of FP16 rows of k inputs (row blockIdx.y at x + ldx blockIdx.y; k a
// multiple of 32, the grid's x covering k with whole warps) in row_dots_q8's layout: for the
// dp4a products whose input no RMSNorm quantised (rmsnorm_q8).
extern "C" __global__ void quantize_q8(const __half *x, int k, int8_t *xq, float *xd, int ldx)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (i >= k) return; // whole warps: k % 32 == 0
    int8_t *q = xq + 2 * (size_t)k * r + (i & ~31);
    q8_block_store(__half2float(x[(size_t)ldx * r + i]), q, q + k, xd + (size_t)(k / 16) * r + 2 * (i >> 5));
}
