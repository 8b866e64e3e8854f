// mmq_narrow.cuh - products of 1..MMQN_MAX_M activation rows (--deterministic's batch-1 to
// batch-8 decode and short prompt chunks; the default engine's 2..8-row steps: batched decode,
// speculative verification; and a MoE layer's experts in steps of a few tokens, the grouped
// launch below): bit for bit the rows that mmq.cuh and mmq_reduce give with the
// same k splits, in one launch instead of mmq's 16-row tiles over a grid of k splits plus the
// reduce launch.  (The default engine picks its own splits, gpu_forward.c mmqn_fast_split_chunks:
// measured on the H100, the 8B's steps of 2..8 rows cost 3.7-3.9 ms against mmq's 4.3-4.4.)
//
// What a row's result is made of under the flag (gpu_forward.c: the splits are fixed per weight
// shape, mmq_det_split_chunks): per split z of k, the chain of mma.m16n8k16 steps over the
// split's 32-input chunks in order (two k16 slices a chunk, the fragments of mmq_body), then the
// splits added in order from 0.0f (one split: its chain as it is).  Here a warp takes one m16
// tile of weight rows (glu: 16 features of gate or of up) over one split, staging its own
// super-blocks with cp.async through MMQN_DEPTH stages (no block barrier in the loop), and its
// activation rows as one n8 tile read straight from global memory (columns past a.m zero, as
// mmq's staged padding is).  A block holds every split of its tiles, so their partial sums meet
// in shared memory, and one thread per output adds them in split order and applies mmq's
// epilogue (mmq_store, mmq_store_glu).  M only decides how many columns of the n8 tile are
// real, which no column's sums depend on: the same bits for 1 row, 8, or mmq's 64.  Rows are
// staged as mmq stages them (any alignment, a partial last stage: mmq_stage_weights).
//
// The QKV launch of a layer whose RoPE pairs neighbours (not NeoX) may also take qkv_post's work
// (role0 != 0, as matvec_rope: the launch's segments are Q, K, V or a tail of them): a pair
// (2i, 2i+1) of a head lies in one tile, so the thread of a pair rotates it with rope_pair at
// its token's position and stores Q to y, K and V as FP16 into the token's cache row, the same
// arithmetic on the same values as qkv_post.
#pragma once
#include "mmq.cuh"
#include "elementwise.cuh" // rope_pair

// The lane's activation column as FP16 (the default: mmq's fragments and bits): column g, inputs
// 8t.. of each chunk, one 16-byte load; two mma.m16n8k16 a chunk over mmq_frags.
template <int T> struct mmqn_x_h {
    const __half *xg; // the column's row at offset 8t
    bool live;
    __device__ __forceinline__ uint4 load(int c) const
    {
        return live ? __ldg((const uint4 *)(xg + (size_t)c * 32)) : make_uint4(0, 0, 0, 0);
    }
    __device__ __forceinline__ void chunk(const uint8_t *w0, const uint8_t *w1, int cc, int c, int t, uint4 xv,
                                          float acc[4]) const
    {
        uint32_t af[2][4];
        mmq_frags<T>(w0, w1, cc, t, af);
        mma_16816(acc, af[0], xv.x, xv.y);
        mma_16816(acc, af[1], xv.z, xv.w);
    }
};

// act_lo's products in the same pass (a plain launch with a.x_lo: mmq_narrow_lo_<type>): the lane's
// column g of x and of its FP16 remainder x_lo, a second n8 tile over the same A fragments, its
// sums in acc[4..7].  Each tile's chain of mmas is the one mmqn_x_h makes over its input alone,
// so the sums of a pass over x and of a second pass over x_lo, bit for bit, in one read and one
// decode of the weights (a batch of 2..8 tokens' Wq / Wkv_a: DeepSeek-V2-Lite's second pass was
// 9.4 us of a 260-290 us batch-8 MoE layer).
struct mmqn_x_pair {
    uint4 x, lo;
};
template <int T> struct mmqn_x_h_lo {
    const __half *xg, *lg; // the column's rows of x and x_lo at offset 8t
    bool live;
    __device__ __forceinline__ mmqn_x_pair load(int c) const
    {
        const uint4 z = make_uint4(0, 0, 0, 0);
        return live ? mmqn_x_pair{__ldg((const uint4 *)(xg + (size_t)c * 32)), __ldg((const uint4 *)(lg + (size_t)c * 32))}
                    : mmqn_x_pair{z, z};
    }
    __device__ __forceinline__ void chunk(const uint8_t *w0, const uint8_t *w1, int cc, int c, int t, mmqn_x_pair xv,
                                          float acc[8]) const
    {
        uint32_t af[2][4];
        mmq_frags<T>(w0, w1, cc, t, af);
        mma_16816(acc, af[0], xv.x.x, xv.x.y);
        mma_16816(acc, af[1], xv.x.z, xv.x.w);
        mma_16816(acc + 4, af[0], xv.lo.x, xv.lo.y);
        mma_16816(acc + 4, af[1], xv.lo.z, xv.lo.w);
    }
};

