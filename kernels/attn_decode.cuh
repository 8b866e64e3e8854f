// attn_decode.cuh - decode attention (one query token over its sequence's FP16 K/V blocks) on
// the tensor cores, for head_dim 64 and 128 and up to 16 query heads per KV head.
//
// Decode attention is a pass over the K/V cache: the kernel has to keep enough bytes in flight
// to run at memory bandwidth, and do little per byte.  A block takes one token, one KV head
// and one key split (attn_split_chunk: a function of the token's key count and the engine's
// fixed max_split only); its W warps stream the split's KV blocks round-robin (warp w takes
// blocks w, w + W, ...), each through its own S-deep ring of [32 keys][hd] K and V tiles in
// shared memory filled by cp.async (no registers held by loads in flight, no block barrier in
// the loop).  The M dimension of every mma is the KV group's query heads (rows g < group of 16,
// the rest zero), so each K/V byte is read once for the whole group (GQA), and per tile a warp
// forms S = Q K^T and O += P V with mma.m16n8k16 (Q and P as FP16 hi + lo pairs, as in
// flash_attn.cuh: FP32-grade products) and keeps its rows' online softmax in registers.  At the
// end the warps' states merge through shared memory in warp order, and the block writes its
// split's partial (max, sum, unnormalised output) for attn_decode_combine, or, when the token
// has a single split (short contexts), the normalised FP16 output itself.  The partials are
// indexed by the grid's token index (not the packed token), so they take room for the decode
// tokens of a step only: [grid x][n_head][n_split] (max, sum) and [..][hd] outputs.
//
// Invariance: a token's result depends on its own query, its key count and max_split only; the
// merge orders (warps, then splits) are fixed; no atomics.
//
// Tiles are stored unpadded, 16-byte chunk c of row r at chunk c ^ (r & 7): the eight row
// addresses of every ldmatrix then hit distinct banks.
#pragma once
#include "common.cuh"
#include "mma.cuh"
#include "flash_attn.cuh" // split_half2, load_q_pair
#include "../src/gpu/gpu_shared.h"

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

// Dynamic shared memory of a variant: the warps' tile rings (the merge reuses them).
#define AD_SMEM(HD, W, S) ((unsigned)((W) * (S) * sizeof(ad_tile<HD>)))

template <int HD, int W, int S>
__device__ __forceinline__ void attn_decode_body(const attn_args &a)
{
    constexpr int KSTEPS = HD / 16, DTILES = HD / 8;
    static_assert(W * S * sizeof(ad_tile<HD>) >= W * 16 * HD * sizeof(float), "the merge fits in the rings");
    extern __shared__ __align__(16) unsigned char ad_smem[];
    __shared__ float sm_m[W][16], sm_l[W][16];
    ad_tile<HD> *ring = (ad_tile<HD> *)ad_smem + (threadIdx.x >> 5) * S;

    const int t = a.tok_list ? a.tok_list[blockIdx.x] : blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int group = a.n_head / a.n_kv;
    const int n_keys = a.pos[t] + 1, chunk = attn_split_chunk(n_keys, a.max_split);
    const int k_begin = split * chunk, k_end = min(n_keys, k_begin + chunk);
    if (k_begin >= n_keys) return; // a split past the token's keys: the combine reads none of it
    const int32_t *table = a.tables + (size_t)a.seq[t] * a.table_width;
    const int kt0 = k_begin / AD_KEYS, n_kt = (k_end - k_begin + AD_KEYS - 1) / AD_KEYS;
    const int n_mine = warp < n_kt ? (n_kt - warp + W - 1) / W : 0;

    auto issue = [&](int i) { // the warp's i-th KV block into ring slot i % S
        const int kt = kt0 + warp + W * i;
        const size_t base = gpu_kv_offset(table[kt], a.n_layer, a.layer, a.n_kv, kvh, 0, HD);
        ad_load<HD>(&ring[i % S], a.kc + base, a.vc + base, min(AD_KEYS, k_end - kt * AD_KEYS), lane);
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < n_mine) issue(i);
        cp_async_commit();
    }

    // Rows g and g + 8 of the warp's 16: query heads kvh * group + row (zeros past the group).
    uint32_t qf[KSTEPS][4], ql[KSTEPS][4];
    {
        const float *qrow[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = g + 8 * i;
            qrow[i] = r < group ? a.q + ((size_t)t * a.n_head + kvh * group + r) * HD : nullptr;
        }
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            const int d = ks * 16 + 2 * c;
            load_q_pair(qrow[0], d, a.scale, &qf[ks][0], &ql[ks][0]);
            load_q_pair(qrow[1], d, a.scale, &qf[ks][1], &ql[ks][1]);
            load_q_pair(qrow[0], d + 8, a.scale, &qf[ks][2], &ql[ks][2]);
            load_q_pair(qrow[1], d + 8, a.scale, &qf[ks][3], &ql[ks][3]);
        }
    }
    float o[DTILES][4];
