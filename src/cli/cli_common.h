/* cli_common.h - small pieces the generate and bench subcommands share: strict number
 * parsing for flags and opening an engine on the chosen device. */
#ifndef INFERD_CLI_COMMON_H
#define INFERD_CLI_COMMON_H

#include <stdbool.h>

#include "backend/backend.h"

/* Parse a flag value; false with a message on stderr (naming cmd and flag) when malformed
 * or outside [lo, hi]. */
bool cli_parse_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out);
bool cli_parse_float(const char *cmd, const char *flag, const char *s, float lo, float hi, float *out);
/* Comma-separated positive ints ("512,2048") into out (at most cap); count or -1. */
int cli_parse_int_list(const char *cmd, const char *flag, const char *s, long hi, int *out, int cap);


/* --device NAME: "auto", "cpu" or "cuda" opened through engine_open; NULL with a message in
 * err when the name is unknown or the engine cannot be created. */
engine *cli_engine_open(const model *m, const char *device, const engine_config *cfg, char *err, size_t errlen);

#endif
