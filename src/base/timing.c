/* timing.c - see timing.h. */
#include "timing.h"

double timing_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double timing_now_s(void) { return timing_now_ms() / 1e3; }

struct timespec timing_deadline_in(int timeout_ms)
{
    if (timeout_ms < 0) timeout_ms = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

bool timing_wait_until_zero(pthread_cond_t *c, pthread_mutex_t *mu, const int *count, int timeout_ms)
{
    struct timespec until = timing_deadline_in(timeout_ms);
    while (*count > 0)
        if (pthread_cond_timedwait(c, mu, &until) != 0) break;
    return *count == 0;
}
