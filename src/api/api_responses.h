/* api_responses.h - OpenAI's Responses API (POST /v1/responses) on the chat machinery.
 *
 * A request is translated into the chat-completions body that means the same (instructions
 * -> a system message, input items -> messages, function_call / function_call_output items ->
 * assistant tool_calls / tool messages, flat function tools -> chat tools, a namespace tool ->
 * its functions named "ns.name", text.format -> response_format; hosted tools -- web_search,
 * file_search, code_interpreter, computer use, image_generation, mcp -- are set aside and
 * named in api_resp_req.ignored_tools), which api_request_parse then validates like any chat request; the reply
 * is written as a response object, or streamed as the typed events the OpenAI SDKs accumulate
 * (response.created ... response.completed).  Nothing is stored: previous_response_id,
 * conversation, background and item references are refused.
 *
 * Pure, like api_request and api_encode: no model, no sockets. */
#ifndef INFERD_API_RESPONSES_H
#define INFERD_API_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>

#include "api_encode.h"
#include "api_request.h"
#include "base/bytebuf.h"
#include "text/chat_parse.h"

/* The request's fields a response object repeats, as the client sent them: JSON texts named
 * as the fields (NULL: not sent, the response says the default). */
#define API_RESP_ECHOED(X)                                                                       \
    X(instructions) X(tools) X(tool_choice) X(text) X(metadata) X(user) X(temperature) X(top_p)   \
    X(max_output_tokens)
#define API_RESP_ECHO_MEMBER(name) char *name;
typedef struct api_resp_req {
    API_RESP_ECHOED(API_RESP_ECHO_MEMBER)
    bool parallel_tool_calls; /* default true */
    char *namespaces;    /* the namespace tools' names, each with its dot: "a.b." (NULL: none) */
    char *ignored_tools; /* the hosted tools set aside: "web_search, mcp" (NULL: none) */
} api_resp_req;

/* body[len] must be NUL.  0 with *chat_body (malloc'd JSON for api_request_parse(API_CHAT))
 * and *rq filled, or -1 with a 400 naming the Responses parameter (nothing to free). */
int api_responses_translate(const char *body, size_t len, char **chat_body, api_resp_req *rq, api_error *e);
void api_resp_req_free(api_resp_req *rq);
/* An error api_request_parse found in a translated body, renamed to what the client sent
 * (messages -> input, max_completion_tokens -> max_output_tokens, response_format -> text). */
void api_responses_rename_error(api_error *e);

/* The whole reply of a request that was not streamed. */
typedef struct api_resp_out {
    const char *text, *reasoning;
    size_t text_len, reasoning_len;
    const chat_tool_call *calls;
    int n_calls;
    bool incomplete; /* stopped at max_output_tokens */
} api_resp_out;

/* m: the id ("resp_..."), model and time every body of one request shares. */
char *api_responses_json(const api_meta *m, const api_resp_req *rq, const api_resp_out *o, const api_usage *u);

/* The output items that take deltas: text, reasoning, a function call's arguments. */
typedef enum api_resp_item { RESP_ITEM_NONE = 0, RESP_ITEM_MESSAGE, RESP_ITEM_REASONING, RESP_ITEM_CALL } api_resp_item;

/* A streamed reply: output items open and close as text, reasoning and calls arrive. */
typedef struct api_resp_stream {
    const api_meta *m;
    const api_resp_req *rq;
    bytebuf *out;
    int seq;            /* sequence_number of the next event */
    api_resp_item open; /* the item taking deltas */
    int open_index;     /* its output_index */
    char open_id[48];
    bytebuf open_text;  /* its text (a call: its arguments) so far */
    char *call_id, *call_name; /* a function_call item: the call's */
    struct cJSON *done; /* the finished items, for the final response object */
    bool failed;        /* out of memory: the stream is cut */
} api_resp_stream;

void api_resp_stream_begin(api_resp_stream *s, const api_meta *m, const api_resp_req *rq, bytebuf *out);
void api_resp_stream_text(api_resp_stream *s, const char *text, size_t len);
void api_resp_stream_reasoning(api_resp_stream *s, const char *text, size_t len);
/* A piece of a call (chat_parse.h): its first opens a function_call item, each fragment is a
 * response.function_call_arguments.delta, its last closes the item. */
void api_resp_stream_call(api_resp_stream *s, const chat_tool_call *c);
/* The last event: response.completed, response.incomplete, or response.failed with err. */
void api_resp_stream_end(api_resp_stream *s, bool incomplete, const api_usage *u, const api_error *err);
void api_resp_stream_free(api_resp_stream *s);

#endif
