/* api_messages.c - see api_messages.h.  Translation builds a cJSON chat body; replies are cJSON
 * trees printed once, like api_encode's and api_responses'. */
#include "api_messages.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_strict.h"

/* ---- translation ------------------------------------------------------------------------ */

static int bad(api_error *e, const char *param, const char *why)
{
    api_error_set(e, 400, "invalid_request_error", param, "invalid_value", "%s: %s", param, why);
    return -1;
}

static int no_memory(api_error *e)
{
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

/* A chat text part {"type":"text","text":s} appended to arr. */
static bool add_text_part(cJSON *arr, const char *s)
{
    cJSON *p = cJSON_CreateObject();
    if (!p || !cJSON_AddStringToObject(p, "type", "text") || !cJSON_AddStringToObject(p, "text", s)) {
        cJSON_Delete(p);
        return false;
    }
    return cJSON_AddItemToArray(arr, p);
}

/* Blocks this server has no encoder or no service for. */
static int refuse_block(const char *type, const char *param, api_error *e)
{
    static const char *const media[] = {"image", "document", "search_result", "container_upload"};
    for (size_t i = 0; i < sizeof media / sizeof media[0]; i++)
        if (!strcmp(type, media[i])) {
            api_error_set(e, 400, "invalid_request_error", param, "unsupported_parameter",
                          "%s: '%s' content blocks are not supported: this server takes text only.", param, type);
            return -1;
        }
    api_error_set(e, 400, "invalid_request_error", param, "unsupported_parameter",
                  "%s: content blocks of type '%.40s' are not supported.", param, type);
    return -1;
}

/* A text block's citations (sent back from a reply of a server that cites documents) point
 * into documents this server never had: a 400 naming them rather than text without its
 * sources.  An empty list or null is no citation. */
static int refuse_citations(const cJSON *b, const char *param, api_error *e)
{
    const cJSON *c = json_field(b, "citations");
    if (!c || (cJSON_IsArray(c) && !cJSON_GetArraySize(c))) return 0;
    api_error_set(e, 400, "invalid_request_error", param, "unsupported_parameter",
                  "%s: text blocks with 'citations' are not supported: this server takes no documents to cite.", param);
    return -1;
}

/* Text blocks (a tool result's content, the system prompt) as chat text parts; a string as
 * itself. */
static cJSON *text_content(const cJSON *content, const char *param, api_error *e)
{
    if (cJSON_IsString(content)) {
        cJSON *s = cJSON_CreateString(content->valuestring);
        if (!s) no_memory(e);
        return s;
    }
    if (!cJSON_IsArray(content)) {
        bad(e, param, "expected a string or an array of content blocks");
        return NULL;
    }
    cJSON *arr = cJSON_CreateArray();
    if (!arr) {
        no_memory(e);
        return NULL;
    }
    const cJSON *b;
    cJSON_ArrayForEach(b, content) {
        const cJSON *type = json_field(b, "type"), *text = json_field(b, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text")) {
            cJSON_Delete(arr);
            if (cJSON_IsString(type)) refuse_block(type->valuestring, param, e);
            else bad(e, param, "a content block needs a string 'type'");
            return NULL;
        }
        if (refuse_citations(b, param, e)) {
            cJSON_Delete(arr);
            return NULL;
        }
        if (!cJSON_IsString(text) || !add_text_part(arr, text->valuestring)) {
            cJSON_Delete(arr);
            if (cJSON_IsString(text)) no_memory(e);
            else bad(e, param, "a text block needs a string 'text'");
            return NULL;
        }
    }
    return arr;
}

/* {"role": role, ...} appended to msgs; NULL when out of memory. */
static cJSON *add_message(cJSON *msgs, const char *role)
{
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddItemToArray(msgs, m)) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

/* A tool_use block as a chat tool call {"id","type":"function","function":{"name","arguments"}}. */
static int add_tool_use(cJSON *calls, const cJSON *b, const char *param, api_error *e)
{
    const cJSON *id = json_field(b, "id"), *name = json_field(b, "name"), *input = json_field(b, "input");
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || (input && !cJSON_IsObject(input)))
        return bad(e, param, "a tool_use block needs a string 'id' and 'name' and an object 'input'");
    char *args = input ? cJSON_PrintUnformatted(input) : strdup("{}");
    cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    bool ok = args && c && fn && cJSON_AddStringToObject(c, "id", id->valuestring) &&
              cJSON_AddStringToObject(c, "type", "function") && cJSON_AddStringToObject(fn, "name", name->valuestring) &&
              cJSON_AddStringToObject(fn, "arguments", args);
    free(args);
    if (!ok) {
        cJSON_Delete(c);
        cJSON_Delete(fn);
        return no_memory(e);
    }
    cJSON_AddItemToObject(c, "function", fn);
    cJSON_AddItemToArray(calls, c);
    return 0;
}

