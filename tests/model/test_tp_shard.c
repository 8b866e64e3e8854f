/* test_tp_shard.c - the tensor-parallel sharding arithmetic (model/tp_shard.h) on the shapes of
 * real models: every plan is checked against invariants that hold for any correct split
 * (each head, FFN unit and token row owned exactly once; every GPU holds the KV heads its query
 * heads read; the per-GPU bytes add up to the whole plus what is replicated), and the refusals
 * name what does not divide. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/quant.h"
#include "model/tp_shard.h"
#include "tiny_model.h"

/* A Q4_K_M-like file: Q4_K matrices, Q6_K for V, down and the LM head (as llama.cpp's Q4_K_M
 * mostly has them). */
static tp_shape q4km(int layers, int embd, int heads, int kv, int hd, int ff, int vocab, bool tied)
{
    return (tp_shape){.n_layer = layers, .n_embd = embd, .n_head = heads, .n_head_kv = kv, .head_dim = hd,
                      .n_ff = ff, .n_vocab = vocab, .tied_output = tied,
                      .wq = GGML_TYPE_Q4_K, .wk = GGML_TYPE_Q4_K, .wv = GGML_TYPE_Q6_K, .wo = GGML_TYPE_Q4_K,
                      .w_gate = GGML_TYPE_Q4_K, .w_up = GGML_TYPE_Q4_K, .w_down = GGML_TYPE_Q6_K,
                      .tok_embd = GGML_TYPE_Q4_K, .output = GGML_TYPE_Q6_K, .kv_elem_bytes = 2};
}

static tp_shape all_type(tp_shape s, ggml_type t)
{
    s.wq = s.wk = s.wv = s.wo = s.w_gate = s.w_up = s.w_down = s.tok_embd = s.output = t;
    return s;
}

static tp_shape llama8b(void) { return q4km(32, 4096, 32, 8, 128, 14336, 128256, false); }
static tp_shape llama70b(void) { return q4km(80, 8192, 64, 8, 128, 28672, 128256, false); }
static tp_shape qwen15b(void) { return q4km(28, 1536, 12, 2, 128, 8960, 151936, true); }
static tp_shape qwen7b(void) { return q4km(28, 3584, 28, 4, 128, 18944, 152064, false); }

static size_t rows(ggml_type t, int64_t r, int64_t n) { return (size_t)r * ggml_row_bytes(t, n); }

