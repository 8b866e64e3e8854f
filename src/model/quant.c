/* quant.c - the GGUF/ggml weight formats on the CPU.
 *
 * Each quantised type has one block decoder (block bytes -> floats, the exact arithmetic of
 * ggml's dequantize_row_*, so results are bit-identical) and one block encoder.  Both the row
 * dequantiser and the dot product are built on the decoder, so the dot product sees exactly
 * the dequantised weights: it decodes one block into a stack buffer that stays in L1 and
 * multiplies it with x in LANES independent float accumulators.  Every inner loop has a
 * constant trip count and no cross-iteration dependency, which is what gcc -O2 needs to
 * vectorise it (a plain `sum += a*b` loop cannot be, since float addition is not associative).
 *
 * Blocks are declared with byte members only, so a block may sit at any address (a GGUF
 * tensor is only 32-byte aligned, and Q4_0 blocks are 18 bytes) and halves are read as
 * little-endian byte pairs, as the file format stores them.
 */
#include "quant.h"

#include "quant_grids.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#define QK4_0 32
#define QK8_0 32
#define K_SCALE_SIZE 12

typedef struct {
    uint8_t d[2];           /* f16 scale */
    uint8_t qs[QK4_0 / 2];  /* weight j in the low nibble of qs[j], j+16 in the high one */
} block_q4_0;

typedef struct {
    uint8_t d[2];
    int8_t qs[QK8_0];
} block_q8_0;

typedef struct {
    uint8_t d[2];           /* f16 scale */
    uint8_t m[2];           /* f16 minimum, added: w = d*q + m */
    uint8_t qs[QK4_0 / 2];  /* nibbles as in Q4_0 */
} block_q4_1;

typedef struct {
    uint8_t d[2];
    uint8_t qh[4];          /* 5th bit of weight j: bit j of this little-endian word */
    uint8_t qs[QK4_0 / 2];  /* low 4 bits, nibbles as in Q4_0; w = d*(q-16) */
} block_q5_0;

typedef struct {
    uint8_t d[2];
    uint8_t m[2];
    uint8_t qh[4];
    uint8_t qs[QK4_0 / 2];  /* w = d*q + m */
} block_q5_1;

typedef struct {
    uint8_t d[2];
    uint8_t qs[QK4_0 / 2];  /* nibbles as in Q4_0, indexes into iq4nl_values; w = d*value */
} block_iq4_nl;

typedef struct {
    uint8_t scales[QK_K / 16];  /* per 16 weights: low nibble scale, high nibble min */
    uint8_t qs[QK_K / 4];       /* 2-bit weights */
    uint8_t d[2];
    uint8_t dmin[2];
} block_q2_K;

typedef struct {
    uint8_t hmask[QK_K / 8];    /* bit i of hmask[l]: weight 32i+l is NOT offset by -4 */
    uint8_t qs[QK_K / 4];       /* low 2 bits */
    uint8_t scales[K_SCALE_SIZE]; /* 16 signed 6-bit scales, biased by 32 (see scale_q3_K) */
    uint8_t d[2];
} block_q3_K;

typedef struct {
    uint8_t d[2];
    uint8_t scales_h[2];        /* top 2 bits of the 8 sub-block scales, 2 bits each */
    uint8_t scales_l[QK_K / 64]; /* low 4 bits, two per byte */
    uint8_t qs[QK_K / 2];       /* per 32 weights: nibbles as in IQ4_NL */
} block_iq4_xs;

typedef struct {
    uint8_t d[2];                   /* f16 scale of the 6-bit sub-block scales */
    uint8_t dmin[2];                /* f16 scale of the 6-bit sub-block mins */
    uint8_t scales[K_SCALE_SIZE];   /* 8 scales + 8 mins, 6 bits each (see scale_min_k4) */
    uint8_t qs[QK_K / 2];
} block_q4_K;

typedef struct {
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];           /* 5th bit: bit 2c / 2c+1 of qh[l] for chunk c */
    uint8_t qs[QK_K / 2];
} block_q5_K;

typedef struct {
    uint8_t ql[QK_K / 2];           /* low 4 bits */
    uint8_t qh[QK_K / 4];           /* high 2 bits */
    int8_t scales[QK_K / 16];       /* one signed 8-bit scale per 16 weights */
    uint8_t d[2];
} block_q6_K;

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl layout");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K layout");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K layout");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs layout");

/* The IQ types: 256 weights per super-block, in groups of 8 (IQ3: 4) that index a lookup grid
 * (quant_grids.h, decoded from gguf-py's constants); signs apart (IQ2, IQ3) or in the grid
 * (IQ1).  w = db * grid[index][j] * sign, db a sub-block scale of the f16 d. */
typedef struct {
    uint8_t d[2];
    uint8_t qs[QK_K / 4];   /* per 32 w: 4 grid bytes, then a u32 of 4 7-bit sign indices and a
                             * 4-bit scale (top); db = d*(0.5+ls)/4 */
} block_iq2_xxs;

typedef struct {
    uint8_t d[2];
    uint8_t qs[QK_K / 4];   /* per 8 w: u16 = 9-bit grid index | 7-bit sign index << 9 */
    uint8_t scales[QK_K / 32]; /* per 16 w, a nibble: db = d*(0.5+ls)/4 */
} block_iq2_xs;

typedef struct {
    uint8_t d[2];
    uint8_t qs[QK_K / 8];   /* low 8 bits of each 8 w's 10-bit grid index */
    uint8_t signs[QK_K / 8]; /* one bit per weight */
    uint8_t qh[QK_K / 32];  /* per 32 w: the 4 indices' top 2 bits */
    uint8_t scales[QK_K / 32]; /* per 16 w, a nibble: db = d*(0.5+ls)/4 */
} block_iq2_s;

typedef struct {
    uint8_t d[2];
    uint8_t qs[QK_K / 4];   /* per 4 w: an 8-bit grid index */
    uint8_t sas[QK_K / 8];  /* per 32 w: u32 of 4 7-bit sign indices and a 4-bit scale (top);
                             * db = d*(0.5+ls)/2 */
} block_iq3_xxs;

typedef struct {
    uint8_t d[2];
    uint8_t qs[QK_K / 4];   /* low 8 bits of each 4 w's 9-bit grid index */
    uint8_t qh[QK_K / 32];  /* bit l of qh[ib]: the 9th bit of index 8ib+l */
    uint8_t signs[QK_K / 8]; /* one bit per weight */
    uint8_t scales[QK_K / 64]; /* per 32 w, a nibble: db = d*(1+2ls) */
} block_iq3_s;

typedef struct {
    uint8_t d[2];
    uint8_t qs[QK_K / 8];   /* low 8 bits of each 8 w's 11-bit grid index */
    uint8_t qh[QK_K / 16];  /* per 32 w, u16: 4 x 3 index bits, 3-bit scale (12..14), delta sign (15) */
} block_iq1_s;

typedef struct {
    uint8_t qs[QK_K / 8];   /* as IQ1_S */
    uint8_t qh[QK_K / 16];  /* per 8 w a nibble: 3 index bits, delta sign (bit 3) */
    uint8_t scales[QK_K / 32]; /* 4 u16: 4 3-bit scales (per 16 w) each, and d's nibbles on top */
} block_iq1_m;

_Static_assert(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs layout");
_Static_assert(sizeof(block_iq2_xs) == 74, "block_iq2_xs layout");
_Static_assert(sizeof(block_iq2_s) == 82, "block_iq2_s layout");
_Static_assert(sizeof(block_iq3_xxs) == 98, "block_iq3_xxs layout");
_Static_assert(sizeof(block_iq3_s) == 110, "block_iq3_s layout");
_Static_assert(sizeof(block_iq1_s) == 50, "block_iq1_s layout");
_Static_assert(sizeof(block_iq1_m) == 56, "block_iq1_m layout");

typedef struct {
    uint8_t e;              /* E8M0 shared exponent: the block scales by 2^(e-127) */
    uint8_t qs[QK4_0 / 2];  /* FP4 (E2M1) codes, nibbles as in Q4_0 */
} block_mxfp4;
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 layout");

/* The 16 E2M1 values, doubled to be integers (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives);
 * the scale is halved to match (mxfp4_half_scale). */
static const int8_t mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* The 16 levels of IQ4_NL and IQ4_XS: a non-uniform grid, denser near zero where most
 * weights lie (ggml's kvalues_iq4nl). */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* ---------------------------------------------------------------- half precision */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact for every half, subnormals included: moving the 15 magnitude bits into float
 * position gives the right mantissa with an exponent 112 too small, and multiplying by 2^112
 * fixes the exponent exactly (also for subnormal halves, which land on float subnormals and
 * become normal).  Only inf/NaN need their exponent set explicitly.  Branch-free, so loops
 * of conversions vectorise. */
float quant_f16_to_f32(uint16_t h)
{
    uint32_t mag = (uint32_t)(h & 0x7fff) << 13;
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t bits = f32_bits(f32_from_bits(mag) * 0x1p112f);
    uint32_t special = (h & 0x7c00) == 0x7c00 ? 0xffffffffu : 0; /* inf, NaN (payload kept) */
    bits = (bits & ~special) | ((0x7f800000u | mag) & special);
    return f32_from_bits(bits | sign);
}

uint16_t quant_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN: quiet it and keep the top of the payload, as F16C does */
        return (uint16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
    if (x >= 0x47800000u) return (uint16_t)(sign | 0x7c00); /* >= 65536 (or inf) */

    uint32_t exp = x >> 23;
    if (exp >= 113) { /* normal half: rebias the exponent, round the 13 dropped bits */
        uint32_t h = ((exp - 112) << 10) | ((x >> 13) & 0x3ff);
        uint32_t rest = x & 0x1fff;
        if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry may reach inf */
        return (uint16_t)(sign | h);
    }
    /* subnormal half or zero: the value is m * 2^(exp-150), the half is q * 2^-24 */
    uint32_t shift = 126 - exp;
    if (shift > 24) return sign; /* below 2^-25: rounds to zero */
    uint32_t m = (x & 0x7fffff) | 0x800000;
    uint32_t h = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1))) h++; /* may become the smallest normal */
    return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t quant_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1); /* round to nearest even; overflow carries into inf */
    return (uint16_t)(x >> 16);
}

