// moe.cuh - the mixture-of-experts feed-forward (qwen3moe): the router's choice on the device,
// the experts' products over only the chosen experts' slices, and the weighted combine.  The
// expert ids never leave the GPU, so a MoE layer is launches alone (decode graphs capture it).
//
//   moe_router     the router's logits in FP32, from the normed activations before their FP16
//                  rounding and the router's weights in F32: a choice between experts whose
//                  scores nearly tie is then the CPU's, up to the residual stream's own rounding
//                  (moe_router_norm: the batch-1 step's carried norm, from the residual itself)
//   moe_route      softmax (or sigmoid: GLM-4.5) scores of the router's logits, the top k of
//                  the scores (+ the selection bias; DeepSeek: inside the best expert groups
//                  only) with ties to the lower id, their unbiased
//                  scores renormalised and scaled (Gemma 4: then times the expert's scale); or
//                  (gpt-oss) the top k of the logits, their softmax the weights:
//                  ids[t][j], weights[t][j] (one warp per token)
//   moe_glu_*      decode (a few tokens): each block routes its token as moe_route does (the
//                  same bits, no launch of its own), then h[e] = fp16(silu(Wgate_x h) * Wup_x h)
//                  for every entry e = (token, choice j) of expert x = ids[e]
//   moe_down_*     decode: x[t] (+)= sum_j weights[t][j] * Wdown_x h[(t, j)], the down product
//                  and the combine in one launch (a warp a row, all its choices)
//   moe_matvec_*   y[e] = W_x h[e] (the GeGLU experts' gate and up)
//   moe_sort       larger batches: the entries grouped by expert (stable, in entry order) and
//                  the tiles of at most bm entries of one expert that the grouped mmq launch
//                  takes (matvec_args.tiles)
//   moe_combine    x[t] (+)= sum_j weights[t][j] * y[row of entry (t, j)], j in order (grouped)
//
// Each entry's products depend on its own row alone, so a token's result does not depend on
// the batch it travels in (up to the mmq path's k splits, as for the dense matmuls).
#pragma once
#include "common.cuh"
#include "matvec.cuh"
#include "../gpu_kernel_names.h"
#include "../gpu_shared.h"

// logits[t][e] = x[t] . w[e] (+ bias[e]) over n inputs (a multiple of 4); grid (ceil(T / MOE_ROUTER_TOKENS),
// ceil(n_expert / per_block)), 8 warps: for each of the block's per_block experts in turn, the
// 256 threads stride over the expert's row (read once for MOE_ROUTER_TOKENS tokens) and the
// warps' sums are added in warp order.  A whole block on one row keeps 2 loads of it in flight
// per lane at n_embd 2048 where a warp per row had 16 in a dependent chain (the batch-1 step's
// router waited on ~16 memory round trips); per_block > 1 (prompts) lets a block's tokens' rows
// stay in its L1 over several experts (with one expert a block, a 2,048-token prompt read its
// activations from L2 once per expert: prefill 2048 7.7 % slower).  A token's sum runs the same
// way whatever its batch and per_block.
#define MOE_ROUTER_TOKENS GPU_MOE_ROUTER_TOKENS
extern "C" __global__ void __launch_bounds__(256) moe_router(const float *x, const float *w, const float *bias, int n,
                                                             int n_expert, int T, int per_block, float *logits)
{
    pdl_enter();
    __shared__ float part[8][MOE_ROUTER_TOKENS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t0 = blockIdx.x * MOE_ROUTER_TOKENS;
    const int e_end = min(n_expert, (blockIdx.y + 1) * per_block), j = threadIdx.x;
    for (int e = blockIdx.y * per_block; e < e_end; e++) {
        const float *wr = w + (size_t)e * n;
        float acc[MOE_ROUTER_TOKENS];
#pragma unroll
        for (int q = 0; q < MOE_ROUTER_TOKENS; q++) acc[q] = 0.0f;
        for (int i = threadIdx.x * 4; i < n; i += 4 * 256) {
            const float4 wv = *(const float4 *)(wr + i);
#pragma unroll
            for (int q = 0; q < MOE_ROUTER_TOKENS; q++) {
                const float4 xv = *(const float4 *)(x + (size_t)min(t0 + q, T - 1) * n + i);
                acc[q] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
            }
        }
#pragma unroll
        for (int q = 0; q < MOE_ROUTER_TOKENS; q++) {
            const float v = warp_sum(acc[q]);
            if (lane == 0) part[warp][q] = v;
        }
        __syncthreads();
        if (j < MOE_ROUTER_TOKENS && t0 + j < T) {
            float v = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) v += part[q][j];
            logits[(size_t)(t0 + j) * n_expert + e] = v + (bias ? bias[e] : 0.0f);
        }
        __syncthreads(); // part is the next expert's
    }
}