// ---- MXFP4's grouped experts on the integer tensor cores (gpt-oss at batch 4..32).  The FP16
// fragments cost ~36 instructions a lane per 8 weights (by count of the source; load_oct_h: the
// lookup, two FP16 ops a pair, the scale), for an n8 tile of which a batch-8 step's tiles have
// ~1.5 live columns: the kernels were issue bound (docs/benchmarks.md "A batch-8 MoE step kernel
// by kernel"; this form: "gpt-oss's MXFP4 grouped experts on the integer tensor cores", -13 %).  Here a weight is its doubled E2M1 level as an int8 (-12..12: one byte permute of
// a table in registers does four, level16_bytes), the activations are int8 (quantize_q8_mma,
// once per launch), one mma.m16n8k32 takes a chunk, and the E8M0 scale times the activation
// block's applies to the chunk's int32 sums in FP32 -- llama.cpp's MMQ form of MXFP4.  The
// activations keep q8_levels' second int8 (the rounding remainder, a second mma): FP16's
// precision, not 8 bits' (dot_q8.cuh: 8 bits alone flipped greedy tokens of the test models).

// The doubled E2M1 levels as int8 (0 1 2 3 4 6 8 12, then their negatives), four to a word.
#define MXFP4_I8_0 0x03020100u
#define MXFP4_I8_1 0x0C080604u
#define MXFP4_I8_2 0xFDFEFF00u
#define MXFP4_I8_3 0xF4F8FAFCu

