// deltanet.cuh - the gated DeltaNet layer of the hybrid families (Qwen3.5, Qwen3-Next) and
// the gates of their full-attention and shared-expert blocks.  The math is the CPU's
// (src/cpu/cpu_engine.c attention_linear, cpu_ops.c cpu_conv1d_step / cpu_delta_run):
//
//   ssm_conv     per sequence and channel, its tokens in order: x = silu(causal conv1d over the
//                taps - 1 inputs before it, which the state slot's conv window holds, and x);
//                the window moves on.  In place in mix.
//   ssm_qk_norm  q and k heads L2-normed (eps inside the root, as transformers' l2norm), q
//                also times 1/sqrt(d).  In place.
//   ssm_gates    per token and v head: beta = sigmoid(b), g = A * softplus(a + dt_bias)
//   delta_rule   per sequence and v head, its tokens in order (the exact recurrence):
//                    S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
//                the state updated in place in its slot, so a decode graph carries it.
//   ssm_out_norm act_h = fp16(rmsnorm(o) * w * silu(z)) per v head (the gated RMSNorm)
//   ssm_conv_step, delta_step  a decode step's (one token a sequence): ssm_conv + ssm_qk_norm
//                + ssm_gates in one launch, delta_rule + ssm_out_norm in another, with the
//                same bits (the sums in the same order: shared helpers)
//   split_qgate  a gated attention's [query | gate] per head: the queries to q
//   gate_heads   act_h *= sigmoid(gate) (the attention's output gate)
//   shexp_add    x += sigmoid(gate logit) * y, or y ungated (the shared expert, after the routed ones)
#pragma once
#include "common.cuh"
#include "../gpu_shared.h"

// One channel's conv output before the SiLU: its taps - 1 inputs before (hist, oldest first)
// and in.  One order of the sums for ssm_conv and ssm_conv_step (the same bits).
__device__ __forceinline__ float conv_sum(const float wr[GPU_SSM_MAX_TAPS], const float hist[GPU_SSM_MAX_TAPS - 1],
                                          float in, int taps)
{
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < GPU_SSM_MAX_TAPS; j++) // (no wr[taps - 1]: a dynamic index puts wr in local memory)
        if (j < taps) acc += wr[j] * (j < GPU_SSM_MAX_TAPS - 1 && j < taps - 1 ? hist[j] : in);
    return acc;
}

#define DN_CONV_AHEAD 8 // ssm_conv: a run's inputs loaded this many tokens at a time

// Grid (sequences, ceil(chan / 32)), 32 * segs threads (segs = blockDim.x / 32: 1 for decode
// steps, GPU_SSM_CONV_SEGS for prompts): lane l owns channel 32 * blockIdx.y + l, warp w the
// w-th of segs runs of the sequence's tokens, walked in order with the window in registers.
// Every warp reads the taps - 1 inputs before its run (the previous run's last ones, or the
// state slot's window) before any warp overwrites one, so the runs go side by side in place;
// each token's sum is the same products in the same order as one walk over them all.
extern "C" __global__ void ssm_conv(ssm_args a)
{
    pdl_enter();
    const gpu_ssm_seq s = a.seqs[blockIdx.x];
    const int c = blockIdx.y * WARP + (threadIdx.x & 31), taps = a.taps, segs = blockDim.x >> 5;
    const int run = (s.n + segs - 1) / segs, seg = threadIdx.x >> 5;
    const int start = s.first + seg * run, stop = min(start + run, s.first + s.n);
    const bool mine = c < a.chan && start < stop, last = mine && stop == s.first + s.n;
    float *win = a.state + (size_t)s.state * a.slot_stride + a.conv_off;
    float hist[GPU_SSM_MAX_TAPS - 1], wr[GPU_SSM_MAX_TAPS];
#pragma unroll
    for (int j = 0; j < GPU_SSM_MAX_TAPS - 1; j++) {
        const int p = start - (taps - 1) + j; /* the input j places into the window */
        hist[j] = 0.0f;
        if (mine && j < taps - 1)
            hist[j] = p >= s.first ? a.mix[(size_t)p * a.chan + c] : win[(size_t)(p - s.first + taps - 1) * a.chan + c];
    }
    __syncthreads(); // every run's window is read: the inputs may now be overwritten
    if (!mine) return;
    const float *w = a.conv_w + (size_t)c * taps;
#pragma unroll
    for (int j = 0; j < GPU_SSM_MAX_TAPS; j++) wr[j] = j < taps ? w[j] : 0.0f;
    // DN_CONV_AHEAD tokens' inputs loaded at once, then walked: one round trip to memory for
    // them, not one a token (each store could alias the next load, so the compiler kept the
    // loads in order behind them).  Each input is this lane's own, read before its store.
    for (int t0 = start; t0 < stop; t0 += DN_CONV_AHEAD) {
        float ins[DN_CONV_AHEAD];
#pragma unroll
        for (int u = 0; u < DN_CONV_AHEAD; u++) ins[u] = t0 + u < stop ? a.mix[(size_t)(t0 + u) * a.chan + c] : 0.0f;
#pragma unroll
        for (int u = 0; u < DN_CONV_AHEAD; u++) {
            if (t0 + u >= stop) break;
            const float in = ins[u], acc = conv_sum(wr, hist, in, taps);
#pragma unroll
            for (int j = 0; j + 1 < GPU_SSM_MAX_TAPS - 1; j++)
                if (j + 1 < taps - 1) hist[j] = hist[j + 1];
#pragma unroll
            for (int j = 0; j < GPU_SSM_MAX_TAPS - 1; j++)
                if (j == taps - 2) hist[j] = in;
            a.mix[(size_t)(t0 + u) * a.chan + c] = acc * sigmoidf_(acc);
        }
    }
    if (last) // the window moves on to the sequence's last taps - 1 inputs
#pragma unroll
        for (int j = 0; j < GPU_SSM_MAX_TAPS - 1; j++)
            if (j < taps - 1) win[(size_t)j * a.chan + c] = hist[j];
}

