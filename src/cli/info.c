/* info.c - `inferd info MODEL.gguf [--all]`: what a GGUF file holds.
 *
 * Prints the header, every metadata key with its value (long arrays and strings are cut
 * short unless --all), the tensor table with totals, and the layer recipe the model's family
 * gives it (the one the engines compose their forward passes from, model/arch.h).  Opening
 * validates the whole file and loading it the model, so this is also the quickest way to see
 * why a model is refused. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/gguf.h"
#include "model/model.h"

#define ARRAY_PREVIEW 8   /* elements shown per array without --all */
#define STRING_PREVIEW 96 /* bytes shown per string without --all */

static const char *vtype_name(gguf_vtype t)
{
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                        "bool", "str", "arr", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* Strings are printed quoted with control characters escaped, so that tokens such as
 * "\n" or byte tokens stay on one line. */
static void print_str(const char *s, size_t len, bool all)
{
    size_t shown = all || len <= STRING_PREVIEW ? len : STRING_PREVIEW;
    putchar('"');
    for (size_t i = 0; i < shown; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch == '\n') fputs("\\n", stdout);
        else if (ch == '\t') fputs("\\t", stdout);
        else if (ch < 0x20 || ch == 0x7f) printf("\\x%02x", ch);
        else putchar(ch);
    }
    putchar('"');
    if (shown < len) printf("... (%zu bytes)", len);
}

static void print_scalar(const gguf_file *f, int64_t i)
{
    gguf_vtype t = gguf_kv_type(f, i);
    int64_t s;
    uint64_t u;
    double d;
    if (t == GGUF_VT_BOOL && gguf_kv_i64(f, i, &s)) printf("%s", s ? "true" : "false");
    else if (t == GGUF_VT_FLOAT32 || t == GGUF_VT_FLOAT64) {
        if (gguf_kv_f64(f, i, &d)) printf("%.9g", d);
    } else if (gguf_kv_u64(f, i, &u)) printf("%" PRIu64, u);
    else if (gguf_kv_i64(f, i, &s)) printf("%" PRId64, s);
}

static void print_array(const gguf_file *f, int64_t i, bool all)
{
    gguf_vtype et = gguf_arr_type(f, i);
    uint64_t n = gguf_arr_len(f, i);
    uint64_t shown = all || n <= ARRAY_PREVIEW ? n : ARRAY_PREVIEW;
    printf("[%s x %" PRIu64 "] [", vtype_name(et), n);
    for (uint64_t j = 0; j < shown; j++) {
        if (j) fputs(", ", stdout);
        size_t len;
        const char *s = gguf_arr_str(f, i, j, &len);
        int64_t v;
        float x;
        if (s) print_str(s, len, all);
        else if (et == GGUF_VT_FLOAT32 || et == GGUF_VT_FLOAT64) {
            if (gguf_arr_f32(f, i, j, &x)) printf("%.9g", x);
        } else if (gguf_arr_i64(f, i, j, &v)) printf("%" PRId64, v);
        else fputs("?", stdout); /* uint64 above INT64_MAX */
    }
    printf("%s]", shown < n ? ", ..." : "");
}

static void print_metadata(const gguf_file *f, bool all)
{
    printf("metadata: %" PRId64 " keys\n", gguf_n_kv(f));
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        gguf_vtype t = gguf_kv_type(f, i);
        printf("  %-40s %-4s ", gguf_kv_key(f, i), vtype_name(t));
        size_t len;
        const char *s = gguf_kv_str(f, i, &len);
        if (s) print_str(s, len, all);
        else if (t == GGUF_VT_ARRAY) print_array(f, i, all);
        else print_scalar(f, i);
        putchar('\n');
    }
}

static void print_tensors(const gguf_file *f)
{
    int64_t n = gguf_n_tensors(f);
    uint64_t total_bytes = 0, total_elems = 0;
    uint64_t bytes_by_type[GGML_TYPE_COUNT] = {0};
    int64_t count_by_type[GGML_TYPE_COUNT] = {0};
    printf("tensors: %" PRId64 "\n", n);
    printf("  %5s  %-40s %-7s %-28s %14s %14s\n", "#", "name", "type", "shape", "bytes", "offset");
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char shape[96];
        int len = snprintf(shape, sizeof shape, "[");
        uint64_t elems = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%" PRId64, d ? ", " : "", t->ne[d]);
            elems *= (uint64_t)t->ne[d]; /* the reader checked that this does not overflow */
        }
        snprintf(shape + len, sizeof shape - (size_t)len, "]");
        printf("  %5" PRId64 "  %-40s %-7s %-28s %14zu %14" PRIu64 "\n", i, t->name,
               ggml_type_name(t->type), shape, t->nbytes, (uint64_t)gguf_data_offset(f) + t->offset);
        total_bytes += t->nbytes;
        total_elems += elems;
        bytes_by_type[t->type] += t->nbytes;
        count_by_type[t->type]++;
    }
    printf("total: %" PRId64 " tensors, %" PRIu64 " elements, %" PRIu64 " bytes (%.2f MiB)\n", n,
           total_elems, total_bytes, (double)total_bytes / (1024.0 * 1024.0));
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (count_by_type[t])
            printf("  %-7s %5" PRId64 " tensors %14" PRIu64 " bytes%s\n", ggml_type_name((ggml_type)t),
                   count_by_type[t], bytes_by_type[t],
                   ggml_type_supported((ggml_type)t) ? "" : "  (not supported by the engines)");
}