// A row's int8 A fragments of chunk cc (17-byte blocks at any byte offset of the stage): quant
// bytes 4t..4t+3, whose low nibbles are inputs 4t.. (lo) and high ones 16 + 4t.. (hi), and the
// block's scale 2^(e - 128) (the levels are doubled; load_oct<T_MXFP4>'s d).
__device__ __forceinline__ float mxfp4_i8_frag(const uint8_t *w, int cc, int t, uint32_t &lo, uint32_t &hi)
{
    const uint8_t *b = w + cc * 17;
    uint32_t q[1], r0, r1;
    ld_words<1, false, 1>(b + 1 + 4 * t, q);
    level16_bytes(q[0], MXFP4_I8_0, MXFP4_I8_1, MXFP4_I8_2, MXFP4_I8_3, r0, r1); // (b0 lo, b0 hi, b1 lo, ...)
    lo = prmt(r0, r1, 0x6420u);
    hi = prmt(r0, r1, 0x7531u);
    const uint32_t e = b[0];
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// The q8 rows quantize_q8_mma writes: a row of k inputs is k / 32 chunks of 64 bytes, lane t's
// 16 at 16t -- q of inputs 4t..4t+3, q of 16 + 4t.., then lo of the same (one 16-byte load
// gives both mmas' B fragments) -- and k / 32 floats d / 254 beside (xs).
__device__ __forceinline__ int q8_mma_offset(int i) { return 16 * ((i >> 2) & 3) + 4 * (i >> 4) + (i & 3); }

// Grid (k / 256 rounded up, rows), 256 threads: warp w of block x quantises chunk 8x + w of
// row y of x (FP16, ldx apart) with q8_levels, the dp4a kernels' levels.
extern "C" __global__ void quantize_q8_mma(const __half *x, int ldx, int k, int8_t *xq, float *xs)
{
    pdl_enter();
    const int c = blockIdx.x * 8 + (threadIdx.x >> 5), i = threadIdx.x & 31, row = blockIdx.y;
    if (c >= k / 32) return; // whole warps
    const float v = __half2float(x[(size_t)row * ldx + (size_t)c * 32 + i]);
    int qi, li;
    const float d = q8_levels(v, warp_max(fabsf(v)), qi, li);
    int8_t *o = xq + (size_t)row * 2 * k + (size_t)c * 64 + q8_mma_offset(i);
    o[0] = (int8_t)qi;
    o[8] = (int8_t)li;
    if (i == 0) xs[(size_t)row * (k / 32) + c] = d * (1.0f / 254.0f);
}

// The lane's activations as those q8 rows: B fragments of column g, and the scales of its
// output columns 2t, 2t + 1 (s0, s1: those columns' xs rows).
struct mmqn_x_q8 {
    const int8_t *xg; // column g's q8 row at offset 16t
    const float *s0, *s1;
    bool live;
    __device__ __forceinline__ uint4 load(int c) const
    {
        return live ? __ldg((const uint4 *)(xg + (size_t)c * 64)) : make_uint4(0, 0, 0, 0);
    }
    // Two mmas (q, lo) into int32 sums offset by 1.5 * 2^23, so that each sum (|s| <= 32 * 12 *
    // 127 < 2^22) is its float's mantissa (no int-to-float conversion, a quarter-rate op):
    // q * 254 + lo exactly in FP32 (< 2^24), then times the row's and the column's scales.
    __device__ __forceinline__ void chunk(const uint8_t *w0, const uint8_t *w1, int cc, int c, int t, uint4 xv,
                                          float acc[4]) const
    {
        constexpr int MAGIC = 0x4B400000;
        constexpr float FMAGIC = 12582912.0f;
        uint32_t af[4];
        const float d0 = mxfp4_i8_frag(w0, cc, t, af[0], af[2]), d1 = mxfp4_i8_frag(w1, cc, t, af[1], af[3]);
        int sq[4] = {MAGIC, MAGIC, MAGIC, MAGIC}, sl[4] = {MAGIC, MAGIC, MAGIC, MAGIC};
        mma_16832_s8(sq, af, xv.x, xv.y);
        mma_16832_s8(sl, af, xv.z, xv.w);
        const float e0 = __ldg(s0 + c), e1 = __ldg(s1 + c);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float v = fmaf(__int_as_float(sq[q]) - FMAGIC, 254.0f, __int_as_float(sl[q]) - FMAGIC);
            acc[q] = fmaf(v, (q & 2 ? d1 : d0) * (q & 1 ? e1 : e0), acc[q]);
        }
    }
};

// acc of one warp: the partial sums of its tile's 16 rows x 8 columns over one split.  X: the
// activations' form (mmqn_x_h, or mmqn_x_q8 for MXFP4's grouped experts); ws: the stage buffer's
// bytes a row (MMQ_WSTRIDE).  A k that is not a multiple of 256 (32-input
// blocks only: gpt-oss's 2,880, GLM-4.5-Air's 1,408) ends in a partial stage, as mmq's: its
// missing chunks are neither copied, loaded nor multiplied.
template <int T, class X, int NA>
__device__ __forceinline__ void mmq_narrow_split(const matvec_args &a, const uint8_t *const *rowp, uint8_t *wsm, int ws,
                                                 const X &x, int c_begin, float (&acc)[NA])
{
    using V = decltype(x.load(0));
    constexpr int CPS = MMQ_KT / 32, RB = mmq_fmt<T>::bytes, D = MMQN_DEPTH(RB);
    const int w_stage = 16 * ws, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int c_end = min(a.k / 32, c_begin + a.split_chunks), n_stages = (c_end - c_begin + CPS - 1) / CPS;
    auto load_stage = [&](int st) { // raw blocks of stage st into buffer st % D
        if (st < n_stages) {
            const int c0 = c_begin + st * CPS, live = min(CPS, c_end - c0);
            mmq_stage_weights<RB, 16>(wsm + (st % D) * w_stage, ws, rowp, (size_t)(c0 / 8) * RB,
                                      live == CPS ? RB : live * (RB / CPS), lane, 32);
        }
        cp_async_commit(); // an empty group past the end keeps the wait counts uniform
    };
#pragma unroll
    for (int st = 0; st < D - 1; st++) load_stage(st);
    for (int st = 0; st < n_stages; st++) {
        const int c0 = c_begin + st * CPS, live = c_end - c0; // live < CPS: the partial last stage
        V xv[CPS]; // the lane's activations of the stage (X's layout)
#pragma unroll
        for (int cc = 0; cc < CPS; cc++) xv[cc] = cc < live ? x.load(c0 + cc) : V{};
        cp_async_wait<D - 2>();
        __syncwarp(); // stage st landed for every lane; stage st - 1's buffer is free
        load_stage(st + D - 1);
        const size_t woff = (size_t)(c0 / 8) * RB;
        const uint8_t *w0 = mmq_staged_row(wsm + (st % D) * w_stage, ws, rowp, g, woff), // rows g and g + 8
            *w1 = mmq_staged_row(wsm + (st % D) * w_stage, ws, rowp, g + 8, woff);
        if (live >= CPS) {
#pragma unroll
            for (int cc = 0; cc < CPS; cc++) x.chunk(w0, w1, cc, c0 + cc, t, xv[cc], acc);
        } else { // (unrolled too: xv stays in registers)
#pragma unroll
            for (int cc = 0; cc < CPS; cc++)
                if (cc < live) x.chunk(w0, w1, cc, c0 + cc, t, xv[cc], acc);
        }
    }
    cp_async_wait<0>();
    __syncwarp(); // every lane is done with the buffers and the row pointers
}