static float load_f16(const uint8_t p[2])
{
    return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* Stores the half nearest to v but never of smaller magnitude, and returns it.  Used for
 * block scales: x/d must not exceed the largest quant level because d was rounded down
 * (which matters most where d lands among the f16 subnormals). */
static float store_f16_scale(uint8_t p[2], float v)
{
    uint16_t h = quant_f32_to_f16(v);
    if (fabsf(quant_f16_to_f32(h)) < fabsf(v) && (h & 0x7fff) < 0x7bff) h++;
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
    return quant_f16_to_f32(h);
}

/* ---------------------------------------------------------------- block decoders */

typedef void (*block_decoder)(const uint8_t *restrict blk, float *restrict y);

static void decode_q4_0(const uint8_t *restrict blk, float *restrict y)
{
    const block_q4_0 *b = (const block_q4_0 *)blk;
    const float d = load_f16(b->d);
    for (int j = 0; j < QK4_0 / 2; j++) {
        y[j] = (float)((b->qs[j] & 0x0f) - 8) * d;
        y[j + QK4_0 / 2] = (float)((b->qs[j] >> 4) - 8) * d;
    }
}

static void decode_q8_0(const uint8_t *restrict blk, float *restrict y)
{
    const block_q8_0 *b = (const block_q8_0 *)blk;
    const float d = load_f16(b->d);
    for (int j = 0; j < QK8_0; j++) y[j] = (float)b->qs[j] * d;
}

/* Sub-block j's 6-bit scale and min.  Sub-blocks 0..3 own the low 6 bits of bytes j (scale)
 * and j+4 (min); sub-blocks 4..7 keep their low 4 bits in the nibbles of byte j+4 and their
 * top 2 bits in the spare top bits of bytes j-4 (scale) and j (min). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K and Q5_K share everything but the 5th bit: 64 weights per chunk c, the low nibbles of
 * qs[32c..32c+31] are sub-block 2c, the high nibbles sub-block 2c+1; Q5_K's extra bit of
 * weight l in those sub-blocks is bit 2c resp. 2c+1 of qh[l].  Inlined with qh constant, so
 * Q4_K's copy carries no test for it. */
static inline __attribute__((always_inline)) void
decode_k_nibbles(float d, float dmin, const uint8_t *scales, const uint8_t *qs,
                 const uint8_t *qh, float *restrict y)
{
    for (int c = 0; c < QK_K / 64; c++) {
        uint8_t sc, m;
        scale_min_k4(2 * c, scales, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        scale_min_k4(2 * c + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = dmin * m;
        const uint8_t *q = qs + 32 * c;
        float *out = y + 64 * c;
        for (int l = 0; l < 32; l++) {
            int lo = q[l] & 0x0f, hi = q[l] >> 4;
            if (qh) {
                lo += ((qh[l] >> (2 * c)) & 1) << 4;
                hi += ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            out[l] = d1 * (float)lo - m1;
            out[l + 32] = d2 * (float)hi - m2;
        }
    }
}

static void decode_q4_K(const uint8_t *restrict blk, float *restrict y)
{
    const block_q4_K *b = (const block_q4_K *)blk;
    decode_k_nibbles(load_f16(b->d), load_f16(b->dmin), b->scales, b->qs, NULL, y);
}

static void decode_q5_K(const uint8_t *restrict blk, float *restrict y)
{
    const block_q5_K *b = (const block_q5_K *)blk;
    decode_k_nibbles(load_f16(b->d), load_f16(b->dmin), b->scales, b->qs, b->qh, y);
}

/* Two halves of 128 weights.  In a half, lane l (0..31) of ql[l], ql[l+32] and qh[l] holds
 * weights l, l+32, l+64, l+96: low nibbles of ql[l] / ql[l+32] for the first two, high
 * nibbles for the last two, and the four 2-bit pairs of qh[l] in that order.  Each 16 weights
 * have their own scale: weight 16k+i of the half uses scales[8*half + k]. */
static void decode_q6_K(const uint8_t *restrict blk, float *restrict y)
{
    const block_q6_K *b = (const block_q6_K *)blk;
    const float d = load_f16(b->d);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        const int8_t *sc = b->scales + 8 * h;
        float *out = y + 128 * h;
        for (int s = 0; s < 2; s++) { /* lanes 0..15 use scale s, 16..31 scale s+1 ... */
            const float d1 = d * sc[s], d2 = d * sc[s + 2], d3 = d * sc[s + 4],
                        d4 = d * sc[s + 6];
            for (int l = 16 * s; l < 16 * s + 16; l++) {
                int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[l] = d1 * (float)q1;
                out[l + 32] = d2 * (float)q2;
                out[l + 64] = d3 * (float)q3;
                out[l + 96] = d4 * (float)q4;
            }
        }
    }
}

/* Q4_1 / Q5_1 / Q5_0: the nibble layout of Q4_0; Q5's 5th bit of weight j is bit j of qh. */
static uint32_t load_u32(const uint8_t p[4])
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void decode_q4_1(const uint8_t *restrict blk, float *restrict y)
{
    const block_q4_1 *b = (const block_q4_1 *)blk;
    const float d = load_f16(b->d), m = load_f16(b->m);
    for (int j = 0; j < QK4_0 / 2; j++) {
        y[j] = d * (float)(b->qs[j] & 0x0f) + m;
        y[j + QK4_0 / 2] = d * (float)(b->qs[j] >> 4) + m;
    }
}

/* The 32 five-bit q of a Q5_0/Q5_1 block. */
static void q5_levels(const uint8_t qh4[4], const uint8_t *qs, int q[QK4_0])
{
    const uint32_t qh = load_u32(qh4);
    for (int j = 0; j < QK4_0 / 2; j++) {
        q[j] = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        q[j + QK4_0 / 2] = (qs[j] >> 4) | (int)(((qh >> (j + QK4_0 / 2)) & 1) << 4);
    }
}

static void decode_q5_0(const uint8_t *restrict blk, float *restrict y)
{
    const block_q5_0 *b = (const block_q5_0 *)blk;
    const float d = load_f16(b->d);
    int q[QK4_0];
    q5_levels(b->qh, b->qs, q);
    for (int j = 0; j < QK4_0; j++) y[j] = d * (float)(q[j] - 16);
}

static void decode_q5_1(const uint8_t *restrict blk, float *restrict y)
{
    const block_q5_1 *b = (const block_q5_1 *)blk;
    const float d = load_f16(b->d), m = load_f16(b->m);
    int q[QK4_0];
    q5_levels(b->qh, b->qs, q);
    for (int j = 0; j < QK4_0; j++) y[j] = d * (float)q[j] + m;
}

/* 32 weights whose nibbles (laid out as Q4_0's) index a 16-level grid: w = d*grid[q].  IQ4_NL,
 * IQ4_XS's sub-blocks and MXFP4 differ only in the grid and where d comes from. */
static inline __attribute__((always_inline)) void
decode_grid_32(const int8_t grid[16], float d, const uint8_t *qs, float *restrict y)
{
    for (int j = 0; j < QK4_0 / 2; j++) {
        y[j] = d * (float)grid[qs[j] & 0x0f];
        y[j + QK4_0 / 2] = d * (float)grid[qs[j] >> 4];
    }
}

static void decode_iq4_nl(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq4_nl *b = (const block_iq4_nl *)blk;
    decode_grid_32(iq4nl_values, load_f16(b->d), b->qs, y);
}

/* Q2_K and Q3_K share the 2-bit layout: weight 128c + 32s + l is bits 2s..2s+1 of
 * qs[32c + l]; each 16 consecutive weights have their own scale. */
static int k_low2(const uint8_t *qs, int i)
{
    int c = i / 128, s = (i % 128) / 32, l = i % 32;
    return (qs[32 * c + l] >> (2 * s)) & 3;
}

static void decode_q2_K(const uint8_t *restrict blk, float *restrict y)
{
    const block_q2_K *b = (const block_q2_K *)blk;
    const float d = load_f16(b->d), dmin = load_f16(b->dmin);
    for (int k = 0; k < QK_K / 16; k++) {
        const float dl = d * (float)(b->scales[k] & 0x0f), ml = dmin * (float)(b->scales[k] >> 4);
        for (int i = 16 * k; i < 16 * k + 16; i++) y[i] = dl * (float)k_low2(b->qs, i) - ml;
    }
}

/* Scale k (0..15) of Q3_K: low 4 bits from nibble k/8 of byte k%8, top 2 bits from bits
 * 2(k/4)..2(k/4)+1 of byte 8 + k%4; stored with a bias of 32. */
static int scale_q3_K(const uint8_t *sc, int k)
{
    int lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0f;
    int hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

static void decode_q3_K(const uint8_t *restrict blk, float *restrict y)
{
    const block_q3_K *b = (const block_q3_K *)blk;
    const float d = load_f16(b->d);
    for (int k = 0; k < QK_K / 16; k++) {
        const float dl = d * (float)scale_q3_K(b->scales, k);
        for (int i = 16 * k; i < 16 * k + 16; i++) {
            int high = (b->hmask[i % 32] >> (i / 32)) & 1;
            y[i] = dl * (float)(k_low2(b->qs, i) - (high ? 0 : 4));
        }
    }
}

static void decode_iq4_xs(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq4_xs *b = (const block_iq4_xs *)blk;
    const float d = load_f16(b->d);
    const int scales_h = b->scales_h[0] | (b->scales_h[1] << 8);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((scales_h >> (2 * ib)) & 3) << 4);
        decode_grid_32(iq4nl_values, d * (float)(ls - 32), b->qs + 16 * ib, y + 32 * ib);
    }
}

/* 2^(e-127) / 2, as float bits: e >= 2 is the normal float with exponent e-1; e = 0 and 1 fall
 * among the float subnormals (2^-128 and 2^-127, ggml's e8m0_to_fp32_half). */
static float mxfp4_half_scale(uint8_t e)
{
    return f32_from_bits(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

static void decode_mxfp4(const uint8_t *restrict blk, float *restrict y)
{
    const block_mxfp4 *b = (const block_mxfp4 *)blk;
    decode_grid_32(mxfp4_values, mxfp4_half_scale(b->e), b->qs, y);
}

/* ---- the IQ types: groups of 8 (IQ3: 4) weights, each a row of a lookup grid.  Grid rows
 * pack one element per byte (quant_grids.h); the arithmetic is gguf-py's, in its order. */

static uint16_t load_u16(const uint8_t p[2])
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* 8 weights: db * magnitude j of the grid row * (bit j of signs ? -1 : 1). */
static inline __attribute__((always_inline)) void
decode_signed_8(float db, uint64_t grid, uint8_t signs, float *restrict y)
{
    for (int j = 0; j < 8; j++)
        y[j] = db * (float)(uint8_t)(grid >> (8 * j)) * ((signs >> j) & 1 ? -1.0f : 1.0f);
}

/* IQ3's 4-magnitude rows, two of them under one byte of signs. */
static inline __attribute__((always_inline)) void
decode_signed_4x2(float db, uint32_t g1, uint32_t g2, uint8_t signs, float *restrict y)
{
    decode_signed_8(db, (uint64_t)g1 | ((uint64_t)g2 << 32), signs, y);
}

static void decode_iq2_xxs(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq2_xxs *b = (const block_iq2_xxs *)blk;
    const float d = load_f16(b->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const uint8_t *q = b->qs + 8 * ib;
        const uint32_t aux = load_u32(q + 4);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++)
            decode_signed_8(db, iq2xxs_grid[q[l]], ksigns_iq2xs[(aux >> (7 * l)) & 127],
                            y + 32 * ib + 8 * l);
    }
}

static void decode_iq2_xs(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq2_xs *b = (const block_iq2_xs *)blk;
    const float d = load_f16(b->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const float db[2] = {d * (0.5f + (float)(b->scales[ib] & 0x0f)) * 0.25f,
                             d * (0.5f + (float)(b->scales[ib] >> 4)) * 0.25f};
        for (int l = 0; l < 4; l++) {
            const uint16_t q = load_u16(b->qs + 2 * (4 * ib + l));
            decode_signed_8(db[l / 2], iq2xs_grid[q & 511], ksigns_iq2xs[q >> 9], y + 32 * ib + 8 * l);
        }
    }
}

static void decode_iq2_s(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq2_s *b = (const block_iq2_s *)blk;
    const float d = load_f16(b->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const float db[2] = {d * (0.5f + (float)(b->scales[ib] & 0x0f)) * 0.25f,
                             d * (0.5f + (float)(b->scales[ib] >> 4)) * 0.25f};
        for (int l = 0; l < 4; l++) {
            const int idx = b->qs[4 * ib + l] | (((b->qh[ib] >> (2 * l)) & 3) << 8);
            decode_signed_8(db[l / 2], iq2s_grid[idx], b->signs[4 * ib + l], y + 32 * ib + 8 * l);
        }
    }
}

static void decode_iq3_xxs(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq3_xxs *b = (const block_iq3_xxs *)blk;
    const float d = load_f16(b->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const uint32_t aux = load_u32(b->sas + 4 * ib);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        const uint8_t *q = b->qs + 8 * ib;
        for (int l = 0; l < 4; l++)
            decode_signed_4x2(db, iq3xxs_grid[q[2 * l]], iq3xxs_grid[q[2 * l + 1]],
                              ksigns_iq2xs[(aux >> (7 * l)) & 127], y + 32 * ib + 8 * l);
    }
}

static void decode_iq3_s(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq3_s *b = (const block_iq3_s *)blk;
    const float d = load_f16(b->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const float db = d * (float)(1 + 2 * ((b->scales[ib / 2] >> (4 * (ib % 2))) & 0x0f));
        const uint8_t *q = b->qs + 8 * ib;
        for (int l = 0; l < 4; l++) {
            const int i1 = q[2 * l] | (((b->qh[ib] >> (2 * l)) & 1) << 8);
            const int i2 = q[2 * l + 1] | (((b->qh[ib] >> (2 * l + 1)) & 1) << 8);
            decode_signed_4x2(db, iq3s_grid[i1], iq3s_grid[i2], b->signs[4 * ib + l], y + 32 * ib + 8 * l);
        }
    }
}

/* 8 weights of IQ1: dl * (grid value in {-1, 0, 1} + delta). */
static inline __attribute__((always_inline)) void
decode_iq1_8(float dl, float delta, uint64_t grid, float *restrict y)
{
    for (int j = 0; j < 8; j++) y[j] = dl * ((float)(int8_t)(uint8_t)(grid >> (8 * j)) + delta);
}

#define IQ1_DELTA 0.125f

static void decode_iq1_s(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq1_s *b = (const block_iq1_s *)blk;
    const float d = load_f16(b->d);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const uint16_t qh = load_u16(b->qh + 2 * ib);
        const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
        const float delta = qh & 0x8000 ? -IQ1_DELTA : IQ1_DELTA;
        for (int l = 0; l < 4; l++) {
            const int idx = b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
            decode_iq1_8(dl, delta, iq1s_grid[idx], y + 32 * ib + 8 * l);
        }
    }
}

/* IQ1_M's f16 d is spread over the top nibbles of its four scale words. */
static float iq1m_d(const uint16_t sc[4])
{
    const uint16_t h = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                  (sc[3] & 0xf000));
    return quant_f16_to_f32(h);
}

static void decode_iq1_m(const uint8_t *restrict blk, float *restrict y)
{
    const block_iq1_m *b = (const block_iq1_m *)blk;
    uint16_t sc[4];
    for (int k = 0; k < 4; k++) sc[k] = load_u16(b->scales + 2 * k);
    const float d = iq1m_d(sc);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const int shift = 6 * (ib % 2);
        const float dl[2] = {d * (float)(2 * ((sc[ib / 2] >> shift) & 7) + 1),
                             d * (float)(2 * ((sc[ib / 2] >> (shift + 3)) & 7) + 1)};
        for (int l = 0; l < 4; l++) {
            const int nib = (b->qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0x0f;
            const int idx = b->qs[4 * ib + l] | ((nib & 7) << 8);
            decode_iq1_8(dl[l / 2], nib & 8 ? -IQ1_DELTA : IQ1_DELTA, iq1s_grid[idx], y + 32 * ib + 8 * l);
        }
    }
}

/* Float "blocks": the dot product handles float rows in chunks of FLOAT_CHUNK. */
#define FLOAT_CHUNK 256

/* n halves from src (little-endian, any alignment): groups of 16 with a constant trip count
 * so the conversion vectorises, then the tail. */
static void decode_halves(bool bf16, const uint8_t *restrict src, float *restrict y, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        uint16_t h[16];
        memcpy(h, src + 2 * i, sizeof h); /* GGUF is little-endian, as are our hosts */
        if (bf16)
            for (int k = 0; k < 16; k++) y[i + k] = quant_bf16_to_f32(h[k]);
        else
            for (int k = 0; k < 16; k++) y[i + k] = quant_f16_to_f32(h[k]);
    }
    for (; i < n; i++) {
        uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
        y[i] = bf16 ? quant_bf16_to_f32(h) : quant_f16_to_f32(h);
    }
}

