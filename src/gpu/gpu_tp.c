/* gpu_tp.c - tensor parallelism: one model split across the GPUs of one host, one engine to the
 * scheduler.
 *
 * Each GPU gets its shard as a model of its own (model/tp_shard.h: tp_view_make, the plan's
 * heads, KV heads and FFN units; Wo's and Wdown's inputs repacked on whole quantisation blocks)
 * and an ordinary single-GPU engine over it (gpu_engine_create with its rank): its own context,
 * stream, KV pool of its KV heads, buffers and decode graphs.  The forward pass is the
 * single-GPU one, except that the two row-split products of a layer end in a sum over the GPUs
 * (gpu_forward.c: residual_add_split; gpu_tp_residual_add: the one-shot exchange over peer
 * memory, or an NCCL all-reduce), captured into the decode graphs like any launch.  The
 * embedding and the LM head's matrix are replicated (each GPU holds the whole vocabulary), so
 * after the last sum every GPU has the same residual stream; where the GPUs reach each other's
 * memory the LM head's product is split by vocabulary (split_lm_head: each GPU its rows, into
 * rank 0's logits), and rank 0 samples and copies back token ids (and logits where asked); the
 * others only run.
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
 * KV pools took the memory.  Fixed settings of the engine, not switches.
 *
 * A step that never ends (a rank that does not join an all-reduce, a fault NCCL reports only
 * asynchronously) would hang the server with no word of why: a watchdog thread gives every step
 * TP_STEP_LIMIT_S seconds, then logs where each GPU is (its phase, the all-reduces its host
 * enqueued and those its stream finished, the stream's state, NCCL's asynchronous error),
 * revokes the communicators so that the ranks' waits return, and fails the step (the engine is
 * dead from then on).  A step still not over TP_ABORT_GRACE_S later ends the process: a GPU
 * that stays hung cannot be recovered in it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "model/tp_shard.h"
#include "gpu.h"
#include "gpu_internal.h"

#define MIB (1024.0 * 1024.0)
/* GPU memory each GPU's KV pool leaves to NCCL beyond its usual spare: a pool sized to the last
 * GiB left 550 MiB free after the communicators' first all-reduce (8B shape, two H100s) */
#define TP_NCCL_RESERVE_MB 1024
/* The longest a step may take before the watchdog reports and aborts it: a prompt step of a
 * 70B-class model over two GPUs takes about a second, a decode graph's first capture less. */
#define TP_STEP_LIMIT_S 30
/* How long the watchdog waits for a step to end after revoking the communicators, before it
 * ends the process */
#define TP_ABORT_GRACE_S 10
/* The most rows a sum takes the one-shot exchange for (gpu_tp_residual_add): 2 x n_ranks slots of
 * them a GPU, 32 MiB on two GPUs at 4,096 wide */
#define TP_PEER_ROWS 512

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
    int (*get_async_error)(nccl_comm comm, int *result);
    /* optional: NCCL 2.28's ncclCommRevoke (stops the operations in flight, keeps the
     * communicator: no thread still inside an NCCL call finds it freed) and ncclGetLastError */
    int (*revoke)(nccl_comm comm, int flags);
    const char *(*last_error)(nccl_comm comm);
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
        {"ncclGetVersion", (void **)&nccl.get_version},    {"ncclCommGetAsyncError", (void **)&nccl.get_async_error},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
            snprintf(err, errlen, "libnccl.so.2 lacks %s", syms[i].name);
            dlclose(lib);
            return false;
        }
    }
    *(void **)&nccl.revoke = dlsym(lib, "ncclCommRevoke");
    *(void **)&nccl.last_error = dlsym(lib, "ncclGetLastError");
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

/* buf (n floats on this GPU) summed in place across the GPUs: an NCCL all-reduce on g's stream
 * (captured into its graphs like any launch). */
static int gpu_tp_all_reduce(gpu_engine *g, CUdeviceptr buf, size_t n, const char *what, char *err, size_t errlen)
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

/* After an eager step's k-th exchange: the watchdog's view, k enqueued, and the stream's own word
 * once it is past the k-th.  (A decode graph's exchanges run with the graph: no marks.) */
static int mark_progress(gpu_engine *g, const char *what, char *err, size_t errlen)
{
    if (g->tp_capturing) return 0;
    int k = g->tp_sent + 1;
    __atomic_store_n(&g->tp_sent, k, __ATOMIC_RELAXED);
    if (g->tp_done)
        CU_CHECK(cu.cuStreamWriteValue32(g->stream, (CUdeviceptr)(uintptr_t)g->tp_done, (cuuint32_t)k,
                                         CU_STREAM_WRITE_VALUE_DEFAULT),
                 what);
    return 0;
}

/* Whether a sum of count floats takes the LL lines: the exchange is set up, count fits a slot
 * and is within what the start-up's timing chose for them (time_all_reduces: ll_max) */
static bool ll_chosen(const gpu_ar_args *a, size_t count)
{
    return a->n_ranks > 1 && count <= a->cap && count <= (size_t)a->ll_max;
}

bool gpu_tp_ll_push(const gpu_engine *g, size_t count, matvec_ll_push *p)
{
    const gpu_ar_args *a = &g->ar;
    if (!__atomic_load_n((nccl_comm *)&g->tp_comm, __ATOMIC_ACQUIRE) || !ll_chosen(a, count)) return false;
    *p = (matvec_ll_push){.epoch = a->epoch + GPU_AR_BLOCKS, .cap = a->cap, .ll_cap = a->ll_cap, .rank = a->rank,
                          .n_ranks = a->n_ranks};
    for (int s = 0; s < a->n_ranks; s++) p->xbuf[s] = a->xbuf[s];
    return true;
}

