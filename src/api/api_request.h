/* api_request.h - parse and validate the JSON body of /v1/completions and /v1/chat/completions
 * into a plain struct, with OpenAI-shaped errors (status, type, param, code, message).
 *
 * Pure: no model, no tokenizer, no sockets; the only thing it needs to know about the model is
 * its vocabulary size (token ids in prompts and logit_bias are checked against it).  Fields
 * this server does not know are ignored, as OpenAI's own API does. */
#ifndef INFERD_API_REQUEST_H
#define INFERD_API_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api_error.h"
#include "text/chat.h"
#include "sched/sched.h"

/* API_RESPONSES: /v1/responses, parsed as the chat request api_responses.h translates it to;
 * API_MESSAGES: Anthropic's /v1/messages, likewise (api_messages.h). */
/* API_EMBEDDINGS, API_RERANK: /v1/embeddings and /v1/rerank (api_embed.h): every prompt is one
 * input to embed, or one (query, document) pair to score; nothing is generated. */
typedef enum api_kind {
    API_COMPLETIONS = 0,
    API_CHAT = 1,
    API_RESPONSES = 2,
    API_MESSAGES = 3,
    API_EMBEDDINGS = 4,
    API_RERANK = 5,
} api_kind;

#define API_MAX_N 128       /* choices per prompt */
#define API_MAX_CHOICES 256 /* prompts x n */
#define API_MAX_STOP_LEN 256

/* One prompt of a completions request: text (to tokenize) or token ids, never both. */
typedef struct api_prompt {
    char *text; /* NUL-terminated, NULL when ids are given */
    size_t text_len;
    int32_t *ids;
    int n_ids;
} api_prompt;

/* tool_choice: "auto" (or absent), "none", "required", or one named function. */
typedef enum api_tool_choice { API_TOOL_AUTO = 0, API_TOOL_NONE, API_TOOL_REQUIRED, API_TOOL_NAMED } api_tool_choice;

#define API_MAX_TOOLS 128
/* Items of one array of a request (messages, content parts, an assistant's tool_calls): each
 * costs a worker some parsing and the template some rendering, so a body of tiny items is
 * refused with a 400 instead of keeping a worker busy. */
#define API_MAX_ITEMS 2048

typedef struct api_request {
    api_kind kind;
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    bool echo;          /* completions */
    bool ignore_eos;
    bool speculative; /* "speculative": false opts out of the server's speculative decoding */
    int n;
    int max_tokens; /* 0: not given (completions: 16; chat: up to the context) */
    int logprobs;   /* -1: none; else how many alternatives per token */
    bool has_seed;
    sampling_params sp; /* bias_ids/bias_vals point into this request */
    char *stop[SCHED_MAX_STOP];
    int n_stop;
    int32_t *bias_ids;
    float *bias_vals;
    int n_bias;
    api_prompt *prompts; /* completions */
    int n_prompts;
    chat_msg *msgs; /* chat: role points to a static string, content is owned */
    int n_msgs;
    /* chat, for the model's own Jinja template: a JSON object with "messages" as Hugging Face
     * templates expect them (content parts joined into text, content null as "", developer -> system, assistant
     * tool_calls[].function.arguments parsed from their JSON strings into objects), "tools"
     * (unless tool_choice is "none") and the members of chat_template_kwargs. */
    char *tmpl_ctx;
    char *tools_json; /* the validated `tools` array as JSON, NULL when none */
    int n_tools;
    char **tool_names; /* [n_tools]: the offered functions, the only names a reply may call */
    api_tool_choice tool_choice;
    char tool_choice_name[128]; /* API_TOOL_NAMED */
    bool parallel_tool_calls;   /* default true */
    const char *ignored_tools; /* Responses: the hosted tools set aside ("web_search, mcp"); the row's */
    struct grammar *grammar; /* structured output (api_constraint.h), or NULL; a reference */
    char *format_schema;     /* the JSON schema the answer must match, when grammar is one (else NULL) */
    /* embeddings and rerank (api_embed.c) */
    int dimensions;         /* embeddings: 0, or the leading dimensions kept (renormalised) */
    bool dims_centred;      /* set by the server: the model's truncation centres the whole vector first */
    bool base64;            /* embeddings: encoding_format "base64" */
    int top_n;              /* rerank: the best results kept (0: all) */
    bool return_documents;  /* rerank: each result carries its document's text */
    char **documents;       /* rerank: the documents' texts [n_prompts] */
} api_request;

/* body[len] must be NUL (the parser refuses anything after the JSON value).
 * Returns 0, or -1 with *err filled (status 400 for every validation failure). On failure
 * *out holds nothing to free. */
int api_request_parse(api_kind kind, const char *body, size_t len, int n_vocab,
                      api_request *out, api_error *err);
void api_request_free(api_request *r);
/* The template context ctx_json with every tool function given a "description" ("" where it had
 * none): gpt-oss's template writes "// " + description and, as Python's jinja2 does, refuses a
 * tool without one, where OpenAI's API takes such tools (the SDKs' zod helpers send none).
 * Malloc'd, or NULL when memory ran out or ctx_json is not an object. */
char *api_tmpl_ctx_describe_tools(const char *ctx_json);

/* `field` of obj as prompts: "text" | ["text", ...] | [id, ...] | [[id, ...], ...], into
 * r->prompts (at most API_MAX_CHOICES / r->n of them).  0, or -1 with e naming the field. */
struct cJSON;
int api_request_read_prompts(const struct cJSON *obj, const char *field, int n_vocab, api_request *r, api_error *e);

#endif
