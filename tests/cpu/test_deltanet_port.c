/* test_deltanet_port.c - a port to C of the GPU's gated delta rule (src/gpu/kernels/
 * deltanet.cuh: delta_chunk_prep, delta_chunk_state, delta_chunk_out for prompt steps,
 * delta_rule for decode) and of the host's chunk list (gpu_engine.c: pack_step), one thread at
 * a time: every block of the launch geometry gpu_forward.c gives, its threads run phase by phase
 * between the kernel's __syncthreads, with the kernel's index math, shared arrays and per-thread
 * registers.  Checked against cpu_delta_run's exact recurrence (the CPU engine's) on random
 * inputs of the hybrids' shapes: sequences of 1, 63, 64, 65, 70, 128 and 130 tokens alone and
 * packed into one step (a sequence starting mid-batch, mid-chunk), a prefill then decode steps
 * from the state it leaves, with strong and weak decays and correlated keys, both head orders,
 * d = 16 (../shared/reference's files) and 128 (the real models).  The port runs without a
 * device, so the kernels' algebra and indexing are checked in CI; what a port cannot see
 * (races, launch limits, the compiler) is test_gpu_kernels' delta rule case on the device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/cpu_ops.h"
#include "delta_util.h"
#include "gpu/gpu_shared.h"

#define WARP 32
#define THREADS (GPU_SSM_WARPS * WARP)
#define MAX_ROWS (GPU_SSM_MAX_D / GPU_SSM_WARPS)
#define CHUNK_THREADS 256 /* delta_chunk_prep / delta_chunk_out's block */

/* One problem: packed tokens of n_seq sequences, their q/k/v rows, gates and state slots. */
typedef struct problem {
    int d, kh, vh, chan, grouped, n_seq, n_tok;
    int first[8], n[8], slot[8];
    float *mix, *beta, *g; /* [t][chan], [t][vh] */
    float *state;          /* [slots][vh][d][d] */
} problem;

static ssm_args args_of(const problem *p, const gpu_ssm_seq *seqs, float *out)
{
    return (ssm_args){.seqs = seqs, .mix = p->mix, .state = p->state, .out = out, .beta = p->beta, .g = p->g,
                      .slot_stride = (long long)p->vh * p->d * p->d, .conv_off = 0, .delta_off = 0,
                      .chan = p->chan, .d = p->d, .k_heads = p->kh, .v_heads = p->vh, .grouped = p->grouped};
}

static int k_head(const ssm_args *a, int h)
{
    const int per_k = a->v_heads / a->k_heads;
    return a->grouped ? h / per_k : h % a->k_heads;
}

/* The per-thread registers of a (sequence, v head, 32 columns) block: S's rows i0.. of column j. */
typedef struct block_regs {
    float r[THREADS][MAX_ROWS];
} block_regs;

static float *head_state(const ssm_args *a, gpu_ssm_seq s, int h)
{
    return a->state + (size_t)s.state * a->slot_stride + a->delta_off + (size_t)h * a->d * a->d;
}

static void load_regs(const ssm_args *a, gpu_ssm_seq s, int h, int bz, block_regs *R)
{
    const int d = a->d, rows = (d + GPU_SSM_WARPS - 1) / GPU_SSM_WARPS;
    const float *S = head_state(a, s, h);
    for (int tid = 0; tid < THREADS; tid++) {
        const int lane = tid & 31, w = tid >> 5, j = bz * WARP + lane, i0 = w * rows;
        const bool col = j < d;
        for (int ii = 0; ii < MAX_ROWS; ii++)
            R->r[tid][ii] = col && ii < rows && i0 + ii < d ? S[(size_t)(i0 + ii) * d + j] : 0.0f;
    }
}

static void store_regs(const ssm_args *a, gpu_ssm_seq s, int h, int bz, const block_regs *R)
{
    const int d = a->d, rows = (d + GPU_SSM_WARPS - 1) / GPU_SSM_WARPS;
    float *S = head_state(a, s, h);
    for (int tid = 0; tid < THREADS; tid++) {
        const int lane = tid & 31, w = tid >> 5, j = bz * WARP + lane, i0 = w * rows;
        for (int ii = 0; ii < MAX_ROWS; ii++)
            if (j < d && ii < rows && i0 + ii < d) S[(size_t)(i0 + ii) * d + j] = R->r[tid][ii];
    }
}

#define C GPU_SSM_CHUNK
#define CB GPU_SSM_COLS

