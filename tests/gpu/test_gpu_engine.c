/* test_gpu_engine.c - the CUDA engine end to end against the CPU engine on the same GGUF:
 *   - logits at >= 256 positions (a 200-token prompt, then single-token decode steps) for
 *     every architecture and weight format: top-1 agreement >= 99 %, relative error reported;
 *     the same for a sandwich-norm family defined in the test;
 *   - stories260K (a trained model): logits and a 300-token greedy generation;
 *   - 32 concurrent greedy sequences give the tokens each gives alone, and so do sequences
 *     in mixed prefill + decode steps (split-K only, and flash prompts beside split-K decode);
 *   - a refused step leaves the engine usable; an impossible KV cache is refused with numbers;
 *   - gemma3 (sliding windows crossed by the prompt and the decode, GeGLU, soft-cap, embedding
 *     scale, two RoPE bases): a synthetic one in every format, and ../shared/reference's; one
 *     wide enough (QKV 8,192 x 4,096) for the wide one-row products in Q4_K and Q6_K;
 *   - gemma4 (per-layer embeddings, KV shared between layers, per-layer head_dim / kv heads / FFN
 *     width, V norm, layer scalars) and gemma4_moe (experts beside the dense GLU behind the scaled
 *     router, V from the K projection): ../shared/reference's files, logits as above, 32
 *     concurrent sequences as each alone, and a copied block (copy-on-write: each layer's own
 *     region of the caches) read as the original;
 *   - qwen3moe (mixture of experts): the reference files of ../shared/reference (F16, F32) and
 *     mkmodel-made ones in block-quantised formats, logits as above (a router's near tie may
 *     pick another expert on the GPU: a few positions may then differ more), and 32
 *     concurrent sequences of one as each alone;
 *   - the hybrid families (qwen35, qwen35moe, qwen3next of ../shared/reference: gated DeltaNet,
 *     gated attention, shared expert) as above; mkmodel's qwen35 and qwen35moe against the CPU
 *     over the weights as the GPU decodes them (hold_matrices), their decode steps against the
 *     same positions prompted; their recurrent state through a prompt in pieces and a snapshot
 *     resumed by another sequence;
 *   - --deterministic (det_check.h): dense Q4_K and F16, qwen3moe, the hybrids and gemma4 /
 *     gemma4_moe alone, together and with chunked prompts, bit for bit;
 *   - gpt-oss (attention sinks in every attention kernel, the output bias, YaRN, the biased
 *     top-k-then-softmax router, expert biases, the clamped SwiGLU; MXFP4 experts): the reference
 *     files of ../shared/reference (head_dim 16: split-K attention, per-entry experts) and a
 *     mkmodel-made MXFP4 one (head_dim 64: flash tiles and attn_decode, the grouped mmq launches),
 *     logits as qwen3moe's, 32 concurrent sequences as each alone;
 *   - the sliding layers' own KV pool (docs/sliding-kv.md): the reference gemma3 / gemma4 /
 *     gemma4_moe and synthetic gemma3 / gemma4 decoding far past the window through each row's
 *     ring give the logits of the one-pool engine bit for bit and the CPU's within the bounds
 *     above; blocks copied in both pools read as the originals; the Gemma-3-27B shape's K/V of
 *     one 32k sequence <= 25 % of the all-global figure (the scheduler's side, several
 *     sequences through a small pool with prefix hits, is tests/sched/test_swa.c with "cuda");
 *   - phi3 (fused qkv and gate/up, partial LongRoPE: short and long factors) and glm4moe (dense
 *     first layer, sigmoid router with selection bias, ungated shared expert) of
 *     ../shared/reference: logits as above and 32 concurrent sequences as each alone; mkmodel's
 *     files of both in F16, Q8_0 and Q4_K_M: logits as above;
 *   - encoders: BERT (../shared/reference's, a bge-small shape) and nomic-bert (rotary, fused
 *     QKV, SwiGLU; a small one and the nomic-embed-text-v1.5 shape) embeddings within cosine
 *     0.9999 of the CPU's;
 *   - deepseek2 (multi-head latent attention: the latent cache, the absorbed query, the value
 *     up-projection; the router's expert groups; gpu.h GPU_MLA_FEATURES): ../shared/reference's
 *     deepseek_v3 (q LoRA, YaRN's mscale, sigmoid router in groups), logits as above and 32
 *     concurrent sequences as each alone; mkmodel's in F16, Q8_0, Q4_K_M (with and without q
 *     LoRA) and Q6_K over several weight seeds (latent rows of 288: the wide attention kernel),
 *     against the CPU over the weights as the GPU decodes them (hold_matrices);
 *   - a recipe feature the GPU does not run (jina-bert-v2's ALiBi, without a device) is refused
 *     by name.
 * Skips without a device. */
#include <fnmatch.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <unistd.h>

#include "../model/tiny_model.h"
#include "model/quant.h"
#include "synth/mkmodel.h"
#include "gpu/gpu.h"
#include "gpu/gpu_kernel_names.h"
#include "gpu/gpu_shared.h"
#include "gpu_test_util.h" /* before det_check.h: its engine_open is capped too */
#include "../model/det_check.h"

#define N_PROMPT 200
#define N_POS 288

typedef struct pair {
    engine *cpu, *gpu;
} pair;

static pair make_pair(const model *m, const engine_config *cfg)
{
    char err[512];
    pair p = {engine_open(ENGINE_DEVICE_CPU, m, cfg, err, sizeof err), NULL};
    if (!p.cpu) fail_msg("cpu engine: %s", err);
    p.gpu = engine_open(ENGINE_DEVICE_CUDA, m, cfg, err, sizeof err);
    if (!p.gpu) fail_msg("cuda engine: %s", err);
    return p;
}

static void free_pair(pair *p)
{
    engine_free(p->cpu);
    engine_free(p->gpu);
}

/* Logits of tokens[0..n) in slot `slot`: a prompt of n_prompt tokens (every position's
 * logits) in steps of at most `chunk`, then one decode step per remaining token. */
static void run_logits_chunked(engine *e, int slot, const int32_t *tokens, int n, int n_prompt, int chunk,
                               float *logits, int V)
{
    char err[512];
    engine_seq s;
    for (int p = 0; p < n_prompt; p += chunk) {
        s = (engine_seq){.slot = slot, .tokens = tokens + p, .n_tokens = n_prompt - p < chunk ? n_prompt - p : chunk,
                         .pos = p, .logits = logits + (size_t)p * V, .logits_all = true};
        if (engine_step(e, &s, 1, NULL, err, sizeof err)) fail_msg("%s prefill at %d: %s", engine_name(e), p, err);
    }
    for (int p = n_prompt; p < n; p++) {
        s = (engine_seq){.slot = slot, .tokens = tokens + p, .n_tokens = 1, .pos = p, .logits = logits + (size_t)p * V};
        if (engine_step(e, &s, 1, NULL, err, sizeof err)) fail_msg("%s decode %d: %s", engine_name(e), p, err);
    }
}

static void run_logits(engine *e, int slot, const int32_t *tokens, int n, int n_prompt, float *logits, int V)
{
    run_logits_chunked(e, slot, tokens, n, n_prompt, n_prompt, logits, V);
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

#define REL_BOUND 3e-2 /* a position's ||gpu - cpu|| / ||cpu|| */
/* A near tie: the reference's logits of its argmax and of the GPU's within this fraction of
 * its RMS logit.  About 4x what the GPU's logits are off by where no discrete choice flips
 * (deepseek2's mkmodel files: at most 2.4e-3 relative, docs/mla-gpu.md); a tiny random model's
 * flat positions sit closer than that (one of them: 10 of 288 under 5e-3, two under 4e-5). */
#define TIE_BOUND 1e-2

typedef struct agreement {
    double top1;    /* fraction of positions with the same argmax */
    double top1_or_tie; /* ... or, where not, at a near tie of the reference (TIE_BOUND) */
    double max_rel; /* worst per-position ||gpu - cpu|| / ||cpu|| */
    int over;       /* positions over REL_BOUND */
    char where[160]; /* the first of them and of the top-1 differences: "p12 p200* p250~ ..."
                      * (*: top-1, ~: top-1 at a near tie) */
} agreement;

/* Whether the reference's logits c of its argmax and of token t are within TIE_BOUND of its
 * RMS logit. */
static bool near_tie(const float *c, int V, int t)
{
    double rms = 0.0;
    for (int i = 0; i < V; i++) rms += (double)c[i] * c[i];
    return c[argmax(c, V)] - c[t] <= TIE_BOUND * sqrt(rms / V);
}

static agreement compare_logits(const float *gpu, const float *cpu, int n_pos, int V)
{
    agreement a = {0.0, 0.0, 0.0, 0, ""};
    size_t len = 0;
    int same = 0, same_or_tie = 0;
    for (int p = 0; p < n_pos; p++) {
        const float *g = gpu + (size_t)p * V, *c = cpu + (size_t)p * V;
        const int choice = argmax(g, V);
        bool top1 = choice == argmax(c, V), tie = !top1 && near_tie(c, V, choice);
        same += top1;
        same_or_tie += top1 || tie;
        double e = gpu_test_rel_err(g, c, (size_t)V);
        if (e > a.max_rel) a.max_rel = e;
        a.over += e > REL_BOUND;
        if ((e > REL_BOUND || !top1) && len + 12 < sizeof a.where)
            len += (size_t)snprintf(a.where + len, sizeof a.where - len, " p%d%s", p, top1 ? "" : tie ? "~" : "*");
    }
    a.top1 = (double)same / n_pos;
    a.top1_or_tie = (double)same_or_tie / n_pos;
    return a;
}

/* GPU against CPU logits of m at n_pos positions in engines of ctx positions per slot, printed. */
static agreement measure_logits_ctx(const model *m, const char *label, int n_pos, int n_prompt, const int32_t *tokens,
                                    int ctx)
{
    int V = m->hp.n_vocab;
    engine_config cfg = {.n_slots = 3, .ctx_per_slot = ctx, .max_batch_tokens = 256, .n_threads = 2};
    pair p = make_pair(m, &cfg);
    float *lg = malloc((size_t)n_pos * V * sizeof *lg), *lc = malloc((size_t)n_pos * V * sizeof *lc);
    for (size_t i = 0; i < (size_t)n_pos * V; i++) lg[i] = NAN;
    run_logits(p.gpu, 1, tokens, n_pos, n_prompt, lg, V);
    run_logits(p.cpu, 1, tokens, n_pos, n_prompt, lc, V);
    agreement a = compare_logits(lg, lc, n_pos, V);
    print_message("  %-24s %d positions: top-1 agreement %.2f %%, max relative logit error %.2e (%d over %.0e%s%s)\n",
                  label, n_pos, 100.0 * a.top1, a.max_rel, a.over, REL_BOUND, a.where[0] ? ":" : "", a.where);
    free(lg);
    free(lc);
    free_pair(&p);
    return a;
}

static agreement measure_logits(const model *m, const char *label, int n_pos, int n_prompt, const int32_t *tokens)
{
    return measure_logits_ctx(m, label, n_pos, n_prompt, tokens, n_pos + 8);
}

/* ... within bounds: top-1 >= 99 %, and at most max_over positions over REL_BOUND (0 for
 * dense models). */
static void check_logits_within(const model *m, const char *label, int n_pos, int n_prompt, const int32_t *tokens,
                                int max_over)
{
    agreement a = measure_logits(m, label, n_pos, n_prompt, tokens);
    assert_true(a.top1 >= 0.99);
    assert_true(a.over <= max_over);
}

static void check_model_logits(const model *m, const char *label, int n_pos, int n_prompt, const int32_t *tokens)
{
    check_logits_within(m, label, n_pos, n_prompt, tokens, 0);
}

/* Every format the GPU reads (gpu_kernel_names.h). */
#define GPU_TEST_WTYPE(TYPE, suffix) GGML_TYPE_##TYPE,
static const ggml_type TYPES[] = {GPU_WEIGHT_TYPES(GPU_TEST_WTYPE)};
#undef GPU_TEST_WTYPE

/* A 2-layer model of family `arch` (index a: llama's rope extras on 0, tied output on the
 * others) in weight type TYPES[t], GPU logits against the CPU's; n_swa > 0: gemma3's keys
 * with that window (6 layers then: 5 sliding, 1 full); head_dim 0: n_embd / n_head (64). */
static void check_arch(const char *arch, int a, int t, bool post_norms, int n_swa, int head_dim, uint64_t *seed)
{
    const ggml_type type = TYPES[t];
    tiny_spec s = tiny_spec_default();
    s.arch = arch;
    s.n_vocab = 512;
    s.n_embd = 256;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.n_ctx = 512;
    s.wtype = type;
    s.tied = a > 0;
    s.rope_freqs = a == 0;
    s.rope_scale = a == 0 ? 2.0f : 0.0f;
    s.post_norms = post_norms;
    s.n_swa = n_swa;
    s.head_dim = head_dim;
    if (n_swa) s.n_layer = 6;
    s.seed = 100 + (uint64_t)a * 10 + (uint64_t)t;
    size_t size;
    void *image = tiny_model_build(&s, &size);
    assert_non_null(image);
    char err[512];
    model *m = tiny_model_load(image, size, err, sizeof err);
    if (!m) fail_msg("%s", err);
    int32_t tokens[N_POS];
    for (int i = 0; i < N_POS; i++) tokens[i] = (int32_t)(gpu_test_rng(seed) % (uint64_t)s.n_vocab);
    char label[64];
    snprintf(label, sizeof label, "%s %s", arch, ggml_type_name(type));
    check_model_logits(m, label, N_POS, N_PROMPT, tokens);
    model_free(m);
    free(image);
}

/* Every family in the first 8 formats (F32 .. Q6_K); the formats after them (decoded by the
 * same kernels whatever the family) on llama, which keeps the test inside its time bound. */
#define N_FAMILY_TYPES 8

static void test_logits_every_arch_and_format(void **state)
{
    (void)state;
    static const char *archs[] = {"llama", "qwen2", "qwen3"};
    uint64_t seed = 11;
    for (int a = 0; a < 3; a++)
        for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++)
            if (a == 0 || t < N_FAMILY_TYPES) check_arch(archs[a], a, (int)t, false, 0, 0, &seed);
}

/* The file mkmodel writes for cfg: GPU logits against the CPU's on random tokens. */
static void check_mkmodel_logits(const mkmodel_config *cfg, const char *label, uint64_t *seed)
{
    static const char text[] = "the quick brown fox jumps over the lazy dog, again and again and again";
    char path[64], err[512];
    snprintf(path, sizeof path, "/tmp/inferd-gpu-mkmodel-%ld.gguf", (long)getpid());
    if (mkmodel_write(cfg, text, sizeof text - 1, path, err, sizeof err)) fail_msg("%s", err);
    model *m = model_load(path, err, sizeof err);
    unlink(path);
    if (!m) fail_msg("%s", err);
    int32_t tokens[N_POS];
    for (int p = 0; p < N_POS; p++) tokens[p] = (int32_t)(gpu_test_rng(seed) % (uint64_t)cfg->n_vocab);
    check_model_logits(m, label, N_POS, N_PROMPT, tokens);
    model_free(m);
}

/* mkmodel's UD-style mixes and llama.cpp's Q3_K_M (a type per tensor role and layer, K and IQ
 * types together in one model): GPU logits against the CPU's on the file mkmodel writes. */
static void test_logits_ud_mixes(void **state)
{
    (void)state;
    static const mkmodel_ftype mixes[] = {MKMODEL_UD_Q2_K_XL, MKMODEL_UD_IQ1_S, MKMODEL_Q3_K_M};
    uint64_t seed = 23;
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++) {
        mkmodel_config cfg;
        assert_true(mkmodel_preset("tiny", &cfg));
        cfg.n_embd = 256;
        cfg.n_ff = 512;
        cfg.n_layer = 3;
        cfg.ftype = mixes[i];
        check_mkmodel_logits(&cfg, mkmodel_ftype_name(cfg.ftype), &seed);
    }
}

/* mkmodel's BF16 and F32 files, which the GPU reads as they lie (no FP16 copies): BF16 through
 * mmq at rows of whole 256-input stages and through matvec at any row count otherwise (width
 * 288), F32 through cuBLAS's FP32 product over a 200-token prompt; GPU logits against the
 * CPU's. */
