/* chat_parse.c - reasoning, content and tool calls out of a model's streamed reply (see
 * chat_parse.h).
 *
 * All text not yet released lives in one buffer; each feed appends to it and runs the state
 * machine until it cannot decide more.  States: START (maybe a <think> opening), REASON
 * (inside <think>), CONTENT, CALL (inside a family's tool-call markup).  Holding back works as
 * in sched/stopstr.c: the longest tail that is a proper prefix of a marker stays in the buffer.
 * Whitespace between content and calls is held too and dropped when a call follows, so that a
 * reply of calls alone has content null. */
#include "chat_parse.h"

#include "base/rng.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define LLAMA_TAG "<|python_tag|>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define MISTRAL_ARGS "[ARGS]"
#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"

typedef enum pstate { ST_START, ST_REASON, ST_CONTENT, ST_CALL } pstate;

struct chat_parser {
    chat_parse_opts o;
    pstate st;
    bytebuf buf;        /* text not yet released */
    bytebuf ws;         /* whitespace held between content and a possible call */
    bool content_begun; /* content (beyond whitespace) was released */
    bool skip_ws;       /* drop whitespace right after </think> */
    bool bare_json;     /* Llama 3: this call region began with a bare '{' */
    int n_calls;        /* released to the client */
    int n_seen;         /* recognised in the reply, dropped ones included (the markup's shape) */
    int n_dropped;
    uint64_t id_state;
};

static const char *const syntax_names[CHAT_SYNTAX_COUNT] = {"none", "hermes", "llama3", "mistral", "deepseek-v3"};

chat_syntax chat_syntax_detect(const char *src)
{
    if (!src) return CHAT_SYNTAX_NONE;
    if (strstr(src, HERMES_OPEN)) return CHAT_SYNTAX_HERMES;
    if (strstr(src, "tool▁calls▁begin")) return CHAT_SYNTAX_DEEPSEEK_V3;
    if (strstr(src, MISTRAL_OPEN)) return CHAT_SYNTAX_MISTRAL;
    if (strstr(src, "<|start_header_id|>")) return CHAT_SYNTAX_LLAMA3;
    return CHAT_SYNTAX_NONE;
}

const char *chat_syntax_name(chat_syntax s) { return (unsigned)s < CHAT_SYNTAX_COUNT ? syntax_names[s] : "unknown"; }

bool chat_template_thinks(const char *src) { return src && strstr(src, THINK_OPEN) != NULL; }

bool chat_forced_call_shape(chat_syntax s, chat_forced_call *out)
{
    switch (s) {
    case CHAT_SYNTAX_HERMES: *out = (chat_forced_call){HERMES_OPEN "\n", "\n" HERMES_CLOSE, "arguments", false}; return true;
    case CHAT_SYNTAX_LLAMA3: *out = (chat_forced_call){"", "", "parameters", false}; return true;
    case CHAT_SYNTAX_MISTRAL: *out = (chat_forced_call){MISTRAL_OPEN, "", "arguments", true}; return true;
    case CHAT_SYNTAX_DEEPSEEK_V3:
        /* DeepSeek writes the name in markup, not in JSON: prefix ends before the name. */
        *out = (chat_forced_call){DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP, "\n```" DS_CALL_END DS_CALLS_END,
                                  NULL, false};
        return true;
    default: return false;
    }
}

/* ---- deltas ------------------------------------------------------------------------------ */

void chat_delta_clear(chat_delta *d)
{
    bytebuf_clear(&d->content);
    bytebuf_clear(&d->reasoning);
    for (int i = 0; i < d->n_calls; i++) {
        free(d->calls[i].id);
        free(d->calls[i].name);
        free(d->calls[i].arguments);
    }
    d->n_calls = 0;
}

void chat_delta_free(chat_delta *d)
{
    chat_delta_clear(d);
    bytebuf_free(&d->content);
    bytebuf_free(&d->reasoning);
    free(d->calls);
    memset(d, 0, sizeof *d);
}

/* ---- parser ------------------------------------------------------------------------------ */

chat_parser *chat_parser_new(const chat_parse_opts *o)
{
    chat_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->o = *o;
    p->st = o->reasoning ? (o->in_reasoning ? ST_REASON : ST_START) : ST_CONTENT;
    p->id_state = o->id_seed;
    return p;
}

