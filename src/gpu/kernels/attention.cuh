// attention.cuh - causal attention of packed query tokens over their sequences' FP16 K/V
// blocks, on the CUDA cores: decode tokens (spans of one token), and every token of a shape
// the tensor-core kernel (flash_attn.cuh, prompt spans) does not cover.
//
// Every query token t (sequence s, position p) attends keys 0..p of s (a sliding layer:
// gpu_attn_first_key(p, window)..p, walked from gpu_attn_key0 and the keys before the first
// masked), read through s's block table; its own K/V (and those of earlier tokens of the same prompt) were stored by qkv_post
// before this runs.  The grid runs over a token list (or all tokens: the decode graphs).
// Keys are split into n_split ranges (split-K, so a decode step with few tokens still fills
// the GPU on long contexts; the split length depends only on the query's own key count, see
// attn_chunk); each block computes an online-softmax partial (max, sum, unnormalised output) for up to ATT_GB query heads that
// share one KV head, and attn_combine merges the partials.
#pragma once
#include "common.cuh"
#include "../gpu_shared.h"

#define ATT_WARPS 4
#define ATT_GB 8    // most query heads per block (all of one KV group, or a divisor of it)
#define ATT_PAIRS 4 // head_dim up to 256: dimension pairs lane + 32*i per lane

// PAIRS is how many dimension pairs a lane owns: ATT_PAIRS in the generic kernel (any head_dim
// up to 256), or exactly hd/64 in the kernels for head_dim 64, 128 and 512.  Fewer registers per V
// row then let more rows be in flight (VU); the arithmetic and its order are the same in every
// variant, so a token's attention does not depend on which one ran.  GB: the most query heads
// a block takes (ATT_GB; 4 at head_dim 512, Gemma 4's global layers, so the block's queries
// and partial outputs fit the static shared memory).

// Each warp takes tiles of 32 keys, each inside one KV block (GPU_KV_BLOCK == 32 and the
// split starts are multiples of it): lane l scores key (tile + l) against the block's query
// heads with 16-byte loads of its K row, the tile updates the online softmax with one warp
// reduction per head, then the warp accumulates P.V with each lane owning dimension pairs
// (coalesced V rows).  So a key costs no serial reduction, and loads of a tile overlap.
// HD: the head dimension when fixed at compile time (64, 128), 0 in the generic kernel.
template <int PAIRS, int VU, int HD, int GB = ATT_GB>
__device__ __forceinline__ void attn_partial_body(const attn_args &a)
{
    constexpr int QW = PAIRS > ATT_PAIRS ? 64 * PAIRS : 256; // a query row's floats
    __shared__ float q_s[GB][QW];
    __shared__ float sm_m[ATT_WARPS][GB], sm_l[ATT_WARPS][GB];
    __shared__ float2 sm_o[ATT_WARPS][GB][(PAIRS > ATT_PAIRS ? PAIRS : ATT_PAIRS) * 32];
    const int t = a.tok_list ? a.tok_list[blockIdx.x] : blockIdx.x, h0 = blockIdx.y * a.gb, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = HD ? HD : a.hd, gb = a.gb;
    const int kvh = h0 / (a.n_head / a.n_kv);
    const int n_keys = a.pos[t] + 1, first = gpu_attn_first_key(a.pos[t], a.window);
    const int key0 = gpu_attn_key0(a.pos[t], a.window), chunk = attn_chunk(n_keys - key0);
    const int k_begin = key0 + split * chunk, k_end = min(n_keys, k_begin + chunk);
    const int32_t *table = a.tables + (size_t)a.seq[t] * a.table_width;

    // The block's query heads are contiguous: gb * hd floats, loaded 4 at a time (hd % 4 == 0).
    const float4 *qv = (const float4 *)(a.q + ((size_t)t * a.n_head + h0) * hd);
    for (int i = threadIdx.x; i < gb * hd / 4; i += blockDim.x) {
        float4 v = qv[i];
        float *d = &q_s[4 * i / hd][4 * i % hd];
        d[0] = v.x * a.scale, d[1] = v.y * a.scale, d[2] = v.z * a.scale, d[3] = v.w * a.scale;
    }
    __syncthreads();

    float m[GB], l[GB];
    float2 o[GB][PAIRS];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < PAIRS; i++) o[g][i] = make_float2(0.0f, 0.0f);
    }
    for (int ts = k_begin + 32 * warp; ts < k_end; ts += 32 * ATT_WARPS) {
        // Key j is this lane's; the tile's first key is the only one that can precede first, and
        // the tile holds first, so no tile is wholly masked (m stays finite after the first).
        const int j = ts + lane, n_valid = min(32, k_end - ts);
        const bool seen = j < k_end && j >= first;
        // The tile's block: row r of it is key ts + r.
        const size_t tile = gpu_kv_offset(table[ts / GPU_KV_BLOCK], a.n_layer, a.layer, a.n_kv, kvh, 0, hd);
        const __half *kb = a.kc + tile, *vb = a.vc + tile;
        float s[GB];
#pragma unroll
        for (int g = 0; g < GB; g++) s[g] = 0.0f;
        if (seen) {
            const uint4 *kr = (const uint4 *)(kb + (size_t)lane * hd);
#pragma unroll 16 // a whole 128-dim K row in flight per lane
            for (int d8 = 0; d8 < hd / 8; d8++) {
                uint4 kv = kr[d8];
                const __half2 *k2 = (const __half2 *)&kv;
                float kf[8];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 f = __half22float2(k2[e]);
                    kf[2 * e] = f.x;
                    kf[2 * e + 1] = f.y;
                }
#pragma unroll
                for (int g = 0; g < GB; g++) {
                    if (g < gb) {
                        const float *qg = &q_s[g][8 * d8];
#pragma unroll
                        for (int e = 0; e < 8; e++) s[g] += qg[e] * kf[e];
                    }
                }
            }
        }
        float p[GB];
