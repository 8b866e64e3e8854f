/* tool_force.c - see tool_force.h. */
#include "tool_force.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "api_constraint.h"
#include "base/bytebuf.h"

/* The literal text around the arguments of a call of `name`:
 *   Hermes/Qwen  <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
 *   Llama 3      {"name": "NAME", "parameters": ARGS}
 *   Mistral      [TOOL_CALLS][{"name": "NAME", "arguments": ARGS}]
 *   DeepSeek V3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```...
 * The name goes through cJSON, so whatever a client named its function, the JSON is valid. */
static bool call_markup(const chat_forced_call *fc, const char *name, bytebuf *prefix, bytebuf *suffix)
{
    bytebuf_puts(prefix, fc->prefix);
    if (fc->args_key) {
        cJSON *s = cJSON_CreateString(name);
        char *quoted = s ? cJSON_PrintUnformatted(s) : NULL;
        cJSON_Delete(s);
        if (!quoted) return false;
        bytebuf_printf(prefix, "%s{\"name\": %s, \"%s\": ", fc->array ? "[" : "", quoted, fc->args_key);
        cJSON_free(quoted);
        bytebuf_puts(suffix, fc->array ? "}]" : "}");
    } else {
        bytebuf_printf(prefix, "%s\n```json\n", name);
    }
    bytebuf_puts(suffix, fc->suffix);
    return bytebuf_ok(prefix) && bytebuf_ok(suffix);
}

/* A name the forced call can write: OpenAI's [a-zA-Z0-9_-]{1,64}, with '.' and ':' (names
 * such as server.tool).  Anything else could be markup in the call's own syntax (a name holding
 * </tool_call>, or DeepSeek's raw name with a newline and a fence) and end the call early, so a
 * "required" call would come back as text. */
#define FORCED_NAME_MAX 64

static bool forced_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > FORCED_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("_-.:", name[i])) return false;
    return true;
}

/* What a forced call is compiled from; e gets the error of a failed compile. */
typedef struct forced_spec {
    const api_request *r;
    chat_forced_call fc;
    api_error *e;
} forced_spec;

/* api_constraint_cached's make(): one alternative per offered (or the named) function. */
static grammar *build_forced(const void *arg, char *errbuf, size_t errlen)
{
    const forced_spec *fs = arg;
    const api_request *r = fs->r;
    cJSON *tools = cJSON_Parse(r->tools_json);
    cJSON *any_object = cJSON_CreateObject();
    cJSON_AddStringToObject(any_object, "type", "object");
    grammar_builder *b = grammar_builder_new();
    char err[256] = "";
    const char *failed = NULL, *bad_name = NULL;
    int added = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name)) continue; /* api_request validated every tool */
        if (r->tool_choice == API_TOOL_NAMED && strcmp(name->valuestring, r->tool_choice_name) != 0) continue;
        if (!forced_name_ok(name->valuestring)) {
            bad_name = name->valuestring;
            break;
        }
        /* A function without parameters still takes an object of arguments. */
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!params) params = any_object;
        bytebuf prefix = {0}, suffix = {0};
        bool ok = b && call_markup(&fs->fc, name->valuestring, &prefix, &suffix) &&
                  grammar_builder_add(b, prefix.data, params, suffix.data, err, sizeof err);
        bytebuf_free(&prefix);
        bytebuf_free(&suffix);
        if (!ok) {
            failed = name->valuestring;
            break;
        }
        added++;
    }
    grammar *g = NULL;
    if (bad_name) {
        api_error_set(fs->e, 400, "invalid_request_error", "tools", "invalid_value",
                      "Invalid function name '%.64s': a forced tool call needs a name of letters, digits, '_', "
                      "'-', '.' and ':' (at most %d).",
                      bad_name, FORCED_NAME_MAX);
    } else if (failed) {
        api_error_set(fs->e, err[0] ? 400 : 500, err[0] ? "invalid_request_error" : "server_error", "tools",
                      err[0] ? "invalid_value" : NULL, "The parameters of function '%.64s' cannot be enforced: %s",
                      failed, err[0] ? err : "out of memory");
    } else if (!added) {
        /* api_request checks that a named function is offered; nothing else leaves none. */
        api_error_set(fs->e, 400, "invalid_request_error", "tool_choice", "invalid_value",
                      "tool_choice names no function among the tools.");
    } else if (!(g = grammar_builder_finish(b, err, sizeof err))) {
        /* the tools together over a limit of the grammar (rules, elements) are the client's to
         * fix; only memory is the server's */
        bool oom = strstr(err, "out of memory") != NULL;
        api_error_set(fs->e, oom ? 500 : 400, oom ? "server_error" : "invalid_request_error", oom ? NULL : "tools",
                      oom ? NULL : "invalid_value", "The tools cannot be enforced as one tool-call grammar: %s", err);
    }
    if (bad_name || failed || !added) grammar_builder_free(b);
    if (!g) snprintf(errbuf, errlen, "%s", fs->e->message);
    cJSON_Delete(tools);
    cJSON_Delete(any_object);
    return g;
}

grammar *tool_force_grammar(const api_request *r, chat_syntax syntax, bool *forced, api_error *e)
{
    *forced = false;
    if (!r->tools_json || (r->tool_choice != API_TOOL_REQUIRED && r->tool_choice != API_TOOL_NAMED)) return NULL;
    *forced = true;
    forced_spec fs = {.r = r, .e = e};
    if (!chat_forced_call_shape(syntax, &fs.fc)) {
        api_error_set(e, 400, "invalid_request_error", "tool_choice", "unsupported_value",
                      "This model's chat template shows no tool-call syntax this server knows, so a tool call "
                      "cannot be forced; use tool_choice \"auto\".");
        return NULL;
    }
    if (r->grammar) {
        api_error_set(e, 400, "invalid_request_error", "tool_choice", "invalid_value",
                      "tool_choice \"required\" or a named function cannot be combined with response_format.");
        return NULL;
    }
    /* Cached like every other grammar, so an agent that resends the same tools reuses the
     * compiled grammar and the token tables built for it on earlier requests. */
    bytebuf key = {0};
    bytebuf_printf(&key, "%d\n%d\n%s\n%s", (int)syntax, (int)r->tool_choice,
                   r->tool_choice == API_TOOL_NAMED ? r->tool_choice_name : "", r->tools_json);
    if (!bytebuf_ok(&key)) {
        bytebuf_free(&key);
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory building the tool-call grammar");
        return NULL;
    }
    /* The cache's own failure (memory for the key) calls no build_forced to say why. */
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory building the tool-call grammar");
    char err[256];
    grammar *g = api_constraint_cached('T', key.data, key.len, build_forced, &fs, err, sizeof err);
    bytebuf_free(&key);
    return g;
}
