/* api_responses.c - see api_responses.h.  Translation builds a cJSON chat body; replies are
 * cJSON trees printed once, like api_encode's. */
#include "api_responses.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_strict.h"

#define INVALID "invalid_request_error"

/* ---- translation ------------------------------------------------------------------------ */

static int invalid(api_error *e, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int invalid(api_error *e, const char *param, const char *code, const char *fmt, ...)
{
    char msg[sizeof e->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_error_set(e, 400, INVALID, param, code, "%s", msg);
    return -1;
}

static int oom(api_error *e)
{
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

static int not_string(api_error *e, const char *param)
{
    return invalid(e, param, "invalid_type", "Invalid type for '%s': expected a string.", param);
}

/* The members of `from` named in keys (those present and not null), copied into `to`. */
static int copy_keys(const cJSON *from, cJSON *to, const char *const *keys, size_t n, api_error *e)
{
    for (size_t k = 0; k < n; k++) {
        const cJSON *v = json_field(from, keys[k]);
        if (v && !cJSON_AddItemToObject(to, keys[k], cJSON_Duplicate(v, true))) return oom(e);
    }
    return 0;
}

/* {"type": "function", "function": {}} (chat's wrapping of a tool, a call, a choice), with
 * *fn the inner object; NULL when out of memory. */
static cJSON *function_wrapper(cJSON **fn)
{
    cJSON *c = cJSON_CreateObject();
    *fn = cJSON_CreateObject();
    if (!c || !*fn || !cJSON_AddStringToObject(c, "type", "function")) {
        cJSON_Delete(c);
        cJSON_Delete(*fn);
        return NULL;
    }
    cJSON_AddItemToObject(c, "function", *fn);
    return c;
}

/* Nothing is stored here, so whatever names earlier state cannot be honoured. */
static int refuse_stateful(const cJSON *in, api_error *e)
{
    static const char stateless[] = "is not supported: this server stores no responses or conversations; send "
                                    "the whole conversation in 'input'.";
    if (json_field(in, "previous_response_id")) return api_error_unsupported(e, "previous_response_id", stateless);
    if (json_field(in, "conversation")) return api_error_unsupported(e, "conversation", stateless);
    if (json_field(in, "prompt"))
        return api_error_unsupported(e, "prompt", "(a stored prompt template) is not supported.");
    if (cJSON_IsTrue(json_field(in, "background")))
        return api_error_unsupported(e, "background", "is not supported: responses are streamed or returned, not stored.");
    if (json_field(in, "max_tool_calls")) return api_error_unsupported(e, "max_tool_calls", "is not supported.");
    const cJSON *tl = json_field(in, "top_logprobs");
    if (tl && !(cJSON_IsNumber(tl) && tl->valuedouble == 0))
        return api_error_unsupported(e, "top_logprobs",
                                     "is not supported on /v1/responses; /v1/chat/completions has logprobs.");
    return 0;
}

/* Fields that mean the same in a chat request (with inferd's sampling and template
 * extensions, which the chat endpoint takes too); their values are checked there. */
static int copy_plain(const cJSON *in, cJSON *out, api_error *e)
{
    static const char *const same[] = {"model", "temperature", "top_p", "stream", "user", "parallel_tool_calls",
                                       "seed", "stop", "top_k", "min_p", "repeat_penalty", "presence_penalty",
                                       "frequency_penalty", "logit_bias", "ignore_eos", "speculative",
                                       "chat_template_kwargs", "grammar"};
    if (copy_keys(in, out, same, sizeof same / sizeof same[0], e)) return -1;
    const cJSON *mot = json_field(in, "max_output_tokens");
    if (mot && !cJSON_AddItemToObject(out, "max_completion_tokens", cJSON_Duplicate(mot, true))) return oom(e);
    /* reasoning.effort is chat's reasoning_effort (a template variable: gpt-oss's reads it) */
    const cJSON *effort = json_field(json_field(in, "reasoning"), "effort");
    if (cJSON_IsString(effort) && !cJSON_AddStringToObject(out, "reasoning_effort", effort->valuestring)) return oom(e);
    return 0;
}

static int parts_of(const cJSON *content, const char *param, cJSON *arr, api_error *e);

/* Content parts: text of every kind becomes a chat text part; images, files and audio are
 * refused (this server has no encoder for them). */
static int content_of(const cJSON *content, const char *param, cJSON **out, api_error *e)
{
    if (cJSON_IsString(content)) {
        *out = cJSON_CreateString(content->valuestring);
        return *out ? 0 : oom(e);
    }
    if (!cJSON_IsArray(content))
        return invalid(e, param, "invalid_type", "Invalid type for '%s': expected a string or an array of content parts.",
                       param);
    *out = cJSON_CreateArray();
    if (!*out) return oom(e);
    if (parts_of(content, param, *out, e) == 0) return 0;
    cJSON_Delete(*out);
    *out = NULL;
    return -1;
}

/* The parts of content as chat text parts appended to arr. */
static int parts_of(const cJSON *content, const char *param, cJSON *arr, api_error *e)
{
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = json_field(part, "type"), *text = json_field(part, "text");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "text")) {
            if (!cJSON_IsString(text)) return invalid(e, param, "invalid_value", "Invalid '%s': a text part needs a string 'text'.", param);
            cJSON *p = cJSON_CreateObject();
            if (!p || !cJSON_AddStringToObject(p, "type", "text") || !cJSON_AddStringToObject(p, "text", text->valuestring)) {
                cJSON_Delete(p);
                return oom(e);
            }
            cJSON_AddItemToArray(arr, p);
        } else if (!strcmp(t, "refusal")) {
            continue; /* an earlier refusal says nothing the model needs */
        } else if (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio")) {
            return invalid(e, param, "unsupported_parameter", "Invalid '%s': '%s' parts are not supported: this server "
                           "takes text only.", param, t);
        } else {
            return invalid(e, param, "invalid_value", "Invalid '%s': unknown content part type '%.40s'.", param, t);
        }
    }
    return 0;
}