#pragma unroll
    for (int j = 0; j < DTILES; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int i = 0; i < n_mine; i++) {
        if (i + S - 1 < n_mine) issue(i + S - 1);
        cp_async_commit();
        cp_async_wait<S - 1>();
        __syncwarp(); // the other lanes' copies of block i are visible
        const ad_tile<HD> *tl = &ring[i % S];
        const int key0 = (kt0 + warp + W * i) * AD_KEYS;

        // S = Q K^T over the block's 32 keys: 4 n-tiles of 8 keys.
        float s[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
            for (int np = 0; np < 2; np++) {
                // matrices: keys 16np + {0-7, 0-7, 8-15, 8-15}, dims 16ks + {0-7, 8-15, 0-7, 8-15}
                const int mi = lane >> 3, key = np * 16 + (mi >> 1) * 8 + (lane & 7);
                uint32_t b[4];
                ldmatrix_x4(b, &tl->k[ad_off<HD>(key, ks * 2 + (mi & 1))]);
                mma_16816(s[2 * np], qf[ks], b[0], b[1]);
                mma_16816(s[2 * np], ql[ks], b[0], b[1]);
                mma_16816(s[2 * np + 1], qf[ks], b[2], b[3]);
                mma_16816(s[2 * np + 1], ql[ks], b[2], b[3]);
            }
        }
        // Keys past the token's last, then the online softmax of rows g and g + 8.
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (key0 + j * 8 + 2 * c + (e & 1) >= k_end) s[j][e] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) { // a row's 32 keys are spread over the 4 lanes of a quad
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]); // finite: the block's first key is the token's
            corr[r] = mn == m[r] ? 1.0f : __expf(m[r] - mn); // 0 on the warp's first block
            m[r] = mn;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = __expf(s[j][e] - m[e >> 1]);
                l[e >> 1] += s[j][e]; // this lane's share; the quad's are summed at the end
            }
#pragma unroll
        for (int j = 0; j < DTILES; j++) {
            o[j][0] *= corr[0], o[j][1] *= corr[0];
            o[j][2] *= corr[1], o[j][3] *= corr[1];
        }
        // O += P V: P's C fragments are, pairwise, A fragments of keys 16kk..16kk+15.
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t pa[4], pl[4];
            split_half2(s[2 * kk][0], s[2 * kk][1], &pa[0], &pl[0]);
            split_half2(s[2 * kk][2], s[2 * kk][3], &pa[1], &pl[1]);
            split_half2(s[2 * kk + 1][0], s[2 * kk + 1][1], &pa[2], &pl[2]);
            split_half2(s[2 * kk + 1][2], s[2 * kk + 1][3], &pa[3], &pl[3]);
