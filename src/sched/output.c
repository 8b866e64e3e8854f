/* output.c - see output.h. */
#include "output.h"

#include <stdlib.h>

bool output_init(output *o, const char *const *stops, int n_stops)
{
    return stopstr_init(&o->stop, stops, n_stops);
}

void output_start(output *o, const tokenizer *tok) { detok_init(&o->detok, tok, false); }

void output_free(output *o) { stopstr_free(&o->stop); }

void output_scratch_free(output_scratch *sc)
{
    free(sc->piece);
    bytebuf_free(&sc->text);
    *sc = (output_scratch){0};
}

/* Makes room in the piece buffer for the detokenized bytes of token id. */
static bool piece_reserve(output_scratch *sc, const tokenizer *tok, int32_t id)
{
    size_t len = 0;
    tokenizer_token_text(tok, id, &len);
    /* The detokenizer may add its pending tail (< 8 bytes) and needs 16 spare bytes; a token's
     * output bytes never exceed its stored text. */
    int need = (int)len + 32;
    if (need <= sc->piece_cap) return true;
    char *p = realloc(sc->piece, (size_t)need);
    if (!p) return false;
    sc->piece = p;
    sc->piece_cap = need;
    return true;
}

/* Detokenizes id into the stop matcher.  STOP when a stop string completed, else NONE. */
static sched_finish feed(output *o, output_scratch *sc, const tokenizer *tok, int32_t id, bool *oom)
{
    if (!piece_reserve(sc, tok, id)) {
        *oom = true;
        return SCHED_FINISH_NONE;
    }
    int n = detok_feed(&o->detok, id, sc->piece, sc->piece_cap);
    if (n > 0 && stopstr_feed(&o->stop, sc->piece, (size_t)n, &sc->text, oom)) return SCHED_FINISH_STOP;
    return SCHED_FINISH_NONE;
}

/* The text ends without a stop string (so far): release the detokenizer's incomplete tail and
 * the matcher's held candidate, which may still complete a stop string right here. */
static sched_finish end(output *o, output_scratch *sc, sched_finish why, bool *oom)
{
    int n = detok_flush(&o->detok, sc->piece, sc->piece_cap);
    if (n > 0 && stopstr_feed(&o->stop, sc->piece, (size_t)n, &sc->text, oom)) return SCHED_FINISH_STOP;
    if (!*oom && !stopstr_flush(&o->stop, &sc->text)) *oom = true;
    return why;
}

sched_finish output_token(output *o, output_scratch *sc, const tokenizer *tok, int32_t id, bool eog,
                          bool at_length, bool *oom)
{
    bytebuf_clear(&sc->text);
    sched_finish why = eog ? SCHED_FINISH_STOP : feed(o, sc, tok, id, oom);
    if (why == SCHED_FINISH_NONE && at_length) why = SCHED_FINISH_LENGTH;
    if (!*oom && (eog || why == SCHED_FINISH_LENGTH)) why = end(o, sc, why, oom);
    return why;
}
