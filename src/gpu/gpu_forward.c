/* gpu_forward.c - the transformer forward pass on the GPU, top to bottom, over one packed
 * batch of tokens from any number of slots, for the recipes gpu_engine.c accepts (GPU_FEATURES):
 *
 *   x = embed(tok)                                      (Gemma: times sqrt(n_embd))
 *   (Gemma 4 E models: every layer's per-layer inputs, per_layer_inputs)
 *   for each layer (its own head_dim, kv heads and FFN width):
 *       h = fp16(rmsnorm(x) * attn_norm)
 *       q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)          one launch when formats agree
 *           (no Wv: v = Wk h; a layer sharing another's K/V: q alone)
 *           (phi3: q, k, v are row ranges of one fused matrix, gate and up its halves: the
 *            loader's views, uploaded as matrices of their own)
 *       q, k = rmsnorm per head (qk norm), RoPE (the layer's base, scaling and factors; LongRoPE:
 *           the short or long factors by the context, cos/sin times the attention factor),
 *           v = rmsnorm per head (v norm);
 *           K/V block[pos] = k, v in the layer's region of the caches (qkv_post; one token and
 *           no q/k/v norm: in the epilogue of the QKV matvec, matvec_rope)
 *       h = fp16(softmax(q K^T / sqrt(query_pre_attn_scalar)) V) over keys 0..pos of the
 *           token's sequence (a sliding layer: its window only, see gpu_attn_first_key):
 *           prompt spans on the tensor cores (flash_attn), decode tokens by split-K
 *           (gpt-oss: each head's sink logit in the softmax's denominator; Wo h + bo below)
 *       x += Wo h                       (sandwich norm: x += rmsnorm(Wo h) * attn_post_norm,
 *                                        one launch with the norm after it: block_end)
 *           (gated attention: Wq gives [q | gate] per head, h *= sigmoid(gate) before Wo;
 *            partial RoPE turns the first n_rot dimensions of a head)
 *       or, a gated DeltaNet layer (attention_linear):
 *           [q k v] = silu(conv1d(Wqkv h)) over the sequence's conv window, q and k L2-normed,
 *           z = Wgate h, beta = sigmoid(Wb h), g = A softplus(Wa h + dt_bias);
 *           o = delta rule over the sequence's state slot (token by token in decode graphs,
 *           chunks of 64 in prompt steps); x += Wout fp16(rmsnorm(o) * w * silu(z))
 *       or, a latent-attention layer (deepseek2, attention_mla):
 *           q = Wq_b fp16(rmsnorm(Wq_a h) * q_a_norm) (or Wq h), heads [nope | rope]; kv = Wkv_a h;
 *           latent cache row[pos] = [rmsnorm(kv[:lat]) * kv_a_norm | rope(kv[lat:])] (no V);
 *           q'_h = [wk_b_h q_nope_h | rope(q_rope_h)]; o_h = softmax(q'_h rows^T * mscale^2 /
 *           sqrt(nope + rope)) rows[:, :lat]; x += Wo fp16(wv_b_h o_h)   (per-head: batched cuBLAS)
 *       h = fp16(rmsnorm(x) * ffn_norm)
 *       x += Wdown fp16(silu(Wgate h) * Wup h)                 one launch (glu) when decoding
 *            (GeGLU: gelu_tanh, in the same fused kernels: matvec_args.glu_gelu)
 *            or, MoE: x += sum over the router's top k experts e of w_e Wdown_e fp16(silu(Wgate_e h) * Wup_e h)
 *                 (the router's scores softmax, or sigmoid chosen with a selection bias: GLM-4.5;
 *                  DeepSeek: chosen inside the best expert groups only)
 *                 (gpt-oss: the router's bias, softmax over the chosen logits, each expert's
 *                  biases, the clamped SwiGLU: glu_act)
 *                 (+ sigmoid(w_shexp . h) * the shared expert's GLU, where the family has one;
 *                  GLM-4.5's is ungated: + the GLU as it is)
 *                                        (sandwich norm: normed by ffn_post_norm as above)
 *            or, Gemma 4's 26B-A4B: the GeGLU and GeGLU experts side by side (ffn_glu_moe)
 *       (Gemma 4: x += its per-layer embedding; x *= layer_output_scale)
 *   logits = Wout fp16(rmsnorm(x[rows]) * output_norm)   (Gemma: cap * tanh(logits / cap))
 *   sample(rows)
 *
 * Matmuls read the weights as they are stored: over a few rows (decode) with the matvec
 * kernels, over more (batched decode, prefill) with the tensor-core mmq kernels, which decode
 * the quantised (and BF16) blocks into their mma fragments; F16 weights go to cuBLAS as they
 * lie, F32 ones to its FP32 product (TF32 tensor cores) over an FP32 copy of the activations.
 * All see the same FP16 activations, so they agree up to the rounding of the weights to
 * FP16/TF32 (exact for BF16 in range) and the order of FP32 sums. */
#include <math.h>
#include <stdio.h>

#include "gpu_internal.h"

#define F32(p) ((float *)(uintptr_t)(p))
#define F16(p) ((gpu_half *)(uintptr_t)(p))
#define I32(p) ((int32_t *)(uintptr_t)(p))
#define LAUNCH(fn, dims, what, ...)                                                              \
    do {                                                                                         \
        void *launch_args_[] = {__VA_ARGS__};                                                    \
        if (gpu_launch(&(fn), (dims), g->stream, launch_args_, (what), err, errlen)) return -1;  \
    } while (0)

static unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
/* The grid of an element-wise kernel over n values: 256 threads a block, at most 4096 blocks
 * (the kernels stride over the rest). */
static gpu_launch_dims flat_dims(size_t n)
{
    unsigned blocks = ceil_div(n, 256);
    return (gpu_launch_dims){blocks < 4096 ? blocks : 4096, 1, 1, 256};
}

/* One output of a matmul: y[m][ldy] (+)= W x (+ bias). */
typedef struct matmul_out {
    const gpu_matrix *w;
    CUdeviceptr y, bias;
    int ldy;
} matmul_out;

/* Up to three matrices over the same FP16 input x[m][ldx]. */
typedef struct matmul_op {
    matmul_out out[MATVEC_MAX_SEG];
    int n_out;
    CUdeviceptr x;
    int m, ldx;
    bool accumulate;
    const qkv_post_args *post; /* one token's QKV (m == 1, outputs Q, K, V): qkv_post fused */
    bool x_q8;                 /* x's q8 row is in xq/xd already (the norm before: norm_q8) */
    /* x's FP16 rounding remainder (act_lo): outputs 0..n_lo-1 get y (+)= W x + W x_lo, the
     * input to about 22 bits (the others W x alone).  One token on the FP16 matvec kernels
     * without accumulate: one pass over W (matvec_args x_lo); otherwise a second product of
     * those outputs over x_lo adding to the first's (the same sums) */
    CUdeviceptr x_lo;
    int n_lo;
    /* a carried norm (norm_point; m == 1, the matvec path): NORM_IN, x is norm p's input and
     * the products its scale (with post); NORM_OUT, the residual add (accumulate) writing norm
     * p's input with its weight norm_w */
    int norm, norm_p;
    CUdeviceptr norm_w;
    CUdeviceptr res_gate; /* NORM_OUT: y += sigmoid(logit[0]) * W x (matvec_args.res_gate); 0: ungated */
    int glu_gelu; /* a fused GLU's activation: GeGLU (matvec_args.glu_gelu) */
    /* tensor parallelism's one-row residual product: its sums pushed into the peers' LL lines
     * (matvec_ll_push; residual_add_split sets it only where the plain one-row kernel runs) */
    matvec_ll_push push;
    const char *what;
} matmul_op;

typedef enum { PATH_MATVEC, PATH_MMQ, PATH_BLAS } matmul_path;

/* Deterministic: the same kernel for every m (mmq, whose per-element k order is its stages'
 * and not the tile's, or else matvec, whose row sums do not depend on MT), never cuBLAS (its
 * algorithm, and so its sums, is its own choice per shape). */
static matmul_path path_for(const gpu_engine *g, const gpu_matrix *w, int m)
{
    if (g->det) return gpu_mmq_serves(&g->k, w->wtype, w->k) ? PATH_MMQ : PATH_MATVEC;
    if (m > 1 && gpu_mmq_serves(&g->k, w->wtype, w->k)) return PATH_MMQ;
    if (m <= GPU_MATVEC_MAX_M) return PATH_MATVEC;
    /* BF16 rows of no whole mmq stages: matvec at any m (cuBLAS would want an FP16 copy); F32
     * rows wider than x_f32 holds (a matrix blas_sizes did not count) likewise */
    if (w->type == GGML_TYPE_BF16 || (w->type == GGML_TYPE_F32 && w->k > g->x_f32_k)) return PATH_MATVEC;
    return g->have_blas ? PATH_BLAS : PATH_MATVEC;
}
/* The batch-1 products over q8 activations (kernels/dot_q8.cuh) where the engine allows them
 * and the format has them.  Their inputs come from the RMSNorm before them at no launch of its
 * own (norm_q8); with INFERD_GPU_DP4A_ALL the others (attention output into Wo, SwiGLU output
 * into Wdown) are quantised by a quantize_q8 launch of their own, else they stay on the FP16
 * kernels (meson option gpu_dp4a: the launch costs about what the faster product saves on
 * the small shapes). */
#ifndef INFERD_GPU_DP4A_ALL
#define INFERD_GPU_DP4A_ALL 1
#endif
static bool use_dp4a(const gpu_engine *g, const matmul_op *op, const gpu_matrix *w)
{
    return g->dp4a && op->m == 1 && (op->x_q8 || INFERD_GPU_DP4A_ALL) && gpu_dp4a_serves(&g->k, w->wtype, w->k);
}

/* Whether a norm of T rows of n makes the q8 row for the product after it (norm_op.q8 and
 * matmul_op.x_q8 of that product, so both ask the same question). */
static bool norm_q8(const gpu_engine *g, int T, int n)
{
    return g->dp4a && T == 1 && n % 256 == 0;
}

/* a's q8 row for a dp4a product over op->x: the norm's, or quantised here (once per op). */
static int dp4a_input(gpu_engine *g, const matmul_op *op, bool *ready, matvec_args *a, char *err, size_t errlen)
{
    if (!op->x_q8 && !*ready) {
        int k = a->k;
        LAUNCH(g->k.quantize_q8, ((gpu_launch_dims){ceil_div(k, 256), 1, 1, 256}), op->what, &(CUdeviceptr){op->x}, &k,
               &g->xq, &g->xd);
    }
    *ready = true;
    a->xq = (const int8_t *)(uintptr_t)g->xq;
    a->xd = F32(g->xd);
    return 0;
}

/* The batch-1 step's RMSNorms ride on its products where g->norm_carry (gpu_norms_carried):
 * norm point p (2 il: layer il's attention norm, 2 il + 1: its feed-forward norm) has its
 * input in norm_h, written by the product before it (NORM_OUT: the residual add; norm_prep for
 * the first), and its scale applied by the products after it (NORM_IN): no launch of its own
 * and no block that waits on a reduction before its weights stream (gpu_shared.h matvec_norm).
 * -1: the norm is a launch of its own (rmsnorm). */
static int norm_point(const gpu_engine *g, int p, int T) { return g->norm_carry && T == 1 ? p : -1; }

/* Whether layer il's last product is its routed experts' down product (moe_down_res): a MoE
 * layer with no shared expert after it. */
static bool moe_ends_layer(const gpu_engine *g, int il)
{
    return g->base.m->layers[il].recipe.ffn == ARCH_FFN_MOE && !g->layers[il].ffn_gate_shexp.d;
}

/* Whether norm point p is a DeltaNet or latent-attention layer's attention norm, whose input
 * product reads the norm to ~22 bits (attention_linear, attention_mla): its producer then also
 * writes the remainder (norm_lo). */
static bool norm_point_lo(const gpu_engine *g, int p)
{
    return p % 2 == 0 && p / 2 < g->base.m->hp.n_layer && (g->layers[p / 2].lin >= 0 || g->layers[p / 2].mla);
}

/* Norm point p's arguments (w: the producer's next-norm weight, or the router's own norm
 * weight), with the partials its producer writes: one per MATVEC_NORM_GROUP features
 * (matvec_res, moe_down_res, norm_prep), and the remainder where a DeltaNet layer reads it. */
static matvec_norm norm_args(const gpu_engine *g, int p, CUdeviceptr w)
{
    return (matvec_norm){.w = F32(w), .xw = F16(g->norm_h), .xw_lo = norm_point_lo(g, p) ? F16(g->norm_lo) : NULL,
                         .part = F32(g->norm_part), .ss = F32(g->norm_ss) + p, .n = g->d_embd,
                         .n_part = MATVEC_NORM_PARTS(g->d_embd), .eps = g->base.m->hp.rms_eps};
}

static int matvec_variant(int m) { return m >= 8 ? 3 : m >= 4 ? 2 : m >= 2 ? 1 : 0; }
static int pad16(int n) { return (n + 15) & ~15; }

/* matvec_args for outputs [first, first+n) of op, which share one weight format. */
static matvec_args matvec_args_for(const matmul_op *op, int first, int n)
{
    matvec_args a = {.n_seg = n, .k = op->out[first].w->k, .m = op->m, .ldx = op->ldx,
                     .accumulate = op->accumulate, .row_bytes = op->out[first].w->row_bytes,
                     .x = F16(op->x), .glu_gelu = op->glu_gelu, .push = op->push};
    for (int i = 0; i < n; i++) {
        const matmul_out *o = &op->out[first + i];
        a.seg[i] = (matvec_seg){.w = (const uint8_t *)(uintptr_t)o->w->d, .y = F32(o->y),
                                .bias = o->bias ? F32(o->bias) : NULL, .n = o->w->n, .ldy = o->ldy};
    }
    return a;
}

int gpu_dequant_f16(gpu_engine *g, const gpu_matrix *w, CUdeviceptr dst, const char *what, char *err,
                    size_t errlen)
{
    size_t chunks = (size_t)w->n * (w->k / 32);
    unsigned long long rb = w->row_bytes;
    LAUNCH(g->k.dequant_f16[w->wtype], ((gpu_launch_dims){ceil_div(chunks, 256), 1, 1, 256}), what,
           &(CUdeviceptr){w->d}, &rb, &(int){w->k}, &(int){w->n}, &dst);
    return 0;
}

static int blas_matmul(gpu_engine *g, const matmul_out *o, CUdeviceptr x, int m, int ldx, bool accumulate,
                       const char *what, char *err, size_t errlen)
{
    const gpu_matrix *w = o->w;
    CUdeviceptr wd = w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_F32 ? w->d : w->h16; /* as they lie */
    cudaDataType wt = w->type == GGML_TYPE_F32 ? CUDA_R_32F : CUDA_R_16F, xt = wt;
    cublasComputeType_t compute = w->type == GGML_TYPE_F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (!wd) { /* no resident copy: dequantise into the scratch for this one product */
        wd = g->wdq;
        if (gpu_dequant_f16(g, w, wd, what, err, errlen)) return -1;
    }
    if (w->type == GGML_TYPE_F32) {
        /* cuBLAS multiplies F32 only by F32: the FP16 activations widened (exactly) into x_f32
         * [m][k], columns past ldx zero (they meet the rows' zero padding) */
        size_t n = (size_t)m * w->k;
        LAUNCH(g->k.to_f32_rows, flat_dims(n), what, &x, &ldx, &g->x_f32, &(int){w->k}, &n);
        x = g->x_f32;
        ldx = w->k;
    }
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    /* Row-major y[m][n] = x[m][k] W^T is column-major y^T (n x m) = W (k x n)^T x^T (k x m). */
    CUBLAS_CHECK(cublas.gemm_ex(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, w->n, m, w->k, &alpha,
                                (const void *)(uintptr_t)wd, wt, w->k, (const void *)(uintptr_t)x, xt, ldx, &beta,
                                (void *)(uintptr_t)o->y, CUDA_R_32F, o->ldy, compute, CUBLAS_GEMM_DEFAULT),
                 what);
    if (o->bias) {
        size_t total = (size_t)m * o->ldy;
        LAUNCH(g->k.add_bias, ((gpu_launch_dims){ceil_div(total, 256), 1, 1, 256}), what,
               &(CUdeviceptr){o->y}, &(CUdeviceptr){o->bias}, &(int){o->ldy}, &total);
    }
    return 0;
}

/* One mmq launch of a over a->m activation rows and `rows` padded weight rows, on grid
 * gx x gy of variant v (plus its k splits and their reduce). */
typedef struct mmq_grid {
    unsigned gx, gy;
    int v, rows;
    bool glu;
} mmq_grid;

