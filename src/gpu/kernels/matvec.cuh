// matvec.cuh - y[m][n] (+)= sum_k W[n][k] * x[m][k] for a few rows m, reading W in its
// quantised form exactly once per launch; the gate/up variant that fuses SwiGLU; the FP16
// dequantiser that feeds cuBLAS for large batches; and the embedding gather (a row lookup
// through the same block decoder).
//
// Weights are decoded to FP16 by load_chunk_h and activations arrive in FP16, exactly as the
// cuBLAS path sees them: both paths then form the same products, and only the order of the
// FP32 sums differs, so a sequence's tokens do not depend on how its step was batched.  The
// one exception: the dp4a kernels (matvec_dp4a_*, glu_dp4a_*, matvec_rope_dp4a_*; dot_q8.cuh),
// which the batch-1 step of a dense model takes for Q4_K/Q6_K, multiply the exact weights with
// the activations rounded to 8 bits (never under --deterministic).  The one-row products of
// IQ4_XS, Q2_K and Q3_K (row_dots_mma) multiply the same FP16 values on the tensor cores, whose
// FP32 sums are their own: --deterministic takes mmq for those at every row count.
#pragma once
#include "quant.cuh"
#include "dot_q8.cuh"
#include "mma.cuh"
#include "elementwise.cuh" // rope_pair, rope_index
#include "../gpu_kernel_names.h"
#include "../gpu_shared.h"

#define MATVEC_WARPS 8

// One chunk of NR rows' decoded FP16 weights (load_chunk_h) as FP32.
template <int NR>
__device__ __forceinline__ void chunk_weights(__half2 wh[NR][16], float w[NR][32])
{
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float2 f = __half22float2(wh[r][i]);
            w[r][2 * i] = f.x;
            w[r][2 * i + 1] = f.y;
        }
}

// One chunk's products: each of NR rows of 32 weights (chunk_weights) with the 32 FP16 inputs
// at xc, the sums s[r] in one fixed order (row_dots and the MoE experts' kernels form every
// chunk's sum here, so a row's bits do not depend on which of them ran it).
template <int NR>
__device__ __forceinline__ void chunk_dots(float w[NR][32], const __half *xc, float s[NR])
{
    const uint4 *xp = (const uint4 *)xc;
#pragma unroll
    for (int r = 0; r < NR; r++) s[r] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint4 v = xp[j];
        const __half2 *h = (const __half2 *)&v;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 f = __half22float2(h[e]);
#pragma unroll
            for (int r = 0; r < NR; r++) s[r] += w[r][8 * j + 2 * e] * f.x + w[r][8 * j + 2 * e + 1] * f.y;
        }
    }
}

// Dot products of NR weight rows (the same features of NR matrices) with MT activation rows;
// one warp, lanes striding over the rows' 32-weight chunks.  Each lane decodes its chunk of
// the NR rows first (their loads in flight together), then converts each activation chunk
// once for all NR rows.  Per chunk the sum is formed apart and then added, so a row's result
// does not depend on MT or NR.  row_dots_span: over chunks [c0, c1) of the rows only
// (matvec_wide_body's part of k); row_dots: over all of them.
template <int T, int MT, int NR>
__device__ __forceinline__ void row_dots_span(const uint8_t *const rows[NR], const matvec_args &a, int m0, int c0,
                                              int c1, float acc[NR][MT])
{
    int lane = threadIdx.x & 31;
    const __half *xr[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) xr[i] = a.x + (size_t)min(m0 + i, a.m - 1) * a.ldx;
    if constexpr (MT == 2)
        if (a.x_lo) xr[1] = a.x_lo; // one row to ~22 bits: its FP16 value and remainder
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = 0.0f;
    for (int c = c0 + lane; c < c1; c += WARP) {
        __half2 wh[NR][16];
#pragma unroll
        for (int r = 0; r < NR; r++) load_chunk_h<T>(rows[r], c, wh[r]);
        float w[NR][32];
        chunk_weights<NR>(wh, w);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            float s[NR];
            chunk_dots<NR>(w, xr[i] + 32 * c, s);
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r][i] += s[r];
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = warp_sum(acc[r][i]);
}

template <int T, int MT, int NR>
__device__ __forceinline__ void row_dots(const uint8_t *const rows[NR], const matvec_args &a, int m0,
                                         float acc[NR][MT])
{
    row_dots_span<T, MT, NR>(rows, a, m0, 0, a.k / 32, acc);
}

// The formats whose one-activation-row products (batch-1 decode) run on the tensor cores
// (row_dots_mma): those with an FP16 decoder of whole words (quant_half.cuh), whose matvecs
// the FP32 products left issue bound.
template <int T> struct mv_mma { static constexpr bool on = false; };
template <> struct mv_mma<T_IQ4_XS> { static constexpr bool on = true; };
template <> struct mv_mma<T_Q2_K> { static constexpr bool on = true; };
template <> struct mv_mma<T_Q3_K> { static constexpr bool on = true; };

