/* stats.c - see stats.h and sched.h. */
#include "stats.h"

const double sched_hist_bounds_ms[SCHED_HIST_BUCKETS] = {
    5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000,
};

double stats_ms_between(uint64_t from_ns, uint64_t to_ns) { return (double)(to_ns - from_ns) / 1e6; }

void stats_observe(sched_hist *h, double ms)
{
    int b = 0;
    while (b < SCHED_HIST_BUCKETS && ms > sched_hist_bounds_ms[b]) b++;
    h->counts[b]++;
    h->sum_ms += ms;
    h->n++;
}

const char *sched_finish_name(sched_finish f)
{
    static const char *const names[] = {"none", "stop", "length", "cancelled", "error"};
    return f >= SCHED_FINISH_NONE && f <= SCHED_FINISH_ERROR ? names[f] : "unknown";
}