void chat_parser_free(chat_parser *p)
{
    if (!p) return;
    bytebuf_free(&p->buf);
    bytebuf_free(&p->ws);
    free(p);
}

int chat_parser_n_calls(const chat_parser *p) { return p->n_calls; }
int chat_parser_n_dropped(const chat_parser *p) { return p->n_dropped; }

static const char *bdata(const bytebuf *b) { return b->data ? b->data : ""; }

/* Longest tail of s[0..n) that is a proper prefix of marker m. */
static size_t tail_prefix(const char *s, size_t n, const char *m)
{
    size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, m, k) == 0) return k;
    return 0;
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Releases content text, holding whitespace that might precede a call. */
static void put_content(chat_parser *p, const char *s, size_t n, chat_delta *d)
{
    if (p->skip_ws) {
        while (n && is_space(*s)) s++, n--;
        if (!n) return;
        p->skip_ws = false;
    }
    if (!p->o.tools) {
        bytebuf_append(&d->content, s, n);
        if (n) p->content_begun = true;
        return;
    }
    size_t k = n;
    while (k && is_space(s[k - 1])) k--;
    if (k) { /* something visible: the held whitespace goes first */
        bytebuf_append(&d->content, bdata(&p->ws), p->ws.len);
        bytebuf_clear(&p->ws);
        bytebuf_append(&d->content, s, k);
        p->content_begun = true;
    }
    bytebuf_append(&p->ws, s + k, n - k);
}

static void next_id(chat_parser *p, char *id, size_t cap)
{
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    snprintf(id, cap, "call_");
    size_t o = 5;
    for (int i = 0; i < 24 && o + 1 < cap; i++) {
        id[o++] = al[rng_next(&p->id_state) % (sizeof al - 1)];
    }
    id[o] = 0;
}

static bool offered(const chat_parser *p, const char *name, size_t len)
{
    if (!p->o.names) return true;
    for (int i = 0; i < p->o.n_names; i++)
        if (strlen(p->o.names[i]) == len && memcmp(p->o.names[i], name, len) == 0) return true;
    return false;
}

/* The arguments as a client can use them: a JSON object (what a function's parameters are). */
static bool args_object(const char *args)
{
    cJSON *v = cJSON_ParseWithOpts(args, NULL, true); /* nothing may follow the object */
    bool ok = cJSON_IsObject(v);
    cJSON_Delete(v);
    return ok;
}

/* A recognised call goes to the client only when it can act on it: a function the request
 * offered (not a made-up one, not a name with markup in it), arguments that parse as a JSON
 * object, and only the first when parallel calls are off.  Anything else is dropped, markup
 * and all (it is no content either), and counted.  The id is always ours: a model-written
 * one could repeat an earlier call's or carry anything.  0, or -1 when memory ran out. */
static int add_call_as(chat_parser *p, chat_delta *d, const char *name, size_t name_len, const char *args,
                       bool partial)
{
    p->n_seen++;
    bytebuf_clear(&p->ws); /* whitespace between calls is markup, not content */
    if (!offered(p, name, name_len) || (!partial && !args_object(args)) ||
        (p->o.max_calls && p->n_calls >= p->o.max_calls)) {
        p->n_dropped++;
        return 0;
    }
    if (d->n_calls == d->cap_calls) {
        int cap = d->cap_calls ? d->cap_calls * 2 : 4;
        chat_tool_call *c = realloc(d->calls, (size_t)cap * sizeof *c);
        if (!c) return -1;
        d->calls = c;
        d->cap_calls = cap;
    }
    char id[40];
    next_id(p, id, sizeof id);
    chat_tool_call *c = &d->calls[d->n_calls];
    c->index = p->n_calls;
    c->id = strdup(id);
    c->name = strndup(name, name_len);
    c->arguments = strdup(args);
    if (!c->id || !c->name || !c->arguments) {
        free(c->id);
        free(c->name);
        free(c->arguments);
        return -1;
    }
    d->n_calls++;
    p->n_calls++;
    return 0;
}

static int add_call(chat_parser *p, chat_delta *d, const char *name, size_t name_len, const char *args)
{
    return add_call_as(p, d, name, name_len, args, false);
}

