/* test_jinja.c - the Jinja interpreter (src/text/jinja.c): the shared reference vectors
 * (every template x every conversation, byte for byte, or refused where the reference
 * refuses), then the language features and limits one by one.  Expected texts of the feature
 * tests were produced by Python jinja2 3.1 set up as transformers sets it up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "text/jinja.h"

static char *read_file(const char *path, size_t *len)
{
    char err[128];
    return file_read_all(path, (size_t)1 << 30, len, err, sizeof err);
}

static const char *shared_dir(void)
{
    const char *env = getenv("INFERD_SHARED_DIR");
    return env && *env ? env : INFERD_SHARED_DIR;
}

/* The fixed clock the vectors were made with (2026-01-15 12:00:00). */
static const struct tm vector_now = {.tm_year = 126, .tm_mon = 0, .tm_mday = 15, .tm_hour = 12, .tm_wday = 4, .tm_yday = 14};

/* The context apply_chat_template passes: messages, tools, add_generation_prompt, the special
 * tokens, and the conversation's extra variables. */
static char *vector_context(const cJSON *conv, const cJSON *special)
{
    cJSON *ctx = cJSON_CreateObject();
    cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(cJSON_GetObjectItem(conv, "messages"), 1));
    const cJSON *tools = cJSON_GetObjectItem(conv, "tools");
    if (tools) cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(tools, 1));
    const cJSON *agp = cJSON_GetObjectItem(conv, "add_generation_prompt");
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", agp ? cJSON_IsTrue(agp) : 1);
    const cJSON *it;
    cJSON_ArrayForEach(it, special) cJSON_AddItemToObject(ctx, it->string, cJSON_Duplicate(it, 1));
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(conv, "kwargs")) cJSON_AddItemToObject(ctx, it->string, cJSON_Duplicate(it, 1));
    char *s = cJSON_PrintUnformatted(ctx);
    cJSON_Delete(ctx);
    return s;
}

static void test_shared_vectors(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/chat/vectors.json", shared_dir());
    char *json = read_file(path, NULL);
    if (!json) {
        print_message("skipping: %s not found (set INFERD_SHARED_DIR)\n", path);
        skip();
    }
    cJSON *v = cJSON_Parse(json);
    free(json);
    assert_non_null(v);
    const cJSON *convs = cJSON_GetObjectItem(v, "conversations"), *tmpl;
    int failures = 0, passed = 0, refused = 0;
    cJSON_ArrayForEach(tmpl, cJSON_GetObjectItem(v, "expected")) {
        snprintf(path, sizeof path, "%s/chat/templates/%s.jinja", shared_dir(), tmpl->string);
        size_t src_len;
        char *src = read_file(path, &src_len);
        assert_non_null(src);
        char err[512];
        jinja_tmpl *t = jinja_parse(src, src_len, err, sizeof err);
        if (!t) fail_msg("%s: parse: %s", tmpl->string, err);
        const cJSON *special = cJSON_GetObjectItem(tmpl, "special_tokens"), *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(tmpl, "renderings")) {
            const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(r, "id"));
            const cJSON *conv = NULL, *c;
            cJSON_ArrayForEach(c, convs) if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c, "id")), id) == 0) conv = c;
            assert_non_null(conv);
            char *ctx = vector_context(conv, special);
            jinja_opts o = {.now = &vector_now};
            size_t n;
            char *out = jinja_render_json(t, ctx, strlen(ctx), &o, &n, err, sizeof err);
            const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(r, "text"));
            const char *want_err = cJSON_GetStringValue(cJSON_GetObjectItem(r, "error"));
            if (want && out && n == strlen(want) && memcmp(out, want, n) == 0) {
                print_message("%-12s %-30s pass\n", tmpl->string, id);
                passed++;
            } else if (want_err && !out && err[0]) {
                print_message("%-12s %-30s refused as the reference (%s | ours: %s)\n", tmpl->string, id, want_err, err);
                refused++;
            } else {
                print_message("%-12s %-30s FAIL\n  want: %s\n  got:  %s\n", tmpl->string, id,
                              want ? want : want_err, out ? out : err);
                failures++;
            }
            free(out);
            free(ctx);
        }
        jinja_free(t);
        free(src);
    }
    print_message("shared vectors: %d pass, %d refused as the reference, %d fail\n", passed, refused, failures);
    cJSON_Delete(v);
    assert_int_equal(failures, 0);
    assert_true(passed > 0);
}

/* Renders src with the JSON context and options (NULL: the defaults); returns the text or
 * "ERR: message" (static). */
