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
    /* BERT's post-LN: x = LayerNorm(x + block(x)) with weight and bias, after the add (the
     * block's input is x as it is) */
    ARCH_NORM_POST_LN = 3,
} arch_norm;

typedef enum arch_attn {
    ARCH_ATTN_FULL = 0,    /* causal softmax attention over every earlier position */
    ARCH_ATTN_SLIDING = 1, /* the same over the last `window` positions (Gemma, gpt-oss): query
                            * i sees keys j with i - j < window (attention.sliding_window) */
    ARCH_ATTN_LINEAR = 2,  /* gated DeltaNet (Qwen3.5, Qwen3-Next): a recurrent state, no KV */
    /* multi-head latent attention (DeepSeek V2/V3, Kimi K2): K and V of every head come from
     * one per-token latent (kv_lora_rank, RMS-normed) through per-head up-projections, plus a
     * decoupled RoPE key shared by the heads; the cache keeps the latent and that key only */
    ARCH_ATTN_MLA = 3,
} arch_attn;

/* Extras of an attention block (bits). */
enum {
    ARCH_ATTN_QKV_BIAS = 1u << 0, /* attn_{q,k,v}.bias added after the projections (qwen2) */
    ARCH_ATTN_QK_NORM = 1u << 1,  /* each head of q and k RMS-normed before RoPE (qwen3) */
    ARCH_ATTN_V_NORM = 1u << 2,   /* each head of v RMS-normed, no weight (Gemma 4) */
    ARCH_ATTN_OUT_GATE = 1u << 3, /* attn_q gives [query | gate] per head; out *= sigmoid(gate) */
    ARCH_ATTN_ROPE_PARTIAL = 1u << 4, /* RoPE turns the first rope.dimension_count of a head */
    ARCH_ATTN_OUT_BIAS = 1u << 5, /* attn_output.bias added after the output projection (bert,
                                   * gpt-oss) */
    ARCH_ATTN_BIDIR = 1u << 6,    /* every token attends to the whole sequence (encoders) */
    ARCH_ATTN_SINKS = 1u << 7,    /* attn_sinks: a learned logit per head joins each softmax's
                                   * denominator (takes probability mass, adds no value: gpt-oss) */
    ARCH_ATTN_FUSED_QKV = 1u << 8, /* one attn_qkv matrix, rows q then k then v (phi3); the
                                    * loader binds wq, wk, wv as its row ranges */
    ARCH_ATTN_ROPE_LONGROPE = 1u << 9, /* LongRoPE (phi3): per-pair factors, short or long by the
                                        * engine's context, and cos/sin times its attention factor */
    /* ALiBi (jina-bert-v2): no rotary or absolute positions; each score gets -m_h |i - j|, head
     * h's slope m_h from a maximum bias of 8 as ggml computes it (ARCH_ALIBI_MAX_BIAS) */
    ARCH_ATTN_ALIBI = 1u << 10,
};
#define ARCH_ALIBI_MAX_BIAS 8.0f
/* The loader adds ARCH_ATTN_ROPE_PARTIAL to any rotary layer of a file whose
 * rope.dimension_count is below the head dimension, and ARCH_ATTN_ROPE_LONGROPE where the file
 * has LongRoPE factors: a family need not declare what its files say, and a backend that
 * lacks either refuses the file by name. */

typedef enum arch_ffn {
    ARCH_FFN_GLU = 0, /* down(act(gate x) * up x) */
    ARCH_FFN_MOE = 1, /* routed experts of GLUs: a router picks k of n_expert per token */
    ARCH_FFN_GLU_MOE = 2, /* Gemma 4 26B-A4B: the dense GLU and routed experts side by side,
                           * each normed after (post_ffw_norm_1 / _2), the experts' input by
                           * pre_ffw_norm_2, summed before the block's post-norm */
    ARCH_FFN_MLP = 3, /* down(act(up x + b_up)) + b_down, no gate (bert) */
} arch_ffn;