// The batch-1 step's router over a carried norm (gpu_shared.h matvec_norm; moe_glu_norm_* and
// moe_down_res_* below): logits[e] = rsqrt(mean(x^2) + eps) (w[e] . (x nm.w)) (+ bias[e]), x
// the residual stream in FP32 (not the norm's FP16 input xw: the router reads the normed row
// to FP32, as moe_router does), the sum of squares from the producer's partials (norm_rsqrt:
// the bits every consumer of the norm gets).  Grid (1, n_expert), as moe_router's one token;
// with w_sh (the shared expert's gate row: qwen35moe, qwen3next) one block more, whose logit
// (no bias) goes to sh_logit[0] -- read here, before the experts' down product moves x, as
// moe_router reads it from the same normed row (shared_expert).
extern "C" __global__ void __launch_bounds__(256) moe_router_norm(const float *x, const float *w, const float *bias,
                                                                  int n, matvec_norm nm, float *logits,
                                                                  const float *w_sh, float *sh_logit)
{
    pdl_enter();
    __shared__ float part[8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, e = blockIdx.y;
    const bool sh = w_sh && e == (int)gridDim.y - 1;
    const float *wr = sh ? w_sh : w + (size_t)e * n;
    float acc = 0.0f;
    for (int i = threadIdx.x * 4; i < n; i += 4 * 256) {
        const float4 wv = *(const float4 *)(wr + i), xv = *(const float4 *)(x + i), gv = *(const float4 *)(nm.w + i);
        acc += wv.x * (xv.x * gv.x) + wv.y * (xv.y * gv.y) + wv.z * (xv.z * gv.z) + wv.w * (xv.w * gv.w);
    }
    const float v = warp_sum(acc);
    if (lane == 0) part[warp] = v;
    const float rs = norm_rsqrt(nm); // (its barriers order part's stores before the sum)
    if (threadIdx.x == 0) {
        float sum = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; q++) sum += part[q];
        if (sh) *sh_logit = sum * rs;
        else logits[e] = sum * rs + (bias ? bias[e] : 0.0f);
    }
}

// DeepSeek's expert groups (ARCH_FFN_EXPERT_GROUPS; cpu_ops.c group_mask): each of the n_group
// groups of choice values scored by the sum of its two best (sigmoid, V3) or its best (softmax,
// V2), the best topk_group groups kept (ties: the lower group), the other groups' choices set
// to 0 -- not -inf: transformers' masked_fill(0.0), so a kept expert whose biased score is
// negative can lose to a masked one.  A lane per group scores it serially, in the CPU's order;
// the group scores go after the choices (shared memory), a kept group's set to -inf.
__device__ __forceinline__ void moe_group_mask(float *choice, int n_expert, int n_group, int topk_group,
                                               bool max_only)
{
    const int lane = threadIdx.x & 31, per = n_expert / n_group;
    float *best = choice + n_expert;
    for (int g = lane; g < n_group; g += 32) {
        const float *v = choice + (size_t)g * per;
        float first = v[0], second = -INFINITY;
        for (int i = 1; i < per; i++) {
            if (v[i] > first) second = first, first = v[i];
            else if (v[i] > second) second = v[i];
        }
        best[g] = max_only || per < 2 ? first : first + second;
    }
    __syncwarp();
    if (lane == 0) {
        for (int j = 0; j < topk_group; j++) {
            int top = 0;
            for (int g = 1; g < n_group; g++)
                if (best[g] > best[top]) top = g;
            best[top] = -INFINITY;
        }
    }
    __syncwarp();
    for (int x = lane; x < n_expert; x += 32)
        if (best[x / per] != -INFINITY) choice[x] = 0.0f;
    __syncwarp();
}

