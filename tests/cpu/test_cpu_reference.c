/* test_cpu_reference.c - the CPU engine on a real trained model (stories260K) against the
 * outputs of karpathy's llama2.c: 8 greedy 200-step generations reproduced token for token,
 * and the logits of case 0 at positions 0..63. */
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/file.h"
#include "backend/backend.h"

#define BOS 1
#define N_LOGIT_POS 64

typedef struct fixture {
    char dir[1024];
    model *m;
    engine *e;
    cJSON *vectors;
} fixture;

static char *read_file(const char *path, size_t *size)
{
    char err[128];
    return file_read_all(path, (size_t)1 << 30, size, err, sizeof err);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    const char *env = getenv("INFERD_SHARED_DIR");
    snprintf(f->dir, sizeof f->dir, "%s", env && *env ? env : INFERD_SHARED_DIR);
    *state = f;
    char path[1200], err[256];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", f->dir);
    f->m = model_load(path, err, sizeof err);
    if (!f->m) {
        print_message("skipping: cannot load %s: %s\n", path, err);
        return 0;
    }
    snprintf(path, sizeof path, "%s/vectors/stories260K-greedy.json", f->dir);
    char *json = read_file(path, NULL);
    if (json) f->vectors = cJSON_Parse(json);
    free(json);
    engine_config cfg = {.n_slots = 8, .ctx_per_slot = 256, .max_batch_tokens = 256, .n_threads = 2};
    f->e = engine_open(ENGINE_DEVICE_CPU, f->m, &cfg, err, sizeof err);
    if (!f->e) fail_msg("engine: %s", err);
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    engine_free(f->e);
    model_free(f->m);
    cJSON_Delete(f->vectors);
    free(f);
    return 0;
}

static int32_t *int_array(const cJSON *arr, int *n)
{
    *n = cJSON_GetArraySize(arr);
    int32_t *out = malloc((size_t)(*n ? *n : 1) * sizeof *out);
    for (int i = 0; i < *n; i++) out[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    return out;
}

/* All 8 cases decode side by side, one slot each, exactly as the scheduler would run them:
 * every prompt in one step, then one token per running sequence per step. */
static void test_greedy_sequences(void **state)
{
    fixture *f = *state;
    if (!f->e || !f->vectors) skip();
    const cJSON *cases = cJSON_GetObjectItem(f->vectors, "cases");
    int n_cases = cJSON_GetArraySize(cases);
    assert_true(n_cases >= 1 && n_cases <= 8);
    int32_t *want[8], *got[8];
    int n_want[8], n_got[8];
    bool running[8];
    sampling_params sp;
    sampling_params_default(&sp);
    engine_seq seqs[8];
    engine_result res[8];
    int seq_case[8];
    char err[256];
    for (int c = 0; c < n_cases; c++) {
        const cJSON *cs = cJSON_GetArrayItem(cases, c);
        int n_prompt;
        int32_t *prompt = int_array(cJSON_GetObjectItem(cs, "prompt_tokens"), &n_prompt);
        want[c] = int_array(cJSON_GetObjectItem(cs, "sequence_tokens"), &n_want[c]);
        assert_true(n_want[c] <= 256);
        got[c] = calloc(256, sizeof(int32_t));
        memcpy(got[c], prompt, (size_t)n_prompt * sizeof(int32_t));
        n_got[c] = n_prompt;
        free(prompt);
        seqs[c] = (engine_seq){.slot = c, .tokens = got[c], .n_tokens = n_prompt, .pos = 0, .want_token = true, .sp = &sp};
        seq_case[c] = c;
        running[c] = true;
    }
    int n_seqs = n_cases;
    while (n_seqs > 0) {
        if (engine_step(f->e, seqs, n_seqs, res, err, sizeof err) != 0) fail_msg("step: %s", err);
        int next = 0;
        for (int i = 0; i < n_seqs; i++) {
            int c = seq_case[i];
            got[c][n_got[c]++] = res[i].token;
            /* llama2.c stops when BOS comes out, or after its fixed number of steps. */
            running[c] = res[i].token != BOS && n_got[c] < n_want[c];
            if (!running[c]) continue;
            seqs[next] = (engine_seq){.slot = c, .tokens = &got[c][n_got[c] - 1], .n_tokens = 1,
                                      .pos = n_got[c] - 1, .want_token = true, .sp = &sp};
            seq_case[next++] = c;
        }
        n_seqs = next;
    }
    int n_exact = 0;
    for (int c = 0; c < n_cases; c++) {
        int first_diff = -1;
        for (int i = 0; i < n_want[c] && first_diff < 0; i++)
            if (i >= n_got[c] || got[c][i] != want[c][i]) first_diff = i;
        if (first_diff < 0 && n_got[c] != n_want[c]) first_diff = n_want[c];
        print_message("  case %d: %d tokens, %s", c, n_want[c], first_diff < 0 ? "identical\n" : "");
        if (first_diff >= 0)
            print_message("first difference at position %d (got %d, want %d)\n", first_diff,
                          first_diff < n_got[c] ? got[c][first_diff] : -1, want[c][first_diff]);
        n_exact += first_diff < 0;
        free(want[c]), free(got[c]);
    }
    print_message("  %d of %d greedy sequences reproduced exactly\n", n_exact, n_cases);
    assert_int_equal(n_exact, n_cases);
}

/* Logits of case 0's first 64 positions, fed as one prompt, against llama2.c's float32. */
static void test_logits(void **state)
{
    fixture *f = *state;
    if (!f->e || !f->vectors) skip();
    char path[1200];
    snprintf(path, sizeof path, "%s/vectors/stories260K-logits-p0-64x512.f32", f->dir);
    size_t size;
    float *want = (float *)read_file(path, &size);
    if (!want) {
        print_message("skipping: %s not found\n", path);
        skip();
    }
    const int V = f->m->hp.n_vocab;
    assert_int_equal(V, 512);
    assert_int_equal(size, (size_t)N_LOGIT_POS * V * sizeof(float));
    int n;
    int32_t *tokens = int_array(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(f->vectors, "cases"), 0),
                                                    "sequence_tokens"), &n);
    assert_true(n >= N_LOGIT_POS);
    float *got = malloc((size_t)N_LOGIT_POS * V * sizeof *got);
    engine_slot_clear(f->e, 0);
    engine_seq s = {.slot = 0, .tokens = tokens, .n_tokens = N_LOGIT_POS, .pos = 0, .logits = got, .logits_all = true};
    char err[256];
    assert_int_equal(engine_step(f->e, &s, 1, NULL, err, sizeof err), 0);
    double worst = 0.0;
    int top1_agree = 0;
    for (int p = 0; p < N_LOGIT_POS; p++) {
        const float *g = got + (size_t)p * V, *w = want + (size_t)p * V;
        double max_diff = 0.0, max_ref = 1e-30;
        int g_best = 0, w_best = 0;
        for (int i = 0; i < V; i++) {
            max_diff = fmax(max_diff, fabs((double)g[i] - w[i]));
            max_ref = fmax(max_ref, fabs((double)w[i]));
            if (g[i] > g[g_best]) g_best = i;
            if (w[i] > w[w_best]) w_best = i;
        }
        worst = fmax(worst, max_diff / max_ref);
        top1_agree += g_best == w_best;
    }
    print_message("  logits at positions 0..63: max rel error %.2e, top-1 agreement %d/%d\n", worst,
                  top1_agree, N_LOGIT_POS);
    assert_true(worst < 1e-4);
    assert_int_equal(top1_agree, N_LOGIT_POS);
    free(got), free(want), free(tokens);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_sequences),
        cmocka_unit_test(test_logits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
