/* opts.h - the server's configuration: one table describes every option (name, type, where it
 * lives in struct inferd_opts, default, help).  The command line and the config file are two
 * front ends over the same table: every `--long-name VALUE` flag is also the config key
 * `long-name = VALUE`, and both go through opts_set(). */
#ifndef INFERD_OPTS_H
#define INFERD_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "backend/backend.h"

typedef enum opts_log_format { OPTS_LOG_TEXT = 0, OPTS_LOG_JSON } opts_log_format;

#define OPTS_STR_MAX 1024

typedef struct inferd_opts {
    char model[OPTS_STR_MAX];
    char model_alias[256];  /* "" = basename of model */
    char host[256];
    int port;
    int parallel;           /* most sequences running at once */
    int ctx_size;           /* most tokens of one request; 0 = min(model context, 4096) */
    int kv_cache_size;      /* MiB of KV blocks; 0 = CPU: parallel x ctx_size tokens, GPU: free memory */
    bool prefix_cache;      /* automatic prefix caching */
    bool deterministic;     /* batch-invariant kernels (engine_config.deterministic) */
    bool special_in_content; /* control-token texts in chat messages become control tokens */
    int batch_tokens;
    int queue_size;
    int embed_step_tokens;
    int max_head_passes;    /* sched_config.max_head_passes: 0 = parallel, -1 = strict FIFO */
    int max_body;           /* bytes */
    char api_key[256];      /* "" = no authentication */
    char api_key_file[OPTS_STR_MAX]; /* "" = none; else api_key is read from it at start */
    int threads;            /* 0 = all cores */
    int http_threads;       /* libmicrohttpd worker threads, and as many prep threads */
    int max_connections;    /* open HTTP connections in all */
    int max_connections_per_ip; /* 0: no per-address limit */
    int timeout;            /* seconds for a request's head and body (and idle keep-alive) */
    int stream_timeout;     /* seconds of client inactivity while a response is answered */
    int device;             /* engine_device (backend/backend.h) */
    int gpu;                /* CUDA ordinal */
    int tensor_parallel;    /* GPUs one model is split across (1: today's single-GPU path) */
    char chat_template[64]; /* "" = detect from the model */
    char chat_template_file[OPTS_STR_MAX]; /* "" = the GGUF's own; else a Jinja file that overrides it */
    int reasoning_format;   /* opts_reasoning_format */
    int pooling;            /* 0: the model's pooling_type; else engine_pooling + 1 (--pooling) */
    int log_level;          /* log_level */
    int log_format;         /* opts_log_format */
    char log_file[OPTS_STR_MAX];
    double shutdown_timeout; /* seconds */
    bool metrics;           /* serve /metrics */
    bool always_include_usage; /* streamed chats end with usage even without stream_options */
    int hosted_tools;       /* opts_hosted_tools */
    int default_max_tokens; /* a request's completion limit when it sets none; 0: up to the context */
    int speculative;        /* opts_speculative */
    int draft_max;          /* most tokens drafted per request and step */
    int draft_min;          /* shorter drafts are not verified */
    double draft_p_min;     /* --speculative draft: stop a draft below this draft-model probability */
    char model_draft[OPTS_STR_MAX]; /* --speculative draft: the draft model's GGUF */
    char config[OPTS_STR_MAX];
} inferd_opts;

/* --reasoning-format: auto splits <think> blocks when the template or vocabulary has them. */
typedef enum opts_reasoning_format { OPTS_REASONING_AUTO = 0, OPTS_REASONING_NONE, OPTS_REASONING_DEEPSEEK } opts_reasoning_format;

/* --hosted-tools: what a request offering tools only OpenAI can run (web_search, ...) gets. */
typedef enum opts_hosted_tools { OPTS_HOSTED_IGNORE = 0, OPTS_HOSTED_REFUSE } opts_hosted_tools;

/* --speculative: who drafts the tokens a decode step verifies (mtp: not built yet). */
typedef enum opts_speculative { OPTS_SPEC_OFF = 0, OPTS_SPEC_NGRAM, OPTS_SPEC_DRAFT, OPTS_SPEC_MTP } opts_speculative;

/* Fill every field with its table default. */
void opts_defaults(inferd_opts *o);

/* Set one option by its long name (without dashes), value as text. bool accepts
 * true/false/1/0/yes/no/on/off.  Returns 0, or -1 with a message naming the key in err. */
int opts_set(inferd_opts *o, const char *key, const char *value, char *err, size_t errlen);

/* Parse argv (argv[0] is skipped): --name VALUE, --name=VALUE, -s VALUE, and for bools
 * --name / --no-name.  Returns 0, 1 when --help was given (help already printed to stdout),
 * or -1 with a message in err. */
int opts_parse_argv(inferd_opts *o, int argc, char **argv, char *err, size_t errlen);

void opts_print_help(FILE *out);

/* Log the effective configuration (one line per option, secrets masked). */
void opts_log(const inferd_opts *o);

/* Option metadata for front ends (the config file parser): number of options and the long
 * name of option i. */
int opts_count(void);
const char *opts_name(int i);

#endif
