/* tokenize_reply.h - the body of a /tokenize reply, written straight into a buffer.
 *
 * A cJSON tree costs a few hundred bytes per token, so a 1 MB body of one-byte tokens asked
 * with pieces once took 175 MB to answer; written directly the cost is the reply itself, and
 * pieces (the larger form) are limited to TOKENIZE_MAX_PIECES tokens a request. */
#ifndef INFERD_API_TOKENIZE_REPLY_H
#define INFERD_API_TOKENIZE_REPLY_H

#include <stdbool.h>
#include <stdint.h>

#include "text/tokenizer.h"
#include "base/bytebuf.h"

#define TOKENIZE_MAX_PIECES 65536

/* {"tokens":[id,...]} or {"tokens":[{"id":id,"piece":"text"},...]} (llama-server's shape);
 * pieces are valid UTF-8 (invalid bytes become U+FFFD).  out->failed on out of memory. */
void tokenize_reply(const tokenizer *tok, const int32_t *ids, int n, bool pieces, bytebuf *out);

#endif
