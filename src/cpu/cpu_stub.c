/* placeholder until the CPU backend lands */
#include <stdio.h>
#include "../engine/engine.h"
engine *engine_create_cpu(const model *m, const engine_config *cfg, char *err, size_t errlen)
{
    (void)m; (void)cfg;
    snprintf(err, errlen, "CPU backend not built yet");
    return NULL;
}
