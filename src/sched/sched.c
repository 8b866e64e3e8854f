/* sched.c - the continuous-batching scheduler proper (see sched.h): the waiting queue,
 * admission by free rows and free KV blocks, preemption when blocks run out, the plan of each
 * step, the engine call, and the loop.  A request's hand-off and outbox are request.c;
 * turning its tokens into text is output.c; which blocks hold what is kvcache.c.
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

#include "base/log.h"
#include "base/timing.h"
#include "proposer.h"
#include "request.h"
#include "statecache.h"
#include "stats.h"



/* Speculation's off-switch by batch size (spec_gate_allows): the decode tokens per second of
 * steps that verified drafts and of steps that did not, an average of the last ~8 of each, per
 * bucket of decode rows (1, 2-3, 4-7, ... 128+). */
#define SPEC_GATE_BUCKETS 8
typedef struct spec_gate {
    double rate[2]; /* [0] plain steps, [1] steps with a verification */
    int n[2];       /* steps timed, up to SPEC_GATE_WARM */
    unsigned steps; /* steps planned in this bucket since the last probe (the probes' clock) */
    unsigned probe; /* steps between probes: doubles while probes confirm the verdict */
    int verdict;    /* -1 none yet, 0 plain, 1 speculate */
} spec_gate;

struct sched {
    engine *e;
    const tokenizer *tok;
    grammar_vocab *gvocab; /* the tokenizer's bytes for grammar masks */
    int mask_words;
    double step_mask_ms; /* what masks built since this step began took (req_next_mask) */
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
    int n_places; /* of them, those that count toward sched_capacity (sched_params.shares_place) */
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
    sched_req **prefill; /* plan_step / running_by_age scratch */
    kvcache *kv;         /* the engine's KV blocks: tables, prefix cache */
    /* The engine's sliding-layer pool (engine_kv_blocks_swa; NULL without one) and its window:
     * a request's blocks before its next query's window are let go (docs/sliding-kv.md). */
    kvcache *kv_swa;
    int swa_window;
    statecache *states;  /* a hybrid model's recurrent-state slots and snapshots; NULL otherwise */
    /* Speculating on a hybrid: engine state slots spec_backup + row hold each row's state from
     * before its verification (spec_rewind), outside the statecache's (-1: none). */
    int spec_backup;
    /* A proposer that observes the target's steps (mtp): each row's final hidden states of a
     * step, [slot][max_batch_tokens][n_embd], and the step's observations; NULL otherwise. */
    float *spec_hidden;
    proposer_obs *spec_obs;
    int max_ctx;         /* sched_max_context */
    int decode_rr;       /* round-robin start when decodes alone exceed the budget */
    int embed_credit;    /* prefill-only tokens steps with decodes may still carry (plan_step) */
    uint64_t admit_counter;
    output_scratch scratch; /* the text pipeline's buffers, shared by every request */
    /* Speculative decoding, per row (cfg.draft_max + 1 entries each): the tokens a
     * verification feeds (the pending one, then the drafts), its samples, and its masks
     * (mask_words each while built, then packed to the engine's width). */
    int32_t *spec_tokens;
    engine_result *spec_samples;
    uint32_t *spec_masks;
    proposer *prop;           /* the drafter (cfg.spec), NULL when off */
    proposer_row *spec_rows;  /* plan_step's drafting rows, n_slots */
    int *spec_seq;            /* the planned decode of spec_rows[i] */
    spec_gate gate[SPEC_GATE_BUCKETS]; /* by the step's decode rows: plain against speculating */
    int step_decodes;         /* plan_step: the step's decode rows (0 when it carries prompt tokens too) */
    double step_t0;           /* plan_step's start (before any drafting), timing_now_s */
    int step_tokens;          /* spec_gate_count: the step's decode tokens, -1: not timed */
    bool step_verified;
};

/* ---- submit side (HTTP threads) ---------------------------------------------------- */

/* SCHED_OK, or why a new request is refused.  The bound counts running requests too, so a
 * burst arriving before the scheduler thread admitted anything still fills the free slots.
 * Called with s->mu held. */
static int room_for(const sched *s, int n, bool reserved)
{
    if (s->shutdown) return SCHED_E_SHUTDOWN;
    if (!reserved && s->n_places + s->n_reserved + n > sched_capacity(s)) return SCHED_E_QUEUE_FULL;
    return SCHED_OK;
}

int sched_capacity(const sched *s) { return s->cfg.n_slots + s->cfg.queue_size; }

