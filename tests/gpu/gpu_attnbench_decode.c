/* gpu_attnbench_decode.c - `gpu_attnbench decode [n_head [n_kv [head_dim]]]`: one layer of
 * decode attention (head_dim 128 or 256) for B = 1 and 8 queries each seeing all of a context of
 * 128 to 32,768 keys, its own sequence's blocks: the split-K kernels (attn_partial + attn_combine,
 * the old path) against attn_decode with the engine's split rule (gpu_attn_dec_split_for from the
 * device's SM count; at head_dim 256 the fused merge and gpu_attn_dec_batch_split by B, "det":
 * the batch split of --deterministic; below 256 attn_decode_combine) and in other warp and ring
 * shapes (with the rule over the blocks a multiprocessor holds of them); "early": launched with
 * PDL and attn_args.old_kv (at any B here; the engine so launches its one-wave grids: B=1), so
 * that its first tiles load under the end of the kernel ahead (here the last pass's combine, or
 * at head_dim 256 its attn_decode).  Each is timed over a
 * CUDA graph of 30 launches that walk over enough layers (>= 256 MB of K/V) that the L2 cache
 * holds none of them from the last pass; the table gives us per layer, the effective K/V read
 * rate (bytes of K and V of the layer / time) and the largest difference from the old kernel's
 * FP16 output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda_api.h"
#include "gpu/gpu_kernels.h"
#include "gpu/gpu_shared.h"
#include "gpu_test_util.h"
#include "model/quant.h"

int attnbench_decode(gpu_kernels *k, CUstream stream, int n_head, int n_kv, int hd, char *err, size_t errlen);

typedef struct dec_variant {
    const char *label, *name; /* column, kernel */
    int warps, stages;
    bool det;   /* the batch split of --deterministic */
    bool early; /* PDL and old_kv (gpu_launch_decode's launch of a one-wave grid) */
    CUfunction f;
} dec_variant;

typedef struct dec_bench {
    gpu_kernels *k;
    CUstream stream;
    int B, ctx, n_head, n_kv, n_layer, tw, hd, n_sm;
    attn_args a;
    CUdeviceptr out, counts;
} dec_bench;

#define REPS 30

static uint64_t rng = 7;
static float rnd(void) { return gpu_test_randf(&rng); } /* uniform in [-1, 1) */

static unsigned variant_smem(const dec_variant *v, int hd)
{
    return (unsigned)(v->warps * v->stages * 2 * GPU_KV_BLOCK * hd * 2 + GPU_ATT_DEC_Q_SMEM(hd));
}

/* Blocks of v that one H100 multiprocessor holds at once: 228 KiB of shared memory, 1 KiB of it
 * reserved per block. */
static int variant_blocks_per_sm(const dec_variant *v, int hd)
{
    return (int)((228u << 10) / (variant_smem(v, hd) + 1024u));
}

/* One pass of variant v (NULL: the old kernels) over layer `layer`. */
static int dec_launch(dec_bench *b, const dec_variant *v, int layer, char *err, size_t errlen)
{
    attn_args a = b->a;
    a.layer = layer;
    void *args[] = {&a};
    const int hd = b->hd;
    if (!v) {
        a.n_split = gpu_attn_max_splits(b->ctx);
        int gb = hd > 256 ? GPU_ATT_GB_HD512 : 8, nh = b->n_head, ns = a.n_split, d = hd;
        while ((b->n_head / b->n_kv) % gb) gb--;
        a.gb = gb;
        CUdeviceptr list = 0, po = (CUdeviceptr)(uintptr_t)a.part_o, pml = (CUdeviceptr)(uintptr_t)a.part_ml;
        void *cargs[] = {&po, &pml, &b->out, &nh, &ns, &d, &list, &list}; /* no sinks */
        if (gpu_launch(gpu_attn_partial_fn(b->k, hd), (gpu_launch_dims){b->B, b->n_head / gb, ns, 128}, b->stream,
                       args, "attnbench", err, errlen))
            return -1;
        return gpu_launch(&b->k->attn_combine, (gpu_launch_dims){b->B, b->n_head, 1, hd >= 128 ? 128 : 32}, b->stream,
                          cargs, "attnbench", err, errlen);
    }
    /* the engine's rule over the blocks that fit at once (a variant of less shared memory
     * than the engine's may hold several blocks a multiprocessor) */
    const int slots = b->n_sm * variant_blocks_per_sm(v, hd);
    a.max_split = gpu_attn_dec_split_for(slots, b->n_kv, hd);
    a.batch_split = gpu_attn_dec_batch_split(slots, b->n_kv, b->B, a.max_split, v->det);
    a.n_split = gpu_attn_max_splits_for(b->ctx, a.max_split);
    a.counts = hd >= 256 ? (unsigned *)(uintptr_t)b->counts : NULL;
    a.old_kv = v->early;
    gpu_fn fn = {v->f, v->name, v->early ? &b->k->pdl : NULL}; /* (looked up by name: PDL only if early) */
    if (gpu_launch_smem(&fn, (gpu_launch_dims){b->B, b->n_kv, a.n_split, v->warps * 32}, variant_smem(v, hd), b->stream,
                        args, "attnbench", err, errlen))
        return -1;
    if (a.counts) return 0; /* the last split merged */
    return gpu_launch(&b->k->attn_decode_combine, (gpu_launch_dims){b->B, b->n_head, 1, GPU_ATT_DEC_COMBINE_SG * hd},
                      b->stream, args, "attnbench", err, errlen);
}

