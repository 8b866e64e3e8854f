// quant_oct.cuh - the weight formats decoded eight weights ("an oct") at a time: Q4_1, Q5_0,
// Q5_1, IQ4_NL, MXFP4 (32-weight blocks), Q2_K, Q3_K, IQ4_XS and the grid formats IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (256-weight super-blocks).
//
// Each format has one decoder, load_oct<T>(row, c, o, w): weights 32c + 8o .. 32c + 8o + 7 of a
// row in FP32, with the CPU's arithmetic (src/model/quant.c; the layouts are described at its
// block structs).  load_chunk<T> is four of them and load_oct_h<T> one rounded to FP16 pairs,
// so the matvec kernels, the FP16 dequantiser, the embedding gather and mmq all read the same
// values.  The blocks are read as they lie in the GGUF file: their sizes (17..136 bytes) leave
// fields only 2-byte aligned (MXFP4's 17-byte blocks: not even that, so it reads bytes only;
// its FP16 decoders in quant_half.cuh read words),
// so every load is of a byte or a 16-bit word, from global memory
// or from mmq's shared-memory stage alike.  The IQ lookup grids live in device memory (the
// tables of src/model/quant_grids.h, generated from gguf-py's constants).
#pragma once
#include "common.cuh"

#define QUANT_GRID_TABLE static __device__ const
#include "../../model/quant_grids.h"

enum {
    T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q2_K = 10, T_Q3_K = 11, T_IQ2_XXS = 16, T_IQ2_XS = 17,
    T_IQ3_XXS = 18, T_IQ1_S = 19, T_IQ4_NL = 20, T_IQ3_S = 21, T_IQ2_S = 22, T_IQ4_XS = 23, T_IQ1_M = 29,
    T_MXFP4 = 39
};

// The 16 levels of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl).
static __device__ const int8_t iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};

__device__ __forceinline__ uint32_t ld_u32_2(const uint8_t *p) { return (uint32_t)ld_u16(p) | ((uint32_t)ld_u16(p + 2) << 16); }

template <int T> __device__ __forceinline__ void load_oct(const uint8_t *row, int c, int o, float w[8]);

// ---- 32-weight blocks: weight j < 16 is the low nibble of qs[j], j >= 16 the high one of
// qs[j - 16], so oct o reads qs[8(o&1) ..] shifted by 4(o>>1).

// Q4_1: {f16 d, m; qs[16]}: w = d*q + m.
template <> __device__ __forceinline__ void load_oct<T_Q4_1>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)c * 20, *q = b + 4 + 8 * (o & 1);
    const float d = half_bits_to_float(ld_u16(b)), m = half_bits_to_float(ld_u16(b + 2));
    const int sh = (o >> 1) * 4;
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = d * (float)((q[k] >> sh) & 0xF) + m;
}

// Q5_0 / Q5_1: the fifth bit of weight j is bit j of the u32 qh.
__device__ __forceinline__ void q5_oct(const uint8_t *qh4, const uint8_t *qs, int o, int q[8])
{
    const uint32_t qh = ld_u32_2(qh4) >> (8 * o);
    const uint8_t *p = qs + 8 * (o & 1);
    const int sh = (o >> 1) * 4;
#pragma unroll
    for (int k = 0; k < 8; k++) q[k] = ((p[k] >> sh) & 0xF) | (int)(((qh >> k) & 1) << 4);
}

// Q5_0: {f16 d; u32 qh; qs[16]}: w = d*(q - 16).
template <> __device__ __forceinline__ void load_oct<T_Q5_0>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)c * 22;
    const float d = half_bits_to_float(ld_u16(b));
    int q[8];
    q5_oct(b + 2, b + 6, o, q);
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = d * (float)(q[k] - 16);
}

// Q5_1: {f16 d, m; u32 qh; qs[16]}: w = d*q + m.
template <> __device__ __forceinline__ void load_oct<T_Q5_1>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)c * 24;
    const float d = half_bits_to_float(ld_u16(b)), m = half_bits_to_float(ld_u16(b + 2));
    int q[8];
    q5_oct(b + 4, b + 8, o, q);
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = d * (float)q[k] + m;
}

// 8 weights of a 16-byte nibble group indexing the IQ4 levels: w = d*level.
__device__ __forceinline__ void iq4_oct(float d, const uint8_t *qs, int o, float w[8])
{
    const uint8_t *p = qs + 8 * (o & 1);
    const int sh = (o >> 1) * 4;
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = d * (float)iq4nl_levels[(p[k] >> sh) & 0xF];
}

