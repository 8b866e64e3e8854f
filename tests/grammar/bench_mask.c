/* bench_mask.c - mask time per token under a 10-property nested schema on real vocabularies
 * (a benchmark, not a test: `build/tests/grammar/bench_mask [vocab names...]`).
 *
 * Random walks pick uniformly among the allowed tokens, as a random-weight model would.  The
 * first walk meets every state cold (per-position tables and the state cache are built then);
 * later walks show the steady state of a server that keeps seeing one schema. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "grammar/grammar.h"
#include "model/gguf.h"
#include "text/tokenizer.h"

static const char SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"email\":{\"type\":\"string\",\"format\":\"email\"},"
    "\"active\":{\"type\":\"boolean\"},"
    "\"score\":{\"type\":\"number\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":5},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"[0-9]{5}\"}},\"required\":[\"street\",\"city\"]},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"created\":{\"type\":\"string\",\"format\":\"date-time\"}},"
    "\"required\":[\"id\",\"name\",\"age\",\"active\",\"address\",\"role\"]}";

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *t, int n)
{
    if (!n) return;
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    printf("  %-26s n=%6d  p50 %8.1f us  p99 %8.1f us  max %9.1f us\n", what, n, t[n / 2], t[(int)(n * 0.99)], t[n - 1]);
}

static int bench(const char *name, int walks)
{
    char path[1024], err[256];
    const char *d = getenv("INFERD_SHARED_DIR");
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", d && *d ? d : INFERD_SHARED_DIR, name);
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) {
        printf("%s: skipped (%s)\n", name, err);
        return 0;
    }
    tokenizer *t = tokenizer_load(f, err, sizeof err);
    double t0 = now_us();
    grammar_vocab *v = grammar_vocab_new(t);
    double t_vocab = now_us() - t0;
    cJSON *schema = cJSON_Parse(SCHEMA);
    t0 = now_us();
    grammar *g = grammar_from_json_schema(schema, err, sizeof err);
    double t_compile = now_us() - t0;
    if (!g) {
        printf("%s: %s\n", name, err);
        return 1;
    }
    int n_vocab = tokenizer_n_vocab(t), W = grammar_vocab_n_words(v);
    uint32_t *mask = malloc((size_t)W * 4);
    int32_t *allowed = malloc((size_t)n_vocab * 4);
    int cap = walks * 400;
    double *cold = malloc((size_t)cap * sizeof *cold), *warm = malloc((size_t)cap * sizeof *warm),
           *acc = malloc((size_t)cap * sizeof *acc);
    int n_cold = 0, n_warm = 0, n_acc = 0, done = 0;
    uint64_t seed = 7;
    for (int w = 0; w < walks; w++) {
        grammar_matcher *m = grammar_matcher_new(g, v);
        for (int step = 0; step < 400 && !grammar_matcher_is_done(m); step++) {
            double a = now_us();
            int n = grammar_matcher_fill_mask(m, mask);
            double b = now_us();
            if (w == 0) cold[n_cold++] = b - a;
            else warm[n_warm++] = b - a;
            if (!n) break;
            int k = 0;
            for (int i = 0; i < W; i++)
                for (uint32_t bits = mask[i]; bits; bits &= bits - 1) allowed[k++] = i * 32 + __builtin_ctz(bits);
            seed = rng_splitmix64(seed);
            int32_t id = allowed[seed % (uint64_t)k];
            a = now_us();
            grammar_matcher_accept(m, id);
            acc[n_acc++] = now_us() - a;
        }
        done += grammar_matcher_is_complete(m);
        grammar_matcher_free(m);
    }
    printf("%s (%d tokens): vocabulary %.1f ms, schema compile %.2f ms, %d/%d walks complete\n", name, n_vocab,
           t_vocab / 1e3, t_compile / 1e3, done, walks);
    report("mask, first walk (cold)", cold, n_cold);
    report("mask, later walks (warm)", warm, n_warm);
    report("accept token", acc, n_acc);
    free(cold), free(warm), free(acc), free(mask), free(allowed);
    grammar_unref(g);
    cJSON_Delete(schema);
    grammar_vocab_free(v);
    tokenizer_free(t);
    gguf_close(f);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dflt[] = {"qwen2", "llama-bpe"};
    int rc = 0;
    int walks = getenv("BENCH_WALKS") ? atoi(getenv("BENCH_WALKS")) : 20;
    if (argc > 1)
        for (int i = 1; i < argc; i++) rc |= bench(argv[i], walks);
    else
        for (int i = 0; i < 2; i++) rc |= bench(dflt[i], walks);
    return rc;
}