static const char *render_opts(const char *src, const char *ctx, const jinja_opts *o)
{
    static char buf[8192];
    char err[512];
    jinja_tmpl *t = jinja_parse(src, strlen(src), err, sizeof err);
    if (!t) {
        snprintf(buf, sizeof buf, "PARSE: %s", err);
        return buf;
    }
    char *out = jinja_render_json(t, ctx ? ctx : "{}", ctx ? strlen(ctx) : 2, o, NULL, err, sizeof err);
    if (out) snprintf(buf, sizeof buf, "%s", out);
    else snprintf(buf, sizeof buf, "ERR: %s", err);
    free(out);
    jinja_free(t);
    return buf;
}

static const char *render(const char *src, const char *ctx) { return render_opts(src, ctx, NULL); }

#define R(src, ctx, want) assert_string_equal(render(src, ctx), want)
#define E(src, ctx) assert_memory_equal(render(src, ctx), "ERR: ", 5)

/* Statements, expressions, filters, tests and methods against Python jinja2's renderings. */
static void test_features(void **state)
{
    (void)state;
    R("{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{% if not loop.last %}, {% endif %}{% endfor %}", "{\"messages\":[{\"role\":\"a\"},{\"role\":\"b\"},{\"role\":\"c\"}]}", "1/3:a, 2/3:b, 3/3:c");
    R("{% for x in [1,2,3,4] if x is odd %}{{ loop.index0 }}{{ x }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}", NULL, "013|131|");
    R("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
    R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", NULL, "0134");
    R("{% set ns = namespace(n=0, s='') %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}", NULL, "6 123");
    R("{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}", NULL, "15151");
    R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }}", NULL, "Hi Bob! Hi Al?");
    R("{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %}", NULL, "<b>bold</b>");
    R("{% set body %}  inner {{ 1 + 2 }}  {% endset %}[{{ body }}]{% set t | trim %}  x  {% endset %}[{{ t }}]", NULL, "[  inner 3  ][x]");
    R("{{ 'abc'[::-1] }} {{ 'héllo'[1:3] }} {{ [1,2,3,4][1:] }} {{ [1,2,3,4][-2:] }} {{ [1,2,3][::2] }} {{ 'héllo'[1] }} {{ 'abc'[-1] }}", NULL, "cba él [2, 3, 4] [3, 4] [1, 3] é c");
    R("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}", NULL, "a b|a|a|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b,c']");
    R("{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'hello world'.title() }} {{ 'ABC'.lower() }} {{ 'abc'.upper() }} {{ 'hello'.capitalize() }}", NULL, "True True bba Hello World abc ABC Hello");
    R("{{ 'a' in 'cat' }} {{ 1 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1,2] }}", NULL, "True True True True");
    R("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [1] is sequence }} {{ 1 is number }} {{ [] is iterable }} {{ true is true }} {{ false is false }} {{ 1 is true }} {{ 4 is divisibleby 2 }} {{ 3 is odd }} {{ x is not defined }}", NULL, "False True True True True True True True True False True True True");
    R("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ \"é\\n\\\"<>&\" | tojson }}", "{\"d\":{\"z\":[1,2.5,null,true,\"é\"],\"a\":{},\"b\":[]}}", "{\"z\": [1, 2.5, null, true, \"é\"], \"a\": {}, \"b\": []}|{\n  \"z\": [\n    1,\n    2.5,\n    null,\n    true,\n    \"é\"\n  ],\n  \"a\": {},\n  \"b\": []\n}|{\"a\": {}, \"b\": [], \"z\": [1, 2.5, null, true, \"é\"]}|\"é\\n\\\"<>&\"");
    R("{{ '  x  ' | trim }}|{{ [1,2,3] | length }}|{{ 'héllo' | length }}|{{ [1,2] | first }}|{{ [1,2] | last }}|{{ ['a','b'] | join(', ') }}|{{ x | default('d') }}|{{ '' | default('d', true) }}|{{ 'ab' | list }}|{{ 'hi' | upper }}|{{ 42 | string }}|{{ '7' | int + 1 }}|{{ 'x' | int }}|{{ 3.7 | int }}|{{ 'word' | capitalize }}", NULL, "x|3|5|1|2|a, b|d|d|['a', 'b']|HI|42|8|0|3|Word");
    R("{{ users | map(attribute='name') | join(',') }}|{{ users | selectattr('admin') | map(attribute='name') | list }}|{{ users | rejectattr('admin') | list | length }}|{{ [1,2,3,4] | select('even') | list }}|{{ [1,0,2] | select | list }}|{{ users | selectattr('name', 'equalto', 'b') | list | length }}|{{ ['a','B'] | map('upper') | list }}", "{\"users\":[{\"name\":\"a\",\"admin\":true},{\"name\":\"b\",\"admin\":false},{\"name\":\"c\"}]}", "a,b,c|['a']|2|[2, 4]|[1, 2]|1|['A', 'B']");
    R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys() | list }}{{ d.values() | list }}{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 'dflt') }}{% for k, v in d | items %}{{ k }}{% endfor %}", "{\"d\":{\"a\":1,\"b\":[1,2]}}", "a=1;b=[1, 2];['a', 'b'][1, [1, 2]]1Nonedfltab");
    R("{{ 'line1\\nline2\\n\\nline4' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}", NULL, "line1\n  line2\n\n  line4|  a\n  b|a\n  \n  b");
    R("{{ [1, 'a', none, true, 1.5, {'k': [2]}] }} {{ 1e15 }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 3 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ (1, 2) }} {{ \"it's\" }} {{ [\"it's\"] }}", NULL, "[1, 'a', None, True, 1.5, {'k': [2]}] 1000000000000000.0 1.0 0.30000000000000004 1e+16 1.5 2.0 3 2 1024 (1, 2) it's [\"it's\"]");
    R("{{ 'x' * 3 }} {{ 1 ~ none ~ x }} {{ 'a' if false }}|{{ 'a' if true else 'b' }} {{ true and 'x' }} {{ false or 'y' }} {{ not 0 }} {{ 1 < 2 < 3 }} {{ -(3) }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }}", NULL, "xxx 1None |a x y True True -3 14 20");
    R("  {% if true %}\n  x\n  {% endif %}\n  y {% if true %}z{% endif %}  \n", NULL, "  x\n  y z  ");
    R("a  {%+ if true %}b{% endif +%}\nc", NULL, "a  b\nc");
    R("a {%- if true -%} b {%- endif %} c{# comment #}\nd {#- c -#} e\n  {# lonely #}\nf", NULL, "ab cde\nf");
    R("{% raw %}{{ not evaluated }}{% endraw %}", NULL, "{{ not evaluated }}");
    R("{{ \"{} and {}\".format(1, 'x') }} {{ \"{name}!\".format(name='n') }}", NULL, "1 and x n!");
    R("{{ messages[0]['content'] + '\\n\\n' }}", "{\"messages\":[{\"content\":\"x\"}]}", "x\n\n");
    E("{{ raise_exception('Roles must alternate') }}", NULL);
    E("{{ 'a' + 1 }}", NULL);
    E("{{ 'a' in none }}", NULL);
    E("{{ x.y }}", NULL);
    R("{{ none.foo }}|{{ {'a':1}.b }}|{{ [1,2][5] }}", NULL, "||");
    R("{{ [] | first }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}", "{\"messages\":[{\"role\":\"user\"},{\"role\":\"assistant\"},{\"role\":\"user\"}]}", "|2");
    R("{%- set tool_call = {'function': {'name': 'f', 'arguments': {'a': 1}}} %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}{{ tool_call.name }}{{ tool_call.arguments | tojson }}", NULL, "f{\"a\": 1}");
    R("{{ '%s' | format('x') if false else 'no-format' }} {{ [3,1,2] | sort }} {{ [3,1,2] | sort(reverse=true) }} {{ [1,2,1] | unique | list }} {{ [1,2,3] | sum }} {{ [1,5,3] | max }} {{ [4,2] | min }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ [1,2,3] | reverse | list }}", NULL, "no-format [1, 2, 3] [3, 2, 1] [1, 2] 6 5 2 3 2.57 [3, 2, 1]");
    R("{% if a is defined and a %}A{% elif b %}B{% else %}C{% endif %}", "{\"b\": 1}", "B");
    E("{{ 10 / 0 }}", NULL);
    R("{% for a in [[1,2],[3,4]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}", NULL, "11221;13242;");
    R("{{ dict(a=1, b='x') | tojson }} {{ {'a': 1} == {'a': 1} }} {{ [1,2] == [1,2] }} {{ 1 == 1.0 }} {{ 'a' < 'b' }}\n", NULL, "{\"a\": 1, \"b\": \"x\"} True True True True");
}

