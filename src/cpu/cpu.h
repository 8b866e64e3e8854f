/* cpu.h - the CPU backend, as the backend registry (backend/) sees it. */
#ifndef INFERD_CPU_H
#define INFERD_CPU_H

#include "engine/engine.h"

/* The reference backend: F32 math over F32 K/V blocks.  NULL with a message in err. */
engine *engine_create_cpu(const model *m, const engine_config *cfg, char *err, size_t errlen);

#endif
