/* sched.c - the continuous-batching scheduler (see sched.h).
 *
 * Threads and ownership:
 *   - HTTP threads call sched_submit / sched_req_take / sched_req_cancel / sched_req_release.
 *   - One scheduler thread runs a libuv loop.  It alone touches the engine, the slot table and
 *     the generation state of running requests (detokenizer, stop matcher, positions).
 *   - s->mu guards the waiting queue, the shutdown flags and the statistics.
 *   - r->mu guards a request's outbox; r->wake_mu makes "never wake after release" hold.
 *   - A request is shared by the HTTP side and the scheduler: two references, dropped by
 *     sched_req_release and by the scheduler when the request finishes; the last one frees.
 *   - The wake callback runs on the scheduler thread under r->wake_mu; it may call
 *     sched_req_take and even sched_req_release.  sched_req_release waits for a wake of the
 *     same request in progress, so it must not be called while holding a lock that the wake
 *     callback takes.
 *   - sched_destroy finishes every request; handles still held by the HTTP side stay valid
 *     (take/cancel/release of a finished request never touch the scheduler).
 *
 * The loop: uv_async wakes it (submit, cancel, shutdown); a uv_idle handle keeps it stepping
 * while any request is waiting or running and is stopped as soon as there is nothing to do,
 * so an idle server sleeps in epoll. */
#include "sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "../log.h"
#include "stopstr.h"
#include "textbuf.h"

const double sched_hist_bounds_ms[SCHED_HIST_BUCKETS] = {
    5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000,
};

static const char *const finish_names[] = {"none", "stop", "length", "cancelled", "error"};

struct sched_req {
    sched *s;
    atomic_int refs;
    atomic_bool cancelled;

    /* What was asked (immutable after submit). */
    int32_t *prompt;
    int n_prompt;
    int max_tokens;
    sampling_params sp; /* bias arrays point into bias_ids/bias_vals below */
    int32_t *bias_ids;
    float *bias_vals;
    bool ignore_eos;
    bool want_logprobs;
    char id[64];
    sched_wake_fn wake;
    void *wake_ctx;

    /* Scheduler thread only. */
    sched_req *next; /* waiting queue link */
    int slot;        /* -1 while waiting */
    int n_past;      /* tokens fed into the slot */
    int n_generated;
    int32_t last_token; /* sampled, not yet fed back */
    bool has_pending;   /* last_token must be fed in the next step */
    uint64_t admit_seq; /* FIFO order among admitted requests for prefill */
    detok_stream detok;
    stopstr stop;
    uint64_t t_submit, t_first, t_last; /* uv_hrtime ns */

    /* Outbox, guarded by mu. */
    pthread_mutex_t mu;
    textbuf text;
    sched_token *tokens;
    int n_tokens, cap_tokens;
    int completion_tokens; /* n_generated as published with the outbox */
    sched_finish finish;
    bool finish_taken;
    char error[256];

    pthread_mutex_t wake_mu;
    bool released; /* guarded by wake_mu */
};

struct sched {
    engine *e;
    const tokenizer *tok;
    sched_config cfg;

    pthread_t thread;
    uv_loop_t loop;
    uv_async_t async;
    uv_idle_t idle;
    uv_timer_t beat; /* cfg.heartbeat ticks (initialised always, started when asked for) */
    uv_timer_t trim; /* one-shot: the loop has been idle for SCHED_TRIM_MS, see on_trim */

    pthread_mutex_t mu; /* guards everything down to `stats` */
    pthread_cond_t idle_cond; /* signalled whenever a request finishes */
    sched_req *wait_head, *wait_tail;
    int n_waiting;
    int n_active; /* submitted and not finished: waiting + running */
    int n_reserved; /* places held by sched_reserve for submits still to come */
    int n_running;    /* holding a slot */
    uint64_t kv_used; /* tokens fed into all held slots */
    bool shutdown; /* no new submits */
    bool cancel_all;
    bool stopping; /* sched_destroy: finish everything and leave the loop */
    sched_stats stats;
    uint64_t next_id;
    atomic_uint n_cancels; /* bumped by every cancel, so steps skip the queue walk otherwise */
    unsigned cancels_seen; /* scheduler thread */

