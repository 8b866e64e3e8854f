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
/* Reopen the log file (SIGHUP, after logrotate moved it). */
int log_reopen(void);
int log_level_from_name(const char *name); /* -1 when unknown */

void log_msg(log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
