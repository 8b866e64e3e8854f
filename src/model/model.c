/* model.c - bind a validated GGUF file to a model: read the architecture's hyper-parameters,
 * find every weight by its ggml name, and check each one's shape and type against what the
 * hyper-parameters imply.  After model_from_gguf succeeds a backend may trust every shape
 * without checking again; nothing here computes. */
#include "model.h"

#include <math.h>
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

/* "<arch>.<suffix>" as an integer in [lo, HPARAM_MAX] (lo: 1, or 0 for a count); *out keeps
 * its default when the key is absent and !required. */
static bool read_int_from(loader *L, const char *suffix, bool required, int64_t lo, int *out)
{
    char key[128];
    key_name(L, suffix, key, sizeof key);
    int64_t v;
    if (!gguf_get_i64(L->f, key, &v)) return absent_ok(L, key, required, "an integer");
    if (v < lo || v > HPARAM_MAX)
        return fail(L, "key '%s' = %lld is out of range [%lld, %d]", key, (long long)v, (long long)lo, HPARAM_MAX);
    *out = (int)v;
    return true;
}

static bool read_int(loader *L, const char *suffix, bool required, int *out)
{
    return read_int_from(L, suffix, required, 1, out);
}

/* Element j of an array key of integers or bools (index i); false for another type.  The
 * metadata section packs values without alignment: each is copied out, never dereferenced. */
static bool arr_int(const gguf_file *f, int64_t i, uint64_t j, int64_t *v)
{
    const unsigned char *d = gguf_arr_data(f, i);
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } x;
    static const size_t width[] = {[GGUF_VT_UINT8] = 1, [GGUF_VT_INT8] = 1,  [GGUF_VT_UINT16] = 2,
                                   [GGUF_VT_INT16] = 2, [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4,
                                   [GGUF_VT_BOOL] = 1,  [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8};
    const gguf_vtype t = gguf_arr_type(f, i);
    if ((size_t)t >= sizeof width / sizeof width[0] || width[t] == 0) return false;
    memcpy(&x, d + j * width[t], width[t]);
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_BOOL: *v = x.u8; return true;
    case GGUF_VT_INT8: *v = x.i8; return true;
    case GGUF_VT_UINT16: *v = x.u16; return true;
    case GGUF_VT_INT16: *v = x.i16; return true;
    case GGUF_VT_UINT32: *v = x.u32; return true;
    case GGUF_VT_INT32: *v = x.i32; return true;
    case GGUF_VT_UINT64: *v = (int64_t)x.u64; return true;
    case GGUF_VT_INT64: *v = x.i64; return true;
    default: return false;
    }
}

/* The key "<arch>.<suffix>" when it is an array: its index, after checking that it holds one
 * integer (or bool) in [lo, HPARAM_MAX] per layer; -1 when it is not an array (or absent);
 * -2 (and the error) when it is a bad one.  *max gets its largest value. */
