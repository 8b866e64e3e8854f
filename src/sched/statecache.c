/* statecache.c - recurrent-state slots and prefix snapshots (see statecache.h). */
#include "statecache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef enum { SLOT_FREE, SLOT_RUNNING, SLOT_SNAPSHOT } slot_state;

typedef struct slot {
    slot_state state;
    int32_t *tokens; /* a snapshot's prefix */
    int n_tokens;
    uint64_t used;   /* a snapshot's last use: the LRU order */
} slot;

struct statecache {
    slot *slots;
    int n_slots, max_snapshots, n_snapshots, n_running;
    uint64_t clock;
};

statecache *statecache_create(int n_slots, int max_snapshots)
{
    if (n_slots < 1 || max_snapshots < 0 || max_snapshots >= n_slots) return NULL;
    statecache *c = calloc(1, sizeof *c);
    if (!c || !(c->slots = calloc((size_t)n_slots, sizeof *c->slots))) {
        free(c);
        return NULL;
    }
    c->n_slots = n_slots;
    c->max_snapshots = max_snapshots;
    return c;
}

void statecache_free(statecache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_slots; i++) free(c->slots[i].tokens);
    free(c->slots);
    free(c);
}

static void forget(statecache *c, int i)
{
    if (c->slots[i].state == SLOT_SNAPSHOT) c->n_snapshots--;
    free(c->slots[i].tokens);
    c->slots[i] = (slot){.state = SLOT_FREE};
}

/* The least recently used snapshot, or -1. */
static int oldest_snapshot(const statecache *c)
{
    int best = -1;
    for (int i = 0; i < c->n_slots; i++)
        if (c->slots[i].state == SLOT_SNAPSHOT && (best < 0 || c->slots[i].used < c->slots[best].used)) best = i;
    return best;
}

static int first_free(const statecache *c)
{
    for (int i = 0; i < c->n_slots; i++)
        if (c->slots[i].state == SLOT_FREE) return i;
    return -1;
}

int statecache_take(statecache *c)
{
    int i = first_free(c);
    if (i < 0) i = oldest_snapshot(c); /* only when more run than the rows it was sized for */
    if (i < 0) return -1;
    forget(c, i);
    c->slots[i].state = SLOT_RUNNING;
    c->n_running++;
    return i;
}

void statecache_put(statecache *c, int slot)
{
    if (slot < 0 || slot >= c->n_slots || c->slots[slot].state != SLOT_RUNNING) return;
    c->slots[slot].state = SLOT_FREE;
    c->n_running--;
}

int statecache_lookup(statecache *c, const int32_t *tokens, int max_tokens, int *n_tokens)
{
    int best = -1;
    for (int i = 0; i < c->n_slots; i++) {
        const slot *s = &c->slots[i];
        if (s->state != SLOT_SNAPSHOT || s->n_tokens > max_tokens ||
            (best >= 0 && s->n_tokens <= c->slots[best].n_tokens))
            continue;
        if (memcmp(s->tokens, tokens, (size_t)s->n_tokens * sizeof *tokens) == 0) best = i;
    }
    if (best >= 0) {
        c->slots[best].used = ++c->clock;
        *n_tokens = c->slots[best].n_tokens;
    }
    return best;
}

int statecache_snapshot(statecache *c, const int32_t *tokens, int n_tokens)
{
    if (c->max_snapshots == 0 || n_tokens < 1) return -1;
    for (int i = 0; i < c->n_slots; i++) {
        slot *s = &c->slots[i];
        if (s->state == SLOT_SNAPSHOT && s->n_tokens == n_tokens &&
            memcmp(s->tokens, tokens, (size_t)n_tokens * sizeof *tokens) == 0) {
            s->used = ++c->clock;
            return -1;
        }
    }
    int32_t *copy = malloc((size_t)n_tokens * sizeof *copy);
    if (!copy) return -1;
    memcpy(copy, tokens, (size_t)n_tokens * sizeof *copy);
    /* Keep max_snapshots at most, and a free slot for every row that may start. */
    int i = c->n_snapshots < c->max_snapshots ? first_free(c) : -1;
    if (i < 0) i = oldest_snapshot(c);
    if (i < 0) {
        free(copy);
        return -1;
    }
    forget(c, i);
    c->slots[i] = (slot){.state = SLOT_SNAPSHOT, .tokens = copy, .n_tokens = n_tokens, .used = ++c->clock};
    c->n_snapshots++;
    return i;
}

void statecache_drop(statecache *c, int slot, const int32_t *tokens, int n_tokens)
{
    if (slot < 0 || slot >= c->n_slots) return;
    const struct slot *s = &c->slots[slot];
    if (s->state == SLOT_SNAPSHOT && s->n_tokens == n_tokens &&
        memcmp(s->tokens, tokens, (size_t)n_tokens * sizeof *tokens) == 0)
        forget(c, slot);
}

statecache_counts statecache_count(const statecache *c)
{
    return (statecache_counts){.running = c->n_running, .snapshots = c->n_snapshots,
                               .free = c->n_slots - c->n_running - c->n_snapshots};
}
