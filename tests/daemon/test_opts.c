/* test_opts.c - the option table: defaults, command-line forms, opts_set (the config-file
 * path), every error, help and the effective-configuration log. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/opts.h"

static int parse(inferd_opts *o, const char *const *args, int n, char *err, size_t errlen)
{
    char *argv[32];
    argv[0] = (char *)"serve";
    for (int i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    opts_defaults(o);
    return opts_parse_argv(o, n + 1, argv, err, errlen);
}

static void test_defaults(void **state)
{
    (void)state;
    inferd_opts o;
    opts_defaults(&o);
    assert_string_equal(o.model, "");
    assert_string_equal(o.host, "127.0.0.1");
    assert_int_equal(o.port, 8080);
    assert_int_equal(o.parallel, 4);
    assert_int_equal(o.ctx_size, 0);
    assert_int_equal(o.batch_tokens, 512);
    assert_int_equal(o.queue_size, 64);
    assert_int_equal(o.max_body, 1 << 20);
    assert_string_equal(o.api_key, "");
    assert_int_equal(o.device, ENGINE_DEVICE_AUTO);
    assert_int_equal(o.log_level, 1); /* info */
    assert_int_equal(o.log_format, OPTS_LOG_TEXT);
    assert_true(o.shutdown_timeout == 30.0);
    assert_true(o.metrics);
    assert_int_equal(o.tensor_parallel, 1); /* one GPU: today's path */
}

static void test_argv_forms(void **state)
{
    (void)state;
    inferd_opts o;
    char err[256];
    const char *args[] = {"-m", "a.gguf", "--port=9000", "-np", "8", "-c", "2048", "--host", "0.0.0.0",
                          "--device", "CPU", "--log-format", "json", "--no-metrics", "--shutdown-timeout",
                          "2.5", "--api-key", "sekret", "--model-alias", "my-model", "--config", "x.conf",
                          "--chat-template", "chatml", "--log-level=debug", "--threads", "3",
                          "-tp", "4"};
    assert_int_equal(parse(&o, args, (int)(sizeof args / sizeof args[0]), err, sizeof err), 0);
    assert_string_equal(o.model, "a.gguf");
    assert_int_equal(o.port, 9000);
    assert_int_equal(o.parallel, 8);
    assert_int_equal(o.ctx_size, 2048);
    assert_string_equal(o.host, "0.0.0.0");
    assert_int_equal(o.device, ENGINE_DEVICE_CPU);
    assert_int_equal(o.log_format, OPTS_LOG_JSON);
    assert_false(o.metrics);
    assert_true(o.shutdown_timeout == 2.5);
    assert_string_equal(o.api_key, "sekret");
    assert_string_equal(o.model_alias, "my-model");
    assert_string_equal(o.config, "x.conf");
    assert_string_equal(o.chat_template, "chatml");
    assert_int_equal(o.log_level, 0);
    assert_int_equal(o.threads, 3);
    assert_int_equal(o.tensor_parallel, 4);

    const char *bools[] = {"--metrics=false", "--metrics"};
    assert_int_equal(parse(&o, bools, 1, err, sizeof err), 0);
    assert_false(o.metrics);
    assert_int_equal(parse(&o, bools, 2, err, sizeof err), 0);
    assert_true(o.metrics); /* the last one wins */
}

static void expect_error(const char *const *args, int n, const char *needle)
{
    inferd_opts o;
    char err[256] = "";
    assert_int_equal(parse(&o, args, n, err, sizeof err), -1);
    if (!strstr(err, needle)) fail_msg("error '%s' does not mention '%s'", err, needle);
}

