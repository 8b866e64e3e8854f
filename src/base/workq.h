/* workq.h - a fixed pool of threads running jobs in the order they were pushed.
 *
 * The HTTP server hands it what may take a worker long (parsing a large body, rendering and
 * tokenizing a prompt) so that MHD's threads stay free for I/O and /health.  libuv's pool is
 * no fit: uv_queue_work may only be called on its loop's thread, and MHD's are not.
 *
 * Thread-safe: any thread may push.  A job runs on exactly one pool thread. */
#ifndef INFERD_BASE_WORKQ_H
#define INFERD_BASE_WORKQ_H

typedef struct workq workq;

/* A job lives in memory of the pusher's (as libuv's uv_work_t does), so pushing cannot run out
 * of memory.  The pool reads fn and arg before it calls fn and never touches the job after:
 * fn may end the job's life. */
typedef struct workq_job {
    void (*fn)(void *arg);
    void *arg;
    struct workq_job *next; /* the queue's */
} workq_job;

/* n_threads >= 1; NULL when a thread or memory could not be had. */
workq *workq_new(int n_threads);
/* 0, or -1 (nothing queued) when the queue is being freed. */
int workq_push(workq *q, workq_job *j);
/* Runs every job already queued, then joins the threads and frees q.  NULL is a no-op. */
void workq_free(workq *q);

#endif
