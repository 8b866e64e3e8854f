/* chat_parse.c - reasoning, content and tool calls out of a model's streamed reply (see
 * chat_parse.h).
 *
 * All text not yet released lives in one buffer; each feed appends to it and runs the state
 * machine until it cannot decide more.  States: START (maybe a <think> opening), REASON
 * (inside <think>), CONTENT, CALL (inside a family's tool-call markup).  Holding back works as
 * in sched/stopstr.c: the longest tail that is a proper prefix of a marker stays in the buffer.
 * Whitespace between content and calls is held too and dropped when a call follows, so that a
 * reply of calls alone has content null.
 *
 * Streamed calls (stream_calls): the CALL state still decides, as above, when a call is
 * complete and what it is; ahead of that, a look-ahead (preview) reads the call region while
 * it waits -- the call object's header, then its arguments through json_reprint -- and opens
 * the call and releases argument fragments as they are decided.  When the CALL state then
 * completes the call (add_call_as, matched by the call's ordinal in the region), only the
 * rest of its arguments goes out. */
#include "chat_parse.h"
#include "chat_parse_int.h"

#include "base/rng.h"
#include "base/utf8.h"

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
#define HARMONY_CHANNEL "<|channel|>"

static const char *const syntax_names[CHAT_SYNTAX_COUNT] = {"none", "hermes", "llama3", "mistral", "deepseek-v3",
                                                                  "harmony"};

chat_syntax chat_syntax_detect(const char *src)
{
    if (!src) return CHAT_SYNTAX_NONE;
    if (strstr(src, HARMONY_CHANNEL)) return CHAT_SYNTAX_HARMONY; /* before the others: it is a whole format */
    if (strstr(src, HERMES_OPEN)) return CHAT_SYNTAX_HERMES;
    if (strstr(src, "tool▁calls▁begin")) return CHAT_SYNTAX_DEEPSEEK_V3;
    if (strstr(src, MISTRAL_OPEN)) return CHAT_SYNTAX_MISTRAL;
    if (strstr(src, "<|start_header_id|>")) return CHAT_SYNTAX_LLAMA3;
    return CHAT_SYNTAX_NONE;
}

const char *chat_syntax_name(chat_syntax s) { return (unsigned)s < CHAT_SYNTAX_COUNT ? syntax_names[s] : "unknown"; }

bool chat_template_thinks(const char *src)
{
    return src && (strstr(src, THINK_OPEN) != NULL || strstr(src, HARMONY_CHANNEL) != NULL);
}

bool chat_syntax_structured(chat_syntax s) { return s == CHAT_SYNTAX_HARMONY; }

bool chat_forced_call_shape(chat_syntax s, chat_forced_call *out)
{
    switch (s) {
    case CHAT_SYNTAX_HERMES: *out = (chat_forced_call){HERMES_OPEN "\n", "\n" HERMES_CLOSE, "arguments", false, NULL}; return true;
    case CHAT_SYNTAX_LLAMA3: *out = (chat_forced_call){"", "", "parameters", false, NULL}; return true;
    case CHAT_SYNTAX_MISTRAL: *out = (chat_forced_call){MISTRAL_OPEN, "", "arguments", true, NULL}; return true;
    case CHAT_SYNTAX_DEEPSEEK_V3:
        /* DeepSeek writes the name in markup, not in JSON: prefix ends before the name. */
        *out = (chat_forced_call){DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP, "\n```" DS_CALL_END DS_CALLS_END,
                                  NULL, false, "\n```json\n"};
        return true;
    case CHAT_SYNTAX_HARMONY:
        /* the reply's first message: the prompt wrote <|start|>assistant; <|call|> ends
         * generation, so no suffix (the grammar then allows only end-of-generation tokens) */
        *out = (chat_forced_call){HARMONY_CHANNEL "commentary to=functions.", "", NULL, false,
                                  " <|constrain|>json<|message|>"};
        return true;
    default: return false;
    }
}

const char *chat_answer_prefix(chat_syntax s)
{
    return s == CHAT_SYNTAX_HARMONY ? HARMONY_CHANNEL "final<|message|>" : "";
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
    if (o->syntax == CHAT_SYNTAX_HARMONY && harmony_new(p) < 0) {
        free(p);
        return NULL;
    }
    return p;
}

void chat_parser_free(chat_parser *p)
{
    if (!p) return;
    harmony_free(p);
    bytebuf_free(&p->buf);
    bytebuf_free(&p->ws);
    bytebuf_free(&p->pv_out);
    for (int i = 0; i < p->n_live; i++) bytebuf_free(&p->live[i].sent);
    free(p->live);
    free(p);
}

