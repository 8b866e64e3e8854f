/* arch.h - what a model family is, as data: its hyper-parameter keys, its tensors and a layer
 * recipe.  One descriptor per family lives in src/model/arch/<family>.c; the loader
 * (model.c) validates a file against it, the backends compose their forward passes from the
 * recipe it leaves in every model_layer, and `inferd info` prints the same recipe.
 *
 * A layer recipe names, per layer, where its norms sit, which attention block and which
 * feed-forward block it runs, and the attention block's extras.  Kinds that no backend runs
 * yet are named so that the families coming next fit the shape; a backend refuses a model
 * that uses a feature it lacks when the engine is created (model_check_features), so nothing
 * runs silently wrong. */
#ifndef INFERD_ARCH_H
#define INFERD_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a block's RMSNorms sit around its residual add: x += post(block(pre(x))). */
typedef enum arch_norm {
    ARCH_NORM_PRE = 0,      /* llama: norm the block's input */
    ARCH_NORM_POST = 1,     /* OLMo 2: norm the block's output before the add */
    ARCH_NORM_SANDWICH = 2, /* Gemma 2/3: both */
} arch_norm;

typedef enum arch_attn {
    ARCH_ATTN_FULL = 0,    /* causal softmax attention over every earlier position */
    ARCH_ATTN_SLIDING = 1, /* the same over a window (Gemma, gpt-oss): not run yet */
    ARCH_ATTN_LINEAR = 2,  /* a linear-recurrent layer (gated DeltaNet): not run yet */
} arch_attn;

/* Extras of an attention block (bits). */
enum {
    ARCH_ATTN_QKV_BIAS = 1u << 0, /* attn_{q,k,v}.bias added after the projections (qwen2) */
    ARCH_ATTN_QK_NORM = 1u << 1,  /* each head of q and k RMS-normed before RoPE (qwen3) */
    ARCH_ATTN_FUSED_QKV = 1u << 2, /* one attn_qkv matrix, rows q then k then v (phi3) */
    /* room: output bias, attention sinks, output gate */
};

typedef enum arch_ffn {
    ARCH_FFN_GLU = 0, /* down(act(gate x) * up x) */
    ARCH_FFN_MOE = 1, /* routed experts of GLUs: a router picks k of n_expert per token */
} arch_ffn;

/* Extras of a feed-forward block (bits). */
enum {
    ARCH_FFN_FUSED_GATE_UP = 1u << 0, /* GLU: one ffn_up matrix of 2*n_ff rows, gate then up (phi3) */
    ARCH_FFN_SHARED_EXPERT = 1u << 1, /* MoE: plus an always-on GLU ffn_*_shexp, added unscaled (GLM-4.5) */
};

/* How a MoE block chooses its experts and weighs them (ignored by a GLU block). */
typedef enum arch_router {
    ARCH_ROUTER_SOFTMAX_TOPK = 0, /* softmax over all experts, top-k, renormalised (Qwen3-MoE) */
    /* sigmoid scores; the top-k of scores + exp_probs_b (the bias only chooses), their scores
     * renormalised and times expert_weights_scale (GLM-4.5; DeepSeek-V3 adds expert groups) */
    ARCH_ROUTER_SIGMOID_BIAS = 1,
    /* room: top-k then softmax over the chosen (gpt-oss) */
} arch_router;

typedef enum arch_act {
    ARCH_ACT_SILU = 0,      /* SwiGLU */
    ARCH_ACT_GELU_TANH = 1, /* GeGLU (Gemma): not run yet */
} arch_act;

/* One layer's recipe. */
typedef struct arch_layer {
    arch_norm norm; /* of both blocks */
    arch_attn attn;
    unsigned attn_extras; /* ARCH_ATTN_* bits */
    arch_ffn ffn;
    arch_act act;
    arch_router router; /* MoE only */
    unsigned ffn_extras; /* ARCH_FFN_* bits */
} arch_layer;

/* A recipe as a set of features: what a tensor's presence hangs on and what a backend
 * declares it implements.  arch_feature_name() names each bit. */