/* Stages of MMQ_KT inputs in a product over k, and the most splits of them: two a split. */
static int mmq_stages(int k) { return (k / 32 + MMQ_KT / 32 - 1) / (MMQ_KT / 32); }
static int mmq_cap_splits(int splits, int stages)
{
    return splits > stages / 2 ? (stages / 2 > 1 ? stages / 2 : 1) : splits;
}

/* The deterministic engine's k splits of a weight whose grid has gx blocks of weight rows: one
 * block per multiprocessor for one grid row, whatever the number of activation rows, so every
 * row of every step sums the same k ranges in the same order.  (H100, 8B Q4_K_M: against two
 * blocks per multiprocessor, the default path's decode rule, batch 1 the same, batch 32 2.6 %
 * slower, prefill 512 22 % faster (fewer partial sums, longer runs of rows); four: batch 1
 * 1.5 % faster, batch 32 3.4 % and prefill 20 % slower; docs/determinism.md.) */
static int mmq_det_splits(const gpu_engine *g, unsigned gx, int k)
{
    int want = g->n_sm, splits = (int)gx < want ? (want + (int)gx - 1) / (int)gx : 1;
    return mmq_cap_splits(splits, mmq_stages(k));
}

/* The chunks of a deterministic split (mmq_launch's rule under det: mmq_det_splits, rounded to
 * whole stages), which mmq and mmq_narrow share. */
static int mmq_det_split_chunks(const gpu_engine *g, unsigned gx, int k)
{
    int stages = mmq_stages(k), splits = mmq_det_splits(g, gx, k);
    return (stages + splits - 1) / splits * (MMQ_KT / 32);
}

/* Activation rows whose partial sums fit mmq_part with `splits` splits of `rows` rows. */
static int mmq_det_rows(const gpu_engine *g, int splits, int rows)
{
    if (splits <= 1) return 1 << 30;
    size_t per = (size_t)splits * rows * sizeof(float), n = g->mmq_part_bytes / per;
    return n > 0 ? (int)n : 1;
}

/* Blocks of mmq variant v over w that share a multiprocessor, as their shared memory allows
 * (gpu_shared.h MMQ_SM_SMEM, 1 KiB reserved a block; their registers, 256 threads of at most
 * 128, allow two). */
static int mmq_blocks_per_sm(const gpu_matrix *w, int v)
{
    return MMQ_SM_SMEM / ((int)gpu_mmq_smem(w->type, v, (size_t)w->row_bytes) + 1024);
}

/* A prompt-sized product's k splits where its grid is past one wave: two where its blocks have
 * a multiprocessor each (the formats of 176 bytes or more a stage row at 64 rows) and halves
 * cut the waves' time by a quarter or more (whole waves; a block of half the k, half the
 * time), i.e. grids of 1-1.5 waves: gpt-oss's Q8_0 O product, 184 blocks of 132 places in 2
 * waves, as 368 halves in 3 waves of half the time.  Its partial sums and reduce are the cost.
 * (Measured with two blocks a multiprocessor too, on 32-row tiles: docs/benchmarks.md "The
 * dense Q8_0 products' waves".) */
static int mmq_wave_splits(const gpu_matrix *w, int v, int blocks, int n_sm)
{
    if (mmq_blocks_per_sm(w, v) != 1) return 1;
    int w1 = (blocks + n_sm - 1) / n_sm, w2 = (2 * blocks + n_sm - 1) / n_sm;
    return 2 * w2 <= 3 * w1 ? 2 : 1;
}

static int mmq_launch(gpu_engine *g, matvec_args *a, const gpu_matrix *w, mmq_grid gr, const char *what, char *err,
                      size_t errlen)
{
    int chunks = w->k / 32, stage = MMQ_KT / 32, stages = mmq_stages(w->k);
    int splits = 1, want = (a->m <= 64 ? 2 : 1) * g->n_sm, blocks = (int)(gr.gx * gr.gy);
    if (g->det) {
        a->split_chunks = mmq_det_split_chunks(g, gr.gx, w->k); /* the callers keep a->m within mmq_det_rows */
    } else {
        if (blocks < want) splits = (want + blocks - 1) / blocks;
        else if (a->m > 64 && !a->tiles) splits = mmq_wave_splits(w, gr.v, blocks, g->n_sm);
        splits = mmq_cap_splits(splits, stages);
        while (splits > 1 && (size_t)splits * a->m * gr.rows * sizeof(float) > g->mmq_part_bytes) splits--;
        a->split_chunks = (stages + splits - 1) / splits * stage;
    }
    splits = (chunks + a->split_chunks - 1) / a->split_chunks;
    a->part = F32(g->mmq_part);
    a->part_ld = gr.rows;
    const gpu_fn *fn = gr.glu ? &g->k.mmq_glu[w->wtype][gr.v] : &g->k.mmq[w->wtype][gr.v];
    void *args[] = {a};
    if (gpu_launch_smem(fn, (gpu_launch_dims){gr.gx, gr.gy, (unsigned)splits, GPU_MMQ_THREADS},
                        gpu_mmq_smem(w->type, gr.v, (size_t)a->row_bytes), g->stream, args, what, err, errlen))
        return -1;
    if (splits > 1) {
        int is_glu = gr.glu;
        LAUNCH(g->k.mmq_reduce, ((gpu_launch_dims){ceil_div((size_t)a->m * gr.rows, 256), 1, 1, 256}), what, a,
               &is_glu, &splits);
    }
    return 0;
}

/* Whether a product of m rows over w takes mmq_narrow (one launch, no reduce) rather than mmq
 * and its reduce: the deterministic engine's 1..MMQN_MAX_M rows (mmq's sums), and the default
 * engine's 2..MMQN_MAX_M (batch-1 takes the matvec kernels, path_for), whose splits are its own
 * (mmqn_fast_split_chunks). */
static bool mmq_narrow_format(const gpu_engine *g, const gpu_matrix *w)
{
    return w->k <= MMQN_MAX_K && w->wtype >= 0 && g->k.mmq_narrow[w->wtype].f && gpu_mmq_serves(&g->k, w->wtype, w->k);
}
/* (Dense products of rows that end in a partial stage take it too, as the grouped MoE launches
 * do for gpt-oss's 2,880 and GLM-4.5-Air's 1,408 inputs -- mmq's bits with the same splits, tested
 * -- since 2026-11-28: DeepSeek-V2-Lite's dense Q5_0 down rows of 10,944 at B=8 took mmq's 15 k
 * splits and mmq_reduce; docs/benchmarks.md "DeepSeek-V2-Lite's batched decode: act_lo in the
 * narrow pass, ...") */
static bool mmq_narrow_serves(const gpu_engine *g, const gpu_matrix *w, int m)
{
    return (g->det || m > 1) && m <= MMQN_MAX_M && mmq_narrow_format(g, w);
}

/* The chunks of a default-engine mmq_narrow split over `items` (16-row tile, gate/up) items:
 * k split until the launch has about MMQN_FAST_ITEMS items (a warp's work each) a
 * multiprocessor, at least two stages a split (mmq_cap_splits).  Not the deterministic rule,
 * whose splits follow the shape alone.  Measured on the H100, Llama-3.1-8B Q4_K_M, B=2..8
 * decode: 32 items 1-2 % faster than 16 and 2-3 % than 8 (~the deterministic rule's);
 * docs/benchmarks.md "Products of 2..8 rows through mmq_narrow". */
#define MMQN_FAST_ITEMS 32
static int mmqn_fast_split_chunks(const gpu_engine *g, int items, int k)
{
    int stages = mmq_stages(k), want = MMQN_FAST_ITEMS * g->n_sm;
    int splits = mmq_cap_splits(items < want ? (want + items - 1) / items : 1, stages);
    return (stages + splits - 1) / splits * (MMQ_KT / 32);
}

/* mmq_narrow over a (a->m <= MMQN_MAX_M rows), whose mmq grid would have gx blocks of weight
 * rows and tiles 16-row tiles: a block takes every split of about MMQN_WARPS / splits tiles
 * (warps = items where they are fewer), its warps walking the rest.  post: the QKV epilogue
 * (RoPE, the K/V stores) with the launch's first segment as role0.  slots: grid y, 1, or a
 * grouped MoE launch's tile list (a->tiles; its live tiles are known on the device only, so the
 * splits count every slot). */
static int mmq_narrow(gpu_engine *g, const matvec_args *a, const gpu_matrix *w, unsigned gx, int tiles, int slots,
                      bool glu, const qkv_post_args *post, int role0, const char *what, char *err, size_t errlen)
{
    matvec_rope_args r = {.mv = *a, .role0 = post ? role0 : 0};
    if (post) r.post = *post;
    r.mv.split_chunks = g->det ? mmq_det_split_chunks(g, gx, w->k)
                               : mmqn_fast_split_chunks(g, (glu ? 2 : 1) * tiles * slots, w->k);
    int n_split = (w->k / 32 + r.mv.split_chunks - 1) / r.mv.split_chunks, per_tile = (glu ? 2 : 1) * n_split;
    int tpb = per_tile < MMQN_WARPS ? MMQN_WARPS / per_tile : 1, items = tpb * per_tile;
    int warps = items < MMQN_WARPS ? items : MMQN_WARPS;
    /* a->x_lo: the act_lo form (narrow_lo_serves), two tiles of partials an item */
    const gpu_fn *fn = a->x_lo ? &g->k.mmq_narrow_lo[w->wtype]
                       : glu   ? &g->k.mmq_narrow_glu[w->wtype]
                               : &g->k.mmq_narrow[w->wtype];
    void *args[] = {&r, &n_split, &tpb};
    return gpu_launch_smem(fn, (gpu_launch_dims){ceil_div(tiles, tpb), (unsigned)slots, 1, 32u * warps},
                           gpu_mmqn_smem(w->type, warps, (a->x_lo ? 2 : 1) * items, (size_t)w->row_bytes), g->stream,
                           args, what, err, errlen);
}

/* Whether outputs [first, first+n) of op (one weight format, all among its x_lo outputs) take
 * mmq_narrow's act_lo form: W x and W x_lo in one pass over W (mmq_narrow_lo_<type>), the bits of
 * the pass over x and the second pass over x_lo that matmul would launch (the same tiles, so the
 * same splits: mmqn_fast_split_chunks / mmq_det_split_chunks).  A batch of 2..8 tokens' Wq /
 * Wkv_a (latent attention) or, where their format runs allow, a DeltaNet layer's projections. */
static bool narrow_lo_serves(const gpu_engine *g, const matmul_op *op, int first, int n)
{
    const gpu_matrix *w = op->out[first].w;
    return op->x_lo && first + n <= op->n_lo && !op->post && mmq_narrow_serves(g, w, op->m) && w->wtype >= 0 &&
           g->k.mmq_narrow_lo[w->wtype].f;
}

/* Outputs [first, first+n) of op (one weight format) with the mmq kernel; glu: the two
 * outputs are gate and up, and ff_h gets fp16(silu(gate) * up); lo: with their x_lo products
 * (narrow_lo_serves).  Prefill-sized products take
 * blocks of fewer activation rows while the grid would not cover the GPU; then the k range is
 * split over grid z until it does (twice over for decode-sized products, which stream the
 * weights and want loads in flight everywhere), as far as the partial-sum buffer holds the
 * splits.  Measured on the H100: a separate reduce launch beat the last split adding the
 * partials itself, and more, partial waves beat fewer whole ones. */
static int mmq(gpu_engine *g, const matmul_op *op, int first, int n, bool glu, bool lo, char *err, size_t errlen)
{
    const gpu_matrix *w = op->out[first].w;
    matvec_args a = matvec_args_for(op, first, n);
    if (lo) a.x_lo = F16(op->x_lo), a.lo_segs = op->n_lo - first;
    int v = op->m > 32 ? 2 : op->m > 16 ? 1 : 0, rows = 0;
    /* (64-row tiles of the formats of 176 bytes or more a stage row -- Q8_0, Q6_K, Q5_K, Q5_0,
     * Q5_1 -- take a multiprocessor each, yet 32-row ones two a multiprocessor measured slower
     * on the 8B's Q6_K products: docs/benchmarks.md "The dense Q8_0 products' waves".) */
    for (int i = first; i < first + n; i++) rows += pad16(op->out[i].w->n);
    /* glu: a block takes GPU_MMQ_ROWS / 2 features of gate and of up */
    unsigned gx = glu ? ceil_div(w->n, GPU_MMQ_ROWS / 2) : ceil_div(rows, GPU_MMQ_ROWS);
    while (op->m > 64 && v > 1 && gx * ceil_div(op->m, 16u << v) < (unsigned)g->n_sm) v--;
    if (glu) a.yh = F16(g->ff_h);
    if (mmq_narrow_serves(g, w, op->m))
        return mmq_narrow(g, &a, w, gx, glu ? pad16(w->n) / 16 : rows / 16, 1, glu, op->post, MATVEC_Q + first,
                          op->what, err, errlen);
    if (!g->det) {
        mmq_grid gr = {gx, ceil_div(op->m, 16u << v), v, rows, glu};
        return mmq_launch(g, &a, w, gr, op->what, err, errlen);
    }
    /* deterministic: the splits are fixed, so the rows go in runs whose partials fit */
    int run = mmq_det_rows(g, mmq_det_splits(g, gx, w->k), rows);
    for (int m0 = 0; m0 < op->m; m0 += run) {
        matvec_args r = a;
        r.m = op->m - m0 < run ? op->m - m0 : run;
        r.x = a.x + (size_t)m0 * a.ldx;
        for (int s = 0; s < r.n_seg; s++)
            if (r.seg[s].y) r.seg[s].y = a.seg[s].y + (size_t)m0 * a.seg[s].ldy;
        if (glu) r.yh = a.yh + (size_t)m0 * a.seg[0].ldy;
        int rv = r.m > 32 ? 2 : r.m > 16 ? 1 : 0; /* the tile height changes no row's sums */
        mmq_grid gr = {gx, ceil_div(r.m, 16u << rv), rv, rows, glu};
        if (mmq_launch(g, &r, w, gr, op->what, err, errlen)) return -1;
    }
    return 0;
}

/* The wide models' one-row products: KS (2 or 4) where a plain one-row launch of `rows` rows
 * of k in format t runs faster as matvec_wide<KS>_<type> (kernels/matvec.cuh matvec_wide_body),
 * 0 where the one-row layout stays.  Measured alone (scripts/mvbench.cu, docs/benchmarks.md "Two
 * rows a warp over half of k"): the split pays with the rows, from n = 5,120 (Gemma 4's QKV +11 %,
 * O +22 %, Q4_K / Q6_K down +10 / +17 %, Gemma-3-12B's QKV +30 %, the 70B shape's O / down +30 /
 * +44 %) and not at n = 4,096 (the 8B: -4..+3 %); past ~32k rows (the LM heads: many waves of
 * blocks already) it was not measured, so they keep their layout.  And it pays where each warp's
 * part of k is close to whole 32-chunk steps of its lanes: Gemma 4's k of 5,376 (168 chunks) in
 * quarters leaves the second step a third full and lost 7-9 %, in halves (84: 2.6 steps of 3)
 * gained 11 %.  So: the split with the fuller steps (at least 85 %; ties to quarters, which won
 * wherever both were whole), among the formats' kernels (GPU_MATVEC_WIDE_KERNELS). */
#define MATVEC_WIDE_MIN_ROWS 5120
#define MATVEC_WIDE_MAX_ROWS 32768
static int matvec_wide_split(const gpu_engine *g, int t, int rows, int k)
{
    if (t < 0 || rows < MATVEC_WIDE_MIN_ROWS || rows > MATVEC_WIDE_MAX_ROWS) return 0;
    int best = 0, best_part = 0, best_steps = 1; /* the fill of the best so far: best_part / (32 best_steps) */
    for (int ks = 2; ks <= 4; ks *= 2) {
        if (!g->k.matvec_wide[t][ks / 2 - 1].f) continue;
        const int part = k / 32 / ks, steps = (int)ceil_div(part, 32); /* a warp's chunks, its lanes' steps */
        if (part * 100 < 85 * 32 * steps || part * best_steps < best_part * steps) continue;
        best = ks, best_part = part, best_steps = steps;
    }
    return best;
}

/* matvec_one_<type> where a plain one-row product of one segment can take it (kernels/matvec.cuh
 * matvec_one_body: matvec_<type>_1's sums and bits in 4-warp blocks; the batch-1 LM head, Q6_K in
 * the Q4_K_M files: +4 % / +11 % on the 8B / 1.5B heads alone), else NULL.  Not for the dp4a or
 * x_lo passes (other kernels), the carried norms' products, qkv_post or a tensor-parallel push
 * (their epilogues). */
