/* test_mkmodel.c - the synthetic model generator: every architecture and weight type gives a
 * file that model_load + tokenizer_load accept and the CPU engine runs; the learned BPE
 * tokenizer round-trips text; Q4_K_M follows llama.cpp's mix; output is deterministic. */
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
#include "synth/bpe_train.h"
#include "synth/mkmodel.h"
#include "synth/words.h"
#include "text/chat_parse.h"
#include "text/tokenizer.h"

static char tmpdir[64];
static char *corpus;
static size_t corpus_len;

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/inferd-mkmodel-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    corpus = mkmodel_corpus(INFERD_SOURCE_DIR, 1u << 20, &corpus_len);
    return corpus ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    free(corpus);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_model(const mkmodel_config *cfg, const char *file, char *path, size_t cap)
{
    char err[256] = "";
    snprintf(path, cap, "%s/%s", tmpdir, file);
    int rc = mkmodel_write(cfg, corpus, corpus_len, path, err, sizeof err);
    if (rc != 0) fail_msg("mkmodel_write %s: %s", file, err);
}

static const char *const roundtrip_texts[] = {
    "Hello, world! The scheduler packs prompts into one batch.",
    "static int foo(const char *s) {\n    return s[0] == '\\0' ? -1 : 42;\n}\n",
    "  leading spaces,\ttabs\n\nand blank lines  ",
    "unicode: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 end",
    "numbers 1234567890 and symbols ~!@#$%^&*()_+",
};

/* An encoder's step: the file's pooling (mean) over n tokens gives a finite unit vector whose
 * entries are not all equal. */
static void check_encoder_step(engine *e, const int32_t *ids, int n, int n_embd)
{
    char err[256] = "";
    float *v = calloc((size_t)n_embd, sizeof *v);
    assert_non_null(v);
    engine_embed em = {.pooling = ENGINE_POOL_MEAN, .normalize = true, .out = v};
    engine_seq seq = {.slot = 0, .tokens = ids, .n_tokens = n, .pos = 0, .embed = &em};
    if (engine_step(e, &seq, 1, NULL, err, sizeof err) != 0) fail_msg("engine_step (embedding): %s", err);
    double norm = 0;
    float lo = v[0], hi = v[0];
    for (int i = 0; i < n_embd; i++) {
        assert_true(isfinite(v[i]));
        norm += (double)v[i] * v[i];
        lo = fminf(lo, v[i]), hi = fmaxf(hi, v[i]);
    }
    assert_true(fabs(norm - 1.0) < 1e-4);
    assert_true(hi - lo > 1e-3f);
    free(v);
}

/* Load the file, check hyper-parameters, round-trip text, run one engine step. */
static void check_model(const char *path, const mkmodel_config *cfg)
{
    char err[256] = "";
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("model_load %s: %s", path, err);
    assert_int_equal(m->hp.arch, cfg->arch);
    assert_int_equal(m->hp.n_embd, cfg->n_embd);
    assert_int_equal(m->hp.n_layer, cfg->n_layer);
    assert_int_equal(m->hp.n_head, cfg->n_head);
    assert_int_equal(m->hp.n_head_kv, cfg->n_head_kv);
    assert_int_equal(m->hp.n_ff, cfg->n_ff);
    assert_int_equal(m->hp.n_vocab, cfg->n_vocab);
    assert_int_equal(m->hp.n_ctx_train, cfg->n_ctx);
    assert_int_equal(m->hp.tied_output, cfg->tied_output);
    assert_string_equal(m->name, cfg->name);

    tokenizer *t = tokenizer_load(m->gguf, err, sizeof err);
    if (!t) fail_msg("tokenizer_load %s: %s", path, err);
    assert_int_equal(tokenizer_n_vocab(t), cfg->n_vocab);
    const char *eot = cfg->arch == MODEL_ARCH_LLAMA ? "<|eot_id|>" : cfg->arch == MODEL_ARCH_GPTOSS ? "<|return|>" : "<|im_end|>";
    int32_t eot_id = tokenizer_find(t, eot);
    assert_true(eot_id >= 256);
    assert_true(tokenizer_is_control(t, eot_id));
    assert_true(tokenizer_is_eog(t, eot_id));
    assert_int_equal(tokenizer_add_bos(t), cfg->arch == MODEL_ARCH_LLAMA);

    int32_t ids[512];
    char back[1024];
    for (size_t i = 0; i < sizeof roundtrip_texts / sizeof roundtrip_texts[0]; i++) {
        const char *s = roundtrip_texts[i];
        int n = tokenizer_encode(t, s, strlen(s), false, false, ids, 512);
        assert_true(n > 0 && n <= 512);
        assert_true((size_t)n < strlen(s)); /* the learned merges compress the text */
        size_t len = tokenizer_decode(t, ids, n, back, sizeof back);
        assert_int_equal(len, strlen(s));
        assert_memory_equal(back, s, len);
    }
    /* special tokens are parsed only when asked */
    char chat[64];
    snprintf(chat, sizeof chat, "hi%s", eot);
    int n = tokenizer_encode(t, chat, strlen(chat), false, true, ids, 512);
    assert_true(n >= 2);
    assert_int_equal(ids[n - 1], eot_id);
    n = tokenizer_encode(t, chat, strlen(chat), false, false, ids, 512);
    for (int i = 0; i < n; i++) assert_int_not_equal(ids[i], eot_id);

    engine_config ec = {.n_slots = 2, .ctx_per_slot = 64, .max_batch_tokens = 64, .n_threads = 1};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &ec, err, sizeof err);
    if (!e) fail_msg("engine_create_cpu %s: %s", path, err);
    sampling_params sp;
    sampling_params_default(&sp);
    n = tokenizer_encode(t, "The model runs", 14, tokenizer_add_bos(t), false, ids, 512);
    if (m->hp.encoder) { /* no LM head: its pooled, normalised embedding instead of a token */
        check_encoder_step(e, ids, n, cfg->n_embd);
        engine_free(e);
        tokenizer_free(t);
        model_free(m);
        return;
    }
    float *logits = malloc((size_t)cfg->n_vocab * sizeof *logits);
    assert_non_null(logits);
    engine_seq seq = {.slot = 0, .tokens = ids, .n_tokens = n, .pos = 0, .want_token = true,
                      .sp = &sp, .logits = logits};
    engine_result res;
    if (engine_step(e, &seq, 1, &res, err, sizeof err) != 0) fail_msg("engine_step: %s", err);
    assert_true(res.token >= 0 && res.token < cfg->n_vocab);
    /* sane activations: finite logits that are not all equal, greedy token is the argmax */
    int best = 0;
    float lo = logits[0], hi = logits[0];
    for (int i = 0; i < cfg->n_vocab; i++) {
        assert_true(logits[i] == logits[i] && logits[i] > -1e4f && logits[i] < 1e4f);
        if (logits[i] > logits[best]) best = i;
        if (logits[i] < lo) lo = logits[i];
        if (logits[i] > hi) hi = logits[i];
    }
    assert_true(hi - lo > 1e-3f);
    assert_int_equal(res.token, best);
    free(logits);
    engine_free(e);
    tokenizer_free(t);
    model_free(m);
}

/* tiny for each architecture and each weight type; the K-quant types also with rows long
 * enough (256) for K blocks, tiny's own 64-wide rows taking llama-quantize's fallback (Q5_0
 * for Q4_K, Q8_0 for Q6_K, ...: mkmodel.c row_fallback).  The types
 * from IQ3_S on (the IQ and MXFP4 formats and the UD mixes: encoders and decoders the
 * architecture does not touch) on llama only, which keeps the test inside its time bound
 * in the sanitizer build. */
static void test_tiny_all_archs_and_types(void **state)
{
    (void)state;
    const model_arch archs[] = {MODEL_ARCH_LLAMA, MODEL_ARCH_QWEN2, MODEL_ARCH_QWEN3, MODEL_ARCH_GEMMA3};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        for (int ft = 0; ft < MKMODEL_FTYPE_COUNT; ft++) {
            if (archs[a] != MODEL_ARCH_LLAMA && ft >= MKMODEL_IQ3_S) continue;
            for (int wide = 0; wide < 2; wide++) {
                mkmodel_config cfg;
                assert_true(mkmodel_preset("tiny", &cfg));
                if (archs[a] != cfg.arch) mkmodel_set_arch(&cfg, archs[a]);
                cfg.ftype = (mkmodel_ftype)ft;
                bool k_quant = ggml_type_block_elems(mkmodel_tensor_type(&cfg, "attn_q", 0)) == QK_K;
                if (wide && !k_quant) continue; /* 64-wide rows already fit 32-blocks */
                if (wide) {
                    cfg.n_embd = 256;
                    cfg.n_ff = 512;
                }
                char file[64], path[256];
                snprintf(file, sizeof file, "tiny-%s-%s-%d.gguf", model_arch_name(archs[a]),
                         mkmodel_ftype_name(cfg.ftype), wide);
                write_model(&cfg, file, path, sizeof path);
                check_model(path, &cfg);
                if (wide) { /* no fallback: the matrices really have the requested type */
                    char err[256];
                    model *m = model_load(path, err, sizeof err);
                    assert_non_null(m);
                    if (archs[a] == MODEL_ARCH_GEMMA3) { /* five sliding layers to one full */
                        assert_int_equal(m->layers[0].window, 1024);
                        assert_int_equal(m->layers[1].recipe.attn, ARCH_ATTN_SLIDING);
                        assert_non_null(m->layers[1].ffn_post_norm.data);
                    }
                    assert_int_equal(m->layers[0].wq.type, mkmodel_tensor_type(&cfg, "attn_q", 0));
                    assert_int_equal(m->layers[1].w_down.type, mkmodel_tensor_type(&cfg, "ffn_down", 1));
                    model_free(m);
                }
                unlink(path);
            }
        }
    }
}