/* How a MoE block chooses its experts and weighs them (ignored by a GLU block). */
typedef enum arch_router {
    ARCH_ROUTER_SOFTMAX_TOPK = 0, /* softmax over all experts, top-k, renormalised (Qwen3-MoE) */
    ARCH_ROUTER_SCALED = 1,       /* Gemma 4: the same over logits of rmsnorm(x) / sqrt(n_embd) *
                                   * ffn_gate_inp.scale, each weight times its expert's scale */
    ARCH_ROUTER_TOPK_SOFTMAX = 2, /* top-k of the logits, softmax over those k (gpt-oss) */
    /* sigmoid scores; the top-k of scores + exp_probs_b (the bias only chooses), their scores
     * renormalised and times expert_weights_scale (GLM-4.5; DeepSeek-V3 adds expert groups) */
    ARCH_ROUTER_SIGMOID_BIAS = 3,
} arch_router;

/* Extras of a feed-forward block (bits). */
enum {
    ARCH_FFN_SHARED_EXPERT = 1u << 0, /* MoE: + the shared expert's GLU (ffn_*_shexp, n_ff_shexp
                                       * wide), every token, after the routed experts' sum */
    ARCH_FFN_BIAS = 1u << 1, /* MoE: a bias on the router (ffn_gate_inp.bias) and on each expert's
                              * gate, up and down projections (ffn_*_exps.bias: gpt-oss) */
    ARCH_FFN_SHEXP_GATE = 1u << 2, /* the shared expert's output times sigmoid(gate_inp_shexp·x)
                                    * (Qwen; without it, added as it is: GLM-4.5).  Part of the
                                    * ARCH_F_SHARED_EXPERT feature: a backend runs both or neither */
    ARCH_FFN_FUSED_GATE_UP = 1u << 3, /* GLU: one ffn_up of 2*n_ff rows, gate then up (phi3); the
                                       * loader binds w_gate and w_up as its halves */
    /* MoE: the experts are in expert_group_count groups and a token chooses among those of its
     * expert_group_used_count best groups only (DeepSeek V3: a group scores the sum of its two
     * best biased scores; V2: its best score).  The loader adds it where the file has groups. */
    ARCH_FFN_EXPERT_GROUPS = 1u << 4,
};

typedef enum arch_act {
    ARCH_ACT_SILU = 0,      /* SwiGLU */
    ARCH_ACT_GELU_TANH = 1, /* GeGLU (Gemma): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), the
                             * exact formula (transformers' gelu_pytorch_tanh), no table */
    ARCH_ACT_GELU_ERF = 2,  /* the exact GELU, x * Phi(x) (bert) */
    ARCH_ACT_SWIGLU_CLAMP = 3, /* gpt-oss: g = min(gate, 7), u = clamp(up, -7, 7),
                                * (u + 1) * g * sigmoid(1.702 g); the constants are the model's
                                * (swiglu_limit, alpha) and not in the GGUF */
} arch_act;
/* ARCH_ACT_SWIGLU_CLAMP's constants, for every backend. */
#define ARCH_SWIGLU_CLAMP_LIMIT 7.0f
#define ARCH_SWIGLU_CLAMP_ALPHA 1.702f

/* One layer's recipe. */
typedef struct arch_layer {
    arch_norm norm; /* of both blocks */
    arch_attn attn;
    unsigned attn_extras; /* ARCH_ATTN_* bits */
    arch_ffn ffn;
    unsigned ffn_extras; /* ARCH_FFN_* bits */
    arch_act act;
    arch_router router; /* MoE only */
} arch_layer;

/* A recipe as a set of features: what a tensor's presence hangs on and what a backend
 * declares it implements.  arch_feature_name() names each bit. */