// A lane's 32 FP16 inputs of chunk c as 16 words (past the last chunk: zeros).
__device__ __forceinline__ void load_x_words(const uint4 *xp, bool live, uint32_t xw[16])
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 v = live ? __ldg(xp + j) : make_uint4(0u, 0u, 0u, 0u);
        xw[4 * j] = v.x, xw[4 * j + 1] = v.y, xw[4 * j + 2] = v.z, xw[4 * j + 3] = v.w;
    }
}

// The two mma of word i of a lane's IQ4_XS chunk (iq4_h_word's pairs: the low nibbles' feed step
// i, the high ones' step 4 + i) into the chains d[0], d[1]: row pairs p0 in A row g, p1 (two) in
// row g + 8 (else zeros), the inputs' words xw.  row_dots_mma's, and scripts/mvbench.cu's.
__device__ __forceinline__ void iq4_word_mma(float d[2][4], const __half2 p0[4], const __half2 p1[4], bool two,
                                             const uint32_t xw[16], int i)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int st = i + 4 * h;
        const uint32_t af[4] = {h2_bits(p0[2 * h]), two ? h2_bits(p1[2 * h]) : 0u, h2_bits(p0[2 * h + 1]),
                                two ? h2_bits(p1[2 * h + 1]) : 0u};
        mma_16816(d[h], af, xw[2 * st], xw[2 * st + 1]);
    }
}

// row_dots for one activation row (NR = 1 or 2) with the products on the tensor cores: the
// FP32 half of row_dots (a conversion of each weight and each input, an FFMA per weight) is
// most of a matvec's instructions once the decode is cheap.  One m16n8k16 per 4 weight pairs
// of a lane: lane (g, t) puts two of its weight pairs in A row g (and row g + 8: its second
// row's same pairs) and the matching input pairs in B column g, so D[g][g] (D[g + 8][g]) sums
// the products of the four lanes of group g, and no lane's weights meet another's inputs
// except off the diagonal, which is dropped.  The same FP16 weights and inputs as row_dots,
// products exact, sums in the tensor cores' FP32 (their order and rounding, as mmq's).  Every
// lane runs every mma (mma.sync): past the last chunk a lane decodes the last one again and
// multiplies it by zero inputs.  WORDS (IQ4_XS): the chunk is kept as it lies and decoded a word
// at a time before the mma that take it, 4 registers of quants live a row instead of 16 of
// pairs: 44 registers for the GLU instead of 62, and 7-8 % faster one-matrix products alone
// (scripts/mvbench.cu times both).  Q2_K's raw chunk (8 words and its scales) would save few
// registers, Q3_K's (16 words) none.  PREF (WORDS only): the next pass's raw chunk is loaded
// before this one is decoded -- the same sums, 6 registers more: the carried-norm kernels of the
// batch-1 step take it (+3.3 % on the 8B IQ4_XS step, their resident blocks unchanged where it
// counts), the plain ones not (alone in mvbench it cost them a block an SM: the QKV shape -16 %;
// docs/benchmarks.md "IQ4_XS's one-row products load a pass ahead").
template <int T, int NR, bool PREF = false, bool WORDS = T == T_IQ4_XS>
__device__ __forceinline__ void row_dots_mma(const uint8_t *const rows[NR], const matvec_args &a, int m0,
                                             float acc[NR][1])
{
    static_assert(NR == 1 || NR == 2, "A rows g and g + 8 hold at most two weight rows");
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const __half *xr = a.x + (size_t)min(m0, a.m - 1) * a.ldx;
    float d[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}}; // two chains of mma
    const int nchunks = a.k / 32;
    iq4xs_raw q[NR]; // WORDS: this pass's chunk as it lies (PREF: loaded the pass before)
    if constexpr (WORDS && PREF) {
#pragma unroll
        for (int r = 0; r < NR; r++) q[r] = iq4xs_load(rows[r], min(lane, nchunks - 1));
    }
    for (int c0 = 0; c0 < nchunks; c0 += WARP) {
        const bool live = c0 + lane < nchunks;
        const int c = live ? c0 + lane : nchunks - 1;
        const uint4 *xp = (const uint4 *)(xr + 32 * c);
        uint32_t xw[16];
        if constexpr (WORDS) {
            static_assert(T == T_IQ4_XS, "the word-at-a-time decode is IQ4_XS's");
            // word i's pairs feed steps i and 4 + i (its low and high nibbles); PREF: the next
            // pass's chunk (past the last: the last again) is loaded before this one is decoded
            iq4xs_raw qn[NR];
            __half2 dl[NR];
            if constexpr (!PREF) {
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    q[r] = iq4xs_load(rows[r], c);
                    dl[r] = iq4xs_h_scale(q[r].h, c & 7);
                }
            }
            load_x_words(xp, live, xw);
            if constexpr (PREF) {
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    qn[r] = iq4xs_load(rows[r], min(c0 + WARP + lane, nchunks - 1));
                    dl[r] = iq4xs_h_scale(q[r].h, c & 7);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                __half2 p[NR][4];
#pragma unroll
                for (int r = 0; r < NR; r++) iq4_h_word(q[r].u[i], dl[r], &p[r][0], &p[r][2]);
                iq4_word_mma(d, p[0], p[NR - 1], NR > 1, xw, i);
            }
            if constexpr (PREF) {
#pragma unroll
                for (int r = 0; r < NR; r++) q[r] = qn[r];
            }
        } else {
            __half2 wh[NR][16];
#pragma unroll
            for (int r = 0; r < NR; r++) load_chunk_h<T>(rows[r], c, wh[r]);
            load_x_words(xp, live, xw);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint32_t af[4] = {h2_bits(wh[0][2 * i]), NR > 1 ? h2_bits(wh[NR - 1][2 * i]) : 0u,
                                        h2_bits(wh[0][2 * i + 1]), NR > 1 ? h2_bits(wh[NR - 1][2 * i + 1]) : 0u};
                mma_16816(d[i & 1], af, xw[2 * i], xw[2 * i + 1]);
            }
        }
    }
    // D[g][g] and D[g + 8][g]: elements g & 1 and 2 + (g & 1) of lane (g, g / 2)
    const bool diag = t == (g >> 1);
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const float v = (g & 1) ? d[0][2 * r + 1] + d[1][2 * r + 1] : d[0][2 * r] + d[1][2 * r];
        acc[r][0] = warp_sum(diag ? v : 0.0f);
    }
}

