/* ngram.h - the n-gram (prompt lookup) drafter of speculative decoding: proposes the tokens
 * that followed the latest earlier occurrence of the sequence's own last few tokens.  No
 * model, no state: a pure function of the sequence's tokens (prompt and generated), which is
 * where agents' and editors' repetition lives (a file being edited, tool output, JSON keys). */
#ifndef INFERD_SCHED_NGRAM_H
#define INFERD_SCHED_NGRAM_H

#include <stdint.h>

/* Longest suffix first: an n-gram of NGRAM_MAX tokens, then shorter ones down to NGRAM_MIN. */
#define NGRAM_MAX 3
#define NGRAM_MIN 1

/* Up to k_max tokens into draft: for n from NGRAM_MAX down to NGRAM_MIN, the latest earlier
 * position where toks[n_toks-n..n_toks-1] occurred too, and the tokens that followed it there
 * (at most up to the end of toks).  Returns how many (0: no match, or k_max <= 0). */
int ngram_draft(const int32_t *toks, int n_toks, int k_max, int32_t *draft);

#endif
