// elementwise.cuh - the per-token operations of a transformer layer: RMSNorm, the Q/K
// post-processing (per-head norm, RoPE, K/V stores through the block tables), SwiGLU and bias.
#pragma once
#include "common.cuh"
#include "../gpu_shared.h"

// Row r of the output = x[row] / rms(x[row]) * w (w NULL: no weight), where row = idx ?
// idx[r * idx_stride] : r; one block per output row of n.  Written in FP16 to yh (matmul
// inputs), FP32 to y, or both; y may alias x.  ylo (NULL: none) gets what yh's rounding left
// out, fp16(v - yh): a product over yh plus one over ylo reads v to about 22 bits, not 11 (the
// gated DeltaNet's input projection: gpu_forward.c attention_linear).
// Q8: the FP16 row also as the dp4a matvecs' q8 activations (q8_block_store; n a multiple
// of 32, so every warp of the loop holds one whole block): the decode step's norm then
// quantises its row for the next matvec at no launch of its own.
template <bool Q8>
__device__ __forceinline__ void rmsnorm_body(const float *x, const int *idx, int idx_stride, const float *w, float *y,
                                             __half *yh, __half *ylo, int n, float eps, int8_t *xq, float *xd)
{
    __shared__ float sh[32];
    int src = idx ? idx[(size_t)blockIdx.x * idx_stride] : blockIdx.x;
    const float *xr = x + (size_t)src * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    float scale = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = w ? xr[i] * scale * w[i] : xr[i] * scale;
        if (y) y[(size_t)blockIdx.x * n + i] = v;
        const __half h = __float2half_rn(v);
        if (yh) yh[(size_t)blockIdx.x * n + i] = h;
        if (ylo) ylo[(size_t)blockIdx.x * n + i] = __float2half_rn(v - __half2float(h));
        if constexpr (Q8) { // row r's q8 form: q at xq + 2nr, lo n bytes on (dot_q8.cuh)
            const size_t b = (size_t)blockIdx.x * n + (i & ~31);
            int8_t *q = xq + (size_t)blockIdx.x * n + b;
            q8_block_store(__half2float(h), q, q + n, xd + 2 * (b / 32));
        }
    }
}

extern "C" __global__ void rmsnorm(const float *x, const int *idx, int idx_stride, const float *w,
                                   float *y, __half *yh, __half *ylo, int n, float eps)
{
    pdl_enter();
    rmsnorm_body<false>(x, idx, idx_stride, w, y, yh, ylo, n, eps, nullptr, nullptr);
}

extern "C" __global__ void rmsnorm_q8(const float *x, const int *idx, int idx_stride, const float *w, float *y,
                                      __half *yh, __half *ylo, int n, float eps, int8_t *xq, float *xd)
{
    pdl_enter();
    rmsnorm_body<true>(x, idx, idx_stride, w, y, yh, ylo, n, eps, xq, xd);
}

// The end of a sandwich-norm block (Gemma) and the norm after it, one block per row of n:
// x[r] = (x[r] + rmsnorm(post[r]) * w_post) * scale, then (w_next set) yh[r] =
// fp16(rmsnorm(x[r]) * w_next).  One launch for what rmsnorm (into post), add_bias, scale_f32
// and rmsnorm did in four (three without a scale): the same strides and block_sum as rmsnorm
// (the host launches as many threads), the products rounded as the separate kernels round them
// (no contraction into the add), so the same bits.  post is left as it was.  A row of up to
// POST_NORM_REGS values a thread is read once, every load issued before the first sum, and
// kept in registers (a batch-1 step's launch is a chain of dependent memory round trips
// otherwise: 8.2 us under ncu for Gemma-3-12B's 3,840); longer rows take the loops.
#define POST_NORM_REGS 8
__device__ __forceinline__ float post_norm_value(float x, float p, float s_post, float w, float scale)
{
    return __fmul_rn(__fadd_rn(x, __fmul_rn(__fmul_rn(p, s_post), w)), scale);
}

__device__ __forceinline__ void post_norm_add_loops(const float *pr, const float *w_post, float *xr, float scale,
                                                    const float *w_next, __half *yr, int n, float eps, float *sh)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += pr[i] * pr[i];
    ss = block_sum(ss, sh);
    const float s_post = rsqrtf(ss / (float)n + eps);
    float ss_next = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = post_norm_value(xr[i], pr[i], s_post, w_post[i], scale);
        xr[i] = v;
        ss_next += v * v;
    }
    if (!w_next) return;
    ss_next = block_sum(ss_next, sh);
    const float s_next = rsqrtf(ss_next / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __float2half_rn(__fmul_rn(__fmul_rn(xr[i], s_next), w_next[i]));
}