static const gpu_fn *matvec_one_fn(const gpu_engine *g, const matmul_op *op, int t, int n_seg, bool other_pass)
{
    if (t < 0 || n_seg != 1 || op->m != 1 || other_pass || op->norm || op->post || op->push.epoch) return NULL;
    return g->k.matvec_one[t].f ? &g->k.matvec_one[t] : NULL;
}

/* Whether x_lo's products can share x's pass (matvec_args.x_lo): one token, every output on
 * the FP16 matvec kernels of row_dots (not dp4a, not the tensor-core row_dots_mma of IQ4_XS,
 * Q2_K and Q3_K at one row, whose sums would differ from the MT = 2 kernel's), nothing added
 * to y before (y + W x + W x_lo would round apart from (y + W x) + W x_lo) and no epilogue of
 * its own but a carried norm's scale (norm NORM_IN: x and x_lo are the norm's input and its
 * remainder, matvec_lo_nin_<type>, whose formats are a subset of these). */
/* Whether w's one-row product can take the remainder row in its pass over x (the two-row
 * matvec), and, lo_nin_serves, over a carried norm's input (matvec_lo_nin_<type>). */
static bool lo_pass_serves(const gpu_engine *g, const gpu_matrix *w)
{
    return path_for(g, w, 1) == PATH_MATVEC && w->type != GGML_TYPE_IQ4_XS && w->type != GGML_TYPE_Q2_K &&
           w->type != GGML_TYPE_Q3_K;
}

static bool lo_nin_serves(const gpu_engine *g, const gpu_matrix *w)
{
    return lo_pass_serves(g, w) && w->wtype >= 0 && g->k.matvec_lo_nin[w->wtype].f;
}

static bool lo_fusable(const gpu_engine *g, const matmul_op *op)
{
    if (!op->x_lo || op->m != 1 || op->accumulate || op->post || (op->norm && op->norm != NORM_IN)) return false;
    for (int i = 0; i < op->n_out; i++) {
        const gpu_matrix *w = op->out[i].w;
        if (use_dp4a(g, op, w) || !(op->norm ? lo_nin_serves(g, w) : lo_pass_serves(g, w))) return false;
    }
    return true;
}

/* The batch-1 QKV product over a carried norm whose outputs are two runs of formats with a
 * pair kernel (GPU_MATVEC_PAIR_KERNELS: Q4_K or Q5_K, then a Q6_K V): one launch over both,
 * each block one format's, the same sums and epilogues as a launch a run.  1: launched, 0: not
 * this op's case (matmul launches a run at a time), -1: a launch error. */
static int matvec_pair(gpu_engine *g, const matmul_op *op, char *err, size_t errlen)
{
    if (op->m != 1 || op->norm != NORM_IN || op->accumulate || op->x_lo || op->res_gate || op->n_out < 2) return 0;
    int j = 1;
    while (j < op->n_out && op->out[j].w->type == op->out[0].w->type) j++;
    if (j == op->n_out) return 0;
    int rows_a = 0, rows_b = 0;
    for (int s = 0; s < op->n_out; s++) {
        const gpu_matrix *w = op->out[s].w;
        if (w->type != op->out[s < j ? 0 : j].w->type || path_for(g, w, 1) != PATH_MATVEC || use_dp4a(g, op, w))
            return 0;
        *(s < j ? &rows_a : &rows_b) += w->n;
    }
    const int p = gpu_matvec_pair(&g->k, op->out[0].w->wtype, op->out[j].w->wtype);
    if (p < 0) return 0;
    matvec_args a = matvec_args_for(op, 0, j), b = matvec_args_for(op, j, op->n_out - j);
    a.norm = b.norm = norm_args(g, op->norm_p, op->norm_w);
    b.block0 = (int)ceil_div(rows_a, 8);
    const gpu_launch_dims d = {1, b.block0 + ceil_div(rows_b, 8), 1, 256};
    if (op->post) {
        matvec_rope_pair_args r = {.a = {.mv = a, .post = *op->post, .role0 = MATVEC_Q},
                                   .b = {.mv = b, .post = *op->post, .role0 = MATVEC_Q + j}};
        LAUNCH(g->k.matvec_rope_norm_pair[p], d, op->what, &r);
    } else {
        matvec_pair_args r = {.a = a, .b = b};
        LAUNCH(g->k.matvec_nin_pair[p], d, op->what, &r);
    }
    return 1;
}

static int matmul(gpu_engine *g, const matmul_op *op, char *err, size_t errlen)
{
    bool q8_ready = false;
    const bool lo_fused = lo_fusable(g, op);
    const int paired = matvec_pair(g, op, err, errlen); /* (never with x_lo: lo_fused's case) */
    if (paired) return paired < 0 ? -1 : 0;
    if (op->res_gate && (op->norm != NORM_OUT || op->m != 1)) { /* only matvec_res applies the gate */
        snprintf(err, errlen, "%s: a gated residual add outside the batch-1 step's carried norm", op->what);
        return -1;
    }
    int lo_done = 0; /* outputs [0, lo_done): their x_lo products rode on x's pass (narrow_lo_serves) */
    for (int i = 0; i < op->n_out;) { /* runs of outputs with one weight format share a launch */
        int j = i + 1;
        while (j < op->n_out && op->out[j].w->type == op->out[i].w->type) j++;
        matmul_path path = path_for(g, op->out[i].w, op->m);
        if (path == PATH_MMQ) {
            const bool lo = !lo_fused && i == lo_done && narrow_lo_serves(g, op, i, j - i);
            if (lo) lo_done = j;
            if (mmq(g, op, i, j - i, false, lo, err, errlen)) return -1;
        } else if (path == PATH_BLAS) {
            for (int s = i; s < j; s++)
                if (blas_matmul(g, &op->out[s], op->x, op->m, op->ldx, op->accumulate, op->what, err, errlen)) return -1;
        } else {
            int v = lo_fused ? 1 : matvec_variant(op->m), rows = 0; /* x_lo: the two-row kernel */
            matvec_args a = matvec_args_for(op, i, j - i);
            if (lo_fused) a.x_lo = F16(op->x_lo), a.lo_segs = op->n_lo - i; /* (<= 0: none of this run's) */
            for (int s = i; s < j; s++) rows += op->out[s].w->n;
            gpu_launch_dims d = {ceil_div(op->m, 1u << v), ceil_div(rows, 8 * (lo_fused ? MATVEC_LO_ROWS : 1)), 1, 256};
            const int t = op->out[i].w->wtype;
            const bool q8 = use_dp4a(g, op, op->out[i].w);
            if (q8 && dp4a_input(g, op, &q8_ready, &a, err, errlen)) return -1;
            if (op->norm) a.norm = norm_args(g, op->norm_p, op->norm_w); /* never with q8 (gpu_norms_carried) */
            a.res_gate = op->res_gate ? F32(op->res_gate) : NULL;
            /* (the plain one-row product only: the norms' and QKV epilogues want their 8 rows a block) */
            const int wide = v == 0 && !g->det && !lo_fused && !q8 && !op->norm && !op->post && !op->push.epoch
                                 ? matvec_wide_split(g, t, rows, a.k)
                                 : 0;
            const gpu_fn *one = wide ? NULL : matvec_one_fn(g, op, t, j - i, q8 || lo_fused);
            if (op->post) { /* m == 1: the matvec path (path_for) */
                matvec_rope_args r = {.mv = a, .post = *op->post, .role0 = MATVEC_Q + i};
                const gpu_fn *fn = q8 ? &g->k.matvec_rope_dp4a[t] : op->norm ? &g->k.matvec_rope_norm[t] : &g->k.matvec_rope[t];
                LAUNCH(*fn, d, op->what, &r);
            } else if (wide) {
                d = (gpu_launch_dims){1, ceil_div(rows, MATVEC_WIDE_ROWS), 1, 32 * MATVEC_WIDE_WARPS};
                LAUNCH(g->k.matvec_wide[t][wide / 2 - 1], d, op->what, &a);
            } else if (one) {
                d = (gpu_launch_dims){1, ceil_div(rows, MATVEC_ONE_WARPS), 1, 32 * MATVEC_ONE_WARPS};
                LAUNCH(*one, d, op->what, &a);
            } else {
                const gpu_fn *fn = q8                     ? &g->k.matvec_dp4a[t]
                                   : lo_fused && op->norm ? &g->k.matvec_lo_nin[t]
                                   : op->norm == NORM_OUT ? &g->k.matvec_res[t]
                                   : op->norm == NORM_IN  ? &g->k.matvec_nin[t]
                                                          : &g->k.matvec[t][v];
                LAUNCH(*fn, d, op->what, &a);
            }
        }
        i = j;
    }
    if (op->x_lo && !lo_fused && lo_done < op->n_lo) { /* W x_lo added to what the pass over x wrote */
        if (op->norm) { /* a carried norm's remainder is scaled: only matvec_lo_nin reads it (gpu_norms_carried) */
            snprintf(err, errlen, "%s: a carried norm's remainder without its one-pass product", op->what);
            return -1;
        }
        /* outputs [lo_done, n_lo): the same format runs as over [0, n_lo) (lo_done ends a run) */
        matmul_op rest = *op;
        for (int s = lo_done; s < op->n_lo; s++) rest.out[s - lo_done] = op->out[s];
        rest.x = op->x_lo, rest.x_lo = 0, rest.n_out = op->n_lo - lo_done, rest.accumulate = true, rest.x_q8 = false;
        return matmul(g, &rest, err, errlen);
    }
    return 0;
}

/* The fused kernels (glu_*, mmq_glu_*) apply SiLU or, glu_gelu, GeGLU: either activation is
 * fused wherever gate and up share a format and a kernel path. */
bool gpu_glu_fused(const gpu_engine *g, const gpu_matrix *gate, const gpu_matrix *up, int T)
{
    matmul_path path = path_for(g, gate, T);
    return gate->type == up->type && (path == PATH_MMQ || path == PATH_MATVEC);
}

bool gpu_ffn_fused(const gpu_engine *g, const gpu_layer *L, int T)
{
    return gpu_glu_fused(g, &L->w_gate, &L->w_up, T);
}

/* ff_h = fp16(act(gate h) * up h), act silu or gelu_tanh, in rows of the layer's own width:
 * the dense FFN's matrices, or (shexp) the shared expert's; either reads the carried
 * feed-forward norm where the step carries it */
static int gated_ffn(gpu_engine *g, const gpu_layer *L, bool shexp, int T, const char *what, char *err, size_t errlen)
{
    const gpu_matrix *gate = shexp ? &L->ffn_gate_shexp : &L->w_gate, *up = shexp ? &L->ffn_up_shexp : &L->w_up;
    const bool geglu = !shexp && L->geglu;
    const int np = norm_point(g, 2 * (int)(L - g->layers) + 1, T); /* the feed-forward norm's */
    matmul_op op = {.out = {{gate, g->gate, 0, L->d_ff}, {up, g->up, 0, L->d_ff}}, .n_out = 2,
                    .x = np >= 0 ? g->norm_h : g->act_h, .m = T, .ldx = g->d_embd,
                    .x_q8 = !shexp && norm_q8(g, T, g->d_embd), .glu_gelu = geglu, .what = what};
    if (gpu_glu_fused(g, gate, up, T)) {
        if (path_for(g, gate, T) == PATH_MMQ) return mmq(g, &op, 0, 2, true, false, err, errlen);
        int v = matvec_variant(T);
        matvec_args a = matvec_args_for(&op, 0, 2);
        a.yh = F16(g->ff_h);
        bool q8 = use_dp4a(g, &op, gate), ready = false;
        if (q8 && dp4a_input(g, &op, &ready, &a, err, errlen)) return -1;
        if (np >= 0) a.norm = norm_args(g, np, 0);
        const gpu_fn *fn = q8 ? &g->k.glu_dp4a[gate->wtype] : np >= 0 ? &g->k.glu_norm[gate->wtype] : &g->k.glu[gate->wtype][v];
        LAUNCH(*fn, ((gpu_launch_dims){ceil_div(T, 1u << v), ceil_div(gate->n, 8), 1, 256}), what, &a);
        return 0;
    }
    if (matmul(g, &op, err, errlen)) return -1;
    size_t n = (size_t)T * L->d_ff;
    const gpu_fn *act = geglu ? &g->k.geglu : &g->k.swiglu;
    LAUNCH(*act, flat_dims(n), what, &g->gate, &g->up, &g->ff_h, &n);
    return 0;
}

/* rmsnorm of rows of x (picked by idx when non-zero) into FP16 yh and/or FP32 y (ylo: yh's
 * rounding remainder, kernels/elementwise.cuh). */
typedef struct norm_op {
    CUdeviceptr x, idx, w, y, yh, ylo;
    int idx_stride, rows, n;
    bool q8; /* yh also as the q8 row in xq/xd (norm_q8: one row) */
} norm_op;

/* (rmsnorm takes the first nine arguments; rmsnorm_q8 the q8 row's two more) */
static int rmsnorm(gpu_engine *g, const norm_op *op, const char *what, char *err, size_t errlen)
{
    float eps = g->base.m->hp.rms_eps;
    int n = op->n, stride = op->idx_stride;
    unsigned threads = n >= 1024 ? 1024 : n >= 256 ? 256 : 32;
    LAUNCH(*(op->q8 ? &g->k.rmsnorm_q8 : &g->k.rmsnorm), ((gpu_launch_dims){(unsigned)op->rows, 1, 1, threads}), what,
           &(CUdeviceptr){op->x}, &(CUdeviceptr){op->idx}, &stride, &(CUdeviceptr){op->w}, &(CUdeviceptr){op->y},
           &(CUdeviceptr){op->yh}, &(CUdeviceptr){op->ylo}, &n, &eps, &g->xq, &g->xd);
    return 0;
}

/* Prompt spans as flash tiles (tensor cores, straight into act_h), then the listed tokens
 * (decode) through split-K partials and their combine: see gpu_attn_plan. */
static int attention(gpu_engine *g, int il, const gpu_attn_plan *ap, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const gpu_layer *L = &g->layers[il];
    const int window = L->window;
    const float *sinks = L->attn_sinks ? F32(L->attn_sinks) : NULL;
    /* latent rows: the scores of the expanded form's heads, times YaRN's mscale^2 */
    const float scale = L->mla ? hp->attn_mscale2 / sqrtf((float)(hp->mla_nope + hp->n_rot))
                               : 1.0f / sqrtf(hp->attn_scalar);
    const int32_t *kpos = I32(g->in_d + (g->bidir ? g->in.kpos : g->in.pos)); /* what bounds each token's keys */
    /* the layer's own region of the caches (or its kv_source's): one layer of blocks there */
    if (ap->n_tiles > 0) {
        flash_args fa = {
            .q = F32(g->q), .kc = F16(L->kc), .vc = F16(L->vc), .seq = I32(g->in_d + g->in.seq),
            .pos = kpos, .tables = I32(gpu_layer_tables(g, L)), .tiles = I32(g->in_d + g->in.ftiles),
            .out = F16(g->act_h), .n_layer = 1, .layer = 0,
            .n_head = hp->n_head, .n_kv = L->n_kv, .table_width = g->table_width, .window = window,
            .scale = L->mla ? (float)M_LOG2E * scale : (float)(M_LOG2E / sqrt((double)hp->attn_scalar)), .sinks = sinks,
        };
        /* pack_step makes tiles only when gpu_flash_q_tokens() allows every layer: head_dim 64,
         * 128, 256 or 512, or latent rows of 512 + 64 (flash_attn_mla) */
        if (gpu_launch_flash(&g->k, &fa, L->hd, (unsigned)ap->n_tiles, g->stream, "attention", err, errlen)) return -1;
    }
    if (ap->n_dec == 0) return 0;
    /* the layer's kernel (gpu_layer.att_dec) and that kernel's key splits */
    int group = hp->n_head / L->n_kv, gb = L->hd > 256 ? GPU_ATT_GB_HD512 : 8, hd = L->hd;
    int n_split = L->att_dec ? ap->n_split : ap->n_split_part;
    int nh = hp->n_head;
    while (group % gb) gb--;
    CUdeviceptr list = ap->dec_listed ? g->in_d + g->in.dtok : 0;
    attn_args a = {
        .q = F32(g->q), .kc = F16(L->kc), .vc = F16(L->vc), .seq = I32(g->in_d + g->in.seq),
        .pos = kpos, .tables = I32(gpu_layer_tables(g, L)), .n_layer = 1,
        .layer = 0, .n_head = nh, .n_kv = L->n_kv, .table_width = g->table_width,
        .hd = hd, .gb = gb, .n_split = n_split, .window = window,
        .scale = scale, .part_o = F32(g->part_o), .part_ml = F32(g->part_ml),
        .tok_list = list ? I32(list) : NULL, .max_split = g->att_max_split, .old_kv = ap->old_kv,
        .out = F16(g->act_h), .sinks = sinks,
    };
    unsigned n = (unsigned)ap->n_dec;
    if (L->att_dec) { /* tensor cores, one block per KV head and split (kernels/attn_decode.cuh) */
        /* head_dim 256: the last split of a token merges them all (the counters); fewer splits
         * where the batch fills the GPU by itself, never under --deterministic
         * (gpu_attn_dec_batch_split).  Below: attn_decode_combine. */
        a.counts = hd >= 256 ? (unsigned *)(uintptr_t)g->att_counts : NULL;
        a.batch_split = gpu_attn_dec_batch_split(g->n_sm, gpu_attn_dec_units(nh, L->n_kv, hd), (int)n, g->att_max_split,
                                                 g->det);
        if (gpu_launch_decode(&g->k, &a, hd, n, g->stream, "attention", err, errlen)) return -1;
        if (n_split > 1 && !a.counts) /* with one, every token wrote its own output (a graph of short contexts) */
            LAUNCH(g->k.attn_decode_combine, ((gpu_launch_dims){n, (unsigned)nh, 1, GPU_ATT_DEC_COMBINE_SG * hd}),
                   "attention", &a);
        return 0;
    }
    LAUNCH(*gpu_attn_partial_fn(&g->k, hd), ((gpu_launch_dims){n, (unsigned)(nh / gb), (unsigned)n_split, 128}), "attention", &a);
    LAUNCH(g->k.attn_combine, ((gpu_launch_dims){n, (unsigned)nh, 1, hd >= 128 ? 128 : 32}), "attention",
           &g->part_o, &g->part_ml, &g->act_h, &nh, &n_split, &hd, &list, &(CUdeviceptr){L->attn_sinks});
    return 0;
}

