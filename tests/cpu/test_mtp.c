/* test_mtp.c - the multi-token-prediction (NextN) block of Qwen3.5 files on the CPU engine
 * (engine.h: engine_mtp_step), against a plain float64 forward pass of the block written here
 * from the very weights of a file `inferd mkmodel --mtp 1` writes (dequantized with the
 * project's quant functions), llama.cpp's graph_mtp (src/models/qwen35moe.cpp):
 *   e = rmsnorm(embed[tok_p]) * enorm,  h = rmsnorm(h_{p-1}) * hnorm   (h_{-1} = 0)
 *   x = eh_proj [e | h]
 *   [q | gate] per head = Wq rmsnorm(x) * attn_norm; q, k per head rmsnorm * q/k_norm, NeoX
 *   RoPE on their first n_rot dims; x += Wo (softmax(q k^T / sqrt(d)) v * sigmoid(gate))  (causal)
 *   x += ffn(rmsnorm(x) * post_attention_norm)   (a SiLU GLU; qwen35moe: softmax top-k experts,
 *        renormalised, + the shared expert times sigmoid(w . x))
 *   h' = rmsnorm(x) * shared_head_norm;  logits = output h'.
 * h_{p-1} is the target's final (output-normed) hidden state, taken from the engine's own step
 * (engine_seq.hidden): what is checked is the block.  Also: a draft chained from the block's own
 * h' one position on, a catch-up that writes positions again after "rejected" drafts, and the
 * refusals (an engine asked for the block of a model without one). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "model/quant.h"
#include "sched/proposer.h"
#include "synth/mkmodel.h"

enum { N_POS = 7, MAX_POS = 16 };

/* A small qwen35 (moe: qwen35moe) of Q8_0 weights with one MTP block, loaded. */
/* mkmodel's qwen35 (or qwen35moe) shrunk to n_layer layers of 64, with n_mtp MTP blocks, written
 * and loaded: NULL with the loader's message in err when it refuses the file. */
static model *load_small(bool moe, int n_layer, int n_mtp, char *err, size_t errlen)
{
    mkmodel_config c;
    assert_true(mkmodel_preset(moe ? "qwen3.5-35b-a3b" : "qwen3.5-9b", &c));
    c.n_embd = 64, c.n_layer = n_layer, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 16, c.n_ff = 96;
    c.n_ctx = 256, c.n_vocab = 300, c.ftype = MKMODEL_Q8_0;
    c.ssm_state = 16, c.ssm_groups = 2, c.ssm_vheads = 4, c.ssm_inner = 64, c.n_rot = 8;
    if (moe) c.n_expert = 8, c.n_expert_used = 2, c.n_ff_exp = 32, c.n_expert_shared = 1;
    c.n_mtp = n_mtp;
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_mtp_%d.gguf", (int)getpid());
    if (mkmodel_write(&c, "the quick brown fox", 19, path, err, errlen) != 0) fail_msg("mkmodel: %s", err);
    model *m = model_load(path, err, errlen);
    unlink(path);
    return m;
}

/* 4 layers: DeltaNet x 3, then the gated full attention whose recipe the MTP block takes. */
static model *small_model(bool moe, int n_mtp)
{
    char err[256];
    model *m = load_small(moe, 4, n_mtp, err, sizeof err);
    if (!m) fail_msg("load: %s", err);
    return m;
}

static engine *open_mtp(const model *m)
{
    char err[256];
    engine_config cfg = {.n_slots = 2, .ctx_per_slot = 64, .max_batch_tokens = 32, .n_threads = 2, .mtp = true};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    assert_true(engine_has_mtp(e));
    return e;
}

/* ---- the float64 reference -------------------------------------------------------------- */

/* Every element of t (all its slices) in double. */
static double *deq(const model_tensor *t)
{
    const size_t rows = (size_t)t->ne1 * (size_t)t->ne2;
    double *out = malloc(rows * (size_t)t->ne0 * sizeof *out);
    float *row = malloc((size_t)t->ne0 * sizeof *row);
    for (size_t r = 0; r < rows; r++) {
        quant_dequantize_row(t->type, (const char *)t->data + r * t->row_bytes, row, t->ne0);
        for (int64_t i = 0; i < t->ne0; i++) out[r * (size_t)t->ne0 + (size_t)i] = row[i];
    }
    free(row);
    return out;
}

