/* mkmodel.c - the synthetic model generator (see mkmodel.h).
 *
 * Layout of the vocabulary: the 256 byte tokens (id = byte), the learned merges, the special
 * tokens of the architecture's family (marked control), then filler tokens "[PADn]"
 * (marked unused) up to n_vocab.
 *
 * Weights.  Every matrix row is N(0, 1/sqrt(row length)) from a generator seeded by
 * (seed, tensor, row), quantised with quant_quantize_row.  That is exact but costs a few
 * microseconds per thousand weights, too slow for multi-GB presets on a small machine.  So
 * large models (over LARGE_MODEL_PARAMS parameters, or cfg->reuse_rows > 0) REUSE ROWS:
 * for each (type, row length, scale) a pool of POOL_ROWS random rows is quantised once, and
 * row r of a tensor is pool row h(seed, tensor, r) mod POOL_ROWS rotated by a whole number
 * of blocks chosen by the same hash.  The values are then far from independent, but shapes,
 * types and bytes per row are real, and those are what speed depends on: these files are
 * for benchmarks and loaders, not for output quality.
 *
 * Q4_K_M follows llama.cpp's llama_tensor_get_type for that file type, re-derived:
 *   - the MoE router (ffn_gate_inp) stays F32, as llama.cpp's quantiser leaves it;
 *   - output.weight -> Q6_K; token_embd.weight -> Q6_K only when it is also the LM head
 *     (tied output), else Q4_K;
 *   - attn_v and ffn_down (ffn_down_exps too) -> Q6_K in the layers where use_more_bits(i, n) holds:
 *     i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2; Q4_K elsewhere;
 *   - every other matrix Q4_K; norms and biases F32.
 * Q3_K_M follows the same function for its file type (q3_k_m_type): the bulk Q3_K, attn_v
 * Q5_K in the first two layers and Q4_K after, attn_output Q4_K, ffn_down Q5_K in the first
 * n/16 layers and Q4_K after, the output Q6_K (and a tied token_embd with it); with exactly
 * 8 experts attn_k/attn_v Q8_0 and attn_output Q5_K, as llama.cpp bumps them.
 * UD_Q2_K_XL and UD_IQ1_S mimic unsloth's dynamic mixes (see ud_type).
 * The single-type --type values are "pure": every matrix gets that type.
 * A matrix whose row length is not a multiple of the type's block falls back (as llama.cpp
 * does, but within the types our engines support): K-quants -> Q8_0, then -> F16. */
#include "mkmodel.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe_train.h"
#include "model/gguf.h"
#include "gguf_write.h"
#include "model/quant.h"
#include "base/file.h"
#include "base/rng.h"
#include "words.h"

#define LARGE_MODEL_PARAMS 300000000LL
#define POOL_ROWS 64
#define MAX_DIM 65536          /* any single dimension (hostile flags never over-allocate) */
#define MAX_VOCAB 1048576
#define MAX_LAYERS 512
#define MAX_MERGES 50000
#define CORPUS_FILE_MAX (256u << 10) /* bigger files are data tables, not text */
/* --words: the LM head rows of whole-word tokens are drawn this many times wider, so their
 * logits (std ~ WORD_BOOST against ~1 for the other tokens) win the sampling nearly always. */
#define WORD_BOOST 5.0f

static const char *const ftype_names[MKMODEL_FTYPE_COUNT] = {
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m",
    "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "iq4_nl", "iq4_xs",
    "iq3_s", "iq3_xxs", "iq2_s", "iq2_xs", "iq2_xxs", "iq1_m", "iq1_s", "mxfp4",
    "ud_q2_k_xl", "ud_iq1_s", "q3_k_m",
};

int mkmodel_ftype_from_name(const char *name)
{
    for (int i = 0; name && i < MKMODEL_FTYPE_COUNT; i++)
        if (strcasecmp(name, ftype_names[i]) == 0) return i;
    return -1;
}

const char *mkmodel_ftype_name(mkmodel_ftype ft)
{
    return (unsigned)ft < MKMODEL_FTYPE_COUNT ? ftype_names[ft] : "?";
}

uint32_t mkmodel_file_type(mkmodel_ftype ft)
{
    /* LLAMA_FTYPE_ALL_F32 0, MOSTLY_F16 1, BF16 32, Q4_0 2, Q8_0 7, Q4_K_S 14, Q4_K_M 15,
     * Q5_K_S 16, Q6_K 18; Q4_1 3, Q5_0 8, Q5_1 9, Q2_K 10, Q3_K_S 11, IQ4_NL 25, IQ4_XS 30;
     * IQ3_S 26, IQ3_XXS 23, IQ2_S 28, IQ2_XS 20, IQ2_XXS 19, IQ1_M 31, IQ1_S 24, MXFP4_MOE 38;
     * the UD mixes under their base type (as unsloth's files are: Q2_K 10, IQ1_S 24); Q3_K_M 12 */
    static const uint32_t ids[MKMODEL_FTYPE_COUNT] = {0,  1,  32, 7,  2,  14, 16, 18, 15, 3,  8,  9,  10,
                                                      11, 25, 30, 26, 23, 28, 20, 19, 31, 24, 38, 10, 24, 12};
    return (unsigned)ft < MKMODEL_FTYPE_COUNT ? ids[ft] : 0;
}

/* ---- presets ---------------------------------------------------------------------------- */
void mkmodel_set_arch(mkmodel_config *cfg, model_arch arch)
{
    cfg->arch = arch;
    /* tied as the qwen line's small models; the llama line, gpt-oss and DeepSeek, GLM-4.5, Phi-3 not */
    cfg->tied_output = arch != MODEL_ARCH_LLAMA && arch != MODEL_ARCH_GPTOSS && arch != MODEL_ARCH_DEEPSEEK2 &&
                       arch != MODEL_ARCH_GLM4MOE && arch != MODEL_ARCH_PHI3 &&
                       arch != MODEL_ARCH_NOMIC_BERT; /* an encoder has no head to tie */
    cfg->head_dim = 0;
    if (arch == MODEL_ARCH_GEMMA3 && cfg->n_swa == 0) cfg->n_swa = 1024, cfg->rope_base_swa = 10000.0f;
    if (arch == MODEL_ARCH_GPTOSS && cfg->n_swa == 0) cfg->n_swa = 128;
    if (arch == MODEL_ARCH_GPTOSS && cfg->yarn_factor == 0) cfg->yarn_factor = 32.0f, cfg->yarn_orig_ctx = 4096;
    const bool routed = arch == MODEL_ARCH_QWEN3MOE || arch == MODEL_ARCH_GPTOSS || arch == MODEL_ARCH_DEEPSEEK2 ||
                        arch == MODEL_ARCH_GLM4MOE;
    if (routed && cfg->n_expert == 0) {
        cfg->n_expert = 8;
        cfg->n_expert_used = 2;
        cfg->n_ff_exp = cfg->n_ff / 4 > 0 ? cfg->n_ff / 4 : 1;
    }
    if (arch == MODEL_ARCH_DEEPSEEK2 && cfg->kv_lora_rank == 0) {
        const int hd = cfg->n_embd / cfg->n_head;
        cfg->kv_lora_rank = 4 * hd, cfg->mla_nope = hd, cfg->mla_v = hd, cfg->n_rot = hd / 2 / 2 * 2;
        cfg->n_expert_shared = 1, cfg->n_dense_lead = 1, cfg->expert_gating = 2;
        cfg->n_head_kv = 1; /* one latent shared by the heads, as the file says */
    }
    const int hd = cfg->n_embd / cfg->n_head;
    if (arch == MODEL_ARCH_GLM4MOE && cfg->n_expert_shared == 0) { /* GLM-4.5's: one group */
        cfg->n_expert_shared = 1, cfg->n_dense_lead = 1, cfg->expert_gating = 2, cfg->n_rot = hd / 2 / 2 * 2;
        cfg->n_expert_groups = 1, cfg->n_group_used = 1;
    }
    if (arch == MODEL_ARCH_PHI3 && cfg->n_rot == 0) cfg->n_rot = hd * 3 / 4 / 2 * 2; /* Phi-4-mini's share */
    if (arch == MODEL_ARCH_GEMMA4 && cfg->swa_period == 0) { /* Gemma 4's attention at cfg's size */
        if (cfg->n_swa == 0) cfg->n_swa = 1024, cfg->rope_base_swa = 10000.0f;
        cfg->swa_period = 6, cfg->head_dim_full = 2 * hd, cfg->v_from_k = true, cfg->logit_softcap = 30.0f;
        cfg->n_head_kv_full = cfg->n_head_kv % 4 == 0 ? cfg->n_head_kv / 4 : 1;
        cfg->n_rot = hd / 2 / 2 * 2 > 2 ? hd / 2 / 2 * 2 : 2; /* a quarter of the full head */
    }
    if (arch == MODEL_ARCH_NOMIC_BERT) { /* an encoder: every head its own K/V, mean-pooled */
        cfg->n_head_kv = cfg->n_head;
        if (cfg->pooling == 0) cfg->pooling = 2; /* mean */
    }
}

