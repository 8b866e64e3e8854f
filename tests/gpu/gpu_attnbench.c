/* gpu_attnbench.c - one layer of prompt attention for a cold prompt of T tokens (one sequence,
 * keys 0..t for token t): the tensor-core kernel (flash_attn) against the split-K kernels
 * (attn_partial + attn_combine) that took prompts before it, timed, with the largest
 * difference between their FP16 outputs as a cross-check.
 * Usage: gpu_attnbench [tokens [n_head [n_kv [head_dim]]]]   (default 8192 32 8 128: the
 * Llama-3.1-8B shape; exit 77 without a device)
 *        gpu_attnbench decode [n_head [n_kv [head_dim]]]   decode attention (128 or 256): see decode.c's
 * part below (attnbench_decode). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda_api.h"
#include "gpu/gpu_kernels.h"
#include "gpu/gpu_shared.h"
#include "gpu_test_util.h"
#include "model/quant.h"

typedef struct bench {
    int T, n_head, n_kv, hd;
    gpu_kernels k;
    CUstream stream;
    CUdeviceptr q, kc, vc, seq, pos, tables, tiles, part_o, part_ml, out_fa, out_sk;
    int n_tiles, n_split;
} bench;

static uint64_t rng_state = 1;
static float randf(void) { return gpu_test_randf(&rng_state); } /* uniform in [-1, 1) */

static int upload(CUdeviceptr *d, const void *h, size_t bytes, char *err, size_t errlen)
{
    CU_CHECK(cu.cuMemAlloc(d, bytes), "attnbench: allocating");
    CU_CHECK(cu.cuMemcpyHtoD(*d, h, bytes), "attnbench: uploading");
    /* landed before the bench's non-blocking stream reads it (cuMemcpyHtoD from pageable
     * memory returns with the DMA in flight on the legacy stream) */
    CU_CHECK(cu.cuCtxSynchronize(), "attnbench: uploading");
    return 0;
}

/* Random q and caches (one layer, blocks in order), the flash tiles as pack_step cuts them. */
static int setup(bench *b, char *err, size_t errlen)
{
    const int T = b->T, nb = (T + GPU_KV_BLOCK - 1) / GPU_KV_BLOCK;
    const size_t nq = (size_t)T * b->n_head * b->hd, nc = (size_t)nb * b->n_kv * GPU_KV_BLOCK * b->hd;
    const int qt = gpu_flash_q_tokens(b->n_head, b->n_kv, b->hd);
    if (qt == 0) {
        snprintf(err, errlen, "attnbench: no flash kernel for %d heads, %d kv heads, head_dim %d", b->n_head, b->n_kv,
                 b->hd);
        return -1;
    }
    float *q = malloc(nq * sizeof *q);
    uint16_t *kv = malloc(nc * sizeof *kv);
    int32_t *ints = malloc((size_t)(T > nb ? T : nb) * 2 * sizeof *ints);
    if (!q || !kv || !ints) {
        snprintf(err, errlen, "attnbench: out of host memory");
        free(q), free(kv), free(ints);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < nq; i++) q[i] = randf();
    rc = rc || upload(&b->q, q, nq * sizeof *q, err, errlen);
    for (int which = 0; which < 2 && !rc; which++) {
        for (size_t i = 0; i < nc; i++) kv[i] = quant_f32_to_f16(which ? randf() : 2.0f * randf());
        rc = upload(which ? &b->vc : &b->kc, kv, nc * sizeof *kv, err, errlen);
        if (b->hd == GPU_MLA_FLASH_ROW) { /* latent rows: one cache, its rows the keys and values */
            b->vc = b->kc;
            break;
        }
    }
    for (int t = 0; t < T; t++) ints[t] = 0;
    rc = rc || upload(&b->seq, ints, (size_t)T * sizeof *ints, err, errlen);
    for (int t = 0; t < T; t++) ints[t] = t;
    rc = rc || upload(&b->pos, ints, (size_t)T * sizeof *ints, err, errlen);
    rc = rc || upload(&b->tables, ints, (size_t)nb * sizeof *ints, err, errlen); /* block i is block i */
    b->n_tiles = 0;
    for (int t = 0; t < T; t += qt, b->n_tiles++) {
        ints[2 * b->n_tiles] = t;
        ints[2 * b->n_tiles + 1] = T - t < qt ? T - t : qt;
    }
    rc = rc || upload(&b->tiles, ints, (size_t)b->n_tiles * 2 * sizeof *ints, err, errlen);
    b->n_split = 1;
    for (int n = 1; n <= T; n++)
        if (gpu_attn_splits(n) > b->n_split) b->n_split = gpu_attn_splits(n);
    size_t parts = (size_t)T * b->n_head * b->n_split;
    if (!rc) CU_CHECK(cu.cuMemAlloc(&b->part_o, parts * b->hd * sizeof(float)), "attnbench: allocating partials");
    if (!rc) CU_CHECK(cu.cuMemAlloc(&b->part_ml, parts * 2 * sizeof(float)), "attnbench: allocating partials");
    if (!rc) CU_CHECK(cu.cuMemAlloc(&b->out_fa, nq * 2), "attnbench: allocating outputs");
    if (!rc) CU_CHECK(cu.cuMemAlloc(&b->out_sk, nq * 2), "attnbench: allocating outputs");
    free(q), free(kv), free(ints);
    return rc ? -1 : 0;
}

