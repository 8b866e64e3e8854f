/* proposer.c - the seam's dispatch (proposer.h) and the n-gram proposer, which is ngram_draft
 * per row and keeps nothing between calls. */
#include "proposer.h"

#include <stdlib.h>

#include "ngram.h"

const char *proposer_name(const proposer *p) { return p->vt->name; }

void proposer_draft(proposer *p, proposer_row *rows, int n)
{
    for (int i = 0; i < n; i++) rows[i].n_draft = 0;
    if (n > 0) p->vt->draft(p, rows, n);
}

void proposer_reset(proposer *p, int slot)
{
    if (p->vt->reset) p->vt->reset(p, slot);
}

void proposer_keep(proposer *p, int slot, int n)
{
    if (p->vt->keep) p->vt->keep(p, slot, n);
}

bool proposer_observes(const proposer *p) { return p && p->vt->observe; }

void proposer_observe(proposer *p, const proposer_obs *rows, int n)
{
    if (n > 0 && p->vt->observe) p->vt->observe(p, rows, n);
}

void proposer_free(proposer *p)
{
    if (p) p->vt->destroy(p);
}

static void ngram_rows(proposer *p, proposer_row *rows, int n)
{
    (void)p;
    for (int i = 0; i < n; i++) rows[i].n_draft = ngram_draft(rows[i].toks, rows[i].n_toks, rows[i].k_max, rows[i].draft);
}

static void ngram_destroy(proposer *p) { free(p); }

static const proposer_vtable NGRAM_VT = {.name = "ngram", .draft = ngram_rows, .destroy = ngram_destroy};

proposer *proposer_ngram_new(void)
{
    proposer *p = malloc(sizeof *p);
    if (p) p->vt = &NGRAM_VT;
    return p;
}
