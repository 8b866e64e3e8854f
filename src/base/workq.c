/* workq.c - see workq.h.  One mutex over a FIFO list of jobs; idle threads wait on a
 * condition variable. */
#include "workq.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct workq {
    pthread_mutex_t mu;
    pthread_cond_t ready;
    workq_job *head, *tail;
    bool stopping;
    int n_threads;
    pthread_t *threads;
};

static void *worker(void *arg)
{
    workq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stopping) pthread_cond_wait(&q->ready, &q->mu);
        workq_job *j = q->head;
        if (!j) break; /* stopping, and nothing left to run */
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        void (*fn)(void *) = j->fn;
        void *a = j->arg;
        pthread_mutex_unlock(&q->mu);
        fn(a); /* j may be gone after this */
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

workq *workq_new(int n_threads)
{
    workq *q = calloc(1, sizeof *q);
    if (!q || n_threads < 1 || !(q->threads = calloc((size_t)n_threads, sizeof *q->threads))) {
        if (q) free(q->threads);
        free(q);
        return NULL;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->ready, NULL);
    for (; q->n_threads < n_threads; q->n_threads++) {
        if (pthread_create(&q->threads[q->n_threads], NULL, worker, q) != 0) {
            workq_free(q);
            return NULL;
        }
    }
    return q;
}

int workq_push(workq *q, workq_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&q->mu);
    bool ok = !q->stopping;
    if (ok) {
        if (q->tail) q->tail->next = j;
        else q->head = j;
        q->tail = j;
        pthread_cond_signal(&q->ready);
    }
    pthread_mutex_unlock(&q->mu);
    return ok ? 0 : -1;
}

void workq_free(workq *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stopping = true;
    pthread_cond_broadcast(&q->ready);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->n_threads; i++) pthread_join(q->threads[i], NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->ready);
    free(q->threads);
    free(q);
}