/* out[r] = w[r] . x for the n rows of width k of w. */
static void matvec(double *out, const double *w, const double *x, int n, int k)
{
    for (int r = 0; r < n; r++) {
        double s = 0;
        for (int i = 0; i < k; i++) s += w[(size_t)r * k + i] * x[i];
        out[r] = s;
    }
}

static void rmsnorm(double *out, const double *x, const double *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * (w ? w[i] : 1.0);
}

static double silu(double v) { return v / (1.0 + exp(-v)); }
static double sigm(double v) { return 1.0 / (1.0 + exp(-v)); }

/* NeoX RoPE of one head's first n_rot dims at position pos. */
static void rope(double *v, int n_rot, double base, int pos)
{
    const int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        const double a = pos * pow(base, -2.0 * i / n_rot), c = cos(a), s = sin(a), x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x0 * s + x1 * c;
    }
}

/* out += down (silu(gate x) * up x): one GLU of width ff. */
static void glu(double *out, const model_tensor *tg, const model_tensor *tu, const model_tensor *td, int slice,
                const double *x, int dim, int ff)
{
    model_tensor g = model_tensor_slice(tg, slice), u = model_tensor_slice(tu, slice), d = model_tensor_slice(td, slice);
    double *wg = deq(&g), *wu = deq(&u), *wd = deq(&d), *a = malloc((size_t)ff * sizeof *a), *b = malloc((size_t)ff * sizeof *b);
    double *y = malloc((size_t)dim * sizeof *y);
    matvec(a, wg, x, ff, dim);
    matvec(b, wu, x, ff, dim);
    for (int i = 0; i < ff; i++) a[i] = silu(a[i]) * b[i];
    matvec(y, wd, a, dim, ff);
    for (int i = 0; i < dim; i++) out[i] += y[i];
    free(wg), free(wu), free(wd), free(a), free(b), free(y);
}

/* The FFN of the block on its normed input x, added to out. */
static void ffn(const model *m, const model_layer *ly, const double *x, double *out)
{
    const model_hparams *hp = &m->hp;
    const int dim = hp->n_embd;
    if (!hp->n_expert) {
        glu(out, &ly->w_gate, &ly->w_up, &ly->w_down, 0, x, dim, hp->n_ff);
        return;
    }
    double *wr = deq(&ly->ffn_gate_inp), p[64], max = -INFINITY, sum = 0;
    matvec(p, wr, x, hp->n_expert, dim);
    for (int i = 0; i < hp->n_expert; i++) max = p[i] > max ? p[i] : max;
    for (int i = 0; i < hp->n_expert; i++) sum += p[i] = exp(p[i] - max);
    int ids[8];
    double chosen = 0;
    for (int j = 0; j < hp->n_expert_used; j++) { /* top-k of the softmax, lowest id on ties */
        ids[j] = -1;
        for (int i = 0; i < hp->n_expert; i++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= ids[q] == i;
            if (!taken && (ids[j] < 0 || p[i] > p[ids[j]])) ids[j] = i;
        }
        chosen += p[ids[j]] / sum;
    }
    double *y = calloc((size_t)dim, sizeof *y);
    for (int j = 0; j < hp->n_expert_used; j++) {
        memset(y, 0, (size_t)dim * sizeof *y);
        glu(y, &ly->ffn_gate_exps, &ly->ffn_up_exps, &ly->ffn_down_exps, ids[j], x, dim, hp->n_ff_exp);
        for (int i = 0; i < dim; i++) out[i] += p[ids[j]] / sum / chosen * y[i];
    }
    double *ws = deq(&ly->ffn_gate_inp_shexp), s;
    matvec(&s, ws, x, 1, dim);
    memset(y, 0, (size_t)dim * sizeof *y);
    glu(y, &ly->ffn_gate_shexp, &ly->ffn_up_shexp, &ly->ffn_down_shexp, 0, x, dim, hp->n_ff_shexp);
    for (int i = 0; i < dim; i++) out[i] += sigm(s) * y[i];
    free(wr), free(ws), free(y);
}

