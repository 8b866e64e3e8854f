/* test_api_proto.c - the protocol table (src/api/api_proto.h): each row's parse, stream
 * (open, delta, close), whole body and error shape, driven the way http/gen.c drives them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "api/api_proto.h"

/* One request's reply the way gen.c sets it up: parse, then meta, vocabulary and buffer. */
typedef struct fixture {
    const api_protocol *p;
    api_request rq;
    api_reply rep;
    bytebuf out;
} fixture;

static int no_bytes(void *ctx, int32_t id, char *buf, int cap)
{
    (void)ctx, (void)id, (void)buf, (void)cap;
    return -1;
}

static void start(fixture *f, const api_protocol *p, const char *body)
{
    memset(f, 0, sizeof *f);
    f->p = p;
    api_error e;
    int rc = p->parse(body, strlen(body), 1000, &f->rq, &f->rep.state, &e);
    if (rc != 0) fail_msg("parse: %s", e.message);
    f->rep.rq = &f->rq;
    f->rep.meta = (api_meta){.kind = p->kind, .id = "x-1", .model = "m", .created = 1};
    f->rep.vocab = (api_vocab){no_bytes, NULL};
    f->rep.out = &f->out;
}

static void finish(fixture *f)
{
    if (f->p->free_state) f->p->free_state(f->rep.state);
    api_request_free(&f->rq);
    bytebuf_free(&f->out);
}

/* How many times needle occurs in what the stream wrote so far. */
static int count(const fixture *f, const char *needle)
{
    int n = 0; /* a bytebuf is NUL-terminated once anything was appended */
    for (const char *p = f->out.data; p && (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_table(void **state)
{
    (void)state;
    const api_protocol *rows[] = {&proto_completions, &proto_chat, &proto_responses};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const api_protocol *p = rows[i];
        assert_non_null(p->name);
        assert_non_null(p->id_prefix);
        assert_non_null(p->prompt_param);
        assert_non_null(p->parse);
        assert_non_null(p->open);
        assert_non_null(p->delta);
        assert_non_null(p->close);
        assert_non_null(p->whole);
        assert_non_null(p->error);
    }
    assert_int_equal(proto_chat.kind, API_CHAT);
    assert_true(proto_chat.messages && proto_responses.messages && !proto_completions.messages);
}

static void test_chat_stream(void **state)
{
    (void)state;
    fixture f;
    start(&f, &proto_chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
                           "\"stream_options\":{\"include_usage\":true}}");
    api_span echo[2] = {{0}};
    f.p->open(&f.rep, echo, 2);
    assert_int_equal(count(&f, "\"role\":\"assistant\""), 2);
    chat_tool_call call = {.index = 0, .id = "call_1", .name = "f", .arguments = "{}", .last = true};
    api_delta d = {.index = 0, .text = "ok", .text_len = 2, .calls = &call, .n_calls = 1, .finish_reason = "tool_calls"};
    f.p->delta(&f.rep, &d);
    /* content, the call (a whole one: id, name and arguments in one piece), the finish */
    assert_int_equal(count(&f, "data: "), 2 + 3);
    assert_int_equal(count(&f, "\"name\":\"f\""), 1);
    /* a streamed call's pieces: its opening with id and name, then fragments alone */
    chat_tool_call pieces[] = {{.index = 1, .id = "call_2", .name = "g", .arguments = "{\"a\""},
                               {.index = 1, .arguments = ":1}", .last = true}};
    f.p->delta(&f.rep, &(api_delta){.index = 0, .calls = pieces, .n_calls = 2});
    assert_int_equal(count(&f, "{\"index\":1,\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"a\\\"\"}}"), 1);
    assert_int_equal(count(&f, "\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\":1}\"}}]"), 1);
    assert_int_equal(count(&f, "\"finish_reason\":\"tool_calls\""), 1);
    api_usage u = {.prompt_tokens = 3, .completion_tokens = 4};
    f.p->close(&f.rep, &(api_end){.usage = &u});
    assert_int_equal(count(&f, "\"total_tokens\":7"), 1);
    assert_int_equal(count(&f, "data: [DONE]"), 1);
    finish(&f);
}

static void test_completions_stream(void **state)
{
    (void)state;
    fixture f;
    start(&f, &proto_completions, "{\"prompt\":\"a\",\"stream\":true}");
    api_span echo[2] = {{"echoed", 6}, {0}};
    f.p->open(&f.rep, echo, 2);
    assert_int_equal(count(&f, "data: "), 1); /* only the choice that echoes opens */
    assert_int_equal(count(&f, "\"text\":\"echoed\""), 1);
    f.p->delta(&f.rep, &(api_delta){.index = 1, .text = "", .finish_reason = "length"});
    assert_int_equal(count(&f, "data: "), 2); /* no empty text chunk, one finish */
    api_error e;
    api_error_set(&e, 500, "server_error", NULL, "engine_error", "boom");
    f.p->close(&f.rep, &(api_end){.usage = &(api_usage){0}, .failed = &e});
    assert_int_equal(count(&f, "\"code\":\"engine_error\""), 1);
    assert_int_equal(count(&f, "data: [DONE]"), 1);
    finish(&f);
}

static void test_responses(void **state)
{
    (void)state;
    fixture f;
    start(&f, &proto_responses, "{\"input\":\"hi\",\"stream\":true,\"instructions\":\"be brief\"}");
    assert_int_equal(f.rq.kind, API_RESPONSES);
    f.p->open(&f.rep, NULL, 1);
    assert_int_equal(count(&f, "event: response.created"), 1);
    f.p->delta(&f.rep, &(api_delta){.index = 0, .reasoning = "hm", .reasoning_len = 2, .text = "yes", .text_len = 3,
                                   .finish_reason = "length"});
    assert_int_equal(count(&f, "event: response.reasoning_text.delta"), 1);
    assert_int_equal(count(&f, "event: response.output_text.delta"), 1);
    f.p->close(&f.rep, &(api_end){.usage = &(api_usage){0}, .truncated = true});
    assert_int_equal(count(&f, "event: response.incomplete"), 1);
    assert_int_equal(count(&f, "[DONE]"), 0); /* not in this protocol */

    api_choice ch = {.text = "yes", .text_len = 3, .finish_reason = "length"};
    char *json = f.p->whole(&f.rep, &ch, 1, &(api_usage){0});
    assert_non_null(json);
    cJSON *o = cJSON_Parse(json);
    free(json);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "status")->valuestring, "incomplete");
    assert_string_equal(cJSON_GetObjectItem(o, "instructions")->valuestring, "be brief");
    cJSON_Delete(o);
    finish(&f);

    /* a translated body's error names the Responses field */
    api_request rq = {0};
    void *st = NULL;
    api_error e;
    const char *bad = "{\"input\":\"hi\",\"max_output_tokens\":-1}";
    assert_int_equal(proto_responses.parse(bad, strlen(bad), 1000, &rq, &st, &e), -1);
    assert_null(st);
    assert_string_equal(e.param, "max_output_tokens");
}

static void test_error_shape(void **state)
{
    (void)state;
    api_error e;
    api_error_set(&e, 400, "invalid_request_error", "messages", "invalid_value", "no");
    const api_protocol *rows[] = {&proto_completions, &proto_chat, &proto_responses};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char *json = rows[i]->error(&e);
        cJSON *o = cJSON_Parse(json);
        free(json);
        assert_non_null(o);
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "param")->valuestring, "messages");
        cJSON_Delete(o);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),     cmocka_unit_test(test_chat_stream), cmocka_unit_test(test_completions_stream),
        cmocka_unit_test(test_responses), cmocka_unit_test(test_error_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
