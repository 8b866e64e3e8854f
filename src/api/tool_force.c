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
 *   Harmony      <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS (then <|call|>,
 *                an end-of-generation token: the grammar, complete, allows only those)
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
        bytebuf_printf(prefix, "%s%s", name, fc->after_name);
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

/* What a forced call is compiled from; e gets the error of a failed compile.  answer: the
 * schema of a text answer offered beside the calls (tool_choice auto), NULL when a call is
 * forced. */
typedef struct forced_spec {
    const api_request *r;
    chat_forced_call fc;
    const cJSON *answer;
    const char *answer_prefix; /* chat_answer_prefix: the markup before the answer */
    api_error *e;
} forced_spec;

/* api_constraint_cached's make(): one alternative per offered (or the named) function, and the
 * schema's answer when there is one. */
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
    bool answer_failed = false;
    if (!bad_name && !failed && added && fs->answer)
        answer_failed = !grammar_builder_add(b, fs->answer_prefix, fs->answer, NULL, err, sizeof err);
    grammar *g = NULL;
    if (answer_failed) {
        api_error_set(fs->e, 400, "invalid_request_error", "response_format", "invalid_value",
                      "The response format cannot be enforced beside the tools: %s", err[0] ? err : "out of memory");
    } else if (bad_name) {
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
    if (answer_failed || bad_name || failed || !added) grammar_builder_free(b);
    if (!g) snprintf(errbuf, errlen, "%s", fs->e->message);
    cJSON_Delete(tools);
    cJSON_Delete(any_object);
    return g;
}

/* api_constraint_cached's make() for a schema's answer alone behind the family's answer
 * markup (no tools to offer beside it). */
static grammar *build_answer(const void *arg, char *errbuf, size_t errlen)
{
    const forced_spec *fs = arg;
    grammar_builder *b = grammar_builder_new();
    if (!b || !grammar_builder_add(b, fs->answer_prefix, fs->answer, NULL, errbuf, errlen)) {
        if (!b) snprintf(errbuf, errlen, "out of memory");
        grammar_builder_free(b);
        return NULL;
    }
    return grammar_builder_finish(b, errbuf, errlen);
}

/* A schema-constrained answer with no tool grammar, on a family whose answer opens with
 * markup (Harmony's final channel): r->grammar becomes the markup, then the schema's JSON, so
 * the reply parses as the final channel's content and the model writes the header it was
 * trained to write before an answer.  Other families keep the schema's grammar as it is. */
static int answer_markup_apply(api_request *r, chat_syntax syntax, api_error *e)
{
    forced_spec fs = {.r = r, .answer_prefix = chat_answer_prefix(syntax), .e = e};
    if (!r->format_schema || !fs.answer_prefix[0]) return 0;
    cJSON *answer = cJSON_Parse(r->format_schema);
    bytebuf key = {0};
    bytebuf_printf(&key, "%d\n%s", (int)syntax, r->format_schema);
    grammar *g = NULL;
    char err[256] = "out of memory";
    if (answer && bytebuf_ok(&key)) {
        fs.answer = answer;
        g = api_constraint_cached('A', key.data, key.len, build_answer, &fs, err, sizeof err);
    }
    bytebuf_free(&key);
    cJSON_Delete(answer);
    if (!g) {
        /* the schema compiled alone (api_constraint), so only memory fails here */
        api_error_set(e, 500, "server_error", NULL, NULL, "building the answer's grammar: %s", err);
        return -1;
    }
    grammar_unref(r->grammar);
    r->grammar = g;
    return 0;
}

/* Which grammar the request's tools call for: a forced call (tool_choice required or named),
 * a call or the schema's answer (tool_choice auto beside a JSON-schema response format), or
 * none (the request's own constraint, if any, stands). */
static bool wants_tool_grammar(const api_request *r)
{
    if (!r->tools_json || r->tool_choice == API_TOOL_NONE) return false;
    return r->tool_choice != API_TOOL_AUTO || r->format_schema;
}

int tool_force_apply(api_request *r, chat_syntax syntax, api_error *e)
{
    if (!wants_tool_grammar(r)) return answer_markup_apply(r, syntax, e);
    bool forced = r->tool_choice != API_TOOL_AUTO;
    forced_spec fs = {.r = r, .answer_prefix = chat_answer_prefix(syntax), .e = e};
    if (!chat_forced_call_shape(syntax, &fs.fc)) {
        if (!forced) return 0; /* no call can be parsed out either: the format covers the reply */
        api_error_set(e, 400, "invalid_request_error", "tool_choice", "unsupported_value",
                      "This model's chat template shows no tool-call syntax this server knows, so a tool call "
                      "cannot be forced; use tool_choice \"auto\".");
        return -1;
    }
    /* A forced turn is a call: the response format is for the text answer of a later turn (as
     * OpenAI's API takes the pair), so it does not enter this grammar. */
    cJSON *answer = NULL;
    if (!forced && !(answer = cJSON_Parse(r->format_schema))) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory building the tool-call grammar");
        return -1;
    }
    fs.answer = answer;
    /* Cached like every other grammar, so an agent that resends the same tools reuses the
     * compiled grammar and the token tables built for it on earlier requests. */
    bytebuf key = {0};
    bytebuf_printf(&key, "%d\n%d\n%s\n%s\n%s", (int)syntax, (int)r->tool_choice,
                   r->tool_choice == API_TOOL_NAMED ? r->tool_choice_name : "", r->tools_json,
                   forced ? "" : r->format_schema);
    grammar *g = NULL;
    if (bytebuf_ok(&key)) {
        /* The cache's own failure (memory for the key) calls no build_forced to say why. */
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory building the tool-call grammar");
        char err[256];
        g = api_constraint_cached('T', key.data, key.len, build_forced, &fs, err, sizeof err);
    } else {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory building the tool-call grammar");
    }
    bytebuf_free(&key);
    cJSON_Delete(answer);
    if (!g) return -1;
    grammar_unref(r->grammar);
    r->grammar = g;
    return 0;
}
