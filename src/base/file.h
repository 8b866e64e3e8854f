/* file.h - opening the files a user names (model, config file, key file) without hanging on
 * one that is not a file: opening a FIFO for reading waits for a writer, which would hang
 * start-up and SIGTERM with it; a directory or a device is no better. */
#ifndef INFERD_BASE_FILE_H
#define INFERD_BASE_FILE_H

#include <stddef.h>
#include <sys/stat.h>

/* Opens path read-only (close-on-exec) when it is a regular file, filling *st when non-NULL.
 * -1 with the reason in err otherwise ("not a regular file", or the system's word); the
 * caller names the path. */
int file_open_regular(const char *path, struct stat *st, char *err, size_t errlen);

/* The whole of a regular file (templates, key files, test vectors), NUL-terminated, malloc'd;
 * *len (may be NULL) gets its length.  NULL with the reason in err when it is not a regular
 * file, cannot be read, or holds more than max_bytes. */
char *file_read_all(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

#endif