static const struct preset {
    const char *name;
    mkmodel_config c;
} presets[] = {
    {"tiny", {MODEL_ARCH_LLAMA, "inferd-tiny", 64, 2, 4, 2, 128, 512, 1024, 0, 10000.0f, 1e-5f,
              false, MKMODEL_F32, 1, 0, NULL, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    {"small", {MODEL_ARCH_LLAMA, "inferd-small", 512, 6, 8, 4, 1536, 4096, 8192, 0, 10000.0f,
               1e-5f, false, MKMODEL_Q8_0, 1, 0, NULL, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    {"qwen2.5-1.5b", {MODEL_ARCH_QWEN2, "synthetic Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 32768,
                      151936, 0, 1000000.0f, 1e-6f, true, MKMODEL_Q4_K_M, 1, 0, NULL, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    {"llama-3.1-8b", {MODEL_ARCH_LLAMA, "synthetic Llama-3.1-8B", 4096, 32, 32, 8, 14336,
                      131072, 128256, 0, 500000.0f, 1e-5f, false, MKMODEL_Q4_K_M, 1, 0, NULL, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    /* the 70B class of issue 35's tensor-parallel targets (meta-llama/Llama-3.1-70B config.json):
     * ~40 GB at Q4_K_M; --n-layer cuts it for a quick file */
    {"llama-3.1-70b", {MODEL_ARCH_LLAMA, "synthetic Llama-3.1-70B", 8192, 80, 64, 8, 28672,
                       131072, 128256, 0, 500000.0f, 1e-5f, false, MKMODEL_Q4_K_M, 1, 0, NULL, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    {"qwen3-0.6b", {MODEL_ARCH_QWEN3, "synthetic Qwen3-0.6B", 1024, 28, 16, 8, 3072, 40960,
                    151936, 128, 1000000.0f, 1e-6f, true, MKMODEL_Q8_0, 1, 0, NULL, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    /* Gemma 3 (google/gemma-3-{12b,27b}-it config.json): window 1024, local base 10000, the
     * global layers' base 1M with linear scaling 8, no final soft-cap (Gemma 2 had one). */
    {"gemma-3-12b", {MODEL_ARCH_GEMMA3, "synthetic Gemma-3-12B", 3840, 48, 16, 8, 15360, 131072,
                     262144, 256, 1000000.0f, 1e-6f, true, MKMODEL_Q4_K_M, 1, 0, NULL, false, 1024,
                     10000.0f, 8.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    {"gemma-3-27b", {MODEL_ARCH_GEMMA3, "synthetic Gemma-3-27B", 5376, 62, 32, 16, 21504, 131072,
                     262144, 128, 1000000.0f, 1e-6f, true, MKMODEL_Q4_K_M, 1, 0, NULL, false, 1024,
                     10000.0f, 8.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    /* Gemma 4 31B (google/gemma-4-31B-it config.json, text_config): 60 layers over 5376, five
     * sliding layers (32 heads of 256 over 16 kv heads, window 1024, RoPE base 10000 on the whole
     * head) to one full layer (32 heads of 512 over 4 kv heads, V = K (attention_k_eq_v),
     * "proportional" RoPE at base 1e6 on a quarter of the head: 128 of 512 dimensions), GeGLU of
     * 21504, logits soft-capped at 30, LM head tied, 262,144-token vocabulary */
    {"gemma-4-31b", {.arch = MODEL_ARCH_GEMMA4, .name = "synthetic Gemma-4-31B", .n_embd = 5376, .n_layer = 60,
                     .n_head = 32, .n_head_kv = 16, .n_ff = 21504, .n_ctx = 262144, .n_vocab = 262144,
                     .head_dim = 256, .rope_base = 1000000.0f, .rms_eps = 1e-6f, .tied_output = true,
                     .ftype = MKMODEL_Q4_K_M, .seed = 1, .n_swa = 1024, .rope_base_swa = 10000.0f, .n_rot = 128,
                     .swa_period = 6, .head_dim_full = 512, .n_head_kv_full = 4, .v_from_k = true,
                     .logit_softcap = 30.0f}},
    /* Gemma 4 26B-A4B (google/gemma-4-26B-A4B-it config.json): the 31B's attention pattern over
     * 2816 in 30 layers (16 heads; sliding 8 kv heads of 256, full 2 of 512, V = K), every layer
     * a 2112-wide GeGLU beside 128 experts of 704, 8 per token (enable_moe_block) */
    {"gemma-4-26b-a4b", {.arch = MODEL_ARCH_GEMMA4, .name = "synthetic Gemma-4-26B-A4B", .n_embd = 2816,
                         .n_layer = 30, .n_head = 16, .n_head_kv = 8, .n_ff = 2112, .n_ctx = 262144,
                         .n_vocab = 262144, .head_dim = 256, .rope_base = 1000000.0f, .rms_eps = 1e-6f,
                         .tied_output = true, .ftype = MKMODEL_Q4_K_M, .seed = 1, .n_swa = 1024,
                         .rope_base_swa = 10000.0f, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 704,
                         .n_rot = 128, .swa_period = 6, .head_dim_full = 512, .n_head_kv_full = 2,
                         .v_from_k = true, .logit_softcap = 30.0f}},
    /* Qwen3-30B-A3B (and Qwen3-Coder-30B-A3B): 128 experts of 768, 8 per token */
    {"qwen3-30b-a3b", {MODEL_ARCH_QWEN3MOE, "synthetic Qwen3-30B-A3B", 2048, 48, 32, 4, 6144, 40960,
                       151936, 128, 1000000.0f, 1e-6f, false, MKMODEL_Q4_K_M, 1, 0, NULL, false, 0, 0.0f,
                       0.0f, 128, 8, 768, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    /* Qwen3.5-9B (qwen35): 8 of its 32 layers gated attention (16 heads of 256, 4 KV heads,
     * RoPE on a quarter of each head, base 1e7), the rest gated DeltaNet (16 q/k heads and 32 v
     * heads of 128, conv of 4) */
    {"qwen3.5-9b", {MODEL_ARCH_QWEN35, "synthetic Qwen3.5-9B", 4096, 32, 16, 4, 12288, 262144, 248320, 256,
                    10000000.0f, 1e-6f, false, MKMODEL_Q4_K_M, 1, 0, NULL, false, 0, 0.0f, 0.0f, 0, 0, 0, 0,
                    4, 128, 16, 32, 4096, 64, 0.0f, 0,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    /* Qwen3.5-35B-A3B (qwen35moe; Qwen/Qwen3.5-35B-A3B config.json): 40 layers over a 2048-wide
     * stream, 10 of them gated attention (16 heads of 256, 2 KV heads, RoPE on a quarter of each
     * head, base 1e7), the rest gated DeltaNet (16 q/k heads and 32 v heads of 128, conv of 4);
     * every feed-forward 256 experts of 512, 8 per token, plus one shared expert of 512 behind
     * its sigmoid gate; untied LM head over the 248,320-token vocabulary */
    {"qwen3.5-35b-a3b", {.arch = MODEL_ARCH_QWEN35MOE, .name = "synthetic Qwen3.5-35B-A3B", .n_embd = 2048,
                         .n_layer = 40, .n_head = 16, .n_head_kv = 2, .n_ff = 512, .n_ctx = 262144,
                         .n_vocab = 248320, .head_dim = 256, .rope_base = 10000000.0f, .rms_eps = 1e-6f,
                         .ftype = MKMODEL_Q4_K_M, .seed = 1, .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 512,
                         .ssm_conv = 4, .ssm_state = 128, .ssm_groups = 16, .ssm_vheads = 32, .ssm_inner = 4096,
                         .n_rot = 64, .n_expert_shared = 1}},
    /* gpt-oss-20b (openai/gpt-oss-20b config.json): 64 query and 8 KV heads of 64, 32 experts
     * of 2880, 4 per token, window 128 on the even layers, RoPE base 150000 with YaRN x32 over
     * 4096; its o200k vocabulary's 201,088 tokens (learned BPE padded with fillers here), the
     * experts MXFP4 and the rest Q8_0 */
    {"gpt-oss-20b", {MODEL_ARCH_GPTOSS, "synthetic gpt-oss-20b", 2880, 24, 64, 8, 2880, 131072, 201088, 64,
                     150000.0f, 1e-5f, false, MKMODEL_MXFP4, 1, 0, NULL, false, 128, 0.0f, 0.0f, 32, 4, 2880, 0,
                     0, 0, 0, 0, 0, 0, 32.0f, 4096,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0.0f, 0}},
    /* DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite config.json): latent attention without a
     * query LoRA (kv_lora_rank 512, 16 heads of 128 + 64 RoPE, values 128), 64 experts of 1408,
     * 6 per token, softmax scores not renormalised, 2 shared, the first layer dense (10944).
     * Its YaRN scaling (factor 40) is left out: a synthetic file's context is its own. */
    {"deepseek-v2-lite", {.arch = MODEL_ARCH_DEEPSEEK2, .name = "synthetic DeepSeek-V2-Lite", .n_embd = 2048,
                          .n_layer = 27, .n_head = 16, .n_head_kv = 1, .n_ff = 10944, .n_ctx = 163840,
                          .n_vocab = 102400, .rope_base = 10000.0f, .rms_eps = 1e-6f, .ftype = MKMODEL_Q4_K_M,
                          .seed = 1, .n_expert = 64, .n_expert_used = 6, .n_ff_exp = 1408, .n_rot = 64,
                          .kv_lora_rank = 512, .mla_nope = 128, .mla_v = 128, .n_expert_shared = 2,
                          .n_dense_lead = 1, .expert_gating = 1}},
    /* Phi-4-mini-instruct (microsoft/Phi-4-mini-instruct config.json): 24 heads of 128 over 8
     * KV heads, RoPE on 3/4 of each head with LongRoPE over 4096, the 200,064-token vocabulary
     * (a learned BPE padded with fillers here), tied LM head */
    {"phi-4-mini", {.arch = MODEL_ARCH_PHI3, .name = "synthetic Phi-4-mini", .n_embd = 3072, .n_layer = 32,
                    .n_head = 24, .n_head_kv = 8, .n_ff = 8192, .n_ctx = 131072, .n_vocab = 200064,
                    .rope_base = 10000.0f, .rms_eps = 1e-5f, .tied_output = true, .ftype = MKMODEL_Q4_K_M,
                    .seed = 1, .n_rot = 96}},
    /* Mistral-Small-24B-Instruct-2501 (its config.json; Devstral / Magistral Small share it): the
     * llama architecture with 32 heads of 128 over a 5120-wide stream (head_dim != n_embd /
     * n_head), 8 KV heads, RoPE base 1e8, the 131,072-token Tekken-sized vocabulary */
    {"mistral-small-24b", {.arch = MODEL_ARCH_LLAMA, .name = "synthetic Mistral-Small-24B", .n_embd = 5120,
                           .n_layer = 40, .n_head = 32, .n_head_kv = 8, .n_ff = 32768, .n_ctx = 32768,
                           .n_vocab = 131072, .head_dim = 128, .rope_base = 100000000.0f, .rms_eps = 1e-5f,
                           .ftype = MKMODEL_Q4_K_M, .seed = 1}},
    /* GLM-4.5-Air (zai-org/GLM-4.5-Air config.json): 96 heads of 128 over 8 KV heads with QKV
     * bias, RoPE on half a head, the first layer dense (10944), then 128 sigmoid-routed experts
     * of 1408, 8 per token, renormalised, one shared.  Its 46 layers make ~64 GB at Q4_K_M:
     * benchmarks take fewer with --n-layer (per-layer shapes unchanged). */
    {"glm-4.5-air", {.arch = MODEL_ARCH_GLM4MOE, .name = "synthetic GLM-4.5-Air", .n_embd = 4096, .n_layer = 46,
                     .n_head = 96, .n_head_kv = 8, .n_ff = 10944, .n_ctx = 131072, .n_vocab = 151552,
                     .head_dim = 128, .rope_base = 1000000.0f, .rms_eps = 1e-5f, .ftype = MKMODEL_Q4_K_M,
                     .seed = 1, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 1408, .n_rot = 64,
                     .n_expert_shared = 1, .n_dense_lead = 1, .expert_gating = 2, .n_expert_groups = 1,
                     .n_group_used = 1}},
    /* nomic-embed-text-v1.5 (nomic-ai/nomic-embed-text-v1.5 config.json): a nomic-bert encoder
     * of 12 layers, 12 heads of 64, SwiGLU of 3072, rotary base 1000, 2048 positions, BERT's
     * 30522-token vocabulary (a learned BPE padded with fillers here), mean pooling; F16 as the
     * published GGUF */
    {"nomic-embed-text-v1.5", {.arch = MODEL_ARCH_NOMIC_BERT, .name = "synthetic nomic-embed-text-v1.5",
                               .n_embd = 768, .n_layer = 12, .n_head = 12, .n_head_kv = 12, .n_ff = 3072,
                               .n_ctx = 2048, .n_vocab = 30522, .rope_base = 1000.0f, .rms_eps = 1e-12f,
                               .ftype = MKMODEL_F16, .seed = 1, .pooling = 2 /* mean */}},
};

bool mkmodel_preset(const char *name, mkmodel_config *cfg)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name) == 0) {
            *cfg = presets[i].c;
            return true;
        }
    }
    return false;
}

const char *mkmodel_preset_name(int i)
{
    return i >= 0 && (size_t)i < sizeof presets / sizeof presets[0] ? presets[i].name : NULL;
}

/* ---- tensor types ----------------------------------------------------------------------- */
static bool use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

bool mkmodel_gemma4_full(const mkmodel_config *cfg, int il)
{
    return cfg->swa_period > 0 && (il + 1) % cfg->swa_period == 0;
}

/* llama.cpp counts attn_v tensors, not layers, for its attn_v rule: in a gemma4 whose full
 * layers take V from K, layer's attn_v is the *i-th of *n (the sliding layers'). */
static void attn_v_position(const mkmodel_config *cfg, int layer, int *i, int *n)
{
    *i = layer, *n = cfg->n_layer;
    if (cfg->arch != MODEL_ARCH_GEMMA4 || !cfg->v_from_k) return;
    *i = *n = 0;
    for (int il = 0; il < cfg->n_layer; il++) {
        if (mkmodel_gemma4_full(cfg, il)) continue;
        if (il < layer) (*i)++;
        (*n)++;
    }
}

/* The UD-style mixes keep the bits where the error hurts most and starve the bulk (the FFN's
 * gate and up, most of the parameters): output Q6_K, token_embd Q4_K, attention at 4-6 bits,
 * ffn_down a step above gate/up, and the first and last layers' FFN a step
 * up again.  UD-Q2_K_XL: gate/up Q2_K, down Q3_K; UD-IQ1_S: gate/up IQ1_S, down IQ2_XXS,
 * attention IQ4_XS / IQ3_S, the ends IQ2_S and IQ3_XXS. */
static ggml_type ud_type(const mkmodel_config *cfg, const char *role, int layer)
{
    const bool iq1 = cfg->ftype == MKMODEL_UD_IQ1_S;
    if (strcmp(role, "output") == 0) return GGML_TYPE_Q6_K;
    if (strcmp(role, "token_embd") == 0) return GGML_TYPE_Q4_K;
    const bool ends = layer == 0 || layer == cfg->n_layer - 1;
    if (strcmp(role, "attn_v") == 0)
        return use_more_bits(layer, cfg->n_layer) ? GGML_TYPE_Q6_K : iq1 ? GGML_TYPE_IQ4_XS : GGML_TYPE_Q5_K;
    if (strcmp(role, "attn_q") == 0 || strcmp(role, "attn_k") == 0)
        return iq1 ? GGML_TYPE_IQ3_S : GGML_TYPE_Q4_K;
    if (strcmp(role, "attn_output") == 0) return iq1 ? GGML_TYPE_IQ3_XXS : GGML_TYPE_IQ4_XS;
    if (strcmp(role, "ffn_down") == 0)
        return ends ? (iq1 ? GGML_TYPE_IQ3_XXS : GGML_TYPE_IQ4_XS) : iq1 ? GGML_TYPE_IQ2_XXS : GGML_TYPE_Q3_K;
    /* ffn_gate, ffn_up */
    return ends ? (iq1 ? GGML_TYPE_IQ2_S : GGML_TYPE_Q3_K) : iq1 ? GGML_TYPE_IQ1_S : GGML_TYPE_Q2_K;
}

/* llama.cpp's Q3_K_M (llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q3_K_M), re-derived: the
 * most used 3-bit file people download.  The attention's V and output and the FFN's down
 * product keep 4-5 bits; Q, K, gate and up (most of the parameters) take Q3_K. */
static ggml_type q3_k_m_type(const mkmodel_config *cfg, const char *role, int layer)
{
    const bool eight_experts = cfg->n_expert == 8;
    if (strcmp(role, "output") == 0) return GGML_TYPE_Q6_K;
    if (strcmp(role, "token_embd") == 0) return cfg->tied_output ? GGML_TYPE_Q6_K : GGML_TYPE_Q3_K;
    if (strcmp(role, "attn_v") == 0) return eight_experts ? GGML_TYPE_Q8_0 : layer < 2 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
    if (strcmp(role, "attn_k") == 0 && eight_experts) return GGML_TYPE_Q8_0;
    if (strcmp(role, "attn_output") == 0) return eight_experts ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
    if (strncmp(role, "ffn_down", 8) == 0) /* ffn_down_exps too */
        return layer < cfg->n_layer / 16 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
    return GGML_TYPE_Q3_K;
}

ggml_type mkmodel_tensor_type(const mkmodel_config *cfg, const char *role, int layer)
{
    if (strcmp(role, "ffn_gate_inp") == 0) return GGML_TYPE_F32; /* llama.cpp never quantises the router */
    if (strcmp(role, "ffn_gate_inp_shexp") == 0) return GGML_TYPE_F32; /* the shared expert's gate row, read as floats */
    if (strcmp(role, "ssm_conv1d") == 0) return GGML_TYPE_F32;   /* read as plain floats (arch/hybrid.c) */
    if (strcmp(role, "token_types") == 0) return GGML_TYPE_F32;  /* an encoder's two rows, F32 as converted */
    static const ggml_type pure[MKMODEL_FTYPE_COUNT] = {
        GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,   GGML_TYPE_Q4_K,
        GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q4_K, GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0,
        GGML_TYPE_Q5_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
        GGML_TYPE_IQ3_S, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_XXS,
        GGML_TYPE_IQ1_M, GGML_TYPE_IQ1_S, GGML_TYPE_MXFP4,
    };
    if (strstr(role, "_bias")) return GGML_TYPE_F32; /* gpt-oss's expert biases: F32 as the converter writes them */
    if (cfg->ftype == MKMODEL_UD_Q2_K_XL || cfg->ftype == MKMODEL_UD_IQ1_S) return ud_type(cfg, role, layer);
    if (cfg->ftype == MKMODEL_Q3_K_M) return q3_k_m_type(cfg, role, layer);
    if (cfg->arch == MODEL_ARCH_GPTOSS && cfg->ftype == MKMODEL_MXFP4 && !strstr(role, "_exps"))
        return GGML_TYPE_Q8_0; /* MOSTLY_MXFP4_MOE: the experts alone in MXFP4 */
    if (cfg->ftype != MKMODEL_Q4_K_M) return pure[cfg->ftype];
    if (strcmp(role, "output") == 0) return GGML_TYPE_Q6_K;
    if (strcmp(role, "token_embd") == 0) return cfg->tied_output ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
    if (strcmp(role, "attn_v") == 0) {
        int v_i, v_n;
        attn_v_position(cfg, layer, &v_i, &v_n);
        return use_more_bits(v_i, v_n) ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
    }
    if (strncmp(role, "ffn_down", 8) == 0 && use_more_bits(layer, cfg->n_layer)) /* ffn_down_exps too */
        return GGML_TYPE_Q6_K;
    return GGML_TYPE_Q4_K;
}

/* The type of a matrix whose rows do not fit its rule's blocks: llama-quantize's
 * (llama-quant.cpp, tensor_type_fallback): the IQ formats of 256 to IQ4_NL, Q2_K / Q3_K to
 * Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0; F16 where that does not fit either (e.g.
 * Gemma 4 26B-A4B's 704- and 2112-wide down rows: Q5_0, and Q8_0 in its Q6_K layers). */
static ggml_type row_fallback(ggml_type t, int64_t ne0)
{
    if (ne0 % (int64_t)ggml_type_block_elems(t) == 0) return t;
    ggml_type f;
    switch (t) {
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K: f = GGML_TYPE_Q4_0; break;
    case GGML_TYPE_Q4_K: f = GGML_TYPE_Q5_0; break;
    case GGML_TYPE_Q5_K: f = GGML_TYPE_Q5_1; break;
    case GGML_TYPE_Q6_K: f = GGML_TYPE_Q8_0; break;
    default: f = ggml_type_block_elems(t) == QK_K ? GGML_TYPE_IQ4_NL : GGML_TYPE_F16; /* the IQ formats */
    }
    return ne0 % (int64_t)ggml_type_block_elems(f) == 0 ? f : GGML_TYPE_F16;
}

/* ---- random numbers --------------------------------------------------------------------- */
/* n samples of N(0, std) (Box-Muller) */
static void fill_normal(uint64_t state, float *out, int64_t n, float std)
{
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((rng_next(&state) >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
        double u2 = (rng_next(&state) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)) * std;
        out[i] = (float)(r * cos(2.0 * M_PI * u2));
        if (i + 1 < n) out[i + 1] = (float)(r * sin(2.0 * M_PI * u2));
    }
}

static uint64_t stream_of(uint64_t seed, uint64_t tensor, uint64_t row)
{
    uint64_t s = seed ^ (tensor * 0xd1b54a32d192ed03ull) ^ (row * 0x8cb92ba72f3d8dd7ull);
    return rng_next(&s);
}

/* Quantise one row of floats into dst (ggml_row_bytes(type, n) bytes). */
static bool encode_row(ggml_type type, const float *x, void *dst, int64_t n)
{
    if (type == GGML_TYPE_F32) {
        memcpy(dst, x, (size_t)n * sizeof *x);
        return true;
    }
    if (type == GGML_TYPE_F16) {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = quant_f32_to_f16(x[i]);
        return true;
    }
    return quant_quantize_row(type, x, dst, n) > 0;
}

/* ---- tensor generation ------------------------------------------------------------------ */
typedef struct row_pool {
    ggml_type type;
    int64_t ne0;
    float std;
    uint8_t *rows; /* POOL_ROWS rows */
} row_pool;

typedef struct gen_shared {
    uint64_t seed;
    float *xrow;    /* floats of one row */
    uint8_t *row;   /* encoded row */
    const void *cur_tensor;
    int64_t cur_row;
    row_pool **pools; /* each allocated once: tensor_gen keeps pointers */
    int n_pools;
} gen_shared;

typedef struct tensor_gen {
    gen_shared *g;
    uint64_t id; /* index of the tensor: part of the seed */
    ggml_type type;
    int64_t ne0, ne1;
    float std;
    size_t row_bytes;
    const row_pool *pool; /* NULL: every row fresh */
    const bool *word_rows; /* --words, the LM head: rows drawn WORD_BOOST times wider */
} tensor_gen;

static const uint8_t *tensor_row(tensor_gen *t, int64_t r)
{
    gen_shared *g = t->g;
    if (g->cur_tensor == t && g->cur_row == r) return g->row;
    uint64_t h = stream_of(g->seed, t->id, (uint64_t)r);
    if (t->pool) {
        /* reused row: pool row h % POOL_ROWS, rotated by a whole number of blocks */
        const uint8_t *src = t->pool->rows + (h % POOL_ROWS) * t->row_bytes;
        size_t bb = ggml_type_block_bytes(t->type);
        size_t n_blocks = t->row_bytes / bb, k = (size_t)(h >> 32) % n_blocks * bb;
        memcpy(g->row, src + k, t->row_bytes - k);
        memcpy(g->row + (t->row_bytes - k), src, k);
    } else {
        fill_normal(h, g->xrow, t->ne0, t->word_rows && t->word_rows[r] ? t->std * WORD_BOOST : t->std);
        encode_row(t->type, g->xrow, g->row, t->ne0);
    }
    g->cur_tensor = t;
    g->cur_row = r;
    return g->row;
}

static void tensor_fill(void *ctx, size_t off, void *dst, size_t len)
{
    tensor_gen *t = ctx;
    uint8_t *out = dst;
    while (len > 0) {
        int64_t r = (int64_t)(off / t->row_bytes);
        size_t in = off % t->row_bytes, n = t->row_bytes - in;
        if (n > len) n = len;
        memcpy(out, tensor_row(t, r) + in, n);
        out += n;
        off += n;
        len -= n;
    }
}

static const row_pool *pool_get(gen_shared *g, ggml_type type, int64_t ne0, float std)
{
    for (int i = 0; i < g->n_pools; i++)
        if (g->pools[i]->type == type && g->pools[i]->ne0 == ne0 && g->pools[i]->std == std)
            return g->pools[i];
    row_pool **pools = realloc(g->pools, (size_t)(g->n_pools + 1) * sizeof *pools);
    if (!pools) return NULL;
    g->pools = pools;
    size_t rb = ggml_row_bytes(type, ne0);
    row_pool *p = malloc(sizeof *p);
    if (!p) return NULL;
    *p = (row_pool){type, ne0, std, malloc(rb * POOL_ROWS)};
    pools[g->n_pools++] = p; /* owned from here on, even if incomplete */
    if (!p->rows) return NULL;
    for (int r = 0; r < POOL_ROWS; r++) {
        fill_normal(stream_of(g->seed, 0x9001 + (uint64_t)g->n_pools, (uint64_t)r), g->xrow, ne0, std);
        if (!encode_row(type, g->xrow, p->rows + (size_t)r * rb, ne0)) return NULL;
    }
    return p;
}

/* ---- the tensor list -------------------------------------------------------------------- */
typedef struct tensor_spec {
    char name[64];
    const char *role; /* for the Q4_K_M rule */
    int layer;        /* -1 outside the blocks */
    int64_t ne0, ne1; /* ne1 = 0: a vector */
    int64_t ne2;      /* > 1: a 3-D tensor of ne2 matrices (a MoE layer's experts) */
    float std;        /* N(0, std); 0 = all ones (norm weights) */
} tensor_spec;

typedef struct tensor_list {
    tensor_spec *specs; /* NULL: only count */
    int n;
} tensor_list;

static void add_spec(tensor_list *l, int layer, const char *role, const char *suffix, int64_t ne0,
                     int64_t ne1, float std)
{
    if (l->specs) {
        tensor_spec *s = &l->specs[l->n];
        if (layer >= 0)
            snprintf(s->name, sizeof s->name, "blk.%d.%s", layer, suffix);
        else
            snprintf(s->name, sizeof s->name, "%s", suffix);
        s->role = role;
        s->layer = layer;
        s->ne0 = ne0;
        s->ne1 = ne1;
        s->ne2 = 1;
        s->std = std;
    }
    l->n++;
}

/* A weight matrix: role "attn_q" is tensor "attn_q.weight", N(0, 1/sqrt(fan_in)). */
static void add_matrix(tensor_list *l, int layer, const char *role, int64_t ne0, int64_t ne1)
{
    char suffix[48];
    snprintf(suffix, sizeof suffix, "%s.weight", role);
    add_spec(l, layer, role, suffix, ne0, ne1, 1.0f / sqrtf((float)ne0));
}

/* A MoE layer's 3-D expert tensor: ne2 matrices of [ne0 -> ne1] ("ffn_gate_exps.weight"). */
static void add_experts(tensor_list *l, int layer, const char *role, int64_t ne0, int64_t ne1, int64_t ne2)
{
    add_matrix(l, layer, role, ne0, ne1);
    if (l->specs) l->specs[l->n - 1].ne2 = ne2;
}

static int head_dim_of(const mkmodel_config *c)
{
    return c->head_dim > 0 ? c->head_dim : c->n_embd / c->n_head;
}

/* One qwen35 layer (arch/hybrid.c's names): every fourth gated attention ([query | gate] per
 * head, qk norm), as is an MTP block (il >= n_layer), the others gated DeltaNet (A = -exp(N(0, 0.5)) so that every decay is below
 * 1); then the GLU, whose norm the converter calls post_attention_norm (qwen35moe: the experts
 * and the shared expert instead). */
static void list_hybrid_layer(tensor_list *l, const mkmodel_config *c, int il)
{
    const int64_t hd = head_dim_of(c), q_dim = c->n_head * hd, kv_dim = c->n_head_kv * hd;
    const int64_t chan = 2 * (int64_t)c->ssm_groups * c->ssm_state + c->ssm_inner;
    add_spec(l, il, "norm", "attn_norm.weight", c->n_embd, 0, 0);
    if (il % 4 == 3 || il >= c->n_layer) {
        add_matrix(l, il, "attn_q", c->n_embd, 2 * q_dim);
        add_matrix(l, il, "attn_k", c->n_embd, kv_dim);
        add_matrix(l, il, "attn_v", c->n_embd, kv_dim);
        add_matrix(l, il, "attn_output", q_dim, c->n_embd);
        add_spec(l, il, "norm", "attn_q_norm.weight", hd, 0, 0);
        add_spec(l, il, "norm", "attn_k_norm.weight", hd, 0, 0);
    } else {
        add_matrix(l, il, "attn_qkv", c->n_embd, chan);
        add_matrix(l, il, "attn_gate", c->n_embd, c->ssm_inner);
        add_matrix(l, il, "ssm_conv1d", c->ssm_conv, chan);
        add_spec(l, il, "ssm_a", "ssm_a", c->ssm_vheads, 0, 0.5f);
        add_spec(l, il, "bias", "ssm_dt.bias", c->ssm_vheads, 0, 0.5f);
        add_spec(l, il, "norm", "ssm_norm.weight", c->ssm_state, 0, 0);
        add_matrix(l, il, "ssm_beta", c->n_embd, c->ssm_vheads);
        add_matrix(l, il, "ssm_alpha", c->n_embd, c->ssm_vheads);
        add_matrix(l, il, "ssm_out", c->ssm_inner, c->n_embd);
    }
    add_spec(l, il, "norm", "post_attention_norm.weight", c->n_embd, 0, 0);
    if (c->arch == MODEL_ARCH_QWEN35MOE) { /* the routed experts, then the shared one and its gate's row */
        const int64_t shexp = (int64_t)c->n_ff_exp * c->n_expert_shared;
        add_matrix(l, il, "ffn_gate_inp", c->n_embd, c->n_expert);
        add_experts(l, il, "ffn_gate_exps", c->n_embd, c->n_ff_exp, c->n_expert);
        add_experts(l, il, "ffn_up_exps", c->n_embd, c->n_ff_exp, c->n_expert);
        add_experts(l, il, "ffn_down_exps", c->n_ff_exp, c->n_embd, c->n_expert);
        add_matrix(l, il, "ffn_gate_inp_shexp", c->n_embd, 1);
        add_matrix(l, il, "ffn_gate_shexp", c->n_embd, shexp);
        add_matrix(l, il, "ffn_up_shexp", c->n_embd, shexp);
        add_matrix(l, il, "ffn_down_shexp", shexp, c->n_embd);
        return;
    }
    add_matrix(l, il, "ffn_gate", c->n_embd, c->n_ff);
    add_matrix(l, il, "ffn_up", c->n_embd, c->n_ff);
    add_matrix(l, il, "ffn_down", c->n_ff, c->n_embd);
}

/* A qwen35 MTP block (llama.cpp's load_block_mtp): a full-attention layer, then the NextN
 * projection of [enorm(embedding) | hnorm(hidden)] and the norm before the shared LM head.
 * Its norms are N(1, 0.1), not ones, so a reference that swapped enorm and hnorm would see it. */
static void list_mtp_block(tensor_list *l, const mkmodel_config *c, int il)
{
    list_hybrid_layer(l, c, il);
    add_matrix(l, il, "nextn.eh_proj", 2 * (int64_t)c->n_embd, c->n_embd);
    add_spec(l, il, "mtp_norm", "nextn.enorm.weight", c->n_embd, 0, 0.1f);
    add_spec(l, il, "mtp_norm", "nextn.hnorm.weight", c->n_embd, 0, 0.1f);
    add_spec(l, il, "mtp_norm", "nextn.shared_head_norm.weight", c->n_embd, 0, 0.1f);
}

/* One gpt-oss layer (arch/gptoss.c's names): attention with biases everywhere and a sink
 * logit per head, then the experts with theirs, behind a biased router. */
static void list_gptoss_layer(tensor_list *l, const mkmodel_config *c, int il)
{
    const int64_t hd = head_dim_of(c), q_dim = c->n_head * hd, kv_dim = c->n_head_kv * hd;
    const float bias_std = 0.05f;
    add_spec(l, il, "norm", "attn_norm.weight", c->n_embd, 0, 0);
    add_matrix(l, il, "attn_q", c->n_embd, q_dim);
    add_matrix(l, il, "attn_k", c->n_embd, kv_dim);
    add_matrix(l, il, "attn_v", c->n_embd, kv_dim);
    add_matrix(l, il, "attn_output", q_dim, c->n_embd);
    add_spec(l, il, "bias", "attn_q.bias", q_dim, 0, bias_std);
    add_spec(l, il, "bias", "attn_k.bias", kv_dim, 0, bias_std);
    add_spec(l, il, "bias", "attn_v.bias", kv_dim, 0, bias_std);
    add_spec(l, il, "bias", "attn_output.bias", c->n_embd, 0, bias_std);
    add_spec(l, il, "bias", "attn_sinks.weight", c->n_head, 0, 1.0f); /* logits near the scores' */
    add_spec(l, il, "norm", "post_attention_norm.weight", c->n_embd, 0, 0);
    add_matrix(l, il, "ffn_gate_inp", c->n_embd, c->n_expert);
    add_spec(l, il, "bias", "ffn_gate_inp.bias", c->n_expert, 0, bias_std);
    add_experts(l, il, "ffn_gate_exps", c->n_embd, c->n_ff_exp, c->n_expert);
    add_experts(l, il, "ffn_up_exps", c->n_embd, c->n_ff_exp, c->n_expert);
    add_experts(l, il, "ffn_down_exps", c->n_ff_exp, c->n_embd, c->n_expert);
    add_spec(l, il, "exps_bias", "ffn_gate_exps.bias", c->n_ff_exp, c->n_expert, bias_std);
    add_spec(l, il, "exps_bias", "ffn_up_exps.bias", c->n_ff_exp, c->n_expert, bias_std);
    add_spec(l, il, "exps_bias", "ffn_down_exps.bias", c->n_embd, c->n_expert, bias_std);
}

static void list_routed_ffn(tensor_list *l, const mkmodel_config *c, int il);

/* One gemma4 layer (arch/gemma4.c's names, as llama.cpp's converter writes them): the sliding
 * or full attention with its own head width and kv heads (a full layer without attn_v when V
 * is the K projection), q/k norms, sandwich norms around attention and the GeGLU; with
 * experts, the router (its row scale beside it), the fused gate/up experts, the down experts
 * and their per-expert scale, and the norms of the second branch; then the layer's output
 * scalar. */
static void list_gemma4_layer(tensor_list *l, const mkmodel_config *c, int il)
{
    const bool full = mkmodel_gemma4_full(c, il);
    const int64_t hd = full ? c->head_dim_full : head_dim_of(c), q_dim = c->n_head * hd;
    const int64_t kv_dim = (full ? c->n_head_kv_full : c->n_head_kv) * hd;
    add_spec(l, il, "norm", "attn_norm.weight", c->n_embd, 0, 0);
    add_matrix(l, il, "attn_q", c->n_embd, q_dim);
    add_matrix(l, il, "attn_k", c->n_embd, kv_dim);
    if (!(full && c->v_from_k)) add_matrix(l, il, "attn_v", c->n_embd, kv_dim);
    add_matrix(l, il, "attn_output", q_dim, c->n_embd);
    add_spec(l, il, "norm", "attn_q_norm.weight", hd, 0, 0);
    add_spec(l, il, "norm", "attn_k_norm.weight", hd, 0, 0);
    add_spec(l, il, "norm", "post_attention_norm.weight", c->n_embd, 0, 0);
    add_spec(l, il, "norm", "ffn_norm.weight", c->n_embd, 0, 0);
    add_matrix(l, il, "ffn_gate", c->n_embd, c->n_ff);
    add_matrix(l, il, "ffn_up", c->n_embd, c->n_ff);
    add_matrix(l, il, "ffn_down", c->n_ff, c->n_embd);
    add_spec(l, il, "norm", "post_ffw_norm.weight", c->n_embd, 0, 0);
    if (c->n_expert > 0) {
        add_matrix(l, il, "ffn_gate_inp", c->n_embd, c->n_expert);
        add_spec(l, il, "norm", "ffn_gate_inp.scale", c->n_embd, 0, 0);
        add_spec(l, il, "norm", "pre_ffw_norm_2.weight", c->n_embd, 0, 0);
        add_experts(l, il, "ffn_gate_up_exps", c->n_embd, 2 * (int64_t)c->n_ff_exp, c->n_expert);
        add_experts(l, il, "ffn_down_exps", c->n_ff_exp, c->n_embd, c->n_expert);
        add_spec(l, il, "norm", "ffn_down_exps.scale", c->n_expert, 0, 0);
        add_spec(l, il, "norm", "post_ffw_norm_1.weight", c->n_embd, 0, 0);
        add_spec(l, il, "norm", "post_ffw_norm_2.weight", c->n_embd, 0, 0);
    }
    add_spec(l, il, "norm", "layer_output_scale.weight", 1, 0, 0);
}

/* One phi3 layer: q, k and v in one attn_qkv, gate and up in one ffn_up of 2 n_ff rows. */
static void list_phi3_layer(tensor_list *l, const mkmodel_config *c, int il)
{
    const int64_t hd = head_dim_of(c), q_dim = c->n_head * hd, kv_dim = c->n_head_kv * hd;
    add_spec(l, il, "norm", "attn_norm.weight", c->n_embd, 0, 0);
    add_matrix(l, il, "attn_qkv", c->n_embd, q_dim + 2 * kv_dim);
    add_matrix(l, il, "attn_output", q_dim, c->n_embd);
    add_spec(l, il, "norm", "ffn_norm.weight", c->n_embd, 0, 0);
    add_matrix(l, il, "ffn_up", c->n_embd, 2 * (int64_t)c->n_ff);
    add_matrix(l, il, "ffn_down", c->n_ff, c->n_embd);
}

/* One glm4moe layer: attention with q/k/v biases and QK norm, the feed-forward's norm named
 * post_attention_norm (as the converter writes it), then list_routed_ffn. */
static void list_glm4moe_layer(tensor_list *l, const mkmodel_config *c, int il)
{
    const int64_t hd = head_dim_of(c), q_dim = c->n_head * hd, kv_dim = c->n_head_kv * hd;
    add_spec(l, il, "norm", "attn_norm.weight", c->n_embd, 0, 0);
    add_matrix(l, il, "attn_q", c->n_embd, q_dim);
    add_matrix(l, il, "attn_k", c->n_embd, kv_dim);
    add_matrix(l, il, "attn_v", c->n_embd, kv_dim);
    add_matrix(l, il, "attn_output", q_dim, c->n_embd);
    add_spec(l, il, "bias", "attn_q.bias", q_dim, 0, 0.05f);
    add_spec(l, il, "bias", "attn_k.bias", kv_dim, 0, 0.05f);
    add_spec(l, il, "bias", "attn_v.bias", kv_dim, 0, 0.05f);
    add_spec(l, il, "norm", "attn_q_norm.weight", hd, 0, 0);
    add_spec(l, il, "norm", "attn_k_norm.weight", hd, 0, 0);
    add_spec(l, il, "norm", "post_attention_norm.weight", c->n_embd, 0, 0);
    list_routed_ffn(l, c, il);
}

/* One deepseek2 layer (arch/deepseek2.c's names, as llama.cpp's converter writes them: the
 * K/V up-projection split per head into attn_k_b and attn_v_b, 3-D over the heads); the first
 * n_dense_lead layers' feed-forward dense, the others' routed experts (+ the selection bias
 * of the sigmoid router) and the shared experts' GLU. */
static void list_mla_layer(tensor_list *l, const mkmodel_config *c, int il)
{
    const int64_t H = c->n_head, q_head = (int64_t)c->mla_nope + c->n_rot;
    add_spec(l, il, "norm", "attn_norm.weight", c->n_embd, 0, 0);
    if (c->q_lora_rank > 0) {
        add_matrix(l, il, "attn_q_a", c->n_embd, c->q_lora_rank);
        add_spec(l, il, "norm", "attn_q_a_norm.weight", c->q_lora_rank, 0, 0);
        add_matrix(l, il, "attn_q_b", c->q_lora_rank, H * q_head);
    } else {
        add_matrix(l, il, "attn_q", c->n_embd, H * q_head);
    }
    add_matrix(l, il, "attn_kv_a_mqa", c->n_embd, (int64_t)c->kv_lora_rank + c->n_rot);
    add_spec(l, il, "norm", "attn_kv_a_norm.weight", c->kv_lora_rank, 0, 0);
    add_experts(l, il, "attn_k_b", c->mla_nope, c->kv_lora_rank, H);
    add_experts(l, il, "attn_v_b", c->kv_lora_rank, c->mla_v, H);
    add_matrix(l, il, "attn_output", H * c->mla_v, c->n_embd);
    add_spec(l, il, "norm", "ffn_norm.weight", c->n_embd, 0, 0);
    list_routed_ffn(l, c, il);
}

/* The feed-forward of a deepseek2 or glm4moe layer: dense in the first n_dense_lead layers,
 * else routed experts (+ the sigmoid router's selection bias) and the shared experts' GLU. */
static void list_routed_ffn(tensor_list *l, const mkmodel_config *c, int il)
{
    if (il < c->n_dense_lead) {
        add_matrix(l, il, "ffn_gate", c->n_embd, c->n_ff);
        add_matrix(l, il, "ffn_up", c->n_embd, c->n_ff);
        add_matrix(l, il, "ffn_down", c->n_ff, c->n_embd);
        return;
    }
    const int64_t shexp = (int64_t)c->n_ff_exp * c->n_expert_shared;
    add_matrix(l, il, "ffn_gate_inp", c->n_embd, c->n_expert);
    if (c->expert_gating == 2) add_spec(l, il, "bias", "exp_probs_b.bias", c->n_expert, 0, 0.05f);
    add_experts(l, il, "ffn_gate_exps", c->n_embd, c->n_ff_exp, c->n_expert);
    add_experts(l, il, "ffn_up_exps", c->n_embd, c->n_ff_exp, c->n_expert);
    add_experts(l, il, "ffn_down_exps", c->n_ff_exp, c->n_embd, c->n_expert);
    add_matrix(l, il, "ffn_gate_shexp", c->n_embd, shexp);
    add_matrix(l, il, "ffn_up_shexp", c->n_embd, shexp);
    add_matrix(l, il, "ffn_down_shexp", shexp, c->n_embd);
}

/* nomic-bert after its token_embd (arch/nomic_bert.c's names): token type rows (read as F32) and
 * the embeddings' LayerNorm, then per layer one fused attn_qkv (rows q, k, v), the output
 * projection, a LayerNorm after each block (weight and bias) and a SwiGLU without biases; no
 * output norm or head (an encoder). */
static void list_nomic_bert(tensor_list *l, const mkmodel_config *c)
{
    add_spec(l, -1, "token_types", "token_types.weight", c->n_embd, 2, 0.5f);
    add_spec(l, -1, "norm", "token_embd_norm.weight", c->n_embd, 0, 0);
    add_spec(l, -1, "bias", "token_embd_norm.bias", c->n_embd, 0, 0.05f);
    for (int il = 0; il < c->n_layer; il++) {
        add_matrix(l, il, "attn_qkv", c->n_embd, 3 * (int64_t)c->n_embd);
        add_matrix(l, il, "attn_output", c->n_embd, c->n_embd);
        add_spec(l, il, "norm", "attn_output_norm.weight", c->n_embd, 0, 0);
        add_spec(l, il, "bias", "attn_output_norm.bias", c->n_embd, 0, 0.05f);
        add_matrix(l, il, "ffn_gate", c->n_embd, c->n_ff);
        add_matrix(l, il, "ffn_up", c->n_embd, c->n_ff);
        add_matrix(l, il, "ffn_down", c->n_ff, c->n_embd);
        add_spec(l, il, "norm", "layer_output_norm.weight", c->n_embd, 0, 0);
        add_spec(l, il, "bias", "layer_output_norm.bias", c->n_embd, 0, 0.05f);
    }
}

/* The tensors of cfg in file order (specs may be NULL to count them); returns the count. */
static int list_tensors(const mkmodel_config *c, tensor_spec *specs)
{
    const int64_t hd = head_dim_of(c), q_dim = c->n_head * hd, kv_dim = c->n_head_kv * hd;
    const float bias_std = 0.05f;
    tensor_list l = {specs, 0};
    add_matrix(&l, -1, "token_embd", c->n_embd, c->n_vocab);
    if (c->arch == MODEL_ARCH_NOMIC_BERT) {
        list_nomic_bert(&l, c);
        return l.n;
    }
    add_spec(&l, -1, "norm", "output_norm.weight", c->n_embd, 0, 0);
    if (!c->tied_output) add_matrix(&l, -1, "output", c->n_embd, c->n_vocab);
    if (c->arch == MODEL_ARCH_GEMMA4) /* the full layers' frequency divisors: 1e30 stops a pair */
        add_spec(&l, -1, "rope_freqs", "rope_freqs.weight", c->head_dim_full / 2, 0, 0);
    if (c->arch == MODEL_ARCH_PHI3) { /* LongRoPE's divisors, >= 1: short near 1, long larger */
        add_spec(&l, -1, "rope_factors", "rope_factors_short.weight", c->n_rot / 2, 0, 0.1f);
        add_spec(&l, -1, "rope_factors", "rope_factors_long.weight", c->n_rot / 2, 0, 8.0f);
    }
    for (int il = 0; il < c->n_layer; il++) {
        void (*own)(tensor_list *, const mkmodel_config *, int) =
            c->arch == MODEL_ARCH_QWEN35 || c->arch == MODEL_ARCH_QWEN35MOE ? list_hybrid_layer
            : c->arch == MODEL_ARCH_DEEPSEEK2 ? list_mla_layer
            : c->arch == MODEL_ARCH_GLM4MOE   ? list_glm4moe_layer
            : c->arch == MODEL_ARCH_PHI3      ? list_phi3_layer
            : c->arch == MODEL_ARCH_GPTOSS    ? list_gptoss_layer
            : c->arch == MODEL_ARCH_GEMMA4    ? list_gemma4_layer
                                              : NULL;
        if (own) {
            own(&l, c, il);
            continue;
        }
        add_spec(&l, il, "norm", "attn_norm.weight", c->n_embd, 0, 0);
        add_matrix(&l, il, "attn_q", c->n_embd, q_dim);
        add_matrix(&l, il, "attn_k", c->n_embd, kv_dim);
        add_matrix(&l, il, "attn_v", c->n_embd, kv_dim);
        add_matrix(&l, il, "attn_output", q_dim, c->n_embd);
        if (c->arch == MODEL_ARCH_QWEN2) {
            add_spec(&l, il, "bias", "attn_q.bias", q_dim, 0, bias_std);
            add_spec(&l, il, "bias", "attn_k.bias", kv_dim, 0, bias_std);
            add_spec(&l, il, "bias", "attn_v.bias", kv_dim, 0, bias_std);
        }
        if (c->arch == MODEL_ARCH_QWEN3 || c->arch == MODEL_ARCH_GEMMA3 || c->arch == MODEL_ARCH_QWEN3MOE) {
            add_spec(&l, il, "norm", "attn_q_norm.weight", hd, 0, 0);
            add_spec(&l, il, "norm", "attn_k_norm.weight", hd, 0, 0);
        }
        if (c->arch == MODEL_ARCH_GEMMA3) add_spec(&l, il, "norm", "post_attention_norm.weight", c->n_embd, 0, 0);
        add_spec(&l, il, "norm", "ffn_norm.weight", c->n_embd, 0, 0);
        if (c->arch == MODEL_ARCH_QWEN3MOE) {
            add_matrix(&l, il, "ffn_gate_inp", c->n_embd, c->n_expert);
            add_experts(&l, il, "ffn_gate_exps", c->n_embd, c->n_ff_exp, c->n_expert);
            add_experts(&l, il, "ffn_up_exps", c->n_embd, c->n_ff_exp, c->n_expert);
            add_experts(&l, il, "ffn_down_exps", c->n_ff_exp, c->n_embd, c->n_expert);
            continue;
        }
        add_matrix(&l, il, "ffn_gate", c->n_embd, c->n_ff);
        add_matrix(&l, il, "ffn_up", c->n_embd, c->n_ff);
        add_matrix(&l, il, "ffn_down", c->n_ff, c->n_embd);
        if (c->arch == MODEL_ARCH_GEMMA3) add_spec(&l, il, "norm", "post_ffw_norm.weight", c->n_embd, 0, 0);
    }
    for (int il = c->n_layer; il < c->n_layer + c->n_mtp; il++) list_mtp_block(&l, c, il);
    return l.n;
}

/* ---- tokenizer -------------------------------------------------------------------------- */
typedef struct family {
    const char *pre; /* llama.cpp's name for the pre-tokenizer, so that other tools load the file */
    const char *specials[8];
    int n_specials;
    int bos, eos, eot, pad; /* indices into specials */
    bool add_bos;
    const char *chat_template;
} family;

static const family qwen_family = {
    "qwen2",
    {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
    3, 0, 2, 2, 0, false,
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}",
};

static const family llama3_family = {
    "llama-bpe",
    {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
    5, 0, 1, 4, 1, true,
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
};

/* gpt-oss's Harmony markup (o200k_harmony's specials) and a short Harmony template: messages
 * as <|start|>role<|message|>text<|end|>, an assistant's on the final channel, the reply opened
 * with <|start|>assistant (the published template's shape without its system preamble and tool
 * declarations; its channel markup is what marks a template as Harmony's). */
static const family harmony_family = {
    "gpt-4o",
    {"<|endoftext|>", "<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>",
     "<|constrain|>"},
    8, 0, 5, 5, 0, false,
    "{% for message in messages %}{{ '<|start|>' + message['role'] }}{% if message['role'] == 'assistant' %}"
    "{{ '<|channel|>final' }}{% endif %}{{ '<|message|>' + message['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}",
};

enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_UNUSED = 5 };

int mkmodel_vocab_size(const char *path, char *err, size_t errlen)
{
    gguf_file *f = gguf_open(path, err, errlen);
    if (!f) return -1;
    int64_t i = gguf_find_key(f, "tokenizer.ggml.tokens");
    uint64_t n = i >= 0 && gguf_kv_type(f, i) == GGUF_VT_ARRAY ? gguf_arr_len(f, i) : 0;
    gguf_close(f);
    if (n == 0 || n > MAX_VOCAB) {
        snprintf(err, errlen, "%s: no usable tokenizer.ggml.tokens (%llu entries)", path, (unsigned long long)n);
        return -1;
    }
    return (int)n;
}

/* Copies key i of f as it is.  false when out of memory. */
static bool copy_kv(gguf_writer *w, const gguf_file *f, int64_t i)
{
    const char *key = gguf_kv_key(f, i);
    gguf_vtype type = gguf_kv_type(f, i);
    if (type == GGUF_VT_STRING) {
        size_t len;
        const char *s = gguf_kv_str(f, i, &len);
        gguf_writer_set_raw(w, key, type, 0, s, len);
    } else if (type != GGUF_VT_ARRAY) { /* scalars: GGUF and this host are little-endian */
        union { uint64_t u; int64_t i; double d; float f; uint8_t b; } v = {0};
        if (type == GGUF_VT_FLOAT32) { double d; gguf_kv_f64(f, i, &d); v.f = (float)d; }
        else if (type == GGUF_VT_FLOAT64) gguf_kv_f64(f, i, &v.d);
        else if (type == GGUF_VT_UINT64) gguf_kv_u64(f, i, &v.u);
        else gguf_kv_i64(f, i, &v.i); /* the low bytes hold the narrower integer types */
        gguf_writer_set_raw(w, key, type, 0, &v, 1);
    } else if (gguf_arr_type(f, i) != GGUF_VT_STRING) {
        gguf_writer_set_raw(w, key, type, gguf_arr_type(f, i), gguf_arr_data(f, i), gguf_arr_len(f, i));
    } else { /* the writer takes NUL-terminated strings */
        uint64_t n = gguf_arr_len(f, i);
        char **v = calloc(n ? n : 1, sizeof *v);
        bool ok = v != NULL;
        for (uint64_t j = 0; ok && j < n; j++) {
            size_t len;
            const char *s = gguf_arr_str(f, i, j, &len);
            ok = (v[j] = strndup(s, len)) != NULL;
        }
        if (ok) gguf_writer_set_arr_str(w, key, (const char *const *)v, n);
        for (uint64_t j = 0; v && j < n; j++) free(v[j]);
        free(v);
        return ok;
    }
    return true;
}

/* A real vocabulary over synthetic weights, like a model converted from its publisher's files:
 * every tokenizer.* key of c->vocab. */
static int copy_tokenizer(gguf_writer *w, const mkmodel_config *c, char *err, size_t errlen)
{
    gguf_file *f = gguf_open(c->vocab, err, errlen);
    if (!f) return -1;
    int64_t ti = gguf_find_key(f, "tokenizer.ggml.tokens");
    uint64_t n = ti >= 0 && gguf_kv_type(f, ti) == GGUF_VT_ARRAY ? gguf_arr_len(f, ti) : 0;
    int rc = 0;
    if (n != (uint64_t)c->n_vocab) {
        snprintf(err, errlen, "%s has %llu tokens, the model %d", c->vocab, (unsigned long long)n, c->n_vocab);
        rc = -1;
    }
    for (int64_t i = 0; rc == 0 && i < gguf_n_kv(f); i++) {
        if (strncmp(gguf_kv_key(f, i), "tokenizer.", 10) == 0 && !copy_kv(w, f, i)) {
            snprintf(err, errlen, "out of memory copying %s", gguf_kv_key(f, i));
            rc = -1;
        }
    }
    gguf_close(f);
    return rc;
}

/* --words: the vocabulary learned from the words of corpus instead of the corpus itself;
 * word_rows[id] (n_vocab entries, may be NULL) marks the tokens that are one whole word. */
static int train_words(const char *corpus, size_t corpus_len, int n_learn, bpe_vocab *v, bool *word_rows)
{
    words_list wl;
    if (words_collect(corpus, corpus_len, n_learn, &wl) != 0) return -1;
    size_t len;
    char *text = words_corpus(&wl, &len);
    int rc = text ? bpe_train(text, len, n_learn, MAX_MERGES, v) : -1;
    free(text);
    /* A whole-word token is GPT-2's space stand-in (U+0120, "\xc4\xa0") and one of the words. */
    for (int i = 0; rc == 0 && word_rows && i < v->n_tokens; i++) {
        const char *t = v->tokens[i];
        word_rows[i] = strncmp(t, "\xc4\xa0", 2) == 0 && words_has(&wl, t + 2, strlen(t + 2));
    }
    words_free(&wl);
    return rc;
}

/* Sets the tokenizer.* keys (word_rows: see train_words).  0, or -1 with err. */
static int write_tokenizer(gguf_writer *w, const mkmodel_config *c, const char *corpus,
                           size_t corpus_len, bool *word_rows, char *err, size_t errlen)
{
    if (c->vocab) return copy_tokenizer(w, c, err, errlen);
    const family *fam = c->arch == MODEL_ARCH_LLAMA    ? &llama3_family
                        : c->arch == MODEL_ARCH_GPTOSS ? &harmony_family
                                                       : &qwen_family;
    int n_learn = c->n_vocab - fam->n_specials;
    bpe_vocab v;
    if ((c->words ? train_words(corpus, corpus_len, n_learn, &v, word_rows)
                  : bpe_train(corpus, corpus_len, n_learn, MAX_MERGES, &v)) != 0) {
        snprintf(err, errlen, "out of memory training the tokenizer");
        return -1;
    }
    char **tokens = calloc((size_t)c->n_vocab, sizeof *tokens);
    int32_t *types = calloc((size_t)c->n_vocab, sizeof *types);
    int rc = -1, n = 0;
    const int first_special = v.n_tokens;
    if (!tokens || !types) {
        snprintf(err, errlen, "out of memory for %d tokens", c->n_vocab);
        goto out;
    }
    for (; n < v.n_tokens; n++) {
        tokens[n] = v.tokens[n];
        types[n] = TOKEN_NORMAL;
    }
    for (int i = 0; i < fam->n_specials; i++, n++) {
        tokens[n] = (char *)fam->specials[i];
        types[n] = TOKEN_CONTROL;
    }
    for (; n < c->n_vocab; n++) {
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%d]", n);
        if (!(tokens[n] = strdup(buf))) {
            snprintf(err, errlen, "out of memory for filler tokens");
            goto out;
        }
        types[n] = TOKEN_UNUSED;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", fam->pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens, (size_t)n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (size_t)n);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges,
                            (size_t)v.n_merges);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(first_special + fam->bos));
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(first_special + fam->eos));
    gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)(first_special + fam->eot));
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)(first_special + fam->pad));
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", fam->add_bos);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    gguf_writer_set_str(w, "tokenizer.chat_template", fam->chat_template);
    rc = 0;
out:
    for (int i = first_special + fam->n_specials; tokens && i < n; i++) free(tokens[i]);
    free(tokens);
    free(types);
    bpe_vocab_free(&v);
    return rc;
}

/* ---- corpus ----------------------------------------------------------------------------- */
typedef struct text_buf {
    char *p;
    size_t len, max;
} text_buf;

static void append_stream(text_buf *b, FILE *f)
{
    char chunk[8192];
    size_t n;
    while (b->len < b->max && (n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n > b->max - b->len) n = b->max - b->len;
        memcpy(b->p + b->len, chunk, n);
        b->len += n;
    }
}

static void append_file(text_buf *b, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return;
    append_stream(b, f);
    fclose(f);
}

static bool is_source(const char *name)
{
    size_t n = strlen(name);
    return n > 2 && name[n - 2] == '.' && (name[n - 1] == 'c' || name[n - 1] == 'h');
}

/* Appends the C sources under dir in sorted path order (depth-limited). */
static void append_tree(text_buf *b, const char *dir, int depth)
{
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) return;
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        char path[4096];
        struct stat st;
        if (name[0] != '.' && snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path &&
            stat(path, &st) == 0) {
            if (S_ISDIR(st.st_mode) && depth < 8)
                append_tree(b, path, depth + 1);
            else if (S_ISREG(st.st_mode) && is_source(name) && st.st_size <= (off_t)CORPUS_FILE_MAX)
                append_file(b, path);
        }
        free(ents[i]);
    }
    free(ents);
}

static const char fallback_text[] =
    "inferd is an inference server. It loads a model, turns the prompt into tokens, runs the "
    "transformer over them and samples the next token, again and again, streaming the text "
    "back to the client. The scheduler packs many requests into one batch so that the "
    "processor stays busy; the tokenizer splits text into the pieces the model was trained on.\n";

char *mkmodel_corpus(const char *root, size_t max_bytes, size_t *len)
{
    text_buf b = {malloc(max_bytes + sizeof fallback_text), 0, max_bytes};
    if (!b.p) return NULL;
    if (root) {
        char path[4096];
        snprintf(path, sizeof path, "%s/README.md", root);
        append_file(&b, path);
        snprintf(path, sizeof path, "%s/src", root);
        append_tree(&b, path, 0);
    }
    if (b.len == 0) {
        memcpy(b.p, fallback_text, sizeof fallback_text - 1);
        b.len = sizeof fallback_text - 1;
    }
    b.p[b.len] = '\0';
    *len = b.len;
    return b.p;
}

char *mkmodel_read_text(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen)
{
    char why[256];
    int fd = file_open_regular(path, NULL, why, sizeof why); /* a FIFO must not hang us */
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, why);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    text_buf b = {malloc(max_bytes + 1), 0, max_bytes};
    if (!f || !b.p) {
        snprintf(err, errlen, "out of memory reading %s", path);
        if (f) fclose(f);
        else close(fd);
        free(b.p);
        return NULL;
    }
    append_stream(&b, f);
    fclose(f);
    b.p[b.len] = '\0';
    *len = b.len;
    return b.p;
}

/* ---- writing ---------------------------------------------------------------------------- */
/* deepseek2's latent attention and the router of deepseek2 and glm4moe: what model.c's
 * check_mla and router keys accept. */
static int validate_routed(const mkmodel_config *c, char *err, size_t errlen)
{
    const bool mla = c->arch == MODEL_ARCH_DEEPSEEK2;
    const bool groups_ok = c->n_expert_groups == 0 ||
                           (c->n_expert_groups <= c->n_expert && c->n_expert % c->n_expert_groups == 0 &&
                            c->n_group_used >= 1 && c->n_group_used <= c->n_expert_groups &&
                            c->n_expert_used <= c->n_expert / c->n_expert_groups * c->n_group_used);
    const bool mla_ok = !mla || (c->kv_lora_rank >= 1 && c->kv_lora_rank <= MAX_DIM && c->q_lora_rank >= 0 &&
                                 c->q_lora_rank <= MAX_DIM && c->mla_nope >= 1 && c->mla_nope <= MAX_DIM &&
                                 c->mla_v >= 1 && c->mla_v <= MAX_DIM && c->n_rot >= 2 && c->n_rot % 2 == 0 &&
                                 c->n_rot <= MAX_DIM);
    if (!mla_ok || c->n_expert_shared < 1 || c->n_dense_lead < 0 ||
        c->n_dense_lead > c->n_layer || (c->expert_gating != 1 && c->expert_gating != 2) || !groups_ok ||
        c->expert_weights_scale < 0) {
        snprintf(err, errlen, "%s: latent %d, q LoRA %d, head %d + RoPE %d, value %d, %d shared experts, %d "
                 "dense layers of %d, gating %d, %d groups (%d used): want positive widths, RoPE even, gating 1 "
                 "(softmax) or 2 (sigmoid), groups dividing the experts",
                 model_arch_name(c->arch), c->kv_lora_rank, c->q_lora_rank, c->mla_nope, c->n_rot, c->mla_v, c->n_expert_shared,
                 c->n_dense_lead, c->n_layer, c->expert_gating, c->n_expert_groups, c->n_group_used);
        return -1;
    }
    return 0;
}

/* gemma4's full layers and pattern: what model.c and llama.cpp's loader accept (a sliding
 * layer somewhere: llama.cpp asserts one; heads dividing among the kv heads; RoPE on an even
 * part of the full head). */
static int validate_gemma4(const mkmodel_config *c, char *err, size_t errlen)
{
    if (c->swa_period < 2 || c->swa_period > MAX_LAYERS || c->head_dim_full < 2 || c->head_dim_full % 2 ||
        (int64_t)c->head_dim_full * c->n_head > MAX_DIM || c->n_head_kv_full < 1 || c->n_head % c->n_head_kv_full ||
        c->n_rot < 2 || c->n_rot % 2 || c->n_rot > c->head_dim_full || c->logit_softcap < 0) {
        snprintf(err, errlen, "gemma4: one full layer in %d, %d heads of %d over %d kv heads there, RoPE on %d, soft cap "
                 "%g: want a period of 2..%d, an even head, kv heads dividing the heads, an even RoPE part of the head",
                 c->swa_period, c->n_head, c->head_dim_full, c->n_head_kv_full, c->n_rot, (double)c->logit_softcap,
                 MAX_LAYERS);
        return -1;
    }
    return 0;
}

static int validate(const mkmodel_config *c, char *err, size_t errlen)
{
    const struct {
        const char *flag;
        int v, max;
    } dims[] = {
        {"n-embd", c->n_embd, MAX_DIM},   {"n-layer", c->n_layer, MAX_LAYERS},
        {"n-head", c->n_head, MAX_DIM},   {"n-head-kv", c->n_head_kv, MAX_DIM},
        {"n-ff", c->n_ff, 4 * MAX_DIM},   {"n-ctx", c->n_ctx, 1 << 24},
        {"n-vocab", c->n_vocab, MAX_VOCAB},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v < 1 || dims[i].v > dims[i].max) {
            snprintf(err, errlen, "--%s %d out of range 1..%d", dims[i].flag, dims[i].v, dims[i].max);
            return -1;
        }
    int hd = head_dim_of(c);
    if (c->n_head % c->n_head_kv != 0) {
        snprintf(err, errlen, "--n-head %d must be a multiple of --n-head-kv %d", c->n_head, c->n_head_kv);
        return -1;
    }
    if (hd < 2 || hd % 2 != 0 || (c->head_dim == 0 && c->n_embd % c->n_head != 0) ||
        (int64_t)hd * c->n_head > MAX_DIM) {
        snprintf(err, errlen, "head dimension %d (n-embd %d / n-head %d) must be even and divide n-embd",
                 hd, c->n_embd, c->n_head);
        return -1;
    }
    int min_vocab = 256 + 8; /* the byte tokens and the most special tokens of a family (Harmony's) */
    if (c->n_vocab < min_vocab) {
        snprintf(err, errlen, "--n-vocab %d: at least %d (256 byte tokens + special tokens)",
                 c->n_vocab, min_vocab);
        return -1;
    }
    const bool known_arch = c->arch == MODEL_ARCH_LLAMA || c->arch == MODEL_ARCH_QWEN2 ||
                            c->arch == MODEL_ARCH_QWEN3 || c->arch == MODEL_ARCH_GEMMA3 ||
                            c->arch == MODEL_ARCH_QWEN3MOE || c->arch == MODEL_ARCH_QWEN35 ||
                            c->arch == MODEL_ARCH_QWEN35MOE ||
                            c->arch == MODEL_ARCH_GPTOSS || c->arch == MODEL_ARCH_DEEPSEEK2 ||
                            c->arch == MODEL_ARCH_GLM4MOE || c->arch == MODEL_ARCH_PHI3 ||
                            c->arch == MODEL_ARCH_NOMIC_BERT || c->arch == MODEL_ARCH_GEMMA4;
    if ((unsigned)c->ftype >= MKMODEL_FTYPE_COUNT || !known_arch) {
        snprintf(err, errlen, "unknown weight type or architecture");
        return -1;
    }
    if ((c->arch == MODEL_ARCH_GEMMA3 || c->arch == MODEL_ARCH_GPTOSS || c->arch == MODEL_ARCH_GEMMA4) &&
        (c->n_swa < 1 || c->n_swa > 1 << 24)) {
        snprintf(err, errlen, "%s: sliding window %d out of range 1..%d", model_arch_name(c->arch), c->n_swa, 1 << 24);
        return -1;
    }
    if (c->n_mtp < 0 || c->n_mtp > 1 || (c->n_mtp && c->arch != MODEL_ARCH_QWEN35 && c->arch != MODEL_ARCH_QWEN35MOE)) {
        snprintf(err, errlen, "--mtp %d: 0, or 1 for qwen35 and qwen35moe (the families whose MTP block is built)",
                 c->n_mtp);
        return -1;
    }
    if ((c->arch == MODEL_ARCH_QWEN35 || c->arch == MODEL_ARCH_QWEN35MOE) &&
        (c->ssm_conv < 2 || c->ssm_conv > 8 || c->ssm_state < 1 || c->ssm_groups < 1 || c->ssm_vheads < 1 ||
         c->ssm_vheads % c->ssm_groups || c->ssm_inner != c->ssm_vheads * c->ssm_state || c->ssm_inner > MAX_DIM ||
         c->n_rot < 0 || c->n_rot % 2 || c->n_rot > hd)) {
        snprintf(err, errlen, "qwen35: DeltaNet of %d taps, %d q/k heads and %d v heads of %d (inner %d), RoPE on %d "
                 "of %d: want 2..8 taps, v heads a multiple of q/k heads, inner = v heads x width",
                 c->ssm_conv, c->ssm_groups, c->ssm_vheads, c->ssm_state, c->ssm_inner, c->n_rot, hd);
        return -1;
    }
    if (c->arch == MODEL_ARCH_GEMMA4 && validate_gemma4(c, err, errlen) != 0) return -1;
    if (c->arch == MODEL_ARCH_GPTOSS && (c->yarn_factor < 0 || (c->yarn_factor > 0 && c->yarn_orig_ctx < 1))) {
        snprintf(err, errlen, "gpt-oss: YaRN factor %g over %d positions: want a factor >= 0 over >= 1",
                 (double)c->yarn_factor, c->yarn_orig_ctx);
        return -1;
    }
    if (c->arch == MODEL_ARCH_NOMIC_BERT && (c->n_head_kv != c->n_head || hd * c->n_head != c->n_embd)) {
        snprintf(err, errlen, "nomic-bert: %d heads of %d (%d kv heads) in %d: want n-embd / n-head per head, no "
                 "grouped K/V", c->n_head, hd, c->n_head_kv, c->n_embd);
        return -1;
    }
    if ((c->arch == MODEL_ARCH_DEEPSEEK2 || c->arch == MODEL_ARCH_GLM4MOE) && validate_routed(c, err, errlen) != 0)
        return -1;
    if ((c->arch == MODEL_ARCH_PHI3 || c->arch == MODEL_ARCH_GLM4MOE) && (c->n_rot < 2 || c->n_rot % 2 || c->n_rot > hd)) {
        snprintf(err, errlen, "%s: RoPE on %d of a head of %d: want an even count up to the head", model_arch_name(c->arch),
                 c->n_rot, hd);
        return -1;
    }
    if ((c->arch == MODEL_ARCH_QWEN3MOE || c->arch == MODEL_ARCH_GPTOSS || c->arch == MODEL_ARCH_DEEPSEEK2 ||
         c->arch == MODEL_ARCH_GLM4MOE || (c->arch == MODEL_ARCH_GEMMA4 && c->n_expert > 0)) &&
        (c->n_expert < 1 || c->n_expert > 4096 || c->n_expert_used < 1 || c->n_expert_used > c->n_expert ||
         c->n_ff_exp < 1 || c->n_ff_exp > 4 * MAX_DIM)) {
        snprintf(err, errlen, "experts: %d of width %d, %d per token: want 1..4096 experts, 1..experts per token",
                 c->n_expert, c->n_ff_exp, c->n_expert_used);
        return -1;
    }
    return 0;
}

static void set_arch_u32(gguf_writer *w, const mkmodel_config *c, const char *suffix, int v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", model_arch_name(c->arch), suffix);
    gguf_writer_set_u32(w, key, (uint32_t)v);
}

static void set_arch_f32(gguf_writer *w, const mkmodel_config *c, const char *suffix, float v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", model_arch_name(c->arch), suffix);
    gguf_writer_set_f32(w, key, v);
}

/* deepseek2's attention keys as llama.cpp's converter writes them: one shared head (key the
 * latent + the RoPE key, value the latent) and the per-head sizes in *_mla. */
static void write_mla_hparams(gguf_writer *w, const mkmodel_config *c)
{
    set_arch_u32(w, c, "attention.head_count_kv", 1);
    set_arch_u32(w, c, "attention.key_length", c->kv_lora_rank + c->n_rot);
    set_arch_u32(w, c, "attention.value_length", c->kv_lora_rank);
    set_arch_u32(w, c, "attention.key_length_mla", c->mla_nope + c->n_rot);
    set_arch_u32(w, c, "attention.value_length_mla", c->mla_v);
    set_arch_u32(w, c, "attention.kv_lora_rank", c->kv_lora_rank);
    if (c->q_lora_rank > 0) set_arch_u32(w, c, "attention.q_lora_rank", c->q_lora_rank);
}

/* gemma4's attention keys as llama.cpp's converter writes them (conversion/gemma.py,
 * Gemma4Model): key/value_length the full layers' head, *_swa the sliding layers'; kv heads
 * one per layer (sliding / full); the pattern one bool per layer (true: sliding);
 * rope.dimension_count the whole full head (its partial RoPE is in rope_freqs) and
 * dimension_count_swa the sliding head; no KV shared between layers and no per-layer
 * embeddings (the 31B and 26B-A4B have neither), written as 0 because llama.cpp requires the
 * second. */
static void write_gemma4_hparams(gguf_writer *w, const mkmodel_config *c)
{
    char key[96];
    int32_t *kv = malloc((size_t)c->n_layer * sizeof *kv);
    bool *sliding = malloc((size_t)c->n_layer * sizeof *sliding);
    if (kv && sliding) { /* else the file lacks the keys and the loaders name them */
        for (int il = 0; il < c->n_layer; il++) {
            sliding[il] = !mkmodel_gemma4_full(c, il);
            kv[il] = sliding[il] ? c->n_head_kv : c->n_head_kv_full;
        }
        snprintf(key, sizeof key, "%s.attention.head_count_kv", model_arch_name(c->arch));
        gguf_writer_set_arr_i32(w, key, kv, (size_t)c->n_layer);
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", model_arch_name(c->arch));
        gguf_writer_set_raw(w, key, GGUF_VT_ARRAY, GGUF_VT_BOOL, sliding, (size_t)c->n_layer);
    }
    free(kv);
    free(sliding);
    set_arch_u32(w, c, "attention.key_length", c->head_dim_full);
    set_arch_u32(w, c, "attention.value_length", c->head_dim_full);
    set_arch_u32(w, c, "attention.key_length_swa", head_dim_of(c));
    set_arch_u32(w, c, "attention.value_length_swa", head_dim_of(c));
    set_arch_u32(w, c, "rope.dimension_count", c->head_dim_full);
    set_arch_u32(w, c, "rope.dimension_count_swa", head_dim_of(c));
    if (c->logit_softcap > 0) set_arch_f32(w, c, "final_logit_softcapping", c->logit_softcap);
    set_arch_u32(w, c, "attention.shared_kv_layers", 0);
    set_arch_u32(w, c, "embedding_length_per_layer_input", 0);
}

/* The router keys of deepseek2 and glm4moe (the expert counts are written with qwen3moe's). */
static void write_router_hparams(gguf_writer *w, const mkmodel_config *c)
{
    set_arch_u32(w, c, "leading_dense_block_count", c->n_dense_lead);
    set_arch_u32(w, c, "expert_shared_count", c->n_expert_shared);
    set_arch_u32(w, c, "expert_gating_func", c->expert_gating);
    set_arch_f32(w, c, "expert_weights_scale", c->expert_weights_scale > 0 ? c->expert_weights_scale : 1.0f);
    char key[96];
    snprintf(key, sizeof key, "%s.expert_weights_norm", model_arch_name(c->arch));
    gguf_writer_set_bool(w, key, c->expert_gating == 2); /* V3 renormalises, V2 not */
    if (c->n_expert_groups > 0) {
        set_arch_u32(w, c, "expert_group_count", c->n_expert_groups);
        set_arch_u32(w, c, "expert_group_used_count", c->n_group_used);
    }
}

static void write_hparams(gguf_writer *w, const mkmodel_config *c)
{
    gguf_writer_set_str(w, "general.architecture", model_arch_name(c->arch));
    gguf_writer_set_str(w, "general.name", c->name);
    gguf_writer_set_u32(w, "general.file_type", mkmodel_file_type(c->ftype));
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    set_arch_u32(w, c, "vocab_size", c->n_vocab);
    set_arch_u32(w, c, "context_length", c->n_ctx);
    set_arch_u32(w, c, "embedding_length", c->n_embd);
    set_arch_u32(w, c, "block_count", c->n_layer + c->n_mtp);
    if (c->n_mtp > 0) set_arch_u32(w, c, "nextn_predict_layers", c->n_mtp);
    set_arch_u32(w, c, "feed_forward_length", c->n_ff);
    set_arch_u32(w, c, "attention.head_count", c->n_head);
    if (c->arch == MODEL_ARCH_DEEPSEEK2) {
        write_mla_hparams(w, c);
    } else if (c->arch == MODEL_ARCH_GEMMA4) {
        write_gemma4_hparams(w, c);
    } else {
        set_arch_u32(w, c, "attention.head_count_kv", c->n_head_kv);
        set_arch_u32(w, c, "attention.key_length", head_dim_of(c));
        set_arch_u32(w, c, "attention.value_length", head_dim_of(c));
    }
    if (c->arch != MODEL_ARCH_GEMMA4) set_arch_u32(w, c, "rope.dimension_count", c->n_rot ? c->n_rot : head_dim_of(c));
    set_arch_f32(w, c, "attention.layer_norm_rms_epsilon", c->rms_eps);
    set_arch_f32(w, c, "rope.freq_base", c->rope_base);
    if (c->n_swa > 0) {
        set_arch_u32(w, c, "attention.sliding_window", c->n_swa);
        set_arch_f32(w, c, "rope.freq_base_swa", c->rope_base_swa > 0 ? c->rope_base_swa : c->rope_base);
    }
    if (c->rope_scale > 0) {
        char key[96];
        snprintf(key, sizeof key, "%s.rope.scaling.type", model_arch_name(c->arch));
        gguf_writer_set_str(w, key, "linear");
        set_arch_f32(w, c, "rope.scaling.factor", c->rope_scale);
    }
    if (c->yarn_factor > 0) {
        char key[96];
        snprintf(key, sizeof key, "%s.rope.scaling.type", model_arch_name(c->arch));
        gguf_writer_set_str(w, key, "yarn");
        set_arch_f32(w, c, "rope.scaling.factor", c->yarn_factor);
        set_arch_u32(w, c, "rope.scaling.original_context_length", c->yarn_orig_ctx);
    }
    if (c->arch == MODEL_ARCH_QWEN3MOE || c->arch == MODEL_ARCH_GPTOSS || c->arch == MODEL_ARCH_DEEPSEEK2 ||
        c->arch == MODEL_ARCH_GLM4MOE || c->arch == MODEL_ARCH_QWEN35MOE ||
        (c->arch == MODEL_ARCH_GEMMA4 && c->n_expert > 0)) {
        set_arch_u32(w, c, "expert_count", c->n_expert);
        set_arch_u32(w, c, "expert_used_count", c->n_expert_used);
        set_arch_u32(w, c, "expert_feed_forward_length", c->n_ff_exp);
    }
    if (c->arch == MODEL_ARCH_QWEN35MOE)
        set_arch_u32(w, c, "expert_shared_feed_forward_length", c->n_ff_exp * c->n_expert_shared);
    if (c->arch == MODEL_ARCH_DEEPSEEK2 || c->arch == MODEL_ARCH_GLM4MOE) write_router_hparams(w, c);
    if (c->arch == MODEL_ARCH_GLM4MOE) set_arch_u32(w, c, "nextn_predict_layers", 0);
    if (c->arch == MODEL_ARCH_PHI3) { /* LongRoPE: the long factors past a quarter of the context */
        const int orig = c->n_ctx / 4 > 1 ? c->n_ctx / 4 : 2;
        set_arch_u32(w, c, "rope.scaling.original_context_length", orig);
        set_arch_f32(w, c, "rope.scaling.attn_factor", sqrtf(1.0f + logf(4.0f) / logf((float)orig)));
    }
    if (c->pooling > 0) set_arch_u32(w, c, "pooling_type", c->pooling - 1);
    if (c->arch == MODEL_ARCH_NOMIC_BERT) { /* an encoder: LayerNorms (their epsilon), no mask */
        set_arch_f32(w, c, "attention.layer_norm_epsilon", c->rms_eps);
        char key[96];
        snprintf(key, sizeof key, "%s.attention.causal", model_arch_name(c->arch));
        gguf_writer_set_bool(w, key, false);
    }
    if (c->arch == MODEL_ARCH_QWEN35 || c->arch == MODEL_ARCH_QWEN35MOE) {
        set_arch_u32(w, c, "ssm.conv_kernel", c->ssm_conv);
        set_arch_u32(w, c, "ssm.state_size", c->ssm_state);
        set_arch_u32(w, c, "ssm.group_count", c->ssm_groups);
        set_arch_u32(w, c, "ssm.time_step_rank", c->ssm_vheads);
        set_arch_u32(w, c, "ssm.inner_size", c->ssm_inner);
        set_arch_u32(w, c, "full_attention_interval", 4);
        /* the multimodal RoPE sections of the rotated pairs (Qwen3.5-9B: 64 dims, [11, 11, 10]);
         * text gives every section the same position, so they change nothing here, but
         * llama.cpp refuses a qwen35 file without the key */
        const int pairs = (c->n_rot ? c->n_rot : head_dim_of(c)) / 2, s01 = (pairs + 2) / 3;
        const int32_t sections[4] = {s01, s01, pairs - 2 * s01, 0};
        char key[96];
        snprintf(key, sizeof key, "%s.rope.dimension_sections", model_arch_name(c->arch));
        gguf_writer_set_arr_i32(w, key, sections, 4);
    }
}

/* A vector (norm weight or bias) as F32, copied into the writer. */
static int add_vector(gguf_writer *w, const tensor_spec *s, const mkmodel_config *c, uint64_t id)
{
    const uint64_t seed = c->seed;
    float *v = malloc((size_t)s->ne0 * sizeof *v);
    if (!v) return -1;
    if (s->std > 0)
        fill_normal(stream_of(seed, id, 0), v, s->ne0, s->std);
    else
        for (int64_t i = 0; i < s->ne0; i++) v[i] = 1.0f;
    if (strcmp(s->role, "ssm_a") == 0) /* a DeltaNet's A = -exp(A_log): every decay below 1 */
        for (int64_t i = 0; i < s->ne0; i++) v[i] = -expf(v[i]);
    if (strcmp(s->role, "mtp_norm") == 0) /* N(1, std): an MTP norm that is not all ones */
        for (int64_t i = 0; i < s->ne0; i++) v[i] += 1.0f;
    if (strcmp(s->role, "rope_factors") == 0) /* LongRoPE divides the frequencies by these */
        for (int64_t i = 0; i < s->ne0; i++) v[i] = 1.0f + fabsf(v[i]);
    if (strcmp(s->role, "rope_freqs") == 0) /* gemma4: the first n_rot / 2 pairs turn, the rest stand */
        for (int64_t i = 0; i < s->ne0; i++) v[i] = i < c->n_rot / 2 ? 1.0f : 1e30f;
    gguf_writer_add_tensor(w, s->name, GGML_TYPE_F32, 1, &s->ne0, v, (size_t)s->ne0 * sizeof *v, false);
    free(v);
    return 0;
}

static int write_metadata(gguf_writer *w, const mkmodel_config *cfg, const char *corpus, size_t corpus_len,
                          bool *word_rows, char *err, size_t errlen)
{
    if (validate(cfg, err, errlen) != 0) return -1;
    write_hparams(w, cfg);
    return write_tokenizer(w, cfg, corpus, corpus_len, word_rows, err, errlen);
}

int mkmodel_write_metadata(gguf_writer *w, const mkmodel_config *cfg, const char *corpus,
                           size_t corpus_len, char *err, size_t errlen)
{
    return write_metadata(w, cfg, corpus, corpus_len, NULL, err, errlen);
}

/* A matrix's dimensions in the file (3: experts; deepseek2's heads) and type (the rule's, or
 * its fallback when the rows do not fit its blocks). */
static int spec_dims(const tensor_spec *s)
{
    return strstr(s->role, "_exps") || s->ne2 > 1 ? 3 : 2;
}

static ggml_type spec_type(const mkmodel_config *cfg, const tensor_spec *s)
{
    return row_fallback(mkmodel_tensor_type(cfg, s->role, s->layer), s->ne0);
}

int mkmodel_list(const mkmodel_config *cfg, mkmodel_tensor_info *out, int max, char *err, size_t errlen)
{
    if (validate(cfg, err, errlen) != 0) return -1;
    const int n = list_tensors(cfg, NULL);
    tensor_spec *specs = calloc((size_t)n, sizeof *specs);
    if (!specs) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    list_tensors(cfg, specs);
    for (int i = 0; i < n && i < max; i++) {
        const tensor_spec *s = &specs[i];
        const bool matrix = s->ne1 > 0;
        out[i] = (mkmodel_tensor_info){.ne = {s->ne0, matrix ? s->ne1 : 1, s->ne2},
                                       .n_dims = matrix ? spec_dims(s) : 1,
                                       .type = matrix ? spec_type(cfg, s) : GGML_TYPE_F32};
        snprintf(out[i].name, sizeof out[i].name, "%s", s->name);
    }
    free(specs);
    return n;
}

int mkmodel_write(const mkmodel_config *cfg, const char *corpus, size_t corpus_len,
                  const char *path, char *err, size_t errlen)
{
    if (validate(cfg, err, errlen) != 0) return -1;
    int n = list_tensors(cfg, NULL);
    tensor_spec *specs = calloc((size_t)n, sizeof *specs);
    tensor_gen *gens = calloc((size_t)n, sizeof *gens);
    gguf_writer *w = gguf_writer_new();
    int64_t max_row = 1; /* the longest row of any tensor */
    if (specs) list_tensors(cfg, specs);
    for (int i = 0; specs && i < n; i++)
        if (specs[i].ne0 > max_row) max_row = specs[i].ne0;
    gen_shared g = {.seed = cfg->seed, .cur_row = -1, .xrow = malloc((size_t)max_row * sizeof(float)),
                    .row = malloc((size_t)max_row * sizeof(float))};
    /* --words: which rows of the LM head are whole words (the tokenizer says) */
    bool *word_rows = cfg->words && !cfg->vocab ? calloc((size_t)cfg->n_vocab, sizeof *word_rows) : NULL;
    int rc = -1;
    if (!specs || !gens || !w || !g.xrow || !g.row || (cfg->words && !cfg->vocab && !word_rows)) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    int64_t n_params = 0;
    for (int i = 0; i < n; i++) n_params += specs[i].ne0 * (specs[i].ne1 ? specs[i].ne1 : 1) * specs[i].ne2;
    bool reuse = cfg->reuse_rows > 0 || (cfg->reuse_rows == 0 && n_params > LARGE_MODEL_PARAMS);

    if (write_metadata(w, cfg, corpus, corpus_len, word_rows, err, errlen) != 0) goto out;
    const char *lm_head = cfg->tied_output ? "token_embd" : "output";
    for (int i = 0; i < n; i++) {
        const tensor_spec *s = &specs[i];
        if (s->ne1 == 0) {
            if (add_vector(w, s, cfg, (uint64_t)i) != 0) {
                snprintf(err, errlen, "out of memory for tensor %s", s->name);
                goto out;
            }
            continue;
        }
        ggml_type type = spec_type(cfg, s);
        gens[i] = (tensor_gen){.g = &g, .id = (uint64_t)i, .type = type, .ne0 = s->ne0,
                               .ne1 = s->ne1 * s->ne2, .std = s->std, .row_bytes = ggml_row_bytes(type, s->ne0),
                               .word_rows = strcmp(s->role, lm_head) == 0 ? word_rows : NULL};
        if (reuse && !(gens[i].pool = pool_get(&g, type, s->ne0, s->std))) {
            snprintf(err, errlen, "cannot prepare rows of type %s for tensor %s", ggml_type_name(type), s->name);
            goto out;
        }
        if (!reuse) { /* fail early if the quantiser does not know the type */
            fill_normal(1, g.xrow, s->ne0, 1.0f);
            if (!encode_row(type, g.xrow, g.row, s->ne0)) {
                snprintf(err, errlen, "cannot quantise tensor %s to %s", s->name, ggml_type_name(type));
                goto out;
            }
        }
        int64_t ne[3] = {s->ne0, s->ne1, s->ne2}; /* rows of every expert, one after the other */
        gguf_writer_add_tensor_fill(w, s->name, type, spec_dims(s), ne, tensor_fill, &gens[i]);
    }
    rc = gguf_writer_write_file(w, path, err, errlen);
out:
    for (int i = 0; i < g.n_pools; i++) {
        free(g.pools[i]->rows);
        free(g.pools[i]);
    }
    free(g.pools);
    free(word_rows);
    free(g.xrow);
    free(g.row);
    gguf_writer_free(w);
    free(gens);
    free(specs);
    return rc;
}
