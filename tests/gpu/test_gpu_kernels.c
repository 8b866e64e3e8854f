/* test_gpu_kernels.c - each CUDA kernel against the CPU on fresh random inputs: the quantised
 * matrix-vector kernels (every weight format, every row-count variant, bias and residual),
 * FP16 dequantisation and embedding rows, RMSNorm, RoPE, split-K attention over slots of
 * different lengths, and the sampler against sampling_sample().  Outputs are poisoned (NaN)
 * before each launch, so an unwritten element fails.  Skips without a device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sampling.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_kernels.h"
#include "gpu/gpu_shared.h"
#include "gpu_test_util.h"
#include "model/quant.h"

typedef struct gpu_ctx {
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    gpu_kernels k;
} gpu_ctx;

static gpu_ctx G;
static char err[512];
static const size_t errlen = sizeof err;

#define CHECK(call) assert_int_equal((call), CUDA_SUCCESS)

static int setup_ctx(void **state)
{
    (void)state;
    if (!gpu_test_have_device()) return 0;
    assert_true(cuda_api_load(err, errlen));
    CHECK(cu.cuDeviceGet(&G.dev, 0));
    CHECK(cu.cuDevicePrimaryCtxRetain(&G.ctx, G.dev));
    CHECK(cu.cuCtxSetCurrent(G.ctx));
    CHECK(cu.cuStreamCreate(&G.stream, CU_STREAM_NON_BLOCKING));
    if (gpu_kernels_load(&G.k, err, errlen)) fail_msg("%s", err);
    return 0;
}

static int teardown_ctx(void **state)
{
    (void)state;
    if (!G.ctx) return 0;
    gpu_kernels_unload(&G.k);
    cu.cuStreamDestroy(G.stream);
    cu.cuDevicePrimaryCtxRelease(G.dev);
    return 0;
}

static CUdeviceptr upload(const void *h, size_t bytes)
{
    CUdeviceptr d;
    CHECK(cu.cuMemAlloc(&d, bytes));
    CHECK(cu.cuMemcpyHtoD(d, h, bytes));
    return d;
}

/* A device buffer of n floats filled with NaN (unwritten outputs then show). */
static CUdeviceptr poisoned(size_t n)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    CUdeviceptr d = upload(h, n * sizeof *h);
    free(h);
    return d;
}

static void download(void *h, CUdeviceptr d, size_t bytes)
{
    CHECK(cu.cuStreamSynchronize(G.stream));
    CHECK(cu.cuMemcpyDtoH(h, d, bytes));
}

static void launch(const gpu_fn *fn, gpu_launch_dims d, void **args)
{
    if (gpu_launch(fn, d, G.stream, args, "test", err, errlen)) fail_msg("%s", err);
}

static const ggml_type wtypes[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0,
                                   GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};

/* n rows of k random weights in format t; also their dequantised values. */
static void *random_matrix(ggml_type t, int k, int n, float *deq, uint64_t *seed)
{
    size_t rb = ggml_row_bytes(t, k);
    unsigned char *w = malloc(rb * n);
    float *row = malloc((size_t)k * sizeof *row);
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < k; i++) row[i] = gpu_test_randf(seed);
        assert_int_equal(quant_quantize_row(t, row, w + rb * r, k), rb);
        quant_dequantize_row(t, w + rb * r, deq + (size_t)r * k, k);
    }
    free(row);
    return w;
}

