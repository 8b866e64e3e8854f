/* grammar.h - constrained decoding: grammars over bytes, matched against a vocabulary.
 *
 * A grammar is compiled once (from GBNF text, a JSON schema, a regex or a list of choices)
 * into an immutable pushdown automaton over bytes and shared read-only by every choice of a
 * request (and by later requests, through a cache of compiled grammars).  Each sequence that
 * decodes under a grammar holds its own grammar_matcher: the set of pushdown stacks reachable
 * after the bytes of the tokens sampled so far.  Before each sampling step the matcher fills
 * an allowed-token bitmask (ceil(n_vocab/32) words, bit i%32 of word i/32 = token i) that the
 * engine applies before temperature/top-k/top-p; after it, the sampled token advances it.
 *
 * Masks: for the top frames of a stack (as few as leave a short list of undecided tokens; the
 * stacks that differ only in their top share one), the tokens whose validity does not depend
 * on the stack below are precomputed once (accepted / rejected within those frames); only the
 * tokens that would pop below them are checked against the whole stack at run time.  A bounded
 * repetition x{m,n} is one element with its count in the stack, and the precomputed tables
 * leave out the count of the nearest one: they note how many iterations each token needs, which
 * each mask compares with the count left, so that one table serves a string of any length so
 * far.  Full masks are also cached per matcher state, so a state that recurs (inside a string,
 * between properties) costs a copy.  Control tokens are never allowed, except end-of-generation
 * tokens, which are allowed exactly when the grammar is complete.
 *
 * Bounds: following a grammar is polynomial in nested repetitions and capped per byte (a
 * grammar whose start is over the cap is refused when compiled; a sequence that meets the cap
 * later cannot go on: grammar_matcher_too_complex), and a mask can be asked for by a deadline
 * (grammar_matcher_fill_mask_until), so that no client's grammar holds the thread that masks.
 *
 * Threading: compiling, refs and unrefs are thread-safe.  The masks of one grammar are built
 * into tables the grammar owns, so all matchers of one grammar must be used from one thread
 * at a time (the scheduler's). */
#ifndef INFERD_GRAMMAR_H
#define INFERD_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "text/tokenizer.h"

typedef struct grammar grammar;

/* Compilers.  Each returns a grammar with one reference, or NULL with a message in err that
 * can go to the client as is (a 400): a syntax error and where, an unsupported JSON-schema
 * keyword named, or a limit (rules, elements, repetition, nesting) that was exceeded. */

/* GBNF as llama.cpp writes it: `name ::= alternatives`, "literals" with \n \t \r \\ \" \xHH
 * \uHHHH \UHHHHHHHH escapes, [classes] (^ negates, ranges), `.`, (groups), `|`, postfix * + ?
 * {m} {m,} {m,n}, # comments.  The start rule is `root`.  Left recursion is refused. */
grammar *grammar_from_gbnf(const char *text, size_t len, char *err, size_t errlen);
/* A JSON value matching schema: type (and unions), properties, required,
 * additionalProperties (false / a schema), items, prefixItems, minItems, maxItems, enum,
 * const, anyOf, oneOf, allOf with one member, $ref into #/$defs or #/definitions, nullable,
 * minLength, maxLength, pattern, format (date, time, date-time, uuid, email), integer
 * minimum/maximum (ranges up to 10^6 wide), and annotations (title, description, ...).
 * Any other keyword: NULL, err names it. */
grammar *grammar_from_json_schema(const cJSON *schema, char *err, size_t errlen);
/* Any JSON object (response_format json_object). */
grammar *grammar_json_object(char *err, size_t errlen);
/* A string matching a regex, anchored at both ends: literals, ., [classes], \d \w \s \D \W \S,
 * groups (incl. (?:...)), |, * + ? {m} {m,} {m,n}. */
grammar *grammar_from_regex(const char *re, size_t len, char *err, size_t errlen);
/* Exactly one of the n strings. */
grammar *grammar_from_choices(const char *const *choices, int n, char *err, size_t errlen);

