/* test_api_responses.c - /v1/responses without a server: the translation into a chat request
 * (and that api_request_parse accepts it), errors named as the client sent them, the response
 * object, and the order and shape of the streamed events. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "api/api_responses.h"
#include "json_path.h"

/* The chat body of a Responses body (which must translate and then parse as chat). */
static cJSON *translate(const char *body, api_resp_req *rq)
{
    char *chat = NULL;
    api_error e = {0};
    if (api_responses_translate(body, strlen(body), &chat, rq, &e) != 0) fail_msg("%s: %s", body, e.message);
    api_request r;
    if (api_request_parse(API_CHAT, chat, strlen(chat), 1000, &r, &e) != 0) fail_msg("%s -> %s: %s", body, chat, e.message);
    api_request_free(&r);
    cJSON *v = cJSON_Parse(chat);
    free(chat);
    assert_non_null(v);
    return v;
}

static void test_translate(void **state)
{
    (void)state;
    api_resp_req rq;
    cJSON *c = translate("{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":\"Hi\",\"max_output_tokens\":7,"
                         "\"temperature\":0.5,\"store\":true,\"reasoning\":{\"effort\":\"low\"},\"metadata\":{\"k\":\"v\"}}",
                         &rq);
    assert_string_equal(str_at(c, "messages.0.role"), "system");
    assert_string_equal(str_at(c, "messages.0.content"), "Be brief.");
    assert_string_equal(str_at(c, "messages.1.role"), "user");
    assert_string_equal(str_at(c, "messages.1.content"), "Hi");
    assert_int_equal(cJSON_GetObjectItem(c, "max_completion_tokens")->valueint, 7);
    assert_null(cJSON_GetObjectItem(c, "max_output_tokens"));
    assert_string_equal(str_at(c, "reasoning_effort"), "low"); /* a template variable (gpt-oss's) */
    assert_string_equal(rq.instructions, "\"Be brief.\"");
    assert_string_equal(rq.metadata, "{\"k\":\"v\"}");
    assert_string_equal(rq.max_output_tokens, "7");
    assert_true(rq.parallel_tool_calls);
    cJSON_Delete(c);
    api_resp_req_free(&rq);

    /* a turn with a function call and its output, flat tools, a named tool_choice, a schema */
    c = translate("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Weather?\"}]},"
                  "{\"type\":\"reasoning\",\"summary\":[]},"
                  "{\"type\":\"function_call\",\"call_id\":\"call_9\",\"name\":\"get\",\"arguments\":\"{}\"},"
                  "{\"type\":\"function_call_output\",\"call_id\":\"call_9\",\"output\":\"21\"},"
                  "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"21 C\"}]}],"
                  "\"tools\":[{\"type\":\"function\",\"name\":\"get\",\"parameters\":{\"type\":\"object\"}}],"
                  "\"tool_choice\":{\"type\":\"function\",\"name\":\"get\"},\"parallel_tool_calls\":false,"
                  "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"t\",\"schema\":{\"type\":\"object\"},\"strict\":true}}}",
                  &rq);
    assert_string_equal(str_at(c, "messages.0.content.0.text"), "Weather?");
    assert_string_equal(str_at(c, "messages.1.role"), "assistant");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "messages"), 1), "content")));
    assert_string_equal(str_at(c, "messages.1.tool_calls.0.id"), "call_9");
    assert_string_equal(str_at(c, "messages.1.tool_calls.0.function.name"), "get");
    assert_string_equal(str_at(c, "messages.2.role"), "tool");
    assert_string_equal(str_at(c, "messages.2.tool_call_id"), "call_9");
    assert_string_equal(str_at(c, "messages.3.content.0.text"), "21 C");
    assert_string_equal(str_at(c, "tools.0.function.name"), "get");
    assert_string_equal(str_at(c, "tool_choice.function.name"), "get");
    assert_string_equal(str_at(c, "response_format.type"), "json_schema");
    assert_string_equal(str_at(c, "response_format.json_schema.name"), "t");
    assert_false(rq.parallel_tool_calls);
    assert_non_null(strstr(rq.tools, "\"name\":\"get\""));
    cJSON_Delete(c);
    api_resp_req_free(&rq);
}

static void refused(const char *body, const char *param, const char *code)
{
    char *chat = NULL;
    api_resp_req rq;
    api_error e = {0};
    assert_int_equal(api_responses_translate(body, strlen(body), &chat, &rq, &e), -1);
    assert_null(chat);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    assert_string_equal(e.code, code);
    assert_null(rq.instructions);
}

