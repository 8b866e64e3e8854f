/* test_model.c - the model loader: hyper-parameters and tensors bound per architecture, and
 * refusals that name the offending key or tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model.h"
#include "synth/gguf_write.h"
#include "tiny_model.h"

static model *load(const tiny_spec *s, void **image, char *err, size_t errlen)
{
    size_t size;
    *image = tiny_model_build(s, &size);
    assert_non_null(*image);
    return tiny_model_load(*image, size, err, errlen);
}

static model *load_ok(const tiny_spec *s, void **image)
{
    char err[256];
    model *m = load(s, image, err, sizeof err);
    if (!m) fail_msg("%s", err);
    return m;
}

/* Loading must fail with a message containing every given fragment. */
static void expect_refusal(const tiny_spec *s, const char *frag1, const char *frag2)
{
    char err[256] = "";
    void *image;
    model *m = load(s, &image, err, sizeof err);
    if (m) fail_msg("loaded although it should be refused (%s)", frag1);
    print_message("  refused: %s\n", err);
    if (!strstr(err, frag1)) fail_msg("error '%s' lacks '%s'", err, frag1);
    if (frag2 && !strstr(err, frag2)) fail_msg("error '%s' lacks '%s'", err, frag2);
    free(image);
}

static void test_llama_gqa_tied(void **state)
{
    (void)state;
    tiny_spec s = tiny_spec_default();
    s.tied = true;
    s.rope_freqs = true;
    s.rope_scale = 4.0f;
    s.rope_base = 500000.0f;
    void *image;
    model *m = load_ok(&s, &image);
    const model_hparams *hp = &m->hp;
    assert_int_equal(hp->arch, MODEL_ARCH_LLAMA);
    assert_string_equal(model_arch_name(hp->arch), "llama");
    assert_int_equal(hp->n_vocab, 48);
    assert_int_equal(hp->n_embd, 32);
    assert_int_equal(hp->n_layer, 2);
    assert_int_equal(hp->n_head, 4);
    assert_int_equal(hp->n_head_kv, 2);
    assert_int_equal(hp->head_dim, 8);
    assert_int_equal(hp->n_ff, 64);
    assert_int_equal(hp->n_ctx_train, 64);
    assert_float_equal(hp->rms_eps, 1e-5f, 1e-12f);
    assert_float_equal(hp->rope_base, 500000.0f, 0.0f);
    assert_float_equal(hp->rope_scale, 4.0f, 0.0f);
    assert_false(hp->rope_neox);
    assert_true(hp->tied_output);
    assert_ptr_equal(m->output.data, m->tok_embd.data);
    assert_non_null(m->rope_freqs.data);
    assert_int_equal(m->rope_freqs.ne0, 4);
    assert_string_equal(m->name, "tiny");
    assert_string_equal(m->layers[1].wk.name, "blk.1.attn_k.weight");
    assert_int_equal(m->layers[1].wk.ne0, 32);
    assert_int_equal(m->layers[1].wk.ne1, 16);
    assert_int_equal(m->layers[0].wk.row_bytes, 32 * 4);
    assert_null(m->layers[0].bq.data);
    assert_null(m->layers[0].q_norm.data);
    /* All tensor bytes, the tied output counted once. */
    size_t per_layer = (32 + 32 * 32 + 2 * 32 * 16 + 32 * 32 + 32 + 3 * 32 * 64) * 4;
    assert_int_equal(m->weight_bytes, (48 * 32 + 32 + 4) * 4 + 2 * per_layer);
    model_free(m);
    free(image);
}

static void test_qwen2_qwen3(void **state)
{
    (void)state;
    tiny_spec s = tiny_spec_default();
    s.arch = "qwen2";
    s.wtype = GGML_TYPE_F16;
    void *image;
    model *m = load_ok(&s, &image);
    assert_int_equal(m->hp.arch, MODEL_ARCH_QWEN2);
    assert_true(m->hp.rope_neox);
    assert_false(m->hp.tied_output);
    assert_non_null(m->layers[0].bq.data);
    assert_int_equal(m->layers[0].bk.ne0, 16);
    assert_int_equal(m->layers[0].wq.type, GGML_TYPE_F16);
    model_free(m);
    free(image);

    s.arch = "qwen3";
    s.head_dim = 16; /* qwen3 states head_dim: 4 heads x 16 != n_embd 32 */
    s.wtype = GGML_TYPE_Q8_0;
    m = load_ok(&s, &image);
    assert_int_equal(m->hp.arch, MODEL_ARCH_QWEN3);
    assert_true(m->hp.rope_neox);
    assert_int_equal(m->hp.head_dim, 16);
    assert_int_equal(m->layers[0].wq.ne1, 64);
    assert_int_equal(m->layers[0].wo.ne0, 64);
    assert_non_null(m->layers[1].k_norm.data);
    assert_null(m->layers[1].bk.data);
    assert_int_equal(m->layers[0].wq.row_bytes, 34); /* one Q8_0 block */
    model_free(m);
    free(image);
}

