/* gpu_engine.c - the CUDA engine: one context and compute stream, the weights uploaded once
 * in their GGUF (quantised) form, a pool of FP16 K/V blocks, and engine_step() that packs a
 * batch into one host->device copy, runs the forward pass (a captured CUDA graph per batch
 * bucket for pure decode steps) and brings back only the sampled tokens (and logits when a
 * caller asks for them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/quant.h"
#include "gpu.h"
#include "gpu_internal.h"

#ifndef INFERD_GPU_DP4A
#define INFERD_GPU_DP4A 0
#endif

#define MIB (1024.0 * 1024.0)
#define DEV_ALIGN 256
/* A pool sized from free memory leaves this much besides for what CUDA and cuBLAS allocate
 * later (graph instantiation, cuBLAS internals), and holds at most this many blocks: beyond
 * it the prefix cache's host tables cost more than the hits are worth. */
#define GPU_KV_AUTO_SPARE ((size_t)1 << 30)
#define GPU_KV_AUTO_MAX_BLOCKS (1 << 17)

_Static_assert(GPU_KV_BLOCK == ENGINE_KV_BLOCK, "the kernels' KV block is the engine's");

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
static int pow2_at_least(int n)
{
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

int engine_cuda_device_count(char *err, size_t errlen)
{
    int n = 0;
    if (!cuda_api_load(err, errlen)) return 0;
    CUresult rc = cu.cuDeviceGetCount(&n);
    if (rc != CUDA_SUCCESS) {
        char b[160];
        snprintf(err, errlen, "counting GPUs: %s", cuda_api_strerror(rc, b, sizeof b));
        return 0;
    }
    if (n == 0) snprintf(err, errlen, "the CUDA driver sees no GPU");
    return n;
}

bool engine_cuda_available(void)
{
    char err[256];
    return engine_cuda_device_count(err, sizeof err) > 0;
}

/* ---- weights ---------------------------------------------------------------------------- */

/* Device bytes a tensor takes: matrices keep their format (float rows padded to 32 inputs),
 * vectors become F32. */
static size_t matrix_bytes(const model_tensor *t)
{
    if (!t->data) return 0;
    return (size_t)t->ne1 * (size_t)t->ne2 * gpu_row_bytes(t->type, (int)((t->ne0 + 31) / 32 * 32));
}
static size_t vector_bytes(const model_tensor *t) { return t->data ? (size_t)t->ne0 * sizeof(float) : 0; }

typedef struct uploader {
    gpu_engine *g;
    size_t off;
} uploader;

/* A matrix, or a 3-D expert tensor as ne2 matrices of ne1 rows; an absent one stays d == 0. */
static int upload_matrix(uploader *u, gpu_matrix *dst, const model_tensor *t, char *err, size_t errlen)
{
    memset(dst, 0, sizeof *dst);
    dst->wtype = -1;
    if (!t->data) return 0;
    dst->type = t->type;
    dst->wtype = gpu_wtype_index(t->type);
    dst->n = (int)t->ne1;
    dst->k = (int)((t->ne0 + 31) / 32 * 32);
    if (dst->wtype < 0 || (t->ne0 % 32 && !(t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 ||
                                             t->type == GGML_TYPE_BF16))) {
        snprintf(err, errlen, "tensor %s: type %s with %lld inputs per row is not supported on the GPU",
                 t->name, ggml_type_name(t->type), (long long)t->ne0);
        return -1;
    }
    dst->row_bytes = gpu_row_bytes(t->type, dst->k);
    dst->n_expert = (int)t->ne2;
    dst->expert_bytes = (size_t)dst->n * dst->row_bytes;
    dst->d = u->g->wbuf + u->off;
    size_t bytes = matrix_bytes(t), rows = (size_t)t->ne1 * (size_t)t->ne2;
    if (dst->row_bytes == t->row_bytes) {
        CU_CHECK(cu.cuMemcpyHtoD(dst->d, t->data, bytes), t->name);
    } else { /* the kernels' layout: float rows padded to 32 inputs, Q6_K blocks in 16-byte slots */
        unsigned char *tmp = malloc(bytes);
        if (!tmp) {
            snprintf(err, errlen, "%s: out of host memory repacking rows", t->name);
            return -1;
        }
        gpu_pack_rows(t->type, dst->k, t->data, t->row_bytes, (int)t->ne0, tmp, rows);
        CUresult rc = cu.cuMemcpyHtoD(dst->d, tmp, bytes);
        free(tmp);
        CU_CHECK(rc, t->name);
    }
    u->off += align_up(bytes, DEV_ALIGN);
    return 0;
}

static int upload_vector(uploader *u, CUdeviceptr *dst, const model_tensor *t, char *err, size_t errlen)
{
    *dst = 0;
    if (!t->data) return 0;
    size_t n = (size_t)t->ne0;
    float *tmp = malloc(n * sizeof *tmp);
    if (!tmp) {
        snprintf(err, errlen, "%s: out of host memory", t->name);
        return -1;
    }
    quant_dequantize_row(t->type, t->data, tmp, (int64_t)n);
    *dst = u->g->wbuf + u->off;
    CUresult rc = cu.cuMemcpyHtoD(*dst, tmp, n * sizeof *tmp);
    free(tmp);
    CU_CHECK(rc, t->name);
    u->off += align_up(n * sizeof(float), DEV_ALIGN);
    return 0;
}

/* The matrices of a layer that the ordinary products read, and the 3-D expert tensors that
 * only the MoE kernels read (the router, ffn_gate_inp, goes up in F32: upload_router). */
#define LAYER_MATRICES(X)                                                                                   \
    X(wq) X(wk) X(wv) X(wo) X(w_gate) X(w_up) X(w_down) X(ple_gate) X(ple_proj) X(ffn_gate_shexp) X(ffn_up_shexp) \
    X(ffn_down_shexp) X(ssm_qkv) X(ssm_gate) X(ssm_beta) X(ssm_alpha) X(ssm_ba) X(ssm_out) X(wq_a) X(wq_b) X(wkv_a)
#define EXPERT_MATRICES(X) X(ffn_gate_exps) X(ffn_up_exps) X(ffn_down_exps) X(ffn_gate_up_exps)
#define N_LAYER_MATRICES 21
/* Matrices read as F32 rows whatever their format: a MoE layer's router [n_expert][n_embd]
 * and the shared expert's gate [1][n_embd] (moe_router reads them in FP32: kernels/moe.cuh
 * says why), the DeltaNet's conv taps [chan][taps], the experts' biases [n_expert][width];
 * latent attention's per-head wk_b [n_head][kv_lora][nope] and wv_b [n_head][v][kv_lora],
 * which cuBLAS multiplies for every head of every token in one batched FP32 product
 * (gpu_forward.c: head_product; in FP16 they moved the reference deepseek_v3's top-1 against
 * the CPU to 97.6 %, docs/mla-gpu.md); absent: 0. */
#define F32_MATRICES(X)                                                                                   \
    X(router, ffn_gate_inp) X(ffn_gate_inp_shexp, ffn_gate_inp_shexp) X(ssm_conv1d, ssm_conv1d)              \
    X(ffn_gate_exps_b, ffn_gate_exps_b) X(ffn_up_exps_b, ffn_up_exps_b) X(ffn_down_exps_b, ffn_down_exps_b)   \
    X(wk_b, wk_b) X(wv_b, wv_b)
static size_t router_bytes(const model_tensor *t)
{
    return t->data ? (size_t)t->ne0 * t->ne1 * t->ne2 * sizeof(float) : 0;
}

/* Gemma 4's scaled router (ARCH_ROUTER_SCALED) reads rmsnorm(x) / sqrt(n_embd) *
 * ffn_gate_inp.scale: the scale goes into the router's columns here, so the GPU's router reads
 * the unweighted norm as the softmax router reads its normed input. */
static int fold_router_scale(const model_layer *L, int n_embd, float *w, size_t rows, char *err, size_t errlen)
{
    if (!L->router_scale.data) return 0;
    float *scale = malloc((size_t)n_embd * sizeof *scale);
    if (!scale) {
        snprintf(err, errlen, "%s: out of host memory", L->router_scale.name);
        return -1;
    }
    quant_dequantize_row(L->router_scale.type, L->router_scale.data, scale, n_embd);
    const float inv_sqrt_dim = 1.0f / sqrtf((float)n_embd);
    for (size_t r = 0; r < rows; r++)
        for (int d = 0; d < n_embd; d++) w[r * (size_t)n_embd + d] *= scale[d] * inv_sqrt_dim;
    free(scale);
    return 0;
}

/* One of layer L's F32_MATRICES, t, as F32 rows (the router with its scale folded in). */
static int upload_router(uploader *u, CUdeviceptr *dst, const model_layer *L, const model_tensor *t, char *err,
                         size_t errlen)
{
    *dst = 0;
    if (!t->data) return 0;
    size_t n = (size_t)t->ne0, rows = (size_t)t->ne1 * (size_t)t->ne2;
    float *tmp = malloc(n * rows * sizeof *tmp);
    if (!tmp) {
        snprintf(err, errlen, "%s: out of host memory", t->name);
        return -1;
    }
    for (size_t r = 0; r < rows; r++)
        quant_dequantize_row(t->type, (const char *)t->data + r * t->row_bytes, tmp + r * n, (int64_t)n);
    if (t == &L->ffn_gate_inp && fold_router_scale(L, (int)n, tmp, rows, err, errlen)) {
        free(tmp);
        return -1;
    }
    *dst = u->g->wbuf + u->off;
    CUresult rc = cu.cuMemcpyHtoD(*dst, tmp, n * rows * sizeof *tmp);
    free(tmp);
    CU_CHECK(rc, t->name);
    u->off += align_up(n * rows * sizeof(float), DEV_ALIGN);
    return 0;
}

#define LAYER_VECTORS(X)                                                                                 \
    X(attn_norm) X(ffn_norm) X(bq) X(bk) X(bv) X(q_norm) X(k_norm) X(attn_post_norm) X(ffn_post_norm)      \
    X(ple_post_norm) X(expert_scale) X(ffn_pre_norm_2) X(ffn_post_norm_1) X(ffn_post_norm_2) X(ssm_a) X(ssm_dt) \
    X(ssm_norm) X(bo) X(attn_sinks) X(ffn_gate_inp_b) X(exp_probs_b) X(b_up) X(b_down) X(attn_out_norm)          \
    X(attn_out_norm_b) X(ffn_out_norm) X(ffn_out_norm_b) X(q_a_norm) X(kv_a_norm)
#define GLOBAL_MATRICES(X) X(tok_embd) X(ple_tok_embd) X(ple_model_proj) X(pos_embd)
/* tok_types as a vector: its first row, token type 0's (an embedding request is one segment) */
#define GLOBAL_VECTORS(X)                                                                                \
    X(output_norm) X(rope_freqs) X(ple_proj_norm) X(tok_types) X(embd_norm) X(embd_norm_b) X(rope_factors_short) \
    X(rope_factors_long)

static size_t weights_bytes(const model *m)
{
    size_t b = 0;
#define ADD_GM(f) b += align_up(matrix_bytes(&m->f), DEV_ALIGN);
#define ADD_GV(f) b += align_up(vector_bytes(&m->f), DEV_ALIGN);
    GLOBAL_MATRICES(ADD_GM) GLOBAL_VECTORS(ADD_GV)
#undef ADD_GM
#undef ADD_GV
    if (m->output.data != m->tok_embd.data) b += align_up(matrix_bytes(&m->output), DEV_ALIGN);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const model_layer *L = &m->layers[l];
#define ADD_M(f) b += align_up(matrix_bytes(&L->f), DEV_ALIGN);
#define ADD_V(f) b += align_up(vector_bytes(&L->f), DEV_ALIGN);
#define ADD_R(gf, mf) b += align_up(router_bytes(&L->mf), DEV_ALIGN);
        LAYER_MATRICES(ADD_M) EXPERT_MATRICES(ADD_M) LAYER_VECTORS(ADD_V) F32_MATRICES(ADD_R)
#undef ADD_M
#undef ADD_V
#undef ADD_R
    }
    return b;
}

/* The device copy of the RoPE divisors layer L turns by in this engine's context: the model's
 * rope_freqs, or LongRoPE's short or long factors (model_rope_freqs chooses, as for the CPU). */
