/* harmony.c - OpenAI's Harmony format (gpt-oss) out of a streamed reply (see chat_parse.h).
 *
 * A Harmony reply is a sequence of messages.  The prompt ends with `<|start|>assistant`, so the
 * reply begins inside its first message's header:
 *   <|channel|>analysis<|message|>We need the weather.<|end|>
 *   <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
 *   <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}<|call|>
 *   <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>
 * A header runs to <|message|>: the role (after <|start|>), the channel, a recipient (to=...,
 * before or after the channel) and a content type (json, <|constrain|>json).  A body runs to
 * <|end|>, <|call|> or <|return|> -- or to the end of the reply, since <|call|> and <|return|>
 * end generation (the tokenizer marks them so) and never reach the text -- or to a <|start|>
 * or <|channel|> that opens the next message without the <|end|> before it.  Where a body goes:
 *   - a recipient: a call; functions.NAME calls the function NAME, any other recipient (a
 *     built-in tool: browser.search, python) is its own name, which no client offers, so it is
 *     dropped like every call of a function not offered (to=assistant addresses no tool);
 *   - analysis: reasoning (reasoning off, --reasoning-format none: content, markup and all, as
 *     llama.cpp gives it);
 *   - final, commentary without a recipient (a preamble), no channel: content;
 *   - any other channel: reasoning (not meant as the answer: kept, not shown as one);
 *   - a role other than assistant (the model writing a tool's or the user's turn): dropped.
 * Text where a header should begin but none does (a reply a grammar forced to raw JSON) is
 * content.  A header that never ends (no <|message|> in HEADER_MAX bytes, or the reply ends
 * first) is markup: dropped, with its body.  After <|return|> nothing is read.  Markup is held
 * back until decided, as the other families' is, so none of it reaches content or reasoning;
 * a marker's text cut off by the end of the reply is dropped.
 *
 * Calls go out through chat_parse.c's gate (offered functions, parallel_tool_calls, our ids).
 * Streamed (stream_calls), a call opens when its body's '{' arrives and its arguments go out
 * re-printed by json_reprint as they are written; whole, the body is parsed at its end. */
#include "chat_parse_int.h"

#include "base/utf8.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define H_START "<|start|>"
#define H_END "<|end|>"
#define H_MESSAGE "<|message|>"
#define H_CHANNEL "<|channel|>"
#define H_CONSTRAIN "<|constrain|>"
#define H_CALL "<|call|>"
#define H_RETURN "<|return|>"
#define HEADER_MAX 512 /* a header is a role, a channel, a recipient and a type: far less */

typedef enum hstate {
    H_HEAD, /* reading a header (or deciding whether one begins) */
    H_BODY, /* a body, released to its route as it comes */
    H_DONE  /* after <|return|>: nothing more is read */
} hstate;

typedef enum hroute {
    R_CONTENT,
    R_REASONING,
    R_RAW, /* analysis with reasoning off: content, with its markup */
    R_CALL,
    R_DROP
} hroute;

struct harmony {
    hstate st;
    bool in_header; /* H_HEAD: a header has begun (else the message's first bytes decide) */
    hroute route;
    char *name;   /* R_CALL: the function called */
    bytebuf body; /* R_CALL: its arguments as written (whole, or until a streamed call opens) */
    /* stream_calls: the call opened ahead of its end */
    bool live;
    int index;
    json_reprint rp;
    bytebuf pend; /* re-printed, not yet released (an incomplete UTF-8 tail) */
};

static const char *bdata(const bytebuf *b) { return b->data ? b->data : ""; }

int harmony_new(chat_parser *p)
{
    return (p->hm = calloc(1, sizeof *p->hm)) ? 0 : -1;
}

void harmony_free(chat_parser *p)
{
    struct harmony *h = p->hm;
    if (!h) return;
    free(h->name);
    bytebuf_free(&h->body);
    bytebuf_free(&h->pend);
    free(h);
    p->hm = NULL;
}

/* The first of the markers in s[0..n) (its offset, *which set), or n when none is. */
static size_t first_marker(const char *s, size_t n, const char *const *m, const char **which)
{
    size_t at = n;
    *which = NULL;
    for (int k = 0; m[k]; k++) {
        const char *f = memmem(s, n, m[k], strlen(m[k]));
        if (f && (size_t)(f - s) < at) at = (size_t)(f - s), *which = m[k];
    }
    return at;
}

/* The longest tail of s[0..n) that may begin one of the markers. */
static size_t held_tail(const char *s, size_t n, const char *const *m)
{
    size_t hold = 0;
    for (int k = 0; m[k]; k++) {
        size_t t = chat_tail_prefix(s, n, m[k]);
        if (t > hold) hold = t;
    }
    return hold;
}

