// flash_attn.cuh - causal attention of prompt tokens on the tensor cores (FlashAttention-2
// style), for head_dim 64, 128, 256 and 512, and deepseek2's latent rows (512 + 64).
//
// The packer (pack_step) cuts every span of >= 2 consecutive tokens of one sequence into tiles
// of at most gpu_flash_q_tokens() tokens; one block takes one tile (at 512 part of one) and
// one KV head.  The block's M dimension is (token, query head of the KV group) pairs, row r = token r / group,
// head r % group, so the group's query heads share every K/V tile load (GQA).  Warps own 16
// rows each (up to head_dim 256; at 512 see below).  K/V come in tiles of FA_KEYS =
// GPU_KV_BLOCK keys -- exactly one KV block, one contiguous [32][hd] range -- double-buffered through cp.async; per tile each warp forms
// S = Q K^T and O += P V with mma.m16n8k16 (FP16 in, FP32 accumulate; Q and P each as an FP16
// hi + lo pair, see split_half2) and updates its rows' online softmax in registers.  The output goes straight to act_h in FP16: no partials.
//
// Registers: a lane holds its rows' O (hd / 2 floats) and, up to head_dim 128, their Q
// fragments (hd / 2 more).  At 256 that would be 256 registers, so there each lane keeps its Q
// fragments in shared memory instead (GPU_FA_Q_SMEM: 64 KiB beside the 66 KiB of K/V tiles;
// ptxas: 255 registers, no spills) and reads one 16-dim step back per mma pair -- the same
// values, so the same bits as in registers.  At 512, where O alone would be 256 registers a
// lane, two warps share each 16 rows: both form the whole S (Q from shared memory, as at 256)
// and its softmax, by the same instructions on the same data, so with the same bits, and each
// accumulates O for half the dims.  That repeats Q K^T (half again the mma of one warp's share)
// but needs no exchange of S between warps.  The Q fragments of 64 rows would overflow shared
// memory beside the K/V tiles, so a block takes 32 of a tile's rows (blockIdx.z; four warps,
// 194 KiB) and a tile of up to 256 rows has up to 8 blocks.
//
// Latent rows (flash_attn_mla, deepseek2's absorbed attention: GPU_MLA_FLASH_ROW = 512 + 64):
// one KV head for all query heads (MQA), Q and K 576 wide, V the first 512 columns of the same
// cached row.  So there is no V tile: V fragments are read from the K tile (ldmatrix.trans of
// its rows, as a V tile's), which halves the tile traffic and leaves room for 64 rows' Q
// fragments (8 warps, two per 16 rows as at 512, each accumulating 256 of V's dims; 222,208
// bytes), so each K tile serves 4 tokens of 16 heads.  The output's RoPE columns (512..575 of
// each head's row) are not written: the value product reads the latent columns alone.
//
// Invariance: a row's arithmetic sees only its own Q, and the K/V tiles 0, 32, 64, ... up to
// its position, in that order, whatever tile or step it is in.  Keys past a row's position are
// masked to -inf; a K/V tile wholly past it is then an exact no-op (max unchanged, correction
// 2^0 = 1, P = 0), which is why a warp may skip such tiles and why a row gives the same bits
// in any tiling.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .f16): with g = lane / 4 and c = lane % 4,
//   A (16x16, row-major) regs {a0a1, a2a3, a4a5, a6a7} = (g, 2c..), (g+8, 2c..), (g, 2c+8..),
//                                                       (g+8, 2c+8..)
//   B (16x8, k x n)      regs {b0b1, b2b3}             = (k 2c.., n g), (k 2c+8.., n g)
//   C (16x8, FP32)       c0,c1 = (g, 2c), (g, 2c+1);  c2,c3 = (g+8, 2c), (g+8, 2c+1)
// ldmatrix.x4 gives lane l the pair (row l/4, cols 2(l%4)..) of each of four 8x8 matrices
// whose row addresses lanes 8i..8i+7 supply; .trans gives (rows 2(l%4)..,  col l/4) instead.
// A K tile row is one key (dims contiguous), so plain ldmatrix yields B of Q K^T; a V tile row
// is also one key, so ldmatrix.trans yields B of P V.
#pragma once
#include "common.cuh"
#include "mma.cuh"
#include "../gpu_shared.h"

