/* test_sched.c - the scheduler against a fake engine and a small real SPM tokenizer.
 *
 * The fake engine is deterministic: the next token of a sequence is a function of what it
 * reads through its block table (a per-prompt script when the test gave one, else a hash): its
 * "K/V" is the token id written at each block row, so a wrong block table, a reused block
 * that was still needed, or a cached block with the wrong contents changes the text, and
 * every read is also checked against the sequence's own tokens (kv_mismatch).  It records every batch
 * it receives so the tests can check what the scheduler planned, and it can be paused (to
 * line up submissions deterministically), slowed down, or made to fail on a "poison" token. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/log.h"
#include "model/gguf.h"
#include "synth/gguf_write.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "engine/engine_impl.h" /* the tests drive the scheduler with a fake backend */
#include "sched/sched.h"
#include "base/utf8.h"

/* ---- a small SPM vocabulary ---------------------------------------------------------- */

enum { TOK_UNK = 0, TOK_BOS = 1, TOK_EOS = 2, TOK_BYTE0 = 3, TOK_FIRST_PIECE = TOK_BYTE0 + 256 };
static const char *const pieces[] = {
    "\xE2\x96\x81", "a", "b", "c", "d", "e", "x", "y", "z", "S", "T", "O", "P", "ST", "P!", "!",
    "aa", "ab", "\xE2\x96\x81world", "Hello", ".",
};
#define N_PIECES ((int)(sizeof pieces / sizeof pieces[0]))
#define N_VOCAB (TOK_FIRST_PIECE + N_PIECES)

static void *g_gguf_mem;
static gguf_file *g_gguf;
static tokenizer *g_tok;

static int build_tokenizer(void **state)
{
    (void)state;
    const char *tokens[N_VOCAB];
    float scores[N_VOCAB];
    int32_t types[N_VOCAB];
    static char byte_names[256][8];
    tokens[TOK_UNK] = "<unk>";
    tokens[TOK_BOS] = "<s>";
    tokens[TOK_EOS] = "</s>";
    types[TOK_UNK] = 2;
    types[TOK_BOS] = types[TOK_EOS] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(byte_names[b], sizeof byte_names[b], "<0x%02X>", b);
        tokens[TOK_BYTE0 + b] = byte_names[b];
        types[TOK_BYTE0 + b] = 6;
    }
    for (int i = 0; i < N_PIECES; i++) {
        tokens[TOK_FIRST_PIECE + i] = pieces[i];
        types[TOK_FIRST_PIECE + i] = 1;
    }
    for (int i = 0; i < N_VOCAB; i++) scores[i] = -(float)i;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N_VOCAB);
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, N_VOCAB);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, N_VOCAB);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", TOK_UNK);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", TOK_BOS);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", TOK_EOS);
    size_t size = 0;
    assert_int_equal(gguf_writer_write_mem(w, &g_gguf_mem, &size), 0);
    gguf_writer_free(w);
    char err[256];
    g_gguf = gguf_open_memory(g_gguf_mem, size, err, sizeof err);
    if (!g_gguf) fail_msg("gguf_open_memory: %s", err);
    g_tok = tokenizer_load(g_gguf, err, sizeof err);
    if (!g_tok) fail_msg("tokenizer_load: %s", err);
    log_set_level(LOG_WARN); /* one line per finished request would drown the test output */
    return 0;
}

static int free_tokenizer(void **state)
{
    (void)state;
    tokenizer_free(g_tok);
    gguf_close(g_gguf);
    free(g_gguf_mem);
    return 0;
}

/* Id of a vocabulary piece, e.g. T("ab"), T("<0xE2>"). */
static int32_t T(const char *piece)
{
    int32_t id = tokenizer_find(g_tok, piece);
    if (id < 0) fail_msg("piece '%s' not in the test vocabulary", piece);
    return id;
}

/* ---- the fake engine ----------------------------------------------------------------- */

#define MAX_SLOTS 8
#define FAKE_EMBD 4 /* the fake model's hidden width */
#define MAX_CTX 256
#define MAX_STATES (2 * MAX_SLOTS)
#define MAX_BLOCKS 64
#define BLK ENGINE_KV_BLOCK
#define MAX_LOG 4096
#define MAX_SCRIPTS 8

typedef struct logged_seq {
    int slot, pos, n_tokens;
    int32_t first; /* tokens[0]: identifies the prompt when pos == 0 */
    bool want;
} logged_seq;

typedef struct logged_step {
    int n_seqs;
    logged_seq seqs[MAX_SLOTS];
} logged_step;

typedef struct script {
    int32_t key; /* the prompt's first token */
    int n_prompt;
    int32_t out[32];
    int n_out; /* past the end: EOS */
} script;

typedef struct fake_engine {
    engine base;
    model m;
    int32_t kv[MAX_BLOCKS][BLK]; /* the token each block row holds */
    int32_t seen[MAX_CTX];       /* scratch: a sequence's tokens as read through its table */
    int kv_mismatch;             /* reads that disagreed with the sequence's own tokens */
    int kv_copies;
    int32_t hist[MAX_SLOTS][MAX_CTX];
    int len[MAX_SLOTS];
    int clears[MAX_SLOTS];
    script scripts[MAX_SCRIPTS];
    int n_scripts;
    int32_t poison; /* a step carrying this token fails; -1: never */
    int32_t fatal;  /* a step carrying this token reports ENGINE_FATAL; -1: never */
    int delay_us;

    /* A hybrid model (n_states > 0): each state slot's positions and a hash of the tokens it
     * took in, which must be the hash of the sequence's own tokens before its position. */
    int state_len[MAX_STATES];
    uint32_t state_hash[MAX_STATES];
    int state_mismatch;

    pthread_mutex_t mu; /* guards what tests read or set while the scheduler runs */
    pthread_cond_t cv;
    bool paused;
    int steps_started;
    logged_step log[MAX_LOG];
    int n_log;
} fake_engine;

/* The next token after the n tokens in f->seen. */
static int32_t fake_next(const fake_engine *f, int n)
{
    const int32_t *h = f->seen;
    for (int i = 0; i < f->n_scripts; i++) {
        const script *sc = &f->scripts[i];
        if (sc->key != h[0]) continue;
        int k = n - sc->n_prompt;
        return k >= 0 && k < sc->n_out ? sc->out[k] : TOK_EOS;
    }
    /* Unscripted: one of the single letters a..e, x..z picked by a hash of the history. */
    uint32_t hash = 2166136261u;
    for (int i = 0; i < n; i++) hash = (hash ^ (uint32_t)h[i]) * 16777619u;
    static const char *const letters[] = {"a", "b", "c", "d", "e", "x", "y", "z"};
    return T(letters[hash % 8]);
}

static uint32_t fnv(uint32_t h, const int32_t *t, int n)
{
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 16777619u;
    return h;
}

/* A hybrid's state slots, as the CPU engine keeps them: a step continues a slot exactly where
 * it ends (or restarts it at 0), and the slot must then hold the sequence's own prefix. */
static int fake_check_state(fake_engine *f, const engine_seq *q, char *err, size_t errlen)
{
    int st = engine_seq_state(q);
    if (q->pos != 0 && q->pos != f->state_len[st]) {
        snprintf(err, errlen, "state slot %d holds %d positions, the sequence starts at %d", st, f->state_len[st],
                 q->pos);
        return -1;
    }
    if (q->pos != 0 && fnv(2166136261u, q->history, q->pos) != f->state_hash[st]) f->state_mismatch++;
    return 0;
}

static void fake_advance_state(fake_engine *f, const engine_seq *q)
{
    int st = engine_seq_state(q);
    f->state_hash[st] = fnv(q->pos ? f->state_hash[st] : 2166136261u, q->tokens, q->n_tokens);
    f->state_len[st] = q->pos + q->n_tokens;
}

static int fake_state_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    fake_engine *f = (fake_engine *)e;
    f->state_len[dst] = f->state_len[src];
    f->state_hash[dst] = f->state_hash[src];
    return 0;
}

static int fake_step(engine *e, const engine_seq *seqs, int n_seqs, engine_result *results,
                     char *err, size_t errlen)
{
    fake_engine *f = (fake_engine *)e;
    pthread_mutex_lock(&f->mu);
    f->steps_started++;
    pthread_cond_broadcast(&f->cv);
    while (f->paused) pthread_cond_wait(&f->cv, &f->mu);
    logged_step *ls = f->n_log < MAX_LOG ? &f->log[f->n_log++] : NULL;
    if (ls) ls->n_seqs = n_seqs;
    for (int i = 0; i < n_seqs && ls; i++)
        ls->seqs[i] = (logged_seq){seqs[i].slot, seqs[i].pos, seqs[i].n_tokens, seqs[i].tokens[0],
                                   seqs[i].want_token};
    pthread_mutex_unlock(&f->mu);
    if (f->delay_us) usleep((useconds_t)f->delay_us);

    /* Validate everything before changing anything: a failed step leaves the slots alone. */
    for (int i = 0; i < n_seqs; i++) {
        const engine_seq *q = &seqs[i];
        if (q->pos > f->len[q->slot] && !q->history) {
            snprintf(err, errlen, "slot %d: pos %d but the slot holds %d tokens", q->slot, q->pos,
                     f->len[q->slot]);
            return -1;
        }
        if (!q->blocks) {
            snprintf(err, errlen, "slot %d: no block table", q->slot);
            return -1;
        }
        if (f->base.n_states && fake_check_state(f, q, err, errlen) != 0) return -1;
        for (int j = 0; j < q->n_tokens; j++)
            if (q->tokens[j] == f->poison) {
                snprintf(err, errlen, "poison token in slot %d", q->slot);
                return -1;
            } else if (q->tokens[j] == f->fatal) {
                snprintf(err, errlen, "device fault in slot %d", q->slot);
                return ENGINE_FATAL;
            }
    }
    for (int i = 0; i < n_seqs; i++) { /* the scatter: K/V of every new token into its block */
        const engine_seq *q = &seqs[i];
        if (f->base.n_states) fake_advance_state(f, q);
        for (int j = 0; j < q->n_tokens; j++) {
            int p = q->pos + j;
            f->kv[q->blocks[p / BLK]][p % BLK] = q->tokens[j];
        }
    }
    for (int i = 0; i < n_seqs; i++) {
        const engine_seq *q = &seqs[i];
        if (q->pos > f->len[q->slot])
            memcpy(&f->hist[q->slot][f->len[q->slot]], q->history + f->len[q->slot],
                   (size_t)(q->pos - f->len[q->slot]) * sizeof *q->history);
        memcpy(&f->hist[q->slot][q->pos], q->tokens, (size_t)q->n_tokens * sizeof *q->tokens);
        f->len[q->slot] = q->pos + q->n_tokens;
        int n = q->pos + q->n_tokens;
        for (int p = 0; p < n; p++) {
            f->seen[p] = f->kv[q->blocks[p / BLK]][p % BLK];
            if (f->seen[p] != f->hist[q->slot][p]) f->kv_mismatch++;
        }
        /* hidden states (an embedding's): every dimension of a row holds its token id */
        for (int j = 0; q->hidden && j < q->n_tokens; j++)
            for (int d = 0; d < FAKE_EMBD; d++) q->hidden[(size_t)j * FAKE_EMBD + d] = (float)q->tokens[j];
        if (!q->want_token) continue;
        int32_t next = fake_next(f, n);
        results[i] = (engine_result){.token = next, .logprob = -0.25f};
        if (q->sp->n_top_logprobs > 0) {
            results[i].n_top = 1;
            results[i].top_ids[0] = next;
            results[i].top_logprobs[0] = -0.25f;
        }
    }
    return 0;
}