static int run_flash(bench *b, char *err, size_t errlen)
{
    flash_args a = {.q = (const float *)(uintptr_t)b->q, .kc = (const gpu_half *)(uintptr_t)b->kc,
                    .vc = (const gpu_half *)(uintptr_t)b->vc, .seq = (const int32_t *)(uintptr_t)b->seq,
                    .pos = (const int32_t *)(uintptr_t)b->pos, .tables = (const int32_t *)(uintptr_t)b->tables,
                    .tiles = (const int32_t *)(uintptr_t)b->tiles, .out = (gpu_half *)(uintptr_t)b->out_fa,
                    .n_layer = 1, .layer = 0, .n_head = b->n_head, .n_kv = b->n_kv,
                    .table_width = (b->T + GPU_KV_BLOCK - 1) / GPU_KV_BLOCK,
                    .scale = (float)(M_LOG2E / sqrt((double)b->hd))};
    return gpu_launch_flash(&b->k, &a, b->hd, (unsigned)b->n_tiles, b->stream, "attnbench", err, errlen);
}

static int run_split_k(bench *b, char *err, size_t errlen)
{
    int group = b->n_head / b->n_kv, gb = b->hd > 256 ? GPU_ATT_GB_HD512 : 8; /* as gpu_forward.c's */
    while (group % gb) gb--;
    attn_args a = {.q = (const float *)(uintptr_t)b->q, .kc = (const gpu_half *)(uintptr_t)b->kc,
                   .vc = (const gpu_half *)(uintptr_t)b->vc, .seq = (const int32_t *)(uintptr_t)b->seq,
                   .pos = (const int32_t *)(uintptr_t)b->pos, .tables = (const int32_t *)(uintptr_t)b->tables,
                   .n_layer = 1, .layer = 0, .n_head = b->n_head, .n_kv = b->n_kv,
                   .table_width = (b->T + GPU_KV_BLOCK - 1) / GPU_KV_BLOCK, .hd = b->hd, .gb = gb,
                   .n_split = b->n_split, .scale = 1.0f / sqrtf((float)b->hd),
                   .part_o = (float *)(uintptr_t)b->part_o, .part_ml = (float *)(uintptr_t)b->part_ml};
    void *args[] = {&a};
    if (gpu_launch(gpu_attn_partial_fn(&b->k, b->hd), (gpu_launch_dims){(unsigned)b->T, (unsigned)(b->n_head / gb), (unsigned)b->n_split, 128},
                   b->stream, args, "attnbench", err, errlen))
        return -1;
    int nh = b->n_head, ns = b->n_split, hd = b->hd;
    CUdeviceptr list = 0;
    void *cargs[] = {&b->part_o, &b->part_ml, &b->out_sk, &nh, &ns, &hd, &list, &list}; /* no sinks */
    return gpu_launch(&b->k.attn_combine, (gpu_launch_dims){(unsigned)b->T, (unsigned)nh, 1, hd >= 128 ? 128 : 32},
                      b->stream, cargs, "attnbench", err, errlen);
}

/* Milliseconds per run of fn: the mean of 10 after 2 warm-ups. */
static int time_ms(bench *b, int (*fn)(bench *, char *, size_t), double *ms, char *err, size_t errlen)
{
    CUevent e0, e1;
    CU_CHECK(cu.cuEventCreate(&e0, CU_EVENT_DEFAULT), "attnbench: events");
    CU_CHECK(cu.cuEventCreate(&e1, CU_EVENT_DEFAULT), "attnbench: events");
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) rc = fn(b, err, errlen);
    if (!rc) CU_CHECK(cu.cuEventRecord(e0, b->stream), "attnbench: events");
    for (int i = 0; i < 10 && !rc; i++) rc = fn(b, err, errlen);
    if (!rc) CU_CHECK(cu.cuEventRecord(e1, b->stream), "attnbench: events");
    if (!rc) CU_CHECK(cu.cuEventSynchronize(e1), "attnbench: running the kernels");
    float f = 0.0f;
    if (!rc) CU_CHECK(cu.cuEventElapsedTime(&f, e0, e1), "attnbench: events");
    *ms = f / 10.0;
    cu.cuEventDestroy(e0);
    cu.cuEventDestroy(e1);
    return rc;
}