// The dot products of a block's rows: the FP16 decode, or (Q8, one activation row) the
// integer products with the q8 row of dot_q8.cuh.  PREF: row_dots_mma's (the carried norms'
// kernels).
template <int T, int MT, int NR, bool Q8, bool PREF = false>
__device__ __forceinline__ void dots(const uint8_t *const rows[NR], const matvec_args &a, int m0, float acc[NR][MT])
{
    if constexpr (Q8)
        row_dots_q8<T, NR>(rows, a, acc);
    else if constexpr (MT == 1 && mv_mma<T>::on)
        row_dots_mma<T, NR, PREF>(rows, a, m0, acc);
    else
        row_dots<T, MT, NR>(rows, a, m0, acc);
}

// matvec_rope (ROPE): the feature that warp w of a block takes.  The host makes every segment
// a whole number of heads, so a block's 8 features (base o of head h, o a multiple of 8) are 4
// whole RoPE pairs: for NeoX, warps 0-3 take features 4p..4p+3 of the head (p = o / 8) and
// warps 4-7 their partners at + hd/2.
__device__ __forceinline__ int rope_feature(const matvec_rope_args &r, int role, int n)
{
    if (role == MATVEC_V || !r.post.neox) return n;
    const int hd = r.post.hd, h = n / hd, o = n % hd, w = o % 8, p = o / 8;
    return h * hd + (w < 4 ? 4 * p + w : hd / 2 + 4 * p + w - 4);
}

// matvec_rope's epilogue, qkv_post for one token: every warp's lane 0 has put its feature's
// value (bias added) in res[warp]; n is the block's feature of warp 0 before the pairing.
// Rotate the 4 pairs (Q, K) and write Q to y, K and V as FP16 into the cache row of the
// token's position, as qkv_post would.
__device__ __forceinline__ void rope_epilogue(const matvec_rope_args &r, const matvec_seg &sg, int role, int n,
                                              const float *res)
{
    const qkv_post_args &p = r.post;
    const int j = threadIdx.x, hd = p.hd, h = n / hd, o = n % hd, pos = p.pos[0];
    const size_t off = role == MATVEC_Q ? 0
                                        : gpu_kv_offset(p.tables[(size_t)p.seq[0] * p.table_width + pos / GPU_KV_BLOCK],
                                                        p.n_layer, p.layer, p.n_kv, h, pos % GPU_KV_BLOCK, hd);
    if (role == MATVEC_V) {
        if (j < MATVEC_WARPS) p.vc[off + o + j] = __float2half_rn(res[j]);
        return;
    }
    if (j >= MATVEC_WARPS / 2) return;
    const int i = p.neox ? 4 * (o / 8) + j : o / 2 + j; // the pair
    const float2 v = rope_pair(p.neox ? res[j] : res[2 * j], p.neox ? res[4 + j] : res[2 * j + 1], i, pos, p);
    const int2 ix = rope_index(i, hd, p.neox);
    if (role == MATVEC_Q) {
        sg.y[h * hd + ix.x] = v.x;
        sg.y[h * hd + ix.y] = v.y;
    } else {
        p.kc[off + ix.x] = __float2half_rn(v.x);
        p.kc[off + ix.y] = __float2half_rn(v.y);
    }
}

// The batch-1 step's RMSNorms carried by the products around them (gpu_shared.h matvec_norm):
// NORM_IN reads the norm's input and scales its sums in its epilogue, NORM_OUT adds into the
// residual stream and writes the next norm's input.  Kernels of their own (matvec_rope_norm_*,
// glu_norm_*, matvec_res_*): code in the shared kernels costs the others registers, and so
// resident warps, even where it does not run (docs/benchmarks.md, "Batch-1 decode launches").

// A NORM_OUT producer's new residual value v of feature n as the next norm's input fp16(v w c)
// (norm_input_store: and its remainder where the norm's consumer reads one).
__device__ __forceinline__ void norm_out_feature(const matvec_norm &nm, int n, float v)
{
    norm_input_store(nm.xw, nm.xw_lo, n, ldexpf(v * nm.w[n], -norm_exp(nm.ss[0], nm.n)));
}

