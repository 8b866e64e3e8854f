/* sbuf.c - see sbuf.h. */
#include "sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(sbuf *b, size_t extra)
{
    if (b->failed) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > ((size_t)-1) / 2) { b->failed = true; return false; }
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) { b->failed = true; return false; }
    b->data = p;
    b->cap = cap;
    return true;
}

void sbuf_append(sbuf *b, const void *data, size_t len)
{
    if (!reserve(b, len)) return;
    if (len) memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = 0;
}

void sbuf_puts(sbuf *b, const char *s) { sbuf_append(b, s, strlen(s)); }

void sbuf_printf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sbuf_consume(sbuf *b, size_t n)
{
    if (n >= b->len) { b->len = 0; if (b->data) b->data[0] = 0; return; }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

bool sbuf_ok(const sbuf *b) { return !b->failed; }

char *sbuf_take(sbuf *b)
{
    char *p = b->failed ? NULL : b->data;
    if (b->failed) free(b->data);
    else if (!p) p = calloc(1, 1);
    *b = (sbuf){0};
    return p;
}

void sbuf_free(sbuf *b)
{
    free(b->data);
    *b = (sbuf){0};
}
