/* f64_ref.h - the pieces of a test that writes a random-weight model as a GGUF and checks an
 * engine against a plain float64 forward pass over the very weights written (test_arch_recipe,
 * test_nomic_bert): the seeded weights, kept for the reference, and a float64 product. */
#ifndef INFERD_TEST_F64_REF_H
#define INFERD_TEST_F64_REF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "synth/gguf_write.h"

/* The tensors being written: to w, all but the one named `omit` (a loader error test); every
 * array kept in all[] for the reference, values from the splitmix64 stream rng. */
typedef struct ref_tensors {
    gguf_writer *w;
    const char *omit;
    uint64_t rng;
    float *all[64];
    int n_all;
} ref_tensors;

static inline float ref_next_float(uint64_t *s) /* uniform in [-1, 1) */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (float)((double)((z ^ (z >> 31)) >> 11) * 0x1.0p-52 - 1.0);
}

/* A tensor of rows x cols (cols contiguous: GGUF's ne0) as F32, center + spread * U(-1, 1);
 * NULL when out of memory or out of room in all[]. */
static inline float *ref_add(ref_tensors *t, const char *name, int cols, int rows, float center, float spread)
{
    float *v = t->n_all < 64 ? malloc((size_t)cols * rows * sizeof *v) : NULL;
    if (!v) return NULL;
    for (int i = 0; i < cols * rows; i++) v[i] = center + spread * ref_next_float(&t->rng);
    t->all[t->n_all++] = v;
    if (t->omit && strcmp(name, t->omit) == 0) return v;
    int64_t ne[2] = {cols, rows};
    gguf_writer_add_tensor(t->w, name, GGML_TYPE_F32, rows > 1 ? 2 : 1, ne, v, (size_t)cols * rows * sizeof *v, false);
    return v;
}

static inline void ref_free(ref_tensors *t)
{
    for (int i = 0; i < t->n_all; i++) free(t->all[i]);
    t->n_all = 0;
}

/* y[rows] = W x over float weights [rows][cols], in double. */
static inline void ref_matvec(const float *w, const double *x, double *y, int cols, int rows)
{
    for (int r = 0; r < rows; r++) {
        double acc = 0.0;
        for (int i = 0; i < cols; i++) acc += (double)w[(size_t)r * cols + i] * x[i];
        y[r] = acc;
    }
}

#endif