static void test_refusals(void **state)
{
    (void)state;
    refused("{}", "input", "missing_required_parameter");
    refused("{\"input\":5}", "input", "invalid_type");
    refused("{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id", "unsupported_parameter");
    refused("{\"input\":\"x\",\"conversation\":\"c\"}", "conversation", "unsupported_parameter");
    refused("{\"input\":\"x\",\"background\":true}", "background", "unsupported_parameter");
    refused("{\"input\":\"x\",\"top_logprobs\":2}", "top_logprobs", "unsupported_parameter");
    refused("{\"input\":\"x\",\"tools\":[{\"type\":\"local_shell\"}]}", "tools[0].type", "unsupported_parameter");
    refused("{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"a.b\",\"tools\":[]}]}", "tools[0].type",
            "invalid_value");
    refused("{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"ns\",\"tools\":[{\"type\":\"web_search\"}]}]}",
            "tools[0].type", "unsupported_parameter");
    refused("{\"input\":\"x\",\"tool_choice\":{\"type\":\"file_search\"}}", "tool_choice", "unsupported_parameter");
    refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}", "input[0]",
            "unsupported_parameter");
    refused("{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input[0]", "unsupported_parameter");
    refused("{\"input\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "input[0]", "invalid_value");
    refused("{\"input\":[\"x\"],\"model\":\"m\"}", "input[0]", "invalid_type");
    refused("{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "input[0]", "invalid_value");
    refused("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type", "invalid_value");
    refused("{\"input\":\"x\",\"input\":\"y\"}", "", "duplicate_key"); /* json_strict, as on every route */
    /* a tool result must answer a call made earlier in the input (OpenAI: 400) */
    refused("{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"21\"}]}", "input[0]",
            "invalid_value");
    refused("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{}\"},"
            "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":\"21\"}]}",
            "input[1]", "invalid_value");
    refused("{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"21\"},"
            "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{}\"}]}",
            "input[0]", "invalid_value"); /* the call must come first */
}

static void renamed(const char *param, const char *message, const char *want_param, const char *want_in_message)
{
    api_error e;
    api_error_set(&e, 400, "invalid_request_error", param, "invalid_value", "%s", message);
    api_responses_rename_error(&e);
    assert_string_equal(e.param, want_param);
    if (!strstr(e.message, want_in_message)) fail_msg("'%s' lacks '%s'", e.message, want_in_message);
}

static void test_rename(void **state)
{
    (void)state;
    renamed("messages[3].content", "Invalid 'messages[3].content': bad.", "input", "Invalid 'input': bad.");
    renamed("max_completion_tokens", "Invalid value for 'max_completion_tokens': 0.", "max_output_tokens",
            "'max_output_tokens'");
    renamed("tools[1].function.parameters", "Invalid 'tools[1].function.parameters': x", "tools[1].parameters",
            "'tools[1].parameters'");
    renamed("response_format.json_schema.schema", "Invalid 'response_format.json_schema.schema': y", "text.format.schema",
            "'text.format.schema'");
    renamed("tool_choice.function.name", "Invalid 'tool_choice.function.name'.", "tool_choice.name", "'tool_choice.name'");
    renamed("temperature", "Invalid 'temperature'.", "temperature", "'temperature'");
}

static const api_resp_req echo = {.instructions = "\"Be brief.\"", .tools = "[{\"type\":\"function\",\"name\":\"f\"}]",
                                  .parallel_tool_calls = true};
static const api_meta meta = {.kind = API_RESPONSES, .id = "resp_00112233445566778899aabb", .model = "m", .created = 42};

static void test_whole_response(void **state)
{
    (void)state;
    chat_tool_call call = {0, "call_abc", "f", "{\"x\":1}", true};
    api_resp_out o = {.text = "hi\xff", .text_len = 3, .reasoning = "think", .reasoning_len = 5, .calls = &call, .n_calls = 1};
    api_usage u = {10, 4, 6};
    char *json = api_responses_json(&meta, &echo, &o, &u);
    cJSON *r = cJSON_Parse(json);
    free(json);
    assert_non_null(r);
    assert_string_equal(str_at(r, "object"), "response");
    assert_string_equal(str_at(r, "status"), "completed");
    assert_string_equal(str_at(r, "instructions"), "Be brief.");
    assert_string_equal(str_at(r, "tools.0.name"), "f");
    assert_string_equal(str_at(r, "output.0.type"), "reasoning");
    assert_string_equal(str_at(r, "output.0.content.0.text"), "think");
    assert_string_equal(str_at(r, "output.1.type"), "message");
    assert_string_equal(str_at(r, "output.1.content.0.text"), "hi\xEF\xBF\xBD"); /* invalid byte -> U+FFFD */
    assert_string_equal(str_at(r, "output.2.type"), "function_call");
    assert_string_equal(str_at(r, "output.2.call_id"), "call_abc");
    assert_string_equal(str_at(r, "output.2.arguments"), "{\"x\":1}");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "total_tokens")->valueint, 16);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(r, "incomplete_details")));
    cJSON_Delete(r);

    /* cut at max_output_tokens inside the reasoning: the reasoning item only, incomplete */
    o = (api_resp_out){.reasoning = "th", .reasoning_len = 2, .incomplete = true};
    json = api_responses_json(&meta, &echo, &o, &u);
    r = cJSON_Parse(json);
    free(json);
    assert_string_equal(str_at(r, "status"), "incomplete");
    assert_string_equal(str_at(r, "incomplete_details.reason"), "max_output_tokens");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r, "output")), 1);
    cJSON_Delete(r);
}

