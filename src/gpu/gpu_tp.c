/* gpu_tp.c - tensor parallelism: one model split across the GPUs of one host, one engine to the
 * scheduler.
 *
 * Each GPU gets its shard as a model of its own (model/tp_shard.h: tp_view_make, the plan's
 * heads, KV heads and FFN units; Wo's and Wdown's inputs repacked on whole quantisation blocks)
 * and an ordinary single-GPU engine over it (gpu_engine_create with its rank): its own context,
 * stream, KV pool of its KV heads, buffers and decode graphs.  The forward pass is the
 * single-GPU one, except that the two row-split products of a layer end in an NCCL all-reduce
 * (gpu_forward.c: residual_add_split), captured into the decode graphs like any launch.  The
 * embedding and the LM head are replicated (each GPU holds the whole vocabulary), so after the
 * last all-reduce every GPU has the same residual stream, logits and samples: rank 0 copies back
 * token ids (and logits where asked); the others only run.
 *
 * A step runs on every GPU at once: rank 0 in the caller's (the scheduler's) thread, each other
 * rank in a thread of its own that waits for the step, runs its engine's step and reports.  The
 * KV copies of copy-on-write and the slot clears are queued on each GPU's stream in turn (they
 * only enqueue).
 *
 * NCCL is dlopen()ed (libnccl.so.2) only here, when more than one GPU is asked for: one GPU
 * never loads it.  Two settings go into the process's environment before the communicators are
 * made (NCCL 2.28's ncclConfig_t has fields for neither): NVLink SHARP (multicast) off,
 * NCCL_NVLS_ENABLE=0, since multicast objects can take a shared host's GPUs out of service and
 * the all-reduces here are small; and NCCL_RUNTIME_CONNECT=0, every connection made at creation
 * rather than at a collective's first use, which could fall inside a graph capture or after the
 * KV pools took the memory.  Fixed settings of the engine, not switches. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/tp_shard.h"
#include "gpu.h"
#include "gpu_internal.h"

#define MIB (1024.0 * 1024.0)
/* GPU memory each GPU's KV pool leaves to NCCL beyond its usual spare: a pool sized to the last
 * GiB left 550 MiB free after the communicators' first all-reduce (8B shape, two H100s) */
#define TP_NCCL_RESERVE_MB 1024

/* ---- NCCL, bound at run time ---------------------------------------------------------------- */

typedef struct ncclComm *nccl_comm;
enum { NCCL_SUCCESS = 0, NCCL_FLOAT32 = 7, NCCL_SUM = 0 }; /* nccl.h's ncclSuccess, ncclFloat32, ncclSum */

static struct {
    void *lib;
    int (*comm_init_all)(nccl_comm *comms, int ndev, const int *devlist);
    int (*comm_destroy)(nccl_comm comm);
    int (*comm_abort)(nccl_comm comm);
    int (*all_reduce)(const void *send, void *recv, size_t count, int type, int op, nccl_comm comm, CUstream s);
    int (*group_start)(void);
    int (*group_end)(void);
    const char *(*error_string)(int r);
    int (*get_version)(int *v);
} nccl;

static bool nccl_load(char *err, size_t errlen)
{
    if (nccl.lib) return true;
    const char *names[] = {"libnccl.so.2", "libnccl.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(err, errlen, "tensor parallelism needs NCCL: dlopen(libnccl.so.2): %s (install NCCL 2, or add its "
                 "lib folder to LD_LIBRARY_PATH)", dlerror());
        return false;
    }
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"ncclCommInitAll", (void **)&nccl.comm_init_all}, {"ncclCommDestroy", (void **)&nccl.comm_destroy},
        {"ncclCommAbort", (void **)&nccl.comm_abort},
        {"ncclAllReduce", (void **)&nccl.all_reduce},      {"ncclGroupStart", (void **)&nccl.group_start},
        {"ncclGroupEnd", (void **)&nccl.group_end},        {"ncclGetErrorString", (void **)&nccl.error_string},
        {"ncclGetVersion", (void **)&nccl.get_version},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
            snprintf(err, errlen, "libnccl.so.2 lacks %s", syms[i].name);
            dlclose(lib);
            return false;
        }
    }
    nccl.lib = lib;
    return true;
}

