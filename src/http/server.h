/* server.h - the HTTP front end: libmicrohttpd routes, authentication, body limits, and the
 * bridge between HTTP connections and scheduler requests (suspend while a request waits for
 * tokens, resume from the scheduler's wake callback).
 *
 * Life cycle: server_start listens at once (so /health can answer 503 while the model loads),
 * server_set_ready publishes the model and scheduler, server_begin_shutdown makes new work
 * answer 503, server_stop closes everything (call it after the scheduler has drained). */
#ifndef INFERD_HTTP_SERVER_H
#define INFERD_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "server_types.h"

server *server_start(const server_config *cfg, char *err, size_t errlen);
int server_port(const server *sv);
void server_set_ready(server *sv, const server_model *sm);
void server_begin_shutdown(server *sv);
/* Wait (bounded) until no HTTP request is still being generated; true when idle. */
bool server_wait_idle(server *sv, int timeout_ms);
void server_stop(server *sv);

#endif
