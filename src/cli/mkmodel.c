/* mkmodel.c - `inferd mkmodel`: write a synthetic GGUF model (see src/model/mkmodel.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timing.h"
#include "cli.h"
#include "engine/engine.h"
#include "synth/mkmodel.h"

#define CORPUS_MAX_BYTES (1u << 20)

static void usage(FILE *out)
{
    fprintf(out,
            "usage: inferd mkmodel -o OUT.gguf [options]\n"
            "  --preset NAME   tiny (default) | small | qwen2.5-1.5b | llama-3.1-8b | llama-3.1-70b | qwen3-0.6b\n"
            "                  | gemma-3-12b | gemma-3-27b | qwen3-30b-a3b (MoE: 128 experts, 8 per token)\n"
            "                  | gemma-4-31b (5 sliding layers of 16 kv heads x 256 : 1 full of 4 x 512, K = V)\n"
            "                  | gemma-4-26b-a4b (the same attention, 128 experts of 704 beside a GeGLU)\n"
            "                  | qwen3.5-9b | qwen3.5-35b-a3b (hybrid MoE: 256 experts, 8 per token, 1 shared)\n"
            "                  | gpt-oss-20b (32 MXFP4 experts, 4 per token, window 128, YaRN x32)\n"
            "                  | deepseek-v2-lite (latent attention, 64 experts, 6 per token)\n"
            "                  | phi-4-mini | mistral-small-24b | glm-4.5-air (128 experts, 8 per token,\n"
            "                  46 layers: ~64 GB at Q4_K_M, take fewer with --n-layer)\n"
            "                  | nomic-embed-text-v1.5 (nomic-bert encoder, 768 x 12, mean pooling, F16)\n"
            "  --arch A        llama | qwen2 | qwen3 | gemma3 | qwen3moe | gpt-oss | deepseek2 | glm4moe | phi3\n"
            "                  | nomic-bert | gemma4\n"
            "                  (overrides the preset's architecture; qwen3moe, gpt-oss: 8 experts of n-ff/4,\n"
            "                  2 per token; gpt-oss: window 128, YaRN x32 over 4096, Harmony's markup\n"
            "                  tokens; with --type mxfp4 only its experts are MXFP4, the other matrices\n"
            "                  Q8_0; deepseek2: qwen3moe's experts + 1 shared, a dense first layer, a\n"
            "                  latent 4 heads wide; glm4moe: the same experts, sigmoid-routed, RoPE on half\n"
            "                  a head; phi3: fused qkv and gate/up, LongRoPE on 3/4 of a head; nomic-bert:\n"
            "                  an encoder with RoPE, fused qkv, SwiGLU, post-LN, mean pooling; gemma4: 5\n"
            "                  sliding : 1 full layer, full heads twice as wide over a quarter of the kv\n"
            "                  heads, RoPE on a quarter of them, K = V, window 1024, soft cap 30)\n"
            "  --type T        f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q2_k | q3_k | q4_k\n"
            "                  | q5_k | q6_k | iq4_nl | iq4_xs | iq3_s | iq3_xxs | iq2_s | iq2_xs\n"
            "                  | iq2_xxs | iq1_m | iq1_s | mxfp4 | q4_k_m | q3_k_m | ud_q2_k_xl | ud_iq1_s\n"
            "  --n-embd N --n-layer N --n-head N --n-head-kv N --n-ff N --n-ctx N --n-vocab N\n"
            "  --n-expert N --n-expert-used N --n-ff-exp N   (qwen3moe, gpt-oss: experts, per token, width)\n"
            "  --head-dim N    per-head width (default n-embd / n-head; written as attention.key_length;\n"
            "                  gemma4: the sliding layers', as key_length_swa)\n"
            "  --seed N        weight seed (default 1)\n"
            "  --corpus-dir D  tokenizer training text: D/README.md + D/src (default: the source tree)\n"
            "  --vocab F.gguf  copy the tokenizer (tokenizer.* keys) of F instead; n-vocab follows it\n"
            "  --words FILE    a vocabulary of FILE's most frequent lowercase words, one token each, and\n"
            "                  an LM head that favours them: the random output reads as words\n"
            "  --name S        general.name\n"
            "  --pooling P     an embedding model: pooling_type P (none, mean, cls, last, rank)\n"
            "  --mtp N         qwen35, qwen35moe: N (1) multi-token-prediction blocks after the layers\n"
            "                  (nextn_predict_layers; llama.cpp's names), for --speculative mtp\n");
}

/* Parses a positive int flag value into *out; false (with a message) otherwise. */
static bool parse_int(const char *flag, const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1L << 30) {
        fprintf(stderr, "inferd mkmodel: %s: '%s' is not a positive integer\n", flag, s);
        return false;
    }
    *out = (int)v;
    return true;
}

