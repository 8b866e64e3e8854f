/* backend.c - choosing the backend: the one place that knows every constructor, used by the
 * daemon and the CLI tools alike. */
#include <string.h>

#include "base/log.h"
#include "backend.h"
#include "cpu/cpu.h"
#include "gpu/gpu.h"

bool engine_device_parse(const char *name, engine_device *out)
{
    static const char *const names[] = {"auto", "cpu", "cuda"};
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, names[i]) == 0) {
            *out = (engine_device)i;
            return true;
        }
    }
    return false;
}

engine *engine_open(engine_device dev, const model *m, const engine_config *cfg, char *err, size_t errlen)
{
    if (dev == ENGINE_DEVICE_CUDA) return engine_create_cuda(m, cfg, err, errlen);
    if (dev == ENGINE_DEVICE_AUTO && engine_cuda_available()) {
        engine *e = engine_create_cuda(m, cfg, err, errlen);
        if (e) return e;
        log_warn("cuda engine unavailable (%s); using the CPU", err);
    }
    return engine_create_cpu(m, cfg, err, errlen);
}