static CUdeviceptr layer_rope_freqs(const gpu_engine *g, const model_layer *L)
{
    const model *m = g->base.m;
    const float *f = model_rope_freqs(m, L, g->base.cfg.ctx_per_slot);
    if (!f) return 0;
    if (f == m->rope_factors_long.data) return g->rope_factors_long;
    if (f == m->rope_factors_short.data) return g->rope_factors_short;
    return g->rope_freqs;
}

static int upload_weights(gpu_engine *g, char *err, size_t errlen)
{
    const model *m = g->base.m;
    g->wbytes = weights_bytes(m);
    CU_CHECK(cu.cuMemAlloc(&g->wbuf, g->wbytes), "allocating the weights");
    g->layers = calloc((size_t)m->hp.n_layer, sizeof *g->layers);
    if (!g->layers) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    uploader u = {g, 0};
#define UP_GM(f) if (upload_matrix(&u, &g->f, &m->f, err, errlen)) return -1;
#define UP_GV(f) if (upload_vector(&u, &g->f, &m->f, err, errlen)) return -1;
    GLOBAL_MATRICES(UP_GM) GLOBAL_VECTORS(UP_GV)
#undef UP_GM
#undef UP_GV
    int n_lin = 0;
    if (m->output.data == m->tok_embd.data) g->output = g->tok_embd;
    else if (upload_matrix(&u, &g->output, &m->output, err, errlen)) return -1;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        gpu_layer *G = &g->layers[l];
#define UP_M(f) if (upload_matrix(&u, &G->f, &L->f, err, errlen)) return -1;
#define UP_V(f) if (upload_vector(&u, &G->f, &L->f, err, errlen)) return -1;
#define UP_R(gf, mf) if (upload_router(&u, &G->gf, L, &L->mf, err, errlen)) return -1;
        LAYER_MATRICES(UP_M) EXPERT_MATRICES(UP_M) LAYER_VECTORS(UP_V) F32_MATRICES(UP_R)
#undef UP_M
#undef UP_V
#undef UP_R
        if (G->ffn_gate_up_exps.d) { /* gate and up: the two halves of each expert's rows */
            gpu_matrix half = G->ffn_gate_up_exps;
            half.n /= 2;
            G->ffn_gate_exps = half;
            half.d += (size_t)half.n * half.row_bytes;
            G->ffn_up_exps = half;
        }
        /* states for the linear layers only; K/V regions (place_layer_kv) for the attention
         * layers only */
        bool linear = L->recipe.attn == ARCH_ATTN_LINEAR;
        G->lin = linear ? n_lin++ : -1;
        G->gated = (L->recipe.attn_extras & ARCH_ATTN_OUT_GATE) != 0;
        G->n_rot = L->recipe.attn_extras & ARCH_ATTN_ROPE_PARTIAL ? m->hp.n_rot : 0;
        G->window = L->window;
        G->rope_base = L->rope_base;
        G->rope_scale = L->rope_scale;
        G->rope_freqs = layer_rope_freqs(g, L);
        G->router_sigmoid = L->recipe.router == ARCH_ROUTER_SIGMOID_BIAS;
        G->n_group = L->recipe.ffn_extras & ARCH_FFN_EXPERT_GROUPS ? m->hp.n_expert_groups : 0;
        G->geglu = L->recipe.act == ARCH_ACT_GELU_TANH;
        G->swiglu_clamp = L->recipe.act == ARCH_ACT_SWIGLU_CLAMP;
        G->topk_first = L->recipe.router == ARCH_ROUTER_TOPK_SOFTMAX;
        /* the biases and sinks the CPU engine reads only where the recipe asks */
        if (!(L->recipe.attn_extras & ARCH_ATTN_OUT_BIAS)) G->bo = 0;
        if (!(L->recipe.attn_extras & ARCH_ATTN_SINKS)) G->attn_sinks = 0;
        if (!(L->recipe.ffn_extras & ARCH_FFN_BIAS))
            G->ffn_gate_inp_b = G->ffn_gate_exps_b = G->ffn_up_exps_b = G->ffn_down_exps_b = 0;
        G->post_ln = L->recipe.norm == ARCH_NORM_POST_LN;
        G->mlp = L->recipe.ffn == ARCH_FFN_MLP;
        g->bidir |= (L->recipe.attn_extras & ARCH_ATTN_BIDIR) != 0;
        G->v_norm = L->recipe.attn_extras & ARCH_ATTN_V_NORM;
        G->mla = L->recipe.attn == ARCH_ATTN_MLA;
        G->hd = L->head_dim;
        G->n_kv = L->n_head_kv;
        G->d_q = m->hp.n_head * L->head_dim;
        G->d_kv = L->n_head_kv * L->head_dim;
        /* the shared expert's GLU runs through the dense FFN's buffers */
        int n_ff = L->ffn_gate_shexp.data && m->hp.n_ff_shexp > L->n_ff ? m->hp.n_ff_shexp : L->n_ff;
        G->d_ff = (n_ff + 31) / 32 * 32;
        G->kv_own = L->kv_source == l && !linear;
        G->has_out_scale = L->out_scale.data != NULL;
        if (G->has_out_scale) quant_dequantize_row(L->out_scale.type, L->out_scale.data, &G->out_scale, 1);
        if (g->base.cfg.verbose && (l + 1) % 8 == 0)
            log_info("cuda: uploaded layers %d/%d (%.0f MiB)", l + 1, m->hp.n_layer, u.off / MIB);
    }
    /* cuMemcpyHtoD from pageable memory returns with its last DMA still in flight on the legacy
     * stream, which g->stream (non-blocking) does not wait for: make_resident_f16's dequant_f16
     * or a first step could read the last tensors before they land (test_gpu_kernels' NaN
     * references were this). */
    CU_CHECK(cu.cuCtxSynchronize(), "uploading the weights");
    return 0;
}

/* Matrices cuBLAS multiplies from an FP16 copy: block-quantised ones mmq does not serve
 * (gpu_mmq_serves: a format with no mmq kernels; gpt-oss's 2,880-wide Q8_0 rows are served, in
 * a partial last stage).  The float formats never: F16 rows are cuBLAS's operand as they lie,
 * BF16 ones go to mmq, F32 ones to cuBLAS's FP32 product (gpu_forward.c: path_for,
 * blas_matmul). */
static bool needs_f16_copy(const gpu_engine *g, const gpu_matrix *w)
{
    return w->d && !gpu_mmq_serves(&g->k, w->wtype, w->k) && w->type != GGML_TYPE_F16 &&
           w->type != GGML_TYPE_BF16 && w->type != GGML_TYPE_F32;
}

static bool is_f32(const gpu_engine *g, const gpu_matrix *w)
{
    (void)g;
    return w->d && w->type == GGML_TYPE_F32;
}

/* Every matrix a step multiplies on cuBLAS that `pick` picks (the layers' and the LM head's;
 * not the embedding table, which is only gathered from, nor the experts, which only the MoE
 * kernels read), into list (at most N_LAYER_MATRICES per layer + 2).  Returns the count. */
static int blas_matrices(gpu_engine *g, bool (*pick)(const gpu_engine *, const gpu_matrix *), gpu_matrix **list)
{
    int n = 0;
    if (pick(g, &g->output)) list[n++] = &g->output;
    if (pick(g, &g->ple_model_proj)) list[n++] = &g->ple_model_proj;
    for (int l = 0; l < g->base.m->hp.n_layer; l++) {
        gpu_layer *L = &g->layers[l];
#define LIST(f) if (pick(g, &L->f)) list[n++] = &L->f;
        LAYER_MATRICES(LIST)
#undef LIST
    }
    return n;
}

static size_t f16_bytes(const gpu_matrix *w) { return align_up((size_t)w->n * w->k * sizeof(uint16_t), DEV_ALIGN); }

/* Largest matrix and all matrices together, in FP16 bytes (the dequantisation scratch, or
 * the resident copies); and the widest F32 matrix's inputs (its activations' FP32 copy). */
static void blas_sizes(gpu_engine *g, size_t *largest, size_t *total, int *f32_k)
{
    gpu_matrix **list = malloc(((size_t)g->base.m->hp.n_layer * N_LAYER_MATRICES + 2) * sizeof *list);
    *largest = *total = 0;
    *f32_k = 0;
    if (!list) return;
    int n = blas_matrices(g, needs_f16_copy, list);
    for (int i = 0; i < n; i++) {
        size_t b = f16_bytes(list[i]);
        if (b > *largest) *largest = b;
        *total += b;
    }
    n = blas_matrices(g, is_f32, list);
    for (int i = 0; i < n; i++)
        if (list[i]->k > *f32_k) *f32_k = list[i]->k;
    free(list);
}

/* Dequantise every matrix once into g->w16 (same values the per-step path would make:
 * one kernel does both), so cuBLAS steps read FP16 weights without re-decoding them. */
static int make_resident_f16(gpu_engine *g, char *err, size_t errlen)
{
    gpu_matrix **list = malloc(((size_t)g->base.m->hp.n_layer * N_LAYER_MATRICES + 2) * sizeof *list);
    if (!list) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    int n = blas_matrices(g, needs_f16_copy, list);
    size_t off = 0;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        list[i]->h16 = g->w16 + off;
        off += f16_bytes(list[i]);
        rc = gpu_dequant_f16(g, list[i], list[i]->h16, "FP16 weight copies", err, errlen);
    }
    free(list);
    return rc;
}

/* ---- buffers ------------------------------------------------------------------------------ */

typedef struct alloc_req {
    CUdeviceptr *p;
    size_t bytes;
} alloc_req;

static int alloc_all(const alloc_req *req, int n, const char *what, CUstream s, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++) {
        if (!req[i].bytes) continue;
        CU_CHECK(cu.cuMemAlloc(req[i].p, req[i].bytes), what);
        CU_CHECK(cu.cuMemsetD8Async(*req[i].p, 0, req[i].bytes, s), what);
    }
    return 0;
}

/* Bytes of one KV block of layer L in one of the caches (K, or V where there is one). */
static size_t layer_block_bytes(const gpu_layer *L)
{
    return (size_t)L->n_kv * GPU_KV_BLOCK * (size_t)L->hd * sizeof(uint16_t);
}

/* Bytes of one KV block of one pool (swa: the sliding layers') in one of the two caches: every
 * layer of that pool that computes its own K/V (not the shared-K/V layers, not the linear
 * layers). */
static size_t kv_block_bytes(const gpu_engine *g, bool swa)
{
    size_t b = 0;
    for (int l = 0; l < g->base.m->hp.n_layer; l++)
        if (g->layers[l].kv_own && g->layers[l].kv_swa == swa) b += layer_block_bytes(&g->layers[l]);
    return b;
}

/* Each layer's region of the caches for its pool's blocks + 1 (n_blocks, or n_swa for the
 * sliding layers): its own, one after the other, or (shared K/V) its kv_source's; a linear
 * layer has none. */
static void place_layer_kv(gpu_engine *g, size_t n_blocks, size_t n_swa)
{
    const model *m = g->base.m;
    size_t off = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        gpu_layer *L = &g->layers[l];
        if (L->lin >= 0) continue;
        if (!L->kv_own) {
            L->kc = g->layers[m->layers[l].kv_source].kc;
            L->vc = g->layers[m->layers[l].kv_source].vc;
            continue;
        }
        L->kc = g->kc + off;
        L->vc = g->kv_caches == 2 ? g->vc + off : L->kc; /* latent rows: the keys are the values */
        off += ((L->kv_swa ? n_swa : n_blocks) + 1) * layer_block_bytes(L);
    }
}

/* A hybrid model's recurrent-state slots (engine_config.n_states, 0: one per row) and their
 * layout (gpu_internal.h); 0 slots for a model without linear layers. */
static int plan_states(gpu_engine *g)
{
    const model_hparams *hp = &g->base.m->hp;
    int n_lin = 0;
    for (int l = 0; l < hp->n_layer; l++) n_lin += g->layers[l].lin >= 0;
    if (!n_lin) return 0;
    g->ssm_chan = 2 * hp->ssm_groups * hp->ssm_state + hp->ssm_inner;
    g->conv_floats = (size_t)(hp->ssm_conv - 1) * (size_t)g->ssm_chan;
    g->layer_floats = g->conv_floats + (size_t)hp->ssm_vheads * hp->ssm_state * hp->ssm_state;
    g->slot_floats = (size_t)n_lin * g->layer_floats;
    g->base.n_states = g->base.cfg.n_states ? g->base.cfg.n_states : g->base.cfg.n_slots;
    g->base.state_bytes = g->slot_floats * sizeof(float);
    g->state_len = calloc((size_t)g->base.n_states, sizeof *g->state_len);
    return g->state_len ? 0 : -1;
}