// A q or k head's factor, summed by one warp (lane l: v[l], v[l + 32], ... then warp_sum), the
// same bits for ssm_qk_norm and ssm_conv_step.
__device__ __forceinline__ float qk_norm_factor(const float *v, int d, bool q)
{
    float ss = 0.0f;
    for (int i = threadIdx.x & 31; i < d; i += WARP) ss += v[i] * v[i];
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf(ss + 1e-6f);
    if (q) inv *= 1.0f / sqrtf((float)d);
    return inv;
}

// Grid (tokens, ceil(2 * k_heads / warps)), a warp a head: warp w of block y takes head
// h = y * warps + w; h < k_heads is a q head (also scaled), else a k head.  (GPU_SSM_NORM_WARPS
// heads a block: a prompt's tokens x 32 one-warp blocks were issued slower than their bytes move.)
extern "C" __global__ void ssm_qk_norm(float *mix, int chan, int d, int k_heads)
{
    pdl_enter();
    const int h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (h >= 2 * k_heads) return;
    float *v = mix + (size_t)blockIdx.x * chan + (size_t)h * d;
    const float inv = qk_norm_factor(v, d, h < k_heads);
    for (int i = threadIdx.x & 31; i < d; i += WARP) v[i] *= inv;
}

// Entry i = t * v_heads + h: beta = sigmoid(b), g = A * softplus(a + dt_bias).
__device__ __forceinline__ void ssm_gate(const ssm_gate_args &ga, int i)
{
    const int t = i / ga.v_heads, h = i % ga.v_heads, per_k = ga.v_heads / ga.k_heads;
    float bv, av;
    if (ga.fused) {
        const float *group = ga.raw + (size_t)t * 2 * ga.v_heads + (size_t)(h / per_k) * 2 * per_k;
        bv = group[h % per_k];
        av = group[per_k + h % per_k];
    } else {
        bv = ga.b[i];
        av = ga.a[i];
    }
    const float x = av + ga.dt_bias[h], softplus = x > 20.0f ? x : log1pf(expf(x)); // torch's threshold
    ga.b[i] = sigmoidf_(bv);
    ga.a[i] = ga.A[h] * softplus;
}

// n = tokens * v_heads entries (ssm_gate).
extern "C" __global__ void ssm_gates(ssm_gate_args ga, int n)
{
    pdl_enter();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ssm_gate(ga, i);
}

// A decode step (every sequence one token): ssm_conv, ssm_qk_norm and ssm_gates in one launch.
// Grid (sequences, 2 k_heads + v_heads + 1), d rounded up to 32 threads: block (s, h) takes
// head h's d channels of the sequence's token (q heads, k heads, v heads: mix's order), thread
// i channel h d + i, through the conv step as ssm_conv takes one token; a q or k head's values
// then wait in shared memory for warp 0's norm factor (qk_norm_factor, as ssm_qk_norm sums it).
// The last block y computes the token's gates.  Every value has the three kernels' bits.
extern "C" __global__ void ssm_conv_step(ssm_args a, ssm_gate_args ga)
{
    pdl_enter();
    __shared__ float head[GPU_SSM_MAX_D];
    __shared__ float inv;
    const gpu_ssm_seq s = a.seqs[blockIdx.x];
    const int h = blockIdx.y, i = threadIdx.x, d = a.d, c = h * d + i, taps = a.taps;
    if (h == 2 * a.k_heads + a.v_heads) {
        for (int j = i; j < a.v_heads; j += blockDim.x) ssm_gate(ga, s.first * a.v_heads + j);
        return;
    }
    const bool mine = i < d;
    float *x = a.mix + (size_t)s.first * a.chan + c, y = 0.0f;
    if (mine) {
        float *win = a.state + (size_t)s.state * a.slot_stride + a.conv_off;
        float hist[GPU_SSM_MAX_TAPS - 1], wr[GPU_SSM_MAX_TAPS];
#pragma unroll
        for (int j = 0; j < GPU_SSM_MAX_TAPS - 1; j++) hist[j] = j < taps - 1 ? win[(size_t)j * a.chan + c] : 0.0f;
#pragma unroll
        for (int j = 0; j < GPU_SSM_MAX_TAPS; j++) wr[j] = j < taps ? a.conv_w[(size_t)c * taps + j] : 0.0f;
        const float in = *x, acc = conv_sum(wr, hist, in, taps);
        y = acc * sigmoidf_(acc);
#pragma unroll
        for (int j = 0; j < GPU_SSM_MAX_TAPS - 1; j++) { // the window moves on by one input
            float next = in;
            if (j + 1 < GPU_SSM_MAX_TAPS - 1 && j < taps - 2) next = hist[j + 1];
            if (j < taps - 1) win[(size_t)j * a.chan + c] = next;
        }
    }
    if (h >= 2 * a.k_heads) { // a v head: no norm
        if (mine) *x = y;
        return;
    }
    if (mine) head[i] = y;
    __syncthreads();
    if (i < WARP) {
        const float f = qk_norm_factor(head, d, h < a.k_heads);
        if (i == 0) inv = f;
    }
    __syncthreads();
    if (mine) *x = y * inv;
}

