/* model.c - bind a validated GGUF file to a model: read the architecture's hyper-parameters,
 * find every weight by its ggml name, and check each one's shape and type against what the
 * hyper-parameters imply.  After model_from_gguf succeeds a backend may trust every shape
 * without checking again; nothing here computes. */
#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const ARCH_NAMES[] = {
    [MODEL_ARCH_LLAMA] = "llama",
    [MODEL_ARCH_QWEN2] = "qwen2",
    [MODEL_ARCH_QWEN3] = "qwen3",
};
#define N_ARCHS ((int)(sizeof ARCH_NAMES / sizeof ARCH_NAMES[0]))

/* Hyper-parameters beyond this are not a model we could run; refusing them early keeps the
 * size arithmetic below far from overflow even for a hostile file. */
#define HPARAM_MAX (1 << 24)

const char *model_arch_name(model_arch a)
{
    return (int)a >= 0 && (int)a < N_ARCHS ? ARCH_NAMES[a] : "unknown";
}

/* State of one load: the file, the model being filled, and where errors go. */
typedef struct loader {
    const gguf_file *f;
    model *m;
    char *err;
    size_t errlen;
} loader;

__attribute__((format(printf, 2, 3))) static bool fail(loader *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err, L->errlen, fmt, ap);
    va_end(ap);
    return false;
}

static void arch_key(const loader *L, const char *suffix, char *key, size_t len)
{
    snprintf(key, len, "%s.%s", model_arch_name(L->m->hp.arch), suffix);
}

/* A typed getter found nothing usable: fine only if the key is absent and optional. */
static bool absent_ok(loader *L, const char *key, bool required, const char *expected)
{
    if (gguf_find_key(L->f, key) >= 0) return fail(L, "key '%s' has the wrong type: expected %s", key, expected);
    if (required) return fail(L, "missing key '%s'", key);
    return true;
}

/* "<arch>.<suffix>" as an integer in [1, HPARAM_MAX]; *out keeps its default when the key is
 * absent and !required. */
static bool read_int(loader *L, const char *suffix, bool required, int *out)
{
    char key[128];
    arch_key(L, suffix, key, sizeof key);
    int64_t v;
    if (!gguf_get_i64(L->f, key, &v)) return absent_ok(L, key, required, "an integer");
    if (v < 1 || v > HPARAM_MAX) return fail(L, "key '%s' = %lld is out of range [1, %d]", key, (long long)v, HPARAM_MAX);
    *out = (int)v;
    return true;
}

/* "<arch>.<suffix>" as a positive finite float; keeps the default when absent. */
static bool read_float(loader *L, const char *suffix, bool required, float *out)
{
    char key[128];
    arch_key(L, suffix, key, sizeof key);
    float v;
    if (!gguf_get_f32(L->f, key, &v)) return absent_ok(L, key, required, "a number");
    if (!(v > 0.0f) || v > 1e30f) return fail(L, "key '%s' = %g is not a positive number", key, (double)v);
    *out = v;
    return true;
}

static bool read_arch(loader *L)
{
    size_t len;
    const char *s = gguf_get_str(L->f, "general.architecture", &len);
    if (!s) return absent_ok(L, "general.architecture", true, "a string");
    for (int a = 0; a < N_ARCHS; a++) {
        if (strlen(ARCH_NAMES[a]) == len && memcmp(ARCH_NAMES[a], s, len) == 0) {
            L->m->hp.arch = (model_arch)a;
            return true;
        }
    }
    int shown = len > 64 ? 64 : (int)len;
    return fail(L, "general.architecture '%.*s' is not supported (llama, qwen2, qwen3)", shown, s);
}

/* Linear scaling stretches positions; other schemes (yarn, ...) change the frequencies in
 * ways this engine does not implement, so they are refused rather than silently ignored. */
