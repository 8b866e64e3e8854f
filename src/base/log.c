/* log.c - see log.h. A mutex keeps lines whole when several threads log at once. */
#define _POSIX_C_SOURCE 200809L
#include "log.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
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

/* Length of the valid UTF-8 sequence at p (at most n bytes), 0 when invalid. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    if (p[0] < 0x80) return 1;
    size_t len = p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 ? 2 : 0;
    if (!len || len > n || p[0] > 0xF4) return 0;
    uint32_t cp = p[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    bool bad = (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
               (cp >= 0xD800 && cp <= 0xDFFF);
    return bad ? 0 : len;
}

/* Whether s holds a byte a log line must not carry raw: a control byte (a newline would
 * start a forged line) or one that is not valid UTF-8 (a JSON line would not decode). */
static bool needs_escape(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = p[i] < 0x20 || p[i] == 0x7f ? 0 : utf8_len(p + i, n - i);
        if (!k) return true;
        i += k;
    }
    return false;
}

/* Escape src into dst (always NUL-terminated): quotes and backslashes, control bytes as
 * \u00XX (JSON) or \xXX (text), invalid UTF-8 bytes as \xXX in both (inside a JSON string
 * that reads as a backslash and text, never as a broken line). */
static void escape_into(const char *src, char *dst, size_t cap, bool json)
{
    size_t o = 0, n = strlen(src);
    const unsigned char *p = (const unsigned char *)src;
    for (size_t i = 0; i < n && o + 8 < cap;) {
        size_t k = p[i] < 0x20 || p[i] == 0x7f ? 0 : utf8_len(p + i, n - i);
        if (p[i] == '"' || p[i] == '\\') {
            dst[o++] = '\\';
            dst[o++] = (char)p[i];
        } else if (k) {
            if (o + k + 1 >= cap) break;
            memcpy(dst + o, p + i, k);
            o += k;
            i += k;
            continue;
        } else if (json && p[i] < 0x80) {
            o += (size_t)snprintf(dst + o, cap - o, "\\u%04x", p[i]);
        } else {
            o += (size_t)snprintf(dst + o, cap - o, json ? "\\\\x%02x" : "\\x%02x", p[i]);
        }
        i++;
    }
    dst[o] = 0;
}

static void json_escape(const char *src, char *dst, size_t cap) { escape_into(src, dst, cap, true); }

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
            bool quote = json || !x->str[0] || strpbrk(x->str, " \t\"=\\") != NULL || needs_escape(x->str);
            escape_into(x->str, esc, sizeof esc, json);
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
    } else if (needs_escape(msg)) { /* a message quoting a client's bytes must stay one line */
        char esc[8192];
        escape_into(msg, esc, sizeof esc, false);
        fprintf(out, "%s %-5s %s%s\n", when, level_names[lvl], esc, fields);
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
