/* test_http_parse.c - request parsing and validation of /v1/completions and
 * /v1/chat/completions: every accepted form and every error case (status, param, code). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <time.h>

#include "api/api_request.h"
#include "base/file.h"
#include "text/jinja.h"

#define N_VOCAB 1000

static int parse(api_kind kind, const char *body, api_request *r, api_error *e)
{
    memset(e, 0, sizeof *e);
    return api_request_parse(kind, body, strlen(body), N_VOCAB, r, e);
}

static void ok(api_kind kind, const char *body, api_request *r)
{
    api_error e;
    int rc = parse(kind, body, r, &e);
    if (rc != 0) fail_msg("unexpected error for %s: %s", body, e.message);
}

/* Expect a 400 (or other status) naming param (NULL: param must be null). */
static void bad(api_kind kind, const char *body, int status, const char *param)
{
    api_request r;
    api_error e;
    assert_int_equal(parse(kind, body, &r, &e), -1);
    assert_int_equal(e.status, status);
    assert_string_equal(e.type, "invalid_request_error");
    assert_string_equal(e.param, param ? param : "");
    assert_true(strlen(e.message) > 10);
    /* nothing to free after a failure, and freeing again is harmless */
    assert_null(r.prompts);
    assert_null(r.msgs);
}

static void test_completion_defaults(void **state)
{
    (void)state;
    api_request r;
    ok(API_COMPLETIONS, "{\"model\":\"x\",\"prompt\":\"Hello\"}", &r);
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "Hello");
    assert_int_equal(r.prompts[0].text_len, 5);
    assert_null(r.prompts[0].ids);
    assert_int_equal(r.max_tokens, 16);
    assert_int_equal(r.n, 1);
    assert_false(r.stream);
    assert_false(r.echo);
    assert_int_equal(r.logprobs, -1);
    assert_int_equal(r.sp.n_top_logprobs, -1);
    assert_true(r.sp.temperature == 1.0f);
    assert_true(r.sp.top_p == 1.0f);
    assert_false(r.has_seed);
    assert_int_equal(r.n_stop, 0);
    assert_int_equal(r.sp.penalty_last_n, 64); /* llama.cpp's window; neutral penalties are off */
    api_request_free(&r);
}

static void test_completion_all_fields(void **state)
{
    (void)state;
    api_request r;
    ok(API_COMPLETIONS,
       "{\"prompt\":\"a\",\"max_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"top_k\":40,\"min_p\":0.1,"
       "\"n\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"stop\":[\"x\",\"\",\"yz\"],"
       "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repeat_penalty\":1.1,"
       "\"logit_bias\":{\"5\":-100,\"999\":2.5},\"logprobs\":3,\"echo\":true,\"seed\":42,\"user\":\"u\","
       "\"ignore_eos\":true,\"speculative\":false,\"some_future_field\":{\"a\":[1,2]}}",
       &r);
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.sp.temperature == 0.0f);
    assert_true(r.sp.top_p == 0.5f);
    assert_int_equal(r.sp.top_k, 40);
    assert_true(r.sp.min_p == 0.1f);
    assert_int_equal(r.n, 3);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_int_equal(r.n_stop, 2); /* the empty stop string is dropped */
    assert_string_equal(r.stop[0], "x");
    assert_string_equal(r.stop[1], "yz");
    assert_true(r.sp.presence_penalty == 0.5f);
    assert_true(r.sp.frequency_penalty == -0.5f);
    assert_true(r.sp.repeat_penalty == 1.1f);
    assert_int_equal(r.sp.penalty_last_n, 64);
    assert_int_equal(r.n_bias, 2);
    assert_ptr_equal(r.sp.bias_ids, r.bias_ids);
    assert_int_equal(r.sp.n_bias, 2);
    assert_int_equal(r.bias_ids[0], 5);
    assert_true(r.bias_vals[0] == -100.0f);
    assert_int_equal(r.bias_ids[1], 999);
    assert_true(r.bias_vals[1] == 2.5f);
    assert_int_equal(r.logprobs, 3);
    assert_int_equal(r.sp.n_top_logprobs, 3);
    assert_true(r.echo);
    assert_true(r.has_seed);
    assert_int_equal(r.sp.seed, 42);
    assert_true(r.ignore_eos);
    assert_false(r.speculative);
    api_request_free(&r);
}