// Grid (sequences, v_heads, ceil(d / 32)), GPU_SSM_WARPS warps: a block owns 32 columns j of
// the head's state S [d][d]; lane l of warp w holds S[i][j] for its column and the rows i of
// warp w's share in registers.  Each token: S^T k and S^T q are sums over rows, reduced across
// the warps through shared memory, in one fixed order (so a token's result does not depend on
// the batch).
extern "C" __global__ void __launch_bounds__(GPU_SSM_WARPS * 32) delta_rule(ssm_args a)
{
    pdl_enter();
    __shared__ float sk[GPU_SSM_MAX_D], sq[GPU_SSM_MAX_D], red[GPU_SSM_WARPS][WARP];
    constexpr int MAX_ROWS = GPU_SSM_MAX_D / GPU_SSM_WARPS;
    const gpu_ssm_seq s = a.seqs[blockIdx.x];
    const int h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = a.d, j = blockIdx.z * WARP + lane;
    const int per_k = a.v_heads / a.k_heads, kh = a.grouped ? h / per_k : h % a.k_heads;
    const int rows = (d + GPU_SSM_WARPS - 1) / GPU_SSM_WARPS, i0 = w * rows;
    const bool col = j < d;
    float *S = a.state + (size_t)s.state * a.slot_stride + a.delta_off + (size_t)h * d * d;
    float r[MAX_ROWS];
#pragma unroll
    for (int ii = 0; ii < MAX_ROWS; ii++) r[ii] = col && ii < rows && i0 + ii < d ? S[(size_t)(i0 + ii) * d + j] : 0.0f;
    const int q_off = 0, k_off = a.k_heads * d, v_off = 2 * a.k_heads * d;
    for (int t = s.first; t < s.first + s.n; t++) {
        const float *x = a.mix + (size_t)t * a.chan;
        __syncthreads(); // the previous token's readers of sk, sq and red are done
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            sk[i] = x[k_off + kh * d + i];
            sq[i] = x[q_off + kh * d + i];
        }
        __syncthreads();
        const float decay = expf(a.g[(size_t)t * a.v_heads + h]), beta = a.beta[(size_t)t * a.v_heads + h];
        float p = 0.0f;
#pragma unroll
        for (int ii = 0; ii < MAX_ROWS; ii++) {
            if (ii < rows && i0 + ii < d) {
                r[ii] *= decay;
                p += r[ii] * sk[i0 + ii];
            }
        }
        red[w][lane] = p;
        __syncthreads();
        float kv = 0.0f;
#pragma unroll
        for (int u = 0; u < GPU_SSM_WARPS; u++) kv += red[u][lane];
        const float delta = col ? beta * (x[v_off + h * d + j] - kv) : 0.0f;
        __syncthreads(); // everyone has read red
        p = 0.0f;
#pragma unroll
        for (int ii = 0; ii < MAX_ROWS; ii++) {
            if (ii < rows && i0 + ii < d) {
                r[ii] += sk[i0 + ii] * delta;
                p += r[ii] * sq[i0 + ii];
            }
        }
        red[w][lane] = p;
        __syncthreads();
        if (w == 0 && col) {
            float o = 0.0f;
#pragma unroll
            for (int u = 0; u < GPU_SSM_WARPS; u++) o += red[u][lane];
            a.out[(size_t)t * a.v_heads * d + (size_t)h * d + j] = o;
        }
    }
#pragma unroll
    for (int ii = 0; ii < MAX_ROWS; ii++)
        if (col && ii < rows && i0 + ii < d) S[(size_t)(i0 + ii) * d + j] = r[ii];
}

// The gated RMSNorm of one head's o (d values) by one warp: lane l writes out[i] for i = l,
// l + 32, ...  The same bits for ssm_out_norm and delta_step.
__device__ __forceinline__ void out_norm_head(const float *o, const float *z, const float *w, __half *out, int d,
                                              float eps)
{
    float ss = 0.0f;
    for (int i = threadIdx.x & 31; i < d; i += WARP) ss += o[i] * o[i];
    ss = warp_sum(ss);
    const float scale = rsqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x & 31; i < d; i += WARP) {
        const float zi = z[i];
        out[i] = __float2half_rn(o[i] * scale * w[i] * (zi * sigmoidf_(zi)));
    }
}

// Grid (tokens, ceil(v_heads / warps)), a warp a head (ssm_qk_norm's layout): out[t][h] =
// fp16(rmsnorm(o[t][h]) * w * silu(z[t][h])).
extern "C" __global__ void ssm_out_norm(const float *o, const float *z, const float *w, __half *out, int d,
                                        int v_heads, float eps)
{
    pdl_enter();
    const int h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (h >= v_heads) return;
    const size_t base = ((size_t)blockIdx.x * v_heads + h) * d;
    out_norm_head(o + base, z + base, w, out + base, d, eps);
}

