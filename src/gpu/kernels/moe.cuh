// moe.cuh - the mixture-of-experts feed-forward (qwen3moe): the router's choice on the device,
// the experts' products over only the chosen experts' slices, and the weighted combine.  The
// expert ids never leave the GPU, so a MoE layer is launches alone (decode graphs capture it).
//
//   moe_router     the router's logits in FP32, from the normed activations before their FP16
//                  rounding and the router's weights in F32: a choice between experts whose
//                  scores nearly tie is then the CPU's, up to the residual stream's own rounding
//   moe_route      softmax (or sigmoid: GLM-4.5) scores of the router's logits, the top k of
//                  the scores (+ the selection bias; DeepSeek: inside the best expert groups
//                  only) with ties to the lower id, their unbiased
//                  scores renormalised and scaled (Gemma 4: then times the expert's scale); or
//                  (gpt-oss) the top k of the logits, their softmax the weights:
//                  ids[t][j], weights[t][j] (one warp per token)
//   moe_glu_*      decode (a few tokens): h[e] = fp16(silu(Wgate_x h) * Wup_x h) for every entry
//   moe_matvec_*   e = (token, choice j) of expert x = ids[e]; y[e] = Wdown_x h[e]
//   moe_sort       larger batches: the entries grouped by expert (stable, in entry order) and
//                  the tiles of at most bm entries of one expert that the grouped mmq launch
//                  takes (matvec_args.tiles)
//   moe_combine    x[t] (+)= sum_j weights[t][j] * y[row of entry (t, j)], j in order
//
// Each entry's products depend on its own row alone, so a token's result does not depend on
// the batch it travels in (up to the mmq path's k splits, as for the dense matmuls).
#pragma once
#include "common.cuh"
#include "matvec.cuh"
#include "../gpu_kernel_names.h"
#include "../gpu_shared.h"

