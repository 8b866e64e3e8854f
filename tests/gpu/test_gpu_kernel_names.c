/* test_gpu_kernel_names.c - the kernel table (gpu/gpu_kernel_names.h) that the CUDA side
 * instantiates and the host looks up: every weight format has every variant of every
 * per-format kernel, each named as the pattern says, no name twice, and each format's TYPE is
 * the ggml type of its suffix.  Plain C: runs in every build, with or without CUDA. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include "gpu/gpu_kernel_names.h"
#include "model/ggml_types.h"

typedef struct row {
    const char *a, *b, *type;
    int rows;
} row;

#define WTYPE(TYPE, suffix) {#TYPE, #suffix, GGML_TYPE_##TYPE},
static const struct {
    const char *type, *suffix;
    ggml_type ggml;
} wtypes[] = {GPU_WEIGHT_TYPES(WTYPE)};
#define ROW4(a, b, TYPE, rows) {#a, #b, #TYPE, rows},
#define ROW3(a, b, TYPE) {#a, #b, #TYPE, 0},
static const row matvec[] = {GPU_MATVEC_KERNELS(ROW4)};
static const row dequant[] = {GPU_DEQUANT_KERNELS(ROW3)};
#define ROW2(a, TYPE) {#a, "", #TYPE, 1},
static const row rope[] = {GPU_MATVEC_ROPE_KERNELS(ROW2)};
static const row mmq[] = {GPU_MMQ_KERNELS(ROW4)};
/* the dp4a rows name three kernels: the QKV one is checked from dp4a_rope */
#define DP4A(a, b, c, TYPE) {#a, #b, #TYPE, 1},
#define DP4A_ROPE(a, b, c, TYPE) {#c, "", #TYPE, 1},
static const row dp4a[] = {GPU_MATVEC_DP4A_KERNELS(DP4A)};
static const row dp4a_rope[] = {GPU_MATVEC_DP4A_KERNELS(DP4A_ROPE)};
/* the norms' rows (QKV with qkv_post, gate/up, residual, plain): the last two are checked
 * from norm_res; the MoE norms' rows (gate/up, down) */
#define NORM(a, b, c, d, TYPE) {#a, #b, #TYPE, 1},
#define NORM_RES(a, b, c, d, TYPE) {#c, #d, #TYPE, 1},
static const row norm[] = {GPU_MATVEC_NORM_KERNELS(NORM)};
static const row norm_res[] = {GPU_MATVEC_NORM_KERNELS(NORM_RES)};
static const row lo_norm[] = {GPU_MATVEC_LO_NORM_KERNELS(ROW2)};
/* the wide rows: rows is the row's k split */
#define WIDE(a, TYPE, KS) {#a, "", #TYPE, KS},
static const row wide[] = {GPU_MATVEC_WIDE_KERNELS(WIDE)};
static const row one[] = {GPU_MATVEC_ONE_KERNELS(ROW2)};
#define MOE_NORM(a, b, TYPE) {#a, #b, #TYPE, 0},
static const row moe_norm[] = {GPU_MOE_NORM_KERNELS(MOE_NORM)};
/* the MoE rows name three kernels: the down one is checked from moe_down */
#define MOE(a, b, c, TYPE) {#a, #b, #TYPE, 0},
#define MOE_DOWN(a, b, c, TYPE) {#c, "", #TYPE, 0},
static const row moe[] = {GPU_MOE_KERNELS(MOE)};
static const row moe_down[] = {GPU_MOE_KERNELS(MOE_DOWN)};
static const row narrow[] = {GPU_MMQ_NARROW_KERNELS(ROW3)};
/* the pair rows: two kernels (QKV with qkv_post, plain NORM_IN) and their two formats */
typedef struct pair_row {
    const char *rope, *nin, *ta, *tb;
} pair_row;
#define PAIR(rope, nin, TA, TB) {#rope, #nin, #TA, #TB},
static const pair_row pair[] = {GPU_MATVEC_PAIR_KERNELS(PAIR)};
#define PLAIN(name) #name,
static const char *const plain[] = {GPU_PLAIN_KERNELS(PLAIN)};

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* The formats with mmq kernels: every block-quantised one and BF16 (F16 and F32 go to cuBLAS
 * as they lie). */
static bool has_mmq(ggml_type t)
{
    return t != GGML_TYPE_F32 && t != GGML_TYPE_F16;
}

