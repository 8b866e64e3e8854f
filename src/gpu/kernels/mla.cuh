// mla.cuh - the per-token work of multi-head latent attention (deepseek2) around the shared
// attention kernels: the absorbed query's RoPE part and the latent cache row's store
// (gpu_forward.c: attention_mla; cpu_engine.c: attention_mla is the reference).
#pragma once
#include "common.cuh"
#include "elementwise.cuh"
#include "../gpu_shared.h"

// Head h's RoPE pair i of token t's query into the absorbed query's tail.
__device__ __forceinline__ void mla_rope_q(const mla_post_args &a, int t, int h, int i)
{
    const qkv_post_args &r = a.rope;
    const int rot = r.n_rot, row = a.lat + rot;
    const float *src = a.q_raw + ((size_t)t * a.n_head + h) * (a.nope + rot) + a.nope;
    float *dst = a.q + ((size_t)t * a.n_head + h) * row + a.lat;
    const int2 ix = rope_index(i, rot, r.neox);
    const float2 v = rope_pair(src[ix.x], src[ix.y], i, r.pos[t], r);
    dst[ix.x] = v.x;
    dst[ix.y] = v.y;
}

// Token t's latent cache row, by the whole block: rmsnorm(kv[:lat]) * kv_norm | rope(kv[lat:]),
// stored at the token's position through its block table (the packed prefill's scatter, as
// qkv_post's).
__device__ __forceinline__ void mla_store_row(const mla_post_args &a, int t, float *sh)
{
    const qkv_post_args &r = a.rope;
    const int pos = r.pos[t], rot = r.n_rot, row = a.lat + rot;
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

// Grid (tokens, n_head + 1), a multiple of 32 threads: blocks y < n_head turn head y's RoPE
// part of the query into the absorbed query's tail; block n_head norms the token's latent,
// turns its RoPE key and stores the row (mla_store_row).
extern "C" __global__ void mla_post(mla_post_args a)
{
    pdl_enter();
    __shared__ float sh[32];
    const int t = blockIdx.x, h = blockIdx.y;
    if (h < a.n_head) {
        for (int i = threadIdx.x; i < a.rope.n_rot / 2; i += blockDim.x) mla_rope_q(a, t, h, i);
        return;
    }
    mla_store_row(a, t, sh);
}

// Tokens whose activation loads mla_decode_q / mla_decode_value issue together: one token at a
// time, each token's loads waited behind the store before (the output and the activations may
// alias, for all the compiler knows), T dependent round trips (ncu, a batch-8 step: 9.4 and 8.6
// us for 4.3 MB each).  Whole groups of MLA_TOK, then the rest one at a time (so a batch-1 step
// runs one token as before: groups padded to MLA_TOK cost it 1.1 %).  Each token's sum is the
// same in either form.
#define MLA_TOK 4
static_assert(GPU_MLA_NOPE == 8 * 16, "8 lanes of 16 weights a row");
static_assert(GPU_MLA_ABS_THREADS / 8 == GPU_MLA_ABS_ROWS, "a block's lanes cover its rows");

// mla_decode_q's row o of head h for tokens t0 .. t0 + N - 1 (the lane's 16 weights w, its part
// of the row).
template <int N>
__device__ __forceinline__ void mla_abs_tokens(const mla_post_args &a, const float4 w[4], int h, int o, int part, int t0)
{
    const int qk = a.nope + a.rope.n_rot, row = a.lat + a.rope.n_rot;
    float4 v[N][4];
#pragma unroll
    for (int u = 0; u < N; u++) {
        const float4 *x = (const float4 *)(a.q_raw + ((size_t)(t0 + u) * a.n_head + h) * qk) + 4 * part;
#pragma unroll
        for (int k = 0; k < 4; k++) v[u][k] = x[k];
    }
#pragma unroll
    for (int u = 0; u < N; u++) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) s += w[k].x * v[u][k].x + w[k].y * v[u][k].y + w[k].z * v[u][k].z + w[k].w * v[u][k].w;
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        if (part == 0) a.q[((size_t)(t0 + u) * a.n_head + h) * row + o] = s;
    }
}