/* dn_stage: buf[r][i] (row stride ld) = src[r][i] * (scale ? scale[r] : 1) for r < n, i < w of a
 * width-column slice, 0 elsewhere (every thread's share: the whole tile). */
static void port_stage(float *buf, int ld, int width, const float *src, size_t stride, int n, int w, const float *scale)
{
    for (int idx = 0; idx < C * width; idx++) {
        const int r = idx / width, i = idx % width;
        float v = 0.0f;
        if (r < n && i < w) v = src[(size_t)r * stride + i] * (scale ? scale[r] : 1.0f);
        buf[r * ld + i] = v;
    }
}

/* dn_tile_lr for thread (ta, tb) */
static void port_tile_lr(float acc[4][4], const float *L, int ldl, const float *R, int ldr, int bmax, int ta, int tb)
{
    for (int b = 0; b < bmax; b++)
        for (int r = 0; r < 4; r++)
            for (int s = 0; s < 4; s++) acc[r][s] += L[(4 * ta + r) * ldl + b] * R[b * ldr + tb + 16 * s];
}

/* dn_tile_xyt for thread (ta, tb) */
static void port_tile_xyt(float acc[4][4], const float *X, const float *Y, int ld, int w, int ta, int tb)
{
    for (int i = 0; i < w; i++)
        for (int r = 0; r < 4; r++)
            for (int s = 0; s < 4; s++) acc[r][s] += X[(4 * ta + r) * ld + i] * Y[(tb + 16 * s) * ld + i];
}

static int imin(int x, int y) { return x < y ? x : y; }

/* dn_lower_times: dst[a][j] (=, or += with acc) (L x)[a][j], x's 64-column slices staged in buf */
static void port_lower_times(const float *L, float *buf, const float *src, size_t stride, const float *scale, int n,
                             int d, float *dst, size_t ldd, bool acc)
{
    for (int i0 = 0; i0 < d; i0 += C) {
        const int w = imin(C, d - i0);
        port_stage(buf, C + 1, C, src + i0, stride, n, w, scale);
        for (int tid = 0; tid < CHUNK_THREADS; tid++) {
            const int ta = tid >> 4, tb = tid & 15;
            float o[4][4] = {{0}};
            port_tile_lr(o, L, C + 1, buf, C + 1, imin(n, 4 * ta + 4), ta, tb);
            for (int r = 0; r < 4; r++)
                for (int s = 0; s < 4; s++) {
                    const int ia = 4 * ta + r, j = tb + 16 * s;
                    if (ia >= n || j >= w) continue;
                    float *y = dst + (size_t)ia * ldd + i0 + j;
                    *y = acc ? *y + o[r][s] : o[r][s];
                }
        }
    }
}

