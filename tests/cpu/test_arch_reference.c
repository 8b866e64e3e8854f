/* test_arch_reference.c - the CPU engine on the tiny random-weight models of
 * ../shared/reference (converted by llama.cpp's own converter) against Hugging Face
 * transformers' float64 logits (README.md there): every stored prompt position after one
 * prefill step, and the 16 greedy tokens by teacher-forced decode, one token per step.
 *
 * Files: qwen3moe (F32 and F16), gemma3 (sliding windows of 8 under 17-70-token prompts,
 * GeGLU, soft-capped logits, the two RoPE bases) and gemma4 (per-layer embeddings, KV shared
 * by the last three layers, full layers with their own head_dim and FFN width, proportional
 * RoPE through rope_freqs, V norm, layer scalars) and gemma4_moe (experts beside the dense
 * MLP with a scaled router and expert scales, V from the K projection); and gpt-oss (F32, and
 * its experts in MXFP4 holding the same numbers: attention sinks, sliding/full layers, YaRN with the unrounded
 * range, q/k/v/o biases, the biased top-k-softmax router, expert biases, clamped SwiGLU).
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
 * And mistral (the llama arch with head_dim != n_embd/n_head), phi3
 * (fused qkv and gate/up, partial LongRoPE; also: the long factors take over past the original
 * context) and glm4moe (dense first layer, sigmoid router with selection bias, shared expert,
 * partial RoPE).  What the GPU backend's feature set accepts of them is checked too.
 *
 * Also, without ../shared: a qwen3moe file whose router or experts are malformed is refused
 * at load with an error naming the tensor or key, and a backend without MoE refuses it; a
 * qwen35 file with wrong DeltaNet shapes likewise, and one with an MTP block loads.
 *
 * The hybrid families (qwen35, qwen35moe, qwen3next: gated DeltaNet) also: a prompt prefilled
 * in pieces of any length gives the bits of one piece; a state snapshot restored into another
 * slot continues exactly; a step that would rewind a recurrent state is refused. */
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
    {"gemma3.gguf", "gemma3.json", F32_TOL},
    {"gemma4.gguf", "gemma4.json", F32_TOL},
    {"gemma4_moe.gguf", "gemma4_moe.json", F32_TOL},
    /* The hybrid families (gated DeltaNet): the README's F32 figure for them is up to 1e-5 (the
     * recurrence accumulates in float32); 1e-4 is the bound the issue sets. */
    {"qwen3_5.gguf", "qwen3_5.json", {1e-4, 1e-4, 1.0}},
    {"qwen3_5_moe.gguf", "qwen3_5_moe.json", {1e-4, 1e-4, 1.0}},
    {"qwen3_next.gguf", "qwen3_next.json", {1e-4, 1e-4, 1.0}},
    /* the BERT encoder: hidden states and sentence embeddings within 1e-4 relative (issue 29's
     * target; llama.cpp, with its tanh GELU, lands at 3.9e-4) */
    {"bert.gguf", "bert.json", {1e-4, 1e-4, 1.0}},
    {"gpt-oss.gguf", "gpt-oss.json", F32_TOL},
    {"gpt-oss-mxfp4.gguf", "gpt-oss.json", F32_TOL}, /* MXFP4 experts holding the F32 numbers */
    {"mistral.gguf", "mistral.json", F32_TOL}, /* llama arch, head_dim 32 != 64/4 */
    {"phi3.gguf", "phi3.json", F32_TOL},       /* fused qkv and gate/up, partial LongRoPE */
    {"glm4moe.gguf", "glm4moe.json", F32_TOL}, /* dense lead, sigmoid router, shared expert */
    {"deepseek_v3.gguf", "deepseek_v3.json", F32_TOL}, /* latent attention, grouped sigmoid router */
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

/* "<arch>.<suffix>" = v for each of keys (u32). */
typedef struct int_key {
    const char *suffix;
    int v;
} int_key;

static void set_int_keys(gguf_writer *w, const char *arch, const int_key *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.%s", arch, keys[i].suffix);
        gguf_writer_set_u32(w, key, (uint32_t)keys[i].v);
    }
}

/* The writer's file (w freed) as a model over *image, or NULL and the loader's error. */
static model *writer_model(gguf_writer *w, void **image, char *err, size_t errlen)
{
    size_t size = 0;
    int rc = gguf_writer_write_mem(w, image, &size);
    gguf_writer_free(w);
    assert_int_equal(rc, 0);
    gguf_file *g = gguf_open_memory(*image, size, err, errlen);
    return g ? model_from_gguf(g, err, errlen) : NULL;
}

/* A faulty file's model (NULL expected) and the loader's error against want. */
static void check_refused(model *m, void *image, int fault, const char *err, const char *want)
{
    bool loaded = m != NULL;
    model_free(m);
    free(image);
    if (loaded) fail_msg("fault %d: loaded, expected \"%s\"", fault, want);
    if (strcmp(err, want) != 0) fail_msg("fault %d: \"%s\", expected \"%s\"", fault, err, want);
}

/* src (an F32 qwen3moe) written again with its ffn_*_exps quantised to `type`, stored as
 * such or (as_f32) dequantised back to F32, as a model over *image. */
static model *requantise_experts(const model *src, ggml_type type, bool as_f32, void **image, char *err,
                                 size_t errlen)
{
    const model_hparams *hp = &src->hp;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    const int_key keys[] = {{"context_length", hp->n_ctx_train}, {"embedding_length", hp->n_embd},
                            {"block_count", hp->n_layer}, {"feed_forward_length", hp->n_ff},
                            {"attention.head_count", hp->n_head}, {"attention.head_count_kv", hp->n_head_kv},
                            {"attention.key_length", hp->head_dim}, {"expert_count", hp->n_expert},
                            {"expert_used_count", hp->n_expert_used}, {"expert_feed_forward_length", hp->n_ff_exp}};
    set_int_keys(w, "qwen3moe", keys, sizeof keys / sizeof keys[0]);
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
    return writer_model(w, image, err, errlen);
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
static int setup_gemma3(void **state) { return setup(state, &CASES[2]); }
static int setup_gemma4(void **state) { return setup(state, &CASES[3]); }
static int setup_gemma4_moe(void **state) { return setup(state, &CASES[4]); }
static int setup_qwen35(void **state) { return setup(state, &CASES[5]); }
static int setup_qwen35moe(void **state) { return setup(state, &CASES[6]); }
static int setup_qwen3next(void **state) { return setup(state, &CASES[7]); }
static int setup_bert(void **state) { return setup(state, &CASES[8]); }
static int setup_gptoss(void **state) { return setup(state, &CASES[9]); }
static int setup_gptoss_mxfp4(void **state) { return setup(state, &CASES[10]); }
static int setup_mistral(void **state) { return setup(state, &CASES[11]); }
static int setup_phi3(void **state) { return setup(state, &CASES[12]); }
static int setup_glm4moe(void **state) { return setup(state, &CASES[13]); }
static int setup_deepseek(void **state) { return setup(state, &CASES[14]); }


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
    PARTIAL_ROT,         /* not a fault: rope.dimension_count half a head (partial RoPE) */
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
                {"qwen3moe.rope.dimension_count", fault == FAULT_ROT_DIMS ? M_HD + 2 : fault == PARTIAL_ROT ? M_HD / 2 : M_HD}};
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
    return writer_model(w, image, err, errlen);
}

