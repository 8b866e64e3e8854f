/* test_api_messages.c - /v1/messages without a server: the translation into a chat request
 * (and that api_request_parse accepts it), refusals and renamed errors, the Anthropic error
 * shape, the message object, and the order and shape of the streamed events. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "api/api_messages.h"
#include "json_path.h"

/* The chat body of a Messages body (which must translate and then parse as chat). */
static cJSON *translate(const char *body)
{
    char *chat = NULL;
    api_error e = {0};
    if (api_messages_translate(body, strlen(body), &chat, &e) != 0) fail_msg("%s: %s", body, e.message);
    api_request r;
    if (api_request_parse(API_CHAT, chat, strlen(chat), 1000, &r, &e) != 0) fail_msg("%s -> %s: %s", body, chat, e.message);
    api_request_free(&r);
    cJSON *v = cJSON_Parse(chat);
    free(chat);
    assert_non_null(v);
    return v;
}

static double num_at(const cJSON *o, const char *path)
{
    const cJSON *v = json_at(o, path);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

static void test_translate(void **state)
{
    (void)state;
    cJSON *c = translate("{\"model\":\"m\",\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\",\"cache_control\":"
                         "{\"type\":\"ephemeral\"}}],\"max_tokens\":7,\"temperature\":0.5,\"top_k\":3,"
                         "\"stop_sequences\":[\"END\"],\"metadata\":{\"user_id\":\"u\"},"
                         "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                         "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"x\"},"
                         "{\"type\":\"text\",\"text\":\"Let me look.\"},"
                         "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get\",\"input\":{\"city\":\"Paris\"}}]},"
                         "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":"
                         "[{\"type\":\"text\",\"text\":\"18C\"}]},{\"type\":\"text\",\"text\":\"And?\"}]}],"
                         "\"tools\":[{\"name\":\"get\",\"description\":\"weather\",\"input_schema\":{\"type\":\"object\"}}],"
                         "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
                         "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}}");
    assert_string_equal(str_at(c, "messages.0.role"), "system");
    assert_string_equal(str_at(c, "messages.0.content.0.text"), "Be brief.");
    assert_string_equal(str_at(c, "messages.1.content"), "Hi");
    assert_string_equal(str_at(c, "messages.2.role"), "assistant");
    assert_string_equal(str_at(c, "messages.2.content.0.text"), "Let me look.");
    assert_string_equal(str_at(c, "messages.2.reasoning_content"), "hmm");
    assert_string_equal(str_at(c, "messages.2.tool_calls.0.id"), "toolu_1");
    assert_string_equal(str_at(c, "messages.2.tool_calls.0.function.name"), "get");
    assert_string_equal(str_at(c, "messages.2.tool_calls.0.function.arguments"), "{\"city\":\"Paris\"}");
    /* the tool result first, then the user's text */
    assert_string_equal(str_at(c, "messages.3.role"), "tool");
    assert_string_equal(str_at(c, "messages.3.tool_call_id"), "toolu_1");
    assert_string_equal(str_at(c, "messages.3.content.0.text"), "18C");
    assert_string_equal(str_at(c, "messages.4.role"), "user");
    assert_string_equal(str_at(c, "messages.4.content.0.text"), "And?");
    assert_int_equal((int)num_at(c, "max_completion_tokens"), 7);
    assert_int_equal((int)num_at(c, "top_k"), 3);
    assert_string_equal(str_at(c, "stop.0"), "END");
    assert_string_equal(str_at(c, "tools.0.function.name"), "get");
    assert_string_equal(str_at(c, "tools.0.function.parameters.type"), "object");
    assert_string_equal(str_at(c, "tool_choice"), "required");
    assert_true(cJSON_IsFalse(json_at(c, "parallel_tool_calls")));
    assert_true(cJSON_IsTrue(json_at(c, "chat_template_kwargs.enable_thinking")));
    assert_null(json_at(c, "metadata"));
    cJSON_Delete(c);

    c = translate("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                  "\"tool_use_id\":\"t\",\"content\":\"boom\",\"is_error\":true}]}],"
                  "\"tool_choice\":{\"type\":\"tool\",\"name\":\"get\"},"
                  "\"tools\":[{\"name\":\"get\",\"input_schema\":{\"type\":\"object\"}}],\"thinking\":{\"type\":\"disabled\"}}");
    assert_string_equal(str_at(c, "messages.0.content.0.text"), "Error: ");
    assert_string_equal(str_at(c, "messages.0.content.1.text"), "boom");
    assert_null(json_at(c, "messages.1")); /* no empty user message after the result */
    assert_string_equal(str_at(c, "tool_choice.function.name"), "get");
    assert_true(cJSON_IsFalse(json_at(c, "chat_template_kwargs.enable_thinking")));
    cJSON_Delete(c);

    /* tool_choice auto and none; no thinking asked is thinking disabled (Anthropic's default)
     * unless chat_template_kwargs says otherwise; text blocks with empty citations are text */
    static const char tools[] = "\"tools\":[{\"name\":\"get\",\"input_schema\":{\"type\":\"object\"}}]";
    char b[512];
    snprintf(b, sizeof b, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
             "\"text\":\"Hi\",\"citations\":[]}]}],\"tool_choice\":{\"type\":\"none\"},%s}", tools);
    c = translate(b);
    assert_string_equal(str_at(c, "tool_choice"), "none");
    assert_string_equal(str_at(c, "messages.0.content.0.text"), "Hi");
    assert_true(cJSON_IsFalse(json_at(c, "chat_template_kwargs.enable_thinking")));
    assert_null(json_at(c, "parallel_tool_calls"));
    cJSON_Delete(c);
    snprintf(b, sizeof b, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
             "\"tool_choice\":{\"type\":\"auto\"},%s,\"chat_template_kwargs\":{\"enable_thinking\":true}}", tools);
    c = translate(b);
    assert_string_equal(str_at(c, "tool_choice"), "auto");
    assert_true(cJSON_IsTrue(json_at(c, "chat_template_kwargs.enable_thinking")));
    cJSON_Delete(c);
    /* top_k / top_p -1: not set (LangChain's ChatAnthropic sends them so) */
    c = translate("{\"max_tokens\":1,\"top_k\":-1,\"top_p\":-1,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    assert_null(json_at(c, "top_k"));
    assert_null(json_at(c, "top_p"));
    cJSON_Delete(c);
}

/* body is refused at translation or at the chat parse, with a 400 naming param. */
static void refused(const char *body, const char *param, const char *in_message)
{
    char *chat = NULL;
    api_error e = {0};
    if (api_messages_translate(body, strlen(body), &chat, &e) == 0) {
        api_request r;
        int rc = api_request_parse(API_CHAT, chat, strlen(chat), 1000, &r, &e);
        free(chat);
        if (rc == 0) {
            api_request_free(&r);
            fail_msg("accepted: %s", body);
        }
        api_messages_rename_error(&e);
    }
    assert_int_equal(e.status, 400);
    if (strcmp(e.param, param)) fail_msg("%s: param '%s', want '%s' (%s)", body, e.param, param, e.message);
    if (!strstr(e.message, in_message)) fail_msg("%s: '%s' lacks '%s'", body, e.message, in_message);
}

static void test_refusals(void **state)
{
    (void)state;
    static const char user[] = "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]";
    char b[512];
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "max_tokens", "max_tokens");
    snprintf(b, sizeof b, "{\"max_tokens\":0,%s}", user);
    refused(b, "max_tokens", "max_tokens");
    refused("{\"max_tokens\":5}", "messages", "messages");
    /* a number beyond a double would be printed as null in the chat body (silently unset) */
    refused("{\"max_tokens\":1e400,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "max_tokens", "range");
    refused("{\"max_tokens\":5,\"temperature\":-1e999,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
            "temperature", "range");
    refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages.0", "role");
    refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
            "messages.0", "'image'");
    refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\",\"source\":{}}]}]}",
            "messages.0", "'document'");
    snprintf(b, sizeof b, "{\"max_tokens\":5,%s,\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]}", user);
    refused(b, "tools.0", "web_search_20250305");
    snprintf(b, sizeof b, "{\"max_tokens\":5,%s,\"mcp_servers\":[{}]}", user);
    refused(b, "mcp_servers", "mcp_servers");
    snprintf(b, sizeof b, "{\"max_tokens\":5,%s,\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", user);
    refused(b, "stop_sequences", "stop_sequences");
    snprintf(b, sizeof b, "{\"max_tokens\":5,%s,\"tool_choice\":{\"type\":\"tool\",\"name\":\"nope\"},"
             "\"tools\":[{\"name\":\"get\",\"input_schema\":{\"type\":\"object\"}}]}", user);
    refused(b, "tool_choice", "nope");
    snprintf(b, sizeof b, "{\"max_tokens\":5,%s,\"tool_choice\":{\"type\":\"sometimes\"}}", user);
    refused(b, "tool_choice.type", "auto");
    snprintf(b, sizeof b, "{\"max_tokens\":5,%s,\"thinking\":{\"type\":\"enabled\"}}", user);
    refused(b, "thinking.budget_tokens", "budget_tokens");
    snprintf(b, sizeof b, "{\"max_tokens\":5,%s,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1e300}}", user);
    refused(b, "thinking.budget_tokens", "budget_tokens");
    /* citations, in a turn and in a tool result; server tool blocks sent back; a search result */
    refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"x\","
            "\"citations\":[{\"type\":\"char_location\",\"cited_text\":\"y\"}]}]}]}",
            "messages.0", "citations");
    refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
            "\"t\",\"content\":[{\"type\":\"text\",\"text\":\"x\",\"citations\":[{}]}]}]}]}",
            "messages.0", "citations");
    refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
            "\"t\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}]}",
            "messages.0", "'image'");
    refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"server_tool_use\","
            "\"id\":\"s\",\"name\":\"web_search\",\"input\":{}}]}]}",
            "messages.0", "server_tool_use");
    refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"search_result\"}]}]}",
            "messages.0", "search_result");
    snprintf(b, sizeof b, "{\"max_tokens\":5,%s,\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}]}", user);
    refused(b, "tools.0", "bash_20250124");
}