// NORM_OUT's epilogue: lane 0 of each warp holds v, its feature n's new residual value (not
// live: past the rows, none): the next norm's input fp16(v w c), and the block's sum of
// squares, its warps' in order, as partial `part` (the block's group of MATVEC_NORM_GROUP
// features).  Every thread of the block calls it.
__device__ __forceinline__ void norm_out(const matvec_norm &nm, int n, float v, bool live, int part)
{
    static_assert(MATVEC_WARPS == MATVEC_NORM_GROUP, "a block's partial covers the features part[] is sized for");
    __shared__ float sq[MATVEC_WARPS];
    if ((threadIdx.x & 31) == 0) {
        sq[threadIdx.x >> 5] = live ? v * v : 0.0f;
        if (live) norm_out_feature(nm, n, v);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < MATVEC_WARPS; i++) s += sq[i];
        nm.part[part] = s;
    }
}

// Features n0 .. n0 + NR - 1 of a launch over a's segments: each one's segment sr, row nr in it
// and weight row (past the last feature: segment n_seg, segment 0's first row).
template <int NR>
__device__ __forceinline__ void seg_rows(const matvec_args &a, int n0, int sr[NR], int nr[NR], const uint8_t *rows[NR])
{
#pragma unroll
    for (int r = 0; r < NR; r++) {
        int n = n0 + r, s = 0;
        while (s < a.n_seg && n >= a.seg[s].n) n -= a.seg[s++].n;
        sr[r] = s, nr[r] = n;
        rows[r] = s < a.n_seg ? a.seg[s].w + (size_t)n * a.row_bytes : a.seg[0].w;
    }
}

// matvec_args.x_lo (one token's h and its FP16 remainder as activation rows 0 and 1):
// MATVEC_LO_ROWS weight rows a warp, so that every input chunk a lane loads serves both.  At
// one row a warp the inputs' loads from L1 bound these products, not the weights' from DRAM
// (a warp reads the k FP16 inputs, twice with x_lo, per row of k/2 bytes of Q4_K: the two-row
// pass ran at 0.8 TB/s on the Qwen3.5-9B shape's Wqkv + Wgate).  Each row's sums are still
// row_dots' (its own, chunk by chunk), so the bits are those of one row a warp.  Rows past the
// last read row 0 again and write nothing.  NORM_IN (matvec_lo_nin_<type>, the batch-1 step's
// carried norm): x and x_lo are the norm's input xw and its scaled remainder (matvec_norm
// xw_lo), so the remainder's sums are scaled back by 2^-MATVEC_NORM_LO_SHIFT (exact) before
// they join x's, and the two by the norm's factor, as matvec_nin scales its sums; warps past
// the rows stay for norm_in_scale's barriers.
template <int T, int NORM = NORM_NONE>
__device__ __forceinline__ void matvec_lo_body(const matvec_args &a)
{
    static_assert(NORM == NORM_NONE || NORM == NORM_IN, "x_lo's products read a norm, never write one");
    constexpr int NR = MATVEC_LO_ROWS;
    const int n0 = (blockIdx.y * MATVEC_WARPS + (threadIdx.x >> 5)) * NR;
    int nr[NR], sr[NR];
    const uint8_t *rows[NR];
    seg_rows<NR>(a, n0, sr, nr, rows);
    const bool live = sr[0] < a.n_seg;
    if (!live && NORM == NORM_NONE) return;
    float acc[NR][2];
    if (live) row_dots<T, 2, NR>(rows, a, 0, acc);
    float sc = 1.0f;
    if constexpr (NORM == NORM_IN) sc = norm_in_scale(a.norm);
    if (!live || (threadIdx.x & 31) != 0) return;
#pragma unroll
    for (int r = 0; r < NR; r++) {
        if (sr[r] >= a.n_seg) break;
        const matvec_seg &sg = a.seg[sr[r]];
        float v = acc[r][0];
        if constexpr (NORM == NORM_IN) {
            if (sr[r] < a.lo_segs) v += ldexpf(acc[r][1], -MATVEC_NORM_LO_SHIFT);
            v *= sc;
        } else if (sr[r] < a.lo_segs) {
            v += acc[r][1]; // W x + W x_lo
        }
        v = v + (sg.bias ? sg.bias[nr[r]] : 0.0f);
        float *dst = sg.y + nr[r];
        *dst = a.accumulate ? *dst + v : v;
    }
}

// Rank dst's LL lines that rank src pushes into at parity par: [2][n_ranks][ll_cap / 2] 16-byte
// lines after the slots in dst's exchange buffer xbuf (gpu_shared.h gpu_ar_args), two lines a
// float4, so float f of a push is 8-byte word f, {f's bits, epoch}.  tp_add's and ll_push's.
__device__ __forceinline__ uint4 *ll_lines_at(float *xbuf, int n_ranks, unsigned long long cap,
                                              unsigned long long ll_cap, int par, int src)
{
    return (uint4 *)(xbuf + 2ull * n_ranks * cap) + ((size_t)par * n_ranks + src) * (ll_cap / 2);
}