static void test_prompt_forms(void **state)
{
    (void)state;
    api_request r;
    ok(API_COMPLETIONS, "{\"prompt\":[\"one\",\"two\"]}", &r);
    assert_int_equal(r.n_prompts, 2);
    assert_true(r.speculative); /* unless the request opts out, the server's --speculative decides */
    assert_string_equal(r.prompts[1].text, "two");
    api_request_free(&r);

    ok(API_COMPLETIONS, "{\"prompt\":[1,2,999]}", &r);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 999);
    assert_null(r.prompts[0].text);
    api_request_free(&r);

    ok(API_COMPLETIONS, "{\"prompt\":[[1,2],[3]],\"n\":2}", &r);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[0].n_ids, 2);
    assert_int_equal(r.prompts[1].ids[0], 3);
    api_request_free(&r);

    ok(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":\"END\",\"max_tokens\":null,\"seed\":-1}", &r);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "END");
    assert_int_equal(r.max_tokens, 16); /* null means default */
    assert_int_equal(r.sp.seed, UINT64_MAX);
    api_request_free(&r);
}

static void test_prompt_errors(void **state)
{
    (void)state;
    bad(API_COMPLETIONS, "{}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":\"\"}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":[]}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":[[]]}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":[\"a\",\"\"]}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":42}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":[1,1000]}", 400, "prompt");   /* id outside the vocabulary */
    bad(API_COMPLETIONS, "{\"prompt\":[1,-1]}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":[1,2.5]}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":[1,\"a\"]}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":[\"a\",3]}", 400, "prompt");
    bad(API_COMPLETIONS, "{\"prompt\":[{\"a\":1}]}", 400, "prompt");
    /* 3 prompts x n=100 is more choices than one request may ask for */
    bad(API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":100}", 400, "prompt");
}

static void test_malformed_body(void **state)
{
    (void)state;
    bad(API_COMPLETIONS, "{\"prompt\":", 400, NULL);
    bad(API_COMPLETIONS, "", 400, NULL);
    bad(API_CHAT, "[1,2]", 400, NULL);
    bad(API_CHAT, "\"text\"", 400, NULL);
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]} trailing", 400, NULL);
}

/* What cJSON accepts but the server would read differently: a NUL that C strings end at, a
 * key given twice (parsers disagree on which wins), a number too large for a double. */
static void test_nul_and_duplicate_keys(void **state)
{
    (void)state;
    bad(API_COMPLETIONS, "{\"prompt\":\"Once\\u0000 upon\"}", 400, NULL);
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", 400, NULL);
    static const char raw[] = "{\"prompt\":\"Once\0 upon\"}";
    api_request r;
    api_error e;
    assert_int_equal(api_request_parse(API_COMPLETIONS, raw, sizeof raw - 1, N_VOCAB, &r, &e), -1);
    assert_int_equal(e.status, 400);
    bad(API_COMPLETIONS, "{\"prompt\":\"a\",\"prompt\":\"b\"}", 400, NULL);
    bad(API_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":1,\"6\":2,\"5\":-1}}", 400, NULL);
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"x\"}]}", 400, NULL);
    /* a number beyond a double (cJSON reads infinity), named by its key, anywhere in the body */
    bad(API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":1e400}", 400, "max_tokens");
    bad(API_COMPLETIONS, "{\"prompt\":[1,2,-1e999]}", 400, NULL);
    /* an escaped backslash before u0000 is the text \u0000, not a NUL; equal values in
     * different objects are not duplicates */
    ok(API_COMPLETIONS, "{\"prompt\":\"a\\\\u0000\"}", &r);
    api_request_free(&r);
    ok(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"y\"}]}", &r);
    api_request_free(&r);
}