/* ---- delta_chunk_prep: grid (chunks, v_heads), 256 threads ---- */
static void port_chunk_prep(const ssm_args *a, const gpu_ssm_seq *chunks, int n_chunks, float *U, float *W, float *Gc)
{
    static float buf[C * (C + 1)], sT[C][C + 1], sG[C], sB[C], sF[C], row[C], acc[CHUNK_THREADS][4][4];
    for (int bx = 0; bx < n_chunks; bx++)
        for (int h = 0; h < a->v_heads; h++) {
            const gpu_ssm_seq c = chunks[bx];
            const int d = a->d, nv = a->v_heads, n = c.n, t0 = c.first, kh = k_head(a, h);
            const int k_off = a->k_heads * d + kh * d, v_off = 2 * a->k_heads * d + h * d;
            const float *mix = a->mix + (size_t)t0 * a->chan;
            float g0[WARP], g1[WARP]; /* warp 0's scan: __shfl_up_sync steps 1, 2, 4, 8, 16 */
            for (int l = 0; l < WARP; l++) {
                g0[l] = l < n ? a->g[(size_t)(t0 + l) * nv + h] : 0.0f;
                g1[l] = l + WARP < n ? a->g[(size_t)(t0 + l + WARP) * nv + h] : 0.0f;
            }
            for (int o = 1; o < WARP; o <<= 1) {
                float u0[WARP], u1[WARP];
                memcpy(u0, g0, sizeof u0), memcpy(u1, g1, sizeof u1);
                for (int l = o; l < WARP; l++) g0[l] += u0[l - o], g1[l] += u1[l - o];
            }
            for (int l = 0; l < WARP; l++) sG[l] = g0[l], sG[l + WARP] = g1[l] + g0[WARP - 1];
            for (int tid = 0; tid < C; tid++) sB[tid] = tid < n ? a->beta[(size_t)(t0 + tid) * nv + h] : 0.0f;
            memset(acc, 0, sizeof acc);
            for (int i0 = 0; i0 < d; i0 += C) {
                const int w = imin(C, d - i0);
                port_stage(buf, C + 1, C, mix + k_off + i0, a->chan, n, w, NULL);
                for (int tid = 0; tid < CHUNK_THREADS; tid++) port_tile_xyt(acc[tid], buf, buf, C + 1, w, tid >> 4, tid & 15);
            }
            for (int tid = 0; tid < n; tid++) Gc[(size_t)(t0 + tid) * nv + h] = sG[tid];
            for (int tid = 0; tid < C; tid++) sF[tid] = sB[tid] * expf(sG[tid]);
            for (int tid = 0; tid < CHUNK_THREADS; tid++)
                for (int r = 0; r < 4; r++)
                    for (int s = 0; s < 4; s++) {
                        const int ia = 4 * (tid >> 4) + r, ib = (tid & 15) + 16 * s;
                        sT[ia][ib] = ib < ia && ia < n ? -sB[ia] * acc[tid][r][s] * expf(sG[ia] - sG[ib]) : 0.0f;
                    }
            for (int ia = 1; ia < n; ia++) { /* column b's sum over 4 lanes, then the two shuffles */
                for (int tid = 0; tid < ia; tid++) row[tid] = sT[ia][tid];
                for (int col = 0; col < ia; col++) {
                    float t[4] = {0};
                    for (int q = 0; q < 4; q++)
                        for (int m = col + 1 + q; m < ia; m += 4) t[q] += row[m] * sT[m][col];
                    sT[ia][col] = row[col] + ((t[0] + t[1]) + (t[2] + t[3]));
                }
            }
            for (int tid = 0; tid < n; tid++) sT[tid][tid] = 1.0f;
            for (int pass = 0; pass < 2; pass++)
                port_lower_times(&sT[0][0], buf, mix + (pass ? k_off : v_off), a->chan, pass ? sF : sB, n, d,
                                 (pass ? W : U) + (size_t)t0 * nv * d + (size_t)h * d, (size_t)nv * d, false);
        }
}

/* dn_tile_quarter (W S0, q S0) for every thread, by output: acc[a][c][q] += the terms m = q (mod 4)
 * of chunk row a of src times S's column c, slice by slice (a tile's four lanes q, each its terms) */
static void port_rows_quarters(float acc[C][CB][4], float *buf, const float *src, size_t stride, int n, int d,
                               const float *S)
{
    for (int i0 = 0; i0 < d; i0 += C) {
        const int w = imin(C, d - i0);
        port_stage(buf, C + 1, C, src + i0, stride, n, w, NULL);
        for (int ia = 0; ia < C; ia++)
            for (int c = 0; c < CB; c++)
                for (int m = 0; m < w; m++) acc[ia][c][m & 3] += buf[ia * (C + 1) + m] * S[(i0 + m) * CB + c];
    }
}

/* dn_quarters: the four lanes' sums of one output, (q0 + q1) + (q2 + q3) */
static float port_quarters(const float p[4]) { return (p[0] + p[1]) + (p[2] + p[3]); }