static void test_refusals(void **state)
{
    (void)state;
    tiny_spec s = tiny_spec_default();
    s.omit_tensor = "blk.1.ffn_up.weight";
    expect_refusal(&s, "missing tensor 'blk.1.ffn_up.weight'", NULL);

    s = tiny_spec_default();
    s.bad_tensor = "blk.0.attn_k.weight";
    expect_refusal(&s, "'blk.0.attn_k.weight'", "expected shape [32, 16], found [64, 16]");

    s = tiny_spec_default();
    s.bad_tensor = "output_norm.weight";
    expect_refusal(&s, "'output_norm.weight'", "expected shape [32], found [64]");

    s = tiny_spec_default();
    s.arch = "gpt2";
    expect_refusal(&s, "general.architecture 'gpt2'", "not supported");

    s = tiny_spec_default();
    s.omit_key = "llama.block_count";
    expect_refusal(&s, "missing key 'llama.block_count'", NULL);

    s = tiny_spec_default();
    s.arch = "qwen2"; /* needs biases: drop one */
    s.omit_tensor = "blk.0.attn_v.bias";
    expect_refusal(&s, "missing tensor 'blk.0.attn_v.bias'", NULL);

    s = tiny_spec_default();
    s.arch = "qwen3";
    s.omit_tensor = "blk.1.attn_q_norm.weight";
    expect_refusal(&s, "missing tensor 'blk.1.attn_q_norm.weight'", NULL);

    s = tiny_spec_default();
    s.n_head_kv = 3; /* 4 heads cannot be grouped over 3 */
    expect_refusal(&s, "head_count 4 is not a multiple of head_count_kv 3", NULL);
}

/* Norms must be F32; a quantised norm is refused with its name and type. */
static void test_norm_type(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    const char *keys[] = {"llama.context_length", "llama.embedding_length", "llama.block_count",
                          "llama.feed_forward_length", "llama.attention.head_count"};
    const uint32_t vals[] = {16, 32, 0 + 1, 32, 4};
    for (int i = 0; i < 5; i++) gguf_writer_set_u32(w, keys[i], vals[i]);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    static float zeros[32 * 32];
    static uint16_t half[32];
    int64_t emb[2] = {32, 8}, vec[1] = {32};
    gguf_writer_add_tensor(w, "token_embd.weight", GGML_TYPE_F32, 2, emb, zeros, 32 * 8 * 4, false);
    gguf_writer_add_tensor(w, "output_norm.weight", GGML_TYPE_F16, 1, vec, half, sizeof half, false);
    void *image;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, &image, &size), 0);
    gguf_writer_free(w);
    char err[256];
    model *m = tiny_model_load(image, size, err, sizeof err);
    assert_null(m);
    print_message("  refused: %s\n", err);
    assert_non_null(strstr(err, "'output_norm.weight': type F16, expected F32"));
    free(image);
}

/* The tiny BERT (test_gpu_engine's bge-small shape at another size) loads as an encoder: mean
 * pooling, a position table of n_ctx rows, post-LN layers with their biases. */
static void test_tiny_bert(void **state)
{
    (void)state;
    tiny_spec s = tiny_spec_default();
    s.arch = "bert";
    s.n_embd = 64, s.n_head = 4, s.n_head_kv = 4, s.n_ff = 96, s.n_ctx = 48;
    void *image;
    model *m = load_ok(&s, &image);
    assert_true(m->hp.encoder);
    assert_int_equal(m->hp.pooling, 1);
    assert_int_equal(m->pos_embd.ne1, 48);
    assert_non_null(m->layers[1].bo.data);
    assert_non_null(m->layers[1].ffn_out_norm_b.data);
    assert_int_equal(m->layers[0].recipe.norm, ARCH_NORM_POST_LN);
    model_free(m);
    free(image);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_gqa_tied),
        cmocka_unit_test(test_qwen2_qwen3),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_norm_type),
        cmocka_unit_test(test_tiny_bert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
