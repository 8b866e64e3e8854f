/* opts.c - see opts.h.  Adding an option is one line in opt_table plus its field. */
#include "opts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"

typedef enum opt_type { OPT_INT, OPT_FLOAT, OPT_STRING, OPT_BOOL, OPT_ENUM } opt_type;

typedef struct opt_def {
    const char *name;  /* long name = config key */
    const char *shrt;  /* short flag without the dash, or NULL */
    opt_type type;
    size_t offset;     /* into struct inferd_opts */
    size_t size;       /* of the field (string capacity) */
    const char *def;   /* default, as text (parsed by opts_set like any value) */
    double min, max;   /* range for int/float */
    const char *const *choices; /* enum values; the field holds the index */
    bool secret;       /* masked in opts_log */
    const char *help;
} opt_def;

/* In engine_device order (backend/backend.h). */
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const reasoning_names[] = {"auto", "none", "deepseek", NULL};
static const char *const log_format_names[] = {"text", "json", NULL};
/* In opts_hosted_tools order. */
static const char *const hosted_tools_names[] = {"ignore", "refuse", NULL};
/* "model", then engine_pooling's names in its order (index - 1) */
static const char *const pooling_names[] = {"model", "none", "mean", "cls", "last", "rank", NULL};
/* In opts_speculative order. */
static const char *const speculative_names[] = {"off", "ngram", "draft", "mtp", NULL};
/* Same order as log_level in log.h. */
static const char *const log_level_names[] = {"debug", "info", "warn", "error", NULL};

#define FIELD(f) offsetof(inferd_opts, f), sizeof(((inferd_opts *)0)->f)
#define INT_(name, s, f, def, lo, hi, help) {name, s, OPT_INT, FIELD(f), def, lo, hi, NULL, false, help}
#define FLT_(name, s, f, def, lo, hi, help) {name, s, OPT_FLOAT, FIELD(f), def, lo, hi, NULL, false, help}
#define STR_(name, s, f, def, help) {name, s, OPT_STRING, FIELD(f), def, 0, 0, NULL, false, help}
#define BOOL_(name, s, f, def, help) {name, s, OPT_BOOL, FIELD(f), def, 0, 0, NULL, false, help}
#define ENUM_(name, s, f, def, ch, help) {name, s, OPT_ENUM, FIELD(f), def, 0, 0, ch, false, help}