#define FA_KEYS GPU_KV_BLOCK

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

// Two FP32 values as FP16 pairs hi + lo (lo = what hi's rounding lost, rounded): products of
// both with FP16 K or V, summed in FP32, carry the FP32 value to about 2^-22, so Q and P lose
// nothing against the CPU's FP32 attention for the price of a second mma.  (FP16 Q and P
// alone, 2^-11, moved whole-model top-1 agreement with the CPU measurably.)
__device__ __forceinline__ void split_half2(float x, float y, uint32_t *hi, uint32_t *lo)
{
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    *hi = *(const uint32_t *)&h;
    *lo = pack_half2(x - hf.x, y - hf.y);
}

// Row r of the tile: the FP32 query of (token, head) scaled, as the hi/lo A fragment pairs at
// dims d, d+1 (zeros for a row past the tile).
__device__ __forceinline__ void load_q_pair(const float *qrow, int d, float scale, uint32_t *hi, uint32_t *lo)
{
    *hi = *lo = 0u;
    if (!qrow) return;
    float2 v = *(const float2 *)(qrow + d);
    split_half2(v.x * scale, v.y * scale, hi, lo);
}

// The per-tile steps of a warp's 16 rows, shared with attn_decode.cuh.  The shared-memory
// tiles are reached through an address function: addr(key, chunk) is where dims 8 chunk ..
// 8 chunk + 7 of that key's row lie.
//
// S = Q K^T over a tile's 32 keys: 4 n-tiles of 8 keys.  q_at(ks, hi, lo) gives the Q A
// fragments (hi + lo pairs) of dims 16 ks .. 16 ks + 15: from registers, or from shared memory
// where the head is too wide for both Q and O to stay in registers (flash_attn_body).
template <int KSTEPS, typename QAt, typename Addr>
__device__ __forceinline__ void fa_qk_tile_q(float s[4][4], QAt q_at, Addr k_at)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < 4; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
        uint32_t qf[4], ql[4];
        q_at(ks, qf, ql);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            // matrices: keys 16np + {0-7, 0-7, 8-15, 8-15}, dims 16ks + {0-7, 8-15, 0-7, 8-15}
            const int mi = lane >> 3, key = np * 16 + (mi >> 1) * 8 + (lane & 7);
            uint32_t b[4];
            ldmatrix_x4(b, k_at(key, ks * 2 + (mi & 1)));
            mma_16816(s[2 * np], qf, b[0], b[1]);
            mma_16816(s[2 * np], ql, b[0], b[1]);
            mma_16816(s[2 * np + 1], qf, b[2], b[3]);
            mma_16816(s[2 * np + 1], ql, b[2], b[3]);
        }
    }
}

// The same with Q held in registers, qf[ks] / ql[ks] (attn_decode, flash_attn at head_dim <= 128).
template <int KSTEPS, typename Addr>
__device__ __forceinline__ void fa_qk_tile(float s[4][4], const uint32_t (*qf)[4], const uint32_t (*ql)[4], Addr k_at)
{
    const auto q_at = [&](int ks, uint32_t *hi, uint32_t *lo) {
#pragma unroll
        for (int i = 0; i < 4; i++) hi[i] = qf[ks][i], lo[i] = ql[ks][i];
    };
    fa_qk_tile_q<KSTEPS>(s, q_at, k_at);
}

// The online softmax of rows g and g + 8 over a tile of S (masked keys at -inf, base-2
// scores): the running max m, the old state (l, o) scaled by the correction, S turned into P
// in place, and this lane's share of the row sums added to l (the quad's are summed at the end).
template <int DTILES>
__device__ __forceinline__ void fa_softmax_tile(float s[4][4], float m[2], float l[2], float (*o)[4])
{
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; i++) { // a row's 32 keys are spread over the 4 lanes of a quad
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mn = fmaxf(m[i], mx[i]);
        // 0 on the first tile; exactly 1 when the max holds (a masked tile is a no-op)
        corr[i] = mn == m[i] ? 1.0f : exp2f(m[i] - mn);
        m[i] = mn;
        l[i] *= corr[i];
    }
    // A row whose keys so far are all masked (a sliding window's row in a tile before its
    // window) keeps m = -inf: its scores become 0, not exp2(-inf + inf) = NaN.
    const float base[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[j][e] = exp2f(s[j][e] - base[e >> 1]);
            l[e >> 1] += s[j][e];
        }