int sched_max_context(const sched *s) { return s->max_ctx; }

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
    if ((int64_t)p->n_prompt + (p->max_tokens > 1 ? p->max_tokens : 1) > s->max_ctx)
        return SCHED_E_TOO_LONG;
    if (p->max_tokens < 1) return SCHED_E_INVALID;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= tokenizer_n_vocab(s->tok)) return SCHED_E_INVALID;
    if (p->embed && p->n_prompt > s->cfg.max_batch_tokens) return SCHED_E_TOO_LONG; /* runs in one step */
    if (p->embed && (unsigned)p->embed->pooling >= ENGINE_POOL_COUNT) return SCHED_E_INVALID;
    if (p->shares_place && !p->embed) return SCHED_E_INVALID;
    bool counted = !p->shares_place;

    /* Cheap refusals first, so an overloaded server does not copy prompts it will drop. */
    pthread_mutex_lock(&s->mu);
    int rc = room_for(s, 1, p->reserved || !counted);
    pthread_mutex_unlock(&s->mu);
    if (rc != SCHED_OK) return rc;

    sched_req *r = req_new(s, p, wake, wake_ctx);
    if (!r) return SCHED_E_INVALID;
    r->speculate = s->cfg.spec != SCHED_SPEC_OFF && !p->no_speculative && !p->embed;
    r->spec_k = s->cfg.draft_max;
    if (p->embed) {
        r->embed = true;
        r->em = *p->embed;
        r->n_emb = engine_embed_floats(s->e, r->em.pooling, p->n_prompt);
        r->em.out = r->emb = malloc(r->n_emb * sizeof(float));
        if (!r->emb) {
            req_free(r);
            return SCHED_E_INVALID;
        }
    }

    pthread_mutex_lock(&s->mu);
    rc = room_for(s, 1, p->reserved || !counted); /* again: other threads may have filled the queue meanwhile */
    if (rc == SCHED_OK) {
        if (counted && p->reserved && s->n_reserved > 0) s->n_reserved--; /* the place is now n_places' */
        r->holds_place = counted;
        s->n_places += counted;
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

void sched_note_cancel(sched *s)
{
    atomic_fetch_add(&s->n_cancels, 1);
    uv_async_send(&s->async);
}

/* ---- the scheduler thread ------------------------------------------------------------ */

/* Takes r out of the waiting queue; prev is the waiting request just before it (NULL: r is the
 * head).  s->mu held: HTTP threads append at the tail meanwhile. */
static void queue_unlink(sched *s, sched_req *prev, sched_req *r)
{
    if (prev) prev->next = r->next;
    else s->wait_head = r->next;
    if (s->wait_tail == r) s->wait_tail = prev;
    r->next = NULL;
    s->n_waiting--;
}

/* The pool's block counts into the statistics; s->mu held. */
static void publish_kv_counts(sched *s)
{
    kvcache_counts kc = kvcache_count(s->kv);
    s->stats.kv_blocks_used = kc.used;
    s->stats.kv_blocks_cached = kc.cached;
    s->stats.kv_blocks_free = kc.free;
    if (s->kv_swa) {
        kvcache_counts sc = kvcache_count(s->kv_swa);
        s->stats.kv_swa_blocks_used = sc.used;
        s->stats.kv_swa_blocks_cached = sc.cached;
        s->stats.kv_swa_blocks_free = sc.free;
    }
    if (s->states) {
        statecache_counts sc = statecache_count(s->states);
        s->stats.state_slots_running = sc.running;
        s->stats.state_snapshots = sc.snapshots;
    }
}

/* r's blocks go back to both pools. */
static void release_blocks(sched *s, sched_req *r)
{
    if (r->kv.blocks) kvcache_release(s->kv, &r->kv); /* full blocks stay cached for others */
    if (r->kv_swa.blocks) { /* the oldest first: the latest window is the last evicted */
        kvcache_drop_before(s->kv_swa, &r->kv_swa, r->kv_swa.n_blocks);
        kvcache_release(s->kv_swa, &r->kv_swa);
    }
}

/* r leaves its row (finished or preempted): its blocks and its state slot go back. */
static void release_memory(sched *s, sched_req *r)
{
    release_blocks(s, r);
    if (r->state >= 0) statecache_put(s->states, r->state);
    r->state = -1;
    r->snap_slot = -1;
    r->share_at = 0;
}

/* Ends a request: frees its slot (in this very step), publishes the finish, logs, and drops
 * the scheduler's reference. */
static void req_finish(sched *s, sched_req *r, sched_finish why, const char *error)
{
    release_memory(s, r);
    pthread_mutex_lock(&s->mu);
    publish_kv_counts(s);
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
    req_outbox_finish(r, why, error);
    pthread_mutex_lock(&s->mu);
    s->n_active--;
    s->n_places -= r->holds_place;
    pthread_cond_broadcast(&s->idle_cond);
    pthread_mutex_unlock(&s->mu);
    req_wake(r);

    uint64_t now = uv_hrtime();
    double ttft = r->t_first ? stats_ms_between(r->t_submit, r->t_first) : -1.0;
    /* Debug only: the HTTP layer logs the one line per request (all choices together). */
    log_debug("request %s finished: %s, prompt %d tokens, completion %d tokens, ttft %.1f ms, "
              "total %.1f ms%s%s",
              r->id, sched_finish_name(why), r->n_prompt, r->n_generated, ttft,
              stats_ms_between(r->t_submit, now), error ? ": " : "", error ? error : "");
    req_unref(r);
}

const grammar_vocab *sched_grammar_vocab(const sched *s) { return s->gvocab; }
int sched_mask_words(const sched *s) { return s->mask_words; }

/* The allowed tokens of a constrained request's next sample.  Most masks come from the
 * grammar's cache in microseconds, but the first one in a new state walks the vocabulary (tens
 * of milliseconds on a large one) and a hostile grammar's can take far longer, on this thread,
 * which every running request waits for.  So a mask gets a slice of time; one that is not done
 * within it stays pending (what was built is kept), the request sits out the step
 * (plan_step) and tries again the next one with a slice twice as long, so that a mask that
 * needs T ms is done within about 2T.  The masks of one step share SCHED_MASK_SLICE_MAX_MS:
 * once it is spent, the others get SCHED_MASK_SLICE_MIN_MS (enough for a cached mask) and
 * keep their slice for a later step, so no step waits much more than that for masks however
 * many requests are building one.  A mask still not done after SCHED_MASK_TOTAL_MS ends its
 * request.  false: the request has been finished. */
#define SCHED_MASK_SLICE_MS 2.0
#define SCHED_MASK_SLICE_MAX_MS 128.0
#define SCHED_MASK_SLICE_MIN_MS 0.05
#define SCHED_MASK_TOTAL_MS 20000.0

static const char GRAMMAR_TOO_COMPLEX[] =
    "the grammar is too ambiguous here: following it takes more than the matcher's budget";

static bool req_next_mask(sched *s, sched_req *r)
{
    double slice = SCHED_MASK_SLICE_MS, left = SCHED_MASK_SLICE_MAX_MS - s->step_mask_ms;
    for (int i = 0; i < r->mask_tries && slice < SCHED_MASK_SLICE_MAX_MS; i++) slice *= 2;
    bool whole = slice <= left; /* else a cut slice, which does not count as a try */
    if (!whole) slice = left > SCHED_MASK_SLICE_MIN_MS ? left : SCHED_MASK_SLICE_MIN_MS;
    double t0 = timing_now_ms();
    int n = grammar_matcher_fill_mask_until(r->gm, r->mask, t0 + slice);
    double spent = timing_now_ms() - t0;
    s->step_mask_ms += spent;
    r->mask_pending = n == GRAMMAR_MASK_LATER;
    if (n > 0) {
        r->mask_tries = 0;
        r->mask_ms = 0;
        return true;
    }
    char err[160];
    if (r->mask_pending) {
        r->mask_tries += whole;
        r->mask_ms += spent;
        if (r->mask_ms <= SCHED_MASK_TOTAL_MS) return true;
        snprintf(err, sizeof err, "the grammar's allowed tokens took more than %.0f s to compute here",
                 SCHED_MASK_TOTAL_MS / 1000);
    } else {
        snprintf(err, sizeof err, "%s",
                 n == GRAMMAR_MASK_TOO_COMPLEX ? GRAMMAR_TOO_COMPLEX : "the grammar allows no token of this vocabulary here");
    }
    req_finish(s, r, SCHED_FINISH_ERROR, err);
    return false;
}

/* Whether r may sample in this step: its mask is built (retried here when pending). */
static bool req_mask_ready(sched *s, sched_req *r)
{
    return !r->gm || !r->mask_pending || (req_next_mask(s, r) && !r->mask_pending);
}

/* Turns one sampled token into text and decides whether the request ends here. */
static void req_on_token(sched *s, sched_req *r, const engine_result *res, uint64_t now)
{
    int32_t id = res->token;
    if (r->n_generated == 0) r->t_first = now;
    pthread_mutex_lock(&s->mu);
    if (r->n_generated == 0) stats_observe(&s->stats.ttft, stats_ms_between(r->t_submit, now));
    else stats_observe(&s->stats.itl, stats_ms_between(r->t_last, now));
    s->stats.generated_tokens_total++;
    pthread_mutex_unlock(&s->mu);
    r->t_last = now;
    r->n_generated++;

    if (id < 0 || id >= tokenizer_n_vocab(s->tok)) {
        req_finish(s, r, SCHED_FINISH_ERROR, "engine returned a token id outside the vocabulary");
        return;
    }
    if (r->gm && !grammar_matcher_accept(r->gm, id)) { /* the mask makes this impossible */
        req_finish(s, r, SCHED_FINISH_ERROR,
                   grammar_matcher_too_complex(r->gm)
                       ? GRAMMAR_TOO_COMPLEX
                       : "the engine sampled a token outside the grammar");
        return;
    }
    bool eog = !r->ignore_eos && tokenizer_is_eog(s->tok, id);
    /* The grammar is complete and nothing may follow: this token's text is the last. */
    bool grammar_done = r->gm && grammar_matcher_is_done(r->gm);
    /* max_tokens, or no room left to feed id back */
    bool at_length = r->n_generated >= r->max_tokens || r->n_past >= s->max_ctx;
    bool oom = false;
    sched_finish why = output_token(&r->out, &s->scratch, s->tok, id, eog, at_length || grammar_done, &oom);
    if (grammar_done && why == SCHED_FINISH_LENGTH && !at_length) why = SCHED_FINISH_STOP;
    if (!oom && !req_outbox_append(r, &s->scratch.text, r->want_logprobs && !eog ? res : NULL)) oom = true;
    if (oom) why = SCHED_FINISH_ERROR;
    if (why != SCHED_FINISH_NONE) {
        req_finish(s, r, why, oom ? "out of memory while building the completion text" : NULL);
        return;
    }
    r->last_token = id;
    r->toks[r->n_toks++] = id; /* room: n_generated < max_tokens here */
    r->has_pending = true;
    if (r->gm && !req_next_mask(s, r)) return;
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

/* Tokens to compute before the request samples or decodes: its prompt, or after a preemption
 * every token it had fed (all but the pending last one, which the next decode feeds). */
static int prefill_target(const sched_req *r) { return r->n_generated ? r->n_toks - 1 : r->n_prompt; }
static bool prefilling(const sched_req *r) { return r->n_past < prefill_target(r); }

/* Running requests, oldest admission first, into s->prefill (insertion sort: a handful of
 * rows).  Returns how many. */
static int running_by_age(sched *s)
{
    int n = 0;
    for (int i = 0; i < s->cfg.n_slots; i++) {
        sched_req *r = s->slots[i];
        if (!r) continue;
        int j = n++;
        for (; j > 0 && s->prefill[j - 1]->admit_seq > r->admit_seq; j--) s->prefill[j] = s->prefill[j - 1];
        s->prefill[j] = r;
    }
    return n;
}

/* Sends a running request back to the head of the queue: its blocks go back to the pool (the
 * full ones stay cached, so its recomputation is mostly a prefix hit), and it is recomputed
 * from its tokens when admitted again.  Its text pipeline, outbox and sampled tokens are kept,
 * and sampling is a function of (seed, position): the stream only pauses. */
static void preempt(sched *s, sched_req *r)
{
    log_info("request %s: preempted at %d tokens (KV blocks ran out), to be recomputed", r->id, r->n_past);
    release_memory(s, r);
    engine_slot_clear(s->e, r->slot);
    s->slots[r->slot] = NULL;
    r->slot = -1;
    pthread_mutex_lock(&s->mu);
    s->n_running--;
    s->kv_used -= (uint64_t)r->n_past;
    s->stats.preemptions++;
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail) s->wait_tail = r;
    s->n_waiting++;
    pthread_mutex_unlock(&s->mu);
    r->n_past = 0;
    r->spec_refeed = false;
}

/* r's tables cover positions 0..n_tokens-1: full blocks, and sliding ones from the window on
 * (those before it were let go, kvcache_drop_before).  False when either pool is short; the
 * full table may have grown then. */
static bool grow_blocks(sched *s, sched_req *r, int n_tokens)
{
    return kvcache_grow(s->kv, &r->kv, n_tokens) && (!s->kv_swa || kvcache_grow(s->kv_swa, &r->kv_swa, n_tokens));
}

/* r's blocks past its first n_tokens positions go back, in both pools (drafts cut or not
 * verified). */
static void release_blocks_past(sched *s, sched_req *r, int n_tokens)
{
    kvcache_truncate(s->kv, &r->kv, n_tokens);
    if (s->kv_swa) kvcache_truncate(s->kv_swa, &r->kv_swa, n_tokens);
}

/* r's positions 0..n_tokens-1 are computed: its full blocks among them go into the prefix
 * index of each pool (before the sliding ones out of the window are let go, so those stay
 * cached). */
static void commit_blocks(sched *s, sched_req *r, int n_tokens)
{
    if (s->cfg.no_prefix_cache) return;
    kvcache_commit(s->kv, &r->kv, r->toks, n_tokens);
    if (s->kv_swa) kvcache_commit(s->kv_swa, &r->kv_swa, r->toks, n_tokens);
}

/* After r's positions up to n_past are computed and committed: its sliding blocks that end
 * before the first key of its next query (position n_past) go back.  A decoding sequence so
 * holds engine_swa_blocks_held() of them. */
static void drop_out_of_window(sched *s, sched_req *r)
{
    if (s->kv_swa) kvcache_drop_before(s->kv_swa, &r->kv_swa, engine_swa_first_block(r->n_past, s->swa_window));
}

/* Every running sequence about to decode needs a block for its next position.  When the pool
 * runs dry, the most recently admitted running sequence is preempted, until the request
 * asking fits or is itself the one preempted: the oldest always progresses. */
static void reserve_decode_blocks(sched *s)
{
    int n = running_by_age(s);
    for (int k = 0; k < n; k++) {
        sched_req *r = s->prefill[k];
        if (!r || !r->has_pending || prefilling(r)) continue;
        while (!grow_blocks(s, r, r->n_past + 1)) {
            int v = n - 1;
            while (!s->prefill[v]) v--; /* r itself is there: the loop ends */
            sched_req *victim = s->prefill[v];
            s->prefill[v] = NULL;
            preempt(s, victim);
            if (victim == r) break;
        }
    }
}

enum { PLACE_OK, PLACE_WAIT, PLACE_FAILED, PLACE_FATAL };

/* place_blocks for a hybrid model: cached K/V are only usable with the recurrent state at
 * their end, so the prefix reused is the longest one that has both: cached blocks and a state
 * snapshot (statecache.h) at a block boundary, shorter than the prompt (its last position is
 * always computed, for its logits: no copy-on-write).  A prompt whose cached blocks reach
 * further than its longest snapshot falls back to that snapshot (the blocks past it are
 * given back and recomputed, and a snapshot is taken at their end this time); without one it is
 * computed from position 0.  r also takes a state slot, the snapshot copied into it. */
static int place_hybrid(sched *s, sched_req *r, int *start, char *err, size_t errlen)
{
    int target = prefill_target(r), hit = 0, snap = -1, at = 0;
    if (!s->cfg.no_prefix_cache && !r->embed) { /* embeddings neither read nor fill the cache */
        hit = kvcache_match(s->kv, &r->kv, r->toks, target - 1);
        snap = hit > 0 ? statecache_lookup(s->states, r->toks, hit, &at) : -1;
        if (snap < 0) at = 0;
        /* Blocks past the snapshot: others computed that prefix too (a shared system prompt),
         * so this request leaves a snapshot at its end for the ones after it. */
        r->share_at = hit > at ? hit : 0;
        if (at < hit) {
            kvcache_release(s->kv, &r->kv);
            if (at > 0) kvcache_match(s->kv, &r->kv, r->toks, at); /* the chain is there: at positions */
        }
    }
    *start = at;
    if (!kvcache_grow(s->kv, &r->kv, target + !r->embed)) {
        kvcache_release(s->kv, &r->kv);
        return PLACE_WAIT;
    }
    r->state = statecache_take(s->states); /* a row is free, so a slot is (statecache_create) */
    int rc = r->state < 0 ? ENGINE_EINVAL : snap >= 0 ? engine_state_copy(s->e, r->state, snap, err, errlen) : 0;
    if (r->state < 0) snprintf(err, errlen, "no recurrent-state slot left for a free row");
    if (rc != 0) {
        release_memory(s, r);
        return rc == ENGINE_FATAL ? PLACE_FATAL : PLACE_FAILED;
    }
    return PLACE_OK;
}

/* A hit on a model with a sliding pool: the sliding layers' K/V of the hit's window must still
 * be cached too (kvcache_match_window), else the positions after it cannot be computed.  The
 * hit is cut to the longest prefix that has both, and the full blocks past it go back (they
 * are recomputed).  r's sliding table gets that window's blocks. */
static int match_window(sched *s, sched_req *r, int hit)
{
    int at = kvcache_match_window(s->kv_swa, &r->kv_swa, r->toks, hit, s->swa_window);
    if (at < hit) {
        kvcache_release(s->kv, &r->kv);
        if (at > 0) kvcache_match(s->kv, &r->kv, r->toks, at); /* the chain is there: at positions */
    }
    return at;
}

/* Copy-on-write of entry `index` of r's table in one pool (swa: the sliding one). */
static int place_cow(sched *s, sched_req *r, bool swa, int index, char *err, size_t errlen)
{
    kv_seq *q = swa ? &r->kv_swa : &r->kv;
    int32_t src;
    int cow = kvcache_cow(swa ? s->kv_swa : s->kv, q, index, &src);
    if (cow <= 0) return cow < 0 ? PLACE_WAIT : PLACE_OK;
    int rc = swa ? engine_kv_copy_swa(s->e, q->blocks[index], src, err, errlen)
                 : engine_kv_copy(s->e, q->blocks[index], src, err, errlen);
    return rc == 0 ? PLACE_OK : rc == ENGINE_FATAL ? PLACE_FATAL : PLACE_FAILED;
}

/* Gives r (a waiting request) blocks for what it must compute plus its next token: the longest
 * cached prefix first, fresh blocks for the rest.  A prompt that is cached whole still
 * computes its last position (its logits are the first sample), in a private copy of the last
 * block (copy-on-write).  PLACE_WAIT: too few blocks now, r keeps nothing.  Sliding blocks
 * past the hit's window are taken chunk by chunk as the prompt is computed (plan_step). */
static int place_blocks(sched *s, sched_req *r, int *start, char *err, size_t errlen)
{
    if ((!r->kv.blocks && !kv_seq_init(&r->kv, s->kv)) ||
        (s->kv_swa && !r->kv_swa.blocks && !kv_seq_init(&r->kv_swa, s->kv_swa))) {
        snprintf(err, errlen, "out of memory for the request's block table");
        return PLACE_FAILED;
    }
    if (s->states) return place_hybrid(s, r, start, err, errlen);
    int target = prefill_target(r);
    /* an embedding computes its whole prompt (an encoder's K/V are no causal prefix) and no
     * token follows it */
    int hit = s->cfg.no_prefix_cache || r->embed ? 0 : kvcache_match(s->kv, &r->kv, r->toks, target);
    if (hit > 0 && s->kv_swa) hit = match_window(s, r, hit);
    *start = hit == target && r->n_generated == 0 ? target - 1 : hit;
    if (!kvcache_grow(s->kv, &r->kv, target + !r->embed)) {
        release_blocks(s, r);
        return PLACE_WAIT;
    }
    int rc = PLACE_OK;
    for (int swa = 0; swa <= (s->kv_swa != NULL) && *start < hit && rc == PLACE_OK; swa++)
        rc = place_cow(s, r, swa, *start / ENGINE_KV_BLOCK, err, errlen);
    if (rc != PLACE_OK) release_blocks(s, r);
    return rc;
}

/* Whether r shares full blocks with a running request that has not computed them yet.  Blocks
 * are indexed only once computed, so r admitted now would compute that prefix a second time
 * (64 requests arriving together with one system prompt would compute it 64 times); a few
 * steps later it reads it from the cache.  The running request always progresses, so the
 * wait is bounded by its prefill.  Unrelated requests are not held up: admit() passes r.
 * admit() asks this of every waiting request it considers, so the comparison stops at the
 * first block q still lacks: r shares an uncomputed full block of q exactly when the tokens
 * up to that block's end match. */
static bool prefix_in_flight(sched *s, const sched_req *r)
{
    if (s->cfg.no_prefix_cache || r->embed) return false; /* embeddings neither read nor fill the cache */
    int target = prefill_target(r);
    for (int i = 0; i < s->cfg.n_slots; i++) {
        const sched_req *q = s->slots[i];
        if (!q || q->embed) continue;
        int n = target < q->n_toks ? target : q->n_toks;
        int need = (q->n_past / ENGINE_KV_BLOCK + 1) * ENGINE_KV_BLOCK; /* end of q's first uncomputed block */
        if (need <= n && !memcmp(q->toks, r->toks, (size_t)need * sizeof *r->toks)) return true;
    }
    return false;
}

/* r takes row `row` with its blocks placed (place_blocks) and `start` positions cached. */
static void admit_into(sched *s, sched_req *r, int row, int start)
{
    r->slot = row;
    r->n_past = start;
    if (s->prop) proposer_reset(s->prop, row); /* whatever drafted for the row's last occupant is stale */
    if (!r->started) { /* a preempted request keeps its text pipeline and its age */
        r->started = true;
        r->admit_seq = s->admit_counter++;
        output_start(&r->out, s->tok);
        pthread_mutex_lock(&r->mu);
        r->cached_tokens = start;
        pthread_mutex_unlock(&r->mu);
    }
    s->slots[row] = r;
    pthread_mutex_lock(&s->mu);
    s->n_running++;
    s->kv_used += (uint64_t)start;
    if (!r->embed) { /* embeddings neither read nor fill the cache */
        s->stats.prefix_lookup_tokens += (uint64_t)prefill_target(r);
        s->stats.prefix_hit_tokens += (uint64_t)start;
    }
    pthread_mutex_unlock(&s->mu);
    if (r->gm) req_next_mask(s, r); /* the first sample's mask (finishes r when empty) */
}

/* Admission: first-fit over the waiting queue in order, with a bound on how often the oldest
 * waiting request (the head) may be passed.
 *
 * Each waiting request, oldest first, takes the lowest free row once the pool has blocks for
 * what it must compute (place_blocks) and no running request is still computing its prefix
 * (prefix_in_flight); one that cannot be admitted now keeps its place and the walk goes on.
 * Strict FIFO left memory idle: a long prompt at the head that did not fit the free blocks
 * held back every shorter request behind it that would have fit, so concurrency stayed near
 * what the long prompts alone allow (2.6x the old per-slot design on bench_kv.py capacity).
 *
 * Passing must not starve the head, which needs more blocks at once than the short requests
 * that keep taking whatever frees up.  Every admission past it counts (r->passed); once it has
 * been passed max_head_passes times (default n_slots), nothing more is admitted until it is,
 * so the blocks that running requests free accumulate for it.  Running requests finish
 * within their max_tokens, so its wait is bounded.  Only the head counts:
 * a request further back becomes the head once those before it are admitted, and the same
 * bound holds from then on.  A preempted request, which preempt() puts back at the head, is
 * never passed: its stream is paused mid-way, and a newer request admitted before it would
 * be the next one preempted when blocks run short again, its prefill wasted.
 *
 * A request reserves blocks for its prompt and its first sampled token only, never for its
 * max_tokens: decode blocks are taken one at a time (reserve_decode_blocks) and preemption
 * handles a pool that runs dry, whereas reserving max_tokens would hold memory that requests
 * stopping early never use. */
static void admit(sched *s)
{
    int bound = s->cfg.max_head_passes ? s->cfg.max_head_passes : s->cfg.n_slots;
    sched_req *prev = NULL, *head = NULL; /* head: the first request this walk had to skip */
    pthread_mutex_lock(&s->mu);
    sched_req *r = s->wait_head; /* only this thread removes from the queue */
    pthread_mutex_unlock(&s->mu);
    int row = 0;
    while (r) {
        while (row < s->cfg.n_slots && s->slots[row]) row++;
        /* Every placement takes a fresh block (the position after the prompt is never cached),
         * so an exhausted pool admits nothing: no need to look further. */
        if (row == s->cfg.n_slots || kvcache_available(s->kv) == 0) return;
        char err[256] = "";
        int start = 0;
        int rc = prefix_in_flight(s, r) ? PLACE_WAIT : place_blocks(s, r, &start, err, sizeof err);
        if (rc == PLACE_FATAL) {
            sched_fail(s, err);
            return;
        }
        if (rc == PLACE_WAIT) {
            if (!head) {
                head = r;
                if (bound < 0 || r->started || r->passed >= bound) return;
            }
            pthread_mutex_lock(&s->mu); /* r->next: a submit may be appending after r */
            prev = r;
            r = r->next;
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        pthread_mutex_lock(&s->mu);
        sched_req *next = r->next;
        queue_unlink(s, prev, r);
        pthread_mutex_unlock(&s->mu);
        if (rc == PLACE_FAILED) {
            log_warn("request %s: cannot be admitted: %s", r->id, err);
            req_finish(s, r, SCHED_FINISH_ERROR, err);
        } else {
            admit_into(s, r, row, start);
            if (head && ++head->passed >= bound) return;
        }
        r = next;
    }
}

/* ---- speculative decoding ---------------------------------------------------------------- */

/* Decode steps a request drafts nothing after a one-token draft was rejected again: n-gram
 * drafts of text that does not repeat cost a wider step and buy nothing. */
#define SPEC_PAUSE_STEPS 16

/* The off-switch (spec_gate): each mode is timed this many steps in a bucket before the rates
 * decide, and the mode they leave out still runs one step in `probe` (acceptance, the context
 * and the mix change: a verdict is never final); probe starts at SPEC_GATE_PROBE steps and
 * doubles up to SPEC_GATE_PROBE_MAX while the verdict stands, since a probe of the losing mode
 * costs (a draft model's 8 rounds and a verification were ~3.5 plain steps of the 8B shape). */
#define SPEC_GATE_WARM 4
#define SPEC_GATE_PROBE 32
#define SPEC_GATE_PROBE_MAX 1024
#define SPEC_GATE_EMA 0.125

static int spec_gate_bucket(int n_decodes)
{
    int b = 0;
    while (b + 1 < SPEC_GATE_BUCKETS && (2 << b) <= n_decodes) b++;
    return b;
}

/* Whether a step of n_decodes decode rows may verify drafts.  Why measured rather than a rule:
 * a verification pays where a step's cost hardly grows with its tokens (batch 1 reads every
 * weight for one token: K more cost little), and costs where it does (a large batch is closer
 * to compute-bound, and a step that verifies leaves the GPU's captured decode graphs for an
 * eager pass); where the line falls depends on the model, the device, the acceptance and the
 * drafter's own cost (a draft model's rounds).  So each bucket of batch sizes compares the
 * decode tokens per second of its steps with and without verifications (drafting and the
 * text pipeline's work on the tokens counted in) and speculates while that pays, probing the
 * other mode now and then. */
static bool spec_gate_allows(sched *s, int n_decodes)
{
    const int b = spec_gate_bucket(n_decodes);
    spec_gate *g = &s->gate[b];
    if (g->n[1] < SPEC_GATE_WARM) return true;
    if (g->n[0] < SPEC_GATE_WARM) return false;
    /* 2 % either way before the verdict turns: rates that close are noise */
    const int spec = g->verdict == 1 ? g->rate[1] >= 0.98 * g->rate[0] : g->rate[1] > 1.02 * g->rate[0];
    if (spec != g->verdict) {
        log_info("speculative decoding %s for steps of %d-%d decodes: %.0f tok/s verifying, %.0f plain",
                 spec ? "on" : "off", 1 << b, (2 << b) - 1, g->rate[1], g->rate[0]);
        g->probe = SPEC_GATE_PROBE;
        g->steps = 0;
        g->verdict = spec;
    }
    if (++g->steps < g->probe) return spec;
    g->steps = 0;
    if (g->probe < SPEC_GATE_PROBE_MAX) g->probe *= 2;
    return !spec;
}

/* Before the step's results go out (a finished request's rows are freed then): its decode
 * tokens, a verification's accepted drafts and the token after them and one per plain decode,
 * when it carried decode rows only (plan_step's step_decodes). */
static void spec_gate_count(sched *s, int n)
{
    s->step_tokens = -1;
    if (!s->prop || s->step_decodes != n || n == 0) return;
    int tokens = 0;
    bool verified = false;
    for (int i = 0; i < n; i++) {
        const engine_seq *q = &s->seqs[i];
        if (q->n_sample > 1) {
            verified = true;
            tokens += engine_verify_accept(q->tokens + 1, q->n_sample - 1, q->sampled) + 1;
        } else {
            tokens++;
        }
    }
    s->step_tokens = tokens;
    s->step_verified = verified;
}

/* After the results went out: the step's decode tokens per second, from its planning to now,
 * into its bucket's average of its mode. */
static void spec_gate_record(sched *s)
{
    const double secs = timing_now_s() - s->step_t0;
    if (s->step_tokens < 0 || secs <= 0) return;
    spec_gate *g = &s->gate[spec_gate_bucket(s->step_decodes)];
    const int v = s->step_verified;
    const double rate = s->step_tokens / secs;
    g->rate[v] = g->n[v] ? g->rate[v] + SPEC_GATE_EMA * (rate - g->rate[v]) : rate;
    if (g->n[v] < SPEC_GATE_WARM) g->n[v]++;
}

static size_t spec_width(const sched *s) { return (size_t)s->cfg.draft_max + 1; }
static int32_t *spec_row_tokens(sched *s, int row) { return s->spec_tokens + (size_t)row * spec_width(s); }

/* A constrained request's drafts are verified under the grammar's masks at every position:
 * mask 0 is its own (ready), mask j+1 the grammar's after drafts 0..j, built on a clone of its
 * matcher.  The draft ends before a token the grammar refuses, one after which it is done
 * (the request ends there), or one whose next mask is not built within a slice (masks usually
 * come from the grammar's cache in microseconds).  Returns the drafts kept; the masks end up
 * packed at the engine's width. */
static int spec_masks(sched *s, sched_req *r, const int32_t *draft, int k)
{
    const size_t mw = (size_t)s->mask_words, ew = ((size_t)engine_model(s->e)->hp.n_vocab + 31) / 32;
    uint32_t *masks = s->spec_masks + (size_t)r->slot * spec_width(s) * mw;
    memcpy(masks, r->mask, mw * sizeof *masks);
    grammar_matcher *gm = grammar_matcher_clone(r->gm);
    double t0 = timing_now_ms();
    int kept = 0;
    while (gm && kept < k) {
        const uint32_t d = (uint32_t)draft[kept], *m = masks + (size_t)kept * mw;
        if (!(m[d / 32] >> (d % 32) & 1u) || !grammar_matcher_accept(gm, (int32_t)d) || grammar_matcher_is_done(gm) ||
            grammar_matcher_fill_mask_until(gm, masks + (size_t)(kept + 1) * mw, t0 + SCHED_MASK_SLICE_MS) <= 0)
            break;
        kept++;
    }
    grammar_matcher_free(gm);
    s->step_mask_ms += timing_now_ms() - t0;
    for (int j = 1; j <= kept && ew < mw; j++) memmove(masks + (size_t)j * ew, masks + (size_t)j * mw, ew * sizeof *masks);
    return kept;
}

/* The most drafts r's decode may verify in this step, at most `room` of them (the step's
 * token budget).  0: a plain decode.  Never more than the request can still take (max_tokens,
 * the context), and 0 below draft_min (a shorter draft is never verified: not worth drafting). */
static int spec_cap(sched *s, const sched_req *r, int room)
{
    int k = r->spec_k;
    const int tokens_left = r->max_tokens - r->n_generated - 1; /* a verification yields up to k + 1 */
    const int ctx_left = s->max_ctx - r->n_past - 1;            /* it feeds positions n_past..n_past+k */
    if (k > tokens_left) k = tokens_left;
    if (k > ctx_left) k = ctx_left;
    if (k > room) k = room;
    return k > 0 && k >= s->cfg.draft_min ? k : 0;
}

/* Whether r's decode in this step asks the proposer for drafts (r->spec_pause counts down). */
static bool spec_wanted(sched_req *r)
{
    if (!r->speculate) return false;
    if (r->spec_pause > 0) {
        r->spec_pause--;
        return false;
    }
    return true;
}

/* Makes the planned decode q of r a verification of its k drafts. */
static void spec_verify(sched *s, engine_seq *q, const sched_req *r, int k)
{
    q->n_sample = k + 1;
    q->sampled = s->spec_samples + (size_t)r->slot * spec_width(s);
    q->allowed = r->gm ? s->spec_masks + (size_t)r->slot * spec_width(s) * s->mask_words : NULL;
}

/* Adaptive draft length, per request: all drafts accepted doubles it (up to draft_max), fewer
 * than half halves it, down to 1 or draft_min (a length below draft_min would never be
 * verified, so it would never grow back either), and a draft of that least length rejected
 * pauses drafting for SPEC_PAUSE_STEPS. */
static void spec_adapt(const sched *s, sched_req *r, int n_draft, int accepted)
{
    const int least = s->cfg.draft_min > 1 ? s->cfg.draft_min : 1;
    if (accepted == n_draft) {
        r->spec_k = 2 * r->spec_k < s->cfg.draft_max ? 2 * r->spec_k : s->cfg.draft_max;
    } else if (2 * accepted < n_draft) {
        if (r->spec_k <= least) r->spec_pause = SPEC_PAUSE_STEPS;
        else r->spec_k = r->spec_k / 2 > least ? r->spec_k / 2 : least;
    }
}

/* A hybrid's verification that rejected a draft left the row's recurrent state past the
 * accepted tokens, and a recurrence cannot rewind: the state from before the verification
 * (copied in spec_plan) comes back and the sequence goes back to the verification's start, so
 * the accepted tokens are fed again (prefilling: a recomputation's) with the new pending token
 * after them, sampling there (spec_refeed, plan_step): the step its decode would have taken, so
 * a rejection costs the verification and no step more.  On the CPU a chunk gives the bits of
 * feeding its tokens one by one, so the output is that without drafts. */
static void spec_rewind(sched *s, sched_req *r, int n_past0)
{
    char err[256];
    if (engine_state_copy(s->e, r->state, s->spec_backup + r->slot, err, sizeof err) != 0) {
        log_warn("request %s: restoring its recurrent state after a rejected draft failed: %s", r->id, err);
        req_finish(s, r, SCHED_FINISH_ERROR, err);
        return;
    }
    pthread_mutex_lock(&s->mu); /* the positions fed again are held once, when they are */
    s->kv_used -= (uint64_t)(r->n_past - n_past0);
    pthread_mutex_unlock(&s->mu);
    r->n_past = n_past0;
    r->spec_refeed = true;
}

/* Applies a verification: the accepted drafts and the token after them go through the text
 * pipeline one by one, exactly as decodes would have delivered them (a stop string, the end
 * of the grammar, max_tokens or an end-of-generation token ends the request at that token),
 * then the rejected positions' blocks go back (kvcache_truncate). */
static void spec_done(sched *s, int i, uint64_t now)
{
    const engine_seq *q = &s->seqs[i];
    sched_req *r = s->seq_req[i];
    const int row = r->slot, n_draft = q->n_sample - 1, n_past0 = r->n_past;
    const int accepted = engine_verify_accept(q->tokens + 1, n_draft, q->sampled);
    pthread_mutex_lock(&s->mu);
    s->stats.spec_verifies++;
    s->stats.spec_draft_tokens += (uint64_t)n_draft;
    s->stats.spec_accepted_tokens += (uint64_t)accepted;
    s->stats.spec_proposer_draft[s->cfg.spec] += (uint64_t)n_draft;
    s->stats.spec_proposer_accepted[s->cfg.spec] += (uint64_t)accepted;
    pthread_mutex_unlock(&s->mu);
    spec_adapt(s, r, n_draft, accepted);
    /* the accepted positions' tokens, ahead of req_on_token (which writes the same), so that
     * the full blocks among them are committed even if the request ends on the way */
    memcpy(r->toks + n_past0 + 1, q->tokens + 1, (size_t)accepted * sizeof *r->toks);
    commit_blocks(s, r, n_past0 + accepted + 1);
    r->has_pending = false;
    for (int j = 0; j <= accepted; j++) {
        r->n_past = n_past0 + j + 1; /* position n_past0 + j holds its token's K/V */
        pthread_mutex_lock(&s->mu);
        s->kv_used++;
        pthread_mutex_unlock(&s->mu);
        req_on_token(s, r, &q->sampled[j], now);
        if (s->slots[row] != r) return; /* finished (and maybe freed) at this token */
    }
    kvcache_truncate(s->kv, &r->kv, r->n_past + 1);
    if (s->kv_swa) kvcache_truncate(s->kv_swa, &r->kv_swa, r->n_past + 1);
    drop_out_of_window(s, r);
    proposer_keep(s->prop, row, r->n_toks - 1); /* all but the new pending token stand */
    if (s->states && accepted < n_draft) spec_rewind(s, r, n_past0);
}

static float *spec_row_hidden(sched *s, int row)
{
    return s->spec_hidden + (size_t)row * (size_t)s->cfg.max_batch_tokens * (size_t)engine_model(s->e)->hp.n_embd;
}

/* A proposer that observes (mtp) is shown every row of seqs[first..first+n) that speculates:
 * its tokens, their hidden states and its block table, before seq_done moves anything. */
static void spec_observe(sched *s, int first, int n)
{
    int m = 0;
    for (int i = first; i < first + n; i++) {
        const engine_seq *q = &s->seqs[i];
        if (!q->hidden) continue;
        s->spec_obs[m++] = (proposer_obs){.slot = q->slot, .pos = q->pos, .tokens = q->tokens,
                                          .n_tokens = q->n_tokens, .hidden = q->hidden, .blocks = q->blocks};
    }
    proposer_observe(s->prop, s->spec_obs, m);
}

static void plan_add(sched *s, int *n, sched_req *r, const int32_t *tokens, int n_tokens, bool want)
{
    s->seqs[*n] = (engine_seq){
        .slot = r->slot,
        .tokens = tokens,
        .n_tokens = n_tokens,
        .pos = r->n_past,
        .blocks = r->kv.blocks,
        .blocks_swa = s->kv_swa ? r->kv_swa.blocks : NULL,
        .state = r->state,
        .history = r->toks,
        .want_token = want,
        .sp = &r->sp,
        .allowed = want ? r->mask : NULL,
        .embed = r->embed ? &r->em : NULL,
        .hidden = s->spec_hidden && r->speculate && !r->embed ? spec_row_hidden(s, r->slot) : NULL,
    };
    s->seq_req[*n] = r;
    (*n)++;
}

/* The drafts of the step's speculating decodes (spec_rows, planned as plain decodes), all asked
 * of the proposer at once; each row's drafts are then cut by draft_min, the grammar and the
 * free blocks (a draft never preempts anybody), and its decode becomes their verification.
 * The proposer forgets the drafts that are not verified.  Returns the budget the rows were
 * given (spec_cap) but do not use. */
static int spec_plan(sched *s, int n_rows)
{
    proposer_draft(s->prop, s->spec_rows, n_rows);
    int unused = 0;
    for (int i = 0; i < n_rows; i++) {
        const proposer_row *row = &s->spec_rows[i];
        engine_seq *q = &s->seqs[s->spec_seq[i]];
        sched_req *r = s->seq_req[s->spec_seq[i]];
        int k = row->n_draft < s->cfg.draft_min ? 0 : row->n_draft;
        if (k > 0 && r->gm) k = spec_masks(s, r, row->draft, k);
        if (k > 0 && !grow_blocks(s, r, r->n_past + 1 + k)) k = 0; /* the blocks it did get go back below */
        char err[256]; /* a hybrid's state before the verification, for spec_rewind */
        if (k > 0 && s->states && engine_state_copy(s->e, s->spec_backup + r->slot, r->state, err, sizeof err) != 0) {
            log_warn("request %s: no drafts this step (copying its recurrent state failed: %s)", r->id, err);
            k = 0;
        }
        /* blocks past the verification's go back (grown for k_max first for a proposer that
         * observes, mtp, or in part by a grow that failed) */
        if (k == 0 || (s->spec_hidden && k < row->k_max)) release_blocks_past(s, r, r->n_past + 1 + k);
        proposer_keep(s->prop, r->slot, r->n_toks + k);
        unused += row->k_max - k;
        if (k == 0) continue;
        q->tokens = spec_row_tokens(s, r->slot); /* the pending token, then row->draft */
        q->n_tokens = 1 + k;
        spec_verify(s, q, r, k);
    }
    return unused;
}

/* Whether prefill-only work of `chunk` tokens may join a step that carries decode rows, paying
 * from s->embed_credit.
 *
 * Why a bound: a step's time is about that of its decode rows alone plus a cost per prompt
 * token, and every token of a step stretches every running stream's TPOT.  Chat prompts are
 * bounded only by max_batch_tokens (someone waits for that prompt's first token, as vLLM's
 * chunked prefill treats every prompt alike); prefill-only work (embeddings, rerank) is
 * throughput work, so while streams decode it gets a fixed share, Sarathi-Serve's rule (a
 * token budget per mixed step chosen from the TPOT one can afford) applied to it alone.
 * Measured on an H100 (Qwen3-0.6B shape, docs/benchmarks.md, 2026-11-26): with 64 tokens a
 * step a 512 x 128-token burst at concurrency 32 stretched a chat's TPOT 2.08x (one input a
 * request) and 1.36x (eight); with 16, 1.12x and 1.11x (target <= 1.2x); with 4, 0.95x / 0.97x
 * at 194 / 602 embeddings/s against 221 / 579 with 16.  A decode step of that small model is
 * ~1 ms, so a token costs relatively more than the 0.25 % a step first estimated: the daemon's
 * default (--embed-step-tokens) is 16.
 *
 * Why on average (a credit, banked up to max_batch_tokens): an embedding cannot be chunked (an
 * encoder sees its whole input; pooling reads every row), so a per-step cap below its length
 * would starve it while any stream decodes.  Each step with decodes earns embed_step_tokens
 * while prefill-only work waits; an embedding runs once its length is banked.  A stream's TPOT
 * is its mean step time, which then rises by the rate's cost and not by the embedding's length.
 * Steps without decodes protect nobody: they take prefill-only work up to max_batch_tokens. */
static bool embed_fits_credit(sched *s, int chunk, int n_decodes, bool *earned)
{
    if (n_decodes == 0 || s->cfg.embed_step_tokens <= 0) return true;
    if (!*earned) {
        *earned = true;
        s->embed_credit += s->cfg.embed_step_tokens;
        if (s->embed_credit > s->cfg.max_batch_tokens) s->embed_credit = s->cfg.max_batch_tokens;
    }
    return chunk <= s->embed_credit;
}

/* The step's batch: a decode token for every slot past its prompt first (so running streams
 * never stall behind a long prompt), then prompt chunks, oldest admission first, in what is
 * left of the token budget (prefill-only ones within embed_fits_credit). */
static int plan_step(sched *s)
{
    int n = 0, budget = s->cfg.max_batch_tokens, n_slots = s->cfg.n_slots, n_rows = 0, n_ready = 0;
    s->step_t0 = timing_now_s();
    for (int k = 0; k < n_slots && s->prop; k++) {
        sched_req *r = s->slots[k];
        n_ready += r && r->has_pending && !prefilling(r);
    }
    const bool spec_ok = s->prop && n_ready > 0 && (s->cfg.spec_no_gate || spec_gate_allows(s, n_ready));
    for (int k = 0; k < n_slots && budget > 0; k++) {
        int i = (s->decode_rr + k) % n_slots;
        sched_req *r = s->slots[i];
        if (r && r->has_pending && !prefilling(r) && req_mask_ready(s, r)) {
            plan_add(s, &n, r, &r->last_token, 1, true);
            budget--;
            /* drafts leave a token of the budget to every slot still to come */
            int cap = spec_ok && spec_wanted(r) ? spec_cap(s, r, budget - (n_slots - 1 - k)) : 0;
            /* a drafter that writes K/V at the drafts' positions (mtp) needs their blocks first */
            if (cap > 0 && s->spec_hidden && !grow_blocks(s, r, r->n_past + 1 + cap)) {
                release_blocks_past(s, r, r->n_past + 1);
                cap = 0;
            }
            if (cap == 0) continue;
            int32_t *row = spec_row_tokens(s, i);
            row[0] = r->last_token;
            s->spec_rows[n_rows] = (proposer_row){.slot = i, .toks = r->toks, .n_toks = r->n_toks, .k_max = cap,
                                                  .sp = &r->sp, .allowed = r->gm ? r->mask : NULL, .draft = row + 1,
                                                  .blocks = s->spec_hidden ? r->kv.blocks : NULL};
            s->spec_seq[n_rows++] = n - 1;
            budget -= cap;
        }
    }
    s->decode_rr = (s->decode_rr + 1) % n_slots;
    if (n_rows > 0) budget += spec_plan(s, n_rows);
    int n_decodes = n;
    bool earned = false;

    /* Prompts (or recomputations) still to prefill, oldest admission first; the last chunk of
     * a prompt samples, that of a recomputation does not (its pending token decodes next), but
     * for the tokens a rejected draft's rewind feeds again: whole, they take the pending token
     * with them and sample after it (spec_rewind). */
    int n_run = running_by_age(s);
    for (int k = 0; k < n_run && budget > 0; k++) {
        sched_req *r = s->prefill[k];
        if (!prefilling(r)) continue;
        int target = prefill_target(r), chunk = target - r->n_past;
        const int row = r->slot;
        const bool refeed = r->spec_refeed && r->has_pending && chunk < budget && req_mask_ready(s, r);
        if (s->slots[row] != r) continue; /* its pending mask failed: finished there (and maybe freed) */
        r->spec_refeed = false; /* (else fed as a recomputation's chunks, the pending token decoding next) */
        if (refeed) chunk++;
        if (r->embed && chunk > budget) continue; /* whole or not at all: it waits a step */
        if (r->embed && !embed_fits_credit(s, chunk, n_decodes, &earned)) continue;
        if (chunk > budget) chunk = budget;
        /* A hybrid's chunk stops where its state is snapshotted (seq_done) for prompts that
         * share the prefix: the prompt's last block boundary (the next turn of a chat) and the
         * end of a prefix found shared (a system prompt). */
        const int cuts[2] = {r->share_at, target / ENGINE_KV_BLOCK * ENGINE_KV_BLOCK};
        for (int c = 0; c < 2 && s->states && !refeed && !r->embed; c++) /* an embedding runs whole */
            if (r->n_past < cuts[c] && r->n_past + chunk > cuts[c]) chunk = cuts[c] - r->n_past;
        bool samples = refeed || (r->n_past + chunk == target && r->n_generated == 0 && !r->embed);
        if (samples && !req_mask_ready(s, r)) continue; /* its first mask is not built yet */
        /* the chunk's sliding blocks (never short: the pool has every row's ring, engine.h) */
        if (s->kv_swa && !kvcache_grow(s->kv_swa, &r->kv_swa, r->n_past + chunk)) continue;
        plan_add(s, &n, r, r->toks + r->n_past, chunk, samples);
        budget -= chunk;
        if (r->embed && n_decodes > 0 && s->cfg.embed_step_tokens > 0) s->embed_credit -= chunk;
    }
    s->step_decodes = n == n_decodes ? n : 0; /* prompt tokens would time the prefill too */
    return n;
}

/* r's state after its first n_past tokens (a block boundary) becomes a snapshot that later
 * prompts with the same prefix start from.  A sequence keeps at most three: its prompt's (the
 * last boundary of the prompt, where plan_step cuts its prefill), the end of a prefix it was
 * found to share (place_hybrid: share_at) and its latest decode one,
 * which replaces the one before, so a long generation does not fill the cache with its
 * own past.  A failed copy only loses the snapshot. */
static void snapshot_state(sched *s, sched_req *r, bool decode)
{
    if (decode && r->snap_slot >= 0) statecache_drop(s->states, r->snap_slot, r->toks, r->snap_tokens);
    if (!decode && r->n_past != prefill_target(r) / ENGINE_KV_BLOCK * ENGINE_KV_BLOCK && r->n_past != r->share_at)
        return;
    int slot = statecache_snapshot(s->states, r->toks, r->n_past);
    if (slot < 0) return;
    char err[256];
    if (engine_state_copy(s->e, slot, r->state, err, sizeof err) != 0) {
        statecache_drop(s->states, slot, r->toks, r->n_past);
        log_warn("request %s: state snapshot at %d tokens failed: %s", r->id, r->n_past, err);
        return;
    }
    if (decode) r->snap_slot = slot, r->snap_tokens = r->n_past;
}

/* Applies the outcome of seqs[i] (already computed by the engine). */
static void seq_done(sched *s, int i, uint64_t now)
{
    const engine_seq *q = &s->seqs[i];
    sched_req *r = s->seq_req[i];
    if (q->n_sample > 1) {
        spec_done(s, i, now);
        return;
    }
    r->n_past += q->n_tokens;
    if (!r->embed) commit_blocks(s, r, r->n_past);
    drop_out_of_window(s, r);
    /* (a rewound row's re-fed tokens with its pending one: the only chunk that samples after
     * the first token, plan_step) */
    bool decode = q->tokens == &r->last_token || (q->want_token && r->n_generated > 0);
    if (s->states && !s->cfg.no_prefix_cache && !r->embed && r->n_past % ENGINE_KV_BLOCK == 0)
        snapshot_state(s, r, decode);
    if (decode) r->has_pending = false;
    pthread_mutex_lock(&s->mu);
    s->kv_used += (uint64_t)q->n_tokens;
    if (!decode) s->stats.prompt_tokens_total += (uint64_t)q->n_tokens;
    pthread_mutex_unlock(&s->mu);
    if (r->embed) { /* done in its one step: its row and blocks go back now */
        if (!r->t_first) r->t_first = now;
        req_finish(s, r, SCHED_FINISH_STOP, NULL);
    } else if (q->want_token) {
        req_on_token(s, r, &s->results[i], now); /* may finish r, and free it */
    }
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
                if (s->spec_hidden) spec_observe(s, i, 1);
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
    s->step_mask_ms = 0;
    /* Running decodes take their blocks before new requests do: admitting a request only to
     * preempt it at once would waste its prefill. */
    reserve_decode_blocks(s);
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
            spec_gate_count(s, n);
            if (s->spec_hidden) spec_observe(s, 0, n);
            for (int i = 0; i < n; i++) seq_done(s, i, now);
            spec_gate_record(s);
        } else if (rc == ENGINE_FATAL) {
            sched_fail(s, err);
        } else {
            step_isolate_failure(s, n, err);
        }
    }
    pthread_mutex_lock(&s->mu);
    publish_kv_counts(s);
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
    free(s->spec_tokens);
    free(s->spec_samples);
    free(s->spec_masks);
    free(s->spec_rows);
    free(s->spec_seq);
    free(s->spec_hidden);
    free(s->spec_obs);
    proposer_free(s->prop);
    kvcache_free(s->kv);
    kvcache_free(s->kv_swa);
    statecache_free(s->states);
    output_scratch_free(&s->scratch);
    grammar_vocab_free(s->gvocab);
    free(s);
}

