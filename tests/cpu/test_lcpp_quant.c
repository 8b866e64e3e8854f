/* test_lcpp_quant.c - files written by llama.cpp's own llama-quantize, one per weight type
 * (and its usual mixes), run on the CPU engine against llama.cpp's own CPU logits on the same
 * token ids (issue 28).
 *
 * The directory (tests/cpu/lcpp_quant, or $INFERD_LCPP_QUANT_DIR: scripts/lcpp-quant-compare
 * makes a bigger set and points this test at it) holds manifest.json:
 *   "jobs":  [[n_prompt, n_force, id...], ...]  lcpp_ref's prompts (../shared/reference/lcpp_ref.c):
 *            the prompt in one step, every position's logits, then the n_force ids one step each;
 *   "files": [{"gguf", "lcpp", "lcpp_f32", "bound"}, ...]: a llama-quantize file, lcpp_ref's
 *            logits on it, and lcpp_ref's logits on the same file dequantised to F32 by
 *            llama-quantize (--allow-requantize ... F32), float32 rows of n_vocab.
 * Two comparisons per file, "rel" being a row's max |diff| over its max |reference|, worst row:
 *   - against llama.cpp on the quantised file: the figure (its target 1e-3 is out of
 *     reach: llama.cpp's CPU products round the activations to 8 bits, Q8_0 / Q8_1 / Q8_K,
 *     before the integer dot products, which moves its logits 1-5e-2 from its own F32 run on
 *     the same weights; we multiply the exact weights by F32 activations).  The manifest bound
 *     (1e-1) only catches a gross error;
 *   - against llama.cpp on the dequantised F32 file: the same weights with no activation
 *     rounding on either side, so only the summation order differs: F32 agreement (5e-5, as
 *     test_arch_reference's bound), which shows our decode of every block is llama.cpp's.
 * The table is printed; each file's first figure must be within its manifest bound and the
 * second within 5e-5, and the argmax of every row must match the F32 run's where its top-1
 * margin exceeds twice our error there.  Skips when the directory has no manifest. */
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

#define F32_BOUND 5e-5
#define MAX_FILE_BYTES ((size_t)256 << 20)

typedef struct lcpp_job {
    int32_t *ids;
    int n_prompt, n_force;
} lcpp_job;

typedef struct fixture {
    char dir[1024];
    cJSON *manifest;
    lcpp_job *jobs;
    int n_jobs, rows; /* rows: all jobs' (n_prompt + n_force) */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    const char *env = getenv("INFERD_LCPP_QUANT_DIR"), *src = getenv("INFERD_SOURCE_DIR");
    if (env && *env) snprintf(f->dir, sizeof f->dir, "%s", env);
    else snprintf(f->dir, sizeof f->dir, "%s/tests/cpu/lcpp_quant", src && *src ? src : ".");
    char path[1200], err[256];
    snprintf(path, sizeof path, "%s/manifest.json", f->dir);
    char *json = file_read_all(path, (size_t)1 << 20, NULL, err, sizeof err);
    if (!json) {
        print_message("skipping: %s (scripts/lcpp-quant-compare writes one)\n", err);
        return 0;
    }
    f->manifest = cJSON_Parse(json);
    free(json);
    if (!f->manifest) fail_msg("%s: not JSON", path);
    const cJSON *jobs = cJSON_GetObjectItem(f->manifest, "jobs");
    f->n_jobs = cJSON_GetArraySize(jobs);
    assert_true(f->n_jobs > 0);
    f->jobs = calloc((size_t)f->n_jobs, sizeof *f->jobs);
    for (int j = 0; j < f->n_jobs; j++) {
        const cJSON *a = cJSON_GetArrayItem(jobs, j);
        lcpp_job *jb = &f->jobs[j];
        jb->n_prompt = cJSON_GetArrayItem(a, 0)->valueint;
        jb->n_force = cJSON_GetArrayItem(a, 1)->valueint;
        assert_true(jb->n_prompt > 0 && jb->n_force >= 0);
        assert_int_equal(cJSON_GetArraySize(a), 2 + jb->n_prompt + jb->n_force);
        jb->ids = malloc((size_t)(jb->n_prompt + jb->n_force) * sizeof *jb->ids);
        for (int i = 0; i < jb->n_prompt + jb->n_force; i++) jb->ids[i] = cJSON_GetArrayItem(a, 2 + i)->valueint;
        f->rows += jb->n_prompt + jb->n_force;
    }
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    for (int j = 0; j < f->n_jobs; j++) free(f->jobs[j].ids);
    free(f->jobs);
    cJSON_Delete(f->manifest);
    free(f);
    return 0;
}

/* lcpp_ref's rows for every job on model m, in its order: each prompt's positions, then one
 * row per forced token. */
