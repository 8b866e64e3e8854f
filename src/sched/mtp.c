/* mtp.c - the MTP proposer (proposer.h): the target model's own multi-token-prediction block
 * (engine.h: engine_mtp_step, in the target's engine and its paged K/V) drafts each speculating
 * row's next tokens, all rows batched into one MTP pass per round.
 *
 * The block runs one position behind the target (llama.cpp's pairing, common/speculative.cpp
 * draft_mtp): its position p takes the token at p and the target's final hidden state of p - 1.
 * So after every target step (proposer_observe) it catches up over the step's positions with
 * h(pos - 1) and the step's rows but the last, and keeps h(pos - 1) and all the step's rows:
 * after a verification `keep` cuts the sequence back to the accepted tokens, whose last row is
 * among them, and a hybrid's re-feed after a rejection (sched.c: spec_rewind) starts at the
 * verification's first position, whose h(pos - 1) is the one kept.  Where h(pos - 1) is not at
 * hand (a prefix-cache hit's first position) it is zero, as llama.cpp starts a sequence: a
 * weaker guess at one position, never a wrong output (drafts are verified).
 *
 * Drafting: round 0 runs the pending token at its position P with h(P - 1) and takes the
 * block's argmax as draft 1; round j runs draft j at P + j with the block's own h' of round
 * j - 1.  The rounds write the block's K/V at P..P+k-1 through the row's block table (the
 * scheduler grew it for them); the next catch-up writes those positions again. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "proposer.h"

typedef struct mtp_proposer {
    proposer base;
    engine *e;
    int n_slots, dim, max_batch;
    bool dead;       /* the engine failed fatally: no more drafts */
    int *fed;        /* per slot: the block's K/V hold the row's positions 0..fed-1 */
    /* per slot: the target's hidden rows of positions h_first .. h_first + h_n - 1, room for
     * max_batch + 1 rows (a step's and the one before it) */
    float *h;
    int *h_first, *h_n;
    engine_mtp_seq *seqs; /* a pass's rows (at most n_slots) */
    float *in, *out;      /* a pass's hidden inputs and outputs, max_batch rows */
    int *row_of;          /* drafting: seqs[i] drafts rows[row_of[i]] */
} mtp_proposer;

static float *slot_rows(const mtp_proposer *m, int slot)
{
    return m->h + (size_t)slot * (size_t)(m->max_batch + 1) * (size_t)m->dim;
}

/* h(pos) of slot into dst: a kept row, or zero when none is at hand (pos < 0: before the
 * first token). */
static void hidden_at(const mtp_proposer *m, int slot, int pos, float *dst)
{
    const int i = pos - m->h_first[slot];
    if (pos >= 0 && i >= 0 && i < m->h_n[slot])
        memcpy(dst, slot_rows(m, slot) + (size_t)i * m->dim, (size_t)m->dim * sizeof *dst);
    else
        memset(dst, 0, (size_t)m->dim * sizeof *dst);
}

/* One MTP pass over m->seqs[0..n); false (drafting nothing more) when the engine refused it. */
static bool mtp_pass(mtp_proposer *m, int n)
{
    char err[256] = "";
    const int rc = engine_mtp_step(m->e, m->seqs, n, err, sizeof err);
    if (rc == 0) return true;
    if (rc == ENGINE_FATAL) {
        m->dead = true;
        log_error("mtp: the %s engine failed (%s); speculating without drafts from now on", engine_name(m->e), err);
    } else {
        log_warn("mtp: an MTP pass failed: %s", err);
    }
    return false;
}

static void mtp_observe(proposer *p, const proposer_obs *rows, int n)
{
    mtp_proposer *m = (mtp_proposer *)p;
    if (m->dead) return;
    int used = 0;
    for (int i = 0; i < n; i++) {
        const proposer_obs *o = &rows[i];
        float *in = m->in + (size_t)used * m->dim;
        hidden_at(m, o->slot, o->pos - 1, in);
        memcpy(in + m->dim, o->hidden, (size_t)(o->n_tokens - 1) * m->dim * sizeof *in);
        m->seqs[i] = (engine_mtp_seq){.slot = o->slot, .tokens = o->tokens, .n_tokens = o->n_tokens, .pos = o->pos,
                                      .blocks = o->blocks, .hidden = in};
        used += o->n_tokens;
    }
    const bool ok = mtp_pass(m, n);
    for (int i = 0; i < n; i++) { /* keep h(pos - 1) and the step's rows */
        const proposer_obs *o = &rows[i];
        float *keep = slot_rows(m, o->slot);
        memcpy(keep, m->seqs[i].hidden, (size_t)m->dim * sizeof *keep);
        memcpy(keep + m->dim, o->hidden, (size_t)o->n_tokens * m->dim * sizeof *keep);
        m->h_first[o->slot] = o->pos - 1;
        m->h_n[o->slot] = o->n_tokens + 1;
        m->fed[o->slot] = ok ? o->pos + o->n_tokens : (m->fed[o->slot] < o->pos ? m->fed[o->slot] : o->pos);
    }
}