static void expect_refused(moe_fault fault, const char *want)
{
    char err[512] = "";
    void *image = NULL;
    model *m = moe_model(fault, &image, err, sizeof err);
    check_refused(m, image, (int)fault, err, want);
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

/* gpt-oss's router: the k largest logits (ties: the lower id), softmax over those k only. */
static void test_moe_route_topk_softmax(void **state)
{
    (void)state;
    int32_t ids[3];
    float w[3];
    const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    cpu_moe_route_topk_softmax(logits, 5, 3, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 4);
    const double z = 2 * exp(2.0) + exp(1.0); /* the other experts take no share */
    assert_float_equal(w[0], exp(2.0) / z, 1e-6);
    assert_float_equal(w[1], exp(2.0) / z, 1e-6);
    assert_float_equal(w[2], exp(1.0) / z, 1e-6);
    cpu_moe_route_topk_softmax(logits, 5, 1, ids, w);
    assert_int_equal(ids[0], 1);
    assert_float_equal(w[0], 1.0f, 0.0f);
}

/* gpt-oss's clamped SwiGLU: (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7). */
static void test_swiglu_clamp(void **state)
{
    (void)state;
    float gate[4] = {1.0f, 9.0f, -2.0f, 0.0f};
    const float up[4] = {0.5f, 10.0f, -8.0f, 3.0f};
    cpu_swiglu_clamp(gate, up, 4);
    const double g[4] = {1.0, 7.0, -2.0, 0.0}, u[4] = {0.5, 7.0, -7.0, 3.0};
    for (int i = 0; i < 4; i++)
        assert_float_equal(gate[i], (u[i] + 1) * g[i] / (1 + exp(-1.702 * g[i])), 1e-5);
}

/* The gpt-oss file's recipe as the loader leaves it: even layers sliding (window 8), odd
 * full; YaRN's range unrounded (README: 2.02..4.35 for head_dim 16, where ggml's rounding
 * would give 2..5) and its attention factor; sinks, biases and the expert biases bound; and a
 * backend without sinks and the biased router (the GPU's today) refuses it by name. */
static void test_gptoss_recipe(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    const model *m = f->m;
    assert_string_equal(m->desc->name, "gpt-oss");
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *ly = &m->layers[il];
        assert_int_equal(ly->recipe.attn, il % 2 ? ARCH_ATTN_FULL : ARCH_ATTN_SLIDING);
        assert_int_equal(ly->window, il % 2 ? 0 : 8);
        assert_int_equal(ly->attn_sinks.ne0, m->hp.n_head);
        assert_int_equal(ly->ffn_down_exps_b.ne0, m->hp.n_embd);
        assert_int_equal(ly->ffn_down_exps_b.ne1, m->hp.n_expert);
        assert_non_null(ly->bo.data);
        assert_non_null(ly->ffn_gate_inp_b.data);
    }
    assert_float_equal(m->hp.yarn_factor, 32.0f, 0.0f);
    assert_float_equal(m->hp.yarn_low, 2.0232, 1e-3);
    assert_float_equal(m->hp.yarn_high, 4.3495, 1e-3);
    assert_float_equal(m->hp.rope_attn_factor, 0.1 * log(32.0) + 1.0, 1e-6);
    char err[256];
    const arch_features gpu_like = ~(arch_features)(ARCH_F_ATTN_SINKS | ARCH_F_ATTN_OUT_BIAS | ARCH_F_FFN_MOE |
                                                    ARCH_F_FFN_BIAS | ARCH_F_ACT_SWIGLU_CLAMP |
                                                    ARCH_F_ROUTER_TOPK_SOFTMAX);
    assert_int_equal(model_check_features(m, gpu_like, "cuda", err, sizeof err), -1);
    assert_string_equal(err, "the cuda backend does not implement MoE (layer 0 of gpt-oss)");
    assert_int_equal(model_check_features(m, gpu_like | ARCH_F_FFN_MOE, "cuda", err, sizeof err), -1);
    assert_string_equal(err, "the cuda backend does not implement attention output bias (layer 0 of gpt-oss)");
}

/* The gpt-oss file written again with its scalar keys (one string key replaced when `key` is
 * set) and its tensors, less the one named `drop` and with the one named `shrink` one row
 * short, loaded as a model: NULL and the error when the loader refuses it. */
typedef struct gptoss_edit {
    const char *key, *value; /* a string key's new value */
    const char *drop, *shrink;
    const char *as; /* the dropped tensor is written under this name instead */
    const char *drop_key;
} gptoss_edit;

static model *edited_gptoss(const model *src, gptoss_edit ed, void **image, char *err, size_t errlen)
{
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(src->gguf); i++) {
        const char *key = gguf_kv_key(src->gguf, i);
        int64_t iv;
        double fv;
        size_t len;
        const char *sv;
        if (ed.drop_key && strcmp(key, ed.drop_key) == 0) continue;
        if (ed.key && strcmp(key, ed.key) == 0) gguf_writer_set_str(w, key, ed.value);
        else if (gguf_kv_type(src->gguf, i) == GGUF_VT_FLOAT32 && gguf_kv_f64(src->gguf, i, &fv))
            gguf_writer_set_f32(w, key, (float)fv);
        else if ((sv = gguf_kv_str(src->gguf, i, &len)) != NULL) {
            char *copy = strndup(sv, len);
            gguf_writer_set_str(w, key, copy);
            free(copy);
        } else if (gguf_kv_type(src->gguf, i) != GGUF_VT_ARRAY && gguf_kv_i64(src->gguf, i, &iv))
            gguf_writer_set_u32(w, key, (uint32_t)iv);
    }
    for (int64_t i = 0; i < gguf_n_tensors(src->gguf); i++) {
        const gguf_tensor *t = gguf_tensor_at(src->gguf, i);
        const bool dropped = ed.drop && strcmp(t->name, ed.drop) == 0;
        if (dropped && !ed.as) continue;
        int64_t ne[GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        size_t bytes = t->nbytes;
        if (ed.shrink && strcmp(t->name, ed.shrink) == 0) {
            bytes -= bytes / (size_t)ne[t->n_dims - 1];
            ne[t->n_dims - 1]--;
        }
        gguf_writer_add_tensor(w, dropped ? ed.as : t->name, t->type, t->n_dims, ne, t->data, bytes, true);
    }
    return writer_model(w, image, err, errlen);
}

static void expect_gptoss_refused(const model *src, gptoss_edit ed, const char *want)
{
    char err[512] = "";
    void *image = NULL;
    model *m = edited_gptoss(src, ed, &image, err, sizeof err);
    bool loaded = m != NULL;
    model_free(m);
    free(image);
    if (loaded) fail_msg("loaded, expected \"%s\"", want);
    if (strcmp(err, want) != 0) fail_msg("\"%s\", expected \"%s\"", err, want);
}

/* Each edit of src refused with its error, after the unedited copy loads (so the edits are
 * what is refused). */
typedef struct refused_edit {
    gptoss_edit edit;
    const char *want;
} refused_edit;

