// attn_decode.cuh - decode attention (one query token over its sequence's FP16 K/V blocks) on
// the tensor cores, for head_dim 64, 128 and 256 and up to 16 query heads per KV head.
//
// Decode attention is a pass over the K/V cache: the kernel has to keep enough bytes in flight
// to run at memory bandwidth, and do little per byte.  A block takes one token, one KV head
// and one key split (attn_split_chunk: the token's key count and the engine's fixed max_split;
// at head_dim 256 also the grid's batch_split, gpu_attn_dec_token_split); its W warps
// stream the split's KV blocks round-robin (warp w takes
// blocks w, w + W, ...), each through its own S-deep ring of [32 keys][hd] K and V tiles in
// shared memory filled by cp.async (no registers held by loads in flight, no block barrier in
// the loop).  The M dimension of every mma is the KV group's query heads (rows g < group of 16,
// the rest zero), so each K/V byte is read once for the whole group (GQA), and per tile a warp
// forms S = Q K^T and O += P V with mma.m16n8k16 (Q and P as FP16 hi + lo pairs: FP32-grade
// products) and keeps its rows' online softmax in registers, in base 2, by the per-tile steps
// of flash_attn.cuh (fa_qk_tile_q, fa_softmax_tile, fa_pv_tile).  The partials' maxima are in
// base 2 too.  At the end the warps' states merge through shared memory in warp order, and the
// block writes its split's partial (max, sum, unnormalised output) for attn_decode_combine, or,
// when the token has a single split (short contexts), the normalised FP16 output itself.
//
// Head_dim 256 (WIDE: Gemma 3, the Qwen3.5 gated-attention layers) keeps the query's fragments
// in shared memory (a lane's O alone is 128 registers), and merges its splits in the kernel:
// the last split block of a (token, KV head) to finish -- an atomic counter per pair, reset by
// that block -- merges the partials of all splits in split order (ad_merge_splits): one launch.
// Up to head_dim 128 that fused merge measured slower than the combine launch on the H100
// (docs/benchmarks.md, 2026-11-26), so those shapes keep it.  The partials are indexed by the grid's token index (not the packed token),
// so they take room for the decode tokens of a step only: [grid x][n_head][n_split] (max, sum)
// and [..][hd] outputs.
//
// Invariance: a token's result depends on its own query, its key count, max_split and (WIDE)
// batch_split only (batch_split = max_split under --deterministic: then on the token alone); the
// merge orders (warps, then splits) are fixed; the one atomic only elects the merging block.
//
// Tiles are stored unpadded, 16-byte chunk c of row r at chunk c ^ (r & 7): the eight row
// addresses of every ldmatrix then hit distinct banks.
#pragma once
#include "common.cuh"
#include "mma.cuh"
#include "flash_attn.cuh" // split_half2, load_q_pair
#include "../gpu_shared.h"

#define AD_KEYS GPU_KV_BLOCK

template <int HD> struct ad_tile {
    __half k[AD_KEYS * HD], v[AD_KEYS * HD];
};

template <int HD> __device__ __forceinline__ int ad_off(int row, int chunk)
{
    return row * HD + ((chunk ^ (row & 7)) << 3);
}

// The warp's copy of one KV block (n_valid keys of it are written: the rest become zeros, so
// stale or uninitialised memory, possibly NaN, never meets P = 0).
template <int HD>
__device__ __forceinline__ void ad_load(ad_tile<HD> *t, const __half *kb, const __half *vb, int n_valid, int lane)
{
    constexpr int CH = HD / 8;
#pragma unroll
    for (int it = 0; it < AD_KEYS * CH / 32; it++) {
        const int i = lane + 32 * it, row = i / CH, ch = i % CH, o = ad_off<HD>(row, ch);
        const int bytes = row < n_valid ? 16 : 0;
        cp_async16(&t->k[o], kb + row * HD + ch * 8, bytes);
        cp_async16(&t->v[o], vb + row * HD + ch * 8, bytes);
    }
}