static int arch_from_name(const char *s)
{
    if (strcmp(s, "llama") == 0) return MODEL_ARCH_LLAMA;
    if (strcmp(s, "qwen2") == 0) return MODEL_ARCH_QWEN2;
    if (strcmp(s, "qwen3") == 0) return MODEL_ARCH_QWEN3;
    if (strcmp(s, "gemma3") == 0) return MODEL_ARCH_GEMMA3;
    if (strcmp(s, "qwen3moe") == 0) return MODEL_ARCH_QWEN3MOE;
    if (strcmp(s, "gpt-oss") == 0) return MODEL_ARCH_GPTOSS;
    if (strcmp(s, "deepseek2") == 0) return MODEL_ARCH_DEEPSEEK2;
    if (strcmp(s, "glm4moe") == 0) return MODEL_ARCH_GLM4MOE;
    if (strcmp(s, "phi3") == 0) return MODEL_ARCH_PHI3;
    if (strcmp(s, "nomic-bert") == 0) return MODEL_ARCH_NOMIC_BERT;
    if (strcmp(s, "gemma4") == 0) return MODEL_ARCH_GEMMA4;
    return -1;
}

enum { N_DIMS = 11 }; /* --n-embd .. --head-dim, in the order of the option table */
enum { OPT_PRESET = 256, OPT_ARCH, OPT_TYPE, OPT_SEED, OPT_CORPUS, OPT_NAME, OPT_VOCAB, OPT_WORDS, OPT_POOLING, OPT_MTP, OPT_DIM0 };