typedef uint32_t arch_features;
enum {
    ARCH_F_NORM_PRE = 1u << 0, /* the three placements: one per layer */
    ARCH_F_NORM_POST = 1u << 1,
    ARCH_F_NORM_SANDWICH = 1u << 2,
    ARCH_F_ATTN_FULL = 1u << 3,
    ARCH_F_ATTN_SLIDING = 1u << 4,
    ARCH_F_ATTN_LINEAR = 1u << 5,
    ARCH_F_QKV_BIAS = 1u << 6,
    ARCH_F_QK_NORM = 1u << 7,
    ARCH_F_FFN_GLU = 1u << 8,
    ARCH_F_FFN_MOE = 1u << 9,
    ARCH_F_ACT_SILU = 1u << 10,
    ARCH_F_ACT_GELU_TANH = 1u << 11,
    ARCH_F_ROUTER_SOFTMAX_TOPK = 1u << 12, /* MoE layers only */
    ARCH_F_FUSED_QKV = 1u << 13,
    ARCH_F_FUSED_GATE_UP = 1u << 14,
    ARCH_F_ROUTER_SIGMOID_BIAS = 1u << 15,
    ARCH_F_SHARED_EXPERT = 1u << 16,
    /* From the hyper-parameters, not the recipe (model_layer_features): RoPE over fewer dims
     * than head_dim, and LongRoPE's per-pair factors with its attention factor. */
    ARCH_F_ROPE_PARTIAL = 1u << 17,
    ARCH_F_ROPE_LONGROPE = 1u << 18,
    ARCH_F_COUNT_ = 19,
};
bool arch_layer_valid(const arch_layer *l); /* every kind one of its enum's */
arch_features arch_layer_features(const arch_layer *l);
const char *arch_feature_name(arch_features bit);

/* A tensor dimension in terms of the hyper-parameters. */
typedef enum arch_dim {
    ARCH_DIM_NONE = 0, /* ne1 of a vector */
    ARCH_DIM_EMBD,     /* n_embd */
    ARCH_DIM_Q,        /* n_head * head_dim */
    ARCH_DIM_KV,       /* n_head_kv * head_dim */
    ARCH_DIM_HEAD,     /* head_dim */
    ARCH_DIM_HALF_HEAD, /* head_dim / 2 */
    ARCH_DIM_FF,       /* n_ff */
    ARCH_DIM_VOCAB,    /* n_vocab (the rows of token_embd) */
    ARCH_DIM_FF_EXP,   /* n_ff_exp: one expert's hidden width */
    ARCH_DIM_EXPERT,   /* n_expert: the slices of a 3-D expert tensor, the router's outputs */
    ARCH_DIM_QKV,      /* (n_head + 2 * n_head_kv) * head_dim: a fused attn_qkv */
    ARCH_DIM_FF2,      /* 2 * n_ff: a fused gate and up */
    ARCH_DIM_FF_SHEXP, /* n_ff_exp * n_expert_shared: the shared expert's hidden width */
    ARCH_DIM_HALF_ROT, /* n_rot / 2: one RoPE factor per rotated pair */
} arch_dim;

/* A tensor: name ("blk.N." is prepended for a layer tensor), shape, where it is bound (a byte
 * offset into model_layer or model) and when it is there: a layer whose recipe has any of the
 * `when` features needs it (0: every layer); an optional one may be absent.  ne2 is the third
 * dimension of a 3-D tensor (the experts of ffn_*_exps: one [ne0, ne1] matrix per slice);
 * ARCH_DIM_NONE for a matrix or a vector. */
typedef struct arch_tensor {
    const char *name;
    arch_dim ne0, ne1, ne2;
    size_t offset; /* of the model_tensor in model_layer (per layer) or model (global) */
    arch_features when;
    bool optional;
    bool f32_only; /* norms, biases and rope factors are read as plain floats */
} arch_tensor;

static inline bool arch_tensor_needed(const arch_tensor *t, arch_features f) { return !t->when || (t->when & f); }

/* A hyper-parameter "<arch>.<suffix>": an integer in [1, 2^24] or a positive float, stored
 * at `offset` in model_hparams (an int or a float).  An absent optional key leaves the field
 * as it is: dflt when non-zero, else the loader's derivation (head_count_kv = head_count,
 * key_length = embedding_length / head_count). */