/* Every invariant of a plan of s over n GPUs. */
static void check_plan(const tp_shape *s, const tp_plan *p, int n)
{
    assert_int_equal(p->n_gpus, n);
    int group = s->n_head / s->n_head_kv;
    int blk = (int)ggml_type_block_elems(s->w_down);
    int held[1024] = {0}; /* GPUs holding each KV head */
    assert_true(s->n_head_kv <= 1024);
    size_t sum_w = 0, sum_kv = 0;
    int ffn_min = s->n_ff, ffn_max = 0, voc_min = s->n_vocab, voc_max = 0;
    for (int r = 0; r < n; r++) {
        const tp_rank *k = &p->rank[r];
        /* Contiguous ranges, each starting where the previous GPU's ended: together they
         * cover everything exactly once. */
        assert_int_equal(k->q_heads.begin, r ? p->rank[r - 1].q_heads.end : 0);
        assert_int_equal(k->ffn.begin, r ? p->rank[r - 1].ffn.end : 0);
        assert_int_equal(k->vocab.begin, r ? p->rank[r - 1].vocab.end : 0);
        assert_int_equal(k->q_heads.end - k->q_heads.begin, s->n_head / n);
        int nf = k->ffn.end - k->ffn.begin, nv = k->vocab.end - k->vocab.begin;
        assert_true(nf > 0 && nf % blk == 0 && k->ffn.begin % blk == 0); /* whole quant blocks */
        assert_true(nv > 0);
        ffn_min = nf < ffn_min ? nf : ffn_min, ffn_max = nf > ffn_max ? nf : ffn_max;
        voc_min = nv < voc_min ? nv : voc_min, voc_max = nv > voc_max ? nv : voc_max;
        /* Each query head's KV head is held by the same GPU. */
        for (int h = k->q_heads.begin; h < k->q_heads.end; h++) {
            assert_true(h / group >= k->kv_heads.begin);
            assert_true(h / group < k->kv_heads.end);
        }
        /* ... and it holds no KV head none of its query heads reads. */
        assert_int_equal(k->kv_heads.begin, k->q_heads.begin / group);
        assert_int_equal(k->kv_heads.end, (k->q_heads.end - 1) / group + 1);
        for (int j = k->kv_heads.begin; j < k->kv_heads.end; j++) held[j]++;
        sum_w += k->weight_bytes;
        sum_kv += k->kv_bytes_per_token;
        assert_true(k->replicated_bytes < k->weight_bytes);
    }
    assert_int_equal(p->rank[n - 1].q_heads.end, s->n_head);
    assert_int_equal(p->rank[n - 1].ffn.end, s->n_ff);
    assert_int_equal(p->rank[n - 1].vocab.end, s->n_vocab);
    assert_true(ffn_max - ffn_min <= blk); /* balanced to one block */
    assert_true(voc_max - voc_min <= 1);
    int replicas = s->n_head_kv >= n ? 1 : n / s->n_head_kv;
    assert_int_equal(p->kv_replicas, replicas);
    for (int j = 0; j < s->n_head_kv; j++) assert_int_equal(held[j], replicas);
    /* Bytes: the sum over GPUs is the whole model, plus the norms on every GPU but one, plus
     * the extra copies of replicated KV weights. */
    size_t norms = (size_t)s->n_layer * 2 * s->n_embd * 4 + (size_t)s->n_embd * 4;
    size_t kv_w = (size_t)s->n_layer * (rows(s->wk, (int64_t)s->n_head_kv * s->head_dim, s->n_embd) +
                                        rows(s->wv, (int64_t)s->n_head_kv * s->head_dim, s->n_embd));
    assert_int_equal(sum_w, p->total_weight_bytes + (size_t)(n - 1) * norms + (size_t)(replicas - 1) * kv_w);
    assert_int_equal(sum_kv, p->total_kv_bytes_per_token * (size_t)replicas);
    assert_int_equal(p->total_kv_bytes_per_token,
                     (size_t)s->n_layer * 2 * s->n_head_kv * s->head_dim * s->kv_elem_bytes);
}

static void plan_ok(const tp_shape *s, int n, tp_plan *p)
{
    char err[512] = "";
    int rc = tp_plan_make(s, n, p, err, sizeof err);
    if (rc != 0) fail_msg("N=%d refused: %s", n, err);
    check_plan(s, p, n);
}

static void plan_refused(const tp_shape *s, int n, const char *want1, const char *want2)
{
    char err[512] = "";
    tp_plan p;
    assert_int_equal(tp_plan_make(s, n, &p, err, sizeof err), -1);
    if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
        fail_msg("N=%d: message '%s' lacks '%s' / '%s'", n, err, want1, want2 ? want2 : "");
}

static void test_identity(void **state)
{
    (void)state;
    const tp_shape shapes[] = {llama8b(), llama70b(), qwen15b(), qwen7b()};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const tp_shape *s = &shapes[i];
        tp_plan p;
        plan_ok(s, 1, &p);
        const tp_rank *k = &p.rank[0];
        assert_int_equal(k->q_heads.end, s->n_head);
        assert_int_equal(k->kv_heads.begin, 0);
        assert_int_equal(k->kv_heads.end, s->n_head_kv);
        assert_int_equal(k->ffn.end, s->n_ff);
        assert_int_equal(k->vocab.end, s->n_vocab);
        assert_int_equal(k->weight_bytes, p.total_weight_bytes);
        assert_int_equal(k->kv_bytes_per_token, p.total_kv_bytes_per_token);
    }
}