// A decode step (every sequence one token) of heads of d <= GPU_SSM_STEP_MAX_D: delta_rule and
// ssm_out_norm in one launch.  Grid (sequences, v_heads), GPU_SSM_WARPS warps: the block holds
// the head's whole state, lane l of warp w the columns j = l + 32 c (c < d / 32) of delta_rule's
// rows of warp w, so that every column's sums are delta_rule's (its rows' products in order,
// then the warps' in order); o stays in shared memory for warp 0's gated RMSNorm
// (out_norm_head) into out (act_h).  One launch a layer fewer, and the head's o need not
// wait in global memory for another kernel.  Every input that does not depend on the state
// (the gates, v, z and the norm's weight: z and w through shared memory, for out_norm_head) is
// loaded with the state at the start: one memory round trip where there were four in a row
// (the gates after the first barrier, v in the column loop, z and w in the norm).
extern "C" __global__ void __launch_bounds__(GPU_SSM_WARPS * 32)
    delta_step(ssm_args a, const float *z, const float *norm_w, __half *out, float eps)
{
    pdl_enter();
    constexpr int COLS = GPU_SSM_STEP_MAX_D / WARP, MAX_ROWS = GPU_SSM_STEP_MAX_D / GPU_SSM_WARPS;
    __shared__ float sk[GPU_SSM_STEP_MAX_D], sq[GPU_SSM_STEP_MAX_D], so[GPU_SSM_STEP_MAX_D];
    __shared__ float sz[GPU_SSM_STEP_MAX_D], sw[GPU_SSM_STEP_MAX_D];
    __shared__ float red[GPU_SSM_WARPS][GPU_SSM_STEP_MAX_D];
    const gpu_ssm_seq s = a.seqs[blockIdx.x];
    const int h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = a.d, t = s.first;
    const int per_k = a.v_heads / a.k_heads, kh = a.grouped ? h / per_k : h % a.k_heads;
    const int rows = (d + GPU_SSM_WARPS - 1) / GPU_SSM_WARPS, i0 = w * rows;
    float *S = a.state + (size_t)s.state * a.slot_stride + a.delta_off + (size_t)h * d * d;
    const float *x = a.mix + (size_t)t * a.chan;
    const size_t base = ((size_t)t * a.v_heads + h) * d;
    const float g_log = a.g[(size_t)t * a.v_heads + h], beta = a.beta[(size_t)t * a.v_heads + h];
    float vv[COLS];
#pragma unroll
    for (int cb = 0; cb < COLS; cb++) {
        const int j = cb * WARP + lane;
        vv[cb] = j < d ? x[2 * a.k_heads * d + h * d + j] : 0.0f;
    }
    float r[COLS][MAX_ROWS];
#pragma unroll
    for (int cb = 0; cb < COLS; cb++)
#pragma unroll
        for (int ii = 0; ii < MAX_ROWS; ii++) {
            const int j = cb * WARP + lane;
            r[cb][ii] = j < d && ii < rows && i0 + ii < d ? S[(size_t)(i0 + ii) * d + j] : 0.0f;
        }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        sk[i] = x[a.k_heads * d + kh * d + i];
        sq[i] = x[kh * d + i];
        sz[i] = z[base + i];
        sw[i] = norm_w[i];
    }
    __syncthreads();
    const float decay = expf(g_log);
#pragma unroll
    for (int cb = 0; cb < COLS; cb++) {
        float p = 0.0f;
#pragma unroll
        for (int ii = 0; ii < MAX_ROWS; ii++) {
            if (ii < rows && i0 + ii < d) {
                r[cb][ii] *= decay;
                p += r[cb][ii] * sk[i0 + ii];
            }
        }
        red[w][cb * WARP + lane] = p;
    }
    __syncthreads();
#pragma unroll
    for (int cb = 0; cb < COLS; cb++) {
        const int j = cb * WARP + lane;
        float kv = 0.0f;
#pragma unroll
        for (int u = 0; u < GPU_SSM_WARPS; u++) kv += red[u][j];
        const float delta = j < d ? beta * (vv[cb] - kv) : 0.0f;
        float p = 0.0f;
#pragma unroll
        for (int ii = 0; ii < MAX_ROWS; ii++) {
            if (ii < rows && i0 + ii < d) {
                r[cb][ii] += sk[i0 + ii] * delta;
                p += r[cb][ii] * sq[i0 + ii];
            }
        }
        __syncthreads(); // every warp has read red[.][j] for this column block
        red[w][j] = p;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int u = 0; u < GPU_SSM_WARPS; u++) o += red[u][j];
        so[j] = o;
    }
#pragma unroll
    for (int cb = 0; cb < COLS; cb++)
#pragma unroll
        for (int ii = 0; ii < MAX_ROWS; ii++) {
            const int j = cb * WARP + lane;
            if (j < d && ii < rows && i0 + ii < d) S[(size_t)(i0 + ii) * d + j] = r[cb][ii];
        }
    __syncthreads();
    if (w == 0) out_norm_head(so, sz, sw, out + base, d, eps);
}

// q[t][h][i] = qg[t][h][i] for the n = tokens * n_head * hd entries of q (qg: [t][h][2 hd]).
extern "C" __global__ void split_qgate(const float *qg, float *q, int hd, size_t n)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q[i] = qg[i / hd * 2 * hd + i % hd];
}

// act[t][h][i] *= sigmoid(qg[t][h][hd + i]) over the n entries of the attention's output.
extern "C" __global__ void gate_heads(__half *act, const float *qg, int hd, size_t n)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        act[i] = __float2half_rn(__half2float(act[i]) * sigmoidf_(qg[i / hd * 2 * hd + hd + i % hd]));
}