#pragma unroll
            for (int dp = 0; dp < DTILES / 2; dp++) {
                // matrices: keys 16kk + {0-7, 8-15, 0-7, 8-15}, dims 16dp + {0-7, 0-7, 8-15, 8-15}
                const int mi = lane >> 3, key = kk * 16 + (mi & 1) * 8 + (lane & 7);
                uint32_t b[4];
                ldmatrix_x4_trans(b, &tl->v[ad_off<HD>(key, dp * 2 + (mi >> 1))]);
                mma_16816(o[2 * dp], pa, b[0], b[1]);
                mma_16816(o[2 * dp], pl, b[0], b[1]);
                mma_16816(o[2 * dp + 1], pa, b[2], b[3]);
                mma_16816(o[2 * dp + 1], pl, b[2], b[3]);
            }
        }
        __syncwarp(); // every lane is done with slot i % S before it is refilled
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
    const bool single = chunk >= n_keys;
    for (int idx = threadIdx.x; idx < group * (HD / 2); idx += W * 32) {
        const int row = idx / (HD / 2), d = 2 * (idx % (HD / 2));
        float mw = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++) mw = fmaxf(mw, sm_m[w][row]);
        float lsum = 0.0f;
        float2 osum = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < W; w++) { // a warp with no block: m = -inf, l = 0, o = 0
            const float f = __expf(sm_m[w][row] - mw);
            lsum += sm_l[w][row] * f;
            osum.x += sm_o[w][row][d] * f;
            osum.y += sm_o[w][row][d + 1] * f;
        }
        const int h = kvh * group + row;
        if (single) {
            ((__half2 *)(a.out + ((size_t)t * a.n_head + h) * HD))[d / 2] =
                __floats2half2_rn(osum.x / lsum, osum.y / lsum);
            continue;
        }
        const size_t part = ((size_t)blockIdx.x * a.n_head + h) * a.n_split + split;
        *(float2 *)(a.part_o + part * HD + d) = osum;
        if (d == 0) {
            a.part_ml[2 * part] = mw;
            a.part_ml[2 * part + 1] = lsum;
        }
    }
}

// The engine's variant (gpu_shared.h): 4 warps, 2 tiles deep each (128 KiB of shared memory
// for head_dim 128).
#define AD_W GPU_ATT_DEC_WARPS
#define AD_S GPU_ATT_DEC_STAGES
static_assert(AD_SMEM(128, AD_W, AD_S) == gpu_attn_decode_smem(128), "the host sizes the rings alike");
extern "C" __global__ void __launch_bounds__(AD_W * 32) attn_decode_hd64(attn_args a)
{
    attn_decode_body<64, AD_W, AD_S>(a);
}
extern "C" __global__ void __launch_bounds__(AD_W * 32) attn_decode_hd128(attn_args a)
{
    attn_decode_body<128, AD_W, AD_S>(a);
}

// Other shapes for gpu_attnbench's sweep (looked up by name there only).
#define AD_VARIANT(W, S)                                                                       \
    extern "C" __global__ void __launch_bounds__(W * 32) attn_decode_hd128_w##W##s##S(attn_args a) \
    {                                                                                          \
        attn_decode_body<128, W, S>(a);                                                        \
    }
AD_VARIANT(4, 1)
AD_VARIANT(2, 2)
AD_VARIANT(8, 1)
AD_VARIANT(4, 3)

// out[t][h] from the token's splits (gpu_attn_splits_for(n_keys, max_split) of them, merged in
// split order); a token with one split was written by attn_decode itself.  Grid (tokens,
// n_head) as attn_combine.
extern "C" __global__ void attn_decode_combine(attn_args a)
{
    const int t = a.tok_list ? a.tok_list[blockIdx.x] : blockIdx.x;
    const int ns = gpu_attn_splits_for(a.pos[t] + 1, a.max_split), hd = a.hd;
    if (ns == 1) return;
    const size_t th = (size_t)blockIdx.x * a.n_head + blockIdx.y, out = ((size_t)t * a.n_head + blockIdx.y) * hd;
    const float *ml = a.part_ml + th * a.n_split * 2;
    float mx = -INFINITY;
    for (int s = 0; s < ns; s++) mx = fmaxf(mx, ml[2 * s]);
    float lsum = 0.0f;
    for (int s = 0; s < ns; s++) lsum += ml[2 * s + 1] * __expf(ml[2 * s] - mx);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < ns; s++) acc += a.part_o[(th * a.n_split + s) * hd + d] * __expf(ml[2 * s] - mx);
        a.out[out + d] = __float2half_rn(acc / lsum);
    }
}
