/* reply.c - see reply.h. */
#include "reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_encode.h"

enum MHD_Result http_reply(http_req *hr, int status, const char *ctype, char *body, size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 405 && hr->route_method) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, hr->route_method);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (hr->ignored_tools) MHD_add_response_header(resp, HTTP_HEADER_IGNORED_TOOLS, hr->ignored_tools);
    /* A body left unread, or a head that could be framed two ways: nothing after this reply
     * on the connection may be read as a request. */
    if (hr->close) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    hr->status = status;
    if (hr->hold_reply) { /* on a prep thread: MHD's own thread queues it (http_reply_held) */
        hr->held = resp;
        return MHD_YES;
    }
    enum MHD_Result r = MHD_queue_response(hr->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

enum MHD_Result http_reply_held(http_req *hr)
{
    struct MHD_Response *resp = hr->held;
    if (!resp) return MHD_NO; /* the handler made none: out of memory */
    hr->held = NULL;
    enum MHD_Result r = MHD_queue_response(hr->conn, (unsigned)hr->status, resp);
    MHD_destroy_response(resp);
    return r;
}

enum MHD_Result http_reply_json(http_req *hr, int status, char *json)
{
    if (!json) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}";
        json = strdup(oom);
        status = 500;
        if (!json) return MHD_NO;
    }
    return http_reply(hr, status, "application/json", json, strlen(json));
}

enum MHD_Result http_reply_error_body(http_req *hr, const api_error *e, char *json)
{
    snprintf(hr->error, sizeof hr->error, "%.*s", (int)sizeof hr->error - 1, e->message);
    return http_reply_json(hr, e->status, json);
}

enum MHD_Result http_reply_error(http_req *hr, const api_error *e)
{
    return http_reply_error_body(hr, e, api_error_json(e));
}

enum MHD_Result http_reply_cjson(http_req *hr, int status, cJSON *root)
{
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return http_reply_json(hr, status, s);
}