// matvec_ll_push: feature n's sum v as the LL word {v, e} in every other rank's lines of this
// rank, e the epoch the tp_add launch after this product takes (its counter + 1; every LL
// block's counter is the same), in one 8-byte store (a reader sees the word whole or not at all)
__device__ __forceinline__ void ll_push(const matvec_ll_push &p, int n, float v)
{
    const uint32_t e = *p.epoch + 1;
    for (int s = 0; s < p.n_ranks; s++) {
        if (s == p.rank) continue;
        uint2 *w = (uint2 *)ll_lines_at(p.xbuf[s], p.n_ranks, p.cap, p.ll_cap, e & 1, p.rank) + n;
        asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(w), "r"(__float_as_uint(v)), "r"(e) : "memory");
    }
}

// One warp per output feature (across the segments); blockIdx.x walks groups of MT rows
// fastest, so blocks that share weight rows run together and re-read them from L2.  ROPE: the
// QKV product of one token with qkv_post in its epilogue (matvec_rope_<suffix>; rp its args).
// Q8: the dp4a products (matvec_dp4a_<suffix>, matvec_rope_dp4a_<suffix>).  NORM: above (one
// row: NORM_IN with or without ROPE, NORM_OUT as the residual add, a.accumulate).
template <int T, int MT, bool ROPE = false, bool Q8 = false, int NORM = NORM_NONE>
__device__ __forceinline__ void matvec_body(const matvec_args &a, const matvec_rope_args *rp = nullptr)
{
    static_assert(NORM == NORM_NONE || (MT == 1 && !Q8 && (!ROPE || NORM == NORM_IN)), "the norms' products");
    if constexpr (MT == 2 && !ROPE && !Q8 && NORM == NORM_NONE)
        if (a.x_lo) {
            matvec_lo_body<T>(a);
            return;
        }
    int n = ((int)blockIdx.y - a.block0) * MATVEC_WARPS + (threadIdx.x >> 5), m0 = blockIdx.x * MT, s = 0;
    while (s < a.n_seg && n >= a.seg[s].n) n -= a.seg[s++].n;
    // past the rows (never with ROPE: whole blocks): nothing to do but meet the norms' barriers
    const bool live = s < a.n_seg;
    if (!live && NORM == NORM_NONE) return;
    const matvec_seg &sg = a.seg[live ? s : 0];
    int role = 0, n0 = n - n % MATVEC_WARPS;
    if constexpr (ROPE) {
        role = rp->role0 + s;
        n = rope_feature(*rp, role, n);
    }
    const uint8_t *rows[1] = {sg.w + (size_t)n * a.row_bytes};
    float acc[1][MT];
    // (the batch-1 step's QKV with its norm and its residual products load a pass ahead; the
    // plain matvec_nin not: unmeasured)
    if (live) dots<T, MT, 1, Q8, NORM == NORM_OUT || (ROPE && NORM == NORM_IN)>(rows, a, m0, acc);
    if constexpr (ROPE) {
        __shared__ float res[MATVEC_WARPS];
        float v = acc[0][0];
        if constexpr (NORM == NORM_IN) v *= norm_in_scale(a.norm);
        if ((threadIdx.x & 31) == 0) res[threadIdx.x >> 5] = v + (sg.bias ? sg.bias[n] : 0.0f);
        __syncthreads();
        rope_epilogue(*rp, sg, role, n0, res);
        return;
    }
    if constexpr (NORM == NORM_OUT) { // x[n] += W h, as below, then the next norm's input
        float v = 0.0f;
        if (live && (threadIdx.x & 31) == 0) {
            // a gated shared expert's add: shexp_add's one fmaf (ungated, fmaf(1, s, x) = x + s)
            const float gate = a.res_gate ? sigmoidf_(*a.res_gate) : 1.0f;
            float *dst = sg.y + n;
            v = fmaf(gate, acc[0][0] + (sg.bias ? sg.bias[n] : 0.0f), *dst);
            *dst = v;
        }
        norm_out(a.norm, n, v, live, blockIdx.y);
        return;
    }
    if constexpr (NORM == NORM_IN) { // (not ROPE) the plain epilogue over the scaled sums
        const float sc = norm_in_scale(a.norm);
        if (live) acc[0][0] *= sc;
    }
    if (!live || (threadIdx.x & 31) != 0) return;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (m0 + i >= a.m) break;
        float v = acc[0][i] + (sg.bias ? sg.bias[n] : 0.0f);
        float *dst = sg.y + (size_t)(m0 + i) * sg.ldy + n;
        *dst = a.accumulate ? *dst + v : v;
        if constexpr (MT == 1 && !ROPE && !Q8 && NORM == NORM_NONE)
            if (a.push.epoch) ll_push(a.push, n, v); // (one row, one segment, no accumulate: the host's)
    }
}

