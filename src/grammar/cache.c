/* cache.c - compiled grammars by source text (grammar_cache_*), so that repeated requests with
 * one schema compile once and reuse the token tables their masks built. */
#include "grammar.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_ENTRIES 32

static struct {
    char *key;
    size_t len;
    grammar *g;
    uint64_t used;
} entries[CACHE_ENTRIES];
static uint64_t clock_;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

grammar *grammar_cache_get(const char *key, size_t len)
{
    grammar *g = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < CACHE_ENTRIES; i++)
        if (entries[i].g && entries[i].len == len && !memcmp(entries[i].key, key, len)) {
            entries[i].used = ++clock_;
            g = grammar_ref(entries[i].g);
            break;
        }
    pthread_mutex_unlock(&mu);
    return g;
}

void grammar_cache_put(const char *key, size_t len, grammar *g)
{
    char *k = malloc(len ? len : 1);
    if (!k) return;
    memcpy(k, key, len);
    pthread_mutex_lock(&mu);
    int victim = 0;
    for (int i = 0; i < CACHE_ENTRIES; i++) {
        if (entries[i].g && entries[i].len == len && !memcmp(entries[i].key, key, len)) { /* raced: keep the first */
            victim = -1;
            break;
        }
        if (entries[i].used < entries[victim].used) victim = i;
    }
    grammar *old = NULL;
    char *old_key = NULL;
    if (victim >= 0) {
        old = entries[victim].g;
        old_key = entries[victim].key;
        entries[victim].key = k;
        entries[victim].len = len;
        entries[victim].g = grammar_ref(g);
        entries[victim].used = ++clock_;
        k = NULL;
    }
    pthread_mutex_unlock(&mu);
    free(k);
    free(old_key);
    grammar_unref(old); /* a request still decoding with it holds its own reference */
}

void grammar_cache_clear(void)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < CACHE_ENTRIES; i++) {
        grammar_unref(entries[i].g);
        free(entries[i].key);
        entries[i].g = NULL;
        entries[i].key = NULL;
        entries[i].used = 0;
    }
    pthread_mutex_unlock(&mu);
}
