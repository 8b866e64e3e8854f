// quant.cuh - dequantisation of ggml weight blocks, 32 weights ("a chunk") at a time.
//
// Every weight format is read through one function, load_chunk<T>(row, c, w), that writes
// weights [32c, 32c+32) of a row into registers.  The matrix-vector kernels, the embedding
// gather and the FP16 dequantiser for cuBLAS all build on it, so a format is written once.
// Layouts are ggml's (see src/model/quant.h).
#pragma once
#include "common.cuh"
#include "../gpu_shared.h"

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30
};

// 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block.
__device__ __forceinline__ void kquant_scale_min(int j, const uint8_t *q, float *sc, float *mn)
{
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *mn = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

template <int T> __device__ __forceinline__ void load_chunk(const uint8_t *row, int c, float w[32]);

template <> __device__ __forceinline__ void load_chunk<T_F32>(const uint8_t *row, int c, float w[32])
{
    const float4 *p = (const float4 *)(row + (size_t)c * 128);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 v = __ldg(p + i);
        w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
}

template <> __device__ __forceinline__ void load_chunk<T_F16>(const uint8_t *row, int c, float w[32])
{
    const uint4 *p = (const uint4 *)(row + (size_t)c * 64);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint4 v = __ldg(p + i);
        const __half2 *h = (const __half2 *)&v;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __half22float2(h[j]);
            w[8 * i + 2 * j] = f.x; w[8 * i + 2 * j + 1] = f.y;
        }
    }
}

template <> __device__ __forceinline__ void load_chunk<T_BF16>(const uint8_t *row, int c, float w[32])
{
    const uint4 *p = (const uint4 *)(row + (size_t)c * 64);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint4 v = __ldg(p + i);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            w[8 * i + 2 * j] = __uint_as_float(u[j] << 16);
            w[8 * i + 2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
        }
    }
}

// Q4_0: 18-byte blocks {f16 d; u8 qs[16]}; weight i<16 = low nibble of qs[i], i>=16 = high.
template <> __device__ __forceinline__ void load_chunk<T_Q4_0>(const uint8_t *row, int c, float w[32])
{
    const uint8_t *b = row + (size_t)c * 18;
    float d = half_bits_to_float(ld_u16(b));
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint16_t q = ld_u16(b + 2 + 2 * i);
        w[2 * i] = d * (float)((q & 0xF) - 8);
        w[2 * i + 16] = d * (float)(((q >> 4) & 0xF) - 8);
        w[2 * i + 1] = d * (float)(((q >> 8) & 0xF) - 8);
        w[2 * i + 17] = d * (float)((q >> 12) - 8);
    }
}

// Q8_0: 34-byte blocks {f16 d; i8 qs[32]}.
template <> __device__ __forceinline__ void load_chunk<T_Q8_0>(const uint8_t *row, int c, float w[32])
{
    const uint8_t *b = row + (size_t)c * 34;
    float d = half_bits_to_float(ld_u16(b));
#pragma unroll
    for (int i = 0; i < 16; i++) {
        uint16_t q = ld_u16(b + 2 + 2 * i);
        w[2 * i] = d * (float)(int8_t)(q & 0xFF);
        w[2 * i + 1] = d * (float)(int8_t)(q >> 8);
    }
}

// Q4_K: 144-byte super-blocks {f16 d, dmin; u8 scales[12]; u8 qs[128]}.  Sub-block s (32
// weights) uses bytes qs[32*(s/2) ..] (low nibbles for even s, high for odd).
template <> __device__ __forceinline__ void load_chunk<T_Q4_K>(const uint8_t *row, int c, float w[32])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 144;
    int s = c & 7;
    float sc, mn;
    kquant_scale_min(s, b + 4, &sc, &mn);
    float d = half_bits_to_float(ld_u16(b)) * sc, m = half_bits_to_float(ld_u16(b + 2)) * mn;
    const uint4 *qp = (const uint4 *)(b + 16 + 32 * (s >> 1));
    int shift = (s & 1) * 4;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint4 v = __ldg(qp + i);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t q = u[j] >> shift;
#pragma unroll
            for (int k = 0; k < 4; k++) w[16 * i + 4 * j + k] = d * (float)((q >> (8 * k)) & 0xF) - m;
        }
    }
}

