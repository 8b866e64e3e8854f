/* cpu_pool.h - a fixed set of worker threads that run one parallel-for at a time.
 *
 * cpu_pool_run() splits [0, n_items) into n_threads contiguous ranges, hands range i to
 * thread i (the caller runs range 0 itself) and returns when all are done.  Each item is
 * always computed by exactly one thread in one fixed order, so results do not depend on the
 * number of threads. */
#ifndef INFERD_CPU_POOL_H
#define INFERD_CPU_POOL_H

typedef struct cpu_pool cpu_pool;

/* Work on items [begin, end); thread is 0..n_threads-1 (to pick per-thread scratch). */
typedef void (*cpu_pool_fn)(void *ctx, int begin, int end, int thread);

/* n_threads >= 1 counts the caller.  NULL when a thread cannot be started. */
cpu_pool *cpu_pool_create(int n_threads);
int cpu_pool_threads(const cpu_pool *p);
void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *ctx, int n_items);
void cpu_pool_free(cpu_pool *p);

#endif
