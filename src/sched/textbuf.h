/* textbuf.h - a growable byte buffer (always NUL-terminated once non-empty).
 *
 * The scheduler appends completion text to per-request buffers and hands the memory over to
 * the HTTP side; a small type of its own keeps that ownership transfer explicit. */
#ifndef INFERD_SCHED_TEXTBUF_H
#define INFERD_SCHED_TEXTBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct textbuf {
    char *data;
    size_t len;
    size_t cap;
} textbuf;

/* false when memory ran out (the buffer is unchanged then). */
bool textbuf_append(textbuf *b, const char *s, size_t n);
/* Hands the bytes over (malloc'd, NUL-terminated, NULL when empty) and empties b. */
char *textbuf_take(textbuf *b, size_t *len);
void textbuf_free(textbuf *b);

#endif
