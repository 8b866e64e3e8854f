/* api_request.c - see api_request.h.  Each field has one small reader that either stores a
 * valid value or writes an error naming the field; the request parsers are lists of those. */
#include "api_request.h"

#include "api_constraint.h"
#include "json_strict.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

static const char *json_type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

static int type_error(api_error *e, const char *param, const char *expected, const cJSON *v)
{
    api_error_set(e, 400, INVALID, param, "invalid_type",
                  "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
                  json_type_name(v));
    return -1;
}

static int read_bool(const cJSON *obj, const char *name, bool *out, api_error *e)
{
    const cJSON *v = json_field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return type_error(e, name, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A number in [lo, hi] (lo excluded when lo_open); integral when integer. */
typedef struct num_spec {
    const char *name;
    double lo, hi;
    bool lo_open, integer;
} num_spec;

static int read_num(const cJSON *obj, num_spec s, double *out, bool *present, api_error *e)
{
    const cJSON *v = json_field(obj, s.name);
    if (present) *present = v != NULL;
    if (!v) return 0;
    if (!cJSON_IsNumber(v))
        return type_error(e, s.name, s.integer ? "an integer" : "a number", v);
    double x = v->valuedouble;
    if (s.integer && (!isfinite(x) || x != floor(x)))
        return type_error(e, s.name, "an integer", v);
    if (!(s.lo_open ? x > s.lo : x >= s.lo) || !(x <= s.hi)) {
        api_error_set(e, 400, INVALID, s.name, "invalid_value",
                      "Invalid value for '%s': %g is out of range; expected a value %s %g and <= %g.",
                      s.name, x, s.lo_open ? ">" : ">=", s.lo, s.hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int read_float(const cJSON *obj, num_spec s, float *out, api_error *e)
{
    double x;
    bool present;
    if (read_num(obj, s, &x, &present, e) != 0) return -1;
    if (present) *out = (float)x;
    return 0;
}

static int read_int(const cJSON *obj, num_spec s, int *out, api_error *e)
{
    double x;
    bool present;
    s.integer = true;
    if (read_num(obj, s, &x, &present, e) != 0) return -1;
    if (present) *out = (int)x;
    return 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static int oom(api_error *e)
{
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory while parsing the request");
    return -1;
}

static int read_stop(const cJSON *obj, api_request *r, api_error *e)
{
    const cJSON *v = json_field(obj, "stop");
    if (!v) return 0;
    const cJSON *one[1] = {v};
    int n = 1;
    if (cJSON_IsArray(v)) {
        n = cJSON_GetArraySize(v);
        if (n > SCHED_MAX_STOP) {
            api_error_set(e, 400, INVALID, "stop", "invalid_value",
                          "Invalid 'stop': at most %d stop sequences are supported, got %d.",
                          SCHED_MAX_STOP, n);
            return -1;
        }
    } else if (!cJSON_IsString(v)) {
        return type_error(e, "stop", "a string or an array of strings", v);
    }
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, i) : one[0];
        if (!cJSON_IsString(s)) return type_error(e, "stop", "a string or an array of strings", s);
        size_t len = strlen(s->valuestring);
        if (len > API_MAX_STOP_LEN) {
            api_error_set(e, 400, INVALID, "stop", "invalid_value",
                          "Invalid 'stop': a stop sequence may be at most %d bytes.", API_MAX_STOP_LEN);
            return -1;
        }
        if (len == 0) continue; /* an empty stop string would end every completion at once */
        if (!(r->stop[r->n_stop] = dup_n(s->valuestring, len))) return oom(e);
        r->n_stop++;
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100]} */
static int read_logit_bias(const cJSON *obj, int n_vocab, api_request *r, api_error *e)
{
    const cJSON *v = json_field(obj, "logit_bias");
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return type_error(e, "logit_bias", "an object", v);
    int n = cJSON_GetArraySize(v);
    if (n == 0) return 0;
    r->bias_ids = malloc((size_t)n * sizeof *r->bias_ids);
    r->bias_vals = malloc((size_t)n * sizeof *r->bias_vals);
    if (!r->bias_ids || !r->bias_vals) return oom(e);
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        char *end = NULL;
        long id = strtol(it->string, &end, 10);
        if (!it->string[0] || *end || id < 0 || id >= n_vocab) {
            api_error_set(e, 400, INVALID, "logit_bias", "invalid_value",
                          "Invalid key in 'logit_bias': '%.40s' is not a token id in [0, %d).",
                          it->string, n_vocab);
            return -1;
        }
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100)) {
            api_error_set(e, 400, INVALID, "logit_bias", "invalid_value",
                          "Invalid value in 'logit_bias' for token %ld: expected a number in [-100, 100].",
                          id);
            return -1;
        }
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_vals[r->n_bias] = (float)it->valuedouble;
        r->n_bias++;
    }
    return 0;
}

/* Fields shared by both endpoints. */
static int read_common(const cJSON *obj, int n_vocab, api_request *r, api_error *e)
{
    sampling_params *sp = &r->sp;
    sampling_params_default(sp);
    sp->temperature = 1.0f; /* OpenAI's default; 0 means greedy */
    sp->n_top_logprobs = -1;
    r->n = 1;
    r->logprobs = -1;

    const cJSON *model = json_field(obj, "model");
    if (model && !cJSON_IsString(model)) return type_error(e, "model", "a string", model);
    const cJSON *user = json_field(obj, "user");
    if (user && !cJSON_IsString(user)) return type_error(e, "user", "a string", user);

    r->speculative = true; /* the server's --speculative decides; false opts this request out */
    if (read_bool(obj, "stream", &r->stream, e) || read_bool(obj, "ignore_eos", &r->ignore_eos, e) ||
        read_bool(obj, "speculative", &r->speculative, e))
        return -1;
    const cJSON *so = json_field(obj, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return type_error(e, "stream_options", "an object", so);
        const cJSON *iu = json_field(so, "include_usage");
        if (iu && !cJSON_IsBool(iu)) return type_error(e, "stream_options.include_usage", "a boolean", iu);
        r->include_usage = cJSON_IsTrue(iu);
    }
    if (read_int(obj, (num_spec){"n", 1, API_MAX_N, false, true}, &r->n, e) ||
        read_int(obj, (num_spec){"max_tokens", 1, 1 << 30, false, true}, &r->max_tokens, e) ||
        read_float(obj, (num_spec){"temperature", 0, 2, false, false}, &sp->temperature, e) ||
        read_float(obj, (num_spec){"top_p", 0, 1, true, false}, &sp->top_p, e) ||
        read_int(obj, (num_spec){"top_k", 0, 1 << 30, false, true}, &sp->top_k, e) ||
        read_float(obj, (num_spec){"min_p", 0, 1, false, false}, &sp->min_p, e) ||
        read_float(obj, (num_spec){"presence_penalty", -2, 2, false, false}, &sp->presence_penalty, e) ||
        read_float(obj, (num_spec){"frequency_penalty", -2, 2, false, false}, &sp->frequency_penalty, e) ||
        read_float(obj, (num_spec){"repeat_penalty", 0, 10, true, false}, &sp->repeat_penalty, e))
        return -1;
    double seed;
    if (read_num(obj, (num_spec){"seed", -9.2e18, 1.8e19, false, true}, &seed, &r->has_seed, e))
        return -1;
    if (r->has_seed) sp->seed = seed < 0 ? (uint64_t)(int64_t)seed : (uint64_t)seed;
    if (read_stop(obj, r, e) || read_logit_bias(obj, n_vocab, r, e)) return -1;
    sp->bias_ids = r->bias_ids;
    sp->bias_vals = r->bias_vals;
    sp->n_bias = r->n_bias;
    return 0;
}

/* A token array: every element an integer id of the vocabulary. */
static int read_ids(const cJSON *arr, int n_vocab, const char *param, api_prompt *p, api_error *e)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0) {
        api_error_set(e, 400, INVALID, param, "invalid_value", "Invalid '%s': it is empty.", param);
        return -1;
    }
    if (!(p->ids = malloc((size_t)n * sizeof *p->ids))) return oom(e);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        double x = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!cJSON_IsNumber(it) || x != floor(x) || x < 0 || x >= n_vocab) {
            api_error_set(e, 400, INVALID, param, "invalid_value",
                          "Invalid '%s': token %d is not an integer id in [0, %d).", param, p->n_ids,
                          n_vocab);
            return -1;
        }
        p->ids[p->n_ids++] = (int32_t)x;
    }
    return 0;
}