static void fake_slot_clear(engine *e, int slot)
{
    fake_engine *f = (fake_engine *)e;
    f->len[slot] = 0;
    pthread_mutex_lock(&f->mu);
    f->clears[slot]++;
    pthread_mutex_unlock(&f->mu);
}

static int fake_kv_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    fake_engine *f = (fake_engine *)e;
    memcpy(f->kv[dst], f->kv[src], sizeof f->kv[dst]);
    f->kv_copies++;
    return 0;
}

static void fake_destroy(engine *e) { (void)e; }

static const engine_vtable fake_vt = {
    .name = "fake", .step = fake_step, .slot_clear = fake_slot_clear, .kv_copy = fake_kv_copy,
    .state_copy = fake_state_copy, .destroy = fake_destroy};

/* ---- fixture ------------------------------------------------------------------------- */

typedef struct fixture {
    fake_engine *f;
    sched *s;
    sched_config cfg;
    atomic_int fatal_calls; /* sched_config.on_fatal */
    char fatal_error[256];
} fixture;

static void fx_on_fatal(void *ctx, const char *error)
{
    fixture *fx = ctx;
    snprintf(fx->fatal_error, sizeof fx->fatal_error, "%s", error);
    atomic_fetch_add(&fx->fatal_calls, 1);
}

/* A scheduler over a fake engine with a pool of kv_blocks blocks (0: one context per slot),
 * sched_config.max_head_passes = head_passes, n_states recurrent-state slots (0: not a hybrid
 * model) and sched_config.embed_step_tokens = embed_step. */
static void fx_start_embed(fixture *fx, int n_slots, int ctx, int max_batch, int queue_size, int kv_blocks,
                           int head_passes, int n_states, int embed_step)
{
    if (!kv_blocks) kv_blocks = n_slots * ((ctx + BLK - 1) / BLK);
    assert_true(n_slots <= MAX_SLOTS && ctx <= MAX_CTX && kv_blocks <= MAX_BLOCKS);
    fake_engine *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->m.hp.n_vocab = N_VOCAB;
    f->m.hp.n_embd = FAKE_EMBD;
    f->base = (engine){.vt = &fake_vt, .m = &f->m,
                       .cfg = {.n_slots = n_slots, .ctx_per_slot = ctx, .max_batch_tokens = max_batch},
                       .kv_blocks = kv_blocks, .n_states = n_states, .state_bytes = n_states ? 64 : 0};
    assert_true(n_states <= MAX_STATES);
    f->poison = f->fatal = -1;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    fx->f = f;
    fx->cfg = (sched_config){.n_slots = n_slots, .ctx_per_slot = ctx, .max_batch_tokens = max_batch,
                             .queue_size = queue_size, .max_head_passes = head_passes,
                             .embed_step_tokens = embed_step, .on_fatal = fx_on_fatal, .on_fatal_ctx = fx};
    atomic_init(&fx->fatal_calls, 0);
    fx->fatal_error[0] = 0;
    char err[256];
    fx->s = sched_create(&f->base, g_tok, &fx->cfg, err, sizeof err);
    if (!fx->s) fail_msg("sched_create: %s", err);
}

static void fx_start_hybrid(fixture *fx, int n_slots, int ctx, int max_batch, int queue_size, int kv_blocks,
                            int head_passes, int n_states)
{
    fx_start_embed(fx, n_slots, ctx, max_batch, queue_size, kv_blocks, head_passes, n_states, 0);
}

static void fx_start_admit(fixture *fx, int n_slots, int ctx, int max_batch, int queue_size, int kv_blocks,
                           int head_passes)
{
    fx_start_hybrid(fx, n_slots, ctx, max_batch, queue_size, kv_blocks, head_passes, 0);
}

static void fx_start_pool(fixture *fx, int n_slots, int ctx, int max_batch, int queue_size, int kv_blocks)
{
    fx_start_admit(fx, n_slots, ctx, max_batch, queue_size, kv_blocks, 0);
}

static void fx_start(fixture *fx, int n_slots, int ctx, int max_batch, int queue_size)
{
    fx_start_pool(fx, n_slots, ctx, max_batch, queue_size, 0);
}

static void fx_stop(fixture *fx)
{
    sched_destroy(fx->s);
    assert_int_equal(fx->f->kv_mismatch, 0); /* every sequence read exactly its own tokens */
    assert_int_equal(fx->f->state_mismatch, 0); /* and continued exactly its own state */
    pthread_mutex_destroy(&fx->f->mu);
    pthread_cond_destroy(&fx->f->cv);
    engine_free(&fx->f->base); /* engine.c's embedding scratch (fake_destroy frees nothing) */
    free(fx->f);
}

static void fx_pause(fixture *fx, bool paused)
{
    pthread_mutex_lock(&fx->f->mu);
    fx->f->paused = paused;
    pthread_cond_broadcast(&fx->f->cv);
    pthread_mutex_unlock(&fx->f->mu);
}

/* Waits until the engine has been entered `n` times in all. */
static void fx_wait_steps(fixture *fx, int n)
{
    pthread_mutex_lock(&fx->f->mu);
    while (fx->f->steps_started < n) pthread_cond_wait(&fx->f->cv, &fx->f->mu);
    pthread_mutex_unlock(&fx->f->mu);
}

static void fx_script(fixture *fx, int32_t key, int n_prompt, const int32_t *out, int n_out)
{
    assert_true(fx->f->n_scripts < MAX_SCRIPTS && n_out <= 32);
    script *sc = &fx->f->scripts[fx->f->n_scripts++];
    sc->key = key;
    sc->n_prompt = n_prompt;
    memcpy(sc->out, out, (size_t)n_out * sizeof *out);
    sc->n_out = n_out;
}

/* ---- a client: wake callback + collected output -------------------------------------- */

typedef struct client {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int wakes;
    char text[2048];
    size_t len;
    int n_chunks;
    sched_finish finish;
    sched_output last;
    int n_tokens;
    int32_t token_ids[256];
    float emb[FAKE_EMBD]; /* an embedding request's answer */
    size_t n_emb;
} client;