/* Microseconds per pass: a graph of REPS passes over successive layers, replayed 3 times
 * after one warm-up replay. */
static int dec_time(dec_bench *b, const dec_variant *v, double *us, char *err, size_t errlen)
{
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CUevent e0 = NULL, e1 = NULL;
    CU_CHECK(cu.cuStreamBeginCapture(b->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "attnbench: capture");
    int rc = 0;
    for (int i = 0; i < REPS && !rc; i++) rc = dec_launch(b, v, i % b->n_layer, err, errlen);
    CUresult r = cu.cuStreamEndCapture(b->stream, &graph);
    if (rc) return -1;
    CU_CHECK(r, "attnbench: capture");
    r = cu.cuGraphInstantiateWithFlags(&exec, graph, 0);
    cu.cuGraphDestroy(graph);
    CU_CHECK(r, "attnbench: instantiating");
    CU_CHECK(cu.cuEventCreate(&e0, CU_EVENT_DEFAULT), "attnbench: events");
    CU_CHECK(cu.cuEventCreate(&e1, CU_EVENT_DEFAULT), "attnbench: events");
    CU_CHECK(cu.cuGraphLaunch(exec, b->stream), "attnbench: replay");
    CU_CHECK(cu.cuEventRecord(e0, b->stream), "attnbench: events");
    for (int i = 0; i < 3; i++) CU_CHECK(cu.cuGraphLaunch(exec, b->stream), "attnbench: replay");
    CU_CHECK(cu.cuEventRecord(e1, b->stream), "attnbench: events");
    CU_CHECK(cu.cuEventSynchronize(e1), "attnbench: running the kernels");
    float ms = 0.0f;
    CU_CHECK(cu.cuEventElapsedTime(&ms, e0, e1), "attnbench: events");
    *us = ms * 1000.0 / (3.0 * REPS);
    cu.cuEventDestroy(e0), cu.cuEventDestroy(e1), cu.cuGraphExecDestroy(exec);
    return 0;
}

/* Largest |a - b| over n FP16 values (inf when either is not finite). */
static double max_diff(const uint16_t *x, const uint16_t *y, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a = quant_f16_to_f32(x[i]), c = quant_f16_to_f32(y[i]);
        if (!isfinite(a) || !isfinite(c)) return INFINITY;
        if (fabs(a - c) > m) m = fabs(a - c);
    }
    return m;
}

/* Device buffers for B sequences of ctx keys over n_layer layers; random K/V (a 16 MB random
 * pattern repeated), q, one token per sequence at position ctx - 1. */
