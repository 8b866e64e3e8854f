/* json_strict.c - see json_strict.h. */
#include "json_strict.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A NUL inside the JSON text: raw, or written as \u0000 inside a string. */
static bool has_nul(const char *t, size_t len)
{
    if (memchr(t, 0, len)) return true;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        if (t[i] == '"') {
            in_string = !in_string;
        } else if (in_string && t[i] == '\\' && i + 1 < len) {
            if (t[i + 1] == 'u' && i + 5 < len && memcmp(t + i + 2, "0000", 4) == 0) return true;
            i++; /* the escaped character cannot end the string */
        }
    }
    return false;
}

static int by_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first key that some object under v holds twice, or NULL.  Sorting makes it
 * O(k log k) per object, so a logit_bias with 100,000 keys stays cheap. */
static const char *duplicate_key(const cJSON *v, bool *oom)
{
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return NULL;
    int n = 0;
    for (const cJSON *c = v->child; c; c = c->next) n++;
    if (cJSON_IsObject(v) && n > 1) {
        const char **keys = malloc((size_t)n * sizeof *keys);
        if (!keys) {
            *oom = true;
            return NULL;
        }
        int k = 0;
        for (const cJSON *c = v->child; c; c = c->next) keys[k++] = c->string ? c->string : "";
        qsort(keys, (size_t)n, sizeof *keys, by_key);
        const char *dup = NULL;
        for (int i = 1; i < n && !dup; i++)
            if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
        free(keys);
        if (dup) return dup;
    }
    for (const cJSON *c = v->child; c; c = c->next) {
        const char *dup = duplicate_key(c, oom);
        if (dup || *oom) return dup;
    }
    return NULL;
}

/* The first number under v that overflows a double (cJSON reads 1e400 as infinity, and
 * printing it again, as the Responses and Messages translations do, writes null: the value
 * would silently become "unset"), or NULL. */
static const cJSON *non_finite(const cJSON *v)
{
    if (cJSON_IsNumber(v)) return isfinite(v->valuedouble) ? NULL : v;
    for (const cJSON *c = cJSON_IsObject(v) || cJSON_IsArray(v) ? v->child : NULL; c; c = c->next) {
        const cJSON *bad = non_finite(c);
        if (bad) return bad;
    }
    return NULL;
}

int json_strict_check(const char *text, size_t len, const cJSON *root, api_error *e)
{
    if (has_nul(text, len)) {
        api_error_set(e, 400, "invalid_request_error", NULL, "invalid_value",
                      "The request body contains a NUL character (raw or \\u0000); it is not accepted "
                      "in any string.");
        return -1;
    }
    bool oom = false;
    const char *dup = duplicate_key(root, &oom);
    if (oom) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory while checking the request");
        return -1;
    }
    if (dup) {
        api_error_set(e, 400, "invalid_request_error", NULL, "duplicate_key",
                      "The request body gives the key '%.60s' more than once in one object.", dup);
        return -1;
    }
    const cJSON *big = non_finite(root);
    if (big) {
        api_error_set(e, 400, "invalid_request_error", big->string, "invalid_value",
                      "The request body holds a number beyond the range of a double%s%.60s%s.",
                      big->string ? " (key '" : "", big->string ? big->string : "", big->string ? "')" : "");
        return -1;
    }
    return 0;
}

cJSON *json_parse_body(const char *body, size_t len, api_error *e)
{
    /* len + 1 takes in the terminating NUL, so trailing garbage after the JSON is refused. */
    cJSON *obj = cJSON_ParseWithLengthOpts(body, len + 1, NULL, true);
    if (!cJSON_IsObject(obj)) {
        api_error_set(e, 400, "invalid_request_error", NULL, NULL,
                      obj ? "The request body must be a JSON object."
                          : "We could not parse the JSON body of your request. The body must be valid JSON.");
        cJSON_Delete(obj);
        return NULL;
    }
    if (json_strict_check(body, len, obj, e) == 0) return obj;
    cJSON_Delete(obj);
    return NULL;
}

const cJSON *json_field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNull(v) ? NULL : v;
}
