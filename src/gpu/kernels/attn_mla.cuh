// attn_mla.cuh - decode attention over deepseek2's latent rows (512 latent + 64 RoPE key, FP16,
// one KV head for all query heads) on the tensor cores: attn_decode_mla.
//
// The absorbed form is multi-query attention with rows of 576: every query head of a token
// reads the same rows, so the rows should be read once for all of them.  attn_partial_wide, the
// kernel this replaces for decode tokens, read each row once per four heads on the CUDA cores.
// Here a block takes one token, GPU_ATT_MLA_HEADS = 16 query heads (the M dimension of every
// mma: rows past n_head are zeros) and one key split (attn_split_chunk of the token's keys at
// the engine's max_split / the grid's batch_split, as attn_decode's head_dim-256 kernel), and
// streams the split's KV blocks through a two-deep ring of [32 keys][576] tiles filled by
// cp.async.  Per tile:
//   - S = Q K^T: the 36 k-steps of 16 dims are split between the 4 warps (9 each), each warp's
//     Q fragments for its k-steps in shared memory (FP16 hi + lo pairs, as every flash kernel
//     here; in registers beside O they spilled);
//     the warps' partial S go through shared memory and every warp sums the four in warp order
//     (the same bits in every warp, so the softmax below is the same in every warp);
//   - the online softmax of the 16 rows, in every warp (fa_softmax_tile, base 2);
//   - O += P V with V the tile's first 512 columns (ldmatrix.trans of the K tile, no V tile),
//     warp w accumulating dims 128 w .. 128 w + 127 (64 registers a lane; the whole 512 would
//     be 256).
// Each tile is then read once for 16 heads, and its mma work (S 288, P V 256 per tile)
// is spread over the SM's four tensor units.
//
// A token of one split writes its FP16 output (act_h's rows of 576: the value product reads the
// first 512) directly; otherwise each block writes its partial (max, sum, unnormalised output of
// 512) and the last split block of a (token, head group) to finish merges them in split order
// (ad_merge_splits, attn_decode.cuh's fused merge, its arrival counters per head group).
//
// Invariance: a token's result depends on its own query, its key count, max_split and
// batch_split only (attn_decode's rule: batch_split = max_split under --deterministic).
#pragma once
#include "common.cuh"
#include "mma.cuh"
#include "flash_attn.cuh" // fa_qk_tile_q, fa_softmax_tile, fa_pv_tile
#include "attn_decode.cuh" // ad_query_frag, ad_token_split, ad_merge_splits
#include "../gpu_shared.h"

#define AM_ROW GPU_MLA_FLASH_ROW                 // 576: Q and K
#define AM_V GPU_MLA_FLASH_V                     // 512: V, the row's first columns
#define AM_KEYS GPU_KV_BLOCK                     // a tile: one KV block
#define AM_WARPS GPU_ATT_MLA_WARPS
#define AM_KS_W (AM_ROW / 16 / AM_WARPS)         // each warp's k-steps of S: 9
#define AM_DV_W (AM_V / AM_WARPS)                // each warp's output dims: 128
#define AM_TILE (AM_KEYS * AM_ROW)               // halves in a tile
static_assert(AM_KS_W * 16 * AM_WARPS == AM_ROW, "the warps split S's k-steps evenly");
typedef uint4 am_q_frags[AM_KS_W][2][32]; // a warp's: [ks][hi, lo][lane]
static_assert(2 * AM_TILE * 2 + AM_WARPS * 32 * 16 * 4 + AM_WARPS * sizeof(am_q_frags) == gpu_attn_decode_mla_smem(),
              "the host sizes it alike");

// 16-byte chunk c of tile row r at chunk c ^ (r & 7) (72 chunks a row, a multiple of 8: the
// swizzle stays in the row), so the eight row addresses of an ldmatrix hit distinct banks.
__device__ __forceinline__ int am_off(int row, int chunk) { return row * AM_ROW + ((chunk ^ (row & 7)) << 3); }

// KV block kt of the token's table into a tile, by the whole block; keys from k_end on become
// zeros (stale or uninitialised rows, possibly NaN, never meet P = 0).
__device__ __forceinline__ void am_load(__half *tile, const attn_args &a, const int32_t *table, int kt, int k_end)
{
    constexpr int CH = AM_ROW / 8;
    static_assert(AM_KEYS * CH % (AM_WARPS * 32) == 0, "every thread moves the same number of pieces");
    const __half *kb = a.kc + gpu_kv_offset(table[kt], a.n_layer, a.layer, a.n_kv, 0, 0, AM_ROW);
    const int n_valid = min(AM_KEYS, k_end - kt * AM_KEYS);
#pragma unroll
    for (int it = 0; it < AM_KEYS * CH / (AM_WARPS * 32); it++) {
        const int i = threadIdx.x + it * AM_WARPS * 32, row = i / CH, ch = i % CH;
        cp_async16(&tile[am_off(row, ch)], kb + row * AM_ROW + ch * 8, row < n_valid ? 16 : 0);
    }
}

