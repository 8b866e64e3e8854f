/* engine.c - backend-independent entry points of engine.h: argument checks that every backend
 * would otherwise repeat, then dispatch through the backend's vtable. */
#include "engine_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sampling_params_default(sampling_params *sp)
{
    *sp = (sampling_params){
        .temperature = 0.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .seed = 0,
        .repeat_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 64,
        .n_top_logprobs = -1,
    };
}

int engine_kv_blocks_per_seq(const engine *e)
{
    return (e->cfg.ctx_per_slot + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK;
}

int32_t engine_seq_block(const engine *e, const engine_seq *s, int index)
{
    return s->blocks ? s->blocks[index] : s->slot * engine_kv_blocks_per_seq(e) + index;
}

int32_t engine_seq_block_swa(const engine *e, const engine_seq *s, int index)
{
    const int ring = engine_kv_swa_ring(e);
    return s->blocks_swa ? s->blocks_swa[index] : s->slot * ring + index % ring;
}

int engine_seq_state(const engine_seq *s) { return s->blocks ? s->state : s->slot; }

/* Every block the sequence reaches must be in the pool; a NULL table needs the row's fixed
 * blocks to exist. */
static int check_blocks(const engine *e, const engine_seq *s, int i, char *err, size_t errlen)
{
    int last = (s->pos + s->n_tokens - 1) / ENGINE_KV_BLOCK;
    for (int b = s->blocks ? 0 : last; b <= last; b++) {
        int32_t id = engine_seq_block(e, s, b);
        if (id < 0 || id >= e->kv_blocks) {
            snprintf(err, errlen, "seq %d: KV block %d (entry %d of its table) is not in the pool of %d%s", i,
                     (int)id, b, e->kv_blocks, s->blocks ? "" : " (no block table: the row's fixed blocks)");
            return ENGINE_EINVAL;
        }
    }
    if (!e->kv_blocks_swa) return 0;
    /* the sliding table: from the window of the step's first query on */
    for (int b = engine_swa_first_block(s->pos, e->swa_window); b <= last; b++) {
        int32_t id = engine_seq_block_swa(e, s, b);
        if (id < 0 || id >= e->kv_blocks_swa) {
            snprintf(err, errlen, "seq %d: sliding KV block %d (entry %d of its sliding table) is not in the pool of %d%s",
                     i, (int)id, b, e->kv_blocks_swa, s->blocks_swa ? "" : " (no sliding table: the row's ring)");
            return ENGINE_EINVAL;
        }
    }
    return 0;
}

static const char *const POOLING_NAMES[ENGINE_POOL_COUNT] = {"none", "mean", "cls", "last", "rank"};

const char *engine_pooling_name(engine_pooling p)
{
    return (unsigned)p < ENGINE_POOL_COUNT ? POOLING_NAMES[p] : "unknown";
}

int engine_pooling_parse(const char *name)
{
    for (int i = 0; i < ENGINE_POOL_COUNT; i++)
        if (strcmp(name, POOLING_NAMES[i]) == 0) return i;
    return -1;
}

bool engine_has_lm_head(const engine *e) { return !e->m->hp.encoder; }

size_t engine_embed_floats(const engine *e, engine_pooling pooling, int n_tokens)
{
    if (pooling == ENGINE_POOL_RANK) return 1;
    size_t d = (size_t)e->m->hp.n_embd;
    return pooling == ENGINE_POOL_NONE ? d * (size_t)(n_tokens > 0 ? n_tokens : 0) : d;
}

/* An embedding comes whole and wants nothing else; an encoder (no LM head, attention over
 * the whole sequence) runs nothing but whole sequences that want their hidden states. */
static int check_embed(const engine *e, const engine_seq *s, int i, char *err, size_t errlen)
{
    const engine_embed *em = s->embed;
    if (em) {
        if (s->pos != 0 || s->want_token || s->logits || !em->out || (unsigned)em->pooling >= ENGINE_POOL_COUNT) {
            snprintf(err, errlen, "seq %d: an embedding is one whole sequence from position 0 with an output, "
                     "a known pooling, and no token or logits wanted", i);
            return ENGINE_EINVAL;
        }
        if (em->pooling == ENGINE_POOL_RANK) {
            if (!engine_has_lm_head(e)) {
                snprintf(err, errlen, "seq %d: rank pooling needs an LM head, which %s has not", i, e->m->desc->name);
                return ENGINE_EINVAL;
            }
            for (int k = 0; k < 2; k++) {
                if (em->rank_ids[k] < 0 || em->rank_ids[k] >= e->m->hp.n_vocab) {
                    snprintf(err, errlen, "seq %d: rank token id %d out of vocabulary", i, (int)em->rank_ids[k]);
                    return ENGINE_EINVAL;
                }
            }
        }
    }
    if (e->m->pos_embd.data && s->pos + s->n_tokens > e->m->hp.n_ctx_train) { /* an absolute position table */
        snprintf(err, errlen, "seq %d: %d tokens, more than the %d positions of %s's position table", i,
                 s->pos + s->n_tokens, e->m->hp.n_ctx_train, e->m->desc->name);
        return ENGINE_EINVAL;
    }
    if (!engine_has_lm_head(e) && (s->want_token || s->logits || s->pos != 0 || !(em || s->hidden))) {
        snprintf(err, errlen, "seq %d: %s is an encoder: it runs whole sequences for their hidden states only", i,
                 e->m->desc->name);
        return ENGINE_EINVAL;
    }
    return 0;
}

/* What a step's sequence and an MTP pass's share: its row, its tokens in the vocabulary, its
 * positions inside the row's context and the blocks they reach in the pool. */
static int check_span(const engine *e, const engine_seq *s, int i, char *err, size_t errlen)
{
    if (s->slot < 0 || s->slot >= e->cfg.n_slots) {
        snprintf(err, errlen, "seq %d: slot %d out of range [0,%d)", i, s->slot, e->cfg.n_slots);
        return ENGINE_EINVAL;
    }
    if (s->n_tokens < 1 || !s->tokens) {
        snprintf(err, errlen, "seq %d: no tokens", i);
        return ENGINE_EINVAL;
    }
    if (s->pos < 0 || s->pos + s->n_tokens > e->cfg.ctx_per_slot) {
        snprintf(err, errlen, "seq %d: positions %d..%d exceed the slot context %d", i, s->pos,
                 s->pos + s->n_tokens - 1, e->cfg.ctx_per_slot);
        return ENGINE_EINVAL;
    }
    for (int j = 0; j < s->n_tokens; j++) {
        if (s->tokens[j] < 0 || s->tokens[j] >= e->m->hp.n_vocab) {
            snprintf(err, errlen, "seq %d: token id %d out of vocabulary", i, (int)s->tokens[j]);
            return ENGINE_EINVAL;
        }
    }
    return check_blocks(e, s, i, err, errlen);
}

/* A step (or an MTP pass) of total tokens within the batch budget. */
static int check_budget(const engine *e, int total, char *err, size_t errlen)
{
    if (total <= e->cfg.max_batch_tokens) return 0;
    snprintf(err, errlen, "step carries %d tokens, more than the batch budget %d", total, e->cfg.max_batch_tokens);
    return ENGINE_EINVAL;
}

/* Reject a malformed batch before any backend state changes, so a bad batch can never
 * leave a slot half-written. */
static int check_batch(const engine *e, const engine_seq *seqs, int n_seqs, char *err, size_t errlen)
{
    int total = 0;
    for (int i = 0; i < n_seqs; i++) {
        const engine_seq *s = &seqs[i];
        if (check_span(e, s, i, err, errlen) != 0) return ENGINE_EINVAL;
        const int st = engine_seq_state(s);
        if (e->n_states && (st < 0 || st >= e->n_states)) {
            snprintf(err, errlen, "seq %d: state slot %d out of range [0,%d)", i, st, e->n_states);
            return ENGINE_EINVAL;
        }
        for (int k = 0; k < i; k++) {
            if (seqs[k].slot == s->slot) {
                snprintf(err, errlen, "seq %d: slot %d appears twice in one step", i, s->slot);
                return ENGINE_EINVAL;
            }
            if (e->n_states && engine_seq_state(&seqs[k]) == st) {
                snprintf(err, errlen, "seq %d: state slot %d appears twice in one step", i, st);
                return ENGINE_EINVAL;
            }
        }
        if (check_embed(e, s, i, err, errlen) != 0) return ENGINE_EINVAL;
        if (s->hidden_row < 0 || s->hidden_row > s->n_tokens) {
            snprintf(err, errlen, "seq %d: hidden_row %d outside its %d tokens", i, s->hidden_row, s->n_tokens);
            return ENGINE_EINVAL;
        }
        if (s->n_sample < 0 || (s->n_sample > 1 && (!s->want_token || !s->sampled || s->n_sample > s->n_tokens ||
                                                    s->n_sample > 1 + e->cfg.max_draft || s->logits || s->embed))) {
            snprintf(err, errlen, "seq %d: %d samples need a token wanted, a results array, at most its %d tokens "
                     "and at most 1 + max_draft (%d), and no logits or embedding", i, s->n_sample, s->n_tokens,
                     1 + e->cfg.max_draft);
            return ENGINE_EINVAL;
        }
        if (s->want_token && !s->sp) {
            snprintf(err, errlen, "seq %d: wants a token but has no sampling parameters", i);
            return ENGINE_EINVAL;
        }
        total += s->n_tokens;
    }
    return check_budget(e, total, err, errlen);
}

/* Grows *buf to hold n elements of size elem; false when memory ran out. */
static bool grow(void **buf, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap) return true;
    void *p = realloc(*buf, n * elem);
    if (!p) return false;
    *buf = p;
    *cap = n;
    return true;
}

