/* api_encode.h - OpenAI-shaped JSON bodies and SSE framing.
 *
 * Pure: token strings (for logprobs) come through an api_vocab callback, so this module can be
 * tested without a model.  Every function returns a malloc'd NUL-terminated string (NULL only
 * when out of memory). */
#ifndef INFERD_API_ENCODE_H
#define INFERD_API_ENCODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sched/sched.h"
#include "api_request.h"
#include "base/bytebuf.h"
#include "text/chat_parse.h"

typedef struct api_vocab {
    /* The bytes token id stands for in output text: length (may exceed cap), -1 if invalid. */
    int (*token_bytes)(void *ctx, int32_t id, char *buf, int cap);
    void *ctx;
} api_vocab;

/* What every body of one request shares. */
typedef struct api_meta {
    api_kind kind;
    const char *id; /* "cmpl-..." / "chatcmpl-..." */
    const char *model;
    long long created;
    const char *fingerprint; /* system_fingerprint, NULL: null */
    bool usage_null; /* streaming with include_usage: every chunk carries "usage": null */
} api_meta;

/* One choice (or one chunk of it). */
typedef struct api_choice {
    int index;
    const char *text;
    size_t text_len;
    const engine_result *tokens; /* with logprobs: the tokens behind text, else NULL */
    int n_tokens;
    bool logprobs;          /* emit a logprobs object (else null) */
    size_t text_offset;     /* completions: offset of text within the whole choice text */
    const char *finish_reason; /* NULL -> null */
    bool role;              /* chat chunk: delta carries role "assistant" */
    /* chat: the reply as chat_parse split it */
    const char *reasoning;  /* reasoning_content (NULL/0: none) */
    size_t reasoning_len;
    /* message: every call; chunk: pieces of calls (chat_tool_call: a call's first piece has
     * its id and name, every piece an argument fragment) */
    const chat_tool_call *calls;
    int n_calls;
    bool content_null;      /* message: content is null (the reply was only tool calls) */
    int stop_string;        /* finish "stop" by a stop string: 1 + its index in the request's stop; else 0 */
    const float *embedding; /* embeddings / rerank: the pooled answer (n_embedding floats) */
    size_t n_embedding;
} api_choice;

typedef struct api_usage {
    int prompt_tokens;
    int cached_tokens; /* of prompt_tokens, read from the prefix cache (prompt_tokens_details) */
    int completion_tokens;
} api_usage;

/* {"error":{"message","type","param","code"}}; also sent as an SSE event when a stream fails
 * after its 200 went out. */
char *api_error_json(const api_error *e);
/* Whole non-streaming response. */
char *api_response_json(const api_meta *m, const api_choice *ch, int n, const api_usage *u,
                        const api_vocab *v);
/* One streaming chunk with one choice. */
char *api_chunk_json(const api_meta *m, const api_choice *ch, const api_vocab *v);
/* The final streaming chunk with "choices": [] and usage. */
char *api_usage_chunk_json(const api_meta *m, const api_usage *u);

/* SSE: "data: JSON\n\n" and "data: [DONE]\n\n". */
void api_sse_data(bytebuf *b, const char *json);
void api_sse_done(bytebuf *b);

/* Copy s into a new string with every invalid UTF-8 sequence replaced by U+FFFD. */
char *api_utf8_sanitize(const char *s, size_t len, size_t *out_len);

const char *api_finish_reason(sched_finish f); /* "stop", "length" or NULL */

#endif
