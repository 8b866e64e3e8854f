/* endpoints.c - the plain endpoints: /health, /metrics, /v1/models, /tokenize, /detokenize
 * (the generation endpoints are gen.c).  Each answers from the request alone and the
 * published model; none waits on the scheduler. */
#include "endpoints.h"

#include "api/api_messages.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_encode.h"
#include "http_int.h"
#include "api/json_strict.h"
#include "api/tokenize_reply.h"

enum MHD_Result endpoint_health(http_req *hr)
{
    int st = atomic_load(&hr->sv->state);
    if (st == SERVER_READY) return http_reply_json(hr, 200, strdup("{\"status\":\"ok\"}"));
    api_error e;
    api_error_set(&e, 503, "unavailable_error", NULL, st == SERVER_LOADING ? "model_loading" : "shutting_down",
                  st == SERVER_LOADING ? "Loading model" : "The server is shutting down");
    return http_reply_error(hr, &e);
}

enum MHD_Result endpoint_metrics(http_req *hr)
{
    server *sv = hr->sv;
    sched_stats st;
    metrics_view v = {0};
    /* The state is draining too for a server stopped while loading, which has no scheduler:
     * what says one exists is sm.s itself (published by server_set_ready before READY). */
    if (atomic_load(&sv->state) != SERVER_LOADING && sv->sm.s) {
        sched_get_stats(sv->sm.s, &st);
        v.st = &st;
        v.ctx_per_slot = sv->sm.ctx_per_slot;
        v.ready = atomic_load(&sv->state) == SERVER_READY;
    }
    bytebuf out = {0};
    metrics_render(sv->metrics, &v, &out);
    size_t len = out.len;
    char *body = bytebuf_take(&out, NULL);
    if (!body) return http_reply_json(hr, 500, NULL);
    return http_reply(hr, 200, "text/plain; version=0.0.4; charset=utf-8", body, len);
}

static cJSON *model_object(const server *sv)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", sv->sm.alias);
    cJSON_AddStringToObject(o, "object", "model");
    cJSON_AddNumberToObject(o, "created", (double)sv->started);
    cJSON_AddStringToObject(o, "owned_by", "inferd");
    cJSON *meta = cJSON_AddObjectToObject(o, "meta");
    const server_model_card *card = &sv->sm.card;
    cJSON_AddStringToObject(meta, "arch", card->arch);
    cJSON_AddNumberToObject(meta, "n_vocab", card->n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", card->n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_ctx_slot", sv->sm.ctx_per_slot);
    cJSON_AddNumberToObject(meta, "n_embd", card->n_embd);
    cJSON_AddNumberToObject(meta, "size", (double)card->weight_bytes);
    cJSON_AddStringToObject(meta, "chat_template", sv->sm.jinja ? "jinja" : chat_template_name(sv->sm.tmpl));
    cJSON_AddStringToObject(meta, "tool_call_syntax", chat_syntax_name(sv->sm.syntax));
    /* --deterministic, and the fingerprint a client compares with its responses' */
    cJSON_AddBoolToObject(meta, "deterministic", sv->sm.fingerprint != NULL);
    if (sv->sm.fingerprint) cJSON_AddStringToObject(meta, "system_fingerprint", sv->sm.fingerprint);
    else cJSON_AddNullToObject(meta, "system_fingerprint");
    return o;
}

enum MHD_Result endpoint_models(http_req *hr)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, model_object(hr->sv));
    return http_reply_cjson(hr, 200, root);
}

enum MHD_Result endpoint_model(http_req *hr)
{
    const char *id = hr->url + strlen("/v1/models/");
    if (strcmp(id, hr->sv->sm.alias) != 0) {
        api_error e;
        api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                      "The model '%.100s' does not exist", id);
        return http_reply_error(hr, &e);
    }
    return http_reply_cjson(hr, 200, model_object(hr->sv));
}

/* Parse the body as a JSON object or fill e. */
static cJSON *body_object(http_req *hr, api_error *e)
{
    return json_parse_body(hr->body.data ? hr->body.data : "", hr->body.len, e);
}

