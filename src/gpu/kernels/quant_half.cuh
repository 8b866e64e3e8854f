// quant_half.cuh - the FP16 decoders of IQ4_XS, Q2_K, Q3_K and MXFP4 (load_chunk_h: the matvec
// kernels and the FP16 dequantiser; load_oct_h: mmq's fragments; IQ4_NL's load_oct_h too), the
// way quant.cuh decodes Q4_K/Q6_K.
//
// Why: the generic decode (load_oct in FP32, rounded once) reads these blocks a byte at a time
// and IQ4_XS's levels from a table in memory, which left their batch-1 matvecs issue bound at
// about half llama.cpp's speed per byte (docs/benchmarks.md).  Here whole 32-bit words of quants
// are decoded with byte permutes: a quant (or an IQ4 level + 128) placed in the mantissa of
// 1024.0h (0x64 as the high byte) is 1024 + q exactly, a subtraction leaves q exactly, and one
// FP16 fma/mul applies the sub-block's scale rounded to FP16: w = fp16(fp16(d * sc) * q - fp16(dmin
// * mn)) (Q2_K), fp16(fp16(d * (sc - 32)) * (q - 4)) (Q3_K), fp16(fp16(d * (ls - 32)) * level)
// (IQ4_XS).  Against the FP32 decode that adds one FP16 rounding of the scale (relative 2^-11,
// as for Q4_K/Q6_K).  A whole chunk and one oct run the same per-word helpers on the same bytes,
// so the matvec kernels and mmq multiply the same bits.
#pragma once
#include "common.cuh"

// PTX prmt: bytes of {b, a} picked by the low 4 nibbles of sel (a nibble's bit 3 would make
// its byte the picked byte's sign, so callers keep it clear).  __byte_perm masks sel first,
// an AND per permute.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// An FP16 pair from its bits (the constants below: no conversion at run time).
__device__ __forceinline__ __half2 h2_from_bits(uint32_t u) { return *(const __half2 *)&u; }

// The low byte of each FP16 lane from bytes of q (sel: byte indices 0..3 of q in the even
// nibbles, 4 = the 0x64 exponent byte in the odd ones), i.e. the pair (1024 + q_a, 1024 + q_b).
__device__ __forceinline__ __half2 bytes_1024(uint32_t q, uint32_t sel)
{
    return h2_from_bits(prmt(q, 0x64646464u, sel));
}

// N words of bytes p[0, 4N) where p is only ALIGN-byte aligned (2: Q3_K's 110-byte super-blocks,
// IQ4_NL's 18-byte blocks; 1: MXFP4's 17-byte blocks): aligned 32-bit loads and a funnel shift
// each, instead of narrower loads and merges.  The extra word, read only when p is not 4-byte
// aligned, holds byte p[4N - 1], so it lies inside the 4-byte-aligned span of the bytes p reads:
// for a 2-byte-aligned p in the same super-block (every caller's range ends at least 2 bytes
// before its block does) or, 2 bytes before p, in the block or row before it.  GLOBAL: through
// the read-only cache (the matvecs), else plain (mmq's stage).  (ALIGN 2 masks p's bit 1 alone:
// the same shift as bits 0-1 for such a p.)
template <int N, bool GLOBAL, int ALIGN>
__device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t out[N])
{
    static_assert(ALIGN == 1 || ALIGN == 2, "4-byte-aligned words need no shift");
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & (ALIGN == 1 ? 3u : 2u)) * 8u;
    uint32_t v[N + 1];
#pragma unroll
    for (int k = 0; k < N; k++) v[k] = GLOBAL ? __ldg(a + k) : a[k];
    v[N] = sh ? (GLOBAL ? __ldg(a + N) : a[N]) : 0u;
#pragma unroll
    for (int k = 0; k < N; k++) out[k] = __funnelshift_r(v[k], v[k + 1], sh);
}