// Grid tokens: x[t] += sigmoid(logit[t]) * y[t] over n floats (logit NULL: x[t] += y[t], the
// ungated shared expert of GLM-4.5).  One fmaf, as the batch-1 step's carried form does it
// (matvec_res_<type> with matvec_args.res_gate: the same bits).
extern "C" __global__ void shexp_add(float *x, const float *y, const float *logit, int n)
{
    pdl_enter();
    const float g = logit ? sigmoidf_(logit[blockIdx.x]) : 1.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float *xi = x + (size_t)blockIdx.x * n + i;
        *xi = fmaf(g, y[(size_t)blockIdx.x * n + i], *xi);
    }
}

// ---- the chunked form, for prompts -------------------------------------------------------
// The same recurrence over chunks of GPU_SSM_CHUNK tokens (flash-linear-attention's WY / UT
// transform; the CPU's reference is cpu_delta_run with chunk > 0, whose comment gives the
// algebra).  Per chunk with cumulative log decay G and the state S0 it starts from:
//   delta_chunk_prep  (every chunk at once: nothing here reads a state)
//                     T = (I - A)^-1 - I for A[a][b] = -beta_a (k_a . k_b) exp(G_a - G_b), b < a,
//                     by forward substitution; U = (I + T) beta v, W = (I + T) beta exp(G) k
//   delta_chunk_state (per sequence, its chunks in order; a block owns GPU_SSM_COLS columns of S)
//                     v_new = U - W S0 (into U), out = exp(G_a) q_a S0, then
//                     S = S0 exp(G_last) + sum over b of k_b exp(G_last - G_b) v_new_b^T
//   delta_chunk_out   (every chunk at once) out_a += sum over b <= a of (q_a . k_b) exp(G_a - G_b) v_new_b
// The in-chunk work is small matrix products instead of a chain of per-token steps; only the
// state update is sequential, once per chunk.  Each product reads its operands from shared
// memory, staged a slice of 64 (or 32) state rows at a time by all the block's threads in
// coalesced rows: the kernels are a few FMAs per shared load, not a global load per FMA.
// 256 threads; in a chunk x chunk product thread (ta, tb) = (tid / 16, tid % 16) owns rows
// 4 ta .. 4 ta + 3 and columns tb, tb + 16, tb + 32, tb + 48 (conflict-free shared reads).

#define DN_C GPU_SSM_CHUNK

#define DN_THREADS 256 // every chunk kernel's block

// A width-column slice of 64 rows, staged in two halves so that a thread's loads are all in
// flight at once (one round trip to L2 a slice, not one a load): dn_load takes the thread's
// elements src[r][i] (rows r < n, columns i < w; 0 elsewhere, so the products need no bounds)
// into registers, dn_store writes them times scale[r] (scale may be null) into buf[r][i] (row
// stride ld).
template <int WIDTH> struct dn_slice { float v[DN_C * WIDTH / DN_THREADS]; };

template <int WIDTH>
__device__ __forceinline__ void dn_load(dn_slice<WIDTH> &x, const float *src, size_t stride, int n, int w)
{
    constexpr int RSTEP = DN_THREADS / WIDTH; // rows apart of a thread's elements
    const int r0 = threadIdx.x / WIDTH, i = threadIdx.x % WIDTH;
    const float *p = src + (size_t)r0 * stride + i;
#pragma unroll
    for (int k = 0; k < DN_C * WIDTH / DN_THREADS; k++)
        x.v[k] = r0 + k * RSTEP < n && i < w ? p[(size_t)k * RSTEP * stride] : 0.0f;
}

template <int WIDTH>
__device__ __forceinline__ void dn_store(float *buf, int ld, const dn_slice<WIDTH> &x, const float *scale)
{
    constexpr int RSTEP = DN_THREADS / WIDTH;
    const int r0 = threadIdx.x / WIDTH, i = threadIdx.x % WIDTH;
#pragma unroll
    for (int k = 0; k < DN_C * WIDTH / DN_THREADS; k++) {
        const int r = r0 + k * RSTEP;
        buf[r * ld + i] = scale ? x.v[k] * scale[r] : x.v[k];
    }
}

template <int WIDTH>
__device__ __forceinline__ void dn_stage(float *buf, int ld, const float *src, size_t stride, int n, int w,
                                         const float *scale)
{
    dn_slice<WIDTH> x;
    dn_load<WIDTH>(x, src, stride, n, w);
    dn_store<WIDTH>(buf, ld, x, scale);
}

// acc[r][s] += sum over b < bmax of L[4 ta + r][b] R[b][tb + 16 s] (L, R: row strides ldl, ldr)
__device__ __forceinline__ void dn_tile_lr(float (&acc)[4][4], const float *L, int ldl, const float *R, int ldr,
                                           int bmax, int ta, int tb)
{
#pragma unroll 4
    for (int b = 0; b < bmax; b++) {
        float y[4];
#pragma unroll
        for (int s = 0; s < 4; s++) y[s] = R[b * ldr + tb + 16 * s];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float t = L[(4 * ta + r) * ldl + b];
#pragma unroll
            for (int s = 0; s < 4; s++) acc[r][s] += t * y[s];
        }
    }
}

// acc[r][s] += sum over i < w of X[4 ta + r][i] Y[tb + 16 s][i] (both row-major, stride ld)
__device__ __forceinline__ void dn_tile_xyt(float (&acc)[4][4], const float *X, const float *Y, int ld, int w, int ta,
                                            int tb)
{
#pragma unroll 4
    for (int i = 0; i < w; i++) {
        float x[4], y[4];
#pragma unroll
        for (int r = 0; r < 4; r++) x[r] = X[(4 * ta + r) * ld + i];
#pragma unroll
        for (int s = 0; s < 4; s++) y[s] = Y[(tb + 16 * s) * ld + i];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) acc[r][s] += x[r] * y[s];
    }
}

