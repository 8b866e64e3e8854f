/* metrics.h - the server's Prometheus counters (/metrics).  HTTP-level counters live here
 * (lock-free, bumped from any HTTP thread); engine-level figures come from sched_get_stats at
 * scrape time. */
#ifndef INFERD_HTTP_METRICS_H
#define INFERD_HTTP_METRICS_H

#include <stdint.h>

#include "sched/sched.h"
#include "base/bytebuf.h"

typedef struct metrics metrics;

metrics *metrics_new(void);
void metrics_free(metrics *m);
/* One finished HTTP request with this status (any route). */
void metrics_count_status(metrics *m, int status);
uint64_t metrics_status_count(const metrics *m, int status);
/* One generation cancelled because its client closed the connection. */
void metrics_count_client_gone(metrics *m);

/* Prometheus text exposition. st may be NULL while the model is loading. */
typedef struct metrics_view {
    const sched_stats *st;
    int ctx_per_slot;
    int ready; /* 1 when the model is loaded */
} metrics_view;
void metrics_render(const metrics *m, const metrics_view *v, bytebuf *out);

#endif