/* One call object {"name": ..., "arguments"|"parameters": ...}: 1 added, 0 not a call, -1 oom. */
static int call_from_json(chat_parser *p, chat_delta *d, const cJSON *o)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(o) || !cJSON_IsString(name) || !name->valuestring[0]) return 0;
    char *text = NULL;
    if (!args) text = strdup("{}");
    else if (cJSON_IsString(args)) text = strdup(args->valuestring); /* already JSON text */
    else text = cJSON_PrintUnformatted(args);
    if (!text) return -1;
    int rc = add_call(p, d, name->valuestring, strlen(name->valuestring), text);
    free(text);
    return rc < 0 ? -1 : 1;
}

/* End (exclusive) of the JSON value starting at s[i] ('{' or '['), 0 while incomplete. */
static size_t json_end(const char *s, size_t n, size_t i)
{
    int depth = 0;
    bool str = false, esc = false;
    for (; i < n; i++) {
        char c = s[i];
        if (str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') str = false;
            continue;
        }
        if (c == '"') str = true;
        else if (c == '{' || c == '[') depth++;
        else if ((c == '}' || c == ']') && --depth == 0) return i + 1;
    }
    return 0;
}

/* Parses s[0..n) as call JSON (one object, or an array of them); the number of calls added, 0
 * when it is not call JSON, -1 on oom. */
static int calls_from_text(chat_parser *p, chat_delta *d, const char *s, size_t n)
{
    cJSON *v = cJSON_ParseWithLength(s, n);
    if (!v) return 0;
    int added = 0, rc = 0;
    if (cJSON_IsArray(v)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            rc = call_from_json(p, d, it);
            if (rc <= 0) break;
            added++;
        }
    } else {
        rc = call_from_json(p, d, v);
        added = rc > 0;
    }
    cJSON_Delete(v);
    return rc < 0 ? -1 : added;
}

/* Releases buf[0..k) as content when a call region turned out not to be one. */
static void give_up_call(chat_parser *p, chat_delta *d, size_t k)
{
    put_content(p, bdata(&p->buf), k, d);
    bytebuf_consume(&p->buf, k);
    p->st = ST_CONTENT;
}

/* The markers that open a call region in CONTENT for the family. */
static const char *const *open_markers(chat_syntax s)
{
    static const char *const hermes[] = {HERMES_OPEN, NULL}, *const llama[] = {LLAMA_TAG, NULL},
                             *const mistral[] = {MISTRAL_OPEN, NULL}, *const ds[] = {DS_CALLS_BEGIN, NULL},
                             *const none[] = {NULL};
    switch (s) {
    case CHAT_SYNTAX_HERMES: return hermes;
    case CHAT_SYNTAX_LLAMA3: return llama;
    case CHAT_SYNTAX_MISTRAL: return mistral;
    case CHAT_SYNTAX_DEEPSEEK_V3: return ds;
    default: return none;
    }
}