static void test_range_errors(void **state)
{
    (void)state;
    static const struct { const char *body, *param; } cases[] = {
        {"{\"prompt\":\"a\",\"temperature\":-0.1}", "temperature"},
        {"{\"prompt\":\"a\",\"temperature\":2.5}", "temperature"},
        {"{\"prompt\":\"a\",\"top_p\":0}", "top_p"},
        {"{\"prompt\":\"a\",\"top_p\":1.01}", "top_p"},
        {"{\"prompt\":\"a\",\"n\":0}", "n"},
        {"{\"prompt\":\"a\",\"n\":129}", "n"},
        {"{\"prompt\":\"a\",\"n\":1.5}", "n"},
        {"{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens"},
        {"{\"prompt\":\"a\",\"max_tokens\":-5}", "max_tokens"},
        {"{\"prompt\":\"a\",\"top_k\":-1}", "top_k"},
        {"{\"prompt\":\"a\",\"min_p\":1.5}", "min_p"},
        {"{\"prompt\":\"a\",\"presence_penalty\":3}", "presence_penalty"},
        {"{\"prompt\":\"a\",\"frequency_penalty\":-2.5}", "frequency_penalty"},
        {"{\"prompt\":\"a\",\"repeat_penalty\":0}", "repeat_penalty"},
        {"{\"prompt\":\"a\",\"logprobs\":21}", "logprobs"},
        {"{\"prompt\":\"a\",\"logprobs\":-1}", "logprobs"},
        {"{\"prompt\":\"a\",\"seed\":1.5}", "seed"},
        {"{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop"},
        {"{\"prompt\":\"a\",\"logit_bias\":{\"1000\":1}}", "logit_bias"},
        {"{\"prompt\":\"a\",\"logit_bias\":{\"abc\":1}}", "logit_bias"},
        {"{\"prompt\":\"a\",\"logit_bias\":{\"3\":101}}", "logit_bias"},
        {"{\"prompt\":\"a\",\"logit_bias\":{\"3\":\"x\"}}", "logit_bias"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) bad(API_COMPLETIONS, cases[i].body, 400, cases[i].param);
}

static void test_type_errors(void **state)
{
    (void)state;
    static const struct { const char *body, *param; } cases[] = {
        {"{\"prompt\":\"a\",\"temperature\":\"hot\"}", "temperature"},
        {"{\"prompt\":\"a\",\"max_tokens\":\"10\"}", "max_tokens"},
        {"{\"prompt\":\"a\",\"stream\":1}", "stream"},
        {"{\"prompt\":\"a\",\"stream_options\":true}", "stream_options"},
        {"{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":\"yes\"}}", "stream_options.include_usage"},
        {"{\"prompt\":\"a\",\"echo\":\"true\"}", "echo"},
        {"{\"prompt\":\"a\",\"stop\":5}", "stop"},
        {"{\"prompt\":\"a\",\"stop\":[\"a\",5]}", "stop"},
        {"{\"prompt\":\"a\",\"logit_bias\":[1,2]}", "logit_bias"},
        {"{\"prompt\":\"a\",\"model\":7}", "model"},
        {"{\"prompt\":\"a\",\"user\":[]}", "user"},
        {"{\"prompt\":\"a\",\"ignore_eos\":0}", "ignore_eos"},
        {"{\"prompt\":\"a\",\"speculative\":\"no\"}", "speculative"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) bad(API_COMPLETIONS, cases[i].body, 400, cases[i].param);
    api_request r;
    api_error e;
    assert_int_equal(parse(API_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":\"no\"}", &r, &e), -1);
    assert_string_equal(e.code, "invalid_type");
    assert_non_null(strstr(e.message, "'stream'"));
    assert_non_null(strstr(e.message, "boolean"));
}

static void test_chat(void **state)
{
    (void)state;
    api_request r;
    ok(API_CHAT,
       "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello \"},{\"type\":\"text\",\"text\":\"there\"}]},"
       "{\"role\":\"assistant\",\"content\":null},{\"role\":\"developer\",\"content\":\"d\",\"name\":\"x\"}],"
       "\"max_completion_tokens\":9,\"logprobs\":true,\"top_logprobs\":2,\"tools\":[]}",
       &r);
    assert_int_equal(r.n_msgs, 4);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[0].content, "Be brief.");
    assert_string_equal(r.msgs[1].role, "user");
    assert_string_equal(r.msgs[1].content, "Hello there");
    assert_string_equal(r.msgs[2].role, "assistant");
    assert_string_equal(r.msgs[2].content, "");
    assert_string_equal(r.msgs[3].role, "system"); /* developer is OpenAI's new name for system */
    assert_int_equal(r.max_tokens, 9);
    assert_int_equal(r.logprobs, 2);
    assert_int_equal(r.sp.n_top_logprobs, 2);
    api_request_free(&r);

    ok(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":5,\"logprobs\":true}", &r);
    assert_int_equal(r.max_tokens, 5);
    assert_int_equal(r.logprobs, 0); /* logprobs without top_logprobs: the chosen token only */
    api_request_free(&r);

    ok(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r);
    assert_int_equal(r.max_tokens, 0); /* chat: up to the context */
    assert_int_equal(r.logprobs, -1);
    api_request_free(&r);
}

static void test_chat_errors(void **state)
{
    (void)state;
    bad(API_CHAT, "{}", 400, "messages");
    bad(API_CHAT, "{\"messages\":[]}", 400, "messages");
    bad(API_CHAT, "{\"messages\":\"hi\"}", 400, "messages");
    bad(API_CHAT, "{\"messages\":[\"hi\"]}", 400, "messages[0]");
    bad(API_CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "messages[0].role");
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"wizard\",\"content\":\"hi\"}]}",
        400, "messages[1].role");
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content");
    bad(API_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
        400, "messages[0].content");
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
        "messages[0].content");
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400, "top_logprobs");
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}",
        400, "top_logprobs");
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", 400, "logprobs");
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}", 400,
        "max_completion_tokens");
}

