/* test_grammar.c - the grammar compilers, the byte matcher and the token masks (checked
 * against a brute-force walk of the vocabulary). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/rng.h"
#include "grammar/grammar.h"
#include "model/gguf.h"
#include "text/tokenizer.h"

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
static bool matches(grammar *g, const char *text)
{
    grammar_matcher *m = grammar_matcher_new(g, NULL);
    assert_non_null(m);
    bool ok = grammar_matcher_accept_bytes(m, text, strlen(text)) && grammar_matcher_is_complete(m);
    grammar_matcher_free(m);
    return ok;
}


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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_basics),
        cmocka_unit_test(test_gbnf_refusals),
        cmocka_unit_test(test_schema),
        cmocka_unit_test(test_choices_regex_builder),
        cmocka_unit_test(test_masks_brute_force),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