/* The block's logits (n x n_vocab) for tokens tok[0..n) at positions 0..n-1, h[p] the hidden
 * state before position p (n_embd floats each). */
static void reference(const model *m, const int32_t *tok, const float *h, int n, double *logits)
{
    const model_hparams *hp = &m->hp;
    const model_layer *ly = &m->layers[hp->n_layer];
    const int E = hp->n_embd, hd = hp->head_dim, H = hp->n_head, KV = hp->n_head_kv, V = hp->n_vocab;
    const double eps = hp->rms_eps;
    double *emb = deq(&m->mtp.embed), *eh = deq(&m->mtp.eh_proj), *en = deq(&m->mtp.enorm), *hn = deq(&m->mtp.hnorm);
    double *an = deq(&ly->attn_norm), *fn = deq(&ly->ffn_norm), *qn = deq(&ly->q_norm), *kn = deq(&ly->k_norm);
    double *wq = deq(&ly->wq), *wk = deq(&ly->wk), *wv = deq(&ly->wv), *wo = deq(&ly->wo);
    double *shn = deq(&m->mtp.head_norm), *head = deq(&m->mtp.head);
    double *K = malloc((size_t)n * KV * hd * sizeof *K), *Vv = malloc((size_t)n * KV * hd * sizeof *Vv);
    double *Q = malloc((size_t)n * H * hd * sizeof *Q), *G = malloc((size_t)n * H * hd * sizeof *G);
    double *X = malloc((size_t)n * E * sizeof *X);
    double cat[256], a[128], qg[256], o[128], y[128], hrow[128];
    for (int p = 0; p < n; p++) { /* every position's input, q, gate, k, v */
        double *x = X + (size_t)p * E;
        rmsnorm(cat, emb + (size_t)tok[p] * E, en, E, eps);
        for (int i = 0; i < E; i++) hrow[i] = h[(size_t)p * E + i];
        rmsnorm(cat + E, hrow, hn, E, eps);
        matvec(x, eh, cat, E, 2 * E);
        rmsnorm(a, x, an, E, eps);
        matvec(qg, wq, a, 2 * H * hd, E);
        for (int hh = 0; hh < H; hh++) {
            double *q = Q + ((size_t)p * H + hh) * hd;
            memcpy(q, qg + (size_t)hh * 2 * hd, (size_t)hd * sizeof *q);
            memcpy(G + ((size_t)p * H + hh) * hd, qg + (size_t)hh * 2 * hd + hd, (size_t)hd * sizeof *q);
            rmsnorm(q, q, qn, hd, eps);
            rope(q, hp->n_rot, ly->rope_base, p);
        }
        matvec(K + (size_t)p * KV * hd, wk, a, KV * hd, E);
        matvec(Vv + (size_t)p * KV * hd, wv, a, KV * hd, E);
        for (int kh = 0; kh < KV; kh++) {
            double *k = K + ((size_t)p * KV + kh) * hd;
            rmsnorm(k, k, kn, hd, eps);
            rope(k, hp->n_rot, ly->rope_base, p);
        }
    }
    for (int p = 0; p < n; p++) { /* causal attention, FFN, head */
        double *x = X + (size_t)p * E;
        for (int hh = 0; hh < H; hh++) {
            const int kh = hh / (H / KV);
            const double *q = Q + ((size_t)p * H + hh) * hd;
            double sc[MAX_POS], max = -INFINITY, sum = 0;
            for (int j = 0; j <= p; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += q[i] * K[((size_t)j * KV + kh) * hd + i];
                sc[j] = d / sqrt((double)hd);
                max = sc[j] > max ? sc[j] : max;
            }
            for (int j = 0; j <= p; j++) sum += sc[j] = exp(sc[j] - max);
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int j = 0; j <= p; j++) acc += sc[j] / sum * Vv[((size_t)j * KV + kh) * hd + i];
                o[hh * hd + i] = acc * sigm(G[((size_t)p * H + hh) * hd + i]);
            }
        }
        matvec(y, wo, o, E, H * hd);
        for (int i = 0; i < E; i++) x[i] += y[i];
        rmsnorm(a, x, fn, E, eps);
        ffn(m, ly, a, x);
        rmsnorm(a, x, shn, E, eps);
        matvec(logits + (size_t)p * V, head, a, V, E);
    }
    double *bufs[] = {emb, eh, en, hn, an, fn, qn, kn, wq, wk, wv, wo, shn, head, K, Vv, Q, G, X};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* ---- tests ------------------------------------------------------------------------------- */