// The splits of one output added in order (p: split 0's, ps floats apart: an item's partials), as
// mmq_reduce adds them; one split: as mmq's epilogue takes it.
__device__ __forceinline__ float mmq_narrow_sum(const float *p, int n_split, int ps = 128)
{
    if (n_split == 1) return p[0];
    float v = 0.0f;
    for (int z = 0; z < n_split; z++) v += p[z * ps];
    return v;
}

// The QKV epilogue for the pair at padded rows prow, prow + 1 of activation row m (its segment
// a whole number of heads, hd a multiple of 16: no padding inside).
__device__ __forceinline__ void mmq_narrow_rope(const matvec_rope_args &r, int m, int prow, float v0, float v1)
{
    const matvec_args &a = r.mv;
    const qkv_post_args &p = r.post;
    int s = 0, n = prow;
    while (s < a.n_seg && n >= a.seg[s].n) n -= a.seg[s++].n;
    if (s >= a.n_seg) return;
    const matvec_seg &sg = a.seg[s];
    const int role = r.role0 + s, hd = p.hd, h = n / hd, o = n % hd, pos = p.pos[m];
    if (sg.bias) v0 += sg.bias[n], v1 += sg.bias[n + 1];
    if (role != MATVEC_V) {
        const float2 rv = rope_pair(v0, v1, o / 2, pos, p);
        v0 = rv.x, v1 = rv.y;
    }
    if (role == MATVEC_Q) {
        sg.y[(size_t)m * sg.ldy + n] = v0;
        sg.y[(size_t)m * sg.ldy + n + 1] = v1;
        return;
    }
    const size_t off = gpu_kv_offset(p.tables[(size_t)p.seq[m] * p.table_width + pos / GPU_KV_BLOCK], p.n_layer,
                                     p.layer, p.n_kv, h, pos % GPU_KV_BLOCK, hd) + o;
    gpu_half *c = role == MATVEC_K ? p.kc : p.vc;
    c[off] = __float2half_rn(v0);
    c[off + 1] = __float2half_rn(v1);
}