// The scores of one token's logits l into prob[] and its choice values into choice[] (shared
// memory), by one warp; returns the max logit (softmax, topk_first; else -inf).  moe_route_args
// says what is scored: the softmax of the logits (ARCH_ROUTER_SOFTMAX_TOPK), their sigmoid (+
// the selection bias: GLM-4.5), or, topk_first, the logits themselves (ARCH_ROUTER_TOPK_SOFTMAX:
// gpt-oss; the same choice as the softmax's, which keeps the order, up to ties the rounding makes).
__device__ __forceinline__ float moe_route_scores(const moe_route_args &a, const float *l, float *prob, float *choice,
                                                  int lane)
{
    const int n_expert = a.n_expert;
    float mx = -INFINITY;
    if (a.sigmoid) {
        for (int x = lane; x < n_expert; x += 32) prob[x] = 1.0f / (1.0f + expf(-l[x]));
    } else if (a.topk_first) {
        for (int x = lane; x < n_expert; x += 32) mx = fmaxf(mx, l[x]), prob[x] = l[x];
        mx = warp_max(mx);
    } else {
        for (int x = lane; x < n_expert; x += 32) mx = fmaxf(mx, l[x]);
        mx = warp_max(mx);
        float s = 0.0f;
        for (int x = lane; x < n_expert; x += 32) {
            prob[x] = expf(l[x] - mx);
            s += prob[x];
        }
        s = warp_sum(s);
        for (int x = lane; x < n_expert; x += 32) prob[x] /= s;
    }
    for (int x = lane; x < n_expert; x += 32) choice[x] = a.bias ? prob[x] + a.bias[x] : prob[x];
    return mx;
}

// The weight of the j-th choice bi before the renormalisation: the unbiased score, or
// (topk_first) the chosen logit's exp (the first chosen is the max).  none: no expert was left
// to choose (NaN logits): bi is then j, any valid id, never past the experts.
__device__ __forceinline__ float moe_route_raw(const moe_route_args &a, const float *prob, float mx, int bi, bool none)
{
    return a.topk_first ? expf((none ? mx : prob[bi]) - mx) : none ? 0.0f : prob[bi];
}

// The final weight of a choice from its raw one and the sum of the k raw ones (in choice order).
__device__ __forceinline__ float moe_route_final(const moe_route_args &a, float raw, float chosen_sum, int id)
{
    float w = a.norm ? raw / chosen_sum : raw;
    w *= a.scale;
    if (a.expert_scale) w *= a.expert_scale[id];
    return w;
}

// Token tok's route by one warp: the scores and the biased choice values in shared memory
// (prob: [n_expert] scores, [n_expert] choice values, then moe_group_mask's n_group), each of
// the k passes an argmax over the lanes' strided experts and a shuffle reduction (no block
// barrier).
__device__ __forceinline__ void moe_route_token(const moe_route_args &a, int tok, float *prob)
{
    const int lane = threadIdx.x & 31, n_expert = a.n_expert, k = a.k;
    float *choice = prob + n_expert;
    const float mx = moe_route_scores(a, a.logits + (size_t)tok * n_expert, prob, choice, lane);
    __syncwarp();
    if (a.n_group > 1) moe_group_mask(choice, n_expert, a.n_group, a.topk_group, !a.sigmoid);
    int32_t *ids = a.ids + (size_t)tok * k;
    float *weights = a.weights + (size_t)tok * k;
    float chosen_sum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY; // taken experts' choice values are set to -inf
        int bi = INT_MAX;
        for (int x = lane; x < n_expert; x += 32)
            if (choice[x] > bv) bv = choice[x], bi = x; // x ascends: the lower id wins a tie
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        const bool none = bi >= n_expert;
        if (none) bi = j;
        const float w = moe_route_raw(a, prob, mx, bi, none);
        chosen_sum += w;
        if (lane == 0) {
            ids[j] = bi;
            weights[j] = w;
            choice[bi] = -INFINITY;
        }
        __syncwarp();
    }
    __syncwarp();
    for (int j = lane; j < k; j += 32) weights[j] = moe_route_final(a, weights[j], chosen_sum, ids[j]);
}

// One warp per token (blockDim.x == 32).  Taken by the grouped path's larger chunks and the
// GeGLU experts; moe_route_sort routes and sorts a few tokens in one block; moe_glu routes its
// own blocks (moe_block_route: the same ids and weights, bit for bit).
extern "C" __global__ void moe_route(moe_route_args a)
{
    pdl_enter();
    extern __shared__ float prob[];
    moe_route_token(a, blockIdx.x, prob);
}