    /* Scheduler thread only. */
    sched_req **slots; /* n_slots, NULL when free */
    engine_seq *seqs;
    engine_result *results;
    sched_req **seq_req; /* request of seqs[i] */
    sched_req **prefill; /* plan_step scratch */
    int decode_rr;       /* round-robin start when decodes alone exceed the budget */
    uint64_t admit_counter;
    char *piece; /* detokenizer output scratch */
    int piece_cap;
    textbuf text; /* released completion text of the token being processed */
};

/* ---- small helpers ------------------------------------------------------------------- */

static double ms_between(uint64_t from_ns, uint64_t to_ns) { return (double)(to_ns - from_ns) / 1e6; }

static void hist_observe(sched_hist *h, double ms)
{
    int b = 0;
    while (b < SCHED_HIST_BUCKETS && ms > sched_hist_bounds_ms[b]) b++;
    h->counts[b]++;
    h->sum_ms += ms;
    h->n++;
}

void sched_output_clear(sched_output *o)
{
    free(o->text);
    free(o->tokens);
    memset(o, 0, sizeof *o);
}

static void req_free(sched_req *r)
{
    stopstr_free(&r->stop);
    textbuf_free(&r->text);
    free(r->tokens);
    free(r->prompt);
    free(r->bias_ids);
    free(r->bias_vals);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->wake_mu);
    free(r);
}

static void req_unref(sched_req *r)
{
    if (atomic_fetch_sub(&r->refs, 1) == 1) req_free(r);
}

/* Tells the HTTP side that the outbox changed, unless it already let go of the request. */
static void req_wake(sched_req *r)
{
    pthread_mutex_lock(&r->wake_mu);
    if (!r->released && r->wake) r->wake(r->wake_ctx);
    pthread_mutex_unlock(&r->wake_mu);
}

/* ---- submit side (HTTP threads) ---------------------------------------------------- */

static sched_req *req_new(sched *s, const sched_params *p, sched_wake_fn wake, void *wake_ctx)
{
    sched_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->prompt = malloc((size_t)p->n_prompt * sizeof *r->prompt);
    int n_bias = p->sp.n_bias > 0 ? p->sp.n_bias : 0;
    if (n_bias) {
        r->bias_ids = malloc((size_t)n_bias * sizeof *r->bias_ids);
        r->bias_vals = malloc((size_t)n_bias * sizeof *r->bias_vals);
    }
    bool ok = r->prompt && (!n_bias || (r->bias_ids && r->bias_vals)) &&
              stopstr_init(&r->stop, p->stop, p->n_stop);
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
    r->n_prompt = p->n_prompt;
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
    r->t_submit = uv_hrtime();
    atomic_init(&r->refs, 2); /* the HTTP side's and the scheduler's */
    atomic_init(&r->cancelled, false);
    return r;
}

/* SCHED_OK, or why a new request is refused.  The bound counts running requests too, so a
 * burst arriving before the scheduler thread admitted anything still fills the free slots.
 * Called with s->mu held. */
static int room_for(const sched *s, int n, bool reserved)
{
    if (s->shutdown) return SCHED_E_SHUTDOWN;
    if (!reserved && s->n_active + s->n_reserved + n > sched_capacity(s)) return SCHED_E_QUEUE_FULL;
    return SCHED_OK;
}

int sched_capacity(const sched *s) { return s->cfg.n_slots + s->cfg.queue_size; }

