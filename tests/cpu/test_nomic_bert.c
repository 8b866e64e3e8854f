/* test_nomic_bert.c - the encoders whose Hugging Face classes are remote code, on the CPU
 * engine: nomic-bert (nomic-embed-text v1 / v1.5) and jina-bert-v2 (jina-embeddings-v2).  There
 * is no transformers reference for them in ../shared/reference, so a tiny one of each is written
 * here as a GGUF in llama.cpp's layout (random weights) and the engine's hidden states and
 * mean-pooled embedding must match a plain float64 forward pass of the model as its publisher's
 * code defines it, over the very weights written:
 *   x = LayerNorm(tok_embd[id] + token_types[0])
 *   nomic-bert, per layer: q, k, v = split(Wqkv x); q, k = rope_neox(q, k, base 1000)
 *              x = LayerNorm(x + Wo softmax(q k^T / sqrt(d)) v)     (every token sees all)
 *              x = LayerNorm(x + Wdown (Wup x * silu(Wgate x)))    (fc2(fc11 x * silu(fc12 x)))
 *   jina-bert-v2, per layer: q, k, v = Wq x + bq, Wk x + bk, Wv x + bv
 *              x = LayerNorm(x + Wo softmax(q k^T / sqrt(d) - m_h |i - j|) v + bo)  (ALiBi: the
 *                  slopes of the ALiBi paper's get_slopes, as jina's code builds them)
 *              [g | u] = Wgated x; x = LayerNorm(x + Wo2 (gelu_erf(g) * u) + bo2)
 *   embedding = mean over the tokens, L2-normalised.
 * Also what holds without any reference: attention is bidirectional (changing the last token
 * moves the first row), sequences side by side in one step equal each alone, and the loader
 * names a missing tensor (jina-bert-v2: and refuses the code model's q/k norms it does not run).
 * `test_nomic_bert --write FILE` writes the nomic-bert GGUF (with a WordPiece vocabulary, so
 * llama.cpp loads it too) and prints its token ids and float64 embedding, for a cross-check
 * against llama.cpp (../shared/reference/lcpp_ref.c ... embed). */
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

/* 6 heads: ALiBi's slopes for a head count that is no power of two take both of its series */
enum { VOCAB = 40, EMBD = 48, LAYERS = 2, HEADS = 6, HD = EMBD / HEADS, FF = 40, CTX = 64, TYPES = 2 };
typedef enum family { NOMIC, JINA } family;
static const char *const FAMILY_NAME[] = {"nomic-bert", "jina-bert-v2"};
enum { MAX_TOK = 16 };
#define EPS 1e-12
#define ROPE_BASE 1000.0

/* ---- the weights, kept as written ------------------------------------------------------ */

typedef struct nb_layer {
    float *wqkv, *wo, *attn_norm_w, *attn_norm_b, *w_gate, *w_up, *w_down, *out_norm_w, *out_norm_b;
    /* jina-bert-v2: its separate projections and biases, the fused [gate | up] and down's bias */
    float *wq, *wk, *wv, *bq, *bk, *bv, *bo, *w_gate_up, *b_down;
} nb_layer;

typedef struct nb {
    family fam;
    float *tok_embd, *tok_types, *embd_norm_w, *embd_norm_b;
    nb_layer layers[LAYERS];
    ref_tensors rt;
} nb;

/* A WordPiece vocabulary of VOCAB pieces ([PAD] [UNK] [CLS] [SEP] [MASK], then letters), so that
 * the file is one llama.cpp loads as well. */
static void add_vocab(gguf_writer *w)
{
    static const char *const special[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    const char *toks[VOCAB];
    char pieces[VOCAB][8];
    int32_t types[VOCAB];
    for (int i = 0; i < VOCAB; i++) {
        if (i < 5) toks[i] = special[i];
        else snprintf(pieces[i], sizeof pieces[i], "%s%c", i < 5 + 26 ? "" : "##", 'a' + (i - 5) % 26), toks[i] = pieces[i];
        types[i] = i < 5 ? 3 : 1;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "bert");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, VOCAB);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, VOCAB);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.cls_token_id", 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", 3);
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 0);
}

