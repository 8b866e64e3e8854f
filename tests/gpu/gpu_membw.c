/* gpu_membw.c - device-to-device copy bandwidth (bytes read + written per second), the
 * memory ceiling of the decode roofline: batch-1 decode tok/s <= weight bytes / bandwidth.
 * Usage: gpu_membw [MiB]   (prints one line; exit 77 without a device) */
#include <stdio.h>
#include <stdlib.h>

#include "gpu/cuda_api.h"

static int measure(size_t bytes, double *gbps, char *err, size_t errlen)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr a, b;
    CUevent t0, t1;
    CU_CHECK(cu.cuDeviceGet(&dev, 0), "membw");
    CU_CHECK(cu.cuDevicePrimaryCtxRetain(&ctx, dev), "membw");
    CU_CHECK(cu.cuCtxSetCurrent(ctx), "membw");
    CU_CHECK(cu.cuMemAlloc(&a, bytes), "membw");
    CU_CHECK(cu.cuMemAlloc(&b, bytes), "membw");
    CU_CHECK(cu.cuMemsetD8Async(a, 0x5a, bytes, NULL), "membw");
    CU_CHECK(cu.cuEventCreate(&t0, CU_EVENT_DEFAULT), "membw");
    CU_CHECK(cu.cuEventCreate(&t1, CU_EVENT_DEFAULT), "membw");
    for (int i = 0; i < 3; i++) CU_CHECK(cu.cuMemcpyDtoDAsync(b, a, bytes, NULL), "membw warm-up");
    const int reps = 20;
    CU_CHECK(cu.cuEventRecord(t0, NULL), "membw");
    for (int i = 0; i < reps; i++) CU_CHECK(cu.cuMemcpyDtoDAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, NULL), "membw");
    CU_CHECK(cu.cuEventRecord(t1, NULL), "membw");
    CU_CHECK(cu.cuEventSynchronize(t1), "membw");
    float ms = 0.0f;
    CU_CHECK(cu.cuEventElapsedTime(&ms, t0, t1), "membw");
    *gbps = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    cu.cuMemFree(a);
    cu.cuMemFree(b);
    cu.cuEventDestroy(t0);
    cu.cuEventDestroy(t1);
    cu.cuDevicePrimaryCtxRelease(dev);
    return 0;
}

int main(int argc, char **argv)
{
    char err[512];
    size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 2048;
    if (!cuda_api_load(err, sizeof err)) {
        fprintf(stderr, "gpu_membw: %s\n", err);
        return 77;
    }
    double gbps = 0.0;
    if (measure(mib << 20, &gbps, err, sizeof err)) {
        fprintf(stderr, "gpu_membw: %s\n", err);
        return 1;
    }
    printf("d2d copy bandwidth: %.0f GB/s (read+write, %zu MiB buffers)\n", gbps, mib);
    return 0;
}