#pragma unroll
    for (int j = 0; j < DTILES; j++) {
        o[j][0] *= corr[0], o[j][1] *= corr[0];
        o[j][2] *= corr[1], o[j][3] *= corr[1];
    }
}

// O += P V over the tile's 32 keys: P's C fragments are, pairwise, A fragments of keys
// 16kk..16kk+15 (as hi + lo pairs).
template <int DTILES, typename Addr>
__device__ __forceinline__ void fa_pv_tile(const float s[4][4], float (*o)[4], Addr v_at)
{
    const int lane = threadIdx.x & 31;
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
            ldmatrix_x4_trans(b, v_at(key, dp * 2 + (mi >> 1)));
            mma_16816(o[2 * dp], pa, b[0], b[1]);
            mma_16816(o[2 * dp], pl, b[0], b[1]);
            mma_16816(o[2 * dp + 1], pa, b[2], b[3]);
            mma_16816(o[2 * dp + 1], pl, b[2], b[3]);
        }
    }
}

// Both caches' tile kt (keys 32 kt .. 32 kt + 31, one block) into buffer buf; keys past
// last_key (not written yet: stale or uninitialised memory, possibly NaN) become zeros, so
// that P = 0 times them stays 0.
// With latent rows (WITH_V false) the V tile is the K tile: only the cache's rows are read.
template <int HD, int STRIDE, int NTHREADS, bool WITH_V>
__device__ __forceinline__ void load_kv_tile(__half (*ks)[STRIDE], __half (*vs)[STRIDE], const flash_args &a,
                                             const int32_t *table, int kvh, int kt, int last_key)
{
    constexpr int CHUNKS = HD / 8; // 16-byte pieces per row
    const size_t base = gpu_kv_offset(table[kt], a.n_layer, a.layer, a.n_kv, kvh, 0, HD);
    const __half *kb = a.kc + base, *vb = a.vc + base;
    static_assert(FA_KEYS * CHUNKS % NTHREADS == 0, "every thread moves the same number of pieces");
#pragma unroll
    for (int it = 0; it < FA_KEYS * CHUNKS / NTHREADS; it++) {
        const int i = threadIdx.x + it * NTHREADS, row = i / CHUNKS, col = (i % CHUNKS) * 8;
        const int bytes = kt * FA_KEYS + row <= last_key ? 16 : 0;
        cp_async16(&ks[row][col], kb + row * HD + col, bytes);
        if (WITH_V) cp_async16(&vs[row][col], vb + row * HD + col, bytes);
    }
}