int gpu_tp_residual_add(gpu_engine *g, size_t count, const matvec_norm *norm, bool pushed, const char *what,
                        char *err, size_t errlen)
{
    if (!__atomic_load_n((nccl_comm *)&g->tp_comm, __ATOMIC_ACQUIRE)) { /* as gpu_tp_all_reduce says */
        snprintf(err, errlen, "%s: the tensor-parallel communicators were aborted after another GPU failed", what);
        return -1;
    }
    gpu_ar_args a = g->ar;
    const bool peer = a.n_ranks > 1 && count <= a.cap;
    a.ll = ll_chosen(&a, count); /* ll_max: what the start-up's timing chose (time_all_reduces) */
    if (pushed && !a.ll) { /* the product pushed words no one would read, or for a wait that will not come */
        snprintf(err, errlen, "%s: a product pushed its LL words for a sum of %zu floats that takes no LL lines", what,
                 count);
        return -1;
    }
    a.pushed = pushed;
    if (!peer) {
        if (gpu_tp_all_reduce(g, g->tp_part, count, what, err, errlen)) return -1;
        a.n_ranks = 1, a.rank = 0; /* tp_part holds the sum */
    }
    a.x = (float *)(uintptr_t)g->x;
    a.part = (const float *)(uintptr_t)g->tp_part;
    a.count = (int)count;
    a.norm = norm ? *norm : (matvec_norm){0};
    unsigned blocks = (unsigned)((count / 4 + 255) / 256);
    gpu_launch_dims d = a.ll ? (gpu_launch_dims){GPU_AR_LL_BLOCKS, 1, 1, GPU_AR_LL_THREADS}
                      : peer ? (gpu_launch_dims){GPU_AR_BLOCKS, 1, 1, GPU_AR_THREADS}
                             : (gpu_launch_dims){blocks < 1024 ? blocks : 1024, 1, 1, 256};
    void *args[] = {&a};
    if (gpu_launch(&g->k.tp_add, d, g->stream, args, what, err, errlen)) return -1;
    return mark_progress(g, what, err, errlen);
}

int gpu_tp_gather(gpu_engine *g, const char *what, char *err, size_t errlen)
{
    gpu_ar_args a = g->ar;
    void *args[] = {&a};
    return gpu_launch(&g->k.tp_gather, (gpu_launch_dims){1, 1, 1, 32}, g->stream, args, what, err, errlen);
}

/* ---- the engine ------------------------------------------------------------------------------ */

typedef struct gpu_tp gpu_tp;
/* What every rank runs at once (a step; the all-reduce timing): rank r's part, 0 or an error in
 * tp->err[r] */
typedef int (*tp_job)(gpu_tp *tp, int r, void *arg);

struct gpu_tp {
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
    bool revoked; /* the communicators were revoked (destroyed with ncclCommAbort) */
    char why[512]; /* what killed the engine */
    tp_job job; /* the job in hand and its argument */
    void *job_arg;
    char job_what[128]; /* what it is, for the watchdog's report */
    int rc[TP_MAX_GPUS];
    bool running[TP_MAX_GPUS]; /* rank r is still in the step in hand */
    char err[TP_MAX_GPUS][320];
    /* the watchdog: in_step while a step runs (since step_t0, monotonic seconds), wd wakes it */
    pthread_t wd_thread;
    bool wd_on, in_step;
    pthread_cond_t wd;
    double step_t0;
    pthread_t aborter; /* the watchdog's thread revoking the communicators */
    bool aborter_on;
    /* the one-shot exchange (peer_exchange): each GPU's primary context, held from before its
     * engine until after, and its exchange buffer, flags and launch counters (0: none) */
    CUcontext pctx[TP_MAX_GPUS];
    CUdevice pdev[TP_MAX_GPUS];
    CUdeviceptr xbuf[TP_MAX_GPUS], flags[TP_MAX_GPUS], epoch[TP_MAX_GPUS];
    size_t ar_cap; /* floats a slot; 0: NCCL for every sum */
    size_t ar_ll_cap; /* floats a rank's LL lines hold (gpu_ar_args.ll_cap) */
};

typedef struct tp_worker_arg {
    gpu_tp *tp;
    int rank;
} tp_worker_arg;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* The engine dies (every later step fails with why): no rank starts another all-reduce.  True
 * for the one caller that must then abort the communicators (abort_comms, outside tp->mu: NCCL
 * may take its time, and the watchdog needs the lock).  Called with tp->mu held. */
static bool mark_dead(gpu_tp *tp, const char *why)
{
    if (tp->dead) return false;
    tp->dead = true;
    snprintf(tp->why, sizeof tp->why, "%s", why);
    for (int r = 0; r < tp->n; r++)
        if (tp->shard[r]) __atomic_store_n(&((gpu_engine *)tp->shard[r])->tp_comm, NULL, __ATOMIC_RELEASE);
    return true;
}

static bool claim_abort(gpu_tp *tp, const char *why)
{
    pthread_mutex_lock(&tp->mu);
    bool mine = mark_dead(tp, why);
    pthread_mutex_unlock(&tp->mu);
    return mine;
}

/* The other ranks may be waiting in an all-reduce that a failed one will never join: every
 * communicator's operations in flight are stopped, by ncclCommRevoke where NCCL has it (the
 * communicator stays valid for a thread still inside an NCCL call; tp_destroy aborts it), else
 * by ncclCommAbort (NCCL's older way: it frees the communicator too). */
