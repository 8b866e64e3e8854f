// mmq.cuh - matrix products on the quantised (and BF16) weights with tensor cores, for more
// activation rows than the matvec kernels serve (batched decode, prefill): y[m][n] (+)= W[n] . x[m].
//
// No FP16 copy of W exists anywhere: the GGUF blocks themselves stream into shared memory
// (cp.async, a pipeline of mmq_depth stages of 256 inputs, with the activations beside them),
// and each warp decodes its mma fragments from there (load_oct_h: the same FP16 values
// load_chunk_h gives the matvec kernels).  A stage is whole super-blocks (or eight 32-blocks) of
// every row; a k that is not a multiple of 256 (32-input blocks only: gpt-oss's 2,880) ends in a
// partial stage, whose missing chunks are neither copied nor multiplied.  Rows whose stages do
// not start on 16-byte boundaries (Q3_K's 110-byte super-blocks, rows of such a k) are staged
// in 16-byte copies from the aligned address below, each at its offset (mmq_stage_weights).
//
// The weights are mma's A operand (16 weight rows per warp: the output features), the
// activations its B operand (8 activation rows per n-tile), so a block of 16 activation rows
// wastes nothing.  Inside a 32-input chunk the k order is permuted the same way for A and B
// (the product does not care): lane (g, t) holds inputs 8t..8t+7 of its rows, so a lane's
// A fragment is one quarter-chunk of two weight rows and its B fragment one 16-byte load.
//   mma k16 slice 0 of the chunk: logical k {2t, 2t+1, 2t+8, 2t+9} = physical 8t + {0,1,2,3}
//   mma k16 slice 1:              the same logical k                 = physical 8t + {4,5,6,7}
//
// Grid: x over blocks of MMQ_ROWS weight rows (glu: MMQ_ROWS / 2 features of gate and of up,
// whose warps meet in the epilogue), y over blocks of BM activation rows (a MoE layer's
// grouped launch: over tiles of one expert's rows, matvec_args.tiles), z over splits of k.  With one split the epilogue (bias, residual add, or SwiGLU of gate and up)
// is applied here; with several (a grid too small to fill the GPU), every split writes its
// partial sums and mmq_reduce adds them in split order, so the result is deterministic.
#pragma once
#include "quant.cuh"
#include "mma.cuh"
#include "../gpu_kernel_names.h"
#include "../gpu_shared.h"

#define MMQ_WARPS 8
#define MMQ_ROWS (16 * MMQ_WARPS)
#define MMQ_XSTRIDE (MMQ_KT + 32) // halves per staged row: fragment loads free of bank conflicts

__device__ __forceinline__ int mmq_pad(int n) { return (n + 15) & ~15; }

// The epilogues, shared by the kernel (one split) and mmq_reduce (several): feature n of the
// gate/up pair into yh; padded row prow (walked to its segment) into y with bias and residual.
__device__ __forceinline__ void mmq_store_glu(const matvec_args &a, int m, int n, float gt, float up)
{
    if (n >= a.seg[0].n) return;
    if (a.seg[0].bias) { // (an expert's: matvec_args.bias_ids)
        const size_t b = (a.bias_ids ? (size_t)a.bias_ids[a.x_rows ? a.x_rows[m] : m] * a.bias_stride : 0) + n;
        gt += a.seg[0].bias[b];
        up += a.seg[1].bias[b];
    }
    a.yh[(size_t)m * a.seg[0].ldy + n] = __float2half_rn(glu_act(gt, up, a.glu_limit, a.glu_alpha, a.glu_gelu));
}

// (n_seg: the segments stored, the rest skipped; acc: add to y.  mmq_narrow's act_lo form stores
// the remainder's sums as a second pass with accumulate over the first lo_segs would.)
__device__ __forceinline__ void mmq_store_segs(const matvec_args &a, int m, int prow, float v, int n_seg, bool acc)
{
    int s = 0, n = prow;
    while (s < n_seg && n >= mmq_pad(a.seg[s].n)) n -= mmq_pad(a.seg[s++].n);
    if (s >= n_seg || n >= a.seg[s].n) return;
    const matvec_seg &sg = a.seg[s];
    v += sg.bias ? sg.bias[n] : 0.0f;
    float *dst = sg.y + (size_t)m * sg.ldy + n;
    *dst = acc ? *dst + v : v;
}

__device__ __forceinline__ void mmq_store(const matvec_args &a, int m, int prow, float v)
{
    mmq_store_segs(a, m, prow, v, a.n_seg, a.accumulate);
}

