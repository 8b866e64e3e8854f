/* notify.h - the systemd sd_notify protocol (Type=notify services), without libsystemd:
 * one datagram per state change to the AF_UNIX socket named by $NOTIFY_SOCKET.  Every
 * function is a no-op when the daemon was not started by systemd (no NOTIFY_SOCKET). */
#ifndef INFERD_NOTIFY_H
#define INFERD_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Reads NOTIFY_SOCKET and WATCHDOG_USEC/WATCHDOG_PID once (at start-up). */
void notify_init(void);
bool notify_enabled(void);
/* Sends a raw state string such as "READY=1" or "STATUS=loading\nMAINPID=42". 0 on success. */
int notify_send(const char *state);
int notify_ready(void);
int notify_stopping(void);
int notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int notify_watchdog(void);
/* Watchdog interval requested by systemd in microseconds (0 = none). Ping at half of it. */
uint64_t notify_watchdog_usec(void);

#endif
