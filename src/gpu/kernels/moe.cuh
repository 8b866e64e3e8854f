// moe.cuh - the mixture-of-experts feed-forward (qwen3moe): the router's choice on the device,
// the experts' products over only the chosen experts' slices, and the weighted combine.  The
// expert ids never leave the GPU, so a MoE layer is launches alone (decode graphs capture it).
//
//   moe_route      softmax over the router's logits, the top k (ties to the lower id), their
//                  weights renormalised: ids[t][j], weights[t][j] (one block per token)
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

// One block per token, blockDim.x threads over the experts.
extern "C" __global__ void moe_route(const float *logits, int n_expert, int k, int32_t *ids, float *weights)
{
    __shared__ float sh[32];
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    extern __shared__ float prob[]; // [n_expert]
    const float *l = logits + (size_t)blockIdx.x * n_expert;
    float mx = -INFINITY;
    for (int x = threadIdx.x; x < n_expert; x += blockDim.x) mx = fmaxf(mx, l[x]);
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int x = threadIdx.x; x < n_expert; x += blockDim.x) {
        prob[x] = expf(l[x] - mx);
        s += prob[x];
    }
    s = block_sum(s, sh);
    for (int x = threadIdx.x; x < n_expert; x += blockDim.x) prob[x] /= s;
    __syncthreads();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float chosen_sum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -1.0f; // probabilities are >= 0; taken ones are set to -1
        int bi = INT_MAX;
        for (int x = threadIdx.x; x < n_expert; x += blockDim.x)
            if (prob[x] > bv) bv = prob[x], bi = x; // x ascends: the lower id wins a tie
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) best_v[w] = bv, best_i[w] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 1; i < nw; i++)
                if (best_v[i] > best_v[0] || (best_v[i] == best_v[0] && best_i[i] < best_i[0]))
                    best_v[0] = best_v[i], best_i[0] = best_i[i];
            if (best_i[0] >= n_expert) best_i[0] = j, best_v[0] = 0.0f; // NaN logits: any valid id, never past the experts
            ids[(size_t)blockIdx.x * k + j] = best_i[0];
            weights[(size_t)blockIdx.x * k + j] = best_v[0];
            chosen_sum += best_v[0];
            prob[best_i[0]] = -1.0f;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        for (int j = 0; j < k; j++) weights[(size_t)blockIdx.x * k + j] /= chosen_sum;
}

// Entry e of the grid's x: its expert's rows of w0 (and w1) against its activation row.
template <int T, int NR>
__device__ __forceinline__ void moe_row_dots(const moe_mv_args &a, int e, int n, float acc[NR][1])
{
    const size_t xoff = (size_t)a.ids[e] * a.expert_bytes + (size_t)n * a.row_bytes;
    const uint8_t *rows[NR];
    rows[0] = a.w0 + xoff;
    if (NR > 1) rows[NR - 1] = a.w1 + xoff;
    matvec_args m = {};
    m.k = a.k;
    m.m = 1;
    m.ldx = a.ldx;
    m.x = a.x + (size_t)(e / a.x_div) * a.ldx;
    row_dots<T, 1, NR>(rows, m, 0, acc);
}

template <int T>
__device__ __forceinline__ void moe_glu_body(const moe_mv_args &a)
{
    const int e = blockIdx.x, n = blockIdx.y * MATVEC_WARPS + (threadIdx.x >> 5);
    if (n >= a.n) return;
    float gu[2][1];
    moe_row_dots<T, 2>(a, e, n, gu);
    if ((threadIdx.x & 31) == 0) {
        const float g = gu[0][0];
        a.yh[(size_t)e * a.ldy + n] = __float2half_rn(g / (1.0f + __expf(-g)) * gu[1][0]);
    }
}

template <int T>
__device__ __forceinline__ void moe_matvec_body(const moe_mv_args &a)
{
    const int e = blockIdx.x, n = blockIdx.y * MATVEC_WARPS + (threadIdx.x >> 5);
    if (n >= a.n) return;
    float acc[1][1];
    moe_row_dots<T, 1>(a, e, n, acc);
    if ((threadIdx.x & 31) == 0) a.y[(size_t)e * a.ldy + n] = acc[0][0];
}

// One pair per row of GPU_MOE_KERNELS (../gpu_kernel_names.h), under the row's names.
#define MOE_KERNELS(glu_name, matvec_name, TYPE)                                                 \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) glu_name(moe_mv_args a)      \
    {                                                                                            \
        moe_glu_body<T_##TYPE>(a);                                                               \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) matvec_name(moe_mv_args a)   \
    {                                                                                            \
        moe_matvec_body<T_##TYPE>(a);                                                            \
    }
GPU_MOE_KERNELS(MOE_KERNELS)

// One block: the n entries' expert ids (n <= GPU_MOE_SORT_MAX) grouped by expert, stable.
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

// x[t][d] (+)= sum_j weights[t*k + j] * y[row][d], row = pos ? pos[t*k + j] : t*k + j; one
// block per token.
extern "C" __global__ void moe_combine(float *x, const float *y, const float *weights, const int32_t *pos, int k,
                                       int n, int accumulate)
{
    const int t = blockIdx.x;
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            const int e = t * k + j, row = pos ? pos[e] : e;
            acc += weights[e] * y[(size_t)row * n + d];
        }
        float *dst = x + (size_t)t * n + d;
        *dst = accumulate ? *dst + acc : acc;
    }
}
