/* proto_messages.c - the /v1/messages row of the protocol table (api_proto.h): Anthropic's
 * Messages API.  The body is translated into the chat body that means the same
 * (api_messages.c) and validated as one; the reply is a `message` object, or streamed as its
 * typed events; errors are in Anthropic's shape.  The row keeps the event stream's state and
 * the finish reason the message_delta event reports.
 *
 * message_start waits for the first output: Anthropic's carries the prompt's usage
 * (input_tokens, cache_read_input_tokens), and how much of the prompt the prefix cache held is
 * known only once the scheduler admitted the request. */
#include "api_proto.h"

#include <stdlib.h>
#include <string.h>

#include "api_messages.h"

typedef struct msg_state {
    api_msg_stream ms;
    bool started;              /* message_start went out */
    const char *finish_reason; /* streaming: the choice's, once it finished */
    int stop_string;           /* streaming: api_delta.stop_string */
} msg_state;

/* The stop sequence that ended the reply (stop_string: api_delta's), or NULL. */
static const char *stop_sequence(const api_request *rq, int stop_string)
{
    return stop_string > 0 && stop_string <= rq->n_stop ? rq->stop[stop_string - 1] : NULL;
}

/* Errors of the translated body are renamed to what the client sent. */
static int msg_parse(const char *body, size_t len, int n_vocab, api_request *rq, void **state, api_error *e)
{
    *state = NULL;
    char *chat = NULL;
    if (api_messages_translate(body, len, &chat, e) != 0) return -1;
    int rc = api_request_parse(API_CHAT, chat, strlen(chat), n_vocab, rq, e);
    free(chat);
    if (rc != 0) {
        api_messages_rename_error(e);
        return -1;
    }
    if (!(*state = calloc(1, sizeof(msg_state)))) {
        api_request_free(rq);
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    rq->kind = API_MESSAGES;
    return 0;
}

static void msg_free_state(void *state) { free(state); }

/* Nothing yet: message_start waits for the prompt's usage (above). */
static void msg_open(api_reply *r, const api_span *echo, int n_choices)
{
    (void)r;
    (void)echo;
    (void)n_choices;
}

/* message_start and a ping, once: the prompt's usage, no output yet (however many tokens the
 * first delta brings, which depends on when it was taken). */
static void start(api_reply *r, msg_state *st, const api_usage *u)
{
    if (st->started) return;
    st->started = true;
    api_usage prompt = {u ? u->prompt_tokens : 0, u ? u->cached_tokens : 0, 0};
    api_msg_stream_begin(&st->ms, &r->meta, r->out, &prompt);
}

/* Blocks open and close as thinking, text and calls arrive. */
static void msg_delta(api_reply *r, const api_delta *d)
{
    msg_state *st = r->state;
    start(r, st, &d->usage);
    api_msg_stream_thinking(&st->ms, d->reasoning, d->reasoning_len);
    api_msg_stream_text(&st->ms, d->text, d->text_len);
    for (int k = 0; k < d->n_calls; k++) api_msg_stream_call(&st->ms, &d->calls[k]);
    if (d->finish_reason) { /* a static string */
        st->finish_reason = d->finish_reason;
        st->stop_string = d->stop_string;
    }
}

/* message_delta, message_stop; or an error event. */
static void msg_close(api_reply *r, const api_end *end)
{
    msg_state *st = r->state;
    start(r, st, end->usage); /* a request that failed before its first output */
    api_msg_stream_end(&st->ms, st->finish_reason, stop_sequence(r->rq, st->stop_string), end->usage, end->failed);
}

/* One choice (the API has no n). */
static char *msg_whole(const api_reply *r, const api_choice *ch, int n, const api_usage *u)
{
    (void)n;
    api_msg_out o = {.text = ch->text, .text_len = ch->text_len, .thinking = ch->reasoning,
                     .thinking_len = ch->reasoning_len, .calls = ch->calls, .n_calls = ch->n_calls,
                     .finish_reason = ch->finish_reason, .stop_sequence = stop_sequence(r->rq, ch->stop_string)};
    return api_messages_json(&r->meta, &o, u);
}

const api_protocol proto_messages = {
    .name = "messages",
    .kind = API_MESSAGES,
    .id_prefix = "msg_",
    .prompt_param = "messages",
    .messages = true,
    .parse = msg_parse,
    .free_state = msg_free_state,
    .rename_error = api_messages_rename_error,
    .open = msg_open,
    .delta = msg_delta,
    .close = msg_close,
    .whole = msg_whole,
    .error = api_messages_error_json,
};