static void client_wake(void *ctx)
{
    client *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->wakes++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void client_init(client *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

static void client_destroy(client *c)
{
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

/* Drains everything available; true once the finish arrived.  Every chunk must be valid UTF-8
 * on its own: a split character would fail here. */
static bool client_poll(client *c, sched_req *r)
{
    sched_output o;
    while (sched_req_take(r, &o)) {
        assert_true(utf8_valid(o.text ? o.text : "", o.text_len));
        assert_true(c->len + o.text_len < sizeof c->text);
        if (o.text_len) memcpy(c->text + c->len, o.text, o.text_len);
        c->len += o.text_len;
        c->text[c->len] = 0;
        c->n_chunks += o.text_len > 0;
        for (int i = 0; i < o.n_tokens && c->n_tokens < 256; i++) c->token_ids[c->n_tokens++] = o.tokens[i].token;
        bool done = o.finish != SCHED_FINISH_NONE;
        if (done) {
            assert_int_equal(c->finish, SCHED_FINISH_NONE); /* the finish comes exactly once */
            c->finish = o.finish;
            c->last = o;
            c->last.text = NULL;
            c->last.tokens = NULL;
            c->last.embedding = NULL;
            assert_true(o.n_embedding <= FAKE_EMBD);
            if (o.n_embedding) memcpy(c->emb, o.embedding, o.n_embedding * sizeof(float));
            c->n_emb = o.n_embedding;
        }
        sched_output_clear(&o);
        if (done) return true;
    }
    return c->finish != SCHED_FINISH_NONE;
}

/* Waits (woken by the scheduler, 10 s at most) until the request finished. */
static void client_wait(client *c, sched_req *r)
{
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int seen = c->wakes;
        pthread_mutex_unlock(&c->mu);
        if (client_poll(c, r)) return;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 10;
        pthread_mutex_lock(&c->mu);
        int rc = 0;
        while (c->wakes == seen && rc == 0) rc = pthread_cond_timedwait(&c->cv, &c->mu, &until);
        pthread_mutex_unlock(&c->mu);
        if (rc != 0) fail_msg("request did not finish within 10 s");
    }
}

/* ---- request helpers ----------------------------------------------------------------- */

typedef struct req_spec {
    int32_t prompt[MAX_CTX];
    int n_prompt;
    int max_tokens;
    const char *stop[SCHED_MAX_STOP];
    int n_stop;
    bool ignore_eos;
    bool logprobs;
} req_spec;

/* A prompt of n tokens starting with `key`, the rest filler letters. */
static req_spec spec(int32_t key, int n_prompt, int max_tokens)
{
    req_spec q = {.n_prompt = n_prompt, .max_tokens = max_tokens};
    q.prompt[0] = key;
    for (int i = 1; i < n_prompt; i++) q.prompt[i] = TOK_FIRST_PIECE + 1 + i % 8;
    return q;
}

static int submit(fixture *fx, const req_spec *q, client *c, sched_req **r)
{
    sched_params p = {.prompt = q->prompt, .n_prompt = q->n_prompt, .max_tokens = q->max_tokens,
                      .n_stop = q->n_stop, .ignore_eos = q->ignore_eos, .want_logprobs = q->logprobs};
    sampling_params_default(&p.sp);
    if (q->logprobs) p.sp.n_top_logprobs = 1;
    memcpy(p.stop, q->stop, sizeof p.stop);
    return sched_submit(fx->s, &p, c ? client_wake : NULL, c, r);
}

/* Runs one request to completion: submit, wait, release. */
static void run_one(fixture *fx, const req_spec *q, client *c)
{
    sched_req *r;
    client_init(c);
    assert_int_equal(submit(fx, q, c, &r), SCHED_OK);
    client_wait(c, r);
    sched_req_release(r);
}

/* Index of the first logged step that carries the prompt starting with key at pos 0. */
static int first_step_of(const fake_engine *f, int32_t key, int *slot)
{
    for (int i = 0; i < f->n_log; i++)
        for (int j = 0; j < f->log[i].n_seqs; j++)
            if (f->log[i].seqs[j].pos == 0 && f->log[i].seqs[j].first == key) {
                if (slot) *slot = f->log[i].seqs[j].slot;
                return i;
            }
    return -1;
}

static int last_step_of_slot(const fake_engine *f, int slot, int from)
{
    int last = -1;
    for (int i = from; i < f->n_log; i++)
        for (int j = 0; j < f->log[i].n_seqs; j++)
            if (f->log[i].seqs[j].slot == slot) last = i;
    return last;
}

/* ---- tests --------------------------------------------------------------------------- */

static void test_fifo_admission_and_slot_reuse(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 2, 64, 64, 8);
    int32_t keys[4] = {T("a"), T("b"), T("c"), T("d")};
    int max_tokens[4] = {3, 6, 8, 2}; /* b ends before c: d must take b's slot */
    client c[4];
    sched_req *r[4];
    fx_pause(&fx, true);
    for (int i = 0; i < 4; i++) {
        req_spec q = spec(keys[i], 4, max_tokens[i]);
        client_init(&c[i]);
        assert_int_equal(submit(&fx, &q, &c[i], &r[i]), SCHED_OK);
        if (i == 0) fx_wait_steps(&fx, 1); /* a alone in the first step */
    }
    fx_pause(&fx, false);
    for (int i = 0; i < 4; i++) {
        client_wait(&c[i], r[i]);
        assert_int_equal(c[i].finish, SCHED_FINISH_LENGTH);
        assert_int_equal(c[i].last.completion_tokens, max_tokens[i]);
        assert_int_equal(c[i].last.prompt_tokens, 4);
        sched_req_release(r[i]);
        client_destroy(&c[i]);
    }
    int slot[4], first[4];
    for (int i = 0; i < 4; i++) first[i] = first_step_of(fx.f, keys[i], &slot[i]);
    assert_int_equal(first[0], 0);
    assert_int_equal(slot[0], 0);
    assert_int_equal(first[1], 1); /* b: the next step, the other slot */
    assert_int_equal(slot[1], 1);
    /* a ends first (3 tokens): c takes its slot in the very next step, d waits for b's. */
    assert_int_equal(slot[2], 0);
    int a_last = -1, b_last = -1;
    for (int i = 0; i < first[2]; i++)
        for (int j = 0; j < fx.f->log[i].n_seqs; j++)
            if (fx.f->log[i].seqs[j].slot == 0) a_last = i;
    assert_int_equal(a_last, 2); /* prompt + 2 decodes */
    assert_int_equal(first[2], a_last + 1);
    for (int i = 0; i < first[3]; i++)
        for (int j = 0; j < fx.f->log[i].n_seqs; j++)
            if (fx.f->log[i].seqs[j].slot == 1) b_last = i;
    assert_int_equal(slot[3], 1);
    assert_int_equal(first[3], b_last + 1);
    /* Every finished request cleared its slot in the engine. */
    assert_int_equal(fx.f->clears[0] + fx.f->clears[1], 4);
    fx_stop(&fx);
}

static void test_queue_full_too_long_invalid(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 1, 32, 32, 1);
    client c[2];
    sched_req *r[2], *extra = NULL;
    fx_pause(&fx, true);
    for (int i = 0; i < 2; i++) {
        req_spec q = spec(T("a"), 3, 2);
        client_init(&c[i]);
        assert_int_equal(submit(&fx, &q, &c[i], &r[i]), SCHED_OK);
        if (i == 0) fx_wait_steps(&fx, 1);
    }
    /* One running + one waiting = n_slots + queue_size: the next is refused at once. */
    req_spec q = spec(T("a"), 3, 2);
    assert_int_equal(submit(&fx, &q, NULL, &extra), SCHED_E_QUEUE_FULL);
    assert_null(extra);
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.queue_depth + st.slots_used, 2);

    req_spec too_long = spec(T("a"), 30, 3); /* 30 + 3 > 32 */
    assert_int_equal(submit(&fx, &too_long, NULL, &extra), SCHED_E_TOO_LONG);
    req_spec fills_ctx = spec(T("a"), 32, 0); /* max_tokens defaulted to what is left: 0 */
    assert_int_equal(submit(&fx, &fills_ctx, NULL, &extra), SCHED_E_TOO_LONG);
    req_spec no_tokens = spec(T("a"), 3, 0);
    assert_int_equal(submit(&fx, &no_tokens, NULL, &extra), SCHED_E_INVALID);
    req_spec empty = spec(T("a"), 0, 3);
    assert_int_equal(submit(&fx, &empty, NULL, &extra), SCHED_E_INVALID);
    req_spec bad_id = spec(N_VOCAB + 5, 2, 3);
    assert_int_equal(submit(&fx, &bad_id, NULL, &extra), SCHED_E_INVALID);

    fx_pause(&fx, false);
    for (int i = 0; i < 2; i++) {
        client_wait(&c[i], r[i]);
        sched_req_release(r[i]);
        client_destroy(&c[i]);
    }
    /* Room again; exactly at the context limit is accepted. */
    client c2;
    req_spec fits = spec(T("b"), 29, 3);
    run_one(&fx, &fits, &c2);
    assert_int_equal(c2.finish, SCHED_FINISH_LENGTH);
    client_destroy(&c2);
    fx_stop(&fx);
}

static void test_chunked_prefill_interleaves_with_decodes(void **state)
{
    (void)state;
    const int budget = 8;
    /* Reference outputs, each request alone. */
    req_spec qa = spec(T("a"), 3, 12), qb = spec(T("b"), 20, 4), qc = spec(T("c"), 5, 4);
    client alone[3];
    {
        fixture ref;
        fx_start(&ref, 3, 64, budget, 4);
        run_one(&ref, &qa, &alone[0]);
        run_one(&ref, &qb, &alone[1]);
        run_one(&ref, &qc, &alone[2]);
        fx_stop(&ref);
    }

    fixture fx;
    fx_start(&fx, 3, 64, budget, 4);
    client c[3];
    sched_req *r[3];
    const req_spec *qs[3] = {&qa, &qb, &qc};
    fx_pause(&fx, true);
    for (int i = 0; i < 3; i++) {
        client_init(&c[i]);
        assert_int_equal(submit(&fx, qs[i], &c[i], &r[i]), SCHED_OK);
        if (i == 0) fx_wait_steps(&fx, 1);
    }
    fx_pause(&fx, false);
    for (int i = 0; i < 3; i++) {
        client_wait(&c[i], r[i]);
        assert_string_equal(c[i].text, alone[i].text);
        assert_int_equal(c[i].finish, alone[i].finish);
        sched_req_release(r[i]);
    }

    const fake_engine *f = fx.f;
    int slot_a = -1, slot_b = -1, slot_c = -1;
    int first_a = first_step_of(f, T("a"), &slot_a), first_b = first_step_of(f, T("b"), &slot_b);
    int first_c = first_step_of(f, T("c"), &slot_c);
    assert_int_equal(first_a, 0);
    int b_fed = 0, c_fed = 0, shared = 0, b_chunks = 0;
    int a_last = last_step_of_slot(f, slot_a, 0);
    for (int i = 0; i < f->n_log; i++) {
        const logged_step *ls = &f->log[i];
        int total = 0;
        bool has_a = false, b_pre = false, c_pre = false;
        for (int j = 0; j < ls->n_seqs; j++) {
            const logged_seq *q = &ls->seqs[j];
            total += q->n_tokens;
            has_a |= q->slot == slot_a;
            if (i >= first_b && q->slot == slot_b && b_fed < qb.n_prompt) {
                assert_int_equal(q->pos, b_fed); /* chunks continue where the last one ended */
                b_fed += q->n_tokens;
                b_chunks++;
                assert_int_equal(q->want, b_fed == qb.n_prompt); /* a token only after the whole prompt */
                b_pre = true;
            } else if (i >= first_c && q->slot == slot_c && c_fed < qc.n_prompt) {
                assert_int_equal(q->pos, c_fed);
                c_fed += q->n_tokens;
                assert_int_equal(q->want, c_fed == qc.n_prompt);
                c_pre = true;
            } else {
                assert_int_equal(q->n_tokens, q->pos == 0 ? qa.n_prompt : 1); /* a decode */
                assert_true(q->want);
            }
        }
        assert_true(total <= budget);
        /* A long prompt never stalls the running decode of a. */
        if (i > first_a && i <= a_last) assert_true(has_a);
        shared += b_pre && c_pre;
    }
    assert_int_equal(b_fed, qb.n_prompt);
    assert_int_equal(c_fed, qc.n_prompt);
    assert_true(b_chunks >= 3); /* 20 tokens under a budget of 8 minus a's decode */
    assert_true(shared >= 1);   /* two prompts packed into one step */
    for (int i = 0; i < 3; i++) {
        client_destroy(&c[i]);
        client_destroy(&alone[i]);
    }
    fx_stop(&fx);
}