int chat_parser_n_calls(const chat_parser *p) { return p->n_calls; }
int chat_parser_n_dropped(const chat_parser *p) { return p->n_dropped; }

static const char *bdata(const bytebuf *b) { return b->data ? b->data : ""; }

/* Longest tail of s[0..n) that is a proper prefix of marker m. */
size_t chat_tail_prefix(const char *s, size_t n, const char *m)
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

void chat_call_id(chat_parser *p, char *id, size_t cap)
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

/* A new entry at the end of d (its strings NULL), or NULL when memory ran out. */
static chat_tool_call *new_entry(chat_delta *d)
{
    if (d->n_calls == d->cap_calls) {
        int cap = d->cap_calls ? d->cap_calls * 2 : 4;
        chat_tool_call *c = realloc(d->calls, (size_t)cap * sizeof *c);
        if (!c) return NULL;
        d->calls = c;
        d->cap_calls = cap;
    }
    chat_tool_call *c = &d->calls[d->n_calls++];
    memset(c, 0, sizeof *c);
    return c;
}

/* The entry a piece of streamed call index goes into: the last entry when it is a piece of
 * the same call that is not its last (one feed's pieces of a call are one), else a new one.
 * NULL when memory ran out. */
chat_tool_call *chat_call_piece(chat_delta *d, int index)
{
    chat_tool_call *c = d->n_calls ? &d->calls[d->n_calls - 1] : NULL;
    if (c && c->index == index && !c->last) return c;
    if (!(c = new_entry(d))) return NULL;
    c->index = index;
    if (!(c->arguments = strdup(""))) d->n_calls--;
    return c->arguments ? c : NULL;
}

/* Appends s[0..n) to a piece's arguments; -1 when memory ran out. */
int chat_call_append(chat_tool_call *c, const char *s, size_t n)
{
    if (!n) return 0;
    size_t have = strlen(c->arguments);
    char *a = realloc(c->arguments, have + n + 1);
    if (!a) return -1;
    memcpy(a + have, s, n);
    a[have + n] = 0;
    c->arguments = a;
    return 0;
}

/* A call the client may be handed (before its arguments are known): a function it offered,
 * within parallel_tool_calls. */
bool chat_call_admitted(const chat_parser *p, const char *name, size_t len)
{
    return offered(p, name, len) && !(p->o.max_calls && p->n_calls >= p->o.max_calls);
}

/* The call opened ahead of its end as the ord-th call object of the region, or NULL. */
static live_call *live_at(chat_parser *p, int ord)
{
    for (int i = 0; i < p->n_live; i++)
        if (p->live[i].ord == ord) return &p->live[i];
    return NULL;
}

/* An opened call's last piece: the rest of its arguments (args: the whole call's, as a
 * non-streamed reply has them; the fragments sent are their prefix).  -1 when out of memory. */
static int close_live(chat_delta *d, live_call *lc, const char *args)
{
    size_t sent = lc->sent.len, len = strlen(args);
    bool prefix = sent <= len && memcmp(bdata(&lc->sent), args, sent) == 0;
    chat_tool_call *c = chat_call_piece(d, lc->index);
    if (!c || (prefix && chat_call_append(c, args + sent, len - sent) < 0)) return -1;
    c->last = true;
    lc->closed = true;
    return 0;
}

/* A recognised call goes to the client only when it can act on it: a function the request
 * offered (not a made-up one, not a name with markup in it), arguments that parse as a JSON
 * object, and only the first when parallel calls are off.  Anything else is dropped, markup
 * and all (it is no content either), and counted.  The id is always ours: a model-written
 * one could repeat an earlier call's or carry anything.  A call opened ahead of its end
 * (stream_calls) was admitted then and gets the rest of its arguments.  0, or -1 when memory
 * ran out. */
int chat_call_add(chat_parser *p, chat_delta *d, const char *name, size_t name_len, const char *args,
                       bool partial)
{
    p->n_seen++;
    bytebuf_clear(&p->ws); /* whitespace between calls is markup, not content */
    live_call *lc = p->o.stream_calls ? live_at(p, p->step_ord++) : NULL;
    if (lc) return close_live(d, lc, args);
    if (!chat_call_admitted(p, name, name_len) || (!partial && !args_object(args))) {
        p->n_dropped++;
        return 0;
    }
    char id[40];
    chat_call_id(p, id, sizeof id);
    chat_tool_call *c = new_entry(d);
    if (!c) return -1;
    *c = (chat_tool_call){.index = p->n_calls, .id = strdup(id), .name = strndup(name, name_len),
                          .arguments = strdup(args), .last = true};
    if (!c->id || !c->name || !c->arguments) {
        free(c->id);
        free(c->name);
        free(c->arguments);
        d->n_calls--;
        return -1;
    }
    p->n_calls++;
    return 0;
}

