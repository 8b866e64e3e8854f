/* test_chat_parse.c - reasoning, content and tool calls out of recorded and crafted replies of
 * each family (src/text/chat_parse.c), fed whole, split at every byte boundary, and byte by
 * byte: the result must not depend on where the pieces break. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/chat_parse.h"
#include "text/json_reprint.h"

typedef struct result {
    char content[4096], reasoning[4096], calls[4096]; /* calls: "index:name:args;" */
} result;

static void absorb(result *r, chat_delta *d)
{
    strncat(r->content, d->content.data ? d->content.data : "", sizeof r->content - strlen(r->content) - 1);
    strncat(r->reasoning, d->reasoning.data ? d->reasoning.data : "", sizeof r->reasoning - strlen(r->reasoning) - 1);
    for (int i = 0; i < d->n_calls; i++) {
        char one[1024];
        /* always the server's own id: "call_" and 24 characters, never one the model wrote */
        assert_int_equal(strncmp(d->calls[i].id, "call_", 5), 0);
        assert_int_equal(strlen(d->calls[i].id), 29);
        snprintf(one, sizeof one, "%d:%s:%s;", d->calls[i].index, d->calls[i].name, d->calls[i].arguments);
        strncat(r->calls, one, sizeof r->calls - strlen(r->calls) - 1);
    }
    chat_delta_clear(d);
}

/* A streamed reply's calls (stream_calls) folded as a client folds them, checking what the
 * pieces promise: a call's first piece has our id and its name, later ones neither, nothing
 * follows its last, indexes open in order 0, 1, ... */
#define MAX_STREAMED 8
typedef struct streamed {
    int n;                    /* calls opened */
    char name[MAX_STREAMED][64];
    char args[MAX_STREAMED][1024];
    int fragments[MAX_STREAMED]; /* pieces with a non-empty fragment */
    bool last[MAX_STREAMED];
    size_t opened_at[MAX_STREAMED]; /* bytes fed when the call opened */
} streamed;

static void absorb_pieces(streamed *st, const chat_delta *d, size_t fed)
{
    for (int i = 0; i < d->n_calls; i++) {
        const chat_tool_call *c = &d->calls[i];
        assert_true(c->index >= 0 && c->index < MAX_STREAMED && c->index <= st->n);
        if (c->id) {
            assert_int_equal(c->index, st->n); /* a new call, the next index */
            assert_int_equal(strncmp(c->id, "call_", 5), 0);
            assert_int_equal(strlen(c->id), 29);
            assert_non_null(c->name);
            snprintf(st->name[st->n], sizeof st->name[0], "%s", c->name);
            st->opened_at[st->n] = fed;
            st->n++;
        } else {
            assert_true(c->index < st->n);
            assert_null(c->name);
        }
        assert_false(st->last[c->index]); /* nothing after the last piece */
        assert_non_null(c->arguments);
        if (c->arguments[0]) st->fragments[c->index]++;
        strncat(st->args[c->index], c->arguments, sizeof st->args[0] - strlen(st->args[c->index]) - 1);
        st->last[c->index] = c->last;
    }
}

/* The folded calls as "index:name:args;" (every call must have had its last piece). */
static void streamed_calls(const streamed *st, char *out, size_t cap)
{
    out[0] = 0;
    for (int i = 0; i < st->n; i++) {
        char one[1200];
        assert_true(st->last[i]);
        snprintf(one, sizeof one, "%d:%s:%s;", i, st->name[i], st->args[i]);
        strncat(out, one, cap - strlen(out) - 1);
    }
}

/* Content and reasoning of a delta into r (its calls left to absorb_pieces), then cleared. */
static void absorb_text(result *r, chat_delta *d)
{
    strncat(r->content, d->content.data ? d->content.data : "", sizeof r->content - strlen(r->content) - 1);
    strncat(r->reasoning, d->reasoning.data ? d->reasoning.data : "", sizeof r->reasoning - strlen(r->reasoning) - 1);
    chat_delta_clear(d);
}

/* Feeds text in pieces cut at the given offsets (cuts[0..n) ascending); with stream_calls the
 * pieces are folded (st, when given, keeps them) into r->calls.  cut: chat_parser_cut at the
 * end instead of chat_parser_finish. */
static void run_pieces(const chat_parse_opts *o, const char *text, const size_t *cuts, int n, bool cut, result *r,
                       streamed *st)
{
    memset(r, 0, sizeof *r);
    streamed own;
    if (!st) st = &own;
    memset(st, 0, sizeof *st);
    chat_parser *p = chat_parser_new(o);
    assert_non_null(p);
    chat_delta d = {0};
    size_t at = 0, len = strlen(text);
    for (int i = 0; i <= n + 1; i++) {
        size_t end = i < n ? cuts[i] : len;
        if (i <= n) assert_int_equal(chat_parser_feed(p, text + at, end - at, &d), 0);
        else assert_int_equal(cut ? chat_parser_cut(p, &d) : chat_parser_finish(p, &d), 0);
        if (o->stream_calls) {
            absorb_pieces(st, &d, end);
            absorb_text(r, &d);
        } else {
            absorb(r, &d);
        }
        at = end;
    }
    if (o->stream_calls) {
        streamed_calls(st, r->calls, sizeof r->calls);
        assert_int_equal(chat_parser_n_calls(p), st->n);
    }
    chat_parser_free(p);
    chat_delta_free(&d);
}

static void run_split(const chat_parse_opts *o, const char *text, const size_t *cuts, int n, result *r)
{
    run_pieces(o, text, cuts, n, false, r, NULL);
}