// Dynamic shared memory of a variant: the warps' tile rings (the merges reuse them), and at
// head_dim 256 the query's fragments.
#define AD_Q_SMEM(HD) GPU_ATT_DEC_Q_SMEM(HD)
#define AD_SMEM(HD, W, S) ((unsigned)((W) * (S) * sizeof(ad_tile<HD>) + AD_Q_SMEM(HD)))

// A token's most splits (gpu_shared.h): batch_split 0 (a caller that sets none) means max_split.
__device__ __forceinline__ int ad_token_split(const attn_args &a, int span)
{
    return gpu_attn_dec_token_split(span, a.max_split, a.batch_split > 0 ? a.batch_split : a.max_split);
}

// The last split block of (grid token x, KV head kvh) to finish: out for the group's heads
// (h0 .. h0 + group - 1) from all ns splits' partials, in split order (the same sums whichever
// block is last).  HDO: the output rows' stride (attn_decode_mla's rows of 576 whose first 512
// are its output; else HD).  The
// partials were written by other blocks of this launch, so they are read from L2 (__ldcg): a warp
// a head for the weights, then a thread 4 dimensions of one head with 16 splits' loads in flight
// (8 at head_dim 256).
template <int HD, int W, int HDO = HD>
__device__ __forceinline__ void ad_merge_splits(const attn_args &a, int t, int h0, int group, int ns, float *smem)
{
    static_assert(GPU_ATT_DEC_SPLIT <= 64, "a warp takes a head's splits two a lane");
    float *sm_w = smem;                      // [16][ns]: each split's weight 2^(m_s - M)
    float *sm_den = smem + 16 * GPU_ATT_DEC_SPLIT; // [16]: the heads' denominators
    const size_t th0 = (size_t)blockIdx.x * a.n_head + h0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < group; r += W) { // a warp a head: splits lane and lane + 32
        const float2 *ml = (const float2 *)a.part_ml + (th0 + r) * a.n_split;
        const float2 none = make_float2(-INFINITY, 0.0f); // (every real split has a key: m finite)
        const float2 v0 = lane < ns ? __ldcg(ml + lane) : none, v1 = lane + 32 < ns ? __ldcg(ml + lane + 32) : none;
        float mx = fmaxf(v0.x, v1.x);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float w0 = exp2f(v0.x - mx), w1 = exp2f(v1.x - mx); // 0 for the missing
        if (lane < ns) sm_w[r * ns + lane] = w0;
        if (lane + 32 < ns) sm_w[r * ns + lane + 32] = w1;
        float lsum = v0.y * w0 + v1.y * w1; // summed in a fixed tree: the same bits every run
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
        if (lane == 0) sm_den[r] = lsum + attn_sink_term(a.sinks, h0 + r, mx, true);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * (HD / 4); idx += W * 32) {
        const int r = idx / (HD / 4), d = 4 * (idx % (HD / 4));
        const float4 *po = (const float4 *)(a.part_o + (th0 + r) * a.n_split * HD + d);
        const float *w = sm_w + r * ns;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        constexpr int IN_FLIGHT = HD >= 256 ? 8 : 16; // 16 float4 at 256 spill (beside O's registers)
#pragma unroll IN_FLIGHT
        for (int sp = 0; sp < ns; sp++) {
            const float4 v = __ldcg(po + (size_t)sp * (HD / 4));
            acc.x += v.x * w[sp], acc.y += v.y * w[sp], acc.z += v.z * w[sp], acc.w += v.w * w[sp];
        }
        const float den = sm_den[r];
        __half2 *dst = (__half2 *)(a.out + ((size_t)t * a.n_head + h0 + r) * HDO + d);
        dst[0] = __floats2half2_rn(acc.x / den, acc.y / den);
        dst[1] = __floats2half2_rn(acc.z / den, acc.w / den);
    }
}

// Rows g and g + 8 of a warp's 16: query heads kvh * group + row (NULL past the group).
template <int HD>
__device__ __forceinline__ void ad_query_rows(const attn_args &a, int t, int kvh, int group, int g, const float *qrow[2])
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        qrow[i] = r < group ? a.q + ((size_t)t * a.n_head + kvh * group + r) * HD : nullptr;
    }
}