// ---- Q8_0: {f16 d; int8 qs[32]} (34 bytes, 2-byte aligned as they lie).  mmq's (and
// mmq_narrow's) oct: its two words of quants in aligned loads (ld_words), each signed quant
// q + 128 (the sign bit flipped) permuted under the 0x64 exponent byte, 1152 + q exactly, less
// 1152 (0x6480), times d in FP16: the exact product rounded once, as the FP32 decode's
// fp16(d * q) was -- the same bits (d * q is exact in FP32 and FP16's multiply rounds to nearest
// even, subnormals included; +-0 as d's sign gives), without its 8 integer conversions (a
// quarter-rate pipe), 8 FP32 multiplies and 4 packs an oct.  docs/benchmarks.md "The dense Q8_0
// products' waves".  (ld_words' extra word, for an oct 2 bytes off a word, may take the 2 bytes
// after the block: the next block's scale, or the staged row's padding past its last block --
// mmq's stage rows are at least rb + 16 bytes wide where a row's stage does not start aligned.)
template <> __device__ __forceinline__ void load_oct_h<T_Q8_0>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint8_t *b = row + (size_t)c * 34;
    const uint32_t dh = ld_u16(b);
    const __half2 d = h2_from_bits(dh | dh << 16), bias = h2_from_bits(0x64806480u);
    uint32_t q[2];
    ld_words<2, false, 2>(b + 2 + 8 * o, q);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint32_t u = q[j] ^ 0x80808080u;
        w[2 * j] = __hmul2_rn(__hsub2(bytes_1024(u, 0x4140u), bias), d);
        w[2 * j + 1] = __hmul2_rn(__hsub2(bytes_1024(u, 0x4342u), bias), d);
    }
}

// ---- IQ4_XS: {f16 d; u16 scales_h; scales_l[4]; qs[128]} (136 bytes, 8-byte aligned as they
// lie); sub-block s: levels at the nibbles of qs[16s ..] (weight j < 16 low nibble of byte j,
// j >= 16 the high one of byte j - 16) under d * (ls - 32).

// The 16 IQ4 levels + 128 (1 .. 241) as bytes, four to a word: the table the byte permutes
// read from registers.
#define IQ4_LEVELS_0 0x3F2D1801u // -127 -104 -83 -65
#define IQ4_LEVELS_1 0x766A5D4Fu //  -49  -35 -22 -10
#define IQ4_LEVELS_2 0xA6998D81u //    1   13  25  38
#define IQ4_LEVELS_3 0xF1D9C5B5u //   53   69  89 113

// The levels + 128 of the 8 nibbles of u from a 16-entry byte table t0..t3 (entries 4i..4i+3
// in word i): r0 = bytes for nibbles 0..3 (byte 0 low, byte 0 high, byte 1 low, byte 1 high),
// r1 for nibbles 4..7.  A permute's selector takes 3 bits, so each nibble is looked up in
// entries 0-7 and 8-15 and its bit 3 picks one (llama.cpp's get_int_from_table_16).
__device__ __forceinline__ void level16_bytes(uint32_t u, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3,
                                              uint32_t &r0, uint32_t &r1)
{
    const uint32_t pick = 0x32103210u | ((u >> 1) & 0x44444444u), u7 = u & 0x77777777u;
    const uint32_t lo0 = prmt(t0, t1, u7), hi0 = prmt(t2, t3, u7);
    const uint32_t lo1 = prmt(t0, t1, u7 >> 16), hi1 = prmt(t2, t3, u7 >> 16);
    r0 = prmt(lo0, hi0, pick);
    r1 = prmt(lo1, hi1, pick >> 16);
}

// Weights from one word u of a sub-block's quants (bytes 4i .. 4i + 3): sel 0x4240 the low
// nibbles' weights 4i .. 4i + 3, sel 0x4341 the high ones' (16 + 4i ..), as two FP16 pairs.
__device__ __forceinline__ void iq4_h_pairs(uint32_t r0, uint32_t r1, uint32_t sel, __half2 dl, __half2 w[2])
{
    const __half2 k1152 = h2_from_bits(0x64806480u); // 1152: 1024 + the 128 bias of the table
    w[0] = __hmul2(__hsub2(bytes_1024(r0, sel), k1152), dl);
    w[1] = __hmul2(__hsub2(bytes_1024(r1, sel), k1152), dl);
}