static bool opt_bool(const cJSON *root, const char *name, bool def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* POST /tokenize {"content", "add_special"=false, "parse_special"=true, "with_pieces"=false}
 * -> {"tokens": [id...]} or {"tokens": [{"id","piece"}...]} (llama-server's shape).  The reply
 * is written without a cJSON tree and pieces are bounded (tokenize_reply.h): a 1 MB body
 * costs about its reply, not hundreds of MB. */
enum MHD_Result endpoint_tokenize(http_req *hr)
{
    api_error e;
    cJSON *root = body_object(hr, &e);
    if (!root) return http_reply_error(hr, &e);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    if (!cJSON_IsString(content)) {
        cJSON_Delete(root);
        api_error_set(&e, 400, "invalid_request_error", "content", "invalid_type",
                      "Invalid 'content': expected a string.");
        return http_reply_error(hr, &e);
    }
    const tokenizer *tok = hr->sv->sm.tok;
    size_t len = strlen(content->valuestring);
    /* add_special as Hugging Face's encode and llama.cpp mean it: BOS and EOS where the
     * vocabulary adds them, even when the text already writes one (this endpoint shows what a
     * text encodes to; the completion endpoints are the ones that avoid a doubled BOS). */
    bool add_special = opt_bool(root, "add_special", false);
    bool add_bos = add_special && tokenizer_add_bos(tok), add_eos = add_special && tokenizer_add_eos(tok);
    bool parse_special = opt_bool(root, "parse_special", true), pieces = opt_bool(root, "with_pieces", false);
    int32_t *ids = NULL;
    int n = tokenizer_encode_alloc(tok, content->valuestring, len, add_bos, parse_special, &ids);
    cJSON_Delete(root);
    if (n >= 0 && add_eos) {
        int32_t *more = realloc(ids, (size_t)(n + 1) * sizeof *ids);
        if (more) {
            ids = more;
            ids[n++] = tokenizer_eos(tok);
        } else {
            n = -1;
        }
    }
    if (pieces && n > TOKENIZE_MAX_PIECES) {
        free(ids);
        api_error_set(&e, 400, "invalid_request_error", "content", "too_many_tokens",
                      "'content' encodes to %d tokens; with_pieces answers at most %d. Split the content or "
                      "ask without with_pieces.", n, TOKENIZE_MAX_PIECES);
        return http_reply_error(hr, &e);
    }
    bytebuf out = {0};
    if (n >= 0) tokenize_reply(tok, ids, n, pieces, &out);
    free(ids);
    size_t out_len = out.len;
    char *body = n >= 0 ? bytebuf_take(&out, NULL) : NULL;
    bytebuf_free(&out);
    if (!body) {
        api_error_set(&e, 500, "server_error", NULL, NULL, "tokenization failed");
        return http_reply_error(hr, &e);
    }
    return http_reply(hr, 200, "application/json", body, out_len);
}

/* POST /detokenize {"tokens": [id...]} -> {"content": text} */
enum MHD_Result endpoint_detokenize(http_req *hr)
{
    api_error e;
    cJSON *root = body_object(hr, &e);
    if (!root) return http_reply_error(hr, &e);
    const tokenizer *tok = hr->sv->sm.tok;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    int k = 0;
    const cJSON *it;
    if (n > 0 && ids) {
        cJSON_ArrayForEach(it, arr)
        {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= tokenizer_n_vocab(tok) ||
                it->valuedouble != (double)(int32_t)it->valuedouble)
                break;
            ids[k++] = (int32_t)it->valuedouble;
        }
    }
    cJSON_Delete(root);
    if (n < 0 || k != n || (n > 0 && !ids)) {
        free(ids);
        api_error_set(&e, 400, "invalid_request_error", "tokens", "invalid_value",
                      "Invalid 'tokens': expected an array of token ids in [0, %d).", tokenizer_n_vocab(tok));
        return http_reply_error(hr, &e);
    }
    size_t len = 0;
    char *text = tokenizer_decode_alloc(tok, ids, n, &len);
    free(ids);
    char *clean = text ? api_utf8_sanitize(text, len, NULL) : NULL;
    free(text);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "content", clean ? clean : "");
    free(clean);
    return http_reply_cjson(hr, 200, out);
}

/* POST /v1/messages/count_tokens: a Messages body's prompt (its template rendered with its
 * tools), counted and not generated -> {"input_tokens": N}; errors in Anthropic's shape. */
enum MHD_Result endpoint_count_tokens(http_req *hr)
{
    api_error e;
    api_request rq;
    char *chat = NULL;
    int n = api_messages_translate_count(hr->body.data ? hr->body.data : "", hr->body.len, &chat, &e);
    if (n == 0) {
        n = api_request_parse(API_CHAT, chat, strlen(chat), tokenizer_n_vocab(hr->sv->sm.tok), &rq, &e);
        if (n != 0) api_messages_rename_error(&e);
    }
    free(chat);
    if (n == 0) {
        n = gen_prompt_tokens(hr->sv, &rq, &e);
        api_request_free(&rq);
    }
    if (n < 0) return http_reply_error_body(hr, &e, api_messages_error_json(&e));
    cJSON *root = cJSON_CreateObject();
    if (root && !cJSON_AddNumberToObject(root, "input_tokens", n)) {
        cJSON_Delete(root);
        root = NULL;
    }
    return root ? http_reply_cjson(hr, 200, root) : http_reply_json(hr, 500, NULL);
}

/* /v1/messages/batches and everything under it: Anthropic's Message Batches API keeps requests
 * and their results for a day, and this server stores nothing, so each method is a 400 that
 * names batches (in Anthropic's shape) instead of a 404 a client would read as a wrong URL. */
enum MHD_Result endpoint_messages_batches(http_req *hr)
{
    api_error e;
    api_error_set(&e, 400, "invalid_request_error", NULL, "unsupported_parameter",
                  "Message batches (/v1/messages/batches) are not supported: this server stores no requests or "
                  "results; send each request to /v1/messages.");
    return http_reply_error_body(hr, &e, api_messages_error_json(&e));
}