/* Llama-3.1-8B in F16: the whole is the published 8,030,261,248 parameters at 2 bytes, with the
 * 266,240 norm weights at 4 (the engines keep vectors in F32). */
static void test_llama8b_f16_total(void **state)
{
    (void)state;
    tp_shape s = all_type(llama8b(), GGML_TYPE_F16);
    tp_plan p;
    plan_ok(&s, 1, &p);
    assert_int_equal(p.total_weight_bytes, 2 * (size_t)8030261248 + 2 * (size_t)266240);
    assert_int_equal(p.total_kv_bytes_per_token, 131072); /* 32 layers x 8 x 128 x K,V x 2 bytes */
    plan_ok(&s, 8, &p);
}

static void test_llama8b(void **state)
{
    (void)state;
    tp_shape s = llama8b();
    tp_plan p;
    for (int n = 1; n <= 8; n *= 2) plan_ok(&s, n, &p);
    plan_ok(&s, 2, &p);
    assert_int_equal(p.rank[1].q_heads.begin, 16);
    assert_int_equal(p.rank[1].kv_heads.begin, 4);
    assert_int_equal(p.rank[1].kv_heads.end, 8);
    assert_int_equal(p.rank[1].ffn.begin, 7168);
    assert_int_equal(p.rank[1].vocab.begin, 64128);
    assert_int_equal(p.rank[0].kv_bytes_per_token, 65536);
    plan_ok(&s, 8, &p); /* 4 query heads and 1 KV head each: still no replication */
    assert_int_equal(p.kv_replicas, 1);
    for (int r = 0; r < 8; r++) {
        assert_int_equal(p.rank[r].kv_heads.end - p.rank[r].kv_heads.begin, 1);
        assert_int_equal(p.rank[r].ffn.end - p.rank[r].ffn.begin, 1792); /* 7 Q6_K blocks */
        assert_int_equal(p.rank[r].vocab.end - p.rank[r].vocab.begin, 16032);
    }
    plan_refused(&s, 3, "32 attention heads", "GPU counts that do: 1, 2, 4, 8");
    plan_refused(&s, 6, "32 attention heads", NULL);
    plan_refused(&s, 0, "1 to 8", NULL);
    plan_refused(&s, 9, "1 to 8", NULL);
    plan_refused(&s, 16, "1 to 8", NULL);
}

static void test_llama70b(void **state)
{
    (void)state;
    tp_shape s = llama70b();
    tp_plan p;
    for (int n = 1; n <= 8; n *= 2) {
        plan_ok(&s, n, &p);
        /* Split weights dominate: each GPU holds within 1 % of whole / N. */
        double share = (double)p.rank[0].weight_bytes * n / (double)p.total_weight_bytes;
        assert_true(share > 0.99 && share < 1.01);
    }
    plan_ok(&s, 4, &p);
    assert_int_equal(p.rank[3].q_heads.begin, 48);
    assert_int_equal(p.rank[3].kv_heads.begin, 6);
    assert_int_equal(p.rank[3].ffn.end - p.rank[3].ffn.begin, 7168);
    /* 45.0 GB: a little above the 42.5 GB of a real Q4_K_M file, which keeps half of its down
     * and V matrices in Q4_K where this shape has all of them in Q6_K. */
    assert_true(p.total_weight_bytes > (size_t)44.9e9 && p.total_weight_bytes < (size_t)45.1e9);
}

