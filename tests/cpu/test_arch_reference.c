/* test_arch_reference.c - the CPU engine on the tiny random-weight models of
 * ../shared/reference (converted by llama.cpp's own converter) against Hugging Face
 * transformers' float64 logits (README.md there): every stored prompt position after one
 * prefill step, and the 16 greedy tokens by teacher-forced decode, one token per step.
 *
 * Tolerances.  F32 files: 5e-5 relative (a row's max |diff| over its max |reference|), the
 * bound the kit's README calls safe for an F32 implementation; llama.cpp lands at 8.5e-7 on
 * qwen3moe and transformers' own float32 run at 1.3e-6, so 5e-5 leaves room for a different
 * float32 summation order but not for a wrong formula (a wrong expert, weight or norm moves a
 * row by 1e-2 or more).  F16 files: the weights themselves are rounded (llama.cpp: 2e-3), and
 * F16 rounding can flip a near-tied top-k expert choice, which moves that row by ~1e-1: every
 * row within 2e-1 and 90 % of the rows within 1e-2.
 *
 * Quantised experts: the F32 file with its experts quantised to Q8_0 / Q4_0 against the same
 * file holding the dequantised values in F32: the same numbers, so F32 agreement (5e-5) and
 * identical greedy picks, which a comparison with transformers could not show (quantisation
 * moves a tiny random model's near-tied expert choices).  Greedy tokens must match wherever the
 * reference's top-1 margin exceeds twice our error on that row (the README's rule).
 *
 * Families: qwen3moe (F32, F16), mistral (the llama arch with head_dim != n_embd/n_head), phi3
 * (fused qkv and gate/up, partial LongRoPE; also: the long factors take over past the original
 * context) and glm4moe (dense first layer, sigmoid router with selection bias, shared expert,
 * partial RoPE).  What the GPU backend's feature set accepts of them is checked too.
 *
 * Also, without ../shared: a qwen3moe file whose router or experts are malformed is refused
 * at load with an error naming the tensor or key, and a backend without MoE refuses it. */
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/file.h"
#include "backend/backend.h"
#include "cpu/cpu_ops.h"
#include "gpu/gpu.h"
#include "model/quant.h"
#include "synth/gguf_write.h"

typedef struct tolerance {
    double every_row;   /* each row's relative error below this */
    double most_rows;   /* and at least `share` of the rows below this */
    double share;
} tolerance;

typedef struct ref_case {
    const char *gguf, *json;
    tolerance tol;
} ref_case;

#define F32_TOL {5e-5, 5e-5, 1.0}
static const ref_case CASES[] = {
    {"qwen3moe.gguf", "qwen3moe.json", F32_TOL},
    {"qwen3moe-f16.gguf", "qwen3moe.json", {2e-1, 1e-2, 0.9}},
    {"mistral.gguf", "mistral.json", F32_TOL}, /* llama arch, head_dim 32 != 64/4 */
    {"phi3.gguf", "phi3.json", F32_TOL},       /* fused qkv and gate/up, partial LongRoPE */
    {"glm4moe.gguf", "glm4moe.json", F32_TOL}, /* dense lead, sigmoid router, shared expert */
};

typedef struct fixture {
    const ref_case *c;
    model *m;
    engine *e;
    cJSON *ref;
    int n_vocab;
} fixture;

/* ---- the reference's arrays: base64 of little-endian float32 ---------------------------- */

static int b64_value(char ch)
{
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

/* The floats of a base64 string; *n their count. */
static float *b64_floats(const char *s, size_t *n)
{
    size_t len = strlen(s);
    unsigned char *bytes = malloc(len / 4 * 3 + 3);
    size_t nb = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len && s[i] != '='; i++) {
        int v = b64_value(s[i]);
        assert_true(v >= 0);
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            bytes[nb++] = (unsigned char)(acc >> bits);
        }
    }
    assert_int_equal(nb % 4, 0);
    *n = nb / 4;
    float *out = malloc(nb ? nb : 4);
    memcpy(out, bytes, nb); /* little-endian hosts only, as everything here */
    free(bytes);
    return out;
}

