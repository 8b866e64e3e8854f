/* engine.c - backend-independent entry points of engine.h: argument checks that every backend
 * would otherwise repeat, then dispatch through the backend's vtable. */
#include "engine_impl.h"

#include <stdio.h>

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
    return 0;
}

/* Reject a malformed batch before any backend state changes, so a bad batch can never
 * leave a slot half-written. */
static int check_batch(const engine *e, const engine_seq *seqs, int n_seqs, char *err, size_t errlen)
{
    int total = 0;
    for (int i = 0; i < n_seqs; i++) {
        const engine_seq *s = &seqs[i];
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
        if (check_blocks(e, s, i, err, errlen) != 0) return ENGINE_EINVAL;
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
        if (s->want_token && !s->sp) {
            snprintf(err, errlen, "seq %d: wants a token but has no sampling parameters", i);
            return ENGINE_EINVAL;
        }
        total += s->n_tokens;
    }
    if (total > e->cfg.max_batch_tokens) {
        snprintf(err, errlen, "step carries %d tokens, more than the batch budget %d", total,
                 e->cfg.max_batch_tokens);
        return ENGINE_EINVAL;
    }
    return 0;
}

int engine_step(engine *e, const engine_seq *seqs, int n_seqs, engine_result *results, char *err,
                size_t errlen)
{
    if (n_seqs <= 0) return 0;
    if (check_batch(e, seqs, n_seqs, err, errlen) != 0) return ENGINE_EINVAL;
    return e->vt->step(e, seqs, n_seqs, results, err, errlen);
}

void engine_slot_clear(engine *e, int slot)
{
    if (slot >= 0 && slot < e->cfg.n_slots) e->vt->slot_clear(e, slot);
}

int engine_kv_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    if (dst < 0 || dst >= e->kv_blocks || src < 0 || src >= e->kv_blocks) {
        snprintf(err, errlen, "KV copy %d -> %d: block outside the pool of %d", src, dst, e->kv_blocks);
        return ENGINE_EINVAL;
    }
    if (dst == src) return 0;
    return e->vt->kv_copy(e, dst, src, err, errlen);
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

size_t engine_state_bytes(const engine *e) { return e->state_bytes; }

int engine_state_slots(const engine *e) { return e->n_states; }

int engine_kv_blocks(const engine *e) { return e->kv_blocks; }

void engine_free(engine *e)
{
    if (e) e->vt->destroy(e);
}

const char *engine_name(const engine *e) { return e->vt->name; }

const engine_config *engine_get_config(const engine *e) { return &e->cfg; }

const model *engine_model(const engine *e) { return e->m; }
