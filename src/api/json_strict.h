/* json_strict.h - what cJSON accepts but a request must not carry, because the server would
 * read it differently from what the client (or a proxy that checked it) meant:
 *   - a NUL in a string (raw, or \u0000): C strings end there, so a prompt would be cut short
 *     without a word;
 *   - a key given twice in one object: parsers disagree on which one wins. */
#ifndef INFERD_API_JSON_STRICT_H
#define INFERD_API_JSON_STRICT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "api_error.h"

/* text[0..len) is the body root was parsed from: no NUL in it, no key twice in one object, no
 * number beyond the range of a double.  0, or -1 with a 400 in e. */
int json_strict_check(const char *text, size_t len, const cJSON *root, api_error *e);

/* Member `name` of obj, or NULL when it is absent or null (null means "the default" in OpenAI's
 * API, so a reader treats both alike). */
const cJSON *json_field(const cJSON *obj, const char *name);

/* A request body (body[len] NUL: anything after the JSON value is refused) as one JSON object
 * that passes json_strict_check; NULL with a 400 in e. */
cJSON *json_parse_body(const char *body, size_t len, api_error *e);

#endif
