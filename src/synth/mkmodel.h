/* mkmodel.h - synthetic GGUF models: real shapes, metadata and tokenizer, random weights.
 *
 * Used by `inferd mkmodel`, the tests and the benchmarks.  A generated file has every
 * hyper-parameter key of its architecture, a chat template of the family the architecture
 * ships with (ChatML for qwen2/qwen3, Llama 3 for llama), and a byte-level BPE tokenizer
 * whose merges are learned from a text corpus (see mkmodel_corpus) and padded with filler
 * tokens up to n_vocab; its pre-tokenizer is named as llama.cpp names the family's ("qwen2",
 * "llama-bpe"), so that other tools load the file.  Weights are seeded N(0, 1/sqrt(fan_in)) (norm weights 1), so
 * activations keep a sane scale through the layers. */
#ifndef INFERD_MKMODEL_H
#define INFERD_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/ggml_types.h"
#include "model/model.h"
#include "gguf_write.h"

/* Weight formats: one ggml type for every matrix, llama.cpp's Q4_K_M mix, or a UD-style mix
 * (a type per tensor role and layer, as unsloth's "dynamic" files have). */
typedef enum mkmodel_ftype {
    MKMODEL_F32 = 0,
    MKMODEL_F16,
    MKMODEL_BF16,
    MKMODEL_Q8_0,
    MKMODEL_Q4_0,
    MKMODEL_Q4_K,
    MKMODEL_Q5_K,
    MKMODEL_Q6_K,
    MKMODEL_Q4_K_M,
    MKMODEL_Q4_1,
    MKMODEL_Q5_0,
    MKMODEL_Q5_1,
    MKMODEL_Q2_K,
    MKMODEL_Q3_K,
    MKMODEL_IQ4_NL,
    MKMODEL_IQ4_XS,
    MKMODEL_IQ3_S,
    MKMODEL_IQ3_XXS,
    MKMODEL_IQ2_S,
    MKMODEL_IQ2_XS,
    MKMODEL_IQ2_XXS,
    MKMODEL_IQ1_M,
    MKMODEL_IQ1_S,
    MKMODEL_MXFP4,
    MKMODEL_UD_Q2_K_XL, /* mixes in the manner of unsloth's dynamic quants (mkmodel.c) */
    MKMODEL_UD_IQ1_S,
    MKMODEL_Q3_K_M, /* llama.cpp's Q3_K_M mix (mkmodel.c: q3_k_m_type) */
    MKMODEL_FTYPE_COUNT
} mkmodel_ftype;