/* The full pool's blocks: --kv-cache-size when given (less the sliding pool, which is carved
 * out first, as on the CPU); with kv_per_row one context per row; else what free memory leaves after the buffers (`used`), the
 * sliding pool, the reserve and GPU_KV_AUTO_SPARE.  0 when that is less than one block.  A
 * model whose every attention layer is in the sliding pool has blocks of no bytes: what one
 * slot per sequence would take. */
static size_t kv_pool_blocks(const gpu_engine *g, size_t free_b, size_t used)
{
    const engine_config *cfg = &g->base.cfg;
    size_t pair = g->kv_caches * g->block_bytes;
    if (!pair || (cfg->kv_per_row && !cfg->kv_cache_mb)) return (size_t)cfg->n_slots * g->table_width;
    if (cfg->kv_cache_mb) {
        size_t budget = cfg->kv_cache_mb * ((size_t)1 << 20);
        return budget > g->swa_bytes ? (budget - g->swa_bytes) / pair : 0;
    }
    size_t keep = used + g->swa_bytes + cfg->vram_reserve_mb * ((size_t)1 << 20) + GPU_KV_AUTO_SPARE +
                  pair; /* + padding block */
    size_t n = free_b > keep ? (free_b - keep) / pair : 0;
    return n > GPU_KV_AUTO_MAX_BLOCKS ? GPU_KV_AUTO_MAX_BLOCKS : n;
}

