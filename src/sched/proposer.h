/* proposer.h - the drafters of speculative decoding behind one seam.  The scheduler asks a
 * proposer for the drafts of every speculating row of a step at once (so a drafter that runs a
 * model batches them into one draft step per round), verifies them in the target's step, and
 * tells the proposer how much of each row's sequence stands afterwards (so a drafter that keeps
 * state per row, a draft model's K/V, rolls it back).  What is accepted, and how, is the
 * scheduler's (engine_verify_accept); a proposer only proposes.
 *
 * Implementations: ngram (ngram.h: prompt lookup over the row's own tokens, no state), draft
 * (draftmodel.c: a second, smaller engine of the same vocabulary, its own K/V per row) and mtp
 * (mtp.c: the target model's own MTP block, engine_mtp_step, fed the target's hidden states
 * through proposer_observe).
 *
 * A row's sequence is the tokens the scheduler passes in proposer_row.toks: its prompt and
 * what was generated, the last one the pending token (sampled, fed by the coming verification).
 * A proposer may keep state about a row's sequence between calls; the scheduler keeps it true
 * with proposer_reset (a new sequence in the row) and proposer_keep (the first n tokens stand,
 * forget what came after them).  Threading: the scheduler thread only. */
#ifndef INFERD_SCHED_PROPOSER_H
#define INFERD_SCHED_PROPOSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct proposer proposer;

/* One row's drafting in a round of proposer_draft. */
typedef struct proposer_row {
    int slot;                  /* the row (0 .. n_slots-1) */
    const int32_t *toks;       /* its sequence; toks[n_toks-1] is the pending token */
    int n_toks;
    int k_max;                 /* most tokens to draft (>= 1) */
    const sampling_params *sp; /* the request's sampling (penalties, bias: what shapes its argmax) */
    const uint32_t *allowed;   /* the grammar's mask of the first draft, or NULL */
    int32_t *draft;            /* out: room for k_max tokens */
    int n_draft;               /* out: how many (0: nothing worth verifying) */
    /* The row's block table in the target's pool, covering positions up to n_toks - 1 + k_max
     * (a drafter that writes the target engine's K/V: mtp; NULL for the others). */
    const int32_t *blocks;
} proposer_row;

/* What a target step computed for one row (proposer_observe): its tokens at positions
 * pos..pos+n_tokens-1, their final hidden states (engine_seq.hidden) and the row's block table. */
typedef struct proposer_obs {
    int slot;
    int pos;
    const int32_t *tokens;
    int n_tokens;
    const float *hidden;   /* n_tokens x n_embd */
    const int32_t *blocks;
} proposer_obs;

typedef struct proposer_vtable {
    const char *name;
    /* Fills rows[i].draft / n_draft for every row.  Never fails as a whole: a drafter that
     * cannot draft a row leaves it at 0 (the row decodes plainly). */
    void (*draft)(proposer *p, proposer_row *rows, int n);
    void (*reset)(proposer *p, int slot);      /* NULL: stateless */
    void (*keep)(proposer *p, int slot, int n); /* NULL: stateless */
    /* After every target step, the rows it ran that speculate; NULL: the proposer reads
     * nothing of the target's steps (and the scheduler asks for no hidden states). */
    void (*observe)(proposer *p, const proposer_obs *rows, int n);
    void (*destroy)(proposer *p);
} proposer_vtable;

/* Implementations embed this first. */
struct proposer {
    const proposer_vtable *vt;
};

const char *proposer_name(const proposer *p);
void proposer_draft(proposer *p, proposer_row *rows, int n);
/* A new sequence takes `slot` (admission, also after a preemption): state about its old one
 * is worthless. */
void proposer_reset(proposer *p, int slot);
/* The first n tokens of slot's sequence stand; anything the proposer holds past them (drafts
 * that were rejected or never verified) does not. */
void proposer_keep(proposer *p, int slot, int n);
void proposer_free(proposer *p);
/* Whether the proposer reads the target's steps (proposer_observe): the scheduler then asks
 * the engine for the final hidden states of the rows that speculate, and grows a row's blocks
 * for its drafts before asking for them (the drafter writes K/V at their positions). */
bool proposer_observes(const proposer *p);
void proposer_observe(proposer *p, const proposer_obs *rows, int n);

/* The n-gram proposer (ngram_draft per row).  NULL when memory ran out. */
proposer *proposer_ngram_new(void);

/* The draft-model proposer over `draft`, an engine of a model with the target's vocabulary
 * (the caller checked the tokenizers: tokenizer_compatible) and the target's n_slots and
 * ctx_per_slot, whose KV pool gives every row its fixed blocks (engine_seq.blocks NULL: the
 * CPU engine's default pool).  It drafts greedily, the argmax of the draft model under the
 * request's penalties and bias, and stops a row's draft early where that token's probability
 * is below p_min (0: never).  The engine stays the caller's.  NULL with a message in err. */
proposer *proposer_draft_model_new(engine *draft, float p_min, char *err, size_t errlen);

/* The MTP proposer over `target`, the scheduler's own engine, which runs the model's MTP block
 * (engine_has_mtp).  It drafts greedily (the block's argmax) up to k_max tokens a row.  The
 * engine stays the caller's.  NULL with a message in err. */
proposer *proposer_mtp_new(engine *target, char *err, size_t errlen);

#endif