/* qwen3moe (--arch qwen3moe, the qwen3-30b-a3b preset's family): the experts as 3-D tensors of
 * the requested count and width, the router F32 as llama.cpp leaves it, Q4_K_M's ffn_down rule
 * on the experts' down projections, and a CPU step through the mixture. */
static void test_qwen3moe(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    mkmodel_set_arch(&cfg, MODEL_ARCH_QWEN3MOE);
    assert_int_equal(cfg.n_expert, 8); /* set_arch's defaults */
    assert_int_equal(cfg.n_expert_used, 2);
    cfg.n_embd = 256, cfg.n_ff = 1024, cfg.n_layer = 8, cfg.n_expert = 4, cfg.n_ff_exp = 256;
    cfg.ftype = MKMODEL_Q4_K_M;
    char path[256], err[256];
    write_model(&cfg, "tiny-qwen3moe.gguf", path, sizeof path);
    check_model(path, &cfg);
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->hp.n_expert, 4);
    assert_int_equal(m->hp.n_expert_used, 2);
    assert_int_equal(m->hp.n_ff_exp, 256);
    for (int il = 0; il < cfg.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        assert_null(L->w_gate.data);
        assert_int_equal(L->ffn_gate_inp.type, GGML_TYPE_F32);
        assert_int_equal(L->ffn_gate_exps.ne2, 4);
        assert_int_equal(L->ffn_gate_exps.ne1, 256);
        assert_int_equal(L->ffn_up_exps.type, GGML_TYPE_Q4_K);
        assert_int_equal(L->ffn_down_exps.type, mkmodel_tensor_type(&cfg, "ffn_down", il));
    }
    assert_int_equal(m->layers[0].ffn_down_exps.type, GGML_TYPE_Q6_K); /* use_more_bits(0, 8) */
    assert_int_equal(m->layers[2].ffn_down_exps.type, GGML_TYPE_Q4_K);
    model_free(m);
    unlink(path);
    /* the preset: Qwen3-30B-A3B's shape */
    assert_true(mkmodel_preset("qwen3-30b-a3b", &cfg));
    assert_int_equal(cfg.arch, MODEL_ARCH_QWEN3MOE);
    assert_int_equal(cfg.n_layer, 48);
    assert_int_equal(cfg.n_expert, 128);
    assert_int_equal(cfg.n_expert_used, 8);
    assert_int_equal(cfg.n_ff_exp, 768);
    assert_int_equal(cfg.ftype, MKMODEL_Q4_K_M);
    cfg.n_expert_used = 129;
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "experts"));
}

/* A Qwen3.5 preset shrunk to a test's size: 4 layers (three DeltaNet, one gated attention) of
 * 256, 4 v heads of state 32 over 2 k groups, a 512-token vocabulary; the FFN width is the
 * caller's. */
static void hybrid_scaled_down(mkmodel_config *cfg)
{
    cfg->n_embd = 256, cfg->n_layer = 4, cfg->n_head = 2, cfg->n_head_kv = 1, cfg->head_dim = 64, cfg->n_rot = 16;
    cfg->n_vocab = 512, cfg->n_ctx = 512;
    cfg->ssm_state = 32, cfg->ssm_groups = 2, cfg->ssm_vheads = 4, cfg->ssm_inner = 128;
}

/* qwen35 (the qwen3.5-9b preset, scaled down): every fourth layer gated attention with partial
 * RoPE, the others gated DeltaNet with F32 conv taps and A < 0 (every decay below 1), and a CPU
 * step through them; the preset keeps Qwen3.5-9B's shape; an inner width other than v heads x
 * state size is refused. */
static void test_qwen35(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("qwen3.5-9b", &cfg));
    assert_int_equal(cfg.arch, MODEL_ARCH_QWEN35);
    assert_int_equal(cfg.n_layer, 32);
    assert_int_equal(cfg.head_dim, 256);
    assert_int_equal(cfg.ssm_inner, cfg.ssm_vheads * cfg.ssm_state);
    hybrid_scaled_down(&cfg);
    cfg.n_ff = 512;
    char path[256], err[256];
    write_model(&cfg, "tiny-qwen35.gguf", path, sizeof path);
    check_model(path, &cfg);
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->hp.n_rot, 16);
    assert_int_equal(m->hp.ssm_inner, 128);
    for (int il = 0; il < cfg.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        assert_int_equal(L->recipe.attn, il % 4 == 3 ? ARCH_ATTN_FULL : ARCH_ATTN_LINEAR);
        if (il % 4 == 3) continue;
        assert_int_equal(L->ssm_conv1d.type, GGML_TYPE_F32);
        for (int h = 0; h < cfg.ssm_vheads; h++) assert_true(((const float *)L->ssm_a.data)[h] < 0.0f);
    }
    model_free(m);
    unlink(path);
    cfg.ssm_inner = 96;
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "inner"));
}

/* qwen35moe (the qwen3.5-35b-a3b preset, scaled down): qwen35's layers with routed experts
 * (the router F32) and a shared expert behind its F32 gate row, and a CPU step through them;
 * the preset keeps Qwen3.5-35B-A3B's shape (40 layers over 2048, 256 experts of 512, 8 a token,
 * one shared of 512). */
static void test_qwen35moe(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("qwen3.5-35b-a3b", &cfg));
    assert_int_equal(cfg.arch, MODEL_ARCH_QWEN35MOE);
    assert_int_equal(cfg.n_layer, 40);
    assert_int_equal(cfg.n_embd, 2048);
    assert_int_equal(cfg.n_expert, 256);
    assert_int_equal(cfg.n_expert_used, 8);
    assert_int_equal(cfg.n_ff_exp * cfg.n_expert_shared, 512);
    assert_int_equal(cfg.ssm_inner, cfg.ssm_vheads * cfg.ssm_state);
    hybrid_scaled_down(&cfg);
    cfg.n_ff = 256, cfg.n_expert = 8, cfg.n_expert_used = 2, cfg.n_ff_exp = 256;
    char path[256], err[256];
    write_model(&cfg, "tiny-qwen35moe.gguf", path, sizeof path);
    check_model(path, &cfg);
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->hp.n_expert, 8);
    assert_int_equal(m->hp.n_ff_shexp, 256);
    for (int il = 0; il < cfg.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        assert_int_equal(L->recipe.attn, il % 4 == 3 ? ARCH_ATTN_FULL : ARCH_ATTN_LINEAR);
        assert_int_equal(L->recipe.ffn, ARCH_FFN_MOE);
        assert_int_equal(L->ffn_gate_inp.type, GGML_TYPE_F32);
        assert_int_equal(L->ffn_gate_inp_shexp.type, GGML_TYPE_F32);
        assert_non_null(L->ffn_down_shexp.data);
    }
    model_free(m);
    unlink(path);
}

/* gpt-oss (--arch gpt-oss, the gpt-oss-20b preset's family, small): biases on q/k/v/o, a sink
 * per head, the biased router in F32, expert biases [n_ff_exp][n_expert] in F32, under --type
 * mxfp4 the experts MXFP4 and every other matrix Q8_0, sliding (even) and full layers, YaRN
 * x32, Harmony's markup tokens; and a CPU step through it.  The preset keeps gpt-oss-20b's
 * shape. */
static void test_gptoss(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    mkmodel_set_arch(&cfg, MODEL_ARCH_GPTOSS);
    assert_int_equal(cfg.n_swa, 128); /* set_arch's defaults */
    assert_true(cfg.yarn_factor == 32.0f);
    assert_false(cfg.tied_output);
    cfg.n_embd = 256, cfg.n_ff = 256, cfg.n_layer = 2, cfg.n_head = 4, cfg.n_head_kv = 2, cfg.head_dim = 64;
    cfg.n_expert = 4, cfg.n_expert_used = 2, cfg.n_ff_exp = 256, cfg.ftype = MKMODEL_MXFP4;
    char path[256], err[256];
    write_model(&cfg, "tiny-gptoss.gguf", path, sizeof path);
    check_model(path, &cfg);
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_true(m->hp.yarn_factor == 32.0f);
    size_t tlen;
    const char *tmpl = gguf_get_str(m->gguf, "tokenizer.chat_template", &tlen);
    assert_non_null(tmpl);
    char *tmpl_z = strndup(tmpl, tlen);
    assert_int_equal(chat_syntax_detect(tmpl_z), CHAT_SYNTAX_HARMONY); /* served in Harmony's format */
    free(tmpl_z);
    assert_true(m->hp.rope_attn_factor > 1.0f); /* YaRN's mscale */
    assert_int_equal(m->hp.n_expert, 4);
    for (int il = 0; il < cfg.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        assert_int_equal(L->recipe.attn, il % 2 ? ARCH_ATTN_FULL : ARCH_ATTN_SLIDING);
        assert_int_equal(L->window, il % 2 ? 0 : 128);
        assert_int_equal(L->wq.type, GGML_TYPE_Q8_0);
        assert_int_equal(L->ffn_gate_exps.type, GGML_TYPE_MXFP4);
        assert_int_equal(L->ffn_down_exps.type, GGML_TYPE_MXFP4);
        assert_int_equal(L->ffn_gate_inp.type, GGML_TYPE_F32);
        assert_int_equal(L->ffn_up_exps_b.type, GGML_TYPE_F32);
        assert_int_equal(L->ffn_up_exps_b.ne1, 4);
        assert_int_equal(L->attn_sinks.ne0, 4);
        assert_non_null(L->bo.data);
    }
    model_free(m);
    unlink(path);
    /* the preset: gpt-oss-20b's shape */
    assert_true(mkmodel_preset("gpt-oss-20b", &cfg));
    assert_int_equal(cfg.arch, MODEL_ARCH_GPTOSS);
    assert_int_equal(cfg.n_layer, 24);
    assert_int_equal(cfg.n_embd, 2880);
    assert_int_equal(cfg.n_head, 64);
    assert_int_equal(cfg.n_head_kv, 8);
    assert_int_equal(cfg.head_dim, 64);
    assert_int_equal(cfg.n_expert, 32);
    assert_int_equal(cfg.n_expert_used, 4);
    assert_int_equal(cfg.n_ff_exp, 2880);
    assert_int_equal(cfg.n_swa, 128);
    assert_int_equal(cfg.n_vocab, 201088);
    assert_int_equal(cfg.yarn_orig_ctx, 4096);
    assert_int_equal(cfg.ftype, MKMODEL_MXFP4);
    assert_int_equal(mkmodel_tensor_type(&cfg, "ffn_gate_exps", 3), GGML_TYPE_MXFP4);
    assert_int_equal(mkmodel_tensor_type(&cfg, "attn_k", 3), GGML_TYPE_Q8_0);
    assert_int_equal(mkmodel_tensor_type(&cfg, "output", -1), GGML_TYPE_Q8_0);
    cfg.n_swa = 0;
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "sliding window"));
}