/* run_pieces fed byte by byte. */
static void run_bytes(const chat_parse_opts *o, const char *text, bool cut, result *r, streamed *st)
{
    size_t len = strlen(text);
    size_t *cuts = malloc(len * sizeof *cuts);
    assert_non_null(cuts);
    for (size_t k = 1; k < len; k++) cuts[k - 1] = k;
    run_pieces(o, text, cuts, (int)len - 1, cut, r, st);
    free(cuts);
}

/* Random cut points (a fixed generator: the same every run). */
static int random_cuts(const char *text, unsigned seed, size_t *cuts)
{
    size_t len = strlen(text), at = 0;
    int n = 0;
    for (;;) {
        seed = seed * 1103515245u + 12345u;
        at += 1 + (seed >> 16) % 7;
        if (at >= len) return n;
        cuts[n++] = at;
    }
}

static void check_mode(chat_parse_opts o, const char *text, const char *content, const char *reasoning_text,
                       const char *calls)
{
    result whole, r;
    run_split(&o, text, NULL, 0, &whole);
    assert_string_equal(whole.content, content);
    assert_string_equal(whole.reasoning, reasoning_text);
    assert_string_equal(whole.calls, calls);
    size_t len = strlen(text);
    for (size_t k = 1; k < len; k++) { /* every two-piece split */
        run_split(&o, text, &k, 1, &r);
        if (strcmp(r.content, content) || strcmp(r.reasoning, reasoning_text) || strcmp(r.calls, calls))
            fail_msg("split at %zu of %s:\n content [%s]\n reasoning [%s]\n calls [%s]", k, text, r.content,
                     r.reasoning, r.calls);
    }
    size_t *cuts = malloc(len * sizeof *cuts); /* byte by byte */
    for (size_t k = 1; k < len; k++) cuts[k - 1] = k;
    run_split(&o, text, cuts, (int)len - 1, &r);
    assert_string_equal(r.content, content);
    assert_string_equal(r.reasoning, reasoning_text);
    assert_string_equal(r.calls, calls);
    for (unsigned seed = 1; seed <= 20; seed++) { /* random pieces of 1..7 bytes */
        int n = random_cuts(text, seed, cuts);
        run_split(&o, text, cuts, n, &r);
        if (strcmp(r.content, content) || strcmp(r.reasoning, reasoning_text) || strcmp(r.calls, calls))
            fail_msg("seed %u of %s:\n content [%s]\n calls [%s]", seed, text, r.content, r.calls);
    }
    free(cuts);
}

/* Whole calls, and streamed (stream_calls): the same content, reasoning and calls however the
 * text is split -- a streamed call's fragments add up to the whole call's arguments. */
static void check_opts(chat_parse_opts o, const char *text, const char *content, const char *reasoning_text,
                       const char *calls)
{
    o.stream_calls = false;
    check_mode(o, text, content, reasoning_text, calls);
    o.stream_calls = true;
    check_mode(o, text, content, reasoning_text, calls);
}

static void check(chat_syntax syn, bool tools, bool reasoning, bool in_reasoning, const char *text,
                  const char *content, const char *reasoning_text, const char *calls)
{
    chat_parse_opts o = {.syntax = syn, .tools = tools, .reasoning = reasoning, .in_reasoning = in_reasoning, .id_seed = 7};
    check_opts(o, text, content, reasoning_text, calls);
}

