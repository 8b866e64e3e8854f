// attention.cuh - causal attention of packed query tokens over their slots' FP16 K/V caches.
//
// Every query token t (slot s, position p) attends keys 0..p of slot s; its own K/V (and those
// of earlier tokens of the same prompt) were stored by kv_store before this runs, so prefill
// and decode are the same computation.  Keys are split into n_split ranges (split-K, so a
// decode step with few tokens still fills the GPU on long contexts; the split length depends
// only on the query's own key count, see attn_chunk); each block computes an
// online-softmax partial (max, sum, unnormalised output) for up to ATT_GB query heads that
// share one KV head, and attn_combine merges the partials.
#pragma once
#include "common.cuh"
#include "../src/gpu/gpu_shared.h"

#define ATT_WARPS 4
#define ATT_GB 8    // most query heads per block (all of one KV group, or a divisor of it)
#define ATT_HDV 8   // head_dim up to 256: dims lane + 32*i per lane

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32) attn_partial(attn_args a)
{
    __shared__ float sm_m[ATT_WARPS][ATT_GB], sm_l[ATT_WARPS][ATT_GB];
    __shared__ float sm_o[ATT_WARPS][ATT_GB][ATT_HDV * 32];
    int t = blockIdx.x, h0 = blockIdx.y * a.gb, split = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h0 / (a.n_head / a.n_kv);
    int n_keys = a.pos[t] + 1;
    int chunk = attn_chunk(n_keys);
    int k_begin = split * chunk, k_end = min(n_keys, k_begin + chunk);
    size_t cache_base = ((((size_t)a.slot[t] * a.n_layer + a.layer) * a.n_kv) + kvh) * a.ctx * a.hd;
    const __half *kb = a.kc + cache_base, *vb = a.vc + cache_base;

    float q[ATT_GB][ATT_HDV], o[ATT_GB][ATT_HDV], m[ATT_GB], l[ATT_GB];
#pragma unroll
    for (int g = 0; g < ATT_GB; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_HDV; i++) {
            int d = lane + 32 * i;
            q[g][i] = (g < a.gb && d < a.hd) ? a.q[((size_t)t * a.n_head + h0 + g) * a.hd + d] * a.scale : 0.0f;
            o[g][i] = 0.0f;
        }
    }
    for (int j = k_begin + warp; j < k_end; j += ATT_WARPS) {
        float kv[ATT_HDV];
#pragma unroll
        for (int i = 0; i < ATT_HDV; i++) {
            int d = lane + 32 * i;
            kv[i] = d < a.hd ? __half2float(kb[(size_t)j * a.hd + d]) : 0.0f;
        }
        float p[ATT_GB];
#pragma unroll
        for (int g = 0; g < ATT_GB; g++) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < ATT_HDV; i++) s += q[g][i] * kv[i];
            s = g < a.gb ? warp_sum(s) : -INFINITY;
            float mn = fmaxf(m[g], s);
            float corr = __expf(m[g] - mn); // 0 on the first key (m = -inf)
            p[g] = g < a.gb ? __expf(s - mn) : 0.0f;
            l[g] = l[g] * corr + p[g];
            m[g] = mn;
#pragma unroll
            for (int i = 0; i < ATT_HDV; i++) o[g][i] *= corr;
        }
#pragma unroll
        for (int i = 0; i < ATT_HDV; i++) {
            int d = lane + 32 * i;
            kv[i] = d < a.hd ? __half2float(vb[(size_t)j * a.hd + d]) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < ATT_GB; g++)
#pragma unroll
            for (int i = 0; i < ATT_HDV; i++) o[g][i] += p[g] * kv[i];
    }
    // Merge the warps' states through shared memory, then write this split's partial.
#pragma unroll
    for (int g = 0; g < ATT_GB; g++) {
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < ATT_HDV; i++) sm_o[warp][g][lane + 32 * i] = o[g][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < a.gb * a.hd; idx += blockDim.x) {
        int g = idx / a.hd, d = idx - g * a.hd;
        float mx = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sm_m[w][g]);
        float lsum = 0.0f, osum = 0.0f;
        if (mx > -INFINITY) {
            for (int w = 0; w < ATT_WARPS; w++) {
                float f = __expf(sm_m[w][g] - mx);
                lsum += sm_l[w][g] * f;
                osum += sm_o[w][g][d] * f;
            }
        }
        size_t pi = ((size_t)t * a.n_head + h0 + g) * a.n_split + split;
        a.part_o[pi * a.hd + d] = osum;
        if (d == 0) {
            a.part_ml[2 * pi] = mx;
            a.part_ml[2 * pi + 1] = lsum;
        }
    }
}

// out[t][h][d] = sum_s e^(m_s - M) o_s[d] / sum_s e^(m_s - M) l_s, in FP16 (the input of the
// output projection); grid (tokens, heads).
extern "C" __global__ void attn_combine(const float *part_o, const float *part_ml, __half *out,
                                        int n_head, int n_split, int hd)
{
    size_t th = (size_t)blockIdx.x * n_head + blockIdx.y;
    const float *ml = part_ml + th * n_split * 2;
    float mx = -INFINITY;
    for (int s = 0; s < n_split; s++) mx = fmaxf(mx, ml[2 * s]);
    float lsum = 0.0f;
    for (int s = 0; s < n_split; s++)
        if (ml[2 * s] > -INFINITY) lsum += ml[2 * s + 1] * __expf(ml[2 * s] - mx);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++)
            if (ml[2 * s] > -INFINITY) acc += part_o[(th * n_split + s) * hd + d] * __expf(ml[2 * s] - mx);
        out[th * hd + d] = __float2half_rn(acc / lsum);
    }
}