/* The chat messages a translation builds, with what the items after need of them: the last
 * one (function_call items join the assistant turn before them) and the call ids so far (a
 * function_call_output must answer one).  Kept here because indexing a cJSON array walks it
 * from the start: a body of many items would cost its square. */
typedef struct chat_msgs {
    cJSON *arr, *last;
    const char **call_ids; /* strings of the request, which outlives the translation */
    int n_call_ids, cap_call_ids;
} chat_msgs;

/* Appends {"role": role, "content": content} to msgs, taking content over; the message, or
 * NULL (content freed) when out of memory, content == NULL included (a failed create). */
static cJSON *add_message(chat_msgs *msgs, const char *role, cJSON *content)
{
    cJSON *m = cJSON_CreateObject();
    if (!m || !content || !cJSON_AddStringToObject(m, "role", role)) {
        cJSON_Delete(m);
        cJSON_Delete(content);
        return NULL;
    }
    cJSON_AddItemToObject(m, "content", content);
    cJSON_AddItemToArray(msgs->arr, m);
    return msgs->last = m;
}

static cJSON *last_assistant(chat_msgs *msgs)
{
    const cJSON *role = msgs->last ? cJSON_GetObjectItemCaseSensitive(msgs->last, "role") : NULL;
    return cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") ? msgs->last : NULL;
}

static bool remember_call(chat_msgs *msgs, const char *id)
{
    if (msgs->n_call_ids == msgs->cap_call_ids) {
        int cap = msgs->cap_call_ids ? 2 * msgs->cap_call_ids : 16;
        const char **p = realloc(msgs->call_ids, (size_t)cap * sizeof *p);
        if (!p) return false;
        msgs->call_ids = p;
        msgs->cap_call_ids = cap;
    }
    msgs->call_ids[msgs->n_call_ids++] = id;
    return true;
}

/* Items are at most API_MAX_ITEMS, so this stays a few million comparisons at worst. */
static bool called(const chat_msgs *msgs, const char *id)
{
    for (int i = msgs->n_call_ids - 1; i >= 0; i--)
        if (!strcmp(msgs->call_ids[i], id)) return true;
    return false;
}

/* A function_call item: a tool call of the assistant turn it follows (or of a new one). */
static int add_function_call(chat_msgs *msgs, const cJSON *it, const char *param, api_error *e)
{
    const cJSON *id = json_field(it, "call_id"), *name = json_field(it, "name"), *args = json_field(it, "arguments");
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
        return invalid(e, param, "invalid_value",
                       "Invalid '%s': a function_call item needs string 'call_id', 'name' and 'arguments'.", param);
    cJSON *m = last_assistant(msgs);
    if (!m && !(m = add_message(msgs, "assistant", cJSON_CreateNull()))) return oom(e);
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *fn;
    if (!calls && !(calls = cJSON_AddArrayToObject(m, "tool_calls"))) return oom(e);
    cJSON *c = function_wrapper(&fn);
    if (!c) return oom(e);
    cJSON_AddItemToArray(calls, c);
    /* a call of a namespace's function: named as the model was offered it, "ns.name" */
    const cJSON *ns = json_field(it, "namespace");
    char full[256];
    snprintf(full, sizeof full, "%s%s%s", cJSON_IsString(ns) ? ns->valuestring : "", cJSON_IsString(ns) ? "." : "",
             name->valuestring);
    if (!cJSON_AddStringToObject(c, "id", id->valuestring) || !cJSON_AddStringToObject(fn, "name", full) ||
        !cJSON_AddStringToObject(fn, "arguments", args->valuestring) || !remember_call(msgs, id->valuestring))
        return oom(e);
    return 0;
}

/* A function_call_output item: the tool message answering call_id. */
static int add_call_output(chat_msgs *msgs, const cJSON *it, const char *param, api_error *e)
{
    const cJSON *id = json_field(it, "call_id"), *output = json_field(it, "output");
    if (!cJSON_IsString(id) || !output)
        return invalid(e, param, "invalid_value",
                       "Invalid '%s': a function_call_output item needs a string 'call_id' and an 'output'.", param);
    /* OpenAI's 400: a result the model never asked for cannot be placed in the conversation */
    if (!called(msgs, id->valuestring))
        return invalid(e, param, "invalid_value", "No tool call found for function call output with call_id %.64s.",
                       id->valuestring);
    cJSON *content = NULL, *m;
    if (content_of(output, param, &content, e)) return -1;
    if (!(m = add_message(msgs, "tool", content)) || !cJSON_AddStringToObject(m, "tool_call_id", id->valuestring))
        return oom(e);
    return 0;
}

