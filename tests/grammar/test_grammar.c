/* test_grammar.c - the grammar compilers, the byte matcher and the token masks (checked
 * against a brute-force walk of the vocabulary). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/rng.h"
#include "base/timing.h"
#include "grammar/grammar.h"
#include "grammar/grammar_impl.h" /* grammar_vocab_from_bytes */
#include "model/gguf.h"
#include "text/tokenizer.h"
#include "grammar_matches.h"

static const char *shared_dir(void)
{
    const char *d = getenv("INFERD_SHARED_DIR");
    return d && *d ? d : INFERD_SHARED_DIR;
}

static grammar *gbnf(const char *text)
{
    char err[256] = "";
    grammar *g = grammar_from_gbnf(text, strlen(text), err, sizeof err);
    if (!g) fprintf(stderr, "gbnf: %s\n", err);
    return g;
}

/* Whether text is a complete sentence of g (bytes only, no vocabulary). */


static grammar *schema_text(const char *json, char *err, size_t errlen)
{
    cJSON *j = cJSON_Parse(json);
    assert_non_null(j);
    grammar *g = grammar_from_json_schema(j, err, errlen);
    cJSON_Delete(j);
    return g;
}

static void test_gbnf_basics(void **state)
{
    (void)state;
    grammar *g = gbnf("root ::= \"a\" b+ [x-z]? # comment\nb ::= \"b\" | \"c\"\n");
    assert_non_null(g);
    assert_true(matches(g, "ab"));
    assert_true(matches(g, "abcbx"));
    assert_false(matches(g, "a"));
    assert_false(matches(g, "abw"));
    grammar_unref(g);
    g = gbnf("root ::= [^\"\\\\]{2,3} \"é\" .");
    assert_non_null(g);
    assert_true(matches(g, "xyé€"));
    assert_true(matches(g, "ωωωé😀"));
    assert_false(matches(g, "x\"é!"));
    assert_false(matches(g, "xé!"));
    assert_false(matches(g, "xyé\xed\xa0\x80")); /* a surrogate is not UTF-8 */
    grammar_unref(g);
}

