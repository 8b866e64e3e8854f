/* delta_util.h - what the gated delta rule's tests share (test_delta.c, test_deltanet_port.c,
 * tests/gpu/test_gpu_kernels.c): a seeded uniform generator and the relative difference they
 * bound. */
#ifndef INFERD_TEST_DELTA_UTIL_H
#define INFERD_TEST_DELTA_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* [0, 1) */
static inline float delta_uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(*s >> 40) / (float)(1u << 24);
}

/* max |a - b| over n floats / max |b|; +inf where a holds a NaN (an unwritten output) */
static inline double delta_rel_diff(const float *a, const float *b, size_t n)
{
    double diff = 0, big = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        big = fmax(big, fabs((double)b[i]));
    }
    return diff / big;
}

#endif