// Bytes of 256 inputs of a row (one super-block, or eight 32-blocks): a stage of a weight row.
// (quant_oct.cuh's formats: oct_bytes.)
template <int T> struct mmq_fmt { static constexpr int bytes = oct_bytes<T>::n; };
template <> struct mmq_fmt<T_Q4_0> { static constexpr int bytes = 8 * 18; };
template <> struct mmq_fmt<T_Q8_0> { static constexpr int bytes = 8 * 34; };
template <> struct mmq_fmt<T_Q4_K> { static constexpr int bytes = 144; };
template <> struct mmq_fmt<T_Q5_K> { static constexpr int bytes = 176; };
template <> struct mmq_fmt<T_Q6_K> { static constexpr int bytes = GPU_Q6K_BLOCK; };
template <> struct mmq_fmt<T_BF16> { static constexpr int bytes = 2 * MMQ_KT; };

// Raw blocks of 256 inputs of each of ROWS weight rows (from rowp[r] + woff) into rows of
// STRIDE bytes of a stage buffer, by threads tid of nt, all in 16-byte asynchronous copies
// whatever the format's alignment: from the 16-byte-aligned address at or below a row's stage,
// the whole chunks that cover its first `bytes` (a partial last stage: fewer), so the row's
// bytes land at their offset inside the first chunk (mmq_staged_row) and a decoder reads them
// aligned exactly as in global memory.  Q3_K's 110-byte super-blocks (2-byte aligned as they
// lie in the file) and rows such as GLM-4.5-Air's 1,496-byte Q8_0 ones and gpt-oss's 1,530-byte
// MXFP4 ones were staged in 2- or 4-byte copies before.  The chunk that runs past a stage's
// bytes copies only up to them (cp.async's source size; the rest of the chunk is zero-filled,
// and bytes past a partial stage's live chunks are never multiplied): nothing past the row's
// stage is read.  compute-sanitizer checks the copy's whole 16 bytes, though: the engine's
// tensors lie in 256-byte slots (gpu_engine.c DEV_ALIGN), where it never reaches past the
// allocation, and the kernel tests upload weights the same way (upload_weights).  A first chunk may
// begin before the stage (the bytes of the previous row, or of whatever shares that 16-byte
// piece of the allocation: never before the allocation, which is 256-byte aligned).
template <int STRIDE, int ROWS>
__device__ __forceinline__ void mmq_copy_rows(uint8_t *wd, const uint8_t *const *rowp, size_t woff, int bytes, int tid,
                                              int nt)
{
    constexpr int CH = STRIDE / 16;
    for (int i = tid; i < ROWS * CH; i += nt) {
        const int r = i / CH, c = i % CH;
        const uint8_t *s = rowp[r] + woff, *src = (const uint8_t *)(((uintptr_t)s & ~(uintptr_t)15) + 16 * c);
        const long left = (long)(s + bytes - src);
        if (left > 0) cp_async16(wd + r * STRIDE + 16 * c, src, left < 16 ? (int)left : 16);
    }
}

// A stage of ROWS rows in the layout of stride bytes a row (MMQ_WSTRIDE: RB where every row's
// stage starts 16-byte aligned, a compile-time copy loop for each).  The copies complete before
// the stage is read as every asynchronous one does: behind the __syncthreads (mmq_narrow: the
// __syncwarp) that opens the iteration reading it.
template <int RB, int ROWS>
__device__ __forceinline__ void mmq_stage_weights(uint8_t *wd, int stride, const uint8_t *const *rowp, size_t woff,
                                                  int bytes, int tid, int nt)
{
    if constexpr (RB % 16 == 0)
        if (stride == RB) return mmq_copy_rows<RB, ROWS>(wd, rowp, woff, bytes, tid, nt);
    mmq_copy_rows<MMQ_WSTRIDE_SHIFTED(RB), ROWS>(wd, rowp, woff, bytes, tid, nt);
}

// Where row r's stage (woff bytes into the row) begins in a stage buffer of stride bytes a row:
// its offset inside the 16-byte chunk it was copied from (0 for aligned rows).
__device__ __forceinline__ const uint8_t *mmq_staged_row(const uint8_t *stage, int stride, const uint8_t *const *rowp,
                                                         int r, size_t woff)
{
    return stage + r * stride + ((uintptr_t)(rowp[r] + woff) & 15);
}