static int add_call(chat_parser *p, chat_delta *d, const char *name, size_t name_len, const char *args)
{
    return chat_call_add(p, d, name, name_len, args, false);
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

/* Releases buf[0..k) as content when a call region turned out not to be one -- unless a
 * call in it was already opened (stream_calls): then its markup is dropped. */
static void give_up_call(chat_parser *p, chat_delta *d, size_t k)
{
    if (!p->n_live) put_content(p, bdata(&p->buf), k, d);
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

static int preview(chat_parser *p, chat_delta *d);
static int end_region_step(chat_parser *p, chat_delta *d, bool cut);

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
            size_t hold = final ? 0 : chat_tail_prefix(s, n, THINK_CLOSE);
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
                size_t h = chat_tail_prefix(s, n, m[k]);
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
            if (!progress) return p->o.stream_calls ? preview(p, d) : 0; /* waiting: read ahead */
            if (p->o.stream_calls && end_region_step(p, d, false) < 0) return -1;
            continue;
        }
        }
    }
    return 0;
}

static int check(const chat_parser *p, const chat_delta *d)
{
    return bytebuf_ok(&p->buf) && bytebuf_ok(&p->ws) && bytebuf_ok(&p->pv_out) && bytebuf_ok(&d->content) &&
                   bytebuf_ok(&d->reasoning)
               ? 0
               : -1;
}

int chat_parser_feed(chat_parser *p, const char *s, size_t n, chat_delta *d)
{
    bytebuf_append(&p->buf, s, n);
    if ((p->hm ? harmony_feed(p, d) : run(p, d, false)) < 0) return -1;
    return check(p, d);
}

int chat_parser_finish(chat_parser *p, chat_delta *d)
{
    if ((p->hm ? harmony_finish(p, d, false) : run(p, d, true)) < 0) return -1;
    return check(p, d);
}

/* ---- a reply cut inside a call ------------------------------------------------------------ */

static size_t skip_space(const char *s, size_t n, size_t i)
{
    while (i < n && is_space(s[i])) i++;
    return i;
}

/* The end (exclusive) of the JSON string starting at s[i] ('"'), 0 when it is not closed. */
static size_t string_end(const char *s, size_t n, size_t i)
{
    bool esc = false;
    for (size_t j = i + 1; j < n; j++) {
        if (esc) esc = false;
        else if (s[j] == '\\') esc = true;
        else if (s[j] == '"') return j + 1;
    }
    return 0;
}

/* The JSON string starting at s[i] ('"'), decoded into *out (malloc'd); its end, 0 when it is
 * not complete. */
static size_t json_string_at(const char *s, size_t n, size_t i, char **out)
{
    *out = NULL;
    size_t e = i < n && s[i] == '"' ? string_end(s, n, i) : 0;
    if (!e) return 0;
    cJSON *v = cJSON_ParseWithLength(s + i, e - i);
    if (cJSON_IsString(v)) *out = strdup(v->valuestring);
    cJSON_Delete(v);
    return *out ? e : 0;
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
        rc = bytebuf_ok(&args) ? chat_call_add(p, d, name, strlen(name), bdata(&args), true) : -1;
        bytebuf_free(&args);
    }
    free(name);
    bytebuf_clear(&p->buf);
    p->st = ST_CONTENT;
    return rc;
}

int chat_parser_cut(chat_parser *p, chat_delta *d)
{
    if (p->hm) return harmony_finish(p, d, true) < 0 ? -1 : check(p, d);
    if (run(p, d, false) < 0) return -1; /* the complete calls before it go out as usual */
    if (p->st == ST_CALL) {
        /* a call already opened ends where it was cut; else the open call is found now */
        if (p->n_live ? end_region_step(p, d, true) < 0 : release_partial(p, d) < 0) return -1;
        bytebuf_clear(&p->buf);
        p->st = ST_CONTENT;
    }
    return chat_parser_finish(p, d);
}

/* ---- streamed calls: reading a call region ahead of its end ------------------------------- */

/* 1: s[*i..n) starts with lit (and *i moves past it); 0: it may still (too short to tell);
 * -1: it does not. */
static int expect_lit(const char *s, size_t n, size_t *i, const char *lit)
{
    size_t l = strlen(lit), have = n - *i < l ? n - *i : l;
    if (memcmp(s + *i, lit, have) != 0) return -1;
    if (have < l) return 0;
    *i += l;
    return 1;
}