/* Every name of `a` with prefix pre (keys: kind 0; tensors: 1) is in b, or starts with one of
 * skip[0..n_skip); fails naming the first that is not. */
static void names_within(gguf_file *a, gguf_file *b, int kind, const char *pre, const char *const *skip, size_t n_skip,
                         const char *what)
{
    const int64_t n = kind ? gguf_n_tensors(a) : gguf_n_kv(a);
    for (int64_t i = 0; i < n; i++) {
        const char *name = kind ? gguf_tensor_at(a, i)->name : gguf_kv_key(a, i);
        if (strncmp(name, pre, strlen(pre)) != 0) continue;
        bool skipped = false;
        for (size_t j = 0; j < n_skip; j++) skipped |= strncmp(name, skip[j], strlen(skip[j])) == 0;
        if (!skipped && (kind ? gguf_find_tensor(b, name) == NULL : gguf_find_key(b, name) < 0))
            fail_msg("%s: %s is not in the other file", what, name);
    }
}

/* m's <arch>.* keys, global tensors and first two layers' tensors are those of
 * ../shared/reference/<file> (made by llama.cpp's converter), both ways, but for the
 * reference's keys starting with one of skip[0..n_skip) and the dense keys mkmodel writes for
 * every family (vocab_size, key_length, value_length: the converter writes them for some). */
static void reference_path(const char *file, char *path, size_t cap)
{
    const char *env = getenv("INFERD_SHARED_DIR");
    snprintf(path, cap, "%s/reference/%s", env && *env ? env : INFERD_SHARED_DIR, file);
}

/* m's <arch>.* keys are those of the reference r, both ways, as same_names_as_reference says. */
static void same_keys_as_reference(const model *m, gguf_file *r, const char *const *skip, size_t n_skip)
{
    char arch[64];
    snprintf(arch, sizeof arch, "%s.", m->desc->name);
    names_within(r, m->gguf, 0, arch, skip, n_skip, "reference key");
    /* keys mkmodel writes for every family, which llama.cpp's converter writes for some */
    char every[3][96];
    const char *const every_p[3] = {every[0], every[1], every[2]};
    snprintf(every[0], sizeof every[0], "%svocab_size", arch);
    snprintf(every[1], sizeof every[1], "%sattention.key_length", arch);
    snprintf(every[2], sizeof every[2], "%sattention.value_length", arch);
    names_within(m->gguf, r, 0, arch, every_p, 3, "mkmodel key");
}

static void same_names_as_reference(const model *m, const char *file, const char *const *skip, size_t n_skip)
{
    char ref[1200], err[256];
    reference_path(file, ref, sizeof ref);
    gguf_file *r = gguf_open(ref, err, sizeof err);
    if (!r) {
        print_message("  %s: names not compared: %s\n", file, err);
        return;
    }
    same_keys_as_reference(m, r, skip, n_skip);
    static const char *const blk[] = {"blk."};
    names_within(r, m->gguf, 1, "", blk, 1, "reference tensor");
    names_within(m->gguf, r, 1, "", blk, 1, "mkmodel tensor");
    for (int il = 0; il < 2; il++) {
        char pre[16];
        snprintf(pre, sizeof pre, "blk.%d.", il);
        names_within(r, m->gguf, 1, pre, NULL, 0, "reference tensor");
        names_within(m->gguf, r, 1, pre, NULL, 0, "mkmodel tensor");
    }
    gguf_close(r);
}

/* ---- gemma4 ------------------------------------------------------------------------------ */
static mkmodel_tensor_info *list_of(const mkmodel_config *cfg, int *n)
{
    char err[256] = "";
    *n = mkmodel_list(cfg, NULL, 0, err, sizeof err);
    if (*n <= 0) fail_msg("mkmodel_list: %s", err);
    mkmodel_tensor_info *t = calloc((size_t)*n, sizeof *t);
    assert_non_null(t);
    assert_int_equal(mkmodel_list(cfg, t, *n, err, sizeof err), *n);
    return t;
}

static const mkmodel_tensor_info *find_info(const mkmodel_tensor_info *t, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return &t[i];
    return NULL;
}

/* cfg's tensors are those of the reference r (llama.cpp's converter), every name and every
 * dimension, both ways, but for the reference's tensors whose names contain one of skip. */
static void same_tensors_as_reference(const mkmodel_config *cfg, const gguf_file *r, const char *const *skip,
                                      size_t n_skip)
{
    int n, matched = 0;
    mkmodel_tensor_info *t = list_of(cfg, &n);
    for (int64_t i = 0; i < gguf_n_tensors(r); i++) {
        const gguf_tensor *rt = gguf_tensor_at(r, i);
        bool skipped = false;
        for (size_t j = 0; j < n_skip; j++) skipped |= strstr(rt->name, skip[j]) != NULL;
        if (skipped) continue;
        const mkmodel_tensor_info *mt = find_info(t, n, rt->name);
        if (!mt) fail_msg("reference tensor %s is not in mkmodel's list", rt->name);
        if (mt->n_dims != (int)rt->n_dims) fail_msg("%s: %d dimensions, the reference %u", rt->name, mt->n_dims, rt->n_dims);
        for (uint32_t d = 0; d < rt->n_dims; d++)
            if (mt->ne[d] != rt->ne[d])
                fail_msg("%s: ne[%u] %lld, the reference %lld", rt->name, d, (long long)mt->ne[d], (long long)rt->ne[d]);
        matched++;
    }
    if (matched != n) fail_msg("mkmodel lists %d tensors, the reference %d of them", n, matched);
    free(t);
}

/* cfg at the reference model ref's sizes (its layers, widths, heads of both kinds, window,
 * experts, vocabulary and sliding : full period), keeping cfg's kind of file (dense or MoE, V
 * from K): the same code lists its tensors, at sizes the reference file has. */
static void at_reference_sizes(mkmodel_config *cfg, const model *ref)
{
    const model_hparams *hp = &ref->hp;
    int period = 0;
    while (period < hp->n_layer && ref->layers[period].recipe.attn == ARCH_ATTN_SLIDING) period++;
    cfg->n_embd = hp->n_embd, cfg->n_layer = hp->n_layer, cfg->n_head = hp->n_head, cfg->n_ff = hp->n_ff;
    cfg->n_vocab = hp->n_vocab, cfg->n_ctx = hp->n_ctx_train, cfg->n_swa = hp->n_swa;
    cfg->head_dim = hp->head_dim_swa, cfg->head_dim_full = hp->head_dim, cfg->swa_period = period + 1;
    cfg->n_head_kv = ref->layers[0].n_head_kv, cfg->n_head_kv_full = ref->layers[period].n_head_kv;
    cfg->n_rot = 2;
    if (cfg->n_expert > 0) cfg->n_expert = hp->n_expert, cfg->n_expert_used = hp->n_expert_used, cfg->n_ff_exp = hp->n_ff_exp;
}

/* Every layer of the real-shape list `big` has the tensors of the layer of its kind in `small`
 * (cfg at the reference's sizes, compared with it above): the same names per layer pattern. */
static void same_layer_names(const mkmodel_config *big_cfg, const mkmodel_config *small_cfg)
{
    int nb, ns;
    mkmodel_tensor_info *big = list_of(big_cfg, &nb), *small = list_of(small_cfg, &ns);
    int of_kind[2] = {-1, -1}; /* small's first sliding and first full layer */
    for (int il = small_cfg->n_layer - 1; il >= 0; il--) of_kind[mkmodel_gemma4_full(small_cfg, il)] = il;
    assert_true(of_kind[0] >= 0 && of_kind[1] >= 0);
    int per_layer[2] = {0, 0}, small_globals = 0;
    for (int i = 0; i < ns; i++) {
        int il;
        if (sscanf(small[i].name, "blk.%d.", &il) != 1)
            small_globals++;
        else if (il == of_kind[mkmodel_gemma4_full(small_cfg, il)])
            per_layer[mkmodel_gemma4_full(small_cfg, il)]++;
    }
    int globals = 0, layers[2] = {0, 0};
    for (int i = 0; i < nb; i++) {
        int il, off = 0;
        if (sscanf(big[i].name, "blk.%d.%n", &il, &off) != 1 || off == 0) {
            if (!find_info(small, ns, big[i].name)) fail_msg("global tensor %s is not the reference's", big[i].name);
            globals++;
            continue;
        }
        const bool full = mkmodel_gemma4_full(big_cfg, il);
        char name[80];
        snprintf(name, sizeof name, "blk.%d.%s", of_kind[full], big[i].name + off);
        if (!find_info(small, ns, name)) fail_msg("%s: no %s in the reference's pattern", big[i].name, name);
        layers[full]++;
    }
    int n_full = 0;
    for (int il = 0; il < big_cfg->n_layer; il++) n_full += mkmodel_gemma4_full(big_cfg, il);
    assert_int_equal(layers[0], (big_cfg->n_layer - n_full) * per_layer[0]);
    assert_int_equal(layers[1], n_full * per_layer[1]);
    assert_int_equal(globals, small_globals);
    free(big);
    free(small);
}