static int32_t *int_array(const cJSON *arr, int *n)
{
    *n = cJSON_GetArraySize(arr);
    int32_t *out = malloc((size_t)(*n ? *n : 1) * sizeof *out);
    for (int i = 0; i < *n; i++) out[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valueint;
    return out;
}

/* ---- comparison ------------------------------------------------------------------------ */

typedef struct row_error {
    double rel;      /* max |got - ref| / max |ref| */
    double abs;      /* max |got - ref| */
    int got_argmax;
} row_error;

static row_error compare_row(const float *got, const float *ref, int n)
{
    row_error r = {0};
    double ref_max = 1e-30;
    for (int i = 0; i < n; i++) {
        r.abs = fmax(r.abs, fabs((double)got[i] - ref[i]));
        ref_max = fmax(ref_max, fabs((double)ref[i]));
        if (got[i] > got[r.got_argmax]) r.got_argmax = i;
    }
    r.rel = r.abs / ref_max;
    return r;
}

typedef struct tally {
    int rows, rows_within;
    double worst;
} tally;

static void tally_row(tally *t, const tolerance *tol, row_error r)
{
    t->rows++;
    t->rows_within += r.rel < tol->most_rows;
    t->worst = fmax(t->worst, r.rel);
}

static void check_tally(const tally *t, const tolerance *tol, const char *what)
{
    print_message("  %s: %d rows, max rel error %.2e, %d within %.0e\n", what, t->rows, t->worst,
                  t->rows_within, tol->most_rows);
    assert_true(t->rows > 0);
    assert_true(t->worst < tol->every_row);
    assert_true(t->rows_within >= (int)ceil(tol->share * t->rows));
}

/* ---- fixture ----------------------------------------------------------------------------- */

/* src (an F32 qwen3moe) written again with its ffn_*_exps quantised to `type`, stored as
 * such or (as_f32) dequantised back to F32, as a model over *image. */
static model *requantise_experts(const model *src, ggml_type type, bool as_f32, void **image, char *err,
                                 size_t errlen)
{
    const model_hparams *hp = &src->hp;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    const struct {
        const char *key;
        int v;
    } keys[] = {{"qwen3moe.context_length", hp->n_ctx_train}, {"qwen3moe.embedding_length", hp->n_embd},
                {"qwen3moe.block_count", hp->n_layer}, {"qwen3moe.feed_forward_length", hp->n_ff},
                {"qwen3moe.attention.head_count", hp->n_head}, {"qwen3moe.attention.head_count_kv", hp->n_head_kv},
                {"qwen3moe.attention.key_length", hp->head_dim}, {"qwen3moe.expert_count", hp->n_expert},
                {"qwen3moe.expert_used_count", hp->n_expert_used},
                {"qwen3moe.expert_feed_forward_length", hp->n_ff_exp}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) gguf_writer_set_u32(w, keys[i].key, (uint32_t)keys[i].v);
    gguf_writer_set_f32(w, "qwen3moe.attention.layer_norm_rms_epsilon", hp->rms_eps);
    gguf_writer_set_f32(w, "qwen3moe.rope.freq_base", hp->rope_base);
    for (int64_t i = 0; i < gguf_n_tensors(src->gguf); i++) {
        const gguf_tensor *t = gguf_tensor_at(src->gguf, i);
        if (!strstr(t->name, "_exps.weight")) {
            gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes, true);
            continue;
        }
        assert_int_equal(t->type, GGML_TYPE_F32);
        const int64_t rows = t->ne[1] * t->ne[2];
        const size_t row_bytes = ggml_row_bytes(type, t->ne[0]);
        char *q = malloc(row_bytes * (size_t)rows);
        float *back = malloc((size_t)(rows * t->ne[0]) * sizeof *back);
        for (int64_t r = 0; r < rows; r++) {
            char *qr = q + (size_t)r * row_bytes;
            assert_true(quant_quantize_row(type, (const float *)t->data + r * t->ne[0], qr, t->ne[0]) > 0);
            quant_dequantize_row(type, qr, back + r * t->ne[0], t->ne[0]);
        }
        if (as_f32) gguf_writer_add_tensor(w, t->name, GGML_TYPE_F32, t->n_dims, t->ne, back, t->nbytes, false);
        else gguf_writer_add_tensor(w, t->name, type, t->n_dims, t->ne, q, row_bytes * (size_t)rows, false);
        free(q), free(back);
    }
    size_t size = 0;
    int rc = gguf_writer_write_mem(w, image, &size);
    gguf_writer_free(w);
    assert_int_equal(rc, 0);
    gguf_file *g = gguf_open_memory(*image, size, err, errlen);
    return g ? model_from_gguf(g, err, errlen) : NULL;
}