/* The target's hidden rows of a prompt, shifted one on: rows[p] = h(p - 1), rows[0] = 0. */
static void target_rows(engine *e, const int32_t *tok, int n, float *rows)
{
    const int E = engine_model(e)->hp.n_embd;
    char err[256];
    float *hid = malloc((size_t)n * E * sizeof *hid);
    engine_seq s = {.slot = 0, .tokens = tok, .n_tokens = n, .hidden = hid};
    assert_int_equal(engine_step(e, &s, 1, NULL, err, sizeof err), 0);
    memset(rows, 0, (size_t)E * sizeof *rows);
    memcpy(rows + E, hid, (size_t)(n - 1) * E * sizeof *rows);
    free(hid);
}

static double max_err(const float *got, const double *want, size_t n, double *scale)
{
    double err = 0;
    *scale = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs(got[i] - want[i]));
        *scale = fmax(*scale, fabs(want[i]));
    }
    return err;
}

/* The block's logits over N_POS positions (two passes: 0..3 then 4..6, so the second reads the
 * first's K/V) equal the float64 reference; its draft is their argmax; a draft chained one
 * position on from the block's own h' equals the reference over N_POS + 1 positions. */
static void check_reference(bool moe)
{
    model *m = small_model(moe, 1);
    assert_true(m->mtp.bound);
    engine *e = open_mtp(m);
    const int E = m->hp.n_embd, V = m->hp.n_vocab;
    int32_t tok[N_POS + 1] = {11, 250, 37, 99, 4, 180, 61};
    float *rows = malloc((size_t)(N_POS + 1) * E * sizeof *rows), *logits = malloc((size_t)(N_POS + 1) * V * sizeof *logits);
    float *hout = malloc((size_t)(N_POS + 1) * E * sizeof *hout);
    double *want = malloc((size_t)(N_POS + 1) * V * sizeof *want);
    int32_t draft[N_POS + 1];
    target_rows(e, tok, N_POS, rows);
    char err[256];
    for (int first = 0, n; first < N_POS; first += n) {
        n = first == 0 ? 4 : N_POS - first;
        engine_mtp_seq s = {.slot = 0, .tokens = tok + first, .n_tokens = n, .pos = first,
                            .hidden = rows + (size_t)first * E, .draft = draft + first,
                            .logits = logits + (size_t)first * V, .hidden_out = hout + (size_t)first * E};
        if (engine_mtp_step(e, &s, 1, err, sizeof err) != 0) fail_msg("mtp step: %s", err);
    }
    reference(m, tok, rows, N_POS, want);
    double scale, d = max_err(logits, want, (size_t)N_POS * V, &scale);
    printf("%s MTP logits over %d positions: max |err| %.3g of max |logit| %.3g\n", moe ? "qwen35moe" : "qwen35",
           N_POS, d, scale);
    assert_true(scale > 0.1 && d < 1e-4 * scale + 1e-5);
    for (int p = 0; p < N_POS; p++) {
        int best = 0;
        for (int v = 1; v < V; v++) best = logits[(size_t)p * V + v] > logits[(size_t)p * V + best] ? v : best;
        assert_int_equal(draft[p], best);
    }
    /* draft 2: the draft after the last position, fed at the next with the block's own h' */
    tok[N_POS] = draft[N_POS - 1];
    memcpy(rows + (size_t)N_POS * E, hout + (size_t)(N_POS - 1) * E, (size_t)E * sizeof *rows);
    engine_mtp_seq s = {.slot = 0, .tokens = tok + N_POS, .n_tokens = 1, .pos = N_POS,
                        .hidden = rows + (size_t)N_POS * E, .logits = logits + (size_t)N_POS * V};
    if (engine_mtp_step(e, &s, 1, err, sizeof err) != 0) fail_msg("mtp step: %s", err);
    reference(m, tok, rows, N_POS + 1, want);
    d = max_err(logits + (size_t)N_POS * V, want + (size_t)N_POS * V, (size_t)V, &scale);
    assert_true(d < 1e-4 * scale + 1e-5);
    free(rows), free(logits), free(hout), free(want);
    engine_free(e);
    model_free(m);
}