/* One expected tensor of a real-shape list. */
typedef struct want_tensor {
    const char *name;
    int64_t ne0, ne1, ne2;
    ggml_type type;
} want_tensor;

/* The list of cfg has each of want (dimensions and type) and none of absent; returns its bytes. */
static double check_list(const mkmodel_config *cfg, const want_tensor *want, size_t n_want, const char *const *absent,
                         size_t n_absent, int count)
{
    int n;
    mkmodel_tensor_info *t = list_of(cfg, &n);
    assert_int_equal(n, count);
    for (size_t i = 0; i < n_want; i++) {
        const mkmodel_tensor_info *mt = find_info(t, n, want[i].name);
        if (!mt) fail_msg("%s: no %s", cfg->name, want[i].name);
        if (mt->ne[0] != want[i].ne0 || mt->ne[1] != want[i].ne1 || mt->ne[2] != want[i].ne2 || mt->type != want[i].type)
            fail_msg("%s: [%lld, %lld, %lld] %s, want [%lld, %lld, %lld] %s", want[i].name, (long long)mt->ne[0],
                     (long long)mt->ne[1], (long long)mt->ne[2], ggml_type_name(mt->type), (long long)want[i].ne0,
                     (long long)want[i].ne1, (long long)want[i].ne2, ggml_type_name(want[i].type));
    }
    for (size_t i = 0; i < n_absent; i++)
        if (find_info(t, n, absent[i])) fail_msg("%s: %s should not be there", cfg->name, absent[i]);
    double bytes = 0;
    for (int i = 0; i < n; i++) bytes += (double)ggml_row_bytes(t[i].type, t[i].ne[0]) * (double)(t[i].ne[1] * t[i].ne[2]);
    free(t);
    return bytes;
}

/* The real-shape presets at the published configs' sizes (google/gemma-4-31B-it and
 * gemma-4-26B-A4B-it, text_config), Q4_K_M as llama.cpp's quantiser types them: 31B 60 layers
 * (50 sliding with 14 tensors, 10 full with 13: no attn_v) and the three globals. */
static void check_gemma4_presets(const mkmodel_config *real31, const mkmodel_config *real26)
{
    static const want_tensor w31[] = {
        {"token_embd.weight", 5376, 262144, 1, GGML_TYPE_Q6_K}, /* tied: the LM head's type */
        {"rope_freqs.weight", 256, 1, 1, GGML_TYPE_F32},
        {"blk.0.attn_q.weight", 5376, 32 * 256, 1, GGML_TYPE_Q4_K},
        {"blk.0.attn_k.weight", 5376, 16 * 256, 1, GGML_TYPE_Q4_K},
        {"blk.0.attn_v.weight", 5376, 16 * 256, 1, GGML_TYPE_Q6_K},
        {"blk.0.attn_q_norm.weight", 256, 1, 1, GGML_TYPE_F32},
        {"blk.0.ffn_down.weight", 21504, 5376, 1, GGML_TYPE_Q6_K},
        {"blk.5.attn_q.weight", 5376, 32 * 512, 1, GGML_TYPE_Q4_K},
        {"blk.5.attn_k.weight", 5376, 4 * 512, 1, GGML_TYPE_Q4_K},
        {"blk.5.attn_output.weight", 32 * 512, 5376, 1, GGML_TYPE_Q4_K},
        {"blk.5.attn_k_norm.weight", 512, 1, 1, GGML_TYPE_F32},
        /* llama.cpp counts attn_v tensors, not layers: layer 12's is the 11th of 50 (4 bits),
         * where layer 12 of 60 would take 6 */
        {"blk.12.attn_v.weight", 5376, 16 * 256, 1, GGML_TYPE_Q4_K},
        {"blk.59.ffn_gate.weight", 5376, 21504, 1, GGML_TYPE_Q4_K},
        {"blk.59.layer_output_scale.weight", 1, 1, 1, GGML_TYPE_F32},
    };
    static const char *const absent31[] = {"output.weight", "blk.5.attn_v.weight", "blk.59.attn_v.weight",
                                           "blk.0.ffn_gate_inp.weight", "per_layer_token_embd.weight"};
    const double gb31 = check_list(real31, w31, sizeof w31 / sizeof w31[0], absent31, 5, 3 + 50 * 14 + 10 * 13) / 1e9;
    /* the 26B-A4B: experts beside the MLP; 704- and 2112-wide rows fit no K-quant block, so
     * their matrices take llama-quantize's fallback: Q5_0 for Q4_K (layer 4), Q8_0 for the
     * Q6_K of Q4_K_M's more-bits layers (0, 5) */
    static const want_tensor w26[] = {
        {"blk.0.attn_k.weight", 2816, 8 * 256, 1, GGML_TYPE_Q4_K},
        {"blk.5.attn_k.weight", 2816, 2 * 512, 1, GGML_TYPE_Q4_K},
        {"blk.0.ffn_gate.weight", 2816, 2112, 1, GGML_TYPE_Q4_K},
        {"blk.0.ffn_down.weight", 2112, 2816, 1, GGML_TYPE_Q8_0},
        {"blk.0.ffn_gate_inp.weight", 2816, 128, 1, GGML_TYPE_F32},
        {"blk.0.ffn_gate_up_exps.weight", 2816, 2 * 704, 128, GGML_TYPE_Q4_K},
        {"blk.0.ffn_down_exps.weight", 704, 2816, 128, GGML_TYPE_Q8_0},
        {"blk.0.ffn_down_exps.scale", 128, 1, 1, GGML_TYPE_F32},
        {"blk.4.ffn_down.weight", 2112, 2816, 1, GGML_TYPE_Q5_0},
        {"blk.4.ffn_down_exps.weight", 704, 2816, 128, GGML_TYPE_Q5_0},
        {"blk.5.ffn_down_exps.weight", 704, 2816, 128, GGML_TYPE_Q8_0},
    };
    static const char *const absent26[] = {"output.weight", "blk.29.attn_v.weight"};
    const double gb26 = check_list(real26, w26, sizeof w26 / sizeof w26[0], absent26, 2, 3 + 25 * 22 + 5 * 21) / 1e9;
    print_message("gemma-4-31b Q4_K_M %.2f GB, gemma-4-26b-a4b %.2f GB of tensors\n", gb31, gb26);
    /* published Q4_K_M files: ~18-19 GB and ~16-17 GB (the 26B with llama-quantize's Q5_0 / Q8_0 fallbacks) */
    assert_true(gb31 > 17.0 && gb31 < 20.5);
    assert_true(gb26 > 14.0 && gb26 < 20.0);
}

/* gemma4 (the gemma-4-31b and gemma-4-26b-a4b presets' family).  A scaled-down 31B (6 layers:
 * 2 and 5 full, with their own head width and kv heads, no attn_v, RoPE on a quarter of the
 * head through rope_freqs) loads with the per-layer head dims, kv heads, windows and pattern
 * it was written with and takes a CPU step to finite logits past its window (check_model).
 * Both presets at the sizes of ../shared/reference/gemma4_moe.gguf (llama.cpp's converter)
 * list that file's tensors, names and dimensions (the dense one without the experts'), and
 * write its keys; the real-shape presets list the same names per layer pattern, at the
 * published sizes. */
