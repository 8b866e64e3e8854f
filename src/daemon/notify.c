/* notify.c - see notify.h.  The protocol is a single datagram of newline-separated
 * KEY=VALUE assignments; a socket path starting with '@' is in the abstract namespace. */
#include "notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static struct sockaddr_un g_addr;
static socklen_t g_addr_len;
static uint64_t g_watchdog_usec;

void notify_init(void)
{
    g_addr_len = 0;
    g_watchdog_usec = 0;
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path) return;
    size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof g_addr.sun_path) return;
    memset(&g_addr, 0, sizeof g_addr);
    g_addr.sun_family = AF_UNIX;
    memcpy(g_addr.sun_path, path, n);
    if (path[0] == '@') g_addr.sun_path[0] = 0; /* abstract socket */
    g_addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);

    /* The watchdog is meant for us only when WATCHDOG_PID is unset or names this process. */
    const char *usec = getenv("WATCHDOG_USEC");
    const char *pid = getenv("WATCHDOG_PID");
    if (usec && (!pid || strtol(pid, NULL, 10) == (long)getpid()))
        g_watchdog_usec = strtoull(usec, NULL, 10);
}

bool notify_enabled(void) { return g_addr_len > 0; }
uint64_t notify_watchdog_usec(void) { return g_watchdog_usec; }

int notify_send(const char *state)
{
    if (!g_addr_len) return 0;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    ssize_t n;
    do {
        n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *)&g_addr, g_addr_len);
    } while (n < 0 && errno == EINTR);
    close(fd);
    return n < 0 ? -1 : 0;
}

int notify_ready(void) { return notify_send("READY=1"); }
int notify_stopping(void) { return notify_send("STOPPING=1"); }
int notify_watchdog(void) { return notify_send("WATCHDOG=1"); }

int notify_status(const char *fmt, ...)
{
    if (!g_addr_len) return 0;
    char buf[512] = "STATUS=";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + 7, sizeof buf - 7, fmt, ap);
    va_end(ap);
    return notify_send(buf);
}