/* x += rmsnorm(post) * post_norm over T rows: the end of a sandwich-norm block whose output
 * (before its norm) is in g->post; normed in place, then added to x as one row of
 * T * n_embd by add_bias. */
static int add_post_normed(gpu_engine *g, CUdeviceptr post_norm, int T, const char *what, char *err, size_t errlen)
{
    norm_op n = {.x = g->post, .w = post_norm, .y = g->post, .rows = T, .n = g->d_embd};
    if (rmsnorm(g, &n, what, err, errlen)) return -1;
    int width = T * g->d_embd;
    size_t total = (size_t)width;
    LAUNCH(g->k.add_bias, ((gpu_launch_dims){ceil_div(total, 256), 1, 1, 256}), what, &g->x, &g->post, &width, &total);
    return 0;
}

/* x += W h under tensor parallelism, W's inputs (Wo's heads, Wdown's FFN units) split across the
 * GPUs: this GPU's product over its inputs into tp_part, the GPUs' products summed and added to
 * x (gpu_tp_residual_add).  Every GPU then holds the same x (the sum is the same on every
 * rank), so the next layer's norm and the LM head need no further exchange.  (Sandwich norms
 * and output biases are refused before a model is split: model/tp_shard.h TP_FEATURES.) */
static int residual_add_split(gpu_engine *g, matmul_op *op, int T, char *err, size_t errlen)
{
    op->out[0].y = g->tp_part;
    op->accumulate = false;
    /* a carried norm's NORM_OUT work moves to the add after the sum (the partial is not x) */
    const bool norm_out = op->norm == NORM_OUT;
    const matvec_norm nm = norm_out ? norm_args(g, op->norm_p, op->norm_w) : (matvec_norm){0};
    op->norm = NORM_NONE;
    /* One token on the plain one-row kernel (matmul: the matvec path, not dp4a, no remainder
     * pass, one output, not the wide layout): it pushes its sums into the peers' LL lines itself
     * where the sum takes them, and the sum only waits (gpu_shared.h matvec_ll_push).  Two H200s,
     * 8B shape: B=1 +2.0 %.  The wide rows keep matvec_wide and the sum's own push: the 70B
     * class's O and down (8,192 rows) on matvec_q4_k_1 / matvec_q6_k_1 with the push lost 5.5 %
     * at B=1 (docs/benchmarks.md "The one-row residual products push their own sums") */
    const size_t count = (size_t)T * g->d_embd;
    const gpu_matrix *w = op->out[0].w;
    const bool pushed = T == 1 && op->n_out == 1 && !op->x_lo && path_for(g, w, 1) == PATH_MATVEC &&
                        !use_dp4a(g, op, w) && !matvec_wide_split(g, w->wtype, w->n, w->k) &&
                        gpu_tp_ll_push(g, count, &op->push);
    if (matmul(g, op, err, errlen)) return -1;
    return gpu_tp_residual_add(g, count, norm_out ? &nm : NULL, pushed, op->what, err, errlen);
}

/* The end of a residual block, whose one-output matmul op reads the block's FP16 result:
 * x += W h, or in a sandwich-norm layer x += rmsnorm(W h) * post_norm (W h into g->post). */
static int residual_add(gpu_engine *g, matmul_op *op, CUdeviceptr post_norm, int T, char *err, size_t errlen)
{
    if (g->tp_rank >= 0) return residual_add_split(g, op, T, err, errlen);
    if (!post_norm) return matmul(g, op, err, errlen);
    op->out[0].y = g->post;
    op->accumulate = false;
    if (matmul(g, op, err, errlen)) return -1;
    return add_post_normed(g, post_norm, T, op->what, err, errlen);
}

/* Whether norm point p (2 il: layer il's attention norm, 2 il + 1: its feed-forward norm) is
 * written by the sandwich-norm block end before it (block_end: post_norm_add) rather than a
 * launch of its own: a plain rmsnorm into act_h (no q8 row, FP32 copy or remainder) in a step
 * whose norms are not carried by the products, right after a block that ends in a post-norm
 * (Gemma's sandwich; nothing between: no per-layer embedding). */
static bool sandwich_carries(const gpu_engine *g, int p, int T)
{
    const model *m = g->base.m;
    const int il = p / 2;
    if (p <= 0 || il >= m->hp.n_layer || g->tp_rank >= 0 || norm_point(g, p, T) >= 0 || norm_q8(g, T, m->hp.n_embd))
        return false;
    const gpu_layer *L = &g->layers[il];
    if (p % 2) /* after attention_softmax's post-norm: a dense GLU feed-forward's norm */
        return L->attn_post_norm && L->lin < 0 && !L->mla && !L->post_ln && !L->mlp && L->ffn_norm &&
               m->layers[il].recipe.ffn == ARCH_FFN_GLU;
    const gpu_layer *prev = &g->layers[il - 1]; /* after the dense feed-forward's post-norm */
    return prev->ffn_post_norm && !prev->mlp && !prev->post_ln && m->layers[il - 1].recipe.ffn == ARCH_FFN_GLU &&
           m->hp.n_embd_ple == 0 && L->attn_norm && L->lin < 0 && !L->mla && !L->post_ln;
}

/* The end of a residual block whose next norm is norm point p: x += W h (residual_add), or in a
 * sandwich-norm layer x = (x + rmsnorm(W h) * post_norm) * scale (scale: the layer's output
 * scale where the caller folds it, else 1) and, where it rides along (sandwich_carries), norm p
 * into act_h: one post_norm_add launch after the product into g->post instead of three or four
 * (the batch-1 step of Gemma 3 12B had 13 launches a layer). */
static int block_end(gpu_engine *g, matmul_op *op, CUdeviceptr post_norm, float scale, int p, int T, char *err,
                     size_t errlen)
{
    if (!post_norm || g->tp_rank >= 0) return residual_add(g, op, post_norm, T, err, errlen);
    op->out[0].y = g->post;
    op->accumulate = false;
    if (matmul(g, op, err, errlen)) return -1;
    CUdeviceptr next = 0; /* none: the norm after has a launch of its own (or there is none) */
    if (sandwich_carries(g, p, T)) next = p % 2 ? g->layers[p / 2].ffn_norm : g->layers[p / 2].attn_norm;
    int n = g->d_embd;
    float eps = g->base.m->hp.rms_eps;
    unsigned threads = n >= 1024 ? 1024 : n >= 256 ? 256 : 32; /* rmsnorm's: the same sums */
    LAUNCH(g->k.post_norm_add, ((gpu_launch_dims){(unsigned)T, 1, 1, threads}), op->what, &g->post,
           &(CUdeviceptr){post_norm}, &g->x, &scale, &next, &g->act_h, &n, &eps);
    return 0;
}

/* BERT's LayerNorm in place over T rows of x: x = LayerNorm(x + add) * w + b (add 0: x alone). */
static int layernorm(gpu_engine *g, CUdeviceptr add, CUdeviceptr w, CUdeviceptr b, int T, const char *what, char *err,
                     size_t errlen)
{
    int n = g->d_embd;
    float eps = g->base.m->hp.rms_eps; /* a LayerNorm family keeps its epsilon there (arch/bert.c) */
    unsigned threads = n >= 1024 ? 1024 : n >= 256 ? 256 : 32;
    LAUNCH(g->k.layernorm, ((gpu_launch_dims){(unsigned)T, 1, 1, threads}), what, &g->x, &add, &w, &b, &n, &eps);
    return 0;
}

/* The end of a post-LN block (BERT), whose one-output matmul op (with its bias) reads the
 * block's FP16 result: x = LayerNorm(x + W h + b) with the block's norm weight and bias. */
static int residual_post_ln(gpu_engine *g, matmul_op *op, CUdeviceptr w, CUdeviceptr b, int T, char *err, size_t errlen)
{
    op->out[0].y = g->post;
    op->accumulate = false;
    if (matmul(g, op, err, errlen)) return -1;
    return layernorm(g, g->post, w, b, T, op->what, err, errlen);
}

#define U8(p) ((const uint8_t *)(uintptr_t)(p))

/* Where a MoE layer's experts go: written to y, or added (accumulate); and the batch-1 step's
 * carried norms (norm_point; -1: none): norm_in, the feed-forward norm that the router and the
 * experts' gate/up read (the residual's partial sums instead of the norm's launch), norm_out,
 * the next layer's attention norm whose input the down product writes (x +=, as matvec_res). */
typedef struct moe_dst {
    CUdeviceptr y;
    bool accumulate;
    int norm_in, norm_out;
} moe_dst;

/* Whether layer L's step of T tokens takes its shared expert's gate and up in the experts' GLU
 * launch (moe_glu_norm's last grid column: moe_mv_args.sh0), one launch a layer fewer: the
 * batch-1 step's carried norm (both read its input and the router's kept sum) on the
 * entry-per-block path (k below mmq_narrow's entries), SiLU experts, and the shared gate and
 * up in the experts' format and row width. */
static bool shexp_in_experts(const gpu_engine *g, const gpu_layer *L, int T)
{
    const gpu_matrix *sg = &L->ffn_gate_shexp, *su = &L->ffn_up_shexp, *ge = &L->ffn_gate_exps;
    return sg->d && norm_point(g, 2 * (int)(L - g->layers) + 1, T) >= 0 &&
           g->base.m->hp.n_expert_used < GPU_MOE_NARROW_MIN_ENTRIES && !L->geglu && !L->swiglu_clamp &&
           sg->type == ge->type && su->type == ge->type && sg->k == ge->k && sg->row_bytes == ge->row_bytes;
}

/* A narrow chunk's MXFP4 product (w, over k = w->k inputs, rows ld floats of FP16 apart) on the
 * integer tensor cores: its activation rows (x, `rows` of them) quantised into the q8 rows at
 * element offset off of moe_q8 (kernels/mmq_narrow.cuh quantize_q8_mma), which a->xq / a->xd then
 * name.  Other formats, and rows of another width than k, keep the FP16 fragments. */
static int moe_q8_rows(gpu_engine *g, const gpu_matrix *w, matvec_args *a, CUdeviceptr x, int rows, int ld, size_t off,
                       const char *what, char *err, size_t errlen)
{
    if (!g->moe_q8 || w->type != GGML_TYPE_MXFP4 || w->k != ld) return 0;
    int k = w->k;
    CUdeviceptr xq = g->moe_q8 + 2 * off, xs = g->moe_q8s + off / 32 * sizeof(float);
    LAUNCH(g->k.quantize_q8_mma, ((gpu_launch_dims){ceil_div(k, 256), (unsigned)rows, 1, 256}), what, &x, &ld, &k,
           &xq, &xs);
    a->xq = (const int8_t *)(uintptr_t)xq;
    a->xd = (const float *)(uintptr_t)xs;
    return 0;
}

/* The chosen experts of a chunk of n tokens (rows t0.. of act_h), whose router logits are in
 * moe_logits: each token's k experts and weights are picked (moe_route's choice), then every
 * entry (token, choice) goes through its expert's SwiGLU and down projection, and the weighted
 * outputs are added into rows t0.. of dst (or written: !accumulate).  A few tokens (decode,
 * up to GPU_MOE_ENTRY_MAX_TOKENS) take the entry-per-block matvec kernels, which read only the
 * chosen experts' rows: moe_glu routes in its own blocks and moe_down adds the weighted sum,
 * two launches in all (SiLU experts).  More take moe_route, then one grouped mmq launch per
 * product over tiles of one expert's entries (moe_sort groups them), so an expert's weights
 * stream once for all its tokens, and moe_combine; a chunk of at most GPU_MOE_NARROW_MAX_TOKENS
 * tokens and GPU_MOE_NARROW_MIN_ENTRIES entries or more (batched decode) the same launches with
 * mmq_narrow's grouped form for the products (tiles of at most MMQN_MAX_M entries: no 16-row
 * tiles of one or two entries, no k-split reduce). */