// The one-row plain products of a single segment (matvec_one_<type>; gpu_forward.c matvec_one_fn
// picks them: the batch-1 LM head), MATVEC_ONE_WARPS rows a block, without matvec_body's segment
// walk, row groups and epilogues: Q6_K's takes 50 registers where matvec_q6_k_1 takes 43 (ptxas
// -v, sm_90a), and alone in scripts/mvbench.cu runs the 8B / 1.5B LM heads 4 % / 11 % faster
// (docs/benchmarks.md "The Q6_K LM head in one segment").  The same row_dots and the same
// epilogue expression as matvec_body at one row: the same bits as matvec_<type>_1.
template <int T>
__device__ __forceinline__ void matvec_one_body(const matvec_args &a)
{
    const matvec_seg &sg = a.seg[0];
    const int n = blockIdx.y * MATVEC_ONE_WARPS + (threadIdx.x >> 5);
    if (n >= sg.n) return;
    const uint8_t *rows[1] = {sg.w + (size_t)n * a.row_bytes};
    float acc[1][1];
    row_dots<T, 1, 1>(rows, a, 0, acc);
    if ((threadIdx.x & 31) != 0) return;
    const float v = acc[0][0] + (sg.bias ? sg.bias[n] : 0.0f);
    sg.y[n] = a.accumulate ? sg.y[n] + v : v;
}

// One per row of GPU_MATVEC_ONE_KERNELS.
#define MATVEC_ONE_KERNEL(name, TYPE)                                                            \
    extern "C" __global__ void __launch_bounds__(MATVEC_ONE_WARPS * 32)                          \
        name(matvec_args a) { pdl_enter(); matvec_one_body<T_##TYPE>(a); }
GPU_MATVEC_ONE_KERNELS(MATVEC_ONE_KERNEL)

// The wide models' one-activation-row products (matvec_wide<KS>_<type>; gpu_forward.c
// matvec_wide_split picks the shapes): a block of MATVEC_WIDE_WARPS warps in groups of KS
// warps, each group KS rows (MATVEC_WIDE_ROWS a block), warp w taking its group's rows over the
// contiguous k part w % KS (row_dots_span: its lanes stride over that part's chunks, each input
// chunk loaded and converted once for the KS rows).  A warp's rows share its input loads, which
// bound the one-row layout at these widths (its warps read k FP16 inputs per row of k/2 bytes of
// Q4_K), while the rows a block stay few enough to keep several waves of blocks (two rows a
// warp over the whole row halves them: slower, docs/benchmarks.md "Two rows a warp over half of
// k").  The KS partial sums of a row are added in part order by the group's first warp: a fixed
// order, so the same bits every run, but not row_dots' (a lane's chunk sequence is cut), so
// last-bit differences from matvec_<type>_1.  Rows past the last read row 0 and write nothing;
// no early return: every warp meets the barrier.
template <int T, int KS>
__device__ __forceinline__ void matvec_wide_body(const matvec_args &a)
{
    constexpr int NR = KS; // rows a warp
    static_assert(MATVEC_WIDE_WARPS / KS * NR == MATVEC_WIDE_ROWS, "a block's groups cover its rows");
    __shared__ float part[MATVEC_WIDE_WARPS][NR];
    const int wi = threadIdx.x >> 5, h = wi % KS, lane = threadIdx.x & 31;
    const int n0 = blockIdx.y * MATVEC_WIDE_ROWS + wi / KS * NR;
    int nr[NR], sr[NR];
    const uint8_t *rows[NR];
    seg_rows<NR>(a, n0, sr, nr, rows);
    const int nchunks = a.k / 32;
    float acc[NR][1];
    row_dots_span<T, 1, NR>(rows, a, 0, h * nchunks / KS, (h + 1) * nchunks / KS, acc);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < NR; r++) part[wi][r] = acc[r][0];
    __syncthreads();
    if (h != 0 || lane != 0) return;
#pragma unroll
    for (int r = 0; r < NR; r++) {
        if (sr[r] >= a.n_seg) break;
        const matvec_seg &sg = a.seg[sr[r]];
        float v = part[wi][r];
#pragma unroll
        for (int i = 1; i < KS; i++) v += part[wi + i][r];
        v = v + (sg.bias ? sg.bias[nr[r]] : 0.0f);
        float *dst = sg.y + nr[r];
        *dst = a.accumulate ? *dst + v : v;
    }
}

// One per row of GPU_MATVEC_WIDE_KERNELS.
#define MATVEC_WIDE_KERNEL(name, TYPE, KS)                                                        \
    extern "C" __global__ void __launch_bounds__(MATVEC_WIDE_WARPS * 32) name(matvec_args a)     \
    {                                                                                            \
        pdl_enter();                                                                             \
        matvec_wide_body<T_##TYPE, KS>(a);                                                       \
    }
GPU_MATVEC_WIDE_KERNELS(MATVEC_WIDE_KERNEL)

