/* test_quant.c - the weight formats: half conversions, bit-exact dequantisation of blocks built
 * byte by byte, the fused dot product, and quantise -> dequantise round trips.
 *
 * Expected values are computed here from the documented formulas, indexing each weight
 * directly (not with the implementation's loop structure), and a few are spelled out as
 * literals worked by hand. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/quant.h"

/* ---------------------------------------------------------------- helpers */

static void put_half(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* xorshift64*: reproducible data without libc's rand() */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static float rng_uniform(void) /* (0, 1) */
{
    return ((float)(rng_u32() >> 8) + 0.5f) / 16777216.0f;
}

static float rng_gauss(void)
{
    return sqrtf(-2.0f * logf(rng_uniform())) * cosf(6.2831853f * rng_uniform());
}

static void fill_random_bytes(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rng_u32();
}

/* asserts two floats are the same bits (so -0 != +0 and NaN payloads count) */
static void assert_same_float(float got, float want, int index)
{
    if (bits_of(got) != bits_of(want)) {
        print_error("weight %d: got %.9g (0x%08x), want %.9g (0x%08x)\n", index, got,
                    bits_of(got), want, bits_of(want));
        fail();
    }
}

/* ---------------------------------------------------------------- half precision */

static void test_f16_to_f32(void **state)
{
    (void)state;
    assert_true(quant_f16_to_f32(0x3c00) == 1.0f);
    assert_true(quant_f16_to_f32(0xc000) == -2.0f);
    assert_true(quant_f16_to_f32(0x3555) == 0x1.554p-2f);
    assert_true(quant_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(quant_f16_to_f32(0x0400) == 0x1p-14f);       /* smallest normal */
    assert_true(quant_f16_to_f32(0x0001) == 0x1p-24f);       /* smallest subnormal */
    assert_true(quant_f16_to_f32(0x03ff) == 1023 * 0x1p-24f); /* largest subnormal */
    assert_true(quant_f16_to_f32(0x8001) == -0x1p-24f);
    assert_same_float(quant_f16_to_f32(0x0000), 0.0f, 0);
    assert_same_float(quant_f16_to_f32(0x8000), -0.0f, 0);
    assert_true(isinf(quant_f16_to_f32(0x7c00)) && quant_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(quant_f16_to_f32(0xfc00)) && quant_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(quant_f16_to_f32(0x7e00)));
    assert_true(isnan(quant_f16_to_f32(0x7c01))); /* signalling NaN is still NaN */
    assert_true(isnan(quant_f16_to_f32(0xfe00)) && signbit(quant_f16_to_f32(0xfe00)));

    /* every half: value from sign, exponent and mantissa computed in double */
    for (uint32_t h = 0; h < 0x10000; h++) {
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        if (e == 31) continue;
        double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        if (h & 0x8000) v = -v;
        assert_same_float(quant_f16_to_f32((uint16_t)h), (float)v, (int)h);
    }
}

/* The nearest half to f by search over the (monotonic) positive halves, ties to the even
 * one: an independent reference for the bit-twiddling conversion. */
static uint16_t nearest_half(float f)
{
    float a = fabsf(f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00); /* 65504 + half an ulp (2^4) */
    uint32_t lo = 0, hi = 0x7bff;
    while (lo < hi) { /* largest half <= a */
        uint32_t mid = (lo + hi + 1) / 2;
        if (quant_f16_to_f32((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    if (lo == 0x7bff) return (uint16_t)(sign | lo);
    double below = quant_f16_to_f32((uint16_t)lo), above = quant_f16_to_f32((uint16_t)(lo + 1));
    double dlo = a - below, dhi = above - a;
    uint32_t h = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo & 1) ? lo + 1 : lo;
    return (uint16_t)(sign | h);
}

static void test_f32_to_f16(void **state)
{
    (void)state;
    assert_int_equal(quant_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(quant_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(quant_f32_to_f16(-0.0f), 0x8000);
    /* ties go to even; just above a tie goes up */
    assert_int_equal(quant_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(quant_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(quant_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    /* overflow: 65519 rounds down to the largest half, 65520 is a tie that goes to inf */
    assert_int_equal(quant_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(quant_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(quant_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(quant_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(quant_f32_to_f16(INFINITY), 0x7c00);
    /* subnormals: 2^-25 is a tie between 0 and the smallest subnormal (goes to 0),
     * 3*2^-25 a tie between 1 and 2 ulps (goes to 2), the top of the range carries into
     * the smallest normal */
    assert_int_equal(quant_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(quant_f32_to_f16(0x1p-25f), 0x0000);
    assert_int_equal(quant_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(quant_f32_to_f16(3 * 0x1p-25f), 0x0002);
    assert_int_equal(quant_f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);
    assert_int_equal(quant_f32_to_f16(-1e-30f), 0x8000);
    assert_int_equal(quant_f32_to_f16(0x1p-149f), 0x0000); /* float subnormal */
    /* NaN stays NaN (a truncating conversion of this payload would give inf) */
    uint16_t n = quant_f32_to_f16(float_of(0x7f800001u));
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
    n = quant_f32_to_f16(float_of(0xffc00000u));
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0 && (n & 0x8000));

    /* every half converts back to itself */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
        assert_int_equal(quant_f32_to_f16(quant_f16_to_f32((uint16_t)h)), h);
    }
    /* random floats across the half range and beyond against the search reference */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (rng_u32() & 0x80ffffffu) | ((uint32_t)(96 + rng_u32() % 50) << 23);
        float f = float_of(u);
        if (quant_f32_to_f16(f) != nearest_half(f)) {
            print_error("f=%a: got 0x%04x want 0x%04x\n", f, quant_f32_to_f16(f),
                        nearest_half(f));
            fail();
        }
    }
}

static void test_bf16(void **state)
{
    (void)state;
    assert_true(quant_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(quant_bf16_to_f32(0xc0a0) == -5.0f);
    assert_true(quant_bf16_to_f32(0x0001) == 0x1p-133f); /* subnormal */
    assert_true(isinf(quant_bf16_to_f32(0xff80)));
    assert_true(isnan(quant_bf16_to_f32(0x7fc1)));
    for (uint32_t h = 0; h < 0x10000; h++)
        assert_int_equal(bits_of(quant_bf16_to_f32((uint16_t)h)), h << 16);

    assert_int_equal(quant_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(quant_f32_to_bf16(float_of(0x3f808000u)), 0x3f80); /* tie, even below */
    assert_int_equal(quant_f32_to_bf16(float_of(0x3f818000u)), 0x3f82); /* tie, even above */
    assert_int_equal(quant_f32_to_bf16(float_of(0x3f808001u)), 0x3f81); /* above the tie */
    assert_int_equal(quant_f32_to_bf16(float_of(0x3f807fffu)), 0x3f80);
    assert_int_equal(quant_f32_to_bf16(float_of(0x00018000u)), 0x0002); /* subnormal tie */
    assert_int_equal(quant_f32_to_bf16(float_of(0x7f7fffffu)), 0x7f80); /* rounds to inf */
    assert_int_equal(quant_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(quant_f32_to_bf16(-0.0f), 0x8000);
    uint16_t n = quant_f32_to_bf16(float_of(0x7f800001u)); /* rounding would make it inf */
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    n = quant_f32_to_bf16(float_of(0xffffffffu)); /* rounding would overflow the sign */
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0 && (n & 0x8000));
}

/* ---------------------------------------------------------------- Q4_0 and Q8_0 */

static void test_q4_0_block(void **state)
{
    (void)state;
    uint8_t row[2 * 18];
    /* block 0: d = 0.5; weight j (j < 16) gets nibble j, weight j+16 gets 15-j */
    put_half(row, 0x3800);
    for (int j = 0; j < 16; j++) row[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    /* block 1: d = -2; every byte 0x8F: low nibble 15, high nibble 8 */
    put_half(row + 18, 0xc000);
    memset(row + 20, 0x8f, 16);

    float y[64];
    quant_dequantize_row(GGML_TYPE_Q4_0, row, y, 64);
    for (int j = 0; j < 16; j++) {
        assert_same_float(y[j], (float)(j - 8) * 0.5f, j);
        assert_same_float(y[j + 16], (float)(7 - j) * 0.5f, j + 16);
        assert_same_float(y[32 + j], -14.0f, 32 + j);   /* (15-8) * -2 */
        assert_same_float(y[48 + j], -0.0f, 48 + j);    /* (8-8) * -2 */
    }
    assert_true(y[0] == -4.0f && y[8] == 0.0f && y[15] == 3.5f);
    assert_true(y[16] == 3.5f && y[31] == -4.0f);
}

static void test_q8_0_block(void **state)
{
    (void)state;
    uint8_t row[34];
    put_half(row, 0x3400); /* 0.25 */
    for (int j = 0; j < 32; j++) row[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    float y[32];
    quant_dequantize_row(GGML_TYPE_Q8_0, row, y, 32);
    for (int j = 0; j < 32; j++) assert_same_float(y[j], (float)(j * 8 - 128) * 0.25f, j);
    assert_true(y[0] == -32.0f && y[16] == 0.0f && y[31] == 30.0f);
}

/* ---------------------------------------------------------------- Q4_K and Q5_K */

/* Scales and mins chosen so that sub-blocks 4..7 use their top two bits (>= 16) */
static const uint8_t K_SC[8] = {1, 10, 63, 32, 37, 50, 63, 20};
static const uint8_t K_M[8] = {0, 7, 63, 21, 45, 18, 61, 33};
/* ... and packed by hand: bytes 0-3 scale j | top bits of scale j+4, bytes 4-7 min j | top
 * bits of min j+4, bytes 8-11 low nibbles of scale j+4 | min j+4 */
static const uint8_t K_SCALE_BYTES[12] = {0x81, 0xca, 0xff, 0x60, 0x80, 0x47,
                                          0xff, 0x95, 0xd5, 0x22, 0xdf, 0x14};

/* nibble of weight l (0..31) in sub-block s: chunk s/2, low nibble for even s */
static int k_nibble(const uint8_t *qs, int s, int l)
{
    uint8_t byte = qs[32 * (s / 2) + l];
    return s % 2 == 0 ? byte & 15 : byte >> 4;
}

static void build_k_block(uint8_t *blk, int has_qh)
{
    put_half(blk, 0x3800);     /* d = 0.5 */
    put_half(blk + 2, 0x3400); /* dmin = 0.25 */
    memcpy(blk + 4, K_SCALE_BYTES, 12);
    uint8_t *qs = blk + 16 + (has_qh ? 32 : 0);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) qs[32 * c + l] = (uint8_t)((l % 16) | ((15 - l % 16) << 4));
    if (has_qh) {
        uint8_t *qh = blk + 16;
        for (int l = 0; l < 32; l++) qh[l] = (uint8_t)(l * 37 + 11);
        qh[0] = 0xff;
        qh[1] = 0x00;
    }
}

static void test_q4_K_block(void **state)
{
    (void)state;
    uint8_t blk[144];
    build_k_block(blk, 0);
    float y[256];
    quant_dequantize_row(GGML_TYPE_Q4_K, blk, y, 256);
    for (int s = 0; s < 8; s++)
        for (int l = 0; l < 32; l++) {
            float want = 0.5f * K_SC[s] * (float)k_nibble(blk + 16, s, l) - 0.25f * K_M[s];
            assert_same_float(y[32 * s + l], want, 32 * s + l);
        }
    assert_true(y[0] == 0.0f);       /* sub-block 0: sc 1, m 0, q 0 */
    assert_true(y[5] == 2.5f);       /* 0.5*1*5 */
    assert_true(y[32] == 73.25f);    /* sub-block 1: 0.5*10*15 - 0.25*7 */
    assert_true(y[128] == -11.25f);  /* sub-block 4: 0.5*37*0 - 0.25*45 */
    assert_true(y[131] == 44.25f);   /* 0.5*37*3 - 11.25 */
    assert_true(y[193] == 16.25f);   /* sub-block 6: 0.5*63*1 - 0.25*61 */
    assert_true(y[224] == 141.75f);  /* sub-block 7: 0.5*20*15 - 0.25*33 */
    assert_true(y[255] == -8.25f);   /* 0.5*20*0 - 8.25 */
}

static void test_q5_K_block(void **state)
{
    (void)state;
    uint8_t blk[176];
    build_k_block(blk, 1);
    const uint8_t *qh = blk + 16, *qs = blk + 48;
    float y[256];
    quant_dequantize_row(GGML_TYPE_Q5_K, blk, y, 256);
    /* the 5th bit of weight l of sub-block s is bit s of qh[l] */
    int seen[8][2] = {{0}};
    for (int s = 0; s < 8; s++)
        for (int l = 0; l < 32; l++) {
            int hb = (qh[l] >> s) & 1;
            seen[s][hb] = 1;
            float q = (float)(k_nibble(qs, s, l) + 16 * hb);
            float want = 0.5f * K_SC[s] * q - 0.25f * K_M[s];
            assert_same_float(y[32 * s + l], want, 32 * s + l);
        }
    for (int s = 0; s < 8; s++) assert_true(seen[s][0] && seen[s][1]); /* both bit values */
    assert_true(y[0] == 8.0f);      /* q = 0 + 16 */
    assert_true(y[1] == 0.5f);      /* q = 1, no high bit */
    assert_true(y[32] == 153.25f);  /* sub-block 1: 0.5*10*31 - 1.75 */
    assert_true(y[128] == 284.75f); /* sub-block 4: 0.5*37*16 - 11.25 */
    assert_true(y[224] == 301.75f); /* sub-block 7: 0.5*20*31 - 8.25 */
    assert_true(y[225] == 131.75f); /* 0.5*20*14 - 8.25 */
}

/* ---------------------------------------------------------------- Q6_K */

static const int8_t Q6_SC[16] = {1, -1, 2, -3, 127, -128, 5, 7, -7, 0, 64, -64, 3, 9, -100, 100};

/* weight i: half h, group g of 32 in the half, lane l; low nibble of ql[64h + l + 32*(g&1)]
 * for g < 2, high nibble for g >= 2; 2 bits at 2g of qh[32h + l]; scale 8h + 2g + l/16 */
static float q6_expected(const uint8_t *blk, int i)
{
    const uint8_t *ql = blk, *qh = blk + 128;
    int h = i / 128, g = (i % 128) / 32, l = i % 32;
    uint8_t byte = ql[64 * h + l + 32 * (g & 1)];
    int lo = g < 2 ? byte & 15 : byte >> 4;
    int hi = (qh[32 * h + l] >> (2 * g)) & 3;
    int sc = (int8_t)blk[192 + 8 * h + 2 * g + l / 16];
    float d = quant_f16_to_f32((uint16_t)(blk[208] | (blk[209] << 8)));
    return d * (float)sc * (float)((lo | (hi << 4)) - 32); /* ggml's order: (d*sc)*q */
}

static void test_q6_K_block(void **state)
{
    (void)state;
    uint8_t blk[210];
    for (int i = 0; i < 192; i++) blk[i] = (uint8_t)(i * 13 + 7);
    memcpy(blk + 192, Q6_SC, 16);
    put_half(blk + 208, 0x3400); /* d = 0.25 */
    uint8_t *ql = blk, *qh = blk + 128;
    ql[0] = 0xf0;  /* weight 0: low 0; weight 64: high 15 */
    qh[0] = 0xd8;  /* pairs (g0..g3) = 0, 2, 1, 3 */
    ql[32] = 0x3a; /* weight 32: low 10; weight 96: high 3 */
    ql[16] = 0x05; /* weight 16: low 5; weight 80: high 0 */
    qh[16] = 0x03; /* weight 16: pair 3; weight 80: pair 0 */
    ql[80] = 0x70; /* half 1, weight 128+80: high 7 */
    qh[48] = 0x20; /* ... pair 2 */
    ql[65] = 0x0c; /* half 1, weight 129: low 12 */
    qh[33] = 0x00;

    float y[256];
    quant_dequantize_row(GGML_TYPE_Q6_K, blk, y, 256);
    for (int i = 0; i < 256; i++) assert_same_float(y[i], q6_expected(blk, i), i);
    assert_true(y[0] == -8.0f);     /* q 0 - 32, sc 1 */
    assert_true(y[64] == -31.75f);  /* q 31 - 32, sc 127 */
    assert_true(y[32] == 5.0f);     /* q 42 - 32, sc 2 */
    assert_true(y[96] == 23.75f);   /* q 51 - 32, sc 5 */
    assert_true(y[16] == -5.25f);   /* q 53 - 32, sc -1 */
    assert_true(y[80] == 1024.0f);  /* q 0 - 32, sc -128 */
    assert_true(y[208] == 15.75f);  /* q 39 - 32, sc 9 */
    assert_true(y[129] == 35.0f);   /* q 12 - 32, sc -7 */
}

/* ---------------------------------------------------------------- rows of random blocks */

typedef struct {
    ggml_type type;
    int block_elems, block_bytes;
    int half_at[2]; /* offsets of the f16 fields to keep finite (-1: none) */
} qtype;

static const qtype QTYPES[] = {
    {GGML_TYPE_Q4_0, 32, 18, {0, -1}},   {GGML_TYPE_Q8_0, 32, 34, {0, -1}},
    {GGML_TYPE_Q4_K, 256, 144, {0, 2}},  {GGML_TYPE_Q5_K, 256, 176, {0, 2}},
    {GGML_TYPE_Q6_K, 256, 210, {208, -1}},
};

/* random bytes, with the scales set to random finite halves in [2^-10, 2^-4) */
static uint8_t *random_row(const qtype *t, int nblocks)
{
    uint8_t *row = malloc((size_t)nblocks * t->block_bytes);
    assert_non_null(row);
    fill_random_bytes(row, (size_t)nblocks * t->block_bytes);
    for (int b = 0; b < nblocks; b++)
        for (int k = 0; k < 2; k++)
            if (t->half_at[k] >= 0)
                put_half(row + b * t->block_bytes + t->half_at[k],
                         (uint16_t)(0x1400 + rng_u32() % 0x1800));
    return row;
}

/* 6-bit scale and min of sub-block s from the 12 packed bytes */
static void k_scale_min(const uint8_t *b, int s, int *sc, int *m)
{
    if (s < 4) {
        *sc = b[s] & 63;
        *m = b[s + 4] & 63;
    } else {
        *sc = (b[s + 4] & 15) | ((b[s - 4] >> 6) << 4);
        *m = (b[s + 4] >> 4) | ((b[s] >> 6) << 4);
    }
}

static float half_at(const uint8_t *p)
{
    return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* weight i of one block, straight from the format description */
static float expected_weight(ggml_type type, const uint8_t *blk, int i)
{
    switch (type) {
    case GGML_TYPE_Q4_0: {
        uint8_t byte = blk[2 + i % 16];
        return (float)((i < 16 ? byte & 15 : byte >> 4) - 8) * half_at(blk);
    }
    case GGML_TYPE_Q8_0: return (float)(int8_t)blk[2 + i] * half_at(blk);
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        int s = i / 32, l = i % 32, sc, m;
        k_scale_min(blk + 4, s, &sc, &m);
        int q = type == GGML_TYPE_Q4_K ? k_nibble(blk + 16, s, l)
                                       : k_nibble(blk + 48, s, l) + 16 * ((blk[16 + l] >> s) & 1);
        return half_at(blk) * (float)sc * (float)q - half_at(blk + 2) * (float)m;
    }
    case GGML_TYPE_Q6_K: return q6_expected(blk, i);
    default: fail(); return 0;
    }
}

/* Rows of several random blocks: every weight as the formula says (row indexing too). */
static void test_random_rows(void **state)
{
    (void)state;
    for (size_t t = 0; t < sizeof QTYPES / sizeof QTYPES[0]; t++) {
        const qtype *q = &QTYPES[t];
        int nb = 7, n = nb * q->block_elems;
        uint8_t *row = random_row(q, nb);
        float *y = malloc(sizeof(float) * n);
        assert_non_null(y);
        quant_dequantize_row(q->type, row, y, n);
        for (int i = 0; i < n; i++) {
            int b = i / q->block_elems;
            assert_same_float(y[i],
                              expected_weight(q->type, row + b * q->block_bytes,
                                              i % q->block_elems), i);
        }
        free(y);
        free(row);
    }
}

/* ---------------------------------------------------------------- dot products */

static void check_dot(ggml_type type, const uint8_t *row, int64_t n)
{
    float *w = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * n);
    assert_non_null(w);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss();
    quant_dequantize_row(type, row, w, n);
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        ref += (double)w[i] * x[i];
        mag += fabs((double)w[i] * x[i]);
    }
    float got = quant_dot_row(type, row, x, n);
    /* float summation: error within a few ulps of the magnitude sum */
    if (!(fabs(got - ref) <= 1e-6 * mag + 1e-30)) {
        print_error("%s n=%lld: dot %.9g, dequant+dot %.9g (mag %g)\n", ggml_type_name(type),
                    (long long)n, got, ref, mag);
        fail();
    }
    /* an unaligned copy of the row gives the same bits (blocks may sit anywhere) */
    size_t bytes = ggml_row_bytes(type, n);
    uint8_t *shifted = malloc(bytes + 1);
    assert_non_null(shifted);
    memcpy(shifted + 1, row, bytes);
    assert_same_float(quant_dot_row(type, shifted + 1, x, n), got, -1);
    free(shifted);
    free(w);
    free(x);
}

static void test_dot_quantised(void **state)
{
    (void)state;
    for (size_t t = 0; t < sizeof QTYPES / sizeof QTYPES[0]; t++) {
        const qtype *q = &QTYPES[t];
        for (int nb = 1; nb <= 12; nb += 11) {
            uint8_t *row = random_row(q, nb);
            check_dot(q->type, row, (int64_t)nb * q->block_elems);
            free(row);
        }
    }
}

static void test_dot_float(void **state)
{
    (void)state;
    const ggml_type types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16};
    const int64_t lens[] = {1, 15, 16, 255, 256, 1000, 4099};
    for (size_t t = 0; t < 3; t++)
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            int64_t n = lens[k];
            float *src = malloc(sizeof(float) * n);
            uint8_t *row = malloc(ggml_row_bytes(types[t], n));
            assert_non_null(src);
            assert_non_null(row);
            for (int64_t i = 0; i < n; i++) src[i] = rng_gauss();
            assert_int_equal(quant_quantize_row(types[t], src, row, n),
                             ggml_row_bytes(types[t], n));
            check_dot(types[t], row, n);
            free(row);
            free(src);
        }
}

/* A dot product on hand-known data: Q8_0 with q = 1..32, d = 1, x = 1 gives 528. */
static void test_dot_literal(void **state)
{
    (void)state;
    uint8_t row[34];
    put_half(row, 0x3c00);
    for (int j = 0; j < 32; j++) row[2 + j] = (uint8_t)(j + 1);
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = 1.0f;
    assert_true(quant_dot_row(GGML_TYPE_Q8_0, row, x, 32) == 528.0f);
    x[31] = -1.0f; /* 528 - 2*32 */
    assert_true(quant_dot_row(GGML_TYPE_Q8_0, row, x, 32) == 464.0f);
}

/* ---------------------------------------------------------------- quantisation */

/* RMS error relative to the data's RMS, measured on Gaussian data; the bounds are a
 * little above what the quantisers reach (printed), and far below a broken encoding. */
static void test_quantize_gaussian(void **state)
{
    (void)state;
    static const struct {
        ggml_type type;
        double max_rel_rms;
    } cases[] = {
        {GGML_TYPE_F16, 3e-4},  {GGML_TYPE_BF16, 3e-3}, {GGML_TYPE_Q8_0, 6e-3},
        {GGML_TYPE_Q6_K, 2.0e-2}, {GGML_TYPE_Q5_K, 4.0e-2}, {GGML_TYPE_Q4_K, 8.0e-2},
        {GGML_TYPE_Q4_0, 9.5e-2}, {GGML_TYPE_Q5_1, 4.5e-2}, {GGML_TYPE_Q5_0, 5.0e-2},
        {GGML_TYPE_Q4_1, 9.0e-2}, {GGML_TYPE_IQ4_NL, 9.5e-2}, {GGML_TYPE_IQ4_XS, 9.5e-2},
        {GGML_TYPE_Q3_K, 1.7e-1}, {GGML_TYPE_Q2_K, 3.1e-1}, {GGML_TYPE_MXFP4, 1.3e-1},
        /* the IQ types' grids, without an importance matrix (measured .141 .193 .266 .314
         * .365 .501 .591); uniform noise of the data's RMS would be ~1 */
        {GGML_TYPE_IQ3_S, 1.6e-1}, {GGML_TYPE_IQ3_XXS, 2.2e-1}, {GGML_TYPE_IQ2_S, 3.0e-1},
        {GGML_TYPE_IQ2_XS, 3.4e-1}, {GGML_TYPE_IQ2_XXS, 4.0e-1}, {GGML_TYPE_IQ1_M, 5.5e-1},
        {GGML_TYPE_IQ1_S, 6.5e-1},
    };
    const int64_t n = 16 * 256;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    uint8_t *row = malloc(ggml_row_bytes(GGML_TYPE_F32, n));
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(row);
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ggml_type type = cases[c].type;
        assert_int_equal(quant_quantize_row(type, x, row, n), ggml_row_bytes(type, n));
        quant_dequantize_row(type, row, y, n);
        double err = 0, sig = 0;
        for (int64_t i = 0; i < n; i++) {
            err += (double)(y[i] - x[i]) * (y[i] - x[i]);
            sig += (double)x[i] * x[i];
        }
        double rel = sqrt(err / sig);
        print_message("quantise %-5s relative RMS error %.5f\n", ggml_type_name(type), rel);
        assert_true(rel < cases[c].max_rel_rms);
        /* and the dot product of the quantised row agrees with its dequantisation */
        check_dot(type, row, n);
    }
    free(row);
    free(y);
    free(x);
}

/* All-zero and constant rows give valid blocks that dequantise to (nearly) the constant. */
static void test_quantize_constant(void **state)
{
    (void)state;
    const ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                               GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_F16,
                               GGML_TYPE_BF16, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                               GGML_TYPE_Q5_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                               GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS};
    const float values[] = {0.0f, 0.7f, -0.7f, 3.0f, -1e-3f};
    float x[512], y[512];
    uint8_t row[512 * 4];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            for (int i = 0; i < 512; i++) x[i] = values[v];
            memset(row, 0xa5, sizeof row);
            assert_int_equal(quant_quantize_row(types[t], x, row, 512),
                             ggml_row_bytes(types[t], 512));
            quant_dequantize_row(types[t], row, y, 512);
            /* For -1e-3, d of Q3_K and the IQ4 types is an f16 subnormal (IQ4_XS's d ~ 4 steps
             * of the smallest), and their few levels (sc*q <= 128, a fixed grid) cannot absorb
             * its rounding: 2 % there, as ggml's own encoders, which pick d the same way */
            bool coarse = types[t] == GGML_TYPE_Q3_K || types[t] == GGML_TYPE_IQ4_NL ||
                          types[t] == GGML_TYPE_IQ4_XS;
            float tol = coarse && fabsf(values[v]) < 0.01f ? 2e-2f : 4e-3f;
            for (int i = 0; i < 512; i++) {
                if (values[v] == 0.0f) {
                    assert_true(y[i] == 0.0f);
                } else if (!(fabsf(y[i] - values[v]) <= tol * fabsf(values[v]))) {
                    print_error("%s const %g: weight %d is %g\n", ggml_type_name(types[t]),
                                values[v], i, y[i]);
                    fail();
                }
            }
        }
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    float x[256] = {0}, y[256];
    uint8_t row[256] = {0};
    assert_int_equal(quant_quantize_row(GGML_TYPE_Q4_0, x, row, 31), 0);
    assert_int_equal(quant_quantize_row(GGML_TYPE_Q4_K, x, row, 64), 0);
    assert_int_equal(quant_quantize_row(GGML_TYPE_TQ1_0, x, row, 256), 0); /* unsupported */
    assert_true(isnan(quant_dot_row(GGML_TYPE_TQ1_0, row, x, 256)));
    assert_true(isnan(quant_dot_row(GGML_TYPE_Q8_0, row, x, 33)));
    assert_true(quant_dot_row(GGML_TYPE_Q8_0, row, x, 0) == 0.0f);
    quant_dequantize_row(GGML_TYPE_TQ1_0, row, y, 256);
    for (int i = 0; i < 256; i++) assert_true(isnan(y[i]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32),       cmocka_unit_test(test_f32_to_f16),
        cmocka_unit_test(test_bf16),             cmocka_unit_test(test_q4_0_block),
        cmocka_unit_test(test_q8_0_block),       cmocka_unit_test(test_q4_K_block),
        cmocka_unit_test(test_q5_K_block),       cmocka_unit_test(test_q6_K_block),
        cmocka_unit_test(test_random_rows),      cmocka_unit_test(test_dot_literal),
        cmocka_unit_test(test_dot_quantised),    cmocka_unit_test(test_dot_float),
        cmocka_unit_test(test_quantize_gaussian), cmocka_unit_test(test_quantize_constant),
        cmocka_unit_test(test_invalid_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