static void test_concurrent_same_as_alone(void **state)
{
    (void)state;
    enum { N = 6 };
    static const char *const keys[N] = {"a", "b", "c", "d", "e", "x"};
    req_spec q[N];
    client alone[N], c[N];
    sched_req *r[N];
    for (int i = 0; i < N; i++) q[i] = spec(T(keys[i]), 2 + 5 * i, 10 + 3 * i);

    fixture fx;
    fx_start(&fx, 3, 128, 16, N);
    for (int i = 0; i < N; i++) run_one(&fx, &q[i], &alone[i]);
    for (int i = 0; i < N; i++) {
        client_init(&c[i]);
        assert_int_equal(submit(&fx, &q[i], &c[i], &r[i]), SCHED_OK);
    }
    for (int i = 0; i < N; i++) {
        client_wait(&c[i], r[i]);
        assert_int_equal(c[i].finish, SCHED_FINISH_LENGTH);
        assert_int_equal(c[i].last.completion_tokens, q[i].max_tokens);
        assert_string_equal(c[i].text, alone[i].text);
        assert_int_equal((int)strlen(c[i].text), q[i].max_tokens); /* one letter per token */
        sched_req_release(r[i]);
        client_destroy(&c[i]);
        client_destroy(&alone[i]);
    }
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.requests_finished[SCHED_FINISH_LENGTH], 2 * N);
    assert_int_equal(st.ttft.n, 2 * N);
    uint64_t gen = 0, in_buckets = 0, prompt = 0;
    for (int i = 0; i < N; i++) gen += (uint64_t)(2 * q[i].max_tokens), prompt += (uint64_t)(2 * q[i].n_prompt);
    assert_int_equal(st.generated_tokens_total, gen);
    assert_int_equal(st.prompt_tokens_total, prompt);
    assert_int_equal(st.itl.n, gen - 2 * N);
    for (int b = 0; b <= SCHED_HIST_BUCKETS; b++) in_buckets += st.itl.counts[b];
    assert_int_equal(in_buckets, st.itl.n);
    assert_int_equal(st.slots_used, 0);
    assert_int_equal(st.queue_depth, 0);
    assert_int_equal(st.kv_tokens_used, 0);
    assert_true(st.steps > 0);
    fx_stop(&fx);
}

static void test_cancel_frees_slot_without_affecting_others(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 2, 128, 32, 4);
    req_spec qa = spec(T("a"), 4, 100), qb = spec(T("b"), 6, 40), qc = spec(T("c"), 3, 5);
    client alone_b, ca, cb, cc;
    run_one(&fx, &qb, &alone_b);
    fx.f->delay_us = 500; /* let the cancel land mid-generation */
    sched_req *ra, *rb, *rc;
    client_init(&ca);
    client_init(&cb);
    client_init(&cc);
    assert_int_equal(submit(&fx, &qa, &ca, &ra), SCHED_OK);
    assert_int_equal(submit(&fx, &qb, &cb, &rb), SCHED_OK);
    assert_int_equal(submit(&fx, &qc, &cc, &rc), SCHED_OK); /* waits for a slot */
    /* Wait for a few tokens of a, then cancel it. */
    while (ca.len < 3) {
        usleep(200);
        client_poll(&ca, ra);
    }
    int slot_a = -1;
    pthread_mutex_lock(&fx.f->mu);
    first_step_of(fx.f, T("a"), &slot_a);
    int steps_at_cancel = fx.f->steps_started;
    pthread_mutex_unlock(&fx.f->mu);
    sched_req_cancel(ra);
    sched_req_cancel(ra); /* idempotent */
    client_wait(&ca, ra);
    assert_int_equal(ca.finish, SCHED_FINISH_CANCELLED);
    assert_true(ca.last.completion_tokens < qa.max_tokens);
    client_wait(&cb, rb);
    client_wait(&cc, rc);
    assert_string_equal(cb.text, alone_b.text);
    assert_int_equal(cb.finish, alone_b.finish);
    assert_int_equal(cc.finish, SCHED_FINISH_LENGTH);
    /* a's slot carried a's tokens at most in the step running when cancel came and the next:
     * then it was cleared and went to c. */
    int slot_c = -1, first_c = first_step_of(fx.f, T("c"), &slot_c);
    assert_int_equal(slot_c, slot_a);
    assert_true(first_c <= steps_at_cancel + 1);
    sched_req_release(ra);
    sched_req_release(rb);
    sched_req_release(rc);

    /* Released while running (client gone without taking anything): cancelled, freed once. */
    sched_req *rd;
    req_spec qd = spec(T("d"), 3, 100);
    assert_int_equal(submit(&fx, &qd, NULL, &rd), SCHED_OK);
    sched_req_release(rd);
    sched_drain(fx.s, 5000);
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.requests_finished[SCHED_FINISH_CANCELLED], 2);
    assert_int_equal(st.slots_used, 0);
    client_destroy(&alone_b);
    client_destroy(&ca);
    client_destroy(&cb);
    client_destroy(&cc);
    fx_stop(&fx);
}

/* Runs the script `out` for a prompt keyed `key` with the given stops; returns the client. */
static void run_script(const int32_t *out, int n_out, const char *const *stops, int n_stop,
                       int max_tokens, bool ignore_eos, client *c)
{
    fixture fx;
    fx_start(&fx, 2, 64, 64, 4);
    req_spec q = spec(T("z"), 2, max_tokens);
    fx_script(&fx, q.prompt[0], q.n_prompt, out, n_out);
    for (int i = 0; i < n_stop; i++) q.stop[i] = stops[i];
    q.n_stop = n_stop;
    q.ignore_eos = ignore_eos;
    q.logprobs = true;
    run_one(&fx, &q, c);
    fx_stop(&fx);
}

static void test_stop_string_across_tokens(void **state)
{
    (void)state;
    client c;
    /* Split over three tokens: "x" "ST" "O" "P!" -> stop "STOP" matches inside "STOP!". */
    int32_t out1[] = {T("x"), T("ST"), T("O"), T("P!"), T("y"), T("y")};
    const char *stops1[] = {"STOP"};
    run_script(out1, 6, stops1, 1, 20, false, &c);
    assert_int_equal(c.finish, SCHED_FINISH_STOP);
    assert_string_equal(c.text, "x");
    assert_int_equal(c.last.completion_tokens, 4);
    client_destroy(&c);

    /* Overlapping prefix: stop "aab" in "aaab". */
    int32_t out2[] = {T("a"), T("a"), T("a"), T("b"), T("c")};
    const char *stops2[] = {"zzz", "aab"};
    run_script(out2, 5, stops2, 2, 20, false, &c);
    assert_int_equal(c.finish, SCHED_FINISH_STOP);
    assert_string_equal(c.text, "a");
    client_destroy(&c);

    /* A held candidate that never completes is released when the request ends. */
    int32_t out3[] = {T("d"), T("S"), T("T")};
    const char *stops3[] = {"STOP"};
    run_script(out3, 3, stops3, 1, 20, false, &c);
    assert_int_equal(c.finish, SCHED_FINISH_STOP); /* EOS after the script */
    assert_string_equal(c.text, "dST");
    client_destroy(&c);
    run_script(out3, 3, stops3, 1, 3, false, &c);
    assert_int_equal(c.finish, SCHED_FINISH_LENGTH);
    assert_string_equal(c.text, "dST");
    client_destroy(&c);
}

static void test_utf8_never_split(void **state)
{
    (void)state;
    client c;
    /* "a€b" with € as three byte tokens, then "😀" (4 bytes) split 1 + 3 */
    int32_t out[] = {T("a"), T("<0xE2>"), T("<0x82>"), T("<0xAC>"), T("b"),
                     T("<0xF0>"), T("<0x9F>"), T("<0x98>"), T("<0x80>")};
    run_script(out, 9, NULL, 0, 20, false, &c);
    assert_int_equal(c.finish, SCHED_FINISH_STOP);
    assert_string_equal(c.text, "a\xE2\x82\xAC" "b\xF0\x9F\x98\x80");
    assert_int_equal(c.n_tokens, 9); /* logprob entries for every token but the EOS */
    assert_int_equal(c.token_ids[1], T("<0xE2>"));
    client_destroy(&c);

    /* A stop string that starts in the middle of a multi-byte character's tokens. */
    const char *stops[] = {"\xE2\x82\xAC" "b"};
    run_script(out, 9, stops, 1, 20, false, &c);
    assert_int_equal(c.finish, SCHED_FINISH_STOP);
    assert_string_equal(c.text, "a");
    client_destroy(&c);
}

static void test_eos_and_ignore_eos(void **state)
{
    (void)state;
    client c;
    int32_t out[] = {T("a"), T("b"), TOK_EOS, T("c"), T("d")};
    run_script(out, 5, NULL, 0, 10, false, &c);
    assert_int_equal(c.finish, SCHED_FINISH_STOP);
    assert_string_equal(c.text, "ab"); /* "</s>" never shows */
    assert_int_equal(c.last.completion_tokens, 3);
    client_destroy(&c);

    run_script(out, 5, NULL, 0, 4, true, &c);
    assert_int_equal(c.finish, SCHED_FINISH_LENGTH);
    assert_string_equal(c.text, "abc");
    assert_int_equal(c.last.completion_tokens, 4);
    client_destroy(&c);
}

static void test_max_tokens_length(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 1, 16, 16, 1);
    client c;
    req_spec q = spec(T("e"), 6, 10); /* 6 + 10 = the whole slot */
    run_one(&fx, &q, &c);
    assert_int_equal(c.finish, SCHED_FINISH_LENGTH);
    assert_int_equal(c.last.completion_tokens, 10);
    assert_int_equal((int)c.len, 10);
    client_destroy(&c);
    fx_stop(&fx);
}