static int moe_chunk(gpu_engine *g, const gpu_layer *L, int t0, int n, const moe_dst *o, const char *what, char *err,
                     size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    int k = hp->n_expert_used, ne = hp->n_expert, N = n * k, d = g->d_embd, acc = o->accumulate;
    const CUdeviceptr dst = o->y;
    const gpu_matrix *gate = &L->ffn_gate_exps, *up = &L->ffn_up_exps, *down = &L->ffn_down_exps;
    /* the carried norm's input (one token) or the normed rows */
    CUdeviceptr x = o->norm_in >= 0 ? g->norm_h : g->act_h + (size_t)t0 * d * sizeof(uint16_t);
    CUdeviceptr logits = g->moe_logits + (size_t)t0 * ne * sizeof(float);
    /* topk_first (gpt-oss): the softmax over the chosen logits, as the CPU's, whatever the
     * file's expert_weights_norm / scale (which the CPU reads only for the other routers) */
    moe_route_args ra = {.logits = F32(logits), .bias = L->exp_probs_b ? F32(L->exp_probs_b) : NULL,
                         .expert_scale = L->expert_scale ? F32(L->expert_scale) : NULL, .n_expert = ne, .k = k,
                         .sigmoid = L->router_sigmoid, .topk_first = L->topk_first,
                         .norm = L->topk_first || hp->expert_weights_norm,
                         .scale = L->topk_first ? 1.0f : hp->expert_weights_scale, .ids = I32(g->moe_ids),
                         .weights = F32(g->moe_w), .n_group = L->n_group, .topk_group = hp->n_group_used};
    void *route[] = {&ra};
    CUdeviceptr out = dst + (size_t)t0 * d * sizeof(float);
    const float glu_limit = L->swiglu_clamp ? ARCH_SWIGLU_CLAMP_LIMIT : 0.0f;
    /* GeGLU experts (Gemma 4) take the per-entry kernels: the fused GLU epilogues are SiLU's.
     * Deterministic: the grouped launches for any count (per-entry GeGLU for any count too) */
    const bool narrow = !g->det && !L->geglu && N >= GPU_MOE_NARROW_MIN_ENTRIES && n <= GPU_MOE_NARROW_MAX_TOKENS &&
                        mmq_narrow_format(g, gate) && mmq_narrow_format(g, down);
    bool grouped = narrow || ((n > GPU_MOE_ENTRY_MAX_TOKENS || g->det) && !L->geglu &&
                              gpu_mmq_serves(&g->k, gate->wtype, gate->k) && gpu_mmq_serves(&g->k, down->wtype, down->k));
    const bool with_shexp = shexp_in_experts(g, L, n);
    if (with_shexp && (grouped || L->geglu)) { /* (shexp_in_experts holds only where it is not) */
        snprintf(err, errlen, "%s: the shared expert's GLU in a path without moe_glu_norm", what);
        return -1;
    }
    /* the narrow path's few tokens: moe_route_sort, one block whose warps route rw tokens at a
     * time in their own shared memory (as much as GPU_MOE_ROUTE_SORT_SMEM holds, at most 32) and then
     * sort the entries (moe_sort's N + ne ints, the same memory), one launch instead of two */
    const unsigned route_bytes = (unsigned)((2 * ne + L->n_group) * sizeof(float)), sort_bytes = (unsigned)((N + ne) * sizeof(int32_t));
    int rw = n < 32 ? n : 32;
    while (rw > 1 && rw * route_bytes > GPU_MOE_ROUTE_SORT_SMEM) rw--;
    const bool route_sort = narrow && rw * route_bytes <= GPU_MOE_ROUTE_SORT_SMEM && sort_bytes <= GPU_MOE_ROUTE_SORT_SMEM;
    /* moe_glu routes inside its blocks; the other paths launch moe_route first */
    if ((grouped || L->geglu) && !route_sort &&
        gpu_launch_smem(&g->k.moe_route, (gpu_launch_dims){(unsigned)n, 1, 1, 32}, route_bytes, g->stream, route,
                        what, err, errlen))
        return -1;
    if (!grouped) {
        moe_mv_args a = {.w0 = U8(gate->d), .w1 = U8(up->d), .expert_bytes = gate->expert_bytes,
                         .row_bytes = gate->row_bytes, .ids = I32(g->moe_ids), .x = F16(x), .x_div = k, .ldx = d,
                         .k = gate->k, .n = gate->n, .ldy = g->d_ff_exp, .yh = F16(g->moe_h),
                         .glu_limit = glu_limit, .glu_alpha = ARCH_SWIGLU_CLAMP_ALPHA,
                         .b0 = L->ffn_gate_exps_b ? F32(L->ffn_gate_exps_b) : NULL,
                         .b1 = L->ffn_up_exps_b ? F32(L->ffn_up_exps_b) : NULL, .route = ra};
        gpu_launch_dims per_entry = {(unsigned)N, ceil_div(gate->n, 8), 1, 256};
        if (L->geglu) { /* gate and up as two products, then fp16(gelu_tanh(gate) * up) */
            a.y = F32(g->moe_g);
            LAUNCH(g->k.moe_matvec[gate->wtype], per_entry, what, &a);
            a.w0 = U8(up->d), a.y = F32(g->moe_u);
            LAUNCH(g->k.moe_matvec[up->wtype], per_entry, what, &a);
            size_t total = (size_t)N * g->d_ff_exp;
            LAUNCH(g->k.geglu, flat_dims(total), what, &g->moe_g, &g->moe_u, &g->moe_h, &total);
        } else {
            void *args[] = {&a};
            if (o->norm_in >= 0) a.norm = norm_args(g, o->norm_in, 0);
            if (with_shexp) { /* one grid column more: the shared expert's gate and up into ff_h */
                a.sh0 = U8(L->ffn_gate_shexp.d), a.sh1 = U8(L->ffn_up_shexp.d), a.sh_yh = F16(g->ff_h);
                a.sh_n = L->ffn_gate_shexp.n;
                per_entry.gx++;
                per_entry.gy = ceil_div(a.sh_n > gate->n ? a.sh_n : gate->n, 8);
            }
            const gpu_fn *fn = o->norm_in >= 0 ? &g->k.moe_glu_norm[gate->wtype] : &g->k.moe_glu[gate->wtype];
            if (gpu_launch_smem(fn, per_entry, GPU_MOE_GLU_SMEM(ne, k, L->n_group), g->stream, args, what, err, errlen))
                return -1;
        }
        /* the down product and the weighted combine in one launch, into out */
        moe_mv_args b = {.w0 = U8(down->d), .expert_bytes = down->expert_bytes, .row_bytes = down->row_bytes,
                         .ids = I32(g->moe_ids), .x = F16(g->moe_h), .x_div = 1, .ldx = g->d_ff_exp, .k = down->k,
                         .n = down->n, .ldy = d, .y = F32(out), .b0 = L->ffn_down_exps_b ? F32(L->ffn_down_exps_b) : NULL,
                         .route = ra, .accumulate = acc};
        void *args[] = {&b};
        if (o->norm_out >= 0) b.norm = norm_args(g, o->norm_out, g->layers[L - g->layers + 1].attn_norm);
        const gpu_fn *fn = o->norm_out >= 0 ? &g->k.moe_down_res[down->wtype] : &g->k.moe_down[down->wtype];
        return gpu_launch_smem(fn, (gpu_launch_dims){ceil_div(down->n, GPU_MOE_DOWN_ROWS), (unsigned)n, 1, 256}, 0,
                               g->stream, args, what, err, errlen);
    }
    {   /* grouped: mmq's tiles of 16/32/64 entries, by the mean entries of an expert; narrow's of
         * at most MMQN_MAX_M, one an active expert but for every MMQN_MAX_M entries more of one
         * (so at most min(N, ne) + N / MMQN_MAX_M of them: every slot of the list) */
        int per = N / ne, v = per > 32 ? 2 : per > 16 ? 1 : 0, bm = narrow ? MMQN_MAX_M : 16 << v;
        int tiles = narrow ? (N < ne ? N : ne) + N / MMQN_MAX_M : (N + bm - 1) / bm + ne;
        void *sort[] = {&g->moe_ids, &N, &ne, &bm, &tiles, &g->moe_sorted, &g->moe_pos, &g->moe_tiles};
        void *route_sort_args[] = {&ra, &n, &rw, &bm, &tiles, &g->moe_sorted, &g->moe_pos, &g->moe_tiles};
        const unsigned rs_bytes = rw * route_bytes > sort_bytes ? rw * route_bytes : sort_bytes;
        if (route_sort ? gpu_launch_smem(&g->k.moe_route_sort, (gpu_launch_dims){1, 1, 1, 1024}, rs_bytes, g->stream,
                                         route_sort_args, what, err, errlen)
                       : gpu_launch_smem(&g->k.moe_sort, (gpu_launch_dims){1, 1, 1, 1024}, sort_bytes, g->stream, sort, what,
                                         err, errlen))
            return -1;
        matvec_args a = {.n_seg = 2, .k = gate->k, .m = N, .ldx = d, .row_bytes = gate->row_bytes, .x = F16(x),
                         .yh = F16(g->moe_h), .tiles = I32(g->moe_tiles), .x_rows = I32(g->moe_sorted), .x_div = k,
                         .expert_bytes = gate->expert_bytes, .glu_limit = glu_limit,
                         .glu_alpha = ARCH_SWIGLU_CLAMP_ALPHA, .bias_ids = I32(g->moe_ids), .bias_stride = gate->n};
        a.seg[0] = (matvec_seg){.w = U8(gate->d), .bias = L->ffn_gate_exps_b ? F32(L->ffn_gate_exps_b) : NULL,
                                .n = gate->n, .ldy = g->d_ff_exp};
        a.seg[1] = (matvec_seg){.w = U8(up->d), .bias = L->ffn_up_exps_b ? F32(L->ffn_up_exps_b) : NULL, .n = up->n,
                                .ldy = g->d_ff_exp};
        mmq_grid ga = {ceil_div(gate->n, GPU_MMQ_ROWS / 2), (unsigned)tiles, v, 2 * pad16(gate->n), true};
        if (narrow && moe_q8_rows(g, gate, &a, x, n, d, 0, what, err, errlen)) return -1;
        if (narrow ? mmq_narrow(g, &a, gate, ga.gx, pad16(gate->n) / 16, tiles, true, NULL, 0, what, err, errlen)
                   : mmq_launch(g, &a, gate, ga, what, err, errlen))
            return -1;
        matvec_args b = {.n_seg = 1, .k = down->k, .m = N, .ldx = g->d_ff_exp, .row_bytes = down->row_bytes,
                         .x = F16(g->moe_h), .tiles = I32(g->moe_tiles), .x_div = 1, .expert_bytes = down->expert_bytes};
        b.seg[0] = (matvec_seg){.w = U8(down->d), .y = F32(g->moe_y), .n = down->n, .ldy = d};
        mmq_grid gb = {ceil_div(pad16(down->n), GPU_MMQ_ROWS), (unsigned)tiles, v, pad16(down->n), false};
        if (narrow && moe_q8_rows(g, down, &b, g->moe_h, N, g->d_ff_exp, (size_t)n * d, what, err, errlen)) return -1;
        if (narrow ? mmq_narrow(g, &b, down, gb.gx, pad16(down->n) / 16, tiles, false, NULL, 0, what, err, errlen)
                   : mmq_launch(g, &b, down, gb, what, err, errlen))
            return -1;
    }
    LAUNCH(g->k.moe_combine, ((gpu_launch_dims){(unsigned)n, ceil_div(d, 256), 1, 256}), what, &out, &g->moe_y, &g->moe_w, &g->moe_pos, &k,
           &d, &acc, &(CUdeviceptr){L->ffn_down_exps_b}, &g->moe_ids);
    return 0;
}

/* x *= s over n floats: the embeddings' scale, the logits' soft-cap (cap = s). */
static int scale_op(gpu_engine *g, const gpu_fn *fn, CUdeviceptr x, size_t n, float s, const char *what, char *err,
                    size_t errlen)
{
    LAUNCH(*fn, flat_dims(n), what, &x, &n, &s);
    return 0;
}

/* The MoE feed-forward of T rows of act_h (recipe ARCH_FFN_MOE, router ARCH_ROUTER_SOFTMAX_TOPK or
 * gpt-oss's ARCH_ROUTER_TOPK_SOFTMAX, with its bias;
 * or the experts of ARCH_FFN_GLU_MOE): the router's logits for every row (in FP32, from moe_xf,
 * or the carried norm's residual: moe_router_norm), then chunks of moe_chunk tokens into o. */
#define GPU_MOE_ROUTER_SPREAD 64 /* moe_router: a block an expert up to this many tokens (moe_experts) */
static int moe_experts(gpu_engine *g, const gpu_layer *L, int T, const moe_dst *o, const char *what, char *err,
                       size_t errlen)
{
    /* moe.cuh: moe_router.  A block an expert up to GPU_MOE_ROUTER_SPREAD tokens (decode, short
     * prompts), 8 experts a block past it (prompts: each block's tokens' rows stay in its L1).  At
     * B=32 the 8-expert blocks were 4 x 4 = 16 on 132 multiprocessors, each walking its 8 rows in
     * turn (gpt-oss-20b 20.4 us a layer in ncu against 6.9 at B=8); a token's sum is the same bits
     * either way. */
    int ne = g->base.m->hp.n_expert, per_block = T > GPU_MOE_ROUTER_SPREAD ? 8 : 1;
    gpu_launch_dims rd = {ceil_div(T, GPU_MOE_ROUTER_TOKENS), ceil_div(ne, per_block), 1, 256};
    if (o->norm_in >= 0) { /* one token: a block an expert, as moe_router's (+ one: the shared expert's gate) */
        matvec_norm nm = norm_args(g, o->norm_in, L->ffn_norm);
        CUdeviceptr w_sh = L->ffn_gate_inp_shexp, sh = w_sh ? g->sh_logit : 0;
        rd.gy += w_sh ? 1 : 0;
        LAUNCH(g->k.moe_router_norm, rd, what, &g->x, &(CUdeviceptr){L->router}, &(CUdeviceptr){L->ffn_gate_inp_b},
               &g->d_embd, &nm, &g->moe_logits, &w_sh, &sh);
    } else {
        LAUNCH(g->k.moe_router, rd, what, &g->moe_xf, &(CUdeviceptr){L->router}, &(CUdeviceptr){L->ffn_gate_inp_b},
               &g->d_embd, &ne, &T, &per_block, &g->moe_logits);
    }
    int chunk = g->moe_chunk;
    if (g->det) { /* the grouped products' fixed splits: as many entries as their partials hold */
        const gpu_matrix *gate = &L->ffn_gate_exps, *down = &L->ffn_down_exps;
        unsigned gx_gate = ceil_div(gate->n, GPU_MMQ_ROWS / 2), gx_down = ceil_div(pad16(down->n), GPU_MMQ_ROWS);
        int e_gate = mmq_det_rows(g, mmq_det_splits(g, gx_gate, gate->k), 2 * pad16(gate->n));
        int e_down = mmq_det_rows(g, mmq_det_splits(g, gx_down, down->k), pad16(down->n));
        int fit = (e_gate < e_down ? e_gate : e_down) / g->base.m->hp.n_expert_used;
        if (fit < 1) fit = 1;
        if (fit < chunk) chunk = fit;
    }
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        if (moe_chunk(g, L, t0, n, o, what, err, errlen)) return -1;
    }
    return 0;
}

/* x += the experts' sum, or in a sandwich-norm layer its post-normed form.  The batch-1 step's
 * carried norms: the router and gate/up read the feed-forward norm's, and the down product
 * writes the next layer's where it ends the layer (no shared expert after it; not the last). */
static int ffn_moe(gpu_engine *g, const gpu_layer *L, int T, const char *what, char *err, size_t errlen)
{
    const int il = (int)(L - g->layers);
    const bool writes_next = il + 1 < g->base.m->hp.n_layer && moe_ends_layer(g, il);
    moe_dst o = {.y = L->ffn_post_norm ? g->post : g->x, .accumulate = !L->ffn_post_norm,
                 .norm_in = norm_point(g, 2 * il + 1, T), .norm_out = writes_next ? norm_point(g, 2 * il + 2, T) : -1};
    if (moe_experts(g, L, T, &o, what, err, errlen)) return -1;
    return L->ffn_post_norm ? add_post_normed(g, L->ffn_post_norm, T, what, err, errlen) : 0;
}

/* y += z over T rows of n_embd (add_bias over one row of T * n_embd). */
static int add_rows(gpu_engine *g, CUdeviceptr y, CUdeviceptr z, int T, const char *what, char *err, size_t errlen)
{
    int width = T * g->d_embd;
    size_t total = (size_t)width;
    LAUNCH(g->k.add_bias, ((gpu_launch_dims){ceil_div(total, 256), 1, 1, 256}), what, &y, &z, &width, &total);
    return 0;
}

/* Gemma 4's experts beside the dense GLU (ARCH_FFN_GLU_MOE), on act_h = fp16(rmsnorm(x) *
 * ffn_norm): post = rmsnorm(glu(act_h)) * post_1 + rmsnorm(experts(rmsnorm(x) * pre_2)) * post_2,
 * the experts chosen by the scaled router from rmsnorm(x) (its scales folded into the router's
 * weights: upload_router), then x += rmsnorm(post) * ffn_post_norm. */
static int ffn_glu_moe(gpu_engine *g, const gpu_layer *L, int T, const char *what, char *err, size_t errlen)
{
    if (gated_ffn(g, L, false, T, what, err, errlen)) return -1;
    matmul_op down = {.out = {{&L->w_down, g->post, 0, g->d_embd}}, .n_out = 1, .x = g->ff_h, .m = T, .ldx = L->d_ff,
                      .what = what};
    norm_op post1 = {.x = g->post, .w = L->ffn_post_norm_1, .y = g->post, .rows = T, .n = g->d_embd};
    norm_op router = {.x = g->x, .y = g->moe_xf, .rows = T, .n = g->d_embd};
    norm_op pre2 = {.x = g->x, .w = L->ffn_pre_norm_2, .yh = g->act_h, .rows = T, .n = g->d_embd};
    norm_op post2 = {.x = g->moe_out, .w = L->ffn_post_norm_2, .y = g->moe_out, .rows = T, .n = g->d_embd};
    if (matmul(g, &down, err, errlen) || rmsnorm(g, &post1, what, err, errlen) ||
        rmsnorm(g, &router, what, err, errlen) || rmsnorm(g, &pre2, what, err, errlen) ||
        moe_experts(g, L, T, &(moe_dst){.y = g->moe_out, .norm_in = -1, .norm_out = -1}, what, err, errlen) ||
        rmsnorm(g, &post2, what, err, errlen) ||
        add_rows(g, g->post, g->moe_out, T, what, err, errlen))
        return -1;
    return add_post_normed(g, L->ffn_post_norm, T, what, err, errlen);
}

/* dst = fp16(src) over n floats. */
static int to_half(gpu_engine *g, CUdeviceptr src, CUdeviceptr dst, size_t n, const char *what, char *err,
                   size_t errlen)
{
    LAUNCH(g->k.to_f16, flat_dims(n), what, &src, &dst, &n);
    return 0;
}

/* act_h = fp16(x) over T rows: the residual stream as a matmul input, unnormed. */
static int residual_to_f16(gpu_engine *g, int T, const char *what, char *err, size_t errlen)
{
    return to_half(g, g->x, g->act_h, (size_t)T * g->d_embd, what, err, errlen);
}