// Q5_K: 176-byte super-blocks {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K,
// plus bit s of qh[l] as the fifth bit of weight l of sub-block s.
template <> __device__ __forceinline__ void load_chunk<T_Q5_K>(const uint8_t *row, int c, float w[32])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 176;
    int s = c & 7;
    float sc, mn;
    kquant_scale_min(s, b + 4, &sc, &mn);
    float d = half_bits_to_float(ld_u16(b)) * sc, m = half_bits_to_float(ld_u16(b + 2)) * mn;
    const uint4 *qp = (const uint4 *)(b + 48 + 32 * (s >> 1));
    const uint4 *hp = (const uint4 *)(b + 16);
    int shift = (s & 1) * 4;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint4 v = __ldg(qp + i), h = __ldg(hp + i);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w}, hb[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t q = u[j] >> shift, hh = hb[j] >> s;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int qv = ((q >> (8 * k)) & 0xF) | (((hh >> (8 * k)) & 1) << 4);
                w[16 * i + 4 * j + k] = d * (float)qv - m;
            }
        }
    }
}

// Q6_K: super-blocks {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d} (210 bytes, stored in
// GPU_Q6K_BLOCK-byte slots so the loads below are aligned).  Two halves of 128 weights; in
// half h, quarter qq (32 weights) takes nibble qq/2 of ql[64h + 32*(qq&1) + l], bits
// 2qq..2qq+1 of qh[32h + l], and scale scales[8h + 2qq + l/16].
template <> __device__ __forceinline__ void load_chunk<T_Q6_K>(const uint8_t *row, int c, float w[32])
{
    const uint8_t *b = row + (size_t)(c >> 3) * GPU_Q6K_BLOCK;
    int s = c & 7, h = s >> 2, qq = s & 3;
    const uint4 *qlp = (const uint4 *)(b + 64 * h + 32 * (qq & 1)), *qhp = (const uint4 *)(b + 128 + 32 * h);
    uint16_t sc = ld_u16(b + 192 + 8 * h + 2 * qq);
    float d = half_bits_to_float(ld_u16(b + 208));
    float d0 = d * (float)(int8_t)(sc & 0xFF), d1 = d * (float)(int8_t)(sc >> 8);
    int lshift = (qq >> 1) * 4, hshift = 2 * qq;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint4 lo = __ldg(qlp + i), hi = __ldg(qhp + i);
        const uint32_t lw[4] = {lo.x, lo.y, lo.z, lo.w}, hw[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t ql = lw[j] >> lshift, qh = hw[j] >> hshift;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int q = (int)(((ql >> (8 * k)) & 0xF) | (((qh >> (8 * k)) & 3) << 4));
                w[16 * i + 4 * j + k] = (i == 0 ? d0 : d1) * (float)(q - 32);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// load_chunk_h<T>(row, c, w): the same 32 weights as FP16 pairs (w[i] = weights 2i, 2i+1):
// THE weight values of the GPU backend.  The matrix-vector kernels multiply exactly these,
// and the FP16 copies cuBLAS reads are made by the same function, so both paths see the same
// weights and differ only in the order of their FP32 sums.
//
// The generic version decodes in FP32 and rounds once.  Q4_K and Q6_K (most of a Q4_K_M
// model's bytes) decode in FP16 arithmetic instead, because decoding bounds the decode-step
// matvecs (they issue ~9 instructions per weight in FP32 and become memory bound near 4): a
// byte permute places two quants in the mantissas of 1024.0h (0x6400 | q is 1024 + q
// exactly), a subtraction leaves q exactly, and one FP16 fma/mul applies the sub-block scale
// rounded to FP16, i.e. w = fp16(fp16(d * sc) * q - fp16(dmin * mn)).  Against the FP32
// decode that adds one FP16 rounding of the scale (relative 2^-11, as the final rounding).
template <int T> __device__ __forceinline__ void load_chunk_h(const uint8_t *row, int c, __half2 w[16])
{
    float f[32];
    load_chunk<T>(row, c, f);
#pragma unroll
    for (int i = 0; i < 16; i++) w[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
}

// Bytes 0,1 (sel 0x4140) or 2,3 (sel 0x4342) of q into the low bytes of two FP16 lanes, masked,
// with 1024.0 as exponent: the FP16 pair (1024 + byte_lo & mask, 1024 + byte_hi & mask).
__device__ __forceinline__ __half2 quants_1024(uint32_t q, uint32_t sel, uint32_t mask)
{
    uint32_t h = (__byte_perm(q, 0, sel) & mask) | 0x64006400u;
    return *(const __half2 *)&h;
}

// The FP16 decode of Q4_K and Q6_K, split so that a whole chunk (load_chunk_h) and a quarter
// of one (load_oct_h, the tensor-core kernels' fragments) run the same instructions per
// 32-bit word of quants and so give the same bits.
struct q4k_h {
    __half2 d2, m2; // fp16(d * sc) (1/16 for high nibbles), -fp16(dmin * mn)
    uint32_t mask;  // the sub-block's nibble, in place
    const uint8_t *qs; // the sub-block's 32 quant bytes
};

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *(const uint32_t *)&h; }

__device__ __forceinline__ q4k_h q4k_h_setup(const uint8_t *row, int c)
{
    const uint8_t *b = row + (size_t)(c >> 3) * 144;
    const int s = c & 7;
    float sc, mn;
    kquant_scale_min(s, b + 4, &sc, &mn);
    // Odd sub-blocks use the high nibbles: masked in place they read as 16 q, so the scale
    // takes a 1/16 (exact) and no shift is needed.
    const float d = half_bits_to_float(ld_u16(b)) * sc * ((s & 1) ? 0.0625f : 1.0f);
    return {__float2half2_rn(d), __float2half2_rn(-half_bits_to_float(ld_u16(b + 2)) * mn),
            (s & 1) ? 0x00F000F0u : 0x000F000Fu, b + 16 + 32 * (s >> 1)};
}

// Four weights (one word of quants) as two FP16 pairs.
__device__ __forceinline__ void q4k_h_word(const q4k_h &p, uint32_t u, __half2 w[2])
{
    const __half2 k1024 = __float2half2_rn(1024.0f);
    w[0] = __hfma2(__hsub2(quants_1024(u, 0x4140, p.mask), k1024), p.d2, p.m2);
    w[1] = __hfma2(__hsub2(quants_1024(u, 0x4342, p.mask), k1024), p.d2, p.m2);
}

template <> __device__ __forceinline__ void load_chunk_h<T_Q4_K>(const uint8_t *row, int c, __half2 w[16])
{
    const q4k_h p = q4k_h_setup(row, c);
    const uint4 *qp = (const uint4 *)p.qs;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint4 v = __ldg(qp + i);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) q4k_h_word(p, u[j], &w[8 * i + 2 * j]);
    }
}

