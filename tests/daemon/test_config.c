/* test_config.c - the configuration file: a good file, every kind of bad line (with its
 * FILE:LINE), command line over file, an unreadable file, and the shipped example
 * config/inferd.conf (every option documented, every documented default valid). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/config.h"

static char g_dir[] = "/tmp/inferd-config-XXXXXX";

static int make_dir(void **state)
{
    (void)state;
    return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Write text to DIR/name; returns the path (static buffer). */
static const char *write_file(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Parse n bytes as a config file named "t.conf"; returns the rc, err holds the message. */
static int parse_bytes(inferd_opts *o, const char *text, size_t n, char *err, size_t errlen)
{
    FILE *f = fmemopen((void *)text, n, "r");
    assert_non_null(f);
    opts_defaults(o);
    err[0] = 0;
    int rc = config_parse_file(o, f, "t.conf", err, errlen);
    fclose(f);
    return rc;
}

static int parse_text(inferd_opts *o, const char *text, char *err, size_t errlen)
{
    return parse_bytes(o, text, strlen(text), err, errlen);
}

static void test_good_file(void **state)
{
    (void)state;
    inferd_opts o;
    char err[512];
    const char *text = "# a comment\n"
                       "\n"
                       "   # an indented comment\n"
                       "model = /models/a b.gguf\n"
                       "port=9001\n"
                       "\thost\t=\t0.0.0.0  \n"
                       "parallel = 8\r\n"           /* CRLF */
                       "log-format = JSON\n"        /* enum values are case-insensitive */
                       "metrics = off\n"
                       "shutdown-timeout = 2.5\n"
                       "api-key = se#cr=et\n"       /* '#' and '=' inside a value */
                       "model-alias =\n"            /* empty string */
                       "tensor-parallel = 2\n"
                       "device = cpu";              /* no newline at the end */
    assert_int_equal(parse_text(&o, text, err, sizeof err), 0);
    assert_string_equal(o.model, "/models/a b.gguf");
    assert_int_equal(o.port, 9001);
    assert_string_equal(o.host, "0.0.0.0");
    assert_int_equal(o.parallel, 8);
    assert_int_equal(o.log_format, OPTS_LOG_JSON);
    assert_int_equal(o.tensor_parallel, 2);
    assert_false(o.metrics);
    assert_true(o.shutdown_timeout == 2.5);
    assert_string_equal(o.api_key, "se#cr=et");
    assert_string_equal(o.model_alias, "");
    assert_int_equal(o.device, ENGINE_DEVICE_CPU);
    /* untouched keys keep their defaults */
    assert_int_equal(o.batch_tokens, 512);
}

static void test_empty_file(void **state)
{
    (void)state;
    inferd_opts o, def;
    char err[512];
    assert_int_equal(parse_text(&o, "", err, sizeof err), 0);
    opts_defaults(&def);
    assert_memory_equal(&o, &def, sizeof o);
}

typedef struct bad_case {
    const char *text;
    const char *want; /* substring of the message, after the FILE:LINE: prefix */
    int line;
} bad_case;

static void test_bad_lines(void **state)
{
    (void)state;
    static const bad_case cases[] = {
        {"port 8080\n", "expected 'key = value'", 1},
        {"# ok\n\n= 5\n", "missing key", 3},
        {"bogus = 1\n", "unknown key 'bogus'", 1},
        {"--port = 1\n", "without dashes", 1},
        {"port = http\n", "option 'port': 'http' is not an integer", 1},
        {"port = 70000\n", "not an integer in [1, 65535]", 1},
        {"port =\n", "is not an integer", 1},
        {"port = 8080 # inline\n", "'8080 # inline' is not an integer", 1},
        {"shutdown-timeout = soon\n", "is not a number", 1},
        {"metrics = maybe\n", "is not a boolean", 1},
        {"device = tpu\n", "is not one of auto|cpu|cuda", 1},
        {"port = 1\nhost = x\nport = 2\n", "'port' is already set on line 1", 3},
        {"config = /etc/other.conf\n", "'config' cannot be set in a config file", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        inferd_opts o;
        char err[512], prefix[32];
        assert_int_equal(parse_text(&o, cases[i].text, err, sizeof err), -1);
        snprintf(prefix, sizeof prefix, "t.conf:%d: ", cases[i].line);
        if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, cases[i].want))
            fail_msg("case %zu: got '%s', want '%s...%s'", i, err, prefix, cases[i].want);
    }
}

