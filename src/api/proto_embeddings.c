/* proto_embeddings.c - the /v1/embeddings row of the protocol table (api_proto.h): every input
 * one prefill-only scheduler request, answered once with the pooled vectors (api_embed.c).
 * Nothing streams: the row has no open, delta or close. */
#include "api_embed.h"
#include "api_proto.h"

static int embeddings_parse(const char *body, size_t len, int n_vocab, api_request *rq, void **state, api_error *e)
{
    *state = NULL;
    return api_embeddings_parse(body, len, n_vocab, rq, e);
}

static char *embeddings_whole(const api_reply *r, const api_choice *ch, int n, const api_usage *u)
{
    return api_embeddings_json(r->rq, &r->meta, ch, n, u, r->embd_width);
}

const api_protocol proto_embeddings = {
    .name = "embeddings",
    .kind = API_EMBEDDINGS,
    .id_prefix = "embd-",
    .prompt_param = "input",
    .messages = false,
    .parse = embeddings_parse,
    .whole = embeddings_whole,
    .error = api_error_json,
};
