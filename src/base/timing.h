/* timing.h - clocks and deadlines: a monotonic clock for durations, and absolute deadlines
 * for pthread_cond_timedwait (which counts on CLOCK_REALTIME unless told otherwise). */
#ifndef INFERD_BASE_TIMING_H
#define INFERD_BASE_TIMING_H

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

double timing_now_ms(void); /* monotonic, milliseconds */
double timing_now_s(void);  /* monotonic, seconds */

/* The CLOCK_REALTIME instant timeout_ms (< 0 counts as 0) from now. */
struct timespec timing_deadline_in(int timeout_ms);

/* Waits on c (with mu held) until *count reads 0 or timeout_ms have passed; true when it
 * reached 0 in time.  The bounded "wait until nothing is left running" of shutdowns. */
bool timing_wait_until_zero(pthread_cond_t *c, pthread_mutex_t *mu, const int *count, int timeout_ms);

#endif