static int read_text_prompt(const cJSON *s, const char *param, api_prompt *p, api_error *e)
{
    size_t len = strlen(s->valuestring);
    if (len == 0) {
        api_error_set(e, 400, INVALID, param, "invalid_value", "Invalid '%s': it is empty.", param);
        return -1;
    }
    if (!(p->text = dup_n(s->valuestring, len))) return oom(e);
    p->text_len = len;
    return 0;
}

/* prompt (or input): "text" | ["text", ...] | [id, ...] | [[id, ...], ...] */
int api_request_read_prompts(const cJSON *obj, const char *field, int n_vocab, api_request *r, api_error *e)
{
    const cJSON *v = json_field(obj, field);
    if (!v) {
        api_error_set(e, 400, INVALID, field, "missing_required_parameter", "Missing required parameter: '%s'.", field);
        return -1;
    }
    const char *expect = "a string, an array of strings, an array of tokens or an array of token arrays";
    bool single = cJSON_IsString(v) || (cJSON_IsArray(v) && cJSON_IsNumber(cJSON_GetArrayItem(v, 0)));
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) return type_error(e, field, expect, v);
    int n = single ? 1 : cJSON_GetArraySize(v);
    if (n == 0) {
        api_error_set(e, 400, INVALID, field, "invalid_value", "Invalid '%s': it is empty.", field);
        return -1;
    }
    if ((long)n * r->n > API_MAX_CHOICES) {
        api_error_set(e, 400, INVALID, field, "invalid_value",
                      "Invalid '%s': %d items x n=%d exceeds %d per request.", field, n, r->n, API_MAX_CHOICES);
        return -1;
    }
    if (!(r->prompts = calloc((size_t)n, sizeof *r->prompts))) return oom(e);
    r->n_prompts = n;
    /* one walk down the list: indexing a cJSON array walks it from the start each time */
    const cJSON *it = single ? v : v->child;
    for (int i = 0; i < n; i++, it = it->next) {
        int rc;
        if (cJSON_IsString(it)) rc = read_text_prompt(it, field, &r->prompts[i], e);
        else if (cJSON_IsArray(it)) rc = read_ids(it, n_vocab, field, &r->prompts[i], e);
        else rc = type_error(e, field, expect, it);
        if (rc != 0) return -1;
    }
    return 0;
}

