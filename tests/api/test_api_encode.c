/* test_http_encode.c - OpenAI response/chunk/error JSON shapes, SSE framing, UTF-8 cleaning
 * of token pieces, and the Prometheus text of /metrics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "api/api_encode.h"
#include "http/metrics.h"

/* A fake vocabulary: token i is "t<i>", token 7 is a lone UTF-8 lead byte. */
static int fake_bytes(void *ctx, int32_t id, char *buf, int cap)
{
    (void)ctx;
    if (id < 0) return -1;
    if (id == 7) {
        if (cap > 0) buf[0] = (char)0xE2;
        return 1;
    }
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "t%d", id);
    memcpy(buf, tmp, (size_t)(n < cap ? n : cap));
    return n;
}
static const api_vocab vocab = {fake_bytes, NULL};

static cJSON *parsed(char *json)
{
    assert_non_null(json);
    cJSON *o = cJSON_Parse(json);
    free(json);
    assert_non_null(o);
    return o;
}

static const cJSON *get(const cJSON *o, const char *path0, ...)
{
    va_list ap;
    va_start(ap, path0);
    for (const char *k = path0; k; k = va_arg(ap, const char *)) {
        if (cJSON_IsArray(o)) o = cJSON_GetArrayItem(o, atoi(k));
        else o = cJSON_GetObjectItemCaseSensitive(o, k);
        assert_non_null(o);
    }
    va_end(ap);
    return o;
}

static void test_error_json(void **state)
{
    (void)state;
    api_error e;
    api_error_set(&e, 400, "invalid_request_error", "temperature", "invalid_value", "bad \"value\"");
    cJSON *o = parsed(api_error_json(&e));
    assert_int_equal(cJSON_GetArraySize(o), 1);
    assert_string_equal(get(o, "error", "message", NULL)->valuestring, "bad \"value\"");
    assert_string_equal(get(o, "error", "type", NULL)->valuestring, "invalid_request_error");
    assert_string_equal(get(o, "error", "param", NULL)->valuestring, "temperature");
    assert_string_equal(get(o, "error", "code", NULL)->valuestring, "invalid_value");
    cJSON_Delete(o);
    api_error_set(&e, 500, "server_error", NULL, NULL, "x");
    o = parsed(api_error_json(&e));
    assert_true(cJSON_IsNull(get(o, "error", "param", NULL)));
    assert_true(cJSON_IsNull(get(o, "error", "code", NULL)));
    cJSON_Delete(o);
}

static void test_completion_response(void **state)
{
    (void)state;
    api_meta m = {.kind = API_COMPLETIONS, .id = "cmpl-1", .model = "tiny", .created = 1700000000};
    engine_result toks[2] = {{.token = 3, .logprob = -0.5f, .n_top = 2, .top_ids = {3, 7}, .top_logprobs = {-0.5f, -1.5f}},
                           {.token = 12, .logprob = -0.25f}};
    api_choice ch[2] = {
        {.index = 0, .text = "t3t12", .text_len = 5, .tokens = toks, .n_tokens = 2, .logprobs = true,
         .text_offset = 4, .finish_reason = "length"},
        {.index = 1, .text = "ab", .text_len = 2, .finish_reason = "stop"},
    };
    api_usage u = {.prompt_tokens = 4, .completion_tokens = 3};
    cJSON *o = parsed(api_response_json(&m, ch, 2, &u, &vocab));
    assert_string_equal(get(o, "id", NULL)->valuestring, "cmpl-1");
    assert_string_equal(get(o, "object", NULL)->valuestring, "text_completion");
    assert_int_equal(get(o, "created", NULL)->valuedouble, 1700000000);
    assert_string_equal(get(o, "model", NULL)->valuestring, "tiny");
    assert_string_equal(get(o, "choices", "0", "text", NULL)->valuestring, "t3t12");
    assert_string_equal(get(o, "choices", "0", "finish_reason", NULL)->valuestring, "length");
    assert_string_equal(get(o, "choices", "1", "finish_reason", NULL)->valuestring, "stop");
    assert_int_equal(get(o, "choices", "1", "index", NULL)->valueint, 1);
    assert_true(cJSON_IsNull(get(o, "choices", "1", "logprobs", NULL)));
    assert_string_equal(get(o, "choices", "0", "logprobs", "tokens", "1", NULL)->valuestring, "t12");
    assert_true(get(o, "choices", "0", "logprobs", "token_logprobs", "0", NULL)->valuedouble == -0.5);
    assert_int_equal(get(o, "choices", "0", "logprobs", "text_offset", "0", NULL)->valueint, 4);
    assert_int_equal(get(o, "choices", "0", "logprobs", "text_offset", "1", NULL)->valueint, 6);
    assert_true(get(o, "choices", "0", "logprobs", "top_logprobs", "0", "t3", NULL)->valuedouble == -0.5);
    /* the partial UTF-8 piece is shown as U+FFFD, never as an invalid byte */
    assert_true(get(o, "choices", "0", "logprobs", "top_logprobs", "0", "\xEF\xBF\xBD", NULL)->valuedouble == -1.5);
    assert_int_equal(get(o, "usage", "prompt_tokens", NULL)->valueint, 4);
    assert_int_equal(get(o, "usage", "completion_tokens", NULL)->valueint, 3);
    assert_int_equal(get(o, "usage", "total_tokens", NULL)->valueint, 7);
    cJSON_Delete(o);
}

