/* draftmodel.c - the draft-model proposer (proposer.h): a second, smaller engine of the
 * target's vocabulary drafts each speculating row's next tokens, all rows batched into one
 * draft step per round.
 *
 * Each row keeps its own K/V in the draft engine (its fixed blocks: no block table, no prefix
 * cache; a small model's prefill of a cached prompt is cheap next to the target's) and `fed`,
 * how many of the row's tokens those K/V hold.  Round 0 feeds what the draft has not seen yet,
 * toks[fed..n_toks-1]: the prompt the first time, afterwards the tokens the last verification
 * accepted and the pending one (its catch-up, chunked under the batch budget: a row whose
 * catch-up does not fit drafts nothing this step) and samples draft 1 after the pending token;
 * round j feeds draft j and samples draft j+1.  proposer_keep rolls `fed` back to what the
 * verification confirmed: positions past it are simply fed again (an engine never reads K/V
 * past a sequence's length, and its token history rewinds with the position).
 *
 * Drafts are the draft model's argmax (temperature 0, the request's penalties and bias; the
 * first one under the grammar's mask): a point-mass proposal, which is what the scheduler's
 * acceptance rule (engine_verify_accept) expects, for greedy and sampled requests alike. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "proposer.h"

typedef struct draft_model {
    proposer base;
    engine *e;
    float p_min;
    int n_slots, max_batch, ctx;
    bool dead;             /* the draft engine failed fatally: no more drafts */
    int *fed;              /* per slot: tokens of the row's sequence whose K/V the draft holds */
    sampling_params *sp;   /* per slot: the request's sampling made greedy */
    engine_seq *seqs;      /* a round's batch (at most n_slots) */
    engine_result *res;
    int *row_of;           /* seqs[i] drafts rows[row_of[i]] */
    int *at;               /* rounds 1..: row_of[i]'s index in their seqs (and rres) */
    engine_result *rres;   /* rounds 1..: round r's sample of seqs[i] at r * n + i */
    size_t rres_cap;
} draft_model;

static void dm_reset(proposer *p, int slot)
{
    draft_model *d = (draft_model *)p;
    if (slot < 0 || slot >= d->n_slots) return;
    d->fed[slot] = 0;
    engine_slot_clear(d->e, slot);
}

static void dm_keep(proposer *p, int slot, int n)
{
    draft_model *d = (draft_model *)p;
    if (slot >= 0 && slot < d->n_slots && d->fed[slot] > n) d->fed[slot] = n < 0 ? 0 : n;
}

/* A draft step that failed with rc (err): a fatal one ends drafting for good. */
static void dm_failed(draft_model *d, int rc, const char *err)
{
    if (rc == ENGINE_FATAL) {
        d->dead = true;
        log_error("draft model: the %s engine failed (%s); speculating without drafts from now on",
                  engine_name(d->e), err);
    } else {
        log_warn("draft model: a draft step failed: %s", err);
    }
}

/* Runs the round in d->seqs (n of them); false when the draft engine refused it.  A refused
 * step leaves every row as it was (engine.h), so the rows just draft nothing this time. */
static bool dm_step(draft_model *d, int n)
{
    char err[256] = "";
    int rc = engine_step(d->e, d->seqs, n, d->res, err, sizeof err);
    if (rc == 0) return true;
    dm_failed(d, rc, err);
    return false;
}

/* Runs `rounds` rounds of the n one-token rows in d->seqs (engine_decode_rounds) into d->rres,
 * d->at[i] = i; false when the draft engine refused them (the rows draft no further). */
static bool dm_rounds(draft_model *d, int n, int rounds)
{
    char err[256] = "";
    const size_t need = (size_t)n * (size_t)rounds;
    if (need > d->rres_cap) {
        engine_result *r = realloc(d->rres, need * sizeof *r);
        if (!r) {
            log_warn("draft model: out of memory for %d rounds of %d rows", rounds, n);
            return false;
        }
        d->rres = r;
        d->rres_cap = need;
    }
    for (int i = 0; i < n; i++) d->at[i] = i;
    int rc = engine_decode_rounds(d->e, d->seqs, n, rounds, d->rres, err, sizeof err);
    if (rc == 0) return true;
    dm_failed(d, rc, err);
    return false;
}

/* Whether the draft's sample res ends row's draft (below p_min) or joins it. */
static bool dm_take(const draft_model *d, proposer_row *row, const engine_result *res)
{
    if (d->p_min > 0 && expf(res->logprob) < d->p_min) return false;
    row->draft[row->n_draft++] = res->token;
    return row->n_draft < row->k_max;
}