typedef struct mkmodel_config {
    model_arch arch;
    char name[64]; /* general.name */
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx, n_vocab;
    int head_dim; /* 0: n_embd / n_head */
    float rope_base;
    float rms_eps;
    bool tied_output; /* no output.weight: the LM head is token_embd */
    mkmodel_ftype ftype;
    uint64_t seed;
    /* Rows of big matrices are tiled from a small pool of random rows (see mkmodel.c);
     * 0 = decide by size. */
    int reuse_rows;
    /* A GGUF whose tokenizer.* metadata (a real vocabulary and chat template) is copied instead
     * of learning a tokenizer; n_vocab must be its token count (mkmodel_vocab_size).  NULL:
     * learn one from the corpus. */
    const char *vocab;
    /* The corpus is not tokenizer training text but a source of words (words.h): the vocabulary
     * is its most frequent lowercase words, one token each, and the LM head favours them, so
     * that the random output reads as words (the README's default model). */
    bool words;
    /* gemma3: the sliding layers' window (attention.sliding_window; 0: none), their RoPE base
     * (rope.freq_base_swa) and the full layers' linear RoPE scaling (0: none). */
    int n_swa;
    float rope_base_swa, rope_scale;
    /* qwen3moe: experts per layer, chosen per token, and one expert's hidden width (the
     * mixture replaces the dense feed-forward; n_ff is then only the metadata key). */
    int n_expert, n_expert_used, n_ff_exp;
    /* An embedding model: <arch>.pooling_type written as this value minus 1 (engine_pooling:
     * 1 none, 2 mean, 3 cls, 4 last, 5 rank); 0: not written (a text model). */
    int pooling;
    /* qwen35 (hybrid): the gated DeltaNet's conv taps, q/k/v head width (state_size), q/k heads
     * (group_count), v heads (time_step_rank) and v width (inner_size = v heads x state_size);
     * the attention layers' RoPE dimensions (rope.dimension_count; 0: the whole head). */
    int ssm_conv, ssm_state, ssm_groups, ssm_vheads, ssm_inner, n_rot;
    /* gpt-oss: YaRN's factor over the original context (rope.scaling.*; 0: no scaling).  Its
     * experts are n_expert / n_expert_used / n_ff_exp as qwen3moe's, its window n_swa (every
     * even layer), and under --type mxfp4 only its experts are MXFP4, the other matrices Q8_0
     * (as the published files: llama.cpp's MOSTLY_MXFP4_MOE). */
    float yarn_factor;
    int yarn_orig_ctx;
    /* deepseek2 (multi-head latent attention; n_rot is the RoPE part of a head, n_head_kv is
     * not used): the latent's width (kv_lora_rank), the query's LoRA rank (0: one attn_q), a
     * head's query/key width without RoPE and its value width; the shared experts (one GLU of
     * n_ff_exp x n_expert_shared), the leading dense layers (n_ff wide), the router's scores
     * (expert_gating 1: softmax, V2; 2: sigmoid with a selection bias and renormalised
     * weights, V3), its expert groups (0: none) and the weights' scale (0: 1). */
    int kv_lora_rank, q_lora_rank, mla_nope, mla_v, n_expert_shared, n_dense_lead, expert_gating;
    int n_expert_groups, n_group_used;
    float expert_weights_scale;
    /* gemma4: one full (global) layer every swa_period layers, the others sliding (head_dim,
     * n_head_kv and the window n_swa are the sliding layers'); the full layers' own head width
     * and kv heads, their V the K projection (attention_k_eq_v: no attn_v), their RoPE on the
     * first n_rot dimensions only (proportional RoPE, as rope_freqs says); the final logits'
     * soft cap (0: none).  With n_expert set, experts beside every layer's dense MLP (26B-A4B). */
    int swa_period, head_dim_full, n_head_kv_full;
    bool v_from_k;
    float logit_softcap;
    /* qwen35 / qwen35moe: multi-token-prediction (NextN) blocks after the n_layer that run, as
     * llama.cpp's converter keeps them (0 or 1): block_count n_layer + n_mtp,
     * nextn_predict_layers n_mtp, block n_layer a full-attention layer of the family plus its
     * nextn.eh_proj / enorm / hnorm / shared_head_norm. */
    int n_mtp;
} mkmodel_config;

/* Fill cfg from a preset: "tiny", "small", "qwen2.5-1.5b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-0.6b",
 * "gemma-3-12b", "gemma-3-27b", "gemma-4-31b" (gemma4: 5 sliding layers of 16 kv heads x 256
 * to 1 full of 4 x 512, K = V there), "gemma-4-26b-a4b" (the same attention over 2816, 128
 * experts of 704, 8 per token, beside a 2112-wide MLP), "qwen3-30b-a3b" (qwen3moe: 128 experts, 8 per token),
 * "qwen3.5-9b" (qwen35: 3 gated DeltaNet layers to 1 gated attention), "qwen3.5-35b-a3b"
 * (qwen35moe: the same layers, 256 experts of 512, 8 per token, 1 shared), "gpt-oss-20b" (24
 * layers of 32 MXFP4 experts, 4 per token, window 128 on alternate layers, YaRN x32),
 * "deepseek-v2-lite" (deepseek2: latent attention, 64 experts of 1408, 6 per token, 2 shared,
 * 1 dense layer), "phi-4-mini" (phi3), "mistral-small-24b" (llama, head_dim 128 of a 5120
 * stream), "glm-4.5-air" (glm4moe: 128 experts of 1408, 8 per token, 1 shared).
 * Returns false for an unknown name. */
