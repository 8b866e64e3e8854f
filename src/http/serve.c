/* serve.c - `inferd serve`: options, logging, listen, load the model, run until SIGINT/SIGTERM,
 * then drain gracefully.
 *
 * The server listens before the model loads so that /health can answer 503 meanwhile.  The
 * main thread then sleeps in a libuv loop whose only job is signals; libuv turns them into
 * callbacks on this thread, so no work happens in a signal handler. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "../cli/cli.h"
#include "../engine/engine.h"
#include "../log.h"
#include "../model/chat.h"
#include "../model/model.h"
#include "../model/tokenizer.h"
#include "../notify.h"
#include "../opts.h"
#include "../sched/sched.h"
#include "server.h"

/* Everything the running server owns, torn down in reverse order by serve_close. */
typedef struct serve_state {
    uv_loop_t loop;
    uv_signal_t sigint, sigterm;
    int signal; /* the first shutdown signal received, 0 while running */
    server *sv;
    model *m;
    tokenizer *tok;
    engine *e;
    sched *s;
    char alias[OPTS_STR_MAX];
    int ctx;
} serve_state;

static void on_signal(uv_signal_t *h, int signum)
{
    serve_state *st = h->data;
    if (!st->signal) st->signal = signum;
    uv_stop(h->loop);
}

static bool signalled(serve_state *st)
{
    uv_run(&st->loop, UV_RUN_NOWAIT); /* deliver a signal that came in while we were busy */
    return st->signal != 0;
}

static const char *basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int pick_template(const inferd_opts *o, const model *m, chat_template_kind *out)
{
    if (o->chat_template[0]) {
        int k = chat_template_from_name(o->chat_template);
        if (k < 0) {
            log_error("--chat-template '%s' is unknown (chatml, llama2, llama3, mistral, zephyr, gemma, phi3)",
                      o->chat_template);
            return -1;
        }
        *out = (chat_template_kind)k;
        return 0;
    }
    size_t len = 0;
    const char *src = gguf_get_str(m->gguf, "tokenizer.chat_template", &len);
    char *copy = src ? strndup(src, len) : NULL;
    *out = chat_template_detect(copy);
    free(copy);
    return 0;
}

static engine *create_engine(const inferd_opts *o, const model *m, const engine_config *ec)
{
    char err[512] = "";
    bool cuda = o->device == OPTS_DEVICE_CUDA || (o->device == OPTS_DEVICE_AUTO && engine_cuda_available());
    if (cuda) {
        engine *e = engine_create_cuda(m, ec, err, sizeof err);
        if (e || o->device == OPTS_DEVICE_CUDA) {
            if (!e) log_error("cuda engine: %s", err);
            return e;
        }
        log_warn("cuda engine unavailable (%s); using the CPU", err);
    }
    engine *e = engine_create_cpu(m, ec, err, sizeof err);
    if (!e) log_error("cpu engine: %s", err);
    return e;
}

/* Model, tokenizer, engine, scheduler. 0 on success. */
static int load(serve_state *st, const inferd_opts *o)
{
    char err[512] = "";
    log_info("loading %s", o->model);
    if (!(st->m = model_load(o->model, err, sizeof err))) {
        log_error("cannot load model %s: %s", o->model, err);
        return -1;
    }
    if (signalled(st)) return -1;
    if (!(st->tok = tokenizer_load(st->m->gguf, err, sizeof err))) {
        log_error("cannot load the tokenizer of %s: %s", o->model, err);
        return -1;
    }
    int n_train = st->m->hp.n_ctx_train > 0 ? st->m->hp.n_ctx_train : 4096;
    st->ctx = o->ctx_size > 0 ? o->ctx_size : (n_train < 4096 ? n_train : 4096);
    if (st->ctx > n_train) log_warn("--ctx-size %d exceeds the model's training context %d", st->ctx, n_train);
    engine_config ec = {
        .n_slots = o->parallel,
        .ctx_per_slot = st->ctx,
        .max_batch_tokens = o->batch_tokens,
        .n_threads = o->threads,
        .device = o->gpu,
        .verbose = o->log_level == LOG_DEBUG,
    };
    if (!(st->e = create_engine(o, st->m, &ec))) return -1;
    if (signalled(st)) return -1;
    sched_config sc = {.n_slots = o->parallel, .ctx_per_slot = st->ctx,
                       .max_batch_tokens = o->batch_tokens, .queue_size = o->queue_size};
    if (!(st->s = sched_create(st->e, st->tok, &sc, err, sizeof err))) {
        log_error("cannot start the scheduler: %s", err);
        return -1;
    }
    chat_template_kind tmpl;
    if (pick_template(o, st->m, &tmpl) != 0) return -1;
    snprintf(st->alias, sizeof st->alias, "%s", o->model_alias[0] ? o->model_alias : basename_of(o->model));
    server_model sm = {.m = st->m, .tok = st->tok, .s = st->s, .tmpl = tmpl, .alias = st->alias,
                       .ctx_per_slot = st->ctx};
    server_set_ready(st->sv, &sm);
    log_info("ready: model %s (%s, %d layers, vocab %d), engine %s, %d slots x %d tokens, chat template %s",
             st->alias, model_arch_name(st->m->hp.arch), st->m->hp.n_layer, st->m->hp.n_vocab,
             engine_name(st->e), o->parallel, st->ctx, chat_template_name(tmpl));
    return 0;
}