/* ---------------------------------------------------------------- dot products */

#define LANES 8

/* Pairwise, so the order is fixed and independent of the compiler. */
static float lanes_sum(float acc[LANES])
{
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int k = 0; k < w; k++) acc[k] += acc[k + w];
    return acc[0];
}

/* sum w[i]*x[i]; n is a multiple of LANES. */
static inline __attribute__((always_inline)) float
dot_lanes(const float *restrict w, const float *restrict x, int n)
{
    float acc[LANES] = {0};
    for (int i = 0; i < n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += w[i + k] * x[i + k];
    return lanes_sum(acc);
}

/* Any n: LANES-wide part, then the tail in order. */
static float dot_any(const float *restrict w, const float *restrict x, int n)
{
    int head = n - n % LANES;
    float sum = dot_lanes(w, x, head);
    for (int i = head; i < n; i++) sum += w[i] * x[i];
    return sum;
}

/* Inlined per type with a constant decoder, so the decoder is inlined into the block loop. */
static inline __attribute__((always_inline)) float
dot_blocks(block_decoder decode, int block_elems, size_t block_bytes, const uint8_t *row,
           const float *x, int64_t nblocks)
{
    float w[QK_K];
    float sum = 0.0f;
    for (int64_t b = 0; b < nblocks; b++) {
        decode(row + (size_t)b * block_bytes, w);
        sum += dot_lanes(w, x + b * block_elems, block_elems);
    }
    return sum;
}

static float dot_float_row(ggml_type type, const uint8_t *row, const float *x, int64_t n)
{
    float w[FLOAT_CHUNK];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += FLOAT_CHUNK) {
        int len = n - i < FLOAT_CHUNK ? (int)(n - i) : FLOAT_CHUNK;
        if (type == GGML_TYPE_F32) {
            memcpy(w, row + 4 * i, (size_t)len * 4); /* rows may be unaligned */
        } else {
            decode_halves(type == GGML_TYPE_BF16, row + 2 * i, w, len);
        }
        sum += dot_any(w, x + i, len);
    }
    return sum;
}

