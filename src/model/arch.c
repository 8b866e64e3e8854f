/* arch.c - the family registry, recipe features and their names (see arch.h); the lists
 * the dense llama line shares are in arch/dense.c. */
#include "arch.h"

#include <stdio.h>
#include <string.h>

/* ---- the registry ---------------------------------------------------------------------- */

#define ARCH_MAX 24

static const arch_desc *registry[ARCH_MAX] = {
    [MODEL_ARCH_LLAMA] = &arch_llama,
    [MODEL_ARCH_QWEN2] = &arch_qwen2,
    [MODEL_ARCH_QWEN3] = &arch_qwen3,
    [MODEL_ARCH_QWEN3MOE] = &arch_qwen3moe,
    [MODEL_ARCH_GEMMA3] = &arch_gemma3,
    [MODEL_ARCH_GEMMA4] = &arch_gemma4,
    [MODEL_ARCH_QWEN35] = &arch_qwen35,
    [MODEL_ARCH_QWEN35MOE] = &arch_qwen35moe,
    [MODEL_ARCH_QWEN3NEXT] = &arch_qwen3next,
    [MODEL_ARCH_BERT] = &arch_bert,
    [MODEL_ARCH_GPTOSS] = &arch_gptoss,
    [MODEL_ARCH_PHI3] = &arch_phi3,
    [MODEL_ARCH_GLM4MOE] = &arch_glm4moe,
    [MODEL_ARCH_DEEPSEEK2] = &arch_deepseek2,
    [MODEL_ARCH_NOMIC_BERT] = &arch_nomic_bert,
    [MODEL_ARCH_JINA_BERT_V2] = &arch_jina_bert_v2,
};
static int n_registered = MODEL_ARCH_JINA_BERT_V2 + 1;

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
    return (unsigned)l->norm <= ARCH_NORM_POST_LN && (unsigned)l->attn <= ARCH_ATTN_MLA &&
           (unsigned)l->ffn <= ARCH_FFN_MLP && (unsigned)l->act <= ARCH_ACT_SWIGLU_CLAMP &&
           (unsigned)l->router <= ARCH_ROUTER_SIGMOID_BIAS &&
           (l->attn_extras & ~(unsigned)(ARCH_ATTN_QKV_BIAS | ARCH_ATTN_QK_NORM | ARCH_ATTN_V_NORM |
                                         ARCH_ATTN_OUT_GATE | ARCH_ATTN_ROPE_PARTIAL | ARCH_ATTN_OUT_BIAS |
                                         ARCH_ATTN_BIDIR | ARCH_ATTN_SINKS | ARCH_ATTN_FUSED_QKV |
                                         ARCH_ATTN_ROPE_LONGROPE | ARCH_ATTN_ALIBI)) == 0 &&
           (l->ffn_extras & ~(unsigned)(ARCH_FFN_SHARED_EXPERT | ARCH_FFN_BIAS | ARCH_FFN_SHEXP_GATE |
                                        ARCH_FFN_FUSED_GATE_UP | ARCH_FFN_EXPERT_GROUPS)) == 0 &&
           (!(l->ffn_extras & ARCH_FFN_EXPERT_GROUPS) || l->ffn == ARCH_FFN_MOE) &&
           (!(l->ffn_extras & ARCH_FFN_BIAS) || l->ffn == ARCH_FFN_MOE) &&
           (!(l->ffn_extras & ARCH_FFN_SHEXP_GATE) || (l->ffn_extras & ARCH_FFN_SHARED_EXPERT)) &&
           (!(l->ffn_extras & ARCH_FFN_FUSED_GATE_UP) || l->ffn == ARCH_FFN_GLU);
}