// A step of a few tokens (at most GPU_MLA_SMALL_T: decode), the absorbed query whole in one
// launch instead of the batched cuBLAS product and mla_post: blocks below n_abs = n_head x lat /
// GPU_MLA_ABS_ROWS each form q'_h[o] = wk_b_h[o] . q_nope_h (o < lat) for GPU_MLA_ABS_ROWS rows
// of one head over every token, 8 lanes a row, each lane's 16 of the row's GPU_MLA_NOPE weights
// (F32) in registers for all tokens (the rows read once per step); the T blocks after do
// mla_post's work of one token each (every head's RoPE part, then the cache row).  A row's sum
// is the same whatever the step's size.  GPU_MLA_ABS_THREADS threads.
extern "C" __global__ void __launch_bounds__(GPU_MLA_ABS_THREADS) mla_decode_q(mla_post_args a, const float *wk_b, int T)
{
    pdl_enter();
    __shared__ float sh[32];
    const int per_head = a.lat / GPU_MLA_ABS_ROWS, n_abs = a.n_head * per_head;
    if ((int)blockIdx.x >= n_abs) {
        const int t = blockIdx.x - n_abs, half = a.rope.n_rot / 2;
        for (int i = threadIdx.x; i < a.n_head * half; i += blockDim.x) mla_rope_q(a, t, i / half, i % half);
        mla_store_row(a, t, sh);
        return;
    }
    const int h = blockIdx.x / per_head, o = (blockIdx.x % per_head) * GPU_MLA_ABS_ROWS + threadIdx.x / 8;
    const int part = threadIdx.x & 7;
    const float4 *wr = (const float4 *)(wk_b + ((size_t)h * a.lat + o) * GPU_MLA_NOPE) + 4 * part;
    float4 w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] = wr[k];
    int t0 = 0;
    for (; t0 + MLA_TOK <= T; t0 += MLA_TOK) mla_abs_tokens<MLA_TOK>(a, w, h, o, part, t0);
    for (; t0 < T; t0++) mla_abs_tokens<1>(a, w, h, o, part, t0);
}

// The value up-projection of a step of a few tokens (at most GPU_MLA_SMALL_T), straight from
// the attention's FP16 output to Wo's FP16 input: out[t][h vw + o] = fp16(wv_b_h[o] .
// att[t][h][:lat]) (att rows of lat + n_rot), instead of widening att to FP32, a batched cuBLAS
// product and a narrowing copy.  A warp takes two rows of one head (their F32 weights in
// registers, 16 a lane, for every token; lat = GPU_MLA_FLASH_V), a block GPU_MLA_VAL_ROWS rows of
// the n_head x vw.  A row's sum is the same whatever the step's size.
static_assert(GPU_MLA_FLASH_V == 32 * 16, "a lane's 16 of a latent row");
static_assert(GPU_MLA_VAL_ROWS == GPU_MLA_ABS_THREADS / 32 * 2, "two rows a warp");

// mla_decode_value's rows r0, r0 + 1 (head h; the lane's 16 weights of each, w) for tokens
// t0 .. t0 + N - 1.
template <int N>
__device__ __forceinline__ void mla_value_tokens(const float4 w[2][4], const __half *att, __half *out, int n_head,
                                                 int vw, int att_row, int h, int r0, int t0)
{
    const int lane = threadIdx.x & 31;
    uint2 xv[N][4];
#pragma unroll
    for (int u = 0; u < N; u++) {
        const uint2 *x = (const uint2 *)(att + ((size_t)(t0 + u) * n_head + h) * att_row);
#pragma unroll
        for (int k = 0; k < 4; k++) xv[u][k] = x[lane + 32 * k];
    }
#pragma unroll
    for (int u = 0; u < N; u++) {
        float s[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 a = __half22float2(*(const __half2 *)&xv[u][k].x), b = __half22float2(*(const __half2 *)&xv[u][k].y);
#pragma unroll
            for (int i = 0; i < 2; i++) s[i] += w[i][k].x * a.x + w[i][k].y * a.y + w[i][k].z * b.x + w[i][k].w * b.y;
        }
#pragma unroll
        for (int i = 0; i < 2; i++) s[i] = warp_sum(s[i]);
        if (lane == 0) *(__half2 *)(out + (size_t)(t0 + u) * n_head * vw + r0) = __floats2half2_rn(s[0], s[1]);
    }
}

extern "C" __global__ void __launch_bounds__(GPU_MLA_ABS_THREADS)
    mla_decode_value(const float *wv_b, const __half *att, __half *out, int n_head, int vw, int att_row, int T)
{
    pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * GPU_MLA_VAL_ROWS + 2 * warp, h = r0 / vw; // rows r0, r0 + 1 (vw even)
    float4 w[2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) w[i][k] = ((const float4 *)(wv_b + (size_t)(r0 + i) * GPU_MLA_FLASH_V))[lane + 32 * k];
    int t0 = 0;
    for (; t0 + MLA_TOK <= T; t0 += MLA_TOK) mla_value_tokens<MLA_TOK>(w, att, out, n_head, vw, att_row, h, r0, t0);
    for (; t0 < T; t0++) mla_value_tokens<1>(w, att, out, n_head, vw, att_row, h, r0, t0);
}