/* A tool_result block as a chat tool message (is_error is said in its text: chat has no flag). */
static int add_tool_result(cJSON *msgs, const cJSON *b, const char *param, api_error *e)
{
    const cJSON *id = json_field(b, "tool_use_id"), *content = json_field(b, "content");
    if (!cJSON_IsString(id)) return bad(e, param, "a tool_result block needs a string 'tool_use_id'");
    cJSON *c = content ? text_content(content, param, e) : cJSON_CreateString("");
    if (!c) return content ? -1 : no_memory(e);
    if (cJSON_IsTrue(json_field(b, "is_error"))) { /* "Error: " leads the result's text */
        cJSON *parts = cJSON_IsArray(c) ? c : cJSON_CreateArray(), *flag = cJSON_CreateArray();
        bool ok = parts && flag && add_text_part(flag, "Error: ");
        if (ok && parts != c) ok = add_text_part(parts, c->valuestring);
        if (ok) ok = cJSON_InsertItemInArray(parts, 0, cJSON_DetachItemFromArray(flag, 0));
        if (parts != c) cJSON_Delete(c);
        cJSON_Delete(flag);
        c = parts;
        if (!ok) {
            cJSON_Delete(c);
            return no_memory(e);
        }
    }
    cJSON *m = add_message(msgs, "tool");
    if (!m || !cJSON_AddStringToObject(m, "tool_call_id", id->valuestring)) {
        cJSON_Delete(c);
        return no_memory(e);
    }
    cJSON_AddItemToObject(m, "content", c);
    return 0;
}

/* One message of the conversation: a user turn's tool_result blocks become tool messages
 * (first, as chat templates expect them right after the calls), its text one user message; an
 * assistant turn's text, thinking and tool_use blocks one assistant message. */
