/* http_guard.h - checks on a request's head alone (request line and header fields), made
 * before routing and before a byte of the body is read.
 *
 * libmicrohttpd 0.9.75 frames a request by whatever it finds first (Transfer-Encoding over
 * Content-Length, the first of two Content-Lengths, no length at all for an unknown coding),
 * so a request that two parsers would frame differently is refused here: RFC 9112 §6.3 says
 * such a message must get 400 (501 for a transfer coding we do not implement) and the
 * connection must close, so no byte after it is read as another request. */
#ifndef INFERD_HTTP_GUARD_H
#define INFERD_HTTP_GUARD_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/api_error.h"

/* The request target as sent (still percent-encoded): 0, or -1 with a 400 in e when it holds
 * an encoded NUL (%00), which the decoded path would silently end at. */
int http_guard_target(const char *raw_target, api_error *e);

/* Framing and the Host field (RFC 9112 §3.2, §6.1, §6.3): 0 when unambiguous; else -1 with
 * 400 or 501 in e, and the reply must close the connection. */
int http_guard_framing(struct MHD_Connection *conn, const char *version, api_error *e);

/* true when authorization ("Bearer KEY", the scheme in any case, RFC 9110 §11.1) carries key.
 * Constant time in the key's length, so the key cannot be found byte by byte from timings. */
bool http_guard_bearer(const char *authorization, const char *key);
/* The same for a header that carries the key alone (Anthropic's "x-api-key: KEY"). */
bool http_guard_key(const char *value, const char *key);

/* Client text as a header value or a log line may carry it: src copied into dst (cap >= 1
 * bytes, NUL-terminated), every byte outside printable ASCII made '?' (MHD drops a header
 * value with CR or LF; control bytes garble a log).  Returns the bytes copied: src[n] != 0
 * when src was cut at cap - 1. */
size_t http_guard_printable(char *dst, size_t cap, const char *src);

#endif