static void test_error_shape(void **state)
{
    (void)state;
    static const struct { int status; const char *type; } cases[] = {
        {400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
        {413, "request_too_large"}, {429, "rate_limit_error"}, {500, "api_error"}, {503, "overloaded_error"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api_error e;
        api_error_set(&e, cases[i].status, "whatever", NULL, NULL, "why %d", cases[i].status);
        char *s = api_messages_error_json(&e);
        cJSON *o = cJSON_Parse(s);
        free(s);
        assert_string_equal(str_at(o, "type"), "error");
        assert_string_equal(str_at(o, "error.type"), cases[i].type);
        assert_non_null(strstr(str_at(o, "error.message"), "why"));
        cJSON_Delete(o);
    }
}

static const api_meta meta = {.kind = API_MESSAGES, .id = "msg_00112233445566778899aabb", .model = "m", .created = 42};

static void test_whole(void **state)
{
    (void)state;
    chat_tool_call call = {0, "call_abc", "get", "{\"city\":\"Paris\"}", true};
    api_usage u = {10, 4, 6};
    api_msg_out o = {.text = "Sure.", .text_len = 5, .thinking = "hm", .thinking_len = 2, .calls = &call, .n_calls = 1,
                     .finish_reason = "tool_calls"};
    char *s = api_messages_json(&meta, &o, &u);
    cJSON *m = cJSON_Parse(s);
    free(s);
    assert_string_equal(str_at(m, "id"), meta.id);
    assert_string_equal(str_at(m, "type"), "message");
    assert_string_equal(str_at(m, "role"), "assistant");
    assert_string_equal(str_at(m, "content.0.type"), "thinking");
    assert_string_equal(str_at(m, "content.0.thinking"), "hm");
    assert_string_equal(str_at(m, "content.1.text"), "Sure.");
    assert_string_equal(str_at(m, "content.2.type"), "tool_use");
    assert_string_equal(str_at(m, "content.2.id"), "toolu_abc");
    assert_string_equal(str_at(m, "content.2.input.city"), "Paris");
    assert_string_equal(str_at(m, "stop_reason"), "tool_use");
    assert_true(cJSON_IsNull(json_at(m, "stop_sequence")));
    assert_int_equal((int)num_at(m, "usage.input_tokens"), 6);
    assert_int_equal((int)num_at(m, "usage.cache_read_input_tokens"), 4);
    assert_int_equal((int)num_at(m, "usage.output_tokens"), 6);
    cJSON_Delete(m);
    /* nothing said: one empty text block; max_tokens */
    o = (api_msg_out){.finish_reason = "length"};
    s = api_messages_json(&meta, &o, &u);
    m = cJSON_Parse(s);
    free(s);
    assert_string_equal(str_at(m, "content.0.type"), "text");
    assert_string_equal(str_at(m, "content.0.text"), "");
    assert_null(json_at(m, "content.1"));
    assert_string_equal(str_at(m, "stop_reason"), "max_tokens");
    cJSON_Delete(m);
    assert_string_equal(api_messages_stop_reason("stop", NULL), "end_turn");
    /* a stop sequence ended it */
    o = (api_msg_out){.text = "ab", .text_len = 2, .finish_reason = "stop", .stop_sequence = "END"};
    s = api_messages_json(&meta, &o, &u);
    m = cJSON_Parse(s);
    free(s);
    assert_string_equal(str_at(m, "stop_reason"), "stop_sequence");
    assert_string_equal(str_at(m, "stop_sequence"), "END");
    cJSON_Delete(m);
}

static void test_stream(void **state)
{
    (void)state;
    bytebuf out = {0};
    api_msg_stream s;
    chat_tool_call call = {0, "call_abc", "get", "{\"city\":\"Paris\"}", true};
    api_usage u = {10, 0, 6}, at_start = {10, 4, 1};
    api_msg_stream_begin(&s, &meta, &out, &at_start);
    api_msg_stream_thinking(&s, "thi", 3);
    api_msg_stream_thinking(&s, "nk", 2);
    api_msg_stream_text(&s, "He", 2);
    api_msg_stream_text(&s, "llo", 3);
    api_msg_stream_call(&s, &call);
    api_msg_stream_end(&s, "tool_calls", NULL, &u, NULL);
    cJSON *ev[32];
    int n = sse_events(&out, ev, 32);
    static const char *const want[] = {
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"};
    assert_int_equal(n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < n; i++) assert_string_equal(str_at(ev[i], "type"), want[i]);
    assert_string_equal(str_at(ev[0], "message.id"), meta.id);
    assert_true(cJSON_IsNull(json_at(ev[0], "message.stop_reason")));
    /* message_start carries the prompt's usage, as Anthropic sends it: cache reads apart */
    assert_int_equal((int)num_at(ev[0], "message.usage.input_tokens"), 6);
    assert_int_equal((int)num_at(ev[0], "message.usage.cache_read_input_tokens"), 4);
    assert_int_equal((int)num_at(ev[0], "message.usage.output_tokens"), 1);
    assert_string_equal(str_at(ev[2], "content_block.type"), "thinking");
    assert_string_equal(str_at(ev[3], "delta.type"), "thinking_delta");
    assert_string_equal(str_at(ev[4], "delta.thinking"), "nk");
    assert_int_equal((int)num_at(ev[5], "index"), 0);
    assert_string_equal(str_at(ev[6], "content_block.type"), "text");
    assert_int_equal((int)num_at(ev[6], "index"), 1);
    assert_string_equal(str_at(ev[8], "delta.type"), "text_delta");
    assert_string_equal(str_at(ev[8], "delta.text"), "llo");
    assert_string_equal(str_at(ev[10], "content_block.type"), "tool_use");
    assert_string_equal(str_at(ev[10], "content_block.id"), "toolu_abc");
    assert_int_equal((int)num_at(ev[10], "index"), 2);
    assert_string_equal(str_at(ev[11], "delta.type"), "input_json_delta");
    assert_string_equal(str_at(ev[11], "delta.partial_json"), "{\"city\":\"Paris\"}");
    assert_string_equal(str_at(ev[13], "delta.stop_reason"), "tool_use");
    assert_int_equal((int)num_at(ev[13], "usage.output_tokens"), 6);
    assert_int_equal((int)num_at(ev[13], "usage.input_tokens"), 10);
    for (int i = 0; i < n; i++) cJSON_Delete(ev[i]);
    bytebuf_free(&out);

    /* nothing said: one empty text block; a failure: an error event, no message_stop */
    api_msg_stream_begin(&s, &meta, &out, NULL);
    api_msg_stream_end(&s, "stop", "END", &u, NULL);
    n = sse_events(&out, ev, 32);
    assert_int_equal(n, 6);
    assert_string_equal(str_at(ev[2], "content_block.type"), "text");
    assert_string_equal(str_at(ev[4], "delta.stop_reason"), "stop_sequence");
    assert_string_equal(str_at(ev[4], "delta.stop_sequence"), "END");
    for (int i = 0; i < n; i++) cJSON_Delete(ev[i]);
    bytebuf_free(&out);
    api_error e;
    api_error_set(&e, 500, "server_error", NULL, NULL, "engine failed");
    api_msg_stream_begin(&s, &meta, &out, &u);
    api_msg_stream_text(&s, "x", 1);
    api_msg_stream_end(&s, NULL, NULL, &u, &e);
    n = sse_events(&out, ev, 32);
    assert_string_equal(str_at(ev[n - 1], "type"), "error");
    assert_string_equal(str_at(ev[n - 1], "error.type"), "api_error");
    for (int i = 0; i < n; i++) cJSON_Delete(ev[i]);
    bytebuf_free(&out);
}

/* A streamed call in pieces (chat_parse.h): the tool_use block starts with its id and name,
 * each fragment is an input_json_delta, the last stops the block. */
static void test_stream_call_pieces(void **state)
{
    (void)state;
    bytebuf out = {0};
    api_msg_stream s;
    chat_tool_call pieces[] = {{0, "call_abc", "get", "", false}, {0, NULL, NULL, "{\"city\":", false},
                               {0, NULL, NULL, "\"Paris\"}", true}};
    api_usage u = {10, 0, 6};
    api_msg_stream_begin(&s, &meta, &out, &u);
    for (int i = 0; i < 3; i++) api_msg_stream_call(&s, &pieces[i]);
    api_msg_stream_end(&s, "tool_calls", NULL, &u, NULL);
    cJSON *ev[32];
    int n = sse_events(&out, ev, 32);
    static const char *const want[] = {"message_start", "ping", "content_block_start", "content_block_delta",
                                       "content_block_delta", "content_block_stop", "message_delta", "message_stop"};
    assert_int_equal(n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < n; i++) assert_string_equal(str_at(ev[i], "type"), want[i]);
    assert_string_equal(str_at(ev[2], "content_block.id"), "toolu_abc");
    assert_string_equal(str_at(ev[2], "content_block.name"), "get");
    assert_string_equal(str_at(ev[3], "delta.partial_json"), "{\"city\":");
    assert_string_equal(str_at(ev[4], "delta.partial_json"), "\"Paris\"}");
    for (int i = 0; i < n; i++) cJSON_Delete(ev[i]);
    bytebuf_free(&out);
}

/* An assistant turn of redacted_thinking only (encrypted for another server) is still a turn:
 * dropping it put two user turns side by side, which alternating templates refuse. */
static void test_redacted_only_turn(void **state)
{
    (void)state;
    cJSON *c = translate("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                         "{\"role\":\"assistant\",\"content\":[{\"type\":\"redacted_thinking\",\"data\":\"x\"}]},"
                         "{\"role\":\"user\",\"content\":\"go\"}]}");
    assert_int_equal(cJSON_GetArraySize(json_at(c, "messages")), 3);
    assert_string_equal(str_at(c, "messages.1.role"), "assistant");
    assert_string_equal(str_at(c, "messages.2.role"), "user");
    cJSON_Delete(c);
    /* a user turn of tool results only is still no user message */
    c = translate("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                  "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"ok\"}]}]}");
    assert_int_equal(cJSON_GetArraySize(json_at(c, "messages")), 3);
    assert_string_equal(str_at(c, "messages.2.role"), "tool");
    cJSON_Delete(c);
}

/* An error the chat parse finds in a message names the chat message's index, which is not the
 * client's (the system prompt is chat message 0, tool results are messages of their own):
 * the client's first message, after a system prompt, was named 'messages[1]'. */
static void test_chat_message_error_named(void **state)
{
    (void)state;
    size_t cap = 64 + (size_t)(API_MAX_ITEMS + 1) * 32;
    char *b = malloc(cap);
    assert_non_null(b);
    size_t o = (size_t)snprintf(b, cap, "{\"max_tokens\":5,\"system\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":[");
    for (int i = 0; i <= API_MAX_ITEMS; i++) o += (size_t)snprintf(b + o, cap - o, "%s{\"type\":\"text\",\"text\":\"a\"}", i ? "," : "");
    snprintf(b + o, cap - o, "]}]}");
    refused(b, "messages", "'messages'");
    char *chat = NULL;
    api_error e = {0};
    assert_int_equal(api_messages_translate(b, strlen(b), &chat, &e), 0);
    api_request r;
    assert_int_not_equal(api_request_parse(API_CHAT, chat, strlen(chat), 1000, &r, &e), 0);
    api_messages_rename_error(&e);
    assert_null(strstr(e.message, "messages[1]"));
    free(chat);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translate), cmocka_unit_test(test_refusals), cmocka_unit_test(test_error_shape),
        cmocka_unit_test(test_whole), cmocka_unit_test(test_stream), cmocka_unit_test(test_stream_call_pieces),
        cmocka_unit_test(test_redacted_only_turn),
        cmocka_unit_test(test_chat_message_error_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