static int dec_setup(dec_bench *b, char *err, size_t errlen)
{
    const int hd = b->hd;
    const size_t layer_bytes = (size_t)b->B * b->ctx * b->n_kv * hd * 2 * 2;
    b->n_layer = (int)((256u << 20) / layer_bytes) + 1;
    if (b->n_layer > 32) b->n_layer = 32;
    b->tw = (b->ctx + GPU_KV_BLOCK - 1) / GPU_KV_BLOCK;
    const size_t nb = (size_t)b->B * b->tw, cache = nb * b->n_layer * b->n_kv * GPU_KV_BLOCK * hd; /* halves */
    const size_t pat = 8u << 20, nq = (size_t)b->B * b->n_head * hd;
    uint16_t *h = malloc(pat * 2);
    float *q = malloc(nq * sizeof *q);
    int32_t *ints = malloc(nb * sizeof *ints);
    if (!h || !q || !ints) {
        free(h), free(q), free(ints);
        snprintf(err, errlen, "attnbench: out of host memory");
        return -1;
    }
    CUdeviceptr kc = 0, vc = 0, dq, seq, pos, tab, po, pml;
    int rc = 0;
    for (int which = 0; which < 2 && !rc; which++) {
        for (size_t i = 0; i < pat; i++) h[i] = quant_f32_to_f16(which ? rnd() : 2.0f * rnd());
        CUdeviceptr *d = which ? &vc : &kc;
        if (cu.cuMemAlloc(d, cache * 2) != CUDA_SUCCESS) rc = -1;
        for (size_t off = 0; off < cache && !rc; off += pat)
            if (cu.cuMemcpyHtoD(*d + off * 2, h, (cache - off < pat ? cache - off : pat) * 2) != CUDA_SUCCESS) rc = -1;
    }
    for (size_t i = 0; i < nq; i++) q[i] = rnd();
    rc = rc || cu.cuMemAlloc(&dq, nq * sizeof *q) || cu.cuMemcpyHtoD(dq, q, nq * sizeof *q);
    for (int t = 0; t < b->B; t++) ints[t] = t;
    rc = rc || cu.cuMemAlloc(&seq, b->B * 4) || cu.cuMemcpyHtoD(seq, ints, b->B * 4);
    for (size_t i = 0; i < nb; i++) ints[i] = (int32_t)i; /* sequence t's block i is block t * tw + i */
    rc = rc || cu.cuMemAlloc(&tab, nb * 4) || cu.cuMemcpyHtoD(tab, ints, nb * 4);
    for (int t = 0; t < b->B; t++) ints[t] = b->ctx - 1;
    rc = rc || cu.cuMemAlloc(&pos, b->B * 4) || cu.cuMemcpyHtoD(pos, ints, b->B * 4);
    rc = rc || cu.cuCtxSynchronize(); /* the uploads landed (their DMA is on the legacy stream) */
    const size_t parts = (size_t)b->B * b->n_head * 128;
    rc = rc || cu.cuMemAlloc(&po, parts * hd * 4) || cu.cuMemAlloc(&pml, parts * 2 * 4);
    rc = rc || cu.cuMemAlloc(&b->counts, (size_t)b->B * b->n_kv * 4) ||
         cu.cuMemsetD8Async(b->counts, 0, (size_t)b->B * b->n_kv * 4, b->stream);
    rc = rc || cu.cuMemAlloc(&b->out, nq * 2);
    free(h), free(q), free(ints);
    if (rc) {
        snprintf(err, errlen, "attnbench: allocating or uploading %zu MB of K/V failed", cache * 4 >> 20);
        return -1;
    }
    b->a = (attn_args){.q = (const float *)(uintptr_t)dq, .kc = (const gpu_half *)(uintptr_t)kc,
                       .vc = (const gpu_half *)(uintptr_t)vc, .seq = (const int32_t *)(uintptr_t)seq,
                       .pos = (const int32_t *)(uintptr_t)pos, .tables = (const int32_t *)(uintptr_t)tab,
                       .n_layer = b->n_layer, .n_head = b->n_head, .n_kv = b->n_kv, .table_width = b->tw,
                       .hd = hd, .scale = 1.0f / sqrtf((float)hd), .part_o = (float *)(uintptr_t)po,
                       .part_ml = (float *)(uintptr_t)pml, .out = (gpu_half *)(uintptr_t)b->out};
    return 0;
}

static void dec_free(dec_bench *b)
{
    const void *p[] = {b->a.q, b->a.kc, b->a.vc, b->a.seq, b->a.pos, b->a.tables, b->a.part_o, b->a.part_ml};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cu.cuMemFree((CUdeviceptr)(uintptr_t)p[i]);
    cu.cuMemFree(b->out);
    cu.cuMemFree(b->counts);
}

