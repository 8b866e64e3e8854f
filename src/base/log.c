/* log.c - see log.h. A mutex keeps lines whole when several threads log at once. */
#define _POSIX_C_SOURCE 200809L
#include "log.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static log_level g_level = LOG_INFO;
static bool g_json;
static FILE *g_file;
static char g_path[4096];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(log_level lvl) { g_level = lvl; }
log_level log_get_level(void) { return g_level; }
void log_set_json(bool json) { g_json = json; }

int log_level_from_name(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0) return i;
    if (strcmp(name, "warning") == 0) return LOG_WARN;
    return -1;
}

int log_open_file(const char *path)
{
    pthread_mutex_lock(&g_mu);
    if (g_file) fclose(g_file);
    g_file = NULL;
    g_path[0] = 0;
    int rc = 0;
    if (path) {
        g_file = fopen(path, "ae"); /* not inherited by children */
        if (g_file) snprintf(g_path, sizeof g_path, "%s", path);
        else rc = -1;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int log_reopen(void)
{
    pthread_mutex_lock(&g_mu);
    int rc = 1;
    if (g_path[0]) {
        rc = 0;
        FILE *f = fopen(g_path, "ae");
        if (f) {
            if (g_file) fclose(g_file);
            g_file = f;
        } else {
            rc = -1; /* keep writing to the old (renamed) file: no line is lost */
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* JSON-escape src into dst (always NUL-terminated). */
static void json_escape(const char *src, char *dst, size_t cap)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)src; *p && o + 7 < cap; p++) {
        if (*p == '"' || *p == '\\') { dst[o++] = '\\'; dst[o++] = (char)*p; }
        else if (*p < 0x20) o += (size_t)snprintf(dst + o, cap - o, "\\u%04x", *p);
        else dst[o++] = (char)*p;
    }
    dst[o] = 0;
}

/* Appends the fields to buf (text: " k=v", JSON: ",\"k\":v"); returns the new length. */
static size_t format_fields(char *buf, size_t cap, size_t o, const log_field *f, int n, bool json)
{
    char esc[2048];
    for (int i = 0; i < n && o < cap; i++) {
        const log_field *x = &f[i];
        const char *sep = json ? "," : " ";
        const char *q = json ? "\"" : "";
        int w = 0;
        if (x->type == LOG_FIELD_INT) {
            w = snprintf(buf + o, cap - o, "%s%s%s%s%s%lld", sep, q, x->key, q, json ? ":" : "=", x->i);
        } else if ((x->type == LOG_FIELD_STR && !x->str) || (x->type == LOG_FIELD_NUM && !isfinite(x->num))) {
            w = snprintf(buf + o, cap - o, "%s%s%s%s%s", sep, q, x->key, q, json ? ":null" : "=-");
        } else if (x->type == LOG_FIELD_NUM) {
            w = snprintf(buf + o, cap - o, "%s%s%s%s%s%.1f", sep, q, x->key, q, json ? ":" : "=", x->num);
        } else {
            bool quote = json || !x->str[0] || strpbrk(x->str, " \t\"=\\") != NULL;
            json_escape(x->str, esc, sizeof esc);
            w = snprintf(buf + o, cap - o, "%s%s%s%s%s%s%s%s", sep, q, x->key, q, json ? ":" : "=",
                         quote ? "\"" : "", quote ? esc : x->str, quote ? "\"" : "");
        }
        o += w > 0 ? (size_t)w : 0;
    }
    return o < cap ? o : cap - 1;
}

/* Writes one whole line: the timestamp, level and message, then the pre-formatted fields
 * (text or JSON members, see format_fields). */
static void emit(log_level lvl, const char *msg, const char *fields)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);

    pthread_mutex_lock(&g_mu);
    FILE *out = g_file ? g_file : stderr;
    if (g_json) {
        char esc[8192];
        json_escape(msg, esc, sizeof esc);
        fprintf(out, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"%s\"%s}\n", when, level_names[lvl], esc,
                fields);
    } else {
        fprintf(out, "%s %-5s %s%s\n", when, level_names[lvl], msg, fields);
    }
    fflush(out);
    pthread_mutex_unlock(&g_mu);
}

void log_msg(log_level lvl, const char *fmt, ...)
{
    if (lvl < g_level) return;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(lvl, msg, "");
}

void log_event(log_level lvl, const char *msg, const log_field *fields, int n_fields)
{
    if (lvl < g_level) return;
    char buf[4096];
    format_fields(buf, sizeof buf, 0, fields, n_fields, g_json);
    emit(lvl, msg, buf);
}
