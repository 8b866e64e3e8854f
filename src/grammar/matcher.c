/* matcher.c - the pushdown matcher over bytes, the vocabulary and the token masks.
 *
 * A state is a set of stacks of positions (grammar_impl.h).  The top of a non-empty stack is
 * always a BYTES element (stacks are expanded eagerly); the positions below are where to go
 * on when the rule above completes.  An empty stack in the set means the grammar is complete.
 *
 * Masks.  For a stack with top p, a token is decided by the bytes of its own frame alone
 * when, run from the one-frame stack [p], either some path consumes the whole token without
 * leaving the frame (accepted, whatever lies below), or every path fails before leaving it
 * (rejected).  Only tokens for which some path leaves the frame with bytes left over depend
 * on the stack below.  table(p) holds the accepted tokens and that short uncertain list,
 * built once per position on first use by walking the sorted vocabulary (tokens that share a
 * prefix share the work); a mask is the union over the state's stacks of accepted(p) plus the
 * uncertain tokens checked against the whole stack.  Whole masks are then cached by state. */
#include "grammar_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"

/* ---- stack sets --------------------------------------------------------------------------- */

/* Stacks stored back to back as [len, p0, ..., p_{len-1}] (top last), deduplicated. */
typedef struct sset {
    int32_t *d;
    size_t len, cap;
    int n;
    bool has_empty;
    uint32_t *slots; /* hash -> offset + 1, open addressing; valid when gen[i] == cur_gen */
    uint32_t *gen;   /* so that clearing is O(1): advance() clears a set per byte */
    uint32_t cur_gen;
    int n_slots;
    bool failed; /* out of memory: the set is treated as empty */
} sset;

static void sset_clear(sset *s)
{
    s->len = 0;
    s->n = 0;
    s->has_empty = false;
    s->failed = false;
    if (++s->cur_gen == 0) { /* wrapped: start over */
        if (s->gen) memset(s->gen, 0, (size_t)s->n_slots * sizeof *s->gen);
        s->cur_gen = 1;
    }
}

static void sset_free(sset *s)
{
    free(s->d);
    free(s->slots);
    free(s->gen);
    memset(s, 0, sizeof *s);
}

static uint64_t stack_hash(const int32_t *p, int n) { return hash_bytes(p, (size_t)n * sizeof *p); }

static void sset_add(sset *s, const int32_t *st, int n)
{
    if (n == 0) {
        s->has_empty = true;
        return;
    }
    if (s->n >= GRAMMAR_MAX_STACKS || n > GRAMMAR_MAX_STACK || s->failed) return;
    if (!s->slots) {
        s->n_slots = 2 * GRAMMAR_MAX_STACKS;
        s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
        s->gen = calloc((size_t)s->n_slots, sizeof *s->gen);
        if (!s->cur_gen) s->cur_gen = 1;
        if (!s->slots || !s->gen) {
            s->failed = true;
            return;
        }
    }
    uint32_t mask = (uint32_t)s->n_slots - 1, h = (uint32_t)stack_hash(st, n) & mask;
    for (;; h = (h + 1) & mask) {
        if (s->gen[h] != s->cur_gen) break;
        uint32_t o = s->slots[h];
        const int32_t *q = &s->d[o - 1];
        if (q[0] == n && !memcmp(q + 1, st, (size_t)n * sizeof *st)) return;
    }
    if (s->len + (size_t)n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        while (cap < s->len + (size_t)n + 1) cap *= 2;
        int32_t *d = realloc(s->d, cap * sizeof *d);
        if (!d) {
            s->failed = true;
            return;
        }
        s->d = d;
        s->cap = cap;
    }
    s->slots[h] = (uint32_t)s->len + 1;
    s->gen[h] = s->cur_gen;
    s->d[s->len] = n;
    memcpy(&s->d[s->len + 1], st, (size_t)n * sizeof *st);
    s->len += (size_t)n + 1;
    s->n++;
}

static bool sset_copy(sset *dst, const sset *src)
{
    sset_clear(dst);
    for (size_t o = 0; o < src->len; o += (size_t)src->d[o] + 1) sset_add(dst, &src->d[o + 1], src->d[o]);
    dst->has_empty = src->has_empty;
    return !dst->failed;
}

/* ---- expansion ---------------------------------------------------------------------------- */

/* tmp[0..n) is the stack below; position p is what comes next.  Adds every stack whose top is
 * a BYTES element reachable without consuming a byte.  Each frame restores the slot of tmp it
 * overwrites, so siblings see the stack they were given.  Left recursion is refused at compile
 * time, so this terminates; depth guards hostile but legal chains. */
