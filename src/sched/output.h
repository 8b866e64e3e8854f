/* output.h - the text pipeline of one request, from sampled token to completion text:
 *
 *   token id -> detokenizer (text/tokenizer.h: never half a UTF-8 character, ill-formed bytes
 *   become U+FFFD) -> stop-string matcher (stopstr.h: holds back what may still become a stop
 *   string, drops a stop string and all after it) -> text ready for the request's outbox.
 *
 * Runs on the scheduler thread only.  The scratch is the scheduler's, reused for every token
 * of every request (no allocation per token once it has grown). */
#ifndef INFERD_SCHED_OUTPUT_H
#define INFERD_SCHED_OUTPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/bytebuf.h"
#include "sched.h"
#include "stopstr.h"
#include "text/tokenizer.h"

typedef struct output {
    detok_stream detok;
    stopstr stop;
} output;

typedef struct output_scratch {
    char *piece; /* detokenizer output */
    int piece_cap;
    bytebuf text; /* the text one token released */
} output_scratch;

/* Copies the stop strings (at submit).  false on a bad argument or when memory ran out; o is
 * freeable either way. */
bool output_init(output *o, const char *const *stops, int n_stops);
/* The request got a slot: its text starts now. */
void output_start(output *o, const tokenizer *tok);
void output_free(output *o);

/* Runs token id through the pipeline; sc->text then holds the text it released.  eog: id is
 * an end-of-generation token (its text is never emitted); at_length: the request can take no
 * further token (max_tokens, or its context is full).  Returns SCHED_FINISH_STOP when the text
 * ended in a stop string or at eog, SCHED_FINISH_LENGTH at_length, else SCHED_FINISH_NONE;
 * *oom is set when memory ran out (the text is then incomplete). */
sched_finish output_token(output *o, output_scratch *sc, const tokenizer *tok, int32_t id, bool eog,
                          bool at_length, bool *oom);

void output_scratch_free(output_scratch *sc);

#endif
