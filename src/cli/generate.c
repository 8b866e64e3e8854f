/* generate.c - `inferd generate`: one completion on the terminal.
 *
 * The prompt is tokenized (BOS as the vocabulary asks), prefilled in a single engine step,
 * then decoded one token per step.  Text goes to stdout as it is produced (through the
 * streaming detokenizer, so a UTF-8 character split across tokens is printed whole); the
 * timing summary goes to stderr. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_common.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "base/timing.h"

#define CMD "generate"

typedef struct gen_opts {
    const char *model_path, *prompt, *device;
    int n_predict, n_threads, n_ctx;
    bool chat;
    sampling_params sp;
} gen_opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: inferd generate -m MODEL.gguf -p TEXT [options]\n"
            "  -n N            tokens to generate (default 64)\n"
            "  --temp T        temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K       (default 40; 0 = off)   --top-p P (default 0.95)   --min-p P (default 0.05)\n"
            "  --seed N        sampling seed (default: from the clock)\n"
            "  --device D      auto | cpu | cuda (default cpu)\n"
            "  --threads N     CPU threads (default: all cores)\n"
            "  --ctx N         context length (default: min(model's, 4096))\n"
            "  --chat          wrap the prompt as a user message in the model's chat template\n");
}

enum { OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_SEED, OPT_DEVICE, OPT_THREADS, OPT_CTX, OPT_CHAT };

/* 0 to run, 1 when --help was printed, 2 on a bad flag. */
static int parse_args(int argc, char **argv, gen_opts *o)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},   {"prompt", required_argument, NULL, 'p'},
        {"n-predict", required_argument, NULL, 'n'}, {"temp", required_argument, NULL, OPT_TEMP},
        {"top-k", required_argument, NULL, OPT_TOPK}, {"top-p", required_argument, NULL, OPT_TOPP},
        {"min-p", required_argument, NULL, OPT_MINP}, {"seed", required_argument, NULL, OPT_SEED},
        {"device", required_argument, NULL, OPT_DEVICE},
        {"threads", required_argument, NULL, OPT_THREADS}, {"ctx", required_argument, NULL, OPT_CTX},
        {"chat", no_argument, NULL, OPT_CHAT},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (gen_opts){.device = "cpu", .n_predict = 64};
    sampling_params_default(&o->sp);
    o->sp.temperature = 0.8f;
    o->sp.top_k = 40;
    o->sp.top_p = 0.95f;
    o->sp.min_p = 0.05f;
    o->sp.seed = (uint64_t)time(NULL);
    int seed = -1, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': ok = cli_parse_int(CMD, "-n", optarg, 1, 1 << 20, &o->n_predict); break;
        case OPT_TEMP: ok = cli_parse_float(CMD, "--temp", optarg, 0, 100, &o->sp.temperature); break;
        case OPT_TOPK: ok = cli_parse_int(CMD, "--top-k", optarg, 0, 1 << 24, &o->sp.top_k); break;
        case OPT_TOPP: ok = cli_parse_float(CMD, "--top-p", optarg, 0, 1, &o->sp.top_p); break;
        case OPT_MINP: ok = cli_parse_float(CMD, "--min-p", optarg, 0, 1, &o->sp.min_p); break;
        case OPT_SEED: ok = cli_parse_int(CMD, "--seed", optarg, 0, 0x7fffffff, &seed); break;
        case OPT_DEVICE: o->device = optarg; break;
        case OPT_THREADS: ok = cli_parse_int(CMD, "--threads", optarg, 1, 1024, &o->n_threads); break;
        case OPT_CTX: ok = cli_parse_int(CMD, "--ctx", optarg, 8, 1 << 24, &o->n_ctx); break;
        case OPT_CHAT: o->chat = true; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
        if (!ok) return 2;
    }
    if (seed >= 0) o->sp.seed = (uint64_t)seed;
    if (!o->model_path || !o->prompt || optind != argc) {
        fprintf(stderr, "inferd generate: %s\n",
                optind != argc ? "unexpected argument" : "-m MODEL.gguf and -p TEXT are required");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* The text to tokenize: the prompt itself, or the prompt as a user turn of the model's chat
 * template (with the assistant turn opened). Caller frees. */
static char *prompt_text(const gen_opts *o, const model *m, const tokenizer *t)
{
    if (!o->chat) return strdup(o->prompt);
    size_t len = 0;
    const char *src = gguf_get_str(m->gguf, "tokenizer.chat_template", &len);
    char *jinja = src ? strndup(src, len) : NULL;
    chat_template_kind kind = chat_template_detect(jinja);
    free(jinja);
    char bos[64] = "", eos[64] = "";
    const char *s;
    if (tokenizer_bos(t) >= 0 && (s = tokenizer_token_text(t, tokenizer_bos(t), &len)))
        snprintf(bos, sizeof bos, "%.*s", (int)len, s);
    if (tokenizer_eos(t) >= 0 && (s = tokenizer_token_text(t, tokenizer_eos(t), &len)))
        snprintf(eos, sizeof eos, "%.*s", (int)len, s);
    chat_msg msg = {"user", o->prompt};
    char err[128];
    char *text = chat_render(kind, &msg, 1, true, bos, eos, err, sizeof err);
    if (!text) fprintf(stderr, "inferd generate: %s\n", err);
    return text;
}

/* Prints the text of id (streamed); false when out of memory. */
static bool emit(detok_stream *ds, int32_t id, char **buf, int *cap)
{
    char probe[1];
    int need = tokenizer_token_bytes(ds->t, id, false, probe, 0) + 16;
    if (need > *cap) {
        char *b = realloc(*buf, (size_t)need);
        if (!b) return false;
        *buf = b;
        *cap = need;
    }
    int n = detok_feed(ds, id, *buf, *cap);
    if (n > 0) fwrite(*buf, 1, (size_t)n, stdout);
    fflush(stdout);
    return true;
}

typedef struct gen_stats {
    int n_prompt, n_gen, n_steps; /* n_steps: decode steps (each samples one token) */
    double t_prefill, t_decode;
} gen_stats;

/* Prefill + decode loop. 0 or 1 (error printed). */
static int run(const gen_opts *o, const tokenizer *t, engine *e, const int32_t *prompt,
               int n_prompt, gen_stats *st)
{
    char err[256];
    engine_result res;
    engine_seq seq = {.slot = 0, .tokens = prompt, .n_tokens = n_prompt, .pos = 0,
                      .want_token = true, .sp = &o->sp};
    double t0 = timing_now_s();
    if (engine_step(e, &seq, 1, &res, err, sizeof err) != 0) {
        fprintf(stderr, "inferd generate: prefill: %s\n", err);
        return 1;
    }
    st->t_prefill = timing_now_s() - t0;
    st->n_prompt = n_prompt;
    int limit = engine_get_config(e)->ctx_per_slot - n_prompt;
    if (limit > o->n_predict) limit = o->n_predict;
    detok_stream ds;
    detok_init(&ds, t, false);
    int cap = 256;
    char *buf = malloc((size_t)cap);
    int rc = buf ? 0 : 1;
    t0 = timing_now_s();
    for (int pos = n_prompt; rc == 0;) {
        int32_t tok = res.token;
        if (tokenizer_is_eog(t, tok)) break;
        st->n_gen++;
        if (!emit(&ds, tok, &buf, &cap)) rc = 1;
        if (st->n_gen >= limit || rc) break;
        seq = (engine_seq){.slot = 0, .tokens = &tok, .n_tokens = 1, .pos = pos++,
                           .want_token = true, .sp = &o->sp};
        if (engine_step(e, &seq, 1, &res, err, sizeof err) != 0) {
            fprintf(stderr, "\ninferd generate: decode at position %d: %s\n", pos - 1, err);
            rc = 1;
        }
        st->n_steps++;
    }
    st->t_decode = timing_now_s() - t0;
    if (buf) {
        int n = detok_flush(&ds, buf, cap);
        if (n > 0) fwrite(buf, 1, (size_t)n, stdout);
    }
    putchar('\n');
    fflush(stdout); /* the text before the statistics on stderr */
    free(buf);
    if (rc) fprintf(stderr, "inferd generate: out of memory or engine failure\n");
    return rc;
}

int cli_generate(int argc, char **argv)
{
    gen_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    char err[512];
    model *m = model_load(o.model_path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "inferd generate: %s\n", err);
        return 1;
    }
    tokenizer *t = tokenizer_load(m->gguf, err, sizeof err);
    engine *e = NULL;
    int32_t *ids = NULL;
    char *text = NULL;
    rc = 1;
    if (!t) {
        fprintf(stderr, "inferd generate: %s: tokenizer: %s\n", o.model_path, err);
        goto out;
    }
    int n_prompt;
    if (!(text = prompt_text(&o, m, t))) goto out;
    /* A chat prompt is parsed for special tokens, so one its template starts with BOS gets no
     * second; a plain prompt is plain text. */
    bool add_bos = o.chat ? tokenizer_prompt_bos(t, text, strlen(text)) : tokenizer_add_bos(t);
    if ((n_prompt = tokenizer_encode_alloc(t, text, strlen(text), add_bos, o.chat, &ids)) <= 0) {
        fprintf(stderr, "inferd generate: the prompt gives no tokens\n");
        goto out;
    }
    int n_ctx = o.n_ctx ? o.n_ctx : (m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    if (n_prompt >= n_ctx) {
        fprintf(stderr, "inferd generate: the prompt has %d tokens, the context only %d (--ctx)\n",
                n_prompt, n_ctx);
        goto out;
    }
    engine_config cfg = {.n_slots = 1, .ctx_per_slot = n_ctx, .max_batch_tokens = n_ctx,
                         .n_threads = o.n_threads};
    if (!(e = cli_engine_open(m, o.device, &cfg, err, sizeof err))) {
        fprintf(stderr, "inferd generate: %s\n", err);
        goto out;
    }
    gen_stats st = {0};
    rc = run(&o, t, e, ids, n_prompt, &st);
    fprintf(stderr, "prompt tokens: %d\n", st.n_prompt);
    fprintf(stderr, "prefill: %.1f tok/s (%d tokens in %.1f ms)\n",
            st.t_prefill > 0 ? st.n_prompt / st.t_prefill : 0.0, st.n_prompt, st.t_prefill * 1e3);
    /* the first generated token came out of the prefill step */
    fprintf(stderr, "decode: %.1f tok/s (%d tokens generated, %d decode steps in %.1f ms, %s, seed %llu)\n",
            st.t_decode > 0 ? st.n_steps / st.t_decode : 0.0, st.n_gen, st.n_steps, st.t_decode * 1e3,
            engine_name(e), (unsigned long long)o.sp.seed);
out:
    if (e) engine_free(e);
    free(ids);
    free(text);
    if (t) tokenizer_free(t);
    model_free(m);
    return rc;
}