typedef uint64_t arch_features;
#define ARCH_F_(n) ((arch_features)1 << (n))
#define ARCH_F_NORM_PRE ARCH_F_(0) /* the three placements: one per layer */
#define ARCH_F_NORM_POST ARCH_F_(1)
#define ARCH_F_NORM_SANDWICH ARCH_F_(2)
#define ARCH_F_ATTN_FULL ARCH_F_(3)
#define ARCH_F_ATTN_SLIDING ARCH_F_(4)
#define ARCH_F_ATTN_LINEAR ARCH_F_(5)
#define ARCH_F_QKV_BIAS ARCH_F_(6)
#define ARCH_F_QK_NORM ARCH_F_(7)
#define ARCH_F_FFN_GLU ARCH_F_(8)
#define ARCH_F_FFN_MOE ARCH_F_(9)
#define ARCH_F_ACT_SILU ARCH_F_(10)
#define ARCH_F_ACT_GELU_TANH ARCH_F_(11)
#define ARCH_F_ROUTER_SOFTMAX_TOPK ARCH_F_(12) /* MoE layers only */
#define ARCH_F_V_NORM ARCH_F_(13)
#define ARCH_F_FFN_GLU_MOE ARCH_F_(14)
#define ARCH_F_ROUTER_SCALED ARCH_F_(15)
#define ARCH_F_ATTN_OUT_GATE ARCH_F_(16)
#define ARCH_F_ROPE_PARTIAL ARCH_F_(17)
#define ARCH_F_SHARED_EXPERT ARCH_F_(18)
#define ARCH_F_NORM_POST_LN ARCH_F_(19)
#define ARCH_F_ATTN_OUT_BIAS ARCH_F_(20)
#define ARCH_F_ATTN_BIDIR ARCH_F_(21)
#define ARCH_F_FFN_MLP ARCH_F_(22)
#define ARCH_F_ACT_GELU_ERF ARCH_F_(23)
#define ARCH_F_ATTN_SINKS ARCH_F_(24)
#define ARCH_F_FFN_BIAS ARCH_F_(25)
#define ARCH_F_ACT_SWIGLU_CLAMP ARCH_F_(26)
#define ARCH_F_ROUTER_TOPK_SOFTMAX ARCH_F_(27)
#define ARCH_F_FUSED_QKV ARCH_F_(28)
#define ARCH_F_FUSED_GATE_UP ARCH_F_(29)
#define ARCH_F_ROUTER_SIGMOID_BIAS ARCH_F_(30)
#define ARCH_F_ROPE_LONGROPE ARCH_F_(31)
#define ARCH_F_ATTN_MLA ARCH_F_(32)      /* multi-head latent attention (DeepSeek): the cache holds a latent */
#define ARCH_F_EXPERT_GROUPS ARCH_F_(33) /* the router keeps the best expert groups first (DeepSeek) */
#define ARCH_F_ALIBI ARCH_F_(34)         /* ALiBi position biases (jina-bert-v2) */
#define ARCH_F_COUNT_ 35
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
    ARCH_DIM_ONE,      /* 1 (a per-layer scalar; a [n, 1] matrix: the shared expert's gate) */
    ARCH_DIM_PLE,      /* n_embd_ple: one layer's share of the per-layer embeddings */
    ARCH_DIM_PLE_ALL,  /* n_embd_ple * n_layer */
    ARCH_DIM_FF_EXP2,  /* 2 * n_ff_exp: an expert's gate and up rows in one matrix */
    ARCH_DIM_Q_GATE,   /* 2 * n_head * head_dim: query and output gate of every head */
    ARCH_DIM_FF_SHEXP, /* n_ff_shexp: the shared expert's hidden width (its own key, or
                        * n_ff_exp * expert_shared_count: model.c) */
    /* gated DeltaNet (ssm.* keys): */
    ARCH_DIM_SSM_CONV,  /* conv_kernel: taps of the causal conv1d */
    ARCH_DIM_SSM_CHAN,  /* 2 * group_count * state_size + inner_size: q, k and v channels */
    ARCH_DIM_SSM_INNER, /* inner_size = time_step_rank v heads x their width */
    ARCH_DIM_SSM_VHEADS, /* time_step_rank: v heads */
    ARCH_DIM_SSM_VHEADS2, /* 2 * time_step_rank: beta and alpha fused (qwen3next) */
    ARCH_DIM_SSM_VHEAD, /* inner_size / time_step_rank: one v head's width */
    ARCH_DIM_CTX,      /* n_ctx_train: the rows of an absolute position table */
    ARCH_DIM_TOKEN_TYPES, /* n_token_types: the rows of bert's token-type table */
    ARCH_DIM_HEADS,    /* n_head (attention sinks: one logit per head) */
    ARCH_DIM_QKV,      /* (n_head + 2 * n_head_kv) * head_dim: a fused attn_qkv */
    ARCH_DIM_FF2,      /* 2 * n_ff: a fused gate and up */
    ARCH_DIM_HALF_ROT, /* n_rot / 2: one RoPE factor per rotated pair (LongRoPE) */
    /* multi-head latent attention (model_hparams' mla_*): */
    ARCH_DIM_Q_LORA,   /* q_lora_rank: the compressed query */
    ARCH_DIM_MLA_Q,    /* n_head * (qk_nope + n_rot): every head's query, its RoPE part last */
    ARCH_DIM_KV_LORA,  /* kv_lora_rank: the latent */
    ARCH_DIM_KV_A,     /* kv_lora_rank + n_rot: the latent and the RoPE key, one cache row */
    ARCH_DIM_MLA_NOPE, /* qk_nope: a head's key/query part without RoPE */
    ARCH_DIM_MLA_V,    /* a head's value width */
    ARCH_DIM_MLA_O,    /* n_head * value width: the attention output */
} arch_dim;
/* In a layer tensor, Q, KV, HEAD, HALF_HEAD and FF are the layer's own (model_layer: head_dim,
 * n_head_kv, n_ff), which differ between layers in Gemma 4. */

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