/* The call object at s[i] ('{') as far as its arguments: {"name": "NAME", "arguments"|
 * "parameters": {.  1 with *name (malloc'd) and *args (the offset of the arguments' '{'), 0
 * while it may still be, -1 when it is written otherwise (the call then goes out whole). */
static int call_header(const char *s, size_t n, size_t i, char **name, size_t *args)
{
    static const char *const keys[] = {"\"arguments\"", "\"parameters\""};
    *name = NULL;
    i = skip_space(s, n, i + 1);
    int m = expect_lit(s, n, &i, "\"name\"");
    if (m == 1) i = skip_space(s, n, i), m = expect_lit(s, n, &i, ":");
    if (m == 1) {
        i = skip_space(s, n, i);
        size_t e = i < n && s[i] == '"' ? string_end(s, n, i) : 0;
        m = e ? (json_string_at(s, n, i, name) ? 1 : -1) : i == n || s[i] == '"' ? 0 : -1;
        if (m == 1) i = skip_space(s, n, e), m = expect_lit(s, n, &i, ",");
    }
    if (m == 1) {
        i = skip_space(s, n, i);
        size_t at = i;
        int a = expect_lit(s, n, &i, keys[0]), b = a == 1 ? 1 : expect_lit(s, n, &at, keys[1]);
        if (b == 1 && a != 1) i = at;
        m = a == 1 || b == 1 ? 1 : a == 0 || b == 0 ? 0 : -1;
    }
    if (m == 1) i = skip_space(s, n, i), m = expect_lit(s, n, &i, ":");
    if (m == 1) i = skip_space(s, n, i), m = expect_lit(s, n, &i, "{");
    if (m == 1) *args = i - 1;
    else free(*name), *name = NULL;
    return m;
}

/* Opens a call ahead of its end when the client may be handed it: its first piece (id and
 * name), and the arguments at buf[args] to read.  -1 when memory ran out. */
static int open_call(chat_parser *p, chat_delta *d, const char *name, size_t len, size_t args)
{
    if (!chat_call_admitted(p, name, len)) {
        p->pv = PV_AFTER; /* the CALL state drops it */
        return 0;
    }
    if (p->n_live == p->cap_live) {
        int cap = p->cap_live ? p->cap_live * 2 : 4;
        live_call *l = realloc(p->live, (size_t)cap * sizeof *l);
        if (!l) return -1;
        p->live = l;
        p->cap_live = cap;
    }
    char id[40];
    chat_call_id(p, id, sizeof id);
    chat_tool_call *c = chat_call_piece(d, p->n_calls);
    if (!c || !(c->id = strdup(id)) || !(c->name = strndup(name, len))) return -1;
    p->live[p->n_live++] = (live_call){.ord = p->pv_ord, .index = p->n_calls++};
    json_reprint_init(&p->rp);
    p->pv_pos = args;
    p->pv = PV_ARGS;
    return 0;
}

/* Reads the open call's arguments on and releases what is decided (whole characters). */
static int read_args(chat_parser *p, chat_delta *d)
{
    live_call *lc = &p->live[p->n_live - 1];
    p->pv_pos += json_reprint_feed(&p->rp, bdata(&p->buf) + p->pv_pos, p->buf.len - p->pv_pos, &p->pv_out);
    size_t k = utf8_complete_prefix(bdata(&p->pv_out), p->pv_out.len);
    if (k) {
        chat_tool_call *c = chat_call_piece(d, lc->index);
        if (!c || chat_call_append(c, bdata(&p->pv_out), k) < 0 || !bytebuf_append(&lc->sent, bdata(&p->pv_out), k)) return -1;
        bytebuf_consume(&p->pv_out, k);
    }
    if (json_reprint_done(&p->rp)) p->pv = PV_AFTER;
    else if (json_reprint_failed(&p->rp)) p->pv = PV_OFF; /* not JSON: the CALL state decides */
    return 0;
}

/* Reads ahead in the call region while the CALL state waits for its end.  The shapes it
 * follows are the ones step_call reads, in the same places. */