int attnbench_decode(gpu_kernels *k, CUstream stream, int n_head, int n_kv, int hd, char *err, size_t errlen);

int main(int argc, char **argv)
{
    char err[512];
    if (argc > 1 && !strcmp(argv[1], "decode")) {
        gpu_kernels k;
        CUdevice dev;
        CUcontext ctx;
        CUstream stream;
        if (!cuda_api_load(err, sizeof err) || cu.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
            cu.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
            cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
            fprintf(stderr, "gpu_attnbench: no usable CUDA device\n");
            return 77;
        }
        if (gpu_kernels_load(&k, err, sizeof err) ||
            attnbench_decode(&k, stream, argc > 2 ? atoi(argv[2]) : 32, argc > 3 ? atoi(argv[3]) : 8,
                             argc > 4 ? atoi(argv[4]) : 128, err, sizeof err)) {
            fprintf(stderr, "gpu_attnbench: %s\n", err);
            return 1;
        }
        return 0;
    }
    bench b = {.T = argc > 1 ? atoi(argv[1]) : 8192, .n_head = argc > 2 ? atoi(argv[2]) : 32,
               .n_kv = argc > 3 ? atoi(argv[3]) : 8, .hd = argc > 4 ? atoi(argv[4]) : 128};
    if (b.T < 1 || b.n_kv < 1 || b.n_head < b.n_kv) {
        fprintf(stderr, "usage: gpu_attnbench [tokens [n_head [n_kv [head_dim]]]]\n");
        return 2;
    }
    if (!cuda_api_load(err, sizeof err)) {
        fprintf(stderr, "gpu_attnbench: %s\n", err);
        return 77;
    }
    CUdevice dev;
    CUcontext ctx;
    double ms_fa = 0.0, ms_sk = 0.0;
    if (cu.cuDeviceGet(&dev, 0) != CUDA_SUCCESS || cu.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cu.cuStreamCreate(&b.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        fprintf(stderr, "gpu_attnbench: no usable CUDA device\n");
        return 77;
    }
    if (gpu_kernels_load(&b.k, err, sizeof err) || setup(&b, err, sizeof err) ||
        time_ms(&b, run_flash, &ms_fa, err, sizeof err) || time_ms(&b, run_split_k, &ms_sk, err, sizeof err)) {
        fprintf(stderr, "gpu_attnbench: %s\n", err);
        return 1;
    }
    size_t nq = (size_t)b.T * b.n_head * b.hd;
    uint16_t *fa = malloc(nq * 2), *sk = malloc(nq * 2);
    if (!fa || !sk || cu.cuMemcpyDtoH(fa, b.out_fa, nq * 2) != CUDA_SUCCESS ||
        cu.cuMemcpyDtoH(sk, b.out_sk, nq * 2) != CUDA_SUCCESS) {
        fprintf(stderr, "gpu_attnbench: reading the outputs back failed\n");
        return 1;
    }
    double num = 0.0, den = 0.0;
    /* latent rows: flash_attn_mla writes the value columns alone */
    const size_t hdv = b.hd == GPU_MLA_FLASH_ROW ? GPU_MLA_FLASH_V : (size_t)b.hd;
    for (size_t i = 0; i < nq; i++) {
        if (i % b.hd >= hdv) continue;
        double x = quant_f16_to_f32(fa[i]), y = quant_f16_to_f32(sk[i]);
        num += (x - y) * (x - y);
        den += y * y;
    }
    /* QK^T and PV over the causal triangle: 2 (hd + hdv) flops per (query head, key) pair */
    double flops = 2.0 * (double)(b.hd + hdv) * b.n_head * ((double)b.T * (b.T + 1) / 2.0);
    printf("%d tokens, %d heads / %d kv heads, head_dim %d: flash_attn %.3f ms (%.0f TFLOP/s), "
           "split-K %.3f ms (%d splits); flash vs split-K rel diff %.2e\n",
           b.T, b.n_head, b.n_kv, b.hd, ms_fa, flops / (ms_fa * 1e-3) / 1e12, ms_sk, b.n_split,
           den > 0.0 ? sqrt(num / den) : INFINITY);
    free(fa), free(sk);
    return 0;
}
