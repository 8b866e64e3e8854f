/* conn_guard.h - deadlines for connections that are not being answered.
 *
 * libmicrohttpd 0.9.75 only knows an inactivity timeout, which every byte resets: a client
 * trickling a header byte a second holds its connection for ever, and enough of them hold
 * every connection the server may have.  The guard tracks every connection (through MHD's
 * connection notifications) and cuts the ones that have spent longer than the head timeout
 * without a request being served: from accept, or from the end of their previous request,
 * to the moment the whole request (head and body) has arrived.  While a request is being
 * answered the connection is "busy" and only MHD's own (longer) inactivity timeout applies.
 *
 * Cutting is shutdown(2) on the socket from the guard's thread, under the lock that MHD's
 * close notification also takes, so a descriptor is never touched after MHD closed it. */
#ifndef INFERD_HTTP_CONN_GUARD_H
#define INFERD_HTTP_CONN_GUARD_H

#include <microhttpd.h>
#include <stdbool.h>

typedef struct conn_guard conn_guard;

/* head_timeout_s: the deadline described above (> 0).  NULL when out of memory. */
conn_guard *conn_guard_new(unsigned head_timeout_s);
void conn_guard_free(conn_guard *g); /* stops the thread; NULL is fine */

/* MHD_OPTION_NOTIFY_CONNECTION callback; cls is the guard. */
void conn_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);

/* busy: the whole request has arrived and is being answered.  Not busy (at the end of a
 * request): the deadline starts again for the next one. */
void conn_guard_set_busy(conn_guard *g, struct MHD_Connection *c, bool busy);

/* Whether the guard cut this connection at its deadline (the access log says 408). */
bool conn_guard_was_cut(conn_guard *g, struct MHD_Connection *c);

/* Raise the soft limit on open files towards want (at most the hard limit); returns the
 * soft limit in force after. */
unsigned long conn_guard_raise_fd_limit(unsigned long want);

#endif