static void test_gbnf_refusals(void **state)
{
    (void)state;
    const char *bad[][2] = {
        {"root ::= root \"a\" | \"b\"", "left recursion"},
        {"root ::= x? root \"a\"\nx ::= \"y\"", "left recursion"},
        {"root ::= a", "undefined rule: a"},
        {"a ::= \"x\"", "no `root`"},
        {"root ::= \"x\"{5,2}", "repetition"},
        {"root ::= \"x\"{100000}", "repetition"},
        {"root ::= \"abc", "unterminated"},
        {"root ::= (\"a\"", "missing )"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= \"\\q\"", "unknown escape"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        grammar *g = grammar_from_gbnf(bad[i][0], strlen(bad[i][0]), err, sizeof err);
        if (g || !strstr(err, bad[i][1])) fprintf(stderr, "case %zu: %s\n", i, err);
        assert_null(g);
        assert_non_null(strstr(err, bad[i][1]));
    }
    /* Deep nesting is refused, not a stack overflow. */
    char deep[4096] = "root ::= ";
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    char err[256];
    assert_null(grammar_from_gbnf(deep, strlen(deep), err, sizeof err));
}

static void test_schema(void **state)
{
    (void)state;
    char err[256] = "";
    grammar *g = schema_text("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
                             "\"age\":{\"type\":\"integer\",\"minimum\":18,\"maximum\":130},"
                             "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2},"
                             "\"kind\":{\"const\":\"x\"},\"d\":{\"type\":\"string\",\"format\":\"date\"}},"
                             "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
                             err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "{\"name\":\"bob\",\"age\":42}"));
    assert_true(matches(g, "{ \"name\": \"bob\", \"age\": 130, \"tags\": [\"a\", \"b\"], \"kind\": \"x\" }"));
    assert_true(matches(g, "{\"name\":\"\",\"age\":18,\"d\":\"2024-02-28\"}"));
    assert_false(matches(g, "{\"name\":\"bob\"}"));                  /* age required */
    assert_false(matches(g, "{\"name\":\"bobbob\",\"age\":42}"));     /* maxLength */
    assert_false(matches(g, "{\"name\":\"b\",\"age\":17}"));          /* minimum */
    assert_false(matches(g, "{\"name\":\"b\",\"age\":131}"));         /* maximum */
    assert_false(matches(g, "{\"name\":\"b\",\"age\":42,\"x\":1}"));  /* additionalProperties */
    assert_false(matches(g, "{\"name\":\"b\",\"age\":42,\"tags\":[\"a\",\"a\",\"a\"]}"));
    assert_false(matches(g, "{\"age\":42,\"name\":\"b\"}")); /* properties come in schema order */
    grammar_unref(g);

    g = schema_text("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":[\"integer\",\"null\"]},"
                    "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},"
                    "\"$ref\":\"#/$defs/node\"}",
                    err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "{\"v\":1,\"next\":{\"v\":null,\"next\":null}}"));
    assert_false(matches(g, "{\"v\":1,\"next\":{\"v\":\"x\",\"next\":null}}"));
    grammar_unref(g);

    g = schema_text("{\"type\":\"integer\",\"minimum\":-25,\"maximum\":1234}", err, sizeof err);
    assert_non_null(g);
    for (int v = -40; v <= 1300; v++) {
        char t[16];
        snprintf(t, sizeof t, "%d", v);
        assert_int_equal(matches(g, t), v >= -25 && v <= 1234);
    }
    assert_false(matches(g, "007"));
    grammar_unref(g);

    /* zod 4's z.number().int(): the safe-integer range is no bound (issue 33: the Agents SDK's
     * tools); one side kept when the other is the safe bound */
    g = schema_text("{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "-12") && matches(g, "0") && matches(g, "123456789"));
    grammar_unref(g);
    g = schema_text("{\"type\":\"integer\",\"minimum\":1,\"maximum\":9007199254740991}", err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "1") && matches(g, "99999"));
    assert_false(matches(g, "0") || matches(g, "-3"));
    grammar_unref(g);
    /* as a tools array printed by cJSON and read back writes it (15 digits) */
    g = schema_text("{\"type\":\"integer\",\"minimum\":-9.00719925474099e+15,\"maximum\":9.00719925474099e+15}", err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "-12"));
    grammar_unref(g);
    assert_null(schema_text("{\"type\":\"integer\",\"minimum\":0,\"maximum\":5e15}", err, sizeof err));

    g = schema_text("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}(x|yz)?$\"}", err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "\"AB-123\""));
    assert_true(matches(g, "\"AB-123yz\""));
    assert_false(matches(g, "\"AB-12\""));
    grammar_unref(g);

    const char *bad[][2] = {
        {"{\"type\":\"string\",\"contentEncoding\":\"base64\"}", "unsupported JSON schema keyword: contentEncoding"},
        {"{\"type\":\"object\",\"minProperties\":2}", "minProperties"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "multipleOf"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "hostname"},
        {"{\"$ref\":\"#/$defs/missing\"}", "$ref"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookarounds"},
        {"{\"type\":\"frob\"}", "unknown type"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g = schema_text(bad[i][0], err, sizeof err);
        if (g || !strstr(err, bad[i][1])) fprintf(stderr, "case %zu: %s\n", i, err);
        assert_null(g);
        assert_non_null(strstr(err, bad[i][1]));
    }
}

static void test_choices_regex_builder(void **state)
{
    (void)state;
    char err[256];
    const char *ch[] = {"yes", "no", "maybe \"so\""};
    grammar *g = grammar_from_choices(ch, 3, err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "maybe \"so\""));
    assert_false(matches(g, "ye"));
    grammar_unref(g);
    g = grammar_from_regex("(ab|c)+\\.[0-9]{2}", strlen("(ab|c)+\\.[0-9]{2}"), err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "abcab.12"));
    assert_false(matches(g, "abcab.1"));
    grammar_unref(g);

    grammar_builder *b = grammar_builder_new();
    cJSON *p1 = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}");
    cJSON *p2 = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}");
    assert_true(grammar_builder_add(b, "<tool_call>{\"name\": \"weather\", \"arguments\": ", p1, "}</tool_call>", err, sizeof err));
    assert_true(grammar_builder_add(b, "<tool_call>{\"name\": \"count\", \"arguments\": ", p2, "}</tool_call>", err, sizeof err));
    g = grammar_builder_finish(b, err, sizeof err);
    assert_non_null(g);
    assert_true(matches(g, "<tool_call>{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>"));
    assert_true(matches(g, "<tool_call>{\"name\": \"count\", \"arguments\": {\"n\": 3}}</tool_call>"));
    assert_false(matches(g, "<tool_call>{\"name\": \"count\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>"));
    grammar_unref(g);
    cJSON_Delete(p1);
    cJSON_Delete(p2);
}

