/* api_error.c - see api_error.h. */
#include "api_error.h"

#include <stdarg.h>
#include <stdio.h>

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