/* A message's content: a string, or an array of {"type":"text","text":...} parts (joined);
 * null or absent is NULL (an assistant turn that only calls tools). */
static int read_content(const cJSON *m, int i, char **out, api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    const cJSON *c = json_field(m, "content");
    *out = NULL;
    if (!c || cJSON_IsNull(c)) return 0;
    if (cJSON_IsString(c)) {
        *out = dup_n(c->valuestring, strlen(c->valuestring));
        return *out ? 0 : oom(e);
    }
    if (!cJSON_IsArray(c)) return type_error(e, param, "a string or an array of content parts", c);
    int n_parts = cJSON_GetArraySize(c);
    if (n_parts > API_MAX_ITEMS) return api_error_too_long(e, param, n_parts, API_MAX_ITEMS);
    size_t total = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = json_field(part, "type"), *text = json_field(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            api_error_set(e, 400, INVALID, param, "invalid_value",
                          "Invalid '%s': only content parts of type 'text' with a string 'text' are supported.",
                          param);
            return -1;
        }
        total += strlen(text->valuestring);
    }
    if (!(*out = malloc(total + 1))) return oom(e);
    size_t o = 0;
    cJSON_ArrayForEach(part, c)
    {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        memcpy(*out + o, t, strlen(t));
        o += strlen(t);
    }
    (*out)[o] = 0;
    return 0;
}

static const char *known_role(const char *role)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (int i = 0; i < 4; i++)
        if (strcmp(role, roles[i]) == 0) return roles[i];
    if (strcmp(role, "developer") == 0) return roles[0]; /* OpenAI's newer name for system */
    return NULL;
}

/* An assistant's tool_calls, checked and copied into the template's message with each
 * function.arguments parsed from its JSON string into the object HF templates expect. */
