/* engine_impl.h - what a backend implements behind engine.h.  Only engine.c and the backends
 * (cpu/, gpu/) include this: callers see an opaque engine.  Each backend declares its
 * constructor in its own header (cpu/cpu.h, gpu/gpu.h); backend/ chooses between them.
 *
 * A backend's own engine struct starts with `engine base;`, so engine.c can dispatch through
 * the vtable and answer engine_get_config without knowing the backend. */
#ifndef INFERD_ENGINE_IMPL_H
#define INFERD_ENGINE_IMPL_H

#include "engine.h"

typedef struct engine_vtable {
    const char *name;
    /* Called after engine.c checked the batch: returns 0, ENGINE_EINVAL or ENGINE_FATAL. */
    int (*step)(engine *e, const engine_seq *seqs, int n_seqs, engine_result *results,
                char *err, size_t errlen);
    /* engine_decode_rounds, checked; NULL: engine.c runs them as engine_steps */
    int (*decode_rounds)(engine *e, const engine_seq *seqs, int n_seqs, int rounds, engine_result *results,
                         char *err, size_t errlen);
    /* engine_mtp_step, checked; NULL: the backend does not run an MTP block */
    int (*mtp_step)(engine *e, const engine_mtp_seq *seqs, int n_seqs, char *err, size_t errlen);
    void (*slot_clear)(engine *e, int slot);
    int (*kv_copy)(engine *e, int dst, int src, char *err, size_t errlen); /* ids checked */
    /* NULL for a backend without a sliding pool; ids checked */
    int (*kv_copy_swa)(engine *e, int dst, int src, char *err, size_t errlen);
    /* NULL for a backend without recurrent state; ids checked */
    int (*state_copy)(engine *e, int dst, int src, char *err, size_t errlen);
    /* engine_can_rewind_state: a verification over a state slot may be rewound by state_copy
     * (set where that has been checked on the backend's hardware) */
    bool rewinds_state;
    void (*destroy)(engine *e);
} engine_vtable;

struct engine {
    const engine_vtable *vt;
    const model *m;
    engine_config cfg;
    int kv_blocks; /* the pool's blocks, set by the backend's constructor */
    /* The sliding layers' pool (0: none), its window and each pool's block bytes, likewise. */
    int kv_blocks_swa, swa_window;
    size_t kv_block_bytes, kv_block_bytes_swa;
    int n_states;  /* recurrent-state slots (0: the model has none), set likewise */
    size_t state_bytes; /* of one slot */
    /* engine.c's scratch for embedding sequences (grown on first use, freed by engine_free):
     * the batch as the backend sees it (hidden / logits pointed here), the hidden states and
     * the logits rows of RANK sequences. */
    engine_seq *emb_seqs;
    float *emb_hidden, *emb_logits;
    size_t emb_seqs_cap, emb_hidden_cap, emb_logits_cap;
};

/* The rows of s's new tokens that s->hidden receives: n of them from token *first. */
static inline int engine_hidden_rows(const engine_seq *s, int *first)
{
    *first = s->hidden_row > 0 ? s->hidden_row - 1 : 0;
    return s->hidden_row > 0 ? 1 : s->n_tokens;
}

/* Blocks a sequence of ctx_per_slot positions spans (the width of a block table). */
int engine_kv_blocks_per_seq(const engine *e);
/* The pool block holding entry `index` of s's block table (its fixed blocks without a table);
 * check_batch has made sure it is in the pool. */
int32_t engine_seq_block(const engine *e, const engine_seq *s, int index);
/* engine_decode_rounds (checked) as `rounds` backend steps: a backend's own decode_rounds
 * falls back on it for what it does not chain. */
int engine_rounds_as_steps(engine *e, const engine_seq *seqs, int n_seqs, int rounds, engine_result *results,
                           char *err, size_t errlen);
/* The same in the sliding pool (the row's ring without blocks_swa). */
int32_t engine_seq_block_swa(const engine *e, const engine_seq *s, int index);
/* The window of the sliding layers' own pool (docs/sliding-kv.md) for model m under cfg, 0 for
 * none: the model has no sliding layer, cfg asks for one pool, a layer without a window reads a
 * sliding layer's K/V (it needs them all), or a row's ring (a window plus a step's tokens) would
 * be no smaller than its whole table (nothing to save).  Every backend keeps the same pool. */
int engine_swa_pool_window(const model *m, const engine_config *cfg);
/* Whether layer il's K/V live in that pool (window > 0): an attention layer whose K/V source
 * (itself, or Gemma 4's kv_source) has a window. */
bool engine_swa_layer(const model *m, int il, int window);
/* Blocks of the sliding pool: every row's ring (what a NULL blocks_swa uses and the most one
 * sequence holds at once) and as many windows again for the prefix cache. */
size_t engine_swa_pool_blocks(const engine_config *cfg, int window);
/* The state slot s uses (hybrid models): its `state` with a block table, else its row. */
int engine_seq_state(const engine_seq *s);

#endif
