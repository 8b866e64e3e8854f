/* reply.h - one HTTP request as the handlers see it (MHD's per-request context), and the ways
 * to answer it: a body of any type, JSON, an OpenAI-shaped error.  Each records the status
 * (and an error's message) for the access log and the metrics. */
#ifndef INFERD_HTTP_REPLY_H
#define INFERD_HTTP_REPLY_H

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/api_error.h"
#include "base/bytebuf.h"
#include "base/workq.h"

typedef struct server server;
typedef struct route route;
typedef struct gen gen;

/* One HTTP request (MHD's per-request context). */
/* Names the hosted tools a request offered that the server set aside (--hosted-tools ignore). */
#define HTTP_HEADER_IGNORED_TOOLS "x-inferd-ignored-tools"

typedef struct http_req {
    server *sv;
    struct MHD_Connection *conn;
    const route *rt;          /* the route the path matched (server.c's), NULL before */
    const char *route_method; /* its method, for a 405's Allow header */
    const char *method;
    const char *url; /* decoded path (routing); MHD's, valid while the request lives */
    char path[128];  /* the target as sent, percent-encoded, without the query (access log) */
    bool head_done;  /* the access handler has seen the request's head */
    bool close;      /* the reply closes the connection (framing error, body left unread) */
    bool bad_target; /* the raw target holds %00 */
    double t_start;
    bytebuf body;
    bool too_large;
    bool have_err; /* an error decided before the body was read; sent once it is */
    api_error err;
    int status;    /* of the queued response (metrics, access log) */
    char error[160]; /* message of an error response, for the access log ("" = none) */
    bool answering; /* the body is in: the route's prepare half is queued or done */
    workq_job prep_job; /* the route's prepare half, queued on server.prep */
    bool hold_reply;    /* a handler runs on a prep thread: its reply is made, not queued */
    struct MHD_Response *held; /* that reply, queued by http_reply_held */
    gen *g;        /* completions / chat in progress */
    const char *ignored_tools; /* hosted tools a generation set aside: its x-inferd-ignored-tools header */
} http_req;

/* Queues body (malloc'd; ownership passes) with its content type. */
enum MHD_Result http_reply(http_req *hr, int status, const char *ctype, char *body, size_t len);
/* Queues JSON (ownership passes; NULL -> a 500 "out of memory"). */
enum MHD_Result http_reply_json(http_req *hr, int status, char *json);
/* Queues root printed (and deletes it). */
enum MHD_Result http_reply_cjson(http_req *hr, int status, cJSON *root);
/* An OpenAI-shaped error body (api_error_json). */
enum MHD_Result http_reply_error(http_req *hr, const api_error *e);
/* e with the body its protocol writes for it (json: ownership passes; NULL -> a 500). */
enum MHD_Result http_reply_error_body(http_req *hr, const api_error *e, char *json);
/* Queues the reply a handler made while hr->hold_reply was set (MHD's thread only). */
enum MHD_Result http_reply_held(http_req *hr);

#endif