/* A hyper-parameter "<arch>.<suffix>": an integer in [1, 2^24] (COUNT: [0, 2^24]) or a positive
 * float, stored at `offset` in model_hparams (an int or a float).  An absent optional key
 * leaves the field as it is: dflt when non-zero, else the loader's derivation (head_count_kv =
 * head_count, key_length = embedding_length / head_count).  An integer key with a layer_offset
 * may also be an array of one value per layer (Gemma 4's feed_forward_length, head_count_kv):
 * each layer's lands in model_layer at layer_offset, the largest in model_hparams. */
typedef enum arch_key_kind { ARCH_KEY_INT, ARCH_KEY_FLOAT, ARCH_KEY_COUNT } arch_key_kind;
typedef struct arch_key {
    const char *suffix;
    arch_key_kind kind;
    size_t offset;
    bool required;
    float dflt;
    size_t layer_offset; /* 0: one value for all layers */
} arch_key;

/* ARCH_ROPE_NONE: no rotary embedding; positions come from an absolute table (bert). */
typedef enum arch_rope { ARCH_ROPE_NORMAL = 0, ARCH_ROPE_NEOX = 1, ARCH_ROPE_NONE = 2 } arch_rope;

/* How a sliding layer's RoPE differs from a full one's. */
typedef enum arch_swa_rope {
    ARCH_SWA_ROPE_SAME = 0,  /* the same frequencies and scaling (gpt-oss) */
    ARCH_SWA_ROPE_LOCAL = 1, /* its own base (rope.freq_base_swa), no position scaling (Gemma 3) */
} arch_swa_rope;

/* Which q/k head a gated DeltaNet's v head h reads when there are r = v heads / k heads of
 * them per k head: h mod k_heads (tiled: the converter reorders Qwen3.5's v heads so) or h / r
 * (grouped: Qwen3-Next, as trained). */
typedef enum arch_ssm_heads { ARCH_SSM_TILED = 0, ARCH_SSM_GROUPED = 1 } arch_ssm_heads;
/* Whether a family's files may use YaRN RoPE scaling (rope.scaling.type "yarn"), and how its
 * correction range is taken.  A family without it refuses such a file at load. */
typedef enum arch_yarn {
    ARCH_YARN_NONE = 0,
    ARCH_YARN_UNROUNDED = 1, /* the range from beta_fast/beta_slow used as computed, not floored
                              * and ceiled (transformers' truncate=false: gpt-oss; ggml always
                              * rounds it) */
    /* DeepSeek's: the range floored and ceiled (transformers' default truncate=true, ggml),
     * over the rotated dimensions; cos and sin unscaled (DeepSeek's mscale equals its
     * mscale_all_dim); the attention scores times mscale^2, mscale = 1 +
     * rope.scaling.yarn_log_multiplier * ln(factor) */
    ARCH_YARN_MSCALE = 2,
} arch_yarn;

struct model_hparams;

#define ARCH_PATTERN_MAX 8
#define ARCH_KEY_LISTS_MAX 4