static int read_tool_calls(const cJSON *m, int i, cJSON *tm, api_error *e)
{
    const cJSON *tc = json_field(m, "tool_calls");
    char param[96];
    snprintf(param, sizeof param, "messages[%d].tool_calls", i);
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (!cJSON_IsArray(tc)) return type_error(e, param, "an array", tc);
    int n_calls = cJSON_GetArraySize(tc);
    if (n_calls > API_MAX_ITEMS) return api_error_too_long(e, param, n_calls, API_MAX_ITEMS);
    cJSON *out = cJSON_AddArrayToObject(tm, "tool_calls");
    if (!out) return oom(e);
    int j = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, tc)
    {
        snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, j);
        const cJSON *fn = json_field(call, "function");
        const cJSON *name = fn ? json_field(fn, "name") : NULL, *args = fn ? json_field(fn, "arguments") : NULL;
        if (!cJSON_IsObject(call) || !cJSON_IsObject(fn) || !cJSON_IsString(name)) {
            api_error_set(e, 400, INVALID, param, "invalid_value",
                          "Invalid '%s': expected {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                          "\"arguments\"}}.", param);
            return -1;
        }
        cJSON *c = cJSON_Duplicate(call, 1);
        if (!c) return oom(e);
        cJSON_AddItemToArray(out, c);
        if (cJSON_IsString(args)) {
            cJSON *parsed = cJSON_Parse(args->valuestring);
            if (!parsed) {
                api_error_set(e, 400, INVALID, param, "invalid_value",
                              "Invalid '%s.function.arguments': not a JSON text (OpenAI sends the arguments "
                              "as a JSON-encoded string).", param);
                return -1;
            }
            cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "function"), "arguments", parsed);
        } else if (args && !cJSON_IsObject(args)) {
            return type_error(e, param, "arguments as a JSON string or an object", args);
        }
        j++;
    }
    return 0;
}

/* An assistant turn's reasoning_content reaches the template as `thinking` too, the name
 * gpt-oss's (Harmony) template reads it by, unless the turn has its own -- or it calls tools
 * and has content as well: that template takes one text as the analysis before a call and
 * refuses both, so the content is what it gets (other templates read neither name).  0, or
 * -1 when memory ran out. */
static int thinking_too(cJSON *tm, const char *content)
{
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(tm, "reasoning_content");
    if (!cJSON_IsString(rc) || !rc->valuestring[0] || cJSON_GetObjectItemCaseSensitive(tm, "thinking")) return 0;
    if (cJSON_GetObjectItemCaseSensitive(tm, "tool_calls") && content && content[0]) return 0;
    return cJSON_AddStringToObject(tm, "thinking", rc->valuestring) ? 0 : -1;
}