// HD: the width of Q and K (and of the output's rows); HDV: of V.  HDV < HD is the latent rows
// (GPU_MLA_FLASH_ROW): V is the first HDV columns of the K row itself (one tile, no V cache).
template <int HD, int HDV = HD>
__device__ __forceinline__ void flash_attn_body(const flash_args &a)
{
    // +8 halves per row: consecutive rows start 16 bytes apart in the banks, so the eight row
    // addresses of an ldmatrix hit distinct banks.
    constexpr int STRIDE = HD + 8, KSTEPS = HD / 16;
    constexpr bool WITH_V = HDV == HD;
    static_assert(GPU_FA_KV_TILES(HD) == (WITH_V ? 4 : 2), "the host sizes the tiles alike");
    // DSPLIT warps share each 16 rows (row group), warp half h accumulating output dims
    // h HDW .. h HDW + HDW - 1 (gpu_shared.h: 2 at head_dim 512 and the latent rows, else 1).
    constexpr int DSPLIT = GPU_FA_DSPLIT(HD), HDW = HDV / DSPLIT, DTILES = HDW / 8;
    constexpr int BLOCK_ROWS = GPU_FA_BLOCK_ROWS(HD), NTHREADS = GPU_FA_THREADS(HD);
    // Wide heads keep Q in shared memory (gpu_shared.h, GPU_FA_Q_SMEM): each lane's own A
    // fragments, stored by the row group's warps and read back by the lane of that number in
    // each of them, 16 bytes at a time (a warp's read is 512 contiguous bytes: no bank
    // conflicts).
    constexpr bool Q_SMEM = GPU_FA_Q_SMEM(HD) > 0;
    typedef __half kv_tile[FA_KEYS][STRIDE];
    typedef uint4 q_frags[KSTEPS][2][32]; // [ks][hi, lo][lane]
    static_assert(GPU_FA_KV_TILES(HD) * sizeof(kv_tile) + BLOCK_ROWS / 16 * (Q_SMEM ? sizeof(q_frags) : 0) ==
                      gpu_flash_smem(HD),
                  "the host sizes the shared memory alike");
    static_assert(Q_SMEM || DSPLIT == 1, "warps sharing rows share Q through shared memory");
    extern __shared__ __align__(16) unsigned char fa_smem[];
    kv_tile *k_s = (kv_tile *)fa_smem, *v_s = WITH_V ? k_s + 2 : k_s;
    q_frags *q_s = (q_frags *)(k_s + GPU_FA_KV_TILES(HD));

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int rgrp = warp / DSPLIT, dhalf = warp % DSPLIT;
    const int kvh = blockIdx.y, group = a.n_head / a.n_kv;
    // Tiles in reverse: a span's last tiles see the most keys, and blocks start in grid order,
    // so the longest run first and the short ones fill the tail.
    const int tile = gridDim.x - 1 - blockIdx.x;
    const int t0 = a.tiles[2 * tile], n_tok = a.tiles[2 * tile + 1];
    const int n_rows = n_tok * group;
    // This block's rows of the tile: row0 .. row0 + BLOCK_ROWS - 1 (blockIdx.z is 0 below
    // head_dim 512, where a block takes the whole tile).
    const int row0 = blockIdx.z * BLOCK_ROWS;
    if (row0 >= n_rows) return; // a short tile: the whole block, before any barrier
    const int32_t *table = a.tables + (size_t)a.seq[t0] * a.table_width;
    // The block's last row sees keys 0..last_key (its token is the block's last)
    const int last_key = a.pos[t0 + (min(n_rows, row0 + BLOCK_ROWS) - 1) / group];
    const int n_kt = last_key / FA_KEYS + 1;
    // A sliding layer: the tile's first token sees keys from its window's first on, the later
    // ones from later still (masked per row); the blocks before are not read.
    const int kt_first = gpu_attn_key0(a.pos[t0 + row0 / group], a.window) / FA_KEYS;

    // This thread's two rows (g and g + 8 of the warp's 16): their positions (a row past the
    // tile takes last_key, so it stays finite; it is never written) and queries.
    int row_pos[2], row_first[2];
    const float *qrow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = row0 + rgrp * 16 + g + 8 * i;
        if (r < n_rows) {
            const int tok = t0 + r / group, h = kvh * group + r % group;
            row_pos[i] = a.pos[tok];
            qrow[i] = a.q + ((size_t)tok * a.n_head + h) * HD;
        } else {
            row_pos[i] = last_key;
            qrow[i] = nullptr;
        }
        row_first[i] = gpu_attn_first_key(row_pos[i], a.window);
    }
    // The warp's last key: tiles past it are no-ops for all its rows (see the top).
    const int warp_first = row0 + rgrp * 16;
    const bool active = warp_first < n_rows;
    const int warp_last_row = min(n_rows, warp_first + 16) - 1;
    const int warp_last_key = active ? a.pos[t0 + warp_last_row / group] : -1;

    load_kv_tile<HD, STRIDE, NTHREADS, WITH_V>(k_s[kt_first & 1], v_s[kt_first & 1], a, table, kvh, kt_first, last_key);
    cp_async_commit();

    uint32_t qf[Q_SMEM ? 1 : KSTEPS][4], ql[Q_SMEM ? 1 : KSTEPS][4];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
        if (Q_SMEM && ks % DSPLIT != dhalf) continue; // the row group's other warp stores it
        const int d = ks * 16 + 2 * c;
        uint32_t hi[4], lo[4];
        load_q_pair(qrow[0], d, a.scale, &hi[0], &lo[0]);
        load_q_pair(qrow[1], d, a.scale, &hi[1], &lo[1]);
        load_q_pair(qrow[0], d + 8, a.scale, &hi[2], &lo[2]);
        load_q_pair(qrow[1], d + 8, a.scale, &hi[3], &lo[3]);
        if constexpr (Q_SMEM) {
            q_s[rgrp][ks][0][lane] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            q_s[rgrp][ks][1][lane] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) qf[ks][i] = hi[i], ql[ks][i] = lo[i];
        }
    }
    const auto q_at = [&](int ks, uint32_t *hi, uint32_t *lo) {
        if constexpr (Q_SMEM) {
            const uint4 h = q_s[rgrp][ks][0][lane], l = q_s[rgrp][ks][1][lane];
            hi[0] = h.x, hi[1] = h.y, hi[2] = h.z, hi[3] = h.w;
            lo[0] = l.x, lo[1] = l.y, lo[2] = l.z, lo[3] = l.w;
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) hi[i] = qf[ks][i], lo[i] = ql[ks][i];
        }
    };

    float o[DTILES][4];
