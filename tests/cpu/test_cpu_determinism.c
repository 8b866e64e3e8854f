/* test_cpu_determinism.c - deterministic serving on the CPU engine (issue 32): its kernels
 * compute each row alone, so the property --deterministic asks of the GPU holds here in any
 * mode.  32 sequences, half greedy and half seeded at temperature 0.9 with top logprobs, run
 * alone, all together, and alone with prompts in chunks of 5 and of 1: tokens, logprobs, top
 * logprobs and raw logits bit-identical (det_check.h, which the GPU engine test runs too), on a
 * tiny dense model and on the hybrid reference files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* The hybrids (../shared/reference: gated DeltaNet with its recurrent state, gated attention,
 * shared expert): each run starts its sequences at position 0, which starts their state slots
 * afresh, and a chunked prompt carries the state from chunk to chunk. */
static void test_hybrids_bit_identical(void **state)
{
    (void)state;
    static const char *files[] = {"qwen3_5.gguf", "qwen3_5_moe.gguf", "qwen3_next.gguf"};
    const char *env = getenv("INFERD_SHARED_DIR");
    int ran = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1200], err[512];
        snprintf(path, sizeof path, "%s/reference/%s", env && *env ? env : INFERD_SHARED_DIR, files[i]);
        model *m = model_load(path, err, sizeof err);
        if (!m) {
            print_message("  skipping %s: %s\n", files[i], err);
            continue;
        }
        print_message("  %s\n", files[i]);
        det_case(m, ENGINE_DEVICE_CPU);
        model_free(m);
        ran++;
    }
    if (!ran) skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_bit_identical),
        cmocka_unit_test(test_hybrids_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