static int read_messages(const cJSON *obj, api_request *r, cJSON *ctx, api_error *e)
{
    const cJSON *v = json_field(obj, "messages");
    if (!v) {
        api_error_set(e, 400, INVALID, "messages", "missing_required_parameter",
                      "Missing required parameter: 'messages'.");
        return -1;
    }
    if (!cJSON_IsArray(v)) return type_error(e, "messages", "an array", v);
    int n = cJSON_GetArraySize(v);
    if (n == 0) {
        api_error_set(e, 400, INVALID, "messages", "invalid_value",
                      "Invalid 'messages': empty array. Expected an array with minimum length 1.");
        return -1;
    }
    if (n > API_MAX_ITEMS) return api_error_too_long(e, "messages", n, API_MAX_ITEMS);
    if (!(r->msgs = calloc((size_t)n, sizeof *r->msgs))) return oom(e);
    cJSON *tmsgs = cJSON_AddArrayToObject(ctx, "messages");
    if (!tmsgs) return oom(e);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, v) { /* one walk: indexing a cJSON array walks it from the start */
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return type_error(e, param, "an object", m);
        const cJSON *role = json_field(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) {
            api_error_set(e, 400, INVALID, param, role ? "invalid_type" : "missing_required_parameter",
                          "Invalid '%s': expected one of 'system', 'developer', 'user', 'assistant', 'tool'.", param);
            return -1;
        }
        const char *known = known_role(role->valuestring);
        if (!known) {
            api_error_set(e, 400, INVALID, param, "invalid_value",
                          "Invalid '%s': '%.40s' is not supported; expected one of 'system', 'developer', "
                          "'user', 'assistant', 'tool'.", param, role->valuestring);
            return -1;
        }
        char *content = NULL;
        if (read_content(m, i, &content, e) != 0) return -1;
        bool assistant = strcmp(known, "assistant") == 0;
        /* Only an assistant turn may lack content (it calls tools); others read as empty, as
         * before templates saw them. */
        if (!content && !assistant && !(content = dup_n("", 0))) return oom(e);
        /* The template's copy keeps the message's other fields (name, tool_call_id,
         * reasoning_content, ...), with the content as text. */
        cJSON *tm = cJSON_Duplicate(m, 1);
        if (!tm) {
            free(content);
            return oom(e);
        }
        cJSON_AddItemToArray(tmsgs, tm);
        cJSON_ReplaceItemInObjectCaseSensitive(tm, "role", cJSON_CreateString(known));
        cJSON_DeleteItemFromObjectCaseSensitive(tm, "content");
        /* An assistant turn that only calls tools (content null, as the OpenAI SDKs send it)
         * reaches the template with content "", as llama.cpp passes it: templates test or
         * iterate the content ("'<think>' in content") and None raises there. */
        cJSON_AddItemToObject(tm, "content", cJSON_CreateString(content ? content : ""));
        cJSON_DeleteItemFromObjectCaseSensitive(tm, "tool_calls");
        if (assistant && read_tool_calls(m, i, tm, e) != 0) {
            free(content);
            return -1;
        }
        if (assistant && thinking_too(tm, content) != 0) {
            free(content);
            return oom(e);
        }
        /* The built-in templates know three roles: a tool result reads as a user turn. */
        r->msgs[r->n_msgs].role = strcmp(known, "tool") == 0 ? "user" : known;
        r->msgs[r->n_msgs].content = content ? content : dup_n("", 0);
        if (!r->msgs[r->n_msgs].content) return oom(e);
        r->n_msgs++;
        i++;
    }
    return 0;
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]. */
static int read_tools(const cJSON *obj, api_request *r, api_error *e)
{
    const cJSON *t = json_field(obj, "tools");
    r->parallel_tool_calls = true;
    if (read_bool(obj, "parallel_tool_calls", &r->parallel_tool_calls, e)) return -1;
    if (t && !cJSON_IsNull(t)) {
        if (!cJSON_IsArray(t)) return type_error(e, "tools", "an array", t);
        if (cJSON_GetArraySize(t) > API_MAX_TOOLS) {
            api_error_set(e, 400, INVALID, "tools", "array_above_max_length",
                          "Invalid 'tools': at most %d tools are supported.", API_MAX_TOOLS);
            return -1;
        }
        int i = 0;
        const cJSON *tool;
        cJSON_ArrayForEach(tool, t)
        {
            char param[64];
            snprintf(param, sizeof param, "tools[%d]", i++);
            const cJSON *type = json_field(tool, "type"), *fn = json_field(tool, "function");
            const cJSON *name = fn ? json_field(fn, "name") : NULL, *params = fn ? json_field(fn, "parameters") : NULL;
            if (!cJSON_IsObject(tool) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 ||
                !cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0] ||
                (params && !cJSON_IsObject(params))) {
                api_error_set(e, 400, INVALID, param, "invalid_value",
                              "Invalid '%s': expected {\"type\": \"function\", \"function\": {\"name\": a "
                              "non-empty string, \"description\"?, \"parameters\"?: a JSON Schema object}}.", param);
                return -1;
            }
        }
        if (i && !(r->tools_json = cJSON_PrintUnformatted(t))) return oom(e);
        if (i && !(r->tool_names = calloc((size_t)i, sizeof *r->tool_names))) return oom(e);
        cJSON_ArrayForEach(tool, t) {
            const char *name = json_field(json_field(tool, "function"), "name")->valuestring;
            if (!(r->tool_names[r->n_tools] = dup_n(name, strlen(name)))) return oom(e);
            r->n_tools++;
        }
    }
    const cJSON *tc = json_field(obj, "tool_choice");
    if (!tc || cJSON_IsNull(tc)) {
        r->tool_choice = API_TOOL_AUTO;
    } else if (cJSON_IsString(tc) && (strcmp(tc->valuestring, "auto") == 0 || strcmp(tc->valuestring, "none") == 0 ||
                                      strcmp(tc->valuestring, "required") == 0)) {
        r->tool_choice = tc->valuestring[0] == 'a' ? API_TOOL_AUTO : tc->valuestring[0] == 'n' ? API_TOOL_NONE : API_TOOL_REQUIRED;
    } else {
        const cJSON *fn = json_field(tc, "function"), *name = fn ? json_field(fn, "name") : NULL;
        if (!cJSON_IsObject(tc) || !cJSON_IsObject(fn) || !cJSON_IsString(name)) {
            api_error_set(e, 400, INVALID, "tool_choice", "invalid_value",
                          "Invalid 'tool_choice': expected \"none\", \"auto\", \"required\" or {\"type\": "
                          "\"function\", \"function\": {\"name\": ...}}.");
            return -1;
        }
        r->tool_choice = API_TOOL_NAMED;
        snprintf(r->tool_choice_name, sizeof r->tool_choice_name, "%s", name->valuestring);
        bool found = false;
        cJSON_ArrayForEach(tc, t) found = found || strcmp(json_field(json_field(tc, "function"), "name")->valuestring, name->valuestring) == 0;
        if (!found) {
            api_error_set(e, 400, INVALID, "tool_choice", "invalid_value",
                          "Invalid 'tool_choice': no function named '%.60s' in 'tools'.", name->valuestring);
            return -1;
        }
    }
    if ((r->tool_choice == API_TOOL_REQUIRED) && r->n_tools == 0) {
        api_error_set(e, 400, INVALID, "tool_choice", "invalid_value",
                      "Invalid 'tool_choice': \"required\" needs a non-empty 'tools'.");
        return -1;
    }
    return 0;
}