bool mkmodel_preset(const char *name, mkmodel_config *cfg);
/* The i-th preset's name (0, 1, ...), NULL past the last. */
const char *mkmodel_preset_name(int i);
/* Switch cfg to another architecture, keeping its sizes (qwen: tied output, NeoX RoPE
 * implied by the arch, bias/norm tensors; qwen3 head_dim from n_embd/n_head; gemma3: its
 * sandwich and QK norms, a window of 1024 with local base 10000 unless cfg has one; qwen3moe
 * and gpt-oss: 8 experts of n_ff / 4, 2 per token, unless cfg has experts already; gpt-oss: a
 * window of 128 and YaRN x32 over 4096 unless cfg has them, and its own output head; deepseek2:
 * the same experts and 1 shared, a dense first layer, a latent 4 heads wide, RoPE on half a
 * head, the sigmoid router with its selection bias; gemma4: Gemma 4's attention scaled to cfg
 * (5 sliding : 1 full, full heads twice as wide with a quarter of the kv heads (at least 1), a
 * quarter of them rotated, K = V, window 1024 at base 10000, soft cap 30)). */
void mkmodel_set_arch(mkmodel_config *cfg, model_arch arch);
int mkmodel_ftype_from_name(const char *name); /* "f32".."q4_k_m"; -1 when unknown */
const char *mkmodel_ftype_name(mkmodel_ftype ft);
/* GGUF general.file_type (llama.cpp's LLAMA_FTYPE numbering). */
uint32_t mkmodel_file_type(mkmodel_ftype ft);

/* gemma4: whether layer il is a full (global) attention layer (else sliding). */
bool mkmodel_gemma4_full(const mkmodel_config *cfg, int il);

/* One tensor of the file mkmodel_write would write: its name, dimensions (ne[1] = ne[2] = 1
 * for a vector, ne[2] = 1 for a matrix) and type. */
typedef struct mkmodel_tensor_info {
    char name[64];
    int64_t ne[3];
    int n_dims;
    ggml_type type;
} mkmodel_tensor_info;
/* The tensors of cfg in file order, without making them (a real-shape preset's list costs
 * nothing): fills out[0..max) and returns the count (call with max 0 to size out), -1 with err
 * when cfg is invalid. */
int mkmodel_list(const mkmodel_config *cfg, mkmodel_tensor_info *out, int max, char *err, size_t errlen);

/* The tensor type of one matrix under cfg->ftype (Q4_K_M: llama.cpp's rule; UD: mkmodel.c's), before the
 * row-length fallback.  layer is -1 for token_embd / output.  Exposed for tests. */
ggml_type mkmodel_tensor_type(const mkmodel_config *cfg, const char *role, int layer);

/* Training text for the tokenizer: README.md then every src/ *.c and *.h file under root
 * (sorted by path), at most max_bytes.  Falls back to a built-in paragraph when root has
 * none, so the result is never empty.  Caller frees. */
char *mkmodel_corpus(const char *root, size_t max_bytes, size_t *len);

/* The text of the file at path (for --words) (a regular file), at most max_bytes; NULL with err.  Caller
 * frees. */
char *mkmodel_read_text(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* The token count of the vocabulary in the GGUF at path, or -1 with err. */
int mkmodel_vocab_size(const char *path, char *err, size_t errlen);
/* Only the metadata mkmodel_write puts in a file (hyper-parameters, tokenizer, chat
 * template), set on w: for checking what a preset writes without its weights.  0, or -1. */
int mkmodel_write_metadata(gguf_writer *w, const mkmodel_config *cfg, const char *corpus,
                           size_t corpus_len, char *err, size_t errlen);
/* Write the model to path (corpus: tokenizer training text).  0, or -1 with err set. */
int mkmodel_write(const mkmodel_config *cfg, const char *corpus, size_t corpus_len,
                  const char *path, char *err, size_t errlen);

#endif
