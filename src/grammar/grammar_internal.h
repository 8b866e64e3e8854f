/* grammar_internal.h - what the front ends (schema, regex) share.  Internal to src/grammar. */
#ifndef INFERD_GRAMMAR_INTERNAL_H
#define INFERD_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/bytebuf.h"
#include "grammar.h"

/* Appends a GBNF expression (parenthesised) for the regex to out.  json: the expression
 * produces the inside of a JSON string whose decoded value matches. */
bool regex_to_gbnf(const char *re, size_t len, bool json, bytebuf *out, char *err, size_t errlen);

/* Appends s as a GBNF string literal. */
void gbnf_literal(bytebuf *out, const char *s, size_t len);

#endif