/* Arrays over API_MAX_ITEMS are refused before they are walked, in OpenAI's words. */
static void test_item_limits(void **state)
{
    (void)state;
    static char body[128 * (API_MAX_ITEMS + 2)];
    api_request r;
    api_error e;
    const char *const shapes[][3] = {
        {"{\"messages\":[", "{\"role\":\"user\",\"content\":\"x\"}", "]}"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[", "{\"type\":\"text\",\"text\":\"x\"}", "]}]}"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[",
         "{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}", "]}]}"},
    };
    const char *const params[] = {"messages", "messages[0].content", "messages[0].tool_calls"};
    for (int s = 0; s < 3; s++) {
        for (int n = API_MAX_ITEMS; n <= API_MAX_ITEMS + 1; n++) {
            size_t o = (size_t)snprintf(body, sizeof body, "%s", shapes[s][0]);
            for (int i = 0; i < n; i++) o += (size_t)snprintf(body + o, sizeof body - o, "%s%s", i ? "," : "", shapes[s][1]);
            snprintf(body + o, sizeof body - o, "%s", shapes[s][2]);
            assert_true(strlen(body) < sizeof body - 1);
            if (n == API_MAX_ITEMS) {
                ok(API_CHAT, body, &r); /* the limit itself is fine */
                api_request_free(&r);
                continue;
            }
            bad(API_CHAT, body, 400, params[s]);
            assert_int_equal(parse(API_CHAT, body, &r, &e), -1);
            assert_string_equal(e.code, "array_above_max_length");
            assert_non_null(strstr(e.message, "maximum length 2048, but got an array with length 2049"));
        }
    }
}

/* The offered tools' names are kept: a reply may call those and no other. */
static void test_tool_names(void **state)
{
    (void)state;
    api_request r;
    ok(API_CHAT,
       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"parallel_tool_calls\":false,\"tools\":["
       "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
       "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{}}}]}",
       &r);
    assert_int_equal(r.n_tools, 2);
    assert_string_equal(r.tool_names[0], "get_weather");
    assert_string_equal(r.tool_names[1], "get_time");
    assert_false(r.parallel_tool_calls);
    api_request_free(&r);
    assert_null(r.tool_names);
}

/* OpenAI parameters that would change the result if ignored are refused by name; their
 * neutral values, and hints and metadata, are accepted. */
static void test_unsupported_parameters(void **state)
{
    (void)state;
    static const char *const refused_chat[][2] = {
        {"\"functions\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}]", "functions"},
        {"\"function_call\":\"auto\"", "function_call"},
        {"\"audio\":{\"voice\":\"alloy\",\"format\":\"wav\"}", "audio"},
        {"\"modalities\":[\"text\",\"audio\"]", "modalities"},
        {"\"modalities\":\"text\"", "modalities"},
        {"\"web_search_options\":{}", "web_search_options"},
    };
    char body[512];
    for (size_t i = 0; i < sizeof refused_chat / sizeof refused_chat[0]; i++) {
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}", refused_chat[i][0]);
        bad(API_CHAT, body, 400, refused_chat[i][1]);
    }
    api_request r;
    api_error e;
    assert_int_equal(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[]}", &r, &e), -1);
    assert_string_equal(e.code, "unsupported_parameter");
    assert_non_null(strstr(e.message, "'tools'"));
    ok(API_CHAT,
       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"modalities\":[\"text\"],\"functions\":null,"
       "\"store\":false,\"metadata\":{\"a\":\"b\"},\"service_tier\":\"auto\",\"prediction\":{\"type\":\"content\","
       "\"content\":\"y\"},\"reasoning_effort\":\"low\"}",
       &r);
    api_request_free(&r);

    bad(API_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":\"end\"}", 400, "suffix");
    bad(API_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":3}", 400, "suffix");
    bad(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":2}", 400, "best_of");
    bad(API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":2,\"best_of\":3}", 400, "best_of");
    bad(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":1.5}", 400, "best_of");
    ok(API_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":\"\",\"n\":2,\"best_of\":2}", &r);
    assert_int_equal(r.n, 2);
    api_request_free(&r);
    ok(API_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":null,\"best_of\":1}", &r);
    api_request_free(&r);
}

static void test_error_set(void **state)
{
    (void)state;
    api_error e;
    api_error_set(&e, 429, "rate_limit_error", NULL, "queue_full", "busy %d", 3);
    assert_int_equal(e.status, 429);
    assert_string_equal(e.param, "");
    assert_string_equal(e.code, "queue_full");
    assert_string_equal(e.message, "busy 3");
}

/* Issue 33: an assistant turn with content null (the OpenAI SDKs' tool round trip) reaches the
 * template with content "", as llama.cpp passes it.  Every template of ../shared/chat renders
 * the shared null-content conversation as it renders the same with "" (Qwen3's raised
 * "argument of type 'NoneType' is not iterable"); a template that refuses the conversation for
 * another reason (Gemma 3's role alternation) still refuses it. */
static void test_null_content_templates(void **state)
{
    (void)state;
    const char *shared = getenv("INFERD_SHARED_DIR") && *getenv("INFERD_SHARED_DIR") ? getenv("INFERD_SHARED_DIR")
                                                                                       : INFERD_SHARED_DIR;
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/chat/vectors.json", shared);
    char *json = file_read_all(path, (size_t)1 << 30, NULL, err, sizeof err);
    if (!json) skip();
    cJSON *v = cJSON_Parse(json);
    free(json);
    const cJSON *conv = NULL, *c, *tmpl;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(v, "conversations"))
        if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c, "id")), "tools-roundtrip-null-content")) conv = c;
    assert_non_null(conv);
    /* the body as an OpenAI client sends it: arguments as JSON strings, content null */
    cJSON *body = cJSON_CreateObject(), *msgs = cJSON_Duplicate(cJSON_GetObjectItem(conv, "messages"), 1), *m;
    cJSON *blank = cJSON_Duplicate(msgs, 1); /* the same with content "" (what the template must see) */
    cJSON_ArrayForEach(m, blank) if (cJSON_IsNull(cJSON_GetObjectItem(m, "content")))
        cJSON_ReplaceItemInObject(m, "content", cJSON_CreateString(""));
    bool had_null = false;
    cJSON_ArrayForEach(m, msgs) {
        had_null = had_null || cJSON_IsNull(cJSON_GetObjectItem(m, "content"));
        cJSON *tc;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItem(m, "tool_calls")) {
            cJSON *fn = cJSON_GetObjectItem(tc, "function");
            char *args = cJSON_PrintUnformatted(cJSON_GetObjectItem(fn, "arguments"));
            cJSON_ReplaceItemInObject(fn, "arguments", cJSON_CreateString(args));
            free(args);
        }
    }
    assert_true(had_null);
    cJSON_AddItemToObject(body, "messages", msgs);
    cJSON_AddItemToObject(body, "tools", cJSON_Duplicate(cJSON_GetObjectItem(conv, "tools"), 1));
    char *text = cJSON_PrintUnformatted(body);
    api_request r;
    ok(API_CHAT, text, &r);
    free(text);
    int rendered = 0;
    cJSON_ArrayForEach(tmpl, cJSON_GetObjectItem(v, "expected")) {
        snprintf(path, sizeof path, "%s/chat/templates/%s.jinja", shared, tmpl->string);
        size_t len;
        char *src = file_read_all(path, (size_t)1 << 24, &len, err, sizeof err);
        assert_non_null(src);
        jinja_tmpl *t = jinja_parse(src, len, err, sizeof err);
        assert_non_null(t);
        /* the request's context, and the blank conversation's, with the template's tokens */
        cJSON *ctx = cJSON_Parse(r.tmpl_ctx), *want_ctx = cJSON_CreateObject(), *it;
        cJSON_AddItemToObject(want_ctx, "messages", cJSON_Duplicate(blank, 1));
        cJSON_AddItemToObject(want_ctx, "tools", cJSON_Duplicate(cJSON_GetObjectItem(conv, "tools"), 1));
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(tmpl, "special_tokens")) {
            cJSON_AddItemToObject(ctx, it->string, cJSON_Duplicate(it, 1));
            cJSON_AddItemToObject(want_ctx, it->string, cJSON_Duplicate(it, 1));
        }
        cJSON_AddTrueToObject(ctx, "add_generation_prompt");
        cJSON_AddTrueToObject(want_ctx, "add_generation_prompt");
        char *a = cJSON_PrintUnformatted(ctx), *b = cJSON_PrintUnformatted(want_ctx);
        struct tm now = {.tm_year = 126, .tm_mon = 0, .tm_mday = 15, .tm_hour = 12};
        jinja_opts o = {.now = &now};
        char err2[512] = "";
        char *got = jinja_render_json(t, a, strlen(a), &o, NULL, err, sizeof err);
        char *want = jinja_render_json(t, b, strlen(b), &o, NULL, err2, sizeof err2);
        print_message("%-12s %s\n", tmpl->string, got ? "renders" : err);
        assert_null(strstr(got ? got : err, "NoneType"));
        if (want) {
            assert_non_null(got);
            assert_string_equal(got, want);
            rendered++;
        } else {
            assert_null(got);
            assert_string_equal(err, err2);
        }
        free(got);
        free(want);
        free(a);
        free(b);
        cJSON_Delete(ctx);
        cJSON_Delete(want_ctx);
        jinja_free(t);
        free(src);
        if (!strcmp(tmpl->string, "qwen3")) assert_true(want != NULL); /* the template renders now */
    }
    assert_true(rendered >= 3);
    api_request_free(&r);
    cJSON_Delete(blank);
    cJSON_Delete(body);
    cJSON_Delete(v);
}