static const opt_def opt_table[] = {
    STR_("model", "m", model, "", "GGUF model file to serve (required)"),
    STR_("model-alias", "a", model_alias, "", "model name in API responses (default: file basename)"),
    STR_("host", NULL, host, "127.0.0.1", "address to listen on"),
    INT_("port", NULL, port, "8080", 1, 65535, "TCP port to listen on"),
    INT_("parallel", "np", parallel, "4", 1, 1024, "most sequences generating at once"),
    INT_("ctx-size", "c", ctx_size, "0", 0, 1 << 24,
         "most context tokens of one request, prompt + completion (0: min(model context, 4096))"),
    INT_("kv-cache-size", NULL, kv_cache_size, "0", 0, 1 << 30,
         "MiB of KV-cache blocks shared by all sequences and the prefix cache (0: cpu: parallel x ctx-size "
         "tokens; cuda: the free GPU memory)"),
    INT_("batch-tokens", "b", batch_tokens, "512", 1, 1 << 20, "most prompt tokens one scheduler step prefills"),
    INT_("queue-size", NULL, queue_size, "64", 0, 1 << 20, "waiting requests beyond the running ones; more get 429"),
    INT_("embed-step-tokens", NULL, embed_step_tokens, "16", 0, 1 << 20,
         "while streams decode, embedding/rerank tokens a step carries on average (their TPOT cost; 0: no bound)"),
    INT_("max-head-passes", NULL, max_head_passes, "0", -1, 1 << 20,
         "later requests admitted while the oldest waiting one does not fit the free KV blocks, before admission "
         "waits for it (0: parallel; -1: strict FIFO)"),
    INT_("max-body", NULL, max_body, "1048576", 64, 1 << 30, "largest request body in bytes; more get 413"),
    {"api-key", NULL, OPT_STRING, FIELD(api_key), "", 0, 0, NULL, true,
     "require 'Authorization: Bearer KEY' on every route but /health"},
    STR_("api-key-file", NULL, api_key_file, "",
         "read the API key from the first line of this file (unlike --api-key, not visible in ps)"),
    INT_("threads", "t", threads, "0", 0, 4096, "CPU backend threads (0: all cores)"),
    INT_("http-threads", NULL, http_threads, "4", 1, 256, "HTTP worker threads, and as many again for parsing and tokenization"),
    INT_("max-connections", NULL, max_connections, "16384", 16, 1 << 20,
         "open HTTP connections in all; more are closed at once (needs as many open files)"),
    INT_("max-connections-per-ip", NULL, max_connections_per_ip, "1024", 0, 1 << 20,
         "open HTTP connections from one client address (0: no limit; raise behind a proxy)"),
    INT_("timeout", NULL, timeout, "10", 1, 3600,
         "seconds a client has to send a whole request (head and body); also the keep-alive idle time"),
    INT_("stream-timeout", NULL, stream_timeout, "300", 1, 86400,
         "seconds a client may read nothing while its response is generated or streamed"),
    ENUM_("device", NULL, device, "auto", device_names, "compute backend: auto (cuda when available), cpu, cuda"),
    INT_("gpu", NULL, gpu, "0", 0, 64, "CUDA device ordinal"),
    INT_("tensor-parallel", "tp", tensor_parallel, "1", 1, 8,
         "GPUs of this host one model is split across (1: one GPU, --gpu; N: GPUs --gpu .. --gpu+N-1, over NCCL)"),
    STR_("chat-template", NULL, chat_template, "",
         "built-in chat template for models without one: chatml, llama2, llama3, mistral, zephyr, gemma, phi3 "
         "(default: the model's own Jinja template, else detect)"),
    STR_("chat-template-file", NULL, chat_template_file, "",
         "a Jinja chat template file used instead of the model's tokenizer.chat_template"),
    BOOL_("special-in-content", NULL, special_in_content, "false",
          "control-token texts (<|im_end|>, <|eot_id|>, ...) in chat messages become control tokens, as only the "
          "chat template's own may by default (the old behaviour; lets a client open a system turn)"),
    ENUM_("reasoning-format", NULL, reasoning_format, "auto", reasoning_names,
          "<think> blocks: deepseek (to reasoning_content), none (left in content), auto (deepseek when the "
          "template or vocabulary has them)"),
    BOOL_("always-include-usage", NULL, always_include_usage, "false",
          "streamed chat completions end with a usage chunk even when the client sent no stream_options "
          "(for operators who bill or monitor by usage)"),
    INT_("default-max-tokens", NULL, default_max_tokens, "0", 0, 1 << 30,
         "completion tokens of a chat or Responses request that sets no limit (llama-server's --n-predict; "
         "0: up to the context)"),
    ENUM_("hosted-tools", NULL, hosted_tools, "ignore", hosted_tools_names,
          "Responses tools only OpenAI can run (web_search, file_search, code_interpreter, computer use, "
          "image_generation, mcp): ignore (set aside, logged, named in the x-inferd-ignored-tools header) or "
          "refuse (a 400)"),
    ENUM_("log-level", NULL, log_level, "info", log_level_names, "debug, info, warn, error"),
    ENUM_("log-format", NULL, log_format, "text", log_format_names, "text or json (one object per line)"),
    STR_("log-file", NULL, log_file, "", "log to this file instead of stderr"),
    FLT_("shutdown-timeout", NULL, shutdown_timeout, "30", 0, 86400,
         "seconds running requests may take to finish after SIGTERM/SIGINT"),
    BOOL_("metrics", NULL, metrics, "true", "serve Prometheus metrics on /metrics (--no-metrics: off)"),
    ENUM_("pooling", NULL, pooling, "model", pooling_names,
          "serve embeddings (/v1/embeddings) pooled so, or rerank (/v1/rerank) with rank: none, mean, cls, last, "
          "rank; model: as the GGUF's pooling_type says (absent: a text model, no embeddings)"),
    BOOL_("deterministic", NULL, deterministic, "false",
          "a request's tokens and logprobs do not depend on what else runs (batch, chunking, prefix-cache "
          "hits): fixed batch-invariant kernels, some speed for it (docs/determinism.md); responses carry a "
          "system_fingerprint ending in _det"),
    BOOL_("prefix-cache", NULL, prefix_cache, "true",
          "reuse the KV blocks of prompt prefixes computed before (--no-prefix-cache: off, for comparisons)"),
    ENUM_("speculative", NULL, speculative, "off", speculative_names,
          "speculative decoding: ngram (drafts from the request's own tokens), draft (a draft model of the same "
          "vocabulary, --model-draft, on the same device), mtp (the model's own multi-token-prediction block: "
          "Qwen3.5 files, CPU engine) or off; drafts are verified in the same step, so the output is unchanged"),
    INT_("draft-max", NULL, draft_max, "8", 1, 32,
         "most tokens one request drafts per decode step under --speculative (fewer as its drafts are rejected)"),
    INT_("draft-min", NULL, draft_min, "0", 0, 32,
         "a draft shorter than this is not verified: the request decodes one token instead"),
    FLT_("draft-p-min", NULL, draft_p_min, "0", 0, 1,
         "--speculative draft: a draft stops before a token the draft model gives less than this probability "
         "(0: drafts run to their length)"),
    STR_("model-draft", "md", model_draft, "",
         "--speculative draft: the draft model, a smaller GGUF with the target's vocabulary (checked at start)"),
    STR_("config", NULL, config, "",
         "configuration file (key = value lines, keys are the long flag names); command-line flags win"),
};
#define N_OPTS ((int)(sizeof opt_table / sizeof opt_table[0]))