// Grid x over blocks of tpb tiles; blockDim.x / 32 warps walk the block's tpb * H * n_split
// (tile, gate/up, split) items.  Shared memory (gpu_mmqn_smem): per warp MMQN_DEPTH stages of 16
// rows and its 16 row pointers, then [item][16 rows][8 columns] partial sums.
//
// A grouped MoE launch (a.tiles, as mmq's: moe_sort's list of (expert, first, end) entries of
// one expert, here at most MMQN_MAX_M of them): grid y over the list, the block's weight rows
// offset by its expert's, its columns the tile's entries (activation rows gathered through
// x_rows / x_div), its outputs rows first.. of y / yh, as mmq_body's epilogue writes them.  So
// a step of a few tokens reads each chosen expert's weights once for all the entries routed to
// it, in one launch over (active experts x weight tiles), with no 16-row activation tiles that
// hold one or two entries (mmq) and no k-split reduce.  The same bits as mmq over the same
// entries with the same splits (a column's sums never depend on the others).
//
// LO (a plain launch, a.x_lo: mmq_narrow_lo_<type>): a second n8 tile of columns, the rows of
// x_lo, whose sums land beside each item's (PS = 256 floats an item) and are added to y after
// x's in segments below a.lo_segs (mmq_store_segs with accumulate): y = W x, then y += W x_lo,
// the bits of the two launches with these splits (gpu_forward.c matmul, narrow_lo).
template <int T, bool GLU, bool LO = false>
__device__ __forceinline__ void mmq_narrow_body(const matvec_rope_args &r, int n_split, int tpb)
{
    extern __shared__ uint4 mmqn_smem[];
    constexpr int H = GLU ? 2 : 1, RB = mmq_fmt<T>::bytes, PS = LO ? 256 : 128;
    const matvec_args &a = r.mv;
    int m0 = 0, cnt = a.m; // the block's activation rows: first, count
    size_t wexp = 0;       // (grouped) its expert's weights
    if (a.tiles) {
        const int32_t *tl = a.tiles + 3 * blockIdx.y;
        if (tl[0] < 0) return; // the whole block: no barrier is skipped by part of it
        wexp = (size_t)tl[0] * a.expert_bytes;
        m0 = tl[1];
        cnt = tl[2] - tl[1];
    }
    const int ws = MMQ_WSTRIDE(RB, a.row_bytes), w_warp = MMQN_DEPTH(RB) * 16 * ws;
    const int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int items = tpb * H * n_split;
    uint8_t *base = (uint8_t *)mmqn_smem;
    uint8_t *wsm = base + (size_t)warp * w_warp;
    const uint8_t **rowp = (const uint8_t **)(base + (size_t)nw * w_warp) + 16 * warp;
    float *part = (float *)(base + (size_t)nw * (w_warp + 16 * sizeof(void *)));
    int n_tiles = GLU ? mmq_pad(a.seg[0].n) / 16 : 0;
    if (!GLU)
        for (int s = 0; s < a.n_seg; s++) n_tiles += mmq_pad(a.seg[s].n) / 16;
    // the lane's activation column g: row m0 + g (past the block's rows: its last, zeroed)
    const int mx = m0 + min(g, cnt - 1);
    const mmqn_x_h<T> xh = {a.x + (size_t)(a.x_rows ? a.x_rows[mx] / a.x_div : mx) * a.ldx + 8 * t, g < cnt};
    const mmqn_x_h_lo<T> xl = {xh.xg, LO ? a.x_lo + (size_t)mx * a.ldx + 8 * t : NULL, xh.live};
    // MXFP4's grouped launches with q8 rows (a.xq, a.xd: gpu_forward.c moe_chunk): the int8 form
    mmqn_x_q8 xq = {};
    const bool q8 = T == T_MXFP4 && a.xq;
    if (q8) {
        auto row = [&](int j) { const int m = m0 + min(j, cnt - 1); return a.x_rows ? a.x_rows[m] / a.x_div : m; };
        xq = {a.xq + (size_t)row(g) * 2 * a.k + 16 * t, a.xd + (size_t)row(2 * t) * (a.k / 32),
              a.xd + (size_t)row(2 * t + 1) * (a.k / 32), g < cnt};
    }

    for (int it = warp; it < items; it += nw) {
        const int z = it % n_split, half = (it / n_split) % H, tile = blockIdx.x * tpb + it / (H * n_split);
        float acc[LO ? 8 : 4] = {};
        if (tile < n_tiles) { // (the whole warp)
            if (lane < 16) { // as mmq_body: rows past a segment read its last row
                int s = half, n = 16 * tile + lane;
                if (!GLU)
                    while (s < a.n_seg - 1 && n >= mmq_pad(a.seg[s].n)) n -= mmq_pad(a.seg[s++].n);
                rowp[lane] = a.seg[s].w + wexp + (size_t)min(n, a.seg[s].n - 1) * a.row_bytes;
            }
            __syncwarp();
            if constexpr (LO) {
                mmq_narrow_split<T>(a, rowp, wsm, ws, xl, z * a.split_chunks, acc);
            } else if constexpr (T == T_MXFP4) {
                if (q8) mmq_narrow_split<T>(a, rowp, wsm, ws, xq, z * a.split_chunks, acc);
                else mmq_narrow_split<T>(a, rowp, wsm, ws, xh, z * a.split_chunks, acc);
            } else {
                mmq_narrow_split<T>(a, rowp, wsm, ws, xh, z * a.split_chunks, acc);
            }
        }
        // acc[q]: tile row g + 8 (q >> 1), column 2t + (q & 1) (LO: acc[4 + q] x_lo's, 128 floats on)
        float *p = part + (size_t)it * PS;
#pragma unroll
        for (int q = 0; q < (LO ? 8 : 4); q++) p[(q >> 2) * 128 + (g + 8 * ((q >> 1) & 1)) * 8 + 2 * t + (q & 1)] = acc[q];
    }
    __syncthreads();
    const int per_tile = GLU || !r.role0 ? 16 : 8; // outputs (pairs with RoPE) per tile and row
    for (int i = threadIdx.x; i < tpb * per_tile * cnt; i += blockDim.x) {
        const int tl = i / (per_tile * cnt), e = (i / cnt) % per_tile, m = i % cnt, tile = blockIdx.x * tpb + tl;
        if (tile >= n_tiles) continue;
        const float *p = part + (size_t)tl * H * n_split * PS + m;
        if (LO) {
            const int prow = 16 * tile + e;
            mmq_store(a, m0 + m, prow, mmq_narrow_sum(p + e * 8, n_split, PS));
            mmq_store_segs(a, m0 + m, prow, mmq_narrow_sum(p + 128 + e * 8, n_split, PS), a.lo_segs, true);
        } else if (GLU) {
            mmq_store_glu(a, m0 + m, 16 * tile + e, mmq_narrow_sum(p + e * 8, n_split),
                          mmq_narrow_sum(p + n_split * 128 + e * 8, n_split));
        } else if (r.role0) {
            mmq_narrow_rope(r, m, 16 * tile + 2 * e, mmq_narrow_sum(p + 2 * e * 8, n_split),
                            mmq_narrow_sum(p + (2 * e + 1) * 8, n_split));
        } else {
            mmq_store(a, m0 + m, 16 * tile + e, mmq_narrow_sum(p + e * 8, n_split));
        }
    }
}