/* ---- delta_chunk_state: grid (sequences, v_heads, ceil(d / GPU_SSM_COLS)), 256 threads ---- */
static void port_chunk_state(const ssm_args *a, int n_seq, float *U, const float *W, const float *Gc)
{
    static float sS[GPU_SSM_MAX_D * CB], buf[C * (C + 1)], sV[C][CB], sG[C], sE[C];
    static float pw[C][CB][4], pq[C][CB][4];
    const int d = a->d, nv = a->v_heads;
    for (int bx = 0; bx < n_seq; bx++)
        for (int h = 0; h < nv; h++)
            for (int bz = 0; bz < (d + CB - 1) / CB; bz++) {
                const gpu_ssm_seq s = a->seqs[bx];
                const int kh = k_head(a, h), q_off = kh * d, k_off = a->k_heads * d + kh * d, j0 = bz * CB;
                const int cols = imin(CB, d - j0);
                float *S = head_state(a, s, h);
                for (int idx = 0; idx < d * CB; idx++)
                    sS[idx] = idx % CB < cols ? S[(size_t)(idx / CB) * d + j0 + idx % CB] : 0.0f;
                const int end = s.first + s.n;
                for (int t0 = s.first; t0 < end; t0 += C) {
                    const int n = imin(C, end - t0);
                    const float *mix = a->mix + (size_t)t0 * a->chan;
                    for (int tid = 0; tid < C; tid++) sG[tid] = tid < n ? Gc[(size_t)(t0 + tid) * nv + h] : 0.0f;
                    memset(pw, 0, sizeof pw), memset(pq, 0, sizeof pq);
                    port_rows_quarters(pw, buf, W + (size_t)t0 * nv * d + (size_t)h * d, (size_t)nv * d, n, d, sS);
                    port_rows_quarters(pq, buf, mix + q_off, a->chan, n, d, sS);
                    for (int ia = 0; ia < C; ia++)
                        for (int c = 0; c < CB; c++) {
                            float vn = 0.0f;
                            if (ia < n && c < cols) {
                                const size_t o = (size_t)(t0 + ia) * nv * d + (size_t)h * d + j0 + c;
                                vn = U[o] - port_quarters(pw[ia][c]);
                                U[o] = vn;
                                a->out[o] = expf(sG[ia]) * port_quarters(pq[ia][c]);
                            }
                            sV[ia][c] = vn;
                        }
                    const float GL = sG[n - 1], el = expf(GL);
                    for (int tid = 0; tid < C; tid++) sE[tid] = tid < n ? expf(GL - sG[tid]) : 0.0f;
                    for (int i0 = 0; i0 < d; i0 += C) {
                        const int w = imin(C, d - i0);
                        port_stage(buf, C + 1, C, mix + k_off + i0, a->chan, n, w, sE);
                        for (int i = 0; i < w; i++) /* dn_tile_quarter (the update): quarters of each sum over b < n */
                            for (int c = 0; c < CB; c++) {
                                float p[4] = {0};
                                for (int b = 0; b < n; b++) p[b & 3] += buf[b * (C + 1) + i] * sV[b][c];
                                sS[(i0 + i) * CB + c] = el * sS[(i0 + i) * CB + c] + port_quarters(p);
                            }
                    }
                }
                for (int idx = 0; idx < d * CB; idx++)
                    if (idx % CB < cols) S[(size_t)(idx / CB) * d + j0 + idx % CB] = sS[idx];
            }
}

/* ---- delta_chunk_out: grid (chunks, v_heads), 256 threads ---- */
static void port_chunk_out(const ssm_args *a, const gpu_ssm_seq *chunks, int n_chunks, const float *U, const float *Gc)
{
    enum { QW = 32 };
    static float tile[2 * C * (QW + 1)], sQK[C][C + 1], sG[C], acc[CHUNK_THREADS][4][4];
    for (int bx = 0; bx < n_chunks; bx++)
        for (int h = 0; h < a->v_heads; h++) {
            const gpu_ssm_seq c = chunks[bx];
            const int d = a->d, nv = a->v_heads, n = c.n, t0 = c.first, kh = k_head(a, h);
            const int q_off = kh * d, k_off = a->k_heads * d + kh * d;
            const float *mix = a->mix + (size_t)t0 * a->chan;
            float *bq = tile, *bk = tile + C * (QW + 1);
            for (int tid = 0; tid < C; tid++) sG[tid] = tid < n ? Gc[(size_t)(t0 + tid) * nv + h] : 0.0f;
            memset(acc, 0, sizeof acc);
            for (int i0 = 0; i0 < d; i0 += QW) {
                const int w = imin(QW, d - i0);
                port_stage(bq, QW + 1, QW, mix + q_off + i0, a->chan, n, w, NULL);
                port_stage(bk, QW + 1, QW, mix + k_off + i0, a->chan, n, w, NULL);
                for (int tid = 0; tid < CHUNK_THREADS; tid++) port_tile_xyt(acc[tid], bq, bk, QW + 1, w, tid >> 4, tid & 15);
            }
            for (int tid = 0; tid < CHUNK_THREADS; tid++)
                for (int r = 0; r < 4; r++)
                    for (int s = 0; s < 4; s++) {
                        const int ia = 4 * (tid >> 4) + r, ib = (tid & 15) + 16 * s;
                        sQK[ia][ib] = ib <= ia && ia < n ? acc[tid][r][s] * expf(sG[ia] - sG[ib]) : 0.0f;
                    }
            port_lower_times(&sQK[0][0], tile, U + (size_t)t0 * nv * d + (size_t)h * d, (size_t)nv * d, NULL, n, d,
                             a->out + (size_t)t0 * nv * d + (size_t)h * d, (size_t)nv * d, true);
        }
}

