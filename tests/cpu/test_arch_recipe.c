/* test_arch_recipe.c - a model family defined only here, as data: "toy-postnorm" is llama
 * with sandwich-norm and post-norm layers alternating (arch.h's pattern), registered at run
 * time, written as a GGUF, loaded by the real loader and run by the CPU engine, whose logits
 * must match a plain float64 forward pass over the very weights written (not the model's
 * view of them).  Also: the loader's errors name the toy's tensors, the registry lists it,
 * and a backend refuses a recipe feature it lacks by name. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "synth/gguf_write.h"
#include "f64_ref.h"

enum { VOCAB = 40, EMBD = 32, LAYERS = 3, HEADS = 4, KV_HEADS = 2, HD = EMBD / HEADS, FF = 48, CTX = 64 };
enum { Q_DIM = HEADS * HD, KV_DIM = KV_HEADS * HD };
#define EPS 1e-5
#define ROPE_BASE 10000.0

static const arch_desc toy_postnorm = {
    .name = "toy-postnorm",
    ARCH_DENSE_LISTS,
    .rope = ARCH_ROPE_NORMAL,
    .pattern = {{.norm = ARCH_NORM_SANDWICH, .attn = ARCH_ATTN_FULL, .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU},
                {.norm = ARCH_NORM_POST, .attn = ARCH_ATTN_FULL, .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU}},
    .pattern_len = 2,
};

/* The same with linear-recurrent attention on the odd layers, which no CPU block runs yet:
 * the engine must refuse it, not run it as full attention; and with sliding-window layers
 * but no key for the window, which the loader refuses.  Made from the toy in setup. */
static arch_desc toy_linear, toy_sliding;

/* A descriptor with no layer pattern: the loader refuses it, naming the family. */
static arch_desc toy_broken;

/* ---- the weights, kept as written ------------------------------------------------------ */

typedef struct toy_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *attn_post_norm; /* a norm the layer lacks is NULL */
    float *ffn_norm, *w_gate, *w_up, *w_down, *ffn_post_norm;
} toy_layer;

typedef struct toy {
    float *tok_embd, *output_norm, *output;
    toy_layer layers[LAYERS];
    ref_tensors rt; /* every array, to free */
} toy;

static void set_key(gguf_writer *w, const char *arch, const char *suffix, uint32_t v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (strcmp(suffix, "attention.layer_norm_rms_epsilon") == 0) gguf_writer_set_f32(w, key, (float)EPS);
    else gguf_writer_set_u32(w, key, v);
}

/* The GGUF image of the toy as family `arch` (malloc'd), its weights in *t. */
static void *toy_build(toy *t, const char *arch, const char *omit, size_t *size)
{
    memset(t, 0, sizeof *t);
    gguf_writer *w = gguf_writer_new();
    t->rt = (ref_tensors){.w = w, .omit = omit, .rng = 42};
    gguf_writer_set_str(w, "general.architecture", arch);
    set_key(w, arch, "context_length", CTX);
    set_key(w, arch, "embedding_length", EMBD);
    set_key(w, arch, "block_count", LAYERS);
    set_key(w, arch, "feed_forward_length", FF);
    set_key(w, arch, "attention.head_count", HEADS);
    set_key(w, arch, "attention.head_count_kv", KV_HEADS);
    set_key(w, arch, "attention.layer_norm_rms_epsilon", 0);
    t->tok_embd = ref_add(&t->rt, "token_embd.weight", EMBD, VOCAB, 0.0f, 1.0f);
    t->output_norm = ref_add(&t->rt, "output_norm.weight", EMBD, 1, 1.0f, 0.2f);
    t->output = ref_add(&t->rt, "output.weight", EMBD, VOCAB, 0.0f, 0.2f);
    for (int il = 0; il < LAYERS; il++) {
        toy_layer *L = &t->layers[il];
        bool pre = il % 2 == 0; /* sandwich on even layers, post-norm only on odd ones */
        char n[64];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
        if (pre) L->attn_norm = ref_add(&t->rt, NAME("attn_norm.weight"), EMBD, 1, 1.0f, 0.2f);
        L->wq = ref_add(&t->rt, NAME("attn_q.weight"), EMBD, Q_DIM, 0.0f, 0.35f);
        L->wk = ref_add(&t->rt, NAME("attn_k.weight"), EMBD, KV_DIM, 0.0f, 0.35f);
        L->wv = ref_add(&t->rt, NAME("attn_v.weight"), EMBD, KV_DIM, 0.0f, 0.35f);
        L->wo = ref_add(&t->rt, NAME("attn_output.weight"), Q_DIM, EMBD, 0.0f, 0.18f);
        L->attn_post_norm = ref_add(&t->rt, NAME("post_attention_norm.weight"), EMBD, 1, 0.5f, 0.2f);
        if (pre) L->ffn_norm = ref_add(&t->rt, NAME("ffn_norm.weight"), EMBD, 1, 1.0f, 0.2f);
        L->w_gate = ref_add(&t->rt, NAME("ffn_gate.weight"), EMBD, FF, 0.0f, 0.35f);
        L->w_up = ref_add(&t->rt, NAME("ffn_up.weight"), EMBD, FF, 0.0f, 0.35f);
        L->w_down = ref_add(&t->rt, NAME("ffn_down.weight"), FF, EMBD, 0.0f, 0.15f);
        L->ffn_post_norm = ref_add(&t->rt, NAME("post_ffw_norm.weight"), EMBD, 1, 0.5f, 0.2f);
#undef NAME
    }
    void *image = NULL;
    if (gguf_writer_write_mem(w, &image, size) != 0) image = NULL;
    gguf_writer_free(w);
    return image;
}