typedef enum arch_key_kind { ARCH_KEY_INT, ARCH_KEY_FLOAT } arch_key_kind;
typedef struct arch_key {
    const char *suffix;
    arch_key_kind kind;
    size_t offset;
    bool required;
    float dflt;
    bool zero_ok; /* an integer that may be 0 (a count of optional layers) */
} arch_key;

typedef enum arch_rope { ARCH_ROPE_NORMAL = 0, ARCH_ROPE_NEOX = 1 } arch_rope;

#define ARCH_PATTERN_MAX 8

/* A family.  Layer il runs pattern[il % pattern_len]: one entry for today's uniform stacks;
 * Gemma 3's five sliding layers to one full, or Qwen3.5's three linear to one full, are a
 * pattern of six or four. */
typedef struct arch_desc {
    const char *name; /* general.architecture */
    /* Lists end with an entry whose name (suffix) is NULL. */
    const arch_key *keys;
    const arch_key *more_keys; /* read after keys; NULL: none (arch_moe_keys: the expert counts) */
    const arch_key *family_keys; /* read last; NULL: none (the family's own) */
    const arch_tensor *globals; /* token_embd.weight first: its rows set n_vocab */
    const arch_tensor *layer_tensors;
    arch_rope rope;
    arch_layer pattern[ARCH_PATTERN_MAX];
    int pattern_len;
    /* The first hp.n_dense_lead layers run this instead of the pattern (GLM-4.5, DeepSeek-V3:
     * dense feed-forward before the MoE layers); unused while that count is 0. */
    arch_layer leading;
} arch_desc;

/* The built-in families (src/model/arch/<family>.c). */
extern const arch_desc arch_llama, arch_qwen2, arch_qwen3, arch_qwen3moe, arch_phi3, arch_glm4moe;

/* What every dense transformer of the llama line has; a family's descriptor points at these
 * or at its own lists. */
extern const arch_key arch_dense_keys[];
extern const arch_tensor arch_dense_globals[];
extern const arch_tensor arch_dense_layer_tensors[]; /* with the MoE block's, bound for MoE recipes */
extern const arch_key arch_moe_keys[];               /* expert_count, expert_used_count, expert width */
#define ARCH_DENSE_LISTS                                                                          \
    .keys = arch_dense_keys, .globals = arch_dense_globals, .layer_tensors = arch_dense_layer_tensors

/* The ids of the built-in families in the registry (arch.h); one registered at run time
 * gets the next free id.  The family itself is data: src/model/arch/<family>.c. */
typedef enum model_arch {
    MODEL_ARCH_LLAMA = 0, /* Llama 2/3.x, TinyLlama, SmolLM, Mistral */
    MODEL_ARCH_QWEN2 = 1, /* Q/K/V bias, NeoX RoPE */
    MODEL_ARCH_QWEN3 = 2, /* per-head Q/K RMSNorm, no bias, NeoX RoPE */
    MODEL_ARCH_QWEN3MOE = 3, /* qwen3's attention, MoE feed-forward */
    MODEL_ARCH_PHI3 = 4,     /* fused QKV and gate/up, partial LongRoPE */
    MODEL_ARCH_GLM4MOE = 5,  /* GLM-4.5: dense lead, sigmoid-routed MoE + shared expert */
} model_arch;

/* The registry: built-ins have ids 0.. in the order of model_arch; arch_register adds one at
 * run time (tests; before any model loads, not thread-safe) and returns its id, or -1 when
 * the name is taken or the table is full. */
int arch_register(const arch_desc *d);
const arch_desc *arch_find(const char *name, size_t len);
const arch_desc *arch_by_id(int id);
int arch_id(const arch_desc *d);
/* "llama, qwen2, qwen3, ...": the registered names, for errors. */
void arch_names(char *buf, size_t len);

/* A recipe of a layer as text, e.g. "pre-norm, full attention + qkv bias, GLU silu". */
void arch_layer_describe(const arch_layer *l, char *buf, size_t len);

#endif