/* Gemma 4's per-layer inputs of the step's tokens, from their scaled embeddings in x:
 * ple[t][l] = (rmsnorm(W_proj x[t] / sqrt(n_embd)) * proj_norm + ple_tok[tok][l] * sqrt(P)) / sqrt(2)
 * for every layer l, P wide each (cpu_engine.c: per_layer_inputs). */
static int per_layer_inputs(gpu_engine *g, int T, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const char *what = "per-layer embeddings";
    int all = hp->n_layer * hp->n_embd_ple;
    size_t n = (size_t)T * all;
    unsigned long long rb = g->ple_tok_embd.row_bytes;
    if (residual_to_f16(g, T, what, err, errlen)) return -1;
    matmul_op proj = {.out = {{&g->ple_model_proj, g->ple, 0, all}}, .n_out = 1, .x = g->act_h, .m = T,
                      .ldx = g->d_embd, .what = what};
    norm_op nrm = {.x = g->ple, .w = g->ple_proj_norm, .y = g->ple, .rows = T * hp->n_layer, .n = hp->n_embd_ple};
    if (matmul(g, &proj, err, errlen) ||
        scale_op(g, &g->k.scale_f32, g->ple, n, 1.0f / sqrtf((float)hp->n_embd), what, err, errlen) ||
        rmsnorm(g, &nrm, what, err, errlen))
        return -1;
    LAUNCH(g->k.embed[g->ple_tok_embd.wtype], ((gpu_launch_dims){(unsigned)T, 1, 1, 64}), what, &g->ple_tok_embd.d,
           &rb, &g->ple_tok_embd.k, &(CUdeviceptr){g->in_d + g->in.tok}, &g->ple_tok);
    if (scale_op(g, &g->k.scale_f32, g->ple_tok, n, sqrtf((float)hp->n_embd_ple), what, err, errlen)) return -1;
    int width = (int)n;
    LAUNCH(g->k.add_bias, ((gpu_launch_dims){ceil_div(n, 256), 1, 1, 256}), what, &g->ple, &g->ple_tok, &width, &n);
    return scale_op(g, &g->k.scale_f32, g->ple, n, (float)M_SQRT1_2, what, err, errlen);
}

/* Gemma 4's per-layer embedding after layer il: x += rmsnorm(W_proj fp16(gelu(W_gate x) *
 * ple[t][il])) * post_norm (cpu_engine.c: per_layer_embedding). */
static int per_layer_embedding(gpu_engine *g, const gpu_layer *L, int il, int T, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const int P = hp->n_embd_ple, ld_ple = hp->n_layer * P;
    const char *what = "per-layer embedding";
    if (residual_to_f16(g, T, what, err, errlen)) return -1;
    matmul_op gate = {.out = {{&L->ple_gate, g->ple_g, 0, P}}, .n_out = 1, .x = g->act_h, .m = T, .ldx = g->d_embd,
                      .what = what};
    if (matmul(g, &gate, err, errlen)) return -1;
    CUdeviceptr in = g->ple + (size_t)il * P * sizeof(float);
    size_t total = (size_t)T * P;
    LAUNCH(g->k.geglu_rows, ((gpu_launch_dims){ceil_div(total, 256), 1, 1, 256}), what, &g->ple_g, &(int){P}, &in,
           &(int){ld_ple}, &g->ple_h, &g->ple_ld, &(int){P}, &T);
    matmul_op proj = {.out = {{&L->ple_proj, g->post, 0, g->d_embd}}, .n_out = 1, .x = g->ple_h, .m = T,
                      .ldx = g->ple_ld, .what = what};
    if (matmul(g, &proj, err, errlen)) return -1;
    return add_post_normed(g, L->ple_post_norm, T, what, err, errlen);
}

/* Whether layer L's one-token QKV product can do qkv_post in its epilogue (matvec_rope): no
 * q/k/v norm, gate or partial RoPE, K/V of its own, RoPE at all, whole groups of 8 features. */
static bool qkv_post_fusable(const gpu_engine *g, const gpu_layer *L)
{
    return !L->q_norm && !L->k_norm && !L->v_norm && !L->gated && !L->n_rot && L->kv_own && L->wv.d && L->hd % 8 == 0 &&
           !L->post_ln && g->base.m->desc->rope != ARCH_ROPE_NONE;
}

/* Whether the batch-1 step can carry layer L's norms through its feed-forward: a one-launch
 * SiLU GLU (glu_norm, matvec_res), or a MoE layer of SiLU experts on the matvec path
 * (moe_router_norm, moe_glu_norm, moe_down_res) with at most a shared expert (its GLU reads the
 * norm, its down product adds into x and writes the next one; a sigmoid gate's logit from
 * moe_router_norm's extra block, applied in that add: matvec_args.res_gate), over formats that
 * have the kernels. */
static bool ffn_norms_carried(const gpu_engine *g, const gpu_layer *L, arch_ffn ffn)
{
    const gpu_kernels *k = &g->k;
    if (ffn == ARCH_FFN_GLU)
        return !L->geglu && gpu_glu_fused(g, &L->w_gate, &L->w_up, 1) && L->w_gate.wtype >= 0 &&
               k->matvec_res[L->w_gate.wtype].f && L->w_down.wtype >= 0 && k->matvec_res[L->w_down.wtype].f;
    if (ffn != ARCH_FFN_MOE || L->geglu || !L->router || GPU_MOE_ENTRY_MAX_TOKENS < 1)
        return false;
    const gpu_matrix *gate = &L->ffn_gate_exps, *down = &L->ffn_down_exps;
    /* (the routed down product writes the next norm only where it ends the layer, moe_ends_layer:
     * with a shared expert after it, any format with a plain moe_down) */
    if (gate->wtype < 0 || !k->moe_glu_norm[gate->wtype].f || down->wtype < 0 ||
        (!L->ffn_gate_shexp.d && !k->moe_down_res[down->wtype].f))
        return false;
    /* Ending the layer, the experts' down product writes the next norm's partials as
     * matvec_res does (a warp a row: one per 8 rows at any k; its one-row blocks at k >= 8 had
     * left n_embd partials for every QKV block to sum, slower than the norm's own launch:
     * docs/benchmarks.md).  A shared expert ends the layer on matvec_res. */
    if (!L->ffn_gate_shexp.d) return true;
    const gpu_matrix *sg = &L->ffn_gate_shexp, *sd = &L->ffn_down_shexp;
    return gpu_glu_fused(g, sg, &L->ffn_up_shexp, 1) && sg->wtype >= 0 && k->matvec_res[sg->wtype].f &&
           sd->wtype >= 0 && k->matvec_res[sd->wtype].f;
}

/* Whether a DeltaNet layer's products can carry its norms: the input product (q/k/v, z and the
 * gates' projections) reads the norm and its remainder in one pass (matvec_lo_nin_<type>, the
 * formats of GPU_MATVEC_LO_NORM_KERNELS), and Wout writes the feed-forward norm's input
 * (matvec_res_<type>). */
static bool lin_norms_carried(const gpu_engine *g, const gpu_layer *L)
{
    const gpu_matrix *in[] = {&L->ssm_qkv, &L->ssm_gate, &L->ssm_ba, &L->ssm_beta, &L->ssm_alpha};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        if (in[i]->d && (in[i]->wtype < 0 || !g->k.matvec_lo_nin[in[i]->wtype].f)) return false;
    return L->ssm_out.wtype >= 0 && g->k.matvec_res[L->ssm_out.wtype].f;
}

/* Whether a latent-attention layer's products can carry its norms: the input product (the query
 * or its LoRA's first half, and the latent's) reads the norm and its remainder in one pass
 * (matvec_lo_nin_<type>, as lo_fusable takes it), and Wo writes the feed-forward norm's input
 * (matvec_res). */
static bool mla_norms_carried(const gpu_engine *g, const gpu_layer *L)
{
    const gpu_matrix *in[] = {L->wq_a.d ? &L->wq_a : &L->wq, &L->wkv_a};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        if (!lo_nin_serves(g, in[i])) return false;
    return L->wo.wtype >= 0 && g->k.matvec_res[L->wo.wtype].f;
}

/* The batch-1 step carries its RMSNorms in its products (norm_point) where every layer is a
 * softmax layer with a norm before its QKV product (matvec_rope_norm; matvec_nin where q/k
 * norms, a gate or partial RoPE keep qkv_post's launch) or a DeltaNet layer that carries it
 * (lin_norms_carried), and one before a feed-forward that carries it (ffn_norms_carried),
 * nothing else on the residual stream (no sandwich norms, output scales, per-layer
 * embeddings), over formats that have the kernels (GPU_MATVEC_NORM_KERNELS,
 * GPU_MATVEC_LO_NORM_KERNELS, GPU_MOE_NORM_KERNELS); not under det (one path for every batch
 * size) nor dp4a (its norm makes the q8 row).  Under tensor parallelism the residual add after
 * the sum writes the next norm's input (gpu_tp_residual_add) but not the FP16 remainder a
 * DeltaNet layer's carried input reads: TP carries dense layers only (TP_FEATURES refuses
 * hybrids today; this keeps it so if that changes). */
bool gpu_norms_carried(const gpu_engine *g)
{
    const model *m = g->base.m;
    if (g->det || g->dp4a || m->hp.encoder || m->hp.n_embd_ple > 0 || (g->tp_rank >= 0 && g->base.n_states))
        return false;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const gpu_layer *L = &g->layers[il];
        if (L->post_ln || L->attn_post_norm || L->ffn_post_norm || L->has_out_scale ||
            (L->mla && !mla_norms_carried(g, L)) ||
            (L->lin >= 0 && !lin_norms_carried(g, L)) || L->mlp || !L->attn_norm || !L->ffn_norm ||
            !ffn_norms_carried(g, L, m->layers[il].recipe.ffn))
            return false;
        const gpu_matrix *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (ws[i]->d && (ws[i]->wtype < 0 || !g->k.matvec_res[ws[i]->wtype].f)) return false; /* (a row has all) */
    }
    return true;
}

/* Softmax attention of layer il over the normed act_h: x += post(Wo attend(q, K, V)).  The
 * q/k/v products (K/V only in a layer that keeps its own: Gemma 4's shared layers read their
 * kv_source's; a layer without wv takes V from the K projection), qkv_post (q/k norms, RoPE,
 * v norm, the K/V stores), attention over the layer's region of the caches, the output
 * product.  A gated layer's Wq gives [query | gate] per head into qg: the queries go to q, and
 * the attention's output is gated by sigmoid(gate) before Wo (ARCH_ATTN_OUT_GATE). */
static int attention_softmax(gpu_engine *g, int il, int T, const gpu_attn_plan *ap, const char *what, char *err,
                             size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const gpu_layer *L = &g->layers[il];
    const int no_rope = g->base.m->desc->rope == ARCH_ROPE_NONE; /* bert: absolute positions */
    qkv_post_args post = {
        .q = F32(g->q), .k = F32(g->kk), .v = F32(g->vv), .q_norm = L->q_norm ? F32(L->q_norm) : NULL,
        .k_norm = L->k_norm ? F32(L->k_norm) : NULL, .kc = F16(L->kc), .vc = F16(L->vc),
        .seq = I32(g->in_d + g->in.seq), .pos = I32(g->in_d + g->in.pos), .tables = I32(gpu_layer_tables(g, L)),
        .freq_div = L->rope_freqs ? F32(L->rope_freqs) : NULL, .rope_base = L->rope_base,
        .pos_scale = 1.0f / L->rope_scale, .eps = hp->rms_eps, .neox = hp->rope_neox, .n_head = hp->n_head,
        .n_kv = L->n_kv, .hd = L->hd, .n_layer = 1, .layer = 0, .table_width = g->table_width, .v_norm = L->v_norm,
        .n_rot = L->n_rot, .yarn_factor = hp->yarn_factor, .yarn_low = hp->yarn_low, .yarn_high = hp->yarn_high,
        .mscale = hp->rope_attn_factor, .no_rope = no_rope,
    };
    /* One token (the batch-1 step) with no q/k/v norm, gate or partial RoPE: RoPE and the K/V
     * stores in the QKV matvec's epilogue (its blocks of 8 features hold 4 whole RoPE pairs of
     * one head).  For the other steps of up to MMQN_MAX_M tokens (under det from one) where
     * mmq_narrow takes Q, K and V and a RoPE pair is two neighbouring features (not NeoX: a pair
     * never leaves its 16-row tile), in mmq_narrow's; every other step takes qkv_post. */
    const gpu_matrix *wv = L->wv.d ? &L->wv : &L->wk; /* no wv: V is the K projection (v_from_k) */
    const int np = norm_point(g, 2 * il, T);
    bool post_fused = qkv_post_fusable(g, L) && ((T == 1 && !g->det) ||
                                                 (!hp->rope_neox && L->hd % 16 == 0 && mmq_narrow_serves(g, &L->wq, T) &&
                                                  mmq_narrow_serves(g, &L->wk, T) && mmq_narrow_serves(g, wv, T)));
    matmul_op qkv = {.out = {{&L->wq, L->gated ? g->qg : g->q, L->bq, L->gated ? 2 * L->d_q : L->d_q},
                             {&L->wk, g->kk, L->bk, L->d_kv}, {wv, g->vv, L->bv, L->d_kv}},
                     .n_out = L->kv_own ? 3 : 1, .x = np >= 0 ? g->norm_h : g->act_h, .m = T, .ldx = g->d_embd,
                     .post = post_fused ? &post : NULL, .x_q8 = norm_q8(g, T, g->d_embd),
                     .norm = np >= 0 ? NORM_IN : NORM_NONE, .norm_p = np, .what = what};
    if (matmul(g, &qkv, err, errlen)) return -1;
    size_t nq = (size_t)T * L->d_q;
    int hd = L->hd;
    if (L->gated) LAUNCH(g->k.split_qgate, flat_dims(nq), what, &g->qg, &g->q, &hd, &nq);
    if (!post_fused)
        LAUNCH(g->k.qkv_post,
               ((gpu_launch_dims){(unsigned)T, (unsigned)(hp->n_head + (L->kv_own ? L->n_kv : 0)), 1, L->hd >= 128 ? 64 : 32}),
               what, &post);
    if (attention(g, il, ap, err, errlen)) return -1;
    if (L->gated) LAUNCH(g->k.gate_heads, flat_dims(nq), what, &g->act_h, &g->qg, &hd, &nq);
    const int next = norm_point(g, 2 * il + 1, T); /* the feed-forward norm, which Wo's residual add writes */
    matmul_op wo = {.out = {{&L->wo, g->x, L->bo, g->d_embd}}, .n_out = 1, .x = g->act_h, .m = T, .ldx = L->d_q,
                    .accumulate = true, .norm = next >= 0 ? NORM_OUT : NORM_NONE, .norm_p = next, .norm_w = L->ffn_norm,
                    .what = what};
    if (L->post_ln) return residual_post_ln(g, &wo, L->attn_out_norm, L->attn_out_norm_b, T, err, errlen);
    return block_end(g, &wo, L->attn_post_norm, 1.0f, 2 * il + 1, T, err, errlen);
}

/* One batched product per head over T rows (cuBLAS, the heads its batch, in FP32): for head h,
 * y[t][h * y_stride + o] = sum_i w_h[o][i] x[t][h * x_stride + i], w the F32 copy of a
 * [n_head][n_out][k] tensor (wk_b, wv_b), x rows ldx apart, y rows ldy apart. */
typedef struct head_product_op {
    CUdeviceptr w, x, y;
    int n_out, k, ldx, x_stride, ldy, y_stride, T;
} head_product_op;

