/* fuzz_request.c - request bodies of /v1/completions and /v1/chat/completions
 * (src/api/api_request.c), then the chat template every parsed chat request goes through.
 *
 * Input: a flag byte (bit 0: chat, bits 1..: vocabulary size choice; '0'/'1' in the seeds; bit 7:
 * a /v1/responses body, see responses_case; bits 7 and 6: a /v1/messages body, see
 * messages_case), then the JSON body.
 *
 * Invariants: a refused body gets a 4xx/5xx OpenAI error with a message and leaves nothing to
 * free; an accepted one holds only values inside the documented ranges (so the scheduler
 * never sees n=0, a token id outside the vocabulary, an empty stop string or prompt, ...),
 * and every accepted chat request renders in every template family. */
#include "fuzz_common.h"

#include "api/api_request.h"
#include "api/api_messages.h"
#include "api/api_responses.h"

#include <cjson/cJSON.h>

static const int vocab_sizes[] = {1, 2, 256, 32000, 151936};

static bool in_range(float x, float lo, float hi) { return x >= lo && x <= hi; }

static void check_accepted(const api_request *r, api_kind kind, int n_vocab)
{
    FZ_CHECK(r->kind == kind);
    FZ_CHECK(r->n >= 1 && r->n <= API_MAX_N);
    FZ_CHECK(r->max_tokens >= (kind == API_COMPLETIONS ? 1 : 0));
    FZ_CHECK(r->logprobs >= -1 && r->logprobs <= ENGINE_MAX_TOP_LOGPROBS);
    FZ_CHECK(r->sp.n_top_logprobs == r->logprobs);
    const sampling_params *sp = &r->sp;
    FZ_CHECK(in_range(sp->temperature, 0, 2) && sp->top_p > 0 && sp->top_p <= 1 && sp->top_k >= 0);
    FZ_CHECK(in_range(sp->min_p, 0, 1) && sp->repeat_penalty > 0 && sp->repeat_penalty <= 10);
    FZ_CHECK(in_range(sp->presence_penalty, -2, 2) && in_range(sp->frequency_penalty, -2, 2));
    FZ_CHECK(r->n_stop >= 0 && r->n_stop <= SCHED_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++) {
        size_t l = strlen(r->stop[i]);
        FZ_CHECK(l >= 1 && l <= API_MAX_STOP_LEN);
    }
    FZ_CHECK(r->n_bias >= 0 && sp->n_bias == r->n_bias && sp->bias_ids == r->bias_ids);
    for (int i = 0; i < r->n_bias; i++)
        FZ_CHECK(r->bias_ids[i] >= 0 && r->bias_ids[i] < n_vocab && in_range(r->bias_vals[i], -100, 100));

    if (kind == API_COMPLETIONS) {
        FZ_CHECK(r->n_prompts >= 1 && (long)r->n_prompts * r->n <= API_MAX_CHOICES && r->n_msgs == 0);
        for (int i = 0; i < r->n_prompts; i++) {
            const api_prompt *p = &r->prompts[i];
            FZ_CHECK((p->text != NULL) != (p->ids != NULL));
            if (p->text) FZ_CHECK(p->text_len >= 1 && p->text_len == strlen(p->text));
            if (p->ids) FZ_CHECK(p->n_ids >= 1);
            for (int k = 0; k < p->n_ids; k++) FZ_CHECK(p->ids[k] >= 0 && p->ids[k] < n_vocab);
        }
        return;
    }
    FZ_CHECK(r->n_msgs >= 1 && r->n_prompts == 0);
    for (int k = 0; k < CHAT_TMPL_COUNT; k++) {
        char err[256];
        char *prompt = chat_render((chat_template_kind)k, r->msgs, (size_t)r->n_msgs, true, "<s>",
                                   "</s>", err, sizeof err);
        FZ_CHECK(prompt != NULL);
        free(prompt);
    }
}

/* A JSON text that cJSON parses (what every reply body and event must be). */
static void check_json(const char *s, size_t len)
{
    FZ_CHECK(s != NULL);
    cJSON *v = cJSON_ParseWithLength(s, len);
    FZ_CHECK(v != NULL);
    cJSON_Delete(v);
}

/* Each event's data line of an SSE body is JSON. */
static void check_events(const bytebuf *out)
{
    FZ_CHECK(bytebuf_ok(out));
    for (char *p = out->data; p && (p = strstr(p, "\ndata: ")) != NULL;) {
        p += 7;
        char *end = strchr(p, '\n');
        FZ_CHECK(end != NULL);
        check_json(p, (size_t)(end - p));
        p = end;
    }
}

/* /v1/responses: the translation, then the translated body as a chat request; an accepted one
 * is answered with the input's own bytes as text, reasoning and a call, whole and streamed,
 * and every body must be valid JSON. */