/* One step of the CALL state; true when it consumed something (call again). */
static int step_call(chat_parser *p, chat_delta *d, bool final, bool *progress)
{
    const char *s = bdata(&p->buf);
    size_t n = p->buf.len, i = 0;
    *progress = false;
    switch (p->o.syntax) {
    case CHAT_SYNTAX_HERMES: {
        const char *end = memmem(s, n, HERMES_CLOSE, strlen(HERMES_CLOSE));
        if (!end && !final) return 0;
        size_t inner = end ? (size_t)(end - s) : n;
        int rc = calls_from_text(p, d, s, inner);
        if (rc < 0) return -1;
        if (rc == 0) { /* not a call after all: the markup goes out as it came */
            bytebuf restore = {0};
            bytebuf_puts(&restore, HERMES_OPEN);
            bytebuf_append(&restore, s, n);
            bytebuf_free(&p->buf);
            p->buf = restore;
            give_up_call(p, d, end ? strlen(HERMES_OPEN) + inner + strlen(HERMES_CLOSE) : p->buf.len);
        } else {
            bytebuf_consume(&p->buf, end ? inner + strlen(HERMES_CLOSE) : n);
            p->st = ST_CONTENT;
        }
        *progress = true;
        return 0;
    }
    case CHAT_SYNTAX_LLAMA3:
    case CHAT_SYNTAX_MISTRAL: {
        while (i < n && (is_space(s[i]) || s[i] == ';')) i++;
        if (i == n) {
            if (final) {
                bytebuf_consume(&p->buf, n);
                p->st = ST_CONTENT;
                *progress = true;
            }
            return 0;
        }
        if (s[i] != '{' && s[i] != '[') {
            if (p->o.syntax == CHAT_SYNTAX_MISTRAL) { /* [TOOL_CALLS]name[ARGS]{...} */
                const char *a = memmem(s + i, n - i, MISTRAL_ARGS, strlen(MISTRAL_ARGS));
                size_t j = a ? (size_t)(a - s) + strlen(MISTRAL_ARGS) : 0;
                size_t e = a && j < n && s[j] == '{' ? json_end(s, n, j) : 0;
                if (e) {
                    cJSON *args = cJSON_ParseWithLength(s + j, e - j);
                    char *text = args ? cJSON_PrintUnformatted(args) : NULL;
                    cJSON_Delete(args);
                    if (text) {
                        size_t nl = (size_t)(a - s) - i;
                        int rc = add_call(p, d, s + i, nl, text);
                        free(text);
                        if (rc < 0) return -1;
                        bytebuf_consume(&p->buf, e);
                        *progress = true;
                        return 0;
                    }
                }
                if (!final && (!a || !e)) return 0;
            }
            if (p->n_seen || !p->bare_json) { /* text after calls, or after the tag */
                p->st = ST_CONTENT;
                *progress = true;
                return 0;
            }
            give_up_call(p, d, n);
            *progress = true;
            return 0;
        }
        size_t e = json_end(s, n, i);
        if (!e) {
            if (final) give_up_call(p, d, n), *progress = true;
            return 0;
        }
        int rc = calls_from_text(p, d, s + i, e - i);
        if (rc < 0) return -1;
        if (rc == 0) give_up_call(p, d, e);
        else bytebuf_consume(&p->buf, e);
        *progress = true;
        return 0;
    }
    case CHAT_SYNTAX_DEEPSEEK_V3: {
        while (i < n && is_space(s[i])) i++;
        size_t el = strlen(DS_CALLS_END), bl = strlen(DS_CALL_BEGIN);
        if (n - i >= el && memcmp(s + i, DS_CALLS_END, el) == 0) {
            bytebuf_consume(&p->buf, i + el);
            p->st = ST_CONTENT;
            *progress = true;
            return 0;
        }
        const char *ce = memmem(s, n, DS_CALL_END, strlen(DS_CALL_END));
        if (n - i >= bl && memcmp(s + i, DS_CALL_BEGIN, bl) == 0 && ce) {
            /* type<｜tool▁sep｜>name\n```json\n{...}\n``` */
            const char *body = s + i + bl, *sep = memmem(body, (size_t)(ce - body), DS_SEP, strlen(DS_SEP));
            const char *name = sep ? sep + strlen(DS_SEP) : NULL;
            const char *nl = name ? memchr(name, '\n', (size_t)(ce - name)) : NULL;
            const char *brace = nl ? memchr(nl, '{', (size_t)(ce - nl)) : NULL;
            size_t e = brace ? json_end(s, (size_t)(ce - s), (size_t)(brace - s)) : 0;
            cJSON *args = e ? cJSON_ParseWithLength(brace, e - (size_t)(brace - s)) : NULL;
            char *text = args ? cJSON_PrintUnformatted(args) : NULL;
            cJSON_Delete(args);
            if (!text) {
                give_up_call(p, d, (size_t)(ce - s) + strlen(DS_CALL_END));
                *progress = true;
                return 0;
            }
            int rc = add_call(p, d, name, (size_t)(nl - name), text);
            free(text);
            if (rc < 0) return -1;
            bytebuf_consume(&p->buf, (size_t)(ce - s) + strlen(DS_CALL_END));
            *progress = true;
            return 0;
        }
        bool maybe = n - i < bl ? memcmp(s + i, DS_CALL_BEGIN, n - i) == 0 || memcmp(s + i, DS_CALLS_END, n - i < el ? n - i : el) == 0
                                : memcmp(s + i, DS_CALL_BEGIN, bl) == 0;
        if (final || !maybe) {
            p->st = ST_CONTENT; /* whatever follows is content */
            if (final && p->n_seen == 0) give_up_call(p, d, n);
            *progress = true;
        }
        return 0;
    }
    default:
        p->st = ST_CONTENT;
        *progress = true;
        return 0;
    }
}