static void test_qwen15b(void **state)
{
    (void)state;
    tp_shape s = qwen15b();
    tp_plan p;
    plan_ok(&s, 1, &p);
    plan_ok(&s, 2, &p); /* 6 heads per GPU = 768 inputs of attn_output = 3 Q4_K blocks */
    assert_int_equal(p.kv_replicas, 1);
    /* 35 blocks of FFN over 2: 18 and 17. */
    assert_int_equal(p.rank[0].ffn.end, 18 * 256);
    /* N=4: 3 heads x 128 = 384 inputs of attn_output, not whole Q4_K blocks: refused... */
    plan_refused(&s, 4, "384 inputs", "Q4_K");
    /* ...but with attn_output in Q8_0 (32 inputs a block) it splits, each of the 2 KV heads held
     * by the 2 GPUs whose query heads read it. */
    s.wo = GGML_TYPE_Q8_0;
    plan_ok(&s, 4, &p);
    assert_int_equal(p.kv_replicas, 2);
    assert_int_equal(p.rank[0].kv_heads.begin, 0);
    assert_int_equal(p.rank[1].kv_heads.begin, 0);
    assert_int_equal(p.rank[2].kv_heads.begin, 1);
    assert_int_equal(p.rank[3].kv_heads.begin, 1);
    assert_int_equal(p.rank[3].ffn.end - p.rank[3].ffn.begin, 8 * 256); /* 9+9+9+8 blocks */
    plan_refused(&s, 8, "12 attention heads", NULL);
    plan_refused(&s, 3, "2 KV heads", NULL); /* 4 heads a GPU: GPU 1 would read KV heads 0 and 1 */
    s = all_type(qwen15b(), GGML_TYPE_F16);
    plan_ok(&s, 4, &p);
    assert_int_equal(p.kv_replicas, 2);
}

static void test_qwen7b(void **state)
{
    (void)state;
    tp_shape s = qwen7b();
    tp_plan p;
    plan_ok(&s, 2, &p);
    assert_int_equal(p.rank[1].kv_heads.begin, 2);
    plan_refused(&s, 8, "28 attention heads", "GPU counts that do: 1, 2, 4, 7");
    plan_refused(&s, 3, "28 attention heads", NULL);
    /* N=4 (7 heads, 1 KV head a GPU) divides, but 7 x 128 = 896 inputs of a Q4_K attn_output
     * are 3.5 blocks: refused with the reason; with attn_output in Q8_0 it is a valid plan. */
    plan_refused(&s, 4, "896 inputs", NULL);
    s.wo = GGML_TYPE_Q8_0;
    plan_ok(&s, 4, &p);
    assert_int_equal(p.kv_replicas, 1);
    assert_int_equal(p.rank[2].kv_heads.begin, 2);
    assert_int_equal(p.rank[2].kv_heads.end, 3);
    /* 74 blocks of FFN over 4: 19, 19, 18, 18. */
    assert_int_equal(p.rank[0].ffn.end, 19 * 256);
    assert_int_equal(p.rank[3].ffn.end - p.rank[3].ffn.begin, 18 * 256);
}

static void test_ffn_too_small(void **state)
{
    (void)state;
    /* 512 hidden units are 2 K-quant blocks: 4 GPUs cannot each get one. */
    tp_shape s = q4km(2, 256, 8, 8, 32, 512, 1000, true);
    s.wo = GGML_TYPE_F16;
    tp_plan p;
    plan_ok(&s, 2, &p);
    plan_refused(&s, 4, "fewer than one block per GPU", "at most 2");
    s.w_down = GGML_TYPE_Q8_0; /* 16 blocks of 32 */
    plan_ok(&s, 4, &p);
    plan_ok(&s, 8, &p);
}

static void test_describe(void **state)
{
    (void)state;
    tp_shape s = llama8b();
    tp_plan p;
    plan_ok(&s, 2, &p);
    char line[256];
    tp_plan_describe_rank(&p, 1, line, sizeof line);
    assert_non_null(strstr(line, "GPU 1: heads 16-31, kv heads 4-7, ffn 7168-14335, vocab 64128-128255"));
    assert_non_null(strstr(line, "KV cache 64.0 KiB/token"));
    tp_plan_describe_rank(&p, 2, line, sizeof line);
    assert_non_null(strstr(line, "not in the plan"));
}


/* ---- each GPU's view of a loaded model (tp_view_make) ------------------------------------- */