/* ---- masks against a real vocabulary ----------------------------------------------------- */

typedef struct vocab_fx {
    gguf_file *f;
    tokenizer *t;
    grammar_vocab *v;
} vocab_fx;

static bool open_vocab(const char *name, vocab_fx *fx)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", shared_dir(), name);
    fx->f = gguf_open(path, err, sizeof err);
    if (!fx->f) return false;
    fx->t = tokenizer_load(fx->f, err, sizeof err);
    assert_non_null(fx->t);
    fx->v = grammar_vocab_new(fx->t);
    assert_non_null(fx->v);
    return true;
}

static void close_vocab(vocab_fx *fx)
{
    grammar_vocab_free(fx->v);
    tokenizer_free(fx->t);
    gguf_close(fx->f);
}

/* Random walks under g: at every step the mask must equal what trying every token says, and
 * every walk that finishes must parse as JSON when json is set. */
static void walk(vocab_fx *fx, grammar *g, int n_walks, int max_steps, bool brute, bool json)
{
    int n_vocab = tokenizer_n_vocab(fx->t), W = grammar_vocab_n_words(fx->v);
    uint32_t *mask = malloc((size_t)W * sizeof *mask);
    int32_t *allowed = malloc((size_t)n_vocab * sizeof *allowed);
    assert_non_null(mask);
    uint64_t seed = 12345;
    for (int w = 0; w < n_walks; w++) {
        grammar_matcher *m = grammar_matcher_new(g, fx->v);
        assert_non_null(m);
        char text[8192];
        size_t len = 0;
        for (int step = 0; step < max_steps && !grammar_matcher_is_done(m); step++) {
            int n = grammar_matcher_fill_mask(m, mask);
            int k = 0;
            for (int id = 0; id < n_vocab; id++)
                if (mask[id >> 5] >> (id & 31) & 1u) allowed[k++] = id;
            assert_int_equal(k, n);
            if (brute && (step < 3 || step % 7 == 0)) {
                for (int id = 0; id < n_vocab; id++) {
                    grammar_matcher *c = grammar_matcher_clone(m);
                    bool ok = grammar_matcher_accept(c, id);
                    grammar_matcher_free(c);
                    if (ok != (bool)(mask[id >> 5] >> (id & 31) & 1u))
                        fprintf(stderr, "step %d token %d (%s): brute %d mask %d\n", step, id,
                                tokenizer_token_text(fx->t, id, NULL), ok, !ok);
                    assert_int_equal(ok, (bool)(mask[id >> 5] >> (id & 31) & 1u));
                }
            }
            if (n == 0) break;
            /* Prefer closing tokens half the time so that walks finish. */
            seed = rng_splitmix64(seed);
            int32_t id = allowed[seed % (uint64_t)n];
            assert_true(grammar_matcher_accept(m, id));
            if (!tokenizer_is_eog(fx->t, id)) {
                char b[256];
                int l = tokenizer_token_bytes(fx->t, id, false, b, sizeof b);
                if (len + (size_t)l < sizeof text) {
                    memcpy(text + len, b, (size_t)l);
                    len += (size_t)l;
                }
            }
        }
        text[len] = 0;
        if (json && grammar_matcher_is_complete(m)) {
            cJSON *j = cJSON_Parse(text);
            if (!j) fprintf(stderr, "not JSON: %s\n", text);
            assert_non_null(j);
            cJSON_Delete(j);
        }
        grammar_matcher_free(m);
    }
    free(mask);
    free(allowed);
}

