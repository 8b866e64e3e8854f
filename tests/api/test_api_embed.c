/* test_api_embed.c - /v1/embeddings and /v1/rerank bodies (src/api/api_embed.c): every input
 * form becomes prompts, bad fields are 400s naming the field, and the answers' JSON: numbers or
 * base64 of the float32 bytes, Matryoshka truncation renormalised, per-token rows, rerank
 * results best first with top_n and return_documents. */
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/api_embed.h"

#define N_VOCAB 100

static int parse_embeddings(const char *body, api_request *rq, api_error *e)
{
    return api_embeddings_parse(body, strlen(body), N_VOCAB, rq, e);
}

static void test_embeddings_inputs(void **state)
{
    (void)state;
    api_request rq;
    api_error e;
    assert_int_equal(parse_embeddings("{\"input\":\"hello\",\"model\":\"m\"}", &rq, &e), 0);
    assert_int_equal(rq.kind, API_EMBEDDINGS);
    assert_int_equal(rq.n_prompts, 1);
    assert_string_equal(rq.prompts[0].text, "hello");
    assert_int_equal(rq.max_tokens, 1);
    assert_false(rq.base64);
    api_request_free(&rq);
    assert_int_equal(parse_embeddings("{\"input\":[\"a\",\"b\",[1,2,3],[4]],\"encoding_format\":\"base64\","
                                      "\"dimensions\":16}", &rq, &e), 0);
    assert_int_equal(rq.n_prompts, 4);
    assert_int_equal(rq.prompts[2].n_ids, 3);
    assert_int_equal(rq.prompts[3].ids[0], 4);
    assert_true(rq.base64);
    assert_int_equal(rq.dimensions, 16);
    api_request_free(&rq);
    assert_int_equal(parse_embeddings("{\"input\":[7,8]}", &rq, &e), 0); /* one input of token ids */
    assert_int_equal(rq.n_prompts, 1);
    assert_int_equal(rq.prompts[0].n_ids, 2);
    api_request_free(&rq);
}

static void test_embeddings_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{}", "input"},
        {"{\"input\":\"\"}", "input"},
        {"{\"input\":[]}", "input"},
        {"{\"input\":[1, 200]}", "input"},   /* outside the vocabulary */
        {"{\"input\":[1.5]}", "input"},
        {"{\"input\":{}}", "input"},
        {"{\"input\":\"a\",\"encoding_format\":\"int8\"}", "encoding_format"},
        {"{\"input\":\"a\",\"encoding_format\":1}", "encoding_format"},
        {"{\"input\":\"a\",\"dimensions\":0}", "dimensions"},
        {"{\"input\":\"a\",\"dimensions\":1.5}", "dimensions"},
        {"{\"input\":\"a\",\"model\":3}", "model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        api_request rq;
        api_error e;
        assert_int_equal(parse_embeddings(bad[i].body, &rq, &e), -1);
        assert_int_equal(e.status, 400);
        if (strcmp(e.param, bad[i].param) != 0) fail_msg("%s: param '%s', expected '%s'", bad[i].body, e.param, bad[i].param);
    }
    /* more inputs than one request may carry */
    size_t cap = 16 + 4 * (API_MAX_EMBED_INPUTS + 1);
    char *body = malloc(cap);
    size_t n = (size_t)snprintf(body, cap, "{\"input\":[");
    for (int i = 0; i <= API_MAX_EMBED_INPUTS; i++) n += (size_t)snprintf(body + n, cap - n, "%s\"a\"", i ? "," : "");
    snprintf(body + n, cap - n, "]}");
    api_request rq;
    api_error e;
    assert_int_equal(parse_embeddings(body, &rq, &e), -1);
    assert_string_equal(e.param, "input");
    free(body);
}

static cJSON *embeddings_of(api_request *rq, const float *const *vecs, const size_t *lens, int n, int width)
{
    api_choice ch[4];
    for (int i = 0; i < n; i++) ch[i] = (api_choice){.index = i, .embedding = vecs[i], .n_embedding = lens[i]};
    api_meta m = {.kind = API_EMBEDDINGS, .id = "embd-1", .model = "m"};
    api_usage u = {.prompt_tokens = 9};
    char *json = api_embeddings_json(rq, &m, ch, n, &u, width);
    assert_non_null(json);
    cJSON *root = cJSON_Parse(json);
    free(json);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "object")->valuestring, "list");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "prompt_tokens")->valueint, 9);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "total_tokens")->valueint, 9);
    return root;
}