/* A family.  Layer il runs pattern[il % pattern_len]: one entry for today's uniform stacks;
 * Gemma 3's five sliding layers to one full, or Qwen3.5's three linear to one full, are a
 * pattern of six or four. */
typedef struct arch_desc {
    const char *name; /* general.architecture */
    /* Lists end with an entry whose name (suffix) is NULL. */
    const arch_key *keys;
    /* Read after keys, in order, up to a NULL: arch_moe_keys (the expert counts),
     * arch_shexp_keys (the shared expert's width), arch_hybrid_keys (gated DeltaNet), a
     * family's own. */
    const arch_key *more_keys[ARCH_KEY_LISTS_MAX];
    const arch_tensor *globals; /* token_embd.weight first: its rows set n_vocab */
    const arch_tensor *layer_tensors;
    /* Layer tensor suffixes ("attn_q_norm.weight") that files of the family may carry but no
     * backend runs: the loader refuses such a file naming the tensor (NULL-terminated; NULL:
     * none), rather than run it without them. */
    const char *const *unsupported;
    arch_rope rope;
    arch_ssm_heads ssm_heads; /* families with gated DeltaNet layers */
    arch_layer pattern[ARCH_PATTERN_MAX];
    int pattern_len;
    /* Family facts outside the layer recipe (zero: the llama line's). */
    arch_swa_rope swa_rope;
    arch_yarn yarn;
    bool embed_scale; /* token embeddings times sqrt(n_embd) (Gemma) */
    /* query_pre_attn_scalar when the file does not say it (scores are divided by its square
     * root); NULL: head_dim. */
    float (*attn_scalar)(const struct model_hparams *hp);
    /* A key of one bool per layer (Gemma 4's attention.sliding_window_pattern): layer il runs
     * pattern[0] where it is true, pattern[1] where false, instead of pattern[il % len]. */
    const char *pattern_key;
    /* A family whose experts are optional (Gemma 4: the 26B-A4B): the pattern when the file
     * sets expert_count (NULL: none); and whether a layer without attn_v takes V from the K
     * projection (Gemma 4's attention_k_eq_v). */
    const arch_layer *moe_pattern;
    bool v_from_k;
    /* An encoder: no LM head (it answers embeddings only), its own embedding stage (absolute
     * positions, token types, a LayerNorm) and no output norm. */
    bool encoder;
    /* The first leading_dense_block_count layers (hp.n_dense_lead) run this instead of the
     * pattern (GLM-4.5, DeepSeek-V3: dense feed-forward before the MoE layers); unused while
     * that count is 0. */
    arch_layer leading;
    /* A file without expert_weights_norm does not renormalise its chosen experts' weights
     * (DeepSeek V2, as llama.cpp reads it); otherwise they are renormalised. */
    bool expert_weights_raw;
    /* An embedding model whose Matryoshka truncation centres the whole vector before the cut
     * (nomic-embed-text v1.5: layer_norm, cut, L2-normalise); without it the cut is only
     * renormalised. */
    bool dims_centred;
} arch_desc;

/* The built-in families (src/model/arch/<family>.c). */
extern const arch_desc arch_llama, arch_qwen2, arch_qwen3, arch_qwen3moe, arch_gemma3, arch_gemma4, arch_qwen35,
    arch_qwen35moe, arch_qwen3next, arch_bert, arch_gptoss, arch_phi3, arch_glm4moe, arch_deepseek2,
    arch_nomic_bert, arch_jina_bert_v2;

/* What every dense transformer of the llama line has; a family's descriptor points at these
 * or at its own lists. */
extern const arch_key arch_dense_keys[];
extern const arch_tensor arch_dense_globals[];
extern const arch_tensor arch_dense_layer_tensors[]; /* with the MoE block's, bound for MoE recipes */
extern const arch_key arch_moe_keys[];               /* expert_count, expert_used_count, expert width */
extern const arch_key arch_swa_keys[];  /* attention.sliding_window (required), rope.freq_base_swa,
                                         * final_logit_softcapping */
