// sampling.cuh - choose each sequence's next token on the GPU, following the CPU reference
// (src/cpu/sampling.h states the order of operations; this mirrors it step by step):
// bias, penalties over the slot's history window, log-softmax at T=1 for logprobs and the
// top-N alternatives, then greedy argmax or temperature + top_k + top_p + min_p + one draw.
// One block per logits row; only the small gpu_sample_out records go back to the host.
#pragma once
#include "common.cuh"
#include "../gpu_shared.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_SORT_MAX 4096       // candidates sorted in shared memory
#define SAMPLE_NEGLIGIBLE_GAP 40.0f // as the CPU sampler: exp(-40) is below float resolution

__device__ __forceinline__ float sane_logit(float l) { return isnan(l) ? -INFINITY : l; }

__device__ __forceinline__ uint64_t splitmix64_dev(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// (value, id) ranks before (v2, id2) when larger, or equal with the lower id.
__device__ __forceinline__ bool ranks_before(float v, int id, float v2, int id2)
{
    return v > v2 || (v == v2 && id < id2);
}

// Best (value, id) among the elements that rank strictly after (pv, pid), over the block.
__device__ void block_best_after(const float *l, int n, float pv, int pid, float *bv, int *bi,
                                 float *sh_v, int *sh_i)
{
    float best = -INFINITY;
    int besti = INT_MAX;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = sane_logit(l[i]);
        if (ranks_before(pv, pid, v, i) && ranks_before(v, i, best, besti)) {
            best = v;
            besti = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, besti, o);
        if (ranks_before(ov, oi, best, besti)) { best = ov; besti = oi; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { sh_v[w] = best; sh_i[w] = besti; }
    __syncthreads();
    if (w == 0) {
        best = lane < (int)(blockDim.x >> 5) ? sh_v[lane] : -INFINITY;
        besti = lane < (int)(blockDim.x >> 5) ? sh_i[lane] : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, besti, o);
            if (ranks_before(ov, oi, best, besti)) { best = ov; besti = oi; }
        }
        if (lane == 0) { sh_v[0] = best; sh_i[0] = besti; }
    }
    __syncthreads();
    *bv = sh_v[0];
    *bi = sh_i[0];
    __syncthreads();
}

// Sort (key, id) descending by key, ascending id on ties; n a power of two.
__device__ void bitonic_sort_desc(float *key, int *id, int n)
{
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    bool desc = (i & size) == 0;
                    bool swap = desc ? ranks_before(key[j], id[j], key[i], id[i])
                                     : ranks_before(key[i], id[i], key[j], id[j]);
                    if (swap) {
                        float tk = key[i]; key[i] = key[j]; key[j] = tk;
                        int ti = id[i]; id[i] = id[j]; id[j] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Temperature, top_k, top_p, min_p and the draw, over candidates within the negligible gap of
// the best.  More candidates than fit the shared-memory sort keep only the best
// SAMPLE_SORT_MAX (a threshold found by bisection): a flat distribution over more than 4096
// tokens is then truncated, the one place the GPU sampler differs from the CPU's.
__device__ int sample_random(const float *l, int n_vocab, const gpu_sample_row *r, float max_logit)
{
    __shared__ float key[SAMPLE_SORT_MAX];
    __shared__ int ids[SAMPLE_SORT_MAX];
    __shared__ int count;
    __shared__ float sh[32];
    float t = r->temperature, max_scaled = max_logit / t;
    float lo = max_scaled - SAMPLE_NEGLIGIBLE_GAP, hi = max_scaled;
    // Bisection on the cut-off until the candidates fit (usually zero iterations).
    for (int iter = 0;; iter++) {
        float c = 0.0f;
        for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) c += (l[i] / t >= lo) ? 1.0f : 0.0f;
        c = block_sum(c, sh);
        if (c <= SAMPLE_SORT_MAX || iter == 40) break;
        lo = 0.5f * (lo + hi);
    }
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        float s = l[i] / t;
        if (s >= lo) {
            int k = atomicAdd(&count, 1);
            if (k < SAMPLE_SORT_MAX) { key[k] = s; ids[k] = i; }
        }
    }
    __syncthreads();
    int n = min(count, SAMPLE_SORT_MAX), np = 1;
    while (np < n) np <<= 1;
    for (int i = n + threadIdx.x; i < np; i += blockDim.x) { key[i] = -INFINITY; ids[i] = INT_MAX; }
    __syncthreads();
    bitonic_sort_desc(key, ids, np);
    if (r->top_k > 0 && r->top_k < n) n = r->top_k;
    for (int i = threadIdx.x; i < n; i += blockDim.x) key[i] = expf(key[i] - max_scaled);
    __syncthreads();
    __shared__ int chosen;
    if (threadIdx.x == 0) {
        // Sequential in sorted order, as the CPU sums, so the cut-offs agree.
        float total = 0.0f;
        for (int i = 0; i < n; i++) total += key[i];
        if (r->top_p < 1.0f) {
            float cum = 0.0f, target = r->top_p * total;
            for (int i = 0; i < n; i++) {
                cum += key[i];
                if (cum >= target) { n = i + 1; break; }
            }
        }
        if (r->min_p > 0.0f) {
            float threshold = r->min_p * key[0];
            int keep = 1;
            while (keep < n && key[keep] >= threshold) keep++;
            n = keep;
        }
        total = 0.0f;
        for (int i = 0; i < n; i++) total += key[i];
        uint64_t bits = splitmix64_dev(r->seed ^ splitmix64_dev((uint64_t)(int64_t)r->hist_end));
        float target = (float)((double)(bits >> 11) * 0x1.0p-53) * total;
        float cum = 0.0f;
        chosen = ids[n - 1];
        for (int i = 0; i < n; i++) {
            cum += key[i];
            if (target < cum) { chosen = ids[i]; break; }
        }
    }
    __syncthreads();
    return chosen;
}