static void test_gemma4(void **state)
{
    (void)state;
    mkmodel_config cfg, real31, real26;
    assert_true(mkmodel_preset("gemma-4-31b", &real31));
    assert_true(mkmodel_preset("gemma-4-26b-a4b", &real26));
    check_gemma4_presets(&real31, &real26);

    cfg = real31;
    cfg.n_embd = 256, cfg.n_layer = 6, cfg.n_head = 4, cfg.n_head_kv = 2, cfg.head_dim = 64, cfg.n_ff = 512;
    cfg.n_head_kv_full = 1, cfg.head_dim_full = 128, cfg.n_rot = 32, cfg.swa_period = 3, cfg.n_swa = 4;
    cfg.n_vocab = 1024, cfg.n_ctx = 4096;
    char path[256], err[256];
    write_model(&cfg, "small-gemma4.gguf", path, sizeof path);
    check_model(path, &cfg);
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->hp.head_dim, 128);
    assert_int_equal(m->hp.head_dim_swa, 64);
    assert_int_equal(m->hp.n_swa, 4);
    assert_true(m->hp.logit_softcap == 30.0f);
    assert_true(m->hp.rope_base_swa == 10000.0f && m->hp.rope_base == 1e6f);
    const float *freqs = m->rope_freqs.data;
    assert_non_null(freqs);
    assert_int_equal(m->rope_freqs.ne0, 64);
    for (int i = 0; i < 64; i++) assert_true(freqs[i] == (i < 16 ? 1.0f : 1e30f));
    for (int il = 0; il < cfg.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        const bool full = il % 3 == 2;
        assert_int_equal(mkmodel_gemma4_full(&cfg, il), full);
        assert_int_equal(L->recipe.attn, full ? ARCH_ATTN_FULL : ARCH_ATTN_SLIDING);
        assert_int_equal(L->recipe.ffn, ARCH_FFN_GLU);
        assert_int_equal(L->head_dim, full ? 128 : 64);
        assert_int_equal(L->n_head_kv, full ? 1 : 2);
        assert_int_equal(L->window, full ? 0 : 4);
        assert_int_equal(L->wv.data == NULL, full);
        assert_int_equal(L->wq.ne1, 4 * L->head_dim);
        assert_int_equal(L->wk.ne1, L->n_head_kv * L->head_dim);
        assert_int_equal(L->kv_source, il);
        assert_int_equal(L->rope_freqs == NULL, !full);
        assert_non_null(L->out_scale.data);
        assert_int_equal(L->wq.type, GGML_TYPE_Q4_K);
    }
    model_free(m);
    unlink(path);

    char ref_path[1200];
    reference_path("gemma4_moe.gguf", ref_path, sizeof ref_path);
    model *ref = model_load(ref_path, err, sizeof err);
    if (!ref) {
        print_message("  gemma4_moe.gguf: not compared: %s\n", err);
        return;
    }
    mkmodel_config moe = real26, dense = real31;
    at_reference_sizes(&moe, ref);
    at_reference_sizes(&dense, ref);
    moe.ftype = dense.ftype = MKMODEL_F32;
    same_tensors_as_reference(&moe, ref->gguf, NULL, 0);
    static const char *const experts[] = {"ffn_gate_inp", "_exps", "pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"};
    same_tensors_as_reference(&dense, ref->gguf, experts, sizeof experts / sizeof experts[0]);
    same_layer_names(&real31, &dense);
    same_layer_names(&real26, &moe);

    write_model(&moe, "small-gemma4-moe.gguf", path, sizeof path);
    check_model(path, &moe);
    m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    for (int il = 0; il < moe.n_layer; il++) {
        assert_int_equal(m->layers[il].recipe.ffn, ARCH_FFN_GLU_MOE);
        assert_int_equal(m->layers[il].ffn_gate_up_exps.ne2, moe.n_expert);
        assert_int_equal(m->layers[il].n_head_kv, ref->layers[il].n_head_kv);
        assert_int_equal(m->layers[il].head_dim, ref->layers[il].head_dim);
        assert_int_equal(m->layers[il].recipe.attn, ref->layers[il].recipe.attn);
    }
    same_keys_as_reference(m, ref->gguf, NULL, 0);
    model_free(m);
    unlink(path);
    write_model(&dense, "small-gemma4-dense.gguf", path, sizeof path);
    m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    static const char *const expert_keys[] = {"gemma4.expert_"};
    same_keys_as_reference(m, ref->gguf, expert_keys, 1);
    model_free(m);
    unlink(path);
    model_free(ref);

    cfg.swa_period = 1; /* no sliding layer: llama.cpp asserts one */
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "gemma4"));
}

/* glm4moe and phi3 (--arch glm4moe, --arch phi3) from the tiny preset: they load with their
 * recipes (glm4moe: a dense first layer, then the sigmoid router with its bias and an ungated
 * shared expert, partial RoPE; phi3: q/k/v and gate/up as views of fused matrices, partial
 * LongRoPE with factors >= 1), take a CPU step (check_model), and have the names of the
 * ../shared/reference file of their family (phi3's sliding_window key aside: inferd's phi3
 * attends to everything, as the reference's logits were made). */
static void test_glm4moe_phi3(void **state)
{
    (void)state;
    static const model_arch archs[] = {MODEL_ARCH_GLM4MOE, MODEL_ARCH_PHI3};
    static const char *const refs[] = {"glm4moe.gguf", "phi3.gguf"};
    static const char *const phi3_skip[] = {"phi3.attention.sliding_window"};
    for (int a = 0; a < 2; a++) {
        mkmodel_config cfg;
        assert_true(mkmodel_preset("tiny", &cfg));
        mkmodel_set_arch(&cfg, archs[a]);
        cfg.n_layer = 3;
        char file[64], path[256], err[256];
        snprintf(file, sizeof file, "tiny-%s.gguf", model_arch_name(archs[a]));
        write_model(&cfg, file, path, sizeof path);
        check_model(path, &cfg);
        model *m = model_load(path, err, sizeof err);
        if (!m) fail_msg("%s", err);
        const model_layer *L = &m->layers[1];
        assert_true(L->recipe.attn_extras & ARCH_ATTN_ROPE_PARTIAL);
        if (archs[a] == MODEL_ARCH_GLM4MOE) {
            assert_int_equal(m->hp.n_rot, 8);
            assert_int_equal(m->layers[0].recipe.ffn, ARCH_FFN_GLU);
            assert_int_equal(L->recipe.ffn, ARCH_FFN_MOE);
            assert_int_equal(L->recipe.router, ARCH_ROUTER_SIGMOID_BIAS);
            assert_true(L->recipe.ffn_extras & ARCH_FFN_SHARED_EXPERT);
            assert_false(L->recipe.ffn_extras & ARCH_FFN_SHEXP_GATE);
            assert_non_null(L->exp_probs_b.data);
        } else {
            assert_int_equal(m->hp.n_rot, 12);
            assert_true(L->recipe.attn_extras & ARCH_ATTN_ROPE_LONGROPE);
            assert_int_equal(m->hp.n_ctx_orig, cfg.n_ctx / 4);
            assert_true(m->hp.rope_attn_factor > 1.0f);
            assert_int_equal(L->wk.ne1, cfg.n_head_kv * 16);
            assert_ptr_equal(L->w_up.data, (const char *)L->w_gate_up.data + (size_t)cfg.n_ff * L->w_gate_up.row_bytes);
            const float *f = m->rope_factors_long.data;
            for (int i = 0; i < m->hp.n_rot / 2; i++) assert_true(f[i] >= 1.0f);
        }
        same_names_as_reference(m, refs[a], phi3_skip, archs[a] == MODEL_ARCH_PHI3 ? 1 : 0);
        model_free(m);
        unlink(path);
    }
}

/* nomic-bert (--arch nomic-bert, the nomic-embed-text-v1.5 preset's family) from the tiny
 * preset: an encoder with its recipe (post-LN, bidirectional, fused qkv as row views, SwiGLU,
 * NeoX RoPE at base 1000 is the preset's; tiny keeps its own base), mean pooling from the
 * file, no output norm or head, and a CPU embedding step (check_model); the preset itself
 * writes 768 x 12 with BERT's vocabulary size. */
static void test_nomic_bert(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    mkmodel_set_arch(&cfg, MODEL_ARCH_NOMIC_BERT);
    assert_int_equal(cfg.n_head_kv, cfg.n_head);
    char path[256], err[256];
    write_model(&cfg, "tiny-nomic-bert.gguf", path, sizeof path);
    check_model(path, &cfg);
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_true(m->hp.encoder);
    assert_int_equal(m->hp.pooling, ENGINE_POOL_MEAN);
    assert_true(m->hp.rope_neox);
    assert_null(m->output_norm.data);
    assert_non_null(m->tok_types.data);
    const model_layer *L = &m->layers[1];
    assert_int_equal(L->recipe.norm, ARCH_NORM_POST_LN);
    assert_true(L->recipe.attn_extras & ARCH_ATTN_BIDIR);
    assert_true(L->recipe.attn_extras & ARCH_ATTN_FUSED_QKV);
    assert_int_equal(L->recipe.ffn, ARCH_FFN_GLU);
    assert_ptr_equal(L->wk.data, (const char *)L->wqkv.data + (size_t)cfg.n_embd * L->wqkv.row_bytes);
    model_free(m);
    unlink(path);
    assert_true(mkmodel_preset("nomic-embed-text-v1.5", &cfg));
    assert_int_equal(cfg.arch, MODEL_ARCH_NOMIC_BERT);
    assert_int_equal(cfg.n_embd, 768);
    assert_int_equal(cfg.n_layer, 12);
    assert_int_equal(cfg.n_vocab, 30522);
    /* a grouped K/V or a head width other than n_embd / n_head is no nomic-bert */
    cfg.n_head_kv = 4;
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "nomic-bert"));
}

/* deepseek2 (--arch deepseek2): the tiny preset as a V3-style model (q LoRA, sigmoid router with
 * its selection bias and expert groups, a dense first layer, a shared expert) loads with its
 * latent-attention shapes, takes a CPU step (check_model) and generates 24 greedy tokens on the
 * CPU engine; its names are those of ../shared/reference/deepseek_v3.gguf but for that
 * file's YaRN keys; the deepseek-v2-lite preset keeps DeepSeek-V2-Lite's shape; a RoPE
 * part of odd width is refused. */
