/* api_messages.h - Anthropic's Messages API (POST /v1/messages) on the chat machinery.
 *
 * A request is translated into the chat-completions body that means the same (system -> a
 * system message, content blocks -> text, tool_use blocks -> assistant tool_calls,
 * tool_result blocks -> tool messages, input_schema tools -> function tools, tool_choice
 * any/tool -> required/named, thinking -> the template's enable_thinking switch, max_tokens ->
 * max_completion_tokens), which api_request_parse then validates like any chat request; the
 * reply is written as a `message` object, or streamed as the typed events Anthropic's SDKs
 * accumulate (message_start ... message_stop).  Errors are {"type":"error","error":{...}}.
 * What this server cannot do (images, documents, server tools, MCP servers) is a 400 naming it.
 *
 * Pure, like api_request and api_encode: no model, no sockets. */
#ifndef INFERD_API_MESSAGES_H
#define INFERD_API_MESSAGES_H

#include <stdbool.h>
#include <stddef.h>

#include "api_encode.h"
#include "api_request.h"
#include "base/bytebuf.h"
#include "text/chat_parse.h"

/* body[len] must be NUL.  0 with *chat_body (malloc'd JSON for api_request_parse(API_CHAT)),
 * or -1 with a 400 naming the Messages parameter (nothing to free). */
int api_messages_translate(const char *body, size_t len, char **chat_body, api_error *e);
/* The same for a POST /v1/messages/count_tokens body (max_tokens not required). */
int api_messages_translate_count(const char *body, size_t len, char **chat_body, api_error *e);
/* An error api_request_parse found in a translated body, renamed to what the client sent
 * (max_completion_tokens -> max_tokens, stop -> stop_sequences, tools[i].function.parameters
 * -> tools[i].input_schema, ...). */
void api_messages_rename_error(api_error *e);

/* {"type":"error","error":{"type":..., "message":...}}, the type from e's status as Anthropic
 * names them (400 invalid_request_error, 401 authentication_error, 404 not_found_error, 413
 * request_too_large, 429 rate_limit_error, 500 api_error, 503 overloaded_error). */
char *api_messages_error_json(const api_error *e);

/* "end_turn", "max_tokens", "tool_use" for a chat finish reason ("stop", "length",
 * "tool_calls"); "stop_sequence" for "stop" with a stop sequence. */
const char *api_messages_stop_reason(const char *finish_reason, const char *stop_sequence);

/* The whole reply of a request that was not streamed. */
typedef struct api_msg_out {
    const char *text, *thinking;
    size_t text_len, thinking_len;
    const chat_tool_call *calls;
    int n_calls;
    const char *finish_reason; /* the chat finish reason */
    const char *stop_sequence; /* the stop sequence that ended it, or NULL */
} api_msg_out;

/* m: the id ("msg_..."), model and time every body of one request shares. */
char *api_messages_json(const api_meta *m, const api_msg_out *o, const api_usage *u);

/* The content blocks that take text deltas. */
typedef enum api_msg_block { MSG_BLOCK_NONE = 0, MSG_BLOCK_TEXT, MSG_BLOCK_THINKING, MSG_BLOCK_TOOL_USE } api_msg_block;

/* A streamed reply: content blocks open and close as thinking, text and calls arrive. */
typedef struct api_msg_stream {
    const api_meta *m;
    bytebuf *out;
    api_msg_block open; /* the block taking deltas */
    int n_blocks;       /* blocks started so far (the open one included) */
    bool failed;        /* out of memory: the stream is cut */
} api_msg_stream;

/* message_start (and a ping), with the usage Anthropic sends there: the prompt's input_tokens
 * and cache_read_input_tokens (u: the prompt as admitted; NULL: zeros). */
void api_msg_stream_begin(api_msg_stream *s, const api_meta *m, bytebuf *out, const api_usage *u);
void api_msg_stream_text(api_msg_stream *s, const char *text, size_t len);
void api_msg_stream_thinking(api_msg_stream *s, const char *text, size_t len);
/* A piece of a call (chat_parse.h): its first starts a tool_use block (id, name), each
 * argument fragment is an input_json_delta, its last stops the block. */
void api_msg_stream_call(api_msg_stream *s, const chat_tool_call *c);
/* The open block's stop, message_delta (stop reason, usage) and message_stop; or, when err,
 * an error event. */
void api_msg_stream_end(api_msg_stream *s, const char *finish_reason, const char *stop_sequence, const api_usage *u,
                        const api_error *err);

#endif