int opts_count(void) { return N_OPTS; }
const char *opts_name(int i) { return i >= 0 && i < N_OPTS ? opt_table[i].name : NULL; }

static const opt_def *find_long(const char *name, size_t len)
{
    for (int i = 0; i < N_OPTS; i++)
        if (strlen(opt_table[i].name) == len && strncmp(opt_table[i].name, name, len) == 0)
            return &opt_table[i];
    return NULL;
}

static const opt_def *find_short(const char *name)
{
    for (int i = 0; i < N_OPTS; i++)
        if (opt_table[i].shrt && strcmp(opt_table[i].shrt, name) == 0) return &opt_table[i];
    return NULL;
}

static int parse_bool(const char *v, bool *out)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) { *out = true; return 0; }
        if (strcasecmp(v, no[i]) == 0) { *out = false; return 0; }
    }
    return -1;
}

static void choices_text(const char *const *ch, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; ch[i] && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? "|" : "", ch[i]);
}

static int set_value(inferd_opts *o, const opt_def *d, const char *v, char *err, size_t errlen)
{
    char *field = (char *)o + d->offset;
    char *end = NULL;
    errno = 0;
    switch (d->type) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < d->min || x > d->max) {
            snprintf(err, errlen, "option '%s': '%s' is not an integer in [%.0f, %.0f]", d->name, v,
                     d->min, d->max);
            return -1;
        }
        *(int *)field = (int)x;
        return 0;
    }
    case OPT_FLOAT: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x) || x < d->min || x > d->max) {
            snprintf(err, errlen, "option '%s': '%s' is not a number in [%g, %g]", d->name, v, d->min,
                     d->max);
            return -1;
        }
        *(double *)field = x;
        return 0;
    }
    case OPT_STRING:
        if (strlen(v) >= d->size) {
            snprintf(err, errlen, "option '%s': value longer than %zu bytes", d->name, d->size - 1);
            return -1;
        }
        memcpy(field, v, strlen(v) + 1);
        return 0;
    case OPT_BOOL:
        if (parse_bool(v, (bool *)field) != 0) {
            snprintf(err, errlen, "option '%s': '%s' is not a boolean (true|false)", d->name, v);
            return -1;
        }
        return 0;
    case OPT_ENUM:
        for (int i = 0; d->choices[i]; i++) {
            if (strcasecmp(d->choices[i], v) == 0) {
                *(int *)field = i;
                return 0;
            }
        }
        char ch[128];
        choices_text(d->choices, ch, sizeof ch);
        snprintf(err, errlen, "option '%s': '%s' is not one of %s", d->name, v, ch);
        return -1;
    }
    return -1;
}

void opts_defaults(inferd_opts *o)
{
    memset(o, 0, sizeof *o);
    char err[256];
    for (int i = 0; i < N_OPTS; i++) {
        /* The table's defaults are constants checked by the opts unit test. */
        (void)set_value(o, &opt_table[i], opt_table[i].def, err, sizeof err);
    }
}

