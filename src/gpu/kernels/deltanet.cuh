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
//   split_qgate  a gated attention's [query | gate] per head: the queries to q
//   gate_heads   act_h *= sigmoid(gate) (the attention's output gate)
//   shexp_add    x += sigmoid(gate logit) * y, or y ungated (the shared expert, after the routed ones)
#pragma once
#include "common.cuh"
#include "../gpu_shared.h"

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// Grid (sequences, ceil(chan / 128)), 128 threads: a thread per channel walks the sequence's
// tokens with the window in registers.
extern "C" __global__ void ssm_conv(ssm_args a)
{
    const gpu_ssm_seq s = a.seqs[blockIdx.x];
    const int c = blockIdx.y * blockDim.x + threadIdx.x, taps = a.taps;
    if (c >= a.chan) return;
    float *win = a.state + (size_t)s.state * a.slot_stride + a.conv_off;
    const float *w = a.conv_w + (size_t)c * taps;
    float hist[GPU_SSM_MAX_TAPS - 1], wr[GPU_SSM_MAX_TAPS];
#pragma unroll
    for (int j = 0; j < GPU_SSM_MAX_TAPS - 1; j++) hist[j] = j < taps - 1 ? win[(size_t)j * a.chan + c] : 0.0f;
#pragma unroll
    for (int j = 0; j < GPU_SSM_MAX_TAPS; j++) wr[j] = j < taps ? w[j] : 0.0f;
    for (int t = s.first; t < s.first + s.n; t++) {
        float *x = a.mix + (size_t)t * a.chan + c;
        const float in = *x;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < GPU_SSM_MAX_TAPS; j++) {
            if (j < taps - 1) acc += wr[j] * hist[j];
            else if (j == taps - 1) acc += wr[j] * in;
        }
#pragma unroll
        for (int j = 0; j + 1 < GPU_SSM_MAX_TAPS - 1; j++)
            if (j + 1 < taps - 1) hist[j] = hist[j + 1];
#pragma unroll
        for (int j = 0; j < GPU_SSM_MAX_TAPS - 1; j++)
            if (j == taps - 2) hist[j] = in;
        *x = acc * sigmoidf_(acc);
    }
#pragma unroll
    for (int j = 0; j < GPU_SSM_MAX_TAPS - 1; j++)
        if (j < taps - 1) win[(size_t)j * a.chan + c] = hist[j];
}

// Grid (tokens, 2 * k_heads), one warp: head h < k_heads is a q head (also scaled), else a k head.
extern "C" __global__ void ssm_qk_norm(float *mix, int chan, int d, int k_heads)
{
    float *v = mix + (size_t)blockIdx.x * chan + (size_t)blockIdx.y * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += WARP) ss += v[i] * v[i];
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf(ss + 1e-6f);
    if ((int)blockIdx.y < k_heads) inv *= 1.0f / sqrtf((float)d);
    for (int i = threadIdx.x; i < d; i += WARP) v[i] *= inv;
}

// n = tokens * v_heads entries.  b and a: the raw projections [t][v_heads] (turned into beta
// and g in place), or with `fused` one projection raw [t][2 * v_heads] grouped per k head (its
// v heads' b, then their a: qwen3next) read from raw into b and a.
extern "C" __global__ void ssm_gates(float *b, float *a, const float *raw, int fused, int v_heads, int k_heads,
                                     const float *A, const float *dt_bias, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int t = i / v_heads, h = i % v_heads, per_k = v_heads / k_heads;
    float bv, av;
    if (fused) {
        const float *group = raw + (size_t)t * 2 * v_heads + (size_t)(h / per_k) * 2 * per_k;
        bv = group[h % per_k];
        av = group[per_k + h % per_k];
    } else {
        bv = b[i];
        av = a[i];
    }
    const float x = av + dt_bias[h], softplus = x > 20.0f ? x : log1pf(expf(x)); // torch's threshold
    b[i] = sigmoidf_(bv);
    a[i] = A[h] * softplus;
}