static void test_masks_brute_force(void **state)
{
    (void)state;
    vocab_fx fx;
    if (!open_vocab("llama-bpe", &fx)) {
        fprintf(stderr, "SKIP: no llama-bpe vocabulary under %s/vocab\n", shared_dir());
        skip();
    }
    char err[256];
    grammar *g = schema_text("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                             "\"n\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"},"
                             "\"list\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":3}},"
                             "\"required\":[\"name\",\"n\"]}",
                             err, sizeof err);
    assert_non_null(g);
    walk(&fx, g, 3, 40, true, true);
    grammar_unref(g);
    g = grammar_json_object(err, sizeof err);
    walk(&fx, g, 3, 30, true, false);
    grammar_unref(g);
    const char *ch[] = {"red", "green", "blue", "reddish"};
    g = grammar_from_choices(ch, 4, err, sizeof err);
    walk(&fx, g, 5, 10, true, false);
    grammar_unref(g);
    close_vocab(&fx);
}

/* ---- fast masks against a brute-force reference -------------------------------------------- */

/* A vocabulary with its token bytes at hand, for the reference: token i is allowed iff a copy of
 * the matcher accepts it (the byte matcher run on its bytes; end-of-generation only when the
 * grammar is complete; control tokens never). */
typedef struct tvocab {
    grammar_vocab *v;
    int n;
    char **tok;
    int *len; /* 0: a control token */
    bool *eog;
} tvocab;

static void tvocab_free(tvocab *tv)
{
    for (int i = 0; i < tv->n; i++) free(tv->tok[i]);
    free(tv->tok);
    free(tv->len);
    free(tv->eog);
    grammar_vocab_free(tv->v);
}

static void tvocab_add(tvocab *tv, const char *b, int len)
{
    tv->tok[tv->n] = malloc((size_t)len + 1);
    memcpy(tv->tok[tv->n], b, (size_t)len);
    tv->len[tv->n++] = len;
}

/* A small vocabulary that still has what makes masks hard: every byte, JSON punctuation
 * runs that cross rule ends (`",`, `"}`, `":"`), digit and hex runs longer than a bounded
 * repetition's rest, whitespace runs, escapes, split UTF-8, tokens longer than the walks go
 * (over 128 bytes), random pieces, a control token and an end-of-generation token. */
static void synthetic_vocab(tvocab *tv)
{
    static const char *pieces[] = {
        "\":", "\",", "\"}", "},", "\":\"", ", \"", "{\"", "[\"", "\"]", "\"]}", "\",\"", "\": ", "\": \"", "}}",
        "\n", "\n\n", "\n  ", "  ", "   ", " \"", " {", "\t", "12", "345", "2024", "-0", "0-", "00", "150", "1.5",
        "e+", "1e", "ab", "f0a", "dead", "beef", "0a1b2c3d", "-4", "a-b", "name", "age", "id", "true", "false",
        "null", "admin", "user", "guest", "\"admin\"", "@", "example", ".com", "a@b", "x.y", "T12", ":30", "Z\"",
        "\xc3\xa9", "\xc3", "\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "\xe6\x97", "\xf0\x9f\x98", "\x80", "\\n", "\\u00e9",
        "\\u", "\\\"", "\\", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abcdefghijklm", "street", "city",
        "zip", "tags", "score", "email", "active", "role", "created", "address", "\"x\"", "xx", "xxx", "b!", "ab12",
    };
    int cap = 256 + 200 + 2200;
    tv->tok = calloc((size_t)cap, sizeof *tv->tok);
    tv->len = calloc((size_t)cap, sizeof *tv->len);
    tv->eog = calloc((size_t)cap, sizeof *tv->eog);
    tv->n = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        tvocab_add(tv, &c, 1);
    }
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) tvocab_add(tv, pieces[i], (int)strlen(pieces[i]));
    char longtok[140];
    memset(longtok, 'x', sizeof longtok);
    tvocab_add(tv, longtok, 140);
    memset(longtok, ' ', sizeof longtok);
    tvocab_add(tv, longtok, 131);
    static const char alpha[] = "abcdefx0123456789-.:\"{}[], \n@TZe+\\u";
    uint64_t seed = 99;
    for (int i = 0; i < 2000; i++) {
        char b[16];
        seed = rng_splitmix64(seed);
        int len = 2 + (int)(seed % 9);
        for (int j = 0; j < len; j++) {
            seed = rng_splitmix64(seed);
            b[j] = alpha[seed % (sizeof alpha - 1)];
        }
        tvocab_add(tv, b, len);
    }
    tv->len[tv->n] = 0; /* a control token */
    tv->tok[tv->n++] = NULL;
    int32_t eog = tv->n;
    tv->len[tv->n] = 0;
    tv->tok[tv->n++] = NULL;
    tv->eog[eog] = true;
    tv->v = grammar_vocab_from_bytes((const char *const *)tv->tok, tv->len, tv->n, &eog, 1);
    assert_non_null(tv->v);
}

