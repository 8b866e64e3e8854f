/* keyfile.c - see keyfile.h. */
#include "keyfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "base/file.h"
#include "base/log.h"

int keyfile_read(const char *path, char *key, size_t cap, char *err, size_t errlen)
{
    char why[300];
    int fd = file_open_regular(path, NULL, why, sizeof why);
    if (fd < 0) {
        snprintf(err, errlen, "--api-key-file %s: %s", path, why);
        return -1;
    }
    char buf[512];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    int read_errno = errno;
    close(fd);
    if (n < 0) {
        snprintf(err, errlen, "--api-key-file %s: %s", path, strerror(read_errno));
        return -1;
    }
    buf[n] = 0;
    char *s = buf;
    while (*s == ' ' || *s == '\t') s++;
    size_t len = strcspn(s, "\r\n");
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
    if (len == 0 || len >= cap) {
        snprintf(err, errlen, "--api-key-file %s: %s", path,
                 len ? "the key is too long" : "the first line holds no key");
        return -1;
    }
    memcpy(key, s, len);
    key[len] = 0;
    return 0;
}

bool keyfile_readable_by_others(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && (st.st_mode & S_IROTH);
}

/* Whether the config file itself sets api-key (parsed again on its own). */
static bool config_sets_key(const char *path)
{
    inferd_opts only_file;
    char err[256];
    opts_defaults(&only_file);
    return config_load(&only_file, path, err, sizeof err) == 0 && only_file.api_key[0];
}

int keyfile_apply(inferd_opts *o, char *err, size_t errlen)
{
    if (o->config[0] && keyfile_readable_by_others(o->config) && config_sets_key(o->config))
        log_warn("config file %s sets api-key and is readable by every user: chmod o-r %s (0640 or 0600)",
                 o->config, o->config);
    if (!o->api_key_file[0]) return 0;
    if (o->api_key[0]) {
        snprintf(err, errlen, "give the key with --api-key or --api-key-file, not both");
        return -1;
    }
    if (keyfile_read(o->api_key_file, o->api_key, sizeof o->api_key, err, errlen) != 0) return -1;
    if (keyfile_readable_by_others(o->api_key_file))
        log_warn("--api-key-file %s is readable by every user: chmod o-r %s (0640 or 0600)", o->api_key_file,
                 o->api_key_file);
    return 0;
}
