/* config.h - the configuration file, a second front end over the option table (opts.h).
 *
 * Format (see config/inferd.conf for an annotated example):
 *   - one `key = value` per line; the key is an option's long name (`port`, `log-format`, ...),
 *     the value is the rest of the line with surrounding blanks removed (so it may contain
 *     `=`, `#` and inner spaces; an empty value is allowed where the option accepts "");
 *   - lines whose first non-blank character is `#` are comments, blank lines are ignored;
 *     there are no trailing comments (a path or an API key may contain `#`);
 *   - a key may appear only once; `config` cannot be set from a file.
 * Any other line stops start-up with "FILE:LINE: reason".
 *
 * Precedence: defaults < file < command line.  No file is read unless --config names one:
 * the daemon never reads system files on its own (the systemd unit passes
 * --config /etc/inferd/inferd.conf). */
#ifndef INFERD_CONFIG_H
#define INFERD_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "opts.h"

/* Longest accepted line (bytes, without the newline). */
#define CONFIG_LINE_MAX 4096

/* Apply the `key = value` lines read from f to o.  name is used in messages.  Returns 0, or
 * -1 with "NAME:LINE: reason" in err (o may then be partly updated). */
int config_parse_file(inferd_opts *o, FILE *f, const char *name, char *err, size_t errlen);

/* Open path and config_parse_file it; an unreadable file is "PATH: reason". */
int config_load(inferd_opts *o, const char *path, char *err, size_t errlen);

/* The whole start-up resolution: defaults, then the file named by --config (if any), then
 * the command line again so that it wins.  Returns what opts_parse_argv returns (0, 1 for
 * --help, -1 for a command-line error) or -2 for a config-file error; err says why. */
enum { CONFIG_E_ARGV = -1, CONFIG_E_FILE = -2 };
int config_resolve(inferd_opts *o, int argc, char **argv, char *err, size_t errlen);

#endif