static int alloc_buffers(gpu_engine *g, char *err, size_t errlen)
{
    const model_hparams *hp = &g->base.m->hp;
    const engine_config *cfg = &g->base.cfg;
    int max_bucket = pow2_at_least(cfg->n_slots < GPU_MAX_DECODE_BATCH ? cfg->n_slots : GPU_MAX_DECODE_BATCH);
    int T = cfg->max_batch_tokens > max_bucket ? cfg->max_batch_tokens : max_bucket;
    int R = cfg->n_slots > max_bucket ? cfg->n_slots : max_bucket;
    /* speculative verification samples up to 1 + max_draft rows of a sequence (never more rows
     * than a step has tokens) */
    long verify_rows = (long)cfg->n_slots * (1 + (cfg->max_draft > 0 ? cfg->max_draft : 0));
    if (verify_rows > T) verify_rows = T;
    if (verify_rows > R) R = (int)verify_rows;
    g->cap_tokens = T;
    g->cap_rows = R;
    g->table_width = (cfg->ctx_per_slot + GPU_KV_BLOCK - 1) / GPU_KV_BLOCK;
    /* latent attention (deepseek2, every layer): one cache of latent rows, no V */
    bool any_mla = false;
    for (int l = 0; l < hp->n_layer; l++) any_mla |= g->layers[l].mla;
    g->kv_caches = any_mla ? 1 : 2;
    if (any_mla && !g->have_blas) {
        snprintf(err, errlen, "multi-head latent attention needs cuBLAS on the GPU (its per-head products)");
        return -1;
    }
    /* the sliding layers' own pool, as the CPU engine keeps it (engine_swa_pool_window): its
     * blocks (rings and windows for the prefix cache) and one for decode padding */
    const int swa_window = engine_swa_pool_window(g->base.m, cfg);
    for (int l = 0; l < hp->n_layer; l++) g->layers[l].kv_swa = engine_swa_layer(g->base.m, l, swa_window);
    const size_t n_swa = engine_swa_pool_blocks(cfg, swa_window);
    g->block_bytes = kv_block_bytes(g, false);
    g->block_bytes_swa = kv_block_bytes(g, true);
    g->swa_bytes = n_swa ? (n_swa + 1) * 2 * g->block_bytes_swa : 0;
    g->row_of_seq = malloc((size_t)R * sizeof *g->row_of_seq);
    g->hist_len = calloc((size_t)cfg->n_slots + 1, sizeof *g->hist_len);
    if (!g->row_of_seq || !g->hist_len || plan_states(g)) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    /* the widest layer's rows; attention's kernels and splits those every layer's shape takes */
    g->d_embd = hp->n_embd;
    g->d_q = g->d_kv = g->d_ff = 0;
    g->att_decode = true;
    g->att_dec_any = false;
    g->fa_q_tokens = GPU_FA_ROWS;
    int hd_max = 0, n_kv_max = 0, hd_dec = 0, n_kv_dec = 0; /* (_dec: of the attn_decode layers) */
    for (int l = 0; l < hp->n_layer; l++) {
        gpu_layer *L = &g->layers[l];
        if (L->d_q > g->d_q) g->d_q = L->d_q;
        if (L->d_kv > g->d_kv) g->d_kv = L->d_kv;
        if (L->d_ff > g->d_ff) g->d_ff = L->d_ff; /* with the shared expert's */
        if (L->lin >= 0) continue;                /* a linear layer has no attention */
        if (L->hd > hd_max) hd_max = L->hd;
        if (L->n_kv > n_kv_max) n_kv_max = L->n_kv;
        /* rows of 576 are latent rows of 512 + 64 only (attn_decode_mla reads V as the first 512) */
        L->att_dec = gpu_attn_decode_serves(hp->n_head, L->n_kv, L->hd) &&
                     (L->hd != GPU_MLA_FLASH_ROW || (L->mla && hp->kv_lora_rank == GPU_MLA_FLASH_V));
        g->att_decode &= L->att_dec;
        g->att_dec_any |= L->att_dec;
        const int units = gpu_attn_dec_units(hp->n_head, L->n_kv, L->hd); /* blocks a token: KV heads or head groups */
        if (L->att_dec && L->hd > hd_dec) hd_dec = L->hd;
        if (L->att_dec && units > n_kv_dec) n_kv_dec = units;
        int qt = gpu_flash_q_tokens(hp->n_head, L->n_kv, L->hd);
        /* latent rows of another split than 512 + 64 (the row's width alone does not say) */
        if (L->mla && hp->kv_lora_rank != GPU_MLA_FLASH_V) qt = 0;
        if (qt < g->fa_q_tokens) g->fa_q_tokens = qt;
        if (L->window) g->att_window = L->window; /* one per model (n_swa) */
    }
    size_t V = (size_t)hp->n_vocab, f = sizeof(float);
    /* attn_decode's splits from its own layers' shapes; attn_partial's layers (Gemma 4's full
     * layers of head_dim 512 beside sliding ones of 256) keep ATT_MAX_SPLIT's */
    g->att_max_split = g->att_dec_any ? gpu_attn_dec_split_for(g->n_sm, n_kv_dec, hd_dec) : ATT_MAX_SPLIT;
    g->att_splits = gpu_attn_max_splits_for(cfg->ctx_per_slot, g->att_max_split);
    g->att_splits_part = g->att_decode ? g->att_splits : gpu_attn_max_splits(cfg->ctx_per_slot);
    const int part_splits = g->att_splits > g->att_splits_part ? g->att_splits : g->att_splits_part;
    g->det = cfg->deterministic;
    /* deterministic: a prompt's rows take the decode kernel too, so the last prompt row (which
     * samples) is computed as it is when a prefix-cache hit or a chunk boundary leaves it alone */
    if (g->det) g->fa_q_tokens = 0;
    /* attn_decode's partials take a row per decode token of a step (one per sequence, as its
     * shapes have a flash kernel for the rest); attn_partial's one per packed token */
    size_t dec_rows = (size_t)(g->att_decode && g->fa_q_tokens ? R : T), part_rows = dec_rows * part_splits * hp->n_head;
    /* attn_decode's arrival counters at head_dim 256, a (decode token, KV head) each: zeroed
     * here, and each merge leaves its own at zero */
    size_t count_bytes = hd_dec >= 256 ? dec_rows * (size_t)n_kv_dec * sizeof(unsigned) : 0;
    size_t largest = 0, all_f16 = 0;
    int f32_k = 0;
    if (g->have_blas) blas_sizes(g, &largest, &all_f16, &f32_k);
    g->x_f32_k = f32_k;
    /* FP32 gate/up only where a step's feed-forward is not one fused kernel (the largest step
     * decides), the partial sums only where some matrix goes to mmq */
    bool gate_up = false, any_mmq = gpu_mmq_serves(&g->k, g->output.wtype, g->output.k), any_post = false;
    bool any_moe = false, moe_geglu = false, moe_beside = false, moe_mxfp4 = false, ple = hp->n_embd_ple > 0;
    bool any_gated = false, any_shexp = false;
    for (int l = 0; l < hp->n_layer; l++) {
        const gpu_layer *L = &g->layers[l];
        gate_up |= (L->w_gate.d && !gpu_ffn_fused(g, L, T)) || L->mlp; /* an MLP's up product in FP32 */
        gate_up |= L->ffn_gate_shexp.d && !gpu_glu_fused(g, &L->ffn_gate_shexp, &L->ffn_up_shexp, T);
        any_gated |= L->gated;
        any_shexp |= L->ffn_gate_shexp.d != 0;
        any_post |= L->attn_post_norm || L->ffn_post_norm || ple || L->post_ln || g->pos_embd.d;
        any_moe |= L->ffn_gate_exps.d != 0;
        moe_geglu |= L->ffn_gate_exps.d && L->geglu;
        moe_mxfp4 |= L->ffn_gate_exps.d && (L->ffn_gate_exps.type == GGML_TYPE_MXFP4 || L->ffn_down_exps.type == GGML_TYPE_MXFP4);
        moe_beside |= L->ffn_gate_exps.d && L->w_gate.d;
#define ANY_MMQ(mat) any_mmq |= gpu_mmq_serves(&g->k, L->mat.wtype, L->mat.k);
        LAYER_MATRICES(ANY_MMQ) EXPERT_MATRICES(ANY_MMQ)
#undef ANY_MMQ
    }
    /* MoE: a step's tokens in chunks of moe_chunk, moe_sort's most entries at a time */
    size_t moe_n = 0, moe_tiles = 0;
    if (any_moe) {
        g->moe_chunk = GPU_MOE_MAX_ENTRIES / hp->n_expert_used < T ? GPU_MOE_MAX_ENTRIES / hp->n_expert_used : T;
        g->d_ff_exp = (hp->n_ff_exp + 31) / 32 * 32;
        moe_n = (size_t)g->moe_chunk * hp->n_expert_used;
        moe_tiles = (moe_n + MMQN_MAX_M - 1) / MMQN_MAX_M + (size_t)hp->n_expert; /* the smallest tiles: mmq_narrow's */
    }
    /* MXFP4 experts: the narrow chunks' q8 rows (gpu_forward.c moe_q8_rows): the tokens' rows,
     * then the entries' GLU rows, two int8 an input and a float per 32 */
    size_t moe_q8_in = 0;
    if (moe_mxfp4 && !g->det) {
        size_t nt = g->moe_chunk < GPU_MOE_NARROW_MAX_TOKENS ? (size_t)g->moe_chunk : GPU_MOE_NARROW_MAX_TOKENS;
        moe_q8_in = nt * ((size_t)g->d_embd + (size_t)hp->n_expert_used * g->d_ff_exp);
    }
    size_t ple_all = ple ? (size_t)T * hp->n_layer * hp->n_embd_ple : 0;
    g->ple_ld = (hp->n_embd_ple + 31) / 32 * 32;
    g->mmq_part_bytes = any_mmq ? GPU_MMQ_PART_BYTES : 0;
    /* hybrids: the states (one spare slot for decode padding) and the DeltaNet's activations;
     * act_h also carries the DeltaNet's gated output into Wout */
    size_t ns = g->base.n_states ? (size_t)g->base.n_states + 1 : 0, lin_t = g->base.n_states ? (size_t)T : 0;
    size_t act_w = (size_t)(g->d_embd > g->d_q ? g->d_embd : g->d_q);
    if (lin_t && (size_t)hp->ssm_inner > act_w) act_w = (size_t)hp->ssm_inner;
    /* the dp4a products' one row of inputs: n_embd (QKV, gate/up, LM head), d_q (O), d_ff (down) */
    /* off unless built with -Dgpu_dp4a=all|norm: on the H100 (2026-11-26) the dp4a products were
     * slower than the FP16 ones at batch 1 (8B Q4_K_M 252 vs 311 tok/s, 1.5B 648 vs 683) */
    /* nor in an encoder: its post-LN blocks read fp16(x), not a norm that leaves the q8 row */
    g->dp4a = INFERD_GPU_DP4A && !g->det && !any_moe && !g->base.n_states && !hp->encoder;
    size_t q8_k = g->dp4a ? (act_w > (size_t)g->d_ff ? act_w : (size_t)g->d_ff) : 0;
    g->norm_carry = gpu_norms_carried(g);
    size_t norm_w = g->norm_carry ? (size_t)g->d_embd : 0;

    /* per-step inputs: tok, pos, slot, seq, rows, lidx, attention's token list and flash tiles
     * (at most one tile per token), bias, allowed-token masks, block tables (a step copies the
     * used part up to its masks, none without constrained rows, then the used rows of the
     * tables) */
    gpu_inputs *in = &g->in;
    in->tok = 0;
    in->pos = align_up(in->tok + T * sizeof(int32_t), 64);
    in->kpos = align_up(in->pos + T * sizeof(int32_t), 64);
    in->slot = align_up(in->kpos + T * sizeof(int32_t), 64);
    in->seq = align_up(in->slot + T * sizeof(int32_t), 64);
    in->rows = align_up(in->seq + T * sizeof(int32_t), 64);
    in->lidx = align_up(in->rows + R * sizeof(gpu_sample_row), 64);
    in->dtok = align_up(in->lidx + T * sizeof(int32_t), 64);
    in->ftiles = align_up(in->dtok + T * sizeof(int32_t), 64);
    in->sseq = align_up(in->ftiles + (size_t)T * 2 * sizeof(int32_t), 64);
    in->schunk = align_up(in->sseq + (size_t)R * sizeof(gpu_ssm_seq), 64);
    in->bias = align_up(in->schunk + (size_t)(T / GPU_SSM_CHUNK + R + 1) * sizeof(gpu_ssm_seq), 64);
    in->mask = align_up(in->bias + (size_t)R * GPU_MAX_BIAS_PER_SEQ * sizeof(gpu_bias), 64);
    g->mask_words = (hp->n_vocab + 31) / 32;
    in->tables = align_up(in->mask + (size_t)R * g->mask_words * sizeof(uint32_t), 64);
    in->tables_swa = align_up(in->tables + (size_t)R * g->table_width * sizeof(int32_t), 64);
    in->bytes = in->tables_swa + (n_swa ? (size_t)R * g->table_width * sizeof(int32_t) : 0);

    const size_t qk = (size_t)hp->mla_nope + hp->n_rot; /* latent attention's query heads */
    /* act_lo: the linear layers' input, latent attention's and its compressed query's */
    const size_t lo_rows = any_mla ? (size_t)T : lin_t;
    const size_t lo_w = any_mla && hp->q_lora_rank > g->d_embd ? (size_t)hp->q_lora_rank : (size_t)g->d_embd;
    alloc_req req[] = {
        {&g->x, (size_t)T * g->d_embd * f},
        {&g->act_h, (size_t)T * act_w * sizeof(uint16_t)}, {&g->act_lo, (size_t)lo_rows * lo_w * sizeof(uint16_t)},
        {&g->ff_h, (size_t)T * g->d_ff * sizeof(uint16_t)},
        {&g->xq, 2 * q8_k}, {&g->xd, q8_k / 32 * 2 * f}, /* q and lo (kernels/common.cuh) */
        {&g->norm_h, norm_w * sizeof(uint16_t)}, {&g->norm_part, norm_w * f},
        {&g->norm_ss, g->norm_carry ? (1 + 2 * (size_t)hp->n_layer) * f : 0},
        {&g->norm_lo, lin_t || any_mla ? norm_w * sizeof(uint16_t) : 0},
        {&g->q, (size_t)T * g->d_q * f}, {&g->kk, (size_t)T * g->d_kv * f}, {&g->vv, (size_t)T * g->d_kv * f},
        {&g->gate, gate_up ? (size_t)T * g->d_ff * f : 0}, {&g->up, gate_up ? (size_t)T * g->d_ff * f : 0},
        {&g->post, any_post ? (size_t)T * g->d_embd * f : 0},
        {&g->tp_part, g->tp_rank >= 0 ? (size_t)T * g->d_embd * f : 0},
        {&g->mmq_part, g->mmq_part_bytes},
        {&g->moe_xf, (size_t)(any_moe ? T : 0) * g->d_embd * f},
        {&g->moe_logits, (size_t)(any_moe ? T : 0) * hp->n_expert * f}, {&g->moe_ids, moe_n * sizeof(int32_t)},
        {&g->moe_w, moe_n * f}, {&g->moe_sorted, moe_n * sizeof(int32_t)}, {&g->moe_pos, moe_n * sizeof(int32_t)},
        {&g->moe_tiles, moe_tiles * 3 * sizeof(int32_t)}, {&g->moe_h, moe_n * g->d_ff_exp * sizeof(uint16_t)},
        {&g->moe_y, moe_n * g->d_embd * f}, {&g->moe_q8, 2 * moe_q8_in}, {&g->moe_q8s, moe_q8_in / 32 * f},
        {&g->moe_g, moe_geglu ? moe_n * g->d_ff_exp * f : 0}, {&g->moe_u, moe_geglu ? moe_n * g->d_ff_exp * f : 0},
        {&g->moe_out, moe_beside ? (size_t)T * g->d_embd * f : 0},
        {&g->ple, ple_all * f}, {&g->ple_tok, ple_all * f}, {&g->ple_g, ple ? (size_t)T * hp->n_embd_ple * f : 0},
        {&g->ple_h, ple ? (size_t)T * g->ple_ld * sizeof(uint16_t) : 0},
        {&g->blas_ws, g->have_blas ? GPU_BLAS_WORKSPACE : 0}, {&g->x_f32, (size_t)T * (size_t)f32_k * f},
        {&g->part_o, part_rows * hd_max * f}, {&g->part_ml, part_rows * 2 * f}, {&g->att_counts, count_bytes},
        {&g->xl_h, (size_t)R * g->d_embd * sizeof(uint16_t)}, {&g->logits, R * V * f}, {&g->work, R * V * f},
        {&g->counts, R * V * sizeof(int32_t)}, {&g->parts, (size_t)R * GPU_SAMPLE_PARTS * 3 * f},
        {&g->sout, (size_t)R * sizeof(gpu_sample_out)},
        {&g->in_d, in->bytes},
        {&g->hist, (size_t)(cfg->n_slots + 1) * cfg->ctx_per_slot * sizeof(int32_t)},
        {&g->state, ns * g->slot_floats * f},
        {&g->ssm_mix, lin_t * g->ssm_chan * f}, {&g->ssm_z, lin_t * hp->ssm_inner * f},
        {&g->ssm_b, lin_t * hp->ssm_vheads * f}, {&g->ssm_g, lin_t * hp->ssm_vheads * f},
        {&g->ssm_raw, lin_t * 2 * hp->ssm_vheads * f}, {&g->ssm_o, lin_t * hp->ssm_inner * f},
        {&g->ssm_u, lin_t * hp->ssm_inner * f}, {&g->ssm_w, lin_t * hp->ssm_inner * f},
        {&g->ssm_gc, lin_t * hp->ssm_vheads * f},
        {&g->qg, any_gated ? (size_t)T * 2 * g->d_q * f : 0},
        {&g->mla_q, any_mla ? (size_t)T * hp->n_head * (qk > (size_t)hp->mla_v ? qk : (size_t)hp->mla_v) * f : 0},
        {&g->mla_qa, any_mla ? (size_t)T * hp->q_lora_rank * f : 0},
        {&g->sh_logit, any_shexp ? (size_t)T * f : 0}, {&g->sh_y, any_shexp ? (size_t)T * g->d_embd * f : 0},
    };
    size_t act = 0;
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) act += req[i].bytes;

    size_t free_b = 0, total_b = 0;
    CU_CHECK(cu.cuMemGetInfo(&free_b, &total_b), "checking free GPU memory");
    size_t reserve = cfg->vram_reserve_mb * (size_t)(1 << 20);
    /* Block-quantised matrices mmq cannot serve (rows of no whole 256-input stages; the others
     * and every float format are read as they lie) get FP16 copies for cuBLAS when they fit
     * beside everything else, a pool of what one slot
     * per sequence used to reserve (or the pool asked for) and 1 GiB to spare; otherwise one
     * matrix at a time is decoded into a scratch as it is used and the pool gets the rest. */
    size_t pair = g->kv_caches * g->block_bytes;
    size_t base_kv = g->swa_bytes + (cfg->kv_cache_mb ? kv_pool_blocks(g, free_b, act) * pair
                                                      : (size_t)cfg->n_slots * g->table_width * pair);
    g->w16_bytes = all_f16 && base_kv + act + reserve + all_f16 + ((size_t)1 << 30) <= free_b ? all_f16 : 0;
    g->wdq_bytes = g->have_blas && !g->w16_bytes ? largest : 0;
    act += g->w16_bytes + g->wdq_bytes;
    size_t n_blocks = kv_pool_blocks(g, free_b, act);
    /* Sized automatically, the pool must hold one longest (-c) request; a pool the operator
     * sized may be smaller, as on the CPU: requests beyond it get a 400 up front. */
    size_t min_blocks = cfg->kv_cache_mb ? 1 : (size_t)g->table_width;
    if (n_blocks < min_blocks) n_blocks = 0;
    if (n_blocks > (1 << 24)) n_blocks = 1 << 24; /* block ids are int32 */
    g->kv_bytes = (n_blocks + 1) * pair + g->swa_bytes;
    if (!n_blocks || g->kv_bytes + act + reserve > free_b) {
        int kv_layers = 0;
        for (int l = 0; l < hp->n_layer; l++) kv_layers += g->layers[l].kv_own && !g->layers[l].kv_swa;
        snprintf(err, errlen,
                 "not enough GPU memory for a KV pool of %zu tokens (%s; %.2f MiB per %d-token block "
                 "of %d layers x up to %d kv heads x %d dims x %s fp16%s) + the sliding layers' pool %.0f MiB + "
                 "buffers %.0f MiB + reserve %zu MiB: %.0f MiB free after %.0f MiB of weights; lower -c/--ctx-size "
                 "or -np/--parallel, or raise --kv-cache-size",
                 min_blocks * GPU_KV_BLOCK, cfg->kv_cache_mb ? "at least one block" : "one -c request", pair / MIB,
                 GPU_KV_BLOCK, kv_layers, n_kv_max, hd_max, g->kv_caches == 2 ? "K,V" : "latent",
                 cfg->kv_cache_mb ? ", --kv-cache-size" : "",
                 g->swa_bytes / MIB, act / MIB, cfg->vram_reserve_mb, free_b / MIB, g->wbytes / MIB);
        return -1;
    }
    g->base.kv_blocks = (int)n_blocks;
    g->base.kv_block_bytes = pair;
    g->base.kv_blocks_swa = (int)n_swa;
    g->base.swa_window = swa_window;
    g->base.kv_block_bytes_swa = 2 * g->block_bytes_swa;
    size_t kvb = g->kv_bytes / g->kv_caches;
    alloc_req kv[] = {{&g->kc, kvb}, {&g->vc, g->kv_caches == 2 ? kvb : 0}};
    alloc_req wq[] = {{&g->w16, g->w16_bytes}, {&g->wdq, g->wdq_bytes}};
    if (alloc_all(kv, 2, "allocating the KV cache", g->stream, err, errlen)) return -1;
    place_layer_kv(g, n_blocks, n_swa);
    if (alloc_all(req, (int)(sizeof req / sizeof req[0]), "allocating activations", g->stream, err, errlen) ||
        alloc_all(wq, 2, "allocating FP16 weights", g->stream, err, errlen))
        return -1;
    if (g->w16_bytes && make_resident_f16(g, err, errlen)) return -1;
    if (g->have_blas)
        CUBLAS_CHECK(cublas.set_workspace(g->blas, (void *)(uintptr_t)g->blas_ws, GPU_BLAS_WORKSPACE), "cuBLAS workspace");
    CU_CHECK(cu.cuMemAllocHost((void **)&g->in_h, in->bytes), "allocating pinned step inputs");
    CU_CHECK(cu.cuMemAllocHost((void **)&g->out_h, (size_t)R * sizeof(gpu_sample_out)), "allocating pinned results");
    CU_CHECK(cu.cuStreamSynchronize(g->stream), "clearing buffers");
    CU_CHECK(cu.cuMemGetInfo(&free_b, &total_b), "checking free GPU memory");
    log_info("cuda: weights %.0f MiB, KV cache %.0f MiB (%d blocks of %d tokens = %lld tokens; %d sequences of up to "
             "%d), buffers %.0f MiB, %.0f MiB of %.0f MiB free",
             g->wbytes / MIB, g->kv_bytes / MIB, g->base.kv_blocks, GPU_KV_BLOCK,
             (long long)g->base.kv_blocks * GPU_KV_BLOCK, cfg->n_slots, cfg->ctx_per_slot, act / MIB, free_b / MIB,
             total_b / MIB);
    if (n_swa) /* docs/sliding-kv.md: the sliding layers keep a window per sequence, not a context */
        log_info("cuda: of the KV cache, %.0f MiB are the sliding-window layers' own pool (%d blocks of %.3f MiB, "
                 "window %d) and %.0f MiB the full layers' (%d blocks of %.3f MiB); a sequence of %d tokens holds "
                 "%.1f MiB of K/V (%.1f MiB with every layer's K/V kept)",
                 g->swa_bytes / MIB, g->base.kv_blocks_swa, g->base.kv_block_bytes_swa / MIB, swa_window,
                 (g->kv_bytes - g->swa_bytes) / MIB, g->base.kv_blocks, pair / MIB, cfg->ctx_per_slot,
                 engine_kv_seq_bytes(&g->base, cfg->ctx_per_slot) / MIB,
                 (double)((size_t)g->table_width * (pair + g->base.kv_block_bytes_swa)) / MIB);
    if (g->base.n_states)
        log_info("cuda: %d recurrent-state slots of %.2f MiB (in the buffers); batch-1 steps %s", g->base.n_states,
                 g->base.state_bytes / MIB,
                 g->norm_carry ? "carry their norms in the products" : "launch their norms");
    if (all_f16)
        log_info("cuda: prompt and batched matmuls of quantised weights with rows of no whole 256-input "
                 "blocks read %s",
                 g->w16_bytes ? "resident FP16 weight copies (in the buffers)"
                              : "weights decoded to FP16 per use (too little memory for resident copies)");
    return 0;
}

