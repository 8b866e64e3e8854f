/* bytebuf.c - see bytebuf.h. */
#include "bytebuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for extra more bytes and the terminating NUL. */
static bool reserve(bytebuf *b, size_t extra)
{
    if (b->failed) return false;
    if (extra < (size_t)-1 - b->len - 1 && b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > ((size_t)-1) / 2 || extra >= (size_t)-1 - b->len - 1) {
            b->failed = true;
            return false;
        }
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

bool bytebuf_append(bytebuf *b, const void *data, size_t len)
{
    if (!reserve(b, len)) return false;
    if (len) memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = 0;
    return true;
}

bool bytebuf_puts(bytebuf *b, const char *s) { return bytebuf_append(b, s, strlen(s)); }

bool bytebuf_printf(bytebuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void bytebuf_consume(bytebuf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        if (b->data) b->data[0] = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

void bytebuf_clear(bytebuf *b)
{
    b->len = 0;
    b->failed = false;
    if (b->data) b->data[0] = 0;
}

bool bytebuf_ok(const bytebuf *b) { return !b->failed; }

char *bytebuf_take(bytebuf *b, size_t *len)
{
    char *p = b->failed ? NULL : b->data;
    if (b->failed) free(b->data);
    if (len) *len = p ? b->len : 0;
    *b = (bytebuf){0};
    return p;
}

void bytebuf_free(bytebuf *b)
{
    free(b->data);
    *b = (bytebuf){0};
}
