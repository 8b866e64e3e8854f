/* grammar_impl.h - the compiled grammar as the matcher sees it.  Internal to src/grammar.
 *
 * A grammar is a list of rules; each rule is a run of elements in one array:
 *   alt0 elements, ALT, alt1 elements, ALT, ..., END
 * An element is BYTES (a terminal: one byte out of a 256-bit set), REF (another rule) or REP
 * (another rule repeated lo..hi times: a bounded repetition is one element, and the matcher
 * keeps the iteration count in the stack frame, so all the copies share one position).
 * Character classes and literals are compiled to UTF-8 byte sequences, so the matcher works
 * on bytes only and a token's bytes are matched exactly, whatever characters they split.
 * A position is an index into the element array; a pushdown stack is a list of positions. */
#ifndef INFERD_GRAMMAR_IMPL_H
#define INFERD_GRAMMAR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "grammar.h"

enum { GE_END = 0, GE_ALT = 1, GE_REF = 2, GE_BYTES = 3, GE_REP = 4 };

typedef struct gelem {
    uint8_t type;
    uint16_t lo, hi; /* REP: iterations, hi <= GRAMMAR_MAX_REPEAT */
    int32_t v;       /* REF, REP: rule id; BYTES: byte-set index */
} gelem;

typedef struct gbyteset {
    uint32_t w[8];
} gbyteset;

static inline bool gbyteset_has(const gbyteset *s, unsigned b) { return (s->w[b >> 5] >> (b & 31)) & 1u; }

struct grammar_mask_tables; /* matcher.c: per-position token tables, the state cache */

struct grammar {
    atomic_int refs;
    gelem *elems;
    int n_elems;
    gbyteset *sets;
    int n_sets;
    int n_rules;
    int32_t *alt_off;   /* rule r's alternative starts: alt_pos[alt_off[r] .. alt_off[r+1]) */
    int32_t *alt_pos;
    int root;
    uint8_t *nullable; /* per rule: derives the empty string */
    struct grammar_mask_tables *tables; /* lazily built against one vocabulary */
};

/* Limits that keep hostile grammars bounded (a refusal names the limit). */
#define GRAMMAR_MAX_ELEMS 200000
#define GRAMMAR_MAX_RULES 20000
#define GRAMMAR_MAX_REPEAT 1000 /* x{m,n}: n at most this */
#define GRAMMAR_MAX_STACK 256   /* deeper stacks are dropped: the matcher never accepts through them */
#define GRAMMAR_MAX_STACKS 512  /* distinct stacks one state may hold */

void grammar_tables_free(struct grammar_mask_tables *t);

/* false with err set when the start of g cannot be expanded within the matcher's budget (or
 * memory ran out): a compiled grammar no matcher could start is refused as the client's error. */
bool grammar_check_start(const grammar *g, char *err, size_t errlen);

/* Every normal token's bytes, sorted (vocab.c builds it from the tokenizer). */
struct grammar_vocab {
    int n_vocab, n_words;
    int n_sorted;
    int32_t *ids;   /* normal tokens in byte order */
    uint32_t *off;  /* by id: the token's bytes in `bytes` */
    uint16_t *len;
    unsigned char *bytes;
    /* the sorted tokens as the walks read them, in order (one record and the bytes next to
     * the previous token's, rather than four arrays read at random by id) */
    struct grammar_vtok {
        int32_t id;
        int32_t skip;  /* the next sorted index whose lcp is smaller: a walk that finds a prefix
                        * dead jumps over the tokens that share it in few steps */
        uint32_t off;  /* in sbytes */
        uint16_t len, lcp; /* lcp: common prefix with the previous sorted token */
    } *tok;
    unsigned char *sbytes;
    int32_t byte_start[257]; /* the sorted tokens that start with byte b: [byte_start[b], [b + 1]) */
    int32_t *pair_start;     /* by first two bytes: [b0] alone is [ps[0], ps[1]), then b0 b1 is
                              * [ps[b1 + 1], ps[b1 + 2]), where ps = pair_start + b0 * 257 */
    int32_t *rank;  /* id -> index in the sorted order, -1 for control/empty tokens */
    int32_t *eog;
    int n_eog;
};

/* A vocabulary from raw bytes (tests; grammar_vocab_new reads a tokenizer): token i is
 * tokens[i] of lens[i] bytes, lens[i] == 0 for a control token; eog[0..n_eog) end generation. */
grammar_vocab *grammar_vocab_from_bytes(const char *const *tokens, const int *lens, int n, const int32_t *eog,
                                        int n_eog);


#endif