static model *load_tiny(tiny_spec s, void **image)
{
    size_t size;
    char err[512];
    *image = tiny_model_build(&s, &size);
    assert_non_null(*image);
    model *m = tiny_model_load(*image, size, err, sizeof err);
    if (!m) fail_msg("%s", err);
    return m;
}

/* Row r of t dequantised (n = t->ne0 floats). */
static void row_of(const model_tensor *t, int64_t r, float *out)
{
    quant_dequantize_row(t->type, (const char *)t->data + (size_t)r * t->row_bytes, out, t->ne0);
}

/* Rows [first, first + v->ne1) of f, as v holds them: the same bytes, hence the same values. */
static void expect_rows(const model_tensor *f, const model_tensor *v, int64_t first)
{
    assert_int_equal(v->ne0, f->ne0);
    assert_int_equal(v->type, f->type);
    assert_memory_equal(v->data, (const char *)f->data + (size_t)first * f->row_bytes, (size_t)v->ne1 * v->row_bytes);
}

/* Inputs [c0, c0 + v->ne0) of every row of f, as v (repacked) holds them: dequantised, equal. */
static void expect_columns(const model_tensor *f, const model_tensor *v, int64_t c0)
{
    assert_int_equal(v->ne1, f->ne1);
    assert_int_equal(v->row_bytes, ggml_row_bytes(v->type, v->ne0));
    float *full = malloc((size_t)f->ne0 * sizeof *full), *part = malloc((size_t)v->ne0 * sizeof *part);
    for (int64_t r = 0; r < f->ne1; r++) {
        row_of(f, r, full);
        row_of(v, r, part);
        assert_memory_equal(part, full + c0, (size_t)v->ne0 * sizeof *part);
    }
    free(full);
    free(part);
}

/* Every layer of every rank's view against the full model: the rank's heads, KV heads and FFN
 * units as the plan gives them, the row splits as views, the column splits repacked on whole
 * blocks with the same values, the shape fields the engine reads. */
static void check_views(const model *m, int n)
{
    tp_shape shape;
    tp_plan p;
    char err[512];
    tp_shape_from_model(m, 2, &shape);
    if (tp_plan_make(&shape, n, &p, err, sizeof err)) fail_msg("%s", err);
    const int hd = m->hp.head_dim;
    int ff_total = 0;
    for (int r = 0; r < n; r++) {
        tp_view v;
        if (tp_view_make(m, &p, r, &v, err, sizeof err)) fail_msg("%s", err);
        const tp_rank *k = &p.rank[r];
        assert_int_equal(v.m.hp.n_head, m->hp.n_head / n);
        assert_int_equal(v.m.hp.n_head_kv, m->hp.n_head_kv / n);
        assert_int_equal(v.m.hp.n_ff, k->ffn.end - k->ffn.begin);
        assert_int_equal(v.m.hp.n_embd, m->hp.n_embd);
        assert_ptr_equal(v.m.tok_embd.data, m->tok_embd.data); /* replicated */
        assert_ptr_equal(v.m.output.data, m->output.data);
        assert_null(v.m.gguf);
        ff_total += v.m.hp.n_ff;
        for (int l = 0; l < m->hp.n_layer; l++) {
            const model_layer *F = &m->layers[l], *L = &v.m.layers[l];
            assert_int_equal(L->n_head_kv, v.m.hp.n_head_kv);
            assert_int_equal(L->n_ff, v.m.hp.n_ff);
            assert_int_equal(L->wq.ne1, (int64_t)v.m.hp.n_head * hd);
            expect_rows(&F->wq, &L->wq, (int64_t)k->q_heads.begin * hd);
            expect_rows(&F->wk, &L->wk, (int64_t)k->kv_heads.begin * hd);
            expect_rows(&F->wv, &L->wv, (int64_t)k->kv_heads.begin * hd);
            expect_rows(&F->w_gate, &L->w_gate, k->ffn.begin);
            expect_rows(&F->w_up, &L->w_up, k->ffn.begin);
            expect_columns(&F->wo, &L->wo, (int64_t)k->q_heads.begin * hd);
            expect_columns(&F->w_down, &L->w_down, k->ffn.begin);
            if (F->bq.data) { /* qwen2: the biases of its heads */
                assert_int_equal(L->bq.ne0, L->wq.ne1);
                assert_memory_equal(L->bq.data, (const float *)F->bq.data + k->q_heads.begin * hd, L->bq.ne0 * sizeof(float));
                assert_memory_equal(L->bk.data, (const float *)F->bk.data + k->kv_heads.begin * hd, L->bk.ne0 * sizeof(float));
            }
            assert_ptr_equal(L->attn_norm.data, F->attn_norm.data);
            assert_ptr_equal(L->q_norm.data, F->q_norm.data); /* per head: every GPU's */
        }
        tp_view_drop_packed(&v);
        assert_null(v.m.layers[0].wo.data);
        tp_view_free(&v);
    }
    assert_int_equal(ff_total, m->hp.n_ff);
}