static void mtp_draft(proposer *p, proposer_row *rows, int n)
{
    mtp_proposer *m = (mtp_proposer *)p;
    if (m->dead) return;
    int live = 0, k_most = 0;
    for (int i = 0; i < n; i++) { /* round 0: the pending token at P with h(P - 1) */
        const proposer_row *r = &rows[i];
        const int P = r->n_toks - 1;
        if (!r->blocks || r->k_max < 1 || m->fed[r->slot] < P) continue;
        float *in = m->in + (size_t)live * m->dim;
        hidden_at(m, r->slot, P - 1, in);
        m->seqs[live] = (engine_mtp_seq){.slot = r->slot, .tokens = &r->toks[P], .n_tokens = 1, .pos = P,
                                         .blocks = r->blocks, .hidden = in, .draft = &r->draft[0],
                                         .hidden_out = m->out + (size_t)live * m->dim};
        m->row_of[live++] = i;
        if (r->k_max > k_most) k_most = r->k_max;
    }
    for (int round = 0; live > 0 && round < k_most; round++) {
        if (!mtp_pass(m, live)) return;
        int next = 0;
        for (int j = 0; j < live; j++) { /* rows still drafting: draft round+1 at P + round + 1 */
            proposer_row *r = &rows[m->row_of[j]];
            r->n_draft = round + 1;
            if (r->k_max <= round + 1) continue;
            float *in = m->in + (size_t)next * m->dim;
            memcpy(in, m->out + (size_t)j * m->dim, (size_t)m->dim * sizeof *in);
            m->seqs[next] = m->seqs[j];
            m->seqs[next].tokens = &r->draft[round];
            m->seqs[next].pos = r->n_toks + round;
            m->seqs[next].hidden = in;
            m->seqs[next].draft = &r->draft[round + 1];
            m->row_of[next++] = m->row_of[j];
        }
        /* the outputs of the rows carried on: each writes its own row of out, in order */
        for (int j = 0; j < next; j++) m->seqs[j].hidden_out = m->out + (size_t)j * m->dim;
        live = next;
    }
}

static void mtp_reset(proposer *p, int slot)
{
    mtp_proposer *m = (mtp_proposer *)p;
    if (slot < 0 || slot >= m->n_slots) return;
    m->fed[slot] = 0;
    m->h_n[slot] = 0;
}

static void mtp_keep(proposer *p, int slot, int n)
{
    mtp_proposer *m = (mtp_proposer *)p;
    if (slot >= 0 && slot < m->n_slots && m->fed[slot] > n) m->fed[slot] = n < 0 ? 0 : n;
}

static void mtp_destroy(proposer *p)
{
    mtp_proposer *m = (mtp_proposer *)p;
    if (!m) return;
    void *bufs[] = {m->fed, m->h, m->h_first, m->h_n, m->seqs, m->in, m->out, m->row_of};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m);
}

static const proposer_vtable MTP_VT = {.name = "mtp", .draft = mtp_draft, .reset = mtp_reset, .keep = mtp_keep,
                                       .observe = mtp_observe, .destroy = mtp_destroy};

proposer *proposer_mtp_new(engine *target, char *err, size_t errlen)
{
    if (!engine_has_mtp(target)) {
        snprintf(err, errlen, "--speculative mtp: the %s engine runs no MTP block (%s)", engine_name(target),
                 engine_model(target)->mtp.bound ? "not built on this engine, or engine_config.mtp is off"
                                                 : "the model has no MTP block (nextn_predict_layers)");
        return NULL;
    }
    const engine_config *c = engine_get_config(target);
    mtp_proposer *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "mtp: out of memory");
        return NULL;
    }
    m->base.vt = &MTP_VT;
    m->e = target;
    m->n_slots = c->n_slots;
    m->dim = engine_model(target)->hp.n_embd;
    m->max_batch = c->max_batch_tokens;
    const size_t slots = (size_t)m->n_slots, rows = (size_t)m->max_batch, dim = (size_t)m->dim;
    m->fed = calloc(slots, sizeof *m->fed);
    m->h = malloc(slots * (rows + 1) * dim * sizeof *m->h);
    m->h_first = calloc(slots, sizeof *m->h_first);
    m->h_n = calloc(slots, sizeof *m->h_n);
    m->seqs = calloc(slots, sizeof *m->seqs);
    m->in = malloc((rows > slots ? rows : slots) * dim * sizeof *m->in); /* a step's rows, or a round's */
    m->out = malloc(slots * dim * sizeof *m->out);
    m->row_of = calloc(slots, sizeof *m->row_of);
    if (!m->fed || !m->h || !m->h_first || !m->h_n || !m->seqs || !m->in || !m->out || !m->row_of) {
        mtp_destroy(&m->base);
        snprintf(err, errlen, "mtp: out of memory");
        return NULL;
    }
    return &m->base;
}
