/* api_error.h - an OpenAI-shaped error (status, type, param, code, message), the one shape every
 * module of the protocol floor and the HTTP front end reports a refused request in.
 *
 * Alone in its header so that the parsers' helpers (json_strict, api_constraint) and the
 * transport (reply, http_guard) need not include the whole request struct. */
#ifndef INFERD_API_ERROR_H
#define INFERD_API_ERROR_H

#include <stdbool.h>

typedef struct api_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error", ... */
    char param[64];   /* "" -> null */
    char code[64];    /* "" -> null */
    char message[512];
} api_error;

void api_error_set(api_error *e, int status, const char *type, const char *param,
                   const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* 400 unsupported_parameter: "Unsupported parameter: 'param' why"; returns -1. */
int api_error_unsupported(api_error *e, const char *param, const char *why);
/* 400 array_above_max_length, in OpenAI's words for an array of n items over max; returns -1. */
int api_error_too_long(api_error *e, const char *param, int n, int max);
/* When e's param starts with `from` (up to '.' or '['), `from` becomes `to` there and in the
 * message's quoted 'param': an error a translated body earned, named as the client sent it. */
bool api_error_rename(api_error *e, const char *from, const char *to);

#endif