static void expect_edits_refused(const model *src, const refused_edit *cases, size_t n)
{
    char err[512];
    void *image = NULL;
    model *same = edited_gptoss(src, (gptoss_edit){0}, &image, err, sizeof err);
    if (!same) fail_msg("the unedited copy: %s", err);
    model_free(same);
    free(image);
    for (size_t i = 0; i < n; i++) expect_gptoss_refused(src, cases[i].edit, cases[i].want);
}

/* A gpt-oss file missing its sinks or an expert bias, with an expert bias or MXFP4 expert
 * tensor of the wrong shape, or with a RoPE scaling it does not declare, is refused at load
 * naming the tensor or key. */
static void test_gptoss_malformed(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    static const refused_edit cases[] = {
        {{.drop = "blk.2.attn_sinks.weight"}, "missing tensor 'blk.2.attn_sinks.weight'"},
        {{.drop = "blk.1.ffn_up_exps.bias"}, "missing tensor 'blk.1.ffn_up_exps.bias'"},
        {{.shrink = "blk.0.ffn_down_exps.bias"}, "tensor 'blk.0.ffn_down_exps.bias': expected shape [64, 8], found [64, 7]"},
        {{.shrink = "blk.3.ffn_gate_exps.weight"},
         "tensor 'blk.3.ffn_gate_exps.weight': expected shape [64, 64, 8] (the last: experts), found [64, 64, 7]"},
        {{.key = "gpt-oss.rope.scaling.type", .value = "longrope"},
         "key 'gpt-oss.rope.scaling.type' = 'longrope' is not supported (none, linear, yarn)"},
    };
    expect_edits_refused(f->m, cases, sizeof cases / sizeof cases[0]);
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
    cpu_score_router r = {.bias = bias, .n_expert = 4, .k = 2, .scale = 2.5f};
    cpu_moe_route_scored(&r, logits, ids, w);
    assert_int_equal(ids[0], 2); /* chosen by its bias alone */
    assert_int_equal(ids[1], 0);
    const double s2 = 1 / (1 + exp(1.0)), s0 = 1 / (1 + exp(-2.0));
    assert_float_equal(w[0], 2.5 * s2 / (s2 + s0), 1e-6);
    assert_float_equal(w[1], 2.5 * s0 / (s2 + s0), 1e-6);
    float ties[4] = {0};
    r.bias = NULL;
    r.scale = 1.0f;
    cpu_moe_route_scored(&r, ties, ids, w);
    assert_int_equal(ids[0], 0); /* ties: the lower id */
    assert_int_equal(ids[1], 1);
    assert_float_equal(w[0], 0.5f, 1e-7f);
}

/* What the GPU backend accepts (GPU_FEATURES, checked without CUDA): mistral, qwen3moe,
 * gpt-oss (sinks, output bias, YaRN, biased top-k-softmax router, clamped SwiGLU), the hybrids
 * (gated DeltaNet, gated attention with partial RoPE, the gated shared expert), phi3 (partial
 * LongRoPE, fused qkv and gate/up) and glm4moe (sigmoid router with its selection bias,
 * ungated shared expert, a dense first layer) and deepseek2 (latent attention, expert groups:
 * GPU_MLA_FEATURES, docs/mla-gpu.md) need nothing it lacks; without GPU_MLA_FEATURES (`denied`)
 * deepseek2 is refused by the feature it needs first, and the next by name when only that one
 * is granted back: so --device auto would run it on the CPU. */
static void test_gpu_features(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        arch_features denied;
        const char *refusal;
    } cases[] = {
        {"mistral.gguf", 0, NULL},
        {"qwen3moe.gguf", 0, NULL},
        {"gpt-oss.gguf", 0, NULL},
        {"gpt-oss-mxfp4.gguf", 0, NULL},
        {"bert.gguf", 0, NULL}, /* an encoder: post-LN, bidirectional, erf-GELU MLP (issue 29) */
        {"qwen3_5.gguf", 0, NULL},
        {"qwen3_5_moe.gguf", 0, NULL},
        {"qwen3_next.gguf", 0, NULL},
        {"phi3.gguf", 0, NULL},
        {"glm4moe.gguf", 0, NULL},
        {"deepseek_v3.gguf", 0, NULL},
        /* refused by name when its features are not granted */
        {"deepseek_v3.gguf", GPU_MLA_FEATURES,
         "the cuda backend does not implement multi-head latent attention (layer 0 of deepseek2)"},
        {"deepseek_v3.gguf", ARCH_F_EXPERT_GROUPS,
         "the cuda backend does not implement grouped expert selection (layer 1 of deepseek2)"},
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
        int rc = model_check_features(m, GPU_FEATURES & ~cases[i].denied, "cuda", err, sizeof err);
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

/* A file of a family that does not declare partial RoPE, whose rope.dimension_count is below
 * the head dimension: the loader marks its layers so (the CPU turns the first n_rot dims, as
 * llama.cpp does; so does the GPU, GPU_FEATURES has it), a backend without partial RoPE refuses
 * it by name, and the CPU runs it; a file without the key turns whole heads. */
static void test_partial_rope_from_file(void **state)
{
    (void)state;
    char err[512] = "";
    void *image = NULL;
    model *m = moe_model(PARTIAL_ROT, &image, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->hp.n_rot, M_HD / 2);
    assert_true(m->layers[0].recipe.attn_extras & ARCH_ATTN_ROPE_PARTIAL);
    assert_int_equal(model_check_features(m, GPU_FEATURES, "cuda", err, sizeof err), 0);
    assert_int_equal(model_check_features(m, GPU_FEATURES & ~ARCH_F_ROPE_PARTIAL, "cuda", err, sizeof err), -1);
    assert_string_equal(err, "the cuda backend does not implement partial RoPE (layer 0 of qwen3moe)");
    engine_config cfg = {.n_slots = 1, .ctx_per_slot = 16, .max_batch_tokens = 16, .n_threads = 1};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    engine_free(e);
    model_free(m);
    free(image);
    m = moe_model(FAULT_NONE, &image, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_false(m->layers[0].recipe.attn_extras & ARCH_ATTN_ROPE_PARTIAL);
    model_free(m);
    free(image);
}

/* The well-formed file loads, runs on the CPU, and a backend without MoE (a feature set
 * lacking it) refuses it by name rather than running something else. */
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

/* Gemma 4's 26B-A4B shape (gemma4_moe.gguf): every layer runs experts beside its dense MLP,
 * the full layers take V from the K projection (no attn_v) and have one kv head; a backend
 * without that block refuses it by name. */
static void test_gemma4_moe_layers(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    const model *m = f->m;
    assert_int_equal(m->hp.n_expert, 8);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *ly = &m->layers[il];
        const bool full = ly->recipe.attn == ARCH_ATTN_FULL;
        assert_int_equal(ly->recipe.ffn, ARCH_FFN_GLU_MOE);
        assert_int_equal(ly->wv.data == NULL, full);
        assert_int_equal(ly->n_head_kv, full ? 1 : 2);
        assert_non_null(ly->ffn_gate_up_exps.data);
    }
    char err[256];
    assert_int_equal(model_check_features(m, ~(arch_features)ARCH_F_FFN_GLU_MOE, "test", err, sizeof err), -1);
    assert_string_equal(err, "the test backend does not implement GLU beside MoE (layer 0 of gemma4)");
}

/* ---- gemma4 files with a fault: the loader names the key or tensor ----------------------- */

typedef enum g4_fault {
    G4_NONE,
    G4_SHORT_ARRAY, /* feed_forward_length with one entry too few */
    G4_NO_OWN_K,    /* blk.0 computes its own K/V but has no attn_k */
    G4_NO_PLE,      /* per-layer embeddings declared, their token table absent */
} g4_fault;

/* src (the reference gemma4) written again from its hyper-parameters with `fault`. */
static model *gemma4_variant(const model *src, g4_fault fault, void **image, char *err, size_t errlen)
{
    const model_hparams *hp = &src->hp;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "gemma4");
    const int_key keys[] = {{"context_length", hp->n_ctx_train}, {"embedding_length", hp->n_embd},
                            {"block_count", hp->n_layer}, {"attention.head_count", hp->n_head},
                            {"attention.head_count_kv", hp->n_head_kv}, {"attention.key_length", hp->head_dim},
                            {"attention.key_length_swa", hp->head_dim_swa}, {"attention.sliding_window", hp->n_swa},
                            {"attention.shared_kv_layers", hp->n_kv_shared},
                            {"embedding_length_per_layer_input", hp->n_embd_ple}};
    set_int_keys(w, "gemma4", keys, sizeof keys / sizeof keys[0]);
    gguf_writer_set_f32(w, "gemma4.attention.layer_norm_rms_epsilon", hp->rms_eps);
    gguf_writer_set_f32(w, "gemma4.rope.freq_base", hp->rope_base);
    gguf_writer_set_f32(w, "gemma4.rope.freq_base_swa", hp->rope_base_swa);
    gguf_writer_set_f32(w, "gemma4.final_logit_softcapping", hp->logit_softcap);
    int32_t ff[64];
    uint8_t sliding[64];
    assert_true(hp->n_layer <= 64);
    for (int il = 0; il < hp->n_layer; il++) {
        ff[il] = src->layers[il].n_ff;
        sliding[il] = src->layers[il].recipe.attn == ARCH_ATTN_SLIDING;
    }
    gguf_writer_set_arr_i32(w, "gemma4.feed_forward_length", ff, (size_t)hp->n_layer - (fault == G4_SHORT_ARRAY));
    gguf_writer_set_raw(w, "gemma4.attention.sliding_window_pattern", GGUF_VT_ARRAY, GGUF_VT_BOOL, sliding,
                        (uint64_t)hp->n_layer);
    for (int64_t i = 0; i < gguf_n_tensors(src->gguf); i++) {
        const gguf_tensor *t = gguf_tensor_at(src->gguf, i);
        if ((fault == G4_NO_OWN_K && strcmp(t->name, "blk.0.attn_k.weight") == 0) ||
            (fault == G4_NO_PLE && strcmp(t->name, "per_layer_token_embd.weight") == 0))
            continue;
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes, true);
    }
    return writer_model(w, image, err, errlen);
}