// Those rows' FP16 hi + lo A fragments of dims 16 ks .. 16 ks + 15 (as flash_attn.cuh).
__device__ __forceinline__ void ad_query_frag(const float *const qrow[2], int ks, int c, float scale2, uint32_t hi[4],
                                              uint32_t lo[4])
{
    const int d = ks * 16 + 2 * c;
    load_q_pair(qrow[0], d, scale2, &hi[0], &lo[0]);
    load_q_pair(qrow[1], d, scale2, &hi[1], &lo[1]);
    load_q_pair(qrow[0], d + 8, scale2, &hi[2], &lo[2]);
    load_q_pair(qrow[1], d + 8, scale2, &hi[3], &lo[3]);
}

// WIDE: warp 0 forms the group's query fragments into shared memory, one copy for the block
// (every warp has the same token); a barrier after.
template <int HD>
__device__ __forceinline__ void ad_query_to_smem(const attn_args &a, int t, int kvh, int group, float scale2,
                                                 uint4 (*q_s)[2][32])
{
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        const float *qrow[2];
        ad_query_rows<HD>(a, t, kvh, group, lane >> 2, qrow);
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            uint32_t hi[4], lo[4];
            ad_query_frag(qrow, ks, lane & 3, scale2, hi, lo);
            q_s[ks][0][lane] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            q_s[ks][1][lane] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
    }
    __syncthreads();
}

// WIDE (head_dim 256): the query's fragments in shared memory, the splits merged in the kernel
// (when a.counts), and a token's splits from gpu_attn_dec_token_split; otherwise the statements
// main had (any change there measured slower: docs/benchmarks.md).
// FULL: the ring's S tiles all in flight before the query loads, each later tile issued into
// the slot its predecessor frees (after that tile's products); otherwise S - 1 ahead, the next
// issued before each tile's products (main's loop).  WIDE is always FULL.
// The grid-dependence wait (pdl_wait) is here, not at the kernel's entry: with a.old_kv the
// first tiles of keys before the token's own (K/V of earlier steps, and the inputs: positions,
// tables) are issued before it, so their loads run under the end of the grid ahead (the QKV
// product, which writes the query and the token's own key: those are read after the wait).
template <int HD, int W, int S, bool FULL>
__device__ __forceinline__ void attn_decode_body(const attn_args &a)
{
    constexpr int KSTEPS = HD / 16, DTILES = HD / 8;
    constexpr bool WIDE = AD_Q_SMEM(HD) > 0;
    static_assert(FULL || !WIDE, "head_dim 256 keeps its whole ring in flight");
    typedef uint4 q_frags[KSTEPS][2][32]; // [ks][hi, lo][lane]
    static_assert(!WIDE || sizeof(q_frags) == AD_Q_SMEM(HD), "the host sizes the query's room alike");
    static_assert(W * S * sizeof(ad_tile<HD>) >= W * 16 * HD * sizeof(float), "the merge fits in the rings");
    static_assert(W * S * sizeof(ad_tile<HD>) >= (16 * GPU_ATT_DEC_SPLIT + 16) * sizeof(float),
                  "the split merge's weights fit in the rings");
    extern __shared__ __align__(16) unsigned char ad_smem[];
    __shared__ float sm_m[W][16], sm_l[W][16];
    ad_tile<HD> *ring = (ad_tile<HD> *)ad_smem + (threadIdx.x >> 5) * S;

    const int t = a.tok_list ? a.tok_list[blockIdx.x] : blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int group = a.n_head / a.n_kv;
    // Keys key0..pos (a sliding layer: from its window's block; those before first masked).
    const int n_keys = a.pos[t] + 1, first = gpu_attn_first_key(a.pos[t], a.window);
    const int key0 = gpu_attn_key0(a.pos[t], a.window), span = n_keys - key0;
    const int chunk = attn_split_chunk(span, WIDE ? ad_token_split(a, span) : a.max_split);
    const int k_begin = key0 + split * chunk, k_end = min(n_keys, k_begin + chunk);
    const bool live = k_begin < n_keys; // else a split past the token's keys: the combine reads none of it
    const int32_t *table = a.tables + (size_t)a.seq[t] * a.table_width;
    const int kt0 = k_begin / AD_KEYS, n_kt = live ? (k_end - k_begin + AD_KEYS - 1) / AD_KEYS : 0;
    const int n_mine = warp < n_kt ? (n_kt - warp + W - 1) / W : 0;

    auto issue = [&](int i) { // the warp's i-th KV block into ring slot i % S
        const int kt = kt0 + warp + W * i;
        const size_t base = gpu_kv_offset(table[kt], a.n_layer, a.layer, a.n_kv, kvh, 0, HD);
        ad_load<HD>(&ring[i % S], a.kc + base, a.vc + base, min(AD_KEYS, k_end - kt * AD_KEYS), lane);
    };
    // The ring's first AHEAD tiles, one commit group each in tile order: those wholly before
    // the token's own key's tile (a prefix: a warp's tiles ascend) before the wait when
    // a.old_kv allows, the rest after it.
    constexpr int AHEAD = FULL ? S : S - 1;
    const int kt_own = (n_keys - 1) / AD_KEYS;
    const auto early = [&](int i) { return a.old_kv && i < n_mine && kt0 + warp + W * i < kt_own; };
#pragma unroll
    for (int i = 0; i < AHEAD; i++)
        if (early(i)) {
            issue(i);
            cp_async_commit();
        }
    pdl_wait();
    pdl_trigger();
    if (!live) return;
#pragma unroll
    for (int i = 0; i < AHEAD; i++)
        if (!early(i)) {
            if (i < n_mine) issue(i);
            cp_async_commit();
        }

    // Rows g and g + 8 of the warp's 16: query heads kvh * group + row (zeros past the group).
    uint32_t qf[WIDE ? 1 : KSTEPS][4], ql[WIDE ? 1 : KSTEPS][4];
    const float scale2 = a.scale * 1.4426950408889634f; // base-2 scores: log2(e) in the scale
    if constexpr (WIDE)
        ad_query_to_smem<HD>(a, t, kvh, group, scale2, (uint4(*)[2][32])(ad_smem + W * S * sizeof(ad_tile<HD>)));
    else {
        const float *qrow[2];
        ad_query_rows<HD>(a, t, kvh, group, g, qrow);
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) ad_query_frag(qrow, ks, c, scale2, qf[ks], ql[ks]);
    }
    float o[DTILES][4];