/* The variables of the model's template: messages, tools, chat_template_kwargs. */
static int read_template_context(const cJSON *obj, api_request *r, api_error *e)
{
    cJSON *ctx = cJSON_CreateObject();
    if (!ctx) return oom(e);
    int rc = read_messages(obj, r, ctx, e);
    if (rc == 0) rc = read_tools(obj, r, e);
    if (rc == 0 && r->tools_json && r->tool_choice != API_TOOL_NONE)
        cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(json_field(obj, "tools"), 1));
    const cJSON *kw = json_field(obj, "chat_template_kwargs");
    if (rc == 0 && kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw)) {
            rc = type_error(e, "chat_template_kwargs", "an object", kw);
        } else {
            const cJSON *it;
            cJSON_ArrayForEach(it, kw) if (!cJSON_GetObjectItemCaseSensitive(ctx, it->string))
                cJSON_AddItemToObject(ctx, it->string, cJSON_Duplicate(it, 1));
        }
    }
    /* reasoning_effort (OpenAI's "low" / "medium" / "high") is a template variable, unless
     * chat_template_kwargs sets one: gpt-oss's template writes it into the system message */
    const cJSON *effort = json_field(obj, "reasoning_effort");
    if (rc == 0 && cJSON_IsString(effort) && !cJSON_GetObjectItemCaseSensitive(ctx, "reasoning_effort") &&
        !cJSON_AddStringToObject(ctx, "reasoning_effort", effort->valuestring))
        rc = oom(e);
    if (rc == 0 && !(r->tmpl_ctx = cJSON_PrintUnformatted(ctx))) rc = oom(e);
    cJSON_Delete(ctx);
    return rc;
}

/* Parameters of OpenAI's API that inferd does not implement and that would change the result
 * if they were ignored: a 400 naming them, unless their value is the one that changes nothing.
 * (Hints and metadata -- store, metadata, service_tier, prediction, ... -- are
 * accepted and ignored, as is any field OpenAI's API does not have.) */