static bool row_ok(ggml_type type, int64_t n)
{
    return ggml_type_supported(type) && n >= 0 && ggml_row_bytes(type, n) > 0;
}

float quant_dot_row(ggml_type type, const void *row, const float *x, int64_t n)
{
    const uint8_t *r = row;
    if (n == 0) return 0.0f;
    if (!row_ok(type, n)) return NAN; /* poison rather than a plausible number */
    switch (type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16: return dot_float_row(type, r, x, n);
    case GGML_TYPE_Q4_0:
        return dot_blocks(decode_q4_0, QK4_0, sizeof(block_q4_0), r, x, n / QK4_0);
    case GGML_TYPE_Q8_0:
        return dot_blocks(decode_q8_0, QK8_0, sizeof(block_q8_0), r, x, n / QK8_0);
    case GGML_TYPE_Q4_K:
        return dot_blocks(decode_q4_K, QK_K, sizeof(block_q4_K), r, x, n / QK_K);
    case GGML_TYPE_Q5_K:
        return dot_blocks(decode_q5_K, QK_K, sizeof(block_q5_K), r, x, n / QK_K);
    case GGML_TYPE_Q6_K:
        return dot_blocks(decode_q6_K, QK_K, sizeof(block_q6_K), r, x, n / QK_K);
    case GGML_TYPE_Q4_1:
        return dot_blocks(decode_q4_1, QK4_0, sizeof(block_q4_1), r, x, n / QK4_0);
    case GGML_TYPE_Q5_0:
        return dot_blocks(decode_q5_0, QK4_0, sizeof(block_q5_0), r, x, n / QK4_0);
    case GGML_TYPE_Q5_1:
        return dot_blocks(decode_q5_1, QK4_0, sizeof(block_q5_1), r, x, n / QK4_0);
    case GGML_TYPE_IQ4_NL:
        return dot_blocks(decode_iq4_nl, QK4_0, sizeof(block_iq4_nl), r, x, n / QK4_0);
    case GGML_TYPE_Q2_K:
        return dot_blocks(decode_q2_K, QK_K, sizeof(block_q2_K), r, x, n / QK_K);
    case GGML_TYPE_Q3_K:
        return dot_blocks(decode_q3_K, QK_K, sizeof(block_q3_K), r, x, n / QK_K);
    case GGML_TYPE_IQ4_XS:
        return dot_blocks(decode_iq4_xs, QK_K, sizeof(block_iq4_xs), r, x, n / QK_K);
    case GGML_TYPE_MXFP4:
        return dot_blocks(decode_mxfp4, QK4_0, sizeof(block_mxfp4), r, x, n / QK4_0);
    case GGML_TYPE_IQ2_XXS:
        return dot_blocks(decode_iq2_xxs, QK_K, sizeof(block_iq2_xxs), r, x, n / QK_K);
    case GGML_TYPE_IQ2_XS:
        return dot_blocks(decode_iq2_xs, QK_K, sizeof(block_iq2_xs), r, x, n / QK_K);
    case GGML_TYPE_IQ2_S:
        return dot_blocks(decode_iq2_s, QK_K, sizeof(block_iq2_s), r, x, n / QK_K);
    case GGML_TYPE_IQ3_XXS:
        return dot_blocks(decode_iq3_xxs, QK_K, sizeof(block_iq3_xxs), r, x, n / QK_K);
    case GGML_TYPE_IQ3_S:
        return dot_blocks(decode_iq3_s, QK_K, sizeof(block_iq3_s), r, x, n / QK_K);
    case GGML_TYPE_IQ1_S:
        return dot_blocks(decode_iq1_s, QK_K, sizeof(block_iq1_s), r, x, n / QK_K);
    case GGML_TYPE_IQ1_M:
        return dot_blocks(decode_iq1_m, QK_K, sizeof(block_iq1_m), r, x, n / QK_K);
    default: return NAN;
    }
}

/* ---------------------------------------------------------------- dequantisation */

static block_decoder decoder_of(ggml_type type)
{
    switch (type) {
    case GGML_TYPE_Q4_0: return decode_q4_0;
    case GGML_TYPE_Q8_0: return decode_q8_0;
    case GGML_TYPE_Q4_K: return decode_q4_K;
    case GGML_TYPE_Q5_K: return decode_q5_K;
    case GGML_TYPE_Q6_K: return decode_q6_K;
    case GGML_TYPE_Q4_1: return decode_q4_1;
    case GGML_TYPE_Q5_0: return decode_q5_0;
    case GGML_TYPE_Q5_1: return decode_q5_1;
    case GGML_TYPE_IQ4_NL: return decode_iq4_nl;
    case GGML_TYPE_Q2_K: return decode_q2_K;
    case GGML_TYPE_Q3_K: return decode_q3_K;
    case GGML_TYPE_IQ4_XS: return decode_iq4_xs;
    case GGML_TYPE_MXFP4: return decode_mxfp4;
    case GGML_TYPE_IQ2_XXS: return decode_iq2_xxs;
    case GGML_TYPE_IQ2_XS: return decode_iq2_xs;
    case GGML_TYPE_IQ2_S: return decode_iq2_s;
    case GGML_TYPE_IQ3_XXS: return decode_iq3_xxs;
    case GGML_TYPE_IQ3_S: return decode_iq3_s;
    case GGML_TYPE_IQ1_S: return decode_iq1_s;
    case GGML_TYPE_IQ1_M: return decode_iq1_m;
    default: return NULL;
    }
}

void quant_dequantize_row(ggml_type type, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    if (n <= 0) return;
    if (!row_ok(type, n)) { /* poison rather than leave stale values */
        for (int64_t i = 0; i < n; i++) dst[i] = NAN;
        return;
    }
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, s, (size_t)n * sizeof(float)); return;
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i += FLOAT_CHUNK) {
            int len = n - i < FLOAT_CHUNK ? (int)(n - i) : FLOAT_CHUNK;
            decode_halves(type == GGML_TYPE_BF16, s + 2 * i, dst + i, len);
        }
        return;
    default: break;
    }
    block_decoder decode = decoder_of(type);
    size_t elems = ggml_type_block_elems(type), bytes = ggml_type_block_bytes(type);
    for (int64_t b = 0; b < n / (int64_t)elems; b++)
        decode(s + (size_t)b * bytes, dst + (size_t)b * elems);
}

/* ---------------------------------------------------------------- quantisation */

/* round(v) clamped to [lo, hi]; NaN maps to lo, so hostile floats cannot cause an
 * out-of-range conversion. */
static int round_clamp(float v, int lo, int hi)
{
    float r = floorf(v + 0.5f);
    if (!(r >= (float)lo)) return lo;
    if (r > (float)hi) return hi;
    return (int)r;
}

/* The value of largest magnitude (with its sign). */
static float signed_amax(const float *x, int n)
{
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            vmax = x[j];
        }
    }
    return vmax;
}

static void encode_q4_0(const float *x, uint8_t *blk)
{
    block_q4_0 *b = (block_q4_0 *)blk;
    /* The value of largest magnitude maps to q = 0 (-8), which uses the full asymmetric
     * range [-8, 7] on the side where it matters most. */
    const float d = store_f16_scale(b->d, signed_amax(x, QK4_0) / -8.0f);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK4_0 / 2; j++) {
        int lo = round_clamp(x[j] * id + 8.0f, 0, 15);
        int hi = round_clamp(x[j + QK4_0 / 2] * id + 8.0f, 0, 15);
        b->qs[j] = (uint8_t)(lo | (hi << 4));
    }
}