// One word u of 8 nibbles through the 16-level table t0..t3 (level16_bytes) under the scale dl:
// lo = the low nibbles' weights as two FP16 pairs (iq4_h_pairs' 0x4240), hi = the high ones'
// (0x4341).  IQ4_XS's chunks, the IQ4 octs of mmq and MXFP4's chunks differ only in the table,
// the scale and where the pairs go.
__device__ __forceinline__ void level16_h_word(uint32_t u, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3,
                                               __half2 dl, __half2 lo[2], __half2 hi[2])
{
    uint32_t r0, r1;
    level16_bytes(u, t0, t1, t2, t3, r0, r1);
    iq4_h_pairs(r0, r1, 0x4240, dl, lo);
    iq4_h_pairs(r0, r1, 0x4341, dl, hi);
}

__device__ __forceinline__ void iq4_h_word(uint32_t u, __half2 dl, __half2 lo[2], __half2 hi[2])
{
    level16_h_word(u, IQ4_LEVELS_0, IQ4_LEVELS_1, IQ4_LEVELS_2, IQ4_LEVELS_3, dl, lo, hi);
}

// fp16(d * (ls - 32)) of sub-block s from the super-block's first 8 bytes (as one uint2).
__device__ __forceinline__ __half2 iq4xs_h_scale(uint2 hdr, int s)
{
    const int ls = (int)((hdr.y >> (4 * s)) & 0xF) | (int)(((hdr.x >> (16 + 2 * s)) & 3) << 4);
    return __float2half2_rn(half_bits_to_float((uint16_t)(hdr.x & 0xFFFF)) * (float)(ls - 32));
}

// A chunk of IQ4_XS as it lies: its four words of quants and its super-block's first 8 bytes
// (d and the scales), decoded a word at a time (iq4_h_word) under iq4xs_h_scale(h, c & 7) by
// the one-row products, which so keep 6 registers of it live instead of the 16 of decoded
// pairs (row_dots_mma: registers bound how many warps stream weights) and load the next
// chunk's while they decode this one (nothing computed from the loads until they are used).
struct iq4xs_raw {
    uint32_t u[4];
    uint2 h;
};

__device__ __forceinline__ iq4xs_raw iq4xs_load(const uint8_t *row, int c)
{
    const uint8_t *b = row + (size_t)(c >> 3) * 136;
    const uint2 *qp = (const uint2 *)(b + 8 + 16 * (c & 7));
    const uint2 v0 = __ldg(qp), v1 = __ldg(qp + 1);
    return {{v0.x, v0.y, v1.x, v1.y}, __ldg((const uint2 *)b)};
}

template <> __device__ __forceinline__ void load_chunk_h<T_IQ4_XS>(const uint8_t *row, int c, __half2 w[16])
{
    const iq4xs_raw q = iq4xs_load(row, c);
    const __half2 dl = iq4xs_h_scale(q.h, c & 7);
#pragma unroll
    for (int i = 0; i < 4; i++) iq4_h_word(q.u[i], dl, &w[2 * i], &w[8 + 2 * i]);
}

