/* matcher.c - the pushdown matcher over bytes, the vocabulary and the token masks.
 *
 * A state is a set of stacks of frames (grammar_impl.h; a frame is a position, with an
 * iteration count for a REP element).  The top of a non-empty stack is always a BYTES element
 * (stacks are expanded eagerly); the frames below are where to go on when the rule above
 * completes.  An empty stack in the set means the grammar is complete.
 *
 * Masks.  For a stack, a token is decided by the top frames of the stack alone when, run from
 * those frames, either some path consumes the whole token without leaving them (accepted,
 * whatever lies below), or every path fails before leaving them (rejected).  Only tokens for
 * which some path leaves the frames with bytes left over depend on the stack below.  A table
 * per stack suffix holds the accepted tokens and that uncertain list, built once on first use
 * by walking the sorted vocabulary (tokens that share a prefix share the work, and a byte the
 * state cannot take passes over every token under it) on interned states with memoized
 * transitions; a mask is the union over the state's stacks of accepted plus the uncertain
 * tokens checked against the whole stack.  Whole masks are then cached by state.
 *
 * Counts.  The suffix's topmost REP frame enters the table's key relaxed: no bounds, counting
 * the iterations its paths start, so that one table serves all its counts (each count would
 * otherwise be a key of its own, and a string of maxLength 40 forty tables).  Tokens are then
 * accepted outright, or counted with the iterations they need (pos_table), which a mask
 * compares with what the concrete frame has left. */
#include "grammar_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/hash.h"
#include "base/timing.h"

/* A frame is a position, plus for a REP element the iterations started so far: coming back to
 * frame (p, c) means "c iterations of p are done".  Two more kinds exist only in the token-table
 * walks (below): a relaxed REP frame, whose bounds are lifted and whose count says how many
 * iterations the walk has started from it, and the exit mark at the bottom of a stack whose
 * relaxed frame was left after c iterations. */
#define FR_POS(f) ((f) & ((1 << 18) - 1)) /* GRAMMAR_MAX_ELEMS < 2^18 */
#define FR_COUNT(f) (((f) >> 18) & 0x3ff) /* GRAMMAR_MAX_REPEAT < 2^10 */
#define FR_WITH_COUNT(f, c) (((f) & ~(0x3ff << 18)) | (c) << 18)
#define FR_RELAXED (1 << 28)
#define FR_EXIT (1 << 29)
_Static_assert(GRAMMAR_MAX_ELEMS < (1 << 18) && GRAMMAR_MAX_REPEAT < 0x3ff, "frame fields too narrow");

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
    bool failed;   /* out of memory or over budget: the set is treated as empty */
    bool overflow; /* failed because its expansion took more than EXPAND_STEPS_MAX steps */
    bool truncated; /* stacks were dropped at GRAMMAR_MAX_STACKS: the set is a part of the state */
    int steps;     /* expand() calls that went into the set since it was cleared */
} sset;