static void expect_gemma4_refused(const model *src, g4_fault fault, const char *want)
{
    char err[512] = "";
    void *image = NULL;
    model *m = gemma4_variant(src, fault, &image, err, sizeof err);
    check_refused(m, image, (int)fault, err, want);
}

/* The file rewritten from what the loader read loads to the same per-layer shapes (the arrays
 * and the bool pattern read back); each fault is refused by name. */
static void test_gemma4_files(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    char err[512] = "";
    void *image = NULL;
    model *m = gemma4_variant(f->m, G4_NONE, &image, err, sizeof err);
    if (!m) fail_msg("%s", err);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *a = &m->layers[il], *b = &f->m->layers[il];
        assert_int_equal(a->n_ff, b->n_ff);
        assert_int_equal(a->head_dim, b->head_dim);
        assert_int_equal(a->kv_source, b->kv_source);
        assert_int_equal(a->recipe.attn, b->recipe.attn);
    }
    /* the reference's shapes: full layers 2 and 5 (head_dim 32), the last three share K/V */
    assert_int_equal(m->layers[2].head_dim, 32);
    assert_int_equal(m->layers[1].head_dim, 16);
    assert_int_equal(m->layers[5].kv_source, 2);
    assert_int_equal(m->layers[4].kv_source, 1);
    assert_int_equal(m->layers[3].n_ff, 128);
    model_free(m);
    free(image);
    expect_gemma4_refused(f->m, G4_SHORT_ARRAY,
                          "key 'gemma4.feed_forward_length' has 5 entries, expected one per layer (6)");
    expect_gemma4_refused(f->m, G4_NO_OWN_K, "missing tensor 'blk.0.attn_k.weight'");
    expect_gemma4_refused(f->m, G4_NO_PLE, "missing tensor 'per_layer_token_embd.weight' "
                                           "(gemma4.embedding_length_per_layer_input is 16)");
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

/* ---- malformed hybrid files ------------------------------------------------------------ */

enum { H_EMBD = 16, H_HEADS = 2, H_HD = 8, H_FF = 24, H_STATE = 8, H_VHEADS = 2, H_INNER = H_VHEADS * H_STATE,
       H_CHAN = 2 * H_STATE + H_INNER, H_LAYERS = 4 };

typedef enum hybrid_fault {
    HF_NONE,
    HF_INTERVAL, /* full_attention_interval 3: not the family's pattern */
    HF_INNER,    /* ssm.inner_size not v heads x state size */
    HF_NO_CONV,  /* blk.0.ssm_conv1d.weight missing */
    HF_ODD_ROT,  /* rope.dimension_count 5 */
    HF_MTP,      /* one MTP block after the four layers (nextn_predict_layers 1) */
    HF_MTP_HNORM, /* that block without blk.4.nextn.hnorm.weight */
} hybrid_fault;

/* A four-layer qwen35 model (F32; one q/k head, two v heads) with `fault`, as a loaded model
 * or NULL and the error; its image in *image (freed by the caller after the model). */
