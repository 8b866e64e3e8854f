/* test_sampling.c - the CPU sampler against hand-computed expectations. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/sampling.h"

#define V 16

typedef struct fixture {
    float logits[V];
    void *scratch;
    sampling_params sp;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    f->scratch = malloc(sampling_scratch_bytes(V));
    sampling_params_default(&f->sp);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    free(f->scratch);
    free(f);
    return 0;
}

/* Sample from a copy of `logits` (the sampler edits its input). */
static engine_result sample(fixture *f, const float *logits, const int32_t *hist, int n_hist, int64_t position)
{
    float buf[V];
    memcpy(buf, logits, sizeof buf);
    sampling_input in = {.logits = buf, .n_vocab = V, .history = hist, .n_history = n_hist,
                         .position = position, .sp = &f->sp};
    engine_result r;
    memset(&r, 0xff, sizeof r);
    sampling_sample(&in, f->scratch, &r);
    memcpy(f->logits, buf, sizeof buf); /* processed logits, for inspection */
    return r;
}

static void ramp(float *l) /* token i has logit i / 4: 15 is the best */
{
    for (int i = 0; i < V; i++) l[i] = (float)i / 4.0f;
}

static void test_greedy_ties(void **state)
{
    fixture *f = *state;
    float l[V] = {0};
    l[3] = 2.0f, l[7] = 2.0f, l[11] = 2.0f;
    assert_int_equal(sample(f, l, NULL, 0, 0).token, 3); /* lowest id among equals */
    l[0] = NAN;                                           /* NaN never wins */
    assert_int_equal(sample(f, l, NULL, 0, 0).token, 3);
}

static void test_top_k1_is_greedy(void **state)
{
    fixture *f = *state;
    float l[V];
    ramp(l);
    l[9] = 10.0f;
    f->sp.temperature = 1.5f;
    f->sp.top_k = 1;
    for (uint64_t seed = 0; seed < 50; seed++) {
        f->sp.seed = seed;
        assert_int_equal(sample(f, l, NULL, 0, (int64_t)seed).token, 9);
    }
}

static void test_seeds_replay(void **state)
{
    fixture *f = *state;
    float l[V] = {0}; /* uniform: every draw is possible */
    f->sp.temperature = 1.0f;
    int a[64], distinct_from_seed2 = 0, seen[V] = {0};
    for (int p = 0; p < 64; p++) {
        f->sp.seed = 1234;
        a[p] = sample(f, l, NULL, 0, p).token;
        assert_int_equal(sample(f, l, NULL, 0, p).token, a[p]); /* same (seed, position) */
        seen[a[p]] = 1;
        f->sp.seed = 99;
        distinct_from_seed2 += sample(f, l, NULL, 0, p).token != a[p];
    }
    int n_seen = 0;
    for (int i = 0; i < V; i++) n_seen += seen[i];
    assert_true(n_seen >= 10);              /* 64 uniform draws over 16 cover most tokens */
    assert_true(distinct_from_seed2 >= 40); /* another seed gives another sequence */
    assert_true(sampling_uniform(7, 3) == sampling_uniform(7, 3));
    assert_true(sampling_uniform(7, 3) != sampling_uniform(7, 4));
}

/* Empirical frequencies follow softmax(l / T). */
static void test_temperature_distribution(void **state)
{
    fixture *f = *state;
    float l[V];
    for (int i = 0; i < V; i++) l[i] = -30.0f;
    l[2] = 1.0f, l[5] = 0.0f; /* T = 0.5: p(2) = e^2 / (e^2 + 1) = 0.881 */
    f->sp.temperature = 0.5f;
    f->sp.seed = 5;
    int n2 = 0, n5 = 0, N = 4000;
    for (int p = 0; p < N; p++) {
        int t = sample(f, l, NULL, 0, p).token;
        n2 += t == 2, n5 += t == 5;
    }
    assert_int_equal(n2 + n5, N);
    double p2 = (double)n2 / N;
    print_message("  p(2) = %.3f (expected 0.881)\n", p2);
    assert_true(fabs(p2 - 0.8808) < 0.03);
}

