/* kprof.c - every kernel's start and end on every GPU of a process, for the device image that has
 * no nsys (gpu-check tpcheck / tpprof).  Nsight Compute serialises kernels, so it cannot time a
 * tensor-parallel step, whose ranks' sums wait on each other; CUPTI's activity records of
 * concurrent kernels (graph nodes included) do not change how kernels run.
 *
 * A CUDA injection library: CUDA_INJECTION64_PATH=kprof.so KPROF_OUT=file PROGRAM ...  The
 * driver calls InitializeInjection when the process first initialises CUDA; each kernel's record
 * is written as "device start_ns end_ns gx.gy.gz/threads name" (one line: the grid and the
 * block's threads tell a product's waves) when CUPTI hands its buffer back (every 100 ms, and at
 * exit).  Build: gcc -O2 -shared -fPIC -I$CUDA/include kprof.c
 * -L$CUDA/lib -lcupti -Wl,-rpath,'$ORIGIN' -o kprof.so */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define KPROF_BUF_BYTES (8u << 20)

static FILE *kprof_out;
static pthread_mutex_t kprof_mu = PTHREAD_MUTEX_INITIALIZER;

static void CUPTIAPI kprof_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(8, KPROF_BUF_BYTES);
    *size = *buf ? KPROF_BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI kprof_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&kprof_mu);
    while (kprof_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(kprof_out, "%u %llu %llu %d.%d.%d/%d %s\n", k->deviceId, (unsigned long long)k->start,
                (unsigned long long)k->end, k->gridX, k->gridY, k->gridZ, k->blockX * k->blockY * k->blockZ,
                k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped && kprof_out)
        fprintf(kprof_out, "# dropped %zu records\n", dropped);
    pthread_mutex_unlock(&kprof_mu);
    free(buf);
}

static void kprof_at_exit(void)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&kprof_mu);
    if (kprof_out) fclose(kprof_out);
    kprof_out = NULL;
    pthread_mutex_unlock(&kprof_mu);
}

/* CUDA's injection entry point: 1 on success */
int InitializeInjection(void)
{
    const char *path = getenv("KPROF_OUT");
    kprof_out = fopen(path && *path ? path : "kprof.txt", "w");
    if (!kprof_out) return 0;
    if (cuptiActivityRegisterCallbacks(kprof_buffer_requested, kprof_buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(kprof_out, "# CUPTI refused the kernel activity\n");
        fclose(kprof_out);
        kprof_out = NULL;
        return 0;
    }
    cuptiActivityFlushPeriod(100);
    atexit(kprof_at_exit);
    return 1;
}