/* The pooled answer of one embedding sequence from its hidden states (rows of n_embd) or, for
 * RANK, its last token's logits.  Sums in double, in token order: the same bits whatever the
 * batch or the backend that produced the rows. */
static void pool_one(const engine *e, const engine_seq *s, const float *hidden, const float *logits)
{
    const engine_embed *em = s->embed;
    const int d = e->m->hp.n_embd, n = s->n_tokens;
    if (em->pooling == ENGINE_POOL_RANK) {
        double z = (double)logits[em->rank_ids[0]] - (double)logits[em->rank_ids[1]];
        em->out[0] = (float)(1.0 / (1.0 + exp(-z)));
        return;
    }
    if (em->pooling == ENGINE_POOL_NONE) {
        memcpy(em->out, hidden, (size_t)n * d * sizeof(float));
        return;
    }
    double norm = 0;
    for (int j = 0; j < d; j++) {
        double v;
        if (em->pooling == ENGINE_POOL_MEAN) {
            v = 0;
            for (int t = 0; t < n; t++) v += hidden[(size_t)t * d + j];
            v /= n;
        } else {
            v = hidden[j]; /* cls / last: the one row step_embed asked for */
        }
        em->out[j] = (float)v;
        norm += v * v;
    }
    if (!em->normalize || norm <= 0) return;
    double inv = 1.0 / sqrt(norm);
    for (int j = 0; j < d; j++) em->out[j] = (float)(em->out[j] * inv);
}