// Token t's route made by a whole block in shared memory (GPU_MOE_GLU_SMEM): sel[0..k) the
// chosen ids, wsel[0..k) their weights, as moe_route makes them.  Warp 0 scores; then each
// thread ranks its experts among the valid choice values (> -inf: NaN never is), ties to the
// lower id, and the expert of rank j is the j-th pass's argmax of moe_route -- k passes of
// shuffles on the critical path become one parallel count.  Choices past the valid experts are
// moe_route's "none".  Every thread of the block must call it (barriers).
__device__ __forceinline__ void moe_block_route(const moe_route_args &a, int t, int32_t *&sel, float *&wsel)
{
    extern __shared__ float rs[];
    __shared__ float s_mx;
    const int n_expert = a.n_expert, k = a.k, tid = threadIdx.x;
    float *prob = rs, *choice = rs + n_expert; // then moe_group_mask's n_group group scores
    sel = (int32_t *)(rs + 2 * n_expert + a.n_group);
    wsel = (float *)sel + k;
    for (int j = tid; j < k; j += blockDim.x) sel[j] = -1;
    if (tid < 32) {
        const float mx = moe_route_scores(a, a.logits + (size_t)t * n_expert, prob, choice, tid);
        __syncwarp();
        if (a.n_group > 1) moe_group_mask(choice, n_expert, a.n_group, a.topk_group, !a.sigmoid);
        if (tid == 0) s_mx = mx;
    }
    __syncthreads();
    for (int x = tid; x < n_expert; x += blockDim.x) {
        const float c = choice[x];
        if (!(c > -INFINITY)) continue;
        int r = 0;
        for (int y = 0; y < n_expert; y++) {
            const float o = choice[y];
            r += (o > c) | ((o == c) & (y < x));
        }
        if (r < k) sel[r] = x;
    }
    __syncthreads();
    if (tid == 0) { // k raw weights in choice order, their sum as moe_route adds it, the final ones
        float chosen_sum = 0.0f;
        for (int j = 0; j < k; j++) {
            const bool none = sel[j] < 0;
            const int bi = none ? j : sel[j];
            sel[j] = bi;
            wsel[j] = moe_route_raw(a, prob, s_mx, bi, none);
            chosen_sum += wsel[j];
        }
        for (int j = 0; j < k; j++) wsel[j] = moe_route_final(a, wsel[j], chosen_sum, sel[j]);
    }
    __syncthreads();
}

// A lane's chunk of one expert row between its load and its products: by default the decoded
// FP16 pairs (load_chunk_h); MXFP4 its raw words (mxfp4_raw: 5 registers, decoded at the
// products), so that gpt-oss's down kernel holds its four choices' chunks in flight within 80
// registers (moe_down_blocks; with the decoded pairs it took 121-128).
template <int T> struct moe_chunk {
    __half2 w[16];
    __device__ __forceinline__ void load(const uint8_t *row, int c) { load_chunk_h<T>(row, c, w); }
    __device__ __forceinline__ void decode(__half2 out[16]) const
    {
#pragma unroll
        for (int i = 0; i < 16; i++) out[i] = w[i];
    }
};
template <> struct moe_chunk<T_MXFP4> {
    mxfp4_raw q;
    __device__ __forceinline__ void load(const uint8_t *row, int c) { q = mxfp4_load(row, c); }
    __device__ __forceinline__ void decode(__half2 out[16]) const { mxfp4_decode_h(q, out); }
};

// The experts' dot products of one warp: NR weight rows with activation rows xs[r] (SHARED_X:
// all xs[0], the GLU's gate and up), U of a lane's chunks loaded before any is multiplied so
// that U x NR chunks' loads are in flight together (a whole block had one chunk's: the batch-1
// MoE products streamed their experts at 0.6-0.8 TB/s).  Chunks past the row are loaded again
// at the last one (no branch to keep the loads from moving up) and not added; each row's sum
// is row_dots<T, 1, 1>'s, its lane's chunks in order (chunk_dots), whatever U and NR.
template <int T, int NR, int U, bool SHARED_X>
__device__ __forceinline__ void moe_dots(const uint8_t *const rows[NR], const __half *const xs[NR], int k, float acc[NR])
{
    const int lane = threadIdx.x & 31, nchunks = k / 32;
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    for (int c0 = lane; c0 < nchunks; c0 += WARP * U) {
        moe_chunk<T> wq[U][NR];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < NR; r++) wq[u][r].load(rows[r], min(c0 + WARP * u, nchunks - 1));
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = min(c0 + WARP * u, nchunks - 1);
            float s[NR];
            if constexpr (SHARED_X) {
                __half2 wh[NR][16];
                float w[NR][32];
#pragma unroll
                for (int r = 0; r < NR; r++) wq[u][r].decode(wh[r]);
                chunk_weights<NR>(wh, w);
                chunk_dots<NR>(w, xs[0] + 32 * c, s);
            } else {
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    __half2 wh[1][16];
                    float w[1][32];
                    wq[u][r].decode(wh[0]);
                    chunk_weights<1>(wh, w);
                    chunk_dots<1>(w, xs[r] + 32 * c, s + r);
                }
            }
            const bool valid = c0 + WARP * u < nchunks;
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r] = valid ? acc[r] + s[r] : acc[r];
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = warp_sum(acc[r]);
}

