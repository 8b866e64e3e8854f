/* peer_watch.h - notices at once that a client closed its connection while its request waits
 * on the scheduler.
 *
 * libmicrohttpd does not watch a suspended connection's socket.  A generation's connection is
 * suspended from the moment its requests are submitted (queued, then prefilling) and, when
 * streaming, whenever there is nothing to write: a client that resets while its request is
 * queued was noticed only once its first token woke the connection, after the whole prefill,
 * and a stream whose output is held back (a forced tool call writes nothing until the call is
 * complete) was never noticed at all.  The watch keeps one epoll set of the sockets of the
 * generations in flight (EPOLLRDHUP: the peer's FIN or reset) and a thread that calls the
 * owner's `gone` the moment one closes, so its requests are cancelled in the queue or at the
 * scheduler's next step.
 *
 * Raw epoll rather than a libuv loop: a uv handle may only be started and closed on its
 * loop's thread, and every request would pay a round trip to it. */
#ifndef INFERD_HTTP_PEER_WATCH_H
#define INFERD_HTTP_PEER_WATCH_H

#include <stdbool.h>

typedef struct peer_watch peer_watch;
typedef struct peer_watch_entry peer_watch_entry;

/* NULL when out of memory or epoll/thread creation failed. */
peer_watch *peer_watch_new(void);
void peer_watch_free(peer_watch *w); /* stops the thread; every entry must be removed; NULL is fine */

/* Watch connected socket fd: gone(ctx) runs at most once, on the watch's thread, when its peer
 * has closed (end of file or a socket error on a non-consuming peek).  NULL when out of memory
 * or the socket cannot be watched (the caller then just loses the early notice). */
peer_watch_entry *peer_watch_add(peer_watch *w, int fd, void (*gone)(void *ctx), void *ctx);
/* Stop watching: when it returns, gone is not running and will not run for e.  NULL is fine. */
void peer_watch_remove(peer_watch *w, peer_watch_entry *e);

/* Whether the peer of socket fd has closed: a peek (nothing consumed) sees end of file or an
 * error.  A socket with unread bytes is open whatever follows them. */
bool peer_watch_closed(int fd);

#endif