static void test_logits_float_files(void **state)
{
    (void)state;
    static const struct {
        mkmodel_ftype ft;
        int n_embd;
    } files[] = {{MKMODEL_BF16, 256}, {MKMODEL_BF16, 288}, {MKMODEL_F32, 256}, {MKMODEL_F32, 288}};
    uint64_t seed = 29;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        mkmodel_config cfg;
        assert_true(mkmodel_preset("tiny", &cfg));
        cfg.n_embd = files[i].n_embd;
        cfg.n_head = 4;
        cfg.head_dim = 64;
        cfg.n_ff = 2 * files[i].n_embd;
        cfg.n_layer = 2;
        cfg.ftype = files[i].ft;
        char label[32];
        snprintf(label, sizeof label, "%s n_embd %d", mkmodel_ftype_name(cfg.ftype), cfg.n_embd);
        check_mkmodel_logits(&cfg, label, &seed);
    }
}

/* A family defined in a test: llama's keys and tensors, every layer with this norm placement
 * and attention kind (d: its storage, which the registry keeps). */
static void register_toy(arch_desc *d, const char *name, arch_norm norm, arch_attn attn)
{
    *d = (arch_desc){
        .name = name,
        ARCH_DENSE_LISTS,
        .rope = ARCH_ROPE_NORMAL,
        .pattern = {{.norm = norm, .attn = attn, .ffn = ARCH_FFN_GLU, .act = ARCH_ACT_SILU}},
        .pattern_len = 1,
    };
    assert_true(arch_register(d) >= 0);
}

/* llama with sandwich norms (post-norms after each block), which the GPU runs with its
 * existing kernels (gpu_forward.c: residual_add). */
static void test_logits_sandwich_norms(void **state)
{
    (void)state;
    static arch_desc sandwich;
    register_toy(&sandwich, "toy-gpu-sandwich", ARCH_NORM_SANDWICH, ARCH_ATTN_FULL);
    uint64_t seed = 12;
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) check_arch(sandwich.name, 0, (int)t, true, 0, 0, &seed);
}

/* A model of the shared folder (or INFERD_SHARED_DIR) by its path there, NULL when absent. */
static model *load_shared(const char *rel)
{
    const char *dir = getenv("INFERD_SHARED_DIR");
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : INFERD_SHARED_DIR, rel);
    FILE *f = fopen(path, "rb");
    if (!f) {
        print_message("  SKIP: %s not found\n", path);
        return NULL;
    }
    fclose(f);
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s: %s", path, err);
    return m;
}

static model *load_stories(void) { return load_shared("models/stories260K.gguf"); }

/* N_POS tokens drawn from m's vocabulary. */
static void random_tokens(const model *m, uint64_t *seed, int32_t *tokens)
{
    for (int t = 0; t < N_POS; t++) tokens[t] = (int32_t)(gpu_test_rng(seed) % (uint64_t)m->hp.n_vocab);
}

/* gemma3 with a window of 48 (head_dim 64: flash tiles for the 200-token prompt and the
 * tensor-core decode, both walking from the window's block with its first keys masked; then
 * head_dim 256, Gemma 3's own, in F32 and Q4_K: flash_attn_hd256's tiles of 32 tokens for the
 * prompt, split-K for the decode tokens), then the tiny reference model of ../shared/reference
 * (head_dim 32: split-K everywhere, window 8) on 288 random tokens. */
static void test_logits_gemma3(void **state)
{
    (void)state;
    uint64_t seed = 13;
    for (size_t t = 0; t < N_FAMILY_TYPES; t++) check_arch("gemma3", 1, (int)t, true, 48, 0, &seed);
    check_arch("gemma3", 1, 0, true, 48, 256, &seed);
    check_arch("gemma3", 1, 5, true, 48, 256, &seed);
    model *m = load_shared("reference/gemma3.gguf");
    if (!m) return;
    int32_t tokens[N_POS];
    for (int i = 0; i < N_POS; i++) tokens[i] = (int32_t)(gpu_test_rng(&seed) % (uint64_t)m->hp.n_vocab);
    check_model_logits(m, "reference gemma3", N_POS, N_PROMPT, tokens);
    model_free(m);
}

/* Greedy generation of n tokens after `prompt` in slot 0, one decode step at a time; the
 * logits each token was chosen from go to logits (n x n_vocab) when non-NULL. */
static void greedy(engine *e, const int32_t *prompt, int n_prompt, int n, int32_t *out, float *logits)
{
    char err[512];
    sampling_params sp;
    sampling_params_default(&sp);
    engine_result r;
    const size_t V = (size_t)engine_model(e)->hp.n_vocab;
    engine_seq s = {.slot = 0, .tokens = prompt, .n_tokens = n_prompt, .pos = 0, .want_token = true, .sp = &sp};
    for (int i = 0; i < n; i++) {
        s.logits = logits ? logits + i * V : NULL;
        if (engine_step(e, &s, 1, &r, err, sizeof err)) fail_msg("%s: %s", engine_name(e), err);
        out[i] = r.token;
        s = (engine_seq){.slot = 0, .tokens = &out[i], .n_tokens = 1, .pos = n_prompt + i, .want_token = true, .sp = &sp};
    }
}

static void test_stories260k(void **state)
{
    (void)state;
    model *m = load_stories();
    if (!m) skip();
    engine_config cfg = {.n_slots = 2, .ctx_per_slot = 512, .max_batch_tokens = 512, .n_threads = 2};
    pair p = make_pair(m, &cfg);
    enum { N = 300 };
    int32_t seq[N + 1] = {1}, gpu_tokens[N];
    greedy(p.cpu, seq, 1, N, seq + 1, NULL);
    greedy(p.gpu, seq, 1, N, gpu_tokens, NULL);
    int same = 0;
    while (same < N && gpu_tokens[same] == seq[same + 1]) same++;
    print_message("  stories260K greedy: GPU equals CPU for %d of %d tokens\n", same, N);
    assert_int_equal(same, N);
    free_pair(&p);
    check_model_logits(m, "stories260K F32", N, 64, seq);
    model_free(m);
}

/* Margin between the best and second-best logit. */
static float top2_gap(const float *l, int n)
{
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (l[i] > a) b = a, a = l[i];
        else if (l[i] > b) b = l[i];
    }
    return a - b;
}

/* Speculative verification on each backend: greedy decoding walked by verification steps
 * whose drafts are the plain run's own continuation with every third draft wrong (so steps
 * both accept and reject, and each rolls back), must give the plain run's tokens.  On the GPU
 * a verification's attention runs as flash tiles, a decode's through split-K: a token may
 * only differ where the plain run had a near tie (top-2 gap below 1e-3), and the walk stops
 * comparing there. */
static void verify_walk(engine *e, const int32_t *prompt, const int32_t *plain, const float *plain_logits, int n)
{
    enum { K = 6 };
    char err[512];
    sampling_params sp;
    sampling_params_default(&sp);
    const int V = engine_model(e)->hp.n_vocab;
    int32_t got[512], feed[K + 1];
    engine_result samples[K + 1], last;
    engine_slot_clear(e, 0);
    engine_seq s = {.slot = 0, .tokens = prompt, .n_tokens = 1, .want_token = true, .sp = &sp};
    if (engine_step(e, &s, 1, &last, err, sizeof err)) fail_msg("%s: %s", engine_name(e), err);
    got[0] = last.token;
    int have = 1, steps = 0, accepted = 0;
    while (have < n) {
        int k = n - have - 1 < K ? n - have - 1 : K;
        feed[0] = got[have - 1];
        for (int j = 1; j <= k; j++) feed[j] = (have + j) % 3 == 0 ? (plain[have + j - 1] + 1) % V : plain[have + j - 1];
        s = (engine_seq){.slot = 0, .tokens = feed, .n_tokens = k + 1, .pos = have, .want_token = true, .sp = &sp,
                         .n_sample = k + 1, .sampled = samples};
        if (engine_step(e, &s, 1, &last, err, sizeof err)) fail_msg("%s verify: %s", engine_name(e), err);
        if (k == 0) samples[0] = last; /* a plain decode: its one sample comes in the result */
        int a = engine_verify_accept(feed + 1, k, samples);
        for (int j = 0; j <= a && have < n; j++) got[have++] = samples[j].token;
        accepted += a;
        steps++;
        for (int t = have - a - 1; t < have; t++) {
            if (got[t] == plain[t]) continue;
            float gap = top2_gap(plain_logits + (size_t)t * V, V);
            print_message("  %s verify: token %d is %d, decoding gave %d (top-2 gap %g)\n", engine_name(e), t, got[t],
                          plain[t], gap);
            assert_true(gap < 1e-3f);
            return;
        }
    }
    print_message("  %s verify: %d tokens in %d steps (%d drafts accepted), as decoded\n", engine_name(e), n, steps,
                  accepted);
}

static void test_verify_equals_decode(void **state)
{
    (void)state;
    model *m = load_stories();
    if (!m) skip();
    engine_config cfg = {.n_slots = 2, .ctx_per_slot = 512, .max_batch_tokens = 512, .n_threads = 2, .max_draft = 6};
    pair p = make_pair(m, &cfg);
    enum { N = 200 };
    const int32_t bos = 1;
    int32_t plain[N];
    float *logits = malloc((size_t)N * m->hp.n_vocab * sizeof *logits);
    engine *both[2] = {p.cpu, p.gpu};
    for (int b = 0; b < 2; b++) {
        greedy(both[b], &bos, 1, N, plain, logits);
        verify_walk(both[b], &bos, plain, logits, N);
    }
    free(logits);
    free_pair(&p);
    model_free(m);
}

/* engine_decode_rounds on the GPU (the decode graph replayed round after round, each round's
 * tokens passed on on the device, the samples read back once) gives what as many engine_steps
 * give, bit for bit (tokens and logprobs): greedy, and sampled with penalties (their history is
 * the rounds' own tokens, their randomness the position's), at batch 1 and 3, 7 rounds at a
 * time from prompts of 1, 21 and 41 tokens to position ~420 (across KV blocks and key-split
 * counts); and refuses what it cannot run: two tokens, rounds past the context. */
static void test_decode_rounds_equal_steps(void **state)
{
    (void)state;
    model *m = load_stories();
    if (!m) skip();
    enum { NS = 3, ROUNDS = 7, LEN = 420 };
    engine_config cfg = {.n_slots = 2 * NS, .ctx_per_slot = 512, .max_batch_tokens = 512, .n_threads = 2};
    char err[512];
    engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
    if (!e) fail_msg("cuda engine: %s", err);
    sampling_params sp[2];
    sampling_params_default(&sp[0]);
    sampling_params_default(&sp[1]);
    sp[1].temperature = 0.8f;
    sp[1].top_k = 40;
    sp[1].seed = 11;
    sp[1].repeat_penalty = 1.1f;
    sp[1].presence_penalty = 0.2f;
    const int V = m->hp.n_vocab;
    for (int k = 0; k < 2; k++) {
        for (int nb = 1; nb <= NS; nb += NS - 1) {
            int32_t prompt[NS][64], next[2][NS]; /* [0]: the rounds' side (slots 0..), [1]: the steps' (NS..) */
            int pos[NS];
            engine_seq seqs[NS];
            engine_result res[NS], rounds_res[ROUNDS * NS];
            for (int side = 0; side < 2; side++) {
                for (int i = 0; i < nb; i++) {
                    pos[i] = 1 + 20 * i;
                    for (int j = 0; j < pos[i]; j++) prompt[i][j] = j == 0 ? 1 : (7 * i + 13 * j) % V;
                    engine_slot_clear(e, side * NS + i);
                    seqs[i] = (engine_seq){.slot = side * NS + i, .tokens = prompt[i], .n_tokens = pos[i],
                                           .want_token = true, .sp = &sp[k]};
                }
                if (engine_step(e, seqs, nb, res, err, sizeof err)) fail_msg("prefill: %s", err);
                for (int i = 0; i < nb; i++) next[side][i] = res[i].token;
            }
            int compared = 0;
            while (pos[nb - 1] + ROUNDS <= LEN) {
                for (int i = 0; i < nb; i++)
                    seqs[i] = (engine_seq){.slot = i, .tokens = &next[0][i], .n_tokens = 1, .pos = pos[i],
                                           .want_token = true, .sp = &sp[k]};
                if (engine_decode_rounds(e, seqs, nb, ROUNDS, rounds_res, err, sizeof err))
                    fail_msg("decode rounds: %s", err);
                for (int r = 0; r < ROUNDS; r++) {
                    for (int i = 0; i < nb; i++)
                        seqs[i] = (engine_seq){.slot = NS + i, .tokens = &next[1][i], .n_tokens = 1, .pos = pos[i] + r,
                                               .want_token = true, .sp = &sp[k]};
                    if (engine_step(e, seqs, nb, res, err, sizeof err)) fail_msg("step: %s", err);
                    for (int i = 0; i < nb; i++) {
                        const engine_result *a = &rounds_res[r * nb + i];
                        if (a->token != res[i].token || memcmp(&a->logprob, &res[i].logprob, sizeof a->logprob))
                            fail_msg("%s batch %d, seq %d at position %d: rounds gave %d (%g), steps %d (%g)",
                                     k ? "sampled" : "greedy", nb, i, pos[i] + r, a->token, a->logprob, res[i].token,
                                     res[i].logprob);
                        next[1][i] = res[i].token;
                        compared++;
                    }
                }
                for (int i = 0; i < nb; i++) {
                    next[0][i] = rounds_res[(ROUNDS - 1) * nb + i].token;
                    pos[i] += ROUNDS;
                }
            }
            print_message("  %s, batch %d: %d tokens of rounds as of steps\n", k ? "sampled" : "greedy", nb, compared);
        }
    }
    int32_t two[2] = {1, 2};
    engine_seq bad = {.slot = 0, .tokens = two, .n_tokens = 2, .pos = 0, .want_token = true, .sp = &sp[0]};
    assert_int_equal(engine_decode_rounds(e, &bad, 1, 3, (engine_result[3]){0}, err, sizeof err), ENGINE_EINVAL);
    bad = (engine_seq){.slot = 0, .tokens = two, .n_tokens = 1, .pos = 510, .want_token = true, .sp = &sp[0]};
    assert_int_equal(engine_decode_rounds(e, &bad, 1, 3, (engine_result[3]){0}, err, sizeof err), ENGINE_EINVAL);
    engine_free(e);
    model_free(m);
}

/* A near tie: a solo top-2 gap below this fraction of the logit's magnitude (at least 1). */
#define NEAR_TIE 1e-3f

/* Sequences run together against the same ones run alone: ns x gen greedy tokens each, the
 * logits each solo token was chosen from and, where kept (a MoE model's; NULL: not kept), those
 * each together token was chosen from. */
typedef struct run_pair {
    const char *what;
    int ns, gen, V;
    const int32_t *alone, *together;
    const float *solo_logits, *together_logits;
} run_pair;

/* A router's near tie decided differently by the two runs' rounding (batched products sum in
 * another order) swaps one of a token's experts: that token's logits jump by far more than
 * rounding at once, and its K/V carry the change on, so a greedy choice may follow at any gap.
 * Told apart from a kernel's error by the run up to it: sequence i's solo and together logits
 * within SWAP_QUIET (ten times under REL_BOUND; the H100's rounding: 2e-4..8e-4) at every step
 * before the step that jumps past REL_BOUND, at or before its divergence at token g.  That
 * step, or -1. */
#define SWAP_QUIET 3e-3
static int router_swap_step(const run_pair *r, int i, int g)
{
    if (!r->together_logits) return -1;
    for (int j = 0; j <= g; j++) {
        const size_t at = ((size_t)i * r->gen + j) * r->V;
        const double e = gpu_test_rel_err(r->together_logits + at, r->solo_logits + at, (size_t)r->V);
        if (e > REL_BOUND) return j;
        if (e > SWAP_QUIET) return -1;
    }
    return -1;
}

/* A greedy choice may only differ where the solo run had a near tie (top-2 gap below tie_frac
 * of the logit scale) or, with together_logits, after a router swap.  Prints every divergence;
 * returns how many sequences diverge and, in *bad, how many neither way. */
static int count_divergences(const run_pair *r, float tie_frac, int *bad)
{
    int differ = 0, swaps = 0;
    *bad = 0;
    for (int i = 0; i < r->ns; i++) {
        const int32_t *al = r->alone + (size_t)i * r->gen, *to = r->together + (size_t)i * r->gen;
        int g = 0;
        while (g < r->gen && al[g] == to[g]) g++;
        if (g == r->gen) continue;
        differ++;
        const float *l = r->solo_logits + ((size_t)i * r->gen + g) * r->V;
        float gap = top2_gap(l, r->V), scale = fabsf(l[al[g]]) > 1.0f ? fabsf(l[al[g]]) : 1.0f;
        bool tie = gap < tie_frac * scale;
        int swap = tie ? -1 : router_swap_step(r, i, g);
        char why[64];
        if (tie) snprintf(why, sizeof why, "a near tie");
        else if (swap >= 0) snprintf(why, sizeof why, "after a router swap at token %d", swap);
        else snprintf(why, sizeof why, "NOT a tie");
        swaps += swap >= 0;
        *bad += !tie && swap < 0;
        print_message("  seq %d diverges at token %d (%d alone, %d %s): solo top-2 gap %.2e, logit %.2f (%s)\n", i, g,
                      al[g], to[g], r->what, gap, l[al[g]], why);
    }
    print_message("  %d %s greedy sequences x %d tokens: %d identical to their solo runs, %d diverge at a near tie, "
                  "%d after a router swap, %d otherwise\n", r->ns, r->what, r->gen, r->ns - differ,
                  differ - swaps - *bad, swaps, *bad);
    return differ;
}