static void test_chat_response(void **state)
{
    (void)state;
    api_meta m = {.kind = API_CHAT, .id = "chatcmpl-1", .model = "tiny", .created = 5};
    engine_result tok = {.token = 7, .logprob = -0.1f, .n_top = 1, .top_ids = {7}, .top_logprobs = {-0.1f}};
    api_choice ch = {.index = 0, .text = "hi \"there\"\n", .text_len = 11, .tokens = &tok, .n_tokens = 1,
                     .logprobs = true, .finish_reason = "stop"};
    api_usage u = {.prompt_tokens = 2, .completion_tokens = 1};
    cJSON *o = parsed(api_response_json(&m, &ch, 1, &u, &vocab));
    assert_int_equal(get(o, "usage", "prompt_tokens_details", "cached_tokens", NULL)->valueint, 0);
    assert_string_equal(get(o, "object", NULL)->valuestring, "chat.completion");
    assert_string_equal(get(o, "choices", "0", "message", "role", NULL)->valuestring, "assistant");
    assert_string_equal(get(o, "choices", "0", "message", "content", NULL)->valuestring, "hi \"there\"\n");
    const cJSON *lp = get(o, "choices", "0", "logprobs", "content", "0", NULL);
    assert_string_equal(get(lp, "token", NULL)->valuestring, "\xEF\xBF\xBD");
    assert_int_equal(cJSON_GetArraySize(get(lp, "bytes", NULL)), 1);
    assert_int_equal(get(lp, "bytes", "0", NULL)->valueint, 0xE2); /* the raw byte survives here */
    assert_int_equal(cJSON_GetArraySize(get(lp, "top_logprobs", NULL)), 1);
    assert_string_equal(get(o, "choices", "0", "finish_reason", NULL)->valuestring, "stop");
    cJSON_Delete(o);
}

/* --deterministic: the fingerprint the server was started with, else null (OpenAI's shape). */
static void test_system_fingerprint(void **state)
{
    (void)state;
    api_meta m = {.kind = API_CHAT, .id = "c", .model = "tiny", .created = 5, .fingerprint = "fp_0123456789abcdef_det"};
    api_choice ch = {.index = 0, .text = "x", .text_len = 1, .finish_reason = "stop"};
    api_usage u = {.prompt_tokens = 1, .completion_tokens = 1};
    cJSON *o = parsed(api_response_json(&m, &ch, 1, &u, &vocab));
    assert_string_equal(get(o, "system_fingerprint", NULL)->valuestring, "fp_0123456789abcdef_det");
    cJSON_Delete(o);
    m.fingerprint = NULL;
    o = parsed(api_response_json(&m, &ch, 1, &u, &vocab));
    assert_true(cJSON_IsNull(get(o, "system_fingerprint", NULL)));
    cJSON_Delete(o);
}