int cli_mkmodel(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},
        {"preset", required_argument, NULL, OPT_PRESET},
        {"arch", required_argument, NULL, OPT_ARCH},
        {"type", required_argument, NULL, OPT_TYPE},
        {"seed", required_argument, NULL, OPT_SEED},
        {"corpus-dir", required_argument, NULL, OPT_CORPUS},
        {"name", required_argument, NULL, OPT_NAME},
        {"vocab", required_argument, NULL, OPT_VOCAB},
        {"n-embd", required_argument, NULL, OPT_DIM0 + 0},
        {"n-layer", required_argument, NULL, OPT_DIM0 + 1},
        {"n-head", required_argument, NULL, OPT_DIM0 + 2},
        {"n-head-kv", required_argument, NULL, OPT_DIM0 + 3},
        {"n-ff", required_argument, NULL, OPT_DIM0 + 4},
        {"n-ctx", required_argument, NULL, OPT_DIM0 + 5},
        {"n-vocab", required_argument, NULL, OPT_DIM0 + 6},
        {"n-expert", required_argument, NULL, OPT_DIM0 + 7},
        {"n-expert-used", required_argument, NULL, OPT_DIM0 + 8},
        {"n-ff-exp", required_argument, NULL, OPT_DIM0 + 9},
        {"head-dim", required_argument, NULL, OPT_DIM0 + 10},
        {"words", required_argument, NULL, OPT_WORDS},
        {"pooling", required_argument, NULL, OPT_POOLING},
        {"mtp", required_argument, NULL, OPT_MTP},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* First pass: the preset, so that the other flags override it whatever their order. */
    const char *preset = "tiny";
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--preset") == 0) preset = argv[i + 1];
    mkmodel_config cfg;
    if (!mkmodel_preset(preset, &cfg)) {
        fprintf(stderr, "inferd mkmodel: unknown preset '%s'\n", preset);
        usage(stderr);
        return 2;
    }
    const char *out = NULL, *corpus_dir = INFERD_SOURCE_DIR, *words = NULL;
    int arch = -1, ftype = -1;
    unsigned long long seed = 1;
    int dims[N_DIMS] = {0};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case OPT_PRESET: break;
        case OPT_ARCH:
            if ((arch = arch_from_name(optarg)) < 0) {
                fprintf(stderr, "inferd mkmodel: --arch: unknown architecture '%s' (llama, qwen2, qwen3, gemma3, qwen3moe, gpt-oss, deepseek2, glm4moe, phi3, nomic-bert, gemma4)\n", optarg);
                return 2;
            }
            break;
        case OPT_TYPE:
            if ((ftype = mkmodel_ftype_from_name(optarg)) < 0) {
                fprintf(stderr, "inferd mkmodel: --type: unknown weight type '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            seed = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end) {
                fprintf(stderr, "inferd mkmodel: --seed: '%s' is not a number\n", optarg);
                return 2;
            }
            break;
        }
        case OPT_CORPUS: corpus_dir = optarg; break;
        case OPT_NAME: snprintf(cfg.name, sizeof cfg.name, "%s", optarg); break;
        case OPT_VOCAB: cfg.vocab = optarg; break;
        case OPT_WORDS: words = optarg; break;
        case OPT_POOLING:
            if ((cfg.pooling = engine_pooling_parse(optarg) + 1) == 0) {
                fprintf(stderr, "inferd mkmodel: --pooling: '%s' is none of none, mean, cls, last, rank\n", optarg);
                return 2;
            }
            break;
        case OPT_MTP:
            if (!parse_int("--mtp", optarg, &cfg.n_mtp)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default:
            if (c >= OPT_DIM0 && c < OPT_DIM0 + N_DIMS) {
                if (!parse_int(opts[8 + c - OPT_DIM0].name, optarg, &dims[c - OPT_DIM0])) return 2;
                break;
            }
            usage(stderr);
            return 2;
        }
    }
    if (!out || optind != argc) {
        fprintf(stderr, "inferd mkmodel: %s\n", out ? "unexpected argument" : "-o OUT.gguf is required");
        usage(stderr);
        return 2;
    }
    if (arch >= 0 && arch != (int)cfg.arch) mkmodel_set_arch(&cfg, (model_arch)arch);
    if (ftype >= 0) cfg.ftype = (mkmodel_ftype)ftype;
    cfg.seed = seed;
    int *fields[N_DIMS] = {&cfg.n_embd, &cfg.n_layer, &cfg.n_head, &cfg.n_head_kv, &cfg.n_ff,
                           &cfg.n_ctx, &cfg.n_vocab, &cfg.n_expert, &cfg.n_expert_used, &cfg.n_ff_exp, &cfg.head_dim};
    if (dims[0] || dims[2]) cfg.head_dim = 0; /* derived again from the new sizes, unless given */
    for (int i = 0; i < N_DIMS; i++)
        if (dims[i]) *fields[i] = dims[i];
    if (cfg.arch == MODEL_ARCH_NOMIC_BERT) cfg.n_head_kv = cfg.n_head; /* an encoder: no grouped K/V */
    char err[256];
    if (cfg.vocab && !dims[6] && (cfg.n_vocab = mkmodel_vocab_size(cfg.vocab, err, sizeof err)) < 0) {
        fprintf(stderr, "inferd mkmodel: --vocab: %s\n", err);
        return 1;
    }

    if (words && cfg.vocab) {
        fprintf(stderr, "inferd mkmodel: --words and --vocab both choose the vocabulary: give one\n");
        return 2;
    }
    size_t corpus_len;
    cfg.words = words != NULL;
    char *corpus = words ? mkmodel_read_text(words, CORPUS_MAX_BYTES, &corpus_len, err, sizeof err)
                         : mkmodel_corpus(corpus_dir, CORPUS_MAX_BYTES, &corpus_len);
    if (!corpus) {
        fprintf(stderr, "inferd mkmodel: %s\n", words ? err : "out of memory");
        return 1;
    }
    double t0 = timing_now_s();
    int rc = mkmodel_write(&cfg, corpus, corpus_len, out, err, sizeof err);
    free(corpus);
    if (rc != 0) {
        fprintf(stderr, "inferd mkmodel: %s\n", err);
        return 1;
    }
    fprintf(stderr, "inferd mkmodel: wrote %s (%s, %s, %d layers, n_embd %d, vocab %d) in %.2f s\n", out,
            model_arch_name(cfg.arch), mkmodel_ftype_name(cfg.ftype), cfg.n_layer, cfg.n_embd,
            cfg.n_vocab, timing_now_s() - t0);
    return 0;
}
