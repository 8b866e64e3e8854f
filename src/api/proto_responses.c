/* proto_responses.c - the /v1/responses row of the protocol table (api_proto.h): the body is
 * translated into the chat body that means the same (api_responses.c) and validated as one;
 * the reply is a response object, or streamed as its typed events.  The row keeps what the
 * response repeats of the request and the event stream's state. */
#include "api_proto.h"

#include <stdlib.h>
#include <string.h>

#include "api_responses.h"

typedef struct resp_state {
    api_resp_req rq;     /* the request's fields a response object repeats */
    api_resp_stream rs;  /* streaming: the output items so far */
} resp_state;

/* Errors of the translated body are renamed to what the client sent. */
static int resp_parse(const char *body, size_t len, int n_vocab, api_request *rq, void **state, api_error *e)
{
    *state = NULL;
    resp_state *st = calloc(1, sizeof *st);
    if (!st) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    char *chat = NULL;
    if (api_responses_translate(body, len, &chat, &st->rq, e) != 0) {
        free(st);
        return -1;
    }
    int rc = api_request_parse(API_CHAT, chat, strlen(chat), n_vocab, rq, e);
    free(chat);
    if (rc != 0) {
        api_responses_rename_error(e);
        api_resp_req_free(&st->rq);
        free(st);
        return -1;
    }
    rq->kind = API_RESPONSES;
    rq->ignored_tools = st->rq.ignored_tools; /* lives in the row's state, freed after rq */
    *state = st;
    return 0;
}

static void resp_free_state(void *state)
{
    resp_state *st = state;
    if (!st) return;
    api_resp_req_free(&st->rq);
    api_resp_stream_free(&st->rs);
    free(st);
}

/* response.created, response.in_progress */
static void resp_open(api_reply *r, const api_span *echo, int n_choices)
{
    (void)echo;
    (void)n_choices;
    resp_state *st = r->state;
    api_resp_stream_begin(&st->rs, &r->meta, &st->rq, r->out);
}

/* Items open and close as reasoning, text and calls arrive; the finish is the last event's. */
static void resp_delta(api_reply *r, const api_delta *d)
{
    resp_state *st = r->state;
    api_resp_stream_reasoning(&st->rs, d->reasoning, d->reasoning_len);
    api_resp_stream_text(&st->rs, d->text, d->text_len);
    for (int k = 0; k < d->n_calls; k++) api_resp_stream_call(&st->rs, &d->calls[k]);
}

/* response.completed, response.incomplete or response.failed; no [DONE] in this protocol. */
static void resp_close(api_reply *r, const api_end *end)
{
    resp_state *st = r->state;
    api_resp_stream_end(&st->rs, end->truncated, end->usage, end->failed);
}

/* One choice (the API has no n). */
static char *resp_whole(const api_reply *r, const api_choice *ch, int n, const api_usage *u)
{
    (void)n;
    const resp_state *st = r->state;
    api_resp_out o = {.text = ch->text, .text_len = ch->text_len, .reasoning = ch->reasoning,
                      .reasoning_len = ch->reasoning_len, .calls = ch->calls, .n_calls = ch->n_calls,
                      .incomplete = ch->finish_reason && strcmp(ch->finish_reason, "length") == 0};
    return api_responses_json(&r->meta, &st->rq, &o, u);
}

const api_protocol proto_responses = {
    .name = "responses",
    .kind = API_RESPONSES,
    .id_prefix = "resp_",
    .prompt_param = "input",
    .messages = true,
    .parse = resp_parse,
    .free_state = resp_free_state,
    .rename_error = api_responses_rename_error,
    .open = resp_open,
    .delta = resp_delta,
    .close = resp_close,
    .whole = resp_whole,
    .error = api_error_json,
};