static void test_matvec_all_formats(void **state)
{
    (void)state;
    if (!G.ctx) skip();
    uint64_t seed = 42;
    const int K = 768, N = 77;
    const int Ms[] = {1, 2, 3, 5, 8, 13, 64};
    for (size_t ti = 0; ti < sizeof wtypes / sizeof wtypes[0]; ti++) {
        ggml_type t = wtypes[ti];
        float *deq = malloc((size_t)K * N * sizeof *deq);
        void *w = random_matrix(t, K, N, deq, &seed);
        size_t rb = ggml_row_bytes(t, K);
        CUdeviceptr dw = upload(w, rb * N);
        int wt = gpu_wtype_index(t);
        assert_true(wt >= 0);
        double worst = 0.0;
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            int M = Ms[mi];
            float *x = malloc((size_t)M * K * sizeof *x), *y = malloc((size_t)M * N * sizeof *y);
            float *ref = malloc((size_t)M * N * sizeof *ref), *bias = malloc(N * sizeof *bias);
            for (int i = 0; i < M * K; i++) x[i] = gpu_test_randf(&seed);
            for (int i = 0; i < N; i++) bias[i] = gpu_test_randf(&seed);
            int acc = M % 2; /* odd M: residual accumulate onto the prior y, plus bias */
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    double s = 0.0;
                    for (int i = 0; i < K; i++) s += (double)deq[(size_t)n * K + i] * x[(size_t)m * K + i];
                    ref[(size_t)m * N + n] = (float)(s + (acc ? 1.0 + bias[n] : 0.0));
                }
            CUdeviceptr dx = upload(x, (size_t)M * K * sizeof *x), dy = poisoned((size_t)M * N);
            CUdeviceptr db = upload(bias, N * sizeof *bias);
            if (acc) {
                for (int i = 0; i < M * N; i++) y[i] = 1.0f;
                CHECK(cu.cuMemcpyHtoD(dy, y, (size_t)M * N * sizeof *y));
            }
            int v = M >= 8 ? 3 : M >= 4 ? 2 : M >= 2 ? 1 : 0;
            matvec_args a = {.w = (const uint8_t *)(uintptr_t)dw, .row_bytes = rb, .k = K, .n = N, .m = M,
                             .ldx = K, .ldy = N, .accumulate = acc, .x = (const float *)(uintptr_t)dx,
                             .y = (float *)(uintptr_t)dy, .bias = acc ? (const float *)(uintptr_t)db : NULL};
            void *args[] = {&a};
            launch(&G.k.matvec[wt][v], (gpu_launch_dims){(unsigned)((M + (1 << v) - 1) >> v), (N + 7) / 8, 1, 256}, args);
            download(y, dy, (size_t)M * N * sizeof *y);
            double e = gpu_test_rel_err(y, ref, (size_t)M * N);
            if (e > worst) worst = e;
            if (e > 1e-5) fail_msg("matvec %s M=%d: relative error %.3g", ggml_type_name(t), M, e);
            cu.cuMemFree(dx);
            cu.cuMemFree(dy);
            cu.cuMemFree(db);
            free(x), free(y), free(ref), free(bias);
        }
        /* dequantisation to FP16 and the embedding gather read the same blocks */
        CUdeviceptr dh = poisoned((size_t)K * N / 2);
        unsigned long long rbl = rb;
        int k = K, n = N;
        void *dargs[] = {&dw, &rbl, &k, &n, &dh};
        launch(&G.k.dequant_f16[wt], (gpu_launch_dims){(K / 32 * N + 255) / 256, 1, 1, 256}, dargs);
        uint16_t *h = malloc((size_t)K * N * sizeof *h);
        float *hf = malloc((size_t)K * N * sizeof *hf);
        download(h, dh, (size_t)K * N * sizeof *h);
        for (size_t i = 0; i < (size_t)K * N; i++) hf[i] = quant_f16_to_f32(h[i]);
        double edq = gpu_test_rel_err(hf, deq, (size_t)K * N);
        int32_t toks[3] = {N - 1, 0, 5};
        CUdeviceptr dt = upload(toks, sizeof toks), de = poisoned((size_t)3 * K);
        void *eargs[] = {&dw, &rbl, &k, &dt, &de};
        launch(&G.k.embed[wt], (gpu_launch_dims){3, 1, 1, 64}, eargs);
        float *emb = malloc((size_t)3 * K * sizeof *emb), *eref = malloc((size_t)3 * K * sizeof *eref);
        download(emb, de, (size_t)3 * K * sizeof *emb);
        for (int i = 0; i < 3; i++) memcpy(eref + (size_t)i * K, deq + (size_t)toks[i] * K, K * sizeof *eref);
        double ee = gpu_test_rel_err(emb, eref, (size_t)3 * K);
        print_message("  %-5s matvec rel err %.2e (M up to 64), dequant->f16 %.2e, embed %.2e\n", ggml_type_name(t),
                      worst, edq, ee);
        assert_true(edq < 1e-3);
        assert_true(ee < 1e-6);
        cu.cuMemFree(dh), cu.cuMemFree(dt), cu.cuMemFree(de), cu.cuMemFree(dw);
        free(h), free(hf), free(emb), free(eref), free(deq), free(w);
    }
}

