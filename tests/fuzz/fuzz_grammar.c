/* fuzz_grammar.c - the grammar compilers (src/grammar: GBNF, JSON schema, regex) and the byte
 * matcher, with hostile sources: deep nesting, huge repetitions and enums, recursive $ref,
 * left recursion, catastrophic regexes.
 *
 * Input: a mode byte (0: GBNF, 1: JSON schema, 2: regex), the source, a NUL, then bytes fed
 * to the matcher of whatever compiled.
 *
 * Invariants: compiling either succeeds or fails with a message (never a crash, never an
 * unbounded loop: the limits of grammar_impl.h bound rules, elements and repetition); the
 * matcher accepts or refuses each byte, and a refused byte leaves the state as it was. */
#include "fuzz_common.h"

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    int mode = fz_u8(&in) % 3;
    size_t len;
    const char *src = fz_field(&in, &len);
    char *text = fz_strndup(src, len);
    char err[256] = "";
    grammar *g = NULL;
    if (mode == 0) {
        g = grammar_from_gbnf(text, len, err, sizeof err);
    } else if (mode == 1) {
        cJSON *j = cJSON_ParseWithLength(text, len);
        if (j) {
            g = grammar_from_json_schema(j, err, sizeof err);
            cJSON_Delete(j);
        }
    } else {
        g = grammar_from_regex(text, len, err, sizeof err);
    }
    if (!g) FZ_CHECK(mode == 1 || err[0] != 0);
    if (g) {
        grammar_matcher *m = grammar_matcher_new(g, NULL);
        for (size_t i = 0; m && i < in.n && i < 4096; i++) {
            bool complete = grammar_matcher_is_complete(m);
            if (!grammar_matcher_accept_bytes(m, (const char *)in.p + i, 1))
                FZ_CHECK(grammar_matcher_is_complete(m) == complete); /* unchanged */
        }
        grammar_matcher_free(m);
        grammar_unref(g);
    }
    free(text);
    return 0;
}
