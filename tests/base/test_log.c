/* test_log.c - structured log lines (log_event) in text and JSON, and log_reopen after the
 * file was moved away (what logrotate does before sending SIGHUP). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/log.h"

static char g_dir[] = "/tmp/inferd-log-XXXXXX";
static char g_path[256];

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_path, sizeof g_path, "%s/test.log", g_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    log_open_file(NULL);
    log_set_json(false);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The last line of path (static buffer, without the newline). */
static const char *last_line(const char *path)
{
    static char line[8192];
    char buf[8192];
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    line[0] = 0;
    while (fgets(buf, sizeof buf, f)) memcpy(line, buf, sizeof buf);
    fclose(f);
    line[strcspn(line, "\n")] = 0;
    return line;
}

static void emit_request(void)
{
    log_field f[] = {
        LOG_STR("id", "cmpl-1"), LOG_STR("path", "/v1/completions"), LOG_INT("status", 200),
        LOG_INT("prompt_tokens", 12), LOG_NUM("ttft_ms", 3.26), LOG_NUM("none_ms", NAN),
        LOG_STR("finish", NULL), LOG_STR("error", "bad \"x\" = y"), LOG_STR("empty", ""),
    };
    log_event(LOG_INFO, "request", f, (int)(sizeof f / sizeof f[0]));
}

static void test_text_fields(void **state)
{
    (void)state;
    assert_int_equal(log_open_file(g_path), 0);
    log_set_json(false);
    emit_request();
    const char *l = last_line(g_path);
    const char *want = "info  request id=cmpl-1 path=/v1/completions status=200 prompt_tokens=12 ttft_ms=3.3 "
                       "none_ms=- finish=- error=\"bad \\\"x\\\" = y\" empty=\"\"";
    if (!strstr(l, want)) fail_msg("got   '%s'\nwant '...%s'", l, want);
}

static void test_json_fields(void **state)
{
    (void)state;
    assert_int_equal(log_open_file(g_path), 0);
    log_set_json(true);
    emit_request();
    log_set_json(false);
    cJSON *o = cJSON_Parse(last_line(g_path));
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "msg")->valuestring, "request");
    assert_string_equal(cJSON_GetObjectItem(o, "level")->valuestring, "info");
    assert_string_equal(cJSON_GetObjectItem(o, "id")->valuestring, "cmpl-1");
    assert_int_equal(cJSON_GetObjectItem(o, "status")->valueint, 200);
    assert_true(fabs(cJSON_GetObjectItem(o, "ttft_ms")->valuedouble - 3.3) < 1e-9);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "none_ms")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "finish")));
    assert_string_equal(cJSON_GetObjectItem(o, "error")->valuestring, "bad \"x\" = y");
    assert_string_equal(cJSON_GetObjectItem(o, "empty")->valuestring, "");
    cJSON_Delete(o);
}

static void test_reopen(void **state)
{
    (void)state;
    char moved[300];
    snprintf(moved, sizeof moved, "%s.1", g_path);
    assert_int_equal(log_open_file(g_path), 0);
    log_info("before rotation");
    assert_int_equal(rename(g_path, moved), 0);
    log_info("still to the moved file");
    assert_int_equal(log_reopen(), 0);
    log_info("after rotation");
    assert_non_null(strstr(last_line(moved), "still to the moved file"));
    assert_non_null(strstr(last_line(g_path), "after rotation"));

    /* the directory is gone: reopening fails and logging goes on to the old file */
    char gone[300];
    snprintf(gone, sizeof gone, "%s/sub", g_dir);
    assert_int_equal(mkdir(gone, 0700), 0);
    char in_gone[320];
    snprintf(in_gone, sizeof in_gone, "%s/x.log", gone);
    assert_int_equal(log_open_file(in_gone), 0);
    assert_int_equal(unlink(in_gone), 0);
    assert_int_equal(rmdir(gone), 0);
    assert_int_equal(log_reopen(), -1);
    log_info("no line lost");

    /* stderr: nothing to reopen */
    assert_int_equal(log_open_file(NULL), 0);
    assert_int_equal(log_reopen(), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_fields),
        cmocka_unit_test(test_json_fields),
        cmocka_unit_test(test_reopen),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