static void responses_case(const char *body, size_t len, int n_vocab)
{
    char *chat = NULL;
    api_resp_req rq;
    api_error e = {0};
    if (api_responses_translate(body, len, &chat, &rq, &e) != 0) {
        FZ_CHECK(e.status >= 400 && e.status <= 599 && e.message[0] != 0 && chat == NULL);
        FZ_CHECK(rq.instructions == NULL && rq.tools == NULL && rq.text == NULL);
        return;
    }
    api_request r;
    if (api_request_parse(API_CHAT, chat, strlen(chat), n_vocab, &r, &e) != 0) {
        api_responses_rename_error(&e);
        FZ_CHECK(e.status >= 400 && strlen(e.param) < sizeof e.param && strlen(e.message) < sizeof e.message);
    } else {
        check_accepted(&r, API_CHAT, n_vocab);
        api_request_free(&r);
        api_meta m = {.kind = API_RESPONSES, .id = "resp_0123456789abcdef01234567", .model = "m", .created = 1};
        chat_tool_call call = {0, "call_1", "f", (char *)body, true};
        api_resp_out o = {.text = body, .text_len = len, .reasoning = body, .reasoning_len = len / 2,
                          .calls = &call, .n_calls = 1, .incomplete = len & 1};
        api_usage u = {3, 1, 4};
        char *j = api_responses_json(&m, &rq, &o, &u);
        check_json(j, j ? strlen(j) : 0);
        free(j);
        bytebuf out = {0};
        api_resp_stream s;
        api_resp_stream_begin(&s, &m, &rq, &out);
        api_resp_stream_reasoning(&s, body, len / 2);
        api_resp_stream_text(&s, body + len / 2, len - len / 2);
        api_resp_stream_call(&s, &call);
        api_resp_stream_end(&s, len & 1, &u, NULL);
        api_resp_stream_free(&s);
        check_events(&out);
        bytebuf_free(&out);
    }
    free(chat);
    api_resp_req_free(&rq);
}

/* /v1/messages: as responses_case, with Anthropic's message object, events and errors; and
 * the same body as /v1/messages/count_tokens reads it (which differs only in not requiring
 * max_tokens, so it takes whatever /v1/messages takes). */
static void messages_case(const char *body, size_t len, int n_vocab)
{
    char *chat = NULL, *count = NULL;
    api_error e = {0}, ce = {0};
    int count_rc = api_messages_translate_count(body, len, &count, &ce);
    FZ_CHECK(count_rc == 0 ? count != NULL : (count == NULL && ce.status >= 400 && ce.message[0] != 0));
    free(count);
    if (api_messages_translate(body, len, &chat, &e) != 0) {
        FZ_CHECK(e.status >= 400 && e.status <= 599 && e.message[0] != 0 && chat == NULL);
        char *j = api_messages_error_json(&e);
        check_json(j, j ? strlen(j) : 0);
        free(j);
        return;
    }
    FZ_CHECK(count_rc == 0);
    api_request r;
    if (api_request_parse(API_CHAT, chat, strlen(chat), n_vocab, &r, &e) != 0) {
        api_messages_rename_error(&e);
        FZ_CHECK(e.status >= 400 && strlen(e.param) < sizeof e.param && strlen(e.message) < sizeof e.message);
    } else {
        check_accepted(&r, API_CHAT, n_vocab);
        FZ_CHECK(r.max_tokens >= 1); /* required by the API */
        api_request_free(&r);
        api_meta m = {.kind = API_MESSAGES, .id = "msg_0123456789abcdef01234567", .model = "m", .created = 1};
        chat_tool_call call = {0, "call_1", "f", (char *)body, true};
        api_msg_out o = {.text = body, .text_len = len, .thinking = body, .thinking_len = len / 2,
                         .calls = &call, .n_calls = 1, .finish_reason = len & 1 ? "length" : "tool_calls"};
        api_usage u = {3, 1, 4};
        char *j = api_messages_json(&m, &o, &u);
        check_json(j, j ? strlen(j) : 0);
        free(j);
        bytebuf out = {0};
        api_msg_stream s;
        api_msg_stream_begin(&s, &m, &out, len & 4 ? &u : NULL);
        api_msg_stream_thinking(&s, body, len / 2);
        api_msg_stream_text(&s, body + len / 2, len - len / 2);
        api_msg_stream_call(&s, &call);
        api_msg_stream_end(&s, o.finish_reason, len & 2 ? body : NULL, &u, NULL);
        check_events(&out);
        bytebuf_free(&out);
    }
    free(chat);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    api_kind kind = flags & 1 ? API_CHAT : API_COMPLETIONS;
    int n_vocab = vocab_sizes[(flags >> 1) % (sizeof vocab_sizes / sizeof vocab_sizes[0])];
    /* The server hands the parser a NUL-terminated body (api_request.h). */
    char *body = fz_strndup((const char *)in.p, in.n);
    if ((flags & 0xc0) == 0xc0) {
        messages_case(body, in.n, n_vocab);
        free(body);
        return 0;
    }
    if (flags & 0x80) { /* the seeds' '0' and '1' leave it clear */
        responses_case(body, in.n, n_vocab);
        free(body);
        return 0;
    }

    api_request r;
    api_error e = {0};
    if (api_request_parse(kind, body, in.n, n_vocab, &r, &e) == 0) {
        check_accepted(&r, kind, n_vocab);
        api_request_free(&r);
    } else {
        FZ_CHECK(e.status >= 400 && e.status <= 599 && e.type != NULL && e.message[0] != 0);
        FZ_CHECK(r.prompts == NULL && r.msgs == NULL && r.n_stop == 0 && r.bias_ids == NULL &&
                 r.bias_vals == NULL);
    }
    free(body);
    return 0;
}