extern "C" __global__ void post_norm_add(const float *post, const float *w_post, float *x, float scale,
                                         const float *w_next, __half *yh, int n, float eps)
{
    pdl_enter();
    __shared__ float sh[32];
    const size_t row = (size_t)blockIdx.x * n;
    const float *pr = post + row;
    float *xr = x + row;
    __half *yr = yh + row;
    const int bd = blockDim.x, t = threadIdx.x;
    if (n > POST_NORM_REGS * bd) {
        post_norm_add_loops(pr, w_post, xr, scale, w_next, yr, n, eps, sh);
        return;
    }
    float p[POST_NORM_REGS], v[POST_NORM_REGS], wp[POST_NORM_REGS], wn[POST_NORM_REGS];
#pragma unroll
    for (int j = 0; j < POST_NORM_REGS; j++) {
        const int i = t + j * bd;
        const bool in = i < n;
        p[j] = in ? pr[i] : 0.0f;
        v[j] = in ? xr[i] : 0.0f;
        wp[j] = in ? w_post[i] : 0.0f;
        wn[j] = in && w_next ? w_next[i] : 0.0f;
    }
    float ss = 0.0f; // the loops' order: past the row, + 0 * 0 leaves a sum as it is
#pragma unroll
    for (int j = 0; j < POST_NORM_REGS; j++) ss += p[j] * p[j];
    ss = block_sum(ss, sh);
    const float s_post = rsqrtf(ss / (float)n + eps);
    float ss_next = 0.0f;
#pragma unroll
    for (int j = 0; j < POST_NORM_REGS; j++) {
        const int i = t + j * bd;
        if (i >= n) break;
        v[j] = post_norm_value(v[j], p[j], s_post, wp[j], scale);
        xr[i] = v[j];
        ss_next += v[j] * v[j];
    }
    if (!w_next) return;
    ss_next = block_sum(ss_next, sh);
    const float s_next = rsqrtf(ss_next / (float)n + eps);
#pragma unroll
    for (int j = 0; j < POST_NORM_REGS; j++) {
        const int i = t + j * bd;
        if (i >= n) break;
        yr[i] = __float2half_rn(__fmul_rn(__fmul_rn(v[j], s_next), wn[j]));
    }
}

// A carried norm's input f = x w c of feature i: xw[i] = fp16(f) and, where xw_lo is set (a
// DeltaNet layer's input, read to ~22 bits), its remainder times 2^MATVEC_NORM_LO_SHIFT: exact
// scalings of the exact difference f - fp16(f), so one FP16 rounding of it, as rmsnorm's ylo.
// norm_prep and the NORM_OUT producers (matvec.cuh norm_out_feature) store through it.
__device__ __forceinline__ void norm_input_store(__half *xw, __half *xw_lo, int i, float f)
{
    const __half h = __float2half_rn(f);
    xw[i] = h;
    if (xw_lo) xw_lo[i] = __float2half_rn(ldexpf(__fsub_rn(f, __half2float(h)), MATVEC_NORM_LO_SHIFT));
}

// The first norm of a batch-1 step whose norms ride on the products (gpu_shared.h
// matvec_norm): what a residual product's NORM_OUT epilogue leaves, for the embeddings, which
// no product writes.  One block over the row: its sum of squares into ss[0] (this norm's c from
// its own sum, as its consumer will take it), xw = fp16(x w c), and the sums of squares of
// every 8 features into part (xw_lo: norm_input_store's remainder, or NULL).
extern "C" __global__ void norm_prep(const float *x, const float *w, __half *xw, __half *xw_lo, float *part, float *ss,
                                     int n, float eps)
{
    pdl_enter();
    __shared__ float sh[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i] * x[i];
    s = block_sum(s, sh);
    const int e = norm_exp(s, n);
    if (threadIdx.x == 0) ss[0] = s;
    for (int i = threadIdx.x; i < n; i += blockDim.x) norm_input_store(xw, xw_lo, i, ldexpf(x[i] * w[i], -e));
    for (int j = threadIdx.x; j < MATVEC_NORM_PARTS(n); j += blockDim.x) {
        float p = 0.0f;
        for (int i = MATVEC_NORM_GROUP * j; i < min(MATVEC_NORM_GROUP * (j + 1), n); i++) p += x[i] * x[i];
        part[j] = p;
    }
}