static void encode_q8_0(const float *x, uint8_t *blk)
{
    block_q8_0 *b = (block_q8_0 *)blk;
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = store_f16_scale(b->d, amax / 127.0f);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK8_0; j++) b->qs[j] = (int8_t)round_clamp(x[j] * id, -127, 127);
}

/* Fit x[i] ~ scale*q[i] - offset with q in [0, nmax] and offset >= 0 (the K-quants store a
 * subtracted, unsigned min, so the represented minimum is <= 0).  Tries a fan of scales
 * around (max-min)/nmax; for each, rounds to q and solves the least-squares scale and offset
 * for those q; keeps the fit with the smallest squared error (the idea of ggml's
 * make_qkx2_quants, unweighted). */
static float fit_affine(const float *x, int n, int nmax, float *offset)
{
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    *offset = -lo;
    if (!(hi > lo)) return 0.0f; /* constant row: offset alone represents it */

    float best_scale = (hi - lo) / nmax, best_err = INFINITY;
    for (int step = -10; step <= 10; step++) {
        float iscale = ((float)nmax + 0.1f * step) / (hi - lo);
        float sl = 0, sl2 = 0, sx = 0, slx = 0;
        for (int i = 0; i < n; i++) {
            float q = (float)round_clamp(iscale * (x[i] - lo), 0, nmax);
            sl += q;
            sl2 += q * q;
            sx += x[i];
            slx += q * x[i];
        }
        float det = n * sl2 - sl * sl;
        if (det <= 0.0f) continue;
        float scale = (n * slx - sl * sx) / det;
        float min = (sl2 * sx - sl * slx) / det;
        if (min > 0.0f) { /* offset must stay >= 0: refit the scale alone */
            min = 0.0f;
            scale = sl2 > 0.0f ? slx / sl2 : 0.0f;
        }
        if (!(scale > 0.0f)) continue;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float q = (float)round_clamp((x[i] - min) / scale, 0, nmax);
            float diff = scale * q + min - x[i];
            err += diff * diff;
        }
        if (err < best_err) {
            best_err = err;
            best_scale = scale;
            *offset = -min;
        }
    }
    return best_scale;
}

/* The 8 scales and 8 offsets of a Q4_K/Q5_K super-block as 6-bit integers relative to the
 * super-block's d and dmin; the inverse of scale_min_k4.  Returns the q of every weight. */
static void encode_k_affine(const float *x, int nmax, uint8_t dd[2], uint8_t ddmin[2],
                            uint8_t scales[K_SCALE_SIZE], uint8_t q[QK_K])
{
    float scale[8], offset[8], max_scale = 0.0f, max_offset = 0.0f;
    for (int j = 0; j < 8; j++) {
        scale[j] = fit_affine(x + 32 * j, 32, nmax, &offset[j]);
        max_scale = fmaxf(max_scale, scale[j]);
        max_offset = fmaxf(max_offset, offset[j]);
    }
    const float d = store_f16_scale(dd, max_scale / 63.0f);
    const float dmin = store_f16_scale(ddmin, max_offset / 63.0f);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0.0f ? round_clamp(scale[j] / d, 0, 63) : 0);
        m[j] = (uint8_t)(dmin > 0.0f ? round_clamp(offset[j] / dmin, 0, 63) : 0);
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
    /* requantise against the stored (rounded) scales, which is what will be decoded */
    for (int j = 0; j < 8; j++) {
        const float ds = d * sc[j], dm = dmin * m[j];
        for (int i = 0; i < 32; i++) {
            int k = 32 * j + i;
            q[k] = (uint8_t)(ds > 0.0f ? round_clamp((x[k] + dm) / ds, 0, nmax) : 0);
        }
    }
}

static void encode_q4_K(const float *x, uint8_t *blk)
{
    block_q4_K *b = (block_q4_K *)blk;
    uint8_t q[QK_K];
    encode_k_affine(x, 15, b->d, b->dmin, b->scales, q);
    for (int c = 0; c < QK_K / 64; c++)
        for (int l = 0; l < 32; l++)
            b->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}

static void encode_q5_K(const float *x, uint8_t *blk)
{
    block_q5_K *b = (block_q5_K *)blk;
    uint8_t q[QK_K];
    encode_k_affine(x, 31, b->d, b->dmin, b->scales, q);
    memset(b->qh, 0, sizeof b->qh);
    for (int c = 0; c < QK_K / 64; c++) {
        for (int l = 0; l < 32; l++) {
            int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
            b->qs[32 * c + l] = (uint8_t)((lo & 0x0f) | ((hi & 0x0f) << 4));
            b->qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
    }
}

/* Fit x[i] ~ scale*q[i] with q in [-nmax, nmax-1]; the scale may be negative so that the
 * value of largest magnitude can use the extra negative level (ggml's make_qx_quants idea,
 * unweighted). */
static float fit_symmetric(const float *x, int n, int nmax)
{
    const float vmax = signed_amax(x, n);
    if (vmax == 0.0f) return 0.0f;
    float best_scale = vmax / -(float)nmax, best_err = INFINITY;
    for (int step = -9; step <= 9; step++) {
        float iscale = -((float)nmax + 0.1f * step) / vmax;
        float slx = 0.0f, sl2 = 0.0f;
        for (int i = 0; i < n; i++) {
            float q = (float)round_clamp(iscale * x[i], -nmax, nmax - 1);
            slx += q * x[i];
            sl2 += q * q;
        }
        if (sl2 <= 0.0f) continue;
        float scale = slx / sl2, err = 0.0f;
        for (int i = 0; i < n; i++) {
            float diff = scale * (float)round_clamp(x[i] / scale, -nmax, nmax - 1) - x[i];
            err += diff * diff;
        }
        if (err < best_err) {
            best_err = err;
            best_scale = scale;
        }
    }
    return best_scale;
}

static void encode_q6_K(const float *x, uint8_t *blk)
{
    block_q6_K *b = (block_q6_K *)blk;
    float scale[QK_K / 16], max_scale = 0.0f;
    for (int j = 0; j < QK_K / 16; j++) {
        scale[j] = fit_symmetric(x + 16 * j, 16, 32);
        if (fabsf(scale[j]) > fabsf(max_scale)) max_scale = scale[j];
    }
    /* the largest scale maps to -128, the int8 level without a positive twin */
    const float d = store_f16_scale(b->d, max_scale / -128.0f);
    uint8_t q[QK_K];
    for (int j = 0; j < QK_K / 16; j++) {
        int sc = d != 0.0f ? round_clamp(scale[j] / d, -128, 127) : 0;
        b->scales[j] = (int8_t)sc;
        const float ds = d * (float)sc;
        for (int i = 0; i < 16; i++) {
            int k = 16 * j + i;
            q[k] = (uint8_t)((ds != 0.0f ? round_clamp(x[k] / ds, -32, 31) : 0) + 32);
        }
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *qq = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            int q1 = qq[l], q2 = qq[l + 32], q3 = qq[l + 64], q4 = qq[l + 96];
            b->ql[64 * h + l] = (uint8_t)((q1 & 0x0f) | ((q3 & 0x0f) << 4));
            b->ql[64 * h + l + 32] = (uint8_t)((q2 & 0x0f) | ((q4 & 0x0f) << 4));
            b->qh[32 * h + l] =
                (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
    }
}

/* Q4_1 / Q5_1: d = (max - min) / nmax with the minimum stored as the offset. */
static void encode_affine_32(const float *x, int nmax, uint8_t dd[2], uint8_t dm[2], int q[QK4_0])
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < QK4_0; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    const float d = store_f16_scale(dd, (hi - lo) / (float)nmax);
    uint16_t mh = quant_f32_to_f16(lo);
    dm[0] = (uint8_t)(mh & 0xff);
    dm[1] = (uint8_t)(mh >> 8);
    const float m = quant_f16_to_f32(mh);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK4_0; j++) q[j] = round_clamp((x[j] - m) * id, 0, nmax);
}

static void pack_nibbles_32(const int q[QK4_0], uint8_t qs[QK4_0 / 2])
{
    for (int j = 0; j < QK4_0 / 2; j++) qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + QK4_0 / 2] & 0x0f) << 4));
}