static int preview(chat_parser *p, chat_delta *d)
{
    for (;;) {
        const char *s = bdata(&p->buf);
        size_t n = p->buf.len, i = p->pv_pos;
        char *name = NULL;
        size_t args = 0;
        int m;
        switch (p->pv) {
        case PV_SEEK:
            while (i < n && (is_space(s[i]) || (s[i] == ';' && p->o.syntax != CHAT_SYNTAX_HERMES))) i++;
            if (i == n) return 0;
            p->pv_pos = i;
            if (p->o.syntax == CHAT_SYNTAX_DEEPSEEK_V3) p->pv = PV_DS;
            else if (s[i] == '[') p->pv_array = true, p->pv_pos = i + 1, p->pv = PV_ELEM;
            else if (s[i] == '{') p->pv = PV_ELEM;
            else p->pv = p->o.syntax == CHAT_SYNTAX_MISTRAL ? PV_MISTRAL : PV_OFF;
            continue;
        case PV_ELEM:
            i = skip_space(s, n, i);
            if (i == n) return 0;
            if (p->pv_comma) {
                p->pv_comma = false;
                p->pv_pos = i + 1;
                if (s[i] != ',') p->pv = PV_OFF;
                continue;
            }
            p->pv_obj = i;
            p->pv = s[i] == '{' ? PV_HEADER : PV_OFF;
            continue;
        case PV_HEADER:
            m = call_header(s, n, p->pv_obj, &name, &args);
            if (m == 0) return 0;
            if (m < 0) {
                p->pv = PV_AFTER; /* written otherwise: it goes out whole */
                continue;
            }
            m = open_call(p, d, name, strlen(name), args);
            free(name);
            if (m < 0) return -1;
            continue;
        case PV_MISTRAL: { /* NAME[ARGS]{ */
            const char *a = memmem(s + i, n - i, MISTRAL_ARGS, strlen(MISTRAL_ARGS));
            args = a ? (size_t)(a - s) + strlen(MISTRAL_ARGS) : n;
            if (args == n) return 0;
            if (s[args] != '{') p->pv = PV_OFF;
            else if (open_call(p, d, s + i, (size_t)(a - s) - i, args) < 0) return -1;
            if (p->pv == PV_AFTER) p->pv = PV_OFF; /* one call per region step */
            continue;
        }
        case PV_DS: { /* <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{ */
            if ((m = expect_lit(s, n, &i, DS_CALL_BEGIN)) == 0) return 0;
            if (m < 0) {
                p->pv = PV_OFF;
                continue;
            }
            const char *sep = memmem(s + i, n - i, DS_SEP, strlen(DS_SEP));
            const char *nm = sep ? sep + strlen(DS_SEP) : NULL;
            const char *nl = nm ? memchr(nm, '\n', n - (size_t)(nm - s)) : NULL;
            const char *brace = nl ? memchr(nl, '{', n - (size_t)(nl - s)) : NULL;
            if (!brace) return 0;
            if (open_call(p, d, nm, (size_t)(nl - nm), (size_t)(brace - s)) < 0) return -1;
            if (p->pv == PV_AFTER) p->pv = PV_OFF;
            continue;
        }
        case PV_ARGS:
            if (read_args(p, d) < 0) return -1;
            if (p->pv == PV_ARGS) return 0;
            continue;
        case PV_AFTER: { /* an array's next object comes after this one's end */
            size_t e = p->pv_array ? json_end(s, n, p->pv_obj) : 0;
            if (!p->pv_array) p->pv = PV_OFF;
            if (!e) return 0;
            p->pv_pos = e;
            p->pv_ord++;
            p->pv_comma = true;
            p->pv = PV_ELEM;
            continue;
        }
        case PV_OFF: return 0;
        }
    }
}

/* The CALL state consumed (a call completed, or the region ended): calls opened in the region
 * and not closed by it end here -- cut: with what was held of their arguments, as written --
 * and the look-ahead starts over.  -1 when memory ran out. */
static int end_region_step(chat_parser *p, chat_delta *d, bool cut)
{
    int rc = 0;
    for (int i = 0; i < p->n_live; i++) {
        live_call *lc = &p->live[i];
        if (!lc->closed) {
            chat_tool_call *c = chat_call_piece(d, lc->index);
            size_t held_len = 0;
            const char *held = json_reprint_held(&p->rp, &held_len);
            bool reading = p->pv == PV_ARGS && i == p->n_live - 1;
            if (!c || (reading && chat_call_append(c, bdata(&p->pv_out), p->pv_out.len) < 0) ||
                (reading && cut && chat_call_append(c, held, held_len) < 0))
                rc = -1;
            else c->last = true;
        }
        bytebuf_free(&lc->sent);
    }
    p->n_live = 0;
    p->pv = PV_SEEK;
    p->pv_pos = p->pv_obj = 0;
    p->pv_array = p->pv_comma = false;
    p->pv_ord = p->step_ord = 0;
    bytebuf_clear(&p->pv_out);
    return rc;
}