/* ---- calls ------------------------------------------------------------------------------- */

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Releases the open call's re-printed arguments: whole characters, or (all) everything. */
static int release_args(chat_delta *d, struct harmony *h, bool all)
{
    size_t k = all ? h->pend.len : utf8_complete_prefix(bdata(&h->pend), h->pend.len);
    if (!k) return 0;
    chat_tool_call *c = chat_call_piece(d, h->index);
    if (!c || chat_call_append(c, bdata(&h->pend), k) < 0) return -1;
    bytebuf_consume(&h->pend, k);
    return 0;
}

/* Reads s[0..n) of a call's arguments: held until a streamed call can open (its '{' came and
 * the client may have it), then re-printed as they come.  -1 when memory ran out. */
static int call_body(chat_parser *p, chat_delta *d, const char *s, size_t n)
{
    struct harmony *h = p->hm;
    if (!h->live) {
        if (!bytebuf_append(&h->body, s, n)) return -1;
        if (!p->o.stream_calls) return 0;
        const char *b = bdata(&h->body);
        size_t i = 0;
        while (i < h->body.len && is_space(b[i])) i++;
        if (i == h->body.len || b[i] != '{' || !chat_call_admitted(p, h->name, strlen(h->name))) return 0;
        char id[40];
        chat_call_id(p, id, sizeof id);
        chat_tool_call *c = chat_call_piece(d, p->n_calls);
        if (!c || !(c->id = strdup(id)) || !(c->name = strdup(h->name))) return -1;
        h->live = true;
        h->index = p->n_calls++;
        json_reprint_init(&h->rp);
        s = b + i;
        n = h->body.len - i;
    }
    if (!json_reprint_done(&h->rp) && !json_reprint_failed(&h->rp)) json_reprint_feed(&h->rp, s, n, &h->pend);
    if (h->live && h->body.len) bytebuf_clear(&h->body); /* fed: it was read from there */
    return bytebuf_ok(&h->pend) ? release_args(d, h, false) : -1;
}

/* The call's body ended (cut: by max_tokens, inside it).  A streamed call gets its last piece:
 * the rest of its arguments (cut: and what was held of them, as written).  A whole one is
 * parsed: its JSON (anything after the value is not arguments) re-printed as cJSON prints it,
 * through the gate; a cut one that is not JSON yet goes out as written, partial. */
static int end_call(chat_parser *p, chat_delta *d, bool cut)
{
    struct harmony *h = p->hm;
    int rc = 0;
    if (h->live) {
        size_t held_len = 0;
        const char *held = json_reprint_held(&h->rp, &held_len);
        chat_tool_call *c = release_args(d, h, true) < 0 ? NULL : chat_call_piece(d, h->index);
        if (!c || (cut && chat_call_append(c, held, held_len) < 0)) rc = -1;
        else c->last = true;
        h->live = false;
    } else {
        cJSON *v = cJSON_ParseWithLength(bdata(&h->body), h->body.len);
        char *printed = v ? cJSON_PrintUnformatted(v) : NULL;
        cJSON_Delete(v);
        if (v && !printed) return -1;
        if (!bytebuf_append(&h->body, "", 1)) rc = -1; /* NUL-terminated for the gate */
        else rc = chat_call_add(p, d, h->name, strlen(h->name), printed ? printed : bdata(&h->body), cut && !printed);
        free(printed);
    }
    bytebuf_clear(&h->body);
    bytebuf_clear(&h->pend);
    free(h->name);
    h->name = NULL;
    return rc;
}

/* ---- headers ----------------------------------------------------------------------------- */

/* A header's parts, as spans of its text. */
typedef struct hheader {
    const char *role, *channel, *to;
    size_t role_len, channel_len, to_len;
    bool to_done; /* the recipient's name is followed by something (it is complete) */
} hheader;

/* The end of the word at s[i]: a space or the next marker ends it. */
static size_t word_end(const char *s, size_t n, size_t i)
{
    while (i < n && !is_space(s[i]) && s[i] != '<') i++;
    return i;
}

static bool at(const char *s, size_t n, size_t i, const char *lit)
{
    size_t l = strlen(lit);
    return n - i >= l && memcmp(s + i, lit, l) == 0;
}