static void pack_q5_high(const int q[QK4_0], uint8_t qh[4])
{
    uint32_t h = 0;
    for (int j = 0; j < QK4_0; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void encode_q4_1(const float *x, uint8_t *blk)
{
    block_q4_1 *b = (block_q4_1 *)blk;
    int q[QK4_0];
    encode_affine_32(x, 15, b->d, b->m, q);
    pack_nibbles_32(q, b->qs);
}

static void encode_q5_1(const float *x, uint8_t *blk)
{
    block_q5_1 *b = (block_q5_1 *)blk;
    int q[QK4_0];
    encode_affine_32(x, 31, b->d, b->m, q);
    pack_nibbles_32(q, b->qs);
    pack_q5_high(q, b->qh);
}

static void encode_q5_0(const float *x, uint8_t *blk)
{
    block_q5_0 *b = (block_q5_0 *)blk;
    /* as Q4_0: the largest magnitude takes the lone extra negative level, q = 0 (-16) */
    const float d = store_f16_scale(b->d, signed_amax(x, QK4_0) / -16.0f);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[QK4_0];
    for (int j = 0; j < QK4_0; j++) q[j] = round_clamp(x[j] * id + 16.0f, 0, 31);
    pack_nibbles_32(q, b->qs);
    pack_q5_high(q, b->qh);
}

/* Index of the IQ4 grid level nearest to v. */
static int nearest_iq4(float v)
{
    int best = 0;
    for (int k = 1; k < 16; k++)
        if (fabsf(v - (float)iq4nl_values[k]) < fabsf(v - (float)iq4nl_values[best])) best = k;
    return best;
}

/* 32 weights onto the grid scaled by d (0 maps everything to the level nearest zero). */
static void encode_iq4_32(const float *x, float d, uint8_t qs[16])
{
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[QK4_0];
    for (int j = 0; j < QK4_0; j++) q[j] = nearest_iq4(x[j] * id);
    pack_nibbles_32(q, qs);
}

static void encode_iq4_nl(const float *x, uint8_t *blk)
{
    block_iq4_nl *b = (block_iq4_nl *)blk;
    /* the largest magnitude lands on -127, the grid's end */
    const float d = store_f16_scale(b->d, signed_amax(x, QK4_0) / -127.0f);
    encode_iq4_32(x, d, b->qs);
}

static void encode_iq4_xs(const float *x, uint8_t *blk)
{
    block_iq4_xs *b = (block_iq4_xs *)blk;
    float scale[QK_K / 32];
    for (int ib = 0; ib < QK_K / 32; ib++) scale[ib] = signed_amax(x + 32 * ib, 32) / -127.0f;
    /* 6-bit sub-block scales in [-32, 31]: the largest maps to -32 */
    const float d = store_f16_scale(b->d, signed_amax(scale, QK_K / 32) / -32.0f);
    int scales_h = 0;
    memset(b->scales_l, 0, sizeof b->scales_l);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        int l = d != 0.0f ? round_clamp(scale[ib] / d, -32, 31) : 0;
        int ls = l + 32;
        b->scales_l[ib / 2] |= (uint8_t)((ls & 0x0f) << (4 * (ib % 2)));
        scales_h |= (ls >> 4) << (2 * ib);
        encode_iq4_32(x + 32 * ib, d * (float)l, b->qs + 16 * ib);
    }
    b->scales_h[0] = (uint8_t)(scales_h & 0xff);
    b->scales_h[1] = (uint8_t)(scales_h >> 8);
}

/* The 2-bit layout of Q2_K and Q3_K (see k_low2). */
static void pack_k_low2(const int q[QK_K], uint8_t qs[QK_K / 4])
{
    memset(qs, 0, QK_K / 4);
    for (int i = 0; i < QK_K; i++) {
        int c = i / 128, s = (i % 128) / 32, l = i % 32;
        qs[32 * c + l] |= (uint8_t)((q[i] & 3) << (2 * s));
    }
}

static void encode_q2_K(const float *x, uint8_t *blk)
{
    block_q2_K *b = (block_q2_K *)blk;
    float scale[QK_K / 16], offset[QK_K / 16], max_scale = 0.0f, max_offset = 0.0f;
    for (int k = 0; k < QK_K / 16; k++) {
        scale[k] = fit_affine(x + 16 * k, 16, 3, &offset[k]);
        max_scale = fmaxf(max_scale, scale[k]);
        max_offset = fmaxf(max_offset, offset[k]);
    }
    const float d = store_f16_scale(b->d, max_scale / 15.0f);
    const float dmin = store_f16_scale(b->dmin, max_offset / 15.0f);
    int q[QK_K];
    for (int k = 0; k < QK_K / 16; k++) {
        int sc = d > 0.0f ? round_clamp(scale[k] / d, 0, 15) : 0;
        int m = dmin > 0.0f ? round_clamp(offset[k] / dmin, 0, 15) : 0;
        b->scales[k] = (uint8_t)(sc | (m << 4));
        const float ds = d * (float)sc, dm = dmin * (float)m;
        for (int i = 16 * k; i < 16 * k + 16; i++)
            q[i] = ds > 0.0f ? round_clamp((x[i] + dm) / ds, 0, 3) : 0;
    }
    pack_k_low2(q, b->qs);
}

static void encode_q3_K(const float *x, uint8_t *blk)
{
    block_q3_K *b = (block_q3_K *)blk;
    float scale[QK_K / 16];
    for (int k = 0; k < QK_K / 16; k++) scale[k] = fit_symmetric(x + 16 * k, 16, 4);
    /* signed 6-bit scales in [-32, 31]: the largest maps to -32 */
    const float d = store_f16_scale(b->d, signed_amax(scale, QK_K / 16) / -32.0f);
    int q[QK_K];
    memset(b->scales, 0, sizeof b->scales);
    memset(b->hmask, 0, sizeof b->hmask);
    for (int k = 0; k < QK_K / 16; k++) {
        int sc = d != 0.0f ? round_clamp(scale[k] / d, -32, 31) : 0;
        int biased = sc + 32; /* the inverse of scale_q3_K */
        b->scales[k % 8] |= (uint8_t)((biased & 0x0f) << (4 * (k / 8)));
        b->scales[8 + k % 4] |= (uint8_t)((biased >> 4) << (2 * (k / 4)));
        const float ds = d * (float)sc;
        for (int i = 16 * k; i < 16 * k + 16; i++) {
            q[i] = (ds != 0.0f ? round_clamp(x[i] / ds, -4, 3) : 0) + 4; /* 0..7 */
            b->hmask[i % 32] |= (uint8_t)((q[i] >> 2) << (i / 32));
        }
    }
    pack_k_low2(q, b->qs);
}

/* MXFP4: the exponent puts the largest magnitude in [4, 8) times the half scale, i.e. within
 * the grid's top levels (up to 12 = 6 doubled); each weight takes the nearest of the 16 values. */
static void encode_mxfp4(const float *x, uint8_t *blk)
{
    block_mxfp4 *b = (block_mxfp4 *)blk;
    float amax = fabsf(signed_amax(x, QK4_0));
    int e = 0;
    if (amax > 0.0f && isfinite(amax)) {
        int exp2;
        frexpf(amax, &exp2); /* amax = f * 2^exp2, f in [0.5, 1): floor(log2 amax) = exp2 - 1 */
        e = exp2 - 1 - 2 + 127;
        e = e < 0 ? 0 : e > 254 ? 254 : e;
    }
    b->e = (uint8_t)e;
    const float d = mxfp4_half_scale(b->e);
    int q[QK4_0];
    for (int j = 0; j < QK4_0; j++) {
        int best = 0;
        for (int k = 1; k < 16; k++)
            if (fabsf(d * (float)mxfp4_values[k] - x[j]) < fabsf(d * (float)mxfp4_values[best] - x[j])) best = k;
        q[j] = best;
    }
    pack_nibbles_32(q, b->qs);
}

/* ---- IQ encoders: a reference quantiser that writes the formats (not llama-quantize's
 * importance-weighted search).  Per sub-block the scale maps the largest magnitude onto the
 * grid's largest level; per group each weight's sign is kept (XXS/XS: with an even count of
 * negatives, the weight of least magnitude giving way) and the grid row nearest (least
 * squares) to the magnitudes is found by exhaustive search. */

typedef struct iq_grid {
    const uint64_t *g64; /* rows of 8 bytes, or */
    const uint32_t *g32; /* rows of 4 */
    int rows;
    bool is_signed;      /* int8 elements (IQ1), else unsigned magnitudes */
} iq_grid;

/* Finding the nearest of up to 2048 rows by exhaustive search costs ~10 us a weight, too slow
 * for mkmodel.  Instead each element is rounded to the nearest of the grid's few levels (3 or
 * 8), and the resulting code (its level indices as base-L digits, 3^8 or 8^4 of them) looks up
 * the grid row nearest to it, tabulated once per grid (~0.1 s for all of them together). */
#define IQ_GRIDS 6
#define IQ_MAX_CODES 6561 /* 3^8 >= 8^4 */
typedef struct iq_table {
    float level[8];
    int n_levels, width, n_codes;
    uint16_t near[IQ_MAX_CODES];
} iq_table;

static const iq_grid IQ_GRID[IQ_GRIDS] = {
    {iq2xxs_grid, NULL, 256, false}, {iq2xs_grid, NULL, 512, false}, {iq2s_grid, NULL, 1024, false},
    {NULL, iq3xxs_grid, 256, false}, {NULL, iq3s_grid, 512, false},  {iq1s_grid, NULL, 2048, true},
};
enum { IQ2XXS, IQ2XS, IQ2S, IQ3XXS, IQ3S, IQ1S };
static iq_table iq_tables[IQ_GRIDS];
static pthread_once_t iq_tables_once = PTHREAD_ONCE_INIT;

static float grid_elem(const iq_grid *g, int r, int j)
{
    const uint8_t b = g->g64 ? (uint8_t)(g->g64[r] >> (8 * j)) : (uint8_t)(g->g32[r] >> (8 * j));
    return g->is_signed ? (float)(int8_t)b : (float)b;
}

/* The level index of value v (one of tb's levels). */
static int level_index(const iq_table *tb, float v)
{
    int k = 0;
    while (k < tb->n_levels - 1 && tb->level[k] != v) k++;
    return k;
}

/* Tabulates near[]: for every code, the row with the least squared distance.  Distances split
 * in halves of the width: a row's and a code's halves are each one of HN = L^(width/2) level
 * patterns, and half[a * HN + b] is the distance between patterns a and b, so a (code, row)
 * pair costs two lookups (this runs once per process, also in the sanitizer builds). */
static void build_iq_table(const iq_grid *g, iq_table *tb)
{
    tb->width = g->g64 ? 8 : 4;
    tb->n_levels = 0;
    for (int r = 0; r < g->rows; r++) /* the distinct element values, ascending */
        for (int j = 0; j < tb->width; j++) {
            const float v = grid_elem(g, r, j);
            int k = 0;
            while (k < tb->n_levels && tb->level[k] < v) k++;
            if (k < tb->n_levels && tb->level[k] == v) continue;
            memmove(tb->level + k + 1, tb->level + k, sizeof(float) * (size_t)(tb->n_levels - k));
            tb->level[k] = v;
            tb->n_levels++;
        }
    const int L = tb->n_levels, hw = tb->width / 2;
    int hn = 1;
    for (int j = 0; j < hw; j++) hn *= L;
    tb->n_codes = hn * hn;
    static float half[IQ_MAX_CODES];      /* hn * hn <= 81 * 81; only used under the once */
    static uint16_t row_lo[2048], row_hi[2048];
    for (int a = 0; a < hn; a++)
        for (int b = 0; b < hn; b++) {
            float e = 0.0f;
            for (int j = 0, x = a, y = b; j < hw; j++, x /= L, y /= L) {
                const float diff = tb->level[x % L] - tb->level[y % L];
                e += diff * diff;
            }
            half[a * hn + b] = e;
        }
    for (int r = 0; r < g->rows; r++) {
        int code = 0;
        for (int j = tb->width - 1; j >= 0; j--) code = code * L + level_index(tb, grid_elem(g, r, j));
        row_lo[r] = (uint16_t)(code % hn);
        row_hi[r] = (uint16_t)(code / hn);
    }
    for (int code = 0; code < tb->n_codes; code++) {
        const float *lo = half + (code % hn) * hn, *hi = half + (code / hn) * hn;
        float best_err = INFINITY;
        for (int r = 0; r < g->rows; r++) {
            const float e = lo[row_lo[r]] + hi[row_hi[r]];
            if (e < best_err) {
                best_err = e;
                tb->near[code] = (uint16_t)r;
            }
        }
    }
}

static void build_iq_tables(void)
{
    for (int i = 0; i < IQ_GRIDS; i++) build_iq_table(&IQ_GRID[i], &iq_tables[i]);
}

/* Squared distance of row r (+ offset) to t. */
static float row_err(int grid, int r, const float *t, float offset)
{
    float e = 0.0f;
    for (int j = 0; j < iq_tables[grid].width; j++) {
        const float diff = grid_elem(&IQ_GRID[grid], r, j) + offset - t[j];
        e += diff * diff;
    }
    return e;
}

/* The grid row for t (8 or 4 elements, by the grid's width) with offset added to every
 * element; *err its squared distance.  Candidates: the row tabulated for the per-element
 * nearest levels, and those for each one element moved to its second-nearest level. */
static int grid_nearest(int grid, const float *t, float offset, float *err)
{
    pthread_once(&iq_tables_once, build_iq_tables);
    const iq_table *tb = &iq_tables[grid];
    int code = 0, pow = 1, near1[8], near2[8], place[8];
    for (int j = 0; j < tb->width; j++, pow *= tb->n_levels) {
        int k1 = 0, k2 = -1; /* the nearest level and the next */
        for (int l = 1; l < tb->n_levels; l++) {
            const float dl = fabsf(tb->level[l] + offset - t[j]);
            if (dl < fabsf(tb->level[k1] + offset - t[j])) {
                k2 = k1;
                k1 = l;
            } else if (k2 < 0 || dl < fabsf(tb->level[k2] + offset - t[j])) {
                k2 = l;
            }
        }
        near1[j] = k1;
        near2[j] = k2;
        place[j] = pow;
        code += k1 * pow;
    }
    int best = tb->near[code];
    float best_err = row_err(grid, best, t, offset);
    for (int j = 0; j < tb->width; j++) {
        const int r = tb->near[code + (near2[j] - near1[j]) * place[j]];
        const float e = row_err(grid, r, t, offset);
        if (e < best_err) {
            best_err = e;
            best = r;
        }
    }
    *err = best_err;
    return best;
}

static float amax_of(const float *x, int n)
{
    return fabsf(signed_amax(x, n));
}

/* A sub-block scale db = d * (a + b*l), l in [0, lmax]: the l nearest to s. */
static int sub_scale(float s, float d, float a, float b, int lmax)
{
    return d > 0.0f ? round_clamp((s / d - a) / b, 0, lmax) : 0;
}

/* 8 weights under the scale db: their sign bits (an even number if `even`) and the grid rows
 * (one of 8, or two of 4) nearest to their magnitudes. */
static uint8_t encode_signed_8(int g, const float *x, float db, bool even, int idx[2])
{
    uint8_t signs = 0;
    int least = 0;
    for (int j = 0; j < 8; j++) {
        if (x[j] < 0.0f) signs |= (uint8_t)(1u << j);
        if (fabsf(x[j]) < fabsf(x[least])) least = j;
    }
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = db > 0.0f ? fabsf(x[j]) / db : 0.0f;
    if (even && __builtin_popcount(signs) % 2) {
        signs ^= (uint8_t)(1u << least); /* its magnitude now counts against it: aim for 0 */
        t[least] = 0.0f;
    }
    float err;
    idx[0] = grid_nearest(g, t, 0.0f, &err);
    idx[1] = IQ_GRID[g].g64 ? 0 : grid_nearest(g, t + 4, 0.0f, &err);
    return signs;
}

/* The f16 d of a super-block whose sub-blocks want the scales s[0..n) with db = d*(a + b*l):
 * the largest maps to l = lmax. */
static float iq_super_scale(uint8_t dd[2], const float *s, int n, float a, float b, int lmax)
{
    float smax = 0.0f;
    for (int i = 0; i < n; i++) smax = fmaxf(smax, s[i]);
    return store_f16_scale(dd, smax / (a + b * (float)lmax));
}

/* The wanted scale of each of the n sub-blocks of `len` weights: amax / top. */
static void wanted_scales(const float *x, int n, int len, float top, float *s)
{
    for (int i = 0; i < n; i++) s[i] = amax_of(x + len * i, len) / top;
}

static void store_u16(uint8_t p[2], uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static void store_u32(uint8_t p[4], uint32_t v)
{
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}

/* IQ2_XXS and IQ3_XXS: per 32 weights a u32 of four 7-bit sign indices and a 4-bit scale l
 * (db = d * (a + b*l)), and the grid bytes of its 4 (IQ3: 8) rows, each kind at its stride. */
typedef struct xxs_layout {
    int grid;
    float top, a, b; /* the grid's largest level; the scale's a and b */
    uint8_t *idx, *aux;
    int idx_stride, aux_stride;
} xxs_layout;

static void encode_xxs(const float *x, uint8_t dd[2], const xxs_layout *o)
{
    float s[QK_K / 32];
    wanted_scales(x, QK_K / 32, 32, o->top, s);
    const float d = iq_super_scale(dd, s, QK_K / 32, o->a, o->b, 15);
    const int per8 = IQ_GRID[o->grid].g64 ? 1 : 2; /* rows per group of 8 */
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const int ls = sub_scale(s[ib], d, o->a, o->b, 15);
        const float db = d * (o->a + o->b * (float)ls);
        uint32_t aux = (uint32_t)ls << 28;
        for (int l = 0; l < 4; l++) {
            int idx[2];
            aux |= (uint32_t)(encode_signed_8(o->grid, x + 32 * ib + 8 * l, db, true, idx) & 127) << (7 * l);
            for (int h = 0; h < per8; h++) o->idx[o->idx_stride * ib + per8 * l + h] = (uint8_t)idx[h];
        }
        store_u32(o->aux + o->aux_stride * ib, aux);
    }
}

static void encode_iq2_xxs(const float *x, uint8_t *blk)
{
    block_iq2_xxs *b = (block_iq2_xxs *)blk;
    encode_xxs(x, b->d, &(xxs_layout){IQ2XXS, 43.0f, 0.125f, 0.25f, b->qs, b->qs + 4, 8, 8});
}

static void encode_iq3_xxs(const float *x, uint8_t *blk)
{
    block_iq3_xxs *b = (block_iq3_xxs *)blk;
    encode_xxs(x, b->d, &(xxs_layout){IQ3XXS, 62.0f, 0.25f, 0.5f, b->qs, b->sas, 8, 4});
}

/* IQ2_XS and IQ2_S: a nibble scale per 16 weights, two per byte. */
static float iq2_scales16(const float *x, uint8_t dd[2], uint8_t scales[QK_K / 32], float db[QK_K / 16])
{
    float s[QK_K / 16];
    wanted_scales(x, QK_K / 16, 16, 43.0f, s);
    const float d = iq_super_scale(dd, s, QK_K / 16, 0.125f, 0.25f, 15);
    memset(scales, 0, QK_K / 32);
    for (int k = 0; k < QK_K / 16; k++) {
        const int ls = sub_scale(s[k], d, 0.125f, 0.25f, 15);
        scales[k / 2] |= (uint8_t)(ls << (4 * (k % 2)));
        db[k] = d * (0.5f + (float)ls) * 0.25f;
    }
    return d;
}

static void encode_iq2_xs(const float *x, uint8_t *blk)
{
    block_iq2_xs *b = (block_iq2_xs *)blk;
    float db[QK_K / 16];
    iq2_scales16(x, b->d, b->scales, db);
    for (int g = 0; g < QK_K / 8; g++) {
        int idx[2];
        const uint8_t signs = encode_signed_8(IQ2XS, x + 8 * g, db[g / 2], true, idx);
        store_u16(b->qs + 2 * g, (uint16_t)(idx[0] | ((signs & 127) << 9)));
    }
}

static void encode_iq2_s(const float *x, uint8_t *blk)
{
    block_iq2_s *b = (block_iq2_s *)blk;
    float db[QK_K / 16];
    iq2_scales16(x, b->d, b->scales, db);
    memset(b->qh, 0, sizeof b->qh);
    for (int g = 0; g < QK_K / 8; g++) {
        int idx[2];
        b->signs[g] = encode_signed_8(IQ2S, x + 8 * g, db[g / 2], false, idx);
        b->qs[g] = (uint8_t)(idx[0] & 0xff);
        b->qh[g / 4] |= (uint8_t)((idx[0] >> 8) << (2 * (g % 4)));
    }
}

static void encode_iq3_s(const float *x, uint8_t *blk)
{
    block_iq3_s *b = (block_iq3_s *)blk;
    float s[QK_K / 32];
    wanted_scales(x, QK_K / 32, 32, 15.0f, s);
    const float d = iq_super_scale(b->d, s, QK_K / 32, 1.0f, 2.0f, 15);
    memset(b->qh, 0, sizeof b->qh);
    memset(b->scales, 0, sizeof b->scales);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const int ls = sub_scale(s[ib], d, 1.0f, 2.0f, 15);
        b->scales[ib / 2] |= (uint8_t)(ls << (4 * (ib % 2)));
        const float db = d * (float)(1 + 2 * ls);
        for (int l = 0; l < 4; l++) {
            int idx[2];
            b->signs[4 * ib + l] = encode_signed_8(IQ3S, x + 32 * ib + 8 * l, db, false, idx);
            for (int h = 0; h < 2; h++) {
                b->qs[8 * ib + 2 * l + h] = (uint8_t)(idx[h] & 0xff);
                b->qh[ib] |= (uint8_t)((idx[h] >> 8) << (2 * l + h));
            }
        }
    }
}

