/* proto_completions.c - the /v1/completions row of the protocol table (api_proto.h): legacy
 * completions, a prompt (or several) as sent, chunks of "text" with the legacy logprobs. */
#include "api_proto.h"

static int cmpl_parse(const char *body, size_t len, int n_vocab, api_request *rq, void **state, api_error *e)
{
    *state = NULL;
    return api_request_parse(API_COMPLETIONS, body, len, n_vocab, rq, e);
}

/* With echo, each choice's stream starts with its prompt. */
static void cmpl_open(api_reply *r, const api_span *echo, int n_choices)
{
    for (int i = 0; i < n_choices; i++) {
        if (!echo[i].text) continue;
        api_choice ac = {.index = i, .text = echo[i].text, .text_len = echo[i].len};
        api_proto_chunk(r, &ac);
    }
}

static void cmpl_delta(api_reply *r, const api_delta *d)
{
    bool lp = r->rq->logprobs >= 0;
    if (d->text_len || (lp && d->n_tokens)) {
        api_choice ac = {.index = d->index, .text = d->text, .text_len = d->text_len, .tokens = d->tokens,
                         .n_tokens = d->n_tokens, .logprobs = lp, .text_offset = d->text_offset};
        api_proto_chunk(r, &ac);
    }
    api_proto_finish_chunk(r, d);
}

const api_protocol proto_completions = {
    .name = "completions",
    .kind = API_COMPLETIONS,
    .id_prefix = "cmpl-",
    .prompt_param = "prompt",
    .messages = false,
    .parse = cmpl_parse,
    .open = cmpl_open,
    .delta = cmpl_delta,
    .close = api_proto_sse_close,
    .whole = api_proto_choices_json,
    .error = api_error_json,
};