// Grid (sequences, v_heads, ceil(d / 32)), GPU_SSM_WARPS warps: a block owns 32 columns j of
// the head's state S [d][d]; lane l of warp w holds S[i][j] for its column and the rows i of
// warp w's share in registers.  Each token: S^T k and S^T q are sums over rows, reduced across
// the warps through shared memory, in one fixed order (so a token's result does not depend on
// the batch).
extern "C" __global__ void __launch_bounds__(GPU_SSM_WARPS * 32) delta_rule(ssm_args a)
{
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

// Grid (tokens, v_heads), one warp: out[t][h] = fp16(rmsnorm(o[t][h]) * w * silu(z[t][h])).
extern "C" __global__ void ssm_out_norm(const float *o, const float *z, const float *w, __half *out, int d,
                                        int v_heads, float eps)
{
    const size_t base = ((size_t)blockIdx.x * v_heads + blockIdx.y) * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += WARP) ss += o[base + i] * o[base + i];
    ss = warp_sum(ss);
    const float scale = rsqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += WARP) {
        const float zi = z[base + i];
        out[base + i] = __float2half_rn(o[base + i] * scale * w[i] * (zi * sigmoidf_(zi)));
    }
}

// q[t][h][i] = qg[t][h][i] for the n = tokens * n_head * hd entries of q (qg: [t][h][2 hd]).
extern "C" __global__ void split_qgate(const float *qg, float *q, int hd, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q[i] = qg[i / hd * 2 * hd + i % hd];
}

// act[t][h][i] *= sigmoid(qg[t][h][hd + i]) over the n entries of the attention's output.
extern "C" __global__ void gate_heads(__half *act, const float *qg, int hd, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        act[i] = __float2half_rn(__half2float(act[i]) * sigmoidf_(qg[i / hd * 2 * hd + hd + i % hd]));
}

// Grid tokens: x[t] += sigmoid(logit[t]) * y[t] over n floats (logit NULL: x[t] += y[t], the
// ungated shared expert of GLM-4.5).
extern "C" __global__ void shexp_add(float *x, const float *y, const float *logit, int n)
{
    const float g = logit ? sigmoidf_(logit[blockIdx.x]) : 1.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[(size_t)blockIdx.x * n + i] += g * y[(size_t)blockIdx.x * n + i];
}

// ---- the chunked form, for prompts -------------------------------------------------------
// The same recurrence over chunks of GPU_SSM_CHUNK tokens (flash-linear-attention's WY / UT
// transform; the CPU's reference is cpu_delta_run with chunk > 0, whose comment gives the
// algebra).  Per chunk with cumulative log decay G and the state S0 it starts from:
//   delta_chunk_prep  (every chunk at once: nothing here reads a state)
//                     T = (I - A)^-1 - I for A[a][b] = -beta_a (k_a . k_b) exp(G_a - G_b), b < a,
//                     by forward substitution; U = (I + T) beta v, W = (I + T) beta exp(G) k
//   delta_chunk_state (per sequence, its chunks in order; a block owns 32 columns of S)
//                     v_new = U - W S0 (into U), out = exp(G_a) q_a S0, then
//                     S = S0 exp(G_last) + sum over b of k_b exp(G_last - G_b) v_new_b^T
//   delta_chunk_out   (every chunk at once) out_a += sum over b <= a of (q_a . k_b) exp(G_a - G_b) v_new_b
// The in-chunk work is small matrix products instead of a chain of per-token steps; only the
// state update is sequential, once per chunk.

__device__ __forceinline__ float dot_d(const float *x, const float *y, int d)
{
    float s = 0.0f;
    for (int i = 0; i < d; i++) s += x[i] * y[i];
    return s;
}