// The 16 E2M1 values of MXFP4, doubled to integers (quant.c's mxfp4_values; the scale is halved).
static __device__ const int8_t mxfp4_levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// IQ4_NL: {f16 d; qs[16]}.
template <> __device__ __forceinline__ void load_oct<T_IQ4_NL>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)c * 18;
    iq4_oct(half_bits_to_float(ld_u16(b)), b + 2, o, w);
}

// MXFP4: {u8 e (E8M0); qs[16] (E2M1 codes)}: w = 2^(e-127)/2 * doubled value.  The half
// scale as float bits: e >= 2 the normal float of exponent e-1, e = 0 and 1 subnormals
// (quant.c's mxfp4_half_scale).
template <> __device__ __forceinline__ void load_oct<T_MXFP4>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)c * 17, *p = b + 1 + 8 * (o & 1);
    const uint32_t e = b[0];
    const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    const int sh = (o >> 1) * 4;
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = d * (float)mxfp4_levels[(p[k] >> sh) & 0xF];
}

// ---- 256-weight super-blocks: chunk c is sub-block s = c & 7 of super-block c >> 3.

// Q2_K / Q3_K's 2-bit quants: weight i of the super-block is bits 2((i%128)/32) of
// qs[32(i/128) + i%32]; for weights 32s + 8o + k that is qs[32(s/4) + 8o + k] >> 2(s%4).
__device__ __forceinline__ int k_low2(const uint8_t *qs, int s, int o, int k)
{
    return (qs[32 * (s >> 2) + 8 * o + k] >> (2 * (s & 3))) & 3;
}

// Q2_K: {scales[16] (4-bit scale | 4-bit min << 4 per 16 w); qs[64]; f16 d, dmin}: w = d*sc*q - dmin*m.
template <> __device__ __forceinline__ void load_oct<T_Q2_K>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 84;
    const int s = c & 7, sc = b[2 * s + (o >> 1)];
    const float dl = half_bits_to_float(ld_u16(b + 80)) * (float)(sc & 0xF);
    const float ml = half_bits_to_float(ld_u16(b + 82)) * (float)(sc >> 4);
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = dl * (float)k_low2(b + 16, s, o, k) - ml;
}

// Q3_K: {hmask[32]; qs[64]; scales[12] (16 six-bit scales, biased by 32); f16 d}:
// w = d*(sc - 32)*(q - (bit s of hmask[8o + k] ? 0 : 4)).
template <> __device__ __forceinline__ void load_oct<T_Q3_K>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 110;
    const int s = c & 7, kk = 2 * s + (o >> 1);
    const int lo = (b[96 + (kk & 7)] >> (4 * (kk >> 3))) & 0xF, hi = (b[104 + (kk & 3)] >> (2 * (kk >> 2))) & 3;
    const float dl = half_bits_to_float(ld_u16(b + 108)) * (float)((lo | (hi << 4)) - 32);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int high = (b[8 * o + k] >> s) & 1;
        w[k] = dl * (float)(k_low2(b + 32, s, o, k) - (high ? 0 : 4));
    }
}

// IQ4_XS: {f16 d; u16 scales_h; scales_l[4]; qs[128]}: sub-block s as an IQ4_NL block under
// d*(ls - 32), ls six bits (a nibble of scales_l, two bits of scales_h).
template <> __device__ __forceinline__ void load_oct<T_IQ4_XS>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 136;
    const int s = c & 7;
    const int ls = ((b[4 + (s >> 1)] >> (4 * (s & 1))) & 0xF) | (((ld_u16(b + 2) >> (2 * s)) & 3) << 4);
    iq4_oct(half_bits_to_float(ld_u16(b)) * (float)(ls - 32), b + 8 + 16 * s, o, w);
}

// ---- the grid formats: oct o of sub-block s is group o of 8 (IQ3: two rows of 4).

// db * magnitude byte k of the grid row * (bit k of signs ? -1 : 1)
__device__ __forceinline__ void signed_oct(float db, uint64_t grid, uint32_t signs, float w[8])
{
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = db * (float)(uint8_t)(grid >> (8 * k)) * ((signs >> k) & 1 ? -1.0f : 1.0f);
}