#define NCCL_CHECK(call, what)                                                                     \
    do {                                                                                           \
        int nccl_r_ = (call);                                                                      \
        if (nccl_r_ != NCCL_SUCCESS) {                                                             \
            snprintf(err, errlen, "%s: %s: %s", (what), #call, nccl.error_string(nccl_r_));        \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

int gpu_tp_all_reduce(gpu_engine *g, CUdeviceptr buf, size_t n, const char *what, char *err, size_t errlen)
{
    void *p = (void *)(uintptr_t)buf;
    nccl_comm comm = __atomic_load_n((nccl_comm *)&g->tp_comm, __ATOMIC_ACQUIRE);
    if (!comm) { /* aborted: another GPU failed (abort_all) */
        snprintf(err, errlen, "%s: the tensor-parallel communicators were aborted after another GPU failed", what);
        return -1;
    }
    NCCL_CHECK(nccl.all_reduce(p, p, n, NCCL_FLOAT32, NCCL_SUM, comm, g->stream), what);
    return 0;
}

/* ---- the engine ------------------------------------------------------------------------------ */

typedef struct gpu_tp {
    engine base;
    int n;
    tp_plan plan;
    tp_view view[TP_MAX_GPUS];
    engine *shard[TP_MAX_GPUS];
    nccl_comm comm[TP_MAX_GPUS];
    /* the step in hand, for ranks 1..n-1: gen counts steps, busy the ranks still on this one */
    pthread_t thread[TP_MAX_GPUS];
    bool thread_on[TP_MAX_GPUS];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    bool sync_on;
    unsigned long gen;
    int busy;
    bool quit;
    bool dead; /* a rank failed and the communicators were aborted: every later step fails */
    const engine_seq *seqs;
    int n_seqs;
    int rc[TP_MAX_GPUS];
    char err[TP_MAX_GPUS][320];
} gpu_tp;

typedef struct tp_worker_arg {
    gpu_tp *tp;
    int rank;
} tp_worker_arg;

/* A rank's step failed past its packing (ENGINE_FATAL): the other ranks may be waiting in an
 * all-reduce that this one will never join, so every communicator is aborted (NCCL's way to end
 * a collective in flight), once; the engine is dead from then on.  Called with tp->mu held. */
static void abort_all(gpu_tp *tp)
{
    if (tp->dead) return;
    tp->dead = true;
    for (int r = 0; r < tp->n; r++) /* no rank starts another all-reduce on them */
        if (tp->shard[r]) __atomic_store_n(&((gpu_engine *)tp->shard[r])->tp_comm, NULL, __ATOMIC_RELEASE);
    for (int r = 0; r < tp->n; r++) {
        if (tp->comm[r]) nccl.comm_abort(tp->comm[r]);
        tp->comm[r] = NULL;
    }
}

static void *tp_worker(void *arg)
{
    gpu_tp *tp = ((tp_worker_arg *)arg)->tp;
    const int r = ((tp_worker_arg *)arg)->rank;
    free(arg);
    pthread_mutex_lock(&tp->mu);
    unsigned long seen = tp->gen;
    for (;;) {
        while (tp->gen == seen && !tp->quit) pthread_cond_wait(&tp->go, &tp->mu);
        if (tp->quit) break;
        seen = tp->gen;
        const engine_seq *seqs = tp->seqs;
        int n = tp->n_seqs;
        pthread_mutex_unlock(&tp->mu);
        engine *e = tp->shard[r];
        int rc = e->vt->step(e, seqs, n, NULL, tp->err[r], sizeof tp->err[r]);
        pthread_mutex_lock(&tp->mu);
        tp->rc[r] = rc;
        if (rc == ENGINE_FATAL) abort_all(tp);
        if (--tp->busy == 0) pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

/* Every rank runs the step (the same inputs: each packs them alike and takes the same path, so
 * their all-reduces pair up); rank 0 writes the results.  The worst of the ranks' returns. */
static int tp_step(engine *e, const engine_seq *seqs, int n, engine_result *results, char *err, size_t errlen)
{
    gpu_tp *tp = (gpu_tp *)e;
    if (tp->dead) {
        snprintf(err, errlen, "a GPU of the tensor-parallel engine failed in an earlier step; restart the server");
        return ENGINE_FATAL;
    }
    pthread_mutex_lock(&tp->mu);
    tp->seqs = seqs;
    tp->n_seqs = n;
    tp->busy = tp->n - 1;
    tp->gen++;
    pthread_cond_broadcast(&tp->go);
    pthread_mutex_unlock(&tp->mu);
    engine *lead = tp->shard[0];
    tp->rc[0] = lead->vt->step(lead, seqs, n, results, tp->err[0], sizeof tp->err[0]);
    pthread_mutex_lock(&tp->mu);
    if (tp->rc[0] == ENGINE_FATAL) abort_all(tp);
    while (tp->busy > 0) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    int rc = 0;
    for (int r = 0; r < tp->n; r++) {
        if (tp->rc[r] == 0 || rc == ENGINE_FATAL || (rc && tp->rc[r] != ENGINE_FATAL)) continue;
        rc = tp->rc[r];
        if (r) snprintf(err, errlen, "GPU rank %d: %s", r, tp->err[r]);
        else snprintf(err, errlen, "%s", tp->err[0]);
    }
    return rc;
}

static void tp_slot_clear(engine *e, int slot)
{
    gpu_tp *tp = (gpu_tp *)e;
    for (int r = 0; r < tp->n; r++) tp->shard[r]->vt->slot_clear(tp->shard[r], slot);
}

static int tp_kv_copy(engine *e, int dst, int src, char *err, size_t errlen)
{
    gpu_tp *tp = (gpu_tp *)e;
    for (int r = 0; r < tp->n; r++) {
        int rc = tp->shard[r]->vt->kv_copy(tp->shard[r], dst, src, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

static void *destroy_comm(void *comm)
{
    nccl.comm_destroy((nccl_comm)comm);
    return NULL;
}

/* ncclCommDestroy waits for every CUDA graph that captured the communicator to be gone (the
 * shards' graphs are dropped first) and may wait for the other ranks' destruction: one thread a
 * communicator, all at once.  Where a thread cannot start, that one is destroyed from here. */
static void destroy_comms(gpu_tp *tp)
{
    pthread_t t[TP_MAX_GPUS];
    bool on[TP_MAX_GPUS] = {false};
    for (int r = 0; r < tp->n; r++)
        if (tp->comm[r]) on[r] = pthread_create(&t[r], NULL, destroy_comm, tp->comm[r]) == 0;
    for (int r = 0; r < tp->n; r++)
        if (on[r]) pthread_join(t[r], NULL);
    for (int r = 0; r < tp->n; r++)
        if (tp->comm[r] && !on[r]) nccl.comm_destroy(tp->comm[r]);
}

static void tp_destroy(engine *e)
{
    gpu_tp *tp = (gpu_tp *)e;
    if (!tp) return;
    if (tp->sync_on) {
        pthread_mutex_lock(&tp->mu);
        tp->quit = true;
        pthread_cond_broadcast(&tp->go);
        pthread_mutex_unlock(&tp->mu);
    }
    for (int r = 0; r < tp->n; r++)
        if (tp->thread_on[r]) pthread_join(tp->thread[r], NULL);
    for (int r = 0; r < tp->n; r++)
        if (tp->shard[r]) gpu_drop_graphs((gpu_engine *)tp->shard[r]);
    destroy_comms(tp);
    for (int r = 0; r < tp->n; r++) {
        if (tp->shard[r]) engine_free(tp->shard[r]);
        tp_view_free(&tp->view[r]);
    }
    if (tp->sync_on) {
        pthread_mutex_destroy(&tp->mu);
        pthread_cond_destroy(&tp->go);
        pthread_cond_destroy(&tp->done);
    }
    free(tp);
}

static const engine_vtable tp_vtable = {
    .name = "cuda", .step = tp_step, .slot_clear = tp_slot_clear, .kv_copy = tp_kv_copy, .destroy = tp_destroy};

/* The GPUs device .. device + n - 1: present, and one model of GPU (a slower one would hold
 * every all-reduce back). */
static int check_gpus(const engine_config *cfg, int n, char *err, size_t errlen)
{
    char why[256] = "";
    int found = engine_cuda_device_count(why, sizeof why);
    if (cfg->device < 0 || cfg->device + n > found) {
        snprintf(err, errlen, "tensor parallelism over %d GPUs from GPU %d needs GPUs %d-%d, and CUDA finds %d%s%s%s",
                 n, cfg->device, cfg->device, cfg->device + n - 1, found, why[0] ? " (" : "", why, why[0] ? ")" : "");
        return -1;
    }
    char first[128] = "?", name[128] = "?";
    for (int r = 0; r < n; r++) {
        CUdevice d;
        CU_CHECK(cu.cuDeviceGet(&d, cfg->device + r), "tensor parallelism: opening the GPUs");
        cu.cuDeviceGetName(r ? name : first, 128, d);
        if (r && strcmp(name, first) != 0) {
            snprintf(err, errlen, "tensor parallelism: GPU %d is a %s and GPU %d a %s; the split needs one model of GPU",
                     cfg->device, first, cfg->device + r, name);
            return -1;
        }
    }
    return 0;
}

/* All-reduces of 1, 2, 4 .. 64 rows and of a whole step's rows (cap floats) on every GPU, before
 * any engine sizes its KV pool: NCCL connects its peers and allocates a protocol's buffers on a
 * communicator's first collectives of that size, which must neither happen inside a graph
 * capture nor find the GPU's memory taken by the pool; and a broken NCCL set-up fails here, at
 * start-up, with its message.  On each GPU's primary context, NULL stream, scratch freed after. */
static int connect_peers(gpu_tp *tp, const engine_config *cfg, size_t cap, char *err, size_t errlen)
{
    CUcontext ctx[TP_MAX_GPUS] = {0};
    CUdevice dev[TP_MAX_GPUS] = {0};
    CUdeviceptr buf[TP_MAX_GPUS] = {0};
    int rc = -1, r = 0;
    for (; r < tp->n; r++) {
        if (cu.cuDeviceGet(&dev[r], cfg->device + r) != CUDA_SUCCESS ||
            cu.cuDevicePrimaryCtxRetain(&ctx[r], dev[r]) != CUDA_SUCCESS)
            break;
        if (cu.cuCtxSetCurrent(ctx[r]) != CUDA_SUCCESS || cu.cuMemAlloc(&buf[r], cap * sizeof(float)) != CUDA_SUCCESS ||
            cu.cuMemsetD8Async(buf[r], 0, cap * sizeof(float), NULL) != CUDA_SUCCESS)
            break;
    }
    if (r < tp->n) {
        snprintf(err, errlen, "tensor parallelism: %.0f MiB of scratch on GPU %d for the first all-reduces",
                 cap * sizeof(float) / MIB, cfg->device + r);
        goto out;
    }
    /* the decode graphs' sizes (1 .. GPU_MAX_DECODE_BATCH rows) and a whole step's: NCCL may take
     * another algorithm or protocol, with connections of their own, for each */
    size_t sizes[16];
    int n_sizes = 0;
    for (size_t b = 1; b <= GPU_MAX_DECODE_BATCH && b * (size_t)tp->base.m->hp.n_embd < cap; b *= 2)
        sizes[n_sizes++] = b * (size_t)tp->base.m->hp.n_embd;
    sizes[n_sizes++] = cap;
    for (int k = 0; k < n_sizes; k++) {
        int nr = nccl.group_start();
        for (r = 0; r < tp->n && nr == NCCL_SUCCESS; r++) {
            void *p = (void *)(uintptr_t)buf[r];
            nr = nccl.all_reduce(p, p, sizes[k], NCCL_FLOAT32, NCCL_SUM, tp->comm[r], NULL);
        }
        int ne = nccl.group_end();
        if (nr == NCCL_SUCCESS) nr = ne;
        if (nr != NCCL_SUCCESS) {
            snprintf(err, errlen, "tensor parallelism: the first all-reduce of %zu floats: %s", sizes[k],
                     nccl.error_string(nr));
            goto out;
        }
        for (r = 0; r < tp->n; r++) {
            CUresult cr = cu.cuCtxSetCurrent(ctx[r]);
            if (cr == CUDA_SUCCESS) cr = cu.cuCtxSynchronize();
            if (cr != CUDA_SUCCESS) {
                char b[160];
                snprintf(err, errlen, "tensor parallelism: the first all-reduce on GPU %d: %s", cfg->device + r,
                         cuda_api_strerror(cr, b, sizeof b));
                goto out;
            }
        }
    }
    rc = 0;
out:
    for (r = 0; r < tp->n; r++) {
        if (!ctx[r]) continue;
        cu.cuCtxSetCurrent(ctx[r]);
        if (buf[r]) cu.cuMemFree(buf[r]);
        cu.cuDevicePrimaryCtxRelease(dev[r]);
    }
    return rc;
}

/* Start-up's memory summary, one line per GPU. */
static void log_gpus(const gpu_tp *tp)
{
    for (int r = 0; r < tp->n; r++) {
        const gpu_engine *g = (const gpu_engine *)tp->shard[r];
        const tp_rank *k = &tp->plan.rank[r];
        size_t free_b = 0, total_b = 0;
        char name[128] = "?";
        cu.cuCtxSetCurrent(g->ctx);
        cu.cuMemGetInfo(&free_b, &total_b);
        cu.cuDeviceGetName(name, sizeof name, g->dev);
        log_info("cuda tp: GPU %d (%s): heads %d-%d, kv heads %d-%d, ffn %d-%d; weights %.0f MiB, KV cache %.0f MiB "
                 "(%d blocks), in use %.0f MiB of %.0f MiB", g->base.cfg.device, name, k->q_heads.begin,
                 k->q_heads.end - 1, k->kv_heads.begin, k->kv_heads.end - 1, k->ffn.begin, k->ffn.end - 1,
                 g->wbytes / MIB, g->kv_bytes / MIB, g->base.kv_blocks, (total_b - free_b) / MIB, total_b / MIB);
    }
}

static int tp_setup(gpu_tp *tp, const model *m, const engine_config *cfg, char *err, size_t errlen)
{
    const int n = tp->n;
    tp_shape shape;
    tp_shape_from_model(m, 2 /* FP16 K/V */, &shape);
    if (tp_plan_make(&shape, n, &tp->plan, err, errlen)) return -1;
    for (int r = 0; r < n; r++)
        if (tp_view_make(m, &tp->plan, r, &tp->view[r], err, errlen)) return -1;
    if (check_gpus(cfg, n, err, errlen) || !nccl_load(err, errlen)) return -1; /* check_gpus loads the driver */
    /* the communicators first, so that each GPU's KV pool is sized after NCCL's buffers */
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* a fixed rule, not a default: see the top of this file */
    /* every connection made in ncclCommInitAll, while the GPUs' memory is free and outside any
     * graph capture, not at a collective's first use (NCCL >= 2.22's default) */
    setenv("NCCL_RUNTIME_CONNECT", "0", 1);
    int devs[TP_MAX_GPUS], version = 0;
    for (int r = 0; r < n; r++) devs[r] = cfg->device + r;
    NCCL_CHECK(nccl.comm_init_all(tp->comm, n, devs), "tensor parallelism: creating the NCCL communicators");
    nccl.get_version(&version);
    log_info("cuda tp: %d GPUs from GPU %d, NCCL %d.%d.%d; each GPU its heads' attention and KV cache and its part "
             "of the FFN, two all-reduces a layer, the embedding and LM head on every GPU", n, cfg->device,
             version / 10000, version / 100 % 100, version % 100);
    /* a step's rows: the most tokens, or the decode graphs' largest bucket (alloc_buffers) */
    size_t cap = (size_t)(cfg->max_batch_tokens > GPU_MAX_DECODE_BATCH ? cfg->max_batch_tokens : GPU_MAX_DECODE_BATCH);
    if (cfg->n_slots > (int)cap) cap = (size_t)cfg->n_slots;
    if (connect_peers(tp, cfg, cap * (size_t)m->hp.n_embd, err, errlen)) return -1;
    for (int r = 0; r < n; r++) {
        engine_config c = *cfg;
        c.device = cfg->device + r;
        c.tensor_parallel = 1;
        /* what NCCL may still allocate later (graph registration, other algorithms' buffers) */
        c.vram_reserve_mb = cfg->vram_reserve_mb + TP_NCCL_RESERVE_MB;
        if (!(tp->shard[r] = gpu_engine_create(&tp->view[r].m, &c, r, err, errlen))) {
            char inner[512];
            snprintf(inner, sizeof inner, "%s", err);
            snprintf(err, errlen, "tensor parallelism, GPU %d: %s", c.device, inner);
            return -1;
        }
        ((gpu_engine *)tp->shard[r])->tp_comm = tp->comm[r];
        tp_view_drop_packed(&tp->view[r]); /* on the GPU now */
    }
    /* one engine to the caller: the pool every GPU has (each holds its KV heads of every block) */
    tp->base.kv_blocks = tp->shard[0]->kv_blocks;
    tp->base.kv_block_bytes = 0;
    for (int r = 0; r < n; r++) {
        if (tp->shard[r]->kv_blocks < tp->base.kv_blocks) tp->base.kv_blocks = tp->shard[r]->kv_blocks;
        tp->base.kv_block_bytes += tp->shard[r]->kv_block_bytes;
    }
    log_gpus(tp);
    if (pthread_mutex_init(&tp->mu, NULL) || pthread_cond_init(&tp->go, NULL) || pthread_cond_init(&tp->done, NULL)) {
        snprintf(err, errlen, "tensor parallelism: creating the step's lock");
        return -1;
    }
    tp->sync_on = true;
    for (int r = 1; r < n; r++) {
        tp_worker_arg *a = malloc(sizeof *a);
        if (a) *a = (tp_worker_arg){tp, r};
        if (!a || pthread_create(&tp->thread[r], NULL, tp_worker, a)) {
            free(a);
            snprintf(err, errlen, "tensor parallelism: starting the thread of GPU rank %d", r);
            return -1;
        }
        tp->thread_on[r] = true;
    }
    return 0;
}

engine *gpu_tp_create(const model *m, const engine_config *cfg, char *err, size_t errlen)
{
    if (cfg->tensor_parallel > TP_MAX_GPUS) {
        snprintf(err, errlen, "tensor parallelism over %d GPUs: at most %d", cfg->tensor_parallel, TP_MAX_GPUS);
        return NULL;
    }
    gpu_tp *tp = calloc(1, sizeof *tp);
    if (!tp) {
        snprintf(err, errlen, "cuda engine: out of memory");
        return NULL;
    }
    tp->base.vt = &tp_vtable;
    tp->base.m = m;
    tp->base.cfg = *cfg;
    tp->n = cfg->tensor_parallel;
    if (tp_setup(tp, m, cfg, err, errlen)) {
        tp_destroy(&tp->base);
        return NULL;
    }
    return &tp->base;
}