static int add_item(chat_msgs *msgs, const cJSON *it, const char *param, api_error *e)
{
    if (!cJSON_IsObject(it)) return invalid(e, param, "invalid_type", "Invalid type for '%s': expected an object.", param);
    const cJSON *type = json_field(it, "type");
    if (type && !cJSON_IsString(type)) return not_string(e, param);
    const char *t = type ? type->valuestring : "message";
    if (!strcmp(t, "function_call")) return add_function_call(msgs, it, param, e);
    if (!strcmp(t, "function_call_output")) return add_call_output(msgs, it, param, e);
    if (!strcmp(t, "reasoning")) return 0; /* earlier reasoning is not replayed (templates drop it too) */
    if (!strcmp(t, "item_reference"))
        return invalid(e, param, "unsupported_parameter", "Invalid '%s': item references are not supported: this "
                       "server stores nothing to refer to.", param);
    if (strcmp(t, "message"))
        return invalid(e, param, "invalid_value", "Invalid '%s': unsupported input item type '%.40s'.", param, t);
    const cJSON *role = json_field(it, "role"), *content = cJSON_GetObjectItemCaseSensitive(it, "content");
    if (!cJSON_IsString(role)) return invalid(e, param, "invalid_value", "Invalid '%s': a message needs a string 'role'.", param);
    if (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant") && strcmp(role->valuestring, "system") &&
        strcmp(role->valuestring, "developer"))
        return invalid(e, param, "invalid_value",
                       "Invalid '%s': role '%.40s' is not supported; expected 'user', 'assistant', 'system' or 'developer'.",
                       param, role->valuestring);
    cJSON *c = NULL;
    if (content_of(content, param, &c, e)) return -1;
    return add_message(msgs, role->valuestring, c) ? 0 : oom(e);
}

/* instructions and input -> messages */
static int translate_input(const cJSON *in, chat_msgs *msgs, api_error *e)
{
    const cJSON *ins = json_field(in, "instructions");
    if (ins && !cJSON_IsString(ins)) return not_string(e, "instructions");
    if (ins && !add_message(msgs, "system", cJSON_CreateString(ins->valuestring))) return oom(e);
    const cJSON *input = json_field(in, "input");
    if (!input) return invalid(e, "input", "missing_required_parameter", "Missing required parameter: 'input'.");
    if (cJSON_IsString(input)) return add_message(msgs, "user", cJSON_CreateString(input->valuestring)) ? 0 : oom(e);
    if (!cJSON_IsArray(input))
        return invalid(e, "input", "invalid_type", "Invalid type for 'input': expected a string or an array of items.");
    /* the chat request's limit on messages, the instructions being one of them */
    int n = cJSON_GetArraySize(input), max = API_MAX_ITEMS - (ins ? 1 : 0);
    if (n > max) return api_error_too_long(e, "input", n, max);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, input) {
        char param[32];
        snprintf(param, sizeof param, "input[%d]", i++);
        if (add_item(msgs, it, param, e)) return -1;
    }
    return 0;
}

/* Hosted tools: OpenAI runs them on its side (a search engine, a vector store, a sandbox, a
 * computer, an image model, a remote MCP server), so a client may offer them to any Responses
 * server; this one has none of them.  Prefixes of their types, which carry dates
 * (web_search_preview_2025_03_11, computer_use_preview). */
static bool hosted_tool(const char *type)
{
    static const char *const hosted[] = {"web_search", "file_search", "code_interpreter", "computer",
                                         "image_generation", "mcp"};
    for (size_t i = 0; i < sizeof hosted / sizeof hosted[0]; i++)
        if (!strncmp(type, hosted[i], strlen(hosted[i]))) return true;
    return false;
}

/* Notes a hosted tool set aside: its type joins rq->ignored_tools ("web_search, mcp"). */
static int note_ignored(api_resp_req *rq, const char *type, api_error *e)
{
    size_t have = rq->ignored_tools ? strlen(rq->ignored_tools) : 0, add = strlen(type);
    for (const char *p = rq->ignored_tools; p && *p;) { /* each named once */
        size_t n = strcspn(p, ",");
        if (n == add && !memcmp(p, type, n)) return 0;
        p += n + (p[n] ? 2 : 0);
    }
    char *p = realloc(rq->ignored_tools, have + add + 3);
    if (!p) return oom(e);
    snprintf(p + have, add + 3, "%s%s", have ? ", " : "", type);
    rq->ignored_tools = p;
    return 0;
}

/* One flat function tool -> a chat tool named prefix + its name (prefix "ns." inside the
 * namespace ns). */