static bool real_vocab(const char *name, tvocab *tv)
{
    vocab_fx fx;
    if (!open_vocab(name, &fx)) return false;
    int n = tokenizer_n_vocab(fx.t);
    tv->tok = calloc((size_t)n, sizeof *tv->tok);
    tv->len = calloc((size_t)n, sizeof *tv->len);
    tv->eog = calloc((size_t)n, sizeof *tv->eog);
    tv->n = 0;
    for (int i = 0; i < n; i++) {
        char b[1024];
        int l = tokenizer_is_control(fx.t, i) ? 0 : tokenizer_token_bytes(fx.t, i, false, b, sizeof b);
        tvocab_add(tv, b, l > 0 ? l : 0);
        tv->eog[i] = tokenizer_is_eog(fx.t, i);
    }
    tv->v = fx.v;
    fx.v = NULL;
    close_vocab(&fx);
    return true;
}

/* Random walks under g; every brute_every steps the mask must equal the reference's verdict
 * on every token.  Walks pick uniformly among the allowed tokens, except that they take an
 * end-of-generation token when one is allowed every other time, so that they finish. */
static void check_walks(tvocab *tv, grammar *g, uint64_t seed, int n_walks, int max_steps, int brute_every)
{
    int W = grammar_vocab_n_words(tv->v);
    uint32_t *mask = malloc((size_t)W * sizeof *mask);
    int32_t *allowed = malloc((size_t)tv->n * sizeof *allowed);
    for (int w = 0; w < n_walks; w++) {
        grammar_matcher *m = grammar_matcher_new(g, tv->v);
        assert_non_null(m);
        for (int step = 0; step < max_steps && !grammar_matcher_is_done(m); step++) {
            int n = grammar_matcher_fill_mask(m, mask), k = 0;
            int32_t eog = -1;
            for (int id = 0; id < tv->n; id++)
                if (mask[id >> 5] >> (id & 31) & 1u) {
                    allowed[k++] = id;
                    if (tv->eog[id]) eog = id;
                    assert_true(tv->len[id] > 0 || tv->eog[id]); /* control tokens never */
                    if (tv->eog[id]) assert_true(grammar_matcher_is_complete(m));
                }
            assert_int_equal(k, n);
            if (step % brute_every == 0) {
                grammar_matcher *c = grammar_matcher_clone(m); /* a refused token leaves it as it was */
                for (int id = 0; id < tv->n; id++) {
                    bool ok = grammar_matcher_accept(c, id), got = mask[id >> 5] >> (id & 31) & 1u;
                    if (ok) {
                        grammar_matcher_free(c);
                        c = grammar_matcher_clone(m);
                    }
                    if (ok != got)
                        fprintf(stderr, "walk %d step %d token %d (%.*s): reference %d mask %d\n", w, step, id,
                                tv->len[id], tv->tok[id] ? tv->tok[id] : "", ok, got);
                    assert_int_equal(ok, got);
                }
                grammar_matcher_free(c);
            }
            if (!n) break;
            seed = rng_splitmix64(seed);
            int32_t id = eog >= 0 && (seed >> 40) % 2 ? eog : allowed[seed % (uint64_t)n];
            assert_true(grammar_matcher_accept(m, id));
        }
        grammar_matcher_free(m);
    }
    free(mask);
    free(allowed);
}