// Rows with an allowed-token mask, a logit_bias or an active penalty are processed in a copy
// (the raw logits may go back to the caller); the others are read in place and pay nothing.
__device__ __forceinline__ bool needs_work(const gpu_sample_row *r)
{
    bool pen = r->repeat_penalty != 1.0f || r->presence_penalty != 0.0f || r->frequency_penalty != 0.0f;
    return r->want && (r->mask_row >= 0 || r->n_bias > 0 || (pen && r->penalty_last_n != 0 && r->hist_end > 0));
}

__device__ __forceinline__ const float *sample_src(const sample_args &a, int row)
{
    return (needs_work(&a.rows[row]) ? a.work : a.logits) + (size_t)row * a.n_vocab;
}

// Grid (rows, parts): copy the slices of rows that need processing; step 0 of the CPU
// reference, the allowed-token mask, on the way (-inf for every token whose bit is clear).
extern "C" __global__ void sample_prep(sample_args a)
{
    pdl_enter();
    const gpu_sample_row *r = &a.rows[blockIdx.x];
    if (!needs_work(r)) return;
    size_t base = (size_t)blockIdx.x * a.n_vocab;
    const uint32_t *m = r->mask_row >= 0 ? a.mask + (size_t)r->mask_row * a.mask_words : NULL;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < a.n_vocab; i += gridDim.y * blockDim.x) {
        bool ok = !m || ((m[i >> 5] >> (i & 31)) & 1u);
        a.work[base + i] = ok ? sane_logit(a.logits[base + i]) : -INFINITY;
    }
}

// Grid (rows): logit_bias, then the penalties over the slot's history window.
extern "C" __global__ void sample_adjust(sample_args a)
{
    pdl_enter();
    const gpu_sample_row *r = &a.rows[blockIdx.x];
    if (!needs_work(r)) return;
    const int V = a.n_vocab;
    float *l = a.work + (size_t)blockIdx.x * V;
    int *cnt = a.counts + (size_t)blockIdx.x * V;
    if (threadIdx.x == 0) /* in order, as the CPU adds them */
        for (int i = 0; i < r->n_bias; i++) {
            int id = a.bias[r->bias_off + i].id;
            if (id >= 0 && id < V) l[id] += a.bias[r->bias_off + i].val;
        }
    __syncthreads();
    bool pen = r->repeat_penalty != 1.0f || r->presence_penalty != 0.0f || r->frequency_penalty != 0.0f;
    if (!pen || r->penalty_last_n == 0 || r->hist_end <= 0) return;
    int nw = (r->penalty_last_n < 0 || r->penalty_last_n > r->hist_end) ? r->hist_end : r->penalty_last_n;
    const int *win = a.hist + (size_t)r->slot * a.ctx + (r->hist_end - nw);
    for (int i = threadIdx.x; i < nw; i += blockDim.x)
        if (win[i] >= 0 && win[i] < V) atomicAdd(&cnt[win[i]], 1);
    __syncthreads();
    for (int i = threadIdx.x; i < nw; i += blockDim.x) {
        int tk = win[i];
        if (tk < 0 || tk >= V) continue;
        int c = atomicExch(&cnt[tk], 0); // the first visitor of a distinct token applies it
        if (c > 0) {
            float v = l[tk];
            v = v > 0.0f ? v / r->repeat_penalty : v * r->repeat_penalty;
            l[tk] = sane_logit(v - (r->presence_penalty + r->frequency_penalty * (float)c));
        }
    }
}

