/* tiny_model.c - random GGUF models for tests (see tiny_model.h). */
#include "tiny_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "synth/gguf_write.h"
#include "model/quant.h"

tiny_spec tiny_spec_default(void)
{
    return (tiny_spec){.arch = "llama", .n_vocab = 48, .n_embd = 32, .n_layer = 2, .n_head = 4,
                       .n_head_kv = 2, .n_ff = 64, .n_ctx = 64, .wtype = GGML_TYPE_F32, .seed = 1};
}

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float next_float(uint64_t *s) { return (float)((double)(next_u64(s) >> 11) * 0x1.0p-52 - 1.0); }

typedef struct builder {
    const tiny_spec *s;
    gguf_writer *w;
    uint64_t rng;
} builder;

/* A tensor of ne0 x ne1 values center + spread * U(-1,1), stored as `type`. */
static void add_tensor(builder *b, const char *name, ggml_type type, int64_t ne0, int64_t ne1,
                       float center, float spread)
{
    if (b->s->omit_tensor && strcmp(name, b->s->omit_tensor) == 0) return;
    if (b->s->bad_tensor && strcmp(name, b->s->bad_tensor) == 0) ne0 *= 2;
    size_t n = (size_t)(ne0 * ne1);
    float *vals = malloc(n * sizeof *vals);
    for (size_t i = 0; i < n; i++) vals[i] = center + spread * next_float(&b->rng);
    size_t row_bytes = ggml_row_bytes(type, ne0);
    size_t nbytes = row_bytes * (size_t)ne1;
    char *data = malloc(nbytes);
    for (int64_t r = 0; r < ne1; r++)
        quant_quantize_row(type, vals + r * ne0, data + (size_t)r * row_bytes, ne0);
    int64_t ne[2] = {ne0, ne1};
    gguf_writer_add_tensor(b->w, name, type, ne1 > 1 ? 2 : 1, ne, data, nbytes, false);
    free(data);
    free(vals);
}

static void set_u32(builder *b, const char *suffix, uint32_t v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", b->s->arch, suffix);
    if (b->s->omit_key && strcmp(key, b->s->omit_key) == 0) return;
    gguf_writer_set_u32(b->w, key, v);
}

static void set_f32(builder *b, const char *suffix, float v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", b->s->arch, suffix);
    if (b->s->omit_key && strcmp(key, b->s->omit_key) == 0) return;
    gguf_writer_set_f32(b->w, key, v);
}

static void write_hparams(builder *b)
{
    const tiny_spec *s = b->s;
    gguf_writer_set_str(b->w, "general.architecture", s->arch);
    gguf_writer_set_str(b->w, "general.name", "tiny");
    set_u32(b, "context_length", (uint32_t)s->n_ctx);
    set_u32(b, "embedding_length", (uint32_t)s->n_embd);
    set_u32(b, "block_count", (uint32_t)s->n_layer);
    set_u32(b, "feed_forward_length", (uint32_t)s->n_ff);
    set_u32(b, "attention.head_count", (uint32_t)s->n_head);
    set_u32(b, "attention.head_count_kv", (uint32_t)s->n_head_kv);
    if (s->head_dim) set_u32(b, "attention.key_length", (uint32_t)s->head_dim);
    set_f32(b, "attention.layer_norm_rms_epsilon", 1e-5f);
    if (s->rope_base > 0) set_f32(b, "rope.freq_base", s->rope_base);
    if (s->n_swa > 0) {
        set_u32(b, "attention.sliding_window", (uint32_t)s->n_swa);
        set_f32(b, "rope.freq_base_swa", 10000.0f);
        set_f32(b, "final_logit_softcapping", 50.0f);
    }
    if (s->rope_scale > 0) {
        char key[96];
        snprintf(key, sizeof key, "%s.rope.scaling.type", s->arch);
        gguf_writer_set_str(b->w, key, "linear");
        set_f32(b, "rope.scaling.factor", s->rope_scale);
    }
}

/* gemma4's layer il: sliding unless il % 3 == 2; its own K/V unless one of the last
 * g4_kv_shared. */