static int setup(void **state, const ref_case *c)
{
    fixture *f = calloc(1, sizeof *f);
    f->c = c;
    *state = f;
    const char *env = getenv("INFERD_SHARED_DIR");
    const char *dir = env && *env ? env : INFERD_SHARED_DIR;
    char path[1200], err[256];
    snprintf(path, sizeof path, "%s/reference/%s", dir, c->json);
    char *json = file_read_all(path, (size_t)64 << 20, NULL, err, sizeof err);
    if (!json) {
        print_message("skipping: %s\n", err); /* ../shared absent: nothing to compare against */
        return 0;
    }
    f->ref = cJSON_Parse(json);
    free(json);
    assert_non_null(f->ref);
    snprintf(path, sizeof path, "%s/reference/%s", dir, c->gguf);
    f->m = model_load(path, err, sizeof err);
    if (!f->m) fail_msg("%s", err); /* the file is there: it must load */
    f->n_vocab = cJSON_GetObjectItem(f->ref, "vocab_size")->valueint;
    assert_int_equal(f->m->hp.n_vocab, f->n_vocab);
    engine_config cfg = {.n_slots = 4, .ctx_per_slot = 128, .max_batch_tokens = 256, .n_threads = 2};
    f->e = engine_open(ENGINE_DEVICE_CPU, f->m, &cfg, err, sizeof err);
    if (!f->e) fail_msg("engine: %s", err);
    return 0;
}

static int setup_f32(void **state) { return setup(state, &CASES[0]); }
static int setup_f16(void **state) { return setup(state, &CASES[1]); }
static int setup_mistral(void **state) { return setup(state, &CASES[2]); }
static int setup_phi3(void **state) { return setup(state, &CASES[3]); }
static int setup_glm4moe(void **state) { return setup(state, &CASES[4]); }


static int teardown(void **state)
{
    fixture *f = *state;
    engine_free(f->e);
    model_free(f->m);
    cJSON_Delete(f->ref);
    free(f);
    return 0;
}

/* ---- the checks -------------------------------------------------------------------------- */

/* Each prompt in one prefill step (all prompts side by side, one slot each, so the MoE
 * block's expert groups mix tokens of different sequences), every stored row compared; and
 * the last prompt again on its own, bit for bit. */
