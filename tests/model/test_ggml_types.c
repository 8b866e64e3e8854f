/* test_ggml_types.c - block geometry, names and row sizes of the ggml tensor types. */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "model/ggml_types.h"

typedef struct geometry {
    ggml_type type;
    const char *name;
    size_t elems, bytes;
} geometry;

/* ggml's values, written out independently of the table in ggml_types.c. */
static const geometry EXPECTED[] = {
    {GGML_TYPE_F32, "F32", 1, 4},         {GGML_TYPE_F16, "F16", 1, 2},
    {GGML_TYPE_Q4_0, "Q4_0", 32, 18},     {GGML_TYPE_Q4_1, "Q4_1", 32, 20},
    {GGML_TYPE_Q5_0, "Q5_0", 32, 22},     {GGML_TYPE_Q5_1, "Q5_1", 32, 24},
    {GGML_TYPE_Q8_0, "Q8_0", 32, 34},     {GGML_TYPE_Q8_1, "Q8_1", 32, 36},
    {GGML_TYPE_Q2_K, "Q2_K", 256, 84},    {GGML_TYPE_Q3_K, "Q3_K", 256, 110},
    {GGML_TYPE_Q4_K, "Q4_K", 256, 144},   {GGML_TYPE_Q5_K, "Q5_K", 256, 176},
    {GGML_TYPE_Q6_K, "Q6_K", 256, 210},   {GGML_TYPE_Q8_K, "Q8_K", 256, 292},
    {GGML_TYPE_IQ2_XXS, "IQ2_XXS", 256, 66}, {GGML_TYPE_IQ2_XS, "IQ2_XS", 256, 74},
    {GGML_TYPE_IQ3_XXS, "IQ3_XXS", 256, 98}, {GGML_TYPE_IQ1_S, "IQ1_S", 256, 50},
    {GGML_TYPE_IQ4_NL, "IQ4_NL", 32, 18}, {GGML_TYPE_IQ3_S, "IQ3_S", 256, 110},
    {GGML_TYPE_IQ2_S, "IQ2_S", 256, 82},  {GGML_TYPE_IQ4_XS, "IQ4_XS", 256, 136},
    {GGML_TYPE_I8, "I8", 1, 1},           {GGML_TYPE_I16, "I16", 1, 2},
    {GGML_TYPE_I32, "I32", 1, 4},         {GGML_TYPE_I64, "I64", 1, 8},
    {GGML_TYPE_F64, "F64", 1, 8},         {GGML_TYPE_IQ1_M, "IQ1_M", 256, 56},
    {GGML_TYPE_BF16, "BF16", 1, 2},       {GGML_TYPE_TQ1_0, "TQ1_0", 256, 54},
    {GGML_TYPE_TQ2_0, "TQ2_0", 256, 66},  {GGML_TYPE_MXFP4, "MXFP4", 32, 17},
};
#define N_EXPECTED (sizeof EXPECTED / sizeof EXPECTED[0])

static void test_geometry_matches_ggml(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_EXPECTED; i++) {
        const geometry *g = &EXPECTED[i];
        assert_true(ggml_type_known(g->type));
        assert_string_equal(ggml_type_name(g->type), g->name);
        assert_int_equal(ggml_type_block_elems(g->type), g->elems);
        assert_int_equal(ggml_type_block_bytes(g->type), g->bytes);
    }
}

static void test_every_known_number_is_listed(void **state)
{
    (void)state;
    int known = 0;
    for (uint32_t t = 0; t < 1000; t++) {
        if (!ggml_type_known(t)) {
            assert_int_equal(ggml_type_block_elems((ggml_type)t), 0);
            assert_string_equal(ggml_type_name((ggml_type)t), "unknown");
            continue;
        }
        known++;
    }
    assert_int_equal(known, N_EXPECTED);
    /* Numbers ggml retired stay unknown, so files using them are refused. */
    const uint32_t retired[] = {4, 5, 31, 32, 33, 36, 37, 38, GGML_TYPE_COUNT, UINT32_MAX};
    for (size_t i = 0; i < sizeof retired / sizeof retired[0]; i++) assert_false(ggml_type_known(retired[i]));
}

static void test_names_round_trip_case_insensitively(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_EXPECTED; i++) {
        char lower[16];
        size_t n = strlen(EXPECTED[i].name);
        for (size_t k = 0; k <= n; k++) lower[k] = (char)tolower((unsigned char)EXPECTED[i].name[k]);
        assert_int_equal(ggml_type_from_name(EXPECTED[i].name), EXPECTED[i].type);
        assert_int_equal(ggml_type_from_name(lower), EXPECTED[i].type);
    }
    assert_int_equal(ggml_type_from_name("q4_k"), GGML_TYPE_Q4_K);
    assert_int_equal(ggml_type_from_name("bf16"), GGML_TYPE_BF16);
    assert_int_equal(ggml_type_from_name("Q4"), -1);
    assert_int_equal(ggml_type_from_name(""), -1);
    assert_int_equal(ggml_type_from_name("unknown"), -1);
    assert_int_equal(ggml_type_from_name(NULL), -1);
}

static void test_supported_set(void **state)
{
    (void)state;
    const ggml_type want[] = {GGML_TYPE_F32,  GGML_TYPE_F16,    GGML_TYPE_BF16,  GGML_TYPE_Q4_0,
                              GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,   GGML_TYPE_Q5_1,  GGML_TYPE_Q8_0,
                              GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,  GGML_TYPE_Q5_K,
                              GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4,
                              GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS,
                              GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M};
    int n = 0;
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (ggml_type_supported((ggml_type)t)) {
            bool listed = false;
            for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) listed |= want[k] == (ggml_type)t;
            assert_true(listed);
            n++;
        }
    assert_int_equal(n, (int)(sizeof want / sizeof want[0]));
}

static void test_row_bytes(void **state)
{
    (void)state;
    assert_int_equal(ggml_row_bytes(GGML_TYPE_F32, 64), 256);
    assert_int_equal(ggml_row_bytes(GGML_TYPE_BF16, 3), 6);
    assert_int_equal(ggml_row_bytes(GGML_TYPE_Q4_0, 4096), 128 * 18);
    assert_int_equal(ggml_row_bytes(GGML_TYPE_Q8_0, 64), 68);
    assert_int_equal(ggml_row_bytes(GGML_TYPE_Q4_K, 512), 288);
    assert_int_equal(ggml_row_bytes(GGML_TYPE_Q6_K, 4096), 16 * 210);
    /* not a whole number of blocks, negative, unknown type, overflow */
    assert_int_equal(ggml_row_bytes(GGML_TYPE_Q4_0, 33), 0);
    assert_int_equal(ggml_row_bytes(GGML_TYPE_Q4_K, 128), 0);
    assert_int_equal(ggml_row_bytes(GGML_TYPE_F32, -4), 0);
    assert_int_equal(ggml_row_bytes((ggml_type)4, 32), 0);
    assert_int_equal(ggml_row_bytes(GGML_TYPE_F64, INT64_MAX - 7), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry_matches_ggml),
        cmocka_unit_test(test_every_known_number_is_listed),
        cmocka_unit_test(test_names_round_trip_case_insensitively),
        cmocka_unit_test(test_supported_set),
        cmocka_unit_test(test_row_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