static model *hybrid_model(hybrid_fault fault, void **image, char *err, size_t errlen)
{
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen35");
    const struct {
        const char *key;
        uint32_t v;
    } keys[] = {{"qwen35.context_length", 64}, {"qwen35.embedding_length", H_EMBD},
                {"qwen35.block_count", H_LAYERS + (fault >= HF_MTP)}, {"qwen35.feed_forward_length", H_FF},
                {"qwen35.attention.head_count", H_HEADS}, {"qwen35.attention.head_count_kv", 1},
                {"qwen35.attention.key_length", H_HD}, {"qwen35.ssm.conv_kernel", 4},
                {"qwen35.ssm.state_size", H_STATE}, {"qwen35.ssm.group_count", 1},
                {"qwen35.ssm.time_step_rank", H_VHEADS}, {"qwen35.ssm.inner_size", fault == HF_INNER ? 24 : H_INNER},
                {"qwen35.full_attention_interval", fault == HF_INTERVAL ? 3 : 4},
                {"qwen35.rope.dimension_count", fault == HF_ODD_ROT ? 5 : 4},
                {"qwen35.nextn_predict_layers", fault >= HF_MTP}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) gguf_writer_set_u32(w, keys[i].key, keys[i].v);
    gguf_writer_set_f32(w, "qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
    add_zeros(w, "token_embd.weight", 2, H_EMBD, M_VOCAB, 1);
    add_zeros(w, "output_norm.weight", 1, H_EMBD, 1, 1);
    char name[64];
#define LAYER_TENSOR(il, suffix, dims, a, b)                                                                         \
    (snprintf(name, sizeof name, "blk.%d.%s", il, suffix), add_zeros(w, name, dims, a, b, 1))
    for (int il = 0; il < H_LAYERS + (fault >= HF_MTP); il++) {
        LAYER_TENSOR(il, "attn_norm.weight", 1, H_EMBD, 1);
        LAYER_TENSOR(il, "post_attention_norm.weight", 1, H_EMBD, 1);
        LAYER_TENSOR(il, "ffn_gate.weight", 2, H_EMBD, H_FF);
        LAYER_TENSOR(il, "ffn_up.weight", 2, H_EMBD, H_FF);
        LAYER_TENSOR(il, "ffn_down.weight", 2, H_FF, H_EMBD);
        if (il >= 3) { /* the full-attention layer, and the MTP block (a full-attention layer) */
            LAYER_TENSOR(il, "attn_q.weight", 2, H_EMBD, 2 * H_HEADS * H_HD);
            LAYER_TENSOR(il, "attn_k.weight", 2, H_EMBD, H_HD);
            LAYER_TENSOR(il, "attn_v.weight", 2, H_EMBD, H_HD);
            LAYER_TENSOR(il, "attn_output.weight", 2, H_HEADS * H_HD, H_EMBD);
            LAYER_TENSOR(il, "attn_q_norm.weight", 1, H_HD, 1);
            LAYER_TENSOR(il, "attn_k_norm.weight", 1, H_HD, 1);
            continue;
        }
        LAYER_TENSOR(il, "attn_qkv.weight", 2, H_EMBD, H_CHAN);
        LAYER_TENSOR(il, "attn_gate.weight", 2, H_EMBD, H_INNER);
        if (!(fault == HF_NO_CONV && il == 0)) LAYER_TENSOR(il, "ssm_conv1d.weight", 2, 4, H_CHAN);
        LAYER_TENSOR(il, "ssm_a", 1, H_VHEADS, 1);
        LAYER_TENSOR(il, "ssm_dt.bias", 1, H_VHEADS, 1);
        LAYER_TENSOR(il, "ssm_beta.weight", 2, H_EMBD, H_VHEADS);
        LAYER_TENSOR(il, "ssm_alpha.weight", 2, H_EMBD, H_VHEADS);
        LAYER_TENSOR(il, "ssm_norm.weight", 1, H_STATE, 1);
        LAYER_TENSOR(il, "ssm_out.weight", 2, H_INNER, H_EMBD);
    }
    if (fault >= HF_MTP) { /* the MTP block's own (the LM head's norm and matrix are the model's) */
        LAYER_TENSOR(H_LAYERS, "nextn.eh_proj.weight", 2, 2 * H_EMBD, H_EMBD);
        LAYER_TENSOR(H_LAYERS, "nextn.enorm.weight", 1, H_EMBD, 1);
        if (fault != HF_MTP_HNORM) LAYER_TENSOR(H_LAYERS, "nextn.hnorm.weight", 1, H_EMBD, 1);
    }
#undef LAYER_TENSOR
    return writer_model(w, image, err, errlen);
}

static void expect_hybrid_refused(hybrid_fault fault, const char *want)
{
    char err[512] = "";
    void *image = NULL;
    model *m = hybrid_model(fault, &image, err, sizeof err);
    check_refused(m, image, (int)fault, err, want);
}

/* The last logits of tokens 1..5 through the CPU engine. */
static void hybrid_logits(const model *m, float *logits)
{
    char err[256];
    engine_config cfg = {.n_slots = 1, .ctx_per_slot = 16, .max_batch_tokens = 16, .n_threads = 1};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &cfg, err, sizeof err);
    if (!e) fail_msg("engine: %s", err);
    int32_t toks[5] = {1, 2, 3, 4, 5};
    engine_seq s = {.slot = 0, .tokens = toks, .n_tokens = 5, .logits = logits};
    assert_int_equal(engine_step(e, &s, 1, NULL, err, sizeof err), 0);
    engine_free(e);
}

/* A hybrid file whose DeltaNet shapes or layer pattern are wrong, or whose MTP block lacks a
 * tensor, is refused at load with the key or tensor named; one with an MTP block loads, binds
 * it, runs the layers before it and gives the logits of the same file without it. */
static void test_malformed_hybrid_refused(void **state)
{
    (void)state;
    expect_hybrid_refused(HF_INTERVAL, "qwen35.full_attention_interval 3: this family's layer pattern repeats every 4 "
                                       "layers");
    expect_hybrid_refused(HF_INNER, "qwen35.ssm.inner_size 24 is not ssm.time_step_rank 2 x ssm.state_size 8");
    expect_hybrid_refused(HF_NO_CONV, "missing tensor 'blk.0.ssm_conv1d.weight'");
    expect_hybrid_refused(HF_ODD_ROT, "qwen35.rope.dimension_count 5 must be even and at most the head dimension 8");
    expect_hybrid_refused(HF_MTP_HNORM, "missing tensor 'blk.4.nextn.hnorm.weight'");
    char err[512] = "";
    void *img = NULL, *img_mtp = NULL;
    model *m = hybrid_model(HF_NONE, &img, err, sizeof err);
    if (!m) fail_msg("%s", err);
    model *mtp = hybrid_model(HF_MTP, &img_mtp, err, sizeof err);
    if (!mtp) fail_msg("with an MTP block: %s", err);
    assert_int_equal(mtp->hp.n_layer, H_LAYERS);
    assert_int_equal(mtp->hp.n_mtp, 1);
    assert_true(mtp->mtp.bound && !m->mtp.bound);
    assert_int_equal(mtp->layers[H_LAYERS].recipe.attn, ARCH_ATTN_FULL);
    assert_ptr_equal(mtp->mtp.head.data, mtp->output.data); /* no shared_head_head: the model's */
    assert_int_equal(m->layers[0].recipe.attn, ARCH_ATTN_LINEAR);
    assert_int_equal(m->layers[3].recipe.attn, ARCH_ATTN_FULL);
    assert_int_equal(m->hp.n_rot, 4);
    float a[M_VOCAB], b[M_VOCAB];
    hybrid_logits(m, a);
    hybrid_logits(mtp, b);
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < M_VOCAB; i++) assert_true(isfinite(a[i]));
    model_free(m), model_free(mtp);
    free(img), free(img_mtp);
}

/* ---- hybrid models: the recurrent state across steps ------------------------------------ */

/* The longest prompt (70 tokens: past a conv window and a 64-token chunk) prefilled in
 * pieces of every length in `pieces` gives, bit for bit, the logits of one piece: the conv
 * window and the delta state carry a sequence from one step to the next exactly. */
