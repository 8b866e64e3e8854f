/* model.c - bind a validated GGUF file to a model: read the architecture's hyper-parameters,
 * find every weight by its ggml name, and check each one's shape and type against what the
 * hyper-parameters imply.  After model_from_gguf succeeds a backend may trust every shape
 * without checking again; nothing here computes. */
#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Hyper-parameters beyond this are not a model we could run; refusing them early keeps the
 * size arithmetic below far from overflow even for a hostile file. */
#define HPARAM_MAX (1 << 24)

const char *model_arch_name(model_arch a)
{
    const arch_desc *d = arch_by_id((int)a);
    return d ? d->name : "unknown";
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

static void key_name(const loader *L, const char *suffix, char *key, size_t len)
{
    snprintf(key, len, "%s.%s", L->m->desc->name, suffix);
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
static bool read_int(loader *L, const char *suffix, bool required, bool zero_ok, int *out)
{
    char key[128];
    key_name(L, suffix, key, sizeof key);
    int64_t v;
    const int least = zero_ok ? 0 : 1;
    if (!gguf_get_i64(L->f, key, &v)) return absent_ok(L, key, required, "an integer");
    if (v < least || v > HPARAM_MAX)
        return fail(L, "key '%s' = %lld is out of range [%d, %d]", key, (long long)v, least, HPARAM_MAX);
    *out = (int)v;
    return true;
}

/* "<arch>.<suffix>" as a positive finite float; keeps the default when absent. */
static bool read_float(loader *L, const char *suffix, bool required, float *out)
{
    char key[128];
    key_name(L, suffix, key, sizeof key);
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
    const arch_desc *d = arch_find(s, len);
    if (d) {
        L->m->desc = d;
        L->m->hp.arch = (model_arch)arch_id(d);
        return true;
    }
    char names[256];
    arch_names(names, sizeof names);
    int shown = len > 64 ? 64 : (int)len;
    return fail(L, "general.architecture '%.*s' is not supported (%s)", shown, s, names);
}

/* Linear scaling stretches positions; other schemes (yarn, ...) change the frequencies in
 * ways this engine does not implement, so they are refused rather than silently ignored. */
static bool read_rope_scaling(loader *L)
{
    char key[128];
    key_name(L, "rope.scaling.type", key, sizeof key);
    size_t len;
    const char *type = gguf_get_str(L->f, key, &len);
    if (!type || (len == 4 && memcmp(type, "none", 4) == 0)) return true;
    if (!(len == 6 && memcmp(type, "linear", 6) == 0)) {
        int shown = len > 32 ? 32 : (int)len;
        return fail(L, "key '%s' = '%.*s' is not supported (none, linear)", key, shown, type);
    }
    return read_float(L, "rope.scaling.factor", true, &L->m->hp.rope_scale);
}

/* A list of the family's keys, in its order; each lands in its model_hparams field. */
static bool read_keys(loader *L, const arch_key *list)
{
    for (const arch_key *k = list; k && k->suffix; k++) {
        char *field = (char *)&L->m->hp + k->offset;
        if (k->kind == ARCH_KEY_INT) {
            if (k->dflt != 0) *(int *)field = (int)k->dflt;
            if (!read_int(L, k->suffix, k->required, k->zero_ok, (int *)field)) return false;
        } else {
            if (k->dflt != 0) *(float *)field = k->dflt;
            if (!read_float(L, k->suffix, k->required, (float *)field)) return false;
        }
    }
    return true;
}

static bool read_hparams(loader *L)
{
    model_hparams *hp = &L->m->hp;
    if (!read_arch(L)) return false;
    hp->rope_scale = 1.0f;
    hp->rope_attn_factor = 1.0f;
    hp->expert_weights_scale = 1.0f;
    hp->rope_neox = L->m->desc->rope == ARCH_ROPE_NEOX;
    if (!read_keys(L, L->m->desc->keys) || !read_keys(L, L->m->desc->more_keys) ||
        !read_keys(L, L->m->desc->family_keys) || !read_rope_scaling(L))
        return false;
    const char *arch = L->m->desc->name;
    /* A family's key list must give these (a test's descriptor could forget one). */
    if (hp->n_ctx_train < 1 || hp->n_embd < 1 || hp->n_layer < 1 || hp->n_ff < 1 || hp->n_head < 1 || !(hp->rms_eps > 0))
        return fail(L, "%s: the family declares no key for one of context_length, embedding_length, block_count, "
                    "feed_forward_length, attention.head_count, attention.layer_norm_rms_epsilon", arch);
    if (hp->n_head_kv == 0) hp->n_head_kv = hp->n_head;
    if (hp->head_dim == 0) hp->head_dim = hp->n_embd / hp->n_head;
    if (hp->n_head % hp->n_head_kv != 0)
        return fail(L, "%s.attention.head_count %d is not a multiple of head_count_kv %d", arch,
                    hp->n_head, hp->n_head_kv);
    if (hp->head_dim < 2 || hp->head_dim % 2 != 0)
        return fail(L, "head dimension %d (%s.attention.key_length or embedding_length/head_count) "
                    "must be even and >= 2", hp->head_dim, arch);
    if ((int64_t)hp->n_head * hp->head_dim > HPARAM_MAX)
        return fail(L, "%s: head_count %d x head dimension %d is too large", arch, hp->n_head, hp->head_dim);
    if (hp->n_expert_used > hp->n_expert)
        return fail(L, "%s.expert_used_count %d is more than expert_count %d", arch, hp->n_expert_used, hp->n_expert);
    if (hp->n_rot == 0) hp->n_rot = hp->head_dim;
    if (hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)
        return fail(L, "%s.rope.dimension_count %d must be even and at most the head dimension %d", arch, hp->n_rot,
                    hp->head_dim);
    /* NextN layers (GLM-4.5's multi-token prediction) follow the model's own; without
     * speculative decoding they are not run, as llama.cpp does. */
    if (hp->n_nextn >= hp->n_layer)
        return fail(L, "%s.nextn_predict_layers %d leaves no layer of block_count %d", arch, hp->n_nextn, hp->n_layer);
    hp->n_layer -= hp->n_nextn;
    if (hp->n_dense_lead > hp->n_layer)
        return fail(L, "%s.leading_dense_block_count %d is more than block_count %d", arch, hp->n_dense_lead,
                    hp->n_layer);
    return true;
}

/* Find `name`, check it is [ne0] (ne1 == 0), [ne0, ne1] (ne2 == 0) or [ne0, ne1, ne2] and of a
 * usable type, and fill *t.  An absent optional tensor leaves *t zeroed. */
typedef struct tensor_spec {
    const char *name;
    int64_t ne0, ne1, ne2;
    bool required;
    bool f32_only; /* norms, biases and rope factors are read as plain floats */
} tensor_spec;

static bool bind(loader *L, model_tensor *t, tensor_spec spec)
{
    memset(t, 0, sizeof *t);
    const gguf_tensor *g = gguf_find_tensor(L->f, spec.name);
    if (!g) return spec.required ? fail(L, "missing tensor '%s'", spec.name) : true;
    int64_t want1 = spec.ne1 == 0 ? 1 : spec.ne1, want2 = spec.ne2 == 0 ? 1 : spec.ne2;
    uint32_t want_dims = spec.ne1 == 0 ? 1 : spec.ne2 == 0 ? 2 : 3;
    if (g->n_dims != want_dims || g->ne[0] != spec.ne0 || g->ne[1] != want1 || g->ne[2] != want2 || g->ne[3] != 1) {
        char found[96];
        int n = snprintf(found, sizeof found, "[%lld", (long long)g->ne[0]);
        for (uint32_t d = 1; d < g->n_dims && d < GGUF_MAX_DIMS && n < (int)sizeof found; d++)
            n += snprintf(found + n, sizeof found - (size_t)n, ", %lld", (long long)g->ne[d]);
        if (n < (int)sizeof found) snprintf(found + n, sizeof found - (size_t)n, "]");
        if (spec.ne1 == 0)
            return fail(L, "tensor '%s': expected shape [%lld], found %s", spec.name, (long long)spec.ne0, found);
        if (spec.ne2 == 0)
            return fail(L, "tensor '%s': expected shape [%lld, %lld], found %s", spec.name,
                        (long long)spec.ne0, (long long)spec.ne1, found);
        return fail(L, "tensor '%s': expected shape [%lld, %lld, %lld] (the last: experts), found %s", spec.name,
                    (long long)spec.ne0, (long long)spec.ne1, (long long)spec.ne2, found);
    }
    if (spec.f32_only && g->type != GGML_TYPE_F32)
        return fail(L, "tensor '%s': type %s, expected F32", spec.name, ggml_type_name(g->type));
    if (!ggml_type_supported(g->type))
        return fail(L, "tensor '%s': type %s is not supported (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4)",
                    spec.name, ggml_type_name(g->type));
    size_t row_bytes = ggml_row_bytes(g->type, g->ne[0]);
    if (row_bytes == 0 || row_bytes * (size_t)g->ne[1] * (size_t)g->ne[2] != g->nbytes)
        return fail(L, "tensor '%s': row length %lld is not a whole number of %s blocks", spec.name,
                    (long long)g->ne[0], ggml_type_name(g->type));
    *t = (model_tensor){.data = g->data, .type = g->type, .ne0 = g->ne[0], .ne1 = want1, .ne2 = want2,
                        .row_bytes = row_bytes, .name = g->name};
    L->m->weight_bytes += g->nbytes;
    return true;
}

/* The vocabulary size is whatever token_embd holds; the tokenizer, when present, must agree. */
static bool read_vocab(loader *L)
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
    if (!read_int(L, "vocab_size", false, false, &declared)) return false;
    if (declared != m->hp.n_vocab)
        return fail(L, "%s.vocab_size %d does not match token_embd.weight's %d rows", m->desc->name, declared,
                    m->hp.n_vocab);
    int64_t tok = gguf_find_key(L->f, "tokenizer.ggml.tokens");
    if (tok >= 0 && gguf_kv_type(L->f, tok) == GGUF_VT_ARRAY && gguf_arr_len(L->f, tok) != (uint64_t)m->hp.n_vocab)
        return fail(L, "tokenizer.ggml.tokens has %llu entries but token_embd.weight has %d rows",
                    (unsigned long long)gguf_arr_len(L->f, tok), m->hp.n_vocab);
    return true;
}

static int64_t dim_value(const model_hparams *hp, arch_dim d)
{
    switch (d) {
    case ARCH_DIM_NONE: return 0;
    case ARCH_DIM_EMBD: return hp->n_embd;
    case ARCH_DIM_Q: return (int64_t)hp->n_head * hp->head_dim;
    case ARCH_DIM_KV: return (int64_t)hp->n_head_kv * hp->head_dim;
    case ARCH_DIM_HEAD: return hp->head_dim;
    case ARCH_DIM_HALF_HEAD: return hp->head_dim / 2;
    case ARCH_DIM_FF: return hp->n_ff;
    case ARCH_DIM_VOCAB: return hp->n_vocab;
    case ARCH_DIM_FF_EXP: return hp->n_ff_exp;
    case ARCH_DIM_EXPERT: return hp->n_expert;
    case ARCH_DIM_QKV: return (int64_t)(hp->n_head + 2 * hp->n_head_kv) * hp->head_dim;
    case ARCH_DIM_FF2: return 2 * (int64_t)hp->n_ff;
    case ARCH_DIM_FF_SHEXP: return (int64_t)hp->n_ff_exp * hp->n_expert_shared;
    case ARCH_DIM_HALF_ROT: return hp->n_rot / 2;
    }
    return -1;
}

/* Bind the tensors of `list` that the features call for into the struct at base ("blk.N."
 * before each name when il >= 0); one the features do not call for stays unbound even when
 * the file has it (the forward pass would not read it). */
static bool bind_list(loader *L, const arch_tensor *list, arch_features features, int il, void *base)
{
    for (const arch_tensor *t = list; t->name; t++) {
        if (!arch_tensor_needed(t, features)) continue;
        char name[128];
        if (il >= 0) snprintf(name, sizeof name, "blk.%d.%s", il, t->name);
        else snprintf(name, sizeof name, "%s", t->name);
        const model_hparams *hp = &L->m->hp;
        tensor_spec spec = {name, dim_value(hp, t->ne0), dim_value(hp, t->ne1), dim_value(hp, t->ne2), !t->optional,
                            t->f32_only};
        if (!bind(L, (model_tensor *)((char *)base + t->offset), spec)) return false;
    }
    return true;
}

/* The fewest tensors a layer of this family needs: a block_count the file cannot back is
 * refused before the layer table is sized by it. */
static int64_t min_layer_tensors(const arch_desc *d, bool leading)
{
    int64_t least = INT64_MAX;
    for (int p = leading ? -1 : 0; p < d->pattern_len; p++) {
        arch_features f = arch_layer_features(p < 0 ? &d->leading : &d->pattern[p]);
        int64_t n = 0;
        for (const arch_tensor *t = d->layer_tensors; t->name; t++) n += !t->optional && arch_tensor_needed(t, f);
        if (n < least) least = n;
    }
    return least;
}

static bool bind_tensors(loader *L)
{
    model *m = L->m;
    const model_hparams *hp = &m->hp;
    const arch_desc *d = m->desc;
    if (d->pattern_len < 1 || d->pattern_len > ARCH_PATTERN_MAX)
        return fail(L, "%s: the family's layer pattern has %d entries (1 to %d)", d->name, d->pattern_len,
                    ARCH_PATTERN_MAX);
    for (int p = 0; p < d->pattern_len; p++)
        if (!arch_layer_valid(&d->pattern[p])) return fail(L, "%s: layer pattern entry %d is not a recipe", d->name, p);
    if (hp->n_dense_lead && !arch_layer_valid(&d->leading)) return fail(L, "%s: the leading layers' recipe is not one", d->name);
    if (!read_vocab(L) || !bind_list(L, d->globals, 0, -1, m)) return false;
    m->hp.tied_output = m->output.data == NULL;
    if (m->hp.tied_output) m->output = m->tok_embd;
    if ((int64_t)hp->n_layer * min_layer_tensors(d, hp->n_dense_lead > 0) > gguf_n_tensors(L->f))
        return fail(L, "%s.block_count %d needs more tensors than the file's %lld", d->name, hp->n_layer,
                    (long long)gguf_n_tensors(L->f));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return fail(L, "out of memory for %d layers", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer *ly = &m->layers[il];
        ly->recipe = il < hp->n_dense_lead ? d->leading : d->pattern[il % d->pattern_len];
        if (!bind_list(L, d->layer_tensors, arch_layer_features(&ly->recipe), il, ly)) return false;
    }
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

arch_features model_layer_features(const model *m, int il)
{
    arch_features f = arch_layer_features(&m->layers[il].recipe);
    if (m->hp.n_rot < m->hp.head_dim) f |= ARCH_F_ROPE_PARTIAL;
    if (m->rope_factors_short.data || m->rope_factors_long.data || m->hp.rope_attn_factor != 1.0f)
        f |= ARCH_F_ROPE_LONGROPE;
    return f;
}

int model_check_features(const model *m, arch_features supported, const char *backend, char *err, size_t errlen)
{
    for (int il = 0; il < m->hp.n_layer; il++) {
        arch_features missing = model_layer_features(m, il) & ~supported;
        if (missing) {
            snprintf(err, errlen, "the %s backend does not implement %s (layer %d of %s)", backend,
                     arch_feature_name(missing & -missing), il, m->desc->name);
            return -1;
        }
    }
    return 0;
}

void model_free(model *m)
{
    if (!m) return;
    gguf_close(m->gguf);
    free(m->layers);
    free(m);
}
