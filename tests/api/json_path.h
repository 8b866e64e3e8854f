/* json_path.h - what the protocol tests read replies and translated bodies with: a member by a
 * dotted path ("messages.0.content": object keys and array indexes), and the events of an SSE
 * body.  Header-only, for tests. */
#ifndef INFERD_TESTS_JSON_PATH_H
#define INFERD_TESTS_JSON_PATH_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The member of o at path, or NULL. */
static inline const cJSON *json_at(const cJSON *o, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *v = o;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ".", &save); tok && v; tok = strtok_r(NULL, ".", &save))
        v = (tok[0] >= '0' && tok[0] <= '9') ? cJSON_GetArrayItem(v, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(v, tok);
    return v;
}

/* The string at path, or NULL when there is none. */
static inline const char *str_at(const cJSON *o, const char *path)
{
    const cJSON *v = json_at(o, path);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The events of an SSE body ("event: TYPE\ndata: JSON\n\n"), in order, parsed; each event's
 * name must be its data's "type".  Needs cmocka.h and base/bytebuf.h included first. */
static inline int sse_events(const bytebuf *out, cJSON **ev, int cap)
{
    int n = 0;
    for (const char *p = out->data; p && (p = strstr(p, "event: ")) != NULL && n < cap;) {
        const char *type = p + 7, *nl = strchr(type, '\n');
        assert_non_null(nl);
        assert_memory_equal(nl + 1, "data: ", 6);
        const char *end = strstr(nl, "\n\n");
        assert_non_null(end);
        ev[n] = cJSON_ParseWithLength(nl + 7, (size_t)(end - nl - 7));
        assert_non_null(ev[n]);
        const char *t = str_at(ev[n], "type");
        assert_true(t && strlen(t) == (size_t)(nl - type) && strncmp(t, type, (size_t)(nl - type)) == 0);
        n++;
        p = end;
    }
    return n;
}

#endif