arch_features arch_layer_features(const arch_layer *l)
{
    static const arch_features norm[] = {[ARCH_NORM_PRE] = ARCH_F_NORM_PRE, [ARCH_NORM_POST] = ARCH_F_NORM_POST,
                                         [ARCH_NORM_SANDWICH] = ARCH_F_NORM_SANDWICH,
                                         [ARCH_NORM_POST_LN] = ARCH_F_NORM_POST_LN};
    static const arch_features attn[] = {[ARCH_ATTN_FULL] = ARCH_F_ATTN_FULL,
                                         [ARCH_ATTN_SLIDING] = ARCH_F_ATTN_SLIDING,
                                         [ARCH_ATTN_LINEAR] = ARCH_F_ATTN_LINEAR,
                                         [ARCH_ATTN_MLA] = ARCH_F_ATTN_MLA};
    static const arch_features ffn[] = {[ARCH_FFN_GLU] = ARCH_F_FFN_GLU, [ARCH_FFN_MOE] = ARCH_F_FFN_MOE,
                                        [ARCH_FFN_GLU_MOE] = ARCH_F_FFN_GLU_MOE, [ARCH_FFN_MLP] = ARCH_F_FFN_MLP};
    static const arch_features router[] = {[ARCH_ROUTER_SOFTMAX_TOPK] = ARCH_F_ROUTER_SOFTMAX_TOPK,
                                           [ARCH_ROUTER_SCALED] = ARCH_F_ROUTER_SCALED,
                                           [ARCH_ROUTER_TOPK_SOFTMAX] = ARCH_F_ROUTER_TOPK_SOFTMAX,
                                           [ARCH_ROUTER_SIGMOID_BIAS] = ARCH_F_ROUTER_SIGMOID_BIAS};
    static const arch_features act[] = {[ARCH_ACT_SILU] = ARCH_F_ACT_SILU, [ARCH_ACT_GELU_TANH] = ARCH_F_ACT_GELU_TANH,
                                        [ARCH_ACT_GELU_ERF] = ARCH_F_ACT_GELU_ERF,
                                        [ARCH_ACT_SWIGLU_CLAMP] = ARCH_F_ACT_SWIGLU_CLAMP};
    arch_features f = norm[l->norm] | attn[l->attn] | ffn[l->ffn] | act[l->act];
    if (l->attn_extras & ARCH_ATTN_QKV_BIAS) f |= ARCH_F_QKV_BIAS;
    if (l->attn_extras & ARCH_ATTN_QK_NORM) f |= ARCH_F_QK_NORM;
    if (l->attn_extras & ARCH_ATTN_V_NORM) f |= ARCH_F_V_NORM;
    if (l->attn_extras & ARCH_ATTN_OUT_GATE) f |= ARCH_F_ATTN_OUT_GATE;
    if (l->attn_extras & ARCH_ATTN_ROPE_PARTIAL) f |= ARCH_F_ROPE_PARTIAL;
    if (l->attn_extras & ARCH_ATTN_OUT_BIAS) f |= ARCH_F_ATTN_OUT_BIAS;
    if (l->attn_extras & ARCH_ATTN_BIDIR) f |= ARCH_F_ATTN_BIDIR;
    if (l->attn_extras & ARCH_ATTN_SINKS) f |= ARCH_F_ATTN_SINKS;
    if (l->attn_extras & ARCH_ATTN_FUSED_QKV) f |= ARCH_F_FUSED_QKV;
    if (l->attn_extras & ARCH_ATTN_ROPE_LONGROPE) f |= ARCH_F_ROPE_LONGROPE;
    if (l->attn_extras & ARCH_ATTN_ALIBI) f |= ARCH_F_ALIBI;
    if (l->ffn == ARCH_FFN_MOE || l->ffn == ARCH_FFN_GLU_MOE) f |= router[l->router];
    if (l->ffn_extras & ARCH_FFN_SHARED_EXPERT) f |= ARCH_F_SHARED_EXPERT;
    if (l->ffn_extras & ARCH_FFN_BIAS) f |= ARCH_F_FFN_BIAS;
    if (l->ffn_extras & ARCH_FFN_FUSED_GATE_UP) f |= ARCH_F_FUSED_GATE_UP;
    if (l->ffn_extras & ARCH_FFN_EXPERT_GROUPS) f |= ARCH_F_EXPERT_GROUPS;
    return f;
}