static void test_rmsnorm_rope(void **state)
{
    (void)state;
    if (!G.ctx) skip();
    uint64_t seed = 7;
    const int rows = 5, n = 384, hd = 128, heads = n / hd;
    float x[5 * 384], w[384], y[5 * 384], ref[5 * 384];
    for (int i = 0; i < rows * n; i++) x[i] = gpu_test_randf(&seed) * 3.0f;
    for (int i = 0; i < n; i++) w[i] = 1.0f + gpu_test_randf(&seed) * 0.5f;
    float eps = 1e-5f;
    for (int r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
        double sc = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++) ref[r * n + i] = (float)(x[r * n + i] * sc * w[i]);
    }
    CUdeviceptr dx = upload(x, sizeof x), dw = upload(w, sizeof w), dy = poisoned(rows * n), none = 0;
    int nn = n;
    void *a[] = {&dx, &dw, &dy, &none, &nn, &eps};
    launch(&G.k.rmsnorm, (gpu_launch_dims){rows, 1, 1, 256}, a);
    download(y, dy, sizeof y);
    double e = gpu_test_rel_err(y, ref, rows * n);
    print_message("  rmsnorm rel err %.2e\n", e);
    assert_true(e < 1e-5);

    /* RoPE, both layouts, with position scaling and frequency divisors */
    int32_t pos[5] = {0, 1, 17, 300, 4095};
    float div[64];
    for (int i = 0; i < hd / 2; i++) div[i] = 1.0f + (float)i / 16.0f;
    CUdeviceptr dpos = upload(pos, sizeof pos), ddiv = upload(div, sizeof div);
    for (int neox = 0; neox < 2; neox++) {
        float base = 500000.0f, scale = 0.5f;
        CHECK(cu.cuMemcpyHtoD(dy, x, sizeof x));
        int nh = heads, d = hd;
        void *ra[] = {&dy, &nh, &d, &dpos, &base, &scale, &ddiv, &neox};
        launch(&G.k.rope, (gpu_launch_dims){rows, heads, 1, 64}, ra);
        download(y, dy, sizeof y);
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < heads; h++)
                for (int i = 0; i < hd / 2; i++) {
                    double th = pos[r] * (double)scale * pow(base, -2.0 * i / hd) / div[i];
                    int ia = neox ? i : 2 * i, ib = neox ? i + hd / 2 : 2 * i + 1;
                    const float *v = x + r * n + h * hd;
                    ref[r * n + h * hd + ia] = (float)(v[ia] * cos(th) - v[ib] * sin(th));
                    ref[r * n + h * hd + ib] = (float)(v[ia] * sin(th) + v[ib] * cos(th));
                }
        e = gpu_test_rel_err(y, ref, rows * n);
        print_message("  rope (%s) rel err %.2e\n", neox ? "neox" : "normal", e);
        assert_true(e < 1e-3); /* float angles at position 4095 */
    }
    cu.cuMemFree(dx), cu.cuMemFree(dw), cu.cuMemFree(dy), cu.cuMemFree(dpos), cu.cuMemFree(ddiv);
}