/* Every divergence a near tie (gap below tie_frac of the logit) or after a router swap, and at
 * most max_differ of them. */
static void expect_near_ties_within(const run_pair *r, float tie_frac, int max_differ)
{
    int bad, differ = count_divergences(r, tie_frac, &bad);
    assert_int_equal(bad, 0);
    assert_true(differ <= max_differ);
}

static void expect_near_ties_only(const char *what, int ns, int gen, const int32_t *alone, const int32_t *together,
                                  const float *solo_logits, int V)
{
    const run_pair r = {what, ns, gen, V, alone, together, solo_logits, NULL};
    expect_near_ties_within(&r, NEAR_TIE, 2);
}

static model *random_model(tiny_spec s, void **image)
{
    size_t size;
    char err[512];
    *image = tiny_model_build(&s, &size);
    model *m = tiny_model_load(*image, size, err, sizeof err);
    if (!m) fail_msg("%s", err);
    return m;
}

/* 32 sequences of m decoded together (prompts in one step, then decode steps: a graph of 32)
 * give the tokens each gives alone.  Batched steps of more than GPU_MATVEC_MAX_M rows run
 * through mmq or cuBLAS, whose FP32 sums run in another order than the matrix-vector
 * kernels': the products are the same FP16 values, so the logits agree to rounding, and a
 * greedy choice may only flip where the solo run had a near tie. */
static void batch_of_32_within(model *m, float tie_frac, int max_differ)
{
    enum { NS = 32, GEN = 24, MAXP = 20 };
    const int V = m->hp.n_vocab;
    char err[512];
    engine_config cfg = {.n_slots = NS, .ctx_per_slot = 64, .max_batch_tokens = NS * MAXP};
    engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
    if (!e) fail_msg("%s", err);
    int32_t prompts[NS][MAXP], alone[NS][GEN], together[NS][GEN];
    float *solo_logits = malloc((size_t)NS * GEN * V * sizeof *solo_logits);
    /* a MoE's together logits too: its router swaps (router_swap_step) */
    float *tog_logits = m->hp.n_expert ? malloc((size_t)NS * GEN * V * sizeof *tog_logits) : NULL;
    int plen[NS];
    uint64_t seed = 3;
    for (int i = 0; i < NS; i++) {
        plen[i] = 3 + i % 17;
        prompts[i][0] = 1;
        for (int j = 1; j < plen[i]; j++) prompts[i][j] = 3 + (int32_t)(gpu_test_rng(&seed) % (uint64_t)(V - 3));
        greedy(e, prompts[i], plen[i], GEN, alone[i], solo_logits + (size_t)i * GEN * V);
    }
    sampling_params sp;
    sampling_params_default(&sp);
    engine_seq seqs[NS];
    engine_result res[NS];
    for (int i = 0; i < NS; i++)
        seqs[i] = (engine_seq){.slot = i, .tokens = prompts[i], .n_tokens = plen[i], .pos = 0, .want_token = true, .sp = &sp};
    for (int g = 0; g < GEN; g++) {
        for (int i = 0; i < NS && tog_logits; i++) seqs[i].logits = tog_logits + ((size_t)i * GEN + g) * V;
        if (engine_step(e, seqs, NS, res, err, sizeof err)) fail_msg("batched step %d: %s", g, err);
        for (int i = 0; i < NS; i++) {
            together[i][g] = res[i].token;
            seqs[i] = (engine_seq){.slot = i, .tokens = &together[i][g], .n_tokens = 1, .pos = plen[i] + g,
                                   .want_token = true, .sp = &sp};
        }
    }
    const run_pair r = {"concurrent", NS, GEN, V, &alone[0][0], &together[0][0], solo_logits, tog_logits};
    expect_near_ties_within(&r, tie_frac, max_differ);
    engine_free(e);
    free(solo_logits);
    free(tog_logits);
}

static void batch_of_32(model *m) { batch_of_32_within(m, NEAR_TIE, 2); }

static void test_batch_of_32_equals_alone(void **state)
{
    (void)state;
    model *m = load_stories();
    void *image = NULL;
    if (!m) { /* fall back to a random Q4_K model */
        tiny_spec s = tiny_spec_default();
        s.n_vocab = 512, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 512, s.n_ctx = 128;
        s.wtype = GGML_TYPE_Q4_K;
        m = random_model(s, &image);
    }
    batch_of_32(m);
    model_free(m);
    free(image);
}

enum { MX_NS = 8, MX_GEN = 24, MX_PL = 13 };
static int mx_plen(int i) { return MX_PL - 1 + i % 2; }          /* prompts of 12 and 13 tokens */
static int mx_start(int i, int per_step) { return i / per_step; } /* step of sequence i's prefill */

/* Sequence i (in slot (i + shift) % MX_NS) has its prompt prefilled in step i / per_step --
 * per_step prompts of different lengths packed together -- in the same step as the decode
 * tokens of the sequences started before, until each has MX_GEN tokens. */
static void run_mixed(engine *e, int32_t prompts[MX_NS][MX_PL], int shift, int per_step,
                      int32_t together[MX_NS][MX_GEN])
{
    char err[512];
    sampling_params sp;
    sampling_params_default(&sp);
    engine_seq seqs[MX_NS];
    engine_result res[MX_NS];
    int idx[MX_NS];
    for (int step = 0; step < MX_NS + MX_GEN - 1; step++) {
        int n = 0;
        for (int i = 0; i < MX_NS && mx_start(i, per_step) <= step; i++) {
            int g = step - mx_start(i, per_step), slot = (i + shift) % MX_NS; /* g: tokens so far */
            if (g >= MX_GEN) continue;
            seqs[n] = g == 0 ? (engine_seq){.slot = slot, .tokens = prompts[i], .n_tokens = mx_plen(i), .pos = 0,
                                            .want_token = true, .sp = &sp}
                             : (engine_seq){.slot = slot, .tokens = &together[i][g - 1], .n_tokens = 1,
                                            .pos = mx_plen(i) + g - 1, .want_token = true, .sp = &sp};
            idx[n++] = i;
        }
        if (n == 0) break;
        if (engine_step(e, seqs, n, res, err, sizeof err)) fail_msg("mixed step %d: %s", step, err);
        for (int k = 0; k < n; k++) together[idx[k]][step - mx_start(idx[k], per_step)] = res[k].token;
    }
}

/* Mixed steps, as a server makes them (decode rows ride through the prefill path, batches
 * of every size 1..8 with padding), on a random F32 model: first in fresh slots, then again
 * with each sequence in a slot another one has used (nothing is cleared on the GPU: stale keys
 * and history must never be read).  Each sequence must give its solo tokens up to near ties. */
static void mixed_case(tiny_spec ts)
{
    void *image;
    model *m = random_model(ts, &image);
    const int V = m->hp.n_vocab;
    char err[512];
    /* the server's default sizes: 4096-token slots (decode graphs then carry 32 key splits) */
    engine_config cfg = {.n_slots = MX_NS, .ctx_per_slot = 4096, .max_batch_tokens = 512};
    engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
    if (!e) fail_msg("%s", err);
    int32_t prompts[MX_NS][MX_PL], alone[MX_NS][MX_GEN], together[MX_NS][MX_GEN];
    float *solo_logits = malloc((size_t)MX_NS * MX_GEN * V * sizeof *solo_logits);
    uint64_t seed = 11;
    for (int i = 0; i < MX_NS; i++) {
        prompts[i][0] = 1;
        for (int j = 1; j < MX_PL; j++) prompts[i][j] = 3 + (int32_t)(gpu_test_rng(&seed) % (uint64_t)(V - 3));
        greedy(e, prompts[i], mx_plen(i), MX_GEN, alone[i], solo_logits + (size_t)i * MX_GEN * V);
    }
    static const char *const passes[3] = {"mixed-step", "mixed-step reused-slot", "mixed-step 2-prompt"};
    for (int pass = 0; pass < 3; pass++) {
        run_mixed(e, prompts, 3 * pass, pass == 2 ? 2 : 1, together);
        expect_near_ties_only(passes[pass], MX_NS, MX_GEN, &alone[0][0], &together[0][0], solo_logits, V);
    }
    engine_free(e);
    free(solo_logits);
    model_free(m);
    free(image);
}

static void test_mixed_steps_equal_alone(void **state)
{
    (void)state;
    /* shaped like `inferd mkmodel --preset tiny`: head_dim 16, so every token takes split-K */
    tiny_spec ts = tiny_spec_default();
    ts.n_vocab = 1024, ts.n_embd = 64, ts.n_head = 4, ts.n_head_kv = 2, ts.n_ff = 128, ts.n_ctx = 128;
    mixed_case(ts);
    /* head_dim 64, 4 query heads per KV head: prompts take the flash kernel, decode tokens
     * split-K, in the same steps */
    ts.n_embd = 256, ts.n_head = 4, ts.n_head_kv = 1;
    mixed_case(ts);
}

/* ---- --deterministic (issue 32): det_case in ../model/det_check.h ---- */

/* Dense: head_dim 64 and 4 query heads per KV head (a shape whose prompts would take the flash
 * kernel by default), Q4_K (mmq; 1-8 rows mmq_narrow) and F16 (matvec for every row count
 * under the flag); then Q4_K 4x as wide, whose products of 1024 and 2048 inputs split k (the
 * narrow kernel's in-block sums of 2-4 splits and its QKV epilogue against mmq_reduce's). */
static void test_deterministic_bit_identical(void **state)
{
    (void)state;
    tiny_spec s = tiny_spec_default();
    s.n_vocab = 512, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 1, s.n_ff = 512, s.n_ctx = 128;
    const ggml_type types[] = {GGML_TYPE_Q4_K, GGML_TYPE_F16, GGML_TYPE_Q4_K};
    for (int t = 0; t < 3; t++) {
        void *image;
        s.wtype = types[t];
        if (t == 2) s.n_embd = 1024, s.n_head = 16, s.n_head_kv = 4, s.n_ff = 2048;
        model *m = random_model(s, &image);
        det_case(m, ENGINE_DEVICE_CUDA);
        model_free(m);
        free(image);
    }
}

/* ---- mixture of experts (qwen3moe) ---- */

/* A router whose k-th and (k+1)-th choices nearly tie may pick another expert on the GPU (FP16
 * activations) than on the CPU: that token's logits then differ by more than rounding (its
 * top-1 still agrees, as asserted).  At most this many positions of N_POS (5 %) may. */
#define MOE_MAX_OVER (N_POS / 20)

/* ../shared/reference's file rel (NULL when absent: a SKIP line), its GPU logits checked
 * against the CPU's over N_POS tokens drawn into tokens (a MoE's router near ties allowed). */
static model *load_checked(const char *rel, uint64_t *seed, int32_t *tokens)
{
    model *m = load_shared(rel);
    if (!m) return NULL;
    random_tokens(m, seed, tokens);
    check_logits_within(m, rel, N_POS, N_PROMPT, tokens, m->hp.n_expert ? MOE_MAX_OVER : 0);
    return m;
}

/* GPU against CPU logits of each file of ../shared/reference in files[0..n) that is there
 * (N_POS random tokens from seed0 + its index; a MoE file's router near ties as for qwen3moe;
 * a LongRoPE file also in an engine past original_context_length, its long factors), then,
 * for the first n_batch of files, 32 concurrent greedy sequences as each alone.  Every file is
 * measured before the verdict; skipped when none is present. */
static void check_reference_files(const char *const *files, int n, uint64_t seed0, int n_batch)
{
    int ran = 0;
    bool ok = true;
    for (int i = 0; i < n; i++) {
        model *m = load_shared(files[i]);
        if (!m) continue;
        int32_t tokens[N_POS];
        uint64_t seed = seed0 + (uint64_t)i;
        random_tokens(m, &seed, tokens);
        const int max_over = m->hp.n_expert ? MOE_MAX_OVER : 0;
        agreement a = measure_logits(m, files[i], N_POS, N_PROMPT, tokens);
        ok &= a.top1 >= 0.99 && a.over <= max_over;
        if (m->rope_factors_long.data && m->hp.n_ctx_orig > 0) {
            char label[96];
            snprintf(label, sizeof label, "%s (long factors)", files[i]);
            a = measure_logits_ctx(m, label, N_POS, N_PROMPT, tokens, m->hp.n_ctx_orig + 8);
            ok &= a.top1 >= 0.99 && a.over <= max_over;
        }
        if (i < n_batch) batch_of_32(m);
        model_free(m);
        ran++;
    }
    if (!ran) skip();
    assert_true(ok); /* every file measured before the verdict */
}

/* Logits of a qwen3moe file of ../shared/reference (F16 and F32: 8 experts, top 2, head_dim
 * 32, experts 32 wide: every product through the entry-per-block kernels). */
static void test_moe_reference_files(void **state)
{
    (void)state;
    static const char *const files[] = {"reference/qwen3moe-f16.gguf", "reference/qwen3moe.gguf"};
    check_reference_files(files, 2, 21, 0);
}

/* The model mkmodel writes for cfg (tiny_model.c: through a temporary file), or the test fails. */
static model *mkmodel_loaded(const mkmodel_config *cfg)
{
    char err[512];
    model *m = tiny_mkmodel_load(cfg, err, sizeof err);
    if (!m) fail_msg("mkmodel: %s", err);
    return m;
}

/* A qwen3moe model made by mkmodel (as `inferd mkmodel --arch qwen3moe`) in format ft: 2 layers
 * of n_expert experts 256 wide, k per token, head_dim 64.  Block-quantised experts go through
 * the grouped mmq launches for prompts and batches and the entry-per-block kernels for one
 * token. */
static model *moe_mkmodel(mkmodel_ftype ft, int n_expert, int k)
{
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    mkmodel_set_arch(&cfg, MODEL_ARCH_QWEN3MOE);
    cfg.n_embd = 256, cfg.n_layer = 2, cfg.n_head = 4, cfg.n_head_kv = 2, cfg.n_ff = 1024, cfg.n_vocab = 512;
    cfg.n_ctx = 512, cfg.n_expert = n_expert, cfg.n_expert_used = k, cfg.n_ff_exp = 256, cfg.ftype = ft, cfg.seed = 5;
    model *m = mkmodel_loaded(&cfg);
    assert_int_equal(m->hp.n_expert, n_expert);
    return m;
}

/* Every format, 8 experts, 2 per token (the reference's shape); then every expert chosen (8
 * of 8): no choice can flip, so the experts' products (grouped and per entry) must agree with
 * the CPU as a dense model's do, every position within REL_BOUND. */
static void test_moe_mkmodel_formats(void **state)
{
    (void)state;
    static const mkmodel_ftype fts[] = {MKMODEL_Q4_K_M, MKMODEL_Q8_0, MKMODEL_Q6_K, MKMODEL_Q4_0, MKMODEL_F16};
    uint64_t seed = 31;
    for (int all = 0; all < 2; all++)
        for (size_t i = 0; i < sizeof fts / sizeof fts[0]; i++) {
            if (all && i >= 2) break; /* the two mmq shapes of Q4_K_M (Q4_K + Q6_K) and Q8_0 */
            model *m = moe_mkmodel(fts[i], 8, all ? 8 : 2);
            int32_t tokens[N_POS];
            random_tokens(m, &seed, tokens);
            char label[64];
            snprintf(label, sizeof label, "qwen3moe %s %s", mkmodel_ftype_name(fts[i]), all ? "8/8" : "2/8");
            check_logits_within(m, label, N_POS, N_PROMPT, tokens, all ? 0 : MOE_MAX_OVER);
            model_free(m);
        }
}

/* --deterministic on qwen3moe: the grouped launches for every token count. */
static void test_moe_deterministic_bit_identical(void **state)
{
    (void)state;
    model *m = moe_mkmodel(MKMODEL_Q4_K_M, 16, 4);
    det_case(m, ENGINE_DEVICE_CUDA);
    model_free(m);
}

/* Batched MoE (the grouped launches, captured in the decode graph of 32) against one sequence
 * at a time (the entry-per-block kernels): 16 experts, 4 per token, so the batch's tiles
 * cover many experts. */