static int add_turn(cJSON *msgs, const cJSON *it, const char *param, api_error *e)
{
    const cJSON *role = json_field(it, "role"), *content = json_field(it, "content");
    if (!cJSON_IsObject(it) || !cJSON_IsString(role))
        return bad(e, param, "a message needs a string 'role' and a 'content'");
    bool user = !strcmp(role->valuestring, "user");
    if (!user && strcmp(role->valuestring, "assistant"))
        return bad(e, param, "'role' must be 'user' or 'assistant' (the system prompt is the top-level 'system')");
    if (cJSON_IsString(content)) {
        cJSON *m = add_message(msgs, role->valuestring);
        return m && cJSON_AddStringToObject(m, "content", content->valuestring) ? 0 : no_memory(e);
    }
    if (!cJSON_IsArray(content)) return bad(e, param, "'content' must be a string or an array of content blocks");
    cJSON *text = cJSON_CreateArray(), *calls = cJSON_CreateArray();
    char *thinking = NULL;
    int rc = text && calls ? 0 : no_memory(e);
    const cJSON *b;
    cJSON_ArrayForEach(b, content) {
        if (rc) break;
        const cJSON *type = json_field(b, "type"), *s = json_field(b, "text");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(t, "text")) {
            rc = refuse_citations(b, param, e) ? -1
                 : !cJSON_IsString(s)          ? bad(e, param, "a text block needs a string 'text'")
                 : add_text_part(text, s->valuestring) ? 0
                                                       : no_memory(e);
        } else if (!user && !strcmp(t, "tool_use")) {
            rc = add_tool_use(calls, b, param, e);
        } else if (user && !strcmp(t, "tool_result")) {
            rc = add_tool_result(msgs, b, param, e);
        } else if (!user && !strcmp(t, "thinking")) { /* sent back: the template may show or drop it */
            const cJSON *th = json_field(b, "thinking");
            if (!cJSON_IsString(th)) rc = bad(e, param, "a thinking block needs a string 'thinking'");
            else if (!thinking && !(thinking = strdup(th->valuestring))) rc = no_memory(e);
        } else if (!user && !strcmp(t, "redacted_thinking")) {
            continue; /* encrypted for another server: nothing here can read it */
        } else {
            rc = t[0] ? refuse_block(t, param, e) : bad(e, param, "a content block needs a string 'type'");
        }
    }
    /* an assistant turn is a turn whatever it held (redacted_thinking only: an empty one); a
     * user turn of tool results only is those tool messages */
    cJSON *m = NULL;
    bool any = cJSON_GetArraySize(text) || cJSON_GetArraySize(calls) || thinking || !user;
    if (rc == 0 && (any || !cJSON_GetArraySize(content)) && !(m = add_message(msgs, role->valuestring))) rc = no_memory(e);
    if (rc == 0 && m) {
        if (cJSON_GetArraySize(text) || !cJSON_GetArraySize(calls)) cJSON_AddItemToObject(m, "content", text), text = NULL;
        else cJSON_AddNullToObject(m, "content");
        if (cJSON_GetArraySize(calls)) cJSON_AddItemToObject(m, "tool_calls", calls), calls = NULL;
        if (thinking && !cJSON_AddStringToObject(m, "reasoning_content", thinking)) rc = no_memory(e);
    }
    cJSON_Delete(text);
    cJSON_Delete(calls);
    free(thinking);
    return rc;
}

static int translate_messages(const cJSON *in, cJSON *out, api_error *e)
{
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    if (!msgs) return no_memory(e);
    const cJSON *sys = json_field(in, "system");
    if (sys) {
        cJSON *c = text_content(sys, "system", e), *m = c ? add_message(msgs, "system") : NULL;
        if (!c) return -1;
        if (!m) {
            cJSON_Delete(c);
            return no_memory(e);
        }
        cJSON_AddItemToObject(m, "content", c);
    }
    const cJSON *list = json_field(in, "messages");
    if (!list) {
        api_error_set(e, 400, "invalid_request_error", "messages", "missing_required_parameter",
                      "messages: Field required");
        return -1;
    }
    if (!cJSON_IsArray(list)) return bad(e, "messages", "expected an array of messages");
    int n = cJSON_GetArraySize(list);
    if (n > API_MAX_ITEMS / 2) return api_error_too_long(e, "messages", n, API_MAX_ITEMS / 2);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        char param[32];
        snprintf(param, sizeof param, "messages.%d", i++);
        if (add_turn(msgs, it, param, e)) return -1;
    }
    return 0;
}

/* input_schema tools -> chat function tools; Anthropic's server tools (web_search_*, bash_*,
 * text_editor_*, ...) carry a versioned type and need what this server does not have. */
