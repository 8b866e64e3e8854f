/* tiny_model.h - small random models of each architecture, written as GGUF in memory with the
 * gguf writer, for the loader and forward-pass tests. */
#ifndef INFERD_TEST_TINY_MODEL_H
#define INFERD_TEST_TINY_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "synth/mkmodel.h"

typedef struct tiny_spec {
    const char *arch; /* "llama", "qwen2", "qwen3", "gemma3", "gemma4", "bert" (an encoder: n_head_kv,
                       * head_dim, tied and the rope fields unused), "nomic-bert" (the same but
                       * rope_base: 0 writes nomic's 1000), "jina-bert-v2" or anything, to test
                       * refusal */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
    int head_dim;          /* 0: not written (loader derives n_embd / n_head) */
    ggml_type wtype;       /* matrices incl. token_embd and output */
    bool tied;             /* no output.weight */
    bool rope_freqs;       /* write rope_freqs.weight */
    float rope_scale;      /* > 0: rope.scaling.type = linear with this factor */
    float rope_base;       /* 0: key not written (default 10000) */
    bool post_norms;       /* write post_attention_norm and post_ffw_norm (a sandwich-norm family) */
    int n_swa;             /* > 0: attention.sliding_window, rope.freq_base_swa 10000 and a
                            * final_logit_softcapping of 50 (gemma3) */
    /* gemma4 only: layers 2 sliding (head_dim, n_head_kv, window n_swa) : 1 full (this head_dim
     * and kv heads), per-layer embeddings g4_ple wide (0: none), the last g4_kv_shared layers
     * reading earlier layers' K/V with FFNs twice as wide; sandwich norms, QK and V norms, layer
     * scalars and rope_freqs always */
    int g4_head_dim_full, g4_n_kv_full, g4_ple, g4_kv_shared;
    uint64_t seed;
    /* Sabotage, for loader error tests: */
    const char *omit_tensor; /* leave this tensor out */
    const char *bad_tensor;  /* write this tensor with its first dimension doubled */
    const char *omit_key;    /* leave this metadata key out */
} tiny_spec;

/* A valid default: llama, GQA 4/2 heads, F32, untied. */
tiny_spec tiny_spec_default(void);

/* Serialise the model; returns a malloc'd GGUF image (NULL on writer failure). */
void *tiny_model_build(const tiny_spec *s, size_t *size);

/* Load the image with the real loader (the image must outlive the model). */
model *tiny_model_load(const void *image, size_t size, char *err, size_t errlen);

/* mkmodel's model of cfg (its tokenizer learned from the built-in corpus), written to a
 * temporary file, loaded and the file removed; NULL with err. */
model *tiny_mkmodel_load(const mkmodel_config *cfg, char *err, size_t errlen);

#endif
