/* gpu_test_util.h - shared helpers of the GPU tests: skip cleanly without a device, random
 * inputs, relative errors. */
#ifndef INFERD_TEST_GPU_UTIL_H
#define INFERD_TEST_GPU_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "gpu/gpu.h"

/* What a test program returns when it did not run: meson's "skipped" (its summary then counts
 * it as SKIP, not OK). */
#define GPU_TEST_SKIPPED 77

/* true when a CUDA device is usable; otherwise prints why the GPU tests are skipped. The test
 * programs ask once, in main, and return GPU_TEST_SKIPPED without one. */
static inline bool gpu_test_have_device(void)
{
    if (engine_cuda_available()) return true;
    fprintf(stderr, "SKIP: no CUDA device (engine_cuda_available() is false): GPU tests not run\n");
    return false;
}

/* Shards of one test program may share a GPU (scripts/gpu-check runs them side by side to save
 * device time): an engine whose KV pool is sized automatically takes the free memory, and the
 * next process's engine then finds none.  INFERD_TEST_KV_MB caps those pools (a config that sizes
 * its own pool keeps it); unset, every engine opens as the tests wrote it.  A macro, so that
 * det_check.h's engines (included after this header) are capped too. */
static inline engine *gpu_test_engine_open(engine_device dev, const model *m, const engine_config *cfg, char *err,
                                           size_t errlen)
{
    static long cap = -1;
    if (cap < 0) {
        const char *s = getenv("INFERD_TEST_KV_MB");
        cap = s ? atol(s) : 0;
    }
    engine_config c = *cfg;
    if (cap > 0 && !c.kv_cache_mb && !c.kv_per_row) c.kv_cache_mb = (size_t)cap;
    return engine_open(dev, m, &c, err, errlen);
}
#define engine_open gpu_test_engine_open

static inline uint64_t gpu_test_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static inline float gpu_test_randf(uint64_t *s) { return (float)((gpu_test_rng(s) >> 40) * 0x1.0p-23 - 1.0); }

/* ||a - b|| / ||b|| over n floats; +inf when b is all zeros (a test must never compare zeros). */
static inline double gpu_test_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (isnan(a[i])) return INFINITY;
    }
    return den > 0.0 ? sqrt(num / den) : INFINITY;
}

#endif
