/* stopstr.h - stop strings matched across token boundaries, with holdback.
 *
 * Completion text arrives in token-sized pieces; a stop string may begin in one piece and end
 * several pieces later.  The matcher keeps back the shortest tail of the text that could still
 * turn out to be the start of a stop string (and any incomplete UTF-8 character), and releases
 * everything before it.  When a stop string appears, the text before its first occurrence is
 * released and the stop string and everything after it are dropped: they never reach the
 * client.
 *
 * Why the tail is enough: a released byte at position p was not the start of any stop-string
 * prefix reaching the end of the text, so no later text can complete a match starting at p. */
#ifndef INFERD_SCHED_STOPSTR_H
#define INFERD_SCHED_STOPSTR_H

#include <stdbool.h>
#include <stddef.h>

#include "base/bytebuf.h"

#define STOPSTR_MAX 4

typedef struct stopstr {
    char *stop[STOPSTR_MAX]; /* owned copies; empty strings are ignored */
    size_t stop_len[STOPSTR_MAX];
    int n_stop;
    bytebuf held; /* text not yet released */
    bool matched;
    int matched_index; /* with matched: which stop string (the order stopstr_init kept) */
} stopstr;

/* Copies the stop strings (NULL or "" entries are skipped; more than STOPSTR_MAX is an error).
 * Returns false on a bad argument or when memory ran out (m is then empty but freeable). */
bool stopstr_init(stopstr *m, const char *const *stops, int n);
void stopstr_free(stopstr *m);

/* Adds text and appends whatever is now decided to out (valid UTF-8 only).  Returns true when
 * a stop string completed: the text before it is in out, and further input is ignored.
 * *oom is set when memory ran out. */
bool stopstr_feed(stopstr *m, const char *text, size_t len, bytebuf *out, bool *oom);

/* The text ended without a stop string: release what is held (a truncated final character
 * becomes U+FFFD).  false when memory ran out. */
bool stopstr_flush(stopstr *m, bytebuf *out);

#endif
