/* gpu.h - the CUDA backend, as the backend registry (backend/) and the daemon see it.  Built
 * from gpu_engine.c with CUDA, from gpu_stub.c without: the same three answers either way. */
#ifndef INFERD_GPU_H
#define INFERD_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"

/* NULL with a message when there is no usable GPU or CUDA support was not built. */
engine *engine_create_cuda(const model *m, const engine_config *cfg, char *err, size_t errlen);
/* true when the CUDA backend was built and a GPU answers. */
bool engine_cuda_available(void);
/* GPUs the CUDA driver sees; 0 with the reason in err when there is no driver, no GPU or no
 * CUDA backend in this build (never fails harder than that: tensor parallelism asks it before
 * anything else touches CUDA). */
int engine_cuda_device_count(char *err, size_t errlen);

#endif