/* Hostile templates end in an error, not a dead process or a stuck worker (issue 36): a list
 * nested 100,000 deep compared (each walk used to recurse once per level and overflow the
 * stack), comparisons of multi-megabyte strings repeated 400,000 times (a step each, hours of
 * memcmp), and range/slice steps that overflow int64. */
static void test_hostile_limits(void **state)
{
    (void)state;
    static const char deep[] = "{% set ns = namespace(x=[]) %}{% for i in range(10000) %}{% set ns.x = [[[[[[[[[[ns.x]]]]]]]]]] %}{% endfor %}";
    static const char *const walks[] = {"{{ ns.x == [ns.x] }}", "{{ ns.x < [ns.x] }}", "{{ ns.x in [[ns.x]] }}",
                                        "{{ [ns.x, [ns.x]] | sort }}", "{{ [ns.x, [ns.x]] | unique | list }}",
                                        "{{ ns.x | tojson }}"};
    /* a generous clock for a loaded machine and sanitizer builds: the step limit decides */
    const jinja_opts slow_ok = {.max_ms = 120000};
    char src[512];
    for (size_t i = 0; i < sizeof walks / sizeof walks[0]; i++) {
        snprintf(src, sizeof src, "%s%s", deep, walks[i]);
        const char *r = render_opts(src, NULL, &slow_ok);
        print_message("%s -> %.80s\n", walks[i], r);
        assert_non_null(strstr(r, "nested too deeply"));
    }
    /* The same pairs shallow still compare as Python does. */
    R("{% set x = [[[1]]] %}{{ x == [[[1]]] }} {{ x < [[[2]]] }} {{ x in [[[[1]]]] }}", NULL, "True True True");

    /* 400,000 comparisons of two distinct 4 MB strings: stopped by the work limit (bytes compared
     * count as steps) in well under a second of memcmp, where one step each let it run for hours;
     * the same with one string is a pointer comparison and finishes. */
    const char *r = render_opts("{% set big = 'x' * 4000000 %}{% set other = 'x' * 3999999 + 'x' %}"
                                "{{ ([big] * 400000) == ([other] * 400000) }}", NULL, &slow_ok);
    assert_non_null(strstr(r, "evaluation limit exceeded"));
    assert_string_equal(render_opts("{% set big = 'x' * 4000000 %}{{ ([big] * 400000) == ([big] * 400000) }}", NULL, &slow_ok), "True");
    r = render_opts("{% set big = 'x' * 4000000 %}{% for i in range(400000) %}{% if big | length == 1 %}{% endif %}{% endfor %}", NULL, &slow_ok);
    assert_non_null(strstr(r, "evaluation limit exceeded"));
    r = render_opts("{% set big = 'ab' * 2000000 %}{% for i in range(400000) %}{{ 'zz' in big }}{{ big.rfind('zz') }}{% endfor %}", NULL, &slow_ok);
    assert_non_null(strstr(r, "evaluation limit exceeded"));
    /* and the clock: two million loop turns do not fit in a millisecond */
    const jinja_opts hurry = {.max_ms = 1};
    assert_string_equal(render_opts("{% for i in range(2000000) %}{% endfor %}", NULL, &hurry), "ERR: line 1: template evaluation time limit exceeded");

    /* range and slice steps near INT64_MAX end the walk where Python's does. */
    R("{{ range(9223372036854775800, 9223372036854775807, 5) | list }}", NULL, "[9223372036854775800, 9223372036854775805]");
    R("{{ range(-9223372036854775800, -9223372036854775807, -5) | list }}", NULL, "[-9223372036854775800, -9223372036854775805]");
    R("{{ [1, 2, 3][2::9223372036854775807] }} {{ 'abc'[1::9223372036854775807] }}", NULL, "[3] b");
}