static const char *const FEATURE_NAMES[ARCH_F_COUNT_] = {
    "pre-norm", "post-norm", "sandwich-norm", "full attention", "sliding-window attention", "gated DeltaNet linear attention",
    "qkv bias", "qk norm", "GLU", "MoE", "silu", "gelu-tanh", "softmax top-k router", "v norm",
    "GLU beside MoE", "scaled softmax top-k router", "attention output gate", "partial RoPE", "shared expert",
    "post-LN (LayerNorm after the add)", "attention output bias", "bidirectional attention", "MLP", "gelu-erf",
    "attention sinks", "expert biases", "clamped swiglu", "top-k softmax router", "fused qkv", "fused gate/up",
    "sigmoid router with selection bias", "LongRoPE", "multi-head latent attention", "grouped expert selection",
    "ALiBi",
};

const char *arch_feature_name(arch_features bit)
{
    for (int i = 0; i < ARCH_F_COUNT_; i++)
        if (bit == ARCH_F_(i)) return FEATURE_NAMES[i];
    return "?";
}

void arch_layer_describe(const arch_layer *l, char *buf, size_t len)
{
    static const char *const norm[] = {"pre-norm", "post-norm", "sandwich-norm", "post-LN"};
    static const char *const attn[] = {"full attention", "sliding-window attention", "gated DeltaNet",
                                       "multi-head latent attention"};
    static const char *const ffn[] = {"GLU", "MoE", "GLU beside MoE", "MLP"};
    static const char *const act[] = {"silu", "gelu-tanh", "gelu-erf", "clamped swiglu"};
    static const char *const router[] = {" (softmax top-k router, renormalised)",
                                         " (scaled softmax top-k router, renormalised, expert scales)",
                                         " (top-k router, softmax over the k)",
                                         " (sigmoid router + selection bias, renormalised, scaled)"};
    const unsigned shexp = l->ffn_extras & (ARCH_FFN_SHARED_EXPERT | ARCH_FFN_SHEXP_GATE);
    snprintf(buf, len, "%s, %s%s%s%s%s%s%s%s%s%s%s%s, %s %s%s%s%s%s%s", norm[l->norm],
             l->attn_extras & ARCH_ATTN_BIDIR ? "bidirectional " : "", attn[l->attn],
             l->attn_extras & ARCH_ATTN_FUSED_QKV ? " + fused qkv" : "",
             l->attn_extras & ARCH_ATTN_QKV_BIAS ? " + qkv bias" : "",
             l->attn_extras & ARCH_ATTN_OUT_BIAS ? " + output bias" : "",
             l->attn_extras & ARCH_ATTN_QK_NORM ? " + qk norm" : "",
             l->attn_extras & ARCH_ATTN_V_NORM ? " + v norm" : "",
             l->attn_extras & ARCH_ATTN_OUT_GATE ? " + output gate" : "",
             l->attn_extras & ARCH_ATTN_ROPE_PARTIAL ? " + partial RoPE" : "",
             l->attn_extras & ARCH_ATTN_ROPE_LONGROPE ? " + LongRoPE" : "",
             l->attn_extras & ARCH_ATTN_SINKS ? " + sinks" : "",
             l->attn_extras & ARCH_ATTN_ALIBI ? " + ALiBi" : "", ffn[l->ffn], act[l->act],
             l->ffn_extras & ARCH_FFN_FUSED_GATE_UP ? " (fused gate/up)" : "",
             l->ffn == ARCH_FFN_MOE || l->ffn == ARCH_FFN_GLU_MOE ? router[l->router] : "",
             l->ffn_extras & ARCH_FFN_EXPERT_GROUPS ? " + expert groups" : "",
             shexp == (ARCH_FFN_SHARED_EXPERT | ARCH_FFN_SHEXP_GATE) ? " + sigmoid-gated shared expert"
             : shexp                                                 ? " + shared expert"
                                                                     : "",
             l->ffn_extras & ARCH_FFN_BIAS ? " + biases" : "");
}