static int run(chat_parser *p, chat_delta *d, bool final)
{
    for (int guard = 0; guard < 1 << 20; guard++) {
        const char *s = bdata(&p->buf);
        size_t n = p->buf.len;
        switch (p->st) {
        case ST_START: {
            size_t i = 0;
            while (i < n && is_space(s[i])) i++;
            size_t tl = strlen(THINK_OPEN);
            if (n - i >= tl && memcmp(s + i, THINK_OPEN, tl) == 0) {
                bytebuf_consume(&p->buf, i + tl);
                p->st = ST_REASON;
                continue;
            }
            if (!final && n - i < tl && memcmp(s + i, THINK_OPEN, n - i) == 0) return 0; /* undecided */
            p->st = ST_CONTENT;
            continue;
        }
        case ST_REASON: {
            const char *e = memmem(s, n, THINK_CLOSE, strlen(THINK_CLOSE));
            if (e) {
                bytebuf_append(&d->reasoning, s, (size_t)(e - s));
                bytebuf_consume(&p->buf, (size_t)(e - s) + strlen(THINK_CLOSE));
                p->st = ST_CONTENT;
                p->skip_ws = true;
                continue;
            }
            size_t hold = final ? 0 : tail_prefix(s, n, THINK_CLOSE);
            bytebuf_append(&d->reasoning, s, n - hold);
            bytebuf_consume(&p->buf, n - hold);
            return 0;
        }
        case ST_CONTENT: {
            if (!p->o.tools) {
                put_content(p, s, n, d);
                bytebuf_consume(&p->buf, n);
                return 0;
            }
            /* Llama 3 answers a call with bare JSON as its whole reply. */
            if (p->o.syntax == CHAT_SYNTAX_LLAMA3 && !p->content_begun && p->n_seen == 0) {
                size_t i = 0;
                while (i < n && is_space(s[i])) i++;
                if (i < n && s[i] == '{') {
                    bytebuf_consume(&p->buf, i);
                    p->st = ST_CALL;
                    p->bare_json = true;
                    continue;
                }
                if (i == n && !final) return 0;
            }
            const char *const *m = open_markers(p->o.syntax);
            const char *first = NULL, *which = NULL;
            for (int k = 0; m[k]; k++) {
                const char *h = memmem(s, n, m[k], strlen(m[k]));
                if (h && (!first || h < first)) first = h, which = m[k];
            }
            if (first) {
                put_content(p, s, (size_t)(first - s), d);
                bytebuf_clear(&p->ws);
                bytebuf_consume(&p->buf, (size_t)(first - s) + strlen(which));
                p->st = ST_CALL;
                p->bare_json = false;
                continue;
            }
            size_t hold = 0;
            for (int k = 0; m[k] && !final; k++) {
                size_t h = tail_prefix(s, n, m[k]);
                if (h > hold) hold = h;
            }
            put_content(p, s, n - hold, d);
            bytebuf_consume(&p->buf, n - hold);
            if (final && p->ws.len && p->n_seen == 0) {
                bytebuf_append(&d->content, bdata(&p->ws), p->ws.len);
                bytebuf_clear(&p->ws);
            }
            return 0;
        }
        case ST_CALL: {
            bool progress;
            if (step_call(p, d, final, &progress) < 0) return -1;
            if (!progress) return 0;
            continue;
        }
        }
    }
    return 0;
}

static int check(const chat_parser *p, const chat_delta *d)
{
    return bytebuf_ok(&p->buf) && bytebuf_ok(&p->ws) && bytebuf_ok(&d->content) && bytebuf_ok(&d->reasoning) ? 0 : -1;
}

int chat_parser_feed(chat_parser *p, const char *s, size_t n, chat_delta *d)
{
    bytebuf_append(&p->buf, s, n);
    if (run(p, d, false) < 0) return -1;
    return check(p, d);
}

int chat_parser_finish(chat_parser *p, chat_delta *d)
{
    if (run(p, d, true) < 0) return -1;
    return check(p, d);
}