#pragma unroll
    for (int j = 0; j < DTILES; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int kt = kt_first; kt < n_kt; kt++) {
        const int buf = kt & 1;
        // Prefetch the next tile into the other buffer (freed by the barrier that ended the
        // previous iteration), then wait for this one.
        if (kt + 1 < n_kt) load_kv_tile<HD, STRIDE, NTHREADS, WITH_V>(k_s[buf ^ 1], v_s[buf ^ 1], a, table, kvh, kt + 1, last_key);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        if (active && kt * FA_KEYS <= warp_last_key) {
            const auto k_at = [&](int key, int ch) { return &k_s[buf][key][ch * 8]; };
            const auto v_at = [&](int key, int ch) { return &v_s[buf][key][dhalf * HDW + ch * 8]; };
            float s[4][4];
            fa_qk_tile_q<KSTEPS>(s, q_at, k_at);
            // Causal mask (and the window's start), then the online softmax per row (in base 2:
            // log2(e) is in the scale).
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kt * FA_KEYS + j * 8 + 2 * c + (e & 1);
                    if (key > row_pos[e >> 1] || key < row_first[e >> 1]) s[j][e] = -INFINITY;
                }
            fa_softmax_tile<DTILES>(s, m, l, o);
            fa_pv_tile<DTILES>(s, o, v_at);
        }
        __syncthreads(); // every warp is done with buf before the next iteration refills it
    }
    cp_async_wait<0>(); // nothing is pending (the last group is empty), but leave none behind

    // Rows past the tile are not written; a real row has l >= 1 (its max key gives 2^0).
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const int r = row0 + rgrp * 16 + g + 8 * i;
        if (r >= n_rows) continue;
        const int tok = t0 + r / group, h = kvh * group + r % group;
        const float inv = 1.0f / (l[i] + attn_sink_term(a.sinks, h, m[i], true));
        __half2 *dst = (__half2 *)(a.out + ((size_t)tok * a.n_head + h) * HD + dhalf * HDW);
#pragma unroll
        for (int j = 0; j < DTILES; j++) dst[(j * 8 + 2 * c) / 2] = __floats2half2_rn(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    }
}

extern "C" __global__ void __launch_bounds__(GPU_FA_THREADS(64)) flash_attn_hd64(flash_args a) { pdl_enter(); flash_attn_body<64>(a); }
extern "C" __global__ void __launch_bounds__(GPU_FA_THREADS(128)) flash_attn_hd128(flash_args a) { pdl_enter(); flash_attn_body<128>(a); }
extern "C" __global__ void __launch_bounds__(GPU_FA_THREADS(256)) flash_attn_hd256(flash_args a) { pdl_enter(); flash_attn_body<256>(a); }
extern "C" __global__ void __launch_bounds__(GPU_FA_THREADS(512)) flash_attn_hd512(flash_args a) { pdl_enter(); flash_attn_body<512>(a); }
// Latent rows (deepseek2): Q and K 512 + 64 wide, V their first 512, one KV head for all query heads
extern "C" __global__ void __launch_bounds__(GPU_FA_THREADS(GPU_MLA_FLASH_ROW)) flash_attn_mla(flash_args a)
{
    pdl_enter();
    flash_attn_body<GPU_MLA_FLASH_ROW, GPU_MLA_FLASH_V>(a);
}