static void expand(const grammar *g, int32_t *tmp, int n, int32_t p, sset *out, int depth)
{
    if (depth > 4 * GRAMMAR_MAX_STACK || n >= GRAMMAR_MAX_STACK) return;
    const gelem *e = &g->elems[p];
    switch (e->type) {
    case GE_BYTES:
        tmp[n] = p;
        sset_add(out, tmp, n + 1);
        return;
    case GE_ALT:
    case GE_END: /* the alternative is complete: go on below */
        if (n == 0) {
            sset_add(out, tmp, 0);
            return;
        }
        {
            int32_t q = tmp[n - 1];
            expand(g, tmp, n - 1, q, out, depth + 1);
            tmp[n - 1] = q;
        }
        return;
    case GE_REF: {
        int32_t cont = p + 1;
        /* A REF that ends its alternative is a tail call: nothing to come back to. */
        int m = g->elems[cont].type <= GE_ALT ? n : n + 1;
        for (int32_t a = g->alt_off[e->v]; a < g->alt_off[e->v + 1]; a++) {
            if (m > n) tmp[n] = cont;
            expand(g, tmp, m, g->alt_pos[a], out, depth + 1);
        }
        return;
    }
    }
}

/* out = the stacks of in after byte b. */
static void advance(const grammar *g, const sset *in, unsigned b, sset *out, int32_t *tmp)
{
    sset_clear(out);
    for (size_t o = 0; o < in->len; o += (size_t)in->d[o] + 1) {
        int n = in->d[o];
        const int32_t *st = &in->d[o + 1];
        int32_t top = st[n - 1];
        if (!gbyteset_has(&g->sets[g->elems[top].v], b)) continue;
        memcpy(tmp, st, (size_t)(n - 1) * sizeof *tmp);
        expand(g, tmp, n - 1, top + 1, out, 0);
    }
}

static bool sset_alive(const sset *s) { return !s->failed && (s->n > 0 || s->has_empty); }

/* ---- vocabulary ---------------------------------------------------------------------------- */

#define TOKEN_MAX_BYTES 128 /* longer tokens are checked at run time only */

/* ---- per-position tables and the state cache ------------------------------------------------ */

typedef struct pos_table {
    bool built;
    int32_t *acc; /* accepted token ids */
    int n_acc;
    int32_t *unc; /* uncertain token ids */
    int n_unc;
} pos_table;

typedef struct cache_entry {
    uint64_t hash;
    int32_t *key; /* the state: stacks as in sset.d, then has_empty */
    size_t key_len;
    uint32_t *mask;
    int n_allowed;
} cache_entry;

#define CACHE_BYTES_MAX ((size_t)64 << 20) /* per grammar: beyond it the cache starts over */

struct grammar_mask_tables {
    const grammar_vocab *v;
    pos_table *pos; /* per element */
    int n_pos;
    cache_entry *cache;
    int cache_slots, cache_n;
    size_t cache_bytes;
    /* scratch for the walks */
    sset level[TOKEN_MAX_BYTES + 1];
    bool esc[TOKEN_MAX_BYTES + 1];
    sset one, a, b;
    int32_t tmp[GRAMMAR_MAX_STACK + 2];
};

static void cache_reset(struct grammar_mask_tables *t)
{
    for (int i = 0; i < t->cache_slots; i++) {
        free(t->cache[i].key);
        free(t->cache[i].mask);
    }
    free(t->cache);
    t->cache = NULL;
    t->cache_slots = t->cache_n = 0;
    t->cache_bytes = 0;
}

void grammar_tables_free(struct grammar_mask_tables *t)
{
    if (!t) return;
    cache_reset(t);
    for (int i = 0; t->pos && i < t->n_pos; i++) {
        free(t->pos[i].acc);
        free(t->pos[i].unc);
    }
    free(t->pos);
    for (int i = 0; i <= TOKEN_MAX_BYTES; i++) sset_free(&t->level[i]);
    sset_free(&t->one);
    sset_free(&t->a);
    sset_free(&t->b);
    free(t);
}

static struct grammar_mask_tables *tables_for(grammar *g, const grammar_vocab *v)
{
    if (g->tables && g->tables->v == v) return g->tables;
    if (g->tables) { /* another vocabulary: start over */
        grammar_tables_free(g->tables);
        g->tables = NULL;
    }
    struct grammar_mask_tables *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->pos = calloc((size_t)g->n_elems, sizeof *t->pos);
    if (!t->pos) {
        free(t);
        return NULL;
    }
    t->n_pos = g->n_elems;
    t->v = v;
    g->tables = t;
    return t;
}

static bool list_push(int32_t **list, int *n, int *cap, int32_t id)
{
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 16;
        int32_t *l = realloc(*list, (size_t)c * sizeof *l);
        if (!l) return false;
        *list = l;
        *cap = c;
    }
    (*list)[(*n)++] = id;
    return true;
}