static bool read_rope_scaling(loader *L)
{
    char key[128];
    arch_key(L, "rope.scaling.type", key, sizeof key);
    size_t len;
    const char *type = gguf_get_str(L->f, key, &len);
    if (!type || (len == 4 && memcmp(type, "none", 4) == 0)) return true;
    if (!(len == 6 && memcmp(type, "linear", 6) == 0)) {
        int shown = len > 32 ? 32 : (int)len;
        return fail(L, "key '%s' = '%.*s' is not supported (none, linear)", key, shown, type);
    }
    return read_float(L, "rope.scaling.factor", true, &L->m->hp.rope_scale);
}

static bool read_hparams(loader *L)
{
    model_hparams *hp = &L->m->hp;
    if (!read_arch(L)) return false;
    hp->rope_base = 10000.0f;
    hp->rope_scale = 1.0f;
    hp->rope_neox = hp->arch != MODEL_ARCH_LLAMA;
    if (!read_int(L, "context_length", true, &hp->n_ctx_train) ||
        !read_int(L, "embedding_length", true, &hp->n_embd) ||
        !read_int(L, "block_count", true, &hp->n_layer) ||
        !read_int(L, "feed_forward_length", true, &hp->n_ff) ||
        !read_int(L, "attention.head_count", true, &hp->n_head))
        return false;
    hp->n_head_kv = hp->n_head;
    hp->head_dim = hp->n_embd / hp->n_head;
    if (!read_int(L, "attention.head_count_kv", false, &hp->n_head_kv) ||
        !read_int(L, "attention.key_length", false, &hp->head_dim) ||
        !read_float(L, "attention.layer_norm_rms_epsilon", true, &hp->rms_eps) ||
        !read_float(L, "rope.freq_base", false, &hp->rope_base) || !read_rope_scaling(L))
        return false;
    const char *arch = model_arch_name(hp->arch);
    if (hp->n_head % hp->n_head_kv != 0)
        return fail(L, "%s.attention.head_count %d is not a multiple of head_count_kv %d", arch,
                    hp->n_head, hp->n_head_kv);
    if (hp->head_dim < 2 || hp->head_dim % 2 != 0)
        return fail(L, "head dimension %d (%s.attention.key_length or embedding_length/head_count) "
                    "must be even and >= 2", hp->head_dim, arch);
    if ((int64_t)hp->n_head * hp->head_dim > HPARAM_MAX)
        return fail(L, "%s: head_count %d x head dimension %d is too large", arch, hp->n_head, hp->head_dim);
    return true;
}

/* Find `name`, check it is [ne0] (ne1 == 0) or [ne0, ne1] (ne0 < 0: any row length, for the
 * embedding whose width sets n_vocab) and of a usable type, and fill *t.  An absent optional
 * tensor leaves *t zeroed. */
typedef struct tensor_spec {
    const char *name;
    int64_t ne0, ne1;
    bool required;
    bool f32_only; /* norms, biases and rope factors are read as plain floats */
} tensor_spec;