// The chunks a lane of the GLU experts' kernels decodes before multiplying (moe_dots' U), where
// a row is whole passes of them.  MXFP4 keeps one: gpt-oss's rows (2,880 inputs) are never whole
// passes of two, and the unused unrolled path alone took its kernels from 64 registers to 124
// (ptxas, sm_90a), half the resident blocks.
template <int T> struct moe_glu_unroll { static constexpr int n = 2; };
template <> struct moe_glu_unroll<T_MXFP4> { static constexpr int n = 1; };

// Entry e = grid x, feature n = the warp's: the dot products of expert ids[e]'s row n of w0
// (and, GLU, of w1) with the entry's activation row, then the warp's lane 0 stores
// fp16(act(w0 x + b0, w1 x + b1)) in yh (GLU; glu_act) or w0 x in y.  GLU routes first
// (moe_block_route) and its grid row 0 writes the entry's id and weight.  NORM_IN (GLU, the
// batch-1 step's carried norm): x is the norm's input xw, the sums scaled by norm_in_scale_kept
// (moe_router_norm, launched before, kept the norm's sum: no partials, no barrier here); with
// a.sh0, the grid's last column x is the shared expert's gate and up (moe_mv_args), unrouted:
// its blocks are as an expert's, its rows sh0's and sh1's, its output sh_yh.
template <int T, bool GLU, int NORM = NORM_NONE>
__device__ __forceinline__ void moe_entry_body(const moe_mv_args &a)
{
    static_assert(NORM == NORM_NONE || (NORM == NORM_IN && GLU), "the norms' products");
    constexpr int NR = GLU ? 2 : 1;
    const int e = blockIdx.x, n = blockIdx.y * MATVEC_WARPS + (threadIdx.x >> 5);
    const bool shared = NORM == NORM_IN && a.sh0 && e == (int)gridDim.x - 1; // (whole blocks: no route)
    int id = 0;
    if constexpr (GLU) {
        if (!shared) {
            int32_t *sel;
            float *wsel;
            moe_block_route(a.route, e / a.route.k, sel, wsel);
            id = sel[e % a.route.k];
            if (blockIdx.y == 0 && threadIdx.x == 0) {
                a.route.ids[e] = id;
                a.route.weights[e] = wsel[e % a.route.k];
            }
        }
    } else {
        id = a.ids[e];
    }
    if (n >= (shared ? a.sh_n : a.n)) return;
    const size_t xoff = (size_t)id * a.expert_bytes + (size_t)n * a.row_bytes;
    const uint8_t *rows[NR];
    rows[0] = shared ? a.sh0 + (size_t)n * a.row_bytes : a.w0 + xoff;
    if (GLU) rows[NR - 1] = shared ? a.sh1 + (size_t)n * a.row_bytes : a.w1 + xoff;
    const __half *xs[NR];
    xs[0] = a.x + (size_t)(shared ? 0 : e / a.x_div) * a.ldx;
    float acc[NR];
    // U chunks a lane in flight where the row is whole passes of them (Qwen3-30B-A3B's 2,048
    // inputs: every chunk in one pass of two); else one, as the others would be decoded for nothing
    constexpr int U = moe_glu_unroll<T>::n;
    if (U > 1 && a.k % (32 * WARP * U) == 0)
        moe_dots<T, NR, U, true>(rows, xs, a.k, acc);
    else
        moe_dots<T, NR, 1, true>(rows, xs, a.k, acc);
    if constexpr (NORM == NORM_IN) {
        const float sc = norm_in_scale_kept(a.norm);
        acc[0] *= sc, acc[NR - 1] *= sc;
    }
    if ((threadIdx.x & 31) != 0) return;
    float g = acc[0], u = acc[NR - 1];
    if (GLU && a.b0 && !shared) { // the expert's gate and up biases
        g += a.b0[(size_t)id * a.n + n];
        u += a.b1[(size_t)id * a.n + n];
    }
    // (GeGLU experts take the unfused products: gpu_forward.c moe_chunk)
    if (GLU) {
        gpu_half *dst = shared ? a.sh_yh + n : a.yh + (size_t)e * a.ldy + n;
        *dst = __float2half_rn(glu_act(g, u, a.glu_limit, a.glu_alpha, 0));
    } else {
        a.y[(size_t)e * a.ldy + n] = g;
    }
}

