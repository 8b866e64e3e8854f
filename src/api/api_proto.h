/* api_proto.h - one encoder per protocol, behind one table.
 *
 * http/gen.c runs every generation the same way: parse the body, build the prompt, submit the
 * scheduler requests, then hand what comes out to the protocol's row, which writes it in the
 * protocol's own shape (SSE chunks, typed events, one body).  gen.c never asks which protocol
 * it serves; a row never sees a socket (it writes into buffers).
 *
 * The table (docs/architecture.md, "The protocol table"):
 *   proto_completions  /v1/completions        proto_completions.c
 *   proto_chat         /v1/chat/completions   proto_chat.c
 *   proto_responses    /v1/responses          proto_responses.c
 *   proto_messages     /v1/messages           proto_messages.c
 *   proto_embeddings   /v1/embeddings         proto_embeddings.c (no stream: parse, whole, error)
 *   proto_rerank       /v1/rerank, /rerank    proto_rerank.c (likewise)
 * A new protocol is one file defining its row, its line below and its route in
 * http/server.c. */
#ifndef INFERD_API_PROTO_H
#define INFERD_API_PROTO_H

#include <stdbool.h>
#include <stddef.h>

#include "api_encode.h"
#include "api_error.h"
#include "api_request.h"
#include "base/bytebuf.h"
#include "text/chat_parse.h"

typedef struct api_protocol api_protocol;

/* A piece of text (NULL/0: none). */
typedef struct api_span {
    const char *text;
    size_t len;
} api_span;

/* One choice's new output, as gen.c took it from the scheduler (and, for a chat whose reply
 * may hold calls or thinking, split by the choice's chat_parse parser). */
typedef struct api_delta {
    int index;               /* the choice */
    const char *text;        /* content */
    size_t text_len;
    size_t text_offset;      /* bytes of this choice's text written before (echo included) */
    const char *reasoning;
    size_t reasoning_len;
    const chat_tool_call *calls; /* pieces of calls (chat_parse.h: whole calls unless streamed) */
    int n_calls;
    const engine_result *tokens; /* with logprobs: the tokens behind the text */
    int n_tokens;
    const char *finish_reason;   /* "stop", "length", "tool_calls"; NULL: the choice goes on */
    int stop_string;             /* "stop" by a stop string: 1 + its index in the request's stop; else 0 */
    api_usage usage;             /* the choice's so far: its prompt as admitted (cached tokens known) */
} api_delta;

/* How a stream ends. */
typedef struct api_end {
    const api_usage *usage;
    const api_error *failed; /* why the request failed after its 200 went out; NULL: it did not */
    bool truncated;          /* a choice stopped at max_tokens */
} api_end;

/* One request's reply as its protocol writes it; gen.c owns it. */
typedef struct api_reply {
    const api_request *rq;
    api_meta meta;
    api_vocab vocab;
    bytebuf *out; /* streaming: the bytes for the client */
    void *state;  /* the row's own, made by its parse (NULL when it keeps none) */
    int embd_width; /* embeddings with pooling none: the model's width (one row per token); else 0 */
} api_reply;

struct api_protocol {
    const char *name;         /* for logs and docs: "chat.completions" */
    api_kind kind;            /* the request's shape for api_request_parse and api_encode */
    const char *id_prefix;    /* of the reply's id: "chatcmpl-" */
    const char *prompt_param; /* the field a prompt that does not fit is blamed on */
    bool messages;            /* the prompt is a conversation for the chat template (else prompts as sent) */
    /* body[len] is NUL.  0 with *rq (and the row's *state) filled, or -1 with e (nothing to free). */
    int (*parse)(const char *body, size_t len, int n_vocab, api_request *rq, void **state, api_error *e);
    void (*free_state)(void *state);
    /* An error found after parse (the chat template, the tool-call grammar) renamed to the
     * fields the client sent (Responses: response_format -> text.format); NULL: as it is. */
    void (*rename_error)(api_error *e);
    /* Streaming: the first bytes (echo[i]: what choice i repeats of its prompt), one choice's
     * new output, the last bytes.  NULL for a row that never streams (embeddings, rerank:
     * their parse never sets stream). */
    void (*open)(api_reply *r, const api_span *echo, int n_choices);
    void (*delta)(api_reply *r, const api_delta *d);
    void (*close)(api_reply *r, const api_end *end);
    /* Not streaming: the whole body (malloc'd; NULL when out of memory). */
    char *(*whole)(const api_reply *r, const api_choice *ch, int n, const api_usage *u);
    /* The body of a refused or failed request (malloc'd; NULL when out of memory). */
    char *(*error)(const api_error *e);
};

/* The rows. */
extern const api_protocol proto_completions; /* proto_completions.c */
extern const api_protocol proto_chat;        /* proto_chat.c */
extern const api_protocol proto_responses;   /* proto_responses.c */
extern const api_protocol proto_messages;    /* proto_messages.c */
extern const api_protocol proto_embeddings;  /* proto_embeddings.c */
extern const api_protocol proto_rerank;      /* proto_rerank.c */

/* What the two OpenAI chat/completions rows share (api_proto.c): a chunk as one SSE event,
 * the end of their streams (an error or the usage chunk, then [DONE]), the choices body. */
void api_proto_chunk(api_reply *r, const api_choice *ac);
void api_proto_finish_chunk(api_reply *r, const api_delta *d);
void api_proto_sse_close(api_reply *r, const api_end *end);
char *api_proto_choices_json(const api_reply *r, const api_choice *ch, int n, const api_usage *u);

#endif
