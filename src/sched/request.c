/* request.c - see request.h: a request's life on the HTTP side of the hand-off (submit copy,
 * take, cancel, release) and the outbox the scheduler fills. */
#include "request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

void sched_output_clear(sched_output *o)
{
    free(o->text);
    free(o->tokens);
    free(o->embedding);
    memset(o, 0, sizeof *o);
}

void req_free(sched_req *r)
{
    output_free(&r->out);
    bytebuf_free(&r->text);
    free(r->tokens);
    free(r->toks);
    kv_seq_free(&r->kv); /* the scheduler gave its blocks back when the request finished */
    kv_seq_free(&r->kv_swa);
    free(r->bias_ids);
    free(r->bias_vals);
    grammar_matcher_free(r->gm);
    free(r->mask);
    free(r->emb);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->wake_mu);
    free(r);
}

void req_unref(sched_req *r)
{
    if (atomic_fetch_sub(&r->refs, 1) == 1) req_free(r);
}

void req_wake(sched_req *r)
{
    pthread_mutex_lock(&r->wake_mu);
    if (!r->released && r->wake) r->wake(r->wake_ctx);
    pthread_mutex_unlock(&r->wake_mu);
}

sched_req *req_new(sched *s, const sched_params *p, sched_wake_fn wake, void *wake_ctx)
{
    sched_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->toks = malloc(((size_t)p->n_prompt + (size_t)p->max_tokens) * sizeof *r->toks);
    r->prompt = r->toks;
    int n_bias = p->sp.n_bias > 0 ? p->sp.n_bias : 0;
    if (n_bias) {
        r->bias_ids = malloc((size_t)n_bias * sizeof *r->bias_ids);
        r->bias_vals = malloc((size_t)n_bias * sizeof *r->bias_vals);
    }
    if (p->grammar) {
        /* The matcher starts here (it only reads the grammar); its masks are built on the
         * scheduler thread.  Words past the tokenizer's vocabulary stay clear. */
        r->gm = grammar_matcher_new(p->grammar, sched_grammar_vocab(s));
        r->mask = calloc((size_t)sched_mask_words(s), sizeof *r->mask);
    }
    bool ok = r->prompt && (!n_bias || (r->bias_ids && r->bias_vals)) && (!p->grammar || (r->gm && r->mask)) &&
              output_init(&r->out, p->stop, p->n_stop);
    pthread_mutex_init(&r->mu, NULL);
    /* Recursive: a wake callback that releases its request (same thread) must not deadlock;
     * the scheduler still holds its own reference then, so r stays valid. */
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&r->wake_mu, &attr);
    pthread_mutexattr_destroy(&attr);
    if (!ok) {
        req_free(r);
        return NULL;
    }
    memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof *r->prompt);
    r->s = s;
    r->n_prompt = r->n_toks = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->sp = p->sp;
    r->sp.n_bias = n_bias;
    if (n_bias) {
        memcpy(r->bias_ids, p->sp.bias_ids, (size_t)n_bias * sizeof *r->bias_ids);
        memcpy(r->bias_vals, p->sp.bias_vals, (size_t)n_bias * sizeof *r->bias_vals);
    }
    r->sp.bias_ids = r->bias_ids;
    r->sp.bias_vals = r->bias_vals;
    if (!p->want_logprobs) r->sp.n_top_logprobs = -1;
    else if (r->sp.n_top_logprobs < 0) r->sp.n_top_logprobs = 0; /* the chosen token's logprob only */
    else if (r->sp.n_top_logprobs > ENGINE_MAX_TOP_LOGPROBS) r->sp.n_top_logprobs = ENGINE_MAX_TOP_LOGPROBS;
    r->ignore_eos = p->ignore_eos;
    r->want_logprobs = p->want_logprobs;
    r->wake = wake;
    r->wake_ctx = wake_ctx;
    r->slot = -1;
    r->state = -1;
    r->snap_slot = -1;
    r->t_submit = uv_hrtime();
    atomic_init(&r->refs, 2); /* the HTTP side's and the scheduler's */
    atomic_init(&r->cancelled, false);
    return r;
}

bool req_outbox_append(sched_req *r, const bytebuf *text, const engine_result *tok)
{
    bool ok = true;
    pthread_mutex_lock(&r->mu);
    r->completion_tokens = r->n_generated;
    if (text->len) ok = bytebuf_append(&r->text, text->data, text->len);
    if (ok && tok) {
        if (r->n_tokens == r->cap_tokens) {
            int cap = r->cap_tokens ? 2 * r->cap_tokens : 16;
            engine_result *t = realloc(r->tokens, (size_t)cap * sizeof *t);
            if (t) {
                r->tokens = t;
                r->cap_tokens = cap;
            }
        }
        if (r->n_tokens < r->cap_tokens) {
            engine_result *t = &r->tokens[r->n_tokens++];
            *t = *tok;
            if (t->n_top < 0) t->n_top = 0; /* the encoders read top_ids[0..n_top) */
            if (t->n_top > ENGINE_MAX_TOP_LOGPROBS) t->n_top = ENGINE_MAX_TOP_LOGPROBS;
        } else {
            ok = false;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void req_outbox_finish(sched_req *r, sched_finish why, const char *error)
{
    pthread_mutex_lock(&r->mu);
    r->completion_tokens = r->n_generated;
    r->finish = why;
    /* the stop strings of sched_params are all non-empty (api_request), so stopstr kept their
     * order */
    r->stop_string = why == SCHED_FINISH_STOP && r->out.stop.matched ? r->out.stop.matched_index + 1 : 0;
    if (error) snprintf(r->error, sizeof r->error, "%s", error);
    pthread_mutex_unlock(&r->mu);
}

bool sched_req_take(sched_req *r, sched_output *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->mu);
    bool finish_new = r->finish != SCHED_FINISH_NONE && !r->finish_taken;
    bool any = r->text.len > 0 || r->n_tokens > 0 || finish_new;
    out->text = bytebuf_take(&r->text, &out->text_len);
    out->tokens = r->tokens;
    out->n_tokens = r->n_tokens;
    r->tokens = NULL;
    r->n_tokens = r->cap_tokens = 0;
    if (finish_new) {
        out->finish = r->finish;
        out->stop_string = r->stop_string;
        r->finish_taken = true;
        if (r->finish == SCHED_FINISH_ERROR) memcpy(out->error, r->error, sizeof out->error);
        if (r->finish == SCHED_FINISH_STOP && r->emb) { /* the embedding goes with its finish */
            out->embedding = r->emb;
            out->n_embedding = r->n_emb;
            r->emb = NULL;
        }
    }
    out->prompt_tokens = r->n_prompt;
    out->cached_tokens = r->cached_tokens;
    out->completion_tokens = r->completion_tokens;
    pthread_mutex_unlock(&r->mu);
    return any;
}

/* Asks the scheduler to drop r at its next step.  The note is sent under r->mu while r is
 * unfinished: the scheduler cannot finish r, and so cannot have closed its loop, until we let
 * go of the lock (sched_destroy finishes every request before it closes the handles). */
void sched_req_cancel(sched_req *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->finish == SCHED_FINISH_NONE && !atomic_exchange(&r->cancelled, true)) {
        sched_note_cancel(r->s);
    }
    pthread_mutex_unlock(&r->mu);
}

void sched_req_release(sched_req *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->wake_mu);
    r->released = true;
    pthread_mutex_unlock(&r->wake_mu);
    sched_req_cancel(r);
    req_unref(r);
}
