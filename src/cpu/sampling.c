/* sampling.c - the CPU sampler; sampling.h states the order of operations. */
#include "sampling.h"
#include "base/rng.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

typedef struct candidate {
    float logit; /* processed logit divided by the temperature */
    int32_t id;
} candidate;

/* Candidates further than this below the best (after temperature) have exp() < 2e-18 of the
 * best's: added to a float sum that is >= 1 they change nothing, so dropping them before the
 * sort changes no result and keeps the sort short. */
#define NEGLIGIBLE_LOGIT_GAP 40.0f

size_t sampling_scratch_bytes(int n_vocab)
{
    return (size_t)n_vocab * (sizeof(candidate) + sizeof(int32_t));
}

double sampling_uniform(uint64_t seed, int64_t position)
{
    return rng_unit(rng_splitmix64(seed ^ rng_splitmix64((uint64_t)position)));
}

/* NaN logits (from a broken model) must not poison comparisons: they rank below everything. */
static float sane(float l) { return isnan(l) ? -INFINITY : l; }

/* Step 0: tokens outside the grammar's mask can never be drawn, nor count in the logprobs. */
static void apply_mask(const sampling_input *in)
{
    if (!in->allowed) return;
    for (int w = 0; w * 32 < in->n_vocab; w++) {
        uint32_t bits = in->allowed[w];
        if (bits == 0xffffffffu) continue;
        int end = w * 32 + 32 < in->n_vocab ? w * 32 + 32 : in->n_vocab;
        for (int i = w * 32; i < end; i++)
            if (!(bits >> (i & 31) & 1u)) in->logits[i] = -INFINITY;
    }
}

static void apply_bias(const sampling_input *in)
{
    const sampling_params *sp = in->sp;
    for (int i = 0; i < sp->n_bias; i++) {
        int32_t id = sp->bias_ids[i];
        if (id >= 0 && id < in->n_vocab) in->logits[id] += sp->bias_vals[i];
    }
}

static void apply_penalties(const sampling_input *in, int32_t *counts)
{
    const sampling_params *sp = in->sp;
    bool any = sp->repeat_penalty != 1.0f || sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
    if (!any || sp->penalty_last_n == 0 || in->n_history <= 0) return;
    int n_window = sp->penalty_last_n < 0 || sp->penalty_last_n > in->n_history ? in->n_history : sp->penalty_last_n;
    const int32_t *window = in->history + (in->n_history - n_window);
    memset(counts, 0, (size_t)in->n_vocab * sizeof *counts);
    for (int i = 0; i < n_window; i++)
        if (window[i] >= 0 && window[i] < in->n_vocab) counts[window[i]]++;
    /* Visit each distinct token once: its count is cleared after it has been penalised. */
    for (int i = 0; i < n_window; i++) {
        int32_t t = window[i];
        if (t < 0 || t >= in->n_vocab || counts[t] == 0) continue;
        float *l = &in->logits[t];
        *l = *l > 0.0f ? *l / sp->repeat_penalty : *l * sp->repeat_penalty;
        *l -= sp->presence_penalty + sp->frequency_penalty * (float)counts[t];
        counts[t] = 0;
    }
}

int sampling_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (sane(logits[i]) > sane(logits[best])) best = i; /* strict: lowest id wins ties */
    return best;
}

/* log(sum(exp(l))) in double, so the logprobs of near-certain tokens keep their digits. */
static double log_sum_exp(const float *logits, int n, float max)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)sane(logits[i]) - max);
    return (double)max + log(sum);
}

/* The n_top most likely tokens, descending, lowest id first on ties (insertion into a short
 * sorted list: n_top <= ENGINE_MAX_TOP_LOGPROBS). */
static void top_logprobs(const float *logits, int n_vocab, double lse, int n_top, engine_result *out)
{
    if (n_top > n_vocab) n_top = n_vocab;
    out->n_top = 0;
    /* logprobs 0 asks for the chosen token's logprob only; the insertion below compares with
     * the last kept entry, top_ids[n_top - 1], which does not exist for n_top == 0. */
    if (n_top <= 0) return;
    int n = 0;
    for (int i = 0; i < n_vocab; i++) {
        float l = sane(logits[i]);
        if (n == n_top && !(l > sane(logits[out->top_ids[n - 1]]))) continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && l > sane(logits[out->top_ids[j - 1]])) {
            out->top_ids[j] = out->top_ids[j - 1];
            j--;
        }
        out->top_ids[j] = i;
    }
    out->n_top = n;
    for (int j = 0; j < n; j++) out->top_logprobs[j] = (float)((double)sane(logits[out->top_ids[j]]) - lse);
}

