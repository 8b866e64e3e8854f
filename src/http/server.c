/* server.c - see server.h.  Routing is one table; every request goes through the same gate
 * (route -> method -> API key -> model loaded -> body size) before its handler runs. */
#include "server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "api/api_encode.h"
#include "base/log.h"
#include "base/timing.h"
#include "http_guard.h"
#include "endpoints.h"
#include "http_int.h"

typedef enum MHD_Result (*route_fn)(http_req *hr);

struct route {
    const char *path;
    const char *method; /* NULL: any */
    route_fn fn;
    bool open;       /* no API key needed */
    bool needs_model;
    const api_protocol *proto; /* a generation's protocol row (fn is then gen_answer when prepare
                                * is set); also the shape of the route's refusals */
    /* The slow half of a route (parsing a body, building a prompt), run on a prep thread while
     * the connection is suspended, so that MHD's threads never wait on it: however many large
     * bodies are being parsed, /health and /metrics answer at once.  It calls no MHD function;
     * fn answers on the connection's thread afterwards.  NULL: fn does it all. */
    void (*prepare)(http_req *hr);
    /* fn is slow as a whole (it parses and tokenizes a body): it runs on a prep thread with its
     * reply held, which MHD's thread then queues. */
    bool off_thread;
    /* Another header the API key may come in, besides Authorization: Bearer (Anthropic's
     * clients send x-api-key); NULL: none. */
    const char *key_header;
};

/* ---- routes ------------------------------------------------------------------------------ */

static void prep_generation(http_req *hr) { gen_prepare(hr, hr->rt->proto); }

static const route routes[] = {
    {"/health", "GET", endpoint_health, true, false, NULL, NULL, false, NULL},
    {"/metrics", "GET", endpoint_metrics, false, false, NULL, NULL, false, NULL},
    {"/v1/models", "GET", endpoint_models, false, true, NULL, NULL, false, NULL},
    {"/v1/models/", "GET", endpoint_model, false, true, NULL, NULL, false, NULL}, /* prefix: /v1/models/{id} */
    {"/v1/completions", "POST", gen_answer, false, true, &proto_completions, prep_generation, false, NULL},
    {"/v1/chat/completions", "POST", gen_answer, false, true, &proto_chat, prep_generation, false, NULL},
    {"/v1/responses", "POST", gen_answer, false, true, &proto_responses, prep_generation, false, NULL},
    {"/v1/messages", "POST", gen_answer, false, true, &proto_messages, prep_generation, false, "x-api-key"},
    {"/v1/embeddings", "POST", gen_answer, false, true, &proto_embeddings, prep_generation, false, NULL},
    {"/v1/rerank", "POST", gen_answer, false, true, &proto_rerank, prep_generation, false, NULL},
    {"/rerank", "POST", gen_answer, false, true, &proto_rerank, prep_generation, false, NULL},
    {"/v1/messages/count_tokens", "POST", endpoint_count_tokens, false, true, &proto_messages, NULL, true, "x-api-key"},
    /* Message Batches, every method and sub-path: a 400 naming them (endpoint_messages_batches) */
    {"/v1/messages/batches", NULL, endpoint_messages_batches, false, false, &proto_messages, NULL, false, "x-api-key"},
    {"/v1/messages/batches/", NULL, endpoint_messages_batches, false, false, &proto_messages, NULL, false, "x-api-key"},
    {"/tokenize", "POST", endpoint_tokenize, false, true, NULL, NULL, true, NULL},
    {"/detokenize", "POST", endpoint_detokenize, false, true, NULL, NULL, true, NULL},
};

static const route *find_route(const server *sv, const char *url)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const route *r = &routes[i];
        size_t n = strlen(r->path);
        bool prefix = r->path[n - 1] == '/';
        if (prefix ? strncmp(url, r->path, n) == 0 && url[n] : strcmp(url, r->path) == 0) {
            if (r->fn == endpoint_metrics && !sv->cfg.metrics) return NULL;
            return r;
        }
    }
    return NULL;
}

