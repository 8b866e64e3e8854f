/* api_encode.c - see api_encode.h.  Bodies are built as cJSON trees so escaping is never hand
 * written; text that reaches JSON is valid UTF-8 first (token pieces can be partial bytes). */
#include "api_encode.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

char *api_utf8_sanitize(const char *s, size_t len, size_t *out_len)
{
    /* NUL is valid UTF-8 but would cut the JSON string short (cJSON takes C strings): it
     * becomes U+FFFD too, and each run between NULs goes through the one replacement policy. */
    bytebuf b = {0};
    bytebuf_append(&b, "", 0);
    for (size_t i = 0; i < len;) {
        const char *nul = memchr(s + i, 0, len - i);
        size_t run = nul ? (size_t)(nul - (s + i)) : len - i;
        utf8_append_valid(&b, s + i, run);
        i += run;
        if (nul) {
            bytebuf_append(&b, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
    size_t n = 0;
    char *out = bytebuf_take(&b, &n);
    if (out_len) *out_len = n;
    return out;
}

/* Adds key: string (sanitized copy of s[0..len)). */
static void add_text(cJSON *obj, const char *key, const char *s, size_t len)
{
    char *clean = api_utf8_sanitize(s ? s : "", s ? len : 0, NULL);
    if (clean) cJSON_AddStringToObject(obj, key, clean);
    free(clean);
}

static char *print_and_free(cJSON *root)
{
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

const char *api_finish_reason(sched_finish f)
{
    switch (f) {
    case SCHED_FINISH_STOP: return "stop";
    case SCHED_FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

static cJSON *error_object(const api_error *e)
{
    cJSON *err = cJSON_CreateObject();
    /* Messages quote the client (a path, a role, a logit_bias key) and "%.40s" may cut a
     * character in two: the body must still be valid UTF-8 JSON. */
    add_text(err, "message", e->message, strlen(e->message));
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "server_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code[0]) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "error", err);
    return root;
}

char *api_error_json(const api_error *e) { return print_and_free(error_object(e)); }

typedef struct piece {
    char buf[256];
    int len; /* bytes in buf */
} piece;

static void token_piece(const api_vocab *v, int32_t id, piece *p)
{
    int n = v && v->token_bytes ? v->token_bytes(v->ctx, id, p->buf, (int)sizeof p->buf) : -1;
    p->len = n < 0 ? 0 : n > (int)sizeof p->buf ? (int)sizeof p->buf : n;
}

/* Chat logprob entry: {"token","logprob","bytes":[...]} */
static cJSON *chat_logprob_entry(const api_vocab *v, int32_t id, float logprob)
{
    piece p;
    token_piece(v, id, &p);
    cJSON *o = cJSON_CreateObject();
    add_text(o, "token", p.buf, (size_t)p.len);
    cJSON_AddNumberToObject(o, "logprob", logprob);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (int i = 0; i < p.len; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)p.buf[i]));
    return o;
}

/* {"content":[{token, logprob, bytes, top_logprobs:[...]}], "refusal": null} */
static cJSON *chat_logprobs(const api_choice *ch, const api_vocab *v)
{
    cJSON *lp = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(lp, "content");
    for (int i = 0; i < ch->n_tokens; i++) {
        const engine_result *t = &ch->tokens[i];
        cJSON *e = chat_logprob_entry(v, t->token, t->logprob);
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < t->n_top && k < ENGINE_MAX_TOP_LOGPROBS; k++)
            cJSON_AddItemToArray(top, chat_logprob_entry(v, t->top_ids[k], t->top_logprobs[k]));
        cJSON_AddItemToArray(content, e);
    }
    cJSON_AddNullToObject(lp, "refusal");
    return lp;
}

/* Legacy completions logprobs: {"tokens","token_logprobs","top_logprobs","text_offset"} */
static cJSON *completion_logprobs(const api_choice *ch, const api_vocab *v)
{
    cJSON *lp = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *token_lps = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *offsets = cJSON_AddArrayToObject(lp, "text_offset");
    size_t offset = ch->text_offset;
    for (int i = 0; i < ch->n_tokens; i++) {
        const engine_result *t = &ch->tokens[i];
        piece p;
        token_piece(v, t->token, &p);
        char *s = api_utf8_sanitize(p.buf, (size_t)p.len, NULL);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(s ? s : ""));
        free(s);
        cJSON_AddItemToArray(token_lps, cJSON_CreateNumber(t->logprob));
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < t->n_top && k < ENGINE_MAX_TOP_LOGPROBS; k++) {
            piece q;
            token_piece(v, t->top_ids[k], &q);
            char *qs = api_utf8_sanitize(q.buf, (size_t)q.len, NULL);
            /* Two alternatives can share a text (e.g. byte-fallback pieces): keep the first. */
            if (qs && !cJSON_GetObjectItemCaseSensitive(top, qs))
                cJSON_AddNumberToObject(top, qs, t->top_logprobs[k]);
            free(qs);
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
        offset += (size_t)p.len;
    }
    return lp;
}

static void add_finish(cJSON *o, const char *finish)
{
    if (finish) cJSON_AddStringToObject(o, "finish_reason", finish);
    else cJSON_AddNullToObject(o, "finish_reason");
}

static void add_logprobs(cJSON *o, const api_meta *m, const api_choice *ch, const api_vocab *v)
{
    if (!ch->logprobs) cJSON_AddNullToObject(o, "logprobs");
    else cJSON_AddItemToObject(o, "logprobs", m->kind == API_CHAT ? chat_logprobs(ch, v)
                                                                  : completion_logprobs(ch, v));
}

/* tool_calls: whole ({id, type, function: {name, arguments}}), or in a chunk a piece of each
 * call: its index, on its first piece its id, type and name, and its argument fragment. */
static void add_tool_calls(cJSON *o, const api_choice *ch, bool chunk)
{
    if (!ch->n_calls) return;
    cJSON *arr = cJSON_AddArrayToObject(o, "tool_calls");
    for (int i = 0; i < ch->n_calls; i++) {
        const chat_tool_call *c = &ch->calls[i];
        cJSON *it = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, it);
        if (chunk) cJSON_AddNumberToObject(it, "index", c->index);
        if (c->id) {
            add_text(it, "id", c->id, strlen(c->id));
            cJSON_AddStringToObject(it, "type", "function");
        }
        cJSON *fn = cJSON_AddObjectToObject(it, "function");
        if (c->name) add_text(fn, "name", c->name, strlen(c->name));
        add_text(fn, "arguments", c->arguments ? c->arguments : "", c->arguments ? strlen(c->arguments) : 0);
    }
}

/* A choice of a whole response (message) or of a chunk (delta). */
static cJSON *choice_object(const api_meta *m, const api_choice *ch, bool chunk, const api_vocab *v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", ch->index);
    if (m->kind == API_COMPLETIONS) {
        add_text(o, "text", ch->text, ch->text_len);
    } else if (!chunk) {
        cJSON *msg = cJSON_AddObjectToObject(o, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (ch->content_null) cJSON_AddNullToObject(msg, "content");
        else add_text(msg, "content", ch->text, ch->text_len);
        if (ch->reasoning_len) add_text(msg, "reasoning_content", ch->reasoning, ch->reasoning_len);
        add_tool_calls(msg, ch, false);
        cJSON_AddNullToObject(msg, "refusal");
    } else {
        cJSON *delta = cJSON_AddObjectToObject(o, "delta");
        if (ch->role) cJSON_AddStringToObject(delta, "role", "assistant");
        /* The finish chunk carries an empty delta, as OpenAI's does. */
        bool other = ch->reasoning_len || ch->n_calls;
        if (ch->role || ch->text_len || (!ch->finish_reason && !other)) add_text(delta, "content", ch->text, ch->text_len);
        if (ch->reasoning_len) add_text(delta, "reasoning_content", ch->reasoning, ch->reasoning_len);
        add_tool_calls(delta, ch, true);
    }
    add_logprobs(o, m, ch, v);
    add_finish(o, ch->finish_reason);
    return o;
}

static cJSON *envelope(const api_meta *m, bool chunk)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", m->kind == API_COMPLETIONS ? "text_completion"
                                            : chunk                   ? "chat.completion.chunk"
                                                                      : "chat.completion");
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model);
    if (m->fingerprint) cJSON_AddStringToObject(root, "system_fingerprint", m->fingerprint);
    else cJSON_AddNullToObject(root, "system_fingerprint");
    return root;
}