// IQ2_XXS: {f16 d; per 32 w: 4 grid bytes, u32 of 4 7-bit sign indices | 4-bit scale << 28}.
template <> __device__ __forceinline__ void load_oct<T_IQ2_XXS>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 66, *q = b + 2 + 8 * (c & 7);
    const uint32_t aux = ld_u32_2(q + 4);
    const float db = half_bits_to_float(ld_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.25f;
    signed_oct(db, iq2xxs_grid[q[o]], ksigns_iq2xs[(aux >> (7 * o)) & 127], w);
}

// The nibble scale of groups o of 32-weight sub-block s in IQ2_XS / IQ2_S: d*(0.5 + ls)/4.
__device__ __forceinline__ float iq2_db(float d, const uint8_t *scales, int s, int o)
{
    return d * (0.5f + (float)((scales[s] >> (4 * (o >> 1))) & 0xF)) * 0.25f;
}

// IQ2_XS: {f16 d; u16 qs[32] (9-bit grid index | 7-bit sign index << 9); scales[8]}.
template <> __device__ __forceinline__ void load_oct<T_IQ2_XS>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 74;
    const int s = c & 7;
    const uint16_t q = ld_u16(b + 2 + 2 * (4 * s + o));
    signed_oct(iq2_db(half_bits_to_float(ld_u16(b)), b + 66, s, o), iq2xs_grid[q & 511], ksigns_iq2xs[q >> 9], w);
}

// IQ2_S: {f16 d; qs[32]; signs[32]; qh[8] (the indices' top 2 bits); scales[8]}.
template <> __device__ __forceinline__ void load_oct<T_IQ2_S>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 82;
    const int s = c & 7, g = 4 * s + o;
    const int idx = b[2 + g] | (((b[66 + s] >> (2 * o)) & 3) << 8);
    signed_oct(iq2_db(half_bits_to_float(ld_u16(b)), b + 74, s, o), iq2s_grid[idx], b[34 + g], w);
}

// IQ3_XXS: {f16 d; qs[64] (a grid byte per 4 w); per 32 w a u32 of sign indices | scale << 28}.
template <> __device__ __forceinline__ void load_oct<T_IQ3_XXS>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 98;
    const int s = c & 7;
    const uint32_t aux = ld_u32_2(b + 66 + 4 * s);
    const float db = half_bits_to_float(ld_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
    const uint8_t *q = b + 2 + 8 * s + 2 * o;
    signed_oct(db, (uint64_t)iq3xxs_grid[q[0]] | ((uint64_t)iq3xxs_grid[q[1]] << 32),
               ksigns_iq2xs[(aux >> (7 * o)) & 127], w);
}

// IQ3_S: {f16 d; qs[64]; qh[8] (9th index bits); signs[32]; scales[4] (d*(1 + 2ls) per 32 w)}.
template <> __device__ __forceinline__ void load_oct<T_IQ3_S>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 110;
    const int s = c & 7, qh = b[66 + s];
    const float db = half_bits_to_float(ld_u16(b)) * (float)(1 + 2 * ((b[106 + (s >> 1)] >> (4 * (s & 1))) & 0xF));
    const uint8_t *q = b + 2 + 8 * s + 2 * o;
    const int i1 = q[0] | (((qh >> (2 * o)) & 1) << 8), i2 = q[1] | (((qh >> (2 * o + 1)) & 1) << 8);
    signed_oct(db, (uint64_t)iq3s_grid[i1] | ((uint64_t)iq3s_grid[i2] << 32), b[74 + 4 * s + o], w);
}

// dl * (grid value in {-1, 0, 1} + delta)
__device__ __forceinline__ void iq1_oct(float dl, float delta, uint64_t grid, float w[8])
{
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = dl * ((float)(int8_t)(uint8_t)(grid >> (8 * k)) + delta);
}

// IQ1_S: {f16 d; qs[32]; u16 qh[8]: per 32 w 4 x 3 index bits, scale (12..14), delta sign (15)}.
template <> __device__ __forceinline__ void load_oct<T_IQ1_S>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 50;
    const int s = c & 7;
    const uint16_t qh = ld_u16(b + 34 + 2 * s);
    const float dl = half_bits_to_float(ld_u16(b)) * (float)(2 * ((qh >> 12) & 7) + 1);
    const int idx = b[2 + 4 * s + o] | (((qh >> (3 * o)) & 7) << 8);
    iq1_oct(dl, qh & 0x8000 ? -0.125f : 0.125f, iq1s_grid[idx], w);
}

