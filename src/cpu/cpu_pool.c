/* cpu_pool.c - fork/join worker pool on a mutex and two condition variables.
 *
 * Each run bumps a generation counter; a worker that sees a new generation runs its range and
 * reports back.  Steps are milliseconds long and runs per step are few dozen, so a condvar
 * hand-off (microseconds) costs nothing measurable and keeps the pool simple and sanitizer
 * friendly. */
#include "cpu_pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct worker {
    cpu_pool *pool;
    int index;
    pthread_t thread;
} worker;

struct cpu_pool {
    int n_threads;
    int n_started; /* worker threads actually running (n_threads - 1 once created) */
    worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* generation changed or quit */
    pthread_cond_t done_cv; /* pending reached 0 */
    uint64_t generation;
    int pending;
    bool quit;
    cpu_pool_fn fn;
    void *ctx;
    int n_items;
};

static void run_range(cpu_pool *p, cpu_pool_fn fn, void *ctx, int n_items, int thread)
{
    int begin = (int)((int64_t)n_items * thread / p->n_threads);
    int end = (int)((int64_t)n_items * (thread + 1) / p->n_threads);
    if (begin < end) fn(ctx, begin, end, thread);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    cpu_pool *p = w->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->generation == seen && !p->quit) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        cpu_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        int n_items = p->n_items;
        pthread_mutex_unlock(&p->mu);
        run_range(p, fn, ctx, n_items, w->index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

cpu_pool *cpu_pool_create(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        cpu_pool_free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        p->workers[i] = (worker){.pool = p, .index = i};
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
            cpu_pool_free(p);
            return NULL;
        }
        p->n_started++;
    }
    return p;
}

int cpu_pool_threads(const cpu_pool *p) { return p->n_threads; }

void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *ctx, int n_items)
{
    if (n_items <= 0) return;
    if (p->n_threads == 1) {
        fn(ctx, 0, n_items, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    run_range(p, fn, ctx, n_items, 0);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void cpu_pool_free(cpu_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->n_started; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}