/* ---- a reply cut inside a call ------------------------------------------------------------ */

static size_t skip_space(const char *s, size_t n, size_t i)
{
    while (i < n && is_space(s[i])) i++;
    return i;
}

/* The JSON string starting at s[i] ('"'), decoded into *out (malloc'd); its end, 0 when it is
 * not complete. */
static size_t json_string_at(const char *s, size_t n, size_t i, char **out)
{
    *out = NULL;
    if (i >= n || s[i] != '"') return 0;
    bool esc = false;
    for (size_t j = i + 1; j < n; j++) {
        if (esc) esc = false;
        else if (s[j] == '\\') esc = true;
        else if (s[j] == '"') {
            cJSON *v = cJSON_ParseWithLength(s + i, j + 1 - i);
            if (cJSON_IsString(v)) *out = strdup(v->valuestring);
            cJSON_Delete(v);
            return *out ? j + 1 : 0;
        }
    }
    return 0;
}

/* After `"key"` at or past s[i] (the first such key), the offset just past its ':' and
 * whitespace; 0 when absent. */
static size_t after_key(const char *s, size_t n, size_t i, const char *key)
{
    size_t kl = strlen(key);
    const char *k = i < n ? memmem(s + i, n - i, key, kl) : NULL;
    if (!k) return 0;
    size_t j = skip_space(s, n, (size_t)(k - s) + kl);
    if (j >= n || s[j] != ':') return 0;
    return skip_space(s, n, j + 1);
}

/* The open call in buf, as far as it was written: its name (complete, or nothing is released)
 * and its arguments so far (possibly not yet valid JSON).  0, or -1 when memory ran out. */
static int release_partial(chat_parser *p, chat_delta *d)
{
    const char *s = bdata(&p->buf);
    size_t n = p->buf.len, a = 0;
    char *name = NULL;
    if (p->o.syntax == CHAT_SYNTAX_DEEPSEEK_V3) { /* <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{ */
        const char *sep = memmem(s, n, DS_SEP, strlen(DS_SEP));
        const char *nl = sep ? memchr(sep, '\n', n - (size_t)(sep - s)) : NULL;
        const char *brace = nl ? memchr(nl, '{', n - (size_t)(nl - s)) : NULL;
        if (nl) name = strndup(sep + strlen(DS_SEP), (size_t)(nl - sep) - strlen(DS_SEP));
        a = brace ? (size_t)(brace - s) : n;
    } else if (p->o.syntax == CHAT_SYNTAX_MISTRAL && (a = after_key(s, n, 0, "\"name\"")) == 0 &&
               memmem(s, n, MISTRAL_ARGS, strlen(MISTRAL_ARGS))) { /* name[ARGS]{... */
        const char *args = memmem(s, n, MISTRAL_ARGS, strlen(MISTRAL_ARGS));
        size_t i = skip_space(s, n, 0);
        name = strndup(s + i, (size_t)(args - s) - i);
        a = (size_t)(args - s) + strlen(MISTRAL_ARGS);
    } else { /* {"name": "NAME", "arguments"|"parameters": {... */
        size_t v = after_key(s, n, 0, "\"name\"");
        size_t e = v ? json_string_at(s, n, v, &name) : 0;
        if (e) {
            a = after_key(s, n, e, p->o.syntax == CHAT_SYNTAX_LLAMA3 ? "\"parameters\"" : "\"arguments\"");
            if (!a) a = n; /* cut before its arguments began */
        }
    }
    int rc = 0;
    if (name && name[0]) {
        bytebuf args = {0};
        bytebuf_append(&args, s + a, n - a);
        rc = bytebuf_ok(&args) ? add_call_as(p, d, name, strlen(name), bdata(&args), true) : -1;
        bytebuf_free(&args);
    }
    free(name);
    bytebuf_clear(&p->buf);
    p->st = ST_CONTENT;
    return rc;
}

int chat_parser_cut(chat_parser *p, chat_delta *d)
{
    if (run(p, d, false) < 0) return -1; /* the complete calls before it go out as usual */
    if (p->st == ST_CALL && release_partial(p, d) < 0) return -1;
    return chat_parser_finish(p, d);
}