/* ENGINE_FATAL: the engine can run nothing more.  Every request -- in the failing step, in
 * another slot, still waiting -- ends with the error at once (no hang, no retries), the owner
 * hears of it once, and new requests are refused. */
static void test_engine_fatal_fails_everything(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 2, 64, 64, 4);
    fx.f->fatal = T("!");
    req_spec q[3] = {spec(T("a"), 4, 40), spec(T("b"), 6, 12), spec(T("c"), 4, 12)};
    q[1].prompt[3] = T("!");
    client c[3];
    sched_req *r[3];
    fx_pause(&fx, true);
    for (int i = 0; i < 3; i++) {
        client_init(&c[i]);
        assert_int_equal(submit(&fx, &q[i], &c[i], &r[i]), SCHED_OK); /* the third waits */
    }
    fx_pause(&fx, false);
    for (int i = 0; i < 3; i++) {
        client_wait(&c[i], r[i]);
        assert_int_equal(c[i].finish, SCHED_FINISH_ERROR);
        assert_non_null(strstr(c[i].last.error, "device fault"));
        sched_req_release(r[i]);
        client_destroy(&c[i]);
    }
    /* the hook runs after the requests are failed (their clients may wake first): wait for it */
    for (int ms = 0; ms < 10000 && atomic_load(&fx.fatal_calls) == 0; ms++) usleep(1000);
    assert_int_equal(atomic_load(&fx.fatal_calls), 1);
    assert_non_null(strstr(fx.fatal_error, "device fault"));
    client late;
    sched_req *rl;
    client_init(&late);
    assert_int_equal(submit(&fx, &q[0], &late, &rl), SCHED_E_SHUTDOWN);
    client_destroy(&late);
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.slots_used, 0);
    assert_int_equal(st.requests_finished[SCHED_FINISH_ERROR], 3);
    fx_stop(&fx);
}

static void test_engine_error_isolated(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 3, 64, 64, 4);
    req_spec qa = spec(T("a"), 4, 12), qc = spec(T("c"), 5, 12);
    req_spec qp = spec(T("b"), 6, 12);
    qp.prompt[3] = T("!"); /* the poison */
    client alone_a, alone_c, ca, cp, cc;
    run_one(&fx, &qa, &alone_a);
    run_one(&fx, &qc, &alone_c);
    fx.f->poison = T("!");
    sched_req *ra, *rp, *rc;
    client_init(&ca);
    client_init(&cp);
    client_init(&cc);
    fx_pause(&fx, true);
    assert_int_equal(submit(&fx, &qa, &ca, &ra), SCHED_OK);
    assert_int_equal(submit(&fx, &qp, &cp, &rp), SCHED_OK);
    assert_int_equal(submit(&fx, &qc, &cc, &rc), SCHED_OK);
    fx_pause(&fx, false);
    client_wait(&cp, rp);
    client_wait(&ca, ra);
    client_wait(&cc, rc);
    assert_int_equal(cp.finish, SCHED_FINISH_ERROR);
    assert_non_null(strstr(cp.last.error, "poison"));
    assert_string_equal(ca.text, alone_a.text);
    assert_string_equal(cc.text, alone_c.text);
    assert_int_equal(ca.finish, SCHED_FINISH_LENGTH);
    assert_int_equal(cc.finish, SCHED_FINISH_LENGTH);
    sched_req_release(ra);
    sched_req_release(rp);
    sched_req_release(rc);
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.requests_finished[SCHED_FINISH_ERROR], 1);
    client_destroy(&alone_a);
    client_destroy(&alone_c);
    client_destroy(&ca);
    client_destroy(&cp);
    client_destroy(&cc);
    fx_stop(&fx);
}

static void test_shutdown_and_drain(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 2, 256, 64, 4);
    fx.f->delay_us = 2000;
    client short_c, long_c;
    sched_req *rs, *rl, *late = NULL;
    req_spec qs = spec(T("a"), 3, 5), ql = spec(T("b"), 3, 250);
    client_init(&short_c);
    client_init(&long_c);
    assert_int_equal(submit(&fx, &qs, &short_c, &rs), SCHED_OK);
    assert_int_equal(submit(&fx, &ql, &long_c, &rl), SCHED_OK);
    sched_begin_shutdown(fx.s);
    req_spec q = spec(T("c"), 3, 5);
    assert_int_equal(submit(&fx, &q, NULL, &late), SCHED_E_SHUTDOWN);
    assert_null(late);
    /* 250 steps of >= 2 ms cannot finish in 200 ms: the short one (6 steps) completes, the
     * long one is cancelled at the timeout. */
    sched_drain(fx.s, 200);
    assert_true(client_poll(&short_c, rs));
    assert_true(client_poll(&long_c, rl));
    assert_int_equal(short_c.finish, SCHED_FINISH_LENGTH);
    assert_int_equal(long_c.finish, SCHED_FINISH_CANCELLED);
    assert_true(long_c.last.completion_tokens > 0 && long_c.last.completion_tokens < 250);
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.slots_used, 0);
    sched_req_release(rs);
    sched_req_release(rl);
    client_destroy(&short_c);
    client_destroy(&long_c);
    fx_stop(&fx);
}

static void test_destroy_with_live_requests(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 1, 64, 64, 4);
    fx.f->delay_us = 1000;
    client c[3];
    sched_req *r[3];
    for (int i = 0; i < 3; i++) {
        req_spec q = spec(T("a"), 3, 50);
        client_init(&c[i]);
        assert_int_equal(submit(&fx, &q, &c[i], &r[i]), SCHED_OK);
    }
    fx_stop(&fx); /* cancels the running one and the waiting ones */
    for (int i = 0; i < 3; i++) {
        assert_true(client_poll(&c[i], r[i]));
        assert_int_equal(c[i].finish, SCHED_FINISH_CANCELLED);
        sched_req_release(r[i]); /* after destroy: must not touch the scheduler */
        client_destroy(&c[i]);
    }
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* With nothing to do the scheduler thread sleeps in the loop: no steps, no CPU. */
static void test_idle_does_not_spin(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 2, 64, 64, 2);
    client c;
    req_spec q = spec(T("a"), 3, 4);
    run_one(&fx, &q, &c);
    client_destroy(&c);
    sched_stats before, after;
    sched_get_stats(fx.s, &before);
    double cpu0 = cpu_seconds();
    usleep(300 * 1000);
    double cpu = cpu_seconds() - cpu0;
    sched_get_stats(fx.s, &after);
    assert_int_equal(after.steps, before.steps);
    assert_true(cpu < 0.05); /* a spinning thread would burn ~0.3 s */
    fx_stop(&fx);
}

/* A wake callback that takes the output and releases the request itself, on the scheduler
 * thread (the way an HTTP layer may finish a stream from its resume hook). */
typedef struct self_release {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sched_req *r;
    bool released;
    char text[64];
    size_t len;
} self_release;

static void wake_and_release(void *ctx)
{
    self_release *c = ctx;
    pthread_mutex_lock(&c->mu);
    sched_output o;
    while (c->r && !c->released && sched_req_take(c->r, &o)) {
        if (o.text_len && c->len + o.text_len < sizeof c->text) {
            memcpy(c->text + c->len, o.text, o.text_len);
            c->len += o.text_len;
        }
        if (o.finish != SCHED_FINISH_NONE) {
            sched_req_release(c->r);
            c->released = true;
            pthread_cond_signal(&c->cv);
        }
        sched_output_clear(&o);
    }
    pthread_mutex_unlock(&c->mu);
}

static void test_release_from_wake_callback(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 1, 64, 64, 2);
    self_release c = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    req_spec q = spec(T("a"), 3, 6);
    sched_params p = {.prompt = q.prompt, .n_prompt = q.n_prompt, .max_tokens = q.max_tokens};
    sampling_params_default(&p.sp);
    pthread_mutex_lock(&c.mu); /* the callback waits until c.r is set */
    assert_int_equal(sched_submit(fx.s, &p, wake_and_release, &c, &c.r), SCHED_OK);
    while (!c.released) pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
    assert_int_equal((int)c.len, 6);
    sched_drain(fx.s, 1000);
    fx_stop(&fx);
}


/* ---- paged KV: prefix cache, preemption ------------------------------------------------ */

/* The text of q run alone on a fresh scheduler with a pool as large as its slots: the cold
 * reference a cached or preempted run must reproduce. */
static void cold_text(const req_spec *q, char *out, size_t cap)
{
    fixture fx;
    fx_start(&fx, 1, MAX_CTX, MAX_CTX, 4);
    client c;
    run_one(&fx, q, &c);
    assert_int_equal(c.last.cached_tokens, 0);
    snprintf(out, cap, "%s", c.text);
    client_destroy(&c);
    fx_stop(&fx);
}

/* A prompt of n tokens: the first n of one fixed 200-token conversation. */
static req_spec convo(int n, int max_tokens)
{
    req_spec q = spec(T("S"), n, max_tokens);
    for (int i = 1; i < n; i++) q.prompt[i] = TOK_FIRST_PIECE + 1 + (i * 5) % 9;
    q.ignore_eos = true;
    return q;
}

/* The first logged step of a request whose first computed token is `first` at `pos`. */
static bool logged_at(const fake_engine *f, int from, int pos, int32_t first)
{
    for (int i = from; i < f->n_log; i++)
        for (int j = 0; j < f->log[i].n_seqs; j++)
            if (f->log[i].seqs[j].pos == pos && f->log[i].seqs[j].first == first) return true;
    return false;
}

/* After one run of a 100-token conversation, later prompts reuse its full blocks: a prefix
 * ending inside a block (70 tokens: 64 cached), exactly on a block edge (64: cached whole, so
 * the last token is recomputed in a copy of the shared block), the whole longer prompt (100:
 * 96 cached), and one shorter than a block (none).  Each gives the text of a cold run. */