static void toy_free(toy *t)
{
    ref_free(&t->rt);
}

static model *toy_load(const void *image, size_t size, char *err, size_t errlen)
{
    gguf_file *f = gguf_open_memory(image, size, err, errlen);
    return f ? model_from_gguf(f, err, errlen) : NULL;
}

/* The toy as `arch` without `omit`, loaded (the test fails if it is refused). */
typedef struct loaded {
    toy t;
    void *image;
    model *m;
} loaded;

static void load(loaded *L, const char *arch, const char *omit)
{
    size_t size;
    char err[512];
    L->image = toy_build(&L->t, arch, omit, &size);
    assert_non_null(L->image);
    L->m = toy_load(L->image, size, err, sizeof err);
    if (!L->m) fail_msg("load: %s", err);
}

static void unload(loaded *L)
{
    model_free(L->m);
    free(L->image);
    toy_free(&L->t);
}

/* ---- the float64 reference, straight from the formulas --------------------------------- */

static void rmsnorm(double *out, const double *x, const float *w, int n)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / n + EPS);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void rope(double *v, int n_head, int pos) /* llama's: adjacent pairs */
{
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < HD / 2; i++) {
            double th = pos * pow(ROPE_BASE, -2.0 * i / HD), a = v[h * HD + 2 * i], b = v[h * HD + 2 * i + 1];
            v[h * HD + 2 * i] = a * cos(th) - b * sin(th);
            v[h * HD + 2 * i + 1] = a * sin(th) + b * cos(th);
        }
}

/* x += post(block(pre(x))): the norm placement, one residual block at a time. */
static void attention_block(const toy_layer *L, int il, double (*kc)[LAYERS][KV_DIM], double (*vc)[LAYERS][KV_DIM],
                            int p, const double *in, double *out)
{
    double q[Q_DIM], att[CTX], o[Q_DIM];
    ref_matvec(L->wq, in, q, EMBD, Q_DIM);
    ref_matvec(L->wk, in, kc[p][il], EMBD, KV_DIM);
    ref_matvec(L->wv, in, vc[p][il], EMBD, KV_DIM);
    rope(q, HEADS, p);
    rope(kc[p][il], KV_HEADS, p);
    for (int h = 0; h < HEADS; h++) {
        int kvh = h / (HEADS / KV_HEADS);
        double max = -INFINITY, sum = 0.0;
        for (int j = 0; j <= p; j++) {
            double s = 0.0;
            for (int i = 0; i < HD; i++) s += q[h * HD + i] * kc[j][il][kvh * HD + i];
            att[j] = s / sqrt((double)HD);
            if (att[j] > max) max = att[j];
        }
        for (int j = 0; j <= p; j++) sum += att[j] = exp(att[j] - max);
        for (int i = 0; i < HD; i++) {
            double acc = 0.0;
            for (int j = 0; j <= p; j++) acc += att[j] / sum * vc[j][il][kvh * HD + i];
            o[h * HD + i] = acc;
        }
    }
    ref_matvec(L->wo, o, out, Q_DIM, EMBD);
}