int sched_reserve(sched *s, int n)
{
    pthread_mutex_lock(&s->mu);
    int rc = room_for(s, n, false);
    if (rc == SCHED_OK) s->n_reserved += n;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void sched_unreserve(sched *s, int n)
{
    pthread_mutex_lock(&s->mu);
    s->n_reserved -= n < s->n_reserved ? n : s->n_reserved;
    pthread_mutex_unlock(&s->mu);
}

int sched_submit(sched *s, const sched_params *p, sched_wake_fn wake, void *wake_ctx,
                 sched_req **out)
{
    *out = NULL;
    if (!p || !p->prompt || p->n_prompt < 1 || p->n_stop < 0 || p->n_stop > SCHED_MAX_STOP ||
        (p->sp.n_bias > 0 && (!p->sp.bias_ids || !p->sp.bias_vals)))
        return SCHED_E_INVALID;
    /* Too long before max_tokens < 1: a caller that defaults max_tokens to "the rest of the
     * context" gets 0 for a prompt that fills it, and "too long" is the useful answer then. */
    if ((int64_t)p->n_prompt + (p->max_tokens > 1 ? p->max_tokens : 1) > s->cfg.ctx_per_slot)
        return SCHED_E_TOO_LONG;
    if (p->max_tokens < 1) return SCHED_E_INVALID;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= tokenizer_n_vocab(s->tok)) return SCHED_E_INVALID;

    /* Cheap refusals first, so an overloaded server does not copy prompts it will drop. */
    pthread_mutex_lock(&s->mu);
    int rc = room_for(s, 1, p->reserved);
    pthread_mutex_unlock(&s->mu);
    if (rc != SCHED_OK) return rc;

    sched_req *r = req_new(s, p, wake, wake_ctx);
    if (!r) return SCHED_E_INVALID;

    pthread_mutex_lock(&s->mu);
    rc = room_for(s, 1, p->reserved); /* again: other threads may have filled the queue meanwhile */
    if (rc == SCHED_OK) {
        if (p->reserved && s->n_reserved > 0) s->n_reserved--; /* the place is now n_active's */
        if (p->id && p->id[0]) snprintf(r->id, sizeof r->id, "%s", p->id);
        else snprintf(r->id, sizeof r->id, "req-%llu", (unsigned long long)s->next_id);
        s->next_id++;
        if (s->wait_tail) s->wait_tail->next = r;
        else s->wait_head = r;
        s->wait_tail = r;
        s->n_waiting++;
        s->n_active++;
        /* Sent under s->mu: sched_destroy cannot have closed the handle yet (it sets
         * `stopping` under the same lock before the loop closes anything). */
        uv_async_send(&s->async);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc != SCHED_OK) {
        req_free(r);
        return rc;
    }
    *out = r;
    return SCHED_OK;
}

bool sched_req_take(sched_req *r, sched_output *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->mu);
    bool finish_new = r->finish != SCHED_FINISH_NONE && !r->finish_taken;
    bool any = r->text.len > 0 || r->n_tokens > 0 || finish_new;
    out->text = textbuf_take(&r->text, &out->text_len);
    out->tokens = r->tokens;
    out->n_tokens = r->n_tokens;
    r->tokens = NULL;
    r->n_tokens = r->cap_tokens = 0;
    if (finish_new) {
        out->finish = r->finish;
        r->finish_taken = true;
        if (r->finish == SCHED_FINISH_ERROR) memcpy(out->error, r->error, sizeof out->error);
    }
    out->prompt_tokens = r->n_prompt;
    out->completion_tokens = r->completion_tokens;
    pthread_mutex_unlock(&r->mu);
    return any;
}

/* Asks the scheduler to drop r at its next step.  The async send happens under r->mu while r
 * is unfinished: the scheduler cannot finish r, and so cannot have closed the loop, until we
 * let go of the lock (sched_destroy finishes every request before it closes the handles). */