/* gpt-oss's published chat template (the Harmony format: system and developer messages, tools as
 * a TypeScript namespace, analysis before a call, a tool's result as functions.NAME, built-in
 * tools, reasoning_effort, its refusals) over data/gpt-oss-vectors.json, byte for byte against
 * Python jinja2's renderings (gen_gpt_oss_vectors.py). */
static void test_gpt_oss_template(void **state)
{
    (void)state;
    const char *srcdir = getenv("INFERD_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/text/data/gpt-oss.jinja", srcdir && *srcdir ? srcdir : INFERD_SOURCE_DIR);
    size_t src_len;
    char *src = read_file(path, &src_len), err[512];
    assert_non_null(src);
    jinja_tmpl *t = jinja_parse(src, src_len, err, sizeof err);
    if (!t) fail_msg("gpt-oss.jinja: %s", err);
    snprintf(path, sizeof path, "%s/tests/text/data/gpt-oss-vectors.json", srcdir && *srcdir ? srcdir : INFERD_SOURCE_DIR);
    char *json = read_file(path, NULL);
    cJSON *v = cJSON_Parse(json);
    assert_non_null(v);
    int n_conv = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(v, "conversations")) {
        char *ctx = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "context"));
        jinja_opts o = {.now = &vector_now};
        size_t n;
        char *out = jinja_render_json(t, ctx, strlen(ctx), &o, &n, err, sizeof err);
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(c, "id"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
        const char *want_err = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error"));
        if (want && !(out && n == strlen(want) && memcmp(out, want, n) == 0))
            fail_msg("%s:\n  want: %s\n  got:  %s", id, want, out ? out : err);
        if (want_err && (out || !strstr(err, want_err))) fail_msg("%s: want the refusal %s, got %s", id, want_err, out ? out : err);
        free(out);
        free(ctx);
        n_conv++;
    }
    assert_true(n_conv >= 9);
    cJSON_Delete(v);
    free(json);
    jinja_free(t);
    free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_vectors),
        cmocka_unit_test(test_features),
        cmocka_unit_test(test_hostile_limits),
        cmocka_unit_test(test_gpt_oss_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