static void test_penalties(void **state)
{
    fixture *f = *state;
    float l[V];
    for (int i = 0; i < V; i++) l[i] = 1.0f;
    l[4] = -2.0f;
    const int32_t hist[] = {9, 4, 4, 9, 9, 1, 0};
    f->sp.repeat_penalty = 2.0f;
    f->sp.penalty_last_n = 6; /* window = 4 4 9 9 1 0 ... last six: 4,4,9,9,1,0 */
    sample(f, l, hist, 7, 7);
    assert_float_equal(f->logits[9], 0.5f, 1e-6);   /* positive: divided */
    assert_float_equal(f->logits[4], -4.0f, 1e-6);  /* negative: multiplied */
    assert_float_equal(f->logits[1], 0.5f, 1e-6);
    assert_float_equal(f->logits[0], 0.5f, 1e-6);
    assert_float_equal(f->logits[2], 1.0f, 0.0);    /* not in the window */

    f->sp.penalty_last_n = 2; /* only 1, 0 */
    sample(f, l, hist, 7, 7);
    assert_float_equal(f->logits[9], 1.0f, 0.0);
    assert_float_equal(f->logits[1], 0.5f, 1e-6);

    f->sp.repeat_penalty = 1.0f;
    f->sp.presence_penalty = 0.5f;
    f->sp.frequency_penalty = 0.25f;
    f->sp.penalty_last_n = -1; /* whole history: 9 x3, 4 x2, 1, 0 */
    sample(f, l, hist, 7, 7);
    assert_float_equal(f->logits[9], 1.0f - 0.5f - 0.75f, 1e-6);
    assert_float_equal(f->logits[4], -2.0f - 0.5f - 0.5f, 1e-6);
    assert_float_equal(f->logits[0], 1.0f - 0.75f, 1e-6);
    assert_float_equal(f->logits[3], 1.0f, 0.0);

    f->sp.penalty_last_n = 0; /* off */
    sample(f, l, hist, 7, 7);
    assert_float_equal(f->logits[9], 1.0f, 0.0);

    /* Penalties steer greedy away from the repeated best token. */
    float r[V];
    ramp(r);
    const int32_t rep[] = {15, 15};
    f->sp.penalty_last_n = 64;
    f->sp.presence_penalty = 0.0f;
    f->sp.frequency_penalty = 1.0f;
    assert_int_equal(sample(f, r, rep, 2, 2).token, 14);
}

static void test_logit_bias(void **state)
{
    fixture *f = *state;
    float l[V];
    ramp(l);
    int32_t ids[] = {15, 2, 99, -1}; /* out-of-vocabulary ids are ignored */
    float vals[] = {-100.0f, 100.0f, 100.0f, 100.0f};
    f->sp.bias_ids = ids;
    f->sp.bias_vals = vals;
    f->sp.n_bias = 4;
    f->sp.n_top_logprobs = 2;
    engine_result r = sample(f, l, NULL, 0, 0);
    assert_int_equal(r.token, 2);
    assert_true(r.logprob > -1e-6f); /* +100 makes it certain */
    assert_int_equal(r.top_ids[0], 2);
    assert_int_equal(r.top_ids[1], 14); /* 15 was pushed to the bottom */
    f->sp.temperature = 1.0f;
    for (int p = 0; p < 100; p++) assert_int_equal(sample(f, l, NULL, 0, p).token, 2);
    f->sp.n_bias = 1; /* only -100 on the best: never drawn */
    for (int p = 0; p < 200; p++) assert_int_not_equal(sample(f, l, NULL, 0, p).token, 15);
}

static void test_top_p_min_p(void **state)
{
    fixture *f = *state;
    float l[V];
    for (int i = 0; i < V; i++) l[i] = -50.0f;
    /* probabilities 0.5, 0.25, 0.125, 0.125 for tokens 8, 3, 12, 6 */
    l[8] = logf(0.5f), l[3] = logf(0.25f), l[12] = logf(0.125f), l[6] = logf(0.125f);
    f->sp.temperature = 1.0f;
    int seen[V];

    f->sp.top_p = 0.7f; /* 0.5 < 0.7 <= 0.75: keeps 8 and 3 */
    memset(seen, 0, sizeof seen);
    for (int p = 0; p < 400; p++) seen[sample(f, l, NULL, 0, p).token]++;
    assert_true(seen[8] > 0 && seen[3] > 0);
    assert_int_equal(seen[8] + seen[3], 400);

    f->sp.top_p = 1.0f;
    f->sp.min_p = 0.2f; /* threshold 0.2 * 0.5 = 0.1: keeps all four */
    memset(seen, 0, sizeof seen);
    for (int p = 0; p < 400; p++) seen[sample(f, l, NULL, 0, p).token]++;
    assert_int_equal(seen[8] + seen[3] + seen[12] + seen[6], 400);
    assert_true(seen[12] > 0 && seen[6] > 0);

    f->sp.min_p = 0.3f; /* threshold 0.15: 8 and 3 */
    memset(seen, 0, sizeof seen);
    for (int p = 0; p < 400; p++) seen[sample(f, l, NULL, 0, p).token]++;
    assert_int_equal(seen[8] + seen[3], 400);
    assert_true(seen[3] > 0);

    f->sp.min_p = 0.6f; /* threshold 0.3: 8 only */
    for (int p = 0; p < 100; p++) assert_int_equal(sample(f, l, NULL, 0, p).token, 8);

    f->sp.min_p = 0.0f;
    f->sp.top_k = 3; /* 8, 3, 6 (6 before 12: the lower id wins the tie) */
    memset(seen, 0, sizeof seen);
    for (int p = 0; p < 400; p++) seen[sample(f, l, NULL, 0, p).token]++;
    assert_int_equal(seen[12], 0);
    assert_true(seen[6] > 0);
}