/* Graceful stop: refuse new work, let running requests finish within the timeout, close. */
static void serve_close(serve_state *st, double timeout_s)
{
    if (st->sv) server_begin_shutdown(st->sv);
    if (st->s) {
        sched_begin_shutdown(st->s);
        sched_drain(st->s, (int)(timeout_s * 1000));
    }
    /* Drained requests still have their last bytes to send; give clients a moment to read. */
    if (st->sv && !server_wait_idle(st->sv, 2000)) log_warn("closing connections that did not finish");
    server_stop(st->sv);
    sched_destroy(st->s);
    if (st->e) engine_free(st->e);
    tokenizer_free(st->tok);
    model_free(st->m);
}

static void close_loop(serve_state *st)
{
    uv_close((uv_handle_t *)&st->sigint, NULL);
    uv_close((uv_handle_t *)&st->sigterm, NULL);
    uv_run(&st->loop, UV_RUN_DEFAULT);
    uv_loop_close(&st->loop);
}

int cli_serve(int argc, char **argv)
{
    inferd_opts o;
    char err[512];
    opts_defaults(&o);
    int rc = opts_parse_argv(&o, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) {
        fprintf(stderr, "inferd serve: %s\n", err);
        return 2;
    }
    log_set_level((log_level)o.log_level);
    log_set_json(o.log_format == OPTS_LOG_JSON);
    if (o.log_file[0] && log_open_file(o.log_file) != 0) {
        fprintf(stderr, "inferd serve: cannot open --log-file %s\n", o.log_file);
        return 1;
    }
    if (o.config[0]) log_warn("--config %s: config files are not supported yet; ignoring it", o.config);
    if (!o.model[0]) {
        log_error("no model given: pass -m MODEL.gguf (see --help)");
        return 2;
    }
    opts_log(&o);
    notify_init();
    signal(SIGPIPE, SIG_IGN); /* a client that went away must not kill the daemon */

    serve_state st = {0};
    uv_loop_init(&st.loop);
    uv_signal_init(&st.loop, &st.sigint);
    uv_signal_init(&st.loop, &st.sigterm);
    st.sigint.data = st.sigterm.data = &st;
    uv_signal_start(&st.sigint, on_signal, SIGINT);
    uv_signal_start(&st.sigterm, on_signal, SIGTERM);

    server_config sc = {.host = o.host, .port = o.port, .http_threads = o.http_threads,
                        .max_body = (size_t)o.max_body, .api_key = o.api_key, .metrics = o.metrics};
    if (!(st.sv = server_start(&sc, err, sizeof err))) {
        log_error("%s", err);
        close_loop(&st);
        return 1;
    }
    notify_status("loading %s", o.model);
    int exit_code = 0;
    if (load(&st, &o) != 0) {
        exit_code = st.signal ? 0 : 1;
    } else {
        notify_ready();
        notify_status("serving %s on %s:%d", st.alias, o.host, server_port(st.sv));
        if (!st.signal) uv_run(&st.loop, UV_RUN_DEFAULT); /* until SIGINT/SIGTERM */
    }
    if (st.signal)
        log_info("received %s: shutting down (up to %gs for running requests)",
                 st.signal == SIGINT ? "SIGINT" : "SIGTERM", o.shutdown_timeout);
    notify_stopping();
    serve_close(&st, o.shutdown_timeout);
    close_loop(&st);
    log_info("stopped");
    return exit_code;
}