static void test_deepseek2(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    mkmodel_set_arch(&cfg, MODEL_ARCH_DEEPSEEK2);
    assert_int_equal(cfg.kv_lora_rank, 64); /* set_arch's defaults: 4 heads of 16 */
    assert_int_equal(cfg.n_rot, 8);
    assert_int_equal(cfg.n_head_kv, 1);
    cfg.n_layer = 3, cfg.q_lora_rank = 32, cfg.n_expert_groups = 4, cfg.n_group_used = 2;
    cfg.expert_weights_scale = 2.5f;
    char path[256], err[256];
    write_model(&cfg, "tiny-deepseek2.gguf", path, sizeof path);
    check_model(path, &cfg);
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->hp.kv_lora_rank, 64);
    assert_int_equal(m->hp.q_lora_rank, 32);
    assert_int_equal(m->hp.mla_nope, 16);
    assert_int_equal(m->hp.mla_v, 16);
    assert_int_equal(m->hp.head_dim, 64 + 8); /* a cache row: the latent and the RoPE key */
    assert_int_equal(m->layers[0].recipe.ffn, ARCH_FFN_GLU);
    for (int il = 1; il < cfg.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        assert_int_equal(L->recipe.attn, ARCH_ATTN_MLA);
        assert_int_equal(L->recipe.ffn, ARCH_FFN_MOE);
        assert_int_equal(L->recipe.router, ARCH_ROUTER_SIGMOID_BIAS);
        assert_true(L->recipe.ffn_extras & ARCH_FFN_EXPERT_GROUPS);
        assert_true(L->recipe.ffn_extras & ARCH_FFN_SHARED_EXPERT);
        assert_int_equal(L->wk_b.ne2, cfg.n_head);
    }
    /* generates on the CPU engine: 24 greedy tokens after a prompt, every one a valid id */
    engine_config ec = {.n_slots = 1, .ctx_per_slot = 64, .max_batch_tokens = 64, .n_threads = 1};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &ec, err, sizeof err);
    if (!e) fail_msg("%s", err);
    sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = 0.0f;
    int32_t toks[32] = {1, 300, 301, 302};
    int n = 4;
    for (int pos = 0; n < 28; n++) {
        engine_seq s = {.slot = 0, .tokens = toks + pos, .n_tokens = n - pos, .pos = pos, .want_token = true, .sp = &sp};
        engine_result res;
        if (engine_step(e, &s, 1, &res, err, sizeof err) != 0) fail_msg("step at %d: %s", n, err);
        assert_true(res.token >= 0 && res.token < cfg.n_vocab);
        pos = n;
        toks[n] = res.token;
    }
    engine_free(e);

    static const char *const yarn[] = {"deepseek2.rope.scaling."};
    same_names_as_reference(m, "deepseek_v3.gguf", yarn, 1);
    model_free(m);
    unlink(path);

    assert_true(mkmodel_preset("deepseek-v2-lite", &cfg)); /* DeepSeek-V2-Lite's shape */
    assert_int_equal(cfg.arch, MODEL_ARCH_DEEPSEEK2);
    assert_int_equal(cfg.n_layer, 27);
    assert_int_equal(cfg.n_embd, 2048);
    assert_int_equal(cfg.n_head, 16);
    assert_int_equal(cfg.kv_lora_rank, 512);
    assert_int_equal(cfg.q_lora_rank, 0);
    assert_int_equal(cfg.n_rot, 64);
    assert_int_equal(cfg.mla_nope, 128);
    assert_int_equal(cfg.mla_v, 128);
    assert_int_equal(cfg.n_expert, 64);
    assert_int_equal(cfg.n_ff_exp, 1408);
    assert_int_equal(cfg.n_expert_used, 6);
    assert_int_equal(cfg.n_expert_shared, 2);
    assert_int_equal(cfg.n_dense_lead, 1);
    assert_int_equal(cfg.n_ff, 10944);
    cfg.n_rot = 63;
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "deepseek2"));
}

static void test_q4_k_m_rule(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("llama-3.1-8b", &cfg));
    assert_int_equal(cfg.ftype, MKMODEL_Q4_K_M);
    assert_int_equal(mkmodel_file_type(cfg.ftype), 15);
    assert_int_equal(mkmodel_file_type(MKMODEL_BF16), 32); /* LLAMA_FTYPE_MOSTLY_BF16 */
    /* 32 layers: first 4, last 4, and every third in between starting at 6 */
    for (int il = 0; il < 32; il++) {
        bool more = il < 4 || il >= 28 || (il - 4) % 3 == 2;
        ggml_type want = more ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
        assert_int_equal(mkmodel_tensor_type(&cfg, "attn_v", il), want);
        assert_int_equal(mkmodel_tensor_type(&cfg, "ffn_down", il), want);
        assert_int_equal(mkmodel_tensor_type(&cfg, "attn_q", il), GGML_TYPE_Q4_K);
        assert_int_equal(mkmodel_tensor_type(&cfg, "attn_k", il), GGML_TYPE_Q4_K);
        assert_int_equal(mkmodel_tensor_type(&cfg, "attn_output", il), GGML_TYPE_Q4_K);
        assert_int_equal(mkmodel_tensor_type(&cfg, "ffn_gate", il), GGML_TYPE_Q4_K);
        assert_int_equal(mkmodel_tensor_type(&cfg, "ffn_up", il), GGML_TYPE_Q4_K);
    }
    assert_int_equal(mkmodel_tensor_type(&cfg, "attn_v", 6), GGML_TYPE_Q6_K);
    assert_int_equal(mkmodel_tensor_type(&cfg, "attn_v", 7), GGML_TYPE_Q4_K);
    assert_int_equal(mkmodel_tensor_type(&cfg, "output", -1), GGML_TYPE_Q6_K);
    assert_int_equal(mkmodel_tensor_type(&cfg, "token_embd", -1), GGML_TYPE_Q4_K); /* untied */
    assert_true(mkmodel_preset("qwen2.5-1.5b", &cfg));
    assert_true(cfg.tied_output);
    assert_int_equal(mkmodel_tensor_type(&cfg, "token_embd", -1), GGML_TYPE_Q6_K); /* is the head */
    cfg.ftype = MKMODEL_Q5_K; /* single types are pure */
    assert_int_equal(mkmodel_tensor_type(&cfg, "token_embd", -1), GGML_TYPE_Q5_K);
    assert_int_equal(mkmodel_tensor_type(&cfg, "attn_v", 0), GGML_TYPE_Q5_K);
}

/* The Q4_K_M mix lands in the file, and a reused-rows file loads and runs like a fresh one. */
static void test_q4_k_m_file_and_reused_rows(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    cfg.n_embd = 256;
    cfg.n_ff = 512;
    cfg.n_layer = 8;
    cfg.ftype = MKMODEL_Q4_K_M;
    cfg.reuse_rows = 1;
    char path[256];
    write_model(&cfg, "q4km.gguf", path, sizeof path);
    check_model(path, &cfg);
    char err[256];
    model *m = model_load(path, err, sizeof err);
    assert_non_null(m);
    assert_int_equal(m->output.type, GGML_TYPE_Q6_K);
    assert_int_equal(m->tok_embd.type, GGML_TYPE_Q4_K);
    for (int il = 0; il < 8; il++) {
        /* use_more_bits over 8 layers: 0 (first eighth), 7 (last eighth), 3 and 6 */
        ggml_type want = (il == 0 || il == 3 || il == 6 || il == 7) ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
        assert_int_equal(m->layers[il].wv.type, want);
        assert_int_equal(m->layers[il].w_down.type, want);
        assert_int_equal(m->layers[il].wk.type, GGML_TYPE_Q4_K);
    }
    model_free(m);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

static void test_deterministic(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    char a[256], b[256], c[256];
    write_model(&cfg, "a.gguf", a, sizeof a);
    write_model(&cfg, "b.gguf", b, sizeof b);
    cfg.seed = 2;
    write_model(&cfg, "c.gguf", c, sizeof c);
    size_t la, lb, lc;
    char *pa = slurp(a, &la), *pb = slurp(b, &lb), *pc = slurp(c, &lc);
    assert_int_equal(la, lb);
    assert_memory_equal(pa, pb, la);
    assert_int_equal(la, lc); /* same shapes */
    assert_true(memcmp(pa, pc, la) != 0);
    free(pa);
    free(pb);
    free(pc);
}

static void test_invalid_config(void **state)
{
    (void)state;
    mkmodel_config cfg;
    char err[256] = "", path[256];
    snprintf(path, sizeof path, "%s/bad.gguf", tmpdir);
    assert_true(mkmodel_preset("tiny", &cfg));
    cfg.n_vocab = 100;
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "n-vocab"));
    assert_true(mkmodel_preset("tiny", &cfg));
    cfg.n_head_kv = 3;
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "n-head-kv"));
    assert_true(mkmodel_preset("tiny", &cfg));
    cfg.n_embd = 1 << 30;
    assert_int_equal(mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "n-embd"));
    assert_int_equal(access(path, F_OK), -1);
    assert_false(mkmodel_preset("gpt-5", &cfg));
    assert_int_equal(mkmodel_ftype_from_name("q4_k_m"), MKMODEL_Q4_K_M);
    assert_int_equal(mkmodel_ftype_from_name("Q8_0"), MKMODEL_Q8_0);
    assert_int_equal(mkmodel_ftype_from_name("q3_k"), MKMODEL_Q3_K);
    assert_int_equal(mkmodel_ftype_from_name("iq2_xxs"), MKMODEL_IQ2_XXS);
    assert_int_equal(mkmodel_ftype_from_name("ud_q2_k_xl"), MKMODEL_UD_Q2_K_XL);
    assert_int_equal(mkmodel_ftype_from_name("tq1_0"), -1);
}

/* llama.cpp's Q3_K_M on the 8B shape (llama_tensor_get_type, LLAMA_FTYPE_MOSTLY_Q3_K_M = 12):
 * attn_v Q5_K in layers 0-1 then Q4_K, ffn_down Q5_K in the first 32/16 = 2 layers then Q4_K,
 * attn_output Q4_K, the rest Q3_K; output Q6_K, an untied token_embd Q3_K; the 8-expert bumps. */
static void test_q3_k_m_rule(void **state)
{
    (void)state;
    mkmodel_config cfg;
    assert_true(mkmodel_preset("llama-3.1-8b", &cfg));
    cfg.ftype = MKMODEL_Q3_K_M;
    assert_int_equal(mkmodel_ftype_from_name("q3_k_m"), MKMODEL_Q3_K_M);
    assert_string_equal(mkmodel_ftype_name(MKMODEL_Q3_K_M), "q3_k_m");
    assert_int_equal(mkmodel_file_type(cfg.ftype), 12);
    for (int il = 0; il < 32; il++) {
        ggml_type lead = il < 2 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
        assert_int_equal(mkmodel_tensor_type(&cfg, "attn_v", il), lead);
        assert_int_equal(mkmodel_tensor_type(&cfg, "ffn_down", il), lead);
        assert_int_equal(mkmodel_tensor_type(&cfg, "attn_output", il), GGML_TYPE_Q4_K);
        const char *bulk[] = {"attn_q", "attn_k", "ffn_gate", "ffn_up"};
        for (int r = 0; r < 4; r++) assert_int_equal(mkmodel_tensor_type(&cfg, bulk[r], il), GGML_TYPE_Q3_K);
    }
    assert_int_equal(mkmodel_tensor_type(&cfg, "output", -1), GGML_TYPE_Q6_K);
    assert_int_equal(mkmodel_tensor_type(&cfg, "token_embd", -1), GGML_TYPE_Q3_K);
    assert_int_equal(mkmodel_tensor_type(&cfg, "ffn_gate_inp", 3), GGML_TYPE_F32);
    cfg.n_expert = 8; /* Mixtral-like: K/V Q8_0, attn_output Q5_K */
    assert_int_equal(mkmodel_tensor_type(&cfg, "attn_v", 5), GGML_TYPE_Q8_0);
    assert_int_equal(mkmodel_tensor_type(&cfg, "attn_k", 5), GGML_TYPE_Q8_0);
    assert_int_equal(mkmodel_tensor_type(&cfg, "attn_output", 5), GGML_TYPE_Q5_K);
    assert_true(mkmodel_preset("qwen2.5-1.5b", &cfg)); /* tied: the embedding is the head */
    cfg.ftype = MKMODEL_Q3_K_M;
    assert_int_equal(mkmodel_tensor_type(&cfg, "token_embd", -1), GGML_TYPE_Q6_K);
}