const char *sched_spec_name(sched_spec spec)
{
    static const char *const names[SCHED_SPEC_COUNT] = {"off", "ngram", "draft", "mtp"};
    return (unsigned)spec < SCHED_SPEC_COUNT ? names[spec] : "unknown";
}

/* The drafter cfg->spec names; NULL with a message in err. */
static proposer *make_proposer(const sched *s, const sched_config *cfg, char *err, size_t errlen)
{
    if (cfg->spec == SCHED_SPEC_NGRAM) {
        proposer *p = proposer_ngram_new();
        if (!p) snprintf(err, errlen, "sched: out of memory");
        return p;
    }
    if (cfg->spec == SCHED_SPEC_MTP) return proposer_mtp_new(s->e, err, errlen);
    if (cfg->spec != SCHED_SPEC_DRAFT) {
        snprintf(err, errlen, "sched: unknown speculative mode %d", (int)cfg->spec);
        return NULL;
    }
    if (!cfg->draft) {
        snprintf(err, errlen, "speculative decoding with a draft model needs the draft model's engine");
        return NULL;
    }
    const engine_config *dc = engine_get_config(cfg->draft);
    const int nv = engine_model(s->e)->hp.n_vocab, dv = engine_model(cfg->draft)->hp.n_vocab;
    if (dc->n_slots != cfg->n_slots || dc->ctx_per_slot != cfg->ctx_per_slot) {
        snprintf(err, errlen, "the draft engine has %d rows of %d positions; the target %d of %d", dc->n_slots,
                 dc->ctx_per_slot, cfg->n_slots, cfg->ctx_per_slot);
        return NULL;
    }
    if (dv != nv) {
        snprintf(err, errlen, "the draft model's vocabulary has %d tokens, the target's %d", dv, nv);
        return NULL;
    }
    return proposer_draft_model_new(cfg->draft, cfg->draft_p_min, err, errlen);
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
    const engine_config *ec = engine_get_config(e);
    if (cfg->n_slots != ec->n_slots || cfg->ctx_per_slot != ec->ctx_per_slot ||
        cfg->max_batch_tokens > ec->max_batch_tokens) {
        snprintf(err, errlen,
                 "sched: config (n_slots %d, ctx_per_slot %d, max_batch_tokens %d) does not match the "
                 "engine (%d, %d, at most %d)",
                 cfg->n_slots, cfg->ctx_per_slot, cfg->max_batch_tokens, ec->n_slots,
                 ec->ctx_per_slot, ec->max_batch_tokens);
        return NULL;
    }
    int kv_blocks = engine_kv_blocks(e);
    if (kv_blocks < 1) {
        snprintf(err, errlen, "sched: the engine has no KV blocks");
        return NULL;
    }
    sched *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "sched: out of memory");
        return NULL;
    }
    size_t n = (size_t)cfg->n_slots;
    int per_seq = (cfg->ctx_per_slot + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK;
    s->kv = kvcache_create(kv_blocks, per_seq, 0);
    s->max_ctx = (int64_t)kv_blocks * ENGINE_KV_BLOCK < cfg->ctx_per_slot ? kv_blocks * ENGINE_KV_BLOCK
                                                                          : cfg->ctx_per_slot;
    s->stats.kv_blocks_total = s->stats.kv_blocks_free = kv_blocks;
    /* The sliding layers' pool, bookkeeping as the full one's.  A hybrid's state snapshots and
     * sliding windows would both gate a hit: no family has both, so it is refused. */
    const int swa_blocks = engine_kv_blocks_swa(e);
    const bool hybrid = engine_state_slots(e) > 0;
    if (swa_blocks > 0 && (hybrid || !(s->kv_swa = kvcache_create(swa_blocks, per_seq, 0)))) {
        snprintf(err, errlen, "%s", hybrid ? "sched: a model with both recurrent state and a sliding-window pool is "
                                             "not supported" : "sched: out of memory");
        kvcache_free(s->kv);
        free(s);
        return NULL;
    }
    s->swa_window = engine_kv_swa_window(e);
    s->stats.kv_swa_blocks_total = s->stats.kv_swa_blocks_free = swa_blocks;
    /* A hybrid model: one state slot per row, the rest hold prefix snapshots; speculating, the
     * last n_slots are the rows' states before a verification (spec_rewind), not the cache's. */
    const int all_states = engine_state_slots(e);
    const int backups = all_states > 0 && cfg->spec != SCHED_SPEC_OFF ? cfg->n_slots : 0;
    const int n_states = all_states - backups;
    s->spec_backup = backups ? n_states : -1;
    if (all_states > 0 && n_states < cfg->n_slots) {
        snprintf(err, errlen, "sched: the engine has %d recurrent-state slots for %d rows%s", all_states,
                 cfg->n_slots, backups ? " and as many to roll speculation back from" : "");
        kvcache_free(s->kv);
        free(s);
        return NULL;
    }
    if (all_states > 0 && !(s->states = statecache_create(n_states, n_states - cfg->n_slots))) {
        snprintf(err, errlen, "sched: out of memory");
        kvcache_free(s->kv);
        free(s);
        return NULL;
    }
    s->stats.state_slots_total = n_states;
    s->e = e;
    s->tok = tok;
    s->cfg = *cfg;
    s->stats.n_slots = cfg->n_slots;
    s->slots = calloc(n, sizeof *s->slots);
    s->seqs = calloc(n, sizeof *s->seqs);
    s->results = calloc(n, sizeof *s->results);
    s->seq_req = calloc(n, sizeof *s->seq_req);
    s->prefill = calloc(n, sizeof *s->prefill);
    s->gvocab = grammar_vocab_new(tok);
    if (s->gvocab) {
        int model_words = (engine_model(e)->hp.n_vocab + 31) / 32, vocab_words = grammar_vocab_n_words(s->gvocab);
        s->mask_words = model_words > vocab_words ? model_words : vocab_words;
    }
    if (!s->slots || !s->seqs || !s->results || !s->seq_req || !s->prefill || !s->kv || !s->gvocab) {
        snprintf(err, errlen, "sched: out of memory");
        goto fail;
    }
    if (cfg->spec != SCHED_SPEC_OFF) {
        if (cfg->draft_max < 1 || cfg->draft_max > ec->max_draft) {
            snprintf(err, errlen, "sched: draft_max %d outside 1..%d (the engine's max_draft)", cfg->draft_max,
                     ec->max_draft);
            goto fail;
        }
        if (cfg->draft_min < 0 || cfg->draft_min > cfg->draft_max) {
            snprintf(err, errlen, "sched: draft_min %d outside 0..draft_max (%d): no draft would ever be verified",
                     cfg->draft_min, cfg->draft_max);
            goto fail;
        }
        if (!(s->prop = make_proposer(s, cfg, err, errlen))) goto fail;
        for (int b = 0; b < SPEC_GATE_BUCKETS; b++) s->gate[b] = (spec_gate){.probe = SPEC_GATE_PROBE, .verdict = -1};
        size_t w = n * spec_width(s);
        s->spec_tokens = malloc(w * sizeof *s->spec_tokens);
        s->spec_samples = malloc(w * sizeof *s->spec_samples);
        s->spec_masks = malloc(w * (size_t)s->mask_words * sizeof *s->spec_masks);
        s->spec_rows = malloc(n * sizeof *s->spec_rows);
        s->spec_seq = malloc(n * sizeof *s->spec_seq);
        if (proposer_observes(s->prop)) {
            s->spec_hidden = malloc(n * (size_t)cfg->max_batch_tokens * (size_t)engine_model(e)->hp.n_embd * sizeof(float));
            s->spec_obs = malloc(n * sizeof *s->spec_obs);
            if (!s->spec_hidden || !s->spec_obs) {
                snprintf(err, errlen, "sched: out of memory");
                goto fail;
            }
        }
        if (!s->spec_tokens || !s->spec_samples || !s->spec_masks || !s->spec_rows || !s->spec_seq) {
            snprintf(err, errlen, "sched: out of memory");
            goto fail;
        }
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

void sched_drain(sched *s, int timeout_ms)
{
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    if (!timing_wait_until_zero(&s->idle_cond, &s->mu, &s->n_active, timeout_ms)) {
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
