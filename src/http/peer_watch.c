/* peer_watch.c - see peer_watch.h. */
#include "peer_watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

struct peer_watch_entry {
    peer_watch_entry *prev, *next;
    int fd;
    bool fired;
    void (*gone)(void *ctx);
    void *ctx;
};

struct peer_watch {
    int ep;      /* the epoll set */
    int stop_fd; /* an eventfd in the set: written once to end the thread */
    pthread_t thread;
    bool thread_started;
    /* Held while an entry is added, removed or fired: an event that arrives for a socket
     * whose entry is already gone finds nothing, and remove waits for a running gone. */
    pthread_mutex_t mu;
    peer_watch_entry *head;
};

bool peer_watch_closed(int fd)
{
    char byte;
    ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* An event names a descriptor; the entry is looked up under the lock, so an event read just
 * before its entry was removed (or its number reused) is checked against the live entries
 * and the socket itself, never acted on blindly. */
static void on_event(peer_watch *w, int fd)
{
    pthread_mutex_lock(&w->mu);
    for (peer_watch_entry *e = w->head; e; e = e->next) {
        if (e->fd != fd || e->fired) continue;
        if (peer_watch_closed(fd)) {
            e->fired = true;
            e->gone(e->ctx);
        }
        break;
    }
    pthread_mutex_unlock(&w->mu);
}

static void *run(void *arg)
{
    peer_watch *w = arg;
    for (;;) {
        struct epoll_event ev[32];
        int n = epoll_wait(w->ep, ev, 32, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return NULL; /* cannot happen with a valid set; the early notice is lost */
        for (int i = 0; i < n; i++) {
            if (ev[i].data.fd == w->stop_fd) return NULL;
            on_event(w, ev[i].data.fd);
        }
    }
}

peer_watch *peer_watch_new(void)
{
    peer_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    pthread_mutex_init(&w->mu, NULL);
    w->ep = epoll_create1(EPOLL_CLOEXEC);
    w->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = w->stop_fd};
    if (w->ep < 0 || w->stop_fd < 0 || epoll_ctl(w->ep, EPOLL_CTL_ADD, w->stop_fd, &ev) != 0 ||
        pthread_create(&w->thread, NULL, run, w) != 0) {
        peer_watch_free(w);
        return NULL;
    }
    w->thread_started = true;
    return w;
}

void peer_watch_free(peer_watch *w)
{
    if (!w) return;
    if (w->thread_started) {
        uint64_t one = 1;
        if (write(w->stop_fd, &one, sizeof one) == sizeof one) pthread_join(w->thread, NULL);
        else return; /* cannot happen with an eventfd; never free what a running thread uses */
    }
    if (w->ep >= 0) close(w->ep);
    if (w->stop_fd >= 0) close(w->stop_fd);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

peer_watch_entry *peer_watch_add(peer_watch *w, int fd, void (*gone)(void *ctx), void *ctx)
{
    peer_watch_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    *e = (peer_watch_entry){.fd = fd, .gone = gone, .ctx = ctx};
    /* One shot: after a close the socket stays readable, and level-triggered it would fire
     * for ever; the entry has done its work by then. */
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.fd = fd};
    pthread_mutex_lock(&w->mu);
    if (epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        pthread_mutex_unlock(&w->mu);
        free(e);
        return NULL;
    }
    e->next = w->head;
    if (w->head) w->head->prev = e;
    w->head = e;
    pthread_mutex_unlock(&w->mu);
    return e;
}

void peer_watch_remove(peer_watch *w, peer_watch_entry *e)
{
    if (!e) return;
    pthread_mutex_lock(&w->mu);
    epoll_ctl(w->ep, EPOLL_CTL_DEL, e->fd, NULL); /* the socket is still open: MHD closes it after */
    if (e->prev) e->prev->next = e->next;
    else w->head = e->next;
    if (e->next) e->next->prev = e->prev;
    pthread_mutex_unlock(&w->mu);
    free(e);
}