/* Schemas and grammars whose masks depend on repetition counts: bounded string lengths,
 * patterns with {m,n} (nested, with a minimum), formats made of fixed-length runs, enums,
 * nested objects, arrays with minItems/maxItems, and GBNF with nullable or ambiguous
 * repeated elements (which the tables must not treat as counted). */
static const char *const REP_SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":\"email\"},"
    "\"active\":{\"type\":\"boolean\"},\"score\":{\"type\":\"number\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":5},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"[0-9]{5}\"}},\"required\":[\"street\",\"city\"]},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},\"created\":{\"type\":\"string\",\"format\":\"date-time\"}},"
    "\"required\":[\"id\",\"name\",\"age\",\"active\",\"address\",\"role\"]}",
    "{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}",
    "{\"type\":\"string\",\"pattern\":\"^[a-c]{2,4}(x[0-9]{1,3}){0,2}$\"}",
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}",
    "{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"object\",\"properties\":{"
    "\"k\":{\"enum\":[\"ab\",\"abc\",12]},\"s\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"k\"]},"
    "\"d\":{\"type\":\"string\",\"format\":\"date\"}},\"required\":[\"o\"]}",
};
static const char *const REP_GBNF[] = {
    "root ::= (\"ab\" [0-9]{1,3}){2,5} \"!\"",
    "root ::= (\"a\"?){2,4} \"b\" [a-f]{3}",
    "root ::= (\"x\" | \"xx\"){1,6} (\"b\" | \"!\")",
    "root ::= ([0-9a-f]{2} \"-\"?){3} \"x\"{0,130}",
};

static void check_all(tvocab *tv, int n_walks, int max_steps, int brute_every)
{
    char err[256];
    for (size_t i = 0; i < sizeof REP_SCHEMAS / sizeof REP_SCHEMAS[0]; i++) {
        grammar *g = schema_text(REP_SCHEMAS[i], err, sizeof err);
        if (!g) fprintf(stderr, "schema %zu: %s\n", i, err);
        assert_non_null(g);
        check_walks(tv, g, 1000 + i, n_walks, max_steps, brute_every);
        grammar_unref(g);
    }
    for (size_t i = 0; i < sizeof REP_GBNF / sizeof REP_GBNF[0]; i++) {
        grammar *g = gbnf(REP_GBNF[i]);
        assert_non_null(g);
        check_walks(tv, g, 2000 + i, n_walks, max_steps, brute_every);
        grammar_unref(g);
    }
}

static void test_masks_synthetic_vocab(void **state)
{
    (void)state;
    tvocab tv;
    synthetic_vocab(&tv);
    check_all(&tv, 12, 120, 1);
    tvocab_free(&tv);
}

static void test_masks_real_vocab(void **state)
{
    (void)state;
    static const char *names[] = {"qwen2", "llama-bpe"};
    int found = 0;
    for (int i = 0; i < 2; i++) {
        tvocab tv;
        if (!real_vocab(names[i], &tv)) {
            fprintf(stderr, "SKIP part: no %s vocabulary under %s/vocab\n", names[i], shared_dir());
            continue;
        }
        found++;
        check_all(&tv, 2, 50, 10);
        tvocab_free(&tv);
    }
    if (!found) skip();
}

/* ---- grammars that would take exponential time ------------------------------------------------ */

/* Nested bounded repetitions of something that may be empty (issue 36): each used to take
 * minutes (9^depth ways to spend empty iterations, enumerated at the start and after every
 * byte), on the HTTP worker that compiles and on the scheduler thread that masks.  Bound:
 * the whole test under 60 s of wall time even under a sanitizer on a loaded machine (alarm:
 * a hang kills the test instead of stalling the suite); each bomb measured in well under a
 * second here. */
static const char *const BOMB_REGEXES[] = {
    "^x((a{0,8}){0,8}){0,8}b$",
    "x((((((a{0,8}){0,8}){0,8}){0,8}){0,8}){0,8}){0,8}b",
    "x((a?){0,1000}){0,1000}b",
};