static bool bind(loader *L, model_tensor *t, tensor_spec spec)
{
    memset(t, 0, sizeof *t);
    const gguf_tensor *g = gguf_find_tensor(L->f, spec.name);
    if (!g) return spec.required ? fail(L, "missing tensor '%s'", spec.name) : true;
    int64_t want1 = spec.ne1 == 0 ? 1 : spec.ne1;
    bool dims_ok = (spec.ne1 == 0 ? g->n_dims == 1 : g->n_dims == 2) && g->ne[2] == 1 && g->ne[3] == 1;
    if (!dims_ok || g->ne[0] != spec.ne0 || g->ne[1] != want1) {
        char found[96];
        int n = snprintf(found, sizeof found, "[%lld", (long long)g->ne[0]);
        for (uint32_t d = 1; d < g->n_dims && d < GGUF_MAX_DIMS && n < (int)sizeof found; d++)
            n += snprintf(found + n, sizeof found - (size_t)n, ", %lld", (long long)g->ne[d]);
        if (n < (int)sizeof found) snprintf(found + n, sizeof found - (size_t)n, "]");
        if (spec.ne1 == 0)
            return fail(L, "tensor '%s': expected shape [%lld], found %s", spec.name, (long long)spec.ne0, found);
        return fail(L, "tensor '%s': expected shape [%lld, %lld], found %s", spec.name,
                    (long long)spec.ne0, (long long)spec.ne1, found);
    }
    if (spec.f32_only && g->type != GGML_TYPE_F32)
        return fail(L, "tensor '%s': type %s, expected F32", spec.name, ggml_type_name(g->type));
    if (!ggml_type_supported(g->type))
        return fail(L, "tensor '%s': type %s is not supported (F32 F16 BF16 Q4_0 Q8_0 Q4_K Q5_K Q6_K)",
                    spec.name, ggml_type_name(g->type));
    size_t row_bytes = ggml_row_bytes(g->type, g->ne[0]);
    if (row_bytes == 0 || row_bytes * (size_t)g->ne[1] != g->nbytes)
        return fail(L, "tensor '%s': row length %lld is not a whole number of %s blocks", spec.name,
                    (long long)g->ne[0], ggml_type_name(g->type));
    *t = (model_tensor){.data = g->data, .type = g->type, .ne0 = g->ne[0], .ne1 = want1,
                        .row_bytes = row_bytes, .name = g->name};
    L->m->weight_bytes += g->nbytes;
    return true;
}

/* The vocabulary size is whatever token_embd holds; the tokenizer, when present, must agree. */
static bool bind_embedding(loader *L)
{
    model *m = L->m;
    const gguf_tensor *g = gguf_find_tensor(L->f, "token_embd.weight");
    if (!g) return fail(L, "missing tensor 'token_embd.weight'");
    if (g->n_dims != 2 || g->ne[1] < 1 || g->ne[1] > HPARAM_MAX)
        return fail(L, "tensor 'token_embd.weight': expected shape [%d, n_vocab], found %u dims with ne1 = %lld",
                    m->hp.n_embd, g->n_dims, (long long)g->ne[1]);
    m->hp.n_vocab = (int)g->ne[1];
    /* Optional, but a declared size that disagrees with the tensor means a damaged or
     * mis-converted file: refuse it rather than serve with whichever one we guessed. */
    int declared = m->hp.n_vocab;
    if (!read_int(L, "vocab_size", false, &declared)) return false;
    if (declared != m->hp.n_vocab)
        return fail(L, "%s.vocab_size %d does not match token_embd.weight's %d rows",
                    model_arch_name(m->hp.arch), declared, m->hp.n_vocab);
    int64_t tok = gguf_find_key(L->f, "tokenizer.ggml.tokens");
    if (tok >= 0 && gguf_kv_type(L->f, tok) == GGUF_VT_ARRAY && gguf_arr_len(L->f, tok) != (uint64_t)m->hp.n_vocab)
        return fail(L, "tokenizer.ggml.tokens has %llu entries but token_embd.weight has %d rows",
                    (unsigned long long)gguf_arr_len(L->f, tok), m->hp.n_vocab);
    return bind(L, &m->tok_embd, (tensor_spec){"token_embd.weight", m->hp.n_embd, m->hp.n_vocab, true, false});
}

