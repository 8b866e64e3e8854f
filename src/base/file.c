/* file.c - see file.h. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
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