// IQ1_M: {qs[32]; qh[16] (per 8 w a nibble: 3 index bits, delta sign); u16 scales[4]: 3-bit
// scales per 16 w, with the f16 d in their top nibbles}.
template <> __device__ __forceinline__ void load_oct<T_IQ1_M>(const uint8_t *row, int c, int o, float w[8])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 56;
    const int s = c & 7;
    uint16_t sc[4];
#pragma unroll
    for (int k = 0; k < 4; k++) sc[k] = ld_u16(b + 48 + 2 * k);
    const uint16_t dh = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
    const float dl = half_bits_to_float(dh) * (float)(2 * ((sc[s >> 1] >> (6 * (s & 1) + 3 * (o >> 1))) & 7) + 1);
    const int nib = (b[32 + 2 * s + (o >> 1)] >> (4 * (o & 1))) & 0xF;
    iq1_oct(dl, nib & 8 ? -0.125f : 0.125f, iq1s_grid[b[4 * s + o] | ((nib & 7) << 8)], w);
}

// load_chunk (four octs) of each format above, and load_oct_h (one, rounded as the generic
// load_chunk_h rounds) of those without an FP16 decoder of their own (below).
#define OCT_CHUNK(TT)                                                                                    \
    template <> __device__ __forceinline__ void load_chunk<TT>(const uint8_t *row, int c, float w[32])  \
    {                                                                                                    \
        _Pragma("unroll") for (int o = 0; o < 4; o++) load_oct<TT>(row, c, o, w + 8 * o);                \
    }
#define OCT_FORMAT(TT)                                                                                   \
    OCT_CHUNK(TT)                                                                                        \
    template <> __device__ __forceinline__ void load_oct_h<TT>(const uint8_t *row, int c, int o, __half2 w[4]) \
    {                                                                                                    \
        float f[8];                                                                                      \
        load_oct<TT>(row, c, o, f);                                                                      \
        _Pragma("unroll") for (int i = 0; i < 4; i++) w[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);  \
    }
OCT_FORMAT(T_Q4_1)
OCT_CHUNK(T_Q5_0) // (load_oct_h: quant_half.cuh)
OCT_FORMAT(T_Q5_1)
OCT_CHUNK(T_IQ4_NL) // (load_oct_h: quant_half.cuh)
OCT_CHUNK(T_MXFP4) // (load_oct_h: quant_half.cuh)
OCT_CHUNK(T_Q2_K)
OCT_CHUNK(T_Q3_K)
OCT_CHUNK(T_IQ4_XS)
OCT_FORMAT(T_IQ2_XXS)
OCT_FORMAT(T_IQ2_XS)
OCT_FORMAT(T_IQ2_S)
OCT_FORMAT(T_IQ3_XXS)
OCT_FORMAT(T_IQ3_S)
OCT_FORMAT(T_IQ1_S)
OCT_FORMAT(T_IQ1_M)
#undef OCT_FORMAT
#undef OCT_CHUNK

#include "quant_half.cuh"

// Bytes of 256 inputs of a row (mmq.cuh's stage of one weight row).
template <int T> struct oct_bytes;
template <> struct oct_bytes<T_Q4_1> { static constexpr int n = 8 * 20; };
template <> struct oct_bytes<T_Q5_0> { static constexpr int n = 8 * 22; };
template <> struct oct_bytes<T_Q5_1> { static constexpr int n = 8 * 24; };
template <> struct oct_bytes<T_IQ4_NL> { static constexpr int n = 8 * 18; };
template <> struct oct_bytes<T_MXFP4> { static constexpr int n = 8 * 17; };
template <> struct oct_bytes<T_Q2_K> { static constexpr int n = 84; };
template <> struct oct_bytes<T_Q3_K> { static constexpr int n = 110; };
template <> struct oct_bytes<T_IQ4_XS> { static constexpr int n = 136; };
template <> struct oct_bytes<T_IQ2_XXS> { static constexpr int n = 66; };
template <> struct oct_bytes<T_IQ2_XS> { static constexpr int n = 74; };
template <> struct oct_bytes<T_IQ2_S> { static constexpr int n = 82; };
template <> struct oct_bytes<T_IQ3_XXS> { static constexpr int n = 98; };
template <> struct oct_bytes<T_IQ3_S> { static constexpr int n = 110; };
template <> struct oct_bytes<T_IQ1_S> { static constexpr int n = 50; };
template <> struct oct_bytes<T_IQ1_M> { static constexpr int n = 56; };