// A warp's A fragments of chunk cc of a stage: quarter t of rows w0 (g) and w1 (g + 8) as
// [k16 slice][a0..a3 as pairs] (mmq_narrow.cuh takes the same).
template <int T>
__device__ __forceinline__ void mmq_frags(const uint8_t *w0, const uint8_t *w1, int cc, int t, uint32_t af[2][4])
{
    __half2 lo[4], hi[4];
    load_oct_h<T>(w0, cc, t, lo);
    load_oct_h<T>(w1, cc, t, hi);
#pragma unroll
    for (int sl = 0; sl < 2; sl++) {
        af[sl][0] = h2_bits(lo[2 * sl]);
        af[sl][1] = h2_bits(hi[2 * sl]);
        af[sl][2] = h2_bits(lo[2 * sl + 1]);
        af[sl][3] = h2_bits(hi[2 * sl + 1]);
    }
}

// A count of n8 tiles as a type (mmq_body's main loop, instantiated for a block's tiles).
template <int N> struct mmq_tiles { static constexpr int n = N; };

// Pipeline depth: stages of weights and activations in flight (see gpu_mmq_smem).
template <int T, int BM> struct mmq_depth { static constexpr int n = MMQ_DEPTH(BM / 32, mmq_fmt<T>::bytes); }; // variant v: BM = 16 << v