static void test_moe_batch_of_32_equals_alone(void **state)
{
    (void)state;
    model *m = moe_mkmodel(MKMODEL_Q4_K_M, 16, 4);
    batch_of_32(m);
    model_free(m);
}

static void test_errors_leave_engine_usable(void **state)
{
    (void)state;
    tiny_spec s = tiny_spec_default();
    s.n_vocab = 256, s.n_embd = 64, s.n_ff = 128;
    size_t size;
    char err[512];
    void *image = tiny_model_build(&s, &size);
    model *m = tiny_model_load(image, size, err, sizeof err);
    assert_non_null(m);
    engine_config huge = {.n_slots = 1 << 20, .ctx_per_slot = 1 << 16, .max_batch_tokens = 64};
    assert_null(engine_open(ENGINE_DEVICE_CUDA, m, &huge, err, sizeof err));
    print_message("  refused: %s\n", err);
    assert_non_null(strstr(err, "not enough GPU memory"));

    engine_config cfg = {.n_slots = 2, .ctx_per_slot = 32, .max_batch_tokens = 32};
    engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
    assert_non_null(e);
    sampling_params sp;
    sampling_params_default(&sp);
    int32_t tok[2] = {1, 5};
    int32_t *ids = calloc(5000, sizeof *ids);
    float *vals = calloc(5000, sizeof *vals);
    sampling_params bad = sp;
    bad.bias_ids = ids, bad.bias_vals = vals, bad.n_bias = 5000;
    engine_seq seq = {.slot = 0, .tokens = tok, .n_tokens = 2, .pos = 0, .want_token = true, .sp = &bad};
    engine_result r1, r2;
    assert_int_equal(engine_step(e, &seq, 1, &r1, err, sizeof err), -1);
    print_message("  refused step: %s\n", err);
    seq.sp = &sp;
    assert_int_equal(engine_step(e, &seq, 1, &r1, err, sizeof err), 0);
    assert_int_equal(engine_step(e, &seq, 1, &r2, err, sizeof err), 0);
    assert_int_equal(r1.token, r2.token);
    engine_free(e);
    free(ids), free(vals);
    model_free(m);
    free(image);
}

/* ---- gpt-oss ---- */

/* A family's GPU path is tested only where its features (gpu.h's set `mask`, named `what`) are
 * in GPU_FEATURES; a build without them skips saying so. */
static bool gpu_features_enabled(arch_features mask, const char *what)
{
    if ((GPU_FEATURES & mask) == mask) return true;
    print_message("  skipped: the GPU path of %s is not enabled (gpu.h)\n", what);
    return false;
}

/* The GPU reads an F32 matrix as FP16 values (the matrix-vector and per-entry expert kernels
 * through load_chunk_h, cuBLAS through TF32, as many mantissa bits): the embeddings (gathered
 * in FP32), the router (moe_router: FP32), norms, biases and sinks are read as they are.  A
 * copy of a model with those matrices rounded likewise (rounded_model) is the model the GPU
 * computes with, here computed exactly by the CPU: what the GPU's kernels must agree with, where
 * the file itself sits on a near tie that the rounding of its weights alone decides.  For a
 * block-quantised file the same holds of its decoded values (held_row): Q4_K and Q6_K decode
 * in FP16 arithmetic (kernels/quant.cuh), the scales rounded to FP16 before they multiply. */
typedef struct rounded_model {
    model *m;
    float *bufs[128];
    int n;
} rounded_model;

/* v rounded to the nearest FP16 value (ties to even; subnormals in steps of 2^-24), from a
 * double so that an exact FP16 fma (q * d + m, both FP16) rounds once, as __hfma2 does. */
static float round_half(double v)
{
    if (v == 0.0) return 0.0f;
    int e;
    (void)frexp(v, &e);
    const double q = ldexp(1.0, e - 11 > -24 ? e - 11 : -24);
    return (float)(nearbyint(v / q) * q);
}

/* 6-bit scale and min of sub-block j of a Q4_K super-block's 12 scale bytes (ggml's). */
static void q4k_scale_min(int j, const uint8_t *q, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63, *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* A Q4_K super-block as the GPU decodes it (q4k_h_setup, q4k_h_word): per sub-block s,
 * w = fp16(q * fp16(d * sc) + fp16(-dmin * mn)), the odd sub-blocks' high nibbles read in
 * place as 16 q against d * sc / 16. */
static void held_q4_k(const uint8_t *b, float *w)
{
    const double d = quant_f16_to_f32((uint16_t)(b[0] | b[1] << 8)),
                 dmin = quant_f16_to_f32((uint16_t)(b[2] | b[3] << 8));
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        q4k_scale_min(s, b + 4, &sc, &mn);
        const bool hi = s & 1;
        const double d2 = round_half(d * sc * (hi ? 0.0625 : 1.0)), m2 = round_half(-dmin * mn);
        const uint8_t *qs = b + 16 + 32 * (s >> 1);
        for (int l = 0; l < 32; l++) w[32 * s + l] = round_half((hi ? qs[l] & 0xF0 : qs[l] & 0x0F) * d2 + m2);
    }
}

/* A Q6_K super-block as the GPU decodes it (q6k_h_setup, q6k_h_word): w = fp16((q - 32) *
 * fp16(d * scale)), in ggml's layout (two halves of 128: ql 64 bytes, qh 32, scales 8). */
static void held_q6_k(const uint8_t *b, float *w)
{
    const double d = quant_f16_to_f32((uint16_t)(b[208] | b[209] << 8));
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
        for (int l = 0; l < 32; l++) {
            const int is = l / 16,
                      q[4] = {(ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4, (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
                              (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4, (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
            for (int j = 0; j < 4; j++) w[128 * h + 32 * j + l] = round_half((q[j] - 32) * round_half(d * sc[is + 2 * j]));
        }
    }
}

/* Row `row` of t as the GPU's products read it: Q4_K and Q6_K above, the other formats
 * decoded exactly and rounded once to FP16 (load_chunk_h's generic form; F16 exactly). */
static void held_row(const model_tensor *t, size_t row, float *w)
{
    const uint8_t *src = (const uint8_t *)t->data + row * t->row_bytes;
    const int64_t n = t->ne0;
    if (t->type == GGML_TYPE_Q4_K || t->type == GGML_TYPE_Q6_K) {
        for (int64_t b = 0; b < n / 256; b++)
            (t->type == GGML_TYPE_Q4_K ? held_q4_k : held_q6_k)(src + (size_t)b * ggml_row_bytes(t->type, 256),
                                                                  w + 256 * b);
        return;
    }
    quant_dequantize_row(t->type, src, w, n);
    for (int64_t i = 0; i < n; i++) w[i] = round_half(w[i]);
}

/* t as F32 rows of the values the GPU holds (only: a matrix of another type is left as it is). */
static void hold_matrix(rounded_model *r, model_tensor *t, ggml_type only)
{
    if (!t->data || (only != GGML_TYPE_COUNT && t->type != only)) return;
    assert_true(r->n < (int)(sizeof r->bufs / sizeof r->bufs[0]));
    const size_t rows = (size_t)t->ne1 * (size_t)t->ne2, n = (size_t)t->ne0;
    float *b = malloc(rows * n * sizeof *b), *exact = malloc(n * sizeof *exact);
    assert_non_null(b);
    assert_non_null(exact);
    for (size_t i = 0; i < rows; i++) {
        held_row(t, i, b + i * n);
        /* within FP16's rounding of the row's values (a layout slip would be far off) */
        quant_dequantize_row(t->type, (const uint8_t *)t->data + i * t->row_bytes, exact, (int64_t)n);
        float big = 0.0f;
        for (size_t j = 0; j < n; j++) big = fmaxf(big, fabsf(exact[j]));
        for (size_t j = 0; j < n; j++) assert_true(fabsf(b[i * n + j] - exact[j]) <= big * 0x1p-9f);
    }
    free(exact);
    t->data = b;
    t->type = GGML_TYPE_F32;
    t->row_bytes = n * sizeof(float);
    r->bufs[r->n++] = b;
}

/* The matrices of m the GPU's products decode (not the embeddings, the routers (the shared
 * expert's gate too), the DeltaNet's conv1d and latent attention's wk_b / wv_b it reads in
 * FP32) as it holds them; only: just those of that type (GGML_TYPE_COUNT: all). */
static void hold_matrices(rounded_model *r, ggml_type only)
{
    for (int il = 0; il < r->m->hp.n_layer; il++) {
        model_layer *L = &r->m->layers[il];
        model_tensor *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wq_a, &L->wq_b, &L->wkv_a, &L->w_gate,
                                &L->w_up, &L->w_down, &L->ffn_gate_shexp, &L->ffn_up_shexp, &L->ffn_down_shexp,
                                &L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps, &L->ssm_qkv, &L->ssm_gate,
                                &L->ssm_beta, &L->ssm_alpha, &L->ssm_ba, &L->ssm_out};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) hold_matrix(r, mats[i], only);
    }
    if (r->m->output.data != r->m->tok_embd.data) hold_matrix(r, &r->m->output, only);
}

/* ../shared/reference's rel with the matrices the GPU rounds to FP16 rounded (NULL: absent). */
static rounded_model load_rounded(const char *rel)
{
    rounded_model r = {load_shared(rel), {NULL}, 0};
    if (r.m) hold_matrices(&r, GGML_TYPE_F32);
    return r;
}

static void free_rounded(rounded_model *r)
{
    for (int i = 0; i < r->n; i++) free(r->bufs[i]);
    model_free(r->m);
}

/* Logits of m on device dev over N_POS tokens as measure_logits (the caller frees them). */
static float *logits_on(const model *m, engine_device dev, const char *label, const int32_t *tokens)
{
    const int V = m->hp.n_vocab;
    char err[512];
    engine_config cfg = {.n_slots = 3, .ctx_per_slot = N_POS + 8, .max_batch_tokens = 256, .n_threads = 2};
    engine *e = engine_open(dev, m, &cfg, err, sizeof err);
    if (!e) fail_msg("%s: %s", label, err);
    float *l = malloc((size_t)N_POS * V * sizeof *l);
    assert_non_null(l);
    run_logits(e, 1, tokens, N_POS, N_PROMPT, l, V);
    engine_free(e);
    return l;
}

/* Logits la against lb (the reference), printed under label. */
static agreement compare_printed(const float *la, const float *lb, int V, const char *label)
{
    agreement g = compare_logits(la, lb, N_POS, V);
    print_message("  %-44s top-1 agreement %.2f %% (%.2f %% with near ties), max relative logit error %.2e (%d over "
                  "%.0e%s%s)\n",
                  label, 100.0 * g.top1, 100.0 * g.top1_or_tie, g.max_rel, g.over, REL_BOUND, g.where[0] ? ":" : "",
                  g.where);
    return g;
}

/* Logits of model a on device da against those of model b on db (b's the reference), over
 * N_POS tokens as measure_logits, printed. */
static agreement measure_across(const model *a, engine_device da, const model *b, engine_device db, const char *label,
                                const int32_t *tokens)
{
    float *la = logits_on(a, da, label, tokens), *lb = logits_on(b, db, label, tokens);
    agreement g = compare_printed(la, lb, a->hp.n_vocab, label);
    free(la), free(lb);
    return g;
}

/* The gpt-oss files of ../shared/reference (F32, and its experts in MXFP4: 4 layers alternating
 * a window of 8 and full attention, head_dim 16, sinks, YaRN x32, 8 experts of 64, top 2, the
 * clamped SwiGLU's limit reached), over a 200-token prompt and 88 decode steps.  The F32 file
 * sits on a router near tie that FP16 weights decide: at position 10 of these tokens layer 0's
 * 2nd and 3rd experts are 6.6e-4 apart, and the CPU itself over the FP16-rounded weights takes
 * the other expert there, whose K/V every later position of the full layers reads (H100,
 * 2026-11-26: the GPU 96.53 % top-1 against the exact CPU, the rounded CPU 97.22 %, the same
 * positions p10..p33 over the bound; each of sinks, the window, YaRN or the attention biases
 * removed moves the tie away and the GPU agrees, 100 %).  Against the CPU over the rounded
 * weights the GPU agrees 99.31 % on both files (F32: 3 of 288 over the bound, MXFP4: none;
 * MXFP4 against the exact CPU 98.96 %, the rounded CPU 99.65 %).  So the GPU is checked against the
 * CPU over the weights it holds (top-1 >= 99 %, a router's near ties as for qwen3moe), and its
 * distance from the exact CPU is printed beside the rounding's own; then 32 concurrent greedy
 * sequences of the F32 file as each alone. */
static void test_gptoss_reference_files(void **state)
{
    (void)state;
    if (!gpu_features_enabled(GPU_GPTOSS_FEATURES, "gpt-oss")) skip();
    static const char *const files[] = {"reference/gpt-oss.gguf", "reference/gpt-oss-mxfp4.gguf"};
    int ran = 0;
    bool ok = true;
    for (int i = 0; i < 2; i++) {
        model *m = load_shared(files[i]);
        if (!m) continue;
        rounded_model r = load_rounded(files[i]);
        int32_t tokens[N_POS];
        uint64_t seed = 41 + (uint64_t)i;
        random_tokens(m, &seed, tokens);
        char label[128];
        snprintf(label, sizeof label, "%s: GPU vs CPU", files[i] + 10);
        measure_across(m, ENGINE_DEVICE_CUDA, m, ENGINE_DEVICE_CPU, label, tokens);
        snprintf(label, sizeof label, "%s: CPU fp16-rounded vs CPU", files[i] + 10);
        measure_across(r.m, ENGINE_DEVICE_CPU, m, ENGINE_DEVICE_CPU, label, tokens);
        snprintf(label, sizeof label, "%s: GPU vs CPU fp16-rounded", files[i] + 10);
        agreement a = measure_across(m, ENGINE_DEVICE_CUDA, r.m, ENGINE_DEVICE_CPU, label, tokens);
        ok &= a.top1 >= 0.99 && a.over <= MOE_MAX_OVER;
        if (i == 0) batch_of_32(m);
        free_rounded(&r);
        model_free(m);
        ran++;
    }
    if (!ran) skip();
    assert_true(ok); /* every file measured before the verdict */
}

/* A gpt-oss model made by mkmodel (as `inferd mkmodel --arch gpt-oss --type mxfp4`): 2 layers
 * (a window of 128, then full), 8 query heads of 64 over 2 KV heads (flash tiles for prompts,
 * attn_decode for decode tokens), 16 experts of 256, 4 per token, in MXFP4 (the grouped mmq
 * launches for prompts and batches, the entry-per-block kernels for one token), the other
 * matrices Q8_0. */
static model *gptoss_mkmodel(void)
{
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    mkmodel_set_arch(&cfg, MODEL_ARCH_GPTOSS);
    cfg.n_embd = 256, cfg.n_layer = 2, cfg.n_head = 8, cfg.n_head_kv = 2, cfg.head_dim = 64, cfg.n_ff = 256;
    cfg.n_vocab = 512, cfg.n_ctx = 512, cfg.n_expert = 16, cfg.n_expert_used = 4, cfg.n_ff_exp = 256;
    cfg.ftype = MKMODEL_MXFP4, cfg.seed = 7;
    model *m = mkmodel_loaded(&cfg);
    assert_int_equal(m->layers[0].window, 128);
    assert_int_equal(m->layers[0].ffn_gate_exps.type, GGML_TYPE_MXFP4);
    return m;
}

/* Its logits against the CPU's over 288 positions (past the window of 128), then 32
 * concurrent greedy sequences as each alone (the grouped launches, captured in the decode
 * graph of 32, against the entry-per-block kernels).  Its logits' top two lie closer than
 * qwen3moe's more often, and its routers (top 4 of 16, softmax over the chosen) swap at near
 * ties as qwen3moe's do: on the H100 (2026-11-26) 4 of 32 sequences diverged, 3 at near ties
 * and 1 after a router swap (its logits within 7e-4 of the solo run's for 10 tokens, then 0.36
 * off in one step; qwen3moe's mkmodel file showed such jumps of 0.09-0.15 at the same rounding,
 * 3e-4, whose greedy choices held).  So up to 4 may, each either way.  A near tie here is twice
 * NEAR_TIE: the solo run's batch-1 steps carry their norms (gpu_shared.h matvec_norm), whose
 * products read fp16(x w c) where the batch's read fp16(rmsnorm(x) w), so the two round every
 * product's input at another point; on the H100 (2026-11-26, issue 25) one of 32 then diverged
 * at a top-2 gap of 1.12e-3 of its logit (2.78e-3 at 2.48), the other divergence a near tie of
 * 1e-3, while its logits against the CPU kept top-1 100 % (max relative error 3.0e-3). */
static void test_gptoss_mkmodel(void **state)
{
    (void)state;
    if (!gpu_features_enabled(GPU_GPTOSS_FEATURES, "gpt-oss")) skip();
    model *m = gptoss_mkmodel();
    int32_t tokens[N_POS];
    uint64_t seed = 51;
    random_tokens(m, &seed, tokens);
    check_logits_within(m, "gpt-oss mkmodel mxfp4", N_POS, N_PROMPT, tokens, MOE_MAX_OVER);
    batch_of_32_within(m, 2 * NEAR_TIE, 4);
    model_free(m);
}

/* The hybrid families of ../shared/reference (gated DeltaNet layers with conv windows and
 * recurrent states, gated attention with partial RoPE; the MoE ones with a shared expert):
 * GPU logits against the CPU's over a 200-token prompt (longer than a conv window and a
 * 64-token chunk) and 88 decode steps, as above (the MoE files' router near ties as for
 * qwen3moe). */
static void test_hybrid_reference_files(void **state)
{
    (void)state;
    if (!gpu_features_enabled(GPU_HYBRID_FEATURES, "the hybrids")) skip();
    static const char *files[] = {"reference/qwen3_5.gguf", "reference/qwen3_5_moe.gguf", "reference/qwen3_next.gguf"};
    check_reference_files(files, 3, 41, 0);
}

/* GPU logits of m over N_POS tokens: a prompt of n_prompt (steps of up to 256 tokens: the
 * batched products, norms launched), then one-token decode steps (the caller frees them). */
static float *gpu_logits_from(const model *m, const int32_t *tokens, int n_prompt)
{
    const int V = m->hp.n_vocab;
    char err[512];
    engine_config cfg = {.n_slots = 3, .ctx_per_slot = N_POS + 8, .max_batch_tokens = 256, .n_threads = 2};
    engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
    if (!e) fail_msg("cuda engine: %s", err);
    float *l = malloc((size_t)N_POS * V * sizeof *l);
    assert_non_null(l);
    run_logits_chunked(e, 1, tokens, N_POS, n_prompt, 256, l, V);
    engine_free(e);
    return l;
}

/* mkmodel's qwen35 (the qwen3.5-9b preset shrunk: 5 layers of 256, DeltaNet x 3, gated
 * attention with q/k norms and partial RoPE, DeltaNet; 4 v heads of state 64 over 2 k groups)
 * in formats whose batch-1 steps carry their norms through both kinds of layer
 * (gpu_forward.c gpu_norms_carried: the DeltaNet input product over the norm's input and its
 * remainder, matvec_lo_nin; norm_prep's remainder for layer 0, the down products' for layers
 * 1, 2 and 4; Wout and Wo writing the feed-forward norm's input); and qwen35moe's (the
 * qwen3.5-35b-a3b preset shrunk the same way, 32 experts of 256, 8 a token, the shared expert
 * behind its sigmoid gate: moe_router_norm's extra block makes its logit, the shared down
 * product adds it gated and writes the next layer's norm input, the last layer's through
 * shexp_add).  The 88 decode steps after a
 * 200-token prompt (carried) against the same positions as part of one prompt (the batched
 * products over launched norms, the chunked delta rule): top-1 (or a near tie) >= 95 % and no
 * position past 5e-2 (H100, 2026-11-27, these shapes, every engine's steps carrying: qwen35
 * 100 % top-1 at Q4_K_M and Q8_0, 98.86 % at F16 (100 % with near ties), max 3.4e-3 / 3.5e-3 /
 * 4.6e-3; qwen35moe 100 %, max 2.1e-2); a slip in the carried path (a wrong scale, input,
 * remainder or shared gate) puts the logits far off.  Against the CPU the GPU is checked as
 * deepseek2's files are: against the CPU over the weights it holds (hold_matrices, the
 * DeltaNet's products included), top-1 or a near tie >= 99 % and no position over the bound
 * (qwen35moe: at most MOE_MAX_OVER, a router's near ties); its distance from the exact CPU is
 * printed beside the rounding's own.  The rounding alone moves qwen35moe's logits: the exact
 * CPU against itself over the held weights gives top-1 91.32 % with 99 of 288 positions over
 * 3e-2 from prompt position 5 on, the GPU against the exact CPU the same 91.32 % (97 over, from
 * position 5), and the GPU against the held CPU 100 % (3 over, max 5.6e-2; H200, 2026-11-27;
 * qwen35 100 / 99.65 / 98.96 %, 100 % with near ties, none over).  Its 32 random experts sit on
 * router near ties that the rounding flips (13 of the exact run's 1,440 choices have their 8th
 * and 9th logits within 1e-3, 134 within 1e-2): the held CPU with the exact run's experts
 * pinned agrees 97.22 % (98.96 % with near ties, 1 over), and with every expert chosen (32 of
 * 32) 98.96 % (100 %, none over) (docs/benchmarks.md, "qwen35moe's GPU against the CPU: router
 * near ties"). */
static void test_hybrid_mkmodel_carried(void **state)
{
    (void)state;
    if (!gpu_features_enabled(GPU_HYBRID_FEATURES, "the hybrids")) skip();
    static const struct {
        const char *preset, *name;
        mkmodel_ftype type;
    } cases[] = {{"qwen3.5-9b", "qwen35", MKMODEL_Q4_K_M},
                 {"qwen3.5-9b", "qwen35", MKMODEL_Q8_0},
                 {"qwen3.5-9b", "qwen35", MKMODEL_F16},
                 {"qwen3.5-35b-a3b", "qwen35moe", MKMODEL_Q4_K_M}};
    uint64_t seed = 61;
    bool ok = true;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mkmodel_config cfg;
        assert_true(mkmodel_preset(cases[i].preset, &cfg));
        /* every product's rows whole 256-input blocks (Wo's and Wout's too: 4 heads of 64, 4 v
         * heads of 64), so that Q4_K_M keeps its K-quants (a 128-wide row falls back to Q5_0,
         * which has no carried kernels: such a file's steps launch their norms) */
        cfg.n_embd = 256, cfg.n_layer = 5, cfg.n_head = 4, cfg.n_head_kv = 1, cfg.head_dim = 64, cfg.n_rot = 16;
        cfg.n_vocab = 512, cfg.n_ctx = 512, cfg.n_ff = 512;
        cfg.ssm_state = 64, cfg.ssm_groups = 2, cfg.ssm_vheads = 4, cfg.ssm_inner = 256;
        if (cfg.n_expert) cfg.n_expert = 32, cfg.n_expert_used = 8, cfg.n_ff_exp = 256;
        cfg.ftype = cases[i].type;
        model *m = mkmodel_loaded(&cfg);
        rounded_model held = {mkmodel_loaded(&cfg), {NULL}, 0};
        hold_matrices(&held, GGML_TYPE_COUNT);
        const int V = m->hp.n_vocab;
        int32_t tokens[N_POS];
        random_tokens(m, &seed, tokens);
        float *dec = gpu_logits_from(m, tokens, N_PROMPT), *all = gpu_logits_from(m, tokens, N_POS);
        const size_t at = (size_t)N_PROMPT * V;
        agreement a = compare_logits(dec + at, all + at, N_POS - N_PROMPT, V);
        print_message("  %s %-7s decode steps (from position %d) vs the same positions prompted: top-1 %.2f %% (%.2f %% with near "
                      "ties), max relative logit error %.2e%s%s\n",
                      cases[i].name, mkmodel_ftype_name(cfg.ftype), N_PROMPT, 100.0 * a.top1, 100.0 * a.top1_or_tie,
                      a.max_rel, a.where[0] ? ":" : "", a.where);
        ok &= a.top1_or_tie >= 0.95 && a.max_rel < 5e-2;
        /* dec: the GPU's logits as logits_on gives them (one prompt step of N_PROMPT, then decode) */
        float *cpu = logits_on(m, ENGINE_DEVICE_CPU, cases[i].name, tokens),
              *cpu_held = logits_on(held.m, ENGINE_DEVICE_CPU, cases[i].name, tokens);
        char label[64];
        snprintf(label, sizeof label, "%s %s: GPU vs CPU", cases[i].name, mkmodel_ftype_name(cfg.ftype));
        compare_printed(dec, cpu, V, label);
        snprintf(label, sizeof label, "%s %s: CPU held vs CPU", cases[i].name, mkmodel_ftype_name(cfg.ftype));
        compare_printed(cpu_held, cpu, V, label);
        snprintf(label, sizeof label, "%s %s: GPU vs CPU held", cases[i].name, mkmodel_ftype_name(cfg.ftype));
        agreement h = compare_printed(dec, cpu_held, V, label);
        ok &= h.top1_or_tie >= 0.99 && h.over <= (m->hp.n_expert ? MOE_MAX_OVER : 0);
        free(dec), free(all), free(cpu), free(cpu_held);
        free_rounded(&held);
        model_free(m);
    }
    assert_true(ok); /* every format measured before the verdict */
}

/* --deterministic on the families with their own GPU paths (../shared/reference's): Gemma 4
 * (per-layer shapes and K/V regions, shared K/V, V norm, per-layer embeddings, GeGLU experts
 * beside the dense GLU), as det_case checks the dense models (H100: 0 of 32 sequences differ,
 * together and in chunks of 5 and 1, both files). */
static void test_reference_deterministic_bit_identical(void **state)
{
    (void)state;
    /* the hybrids too: every run starts its sequences at position 0, which starts their state
     * slots afresh (the DeltaNet's exact recurrence under the flag, chunked prompts included) */
    static const char *files[] = {"reference/gemma4.gguf", "reference/gemma4_moe.gguf", "reference/qwen3_5.gguf",
                                  "reference/qwen3_5_moe.gguf", "reference/qwen3_next.gguf"};
    int ran = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        model *m = load_shared(files[i]);
        if (!m) continue;
        print_message("  %s\n", files[i]);
        det_case(m, ENGINE_DEVICE_CUDA);
        model_free(m);
        ran++;
    }
    if (!ran) skip();
}