static int translate_tools(const cJSON *in, cJSON *out, api_error *e)
{
    const cJSON *tools = json_field(in, "tools");
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return bad(e, "tools", "expected an array");
    cJSON *ct = cJSON_AddArrayToObject(out, "tools");
    if (!ct) return no_memory(e);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char param[32];
        snprintf(param, sizeof param, "tools.%d", i++);
        const cJSON *type = json_field(t, "type"), *name = json_field(t, "name"), *schema = json_field(t, "input_schema");
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "custom"))) {
            api_error_set(e, 400, "invalid_request_error", param, "unsupported_parameter",
                          "%s: tools of type '%.40s' are not supported: this server runs client tools (name, "
                          "description, input_schema) only.", param, cJSON_IsString(type) ? type->valuestring : "?");
            return -1;
        }
        if (!cJSON_IsString(name)) return bad(e, param, "a tool needs a string 'name'");
        if (!cJSON_IsObject(schema)) return bad(e, param, "a tool needs an object 'input_schema'");
        cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        if (!c || !fn || !cJSON_AddStringToObject(c, "type", "function") || !cJSON_AddItemToArray(ct, c)) {
            cJSON_Delete(c);
            cJSON_Delete(fn);
            return no_memory(e);
        }
        cJSON_AddItemToObject(c, "function", fn);
        const cJSON *desc = json_field(t, "description");
        if (!cJSON_AddStringToObject(fn, "name", name->valuestring) ||
            (desc && !cJSON_AddItemToObject(fn, "description", cJSON_Duplicate(desc, true))) ||
            !cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, true)))
            return no_memory(e);
    }
    return 0;
}

/* auto / any / tool / none -> auto / required / a named function / none;
 * disable_parallel_tool_use -> parallel_tool_calls false. */
