/* utf8.h - the UTF-8 rules the scheduler's output must keep: never emit half a character,
 * never emit an invalid sequence.
 *
 * Token boundaries do not respect character boundaries (byte-fallback tokens, byte-level BPE),
 * and a stop-string holdback may end anywhere, so every cut the scheduler makes in completion
 * text goes through utf8_complete_prefix, and every byte it emits through utf8_append_valid. */
#ifndef INFERD_SCHED_UTF8_H
#define INFERD_SCHED_UTF8_H

#include <stdbool.h>
#include <stddef.h>

#include "textbuf.h"

/* Length of the longest prefix of s[0..n) that does not end inside a character whose
 * remaining bytes may still arrive: a trailing lead byte followed by fewer continuation bytes
 * than it announces is cut off.  Everything else (complete or hopelessly invalid) is kept. */
size_t utf8_complete_prefix(const char *s, size_t n);

/* Appends s[0..n) to b with every invalid or truncated sequence replaced by U+FFFD, so b only
 * ever holds valid UTF-8.  false when memory ran out. */
bool utf8_append_valid(textbuf *b, const char *s, size_t n);

/* true when s[0..n) is valid UTF-8 (no overlongs, surrogates or values above U+10FFFF). */
bool utf8_valid(const char *s, size_t n);

#endif
