// inferd_kernels.cu - the one translation unit of device code: nvcc turns it into the single
// fatbin embedded in inferd (src/gpu/meson.build).  Each part lives in its own header; the
// host looks kernels up by their extern "C" names (src/gpu/gpu_kernels.c).
#include <limits.h>
#include <math.h>

#include "common.cuh"
#include "quant.cuh"
#include "matvec.cuh"
#include "mmq.cuh"
#include "mmq_narrow.cuh"
#include "moe.cuh"
#include "elementwise.cuh"
#include "allreduce.cuh"
#include "attention.cuh"
#include "mla.cuh"
#include "attn_decode.cuh"
#include "attn_mla.cuh"
#include "flash_attn.cuh"
#include "sampling.cuh"
#include "deltanet.cuh"