static int translate_tool_choice(const cJSON *in, cJSON *out, api_error *e)
{
    const cJSON *tc = json_field(in, "tool_choice");
    if (!tc) return 0;
    const cJSON *type = json_field(tc, "type"), *name = json_field(tc, "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type))
        return bad(e, "tool_choice", "expected an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const char *t = type->valuestring;
    cJSON *choice = NULL;
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        choice = cJSON_CreateString(t);
    } else if (!strcmp(t, "any")) {
        choice = cJSON_CreateString("required");
    } else if (!strcmp(t, "tool")) {
        if (!cJSON_IsString(name)) return bad(e, "tool_choice.name", "a tool_choice of type 'tool' needs a string 'name'");
        cJSON *fn = cJSON_CreateObject();
        choice = cJSON_CreateObject();
        if (!fn || !choice || !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
            !cJSON_AddStringToObject(choice, "type", "function")) {
            cJSON_Delete(fn);
            cJSON_Delete(choice);
            return no_memory(e);
        }
        cJSON_AddItemToObject(choice, "function", fn);
    } else {
        return bad(e, "tool_choice.type", "expected 'auto', 'any', 'tool' or 'none'");
    }
    if (!choice || !cJSON_AddItemToObject(out, "tool_choice", choice)) {
        cJSON_Delete(choice);
        return no_memory(e);
    }
    if (cJSON_IsTrue(json_field(tc, "disable_parallel_tool_use")) && !cJSON_AddFalseToObject(out, "parallel_tool_calls"))
        return no_memory(e);
    return 0;
}

/* thinking {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}: the template's
 * enable_thinking switch (Qwen3 and the templates that copied it; a template without one
 * ignores it).  No thinking is "disabled", as on Anthropic's API (a client that did not ask
 * gets no thinking blocks), unless the body sets chat_template_kwargs.enable_thinking itself.
 * The budget cannot be enforced apart from max_tokens, which bounds it. */
static int translate_thinking(const cJSON *in, cJSON *out, api_error *e)
{
    const cJSON *th = json_field(in, "thinking");
    cJSON *kw = cJSON_GetObjectItemCaseSensitive(out, "chat_template_kwargs");
    if (!th && cJSON_IsObject(kw) && cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking")) return 0;
    const cJSON *type = json_field(th, "type");
    if (th && (!cJSON_IsObject(th) || !cJSON_IsString(type) ||
               (strcmp(type->valuestring, "enabled") && strcmp(type->valuestring, "disabled"))))
        return bad(e, "thinking", "expected {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
    bool on = th && !strcmp(type->valuestring, "enabled");
    const cJSON *budget = json_field(th, "budget_tokens");
    if (on && (!cJSON_IsNumber(budget) || !(budget->valuedouble >= 1 && budget->valuedouble <= INT_MAX) ||
               budget->valuedouble != (double)(int)budget->valuedouble))
        return bad(e, "thinking.budget_tokens", "Field required (an integer >= 1)");
    if (!kw && !(kw = cJSON_AddObjectToObject(out, "chat_template_kwargs"))) return no_memory(e);
    if (!cJSON_IsObject(kw)) return 0; /* the chat parse names the bad chat_template_kwargs */
    cJSON_DeleteItemFromObjectCaseSensitive(kw, "enable_thinking");
    return cJSON_AddBoolToObject(kw, "enable_thinking", on) ? 0 : no_memory(e);
}

/* Parameters that ask for what this server does not do, which ignoring would change.  count:
 * a count_tokens body, which has no max_tokens. */
static int refuse_unsupported(const cJSON *in, bool count, api_error *e)
{
    static const char *const params[] = {"mcp_servers", "container", "context_management"};
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++)
        if (json_field(in, params[i])) {
            api_error_set(e, 400, "invalid_request_error", params[i], "unsupported_parameter",
                          "%s: not supported by this server.", params[i]);
            return -1;
        }
    const cJSON *mt = json_field(in, "max_tokens");
    if (!mt && !count) {
        api_error_set(e, 400, "invalid_request_error", "max_tokens", "missing_required_parameter",
                      "max_tokens: Field required");
        return -1;
    }
    const cJSON *md = json_field(in, "metadata");
    if (md && !cJSON_IsObject(md)) return bad(e, "metadata", "expected an object");
    return 0;
}

/* Fields that mean the same in a chat request (with inferd's sampling and template
 * extensions, which the chat endpoint takes too); their values are checked there.  top_k and
 * top_p of -1 are "not set" (LangChain's ChatAnthropic sends both in every request). */
static int copy_plain(const cJSON *in, cJSON *out, api_error *e)
{
    static const char *const same[] = {"model", "temperature", "top_p", "top_k", "stream", "seed", "min_p",
                                       "repeat_penalty", "presence_penalty", "frequency_penalty", "ignore_eos",
                                       "speculative", "chat_template_kwargs", "grammar"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        const cJSON *v = json_field(in, same[k]);
        bool unset = !strncmp(same[k], "top_", 4) && cJSON_IsNumber(v) && v->valuedouble == -1;
        if (v && !unset && !cJSON_AddItemToObject(out, same[k], cJSON_Duplicate(v, true))) return no_memory(e);
    }
    const cJSON *mt = json_field(in, "max_tokens"), *stop = json_field(in, "stop_sequences");
    if (mt && !cJSON_AddItemToObject(out, "max_completion_tokens", cJSON_Duplicate(mt, true))) return no_memory(e);
    if (stop && !cJSON_IsArray(stop)) return bad(e, "stop_sequences", "expected an array of strings");
    if (stop && cJSON_GetArraySize(stop) && !cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(stop, true)))
        return no_memory(e);
    return 0;
}

static int translate(const char *body, size_t len, bool count, char **chat_body, api_error *e)
{
    *chat_body = NULL;
    cJSON *in = json_parse_body(body, len, e);
    if (!in) return -1;
    cJSON *out = cJSON_CreateObject();
    int rc = out ? refuse_unsupported(in, count, e) : no_memory(e);
    if (rc == 0) rc = copy_plain(in, out, e);
    if (rc == 0) rc = translate_messages(in, out, e);
    if (rc == 0) rc = translate_tools(in, out, e);
    if (rc == 0) rc = translate_tool_choice(in, out, e);
    if (rc == 0) rc = translate_thinking(in, out, e);
    if (rc == 0 && !(*chat_body = cJSON_PrintUnformatted(out))) rc = no_memory(e);
    cJSON_Delete(in);
    cJSON_Delete(out);
    return rc;
}

int api_messages_translate(const char *body, size_t len, char **chat_body, api_error *e)
{
    return translate(body, len, false, chat_body, e);
}

int api_messages_translate_count(const char *body, size_t len, char **chat_body, api_error *e)
{
    return translate(body, len, true, chat_body, e);
}

void api_messages_rename_error(api_error *e)
{
    static const char *const pairs[][2] = {
        {"max_completion_tokens", "max_tokens"}, {"stop", "stop_sequences"},
        {"tool_choice.function", "tool_choice"}, {"chat_template_kwargs.enable_thinking", "thinking"},
    };
    /* a chat message's index is not the client's (the system prompt is chat message 0, each
     * tool_result a message of its own): the list is named, not a wrong item */
    if (!strncmp(e->param, "messages[", 9)) {
        api_error_rename(e, e->param, "messages");
        return;
    }
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (api_error_rename(e, pairs[i][0], pairs[i][1])) return;
    const char *f = strncmp(e->param, "tools[", 6) ? NULL : strstr(e->param, "].function.parameters");
    if (f) { /* tools[i].function.parameters -> tools[i].input_schema */
        char from[sizeof e->param], to[sizeof e->param];
        snprintf(from, sizeof from, "%.*s", (int)(f + strlen("].function.parameters") - e->param), e->param);
        snprintf(to, sizeof to, "%.*s].input_schema", (int)(f - e->param), e->param);
        api_error_rename(e, from, to);
    }
}

/* ---- replies ------------------------------------------------------------------------------ */

char *api_messages_error_json(const api_error *e)
{
    const char *type = e->status == 401   ? "authentication_error"
                       : e->status == 403 ? "permission_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status == 413 ? "request_too_large"
                       : e->status == 429 ? "rate_limit_error"
                       : e->status == 503 ? "overloaded_error"
                       : e->status >= 500 ? "api_error"
                                          : "invalid_request_error";
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "error");
    cJSON *err = cJSON_AddObjectToObject(o, "error");
    char *msg = api_utf8_sanitize(e->message, strlen(e->message), NULL);
    cJSON_AddStringToObject(err, "type", type);
    cJSON_AddStringToObject(err, "message", msg ? msg : "out of memory");
    free(msg);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

const char *api_messages_stop_reason(const char *finish_reason, const char *stop_sequence)
{
    if (!finish_reason) return NULL;
    if (stop_sequence && !strcmp(finish_reason, "stop")) return "stop_sequence";
    if (!strcmp(finish_reason, "length")) return "max_tokens";
    if (!strcmp(finish_reason, "tool_calls")) return "tool_use";
    return "end_turn";
}

static cJSON *clean_string(const char *s, size_t len)
{
    char *clean = api_utf8_sanitize(s ? s : "", s ? len : 0, NULL);
    cJSON *v = clean ? cJSON_CreateString(clean) : NULL;
    free(clean);
    return v;
}

/* A text or thinking block with its text. */
static cJSON *text_block(api_msg_block kind, const char *s, size_t len)
{
    cJSON *b = cJSON_CreateObject();
    const char *key = kind == MSG_BLOCK_THINKING ? "thinking" : "text";
    cJSON_AddStringToObject(b, "type", key);
    cJSON_AddItemToObject(b, key, clean_string(s, len));
    if (kind == MSG_BLOCK_THINKING) cJSON_AddStringToObject(b, "signature", ""); /* nothing to sign */
    return b;
}

/* "toolu_" and the call's own id without its "call_" */
static cJSON *tool_use_block(const chat_tool_call *c, bool with_input)
{
    cJSON *b = cJSON_CreateObject();
    char id[80];
    const char *cid = c->id ? c->id : "0";
    snprintf(id, sizeof id, "toolu_%.64s", strncmp(cid, "call_", 5) ? cid : cid + 5);
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddItemToObject(b, "id", clean_string(id, strlen(id)));
    cJSON_AddItemToObject(b, "name", clean_string(c->name, c->name ? strlen(c->name) : 0));
    cJSON *input = with_input && c->arguments ? cJSON_Parse(c->arguments) : NULL;
    if (!cJSON_IsObject(input)) { /* chat_parse passes only objects; the stream's start is empty */
        cJSON_Delete(input);
        input = cJSON_CreateObject();
    }
    cJSON_AddItemToObject(b, "input", input);
    return b;
}

/* usage: input_tokens are those not read from the prefix cache (Anthropic counts cache reads
 * apart). */
static cJSON *usage_json(const api_usage *u)
{
    cJSON *o = cJSON_CreateObject();
    int in = u ? u->prompt_tokens - u->cached_tokens : 0;
    cJSON_AddNumberToObject(o, "input_tokens", in > 0 ? in : 0);
    cJSON_AddNumberToObject(o, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(o, "cache_read_input_tokens", u ? u->cached_tokens : 0);
    cJSON_AddNumberToObject(o, "output_tokens", u ? u->completion_tokens : 0);
    return o;
}

/* stop_sequence: the stop sequence that ended the reply, or null */
static void add_stop_sequence(cJSON *o, const char *stop_sequence)
{
    if (stop_sequence) cJSON_AddItemToObject(o, "stop_sequence", clean_string(stop_sequence, strlen(stop_sequence)));
    else cJSON_AddNullToObject(o, "stop_sequence");
}

/* The message object; content is taken over (NULL: []). */
static cJSON *message_object(const api_meta *m, cJSON *content, const char *stop_reason, const char *stop_sequence,
                             const api_usage *u)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", m->model);
    cJSON_AddItemToObject(o, "content", content ? content : cJSON_CreateArray());
    if (stop_reason) cJSON_AddStringToObject(o, "stop_reason", stop_reason);
    else cJSON_AddNullToObject(o, "stop_reason");
    add_stop_sequence(o, stop_sequence);
    cJSON_AddItemToObject(o, "usage", usage_json(u));
    return o;
}

char *api_messages_json(const api_meta *m, const api_msg_out *o, const api_usage *u)
{
    cJSON *content = cJSON_CreateArray();
    if (o->thinking_len) cJSON_AddItemToArray(content, text_block(MSG_BLOCK_THINKING, o->thinking, o->thinking_len));
    if (o->text_len || (!o->n_calls && !o->thinking_len))
        cJSON_AddItemToArray(content, text_block(MSG_BLOCK_TEXT, o->text, o->text_len));
    for (int i = 0; i < o->n_calls; i++) cJSON_AddItemToArray(content, tool_use_block(&o->calls[i], true));
    cJSON *root = message_object(m, content, api_messages_stop_reason(o->finish_reason, o->stop_sequence),
                                 o->stop_sequence, u);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- streams ------------------------------------------------------------------------------ */

/* "event: TYPE\ndata: {"type":"TYPE",...}\n\n", the type first as Anthropic writes it (type is
 * one of this file's names: nothing to escape); ev is consumed. */
static void emit(api_msg_stream *s, const char *type, cJSON *ev)
{
    char *json = ev ? cJSON_PrintUnformatted(ev) : NULL;
    cJSON_Delete(ev);
    if (!json) {
        s->failed = s->out->failed = true;
        return;
    }
    bytebuf_printf(s->out, "event: %s\ndata: {\"type\":\"%s\"%s%s\n\n", type, type, json[1] == '}' ? "" : ",", json + 1);
    free(json);
}

/* A new event about block index. */
static cJSON *at(int index)
{
    cJSON *ev = cJSON_CreateObject();
    if (ev) cJSON_AddNumberToObject(ev, "index", index);
    return ev;
}

void api_msg_stream_begin(api_msg_stream *s, const api_meta *m, bytebuf *out, const api_usage *u)
{
    *s = (api_msg_stream){.m = m, .out = out};
    cJSON *ev = cJSON_CreateObject();
    if (ev) cJSON_AddItemToObject(ev, "message", message_object(m, NULL, NULL, NULL, u));
    emit(s, "message_start", ev);
    emit(s, "ping", cJSON_CreateObject());
}

static void close_block(api_msg_stream *s)
{
    if (s->open == MSG_BLOCK_NONE) return;
    emit(s, "content_block_stop", at(s->n_blocks - 1));
    s->open = MSG_BLOCK_NONE;
}

/* content_block_start of a block (taken over) at the next index. */
static void start_block(api_msg_stream *s, cJSON *block)
{
    close_block(s);
    cJSON *ev = at(s->n_blocks++);
    if (ev) cJSON_AddItemToObject(ev, "content_block", block);
    else cJSON_Delete(block);
    emit(s, "content_block_start", ev);
}

static void text_delta(api_msg_stream *s, api_msg_block kind, const char *text, size_t len)
{
    if (s->failed || len == 0) return;
    if (s->open != kind) {
        start_block(s, text_block(kind, "", 0));
        s->open = kind;
    }
    bool thinking = kind == MSG_BLOCK_THINKING;
    cJSON *ev = at(s->n_blocks - 1), *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "type", thinking ? "thinking_delta" : "text_delta");
    cJSON_AddItemToObject(d, thinking ? "thinking" : "text", clean_string(text, len));
    if (ev) cJSON_AddItemToObject(ev, "delta", d);
    else cJSON_Delete(d);
    emit(s, "content_block_delta", ev);
}

void api_msg_stream_text(api_msg_stream *s, const char *text, size_t len) { text_delta(s, MSG_BLOCK_TEXT, text, len); }
void api_msg_stream_thinking(api_msg_stream *s, const char *text, size_t len)
{
    text_delta(s, MSG_BLOCK_THINKING, text, len);
}

void api_msg_stream_call(api_msg_stream *s, const chat_tool_call *c)
{
    if (s->failed) return;
    if (c->id) {
        start_block(s, tool_use_block(c, false));
        s->open = MSG_BLOCK_TOOL_USE;
    }
    if (s->open != MSG_BLOCK_TOOL_USE) return; /* a piece of no open call: nothing to add it to */
    if (c->arguments && c->arguments[0]) {
        cJSON *ev = at(s->n_blocks - 1), *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "input_json_delta");
        cJSON_AddItemToObject(d, "partial_json", clean_string(c->arguments, strlen(c->arguments)));
        if (ev) cJSON_AddItemToObject(ev, "delta", d);
        else cJSON_Delete(d);
        emit(s, "content_block_delta", ev);
    }
    if (c->last) close_block(s);
}

