/* grammar_matches.h - the tests' one question to a grammar: do these bytes make a complete
 * sentence of it?  (No vocabulary: the bytes go in as they are.)  Shared by the grammar's own
 * tests and those of the grammars built on it (tests/api/test_tool_force.c). */
#ifndef INFERD_TEST_GRAMMAR_MATCHES_H
#define INFERD_TEST_GRAMMAR_MATCHES_H

#include <stdbool.h>
#include <string.h>

#include "grammar/grammar.h"

static inline bool matches(grammar *g, const char *text)
{
    grammar_matcher *m = grammar_matcher_new(g, NULL);
    assert_non_null(m);
    bool ok = grammar_matcher_accept_bytes(m, text, strlen(text)) && grammar_matcher_is_complete(m);
    grammar_matcher_free(m);
    return ok;
}

#endif
