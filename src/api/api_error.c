/* api_error.c - see api_error.h. */
#include "api_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void api_error_set(api_error *e, int status, const char *type, const char *param,
                   const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

int api_error_unsupported(api_error *e, const char *param, const char *why)
{
    api_error_set(e, 400, "invalid_request_error", param, "unsupported_parameter", "Unsupported parameter: '%s' %s",
                  param, why);
    return -1;
}

int api_error_too_long(api_error *e, const char *param, int n, int max)
{
    api_error_set(e, 400, "invalid_request_error", param, "array_above_max_length",
                  "Invalid '%s': array too long. Expected an array with maximum length %d, but got an array "
                  "with length %d instead.", param, max, n);
    return -1;
}

/* In e's param and message, `from` (a prefix of the param up to '.' or '[') becomes `to`. */
bool api_error_rename(api_error *e, const char *from, const char *to)
{
    size_t n = strlen(from);
    if (strncmp(e->param, from, n) || (e->param[n] && e->param[n] != '.' && e->param[n] != '['))
        return false;
    char old[sizeof e->param + 2], now[sizeof e->param + 2], msg[sizeof e->message];
    snprintf(old, sizeof old, "'%s", e->param);
    snprintf(now, sizeof now, "'%s%s", to, e->param + n);
    char *at = strstr(e->message, old);
    if (at) {
        snprintf(msg, sizeof msg, "%.*s%s%s", (int)(at - e->message), e->message, now, at + strlen(old));
        snprintf(e->message, sizeof e->message, "%s", msg);
    }
    snprintf(old, sizeof old, "%s", e->param + n);
    char param[2 * sizeof e->param];
    snprintf(param, sizeof param, "%s%s", to, old);
    snprintf(e->param, sizeof e->param, "%.*s", (int)sizeof e->param - 1, param); /* cut, never overrun */
    return true;
}