static void test_prefix_cache_hits_at_every_boundary(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 2, MAX_CTX, MAX_CTX, 8);
    client c;
    req_spec first = convo(100, 5);
    run_one(&fx, &first, &c);
    assert_int_equal(c.last.cached_tokens, 0);
    client_destroy(&c);
    const struct {
        int n, cached;
    } cases[] = {{70, 64}, {64, 63}, {100, 96}, {96, 95}, {20, 0}, {33, 32}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        req_spec q = convo(cases[k].n, 6);
        char want[2048];
        cold_text(&q, want, sizeof want);
        int log_from = fx.f->n_log, copies = fx.f->kv_copies;
        run_one(&fx, &q, &c);
        assert_int_equal(c.finish, SCHED_FINISH_LENGTH);
        assert_int_equal(c.last.prompt_tokens, cases[k].n);
        assert_int_equal(c.last.cached_tokens, cases[k].cached);
        assert_string_equal(c.text, want);
        /* computation starts right after the cached prefix */
        assert_true(logged_at(fx.f, log_from, cases[k].cached, q.prompt[cases[k].cached]));
        /* a prompt cached whole writes its last position into a private copy */
        bool whole = cases[k].n % BLK == 0 && cases[k].cached == cases[k].n - 1;
        if (fx.f->kv_copies - copies != (whole ? 1 : 0)) fail_msg("case %zu: %d copies", k, fx.f->kv_copies - copies);
        client_destroy(&c);
    }
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.prefix_hit_tokens, 64 + 63 + 96 + 95 + 0 + 32);
    assert_int_equal(st.kv_blocks_used, 0); /* nothing running: every block cached or free */
    assert_int_equal(st.kv_blocks_cached + st.kv_blocks_free, st.kv_blocks_total);
    assert_true(st.kv_blocks_cached >= 3);
    fx_stop(&fx);
}

/* Cached blocks are evicted least recently used first when fresh blocks are needed, and a
 * conversation whose blocks were evicted is simply computed again (same text). */
static void test_prefix_cache_eviction(void **state)
{
    (void)state;
    fixture fx;
    fx_start_pool(&fx, 1, 128, 128, 8, 4); /* 4 blocks: one 100-token request fills them */
    req_spec a = convo(100, 4), b = spec(T("T"), 100, 4);
    b.ignore_eos = true;
    char want_a[2048];
    cold_text(&a, want_a, sizeof want_a);
    client c;
    run_one(&fx, &a, &c);
    client_destroy(&c);
    run_one(&fx, &b, &c); /* needs every block: a's cached ones are evicted */
    client_destroy(&c);
    run_one(&fx, &a, &c);
    assert_int_equal(c.last.cached_tokens, 0);
    assert_string_equal(c.text, want_a);
    client_destroy(&c);
    fx_stop(&fx);
}

/* Two requests that together need more blocks than the pool: the later one is preempted when
 * blocks run out mid-decode, waits, is recomputed (mostly from its own cached blocks) and
 * continues; both streams are exactly what each gives alone.  One that could never fit the
 * pool is refused up front. */
static void test_preemption_and_resume(void **state)
{
    (void)state;
    fixture fx;
    fx_start_pool(&fx, 2, 128, 128, 8, 4); /* 128 tokens of KV for two 80-token requests */
    req_spec q[2] = {spec(T("a"), 20, 60), spec(T("b"), 20, 60)};
    char want[2][2048];
    client c[2];
    sched_req *r[2];
    for (int i = 0; i < 2; i++) {
        q[i].ignore_eos = true;
        cold_text(&q[i], want[i], sizeof want[i]);
    }
    fx_pause(&fx, true);
    for (int i = 0; i < 2; i++) {
        client_init(&c[i]);
        assert_int_equal(submit(&fx, &q[i], &c[i], &r[i]), SCHED_OK);
    }
    fx_pause(&fx, false);
    for (int i = 0; i < 2; i++) {
        client_wait(&c[i], r[i]);
        assert_int_equal(c[i].finish, SCHED_FINISH_LENGTH);
        assert_int_equal(c[i].last.completion_tokens, 60);
        assert_string_equal(c[i].text, want[i]);
        sched_req_release(r[i]);
        client_destroy(&c[i]);
    }
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_true(st.preemptions >= 1);
    assert_int_equal(st.requests_finished[SCHED_FINISH_LENGTH], 2);
    /* 100 + 50 tokens exceed the 128-token pool (though not -c = 128... nor would 129). */
    req_spec big = spec(T("c"), 100, 50);
    sched_req *rb;
    assert_int_equal(submit(&fx, &big, NULL, &rb), SCHED_E_TOO_LONG);
    fx_stop(&fx);
}

/* ---- hybrid models: recurrent-state slots -------------------------------------------- */

/* A hybrid model's prefix cache reuses cached blocks only with a state snapshot at their end.
 * A 130-token conversation is prefilled in chunks cut at its last block boundary (128), where
 * its state is kept; run again it starts at 128.  A prompt that follows its first 180 tokens
 * (its prompt and 50 of its reply) has cached blocks up to 160 but snapshots only at 128 (the
 * prompt's) and 192 (the reply's latest): it falls back to 128.  Every run gives the text of a
 * cold one, and the fake engine checks that each step continues its state slot exactly with
 * the sequence's own tokens (fx_stop). */
static void test_hybrid_prefix_snapshots(void **state)
{
    (void)state;
    fixture fx;
    fx_start_hybrid(&fx, 2, MAX_CTX, 48, 8, 0, 0, 4); /* 2 rows, 2 snapshots */
    /* a backend that has not said so (vtable rewinds_state) cannot rewind a verification */
    assert_false(engine_can_rewind_state(&fx.f->base));
    req_spec a = convo(130, 70);
    a.logprobs = true;
    char want[2048];
    cold_text(&a, want, sizeof want);
    client c;
    int32_t reply[256];
    for (int run = 0; run < 2; run++) {
        int log_from = fx.f->n_log;
        run_one(&fx, &a, &c);
        assert_string_equal(c.text, want);
        assert_int_equal(c.last.cached_tokens, run ? 128 : 0);
        assert_true(logged_at(fx.f, log_from, 128, a.prompt[128])); /* the chunk was cut there, or started there */
        memcpy(reply, c.token_ids, sizeof reply);
        client_destroy(&c);
    }
    req_spec g = convo(190, 20);
    memcpy(g.prompt + 130, reply, 50 * sizeof *reply);
    for (int i = 180; i < 190; i++) g.prompt[i] = T("O");
    cold_text(&g, want, sizeof want);
    run_one(&fx, &g, &c);
    assert_string_equal(c.text, want);
    assert_int_equal(c.last.cached_tokens, 128);
    client_destroy(&c);
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.state_slots_total, 4);
    assert_int_equal(st.state_slots_running, 0);
    assert_true(st.state_snapshots >= 1 && st.state_snapshots <= 2);
    assert_int_equal(st.prefix_hit_tokens, 128 + 128);
    fx_stop(&fx);
}

/* A system prompt shared by requests that differ after it: the first leaves no snapshot there
 * (its prompt's is further on), the second finds the shared blocks without one, computes them
 * and leaves a snapshot at their end (its prefill cut there), and the third starts from it. */
static void test_hybrid_shared_system_prompt(void **state)
{
    (void)state;
    fixture fx;
    fx_start_hybrid(&fx, 2, MAX_CTX, 48, 8, 0, 0, 4);
    const char *const users[3] = {"a", "b", "c"};
    const int cached[3] = {0, 0, 64};
    for (int i = 0; i < 3; i++) {
        req_spec q = convo(104, 4); /* 64 tokens of system prompt, then 40 of the user's own */
        for (int j = 64; j < 104; j++) q.prompt[j] = T(users[i]);
        char want[2048];
        cold_text(&q, want, sizeof want);
        int log_from = fx.f->n_log;
        client c;
        run_one(&fx, &q, &c);
        assert_string_equal(c.text, want);
        assert_int_equal(c.last.cached_tokens, cached[i]);
        if (i == 1) assert_true(logged_at(fx.f, log_from, 64, q.prompt[64])); /* its prefill cut at 64 */
        client_destroy(&c);
    }
    fx_stop(&fx);
}

/* Thousands of requests on a hybrid model with a KV pool too small for its rows (so running
 * requests are preempted), a quarter cancelled at once and a quarter while they run, prompts
 * sharing prefixes (so snapshots are made, hit and evicted): afterwards no state slot is held
 * by anyone, the snapshots stay within their bound, and no request failed.  Bounded: at most
 * 120 s of polling in all (it takes a few seconds). */
static void test_hybrid_state_slots_never_leak(void **state)
{
    (void)state;
    enum { TOTAL = 3000, IN_FLIGHT = 24 };
    fixture fx;
    fx_start_hybrid(&fx, 4, MAX_CTX, 64, IN_FLIGHT, 12, 0, 8); /* 12 blocks: 384 positions for 4 rows */
    static client cl[IN_FLIGHT];
    sched_req *rq[IN_FLIGHT] = {0};
    bool cancel_running[IN_FLIGHT] = {0};
    int submitted = 0, done = 0, polls = 0;
    uint64_t rng = 12345;
    while (done < TOTAL) {
        for (int k = 0; k < IN_FLIGHT; k++) {
            if (!rq[k] && submitted < TOTAL) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                int n = 10 + (int)(rng >> 33) % 140, max = 1 + (int)(rng >> 45) % 80;
                req_spec q = convo(n, max);
                if (submitted % 3 == 0) q.prompt[n - 1] = T("O"); /* a tail of its own */
                client_init(&cl[k]);
                assert_int_equal(submit(&fx, &q, &cl[k], &rq[k]), SCHED_OK);
                if (submitted % 4 == 1) sched_req_cancel(rq[k]);
                cancel_running[k] = submitted % 4 == 2;
                submitted++;
                continue;
            }
            if (!rq[k]) continue;
            if (cancel_running[k] && cl[k].len > 0) sched_req_cancel(rq[k]);
            if (client_poll(&cl[k], rq[k])) {
                assert_int_not_equal(cl[k].finish, SCHED_FINISH_ERROR);
                sched_req_release(rq[k]);
                client_destroy(&cl[k]);
                rq[k] = NULL;
                done++;
            }
        }
        usleep(200);
        if (++polls > 600000) fail_msg("%d of %d requests finished in 120 s", done, TOTAL);
    }
    sched_stats st;
    sched_get_stats(fx.s, &st);
    print_message("  %d requests: %llu preemptions, %llu cancelled, %llu prefix tokens hit, %d snapshots kept\n", TOTAL,
                  (unsigned long long)st.preemptions, (unsigned long long)st.requests_finished[SCHED_FINISH_CANCELLED],
                  (unsigned long long)st.prefix_hit_tokens, st.state_snapshots);
    assert_true(st.preemptions > 0);
    assert_true(st.requests_finished[SCHED_FINISH_CANCELLED] > 0);
    assert_true(st.prefix_hit_tokens > 0);
    assert_int_equal(st.requests_finished[SCHED_FINISH_ERROR], 0);
    assert_int_equal(st.slots_used, 0);
    assert_int_equal(st.state_slots_running, 0);
    assert_true(st.state_snapshots <= 4);
    assert_int_equal(st.kv_blocks_used, 0);
    fx_stop(&fx);
}