/* Walks the sorted vocabulary from the one-frame stack [p]; see the file comment. */
static bool build_pos(const grammar *g, struct grammar_mask_tables *t, int32_t p)
{
    const grammar_vocab *v = t->v;
    pos_table *pt = &t->pos[p];
    int cap_acc = 0, cap_unc = 0;
    bool ok = true;
    sset_clear(&t->level[0]);
    sset_add(&t->level[0], &p, 1);
    t->esc[0] = false;
    int valid = 0; /* levels 0..valid hold the states of the current token's prefix */
    for (int k = 0; k < v->n_sorted && ok;) {
        int32_t id = v->ids[k];
        const unsigned char *b = v->bytes + v->off[id];
        int len = v->len[id];
        if (len > TOKEN_MAX_BYTES) { /* too long to walk: decided at run time */
            ok = list_push(&pt->unc, &pt->n_unc, &cap_unc, id);
            valid = 0;
            k++;
            continue;
        }
        int d = v->lcp[k] < valid ? v->lcp[k] : valid;
        bool dead = false;
        for (; d < len; d++) {
            advance(g, &t->level[d], b[d], &t->level[d + 1], t->tmp);
            t->esc[d + 1] = t->esc[d] || t->level[d].has_empty;
            if (t->level[d + 1].failed) ok = false;
            if (!sset_alive(&t->level[d + 1]) && !t->esc[d + 1]) {
                dead = true;
                break;
            }
        }
        if (dead) {
            /* every later token with this prefix (bytes 0..d) is rejected too */
            valid = d;
            k++;
            while (k < v->n_sorted && v->lcp[k] > d) k++;
            continue;
        }
        valid = len;
        if (sset_alive(&t->level[len])) ok = ok && list_push(&pt->acc, &pt->n_acc, &cap_acc, id);
        else if (t->esc[len]) ok = ok && list_push(&pt->unc, &pt->n_unc, &cap_unc, id);
        k++;
    }
    pt->built = ok;
    return ok;
}

static bool set_bit(uint32_t *mask, int32_t id)
{
    uint32_t bit = 1u << (id & 31);
    bool was = mask[id >> 5] & bit;
    mask[id >> 5] |= bit;
    return !was;
}

/* Whether the token's bytes can be consumed from the single stack st[0..n). */
static bool check_token(const grammar *g, struct grammar_mask_tables *t, const int32_t *st, int n,
                        const unsigned char *b, int len)
{
    sset *cur = &t->a, *next = &t->b;
    sset_clear(cur);
    sset_add(cur, st, n);
    for (int i = 0; i < len; i++) {
        advance(g, cur, b[i], next, t->tmp);
        if (!sset_alive(next)) return false;
        sset *x = cur;
        cur = next;
        next = x;
    }
    return true;
}

/* ---- the matcher ---------------------------------------------------------------------------- */

struct grammar_matcher {
    grammar *g;
    const grammar_vocab *v;
    sset state;
    sset scratch, scratch2;
    bool ended; /* an end-of-generation token was accepted */
    int32_t tmp[GRAMMAR_MAX_STACK + 2];
};

grammar_matcher *grammar_matcher_new(grammar *g, const grammar_vocab *v)
{
    grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = grammar_ref(g);
    m->v = v;
    const int32_t r = g->root;
    for (int32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) expand(g, m->tmp, 0, g->alt_pos[a], &m->state, 0);
    if (m->state.failed) {
        grammar_matcher_free(m);
        return NULL;
    }
    return m;
}

void grammar_matcher_free(grammar_matcher *m)
{
    if (!m) return;
    sset_free(&m->state);
    sset_free(&m->scratch);
    sset_free(&m->scratch2);
    grammar_unref(m->g);
    free(m);
}

bool grammar_matcher_is_complete(const grammar_matcher *m) { return m->state.has_empty || m->ended; }

bool grammar_matcher_is_done(const grammar_matcher *m)
{
    return m->ended || (m->state.has_empty && m->state.n == 0);
}

bool grammar_matcher_accept(grammar_matcher *m, int32_t token)
{
    const grammar_vocab *v = m->v;
    if (m->ended || token < 0 || token >= v->n_vocab) return false;
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == token) {
            if (!m->state.has_empty) return false;
            m->ended = true;
            return true;
        }
    if (v->rank[token] < 0) return false;
    return grammar_matcher_accept_bytes(m, (const char *)v->bytes + v->off[token], v->len[token]);
}

bool grammar_matcher_accept_bytes(grammar_matcher *m, const char *bytes, size_t len)
{
    if (m->ended) return false;
    /* advance through the two scratch sets; the state changes only when all bytes fit */
    const sset *a = &m->state;
    sset *out = &m->scratch, *spare = &m->scratch2;
    for (size_t i = 0; i < len; i++) {
        advance(m->g, a, (unsigned char)bytes[i], out, m->tmp);
        if (!sset_alive(out)) return false;
        a = out;
        out = spare;
        spare = (sset *)a;
    }
    return a == &m->state || sset_copy(&m->state, a);
}