/* The hidden rows an embedding's pooling reads: every token's for none and mean, one for cls
 * and last. */
static int embed_rows(const engine_seq *s)
{
    engine_pooling p = s->embed->pooling;
    return p == ENGINE_POOL_NONE || p == ENGINE_POOL_MEAN ? s->n_tokens : 1;
}

/* A batch with embedding sequences: the backend sees a copy whose embed sequences bring their
 * hidden states (or, for RANK, their last logits) into engine.c's scratch, pooled after the
 * step.  Backends thus implement only `hidden`, and pooling is one code for all of them. */
static int step_embed(engine *e, const engine_seq *seqs, int n_seqs, engine_result *results, char *err,
                      size_t errlen)
{
    size_t n_hidden = 0, n_logits = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (!seqs[i].embed) continue;
        if (seqs[i].embed->pooling == ENGINE_POOL_RANK) n_logits += (size_t)e->m->hp.n_vocab;
        else n_hidden += (size_t)embed_rows(&seqs[i]) * e->m->hp.n_embd;
    }
    if (!grow((void **)&e->emb_seqs, &e->emb_seqs_cap, (size_t)n_seqs, sizeof *e->emb_seqs) ||
        !grow((void **)&e->emb_hidden, &e->emb_hidden_cap, n_hidden, sizeof(float)) ||
        !grow((void **)&e->emb_logits, &e->emb_logits_cap, n_logits, sizeof(float))) {
        snprintf(err, errlen, "out of memory for the embeddings of a step");
        return ENGINE_EINVAL;
    }
    size_t at_h = 0, at_l = 0;
    for (int i = 0; i < n_seqs; i++) {
        engine_seq *q = &e->emb_seqs[i];
        *q = seqs[i];
        if (!q->embed) continue;
        if (q->embed->pooling == ENGINE_POOL_RANK) {
            q->logits = e->emb_logits + at_l;
            at_l += (size_t)e->m->hp.n_vocab;
        } else {
            q->hidden = e->emb_hidden + at_h;
            /* cls and last read one row: the backend brings back only that one */
            q->hidden_row = q->embed->pooling == ENGINE_POOL_CLS ? 1 : q->embed->pooling == ENGINE_POOL_LAST ? q->n_tokens : 0;
            at_h += (size_t)embed_rows(q) * e->m->hp.n_embd;
        }
    }
    int rc = e->vt->step(e, e->emb_seqs, n_seqs, results, err, errlen);
    if (rc != 0) return rc;
    for (int i = 0; i < n_seqs; i++) {
        const engine_seq *q = &e->emb_seqs[i];
        if (!q->embed) continue;
        int first, rows = engine_hidden_rows(q, &first);
        if (seqs[i].hidden && q->hidden) memcpy(seqs[i].hidden, q->hidden, (size_t)rows * e->m->hp.n_embd * sizeof(float));
        pool_one(e, q, q->hidden, q->logits);
    }
    return 0;
}