template <int T, int BM, bool GLU>
__device__ __forceinline__ void mmq_body(const matvec_args &a)
{
    extern __shared__ uint4 mmq_smem[];
    // 8 warps side by side over the block's weight rows, 16 rows (one m16 tile) each, every
    // warp over all BM activation rows (NJ n8 tiles).  (Two m16 tiles per warp over half the
    // activation rows measured no faster.)
    constexpr int NJ = BM / 8, CPS = MMQ_KT / 32, RB = mmq_fmt<T>::bytes, S = mmq_depth<T, BM>::n;
    constexpr int X_STAGE = BM * MMQ_XSTRIDE * 2;
    const int wstride = MMQ_WSTRIDE(RB, a.row_bytes), W_STAGE = MMQ_ROWS * wstride;
    // [S][MMQ_ROWS][wstride] raw weight blocks, [S][BM][MMQ_XSTRIDE] activations, row pointers
    uint8_t *wsm = (uint8_t *)mmq_smem;
    __half *xsm = (__half *)(wsm + S * W_STAGE);
    const uint8_t **rowp = (const uint8_t **)(wsm + S * (W_STAGE + X_STAGE));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rbase = 16 * warp; // the warp's first block row
    int m0 = blockIdx.y * BM, m_end = a.m;
    size_t wexp = 0; // a grouped MoE launch: the tile's expert, its rows
    if (a.tiles) {
        const int32_t *tl = a.tiles + 3 * blockIdx.y;
        if (tl[0] < 0) return; // the whole block: no barrier is skipped by part of it
        wexp = (size_t)tl[0] * a.expert_bytes;
        m0 = tl[1];
        m_end = tl[2];
    }
    const int nchunks = a.k / 32;
    const int c_begin = blockIdx.z * a.split_chunks, c_end = min(nchunks, c_begin + a.split_chunks);

    // The block's MMQ_ROWS weight rows: padded rows MMQ_ROWS * bx.. across the segments, or
    // (glu) features 64 * bx.. of gate (rows 0-63) and of up (64-127).  Rows past a segment
    // read its last row (their results are dropped), so every load stays inside W.
    for (int r = threadIdx.x; r < MMQ_ROWS; r += blockDim.x) {
        int s = 0, n = GLU ? (MMQ_ROWS / 2) * blockIdx.x + (r % (MMQ_ROWS / 2)) : MMQ_ROWS * blockIdx.x + r;
        if (GLU) s = r / (MMQ_ROWS / 2);
        else
            while (s < a.n_seg - 1 && n >= mmq_pad(a.seg[s].n)) n -= mmq_pad(a.seg[s++].n);
        rowp[r] = a.seg[s].w + wexp + (size_t)min(n, a.seg[s].n - 1) * a.row_bytes;
    }
    __syncthreads();

    const int n_stages = (c_end - c_begin + CPS - 1) / CPS;
    // The source of every activation row, once for the whole k: thread (warp, lane) stages
    // piece `lane` (of MMQ_KT / 8 = 32 16-byte pieces) of rows warp + 8j -- n8 tile j's row
    // `warp` -- and the warp keeps each row's address in that row's padding of stage buffer 0
    // (its halves MMQ_KT.. are never written by the copies nor read by the fragments).  A
    // grouped launch gathers its rows (x_rows[m] / x_div): that global load and integer division
    // were made every stage for every piece before (gpt-oss's prefill: the gate/up launch ~8 %
    // slower than the down launch's rows alone explain, docs/benchmarks.md "gpt-oss's prefill
    // kernel by kernel").  In registers the addresses cost occupancy (ptxas: +30-40 a thread
    // on the 64-row tiles, past 128 on several formats); so do guards that skip an expert's
    // tail tile's empty n8 tiles (Q3_K 108 -> 136-146), which are left staged as zeros and
    // multiplied, as before.
    static_assert(MMQ_WARPS == 8 && MMQ_ROWS == 128 && MMQ_KT / 8 == 32 && MMQ_XSTRIDE - MMQ_KT >= 4, "mmq's staged rows");
    auto xsrc = [&](int r) -> const __half *& { return *(const __half **)(xsm + r * MMQ_XSTRIDE + MMQ_KT); };
    if (lane < NJ) { // lane j: row warp + 8j
        const int m = min(m0 + warp + 8 * lane, m_end - 1);
        xsrc(warp + 8 * lane) = a.x + (size_t)(a.x_rows ? a.x_rows[m] / a.x_div : m) * a.ldx;
    }
    __syncwarp();
    auto load_stage = [&](int st) { // raw weight blocks and activations of stage st into buffer st % S
        if (st < n_stages) {
            const int c0 = c_begin + st * CPS, live = min(CPS, c_end - c0);
            uint8_t *wd = wsm + (st % S) * W_STAGE;
            // c0 is a multiple of 8: whole super-blocks (or eight 32-blocks; live < CPS: 32-input
            // blocks, RB / CPS bytes a chunk)
            mmq_stage_weights<RB, MMQ_ROWS>(wd, wstride, rowp, (size_t)(c0 / 8) * RB,
                                            live == CPS ? RB : live * (RB / CPS), threadIdx.x, blockDim.x);
            __half *xd = xsm + (st % S) * (X_STAGE / 2) + warp * MMQ_XSTRIDE + 8 * lane;
            if (8 * lane < 32 * live) // (rows past m_end in a live tile: zeros, as ever)
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    cp_async16(xd + 8 * j * MMQ_XSTRIDE, xsrc(warp + 8 * j) + c0 * 32 + 8 * lane,
                               m0 + warp + 8 * j < m_end ? 16 : 0);
        }
        cp_async_commit(); // an empty group past the end keeps the wait counts uniform
    };

    float acc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int st = 0; st < S - 1; st++) load_stage(st);
    // The main loop over the first NJL n8 tiles: all of them, or half where the block's live
    // rows fit half (a grouped launch's tail tile of an expert: gpt-oss's prompt steps have ~64
    // entries an expert on 64-row tiles, so about one tile in three is a tail of a few rows);
    // the other tiles' sums stay 0 and none of their rows is stored.  A column's sums never
    // depend on another's: the same bits.  (A guard on each n8 tile instead cost registers:
    // Q3_K's 64-row tiles 108 -> 136-146, past 2 blocks a multiprocessor.  Two instances of the
    // loop cost Q3_K's as much, 144, so Q3_K keeps one; ptxas sm_90a: the others at most 113,
    // MXFP4's gate/up 78 -> 113, within the 2 blocks its shared memory allows.)
    auto main_loop = [&](auto nj_tiles) {
        constexpr int NJL = decltype(nj_tiles)::n;
        for (int st = 0; st < n_stages; st++) {
            cp_async_wait<S - 2>();
            __syncthreads(); // stage st landed for every thread; stage st - 1's buffer is free
            load_stage(st + S - 1);
            const uint8_t *wst = wsm + (st % S) * W_STAGE;
            const size_t woff = (size_t)((c_begin + st * CPS) / 8) * RB;
            const __half *xb = xsm + (st % S) * (X_STAGE / 2) + g * MMQ_XSTRIDE + 8 * t;
            const uint8_t *w0 = mmq_staged_row(wst, wstride, rowp, rbase + g, woff), // rows g and g + 8
                *w1 = mmq_staged_row(wst, wstride, rowp, rbase + g + 8, woff);
            auto chunk = [&](int cc) {
                uint32_t af[2][4];
                mmq_frags<T>(w0, w1, cc, t, af);
#pragma unroll
                for (int j = 0; j < NJL; j++) {
                    const uint4 xv = *(const uint4 *)(xb + j * 8 * MMQ_XSTRIDE + cc * 32);
                    mma_16816(acc[j], af[0], xv.x, xv.y);
                    mma_16816(acc[j], af[1], xv.z, xv.w);
                }
            };
            const int live = c_end - (c_begin + st * CPS); // the last stage of a k not a multiple of 256: fewer
            if (live >= CPS) {
#pragma unroll
                for (int cc = 0; cc < CPS; cc++) chunk(cc);
            } else {
                for (int cc = 0; cc < live; cc++) chunk(cc);
            }
        }
    };
    if (T != T_Q3_K && NJ > 1 && m_end - m0 <= 4 * NJ) main_loop(mmq_tiles<NJ / 2>());
    else main_loop(mmq_tiles<NJ>());
    cp_async_wait<0>();

    // acc[j][2h + e]: block row rbase + g + 8h, activation row m0 + 8j + 2t + e; each(f) calls
    // f(block row, activation row within the block, value) for every one of them.
    auto each = [&](auto &&f) {
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) f(rbase + g + 8 * (q >> 1), 8 * j + 2 * t + (q & 1), acc[j][q]);
    };
    const int half_rows = MMQ_ROWS / 2;
    if (gridDim.z > 1) { // partial sums, in padded rows (glu: gate's, then up's)
        each([&](int r, int mr, float v) {
            const int m = m0 + mr, f = half_rows * blockIdx.x + r % half_rows; // glu: the feature
            if (m >= m_end || (GLU && f >= mmq_pad(a.seg[0].n))) return;        // (past it: up's rows)
            const int prow = GLU ? (r / half_rows) * mmq_pad(a.seg[0].n) + f : MMQ_ROWS * blockIdx.x + r;
            if (prow < a.part_ld) a.part[((size_t)blockIdx.z * a.m + m) * a.part_ld + prow] = v;
        });
        return;
    }
    if (GLU) { // the up warps take the gate warps' sums through shared memory
        float *gs = (float *)mmq_smem; // [half_rows][BM]
        const bool gate_warp = rbase < half_rows;
        __syncthreads(); // every warp is done with the stage buffers
        if (gate_warp) each([&](int r, int mr, float v) { gs[r * BM + mr] = v; });
        __syncthreads();
        if (gate_warp) return;
        each([&](int r, int mr, float up) {
            if (m0 + mr < m_end) mmq_store_glu(a, m0 + mr, half_rows * blockIdx.x + r - half_rows, gs[(r - half_rows) * BM + mr], up);
        });
        return;
    }
    each([&](int r, int mr, float v) {
        if (m0 + mr < m_end) mmq_store(a, m0 + mr, MMQ_ROWS * blockIdx.x + r, v);
    });
}