#pragma unroll
    for (int j = 0; j < DTILES; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int i = 0; i < n_mine; i++) {
        if constexpr (!FULL) {
            if (i + S - 1 < n_mine) issue(i + S - 1);
            cp_async_commit();
        }
        cp_async_wait<S - 1>();
        __syncwarp(); // the other lanes' copies of block i are visible
        const ad_tile<HD> *tl = &ring[i % S];
        const int tile0 = (kt0 + warp + W * i) * AD_KEYS;

        const auto k_at = [&](int key, int ch) { return &tl->k[ad_off<HD>(key, ch)]; };
        const auto v_at = [&](int key, int ch) { return &tl->v[ad_off<HD>(key, ch)]; };
        float s[4][4];
        if constexpr (WIDE) {
            const q_frags &q_s = *(const q_frags *)(ad_smem + W * S * sizeof(ad_tile<HD>));
            const auto q_at = [&](int ks, uint32_t *hi, uint32_t *lo) {
                const uint4 h = q_s[ks][0][lane], l = q_s[ks][1][lane];
                hi[0] = h.x, hi[1] = h.y, hi[2] = h.z, hi[3] = h.w;
                lo[0] = l.x, lo[1] = l.y, lo[2] = l.z, lo[3] = l.w;
            };
            fa_qk_tile_q<KSTEPS>(s, q_at, k_at);
        } else {
            fa_qk_tile<KSTEPS>(s, qf, ql, k_at);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) // keys past the token's last, or before its window's first
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = tile0 + j * 8 + 2 * c + (e & 1);
                if (key >= k_end || key < first) s[j][e] = -INFINITY;
            }
        fa_softmax_tile<DTILES>(s, m, l, o);
        fa_pv_tile<DTILES>(s, o, v_at);
        __syncwarp(); // every lane is done with slot i % S before it is refilled
        if constexpr (FULL) {
            if (i + S < n_mine) issue(i + S);
            cp_async_commit();
        }
    }
    cp_async_wait<0>();
    __syncthreads(); // every warp is done with the rings: the merge reuses them

    // Merge the warps' states (warp order), rows < group only.
    float(*sm_o)[16][HD] = (float(*)[16][HD])ad_smem;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = g + 8 * r;
        if (c == 0) {
            sm_m[warp][row] = m[r];
            sm_l[warp][row] = l[r];
        }