int engine_step(engine *e, const engine_seq *seqs, int n_seqs, engine_result *results, char *err,
                size_t errlen)
{
    if (n_seqs <= 0) return 0;
    if (check_batch(e, seqs, n_seqs, err, errlen) != 0) return ENGINE_EINVAL;
    for (int i = 0; i < n_seqs; i++)
        if (seqs[i].embed) return step_embed(e, seqs, n_seqs, results, err, errlen);
    return e->vt->step(e, seqs, n_seqs, results, err, errlen);
}

/* engine_decode_rounds's batch: one-token decodes whose last round fits (its positions, its
 * blocks), on top of check_batch's checks of round 0. */
static int check_rounds(const engine *e, const engine_seq *seqs, int n, int rounds, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++) {
        engine_seq last = seqs[i];
        if (last.n_tokens != 1 || !last.want_token || last.n_sample > 1 || last.logits || last.hidden || last.embed) {
            snprintf(err, errlen, "seq %d: decode rounds take one token that wants a token, and nothing else", i);
            return ENGINE_EINVAL;
        }
        last.pos += rounds - 1;
        if (last.pos >= e->cfg.ctx_per_slot) {
            snprintf(err, errlen, "seq %d: %d rounds from position %d exceed the slot context %d", i, rounds,
                     seqs[i].pos, e->cfg.ctx_per_slot);
            return ENGINE_EINVAL;
        }
        if (check_blocks(e, &last, i, err, errlen) != 0) return ENGINE_EINVAL;
    }
    return 0;
}

int engine_decode_rounds(engine *e, const engine_seq *seqs, int n_seqs, int rounds, engine_result *results,
                         char *err, size_t errlen)
{
    if (n_seqs <= 0 || rounds <= 0) return 0;
    if (check_batch(e, seqs, n_seqs, err, errlen) != 0 || check_rounds(e, seqs, n_seqs, rounds, err, errlen) != 0)
        return ENGINE_EINVAL;
    if (e->vt->decode_rounds) return e->vt->decode_rounds(e, seqs, n_seqs, rounds, results, err, errlen);
    return engine_rounds_as_steps(e, seqs, n_seqs, rounds, results, err, errlen);
}