// The splits' partial sums of a.part, added in split order, then the epilogue; one thread per
// (activation row, padded feature row).
extern "C" __global__ void mmq_reduce(matvec_args a, int glu, int n_split)
{
    pdl_enter();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)a.m * a.part_ld) return;
    const int m = (int)(i / a.part_ld), n = (int)(i % a.part_ld);
    const size_t stride = (size_t)a.m * a.part_ld;
    const float *p = a.part + (size_t)m * a.part_ld;
    if (glu) {
        const int up_off = mmq_pad(a.seg[0].n);
        if (n >= up_off) return;
        float gt = 0.0f, up = 0.0f;
        for (int z = 0; z < n_split; z++) {
            gt += p[z * stride + n];
            up += p[z * stride + up_off + n];
        }
        mmq_store_glu(a, m, n, gt, up);
        return;
    }
    float v = 0.0f;
    for (int z = 0; z < n_split; z++) v += p[z * stride + n];
    mmq_store(a, m, n, v);
}

// One pair per row of GPU_MMQ_KERNELS (../gpu_kernel_names.h), under the row's names.
#define MMQ_KERNELS(mmq_name, mmq_glu_name, TYPE, BM)                                            \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32) mmq_name(matvec_args a)         \
    { pdl_enter();                                                                               \
        mmq_body<T_##TYPE, BM, false>(a);                                                        \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32) mmq_glu_name(matvec_args a)     \
    { pdl_enter();                                                                               \
        mmq_body<T_##TYPE, BM, true>(a);                                                         \
    }
GPU_MMQ_KERNELS(MMQ_KERNELS)
