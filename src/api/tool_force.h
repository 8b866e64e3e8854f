/* tool_force.h - tool_choice "required" or a named function, enforced: a grammar that admits
 * exactly one call of an offered function (the named one, when named), in the model family's
 * own tool-call markup, whose arguments validate against the function's parameters schema.
 * The reply's parser (text/chat_parse.c) then reads the call back as it would an unforced one. */
#ifndef INFERD_API_TOOL_FORCE_H
#define INFERD_API_TOOL_FORCE_H

#include "api_request.h"
#include "grammar/grammar.h"
#include "text/chat_parse.h"

/* NULL when r does not force a call (no tools, tool_choice auto or none).  Otherwise the
 * grammar (a reference the caller owns), or NULL with e set: 400 when the family has no
 * tool-call markup to force, when response_format is asked for too, or when a parameters
 * schema cannot be compiled (the error names the function); 500 when memory ran out. */
grammar *tool_force_grammar(const api_request *r, chat_syntax syntax, bool *forced, api_error *e);

#endif