// ---- mmq's IQ4 fragments (load_oct_h of IQ4_XS and IQ4_NL): a lane's oct is the low (o < 2) or
// the high (o >= 2) nibbles of 8 quant bytes x (bytes 0-3), y (4-7), so the two words' level
// lookups above would each decode 8 levels of which the lane keeps 4.  Here the 8 wanted nibbles
// are packed into one word first -- byte i holds x's nibble of byte i low and y's high -- and
// looked up once: r0 = levels (x0, y0, x1, y1), r1 = (x2, y2, x3, y3), whose even bytes are the
// pairs of x and odd bytes those of y (iq4_h_pairs' two selectors).  3 instructions to pack
// against the 11 of a second lookup; the same levels and the same FP16 arithmetic, so the same
// bits as before and as load_chunk_h.  sh = 4 * (o >> 1): x >> sh, y << (4 - sh) put the wanted
// nibbles in the low and the high halves of each byte.
// (oct_nibbles: the packing, also MXFP4's octs' below; level16_oct_h: any 16-level table t0..t3.)
__device__ __forceinline__ uint32_t oct_nibbles(uint32_t x, uint32_t y, int o)
{
    const uint32_t sh = 4u * (uint32_t)(o >> 1);
    return ((x >> sh) & 0x0F0F0F0Fu) | ((y << (4u - sh)) & 0xF0F0F0F0u); // one lop3
}
__device__ __forceinline__ void level16_oct_h(uint32_t x, uint32_t y, int o, uint32_t t0, uint32_t t1, uint32_t t2,
                                              uint32_t t3, __half2 dl, __half2 w[4])
{
    level16_h_word(oct_nibbles(x, y, o), t0, t1, t2, t3, dl, &w[0], &w[2]); // x's weights 0-3 (the low nibbles), y's 4-7 (the high)
}

__device__ __forceinline__ void iq4_oct_h(uint32_t x, uint32_t y, int o, __half2 dl, __half2 w[4])
{
    level16_oct_h(x, y, o, IQ4_LEVELS_0, IQ4_LEVELS_1, IQ4_LEVELS_2, IQ4_LEVELS_3, dl, w);
}

// iq4xs_h_scale in FP16 arithmetic (mmq: every lane computes its two rows' scales each chunk, so
// this is per-oct work there): d is FP16 already and ls - 32 (-32 .. 31) is exact in FP16 (1024
// + ls placed in the mantissa, minus 1056), so one hmul2 rounds the exact product d * (ls - 32)
// once -- the bits of the FP32 product rounded to FP16 (exact in FP32: 11 x 6 significant
// bits), without the three conversions.  (The batch-1 products keep iq4xs_h_scale: not their
// hot path, and left as measured.)
__device__ __forceinline__ __half2 iq4xs_h_scale_h(uint2 hdr, int s)
{
    const uint32_t ls = ((hdr.y >> (4 * s)) & 0xFu) | (((hdr.x >> (16 + 2 * s)) & 3u) << 4);
    const __half2 l = __hsub2(h2_from_bits((ls * 0x00010001u) | 0x64006400u), h2_from_bits(0x64206420u)); // - 1056
    return __hmul2(h2_from_bits(prmt(hdr.x, 0u, 0x1010u)), l); // (d, d) * (ls - 32)
}

template <> __device__ __forceinline__ void load_oct_h<T_IQ4_XS>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 136;
    const int s = c & 7;
    const uint2 v = ((const uint2 *)(b + 8 + 16 * s))[o & 1];
    iq4_oct_h(v.x, v.y, o, iq4xs_h_scale_h(*(const uint2 *)b, s), w);
}

// IQ4_NL: {f16 d; qs[16]} (18 bytes, 2-byte aligned as they lie): the generic decode's
// fp16(d * level) (the FP32 product is exact), here one hmul2 of the FP16 d and the level.
template <> __device__ __forceinline__ void load_oct_h<T_IQ4_NL>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint8_t *b = row + (size_t)c * 18;
    uint32_t q[2];
    ld_words<2, false, 2>(b + 2 + 8 * (o & 1), q);
    const uint32_t d = ld_u16(b);
    iq4_oct_h(q[0], q[1], o, h2_from_bits(d | d << 16), w);
}

