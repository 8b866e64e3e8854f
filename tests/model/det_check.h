/* det_check.h - the deterministic-serving check (issue 32) of one engine, shared by the CPU
 * and GPU engine tests: the same sequences alone, together and with chunked prompts give
 * bit-identical results.  Static functions over CMocka: include after <cmocka.h>. */
#ifndef INFERD_TEST_DET_CHECK_H
#define INFERD_TEST_DET_CHECK_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "model/model.h"

enum { DET_NS = 32, DET_GEN = 12, DET_MAXP = 40 };

/* One way to run DET_NS sequences: chunk < 0 runs each alone (its prompt in one step, then a
 * step a token); chunk > 0 the same with its prompt in chunks of `chunk` tokens and then its
 * last token alone (as after a prefix-cache hit); chunk 0 all of them together (prompts in one
 * step, then decode steps of DET_NS: a graph).  Every sampled token's result and the logits it
 * came from are kept. */
typedef struct det_run {
    engine_result res[DET_NS][DET_GEN];
    float *logits; /* [DET_NS][DET_GEN][V] */
} det_run;

static void det_step(engine *e, engine_seq *s, int n, engine_result *res, const char *what)
{
    char err[512];
    if (engine_step(e, s, n, res, err, sizeof err)) fail_msg("%s: %s", what, err);
}

static void det_generate(engine *e, int32_t prompts[DET_NS][DET_MAXP], const int *plen, const sampling_params *sp,
                         int chunk, det_run *out)
{
    const size_t V = (size_t)engine_model(e)->hp.n_vocab;
    int32_t toks[DET_NS][DET_GEN];
    engine_seq seqs[DET_NS];
    engine_result res[DET_NS];
    for (int g = 0; g < DET_GEN; g++) {
        for (int i = 0; i < DET_NS; i++) {
            float *lg = out->logits + ((size_t)i * DET_GEN + g) * V;
            seqs[i] = g == 0 ? (engine_seq){.slot = i, .tokens = prompts[i], .n_tokens = plen[i], .want_token = true,
                                            .sp = &sp[i], .logits = lg}
                             : (engine_seq){.slot = i, .tokens = &toks[i][g - 1], .n_tokens = 1,
                                            .pos = plen[i] + g - 1, .want_token = true, .sp = &sp[i], .logits = lg};
            if (chunk == 0) continue;
            if (g == 0 && chunk > 0) /* all but the last token in chunks, sampling nothing */
                for (int p0 = 0; p0 < plen[i] - 1; p0 += chunk) {
                    int n = plen[i] - 1 - p0 < chunk ? plen[i] - 1 - p0 : chunk;
                    engine_seq c = {.slot = i, .tokens = prompts[i] + p0, .n_tokens = n, .pos = p0, .sp = &sp[i]};
                    engine_result none;
                    det_step(e, &c, 1, &none, "chunk");
                }
            if (g == 0 && chunk > 0) seqs[i] = (engine_seq){.slot = i, .tokens = prompts[i] + plen[i] - 1, .n_tokens = 1,
                                               .pos = plen[i] - 1, .want_token = true, .sp = &sp[i], .logits = lg};
            det_step(e, &seqs[i], 1, &res[i], "alone");
            toks[i][g] = res[i].token;
            out->res[i][g] = res[i];
        }
        if (chunk != 0) continue; /* (alone: each row's step above was its whole step) */
        det_step(e, seqs, DET_NS, res, "together");
        for (int i = 0; i < DET_NS; i++) {
            toks[i][g] = res[i].token;
            out->res[i][g] = res[i];
        }
    }
}

/* Sequences whose token, logprob, top logprobs or logits differ in any bit from a's. */
static int det_differ(const char *what, const det_run *a, const det_run *b, size_t V)
{
    int differ = 0;
    for (int i = 0; i < DET_NS; i++)
        for (int g = 0; g < DET_GEN; g++) {
            const engine_result *x = &a->res[i][g], *y = &b->res[i][g];
            bool same = x->token == y->token && memcmp(&x->logprob, &y->logprob, sizeof x->logprob) == 0 &&
                        x->n_top == y->n_top &&
                        memcmp(x->top_logprobs, y->top_logprobs, (size_t)x->n_top * sizeof(float)) == 0 &&
                        memcmp(a->logits + ((size_t)i * DET_GEN + g) * V, b->logits + ((size_t)i * DET_GEN + g) * V,
                               V * sizeof(float)) == 0;
            if (same) continue;
            print_message("  %s: seq %d differs first at token %d (%d %.9g vs %d %.9g)\n", what, i, g, x->token,
                          (double)x->logprob, y->token, (double)y->logprob);
            differ++;
            break;
        }
    print_message("  deterministic, %s: %d of %d sequences differ from alone\n", what, differ, DET_NS);
    return differ;
}

/* engine_config.deterministic on a model: half the sequences greedy, half seeded at
 * temperature 0.9 (top logprobs asked), prompts of 3..39 tokens; alone (whole prompts), all
 * together, and alone with prompts chunked by 5 and by 1 give bit-identical results. */
static void det_case(model *m, engine_device dev)
{
    const size_t V = (size_t)m->hp.n_vocab;
    char err[512];
    engine_config cfg = {.n_slots = DET_NS, .ctx_per_slot = 128, .max_batch_tokens = DET_NS * DET_MAXP,
                         .deterministic = true};
    engine *e = engine_open(dev, m, &cfg, err, sizeof err);
    if (!e) fail_msg("%s", err);
    int32_t prompts[DET_NS][DET_MAXP];
    int plen[DET_NS];
    sampling_params sp[DET_NS];
    uint64_t seed = 5;
    for (int i = 0; i < DET_NS; i++) {
        plen[i] = 3 + (i * 7) % (DET_MAXP - 3);
        prompts[i][0] = 1;
        for (int j = 1; j < plen[i]; j++) prompts[i][j] = 3 + (int32_t)(rng_next(&seed) % (V - 3));
        sampling_params_default(&sp[i]);
        sp[i].n_top_logprobs = 3;
        if (i % 2) sp[i].temperature = 0.9f, sp[i].seed = 1000 + (uint64_t)i;
    }
    static det_run runs[4];
    const int chunks[4] = {-1, 0, 5, 1};
    static const char *const names[4] = {"alone", "together", "chunks of 5", "chunks of 1"};
    int bad = 0;
    for (int r = 0; r < 4; r++) {
        runs[r].logits = malloc((size_t)DET_NS * DET_GEN * V * sizeof(float));
        assert_non_null(runs[r].logits);
        det_generate(e, prompts, plen, sp, chunks[r], &runs[r]);
        if (r > 0) bad += det_differ(names[r], &runs[0], &runs[r], V);
    }
    int distinct = 0;
    for (int i = 1; i < DET_NS; i++) distinct += runs[0].res[i][0].token != runs[0].res[0][0].token;
    for (int r = 0; r < 4; r++) free(runs[r].logits);
    engine_free(e);
    assert_true(distinct > 0); /* the sequences are not all alike: the comparison shows something */
    assert_int_equal(bad, 0);
}

#endif