// Grid (decode tokens, head groups, splits), AM_WARPS warps, gpu_attn_decode_mla_smem() bytes.
extern "C" __global__ void __launch_bounds__(AM_WARPS * 32) attn_decode_mla(attn_args a)
{
    pdl_enter();
    extern __shared__ __align__(16) unsigned char am_smem[];
    __half *ring = (__half *)am_smem;
    float(*sx)[32][16] = (float(*)[32][16])(am_smem + 2 * AM_TILE * sizeof(__half)); // [warp][lane][S]
    am_q_frags *q_s = (am_q_frags *)(am_smem + 2 * AM_TILE * sizeof(__half) + AM_WARPS * 32 * 16 * sizeof(float));

    const int t = a.tok_list ? a.tok_list[blockIdx.x] : blockIdx.x, hg = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int h0 = hg * GPU_ATT_MLA_HEADS, rows = min(GPU_ATT_MLA_HEADS, a.n_head - h0);
    const int n_keys = a.pos[t] + 1, first = gpu_attn_first_key(a.pos[t], a.window);
    const int key0 = gpu_attn_key0(a.pos[t], a.window), span = n_keys - key0;
    const int chunk = attn_split_chunk(span, ad_token_split(a, span));
    const int k_begin = key0 + split * chunk, k_end = min(n_keys, k_begin + chunk);
    if (k_begin >= n_keys) return; // a split past the token's keys (the whole block, before any barrier)
    const int32_t *table = a.tables + (size_t)a.seq[t] * a.table_width;
    const int kt0 = k_begin / AM_KEYS, n_kt = (k_end - k_begin + AM_KEYS - 1) / AM_KEYS;

    am_load(ring, a, table, kt0, k_end);
    cp_async_commit();

    // This warp's k-steps 9 warp .. 9 warp + 8 of rows g and g + 8 (heads h0 + row).
    const float scale2 = a.scale * 1.4426950408889634f; // base-2 scores
    const float *qrow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        qrow[i] = r < rows ? a.q + ((size_t)t * a.n_head + h0 + r) * AM_ROW : nullptr;
    }
    am_q_frags &qw = q_s[warp];
#pragma unroll
    for (int ks = 0; ks < AM_KS_W; ks++) {
        uint32_t hi[4], lo[4];
        ad_query_frag(qrow, AM_KS_W * warp + ks, c, scale2, hi, lo);
        qw[ks][0][lane] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        qw[ks][1][lane] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    const auto q_at = [&](int ks, uint32_t *hi, uint32_t *lo) { // (each lane reads back its own)
        const uint4 h = qw[ks][0][lane], l = qw[ks][1][lane];
        hi[0] = h.x, hi[1] = h.y, hi[2] = h.z, hi[3] = h.w;
        lo[0] = l.x, lo[1] = l.y, lo[2] = l.z, lo[3] = l.w;
    };

    float o[AM_DV_W / 8][4];
#pragma unroll
    for (int j = 0; j < AM_DV_W / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int i = 0; i < n_kt; i++) {
        // the next tile into the other slot (its last readers passed the barrier ending i - 1)
        if (i + 1 < n_kt) am_load(ring + ((i + 1) & 1) * AM_TILE, a, table, kt0 + i + 1, k_end);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads(); // tile i is in, from every thread's copies
        const __half *tl = ring + (i & 1) * AM_TILE;
        const int ch_s = 2 * AM_KS_W * warp, ch_v = AM_DV_W / 8 * warp; // this warp's first chunks
        float s[4][4];
        fa_qk_tile_q<AM_KS_W>(s, q_at, [&](int key, int ch) { return &tl[am_off(key, ch_s + ch)]; });
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) sx[warp][lane][4 * j + e] = s[j][e];
        __syncthreads();
        const int tile0 = (kt0 + i) * AM_KEYS;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = sx[0][lane][4 * j + e];
#pragma unroll
                for (int w = 1; w < AM_WARPS; w++) v += sx[w][lane][4 * j + e];
                const int key = tile0 + j * 8 + 2 * c + (e & 1);
                s[j][e] = key >= k_end || key < first ? -INFINITY : v;
            }
        fa_softmax_tile<AM_DV_W / 8>(s, m, l, o);
        fa_pv_tile<AM_DV_W / 8>(s, o, [&](int key, int ch) { return &tl[am_off(key, ch_v + ch)]; });
        __syncthreads(); // every warp is done with slot i & 1 and with sx
    }
    cp_async_wait<0>();

    const bool single = chunk >= span;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = g + 8 * r, h = h0 + row;
        if (row >= rows) continue;
        const int d0 = AM_DV_W * warp + 2 * c;
        if (single) {
            const float inv = 1.0f / (l[r] + attn_sink_term(a.sinks, h, m[r], true));
            __half2 *dst = (__half2 *)(a.out + ((size_t)t * a.n_head + h) * AM_ROW + d0);
#pragma unroll
            for (int j = 0; j < AM_DV_W / 8; j++) dst[4 * j] = __floats2half2_rn(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
            continue;
        }
        const size_t part = ((size_t)blockIdx.x * a.n_head + h) * a.n_split + split;
        float2 *po = (float2 *)(a.part_o + part * AM_V + d0);
#pragma unroll
        for (int j = 0; j < AM_DV_W / 8; j++) po[4 * j] = make_float2(o[j][2 * r], o[j][2 * r + 1]);
        if (warp == 0 && c == 0) { // (m and l are the same in every warp)
            a.part_ml[2 * part] = m[r];
            a.part_ml[2 * part + 1] = l[r];
        }
    }
    if (single) return;
    // The split merge (attn_decode's at head_dim 256): publish, count, and the last block merges.
    __threadfence();
    __syncthreads();
    const int ns = (span + chunk - 1) / chunk;
    __shared__ unsigned last;
    if (threadIdx.x == 0) {
        unsigned *cnt = a.counts + (size_t)blockIdx.x * gridDim.y + hg;
        last = atomicAdd(cnt, 1u) == (unsigned)ns - 1;
        if (last) *cnt = 0u; // every split has counted: the next launch starts from 0
    }
    __syncthreads();
    if (!last) return;
    __threadfence(); // the other blocks' partials, read after their counts
    ad_merge_splits<AM_V, AM_WARPS, AM_ROW>(a, t, h0, rows, ns, (float *)am_smem);
}