/* One step of seq on e (a block table and a state slot), its last logits into out. */
static void step_logits(engine *e, engine_seq s, float *out)
{
    char err[512];
    s.logits = out;
    if (engine_step(e, &s, 1, NULL, err, sizeof err)) fail_msg("step at %d: %s", s.pos, err);
}

/* A hybrid's recurrent state on the GPU: a prompt fed in pieces (39 + 1 + 96 + 64 tokens: a
 * decode-shaped piece among them) ends with the logits of one whole step, and a snapshot of
 * the state after 96 tokens (engine_state_copy), resumed by another sequence over the same
 * prefix blocks, gives the first sequence's logits bit for bit. */
static void test_hybrid_state_pieces_and_snapshot(void **state)
{
    (void)state;
    if (!gpu_features_enabled(GPU_HYBRID_FEATURES, "the hybrids")) skip();
    model *m = load_shared("reference/qwen3_5.gguf");
    if (!m) skip();
    const int V = m->hp.n_vocab, N = 200;
    int32_t tokens[200];
    uint64_t seed = 77;
    for (int t = 0; t < N; t++) tokens[t] = (int32_t)(gpu_test_rng(&seed) % (uint64_t)V);
    char err[512];
    engine_config cfg = {.n_slots = 2, .ctx_per_slot = 256, .max_batch_tokens = 256, .kv_cache_mb = 64, .n_states = 4};
    engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
    if (!e) fail_msg("cuda engine: %s", err);
    assert_int_equal(engine_state_slots(e), 4);
    assert_true(engine_state_bytes(e) > 0);
    assert_false(engine_can_rewind_state(e)); /* not checked on a device yet: serve refuses to speculate */
    float *whole = malloc((size_t)V * sizeof *whole), *pieces = malloc((size_t)V * sizeof *pieces);
    float *resumed = malloc((size_t)V * sizeof *resumed);
    const int32_t blocks_a[8] = {0, 1, 2, 3, 4, 5, 6, 7}, blocks_b[8] = {0, 1, 2, 13, 14, 15, 16, 17};
    step_logits(e, (engine_seq){.slot = 0, .tokens = tokens, .n_tokens = N, .blocks = blocks_a, .state = 0}, whole);
    static const int cut[] = {0, 39, 40, 136, 200};
    for (int c = 0; c < 4; c++) {
        engine_seq s = {.slot = 0, .tokens = tokens + cut[c], .n_tokens = cut[c + 1] - cut[c], .pos = cut[c],
                        .blocks = blocks_a, .state = 2};
        step_logits(e, s, pieces);
    }
    double rel = gpu_test_rel_err(pieces, whole, (size_t)V);
    print_message("  qwen35 prompt in 4 pieces vs one step: rel err %.2e, top-1 %d vs %d\n", rel, argmax(pieces, V),
                  argmax(whole, V));
    assert_int_equal(argmax(pieces, V), argmax(whole, V));
    assert_true(rel < 1e-3);
    /* snapshot after 96 tokens of sequence A (state 0), A goes on; B resumes the snapshot */
    step_logits(e, (engine_seq){.slot = 0, .tokens = tokens, .n_tokens = 96, .blocks = blocks_a, .state = 0}, whole);
    if (engine_state_copy(e, 3, 0, err, sizeof err)) fail_msg("state copy: %s", err);
    step_logits(e, (engine_seq){.slot = 0, .tokens = tokens + 96, .n_tokens = N - 96, .pos = 96, .blocks = blocks_a,
                                .state = 0}, whole);
    step_logits(e, (engine_seq){.slot = 1, .tokens = tokens + 96, .n_tokens = N - 96, .pos = 96, .blocks = blocks_b,
                                .state = 3, .history = tokens}, resumed);
    assert_memory_equal(whole, resumed, (size_t)V * sizeof *whole);
    /* a state slot cannot rewind: a step from a position other than its end is refused */
    engine_seq bad = {.slot = 1, .tokens = tokens, .n_tokens = 1, .pos = 50, .blocks = blocks_b, .state = 3,
                      .history = tokens};
    assert_int_equal(engine_step(e, &bad, 1, NULL, err, sizeof err), ENGINE_EINVAL);
    print_message("  refused: %s\n", err);
    free(whole);
    free(pieces);
    free(resumed);
    engine_free(e);
    model_free(m);
}

/* Every weight type the loader accepts (ggml_type_supported) has GPU kernels: the CUDA engine's
 * check_matrix_type refusal ("type X has no GPU kernels ... use --device cpu", with --device
 * auto falling back to the CPU) is for a format added to the CPU before its kernels, and none
 * is today.  Checked without a GPU, so CI holds the two lists together; gpu-check's kernel
 * tests then compare each format's kernels with the CPU's decoding on the device. */
static void test_every_cpu_format_has_kernels(void **state)
{
    (void)state;
#define GPU_TYPE(TYPE, suffix) GGML_TYPE_##TYPE,
    static const ggml_type gpu_types[] = {GPU_WEIGHT_TYPES(GPU_TYPE)};
#undef GPU_TYPE
    int n = 0;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        if (!ggml_type_supported((ggml_type)t)) continue;
        bool has = false;
        for (size_t i = 0; i < sizeof gpu_types / sizeof gpu_types[0]; i++) has |= gpu_types[i] == (ggml_type)t;
        if (!has) fail_msg("type %s: the CPU reads it, the GPU has no kernels", ggml_type_name((ggml_type)t));
        n++;
    }
    assert_true(n >= 23); /* F32 F16 BF16, the legacy and K quants, every IQ type, MXFP4 */
}

/* jina-bert-v2 (ALiBi, which no GPU kernel adds) is refused by the CUDA engine naming the
 * feature, before any GPU is touched, so --device auto runs it on the CPU. */
static void test_alibi_refused(void **state)
{
    (void)state;
    tiny_spec s = tiny_spec_default();
    s.arch = "jina-bert-v2";
    s.n_head_kv = s.n_head;
    size_t size;
    char err[512] = "";
    void *image = tiny_model_build(&s, &size);
    model *m = image ? tiny_model_load(image, size, err, sizeof err) : NULL;
    if (!m) fail_msg("jina-bert-v2: %s", err);
    engine_config cfg = {.n_slots = 1, .ctx_per_slot = 64, .max_batch_tokens = 64};
    engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
    assert_null(e);
    print_message("  refused: %s\n", err);
    assert_non_null(strstr(err, "ALiBi"));
    model_free(m);
    free(image);
}

/* ---- tensor parallelism (gpu/gpu_tp.c) ---------------------------------------------------- */

/* A dense mkmodel model of arch in format ft that splits over 2 GPUs on whole blocks: 8 heads of
 * 64 (Wo's 256 inputs a GPU), 4 KV heads, an FFN of 1536 (768 a GPU: three 256-input blocks). */