/* The rows of list for wtype w with `rows` activation rows: exactly one, named fmt_a/fmt_b. */
static void expect_row(const row *list, size_t n, size_t w, int rows, const char *fmt_a, const char *fmt_b)
{
    char a[64], b[64];
    snprintf(a, sizeof a, fmt_a, wtypes[w].suffix, rows);
    snprintf(b, sizeof b, fmt_b, wtypes[w].suffix, rows);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(list[i].type, wtypes[w].type) != 0 || list[i].rows != rows) continue;
        found++;
        assert_string_equal(list[i].a, a);
        assert_string_equal(list[i].b, b);
    }
    if (found != 1) fail_msg("%s: %d rows of %d activation rows (want 1)", a, found, rows);
}

static void test_formats_are_ggml_types(void **state)
{
    (void)state;
    for (size_t w = 0; w < N(wtypes); w++)
        assert_int_equal(strcasecmp(ggml_type_name(wtypes[w].ggml), wtypes[w].suffix), 0);
}

static void test_every_format_every_variant(void **state)
{
    (void)state;
    size_t n_mmq = 0;
    for (size_t w = 0; w < N(wtypes); w++) {
        for (int v = 0; v < 4; v++) expect_row(matvec, N(matvec), w, 1 << v, "matvec_%s_%d", "glu_%s_%d");
        expect_row(dequant, N(dequant), w, 0, "dequant_f16_%s", "embed_%s");
        expect_row(rope, N(rope), w, 1, "matvec_rope_%s", "");
        expect_row(moe, N(moe), w, 0, "moe_glu_%s", "moe_matvec_%s");
        expect_row(moe_down, N(moe_down), w, 0, "moe_down_%s", "");
        if (!has_mmq(wtypes[w].ggml)) continue;
        n_mmq++;
        for (int v = 0; v < 3; v++) expect_row(mmq, N(mmq), w, 16 << v, "mmq_%s_%d", "mmq_glu_%s_%d");
        expect_row(narrow, N(narrow), w, 0, "mmq_narrow_%s", "mmq_narrow_glu_%s");
    }
    /* nothing besides: every row was one of the expected */
    assert_int_equal(N(matvec), 4 * N(wtypes));
    assert_int_equal(N(dequant), N(wtypes));
    assert_int_equal(N(rope), N(wtypes));
    assert_int_equal(N(moe), N(wtypes));
    assert_int_equal(N(moe_down), N(wtypes));
    assert_int_equal(N(mmq), 3 * n_mmq);
    assert_int_equal(N(narrow), n_mmq);
}

/* The dp4a list covers only the formats it is written for: each at most once, named for it,
 * and block-quantised (kernels/dot_q8.cuh reads super-blocks). */
static void test_dp4a_rows(void **state)
{
    (void)state;
    size_t found = 0;
    for (size_t w = 0; w < N(wtypes); w++) {
        bool listed = false;
        for (size_t i = 0; i < N(dp4a); i++) listed |= strcmp(dp4a[i].type, wtypes[w].type) == 0;
        if (!listed) continue;
        found++;
        assert_true(has_mmq(wtypes[w].ggml) && wtypes[w].ggml != GGML_TYPE_BF16); /* block-quantised */
        expect_row(dp4a, N(dp4a), w, 1, "matvec_dp4a_%s", "glu_dp4a_%s");
        expect_row(dp4a_rope, N(dp4a_rope), w, 1, "matvec_rope_dp4a_%s", "");
    }
    assert_int_equal(found, N(dp4a));
    assert_true(found >= 2); /* Q4_K and Q6_K, the batch-1 step's Q4_K_M formats */
}

/* The norms' list: each format at most once, named for it, and the Q4_K_M files' two among them. */
static void test_norm_rows(void **state)
{
    (void)state;
    size_t found = 0;
    bool q4_k = false, q6_k = false;
    for (size_t w = 0; w < N(wtypes); w++) {
        bool listed = false;
        for (size_t i = 0; i < N(norm); i++) listed |= strcmp(norm[i].type, wtypes[w].type) == 0;
        if (!listed) continue;
        found++;
        q4_k |= wtypes[w].ggml == GGML_TYPE_Q4_K, q6_k |= wtypes[w].ggml == GGML_TYPE_Q6_K;
        expect_row(norm, N(norm), w, 1, "matvec_rope_norm_%s", "glu_norm_%s");
        expect_row(norm_res, N(norm_res), w, 1, "matvec_res_%s", "matvec_nin_%s");
    }
    assert_int_equal(found, N(norm));
    assert_true(q4_k && q6_k);
}