/* The key is checked before anything else is said about the URL, so that without it not even
 * which routes exist can be learnt (only the open routes, /health, answer). */
static bool authorized(http_req *hr)
{
    if (!hr->sv->api_key[0] || (hr->rt && hr->rt->open)) return true;
    const char *h = MHD_lookup_connection_value(hr->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (http_guard_bearer(h, hr->sv->api_key)) return true;
    const char *kh = hr->rt ? hr->rt->key_header : NULL;
    return kh && http_guard_key(MHD_lookup_connection_value(hr->conn, MHD_HEADER_KIND, kh), hr->sv->api_key);
}

/* A refusal before the handler runs, in the shape of the route's protocol (Anthropic's
 * clients read only theirs). */
static enum MHD_Result reply_refusal(http_req *hr)
{
    const api_protocol *p = hr->rt ? hr->rt->proto : NULL;
    return p ? http_reply_error_body(hr, &hr->err, p->error(&hr->err)) : http_reply_error(hr, &hr->err);
}

/* Whether the request announces a body (that replying now would leave unread). */
static bool has_body(struct MHD_Connection *conn)
{
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return (cl && strtoull(cl, NULL, 10) > 0) ||
           MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
}

/* Checks that need only the head and must be answered before the body is read (no 100
 * Continue, not a byte of the body): a malformed head, a missing or wrong key.  Fills
 * hr->err and returns false when the request is refused. */
static bool head_gate(http_req *hr, const char *url, const char *version)
{
    api_error *e = &hr->err;
    hr->rt = find_route(hr->sv, url);
    hr->route_method = hr->rt ? hr->rt->method : NULL;
    if (hr->bad_target) {
        api_error_set(e, 400, "invalid_request_error", NULL, "invalid_url",
                      "The request URL contains an encoded NUL byte (%%00).");
    } else if (http_guard_framing(hr->conn, version, e) == 0) {
        if (authorized(hr)) return true;
        const char *kh = hr->rt ? hr->rt->key_header : NULL;
        api_error_set(e, 401, "invalid_request_error", NULL, "invalid_api_key",
                      "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'%s%s%s.",
                      kh ? " or '" : "", kh ? kh : "", kh ? ": KEY'" : "");
        hr->close = has_body(hr->conn);
        return false;
    }
    hr->close = true;
    return false;
}

/* Decide on the first call whether the request may proceed; fills hr->err when not. */
static bool gate(http_req *hr, const char *url, const char *method)
{
    server *sv = hr->sv;
    api_error *e = &hr->err;
    if (!hr->rt) {
        api_error_set(e, 404, "invalid_request_error", NULL, "unknown_url",
                      "Unknown request URL: %.8s %.100s. Please check the URL for typos.", method, url);
        return false;
    }
    if (hr->rt->method && strcmp(method, hr->rt->method) != 0) { /* NULL: any method */
        api_error_set(e, 405, "invalid_request_error", NULL, "method_not_allowed",
                      "Method %.8s is not allowed for %s; use %s.", method, hr->rt->path, hr->rt->method);
        return false;
    }
    int st = atomic_load(&sv->state);
    if (hr->rt->needs_model && st != SERVER_READY) {
        api_error_set(e, 503, "unavailable_error", NULL, st == SERVER_LOADING ? "model_loading" : "shutting_down",
                      st == SERVER_LOADING ? "The model is still loading; retry shortly."
                                           : "The server is shutting down.");
        return false;
    }
    return true;
}

static void body_too_large(http_req *hr)
{
    api_error_set(&hr->err, 413, "invalid_request_error", NULL, "request_too_large",
                  "The request body exceeds the limit of %zu bytes.", hr->sv->cfg.max_body);
}

/* MHD_OPTION_URI_LOG_CALLBACK: the request line has arrived, the head has not.  The request's
 * context starts here so that the raw target (before MHD decodes %00 into a NUL that ends the
 * path) can be checked and logged, and so that a request MHD refuses on its own still gets
 * its access-log line and metric (on_completed). */
static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *conn)
{
    http_req *hr = calloc(1, sizeof *hr);
    if (!hr) return NULL;
    hr->sv = cls;
    hr->conn = conn;
    hr->t_start = timing_now_ms();
    api_error ignored;
    hr->bad_target = http_guard_target(uri, &ignored) != 0;
    snprintf(hr->path, sizeof hr->path, "%.*s", (int)strcspn(uri, "?"), uri);
    return hr;
}

