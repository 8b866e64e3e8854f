/* arch.c - the family registry, recipe features and their names (see arch.h); the lists
 * the dense llama line shares are in arch/dense.c. */
#include "arch.h"

#include <stdio.h>
#include <string.h>

/* ---- the registry ---------------------------------------------------------------------- */

#define ARCH_MAX 16

static const arch_desc *registry[ARCH_MAX] = {
    [MODEL_ARCH_LLAMA] = &arch_llama,
    [MODEL_ARCH_QWEN2] = &arch_qwen2,
    [MODEL_ARCH_QWEN3] = &arch_qwen3,
    [MODEL_ARCH_QWEN3MOE] = &arch_qwen3moe,
    [MODEL_ARCH_PHI3] = &arch_phi3,
    [MODEL_ARCH_GLM4MOE] = &arch_glm4moe,
};
static int n_registered = MODEL_ARCH_GLM4MOE + 1;

const arch_desc *arch_find(const char *name, size_t len)
{
    for (int i = 0; i < n_registered; i++)
        if (strlen(registry[i]->name) == len && memcmp(registry[i]->name, name, len) == 0) return registry[i];
    return NULL;
}

int arch_register(const arch_desc *d)
{
    if (n_registered == ARCH_MAX || arch_find(d->name, strlen(d->name))) return -1;
    registry[n_registered] = d;
    return n_registered++;
}

const arch_desc *arch_by_id(int id) { return id >= 0 && id < n_registered ? registry[id] : NULL; }

int arch_id(const arch_desc *d)
{
    for (int i = 0; i < n_registered; i++)
        if (registry[i] == d) return i;
    return -1;
}

void arch_names(char *buf, size_t len)
{
    size_t n = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; i < n_registered && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "", registry[i]->name);
}

/* ---- features ---------------------------------------------------------------------------- */

bool arch_layer_valid(const arch_layer *l)
{
    return (unsigned)l->norm <= ARCH_NORM_SANDWICH && (unsigned)l->attn <= ARCH_ATTN_LINEAR &&
           (unsigned)l->ffn <= ARCH_FFN_MOE && (unsigned)l->act <= ARCH_ACT_GELU_TANH &&
           (unsigned)l->router <= ARCH_ROUTER_SIGMOID_BIAS &&
           (l->attn_extras & ~(unsigned)(ARCH_ATTN_QKV_BIAS | ARCH_ATTN_QK_NORM | ARCH_ATTN_FUSED_QKV)) == 0 &&
           (l->ffn_extras & ~(unsigned)(ARCH_FFN_FUSED_GATE_UP | ARCH_FFN_SHARED_EXPERT)) == 0;
}

arch_features arch_layer_features(const arch_layer *l)
{
    static const arch_features norm[] = {[ARCH_NORM_PRE] = ARCH_F_NORM_PRE, [ARCH_NORM_POST] = ARCH_F_NORM_POST,
                                         [ARCH_NORM_SANDWICH] = ARCH_F_NORM_SANDWICH};
    static const arch_features attn[] = {[ARCH_ATTN_FULL] = ARCH_F_ATTN_FULL,
                                         [ARCH_ATTN_SLIDING] = ARCH_F_ATTN_SLIDING,
                                         [ARCH_ATTN_LINEAR] = ARCH_F_ATTN_LINEAR};
    static const arch_features ffn[] = {[ARCH_FFN_GLU] = ARCH_F_FFN_GLU, [ARCH_FFN_MOE] = ARCH_F_FFN_MOE};
    static const arch_features act[] = {[ARCH_ACT_SILU] = ARCH_F_ACT_SILU, [ARCH_ACT_GELU_TANH] = ARCH_F_ACT_GELU_TANH};
    arch_features f = norm[l->norm] | attn[l->attn] | ffn[l->ffn] | act[l->act];
    if (l->attn_extras & ARCH_ATTN_QKV_BIAS) f |= ARCH_F_QKV_BIAS;
    if (l->attn_extras & ARCH_ATTN_QK_NORM) f |= ARCH_F_QK_NORM;
    if (l->attn_extras & ARCH_ATTN_FUSED_QKV) f |= ARCH_F_FUSED_QKV;
    if (l->ffn == ARCH_FFN_GLU && (l->ffn_extras & ARCH_FFN_FUSED_GATE_UP)) f |= ARCH_F_FUSED_GATE_UP;
    if (l->ffn == ARCH_FFN_MOE) {
        f |= l->router == ARCH_ROUTER_SIGMOID_BIAS ? ARCH_F_ROUTER_SIGMOID_BIAS : ARCH_F_ROUTER_SOFTMAX_TOPK;
        if (l->ffn_extras & ARCH_FFN_SHARED_EXPERT) f |= ARCH_F_SHARED_EXPERT;
    }
    return f;
}

static const char *const FEATURE_NAMES[ARCH_F_COUNT_] = {
    "pre-norm", "post-norm", "sandwich-norm", "full attention", "sliding-window attention", "linear-recurrent attention",
    "qkv bias", "qk norm", "GLU", "MoE", "silu", "gelu-tanh", "softmax top-k router",
    "fused qkv", "fused gate/up", "sigmoid router with selection bias", "shared expert",
    "partial RoPE", "LongRoPE",
};

const char *arch_feature_name(arch_features bit)
{
    for (int i = 0; i < ARCH_F_COUNT_; i++)
        if (bit == 1u << i) return FEATURE_NAMES[i];
    return "?";
}

void arch_layer_describe(const arch_layer *l, char *buf, size_t len)
{
    static const char *const norm[] = {"pre-norm", "post-norm", "sandwich-norm"};
    static const char *const attn[] = {"full attention", "sliding-window attention", "linear-recurrent attention"};
    static const char *const ffn[] = {"GLU", "MoE"};
    static const char *const act[] = {"silu", "gelu-tanh"};
    static const char *const router[] = {" (softmax top-k router, renormalised)",
                                         " (sigmoid router + selection bias, renormalised, scaled)"};
    const bool moe = l->ffn == ARCH_FFN_MOE;
    snprintf(buf, len, "%s, %s%s%s%s, %s %s%s%s%s", norm[l->norm], attn[l->attn],
             l->attn_extras & ARCH_ATTN_FUSED_QKV ? " + fused qkv" : "",
             l->attn_extras & ARCH_ATTN_QKV_BIAS ? " + qkv bias" : "",
             l->attn_extras & ARCH_ATTN_QK_NORM ? " + qk norm" : "", ffn[l->ffn], act[l->act],
             !moe && (l->ffn_extras & ARCH_FFN_FUSED_GATE_UP) ? " (fused gate/up)" : "", moe ? router[l->router] : "",
             moe && (l->ffn_extras & ARCH_FFN_SHARED_EXPERT) ? " + shared expert" : "");
}
