/* endpoints.h - the plain endpoints, as the route table of server.c names them.  Each gets a
 * request whose route, method, key and body were already checked. */
#ifndef INFERD_HTTP_ENDPOINTS_H
#define INFERD_HTTP_ENDPOINTS_H

#include "reply.h"

enum MHD_Result endpoint_health(http_req *hr);     /* GET /health */
enum MHD_Result endpoint_metrics(http_req *hr);    /* GET /metrics (Prometheus text) */
enum MHD_Result endpoint_models(http_req *hr);     /* GET /v1/models */
enum MHD_Result endpoint_model(http_req *hr);      /* GET /v1/models/{id} */
enum MHD_Result endpoint_tokenize(http_req *hr);   /* POST /tokenize */
enum MHD_Result endpoint_detokenize(http_req *hr); /* POST /detokenize */
enum MHD_Result endpoint_count_tokens(http_req *hr); /* POST /v1/messages/count_tokens */
enum MHD_Result endpoint_messages_batches(http_req *hr); /* /v1/messages/batches[/...]: a 400 */

#endif