// Gate and up rows n of segments 0 and 1: yh[m][n] = fp16(glu_act(gate, up)): silu(gate) * up,
// gpt-oss's clamped SwiGLU or GeGLU.  NORM_IN: gate and up over the carried norm's input (one row).
template <int T, int MT, bool Q8 = false, int NORM = NORM_NONE>
__device__ __forceinline__ void glu_body(const matvec_args &a)
{
    static_assert(NORM == NORM_NONE || (NORM == NORM_IN && MT == 1 && !Q8), "the norms' products");
    int n = blockIdx.y * MATVEC_WARPS + (threadIdx.x >> 5), m0 = blockIdx.x * MT;
    const bool live = n < a.seg[0].n; // past the rows: nothing to do but meet NORM_IN's barriers
    if (!live && NORM != NORM_IN) return;
    const uint8_t *rows[2] = {a.seg[0].w + (size_t)n * a.row_bytes, a.seg[1].w + (size_t)n * a.row_bytes};
    float gu[2][MT];
    if (live) dots<T, MT, 2, Q8, NORM == NORM_IN>(rows, a, m0, gu);
    if constexpr (NORM == NORM_IN) {
        const float sc = norm_in_scale(a.norm);
        gu[0][0] *= sc, gu[1][0] *= sc;
    }
    if (!live || (threadIdx.x & 31) != 0) return;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (m0 + i >= a.m) break;
        a.yh[(size_t)(m0 + i) * a.seg[0].ldy + n] = __float2half_rn(glu_act(gu[0][i], gu[1][i], a.glu_limit, a.glu_alpha, a.glu_gelu));
    }
}

// One pair per row of GPU_MATVEC_KERNELS (../gpu_kernel_names.h), under the row's names.
#define MATVEC_KERNELS(matvec_name, glu_name, TYPE, MT)                                          \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        matvec_name(matvec_args a) { pdl_enter(); matvec_body<T_##TYPE, MT>(a); }                \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        glu_name(matvec_args a) { pdl_enter(); glu_body<T_##TYPE, MT>(a); }
GPU_MATVEC_KERNELS(MATVEC_KERNELS)

// One per row of GPU_MATVEC_ROPE_KERNELS: one token's QKV product with qkv_post in its epilogue.
#define MATVEC_ROPE_KERNEL(name, TYPE)                                                           \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) name(matvec_rope_args r)     \
    { pdl_enter();                                                                               \
        matvec_body<T_##TYPE, 1, true>(r.mv, &r);                                                \
    }
GPU_MATVEC_ROPE_KERNELS(MATVEC_ROPE_KERNEL)

// One triple per row of GPU_MATVEC_DP4A_KERNELS: the one-row products over q8 activations.
#define MATVEC_DP4A_KERNELS(matvec_name, glu_name, rope_name, TYPE)                              \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        matvec_name(matvec_args a) { pdl_enter(); matvec_body<T_##TYPE, 1, false, true>(a); }    \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        glu_name(matvec_args a) { pdl_enter(); glu_body<T_##TYPE, 1, true>(a); }                 \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) rope_name(matvec_rope_args r) \
    { pdl_enter();                                                                               \
        matvec_body<T_##TYPE, 1, true, true>(r.mv, &r);                                          \
    }
GPU_MATVEC_DP4A_KERNELS(MATVEC_DP4A_KERNELS)

// The resident blocks a multiprocessor keeps of matvec_rope_<type> (256 threads a block),
// which matvec_rope_norm_<type> is held to: left to itself the compiler gives the norm's
// variant 8 registers more (48 for Q4_K, 40 for Q4_0 and Q8_0: a block or two an SM fewer;
// ptxas -v, sm_90a), and none spills at these bounds (F16 would at 8: 6 is its unbounded 40).
template <int T> struct rope_norm_blocks; // every format of GPU_MATVEC_NORM_KERNELS (the low-bit ones:
                                          // their matvec_rope_<type>'s too, Q2_K 56 registers, Q3_K 44)
template <> struct rope_norm_blocks<T_F16> { static constexpr int n = 6; };
template <> struct rope_norm_blocks<T_Q4_0> { static constexpr int n = 8; };
template <> struct rope_norm_blocks<T_Q5_0> { static constexpr int n = 8; }; // (Q4_0's: not measured)
template <> struct rope_norm_blocks<T_Q8_0> { static constexpr int n = 8; };
template <> struct rope_norm_blocks<T_Q4_K> { static constexpr int n = 6; };
template <> struct rope_norm_blocks<T_Q5_K> { static constexpr int n = 4; };
template <> struct rope_norm_blocks<T_Q6_K> { static constexpr int n = 5; };
template <> struct rope_norm_blocks<T_Q2_K> { static constexpr int n = 4; };
template <> struct rope_norm_blocks<T_Q3_K> { static constexpr int n = 5; };
template <> struct rope_norm_blocks<T_IQ4_XS> { static constexpr int n = 4; };

// The same bound for glu_norm_<type> where its unbounded registers would cost resident blocks
// against glu_<type>_1 (0: unbounded).  IQ4_XS's glu_norm: 62 registers unbounded against glu's
// 44, a block an SM fewer (the -7 % its batch 1 measured carried before, docs/benchmarks.md);
// held to 5 blocks it takes 48 and spills 20 bytes.  matvec_res / matvec_nin stay unbounded for
// every format (IQ4_XS's at 48: held to matvec_iq4_xs_1's 6 blocks (40) they spill 40-48 bytes).
template <int T> struct glu_norm_blocks { static constexpr int n = 0; };
template <> struct glu_norm_blocks<T_IQ4_XS> { static constexpr int n = 5; };

