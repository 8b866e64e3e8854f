/* gpu_forward.c - the transformer forward pass on the GPU, top to bottom, over one packed
 * batch of tokens from any number of slots:
 *
 *   x = embed(tok)
 *   for each layer:
 *       xn = rmsnorm(x) * attn_norm
 *       q, k, v = Wq xn (+bq), Wk xn (+bk), Wv xn (+bv)     qwen2 biases
 *       q, k = rmsnorm per head (qwen3), then RoPE at each token's position
 *       K/V cache[slot][pos] = k, v
 *       att = softmax(q K^T / sqrt(hd)) V over keys 0..pos of the token's slot
 *       x += Wo att
 *       xn = rmsnorm(x) * ffn_norm
 *       x += Wdown (silu(Wgate xn) * Wup xn)
 *   logits = Wout rmsnorm(x[rows]) * output_norm;  sample(rows)
 *
 * Matmuls over a few rows (decode) read the quantised weights directly (matvec kernels); over
 * many rows (prefill) the weight is dequantised to FP16 and multiplied by cuBLAS. */
#include <math.h>
#include <stdio.h>

#include "gpu_internal.h"

#define F32(p) ((float *)(uintptr_t)(p))
#define LAUNCH(fn, dims, what, ...)                                                              \
    do {                                                                                         \
        void *launch_args_[] = {__VA_ARGS__};                                                    \
        if (gpu_launch(&(fn), (dims), g->stream, launch_args_, (what), err, errlen)) return -1;  \
    } while (0)

static unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* y[m][ldy] (+)= W x[m][ldx] (+ bias) */
typedef struct matmul_op {
    const gpu_matrix *w;
    CUdeviceptr x, y, bias;
    int m, ldx, ldy;
    bool accumulate;
    const char *what;
} matmul_op;

static int matmul(gpu_engine *g, const matmul_op *op, char *err, size_t errlen)
{
    const gpu_matrix *w = op->w;
    if (op->m <= GPU_MAX_DECODE_BATCH || !g->have_blas) {
        int v = op->m >= 8 ? 3 : op->m >= 4 ? 2 : op->m >= 2 ? 1 : 0;
        int rows = 1 << v;
        matvec_args a = {
            .w = (const uint8_t *)(uintptr_t)w->d, .row_bytes = w->row_bytes, .k = w->k, .n = w->n,
            .m = op->m, .ldx = op->ldx, .ldy = op->ldy, .accumulate = op->accumulate,
            .x = F32(op->x), .y = F32(op->y), .bias = F32(op->bias),
        };
        gpu_launch_dims d = {ceil_div(op->m, rows), ceil_div(w->n, 8), 1, 256};
        LAUNCH(g->k.matvec[w->wtype][v], d, op->what, &a);
        return 0;
    }
    /* cuBLAS: activations and weight to FP16, C (f32, column-major n x m) = W^T-view * x. */
    size_t nx = (size_t)op->m * op->ldx;
    LAUNCH(g->k.to_f16, ((gpu_launch_dims){ceil_div(nx, 256), 1, 1, 256}), op->what,
           &(CUdeviceptr){op->x}, &(CUdeviceptr){g->xh}, &nx);
    size_t chunks = (size_t)w->n * (w->k / 32);
    unsigned long long rb = w->row_bytes;
    LAUNCH(g->k.dequant_f16[w->wtype], ((gpu_launch_dims){ceil_div(chunks, 256), 1, 1, 256}), op->what,
           &(CUdeviceptr){w->d}, &rb, &(int){w->k}, &(int){w->n}, &(CUdeviceptr){g->wdq});
    float alpha = 1.0f, beta = op->accumulate ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublas.gemm_ex(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, w->n, op->m, w->k, &alpha,
                                (const void *)(uintptr_t)g->wdq, CUDA_R_16F, w->k,
                                (const void *)(uintptr_t)g->xh, CUDA_R_16F, op->ldx, &beta,
                                (void *)(uintptr_t)op->y, CUDA_R_32F, op->ldy, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                 op->what);
    if (op->bias) {
        size_t total = (size_t)op->m * op->ldy;
        LAUNCH(g->k.add_bias, ((gpu_launch_dims){ceil_div(total, 256), 1, 1, 256}), op->what,
               &(CUdeviceptr){op->y}, &(CUdeviceptr){op->bias}, &(int){op->ldy}, &total);
    }
    return 0;
}