/* Attention of 4 query tokens in 3 slots (lengths 1..700) with GQA, for several splits. */
static void test_attention(void **state)
{
    (void)state;
    if (!G.ctx) skip();
    uint64_t seed = 99;
    const int n_layer = 2, layer = 1, n_head = 8, n_kv = 2, ctx = 768, hd = 64, slots = 3, T = 4;
    size_t cache_n = (size_t)slots * n_layer * n_kv * ctx * hd;
    uint16_t *kc = malloc(cache_n * 2), *vc = malloc(cache_n * 2);
    for (size_t i = 0; i < cache_n; i++) {
        kc[i] = quant_f32_to_f16(gpu_test_randf(&seed) * 2.0f);
        vc[i] = quant_f32_to_f16(gpu_test_randf(&seed));
    }
    int32_t slot[4] = {2, 0, 1, 2}, pos[4] = {699, 0, 37, 700};
    float q[4 * 8 * 64], out[4 * 8 * 64], ref[4 * 8 * 64];
    for (int i = 0; i < T * n_head * hd; i++) q[i] = gpu_test_randf(&seed);
    float scale = 1.0f / sqrtf((float)hd);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_head; h++) {
            int kvh = h / (n_head / n_kv);
            size_t base = ((((size_t)slot[t] * n_layer + layer) * n_kv) + kvh) * ctx * hd;
            double *sc = malloc((size_t)(pos[t] + 1) * sizeof *sc), mx = -INFINITY, sum = 0.0;
            for (int j = 0; j <= pos[t]; j++) {
                double s = 0.0;
                for (int d = 0; d < hd; d++)
                    s += (double)q[(t * n_head + h) * hd + d] * quant_f16_to_f32(kc[base + (size_t)j * hd + d]);
                sc[j] = s * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = 0; j <= pos[t]; j++) sum += exp(sc[j] - mx);
            for (int d = 0; d < hd; d++) {
                double o = 0.0;
                for (int j = 0; j <= pos[t]; j++) o += exp(sc[j] - mx) / sum * quant_f16_to_f32(vc[base + (size_t)j * hd + d]);
                ref[(t * n_head + h) * hd + d] = (float)o;
            }
            free(sc);
        }
    CUdeviceptr dk = upload(kc, cache_n * 2), dv = upload(vc, cache_n * 2), dq = upload(q, sizeof q);
    CUdeviceptr ds = upload(slot, sizeof slot), dp = upload(pos, sizeof pos);
    const int splits[] = {1, 3, 32};
    for (int si = 0; si < 3; si++) {
        int ns = splits[si];
        CUdeviceptr po = poisoned((size_t)T * n_head * ns * hd), pml = poisoned((size_t)T * n_head * ns * 2);
        CUdeviceptr dout = poisoned((size_t)T * n_head * hd);
        int gbs[] = {4, 2};
        for (int gi = 0; gi < 2; gi++) {
            attn_args a = {.q = (const float *)(uintptr_t)dq, .kc = (const gpu_half *)(uintptr_t)dk,
                           .vc = (const gpu_half *)(uintptr_t)dv, .slot = (const int32_t *)(uintptr_t)ds,
                           .pos = (const int32_t *)(uintptr_t)dp, .n_layer = n_layer, .layer = layer,
                           .n_head = n_head, .n_kv = n_kv, .ctx = ctx, .hd = hd, .gb = gbs[gi], .n_split = ns,
                           .scale = scale, .part_o = (float *)(uintptr_t)po, .part_ml = (float *)(uintptr_t)pml};
            void *aa[] = {&a};
            launch(&G.k.attn_partial, (gpu_launch_dims){T, n_head / gbs[gi], ns, 128}, aa);
            int nh = n_head, d = hd, nsp = ns;
            void *ca[] = {&po, &pml, &dout, &nh, &nsp, &d};
            launch(&G.k.attn_combine, (gpu_launch_dims){T, n_head, 1, 64}, ca);
            download(out, dout, sizeof out);
            double e = gpu_test_rel_err(out, ref, (size_t)T * n_head * hd);
            print_message("  attention splits=%d heads/block=%d rel err %.2e\n", ns, gbs[gi], e);
            assert_true(e < 1e-4);
        }
        cu.cuMemFree(po), cu.cuMemFree(pml), cu.cuMemFree(dout);
    }
    cu.cuMemFree(dk), cu.cuMemFree(dv), cu.cuMemFree(dq), cu.cuMemFree(ds), cu.cuMemFree(dp);
    free(kc), free(vc);
}