static bool g4_sliding(int il) { return il % 3 != 2; }
static bool g4_own_kv(const tiny_spec *s, int il) { return il < s->n_layer - s->g4_kv_shared; }
static int g4_n_ff(const tiny_spec *s, int il) { return g4_own_kv(s, il) ? s->n_ff : 2 * s->n_ff; }

/* gemma4's keys over write_hparams' (a key set twice keeps the later value): arrays of kv heads,
 * FFN widths and the sliding pattern. */
static void write_gemma4_hparams(builder *b)
{
    const tiny_spec *s = b->s;
    int32_t kv[64], ff[64];
    uint8_t sliding[64];
    for (int il = 0; il < s->n_layer && il < 64; il++) {
        sliding[il] = g4_sliding(il);
        kv[il] = sliding[il] ? s->n_head_kv : s->g4_n_kv_full;
        ff[il] = g4_n_ff(s, il);
    }
    gguf_writer_set_arr_i32(b->w, "gemma4.attention.head_count_kv", kv, (size_t)s->n_layer);
    gguf_writer_set_arr_i32(b->w, "gemma4.feed_forward_length", ff, (size_t)s->n_layer);
    gguf_writer_set_raw(b->w, "gemma4.attention.sliding_window_pattern", GGUF_VT_ARRAY, GGUF_VT_BOOL, sliding,
                        (size_t)s->n_layer);
    set_u32(b, "attention.key_length", (uint32_t)s->g4_head_dim_full);
    set_u32(b, "attention.key_length_swa", (uint32_t)(s->n_embd / s->n_head));
    set_u32(b, "attention.shared_kv_layers", (uint32_t)s->g4_kv_shared);
    if (s->g4_ple) set_u32(b, "embedding_length_per_layer_input", (uint32_t)s->g4_ple);
    set_f32(b, "rope.freq_base", 1000000.0f);
}

static void write_gemma4_globals(builder *b)
{
    const tiny_spec *s = b->s;
    const int half = s->g4_head_dim_full / 2, all = s->n_layer * s->g4_ple;
    float *freqs = malloc((size_t)half * sizeof *freqs); /* proportional RoPE: a quarter of the pairs turn */
    for (int i = 0; i < half; i++) freqs[i] = i < half / 4 ? 1.0f : 1e30f;
    int64_t ne[1] = {half};
    gguf_writer_add_tensor(b->w, "rope_freqs.weight", GGML_TYPE_F32, 1, ne, freqs, (size_t)half * sizeof *freqs, false);
    free(freqs);
    if (!s->g4_ple) return;
    add_tensor(b, "per_layer_token_embd.weight", s->wtype, all, s->n_vocab, 0.0f, 1.0f);
    add_tensor(b, "per_layer_model_proj.weight", s->wtype, s->n_embd, all, 0.0f, 2.0f / sqrtf((float)s->n_embd));
    add_tensor(b, "per_layer_proj_norm.weight", GGML_TYPE_F32, s->g4_ple, 1, 1.0f, 0.2f);
}

