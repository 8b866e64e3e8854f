/* api_embed.h - the bodies of /v1/embeddings (OpenAI's shape) and /v1/rerank (the Jina /
 * Cohere shape llama-server, vLLM and SGLang serve): request -> api_request whose prompts are
 * the inputs to embed or the (query, document) pairs to score, and the answers -> JSON.
 * Pure: no model, no tokenizer (the width comes with the embeddings). */
#ifndef INFERD_API_EMBED_H
#define INFERD_API_EMBED_H

#include <stddef.h>

#include "api_encode.h"
#include "api_request.h"

/* Inputs of one request, and the default instruction of a rerank prompt. */
#define API_MAX_EMBED_INPUTS API_MAX_CHOICES
#define API_RERANK_DEFAULT_INSTRUCTION "Given a web search query, retrieve relevant passages that answer the query"

/* {"input", "encoding_format": "float"|"base64", "dimensions", "model", "user"}: every input
 * one prompt (text or token ids); 0, or -1 with e (400). */
int api_embeddings_parse(const char *body, size_t len, int n_vocab, api_request *rq, api_error *e);
/* {"query", "documents": [string | {"text"}], "top_n", "return_documents", "instruction",
 * "model"}: one prompt per document, Qwen3-Reranker's as its model card writes it (the
 * instruction, the query and the document in its chat frame, the answer's empty think block
 * opened), whose last token's "yes" against "no" is the score. */
int api_rerank_parse(const char *body, size_t len, int n_vocab, api_request *rq, api_error *e);

/* {"object":"list","data":[{"object":"embedding","index","embedding"}],"model","usage"}: each
 * choice's embedding (n floats; the first rq->dimensions of them renormalised when asked),
 * as numbers or base64 of little-endian float32; width > 0: per-token embeddings (pooling
 * none) of that width, one array per token (base64: all of them, flat). */
char *api_embeddings_json(const api_request *rq, const api_meta *m, const api_choice *ch, int n,
                          const api_usage *u, int width);
/* {"id","model","object":"list","results":[{"index","relevance_score","document"}],"usage"}:
 * the choices' scores (embedding[0]) best first, top_n of them. */
char *api_rerank_json(const api_request *rq, const api_meta *m, const api_choice *ch, int n, const api_usage *u);

#endif