extern const arch_key arch_shexp_keys[];             /* expert_shared_feed_forward_length */
extern const arch_key arch_bert_keys[]; /* an encoder's shape and its LayerNorm epsilon (arch/bert.c) */
/* an encoder's token and token-type rows and their LayerNorm, no position table (nomic_bert.c) */
extern const arch_tensor arch_encoder_globals[];
/* ssm.{conv_kernel,state_size,group_count,time_step_rank,inner_size},
 * full_attention_interval (arch/hybrid.c) */
extern const arch_key arch_hybrid_keys[];
extern const arch_tensor arch_qwen35_layer_tensors[], arch_qwen3next_layer_tensors[];
/* The hybrid recipe (three gated-DeltaNet layers, then one gated full attention with QK norm
 * and partial RoPE) with a given FFN block: a family's .pattern and .pattern_len. */
#define ARCH_HYBRID_PATTERN(ffn_kind, ffn_bits)                                                      \
    .pattern = {ARCH_HYBRID_LINEAR(ffn_kind, ffn_bits), ARCH_HYBRID_LINEAR(ffn_kind, ffn_bits),       \
                ARCH_HYBRID_LINEAR(ffn_kind, ffn_bits),                                              \
                {.norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_FULL,                                      \
                 .attn_extras = ARCH_ATTN_QK_NORM | ARCH_ATTN_OUT_GATE | ARCH_ATTN_ROPE_PARTIAL,      \
                 .ffn = ffn_kind, .ffn_extras = ffn_bits, .act = ARCH_ACT_SILU}},                    \
    .pattern_len = 4
#define ARCH_HYBRID_LINEAR(ffn_kind, ffn_bits)                                                       \
    {.norm = ARCH_NORM_PRE, .attn = ARCH_ATTN_LINEAR, .ffn = ffn_kind, .ffn_extras = ffn_bits,       \
     .act = ARCH_ACT_SILU}
#define ARCH_DENSE_LISTS                                                                          \
    .keys = arch_dense_keys, .globals = arch_dense_globals, .layer_tensors = arch_dense_layer_tensors

/* The ids of the built-in families in the registry (arch.h); one registered at run time
 * gets the next free id.  The family itself is data: src/model/arch/<family>.c. */
typedef enum model_arch {
    MODEL_ARCH_LLAMA = 0, /* Llama 2/3.x, TinyLlama, SmolLM, Mistral */
    MODEL_ARCH_QWEN2 = 1, /* Q/K/V bias, NeoX RoPE */
    MODEL_ARCH_QWEN3 = 2, /* per-head Q/K RMSNorm, no bias, NeoX RoPE */
    MODEL_ARCH_QWEN3MOE = 3, /* qwen3's attention, MoE feed-forward */
    MODEL_ARCH_GEMMA3 = 4,   /* 5 sliding : 1 full, sandwich norms, GeGLU, softcapped logits */
    MODEL_ARCH_GEMMA4 = 5,   /* gemma3's line + per-layer embeddings, shared KV, per-layer shapes */
    MODEL_ARCH_QWEN35 = 6,    /* 3 gated-DeltaNet layers : 1 gated full attention, GLU */
    MODEL_ARCH_QWEN35MOE = 7, /* the same with MoE + a shared expert */
    MODEL_ARCH_QWEN3NEXT = 8, /* qwen35moe's layers, beta and alpha fused in one projection */
    MODEL_ARCH_BERT = 9,     /* encoder: bidirectional, post-LN, absolute positions (bge, MiniLM) */
    MODEL_ARCH_GPTOSS = 10,   /* sliding/full, attention sinks, YaRN, biased MoE, clamped SwiGLU */
    MODEL_ARCH_PHI3 = 11,     /* fused QKV and gate/up, partial LongRoPE */
    MODEL_ARCH_GLM4MOE = 12,  /* GLM-4.5: dense lead, sigmoid-routed MoE + shared expert */
    MODEL_ARCH_DEEPSEEK2 = 13, /* DeepSeek V2/V3, Kimi K2: latent attention, grouped MoE routing */
    MODEL_ARCH_NOMIC_BERT = 14, /* encoder: bert's post-LN with RoPE, fused QKV, SwiGLU (nomic-embed-text) */
    MODEL_ARCH_JINA_BERT_V2 = 15, /* encoder: bert's post-LN with ALiBi and a GEGLU (jina-embeddings-v2) */
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