/* The family's layer tensors of layer il (nb_build). */
static void nb_layer_tensors(nb *t, int il)
{
    nb_layer *L = &t->layers[il];
    char n[64];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, il), n)
    if (t->fam == NOMIC) {
        L->wqkv = ref_add(&t->rt, NAME("attn_qkv.weight"), EMBD, 3 * EMBD, 0.0f, 0.4f);
        L->wo = ref_add(&t->rt, NAME("attn_output.weight"), EMBD, EMBD, 0.0f, 0.2f);
    } else {
        L->wq = ref_add(&t->rt, NAME("attn_q.weight"), EMBD, EMBD, 0.0f, 0.4f);
        L->bq = ref_add(&t->rt, NAME("attn_q.bias"), EMBD, 1, 0.0f, 0.2f);
        L->wk = ref_add(&t->rt, NAME("attn_k.weight"), EMBD, EMBD, 0.0f, 0.4f);
        L->bk = ref_add(&t->rt, NAME("attn_k.bias"), EMBD, 1, 0.0f, 0.2f);
        L->wv = ref_add(&t->rt, NAME("attn_v.weight"), EMBD, EMBD, 0.0f, 0.4f);
        L->bv = ref_add(&t->rt, NAME("attn_v.bias"), EMBD, 1, 0.0f, 0.2f);
        L->wo = ref_add(&t->rt, NAME("attn_output.weight"), EMBD, EMBD, 0.0f, 0.2f);
        L->bo = ref_add(&t->rt, NAME("attn_output.bias"), EMBD, 1, 0.0f, 0.2f);
    }
    L->attn_norm_w = ref_add(&t->rt, NAME("attn_output_norm.weight"), EMBD, 1, 1.0f, 0.2f);
    L->attn_norm_b = ref_add(&t->rt, NAME("attn_output_norm.bias"), EMBD, 1, 0.0f, 0.1f);
    if (t->fam == NOMIC) {
        L->w_gate = ref_add(&t->rt, NAME("ffn_gate.weight"), EMBD, FF, 0.0f, 0.35f);
        L->w_up = ref_add(&t->rt, NAME("ffn_up.weight"), EMBD, FF, 0.0f, 0.35f);
        L->w_down = ref_add(&t->rt, NAME("ffn_down.weight"), FF, EMBD, 0.0f, 0.15f);
    } else {
        L->w_gate_up = ref_add(&t->rt, NAME("ffn_up.weight"), EMBD, 2 * FF, 0.0f, 0.35f);
        L->w_down = ref_add(&t->rt, NAME("ffn_down.weight"), FF, EMBD, 0.0f, 0.15f);
        L->b_down = ref_add(&t->rt, NAME("ffn_down.bias"), EMBD, 1, 0.0f, 0.2f);
    }
    L->out_norm_w = ref_add(&t->rt, NAME("layer_output_norm.weight"), EMBD, 1, 1.0f, 0.2f);
    L->out_norm_b = ref_add(&t->rt, NAME("layer_output_norm.bias"), EMBD, 1, 0.0f, 0.1f);
#undef NAME
}

/* "<family>.<suffix>" */
static const char *key(const nb *t, const char *suffix)
{
    static char k[96];
    snprintf(k, sizeof k, "%s.%s", FAMILY_NAME[t->fam], suffix);
    return k;
}

/* The GGUF image (malloc'd) of a tiny model of family fam without tensor `omit` and, when
 * `extra` is given, with that tensor more (a vector of EMBD); its weights in *t. */
static void *nb_build(nb *t, family fam, const char *omit, const char *extra, size_t *size)
{
    memset(t, 0, sizeof *t);
    t->fam = fam;
    gguf_writer *w = gguf_writer_new();
    t->rt = (ref_tensors){.w = w, .omit = omit, .rng = 2024};
    gguf_writer_set_str(w, "general.architecture", FAMILY_NAME[fam]);
    gguf_writer_set_u32(w, key(t, "context_length"), CTX);
    gguf_writer_set_u32(w, key(t, "embedding_length"), EMBD);
    gguf_writer_set_u32(w, key(t, "block_count"), LAYERS);
    gguf_writer_set_u32(w, key(t, "feed_forward_length"), FF);
    gguf_writer_set_u32(w, key(t, "attention.head_count"), HEADS);
    gguf_writer_set_f32(w, key(t, "attention.layer_norm_epsilon"), (float)EPS);
    gguf_writer_set_bool(w, key(t, "attention.causal"), false);
    if (fam == NOMIC) gguf_writer_set_f32(w, key(t, "rope.freq_base"), (float)ROPE_BASE);
    gguf_writer_set_u32(w, key(t, "pooling_type"), 1); /* mean */
    gguf_writer_set_u32(w, "tokenizer.ggml.token_type_count", TYPES);
    add_vocab(w);
    t->tok_embd = ref_add(&t->rt, "token_embd.weight", EMBD, VOCAB, 0.0f, 1.0f);
    t->tok_types = ref_add(&t->rt, "token_types.weight", EMBD, TYPES, 0.0f, 0.5f);
    t->embd_norm_w = ref_add(&t->rt, "token_embd_norm.weight", EMBD, 1, 1.0f, 0.2f);
    t->embd_norm_b = ref_add(&t->rt, "token_embd_norm.bias", EMBD, 1, 0.0f, 0.1f);
    for (int il = 0; il < LAYERS; il++) nb_layer_tensors(t, il);
    if (extra) ref_add(&t->rt, extra, EMBD, 1, 1.0f, 0.1f);
    void *image = NULL;
    if (gguf_writer_write_mem(w, &image, size) != 0) image = NULL;
    gguf_writer_free(w);
    return image;
}