// ---- Q5_0: {f16 d; u32 qh; qs[16]} (22 bytes, 2-byte aligned as they lie): w = fp16(d * (q -
// 16)), q = the nibble (low for weights j < 16, high for j >= 16, of qs[j & 15]) | bit j of qh
// << 4.  llama-quantize writes it for the Q4_K rows whose width is no whole super-block
// (DeepSeek-V2-Lite's and GLM-4.5-Air's 1,408-wide expert down rows in Q4_K_M's plain layers).
// The generic oct read 8 quant bytes and qh one by one and converted each weight through FP32:
// DeepSeek-V2-Lite's batch-8 grouped down kernel on it streamed 0.65 TB/s, shared-memory
// (MIO) bound, against 1.6 TB/s for the Q8_0 layers' (docs/benchmarks.md, "A batch-8
// DeepSeek-V2-Lite step kernel by kernel").  Here the header and the oct's 8 quant bytes are
// four words (ld_words), the fifth bits spread into the bytes by one multiply, and each pair is
// 1024 + q placed in an FP16 mantissa (bytes_1024), minus 1040, times d in FP16: d * (q - 16)
// (11 x 5 significant bits) is exact in FP32 and rounded once either way, so these are the
// generic decode's bits.

// Bits 0..3 of v to bit 4 of bytes 0..3 (the four products v_i 2^(i + 7m) are distinct powers,
// so no carries; the mask keeps those at 8i).
__device__ __forceinline__ uint32_t q5_spread(uint32_t v) { return (((v & 0xFu) * 0x00204081u) & 0x01010101u) << 4; }

// Four 5-bit quants (bytes of u) as two FP16 pairs d * (q - 16).
__device__ __forceinline__ void q5_0_h_pairs(uint32_t u, __half2 dl, __half2 w[2])
{
    const __half2 k1040 = h2_from_bits(0x64106410u); // 1024 + the 16 offset
    w[0] = __hmul2(__hsub2(bytes_1024(u, 0x4140u), k1040), dl);
    w[1] = __hmul2(__hsub2(bytes_1024(u, 0x4342u), k1040), dl);
}

template <> __device__ __forceinline__ void load_oct_h<T_Q5_0>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint8_t *b = row + (size_t)c * 22;
    uint32_t h[2], q[2];
    ld_words<2, false, 2>(b, h); // d | qh's low half, qh's high half | qs[0..1]
    ld_words<2, false, 2>(b + 6 + 8 * (o & 1), q);
    const uint32_t qh = __funnelshift_r(h[0], h[1], 16) >> (8 * o), sh = 4u * (uint32_t)(o >> 1);
    const __half2 dl = h2_from_bits(prmt(h[0], 0u, 0x1010u)); // (d, d)
    q5_0_h_pairs(((q[0] >> sh) & 0x0F0F0F0Fu) | q5_spread(qh), dl, &w[0]);
    q5_0_h_pairs(((q[1] >> sh) & 0x0F0F0F0Fu) | q5_spread(qh >> 4), dl, &w[2]);
}

// ---- MXFP4: {u8 e (E8M0); qs[16] (E2M1 codes)} (17 bytes, at any byte alignment as they lie):
// weight j < 16 is the low nibble of qs[j], j >= 16 the high one of qs[j - 16] (IQ4_XS's
// sub-block layout), w = 2^(e - 128) * doubled E2M1 value (quant_oct.cuh load_oct<T_MXFP4>).
// The generic decode read the block a byte at a time and each level from a table in memory
// (49 loads a chunk, the gpt-oss experts' batch-1 products issue bound at 0.6-0.8 TB/s).  Here
// the 16 quant bytes are 4 words (aligned loads and funnel shifts), the levels come from byte
// permutes, and one FP16 multiply applies 2^(e - 128): a level (at most 4 significant bits)
// times a power of two rounds once, in FP16 as the FP32 product's rounding to FP16 does, so
// the bits are the generic decode's wherever 2^(e - 128) is an FP16 value (e in 104..143); a
// block with another scale (none in the published files) takes the generic decode.

// The doubled E2M1 levels + 128 (0 1 2 3 4 6 8 12, then their negatives), four to a word.
#define MXFP4_LEVELS_0 0x83828180u
#define MXFP4_LEVELS_1 0x8C888684u
#define MXFP4_LEVELS_2 0x7D7E7F80u
#define MXFP4_LEVELS_3 0x74787A7Cu