static float *engine_rows(const fixture *f, const model *m)
{
    const int V = m->hp.n_vocab;
    int ctx = 16;
    for (int j = 0; j < f->n_jobs; j++)
        if (f->jobs[j].n_prompt + f->jobs[j].n_force > ctx) ctx = f->jobs[j].n_prompt + f->jobs[j].n_force;
    engine_config cfg = {.n_slots = 1, .ctx_per_slot = ctx, .max_batch_tokens = ctx, .n_threads = 2};
    char err[256];
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    float *out = malloc((size_t)f->rows * V * sizeof *out), *row = out;
    for (int j = 0; j < f->n_jobs; j++) {
        const lcpp_job *jb = &f->jobs[j];
        engine_slot_clear(e, 0);
        engine_seq s = {.slot = 0, .tokens = jb->ids, .n_tokens = jb->n_prompt, .logits = row, .logits_all = true};
        if (engine_step(e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("prefill: %s", err);
        row += (size_t)jb->n_prompt * V;
        for (int i = 0; i < jb->n_force; i++, row += V) {
            s = (engine_seq){.slot = 0, .tokens = &jb->ids[jb->n_prompt + i], .n_tokens = 1, .pos = jb->n_prompt + i,
                             .logits = row};
            if (engine_step(e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
        }
    }
    engine_free(e);
    return out;
}

/* The float32 rows of dir/name: exactly rows x V of them. */
static float *read_rows(const char *dir, const char *name, int rows, int V)
{
    char path[1400], err[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t size = 0;
    char *data = file_read_all(path, MAX_FILE_BYTES, &size, err, sizeof err);
    if (!data) fail_msg("%s", err);
    if (size != (size_t)rows * V * sizeof(float))
        fail_msg("%s: %zu bytes, expected %d rows of %d floats", path, size, rows, V);
    float *out = malloc(size);
    memcpy(out, data, size); /* little-endian hosts, as lcpp_ref wrote them */
    free(data);
    return out;
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* The top-1 minus top-2 of a row. */
static double margin(const float *v, int n)
{
    int b = argmax(v, n);
    double second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && v[i] > second) second = v[i];
    return v[b] - second;
}

typedef struct comparison {
    double rel;      /* worst row's max |got - ref| / max |ref| */
    int argmax_differs; /* rows whose argmax differs where the margin exceeds twice the error */
} comparison;

static comparison compare(const float *got, const float *ref, int rows, int V)
{
    comparison c = {0.0, 0};
    for (int r = 0; r < rows; r++) {
        const float *g = got + (size_t)r * V, *x = ref + (size_t)r * V;
        double d = 0.0, scale = 1e-30;
        for (int i = 0; i < V; i++) {
            d = fmax(d, fabs((double)g[i] - x[i]));
            scale = fmax(scale, fabs((double)x[i]));
        }
        c.rel = fmax(c.rel, d / scale);
        if (argmax(g, V) != argmax(x, V) && margin(x, V) > 2 * d) c.argmax_differs++;
    }
    return c;
}

/* The weight types of m's matrices, e.g. "q4_K x7, q6_K x2" (at most 4 kinds named). */
static void describe_types(const model *m, char *out, size_t len)
{
    int count[64] = {0};
    for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        if (t->n_dims >= 2 && (unsigned)t->type < 64) count[t->type]++;
    }
    size_t n = 0;
    out[0] = '\0';
    for (int t = 0, named = 0; t < 64 && named < 4; t++)
        if (count[t]) {
            n += (size_t)snprintf(out + n, n < len ? len - n : 0, "%s%s x%d", named++ ? ", " : "",
                                  ggml_type_name((ggml_type)t), count[t]);
            if (n >= len) break;
        }
}

static void test_llama_quantize_files(void **state)
{
    fixture *f = *state;
    if (!f->manifest) skip();
    const cJSON *files = cJSON_GetObjectItem(f->manifest, "files");
    assert_true(cJSON_GetArraySize(files) > 0);
    int failed = 0;
    print_message("  %-22s %-34s %10s %10s\n", "file", "matrices", "vs lcpp", "vs lcpp F32");
    for (int i = 0; i < cJSON_GetArraySize(files); i++) {
        const cJSON *c = cJSON_GetArrayItem(files, i);
        const char *gguf = cJSON_GetStringValue(cJSON_GetObjectItem(c, "gguf"));
        const char *lcpp = cJSON_GetStringValue(cJSON_GetObjectItem(c, "lcpp"));
        const char *lcpp_f32 = cJSON_GetStringValue(cJSON_GetObjectItem(c, "lcpp_f32"));
        const double bound = cJSON_GetNumberValue(cJSON_GetObjectItem(c, "bound"));
        assert_non_null(gguf), assert_non_null(lcpp), assert_non_null(lcpp_f32);
        char path[1400], err[256], types[160];
        snprintf(path, sizeof path, "%s/%s", f->dir, gguf);
        model *m = model_load(path, err, sizeof err);
        if (!m) fail_msg("%s: %s", gguf, err); /* a llama-quantize file must load */
        describe_types(m, types, sizeof types);
        const int V = m->hp.n_vocab;
        float *got = engine_rows(f, m);
        float *ref = read_rows(f->dir, lcpp, f->rows, V), *ref32 = read_rows(f->dir, lcpp_f32, f->rows, V);
        comparison q = compare(got, ref, f->rows, V), d = compare(got, ref32, f->rows, V);
        bool ok = q.rel <= bound && d.rel <= F32_BOUND && d.argmax_differs == 0;
        print_message("  %-22s %-34s %10.2e %10.2e%s\n", gguf, types, q.rel, d.rel, ok ? "" : "  FAIL");
        if (d.argmax_differs) print_message("    %d rows pick another top-1 than llama.cpp's F32 run\n", d.argmax_differs);
        failed += !ok;
        free(got), free(ref), free(ref32);
        model_free(m);
    }
    if (failed) fail_msg("%d files outside their bounds", failed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_llama_quantize_files, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