static model *tp_mkmodel(model_arch arch, mkmodel_ftype ft)
{
    mkmodel_config cfg;
    assert_true(mkmodel_preset("tiny", &cfg));
    mkmodel_set_arch(&cfg, arch);
    cfg.n_embd = 512, cfg.n_layer = 4, cfg.n_head = 8, cfg.n_head_kv = 4, cfg.head_dim = 64, cfg.n_ff = 1536;
    cfg.n_vocab = 512, cfg.n_ctx = 512, cfg.ftype = ft, cfg.seed = 11;
    return mkmodel_loaded(&cfg);
}

/* A TP=1 or TP=2 engine of n_slots rows of ctx tokens, its KV pool kv_mb (small: both engines
 * live at once); a step of up to every row's whole prompt (greedy feeds a prompt in one step,
 * tp_case's batched run all n_slots prompts in one) */
static engine *tp_engine(const model *m, int n_gpus, int n_slots, int ctx, size_t kv_mb)
{
    char err[512];
    engine_config cfg = {.n_slots = n_slots, .ctx_per_slot = ctx, .max_batch_tokens = n_slots * ctx,
                         .kv_cache_mb = kv_mb, .tensor_parallel = n_gpus};
    engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
    if (!e) fail_msg("tensor parallelism over %d GPUs: %s", n_gpus, err);
    return e;
}

/* Greedy tokens of TP=2 against TP=1 (the same GPU engine on one GPU): each sequence alone on
 * the split engine (a prompt step, then the batch-1 decode graph), and all of
 * them decoded together (the batch-8 graph).  The split sums each product in two halves and then
 * across the GPUs, so the logits agree to rounding (every sequence's first within REL_BOUND) and
 * a token may only differ at a near tie of the single-GPU run.  Prompts of PL tokens. */
enum { TP_NS = 8, TP_GEN = 24, TP_MAX_PL = 640 };
static void tp_case(model *m, const char *label, int PL, size_t kv_mb)
{
    enum { NS = TP_NS, GEN = TP_GEN };
    const int V = m->hp.n_vocab, ctx = PL + GEN < 128 ? 128 : (PL + GEN + 31) / 32 * 32;
    char err[512];
    engine *one = tp_engine(m, 1, NS, ctx, kv_mb), *two = tp_engine(m, 2, NS, ctx, kv_mb);
    static int32_t prompts[NS][TP_MAX_PL];
    int32_t alone[NS][GEN], split_alone[NS][GEN], together[NS][GEN];
    assert_true(PL <= TP_MAX_PL);
    float *logits = malloc((size_t)NS * GEN * V * sizeof *logits), *split_logits = malloc((size_t)GEN * V * sizeof *split_logits);
    uint64_t seed = 7;
    double worst = 0;
    for (int i = 0; i < NS; i++) {
        prompts[i][0] = 1;
        for (int j = 1; j < PL; j++) prompts[i][j] = 3 + (int32_t)(gpu_test_rng(&seed) % (uint64_t)(V - 3));
        greedy(one, prompts[i], PL, GEN, alone[i], logits + (size_t)i * GEN * V);
        greedy(two, prompts[i], PL, GEN, split_alone[i], split_logits);
        double e = gpu_test_rel_err(split_logits, logits + (size_t)i * GEN * V, (size_t)V);
        if (e > worst) worst = e;
    }
    print_message("  %s: TP=2 first-token logits within %.2e (relative) of TP=1\n", label, worst);
    assert_true(worst <= REL_BOUND);
    sampling_params sp;
    sampling_params_default(&sp);
    engine_seq seqs[NS];
    engine_result res[NS];
    for (int i = 0; i < NS; i++)
        seqs[i] = (engine_seq){.slot = i, .tokens = prompts[i], .n_tokens = PL, .want_token = true, .sp = &sp};
    for (int g = 0; g < GEN; g++) {
        if (engine_step(two, seqs, NS, res, err, sizeof err)) fail_msg("%s TP=2 step %d: %s", label, g, err);
        for (int i = 0; i < NS; i++) {
            together[i][g] = res[i].token;
            seqs[i] = (engine_seq){.slot = i, .tokens = &together[i][g], .n_tokens = 1, .pos = PL + g,
                                   .want_token = true, .sp = &sp};
        }
    }
    char what[96];
    snprintf(what, sizeof what, "%s TP=2 alone", label);
    const run_pair ra = {what, NS, GEN, V, &alone[0][0], &split_alone[0][0], logits, NULL};
    expect_near_ties_within(&ra, NEAR_TIE, 2);
    snprintf(what, sizeof what, "%s TP=2 batch of %d", label, NS);
    const run_pair rb = {what, NS, GEN, V, &alone[0][0], &together[0][0], logits, NULL};
    expect_near_ties_within(&rb, NEAR_TIE, 2);
    engine_free(one);
    engine_free(two);
    free(logits);
    free(split_logits);
}

static bool two_gpus(void)
{
    char err[256];
    int n = engine_cuda_device_count(err, sizeof err);
    if (n < 2) print_message("  %d GPU(s): the tensor-parallel run needs 2\n", n);
    return n >= 2;
}

/* llama, qwen2 (q/k/v biases, tied head), qwen3 (q/k norms) in Q4_K_M (Q4_K and Q6_K rows),
 * Q8_0 and F16: TP=2 decodes as TP=1 does. */
static void test_tp2_equals_tp1(void **state)
{
    (void)state;
    if (!two_gpus()) skip();
    static const model_arch archs[] = {MODEL_ARCH_LLAMA, MODEL_ARCH_QWEN2, MODEL_ARCH_QWEN3};
    static const mkmodel_ftype fts[] = {MKMODEL_Q4_K_M, MKMODEL_Q8_0, MKMODEL_F16};
    for (size_t a = 0; a < 3; a++)
        for (size_t f = 0; f < 3; f++) {
            model *m = tp_mkmodel(archs[a], fts[f]);
            char label[64];
            snprintf(label, sizeof label, "%s %s", m->desc->name, mkmodel_ftype_name(fts[f]));
            tp_case(m, label, 11, 64);
            model_free(m);
        }
}

/* The same on a file named by INFERD_TEST_TP_MODEL (gpu-check tp: the Llama-3.1-8B Q4_K_M shape
 * from mkmodel), with prompts of 600 tokens (all-reduces of 600 rows in the prompt step) and 11;
 * skipped without it. */
static void test_tp_file(void **state)
{
    (void)state;
    const char *path = getenv("INFERD_TEST_TP_MODEL");
    if (!path || !*path) {
        print_message("  INFERD_TEST_TP_MODEL unset: no file to split\n");
        skip();
    }
    if (!two_gpus()) skip();
    char err[512];
    model *m = model_load(path, err, sizeof err);
    if (!m) fail_msg("%s: %s", path, err);
    char label[300];
    snprintf(label, sizeof label, "%s (600-token prompts)", path);
    tp_case(m, label, 600, 1024);
    snprintf(label, sizeof label, "%s (11-token prompts)", path);
    tp_case(m, label, 11, 1024);
    model_free(m);
}

/* What tensor parallelism does not split is refused by name before any GPU is used (a MoE
 * model; heads that N does not divide, with the N that do), and N GPUs more than CUDA finds. */
static void test_tp_refusals(void **state)
{
    (void)state;
    char err[512] = "";
    engine_config cfg = {.n_slots = 2, .ctx_per_slot = 64, .max_batch_tokens = 64, .tensor_parallel = 2};
    model *moe = moe_mkmodel(MKMODEL_Q8_0, 8, 2); /* checked before any GPU: runs without one */
    assert_null(engine_open(ENGINE_DEVICE_CUDA, moe, &cfg, err, sizeof err));
    print_message("  qwen3moe: %s\n", err);
    assert_non_null(strstr(err, "tensor parallelism does not split"));
    model_free(moe);
    model *m = tp_mkmodel(MODEL_ARCH_LLAMA, MKMODEL_Q8_0);
    cfg.tensor_parallel = 3;
    assert_null(engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err));
    print_message("  3 GPUs: %s\n", err);
    assert_non_null(strstr(err, "GPU counts that do: 1, 2, 4, 8"));
    cfg.tensor_parallel = 4; /* a valid split (2 heads, 1 KV head a GPU) */
    if (engine_cuda_device_count(err, sizeof err) < 4) {
        assert_null(engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err));
        print_message("  4 GPUs: %s\n", err);
        assert_true(strstr(err, "CUDA finds") || strstr(err, "no CUDA driver"));
    }
    model_free(m);
}

/* Embeddings (engine_seq.embed): four sequences of different lengths in one step, each pooling
 * on both engines; the GPU's pooled vectors within cosine 0.9999 of the CPU's, the rank score
 * (a sigmoid of a logit difference) within 1e-2.  The GPU's hidden states are the FP32 output
 * norm of its residual stream: the same math as the CPU's, through FP16 matmul inputs. */
static double cosine(const float *a, const float *b, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

static void run_embeddings(engine *e, const int32_t *tokens, const int *lens, const engine_pooling *pool, int ns,
                           float *out, size_t stride)
{
    engine_seq seqs[4];
    engine_embed em[4];
    char err[512];
    for (int i = 0, at = 0; i < ns; at += lens[i], i++) {
        em[i] = (engine_embed){.pooling = pool[i], .normalize = pool[i] != ENGINE_POOL_NONE, .rank_ids = {3, 5},
                               .out = out + (size_t)i * stride};
        seqs[i] = (engine_seq){.slot = i, .tokens = tokens + at, .n_tokens = lens[i], .embed = &em[i]};
    }
    if (engine_step(e, seqs, ns, NULL, err, sizeof err)) fail_msg("%s embeddings: %s", engine_name(e), err);
}

static void test_embeddings_match_cpu(void **state)
{
    (void)state;
    tiny_spec s = tiny_spec_default();
    s.arch = "qwen3";
    s.n_vocab = 512, s.n_embd = 256, s.n_layer = 2, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 512, s.n_ctx = 512;
    s.wtype = GGML_TYPE_Q8_0;
    void *image;
    model *m = random_model(s, &image);
    engine_config cfg = {.n_slots = 4, .ctx_per_slot = 256, .max_batch_tokens = 512};
    pair p = make_pair(m, &cfg);
    const int lens[4] = {1, 17, 130, 64};
    const engine_pooling pool[4] = {ENGINE_POOL_LAST, ENGINE_POOL_MEAN, ENGINE_POOL_NONE, ENGINE_POOL_RANK};
    int32_t tokens[212];
    uint64_t seed = 7;
    for (int i = 0; i < 212; i++) tokens[i] = (int32_t)(gpu_test_rng(&seed) % (uint64_t)s.n_vocab);
    const size_t stride = (size_t)130 * s.n_embd;
    float *cpu = calloc(4 * stride, sizeof *cpu), *gpu = calloc(4 * stride, sizeof *gpu);
    assert_non_null(cpu);
    assert_non_null(gpu);
    run_embeddings(p.cpu, tokens, lens, pool, 4, cpu, stride);
    run_embeddings(p.gpu, tokens, lens, pool, 4, gpu, stride);
    for (int i = 0; i < 3; i++) {
        size_t rows = pool[i] == ENGINE_POOL_NONE ? (size_t)lens[i] : 1;
        for (size_t r = 0; r < rows; r++) {
            double c = cosine(gpu + i * stride + r * s.n_embd, cpu + i * stride + r * s.n_embd, (size_t)s.n_embd);
            if (!(c >= 0.9999)) fail_msg("seq %d (%s) row %zu: cosine %.6f < 0.9999", i, engine_pooling_name(pool[i]), r, c);
        }
    }
    float d = fabsf(gpu[3 * stride] - cpu[3 * stride]);
    if (!(d <= 1e-2f)) fail_msg("rank score: gpu %g cpu %g", (double)gpu[3 * stride], (double)cpu[3 * stride]);
    free(cpu);
    free(gpu);
    free_pair(&p);
    model_free(m);
    free(image);
}

/* An encoder (BERT: absolute positions, token types, post-LN, bidirectional attention, an
 * erf-GELU MLP) on both engines, ns sequences of lens[] random tokens side by side in one step,
 * each pooled as pool[]: the GPU's vectors (every row with pooling none) within cosine 0.9999
 * of the CPU's.  A one-token sequence rides along (its attention is its own key alone). */
static void encoder_matches_cpu(const model *m, const int *lens, const engine_pooling *pool, int ns, int ctx)
{
    const int d = m->hp.n_embd;
    int total = 0, longest = 0;
    for (int i = 0; i < ns; i++) total += lens[i], longest = lens[i] > longest ? lens[i] : longest;
    engine_config cfg = {.n_slots = 4, .ctx_per_slot = ctx, .max_batch_tokens = total};
    pair p = make_pair(m, &cfg);
    int32_t *tokens = malloc((size_t)total * sizeof *tokens);
    assert_non_null(tokens);
    uint64_t seed = 11;
    for (int i = 0; i < total; i++) tokens[i] = (int32_t)(gpu_test_rng(&seed) % (uint64_t)m->hp.n_vocab);
    const size_t stride = (size_t)longest * d;
    float *cpu = calloc((size_t)ns * stride, sizeof *cpu), *gpu = calloc((size_t)ns * stride, sizeof *gpu);
    assert_non_null(cpu);
    assert_non_null(gpu);
    run_embeddings(p.cpu, tokens, lens, pool, ns, cpu, stride);
    run_embeddings(p.gpu, tokens, lens, pool, ns, gpu, stride);
    double worst = 1;
    for (int i = 0; i < ns; i++) {
        size_t rows = pool[i] == ENGINE_POOL_NONE ? (size_t)lens[i] : 1;
        for (size_t r = 0; r < rows; r++) {
            double c = cosine(gpu + i * stride + r * d, cpu + i * stride + r * d, (size_t)d);
            if (!(c >= 0.9999)) fail_msg("seq %d (%s) row %zu: cosine %.6f < 0.9999", i, engine_pooling_name(pool[i]), r, c);
            worst = fmin(worst, c);
        }
    }
    print_message("  %s (%d x %d layers): GPU vs CPU cosine >= %.6f\n", m->desc->name, d, m->hp.n_layer, worst);
    free(cpu);
    free(gpu);
    free(tokens);
    free_pair(&p);
}

/* ../shared/reference/bert.gguf (whose CPU embeddings match transformers within 3e-7:
 * tests/cpu/test_arch_reference.c), on the GPU. */
static void test_bert_matches_cpu(void **state)
{
    (void)state;
    const char *env = getenv("INFERD_SHARED_DIR");
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/reference/bert.gguf", env && *env ? env : INFERD_SHARED_DIR);
    model *m = model_load(path, err, sizeof err);
    if (!m) {
        print_message("skipping: %s\n", err); /* ../shared absent */
        skip();
    }
    const int lens[4] = {1, 9, 40, 120};
    const engine_pooling pool[4] = {ENGINE_POOL_MEAN, ENGINE_POOL_NONE, ENGINE_POOL_CLS, ENGINE_POOL_MEAN};
    encoder_matches_cpu(m, lens, pool, 4, 128);
    model_free(m);
}

/* A bge-small-shaped BERT (384 wide, 12 heads of 32, FFN 1536; 4 layers of its 12), random
 * weights in Q8_0 (prompt products through mmq, with their biases) and F16 (cuBLAS). */
static void test_bge_small_shape_matches_cpu(void **state)
{
    (void)state;
    const ggml_type types[2] = {GGML_TYPE_Q8_0, GGML_TYPE_F16};
    for (int k = 0; k < 2; k++) {
        tiny_spec s = tiny_spec_default();
        s.arch = "bert";
        s.n_vocab = 512, s.n_embd = 384, s.n_layer = 4, s.n_head = 12, s.n_head_kv = 12, s.n_ff = 1536, s.n_ctx = 512;
        s.wtype = types[k];
        void *image;
        model *m = random_model(s, &image);
        const int lens[4] = {1, 33, 128, 200};
        const engine_pooling pool[4] = {ENGINE_POOL_MEAN, ENGINE_POOL_MEAN, ENGINE_POOL_NONE, ENGINE_POOL_CLS};
        encoder_matches_cpu(m, lens, pool, 4, 512);
        model_free(m);
        free(image);
    }
}

/* nomic-bert (nomic-embed-text: rotary positions in a bidirectional encoder, one fused attn_qkv,
 * a SwiGLU, post-LN with bias; the CPU engine's is checked against a float64 forward pass in
 * tests/cpu/test_nomic_bert.c): a small one (256 wide, heads of 64: flash tiles) in F32 and
 * Q8_0, and the nomic-embed-text-v1.5 shape (768 wide, 12 heads of 64, FFN 3072, all 12 layers)
 * in Q8_0 (mmq, the fused SwiGLU) and F16 (cuBLAS and the swiglu kernel), each GPU vector within
 * cosine 0.9999 of the CPU's. */
static void test_nomic_bert_matches_cpu(void **state)
{
    (void)state;
    static const struct {
        int n_embd, n_layer, n_head, n_ff;
        ggml_type type;
    } shapes[] = {
        {256, 2, 4, 512, GGML_TYPE_F32}, {256, 2, 4, 512, GGML_TYPE_Q8_0},
        {768, 12, 12, 3072, GGML_TYPE_Q8_0}, {768, 12, 12, 3072, GGML_TYPE_F16},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        tiny_spec s = tiny_spec_default();
        s.arch = "nomic-bert";
        s.n_vocab = 512, s.n_embd = shapes[k].n_embd, s.n_layer = shapes[k].n_layer, s.n_head = shapes[k].n_head;
        s.n_head_kv = s.n_head, s.n_ff = shapes[k].n_ff, s.n_ctx = 2048, s.wtype = shapes[k].type;
        s.seed = 300 + k;
        void *image;
        model *m = random_model(s, &image);
        assert_int_equal(m->hp.arch, MODEL_ARCH_NOMIC_BERT);
        const int lens[4] = {1, 33, 128, 200};
        const engine_pooling pool[4] = {ENGINE_POOL_MEAN, ENGINE_POOL_NONE, ENGINE_POOL_CLS, ENGINE_POOL_MEAN};
        print_message("  %s:\n", ggml_type_name(s.wtype));
        encoder_matches_cpu(m, lens, pool, 4, 512);
        model_free(m);
        free(image);
    }
}

/* ---- gemma4 ---- */

/* Decode one token at pos 40 of a 40-token prompt read through `blocks` (and `blocks_swa`, with
 * a sliding pool): its logits. */
static void decode_through(engine *e, const int32_t *blocks, const int32_t *blocks_swa, const int32_t *tokens,
                           float *logits)
{
    char err[512];
    engine_seq s = {.slot = 0, .tokens = tokens + 40, .n_tokens = 1, .pos = 40, .blocks = blocks,
                    .blocks_swa = blocks_swa, .history = tokens, .logits = logits};
    if (engine_step(e, &s, 1, NULL, err, sizeof err)) fail_msg("decode through blocks: %s", err);
}

/* gemma3 at widths that take the wide one-row products (gpu_forward.c matvec_wide_split): 16
 * query heads and 8 KV heads of 256 over n_embd 4,096, so every decode step's QKV launch is
 * 8,192 rows of k 4,096, matvec_wide4_q4_k in Q4_K and matvec_wide2_q6_k in Q6_K (the other
 * products stay on the one-row layout: 4,096 rows and fewer).  GPU logits against the CPU's. */
static void test_logits_gemma3_wide(void **state)
{
    (void)state;
    static const ggml_type types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    uint64_t seed = 17;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        tiny_spec s = tiny_spec_default();
        s.arch = "gemma3";
        s.n_vocab = 512, s.n_embd = 4096, s.n_layer = 2, s.n_head = 16, s.n_head_kv = 8, s.head_dim = 256;
        s.n_ff = 512, s.n_ctx = 512, s.n_swa = 48, s.post_norms = true, s.tied = true, s.wtype = types[t];
        s.seed = 400 + t;
        void *image;
        model *m = random_model(s, &image);
        int32_t tokens[N_POS];
        for (int i = 0; i < N_POS; i++) tokens[i] = (int32_t)(gpu_test_rng(&seed) % (uint64_t)s.n_vocab);
        char label[64];
        snprintf(label, sizeof label, "gemma3 %s QKV 8192 x 4096", ggml_type_name(types[t]));
        check_model_logits(m, label, N_POS, N_PROMPT, tokens);
        model_free(m);
        free(image);
    }
}