static void test_hermes(void **state)
{
    (void)state;
    /* Qwen 2.5: text, then two calls separated by a newline. */
    check(CHAT_SYNTAX_HERMES, true, false, false,
          "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n"
          "<tool_call>\n{\"name\": \"search_docs\", \"arguments\": {\"query\": \"umbrella\", \"limit\": 3}}\n</tool_call>",
          "Let me check.", "",
          "0:get_weather:{\"city\":\"Paris\",\"unit\":\"celsius\"};1:search_docs:{\"query\":\"umbrella\",\"limit\":3};");
    /* Qwen 3 thinking, then only a call: content stays empty. */
    check(CHAT_SYNTAX_HERMES, true, true, false,
          "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
          "", "\nThe user wants weather.\n", "0:get_weather:{\"city\":\"Paris\"};");
    /* Look-alikes stay content; a broken call is given back as text. */
    check(CHAT_SYNTAX_HERMES, true, false, false, "a < b, <tool_x> and <tool_call not closed",
          "a < b, <tool_x> and <tool_call not closed", "", "");
    check(CHAT_SYNTAX_HERMES, true, false, false, "x<tool_call>not json</tool_call>y", "x<tool_call>not json</tool_call>y", "", "");
    /* Without tools the markup is content. */
    check(CHAT_SYNTAX_HERMES, false, false, false, "<tool_call>{\"name\": \"f\"}</tool_call>", "<tool_call>{\"name\": \"f\"}</tool_call>", "", "");
    /* An unclosed call at the end of the reply still counts when its JSON is whole. */
    check(CHAT_SYNTAX_HERMES, true, false, false, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", "", "", "0:f:{};");
}

static void test_llama3(void **state)
{
    (void)state;
    check(CHAT_SYNTAX_LLAMA3, true, false, false, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "",
          "0:get_weather:{\"city\":\"Paris\"};");
    check(CHAT_SYNTAX_LLAMA3, true, false, false, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"x}\"}}", "", "",
          "0:f:{\"q\":\"x}\"};");
    /* JSON that is not a call, and prose, are content. */
    check(CHAT_SYNTAX_LLAMA3, true, false, false, "{\"answer\": 42}", "{\"answer\": 42}", "", "");
    check(CHAT_SYNTAX_LLAMA3, true, false, false, "The answer is {42}.", "The answer is {42}.", "", "");
}

static void test_mistral(void **state)
{
    (void)state;
    check(CHAT_SYNTAX_MISTRAL, true, false, false,
          "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abc123def\"}, {\"name\": \"g\", \"arguments\": {}}]", "", "",
          "0:f:{\"a\":1};1:g:{};");
    check(CHAT_SYNTAX_MISTRAL, true, false, false, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "", "",
          "0:get_weather:{\"city\":\"Paris\"};");
    check(CHAT_SYNTAX_MISTRAL, true, false, false, "[TOOL] is not [TOOL_CALLS", "[TOOL] is not [TOOL_CALLS", "", "");
}

static void test_deepseek_v3(void **state)
{
    (void)state;
    check(CHAT_SYNTAX_DEEPSEEK_V3, true, false, false,
          "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n"
          "<｜tool▁call▁begin｜>function<｜tool▁sep｜>search_docs\n```json\n{\"query\": \"umbrella\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
          "", "", "0:get_weather:{\"city\":\"Paris\"};1:search_docs:{\"query\":\"umbrella\"};");
}

static void test_reasoning(void **state)
{
    (void)state;
    check(CHAT_SYNTAX_NONE, false, true, false, "<think>\n2+2 is 4.\n</think>\n\nIt is 4.", "It is 4.", "\n2+2 is 4.\n", "");
    /* The prompt opened <think> (R1 distills): the reply starts inside it. */
    check(CHAT_SYNTAX_NONE, false, true, true, "hmm </thi then</think>Answer", "Answer", "hmm </thi then", "");
    check(CHAT_SYNTAX_NONE, false, true, false, "  Hello <think> later", "  Hello <think> later", "", "");
    /* --reasoning-format none: all is content. */
    check(CHAT_SYNTAX_NONE, false, false, false, "<think>x</think>y", "<think>x</think>y", "", "");
}

static void test_detect_and_shape(void **state)
{
    (void)state;
    assert_int_equal(chat_syntax_detect("{{ '<tool_call>' }}"), CHAT_SYNTAX_HERMES);
    assert_int_equal(chat_syntax_detect("<|start_header_id|>"), CHAT_SYNTAX_LLAMA3);
    assert_int_equal(chat_syntax_detect("[TOOL_CALLS]"), CHAT_SYNTAX_MISTRAL);
    assert_int_equal(chat_syntax_detect("<｜tool▁calls▁begin｜>"), CHAT_SYNTAX_DEEPSEEK_V3);
    assert_int_equal(chat_syntax_detect(NULL), CHAT_SYNTAX_NONE);
    assert_int_equal(chat_syntax_detect("{{- '<|start|>assistant<|channel|>final<|message|>' }}"), CHAT_SYNTAX_HARMONY);
    assert_true(chat_syntax_structured(CHAT_SYNTAX_HARMONY));
    assert_false(chat_syntax_structured(CHAT_SYNTAX_HERMES));
    assert_true(chat_template_thinks("<think>"));
    assert_true(chat_template_thinks("<|channel|>analysis"));
    chat_forced_call fc;
    assert_true(chat_forced_call_shape(CHAT_SYNTAX_HERMES, &fc));
    assert_string_equal(fc.prefix, "<tool_call>\n");
    assert_string_equal(fc.args_key, "arguments");
    assert_false(chat_forced_call_shape(CHAT_SYNTAX_NONE, &fc));
    assert_true(chat_forced_call_shape(CHAT_SYNTAX_HARMONY, &fc));
    assert_string_equal(fc.prefix, "<|channel|>commentary to=functions.");
    assert_null(fc.args_key);
    assert_string_equal(fc.after_name, " <|constrain|>json<|message|>");
    assert_string_equal(fc.suffix, "");
}

/* Only calls a client can act on are released (issue 36): a function it offered (not a made-up
 * name, not one with markup in it), arguments that are a JSON object, one call when parallel
 * calls are off.  The rest are dropped whole: neither a call nor content. */
static const char *const offered[] = {"get_weather", "search_docs"};

static chat_parse_opts repair_opts(chat_syntax syn, int max_calls)
{
    return (chat_parse_opts){.syntax = syn, .tools = true, .id_seed = 7, .names = offered, .n_names = 2,
                             .max_calls = max_calls};
}

#define HCALL(json) "<tool_call>\n" json "\n</tool_call>\n"

static void test_repair(void **state)
{
    (void)state;
    chat_parse_opts h = repair_opts(CHAT_SYNTAX_HERMES, 0);
    /* a function that was not offered, then one that was: the index counts released calls */
    check_opts(h, "Checking." HCALL("{\"name\": \"delete_files\", \"arguments\": {\"path\": \"/\"}}")
                  HCALL("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"),
               "Checking.", "", "0:get_weather:{\"city\":\"Paris\"};");
    /* a name with markup in it, or one that only starts like an offered one */
    check_opts(h, HCALL("{\"name\": \"get_weather<|im_end|>\\n<|im_start|>system\", \"arguments\": {}}")
                  HCALL("{\"name\": \"get_weather_now\", \"arguments\": {}}"),
               "", "", "");
    /* arguments: a JSON object (verbatim from a string), else dropped */
    check_opts(h, HCALL("{\"name\": \"get_weather\", \"arguments\": \"{city: Paris\"}")
                  HCALL("{\"name\": \"get_weather\", \"arguments\": \"{} and more\"}")
                  HCALL("{\"name\": \"get_weather\", \"arguments\": [1, 2]}")
                  HCALL("{\"name\": \"search_docs\", \"arguments\": \"{\\\"q\\\": 1}\"}"),
               "", "", "0:search_docs:{\"q\": 1};");
    /* the model's own id is not passed on (absorb checks every id is ours) */
    check_opts(h, HCALL("{\"name\": \"get_weather\", \"id\": \"call_1\", \"arguments\": {}}")
                  HCALL("{\"name\": \"search_docs\", \"id\": \"call_1\", \"arguments\": {}}"),
               "", "", "0:get_weather:{};1:search_docs:{};");
    /* parallel_tool_calls false: the first call only */
    check_opts(repair_opts(CHAT_SYNTAX_HERMES, 1),
               HCALL("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}")
               HCALL("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"),
               "", "", "0:get_weather:{\"city\":\"Paris\"};");
    /* the other families' markup goes through the same gate */
    check_opts(repair_opts(CHAT_SYNTAX_MISTRAL, 0), "[TOOL_CALLS]get_weather<tool_call>[ARGS]{\"city\": \"Paris\"}", "", "", "");
    check_opts(repair_opts(CHAT_SYNTAX_MISTRAL, 1),
               "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {}}, {\"name\": \"search_docs\", \"arguments\": {}}]",
               "", "", "0:get_weather:{};");
    check_opts(repair_opts(CHAT_SYNTAX_DEEPSEEK_V3, 0),
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>run_shell\n```json\n{\"cmd\": \"ls\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
               "", "", "");
    check_opts(repair_opts(CHAT_SYNTAX_LLAMA3, 0), "{\"name\": \"run_shell\", \"parameters\": {\"cmd\": \"ls\"}}", "", "", "");

    /* what was dropped is counted, and a reply whose calls were all dropped has none */
    chat_parser *p = chat_parser_new(&h);
    chat_delta d = {0};
    const char *text = HCALL("{\"name\": \"nope\", \"arguments\": {}}") HCALL("{\"name\": \"get_weather\", \"arguments\": 5}");
    assert_int_equal(chat_parser_feed(p, text, strlen(text), &d), 0);
    assert_int_equal(chat_parser_finish(p, &d), 0);
    assert_int_equal(chat_parser_n_calls(p), 0);
    assert_int_equal(chat_parser_n_dropped(p), 2);
    assert_int_equal(d.n_calls, 0);
    assert_int_equal(d.content.len, 0);
    chat_parser_free(p);
    chat_delta_free(&d);
}

/* A reply cut by max_tokens, fed byte by byte then cut: what chat_parser_cut releases. */
static void check_cut(chat_syntax syn, const char *text, const char *content, const char *calls)
{
    static const char *const names[] = {"get_weather", "search"};
    chat_parse_opts o = {.syntax = syn, .tools = true, .id_seed = 7, .names = names, .n_names = 2};
    result r;
    memset(&r, 0, sizeof r);
    chat_parser *p = chat_parser_new(&o);
    assert_non_null(p);
    chat_delta d = {0};
    for (size_t i = 0; text[i]; i++) {
        assert_int_equal(chat_parser_feed(p, text + i, 1, &d), 0);
        absorb(&r, &d);
    }
    assert_int_equal(chat_parser_cut(p, &d), 0);
    absorb(&r, &d);
    chat_parser_free(p);
    chat_delta_free(&d);
    assert_string_equal(r.content, content);
    assert_string_equal(r.calls, calls);
}

/* Issue 33: a call cut short stays a (partial) call -- its name, its arguments as written --
 * and its markup never becomes content; a cut before the name is complete drops the call. */
static void test_cut_in_call(void **state)
{
    (void)state;
    check_cut(CHAT_SYNTAX_HERMES, "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os",
              "Let me look.", "0:get_weather:{\"city\": \"Os;");
    check_cut(CHAT_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arg", "", "0:get_weather:;");
    check_cut(CHAT_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"get_wea", "", "");
    check_cut(CHAT_SYNTAX_HERMES, "<tool_call>", "", "");
    check_cut(CHAT_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {", "", ""); /* not offered */
    /* complete calls before the cut go out whole */
    check_cut(CHAT_SYNTAX_HERMES,
              "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": 1}}\n</tool_call>\n<tool_call>\n"
              "{\"name\": \"get_weather\", \"arguments\": {\"c",
              "", "0:search:{\"q\":1};1:get_weather:{\"c;");
    check_cut(CHAT_SYNTAX_LLAMA3, "{\"name\": \"search\", \"parameters\": {\"q\": \"x", "", "0:search:{\"q\": \"x;");
    check_cut(CHAT_SYNTAX_MISTRAL, "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q", "", "0:search:{\"q;");
    check_cut(CHAT_SYNTAX_MISTRAL, "[TOOL_CALLS]search[ARGS]{\"q", "", "0:search:{\"q;");
    check_cut(CHAT_SYNTAX_DEEPSEEK_V3,
              "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"q\": ", "",
              "0:search:{\"q\": ;");
    /* cut in plain content: as chat_parser_finish */
    check_cut(CHAT_SYNTAX_HERMES, "Just text", "Just text", "");
}

/* ---- streamed calls (stream_calls, issue 33) ------------------------------------------------ */

static const char *const stream_names[] = {"get_weather", "search"};

static chat_parse_opts stream_opts(chat_syntax syn)
{
    return (chat_parse_opts){.syntax = syn, .tools = true, .id_seed = 7, .names = stream_names, .n_names = 2,
                             .stream_calls = true};
}

/* Fed byte by byte: the calls come out as the whole reply has them, each opened (id, name)
 * when the byte that begins its arguments arrived (opens[i]: that byte's offset in text),
 * each in at least min_fragments fragments. */
static void check_streamed(chat_syntax syn, const char *text, const char *calls, const size_t *opens, int min_fragments)
{
    chat_parse_opts o = stream_opts(syn);
    streamed st;
    result r, whole;
    run_bytes(&o, text, false, &r, &st);
    o.stream_calls = false;
    run_split(&o, text, NULL, 0, &whole);
    assert_string_equal(whole.calls, calls);
    assert_string_equal(r.calls, calls);
    assert_string_equal(r.content, "");
    for (int i = 0; i < st.n; i++) {
        if (st.fragments[i] < min_fragments) fail_msg("call %d of %s: %d fragments", i, text, st.fragments[i]);
        if (st.opened_at[i] != opens[i] + 1) fail_msg("call %d of %s opened at %zu, not %zu", i, text, st.opened_at[i], opens[i] + 1);
    }
}

/* The offset of the k-th (0-based) occurrence of needle in text. */
static size_t nth(const char *text, const char *needle, int k)
{
    const char *at = text - 1;
    for (int i = 0; i <= k; i++) at = strstr(at + 1, needle);
    assert_non_null(at);
    return (size_t)(at - text);
}

static void test_stream_families(void **state)
{
    (void)state;
    const char *h = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"umbrellas in Paris\", \"limit\": 10}}\n</tool_call>\n"
                    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    size_t ho[2] = {nth(h, "{\"query", 0), nth(h, "{\"city", 0)};
    check_streamed(CHAT_SYNTAX_HERMES, h, "0:search:{\"query\":\"umbrellas in Paris\",\"limit\":10};1:get_weather:{\"city\":\"Paris\"};", ho, 5);

    const char *l = "{\"name\": \"search\", \"parameters\": {\"query\": \"rain gear\"}}";
    size_t lo[1] = {nth(l, "{\"query", 0)};
    check_streamed(CHAT_SYNTAX_LLAMA3, l, "0:search:{\"query\":\"rain gear\"};", lo, 5);
    const char *lt = "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"x}\"}}";
    size_t lto[1] = {nth(lt, "{\"query", 0)};
    check_streamed(CHAT_SYNTAX_LLAMA3, lt, "0:search:{\"query\":\"x}\"};", lto, 5);

    const char *m = "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\": \"boots\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
    size_t mo[2] = {nth(m, "{\"query", 0), nth(m, "{\"city", 0)};
    check_streamed(CHAT_SYNTAX_MISTRAL, m, "0:search:{\"query\":\"boots\"};1:get_weather:{\"city\":\"Oslo\"};", mo, 5);
    const char *mn = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}";
    size_t mno[1] = {nth(mn, "{", 0)};
    check_streamed(CHAT_SYNTAX_MISTRAL, mn, "0:get_weather:{\"city\":\"Paris\"};", mno, 5);

    const char *ds = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n"
                     "<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"umbrella\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    size_t dso[2] = {nth(ds, "{", 0), nth(ds, "{", 1)};
    check_streamed(CHAT_SYNTAX_DEEPSEEK_V3, ds, "0:get_weather:{\"city\":\"Paris\"};1:search:{\"query\":\"umbrella\"};", dso, 5);
}

/* The fragments are the whole call's arguments to the byte: cJSON's print of what the model
 * wrote (spaces gone, escapes and numbers as cJSON prints them), however the text is split. */
static void test_stream_reprint(void **state)
{
    (void)state;
    static const char *const args[] = {
        "{ \"a\" : [ 1 , 2.50 , -0.0 , 1e2 , 12345678901234567890 , true , false , null ] }",
        "{\"s\": \"caf\\u00e9 \\/ \\\"q\\\" \\n\\t \\ud83d\\ude00 \\u0001 tab\\tend\", \"k\\u00e9y\": {}}",
        "{\"raw\": \"line\nbreak é 😀\", \"nested\": {\"x\": [[], [{}], {\"y\": -1.5E-3}]}}",
        "{\"cut\": \"a\\u0000b\", \"after\": 1}",
        "{}",
    };
    for (size_t i = 0; i < sizeof args / sizeof *args; i++) {
        cJSON *v = cJSON_Parse(args[i]);
        assert_non_null(v);
        char *printed = cJSON_PrintUnformatted(v);
        cJSON_Delete(v);
        char text[1024], calls[1200];
        snprintf(text, sizeof text, "<tool_call>\n{\"name\": \"search\", \"arguments\": %s}\n</tool_call>", args[i]);
        snprintf(calls, sizeof calls, "0:search:%s;", printed);
        check_opts(stream_opts(CHAT_SYNTAX_HERMES), text, "", "", calls);
        free(printed);
    }
}

/* The re-printer alone: what cJSON prints, byte by byte; where the value ends; refusals. */
static void test_json_reprint(void **state)
{
    (void)state;
    static const char *const good[] = {"{\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}", "[ ]", "\"x\\\\y\"", "-12.5e3 ", "true,"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        const char *t = good[i];
        json_reprint r;
        json_reprint_init(&r);
        bytebuf out = {0};
        size_t used = 0, len = strlen(t);
        for (size_t k = 0; k < len && !json_reprint_done(&r); k++) used += json_reprint_feed(&r, t + k, 1, &out);
        assert_true(json_reprint_done(&r));
        const char *end = NULL;
        cJSON *v = cJSON_ParseWithOpts(t, &end, false);
        char *want = cJSON_PrintUnformatted(v);
        assert_string_equal(out.data, want);
        assert_int_equal(used, len - (t[len - 1] == ' ' || t[len - 1] == ',')); /* the byte that ended it is not read */
        free(want);
        cJSON_Delete(v);
        bytebuf_free(&out);
    }
    static const char *const bad[] = {"{\"a\":1,}", "{\"a\" 1}", "[1 2]", "{\"a\":tru}", "\"\\ud800x\"", "\"\\q\"", "{\"a\"}", "]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_reprint r;
        json_reprint_init(&r);
        bytebuf out = {0};
        json_reprint_feed(&r, bad[i], strlen(bad[i]), &out);
        if (!json_reprint_failed(&r)) fail_msg("accepted %s", bad[i]);
        assert_null(cJSON_Parse(bad[i]));
        bytebuf_free(&out);
    }
    /* what is held when the text stops inside a number */
    json_reprint r;
    json_reprint_init(&r);
    bytebuf out = {0};
    json_reprint_feed(&r, "{\"n\": 12", 8, &out);
    size_t held_len;
    const char *held = json_reprint_held(&r, &held_len);
    assert_int_equal(held_len, 2);
    assert_memory_equal(held, "12", 2);
    assert_string_equal(out.data, "{\"n\":");
    bytebuf_free(&out);
}

/* A streamed call cut by max_tokens: it stays a call, ends with what was held of its
 * arguments (a number, an escape, as written), its markup never content. */
static void check_cut_streamed(chat_syntax syn, const char *text, const char *content, const char *calls)
{
    chat_parse_opts o = stream_opts(syn);
    result r;
    run_bytes(&o, text, true, &r, NULL);
    assert_string_equal(r.content, content);
    assert_string_equal(r.calls, calls);
}

static void test_stream_cut(void **state)
{
    (void)state;
    check_cut_streamed(CHAT_SYNTAX_HERMES, "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os",
                       "Let me look.", "0:get_weather:{\"city\":\"Os;");
    check_cut_streamed(CHAT_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": 12", "", "0:search:{\"q\":12;");
    check_cut_streamed(CHAT_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a\\u00", "",
                       "0:search:{\"q\":\"a\\u00;");
    /* before the arguments began: the call as chat_parser_cut finds it */
    check_cut_streamed(CHAT_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arg", "", "0:get_weather:;");
    check_cut_streamed(CHAT_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"get_wea", "", "");
    check_cut_streamed(CHAT_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {\"a", "", "");
    check_cut_streamed(CHAT_SYNTAX_MISTRAL,
                       "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q\": 1}}, {\"name\": \"get_weather\", \"arguments\": {\"c", "",
                       "0:search:{\"q\":1};1:get_weather:{\"c;");
    check_cut_streamed(CHAT_SYNTAX_DEEPSEEK_V3,
                       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"q\": ", "", "0:search:{\"q\":;");
    check_cut_streamed(CHAT_SYNTAX_LLAMA3, "{\"name\": \"search\", \"parameters\": {\"q\": [tr", "", "0:search:{\"q\":[tr;");
}

/* A streamed call whose JSON breaks after it opened ends there; its markup is not content. */
static void test_stream_broken(void **state)
{
    (void)state;
    result r;
    chat_parse_opts o = stream_opts(CHAT_SYNTAX_HERMES);
    run_bytes(&o, "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": 1 2}}\n</tool_call>after", false, &r, NULL);
    assert_string_equal(r.calls, "0:search:{\"q\":1;");
    assert_string_equal(r.content, "after");
}


/* ---- Harmony (gpt-oss) ---------------------------------------------------------------------- */

/* The prompt ends with <|start|>assistant: a reply begins inside its first message's header.
 * <|return|> and <|call|> end generation (the tokenizer stops there), so a recorded reply
 * usually ends without them; written as text they end their message too. */
#define HM_ANALYSIS "<|channel|>analysis<|message|>"
#define HM_NEXT "<|end|><|start|>assistant"
#define HM_CALL(name) "<|channel|>commentary to=functions." name " <|constrain|>json<|message|>"

static void check_harmony(bool tools, bool reasoning, const char *text, const char *content, const char *reasoning_text,
                          const char *calls)
{
    check(CHAT_SYNTAX_HARMONY, tools, reasoning, false, text, content, reasoning_text, calls);
}

static void test_harmony_channels(void **state)
{
    (void)state;
    /* analysis then final, as gpt-oss answers */
    check_harmony(false, true, HM_ANALYSIS "User asks 2+2. Simple: 4." HM_NEXT "<|channel|>final<|message|>2 + 2 = 4.",
                  "2 + 2 = 4.", "User asks 2+2. Simple: 4.", "");
    /* <|return|> written as text ends the reply: nothing after it is read */
    check_harmony(true, true, HM_ANALYSIS "Short." HM_NEXT "<|channel|>final<|message|>Yes.<|return|><|start|>user<|message|>more",
                  "Yes.", "Short.", "");
    /* several analysis messages, UTF-8 split anywhere, a final message with markup-like text */
    check_harmony(false, true, HM_ANALYSIS "Étape 1 😀" HM_NEXT HM_ANALYSIS "étape 2" HM_NEXT "<|channel|>final<|message|>a <| b < c |> d",
                  "a <| b < c |> d", "Étape 1 😀étape 2", "");
    /* the model re-opening its own turn, and the stray commentary before analysis gpt-oss-20b writes */
    check_harmony(false, true, "<|start|>assistant<|channel|>commentary to=assistant<|channel|>analysis<|message|>think" HM_NEXT
                  "<|channel|>final<|message|>ok", "ok", "think", "");
    /* no channel, and commentary without a recipient (a preamble): content */
    check_harmony(false, true, "<|message|>plain" HM_NEXT "<|channel|>commentary<|message|> and more", "plain and more", "", "");
    /* an unknown channel is not the answer: reasoning (content when reasoning is off) */
    check_harmony(false, true, "<|channel|>scratch<|message|>hidden" HM_NEXT "<|channel|>final<|message|>shown", "shown", "hidden", "");
    check_harmony(false, false, "<|channel|>scratch<|message|>hidden" HM_NEXT "<|channel|>final<|message|>shown", "hiddenshown", "", "");
    /* --reasoning-format none: the analysis message stays in content with its markup (as llama.cpp) */
    check_harmony(false, false, HM_ANALYSIS "think" HM_NEXT "<|channel|>final<|message|>done",
                  HM_ANALYSIS "think<|end|>done", "", "");
    /* a reply with no header (a grammar forced raw JSON, or a model that skipped it): content */
    check_harmony(true, true, "{\"answer\": 42}", "{\"answer\": 42}", "", "");
    check_harmony(false, true, "to be or not", "to be or not", "", "");
    /* the next message opened without <|end|> */
    check_harmony(false, true, HM_ANALYSIS "a<|channel|>final<|message|>b", "b", "a", "");
}

static void test_harmony_calls(void **state)
{
    (void)state;
    /* the recipient after the channel (what gpt-oss writes), analysis first, <|call|> as text or not */
    check_harmony(true, true, HM_ANALYSIS "Need the weather." HM_NEXT HM_CALL("get_weather") "{\"city\": \"Paris\", \"unit\": \"celsius\"}",
                  "", "Need the weather.", "0:get_weather:{\"city\":\"Paris\",\"unit\":\"celsius\"};");
    check_harmony(true, true, HM_CALL("get_weather") "{\"city\":\"Paris\"}<|call|>", "", "", "0:get_weather:{\"city\":\"Paris\"};");
    /* the recipient in the role header (as the template renders calls), and first in the reply */
    check_harmony(true, true, HM_ANALYSIS "x" HM_NEXT " to=functions.search<|channel|>commentary json<|message|>{\"query\": \"umbrella\"}<|call|>",
                  "", "x", "0:search:{\"query\":\"umbrella\"};");
    check_harmony(true, false, " to=functions.search<|channel|>commentary json<|message|>{\"query\": \"x}\"}", "", "",
                  "0:search:{\"query\":\"x}\"};");
    /* a preamble, then the call */
    check_harmony(true, true, "<|channel|>commentary<|message|>Let me check." HM_NEXT HM_CALL("get_weather") "{\"city\": \"Oslo\"}",
                  "Let me check.", "", "0:get_weather:{\"city\":\"Oslo\"};");
    /* parallel calls: Harmony ends generation at <|call|>, but written as text the next call is read */
    check_harmony(true, true, HM_CALL("get_weather") "{\"city\": \"Paris\"}<|call|><|start|>assistant" HM_CALL("search") "{\"query\": \"rain\"}<|call|>",
                  "", "", "0:get_weather:{\"city\":\"Paris\"};1:search:{\"query\":\"rain\"};");
    /* JSON with anything after it: the value is the arguments */
    check_harmony(true, true, HM_CALL("f") "{\"a\": [1, 2.5, null]}  \n", "", "", "0:f:{\"a\":[1,2.5,null]};");
    /* no tools offered, not JSON, not an object, no name: no call, no content */
    check_harmony(false, true, HM_CALL("get_weather") "{\"city\": \"Paris\"}", "", "", "");
    check_harmony(true, true, HM_CALL("f") "city=Paris" HM_NEXT "<|channel|>final<|message|>ok", "ok", "", "");
    check_harmony(true, true, HM_CALL("f") "[1, 2]", "", "", "");
    check_harmony(true, true, "<|channel|>commentary to= json<|message|>{}", "", "", "");
}

static void test_harmony_gate(void **state)
{
    (void)state;
    /* built-in tools (browser, python) and functions not offered are dropped; one call without
     * parallel calls */
    chat_parse_opts o = repair_opts(CHAT_SYNTAX_HARMONY, 0);
    o.reasoning = true;
    check_opts(o, "<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}" HM_NEXT HM_CALL("delete_files") "{}" HM_NEXT
                  HM_CALL("get_weather") "{\"city\": \"Rome\"}",
               "", "", "0:get_weather:{\"city\":\"Rome\"};");
    o = repair_opts(CHAT_SYNTAX_HARMONY, 1);
    check_opts(o, HM_CALL("search_docs") "{}<|call|>" HM_CALL("get_weather") "{}", "", "", "0:search_docs:{};");
    /* another party's turn written by the model is not the assistant's */
    check_opts(o, "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"t\": 20}" HM_NEXT
                  "<|channel|>final<|message|>done",
               "done", "", "");
    chat_parser *p = chat_parser_new(&o);
    chat_delta d = {0};
    const char *text = HM_CALL("nope") "{}<|call|>" HM_CALL("get_weather") "5";
    assert_int_equal(chat_parser_feed(p, text, strlen(text), &d), 0);
    assert_int_equal(chat_parser_finish(p, &d), 0);
    assert_int_equal(chat_parser_n_calls(p), 0);
    assert_int_equal(chat_parser_n_dropped(p), 2);
    chat_parser_free(p);
    chat_delta_free(&d);
}

/* Malformed markup never reaches content or reasoning, whatever the split: headers that never
 * end, markers cut off by the end of the reply, over-long headers. */
static void test_harmony_malformed(void **state)
{
    (void)state;
    check_harmony(true, true, "<|channel|>final", "", "", "");
    check_harmony(true, true, HM_ANALYSIS "think" HM_NEXT "<|channel|>fin", "", "think", "");
    check_harmony(true, true, "<|channel|>final<|message|>Hello <|en", "Hello ", "", "");
    check_harmony(true, true, "<|chan", "", "", "");
    check_harmony(true, true, "<|channel|>final<|end|>after", "after", "", "");
    char text[2048], *w = text;
    w += sprintf(w, "<|channel|>");
    for (int i = 0; i < 600; i++) *w++ = 'a';
    sprintf(w, "<|message|>x" HM_NEXT "<|channel|>final<|message|>ok");
    check_harmony(true, true, text, "ok", "", "");
    /* every prefix of a reply, finished there: no marker text, whole or in part, in content or
     * reasoning */
    const char *reply = HM_ANALYSIS "a" HM_NEXT "<|channel|>commentary<|message|>b" HM_NEXT HM_CALL("get_weather")
                        "{\"city\": \"<|x\"}<|call|><|start|>assistant<|channel|>final<|message|>c<|return|>";
    chat_parse_opts o = {.syntax = CHAT_SYNTAX_HARMONY, .tools = true, .reasoning = true, .id_seed = 7};
    for (size_t k = 0; k <= strlen(reply); k++) {
        char cut[512];
        snprintf(cut, sizeof cut, "%.*s", (int)k, reply);
        result r;
        run_split(&o, cut, NULL, 0, &r);
        if (strstr(r.content, "<|") || strstr(r.reasoning, "<|")) fail_msg("prefix %zu: [%s] [%s]", k, r.content, r.reasoning);
    }
}

static void test_harmony_stream(void **state)
{
    (void)state;
    const char *t = HM_CALL("get_weather") "{\"city\": \"Paris\", \"days\": [1, 2, 3]}";
    size_t opens[1] = {nth(t, "{", 0)};
    check_streamed(CHAT_SYNTAX_HARMONY, t, "0:get_weather:{\"city\":\"Paris\",\"days\":[1,2,3]};", opens, 5);
    const char *two = HM_CALL("search") "{\"query\": \"boots\"}<|call|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}";
    size_t opens2[2] = {nth(two, "{", 0), nth(two, "{", 1)};
    check_streamed(CHAT_SYNTAX_HARMONY, two, "0:search:{\"query\":\"boots\"};1:get_weather:{\"city\":\"Oslo\"};", opens2, 5);
    /* cut by max_tokens: a call stays a (partial) call; cut in its header after the name, a call
     * without arguments; cut inside the name, none */
    check_cut(CHAT_SYNTAX_HARMONY, "<|channel|>commentary<|message|>Looking." HM_NEXT HM_CALL("get_weather") "{\"city\": \"Os",
              "Looking.", "0:get_weather:{\"city\": \"Os;");
    check_cut(CHAT_SYNTAX_HARMONY, "<|channel|>commentary to=functions.get_weather <|constr", "", "0:get_weather:;");
    check_cut(CHAT_SYNTAX_HARMONY, "<|channel|>commentary to=functions.get_wea", "", "");
    check_cut(CHAT_SYNTAX_HARMONY, "<|channel|>final<|message|>Just text", "Just text", "");
    check_cut_streamed(CHAT_SYNTAX_HARMONY, HM_CALL("search") "{\"q\": 12", "", "0:search:{\"q\":12;");
    check_cut_streamed(CHAT_SYNTAX_HARMONY, HM_CALL("get_weather") "{\"city\": \"Os", "", "0:get_weather:{\"city\":\"Os;");
    /* a streamed call whose JSON breaks ends there; what follows its message is read on */
    result r;
    chat_parse_opts o = stream_opts(CHAT_SYNTAX_HARMONY);
    run_bytes(&o, HM_CALL("search") "{\"q\": 1 2}" HM_NEXT "<|channel|>final<|message|>after", false, &r, NULL);
    assert_string_equal(r.calls, "0:search:{\"q\":1;");
    assert_string_equal(r.content, "after");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repair),          cmocka_unit_test(test_cut_in_call),
        cmocka_unit_test(test_hermes),   cmocka_unit_test(test_llama3),    cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_deepseek_v3), cmocka_unit_test(test_reasoning), cmocka_unit_test(test_detect_and_shape),
        cmocka_unit_test(test_stream_families), cmocka_unit_test(test_stream_reprint), cmocka_unit_test(test_json_reprint),
        cmocka_unit_test(test_stream_cut), cmocka_unit_test(test_stream_broken),
        cmocka_unit_test(test_harmony_channels), cmocka_unit_test(test_harmony_calls), cmocka_unit_test(test_harmony_gate),
        cmocka_unit_test(test_harmony_malformed), cmocka_unit_test(test_harmony_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