int attnbench_decode(gpu_kernels *k, CUstream stream, int n_head, int n_kv, int hd, char *err, size_t errlen)
{
    static dec_variant v128[] = {
        {"engine", "attn_decode_hd128", GPU_ATT_DEC_WARPS, GPU_ATT_DEC_STAGES, false, false, NULL},
        {"engine, early", "attn_decode_hd128", GPU_ATT_DEC_WARPS, GPU_ATT_DEC_STAGES, false, true, NULL},
        {"whole ring", "attn_decode_hd128_w4s2_f", 4, 2, false, false, NULL},
        {"ring, early", "attn_decode_hd128_w4s2_f", 4, 2, false, true, NULL},
        {"w4s3, early", "attn_decode_hd128_w4s3", 4, 3, false, true, NULL},
        {"w8s1, early", "attn_decode_hd128_w8s1", 8, 1, false, true, NULL},
    };
    static dec_variant v256[] = {
        {"engine", "attn_decode_hd256", gpu_attn_dec_warps(256), gpu_attn_dec_stages(256), false, false, NULL},
        {"engine, det", "attn_decode_hd256", gpu_attn_dec_warps(256), gpu_attn_dec_stages(256), true, false, NULL},
        {"engine, early", "attn_decode_hd256", gpu_attn_dec_warps(256), gpu_attn_dec_stages(256), false, true, NULL},
        {"w2s2", "attn_decode_hd256_w2s2", 2, 2, false, false, NULL},
        {"w3s2", "attn_decode_hd256_w3s2", 3, 2, false, false, NULL},
    };
    dec_variant *vs = hd == 256 ? v256 : v128;
    const int nv = hd == 256 ? (int)(sizeof v256 / sizeof v256[0]) : (int)(sizeof v128 / sizeof v128[0]);
    err[0] = '\0';
    if ((hd != 128 && hd != 256) || n_kv < 1 || n_head % n_kv || !gpu_attn_decode_serves(n_head, n_kv, hd)) {
        snprintf(err, errlen, "attnbench: no decode kernel for %d heads over %d kv heads at head_dim %d", n_head, n_kv,
                 hd);
        return -1;
    }
    CUdevice dev;
    int n_sm = 0;
    CU_CHECK(cu.cuDeviceGet(&dev, 0), "attnbench: device"); /* main's context is on device 0 */
    CU_CHECK(cu.cuDeviceGetAttribute(&n_sm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "attnbench: SM count");
    for (int i = 0; i < nv; i++) {
        CU_CHECK(cu.cuModuleGetFunction(&vs[i].f, k->module, vs[i].name), vs[i].name);
        CU_CHECK(cu.cuFuncSetAttribute(vs[i].f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       (int)variant_smem(&vs[i], hd)),
                 vs[i].name);
    }
    printf("decode attention, %d heads / %d kv heads, head_dim %d, %d SMs (max_split %d): "
           "us per layer (K/V GB/s), max |diff| vs old\n",
           n_head, n_kv, hd, n_sm, gpu_attn_dec_split_for(n_sm, n_kv, hd));
    printf("%-3s %6s %18s", "B", "ctx", "old (partial)");
    for (int i = 0; i < nv; i++)
        printf(" | %-15s w%ds%d x%d %3s", vs[i].label, vs[i].warps, vs[i].stages, variant_blocks_per_sm(&vs[i], hd), "");
    printf("\n");
    const int Bs[] = {1, 8}, ctxs[] = {128, 256, 1024, 4096, 16384, 32768};
    for (int bi = 0; bi < 2; bi++)
        for (int ci = 0; ci < 6; ci++) {
            dec_bench b = {.k = k, .stream = stream, .B = Bs[bi], .ctx = ctxs[ci], .n_head = n_head, .n_kv = n_kv,
                           .hd = hd, .n_sm = n_sm};
            if (dec_setup(&b, err, errlen)) return -1;
            const size_t nq = (size_t)b.B * n_head * hd;
            const double bytes = (double)b.B * b.ctx * n_kv * hd * 2 * 2;
            uint16_t *ref = malloc(nq * 2), *got = malloc(nq * 2);
            double us;
            int rc = !ref || !got;
            rc = rc || dec_launch(&b, NULL, 0, err, errlen) || cu.cuStreamSynchronize(stream) ||
                 cu.cuMemcpyDtoH(ref, b.out, nq * 2) || dec_time(&b, NULL, &us, err, errlen);
            if (!rc) printf("%-3d %6d %8.2f (%6.0f)   ", b.B, b.ctx, us, bytes / us / 1e3);
            for (int i = 0; i < nv && !rc; i++) {
                rc = cu.cuMemsetD8Async(b.out, 0xff, nq * 2, stream) || dec_launch(&b, &vs[i], 0, err, errlen) ||
                     cu.cuStreamSynchronize(stream) || cu.cuMemcpyDtoH(got, b.out, nq * 2) ||
                     dec_time(&b, &vs[i], &us, err, errlen);
                if (!rc) printf(" | %7.2f (%5.0f) %7.1e", us, bytes / us / 1e3, max_diff(ref, got, nq));
            }
            printf("\n");
            fflush(stdout);
            free(ref), free(got);
            dec_free(&b);
            if (rc) {
                if (!err[0]) snprintf(err, errlen, "attnbench: a CUDA call failed at B=%d ctx=%d", b.B, b.ctx);
                return -1;
            }
        }
    return 0;
}