/* A synthetic gemma4 (tiny_model) whose shapes take the fast kernels: sliding layers head_dim
 * 64 with 2 kv heads, full ones 128 with 1 (flash tiles of 16 tokens for both, the tensor-core
 * decode with each layer's own head_dim), window 48 crossed by the 200-token prompt and the
 * decode, per-layer embeddings 32 wide, the last 3 of 6 layers reading earlier K/V with FFNs
 * twice as wide; in F32, F16 and the block formats of 32 (Q8_0, Q4_0: mmq where rows are 256
 * wide).  GPU logits against the CPU's, and 32 concurrent sequences as each alone (Q8_0).  Its
 * tied head puts many logits near the soft-cap (as the synthetic gemma3's): a check of the
 * kernels' paths and shapes; the reference files above are the sharper check of the math. */
static void test_logits_gemma4_synthetic(void **state)
{
    (void)state;
    /* the last: Gemma 4 31B's head dims (sliding 256, full 512 with 8 query heads a KV head:
     * flash_attn_hd512, 32-token tiles for both kinds of layer) in F16 */
    static const ggml_type types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_F16};
    const size_t n_types = sizeof types / sizeof types[0];
    uint64_t seed = 15;
    for (size_t t = 0; t < n_types; t++) {
        const bool wide = t == n_types - 1;
        tiny_spec s = tiny_spec_default();
        s.arch = "gemma4";
        s.n_vocab = 512, s.n_embd = 256, s.n_layer = 6, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 512, s.n_ctx = 512;
        s.n_swa = 48, s.g4_head_dim_full = 128, s.g4_n_kv_full = 1, s.g4_ple = 32, s.g4_kv_shared = 3;
        if (wide) s.n_head = 8, s.n_head_kv = 4, s.head_dim = 256, s.g4_head_dim_full = 512;
        s.tied = true, s.wtype = types[t], s.seed = 300 + t;
        void *image;
        model *m = random_model(s, &image);
        int32_t tokens[N_POS];
        for (int i = 0; i < N_POS; i++) tokens[i] = (int32_t)(gpu_test_rng(&seed) % (uint64_t)s.n_vocab);
        char label[64];
        snprintf(label, sizeof label, "gemma4 %s%s", ggml_type_name(types[t]), wide ? " head_dim 256/512" : "");
        check_model_logits(m, label, N_POS, N_PROMPT, tokens);
        if (types[t] == GGML_TYPE_Q8_0) batch_of_32(m);
        model_free(m);
        free(image);
    }
}

/* The reference gemma4 files of ../shared/reference (F32; head_dim 16 on sliding and 32 on full
 * layers: split-K everywhere; the dense file's last 3 layers read earlier layers' K/V, the MoE
 * file's full layers have 1 kv head and V from the K projection): GPU logits against the CPU's
 * over 288 random tokens (a window of 8 crossed all along), 32 concurrent greedy sequences as
 * each alone, and a prompt's blocks copied (engine_kv_copy) then read in place of the originals
 * give the same logits bit for bit. */
static void test_logits_gemma4(void **state)
{
    (void)state;
    static const char *files[] = {"reference/gemma4.gguf", "reference/gemma4_moe.gguf"};
    uint64_t seed = 14;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        int32_t tokens[N_POS];
        model *m = load_checked(files[i], &seed, tokens);
        if (!m) continue;
        /* The gemma4 reference's GPU logits sit 5x farther from the CPU's than the other
         * families' (max relative error 1.8e-2 against 1e-3..3.4e-3 on the H100, top-1 100 %):
         * alone (F32 matvec) and batched (FP16 weight copies) disagree by as much, and 32
         * concurrent sequences diverged from their solo runs at top-2 gaps of 3e-3..8e-3 of the
         * logit (3 of 32, 2026-11-26; 5 of 32 after that day's merges, gaps 8e-5..6e-3).
         * Rounding-sized, so the tie bound is scaled to it; why gemma4's error is larger is not
         * yet known (per-layer embeddings, unscaled scores). */
        batch_of_32_within(m, 3e-3f, 6);

        char err[512];
        engine_config cfg = {.n_slots = 1, .ctx_per_slot = 64, .max_batch_tokens = 64, .kv_cache_mb = 1};
        engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
        if (!e) fail_msg("%s", err);
        assert_true(engine_kv_blocks(e) >= 4);
        const int32_t orig[2] = {0, 1}, copy[2] = {2, 3};
        engine_seq s = {.slot = 0, .tokens = tokens, .n_tokens = 40, .pos = 0, .blocks = orig};
        if (engine_step(e, &s, 1, NULL, err, sizeof err)) fail_msg("prompt: %s", err);
        if (engine_kv_copy(e, 2, 0, err, sizeof err) || engine_kv_copy(e, 3, 1, err, sizeof err)) fail_msg("%s", err);
        const size_t V = (size_t)m->hp.n_vocab;
        float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
        decode_through(e, orig, NULL, tokens, a);
        decode_through(e, copy, NULL, tokens, b);
        assert_memory_equal(a, b, V * sizeof *a);
        print_message("  %s: a copied prompt's blocks give the original's logits bit for bit\n", files[i]);
        free(a), free(b);
        engine_free(e);
        model_free(m);
    }
}

/* ---- the sliding layers' own pool (docs/sliding-kv.md) ---- */

/* m on the GPU with the sliding pool: its logits at n_pos positions (a prompt of n_prompt in
 * steps of 64, then decode steps far past the window), the row's sliding K/V in its ring
 * (blocks_swa NULL: the ring wraps every few blocks), are those of the GPU engine that keeps
 * every layer's K/V in one pool bit for bit (the same kernels over the same keys), and within
 * the bounds of the other GPU-vs-CPU tests of the CPU's (itself with the pool; max_over as
 * there).  Then a 40-token prompt through explicit tables of both pools, its blocks copied in
 * both (engine_kv_copy, engine_kv_copy_swa) and read in place of the originals: the same logits
 * bit for bit. */
static void check_swa_pool(const model *m, const char *label, int n_pos, int n_prompt, const int32_t *tokens,
                           int max_over)
{
    const int V = m->hp.n_vocab;
    char err[512];
    engine_config cfg = {.n_slots = 3, .ctx_per_slot = 1024, .max_batch_tokens = 64, .n_threads = 2};
    engine_config one = cfg;
    one.no_swa_pool = true;
    pair p = make_pair(m, &cfg);
    engine *plain = engine_open(ENGINE_DEVICE_CUDA, m, &one, err, sizeof err);
    if (!plain) fail_msg("cuda engine without the sliding pool: %s", err);
    assert_int_equal(engine_kv_blocks_swa(plain), 0);
    assert_true(engine_kv_blocks_swa(p.gpu) > 0);
    assert_int_equal(engine_kv_blocks_swa(p.gpu), engine_kv_blocks_swa(p.cpu));
    assert_int_equal(engine_kv_swa_window(p.gpu), engine_kv_swa_window(p.cpu));
    assert_int_equal(engine_kv_swa_ring(p.gpu), engine_kv_swa_ring(p.cpu));
    assert_true(n_pos > 2 * engine_kv_swa_ring(p.gpu) * ENGINE_KV_BLOCK); /* the ring wraps twice */
    size_t n = (size_t)n_pos * V;
    float *lg = malloc(n * sizeof *lg), *lp = malloc(n * sizeof *lp), *lc = malloc(n * sizeof *lc);
    assert_true(lg && lp && lc);
    run_logits_chunked(p.gpu, 1, tokens, n_pos, n_prompt, 64, lg, V);
    run_logits_chunked(plain, 1, tokens, n_pos, n_prompt, 64, lp, V);
    run_logits_chunked(p.cpu, 1, tokens, n_pos, n_prompt, 64, lc, V);
    int differ = 0;
    for (int t = 0; t < n_pos; t++) differ += memcmp(lg + (size_t)t * V, lp + (size_t)t * V, (size_t)V * sizeof *lg) != 0;
    agreement a = compare_logits(lg, lc, n_pos, V);
    print_message("  %-24s window %d, sliding pool %d blocks (ring %d), full %d: %d of %d positions differ from one "
                  "pool; vs the CPU top-1 %.2f %%, max relative logit error %.2e (%d over %.0e%s%s)\n",
                  label, engine_kv_swa_window(p.gpu), engine_kv_blocks_swa(p.gpu), engine_kv_swa_ring(p.gpu),
                  engine_kv_blocks(p.gpu), differ, n_pos, 100.0 * a.top1, a.max_rel, a.over, REL_BOUND,
                  a.where[0] ? ":" : "", a.where);
    assert_int_equal(differ, 0);
    assert_true(a.top1 >= 0.99);
    assert_true(a.over <= max_over);

    /* copy-on-write in both pools */
    assert_true(engine_kv_blocks(p.gpu) >= 4 && engine_kv_blocks_swa(p.gpu) >= 4);
    const int32_t orig[2] = {0, 1}, copy[2] = {2, 3};
    engine_seq s = {.slot = 0, .tokens = tokens, .n_tokens = 40, .pos = 0, .blocks = orig, .blocks_swa = orig};
    if (engine_step(p.gpu, &s, 1, NULL, err, sizeof err)) fail_msg("prompt: %s", err);
    for (int b = 0; b < 2; b++)
        if (engine_kv_copy(p.gpu, copy[b], orig[b], err, sizeof err) ||
            engine_kv_copy_swa(p.gpu, copy[b], orig[b], err, sizeof err))
            fail_msg("%s", err);
    decode_through(p.gpu, orig, orig, tokens, lg);
    decode_through(p.gpu, copy, copy, tokens, lp);
    assert_memory_equal(lg, lp, (size_t)V * sizeof *lg);
    /* only the sliding copies: the full layers' K/V of blocks 2, 3 are the copies above, so a
     * sliding table of the originals reads the same; one of never-written blocks would not */
    decode_through(p.gpu, copy, orig, tokens, lp);
    assert_memory_equal(lg, lp, (size_t)V * sizeof *lg);
    free(lg), free(lp), free(lc);
    engine_free(plain);
    free_pair(&p);
}

/* The sliding pool on the reference gemma3 and gemma4 files (window 8, split-K attention) and on
 * synthetic gemma3 (window 48, head_dim 64: flash tiles and the tensor-core decode, walking from
 * the window's block) and gemma4 (window 48, head_dim 64 / 128, shared K/V), 400 positions. */
static void test_swa_pool_logits(void **state)
{
    (void)state;
    enum { NP = 400, PROMPT = 200 };
    static int32_t tokens[NP];
    uint64_t seed = 27;
    static const char *files[] = {"reference/gemma3.gguf", "reference/gemma4.gguf", "reference/gemma4_moe.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        model *m = load_shared(files[i]);
        if (!m) continue;
        for (int t = 0; t < NP; t++) tokens[t] = (int32_t)(gpu_test_rng(&seed) % (uint64_t)m->hp.n_vocab);
        /* the MoE files' router near ties; gemma4's larger rounding (test_logits_gemma4: on the
         * H100 2 of these 400 positions came out at 3.9e-2 against the CPU, bit-identical to the
         * one-pool engine) */
        const int max_over = m->hp.n_expert ? NP / 20 : strstr(files[i], "gemma4") ? NP / 100 : 0;
        check_swa_pool(m, files[i], NP, PROMPT, tokens, max_over);
        model_free(m);
    }
    for (int g4 = 0; g4 < 2; g4++) {
        tiny_spec s = tiny_spec_default();
        s.arch = g4 ? "gemma4" : "gemma3";
        s.n_vocab = 512, s.n_embd = 256, s.n_layer = 6, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 512, s.n_ctx = 1024;
        s.n_swa = 48, s.tied = true, s.post_norms = !g4, s.wtype = GGML_TYPE_Q8_0, s.seed = 400 + (uint64_t)g4;
        if (g4) s.g4_head_dim_full = 128, s.g4_n_kv_full = 1, s.g4_ple = 32, s.g4_kv_shared = 3;
        void *image;
        model *m = random_model(s, &image);
        for (int t = 0; t < NP; t++) tokens[t] = (int32_t)(gpu_test_rng(&seed) % (uint64_t)s.n_vocab);
        check_swa_pool(m, g4 ? "gemma4 Q8_0 window 48" : "gemma3 Q8_0 window 48", NP, PROMPT, tokens, 0);
        model_free(m);
        free(image);
    }
}

/* The issue's KV target with the device's own FP16 blocks: a Gemma-3-27B-shaped model (62
 * layers, 5 sliding of window 1024 : 1 full, 16 kv heads of 128; narrow elsewhere, as the
 * CPU's test_swa_pool_bytes_gemma3_27b) holds for one 32768-token sequence at most 25 % of the
 * K/V it holds with every layer's kept, as the engine accounts them (engine_kv_seq_bytes). */
