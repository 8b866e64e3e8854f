/* file.c - see file.h. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int file_open_regular(const char *path, struct stat *st, char *err, size_t errlen)
{
    /* O_NONBLOCK makes the open itself return at once for a FIFO (refused just below); it
     * changes nothing for a regular file, whose reads never block. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errlen, "%s", strerror(errno));
        return -1;
    }
    struct stat s;
    if (fstat(fd, &s) != 0 || !S_ISREG(s.st_mode)) {
        int e = errno;
        snprintf(err, errlen, "%s", S_ISREG(s.st_mode) ? strerror(e) : "not a regular file");
        close(fd);
        return -1;
    }
    /* Back to blocking reads, which is what every caller expects of a file. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (st) *st = s;
    return fd;
}

char *file_read_all(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen)
{
    struct stat st;
    int fd = file_open_regular(path, &st, err, errlen);
    if (fd < 0) return NULL;
    if ((unsigned long long)st.st_size > max_bytes) {
        snprintf(err, errlen, "larger than %zu bytes", max_bytes);
        close(fd);
        return NULL;
    }
    /* Read to the end rather than trusting st_size: the file may change under us. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap + 1);
    ssize_t r = 0;
    while (buf && (r = read(fd, buf + n, cap - n)) > 0) {
        n += (size_t)r;
        if (n == cap) {
            if (cap > max_bytes) break;
            char *more = realloc(buf, 2 * cap + 1);
            if (!more) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = more;
            cap *= 2;
        }
    }
    int e = errno;
    close(fd);
    if (!buf || r < 0 || n > max_bytes) {
        snprintf(err, errlen, "%s", !buf ? "out of memory" : r < 0 ? strerror(e) : "it grew while being read");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}