/* The GPU sampler against sampling_sample() on the same logits, history and parameters. */
static void test_sampler_matches_cpu(void **state)
{
    (void)state;
    if (!G.ctx) skip();
    uint64_t seed = 5;
    const int V = 3000, R = 8, ctx = 64;
    float *logits = malloc((size_t)R * V * sizeof *logits);
    for (int i = 0; i < R * V; i++) logits[i] = gpu_test_randf(&seed) * 4.0f;
    logits[17] = logits[18] = 9.0f; /* a tie at the top of row 0: lowest id wins */
    int32_t hist[R * ctx];
    for (int i = 0; i < R * ctx; i++) hist[i] = (int32_t)(gpu_test_rng(&seed) % 40);
    /* row 3's logit_bias: a repeated id, an id outside the vocabulary (ignored by both) */
    gpu_bias bias[4] = {{3, 5.0f}, {3, 1.0f}, {V + 7, 2.0f}, {11, -100.0f}};
    int32_t bias_ids[4] = {3, 3, V + 7, 11};
    float bias_vals[4] = {5.0f, 1.0f, 2.0f, -100.0f};
    sampling_params sp[R];
    for (int r = 0; r < R; r++) sampling_params_default(&sp[r]);
    sp[1] = (sampling_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.0f, .seed = 123,
                              .repeat_penalty = 1.3f, .presence_penalty = 0.5f, .frequency_penalty = 0.25f,
                              .penalty_last_n = 16, .n_top_logprobs = 5};
    sp[2] = (sampling_params){.temperature = 1.5f, .top_p = 1.0f, .min_p = 0.05f, .seed = 9,
                              .repeat_penalty = 1.0f, .penalty_last_n = -1, .n_top_logprobs = 20};
    sp[3] = (sampling_params){.temperature = 0.0f, .top_p = 1.0f, .repeat_penalty = 1.1f, .penalty_last_n = -1,
                              .n_top_logprobs = 3, .bias_ids = bias_ids, .bias_vals = bias_vals, .n_bias = 4};
    sp[4] = (sampling_params){.temperature = 0.7f, .top_k = 1, .top_p = 1.0f, .repeat_penalty = 1.0f, .seed = 1,
                              .n_top_logprobs = 0};
    sp[5] = (sampling_params){.temperature = 1.0f, .top_p = 0.5f, .repeat_penalty = 1.0f, .seed = 77,
                              .n_top_logprobs = -1};
    sp[6] = (sampling_params){.temperature = 2.0f, .top_p = 1.0f, .repeat_penalty = 1.0f, .seed = 3,
                              .frequency_penalty = 1.0f, .penalty_last_n = 64, .n_top_logprobs = 1};
    sp[7] = sp[1];
    sp[7].seed = 124;
    gpu_sample_row rows[R];
    memset(rows, 0, sizeof rows);
    for (int r = 0; r < R; r++) {
        rows[r] = (gpu_sample_row){.token_index = r, .slot = r, .hist_end = 10 + 6 * r, .want = 1,
                                   .temperature = sp[r].temperature, .top_p = sp[r].top_p, .min_p = sp[r].min_p,
                                   .top_k = sp[r].top_k, .repeat_penalty = sp[r].repeat_penalty,
                                   .presence_penalty = sp[r].presence_penalty,
                                   .frequency_penalty = sp[r].frequency_penalty,
                                   .penalty_last_n = sp[r].penalty_last_n, .n_top = sp[r].n_top_logprobs,
                                   .seed = sp[r].seed};
    }
    rows[3].bias_off = 0;
    rows[3].n_bias = 4;
    CUdeviceptr dl = upload(logits, (size_t)R * V * 4), dwork = poisoned((size_t)R * V);
    int32_t *zeros = calloc((size_t)R * V, 4);
    CUdeviceptr dc = upload(zeros, (size_t)R * V * 4), drows = upload(rows, sizeof rows);
    CUdeviceptr db = upload(bias, sizeof bias), dh = upload(hist, sizeof hist);
    CUdeviceptr dout;
    CHECK(cu.cuMemAlloc(&dout, R * sizeof(gpu_sample_out)));
    sample_args a = {.logits = (const float *)(uintptr_t)dl, .work = (float *)(uintptr_t)dwork,
                     .counts = (int32_t *)(uintptr_t)dc, .rows = (const gpu_sample_row *)(uintptr_t)drows,
                     .bias = (const gpu_bias *)(uintptr_t)db, .hist = (const int32_t *)(uintptr_t)dh, .ctx = ctx,
                     .n_vocab = V, .out = (gpu_sample_out *)(uintptr_t)dout};
    void *args[] = {&a};
    launch(&G.k.sample, (gpu_launch_dims){R, 1, 1, 1024}, args);
    gpu_sample_out out[R];
    download(out, dout, sizeof out);
    download(zeros, dc, (size_t)R * V * 4);
    for (int i = 0; i < R * V; i++) assert_int_equal(zeros[i], 0); /* counts left clean */
    void *scratch = malloc(sampling_scratch_bytes(V));
    float *row = malloc(V * sizeof *row);
    for (int r = 0; r < R; r++) {
        memcpy(row, logits + (size_t)r * V, V * sizeof *row);
        sampling_input in = {.logits = row, .n_vocab = V, .history = hist + r * ctx, .n_history = rows[r].hist_end,
                             .position = rows[r].hist_end, .sp = &sp[r]};
        engine_result cpu;
        memset(&cpu, 0, sizeof cpu);
        sampling_sample(&in, scratch, &cpu);
        print_message("  row %d: T=%.1f cpu token %d (lp %.5f) gpu token %d (lp %.5f), top %d/%d\n", r,
                      sp[r].temperature, cpu.token, cpu.logprob, out[r].token, out[r].logprob, cpu.n_top, out[r].n_top);
        assert_int_equal(out[r].token, cpu.token);
        assert_true(fabsf(out[r].logprob - cpu.logprob) < 1e-4f);
        assert_int_equal(out[r].n_top, cpu.n_top);
        for (int k = 0; k < cpu.n_top; k++) {
            assert_int_equal(out[r].top_ids[k], cpu.top_ids[k]);
            assert_true(fabsf(out[r].top_logprobs[k] - cpu.top_logprobs[k]) < 1e-4f);
        }
    }
    assert_int_equal(out[0].token, 17);
    cu.cuMemFree(dl), cu.cuMemFree(dwork), cu.cuMemFree(dc), cu.cuMemFree(drows), cu.cuMemFree(db);
    cu.cuMemFree(dh), cu.cuMemFree(dout);
    free(zeros), free(scratch), free(row), free(logits);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matvec_all_formats),
        cmocka_unit_test(test_rmsnorm_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_sampler_matches_cpu),
    };
    return cmocka_run_group_tests(tests, setup_ctx, teardown_ctx);
}
