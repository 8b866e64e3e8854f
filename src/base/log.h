/* log.h - process-wide logging: one line per event, to stderr (journald) by default.
 * Thread-safe. Level and format are set once at start from flags/config. */
#ifndef INFERD_LOG_H
#define INFERD_LOG_H

#include <stdbool.h>

typedef enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 } log_level;

void log_set_level(log_level lvl);
log_level log_get_level(void);
void log_set_json(bool json);
/* Log to a file instead of stderr (NULL = stderr). 0 on success. */
int log_open_file(const char *path);
/* Reopen the log file by its path (SIGHUP, after logrotate moved it).  0 when reopened, 1
 * when logging to stderr (nothing to reopen), -1 on failure (logging goes on to the old
 * file). */
int log_reopen(void);
int log_level_from_name(const char *name); /* -1 when unknown */

void log_msg(log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A structured event: a fixed message plus named fields, for lines that tools parse (the
 * per-request line).  Text: `msg key=value ...` (a string with blanks, quotes or '=' is
 * quoted); JSON: the fields are members of the line's object beside ts/level/msg.  A NULL
 * string or a non-finite number is JSON null and "-" in text. */
typedef enum log_field_type { LOG_FIELD_STR, LOG_FIELD_INT, LOG_FIELD_NUM } log_field_type;
typedef struct log_field {
    const char *key;
    log_field_type type;
    const char *str;
    long long i;
    double num; /* printed with one decimal */
} log_field;
#define LOG_STR(k, v) ((log_field){.key = (k), .type = LOG_FIELD_STR, .str = (v)})
#define LOG_INT(k, v) ((log_field){.key = (k), .type = LOG_FIELD_INT, .i = (v)})
#define LOG_NUM(k, v) ((log_field){.key = (k), .type = LOG_FIELD_NUM, .num = (v)})
void log_event(log_level lvl, const char *msg, const log_field *fields, int n_fields);
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