static void ffn_block(const toy_layer *L, const double *in, double *out)
{
    double gate[FF], up[FF];
    ref_matvec(L->w_gate, in, gate, EMBD, FF);
    ref_matvec(L->w_up, in, up, EMBD, FF);
    for (int i = 0; i < FF; i++) gate[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
    ref_matvec(L->w_down, gate, out, FF, EMBD);
}

static void add_normed(double *x, double *delta, const float *post)
{
    rmsnorm(delta, delta, post, EMBD);
    for (int i = 0; i < EMBD; i++) x[i] += delta[i];
}

/* Logits of every position of tokens[0..n-1]. */
static void reference(const toy *t, const int32_t *tokens, int n, double *logits)
{
    static double kc[CTX][LAYERS][KV_DIM], vc[CTX][LAYERS][KV_DIM];
    for (int p = 0; p < n; p++) {
        double x[EMBD], in[EMBD], delta[EMBD];
        for (int i = 0; i < EMBD; i++) x[i] = t->tok_embd[(size_t)tokens[p] * EMBD + i];
        for (int il = 0; il < LAYERS; il++) {
            const toy_layer *L = &t->layers[il];
            if (L->attn_norm) rmsnorm(in, x, L->attn_norm, EMBD);
            else memcpy(in, x, sizeof in);
            attention_block(L, il, kc, vc, p, in, delta);
            add_normed(x, delta, L->attn_post_norm);
            if (L->ffn_norm) rmsnorm(in, x, L->ffn_norm, EMBD);
            else memcpy(in, x, sizeof in);
            ffn_block(L, in, delta);
            add_normed(x, delta, L->ffn_post_norm);
        }
        rmsnorm(in, x, t->output_norm, EMBD);
        ref_matvec(t->output, in, logits + (size_t)p * VOCAB, EMBD, VOCAB);
    }
}

/* ---- tests ------------------------------------------------------------------------------- */

static int setup_registry(void **state)
{
    (void)state;
    toy_linear = toy_postnorm;
    toy_linear.name = "toy-linear";
    toy_linear.pattern[1].attn = ARCH_ATTN_LINEAR;
    toy_sliding = toy_postnorm;
    toy_sliding.name = "toy-sliding";
    toy_sliding.pattern[1].attn = ARCH_ATTN_SLIDING;
    toy_broken = toy_postnorm;
    toy_broken.name = "toy-broken";
    toy_broken.pattern_len = 0;
    return arch_register(&toy_postnorm) < 0 || arch_register(&toy_linear) < 0 || arch_register(&toy_sliding) < 0 ||
           arch_register(&toy_broken) < 0;
}

static void test_loads_by_its_recipe(void **state)
{
    (void)state;
    loaded L;
    load(&L, "toy-postnorm", NULL);
    const model *m = L.m;
    assert_ptr_equal(m->desc, &toy_postnorm);
    assert_string_equal(model_arch_name(m->hp.arch), "toy-postnorm");
    for (int il = 0; il < LAYERS; il++) {
        const model_layer *ly = &m->layers[il];
        assert_int_equal(ly->recipe.norm, il % 2 ? ARCH_NORM_POST : ARCH_NORM_SANDWICH);
        assert_true((ly->attn_norm.data != NULL) == (il % 2 == 0)); /* the pre-norms of sandwich layers only */
        assert_true((ly->ffn_norm.data != NULL) == (il % 2 == 0));
        assert_non_null(ly->attn_post_norm.data);
        char name[64];
        snprintf(name, sizeof name, "blk.%d.post_ffw_norm.weight", il);
        assert_string_equal(ly->ffn_post_norm.name, name);
        assert_null(ly->bq.data);
    }
    char line[160];
    arch_layer_describe(&m->layers[1].recipe, line, sizeof line);
    assert_string_equal(line, "post-norm, full attention, GLU silu");
    unload(&L);
}

static void test_cpu_logits_match_reference(void **state)
{
    (void)state;
    loaded L;
    load(&L, "toy-postnorm", NULL);
    char err[512];
    engine_config cfg = {.n_slots = 2, .ctx_per_slot = 32, .max_batch_tokens = 32, .n_threads = 2};
    engine *e = engine_open(ENGINE_DEVICE_CPU, L.m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);

    enum { PROMPT = 7, TOTAL = 11 };
    int32_t tokens[TOTAL] = {3, 17, 5, 39, 0, 22, 8};
    static float got[TOTAL * VOCAB];
    static double want[TOTAL * VOCAB];
    sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = 0.0f;
    /* The prompt in one step (every position's logits), then greedy decode token by token. */
    for (int p = 0, n = PROMPT; p < TOTAL; p += n, n = 1) {
        engine_seq s = {.slot = 1, .tokens = tokens + p, .n_tokens = n, .pos = p, .want_token = true, .sp = &sp,
                        .logits = got + (size_t)p * VOCAB, .logits_all = true};
        engine_result r;
        if (engine_step(e, &s, 1, &r, err, sizeof err) != 0) fail_msg("step: %s", err);
        if (p + n < TOTAL) tokens[p + n] = r.token;
    }
    reference(&L.t, tokens, TOTAL, want);
    double worst = 0.0;
    for (int p = 0; p < TOTAL; p++) {
        double diff = 0.0, scale = 1e-30;
        for (int i = 0; i < VOCAB; i++) {
            double d = fabs(got[p * VOCAB + i] - want[p * VOCAB + i]);
            diff = d > diff || isnan(d) ? d : diff;
            scale = fmax(scale, fabs(want[p * VOCAB + i]));
        }
        worst = fmax(worst, diff / scale);
    }
    print_message("  toy-postnorm: max rel error %.2e over %d positions\n", worst, TOTAL);
    assert_true(worst < 1e-4);

    engine_free(e);
    unload(&L);
}

static void expect_load_error(const char *arch, const char *omit, const char *fragment)
{
    toy t;
    size_t size;
    char err[512] = "";
    void *image = toy_build(&t, arch, omit, &size);
    model *m = toy_load(image, size, err, sizeof err);
    assert_null(m);
    if (!strstr(err, fragment)) fail_msg("error '%s' lacks '%s'", err, fragment);
    free(image);
    toy_free(&t);
}

static void test_errors_name_the_recipe_tensors(void **state)
{
    (void)state;
    expect_load_error("toy-postnorm", "blk.1.post_ffw_norm.weight", "missing tensor 'blk.1.post_ffw_norm.weight'");
    expect_load_error("toy-postnorm", "blk.2.attn_norm.weight", "missing tensor 'blk.2.attn_norm.weight'");
    expect_load_error("toy-broken", NULL, "toy-broken: the family's layer pattern has 0 entries (1 to 8)");
    /* gated DeltaNet layers in a family without the ssm keys: refused, never divided by zero */
    expect_load_error("toy-linear", NULL, "toy-linear: gated DeltaNet layers need ssm.group_count");
    /* A post-norm-only layer needs no pre-norm, so that one is not asked for. */
    loaded L;
    load(&L, "toy-postnorm", "blk.1.attn_norm.weight");
    unload(&L);
}

static void test_registry(void **state)
{
    (void)state;
    assert_int_equal(arch_register(&toy_postnorm), -1); /* the name is taken */
    assert_ptr_equal(arch_find("qwen2", 5), &arch_qwen2);
    assert_ptr_equal(arch_find("toy-postnorm", 12), &toy_postnorm);
    assert_null(arch_find("toy", 3));
    char names[256];
    arch_names(names, sizeof names);
    assert_string_equal(names, "llama, qwen2, qwen3, qwen3moe, gemma3, gemma4, qwen35, qwen35moe, qwen3next, bert, gpt-oss, phi3, "
                               "glm4moe, deepseek2, nomic-bert, jina-bert-v2, toy-postnorm, toy-linear, toy-sliding, toy-broken");
}

/* A backend refuses a feature it lacks, naming it and the layer. */
static void test_unimplemented_features_refused(void **state)
{
    (void)state;
    loaded L;
    char err[512];
    load(&L, "toy-postnorm", NULL);
    /* like the GPU's: sandwich norms but not post-norm alone */
    const arch_features no_post = ARCH_F_NORM_PRE | ARCH_F_NORM_SANDWICH | ARCH_F_ATTN_FULL | ARCH_F_FFN_GLU | ARCH_F_ACT_SILU;
    assert_int_equal(model_check_features(L.m, no_post, "test", err, sizeof err), -1);
    assert_string_equal(err, "the test backend does not implement post-norm (layer 1 of toy-postnorm)");
    assert_int_equal(model_check_features(L.m, no_post & ~ARCH_F_NORM_SANDWICH, "test", err, sizeof err), -1);
    assert_string_equal(err, "the test backend does not implement sandwich-norm (layer 0 of toy-postnorm)");
    assert_int_equal(model_check_features(L.m, no_post | ARCH_F_NORM_POST, "test", err, sizeof err), 0);
    unload(&L);

    /* A sliding layer needs its window: a family without the key is refused at load. */
    size_t size;
    toy t;
    void *image = toy_build(&t, "toy-sliding", NULL, &size);
    assert_null(toy_load(image, size, err, sizeof err));
    assert_string_equal(err, "layer 1 of toy-sliding is a sliding-window layer but "
                             "toy-sliding.attention.sliding_window is not set");
    free(image);
    toy_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loads_by_its_recipe),
        cmocka_unit_test(test_cpu_logits_match_reference),
        cmocka_unit_test(test_errors_name_the_recipe_tensors),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_unimplemented_features_refused),
    };
    return cmocka_run_group_tests(tests, setup_registry, NULL);
}