// Token t = grid y, rows n0 = MATVEC_WARPS blockIdx.x.. (GPU_MOE_DOWN_ROWS): warp w takes row
// n0 + w of every choice's expert with the choice's activation row, MOE_DOWN_GROUP choices'
// loads in flight together (moe_dots: the same sums as moe_matvec's), and its lane 0 adds them
// weighted in choice order, as moe_combine does (the same bits), into the residual.  (A block
// of 8 warps over one row's (row, choice) pairs at k >= 8 was 2,048 blocks of 8 small dot
// products and a barrier each, and its one-row partials made the next layer's carried norm
// sum n_embd of them.)  NORM_OUT (one token, accumulate: the batch-1 step's carried norm):
// then, as matvec_res, the next norm's input xw for its rows and their sum of squares, in
// row order, as partial blockIdx.x (MATVEC_NORM_PARTS: a block's rows are its own).
#define MOE_DOWN_GROUP 4
// (ptxas gives moe_down_* 72 registers for Q4_K and 102 for Q6_K, with their loads moved up: two
// or three blocks a multiprocessor, Qwen3-30B-A3B's 256 blocks one wave -- held to three blocks,
// 80 registers, those formats spilled 72-196 bytes.  MXFP4 holds its chunks raw (moe_chunk) and
// is held to three blocks without spills: gpt-oss-20b's 360 blocks one wave, not ~1.4.)
template <int T, int NORM = NORM_NONE>
__device__ __forceinline__ void moe_down_body(const moe_mv_args &a)
{
    static_assert(NORM == NORM_NONE || NORM == NORM_OUT, "the norms' products");
    static_assert(GPU_MOE_DOWN_ROWS == MATVEC_WARPS, "a warp a row");
    const int K = a.route.k, t = blockIdx.y, n = blockIdx.x * MATVEC_WARPS + (threadIdx.x >> 5);
    const bool live = n < a.n;
    if (!live && NORM == NORM_NONE) return;
    float v = 0.0f;
    if (live) {
        float comb = 0.0f;
        for (int j0 = 0; j0 < K; j0 += MOE_DOWN_GROUP) {
            const uint8_t *rows[MOE_DOWN_GROUP];
            const __half *xs[MOE_DOWN_GROUP];
#pragma unroll
            for (int q = 0; q < MOE_DOWN_GROUP; q++) { // past the k choices: the last one's again, unused
                const int e = t * K + min(j0 + q, K - 1);
                rows[q] = a.w0 + (size_t)a.ids[e] * a.expert_bytes + (size_t)n * a.row_bytes;
                xs[q] = a.x + (size_t)e * a.ldx;
            }
            float d[MOE_DOWN_GROUP];
            moe_dots<T, MOE_DOWN_GROUP, 1, false>(rows, xs, a.k, d);
#pragma unroll
            for (int q = 0; q < MOE_DOWN_GROUP; q++) {
                const int e = t * K + j0 + q;
                if (j0 + q >= K) break;
                const float b = a.b0 ? a.b0[(size_t)a.ids[e] * a.n + n] : 0.0f;
                comb += a.route.weights[e] * (d[q] + b);
            }
        }
        float *dst = a.y + (size_t)t * a.ldy + n;
        if ((threadIdx.x & 31) == 0) {
            v = a.accumulate ? *dst + comb : comb;
            *dst = v;
        }
    }
    if constexpr (NORM == NORM_OUT) norm_out(a.norm, n, v, live, blockIdx.x);
}

// Blocks of the down kernel a multiprocessor must hold (__launch_bounds__' minimum).  MXFP4: 3,
// so gpt-oss-20b's 360 blocks (2,880 rows) are one wave of 132 x 3 instead of ~1.4 of 132 x 2 at
// the 121 registers ptxas takes unbounded (its raw chunks, moe_chunk, leave it no spills at 80).
template <int T> struct moe_down_blocks { static constexpr int n = 0; }; // (0: no minimum, as no bound)
template <> struct moe_down_blocks<T_MXFP4> { static constexpr int n = 3; };

