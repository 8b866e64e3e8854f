/* conn_guard.c - see conn_guard.h. */
#include "conn_guard.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include "base/timing.h"

typedef struct track {
    struct track *prev, *next;
    int fd;
    bool busy, cut;
    double since; /* start of the current deadline (timing_now_s) */
} track;

struct conn_guard {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t thread;
    bool thread_started, stop;
    unsigned timeout_s;
    track *head;
};

/* How often the deadlines are checked: a cut comes at most this late. */
#define CONN_GUARD_PERIOD_MS 250

static void sweep(conn_guard *g)
{
    double n = timing_now_s();
    for (track *t = g->head; t; t = t->next) {
        if (t->busy || t->cut || n - t->since < g->timeout_s) continue;
        /* MHD sees end-of-file on its next read and closes the connection itself. */
        shutdown(t->fd, SHUT_RDWR);
        t->cut = true;
    }
}

static void *run(void *arg)
{
    conn_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec until = timing_deadline_in(CONN_GUARD_PERIOD_MS);
        pthread_cond_timedwait(&g->wake, &g->mu, &until);
        if (!g->stop) sweep(g);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

conn_guard *conn_guard_new(unsigned head_timeout_s)
{
    conn_guard *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->timeout_s = head_timeout_s ? head_timeout_s : 1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->wake, NULL);
    if (pthread_create(&g->thread, NULL, run, g) != 0) {
        conn_guard_free(g);
        return NULL;
    }
    g->thread_started = true;
    return g;
}

void conn_guard_free(conn_guard *g)
{
    if (!g) return;
    if (g->thread_started) {
        pthread_mutex_lock(&g->mu);
        g->stop = true;
        pthread_cond_signal(&g->wake);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
    }
    /* MHD has stopped (and closed every connection) before the guard is freed. */
    while (g->head) {
        track *t = g->head;
        g->head = t->next;
        free(t);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->wake);
    free(g);
}

void conn_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code)
{
    conn_guard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        track *t = ci ? calloc(1, sizeof *t) : NULL;
        *socket_context = t;
        if (!t) return; /* untracked: only MHD's inactivity timeout applies */
        t->fd = ci->connect_fd;
        t->since = timing_now_s();
        pthread_mutex_lock(&g->mu);
        t->next = g->head;
        if (g->head) g->head->prev = t;
        g->head = t;
        pthread_mutex_unlock(&g->mu);
        return;
    }
    track *t = *socket_context;
    if (!t) return;
    pthread_mutex_lock(&g->mu); /* before MHD closes the descriptor: sweep() cannot use it after */
    if (t->prev) t->prev->next = t->next;
    else g->head = t->next;
    if (t->next) t->next->prev = t->prev;
    pthread_mutex_unlock(&g->mu);
    free(t);
    *socket_context = NULL;
}

void conn_guard_set_busy(conn_guard *g, struct MHD_Connection *c, bool busy)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    track *t = ci ? ci->socket_context : NULL;
    if (!g || !t) return;
    pthread_mutex_lock(&g->mu);
    t->busy = busy;
    if (!busy) t->since = timing_now_s();
    pthread_mutex_unlock(&g->mu);
}

bool conn_guard_was_cut(conn_guard *g, struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    track *t = ci ? ci->socket_context : NULL;
    if (!g || !t) return false;
    pthread_mutex_lock(&g->mu);
    bool cut = t->cut;
    pthread_mutex_unlock(&g->mu);
    return cut;
}

unsigned long conn_guard_raise_fd_limit(unsigned long want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    if (rl.rlim_cur < want && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t target = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? (rlim_t)want : rl.rlim_max;
        struct rlimit nl = {target, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &nl) == 0) rl.rlim_cur = target;
    }
    return rl.rlim_cur == RLIM_INFINITY ? want : (unsigned long)rl.rlim_cur;
}