static int refuse_unsupported(const cJSON *obj, api_kind kind, int n, api_error *e)
{
    static const char text_only[] = "is not supported: this server produces text only.";
    if (kind == API_COMPLETIONS) {
        const cJSON *v = json_field(obj, "suffix");
        if (v && !cJSON_IsString(v)) return type_error(e, "suffix", "a string", v);
        if (v && *v->valuestring)
            return api_error_unsupported(e, "suffix", "(text after the insertion point) is not supported.");
        v = json_field(obj, "best_of");
        if (v && (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)))
            return type_error(e, "best_of", "an integer", v);
        if (v && v->valuedouble != n)
            return api_error_unsupported(e, "best_of", "is not supported (candidates are not generated server-side); "
                                                       "leave it out or equal to 'n'.");
        return 0;
    }
    if (json_field(obj, "functions"))
        return api_error_unsupported(e, "functions", "(the deprecated function-calling API) is not supported; use 'tools'.");
    if (json_field(obj, "function_call"))
        return api_error_unsupported(e, "function_call",
                                     "(the deprecated function-calling API) is not supported; use 'tool_choice'.");
    if (json_field(obj, "audio")) return api_error_unsupported(e, "audio", text_only);
    if (json_field(obj, "web_search_options")) return api_error_unsupported(e, "web_search_options", "is not supported.");
    const cJSON *m = json_field(obj, "modalities"), *x;
    if (m && !cJSON_IsArray(m)) return type_error(e, "modalities", "an array", m);
    cJSON_ArrayForEach(x, m) {
        if (!cJSON_IsString(x)) return type_error(e, "modalities", "an array of strings", m);
        if (strcmp(x->valuestring, "text"))
            return api_error_unsupported(e, "modalities", "other than [\"text\"] is not supported: this server "
                                                          "produces text only.");
    }
    return 0;
}

static int read_completions(const cJSON *obj, int n_vocab, api_request *r, api_error *e)
{
    if (read_bool(obj, "echo", &r->echo, e)) return -1;
    int lp = -1;
    if (read_int(obj, (num_spec){"logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, false, true}, &lp, e)) return -1;
    r->logprobs = lp;
    if (r->max_tokens == 0) r->max_tokens = 16; /* OpenAI's default for completions */
    return api_request_read_prompts(obj, "prompt", n_vocab, r, e);
}

static int read_chat(const cJSON *obj, api_request *r, api_error *e)
{
    if (read_int(obj, (num_spec){"max_completion_tokens", 1, 1 << 30, false, true}, &r->max_tokens, e))
        return -1;
    bool logprobs = false;
    int top = -1;
    if (read_bool(obj, "logprobs", &logprobs, e) ||
        read_int(obj, (num_spec){"top_logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, false, true}, &top, e))
        return -1;
    if (top >= 0 && !logprobs) {
        api_error_set(e, 400, INVALID, "top_logprobs", "invalid_value",
                      "Invalid 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used.");
        return -1;
    }
    if (logprobs) r->logprobs = top < 0 ? 0 : top;
    return read_template_context(obj, r, e);
}

int api_request_parse(api_kind kind, const char *body, size_t len, int n_vocab,
                      api_request *out, api_error *err)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    cJSON *obj = json_parse_body(body, len, err);
    if (!obj) return -1;
    int rc = read_common(obj, n_vocab, out, err);
    if (rc == 0) rc = refuse_unsupported(obj, kind, out->n, err);
    if (rc == 0) rc = kind == API_CHAT ? read_chat(obj, out, err) : read_completions(obj, n_vocab, out, err);
    if (rc == 0) rc = api_read_constraint(obj, &out->grammar, &out->format_schema, err);
    if (rc == 0) out->sp.n_top_logprobs = out->logprobs;
    cJSON_Delete(obj);
    if (rc != 0) api_request_free(out);
    return rc;
}

char *api_tmpl_ctx_describe_tools(const char *ctx_json)
{
    cJSON *ctx = cJSON_Parse(ctx_json), *t;
    if (!cJSON_IsObject(ctx)) {
        cJSON_Delete(ctx);
        return NULL;
    }
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(ctx, "tools")) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (cJSON_IsObject(fn) && !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "description"))) {
            cJSON_DeleteItemFromObjectCaseSensitive(fn, "description"); /* a null one too */
            cJSON_AddStringToObject(fn, "description", "");
        }
    }
    char *s = cJSON_PrintUnformatted(ctx);
    cJSON_Delete(ctx);
    return s;
}

void api_request_free(api_request *r)
{
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (int i = 0; i < r->n_msgs; i++) free((char *)r->msgs[i].content);
    free(r->msgs);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->tmpl_ctx);
    free(r->tools_json);
    for (int i = 0; i < r->n_tools; i++) free(r->tool_names[i]);
    free(r->tool_names);
    for (int i = 0; r->documents && i < r->n_prompts; i++) free(r->documents[i]);
    free(r->documents);
    grammar_unref(r->grammar);
    free(r->format_schema);
    api_kind kind = r->kind;
    memset(r, 0, sizeof *r);
    r->kind = kind;
}