/* x a^n b in the bomb's language, checked by bytes: inside iff n <= max_a (-1: no limit as
 * far as this looks, which is 100). */
static void check_bomb_language(grammar *g, const char *open, const char *close, int max_a)
{
    int bounded[] = {0, 1, 7, 63, 511, 512, 513}, unbounded[] = {0, 1, 7, 63, 100};
    const int *ns = max_a < 0 ? unbounded : bounded;
    size_t count = max_a < 0 ? sizeof unbounded / sizeof *unbounded : sizeof bounded / sizeof *bounded;
    for (size_t i = 0; i < count; i++) {
        int n = ns[i];
        char *text = malloc((size_t)n + 16);
        int len = sprintf(text, "%sx", open);
        memset(text + len, 'a', (size_t)n);
        sprintf(text + len + n, "b%s", close);
        assert_int_equal(matches(g, text), max_a < 0 || n <= max_a);
        free(text);
    }
}

static void test_bombs(void **state)
{
    (void)state;
    alarm(60);
    double t0 = timing_now_ms();
    char err[256];
    tvocab tv;
    synthetic_vocab(&tv);
    int max_a[] = {512, -1, -1};
    for (size_t i = 0; i < sizeof BOMB_REGEXES / sizeof BOMB_REGEXES[0]; i++) {
        double t = timing_now_ms();
        grammar *g = grammar_from_regex(BOMB_REGEXES[i], strlen(BOMB_REGEXES[i]), err, sizeof err);
        if (!g) fprintf(stderr, "regex %s: %s\n", BOMB_REGEXES[i], err);
        assert_non_null(g);
        check_bomb_language(g, "", "", max_a[i]);
        check_walks(&tv, g, 3000 + i, 2, 40, 4);
        grammar_unref(g);
        fprintf(stderr, "guided_regex %s: %.0f ms\n", BOMB_REGEXES[i], timing_now_ms() - t);
    }
    /* the same as a JSON schema pattern (response_format json_schema) */
    double t = timing_now_ms();
    grammar *g = schema_text("{\"type\":\"string\",\"pattern\":\"^x((a{0,8}){0,8}){0,8}b$\"}", err, sizeof err);
    assert_non_null(g);
    check_bomb_language(g, "\"", "\"", 512);
    check_walks(&tv, g, 3100, 2, 40, 4);
    grammar_unref(g);
    fprintf(stderr, "json_schema pattern: %.0f ms\n", timing_now_ms() - t);
    /* and as GBNF (the 40-byte body that pinned an HTTP worker for over ten minutes) */
    t = timing_now_ms();
    g = gbnf("root ::= (((\"a\"{0,8}){0,8}){0,8}) \"b\"");
    assert_non_null(g);
    assert_true(matches(g, "b"));
    assert_true(matches(g, "aaaaaaaaaaab"));
    check_walks(&tv, g, 3200, 2, 40, 4);
    grammar_unref(g);
    fprintf(stderr, "gbnf: %.0f ms\n", timing_now_ms() - t);
    /* Ambiguity that is not repetition: root ::= r1 | r1, r1 ::= r2 | r2, ... r23 ::= "y" has
     * 2^24 ways to reach its first byte; refused at compile time, as the client's error. */
    t = timing_now_ms();
    char text[2048];
    int len = snprintf(text, sizeof text, "root ::= r1 | r1\n");
    for (int r = 1; r < 23; r++) len += snprintf(text + len, sizeof text - (size_t)len, "r%d ::= r%d | r%d\n", r, r + 1, r + 1);
    len += snprintf(text + len, sizeof text - (size_t)len, "r23 ::= \"y\"\n");
    g = grammar_from_gbnf(text, (size_t)len, err, sizeof err);
    assert_null(g);
    assert_non_null(strstr(err, "too ambiguous"));
    fprintf(stderr, "2^24 derivations: refused in %.0f ms (%s)\n", timing_now_ms() - t, err);
    tvocab_free(&tv);
    fprintf(stderr, "bombs: %.0f ms in all (bound: 60 s)\n", timing_now_ms() - t0);
    alarm(0);
}