// dst[a][j] (=, or += with acc) (L x) [a][j] for the chunk's rows a < n and the d columns of x,
// a 64-column slice of x (src, row stride `stride`, row b times scale[b] when scale) staged in
// buf at a time; L [64][65] in shared memory, lower triangular (b <= a): dst's rows are
// nv * d apart (U, W, out).
__device__ __forceinline__ void dn_lower_times(const float *L, float *buf, const float *src, size_t stride,
                                               const float *scale, int n, int d, float *dst, size_t ldd, bool acc,
                                               int ta, int tb)
{
    for (int i0 = 0; i0 < d; i0 += DN_C) {
        const int w = min(DN_C, d - i0);
        __syncthreads();
        dn_stage<DN_C>(buf, DN_C + 1, src + i0, stride, n, w, scale);
        __syncthreads();
        float o[4][4] = {};
        dn_tile_lr(o, L, DN_C + 1, buf, DN_C + 1, min(n, 4 * ta + 4), ta, tb);
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const int ia = 4 * ta + r, j = tb + 16 * s;
                if (ia < n && j < w) {
                    float *y = dst + (size_t)ia * ldd + i0 + j;
                    *y = acc ? *y + o[r][s] : o[r][s];
                }
            }
    }
}

// Grid (chunks, v_heads), 256 threads.  U, W: [t][v_heads * d]; Gc: [t][v_heads], the
// cumulative log decay within the token's chunk.
extern "C" __global__ void __launch_bounds__(DN_THREADS, 2) delta_chunk_prep(ssm_args a, const gpu_ssm_seq *chunks, float *U,
                                                                   float *W, float *Gc)
{
    pdl_enter();
    __shared__ float buf[DN_C * (DN_C + 1)], sT[DN_C][DN_C + 1], sG[DN_C], sB[DN_C], sF[DN_C], row[DN_C];
    const gpu_ssm_seq c = chunks[blockIdx.x];
    const int h = blockIdx.y, d = a.d, nv = a.v_heads, n = c.n, t0 = c.first, tid = threadIdx.x;
    const int per_k = nv / a.k_heads, kh = a.grouped ? h / per_k : h % a.k_heads;
    const int k_off = a.k_heads * d + kh * d, v_off = 2 * a.k_heads * d + h * d, ta = tid >> 4, tb = tid & 15;
    const float *mix = a.mix + (size_t)t0 * a.chan;
    if (tid < WARP) { // G: the inclusive sum of the chunk's log decays, a scan over warp 0
        float g0 = tid < n ? a.g[(size_t)(t0 + tid) * nv + h] : 0.0f;
        float g1 = tid + WARP < n ? a.g[(size_t)(t0 + tid + WARP) * nv + h] : 0.0f;
#pragma unroll
        for (int o = 1; o < WARP; o <<= 1) {
            const float u0 = __shfl_up_sync(0xffffffffu, g0, o), u1 = __shfl_up_sync(0xffffffffu, g1, o);
            if (tid >= o) g0 += u0, g1 += u1;
        }
        g1 += __shfl_sync(0xffffffffu, g0, WARP - 1);
        sG[tid] = g0;
        sG[tid + WARP] = g1;
    }
    if (tid < DN_C) sB[tid] = tid < n ? a.beta[(size_t)(t0 + tid) * nv + h] : 0.0f;
    float acc[4][4] = {};
    for (int i0 = 0; i0 < d; i0 += DN_C) { // k k^T, a slice of 64 columns at a time
        const int w = min(DN_C, d - i0);
        __syncthreads();
        dn_stage<DN_C>(buf, DN_C + 1, mix + k_off + i0, a.chan, n, w, nullptr);
        __syncthreads();
        dn_tile_xyt(acc, buf, buf, DN_C + 1, w, ta, tb);
    }
    if (tid < n) Gc[(size_t)(t0 + tid) * nv + h] = sG[tid];
    if (tid < DN_C) sF[tid] = sB[tid] * expf(sG[tid]); // W's row factor
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const int ia = 4 * ta + r, ib = tb + 16 * s;
            sT[ia][ib] = ib < ia && ia < n ? -sB[ia] * acc[r][s] * expf(sG[ia] - sG[ib]) : 0.0f;
        }
    // T[a][b] = A[a][b] + sum over b < m < a of A[a][m] T[m][b], a row at a time; column b's
    // sum split over 4 lanes (m = b + 1 + q, step 4), added by shuffles
    const int col = tid >> 2, q = tid & 3;
    for (int ia = 1; ia < n; ia++) {
        __syncthreads(); // row ia of A complete, the last row's readers of row[] done
        if (tid < ia) row[tid] = sT[ia][tid];
        __syncthreads();
        float t = 0.0f;
        if (col < ia)
            for (int m = col + 1 + q; m < ia; m += 4) t += row[m] * sT[m][col];
        t += __shfl_xor_sync(0xffffffffu, t, 1);
        t += __shfl_xor_sync(0xffffffffu, t, 2);
        if (q == 0 && col < ia) sT[ia][col] = row[col] + t;
    }
    __syncthreads();
    if (tid < n) sT[tid][tid] = 1.0f; // I + T
    for (int pass = 0; pass < 2; pass++) // U = (I + T) beta v, then W = (I + T) beta exp(G) k
        dn_lower_times(&sT[0][0], buf, mix + (pass ? k_off : v_off), a.chan, pass ? sF : sB, n, d,
                       (pass ? W : U) + (size_t)t0 * nv * d + (size_t)h * d, (size_t)nv * d, false, ta, tb);
}