static void test_chat_chunks(void **state)
{
    (void)state;
    api_meta m = {.kind = API_CHAT, .id = "c", .model = "tiny", .created = 5, .usage_null = true};
    api_choice first = {.index = 0, .text = "", .role = true};
    cJSON *o = parsed(api_chunk_json(&m, &first, &vocab));
    assert_string_equal(get(o, "object", NULL)->valuestring, "chat.completion.chunk");
    assert_string_equal(get(o, "choices", "0", "delta", "role", NULL)->valuestring, "assistant");
    assert_string_equal(get(o, "choices", "0", "delta", "content", NULL)->valuestring, "");
    assert_true(cJSON_IsNull(get(o, "choices", "0", "finish_reason", NULL)));
    assert_true(cJSON_IsNull(get(o, "usage", NULL)));
    cJSON_Delete(o);

    api_choice mid = {.index = 2, .text = "abc", .text_len = 2};
    o = parsed(api_chunk_json(&m, &mid, &vocab));
    assert_null(cJSON_GetObjectItem(get(o, "choices", "0", "delta", NULL), "role"));
    assert_string_equal(get(o, "choices", "0", "delta", "content", NULL)->valuestring, "ab");
    assert_int_equal(get(o, "choices", "0", "index", NULL)->valueint, 2);
    cJSON_Delete(o);

    api_choice last = {.index = 0, .text = "", .finish_reason = "length"};
    o = parsed(api_chunk_json(&m, &last, &vocab));
    assert_int_equal(cJSON_GetArraySize(get(o, "choices", "0", "delta", NULL)), 0);
    assert_string_equal(get(o, "choices", "0", "finish_reason", NULL)->valuestring, "length");
    cJSON_Delete(o);

    api_usage u = {.prompt_tokens = 3, .cached_tokens = 2, .completion_tokens = 4};
    o = parsed(api_usage_chunk_json(&m, &u));
    assert_int_equal(cJSON_GetArraySize(get(o, "choices", NULL)), 0);
    assert_int_equal(get(o, "usage", "total_tokens", NULL)->valueint, 7);
    assert_int_equal(get(o, "usage", "prompt_tokens_details", "cached_tokens", NULL)->valueint, 2);
    cJSON_Delete(o);

    m.usage_null = false;
    o = parsed(api_chunk_json(&m, &mid, &vocab));
    assert_null(cJSON_GetObjectItem(o, "usage"));
    cJSON_Delete(o);
}

static void test_completion_chunk(void **state)
{
    (void)state;
    api_meta m = {.kind = API_COMPLETIONS, .id = "c", .model = "tiny", .created = 5};
    api_choice c = {.index = 0, .text = " world", .text_len = 6};
    cJSON *o = parsed(api_chunk_json(&m, &c, &vocab));
    assert_string_equal(get(o, "object", NULL)->valuestring, "text_completion");
    assert_string_equal(get(o, "choices", "0", "text", NULL)->valuestring, " world");
    assert_true(cJSON_IsNull(get(o, "choices", "0", "logprobs", NULL)));
    cJSON_Delete(o);
}

static void test_sse(void **state)
{
    (void)state;
    bytebuf b = {0};
    api_sse_data(&b, "{\"a\":1}");
    api_sse_done(&b);
    assert_true(bytebuf_ok(&b));
    assert_string_equal(b.data, "data: {\"a\":1}\n\ndata: [DONE]\n\n");
    bytebuf_consume(&b, 15);
    assert_string_equal(b.data, "data: [DONE]\n\n");
    char *s = bytebuf_take(&b, NULL);
    assert_string_equal(s, "data: [DONE]\n\n");
    free(s);
    assert_null(b.data);
    bytebuf_printf(&b, "%d-%s", 42, "x");
    assert_string_equal(b.data, "42-x");
    bytebuf_free(&b);
}

