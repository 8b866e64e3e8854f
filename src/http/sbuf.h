/* sbuf.h - a growable byte buffer (response bodies, SSE streams, accumulated choice text).
 * On allocation failure the buffer is marked failed and later appends are ignored, so callers
 * check once at the end (sbuf_ok) instead of after every append. */
#ifndef INFERD_HTTP_SBUF_H
#define INFERD_HTTP_SBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct sbuf {
    char *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
    bool failed;
} sbuf;

void sbuf_append(sbuf *b, const void *data, size_t len);
void sbuf_puts(sbuf *b, const char *s);
void sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drop the first n bytes (what a consumer has already sent). */
void sbuf_consume(sbuf *b, size_t n);
bool sbuf_ok(const sbuf *b);
/* Hands the malloc'd string to the caller (NULL if failed) and resets b. */
char *sbuf_take(sbuf *b);
void sbuf_free(sbuf *b);

#endif
