/* heap.h - a binary min-heap over any element type, generated per type so the comparison
 * inlines (the tokenizer's merge loop pops one per merge).
 *
 *   HEAP_DEFINE(bigram_heap, bigram, bigram_before)
 * defines   typedef struct bigram_heap { bigram *v; size_t n, cap; } bigram_heap;
 *           bool   bigram_heap_push(bigram_heap *h, bigram e);  false when memory ran out
 *           bigram bigram_heap_pop(bigram_heap *h);             the first by before(); n > 0
 *           void   bigram_heap_free(bigram_heap *h);
 * where before(const T *a, const T *b) is true when a must come out before b. */
#ifndef INFERD_BASE_HEAP_H
#define INFERD_BASE_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#define HEAP_DEFINE(name, T, before)                                                               \
    typedef struct name {                                                                          \
        T *v;                                                                                      \
        size_t n, cap;                                                                             \
    } name;                                                                                        \
                                                                                                   \
    static inline bool name##_push(name *h, T e)                                                   \
    {                                                                                              \
        if (h->n == h->cap) {                                                                      \
            size_t cap = h->cap ? h->cap * 2 : 64;                                                 \
            T *v = realloc(h->v, cap * sizeof *v);                                                 \
            if (!v) return false;                                                                  \
            h->v = v;                                                                              \
            h->cap = cap;                                                                          \
        }                                                                                          \
        size_t i = h->n++;                                                                         \
        while (i > 0 && before(&e, &h->v[(i - 1) / 2])) {                                          \
            h->v[i] = h->v[(i - 1) / 2];                                                           \
            i = (i - 1) / 2;                                                                       \
        }                                                                                          \
        h->v[i] = e;                                                                               \
        return true;                                                                               \
    }                                                                                              \
                                                                                                   \
    static inline T name##_pop(name *h)                                                            \
    {                                                                                              \
        T top = h->v[0], last = h->v[--h->n];                                                      \
        size_t i = 0, n = h->n;                                                                    \
        for (;;) {                                                                                 \
            size_t c = 2 * i + 1;                                                                  \
            if (c >= n) break;                                                                     \
            if (c + 1 < n && before(&h->v[c + 1], &h->v[c])) c++;                                  \
            if (!before(&h->v[c], &last)) break;                                                   \
            h->v[i] = h->v[c];                                                                     \
            i = c;                                                                                 \
        }                                                                                          \
        if (n) h->v[i] = last;                                                                     \
        return top;                                                                                \
    }                                                                                              \
                                                                                                   \
    static inline void name##_free(name *h)                                                        \
    {                                                                                              \
        free(h->v);                                                                                \
        *h = (name){0};                                                                            \
    }

#endif