/* ---- every preset's metadata against the names llama.cpp knows ---------------------------
 * From llama.cpp's src/llama-vocab.cpp (../shared/peers/llama.cpp-c392e50): the values of
 * tokenizer.ggml.model and tokenizer.ggml.pre it accepts ("unknown pre-tokenizer type"
 * otherwise), and for pre-tokenizers the BOS default it applies when the file has no
 * tokenizer.ggml.add_bos_token. */
static const char *const llamacpp_models[] = {"no_vocab", "none", "llama", "bert", "gpt2", "t5",
                                              "rwkv"};
static const struct {
    const char *name;
    bool add_bos;
} llamacpp_pres[] = {
    {"default", false},      {"llama3", true},       {"llama-v3", true},     {"llama-bpe", true},
    {"falcon3", true},       {"deepseek-llm", false}, {"deepseek-coder", false},
    {"deepseek-v3", false},  {"falcon", false},      {"mpt", false},         {"starcoder", false},
    {"gpt-2", false},        {"phi-2", false},       {"jina-es", false},     {"jina-de", false},
    {"gigachat", false},     {"jina-v1-en", false},  {"jina-v2-es", false},  {"jina-v2-de", false},
    {"jina-v2-code", false}, {"roberta-bpe", false}, {"refact", false},      {"command-r", false},
    {"qwen2", false},        {"deepseek-r1-qwen", false}, {"stablelm2", false},
    {"olmo", false},         {"dbrx", false},        {"smaug-bpe", false},   {"poro-chat", false},
    {"chatglm-bpe", false},  {"viking", false},      {"jais", false},        {"tekken", true},
    {"smollm", false},       {"codeshell", false},   {"bloom", false},       {"gpt3-finnish", false},
    {"gpt-4o", false},
    {"exaone", false},       {"chameleon", true},    {"minerva-7b", false},  {"megrez", false},
};
/* general.architecture values of the presets' families (llama-arch.cpp); qwen3 is newer than
 * c392e50, which therefore cannot load the qwen3 preset whatever its tokenizer says (nor
 * qwen35, newer still). */
/* The architecture names of llama.cpp's src/llama-arch.cpp (../shared/peers, 82bb485). */
static const char *const llamacpp_archs[] = {"llama",  "qwen2",   "qwen3",     "gemma3",     "qwen3moe", "qwen35",
                                             "qwen35moe", "gpt-oss", "deepseek2", "nomic-bert", "phi3", "glm4moe",
                                             "gemma4"};

static bool in_list(const char *s, size_t n, const char *const *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (strlen(list[i]) == n && memcmp(list[i], s, n) == 0) return true;
    return false;
}

static void test_preset_metadata_llamacpp_names(void **state)
{
    (void)state;
    /* The tokenizer is what is checked, so a short corpus (few merges) does. */
    static const char text[] = "the model and the tokenizer and the server and the test";
    int n_presets = 0;
    for (const char *name; (name = mkmodel_preset_name(n_presets)); n_presets++) {
        mkmodel_config cfg;
        assert_true(mkmodel_preset(name, &cfg));
        gguf_writer *w = gguf_writer_new();
        char err[256] = "";
        if (mkmodel_write_metadata(w, &cfg, text, sizeof text - 1, err, sizeof err) != 0)
            fail_msg("%s: %s", name, err);
        void *mem;
        size_t size;
        assert_int_equal(gguf_writer_write_mem(w, &mem, &size), 0);
        gguf_file *f = gguf_open_memory(mem, size, err, sizeof err);
        assert_non_null(f);

        size_t len;
        const char *arch = gguf_get_str(f, "general.architecture", &len);
        assert_non_null(arch);
        assert_true(in_list(arch, len, llamacpp_archs, sizeof llamacpp_archs / sizeof llamacpp_archs[0]));
        const char *model = gguf_get_str(f, "tokenizer.ggml.model", &len);
        assert_non_null(model);
        assert_true(in_list(model, len, llamacpp_models, sizeof llamacpp_models / sizeof llamacpp_models[0]));
        const char *pre = gguf_get_str(f, "tokenizer.ggml.pre", &len);
        assert_non_null(pre);
        size_t k = 0, n_pres = sizeof llamacpp_pres / sizeof llamacpp_pres[0];
        while (k < n_pres && !(strlen(llamacpp_pres[k].name) == len && memcmp(llamacpp_pres[k].name, pre, len) == 0))
            k++;
        if (k == n_pres) fail_msg("preset %s: tokenizer.ggml.pre '%.*s' is unknown to llama.cpp", name, (int)len, pre);
        /* BOS is stated, and agrees with what llama.cpp would assume without the key. */
        bool add_bos;
        assert_true(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos));
        assert_int_equal(add_bos, llamacpp_pres[k].add_bos);

        /* The vocabulary is as long as the architecture says, ids point into it, merges exist. */
        char key[96];
        snprintf(key, sizeof key, "%.*s.vocab_size", (int)strlen(model_arch_name(cfg.arch)), model_arch_name(cfg.arch));
        uint32_t n_vocab;
        assert_true(gguf_get_u32(f, key, &n_vocab));
        int64_t ti = gguf_find_key(f, "tokenizer.ggml.tokens");
        assert_true(ti >= 0);
        assert_int_equal(gguf_arr_len(f, ti), n_vocab);
        assert_int_equal(gguf_arr_len(f, gguf_find_key(f, "tokenizer.ggml.token_type")), n_vocab);
        assert_true(gguf_find_key(f, "tokenizer.ggml.merges") >= 0);
        static const char *const ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                          "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id"};
        for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
            uint32_t id;
            assert_true(gguf_get_u32(f, ids[i], &id));
            assert_true(id < n_vocab);
        }

        /* inferd reads the names it writes, with the defaults it documents. */
        tokenizer *t = tokenizer_load(f, err, sizeof err);
        if (!t) fail_msg("preset %s: %s", name, err);
        assert_int_equal(tokenizer_add_bos(t), add_bos);
        assert_int_equal(tokenizer_normalizes_nfc(t), strncmp(pre, "qwen2", len) == 0 && len == 5);
        print_message("preset %-13s %-6s tokenizer %.*s, pre %-10.*s add_bos %d, %u tokens\n", name,
                      model_arch_name(cfg.arch), (int)strlen(model), model, (int)len, pre, add_bos, n_vocab);
        tokenizer_free(t);
        gguf_close(f);
        free(mem);
        gguf_writer_free(w);
    }
    assert_true(n_presets >= 5);
}

static void test_bpe_train(void **state)
{
    (void)state;
    /* words: "ab", " ab" x2, " abc" x2, " xy": (a,b) occurs 5 times, then (Ġ,ab) 4 times,
     * then (Ġab,c) twice; nothing else repeats */
    const char *text = "ab ab ab abc abc xy";
    bpe_vocab v;
    assert_int_equal(bpe_train(text, strlen(text), 1000, 1000, &v), 0);
    assert_int_equal(v.n_merges, 3);
    assert_string_equal(v.merges[0], "a b");
    assert_string_equal(v.tokens[256], "ab");
    assert_string_equal(v.merges[1], "\xc4\xa0 ab"); /* GPT-2 writes the space as U+0120 */
    assert_string_equal(v.tokens[257], "\xc4\xa0" "ab");
    assert_string_equal(v.merges[2], "\xc4\xa0" "ab c");
    assert_int_equal(v.n_tokens, 256 + 3);
    char buf[4];
    assert_int_equal(bpe_byte_text(' ', buf), 2);
    assert_memory_equal(buf, "\xc4\xa0", 2);
    assert_int_equal(bpe_byte_text('A', buf), 1);
    assert_string_equal(v.tokens['A'], "A");
    bpe_vocab_free(&v);
    /* the token cap stops training */
    assert_int_equal(bpe_train(text, strlen(text), 257, 1000, &v), 0);
    assert_int_equal(v.n_tokens, 257);
    assert_int_equal(v.n_merges, 1);
    bpe_vocab_free(&v);
    assert_int_equal(bpe_train("", 0, 1000, 1000, &v), 0);
    assert_int_equal(v.n_tokens, 256);
    assert_int_equal(v.n_merges, 0);
    bpe_vocab_free(&v);
}