/* Issue 33 (the Codex CLI's first request): hosted tools are set aside and named; a namespace
 * tool is its functions, offered as "ns.name", and a call of one goes back with its namespace. */
static void test_hosted_and_namespace(void **state)
{
    (void)state;
    api_resp_req rq;
    cJSON *c = translate("{\"tools\":[{\"type\":\"web_search_preview\"},{\"type\":\"web_search\"},{\"type\":\"function\",\"name\":\"f\"},"
                         "{\"type\":\"mcp\",\"server_label\":\"s\",\"server_url\":\"https://x\"},{\"type\":\"web_search\"},"
                         "{\"type\":\"namespace\",\"name\":\"collab\",\"description\":\"Agents.\",\"tools\":["
                         "{\"type\":\"function\",\"name\":\"spawn\",\"parameters\":{\"type\":\"object\"}},"
                         "{\"type\":\"function\",\"name\":\"wait\"}]},"
                         "{\"type\":\"file_search\",\"vector_store_ids\":[\"v\"]},{\"type\":\"code_interpreter\"},"
                         "{\"type\":\"computer_use_preview\"},{\"type\":\"image_generation\"},"
                         "{\"type\":\"web_search_preview_2025_03_11\"}],"
                         "\"input\":[{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"spawn\",\"namespace\":\"collab\","
                         "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"ok\"}]}",
                         &rq);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(c, "tools")), 3);
    assert_string_equal(str_at(c, "tools.0.function.name"), "f");
    assert_string_equal(str_at(c, "tools.1.function.name"), "collab.spawn");
    assert_string_equal(str_at(c, "tools.2.function.name"), "collab.wait");
    assert_string_equal(str_at(c, "messages.0.tool_calls.0.function.name"), "collab.spawn");
    assert_string_equal(rq.ignored_tools, "web_search_preview, web_search, mcp, file_search, code_interpreter, computer_use_preview, "
                                          "image_generation, web_search_preview_2025_03_11");
    assert_string_equal(rq.namespaces, "collab.");
    cJSON_Delete(c);

    /* the calls as the response writes them */
    chat_tool_call calls[] = {{0, "call_a", "collab.spawn", "{}", true}, {1, "call_b", "f", "{}", true},
                              {2, "call_c", "other.x", "{}", true}};
    api_resp_out o = {.calls = calls, .n_calls = 3};
    api_usage u = {1, 0, 1};
    char *json = api_responses_json(&meta, &rq, &o, &u);
    cJSON *r = cJSON_Parse(json);
    free(json);
    assert_string_equal(str_at(r, "output.0.name"), "spawn");
    assert_string_equal(str_at(r, "output.0.namespace"), "collab");
    assert_string_equal(str_at(r, "output.1.name"), "f");
    assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "output"), 1), "namespace"));
    assert_string_equal(str_at(r, "output.2.name"), "other.x"); /* a dotted name of no namespace stays whole */
    cJSON_Delete(r);
    api_resp_req_free(&rq);

    /* hosted tools alone: the chat request has no tools */
    c = translate("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", &rq);
    assert_null(cJSON_GetObjectItem(c, "tools"));
    assert_string_equal(rq.ignored_tools, "web_search");
    cJSON_Delete(c);
    api_resp_req_free(&rq);
}

/* sse_events, with the Responses API's consecutive sequence numbers checked. */
static int events(const bytebuf *out, cJSON **ev, int cap)
{
    int n = sse_events(out, ev, cap);
    for (int i = 0; i < n; i++) assert_int_equal(cJSON_GetObjectItem(ev[i], "sequence_number")->valueint, i);
    return n;
}