static int head_product(gpu_engine *g, const head_product_op *op, const char *what, char *err, size_t errlen)
{
    float alpha = 1.0f, beta = 0.0f;
    /* row-major y_h[T][n_out] = x_h[T][k] w_h^T: column-major y_h^T = w_h^T x_h^T (blas_matmul) */
    CUBLAS_CHECK(cublas.gemm_strided_batched_ex(
                     g->blas, CUBLAS_OP_T, CUBLAS_OP_N, op->n_out, op->T, op->k, &alpha, (const void *)(uintptr_t)op->w,
                     CUDA_R_32F, op->k, (long long)op->n_out * op->k, (const void *)(uintptr_t)op->x, CUDA_R_32F,
                     op->ldx, op->x_stride, &beta, (void *)(uintptr_t)op->y, CUDA_R_32F, op->ldy, op->y_stride,
                     g->base.m->hp.n_head, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 what);
    return 0;
}

/* Multi-head latent attention (deepseek2) of layer il over the normed act_h, in the absorbed
 * form for prompts and decode alike (cpu_engine.c: attention_mla):
 *   q = Wq_b fp16(rmsnorm(Wq_a h) * q_a_norm) (or Wq h), heads [nope | rope];  kv = Wkv_a h
 *   cache row[pos] = [rmsnorm(kv[:lat]) * kv_a_norm | rope(kv[lat:])]        (mla_post)
 *   q'_h = [wk_b_h q_nope_h | rope(q_rope_h)]  (the first part one batched FP32 cuBLAS product)
 *   o_h = softmax(q'_h rows^T * mscale^2 / sqrt(nope + rope)) rows[:, :lat]
 *         (the attention kernels with one KV head of lat + rope, its keys its values:
 *          prompt spans as flash tiles, flash_attn_mla, at 512 + 64; decode tokens
 *          attn_decode_mla there, split-K at other widths)
 *   x += Wo fp16(wv_b_h o_h over the heads)                 (wv_b: the second batched product)
 * q' lives in q ([t][n_head][lat + rope]), the attention's output in act_h (FP16, the same
 * shape; its RoPE columns unused), widened into q for the value product, whose heads go to
 * mla_q, then act_h for Wo.  A decode step (small below) takes mla_decode_q for the products
 * and mla_post, and mla_decode_value from act_h to Wo's FP16 input in mla_q's room. */
static int attention_mla(gpu_engine *g, int il, int T, const gpu_attn_plan *ap, const char *what, char *err,
                         size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const gpu_layer *L = &g->layers[il];
    const int H = hp->n_head, nope = hp->mla_nope, rot = hp->n_rot, lat = hp->kv_lora_rank, qk = nope + rot;
    const int row = L->hd, vw = hp->mla_v;
    const bool lora = L->wq_a.d != 0;
    /* the query and the latent read h to about 22 bits, act_h and its FP16 remainder act_lo (as
     * attention_linear's projections): with h in FP16 alone the reference deepseek_v3's top-1
     * against the CPU was 97.57 % on the H100 (docs/mla-gpu.md).  Through matmul_op.x_lo: a
     * prompt's products take a second pass over act_lo, a decode token's ride on the first (one
     * launch and one read of the weights, lo_fusable) */
    /* The batch-1 step's carried norm (norm_point): h's input fp16(x w c) and its scaled remainder,
     * which the product before wrote (norm_args: norm_lo), in one pass (matvec_lo_nin) */
    const int np = norm_point(g, 2 * il, T);
    matmul_op in = {.out = {{lora ? &L->wq_a : &L->wq, lora ? g->mla_qa : g->mla_q, 0, lora ? hp->q_lora_rank : H * qk},
                            {&L->wkv_a, g->kk, 0, row}},
                    .n_out = 2, .x = np >= 0 ? g->norm_h : g->act_h, .x_lo = np >= 0 ? g->norm_lo : g->act_lo,
                    .n_lo = 2, .m = T, .ldx = g->d_embd, .norm = np >= 0 ? NORM_IN : NORM_NONE, .norm_p = np,
                    .what = what};
    if (matmul(g, &in, err, errlen)) return -1;
    if (lora) {
        norm_op qa = {.x = g->mla_qa, .w = L->q_a_norm, .yh = g->act_h, .ylo = g->act_lo, .rows = T,
                      .n = hp->q_lora_rank};
        matmul_op qb = {.out = {{&L->wq_b, g->mla_q, 0, H * qk}}, .n_out = 1, .x = g->act_h, .x_lo = g->act_lo,
                        .n_lo = 1, .m = T, .ldx = hp->q_lora_rank, .what = what};
        if (rmsnorm(g, &qa, what, err, errlen) || matmul(g, &qb, err, errlen)) return -1;
    }
    /* a step of a few tokens (decode): the absorbed query with mla_post's work, and the value
     * product from the attention's FP16 output to Wo's FP16 input, one launch each
     * (kernels/mla.cuh) instead of five (two batched cuBLAS products, mla_post, the widening
     * and narrowing copies) */
    const bool small = T <= GPU_MLA_SMALL_T && nope == GPU_MLA_NOPE && lat == GPU_MLA_FLASH_V && vw % 2 == 0 &&
                       H * vw % GPU_MLA_VAL_ROWS == 0;
    mla_post_args mp = {
        .q_raw = F32(g->mla_q), .q = F32(g->q), .kv = F32(g->kk), .kv_norm = F32(L->kv_a_norm), .kc = F16(L->kc),
        .rope = {.seq = I32(g->in_d + g->in.seq), .pos = I32(g->in_d + g->in.pos),
                 .tables = I32(gpu_layer_tables(g, L)), .rope_base = L->rope_base, .pos_scale = 1.0f / L->rope_scale, .eps = hp->rms_eps,
                 .neox = hp->rope_neox, .hd = rot, .n_rot = rot, .table_width = g->table_width,
                 .yarn_factor = hp->yarn_factor, .yarn_low = hp->yarn_low, .yarn_high = hp->yarn_high,
                 .mscale = hp->rope_attn_factor},
        .n_head = H, .nope = nope, .lat = lat,
    };
    if (small) {
        const unsigned n_abs = (unsigned)(H * lat / GPU_MLA_ABS_ROWS);
        LAUNCH(g->k.mla_decode_q, ((gpu_launch_dims){n_abs + (unsigned)T, 1, 1, GPU_MLA_ABS_THREADS}), what, &mp,
               &(CUdeviceptr){L->wk_b}, &(int){T});
    } else {
        head_product_op absorb = {.w = L->wk_b, .x = g->mla_q, .y = g->q, .n_out = lat, .k = nope, .ldx = H * qk,
                                  .x_stride = qk, .ldy = H * row, .y_stride = row, .T = T};
        if (head_product(g, &absorb, what, err, errlen)) return -1;
        LAUNCH(g->k.mla_post, ((gpu_launch_dims){(unsigned)T, (unsigned)(H + 1), 1, 64}), what, &mp);
    }
    if (attention(g, il, ap, err, errlen)) return -1;
    const int next = norm_point(g, 2 * il + 1, T); /* the feed-forward norm, which Wo's residual add writes */
    matmul_op wo = {.out = {{&L->wo, g->x, L->bo, g->d_embd}}, .n_out = 1, .x = g->act_h, .m = T, .ldx = H * vw,
                    .accumulate = true, .norm = next >= 0 ? NORM_OUT : NORM_NONE, .norm_p = next,
                    .norm_w = L->ffn_norm, .what = what};
    if (small) { /* Wo's input in mla_q's room (its query heads are spent) */
        const unsigned n_val = (unsigned)(H * vw / GPU_MLA_VAL_ROWS);
        LAUNCH(g->k.mla_decode_value, ((gpu_launch_dims){n_val, 1, 1, GPU_MLA_ABS_THREADS}), what,
               &(CUdeviceptr){L->wv_b}, &g->act_h, &g->mla_q, &(int){H}, &(int){vw}, &(int){row}, &(int){T});
        wo.x = g->mla_q;
    } else {
        int width = H * row;
        size_t n = (size_t)T * width;
        LAUNCH(g->k.to_f32_rows, flat_dims(n), what, &g->act_h, &width, &g->q, &width, &n);
        head_product_op value = {.w = L->wv_b, .x = g->q, .y = g->mla_q, .n_out = vw, .k = lat, .ldx = H * row,
                                 .x_stride = row, .ldy = H * vw, .y_stride = vw, .T = T};
        if (head_product(g, &value, what, err, errlen) ||
            to_half(g, g->mla_q, g->act_h, (size_t)T * H * vw, what, err, errlen))
            return -1;
    }
    return residual_add(g, &wo, L->attn_post_norm, T, err, errlen);
}

/* ssm_qk_norm's and ssm_out_norm's grid over T tokens of `heads` heads: a warp a head,
 * GPU_SSM_NORM_WARPS of them a block (fewer where the layer has fewer heads) */
static gpu_launch_dims ssm_heads_dims(int T, int heads)
{
    const int warps = heads < GPU_SSM_NORM_WARPS ? heads : GPU_SSM_NORM_WARPS;
    return (gpu_launch_dims){(unsigned)T, ceil_div(heads, warps), 1, 32u * warps};
}

/* Gated DeltaNet over the normed act_h (kernels/deltanet.cuh): [q k v] = silu(conv1d(Wqkv h))
 * with q and k L2-normed per head, z = Wgate h, beta and the decay from their projections,
 * the delta rule through each sequence's tokens from its state slot (in.sseq), and
 * x += Wout fp16(rmsnorm(o) * w * silu(z)). */
static int attention_linear(gpu_engine *g, int il, int T, const gpu_attn_plan *ap, const char *what, char *err,
                            size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const gpu_layer *L = &g->layers[il];
    int nv = hp->ssm_vheads, nk = hp->ssm_groups, d = hp->ssm_state, chan = g->ssm_chan, fused = L->ssm_ba.d != 0;
    /* q, k, v and z read h to about 22 bits: + the products over act_lo, h's FP16 remainder.
     * FP16 h alone moved the reference hybrids' top-1 against the CPU by 1-4 % (the CPU with
     * the GPU's roundings emulated gives the H100's figures; with these inputs in FP32, >= 99.3
     * %): the conv, the 16-wide L2 norms and the state carry its error on, a MoE router flip
     * with it.  Prompt steps need it as much: without it there (decode keeping it) qwen3_5_moe
     * fell to 96.18 %, qwen3_next to 97.92 % (docs/benchmarks.md, issue 26).  A prompt's costs
     * one more pass over Wqkv and Wgate (~16 % of a linear layer's prefill on the H100); a
     * decode token's rides on the first (matmul_op.x_lo). */
    /* the gates' inputs (beta and alpha, or qwen3next's one projection) from FP16 h alone.  The
     * batch-1 step's carried norm (norm_point): h's input fp16(x w c) and its scaled remainder,
     * which the product before wrote (norm_args: norm_lo), in one pass (matvec_lo_nin) */
    const int np = norm_point(g, 2 * il, T);
    matmul_op proj = {.out = {{&L->ssm_qkv, g->ssm_mix, 0, chan}, {&L->ssm_gate, g->ssm_z, 0, hp->ssm_inner},
                              fused ? (matmul_out){&L->ssm_ba, g->ssm_raw, 0, 2 * nv}
                                    : (matmul_out){&L->ssm_beta, g->ssm_b, 0, nv},
                              {&L->ssm_alpha, g->ssm_g, 0, nv}},
                      .n_out = fused ? 3 : 4, .x = np >= 0 ? g->norm_h : g->act_h,
                      .x_lo = np >= 0 ? g->norm_lo : g->act_lo, .n_lo = 2, .m = T, .ldx = g->d_embd,
                      .norm = np >= 0 ? NORM_IN : NORM_NONE, .norm_p = np, .what = what};
    if (matmul(g, &proj, err, errlen)) return -1;
    ssm_gate_args ga = {.b = F32(g->ssm_b), .a = F32(g->ssm_g), .raw = F32(g->ssm_raw), .A = F32(L->ssm_a),
                        .dt_bias = F32(L->ssm_dt), .fused = fused, .v_heads = nv, .k_heads = nk};
    const long long conv_off = (long long)L->lin * (long long)g->layer_floats;
    ssm_args sa = {
        .seqs = (const gpu_ssm_seq *)(uintptr_t)(g->in_d + g->in.sseq), .mix = F32(g->ssm_mix), .state = F32(g->state),
        .out = F32(g->ssm_o), .conv_w = F32(L->ssm_conv1d), .beta = F32(g->ssm_b), .g = F32(g->ssm_g),
        .slot_stride = (long long)g->slot_floats, .conv_off = conv_off,
        .delta_off = conv_off + (long long)g->conv_floats, .chan = chan, .taps = hp->ssm_conv, .d = d, .k_heads = nk,
        .v_heads = nv, .grouped = hp->ssm_grouped,
    };
    float eps = hp->rms_eps;
    if (T == ap->n_ssm) { /* a decode step, one token a sequence: two launches (kernels/deltanet.cuh) */
        LAUNCH(g->k.ssm_conv_step, ((gpu_launch_dims){(unsigned)T, (unsigned)(2 * nk + nv + 1), 1, ceil_div(d, 32) * 32}),
               what, &sa, &ga);
        if (d <= GPU_SSM_STEP_MAX_D) {
            LAUNCH(g->k.delta_step, ((gpu_launch_dims){(unsigned)T, (unsigned)nv, 1, GPU_SSM_WARPS * 32}), what, &sa,
                   &g->ssm_z, &(CUdeviceptr){L->ssm_norm}, &g->act_h, &eps);
        } else {
            LAUNCH(g->k.delta_rule, ((gpu_launch_dims){(unsigned)T, (unsigned)nv, ceil_div((size_t)d, 32), GPU_SSM_WARPS * 32}),
                   what, &sa);
            LAUNCH(g->k.ssm_out_norm, ssm_heads_dims(T, nv), what, &g->ssm_o, &g->ssm_z, &(CUdeviceptr){L->ssm_norm},
                   &g->act_h, &d, &nv, &eps);
        }
    } else {
        int n = T * nv;
        LAUNCH(g->k.ssm_gates, ((gpu_launch_dims){ceil_div((size_t)n, 256), 1, 1, 256}), what, &ga, &n);
        /* a prompt's tokens in GPU_SSM_CONV_SEGS runs side by side (some sequence has more than a
         * chunk), else a warp per 32 channels */
        const unsigned segs = ap->n_chunks > ap->n_ssm ? GPU_SSM_CONV_SEGS : 1;
        LAUNCH(g->k.ssm_conv, ((gpu_launch_dims){(unsigned)ap->n_ssm, ceil_div((size_t)chan, 32), 1, 32 * segs}), what,
               &sa);
        LAUNCH(g->k.ssm_qk_norm, ssm_heads_dims(T, 2 * nk), what, &g->ssm_mix, &chan, &d, &nk);
        gpu_launch_dims per_seq = {(unsigned)ap->n_ssm, (unsigned)nv, ceil_div((size_t)d, 32), GPU_SSM_WARPS * 32};
        /* a prompt step: the chunked form (kernels/deltanet.cuh), whose sums depend on where the
         * chunks fall; deterministic: the exact recurrence, token by token, for every step */
        if (ap->n_chunks && !g->det) {
            CUdeviceptr chunks = g->in_d + g->in.schunk;
            gpu_launch_dims per_chunk = {(unsigned)ap->n_chunks, (unsigned)nv, 1, 256};
            LAUNCH(g->k.delta_chunk_prep, per_chunk, what, &sa, &chunks, &g->ssm_u, &g->ssm_w, &g->ssm_gc);
            gpu_launch_dims per_cols = {(unsigned)ap->n_ssm, (unsigned)nv, ceil_div((size_t)d, GPU_SSM_COLS), 256};
            LAUNCH(g->k.delta_chunk_state, per_cols, what, &sa, &g->ssm_u, &g->ssm_w, &g->ssm_gc);
            LAUNCH(g->k.delta_chunk_out, per_chunk, what, &sa, &chunks, &g->ssm_u, &g->ssm_gc);
        } else {
            LAUNCH(g->k.delta_rule, per_seq, what, &sa);
        }
        LAUNCH(g->k.ssm_out_norm, ssm_heads_dims(T, nv), what, &g->ssm_o, &g->ssm_z, &(CUdeviceptr){L->ssm_norm},
               &g->act_h, &d, &nv, &eps);
    }
    const int next = norm_point(g, 2 * il + 1, T); /* the feed-forward norm, which Wout's residual add writes */
    matmul_op out = {.out = {{&L->ssm_out, g->x, 0, g->d_embd}}, .n_out = 1, .x = g->act_h, .m = T,
                     .ldx = hp->ssm_inner, .accumulate = true, .norm = next >= 0 ? NORM_OUT : NORM_NONE,
                     .norm_p = next, .norm_w = L->ffn_norm, .what = what};
    return matmul(g, &out, err, errlen);
}

/* The shared expert of a MoE layer beside its routed ones (which already added theirs):
 * x += sigmoid(w_gate_inp_shexp . h) * Wdown_shexp fp16(silu(Wgate_shexp h) * Wup_shexp h), the
 * gate's logit in FP32 from moe_xf as the router's; a layer without that gate (GLM-4.5) adds
 * the expert's output as it is.  Where the batch-1 step carries its norms (gpu_norms_carried:
 * only then), gate/up read the feed-forward norm's input and the down product adds into x
 * itself (shexp_add's fmaf, the gate's logit moe_router_norm's: matmul_op.res_gate), writing
 * the next layer's norm input. */
static int shared_expert(gpu_engine *g, const gpu_layer *L, int T, const char *what, char *err, size_t errlen)
{
    const int il = (int)(L - g->layers);
    const bool carried = norm_point(g, 2 * il + 1, T) >= 0;
    const int next = carried && il + 1 < g->base.m->hp.n_layer ? norm_point(g, 2 * il + 2, T) : -1;
    CUdeviceptr logit = L->ffn_gate_inp_shexp ? g->sh_logit : 0; /* 0: shexp_add's gate is 1 */
    int one = 1; /* one output, one a block */
    if (logit && !carried) /* (carried: moe_router_norm's extra block wrote it) */
        LAUNCH(g->k.moe_router, ((gpu_launch_dims){ceil_div(T, GPU_MOE_ROUTER_TOKENS), 1, 1, 256}), what, &g->moe_xf,
               &(CUdeviceptr){L->ffn_gate_inp_shexp}, &(CUdeviceptr){0}, &g->d_embd, &one, &T, &one, &logit);
    /* (shexp_in_experts: the experts' GLU launch made ff_h) */
    if (!shexp_in_experts(g, L, T) && gated_ffn(g, L, true, T, what, err, errlen)) return -1;
    /* carried, the down product adds into x itself: writing the next norm's input (gated or
     * not), or in the last layer where nothing gates it; a gated last layer takes shexp_add */
    if (carried && (next >= 0 || !logit)) {
        matmul_op down = {.out = {{&L->ffn_down_shexp, g->x, 0, g->d_embd}}, .n_out = 1, .x = g->ff_h, .m = T,
                          .ldx = L->d_ff, .accumulate = true, .norm = next >= 0 ? NORM_OUT : NORM_NONE,
                          .norm_p = next, .norm_w = next >= 0 ? g->layers[il + 1].attn_norm : 0, .res_gate = logit,
                          .what = what};
        return matmul(g, &down, err, errlen);
    }
    /* ungated (DeepSeek-V2, GLM-4.5), the down product adds into x itself (the product's
     * epilogue *dst + v: shexp_add's fmaf(1, y, x), the same bits), one launch a layer fewer
     * (5.7 us of a batch-8 DeepSeek-V2-Lite layer's ~260 in ncu's serialized times); gated, its
     * output goes through shexp_add */
    matmul_op down = {.out = {{&L->ffn_down_shexp, logit ? g->sh_y : g->x, 0, g->d_embd}}, .n_out = 1, .x = g->ff_h,
                      .m = T, .ldx = L->d_ff, .accumulate = !logit, .what = what};
    if (matmul(g, &down, err, errlen)) return -1;
    if (logit)
        LAUNCH(g->k.shexp_add, ((gpu_launch_dims){(unsigned)T, 1, 1, 256}), what, &g->x, &g->sh_y, &logit, &g->d_embd);
    return 0;
}

/* BERT's MLP, post-LN: over act_h = fp16(x), x = LayerNorm(x + Wdown fp16(gelu(Wup h + b_up)) +
 * b_down) (Wup h in FP32 through g->up, the exact GELU into ff_h). */
static int ffn_mlp(gpu_engine *g, const gpu_layer *L, int T, const char *what, char *err, size_t errlen)
{
    matmul_op up = {.out = {{&L->w_up, g->up, L->b_up, L->d_ff}}, .n_out = 1, .x = g->act_h, .m = T,
                    .ldx = g->d_embd, .what = what};
    if (residual_to_f16(g, T, what, err, errlen) || matmul(g, &up, err, errlen)) return -1;
    size_t n = (size_t)T * L->d_ff; /* the padding columns past n_ff stay 0 (zeroed at allocation): gelu(0) = 0 */
    LAUNCH(g->k.gelu_erf, flat_dims(n), what, &g->up, &g->ff_h, &n);
    matmul_op down = {.out = {{&L->w_down, g->post, L->b_down, g->d_embd}}, .n_out = 1, .x = g->ff_h, .m = T,
                      .ldx = L->d_ff, .what = what};
    return residual_post_ln(g, &down, L->ffn_out_norm, L->ffn_out_norm_b, T, err, errlen);
}

/* nomic-bert's SwiGLU, post-LN: over act_h = fp16(x), x = LayerNorm(x + Wdown fp16(silu(Wgate h)
 * * Wup h)) (gated_ffn: fused where the formats allow), no biases. */
static int ffn_glu_post_ln(gpu_engine *g, const gpu_layer *L, int T, const char *what, char *err, size_t errlen)
{
    matmul_op down = {.out = {{&L->w_down, g->post, 0, g->d_embd}}, .n_out = 1, .x = g->ff_h, .m = T,
                      .ldx = L->d_ff, .what = what};
    if (residual_to_f16(g, T, what, err, errlen) || gated_ffn(g, L, false, T, what, err, errlen)) return -1;
    return residual_post_ln(g, &down, L->ffn_out_norm, L->ffn_out_norm_b, T, err, errlen);
}

/* An attention block of layer il over the normed act_h (attention_softmax, _linear, _mla). */
typedef int (*gpu_block)(gpu_engine *g, int il, int T, const gpu_attn_plan *ap, const char *what, char *err,
                         size_t errlen);

/* x += the attention block of layer il over h = fp16(rmsnorm(x) * attn_norm): softmax
 * attention, a linear layer's gated DeltaNet or a latent-attention layer's MLA. */
static int attention_block(gpu_engine *g, int il, int T, const gpu_attn_plan *ap, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const gpu_layer *L = &g->layers[il];
    char what[64];
    snprintf(what, sizeof what, "layer %d attention", il);
    /* a linear or latent layer's projections read the norm to about 22 bits (act_lo) */
    norm_op n1 = {.x = g->x, .w = L->attn_norm, .yh = g->act_h, .ylo = L->lin >= 0 || L->mla ? g->act_lo : 0,
                  .rows = T, .n = hp->n_embd, .q8 = !L->post_ln && norm_q8(g, T, hp->n_embd)};
    if (norm_point(g, 2 * il, T) >= 0) { /* carried: the layer before's down product wrote it */
        if (il == 0) { /* the embeddings' (gpu_shared.h matvec_norm) */
            int n = g->d_embd;
            float eps = hp->rms_eps;
            CUdeviceptr lo = norm_point_lo(g, 0) ? g->norm_lo : 0;
            LAUNCH(g->k.norm_prep, ((gpu_launch_dims){1, 1, 1, 1024}), what, &g->x, &(CUdeviceptr){L->attn_norm},
                   &g->norm_h, &lo, &g->norm_part, &g->norm_ss, &n, &eps);
        }
    } else if (L->post_ln ? residual_to_f16(g, T, what, err, errlen)
                          : !sandwich_carries(g, 2 * il, T) && rmsnorm(g, &n1, what, err, errlen)) {
        return -1;
    }
    const gpu_block block = L->lin >= 0 ? attention_linear : L->mla ? attention_mla : attention_softmax;
    return block(g, il, T, ap, what, err, errlen);
}

static int layer_forward(gpu_engine *g, int il, int T, const gpu_attn_plan *ap, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const gpu_layer *L = &g->layers[il];
    if (attention_block(g, il, T, ap, err, errlen)) return -1;
    char what[64];
    snprintf(what, sizeof what, "layer %d feed-forward", il);
    const arch_ffn ffn = g->base.m->layers[il].recipe.ffn;
    if (L->mlp) return ffn_mlp(g, L, T, what, err, errlen);
    if (L->post_ln) return ffn_glu_post_ln(g, L, T, what, err, errlen); /* nomic-bert */
    bool moe = ffn == ARCH_FFN_MOE; /* the router reads the norm in FP32 too */
    norm_op n2 = {.x = g->x, .w = L->ffn_norm, .y = moe ? g->moe_xf : 0, .yh = g->act_h, .rows = T, .n = hp->n_embd,
                  .q8 = norm_q8(g, T, hp->n_embd)};
    /* else Wo's add wrote it (carried, or the sandwich's post_norm_add) */
    if (norm_point(g, 2 * il + 1, T) < 0 && !sandwich_carries(g, 2 * il + 1, T) && rmsnorm(g, &n2, what, err, errlen))
        return -1;
    int rc;
    bool scaled = false; /* the layer's output scale folded into the feed-forward's block_end */
    if (moe) {
        rc = ffn_moe(g, L, T, what, err, errlen);
        if (rc == 0 && L->ffn_gate_shexp.d) rc = shared_expert(g, L, T, what, err, errlen);
    } else if (ffn == ARCH_FFN_GLU_MOE) {
        rc = ffn_glu_moe(g, L, T, what, err, errlen);
    } else {
        /* the next layer's attention norm rides on the residual add (the LM head's keeps its launch) */
        const int next = il + 1 < hp->n_layer ? norm_point(g, 2 * il + 2, T) : -1;
        matmul_op down = {.out = {{&L->w_down, g->x, 0, g->d_embd}}, .n_out = 1, .x = g->ff_h, .m = T, .ldx = L->d_ff,
                          .accumulate = true, .norm = next >= 0 ? NORM_OUT : NORM_NONE, .norm_p = next,
                          .norm_w = next >= 0 ? g->layers[il + 1].attn_norm : 0, .what = what};
        scaled = L->has_out_scale && L->ffn_post_norm && g->tp_rank < 0 && hp->n_embd_ple == 0;
        rc = gated_ffn(g, L, false, T, what, err, errlen) ||
                     block_end(g, &down, L->ffn_post_norm, scaled ? L->out_scale : 1.0f, 2 * il + 2, T, err, errlen)
                 ? -1
                 : 0;
    }
    if (rc) return -1;
    if (hp->n_embd_ple > 0 && per_layer_embedding(g, L, il, T, err, errlen)) return -1;
    if (L->has_out_scale && !scaled)
        return scale_op(g, &g->k.scale_f32, g->x, (size_t)T * hp->n_embd, L->out_scale, "layer output scale", err, errlen);
    return 0;
}

/* Final norm + LM head over n rows of x picked by an index list (stride in ints).  Under
 * tensor parallelism with the LM head split by vocabulary (g->tp_vocab1, gpu_tp.c), unless
 * whole: this rank's rows of the output into their columns of rank 0's logits, and the hand-over
 * (gpu_tp_gather), after which the other ranks have no logits of their own to finish. */
static int lm_head(gpu_engine *g, CUdeviceptr idx, int stride, int n, bool whole, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    norm_op no = {.x = g->x, .idx = idx, .idx_stride = stride, .w = g->output_norm, .yh = g->xl_h, .rows = n,
                  .n = hp->n_embd, .q8 = norm_q8(g, n, hp->n_embd)};
    if (rmsnorm(g, &no, "LM head", err, errlen)) return -1;
    const bool split = !whole && g->tp_vocab1 > 0;
    gpu_matrix w = g->output;
    CUdeviceptr y = g->logits;
    if (split) { /* rows [tp_vocab0, tp_vocab1) of the matrix, as they lie (and of its FP16 copy) */
        w.d += (size_t)g->tp_vocab0 * w.row_bytes;
        if (w.h16) w.h16 += (size_t)g->tp_vocab0 * w.k * sizeof(uint16_t);
        w.n = g->tp_vocab1 - g->tp_vocab0;
        w.expert_bytes = (size_t)w.n * w.row_bytes;
        y = (g->tp_rank > 0 ? g->tp_logits0 : g->logits) + (size_t)g->tp_vocab0 * sizeof(float);
    }
    matmul_op op = {.out = {{&w, y, 0, hp->n_vocab}}, .n_out = 1, .x = g->xl_h, .m = n,
                    .ldx = g->d_embd, .x_q8 = no.q8, .what = "LM head"};
    if (matmul(g, &op, err, errlen)) return -1;
    if (split && gpu_tp_gather(g, "LM head", err, errlen)) return -1;
    if (split && g->tp_rank > 0) return 0;
    if (hp->logit_softcap > 0)
        return scale_op(g, &g->k.softcap, g->logits, (size_t)n * hp->n_vocab, hp->logit_softcap, "LM head", err, errlen);
    return 0;
}

int gpu_forward_logits_rows(gpu_engine *g, int first, int n, char *err, size_t errlen)
{
    return lm_head(g, g->in_d + g->in.lidx + (size_t)first * sizeof(int32_t), 1, n, true, err, errlen);
}

int gpu_forward_hidden_rows(gpu_engine *g, int first, int n, char *err, size_t errlen)
{
    CUdeviceptr rows = g->x + (size_t)first * g->d_embd * sizeof(float);
    if (!g->output_norm) return 0; /* an encoder: its last layer's LayerNorm is the end */
    norm_op no = {.x = rows, .w = g->output_norm, .y = rows, .rows = n, .n = g->base.m->hp.n_embd};
    return rmsnorm(g, &no, "hidden states", err, errlen);
}

/* An encoder's embedding stage after the token rows in x (cpu_engine.c: embed_tokens): + its
 * position's row (bert's absolute table, gathered by position into g->post; a rotary encoder
 * has none), + token type 0's row, then the LayerNorm. */
static int encoder_embeddings(gpu_engine *g, int T, char *err, size_t errlen)
{
    const char *what = "embedding";
    int ne = g->d_embd;
    size_t total = (size_t)T * ne;
    if (g->pos_embd.d) {
        unsigned long long rb = g->pos_embd.row_bytes;
        LAUNCH(g->k.embed[g->pos_embd.wtype], ((gpu_launch_dims){(unsigned)T, 1, 1, 64}), what, &g->pos_embd.d, &rb,
               &ne, &(CUdeviceptr){g->in_d + g->in.pos}, &g->post);
        if (add_rows(g, g->x, g->post, T, what, err, errlen)) return -1;
    }
    if (g->tok_types)
        LAUNCH(g->k.add_bias, ((gpu_launch_dims){ceil_div(total, 256), 1, 1, 256}), what, &g->x, &g->tok_types, &ne,
               &total);
    return layernorm(g, 0, g->embd_norm, g->embd_norm_b, T, what, err, errlen);
}

int gpu_forward(gpu_engine *g, int T, int R, const gpu_attn_plan *ap, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    CUdeviceptr tok = g->in_d + g->in.tok, slot = g->in_d + g->in.slot, pos = g->in_d + g->in.pos;
    int ctx = g->base.cfg.ctx_per_slot, ne = hp->n_embd;
    unsigned long long rb = g->tok_embd.row_bytes;
    LAUNCH(g->k.hist_store, ((gpu_launch_dims){ceil_div(T, 128), 1, 1, 128}), "token history", &g->hist, &ctx,
           &tok, &slot, &pos, &T);
    LAUNCH(g->k.embed[g->tok_embd.wtype], ((gpu_launch_dims){(unsigned)T, 1, 1, 64}), "embedding",
           &g->tok_embd.d, &rb, &ne, &tok, &g->x);
    if (g->base.m->desc->embed_scale &&
        scale_op(g, &g->k.scale_f32, g->x, (size_t)T * ne, hp->embd_scale, "embedding", err, errlen))
        return -1;
    if (hp->n_embd_ple > 0 && per_layer_inputs(g, T, err, errlen)) return -1;
    if (hp->encoder && encoder_embeddings(g, T, err, errlen)) return -1;
    for (int il = 0; il < hp->n_layer; il++)
        if (layer_forward(g, il, T, ap, err, errlen)) return -1;
    if (R == 0) return 0;
    int stride = (int)(sizeof(gpu_sample_row) / sizeof(int32_t));
    if (lm_head(g, g->in_d + g->in.rows, stride, R, false, err, errlen)) return -1;
    if (g->tp_vocab1 > 0 && g->tp_rank > 0) return 0; /* rank 0 samples over the gathered logits */
    sample_args sa = {
        .logits = F32(g->logits), .work = F32(g->work), .counts = I32(g->counts),
        .rows = (const gpu_sample_row *)(uintptr_t)(g->in_d + g->in.rows),
        .bias = (const gpu_bias *)(uintptr_t)(g->in_d + g->in.bias), .hist = I32(g->hist),
        .mask = (const uint32_t *)(uintptr_t)(g->in_d + g->in.mask), .mask_words = g->mask_words,
        .ctx = ctx, .n_vocab = hp->n_vocab, .parts = F32(g->parts), .n_parts = GPU_SAMPLE_PARTS,
        .out = (gpu_sample_out *)(uintptr_t)g->sout,
    };
    gpu_launch_dims sliced = {(unsigned)R, GPU_SAMPLE_PARTS, 1, 256};
    LAUNCH(g->k.sample_prep, sliced, "sampling", &sa);
    LAUNCH(g->k.sample_adjust, ((gpu_launch_dims){(unsigned)R, 1, 1, 256}), "sampling", &sa);
    LAUNCH(g->k.sample_reduce, sliced, "sampling", &sa);
    LAUNCH(g->k.sample, ((gpu_launch_dims){(unsigned)R, 1, 1, 1024}), "sampling", &sa);
    return 0;
}