/* 8 IQ1 weights under dl: the grid row and delta sign (+1/8 or -1/8) nearest to x / dl.
 * Returns the row; *neg the delta's sign. */
static int encode_iq1_8(const float *x, float dl, bool *neg)
{
    float t[8], err_pos, err_neg;
    for (int j = 0; j < 8; j++) t[j] = dl > 0.0f ? x[j] / dl : 0.0f;
    const int pos = grid_nearest(IQ1S, t, IQ1_DELTA, &err_pos);
    const int ng = grid_nearest(IQ1S, t, -IQ1_DELTA, &err_neg);
    *neg = err_neg < err_pos;
    return *neg ? ng : pos;
}

/* IQ1_S has one delta per 32 weights: the sign whose 4 groups fit better. */
static void encode_iq1_s(const float *x, uint8_t *blk)
{
    block_iq1_s *b = (block_iq1_s *)blk;
    float s[QK_K / 32];
    wanted_scales(x, QK_K / 32, 32, 1.0f + IQ1_DELTA, s);
    const float d = iq_super_scale(b->d, s, QK_K / 32, 1.0f, 2.0f, 7);
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const int ls = sub_scale(s[ib], d, 1.0f, 2.0f, 7);
        const float dl = d * (float)(2 * ls + 1);
        int idx[2][4];
        float err[2] = {0.0f, 0.0f};
        for (int sgn = 0; sgn < 2; sgn++)
            for (int l = 0; l < 4; l++) {
                float t[8], e;
                for (int j = 0; j < 8; j++) t[j] = dl > 0.0f ? x[32 * ib + 8 * l + j] / dl : 0.0f;
                idx[sgn][l] = grid_nearest(IQ1S, t, sgn ? -IQ1_DELTA : IQ1_DELTA, &e);
                err[sgn] += e;
            }
        const int sgn = err[1] < err[0];
        uint16_t qh = (uint16_t)((ls << 12) | (sgn << 15));
        for (int l = 0; l < 4; l++) {
            b->qs[4 * ib + l] = (uint8_t)(idx[sgn][l] & 0xff);
            qh |= (uint16_t)((idx[sgn][l] >> 8) << (3 * l));
        }
        store_u16(b->qh + 2 * ib, qh);
    }
}