/* The DeltaNet input's norm list: each format at most once, named for it, each one that the
 * norms' list has (its producer, matvec_res, writes the remainder it reads), the Q4_K_M files'
 * two among them. */
static void test_lo_norm_rows(void **state)
{
    (void)state;
    size_t found = 0;
    bool q4_k = false, q6_k = false;
    for (size_t w = 0; w < N(wtypes); w++) {
        bool listed = false, in_norm = false;
        for (size_t i = 0; i < N(lo_norm); i++) listed |= strcmp(lo_norm[i].type, wtypes[w].type) == 0;
        if (!listed) continue;
        for (size_t i = 0; i < N(norm); i++) in_norm |= strcmp(norm[i].type, wtypes[w].type) == 0;
        assert_true(in_norm);
        found++;
        q4_k |= wtypes[w].ggml == GGML_TYPE_Q4_K, q6_k |= wtypes[w].ggml == GGML_TYPE_Q6_K;
        expect_row(lo_norm, N(lo_norm), w, 1, "matvec_lo_nin_%s", "");
    }
    assert_int_equal(found, N(lo_norm));
    assert_true(q4_k && q6_k);
}

/* The MoE norms' list: each format at most once, named for it, and the Q4_K_M files' two and
 * gpt-oss's MXFP4 among them. */
static void test_moe_norm_rows(void **state)
{
    (void)state;
    size_t found = 0;
    bool q4_k = false, q6_k = false, mxfp4 = false;
    for (size_t w = 0; w < N(wtypes); w++) {
        bool listed = false;
        for (size_t i = 0; i < N(moe_norm); i++) listed |= strcmp(moe_norm[i].type, wtypes[w].type) == 0;
        if (!listed) continue;
        found++;
        q4_k |= wtypes[w].ggml == GGML_TYPE_Q4_K, q6_k |= wtypes[w].ggml == GGML_TYPE_Q6_K;
        mxfp4 |= wtypes[w].ggml == GGML_TYPE_MXFP4;
        expect_row(moe_norm, N(moe_norm), w, 0, "moe_glu_norm_%s", "moe_down_res_%s");
    }
    assert_int_equal(found, N(moe_norm));
    assert_true(q4_k && q6_k && mxfp4);
}

/* The wide products' list: splits of 2 or 4, each (format, split) once, named
 * matvec_wide<KS>_<suffix>, and the Gemma Q4_K_M files' Q4_K (both splits) and Q6_K among them. */
static void test_wide_rows(void **state)
{
    (void)state;
    bool q4_k = false, q6_k = false;
    for (size_t i = 0; i < N(wide); i++) {
        assert_true(wide[i].rows == 2 || wide[i].rows == 4);
        size_t w = 0;
        while (w < N(wtypes) && strcmp(wtypes[w].type, wide[i].type) != 0) w++;
        assert_true(w < N(wtypes));
        char want[64];
        snprintf(want, sizeof want, "matvec_wide%d_%s", wide[i].rows, wtypes[w].suffix);
        assert_string_equal(wide[i].a, want);
        for (size_t j = i + 1; j < N(wide); j++)
            if (strcmp(wide[j].type, wide[i].type) == 0 && wide[j].rows == wide[i].rows) fail_msg("%s twice", want);
        q4_k |= wtypes[w].ggml == GGML_TYPE_Q4_K, q6_k |= wtypes[w].ggml == GGML_TYPE_Q6_K;
    }
    assert_true(q4_k && q6_k);
}

/* The single-segment products' list: each format at most once, named for it, Q6_K (the Q4_K_M
 * files' LM head) among them. */
static void test_one_rows(void **state)
{
    (void)state;
    size_t found = 0;
    bool q6_k = false;
    for (size_t w = 0; w < N(wtypes); w++) {
        bool listed = false;
        for (size_t i = 0; i < N(one); i++) listed |= strcmp(one[i].type, wtypes[w].type) == 0;
        if (!listed) continue;
        found++;
        q6_k |= wtypes[w].ggml == GGML_TYPE_Q6_K;
        expect_row(one, N(one), w, 1, "matvec_one_%s", "");
    }
    assert_int_equal(found, N(one));
    assert_true(q6_k);
}