// 2^(e - 128) as an FP16 pair into dl where it is an FP16 value (e in 104..143: normal, or
// subnormal below 2^-14); false for any other scale, which takes the generic decode.
__device__ __forceinline__ bool mxfp4_h_scale(uint32_t e, __half2 &dl)
{
    const int s = (int)e - 128;
    if (s < -24 || s > 15) return false;
    const uint32_t sb = s >= -14 ? (uint32_t)(s + 15) << 10 : 1u << (s + 24);
    dl = h2_from_bits(sb | sb << 16);
    return true;
}

// A chunk of MXFP4 as it lies: its four words of quants and its scale byte, decoded apart from
// the load (mxfp4_decode_h), so that the experts' down kernel keeps 5 registers a chunk live
// while its four choices' loads are in flight instead of the 16 of decoded pairs (as iq4xs_raw).
struct mxfp4_raw {
    uint32_t u[4];
    uint32_t e;
};

__device__ __forceinline__ mxfp4_raw mxfp4_load(const uint8_t *row, int c)
{
    const uint8_t *b = row + (size_t)c * 17;
    mxfp4_raw q;
    q.e = __ldg(b);
    ld_words<4, true, 1>(b + 1, q.u);
    return q;
}

__device__ __forceinline__ void mxfp4_decode_h(const mxfp4_raw &q, __half2 w[16])
{
    __half2 dl;
    if (!mxfp4_h_scale(q.e, dl)) { // not an FP16 value: load_oct's FP32 products, rounded once
        const float d = __uint_as_float(q.e < 2 ? 0x00200000u << q.e : (q.e - 1) << 23);
#pragma unroll
        for (int i = 0; i < 16; i++) { // weights 2i, 2i + 1: byte (2i & 15) + k's nibble 2i >> 4
            const uint32_t sh = 8u * (uint32_t)((2 * i) & 3) + 4u * (uint32_t)(i >> 3), u = q.u[(i & 7) >> 1];
            w[i] = __floats2half2_rn(d * (float)mxfp4_levels[(u >> sh) & 0xF],
                                     d * (float)mxfp4_levels[(u >> (sh + 8)) & 0xF]);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
        level16_h_word(q.u[i], MXFP4_LEVELS_0, MXFP4_LEVELS_1, MXFP4_LEVELS_2, MXFP4_LEVELS_3, dl, &w[2 * i],
                       &w[8 + 2 * i]);
}

template <> __device__ __forceinline__ void load_chunk_h<T_MXFP4>(const uint8_t *row, int c, __half2 w[16])
{
    mxfp4_decode_h(mxfp4_load(row, c), w);
}

// The doubled E2M1 levels (0 1 2 3 4 6 8 12, then their negatives, -0 as +0) are FP16 numbers
// whose low byte is zero: the table of their high bytes (four to a word), looked up by
// level16_bytes, gives each weight's FP16 level with one permute beside a zero byte -- the
// level exactly, as the biased table's 1024 + 128 + level minus 1152 gave it (MXFP4_LEVELS_*:
// one FP16 subtraction a pair more), so the product with the scale rounds to the same bits.
#define MXFP4_HI_0 0x42403C00u // 0 1 2 3
#define MXFP4_HI_1 0x4A484644u // 4 6 8 12
#define MXFP4_HI_2 0xC2C0BC00u // 0 -1 -2 -3
#define MXFP4_HI_3 0xCAC8C6C4u // -4 -6 -8 -12

// mmq's MXFP4 fragments (mmq and mmq_narrow, from their shared-memory stage, rows at any byte
// offset): the generic oct read 8 quant bytes one by one and 8 levels from a table in memory,
// then converted each through FP32 -- the batched gpt-oss experts' fragments were mostly that
// decode (docs/benchmarks.md, "Batched MoE decode on mmq_narrow").  Here the oct's 8 bytes are
// two words (ld_words), its 8 nibbles packed and looked up once (oct_nibbles, as IQ4's octs),
// under the same FP16 scale as load_chunk_h: the same bits as the generic oct and as the
// batch-1 products' chunks.
template <> __device__ __forceinline__ void load_oct_h<T_MXFP4>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint8_t *b = row + (size_t)c * 17;
    __half2 dl;
    if (!mxfp4_h_scale(b[0], dl)) {
        float f[8];
        load_oct<T_MXFP4>(row, c, o, f);
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
        return;
    }
    uint32_t q[2], r0, r1;
    ld_words<2, false, 1>(b + 1 + 8 * (o & 1), q);
    level16_bytes(oct_nibbles(q[0], q[1], o), MXFP4_HI_0, MXFP4_HI_1, MXFP4_HI_2, MXFP4_HI_3, r0, r1);
    // r0 = high bytes of (x0, y0, x1, y1), r1 of (x2, y2, x3, y3): each pair a permute beside zero
    // low bytes (0x2404: bytes 0 and 2, x's; 0x3414: bytes 1 and 3, y's)
    w[0] = __hmul2(h2_from_bits(prmt(r0, 0u, 0x2404u)), dl);
    w[1] = __hmul2(h2_from_bits(prmt(r1, 0u, 0x2404u)), dl);
    w[2] = __hmul2(h2_from_bits(prmt(r0, 0u, 0x3414u)), dl);
    w[3] = __hmul2(h2_from_bits(prmt(r1, 0u, 0x3414u)), dl);
}

// ---- Q2_K: {scales[16] (4-bit scale | 4-bit min << 4 per 16 w); qs[64]; f16 d, dmin} (84
// bytes, 4-byte aligned as they lie).  Sub-block s: bits 2(s % 4) of qs[32(s / 4) + l] for
// weight l; weights 0-15 under scales[2s], 16-31 under scales[2s + 1].

// fp16(d * sc) and -fp16(dmin * mn) of a scale byte; dd = the u32 of d, dmin.
__device__ __forceinline__ void q2k_h_scale(uint32_t dd, uint32_t sc, __half2 &d2, __half2 &m2)
{
    d2 = __float2half2_rn(half_bits_to_float((uint16_t)(dd & 0xFFFF)) * (float)(sc & 0xF));
    m2 = __float2half2_rn(-half_bits_to_float((uint16_t)(dd >> 16)) * (float)(sc >> 4));
}

// Four weights from one word of quant bytes (bytes 4i .. 4i + 3 of the sub-block's 32) shifted
// so the sub-block's 2 bits are each byte's lowest.
__device__ __forceinline__ void q2k_h_word(uint32_t u, __half2 d2, __half2 m2, __half2 w[2])
{
    const __half2 k1024 = h2_from_bits(0x64006400u); // 1024
    const uint32_t q = u & 0x03030303u;
    w[0] = __hfma2(__hsub2(bytes_1024(q, 0x4140), k1024), d2, m2);
    w[1] = __hfma2(__hsub2(bytes_1024(q, 0x4342), k1024), d2, m2);
}

template <> __device__ __forceinline__ void load_chunk_h<T_Q2_K>(const uint8_t *row, int c, __half2 w[16])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 84;
    const int s = c & 7, sh = 2 * (s & 3);
    const uint32_t dd = __ldg((const uint32_t *)(b + 80)), sc = __ldg((const uint16_t *)(b + 2 * s));
    __half2 d2[2], m2[2];
    q2k_h_scale(dd, sc & 0xFF, d2[0], m2[0]);
    q2k_h_scale(dd, sc >> 8, d2[1], m2[1]);
    const uint32_t *qp = (const uint32_t *)(b + 16 + 32 * (s >> 2));
#pragma unroll
    for (int i = 0; i < 8; i++) q2k_h_word(__ldg(qp + i) >> sh, d2[i >> 2], m2[i >> 2], &w[2 * i]);
}