// logits[t][e] = x[t] . w[e] (+ bias[e]) over n inputs (a multiple of 4); grid (ceil(T / MOE_ROUTER_TOKENS),
// ceil(n_expert / 8)), 8 warps: a warp per expert over MOE_ROUTER_TOKENS tokens, so the
// expert's row is read once for them.  A token's sum runs the same way whatever its batch.
#define MOE_ROUTER_TOKENS GPU_MOE_ROUTER_TOKENS
extern "C" __global__ void moe_router(const float *x, const float *w, const float *bias, int n, int n_expert, int T,
                                      float *logits)
{
    const int e = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31, t0 = blockIdx.x * MOE_ROUTER_TOKENS;
    if (e >= n_expert) return;
    const float *wr = w + (size_t)e * n;
    float acc[MOE_ROUTER_TOKENS];
#pragma unroll
    for (int j = 0; j < MOE_ROUTER_TOKENS; j++) acc[j] = 0.0f;
    for (int i = lane * 4; i < n; i += 128) {
        const float4 wv = *(const float4 *)(wr + i);
#pragma unroll
        for (int j = 0; j < MOE_ROUTER_TOKENS; j++) {
            const float4 xv = *(const float4 *)(x + (size_t)min(t0 + j, T - 1) * n + i);
            acc[j] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
        }
    }
#pragma unroll
    for (int j = 0; j < MOE_ROUTER_TOKENS; j++) {
        const float v = warp_sum(acc[j]) + (bias ? bias[e] : 0.0f);
        if (lane == 0 && t0 + j < T) logits[(size_t)(t0 + j) * n_expert + e] = v;
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
    const int lane = threadIdx.x, per = n_expert / n_group;
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

// One warp per token (blockDim.x == 32): the scores and the biased choice values in shared
// memory, each of the k passes an argmax over the lanes' strided experts and a shuffle
// reduction (no block barrier: the k passes are on the decode step's critical path, once per
// layer).  moe_route_args says what is scored and how the weights are made: the softmax of the
// logits (ARCH_ROUTER_SOFTMAX_TOPK), their sigmoid (+ the selection bias: GLM-4.5), or,
// topk_first, the logits themselves with the chosen ones' softmax their weights
// (ARCH_ROUTER_TOPK_SOFTMAX: gpt-oss; the same choice as the softmax's, which keeps the order,
// up to ties the rounding makes).
extern "C" __global__ void moe_route(moe_route_args a)
{
    extern __shared__ float prob[]; // [n_expert] scores, [n_expert] choice values, [n_group] group scores
    const int lane = threadIdx.x, n_expert = a.n_expert, k = a.k;
    float *choice = prob + n_expert;
    const float *l = a.logits + (size_t)blockIdx.x * n_expert;
    float mx = -INFINITY; // the max logit (softmax, topk_first)
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
    __syncwarp();
    if (a.n_group > 1) moe_group_mask(choice, n_expert, a.n_group, a.topk_group, !a.sigmoid);
    int32_t *ids = a.ids + (size_t)blockIdx.x * k;
    float *weights = a.weights + (size_t)blockIdx.x * k;
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
        const bool none = bi >= n_expert; // NaN logits: any valid id, never past the experts
        if (none) bi = j;
        // the unbiased score; topk_first: the chosen logit's exp (the first chosen is the max)
        const float w = a.topk_first ? expf((none ? mx : prob[bi]) - mx) : none ? 0.0f : prob[bi];
        chosen_sum += w;
        if (lane == 0) {
            ids[j] = bi;
            weights[j] = w;
            choice[bi] = -INFINITY;
        }
        __syncwarp();
    }
    __syncwarp();
    for (int j = lane; j < k; j += 32) {
        float w = a.norm ? weights[j] / chosen_sum : weights[j];
        w *= a.scale;
        if (a.expert_scale) w *= a.expert_scale[ids[j]];
        weights[j] = w;
    }
}

// Entry e = grid x, feature n = the warp's: the dot products of expert ids[e]'s row n of w0
// (and, GLU, of w1) with the entry's activation row, then the warp's lane 0 stores
// fp16(act(w0 x + b0, w1 x + b1)) in yh (GLU; glu_act) or w0 x in y.
template <int T, bool GLU>
__device__ __forceinline__ void moe_entry_body(const moe_mv_args &a)
{
    constexpr int NR = GLU ? 2 : 1;
    const int e = blockIdx.x, n = blockIdx.y * MATVEC_WARPS + (threadIdx.x >> 5);
    if (n >= a.n) return;
    const size_t xoff = (size_t)a.ids[e] * a.expert_bytes + (size_t)n * a.row_bytes;
    const uint8_t *rows[NR];
    rows[0] = a.w0 + xoff;
    if (GLU) rows[NR - 1] = a.w1 + xoff;
    matvec_args m = {};
    m.k = a.k;
    m.m = 1;
    m.ldx = a.ldx;
    m.x = a.x + (size_t)(e / a.x_div) * a.ldx;
    float acc[NR][1];
    row_dots<T, 1, NR>(rows, m, 0, acc);
    if ((threadIdx.x & 31) != 0) return;
    float g = acc[0][0], u = acc[NR - 1][0];
    if (GLU && a.b0) { // the expert's gate and up biases
        g += a.b0[(size_t)a.ids[e] * a.n + n];
        u += a.b1[(size_t)a.ids[e] * a.n + n];
    }
    if (GLU) a.yh[(size_t)e * a.ldy + n] = __float2half_rn(glu_act(g, u, a.glu_limit, a.glu_alpha));
    else a.y[(size_t)e * a.ldy + n] = g;
}

// One pair per row of GPU_MOE_KERNELS (../gpu_kernel_names.h), under the row's names.
#define MOE_KERNELS(glu_name, matvec_name, TYPE)                                                 \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) glu_name(moe_mv_args a)      \
    {                                                                                            \
        moe_entry_body<T_##TYPE, true>(a);                                                       \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) matvec_name(moe_mv_args a)   \
    {                                                                                            \
        moe_entry_body<T_##TYPE, false>(a);                                                      \
    }
GPU_MOE_KERNELS(MOE_KERNELS)

// One block: the n entries' expert ids (n <= GPU_MOE_MAX_ENTRIES) grouped by expert, stable.
// sorted[s] = the entry at sorted position s, pos[e] = the sorted position of entry e, and the
// tile list: (expert, first, end) per tile of at most bm sorted positions of one expert,
// padded with expert -1 up to max_tiles.  A warp per expert counts and ranks its entries with
// ballots over the ids in shared memory, so the order never depends on timing.
extern "C" __global__ void moe_sort(const int32_t *ids, int n, int n_expert, int bm, int max_tiles,
                                    int32_t *sorted, int32_t *pos, int32_t *tiles)
{
    extern __shared__ int32_t sm[]; // ids [n], then counts / offsets [n_expert]
    int32_t *sid = sm, *off = sm + n;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sid[i] = ids[i];
    __syncthreads();
    for (int x = w; x < n_expert; x += nw) {
        int c = 0;
        for (int b = 0; b < n; b += 32) c += __popc(__ballot_sync(0xffffffffu, b + lane < n && sid[b + lane] == x));
        if (lane == 0) off[x] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) { // counts -> offsets, and the tiles
        int o = 0, nt = 0;
        for (int x = 0; x < n_expert; x++) {
            const int c = off[x];
            for (int f = 0; f < c && nt < max_tiles; f += bm, nt++) {
                tiles[3 * nt] = x;
                tiles[3 * nt + 1] = o + f;
                tiles[3 * nt + 2] = o + min(c, f + bm);
            }
            off[x] = o;
            o += c;
        }
        for (; nt < max_tiles; nt++) tiles[3 * nt] = -1;
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

// x[t][d] (+)= sum_j weights[t*k + j] * (y[row][d] + bias[ids[t*k + j]][d]), row = pos ?
// pos[t*k + j] : t*k + j (bias: the experts' down biases, NULL: none); one block per token.
extern "C" __global__ void moe_combine(float *x, const float *y, const float *weights, const int32_t *pos, int k,
                                       int n, int accumulate, const float *bias, const int32_t *ids)
{
    const int t = blockIdx.x;
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            const int e = t * k + j, row = pos ? pos[e] : e;
            const float b = bias ? bias[(size_t)ids[e] * n + d] : 0.0f;
            acc += weights[e] * (y[(size_t)row * n + d] + b);
        }
        float *dst = x + (size_t)t * n + d;
        *dst = accumulate ? *dst + acc : acc;
    }
}