static void write_gemma4_layer(builder *b, int il)
{
    const tiny_spec *s = b->s;
    const bool sliding = g4_sliding(il), own = g4_own_kv(s, il);
    const int hd = sliding ? s->n_embd / s->n_head : s->g4_head_dim_full;
    const int q_dim = s->n_head * hd, kv_dim = (sliding ? s->n_head_kv : s->g4_n_kv_full) * hd, n_ff = g4_n_ff(s, il);
    const float wscale = 1.0f / sqrtf((float)s->n_embd);
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
    add_tensor(b, NAME("attn_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 1.0f, 0.2f);
    add_tensor(b, NAME("attn_q.weight"), s->wtype, s->n_embd, q_dim, 0.0f, 2 * wscale);
    add_tensor(b, NAME("attn_q_norm.weight"), GGML_TYPE_F32, hd, 1, 1.0f, 0.2f);
    if (own) {
        add_tensor(b, NAME("attn_k.weight"), s->wtype, s->n_embd, kv_dim, 0.0f, 2 * wscale);
        add_tensor(b, NAME("attn_v.weight"), s->wtype, s->n_embd, kv_dim, 0.0f, 2 * wscale);
        add_tensor(b, NAME("attn_k_norm.weight"), GGML_TYPE_F32, hd, 1, 1.0f, 0.2f);
    }
    add_tensor(b, NAME("attn_output.weight"), s->wtype, q_dim, s->n_embd, 0.0f, 1.0f / sqrtf((float)q_dim));
    add_tensor(b, NAME("post_attention_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 0.5f, 0.2f);
    add_tensor(b, NAME("ffn_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 1.0f, 0.2f);
    add_tensor(b, NAME("ffn_gate.weight"), s->wtype, s->n_embd, n_ff, 0.0f, 2 * wscale);
    add_tensor(b, NAME("ffn_up.weight"), s->wtype, s->n_embd, n_ff, 0.0f, 2 * wscale);
    add_tensor(b, NAME("ffn_down.weight"), s->wtype, n_ff, s->n_embd, 0.0f, 1.0f / sqrtf((float)n_ff));
    add_tensor(b, NAME("post_ffw_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 0.5f, 0.2f);
    add_tensor(b, NAME("layer_output_scale.weight"), GGML_TYPE_F32, 1, 1, 0.9f, 0.05f);
    if (s->g4_ple) {
        add_tensor(b, NAME("inp_gate.weight"), s->wtype, s->n_embd, s->g4_ple, 0.0f, 2 * wscale);
        add_tensor(b, NAME("proj.weight"), s->wtype, s->g4_ple, s->n_embd, 0.0f, 1.0f / sqrtf((float)s->g4_ple));
        add_tensor(b, NAME("post_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 0.5f, 0.2f);
    }
#undef NAME
}

static void write_layer(builder *b, int il, int head_dim)
{
    const tiny_spec *s = b->s;
    const int q_dim = s->n_head * head_dim, kv_dim = s->n_head_kv * head_dim;
    const float wscale = 1.0f / sqrtf((float)s->n_embd);
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
    add_tensor(b, NAME("attn_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 1.0f, 0.2f);
    add_tensor(b, NAME("attn_q.weight"), s->wtype, s->n_embd, q_dim, 0.0f, 2 * wscale);
    add_tensor(b, NAME("attn_k.weight"), s->wtype, s->n_embd, kv_dim, 0.0f, 2 * wscale);
    add_tensor(b, NAME("attn_v.weight"), s->wtype, s->n_embd, kv_dim, 0.0f, 2 * wscale);
    add_tensor(b, NAME("attn_output.weight"), s->wtype, q_dim, s->n_embd, 0.0f, 1.0f / sqrtf((float)q_dim));
    if (strcmp(s->arch, "qwen2") == 0) {
        add_tensor(b, NAME("attn_q.bias"), GGML_TYPE_F32, q_dim, 1, 0.0f, 0.3f);
        add_tensor(b, NAME("attn_k.bias"), GGML_TYPE_F32, kv_dim, 1, 0.0f, 0.3f);
        add_tensor(b, NAME("attn_v.bias"), GGML_TYPE_F32, kv_dim, 1, 0.0f, 0.3f);
    }
    if (strcmp(s->arch, "qwen3") == 0 || strcmp(s->arch, "gemma3") == 0) {
        add_tensor(b, NAME("attn_q_norm.weight"), GGML_TYPE_F32, head_dim, 1, 1.0f, 0.2f);
        add_tensor(b, NAME("attn_k_norm.weight"), GGML_TYPE_F32, head_dim, 1, 1.0f, 0.2f);
    }
    add_tensor(b, NAME("ffn_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 1.0f, 0.2f);
    add_tensor(b, NAME("ffn_gate.weight"), s->wtype, s->n_embd, s->n_ff, 0.0f, 2 * wscale);
    add_tensor(b, NAME("ffn_up.weight"), s->wtype, s->n_embd, s->n_ff, 0.0f, 2 * wscale);
    add_tensor(b, NAME("ffn_down.weight"), s->wtype, s->n_ff, s->n_embd, 0.0f, 1.0f / sqrtf((float)s->n_ff));
    if (s->post_norms) {
        add_tensor(b, NAME("post_attention_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 0.5f, 0.2f);
        add_tensor(b, NAME("post_ffw_norm.weight"), GGML_TYPE_F32, s->n_embd, 1, 0.5f, 0.2f);
    }
#undef NAME
}

/* What every encoder family has: LayerNorm's epsilon, mean pooling, the token types and the
 * embeddings' LayerNorm. */
static void write_encoder_embedding(builder *b)
{
    const tiny_spec *s = b->s;
    set_f32(b, "attention.layer_norm_epsilon", 1e-12f);
    set_u32(b, "pooling_type", 1);
    add_tensor(b, "token_types.weight", GGML_TYPE_F32, s->n_embd, 2, 0.0f, 0.5f);
    add_tensor(b, "token_embd_norm.weight", GGML_TYPE_F32, s->n_embd, 1, 1.0f, 0.2f);
    add_tensor(b, "token_embd_norm.bias", GGML_TYPE_F32, s->n_embd, 1, 0.0f, 0.1f);
}

/* A post-LN block's LayerNorm of layer il: "blk.il.<norm>.weight" and ".bias". */
static void add_layer_norm(builder *b, int il, const char *norm)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, norm);
    add_tensor(b, name, GGML_TYPE_F32, b->s->n_embd, 1, 1.0f, 0.2f);
    snprintf(name, sizeof name, "blk.%d.%s.bias", il, norm);
    add_tensor(b, name, GGML_TYPE_F32, b->s->n_embd, 1, 0.0f, 0.1f);
}

/* Layer il's q/k/v/output projections (n_embd square) with their biases: bert's and jina's. */
static void add_biased_attention(builder *b, int il)
{
    const tiny_spec *s = b->s;
    static const char *const proj[] = {"attn_q", "attn_k", "attn_v", "attn_output"};
    char name[96];
    for (int p = 0; p < 4; p++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", il, proj[p]);
        add_tensor(b, name, s->wtype, s->n_embd, s->n_embd, 0.0f, 2.0f / sqrtf((float)s->n_embd));
        snprintf(name, sizeof name, "blk.%d.%s.bias", il, proj[p]);
        add_tensor(b, name, GGML_TYPE_F32, s->n_embd, 1, 0.0f, 0.2f);
    }
}

/* A BERT encoder (bge / all-MiniLM layout, as llama.cpp converts them): absolute positions and
 * token types, post-LN layers with biases everywhere, an MLP; mean pooling.  With alibi_geglu,
 * a jina-bert-v2 encoder (jina-embeddings-v2's layout): the same biased attention without a
 * position table (ALiBi), a fused [gate | up] ffn_up of 2 n_ff rows without a bias, and a
 * biased down. */
static void write_biased_encoder(builder *b, bool alibi_geglu)
{
    const tiny_spec *s = b->s;
    const float wscale = 1.0f / sqrtf((float)s->n_embd);
    write_encoder_embedding(b);
    if (!alibi_geglu) add_tensor(b, "position_embd.weight", s->wtype, s->n_embd, s->n_ctx, 0.0f, 0.5f);
    char name[96];
    for (int il = 0; il < s->n_layer; il++) {
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
        add_biased_attention(b, il);
        add_layer_norm(b, il, "attn_output_norm");
        add_tensor(b, NAME("ffn_up.weight"), s->wtype, s->n_embd, (alibi_geglu ? 2 : 1) * s->n_ff, 0.0f, 2 * wscale);
        if (!alibi_geglu) add_tensor(b, NAME("ffn_up.bias"), GGML_TYPE_F32, s->n_ff, 1, 0.0f, 0.2f);
        add_tensor(b, NAME("ffn_down.weight"), s->wtype, s->n_ff, s->n_embd, 0.0f, 1.0f / sqrtf((float)s->n_ff));
        add_tensor(b, NAME("ffn_down.bias"), GGML_TYPE_F32, s->n_embd, 1, 0.0f, 0.2f);
        add_layer_norm(b, il, "layer_output_norm");
#undef NAME
    }
}

/* A nomic-bert encoder (nomic-embed-text's layout, as llama.cpp converts it): token types and
 * no position table (NeoX RoPE, base 1000 unless rope_base says), post-LN layers without
 * attention or FFN biases, one fused attn_qkv (rows q, k, v), a SwiGLU; mean pooling. */
static void write_nomic_bert(builder *b)
{
    const tiny_spec *s = b->s;
    const float wscale = 1.0f / sqrtf((float)s->n_embd);
    write_encoder_embedding(b);
    if (s->rope_base <= 0) set_f32(b, "rope.freq_base", 1000.0f);
    char name[96];
    for (int il = 0; il < s->n_layer; il++) {
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
        add_tensor(b, NAME("attn_qkv.weight"), s->wtype, s->n_embd, 3 * s->n_embd, 0.0f, 2 * wscale);
        add_tensor(b, NAME("attn_output.weight"), s->wtype, s->n_embd, s->n_embd, 0.0f, 2 * wscale);
        add_layer_norm(b, il, "attn_output_norm");
        add_tensor(b, NAME("ffn_gate.weight"), s->wtype, s->n_embd, s->n_ff, 0.0f, 2 * wscale);
        add_tensor(b, NAME("ffn_up.weight"), s->wtype, s->n_embd, s->n_ff, 0.0f, 2 * wscale);
        add_tensor(b, NAME("ffn_down.weight"), s->wtype, s->n_ff, s->n_embd, 0.0f, 1.0f / sqrtf((float)s->n_ff));
        add_layer_norm(b, il, "layer_output_norm");
#undef NAME
    }
}

void *tiny_model_build(const tiny_spec *s, size_t *size)
{
    builder b = {.s = s, .w = gguf_writer_new(), .rng = s->seed};
    const int head_dim = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
    write_hparams(&b);
    const bool bert = strcmp(s->arch, "bert") == 0, nomic = strcmp(s->arch, "nomic-bert") == 0,
               jina = strcmp(s->arch, "jina-bert-v2") == 0;
    if (bert || nomic || jina) {
        add_tensor(&b, "token_embd.weight", s->wtype, s->n_embd, s->n_vocab, 0.0f, 1.0f);
        if (nomic) write_nomic_bert(&b);
        else write_biased_encoder(&b, jina);
        void *image = NULL;
        if (gguf_writer_write_mem(b.w, &image, size) != 0) image = NULL;
        gguf_writer_free(b.w);
        return image;
    }
    add_tensor(&b, "token_embd.weight", s->wtype, s->n_embd, s->n_vocab, 0.0f, 1.0f);
    add_tensor(&b, "output_norm.weight", GGML_TYPE_F32, s->n_embd, 1, 1.0f, 0.2f);
    if (!s->tied) add_tensor(&b, "output.weight", s->wtype, s->n_embd, s->n_vocab, 0.0f, 1.0f / sqrtf((float)s->n_embd));
    const bool g4 = strcmp(s->arch, "gemma4") == 0;
    if (g4) {
        write_gemma4_hparams(&b);
        write_gemma4_globals(&b);
    } else if (s->rope_freqs) {
        add_tensor(&b, "rope_freqs.weight", GGML_TYPE_F32, head_dim / 2, 1, 2.5f, 1.5f);
    }
    for (int il = 0; il < s->n_layer; il++) {
        if (g4) write_gemma4_layer(&b, il);
        else write_layer(&b, il, head_dim);
    }
    void *image = NULL;
    if (gguf_writer_write_mem(b.w, &image, size) != 0) image = NULL;
    gguf_writer_free(b.w);
    return image;
}

model *tiny_model_load(const void *image, size_t size, char *err, size_t errlen)
{
    gguf_file *f = gguf_open_memory(image, size, err, errlen);
    return f ? model_from_gguf(f, err, errlen) : NULL;
}

model *tiny_mkmodel_load(const mkmodel_config *cfg, char *err, size_t errlen)
{
    char path[] = "/tmp/inferd-mkmodel-XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    if (fd < 0) {
        snprintf(err, errlen, "mkstemps: cannot make a temporary file");
        return NULL;
    }
    close(fd);
    size_t len = 0;
    char *corpus = mkmodel_corpus("/nonexistent", 1 << 16, &len);
    int rc = mkmodel_write(cfg, corpus, len, path, err, errlen);
    free(corpus);
    model *m = rc == 0 ? model_load(path, err, errlen) : NULL;
    unlink(path);
    return m;
}
