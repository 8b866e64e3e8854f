/* cuda_api.h - the CUDA driver and cuBLAS entry points inferd uses, resolved at run time.
 *
 * inferd never links libcuda or libcublas: a binary built with CUDA must still start on a
 * machine without a GPU (and then serve from the CPU backend).  cuda_api_load() dlopen()s the
 * libraries once and fills the tables below; every call site checks the returned status with
 * CU_CHECK / CUBLAS_CHECK, which turn a failure into a message naming the call and what it
 * was doing. */
#ifndef INFERD_GPU_CUDA_API_H
#define INFERD_GPU_CUDA_API_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>
#include <cublas_api.h>

/* X-macro list of driver functions: the string is the base name cuGetProcAddress wants; the
 * member takes the (versioned) type cuda.h declares for it. */
#define CUDA_DRIVER_FUNCS(X)                                                                 \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)    \
    X(cuDeviceTotalMem) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain)                  \
    X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuCtxGetDevice)    \
    X(cuMemGetInfo) X(cuMemAlloc) X(cuMemFree) X(cuMemAllocHost) X(cuMemFreeHost)            \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)                \
    X(cuMemcpyDtoDAsync) X(cuMemcpy2DAsync) X(cuMemsetD8Async) X(cuModuleLoadData)           \
    X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute) X(cuLaunchKernel)         \
    X(cuLaunchKernelEx) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)          \
    X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags)             \
    X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuEventCreate)                \
    X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy)           \
    X(cuGetErrorName) X(cuGetErrorString) X(cuStreamQuery) X(cuStreamWriteValue32)           \
    X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess)

#define CUDA_API_MEMBER(name) __typeof__(name) *name;
typedef struct cuda_driver {
    CUDA_DRIVER_FUNCS(CUDA_API_MEMBER)
} cuda_driver;

typedef struct cublas_funcs {
    cublasStatus_t (*create)(cublasHandle_t *h);
    cublasStatus_t (*destroy)(cublasHandle_t h);
    cublasStatus_t (*set_stream)(cublasHandle_t h, CUstream s);
    cublasStatus_t (*set_math_mode)(cublasHandle_t h, cublasMath_t mode);
    cublasStatus_t (*set_workspace)(cublasHandle_t h, void *ws, size_t bytes);
    cublasStatus_t (*gemm_ex)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const void *alpha, const void *a, cudaDataType at,
                              int lda, const void *b, cudaDataType bt, int ldb, const void *beta,
                              void *c, cudaDataType ct, int ldc, cublasComputeType_t compute,
                              cublasGemmAlgo_t algo);
    cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                              int n, int k, const void *alpha, const void *a, cudaDataType at,
                                              int lda, long long stride_a, const void *b, cudaDataType bt, int ldb,
                                              long long stride_b, const void *beta, void *c, cudaDataType ct,
                                              int ldc, long long stride_c, int batch,
                                              cublasComputeType_t compute, cublasGemmAlgo_t algo);
    const char *(*status_string)(cublasStatus_t s);
} cublas_funcs;

extern cuda_driver cu;     /* valid after cuda_api_load() returned true */
/* cuFuncLoad (drivers of CUDA 12.4 on): loads a kernel now rather than at its first launch
 * (lazy loading); NULL where the driver lacks it. */
extern CUresult (*cuda_func_load)(CUfunction f);
extern cublas_funcs cublas; /* valid after cuda_api_load_cublas() returned true */

/* Load libcuda.so.1 and resolve every driver function; cuInit(0) included.  Idempotent.
 * false with a reason in err when there is no driver or it is unusable. */
bool cuda_api_load(char *err, size_t errlen);
/* Load libcublas.so.13 (or .12) and resolve the functions above.  Idempotent. */
bool cuda_api_load_cublas(char *err, size_t errlen);

/* "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)" into buf; returns buf. */
const char *cuda_api_strerror(CUresult r, char *buf, size_t len);

/* Check a driver call; on failure write "<what>: <call>: <error>" to err and return -1 from
 * the enclosing function.  `err`/`errlen` must be in scope. */
#define CU_CHECK(call, what)                                                                     \
    do {                                                                                         \
        CUresult cu_check_r_ = (call);                                                           \
        if (cu_check_r_ != CUDA_SUCCESS) {                                                       \
            char cu_check_b_[160];                                                               \
            snprintf(err, errlen, "%s: %s: %s", (what), #call,                                   \
                     cuda_api_strerror(cu_check_r_, cu_check_b_, sizeof cu_check_b_));           \
            return -1;                                                                           \
        }                                                                                        \
    } while (0)

#define CUBLAS_CHECK(call, what)                                                                 \
    do {                                                                                         \
        cublasStatus_t cb_check_r_ = (call);                                                     \
        if (cb_check_r_ != CUBLAS_STATUS_SUCCESS) {                                              \
            snprintf(err, errlen, "%s: %s: %s", (what), #call, cublas.status_string(cb_check_r_)); \
            return -1;                                                                           \
        }                                                                                        \
    } while (0)

#endif