// Blocks of a format's kernels a multiprocessor must hold (__launch_bounds__' minimum; 0: no
// bound).  MXFP4: 3.  gpt-oss's grouped experts at batch 8 were issue bound at 2 blocks of 8
// warps (ncu: 111 / 113 registers, ~3.7 warps a scheduler each issuing every ~4.7 cycles, SM
// 55-65 %, DRAM 25-29 %; docs/benchmarks.md "A batch-8 MoE step kernel by kernel"): at 80
// registers ptxas (sm_90a) spills 8-20 bytes, and 3 blocks' stages (~200 KB at 2,880 inputs)
// fit the shared memory.  (Q4_K spills 44-96 bytes at 80; Q6_K's stages do not fit 3 blocks.)
template <int T> struct mmqn_min_blocks { static constexpr int n = 0; };
template <> struct mmqn_min_blocks<T_MXFP4> { static constexpr int n = 3; };

// One pair per row of GPU_MMQ_NARROW_KERNELS (../gpu_kernel_names.h), under the row's names.
#define MMQ_NARROW_KERNELS(name, glu_name, TYPE)                                                     \
    extern "C" __global__ void __launch_bounds__(MMQN_WARPS * 32, mmqn_min_blocks<T_##TYPE>::n)      \
        name(matvec_rope_args r, int n_split, int tpb)                                               \
    { pdl_enter();                                                                                   \
        mmq_narrow_body<T_##TYPE, false>(r, n_split, tpb);                                           \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(MMQN_WARPS * 32, mmqn_min_blocks<T_##TYPE>::n)      \
        glu_name(matvec_rope_args r, int n_split, int tpb)                                           \
    { pdl_enter();                                                                                   \
        mmq_narrow_body<T_##TYPE, true>(r, n_split, tpb);                                            \
    }
GPU_MMQ_NARROW_KERNELS(MMQ_NARROW_KERNELS)

// act_lo's products with x's (LO above), the formats of GPU_MMQ_NARROW_LO_KERNELS.
#define MMQ_NARROW_LO_KERNEL(name, TYPE)                                                             \
    extern "C" __global__ void __launch_bounds__(MMQN_WARPS * 32) name(matvec_rope_args r, int n_split, int tpb) \
    { pdl_enter();                                                                                   \
        mmq_narrow_body<T_##TYPE, false, true>(r, n_split, tpb);                                     \
    }
GPU_MMQ_NARROW_LO_KERNELS(MMQ_NARROW_LO_KERNEL)