static void test_stream(void **state)
{
    (void)state;
    bytebuf out = {0};
    api_resp_stream s;
    chat_tool_call call = {0, "call_abc", "f", "{\"x\":1}", true};
    api_usage u = {10, 0, 6};
    api_resp_stream_begin(&s, &meta, &echo, &out);
    api_resp_stream_reasoning(&s, "thi", 3);
    api_resp_stream_reasoning(&s, "nk", 2);
    api_resp_stream_text(&s, "Hel", 3);
    api_resp_stream_text(&s, "lo", 2);
    api_resp_stream_call(&s, &call);
    api_resp_stream_end(&s, false, &u, NULL);
    api_resp_stream_free(&s);
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"};
    enum { N = sizeof want / sizeof want[0] };
    cJSON *ev[N + 4];
    assert_int_equal(events(&out, ev, N + 4), N);
    for (int i = 0; i < N; i++) assert_string_equal(str_at(ev[i], "type"), want[i]);
    assert_string_equal(str_at(ev[0], "response.status"), "in_progress");
    assert_int_equal(cJSON_GetObjectItem(ev[4], "output_index")->valueint, 0);
    assert_string_equal(str_at(ev[6], "text"), "think");
    assert_int_equal(cJSON_GetObjectItem(ev[11], "output_index")->valueint, 1);
    assert_string_equal(str_at(ev[13], "text"), "Hello");
    assert_int_equal(cJSON_GetObjectItem(ev[17], "output_index")->valueint, 2);
    assert_string_equal(str_at(ev[18], "arguments"), "{\"x\":1}");
    assert_string_equal(str_at(ev[N - 1], "response.status"), "completed");
    assert_string_equal(str_at(ev[N - 1], "response.output.1.content.0.text"), "Hello");
    assert_string_equal(str_at(ev[N - 1], "response.output.2.name"), "f");
    for (int i = 0; i < N; i++) cJSON_Delete(ev[i]);
    bytebuf_free(&out);

    /* nothing generated: one empty message; a failure: response.failed with the error */
    api_resp_stream_begin(&s, &meta, &echo, &out);
    api_resp_stream_end(&s, true, &u, NULL);
    api_resp_stream_free(&s);
    int n = events(&out, ev, N);
    assert_int_equal(n, 8); /* created, in_progress, item/part added, text/part/item done, incomplete */
    assert_string_equal(str_at(ev[2], "item.type"), "message");
    assert_string_equal(str_at(ev[7], "type"), "response.incomplete");
    assert_string_equal(str_at(ev[7], "response.output.0.status"), "incomplete");
    for (int i = 0; i < n; i++) cJSON_Delete(ev[i]);
    bytebuf_free(&out);

    api_error err;
    api_error_set(&err, 500, "server_error", NULL, "engine_error", "Generation failed: boom");
    api_resp_stream_begin(&s, &meta, &echo, &out);
    api_resp_stream_text(&s, "x", 1);
    api_resp_stream_end(&s, false, &u, &err);
    api_resp_stream_free(&s);
    n = events(&out, ev, N);
    assert_string_equal(str_at(ev[n - 1], "type"), "response.failed");
    assert_string_equal(str_at(ev[n - 1], "response.error.code"), "engine_error");
    for (int i = 0; i < n; i++) cJSON_Delete(ev[i]);
    bytebuf_free(&out);
}

/* A streamed call in pieces (chat_parse.h): the item opens with its name and empty arguments,
 * each fragment is an arguments delta, the last closes it with the whole arguments. */
static void test_stream_call_pieces(void **state)
{
    (void)state;
    bytebuf out = {0};
    api_resp_stream s;
    chat_tool_call pieces[] = {{0, "call_abc", "f", "{\"x\"", false}, {0, NULL, NULL, ":1", false}, {0, NULL, NULL, "}", true}};
    api_usage u = {10, 0, 6};
    api_resp_stream_begin(&s, &meta, &echo, &out);
    for (int i = 0; i < 3; i++) api_resp_stream_call(&s, &pieces[i]);
    api_resp_stream_end(&s, false, &u, NULL);
    api_resp_stream_free(&s);
    static const char *const want[] = {
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"};
    enum { N = sizeof want / sizeof want[0] };
    cJSON *ev[N + 4];
    assert_int_equal(events(&out, ev, N + 4), N);
    for (int i = 0; i < N; i++) assert_string_equal(str_at(ev[i], "type"), want[i]);
    assert_string_equal(str_at(ev[2], "item.name"), "f");
    assert_string_equal(str_at(ev[2], "item.arguments"), "");
    assert_string_equal(str_at(ev[3], "delta"), "{\"x\"");
    assert_string_equal(str_at(ev[4], "delta"), ":1");
    assert_string_equal(str_at(ev[3], "item_id"), str_at(ev[2], "item.id"));
    assert_string_equal(str_at(ev[6], "arguments"), "{\"x\":1}");
    assert_string_equal(str_at(ev[7], "item.arguments"), "{\"x\":1}");
    assert_string_equal(str_at(ev[N - 1], "response.output.0.arguments"), "{\"x\":1}");
    for (int i = 0; i < N; i++) cJSON_Delete(ev[i]);
    bytebuf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translate), cmocka_unit_test(test_refusals), cmocka_unit_test(test_rename),
        cmocka_unit_test(test_whole_response), cmocka_unit_test(test_stream), cmocka_unit_test(test_stream_call_pieces),
        cmocka_unit_test(test_hosted_and_namespace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