static void test_reference_dense(void **state)
{
    (void)state;
    check_reference(false);
}

static void test_reference_moe(void **state)
{
    (void)state;
    check_reference(true);
}

/* Rollback: positions written with drafts that were then rejected are written again by the
 * next catch-up, and what follows is what a block that never saw the drafts gives; two rows in
 * one pass, one of them a catch-up that asks for nothing, give what each gives alone. */
static void test_rewrite_and_rows(void **state)
{
    (void)state;
    model *m = small_model(false, 1);
    engine *e = open_mtp(m), *fresh = open_mtp(m);
    const int E = m->hp.n_embd, V = m->hp.n_vocab;
    const int32_t tok[6] = {5, 17, 29, 41, 53, 65}, junk[3] = {7, 8, 9};
    float rows[6 * 64], junk_rows[3 * 64], a[6 * 300], b[6 * 300], c[2 * 6 * 300];
    assert_true(E == 64 && V == 300);
    target_rows(e, tok, 6, rows);
    for (int i = 0; i < 3 * E; i++) junk_rows[i] = (float)(i % 7) - 3.0f;
    char err[256];
    engine_mtp_seq s = {.slot = 0, .tokens = tok, .n_tokens = 3, .pos = 0, .hidden = rows, .logits = a};
    assert_int_equal(engine_mtp_step(e, &s, 1, err, sizeof err), 0);
    s = (engine_mtp_seq){.slot = 0, .tokens = junk, .n_tokens = 3, .pos = 3, .hidden = junk_rows, .logits = b};
    assert_int_equal(engine_mtp_step(e, &s, 1, err, sizeof err), 0); /* drafts at 3..5, rejected */
    s = (engine_mtp_seq){.slot = 0, .tokens = tok + 3, .n_tokens = 3, .pos = 3, .hidden = rows + 3 * E, .logits = a + 3 * V};
    assert_int_equal(engine_mtp_step(e, &s, 1, err, sizeof err), 0);
    s = (engine_mtp_seq){.slot = 0, .tokens = tok, .n_tokens = 6, .pos = 0, .hidden = rows, .logits = b};
    assert_int_equal(engine_mtp_step(fresh, &s, 1, err, sizeof err), 0);
    assert_memory_equal(a, b, sizeof a);
    /* the first row a catch-up (no outputs: its head is skipped), the second's logits as alone */
    engine_mtp_seq two[2] = {{.slot = 1, .tokens = junk, .n_tokens = 3, .pos = 0, .hidden = junk_rows},
                             {.slot = 0, .tokens = tok, .n_tokens = 6, .pos = 0, .hidden = rows, .logits = c + 3 * V}};
    assert_int_equal(engine_mtp_step(fresh, two, 2, err, sizeof err), 0);
    assert_memory_equal(c + 3 * V, b, sizeof b);
    engine_free(fresh);
    engine_free(e);
    model_free(m);
}

/* The mtp proposer (sched/mtp.c) follows the pairing rule: after it observes a target step over
 * a prompt (tokens and hidden rows), its drafts after a pending token are what the block gives
 * run by hand on another engine: the pending token at P with h(P - 1), then each draft at the
 * next position with the block's own h'.  Without the catch-up it drafts nothing. */