/* Reads a header's text s[0..n) (after <|start|> when role: the role comes first). */
static void parse_header(const char *s, size_t n, bool role, hheader *hd)
{
    memset(hd, 0, sizeof *hd);
    size_t i = 0;
    if (role) {
        size_t e = word_end(s, n, i);
        hd->role = s, hd->role_len = e;
        i = e;
    }
    while (i < n) {
        if (is_space(s[i])) {
            i++;
        } else if (at(s, n, i, H_CHANNEL)) { /* the last channel counts ("commentary" written before "analysis") */
            size_t b = i + strlen(H_CHANNEL), e = word_end(s, n, b);
            hd->channel = s + b, hd->channel_len = e - b;
            i = e;
        } else if (at(s, n, i, "to=")) {
            size_t b = i + 3, e = word_end(s, n, b);
            bool self = e - b == 9 && memcmp(s + b, "assistant", 9) == 0; /* to=assistant: no tool */
            if (!self) hd->to = s + b, hd->to_len = e - b, hd->to_done = e < n;
            i = e;
        } else if (at(s, n, i, H_CONSTRAIN)) {
            i += strlen(H_CONSTRAIN);
        } else { /* a content type (json), or a stray '<' */
            size_t e = word_end(s, n, i);
            i = e > i ? e : i + 1;
        }
    }
}

/* Where a message with header hd goes; for a call, its name into h->name.  -1: out of memory. */
static int route_of(chat_parser *p, const hheader *hd)
{
    struct harmony *h = p->hm;
    bool analysis = hd->channel_len == 8 && memcmp(hd->channel, "analysis", 8) == 0;
    bool known = analysis || !hd->channel || (hd->channel_len == 5 && memcmp(hd->channel, "final", 5) == 0) ||
                 (hd->channel_len == 10 && memcmp(hd->channel, "commentary", 10) == 0);
    if (hd->role && !(hd->role_len == 9 && memcmp(hd->role, "assistant", 9) == 0)) {
        h->route = R_DROP;
    } else if (hd->to) {
        size_t skip = hd->to_len > 10 && memcmp(hd->to, "functions.", 10) == 0 ? 10 : 0;
        h->route = R_CALL;
        if (!p->o.tools || hd->to_len == 0) { /* no tools offered: a call nobody can take */
            h->route = R_DROP;
            p->n_dropped++;
        } else if (!(h->name = strndup(hd->to + skip, hd->to_len - skip))) {
            return -1;
        }
    } else if (analysis || !known) {
        h->route = p->o.reasoning ? R_REASONING : analysis ? R_RAW : R_CONTENT;
    } else {
        h->route = R_CONTENT;
    }
    return 0;
}

/* ---- the state machine ------------------------------------------------------------------- */

static const char *const body_ends[] = {H_END, H_CALL, H_RETURN, H_START, H_CHANNEL, NULL};
static const char *const header_ends[] = {H_MESSAGE, H_END, H_CALL, H_RETURN, H_START, NULL};
static const char *const header_opens[] = {H_CHANNEL, H_START, H_MESSAGE, H_CONSTRAIN, "to=", NULL};

/* Body text s[0..n) to the message's route.  -1 when memory ran out. */
static int emit(chat_parser *p, chat_delta *d, const char *s, size_t n)
{
    switch (p->hm->route) {
    case R_CONTENT:
    case R_RAW: bytebuf_append(&d->content, s, n); return 0;
    case R_REASONING: bytebuf_append(&d->reasoning, s, n); return 0;
    case R_CALL: return n ? call_body(p, d, s, n) : 0;
    case R_DROP: return 0;
    }
    return 0;
}

/* The message's body ended at marker m (NULL: the reply ended; cut: by max_tokens). */
static int end_message(chat_parser *p, chat_delta *d, const char *m, bool cut)
{
    struct harmony *h = p->hm;
    if (h->route == R_RAW && m) bytebuf_puts(&d->content, H_END);
    int rc = h->route == R_CALL ? end_call(p, d, cut) : 0;
    h->st = m && strcmp(m, H_RETURN) == 0 ? H_DONE : H_HEAD;
    h->in_header = false;
    return rc;
}

/* A complete header s[0..n) (without its <|message|>): the body that follows is routed. */
static int begin_body(chat_parser *p, chat_delta *d, const char *s, size_t n)
{
    bool role = at(s, n, 0, H_START);
    size_t skip = role ? strlen(H_START) : 0;
    hheader hd;
    parse_header(s + skip, n - skip, role, &hd);
    if (route_of(p, &hd) < 0) return -1;
    if (p->hm->route == R_RAW) bytebuf_puts(&d->content, H_CHANNEL "analysis" H_MESSAGE);
    p->hm->st = H_BODY;
    return 0;
}

/* A reply cut inside a header: a call whose recipient was complete goes out, partial, with no
 * arguments (as a cut before the arguments in the other families); anything else was markup. */
static int cut_header(chat_parser *p, chat_delta *d)
{
    const char *s = bdata(&p->buf);
    size_t n = p->buf.len, skip = at(s, n, 0, H_START) ? strlen(H_START) : 0;
    hheader hd;
    parse_header(s + skip, n - skip, skip > 0, &hd);
    if (!p->hm->in_header || !hd.to || !hd.to_done) return 0;
    if (route_of(p, &hd) < 0) return -1;
    return p->hm->route == R_CALL ? end_call(p, d, true) : 0;
}

