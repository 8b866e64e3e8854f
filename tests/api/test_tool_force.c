/* test_tool_force.c - the grammar of a chat request with tools (src/api/tool_force.c): a
 * forced call beside a response format (issue 33: OpenAI's API takes the pair, the call comes
 * first), and tool_choice auto beside a JSON-schema format: a call or the schema's answer; on
 * Harmony, a schema's answer behind the final channel's header, with tools or without. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "api/tool_force.h"
#include "../grammar/grammar_matches.h"

#define N_VOCAB 1000

static const char TOOLS[] =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"q\":{\"type\":\"string\"}},\"required\":[\"q\"]}}}]";
static const char FORMAT[] =
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"object\","
    "\"properties\":{\"answer\":{\"type\":\"string\"}},\"required\":[\"answer\"],\"additionalProperties\":false}}}";

static const char CALL[] = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
static const char CALL2[] = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>";
static const char ANSWER[] = "{\"answer\": \"sunny\"}";

/* A chat body of one user message and the given members. */
static void parse(api_request *r, const char *members)
{
    char body[4096];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],%s}", members);
    api_error e = {0};
    if (api_request_parse(API_CHAT, body, strlen(body), N_VOCAB, r, &e) != 0) fail_msg("parse: %s", e.message);
}


static void test_forced_with_format(void **state)
{
    (void)state;
    char members[2048];
    api_request r;
    api_error e = {0};
    snprintf(members, sizeof members, "%s,%s,\"tool_choice\":\"required\"", TOOLS, FORMAT);
    parse(&r, members);
    assert_non_null(r.format_schema);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HERMES, &e), 0);
    assert_true(matches(r.grammar, CALL));
    assert_true(matches(r.grammar, CALL2));
    assert_false(matches(r.grammar, ANSWER)); /* this turn is a call */
    api_request_free(&r);

    snprintf(members, sizeof members, "%s,%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"search\"}}",
             TOOLS, FORMAT);
    parse(&r, members);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HERMES, &e), 0);
    assert_true(matches(r.grammar, CALL2));
    assert_false(matches(r.grammar, CALL));
    api_request_free(&r);
}

static void test_auto_with_format(void **state)
{
    (void)state;
    char members[2048];
    api_request r;
    api_error e = {0};
    snprintf(members, sizeof members, "%s,%s", TOOLS, FORMAT);
    parse(&r, members);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HERMES, &e), 0);
    assert_true(matches(r.grammar, CALL));
    assert_true(matches(r.grammar, CALL2));
    assert_true(matches(r.grammar, ANSWER));
    assert_false(matches(r.grammar, "{\"other\": 1}"));
    assert_false(matches(r.grammar, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
    api_request_free(&r);

    /* json_object: a call or any object; Mistral's markup */
    snprintf(members, sizeof members, "%s,\"response_format\":{\"type\":\"json_object\"}", TOOLS);
    parse(&r, members);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_MISTRAL, &e), 0);
    assert_true(matches(r.grammar, "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}]"));
    assert_true(matches(r.grammar, "{\"a\": [1, 2]}"));
    assert_false(matches(r.grammar, "plain text"));
    api_request_free(&r);

    /* Instructor's JSON_SCHEMA mode: json_object with its schema, honoured beside the tools too */
    snprintf(members, sizeof members,
             "%s,\"response_format\":{\"type\":\"json_object\",\"schema\":{\"type\":\"object\",\"properties\":"
             "{\"answer\":{\"type\":\"string\"}},\"required\":[\"answer\"],\"additionalProperties\":false}}", TOOLS);
    parse(&r, members);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HERMES, &e), 0);
    assert_true(matches(r.grammar, ANSWER));
    assert_true(matches(r.grammar, CALL));
    assert_false(matches(r.grammar, "{\"a\": 1}"));
    api_request_free(&r);
}

/* What keeps the request's own grammar, or refuses. */
static void test_left_alone(void **state)
{
    (void)state;
    char members[2048];
    api_request r;
    api_error e = {0};
    /* a GBNF grammar covers the whole reply: it cannot be offered beside a call */
    snprintf(members, sizeof members, "%s,\"grammar\":\"root ::= \\\"yes\\\" | \\\"no\\\"\"", TOOLS);
    parse(&r, members);
    assert_null(r.format_schema);
    grammar *g = r.grammar;
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HERMES, &e), 0);
    assert_ptr_equal(r.grammar, g);
    api_request_free(&r);

    /* tools, auto, no format: nothing to constrain */
    parse(&r, TOOLS);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HERMES, &e), 0);
    assert_null(r.grammar);
    api_request_free(&r);

    /* tool_choice none: the format alone */
    snprintf(members, sizeof members, "%s,%s,\"tool_choice\":\"none\"", TOOLS, FORMAT);
    parse(&r, members);
    g = r.grammar;
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HERMES, &e), 0);
    assert_ptr_equal(r.grammar, g);
    assert_true(matches(r.grammar, ANSWER));
    api_request_free(&r);

    /* a family without known markup: auto keeps the format, a forced call is a 400 */
    snprintf(members, sizeof members, "%s,%s", TOOLS, FORMAT);
    parse(&r, members);
    g = r.grammar;
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_NONE, &e), 0);
    assert_ptr_equal(r.grammar, g);
    api_request_free(&r);
    snprintf(members, sizeof members, "%s,%s,\"tool_choice\":\"required\"", TOOLS, FORMAT);
    parse(&r, members);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_NONE, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "tool_choice");
    api_request_free(&r);
}