static void nb_free(nb *t) { ref_free(&t->rt); }

/* ---- the float64 forward pass ----------------------------------------------------------- */

static void layernorm(double *x, const float *w, const float *b)
{
    double mean = 0, var = 0;
    for (int i = 0; i < EMBD; i++) mean += x[i];
    mean /= EMBD;
    for (int i = 0; i < EMBD; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= EMBD;
    double inv = 1.0 / sqrt(var + EPS);
    for (int i = 0; i < EMBD; i++) x[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* NeoX rotary (nomic's rotary_emb_interleaved = false): pair (i, i + HD/2) of every head. */
static void rope_neox(double *v, int pos)
{
    for (int h = 0; h < HEADS; h++)
        for (int i = 0; i < HD / 2; i++) {
            double th = pos * pow(ROPE_BASE, -2.0 * i / HD), c = cos(th), s = sin(th);
            double *a = v + h * HD + i, *b = a + HD / 2, x0 = *a, x1 = *b;
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
        }
}

/* ALiBi's slopes as the paper's get_slopes (and jina's code) build them: for a power of two n,
 * start^(i+1) with start = 2^(-8/n); otherwise those of the power of two below n, then every
 * other slope of twice that power, up to n. */
static void alibi_slopes(double *m, int n)
{
    int p = 1;
    while (p * 2 <= n) p *= 2;
    for (int i = 0; i < p; i++) m[i] = pow(pow(2.0, -8.0 / p), i + 1);
    for (int i = 0; p + i < n; i++) m[p + i] = pow(pow(2.0, -8.0 / (2 * p)), 2 * i + 1);
}

/* y = W x + b (b NULL: none) */
static void affine(const float *w, const float *b, const double *x, double *y, int cols, int rows)
{
    ref_matvec(w, x, y, cols, rows);
    for (int r = 0; b && r < rows; r++) y[r] += b[r];
}

/* q, k, v of every position from the layer's input (nomic: the fused rows, then RoPE; jina:
 * biased projections, positions left to ALiBi). */
static void project_qkv(const nb *t, const nb_layer *L, double (*x)[EMBD], int n, double (*q)[EMBD],
                        double (*k)[EMBD], double (*v)[EMBD])
{
    double qkv[3 * EMBD];
    for (int p = 0; p < n; p++) {
        if (t->fam == JINA) {
            affine(L->wq, L->bq, x[p], q[p], EMBD, EMBD);
            affine(L->wk, L->bk, x[p], k[p], EMBD, EMBD);
            affine(L->wv, L->bv, x[p], v[p], EMBD, EMBD);
            continue;
        }
        ref_matvec(L->wqkv, x[p], qkv, EMBD, 3 * EMBD);
        memcpy(q[p], qkv, sizeof q[p]);
        memcpy(k[p], qkv + EMBD, sizeof k[p]);
        memcpy(v[p], qkv + 2 * EMBD, sizeof v[p]);
        rope_neox(q[p], p);
        rope_neox(k[p], p);
    }
}

/* The feed-forward of o into d (nomic: the SwiGLU; jina: the GEGLU with the exact GELU and
 * down's bias). */
static void feed_forward(const nb *t, const nb_layer *L, const double *o, double *d)
{
    double g[2 * FF], u[FF];
    if (t->fam == JINA) {
        ref_matvec(L->w_gate_up, o, g, EMBD, 2 * FF); /* gate rows first, then up's */
        for (int i = 0; i < FF; i++) g[i] = 0.5 * g[i] * (1.0 + erf(g[i] / sqrt(2.0))) * g[FF + i];
        affine(L->w_down, L->b_down, g, d, FF, EMBD);
        return;
    }
    ref_matvec(L->w_gate, o, g, EMBD, FF);
    ref_matvec(L->w_up, o, u, EMBD, FF);
    for (int i = 0; i < FF; i++) g[i] = u[i] * g[i] / (1.0 + exp(-g[i]));
    ref_matvec(L->w_down, g, d, FF, EMBD);
}

/* hidden[n][EMBD]: the last layer's output for tokens[0..n). */
static void reference(const nb *t, const int32_t *tokens, int n, double (*hidden)[EMBD])
{
    static double q[MAX_TOK][EMBD], k[MAX_TOK][EMBD], v[MAX_TOK][EMBD];
    double att[EMBD], o[EMBD], d[EMBD], slope[HEADS];
    alibi_slopes(slope, HEADS);
    for (int p = 0; p < n; p++) {
        for (int i = 0; i < EMBD; i++)
            hidden[p][i] = (double)t->tok_embd[(size_t)tokens[p] * EMBD + i] + t->tok_types[i];
        layernorm(hidden[p], t->embd_norm_w, t->embd_norm_b);
    }
    for (int il = 0; il < LAYERS; il++) {
        const nb_layer *L = &t->layers[il];
        project_qkv(t, L, hidden, n, q, k, v);
        for (int p = 0; p < n; p++) {
            for (int h = 0; h < HEADS; h++) {
                double sc[MAX_TOK], mx = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) { /* every key: bidirectional */
                    double s = 0;
                    for (int i = 0; i < HD; i++) s += q[p][h * HD + i] * k[j][h * HD + i];
                    sc[j] = s / sqrt((double)HD) - (t->fam == JINA ? slope[h] * abs(p - j) : 0.0);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j < n; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int i = 0; i < HD; i++) {
                    double a = 0;
                    for (int j = 0; j < n; j++) a += sc[j] / sum * v[j][h * HD + i];
                    att[h * HD + i] = a;
                }
            }
            /* hidden[p] (the layer's input) is read here last: the other positions' K and V
             * were made from it above */
            affine(L->wo, L->bo, att, o, EMBD, EMBD);
            for (int i = 0; i < EMBD; i++) o[i] += hidden[p][i];
            layernorm(o, L->attn_norm_w, L->attn_norm_b);
            feed_forward(t, L, o, d);
            for (int i = 0; i < EMBD; i++) hidden[p][i] = d[i] + o[i];
            layernorm(hidden[p], L->out_norm_w, L->out_norm_b);
        }
    }
}

static void mean_l2(double (*hidden)[EMBD], int n, double *out)
{
    double norm = 0;
    for (int i = 0; i < EMBD; i++) {
        double s = 0;
        for (int p = 0; p < n; p++) s += hidden[p][i];
        out[i] = s / n;
        norm += out[i] * out[i];
    }
    for (int i = 0; i < EMBD; i++) out[i] /= sqrt(norm);
}

/* ---- fixture ------------------------------------------------------------------------------ */

typedef struct fixture {
    nb t;
    void *image;
    model *m;
    engine *e;
} fixture;

static model *load_image(const void *image, size_t size, char *err, size_t errlen)
{
    gguf_file *f = gguf_open_memory(image, size, err, errlen);
    return f ? model_from_gguf(f, err, errlen) : NULL;
}

static int setup(void **state, family fam)
{
    fixture *f = calloc(1, sizeof *f);
    size_t size;
    char err[512];
    f->image = nb_build(&f->t, fam, NULL, NULL, &size);
    if (!f->image) return -1;
    if (!(f->m = load_image(f->image, size, err, sizeof err))) {
        fprintf(stderr, "load: %s\n", err);
        return -1;
    }
    engine_config cfg = {.n_slots = 3, .ctx_per_slot = CTX, .max_batch_tokens = CTX, .n_threads = 2};
    if (!(f->e = engine_open(ENGINE_DEVICE_CPU, f->m, &cfg, err, sizeof err))) {
        fprintf(stderr, "engine: %s\n", err);
        return -1;
    }
    *state = f;
    return 0;
}

static int setup_nomic(void **state) { return setup(state, NOMIC); }
static int setup_jina(void **state) { return setup(state, JINA); }

static int teardown(void **state)
{
    fixture *f = *state;
    if (!f) return 0; /* setup failed before it had one */
    engine_free(f->e);
    model_free(f->m);
    free(f->image);
    nb_free(&f->t);
    free(f);
    return 0;
}

/* n_seqs prompts side by side in one step, each asking for `pooling` (normalised unless none). */
static void embed(fixture *f, const int32_t *const *tokens, const int *n, int n_seqs, engine_pooling pooling,
                  float **out)
{
    engine_embed em[3];
    engine_seq seqs[3];
    for (int s = 0; s < n_seqs; s++) {
        em[s] = (engine_embed){.pooling = pooling, .normalize = pooling != ENGINE_POOL_NONE, .out = out[s]};
        seqs[s] = (engine_seq){.slot = s, .tokens = tokens[s], .n_tokens = n[s], .embed = &em[s]};
    }
    char err[256];
    if (engine_step(f->e, seqs, n_seqs, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
}

static double rel_err(const float *got, const double *want, int n)
{
    double diff = 0, scale = 1e-30;
    for (int i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        diff = d > diff || isnan(d) ? d : diff;
        scale = fmax(scale, fabs(want[i]));
    }
    return diff / scale;
}

static const int32_t PROMPT_A[] = {2, 7, 12, 30, 5, 19, 33, 3}, PROMPT_B[] = {2, 9, 3};
#define LEN(a) ((int)(sizeof(a) / sizeof(a)[0]))

/* ---- tests ------------------------------------------------------------------------------- */

/* The file loads as the family says: an encoder with mean pooling, no position table, and its
 * layers' recipe (nomic-bert: rotary, NeoX, base 1000, a SwiGLU; jina-bert-v2: ALiBi, the
 * fused gate/up's GEGLU with the exact GELU). */
static void test_loads_as_family(void **state)
{
    fixture *f = *state;
    assert_string_equal(f->m->desc->name, FAMILY_NAME[f->t.fam]);
    assert_true(f->m->hp.encoder);
    assert_int_equal(f->m->hp.pooling, ENGINE_POOL_MEAN);
    assert_null(f->m->pos_embd.data);
    char line[256];
    arch_layer_describe(&f->m->layers[0].recipe, line, sizeof line);
    print_message("  recipe: %s\n", line);
    if (f->t.fam == NOMIC) {
        assert_true(f->m->hp.rope_neox);
        assert_true(fabs(f->m->hp.rope_base - ROPE_BASE) < 1e-3);
        assert_non_null(strstr(line, "GLU silu"));
    } else {
        assert_non_null(strstr(line, "ALiBi"));
        assert_non_null(strstr(line, "GLU gelu-erf (fused gate/up)"));
        assert_ptr_equal(f->m->layers[1].w_up.data,
                         (const char *)f->m->layers[1].w_gate_up.data + (size_t)FF * f->m->layers[1].w_gate_up.row_bytes);
    }
}

/* Every hidden row and the normalised mean against the float64 pass, two prompts in one step. */
static void test_matches_float64_reference(void **state)
{
    fixture *f = *state;
    static double want_h[2][MAX_TOK][EMBD];
    static float hidden[2][MAX_TOK * EMBD], pooled[2][EMBD];
    const int32_t *toks[2] = {PROMPT_A, PROMPT_B};
    const int n[2] = {LEN(PROMPT_A), LEN(PROMPT_B)};
    float *outs_h[2] = {hidden[0], hidden[1]}, *outs_p[2] = {pooled[0], pooled[1]};
    embed(f, toks, n, 2, ENGINE_POOL_NONE, outs_h);
    embed(f, toks, n, 2, ENGINE_POOL_MEAN, outs_p);
    double worst_h = 0, worst_p = 0, worst_cos = 1;
    for (int s = 0; s < 2; s++) {
        double want_p[EMBD];
        reference(&f->t, toks[s], n[s], want_h[s]);
        mean_l2(want_h[s], n[s], want_p);
        for (int p = 0; p < n[s]; p++) worst_h = fmax(worst_h, rel_err(hidden[s] + p * EMBD, want_h[s][p], EMBD));
        worst_p = fmax(worst_p, rel_err(pooled[s], want_p, EMBD));
        double dot = 0;
        for (int i = 0; i < EMBD; i++) dot += pooled[s][i] * want_p[i];
        worst_cos = fmin(worst_cos, dot); /* both unit vectors (up to float rounding) */
    }
    print_message("  %s: hidden max rel %.2e, pooled max rel %.2e, cosine >= %.9f\n", FAMILY_NAME[f->t.fam],
                  worst_h, worst_p, worst_cos);
    assert_true(worst_h < 1e-5);
    assert_true(worst_p < 1e-5);
    assert_true(worst_cos >= 0.99999);
}

/* Without a reference: the first token's row moves when only the last token changes
 * (bidirectional attention; a causal mask would leave it), and a prompt alone equals the same
 * prompt beside another in one step. */
static void test_bidirectional_and_batch_consistent(void **state)
{
    fixture *f = *state;
    static float a[MAX_TOK * EMBD], b[MAX_TOK * EMBD], alone[EMBD], beside[2][EMBD];
    int32_t changed[LEN(PROMPT_A)];
    memcpy(changed, PROMPT_A, sizeof changed);
    changed[LEN(PROMPT_A) - 1] = 4;
    const int32_t *t1[1] = {PROMPT_A}, *t2[1] = {changed};
    const int n1[1] = {LEN(PROMPT_A)};
    float *oa[1] = {a}, *ob[1] = {b};
    embed(f, t1, n1, 1, ENGINE_POOL_NONE, oa);
    embed(f, t2, n1, 1, ENGINE_POOL_NONE, ob);
    double moved = 0;
    for (int i = 0; i < EMBD; i++) moved = fmax(moved, fabs(a[i] - b[i]));
    assert_true(moved > 1e-3);

    float *o1[1] = {alone};
    embed(f, t1, n1, 1, ENGINE_POOL_MEAN, o1);
    const int32_t *t3[2] = {PROMPT_B, PROMPT_A};
    const int n3[2] = {LEN(PROMPT_B), LEN(PROMPT_A)};
    float *o3[2] = {beside[0], beside[1]};
    embed(f, t3, n3, 2, ENGINE_POOL_MEAN, o3);
    for (int i = 0; i < EMBD; i++) assert_true(fabs(alone[i] - beside[1][i]) < 1e-6);
}

/* The family's file without `omit` or with `extra` is refused, naming `named`. */
static void check_refused(family fam, const char *omit, const char *extra, const char *named)
{
    nb t;
    size_t size;
    char err[512] = "";
    void *image = nb_build(&t, fam, omit, extra, &size);
    assert_non_null(image);
    model *m = load_image(image, size, err, sizeof err);
    assert_null(m);
    print_message("  refused: %s\n", err);
    assert_non_null(strstr(err, named));
    free(image);
    nb_free(&t);
}

/* A file without a tensor the family needs is refused, naming it; jina-bert-v2's code model's
 * q/k norms (which no backend runs) likewise, rather than run without them. */
static void test_missing_tensor_named(void **state)
{
    fixture *f = *state;
    const char *need = f->t.fam == NOMIC ? "blk.1.attn_qkv.weight" : "blk.1.ffn_down.bias";
    check_refused(f->t.fam, need, NULL, need);
    if (f->t.fam == JINA) check_refused(JINA, NULL, "blk.0.attn_q_norm.weight", "blk.0.attn_q_norm.weight");
}

/* --write FILE: the GGUF, then the ids of PROMPT_A and its float64 embedding on stdout. */
static int write_for_llamacpp(const char *path)
{
    nb t;
    size_t size;
    void *image = nb_build(&t, NOMIC, NULL, NULL, &size);
    FILE *fp = image ? fopen(path, "wb") : NULL;
    if (!fp || fwrite(image, 1, size, fp) != size || fclose(fp) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    static double h[MAX_TOK][EMBD];
    double pooled[EMBD];
    reference(&t, PROMPT_A, LEN(PROMPT_A), h);
    mean_l2(h, LEN(PROMPT_A), pooled);
    printf("%d 0", LEN(PROMPT_A));
    for (int i = 0; i < LEN(PROMPT_A); i++) printf(" %d", PROMPT_A[i]);
    printf("\n");
    for (int i = 0; i < EMBD; i++) printf("%.9g%c", pooled[i], i + 1 < EMBD ? ' ' : '\n');
    free(image);
    nb_free(&t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write") == 0) return write_for_llamacpp(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loads_as_family),
        cmocka_unit_test(test_matches_float64_reference),
        cmocka_unit_test(test_bidirectional_and_batch_consistent),
        cmocka_unit_test(test_missing_tensor_named),
    };
    int failed = cmocka_run_group_tests_name("nomic-bert", tests, setup_nomic, teardown);
    return failed + cmocka_run_group_tests_name("jina-bert-v2", tests, setup_jina, teardown);
}