// One pair per row of GPU_MOE_KERNELS (../gpu_kernel_names.h), under the row's names.
#define MOE_KERNELS(glu_name, matvec_name, down_name, TYPE)                                      \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) glu_name(moe_mv_args a)      \
    { pdl_enter();                                                                               \
        moe_entry_body<T_##TYPE, true>(a);                                                       \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) matvec_name(moe_mv_args a)   \
    { pdl_enter();                                                                               \
        moe_entry_body<T_##TYPE, false>(a);                                                      \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32, moe_down_blocks<T_##TYPE>::n) \
        down_name(moe_mv_args a)                                                                 \
    { pdl_enter();                                                                               \
        moe_down_body<T_##TYPE>(a);                                                              \
    }
GPU_MOE_KERNELS(MOE_KERNELS)

// One pair per row of GPU_MOE_NORM_KERNELS: the batch-1 MoE products that carry its norms.
#define MOE_NORM_KERNELS(glu_name, down_name, TYPE)                                              \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) glu_name(moe_mv_args a)      \
    { pdl_enter();                                                                               \
        moe_entry_body<T_##TYPE, true, NORM_IN>(a);                                              \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32, moe_down_blocks<T_##TYPE>::n) \
        down_name(moe_mv_args a)                                                                 \
    { pdl_enter();                                                                               \
        moe_down_body<T_##TYPE, NORM_OUT>(a);                                                    \
    }
GPU_MOE_NORM_KERNELS(MOE_NORM_KERNELS)

// One block: the n entries' expert ids (n <= GPU_MOE_MAX_ENTRIES) grouped by expert, stable.
// sorted[s] = the entry at sorted position s, pos[e] = the sorted position of entry e, and the
// tile list: (expert, first, end) per tile of at most bm sorted positions of one expert, in
// expert order, padded with expert -1 up to max_tiles.  A warp per expert counts and ranks its
// entries with ballots over the ids in shared memory, so the order never depends on timing.
// The experts' first positions and first tiles are exclusive sums over the experts (moe_scan),
// every thread a run of consecutive experts: one thread walking all the experts in turn was
// most of this launch at 128 experts (12.6 us of a Qwen3-30B-A3B batch-8 layer, ncu; the
// barrier stall of 1,023 threads waiting on it).
__device__ __forceinline__ int2 moe_warp_scan(int2 v, int lane) // (a, b) summed over lanes up to this one
{
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, v.x, o), b = __shfl_up_sync(0xffffffffu, v.y, o);
        if (lane >= o) v.x += a, v.y += b;
    }
    return v;
}

__device__ __forceinline__ int2 moe_scan(int2 v, int2 *wsum) // (a, b) summed over threads before this one
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int2 inc = moe_warp_scan(v, lane);
    if (lane == 31) wsum[w] = inc;
    __syncthreads();
    if (w == 0) { // the warps' totals, scanned by the first warp (at most 32 warps)
        const int2 t = moe_warp_scan(lane < nw ? wsum[lane] : make_int2(0, 0), lane);
        if (lane < nw) wsum[lane] = t;
    }
    __syncthreads();
    const int2 before = w ? wsum[w - 1] : make_int2(0, 0);
    return make_int2(before.x + inc.x - v.x, before.y + inc.y - v.y);
}

