/* cuda_api.c - run-time binding of the CUDA driver and cuBLAS (see cuda_api.h for why). */
#include "cuda_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

cuda_driver cu;
cublas_funcs cublas;
CUresult (*cuda_func_load)(CUfunction f);

static void *libcuda, *libcublas;
static bool cuda_ok, cublas_ok;

/* The CUDA version whose function signatures cuda.h (the one we compile against) declares. */
#define CUDA_API_REQUEST_VERSION 12000

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static bool resolve(get_proc_fn get, const char *name, void **slot, char *err, size_t errlen)
{
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = get(name, slot, CUDA_API_REQUEST_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q);
    if (r != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS || !*slot) {
        snprintf(err, errlen, "libcuda.so.1 lacks %s (driver too old?)", name);
        return false;
    }
    return true;
}

bool cuda_api_load(char *err, size_t errlen)
{
    if (cuda_ok) return true;
    if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!libcuda) {
        snprintf(err, errlen, "no CUDA driver: dlopen(libcuda.so.1): %s", dlerror());
        return false;
    }
    get_proc_fn get = (get_proc_fn)dlsym(libcuda, "cuGetProcAddress_v2");
    if (!get) {
        snprintf(err, errlen, "libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)");
        return false;
    }
#define CUDA_API_RESOLVE(name)                                                                   \
    if (!resolve(get, #name, (void **)&cu.name, err, errlen)) return false;
    CUDA_DRIVER_FUNCS(CUDA_API_RESOLVE)
#undef CUDA_API_RESOLVE
    /* optional, and of CUDA 12.4: asked for at that version */
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (get("cuFuncLoad", (void **)&cuda_func_load, 12040, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS ||
        q != CU_GET_PROC_ADDRESS_SUCCESS)
        cuda_func_load = NULL;
    CUresult r = cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        char b[160];
        snprintf(err, errlen, "cuInit: %s", cuda_api_strerror(r, b, sizeof b));
        return false;
    }
    cuda_ok = true;
    return true;
}

bool cuda_api_load_cublas(char *err, size_t errlen)
{
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12",
                                        "/usr/local/cuda/lib64/libcublas.so.13",
                                        "/usr/local/cuda/lib64/libcublas.so.12"};
    if (cublas_ok) return true;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !libcublas; i++)
        libcublas = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!libcublas) {
        snprintf(err, errlen, "cannot load cuBLAS (libcublas.so.13/.12): %s", dlerror());
        return false;
    }
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"cublasCreate_v2", (void **)&cublas.create},
        {"cublasDestroy_v2", (void **)&cublas.destroy},
        {"cublasSetStream_v2", (void **)&cublas.set_stream},
        {"cublasSetMathMode", (void **)&cublas.set_math_mode},
        {"cublasSetWorkspace_v2", (void **)&cublas.set_workspace},
        {"cublasGemmEx", (void **)&cublas.gemm_ex},
        {"cublasGemmStridedBatchedEx", (void **)&cublas.gemm_strided_batched_ex},
        {"cublasGetStatusString", (void **)&cublas.status_string},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(libcublas, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(err, errlen, "cuBLAS lacks %s", syms[i].name);
            return false;
        }
    }
    cublas_ok = true;
    return true;
}

const char *cuda_api_strerror(CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *desc = NULL;
    if (cu.cuGetErrorName) cu.cuGetErrorName(r, &name);
    if (cu.cuGetErrorString) cu.cuGetErrorString(r, &desc);
    snprintf(buf, len, "%s (%s)", name ? name : "CUDA error", desc ? desc : "no description");
    if (!name) snprintf(buf, len, "CUDA error %d", (int)r);
    return buf;
}