/* ---- step ---------------------------------------------------------------------------------- */

typedef struct step_plan {
    int n_tokens, n_rows; /* launched (decode: padded to the bucket) */
    int bucket;           /* graph index, -1: eager */
    bool short_ctx;       /* a decode step whose every token has one key split: graphs[1] */
    gpu_attn_plan attn;   /* flash tiles; split-K tokens and the most splits any of them uses */
    int n_lidx;           /* tokens whose logits all come back */
    size_t copy_bytes;    /* inputs up to the used bias entries */
    size_t table_bytes;   /* used rows of the block tables */
} step_plan;

/* The sampling row of s's new token j (packed row token_index): it samples the token after
 * it, over the history up to it. */
static void fill_row(gpu_sample_row *r, const engine_seq *s, int token_index, int j, int bias_off, int mask_row)
{
    memset(r, 0, sizeof *r);
    r->token_index = token_index;
    r->slot = s->slot;
    r->hist_end = s->pos + j + 1;
    r->want = s->want_token;
    r->n_top = -1;
    r->temperature = 0.0f;
    r->top_p = 1.0f;
    r->repeat_penalty = 1.0f;
    r->mask_row = -1;
    if (!s->want_token) return;
    r->mask_row = mask_row;
    const sampling_params *sp = s->sp;
    r->temperature = sp->temperature;
    r->top_k = sp->top_k;
    r->top_p = sp->top_p;
    r->min_p = sp->min_p;
    r->repeat_penalty = sp->repeat_penalty;
    r->presence_penalty = sp->presence_penalty;
    r->frequency_penalty = sp->frequency_penalty;
    r->penalty_last_n = sp->penalty_last_n;
    r->n_top = sp->n_top_logprobs;
    r->bias_off = bias_off;
    r->n_bias = sp->n_bias;
    r->seed = sp->seed;
}

/* The key splits a decode token whose last key is kp takes, into the plan's most: its full
 * span and a sliding layer's shorter one (neither count is monotone in the keys, so both
 * count), under attn_decode's max_split and attn_partial's (ATT_MAX_SPLIT). */
static void plan_splits(const gpu_engine *g, gpu_attn_plan *ap, int kp)
{
    const int spans[2] = {kp + 1, gpu_attn_span(kp, g->att_window)};
    for (int i = 0; i < 2; i++) {
        int ns = gpu_attn_splits_for(spans[i], g->att_max_split);
        if (ns > ap->n_split) ap->n_split = ns;
        ns = g->att_decode ? ns : gpu_attn_splits(spans[i]);
        if (ns > ap->n_split_part) ap->n_split_part = ns;
    }
}

/* Pack the batch into the pinned staging buffer; g->row_of_seq says where each sequence's
 * logits land. */
static int pack_step(gpu_engine *g, const engine_seq *seqs, int n, step_plan *p, char *err, size_t errlen)
{
    int *row_of_seq = g->row_of_seq;
    unsigned char *h = g->in_h;
    int32_t *tok = (int32_t *)(h + g->in.tok), *pos = (int32_t *)(h + g->in.pos), *slot = (int32_t *)(h + g->in.slot);
    int32_t *kpos = (int32_t *)(h + g->in.kpos);
    int32_t *seq = (int32_t *)(h + g->in.seq), *tables = (int32_t *)(h + g->in.tables);
    int32_t *tables_swa = (int32_t *)(h + g->in.tables_swa);
    const int n_swa = g->base.kv_blocks_swa, window = g->base.swa_window;
    int32_t *lidx = (int32_t *)(h + g->in.lidx), *dtok = (int32_t *)(h + g->in.dtok);
    int32_t *ftiles = (int32_t *)(h + g->in.ftiles);
    const int qt = g->fa_q_tokens;
    const int tw = g->table_width;
    gpu_sample_row *rows = (gpu_sample_row *)(h + g->in.rows);
    gpu_ssm_seq *sseq = (gpu_ssm_seq *)(h + g->in.sseq), *schunk = (gpu_ssm_seq *)(h + g->in.schunk);
    gpu_bias *bias = (gpu_bias *)(h + g->in.bias);
    uint32_t *mask = (uint32_t *)(h + g->in.mask);
    bool decode = n <= GPU_MAX_DECODE_BATCH && !g->bidir; /* an encoder's steps are embeddings: no graph */
    for (int i = 0; i < n; i++)
        if (seqs[i].n_tokens != 1 || (seqs[i].logits && seqs[i].logits_all)) decode = false;
    if (n > g->cap_rows) {
        snprintf(err, errlen, "step has %d sequences, more than %d", n, g->cap_rows);
        return -1;
    }
    for (int i = 0; i < n && g->base.n_states; i++) {
        const int st = engine_seq_state(&seqs[i]);
        if (seqs[i].pos != 0 && seqs[i].pos != g->state_len[st]) {
            snprintf(err, errlen, "seq %d: starts at position %d but its state slot %d holds the state after %d "
                     "(a recurrent state cannot rewind)", i, seqs[i].pos, st, g->state_len[st]);
            return -1;
        }
    }
    int t = 0, r = 0, nb = 0, nm = 0;
    p->n_lidx = 0;
    p->attn = (gpu_attn_plan){.n_split = 1, .n_split_part = 1, .dec_listed = true, .old_kv = !g->bidir, .n_ssm = n};
    for (int i = 0; i < n; i++) {
        const engine_seq *s = &seqs[i];
        if (t + s->n_tokens > g->cap_tokens) {
            snprintf(err, errlen, "step carries more than %d tokens", g->cap_tokens);
            return -1;
        }
        if (s->pos > g->hist_len[s->slot] && !s->history) {
            snprintf(err, errlen, "seq %d: starts at position %d but row %d holds only %d tokens", i, s->pos,
                     s->slot, g->hist_len[s->slot]);
            return -1;
        }
        const int last = (s->pos + s->n_tokens - 1) / GPU_KV_BLOCK;
        for (int b = 0; b <= last; b++) tables[(size_t)i * tw + b] = engine_seq_block(&g->base, s, b);
        /* the sliding table from the window of the step's first query on (engine.h): the
         * kernels start at gpu_attn_key0, so the -1 entries before it are never read */
        for (int b = 0, first = engine_swa_first_block(s->pos, window); n_swa && b <= last; b++)
            tables_swa[(size_t)i * tw + b] = b < first ? -1 : engine_seq_block_swa(&g->base, s, b);
        /* Attention: a span of >= 2 tokens as flash tiles of up to qt tokens, cut from its
         * first token (any cut gives the same result: flash_attn.cuh); a single token (decode)
         * through split-K, whose split count is per token and not monotone in the key count
         * (gpu_attn_max_splits). */
        if (qt > 0 && s->n_tokens >= 2) {
            for (int j = 0; j < s->n_tokens; j += qt) {
                ftiles[2 * p->attn.n_tiles] = t + j;
                ftiles[2 * p->attn.n_tiles + 1] = s->n_tokens - j < qt ? s->n_tokens - j : qt;
                p->attn.n_tiles++;
            }
        } else {
            if (s->n_tokens > 1) p->attn.old_kv = false; /* its later tokens see keys of this step */
            for (int j = 0; j < s->n_tokens; j++) {
                dtok[p->attn.n_dec++] = t + j;
                const int kp = g->bidir ? s->pos + s->n_tokens - 1 : s->pos + j; /* its kpos */
                plan_splits(g, &p->attn, kp);
            }
        }
        sseq[i] = (gpu_ssm_seq){.first = t, .n = s->n_tokens, .state = engine_seq_state(s)};
        for (int j = 0; j < s->n_tokens; j += GPU_SSM_CHUNK)
            schunk[p->attn.n_chunks++] = (gpu_ssm_seq){.first = t + j, .n = s->n_tokens - j < GPU_SSM_CHUNK ? s->n_tokens - j : GPU_SSM_CHUNK,
                                                       .state = sseq[i].state};
        for (int j = 0; j < s->n_tokens; j++, t++) {
            tok[t] = s->tokens[j];
            pos[t] = s->pos + j;
            kpos[t] = g->bidir ? s->pos + s->n_tokens - 1 : pos[t];
            slot[t] = s->slot;
            seq[t] = i;
            if (s->logits && s->logits_all) lidx[p->n_lidx++] = t;
        }
        row_of_seq[i] = -1;
        if (!decode && !s->want_token && !(s->logits && !s->logits_all)) continue;
        int nbias = s->want_token ? s->sp->n_bias : 0;
        if (nbias < 0 || nbias > GPU_MAX_BIAS_PER_SEQ) {
            snprintf(err, errlen, "seq %d: %d logit_bias entries, at most %d", i, nbias, GPU_MAX_BIAS_PER_SEQ);
            return -1;
        }
        /* one row per sample: the last token's, or a verification's last n_sample (their masks
         * one after the other, their bias entries shared) */
        const int n_sample = s->want_token && s->n_sample > 1 ? s->n_sample : 1;
        if (r + n_sample > g->cap_rows) {
            snprintf(err, errlen, "step samples more than %d rows", g->cap_rows);
            return -1;
        }
        for (int k = 0; k < n_sample; k++) {
            int mask_row = -1, j = s->n_tokens - n_sample + k;
            if (s->want_token && s->allowed) {
                mask_row = nm++;
                memcpy(mask + (size_t)mask_row * g->mask_words, s->allowed + (size_t)k * g->mask_words,
                       (size_t)g->mask_words * sizeof *mask);
            }
            fill_row(&rows[r], s, t - s->n_tokens + j, j, nb, mask_row);
            row_of_seq[i] = r++;
        }
        for (int b = 0; b < nbias; b++) bias[nb + b] = (gpu_bias){s->sp->bias_ids[b], s->sp->bias_vals[b]};
        nb += nbias;
    }
    p->bucket = -1;
    p->short_ctx = false;
    p->n_tokens = t;
    p->n_rows = r;
    int table_rows = n;
    if (decode) { /* pad to the bucket: dummy tokens in the spare row and block, rows that sample nothing */
        int B = pow2_at_least(n);
        table_rows = B;
        for (; t < B; t++) {
            tok[t] = 0;
            pos[t] = kpos[t] = 0;
            slot[t] = g->base.cfg.n_slots;
            seq[t] = t;
            sseq[t] = (gpu_ssm_seq){.first = t, .n = 1, .state = g->base.n_states}; /* the spare slot */
            tables[(size_t)t * tw] = g->base.kv_blocks;
            if (n_swa) tables_swa[(size_t)t * tw] = n_swa; /* that pool's padding block */
            memset(&rows[t], 0, sizeof rows[t]);
            rows[t].token_index = t;
            rows[t].slot = g->base.cfg.n_slots;
            rows[t].mask_row = -1;
        }
        p->n_tokens = p->n_rows = B;
        for (p->bucket = 0; (1 << p->bucket) < B; p->bucket++) {}
        /* the graph's plan (decode_graph), not the one above: every token, unlisted */
        /* the padding's position 0 too; an attn_partial layer beside attn_decode ones takes its
         * one split there as well (a grid one split deep: its combine merges that one) */
        p->short_ctx = g->att_dec_any && p->attn.n_split == 1 && p->attn.n_split_part == 1;
        p->attn = (gpu_attn_plan){.n_dec = B, .n_split = p->short_ctx ? 1 : g->att_splits,
                                  .n_split_part = p->short_ctx ? 1 : g->att_splits_part, .dec_listed = false,
                                  .old_kv = !g->bidir, .n_ssm = B};
    }
    p->copy_bytes = nm ? g->in.mask + (size_t)nm * g->mask_words * sizeof(uint32_t)
                       : g->in.bias + (size_t)nb * sizeof(gpu_bias);
    p->table_bytes = (size_t)table_rows * tw * sizeof(int32_t);
    for (int i = 0; i < n && g->base.n_states; i++) g->state_len[engine_seq_state(&seqs[i])] = seqs[i].pos + seqs[i].n_tokens;
    return 0;
}