static void test_long_line(void **state)
{
    (void)state;
    size_t n = CONFIG_LINE_MAX + 100;
    char *text = malloc(n + 32);
    assert_non_null(text);
    strcpy(text, "port = 1\nmodel = ");
    size_t o = strlen(text);
    memset(text + o, 'x', n - o);
    strcpy(text + n, "\n");
    inferd_opts opts;
    char err[512];
    assert_int_equal(parse_text(&opts, text, err, sizeof err), -1);
    assert_non_null(strstr(err, "t.conf:2: line longer than"));
    free(text);

    /* a value longer than its field is the option's own error */
    char mid[2000] = "chat-template = ";
    memset(mid + strlen(mid), 'y', 200);
    assert_int_equal(parse_text(&opts, mid, err, sizeof err), -1);
    assert_non_null(strstr(err, "t.conf:1: option 'chat-template': value longer than"));
}

/* A NUL byte is named as such (it read as "line too long" or cut the line short), and a UTF-8
 * byte order mark before the first key is not part of the key (it made "unknown key"). */
static void test_nul_and_bom(void **state)
{
    (void)state;
    inferd_opts o;
    char err[512];
    static const char nul[] = "port = 1\nhost = a\0b\n";
    assert_int_equal(parse_bytes(&o, nul, sizeof nul - 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "t.conf:2: a NUL byte"));
    static const char nul_long[] = "port = 1\0\0\0";
    assert_int_equal(parse_bytes(&o, nul_long, sizeof nul_long - 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "t.conf:1: a NUL byte"));

    assert_int_equal(parse_text(&o, "\xEF\xBB\xBFport = 8123\nhost = 127.0.0.2\n", err, sizeof err), 0);
    assert_int_equal(o.port, 8123);
    assert_string_equal(o.host, "127.0.0.2");
    /* only at the start of the file */
    assert_int_equal(parse_text(&o, "port = 1\n\xEF\xBB\xBFhost = x\n", err, sizeof err), -1);
    assert_non_null(strstr(err, "t.conf:2: unknown key"));
}