static bool bind_layer(loader *L, int il)
{
    const model_hparams *hp = &L->m->hp;
    model_layer *ly = &L->m->layers[il];
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const bool qwen2 = hp->arch == MODEL_ARCH_QWEN2, qwen3 = hp->arch == MODEL_ARCH_QWEN3;
    /* Biases belong to qwen2 and q/k norms to qwen3: each architecture requires exactly its
     * own tensors; one it does not use is left unbound (the forward pass would ignore it). */
    const struct {
        model_tensor *t;
        const char *suffix;
        int64_t ne0, ne1;
        bool used, f32_only;
    } table[] = {
        {&ly->attn_norm, "attn_norm.weight", hp->n_embd, 0, true, true},
        {&ly->wq, "attn_q.weight", hp->n_embd, q_dim, true, false},
        {&ly->wk, "attn_k.weight", hp->n_embd, kv_dim, true, false},
        {&ly->wv, "attn_v.weight", hp->n_embd, kv_dim, true, false},
        {&ly->wo, "attn_output.weight", q_dim, hp->n_embd, true, false},
        {&ly->bq, "attn_q.bias", q_dim, 0, qwen2, true},
        {&ly->bk, "attn_k.bias", kv_dim, 0, qwen2, true},
        {&ly->bv, "attn_v.bias", kv_dim, 0, qwen2, true},
        {&ly->q_norm, "attn_q_norm.weight", hp->head_dim, 0, qwen3, true},
        {&ly->k_norm, "attn_k_norm.weight", hp->head_dim, 0, qwen3, true},
        {&ly->ffn_norm, "ffn_norm.weight", hp->n_embd, 0, true, true},
        {&ly->w_gate, "ffn_gate.weight", hp->n_embd, hp->n_ff, true, false},
        {&ly->w_up, "ffn_up.weight", hp->n_embd, hp->n_ff, true, false},
        {&ly->w_down, "ffn_down.weight", hp->n_ff, hp->n_embd, true, false},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (!table[i].used) continue; /* stays zeroed from calloc */
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", il, table[i].suffix);
        tensor_spec spec = {name, table[i].ne0, table[i].ne1, true, table[i].f32_only};
        if (!bind(L, table[i].t, spec)) return false;
    }
    return true;
}

static bool bind_tensors(loader *L)
{
    model *m = L->m;
    const model_hparams *hp = &m->hp;
    if (!bind_embedding(L) ||
        !bind(L, &m->output_norm, (tensor_spec){"output_norm.weight", hp->n_embd, 0, true, true}) ||
        !bind(L, &m->output, (tensor_spec){"output.weight", hp->n_embd, hp->n_vocab, false, false}) ||
        !bind(L, &m->rope_freqs, (tensor_spec){"rope_freqs.weight", hp->head_dim / 2, 0, false, true}))
        return false;
    m->hp.tied_output = m->output.data == NULL;
    if (m->hp.tied_output) m->output = m->tok_embd;
    /* Every layer has at least 9 tensors: a block_count the file cannot back is refused before
     * the layer table is sized by it. */
    if ((int64_t)hp->n_layer * 9 > gguf_n_tensors(L->f))
        return fail(L, "%s.block_count %d needs more tensors than the file's %lld", model_arch_name(hp->arch),
                    hp->n_layer, (long long)gguf_n_tensors(L->f));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return fail(L, "out of memory for %d layers", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++)
        if (!bind_layer(L, il)) return false;
    return true;
}

static void read_name(loader *L)
{
    size_t len;
    const char *s = gguf_get_str(L->f, "general.name", &len);
    if (!s) s = "", len = 0;
    if (len >= sizeof L->m->name) len = sizeof L->m->name - 1;
    memcpy(L->m->name, s, len);
    L->m->name[len] = '\0';
}

model *model_from_gguf(gguf_file *f, char *err, size_t errlen)
{
    if (!f) {
        snprintf(err, errlen, "no GGUF file");
        return NULL;
    }
    model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        gguf_close(f);
        return NULL;
    }
    m->gguf = f;
    loader L = {.f = f, .m = m, .err = err, .errlen = errlen};
    if (!read_hparams(&L) || !bind_tensors(&L)) {
        model_free(m);
        return NULL;
    }
    read_name(&L);
    return m;
}

model *model_load(const char *path, char *err, size_t errlen)
{
    /* a copy, not a view: a file replaced under a server must not change what it serves */
    gguf_file *f = gguf_load(path, err, errlen); /* its errors start with the path already */
    if (!f) return NULL;
    model *m = model_from_gguf(f, err, errlen);
    if (!m && errlen > 0) { /* so that every error of model_load starts with the path */
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "%s: %s", path, why);
    }
    if (m && m->name[0] == '\0') {
        const char *base = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    }
    return m;
}

void model_free(model *m)
{
    if (!m) return;
    gguf_close(m->gguf);
    free(m->layers);
    free(m);
}