// Grid (chunks, v_heads), 256 threads.  U, W: [t][v_heads * d]; Gc: [t][v_heads], the
// cumulative log decay within the token's chunk.
extern "C" __global__ void __launch_bounds__(256) delta_chunk_prep(ssm_args a, const gpu_ssm_seq *chunks, float *U,
                                                                   float *W, float *Gc)
{
    __shared__ float sT[GPU_SSM_CHUNK][GPU_SSM_CHUNK + 1], sG[GPU_SSM_CHUNK], sB[GPU_SSM_CHUNK], row[GPU_SSM_CHUNK];
    const gpu_ssm_seq c = chunks[blockIdx.x];
    const int h = blockIdx.y, d = a.d, nv = a.v_heads, n = c.n, t0 = c.first, tid = threadIdx.x;
    const int per_k = nv / a.k_heads, kh = a.grouped ? h / per_k : h % a.k_heads;
    const int k_off = a.k_heads * d + kh * d, v_off = 2 * a.k_heads * d + h * d;
    if (tid == 0) {
        float acc = 0.0f;
        for (int i = 0; i < n; i++) sG[i] = acc += a.g[(size_t)(t0 + i) * nv + h];
    }
    if (tid < n) sB[tid] = a.beta[(size_t)(t0 + tid) * nv + h];
    __syncthreads();
    if (tid < n) Gc[(size_t)(t0 + tid) * nv + h] = sG[tid];
    for (int idx = tid; idx < n * n; idx += blockDim.x) {
        const int ia = idx / n, ib = idx % n;
        float v = 0.0f;
        if (ib < ia)
            v = -sB[ia] * dot_d(a.mix + (size_t)(t0 + ia) * a.chan + k_off, a.mix + (size_t)(t0 + ib) * a.chan + k_off, d) *
                expf(sG[ia] - sG[ib]);
        sT[ia][ib] = v;
    }
    __syncthreads();
    for (int ia = 1; ia < n; ia++) { // T[a][b] = A[a][b] + sum over b < m < a of A[a][m] T[m][b]
        if (tid < ia) row[tid] = sT[ia][tid];
        __syncthreads();
        if (tid < ia) {
            float t = row[tid];
            for (int m = tid + 1; m < ia; m++) t += row[m] * sT[m][tid];
            sT[ia][tid] = t;
        }
        __syncthreads();
    }
    for (int idx = tid; idx < n * d; idx += blockDim.x) {
        const int ia = idx / d, j = idx % d;
        float u = 0.0f, w = 0.0f;
        for (int ib = 0; ib <= ia; ib++) {
            const float bb = sB[ib] * (ib == ia ? 1.0f : sT[ia][ib]);
            const float *x = a.mix + (size_t)(t0 + ib) * a.chan;
            u += bb * x[v_off + j];
            w += bb * expf(sG[ib]) * x[k_off + j];
        }
        const size_t o = (size_t)(t0 + ia) * nv * d + (size_t)h * d + j;
        U[o] = u;
        W[o] = w;
    }
}