// Grid (rows, parts): each block's slice -> (best value, its lowest id, sum of exp(l - best)).
extern "C" __global__ void sample_reduce(sample_args a)
{
    pdl_enter();
    __shared__ float sh_v[32];
    __shared__ int sh_i[32];
    if (!a.rows[blockIdx.x].want) return;
    const float *l = sample_src(a, blockIdx.x);
    int lo = (int)((long long)a.n_vocab * blockIdx.y / gridDim.y);
    int hi = (int)((long long)a.n_vocab * (blockIdx.y + 1) / gridDim.y);
    float best = -INFINITY;
    int besti = INT_MAX;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = sane_logit(l[i]);
        if (ranks_before(v, i, best, besti)) { best = v; besti = i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, besti, o);
        if (ranks_before(ov, oi, best, besti)) { best = ov; besti = oi; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { sh_v[w] = best; sh_i[w] = besti; }
    __syncthreads();
    best = -INFINITY;
    besti = INT_MAX;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++)
        if (ranks_before(sh_v[k], sh_i[k], best, besti)) { best = sh_v[k]; besti = sh_i[k]; }
    float sum = 0.0f;
    if (best > -INFINITY)
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) sum += __expf(sane_logit(l[i]) - best);
    __syncthreads();
    sum = block_sum(sum, sh_v);
    if (threadIdx.x == 0) {
        float *p = a.parts + ((size_t)blockIdx.x * gridDim.y + blockIdx.y) * 3;
        p[0] = best;
        p[1] = __int_as_float(besti);
        p[2] = sum;
    }
}

// Grid (rows): merge the slices, then greedy / the draw, logprobs and the top-N alternatives.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample(sample_args a)
{
    pdl_enter();
    __shared__ float sh_v[32];
    __shared__ int sh_i[32];
    const gpu_sample_row *r = &a.rows[blockIdx.x];
    if (!r->want) return;
    const int V = a.n_vocab;
    const float *l = sample_src(a, blockIdx.x);
    const float *parts = a.parts + (size_t)blockIdx.x * a.n_parts * 3;
    float max_logit = -INFINITY;
    int best = INT_MAX;
    for (int k = 0; k < a.n_parts; k++) {
        float v = parts[3 * k];
        int id = __float_as_int(parts[3 * k + 1]);
        if (ranks_before(v, id, max_logit, best)) { max_logit = v; best = id; }
    }
    if (best == INT_MAX) best = 0; // every logit -inf: the CPU's argmax returns 0 too
    bool greedy = r->temperature <= 0.0f || !isfinite(max_logit / r->temperature);
    int token = greedy ? best : sample_random(l, V, r, max_logit);
    gpu_sample_out *o = &a.out[blockIdx.x];
    if (r->n_top < 0 || !isfinite(max_logit)) {
        if (threadIdx.x == 0) { o->token = token; o->logprob = 0.0f; o->n_top = 0; }
        return;
    }
    float s = 0.0f;
    for (int k = 0; k < a.n_parts; k++)
        if (parts[3 * k] > -INFINITY) s += parts[3 * k + 2] * __expf(parts[3 * k] - max_logit);
    float lse = max_logit + logf(s);
    int n_top = min(min(r->n_top, GPU_MAX_TOP), V);
    float pv = INFINITY;
    int pid = -1;
    for (int k = 0; k < n_top; k++) {
        block_best_after(l, V, pv, pid, &pv, &pid, sh_v, sh_i);
        if (threadIdx.x == 0) { o->top_ids[k] = pid; o->top_logprobs[k] = pv - lse; }
    }
    if (threadIdx.x == 0) { o->token = token; o->logprob = sane_logit(l[token]) - lse; o->n_top = n_top; }
}