// Dimensions of a head that RoPE turns: all, or the first n_rot (partial RoPE).
__device__ __forceinline__ int rope_dims(const qkv_post_args &a) { return a.n_rot ? a.n_rot : a.hd; }

// RoPE pair i of a head (the values x0 at its first index, x1 at its second): turned by
// pos * pos_scale * base^(-2i/hd) (YaRN-blended: qkv_post_args) / freq_div[i], cos and sin
// times mscale (YaRN's magnitude scale or LongRoPE's attention factor; 0: none).  The one
// definition of the rotation, with its products and sums pinned (no contraction left to the
// compiler): qkv_post and the QKV products that fuse it (matvec.cuh) give the same bits.
__device__ __forceinline__ float2 rope_pair(float x0, float x1, int i, int pos, const qkv_post_args &a)
{
    float fp = (float)pos * a.pos_scale;
    float inv = powf(a.rope_base, -2.0f * (float)i / (float)rope_dims(a));
    if (a.yarn_factor > 0.0f) {
        const float ramp = fminf(fmaxf(((float)i - a.yarn_low) / (a.yarn_high - a.yarn_low), 0.0f), 1.0f);
        inv = inv / a.yarn_factor * ramp + inv * (1.0f - ramp);
    }
    if (a.freq_div) inv /= a.freq_div[i];
    float s, c;
    sincosf(fp * inv, &s, &c);
    if (a.mscale != 0.0f) s = __fmul_rn(s, a.mscale), c = __fmul_rn(c, a.mscale); // 0 as 1: cpu_rope_apply
    return make_float2(__fmaf_rn(x0, c, -__fmul_rn(x1, s)), __fmaf_rn(x0, s, __fmul_rn(x1, c)));
}

// The two indices of pair i: NeoX pairs (i, i + hd/2), else (2i, 2i+1).
__device__ __forceinline__ int2 rope_index(int i, int hd, int neox)
{
    return neox ? make_int2(i, i + hd / 2) : make_int2(2 * i, 2 * i + 1);
}

// Rotate the rope_dims/2 pairs of one head vector in place (the rest stays as it is).
__device__ __forceinline__ void rope_head(float *v, int pos, const qkv_post_args &a)
{
    if (a.no_rope) return;
    const int nr = rope_dims(a);
    for (int i = threadIdx.x; i < nr / 2; i += blockDim.x) {
        const int2 ix = rope_index(i, nr, a.neox);
        const float2 r = rope_pair(v[ix.x], v[ix.y], i, pos, a);
        v[ix.x] = r.x;
        v[ix.y] = r.y;
    }
}

// In-place RMSNorm of one head vector (qwen3's q_norm / k_norm).
__device__ __forceinline__ void norm_head(float *v, int hd, const float *w, float eps, float *sh)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += v[i] * v[i];
    ss = block_sum(ss, sh);
    float scale = rsqrtf(ss / (float)hd + eps);
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = v[i] * scale * w[i];
    __syncthreads();
}

// The batch-1 step's carried norms (gpu_shared.h matvec_norm; matvec.cuh NORM_IN, NORM_OUT):
// The carried norm's rsqrt(mean of squares + eps).  The producer's partials summed in a fixed
// order (each thread its stride of them, then block_sum), so every block of every consumer of
// 256 threads gets the same bits; the first block keeps the sum for the next norm's c.  Every
// thread of the block calls it.
__device__ __forceinline__ float norm_rsqrt(const matvec_norm &nm)
{
    __shared__ float sh[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < nm.n_part; i += blockDim.x) s += nm.part[i];
    const float ss = block_sum(s, sh);
    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) nm.ss[1] = ss;
    return rsqrtf(ss / (float)nm.n + nm.eps);
}

// NORM_IN: the factor of a product's sums over xw, rsqrt(mean of squares + eps) / c; called
// after the dot products, so no block waits on it before its weights stream.  Every thread of
// the block calls it.
__device__ __forceinline__ float norm_in_scale(const matvec_norm &nm)
{
    return ldexpf(norm_rsqrt(nm), norm_exp(nm.ss[0], nm.n));
}

// The same factor in a consumer after the norm's first, from the sum that one kept in ss[1]
// (the same bits as norm_in_scale's): one load, no partials, no barrier.
__device__ __forceinline__ float norm_in_scale_kept(const matvec_norm &nm)
{
    return ldexpf(rsqrtf(nm.ss[1] / (float)nm.n + nm.eps), norm_exp(nm.ss[0], nm.n));
}