#pragma unroll
        for (int j = 0; j < DTILES; j++)
            *(float2 *)&sm_o[warp][row][j * 8 + 2 * c] = make_float2(o[j][2 * r], o[j][2 * r + 1]);
    }
    __syncthreads();
    const bool single = chunk >= span;
    for (int idx = threadIdx.x; idx < group * (HD / 2); idx += W * 32) {
        const int row = idx / (HD / 2), d = 2 * (idx % (HD / 2));
        float mw = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++) mw = fmaxf(mw, sm_m[w][row]);
        float lsum = 0.0f;
        float2 osum = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < W; w++) { // a warp with no block: m = -inf, l = 0, o = 0
            const float f = exp2f(sm_m[w][row] - mw);
            lsum += sm_l[w][row] * f;
            osum.x += sm_o[w][row][d] * f;
            osum.y += sm_o[w][row][d + 1] * f;
        }
        const int h = kvh * group + row;
        if (single) {
            const float den = lsum + attn_sink_term(a.sinks, h, mw, true);
            ((__half2 *)(a.out + ((size_t)t * a.n_head + h) * HD))[d / 2] =
                __floats2half2_rn(osum.x / den, osum.y / den);
            continue;
        }
        const size_t part = ((size_t)blockIdx.x * a.n_head + h) * a.n_split + split;
        *(float2 *)(a.part_o + part * HD + d) = osum;
        if (d == 0) {
            a.part_ml[2 * part] = mw;
            a.part_ml[2 * part + 1] = lsum;
        }
    }
    if constexpr (WIDE) {
        if (single || !a.counts) return;
        // The split merge, fused: each block publishes its partial (threadfence: visible in L2
        // before the counter moves), and the block that brings the count to ns merges them all
        // (the merge order is the splits' whatever block comes last).  The flag rides in
        // sm_m, whose values every thread has read by the barrier before.
        __threadfence();
        __syncthreads();
        const int ns = (span + chunk - 1) / chunk;
        unsigned *last = (unsigned *)&sm_m[0][0];
        if (threadIdx.x == 0) {
            unsigned *cnt = a.counts + (size_t)blockIdx.x * a.n_kv + kvh;
            *last = atomicAdd(cnt, 1u) == (unsigned)ns - 1;
            if (*last) *cnt = 0u; // every split has counted: the next launch starts from 0
        }
        __syncthreads();
        if (!*last) return;
        __threadfence(); // the other blocks' partials, read after their counts
        ad_merge_splits<HD, W>(a, t, kvh * group, group, ns, (float *)ad_smem);
    }
}

// The engine's variants (gpu_shared.h): 4 warps, 2 tiles deep each (128 KiB of shared memory)
// up to head_dim 128, one tile ahead (the whole ring ahead, FULL, measured no faster with
// a.old_kv and up to 3 us a layer slower without: docs/benchmarks.md); at 256 4 warps of one tile
// each (128 KiB + 16 KiB of query fragments).  (The body waits for the grid ahead: pdl_wait.)
#define AD_W GPU_ATT_DEC_WARPS
#define AD_S GPU_ATT_DEC_STAGES
static_assert(AD_SMEM(128, AD_W, AD_S) == gpu_attn_decode_smem(128), "the host sizes the rings alike");
static_assert(AD_SMEM(256, gpu_attn_dec_warps(256), gpu_attn_dec_stages(256)) == gpu_attn_decode_smem(256),
              "the host sizes the rings alike");
