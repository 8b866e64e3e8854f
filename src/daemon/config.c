/* config.c - see config.h.  Values go through opts_set, so the file accepts exactly what the
 * command line accepts and reports the same reasons. */
#include "config.h"
#include "base/file.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

/* Remove leading and trailing blanks (space, tab, CR from CRLF files) in place. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = 0;
    return s;
}

/* Line number of the earlier assignment of opts_name(idx), 0 when none. */
typedef struct seen_keys {
    int line[256];
} seen_keys;

static int key_index(const char *key)
{
    for (int i = 0; i < opts_count(); i++)
        if (strcmp(opts_name(i), key) == 0) return i;
    return -1;
}

/* One line (without its newline).  0, or -1 with the reason (no file/line prefix) in why. */
static int parse_line(inferd_opts *o, char *line, int lineno, seen_keys *seen, char *why, size_t cap)
{
    char *s = trim(line);
    if (!*s || *s == '#') return 0;
    char *eq = strchr(s, '=');
    if (!eq) {
        snprintf(why, cap, "expected 'key = value', got '%.80s'", s);
        return -1;
    }
    *eq = 0;
    char *key = trim(s), *value = trim(eq + 1);
    if (!*key) {
        snprintf(why, cap, "missing key before '='");
        return -1;
    }
    int idx = key_index(key);
    if (idx < 0) {
        snprintf(why, cap, "unknown key '%.80s'%s", key,
                 key[0] == '-' ? " (write keys without dashes: 'port = 8080')" : "");
        return -1;
    }
    if (strcmp(key, "config") == 0) {
        snprintf(why, cap, "'config' cannot be set in a config file");
        return -1;
    }
    if (idx < (int)(sizeof seen->line / sizeof seen->line[0])) {
        if (seen->line[idx]) {
            snprintf(why, cap, "'%s' is already set on line %d", key, seen->line[idx]);
            return -1;
        }
        seen->line[idx] = lineno;
    }
    return opts_set(o, key, value, why, cap);
}

/* The next line of f into line (its newline dropped, NUL-terminated): its length, -1 at the end
 * of the file, -2 when it is longer than CONFIG_LINE_MAX.  The length is what was read, so a
 * NUL byte inside the line is seen (fgets would hide it as an early end of string). */
static long read_line(FILE *f, char *line)
{
    size_t n = 0;
    int c;
    while ((c = getc(f)) != EOF && c != '\n') {
        if (n == CONFIG_LINE_MAX) return -2;
        line[n++] = (char)c;
    }
    line[n] = 0;
    return c == EOF && n == 0 ? -1 : (long)n;
}

int config_parse_file(inferd_opts *o, FILE *f, const char *name, char *err, size_t errlen)
{
    seen_keys seen = {{0}};
    char buf[CONFIG_LINE_MAX + 1];
    char why[512];
    long n;
    for (int lineno = 1; (n = read_line(f, buf)) != -1; lineno++) {
        if (n == -2) {
            snprintf(err, errlen, "%s:%d: line longer than %d bytes", name, lineno, CONFIG_LINE_MAX);
            return -1;
        }
        if (memchr(buf, 0, (size_t)n)) {
            snprintf(err, errlen, "%s:%d: a NUL byte (the file is not text)", name, lineno);
            return -1;
        }
        /* A UTF-8 byte order mark (what some Windows editors write first) is not part of the key. */
        char *line = buf;
        if (lineno == 1 && n >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) line += 3;
        if (parse_line(o, line, lineno, &seen, why, sizeof why) != 0) {
            snprintf(err, errlen, "%s:%d: %s", name, lineno, why);
            return -1;
        }
    }
    if (ferror(f)) {
        snprintf(err, errlen, "%s: read error: %s", name, strerror(errno));
        return -1;
    }
    return 0;
}

int config_load(inferd_opts *o, const char *path, char *err, size_t errlen)
{
    char why[300];
    int fd = file_open_regular(path, NULL, why, sizeof why); /* a FIFO must not hang start-up */
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        snprintf(err, errlen, "%s: cannot open config file: %s", path, fd >= 0 ? strerror(errno) : why);
        return -1;
    }
    int rc = config_parse_file(o, f, path, err, errlen);
    fclose(f);
    return rc;
}

int config_resolve(inferd_opts *o, int argc, char **argv, char *err, size_t errlen)
{
    /* First pass only to learn --config (and to report command-line errors and --help
     * before touching any file). */
    opts_defaults(o);
    int rc = opts_parse_argv(o, argc, argv, err, errlen);
    if (rc != 0 || !o->config[0]) return rc;
    char path[OPTS_STR_MAX];
    memcpy(path, o->config, sizeof path);
    opts_defaults(o);
    if (config_load(o, path, err, errlen) != 0) return CONFIG_E_FILE;
    /* Second pass: the command line overrides what the file set.  It already parsed once. */
    return opts_parse_argv(o, argc, argv, err, errlen);
}