static int64_t layer_array(loader *L, const char *suffix, int64_t lo, int *max)
{
    char key[128];
    key_name(L, suffix, key, sizeof key);
    int64_t i = gguf_find_key(L->f, key);
    if (i < 0 || gguf_kv_type(L->f, i) != GGUF_VT_ARRAY) return -1;
    if (gguf_arr_len(L->f, i) != (uint64_t)L->m->hp.n_layer) {
        fail(L, "key '%s' has %llu entries, expected one per layer (%d)", key,
             (unsigned long long)gguf_arr_len(L->f, i), L->m->hp.n_layer);
        return -2;
    }
    *max = 0;
    for (uint64_t j = 0; j < gguf_arr_len(L->f, i); j++) {
        int64_t v;
        if (!arr_int(L->f, i, j, &v)) {
            fail(L, "key '%s' is an array of the wrong type: expected integers", key);
            return -2;
        }
        if (v < lo || v > HPARAM_MAX) {
            fail(L, "key '%s'[%llu] = %lld is out of range [%lld, %d]", key, (unsigned long long)j, (long long)v,
                 (long long)lo, HPARAM_MAX);
            return -2;
        }
        if (v > *max) *max = (int)v;
    }
    return i;
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

/* YaRN's correction range (transformers' _compute_yarn_parameters): the pair index at which a
 * frequency turns `rotations` times over the original context, for beta_fast (low) and
 * beta_slow (high), kept inside [0, head_dim - 1]. */
static double yarn_corr_dim(double rotations, int head_dim, double base, double n_ctx_orig)
{
    return head_dim * log(n_ctx_orig / (rotations * 2.0 * M_PI)) / (2.0 * log(base));
}

/* ARCH_YARN_UNROUNDED (gpt-oss): the range as computed over the head, cos and sin times
 * 0.1 ln(factor) + 1.  ARCH_YARN_MSCALE (DeepSeek): the range floored and ceiled over the
 * rotated dimensions, cos and sin as they are, the scores times mscale^2 instead. */
static bool read_yarn(loader *L)
{
    model_hparams *hp = &L->m->hp;
    const bool mscale = L->m->desc->yarn == ARCH_YARN_MSCALE;
    float n_orig = 0, beta_fast = 32.0f, beta_slow = 1.0f;
    if (!read_float(L, "rope.scaling.factor", true, &hp->yarn_factor) ||
        !read_float(L, "rope.scaling.original_context_length", true, &n_orig) ||
        !read_float(L, "rope.scaling.yarn_beta_fast", false, &beta_fast) ||
        !read_float(L, "rope.scaling.yarn_beta_slow", false, &beta_slow) ||
        (mscale && !read_float(L, "rope.scaling.yarn_log_multiplier", false, &hp->yarn_log_mul)))
        return false;
    const int dim = mscale && hp->n_rot ? hp->n_rot : hp->head_dim;
    double low = yarn_corr_dim(beta_fast, dim, hp->rope_base, n_orig);
    double high = yarn_corr_dim(beta_slow, dim, hp->rope_base, n_orig);
    if (mscale) low = floor(low), high = ceil(high);
    hp->yarn_low = low > 0 ? (float)low : 0;
    hp->yarn_high = high < dim - 1 ? (float)high : (float)(dim - 1);
    if (hp->yarn_high == hp->yarn_low) hp->yarn_high += 0.001f; /* transformers' guard */
    const float m = hp->yarn_factor > 1 ? 0.1f * logf(hp->yarn_factor) + 1.0f : 1.0f;
    if (!mscale) {
        hp->rope_attn_factor = m;
        return true;
    }
    const float ms = hp->yarn_factor > 1 ? 1.0f + hp->yarn_log_mul * logf(hp->yarn_factor) : 1.0f;
    hp->attn_mscale2 = ms * ms;
    return true;
}

/* Linear scaling stretches positions; YaRN (for a family that declares it) blends the
 * frequencies; other schemes change them in ways this engine does not implement, so they are
 * refused rather than silently ignored. */
static bool read_rope_scaling(loader *L)
{
    char key[128];
    key_name(L, "rope.scaling.type", key, sizeof key);
    size_t len;
    const char *type = gguf_get_str(L->f, key, &len);
    if (!type || (len == 4 && memcmp(type, "none", 4) == 0)) return true;
    bool yarn = L->m->desc->yarn != ARCH_YARN_NONE;
    if (yarn && len == 4 && memcmp(type, "yarn", 4) == 0) return read_yarn(L);
    if (!(len == 6 && memcmp(type, "linear", 6) == 0)) {
        int shown = len > 32 ? 32 : (int)len;
        return fail(L, "key '%s' = '%.*s' is not supported (none, linear%s)", key, shown, type, yarn ? ", yarn" : "");
    }
    return read_float(L, "rope.scaling.factor", true, &L->m->hp.rope_scale);
}

/* A list of the family's keys, in its order; each lands in its model_hparams field. */
static bool read_keys(loader *L, const arch_key *list)
{
    for (const arch_key *k = list; k && k->suffix; k++) {
        char *field = (char *)&L->m->hp + k->offset;
        if (k->layer_offset) { /* one per layer: the largest here, each in its layer later */
            int64_t arr = layer_array(L, k->suffix, k->kind == ARCH_KEY_COUNT ? 0 : 1, (int *)field);
            if (arr == -2) return false;
            if (arr >= 0) continue;
        }
        if (k->kind == ARCH_KEY_INT) {
            if (k->dflt != 0) *(int *)field = (int)k->dflt;
            if (!read_int(L, k->suffix, k->required, (int *)field)) return false;
        } else if (k->kind == ARCH_KEY_COUNT) {
            if (!read_int_from(L, k->suffix, k->required, 0, (int *)field)) return false;
        } else {
            if (k->dflt != 0) *(float *)field = k->dflt;
            if (!read_float(L, k->suffix, k->required, (float *)field)) return false;
        }
    }
    return true;
}

/* Every feature of the family's layer pattern. */
static arch_features pattern_features(const arch_desc *d)
{
    arch_features f = 0;
    for (int p = 0; p < d->pattern_len && p < ARCH_PATTERN_MAX; p++)
        if (arch_layer_valid(&d->pattern[p])) f |= arch_layer_features(&d->pattern[p]);
    return f;
}

/* Gated DeltaNet's shapes: v heads share the q/k heads evenly (v head h reads q/k head
 * h mod group_count), a v head is as wide as a q/k head, and the family's pattern is the
 * file's full_attention_interval. */
static bool check_ssm(loader *L)
{
    const model_hparams *hp = &L->m->hp;
    const char *arch = L->m->desc->name;
    /* a family or file without them (zero) is refused here, before anything divides by them */
    if (hp->ssm_groups < 1 || hp->ssm_vheads < 1 || hp->ssm_state < 1 || hp->ssm_conv < 1)
        return fail(L, "%s: gated DeltaNet layers need ssm.group_count, ssm.time_step_rank, ssm.state_size and "
                    "ssm.conv_kernel of at least 1 (%d, %d, %d, %d)", arch, hp->ssm_groups, hp->ssm_vheads,
                    hp->ssm_state, hp->ssm_conv);
    if (hp->ssm_vheads % hp->ssm_groups != 0)
        return fail(L, "%s.ssm.time_step_rank %d (v heads) is not a multiple of ssm.group_count %d", arch,
                    hp->ssm_vheads, hp->ssm_groups);
    if ((int64_t)hp->ssm_vheads * hp->ssm_state != hp->ssm_inner)
        return fail(L, "%s.ssm.inner_size %d is not ssm.time_step_rank %d x ssm.state_size %d", arch, hp->ssm_inner,
                    hp->ssm_vheads, hp->ssm_state);
    if ((int64_t)hp->ssm_vheads * hp->ssm_state * hp->ssm_state > HPARAM_MAX || hp->ssm_conv > 64)
        return fail(L, "%s: the DeltaNet state (%d v heads of %d x %d, conv kernel %d) is too large", arch,
                    hp->ssm_vheads, hp->ssm_state, hp->ssm_state, hp->ssm_conv);
    if (hp->full_attn_interval != L->m->desc->pattern_len)
        return fail(L, "%s.full_attention_interval %d: this family's layer pattern repeats every %d layers", arch,
                    hp->full_attn_interval, L->m->desc->pattern_len);
    return true;
}

/* Multi-head latent attention's shapes.  llama.cpp's converter declares the attention as one
 * head shared by all: key_length = kv_lora_rank + n_rot (the cache row), value_length =
 * kv_lora_rank, the per-head sizes in key_length_mla / value_length_mla; without those keys
 * (an older file) key_length and value_length are the per-head sizes.  Either way the model's
 * head_dim becomes the cache row and n_head_kv 1. */
static bool check_mla(loader *L)
{
    model_hparams *hp = &L->m->hp;
    const char *arch = L->m->desc->name;
    if (hp->n_rot < 2 || hp->n_rot % 2 != 0)
        return fail(L, "%s: latent attention needs an even rope.dimension_count (the RoPE key's width), found %d",
                    arch, hp->n_rot);
    const bool split = hp->key_length_mla > 0;
    const int qk = split ? hp->key_length_mla : hp->head_dim, v = split ? hp->value_length_mla : hp->value_length;
    if (qk <= hp->n_rot)
        return fail(L, "%s.attention.%s %d must be more than rope.dimension_count %d", arch,
                    split ? "key_length_mla" : "key_length", qk, hp->n_rot);
    if (v < 1)
        return fail(L, "missing key '%s.attention.%s'", arch, split ? "value_length_mla" : "value_length");
    if (split && hp->head_dim && hp->head_dim != hp->kv_lora_rank + hp->n_rot)
        return fail(L, "%s.attention.key_length %d is not kv_lora_rank %d + rope.dimension_count %d", arch,
                    hp->head_dim, hp->kv_lora_rank, hp->n_rot);
    if (split && hp->value_length && hp->value_length != hp->kv_lora_rank)
        return fail(L, "%s.attention.value_length %d is not kv_lora_rank %d", arch, hp->value_length,
                    hp->kv_lora_rank);
    if ((int64_t)hp->n_head * (qk + v) > HPARAM_MAX || (int64_t)hp->kv_lora_rank + hp->n_rot > HPARAM_MAX)
        return fail(L, "%s: %d heads of %d + %d (kv_lora_rank %d) are too large", arch, hp->n_head, qk, v,
                    hp->kv_lora_rank);
    hp->mla_nope = qk - hp->n_rot;
    hp->mla_v = v;
    hp->head_dim = hp->kv_lora_rank + hp->n_rot;
    hp->n_head_kv = 1;
    return true;
}

/* How the file's MoE routes: the scoring function (expert_gating_func: 1 softmax, 2 sigmoid;
 * absent: the family's recipe), whether the chosen weights are renormalised
 * (expert_weights_norm) and the expert groups. */
static bool read_routing(loader *L)
{
    model_hparams *hp = &L->m->hp;
    const char *arch = L->m->desc->name;
    char key[128];
    key_name(L, "expert_weights_norm", key, sizeof key);
    int64_t norm;
    hp->expert_weights_norm = !L->m->desc->expert_weights_raw;
    if (gguf_find_key(L->f, key) >= 0 && !gguf_get_bool(L->f, key, &hp->expert_weights_norm)) {
        if (!gguf_get_i64(L->f, key, &norm) || norm < 0 || norm > 1)
            return fail(L, "key '%s' has the wrong type: expected a bool", key);
        hp->expert_weights_norm = norm == 1;
    }
    if (hp->expert_gating > 2)
        return fail(L, "%s.expert_gating_func %d is not one of 1 (softmax) and 2 (sigmoid)", arch, hp->expert_gating);
    if (hp->n_expert_groups <= 1) return true;
    const int per_group = hp->n_expert / hp->n_expert_groups;
    if (hp->n_expert % hp->n_expert_groups != 0 || hp->n_group_used < 1 || hp->n_group_used > hp->n_expert_groups)
        return fail(L, "%s: %d experts in expert_group_count %d groups, expert_group_used_count %d kept: not a "
                    "grouping", arch, hp->n_expert, hp->n_expert_groups, hp->n_group_used);
    if (hp->n_expert_used > per_group * hp->n_group_used || (hp->expert_gating == 2 && per_group < 2))
        return fail(L, "%s.expert_used_count %d does not fit %d kept groups of %d experts", arch,
                    hp->n_expert_used, hp->n_group_used, per_group);
    return true;
}

/* A multi-token-prediction head (Qwen3.5, Qwen3-Next, GLM, DeepSeek files keep it): its
 * nextn_predict_layers blocks are counted in block_count after the layers that run.  The model
 * runs the first block_count - nextn_predict_layers layers; bind_mtp binds Qwen3.5's block for
 * speculative decoding (the other families' stay unbound). */
static bool read_mtp(loader *L)
{
    model_hparams *hp = &L->m->hp;
    char key[128];
    key_name(L, "nextn_predict_layers", key, sizeof key);
    int64_t v;
    if (!gguf_get_i64(L->f, key, &v)) return absent_ok(L, key, false, "an integer");
    if (v < 0 || v >= hp->n_layer)
        return fail(L, "key '%s' = %lld: block_count %d must keep at least one layer besides them", key, (long long)v,
                    hp->n_layer);
    hp->n_mtp = (int)v;
    hp->n_layer -= hp->n_mtp;
    return true;
}

/* <arch>.pooling_type: an embedding model says how its sentence vector is made (0..4, as
 * engine_pooling); absent: -1.  An encoder also needs its token-type count (bert: 2). */
static bool read_pooling(loader *L)
{
    model_hparams *hp = &L->m->hp;
    char key[128];
    key_name(L, "pooling_type", key, sizeof key);
    int64_t v;
    hp->pooling = -1;
    if (gguf_get_i64(L->f, key, &v)) {
        if (v < 0 || v > 4) return fail(L, "key '%s' = %lld is not a pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)",
                                        key, (long long)v);
        hp->pooling = (int)v;
    } else if (!absent_ok(L, key, false, "an integer")) {
        return false;
    }
    hp->encoder = L->m->desc->encoder;
    if (!hp->encoder) return true;
    hp->n_token_types = 2;
    if (gguf_get_i64(L->f, "tokenizer.ggml.token_type_count", &v)) {
        if (v < 1 || v > 1024) return fail(L, "key 'tokenizer.ggml.token_type_count' = %lld is out of range [1, 1024]", (long long)v);
        hp->n_token_types = (int)v;
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
    hp->expert_weights_norm = true;
    hp->attn_mscale2 = 1.0f;
    hp->rope_neox = L->m->desc->rope == ARCH_ROPE_NEOX;
    hp->ssm_grouped = L->m->desc->ssm_heads == ARCH_SSM_GROUPED;
    if (!read_keys(L, L->m->desc->keys)) return false;
    for (int i = 0; i < ARCH_KEY_LISTS_MAX && L->m->desc->more_keys[i]; i++)
        if (!read_keys(L, L->m->desc->more_keys[i])) return false;
    const char *arch = L->m->desc->name;
    /* A family's key list must give these (a test's descriptor could forget one). */
    if (hp->n_ctx_train < 1 || hp->n_embd < 1 || hp->n_layer < 1 || hp->n_head < 1 || !(hp->rms_eps > 0))
        return fail(L, "%s: the family declares no key for one of context_length, embedding_length, block_count, "
                    "attention.head_count, attention.layer_norm_rms_epsilon", arch);
    if (!read_mtp(L)) return false;
    if (hp->n_dense_lead > hp->n_layer)
        return fail(L, "%s.leading_dense_block_count %d is more than block_count %d", arch, hp->n_dense_lead,
                    hp->n_layer);
    if (hp->n_expert_shared > 0 && hp->n_ff_shexp == 0) { /* GLM: the shared experts as one GLU */
        if ((int64_t)hp->n_ff_exp * hp->n_expert_shared > HPARAM_MAX)
            return fail(L, "%s.expert_shared_count %d x expert_feed_forward_length %d is too large", arch,
                        hp->n_expert_shared, hp->n_ff_exp);
        hp->n_ff_shexp = hp->n_ff_exp * hp->n_expert_shared;
    }
    const arch_features lead = hp->n_dense_lead ? arch_layer_features(&L->m->desc->leading) : 0;
    if (hp->n_ff < 1 && ((pattern_features(L->m->desc) | lead) & ARCH_F_FFN_GLU))
        return fail(L, "missing key '%s.feed_forward_length'", arch);
    if ((pattern_features(L->m->desc) & ARCH_F_ATTN_MLA) && !check_mla(L)) return false;
    if (hp->n_expert > 0 && !read_routing(L)) return false;
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
    if (!read_pooling(L)) return false;
    if (hp->n_expert_used > hp->n_expert)
        return fail(L, "%s.expert_used_count %d is more than expert_count %d", arch, hp->n_expert_used, hp->n_expert);
    if (!read_rope_scaling(L)) return false; /* after head_dim: YaRN's range is in its pairs */
    const arch_desc *d = L->m->desc;
    bool moe = false;
    for (int p = 0; p < d->pattern_len && p < ARCH_PATTERN_MAX; p++) moe |= d->pattern[p].ffn == ARCH_FFN_MOE;
    moe |= d->moe_pattern != NULL;
    if (d->moe_pattern && hp->n_expert > 0 && (hp->n_expert_used < 1 || hp->n_ff_exp < 1))
        return fail(L, "%s.expert_count is %d but expert_used_count or expert_feed_forward_length is not set", arch,
                    hp->n_expert);
    if (hp->n_expert > 0 && !moe)
        return fail(L, "%s.expert_count is %d: the %s family's mixture-of-experts block is not implemented", arch,
                    hp->n_expert, arch);
    if (hp->n_kv_shared >= hp->n_layer)
        return fail(L, "%s.attention.shared_kv_layers %d leaves no layer computing K/V (of %d)", arch,
                    hp->n_kv_shared, hp->n_layer);
    if (hp->head_dim_swa % 2 != 0 || (int64_t)hp->n_head * hp->head_dim_swa > HPARAM_MAX)
        return fail(L, "%s.attention.key_length_swa %d must be even and fit", arch, hp->head_dim_swa);
    if ((int64_t)hp->n_embd_ple * hp->n_layer > HPARAM_MAX)
        return fail(L, "%s.embedding_length_per_layer_input %d x %d layers is too large", arch, hp->n_embd_ple,
                    hp->n_layer);
    int max;
    if (d->pattern_key && layer_array(L, d->pattern_key, 0, &max) == -2) return false; /* checked once */
    hp->embd_scale = d->embed_scale ? sqrtf((float)hp->n_embd) : 1.0f;
    hp->attn_scalar = d->attn_scalar ? d->attn_scalar(hp) : (float)hp->head_dim;
    if (hp->rope_base_swa == 0) hp->rope_base_swa = hp->rope_base;
    if (hp->n_rot == 0) hp->n_rot = hp->head_dim;
    if (hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)
        return fail(L, "%s.rope.dimension_count %d must be even and at most the head dimension %d", arch, hp->n_rot,
                    hp->head_dim);
    return (pattern_features(L->m->desc) & ARCH_F_ATTN_LINEAR) ? check_ssm(L) : true;
}

/* Element il of "<arch>.<suffix>" when it is an array (layer_array checked it when the keys
 * were read), else false. */
static bool layer_element(loader *L, const char *suffix, int il, int64_t *v)
{
    char key[128];
    key_name(L, suffix, key, sizeof key);
    int64_t i = gguf_find_key(L->f, key);
    return i >= 0 && gguf_kv_type(L->f, i) == GGUF_VT_ARRAY && arr_int(L->f, i, (uint64_t)il, v);
}

/* Layer il's values of the per-layer keys of list (an array's element, or the scalar). */
static void layer_keys(loader *L, const arch_key *list, int il)
{
    for (const arch_key *k = list; k && k->suffix; k++) {
        if (!k->layer_offset) continue;
        int *field = (int *)((char *)&L->m->layers[il] + k->layer_offset);
        int64_t v;
        *field = layer_element(L, k->suffix, il, &v) ? (int)v : *(const int *)((const char *)&L->m->hp + k->offset);
    }
}

/* Layer il's recipe: the leading one for the first n_dense_lead layers, else pattern[il % len],
 * or from the family's per-layer bool key. */
static bool layer_recipe(loader *L, model_layer *ly, int il)
{
    const arch_desc *d = L->m->desc;
    const model_hparams *hp = &L->m->hp;
    const arch_layer *pattern = d->moe_pattern && hp->n_expert > 0 ? d->moe_pattern : d->pattern;
    if (il < hp->n_dense_lead) {
        ly->recipe = d->leading;
        return true;
    }
    if (!d->pattern_key) {
        ly->recipe = pattern[il % d->pattern_len];
        /* the file's scoring function and expert groups, where it states them */
        if (ly->recipe.ffn == ARCH_FFN_MOE && hp->expert_gating)
            ly->recipe.router = hp->expert_gating == 2 ? ARCH_ROUTER_SIGMOID_BIAS : ARCH_ROUTER_SOFTMAX_TOPK;
        if (ly->recipe.ffn == ARCH_FFN_MOE && hp->n_expert_groups > 1) ly->recipe.ffn_extras |= ARCH_FFN_EXPERT_GROUPS;
        return true;
    }
    int64_t sliding;
    if (!layer_element(L, d->pattern_key, il, &sliding))
        return fail(L, "missing key '%s.%s' (one bool per layer)", d->name, d->pattern_key);
    ly->recipe = pattern[sliding ? 0 : 1];
    return true;
}

/* A layer's shapes, window, RoPE and KV source from its recipe and the hyper-parameters; a
 * rotary layer's recipe gains ARCH_ATTN_ROPE_PARTIAL where the file's rope.dimension_count is
 * below its head dimension and ARCH_ATTN_ROPE_LONGROPE where the file has LongRoPE factors or
 * its attention factor (the short factors are then its divisors: model_rope_freqs). */
static bool layer_attention(loader *L, model_layer *ly, int il)
{
    const model_hparams *hp = &L->m->hp;
    const model *m = L->m;
    ly->head_dim = hp->head_dim;
    ly->n_head_kv = ly->n_head_kv ? ly->n_head_kv : hp->n_head_kv;
    ly->n_ff = ly->n_ff ? ly->n_ff : hp->n_ff;
    if (hp->n_head % ly->n_head_kv != 0)
        return fail(L, "layer %d: %d heads are not a multiple of its %d kv heads", il, hp->n_head, ly->n_head_kv);
    ly->window = 0;
    ly->rope_base = hp->rope_base;
    ly->rope_scale = hp->rope_scale;
    ly->rope_freqs = L->m->rope_freqs.data;
    /* latent attention turns its RoPE key and query parts whole: never partial */
    const bool rotary = ly->recipe.attn != ARCH_ATTN_LINEAR && ly->recipe.attn != ARCH_ATTN_MLA &&
                        m->desc->rope != ARCH_ROPE_NONE;
    if (rotary && hp->n_rot < ly->head_dim) ly->recipe.attn_extras |= ARCH_ATTN_ROPE_PARTIAL;
    if (rotary && (m->rope_factors_short.data || m->rope_factors_long.data ||
                   (hp->rope_attn_factor != 1.0f && hp->yarn_factor == 0))) {
        ly->recipe.attn_extras |= ARCH_ATTN_ROPE_LONGROPE;
        ly->rope_freqs = m->rope_factors_short.data;
    }
    ly->kv_source = il;
    const int first_shared = hp->n_layer - hp->n_kv_shared;
    for (int j = first_shared - 1; il >= first_shared && il < hp->n_layer && j >= 0; j--) { /* not an MTP block */
        if (L->m->layers[j].recipe.attn == ly->recipe.attn) {
            ly->kv_source = j;
            break;
        }
    }
    if (il >= first_shared && il < hp->n_layer && ly->kv_source == il)
        return fail(L, "layer %d shares K/V but no earlier layer has its kind of attention", il);
    if (ly->recipe.attn != ARCH_ATTN_SLIDING) return true;
    if (hp->head_dim_swa) ly->head_dim = hp->head_dim_swa;
    if (hp->n_swa < 1)
        return fail(L, "layer %d of %s is a sliding-window layer but %s.attention.sliding_window is not set", il,
                    L->m->desc->name, L->m->desc->name);
    ly->window = hp->n_swa;
    if (L->m->desc->swa_rope == ARCH_SWA_ROPE_LOCAL) {
        ly->rope_base = hp->rope_base_swa;
        ly->rope_scale = 1.0f;
        ly->rope_freqs = NULL; /* the file's factors are the full layers' */
    }
    return true;
}

/* A fused matrix's parts as the tensors the forward pass reads: wq, wk and wv the row ranges of
 * attn_qkv, w_gate and w_up the two halves of a fused ffn_up (gate first).  The rows are the
 * same bytes, so each part's products are the ones the separate matrices would give. */
static void layer_split_fused(const model_hparams *hp, model_layer *ly)
{
    if (ly->wqkv.data) {
        const int64_t q = (int64_t)hp->n_head * ly->head_dim, kv = (int64_t)ly->n_head_kv * ly->head_dim;
        ly->wq = model_tensor_rows(&ly->wqkv, 0, q);
        ly->wk = model_tensor_rows(&ly->wqkv, q, kv);
        ly->wv = model_tensor_rows(&ly->wqkv, q + kv, kv);
    }
    if (ly->w_gate_up.data) {
        ly->w_gate = model_tensor_rows(&ly->w_gate_up, 0, ly->n_ff);
        ly->w_up = model_tensor_rows(&ly->w_gate_up, ly->n_ff, ly->n_ff);
    }
}

/* A latent-attention layer's query: the q LoRA pair when q_lora_rank is set, else attn_q; and
 * its split K/V up-projections (a file with the fused attn_kv_b of llama.cpp's older
 * converter is refused by that name: the absorbed form here needs the split per head). */
static bool mla_complete(loader *L, const model_layer *ly, int il)
{
    const bool lora = L->m->hp.q_lora_rank > 0;
    const model_tensor *need[] = {&ly->wq_a, &ly->q_a_norm, &ly->wq_b, &ly->wq};
    static const char *const names[] = {"attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight", "attn_q.weight"};
    const bool wanted[] = {lora, lora, lora, !lora};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        if (wanted[i] && !need[i]->data) return fail(L, "missing tensor 'blk.%d.%s'", il, names[i]);
        if (!wanted[i] && need[i]->data)
            return fail(L, "tensor 'blk.%d.%s' is there but %s.attention.q_lora_rank is %d", il, names[i],
                        L->m->desc->name, L->m->hp.q_lora_rank);
    }
    char fused[64];
    snprintf(fused, sizeof fused, "blk.%d.attn_kv_b.weight", il);
    if ((!ly->wk_b.data || !ly->wv_b.data) && gguf_find_tensor(L->f, fused))
        return fail(L, "tensor '%s': the fused K/V up-projection (llama.cpp's converter before the split into "
                    "attn_k_b and attn_v_b) is not supported; convert the model again", fused);
    if (!ly->wk_b.data) return fail(L, "missing tensor 'blk.%d.attn_k_b.weight'", il);
    if (!ly->wv_b.data) return fail(L, "missing tensor 'blk.%d.attn_v_b.weight'", il);
    return true;
}

/* What optional entries of a family's lists are not optional for this layer: its own K/V
 * (unless it shares an earlier layer's), the per-layer embeddings' tensors when the file
 * has them, and the shared expert's gate when the recipe gates it. */
static bool layer_complete(loader *L, const model_layer *ly, int il)
{
    const model_tensor *need[] = {&ly->wk, &ly->wv, &ly->k_norm, &ly->ple_gate, &ly->ple_proj, &ly->ple_post_norm,
                                  &ly->ffn_gate_inp_shexp};
    static const char *const names[] = {"attn_k.weight", "attn_v.weight", "attn_k_norm.weight", "inp_gate.weight",
                                        "proj.weight", "post_norm.weight", "ffn_gate_inp_shexp.weight"};
    if (ly->recipe.attn == ARCH_ATTN_MLA) return mla_complete(L, ly, il);
    const bool own_kv = ly->kv_source == il && ly->recipe.attn != ARCH_ATTN_LINEAR, ple = L->m->hp.n_embd_ple > 0;
    const bool qk_norm = ly->recipe.attn_extras & ARCH_ATTN_QK_NORM;
    const bool wanted[] = {own_kv, own_kv && !L->m->desc->v_from_k, own_kv && qk_norm, ple, ple, ple,
                           ly->recipe.ffn_extras & ARCH_FFN_SHEXP_GATE};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (wanted[i] && !need[i]->data) return fail(L, "missing tensor 'blk.%d.%s'", il, names[i]);
    return true;
}

/* Find `name`, check it is [ne0] (ne1 == 0), [ne0, ne1] (ne2 == 0) or [ne0, ne1, ne2] and of a
 * usable type, and fill *t.  An absent optional tensor leaves *t zeroed. */
typedef struct tensor_spec {
    const char *name;
    int64_t ne0, ne1, ne2;
    const char *slices; /* what the third dimension counts: "experts", "heads" */
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
        return fail(L, "tensor '%s': expected shape [%lld, %lld, %lld] (the last: %s), found %s", spec.name,
                    (long long)spec.ne0, (long long)spec.ne1, (long long)spec.ne2, spec.slices, found);
    }
    if (spec.f32_only && g->type != GGML_TYPE_F32)
        return fail(L, "tensor '%s': type %s, expected F32", spec.name, ggml_type_name(g->type));
    if (!ggml_type_supported(g->type))
        return fail(L, "tensor '%s': type %s is not supported (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K "
                       "Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4 IQ3_S IQ3_XXS IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S)",
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
    if (!read_int(L, "vocab_size", false, &declared)) return false;
    if (declared != m->hp.n_vocab)
        return fail(L, "%s.vocab_size %d does not match token_embd.weight's %d rows", m->desc->name, declared,
                    m->hp.n_vocab);
    int64_t tok = gguf_find_key(L->f, "tokenizer.ggml.tokens");
    if (tok >= 0 && gguf_kv_type(L->f, tok) == GGUF_VT_ARRAY && gguf_arr_len(L->f, tok) != (uint64_t)m->hp.n_vocab)
        return fail(L, "tokenizer.ggml.tokens has %llu entries but token_embd.weight has %d rows",
                    (unsigned long long)gguf_arr_len(L->f, tok), m->hp.n_vocab);
    return true;
}

/* A dimension's size; a layer's own shapes for a layer tensor (ly), the model's for a global. */
static int64_t dim_value(const model_hparams *hp, const model_layer *ly, arch_dim d)
{
    const int64_t hd = ly ? ly->head_dim : hp->head_dim, kv = ly ? ly->n_head_kv : hp->n_head_kv;
    switch (d) {
    case ARCH_DIM_NONE: return 0;
    case ARCH_DIM_EMBD: return hp->n_embd;
    case ARCH_DIM_Q: return (int64_t)hp->n_head * hd;
    case ARCH_DIM_KV: return kv * hd;
    case ARCH_DIM_HEAD: return hd;
    case ARCH_DIM_HALF_HEAD: return hd / 2;
    case ARCH_DIM_FF: return ly ? ly->n_ff : hp->n_ff;
    case ARCH_DIM_VOCAB: return hp->n_vocab;
    case ARCH_DIM_FF_EXP: return hp->n_ff_exp;
    case ARCH_DIM_EXPERT: return hp->n_expert;
    case ARCH_DIM_ONE: return 1;
    case ARCH_DIM_PLE: return hp->n_embd_ple;
    case ARCH_DIM_PLE_ALL: return (int64_t)hp->n_embd_ple * hp->n_layer;
    case ARCH_DIM_FF_EXP2: return 2 * (int64_t)hp->n_ff_exp;
    case ARCH_DIM_Q_GATE: return 2 * (int64_t)hp->n_head * hp->head_dim;
    case ARCH_DIM_FF_SHEXP: return hp->n_ff_shexp;
    case ARCH_DIM_SSM_CONV: return hp->ssm_conv;
    case ARCH_DIM_SSM_CHAN: return 2 * (int64_t)hp->ssm_groups * hp->ssm_state + hp->ssm_inner;
    case ARCH_DIM_SSM_INNER: return hp->ssm_inner;
    case ARCH_DIM_SSM_VHEADS: return hp->ssm_vheads;
    case ARCH_DIM_SSM_VHEADS2: return 2 * (int64_t)hp->ssm_vheads;
    case ARCH_DIM_SSM_VHEAD: return hp->ssm_vheads ? hp->ssm_inner / hp->ssm_vheads : 0;
    case ARCH_DIM_CTX: return hp->n_ctx_train;
    case ARCH_DIM_TOKEN_TYPES: return hp->n_token_types;
    case ARCH_DIM_HEADS: return hp->n_head;
    case ARCH_DIM_QKV: return (int64_t)hp->n_head * hd + 2 * kv * hd;
    case ARCH_DIM_FF2: return 2 * (int64_t)(ly ? ly->n_ff : hp->n_ff);
    case ARCH_DIM_HALF_ROT: return hp->n_rot / 2;
    case ARCH_DIM_Q_LORA: return hp->q_lora_rank;
    case ARCH_DIM_MLA_Q: return (int64_t)hp->n_head * (hp->mla_nope + hp->n_rot);
    case ARCH_DIM_KV_LORA: return hp->kv_lora_rank;
    case ARCH_DIM_KV_A: return (int64_t)hp->kv_lora_rank + hp->n_rot;
    case ARCH_DIM_MLA_NOPE: return hp->mla_nope;
    case ARCH_DIM_MLA_V: return hp->mla_v;
    case ARCH_DIM_MLA_O: return (int64_t)hp->n_head * hp->mla_v;
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
        const model_layer *ly = il >= 0 ? base : NULL;
        tensor_spec spec = {name, dim_value(hp, ly, t->ne0), dim_value(hp, ly, t->ne1), dim_value(hp, ly, t->ne2),
                            t->ne2 == ARCH_DIM_HEADS ? "heads" : "experts", !t->optional, t->f32_only};
        if (!bind(L, (model_tensor *)((char *)base + t->offset), spec)) return false;
    }
    return true;
}

/* The fewest tensors a layer of this family needs (its leading recipe's too when the file has
 * leading layers): a block_count the file cannot back is refused before the layer table is
 * sized by it. */
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

/* Layer il has none of the family's unsupported tensors (arch_desc.unsupported). */
static bool layer_supported(loader *L, int il)
{
    const arch_desc *d = L->m->desc;
    for (const char *const *u = d->unsupported; u && *u; u++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", il, *u);
        if (gguf_find_tensor(L->f, name))
            return fail(L, "tensor '%s': %s files with it are not supported (no backend runs it)", name, d->name);
    }
    return true;
}

/* Qwen3.5's MTP block (model_mtp), block n_layer: the family's full-attention layer and the
 * NextN tensors, every one required once the file has any of the block (a missing one is
 * named); a file that keeps nextn_predict_layers but none of the block's tensors (a converter
 * that stripped them) loads without it.  Other families' blocks stay unbound. */
static bool bind_mtp(loader *L)
{
    model *m = L->m;
    const model_hparams *hp = &m->hp;
    const int il = hp->n_layer;
    if (hp->n_mtp < 1 || (hp->arch != MODEL_ARCH_QWEN35 && hp->arch != MODEL_ARCH_QWEN35MOE)) return true;
    char probe[2][64];
    snprintf(probe[0], sizeof probe[0], "blk.%d.nextn.eh_proj.weight", il);
    snprintf(probe[1], sizeof probe[1], "blk.%d.attn_norm.weight", il);
    if (!gguf_find_tensor(L->f, probe[0]) && !gguf_find_tensor(L->f, probe[1])) return true;
    if (hp->n_mtp != 1)
        return fail(L, "%s.nextn_predict_layers %d: only one MTP block is supported", m->desc->name, hp->n_mtp);
    model_layer *ly = &m->layers[il];
    const arch_desc *d = m->desc;
    /* the recipe of the model's full-attention layers, with the file's choices (its router) */
    bool full = false; /* (ARCH_ATTN_FULL is 0, a zeroed recipe's: the flag, not the field, says one was found) */
    for (int j = 0; j < il; j++)
        if (m->layers[j].recipe.attn == ARCH_ATTN_FULL) ly->recipe = m->layers[j].recipe, full = true;
    if (!full)
        return fail(L, "%s: the MTP block is a full-attention layer, and none of the %d layers is one", d->name, il);
    layer_keys(L, d->keys, il);
    for (int j = 0; j < ARCH_KEY_LISTS_MAX && d->more_keys[j]; j++) layer_keys(L, d->more_keys[j], il);
    if (!layer_attention(L, ly, il) || !bind_list(L, d->layer_tensors, arch_layer_features(&ly->recipe), il, ly))
        return false;
    layer_split_fused(hp, ly);
    if (!layer_complete(L, ly, il)) return false;
    model_mtp *mtp = &m->mtp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    const struct {
        model_tensor *t;
        const char *suffix;
        int64_t ne0, ne1;
        bool required, f32;
    } list[] = {
        {&mtp->eh_proj, "eh_proj", 2 * E, E, true, false},       {&mtp->enorm, "enorm", E, 0, true, true},
        {&mtp->hnorm, "hnorm", E, 0, true, true},                 {&mtp->embed, "embed_tokens", E, V, false, false},
        {&mtp->head_norm, "shared_head_norm", E, 0, false, true}, {&mtp->head, "shared_head_head", E, V, false, false},
    };
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.nextn.%s.weight", il, list[i].suffix);
        tensor_spec spec = {name, list[i].ne0, list[i].ne1, 0, "", list[i].required, list[i].f32};
        if (!bind(L, list[i].t, spec)) return false;
    }
    if (!mtp->embed.data) mtp->embed = m->tok_embd;
    if (!mtp->head_norm.data) mtp->head_norm = m->output_norm;
    if (!mtp->head.data) mtp->head = m->output;
    mtp->bound = true;
    return true;
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
    if (hp->n_embd_ple > 0 && (!m->ple_tok_embd.data || !m->ple_model_proj.data || !m->ple_proj_norm.data))
        return fail(L, "missing tensor '%s' (%s.embedding_length_per_layer_input is %d)",
                    !m->ple_tok_embd.data ? "per_layer_token_embd.weight"
                    : !m->ple_model_proj.data ? "per_layer_model_proj.weight" : "per_layer_proj_norm.weight",
                    d->name, hp->n_embd_ple);
    m->hp.tied_output = m->output.data == NULL && !d->encoder;
    if (m->hp.tied_output) m->output = m->tok_embd;
    if ((int64_t)hp->n_layer * min_layer_tensors(d, hp->n_dense_lead > 0) > gguf_n_tensors(L->f))
        return fail(L, "%s.block_count %d needs more tensors than the file's %lld", d->name, hp->n_layer,
                    (long long)gguf_n_tensors(L->f));
    m->layers = calloc((size_t)hp->n_layer + (size_t)hp->n_mtp, sizeof *m->layers);
    if (!m->layers) return fail(L, "out of memory for %d layers", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer *ly = &m->layers[il];
        layer_keys(L, d->keys, il);
        for (int j = 0; j < ARCH_KEY_LISTS_MAX && d->more_keys[j]; j++) layer_keys(L, d->more_keys[j], il);
        if (!layer_recipe(L, ly, il) || !layer_attention(L, ly, il) ||
            !bind_list(L, d->layer_tensors, arch_layer_features(&ly->recipe), il, ly) || !layer_supported(L, il))
            return false;
        layer_split_fused(hp, ly);
        if (!layer_complete(L, ly, il)) return false;
    }
    return bind_mtp(L);
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

int model_check_features(const model *m, arch_features supported, const char *backend, char *err, size_t errlen)
{
    for (int il = 0; il < m->hp.n_layer; il++) {
        arch_features missing = arch_layer_features(&m->layers[il].recipe) & ~supported;
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

const float *model_rope_freqs(const model *m, const model_layer *ly, int n_ctx)
{
    const bool long_ctx = m->hp.n_ctx_orig > 0 && n_ctx > m->hp.n_ctx_orig;
    if ((ly->recipe.attn_extras & ARCH_ATTN_ROPE_LONGROPE) && long_ctx && m->rope_factors_long.data)
        return m->rope_factors_long.data;
    return ly->rope_freqs;
}