extern "C" __global__ void __launch_bounds__(AD_W * 32) attn_decode_hd64(attn_args a)
{
    attn_decode_body<64, AD_W, AD_S, false>(a);
}
extern "C" __global__ void __launch_bounds__(AD_W * 32) attn_decode_hd128(attn_args a)
{
    attn_decode_body<128, AD_W, AD_S, false>(a);
}
extern "C" __global__ void __launch_bounds__(gpu_attn_dec_warps(256) * 32) attn_decode_hd256(attn_args a)
{
    attn_decode_body<256, gpu_attn_dec_warps(256), gpu_attn_dec_stages(256), true>(a);
}

// Other shapes for gpu_attnbench's sweep (looked up by name there only); _f: the whole ring ahead.
#define AD_VARIANT(HD, W, S, FULL, TAIL)                                                                        \
    extern "C" __global__ void __launch_bounds__(W * 32) attn_decode_hd##HD##_w##W##s##S##TAIL(attn_args a) \
    {                                                                                                           \
        attn_decode_body<HD, W, S, FULL>(a);                                                                    \
    }
AD_VARIANT(128, 4, 2, true, _f)
AD_VARIANT(128, 4, 3, true, )
AD_VARIANT(128, 8, 1, true, )
AD_VARIANT(256, 2, 2, true, )
AD_VARIANT(256, 3, 2, true, )

// out[t][h] from the token's splits (gpu_attn_splits_for(its span, max_split) of them); a token
// with one split was written by attn_decode itself.  Grid (tokens, n_head) as attn_combine,
// AD_COMBINE_SG * hd threads: the splits' (max, sum) come into shared memory in one round trip,
// each split's weight 2^(m_s - M) is computed once, and thread (sg, d) sums dimension d of the
// splits s = sg mod AD_COMBINE_SG with its loads in flight together, the AD_COMBINE_SG sums then
// added in order (a fixed order: the result does not depend on the run).  A loop over the
// splits in one thread is a chain of load latencies (~0.3 us a split).
#define AD_COMBINE_SG GPU_ATT_DEC_COMBINE_SG
#define AD_COMBINE_MAX 128 // most splits (GPU_ATT_DEC_SPLIT, gpu_attnbench's sweep)
static_assert(GPU_ATT_DEC_SPLIT <= AD_COMBINE_MAX, "the combine holds every split's weight");
extern "C" __global__ void __launch_bounds__(AD_COMBINE_SG * 256) attn_decode_combine(attn_args a)
{
    pdl_enter();
    __shared__ float sm_m[AD_COMBINE_MAX], sm_w[AD_COMBINE_MAX], sm_l[AD_COMBINE_MAX];
    __shared__ float part[AD_COMBINE_SG][256];
    const int t = a.tok_list ? a.tok_list[blockIdx.x] : blockIdx.x;
    const int hd = a.hd, span = gpu_attn_span(a.pos[t], a.window);
    const int ns = gpu_attn_splits_for(span, hd >= 256 ? ad_token_split(a, span) : a.max_split);
    if (ns == 1) return;
    const int d = threadIdx.x % hd, sg = threadIdx.x / hd;
    const size_t th = (size_t)blockIdx.x * a.n_head + blockIdx.y;
    const float *ml = a.part_ml + th * a.n_split * 2, *po = a.part_o + th * a.n_split * hd;
    for (int s = threadIdx.x; s < ns; s += blockDim.x) {
        sm_m[s] = ml[2 * s];
        sm_l[s] = ml[2 * s + 1];
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int s = 0; s < ns; s++) mx = fmaxf(mx, sm_m[s]);
    for (int s = threadIdx.x; s < ns; s += blockDim.x) sm_w[s] = exp2f(sm_m[s] - mx);
    __syncthreads();
    float acc = 0.0f;
#pragma unroll 8
    for (int s = sg; s < ns; s += AD_COMBINE_SG) acc += po[(size_t)s * hd + d] * sm_w[s];
    part[sg][d] = acc;
    __syncthreads();
    if (sg) return;
    float lsum = 0.0f;
    for (int s = 0; s < ns; s++) lsum += sm_l[s] * sm_w[s];
    lsum += attn_sink_term(a.sinks, blockIdx.y, mx, true);
    for (int i = 1; i < AD_COMBINE_SG; i++) acc += part[i][d];
    a.out[((size_t)t * a.n_head + blockIdx.y) * hd + d] = __float2half_rn(acc / lsum);
}