grammar_matcher *grammar_matcher_clone(const grammar_matcher *m)
{
    grammar_matcher *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->g = grammar_ref(m->g);
    c->v = m->v;
    c->ended = m->ended;
    if (!sset_copy(&c->state, &m->state)) {
        grammar_matcher_free(c);
        return NULL;
    }
    return c;
}

static uint64_t state_hash(const sset *s)
{
    return hash_bytes(s->d, s->len * sizeof *s->d) ^ (s->has_empty ? 0x9e3779b97f4a7c15ull : 0);
}

static cache_entry *cache_find(struct grammar_mask_tables *t, const sset *s, uint64_t h)
{
    if (!t->cache_slots) return NULL;
    uint32_t mask = (uint32_t)t->cache_slots - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        cache_entry *e = &t->cache[i];
        if (!e->key && !e->mask) return e;
        if (e->hash == h && e->key_len == s->len + 1 && e->key[s->len] == (int32_t)s->has_empty &&
            !memcmp(e->key, s->d, s->len * sizeof *s->d))
            return e;
    }
}

static void cache_store(struct grammar_mask_tables *t, const sset *s, uint64_t h, const uint32_t *mask, int n_words,
                        int n_allowed)
{
    size_t bytes = (s->len + 1) * sizeof(int32_t) + (size_t)n_words * sizeof(uint32_t);
    if (t->cache_bytes + bytes > CACHE_BYTES_MAX || (t->cache_n + 1) * 2 > t->cache_slots) {
        int slots = t->cache_slots ? t->cache_slots * 2 : 256;
        if (t->cache_bytes + bytes > CACHE_BYTES_MAX) {
            cache_reset(t);
            slots = 256;
        }
        cache_entry *old = t->cache;
        int old_slots = t->cache_slots;
        cache_entry *nc = calloc((size_t)slots, sizeof *nc);
        if (!nc) return;
        t->cache = nc;
        t->cache_slots = slots;
        for (int i = 0; i < old_slots; i++) {
            if (!old[i].mask) continue;
            uint32_t m = (uint32_t)slots - 1, j = (uint32_t)old[i].hash & m;
            while (nc[j].mask) j = (j + 1) & m;
            nc[j] = old[i];
        }
        free(old);
    }
    cache_entry *e = cache_find(t, s, h);
    if (!e || e->mask) return;
    int32_t *key = malloc((s->len + 1) * sizeof *key);
    uint32_t *mk = malloc((size_t)n_words * sizeof *mk);
    if (!key || !mk) {
        free(key);
        free(mk);
        return;
    }
    memcpy(key, s->d, s->len * sizeof *key);
    key[s->len] = s->has_empty;
    memcpy(mk, mask, (size_t)n_words * sizeof *mk);
    *e = (cache_entry){h, key, s->len + 1, mk, n_allowed};
    t->cache_n++;
    t->cache_bytes += bytes;
}

int grammar_matcher_fill_mask(grammar_matcher *m, uint32_t *mask)
{
    const grammar_vocab *v = m->v;
    memset(mask, 0, (size_t)v->n_words * sizeof *mask);
    if (m->ended) return 0;
    struct grammar_mask_tables *t = tables_for(m->g, v);
    if (!t) return 0;
    uint64_t h = state_hash(&m->state);
    cache_entry *ce = cache_find(t, &m->state, h);
    if (ce && ce->mask) {
        memcpy(mask, ce->mask, (size_t)v->n_words * sizeof *mask);
        return ce->n_allowed;
    }
    int n = 0;
    const sset *s = &m->state;
    for (size_t o = 0; o < s->len; o += (size_t)s->d[o] + 1) {
        int sn = s->d[o];
        const int32_t *st = &s->d[o + 1];
        int32_t top = st[sn - 1];
        pos_table *pt = &t->pos[top];
        if (!pt->built && !build_pos(m->g, t, top)) return 0;
        for (int i = 0; i < pt->n_acc; i++) n += set_bit(mask, pt->acc[i]);
        for (int i = 0; i < pt->n_unc; i++) {
            int32_t id = pt->unc[i];
            if (mask[id >> 5] >> (id & 31) & 1u) continue;
            if (check_token(m->g, t, st, sn, v->bytes + v->off[id], v->len[id])) n += set_bit(mask, id);
        }
    }
    if (s->has_empty)
        for (int i = 0; i < v->n_eog; i++) n += set_bit(mask, v->eog[i]);
    cache_store(t, s, h, mask, v->n_words, n);
    return n;
}
