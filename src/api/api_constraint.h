/* api_constraint.h - structured output fields of a request -> one compiled grammar.
 *
 * response_format {"type": "text" | "json_object" (with an optional "schema", as llama-server
 * takes it) | "json_schema", "json_schema": {"name", "schema", "strict"}}, and the extensions: grammar (GBNF, llama-server), json_schema (top
 * level, llama-server), guided_json / guided_regex / guided_choice (vLLM).  At most one of
 * them may constrain a request.  Compiled grammars are cached by their canonical text. */
#ifndef INFERD_API_CONSTRAINT_H
#define INFERD_API_CONSTRAINT_H

#include <cjson/cJSON.h>

#include "api_error.h"
#include "grammar/grammar.h"

/* *out = NULL (unconstrained) or a grammar reference the caller drops with grammar_unref;
 * *schema_text = the JSON schema the answer must match when the constraint is one (json_schema,
 * json_object: {"type":"object"} or its "schema", guided_json), malloc'd, else NULL (GBNF,
 * regex, choices: grammars of the whole reply that cannot be offered beside a tool call).
 * Returns 0, or -1 with a 400 in e naming the field and, for a schema, the keyword. */
int api_read_constraint(const cJSON *obj, grammar **out, char **schema_text, api_error *e);

/* The grammar cached under kind + text (a grammar reference), else make(arg) compiled and
 * cached; NULL with err on a compile error.  kind tells the sources apart ('S' schema, 'G'
 * GBNF, 'R' regex, 'C' choices, 'O' json_object, 'T' forced tool calls, 'A' a schema's answer
 * behind its family's answer markup: tool_force.h). */
grammar *api_constraint_cached(char kind, const char *text, size_t len,
                               grammar *(*make)(const void *, char *, size_t), const void *arg, char *err,
                               size_t errlen);

#endif
