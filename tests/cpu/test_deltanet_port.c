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

static float dot_d(const float *x, const float *y, int d)
{
    float s = 0.0f;
    for (int i = 0; i < d; i++) s += x[i] * y[i];
    return s;
}

/* ---- delta_chunk_prep: grid (chunks, v_heads), 256 threads ---- */
static void port_chunk_prep(const ssm_args *a, const gpu_ssm_seq *chunks, int n_chunks, float *U, float *W, float *Gc)
{
    static float sT[GPU_SSM_CHUNK][GPU_SSM_CHUNK + 1], sG[GPU_SSM_CHUNK], sB[GPU_SSM_CHUNK], row[GPU_SSM_CHUNK];
    for (int bx = 0; bx < n_chunks; bx++)
        for (int h = 0; h < a->v_heads; h++) {
            const gpu_ssm_seq c = chunks[bx];
            const int d = a->d, nv = a->v_heads, n = c.n, t0 = c.first, kh = k_head(a, h);
            const int k_off = a->k_heads * d + kh * d, v_off = 2 * a->k_heads * d + h * d;
            for (int tid = 0; tid < CHUNK_THREADS; tid++) {
                if (tid == 0) {
                    float acc = 0.0f;
                    for (int i = 0; i < n; i++) sG[i] = acc += a->g[(size_t)(t0 + i) * nv + h];
                }
                if (tid < n) sB[tid] = a->beta[(size_t)(t0 + tid) * nv + h];
            }
            for (int tid = 0; tid < CHUNK_THREADS; tid++) { /* __syncthreads */
                if (tid < n) Gc[(size_t)(t0 + tid) * nv + h] = sG[tid];
                for (int idx = tid; idx < n * n; idx += CHUNK_THREADS) {
                    const int ia = idx / n, ib = idx % n;
                    float v = 0.0f;
                    if (ib < ia)
                        v = -sB[ia] *
                            dot_d(a->mix + (size_t)(t0 + ia) * a->chan + k_off, a->mix + (size_t)(t0 + ib) * a->chan + k_off, d) *
                            expf(sG[ia] - sG[ib]);
                    sT[ia][ib] = v;
                }
            }
            for (int ia = 1; ia < n; ia++) {
                for (int tid = 0; tid < ia; tid++) row[tid] = sT[ia][tid];
                for (int tid = 0; tid < ia; tid++) { /* __syncthreads */
                    float t = row[tid];
                    for (int m = tid + 1; m < ia; m++) t += row[m] * sT[m][tid];
                    sT[ia][tid] = t;
                }
            }
            for (int tid = 0; tid < CHUNK_THREADS; tid++)
                for (int idx = tid; idx < n * d; idx += CHUNK_THREADS) {
                    const int ia = idx / d, j = idx % d;
                    float u = 0.0f, w = 0.0f;
                    for (int ib = 0; ib <= ia; ib++) {
                        const float bb = sB[ib] * (ib == ia ? 1.0f : sT[ia][ib]);
                        const float *x = a->mix + (size_t)(t0 + ib) * a->chan;
                        u += bb * x[v_off + j];
                        w += bb * expf(sG[ib]) * x[k_off + j];
                    }
                    const size_t o = (size_t)(t0 + ia) * nv * d + (size_t)h * d + j;
                    U[o] = u;
                    W[o] = w;
                }
        }
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

/* ---- delta_chunk_state: grid (sequences, v_heads, ceil(d / 32)), 8 warps ---- */
static void port_chunk_state(const ssm_args *a, int n_seq, float *U, const float *W, const float *Gc)
{
    static float rw[GPU_SSM_WARPS][GPU_SSM_WARPS][WARP], rq[GPU_SSM_WARPS][GPU_SSM_WARPS][WARP];
    static float sVn[GPU_SSM_CHUNK][WARP];
    static block_regs R;
    const int d = a->d, nv = a->v_heads, rows = (d + GPU_SSM_WARPS - 1) / GPU_SSM_WARPS;
    for (int bx = 0; bx < n_seq; bx++)
        for (int h = 0; h < nv; h++)
            for (int bz = 0; bz < (d + 31) / 32; bz++) {
                const gpu_ssm_seq s = a->seqs[bx];
                const int kh = k_head(a, h), q_off = kh * d, k_off = a->k_heads * d + kh * d;
                load_regs(a, s, h, bz, &R);
                const int end = s.first + s.n;
                for (int t0 = s.first; t0 < end; t0 += GPU_SSM_CHUNK) {
                    const int n = end - t0 < GPU_SSM_CHUNK ? end - t0 : GPU_SSM_CHUNK;
                    for (int a0 = 0; a0 < n; a0 += GPU_SSM_WARPS) {
                        for (int tid = 0; tid < THREADS; tid++) {
                            const int lane = tid & 31, w = tid >> 5, i0 = w * rows;
                            const float *r = R.r[tid];
                            for (int u = 0; u < GPU_SSM_WARPS; u++) {
                                float pw = 0.0f, pq = 0.0f;
                                if (a0 + u < n) {
                                    const float *wr = W + (size_t)(t0 + a0 + u) * nv * d + (size_t)h * d;
                                    const float *q = a->mix + (size_t)(t0 + a0 + u) * a->chan + q_off;
                                    for (int ii = 0; ii < MAX_ROWS; ii++)
                                        if (ii < rows && i0 + ii < d) {
                                            pw += wr[i0 + ii] * r[ii];
                                            pq += q[i0 + ii] * r[ii];
                                        }
                                }
                                rw[w][u][lane] = pw;
                                rq[w][u][lane] = pq;
                            }
                        }
                        for (int tid = 0; tid < THREADS; tid++) { /* __syncthreads */
                            const int lane = tid & 31, w = tid >> 5, j = bz * WARP + lane, ia = a0 + w;
                            if (ia >= n) continue;
                            float sw = 0.0f, sq = 0.0f;
                            for (int v = 0; v < GPU_SSM_WARPS; v++) {
                                sw += rw[v][w][lane];
                                sq += rq[v][w][lane];
                            }
                            float vn = 0.0f;
                            if (j < d) {
                                const size_t o = (size_t)(t0 + ia) * nv * d + (size_t)h * d + j;
                                vn = U[o] - sw;
                                U[o] = vn;
                                a->out[o] = expf(Gc[(size_t)(t0 + ia) * nv + h]) * sq;
                            }
                            sVn[ia][lane] = vn;
                        }
                    }
                    const float GL = Gc[(size_t)(t0 + n - 1) * nv + h], el = expf(GL);
                    for (int tid = 0; tid < THREADS; tid++) {
                        const int lane = tid & 31, w = tid >> 5, i0 = w * rows;
                        float *r = R.r[tid];
                        for (int ii = 0; ii < MAX_ROWS; ii++) r[ii] *= el;
                        for (int b = 0; b < n; b++) {
                            const float coef = expf(GL - Gc[(size_t)(t0 + b) * nv + h]) * sVn[b][lane];
                            const float *kb = a->mix + (size_t)(t0 + b) * a->chan + k_off;
                            for (int ii = 0; ii < MAX_ROWS; ii++)
                                if (ii < rows && i0 + ii < d) r[ii] += kb[i0 + ii] * coef;
                        }
                    }
                }
                store_regs(a, s, h, bz, &R);
            }
}

/* ---- delta_chunk_out: grid (chunks, v_heads), 256 threads ---- */
static void port_chunk_out(const ssm_args *a, const gpu_ssm_seq *chunks, int n_chunks, const float *U, const float *Gc)
{
    static float sQK[GPU_SSM_CHUNK][GPU_SSM_CHUNK + 1];
    for (int bx = 0; bx < n_chunks; bx++)
        for (int h = 0; h < a->v_heads; h++) {
            const gpu_ssm_seq c = chunks[bx];
            const int d = a->d, nv = a->v_heads, n = c.n, t0 = c.first, kh = k_head(a, h);
            const int q_off = kh * d, k_off = a->k_heads * d + kh * d;
            for (int tid = 0; tid < CHUNK_THREADS; tid++)
                for (int idx = tid; idx < n * n; idx += CHUNK_THREADS) {
                    const int ia = idx / n, ib = idx % n;
                    float v = 0.0f;
                    if (ib <= ia)
                        v = dot_d(a->mix + (size_t)(t0 + ia) * a->chan + q_off, a->mix + (size_t)(t0 + ib) * a->chan + k_off, d) *
                            expf(Gc[(size_t)(t0 + ia) * nv + h] - Gc[(size_t)(t0 + ib) * nv + h]);
                    sQK[ia][ib] = v;
                }
            for (int tid = 0; tid < CHUNK_THREADS; tid++) /* __syncthreads */
                for (int idx = tid; idx < n * d; idx += CHUNK_THREADS) {
                    const int ia = idx / d, j = idx % d;
                    float acc = 0.0f;
                    for (int ib = 0; ib <= ia; ib++) acc += sQK[ia][ib] * U[(size_t)(t0 + ib) * nv * d + (size_t)h * d + j];
                    a->out[(size_t)(t0 + ia) * nv * d + (size_t)h * d + j] += acc;
                }
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

static void test_port_real_shape(void **state) /* Qwen3.5's head width 128 (4 blocks of 32 columns), 2 over 1 */
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