static size_t wtype_of(const char *type)
{
    size_t w = 0;
    while (w < N(wtypes) && strcmp(wtypes[w].type, type) != 0) w++;
    assert_true(w < N(wtypes));
    return w;
}

/* The pairs' list: two different formats each, both in the norms' list (the pair runs their
 * matvec_rope_norm / matvec_nin bodies), named for both, no pair twice, GPU_N_MATVEC_PAIRS its
 * length, Q4_K then Q6_K (the Q4_K_M files' QKV) among them. */
static void test_pair_rows(void **state)
{
    (void)state;
    bool q4_k_q6_k = false;
    assert_int_equal(GPU_N_MATVEC_PAIRS, N(pair));
    for (size_t i = 0; i < N(pair); i++) {
        const size_t a = wtype_of(pair[i].ta), b = wtype_of(pair[i].tb);
        assert_true(a != b);
        bool na = false, nb = false;
        for (size_t j = 0; j < N(norm); j++)
            na |= strcmp(norm[j].type, pair[i].ta) == 0, nb |= strcmp(norm[j].type, pair[i].tb) == 0;
        assert_true(na && nb);
        char want[96];
        snprintf(want, sizeof want, "matvec_rope_norm_%s_%s", wtypes[a].suffix, wtypes[b].suffix);
        assert_string_equal(pair[i].rope, want);
        snprintf(want, sizeof want, "matvec_nin_%s_%s", wtypes[a].suffix, wtypes[b].suffix);
        assert_string_equal(pair[i].nin, want);
        for (size_t j = i + 1; j < N(pair); j++)
            if (strcmp(pair[j].ta, pair[i].ta) == 0 && strcmp(pair[j].tb, pair[i].tb) == 0) fail_msg("%s twice", want);
        q4_k_q6_k |= wtypes[a].ggml == GGML_TYPE_Q4_K && wtypes[b].ggml == GGML_TYPE_Q6_K;
    }
    assert_true(q4_k_q6_k);
}

static void test_no_name_twice(void **state)
{
    (void)state;
    const char *names[2 * (N(matvec) + N(dequant) + N(mmq) + N(moe) + N(dp4a) + N(narrow) + N(norm) + N(norm_res) +
                           N(moe_norm)) +
                      N(rope) + N(dp4a_rope) + N(moe_down) + N(lo_norm) + N(wide) + N(one) + N(plain) + 2 * N(pair)];
    size_t n = 0;
    const row *lists[] = {matvec, dequant, mmq, moe, dp4a, narrow, norm, norm_res, moe_norm};
    const size_t sizes[] = {N(matvec), N(dequant), N(mmq), N(moe), N(dp4a), N(narrow), N(norm), N(norm_res), N(moe_norm)};
    for (size_t l = 0; l < N(lists); l++)
        for (size_t i = 0; i < sizes[l]; i++) {
            names[n++] = lists[l][i].a;
            names[n++] = lists[l][i].b;
        }
    for (size_t i = 0; i < N(rope); i++) names[n++] = rope[i].a;
    for (size_t i = 0; i < N(dp4a_rope); i++) names[n++] = dp4a_rope[i].a;
    for (size_t i = 0; i < N(moe_down); i++) names[n++] = moe_down[i].a;
    for (size_t i = 0; i < N(lo_norm); i++) names[n++] = lo_norm[i].a;
    for (size_t i = 0; i < N(wide); i++) names[n++] = wide[i].a;
    for (size_t i = 0; i < N(one); i++) names[n++] = one[i].a;
    for (size_t i = 0; i < N(plain); i++) names[n++] = plain[i];
    for (size_t i = 0; i < N(pair); i++) names[n++] = pair[i].rope, names[n++] = pair[i].nin;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (strcmp(names[i], names[j]) == 0) fail_msg("kernel %s named twice", names[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_are_ggml_types),
        cmocka_unit_test(test_every_format_every_variant),
        cmocka_unit_test(test_dp4a_rows),
        cmocka_unit_test(test_norm_rows),
        cmocka_unit_test(test_lo_norm_rows),
        cmocka_unit_test(test_moe_norm_rows),
        cmocka_unit_test(test_wide_rows),
        cmocka_unit_test(test_one_rows),
        cmocka_unit_test(test_pair_rows),
        cmocka_unit_test(test_no_name_twice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