// Grid (tokens, n_head + n_kv): query heads are normed and rotated in place; key heads are
// normed, rotated and stored with their V head at the token's position in its sequence's
// block (the scatter of a packed prefill: each token to its own block and row).
//
// Heads up to QKV_POST_SMEM_HD wide are held in shared memory between the steps: one read of
// the head (and, for a key head, of its V head, its block-table entry and cache row, all
// issued before the first reduction), the norm and RoPE there, one write.  The arithmetic and
// its order are those of the loop over global memory below (the same per-thread sums, block
// sums and products), so both give the same bits; the global round trips between the steps
// were most of its ~9 us a launch at Gemma 4's heads (60 a batch-1 step).
#define QKV_POST_SMEM_HD 512
__device__ __forceinline__ void qkv_post_global(const qkv_post_args &a, float *v, bool is_q, int kh, int t, int pos,
                                                float *sh)
{
    const float *nw = is_q ? a.q_norm : a.k_norm;
    if (nw) norm_head(v, a.hd, nw, a.eps, sh);
    rope_head(v, pos, a);
    if (is_q) return;
    __syncthreads();
    int32_t block = a.tables[(size_t)a.seq[t] * a.table_width + pos / GPU_KV_BLOCK];
    size_t off = gpu_kv_offset(block, a.n_layer, a.layer, a.n_kv, kh, pos % GPU_KV_BLOCK, a.hd);
    const float *vv = a.v + ((size_t)t * a.n_kv + kh) * a.hd;
    float vs = 1.0f; // V norm: the head's RMS scale, applied as it is stored (the CPU's order)
    if (a.v_norm) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < a.hd; i += blockDim.x) ss += vv[i] * vv[i];
        vs = rsqrtf(block_sum(ss, sh) / (float)a.hd + a.eps);
    }
    for (int i = threadIdx.x; i < a.hd; i += blockDim.x) {
        a.kc[off + i] = __float2half_rn(v[i]);
        a.vc[off + i] = __float2half_rn(a.v_norm ? vv[i] * vs : vv[i]);
    }
}

extern "C" __global__ void qkv_post(qkv_post_args a)
{
    pdl_enter();
    __shared__ float sh[32];
    __shared__ float hs[QKV_POST_SMEM_HD], vh[QKV_POST_SMEM_HD]; // the head, a key head's V head
    const int t = blockIdx.x, h = blockIdx.y, pos = a.pos[t], hd = a.hd, bd = blockDim.x;
    const bool is_q = h < a.n_head;
    const int kh = h - a.n_head;
    float *v = is_q ? a.q + ((size_t)t * a.n_head + h) * hd : a.k + ((size_t)t * a.n_kv + kh) * hd;
    if (hd > QKV_POST_SMEM_HD) {
        qkv_post_global(a, v, is_q, kh, t, pos, sh);
        return;
    }
    size_t off = 0;
    const float *vv = NULL;
    if (!is_q) {
        const int32_t block = a.tables[(size_t)a.seq[t] * a.table_width + pos / GPU_KV_BLOCK];
        off = gpu_kv_offset(block, a.n_layer, a.layer, a.n_kv, kh, pos % GPU_KV_BLOCK, hd);
        vv = a.v + ((size_t)t * a.n_kv + kh) * hd;
    }
    float ss = 0.0f, sv = 0.0f;
    for (int i = threadIdx.x; i < hd; i += bd) {
        const float x = v[i];
        hs[i] = x;
        ss += x * x;
        if (vv) {
            const float y = vv[i];
            vh[i] = y;
            sv += y * y;
        }
    }
    const float *nw = is_q ? a.q_norm : a.k_norm;
    if (nw) { // norm_head's steps
        const float scale = rsqrtf(block_sum(ss, sh) / (float)hd + a.eps);
        for (int i = threadIdx.x; i < hd; i += bd) hs[i] = hs[i] * scale * nw[i];
    }
    const float vs = vv && a.v_norm ? rsqrtf(block_sum(sv, sh) / (float)hd + a.eps) : 1.0f;
    if (!a.no_rope) __syncthreads(); // the normed head complete before its pairs rotate
    rope_head(hs, pos, a);
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += bd) {
        v[i] = hs[i];
        if (is_q) continue;
        a.kc[off + i] = __float2half_rn(hs[i]);
        a.vc[off + i] = __float2half_rn(a.v_norm ? vh[i] * vs : vh[i]);
    }
}

