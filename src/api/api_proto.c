/* api_proto.c - what the OpenAI chat-completions and completions rows share (see api_proto.h):
 * both stream "data: CHUNK" events, end with an error or a usage chunk and "[DONE]", and
 * answer a request that was not streamed with one body of choices. */
#include "api_proto.h"

#include <stdlib.h>

void api_proto_chunk(api_reply *r, const api_choice *ac)
{
    char *json = api_chunk_json(&r->meta, ac, &r->vocab);
    if (json) api_sse_data(r->out, json);
    else r->out->failed = true;
    free(json);
}

/* A finished choice's last chunk: an empty delta with its finish_reason. */
void api_proto_finish_chunk(api_reply *r, const api_delta *d)
{
    if (!d->finish_reason) return;
    api_choice ac = {.index = d->index, .text = "", .finish_reason = d->finish_reason};
    api_proto_chunk(r, &ac);
}

void api_proto_sse_close(api_reply *r, const api_end *end)
{
    char *json = NULL;
    if (end->failed) json = api_error_json(end->failed);
    else if (r->rq->include_usage) json = api_usage_chunk_json(&r->meta, end->usage);
    if (json) api_sse_data(r->out, json);
    free(json);
    api_sse_done(r->out);
}

char *api_proto_choices_json(const api_reply *r, const api_choice *ch, int n, const api_usage *u)
{
    return api_response_json(&r->meta, ch, n, u, &r->vocab);
}
