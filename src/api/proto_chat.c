/* proto_chat.c - the /v1/chat/completions row of the protocol table (api_proto.h): a
 * conversation in, "chat.completion" out, or streamed as "chat.completion.chunk" deltas of
 * content, reasoning_content and tool_calls. */
#include "api_proto.h"

static int chatcmpl_parse(const char *body, size_t len, int n_vocab, api_request *rq, void **state, api_error *e)
{
    *state = NULL;
    return api_request_parse(API_CHAT, body, len, n_vocab, rq, e);
}

/* Each choice's stream starts with the assistant role. */
static void chatcmpl_open(api_reply *r, const api_span *echo, int n_choices)
{
    (void)echo;
    for (int i = 0; i < n_choices; i++) {
        api_choice ac = {.index = i, .text = "", .role = true};
        api_proto_chunk(r, &ac);
    }
}

/* Content and reasoning in one chunk, then a chunk per piece of a call (its first with id and
 * name, each with the arguments' next fragment, chat_parse.h), then the finish. */
static void chatcmpl_delta(api_reply *r, const api_delta *d)
{
    bool lp = r->rq->logprobs >= 0;
    if (d->text_len || d->reasoning_len || (lp && d->n_tokens)) {
        api_choice ac = {.index = d->index, .text = d->text ? d->text : "", .text_len = d->text_len,
                         .reasoning = d->reasoning, .reasoning_len = d->reasoning_len, .tokens = d->tokens,
                         .n_tokens = d->n_tokens, .logprobs = lp};
        api_proto_chunk(r, &ac);
    }
    for (int k = 0; k < d->n_calls; k++) {
        if (!d->calls[k].id && !d->calls[k].arguments[0]) continue; /* a bare last piece: nothing to say */
        api_choice ac = {.index = d->index, .text = "", .calls = &d->calls[k], .n_calls = 1};
        api_proto_chunk(r, &ac);
    }
    api_proto_finish_chunk(r, d);
}

const api_protocol proto_chat = {
    .name = "chat.completions",
    .kind = API_CHAT,
    .id_prefix = "chatcmpl-",
    .prompt_param = "messages",
    .messages = true,
    .parse = chatcmpl_parse,
    .open = chatcmpl_open,
    .delta = chatcmpl_delta,
    .close = api_proto_sse_close,
    .whole = api_proto_choices_json,
    .error = api_error_json,
};