static void test_proposer_pairing(void **state)
{
    (void)state;
    model *m = small_model(false, 1);
    engine *e = open_mtp(m), *ref = open_mtp(m);
    const int E = m->hp.n_embd;
    const int32_t toks[7] = {12, 140, 33, 7, 290, 61, 42}, table[2] = {0, 1}; /* row 0's fixed blocks */
    float rows[7 * 64], hid[6 * 64], hout[64];
    char err[256];
    engine_seq q = {.slot = 0, .tokens = toks, .n_tokens = 6, .hidden = hid};
    assert_int_equal(engine_step(e, &q, 1, NULL, err, sizeof err), 0);
    memset(rows, 0, sizeof rows);
    memcpy(rows + E, hid, sizeof hid); /* rows[p] = h(p - 1) */
    proposer *p = proposer_mtp_new(e, err, sizeof err);
    if (!p) fail_msg("%s", err);
    assert_true(proposer_observes(p));
    int32_t draft[3] = {-1, -1, -1};
    proposer_row row = {.slot = 0, .toks = toks, .n_toks = 7, .k_max = 3, .draft = draft, .blocks = table};
    proposer_draft(p, &row, 1);
    assert_int_equal(row.n_draft, 0); /* nothing observed: positions 0..5 not caught up */
    proposer_obs o = {.slot = 0, .pos = 0, .tokens = toks, .n_tokens = 6, .hidden = hid, .blocks = table};
    proposer_observe(p, &o, 1);
    proposer_draft(p, &row, 1);
    assert_int_equal(row.n_draft, 3);
    int32_t all[7], want[3];
    float outs[7 * 64];
    engine_mtp_seq s = {.slot = 0, .tokens = toks, .n_tokens = 7, .hidden = rows, .draft = all, .hidden_out = outs};
    assert_int_equal(engine_mtp_step(ref, &s, 1, err, sizeof err), 0);
    want[0] = all[6];
    memcpy(hout, outs + 6 * E, sizeof hout);
    for (int j = 1; j < 3; j++) {
        engine_mtp_seq d = {.slot = 0, .tokens = &want[j - 1], .n_tokens = 1, .pos = 6 + j, .hidden = hout,
                            .draft = &want[j], .hidden_out = outs};
        assert_int_equal(engine_mtp_step(ref, &d, 1, err, sizeof err), 0);
        memcpy(hout, outs, sizeof hout);
    }
    assert_memory_equal(draft, want, sizeof want);
    proposer_keep(p, 0, 3); /* only 3 tokens stand: the catch-up of 3..5 is gone */
    proposer_draft(p, &row, 1);
    assert_int_equal(row.n_draft, 0);
    proposer_free(p);
    engine_free(ref);
    engine_free(e);
    model_free(m);
}

/* The block is asked for where there is none: the engine refuses to open (mtp on a model
 * without the block), engine_mtp_step refuses an engine that does not run it. */
static void test_refused(void **state)
{
    (void)state;
    model *m = small_model(false, 0);
    assert_false(m->mtp.bound);
    char err[256] = "";
    engine_config cfg = {.n_slots = 1, .ctx_per_slot = 32, .max_batch_tokens = 16, .n_threads = 1, .mtp = true};
    assert_null(engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err));
    assert_non_null(strstr(err, "the model has no MTP block (nextn_predict_layers)"));
    cfg.mtp = false;
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    assert_non_null(e);
    assert_false(engine_has_mtp(e));
    const int32_t tok = 1;
    float h[64] = {0};
    engine_mtp_seq s = {.slot = 0, .tokens = &tok, .n_tokens = 1, .hidden = h};
    assert_int_equal(engine_mtp_step(e, &s, 1, err, sizeof err), ENGINE_EINVAL);
    assert_non_null(strstr(err, "runs no MTP block"));
    engine_free(e);
    model_free(m);
    /* 3 layers are all DeltaNet: the block has no full-attention layer's recipe to take, and the
     * file is refused at load (before, the block ran with an empty recipe: its gated Q rows
     * written past the engine's Q buffer) */
    for (int moe = 0; moe < 2; moe++) {
        assert_null(load_small(moe, 3, 1, err, sizeof err));
        assert_non_null(strstr(err, "the MTP block is a full-attention layer, and none of the 3 layers is one"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_dense),
        cmocka_unit_test(test_reference_moe),
        cmocka_unit_test(test_rewrite_and_rows),
        cmocka_unit_test(test_proposer_pairing),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