template <> __device__ __forceinline__ void load_oct_h<T_Q2_K>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 84;
    const int s = c & 7, sh = 2 * (s & 3);
    __half2 d2, m2;
    q2k_h_scale(*(const uint32_t *)(b + 80), b[2 * s + (o >> 1)], d2, m2);
    const uint32_t *qp = (const uint32_t *)(b + 16 + 32 * (s >> 2) + 8 * o);
    q2k_h_word(qp[0] >> sh, d2, m2, &w[0]);
    q2k_h_word(qp[1] >> sh, d2, m2, &w[2]);
}

// ---- Q3_K: {hmask[32]; qs[64]; scales[12] (16 six-bit scales, biased by 32); f16 d} (110
// bytes, 2-byte aligned as they lie).  Sub-block s: the 2 low bits as Q2_K's, the third bit s of
// hmask[l]; q3 = low + 4 * high, w = d * (sc - 32) * (q3 - 4); weights 0-15 under scale 2s,
// 16-31 under 2s + 1.

// fp16(d * (sc - 32)) of scales 2s (x) and 2s + 1 (y) as two pairs.
template <bool GLOBAL>
__device__ __forceinline__ void q3k_h_scales(const uint8_t *b, int s, __half2 dl[2])
{
    // scale kk: low nibble of scales[kk % 8] >> 4 (kk / 8), high 2 bits of scales[8 + kk % 4] >>
    // 2 (kk / 4); for kk = 2s, 2s + 1 the bytes are adjacent and the shifts the same
    const uint16_t *lp = (const uint16_t *)(b + 96 + 2 * (s & 3)), *hp = (const uint16_t *)(b + 104 + 2 * (s & 1));
    const uint32_t lo = (uint32_t)(GLOBAL ? __ldg(lp) : *lp) >> (4 * (s >> 2));
    const uint32_t hi = (uint32_t)(GLOBAL ? __ldg(hp) : *hp) >> (2 * (s >> 1));
    const float d = half_bits_to_float(GLOBAL ? __ldg((const uint16_t *)(b + 108)) : ld_u16(b + 108));
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int sc = (int)(((lo >> (8 * h)) & 0xF) | (((hi >> (8 * h)) & 3) << 4));
        dl[h] = __float2half2_rn(d * (float)(sc - 32));
    }
}