/* One step: consumes what is decided; false when it must wait for more text. */
static int step(chat_parser *p, chat_delta *d, bool final, bool *progress)
{
    struct harmony *h = p->hm;
    const char *s = bdata(&p->buf), *which;
    size_t n = p->buf.len;
    *progress = false;
    switch (h->st) {
    case H_DONE: bytebuf_clear(&p->buf); return 0;
    case H_HEAD:
        if (!h->in_header) { /* a message's first bytes: a header, or text without one */
            size_t i = 0;
            while (i < n && is_space(s[i])) i++;
            if (i == n) { /* whitespace between messages (or none yet) */
                if (final) bytebuf_clear(&p->buf);
                return 0;
            }
            const char *const *o;
            for (o = header_opens; *o && !at(s, n, i, *o); o++) {}
            if (*o) {
                bytebuf_consume(&p->buf, i);
                h->in_header = *progress = true;
                return 0;
            }
            size_t rest = n - i;
            bool maybe = false;
            for (o = header_opens; *o && !maybe; o++) maybe = rest < strlen(*o) && memcmp(s + i, *o, rest) == 0;
            if (maybe && !final) return 0;
            if (maybe && at(s, n, i, "<|")) { /* a marker cut off by the end: markup */
                bytebuf_clear(&p->buf);
                return 0;
            }
            h->route = R_CONTENT; /* no header: text */
            h->st = H_BODY;
            *progress = true;
            return 0;
        }
        {
            size_t skip = at(s, n, 0, H_START) ? strlen(H_START) : 0; /* the role's own <|start|> */
            size_t e = skip + first_marker(s + skip, n - skip, header_ends, &which);
            /* too long: decided by where a marker begins, so wherever the text was split (a
             * marker begun within HEADER_MAX bytes is complete 16 bytes later) */
            bool too_long = which ? e > HEADER_MAX : n > HEADER_MAX + 16;
            if (!too_long && which && strcmp(which, H_MESSAGE) == 0) {
                if (begin_body(p, d, s, e) < 0) return -1;
                bytebuf_consume(&p->buf, e + strlen(H_MESSAGE));
                *progress = true;
            } else if (too_long || which) { /* a header that does not end (in time): markup */
                h->route = R_DROP;
                h->st = H_BODY;
                bytebuf_consume(&p->buf, too_long ? HEADER_MAX : e);
                *progress = true;
            } else if (final) {
                bytebuf_clear(&p->buf);
            }
            return 0;
        }
    case H_BODY: {
        size_t e = first_marker(s, n, body_ends, &which);
        if (which) {
            if (emit(p, d, s, e) < 0) return -1;
            /* <|start|> and <|channel|> open the next message: they stay for its header */
            bool opens = strcmp(which, H_START) == 0 || strcmp(which, H_CHANNEL) == 0;
            bytebuf_consume(&p->buf, e + (opens ? 0 : strlen(which)));
            if (end_message(p, d, which, false) < 0) return -1;
            h->in_header = opens;
            *progress = true;
            return 0;
        }
        size_t hold = final ? 0 : held_tail(s, n, body_ends);
        size_t cutoff = final ? held_tail(s, n, body_ends) : 0; /* a marker cut off by the end */
        if (cutoff && !at(s, n, n - cutoff, "<|")) cutoff = 0;
        if (emit(p, d, s, n - hold - cutoff) < 0) return -1;
        bytebuf_consume(&p->buf, n - hold);
        if (final && end_message(p, d, NULL, false) < 0) return -1;
        return 0;
    }
    }
    return 0;
}

static int run(chat_parser *p, chat_delta *d, bool final)
{
    for (int guard = 0; guard < 1 << 20; guard++) {
        bool progress;
        if (step(p, d, final, &progress) < 0) return -1;
        if (!progress) return 0;
    }
    return 0;
}

int harmony_feed(chat_parser *p, chat_delta *d)
{
    return run(p, d, false);
}

int harmony_finish(chat_parser *p, chat_delta *d, bool cut)
{
    struct harmony *h = p->hm;
    if (cut) {
        if (run(p, d, false) < 0) return -1;
        int rc = 0;
        if (h->st == H_BODY && h->route == R_CALL) {
            /* what is held may be the start of <|end|>; a call's arguments end where they were cut */
            if (emit(p, d, bdata(&p->buf), p->buf.len) < 0 || end_call(p, d, true) < 0) rc = -1;
            h->route = R_DROP;
        } else if (h->st == H_HEAD) {
            rc = cut_header(p, d);
        }
        bytebuf_clear(&p->buf);
        if (rc < 0) return -1;
    }
    return run(p, d, true);
}
