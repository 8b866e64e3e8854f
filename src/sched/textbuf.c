/* textbuf.c - see textbuf.h. */
#include "textbuf.h"

#include <stdlib.h>
#include <string.h>

bool textbuf_append(textbuf *b, const char *s, size_t n)
{
    if (n == 0) return true;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) return false;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

char *textbuf_take(textbuf *b, size_t *len)
{
    char *p = b->data;
    *len = b->len;
    *b = (textbuf){0};
    return p;
}

void textbuf_free(textbuf *b)
{
    free(b->data);
    *b = (textbuf){0};
}
