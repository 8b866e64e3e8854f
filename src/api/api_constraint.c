/* api_constraint.c - see api_constraint.h. */
#include "api_constraint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

grammar *api_constraint_cached(char kind, const char *text, size_t len,
                               grammar *(*make)(const void *, char *, size_t), const void *arg, char *err,
                               size_t errlen)
{
    char *key = malloc(len + 2);
    if (!key) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    key[0] = kind;
    memcpy(key + 1, text, len);
    grammar *g = grammar_cache_get(key, len + 1);
    if (!g && (g = make(arg, err, errlen))) grammar_cache_put(key, len + 1, g);
    free(key);
    return g;
}

static grammar *make_schema(const void *a, char *err, size_t n) { return grammar_from_json_schema(a, err, n); }
static grammar *make_gbnf(const void *a, char *err, size_t n)
{
    const char *s = a;
    return grammar_from_gbnf(s, strlen(s), err, n);
}
static grammar *make_regex(const void *a, char *err, size_t n)
{
    const char *s = a;
    return grammar_from_regex(s, strlen(s), err, n);
}
static grammar *make_object(const void *a, char *err, size_t n)
{
    (void)a;
    return grammar_json_object(err, n);
}
static grammar *make_choices(const void *a, char *err, size_t n)
{
    const cJSON *arr = a;
    int k = cJSON_GetArraySize(arr);
    const char **c = malloc((size_t)(k ? k : 1) * sizeof *c);
    if (!c) {
        snprintf(err, n, "out of memory");
        return NULL;
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) c[i++] = it->valuestring;
    grammar *g = grammar_from_choices(c, k, err, n);
    free(c);
    return g;
}

/* The schema's grammar; *text keeps the schema's canonical text (for a tool-call grammar that
 * offers this answer as its other alternative: tool_force.h). */
static grammar *schema_grammar(const cJSON *schema, char **text, char *err, size_t errlen)
{
    if (!(*text = cJSON_PrintUnformatted(schema))) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    grammar *g = api_constraint_cached('S', *text, strlen(*text), make_schema, schema, err, errlen);
    if (!g) {
        free(*text);
        *text = NULL;
    }
    return g;
}

static int refuse(api_error *e, const char *param, const char *msg)
{
    api_error_set(e, 400, INVALID, param, "invalid_value", "Invalid '%s': %s", param, msg);
    return -1;
}

static int read_response_format(const cJSON *rf, grammar **out, char **schema_text, api_error *e, char *err,
                                size_t errlen)
{
    if (!cJSON_IsObject(rf)) return refuse(e, "response_format", "expected an object.");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(type)) return refuse(e, "response_format.type", "expected 'text', 'json_object' or 'json_schema'.");
    if (!strcmp(type->valuestring, "text")) return 0;
    if (!strcmp(type->valuestring, "json_object")) {
        /* {"type": "json_object", "schema": {...}}: llama-server's form (Instructor's JSON_SCHEMA
         * mode sends it), so the schema is honoured, not only "some object" */
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(rf, "schema");
        if (schema && !cJSON_IsNull(schema)) {
            if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
                return refuse(e, "response_format.schema", "expected a JSON schema object.");
            *out = schema_grammar(schema, schema_text, err, errlen);
            return *out ? 0 : refuse(e, "response_format.schema", err);
        }
        *out = api_constraint_cached('O', "", 0, make_object, NULL, err, errlen);
        if (*out && !(*schema_text = strdup("{\"type\":\"object\"}"))) {
            grammar_unref(*out);
            *out = NULL;
            snprintf(err, errlen, "out of memory");
        }
        return *out ? 0 : refuse(e, "response_format", err);
    }
    if (strcmp(type->valuestring, "json_schema"))
        return refuse(e, "response_format.type", "expected 'text', 'json_object' or 'json_schema'.");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js)) return refuse(e, "response_format.json_schema", "expected an object with a 'schema'.");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name"), *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (name && !cJSON_IsString(name)) return refuse(e, "response_format.json_schema.name", "expected a string.");
    if (strict && !cJSON_IsBool(strict)) return refuse(e, "response_format.json_schema.strict", "expected a boolean.");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!schema) schema = cJSON_GetObjectItemCaseSensitive(rf, "schema"); /* a common shortcut */
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return refuse(e, "response_format.json_schema.schema", "expected a JSON schema object.");
    *out = schema_grammar(schema, schema_text, err, errlen);
    return *out ? 0 : refuse(e, "response_format.json_schema.schema", err);
}

int api_read_constraint(const cJSON *obj, grammar **out, char **schema_text, api_error *e)
{
    *out = NULL;
    *schema_text = NULL;
    static const char *const fields[] = {"response_format", "grammar", "json_schema", "guided_json", "guided_regex",
                                         "guided_choice"};
    const char *given = NULL;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, fields[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (i == 0) { /* response_format text constrains nothing and combines with anything */
            const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
            if (cJSON_IsString(t) && !strcmp(t->valuestring, "text")) continue;
        }
        if (given) {
            api_error_set(e, 400, INVALID, fields[i], "invalid_value",
                          "Invalid '%s': only one of response_format, grammar, json_schema, guided_json, "
                          "guided_regex, guided_choice may be given (also got '%s').", fields[i], given);
            return -1;
        }
        given = fields[i];
    }
    if (!given) return 0;
    char err[400] = "";
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, given);
    if (!strcmp(given, "response_format")) return read_response_format(v, out, schema_text, e, err, sizeof err);
    if (!strcmp(given, "grammar")) {
        if (!cJSON_IsString(v)) return refuse(e, "grammar", "expected a GBNF string.");
        *out = api_constraint_cached('G', v->valuestring, strlen(v->valuestring), make_gbnf, v->valuestring, err, sizeof err);
    } else if (!strcmp(given, "json_schema") || !strcmp(given, "guided_json")) {
        cJSON *parsed = NULL;
        if (cJSON_IsString(v)) v = parsed = cJSON_Parse(v->valuestring); /* vLLM accepts the schema as text */
        if (!cJSON_IsObject(v) && !cJSON_IsBool(v)) {
            cJSON_Delete(parsed);
            return refuse(e, given, "expected a JSON schema object.");
        }
        *out = schema_grammar(v, schema_text, err, sizeof err);
        cJSON_Delete(parsed);
    } else if (!strcmp(given, "guided_regex")) {
        if (!cJSON_IsString(v)) return refuse(e, "guided_regex", "expected a string.");
        *out = api_constraint_cached('R', v->valuestring, strlen(v->valuestring), make_regex, v->valuestring, err, sizeof err);
    } else {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1) return refuse(e, "guided_choice", "expected a non-empty array of strings.");
        const cJSON *it;
        cJSON_ArrayForEach(it, v)
            if (!cJSON_IsString(it)) return refuse(e, "guided_choice", "expected a non-empty array of strings.");
        char *text = cJSON_PrintUnformatted(v);
        if (!text) return refuse(e, "guided_choice", "out of memory");
        *out = api_constraint_cached('C', text, strlen(text), make_choices, v, err, sizeof err);
        free(text);
    }
    return *out ? 0 : refuse(e, given, err);
}