static void test_embeddings_json(void **state)
{
    (void)state;
    const float a[4] = {0.5f, -0.5f, 0.5f, 0.5f}, b[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    const float *vecs[2] = {a, b};
    const size_t lens[2] = {4, 4};
    api_request rq = {.kind = API_EMBEDDINGS};
    cJSON *root = embeddings_of(&rq, vecs, lens, 2, 0);
    const cJSON *data = cJSON_GetObjectItem(root, "data");
    assert_int_equal(cJSON_GetArraySize(data), 2);
    const cJSON *d1 = cJSON_GetArrayItem(data, 1);
    assert_string_equal(cJSON_GetObjectItem(d1, "object")->valuestring, "embedding");
    assert_int_equal(cJSON_GetObjectItem(d1, "index")->valueint, 1);
    const cJSON *v = cJSON_GetObjectItem(d1, "embedding");
    assert_int_equal(cJSON_GetArraySize(v), 4);
    for (int i = 0; i < 4; i++) assert_true((float)cJSON_GetArrayItem(v, i)->valuedouble == b[i]); /* exact floats */
    cJSON_Delete(root);

    rq.base64 = true; /* the float32 bytes: 0.5 = 00 00 00 3f, -0.5 = 00 00 00 bf */
    root = embeddings_of(&rq, vecs, lens, 1, 0);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "data"), 0), "embedding")->valuestring,
                        "AAAAPwAAAL8AAAA/AAAAPw==");
    cJSON_Delete(root);

    rq.base64 = false; /* Matryoshka: the first 2 of b, renormalised */
    rq.dimensions = 2;
    root = embeddings_of(&rq, vecs + 1, lens, 1, 0);
    v = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "data"), 0), "embedding");
    assert_int_equal(cJSON_GetArraySize(v), 2);
    double n = sqrt(0.1 * 0.1 + 0.2 * 0.2);
    assert_true(fabs(cJSON_GetArrayItem(v, 0)->valuedouble - 0.1 / n) < 1e-6);
    assert_true(fabs(cJSON_GetArrayItem(v, 1)->valuedouble - 0.2 / n) < 1e-6);
    cJSON_Delete(root);

    rq.dims_centred = true; /* nomic v1.5: b less its mean (0.25), cut, renormalised */
    root = embeddings_of(&rq, vecs + 1, lens, 1, 0);
    v = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "data"), 0), "embedding");
    assert_int_equal(cJSON_GetArraySize(v), 2);
    n = sqrt(0.15 * 0.15 + 0.05 * 0.05);
    assert_true(fabs(cJSON_GetArrayItem(v, 0)->valuedouble + 0.15 / n) < 1e-6);
    assert_true(fabs(cJSON_GetArrayItem(v, 1)->valuedouble + 0.05 / n) < 1e-6);
    cJSON_Delete(root);
    rq.dims_centred = false;

    rq.dimensions = 0; /* pooling none: 2 tokens of width 2, one array per token */
    root = embeddings_of(&rq, vecs, lens, 1, 2);
    v = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "data"), 0), "embedding");
    assert_int_equal(cJSON_GetArraySize(v), 2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetArrayItem(v, 1)), 2);
    assert_true(cJSON_GetArrayItem(cJSON_GetArrayItem(v, 1), 0)->valuedouble == 0.5);
    cJSON_Delete(root);
}

static void test_rerank(void **state)
{
    (void)state;
    api_request rq;
    api_error e;
    const char *body = "{\"query\":\"what is x\",\"documents\":[\"x is y\",{\"text\":\"z\"},\"w\"],\"top_n\":2,"
                       "\"return_documents\":true,\"instruction\":\"Find it\"}";
    assert_int_equal(api_rerank_parse(body, strlen(body), N_VOCAB, &rq, &e), 0);
    assert_int_equal(rq.kind, API_RERANK);
    assert_int_equal(rq.n_prompts, 3);
    assert_int_equal(rq.top_n, 2);
    assert_true(rq.return_documents);
    assert_string_equal(rq.documents[1], "z");
    /* Qwen3-Reranker's frame: instruction, query and document, the answer opened */
    assert_non_null(strstr(rq.prompts[0].text, "<Instruct>: Find it\n<Query>: what is x\n<Document>: x is y<|im_end|>"));
    assert_non_null(strstr(rq.prompts[0].text, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert_int_equal(strlen(rq.prompts[0].text), rq.prompts[0].text_len);
    const float scores[3] = {0.2f, 0.9f, 0.5f};
    api_choice ch[3];
    for (int i = 0; i < 3; i++) ch[i] = (api_choice){.index = i, .embedding = &scores[i], .n_embedding = 1};
    api_meta m = {.kind = API_RERANK, .id = "rerank-1", .model = "m"};
    api_usage u = {.prompt_tokens = 30};
    char *json = api_rerank_json(&rq, &m, ch, 3, &u);
    cJSON *root = cJSON_Parse(json);
    free(json);
    const cJSON *res = cJSON_GetObjectItem(root, "results");
    assert_int_equal(cJSON_GetArraySize(res), 2); /* top_n */
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 0), "index")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 1), "index")->valueint, 2);
    assert_true(fabs(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 0), "relevance_score")->valuedouble - 0.9) < 1e-6);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 0), "document"), "text")->valuestring, "z");
    cJSON_Delete(root);
    api_request_free(&rq);
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{\"documents\":[\"d\"]}", "query"},
        {"{\"query\":\"\",\"documents\":[\"d\"]}", "query"},
        {"{\"query\":\"q\"}", "documents"},
        {"{\"query\":\"q\",\"documents\":[]}", "documents"},
        {"{\"query\":\"q\",\"documents\":\"d\"}", "documents"},
        {"{\"query\":\"q\",\"documents\":[\"d\",{\"txt\":\"e\"}]}", "documents[1]"},
        {"{\"query\":\"q\",\"documents\":[\"d\"],\"top_n\":-1}", "top_n"},
        {"{\"query\":\"q\",\"documents\":[\"d\"],\"return_documents\":1}", "return_documents"},
        {"{\"query\":\"q\",\"documents\":[\"d\"],\"instruction\":[]}", "instruction"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(api_rerank_parse(bad[i].body, strlen(bad[i].body), N_VOCAB, &rq, &e), -1);
        assert_int_equal(e.status, 400);
        if (strcmp(e.param, bad[i].param) != 0) fail_msg("%s: param '%s', expected '%s'", bad[i].body, e.param, bad[i].param);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embeddings_inputs),
        cmocka_unit_test(test_embeddings_refusals),
        cmocka_unit_test(test_embeddings_json),
        cmocka_unit_test(test_rerank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