static void test_words(void **state)
{
    (void)state;
    /* standalone lowercase runs of 2..16 letters, most frequent first, ties alphabetical;
     * not: "a" (short), "Model" (capital), api_key and utf8 (identifiers), the 17-letter run */
    const char *text = "the model, the server; a Model api_key utf8 server the abcdefghijklmnopq zebra";
    words_list wl;
    assert_int_equal(words_collect(text, strlen(text), 10, &wl), 0);
    assert_int_equal(wl.n, 4);
    assert_string_equal(wl.word[0], "the");
    assert_int_equal(wl.freq[0], 3);
    assert_string_equal(wl.word[1], "server");
    assert_string_equal(wl.word[2], "model");
    assert_string_equal(wl.word[3], "zebra");
    assert_true(words_has(&wl, "model", 5));
    assert_true(words_has(&wl, "models", 5)); /* n bytes only */
    assert_false(words_has(&wl, "mode", 4));
    assert_false(words_has(&wl, "api", 3));
    size_t len;
    char *corpus_text = words_corpus(&wl, &len);
    assert_non_null(corpus_text);
    assert_string_equal(corpus_text, " the the the server server model model zebra zebra");
    free(corpus_text);
    words_free(&wl);
    assert_int_equal(words_collect(text, strlen(text), 2, &wl), 0);
    assert_int_equal(wl.n, 2);
    words_free(&wl);

    /* a --words model: each word is one token, the text round-trips, and greedy decoding
     * from any prompt emits whole words (the LM head favours them) */
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    cfg.words = true;
    char path[128], err[256] = "";
    snprintf(path, sizeof path, "%s/words.gguf", tmpdir);
    const char *src = "the server streams the words of the model to the client, word by word; the client reads";
    assert_int_equal(mkmodel_write(&cfg, src, strlen(src), path, err, sizeof err), 0);
    model *m = model_load(path, err, sizeof err);
    assert_non_null(m);
    tokenizer *t = tokenizer_load(m->gguf, err, sizeof err);
    assert_non_null(t);
    int32_t ids[64];
    const char *s = " the client reads the words";
    assert_int_equal(tokenizer_encode(t, s, strlen(s), false, false, ids, 64), 5);
    engine_config ec = {.n_slots = 1, .ctx_per_slot = 64, .max_batch_tokens = 64, .n_threads = 1};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &ec, err, sizeof err);
    assert_non_null(e);
    sampling_params sp;
    sampling_params_default(&sp); /* greedy */
    assert_int_equal(words_collect(src, strlen(src), 100, &wl), 0);
    int n = tokenizer_encode(t, "Once upon a time", 16, tokenizer_add_bos(t), false, ids, 64);
    for (int step = 0, pos = 0; step < 16; step++) {
        engine_seq seq = {.slot = 0, .tokens = ids, .n_tokens = n, .pos = pos, .want_token = true, .sp = &sp};
        engine_result res;
        if (engine_step(e, &seq, 1, &res, err, sizeof err) != 0) fail_msg("engine_step: %s", err);
        char piece[64];
        size_t k = tokenizer_decode(t, &res.token, 1, piece, sizeof piece - 1);
        piece[k] = '\0';
        assert_true(k >= 3 && piece[0] == ' ');
        assert_true(words_has(&wl, piece + 1, k - 1));
        pos += n;
        ids[0] = res.token;
        n = 1;
    }
    words_free(&wl);
    engine_free(e);
    tokenizer_free(t);
    model_free(m);
}

/* ---- every single type against F32 ---------------------------------------------------------
 * The same weights (mkmodel draws each row from the seed before encoding it) written as F32 and
 * as each block type, rows wide enough (256) for the K blocks; both run on the CPU engine, fed
 * the same tokens one at a time, and their greedy choices (argmax of the logits) compared at
 * every position.  A format bug (a wrong nibble, scale or sign) gives unrelated logits and
 * near-chance agreement; honest quantisation error flips only near-ties. */
enum { AGREE_POS = 24 };

/* The logits at every position (AGREE_POS * n_vocab floats). */
static void run_positions(const char *path, const mkmodel_config *cfg, const int32_t *tokens, float *all)
{
    char err[256];
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("model_load %s: %s", path, err);
    engine_config ec = {.n_slots = 1, .ctx_per_slot = 64, .max_batch_tokens = 64, .n_threads = 1};
    engine *e = engine_open(ENGINE_DEVICE_CPU, m, &ec, err, sizeof err);
    if (!e) fail_msg("engine_create_cpu %s: %s", path, err);
    sampling_params sp;
    sampling_params_default(&sp);
    for (int p = 0; p < AGREE_POS; p++) {
        engine_seq seq = {.slot = 0, .tokens = &tokens[p], .n_tokens = 1, .pos = p, .want_token = true,
                          .sp = &sp, .logits = all + (size_t)p * (size_t)cfg->n_vocab};
        engine_result res;
        if (engine_step(e, &seq, 1, &res, err, sizeof err) != 0) fail_msg("engine_step: %s", err);
    }
    engine_free(e);
    model_free(m);
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Pearson correlation of two logit vectors. */
static double correlation(const float *a, const float *b, int n)
{
    double ma = 0, mb = 0, ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ma += a[i], mb += b[i];
    ma /= n;
    mb /= n;
    for (int i = 0; i < n; i++) {
        ab += (a[i] - ma) * (b[i] - mb);
        aa += (a[i] - ma) * (a[i] - ma);
        bb += (b[i] - mb) * (b[i] - mb);
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
}

static void test_types_agree_with_f32(void **state)
{
    (void)state;
    static const struct {
        mkmodel_ftype ft;
        int min_agree;   /* of AGREE_POS */
        double min_corr; /* of the logits at every position */
    } cases[] = {
        /* measured (x86-64 gcc): q8_0 24 .9995, q4_0 11 .887, q4_k 17 .950, q6_k 21 .996, q4_1 14
         * .926, q5_0 17 .975, q5_1 19 .980, iq4_nl 13 .929, iq4_xs 12 .926, q3_k 8 .731, q2_k 1
         * .476: tiny's random logits are full of near-ties, so top-1 falls fast with the bits
         * (q2_k's is chance), while a format bug would leave no correlation at all.  mxfp4 11
         * .872, iq3_s 9 .774, iq3_xxs 5 .668, iq2_s 3 .526, iq2_xs 0 .334, iq2_xxs 1 .309,
         * ud_q2_k_xl 13 .926, ud_iq1_s 7 .758, q3_k_m 12 .828.  The IQ1 types (1.5 bits, no importance matrix)
         * leave tiny's logits uncorrelated (~0): not a test; test_quant bounds their error. */
        {MKMODEL_Q8_0, 22, 0.999}, {MKMODEL_Q4_0, 7, 0.85},    {MKMODEL_Q4_K, 12, 0.92},
        {MKMODEL_Q6_K, 17, 0.99},  {MKMODEL_Q4_1, 9, 0.88},    {MKMODEL_Q5_0, 12, 0.94},
        {MKMODEL_Q5_1, 14, 0.95},  {MKMODEL_IQ4_NL, 8, 0.88},  {MKMODEL_IQ4_XS, 8, 0.88},
        {MKMODEL_Q3_K, 4, 0.6},    {MKMODEL_Q2_K, 0, 0.3},     {MKMODEL_MXFP4, 7, 0.83},
        {MKMODEL_IQ3_S, 4, 0.7},   {MKMODEL_IQ3_XXS, 2, 0.6},  {MKMODEL_IQ2_S, 1, 0.45},
        {MKMODEL_IQ2_XS, 0, 0.28}, {MKMODEL_IQ2_XXS, 0, 0.25}, {MKMODEL_UD_Q2_K_XL, 8, 0.88},
        {MKMODEL_UD_IQ1_S, 3, 0.68},      {MKMODEL_Q3_K_M, 8, 0.78},
    };
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    cfg.n_embd = 256;
    cfg.n_ff = 512;
    int32_t tokens[AGREE_POS];
    for (int p = 0; p < AGREE_POS; p++) tokens[p] = (int32_t)((7919u * (unsigned)p + 13u) % (unsigned)cfg.n_vocab);
    char path[256];
    const int V = cfg.n_vocab;
    float *want = malloc(sizeof(float) * AGREE_POS * (size_t)V), *got = malloc(sizeof(float) * AGREE_POS * (size_t)V);
    assert_non_null(want);
    assert_non_null(got);
    cfg.ftype = MKMODEL_F32;
    write_model(&cfg, "agree-f32.gguf", path, sizeof path);
    run_positions(path, &cfg, tokens, want);
    unlink(path);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cfg.ftype = cases[c].ft;
        char file[64];
        snprintf(file, sizeof file, "agree-%s.gguf", mkmodel_ftype_name(cfg.ftype));
        write_model(&cfg, file, path, sizeof path);
        run_positions(path, &cfg, tokens, got);
        unlink(path);
        int agree = 0;
        double corr = 1.0;
        for (int p = 0; p < AGREE_POS; p++) {
            const float *w = want + (size_t)p * V, *g = got + (size_t)p * V;
            agree += argmax(g, V) == argmax(w, V);
            corr = fmin(corr, correlation(g, w, V));
        }
        print_message("  %-6s top-1 agreement with F32: %d/%d, least logit correlation %.4f\n",
                      mkmodel_ftype_name(cfg.ftype), agree, AGREE_POS, corr);
        assert_true(agree >= cases[c].min_agree);
        assert_true(corr >= cases[c].min_corr);
    }
    free(want);
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_train),
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_preset_metadata_llamacpp_names),
        cmocka_unit_test(test_q4_k_m_rule),
        cmocka_unit_test(test_q3_k_m_rule),
        cmocka_unit_test(test_qwen3moe),
        cmocka_unit_test(test_qwen35),
        cmocka_unit_test(test_qwen35moe),
        cmocka_unit_test(test_gptoss),
        cmocka_unit_test(test_gemma4),
        cmocka_unit_test(test_deepseek2),
        cmocka_unit_test(test_glm4moe_phi3),
        cmocka_unit_test(test_nomic_bert),
        cmocka_unit_test(test_invalid_config),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_q4_k_m_file_and_reused_rows),
        cmocka_unit_test(test_tiny_all_archs_and_types),
        cmocka_unit_test(test_types_agree_with_f32),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