// delta_chunk_state's products, a 4 x 4 tile of outputs a thread over a quarter of the sum:
// lane bits (q, cg, one bit of the row group) = (lane & 3, (lane >> 2) & 3, lane >> 4), so the
// four lanes q = 0..3 of a tile take the terms m = 4 j + q of its sum (m < bmax) and meet in
// dn_quarters' two shuffles.  Each term is 8 shared loads for 16 FMAs (it was 5 for 4: one
// column a thread over the whole sum), conflict-free with rows of DN_C + 1 (L) and
// GPU_SSM_COLS + 1 (S, sV) floats.
#define DN_SST (GPU_SSM_COLS + 1) // row stride of the state columns and sV in shared memory

// acc[r][c] += sum over m = 4 j + q < bmax of L[(4 g + r) * rs + m * ms] R[m * DN_SST + 4 cg + c]:
// W S0 and q S0 (L a slice of chunk rows by state rows, rs its row stride and ms 1; R = S's rows
// from the slice's first), and the update (L the slice's k rows decayed, read transposed: rs 1,
// ms its row stride; R = v_new)
__device__ __forceinline__ void dn_tile_quarter(float (&acc)[4][4], const float *L, int rs, int ms, const float *R,
                                                int bmax, int g, int cg, int q)
{
#pragma unroll 4
    for (int m = q; m < bmax; m += 4) {
        float x[4], y[4];
#pragma unroll
        for (int r = 0; r < 4; r++) x[r] = L[(4 * g + r) * rs + m * ms];
#pragma unroll
        for (int c = 0; c < 4; c++) y[c] = R[m * DN_SST + 4 * cg + c];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][c] += x[r] * y[c];
    }
}

// The four quarters of each sum of acc added, (q0 + q1) + (q2 + q3) (the same bits in all four
// lanes: each addition is commutative), and lane q keeps row q of the tile in mine.
__device__ __forceinline__ void dn_quarters(const float (&acc)[4][4], int q, float (&mine)[4])
{
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float v = acc[r][c];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (r == q) mine[c] = v;
        }
}

// Grid (sequences, v_heads, ceil(d / GPU_SSM_COLS)), 256 threads: the block's 16 columns of
// the head's state S [d][d] in shared memory through the sequence's chunks.  Thread (rg, cg,
// q): rows 4 rg .. 4 rg + 3 of the chunk (or, in the update, of a slice of state rows) by
// columns 4 cg .. 4 cg + 3, the terms m = q (mod 4) of their sums (dn_tile_quarter). A chunk is
// 3 ns stages of 64-column slices (ns = ceil(d / 64)): W's (W S0 into pw), q's (q S0 into
// pq), then k's (the update); the next stage's slice is loaded into registers while this one's
// products run, across chunks too, so the serial walk waits on L2 once per sequence rather
// than once a stage.
extern "C" __global__ void __launch_bounds__(DN_THREADS, 2) delta_chunk_state(ssm_args a, float *U, const float *W,
                                                                          const float *Gc)
{
    pdl_enter();
    constexpr int CB = GPU_SSM_COLS;
    static_assert(CB == 16 && DN_THREADS == 256 && DN_C == 64, "the tiles: 16 row groups x 4 column groups x 4 quarters");
    __shared__ float sS[GPU_SSM_MAX_D * DN_SST], buf[DN_C * (DN_C + 1)], sV[DN_C * DN_SST], sG[DN_C], sE[DN_C];
    const gpu_ssm_seq s = a.seqs[blockIdx.x];
    const int h = blockIdx.y, tid = threadIdx.x, d = a.d, nv = a.v_heads, j0 = blockIdx.z * CB;
    const int per_k = nv / a.k_heads, kh = a.grouped ? h / per_k : h % a.k_heads, cols = min(CB, d - j0);
    const int q_off = kh * d, k_off = a.k_heads * d + kh * d, lane = tid & 31;
    const int q = lane & 3, cg = (lane >> 2) & 3, rg = 2 * (tid >> 5) + (lane >> 4);
    const int ns = (d + DN_C - 1) / DN_C, end = s.first + s.n;
    float *S = a.state + (size_t)s.state * a.slot_stride + a.delta_off + (size_t)h * d * d;
    // stage st of the chunk at t0 into x: slice st % ns of W, q or k (st / ns)
    auto load = [&](dn_slice<DN_C> &x, int t0, int st) {
        const int kind = st / ns, i0 = (st % ns) * DN_C, n = min(DN_C, end - t0), w = min(DN_C, d - i0);
        if (kind == 0) dn_load<DN_C>(x, W + (size_t)t0 * nv * d + (size_t)h * d + i0, (size_t)nv * d, n, w);
        else dn_load<DN_C>(x, a.mix + (size_t)t0 * a.chan + (kind == 1 ? q_off : k_off) + i0, a.chan, n, w);
    };
    for (int idx = tid; idx < d * CB; idx += blockDim.x)
        sS[(idx / CB) * DN_SST + idx % CB] = idx % CB < cols ? S[(size_t)(idx / CB) * d + j0 + idx % CB] : 0.0f;
    dn_slice<DN_C> nxt;
    if (s.n > 0) load(nxt, s.first, 0);
    for (int t0 = s.first; t0 < end; t0 += DN_C) {
        const int n = min(DN_C, end - t0);
        // (the last chunk's readers of sG were done before its update's barriers)
        if (tid < DN_C) sG[tid] = tid < n ? Gc[(size_t)(t0 + tid) * nv + h] : 0.0f;
        float pw[4][4] = {}, pq[4][4] = {}, el = 1.0f;
        for (int st = 0; st < 3 * ns; st++) {
            const int kind = st / ns, i0 = (st % ns) * DN_C, w = min(DN_C, d - i0);
            if (st == 2 * ns) { // W S0 and q S0 complete: v_new = U - W S0 (into U and sV), out = exp(G) q S0
                float vw[4], vq[4];
                dn_quarters(pw, q, vw);
                dn_quarters(pq, q, vq);
                const int ia = 4 * rg + q;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int jc = 4 * cg + c;
                    float vn = 0.0f;
                    if (ia < n && jc < cols) {
                        const size_t o = (size_t)(t0 + ia) * nv * d + (size_t)h * d + j0 + jc;
                        vn = U[o] - vw[c];
                        U[o] = vn;
                        a.out[o] = expf(sG[ia]) * vq[c];
                    }
                    sV[ia * DN_SST + jc] = vn;
                }
                const float GL = sG[n - 1];
                el = expf(GL);
                if (tid < DN_C) sE[tid] = tid < n ? expf(GL - sG[tid]) : 0.0f;
            }
            __syncthreads(); // buf's readers done; sG (and at the update sV, sE) written
            dn_store<DN_C>(buf, DN_C + 1, nxt, kind == 2 ? sE : nullptr); // k rows times exp(GL - G_b)
            __syncthreads();
            if (st + 1 < 3 * ns) load(nxt, t0, st + 1);
            else if (t0 + DN_C < end) load(nxt, t0 + DN_C, 0);
            if (kind == 0) {
                dn_tile_quarter(pw, buf, DN_C + 1, 1, sS + i0 * DN_SST, w, rg, cg, q);
                continue;
            }
            if (kind == 1) {
                dn_tile_quarter(pq, buf, DN_C + 1, 1, sS + i0 * DN_SST, w, rg, cg, q);
                continue;
            }
            float acc[4][4] = {}, mine[4]; // S = exp(GL) S + (k exp(GL - G))^T v_new on this slice's rows
            dn_tile_quarter(acc, buf, 1, DN_C + 1, sV, n, rg, cg, q);
            dn_quarters(acc, q, mine);
            const int i = 4 * rg + q;
            if (i < w)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    float *sv = &sS[(i0 + i) * DN_SST + 4 * cg + c];
                    *sv = el * *sv + mine[c];
                }
        }
    }
    __syncthreads();
    for (int idx = tid; idx < d * CB; idx += blockDim.x)
        if (idx % CB < cols) S[(size_t)(idx / CB) * d + j0 + idx % CB] = sS[(idx / CB) * DN_SST + idx % CB];
}

