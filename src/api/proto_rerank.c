/* proto_rerank.c - the /v1/rerank (and /rerank) row of the protocol table (api_proto.h): every
 * document one prefill-only scheduler request whose score is the reranker's, answered once
 * with the results best first (api_embed.c).  Nothing streams. */
#include "api_embed.h"
#include "api_proto.h"

static int rerank_parse(const char *body, size_t len, int n_vocab, api_request *rq, void **state, api_error *e)
{
    *state = NULL;
    return api_rerank_parse(body, len, n_vocab, rq, e);
}

static char *rerank_whole(const api_reply *r, const api_choice *ch, int n, const api_usage *u)
{
    return api_rerank_json(r->rq, &r->meta, ch, n, u);
}

const api_protocol proto_rerank = {
    .name = "rerank",
    .kind = API_RERANK,
    .id_prefix = "rerank-",
    .prompt_param = "documents",
    .messages = false,
    .parse = rerank_parse,
    .whole = rerank_whole,
    .error = api_error_json,
};
