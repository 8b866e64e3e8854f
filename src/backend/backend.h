/* backend.h - the backend registry: the one floor that knows every backend (cpu/, gpu/) and
 * opens an engine on one of them.  Everything below it sees only engine/engine.h; the daemon,
 * the CLI tools and the tests open engines here.  A new backend is a folder beside cpu/ and
 * gpu/, a name in engine_device, and a line in engine_open. */
#ifndef INFERD_BACKEND_H
#define INFERD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"

/* Which backend runs the math.  AUTO: CUDA when a usable GPU is present, else the CPU. */
typedef enum engine_device { ENGINE_DEVICE_AUTO = 0, ENGINE_DEVICE_CPU, ENGINE_DEVICE_CUDA } engine_device;

/* "auto", "cpu" or "cuda"; false for anything else. */
bool engine_device_parse(const char *name, engine_device *out);

/* Creates an engine for m on dev.  With AUTO a GPU that cannot be used (no driver, too little
 * memory) is logged as a warning and the CPU is used instead; with CPU or CUDA that backend
 * or nothing.  NULL with a message in err when no engine could be made. */
engine *engine_open(engine_device dev, const model *m, const engine_config *cfg, char *err, size_t errlen);

#endif