// Four weights from a word of low bits and one of hmask bytes, each shifted so the sub-block's
// bits are each byte's lowest.
__device__ __forceinline__ void q3k_h_word(uint32_t ql, uint32_t hm, __half2 dl, __half2 w[2])
{
    const __half2 k1028 = h2_from_bits(0x64046404u); // 1028: 1024 + the 4 offset of the 3-bit quants
    const uint32_t q = (ql & 0x03030303u) | ((hm & 0x01010101u) << 2);
    w[0] = __hmul2(__hsub2(bytes_1024(q, 0x4140), k1028), dl);
    w[1] = __hmul2(__hsub2(bytes_1024(q, 0x4342), k1028), dl);
}

template <> __device__ __forceinline__ void load_chunk_h<T_Q3_K>(const uint8_t *row, int c, __half2 w[16])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 110;
    const int s = c & 7, sh = 2 * (s & 3);
    __half2 dl[2];
    q3k_h_scales<true>(b, s, dl);
    uint32_t ql[8], hm[8];
    ld_words<8, true, 2>(b + 32 + 32 * (s >> 2), ql);
    ld_words<8, true, 2>(b, hm);
#pragma unroll
    for (int i = 0; i < 8; i++) q3k_h_word(ql[i] >> sh, hm[i] >> s, dl[i >> 2], &w[2 * i]);
}

template <> __device__ __forceinline__ void load_oct_h<T_Q3_K>(const uint8_t *row, int c, int o, __half2 w[4])
{
    const uint8_t *b = row + (size_t)(c >> 3) * 110;
    const int s = c & 7, sh = 2 * (s & 3);
    __half2 dl[2];
    q3k_h_scales<false>(b, s, dl);
    uint32_t ql[2], hm[2];
    ld_words<2, false, 2>(b + 32 + 32 * (s >> 2) + 8 * o, ql);
    ld_words<2, false, 2>(b + 8 * o, hm);
    const __half2 d = o < 2 ? dl[0] : dl[1];
    q3k_h_word(ql[0] >> sh, hm[0] >> s, d, &w[0]);
    q3k_h_word(ql[1] >> sh, hm[1] >> s, d, &w[2]);
}