int engine_rounds_as_steps(engine *e, const engine_seq *seqs, int n_seqs, int rounds, engine_result *results,
                           char *err, size_t errlen)
{
    engine_seq *cur = malloc((size_t)n_seqs * sizeof *cur);
    if (!cur) {
        snprintf(err, errlen, "out of memory for %d sequences' decode rounds", n_seqs);
        return ENGINE_EINVAL;
    }
    memcpy(cur, seqs, (size_t)n_seqs * sizeof *cur);
    int rc = 0;
    for (int r = 0; r < rounds && rc == 0; r++) {
        rc = e->vt->step(e, cur, n_seqs, results + (size_t)r * n_seqs, err, errlen);
        for (int i = 0; i < n_seqs; i++) { /* the next round feeds this one's sample */
            cur[i].tokens = &results[(size_t)r * n_seqs + i].token;
            cur[i].pos++;
            cur[i].allowed = NULL;
        }
    }
    free(cur);
    return rc;
}

int engine_verify_accept(const int32_t *draft, int n_draft, const engine_result *samples)
{
    int a = 0;
    while (a < n_draft && samples[a].token == draft[a]) a++;
    return a;
}

bool engine_has_mtp(const engine *e) { return e->vt->mtp_step && e->cfg.mtp && e->m->mtp.bound; }

static int check_mtp(const engine *e, const engine_mtp_seq *seqs, int n_seqs, char *err, size_t errlen)
{
    if (!engine_has_mtp(e)) {
        snprintf(err, errlen, "the %s engine runs no MTP block (%s)", e->vt->name,
                 !e->m->mtp.bound ? "the model has none" : !e->cfg.mtp ? "engine_config.mtp is off" : "not built");
        return ENGINE_EINVAL;
    }
    if (n_seqs < 1 || n_seqs > e->cfg.n_slots) {
        snprintf(err, errlen, "%d MTP sequences: 1 to n_slots (%d)", n_seqs, e->cfg.n_slots);
        return ENGINE_EINVAL;
    }
    int total = 0;
    for (int i = 0; i < n_seqs; i++) {
        const engine_mtp_seq *s = &seqs[i];
        /* the positions as a step's sequence, for the checks a step's get */
        const engine_seq as_seq = {.slot = s->slot, .tokens = s->tokens, .n_tokens = s->n_tokens, .pos = s->pos,
                                   .blocks = s->blocks};
        if (check_span(e, &as_seq, i, err, errlen) != 0) return ENGINE_EINVAL;
        if (!s->hidden) {
            snprintf(err, errlen, "MTP seq %d: no hidden rows", i);
            return ENGINE_EINVAL;
        }
        for (int k = 0; k < i; k++) {
            if (seqs[k].slot == s->slot) {
                snprintf(err, errlen, "MTP seq %d: slot %d appears twice in one step", i, s->slot);
                return ENGINE_EINVAL;
            }
        }
        total += s->n_tokens;
    }
    return check_budget(e, total, err, errlen);
}

int engine_mtp_step(engine *e, const engine_mtp_seq *seqs, int n_seqs, char *err, size_t errlen)
{
    if (check_mtp(e, seqs, n_seqs, err, errlen) != 0) return ENGINE_EINVAL;
    return e->vt->mtp_step(e, seqs, n_seqs, err, errlen);
}

void engine_slot_clear(engine *e, int slot)
{
    if (slot >= 0 && slot < e->cfg.n_slots) e->vt->slot_clear(e, slot);
}

/* A block copy in a pool of n blocks (what: "" or "sliding ") through the backend's fn. */
static int kv_copy_in(engine *e, int (*fn)(engine *, int, int, char *, size_t), int n, const char *what, int dst,
                      int src, char *err, size_t errlen)
{
    if (!n || !fn) {
        snprintf(err, errlen, "%sKV copy: the engine has no such pool", what);
        return ENGINE_EINVAL;
    }
    if (dst < 0 || dst >= n || src < 0 || src >= n) {
        snprintf(err, errlen, "%sKV copy %d -> %d: block outside the pool of %d", what, src, dst, n);
        return ENGINE_EINVAL;
    }
    if (dst == src) return 0;
    return fn(e, dst, src, err, errlen);
}