/* ---- delta_rule: grid (sequences, v_heads, ceil(d / 32)), 8 warps ---- */
static void port_delta_rule(const ssm_args *a, int n_seq)
{
    static float sk[GPU_SSM_MAX_D], sq[GPU_SSM_MAX_D], red[GPU_SSM_WARPS][WARP], delta[THREADS];
    static block_regs R;
    const int d = a->d, rows = (d + GPU_SSM_WARPS - 1) / GPU_SSM_WARPS;
    for (int bx = 0; bx < n_seq; bx++)
        for (int h = 0; h < a->v_heads; h++)
            for (int bz = 0; bz < (d + 31) / 32; bz++) {
                const gpu_ssm_seq s = a->seqs[bx];
                const int kh = k_head(a, h), q_off = 0, k_off = a->k_heads * d, v_off = 2 * a->k_heads * d;
                load_regs(a, s, h, bz, &R);
                for (int t = s.first; t < s.first + s.n; t++) {
                    const float *x = a->mix + (size_t)t * a->chan;
                    for (int i = 0; i < d; i++) {
                        sk[i] = x[k_off + kh * d + i];
                        sq[i] = x[q_off + kh * d + i];
                    }
                    const float decay = expf(a->g[(size_t)t * a->v_heads + h]), beta = a->beta[(size_t)t * a->v_heads + h];
                    for (int tid = 0; tid < THREADS; tid++) {
                        const int lane = tid & 31, w = tid >> 5, i0 = w * rows;
                        float p = 0.0f, *r = R.r[tid];
                        for (int ii = 0; ii < MAX_ROWS; ii++)
                            if (ii < rows && i0 + ii < d) {
                                r[ii] *= decay;
                                p += r[ii] * sk[i0 + ii];
                            }
                        red[w][lane] = p;
                    }
                    for (int tid = 0; tid < THREADS; tid++) { /* __syncthreads */
                        const int lane = tid & 31, j = bz * WARP + lane;
                        float kv = 0.0f;
                        for (int u = 0; u < GPU_SSM_WARPS; u++) kv += red[u][lane];
                        delta[tid] = j < d ? beta * (x[v_off + h * d + j] - kv) : 0.0f;
                    }
                    for (int tid = 0; tid < THREADS; tid++) { /* __syncthreads */
                        const int lane = tid & 31, w = tid >> 5, i0 = w * rows;
                        float p = 0.0f, *r = R.r[tid];
                        for (int ii = 0; ii < MAX_ROWS; ii++)
                            if (ii < rows && i0 + ii < d) {
                                r[ii] += sk[i0 + ii] * delta[tid];
                                p += r[ii] * sq[i0 + ii];
                            }
                        red[w][lane] = p;
                    }
                    for (int lane = 0; lane < WARP; lane++) { /* __syncthreads; warp 0 */
                        const int j = bz * WARP + lane;
                        if (j >= d) continue;
                        float o = 0.0f;
                        for (int u = 0; u < GPU_SSM_WARPS; u++) o += red[u][lane];
                        a->out[(size_t)t * a->v_heads * d + (size_t)h * d + j] = o;
                    }
                }
                store_regs(a, s, h, bz, &R);
            }
}

/* pack_step's lists: a sequence each, and each sequence's chunks of GPU_SSM_CHUNK from its first token. */
static int pack_lists(const problem *p, const int *first, const int *n, gpu_ssm_seq *seqs, gpu_ssm_seq *chunks)
{
    int n_chunks = 0;
    for (int i = 0; i < p->n_seq; i++) {
        seqs[i] = (gpu_ssm_seq){.first = first[i], .n = n[i], .state = p->slot[i]};
        for (int j = 0; j < n[i]; j += GPU_SSM_CHUNK)
            chunks[n_chunks++] = (gpu_ssm_seq){.first = first[i] + j, .n = n[i] - j < GPU_SSM_CHUNK ? n[i] - j : GPU_SSM_CHUNK,
                                               .state = seqs[i].state};
    }
    return n_chunks;
}

/* The GPU's way through a step: the chunked launches (a prompt step) or delta_rule (a decode
 * graph: every sequence one token), as gpu_forward.c: attention_linear. */