// moe_sort's work by the whole block (barriers), sm its n + n_expert ints of shared memory.
__device__ __forceinline__ void moe_sort_block(const int32_t *ids, int n, int n_expert, int bm, int max_tiles,
                                               int32_t *sorted, int32_t *pos, int32_t *tiles, int32_t *sm)
{
    __shared__ int2 wsum[32];
    int32_t *sid = sm, *off = sm + n; // ids [n], then counts / offsets [n_expert]
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sid[i] = ids[i];
    __syncthreads();
    for (int x = w; x < n_expert; x += nw) {
        int c = 0;
        for (int b = 0; b < n; b += 32) c += __popc(__ballot_sync(0xffffffffu, b + lane < n && sid[b + lane] == x));
        if (lane == 0) off[x] = c;
    }
    __syncthreads();
    { // counts -> offsets, and the tiles: thread i's experts x0 .. x1 - 1
        const int per = (n_expert + blockDim.x - 1) / blockDim.x, x0 = min(n_expert, threadIdx.x * per),
                  x1 = min(n_expert, x0 + per);
        int2 run = make_int2(0, 0); // its entries, its tiles
        for (int x = x0; x < x1; x++) run.x += off[x], run.y += (off[x] + bm - 1) / bm;
        const int2 first = moe_scan(run, wsum); // (the scan's barriers: every count read above)
        int o = first.x, nt = first.y;
        for (int x = x0; x < x1; x++) {
            const int c = off[x];
            for (int f = 0; f < c && nt < max_tiles; f += bm, nt++) {
                tiles[3 * nt] = x;
                tiles[3 * nt + 1] = o + f;
                tiles[3 * nt + 2] = o + min(c, f + bm);
            }
            off[x] = o;
            o += c;
        }
        const int total = wsum[nw - 1].y; // every tile of the list; the rest are padding
        for (int i = total + threadIdx.x; i < max_tiles; i += blockDim.x) tiles[3 * i] = -1;
    }
    __syncthreads();
    for (int x = w; x < n_expert; x += nw) {
        int r = off[x];
        for (int b = 0; b < n; b += 32) {
            const bool mine = b + lane < n && sid[b + lane] == x;
            const unsigned m = __ballot_sync(0xffffffffu, mine);
            if (mine) {
                const int s = r + __popc(m & ((1u << lane) - 1u));
                sorted[s] = b + lane;
                pos[b + lane] = s;
            }
            r += __popc(m);
        }
    }
}

extern "C" __global__ void moe_sort(const int32_t *ids, int n, int n_expert, int bm, int max_tiles,
                                    int32_t *sorted, int32_t *pos, int32_t *tiles)
{
    pdl_enter();
    extern __shared__ int32_t sm[];
    moe_sort_block(ids, n, n_expert, bm, max_tiles, sorted, pos, tiles, sm);
}

// moe_route then moe_sort in one launch, for a chunk of a few tokens (the narrow grouped path:
// batched decode): one block, warps w < rw route tokens w, w + rw, .. (moe_route_token, each in
// its own shared memory of 2 n_expert + n_group floats), then, past a barrier that makes their
// ids visible to the block, the block sorts the n_tok * k entries as moe_sort does (the shared
// memory reused).  The same ids, weights, order and tiles as the two launches.
extern "C" __global__ void __launch_bounds__(1024)
    moe_route_sort(moe_route_args a, int n_tok, int rw, int bm, int max_tiles, int32_t *sorted, int32_t *pos, int32_t *tiles)
{
    pdl_enter();
    extern __shared__ float rsm[];
    const int w = threadIdx.x >> 5;
    if (w < rw)
        for (int tok = w; tok < n_tok; tok += rw) {
            moe_route_token(a, tok, rsm + (size_t)w * (2 * a.n_expert + a.n_group));
            __syncwarp(); // (the next token's scores overwrite this one's)
        }
    __syncthreads();
    moe_sort_block(a.ids, n_tok * a.k, a.n_expert, bm, max_tiles, sorted, pos, tiles, (int32_t *)rsm);
}

// x[t][d] (+)= sum_j weights[t*k + j] * (y[row][d] + bias[ids[t*k + j]][d]), row = pos ?
// pos[t*k + j] : t*k + j (bias: the experts' down biases, NULL: none), j in order; grid (tokens,
// ceil(n / blockDim.x)), a thread a feature.  Each run of 8 choices has its rows and weights read,
// then its 8 rows' loads issued together, then added in choice order (the same sum as one choice
// at a time).  A block a token whose threads walked 8 features one choice at a time -- two
// dependent loads per choice, no loads in flight together -- took 20-22 us a batch-8 layer
// (ncu, both MoE shapes) for 0.6 MB.
extern "C" __global__ void moe_combine(float *x, const float *y, const float *weights, const int32_t *pos, int k,
                                       int n, int accumulate, const float *bias, const int32_t *ids)
{
    pdl_enter();
    const int t = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= n) return;
    float acc = 0.0f;
    for (int j0 = 0; j0 < k; j0 += 8) {
        float wv[8], v[8];
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const int e = t * k + j0 + q;
            if (j0 + q < k) {
                const int row = pos ? pos[e] : e;
                wv[q] = weights[e];
                v[q] = y[(size_t)row * n + d] + (bias ? bias[(size_t)ids[e] * n + d] : 0.0f);
            }
        }
#pragma unroll
        for (int q = 0; q < 8; q++)
            if (j0 + q < k) acc += wv[q] * v[q];
    }
    float *dst = x + (size_t)t * n + d;
    *dst = accumulate ? *dst + acc : acc;
}