static void test_prefill_logits(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    const cJSON *prompts = cJSON_GetObjectItem(f->ref, "prompts");
    const int n_prompts = cJSON_GetArraySize(prompts);
    assert_true(n_prompts >= 1 && n_prompts <= 4);
    int32_t *ids[4];
    float *got[4];
    engine_seq seqs[4];
    for (int p = 0; p < n_prompts; p++) {
        int n;
        ids[p] = int_array(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, p), "ids"), &n);
        got[p] = malloc((size_t)n * f->n_vocab * sizeof(float));
        engine_slot_clear(f->e, p);
        seqs[p] = (engine_seq){.slot = p, .tokens = ids[p], .n_tokens = n, .logits = got[p], .logits_all = true};
    }
    char err[256];
    if (engine_step(f->e, seqs, n_prompts, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
    /* The last prompt alone gives the same bits as beside the others: a token's experts and
     * their sum do not depend on which other tokens share its expert groups. */
    const int last = n_prompts - 1;
    float *alone = malloc((size_t)seqs[last].n_tokens * f->n_vocab * sizeof(float));
    engine_slot_clear(f->e, last);
    engine_seq s = seqs[last];
    s.logits = alone;
    if (engine_step(f->e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
    assert_memory_equal(alone, got[last], (size_t)s.n_tokens * f->n_vocab * sizeof(float));
    free(alone);
    tally t = {0};
    for (int p = 0; p < n_prompts; p++) {
        const cJSON *pr = cJSON_GetArrayItem(prompts, p);
        int n_rows;
        int32_t *rows = int_array(cJSON_GetObjectItem(pr, "logits_rows"), &n_rows);
        size_t n_ref;
        float *ref = b64_floats(cJSON_GetObjectItem(pr, "logits_b64")->valuestring, &n_ref);
        assert_int_equal(n_ref, (size_t)n_rows * f->n_vocab);
        for (int r = 0; r < n_rows; r++) {
            assert_true(rows[r] >= 0 && rows[r] < seqs[p].n_tokens);
            tally_row(&t, &f->c->tol, compare_row(got[p] + (size_t)rows[r] * f->n_vocab,
                                                  ref + (size_t)r * f->n_vocab, f->n_vocab));
        }
        free(rows), free(ref), free(ids[p]), free(got[p]);
    }
    check_tally(&t, &f->c->tol, f->c->gguf);
}

/* Teacher-forced decode: the prompt in one step (its last row is greedy row 0), then
 * greedy[0..14] one token per step, each step's logits against the next greedy row. */
static void test_greedy_decode(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    const cJSON *prompts = cJSON_GetObjectItem(f->ref, "prompts");
    tally t = {0};
    int checked = 0, skipped_close = 0;
    char err[256];
    float *got = malloc((size_t)f->n_vocab * sizeof(float));
    for (int p = 0; p < cJSON_GetArraySize(prompts); p++) {
        const cJSON *pr = cJSON_GetArrayItem(prompts, p);
        int n_ids, n_greedy, n_margin;
        int32_t *ids = int_array(cJSON_GetObjectItem(pr, "ids"), &n_ids);
        int32_t *greedy = int_array(cJSON_GetObjectItem(pr, "greedy"), &n_greedy);
        const cJSON *margins = cJSON_GetObjectItem(pr, "greedy_margin");
        n_margin = cJSON_GetArraySize(margins);
        size_t n_ref;
        float *ref = b64_floats(cJSON_GetObjectItem(pr, "greedy_logits_b64")->valuestring, &n_ref);
        assert_int_equal(n_ref, (size_t)n_greedy * f->n_vocab);
        assert_int_equal(n_margin, n_greedy);
        engine_slot_clear(f->e, 0);
        engine_seq s = {.slot = 0, .tokens = ids, .n_tokens = n_ids, .logits = got};
        for (int j = 0; j < n_greedy; j++) {
            if (j > 0) s = (engine_seq){.slot = 0, .tokens = &greedy[j - 1], .n_tokens = 1, .pos = n_ids + j - 1,
                                        .logits = got};
            if (engine_step(f->e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
            row_error r = compare_row(got, ref + (size_t)j * f->n_vocab, f->n_vocab);
            tally_row(&t, &f->c->tol, r);
            double margin = cJSON_GetArrayItem(margins, j)->valuedouble;
            if (margin > 2 * r.abs) {
                if (r.got_argmax != greedy[j])
                    fail_msg("prompt %d step %d: argmax %d, reference %d (margin %.3g, our error %.3g)", p, j,
                             r.got_argmax, greedy[j], margin, r.abs);
                checked++;
            } else {
                skipped_close++;
            }
        }
        free(ids), free(greedy), free(ref);
    }
    free(got);
    print_message("  greedy: %d tokens identical, %d too close to call\n", checked, skipped_close);
    check_tally(&t, &f->c->tol, "teacher-forced decode");
}

/* ---- malformed MoE files ---------------------------------------------------------------- */

enum { M_EMBD = 16, M_HEADS = 2, M_HD = 8, M_FF_EXP = 8, M_EXPERTS = 4, M_VOCAB = 10 };

typedef enum moe_fault {
    FAULT_NONE,
    FAULT_EXPERTS_2D,    /* ffn_gate_exps stored as one [n_embd, n_ff_exp * n_expert] matrix */
    FAULT_EXPERT_COUNT,  /* ffn_down_exps with one expert too few */
    FAULT_ROUTER_SHAPE,  /* ffn_gate_inp with one output too few */
    FAULT_NO_ROUTER,
    FAULT_TOO_MANY_USED, /* expert_used_count > expert_count */
    FAULT_ROT_DIMS,      /* rope.dimension_count wider than a head */
} moe_fault;

static void add_zeros(gguf_writer *w, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2)
{
    int64_t ne[3] = {ne0, ne1, ne2};
    size_t n = (size_t)(ne0 * ne1 * ne2);
    float *v = calloc(n, sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = (float)(i % 7) * 0.01f;
    gguf_writer_add_tensor(w, name, GGML_TYPE_F32, n_dims, ne, v, n * sizeof *v, false);
    free(v);
}

/* A one-layer qwen3moe model (F32) with `fault`, as a loaded model or NULL and the error; the
 * file's image, which the model reads from, in *image (freed by the caller after the model). */
static model *moe_model(moe_fault fault, void **image, char *err, size_t errlen)
{
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    const struct {
        const char *key;
        uint32_t v;
    } keys[] = {{"qwen3moe.context_length", 64}, {"qwen3moe.embedding_length", M_EMBD},
                {"qwen3moe.block_count", 1}, {"qwen3moe.feed_forward_length", 32},
                {"qwen3moe.attention.head_count", M_HEADS}, {"qwen3moe.attention.key_length", M_HD},
                {"qwen3moe.expert_count", M_EXPERTS},
                {"qwen3moe.expert_used_count", fault == FAULT_TOO_MANY_USED ? M_EXPERTS + 1 : 2},
                {"qwen3moe.expert_feed_forward_length", M_FF_EXP},
                {"qwen3moe.rope.dimension_count", fault == FAULT_ROT_DIMS ? M_HD + 2 : M_HD}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) gguf_writer_set_u32(w, keys[i].key, keys[i].v);
    gguf_writer_set_f32(w, "qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
    add_zeros(w, "token_embd.weight", 2, M_EMBD, M_VOCAB, 1);
    add_zeros(w, "output_norm.weight", 1, M_EMBD, 1, 1);
    add_zeros(w, "blk.0.attn_norm.weight", 1, M_EMBD, 1, 1);
    add_zeros(w, "blk.0.attn_q.weight", 2, M_EMBD, M_HEADS * M_HD, 1);
    add_zeros(w, "blk.0.attn_k.weight", 2, M_EMBD, M_HEADS * M_HD, 1);
    add_zeros(w, "blk.0.attn_v.weight", 2, M_EMBD, M_HEADS * M_HD, 1);
    add_zeros(w, "blk.0.attn_output.weight", 2, M_HEADS * M_HD, M_EMBD, 1);
    add_zeros(w, "blk.0.attn_q_norm.weight", 1, M_HD, 1, 1);
    add_zeros(w, "blk.0.attn_k_norm.weight", 1, M_HD, 1, 1);
    add_zeros(w, "blk.0.ffn_norm.weight", 1, M_EMBD, 1, 1);
    if (fault != FAULT_NO_ROUTER)
        add_zeros(w, "blk.0.ffn_gate_inp.weight", 2, M_EMBD, M_EXPERTS - (fault == FAULT_ROUTER_SHAPE), 1);
    if (fault == FAULT_EXPERTS_2D) add_zeros(w, "blk.0.ffn_gate_exps.weight", 2, M_EMBD, M_FF_EXP * M_EXPERTS, 1);
    else add_zeros(w, "blk.0.ffn_gate_exps.weight", 3, M_EMBD, M_FF_EXP, M_EXPERTS);
    add_zeros(w, "blk.0.ffn_up_exps.weight", 3, M_EMBD, M_FF_EXP, M_EXPERTS);
    add_zeros(w, "blk.0.ffn_down_exps.weight", 3, M_FF_EXP, M_EMBD, M_EXPERTS - (fault == FAULT_EXPERT_COUNT));
    size_t size = 0;
    assert_int_equal(gguf_writer_write_mem(w, image, &size), 0);
    gguf_writer_free(w);
    gguf_file *f = gguf_open_memory(*image, size, err, errlen);
    return f ? model_from_gguf(f, err, errlen) : NULL;
}

static void expect_refused(moe_fault fault, const char *want)
{
    char err[512] = "";
    void *image = NULL;
    model *m = moe_model(fault, &image, err, sizeof err);
    bool loaded = m != NULL;
    model_free(m);
    free(image);
    if (loaded) {
        fail_msg("fault %d: loaded, expected \"%s\"", (int)fault, want);
    }
    if (strcmp(err, want) != 0) fail_msg("fault %d: \"%s\", expected \"%s\"", (int)fault, err, want);
}

static void test_malformed_moe_refused(void **state)
{
    (void)state;
    expect_refused(FAULT_EXPERTS_2D, "tensor 'blk.0.ffn_gate_exps.weight': expected shape [16, 8, 4] (the last: "
                                     "experts), found [16, 32]");
    expect_refused(FAULT_EXPERT_COUNT, "tensor 'blk.0.ffn_down_exps.weight': expected shape [8, 16, 4] (the last: "
                                       "experts), found [8, 16, 3]");
    expect_refused(FAULT_ROUTER_SHAPE, "tensor 'blk.0.ffn_gate_inp.weight': expected shape [16, 4], found [16, 3]");
    expect_refused(FAULT_NO_ROUTER, "missing tensor 'blk.0.ffn_gate_inp.weight'");
    expect_refused(FAULT_TOO_MANY_USED, "qwen3moe.expert_used_count 5 is more than expert_count 4");
    expect_refused(FAULT_ROT_DIMS, "qwen3moe.rope.dimension_count 10 must be even and at most the head dimension 8");
}

/* The router on its own: the k most probable experts, ties to the lower id, weights
 * renormalised over the chosen; k = n_expert keeps the whole softmax. */
static void test_moe_route(void **state)
{
    (void)state;
    int32_t ids[4];
    float w[4];
    float logits[4] = {1.0f, 3.0f, 3.0f, 0.0f};
    cpu_moe_route(logits, 4, 2, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_float_equal(w[0], 0.5f, 1e-7f);
    assert_float_equal(w[1], 0.5f, 1e-7f);
    float flat[4] = {0};
    cpu_moe_route(flat, 4, 3, ids, w);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(ids[j], j);
        assert_float_equal(w[j], 1.0f / 3.0f, 1e-7f);
    }
    float all[4] = {0.0f, (float)log(3.0), (float)log(2.0), (float)log(4.0)}; /* probabilities 1:3:2:4 */
    cpu_moe_route(all, 4, 4, ids, w);
    const int order[4] = {3, 1, 2, 0};
    const float prob[4] = {0.1f, 0.3f, 0.2f, 0.4f};
    for (int j = 0; j < 4; j++) {
        assert_int_equal(ids[j], order[j]);
        assert_float_equal(w[j], prob[order[j]], 1e-6f);
    }
    float one[4] = {0.0f, 5.0f, 1.0f, 2.0f};
    cpu_moe_route(one, 4, 1, ids, w);
    assert_int_equal(ids[0], 1);
    assert_float_equal(w[0], 1.0f, 0.0f); /* one expert takes the whole token */
}

/* The sigmoid router (GLM-4.5): the bias moves the choice but not the weights, which are the
 * chosen sigmoid scores renormalised and scaled. */
static void test_moe_route_sigmoid(void **state)
{
    (void)state;
    int32_t ids[2];
    float w[2];
    const float bias[4] = {0.0f, 0.0f, 10.0f, 0.0f};
    float logits[4] = {2.0f, 1.0f, -1.0f, 0.0f};
    cpu_sigmoid_router r = {.bias = bias, .n_expert = 4, .k = 2, .scale = 2.5f};
    cpu_moe_route_sigmoid(&r, logits, ids, w);
    assert_int_equal(ids[0], 2); /* chosen by its bias alone */
    assert_int_equal(ids[1], 0);
    const double s2 = 1 / (1 + exp(1.0)), s0 = 1 / (1 + exp(-2.0));
    assert_float_equal(w[0], 2.5 * s2 / (s2 + s0), 1e-6);
    assert_float_equal(w[1], 2.5 * s0 / (s2 + s0), 1e-6);
    float ties[4] = {0};
    r.bias = NULL;
    r.scale = 1.0f;
    cpu_moe_route_sigmoid(&r, ties, ids, w);
    assert_int_equal(ids[0], 0); /* ties: the lower id */
    assert_int_equal(ids[1], 1);
    assert_float_equal(w[0], 0.5f, 1e-7f);
}

/* What the GPU backend accepts (GPU_FEATURES, checked without CUDA): mistral needs nothing
 * new (head_dim != n_embd/n_head is already served); phi3 and glm4moe are refused by the
 * feature they need first. */
static void test_gpu_features(void **state)
{
    (void)state;
    static const struct {
        const char *file, *refusal;
    } cases[] = {
        {"mistral.gguf", NULL},
        {"phi3.gguf", "the cuda backend does not implement fused qkv (layer 0 of phi3)"},
        {"glm4moe.gguf", "the cuda backend does not implement partial RoPE (layer 0 of glm4moe)"},
        {"qwen3moe.gguf", "the cuda backend does not implement MoE (layer 0 of qwen3moe)"},
    };
    const char *env = getenv("INFERD_SHARED_DIR");
    const char *dir = env && *env ? env : INFERD_SHARED_DIR;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1200], err[512] = "";
        snprintf(path, sizeof path, "%s/reference/%s", dir, cases[i].file);
        model *m = model_load(path, err, sizeof err);
        if (!m) {
            print_message("skipping %s: %s\n", cases[i].file, err);
            continue;
        }
        int rc = model_check_features(m, GPU_FEATURES, "cuda", err, sizeof err);
        if (cases[i].refusal) {
            assert_int_equal(rc, -1);
            assert_string_equal(err, cases[i].refusal);
        } else if (rc != 0) {
            fail_msg("%s: %s", cases[i].file, err);
        }
        model_free(m);
    }
}

/* LongRoPE: an engine whose context is beyond rope.scaling.original_context_length (4096)
 * turns by the long factors; up to it, by the short ones the reference was made with. */
static void test_longrope_factors(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    assert_non_null(f->m->rope_factors_long.data);
    assert_int_equal(f->m->hp.n_ctx_orig, 4096);
    const cJSON *prompts = cJSON_GetObjectItem(f->ref, "prompts");
    int n;
    int32_t *ids = int_array(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, 1), "ids"), &n);
    float *at[3];
    const int ctx[3] = {128, 4096, 4104};
    char err[256];
    for (int i = 0; i < 3; i++) {
        engine_config cfg = {.n_slots = 1, .ctx_per_slot = ctx[i], .max_batch_tokens = 64, .n_threads = 1};
        engine *e = engine_open(ENGINE_DEVICE_CPU, f->m, &cfg, err, sizeof err);
        if (!e) fail_msg("engine: %s", err);
        at[i] = malloc((size_t)f->n_vocab * sizeof(float));
        engine_seq s = {.slot = 0, .tokens = ids, .n_tokens = n, .logits = at[i]};
        if (engine_step(e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
        engine_free(e);
    }
    assert_memory_equal(at[0], at[1], (size_t)f->n_vocab * sizeof(float));
    assert_true(compare_row(at[2], at[0], f->n_vocab).abs > 1e-3);
    for (int i = 0; i < 3; i++) free(at[i]);
    free(ids);
}

/* The well-formed file loads, runs on the CPU, and a backend without MoE (the GPU's today)
 * refuses it by name rather than running something else. */
static void test_moe_backend_features(void **state)
{
    (void)state;
    char err[512] = "";
    void *image = NULL;
    model *m = moe_model(FAULT_NONE, &image, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->hp.n_expert, M_EXPERTS);
    assert_int_equal(m->layers[0].ffn_down_exps.ne2, M_EXPERTS);
    model_tensor last = model_tensor_slice(&m->layers[0].ffn_down_exps, M_EXPERTS - 1);
    assert_ptr_equal(last.data, (const char *)m->layers[0].ffn_down_exps.data +
                                    (size_t)(M_EXPERTS - 1) * M_EMBD * M_FF_EXP * sizeof(float));
    arch_features dense = ~(arch_features)(ARCH_F_FFN_MOE | ARCH_F_ROUTER_SOFTMAX_TOPK);
    assert_int_equal(model_check_features(m, dense, "cuda", err, sizeof err), -1);
    assert_string_equal(err, "the cuda backend does not implement MoE (layer 0 of qwen3moe)");
    engine_config cfg = {.n_slots = 1, .ctx_per_slot = 16, .max_batch_tokens = 16, .n_threads = 1};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    int32_t toks[3] = {1, 2, 3};
    float logits[M_VOCAB];
    engine_seq s = {.slot = 0, .tokens = toks, .n_tokens = 3, .logits = logits};
    assert_int_equal(engine_step(e, &s, 1, NULL, err, sizeof err), 0);
    for (int i = 0; i < M_VOCAB; i++) assert_true(isfinite(logits[i]));
    engine_free(e);
    model_free(m);
    free(image);
}

/* Every reference prompt's logits from a model, one prefill step each; NULL without ../shared. */
static float *prompt_logits(const model *m, const cJSON *prompts, size_t *n_floats)
{
    char err[256];
    engine_config cfg = {.n_slots = 1, .ctx_per_slot = 128, .max_batch_tokens = 128, .n_threads = 2};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    size_t total = 0;
    for (int p = 0; p < cJSON_GetArraySize(prompts); p++)
        total += (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, p), "ids"));
    float *out = malloc(total * (size_t)m->hp.n_vocab * sizeof *out), *at = out;
    for (int p = 0; p < cJSON_GetArraySize(prompts); p++) {
        int n;
        int32_t *ids = int_array(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, p), "ids"), &n);
        engine_slot_clear(e, 0);
        engine_seq s = {.slot = 0, .tokens = ids, .n_tokens = n, .logits = at, .logits_all = true};
        if (engine_step(e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
        at += (size_t)n * m->hp.n_vocab;
        free(ids);
    }
    engine_free(e);
    *n_floats = total * (size_t)m->hp.n_vocab;
    return out;
}

static void test_quantised_experts(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    const cJSON *prompts = cJSON_GetObjectItem(f->ref, "prompts");
    const ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char err[256];
        void *img_q = NULL, *img_f = NULL;
        model *q = requantise_experts(f->m, types[i], false, &img_q, err, sizeof err);
        if (!q) fail_msg("%s experts: %s", ggml_type_name(types[i]), err);
        model *back = requantise_experts(f->m, types[i], true, &img_f, err, sizeof err);
        if (!back) fail_msg("%s experts as F32: %s", ggml_type_name(types[i]), err);
        assert_int_equal(q->layers[0].ffn_up_exps.type, types[i]);
        size_t n, n_back;
        float *got = prompt_logits(q, prompts, &n), *want = prompt_logits(back, prompts, &n_back);
        assert_int_equal(n, n_back);
        tally t = {0};
        const tolerance tol = CASES[0].tol;
        int same_top = 0;
        for (size_t r = 0; r < n / (size_t)f->n_vocab; r++) {
            row_error e = compare_row(got + r * f->n_vocab, want + r * f->n_vocab, f->n_vocab);
            tally_row(&t, &tol, e);
            same_top += e.got_argmax == compare_row(want + r * f->n_vocab, want + r * f->n_vocab, f->n_vocab).got_argmax;
        }
        char what[64];
        snprintf(what, sizeof what, "%s experts vs their F32 values", ggml_type_name(types[i]));
        check_tally(&t, &tol, what);
        assert_int_equal(same_top, t.rows);
        free(got), free(want);
        model_free(q), model_free(back);
        free(img_q), free(img_f);
    }
}

int main(void)
{
    const struct CMUnitTest f32[] = {
        cmocka_unit_test(test_prefill_logits),
        cmocka_unit_test(test_greedy_decode),
    };
    int failed = cmocka_run_group_tests_name("qwen3moe F32", f32, setup_f32, teardown);
    failed += cmocka_run_group_tests_name("qwen3moe F16", f32, setup_f16, teardown);
    failed += cmocka_run_group_tests_name("mistral F32", f32, setup_mistral, teardown);
    failed += cmocka_run_group_tests_name("phi3 F32", f32, setup_phi3, teardown);
    const struct CMUnitTest longrope[] = {cmocka_unit_test(test_longrope_factors)};
    failed += cmocka_run_group_tests_name("phi3 LongRoPE", longrope, setup_phi3, teardown);
    failed += cmocka_run_group_tests_name("glm4moe F32", f32, setup_glm4moe, teardown);
    const struct CMUnitTest quantised[] = {cmocka_unit_test(test_quantised_experts)};
    failed += cmocka_run_group_tests_name("qwen3moe quantised experts", quantised, setup_f32, teardown);
    const struct CMUnitTest files[] = {
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_route_sigmoid),
        cmocka_unit_test(test_gpu_features),
        cmocka_unit_test(test_malformed_moe_refused),
        cmocka_unit_test(test_moe_backend_features),
    };
    failed += cmocka_run_group_tests_name("qwen3moe files", files, NULL, NULL);
    return failed;
}