static void test_unreadable(void **state)
{
    (void)state;
    inferd_opts o;
    char err[512], path[256];
    opts_defaults(&o);
    snprintf(path, sizeof path, "%s/missing.conf", g_dir);
    assert_int_equal(config_load(&o, path, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file"));
    /* a directory opens but cannot be read */
    assert_int_equal(config_load(&o, g_dir, err, sizeof err), -1);
    assert_non_null(strstr(err, g_dir));
}

static int resolve(inferd_opts *o, const char *const *args, int n, char *err, size_t errlen)
{
    char *argv[32];
    argv[0] = (char *)"serve";
    for (int i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    return config_resolve(o, n + 1, argv, err, errlen);
}

static void test_cli_over_file(void **state)
{
    (void)state;
    const char *path = write_file("p.conf", "port = 9001\nparallel = 8\nlog-level = debug\nmetrics = false\n");
    inferd_opts o;
    char err[512];
    /* --config after and before the overriding flags: the command line wins either way */
    const char *a1[] = {"--port", "9100", "--config", path, "--metrics"};
    assert_int_equal(resolve(&o, a1, 5, err, sizeof err), 0);
    assert_int_equal(o.port, 9100);
    assert_int_equal(o.parallel, 8);
    assert_int_equal(o.log_level, 0);
    assert_true(o.metrics);
    assert_string_equal(o.config, path);
    const char *a2[] = {"--config", path, "-np", "2"};
    assert_int_equal(resolve(&o, a2, 4, err, sizeof err), 0);
    assert_int_equal(o.port, 9001);
    assert_int_equal(o.parallel, 2);
    /* no --config: no file is read */
    const char *a3[] = {"--port", "9200"};
    assert_int_equal(resolve(&o, a3, 2, err, sizeof err), 0);
    assert_int_equal(o.parallel, 4);
    assert_string_equal(o.config, "");
}

static void test_resolve_errors(void **state)
{
    (void)state;
    inferd_opts o;
    char err[512];
    const char *bad = write_file("bad.conf", "port = 1\nnope = 2\n");
    const char *a1[] = {"--config", bad};
    assert_int_equal(resolve(&o, a1, 2, err, sizeof err), CONFIG_E_FILE);
    char want[300];
    snprintf(want, sizeof want, "%s:2: unknown key 'nope'", bad);
    assert_string_equal(err, want);
    /* a command-line error is reported before any file is opened */
    const char *a2[] = {"--config", "/nonexistent/x.conf", "--bogus"};
    assert_int_equal(resolve(&o, a2, 3, err, sizeof err), CONFIG_E_ARGV);
    assert_non_null(strstr(err, "--bogus"));
    const char *a3[] = {"--config", "/nonexistent/x.conf"};
    assert_int_equal(resolve(&o, a3, 2, err, sizeof err), CONFIG_E_FILE);
    assert_non_null(strstr(err, "/nonexistent/x.conf: cannot open"));
    /* A FIFO as config file is refused at once (opening it would wait for a writer). */
    char fifo[] = "/tmp/inferd-test-config-fifo-XXXXXX";
    int fd = mkstemp(fifo);
    assert_true(fd >= 0);
    close(fd);
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *a4[] = {"--config", fifo};
    assert_int_equal(resolve(&o, a4, 2, err, sizeof err), CONFIG_E_FILE);
    assert_non_null(strstr(err, "not a regular file"));
    unlink(fifo);
}

/* config/inferd.conf documents every option (as `key = value` or `#key = value`), and
 * uncommenting every documented line still gives a valid file. */
static void test_example_file(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/config/inferd.conf", INFERD_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    char line[CONFIG_LINE_MAX + 2];
    char *all = calloc(1, 1 << 16);
    assert_non_null(all);
    bool seen[256] = {false};
    while (fgets(line, sizeof line, f)) {
        char *s = line[0] == '#' ? line + 1 : line;
        char key[128];
        if (sscanf(s, "%127[a-z-] =", key) != 1 || !strchr(s, '=')) continue;
        for (int i = 0; i < opts_count(); i++)
            if (strcmp(opts_name(i), key) == 0) seen[i] = true;
        strcat(all, s);
    }
    fclose(f);
    for (int i = 0; i < opts_count(); i++)
        if (!seen[i] && strcmp(opts_name(i), "config") != 0)
            fail_msg("config/inferd.conf does not document '%s'", opts_name(i));
    inferd_opts o;
    char err[512];
    if (parse_text(&o, all, err, sizeof err) != 0) fail_msg("uncommented example: %s", err);
    free(all);
    /* and as shipped it parses too */
    opts_defaults(&o);
    if (config_load(&o, path, err, sizeof err) != 0) fail_msg("example: %s", err);
    assert_string_equal(o.model, "/var/lib/inferd/models/model.gguf");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file),
        cmocka_unit_test(test_empty_file),
        cmocka_unit_test(test_bad_lines),
        cmocka_unit_test(test_long_line),
        cmocka_unit_test(test_nul_and_bom),
        cmocka_unit_test(test_unreadable),
        cmocka_unit_test(test_cli_over_file),
        cmocka_unit_test(test_resolve_errors),
        cmocka_unit_test(test_example_file),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
