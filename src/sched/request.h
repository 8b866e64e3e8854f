/* request.h - one choice as the scheduler holds it, and its outbox: the hand-off between the
 * scheduler thread (which fills the outbox and wakes the HTTP side) and the HTTP threads
 * (which take from it, cancel and release).  Internal to src/sched.
 *
 * A request has two references, the HTTP side's and the scheduler's, dropped by
 * sched_req_release and by req_unref when the request finishes; the last one frees it.
 * r->mu guards the outbox; r->wake_mu makes "never wake after release" hold. */
#ifndef INFERD_SCHED_REQUEST_H
#define INFERD_SCHED_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/bytebuf.h"
#include "kvcache.h"
#include "output.h"
#include "sched.h"

struct sched_req {
    sched *s;
    atomic_int refs;
    atomic_bool cancelled;

    /* What was asked (immutable after submit). */
    int32_t *prompt; /* == toks: the first n_prompt entries */
    int n_prompt;
    int max_tokens;
    sampling_params sp; /* bias arrays point into bias_ids/bias_vals below */
    int32_t *bias_ids;
    float *bias_vals;
    bool ignore_eos;
    bool want_logprobs;
    grammar_matcher *gm; /* structured output, or NULL; scheduler thread only after submit */
    bool embed;          /* prefill-only: em says how to pool (em.out = emb below) */
    bool holds_place;    /* counts toward sched_capacity (not an input riding on its request's) */
    engine_embed em;
    uint32_t *mask;      /* the allowed tokens of the next sample (engine_seq.allowed) */
    bool mask_pending;   /* the mask is not built yet: the request waits (sched.c, req_next_mask) */
    int mask_tries;      /* slices the pending mask has had */
    double mask_ms;      /* and the time they took */
    char id[64];
    sched_wake_fn wake;
    void *wake_ctx;

    /* Scheduler thread only. */
    sched_req *next; /* waiting queue link */
    int slot;        /* its row while running; -1 while waiting */
    int n_past;      /* positions whose K/V its blocks hold */
    int32_t *toks;   /* the token of every position: prompt, then each generated token (room for
                      * n_prompt + max_tokens), so a preempted request can be recomputed */
    int n_toks;
    kv_seq kv;       /* its block table while running */
    kv_seq kv_swa;   /* its sliding-layer table (a model with a sliding pool) */
    int state;       /* hybrid models: its recurrent-state slot while running; -1 */
    int snap_slot, snap_tokens; /* its latest decode snapshot (statecache_drop); -1, 0 */
    int share_at; /* a prefix it shares with cached blocks but no snapshot: one is taken there; 0 */
    bool started;    /* admitted once: its text pipeline runs (kept across preemptions) */
    int passed;      /* later requests admitted past it while it was the oldest waiting (admit) */
    int n_generated;
    int32_t last_token; /* sampled, not yet fed back */
    bool has_pending;   /* last_token must be fed in the next step */
    bool speculate;     /* drafts tokens (the server speculates and the request did not opt out) */
    int spec_k;         /* the most tokens its next draft may have (adapts: sched.c spec_adapt) */
    int spec_pause;     /* decode steps left without drafting after repeated misses */
    bool spec_refeed;   /* rewound after a rejected draft: its re-fed tokens take the pending one (sched.c spec_rewind) */
    uint64_t admit_seq; /* FIFO order among admitted requests for prefill */
    output out;         /* the text pipeline */
    uint64_t t_submit, t_first, t_last; /* uv_hrtime ns */

    /* Outbox, guarded by mu. */
    pthread_mutex_t mu;
    bytebuf text;
    engine_result *tokens;
    int n_tokens, cap_tokens;
    int completion_tokens; /* n_generated as published with the outbox */
    int cached_tokens;     /* prompt tokens read from the prefix cache at the first admission */
    sched_finish finish;
    int stop_string;    /* with finish: 1 + the index of the stop string that ended it; 0: none */
    bool finish_taken;
    char error[256];
    float *emb; /* the embedding, written by the engine, handed over with the finish */
    size_t n_emb;

    pthread_mutex_t wake_mu;
    bool released; /* guarded by wake_mu */
};

/* A new request for s (two references), copying what p points to; NULL when memory ran out
 * or the stop strings are unusable. */
sched_req *req_new(sched *s, const sched_params *p, sched_wake_fn wake, void *wake_ctx);
/* Implemented by sched.c: the vocabulary masks are built against, and their size in words
 * (covering the model's logits). */
const grammar_vocab *sched_grammar_vocab(const sched *s);
int sched_mask_words(const sched *s);
void req_free(sched_req *r); /* a request that was never handed out */
void req_unref(sched_req *r);
/* Tells the HTTP side that the outbox changed, unless it already let go of the request. */
void req_wake(sched_req *r);
/* Moves text (and the token, when logprobs were asked for) into the outbox; false when memory
 * ran out. */
bool req_outbox_append(sched_req *r, const bytebuf *text, const engine_result *tok);
/* Publishes the finish (and the error message of SCHED_FINISH_ERROR) in the outbox. */
void req_outbox_finish(sched_req *r, sched_finish why, const char *error);

/* Implemented by sched.c: a request was cancelled, drop it at the next step. */
void sched_note_cancel(sched *s);

#endif
