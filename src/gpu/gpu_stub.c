/* gpu_stub.c - built when the CUDA backend is not: the server then runs on the CPU. */
#include <stdio.h>

#include "engine/engine_impl.h"
#include "gpu.h"

static const char no_cuda[] = "this inferd was built without CUDA support (-Dcuda=disabled or no nvcc)";

bool engine_cuda_available(void) { return false; }

engine *engine_create_cuda(const model *m, const engine_config *cfg, char *err, size_t errlen)
{
    (void)m;
    (void)cfg;
    snprintf(err, errlen, "%s", no_cuda);
    return NULL;
}

int engine_cuda_device_count(char *err, size_t errlen)
{
    snprintf(err, errlen, "%s", no_cuda);
    return 0;
}
