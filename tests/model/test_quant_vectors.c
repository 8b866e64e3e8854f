/* test_quant_vectors.c - dequantisation bit for bit against gguf-py's reference, and the dot
 * product against dequantise-then-dot, for the types whose expected values come from gguf-py.
 *
 * tests/model/vectors/<type>.bin: N raw blocks, then the N * block_elems floats gguf-py's
 * dequantize gives for them; written by tests/model/vectors/gen_quant_vectors.py (random and
 * edge-case blocks: zero, largest-finite, subnormal and negative scales, all-ones quants, and
 * for Q4_1/Q5_0/Q5_1/MXFP4 blocks from gguf-py's own quantizer; the IQ1/IQ2/IQ3 types' random
 * bytes reach grid rows, sign patterns and sub-block scales across their ranges). */
#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/quant.h"

typedef struct vectors {
    uint8_t *blocks; /* nblocks * block_bytes */
    float *want;     /* nblocks * block_elems */
    int64_t n;       /* weights */
} vectors;

static void load_vectors(ggml_type type, vectors *v)
{
    const char *src = getenv("INFERD_SOURCE_DIR");
    char path[4096], lower[16];
    const char *name = ggml_type_name(type);
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof lower; i++) lower[i] = (char)tolower((unsigned char)name[i]);
    lower[i] = 0;
    snprintf(path, sizeof path, "%s/tests/model/vectors/%s.bin", src ? src : ".", lower);
    FILE *f = fopen(path, "rb");
    if (!f) {
        print_error("cannot open %s (INFERD_SOURCE_DIR unset?)\n", path);
        fail();
    }
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    rewind(f);
    size_t bb = ggml_type_block_bytes(type), be = ggml_type_block_elems(type);
    size_t per_block = bb + be * sizeof(float);
    assert_true(size > 0 && (size_t)size % per_block == 0);
    size_t nb = (size_t)size / per_block;
    v->n = (int64_t)(nb * be);
    v->blocks = malloc(nb * bb);
    v->want = malloc(nb * be * sizeof(float));
    assert_non_null(v->blocks);
    assert_non_null(v->want);
    assert_int_equal(fread(v->blocks, 1, nb * bb, f), nb * bb);
    assert_int_equal(fread(v->want, sizeof(float), nb * be, f), nb * be); /* little-endian host */
    fclose(f);
}

static void free_vectors(vectors *v)
{
    free(v->blocks);
    free(v->want);
}

static void check_dequantize(ggml_type type, const vectors *v)
{
    float *got = malloc((size_t)v->n * sizeof(float));
    assert_non_null(got);
    quant_dequantize_row(type, v->blocks, got, v->n);
    for (int64_t i = 0; i < v->n; i++) {
        uint32_t g, w;
        memcpy(&g, &got[i], 4);
        memcpy(&w, &v->want[i], 4);
        if (g != w) {
            print_error("%s weight %lld (block %lld): got %.9g (0x%08x), gguf-py %.9g (0x%08x)\n",
                        ggml_type_name(type), (long long)i,
                        (long long)(i / (int64_t)ggml_type_block_elems(type)), got[i], g,
                        v->want[i], w);
            fail();
        }
    }
    free(got);
}

/* The engine's dot product sees exactly the dequantised weights: compare with a double sum
 * over gguf-py's floats, within float rounding of the magnitude sum. */
static void check_dot(ggml_type type, const vectors *v)
{
    float *x = malloc((size_t)v->n * sizeof(float));
    assert_non_null(x);
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int64_t i = 0; i < v->n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int32_t)(s >> 32)) / 2147483648.0f; /* [-1, 1) */
    }
    /* whole rows of every length the blocks allow, from the start */
    int64_t be = (int64_t)ggml_type_block_elems(type);
    for (int64_t n = be; n <= v->n; n += be) {
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            ref += (double)v->want[i] * x[i];
            mag += fabs((double)v->want[i] * x[i]);
        }
        float got = quant_dot_row(type, v->blocks, x, n);
        if (!(fabs(got - ref) <= 1e-6 * mag + 1e-30)) {
            print_error("%s n=%lld: dot %.9g, dequant+dot %.9g (mag %g)\n", ggml_type_name(type),
                        (long long)n, got, ref, mag);
            fail();
        }
    }
    free(x);
}

static void check_type(ggml_type type)
{
    vectors v;
    load_vectors(type, &v);
    check_dequantize(type, &v);
    check_dot(type, &v);
    free_vectors(&v);
}

static void test_q4_1(void **state) { (void)state; check_type(GGML_TYPE_Q4_1); }
static void test_q5_0(void **state) { (void)state; check_type(GGML_TYPE_Q5_0); }
static void test_q5_1(void **state) { (void)state; check_type(GGML_TYPE_Q5_1); }
static void test_q2_k(void **state) { (void)state; check_type(GGML_TYPE_Q2_K); }
static void test_q3_k(void **state) { (void)state; check_type(GGML_TYPE_Q3_K); }
static void test_iq4_nl(void **state) { (void)state; check_type(GGML_TYPE_IQ4_NL); }
static void test_iq4_xs(void **state) { (void)state; check_type(GGML_TYPE_IQ4_XS); }
static void test_mxfp4(void **state) { (void)state; check_type(GGML_TYPE_MXFP4); }
static void test_iq2_xxs(void **state) { (void)state; check_type(GGML_TYPE_IQ2_XXS); }
static void test_iq2_xs(void **state) { (void)state; check_type(GGML_TYPE_IQ2_XS); }
static void test_iq2_s(void **state) { (void)state; check_type(GGML_TYPE_IQ2_S); }
static void test_iq3_xxs(void **state) { (void)state; check_type(GGML_TYPE_IQ3_XXS); }
static void test_iq3_s(void **state) { (void)state; check_type(GGML_TYPE_IQ3_S); }
static void test_iq1_s(void **state) { (void)state; check_type(GGML_TYPE_IQ1_S); }
static void test_iq1_m(void **state) { (void)state; check_type(GGML_TYPE_IQ1_M); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4_1), cmocka_unit_test(test_q5_0),   cmocka_unit_test(test_q5_1),
        cmocka_unit_test(test_q2_k), cmocka_unit_test(test_q3_k),   cmocka_unit_test(test_iq4_nl),
        cmocka_unit_test(test_iq4_xs), cmocka_unit_test(test_mxfp4),  cmocka_unit_test(test_iq2_xxs),
        cmocka_unit_test(test_iq2_xs), cmocka_unit_test(test_iq2_s),  cmocka_unit_test(test_iq3_xxs),
        cmocka_unit_test(test_iq3_s), cmocka_unit_test(test_iq1_s),   cmocka_unit_test(test_iq1_m),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