static void encode_iq1_m(const float *x, uint8_t *blk)
{
    block_iq1_m *b = (block_iq1_m *)blk;
    float s[QK_K / 16];
    uint8_t dd[2];
    wanted_scales(x, QK_K / 16, 16, 1.0f + IQ1_DELTA, s);
    const float d = iq_super_scale(dd, s, QK_K / 16, 1.0f, 2.0f, 7);
    const uint16_t dh = load_u16(dd);
    uint16_t sc[4] = {0, 0, 0, 0};
    memset(b->qh, 0, sizeof b->qh);
    for (int k = 0; k < QK_K / 16; k++) { /* scale k: bits 3(k%4).. of word k/4 */
        const int ls = sub_scale(s[k], d, 1.0f, 2.0f, 7);
        sc[k / 4] |= (uint16_t)(ls << (3 * (k % 4)));
        const float dl = d * (float)(2 * ls + 1);
        for (int h = 0; h < 2; h++) {
            const int g = 2 * k + h; /* group of 8: index 4ib + l */
            bool neg;
            const int idx = encode_iq1_8(x + 8 * g, dl, &neg);
            b->qs[g] = (uint8_t)(idx & 0xff);
            b->qh[g / 2] |= (uint8_t)((((idx >> 8) & 7) | (neg ? 8 : 0)) << (4 * (g % 2)));
        }
    }
    for (int k = 0; k < 4; k++) store_u16(b->scales + 2 * k, (uint16_t)(sc[k] | (((dh >> (4 * k)) & 0xf) << 12)));
}

size_t quant_quantize_row(ggml_type type, const float *src, void *dst, int64_t n)
{
    uint8_t *out = dst;
    if (!row_ok(type, n)) return 0;
    size_t bytes = ggml_row_bytes(type, n);
    if (type == GGML_TYPE_F32) {
        memcpy(out, src, bytes);
        return bytes;
    }
    if (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = type == GGML_TYPE_F16 ? quant_f32_to_f16(src[i])
                                               : quant_f32_to_bf16(src[i]);
            out[2 * i] = (uint8_t)(h & 0xff);
            out[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return bytes;
    }
    void (*encode)(const float *, uint8_t *) = NULL;
    switch (type) {
    case GGML_TYPE_Q4_0: encode = encode_q4_0; break;
    case GGML_TYPE_Q8_0: encode = encode_q8_0; break;
    case GGML_TYPE_Q4_K: encode = encode_q4_K; break;
    case GGML_TYPE_Q5_K: encode = encode_q5_K; break;
    case GGML_TYPE_Q6_K: encode = encode_q6_K; break;
    case GGML_TYPE_Q4_1: encode = encode_q4_1; break;
    case GGML_TYPE_Q5_0: encode = encode_q5_0; break;
    case GGML_TYPE_Q5_1: encode = encode_q5_1; break;
    case GGML_TYPE_IQ4_NL: encode = encode_iq4_nl; break;
    case GGML_TYPE_IQ4_XS: encode = encode_iq4_xs; break;
    case GGML_TYPE_Q2_K: encode = encode_q2_K; break;
    case GGML_TYPE_Q3_K: encode = encode_q3_K; break;
    case GGML_TYPE_MXFP4: encode = encode_mxfp4; break;
    case GGML_TYPE_IQ2_XXS: encode = encode_iq2_xxs; break;
    case GGML_TYPE_IQ2_XS: encode = encode_iq2_xs; break;
    case GGML_TYPE_IQ2_S: encode = encode_iq2_s; break;
    case GGML_TYPE_IQ3_XXS: encode = encode_iq3_xxs; break;
    case GGML_TYPE_IQ3_S: encode = encode_iq3_s; break;
    case GGML_TYPE_IQ1_S: encode = encode_iq1_s; break;
    case GGML_TYPE_IQ1_M: encode = encode_iq1_m; break;
    default: return 0;
    }
    size_t elems = ggml_type_block_elems(type), bb = ggml_type_block_bytes(type);
    for (int64_t b = 0; b < n / (int64_t)elems; b++)
        encode(src + (size_t)b * elems, out + (size_t)b * bb);
    return bytes;
}