static int rmsnorm(gpu_engine *g, CUdeviceptr x, CUdeviceptr w, CUdeviceptr y, int rows, int n,
                   const char *what, char *err, size_t errlen)
{
    float eps = g->base.m->hp.rms_eps;
    CUdeviceptr none = 0;
    unsigned threads = n >= 1024 ? 1024 : n >= 256 ? 256 : 32;
    LAUNCH(g->k.rmsnorm, ((gpu_launch_dims){(unsigned)rows, 1, 1, threads}), what, &x, &w, &y, &none,
           &n, &eps);
    return 0;
}

static int rope(gpu_engine *g, CUdeviceptr v, int n_tokens, int n_heads, const char *what, char *err,
                size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    CUdeviceptr pos = g->in_d + g->in.pos;
    float base = hp->rope_base, scale = 1.0f / hp->rope_scale;
    int neox = hp->rope_neox, hd = hp->head_dim;
    unsigned threads = hd / 2 >= 64 ? 64 : 32;
    LAUNCH(g->k.rope, ((gpu_launch_dims){(unsigned)n_tokens, (unsigned)n_heads, 1, threads}), what, &v,
           &n_heads, &hd, &pos, &base, &scale, &g->rope_freqs, &neox);
    return 0;
}

int gpu_attn_splits(const gpu_engine *g, int n_tokens)
{
    const model_hparams *hp = &g->base.m->hp;
    int group = hp->n_head / hp->n_head_kv, gb = 8;
    while (group % gb) gb--;
    int blocks = n_tokens * (hp->n_head / gb), want = 2 * 132;
    int s = want / (blocks > 0 ? blocks : 1);
    return s < 1 ? 1 : s > GPU_MAX_SPLIT ? GPU_MAX_SPLIT : s;
}

static int attention(gpu_engine *g, int il, int n_tokens, int n_split, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    int group = hp->n_head / hp->n_head_kv, gb = 8;
    while (group % gb) gb--;
    attn_args a = {
        .q = F32(g->q), .kc = (const gpu_half *)(uintptr_t)g->kc, .vc = (const gpu_half *)(uintptr_t)g->vc,
        .slot = (const int32_t *)(uintptr_t)(g->in_d + g->in.slot),
        .pos = (const int32_t *)(uintptr_t)(g->in_d + g->in.pos),
        .n_layer = hp->n_layer, .layer = il, .n_head = hp->n_head, .n_kv = hp->n_head_kv,
        .ctx = g->base.cfg.ctx_per_slot, .hd = hp->head_dim, .gb = gb, .n_split = n_split,
        .scale = 1.0f / sqrtf((float)hp->head_dim), .part_o = F32(g->part_o), .part_ml = F32(g->part_ml),
    };
    LAUNCH(g->k.attn_partial, ((gpu_launch_dims){(unsigned)n_tokens, (unsigned)(hp->n_head / gb), (unsigned)n_split, 128}),
           "attention", &a);
    int hd = hp->head_dim, nh = hp->n_head;
    LAUNCH(g->k.attn_combine, ((gpu_launch_dims){(unsigned)n_tokens, (unsigned)nh, 1, hd >= 128 ? 128 : 32}),
           "attention", &g->part_o, &g->part_ml, &g->att, &nh, &n_split, &hd);
    return 0;
}