/* The dense families in the formats the engine splits: K-quant rows (256-input blocks: Wo's
 * 512 inputs are two blocks a GPU at N=2), Q8_0 (32) at N=2 and 4, F16. */
static void test_views_quantised_rows(void **state)
{
    (void)state;
    const struct {
        const char *arch;
        ggml_type t;
        int n;
    } cases[] = {{"llama", GGML_TYPE_Q4_K, 2}, {"qwen2", GGML_TYPE_Q6_K, 2}, {"qwen3", GGML_TYPE_Q4_K, 2},
                 {"llama", GGML_TYPE_Q8_0, 4}, {"qwen3", GGML_TYPE_F16, 2}, {"llama", GGML_TYPE_Q4_K, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tiny_spec s = tiny_spec_default();
        s.arch = cases[i].arch, s.wtype = cases[i].t;
        s.n_embd = 256, s.n_head = 8, s.n_head_kv = 4, s.head_dim = 64, s.n_ff = 1024, s.n_vocab = 64;
        void *image;
        model *m = load_tiny(s, &image);
        check_views(m, cases[i].n);
        model_free(m);
        free(image);
    }
}

/* What the split does not handle is refused by name: a sliding-window family (gemma3's
 * sandwich norms come first), KV heads fewer than the GPUs (replication: not yet). */
static void test_views_refused(void **state)
{
    (void)state;
    char err[512];
    tp_shape shape;
    tp_plan p;
    tiny_spec s = tiny_spec_default();
    s.arch = "gemma3";
    s.post_norms = true;
    s.n_swa = 16;
    void *image;
    model *m = load_tiny(s, &image);
    tp_view v;
    tp_shape_from_model(m, 2, &shape);
    if (tp_plan_make(&shape, 2, &p, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(tp_view_make(m, &p, 0, &v, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor parallelism does not split"));
    assert_non_null(strstr(err, "gemma3"));
    model_free(m);
    free(image);

    s = tiny_spec_default();
    s.n_head_kv = 1; /* 4 heads, 1 KV head: N=2 replicates it */
    m = load_tiny(s, &image);
    tp_shape_from_model(m, 2, &shape);
    if (tp_plan_make(&shape, 2, &p, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(tp_view_make(m, &p, 1, &v, err, sizeof err), -1);
    assert_non_null(strstr(err, "replicated"));
    assert_int_equal(tp_view_make(m, &p, 2, &v, err, sizeof err), -1); /* not a rank of the plan */
    model_free(m);
    free(image);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),    cmocka_unit_test(test_llama8b_f16_total),
        cmocka_unit_test(test_llama8b),     cmocka_unit_test(test_llama70b),
        cmocka_unit_test(test_qwen15b),     cmocka_unit_test(test_qwen7b),
        cmocka_unit_test(test_ffn_too_small), cmocka_unit_test(test_describe),
        cmocka_unit_test(test_views_quantised_rows), cmocka_unit_test(test_views_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