static void abort_comms(gpu_tp *tp)
{
    log_error("cuda tp: stopping the communicators (%s)", nccl.revoke ? "ncclCommRevoke" : "ncclCommAbort");
    for (int r = 0; r < tp->n; r++) {
        if (!tp->comm[r]) continue;
        if (nccl.revoke) {
            int nr = nccl.revoke(tp->comm[r], 0);
            if (nr != NCCL_SUCCESS) log_error("cuda tp: ncclCommRevoke on GPU rank %d: %s", r, nccl.error_string(nr));
        } else {
            nccl.comm_abort(tp->comm[r]);
            tp->comm[r] = NULL;
        }
    }
    tp->revoked = nccl.revoke != NULL;
}

/* Before a rank takes the lock and sleeps on a condition, it spins up to TP_SPIN_US on the word
 * it waits for (written under tp->mu, read here atomically): a decode step of two GPUs lasts a
 * few milliseconds, and a condition variable's wake-up (tens of microseconds, twice a step: the
 * step's start on the other ranks, their end on rank 0) adds to every step, since each GPU's
 * first sum waits for the last GPU to get there. */
#define TP_SPIN_US 2000
/* The other ranks: until a job after `seen` (or quit) */
static void spin_for_job(const gpu_tp *tp, unsigned long seen)
{
    const double end = now_s() + TP_SPIN_US * 1e-6;
    for (unsigned i = 1; __atomic_load_n(&tp->gen, __ATOMIC_ACQUIRE) == seen && !__atomic_load_n(&tp->quit, __ATOMIC_ACQUIRE);
         i++)
        if (i % 256 == 0 && now_s() > end) return;
}
/* Rank 0: until the other ranks have finished the job */
static void spin_for_ranks(const gpu_tp *tp)
{
    const double end = now_s() + TP_SPIN_US * 1e-6;
    for (unsigned i = 1; __atomic_load_n(&tp->busy, __ATOMIC_ACQUIRE) > 0; i++)
        if (i % 256 == 0 && now_s() > end) return;
}