void sched_req_cancel(sched_req *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->finish == SCHED_FINISH_NONE && !atomic_exchange(&r->cancelled, true)) {
        atomic_fetch_add(&r->s->n_cancels, 1);
        uv_async_send(&r->s->async);
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

/* ---- the scheduler thread ------------------------------------------------------------ */

static sched_req *queue_pop(sched *s)
{
    sched_req *r = s->wait_head;
    if (r) {
        s->wait_head = r->next;
        if (!s->wait_head) s->wait_tail = NULL;
        r->next = NULL;
        s->n_waiting--;
    }
    return r;
}

/* Ends a request: frees its slot (in this very step), publishes the finish, logs, and drops
 * the scheduler's reference. */
static void req_finish(sched *s, sched_req *r, sched_finish why, const char *error)
{
    pthread_mutex_lock(&s->mu);
    s->stats.requests_finished[why]++;
    if (r->slot >= 0) {
        s->n_running--;
        s->kv_used -= (uint64_t)r->n_past;
    }
    pthread_mutex_unlock(&s->mu);
    if (r->slot >= 0) {
        engine_slot_clear(s->e, r->slot);
        s->slots[r->slot] = NULL;
    }
    /* Statistics first, then the finish, then n_active: whoever sees the finish (a client,
     * sched_drain) sees consistent statistics. */
    pthread_mutex_lock(&r->mu);
    r->completion_tokens = r->n_generated;
    r->finish = why;
    if (error) snprintf(r->error, sizeof r->error, "%s", error);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->mu);
    s->n_active--;
    pthread_cond_broadcast(&s->idle_cond);
    pthread_mutex_unlock(&s->mu);
    req_wake(r);

    uint64_t now = uv_hrtime();
    double ttft = r->t_first ? ms_between(r->t_submit, r->t_first) : -1.0;
    /* Debug only: the HTTP layer logs the one line per request (all choices together). */
    log_debug("request %s finished: %s, prompt %d tokens, completion %d tokens, ttft %.1f ms, "
              "total %.1f ms%s%s",
              r->id, finish_names[why], r->n_prompt, r->n_generated, ttft,
              ms_between(r->t_submit, now), error ? ": " : "", error ? error : "");
    req_unref(r);
}