static void test_swa_pool_bytes_gemma3_27b(void **state)
{
    (void)state;
    tiny_spec s = {.arch = "gemma3", .n_vocab = 64, .n_embd = 32, .n_layer = 62, .n_head = 32, .n_head_kv = 16,
                   .n_ff = 32, .n_ctx = 32768, .head_dim = 128, .wtype = GGML_TYPE_F16, .tied = true,
                   .post_norms = true, .n_swa = 1024, .seed = 5};
    void *image;
    model *m = random_model(s, &image);
    size_t bytes[2], pool_mb[2];
    for (int pool = 0; pool < 2; pool++) {
        engine_config cfg = {.n_slots = 1, .ctx_per_slot = 32768, .max_batch_tokens = 512, .kv_cache_mb = 2000,
                             .no_swa_pool = !pool};
        char err[512];
        engine *e = engine_open(ENGINE_DEVICE_CUDA, m, &cfg, err, sizeof err);
        if (!e) fail_msg("cuda engine: %s", err);
        assert_int_equal(engine_kv_swa_window(e), pool ? 1024 : 0);
        bytes[pool] = engine_kv_seq_bytes(e, 32768);
        pool_mb[pool] = ((size_t)engine_kv_blocks(e) * engine_kv_block_bytes(e) +
                         (size_t)engine_kv_blocks_swa(e) * engine_kv_block_bytes_swa(e)) >> 20;
        if (pool) { /* FP16: 16 x 32 x 128 x 2 bytes x K,V a layer's block; 10 full layers, 52 sliding */
            assert_int_equal(engine_kv_block_bytes(e), (size_t)10 * 16 * 32 * 128 * 2 * 2);
            assert_int_equal(engine_kv_block_bytes_swa(e), (size_t)52 * 16 * 32 * 128 * 2 * 2);
        }
        engine_free(e);
    }
    print_message("  Gemma-3-27B shape, one 32768-token sequence: %.1f MiB of K/V with every layer's kept, %.1f MiB "
                  "with the sliding pool (%.1f %%; FP16 as the GPU stores them; pools of %zu / %zu MiB)\n",
                  (double)bytes[0] / 1048576.0, (double)bytes[1] / 1048576.0,
                  100.0 * (double)bytes[1] / (double)bytes[0], pool_mb[0], pool_mb[1]);
    assert_true(bytes[1] * 4 <= bytes[0]);
    model_free(m);
    free(image);
}

/* phi3 and glm4moe of ../shared/reference: phi3's q, k, v and gate, up as row ranges of fused
 * matrices, partial NeoX RoPE (rope.dimension_count below head_dim) with LongRoPE's factors and
 * attention factor, in an engine of 296 positions (the short factors) and of 4104 (past
 * original_context_length 4096: the long ones); glm4moe's dense first layer, q/k/v biases, QK
 * norm, partial RoPE, the sigmoid router choosing by score + exp_probs_b and weighing by the
 * renormalised, scaled scores, and the ungated shared expert.  GPU logits against the CPU's
 * over 288 random tokens (the MoE file's router near ties as for qwen3moe), and 32 concurrent
 * greedy sequences as each alone. */
static void test_phi3_glm4moe_reference_files(void **state)
{
    (void)state;
    static const char *files[] = {"reference/phi3.gguf", "reference/glm4moe.gguf"};
    check_reference_files(files, 2, 61, 2);
}

/* phi3 and glm4moe made by mkmodel (--arch phi3 / glm4moe: head_dim 64, RoPE on 48 / 32 of it;
 * phi3's LongRoPE past a quarter of its 512 positions, so the 296-position engines turn by the
 * long factors; glm4moe's dense first layer, then 8 experts of 256, 2 per token, sigmoid-routed,
 * and the ungated shared expert) in F16 (cuBLAS and the float matvec), Q8_0 and Q4_K_M
 * (block-quantised: mmq and the quantised matvec over the fused matrices' row ranges): GPU
 * logits against the CPU's as above. */
static void test_phi3_glm4moe_mkmodel(void **state)
{
    (void)state;
    static const model_arch archs[] = {MODEL_ARCH_PHI3, MODEL_ARCH_GLM4MOE};
    static const mkmodel_ftype fts[] = {MKMODEL_F16, MKMODEL_Q8_0, MKMODEL_Q4_K_M};
    bool ok = true;
    uint64_t seed = 71;
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        for (size_t f = 0; f < sizeof fts / sizeof fts[0]; f++) {
            mkmodel_config cfg;
            assert_true(mkmodel_preset("tiny", &cfg));
            cfg.n_embd = 256, cfg.n_head = 4, cfg.n_head_kv = 2, cfg.n_ff = 1024, cfg.n_vocab = 512, cfg.n_ctx = 512;
            mkmodel_set_arch(&cfg, archs[a]);
            cfg.n_layer = 3, cfg.n_ff_exp = 256, cfg.ftype = fts[f], cfg.seed = 7;
            model *m = mkmodel_loaded(&cfg);
            int32_t tokens[N_POS];
            random_tokens(m, &seed, tokens);
            char label[64];
            snprintf(label, sizeof label, "%s %s", model_arch_name(archs[a]), mkmodel_ftype_name(fts[f]));
            agreement ag = measure_logits(m, label, N_POS, N_PROMPT, tokens);
            ok &= ag.top1 >= 0.99 && ag.over <= (m->hp.n_expert ? MOE_MAX_OVER : 0);
            model_free(m);
        }
    }
    assert_true(ok); /* every file measured before the verdict */
}

/* ---- deepseek2 (multi-head latent attention, docs/mla-gpu.md) ---- */

/* ../shared/reference's deepseek_v3 (F32): the q LoRA pair, latent rows of 32 + 8 RoPE
 * (interleaved, YaRN with mscale: the scores times mscale^2), a dense first layer, then 8
 * experts in 4 groups of which the best 2 are kept, sigmoid-routed with the selection bias,
 * renormalised and scaled, and the shared expert: GPU logits against the CPU's over 288 random
 * tokens, 32 concurrent greedy sequences as each alone. */
static void test_deepseek2_reference_file(void **state)
{
    (void)state;
    if (!gpu_features_enabled(GPU_MLA_FEATURES, "deepseek2")) skip();
    static const char *const files[] = {"reference/deepseek_v3.gguf"};
    check_reference_files(files, 1, 81, 1);
}

/* mkmodel's deepseek2 (4 heads of 64 + 32 RoPE, latent 256: rows of 288, the wide attention
 * kernel; the query without LoRA; 8 experts in 4 groups, the best 2 kept, 2 per token) in F16,
 * Q8_0, Q4_K_M (also with a q LoRA of 128) and Q6_K, over several weight seeds.  Like gpt-oss,
 * the GPU is checked against the CPU over the weights it holds (hold_matrices: Q4_K and Q6_K as
 * its FP16 decode gives them; top-1 >= 99 %, a router's near ties as for qwen3moe), and its
 * distance from the exact CPU is printed beside that rounding's own: this family's tiny files
 * sit on near ties (the groups, then 2 of 8 experts) that the FP16 decode of a K-quant's scales
 * alone decides (docs/mla-gpu.md).  Top-1 is counted up to near ties of the reference
 * (TIE_BOUND): the Q4_K_M file of seed 12 has ten positions whose two best logits are within
 * 5e-3 of the RMS logit, and the GPU's FP16 activations take the other token at five of them
 * (H100: 97.92 % plain, 99.65 % with near ties). */
typedef struct deepseek2_file {
    mkmodel_ftype ft;
    int q_lora;
    uint64_t seed;
    bool wide; /* DeepSeek's latent rows, 512 + 64: the prompt through flash_attn_mla */
    int heads; /* query heads (0: 4) */
    bool nope128; /* DeepSeek's heads, 128 + 64 and values of 128: decode steps through mla_decode_q/_value */
} deepseek2_file;

/* The files' comparisons, each printed; true when every one passes */
static bool deepseek2_files(const deepseek2_file *files, size_t n)
{
    bool ok = true;
    for (size_t f = 0; f < n; f++) {
        mkmodel_config cfg;
        assert_true(mkmodel_preset("tiny", &cfg));
        cfg.n_embd = 256, cfg.n_head = files[f].heads ? files[f].heads : 4, cfg.n_ff = 1024, cfg.n_vocab = 512;
        cfg.n_ctx = 512;
        mkmodel_set_arch(&cfg, MODEL_ARCH_DEEPSEEK2);
        cfg.n_layer = 3, cfg.n_ff_exp = 256, cfg.ftype = files[f].ft, cfg.seed = files[f].seed;
        cfg.n_expert_groups = 4, cfg.n_group_used = 2, cfg.q_lora_rank = files[f].q_lora;
        if (files[f].wide) cfg.kv_lora_rank = GPU_MLA_FLASH_V, cfg.n_rot = GPU_MLA_FLASH_ROW - GPU_MLA_FLASH_V;
        if (files[f].nope128) cfg.mla_nope = GPU_MLA_NOPE, cfg.mla_v = GPU_MLA_NOPE;
        model *m = mkmodel_loaded(&cfg);
        rounded_model held = {mkmodel_loaded(&cfg), {NULL}, 0};
        hold_matrices(&held, GGML_TYPE_COUNT);
        int32_t tokens[N_POS];
        uint64_t seed = 83 + files[f].seed;
        random_tokens(m, &seed, tokens);
        char label[160], name[96];
        snprintf(name, sizeof name, "deepseek2 %s%s%s%s %d heads seed %d", mkmodel_ftype_name(files[f].ft),
                 files[f].q_lora ? " q-LoRA" : "", files[f].wide ? " rows 576" : "",
                 files[f].nope128 ? " nope 128" : "", cfg.n_head, (int)files[f].seed);
        float *gpu = logits_on(m, ENGINE_DEVICE_CUDA, name, tokens), *cpu = logits_on(m, ENGINE_DEVICE_CPU, name, tokens),
              *cpu_held = logits_on(held.m, ENGINE_DEVICE_CPU, name, tokens);
        const int V = m->hp.n_vocab;
        snprintf(label, sizeof label, "%s: GPU vs CPU", name);
        compare_printed(gpu, cpu, V, label);
        snprintf(label, sizeof label, "%s: CPU held vs CPU", name);
        compare_printed(cpu_held, cpu, V, label);
        snprintf(label, sizeof label, "%s: GPU vs CPU held", name);
        agreement ag = compare_printed(gpu, cpu_held, V, label);
        ok &= ag.top1_or_tie >= 0.99 && ag.over <= MOE_MAX_OVER;
        free(gpu), free(cpu), free(cpu_held);
        free_rounded(&held);
        model_free(m);
    }
    return ok;
}

static void test_deepseek2_mkmodel(void **state)
{
    (void)state;
    if (!gpu_features_enabled(GPU_MLA_FEATURES, "deepseek2")) skip();
    static const deepseek2_file files[] = {
        {MKMODEL_F16, 0, 9, false, 0, false},     {MKMODEL_Q8_0, 0, 9, false, 0, false},
        {MKMODEL_Q4_K_M, 0, 9, false, 0, false},  {MKMODEL_Q4_K_M, 128, 9, false, 0, false},
        {MKMODEL_F16, 0, 11, false, 0, false},    {MKMODEL_Q8_0, 0, 11, false, 0, false},
        {MKMODEL_Q4_K_M, 0, 11, false, 0, false}, {MKMODEL_Q4_K_M, 128, 11, false, 0, false},
        {MKMODEL_Q4_K_M, 0, 12, false, 0, false}, {MKMODEL_Q4_K_M, 0, 13, false, 0, false},
        {MKMODEL_F16, 0, 13, false, 0, false},    {MKMODEL_Q6_K, 0, 14, false, 0, false}};
    assert_true(deepseek2_files(files, sizeof files / sizeof files[0])); /* every file measured before the verdict */
}

/* The same with DeepSeek's own latent rows, 512 + 64 (kv_lora_rank 512, RoPE 64; 4 heads of 64
 * + 64): the 200-token prompt through flash_attn_mla's tiles (64 tokens of 4 heads), the decode
 * steps through attn_decode_mla over the rows the prompt stored; and a file of DeepSeek's heads
 * (128 + 64, values of 128), 32 of them (two head groups), whose decode steps take
 * mla_decode_q and mla_decode_value too. */
static void test_deepseek2_wide(void **state)
{
    (void)state;
    if (!gpu_features_enabled(GPU_MLA_FEATURES, "deepseek2")) skip();
    static const deepseek2_file files[] = {{MKMODEL_F16, 0, 9, true, 0, false},
                                           {MKMODEL_Q4_K_M, 128, 11, true, 0, false},
                                           {MKMODEL_F16, 0, 13, true, 32, true}};
    assert_true(deepseek2_files(files, sizeof files / sizeof files[0]));
}

/* argv[1], when given: run only the tests whose names match this cmocka pattern ("test_moe*");
 * argv[2]: skip those matching this one (a run that has already seen a slow test pass). */
/* true when name matches one of pats: shell globs separated by commas */
static bool matches_any(const char *name, const char *pats)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", pats);
    char *save = NULL;
    for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
        if (fnmatch(p, name, 0) == 0) return true;
    return false;
}

/* The tests of all[n] named by inc (NULL: every one) and not by exc, run as one group. */
static int run_selected(const char *group, const struct CMUnitTest *all, size_t n, const char *inc, const char *exc)
{
    struct CMUnitTest *sel = malloc(n * sizeof *sel);
    if (!sel) return 1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if ((!inc || matches_any(all[i].name, inc)) && !(exc && matches_any(all[i].name, exc))) sel[k++] = all[i];
    int failed = k ? _cmocka_run_group_tests(group, sel, k, NULL, NULL) : 0;
    free(sel);
    return failed;
}

/* argv[1]: the tests to run, argv[2]: those to leave out, each a comma-separated list of shell
 * globs (scripts/gpu-check runs shards of this program side by side, with INFERD_TEST_KV_MB). */
int main(int argc, char **argv)
{
    const char *inc = argc > 1 ? argv[1] : NULL, *exc = argc > 2 ? argv[2] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_every_arch_and_format),
        cmocka_unit_test(test_logits_ud_mixes),
        cmocka_unit_test(test_logits_float_files),
        cmocka_unit_test(test_logits_sandwich_norms),
        cmocka_unit_test(test_logits_gemma3),
        cmocka_unit_test(test_logits_gemma4),
        cmocka_unit_test(test_logits_gemma4_synthetic),
        cmocka_unit_test(test_logits_gemma3_wide),
        cmocka_unit_test(test_swa_pool_logits),
        cmocka_unit_test(test_swa_pool_bytes_gemma3_27b),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_verify_equals_decode),
        cmocka_unit_test(test_decode_rounds_equal_steps),
        cmocka_unit_test(test_batch_of_32_equals_alone),
        cmocka_unit_test(test_mixed_steps_equal_alone),
        cmocka_unit_test(test_deterministic_bit_identical),
        cmocka_unit_test(test_moe_reference_files),
        cmocka_unit_test(test_moe_mkmodel_formats),
        cmocka_unit_test(test_moe_batch_of_32_equals_alone),
        cmocka_unit_test(test_moe_deterministic_bit_identical),
        cmocka_unit_test(test_errors_leave_engine_usable),
        cmocka_unit_test(test_gptoss_reference_files),
        cmocka_unit_test(test_gptoss_mkmodel),
        cmocka_unit_test(test_hybrid_reference_files),
        cmocka_unit_test(test_hybrid_mkmodel_carried),
        cmocka_unit_test(test_phi3_glm4moe_reference_files),
        cmocka_unit_test(test_phi3_glm4moe_mkmodel),
        cmocka_unit_test(test_deepseek2_reference_file),
        cmocka_unit_test(test_deepseek2_mkmodel),
        cmocka_unit_test(test_deepseek2_wide),
        cmocka_unit_test(test_hybrid_state_pieces_and_snapshot),
        cmocka_unit_test(test_reference_deterministic_bit_identical),
        cmocka_unit_test(test_embeddings_match_cpu),
        cmocka_unit_test(test_bert_matches_cpu),
        cmocka_unit_test(test_bge_small_shape_matches_cpu),
        cmocka_unit_test(test_nomic_bert_matches_cpu),
    };
    /* refusals decided before the GPU is touched: run them on every machine */
    const struct CMUnitTest without_device[] = {
        cmocka_unit_test(test_every_cpu_format_has_kernels),
        cmocka_unit_test(test_alibi_refused),
        cmocka_unit_test(test_tp_refusals),
        cmocka_unit_test(test_tp2_equals_tp1),
        cmocka_unit_test(test_tp_file),
    };
    int failed = run_selected("without a device", without_device, sizeof without_device / sizeof *without_device, inc, exc);
    if (failed) return failed;
    if (!gpu_test_have_device()) return GPU_TEST_SKIPPED;
    return run_selected("on the device", tests, sizeof tests / sizeof *tests, inc, exc);
}