static void gpu_port_step(const problem *p, const int *first, const int *n, bool chunked, float *out)
{
    gpu_ssm_seq seqs[8], chunks[64];
    const int n_chunks = pack_lists(p, first, n, seqs, chunks);
    const ssm_args a = args_of(p, seqs, out);
    if (chunked) {
        const size_t sz = (size_t)p->n_tok * p->vh * p->d;
        float *U = calloc(sz, sizeof *U), *W = calloc(sz, sizeof *W), *Gc = calloc((size_t)p->n_tok * p->vh, sizeof *Gc);
        port_chunk_prep(&a, chunks, n_chunks, U, W, Gc);
        port_chunk_state(&a, p->n_seq, U, W, Gc);
        port_chunk_out(&a, chunks, n_chunks, U, Gc);
        free(U), free(W), free(Gc);
    } else {
        port_delta_rule(&a, p->n_seq);
    }
}

/* The CPU engine's way: cpu_delta_run's exact recurrence (chunk 0). */
static cpu_pool *pool;

static void cpu_step(const problem *p, const int *first, const int *n, float *out)
{
    float *scratch = malloc((size_t)cpu_delta_scratch(p->d, 0) * sizeof(float));
    cpu_delta dr = {.out = out, .qkv = p->mix, .stride = p->chan, .q_off = 0, .k_off = (long)p->kh * p->d,
                    .v_off = 2L * p->kh * p->d, .beta = p->beta, .g = p->g, .state = p->state,
                    .slot_stride = (long)p->vh * p->d * p->d, .layer_off = 0, .seq_first = first, .seq_tokens = n,
                    .seq_state = p->slot, .n_seqs = p->n_seq, .v_heads = p->vh, .k_heads = p->kh, .d = p->d,
                    .grouped = p->grouped, .chunk = 0, .scratch = scratch};
    cpu_delta_run(pool, &dr);
    free(scratch);
}

/* How the inputs look: decays strong (g in [-2, 0]) or weak (g in [-0.05, 0], the state
 * remembers far back), keys independent or correlated (a shared direction plus noise, as a
 * SiLU'd projection gives: what makes the UT transform's triangular solve ill-conditioned). */
typedef struct shape {
    int d, kh, vh, grouped;
    float g_scale, k_common;
} shape;

static void fill(problem *p, const shape *sh, int n_tok, int n_slots, uint64_t seed)
{
    *p = (problem){.d = sh->d, .kh = sh->kh, .vh = sh->vh, .grouped = sh->grouped, .n_tok = n_tok};
    p->chan = 2 * p->kh * p->d + p->vh * p->d;
    p->mix = malloc((size_t)n_tok * p->chan * sizeof *p->mix);
    p->beta = malloc((size_t)n_tok * p->vh * sizeof *p->beta);
    p->g = malloc((size_t)n_tok * p->vh * sizeof *p->g);
    p->state = calloc((size_t)n_slots * p->vh * p->d * p->d, sizeof *p->state);
    uint64_t s = seed;
    float common[GPU_SSM_MAX_D];
    for (int i = 0; i < p->d; i++) common[i] = 2 * delta_uniform(&s) - 1;
    for (int t = 0; t < n_tok; t++) {
        float *row = p->mix + (size_t)t * p->chan;
        for (int c = 0; c < p->chan; c++) row[c] = 2 * delta_uniform(&s) - 1;
        for (int h = p->kh; h < 2 * p->kh; h++) /* k heads: toward the shared direction */
            for (int i = 0; i < p->d; i++) row[h * p->d + i] += sh->k_common * common[i];
        for (int h = 0; h < 2 * p->kh; h++) cpu_l2norm(row + h * p->d, p->d);
        for (int i = 0; i < p->kh * p->d; i++) row[i] /= sqrtf((float)p->d);
        for (int h = 0; h < p->vh; h++) {
            p->beta[t * p->vh + h] = delta_uniform(&s);
            p->g[t * p->vh + h] = -sh->g_scale * delta_uniform(&s);
        }
    }
}

static void drop(problem *p)
{
    free(p->mix), free(p->beta), free(p->g), free(p->state);
}

#define BOUND 1e-4 /* float rounding; a wrong index, decay or chunk boundary moves them by 1e-2 and more */