static void test_utf8_sanitize(void **state)
{
    (void)state;
    static const struct { const char *in; size_t len; const char *out; } cases[] = {
        {"plain", 5, "plain"},
        {"caf\xC3\xA9", 5, "caf\xC3\xA9"},
        {"\xF0\x9F\x98\x80!", 5, "\xF0\x9F\x98\x80!"},
        {"a\xE2\x82", 3, "a\xEF\xBF\xBD"},                   /* truncated: one maximal subpart */
        {"\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},         /* overlong */
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate */
        {"\xF4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* > U+10FFFF */
        {"a\0b", 3, "a\xEF\xBF\xBD" "b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        char *s = api_utf8_sanitize(cases[i].in, cases[i].len, &n);
        assert_string_equal(s, cases[i].out);
        assert_int_equal(n, strlen(cases[i].out));
        free(s);
    }
    assert_string_equal(api_finish_reason(SCHED_FINISH_STOP), "stop");
    assert_string_equal(api_finish_reason(SCHED_FINISH_LENGTH), "length");
    assert_null(api_finish_reason(SCHED_FINISH_CANCELLED));
}

static void test_metrics(void **state)
{
    (void)state;
    metrics *m = metrics_new();
    metrics_count_status(m, 200);
    metrics_count_status(m, 200);
    metrics_count_status(m, 429);
    metrics_count_status(m, 9999); /* ignored */
    metrics_count_client_gone(m);
    assert_int_equal(metrics_status_count(m, 200), 2);
    sched_stats st = {.n_slots = 4, .slots_used = 1, .queue_depth = 3, .prompt_tokens_total = 10,
                      .generated_tokens_total = 20, .kv_tokens_used = 30, .kv_blocks_total = 64,
                      .kv_blocks_used = 5, .kv_blocks_cached = 7, .kv_blocks_free = 52, .prefix_lookup_tokens = 400,
                      .prefix_hit_tokens = 100, .preemptions = 2};
    st.spec_proposer_draft[SCHED_SPEC_DRAFT] = 9;
    st.spec_proposer_accepted[SCHED_SPEC_DRAFT] = 6;
    st.ttft.counts[0] = 1;
    st.ttft.counts[SCHED_HIST_BUCKETS] = 2;
    st.ttft.n = 3;
    st.ttft.sum_ms = 1500;
    metrics_view v = {.st = &st, .ctx_per_slot = 512, .ready = 1};
    bytebuf out = {0};
    metrics_render(m, &v, &out);
    const char *t = out.data;
    assert_non_null(strstr(t, "inferd_http_requests_total{code=\"200\"} 2\n"));
    assert_non_null(strstr(t, "inferd_http_requests_total{code=\"429\"} 1\n"));
    assert_null(strstr(t, "code=\"404\""));
    assert_non_null(strstr(t, "inferd_queue_depth 3\n"));
    assert_non_null(strstr(t, "inferd_client_gone_total 1\n"));
    assert_non_null(strstr(t, "inferd_slots_running 1\n"));
    assert_non_null(strstr(t, "inferd_kv_tokens_capacity 2048\n")); /* 64 blocks of 32 */
    assert_non_null(strstr(t, "inferd_kv_blocks_used 5\n"));
    assert_non_null(strstr(t, "inferd_kv_blocks_cached 7\n"));
    assert_non_null(strstr(t, "inferd_kv_blocks_free 52\n"));
    assert_non_null(strstr(t, "inferd_prefix_cache_hit_tokens_total 100\n"));
    assert_non_null(strstr(t, "inferd_prefix_cache_hit_ratio 0.25\n"));
    assert_non_null(strstr(t, "inferd_preemptions_total 2\n"));
    assert_non_null(strstr(t, "inferd_spec_proposer_draft_tokens_total{proposer=\"draft\"} 9\n"));
    assert_non_null(strstr(t, "inferd_spec_proposer_accepted_tokens_total{proposer=\"draft\"} 6\n"));
    assert_non_null(strstr(t, "inferd_spec_proposer_draft_tokens_total{proposer=\"ngram\"} 0\n"));
    assert_null(strstr(t, "proposer=\"off\""));
    assert_non_null(strstr(t, "inferd_prompt_tokens_total 10\n"));
    assert_non_null(strstr(t, "inferd_generated_tokens_total 20\n"));
    assert_non_null(strstr(t, "# TYPE inferd_time_to_first_token_seconds histogram\n"));
    assert_non_null(strstr(t, "inferd_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(t, "inferd_time_to_first_token_seconds_sum 1.5\n"));
    assert_non_null(strstr(t, "inferd_time_to_first_token_seconds_count 3\n"));
    /* buckets are cumulative: the last finite bucket holds the first observation only */
    char want[128];
    snprintf(want, sizeof want, "inferd_time_to_first_token_seconds_bucket{le=\"%g\"} 1\n",
             sched_hist_bounds_ms[SCHED_HIST_BUCKETS - 1] / 1000.0);
    assert_non_null(strstr(t, want));
    bytebuf_free(&out);

    metrics_view loading = {0};
    metrics_render(m, &loading, &out);
    assert_non_null(strstr(out.data, "inferd_ready 0\n"));
    assert_null(strstr(out.data, "inferd_queue_depth"));
    bytebuf_free(&out);
    metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_json),  cmocka_unit_test(test_completion_response),
        cmocka_unit_test(test_chat_response), cmocka_unit_test(test_system_fingerprint),
        cmocka_unit_test(test_chat_chunks),
        cmocka_unit_test(test_completion_chunk), cmocka_unit_test(test_sse),
        cmocka_unit_test(test_utf8_sanitize), cmocka_unit_test(test_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