// Grid (chunks, v_heads), 256 threads: the in-chunk part of the outputs, from v_new (in U).
extern "C" __global__ void __launch_bounds__(DN_THREADS, 2) delta_chunk_out(ssm_args a, const gpu_ssm_seq *chunks, const float *U,
                                                                  const float *Gc)
{
    pdl_enter();
    constexpr int QW = 32; // q and k slices of 32 columns side by side
    __shared__ float tile[2 * DN_C * (QW + 1)], sQK[DN_C][DN_C + 1], sG[DN_C];
    const gpu_ssm_seq c = chunks[blockIdx.x];
    const int h = blockIdx.y, d = a.d, nv = a.v_heads, n = c.n, t0 = c.first, tid = threadIdx.x;
    const int per_k = nv / a.k_heads, kh = a.grouped ? h / per_k : h % a.k_heads;
    const int q_off = kh * d, k_off = a.k_heads * d + kh * d, ta = tid >> 4, tb = tid & 15;
    const float *mix = a.mix + (size_t)t0 * a.chan;
    float *bq = tile, *bk = tile + DN_C * (QW + 1);
    if (tid < DN_C) sG[tid] = tid < n ? Gc[(size_t)(t0 + tid) * nv + h] : 0.0f;
    float acc[4][4] = {};
    for (int i0 = 0; i0 < d; i0 += QW) { // q k^T
        const int w = min(QW, d - i0);
        __syncthreads();
        dn_slice<QW> xq, xk;
        dn_load<QW>(xq, mix + q_off + i0, a.chan, n, w);
        dn_load<QW>(xk, mix + k_off + i0, a.chan, n, w);
        dn_store<QW>(bq, QW + 1, xq, nullptr);
        dn_store<QW>(bk, QW + 1, xk, nullptr);
        __syncthreads();
        dn_tile_xyt(acc, bq, bk, QW + 1, w, ta, tb);
    }
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const int ia = 4 * ta + r, ib = tb + 16 * s;
            sQK[ia][ib] = ib <= ia && ia < n ? acc[r][s] * expf(sG[ia] - sG[ib]) : 0.0f;
        }
    // out += (q k^T decayed) v_new, v_new staged in tile
    dn_lower_times(&sQK[0][0], tile, U + (size_t)t0 * nv * d + (size_t)h * d, (size_t)nv * d, nullptr, n, d,
                   a.out + (size_t)t0 * nv * d + (size_t)h * d, (size_t)nv * d, true, ta, tb);
}