#pragma unroll
        for (int g = 0; g < GB; g++) {
            if (g >= gb) break;
            float sv = seen ? s[g] : -INFINITY;
            float mn = fmaxf(m[g], warp_max(sv));
            float corr = __expf(m[g] - mn); // 0 on the first tile (m = -inf)
            p[g] = seen ? __expf(sv - mn) : 0.0f;
            l[g] = l[g] * corr + warp_sum(p[g]);
            m[g] = mn;
#pragma unroll
            for (int i = 0; i < PAIRS; i++) {
                o[g][i].x *= corr;
                o[g][i].y *= corr;
            }
        }
#pragma unroll VU // V rows in flight: the loop is a chain of load latencies otherwise
        for (int kk = 0; kk < n_valid; kk++) {
            const __half2 *vr = (const __half2 *)(vb + (size_t)kk * hd);
            float2 v[PAIRS];
#pragma unroll
            for (int i = 0; i < PAIRS; i++) {
                int pi = lane + 32 * i;
                v[i] = pi < hd / 2 ? __half22float2(vr[pi]) : make_float2(0.0f, 0.0f);
            }
#pragma unroll
            for (int g = 0; g < GB; g++) {
                if (g >= gb) break;
                float pk = __shfl_sync(0xffffffffu, p[g], kk);
#pragma unroll
                for (int i = 0; i < PAIRS; i++) {
                    o[g][i].x += pk * v[i].x;
                    o[g][i].y += pk * v[i].y;
                }
            }
        }
    }
    // Merge the warps' states through shared memory, then write this split's partial.
#pragma unroll
    for (int g = 0; g < GB; g++) {
        if (g >= gb) break;
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < PAIRS; i++)
            if (lane + 32 * i < hd / 2) sm_o[warp][g][lane + 32 * i] = o[g][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < gb * (hd / 2); idx += blockDim.x) {
        int g = idx / (hd / 2), pi = idx - g * (hd / 2);
        float mx = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sm_m[w][g]);
        float lsum = 0.0f;
        float2 osum = make_float2(0.0f, 0.0f);
        if (mx > -INFINITY) {
            for (int w = 0; w < ATT_WARPS; w++) {
                float f = __expf(sm_m[w][g] - mx);
                lsum += sm_l[w][g] * f;
                osum.x += sm_o[w][g][pi].x * f;
                osum.y += sm_o[w][g][pi].y * f;
            }
        }
        size_t part = ((size_t)t * a.n_head + h0 + g) * a.n_split + split;
        ((float2 *)(a.part_o + part * hd))[pi] = osum;
        if (pi == 0) {
            a.part_ml[2 * part] = mx;
            a.part_ml[2 * part + 1] = lsum;
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) attn_partial(attn_args a)
{
    pdl_enter();
    attn_partial_body<ATT_PAIRS, 8, 0>(a);
}
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) attn_partial_hd64(attn_args a)
{
    pdl_enter();
    attn_partial_body<1, 16, 64>(a);
}
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) attn_partial_hd128(attn_args a)
{
    pdl_enter();
    attn_partial_body<2, 16, 128>(a);
}
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) attn_partial_hd512(attn_args a)
{
    pdl_enter();
    attn_partial_body<8, 8, 512, GPU_ATT_GB_HD512>(a);
}
// Head dims over 256 up to GPU_MLA_MAX_ROW (a multiple of 8), 512 aside: the latent rows of
// multi-head latent attention (DeepSeek's 576 = 512 + 64 RoPE), whose keys are their values
// (kc == vc; the RoPE part's sums are not used).  Four heads per block, as at 512.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) attn_partial_wide(attn_args a)
{
    pdl_enter();
    attn_partial_body<GPU_MLA_MAX_ROW / 64, 8, 0, GPU_ATT_GB_HD512>(a);
}

// out[t][h][d] = sum_s e^(m_s - M) o_s[d] / (sum_s e^(m_s - M) l_s + e^(sink_h - M)), in FP16 (the input of the
// output projection); grid (tokens, heads), token t = tok_list[grid x] (NULL: grid x), as in
// attn_partial.
extern "C" __global__ void attn_combine(const float *part_o, const float *part_ml, __half *out,
                                        int n_head, int n_split, int hd, const int32_t *tok_list,
                                        const float *sinks)
{
    pdl_enter();
    const int t = tok_list ? tok_list[blockIdx.x] : blockIdx.x;
    size_t th = (size_t)t * n_head + blockIdx.y;
    const float *ml = part_ml + th * n_split * 2;
    float mx = -INFINITY;
    for (int s = 0; s < n_split; s++) mx = fmaxf(mx, ml[2 * s]);
    float lsum = 0.0f;
    for (int s = 0; s < n_split; s++)
        if (ml[2 * s] > -INFINITY) lsum += ml[2 * s + 1] * __expf(ml[2 * s] - mx);
    lsum += attn_sink_term(sinks, blockIdx.y, mx, false);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++)
            if (ml[2 * s] > -INFINITY) acc += part_o[(th * n_split + s) * hd + d] * __expf(ml[2 * s] - mx);
        out[th * hd + d] = __float2half_rn(acc / lsum);
    }
}