static void test_logprobs(void **state)
{
    fixture *f = *state;
    float l[V];
    ramp(l);
    f->sp.n_top_logprobs = ENGINE_MAX_TOP_LOGPROBS; /* more than V: clamps to V */
    engine_result r = sample(f, l, NULL, 0, 0);
    assert_int_equal(r.n_top, V);
    double sum = 0.0;
    for (int j = 0; j < r.n_top; j++) {
        sum += exp(r.top_logprobs[j]);
        if (j > 0) assert_true(r.top_logprobs[j] <= r.top_logprobs[j - 1]);
    }
    assert_float_equal(sum, 1.0, 1e-5); /* all V tokens: a distribution */
    assert_int_equal(r.top_ids[0], 15);
    assert_float_equal(r.logprob, r.top_logprobs[0], 0.0);
    /* Exact value: log softmax at T = 1 of the processed logits. */
    double lse = 0.0;
    for (int i = 0; i < V; i++) lse += exp(l[i]);
    assert_float_equal(r.logprob, l[15] - log(lse), 1e-6);

    /* Temperature does not change the reported logprobs. */
    f->sp.temperature = 0.3f;
    f->sp.n_top_logprobs = 3;
    engine_result t = sample(f, l, NULL, 0, 11);
    assert_int_equal(t.n_top, 3);
    assert_float_equal(t.top_logprobs[1], r.top_logprobs[1], 0.0);
    assert_float_equal(t.logprob, (float)(l[t.token] - log(lse)), 1e-6);

    /* logprobs 0: the chosen token's logprob, no alternatives (once read top_ids[-1]). */
    f->sp.n_top_logprobs = 0;
    engine_result z = sample(f, l, NULL, 0, 11);
    assert_int_equal(z.n_top, 0);
    assert_float_equal(z.logprob, (float)(l[z.token] - log(lse)), 1e-6);

    f->sp.n_top_logprobs = -1; /* none requested */
    engine_result n = sample(f, l, NULL, 0, 11);
    assert_int_equal(n.n_top, 0);
    assert_float_equal(n.logprob, 0.0f, 0.0);
}

/* Step 0: a token whose bit is clear is never drawn and takes no probability mass. */
static void test_allowed_mask(void **state)
{
    fixture *f = *state;
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)i; /* 15 is the best, but masked out */
    const uint32_t allowed = (1u << 2) | (1u << 7);
    for (int seed = 0; seed < 200; seed++) {
        float row[V];
        memcpy(row, logits, sizeof row);
        f->sp.temperature = seed == 0 ? 0.0f : 1.5f;
        f->sp.seed = (uint64_t)seed;
        f->sp.n_top_logprobs = 3;
        sampling_input in = {.logits = row, .n_vocab = V, .position = 4, .sp = &f->sp, .allowed = &allowed};
        engine_result r;
        sampling_sample(&in, f->scratch, &r);
        assert_true(r.token == 2 || r.token == 7);
        if (seed == 0) assert_int_equal(r.token, 7);
        /* the logprobs are over the allowed tokens: p(7) = e^7 / (e^2 + e^7) */
        double lp7 = 7.0 - log(exp(2.0) + exp(7.0));
        assert_int_equal(r.n_top, 3);
        assert_int_equal(r.top_ids[0], 7);
        assert_true(fabs(r.top_logprobs[0] - lp7) < 1e-5);
        assert_true(isinf(r.top_logprobs[2]));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_greedy_ties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top_k1_is_greedy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seeds_replay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_temperature_distribution, setup, teardown),
        cmocka_unit_test_setup_teardown(test_penalties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logit_bias, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top_p_min_p, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logprobs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allowed_mask, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