// Grid (sequences, v_heads, ceil(d / 32)), GPU_SSM_WARPS warps, S's columns in registers as in
// delta_rule.  Rows a of a chunk go 8 at a time: each warp's partial sums over its rows of S,
// then warp u finishes row a0 + u.
extern "C" __global__ void __launch_bounds__(GPU_SSM_WARPS * 32, 1) delta_chunk_state(ssm_args a, float *U, const float *W,
                                                                                    const float *Gc)
{
    __shared__ float rw[GPU_SSM_WARPS][GPU_SSM_WARPS][WARP], rq[GPU_SSM_WARPS][GPU_SSM_WARPS][WARP];
    __shared__ float sVn[GPU_SSM_CHUNK][WARP];
    constexpr int MAX_ROWS = GPU_SSM_MAX_D / GPU_SSM_WARPS;
    const gpu_ssm_seq s = a.seqs[blockIdx.x];
    const int h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = a.d, nv = a.v_heads;
    const int j = blockIdx.z * WARP + lane, per_k = nv / a.k_heads, kh = a.grouped ? h / per_k : h % a.k_heads;
    const int rows = (d + GPU_SSM_WARPS - 1) / GPU_SSM_WARPS, i0 = w * rows, q_off = kh * d,
              k_off = a.k_heads * d + kh * d;
    const bool col = j < d;
    float *S = a.state + (size_t)s.state * a.slot_stride + a.delta_off + (size_t)h * d * d;
    float r[MAX_ROWS];
#pragma unroll
    for (int ii = 0; ii < MAX_ROWS; ii++) r[ii] = col && ii < rows && i0 + ii < d ? S[(size_t)(i0 + ii) * d + j] : 0.0f;
    const int end = s.first + s.n;
    for (int t0 = s.first; t0 < end; t0 += GPU_SSM_CHUNK) {
        const int n = end - t0 < GPU_SSM_CHUNK ? end - t0 : GPU_SSM_CHUNK;
        for (int a0 = 0; a0 < n; a0 += GPU_SSM_WARPS) {
            for (int u = 0; u < GPU_SSM_WARPS; u++) {
                float pw = 0.0f, pq = 0.0f;
                if (a0 + u < n) {
                    const float *wr = W + (size_t)(t0 + a0 + u) * nv * d + (size_t)h * d;
                    const float *q = a.mix + (size_t)(t0 + a0 + u) * a.chan + q_off;
#pragma unroll
                    for (int ii = 0; ii < MAX_ROWS; ii++) {
                        if (ii < rows && i0 + ii < d) {
                            pw += wr[i0 + ii] * r[ii];
                            pq += q[i0 + ii] * r[ii];
                        }
                    }
                }
                rw[w][u][lane] = pw;
                rq[w][u][lane] = pq;
            }
            __syncthreads();
            const int ia = a0 + w;
            if (ia < n) {
                float sw = 0.0f, sq = 0.0f;
#pragma unroll
                for (int v = 0; v < GPU_SSM_WARPS; v++) {
                    sw += rw[v][w][lane];
                    sq += rq[v][w][lane];
                }
                float vn = 0.0f;
                if (col) {
                    const size_t o = (size_t)(t0 + ia) * nv * d + (size_t)h * d + j;
                    vn = U[o] - sw;
                    U[o] = vn;
                    a.out[o] = expf(Gc[(size_t)(t0 + ia) * nv + h]) * sq;
                }
                sVn[ia][lane] = vn;
            }
            __syncthreads();
        }
        const float GL = Gc[(size_t)(t0 + n - 1) * nv + h], el = expf(GL);
#pragma unroll
        for (int ii = 0; ii < MAX_ROWS; ii++) r[ii] *= el;
        for (int b = 0; b < n; b++) {
            const float coef = expf(GL - Gc[(size_t)(t0 + b) * nv + h]) * sVn[b][lane];
            const float *kb = a.mix + (size_t)(t0 + b) * a.chan + k_off;
#pragma unroll
            for (int ii = 0; ii < MAX_ROWS; ii++)
                if (ii < rows && i0 + ii < d) r[ii] += kb[i0 + ii] * coef;
        }
        __syncthreads(); // sVn is the next chunk's
    }
#pragma unroll
    for (int ii = 0; ii < MAX_ROWS; ii++)
        if (col && ii < rows && i0 + ii < d) S[(size_t)(i0 + ii) * d + j] = r[ii];
}

// Grid (chunks, v_heads), 256 threads: the in-chunk part of the outputs, from v_new (in U).
extern "C" __global__ void __launch_bounds__(256) delta_chunk_out(ssm_args a, const gpu_ssm_seq *chunks, const float *U,
                                                                  const float *Gc)
{
    __shared__ float sQK[GPU_SSM_CHUNK][GPU_SSM_CHUNK + 1];
    const gpu_ssm_seq c = chunks[blockIdx.x];
    const int h = blockIdx.y, d = a.d, nv = a.v_heads, n = c.n, t0 = c.first;
    const int per_k = nv / a.k_heads, kh = a.grouped ? h / per_k : h % a.k_heads;
    const int q_off = kh * d, k_off = a.k_heads * d + kh * d;
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
        const int ia = idx / n, ib = idx % n;
        float v = 0.0f;
        if (ib <= ia)
            v = dot_d(a.mix + (size_t)(t0 + ia) * a.chan + q_off, a.mix + (size_t)(t0 + ib) * a.chan + k_off, d) *
                expf(Gc[(size_t)(t0 + ia) * nv + h] - Gc[(size_t)(t0 + ib) * nv + h]);
        sQK[ia][ib] = v;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n * d; idx += blockDim.x) {
        const int ia = idx / d, j = idx % d;
        float acc = 0.0f;
        for (int ib = 0; ib <= ia; ib++) acc += sQK[ia][ib] * U[(size_t)(t0 + ib) * nv * d + (size_t)h * d + j];
        a.out[(size_t)(t0 + ia) * nv * d + (size_t)h * d + j] += acc;
    }
}