void api_msg_stream_end(api_msg_stream *s, const char *finish_reason, const char *stop_sequence, const api_usage *u,
                        const api_error *err)
{
    if (s->failed) return;
    if (err) { /* Anthropic's mid-stream error: an error event, no message_stop */
        char *json = api_messages_error_json(err);
        if (json) bytebuf_printf(s->out, "event: error\ndata: %s\n\n", json);
        else s->failed = s->out->failed = true;
        free(json);
        return;
    }
    if (s->n_blocks == 0) { /* a reply of nothing is one empty text block */
        start_block(s, text_block(MSG_BLOCK_TEXT, "", 0));
        s->open = MSG_BLOCK_TEXT;
    }
    close_block(s);
    cJSON *ev = cJSON_CreateObject(), *d = cJSON_CreateObject();
    const char *reason = api_messages_stop_reason(finish_reason ? finish_reason : "stop", stop_sequence);
    cJSON_AddStringToObject(d, "stop_reason", reason);
    add_stop_sequence(d, stop_sequence);
    if (ev) cJSON_AddItemToObject(ev, "delta", d);
    else cJSON_Delete(d);
    if (ev) cJSON_AddItemToObject(ev, "usage", usage_json(u));
    emit(s, "message_delta", ev);
    emit(s, "message_stop", cJSON_CreateObject());
}