/* A sequence at position 0 starts from the zero state (its slot may hold another's): cleared
 * on the stream, before the step that reads it. */
static int reset_states(gpu_engine *g, const engine_seq *seqs, int n, char *err, size_t errlen)
{
    const size_t bytes = g->base.state_bytes;
    for (int i = 0; i < n && g->base.n_states; i++)
        if (seqs[i].pos == 0)
            CU_CHECK(cu.cuMemsetD8Async(g->state + (size_t)engine_seq_state(&seqs[i]) * bytes, 0, bytes, g->stream),
                     "step: clearing a state slot");
    return 0;
}

/* The device's token history of each row gets what the row has not been fed (a prefix read
 * from cached blocks, a recomputed sequence in a new row): the penalties' window. */
static int upload_history(gpu_engine *g, const engine_seq *seqs, int n, char *err, size_t errlen)
{
    const size_t ctx = (size_t)g->base.cfg.ctx_per_slot;
    for (int i = 0; i < n; i++) {
        const engine_seq *s = &seqs[i];
        int have = g->hist_len[s->slot];
        if (have < s->pos)
            CU_CHECK(cu.cuMemcpyHtoDAsync(g->hist + ((size_t)s->slot * ctx + (size_t)have) * sizeof(int32_t),
                                          s->history + have, (size_t)(s->pos - have) * sizeof(int32_t), g->stream),
                     "step: uploading a row's token history");
        g->hist_len[s->slot] = s->pos + s->n_tokens;
    }
    return 0;
}

/* The decode graph of bucket b: for any context (graphs[0][b]: the most splits any position
 * can take), or short (graphs[1][b]: one split deep, no blocks that exit at once; the tokens' results are
 * those of the other graph, whose extra splits would exit at once). */
static int decode_graph(gpu_engine *g, int b, bool short_ctx, char *err, size_t errlen)
{
    CUgraphExec *exec = &g->graphs[short_ctx][b];
    if (*exec) return 0;
    int B = 1 << b;
    int split = short_ctx ? 1 : g->att_splits;
    /* every token is a decode token: all of them through split-K in packed order, with no
     * token list and no flash tiles (the graph holds no step-dependent counts) */
    gpu_attn_plan ap = {.n_dec = B, .n_split = split, .n_split_part = short_ctx ? 1 : g->att_splits_part,
                        .dec_listed = false, .old_kv = !g->bidir, .n_ssm = B};
    CUgraph graph = NULL;
    CU_CHECK(cu.cuStreamBeginCapture(g->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capturing the decode graph");
    g->tp_capturing = true;
    g->k.pdl_on = false; /* gpu_kernels.h: PDL slowed the graphs' steps */
    int rc = gpu_forward(g, B, B, &ap, err, errlen);
    g->k.pdl_on = g->k.pdl;
    g->tp_capturing = false;
    CUresult r = cu.cuStreamEndCapture(g->stream, &graph);
    if (rc) {
        if (graph) cu.cuGraphDestroy(graph);
        return -1;
    }
    CU_CHECK(r, "capturing the decode graph");
    r = cu.cuGraphInstantiateWithFlags(exec, graph, 0);
    cu.cuGraphDestroy(graph);
    CU_CHECK(r, "instantiating the decode graph");
    if (g->base.cfg.verbose) log_info("cuda: captured the decode graph for batch %d (%d key splits)", B, split);
    return 0;
}

static void copy_result(engine_result *res, const gpu_sample_out *o)
{
    res->token = o->token;
    res->logprob = o->logprob;
    res->n_top = o->n_top;
    for (int k = 0; k < o->n_top && k < ENGINE_MAX_TOP_LOGPROBS; k++) {
        res->top_ids[k] = o->top_ids[k];
        res->top_logprobs[k] = o->top_logprobs[k];
    }
}

/* Where the step is, for the tensor-parallel watchdog (gpu_tp.c), which reads it from its own
 * thread. */
static void set_phase(gpu_engine *g, gpu_tp_phase ph) { __atomic_store_n(&g->tp_phase, (int)ph, __ATOMIC_RELAXED); }

/* The end of a step on a tensor-parallel rank other than 0: its stream drained, nothing copied
 * back (rank 0 returns the step's results). */
static int finish_follower(gpu_engine *g, const step_plan *p, int rc, char *err, size_t errlen)
{
    set_phase(g, GPU_TP_WAITING);
    CUresult sr = rc ? CUDA_SUCCESS : cu.cuStreamSynchronize(g->stream);
    if (rc == 0 && sr == CUDA_SUCCESS) return 0;
    char b[160];
    if (!rc)
        snprintf(err, errlen, "step on GPU rank %d (%d tokens, %s): %s", g->tp_rank, p->n_tokens,
                 p->bucket >= 0 ? "decode graph" : "eager", cuda_api_strerror(sr, b, sizeof b));
    snprintf(g->failed, sizeof g->failed, "%s", err);
    return ENGINE_FATAL;
}

static int gpu_step(engine *e, const engine_seq *seqs, int n, engine_result *results, char *err, size_t errlen)
{
    gpu_engine *g = (gpu_engine *)e;
    if (g->failed[0]) {
        snprintf(err, errlen, "the GPU failed in an earlier step (%s); restart the server", g->failed);
        return ENGINE_FATAL;
    }
    const int *row_of_seq = g->row_of_seq;
    step_plan p;
    set_phase(g, GPU_TP_PACKING);
    /* A step the packer refuses touches nothing on the device: an ordinary error.  Past it,
     * any failed CUDA call leaves the stream, and perhaps the context, in an unknown state:
     * every failure from here on is fatal (rc != 0 below ends in ENGINE_FATAL). */
    if (pack_step(g, seqs, n, &p, err, errlen) != 0) return ENGINE_EINVAL;
    set_phase(g, p.bucket >= 0 ? GPU_TP_GRAPH : GPU_TP_EAGER);
    int rc = 0;
    if (cu.cuCtxSetCurrent(g->ctx) != CUDA_SUCCESS ||
        cu.cuMemcpyHtoDAsync(g->in_d, g->in_h, p.copy_bytes, g->stream) != CUDA_SUCCESS ||
        cu.cuMemcpyHtoDAsync(g->in_d + g->in.tables, g->in_h + g->in.tables, p.table_bytes, g->stream) !=
            CUDA_SUCCESS ||
        (g->base.kv_blocks_swa && cu.cuMemcpyHtoDAsync(g->in_d + g->in.tables_swa, g->in_h + g->in.tables_swa,
                                                       p.table_bytes, g->stream) != CUDA_SUCCESS)) {
        snprintf(err, errlen, "step: setting the context or copying the inputs failed");
        rc = -1;
    }
    if (rc == 0) rc = upload_history(g, seqs, n, err, errlen);
    if (rc == 0) rc = reset_states(g, seqs, n, err, errlen);
    if (rc == 0 && p.bucket >= 0) {
        rc = decode_graph(g, p.bucket, p.short_ctx, err, errlen);
        if (rc == 0 && cu.cuGraphLaunch(g->graphs[p.short_ctx][p.bucket], g->stream) != CUDA_SUCCESS) {
            snprintf(err, errlen, "step: cuGraphLaunch (decode batch %d) failed", 1 << p.bucket);
            rc = -1;
        }
    } else if (rc == 0) {
        rc = gpu_forward(g, p.n_tokens, p.n_rows, &p.attn, err, errlen);
    }
    const size_t V = (size_t)e->m->hp.n_vocab;
    /* tensor parallelism: every rank ran the same forward (the all-reduces leave every GPU the
     * same residual stream, hence the same logits and samples); rank 0 alone brings them back */
    if (g->tp_rank > 0) return finish_follower(g, &p, rc, err, errlen);
    if (rc == 0 && p.n_rows > 0 &&
        cu.cuMemcpyDtoHAsync(g->out_h, g->sout, (size_t)p.n_rows * sizeof(gpu_sample_out), g->stream) != CUDA_SUCCESS) {
        snprintf(err, errlen, "step: copying the sampled tokens back failed");
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!seqs[i].logits || seqs[i].logits_all) continue;
        if (cu.cuMemcpyDtoHAsync(seqs[i].logits, g->logits + (size_t)row_of_seq[i] * V * sizeof(float),
                                 V * sizeof(float), g->stream) != CUDA_SUCCESS) {
            snprintf(err, errlen, "step: copying the logits of seq %d back failed", i);
            rc = -1;
        }
    }
    /* Every-token logits: LM head over chunks of the listed tokens, copied seq by seq. */
    int done = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!seqs[i].logits || !seqs[i].logits_all) continue;
        for (int j = 0; rc == 0 && j < seqs[i].n_tokens;) {
            int c = seqs[i].n_tokens - j < g->cap_rows ? seqs[i].n_tokens - j : g->cap_rows;
            rc = gpu_forward_logits_rows(g, done, c, err, errlen);
            if (rc == 0 && cu.cuMemcpyDtoHAsync(seqs[i].logits + (size_t)j * V, g->logits, (size_t)c * V * sizeof(float),
                                                g->stream) != CUDA_SUCCESS) {
                snprintf(err, errlen, "step: copying the logits of seq %d back failed", i);
                rc = -1;
            }
            done += c;
            j += c;
        }
    }
    /* Final hidden states (embeddings): normed in place in x, which nothing reads after the
     * LM heads above, and copied back; the rows are packed in sequence order. */
    for (int i = 0, t = 0; rc == 0 && i < n; t += seqs[i].n_tokens, i++) {
        if (!seqs[i].hidden) continue;
        int first, rows = engine_hidden_rows(&seqs[i], &first);
        size_t bytes = (size_t)rows * g->d_embd * sizeof(float);
        rc = gpu_forward_hidden_rows(g, t + first, rows, err, errlen);
        if (rc == 0 && cu.cuMemcpyDtoHAsync(seqs[i].hidden, g->x + (size_t)(t + first) * g->d_embd * sizeof(float), bytes,
                                            g->stream) != CUDA_SUCCESS) {
            snprintf(err, errlen, "step: copying the hidden states of seq %d back failed", i);
            rc = -1;
        }
    }
    set_phase(g, GPU_TP_WAITING);
    CUresult sr = cu.cuStreamSynchronize(g->stream);
    if (rc == 0 && sr != CUDA_SUCCESS) {
        char b[160];
        snprintf(err, errlen, "step (%d tokens, %s): %s", p.n_tokens, p.bucket >= 0 ? "decode graph" : "eager",
                 cuda_api_strerror(sr, b, sizeof b));
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!seqs[i].want_token) continue;
        copy_result(&results[i], &g->out_h[row_of_seq[i]]);
        for (int k = 0; seqs[i].n_sample > 1 && k < seqs[i].n_sample; k++) /* a verification's rows end at row_of_seq */
            copy_result(&seqs[i].sampled[k], &g->out_h[row_of_seq[i] - (seqs[i].n_sample - 1) + k]);
    }
    if (rc != 0) {
        snprintf(g->failed, sizeof g->failed, "%s", err);
        return ENGINE_FATAL;
    }
    return 0;
}