static void sset_clear(sset *s)
{
    s->len = 0;
    s->n = 0;
    s->has_empty = false;
    s->failed = s->overflow = s->truncated = false;
    s->steps = 0;
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
    if (n == 1 && (st[0] & FR_EXIT)) s->has_empty = true; /* a table walk's exit mark (FR_EXIT): complete */
    if (s->n >= GRAMMAR_MAX_STACKS) s->truncated = true;
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

/* Expansion is a walk over every path from a frame to the BYTES elements reachable without a
 * byte, and an ambiguous grammar has many paths to the same stacks: nested repetitions of
 * something that may be empty, ((a{0,8}){0,8}){0,8}, reach 'a' along every way of spending
 * empty iterations (9^8 of them at the start).  Two rules keep it polynomial, both exact:
 * an iteration that ends without a byte since it started is dropped (the same stacks are
 * reached without it, with fewer iterations spent), and a repetition whose body can be empty
 * may stop at any count (the iterations missing to its minimum can be empty ones).  What is
 * left is the grammar's genuine ambiguity, which the set's deduplication does not stop a
 * hostile grammar from enumerating (rule_i ::= rule_j rule_j over twenty rules is 2^20 paths):
 * an expansion (all the stacks after one byte) gives up after this many steps, and the set is
 * marked overflow; compile time refuses a grammar whose start is already over it
 * (grammar_check_start) and the matcher reports it (grammar_matcher_too_complex). */
#define EXPAND_STEPS_MAX (1 << 18)

static void expand(const grammar *g, int32_t *tmp, int n, int base, int32_t f, sset *out, int depth);

/* Leaves the relaxed REP frame below which tmp[0..n) lies after c iterations: the exit mark
 * goes under the stack, so that the count survives whatever the walk pops later. */
static void expand_relaxed_exit(const grammar *g, const int32_t *tmp, int n, int base, int32_t p, int c, sset *out,
                                int depth)
{
    int32_t st[GRAMMAR_MAX_STACK + 2];
    if (n + 1 >= GRAMMAR_MAX_STACK) return;
    st[0] = FR_EXIT | c << 18;
    memcpy(st + 1, tmp, (size_t)n * sizeof *st);
    expand(g, st, n + 1, base + 1, p + 1, out, depth + 1);
}

/* tmp[0..n) is the stack below; frame f is what comes next; the frames tmp[0..base) were there
 * before the last byte (the others were pushed by this expansion).  Adds every stack whose top
 * is a BYTES element reachable without consuming a byte.  Each frame restores the slot of tmp
 * it overwrites, so siblings see the stack they were given.  Left recursion is refused at
 * compile time and repetition counts are bounded, so this terminates; depth guards hostile
 * but legal chains, and out->steps the work (above). */
static void expand(const grammar *g, int32_t *tmp, int n, int base, int32_t f, sset *out, int depth)
{
    if (depth > 4 * GRAMMAR_MAX_STACK || n >= GRAMMAR_MAX_STACK || out->failed) return;
    if (++out->steps > EXPAND_STEPS_MAX) {
        out->failed = out->overflow = true;
        return;
    }
    int32_t p = FR_POS(f);
    const gelem *e = &g->elems[p];
    switch (e->type) {
    case GE_BYTES:
        tmp[n] = p;
        sset_add(out, tmp, n + 1);
        return;
    case GE_REP: {
        int c = FR_COUNT(f);
        bool relaxed = f & FR_RELAXED;
        if ((relaxed || c < e->hi) && c < GRAMMAR_MAX_REPEAT) { /* another iteration */
            for (int32_t a = g->alt_off[e->v]; a < g->alt_off[e->v + 1]; a++) {
                tmp[n] = FR_WITH_COUNT(f, c + 1);
                expand(g, tmp, n + 1, base, g->alt_pos[a], out, depth + 1);
            }
        }
        if (relaxed) expand_relaxed_exit(g, tmp, n, base, p, c, out, depth);
        else if (c >= e->lo || g->nullable[e->v]) expand(g, tmp, n, base, p + 1, out, depth + 1);
        return;
    }
    case GE_ALT:
    case GE_END: /* the alternative is complete: go on below */
        if (n == 0 || (n == 1 && (tmp[0] & FR_EXIT))) { /* complete (an exit mark stays, see sset_add) */
            sset_add(out, tmp, n);
            return;
        }
        {
            int32_t q = tmp[n - 1];
            /* an iteration pushed by this expansion (count >= 1; a REF's continuation onto a
             * REP element has count 0) ends here empty: dropped (above) */
            if (n - 1 >= base && g->elems[FR_POS(q)].type == GE_REP && FR_COUNT(q) >= 1 && !(q & FR_EXIT)) return;
            expand(g, tmp, n - 1, n - 1 < base ? n - 1 : base, q, out, depth + 1);
            tmp[n - 1] = q;
        }
        return;
    case GE_REF: {
        int32_t cont = p + 1;
        /* A REF that ends its alternative is a tail call: nothing to come back to. */
        int m = g->elems[cont].type <= GE_ALT ? n : n + 1;
        for (int32_t a = g->alt_off[e->v]; a < g->alt_off[e->v + 1]; a++) {
            if (m > n) tmp[n] = cont;
            expand(g, tmp, m, base, g->alt_pos[a], out, depth + 1);
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
        if ((top & FR_EXIT) || !gbyteset_has(&g->sets[g->elems[top].v], b)) continue;
        memcpy(tmp, st, (size_t)(n - 1) * sizeof *tmp);
        expand(g, tmp, n - 1, n - 1, top + 1, out, 0);
    }
}

static bool sset_alive(const sset *s) { return !s->failed && (s->n > 0 || s->has_empty); }

/* ---- vocabulary ---------------------------------------------------------------------------- */

#define TOKEN_MAX_BYTES 128 /* table walks go this far into a token; one alive so far is checked at run time */

static uint64_t state_hash(const sset *s)
{
    return hash_bytes(s->d, s->len * sizeof *s->d) ^ (s->has_empty ? 0x9e3779b97f4a7c15ull : 0) ^
           (s->truncated ? 0xc2b2ae3d27d4eb4full : 0);
}

/* ---- arenas ---------------------------------------------------------------------------------- */

/* Tables, cached masks and memoized transitions are written once and freed all together, and
 * fresh memory is dear here: a first touch costs a page fault per 4 KiB (a 150k-token mask is
 * 5 pages, about as long as computing it).  So they go into chunks mapped with their pages
 * populated in one go, zeroed, freed with the tables, the cache or the interned states. */
#define ARENA_CHUNK_MIN ((size_t)64 << 10) /* the first chunk; each next one twice as big, */
#define ARENA_CHUNK_MAX ((size_t)4 << 20)  /* up to this: a small grammar maps little */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t size;
} arena_chunk;

typedef struct arena {
    arena_chunk *head;
    char *p;
    size_t left, next_size;
} arena;

static void arena_free(arena *a)
{
    for (arena_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        munmap(c, c->size);
    }
    memset(a, 0, sizeof *a);
}

/* n zeroed bytes, 16-aligned; NULL when memory ran out. */
static void *arena_alloc(arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n > a->left) {
        size_t want = a->next_size ? a->next_size : ARENA_CHUNK_MIN, size = n + 64 > want ? n + 64 : want;
        a->next_size = want < ARENA_CHUNK_MAX ? want * 2 : ARENA_CHUNK_MAX;
        int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_POPULATE
        flags |= MAP_POPULATE;
#endif
        arena_chunk *c = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (c == MAP_FAILED) return NULL;
        c->next = a->head;
        c->size = size;
        a->head = c;
        a->p = (char *)c + 64;
        a->left = size - 64;
    }
    void *r = a->p;
    a->p += n;
    a->left -= n;
    return r;
}

static void *arena_dup(arena *a, const void *src, size_t n)
{
    void *r = n ? arena_alloc(a, n) : NULL;
    if (r) memcpy(r, src, n);
    return r;
}

/* ---- interned states ------------------------------------------------------------------------ */

/* The walks meet the same stack sets over and over (inside a string the set after 'a' is the
 * set after 'b'; every token that starts with a letter reaches it), so stack sets are interned
 * as ids and their byte transitions memoized: a walk over the vocabulary is then mostly table
 * lookups instead of stack expansions.  Memory is bounded: the interner starts over between
 * walks once half of DSTATE_BYTES_MAX is used, and a walk that alone would exceed it is redone
 * on stack sets without memoization (exact, only slower). */
#define DSTATE_BYTES_MAX ((size_t)32 << 20)
#define DS_UNKNOWN (-1) /* a transition not computed yet; also what the out-of-budget id is */

/* What a table walk's state says about its relaxed REP frame (see walk_table): the fewest
 * iterations started by a path still inside it, and the range of counts after which paths
 * left it; gap: those counts are not a range. */
#define RSIG_NONE 0xffff
typedef struct rsig {
    uint16_t stay, emin, emax;
    bool gap;
} rsig;

static rsig rsig_of(const int32_t *d, size_t len)
{
    rsig r = {RSIG_NONE, RSIG_NONE, 0, false};
    uint64_t seen[(GRAMMAR_MAX_REPEAT >> 6) + 1] = {0};
    for (size_t o = 0; o < len; o += (size_t)d[o] + 1) {
        int n = d[o];
        const int32_t *st = &d[o + 1];
        if (st[0] & FR_EXIT) {
            uint16_t c = (uint16_t)FR_COUNT(st[0]);
            seen[c >> 6] |= 1ull << (c & 63);
            if (c < r.emin) r.emin = c;
            if (c > r.emax) r.emax = c;
            continue;
        }
        for (int i = n - 1; i >= 0; i--)
            if (st[i] & FR_RELAXED) {
                if (FR_COUNT(st[i]) < r.stay) r.stay = (uint16_t)FR_COUNT(st[i]);
                break;
            }
    }
    for (int c = r.emin; r.emin != RSIG_NONE && c <= r.emax && !r.gap; c++) r.gap = !(seen[c >> 6] >> (c & 63) & 1);
    /* Exits at most one short of a path that stays (a token ending where an iteration ends can
     * stay, starting the next one, or leave): allowed exactly when min(stay, emin) iterations
     * fit.  If that many are left, the stay path or the exit at emin is admitted (the needed
     * count is never above the remaining one); if fewer are left than stay, the remaining count
     * is at most emax and an exit in [max(emin, needed), remaining] exists iff emin fits. */
    if (r.emin != RSIG_NONE && !r.gap && r.stay <= r.emax + 1) {
        if (r.emin < r.stay) r.stay = r.emin;
        r.emin = RSIG_NONE;
        r.emax = 0;
    }
    return r;
}

typedef struct dstate {
    /* what a walk reads at every byte first, in one cache line: the walks are memory-bound */
    gbyteset first; /* the bytes some stack can take: any other kills the state (unless empty) */
    int32_t *next;  /* 256 successor ids (DS_UNKNOWN: not computed), allocated on first use */
    bool alive, has_empty, has_sig;
    bool truncated; /* its stack set was cut at GRAMMAR_MAX_STACKS (a walk cannot decide by it) */
    rsig sig; /* when has_sig */
    uint64_t hash;
    size_t key_off, key_len; /* the stacks as in sset.d, then has_empty, in the pool */
} dstate;

typedef struct dstates {
    dstate *s;
    int n, cap;
    int32_t *pool;
    size_t pool_len, pool_cap;
    uint32_t *index; /* hash -> id + 1, open addressing */
    int index_slots;
    size_t bytes;
    arena rows; /* the next arrays */
    bool overflow; /* an expansion went over EXPAND_STEPS_MAX since the mask began */
    sset scratch;
    int32_t tmp[GRAMMAR_MAX_STACK + 2];
} dstates;

static void ds_reset(dstates *ds)
{
    arena_free(&ds->rows);
    ds->n = 0;
    ds->pool_len = 0;
    ds->bytes = 0;
    if (ds->index) memset(ds->index, 0, (size_t)ds->index_slots * sizeof *ds->index);
}

static void ds_free(dstates *ds)
{
    ds_reset(ds);
    free(ds->s);
    free(ds->pool);
    free(ds->index);
    sset_free(&ds->scratch);
    memset(ds, 0, sizeof *ds);
}

static bool ds_grow_index(dstates *ds)
{
    int slots = ds->index_slots ? ds->index_slots * 2 : 1024;
    uint32_t *ix = calloc((size_t)slots, sizeof *ix);
    if (!ix) return false;
    uint32_t m = (uint32_t)slots - 1;
    for (int i = 0; i < ds->n; i++) {
        uint32_t h = (uint32_t)ds->s[i].hash & m;
        while (ix[h]) h = (h + 1) & m;
        ix[h] = (uint32_t)i + 1;
    }
    free(ds->index);
    ds->index = ix;
    ds->index_slots = slots;
    return true;
}

/* The id of the stack set s, interned if new; -1 when s failed or the budget is spent. */
static int ds_intern(const grammar *g, dstates *ds, const sset *s)
{
    if (s->failed) return -1;
    uint64_t h = state_hash(s);
    size_t klen = s->len + 1;
    if ((ds->n + 1) * 2 > ds->index_slots && !ds_grow_index(ds)) return -1;
    uint32_t m = (uint32_t)ds->index_slots - 1, i = (uint32_t)h & m;
    for (; ds->index[i]; i = (i + 1) & m) {
        const dstate *e = &ds->s[ds->index[i] - 1];
        const int32_t *k = ds->pool + e->key_off;
        if (e->hash == h && e->key_len == klen && k[s->len] == (int32_t)(s->has_empty | s->truncated << 1) &&
            (!s->len || !memcmp(k, s->d, s->len * sizeof *k)))
            return (int)ds->index[i] - 1;
    }
    size_t need = klen * sizeof(int32_t) + sizeof(dstate) + 2 * sizeof(uint32_t);
    if (ds->bytes + need > DSTATE_BYTES_MAX) return -1;
    if (ds->n == ds->cap) {
        int cap = ds->cap ? ds->cap * 2 : 256;
        dstate *n = realloc(ds->s, (size_t)cap * sizeof *n);
        if (!n) return -1;
        ds->s = n;
        ds->cap = cap;
    }
    if (ds->pool_len + klen > ds->pool_cap) {
        size_t cap = ds->pool_cap ? ds->pool_cap * 2 : 4096;
        while (cap < ds->pool_len + klen) cap *= 2;
        int32_t *p = realloc(ds->pool, cap * sizeof *p);
        if (!p) return -1;
        ds->pool = p;
        ds->pool_cap = cap;
    }
    if (s->len) memcpy(ds->pool + ds->pool_len, s->d, s->len * sizeof *s->d); /* the dead set has no d */
    ds->pool[ds->pool_len + s->len] = s->has_empty | s->truncated << 1;
    ds->s[ds->n] = (dstate){.hash = h, .key_off = ds->pool_len, .key_len = klen, .alive = sset_alive(s),
                            .has_empty = s->has_empty, .truncated = s->truncated};
    for (size_t o = 0; o < s->len; o += (size_t)s->d[o] + 1) {
        int32_t top = s->d[o + s->d[o]];
        if (top & FR_EXIT) continue;
        for (int w = 0; w < 8; w++) ds->s[ds->n].first.w[w] |= g->sets[g->elems[top].v].w[w];
    }
    ds->pool_len += klen;
    ds->bytes += need;
    ds->index[i] = (uint32_t)ds->n + 1;
    return ds->n++;
}

/* The id after byte b from state id; -1 when the budget is spent or memory ran out. */
/* Shifts the counts of the relaxed frames and exit marks in s down by their minimum, which it
 * returns: a walk's states are then the same whatever the count it has reached (a string's
 * state after 3 characters is its state after 30), and the walk adds the shifts up itself. */
static int relax_shift(sset *s)
{
    int lo = 0x3ff;
    for (int pass = 0; pass < 2; pass++) { /* the minimum, then the shift */
        for (size_t i = 0; i < s->len; i += (size_t)s->d[i] + 1)
            for (int32_t *f = &s->d[i + 1]; f <= &s->d[i + (size_t)s->d[i]]; f++) {
                if (!(*f & (FR_RELAXED | FR_EXIT))) continue;
                if (pass) *f = FR_WITH_COUNT(*f, FR_COUNT(*f) - lo);
                else if (FR_COUNT(*f) < lo) lo = FR_COUNT(*f);
            }
        if (lo == 0x3ff || lo == 0) return 0;
    }
    return lo;
}

/* A memoized transition: the successor's id, the shift (relax_shift) and whether the successor
 * is alive, so that a walk reads one record per byte. */
#define DS_ID_BITS 22
#define DS_ID(e) ((e) & ((1 << DS_ID_BITS) - 1))
#define DS_SHIFT(e) (((e) >> DS_ID_BITS) & 0xff)
#define DS_ALIVE(e) (((e) >> 30) & 1)
#define DS_TRUNCATED(e) ((uint32_t)(e) >> 31)
#define DS_ENTRY(id, shift, st) \
    ((int32_t)((uint32_t)(id) | (uint32_t)(shift) << DS_ID_BITS | (uint32_t)(st).alive << 30 | (uint32_t)(st).truncated << 31))

/* The id after byte b from state id, and in *shift the counts taken off its relaxed frames;
 * -1 when the budget is spent or memory ran out. */
static int ds_next_new(const grammar *g, dstates *ds, int id, unsigned b, int *shift);

static inline int ds_next(const grammar *g, dstates *ds, int id, unsigned b, int *shift)
{
    const int32_t *next = ds->s[id].next;
    if (next && next[b] != DS_UNKNOWN) { /* memoized: the walks' common case, kept small */
        *shift = DS_SHIFT(next[b]);
        return DS_ID(next[b]);
    }
    return ds_next_new(g, ds, id, b, shift);
}

/* ds_next's transition computed (and memoized). */
__attribute__((noinline)) static int ds_next_new(const grammar *g, dstates *ds, int id, unsigned b, int *shift)
{
    if (!ds->s[id].next) {
        size_t row = 256 * sizeof(int32_t);
        if (ds->bytes + row > DSTATE_BYTES_MAX || !(ds->s[id].next = arena_alloc(&ds->rows, row))) return -1;
        memset(ds->s[id].next, 0xff, row); /* all DS_UNKNOWN */
        ds->bytes += row;
    }
    const dstate *e = &ds->s[id];
    sset view = {.d = ds->pool + e->key_off, .len = e->key_len - 1}; /* advance reads d and len */
    advance(g, &view, b, &ds->scratch, ds->tmp);
    if (ds->scratch.overflow) ds->overflow = true;
    *shift = relax_shift(&ds->scratch); /* in place: scratch is cleared before its next use */
    int n = ds_intern(g, ds, &ds->scratch); /* may move ds->s and the pool */
    if (n >= (1 << DS_ID_BITS) || *shift > 255) return -1;
    if (n >= 0) ds->s[id].next[b] = DS_ENTRY(n, *shift, ds->s[n]);
    return n;
}

/* ---- token tables and the state cache -------------------------------------------------------- */

/* A table belongs to a stack suffix (the top k frames of a stack, or of a group of stacks that
 * differ only in the top: key_stacks), built by walking the sorted vocabulary from the state
 * [suffix]: a token is accepted when some path consumes it without emptying the suffix
 * (whatever lies below), rejected when every path dies inside it, and uncertain otherwise (it
 * may pop below the suffix with bytes left).  One frame is often too small: in a character
 * class almost every token of two characters leaves it, so fill_mask takes more frames of the
 * stack (up to the whole stack, which leaves nothing uncertain) until the uncertain list is
 * short enough to check at run time.  It starts from one frame every time, the keys found too
 * short being kept as stubs (pos_table.partial): the fewest frames make the keys that the most
 * contexts share (a string's table serves the string wherever the grammar uses it).  Tables
 * are shared by every stack with that suffix, across matchers and requests (the grammar cache
 * keeps them). */
#define UNC_MAX 32            /* uncertain tokens a mask may check against the full stack */
#define CUM_MAX 16            /* counted tokens: iteration counts kept as masks (see pos_table) */
#define SUFFIX_MAX 16         /* frames a table key may hold */
#define GROUP_MAX 64          /* stacks one table may serve (key_stacks) */
#define TABLES_BYTES_MAX ((size_t)256 << 20) /* per grammar: beyond it the tables start over */

typedef struct cnt_tok {
    int32_t id;
    uint16_t stay, emin, emax; /* as in rsig */
} cnt_tok;

/* A table whose key holds a relaxed REP frame (the topmost REP frame of the suffix, bounds
 * lifted: see walk_table) serves every iteration count of that frame.  A token whose paths
 * all stay in the iteration the frame is in is accepted outright; one that starts more
 * iterations or leaves the repetition is counted: allowed when the concrete frame's counts
 * admit its paths (stay <= remaining, or an exit count in [needed, remaining]).  Counted tokens
 * with no exits are kept as cumulative masks by stay count up to CUM_MAX (one copy per mask,
 * the bulk of a string's tokens), the rest as a list; tokens whose counted paths also escape
 * the suffix, or whose exit counts are not a range, are checked against the whole stack. */
typedef struct pos_table {
    uint64_t hash;
    int32_t *key; /* the suffixes (key_stacks) */
    int key_n;
    int rel;            /* the key's relaxed frame, -1: none (an index below the tops) */
    uint32_t *acc_bits; /* accepted tokens as a mask when there are many */
    int32_t *acc;       /* else as ids */
    int n_acc;
    int32_t *unc; /* uncertain token ids, in vocabulary order */
    int n_unc;
    int32_t *amb; /* counted tokens checked against the whole stack */
    int n_amb;
    cnt_tok *cnt;
    int n_cnt;
    uint32_t *cum; /* n_cum masks: mask s-1 = the counted tokens with stay <= s and no exits */
    int n_cum;
    /* the walk stopped once more than UNC_MAX tokens were left to check: the key is too short
     * to use, and is kept so that later stacks go straight to a longer one */
    bool partial;
} pos_table;

typedef struct cache_entry {
    uint64_t hash;
    int32_t *key; /* the state: stacks as in sset.d, then has_empty */
    size_t key_len;
    uint32_t *mask; /* the mask, or when sparse the allowed ids (most states allow few tokens:
                     * a list is then smaller, and quicker to store on a miss) */
    int n_allowed;
    bool sparse;
} cache_entry;

#define CACHE_BYTES_MAX ((size_t)64 << 20) /* per grammar: beyond it the cache starts over */

struct grammar_mask_tables {
    const grammar_vocab *v;
    pos_table *tabs;
    int n_tabs, cap_tabs;
    uint32_t *tab_index; /* suffix hash -> table + 1 */
    int tab_slots;
    size_t tab_bytes;
    cache_entry *cache;
    int cache_slots, cache_n;
    size_t cache_bytes;
    arena tab_mem, cache_mem; /* what tabs and cache point to */
    /* a walk's lists, kept between walks (their pages stay mapped) and copied into tab_mem */
    int32_t *w_acc, *w_unc, *w_amb;
    cnt_tok *w_cnt;
    int n_wacc, n_wunc, n_wamb, n_wcnt, cap_wacc, cap_wunc, cap_wamb, cap_wcnt;
    dstates ds;
    /* scratch for the walks: ids when memoizing, stack sets when not */
    bool memo;
    int32_t lev[TOKEN_MAX_BYTES + 1];
    int shift[TOKEN_MAX_BYTES + 1]; /* what relax_shift took off the counts of lev[d] */
    sset level[TOKEN_MAX_BYTES + 1];
    bool esc[TOKEN_MAX_BYTES + 1];
    bool trunc[TOKEN_MAX_BYTES + 1]; /* lev[0..d] holds a truncated state */
    sset one, a, b;
    sset group; /* fill_mask: the whole stacks of the group being masked */
    int32_t tmp[GRAMMAR_MAX_STACK + 2];
    /* fill_mask's time limit (timing_now_ms; 0: none): the walks look at the clock every
     * CLOCK_EVERY tokens, and once it has passed stop with late set (see build_table) */
    double deadline_ms;
    unsigned ticks;
    bool late;
};

#define CLOCK_EVERY 64

/* Whether fill_mask's deadline has passed (then late is set, and stays so for this mask). */
static bool out_of_time(struct grammar_mask_tables *t)
{
    /* a walk on stack sets (!memo) may spend a whole expansion on one byte: the clock each token */
    if (!t->late && t->deadline_ms > 0 && (!t->memo || ++t->ticks % CLOCK_EVERY == 0) &&
        timing_now_ms() > t->deadline_ms)
        t->late = true;
    return t->late;
}

/* The walks stopped for a reason that a walk on stack sets would not fix. */
static bool tables_stopped(const struct grammar_mask_tables *t) { return t->late || t->ds.overflow; }

static void cache_reset(struct grammar_mask_tables *t)
{
    arena_free(&t->cache_mem);
    free(t->cache);
    t->cache = NULL;
    t->cache_slots = t->cache_n = 0;
    t->cache_bytes = 0;
}

static void tabs_reset(struct grammar_mask_tables *t)
{
    arena_free(&t->tab_mem);
    free(t->tabs);
    free(t->tab_index);
    t->tabs = NULL;
    t->tab_index = NULL;
    t->n_tabs = t->cap_tabs = t->tab_slots = 0;
    t->tab_bytes = 0;
}

void grammar_tables_free(struct grammar_mask_tables *t)
{
    if (!t) return;
    cache_reset(t);
    tabs_reset(t);
    ds_free(&t->ds);
    free(t->w_acc);
    free(t->w_unc);
    free(t->w_amb);
    free(t->w_cnt);
    for (int i = 0; i <= TOKEN_MAX_BYTES; i++) sset_free(&t->level[i]);
    sset_free(&t->one);
    sset_free(&t->group);
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
    t->v = v;
    g->tables = t;
    return t;
}

static bool set_bit(uint32_t *mask, int32_t id)
{
    uint32_t bit = 1u << (id & 31);
    bool was = mask[id >> 5] & bit;
    mask[id >> 5] |= bit;
    return !was;
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

/* The walk's levels, on ids (memo) or on stack sets.  A memoized step fails only when the
 * state budget is spent; build_table then redoes the walk without memoization. */
/* A table key: [-m, the k-1 frames below the tops, the m tops], for a group of m stacks that
 * differ only in their top frame (a character class leaves one stack per UTF-8 form, all over
 * the same frames): one table and one check for the group instead of one per stack.  Puts
 * the key's stacks into out. */
static void key_stacks(const int32_t *key, int key_n, sset *out)
{
    int m = -key[0], below = key_n - 1 - m;
    int32_t st[SUFFIX_MAX];
    memcpy(st, key + 1, (size_t)below * sizeof *st);
    for (int i = 0; i < m; i++) {
        st[below] = key[1 + below + i];
        sset_add(out, st, below + 1);
    }
}

static bool lv_start(const grammar *g, struct grammar_mask_tables *t, const int32_t *key, int key_n)
{
    sset *l0 = t->memo ? &t->one : &t->level[0];
    sset_clear(l0);
    key_stacks(key, key_n, l0);
    if (!t->memo) return !l0->failed;
    t->shift[0] = 0; /* a key's relaxed frame starts at 0 */
    t->lev[0] = ds_intern(g, &t->ds, l0);
    return t->lev[0] >= 0;
}

static bool lv_step(const grammar *g, struct grammar_mask_tables *t, int d, unsigned b)
{
    if (t->memo) {
        int shift;
        t->lev[d + 1] = ds_next(g, &t->ds, t->lev[d], b, &shift);
        t->shift[d + 1] = t->shift[d] + shift;
        return t->lev[d + 1] >= 0;
    }
    advance(g, &t->level[d], b, &t->level[d + 1], t->tmp);
    if (t->level[d + 1].overflow) t->ds.overflow = true;
    return !t->level[d + 1].failed;
}

static bool lv_alive(const struct grammar_mask_tables *t, int d)
{
    return t->memo ? t->ds.s[t->lev[d]].alive : sset_alive(&t->level[d]);
}

static bool lv_empty(const struct grammar_mask_tables *t, int d)
{
    return t->memo ? t->ds.s[t->lev[d]].has_empty : t->level[d].has_empty;
}

static rsig lv_sig(struct grammar_mask_tables *t, int d)
{
    if (!t->memo) return rsig_of(t->level[d].d, t->level[d].len);
    dstate *e = &t->ds.s[t->lev[d]];
    if (!e->has_sig) {
        e->sig = rsig_of(t->ds.pool + e->key_off, e->key_len - 1);
        e->has_sig = true;
    }
    rsig r = e->sig;
    uint16_t sh = (uint16_t)t->shift[d];
    if (r.stay != RSIG_NONE) r.stay += sh;
    if (r.emin != RSIG_NONE) r.emin += sh, r.emax += sh;
    return r;
}

/* Copies the walk's lists into pt, in tab_mem: accepted tokens as a mask when there are many
 * (it is then the smaller, and ORs in a few microseconds), counted tokens with no exits as
 * cumulative masks by stay count when there are enough of them for masks to be the smaller
 * and faster form (those above CUM_MAX stay listed).  false when memory ran out. */
static bool table_commit(struct grammar_mask_tables *t, pos_table *pt)
{
    const grammar_vocab *v = t->v;
    size_t W = (size_t)v->n_words;
    arena *a = &t->tab_mem;
    pt->n_acc = t->n_wacc;
    if (t->n_wacc > v->n_words) {
        if (!(pt->acc_bits = arena_alloc(a, W * sizeof *pt->acc_bits))) return false;
        for (int i = 0; i < t->n_wacc; i++) set_bit(pt->acc_bits, t->w_acc[i]);
    } else if (t->n_wacc && !(pt->acc = arena_dup(a, t->w_acc, (size_t)t->n_wacc * sizeof *pt->acc))) {
        return false;
    }
    if ((pt->n_unc = t->n_wunc) && !(pt->unc = arena_dup(a, t->w_unc, (size_t)t->n_wunc * sizeof *pt->unc)))
        return false;
    if ((pt->n_amb = t->n_wamb) && !(pt->amb = arena_dup(a, t->w_amb, (size_t)t->n_wamb * sizeof *pt->amb)))
        return false;
    int n_plain = 0, top = 0;
    for (int i = 0; i < t->n_wcnt; i++)
        if (t->w_cnt[i].emin == RSIG_NONE) {
            n_plain++;
            if (t->w_cnt[i].stay > top) top = t->w_cnt[i].stay;
        }
    int m = t->n_wcnt;
    if (n_plain > v->n_words) {
        pt->n_cum = top < CUM_MAX ? top : CUM_MAX;
        if (!(pt->cum = arena_alloc(a, (size_t)pt->n_cum * W * sizeof *pt->cum))) return false;
        m = 0;
        for (int i = 0; i < t->n_wcnt; i++) {
            const cnt_tok *x = &t->w_cnt[i];
            if (x->emin == RSIG_NONE && x->stay <= pt->n_cum) set_bit(pt->cum + (size_t)(x->stay - 1) * W, x->id);
            else t->w_cnt[m++] = *x;
        }
        for (int s = 1; s < pt->n_cum; s++)
            for (size_t i = 0; i < W; i++) pt->cum[s * W + i] |= pt->cum[(s - 1) * W + i];
    }
    if ((pt->n_cnt = m) && !(pt->cnt = arena_dup(a, t->w_cnt, (size_t)m * sizeof *pt->cnt))) return false;
    return true;
}

/* Empties pt (its lists stay in tab_mem until the tables start over). */
static void pos_table_clear(pos_table *pt)
{
    pt->acc_bits = pt->cum = NULL;
    pt->acc = pt->unc = pt->amb = NULL;
    pt->cnt = NULL;
    pt->n_acc = pt->n_unc = pt->n_amb = pt->n_cnt = pt->n_cum = 0;
}

/* Files a token that a walk found alive or escaped at its end (or, cut: alive at the most
 * bytes a walk goes) into the walk's lists; false when memory ran out. */
static bool classify_token(struct grammar_mask_tables *t, const pos_table *pt, int32_t id, bool cut, int len)
{
    if (cut) return list_push(&t->w_unc, &t->n_wunc, &t->cap_wunc, id);
    if (!lv_alive(t, len)) return !t->esc[len] || list_push(&t->w_unc, &t->n_wunc, &t->cap_wunc, id);
    rsig r = pt->rel >= 0 ? lv_sig(t, len) : (rsig){.stay = 0};
    if (r.stay == 0) return list_push(&t->w_acc, &t->n_wacc, &t->cap_wacc, id);
    if (t->esc[len] || r.gap) return list_push(&t->w_amb, &t->n_wamb, &t->cap_wamb, id);
    if (t->n_wcnt == t->cap_wcnt) {
        int c = t->cap_wcnt ? t->cap_wcnt * 2 : 64;
        cnt_tok *l = realloc(t->w_cnt, (size_t)c * sizeof *l);
        if (!l) return false;
        t->w_cnt = l;
        t->cap_wcnt = c;
    }
    t->w_cnt[t->n_wcnt++] = (cnt_tok){id, r.stay, r.emin, r.emax};
    return true;
}

/* Walks the sorted tokens [from, to), which share their first `valid` bytes (levels
 * 0..valid computed), into the walk's lists.  -1: out of memory or state budget; 1: the table
 * is left partial (may_stop); 0: done. */
static int walk_range(const grammar *g, struct grammar_mask_tables *t, pos_table *pt, int from, int to, int valid,
                      bool may_stop)
{
    const grammar_vocab *v = t->v;
    for (int k = from; k < to;) {
        if (out_of_time(t)) return -1;
        const struct grammar_vtok *tk = &v->tok[k];
        const unsigned char *b = v->sbytes + tk->off;
        int len = tk->len > TOKEN_MAX_BYTES ? TOKEN_MAX_BYTES : tk->len; /* the rest: at run time */
        int d = tk->lcp < valid ? tk->lcp : valid;
        bool dead = false;
        bool cut = t->trunc[d];
        for (; d < len && !cut; d++) {
            if (t->memo) { /* lv_step, reading the state and its transition once */
                const dstate *cs = &t->ds.s[t->lev[d]];
                bool cur_empty = cs->has_empty;
                int32_t e = cs->next ? cs->next[b[d]] : DS_UNKNOWN;
                if (e == DS_UNKNOWN) {
                    if (!t->esc[d] && !cur_empty && !gbyteset_has(&cs->first, b[d])) { /* dead, not computed */
                        dead = true;
                        break;
                    }
                    int shift, id = ds_next_new(g, &t->ds, t->lev[d], b[d], &shift);
                    if (id < 0) return -1;
                    e = DS_ENTRY(id, shift, t->ds.s[id]);
                }
                t->lev[d + 1] = DS_ID(e);
                t->shift[d + 1] = t->shift[d] + DS_SHIFT(e);
                t->esc[d + 1] = t->esc[d] || cur_empty;
                if ((t->trunc[d + 1] = DS_TRUNCATED(e))) break;
                if (!DS_ALIVE(e) && !t->esc[d + 1]) {
                    dead = true;
                    break;
                }
                continue;
            }
            if (!lv_step(g, t, d, b[d])) return -1;
            t->esc[d + 1] = t->esc[d] || lv_empty(t, d);
            if ((t->trunc[d + 1] = t->level[d + 1].truncated)) break;
            if (!lv_alive(t, d + 1) && !t->esc[d + 1]) {
                dead = true;
                break;
            }
        }
        if (dead) {
            /* every later token with this prefix (bytes 0..d) is rejected too */
            valid = d;
            k++;
            while (k < to && v->tok[k].lcp > d) k = v->tok[k].skip;
            continue;
        }
        if (cut || d < len) { /* a state on the way lost stacks (trunc): decided at run time */
            valid = cut ? d : d + 1;
            if (!list_push(&t->w_amb, &t->n_wamb, &t->cap_wamb, tk->id)) return -1;
            if (may_stop && t->n_wunc + t->n_wamb > UNC_MAX) return 1;
            k++;
            continue;
        }
        valid = len;
        if (!classify_token(t, pt, tk->id, len < tk->len, len)) return -1;
        if (may_stop && t->n_wunc + t->n_wamb > UNC_MAX) return 1;
        k++;
    }
    return 0;
}

/* Whether a walk at level d may pass over the tokens whose next byte the state cannot take. */
static bool lv_filters(const struct grammar_mask_tables *t, int d)
{
    return t->memo && !t->esc[d] && !t->ds.s[t->lev[d]].has_empty;
}

/* Walks the sorted vocabulary from the state [key] into pt (see above).  With a relaxed frame
 * in the key, the states carry its counts, and a token alive at its end is accepted when a path
 * did not leave the iteration it started in, counted otherwise.  The first two bytes go by the
 * vocabulary's ranges: a byte the state cannot take passes over all the tokens under it (after
 * whitespace, say, only the few bytes that may follow it are walked). */
static bool walk_table(const grammar *g, struct grammar_mask_tables *t, pos_table *pt, const int32_t *key, int key_n,
                       bool may_stop)
{
    const grammar_vocab *v = t->v;
    t->n_wacc = t->n_wunc = t->n_wamb = t->n_wcnt = 0;
    if (!lv_start(g, t, key, key_n)) return false;
    t->esc[0] = false;
    t->trunc[0] = t->memo ? t->ds.s[t->lev[0]].truncated : t->level[0].truncated;
    bool by_first = lv_filters(t, 0);
    for (int b0 = 0; b0 < 256; b0++) {
        int lo = v->byte_start[b0], hi = v->byte_start[b0 + 1], r = 0;
        if (lo == hi || (by_first && !gbyteset_has(&t->ds.s[t->lev[0]].first, (unsigned)b0))) continue;
        if (!by_first) {
            r = walk_range(g, t, pt, lo, hi, 0, may_stop);
        } else {
            if (!lv_step(g, t, 0, (unsigned)b0)) return false;
            t->esc[1] = lv_empty(t, 0);
            t->trunc[1] = t->trunc[0] || (t->memo ? t->ds.s[t->lev[1]].truncated : t->level[1].truncated);
            if (!lv_alive(t, 1) && !t->esc[1]) continue;
            if (!lv_filters(t, 1)) {
                r = walk_range(g, t, pt, lo, hi, 1, may_stop);
            } else {
                const int32_t *ps = v->pair_start + b0 * 257; /* [b0] alone, then by second byte */
                r = walk_range(g, t, pt, ps[0], ps[1], 1, may_stop);
                for (int b1 = 0; b1 < 256 && !r; b1++)
                    if (ps[b1 + 1] < ps[b1 + 2] && gbyteset_has(&t->ds.s[t->lev[1]].first, (unsigned)b1))
                        r = walk_range(g, t, pt, ps[b1 + 1], ps[b1 + 2], 1, may_stop);
            }
        }
        if (r < 0) return false;
        if (r > 0) {
            pos_table_clear(pt);
            pt->partial = true;
            return true;
        }
    }
    return table_commit(t, pt);
}

static bool build_table(const grammar *g, struct grammar_mask_tables *t, pos_table *pt, const int32_t *st, int n,
                        bool may_stop)
{
    if (t->ds.bytes > DSTATE_BYTES_MAX / 2) ds_reset(&t->ds);
    t->memo = true;
    pt->partial = false;
    bool ok = walk_table(g, t, pt, st, n, may_stop);
    if (!ok && !tables_stopped(t)) { /* the state budget (or memory) ran out: once more on stack sets */
        pos_table_clear(pt);
        ds_reset(&t->ds);
        t->memo = false;
        ok = walk_table(g, t, pt, st, n, may_stop);
    }
    if (!ok) { /* to be built again when next needed (the transitions memoized so far stay) */
        pos_table_clear(pt);
        pt->partial = true;
    }
    return ok;
}

static size_t table_bytes(const grammar_vocab *v, const pos_table *pt)
{
    return (size_t)pt->key_n * 4 + (size_t)(pt->n_unc + pt->n_amb) * 4 + (size_t)pt->n_cnt * sizeof *pt->cnt +
           (pt->acc_bits ? (size_t)v->n_words : (size_t)pt->n_acc) * 4 + (size_t)pt->n_cum * (size_t)v->n_words * 4 +
           sizeof *pt;
}

/* The table of the key st[0..n), built on first use (may_stop: it may be left partial); NULL
 * when memory ran out. */
static pos_table *table_get(const grammar *g, struct grammar_mask_tables *t, const int32_t *st, int n, bool may_stop)
{
    uint64_t h = hash_bytes(st, (size_t)n * sizeof *st);
    if ((t->n_tabs + 1) * 2 > t->tab_slots) {
        int slots = t->tab_slots ? t->tab_slots * 2 : 256;
        uint32_t *ix = calloc((size_t)slots, sizeof *ix);
        if (!ix) return NULL;
        for (int i = 0; i < t->n_tabs; i++) {
            uint32_t j = (uint32_t)t->tabs[i].hash & (uint32_t)(slots - 1);
            while (ix[j]) j = (j + 1) & (uint32_t)(slots - 1);
            ix[j] = (uint32_t)i + 1;
        }
        free(t->tab_index);
        t->tab_index = ix;
        t->tab_slots = slots;
    }
    uint32_t m = (uint32_t)t->tab_slots - 1, j = (uint32_t)h & m;
    for (; t->tab_index[j]; j = (j + 1) & m) {
        pos_table *pt = &t->tabs[t->tab_index[j] - 1];
        if (pt->hash == h && pt->key_n == n && !memcmp(pt->key, st, (size_t)n * sizeof *st)) {
            if (pt->partial && !may_stop) { /* needed whole now: once more, to the end */
                if (!build_table(g, t, pt, st, n, false)) return NULL;
                t->tab_bytes += table_bytes(t->v, pt);
            }
            return pt;
        }
    }
    if (t->n_tabs == t->cap_tabs) {
        int cap = t->cap_tabs ? t->cap_tabs * 2 : 64;
        pos_table *nt = realloc(t->tabs, (size_t)cap * sizeof *nt);
        if (!nt) return NULL;
        t->tabs = nt;
        t->cap_tabs = cap;
    }
    pos_table *pt = &t->tabs[t->n_tabs];
    memset(pt, 0, sizeof *pt);
    if (!(pt->key = arena_dup(&t->tab_mem, st, (size_t)n * sizeof *st))) return NULL;
    pt->key_n = n;
    pt->hash = h;
    pt->rel = -1; /* as an index into the frames below the tops (key_stacks) */
    for (int i = 1; i < n + st[0]; i++)
        if (st[i] & FR_RELAXED) pt->rel = i - 1;
    if (!build_table(g, t, pt, st, n, may_stop)) return NULL;
    t->tab_bytes += table_bytes(t->v, pt);
    t->tab_index[j] = (uint32_t)t->n_tabs + 1;
    t->n_tabs++;
    return pt;
}

/* Whether the token's bytes can be consumed from the state s0, on stack sets. */
static bool check_token(const grammar *g, struct grammar_mask_tables *t, const sset *s0, const unsigned char *b,
                        int len)
{
    sset *cur = &t->a, *next = &t->b;
    if (!sset_copy(cur, s0)) return false;
    for (int i = 0; i < len; i++) {
        advance(g, cur, b[i], next, t->tmp);
        if (next->overflow) t->ds.overflow = true;
        if (!sset_alive(next)) return false;
        sset *x = cur;
        cur = next;
        next = x;
    }
    return true;
}

/* Adds to mask the tokens of ids[0..n_ids) that the whole stacks of t->group allow; full: the
 * table is the whole stacks', so of its uncertain tokens only those too long to walk can
 * still be allowed. */
static void check_tokens(const grammar *g, struct grammar_mask_tables *t, const int32_t *ids, int n_ids, bool full,
                         uint32_t *mask)
{
    const grammar_vocab *v = t->v;
    int s0 = -1;
    if (t->ds.bytes > DSTATE_BYTES_MAX / 2) ds_reset(&t->ds);
    for (int i = 0; i < n_ids && !out_of_time(t) && !t->ds.overflow; i++) {
        int32_t id = ids[i];
        int len = v->len[id];
        if ((mask[id >> 5] >> (id & 31) & 1u) || (full && len <= TOKEN_MAX_BYTES)) continue;
        const unsigned char *b = v->bytes + v->off[id];
        if (s0 == -1) { /* -2: could not intern, check on stack sets */
            s0 = ds_intern(g, &t->ds, &t->group);
            if (s0 < 0) s0 = -2;
        }
        int s = s0 >= 0 ? s0 : -1, k = 0;
        bool dead = false;
        for (int shift; s >= 0 && k < len && !dead; k++) {
            const dstate *e = &t->ds.s[s];
            dead = !e->alive || (!e->has_empty && !gbyteset_has(&e->first, b[k]));
            if (!dead) s = ds_next(g, &t->ds, s, b[k], &shift);
        }
        bool ok = dead ? false : s >= 0 ? t->ds.s[s].alive : check_token(g, t, &t->group, b, len); /* budget spent */
        if (ok) set_bit(mask, id);
    }
}

/* Adds to mask the counted tokens of pt that the concrete REP frame f admits. */
static void add_counted(const grammar *g, const grammar_vocab *v, const pos_table *pt, int32_t f, uint32_t *mask)
{
    const gelem *e = &g->elems[FR_POS(f)];
    int c = FR_COUNT(f), left = e->hi - c, need = e->lo - c;
    if (pt->n_cum && left >= 1) {
        const uint32_t *l = pt->cum + (size_t)((left < pt->n_cum ? left : pt->n_cum) - 1) * (size_t)v->n_words;
        for (int i = 0; i < v->n_words; i++) mask[i] |= l[i];
    }
    for (int i = 0; i < pt->n_cnt; i++) {
        const cnt_tok *x = &pt->cnt[i];
        int lo = x->emin > need ? x->emin : need, hi = x->emax < left ? x->emax : left;
        if (x->stay <= left || (x->emin != RSIG_NONE && lo <= hi)) set_bit(mask, x->id);
    }
}

/* The table key (key_stacks) for the top k frames of the m stacks of a group, which share
 * their k-1 frames below the tops st[0..k-1) and have the tops tops[0..m): the topmost REP frame
 * whose element cannot be empty (so that the walks' counts stay bounded by token lengths) is
 * relaxed.  Returns the key's length. */
static int table_key(const grammar *g, const int32_t *st, int k, const int32_t *tops, int m, int32_t *key)
{
    key[0] = -m;
    memcpy(key + 1, st, (size_t)(k - 1) * sizeof *key);
    memcpy(key + k, tops, (size_t)m * sizeof *key);
    for (int i = k - 2; i >= 0; i--) {
        const gelem *e = &g->elems[FR_POS(st[i])];
        if (e->type == GE_REP && !g->nullable[e->v]) {
            key[1 + i] = FR_POS(st[i]) | FR_RELAXED;
            break;
        }
    }
    return k + m;
}

/* ---- the matcher ---------------------------------------------------------------------------- */

struct grammar_matcher {
    grammar *g;
    const grammar_vocab *v;
    sset state;
    sset scratch, scratch2;
    bool ended;    /* an end-of-generation token was accepted */
    bool overflow; /* an expansion went over EXPAND_STEPS_MAX (grammar_matcher_too_complex) */
    int32_t tmp[GRAMMAR_MAX_STACK + 2];
};

/* The stacks at the start of g into out. */
static void expand_start(const grammar *g, int32_t *tmp, sset *out)
{
    const int32_t r = g->root;
    for (int32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) expand(g, tmp, 0, 0, g->alt_pos[a], out, 0);
}

bool grammar_check_start(const grammar *g, char *err, size_t errlen)
{
    sset s = {0};
    int32_t tmp[GRAMMAR_MAX_STACK + 2];
    expand_start(g, tmp, &s);
    bool ok = !s.failed;
    if (s.overflow)
        snprintf(err, errlen, "grammar: too ambiguous: finding where it can start takes more than %d steps",
                 EXPAND_STEPS_MAX);
    else if (!ok)
        snprintf(err, errlen, "grammar: out of memory");
    sset_free(&s);
    return ok;
}

grammar_matcher *grammar_matcher_new(grammar *g, const grammar_vocab *v)
{
    grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = grammar_ref(g);
    m->v = v;
    expand_start(g, m->tmp, &m->state);
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

bool grammar_matcher_too_complex(const grammar_matcher *m) { return m->overflow; }

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
        if (out->overflow) m->overflow = true;
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
    c->overflow = m->overflow;
    if (!sset_copy(&c->state, &m->state)) {
        grammar_matcher_free(c);
        return NULL;
    }
    return c;
}

static cache_entry *cache_find(struct grammar_mask_tables *t, const sset *s, uint64_t h)
{
    if (!t->cache_slots) return NULL;
    uint32_t mask = (uint32_t)t->cache_slots - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        cache_entry *e = &t->cache[i];
        if (!e->key && !e->mask) return e;
        if (e->hash == h && e->key_len == s->len + 1 && e->key[s->len] == (int32_t)s->has_empty &&
            (!s->len || !memcmp(e->key, s->d, s->len * sizeof *s->d))) /* a complete-only state has no d */
            return e;
    }
}

static void cache_store(struct grammar_mask_tables *t, const sset *s, uint64_t h, const uint32_t *mask, int n_words,
                        int n_allowed)
{
    bool sparse = n_allowed < n_words;
    size_t bytes = (s->len + 1) * sizeof(int32_t) + (size_t)(sparse ? n_allowed : n_words) * sizeof(uint32_t);
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
    int32_t *key = arena_alloc(&t->cache_mem, (s->len + 1) * sizeof *key);
    uint32_t *mk = arena_alloc(&t->cache_mem, (size_t)(sparse ? (n_allowed ? n_allowed : 1) : n_words) * sizeof *mk);
    if (!key || !mk) return;
    if (s->len) memcpy(key, s->d, s->len * sizeof *key);
    key[s->len] = s->has_empty;
    if (sparse) {
        int k = 0;
        for (int i = 0; i < n_words; i++)
            for (uint32_t w = mask[i]; w; w &= w - 1) mk[k++] = (uint32_t)i * 32 + (uint32_t)__builtin_ctz(w);
    } else {
        memcpy(mk, mask, (size_t)n_words * sizeof *mk);
    }
    *e = (cache_entry){h, key, s->len + 1, mk, n_allowed, sparse};
    t->cache_n++;
    t->cache_bytes += bytes;
}

/* Set bits of a mask, counted on every state-cache miss (a 150k-token mask is 4.7k words).
 * __builtin_popcount without -mpopcnt is a libgcc call per word: the instruction is used where
 * the CPU has it, bit arithmetic elsewhere. */
static int popcount_sw(const uint32_t *mask, int n_words)
{
    int n = 0;
    for (int i = 0; i < n_words; i++) {
        uint32_t x = mask[i];
        x = x - ((x >> 1) & 0x55555555u);
        x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
        n += (int)((((x + (x >> 4)) & 0x0f0f0f0fu) * 0x01010101u) >> 24);
    }
    return n;
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
__attribute__((target("popcnt"))) static int popcount_hw(const uint32_t *mask, int n_words)
{
    int n = 0, i = 0;
    for (; i + 2 <= n_words; i += 2) {
        uint64_t x;
        memcpy(&x, mask + i, sizeof x);
        n += __builtin_popcountll(x);
    }
    return n + (i < n_words ? __builtin_popcount(mask[i]) : 0);
}

static int mask_popcount(const uint32_t *mask, int n_words)
{
    return __builtin_cpu_supports("popcnt") ? popcount_hw(mask, n_words) : popcount_sw(mask, n_words);
}
#else
static int mask_popcount(const uint32_t *mask, int n_words) { return popcount_sw(mask, n_words); }
#endif

/* What fill_mask returns when its tables stopped short (out of time, over the expansion
 * budget, or out of memory: no token then). */
static int mask_stopped(grammar_matcher *m, const struct grammar_mask_tables *t)
{
    if (t->ds.overflow) {
        m->overflow = true;
        return GRAMMAR_MASK_TOO_COMPLEX;
    }
    return t->late ? GRAMMAR_MASK_LATER : 0;
}

int grammar_matcher_fill_mask(grammar_matcher *m, uint32_t *mask)
{
    int n = grammar_matcher_fill_mask_until(m, mask, 0);
    return n > 0 ? n : 0;
}

int grammar_matcher_fill_mask_until(grammar_matcher *m, uint32_t *mask, double deadline_ms)
{
    const grammar_vocab *v = m->v;
    memset(mask, 0, (size_t)v->n_words * sizeof *mask);
    if (m->ended) return 0;
    if (m->overflow) return GRAMMAR_MASK_TOO_COMPLEX;
    struct grammar_mask_tables *t = tables_for(m->g, v);
    if (!t) return 0;
    t->deadline_ms = deadline_ms;
    t->late = t->ds.overflow = false;
    uint64_t h = state_hash(&m->state);
    cache_entry *ce = cache_find(t, &m->state, h);
    if (ce && ce->mask) {
        if (!ce->sparse) memcpy(mask, ce->mask, (size_t)v->n_words * sizeof *mask);
        else
            for (int i = 0; i < ce->n_allowed; i++) set_bit(mask, (int32_t)ce->mask[i]);
        return ce->n_allowed;
    }
    if (t->tab_bytes > TABLES_BYTES_MAX) tabs_reset(t);
    int n = 0;
    const sset *s = &m->state;
    for (size_t o = 0, next; o < s->len; o = next) {
        int sn = s->d[o];
        const int32_t *st = &s->d[o + 1];
        /* the group: the stacks after this one that differ from it only in their top */
        int32_t tops[GROUP_MAX];
        int n_tops = 0;
        sset_clear(&t->group);
        for (next = o; next < s->len && n_tops < GROUP_MAX && s->d[next] == sn &&
                       !memcmp(&s->d[next + 1], st, (size_t)(sn - 1) * sizeof *st);
             next += (size_t)sn + 1) {
            tops[n_tops++] = s->d[next + sn];
            sset_add(&t->group, &s->d[next + 1], sn);
        }
        /* the fewest top frames whose table leaves few tokens to check (see above) */
        pos_table *pt;
        int k = 1;
        int32_t key[1 + SUFFIX_MAX + GROUP_MAX];
        for (;; k++) {
            int key_n = table_key(m->g, st + sn - k, k, tops, n_tops, key);
            if (!(pt = table_get(m->g, t, key, key_n, k < sn && k < SUFFIX_MAX))) return mask_stopped(m, t);
            if (!pt->partial) break;
        }
        if (pt->acc_bits) {
            for (int i = 0; i < v->n_words; i++) mask[i] |= pt->acc_bits[i];
        } else {
            for (int i = 0; i < pt->n_acc; i++) set_bit(mask, pt->acc[i]);
        }
        if (pt->rel >= 0) add_counted(m->g, v, pt, st[sn - k + pt->rel], mask);
        check_tokens(m->g, t, pt->unc, pt->n_unc, k == sn, mask);
        check_tokens(m->g, t, pt->amb, pt->n_amb, false, mask);
        if (tables_stopped(t)) return mask_stopped(m, t);
    }
    n = mask_popcount(mask, v->n_words);
    if (s->has_empty)
        for (int i = 0; i < v->n_eog; i++) n += set_bit(mask, v->eog[i]);
    cache_store(t, s, h, mask, v->n_words, n);
    return n;
}
