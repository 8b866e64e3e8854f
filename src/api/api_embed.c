/* api_embed.c - /v1/embeddings and /v1/rerank bodies (api_embed.h). */
#include "api_embed.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_strict.h"

#define INVALID "invalid_request_error"

static int bad_type(api_error *e, const char *param, const char *expected)
{
    api_error_set(e, 400, INVALID, param, "invalid_type", "Invalid type for '%s': expected %s.", param, expected);
    return -1;
}

static int oom(api_error *e)
{
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

/* "model" and "user", when present, are strings (and otherwise unused: one model is served). */
static int read_names(const cJSON *obj, api_error *e)
{
    const char *names[] = {"model", "user"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = json_field(obj, names[i]);
        if (v && !cJSON_IsString(v)) return bad_type(e, names[i], "a string");
    }
    return 0;
}

/* An optional integer in [lo, hi]; *out keeps its value when absent. */
static int read_int_in(const cJSON *obj, const char *name, int lo, int hi, int *out, api_error *e)
{
    const cJSON *v = json_field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        api_error_set(e, 400, INVALID, name, "invalid_value", "Invalid '%s': expected an integer in [%d, %d].", name,
                      lo, hi);
        return -1;
    }
    *out = (int)v->valuedouble;
    return 0;
}

static void prepare_request(api_request *rq, api_kind kind)
{
    memset(rq, 0, sizeof *rq);
    rq->kind = kind;
    rq->n = 1;
    rq->max_tokens = 1; /* nothing is generated: the one step of the prompt */
    rq->logprobs = -1;
    sampling_params_default(&rq->sp);
}

static int read_embeddings(const cJSON *obj, int n_vocab, api_request *rq, api_error *e)
{
    if (read_names(obj, e) || api_request_read_prompts(obj, "input", n_vocab, rq, e)) return -1;
    const cJSON *f = json_field(obj, "encoding_format");
    if (f && !cJSON_IsString(f)) return bad_type(e, "encoding_format", "a string");
    if (f && strcmp(f->valuestring, "float") != 0 && strcmp(f->valuestring, "base64") != 0) {
        api_error_set(e, 400, INVALID, "encoding_format", "invalid_value",
                      "Invalid 'encoding_format': '%.32s' (expected 'float' or 'base64').", f->valuestring);
        return -1;
    }
    rq->base64 = f && strcmp(f->valuestring, "base64") == 0;
    return read_int_in(obj, "dimensions", 1, 1 << 20, &rq->dimensions, e);
}

int api_embeddings_parse(const char *body, size_t len, int n_vocab, api_request *rq, api_error *e)
{
    prepare_request(rq, API_EMBEDDINGS);
    cJSON *obj = json_parse_body(body, len, e);
    if (!obj) return -1;
    int rc = read_embeddings(obj, n_vocab, rq, e);
    cJSON_Delete(obj);
    if (rc != 0) api_request_free(rq);
    return rc;
}

/* Qwen3-Reranker's prompt (its model card): a judge's system turn, the instruction, query and
 * document as the user's, and the answer opened after an empty think block. */
static char *rerank_prompt(const char *instruction, const char *query, const char *doc, size_t *len)
{
    static const char fmt[] =
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
        "<Instruct>: %s\n<Query>: %s\n<Document>: %s<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    int n = snprintf(NULL, 0, fmt, instruction, query, doc);
    char *s = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (s) snprintf(s, (size_t)n + 1, fmt, instruction, query, doc);
    *len = s ? (size_t)n : 0;
    return s;
}

static int read_rerank(const cJSON *obj, api_request *rq, api_error *e)
{
    if (read_names(obj, e)) return -1;
    const cJSON *q = json_field(obj, "query"), *docs = json_field(obj, "documents"), *ins = json_field(obj, "instruction");
    if (!q) {
        api_error_set(e, 400, INVALID, "query", "missing_required_parameter", "Missing required parameter: 'query'.");
        return -1;
    }
    if (!cJSON_IsString(q) || !q->valuestring[0]) return bad_type(e, "query", "a non-empty string");
    if (ins && !cJSON_IsString(ins)) return bad_type(e, "instruction", "a string");
    if (!docs) {
        api_error_set(e, 400, INVALID, "documents", "missing_required_parameter",
                      "Missing required parameter: 'documents'.");
        return -1;
    }
    if (!cJSON_IsArray(docs)) return bad_type(e, "documents", "an array of strings or of objects with 'text'");
    int n = cJSON_GetArraySize(docs);
    if (n < 1 || n > API_MAX_EMBED_INPUTS) {
        api_error_set(e, 400, INVALID, "documents", "invalid_value",
                      "Invalid 'documents': %d documents (1 to %d per request).", n, API_MAX_EMBED_INPUTS);
        return -1;
    }
    if (read_int_in(obj, "top_n", 1, 1 << 30, &rq->top_n, e)) return -1;
    const cJSON *rd = json_field(obj, "return_documents");
    if (rd && !cJSON_IsBool(rd)) return bad_type(e, "return_documents", "a boolean");
    rq->return_documents = cJSON_IsTrue(rd);
    rq->prompts = calloc((size_t)n, sizeof *rq->prompts);
    rq->documents = calloc((size_t)n, sizeof *rq->documents);
    if (!rq->prompts || !rq->documents) return oom(e);
    rq->n_prompts = n;
    const char *instruction = ins ? ins->valuestring : API_RERANK_DEFAULT_INSTRUCTION;
    int i = 0;
    for (const cJSON *it = docs->child; it; it = it->next, i++) { /* one walk: never indexed */
        const cJSON *text = cJSON_IsObject(it) ? json_field(it, "text") : it;
        if (!cJSON_IsString(text)) {
            char param[48];
            snprintf(param, sizeof param, "documents[%d]", i);
            return bad_type(e, param, "a string or an object with a string 'text'");
        }
        if (!(rq->documents[i] = strdup(text->valuestring))) return oom(e);
        api_prompt *p = &rq->prompts[i];
        if (!(p->text = rerank_prompt(instruction, q->valuestring, text->valuestring, &p->text_len))) return oom(e);
    }
    return 0;
}