/* ---- decode rounds (engine_decode_rounds) ------------------------------------------------ */

/* Grows a pinned host buffer and its device twin to `bytes` each (the stream is idle between
 * steps: the old ones are no longer read). */
static int grow_pair(void **h, CUdeviceptr *d, size_t *cap, size_t bytes, char *err, size_t errlen)
{
    if (bytes <= *cap) return 0;
    if (*h) cu.cuMemFreeHost(*h);
    if (*d) cu.cuMemFree(*d);
    *h = NULL;
    *d = 0;
    *cap = 0;
    CU_CHECK(cu.cuMemAllocHost(h, bytes), "decode rounds: pinned staging");
    CU_CHECK(cu.cuMemAlloc(d, bytes), "decode rounds: device staging");
    *cap = bytes;
    return 0;
}

/* Every round's packed inputs from round 0's (in g->in_h, cb bytes, `stride` apart in
 * g->rounds_in_h): round r's n tokens are r positions further on (pos, kpos, their sampling
 * rows' history end), without round 0's masks; their token ids come from the round before, on
 * the device. */
static void stage_rounds(gpu_engine *g, int n, int rounds, size_t cb, size_t stride)
{
    for (int r = 0; r < rounds; r++) {
        unsigned char *h = g->rounds_in_h + (size_t)r * stride;
        memcpy(h, g->in_h, cb);
        int32_t *pos = (int32_t *)(h + g->in.pos), *kpos = (int32_t *)(h + g->in.kpos);
        gpu_sample_row *rows = (gpu_sample_row *)(h + g->in.rows);
        for (int t = 0; t < n; t++) {
            pos[t] += r;
            kpos[t] += r;
            rows[t].hist_end += r;
            if (r > 0) rows[t].mask_row = -1;
        }
    }
}

/* One round on the stream: its inputs into place (with the tokens the last round sampled),
 * the decode graph, its samples kept for the one copy back. */
static int enqueue_round(gpu_engine *g, const step_plan *p, int n, int r, size_t cb, size_t stride, char *err,
                         size_t errlen)
{
    CU_CHECK(cu.cuMemcpyDtoDAsync(g->in_d, g->rounds_in_d + (size_t)r * stride, cb, g->stream),
             "decode rounds: inputs");
    if (r > 0) {
        const CUDA_MEMCPY2D tok = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = g->sout,
                                   .srcPitch = sizeof(gpu_sample_out), .dstMemoryType = CU_MEMORYTYPE_DEVICE,
                                   .dstDevice = g->in_d + g->in.tok, .dstPitch = sizeof(int32_t),
                                   .WidthInBytes = sizeof(int32_t), .Height = (size_t)n};
        CU_CHECK(cu.cuMemcpy2DAsync(&tok, g->stream), "decode rounds: passing the sampled tokens on");
    }
    CU_CHECK(cu.cuGraphLaunch(g->graphs[p->short_ctx][p->bucket], g->stream), "decode rounds: cuGraphLaunch");
    CU_CHECK(cu.cuMemcpyDtoDAsync(g->rounds_out_d + (size_t)r * n * sizeof(gpu_sample_out), g->sout,
                                  (size_t)n * sizeof(gpu_sample_out), g->stream),
             "decode rounds: keeping the samples");
    return 0;
}

/* engine_decode_rounds on one GPU: round 0 packed as a decode step, its block tables out to
 * the last round's position and its graph the one every round's positions take; all rounds
 * enqueued back to back (the host waits once, not once a round) and their samples read back
 * in one copy.  What the decode graph does not run (recurrent state, sliding pools, tensor
 * parallelism, an encoder, more than the largest bucket) goes step by step. */
static int gpu_decode_rounds(engine *e, const engine_seq *seqs, int n, int rounds, engine_result *results, char *err,
                             size_t errlen)
{
    gpu_engine *g = (gpu_engine *)e;
    if (rounds < 2 || n > GPU_MAX_DECODE_BATCH || g->bidir || g->base.n_states || g->base.kv_blocks_swa ||
        g->tp_rank >= 0 || g->failed[0])
        return engine_rounds_as_steps(e, seqs, n, rounds, results, err, errlen);
    step_plan p;
    if (pack_step(g, seqs, n, &p, err, errlen) != 0) return ENGINE_EINVAL;
    if (p.bucket < 0) return engine_rounds_as_steps(e, seqs, n, rounds, results, err, errlen);
    const int tw = g->table_width;
    int32_t *tables = (int32_t *)(g->in_h + g->in.tables);
    gpu_attn_plan span = {.n_split = 1, .n_split_part = 1};
    for (int i = 0; i < n; i++) {
        const int last = seqs[i].pos + rounds - 1;
        for (int b = 0; b <= last / GPU_KV_BLOCK; b++)
            tables[(size_t)i * tw + b] = engine_seq_block(&g->base, &seqs[i], b);
        for (int kp = seqs[i].pos; kp <= last; kp++) plan_splits(g, &span, kp);
    }
    p.short_ctx = g->att_dec_any && span.n_split == 1 && span.n_split_part == 1;
    const size_t cb = p.copy_bytes, stride = align_up(cb, DEV_ALIGN);
    int rc = 0;
    if (grow_pair((void **)&g->rounds_in_h, &g->rounds_in_d, &g->rounds_in_cap, (size_t)rounds * stride, err, errlen) ||
        grow_pair((void **)&g->rounds_out_h, &g->rounds_out_d, &g->rounds_out_cap,
                  (size_t)rounds * n * sizeof(gpu_sample_out), err, errlen))
        rc = -1;
    if (rc == 0) {
        stage_rounds(g, n, rounds, cb, stride);
        if (cu.cuCtxSetCurrent(g->ctx) != CUDA_SUCCESS ||
            cu.cuMemcpyHtoDAsync(g->rounds_in_d, g->rounds_in_h, (size_t)rounds * stride, g->stream) != CUDA_SUCCESS ||
            cu.cuMemcpyHtoDAsync(g->in_d + g->in.tables, g->in_h + g->in.tables, p.table_bytes, g->stream) !=
                CUDA_SUCCESS) {
            snprintf(err, errlen, "decode rounds: setting the context or copying the inputs failed");
            rc = -1;
        }
    }
    if (rc == 0) rc = upload_history(g, seqs, n, err, errlen);
    if (rc == 0) rc = decode_graph(g, p.bucket, p.short_ctx, err, errlen);
    for (int r = 0; rc == 0 && r < rounds; r++) rc = enqueue_round(g, &p, n, r, cb, stride, err, errlen);
    if (rc == 0 && cu.cuMemcpyDtoHAsync(g->rounds_out_h, g->rounds_out_d, (size_t)rounds * n * sizeof(gpu_sample_out),
                                        g->stream) != CUDA_SUCCESS) {
        snprintf(err, errlen, "decode rounds: copying the samples back failed");
        rc = -1;
    }
    CUresult sr = cu.cuStreamSynchronize(g->stream);
    if (rc == 0 && sr != CUDA_SUCCESS) {
        char b[160];
        snprintf(err, errlen, "decode rounds (%d of batch %d): %s", rounds, n, cuda_api_strerror(sr, b, sizeof b));
        rc = -1;
    }
    if (rc != 0) {
        snprintf(g->failed, sizeof g->failed, "%s", err);
        return ENGINE_FATAL;
    }
    for (int i = 0; i < n; i++) g->hist_len[seqs[i].slot] = seqs[i].pos + rounds; /* hist_store wrote the rounds' */
    for (size_t k = 0; k < (size_t)rounds * n; k++) copy_result(&results[k], &g->rounds_out_h[k]);
    return 0;
}

static void gpu_slot_clear(engine *e, int slot)
{
    /* The row's device history is overwritten by its next sequence; only how much of it is
     * that sequence's must be forgotten. */
    ((gpu_engine *)e)->hist_len[slot] = 0;
}

/* Copy-on-write of one block of a pool (swa: the sliding layers'; both caches, every layer of
 * that pool with K/V of its own: one range per layer and cache), ordered on the compute stream
 * before any later step. */
static int kv_copy_in_pool(engine *e, bool swa, int dst, int src, char *err, size_t errlen)
{
    gpu_engine *g = (gpu_engine *)e;
    if (g->failed[0]) {
        snprintf(err, errlen, "the GPU failed in an earlier step (%s); restart the server", g->failed);
        return ENGINE_FATAL;
    }
    CUresult r = cu.cuCtxSetCurrent(g->ctx);
    for (int l = 0; l < e->m->hp.n_layer && r == CUDA_SUCCESS; l++) {
        const gpu_layer *L = &g->layers[l];
        if (!L->kv_own || L->kv_swa != swa) continue;
        size_t bb = layer_block_bytes(L), d = (size_t)dst * bb, sr = (size_t)src * bb;
        r = cu.cuMemcpyDtoDAsync(L->kc + d, L->kc + sr, bb, g->stream);
        if (r == CUDA_SUCCESS && L->vc != L->kc) r = cu.cuMemcpyDtoDAsync(L->vc + d, L->vc + sr, bb, g->stream);
    }
    if (r != CUDA_SUCCESS) {
        char b[160];
        snprintf(err, errlen, "copying %sKV block %d to %d: %s", swa ? "sliding " : "", src, dst,
                 cuda_api_strerror(r, b, sizeof b));
        snprintf(g->failed, sizeof g->failed, "%s", err);
        return ENGINE_FATAL;
    }
    return 0;
}

static int gpu_kv_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    return kv_copy_in_pool(e, false, dst, src, err, errlen);
}

static int gpu_kv_copy_swa(engine *e, int dst, int src, char *err, size_t errlen)
{
    return kv_copy_in_pool(e, true, dst, src, err, errlen);
}

/* A state slot copied whole (a snapshot of a prefix, or one restored), ordered on the compute
 * stream like gpu_kv_copy. */
static int gpu_state_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    gpu_engine *g = (gpu_engine *)e;
    if (g->failed[0]) {
        snprintf(err, errlen, "the GPU failed in an earlier step (%s); restart the server", g->failed);
        return ENGINE_FATAL;
    }
    size_t bytes = e->state_bytes;
    CUresult r = cu.cuCtxSetCurrent(g->ctx);
    if (r == CUDA_SUCCESS)
        r = cu.cuMemcpyDtoDAsync(g->state + (size_t)dst * bytes, g->state + (size_t)src * bytes, bytes, g->stream);
    if (r != CUDA_SUCCESS) {
        char b[160];
        snprintf(err, errlen, "copying state slot %d to %d: %s", src, dst, cuda_api_strerror(r, b, sizeof b));
        snprintf(g->failed, sizeof g->failed, "%s", err);
        return ENGINE_FATAL;
    }
    g->state_len[dst] = g->state_len[src];
    return 0;
}

void gpu_drop_graphs(gpu_engine *g)
{
    if (g->ctx) cu.cuCtxSetCurrent(g->ctx);
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < GPU_N_BUCKETS; b++) {
            if (g->graphs[c][b]) cu.cuGraphExecDestroy(g->graphs[c][b]);
            g->graphs[c][b] = NULL;
        }
}