static void test_argv_errors(void **state)
{
    (void)state;
    expect_error((const char *[]){"--bogus", "1"}, 2, "--bogus");
    expect_error((const char *[]){"-x"}, 1, "-x");
    expect_error((const char *[]){"--port"}, 1, "needs a value");
    expect_error((const char *[]){"--port", "80a"}, 2, "port");
    expect_error((const char *[]){"--port", "70000"}, 2, "port");
    expect_error((const char *[]){"-np", "0"}, 2, "parallel");
    expect_error((const char *[]){"-tp", "0"}, 2, "'tensor-parallel': '0' is not an integer in [1, 8]");
    expect_error((const char *[]){"--tensor-parallel", "9"}, 2, "tensor-parallel");
    expect_error((const char *[]){"--device", "tpu"}, 2, "auto|cpu|cuda");
    expect_error((const char *[]){"--log-format=xml"}, 1, "text|json");
    expect_error((const char *[]){"--metrics=maybe"}, 1, "metrics");
    expect_error((const char *[]){"--no-port"}, 1, "--no-port"); /* --no- only for booleans */
    expect_error((const char *[]){"--shutdown-timeout", "-1"}, 2, "shutdown-timeout");
    expect_error((const char *[]){"--shutdown-timeout", "nan"}, 2, "shutdown-timeout");
    char longv[2000];
    memset(longv, 'a', sizeof longv - 1);
    longv[sizeof longv - 1] = 0;
    expect_error((const char *[]){"--host", longv}, 2, "longer than");
}

static void test_opts_set_every_key(void **state)
{
    (void)state;
    inferd_opts o;
    char err[256];
    opts_defaults(&o);
    assert_true(opts_count() >= 18);
    for (int i = 0; i < opts_count(); i++) {
        const char *k = opts_name(i);
        assert_non_null(k);
        /* Every key accepts some value: try the usual shapes until one fits. */
        static const char *const tries[] = {"1", "100", "true", "cpu", "json", "info", "x", "deepseek", "refuse", "mean", "ngram"};
        int rc = -1;
        for (size_t t = 0; t < sizeof tries / sizeof tries[0] && rc != 0; t++) rc = opts_set(&o, k, tries[t], err, sizeof err);
        if (rc != 0) fail_msg("config key '%s' accepts none of the sample values: %s", k, err);
    }
    assert_null(opts_name(opts_count()));
    assert_int_equal(opts_set(&o, "chat-template-file", "/etc/inferd/chat.jinja", err, sizeof err), 0);
    assert_string_equal(o.chat_template_file, "/etc/inferd/chat.jinja");
    assert_int_equal(opts_set(&o, "reasoning-format", "none", err, sizeof err), 0);
    assert_int_equal(o.reasoning_format, OPTS_REASONING_NONE);
    assert_int_equal(opts_set(&o, "queue-size", "5", err, sizeof err), 0);
    assert_int_equal(o.queue_size, 5);
    assert_int_equal(opts_set(&o, "max-head-passes", "-1", err, sizeof err), 0);
    assert_int_equal(o.max_head_passes, -1);
    assert_int_equal(opts_set(&o, "max-head-passes", "-2", err, sizeof err), -1);
    assert_int_equal(opts_set(&o, "metrics", "off", err, sizeof err), 0);
    assert_false(o.metrics);
    assert_int_equal(opts_set(&o, "no-such-key", "1", err, sizeof err), -1);
    assert_non_null(strstr(err, "no-such-key"));
    assert_int_equal(opts_set(&o, "port", "", err, sizeof err), -1);
}

static void test_help_lists_every_option(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    opts_print_help(f);
    long n = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    for (int i = 0; i < opts_count(); i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", opts_name(i));
        if (!strstr(text, flag)) fail_msg("help lacks %s", flag);
    }
    assert_non_null(strstr(text, "-np, --parallel"));
    assert_non_null(strstr(text, "[default: 8080]"));
    free(text);

    inferd_opts o;
    char err[64];
    const char *help[] = {"--help"};
    /* --help prints to stdout and reports 1 so the caller exits 0 */
    assert_int_equal(parse(&o, help, 1, err, sizeof err), 1);
    opts_log(&o); /* must not crash; masks the key */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults), cmocka_unit_test(test_argv_forms),
        cmocka_unit_test(test_argv_errors), cmocka_unit_test(test_opts_set_every_key),
        cmocka_unit_test(test_help_lists_every_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