/* Moves new text (and the token, when logprobs were asked for) into the outbox. */
static bool outbox_append(sched_req *r, const textbuf *piece, const sched_token *tok)
{
    bool ok = true;
    pthread_mutex_lock(&r->mu);
    r->completion_tokens = r->n_generated;
    if (piece->len) ok = textbuf_append(&r->text, piece->data, piece->len);
    if (ok && tok) {
        if (r->n_tokens == r->cap_tokens) {
            int cap = r->cap_tokens ? 2 * r->cap_tokens : 16;
            sched_token *t = realloc(r->tokens, (size_t)cap * sizeof *t);
            if (t) {
                r->tokens = t;
                r->cap_tokens = cap;
            }
        }
        if (r->n_tokens < r->cap_tokens) r->tokens[r->n_tokens++] = *tok;
        else ok = false;
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* Makes room in the scratch buffer for the detokenized bytes of token id. */
static bool piece_reserve(sched *s, int32_t id)
{
    size_t len = 0;
    tokenizer_token_text(s->tok, id, &len);
    /* The detokenizer may add its pending tail (< 8 bytes) and needs 16 spare bytes; a token's
     * output bytes never exceed its stored text. */
    int need = (int)len + 32;
    if (need <= s->piece_cap) return true;
    char *p = realloc(s->piece, (size_t)need);
    if (!p) return false;
    s->piece = p;
    s->piece_cap = need;
    return true;
}

/* The outbox record of a sampled token (top alternatives clamped to what fits). */
static sched_token token_record(const engine_result *res)
{
    int n_top = res->n_top < 0 ? 0 : res->n_top;
    if (n_top > ENGINE_MAX_TOP_LOGPROBS) n_top = ENGINE_MAX_TOP_LOGPROBS;
    sched_token tok = {.id = res->token, .logprob = res->logprob, .n_top = n_top};
    memcpy(tok.top_ids, res->top_ids, (size_t)n_top * sizeof *tok.top_ids);
    memcpy(tok.top_logprobs, res->top_logprobs, (size_t)n_top * sizeof *tok.top_logprobs);
    return tok;
}

/* Detokenizes id into the stop matcher; what the matcher releases lands in s->text.  Returns
 * STOP when a stop string completed, else NONE; *oom when memory ran out. */
static sched_finish req_feed_text(sched *s, sched_req *r, int32_t id, bool *oom)
{
    if (!piece_reserve(s, id)) {
        *oom = true;
        return SCHED_FINISH_NONE;
    }
    int n = detok_feed(&r->detok, id, s->piece, s->piece_cap);
    if (n > 0 && stopstr_feed(&r->stop, s->piece, (size_t)n, &s->text, oom)) return SCHED_FINISH_STOP;
    return SCHED_FINISH_NONE;
}

/* The text ends without a stop string (so far): release the detokenizer's incomplete tail and
 * the matcher's held candidate, which may still complete a stop string right here. */
static sched_finish req_end_text(sched *s, sched_req *r, sched_finish why, bool *oom)
{
    int n = detok_flush(&r->detok, s->piece, s->piece_cap);
    if (n > 0 && stopstr_feed(&r->stop, s->piece, (size_t)n, &s->text, oom)) return SCHED_FINISH_STOP;
    if (!*oom && !stopstr_flush(&r->stop, &s->text)) *oom = true;
    return why;
}

/* Turns one sampled token into text and decides whether the request ends here. */
static void req_on_token(sched *s, sched_req *r, const engine_result *res, uint64_t now)
{
    int32_t id = res->token;
    if (r->n_generated == 0) r->t_first = now;
    pthread_mutex_lock(&s->mu);
    if (r->n_generated == 0) hist_observe(&s->stats.ttft, ms_between(r->t_submit, now));
    else hist_observe(&s->stats.itl, ms_between(r->t_last, now));
    s->stats.generated_tokens_total++;
    pthread_mutex_unlock(&s->mu);
    r->t_last = now;
    r->n_generated++;

    if (id < 0 || id >= tokenizer_n_vocab(s->tok)) {
        req_finish(s, r, SCHED_FINISH_ERROR, "engine returned a token id outside the vocabulary");
        return;
    }
    bool eog = !r->ignore_eos && tokenizer_is_eog(s->tok, id);
    bool oom = false;
    s->text.len = 0;
    /* An end-of-generation token ends the text; its own text is never emitted. */
    sched_finish why = eog ? SCHED_FINISH_STOP : req_feed_text(s, r, id, &oom);
    if (why == SCHED_FINISH_NONE && (r->n_generated >= r->max_tokens || r->n_past >= s->cfg.ctx_per_slot))
        why = SCHED_FINISH_LENGTH; /* max_tokens, or no room left to feed id back */
    if (!oom && (eog || why == SCHED_FINISH_LENGTH)) why = req_end_text(s, r, why, &oom);

    sched_token tok = token_record(res);
    if (!oom && !outbox_append(r, &s->text, r->want_logprobs && !eog ? &tok : NULL)) oom = true;
    if (oom) why = SCHED_FINISH_ERROR;
    if (why != SCHED_FINISH_NONE) {
        req_finish(s, r, why, oom ? "out of memory while building the completion text" : NULL);
        return;
    }
    r->last_token = id;
    r->has_pending = true;
    req_wake(r);
}

/* Ends requests (running and waiting) as `why`: the cancelled ones, or with `all` every one. */
static void drop_requests(sched *s, bool all, sched_finish why, const char *error)
{
    for (int i = 0; i < s->cfg.n_slots; i++) {
        sched_req *r = s->slots[i];
        if (r && (all || atomic_load(&r->cancelled))) req_finish(s, r, why, error);
    }
    /* Unlink cancelled waiters under the lock, finish them outside it (req_finish locks).
     * The counter is read before the flags: a cancel that lands after this read bumps it
     * again and is seen at the next step. */
    unsigned cancels = atomic_load(&s->n_cancels);
    if (!all && cancels == s->cancels_seen) return;
    s->cancels_seen = cancels;
    sched_req *dropped = NULL;
    pthread_mutex_lock(&s->mu);
    sched_req **link = &s->wait_head;
    s->wait_tail = NULL;
    while (*link) {
        sched_req *r = *link;
        if (all || atomic_load(&r->cancelled)) {
            *link = r->next;
            r->next = dropped;
            dropped = r;
            s->n_waiting--;
        } else {
            s->wait_tail = r;
            link = &r->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    while (dropped) {
        sched_req *next = dropped->next;
        dropped->next = NULL;
        req_finish(s, dropped, why, error);
        dropped = next;
    }
}

static void drop_cancelled(sched *s, bool all) { drop_requests(s, all, SCHED_FINISH_CANCELLED, NULL); }

/* The engine can run no further step (ENGINE_FATAL): fail every request with its message,
 * refuse new ones, and tell the owner, who exits so the process restarts on a fresh device. */
static void sched_fail(sched *s, const char *error)
{
    log_error("engine failed: %s; failing every request and refusing new ones", error);
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    pthread_mutex_unlock(&s->mu);
    drop_requests(s, true, SCHED_FINISH_ERROR, error);
    if (s->cfg.on_fatal) s->cfg.on_fatal(s->cfg.on_fatal_ctx, error);
}

/* FIFO: the oldest waiting request gets the lowest free slot. */
static void admit(sched *s)
{
    for (int i = 0; i < s->cfg.n_slots; i++) {
        if (s->slots[i]) continue;
        pthread_mutex_lock(&s->mu);
        sched_req *r = queue_pop(s);
        pthread_mutex_unlock(&s->mu);
        if (!r) return;
        r->slot = i;
        r->n_past = 0;
        r->admit_seq = s->admit_counter++;
        detok_init(&r->detok, s->tok, false);
        s->slots[i] = r;
        pthread_mutex_lock(&s->mu);
        s->n_running++;
        pthread_mutex_unlock(&s->mu);
    }
}

static void plan_add(sched *s, int *n, sched_req *r, const int32_t *tokens, int n_tokens, bool want)
{
    s->seqs[*n] = (engine_seq){
        .slot = r->slot,
        .tokens = tokens,
        .n_tokens = n_tokens,
        .pos = r->n_past,
        .want_token = want,
        .sp = &r->sp,
    };
    s->seq_req[*n] = r;
    (*n)++;
}

/* The step's batch: a decode token for every slot past its prompt first (so running streams
 * never stall behind a long prompt), then prompt chunks, oldest admission first, in what is
 * left of the token budget. */
static int plan_step(sched *s)
{
    int n = 0, budget = s->cfg.max_batch_tokens, n_slots = s->cfg.n_slots;
    for (int k = 0; k < n_slots && budget > 0; k++) {
        int i = (s->decode_rr + k) % n_slots;
        sched_req *r = s->slots[i];
        if (r && r->has_pending) {
            plan_add(s, &n, r, &r->last_token, 1, true);
            budget--;
        }
    }
    s->decode_rr = (s->decode_rr + 1) % n_slots;

    /* Prompts still to prefill, oldest admission first (insertion sort: a handful of slots). */
    int n_pre = 0;
    for (int i = 0; i < n_slots; i++) {
        sched_req *r = s->slots[i];
        if (!r || r->n_past >= r->n_prompt) continue;
        int j = n_pre++;
        for (; j > 0 && s->prefill[j - 1]->admit_seq > r->admit_seq; j--) s->prefill[j] = s->prefill[j - 1];
        s->prefill[j] = r;
    }
    for (int k = 0; k < n_pre && budget > 0; k++) {
        sched_req *r = s->prefill[k];
        int chunk = r->n_prompt - r->n_past;
        if (chunk > budget) chunk = budget;
        plan_add(s, &n, r, r->prompt + r->n_past, chunk, r->n_past + chunk == r->n_prompt);
        budget -= chunk;
    }
    return n;
}

/* Applies the outcome of seqs[i] (already computed by the engine). */
static void seq_done(sched *s, int i, uint64_t now)
{
    const engine_seq *q = &s->seqs[i];
    sched_req *r = s->seq_req[i];
    r->n_past += q->n_tokens;
    bool decode = q->tokens == &r->last_token;
    if (decode) r->has_pending = false;
    pthread_mutex_lock(&s->mu);
    s->kv_used += (uint64_t)q->n_tokens;
    if (!decode) s->stats.prompt_tokens_total += (uint64_t)q->n_tokens;
    pthread_mutex_unlock(&s->mu);
    if (q->want_token) req_on_token(s, r, &s->results[i], now);
}

/* A failed step leaves every slot untouched (engine.h), so each sequence can be retried on
 * its own: the ones the engine can run continue, only the failing ones end with the error. */
static void step_isolate_failure(sched *s, int n, const char *batch_err)
{
    char err[256];
    for (int i = 0; i < n; i++) {
        const char *msg = batch_err;
        if (n > 1) {
            int rc = engine_step(s->e, &s->seqs[i], 1, &s->results[i], err, sizeof err);
            if (rc == 0) {
                seq_done(s, i, uv_hrtime());
                continue;
            }
            if (rc == ENGINE_FATAL) {
                sched_fail(s, err);
                return;
            }
            msg = err;
        }
        log_warn("request %s: engine step failed: %s", s->seq_req[i]->id, msg);
        req_finish(s, s->seq_req[i], SCHED_FINISH_ERROR, msg);
    }
}

/* Debug log of what a step carries (which request, slot, positions): enough to replay a
 * step composition against the engine alone.  Formatted only when debug logging is on. */
static void log_step(const sched *s, int n)
{
    if (log_get_level() > LOG_DEBUG) return;
    char line[1024];
    size_t len = (size_t)snprintf(line, sizeof line, "step %llu: %d seqs:", (unsigned long long)s->stats.steps + 1, n);
    for (int i = 0; i < n && len < sizeof line; i++) {
        const engine_seq *q = &s->seqs[i];
        len += (size_t)snprintf(line + len, sizeof line - len, " %s@%d[%d+%d]%s", s->seq_req[i]->id, q->slot, q->pos,
                                q->n_tokens, q->want_token ? "" : "-");
    }
    log_debug("%s", line);
}

/* One scheduling step.  Returns true while there is work left. */
static bool sched_step(sched *s)
{
    pthread_mutex_lock(&s->mu);
    bool all = s->cancel_all;
    pthread_mutex_unlock(&s->mu);
    drop_cancelled(s, all);
    admit(s);
    int n = plan_step(s);
    if (n > 0) {
        char err[256] = "";
        log_step(s, n);
        int rc = engine_step(s->e, s->seqs, n, s->results, err, sizeof err);
        /* Counted before any result is delivered: a client that has seen its last token
         * must also see the step that produced it in the stats. */
        pthread_mutex_lock(&s->mu);
        s->stats.steps++;
        pthread_mutex_unlock(&s->mu);
        if (rc == 0) {
            uint64_t now = uv_hrtime();
            for (int i = 0; i < n; i++) seq_done(s, i, now);
        } else if (rc == ENGINE_FATAL) {
            sched_fail(s, err);
        } else {
            step_isolate_failure(s, n, err);
        }
    }
    pthread_mutex_lock(&s->mu);
    bool more = s->n_active > 0;
    pthread_mutex_unlock(&s->mu);
    return more;
}

/* glibc keeps what the HTTP threads' arenas freed after a burst of requests: under a 64-client
 * load RSS stayed ~90 % above its idle level for good, which hides real leaks and reads as one.
 * Once the loop has had nothing to do for a while, hand the free pages back.  It runs once per
 * idle period, never between steps. */
#define SCHED_TRIM_MS 1000

static void on_trim(uv_timer_t *h)
{
    (void)h;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

static void on_idle(uv_idle_t *h)
{
    sched *s = h->data;
    if (!sched_step(s)) {
        uv_idle_stop(h);
        uv_timer_start(&s->trim, on_trim, SCHED_TRIM_MS, 0);
    }
}

static void on_beat(uv_timer_t *h)
{
    sched *s = h->data;
    s->cfg.heartbeat(s->cfg.heartbeat_ctx);
}

static void close_handles(sched *s)
{
    uv_close((uv_handle_t *)&s->idle, NULL);
    uv_close((uv_handle_t *)&s->async, NULL);
    uv_close((uv_handle_t *)&s->beat, NULL);
    uv_close((uv_handle_t *)&s->trim, NULL);
}

static void on_async(uv_async_t *h)
{
    sched *s = h->data;
    pthread_mutex_lock(&s->mu);
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (stopping) {
        drop_cancelled(s, true);
        close_handles(s);
        return;
    }
    if (!uv_is_active((uv_handle_t *)&s->idle)) {
        uv_timer_stop(&s->trim);
        uv_idle_start(&s->idle, on_idle);
    }
}

static void *sched_thread(void *arg)
{
    sched *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

static void sched_free_memory(sched *s)
{
    free(s->slots);
    free(s->seqs);
    free(s->results);
    free(s->seq_req);
    free(s->prefill);
    free(s->piece);
    textbuf_free(&s->text);
    free(s);
}

sched *sched_create(engine *e, const tokenizer *tok, const sched_config *cfg, char *err,
                    size_t errlen)
{
    if (!e || !tok || !cfg) {
        snprintf(err, errlen, "sched: engine, tokenizer and config are required");
        return NULL;
    }
    if (cfg->n_slots < 1 || cfg->ctx_per_slot < 2 || cfg->max_batch_tokens < 1 || cfg->queue_size < 0) {
        snprintf(err, errlen,
                 "sched: bad config (n_slots %d, ctx_per_slot %d, max_batch_tokens %d, queue_size %d)",
                 cfg->n_slots, cfg->ctx_per_slot, cfg->max_batch_tokens, cfg->queue_size);
        return NULL;
    }
    if (cfg->n_slots != e->cfg.n_slots || cfg->ctx_per_slot != e->cfg.ctx_per_slot ||
        cfg->max_batch_tokens > e->cfg.max_batch_tokens) {
        snprintf(err, errlen,
                 "sched: config (n_slots %d, ctx_per_slot %d, max_batch_tokens %d) does not match the "
                 "engine (%d, %d, at most %d)",
                 cfg->n_slots, cfg->ctx_per_slot, cfg->max_batch_tokens, e->cfg.n_slots,
                 e->cfg.ctx_per_slot, e->cfg.max_batch_tokens);
        return NULL;
    }
    sched *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "sched: out of memory");
        return NULL;
    }
    size_t n = (size_t)cfg->n_slots;
    s->e = e;
    s->tok = tok;
    s->cfg = *cfg;
    s->stats.n_slots = cfg->n_slots;
    s->slots = calloc(n, sizeof *s->slots);
    s->seqs = calloc(n, sizeof *s->seqs);
    s->results = calloc(n, sizeof *s->results);
    s->seq_req = calloc(n, sizeof *s->seq_req);
    s->prefill = calloc(n, sizeof *s->prefill);
    if (!s->slots || !s->seqs || !s->results || !s->seq_req || !s->prefill) {
        snprintf(err, errlen, "sched: out of memory");
        goto fail;
    }
    int rc = uv_loop_init(&s->loop);
    if (rc != 0) {
        snprintf(err, errlen, "sched: uv_loop_init: %s", uv_strerror(rc));
        goto fail;
    }
    uv_async_init(&s->loop, &s->async, on_async);
    uv_idle_init(&s->loop, &s->idle);
    uv_timer_init(&s->loop, &s->beat);
    uv_timer_init(&s->loop, &s->trim);
    s->async.data = s;
    s->idle.data = s;
    s->beat.data = s;
    if (cfg->heartbeat && cfg->heartbeat_ms > 0)
        uv_timer_start(&s->beat, on_beat, cfg->heartbeat_ms, cfg->heartbeat_ms);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle_cond, NULL);
    atomic_init(&s->n_cancels, 0);
    if ((rc = pthread_create(&s->thread, NULL, sched_thread, s)) != 0) {
        snprintf(err, errlen, "sched: cannot start the scheduler thread: %s", strerror(rc));
        close_handles(s);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->idle_cond);
        goto fail;
    }
    return s;
fail:
    sched_free_memory(s);
    return NULL;
}

void sched_destroy(sched *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    uv_async_send(&s->async);
    pthread_join(s->thread, NULL);
    uv_loop_close(&s->loop);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle_cond);
    sched_free_memory(s);
}

void sched_begin_shutdown(sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    pthread_mutex_unlock(&s->mu);
}

/* Absolute CLOCK_REALTIME deadline timeout_ms from now, for pthread_cond_timedwait. */
static struct timespec deadline_in(int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

void sched_drain(sched *s, int timeout_ms)
{
    struct timespec until = deadline_in(timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    while (s->n_active > 0)
        if (pthread_cond_timedwait(&s->idle_cond, &s->mu, &until) != 0) break;
    if (s->n_active > 0) {
        log_warn("drain: %d requests still running after %d ms, cancelling them", s->n_active,
                 timeout_ms);
        s->cancel_all = true;
        uv_async_send(&s->async);
        /* Cancellation takes effect at the next step: bounded by one engine step. */
        while (s->n_active > 0) pthread_cond_wait(&s->idle_cond, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

void sched_get_stats(sched *s, sched_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->slots_used = s->n_running;
    out->queue_depth = s->n_waiting;
    out->kv_tokens_used = s->kv_used;
    pthread_mutex_unlock(&s->mu);
}