/* A prep thread's job: the route's slow half, then the connection goes back to MHD, whose
 * next call of on_request answers.  hr may be freed as soon as the connection resumes. */
static void prepare_job(void *arg)
{
    http_req *hr = arg;
    if (hr->rt->prepare) {
        hr->rt->prepare(hr);
    } else {
        hr->hold_reply = true;
        hr->rt->fn(hr);
        hr->hold_reply = false;
    }
    MHD_resume_connection(hr->conn);
}

/* The answer once the body is in: fn, or the reply an off-thread fn made. */
static enum MHD_Result answer(http_req *hr)
{
    return hr->rt->off_thread ? http_reply_held(hr) : hr->rt->fn(hr);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    server *sv = cls;
    http_req *hr = *con_cls;
    if (!hr) { /* the request-line callback ran out of memory */
        if (!(hr = on_request_line(sv, url, conn))) return MHD_NO;
        *con_cls = hr;
    }
    if (!hr->head_done) { /* first call: headers only */
        hr->head_done = true;
        hr->method = method;
        hr->url = url;
        if (!head_gate(hr, url, version)) return reply_refusal(hr);
        hr->have_err = !gate(hr, url, method);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (!hr->have_err && cl && strtoull(cl, NULL, 10) > sv->cfg.max_body) {
            /* Refuse before reading a byte of the body. */
            body_too_large(hr);
            hr->close = true;
            return reply_refusal(hr);
        }
        return MHD_YES;
    }
    if (*upload_data_size) { /* a piece of the body */
        if (!hr->have_err && !hr->too_large) {
            if (hr->body.len + *upload_data_size > sv->cfg.max_body) {
                hr->too_large = true;
                bytebuf_free(&hr->body);
            } else {
                bytebuf_append(&hr->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (hr->answering) return answer(hr); /* resumed: prepared, or woken by the scheduler */
    /* The whole request is in: from here on it is being answered, which may take as long as
     * generation does, so the head deadline stops and MHD's inactivity timeout gets long. */
    conn_guard_set_busy(sv->guard, conn, true);
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, sv->cfg.stream_timeout_s);
    if (hr->too_large) {
        body_too_large(hr);
        hr->have_err = true;
    }
    if (hr->have_err) return reply_refusal(hr);
    if (!bytebuf_ok(&hr->body)) return http_reply_json(hr, 500, NULL);
    hr->answering = true;
    if (!hr->rt->prepare && !hr->rt->off_thread) return hr->rt->fn(hr);
    /* Suspended before the job is queued, so its resume always follows the suspend. */
    MHD_suspend_connection(conn);
    hr->prep_job = (workq_job){.fn = prepare_job, .arg = hr};
    if (workq_push(sv->prep, &hr->prep_job) != 0) prepare_job(hr); /* the pool is stopping: here, then */
    return MHD_YES;
}

/* The one log line of every finished HTTP request; generations add their id, token counts,
 * time to first token and finish reason.  5xx are warnings: something on our side failed. */
static void log_request(const http_req *hr, int status, bool closed_early)
{
    log_field f[12];
    int n = 0;
    gen_summary gs = {0};
    if (hr->g) {
        gen_summarize(hr->g, &gs);
        f[n++] = LOG_STR("id", gs.id);
    }
    f[n++] = LOG_STR("method", hr->method);
    f[n++] = LOG_STR("path", hr->path);
    f[n++] = LOG_INT("status", status);
    if (hr->g) {
        f[n++] = LOG_INT("prompt_tokens", gs.prompt_tokens);
        f[n++] = LOG_INT("cached_tokens", gs.cached_tokens);
        f[n++] = LOG_INT("completion_tokens", gs.completion_tokens);
        f[n++] = LOG_NUM("ttft_ms", gs.ttft_ms);
    }
    f[n++] = LOG_NUM("total_ms", timing_now_ms() - hr->t_start);
    if (hr->g) f[n++] = LOG_STR("finish", gs.finish);
    if (hr->error[0]) f[n++] = LOG_STR("error", hr->error);
    if (closed_early) f[n++] = LOG_STR("connection", "closed early");
    log_event(status >= 500 ? LOG_WARN : LOG_INFO, "request", f, n);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    server *sv = cls;
    http_req *hr = *con_cls;
    if (!hr) return;
    *con_cls = NULL;
    conn_guard_set_busy(sv->guard, conn, false); /* a keep-alive connection's next deadline */
    int status = hr->status ? hr->status : 499; /* nginx's "client closed request" */
    if (!hr->head_done) {
        /* The access handler never saw this request: MHD refused its head itself (an error
         * reply, e.g. a Content-Length it cannot parse), or it never arrived in time. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        bool cut = conn_guard_was_cut(sv->guard, conn) || toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED;
        status = cut ? 408 : cl && cl[0] >= '0' && cl[0] <= '9' ? 413 : 400;
        snprintf(hr->error, sizeof hr->error, "%s",
                 status != 408 ? "malformed or unfinished request head (refused by the HTTP parser)"
                               : "the request head did not arrive in time");
    }
    metrics_count_status(sv->metrics, status);
    log_request(hr, status, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    if (hr->g) gen_finish(hr->g);
    if (hr->held) MHD_destroy_response(hr->held);
    bytebuf_free(&hr->body);
    free(hr);
}

/* MHD logs once per refused connection (limits reached, a malformed head): a flood of those
 * must not become a flood of log lines.  At most MHD_LOG_BURST lines a second; the count of
 * the ones dropped is reported with the next line that gets through. */
#define MHD_LOG_BURST 20

static bool mhd_log_allowed(long *dropped)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static long window, used, skipped;
    long second = (long)timing_now_s();
    pthread_mutex_lock(&mu);
    if (second != window) {
        window = second;
        used = 0;
    }
    bool ok = used < MHD_LOG_BURST;
    if (ok) {
        used++;
        *dropped = skipped;
        skipped = 0;
    } else {
        skipped++;
    }
    pthread_mutex_unlock(&mu);
    return ok;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    long dropped = 0;
    if (!mhd_log_allowed(&dropped)) return;
    if (dropped) log_warn("http: %ld similar messages suppressed", dropped);
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    log_warn("http: %s", msg);
}

/* Resolve host (an IP literal or a name) to one socket address. */
static int resolve(const char *host, int port, struct sockaddr_storage *ss, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "cannot resolve --host '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* Descriptors kept for everything but client connections (model file, log, engine, CUDA). */
#define SERVER_FD_RESERVE 256

/* max_connections, lowered (with a warning) to what the open-files limit allows. */
static unsigned server_fit_fd_limit(unsigned max_connections)
{
    unsigned long limit = conn_guard_raise_fd_limit((unsigned long)max_connections + SERVER_FD_RESERVE);
    if (limit >= (unsigned long)max_connections + SERVER_FD_RESERVE) return max_connections;
    unsigned fit = limit > SERVER_FD_RESERVE + 16 ? (unsigned)(limit - SERVER_FD_RESERVE) : 16;
    log_warn("--max-connections %u needs %u open files, the limit is %lu: serving at most %u connections "
             "(raise LimitNOFILE= / ulimit -n)", max_connections, max_connections + SERVER_FD_RESERVE, limit, fit);
    return fit;
}

server *server_start(const server_config *cfg, char *err, size_t errlen)
{
    server *sv = calloc(1, sizeof *sv);
    if (!sv) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sv->cfg = *cfg;
    snprintf(sv->host, sizeof sv->host, "%s", cfg->host ? cfg->host : "127.0.0.1");
    snprintf(sv->api_key, sizeof sv->api_key, "%s", cfg->api_key ? cfg->api_key : "");
    sv->cfg.host = sv->host;
    sv->cfg.api_key = sv->api_key;
    sv->metrics = metrics_new();
    sv->started = (long long)time(NULL);
    pthread_mutex_init(&sv->mu, NULL);
    pthread_cond_init(&sv->idle, NULL);
    struct sockaddr_storage ss;
    if (!sv->metrics || resolve(sv->host, cfg->port, &ss, err, errlen) != 0) {
        server_stop(sv);
        return NULL;
    }
    int n_threads = cfg->http_threads > 0 ? cfg->http_threads : 1;
    if (!(sv->guard = conn_guard_new(cfg->timeout_s)) || !(sv->watch = peer_watch_new()) ||
        !(sv->prep = workq_new(n_threads))) {
        snprintf(err, errlen, "out of memory or threads");
        server_stop(sv);
        return NULL;
    }
    unsigned max_conn = server_fit_fd_limit(cfg->max_connections);
    /* epoll in a pool of threads: idle connections cost a little memory, no thread each. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    sv->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, sv,
                             MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, /* first: catches the rest */
                             MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                             MHD_OPTION_THREAD_POOL_SIZE, (unsigned)n_threads,
                             MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv,
                             MHD_OPTION_URI_LOG_CALLBACK, on_request_line, sv,
                             MHD_OPTION_NOTIFY_CONNECTION, conn_guard_notify, sv->guard,
                             MHD_OPTION_CONNECTION_TIMEOUT, cfg->timeout_s,
                             MHD_OPTION_CONNECTION_LIMIT, max_conn,
                             MHD_OPTION_PER_IP_CONNECTION_LIMIT, cfg->max_connections_per_ip,
                             MHD_OPTION_END);
    if (!sv->d) {
        snprintf(err, errlen, "cannot listen on %s:%d (address in use or not permitted)", sv->host, cfg->port);
        server_stop(sv);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(sv->d, MHD_DAEMON_INFO_BIND_PORT);
    sv->port = info && info->port ? info->port : cfg->port;
    log_info("listening on http://%s:%d (at most %u connections, %u per address; %u s for a request, %u s "
             "of inactivity while answering)", sv->host, sv->port, max_conn, cfg->max_connections_per_ip,
             cfg->timeout_s, cfg->stream_timeout_s);
    return sv;
}

int server_port(const server *sv) { return sv->port; }

void server_set_ready(server *sv, const server_model *sm)
{
    sv->sm = *sm;
    int32_t bos = tokenizer_bos(sm->tok), eos = tokenizer_eos(sm->tok);
    size_t len = 0;
    const char *t = bos >= 0 ? tokenizer_token_text(sm->tok, bos, &len) : NULL;
    snprintf(sv->bos_text, sizeof sv->bos_text, "%.*s", t ? (int)len : 0, t ? t : "");
    t = eos >= 0 ? tokenizer_token_text(sm->tok, eos, &len) : NULL;
    snprintf(sv->eos_text, sizeof sv->eos_text, "%.*s", t ? (int)len : 0, t ? t : "");
    atomic_store(&sv->state, SERVER_READY); /* publishes sm to the HTTP threads */
}

void server_begin_shutdown(server *sv) { atomic_store(&sv->state, SERVER_DRAINING); }

bool server_wait_idle(server *sv, int timeout_ms)
{
    pthread_mutex_lock(&sv->mu);
    bool idle = timing_wait_until_zero(&sv->idle, &sv->mu, &sv->n_gens, timeout_ms);
    pthread_mutex_unlock(&sv->mu);
    return idle;
}

void server_stop(server *sv)
{
    if (!sv) return;
    /* Queued preparations run to the end and resume their connections first: MHD must not be
     * stopped with suspended connections. */
    workq_free(sv->prep);
    if (sv->d) {
        gen_resume_all(sv);
        MHD_stop_daemon(sv->d);
    }
    conn_guard_free(sv->guard);
    peer_watch_free(sv->watch); /* every generation has finished: no entry is left */
    metrics_free(sv->metrics);
    pthread_mutex_destroy(&sv->mu);
    pthread_cond_destroy(&sv->idle);
    free(sv);
}