static void test_prefill_in_pieces(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    const cJSON *prompts = cJSON_GetObjectItem(f->ref, "prompts");
    int n;
    int32_t *ids = int_array(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, cJSON_GetArraySize(prompts) - 1), "ids"), &n);
    const size_t row = (size_t)f->n_vocab;
    float *whole = malloc((size_t)n * row * sizeof(float)), *split = malloc((size_t)n * row * sizeof(float));
    char err[256];
    engine_slot_clear(f->e, 0);
    engine_seq s = {.slot = 0, .tokens = ids, .n_tokens = n, .logits = whole, .logits_all = true};
    if (engine_step(f->e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
    const int pieces[] = {1, 3, 4, 5, 13, 31, 64, 69};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        engine_slot_clear(f->e, 1);
        for (int pos = 0; pos < n; pos += pieces[k]) {
            int len = n - pos < pieces[k] ? n - pos : pieces[k];
            s = (engine_seq){.slot = 1, .tokens = ids + pos, .n_tokens = len, .pos = pos, .logits = split + pos * row,
                             .logits_all = true};
            if (engine_step(f->e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("piece %d at %d: %s", pieces[k], pos, err);
        }
        if (memcmp(whole, split, (size_t)n * row * sizeof(float)) != 0)
            fail_msg("pieces of %d tokens: logits differ from one piece", pieces[k]);
    }
    free(whole), free(split), free(ids);
}

/* State slots through a block table: a snapshot (engine_state_copy) of a sequence after 40
 * tokens, restored into another slot and continued, gives the logits of the sequence that
 * went on without it; a step that would rewind a state is refused and changes nothing. */
static void test_state_snapshot(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    assert_true(engine_state_bytes(f->e) > 0);
    assert_int_equal(engine_state_slots(f->e), 4);
    assert_true(engine_can_rewind_state(f->e)); /* the CPU's: serve speculates over it */
    const cJSON *prompts = cJSON_GetObjectItem(f->ref, "prompts");
    int n;
    int32_t *ids = int_array(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, cJSON_GetArraySize(prompts) - 1), "ids"), &n);
    const int cut = 40, width = engine_get_config(f->e)->ctx_per_slot / ENGINE_KV_BLOCK;
    int32_t table_a[8], table_b[8];
    for (int b = 0; b < width; b++) table_a[b] = b, table_b[b] = width + b; /* rows 0 and 1's blocks */
    float *want = malloc((size_t)f->n_vocab * sizeof(float)), *got = malloc((size_t)f->n_vocab * sizeof(float));
    char err[256];
    engine_seq s = {.slot = 0, .tokens = ids, .n_tokens = cut, .blocks = table_a, .state = 2};
    if (engine_step(f->e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
    if (engine_state_copy(f->e, 3, 2, err, sizeof err) != 0) fail_msg("snapshot: %s", err);
    engine_slot_clear(f->e, 3); /* row 3 ends: state slot 3 (the snapshot) is not the row's */
    s = (engine_seq){.slot = 0, .tokens = ids + cut, .n_tokens = n - cut, .pos = cut, .blocks = table_a, .state = 2,
                     .logits = want};
    if (engine_step(f->e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
    /* the rest of the sequence on the snapshot: K/V of the prefix copied, the state restored */
    for (int b = 0; b <= cut / ENGINE_KV_BLOCK; b++)
        if (engine_kv_copy(f->e, table_b[b], table_a[b], err, sizeof err) != 0) fail_msg("kv copy: %s", err);
    if (engine_state_copy(f->e, 1, 3, err, sizeof err) != 0) fail_msg("restore: %s", err);
    s = (engine_seq){.slot = 1, .tokens = ids + cut, .n_tokens = n - cut, .pos = cut, .blocks = table_b, .state = 1,
                     .history = ids, .logits = got};
    if (engine_step(f->e, &s, 1, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
    assert_memory_equal(want, got, (size_t)f->n_vocab * sizeof(float));
    /* slot 2 now holds the state after n tokens: going back to position cut is refused */
    s = (engine_seq){.slot = 0, .tokens = ids + cut, .n_tokens = 1, .pos = cut, .blocks = table_a, .state = 2};
    assert_int_equal(engine_step(f->e, &s, 1, NULL, err, sizeof err), ENGINE_EINVAL);
    assert_non_null(strstr(err, "cannot rewind"));
    /* nor may two sequences of a step share a state slot */
    engine_seq two[2] = {{.slot = 0, .tokens = ids, .n_tokens = 2, .blocks = table_a, .state = 1},
                         {.slot = 1, .tokens = ids, .n_tokens = 2, .blocks = table_b, .state = 1}};
    assert_int_equal(engine_step(f->e, two, 2, NULL, err, sizeof err), ENGINE_EINVAL);
    assert_non_null(strstr(err, "state slot 1 appears twice"));
    assert_int_equal(engine_state_copy(f->e, 4, 0, err, sizeof err), ENGINE_EINVAL);
    free(want), free(got), free(ids);
}

/* A backend without the hybrid layers (a feature set lacking them, as the GPU's was before
 * they were verified there) refuses the file by the feature and the family's name at engine
 * creation, so --device auto runs it on the CPU. */
static void test_hybrid_refused_without_deltanet(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    const arch_features gpu = ARCH_F_NORM_PRE | ARCH_F_NORM_SANDWICH | ARCH_F_ATTN_FULL | ARCH_F_QKV_BIAS |
                              ARCH_F_QK_NORM | ARCH_F_FFN_GLU | ARCH_F_ACT_SILU;
    char err[256], want[256];
    assert_int_equal(model_check_features(f->m, gpu, "cuda", err, sizeof err), -1);
    snprintf(want, sizeof want, "the cuda backend does not implement gated DeltaNet linear attention (layer 0 of %s)",
             f->m->desc->name);
    assert_string_equal(err, want);
}

/* ---- bert: an encoder's embeddings ------------------------------------------------------ */

static double cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

/* The four prompts side by side in one step, each asking for its last hidden states (pooling
 * none), its mean and its L2-normalised mean: every row against transformers' (hidden_b64,
 * pooled_b64, pooled_l2_b64) within 1e-4 relative, the normalised mean at cosine >= 0.99999.
 * Bidirectional attention shows in every row: a causal mask would move the early rows by far
 * more. */
static void test_bert_embeddings(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    assert_int_equal(f->m->hp.pooling, ENGINE_POOL_MEAN); /* the file says how it pools */
    const int d = f->m->hp.n_embd;
    const cJSON *prompts = cJSON_GetObjectItem(f->ref, "prompts");
    const int n_prompts = cJSON_GetArraySize(prompts);
    assert_true(n_prompts >= 1 && n_prompts <= 4);
    int32_t *ids[4];
    int lens[4];
    float *hidden[4], *mean[4], *l2[4];
    engine_embed em[12];
    engine_seq seqs[12];
    const engine_config *cfg = engine_get_config(f->e);
    assert_true(cfg->n_slots >= 4);
    for (int p = 0; p < n_prompts; p++) {
        ids[p] = int_array(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, p), "ids"), &lens[p]);
        hidden[p] = malloc((size_t)lens[p] * d * sizeof(float));
        mean[p] = malloc((size_t)d * sizeof(float));
        l2[p] = malloc((size_t)d * sizeof(float));
    }
    char err[256];
    float *outs[3][4] = {{0}};
    for (int p = 0; p < n_prompts; p++) outs[0][p] = hidden[p], outs[1][p] = mean[p], outs[2][p] = l2[p];
    const engine_pooling pool[3] = {ENGINE_POOL_NONE, ENGINE_POOL_MEAN, ENGINE_POOL_MEAN};
    for (int k = 0; k < 3; k++) { /* one step per pooling, the prompts side by side */
        for (int p = 0; p < n_prompts; p++) {
            em[p] = (engine_embed){.pooling = pool[k], .normalize = k == 2, .out = outs[k][p]};
            seqs[p] = (engine_seq){.slot = p, .tokens = ids[p], .n_tokens = lens[p], .embed = &em[p]};
        }
        if (engine_step(f->e, seqs, n_prompts, NULL, err, sizeof err) != 0) fail_msg("step: %s", err);
    }
    tally t = {0};
    double worst_cos = 1;
    for (int p = 0; p < n_prompts; p++) {
        const cJSON *pr = cJSON_GetArrayItem(prompts, p);
        size_t n_h, n_m, n_l;
        float *ref_h = b64_floats(cJSON_GetObjectItem(pr, "hidden_b64")->valuestring, &n_h);
        float *ref_m = b64_floats(cJSON_GetObjectItem(pr, "pooled_b64")->valuestring, &n_m);
        float *ref_l = b64_floats(cJSON_GetObjectItem(pr, "pooled_l2_b64")->valuestring, &n_l);
        assert_int_equal(n_h, (size_t)lens[p] * d);
        assert_int_equal(n_m, (size_t)d);
        assert_int_equal(n_l, (size_t)d);
        for (int r = 0; r < lens[p]; r++)
            tally_row(&t, &f->c->tol, compare_row(hidden[p] + (size_t)r * d, ref_h + (size_t)r * d, d));
        tally_row(&t, &f->c->tol, compare_row(mean[p], ref_m, d));
        tally_row(&t, &f->c->tol, compare_row(l2[p], ref_l, d));
        worst_cos = fmin(worst_cos, cosine(l2[p], ref_l, d));
        free(ref_h), free(ref_m), free(ref_l);
    }
    print_message("  bert: cosine of the normalised embeddings >= %.9f\n", worst_cos);
    check_tally(&t, &f->c->tol, f->c->gguf);
    assert_true(worst_cos >= 0.99999);
    /* an encoder has no LM head: a token or logits asked of it is a clear error */
    sampling_params sp;
    sampling_params_default(&sp);
    engine_seq bad = {.slot = 0, .tokens = ids[0], .n_tokens = lens[0], .want_token = true, .sp = &sp};
    engine_result res;
    assert_int_equal(engine_step(f->e, &bad, 1, &res, err, sizeof err), ENGINE_EINVAL);
    assert_non_null(strstr(err, "encoder"));
    for (int p = 0; p < n_prompts; p++) free(ids[p]), free(hidden[p]), free(mean[p]), free(l2[p]);
}

/* ---- deepseek2: multi-head latent attention ----------------------------------------------- */

/* The recipe and shapes the loader makes of the reference file (llama.cpp's converter's MLA
 * keys: key_length 40 = kv_lora 32 + rope 8, value_length 32, key_length_mla 24 = nope 16 +
 * rope 8, value_length_mla 16), and what the engine keeps per token: one row of kv_lora +
 * rope floats per layer, no V cache. */
static void test_deepseek_recipe(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    const model_hparams *hp = &f->m->hp;
    assert_int_equal(hp->kv_lora_rank, 32);
    assert_int_equal(hp->q_lora_rank, 32);
    assert_int_equal(hp->mla_nope, 16);
    assert_int_equal(hp->n_rot, 8);
    assert_int_equal(hp->mla_v, 16);
    assert_int_equal(hp->head_dim, 40); /* the cache row */
    assert_int_equal(hp->n_head_kv, 1);
    assert_int_equal(hp->n_dense_lead, 1);
    assert_int_equal(hp->n_expert_groups, 4);
    assert_int_equal(hp->n_group_used, 2);
    assert_true(hp->expert_weights_norm);
    const double ms = 1 + 0.1 * log(40.0);
    assert_float_equal(hp->attn_mscale2, ms * ms, 1e-5);
    assert_float_equal(hp->rope_attn_factor, 1.0, 0); /* cos and sin unscaled */
    assert_float_equal(hp->yarn_low, 1, 0);             /* floor(1.31..) */
    assert_float_equal(hp->yarn_high, 3, 0);            /* ceil(2.81..) */
    char d[256];
    arch_layer_describe(&f->m->layers[0].recipe, d, sizeof d);
    assert_string_equal(d, "pre-norm, multi-head latent attention, GLU silu");
    arch_layer_describe(&f->m->layers[1].recipe, d, sizeof d);
    assert_string_equal(d, "pre-norm, multi-head latent attention, MoE silu (sigmoid router + selection bias, "
                           "renormalised, scaled) + expert groups + shared expert");
    /* one cache of 40 floats per token and layer: a 16-token block of 3 layers */
    const engine_config cfg = {.n_slots = 1, .ctx_per_slot = 64, .max_batch_tokens = 64, .n_threads = 1,
                               .kv_cache_mb = 1};
    char err[256];
    engine *e = engine_open(ENGINE_DEVICE_CPU, f->m, &cfg, err, sizeof err);
    if (!e) fail_msg("%s", err);
    assert_int_equal(engine_kv_blocks(e), (1 << 20) / (3 * ENGINE_KV_BLOCK * 40 * 4));
    engine_free(e);
}

/* A deepseek2 file missing an MLA tensor, with one of the wrong shape, or with the fused K/V
 * up-projection of llama.cpp's older converter, is refused naming it. */
static void test_deepseek_malformed(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    static const refused_edit cases[] = {
        {{.drop = "blk.1.attn_kv_a_mqa.weight"}, "missing tensor 'blk.1.attn_kv_a_mqa.weight'"},
        {{.drop = "blk.0.attn_q_a_norm.weight"}, "missing tensor 'blk.0.attn_q_a_norm.weight'"},
        {{.drop = "blk.2.attn_v_b.weight"}, "missing tensor 'blk.2.attn_v_b.weight'"},
        {{.shrink = "blk.2.attn_k_b.weight"},
         "tensor 'blk.2.attn_k_b.weight': expected shape [16, 32, 4] (the last: heads), found [16, 32, 3]"},
        {{.shrink = "blk.0.attn_kv_a_norm.weight"}, "tensor 'blk.0.attn_kv_a_norm.weight': expected shape [32], found [31]"},
        {{.shrink = "blk.1.attn_q_b.weight"}, "tensor 'blk.1.attn_q_b.weight': expected shape [32, 96], found [32, 95]"},
        {{.drop = "blk.1.exp_probs_b.bias"}, "missing tensor 'blk.1.exp_probs_b.bias'"},
        {{.drop = "blk.0.attn_k_b.weight", .as = "blk.0.attn_kv_b.weight"},
         "tensor 'blk.0.attn_kv_b.weight': the fused K/V up-projection (llama.cpp's converter before the split into "
         "attn_k_b and attn_v_b) is not supported; convert the model again"},
    };
    expect_edits_refused(f->m, cases, sizeof cases / sizeof cases[0]);
}

/* What the file's routing keys decide: without expert_gating_func the router is V2's softmax
 * (llama.cpp's reading), without expert_weights_norm the weights are not renormalised; and
 * without key_length_mla the attention keys are read as the older per-head ones, which this
 * file's tensors do not fit (refused naming the first). */
static void test_deepseek_routing_keys(void **state)
{
    fixture *f = *state;
    if (!f->ref) skip();
    char err[512];
    void *image = NULL;
    model *m = edited_gptoss(f->m, (gptoss_edit){.drop_key = "deepseek2.expert_gating_func"}, &image, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->layers[1].recipe.router, ARCH_ROUTER_SOFTMAX_TOPK);
    assert_null(m->layers[1].exp_probs_b.data); /* the bias is the sigmoid router's */
    model_free(m);
    free(image);
    m = edited_gptoss(f->m, (gptoss_edit){.drop_key = "deepseek2.expert_weights_norm"}, &image, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_false(m->hp.expert_weights_norm);
    model_free(m);
    free(image);
    static const refused_edit cases[] = {
        {{.drop_key = "deepseek2.attention.key_length_mla"},
         "tensor 'blk.0.attn_q_b.weight': expected shape [32, 160], found [32, 96]"},
    };
    expect_edits_refused(f->m, cases, sizeof cases / sizeof cases[0]);
}

/* DeepSeek's routers on their own: V3's groups (a group scores its two best biased scores,
 * the experts outside the kept groups count 0), V2's softmax with groups by best score,
 * without renormalisation, scaled. */
static void test_moe_route_grouped(void **state)
{
    (void)state;
    int32_t ids[2];
    float w[2], choice[8 + 4];
    /* 4 groups of 2; sigmoid(0) = 0.5 everywhere, the bias decides: group 3 (0.3 + 0.3) and
     * group 0 (0.9 + 0.5) are kept, not group 1 (1.0 + 0.3: expert 2's best score is outside) */
    const float bias[8] = {0.4f, 0.0f, 0.5f, -0.2f, 0.0f, 0.0f, 0.3f, 0.3f};
    float logits[8] = {0};
    cpu_score_router r = {.bias = bias, .n_expert = 8, .k = 2, .scale = 2.5f, .n_group = 4, .topk_group = 2,
                          .choice = choice};
    cpu_moe_route_scored(&r, logits, ids, w);
    assert_int_equal(ids[0], 0); /* 0.9 */
    assert_int_equal(ids[1], 6); /* 0.8 (ties with 7: the lower id); expert 2's 1.0 is outside */
    assert_float_equal(w[0], 1.25f, 1e-6f);
    assert_float_equal(w[1], 1.25f, 1e-6f);
    /* softmax, group by best score, raw weights times 16 (DeepSeek-V2) */
    float l2[8] = {0.0f, 0.0f, 3.0f, 0.0f, 0.0f, 2.0f, 0.0f, 2.5f};
    cpu_score_router v2 = {.n_expert = 8, .k = 2, .scale = 16.0f, .softmax = true, .raw = true, .n_group = 4,
                           .topk_group = 1, .choice = choice};
    cpu_moe_route_scored(&v2, l2, ids, w);
    double z = 5 + exp(3.0) + exp(2.0) + exp(2.5);
    assert_int_equal(ids[0], 2); /* group 1 alone is kept */
    assert_int_equal(ids[1], 3);
    assert_float_equal(w[0], 16 * exp(3.0) / z, 1e-5);
    assert_float_equal(w[1], 16 * 1 / z, 1e-5);
}

int main(void)
{
    const struct CMUnitTest f32[] = {
        cmocka_unit_test(test_prefill_logits),
        cmocka_unit_test(test_greedy_decode),
    };
    int failed = cmocka_run_group_tests_name("qwen3moe F32", f32, setup_f32, teardown);
    failed += cmocka_run_group_tests_name("qwen3moe F16", f32, setup_f16, teardown);
    failed += cmocka_run_group_tests_name("gemma3 F32", f32, setup_gemma3, teardown);
    const struct CMUnitTest gemma4[] = {
        cmocka_unit_test(test_prefill_logits),
        cmocka_unit_test(test_greedy_decode),
        cmocka_unit_test(test_gemma4_files),
    };
    failed += cmocka_run_group_tests_name("gemma4 F32", gemma4, setup_gemma4, teardown);
    const struct CMUnitTest gemma4_moe[] = {
        cmocka_unit_test(test_prefill_logits),
        cmocka_unit_test(test_greedy_decode),
        cmocka_unit_test(test_gemma4_moe_layers),
    };
    failed += cmocka_run_group_tests_name("gemma4_moe F32", gemma4_moe, setup_gemma4_moe, teardown);
    const struct CMUnitTest gptoss[] = {
        cmocka_unit_test(test_gptoss_recipe),
        cmocka_unit_test(test_gptoss_malformed),
        cmocka_unit_test(test_prefill_logits),
        cmocka_unit_test(test_greedy_decode),
    };
    failed += cmocka_run_group_tests_name("gpt-oss F32", gptoss, setup_gptoss, teardown);
    failed += cmocka_run_group_tests_name("gpt-oss MXFP4 experts", gptoss, setup_gptoss_mxfp4, teardown);
    failed += cmocka_run_group_tests_name("mistral F32", f32, setup_mistral, teardown);
    failed += cmocka_run_group_tests_name("phi3 F32", f32, setup_phi3, teardown);
    const struct CMUnitTest longrope[] = {cmocka_unit_test(test_longrope_factors)};
    failed += cmocka_run_group_tests_name("phi3 LongRoPE", longrope, setup_phi3, teardown);
    failed += cmocka_run_group_tests_name("glm4moe F32", f32, setup_glm4moe, teardown);
    const struct CMUnitTest deepseek[] = {
        cmocka_unit_test(test_deepseek_recipe),
        cmocka_unit_test(test_deepseek_malformed),
        cmocka_unit_test(test_deepseek_routing_keys),
        cmocka_unit_test(test_prefill_logits),
        cmocka_unit_test(test_greedy_decode),
        cmocka_unit_test(test_prefill_in_pieces),
    };
    failed += cmocka_run_group_tests_name("deepseek_v3 F32", deepseek, setup_deepseek, teardown);
    const struct CMUnitTest quantised[] = {cmocka_unit_test(test_quantised_experts)};
    failed += cmocka_run_group_tests_name("qwen3moe quantised experts", quantised, setup_f32, teardown);
    const struct CMUnitTest files[] = {
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_route_topk_softmax),
        cmocka_unit_test(test_swiglu_clamp),
        cmocka_unit_test(test_moe_route_sigmoid),
        cmocka_unit_test(test_moe_route_grouped),
        cmocka_unit_test(test_gpu_features),
        cmocka_unit_test(test_malformed_moe_refused),
        cmocka_unit_test(test_moe_backend_features),
        cmocka_unit_test(test_partial_rope_from_file),
        cmocka_unit_test(test_malformed_hybrid_refused),
    };
    failed += cmocka_run_group_tests_name("qwen3moe and qwen35 files", files, NULL, NULL);
    const struct CMUnitTest hybrid[] = {
        cmocka_unit_test(test_prefill_logits),
        cmocka_unit_test(test_greedy_decode),
        cmocka_unit_test(test_prefill_in_pieces),
        cmocka_unit_test(test_state_snapshot),
        cmocka_unit_test(test_hybrid_refused_without_deltanet),
    };
    failed += cmocka_run_group_tests_name("qwen35", hybrid, setup_qwen35, teardown);
    failed += cmocka_run_group_tests_name("qwen35moe", hybrid, setup_qwen35moe, teardown);
    failed += cmocka_run_group_tests_name("qwen3next", hybrid, setup_qwen3next, teardown);
    const struct CMUnitTest bert[] = {cmocka_unit_test(test_bert_embeddings)};
    failed += cmocka_run_group_tests_name("bert", bert, setup_bert, teardown);
    return failed;
}