static void *tp_worker(void *arg)
{
    gpu_tp *tp = ((tp_worker_arg *)arg)->tp;
    const int r = ((tp_worker_arg *)arg)->rank;
    free(arg);
    pthread_mutex_lock(&tp->mu);
    /* 0, the generation before the first job, not tp->gen: a job may start (the start-up timing
     * of the all-reduces does) before this thread first takes the lock, and must not be missed */
    unsigned long seen = 0;
    for (;;) {
        if (tp->gen == seen && !tp->quit) { /* the next decode step usually comes within the spin */
            pthread_mutex_unlock(&tp->mu);
            spin_for_job(tp, seen);
            pthread_mutex_lock(&tp->mu);
        }
        while (tp->gen == seen && !tp->quit) pthread_cond_wait(&tp->go, &tp->mu);
        if (tp->quit) break;
        seen = tp->gen;
        tp_job job = tp->job;
        void *arg = tp->job_arg;
        pthread_mutex_unlock(&tp->mu);
        int rc = job(tp, r, arg);
        if (rc == ENGINE_FATAL) {
            char why[512];
            snprintf(why, sizeof why, "GPU rank %d: %s", r, tp->err[r]);
            if (claim_abort(tp, why)) abort_comms(tp);
        }
        pthread_mutex_lock(&tp->mu);
        tp->rc[r] = rc;
        tp->running[r] = false;
        __atomic_store_n(&tp->busy, tp->busy - 1, __ATOMIC_RELEASE); /* read by rank 0's spin */
        if (tp->busy == 0) pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

/* Runs job on every rank at once: rank 0 in the caller's thread, the others in theirs, under
 * the watchdog.  Ranks that return differently (one refused a step, another ran it) have not
 * run the same collectives: the engine dies.  Rank 0's return, or ENGINE_FATAL with the reason
 * once the engine is dead. */
static int run_job(gpu_tp *tp, tp_job job, void *arg, char *err, size_t errlen)
{
    pthread_mutex_lock(&tp->mu);
    if (tp->dead) {
        snprintf(err, errlen, "the tensor-parallel engine failed in an earlier step (%s); restart the server", tp->why);
        pthread_mutex_unlock(&tp->mu);
        return ENGINE_FATAL;
    }
    tp->job = job;
    tp->job_arg = arg;
    tp->busy = tp->n - 1;
    __atomic_store_n(&tp->gen, tp->gen + 1, __ATOMIC_RELEASE); /* read by spinning ranks outside the lock */
    for (int r = 0; r < tp->n; r++) { /* every rank is idle: its stream drained at its last job's end */
        gpu_engine *g = (gpu_engine *)tp->shard[r];
        g->tp_sent = 0;
        if (g->tp_done) *g->tp_done = 0;
        tp->running[r] = true;
    }
    tp->in_step = true;
    tp->step_t0 = now_s();
    pthread_cond_broadcast(&tp->go);
    pthread_cond_signal(&tp->wd);
    pthread_mutex_unlock(&tp->mu);
    int rc0 = job(tp, 0, arg);
    if (rc0 == ENGINE_FATAL && claim_abort(tp, tp->err[0])) abort_comms(tp);
    spin_for_ranks(tp);
    pthread_mutex_lock(&tp->mu);
    tp->rc[0] = rc0;
    tp->running[0] = false;
    while (tp->busy > 0) pthread_cond_wait(&tp->done, &tp->mu);
    tp->in_step = false;
    pthread_cond_signal(&tp->wd);
    int rc = rc0, differ = 0;
    for (int r = 1; r < tp->n; r++)
        if (tp->rc[r] != rc) differ = r;
    if (differ && !tp->dead) {
        char why[512];
        snprintf(why, sizeof why, "the GPUs disagreed in %s: rank 0 returned %d (%.150s), rank %d %d (%.150s)",
                 tp->job_what, rc, rc ? tp->err[0] : "ok", differ, tp->rc[differ],
                 tp->rc[differ] ? tp->err[differ] : "ok");
        if (mark_dead(tp, why)) {
            pthread_mutex_unlock(&tp->mu);
            abort_comms(tp);
            pthread_mutex_lock(&tp->mu);
        }
    }
    if (tp->dead) {
        snprintf(err, errlen, "%s", tp->why);
        rc = ENGINE_FATAL;
    } else if (rc) {
        snprintf(err, errlen, "%s", tp->err[0]);
    }
    pthread_mutex_unlock(&tp->mu);
    return rc;
}

typedef struct step_args {
    const engine_seq *seqs;
    int n;
    engine_result *results;
} step_args;

/* Rank r's engine runs the step (the same inputs on every rank: each packs them alike and takes
 * the same path, so their all-reduces pair up); rank 0 writes the results. */
static int step_job(gpu_tp *tp, int r, void *arg)
{
    const step_args *a = arg;
    engine *e = tp->shard[r];
    return e->vt->step(e, a->seqs, a->n, r ? NULL : a->results, tp->err[r], sizeof tp->err[r]);
}

static int tp_step(engine *e, const engine_seq *seqs, int n, engine_result *results, char *err, size_t errlen)
{
    gpu_tp *tp = (gpu_tp *)e;
    int tokens = 0;
    for (int i = 0; i < n; i++) tokens += seqs[i].n_tokens;
    snprintf(tp->job_what, sizeof tp->job_what, "a step of %d tokens (%d sequences)", tokens, n);
    step_args a = {seqs, n, results};
    return run_job(tp, step_job, &a, err, errlen);
}

/* ---- the watchdog ---------------------------------------------------------------------------- */

static const char *phase_name(int ph)
{
    static const char *const names[] = {"idle", "packing the step", "enqueuing the eager forward pass",
                                        "capturing or launching a decode graph", "waiting for its stream"};
    return ph >= 0 && ph < (int)(sizeof names / sizeof names[0]) ? names[ph] : "?";
}

/* The k-th all-reduce of a step (1-based) of the dense layers TP splits: two a layer. */
static void all_reduce_name(int k, char *buf, size_t len)
{
    if (k <= 0) snprintf(buf, len, "none");
    else snprintf(buf, len, "#%d, layer %d's %s", k, (k - 1) / 2, (k - 1) % 2 ? "FFN down" : "attention output");
}

/* Where every GPU is in a step that has run for secs: logged, one line a GPU. */
static void report_stuck(gpu_tp *tp, double secs)
{
    pthread_mutex_lock(&tp->mu);
    bool running[TP_MAX_GPUS];
    int rc[TP_MAX_GPUS];
    nccl_comm comm[TP_MAX_GPUS];
    for (int r = 0; r < tp->n; r++) running[r] = tp->running[r], rc[r] = tp->rc[r], comm[r] = tp->comm[r];
    pthread_mutex_unlock(&tp->mu);
    log_error("cuda tp: %s has not finished after %.0f s; where each GPU is (NCCL_DEBUG=WARN in the environment "
              "adds NCCL's own messages):", tp->job_what, secs);
    for (int r = 0; r < tp->n; r++) {
        gpu_engine *g = (gpu_engine *)tp->shard[r];
        char sent[96], done[96], stream[200] = "?", async[160] = "?", state[200];
        all_reduce_name(__atomic_load_n(&g->tp_sent, __ATOMIC_RELAXED), sent, sizeof sent);
        if (g->tp_done) all_reduce_name((int)*g->tp_done, done, sizeof done);
        else snprintf(done, sizeof done, "unknown (no stream writes)");
        if (cu.cuCtxSetCurrent(g->ctx) == CUDA_SUCCESS) {
            CUresult q = cu.cuStreamQuery(g->stream);
            char b[160];
            snprintf(stream, sizeof stream, "%s", q == CUDA_SUCCESS ? "idle" : q == CUDA_ERROR_NOT_READY ? "busy" :
                                                   cuda_api_strerror(q, b, sizeof b));
        }
        int ae = NCCL_SUCCESS;
        if (comm[r] && nccl.get_async_error(comm[r], &ae) == NCCL_SUCCESS)
            snprintf(async, sizeof async, "%s%s%s", nccl.error_string(ae),
                     ae != NCCL_SUCCESS && nccl.last_error ? ": " : "",
                     ae != NCCL_SUCCESS && nccl.last_error ? nccl.last_error(comm[r]) : "");
        int ph = __atomic_load_n(&g->tp_phase, __ATOMIC_RELAXED);
        if (running[r]) snprintf(state, sizeof state, "still in its step, %s", phase_name(ph));
        else snprintf(state, sizeof state, "returned %d%s%.150s", rc[r], rc[r] ? ": " : "", rc[r] ? tp->err[r] : "");
        log_error("cuda tp:   GPU %d (rank %d): %s; all-reduces enqueued by its host: %s; finished on the GPU "
                  "(eager steps): %s; its stream %s; NCCL asynchronous error: %s", g->base.cfg.device, r, state, sent,
                  done, stream, async);
    }
}

static void *abort_comms_thread(void *arg)
{
    abort_comms(arg);
    return NULL;
}

static void wait_until(gpu_tp *tp, double deadline)
{
    struct timespec ts;
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&tp->wd, &tp->mu, &ts);
}

/* Gives every step TP_STEP_LIMIT_S: past it, the report above, the communicators revoked (from
 * a thread of their own, as NCCL may block), the step failed; still running TP_ABORT_GRACE_S
 * later, the process ends. */
static void *tp_watchdog(void *arg)
{
    gpu_tp *tp = arg;
    pthread_mutex_lock(&tp->mu);
    while (!tp->quit) {
        if (!tp->in_step) {
            pthread_cond_wait(&tp->wd, &tp->mu);
            continue;
        }
        unsigned long gen = tp->gen;
        double t0 = tp->step_t0;
        while (!tp->quit && tp->in_step && tp->gen == gen && now_s() - t0 < TP_STEP_LIMIT_S)
            wait_until(tp, t0 + TP_STEP_LIMIT_S);
        if (tp->quit || !tp->in_step || tp->gen != gen) continue;
        pthread_mutex_unlock(&tp->mu);
        report_stuck(tp, now_s() - t0);
        char why[512];
        snprintf(why, sizeof why, "%s did not finish within %d s on the GPUs (the log says where each GPU was); the "
                 "communicators were revoked", tp->job_what, TP_STEP_LIMIT_S);
        if (claim_abort(tp, why)) tp->aborter_on = pthread_create(&tp->aborter, NULL, abort_comms_thread, tp) == 0;
        pthread_mutex_lock(&tp->mu);
        double end = now_s() + TP_ABORT_GRACE_S;
        while (tp->in_step && tp->gen == gen && now_s() < end) wait_until(tp, end);
        if (tp->in_step && tp->gen == gen) {
            log_error("cuda tp: the step still runs %d s after the communicators were revoked: a hung GPU cannot be "
                      "recovered in this process; exiting", TP_ABORT_GRACE_S);
            fflush(NULL);
            _exit(70);
        }
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
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
        __atomic_store_n(&tp->quit, true, __ATOMIC_RELEASE); /* read by spin_for_job */
        pthread_cond_broadcast(&tp->go);
        pthread_cond_broadcast(&tp->wd);
        pthread_mutex_unlock(&tp->mu);
    }
    for (int r = 0; r < tp->n; r++)
        if (tp->thread_on[r]) pthread_join(tp->thread[r], NULL);
    if (tp->wd_on) pthread_join(tp->wd_thread, NULL);
    if (tp->aborter_on) pthread_join(tp->aborter, NULL);
    for (int r = 0; r < tp->n; r++)
        if (tp->shard[r]) gpu_drop_graphs((gpu_engine *)tp->shard[r]);
    if (tp->revoked) { /* revoked communicators are quiescent: abort frees them without waiting for peers */
        for (int r = 0; r < tp->n; r++)
            if (tp->comm[r]) nccl.comm_abort(tp->comm[r]);
    } else {
        destroy_comms(tp);
    }
    for (int r = 0; r < tp->n; r++) {
        gpu_engine *g = (gpu_engine *)tp->shard[r];
        if (g && g->tp_done && cu.cuCtxSetCurrent(g->ctx) == CUDA_SUCCESS) cu.cuMemFreeHost((void *)g->tp_done);
        if (g) engine_free(tp->shard[r]);
        tp_view_free(&tp->view[r]);
    }
    for (int r = 0; r < tp->n; r++) {
        if (!tp->pctx[r]) continue;
        if (cu.cuCtxSetCurrent(tp->pctx[r]) == CUDA_SUCCESS) {
            CUdeviceptr bufs[] = {tp->xbuf[r], tp->flags[r], tp->epoch[r]};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
                if (bufs[i]) cu.cuMemFree(bufs[i]);
        }
        cu.cuDevicePrimaryCtxRelease(tp->pdev[r]);
    }
    if (tp->sync_on) {
        pthread_mutex_destroy(&tp->mu);
        pthread_cond_destroy(&tp->go);
        pthread_cond_destroy(&tp->done);
        pthread_cond_destroy(&tp->wd);
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

/* The one-shot exchange over NVLink (kernels/allreduce.cuh, gpu_shared.h gpu_ar_args) for sums
 * of up to rows rows: every GPU's context given access to every other's memory, and on each an
 * exchange buffer of two parities of a slot per rank (and of LL lines per rank, for up to
 * GPU_MAX_DECODE_BATCH rows), a flag per block and rank, a launch counter per block, all zero.
 * Made before the engines size their KV pools.  GPUs that cannot reach each other's memory
 * keep NCCL for every sum (logged); -1 only where the buffers do not fit. */
static int peer_exchange(gpu_tp *tp, const engine_config *cfg, size_t rows, char *err, size_t errlen)
{
    const int n = tp->n;
    for (int r = 0; r < n; r++) {
        CU_CHECK(cu.cuDeviceGet(&tp->pdev[r], cfg->device + r), "tensor parallelism: the peer exchange");
        CU_CHECK(cu.cuDevicePrimaryCtxRetain(&tp->pctx[r], tp->pdev[r]), "tensor parallelism: the peer exchange");
    }
    for (int r = 0; r < n; r++) {
        CU_CHECK(cu.cuCtxSetCurrent(tp->pctx[r]), "tensor parallelism: the peer exchange");
        for (int s = 0; s < n; s++) {
            if (s == r) continue;
            int can = 0;
            CUresult e = cu.cuDeviceCanAccessPeer(&can, tp->pdev[r], tp->pdev[s]);
            if (e == CUDA_SUCCESS && can) e = cu.cuCtxEnablePeerAccess(tp->pctx[s], 0);
            if (e == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) e = CUDA_SUCCESS; /* NCCL may have done it */
            if (e != CUDA_SUCCESS || !can) {
                char b[160];
                log_info("cuda tp: GPU %d cannot address GPU %d's memory (%s): NCCL all-reduces for every sum",
                         cfg->device + r, cfg->device + s, e != CUDA_SUCCESS ? cuda_api_strerror(e, b, sizeof b)
                                                                          : "no peer access");
                return 0;
            }
        }
    }
    const size_t cap = rows * (size_t)tp->base.m->hp.n_embd;
    /* LL lines for the decode graphs' sums (up to GPU_MAX_DECODE_BATCH rows): 8 MiB at 4,096 wide */
    const size_t ll_cap = (rows < GPU_MAX_DECODE_BATCH ? rows : GPU_MAX_DECODE_BATCH) * (size_t)tp->base.m->hp.n_embd;
    const size_t sizes[] = {GPU_AR_XBUF_FLOATS(n, cap, ll_cap) * sizeof(float),
                            (size_t)GPU_AR_FLAG_WORDS * sizeof(uint32_t),
                            (size_t)GPU_AR_EPOCH_WORDS * sizeof(uint32_t)};
    for (int r = 0; r < n; r++) {
        CUdeviceptr *bufs[] = {&tp->xbuf[r], &tp->flags[r], &tp->epoch[r]};
        CU_CHECK(cu.cuCtxSetCurrent(tp->pctx[r]), "tensor parallelism: the peer exchange");
        for (int i = 0; i < 3; i++) {
            CUresult e = cu.cuMemAlloc(bufs[i], sizes[i]);
            if (e != CUDA_SUCCESS) {
                snprintf(err, errlen, "tensor parallelism: %.1f MiB of exchange buffers on GPU %d",
                         (sizes[0] + sizes[1] + sizes[2]) / MIB, cfg->device + r);
                return -1;
            }
            CU_CHECK(cu.cuMemsetD8Async(*bufs[i], 0, sizes[i], NULL), "tensor parallelism: the peer exchange");
        }
        CU_CHECK(cu.cuCtxSynchronize(), "tensor parallelism: the peer exchange");
    }
    tp->ar_cap = cap;
    tp->ar_ll_cap = ll_cap;
    log_info("cuda tp: sums of up to %zu rows by a one-shot exchange over peer memory (%.1f MiB a GPU), NCCL above",
             rows, (sizes[0] + sizes[1] + sizes[2]) / MIB);
    return 0;
}

/* Rank r's engine's view of the exchange (gpu_engine.ar); n_ranks 0 where there is none. */
static void peer_args(const gpu_tp *tp, int r, gpu_ar_args *a)
{
    *a = (gpu_ar_args){0};
    if (!tp->ar_cap) return;
    for (int s = 0; s < tp->n; s++) {
        a->xbuf[s] = (float *)(uintptr_t)tp->xbuf[s];
        a->flags[s] = (uint32_t *)(uintptr_t)tp->flags[s];
    }
    a->epoch = (uint32_t *)(uintptr_t)tp->epoch[r];
    a->cap = tp->ar_cap;
    a->ll_cap = tp->ar_ll_cap;
    a->ll_max = (int)tp->ar_ll_cap; /* until the start-up's timing chooses (time_all_reduces) */
    a->rank = r;
    a->n_ranks = tp->n;
}

/* The LM head split by vocabulary where the GPUs reach each other's memory (the hand-over is
 * tp_gather over the exchange's flags): rank r multiplies its 1/n of the vocabulary rows into rank
 * 0's logits, so a step reads 1/n of the output matrix a GPU instead of all of it (411 MiB for
 * the 8B shape).  Every rank still holds the whole matrix: rank 0's every-token logits after a
 * step (gpu_forward_logits_rows) take it whole. */
static void split_lm_head(gpu_tp *tp)
{
    if (!tp->ar_cap) return;
    const gpu_engine *g0 = (const gpu_engine *)tp->shard[0];
    const long long V = tp->base.m->hp.n_vocab;
    if (V < 128LL * tp->n) return; /* every rank some rows (a test model's vocabulary may be tiny) */
    for (int r = 0; r < tp->n; r++) {
        gpu_engine *g = (gpu_engine *)tp->shard[r];
        /* the plan's balanced rows, each rank's first on a multiple of 64: its logits' columns
         * then start 256-byte aligned for the products' vector stores */
        g->tp_vocab0 = (int)(V * r / tp->n / 64 * 64);
        g->tp_vocab1 = r + 1 < tp->n ? (int)(V * (r + 1) / tp->n / 64 * 64) : (int)V;
        g->tp_logits0 = g0->logits;
    }
    log_info("cuda tp: the LM head split by vocabulary (%d rows a GPU), its logits gathered on GPU %d, which samples",
             g0->tp_vocab1 - g0->tp_vocab0, g0->base.cfg.device);
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

/* g->tp_done: a word of pinned host memory the stream writes after each eager all-reduce
 * (cuStreamWriteValue32), so the watchdog can tell how far the GPU itself got.  Left NULL, with a
 * warning, where the driver refuses (the watchdog then says "unknown"). */
static void progress_marks(gpu_engine *g)
{
    void *p = NULL;
    CUresult r = cu.cuCtxSetCurrent(g->ctx);
    if (r == CUDA_SUCCESS) r = cu.cuMemAllocHost(&p, sizeof(uint32_t));
    if (r == CUDA_SUCCESS) {
        *(volatile uint32_t *)p = 0;
        r = cu.cuStreamWriteValue32(g->stream, (CUdeviceptr)(uintptr_t)p, 1u, CU_STREAM_WRITE_VALUE_DEFAULT);
        if (r == CUDA_SUCCESS) r = cu.cuStreamSynchronize(g->stream);
        if (r == CUDA_SUCCESS && *(volatile uint32_t *)p != 1u) r = CUDA_ERROR_NOT_SUPPORTED;
    }
    if (r != CUDA_SUCCESS) {
        char b[160];
        log_warn("cuda tp: GPU %d: no progress word for the step watchdog (%s): it will not know which all-reduce "
                 "the GPU reached", g->base.cfg.device, cuda_api_strerror(r, b, sizeof b));
        if (p) cu.cuMemFreeHost(p);
        return;
    }
    g->tp_done = p;
}

/* A decode step's all-reduces alone (2 a layer, back to back in one CUDA graph per GPU, captured
 * and launched by each rank's own thread as the decode graphs are) at 1 and 64 rows and at a
 * prompt step's rows, timed on every GPU and logged: what the all-reduces cost a step, apart
 * from the compute between them.  Run as a job, under the watchdog. */
typedef struct ar_timing {
    int rows;
    float ms[TP_MAX_GPUS]; /* one graph's time on each GPU */
} ar_timing;

static int time_graph(gpu_engine *g, int rows, CUgraphExec *exec, CUevent ev[2], float *ms, char *err, size_t errlen)
{
    const int n_ar = 2 * g->base.m->hp.n_layer, reps = 10;
    const size_t count = (size_t)rows * (size_t)g->d_embd;
    CU_CHECK(cu.cuCtxSetCurrent(g->ctx), "timing the all-reduces");
    for (int k = 0; k < 2; k++) CU_CHECK(cu.cuEventCreate(&ev[k], CU_EVENT_DEFAULT), "timing the all-reduces");
    /* the steps' own sums (exchange or NCCL, and the add into x: scratch until the first step) */
    CU_CHECK(cu.cuStreamBeginCapture(g->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "timing the all-reduces");
    g->tp_capturing = true;
    int rc = 0;
    for (int k = 0; k < n_ar && !rc; k++) rc = gpu_tp_residual_add(g, count, NULL, false, "timing the all-reduces", err, errlen);
    g->tp_capturing = false;
    CUgraph graph = NULL;
    CUresult e = cu.cuStreamEndCapture(g->stream, &graph);
    if (e == CUDA_SUCCESS && !rc) e = cu.cuGraphInstantiateWithFlags(exec, graph, 0);
    if (graph) cu.cuGraphDestroy(graph);
    if (rc) return -1;
    CU_CHECK(e, "timing the all-reduces: the graph");
    for (int it = 0; it <= reps; it++) { /* the first launch warms up, untimed */
        if (it == 1) CU_CHECK(cu.cuEventRecord(ev[0], g->stream), "timing the all-reduces");
        CU_CHECK(cu.cuGraphLaunch(*exec, g->stream), "timing the all-reduces");
    }
    CU_CHECK(cu.cuEventRecord(ev[1], g->stream), "timing the all-reduces");
    CU_CHECK(cu.cuEventSynchronize(ev[1]), "timing the all-reduces");
    CU_CHECK(cu.cuEventElapsedTime(ms, ev[0], ev[1]), "timing the all-reduces");
    *ms /= (float)reps;
    return 0;
}

static int time_job(gpu_tp *tp, int r, void *arg)
{
    ar_timing *t = arg;
    gpu_engine *g = (gpu_engine *)tp->shard[r];
    CUgraphExec exec = NULL;
    CUevent ev[2] = {NULL, NULL};
    __atomic_store_n(&g->tp_phase, GPU_TP_GRAPH, __ATOMIC_RELAXED);
    int rc = time_graph(g, t->rows, &exec, ev, &t->ms[r], tp->err[r], sizeof tp->err[r]);
    cu.cuCtxSetCurrent(g->ctx);
    cu.cuStreamSynchronize(g->stream);
    if (exec) cu.cuGraphExecDestroy(exec); /* it holds the communicator: gone before the next */
    for (int k = 0; k < 2; k++)
        if (ev[k]) cu.cuEventDestroy(ev[k]);
    __atomic_store_n(&g->tp_phase, GPU_TP_IDLE, __ATOMIC_RELAXED);
    return rc;
}

/* A step's sums of `rows` rows alone, the slowest GPU's time in *ms: 0; 1 where the timing
 * failed alike on every GPU (logged); -1 where the engine died (the ranks disagreed, or the
 * watchdog stopped them). */
static int time_sums(gpu_tp *tp, int rows, float *ms, char *err, size_t errlen)
{
    ar_timing t = {.rows = rows};
    snprintf(tp->job_what, sizeof tp->job_what, "timing %d all-reduces of %d rows", 2 * tp->base.m->hp.n_layer, rows);
    int rc = run_job(tp, time_job, &t, err, errlen);
    if (rc == ENGINE_FATAL) return -1;
    if (rc) {
        log_warn("cuda tp: timing the all-reduces: %s", err);
        return 1;
    }
    *ms = 0;
    for (int r = 0; r < tp->n; r++)
        if (t.ms[r] > *ms) *ms = t.ms[r];
    return 0;
}

/* Every rank's sums of up to `floats` floats take the LL lines (read at each sum's launch or
 * capture; called between jobs, every rank idle) */
static void set_ll_max(gpu_tp *tp, int floats)
{
    for (int r = 0; r < tp->n; r++) ((gpu_engine *)tp->shard[r])->ar.ll_max = floats;
}

/* LL lines or flags for the decode steps' sums, whichever these GPUs run faster (the lines pay
 * twice the bytes for one one-way trip instead of a round trip and a flag): both timed at 1, 8
 * and GPU_MAX_DECODE_BATCH rows as far as the lines hold, the lines kept up to the largest of
 * those where they won there and at every smaller one.  -1 only where the engine died. */
static int choose_ll(gpu_tp *tp, char *err, size_t errlen)
{
    const int n_embd = tp->base.m->hp.n_embd, n_ar = 2 * tp->base.m->hp.n_layer;
    const int rows[] = {1, 8, GPU_MAX_DECODE_BATCH};
    int best = 0;
    bool won = true;
    char line[320] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0] && (size_t)rows[i] * n_embd <= tp->ar_ll_cap; i++) {
        float ms[2]; /* LL lines, flags */
        for (int k = 0; k < 2; k++) {
            set_ll_max(tp, k ? 0 : rows[i] * n_embd);
            int rc = time_sums(tp, rows[i], &ms[k], err, errlen);
            if (rc) {
                set_ll_max(tp, best * n_embd);
                return rc < 0 ? -1 : 0;
            }
        }
        won = won && ms[0] < ms[1];
        if (won) best = rows[i];
        if (used < sizeof line)
            used += (size_t)snprintf(line + used, sizeof line - used, "%s%d rows %.1f / %.1f us", i ? "; " : "",
                                     rows[i], ms[0] * 1000.0f / (float)n_ar, ms[1] * 1000.0f / (float)n_ar);
    }
    set_ll_max(tp, best * n_embd);
    log_info("cuda tp: a sum over the peer exchange by LL lines / by flags (each, %d back to back in one graph a GPU, "
             "the slowest GPU's time): %s; LL lines for sums of up to %d rows", n_ar, line, best);
    return 0;
}

/* -1 only where the engine died (the ranks disagreed, or the watchdog stopped them): a failure
 * alike on every GPU is logged and the timing skipped. */
static int time_all_reduces(gpu_tp *tp, char *err, size_t errlen)
{
    if (tp->ar_ll_cap && choose_ll(tp, err, errlen)) return -1;
    const int cap = ((gpu_engine *)tp->shard[0])->cap_tokens; /* tp_part's rows */
    const int rows[] = {1, GPU_MAX_DECODE_BATCH < cap ? GPU_MAX_DECODE_BATCH : cap, cap};
    const int n_ar = 2 * tp->base.m->hp.n_layer;
    char line[320] = "";
    size_t used = 0;
    for (int i = 0; i < 3; i++) {
        if (i && rows[i] <= rows[i - 1]) continue;
        float ms;
        int rc = time_sums(tp, rows[i], &ms, err, errlen);
        if (rc) return rc < 0 ? -1 : 0;
        if (used < sizeof line)
            used += (size_t)snprintf(line + used, sizeof line - used, "%s%d rows %.3f ms (%.1f us each)", i ? "; " : "",
                                     rows[i], ms, ms * 1000.0f / (float)n_ar);
    }
    log_info("cuda tp: a step's %d sums and residual adds alone (%s), back to back in one graph a GPU (the slowest "
             "GPU's time): %s", n_ar, tp->ar_cap ? "the peer exchange where it takes them" : "NCCL", line);
    return 0;
}

static int tp_setup(gpu_tp *tp, const model *m, const engine_config *cfg, char *err, size_t errlen)
{
    const int n = tp->n;
    tp_shape shape;
    tp_shape_from_model(m, 2 /* FP16 K/V */, &shape);
    if (tp_plan_make(&shape, n, &tp->plan, err, errlen)) return -1;
    for (int r = 0; r < n; r++)
        if (tp_view_make(m, &tp->plan, r, &tp->view[r], err, errlen)) return -1;
    if (m->hp.n_embd % 8) { /* the residual add's float4 lanes, two to a carried norm's partial */
        snprintf(err, errlen, "tensor parallelism needs a width that is a multiple of 8 (this model's: %d)", m->hp.n_embd);
        return -1;
    }
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
    /* the exchange for decode steps and prompt steps of up to TP_PEER_ROWS tokens (at 512 rows
     * of the 8B shape NCCL took 46 us an all-reduce) */
    if (peer_exchange(tp, cfg, cap < TP_PEER_ROWS ? cap : TP_PEER_ROWS, err, errlen)) return -1;
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
        peer_args(tp, r, &((gpu_engine *)tp->shard[r])->ar);
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
    split_lm_head(tp);
    for (int r = 0; r < n; r++) progress_marks((gpu_engine *)tp->shard[r]);
    pthread_condattr_t ca;
    bool ca_ok = pthread_condattr_init(&ca) == 0;
    if (!ca_ok || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) || pthread_mutex_init(&tp->mu, NULL) ||
        pthread_cond_init(&tp->go, NULL) || pthread_cond_init(&tp->done, NULL) || pthread_cond_init(&tp->wd, &ca)) {
        if (ca_ok) pthread_condattr_destroy(&ca);
        snprintf(err, errlen, "tensor parallelism: creating the step's lock");
        return -1;
    }
    pthread_condattr_destroy(&ca);
    tp->sync_on = true;
    if (pthread_create(&tp->wd_thread, NULL, tp_watchdog, tp)) {
        snprintf(err, errlen, "tensor parallelism: starting the step watchdog's thread");
        return -1;
    }
    tp->wd_on = true;
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
    return time_all_reduces(tp, err, errlen);
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