/* Harmony (gpt-oss): the call in its markup -- the recipient in the channel header, the JSON
 * content type, the arguments; no suffix (<|call|> ends generation) -- and the name in
 * markup, never a look-alike. */
static void test_harmony(void **state)
{
    (void)state;
    char members[2048];
    api_request r;
    api_error e = {0};
    snprintf(members, sizeof members, "%s,\"tool_choice\":\"required\"", TOOLS);
    parse(&r, members);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HARMONY, &e), 0);
    assert_true(matches(r.grammar, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}"));
    assert_true(matches(r.grammar, "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"q\": \"x\"}"));
    assert_false(matches(r.grammar, "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"city\": \"Oslo\"}"));
    assert_false(matches(r.grammar, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>"));
    assert_false(matches(r.grammar, "<|channel|>final<|message|>{\"city\": \"Oslo\"}"));
    api_request_free(&r);
    /* auto beside a format: the call, or the answer on the final channel (read back as content) */
    snprintf(members, sizeof members, "%s,%s", TOOLS, FORMAT);
    parse(&r, members);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HARMONY, &e), 0);
    assert_true(matches(r.grammar, "<|channel|>final<|message|>{\"answer\": \"sunny\"}"));
    assert_false(matches(r.grammar, ANSWER)); /* never without the channel's header */
    assert_true(matches(r.grammar, "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"q\": \"x\"}"));
    api_request_free(&r);
}

/* Structured output without tools on Harmony (gpt-oss): the answer opens with the final
 * channel's header, which the model was trained to write before an answer, then the schema's
 * JSON; json_object and tool_choice none alike.  A GBNF grammar (the whole reply, markup
 * included: the client's) and the other families' formats are left as they are. */
static void test_harmony_answer_header(void **state)
{
    (void)state;
    char members[2048];
    api_request r;
    api_error e = {0};
    parse(&r, FORMAT);
    grammar *plain = r.grammar;
    assert_true(matches(plain, ANSWER));
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HARMONY, &e), 0);
    assert_ptr_not_equal(r.grammar, plain);
    assert_true(matches(r.grammar, "<|channel|>final<|message|>{\"answer\": \"sunny\"}"));
    assert_false(matches(r.grammar, ANSWER));
    assert_false(matches(r.grammar, "<|channel|>analysis<|message|>{\"answer\": \"sunny\"}"));
    assert_false(matches(r.grammar, "<|channel|>final<|message|>{\"other\": 1}"));
    api_request_free(&r);

    parse(&r, "\"response_format\":{\"type\":\"json_object\"}");
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HARMONY, &e), 0);
    assert_true(matches(r.grammar, "<|channel|>final<|message|>{\"a\": [1, 2]}"));
    assert_false(matches(r.grammar, "{\"a\": [1, 2]}"));
    api_request_free(&r);

    snprintf(members, sizeof members, "%s,%s,\"tool_choice\":\"none\"", TOOLS, FORMAT);
    parse(&r, members);
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HARMONY, &e), 0);
    assert_true(matches(r.grammar, "<|channel|>final<|message|>{\"answer\": \"sunny\"}"));
    assert_false(matches(r.grammar, "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"q\": \"x\"}"));
    api_request_free(&r);

    /* a GBNF grammar covers the whole reply, markup and all: left as it is */
    parse(&r, "\"grammar\":\"root ::= \\\"<|channel|>final<|message|>yes\\\"\"");
    grammar *g = r.grammar;
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HARMONY, &e), 0);
    assert_ptr_equal(r.grammar, g);
    api_request_free(&r);

    /* other families: the schema's grammar as it is */
    parse(&r, FORMAT);
    g = r.grammar;
    assert_int_equal(tool_force_apply(&r, CHAT_SYNTAX_HERMES, &e), 0);
    assert_ptr_equal(r.grammar, g);
    api_request_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forced_with_format),
        cmocka_unit_test(test_auto_with_format),
        cmocka_unit_test(test_left_alone),
        cmocka_unit_test(test_harmony),
        cmocka_unit_test(test_harmony_answer_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