static int layer_forward(gpu_engine *g, int il, int T, int n_split, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const gpu_layer *L = &g->layers[il];
    char what[64];
    snprintf(what, sizeof what, "layer %d attention", il);
    if (rmsnorm(g, g->x, L->attn_norm, g->xn, T, hp->n_embd, what, err, errlen)) return -1;
    matmul_op qkv[3] = {
        {&L->wq, g->xn, g->q, L->bq, T, g->d_embd, g->d_q, false, what},
        {&L->wk, g->xn, g->kk, L->bk, T, g->d_embd, g->d_kv, false, what},
        {&L->wv, g->xn, g->vv, L->bv, T, g->d_embd, g->d_kv, false, what},
    };
    for (int i = 0; i < 3; i++)
        if (matmul(g, &qkv[i], err, errlen)) return -1;
    if (L->q_norm) {
        if (rmsnorm(g, g->q, L->q_norm, g->q, T * hp->n_head, hp->head_dim, what, err, errlen) ||
            rmsnorm(g, g->kk, L->k_norm, g->kk, T * hp->n_head_kv, hp->head_dim, what, err, errlen))
            return -1;
    }
    if (rope(g, g->q, T, hp->n_head, what, err, errlen) || rope(g, g->kk, T, hp->n_head_kv, what, err, errlen))
        return -1;
    kv_store_args kv = {
        .k = F32(g->kk), .v = F32(g->vv), .kc = (gpu_half *)(uintptr_t)g->kc, .vc = (gpu_half *)(uintptr_t)g->vc,
        .slot = (const int32_t *)(uintptr_t)(g->in_d + g->in.slot),
        .pos = (const int32_t *)(uintptr_t)(g->in_d + g->in.pos),
        .n_layer = hp->n_layer, .layer = il, .n_kv = hp->n_head_kv, .ctx = g->base.cfg.ctx_per_slot,
        .hd = hp->head_dim,
    };
    LAUNCH(g->k.kv_store, ((gpu_launch_dims){(unsigned)T, 1, 1, 128}), what, &kv);
    if (attention(g, il, T, n_split, err, errlen)) return -1;
    matmul_op wo = {&L->wo, g->att, g->x, 0, T, g->d_q, g->d_embd, true, what};
    if (matmul(g, &wo, err, errlen)) return -1;

    snprintf(what, sizeof what, "layer %d feed-forward", il);
    if (rmsnorm(g, g->x, L->ffn_norm, g->xn, T, hp->n_embd, what, err, errlen)) return -1;
    matmul_op gate = {&L->w_gate, g->xn, g->gate, 0, T, g->d_embd, g->d_ff, false, what};
    matmul_op up = {&L->w_up, g->xn, g->up, 0, T, g->d_embd, g->d_ff, false, what};
    if (matmul(g, &gate, err, errlen) || matmul(g, &up, err, errlen)) return -1;
    size_t n = (size_t)T * g->d_ff;
    LAUNCH(g->k.swiglu, ((gpu_launch_dims){ceil_div(n, 256) < 4096 ? ceil_div(n, 256) : 4096, 1, 1, 256}), what,
           &g->gate, &g->up, &n);
    matmul_op down = {&L->w_down, g->gate, g->x, 0, T, g->d_ff, g->d_embd, true, what};
    return matmul(g, &down, err, errlen);
}

/* Final norm + LM head over n rows of x picked by an index list (stride in ints). */
static int lm_head(gpu_engine *g, CUdeviceptr idx, int stride, int n, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    int ne = hp->n_embd;
    LAUNCH(g->k.gather_rows, ((gpu_launch_dims){(unsigned)n, 1, 1, 256}), "LM head", &g->x, &idx, &stride,
           &g->xl, &ne);
    if (rmsnorm(g, g->xl, g->output_norm, g->xl, n, ne, "LM head", err, errlen)) return -1;
    matmul_op op = {&g->output, g->xl, g->logits, 0, n, g->d_embd, hp->n_vocab, false, "LM head"};
    return matmul(g, &op, err, errlen);
}

int gpu_forward_logits_rows(gpu_engine *g, int first, int n, char *err, size_t errlen)
{
    return lm_head(g, g->in_d + g->in.lidx + (size_t)first * sizeof(int32_t), 1, n, err, errlen);
}

int gpu_forward(gpu_engine *g, int T, int R, int n_split, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    CUdeviceptr tok = g->in_d + g->in.tok, slot = g->in_d + g->in.slot, pos = g->in_d + g->in.pos;
    int ctx = g->base.cfg.ctx_per_slot, ne = hp->n_embd;
    unsigned long long rb = g->tok_embd.row_bytes;
    LAUNCH(g->k.hist_store, ((gpu_launch_dims){ceil_div(T, 128), 1, 1, 128}), "token history", &g->hist, &ctx,
           &tok, &slot, &pos, &T);
    LAUNCH(g->k.embed[g->tok_embd.wtype], ((gpu_launch_dims){(unsigned)T, 1, 1, 64}), "embedding",
           &g->tok_embd.d, &rb, &ne, &tok, &g->x);
    for (int il = 0; il < hp->n_layer; il++)
        if (layer_forward(g, il, T, n_split, err, errlen)) return -1;
    if (R == 0) return 0;
    int stride = (int)(sizeof(gpu_sample_row) / sizeof(int32_t));
    if (lm_head(g, g->in_d + g->in.rows, stride, R, err, errlen)) return -1;
    sample_args sa = {
        .logits = F32(g->logits), .work = F32(g->work), .counts = (int32_t *)(uintptr_t)g->counts,
        .rows = (const gpu_sample_row *)(uintptr_t)(g->in_d + g->in.rows),
        .bias = (const gpu_bias *)(uintptr_t)(g->in_d + g->in.bias), .hist = (const int32_t *)(uintptr_t)g->hist,
        .ctx = ctx, .n_vocab = hp->n_vocab, .out = (gpu_sample_out *)(uintptr_t)g->sout,
    };
    LAUNCH(g->k.sample, ((gpu_launch_dims){(unsigned)R, 1, 1, 1024}), "sampling", &sa);
    return 0;
}
