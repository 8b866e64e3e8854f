/* fuzz_reply.c - a model's reply split into reasoning, content and tool calls
 * (src/text/chat_parse.c), whole and streamed, and the JSON re-printer behind streamed
 * arguments (src/text/json_reprint.c), checked against what they promise.
 *
 * Input: a syntax byte (the family), a flag byte (tools, reasoning, in_reasoning,
 * parallel_tool_calls off, a names list), then pieces of reply text, each a length byte
 * (0..31) and the bytes.
 *
 * Invariants, for any bytes:
 *   - whole calls (no stream_calls): the same content, reasoning and calls whether the text
 *     comes in the input's pieces or in one;
 *   - streamed calls: every call's first piece has an id ("call_" + 24) and a name, later
 *     pieces neither; indexes open 0, 1, ... in order; nothing follows a call's last piece and
 *     every call has one after finish (and after cut); chat_parser_n_calls counts them;
 *   - json_reprint, fed the same pieces: when the text is one JSON value cJSON reads whole and
 *     the re-printer finishes it, the output is cJSON_PrintUnformatted's, byte for byte. */
#include "fuzz_common.h"

#include <cjson/cJSON.h>

#include "text/chat_parse.h"
#include "text/json_reprint.h"

#define FZ_MAX_PIECE 31
#define FZ_MAX_CALLS 64

typedef struct folded {
    bytebuf content, reasoning, calls; /* calls: "index:name:args;" of whole calls */
    int opened;
    bool last[FZ_MAX_CALLS];
} folded;

static void fold(folded *f, chat_delta *d, bool streamed)
{
    bytebuf_append(&f->content, d->content.data ? d->content.data : "", d->content.len);
    bytebuf_append(&f->reasoning, d->reasoning.data ? d->reasoning.data : "", d->reasoning.len);
    for (int i = 0; i < d->n_calls; i++) {
        const chat_tool_call *c = &d->calls[i];
        FZ_CHECK(c->arguments != NULL);
        if (!streamed) {
            FZ_CHECK(c->id && c->name && c->last && c->index == f->opened);
            f->opened++;
            bytebuf_printf(&f->calls, "%d:%s:%s;", c->index, c->name, c->arguments);
            continue;
        }
        if (c->id) {
            FZ_CHECK(c->index == f->opened && f->opened < FZ_MAX_CALLS);
            FZ_CHECK(strncmp(c->id, "call_", 5) == 0 && strlen(c->id) == 29 && c->name);
            f->opened++;
        } else {
            FZ_CHECK(!c->name && c->index >= 0 && c->index < f->opened);
        }
        FZ_CHECK(!f->last[c->index]);
        f->last[c->index] = c->last;
    }
    chat_delta_clear(d);
}

/* Feeds the pieces (or, when whole, everything at once) and finishes or cuts. */
static void run(const chat_parse_opts *o, fz_in in, bool whole, bool cut, folded *f)
{
    chat_parser *p = chat_parser_new(o);
    FZ_CHECK(p);
    chat_delta d = {0};
    while (in.n) {
        size_t l = whole ? in.n : fz_u8(&in) % (FZ_MAX_PIECE + 1);
        if (l > in.n) l = in.n;
        FZ_CHECK(chat_parser_feed(p, (const char *)in.p, l, &d) == 0);
        fold(f, &d, o->stream_calls);
        in.p += l;
        in.n -= l;
    }
    FZ_CHECK((cut ? chat_parser_cut(p, &d) : chat_parser_finish(p, &d)) == 0);
    fold(f, &d, o->stream_calls);
    FZ_CHECK(chat_parser_n_calls(p) == f->opened);
    if (o->stream_calls)
        for (int i = 0; i < f->opened; i++) FZ_CHECK(f->last[i]);
    chat_parser_free(p);
    chat_delta_free(&d);
}

static void folded_free(folded *f)
{
    bytebuf_free(&f->content);
    bytebuf_free(&f->reasoning);
    bytebuf_free(&f->calls);
}

static bool same(const bytebuf *a, const bytebuf *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

/* The re-printer against cJSON on the text as one value. */
static void check_reprint(fz_in in, const char *text, size_t len)
{
    json_reprint r;
    json_reprint_init(&r);
    bytebuf out = {0};
    while (in.n && !json_reprint_done(&r) && !json_reprint_failed(&r)) {
        size_t l = fz_u8(&in) % (FZ_MAX_PIECE + 1);
        if (l > in.n) l = in.n;
        size_t used = json_reprint_feed(&r, (const char *)in.p, l, &out);
        FZ_CHECK(used <= l);
        in.p += l;
        in.n -= l;
    }
    FZ_CHECK(bytebuf_ok(&out));
    cJSON *v = cJSON_ParseWithLengthOpts(text, len + 1, NULL, true); /* with its NUL, as cJSON_Parse reads */
    if (v && json_reprint_done(&r)) {
        char *want = cJSON_PrintUnformatted(v);
        FZ_CHECK(want && strlen(want) == out.len && memcmp(want, out.data ? out.data : "", out.len) == 0);
        free(want);
    }
    cJSON_Delete(v);
    bytebuf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {"get_weather", "search", "f"};
    fz_in in = {data, size};
    uint8_t syn = fz_u8(&in), flags = fz_u8(&in);
    chat_parse_opts o = {.syntax = (chat_syntax)(syn % CHAT_SYNTAX_COUNT), .tools = flags & 1,
                         .reasoning = flags & 2, .in_reasoning = (flags & 6) == 6, .id_seed = 7,
                         .max_calls = flags & 8 ? 1 : 0, .names = flags & 16 ? names : NULL, .n_names = 3};

    /* the reply text itself, for the whole runs and the re-printer's comparison */
    bytebuf text = {0};
    for (fz_in scan = in; scan.n;) {
        size_t l = fz_u8(&scan) % (FZ_MAX_PIECE + 1);
        if (l > scan.n) l = scan.n;
        bytebuf_append(&text, scan.p, l);
        scan.p += l;
        scan.n -= l;
    }
    fz_in all = {(const uint8_t *)(text.data ? text.data : ""), text.len};

    folded split = {0}, one = {0}, streamed = {0}, cut = {0};
    run(&o, in, false, false, &split);
    run(&o, all, true, false, &one);
    FZ_CHECK(same(&split.content, &one.content) && same(&split.reasoning, &one.reasoning) && same(&split.calls, &one.calls));
    o.stream_calls = true;
    run(&o, in, false, false, &streamed);
    run(&o, in, false, true, &cut);
    check_reprint(in, text.data ? text.data : "", text.len);

    folded_free(&split);
    folded_free(&one);
    folded_free(&streamed);
    folded_free(&cut);
    bytebuf_free(&text);
    return 0;
}