static cJSON *usage_object(const api_usage *u)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", u->prompt_tokens + u->completion_tokens);
    cJSON *details = cJSON_AddObjectToObject(o, "prompt_tokens_details"); /* as OpenAI reports it */
    if (details) cJSON_AddNumberToObject(details, "cached_tokens", u->cached_tokens);
    return o;
}

char *api_response_json(const api_meta *m, const api_choice *ch, int n, const api_usage *u,
                        const api_vocab *v)
{
    cJSON *root = envelope(m, false);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(choices, choice_object(m, &ch[i], false, v));
    cJSON_AddItemToObject(root, "usage", usage_object(u));
    return print_and_free(root);
}

char *api_chunk_json(const api_meta *m, const api_choice *ch, const api_vocab *v)
{
    cJSON *root = envelope(m, true);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToArray(choices, choice_object(m, ch, true, v));
    if (m->usage_null) cJSON_AddNullToObject(root, "usage");
    return print_and_free(root);
}

char *api_usage_chunk_json(const api_meta *m, const api_usage *u)
{
    cJSON *root = envelope(m, true);
    cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToObject(root, "usage", usage_object(u));
    return print_and_free(root);
}

void api_sse_data(bytebuf *b, const char *json)
{
    bytebuf_puts(b, "data: ");
    bytebuf_puts(b, json);
    bytebuf_puts(b, "\n\n");
}

void api_sse_done(bytebuf *b) { bytebuf_puts(b, "data: [DONE]\n\n"); }