static void gpu_destroy(engine *e)
{
    gpu_engine *g = (gpu_engine *)e;
    if (!g) return;
    gpu_drop_graphs(g);
    CUdeviceptr bufs[] = {g->wbuf,   g->kc,      g->vc,      g->hist,   g->x,     g->act_h,  g->act_lo, g->ff_h,
                          g->q,      g->kk,      g->vv,      g->gate,   g->up,    g->wdq,    g->w16,     g->blas_ws, g->x_f32,
                          g->mmq_part, g->post, g->tp_part, g->moe_xf, g->moe_logits, g->moe_ids, g->moe_w, g->moe_sorted,
                          g->moe_pos,  g->moe_tiles, g->moe_h,  g->moe_y, g->moe_q8, g->moe_q8s, g->moe_g, g->moe_u, g->moe_out,
                          g->ple, g->ple_tok, g->ple_g, g->ple_h,
                          g->part_o, g->part_ml, g->att_counts, g->xl_h, g->logits, g->work, g->counts, g->parts,
                          g->sout,   g->in_d, g->state, g->ssm_mix, g->ssm_z, g->ssm_b, g->ssm_g, g->ssm_raw,
                          g->ssm_o,  g->qg,   g->sh_logit, g->sh_y, g->ssm_u, g->ssm_w, g->ssm_gc, g->xq, g->xd,
                          g->mla_q, g->mla_qa, g->norm_h, g->norm_part, g->norm_ss, g->norm_lo};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cu.cuMemFree(bufs[i]);
    if (g->in_h) cu.cuMemFreeHost(g->in_h);
    if (g->out_h) cu.cuMemFreeHost(g->out_h);
    if (g->rounds_in_h) cu.cuMemFreeHost(g->rounds_in_h);
    if (g->rounds_out_h) cu.cuMemFreeHost(g->rounds_out_h);
    if (g->rounds_in_d) cu.cuMemFree(g->rounds_in_d);
    if (g->rounds_out_d) cu.cuMemFree(g->rounds_out_d);
    if (g->have_blas) cublas.destroy(g->blas);
    gpu_kernels_unload(&g->k);
    if (g->stream) cu.cuStreamDestroy(g->stream);
    if (g->ctx) cu.cuDevicePrimaryCtxRelease(g->dev);
    free(g->layers);
    free(g->row_of_seq);
    free(g->hist_len);
    free(g->state_len);
    free(g);
}

static const engine_vtable gpu_vtable = {
    .name = "cuda", .step = gpu_step, .decode_rounds = gpu_decode_rounds, .slot_clear = gpu_slot_clear,
    .kv_copy = gpu_kv_copy,
    .kv_copy_swa = gpu_kv_copy_swa, .state_copy = gpu_state_copy, .destroy = gpu_destroy};

/* A matrix in a format without kernels (gpu_kernel_names.h) is refused here, before anything
 * is allocated or uploaded, naming the first such tensor; --device auto then runs the model on
 * the CPU, which reads every supported format. */
static int check_matrix_type(const model_tensor *t, char *err, size_t errlen)
{
    if (!t->data || gpu_wtype_index(t->type) >= 0) return 0;
#define GPU_WT_NAME(TYPE, suffix) " " #TYPE
    snprintf(err, errlen, "tensor %s: type %s has no GPU kernels (the GPU reads%s); use --device cpu", t->name,
             ggml_type_name(t->type), GPU_WEIGHT_TYPES(GPU_WT_NAME));
#undef GPU_WT_NAME
    return -1;
}

static int check_weight_types(const model *m, char *err, size_t errlen)
{
    if (check_matrix_type(&m->tok_embd, err, errlen) || check_matrix_type(&m->output, err, errlen) ||
        check_matrix_type(&m->ple_tok_embd, err, errlen) || check_matrix_type(&m->ple_model_proj, err, errlen) ||
        check_matrix_type(&m->pos_embd, err, errlen))
        return -1;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const model_layer *L = &m->layers[l];
#define CHECK_M(f) if (check_matrix_type(&L->f, err, errlen)) return -1;
        LAYER_MATRICES(CHECK_M) EXPERT_MATRICES(CHECK_M)
#undef CHECK_M
        /* moe_glu_* decodes gate and up rows with one block decoder */
        if (L->ffn_gate_exps.data && L->ffn_gate_exps.type != L->ffn_up_exps.type) {
            snprintf(err, errlen, "tensors %s (%s) and %s (%s): the GPU needs one format for an expert's gate and up",
                     L->ffn_gate_exps.name, ggml_type_name(L->ffn_gate_exps.type), L->ffn_up_exps.name,
                     ggml_type_name(L->ffn_up_exps.type));
            return -1;
        }
    }
    if (m->hp.n_expert > GPU_MOE_MAX_EXPERTS) {
        snprintf(err, errlen, "model: %d experts per layer; the GPU groups at most %d", m->hp.n_expert,
                 GPU_MOE_MAX_EXPERTS);
        return -1;
    }
    return 0;
}

static int check_model(const model *m, char *err, size_t errlen)
{
    const model_hparams *hp = &m->hp;
    if (model_check_features(m, GPU_FEATURES, "cuda", err, errlen)) return -1;
    /* the clamped SwiGLU (gpt-oss) is in the experts' kernels, not the dense FFN's */
    for (int il = 0; il < hp->n_layer; il++)
        if (m->layers[il].recipe.act == ARCH_ACT_SWIGLU_CLAMP && m->layers[il].recipe.ffn != ARCH_FFN_MOE) {
            snprintf(err, errlen, "the cuda backend runs the clamped SwiGLU only in experts (layer %d of %s)", il,
                     m->desc->name);
            return -1;
        }
    if (check_weight_types(m, err, errlen)) return -1;
    /* the per-layer embeddings' token rows are gathered whole: no padding inside a row */
    if (hp->n_embd_ple && (hp->n_layer * hp->n_embd_ple) % 32) {
        snprintf(err, errlen, "model: per-layer embeddings %d x %d layers must be a multiple of 32 wide on the GPU",
                 hp->n_embd_ple, hp->n_layer);
        return -1;
    }
    /* every layer's own shape (Gemma 4's full layers have their own head_dim and kv heads) */
    for (int l = 0; l < hp->n_layer; l++) {
        const model_layer *L = &m->layers[l];
        if (hp->n_embd % 32 || (hp->n_head * L->head_dim) % 32) {
            snprintf(err, errlen, "model: n_embd %d and n_head*head_dim %d (layer %d) must be multiples of 32 on the GPU",
                     hp->n_embd, hp->n_head * L->head_dim, l);
            return -1;
        }
        const bool latent = L->recipe.attn == ARCH_ATTN_MLA; /* rows of kv_lora + n_rot */
        if ((L->head_dim > 256 && L->head_dim != 512 && !(latent && L->head_dim <= GPU_MLA_MAX_ROW)) ||
            L->head_dim % 8 || L->n_head_kv <= 0 || hp->n_head % L->n_head_kv) {
            snprintf(err, errlen, "model: head_dim %d / heads %d / kv heads %d (layer %d) not supported on the GPU "
                     "(head_dim a multiple of 8 up to 256, or 512; latent rows up to %d)", L->head_dim, hp->n_head,
                     L->n_head_kv, l, GPU_MLA_MAX_ROW);
            return -1;
        }
        /* the normed compressed query is wq_b's input rows as they lie (no padding); the
         * query heads [nope | rope] and the value heads fit the absorbed query's rows, whose
         * buffers carry them (gpu_forward.c: attention_mla) */
        if (latent && (hp->q_lora_rank % 32 || hp->mla_nope > hp->kv_lora_rank || hp->mla_v > L->head_dim)) {
            snprintf(err, errlen, "model: latent attention with q_lora_rank %d, key heads of %d + %d, values of %d, "
                     "latent %d (layer %d) is not supported on the GPU (q_lora_rank a multiple of 32, key and "
                     "value heads at most the latent row)", hp->q_lora_rank, hp->mla_nope, hp->n_rot, hp->mla_v,
                     hp->kv_lora_rank, l);
            return -1;
        }
        if ((L->recipe.attn_extras & ARCH_ATTN_ROPE_PARTIAL) && (hp->n_rot % 2 || hp->n_rot > L->head_dim)) {
            snprintf(err, errlen, "model: rope.dimension_count %d of heads of %d (layer %d) not supported on the GPU",
                     hp->n_rot, L->head_dim, l);
            return -1;
        }
    }
    bool linear = false;
    for (int l = 0; l < hp->n_layer; l++) linear |= m->layers[l].recipe.attn == ARCH_ATTN_LINEAR;
    /* the DeltaNet kernels' bounds (kernels/deltanet.cuh), and Wout's input rows in whole
     * 32-input chunks (a padded tail would read the next row) */
    if (linear && (hp->ssm_conv > GPU_SSM_MAX_TAPS || hp->ssm_state > GPU_SSM_MAX_D || hp->ssm_inner % 32)) {
        snprintf(err, errlen, "model: gated DeltaNet with %d conv taps, state_size %d, inner_size %d is not supported "
                 "on the GPU (at most %d taps and %d, inner_size a multiple of 32)", hp->ssm_conv, hp->ssm_state,
                 hp->ssm_inner, GPU_SSM_MAX_TAPS, GPU_SSM_MAX_D);
        return -1;
    }
    return 0;
}

static int setup(gpu_engine *g, char *err, size_t errlen)
{
    const engine_config *cfg = &g->base.cfg;
    /* the model first: its refusals say why even where no GPU driver is installed */
    if (check_model(g->base.m, err, errlen) || !cuda_api_load(err, errlen)) return -1;
    int count = 0;
    CU_CHECK(cu.cuDeviceGetCount(&count), "finding GPUs");
    if (cfg->device < 0 || cfg->device >= count) {
        snprintf(err, errlen, "GPU %d requested but %d present", cfg->device, count);
        return -1;
    }
    CU_CHECK(cu.cuDeviceGet(&g->dev, cfg->device), "opening the GPU");
    CU_CHECK(cu.cuDevicePrimaryCtxRetain(&g->ctx, g->dev), "creating the CUDA context");
    CU_CHECK(cu.cuCtxSetCurrent(g->ctx), "creating the CUDA context");
    CU_CHECK(cu.cuStreamCreate(&g->stream, CU_STREAM_NON_BLOCKING), "creating the compute stream");
    char name[128] = "?";
    cu.cuDeviceGetName(name, sizeof name, g->dev);
    char berr[256];
    if (cuda_api_load_cublas(berr, sizeof berr)) {
        CUBLAS_CHECK(cublas.create(&g->blas), "creating the cuBLAS handle");
        g->have_blas = true;
        CUBLAS_CHECK(cublas.set_stream(g->blas, g->stream), "cuBLAS stream");
    } else {
        log_warn("cuda: %s; prompts use the matrix-vector kernels (slower prefill)", berr);
    }
    g->k.load_all = g->tp_rank >= 0;
    if (gpu_kernels_load(&g->k, err, errlen)) return -1;
    CU_CHECK(cu.cuDeviceGetAttribute(&g->n_sm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g->dev), "querying the GPU");
    log_info("cuda: %s, uploading %s", name, g->base.m->name);
    if (upload_weights(g, err, errlen)) return -1;
    return alloc_buffers(g, err, errlen);
}

engine *gpu_engine_create(const model *m, const engine_config *cfg, int tp_rank, char *err, size_t errlen)
{
    if (cfg->n_slots <= 0 || cfg->ctx_per_slot <= 0 || cfg->max_batch_tokens <= 0) {
        snprintf(err, errlen, "cuda engine: slots, ctx_per_slot and max_batch_tokens must be positive");
        return NULL;
    }
    gpu_engine *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "cuda engine: out of memory");
        return NULL;
    }
    g->base.vt = &gpu_vtable;
    g->base.m = m;
    g->base.cfg = *cfg;
    g->tp_rank = tp_rank;
    if (setup(g, err, errlen)) {
        gpu_destroy(&g->base);
        return NULL;
    }
    return &g->base;
}

engine *engine_create_cuda(const model *m, const engine_config *cfg, char *err, size_t errlen)
{
    if (cfg->tensor_parallel > 1) return gpu_tp_create(m, cfg, err, errlen);
    return gpu_engine_create(m, cfg, -1, err, errlen);
}