// One quadruple per row of GPU_MATVEC_NORM_KERNELS: the batch-1 products that carry its norms.
#define MATVEC_NORM_KERNELS(rope_name, glu_name, res_name, nin_name, TYPE)                       \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32, rope_norm_blocks<T_##TYPE>::n) \
        rope_name(matvec_rope_args r)                                                            \
    { pdl_enter();                                                                               \
        matvec_body<T_##TYPE, 1, true, false, NORM_IN>(r.mv, &r);                                \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32, glu_norm_blocks<T_##TYPE>::n) \
        glu_name(matvec_args a) { pdl_enter(); glu_body<T_##TYPE, 1, false, NORM_IN>(a); }       \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        res_name(matvec_args a) { pdl_enter(); matvec_body<T_##TYPE, 1, false, false, NORM_OUT>(a); } \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32)                              \
        nin_name(matvec_args a) { pdl_enter(); matvec_body<T_##TYPE, 1, false, false, NORM_IN>(a); }
GPU_MATVEC_NORM_KERNELS(MATVEC_NORM_KERNELS)

// One pair per row of GPU_MATVEC_PAIR_KERNELS: the batch-1 QKV product over two formats, grid
// rows below b's block0 in format A over a's outputs, the rest in B over b's (each block
// wholly one or the other, so the epilogues' barriers hold).  Held to the fewer resident
// blocks of the two formats' matvec_rope_norm bounds: registers for the larger body.
constexpr int pair_blocks(int a, int b) { return a < b ? a : b; }
#define MATVEC_PAIR_KERNELS(rope_name, nin_name, TA, TB)                                                  \
    extern "C" __global__ void __launch_bounds__(                                                         \
        MATVEC_WARPS * 32, pair_blocks(rope_norm_blocks<T_##TA>::n, rope_norm_blocks<T_##TB>::n))          \
        rope_name(matvec_rope_pair_args p)                                                                \
    { pdl_enter();                                                                                        \
        if ((int)blockIdx.y < p.b.mv.block0) matvec_body<T_##TA, 1, true, false, NORM_IN>(p.a.mv, &p.a);  \
        else matvec_body<T_##TB, 1, true, false, NORM_IN>(p.b.mv, &p.b);                                  \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) nin_name(matvec_pair_args p)          \
    { pdl_enter();                                                                                        \
        if ((int)blockIdx.y < p.b.block0) matvec_body<T_##TA, 1, false, false, NORM_IN>(p.a);             \
        else matvec_body<T_##TB, 1, false, false, NORM_IN>(p.b);                                          \
    }
GPU_MATVEC_PAIR_KERNELS(MATVEC_PAIR_KERNELS)

// One per row of GPU_MATVEC_LO_NORM_KERNELS: a DeltaNet layer's input product over the carried
// norm and its remainder (matvec_lo_body's NORM_IN).
#define MATVEC_LO_NORM_KERNEL(name, TYPE)                                                        \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32) name(matvec_args a)          \
    { pdl_enter();                                                                               \
        matvec_lo_body<T_##TYPE, NORM_IN>(a);                                                    \
    }
GPU_MATVEC_LO_NORM_KERNELS(MATVEC_LO_NORM_KERNEL)

// W (n rows of k) -> FP16 row-major [n][k], one 32-weight chunk per thread.
template <int T>
__device__ __forceinline__ void dequant_f16_body(const uint8_t *w, unsigned long long row_bytes,
                                                 int k, int n, __half *out)
{
    size_t chunks_per_row = k / 32, total = chunks_per_row * (size_t)n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / chunks_per_row;
        int c = (int)(i - r * chunks_per_row);
        __half2 h[16];
        load_chunk_h<T>(w + r * row_bytes, c, h);
        uint4 *dst = (uint4 *)(out + r * k + 32 * (size_t)c);
#pragma unroll
        for (int j = 0; j < 4; j++) dst[j] = ((const uint4 *)h)[j];
    }
}

// Embedding gather: x[t] = dequantised row tok[t] of the table (n_embd = k), in FP32.
template <int T>
__device__ __forceinline__ void embed_body(const uint8_t *w, unsigned long long row_bytes, int k,
                                           const int *tok, float *x)
{
    int t = blockIdx.x;
    const uint8_t *row = w + (size_t)tok[t] * row_bytes;
    for (int c = threadIdx.x; c < k / 32; c += blockDim.x) {
        float v[32];
        load_chunk<T>(row, c, v);
        float4 *dst = (float4 *)(x + (size_t)t * k + 32 * c);
#pragma unroll
        for (int j = 0; j < 8; j++) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    }
}

// One pair per row of GPU_DEQUANT_KERNELS (../gpu_kernel_names.h), under the row's names.
#define DEQUANT_KERNELS(dequant_name, embed_name, TYPE)                                          \
    extern "C" __global__ void dequant_name(const uint8_t *w, unsigned long long row_bytes,      \
                                            int k, int n, __half *out)                           \
    { pdl_enter();                                                                               \
        dequant_f16_body<T_##TYPE>(w, row_bytes, k, n, out);                                     \
    }                                                                                            \
    extern "C" __global__ void embed_name(const uint8_t *w, unsigned long long row_bytes, int k, \
                                          const int *tok, float *x)                              \
    { pdl_enter();                                                                               \
        embed_body<T_##TYPE>(w, row_bytes, k, tok, x);                                           \
    }
GPU_DEQUANT_KERNELS(DEQUANT_KERNELS)