/* Builder for tool calls (and anything made of literal text around JSON): the grammar is one
 * of the alternatives added, each `prefix JSON-value suffix` where the value matches its
 * schema (NULL schema: any JSON value; NULL or "" prefix/suffix: none), e.g. for a model that
 * writes <tool_call>{"name": ..., "arguments": ...}</tool_call>, one alternative per function:
 *   prefix "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", schema = parameters,
 *   suffix "}\n</tool_call>".  Whitespace between the value's JSON tokens is at most one space. */
typedef struct grammar_builder grammar_builder;
grammar_builder *grammar_builder_new(void);
/* false with err set (the schema's error, or out of memory); the builder stays usable. */
bool grammar_builder_add(grammar_builder *b, const char *prefix, const cJSON *schema, const char *suffix,
                         char *err, size_t errlen);
/* The grammar of the alternatives added so far (NULL and err when there were none); frees b. */
grammar *grammar_builder_finish(grammar_builder *b, char *err, size_t errlen);
void grammar_builder_free(grammar_builder *b);

/* The GBNF text a JSON schema compiles to (malloc'd, NUL-terminated), for logs and tests. */
char *grammar_schema_to_gbnf(const cJSON *schema, char *err, size_t errlen);

/* A process-wide cache of compiled grammars by key (the caller's canonical source text with a
 * kind prefix), least recently used out of 32.  get: a new reference or NULL. */
grammar *grammar_cache_get(const char *key, size_t len);
void grammar_cache_put(const char *key, size_t len, grammar *g);
void grammar_cache_clear(void);

grammar *grammar_ref(grammar *g);
void grammar_unref(grammar *g);

/* The vocabulary side: every token's bytes in sorted order, built once per tokenizer. */
typedef struct grammar_vocab grammar_vocab;
grammar_vocab *grammar_vocab_new(const tokenizer *t);
void grammar_vocab_free(grammar_vocab *v);
int grammar_vocab_n_words(const grammar_vocab *v); /* mask words: ceil(n_vocab / 32) */

/* One sequence's position in a grammar. */
typedef struct grammar_matcher grammar_matcher;
/* NULL when memory ran out; holds a reference to g. v must outlive the matcher. */
grammar_matcher *grammar_matcher_new(grammar *g, const grammar_vocab *v);
void grammar_matcher_free(grammar_matcher *m);
/* The tokens allowed next into mask (grammar_vocab_n_words words).  Returns how many there
 * are: 0 means the grammar can go no further with this vocabulary (the caller ends the
 * sequence). */
int grammar_matcher_fill_mask(grammar_matcher *m, uint32_t *mask);
/* The same, stopping once timing_now_ms() passes deadline_ms (0: no deadline): then
 * GRAMMAR_MASK_LATER and mask is not usable; what was built so far is kept, so a later call
 * goes further (a first mask on a large vocabulary can take tens of milliseconds, and a
 * hostile grammar much longer; the scheduler gives each a bounded slice per step).
 * GRAMMAR_MASK_TOO_COMPLEX: the grammar is too ambiguous here to go on (see
 * grammar_matcher_too_complex). */
#define GRAMMAR_MASK_LATER (-1)
#define GRAMMAR_MASK_TOO_COMPLEX (-2)
int grammar_matcher_fill_mask_until(grammar_matcher *m, uint32_t *mask, double deadline_ms);
/* Finding the stacks after some byte took more than the matcher's expansion budget (the
 * grammar is ambiguous enough there to enumerate an exponential number of ways): the
 * sequence cannot go on, and accept / fill_mask fail from then on. */
bool grammar_matcher_too_complex(const grammar_matcher *m);
/* Advances by a sampled token; false (and the matcher unchanged) when the grammar does not
 * allow it.  An end-of-generation token is accepted when the grammar is complete. */
bool grammar_matcher_accept(grammar_matcher *m, int32_t token);
/* Advances by raw bytes (text the caller writes itself, e.g. a forced prefix); false and
 * unchanged when the grammar does not allow them. */
bool grammar_matcher_accept_bytes(grammar_matcher *m, const char *bytes, size_t len);
/* An independent copy (NULL when memory ran out). */
grammar_matcher *grammar_matcher_clone(const grammar_matcher *m);
/* The bytes so far form a complete sentence of the grammar. */
bool grammar_matcher_is_complete(const grammar_matcher *m);
/* Complete, and no byte could follow: the sequence is over (finish "stop"). */
bool grammar_matcher_is_done(const grammar_matcher *m);

#endif
