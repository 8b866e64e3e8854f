/* stats.h - the scheduler's statistics helpers (sched_stats in sched.h is what /metrics
 * reads).  Internal to src/sched. */
#ifndef INFERD_SCHED_STATS_H
#define INFERD_SCHED_STATS_H

#include <stdint.h>

#include "sched.h"

/* Milliseconds between two uv_hrtime() readings. */
double stats_ms_between(uint64_t from_ns, uint64_t to_ns);
/* Counts one observation of ms in h. */
void stats_observe(sched_hist *h, double ms);

#endif