int api_rerank_parse(const char *body, size_t len, int n_vocab, api_request *rq, api_error *e)
{
    (void)n_vocab;
    prepare_request(rq, API_RERANK);
    cJSON *obj = json_parse_body(body, len, e);
    if (!obj) return -1;
    int rc = read_rerank(obj, rq, e);
    cJSON_Delete(obj);
    if (rc != 0) api_request_free(rq);
    return rc;
}

/* ---- answers ------------------------------------------------------------------------------- */

static char *base64_of(const unsigned char *b, size_t n)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *o++ = A[v >> 18 & 63];
        *o++ = A[v >> 12 & 63];
        *o++ = i + 1 < n ? A[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? A[v & 63] : '=';
    }
    *o = 0;
    return out;
}

/* One embedding as the client asked: its leading `dims` values renormalised (Matryoshka
 * truncation; centred first where the model's recipe says so: nomic-embed-text v1.5's
 * layer_norm before the cut, whose scale the renormalisation undoes), then numbers or base64
 * (the float32 bytes, little-endian as this host). */
static cJSON *embedding_value(const api_request *rq, const float *v, size_t n, int width)
{
    float *cut = NULL;
    if (rq->dimensions > 0 && (size_t)rq->dimensions < n) {
        if (!(cut = malloc((size_t)rq->dimensions * sizeof *cut))) return NULL;
        double norm = 0, mean = 0;
        for (size_t i = 0; rq->dims_centred && i < n; i++) mean += v[i];
        mean /= (double)n;
        for (int i = 0; i < rq->dimensions; i++) norm += (v[i] - mean) * (v[i] - mean);
        double inv = norm > 0 ? 1.0 / sqrt(norm) : 1.0;
        for (int i = 0; i < rq->dimensions; i++) cut[i] = (float)((v[i] - mean) * inv);
        v = cut, n = (size_t)rq->dimensions;
    }
    cJSON *out = NULL;
    if (rq->base64) {
        char *s = base64_of((const unsigned char *)v, n * sizeof(float));
        out = s ? cJSON_CreateString(s) : NULL;
        free(s);
    } else if (width > 0) { /* every token's state (pooling none): one array per token */
        out = cJSON_CreateArray();
        for (size_t t = 0; out && t < n / (size_t)width; t++)
            cJSON_AddItemToArray(out, cJSON_CreateFloatArray(v + t * (size_t)width, width));
    } else {
        out = cJSON_CreateFloatArray(v, (int)n);
    }
    free(cut);
    return out;
}

static void add_usage(cJSON *root, const api_usage *u)
{
    cJSON *usage = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(usage, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(usage, "total_tokens", u->prompt_tokens);
}

static char *print_and_free(cJSON *root)
{
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

char *api_embeddings_json(const api_request *rq, const api_meta *m, const api_choice *ch, int n,
                          const api_usage *u, int width)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    for (int i = 0; i < n; i++) {
        cJSON *item = cJSON_CreateObject(), *v = embedding_value(rq, ch[i].embedding, ch[i].n_embedding, width);
        if (!item || !v) {
            cJSON_Delete(item), cJSON_Delete(v), cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddStringToObject(item, "object", "embedding");
        cJSON_AddNumberToObject(item, "index", ch[i].index);
        cJSON_AddItemToObject(item, "embedding", v);
        cJSON_AddItemToArray(data, item);
    }
    cJSON_AddStringToObject(root, "model", m->model);
    add_usage(root, u);
    return print_and_free(root);
}

/* Whether choice a ranks after choice b: a lower score, or the same and a later document. */
static bool ranks_after(const api_choice *a, const api_choice *b)
{
    float sa = a->embedding[0], sb = b->embedding[0];
    return sa < sb || (sa == sb && a->index > b->index);
}

char *api_rerank_json(const api_request *rq, const api_meta *m, const api_choice *ch, int n, const api_usage *u)
{
    int *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    cJSON *root = order ? cJSON_CreateObject() : NULL;
    if (!root) {
        free(order);
        return NULL;
    }
    /* best first (an insertion sort: at most API_MAX_EMBED_INPUTS documents, and qsort would
     * need the choices in a global to compare indices) */
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && ranks_after(&ch[order[j - 1]], &ch[i])) order[j] = order[j - 1], j--;
        order[j] = i;
    }
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "model", m->model);
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *results = cJSON_AddArrayToObject(root, "results");
    int keep = rq->top_n > 0 && rq->top_n < n ? rq->top_n : n;
    for (int r = 0; r < keep; r++) {
        const api_choice *c = &ch[order[r]];
        cJSON *item = cJSON_CreateObject();
        cJSON_AddNumberToObject(item, "index", c->index);
        cJSON_AddNumberToObject(item, "relevance_score", c->embedding[0]);
        if (rq->return_documents && rq->documents) {
            cJSON *doc = cJSON_AddObjectToObject(item, "document");
            cJSON_AddStringToObject(doc, "text", rq->documents[c->index]);
        }
        cJSON_AddItemToArray(results, item);
    }
    free(order);
    add_usage(root, u);
    return print_and_free(root);
}