/* Index of the first logged step that carries position pos of slot `slot`. */
static int step_at(const fake_engine *f, int slot, int pos)
{
    for (int i = 0; i < f->n_log; i++)
        for (int j = 0; j < f->log[i].n_seqs; j++)
            if (f->log[i].seqs[j].slot == slot && f->log[i].seqs[j].pos == pos) return i;
    return -1;
}

/* Submits n requests (the engine paused, so that they wait together), runs them to the end and
 * checks that each stream is the one it gives alone: admission order changes nothing but when. */
static void run_all_as_alone(fixture *fx, const req_spec *q, int n)
{
    char want[8][2048];
    client c[8];
    sched_req *r[8];
    assert_true(n <= 8);
    for (int i = 0; i < n; i++) cold_text(&q[i], want[i], sizeof want[i]);
    fx_pause(fx, true);
    for (int i = 0; i < n; i++) {
        client_init(&c[i]);
        assert_int_equal(submit(fx, &q[i], &c[i], &r[i]), SCHED_OK);
        if (i == 0) fx_wait_steps(fx, 1); /* the first alone in the first step */
    }
    fx_pause(fx, false);
    for (int i = 0; i < n; i++) {
        client_wait(&c[i], r[i]);
        assert_int_equal(c[i].finish, SCHED_FINISH_LENGTH);
        assert_int_equal(c[i].last.completion_tokens, q[i].max_tokens);
        assert_string_equal(c[i].text, want[i]);
        sched_req_release(r[i]);
        client_destroy(&c[i]);
    }
}

/* A long running request (a: 5 of 10 blocks, 6 by its end) leaves too few blocks for the next
 * one (h: 7), and four short ones (1 block each) wait behind h.  With max_head_passes
 * head_passes, exactly `passes` of them are admitted before h, the rest not before it; h is
 * admitted in the step right after a's last (its wait is bounded), and every stream is what
 * it is alone. */
static void check_head_passes(int head_passes, int passes)
{
    fixture fx;
    fx_start_admit(&fx, 6, MAX_CTX, MAX_CTX, 8, 10, head_passes);
    req_spec q[6] = {spec(T("a"), 150, 40), spec(T("b"), 200, 4), spec(T("c"), 20, 4),
                     spec(T("d"), 20, 4),   spec(T("e"), 20, 4),  spec(T("x"), 20, 4)};
    run_all_as_alone(&fx, q, 6);
    int a_slot = -1, first[6];
    assert_int_equal(first_step_of(fx.f, q[0].prompt[0], &a_slot), 0);
    for (int i = 1; i < 6; i++) first[i] = first_step_of(fx.f, q[i].prompt[0], NULL);
    int a_last = step_at(fx.f, a_slot, 150 + 40 - 2); /* a feeds its 39th token there */
    assert_true(a_last > 0);
    assert_int_equal(first[1], a_last + 1);
    for (int i = 2; i < 6; i++) {
        if (i < 2 + passes) assert_true(first[i] < first[1]);
        else assert_true(first[i] >= first[1]);
    }
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.preemptions, 0);
    fx_stop(&fx);
}

/* Short requests that fit the free blocks pass a long one that does not (first-fit), by
 * default up to n_slots of them; with a bound of 2 only two pass, and the rest wait for the
 * head although they would fit; -1 is strict FIFO. */
static void test_short_requests_pass_a_head_that_does_not_fit(void **state)
{
    (void)state;
    check_head_passes(0, 4); /* default bound n_slots = 6: all four pass */
    check_head_passes(2, 2);
    check_head_passes(-1, 0);
}

/* A preempted request goes back to the head and is not passed: a short request that would fit
 * the block left over waits until the preempted one can be admitted again. */
static void test_preempted_request_keeps_priority(void **state)
{
    (void)state;
    fixture fx;
    fx_start_pool(&fx, 2, 128, 128, 8, 4); /* 4 blocks: a and b (80 tokens each) cannot both end */
    req_spec q[3] = {spec(T("a"), 20, 60), spec(T("b"), 20, 60), spec(T("c"), 20, 2)};
    run_all_as_alone(&fx, q, 3);
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_true(st.preemptions >= 1); /* b, when a needed a third block */
    int a_slot = -1, c_first = first_step_of(fx.f, q[2].prompt[0], NULL);
    assert_int_equal(first_step_of(fx.f, q[0].prompt[0], &a_slot), 0);
    /* c had a row and a block from b's preemption on, but waited for b, which fits only once
     * a has ended. */
    int a_last = step_at(fx.f, a_slot, 20 + 60 - 2);
    assert_true(a_last > 0);
    assert_true(c_first > a_last);
    fx_stop(&fx);
}

/* Embedding requests are prefill-only: each runs whole in one step, packed beside a running
 * chat's decodes and another prompt, holds its row for that step only, and gives back its
 * blocks uncached; its answer (the mean of the fake's hidden rows: the mean token id) comes
 * with its finish.  One longer than the step budget could never run: SCHED_E_TOO_LONG. */
static void test_embeddings_are_prefill_only(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 3, 64, 16, 4);
    req_spec chat = spec(T("a"), 3, 12);
    client cc, ce[2];
    sched_req *rc, *re[2];
    client_init(&cc);
    assert_int_equal(submit(&fx, &chat, &cc, &rc), SCHED_OK);
    fx_wait_steps(&fx, 1);
    engine_embed em = {.pooling = ENGINE_POOL_MEAN};
    req_spec eq[2] = {spec(T("b"), 5, 1), spec(T("c"), 9, 1)};
    for (int i = 0; i < 2; i++) {
        client_init(&ce[i]);
        sched_params p = {.prompt = eq[i].prompt, .n_prompt = eq[i].n_prompt, .max_tokens = 1, .embed = &em};
        sampling_params_default(&p.sp);
        assert_int_equal(sched_submit(fx.s, &p, client_wake, &ce[i], &re[i]), SCHED_OK);
    }
    req_spec big = spec(T("d"), 17, 1);
    sched_params pb = {.prompt = big.prompt, .n_prompt = big.n_prompt, .max_tokens = 1, .embed = &em};
    sampling_params_default(&pb.sp);
    sched_req *rb = NULL;
    assert_int_equal(sched_submit(fx.s, &pb, NULL, NULL, &rb), SCHED_E_TOO_LONG);
    for (int i = 0; i < 2; i++) {
        client_wait(&ce[i], re[i]);
        assert_int_equal(ce[i].finish, SCHED_FINISH_STOP);
        assert_int_equal(ce[i].n_emb, FAKE_EMBD);
        double mean = 0;
        for (int j = 0; j < eq[i].n_prompt; j++) mean += eq[i].prompt[j];
        mean /= eq[i].n_prompt;
        for (int d = 0; d < FAKE_EMBD; d++) assert_true(fabs(ce[i].emb[d] - mean) < 1e-4);
        assert_int_equal(ce[i].len, 0); /* no text */
        sched_req_release(re[i]);
    }
    client_wait(&cc, rc);
    sched_req_release(rc);
    const fake_engine *f = fx.f;
    for (int i = 0; i < 2; i++) { /* one step, whole, wanting no token, beside a's decode */
        int slot = -1, first = first_step_of(f, eq[i].prompt[0], &slot), seen = 0;
        assert_true(first >= 0);
        for (int s = 0; s < f->n_log; s++)
            for (int j = 0; j < f->log[s].n_seqs; j++) {
                const logged_seq *q = &f->log[s].seqs[j];
                if (q->first != eq[i].prompt[0] || q->pos != 0) continue;
                seen++;
                assert_int_equal(q->n_tokens, eq[i].n_prompt);
                assert_false(q->want);
            }
        assert_int_equal(seen, 1);
        assert_true(f->log[first].n_seqs >= 2); /* packed with other work */
        assert_true(f->clears[slot] >= 1);      /* the row was let go after its step */
    }
    sched_stats st;
    sched_get_stats(fx.s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_true(st.kv_blocks_cached <= 1); /* the chat's, never an embedding's */
    assert_int_equal(st.prefix_lookup_tokens, chat.n_prompt); /* nor are embeddings looked up */
    client_destroy(&cc);
    for (int i = 0; i < 2; i++) client_destroy(&ce[i]);
    fx_stop(&fx);
}

/* Submits an embedding request (mean pooling) of q's prompt; shares_place as sched_params. */
static int submit_embed(fixture *fx, const req_spec *q, bool shares_place, client *c, sched_req **r)
{
    static const engine_embed em = {.pooling = ENGINE_POOL_MEAN};
    sched_params p = {.prompt = q->prompt, .n_prompt = q->n_prompt, .max_tokens = 1, .embed = &em,
                      .shares_place = shares_place};
    sampling_params_default(&p.sp);
    return sched_submit(fx->s, &p, c ? client_wake : NULL, c, r);
}

/* An embedding on a hybrid model computes its whole prompt from position 0 in one step, like
 * anywhere else: neither a prefix hit on a state snapshot a chat left (mean pooling needs every
 * position) nor the prefill cut at the prompt's last block boundary (an embedding finishes
 * after its one chunk) may shorten it. */
