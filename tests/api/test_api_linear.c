/* test_http_linear.c - a request's arrays are walked once (issue 36 item 5): parsing a chat
 * body and translating a Responses body cost linear work in their items, and arrays over
 * API_MAX_ITEMS are refused with a 400 before they are walked.
 *
 * Linear is asserted by counting, not by a clock: the test links with
 * -Wl,--wrap=cJSON_GetArrayItem,--wrap=cJSON_GetArraySize, so every indexed access of a cJSON
 * array from the server's code comes here, and its cost (the nodes cJSON walks: i + 1 to reach
 * item i, the whole array to count it) is summed.  A loop that indexes item i of n costs n^2/2
 * and fails the bound; one walk down the list costs nothing here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "base/bytebuf.h"
#include "api/api_responses.h"

static long long walked; /* array nodes walked by indexed access since the last reset */

cJSON *__real_cJSON_GetArrayItem(const cJSON *array, int index);
int __real_cJSON_GetArraySize(const cJSON *array);

cJSON *__wrap_cJSON_GetArrayItem(const cJSON *array, int index)
{
    walked += index + 1;
    return __real_cJSON_GetArrayItem(array, index);
}

int __wrap_cJSON_GetArraySize(const cJSON *array)
{
    int n = __real_cJSON_GetArraySize(array);
    walked += n;
    return n;
}

/* Linear: a few walks of each array, whatever its length (the bound has room for 8). */
#define LINEAR_BOUND(n_items) (8LL * (n_items) + 64)

/* A chat body of n messages: user turns with two content parts, assistant turns with a call. */
static char *chat_body(int n)
{
    bytebuf b = {0};
    bytebuf_puts(&b, "{\"messages\":[");
    for (int i = 0; i < n; i++) {
        if (i) bytebuf_puts(&b, ",");
        if (i % 2 == 0)
            bytebuf_puts(&b, "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}");
        else
            bytebuf_puts(&b, "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
                             "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}");
    }
    bytebuf_puts(&b, "]}");
    assert_true(bytebuf_ok(&b));
    return b.data;
}

/* A Responses body of n items: a call, its output, a message, over and over. */
static char *responses_body_with(int n, bool instructions)
{
    bytebuf b = {0};
    bytebuf_puts(&b, instructions ? "{\"instructions\":\"Be brief.\",\"input\":[" : "{\"input\":[");
    for (int i = 0; i < n; i++) {
        char item[160];
        if (i % 3 == 0)
            snprintf(item, sizeof item, "{\"type\":\"function_call\",\"call_id\":\"c%d\",\"name\":\"f\",\"arguments\":\"{}\"}", i);
        else if (i % 3 == 1)
            snprintf(item, sizeof item, "{\"type\":\"function_call_output\",\"call_id\":\"c%d\",\"output\":\"1\"}", i - 1);
        else
            snprintf(item, sizeof item, "{\"role\":\"user\",\"content\":\"next\"}");
        bytebuf_printf(&b, "%s%s", i ? "," : "", item);
    }
    bytebuf_puts(&b, "]}");
    assert_true(bytebuf_ok(&b));
    return b.data;
}

static char *responses_body(int n) { return responses_body_with(n, false); }

static void test_chat_messages_walked_once(void **state)
{
    (void)state;
    char *body = chat_body(API_MAX_ITEMS);
    api_request r;
    api_error e;
    walked = 0;
    if (api_request_parse(API_CHAT, body, strlen(body), 1000, &r, &e) != 0) fail_msg("%s", e.message);
    assert_int_equal(r.n_msgs, API_MAX_ITEMS);
    if (walked > LINEAR_BOUND(API_MAX_ITEMS)) fail_msg("%lld array nodes walked for %d messages", walked, API_MAX_ITEMS);
    api_request_free(&r);
    free(body);
}

static void test_responses_items_walked_once(void **state)
{
    (void)state;
    char *body = responses_body(API_MAX_ITEMS);
    char *chat = NULL;
    api_resp_req rq;
    api_error e;
    walked = 0;
    if (api_responses_translate(body, strlen(body), &chat, &rq, &e) != 0) fail_msg("%s", e.message);
    if (walked > LINEAR_BOUND(API_MAX_ITEMS)) fail_msg("%lld array nodes walked for %d items", walked, API_MAX_ITEMS);
    /* and the chat body it became parses linearly too */
    api_request r;
    walked = 0;
    if (api_request_parse(API_CHAT, chat, strlen(chat), 1000, &r, &e) != 0) fail_msg("%s", e.message);
    if (walked > LINEAR_BOUND(API_MAX_ITEMS)) fail_msg("%lld array nodes walked for the translated chat", walked);
    api_request_free(&r);
    api_resp_req_free(&rq);
    free(chat);
    free(body);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The body: 1 MiB of 30,000 items (it took a worker 6.5-25 s).  Now a 400 naming the
 * limit, found by one count of the array: the clock bound (5 s, for a loaded machine; it takes
 * milliseconds) only backs the count up. */
static void test_too_many_items_refused(void **state)
{
    (void)state;
    int n = 30000;
    char *body = responses_body(n);
    assert_true(strlen(body) > 1000000);
    char *chat = NULL;
    api_resp_req rq;
    api_error e;
    double t0 = now_s();
    walked = 0;
    assert_int_equal(api_responses_translate(body, strlen(body), &chat, &rq, &e), -1);
    assert_true(now_s() - t0 < 5.0);
    assert_true(walked <= LINEAR_BOUND(n));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "input");
    assert_string_equal(e.code, "array_above_max_length");
    assert_non_null(strstr(e.message, "maximum length 2048"));
    free(body);

    body = chat_body(n);
    api_request r;
    t0 = now_s();
    walked = 0;
    assert_int_equal(api_request_parse(API_CHAT, body, strlen(body), 1000, &r, &e), -1);
    assert_true(now_s() - t0 < 5.0);
    assert_true(walked <= LINEAR_BOUND(n));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "messages");
    assert_string_equal(e.code, "array_above_max_length");
    free(body);
}

/* The instructions are one of the chat request's messages: with them, one item fewer fits,
 * and the 400 says so in the input's own terms. */
static void test_input_limit_counts_instructions(void **state)
{
    (void)state;
    char *body = responses_body_with(API_MAX_ITEMS, true), *chat = NULL;
    api_resp_req rq;
    api_error e;
    assert_int_equal(api_responses_translate(body, strlen(body), &chat, &rq, &e), -1);
    assert_string_equal(e.param, "input");
    assert_non_null(strstr(e.message, "maximum length 2047, but got an array with length 2048"));
    free(body);
    body = responses_body_with(API_MAX_ITEMS - 1, true);
    if (api_responses_translate(body, strlen(body), &chat, &rq, &e) != 0) fail_msg("%s", e.message);
    api_request r;
    if (api_request_parse(API_CHAT, chat, strlen(chat), 1000, &r, &e) != 0) fail_msg("%s", e.message);
    api_request_free(&r);
    api_resp_req_free(&rq);
    free(chat);
    free(body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_messages_walked_once),
        cmocka_unit_test(test_responses_items_walked_once),
        cmocka_unit_test(test_too_many_items_refused),
        cmocka_unit_test(test_input_limit_counts_instructions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