static void dm_draft(proposer *p, proposer_row *rows, int n_rows)
{
    draft_model *d = (draft_model *)p;
    if (d->dead) return;
    /* round 0: each row's catch-up up to and including its pending token */
    int n = 0, budget = d->max_batch;
    for (int i = 0; i < n_rows && budget > 0; i++) {
        proposer_row *row = &rows[i];
        int *fed = &d->fed[row->slot];
        if (*fed > row->n_toks - 1) *fed = row->n_toks - 1; /* the pending token is fed again for its logits */
        int catch_up = row->n_toks - *fed, chunk = catch_up < budget ? catch_up : budget;
        d->sp[row->slot] = *row->sp;
        d->sp[row->slot].temperature = 0;
        d->sp[row->slot].n_top_logprobs = d->p_min > 0 ? 0 : -1; /* the logprob is all p_min reads */
        d->seqs[n] = (engine_seq){.slot = row->slot, .tokens = row->toks + *fed, .n_tokens = chunk, .pos = *fed,
                                  .history = row->toks, .want_token = chunk == catch_up, .sp = &d->sp[row->slot],
                                  .allowed = chunk == catch_up ? row->allowed : NULL};
        d->row_of[n++] = i;
        budget -= chunk;
    }
    if (!dm_step(d, n)) return;
    int going = 0;
    for (int i = 0; i < n; i++) {
        proposer_row *row = &rows[d->row_of[i]];
        d->fed[row->slot] += d->seqs[i].n_tokens;
        if (d->seqs[i].want_token && dm_take(d, row, &d->res[i])) d->row_of[going++] = d->row_of[i];
    }
    /* rounds 1..: every row still drafting feeds its latest draft, one token each, as many
     * rounds as the longest draft still wants in one engine_decode_rounds (the GPU chains them
     * on the device); a row that stops sooner (k_max, p_min) ignores the rounds after */
    if (going == 0) return;
    int rounds = 0, room = d->ctx; /* room: the rounds every row's context still holds */
    for (int i = 0; i < going; i++) {
        proposer_row *row = &rows[d->row_of[i]];
        if (row->k_max - row->n_draft > rounds) rounds = row->k_max - row->n_draft;
        if (d->ctx - d->fed[row->slot] < room) room = d->ctx - d->fed[row->slot];
        d->seqs[i] = (engine_seq){.slot = row->slot, .tokens = &row->draft[row->n_draft - 1], .n_tokens = 1,
                                  .pos = d->fed[row->slot], .want_token = true, .sp = &d->sp[row->slot]};
    }
    if (rounds > room) rounds = room;
    if (!dm_rounds(d, going, rounds)) return; /* the drafts so far stand: their K/V are the rows' */
    for (int r = 0, still = going; r < rounds && still > 0; r++) {
        int next = 0;
        for (int i = 0; i < still; i++) { /* row_of[0..still-1]: those drafting into round r, seqs order kept */
            const int at = d->at[i];
            proposer_row *row = &rows[d->row_of[i]];
            d->fed[row->slot]++;
            if (dm_take(d, row, &d->rres[(size_t)r * going + at])) {
                d->row_of[next] = d->row_of[i];
                d->at[next++] = at;
            }
        }
        still = next;
    }
}

static void dm_destroy(proposer *p)
{
    draft_model *d = (draft_model *)p;
    free(d->fed);
    free(d->sp);
    free(d->seqs);
    free(d->res);
    free(d->row_of);
    free(d->at);
    free(d->rres);
    free(d);
}

static const proposer_vtable DRAFT_VT = {
    .name = "draft", .draft = dm_draft, .reset = dm_reset, .keep = dm_keep, .destroy = dm_destroy};

proposer *proposer_draft_model_new(engine *draft, float p_min, char *err, size_t errlen)
{
    const engine_config *ec = engine_get_config(draft);
    const int per_seq = (ec->ctx_per_slot + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK;
    if (!engine_has_lm_head(draft)) {
        snprintf(err, errlen, "the draft model (%s) has no LM head: it cannot draft tokens", engine_model(draft)->desc->name);
        return NULL;
    }
    if (engine_state_slots(draft) > 0) {
        snprintf(err, errlen, "the draft model (%s) keeps recurrent state, which cannot be rolled back past a rejected "
                 "draft: pick a draft model without linear-attention layers", engine_model(draft)->desc->name);
        return NULL;
    }
    if ((int64_t)engine_kv_blocks(draft) < (int64_t)ec->n_slots * per_seq) {
        snprintf(err, errlen, "the draft engine's KV pool holds %d blocks; its %d rows of %d positions need %d",
                 engine_kv_blocks(draft), ec->n_slots, ec->ctx_per_slot, ec->n_slots * per_seq);
        return NULL;
    }
    draft_model *d = calloc(1, sizeof *d);
    size_t n = (size_t)ec->n_slots;
    if (d) {
        d->fed = calloc(n, sizeof *d->fed);
        d->sp = calloc(n, sizeof *d->sp);
        d->seqs = calloc(n, sizeof *d->seqs);
        d->res = calloc(n, sizeof *d->res);
        d->row_of = calloc(n, sizeof *d->row_of);
        d->at = calloc(n, sizeof *d->at);
    }
    if (!d || !d->fed || !d->sp || !d->seqs || !d->res || !d->row_of || !d->at) {
        if (d) dm_destroy(&d->base);
        snprintf(err, errlen, "out of memory for the draft model's rows");
        return NULL;
    }
    d->base.vt = &DRAFT_VT;
    d->e = draft;
    d->p_min = p_min;
    d->n_slots = ec->n_slots;
    d->max_batch = ec->max_batch_tokens;
    d->ctx = ec->ctx_per_slot;
    return &d->base;
}