/* Sequences of lengths n[0..n_seq) packed in one prompt step (slots 1, 2, ...; slot 0 unused),
 * then `decode` single-token steps of them all: GPU port and CPU recurrence, outputs and states
 * compared after every step.  Returns the worst difference. */
static double check_case(const shape *sh, const int *n, int n_seq, int decode, uint64_t seed)
{
    int prompt = 0;
    for (int i = 0; i < n_seq; i++) prompt += n[i];
    const int n_tok = prompt + decode * n_seq, slots = n_seq + 1;
    problem cpu, gpu;
    fill(&cpu, sh, n_tok, slots, seed);
    fill(&gpu, sh, n_tok, slots, seed);
    cpu.n_seq = gpu.n_seq = n_seq;
    for (int i = 0; i < n_seq; i++) cpu.slot[i] = gpu.slot[i] = i + 1;
    const size_t out_n = (size_t)n_tok * sh->vh * sh->d, st_n = (size_t)slots * sh->vh * sh->d * sh->d;
    float *out_c = calloc(out_n, sizeof *out_c), *out_g = calloc(out_n, sizeof *out_g);
    int first[8], len[8], t = 0;
    for (int i = 0; i < n_seq; i++) first[i] = t, len[i] = n[i], t += n[i];
    double worst = 0;
    for (int step = 0; step <= decode; step++) {
        if (step) /* decode: one token each, packed after the prompt */
            for (int i = 0; i < n_seq; i++) first[i] = t++, len[i] = 1;
        cpu_step(&cpu, first, len, out_c);
        gpu_port_step(&gpu, first, len, step == 0, out_g);
        const double e_out = delta_rel_diff(out_g, out_c, out_n), e_st = delta_rel_diff(gpu.state, cpu.state, st_n);
        if (e_out > BOUND || e_st > BOUND)
            fail_msg("d %d, %d seqs (first %d tokens), %s step %d: outputs %.2e, states %.2e from the recurrence",
                     sh->d, n_seq, n[0], step ? "decode" : "prompt", step, e_out, e_st);
        worst = fmax(worst, fmax(e_out, e_st));
    }
    free(out_c), free(out_g);
    drop(&cpu), drop(&gpu);
    return worst;
}

static const int LENGTHS[] = {1, 63, 64, 65, 70, 128, 130};
#define N_LENGTHS (int)(sizeof LENGTHS / sizeof LENGTHS[0])

static void run_shape(const shape *sh, const char *label)
{
    double worst = 0;
    uint64_t seed = 1000;
    for (int i = 0; i < N_LENGTHS; i++) /* alone, then 3 decode steps */
        worst = fmax(worst, check_case(sh, &LENGTHS[i], 1, 3, seed++));
    static const int packs[][4] = {{70, 1, 130, 65}, {1, 64, 63, 128}, {5, 130, 1, 1}};
    for (size_t i = 0; i < sizeof packs / sizeof packs[0]; i++)
        worst = fmax(worst, check_case(sh, packs[i], 4, 2, seed++));
    print_message("  %-34s port of the GPU kernels within %.2e of the recurrence\n", label, worst);
}

static void test_port_reference_shape(void **state) /* ../shared/reference's: d 16, 4 v over 2 k heads */
{
    (void)state;
    const shape sh[] = {{16, 2, 4, 0, 2.0f, 0.0f}, {16, 2, 4, 0, 0.05f, 0.0f}, {16, 2, 4, 0, 0.05f, 1.5f},
                        {16, 2, 4, 1, 0.5f, 1.5f}};
    const char *labels[] = {"d 16 tiled, strong decay", "d 16 tiled, weak decay", "d 16 tiled, weak, correlated k",
                            "d 16 grouped, correlated k"};
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) run_shape(&sh[i], labels[i]);
}

static void test_port_real_shape(void **state) /* Qwen3.5's head width 128 (8 blocks of 16 state columns), 2 over 1 */
{
    (void)state;
    const shape sh = {128, 1, 2, 0, 0.05f, 1.5f};
    double worst = 0;
    static const int packs[][2] = {{130, 0}, {65, 70}};
    worst = fmax(worst, check_case(&sh, packs[0], 1, 2, 7));
    worst = fmax(worst, check_case(&sh, packs[1], 2, 2, 8));
    print_message("  d 128, weak decay, correlated k: port within %.2e of the recurrence\n", worst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_port_reference_shape), cmocka_unit_test(test_port_real_shape)};
    pool = cpu_pool_create(1);
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cpu_pool_free(pool);
    return rc;
}
