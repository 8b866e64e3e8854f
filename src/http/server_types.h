/* server_types.h - what a server is configured with and what it serves: the types server.h
 * exports, alone so that the server's own state (http_int.h), which endpoints.c and gen.c
 * read, does not include the server's functions: server.c calls the endpoints, the endpoints
 * never call the server. */
#ifndef INFERD_HTTP_SERVER_TYPES_H
#define INFERD_HTTP_SERVER_TYPES_H

#include <stdbool.h>
#include <stddef.h>

#include "sched/sched.h"
#include "text/chat.h"
#include "text/chat_parse.h"
#include "text/tokenizer.h"

typedef struct server server;

typedef struct server_config {
    const char *host;
    int port;          /* 0: any free port (see server_port) */
    int http_threads;
    size_t max_body;
    unsigned max_connections;        /* open connections in all; more are closed at accept */
    unsigned max_connections_per_ip; /* 0: no per-address limit */
    unsigned timeout_s;        /* a request's head and body, and an idle keep-alive connection */
    unsigned stream_timeout_s; /* inactivity allowed while a response is generated or sent */
    const char *api_key; /* NULL or "": no authentication */
    bool metrics;
    bool always_include_usage; /* streamed chats end with usage without stream_options (--always-include-usage) */
    bool refuse_hosted_tools;  /* a 400 for hosted tools (web_search, ...) instead of setting them aside */
    int default_max_tokens;    /* a chat request's completion limit when it sets none (0: up to the context) */
} server_config;

/* What /v1/models says about the model (filled by whoever loaded it). */
typedef struct server_model_card {
    const char *arch; /* "llama", "qwen2", ... */
    int n_vocab, n_ctx_train, n_embd;
    size_t weight_bytes;
} server_model_card;

/* What the API serves once loaded.  Everything must outlive the server. */
typedef struct server_model {
    server_model_card card;
    const tokenizer *tok;
    sched *s;
    chat_template_kind tmpl;   /* the built-in fallback when jinja is NULL */
    const jinja_tmpl *jinja;   /* the model's own template (or --chat-template-file) */
    const jinja_tmpl *jinja_tools; /* a tokenizer.chat_template.tool_use variant, used with tools */
    chat_syntax syntax;        /* its tool-call markup */
    bool reasoning;            /* split <think> blocks into reasoning_content */
    bool special_in_content;   /* control-token texts in messages are control tokens (not text) */
    const char *alias;
    /* --deterministic: the responses' system_fingerprint, which names what the guarantee holds
     * for (build, backend, model) and ends in "_det"; NULL: not deterministic (null in JSON) */
    const char *fingerprint;
    int ctx_per_slot;
    /* How /v1/embeddings pools (--pooling, else the GGUF's pooling_type), or with rank what
     * /v1/rerank scores: the last token's logits of rank_ids (Qwen3-Reranker's "yes" against
     * "no"); -1: neither is served.  An embedding model (its file declares a pooling, or an
     * encoder) generates nothing (text false); a text model given --pooling serves both, its
     * embeddings packed into the same batches as its chats. */
    int pooling;
    bool text;
    int32_t rank_ids[2];
    int max_batch_tokens; /* the longest input an embedding may have (it runs in one step) */
    bool dims_centred;    /* `dimensions` centres before the cut (arch_desc.dims_centred) */
} server_model;

#endif
