/* cli_common.c - see cli_common.h. */
#include "cli_common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool cli_parse_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "inferd %s: %s: '%s' is not an integer in %ld..%ld\n", cmd, flag, s, lo, hi);
        return false;
    }
    *out = (int)v;
    return true;
}

bool cli_parse_float(const char *cmd, const char *flag, const char *s, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "inferd %s: %s: '%s' is not a number in %g..%g\n", cmd, flag, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

int cli_parse_int_list(const char *cmd, const char *flag, const char *s, long hi, int *out, int cap)
{
    int n = 0;
    char item[32];
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        if (n == cap || len == 0 || len >= sizeof item) {
            fprintf(stderr, "inferd %s: %s: '%s' is not a list of at most %d numbers\n", cmd, flag, s, cap);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (!cli_parse_int(cmd, flag, item, 1, hi, &out[n++])) return -1;
        if (!p[len]) break;
        p += len + 1;
    }
    return n;
}


engine *cli_engine_open(const model *m, const char *device, const engine_config *cfg, char *err, size_t errlen)
{
    engine_device dev;
    if (!engine_device_parse(device, &dev)) {
        snprintf(err, errlen, "--device: unknown device '%s' (auto, cpu, cuda)", device);
        return NULL;
    }
    return engine_open(dev, m, cfg, err, errlen);
}