int engine_kv_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    return kv_copy_in(e, e->vt->kv_copy, e->kv_blocks, "", dst, src, err, errlen);
}

int engine_kv_copy_swa(engine *e, int dst, int src, char *err, size_t errlen)
{
    return kv_copy_in(e, e->vt->kv_copy_swa, e->kv_blocks_swa, "sliding ", dst, src, err, errlen);
}

int engine_state_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    if (!e->n_states || !e->vt->state_copy) {
        snprintf(err, errlen, "state copy: %s has no recurrent state", e->m->desc->name);
        return ENGINE_EINVAL;
    }
    if (dst < 0 || dst >= e->n_states || src < 0 || src >= e->n_states) {
        snprintf(err, errlen, "state copy %d -> %d: slot outside the pool of %d", src, dst, e->n_states);
        return ENGINE_EINVAL;
    }
    if (dst == src) return 0;
    return e->vt->state_copy(e, dst, src, err, errlen);
}

bool engine_can_rewind_state(const engine *e) { return e->vt->state_copy && e->vt->rewinds_state; }

size_t engine_state_bytes(const engine *e) { return e->state_bytes; }

int engine_state_slots(const engine *e) { return e->n_states; }

int engine_kv_blocks(const engine *e) { return e->kv_blocks; }

int engine_kv_blocks_swa(const engine *e) { return e->kv_blocks_swa; }

int engine_kv_swa_window(const engine *e) { return e->kv_blocks_swa ? e->swa_window : 0; }

static int swa_ring(const engine_config *cfg, int window)
{
    return (window + cfg->max_batch_tokens + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK + 1;
}

int engine_kv_swa_ring(const engine *e) { return e->kv_blocks_swa ? swa_ring(&e->cfg, e->swa_window) : 0; }

int engine_swa_pool_window(const model *m, const engine_config *cfg)
{
    if (cfg->no_swa_pool) return 0;
    int window = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *ly = &m->layers[il];
        if (ly->recipe.attn == ARCH_ATTN_LINEAR || m->layers[ly->kv_source].window == 0) continue;
        if (ly->window == 0) return 0;
        if (ly->window > window) window = ly->window;
    }
    const int table_width = (cfg->ctx_per_slot + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK;
    return window > 0 && swa_ring(cfg, window) < table_width ? window : 0;
}

bool engine_swa_layer(const model *m, int il, int window)
{
    const model_layer *ly = &m->layers[il];
    return window > 0 && ly->recipe.attn != ARCH_ATTN_LINEAR && m->layers[ly->kv_source].window > 0;
}

size_t engine_swa_pool_blocks(const engine_config *cfg, int window)
{
    if (!window) return 0;
    return (size_t)cfg->n_slots * (size_t)(swa_ring(cfg, window) + (window + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK + 1);
}

size_t engine_kv_block_bytes(const engine *e) { return e->kv_block_bytes; }

size_t engine_kv_block_bytes_swa(const engine *e) { return e->kv_blocks_swa ? e->kv_block_bytes_swa : 0; }

size_t engine_kv_seq_bytes(const engine *e, int n_tokens)
{
    size_t full = (size_t)(n_tokens + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK * e->kv_block_bytes;
    if (!e->kv_blocks_swa) return full;
    return full + (size_t)engine_swa_blocks_held(n_tokens, e->swa_window) * e->kv_block_bytes_swa;
}

void engine_free(engine *e)
{
    if (!e) return;
    free(e->emb_seqs);
    free(e->emb_hidden);
    free(e->emb_logits);
    e->vt->destroy(e);
}

const char *engine_name(const engine *e) { return e->vt->name; }

const engine_config *engine_get_config(const engine *e) { return &e->cfg; }

const model *engine_model(const engine *e) { return e->m; }