/* response_format json_object with a schema (llama-server's form, Instructor's JSON_SCHEMA
 * mode) is that schema; without one, any object.  format_schema keeps it for the tools. */
static void test_json_object_schema(void **state)
{
    (void)state;
    api_request r;
    ok(API_CHAT,
       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\","
       "\"schema\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}}}",
       &r);
    assert_non_null(r.grammar);
    assert_string_equal(r.format_schema, "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}");
    grammar_matcher *mt = grammar_matcher_new(r.grammar, NULL);
    assert_true(grammar_matcher_accept_bytes(mt, "{\"n\": 3}", 8) && grammar_matcher_is_complete(mt));
    grammar_matcher_free(mt);
    mt = grammar_matcher_new(r.grammar, NULL);
    assert_false(grammar_matcher_accept_bytes(mt, "{\"m\"", 4)); /* the schema, not any object */
    grammar_matcher_free(mt);
    api_request_free(&r);
    ok(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"}}", &r);
    assert_string_equal(r.format_schema, "{\"type\":\"object\"}");
    api_request_free(&r);
    ok(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"guided_regex\":\"a+\"}", &r);
    assert_null(r.format_schema); /* a regex is no JSON answer */
    api_request_free(&r);
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\",\"schema\":3}}",
        400, "response_format.schema");
    bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\",\"schema\":{\"type\":\"object\",\"if\":{}}}}",
        400, "response_format.schema");
}


