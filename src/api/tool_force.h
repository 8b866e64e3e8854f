/* tool_force.h - the grammar of a chat request with tools, in the model family's own tool-call
 * markup, whose arguments validate against the function's parameters schema:
 *   tool_choice "required" or a named function: exactly one call of an offered function (the
 *     named one, when named); a response_format beside it is for the text answer of a later
 *     turn (OpenAI's API takes the pair: an agent forces its first call and wants a structured
 *     final answer), so this turn's grammar is the call alone;
 *   tool_choice "auto" with a JSON-schema response format (json_schema, json_object,
 *     guided_json): one call, or the answer the schema describes, so that the format never
 *     makes a call impossible.
 * The reply's parser (text/chat_parse.c) then reads a call back as it would an unforced one.
 * A schema's answer (beside the calls, or alone: a JSON-schema response format with no tools)
 * opens with the family's answer markup (chat_answer_prefix: Harmony's
 * <|channel|>final<|message|>), so a gpt-oss reply is its final channel's content. */
#ifndef INFERD_API_TOOL_FORCE_H
#define INFERD_API_TOOL_FORCE_H

#include "api_request.h"
#include "grammar/grammar.h"
#include "text/chat_parse.h"

/* Replaces r->grammar with the grammar above when r calls for one, or with the answer markup
 * then the schema on a family that has answer markup (else leaves it: no tools, tool_choice
 * none, or auto without a JSON-schema format; auto when the family has no markup this server
 * knows).  0, or -1 with e: 400 when a call is forced and the family has no
 * tool-call markup, or a parameters schema (the error names the function) or the format's
 * schema cannot be compiled beside the calls; 500 when memory ran out. */
int tool_force_apply(api_request *r, chat_syntax syntax, api_error *e);

#endif