/* Candidate order: descending logit, lowest id first among equals (a total order, so the
 * result does not depend on the sort algorithm). */
static bool ranks_before(const candidate *x, const candidate *y)
{
    return x->logit > y->logit || (x->logit == y->logit && x->id < y->id);
}

static void sift_down(candidate *c, int root, int n)
{
    for (;;) {
        int child = 2 * root + 1;
        if (child >= n) return;
        /* The heap keeps the candidate that ranks last at the root. */
        if (child + 1 < n && ranks_before(&c[child], &c[child + 1])) child++;
        if (!ranks_before(&c[root], &c[child])) return;
        candidate t = c[root];
        c[root] = c[child];
        c[child] = t;
        root = child;
    }
}

/* Heapsort into rank order: in place, O(n log n), and unlike qsort it never allocates. */
static void sort_candidates(candidate *c, int n)
{
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(c, i, n);
    for (int end = n - 1; end > 0; end--) {
        candidate t = c[0];
        c[0] = c[end];
        c[end] = t;
        sift_down(c, 0, end);
    }
}

/* Temperature, top_k, top_p, min_p, then one draw. */
static int32_t sample_random(const sampling_input *in, candidate *cand, float max_logit)
{
    const sampling_params *sp = in->sp;
    /* Division, not a reciprocal: 0 / tiny stays 0 where 0 * inf would be NaN.  The best
     * candidate always passes the filter, so n >= 1. */
    const float max_scaled = max_logit / sp->temperature;
    int n = 0;
    for (int i = 0; i < in->n_vocab; i++) {
        float s = sane(in->logits[i]) / sp->temperature;
        if (s >= max_scaled - NEGLIGIBLE_LOGIT_GAP) cand[n++] = (candidate){s, i};
    }
    sort_candidates(cand, n);
    if (sp->top_k > 0 && sp->top_k < n) n = sp->top_k;

    /* Reuse the logit slot for the unnormalised probability exp(s - s_max) (s_max -> 1). */
    float total = 0.0f;
    for (int i = 0; i < n; i++) {
        cand[i].logit = expf(cand[i].logit - max_scaled);
        total += cand[i].logit;
    }
    if (sp->top_p < 1.0f) {
        float cum = 0.0f, target = sp->top_p * total;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += cand[i].logit;
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (sp->min_p > 0.0f) {
        float threshold = sp->min_p * cand[0].logit;
        int keep = 1;
        while (keep < n && cand[keep].logit >= threshold) keep++;
        n = keep;
    }
    total = 0.0f;
    for (int i = 0; i < n; i++) total += cand[i].logit;
    float target = (float)sampling_uniform(sp->seed, in->position) * total;
    float cum = 0.0f;
    for (int i = 0; i < n; i++) {
        cum += cand[i].logit;
        if (target < cum) return cand[i].id;
    }
    return cand[n - 1].id; /* float rounding left target at the very top */
}

void sampling_sample(const sampling_input *in, void *scratch, engine_result *out)
{
    const sampling_params *sp = in->sp;
    candidate *cand = scratch;
    int32_t *counts = (int32_t *)(cand + in->n_vocab);

    apply_mask(in);
    apply_bias(in);
    apply_penalties(in, counts);

    int best = sampling_argmax(in->logits, in->n_vocab);
    float max_logit = sane(in->logits[best]);
    /* All -inf logits, or a temperature so small that the best scaled logit overflows, leave
     * nothing to normalise: the distribution is a point mass on the argmax anyway. */
    bool greedy = sp->temperature <= 0.0f || !isfinite(max_logit / sp->temperature);
    out->token = greedy ? best : sample_random(in, cand, max_logit);

    out->logprob = 0.0f;
    out->n_top = 0;
    if (sp->n_top_logprobs >= 0 && isfinite(max_logit)) {
        double lse = log_sum_exp(in->logits, in->n_vocab, max_logit);
        out->logprob = (float)((double)sane(in->logits[out->token]) - lse);
        int n_top = sp->n_top_logprobs > ENGINE_MAX_TOP_LOGPROBS ? ENGINE_MAX_TOP_LOGPROBS : sp->n_top_logprobs;
        top_logprobs(in->logits, in->n_vocab, lse, n_top, out);
    }
}