static int add_function_tool(cJSON *ct, const cJSON *t, const char *prefix, api_error *e)
{
    cJSON *fn, *c = function_wrapper(&fn);
    if (!c) return oom(e);
    cJSON_AddItemToArray(ct, c);
    static const char *const keys[] = {"description", "parameters", "strict"};
    if (copy_keys(t, fn, keys, sizeof keys / sizeof keys[0], e)) return -1;
    const cJSON *name = json_field(t, "name");
    if (!cJSON_IsString(name)) return copy_keys(t, fn, (const char *const[]){"name"}, 1, e); /* api_request names it */
    size_t n = strlen(prefix) + strlen(name->valuestring) + 1;
    char *full = malloc(n);
    if (!full) return oom(e);
    snprintf(full, n, "%s%s", prefix, name->valuestring);
    bool ok = cJSON_AddStringToObject(fn, "name", full) != NULL;
    free(full);
    return ok ? 0 : oom(e);
}

/* A namespace tool {"type": "namespace", "name": ns, "tools": [function tools]} is its
 * functions, each offered to the model as "ns.name" (how OpenAI's models see a namespace's
 * functions); a call of one goes back as {"name": name, "namespace": ns}. */
static int add_namespace(cJSON *ct, const cJSON *t, const char *param, api_resp_req *rq, api_error *e)
{
    const cJSON *ns = json_field(t, "name"), *tools = json_field(t, "tools"), *sub;
    if (!cJSON_IsString(ns) || !ns->valuestring[0] || strchr(ns->valuestring, '.') || !cJSON_IsArray(tools))
        return invalid(e, param, "invalid_value",
                       "Invalid '%s': a namespace tool needs a 'name' (without '.') and an array of function 'tools'.",
                       param);
    char prefix[160];
    snprintf(prefix, sizeof prefix, "%.150s.", ns->valuestring);
    cJSON_ArrayForEach(sub, tools) {
        const cJSON *type = json_field(sub, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return invalid(e, param, "unsupported_parameter",
                           "Invalid '%s': a namespace's tools must be function tools.", param);
        if (add_function_tool(ct, sub, prefix, e)) return -1;
    }
    if (!rq) return 0;
    size_t have = rq->namespaces ? strlen(rq->namespaces) : 0, add = strlen(prefix);
    char *p = realloc(rq->namespaces, have + add + 1);
    if (!p) return oom(e);
    memcpy(p + have, prefix, add + 1); /* "a.b." : each name with its dot */
    rq->namespaces = p;
    return 0;
}

/* Flat function tools -> chat tools, namespace tools -> their functions; hosted tools (which
 * need what this server does not have) are set aside, named in rq->ignored_tools; other types
 * are refused. */
static int translate_tools(const cJSON *in, cJSON *out, api_resp_req *rq, api_error *e)
{
    const cJSON *tools = json_field(in, "tools");
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return invalid(e, "tools", "invalid_type", "Invalid type for 'tools': expected an array.");
    cJSON *ct = cJSON_AddArrayToObject(out, "tools");
    if (!ct) return oom(e);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char param[40];
        snprintf(param, sizeof param, "tools[%d].type", i++);
        const cJSON *type = json_field(t, "type");
        if (!cJSON_IsString(type)) return not_string(e, param);
        int rc;
        if (!strcmp(type->valuestring, "function")) rc = add_function_tool(ct, t, "", e);
        else if (!strcmp(type->valuestring, "namespace")) rc = add_namespace(ct, t, param, rq, e);
        else if (hosted_tool(type->valuestring)) rc = note_ignored(rq, type->valuestring, e);
        else
            return invalid(e, param, "unsupported_parameter",
                           "Invalid '%s': '%.40s' tools are not supported: this server runs function tools only.", param,
                           type->valuestring);
        if (rc) return -1;
    }
    if (!cJSON_GetArraySize(ct)) cJSON_DeleteItemFromObjectCaseSensitive(out, "tools"); /* hosted ones only */
    return 0;
}