/* fill_mask_until: past its deadline a mask is GRAMMAR_MASK_LATER and what was built is kept;
 * calls with longer deadlines (as the scheduler gives) end with the mask a call without one
 * makes.  Bounded: at most 24 calls, the last with a deadline of about 8 s. */
static void test_mask_deadline(void **state)
{
    (void)state;
    tvocab tv;
    if (!real_vocab("qwen2", &tv)) synthetic_vocab(&tv);
    int W = grammar_vocab_n_words(tv.v);
    uint32_t *want = calloc((size_t)W, sizeof *want), *got = calloc((size_t)W, sizeof *got);
    char err[256];
    const char *schema = "{\"type\":\"string\",\"maxLength\":40}"; /* inside: most tokens are walked */
    grammar *g = schema_text(schema, err, sizeof err);
    assert_non_null(g);
    grammar_matcher *m = grammar_matcher_new(g, tv.v);
    assert_true(grammar_matcher_accept_bytes(m, "\"", 1));
    int n = grammar_matcher_fill_mask_until(m, got, timing_now_ms() - 1); /* already past */
    assert_int_equal(n, GRAMMAR_MASK_LATER);
    double slice = 0.001;
    int tries = 1;
    for (; n == GRAMMAR_MASK_LATER && tries < 24; tries++, slice *= 2)
        n = grammar_matcher_fill_mask_until(m, got, timing_now_ms() + slice);
    assert_true(n > 0);
    fprintf(stderr, "first mask done in %d slices\n", tries);
    grammar_matcher_free(m);
    grammar_unref(g);
    g = schema_text(schema, err, sizeof err); /* a fresh grammar: tables built in one go */
    m = grammar_matcher_new(g, tv.v);
    assert_true(grammar_matcher_accept_bytes(m, "\"", 1));
    assert_int_equal(grammar_matcher_fill_mask(m, want), n);
    assert_memory_equal(want, got, (size_t)W * sizeof *want);
    grammar_matcher_free(m);
    grammar_unref(g);
    free(want);
    free(got);
    tvocab_free(&tv);
}

/* Grammars whose only sentence is empty (guided_regex "", guided_choice ["", ""]): the state is
 * complete with no stack, and its mask is the end-of-generation token alone (issue 36: a null
 * memcpy there aborted the sanitizer build). */
static void test_empty_grammars(void **state)
{
    (void)state;
    tvocab tv;
    synthetic_vocab(&tv);
    char err[256];
    const char *empty[] = {"", ""};
    grammar *gs[] = {grammar_from_regex("", 0, err, sizeof err), grammar_from_choices(empty, 2, err, sizeof err)};
    uint32_t *mask = calloc((size_t)grammar_vocab_n_words(tv.v), sizeof *mask);
    for (int i = 0; i < 2; i++) {
        assert_non_null(gs[i]);
        for (int k = 0; k < 2; k++) { /* the second time from the mask cache */
            grammar_matcher *m = grammar_matcher_new(gs[i], tv.v);
            assert_true(grammar_matcher_is_complete(m));
            assert_true(grammar_matcher_is_done(m));
            assert_int_equal(grammar_matcher_fill_mask(m, mask), 1);
            assert_true(mask[(tv.n - 1) >> 5] >> ((tv.n - 1) & 31) & 1u); /* the last token: eog */
            grammar_matcher *c = grammar_matcher_clone(m);
            assert_true(grammar_matcher_accept(c, tv.n - 1));
            grammar_matcher_free(c);
            grammar_matcher_free(m);
        }
        grammar_unref(gs[i]);
    }
    free(mask);
    tvocab_free(&tv);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* e.g. test_bombs: one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_basics),
        cmocka_unit_test(test_gbnf_refusals),
        cmocka_unit_test(test_schema),
        cmocka_unit_test(test_choices_regex_builder),
        cmocka_unit_test(test_masks_brute_force),
        cmocka_unit_test(test_masks_synthetic_vocab),
        cmocka_unit_test(test_masks_real_vocab),
        cmocka_unit_test(test_empty_grammars),
        cmocka_unit_test(test_bombs),
        cmocka_unit_test(test_mask_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
