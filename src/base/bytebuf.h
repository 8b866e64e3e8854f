/* bytebuf.h - a growable byte buffer, NUL-terminated once anything was appended.
 *
 * Response bodies, SSE streams, completion text on its way from the scheduler to a socket,
 * rendered chat prompts: one type for all of them.  When memory runs out the buffer is marked
 * failed and every later append is a no-op that returns false, so a producer may append a
 * whole document and check once at the end (bytebuf_ok), or stop at the first false. */
#ifndef INFERD_BASE_BYTEBUF_H
#define INFERD_BASE_BYTEBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct bytebuf {
    char *data; /* NULL until the first append */
    size_t len, cap;
    bool failed;
} bytebuf;

bool bytebuf_append(bytebuf *b, const void *data, size_t len);
bool bytebuf_puts(bytebuf *b, const char *s);
bool bytebuf_printf(bytebuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (what a consumer has already sent). */
void bytebuf_consume(bytebuf *b, size_t n);
/* Empties b for reuse (keeps its memory) and clears a failure. */
void bytebuf_clear(bytebuf *b);
bool bytebuf_ok(const bytebuf *b);
/* Hands the malloc'd bytes over and resets b: NULL when nothing was appended or memory ran
 * out (the bytes are freed then); *len (may be NULL) gets their length. */
char *bytebuf_take(bytebuf *b, size_t *len);
void bytebuf_free(bytebuf *b);

#endif
