/* test_delta.c - the gated delta rule's two forms (cpu_ops.h: cpu_delta_run): the chunked
 * parallel form (the WY / UT transform over chunks of many sizes) against the exact
 * token-by-token recurrence, on random inputs: two sequences of different lengths (one longer
 * than two chunks of 64), starting from non-zero states, more v heads than q/k heads in both
 * head orders.  The outputs and the states after them agree to float rounding (1e-4 of the
 * largest value; a wrong decay, beta or state term moves them by 1e-1 or more).  That the
 * recurrence gives the same bits however a prompt is split over steps is checked on the real
 * models (test_arch_reference.c: test_prefill_in_pieces). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/cpu_ops.h"
#include "delta_util.h"

enum { D = 16, KH = 2, VH = 4, CHAN = 2 * KH * D + VH * D, TOK = 150 + 37, THREADS = 2 };

typedef struct inputs {
    float qkv[TOK * CHAN], beta[TOK * VH], g[TOK * VH];
    float state0[2 * VH * D * D];
} inputs;

static void make_inputs(inputs *in)
{
    uint64_t s = 42;
    for (int t = 0; t < TOK; t++) {
        float *row = in->qkv + (size_t)t * CHAN;
        for (int c = 0; c < CHAN; c++) row[c] = 2 * delta_uniform(&s) - 1;
        for (int h = 0; h < 2 * KH; h++) cpu_l2norm(row + h * D, D); /* q and k are L2-normed */
        for (int i = 0; i < KH * D; i++) row[i] *= 0.25f;          /* q / sqrt(d) */
        for (int h = 0; h < VH; h++) {
            in->beta[t * VH + h] = delta_uniform(&s);
            in->g[t * VH + h] = -2 * delta_uniform(&s);
        }
    }
    for (size_t i = 0; i < sizeof in->state0 / sizeof *in->state0; i++) in->state0[i] = 0.5f * (2 * delta_uniform(&s) - 1);
}

/* Runs the rule over both sequences (tokens [0, 150) and [150, 187), state slots 1 and 0). */
static void run(cpu_pool *pool, const inputs *in, bool grouped, int chunk, float *out, float *state)
{
    static const int first[2] = {0, 150}, tokens[2] = {150, 37}, slot[2] = {1, 0};
    memcpy(state, in->state0, sizeof in->state0);
    float *scratch = malloc((size_t)THREADS * (size_t)cpu_delta_scratch(D, chunk) * sizeof(float));
    cpu_delta dr = {.out = out, .qkv = in->qkv, .stride = CHAN, .q_off = 0, .k_off = KH * D, .v_off = 2 * KH * D,
                    .beta = in->beta, .g = in->g, .state = state, .slot_stride = VH * D * D, .layer_off = 0,
                    .seq_first = first, .seq_tokens = tokens, .seq_state = slot, .n_seqs = 2, .v_heads = VH,
                    .k_heads = KH, .d = D, .grouped = grouped, .chunk = chunk, .scratch = scratch};
    cpu_delta_run(pool, &dr);
    free(scratch);
}

static void test_chunked_equals_recurrence(void **state)
{
    (void)state;
    cpu_pool *pool = cpu_pool_create(THREADS);
    static inputs in;
    make_inputs(&in);
    static float out_ref[TOK * VH * D], out[TOK * VH * D], st_ref[2 * VH * D * D], st[2 * VH * D * D];
    const int chunks[] = {1, 2, 3, 7, 16, 31, 64, 100, 200};
    for (int grouped = 0; grouped < 2; grouped++) {
        run(pool, &in, grouped, 0, out_ref, st_ref);
        double worst = 0;
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            run(pool, &in, grouped, chunks[c], out, st);
            double e_out = delta_rel_diff(out, out_ref, TOK * VH * D), e_st = delta_rel_diff(st, st_ref, 2 * VH * D * D);
            if (e_out > 1e-4 || e_st > 1e-4)
                fail_msg("%s heads, chunks of %d: outputs %.2e, states %.2e from the recurrence",
                         grouped ? "grouped" : "tiled", chunks[c], e_out, e_st);
            worst = fmax(worst, fmax(e_out, e_st));
        }
        print_message("  %s heads: chunked form within %.2e of the recurrence over %zu chunk sizes\n",
                      grouped ? "grouped" : "tiled", worst, sizeof chunks / sizeof chunks[0]);
        /* a wrong head order is caught: the other order's outputs are far off */
        run(pool, &in, !grouped, 0, out, st);
        assert_true(delta_rel_diff(out, out_ref, TOK * VH * D) > 1e-2);
    }
    cpu_pool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_chunked_equals_recurrence)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