int opts_set(inferd_opts *o, const char *key, const char *value, char *err, size_t errlen)
{
    const opt_def *d = find_long(key, strlen(key));
    if (!d) {
        snprintf(err, errlen, "unknown option '%s'", key);
        return -1;
    }
    return set_value(o, d, value, err, errlen);
}

int opts_parse_argv(inferd_opts *o, int argc, char **argv, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            opts_print_help(stdout);
            return 1;
        }
        const opt_def *d = NULL;
        const char *value = NULL;
        bool negated = false;
        if (strncmp(a, "--", 2) == 0) {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            d = find_long(name, len);
            if (!d && strncmp(name, "no-", 3) == 0 && !eq) {
                d = find_long(name + 3, len - 3);
                negated = d && d->type == OPT_BOOL;
                if (!negated) d = NULL;
            }
            if (eq) value = eq + 1;
        } else if (a[0] == '-' && a[1]) {
            d = find_short(a + 1);
        }
        if (!d) {
            snprintf(err, errlen, "unknown option '%s' (see --help)", a);
            return -1;
        }
        if (d->type == OPT_BOOL && !value) {
            value = negated ? "false" : "true";
        } else if (!value) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "option '%s' needs a value", a);
                return -1;
            }
            value = argv[++i];
        }
        if (set_value(o, d, value, err, errlen) != 0) return -1;
    }
    return 0;
}

/* One option's two left columns: "-m, --model" and its argument ("N", "TEXT", "a|b|c"). */
static void help_columns(const opt_def *d, char *flag, size_t flag_len, char *arg, size_t arg_len)
{
    arg[0] = '\0';
    if (d->type == OPT_ENUM) choices_text(d->choices, arg, arg_len);
    else if (d->type != OPT_BOOL) snprintf(arg, arg_len, "%s", d->type == OPT_STRING ? "TEXT" : "N");
    snprintf(flag, flag_len, "%s%s%s--%s", d->shrt ? "-" : "", d->shrt ? d->shrt : "", d->shrt ? ", " : "",
             d->name);
}

void opts_print_help(FILE *out)
{
    fprintf(out, "usage: inferd serve -m MODEL.gguf [options]\n\n"
                 "Every option is also a config-file key of the same long name.\n\n");
    /* The columns are as wide as their widest entry, so a long choice list (--log-level's)
     * cannot push its row's description out of line. */
    int flag_w = 0, arg_w = 0;
    char flag[64], arg[128];
    for (int i = 0; i < N_OPTS; i++) {
        help_columns(&opt_table[i], flag, sizeof flag, arg, sizeof arg);
        if ((int)strlen(flag) > flag_w) flag_w = (int)strlen(flag);
        if ((int)strlen(arg) > arg_w) arg_w = (int)strlen(arg);
    }
    for (int i = 0; i < N_OPTS; i++) {
        const opt_def *d = &opt_table[i];
        help_columns(d, flag, sizeof flag, arg, sizeof arg);
        fprintf(out, "  %-*s %-*s %s", flag_w, flag, arg_w, arg, d->help);
        if (d->def[0] && !d->secret) fprintf(out, " [default: %s]", d->def);
        fputc('\n', out);
    }
}

void opts_log(const inferd_opts *o)
{
    char line[2048];
    size_t n = 0;
    for (int i = 0; i < N_OPTS && n < sizeof line; i++) {
        const opt_def *d = &opt_table[i];
        const char *field = (const char *)o + d->offset;
        char v[OPTS_STR_MAX + 8];
        switch (d->type) {
        case OPT_INT: snprintf(v, sizeof v, "%d", *(const int *)field); break;
        case OPT_FLOAT: snprintf(v, sizeof v, "%g", *(const double *)field); break;
        case OPT_BOOL: snprintf(v, sizeof v, "%s", *(const bool *)field ? "true" : "false"); break;
        case OPT_ENUM: snprintf(v, sizeof v, "%s", d->choices[*(const int *)field]); break;
        case OPT_STRING:
            snprintf(v, sizeof v, "\"%s\"", d->secret && field[0] ? "***" : field);
            break;
        }
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%s=%s", i ? " " : "", d->name, v);
    }
    log_info("config: %s", line);
}
