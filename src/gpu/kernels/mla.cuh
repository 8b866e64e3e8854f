// mla.cuh - the per-token work of multi-head latent attention (deepseek2) around the shared
// attention kernels: the absorbed query's RoPE part and the latent cache row's store
// (gpu_forward.c: attention_mla; cpu_engine.c: attention_mla is the reference).
#pragma once
#include "common.cuh"
#include "elementwise.cuh"
#include "../gpu_shared.h"

// Grid (tokens, n_head + 1), a multiple of 32 threads: blocks y < n_head turn head y's RoPE
// part of the query into the absorbed query's tail; block n_head norms the token's latent,
// turns its RoPE key and stores the row at its position through the sequence's block table
// (the packed prefill's scatter, as qkv_post's).
extern "C" __global__ void mla_post(mla_post_args a)
{
    pdl_enter();
    __shared__ float sh[32];
    const qkv_post_args &r = a.rope;
    const int t = blockIdx.x, h = blockIdx.y, pos = r.pos[t], rot = r.n_rot, row = a.lat + rot;
    if (h < a.n_head) {
        const float *src = a.q_raw + ((size_t)t * a.n_head + h) * (a.nope + rot) + a.nope;
        float *dst = a.q + ((size_t)t * a.n_head + h) * row + a.lat;
        for (int i = threadIdx.x; i < rot / 2; i += blockDim.x) {
            const int2 ix = rope_index(i, rot, r.neox);
            const float2 v = rope_pair(src[ix.x], src[ix.y], i, pos, r);
            dst[ix.x] = v.x;
            dst[ix.y] = v.y;
        }
        return;
    }
    const float *kv = a.kv + (size_t)t * row;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < a.lat; i += blockDim.x) ss += kv[i] * kv[i];
    const float scale = rsqrtf(block_sum(ss, sh) / (float)a.lat + r.eps);
    const int32_t block = r.tables[(size_t)r.seq[t] * r.table_width + pos / GPU_KV_BLOCK];
    gpu_half *out = a.kc + gpu_kv_offset(block, 1, 0, 1, 0, pos % GPU_KV_BLOCK, row);
    for (int i = threadIdx.x; i < a.lat; i += blockDim.x) out[i] = __float2half_rn(kv[i] * scale * a.kv_norm[i]);
    for (int i = threadIdx.x; i < rot / 2; i += blockDim.x) {
        const int2 ix = rope_index(i, rot, r.neox);
        const float2 v = rope_pair(kv[a.lat + ix.x], kv[a.lat + ix.y], i, pos, r);
        out[a.lat + ix.x] = __float2half_rn(v.x);
        out[a.lat + ix.y] = __float2half_rn(v.y);
    }
}
