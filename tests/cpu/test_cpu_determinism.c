/* test_cpu_determinism.c - deterministic serving on the CPU engine (issue 32): its kernels
 * compute each row alone, so the property --deterministic asks of the GPU holds here in any
 * mode.  32 sequences, half greedy and half seeded at temperature 0.9 with top logprobs, run
 * alone, all together, and alone with prompts in chunks of 5 and of 1: tokens, logprobs, top
 * logprobs and raw logits bit-identical (det_check.h, which the GPU engine test runs too). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "../model/det_check.h"
#include "../model/tiny_model.h"

static void run_on(ggml_type wtype)
{
    tiny_spec s = tiny_spec_default();
    s.n_vocab = 256, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 1, s.n_ff = 256, s.n_ctx = 128;
    s.wtype = wtype;
    size_t size;
    char err[256];
    void *image = tiny_model_build(&s, &size);
    model *m = tiny_model_load(image, size, err, sizeof err);
    if (!m) fail_msg("%s", err);
    det_case(m, ENGINE_DEVICE_CPU);
    model_free(m);
    free(image);
}

static void test_q8_bit_identical(void **state)
{
    (void)state;
    run_on(GGML_TYPE_Q8_0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