/* Latent attention's shapes and what its cache costs per token (every layer keeps the latent
 * and the RoPE key) beside what full K/V of every head would: DeepSeek-V3 (61 layers, kv_lora
 * 512, rope 64, 128 heads of 192 + 128) keeps 35,136 values per token instead of 2,498,560. */
static void print_latent(const model_hparams *hp)
{
    const long long latent = (long long)hp->n_layer * (hp->kv_lora_rank + hp->n_rot);
    const long long full = (long long)hp->n_layer * hp->n_head * (hp->mla_nope + hp->n_rot + hp->mla_v);
    printf("  attention: latent (MLA), q_lora_rank %d, kv_lora_rank %d, heads of %d + %d (RoPE) key and %d value\n",
           hp->q_lora_rank, hp->kv_lora_rank, hp->mla_nope, hp->n_rot, hp->mla_v);
    printf("  KV cache per token: %lld values (%d layers x (%d latent + %d RoPE key)), %lld bytes in F32 and %lld "
           "in F16; full K/V would be %lld values (%d heads x (%d + %d)), %lld bytes in F16: %.1fx more\n",
           latent, hp->n_layer, hp->kv_lora_rank, hp->n_rot, latent * 4, latent * 2, full, hp->n_head,
           hp->mla_nope + hp->n_rot, hp->mla_v, full * 2, (double)full / (double)latent);
}

/* The recipe of every layer, runs of equal layers on one line. */
static void print_recipe(const char *path)
{
    char err[512];
    model *m = model_load(path, err, sizeof err);
    if (!m) {
        printf("model: refused: %s\n", err);
        return;
    }
    const model_hparams *hp = &m->hp;
    printf("recipe: %s, %d layers, rope %s, output %s\n", m->desc->name, hp->n_layer,
           m->desc->rope == ARCH_ROPE_NEOX ? "neox" : "normal", hp->tied_output ? "tied to token_embd" : "own");
    if (hp->n_rot < hp->head_dim && !hp->kv_lora_rank) printf("  rope: the first %d of %d dims of each head\n", hp->n_rot, hp->head_dim);
    if (m->rope_factors_short.data || m->rope_factors_long.data)
        printf("  rope: LongRoPE factors (long past %d tokens), attention factor %g\n", hp->n_ctx_orig,
               (double)hp->rope_attn_factor);
    if (hp->kv_lora_rank) print_latent(hp);
    if (hp->n_expert) {
        printf("  experts: %d per MoE layer, %d per token, hidden width %d", hp->n_expert, hp->n_expert_used,
               hp->n_ff_exp);
        if (hp->n_ff_shexp) printf(", shared expert width %d", hp->n_ff_shexp);
        printf("\n");
    }
    char run[160], next[160];
    int first = 0;
    arch_layer_describe(&m->layers[0].recipe, run, sizeof run);
    for (int il = 1; il <= hp->n_layer; il++) {
        if (il < hp->n_layer) arch_layer_describe(&m->layers[il].recipe, next, sizeof next);
        if (il < hp->n_layer && strcmp(next, run) == 0) continue;
        if (il - 1 == first) printf("  layer %d: %s\n", first, run);
        else printf("  layers %d-%d: %s\n", first, il - 1, run);
        first = il;
        memcpy(run, next, sizeof run);
    }
    model_free(m);
}

static void usage(FILE *out)
{
    fprintf(out, "usage: inferd info MODEL.gguf [--all]\n"
                 "  --all   print every array element and whole strings\n");
}

int cli_info(int argc, char **argv)
{
    const char *path = NULL;
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--all") == 0) all = true;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "inferd info: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else path = argv[i];
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    char err[512];
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) {
        fprintf(stderr, "inferd info: %s\n", err);
        return 1;
    }
    printf("file: %s (%zu bytes)\n", path, gguf_file_size(f));
    printf("version: %u\nalignment: %zu\ndata offset: %zu\n", gguf_version(f), gguf_alignment(f),
           gguf_data_offset(f));
    print_metadata(f, all);
    print_tensors(f);
    gguf_close(f);
    print_recipe(path);
    return 0;
}