static void test_hybrid_embedding_whole(void **state)
{
    (void)state;
    fixture fx;
    fx_start_hybrid(&fx, 2, MAX_CTX, 160, 8, 0, 0, 4);
    req_spec a = convo(130, 4);
    client c;
    for (int run = 0; run < 2; run++) {
        if (run == 1) { /* a chat of the same prompt leaves a snapshot at 128 */
            run_one(&fx, &a, &c);
            client_destroy(&c);
        }
        sched_req *r;
        client_init(&c);
        assert_int_equal(submit_embed(&fx, &a, false, &c, &r), SCHED_OK);
        client_wait(&c, r);
        assert_int_equal(c.finish, SCHED_FINISH_STOP);
        assert_int_equal(c.n_emb, FAKE_EMBD);
        double mean = 0;
        for (int j = 0; j < a.n_prompt; j++) mean += a.prompt[j];
        mean /= a.n_prompt;
        for (int d = 0; d < FAKE_EMBD; d++) assert_true(fabs(c.emb[d] - mean) < 1e-4);
        sched_req_release(r);
        client_destroy(&c);
    }
    fx_stop(&fx);
}

/* Prefill-only tokens of logged step i: sequences at position 0 that want no token (the fake's
 * chats want their last prompt chunk's token). */
static int embed_tokens_of_step(const fake_engine *f, int i, int *n_embeds)
{
    int n = 0;
    *n_embeds = 0;
    for (int j = 0; j < f->log[i].n_seqs; j++)
        if (f->log[i].seqs[j].pos == 0 && !f->log[i].seqs[j].want) n += f->log[i].seqs[j].n_tokens, ++*n_embeds;
    return n;
}

/* sched_config.embed_step_tokens: while a chat decodes, a burst of embeddings (8 tokens each,
 * 4 credited per decode step) joins one step in two, one at a time, so the prefill-only tokens
 * of the first k mixed steps never exceed 4k; once no stream decodes, the next burst runs as
 * many per step as the step budget holds (4 x 8 of 32). */
static void test_embeddings_beside_decodes_take_their_share(void **state)
{
    (void)state;
    fixture fx;
    fx_start_embed(&fx, 4, 64, 32, 16, 0, 0, 0, 4);
    enum { N_EMB = 6, EMB_LEN = 8 };
    req_spec chat = spec(T("a"), 3, 30);
    chat.ignore_eos = true;
    client cc, ce[N_EMB];
    sched_req *rc, *re[N_EMB];
    req_spec eq[N_EMB];
    const char *keys[N_EMB] = {"b", "c", "d", "e", "x", "y"};
    client_init(&cc);
    fx_pause(&fx, true); /* the burst comes while the engine holds the chat's prompt step */
    assert_int_equal(submit(&fx, &chat, &cc, &rc), SCHED_OK);
    fx_wait_steps(&fx, 1);
    for (int i = 0; i < N_EMB; i++) {
        eq[i] = spec(T(keys[i]), EMB_LEN, 1);
        client_init(&ce[i]);
        assert_int_equal(submit_embed(&fx, &eq[i], false, &ce[i], &re[i]), SCHED_OK);
    }
    fx_pause(&fx, false);
    for (int i = 0; i < N_EMB; i++) client_wait(&ce[i], re[i]);
    client_wait(&cc, rc);
    int chat_slot = -1;
    assert_int_equal(first_step_of(fx.f, T("a"), &chat_slot), 0);
    int mixed = 0, paid = 0, carried = 0;
    for (int i = 0; i < fx.f->n_log; i++) {
        bool decodes = false;
        for (int j = 0; j < fx.f->log[i].n_seqs; j++) decodes |= fx.f->log[i].seqs[j].slot == chat_slot &&
                                                                  fx.f->log[i].seqs[j].pos >= chat.n_prompt;
        int n_embeds, tokens = embed_tokens_of_step(fx.f, i, &n_embeds);
        carried += n_embeds;
        if (!decodes) continue;
        mixed++;
        paid += tokens;
        assert_true(n_embeds <= 1);
        assert_true(paid <= 4 * mixed); /* the credit: 4 tokens a step with decodes */
    }
    assert_int_equal(carried, N_EMB);
    assert_true(paid == N_EMB * EMB_LEN); /* the chat (30 tokens) outlived the burst */
    for (int i = 0; i < N_EMB; i++) {
        assert_int_equal(ce[i].finish, SCHED_FINISH_STOP);
        sched_req_release(re[i]);
        client_destroy(&ce[i]);
    }
    sched_req_release(rc);
    client_destroy(&cc);

    /* no stream decodes: four embeddings fill one step.  They are submitted while the engine
     * holds a one-token request's step, so the scheduler plans them all at once after it. */
    int from = fx.f->n_log, started = fx.f->steps_started;
    req_spec one = spec(T("z"), 3, 1);
    sched_req *rb;
    client_init(&cc);
    fx_pause(&fx, true);
    assert_int_equal(submit(&fx, &one, &cc, &rb), SCHED_OK);
    fx_wait_steps(&fx, started + 1);
    for (int i = 0; i < 4; i++) {
        eq[i] = spec(T(keys[i]), EMB_LEN, 1);
        client_init(&ce[i]);
        assert_int_equal(submit_embed(&fx, &eq[i], false, &ce[i], &re[i]), SCHED_OK);
    }
    fx_pause(&fx, false);
    client_wait(&cc, rb);
    sched_req_release(rb);
    client_destroy(&cc);
    for (int i = 0; i < 4; i++) {
        client_wait(&ce[i], re[i]);
        sched_req_release(re[i]);
        client_destroy(&ce[i]);
    }
    int n_embeds = 0;
    for (int i = from; i < fx.f->n_log && n_embeds == 0; i++) embed_tokens_of_step(fx.f, i, &n_embeds);
    assert_int_equal(n_embeds, 4);
    fx_stop(&fx);
}

/* One embedding request is one queued request however many inputs it has: with room for a
 * single request (one row, no queue), a request of six inputs (one place reserved, taken by its
 * last input, the other five riding on it) is accepted whole, another request is refused until
 * it finished, and riding is for embeddings only. */
static void test_embedding_inputs_share_one_place(void **state)
{
    (void)state;
    fixture fx;
    fx_start(&fx, 1, 64, 32, 0);
    enum { N = 6 };
    req_spec eq[N], chat = spec(T("a"), 3, 2);
    client ce[N], cc;
    sched_req *re[N], *rc = NULL;
    fx_pause(&fx, true);
    assert_int_equal(sched_reserve(fx.s, 1), SCHED_OK);
    for (int i = 0; i < N; i++) {
        eq[i] = spec(T("b"), 4 + i, 1);
        client_init(&ce[i]);
        if (i < N - 1) {
            assert_int_equal(submit_embed(&fx, &eq[i], true, &ce[i], &re[i]), SCHED_OK);
            continue;
        }
        engine_embed em = {.pooling = ENGINE_POOL_MEAN};
        sched_params p = {.prompt = eq[i].prompt, .n_prompt = eq[i].n_prompt, .max_tokens = 1, .embed = &em,
                          .reserved = true};
        sampling_params_default(&p.sp);
        assert_int_equal(sched_submit(fx.s, &p, client_wake, &ce[i], &re[i]), SCHED_OK);
    }
    client_init(&cc);
    assert_int_equal(submit(&fx, &chat, &cc, &rc), SCHED_E_QUEUE_FULL);
    sched_params bad = {.prompt = chat.prompt, .n_prompt = chat.n_prompt, .max_tokens = 2, .shares_place = true};
    sampling_params_default(&bad.sp);
    assert_int_equal(sched_submit(fx.s, &bad, NULL, NULL, &rc), SCHED_E_INVALID);
    fx_pause(&fx, false);
    for (int i = 0; i < N; i++) {
        client_wait(&ce[i], re[i]);
        assert_int_equal(ce[i].finish, SCHED_FINISH_STOP);
        sched_req_release(re[i]);
        client_destroy(&ce[i]);
    }
    run_one(&fx, &chat, &cc); /* the place is free again */
    assert_true(cc.finish == SCHED_FINISH_STOP || cc.finish == SCHED_FINISH_LENGTH);
    client_destroy(&cc);
    fx_stop(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_admission_and_slot_reuse),
        cmocka_unit_test(test_queue_full_too_long_invalid),
        cmocka_unit_test(test_chunked_prefill_interleaves_with_decodes),
        cmocka_unit_test(test_concurrent_same_as_alone),
        cmocka_unit_test(test_cancel_frees_slot_without_affecting_others),
        cmocka_unit_test(test_stop_string_across_tokens),
        cmocka_unit_test(test_utf8_never_split),
        cmocka_unit_test(test_eos_and_ignore_eos),
        cmocka_unit_test(test_max_tokens_length),
        cmocka_unit_test(test_engine_error_isolated),
        cmocka_unit_test(test_engine_fatal_fails_everything),
        cmocka_unit_test(test_shutdown_and_drain),
        cmocka_unit_test(test_destroy_with_live_requests),
        cmocka_unit_test(test_release_from_wake_callback),
        cmocka_unit_test(test_idle_does_not_spin),
        cmocka_unit_test(test_prefix_cache_hits_at_every_boundary),
        cmocka_unit_test(test_prefix_cache_eviction),
        cmocka_unit_test(test_preemption_and_resume),
        cmocka_unit_test(test_hybrid_prefix_snapshots),
        cmocka_unit_test(test_hybrid_shared_system_prompt),
        cmocka_unit_test(test_hybrid_state_slots_never_leak),
        cmocka_unit_test(test_short_requests_pass_a_head_that_does_not_fit),
        cmocka_unit_test(test_preempted_request_keeps_priority),
        cmocka_unit_test(test_embeddings_are_prefill_only),
        cmocka_unit_test(test_hybrid_embedding_whole),
        cmocka_unit_test(test_embeddings_beside_decodes_take_their_share),
        cmocka_unit_test(test_embedding_inputs_share_one_place),
    };
    return cmocka_run_group_tests(tests, build_tokenizer, free_tokenizer);
}
