/* http_int.h - the server's state, shared by server.c (connections, routes, plain endpoints)
 * and gen.c (the generation endpoints, which server.c calls and which list themselves in the
 * server for shutdown).  Not a public interface; replies are reply.h. */
#ifndef INFERD_HTTP_INT_H
#define INFERD_HTTP_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "api/api_proto.h"
#include "base/workq.h"
#include "conn_guard.h"
#include "metrics.h"
#include "peer_watch.h"
#include "reply.h"
#include "server_types.h"

enum { SERVER_LOADING = 0, SERVER_READY = 1, SERVER_DRAINING = 2 };

typedef struct gen gen;

struct server {
    server_config cfg;
    char host[256];
    char api_key[256];
    struct MHD_Daemon *d;
    int port;
    _Atomic int state;
    server_model sm; /* valid once the state is READY (published by the state store); a server
                      * stopped while loading drains with it still zero (sm.s NULL) */
    char bos_text[128], eos_text[128];
    metrics *metrics;
    workq *prep; /* the prepare half of heavy routes, off MHD's threads (server.c) */
    struct conn_guard *guard; /* cuts connections that take too long to send a request */
    peer_watch *watch;        /* notices generations' clients hanging up while suspended */
    long long started; /* unix time, for /v1/models */
    /* Live generations: counted for server_wait_idle, listed so server_stop can resume any
     * connection still suspended. */
    pthread_mutex_t mu;
    pthread_cond_t idle;
    gen *gens;
    int n_gens;
};

/* gen.c */
/* What the per-request log line says about a generation. */
typedef struct gen_summary {
    const char *id;
    int prompt_tokens, cached_tokens, completion_tokens; /* as in the response's usage */
    double ttft_ms;     /* request start -> first token taken by the HTTP side; NAN when none */
    const char *finish; /* stop, length, cancelled, error; NULL when nothing was generated */
} gen_summary;
void gen_summarize(const gen *g, gen_summary *out);
/* A generation in two halves.  gen_prepare runs on a prep thread (server.c) while the
 * connection is suspended: the body parsed by protocol p's row, the prompt rendered and
 * tokenized, the choices submitted; it calls no MHD function and keeps a failure for the
 * answer.  gen_answer runs on the connection's thread once it is resumed, and again whenever
 * the scheduler wakes it: the error in p's shape, the stream, or the wait for a whole reply. */
void gen_prepare(http_req *hr, const api_protocol *p);
/* How many tokens the prompt of a parsed chat request is (its template rendered, then
 * tokenized), or -1 with the error in e: for counting without generating. */
int gen_prompt_tokens(const server *sv, const api_request *rq, api_error *e);
enum MHD_Result gen_answer(http_req *hr);
void gen_finish(gen *g);                    /* connection closed: cancel, release, free */
void gen_resume_all(server *sv);            /* shutdown: wake every suspended connection */

#endif
