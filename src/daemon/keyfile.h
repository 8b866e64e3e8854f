/* keyfile.h - the API key from a file (--api-key-file: a key on the command line is visible
 * to every user in ps), and warnings about files holding a key that other users can read. */
#ifndef INFERD_KEYFILE_H
#define INFERD_KEYFILE_H

#include <stdbool.h>
#include <stddef.h>

#include "opts.h"

/* The first line of path, surrounding blanks removed, into key.  0, or -1 with err. */
int keyfile_read(const char *path, char *key, size_t cap, char *err, size_t errlen);

/* true when path exists and its mode lets users other than owner and group read it. */
bool keyfile_readable_by_others(const char *path);

/* Start-up: fills o->api_key from o->api_key_file (both given is an error), and warns when
 * the key file, or a config file that sets api-key, is readable by others.  0, or -1 with err. */
int keyfile_apply(inferd_opts *o, char *err, size_t errlen);

#endif