// Q6_K: sub-block s = c & 7 lies in half h = s >> 2, quarter qq = s & 3 (see load_chunk).
struct q6k_h {
    __half2 d0, d1; // fp16(d * scale) of the chunk's first and second 16 weights
    int lshift, hshift;
    const uint8_t *ql, *qh;
};

__device__ __forceinline__ q6k_h q6k_h_setup(const uint8_t *row, int c)
{
    const uint8_t *b = row + (size_t)(c >> 3) * GPU_Q6K_BLOCK;
    const int s = c & 7, h = s >> 2, qq = s & 3;
    const uint16_t sc = ld_u16(b + 192 + 8 * h + 2 * qq);
    const float d = half_bits_to_float(ld_u16(b + 208));
    return {__float2half2_rn(d * (float)(int8_t)(sc & 0xFF)), __float2half2_rn(d * (float)(int8_t)(sc >> 8)),
            (qq >> 1) * 4, 2 * qq, b + 64 * h + 32 * (qq & 1), b + 128 + 32 * h};
}

// Four weights from one word of low and one word of high bits, with the scale d.
__device__ __forceinline__ void q6k_h_word(const q6k_h &p, uint32_t lw, uint32_t hw, __half2 d, __half2 w[2])
{
    const __half2 k1056 = __float2half2_rn(1056.0f); // 1024 + the 32 offset of the 6-bit quants
    // four 6-bit quants, one per byte
    const uint32_t q = ((lw >> p.lshift) & 0x0F0F0F0Fu) | (((hw >> p.hshift) & 0x03030303u) << 4);
    w[0] = __hmul2(__hsub2(quants_1024(q, 0x4140, 0x00FF00FFu), k1056), d);
    w[1] = __hmul2(__hsub2(quants_1024(q, 0x4342, 0x00FF00FFu), k1056), d);
}