static int translate_tool_choice(const cJSON *in, cJSON *out, api_error *e)
{
    const cJSON *tc = json_field(in, "tool_choice");
    if (!tc) return 0;
    if (cJSON_IsString(tc)) return cJSON_AddItemToObject(out, "tool_choice", cJSON_Duplicate(tc, true)) ? 0 : oom(e);
    const cJSON *type = json_field(tc, "type"), *name = json_field(tc, "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type))
        return invalid(e, "tool_choice", "invalid_type",
                       "Invalid type for 'tool_choice': expected 'none', 'auto', 'required' or {\"type\": \"function\", "
                       "\"name\": ...}.");
    if (strcmp(type->valuestring, "function"))
        return invalid(e, "tool_choice", "unsupported_parameter",
                       "Invalid 'tool_choice': '%.40s' is not supported: this server runs function tools only.",
                       type->valuestring);
    if (!cJSON_IsString(name)) return not_string(e, "tool_choice.name");
    cJSON *fn, *c = function_wrapper(&fn);
    if (!c) return oom(e);
    cJSON_AddItemToObject(out, "tool_choice", c);
    return cJSON_AddStringToObject(fn, "name", name->valuestring) ? 0 : oom(e);
}

/* text.format -> response_format */
static int translate_text(const cJSON *in, cJSON *out, api_error *e)
{
    const cJSON *text = json_field(in, "text");
    if (!text) return 0;
    if (!cJSON_IsObject(text)) return invalid(e, "text", "invalid_type", "Invalid type for 'text': expected an object.");
    const cJSON *fmt = json_field(text, "format");
    if (!fmt) return 0;
    const cJSON *type = json_field(fmt, "type");
    if (!cJSON_IsObject(fmt) || !cJSON_IsString(type)) return not_string(e, "text.format.type");
    if (!strcmp(type->valuestring, "text")) return 0;
    cJSON *rf = cJSON_AddObjectToObject(out, "response_format");
    if (!rf || !cJSON_AddStringToObject(rf, "type", type->valuestring)) return oom(e);
    if (!strcmp(type->valuestring, "json_object")) return 0;
    if (strcmp(type->valuestring, "json_schema"))
        return invalid(e, "text.format.type", "invalid_value",
                       "Invalid 'text.format.type': '%.40s'; expected 'text', 'json_object' or 'json_schema'.",
                       type->valuestring);
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    if (!js) return oom(e);
    static const char *const keys[] = {"name", "description", "schema", "strict"};
    return copy_keys(fmt, js, keys, sizeof keys / sizeof keys[0], e);
}

/* What the response object repeats, as the client sent it. */
static int keep_echo(const cJSON *in, api_resp_req *rq, api_error *e)
{
    const cJSON *v;
#define KEEP(name)                                                                               \
    if ((v = json_field(in, #name)) && !(rq->name = cJSON_PrintUnformatted(v))) return oom(e);
    API_RESP_ECHOED(KEEP)
#undef KEEP
    rq->parallel_tool_calls = !cJSON_IsFalse(json_field(in, "parallel_tool_calls"));
    return 0;
}

int api_responses_translate(const char *body, size_t len, char **chat_body, api_resp_req *rq, api_error *e)
{
    memset(rq, 0, sizeof *rq);
    *chat_body = NULL;
    cJSON *in = json_parse_body(body, len, e);
    if (!in) return -1;
    cJSON *out = cJSON_CreateObject();
    int rc = out ? refuse_stateful(in, e) : oom(e);
    if (rc == 0) rc = copy_plain(in, out, e);
    chat_msgs msgs = {.arr = out ? cJSON_AddArrayToObject(out, "messages") : NULL};
    if (rc == 0 && !msgs.arr) rc = oom(e);
    if (rc == 0) rc = translate_input(in, &msgs, e);
    free(msgs.call_ids);
    if (rc == 0) rc = translate_tools(in, out, rq, e);
    if (rc == 0) rc = translate_tool_choice(in, out, e);
    if (rc == 0) rc = translate_text(in, out, e);
    if (rc == 0) rc = keep_echo(in, rq, e);
    if (rc == 0 && !(*chat_body = cJSON_PrintUnformatted(out))) rc = oom(e);
    cJSON_Delete(in);
    cJSON_Delete(out);
    if (rc) api_resp_req_free(rq);
    return rc;
}

void api_resp_req_free(api_resp_req *rq)
{
#define DROP(name)                                                                               \
    free(rq->name);                                                                              \
    rq->name = NULL;
    API_RESP_ECHOED(DROP)
#undef DROP
    free(rq->namespaces);
    free(rq->ignored_tools);
    rq->namespaces = rq->ignored_tools = NULL;
}

void api_responses_rename_error(api_error *e)
{
    /* chat indexes count the system message and merge function_call items: the item is not
     * named, the parameter is */
    if (!strncmp(e->param, "messages", 8)) {
        api_error_rename(e, e->param, "input");
        return;
    }
    if (api_error_rename(e, "max_completion_tokens", "max_output_tokens")) return;
    if (api_error_rename(e, "response_format.json_schema", "text.format")) return;
    if (api_error_rename(e, "response_format", "text.format")) return;
    if (api_error_rename(e, "tool_choice.function", "tool_choice")) return;
    const char *f = strncmp(e->param, "tools[", 6) ? NULL : strstr(e->param, "].function");
    if (f) { /* tools[i].function.x -> tools[i].x: Responses tools are flat */
        char to[sizeof e->param];
        snprintf(to, sizeof to, "%.*s%s", (int)(f + 1 - e->param), e->param, f + strlen("].function"));
        api_error_rename(e, e->param, to);
    }
}

/* ---- replies ------------------------------------------------------------------------------ */

static cJSON *text_string(const char *s, size_t len)
{
    char *clean = api_utf8_sanitize(s ? s : "", s ? len : 0, NULL);
    cJSON *v = clean ? cJSON_CreateString(clean) : NULL;
    free(clean);
    return v;
}

static void add_raw_or(cJSON *o, const char *key, const char *raw, const char *dflt)
{
    if (raw) cJSON_AddRawToObject(o, key, raw);
    else if (dflt) cJSON_AddRawToObject(o, key, dflt);
    else cJSON_AddNullToObject(o, key);
}

static cJSON *usage_json(const api_usage *u)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", u->prompt_tokens);
    cJSON *in = cJSON_AddObjectToObject(o, "input_tokens_details");
    if (in) cJSON_AddNumberToObject(in, "cached_tokens", u->cached_tokens);
    cJSON_AddNumberToObject(o, "output_tokens", u->completion_tokens);
    cJSON *out = cJSON_AddObjectToObject(o, "output_tokens_details");
    if (out) cJSON_AddNumberToObject(out, "reasoning_tokens", 0);
    cJSON_AddNumberToObject(o, "total_tokens", u->prompt_tokens + u->completion_tokens);
    return o;
}

/* What tells the two text-carrying items apart. */
static const struct item_kind {
    const char *type, *part, *id_prefix, *delta_event, *done_event;
} kinds[] = {
    [RESP_ITEM_MESSAGE] = {"message", "output_text", "msg", "response.output_text.delta", "response.output_text.done"},
    [RESP_ITEM_REASONING] = {"reasoning", "reasoning_text", "rs", "response.reasoning_text.delta",
                             "response.reasoning_text.done"},
};

/* Output items: message (one output_text part), reasoning (one reasoning_text part), call. */
static cJSON *text_part(const char *type, const char *s, size_t len)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", type);
    cJSON_AddItemToObject(p, "text", text_string(s, len));
    if (!strcmp(type, "output_text")) {
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddArrayToObject(p, "logprobs");
    }
    return p;
}

static cJSON *item(api_resp_item kind, const char *id, const char *status, const char *s, size_t len, bool with_part)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", kinds[kind].type);
    if (kind == RESP_ITEM_REASONING) cJSON_AddArrayToObject(it, "summary");
    cJSON_AddStringToObject(it, "status", status);
    if (kind == RESP_ITEM_MESSAGE) cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (with_part && content) cJSON_AddItemToArray(content, text_part(kinds[kind].part, s, len));
    return it;
}

/* The function a call names, split back into its namespace when the request offered it inside
 * one (namespaces: "a.b." as add_namespace keeps them); *ns_len 0 when it is a plain function. */
static const char *call_name(const api_resp_req *rq, const char *name, size_t *ns_len)
{
    *ns_len = 0;
    const char *dot = name ? strchr(name, '.') : NULL;
    if (!dot || !rq || !rq->namespaces) return name;
    size_t n = (size_t)(dot - name) + 1;
    for (const char *p = rq->namespaces; *p;) {
        const char *end = strchr(p, '.');
        if ((size_t)(end - p) + 1 == n && !memcmp(p, name, n)) {
            *ns_len = n - 1;
            return dot + 1;
        }
        p = end + 1;
    }
    return name;
}

static cJSON *call_item(const api_resp_req *rq, const chat_tool_call *c, const char *status, bool with_args)
{
    cJSON *it = cJSON_CreateObject();
    char id[64];
    snprintf(id, sizeof id, "fc_%s", c->id && !strncmp(c->id, "call_", 5) ? c->id + 5 : c->id ? c->id : "0");
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddItemToObject(it, "call_id", text_string(c->id, c->id ? strlen(c->id) : 0));
    size_t ns_len;
    const char *name = call_name(rq, c->name, &ns_len);
    cJSON_AddItemToObject(it, "name", text_string(name, name ? strlen(name) : 0));
    if (ns_len) cJSON_AddItemToObject(it, "namespace", text_string(c->name, ns_len));
    cJSON_AddItemToObject(it, "arguments", with_args ? text_string(c->arguments, c->arguments ? strlen(c->arguments) : 0)
                                                     : cJSON_CreateString(""));
    return it;
}

/* The response object; output is taken over (NULL: []). */
static cJSON *response_object(const api_meta *m, const api_resp_req *rq, const char *status, cJSON *output,
                              const api_usage *u, bool incomplete, const api_error *err)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)m->created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddFalseToObject(o, "background");
    if (err) {
        cJSON *eo = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(eo, "code", err->code[0] ? err->code : "server_error");
        cJSON_AddItemToObject(eo, "message", text_string(err->message, strlen(err->message)));
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (incomplete) {
        cJSON *d = cJSON_AddObjectToObject(o, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(o, "incomplete_details");
    }
    add_raw_or(o, "instructions", rq->instructions, NULL);
    add_raw_or(o, "max_output_tokens", rq->max_output_tokens, NULL);
    add_raw_or(o, "metadata", rq->metadata, "{}");
    cJSON_AddStringToObject(o, "model", m->model);
    cJSON_AddItemToObject(o, "output", output ? output : cJSON_CreateArray());
    cJSON_AddBoolToObject(o, "parallel_tool_calls", rq->parallel_tool_calls);
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON *rs = cJSON_AddObjectToObject(o, "reasoning");
    cJSON_AddNullToObject(rs, "effort");
    cJSON_AddNullToObject(rs, "summary");
    cJSON_AddFalseToObject(o, "store"); /* whatever was asked: nothing is kept */
    add_raw_or(o, "temperature", rq->temperature, "1");
    add_raw_or(o, "text", rq->text, "{\"format\":{\"type\":\"text\"}}");
    add_raw_or(o, "tool_choice", rq->tool_choice, "\"auto\"");
    add_raw_or(o, "tools", rq->tools, "[]");
    add_raw_or(o, "top_p", rq->top_p, "1");
    cJSON_AddStringToObject(o, "truncation", "disabled");
    if (u) cJSON_AddItemToObject(o, "usage", usage_json(u));
    else cJSON_AddNullToObject(o, "usage");
    add_raw_or(o, "user", rq->user, NULL);
    return o;
}

/* "msg_<the response id's random part><index>": unique across responses too. */
static void item_id(char *buf, size_t cap, api_resp_item kind, const api_meta *m, int index)
{
    const char *r = strncmp(m->id, "resp_", 5) ? m->id : m->id + 5;
    snprintf(buf, cap, "%s_%.32s%02d", kinds[kind].id_prefix, r, index);
}

char *api_responses_json(const api_meta *m, const api_resp_req *rq, const api_resp_out *o, const api_usage *u)
{
    cJSON *output = cJSON_CreateArray();
    char id[48];
    int index = 0;
    if (o->reasoning_len) {
        item_id(id, sizeof id, RESP_ITEM_REASONING, m, index++);
        cJSON_AddItemToArray(output, item(RESP_ITEM_REASONING, id, "completed", o->reasoning, o->reasoning_len, true));
    }
    if (o->text_len || (o->n_calls == 0 && o->reasoning_len == 0)) { /* (as api_resp_stream_end) */
        item_id(id, sizeof id, RESP_ITEM_MESSAGE, m, index++);
        cJSON_AddItemToArray(output, item(RESP_ITEM_MESSAGE, id, o->incomplete ? "incomplete" : "completed", o->text,
                                          o->text_len, true));
    }
    for (int i = 0; i < o->n_calls; i++) cJSON_AddItemToArray(output, call_item(rq, &o->calls[i], "completed", true));
    cJSON *root = response_object(m, rq, o->incomplete ? "incomplete" : "completed", output, u, o->incomplete, NULL);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- streams ------------------------------------------------------------------------------ */

/* "event: TYPE\ndata: {...,"type":TYPE,"sequence_number":N}\n\n"; ev is consumed. */
static void emit(api_resp_stream *s, const char *type, cJSON *ev)
{
    if (!ev || !cJSON_AddStringToObject(ev, "type", type) || !cJSON_AddNumberToObject(ev, "sequence_number", s->seq++)) {
        cJSON_Delete(ev);
        s->failed = s->out->failed = true;
        return;
    }
    char *json = cJSON_PrintUnformatted(ev);
    cJSON_Delete(ev);
    if (!json) {
        s->failed = s->out->failed = true;
        return;
    }
    bytebuf_printf(s->out, "event: %s\ndata: %s\n\n", type, json);
    free(json);
}

/* A new event about output item index (item_id: NULL when the event carries the item). */
static cJSON *at(int index, const char *item_id)
{
    cJSON *ev = cJSON_CreateObject();
    if (ev && item_id) cJSON_AddStringToObject(ev, "item_id", item_id);
    if (ev) cJSON_AddNumberToObject(ev, "output_index", index);
    return ev;
}

/* ... and about its content part 0 */
static cJSON *at_part(int index, const char *item_id)
{
    cJSON *ev = at(index, item_id);
    if (ev) cJSON_AddNumberToObject(ev, "content_index", 0);
    return ev;
}

static int n_items(const api_resp_stream *s) { return cJSON_GetArraySize(s->done) + (s->open ? 1 : 0); }

void api_resp_stream_begin(api_resp_stream *s, const api_meta *m, const api_resp_req *rq, bytebuf *out)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    s->rq = rq;
    s->out = out;
    s->done = cJSON_CreateArray();
    if (!s->done) s->failed = out->failed = true;
    static const char *const first[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        cJSON *ev = cJSON_CreateObject();
        if (ev) cJSON_AddItemToObject(ev, "response", response_object(m, rq, "in_progress", NULL, NULL, false, NULL));
        emit(s, first[i], ev);
    }
}

/* Finishes an open function_call: its arguments' .done, the item's .done. */
static void close_call(api_resp_stream *s, const char *status)
{
    chat_tool_call c = {.id = s->call_id, .name = s->call_name, .arguments = s->open_text.data ? s->open_text.data : ""};
    cJSON *done = call_item(s->rq, &c, status, true);
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(done, "arguments");
    cJSON *ev = at(s->open_index, s->open_id);
    if (ev) cJSON_AddStringToObject(ev, "arguments", cJSON_IsString(args) ? args->valuestring : "");
    emit(s, "response.function_call_arguments.done", ev);
    ev = at(s->open_index, NULL);
    if (ev) cJSON_AddItemToObject(ev, "item", cJSON_Duplicate(done, true));
    emit(s, "response.output_item.done", ev);
    if (done) cJSON_AddItemToArray(s->done, done);
    free(s->call_id);
    free(s->call_name);
    s->call_id = s->call_name = NULL;
}

/* Finishes the open item: its text's .done, its part's .done, the item's .done. */
static void close_item(api_resp_stream *s, const char *status)
{
    if (!s->open) return;
    if (s->open == RESP_ITEM_CALL) {
        close_call(s, status);
        s->open = RESP_ITEM_NONE;
        bytebuf_clear(&s->open_text);
        return;
    }
    const struct item_kind *k = &kinds[s->open];
    const char *text = s->open_text.data ? s->open_text.data : "";
    size_t len = s->open_text.len;
    cJSON *ev = at_part(s->open_index, s->open_id);
    if (ev) cJSON_AddItemToObject(ev, "text", text_string(text, len));
    if (ev && s->open == RESP_ITEM_MESSAGE) cJSON_AddArrayToObject(ev, "logprobs");
    emit(s, k->done_event, ev);
    ev = at_part(s->open_index, s->open_id);
    if (ev) cJSON_AddItemToObject(ev, "part", text_part(k->part, text, len));
    emit(s, "response.content_part.done", ev);
    cJSON *done = item(s->open, s->open_id, status, text, len, true);
    ev = at(s->open_index, NULL);
    if (ev) cJSON_AddItemToObject(ev, "item", cJSON_Duplicate(done, true));
    emit(s, "response.output_item.done", ev);
    if (done) cJSON_AddItemToArray(s->done, done);
    s->open = RESP_ITEM_NONE;
    bytebuf_clear(&s->open_text);
}

/* Opens an item of kind with its one empty text part. */
static void open_item(api_resp_stream *s, api_resp_item kind)
{
    close_item(s, "completed");
    int index = n_items(s);
    item_id(s->open_id, sizeof s->open_id, kind, s->m, index);
    cJSON *ev = at(index, NULL);
    if (ev) cJSON_AddItemToObject(ev, "item", item(kind, s->open_id, "in_progress", "", 0, false));
    emit(s, "response.output_item.added", ev);
    ev = at_part(index, s->open_id);
    if (ev) cJSON_AddItemToObject(ev, "part", text_part(kinds[kind].part, "", 0));
    emit(s, "response.content_part.added", ev);
    s->open = kind;
    s->open_index = index;
}

/* Delta text into an item of kind, opening it first when needed. */
static void delta(api_resp_stream *s, api_resp_item kind, const char *text, size_t len)
{
    if (s->failed || len == 0) return;
    if (s->open != kind) open_item(s, kind);
    char *clean = api_utf8_sanitize(text, len, &len);
    if (!clean) {
        s->failed = s->out->failed = true;
        return;
    }
    bytebuf_append(&s->open_text, clean, len);
    cJSON *ev = at_part(s->open_index, s->open_id);
    if (ev) cJSON_AddStringToObject(ev, "delta", clean);
    if (ev && kind == RESP_ITEM_MESSAGE) cJSON_AddArrayToObject(ev, "logprobs");
    free(clean);
    emit(s, kinds[kind].delta_event, ev);
}

void api_resp_stream_text(api_resp_stream *s, const char *text, size_t len) { delta(s, RESP_ITEM_MESSAGE, text, len); }
void api_resp_stream_reasoning(api_resp_stream *s, const char *text, size_t len)
{
    delta(s, RESP_ITEM_REASONING, text, len);
}

/* A call's first piece opens its item (arguments ""); fragments go out as they come. */
void api_resp_stream_call(api_resp_stream *s, const chat_tool_call *c)
{
    if (s->failed) return;
    if (c->id) {
        close_item(s, "completed");
        int index = n_items(s);
        cJSON *added = call_item(s->rq, c, "in_progress", false);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(added, "id");
        snprintf(s->open_id, sizeof s->open_id, "%s", cJSON_IsString(id) ? id->valuestring : "");
        cJSON *ev = at(index, NULL);
        if (ev) cJSON_AddItemToObject(ev, "item", added);
        else cJSON_Delete(added);
        emit(s, "response.output_item.added", ev);
        s->call_id = strdup(c->id);
        s->call_name = strdup(c->name ? c->name : "");
        if (!s->call_id || !s->call_name) s->failed = s->out->failed = true;
        s->open = RESP_ITEM_CALL;
        s->open_index = index;
    }
    if (s->open != RESP_ITEM_CALL) return; /* a piece of no open call: nothing to add it to */
    size_t len = c->arguments ? strlen(c->arguments) : 0;
    char *clean = len ? api_utf8_sanitize(c->arguments, len, &len) : NULL;
    if (clean) {
        bytebuf_append(&s->open_text, clean, len);
        cJSON *ev = at(s->open_index, s->open_id);
        if (ev) cJSON_AddStringToObject(ev, "delta", clean);
        emit(s, "response.function_call_arguments.delta", ev);
    } else if (len) {
        s->failed = s->out->failed = true;
    }
    free(clean);
    if (c->last) close_item(s, "completed");
}

void api_resp_stream_end(api_resp_stream *s, bool incomplete, const api_usage *u, const api_error *err)
{
    if (s->failed) return;
    if (!err && n_items(s) == 0) open_item(s, RESP_ITEM_MESSAGE); /* a reply of nothing is one empty message */
    close_item(s, err || incomplete ? "incomplete" : "completed");
    const char *type = err ? "response.failed" : incomplete ? "response.incomplete" : "response.completed";
    const char *status = err ? "failed" : incomplete ? "incomplete" : "completed";
    cJSON *ev = cJSON_CreateObject();
    cJSON *output = cJSON_Duplicate(s->done, true);
    if (ev) cJSON_AddItemToObject(ev, "response", response_object(s->m, s->rq, status, output, u, incomplete && !err, err));
    else cJSON_Delete(output);
    emit(s, type, ev);
}

void api_resp_stream_free(api_resp_stream *s)
{
    free(s->call_id);
    free(s->call_name);
    s->call_id = s->call_name = NULL;
    cJSON_Delete(s->done);
    s->done = NULL;
    bytebuf_free(&s->open_text);
}