/* What gpt-oss's template reads: an assistant turn's reasoning_content as `thinking` too (not
 * beside content in a turn that calls tools: that template refuses both), reasoning_effort as
 * a variable (chat_template_kwargs' own wins). */
static void test_harmony_context(void **state)
{
    (void)state;
    api_request r;
    ok(API_CHAT,
       "{\"reasoning_effort\":\"high\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
       "{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":\"r1\"},"
       "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"r2\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
       "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
       "{\"role\":\"assistant\",\"content\":\"pre\",\"reasoning_content\":\"r3\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
       "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
       "{\"role\":\"assistant\",\"content\":\"x\",\"reasoning_content\":\"r4\",\"thinking\":\"own\"}]}",
       &r);
    cJSON *ctx = cJSON_Parse(r.tmpl_ctx);
    const cJSON *m = cJSON_GetObjectItem(ctx, "messages");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(ctx, "reasoning_effort")), "high");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "thinking")), "r1");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 2), "thinking")), "r2");
    assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 3), "thinking"));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 4), "thinking")), "own");
    assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 0), "thinking"));
    cJSON_Delete(ctx);
    api_request_free(&r);
    /* tools without a description get "" for gpt-oss's template; one with a description keeps it */
    char *described = api_tmpl_ctx_describe_tools(
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"description\":\"G.\"}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"h\",\"description\":null}}],\"x\":1}");
    assert_string_equal(described, "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"\"}},"
                                    "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"description\":\"G.\"}},"
                                    "{\"type\":\"function\",\"function\":{\"name\":\"h\",\"description\":\"\"}}],\"x\":1}");
    free(described);
    assert_null(api_tmpl_ctx_describe_tools("[1]"));
    ok(API_CHAT, "{\"reasoning_effort\":\"high\",\"chat_template_kwargs\":{\"reasoning_effort\":\"low\"},"
                 "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", &r);
    ctx = cJSON_Parse(r.tmpl_ctx);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(ctx, "reasoning_effort")), "low");
    cJSON_Delete(ctx);
    api_request_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_defaults), cmocka_unit_test(test_completion_all_fields),
        cmocka_unit_test(test_prompt_forms),        cmocka_unit_test(test_prompt_errors),
        cmocka_unit_test(test_malformed_body),      cmocka_unit_test(test_range_errors),
        cmocka_unit_test(test_nul_and_duplicate_keys),
        cmocka_unit_test(test_type_errors),         cmocka_unit_test(test_chat),
        cmocka_unit_test(test_chat_errors),         cmocka_unit_test(test_unsupported_parameters),
        cmocka_unit_test(test_error_set),
        cmocka_unit_test(test_item_limits),
        cmocka_unit_test(test_tool_names),
        cmocka_unit_test(test_null_content_templates),
        cmocka_unit_test(test_json_object_schema),
        cmocka_unit_test(test_harmony_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