template <> __device__ __forceinline__ void load_chunk_h<T_Q6_K>(const uint8_t *row, int c, __half2 w[16])
{
    const q6k_h p = q6k_h_setup(row, c);
    const uint4 *qlp = (const uint4 *)p.ql, *qhp = (const uint4 *)p.qh;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint4 lo = __ldg(qlp + i), hi = __ldg(qhp + i);
        const uint32_t lw[4] = {lo.x, lo.y, lo.z, lo.w}, hw[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int j = 0; j < 4; j++) q6k_h_word(p, lw[j], hw[j], i == 0 ? p.d0 : p.d1, &w[8 * i + 2 * j]);
    }
}

// ---------------------------------------------------------------------------------------
// load_oct_h<T>(row, c, o, w): weights 32c + 8o .. 32c + 8o + 7 of a row (o = 0..3) as FP16
// pairs, bit for bit pairs 4o..4o+3 of load_chunk_h: the quarter of a chunk one lane of the
// tensor-core kernels (mmq.cuh) feeds to its mma fragments; defined for the formats of
// GPU_MMQ_KERNELS' rows (the block-quantised ones and BF16).  Plain loads (not __ldg): mmq decodes from blocks it staged
// in shared memory.
template <int T> __device__ void load_oct_h(const uint8_t *row, int c, int o, __half2 w[4]);

template <> __device__ __forceinline__ void load_oct_h<T_Q4_K>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const q4k_h p = q4k_h_setup(row, c);
    const uint2 v = ((const uint2 *)p.qs)[o];
    q4k_h_word(p, v.x, &w[0]);
    q4k_h_word(p, v.y, &w[2]);
}

template <> __device__ __forceinline__ void load_oct_h<T_Q6_K>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const q6k_h p = q6k_h_setup(row, c);
    const uint2 lo = ((const uint2 *)p.ql)[o], hi = ((const uint2 *)p.qh)[o];
    const __half2 d = o < 2 ? p.d0 : p.d1;
    q6k_h_word(p, lo.x, hi.x, d, &w[0]);
    q6k_h_word(p, lo.y, hi.y, d, &w[2]);
}

// BF16: eight weights (16 bytes, 16-byte aligned in mmq's stage) widened exactly to FP32,
// then rounded to FP16 as load_chunk_h rounds: the values the FP16 copies cuBLAS used to
// multiply held, read from the file's own rows.
template <> __device__ __forceinline__ void load_oct_h<T_BF16>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint4 v = *(const uint4 *)(row + (size_t)(32 * c + 8 * o) * 2);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = __floats2half2_rn(__uint_as_float(u[i] << 16), __uint_as_float(u[i] & 0xffff0000u));
}

// Q4_0, Q5_K: the float decode of load_chunk for the eight weights, rounded once as the
// generic load_chunk_h rounds.  (Q8_0's: quant_half.cuh, the same values.)
template <> __device__ __forceinline__ void load_oct_h<T_Q4_0>(const uint8_t *row, int c, int o, __half2 w[4])
{
    // weight j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16]
    const uint8_t *b = row + (size_t)c * 18;
    const float d = half_bits_to_float(ld_u16(b));
    const int shift = o >= 2 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint16_t q = ld_u16(b + 2 + 8 * (o & 1) + 2 * i);
        w[i] = __floats2half2_rn(d * (float)(((q >> shift) & 0xF) - 8), d * (float)(((q >> (8 + shift)) & 0xF) - 8));
    }
}

template <> __device__ __forceinline__ void load_oct_h<T_Q5_K>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 176;
    const int s = c & 7;
    float sc, mn;
    kquant_scale_min(s, b + 4, &sc, &mn);
    const float d = half_bits_to_float(ld_u16(b)) * sc, m = half_bits_to_float(ld_u16(b + 2)) * mn;
    const uint2 v = ((const uint2 *)(b + 48 + 32 * (s >> 1)))[o], h = ((const uint2 *)(b + 16))[o];
    const uint32_t u[2] = {v.x, v.y}, hb[2] = {h.x, h.y};
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        float f[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            f[k] = d * (float)(((u[j] >> (shift + 8 * k)) & 0xF) | (((hb[j] >> (s + 8 * k)) & 1) << 4)) - m;
        w[2 * j] = __floats2half2_rn(f[0], f[1]);
        w[2 * j + 1] = __floats2half2_rn(f[2], f[3]);
    }
}

// The kernels instantiated per format are the rows of ../gpu_kernel_names.h (matvec.cuh,
// mmq.cuh): T_<TYPE> is its TYPE column.

// The formats decoded eight weights at a time (Q4_1 .. IQ1_M): their own file.
#include "quant_oct.cuh"