// Token history per slot (for repetition penalties): hist[slot][pos] = tok.
extern "C" __global__ void hist_store(int *hist, int ctx, const int *tok, const int *slot,
                                      const int *pos, int n)
{
    pdl_enter();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) hist[(size_t)slot[t] * ctx + pos[t]] = tok[t];
}

// out = fp16(silu(g) * u) over n elements (the cuBLAS path's SwiGLU; glu_* fuses it).
extern "C" __global__ void swiglu(const float *g, const float *u, __half *out, size_t n)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = g[i];
        out[i] = __float2half_rn(x / (1.0f + __expf(-x)) * u[i]);
    }
}

// out = fp16(gelu_tanh(g) * u) over n elements (GeGLU, Gemma): the exact tanh formula, as the
// CPU's cpu_geglu and transformers' gelu_pytorch_tanh.
extern "C" __global__ void geglu(const float *g, const float *u, __half *out, size_t n)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = g[i];
        out[i] = __float2half_rn(gelu_tanh(x) * u[i]);
    }
}

// out[r][i] = fp16(gelu_tanh(g[r][i]) * u[r][i]) for rows of n, g and out ld_g / ld_out apart
// and u ld_u apart (Gemma 4's per-layer embedding gate: u is one layer's slice of each token's
// per-layer inputs).  Columns of out past n are left as they are.
extern "C" __global__ void geglu_rows(const float *g, int ld_g, const float *u, int ld_u, __half *out, int ld_out,
                                      int n, int rows)
{
    pdl_enter();
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)rows * n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / n, i = e % n;
        const float x = g[r * ld_g + i];
        out[r * ld_out + i] =
            __float2half_rn(gelu_tanh(x) * u[r * ld_u + i]);
    }
}

// out = fp16(x) over n elements (the residual stream as a matmul input: Gemma 4's per-layer
// embeddings read it unnormed).
extern "C" __global__ void to_f16(const float *x, __half *out, size_t n)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(x[i]);
}

// out[m][j] = x[m][j] for j < ldx, 0 past it: n = rows * k elements of the FP16 activations
// (row stride ldx) widened to FP32 rows of k (an F32 weight's cuBLAS product, gpu_forward.c).
extern "C" __global__ void to_f32_rows(const __half *x, int ldx, float *out, int k, size_t n)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t m = i / (size_t)k;
        const int j = (int)(i % (size_t)k);
        out[i] = j < ldx ? __half2float(x[m * (size_t)ldx + j]) : 0.0f;
    }
}

// x = cap * tanh(x / cap) over n elements (Gemma's soft-capped logits).
extern "C" __global__ void softcap(float *x, size_t n, float cap)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = tanhf(x[i] / cap) * cap;
}

// x *= s over n elements (Gemma's embeddings times sqrt(n_embd)).
extern "C" __global__ void scale_f32(float *x, size_t n, float s)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] *= s;
}

// y[r][i] += bias[i] for rows of n.
extern "C" __global__ void add_bias(float *y, const float *bias, int n, size_t total)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % n];
}

// BERT's LayerNorm, in place over rows of n: x[r] = (v - mean(v)) / sqrt(var(v) + eps) * w + b
// with v = x[r] + add[r] (add NULL: v = x[r]; the post-LN residual x = LayerNorm(x + block(x))
// when the block's output is in add).  One block per row, FP32, the mean first and then the
// variance about it (the CPU's cpu_layernorm, which sums in double).
extern "C" __global__ void layernorm(float *x, const float *add, const float *w, const float *b, int n, float eps)
{
    pdl_enter();
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * n;
    const float *ar = add ? add + (size_t)blockIdx.x * n : nullptr;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { // each thread reads back only what it wrote
        const float v = ar ? xr[i] + ar[i] : xr[i];
        xr[i] = v;
        s += v;
    }
    const float mean = block_sum(s, sh) / (float)n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
    const float inv = rsqrtf(block_sum(ss, sh) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// out = fp16(gelu(u)) over n elements, the exact GELU u * Phi(u) = 0.5 u (1 + erf(u / sqrt 2))
// (BERT's MLP; the CPU's cpu_gelu_erf).
extern "C" __global__ void gelu_erf(const float *u, __half *out, size_t n)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = u[i];
        out[i] = __float2half_rn(0.5f * x * (1.0f + erff(x * 0.7071067811865476f)));
    }
}
