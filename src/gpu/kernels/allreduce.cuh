// allreduce.cuh - the tensor-parallel residual add (gpu_shared.h gpu_ar_args): the ranks'
// partial products of a row-split matrix summed, in rank order on every rank (so every GPU
// holds the same bits of x afterwards), and added into the residual stream; for two or more
// ranks by a one-shot exchange over NVLink peer memory instead of an NCCL all-reduce and an add
// launch after it (a decode step has two a layer: NCCL's took ~6.7 us each at one row on two
// H100s, most of it latency).

__device__ __forceinline__ void ar_store_release(uint32_t *p, uint32_t v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ar_load_acquire(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ float4 ar_add4(float4 a, float4 b)
{
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ __forceinline__ uint64_t ar_now_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// How long a block waits for a peer before it traps: a peer that never comes (its rank failed,
// or took another path) would otherwise hold this GPU forever, past the engine's step watchdog
// (gpu_tp.c, 30 s), which can revoke NCCL's waits but not a kernel's; the trap fails the step
// with a CUDA error instead.
#define AR_SPIN_LIMIT_NS 10000000000ull

// The peers' signals for this block's slice: thread s < n_ranks (s != rank) releases this
// block's pushes to rank s (its flag [block][rank] = e) and waits until rank s has given its
// own (>= e: a peer may already be one launch further, never two; see gpu_ar_args).
__device__ __forceinline__ void ar_handshake(const gpu_ar_args &a, uint32_t e)
{
    __syncthreads(); // every thread's pushes issued before the release below
    const int s = threadIdx.x;
    if (s < a.n_ranks && s != a.rank) {
        __threadfence_system();
        ar_store_release(a.flags[s] + blockIdx.x * GPU_AR_MAX_RANKS + a.rank, e);
        const uint32_t *mine = a.flags[a.rank] + blockIdx.x * GPU_AR_MAX_RANKS + s;
        uint64_t t0 = 0;
        for (unsigned i = 1; (int)(ar_load_acquire(mine) - e) < 0; i++) {
            if (i % 1024) continue;
            const uint64_t t = ar_now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > AR_SPIN_LIMIT_NS) __trap();
        }
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(GPU_AR_THREADS) tp_add(gpu_ar_args a)
{
    pdl_enter();
    const int n4 = a.count / 4, stride = gridDim.x * blockDim.x;
    const float4 *part = (const float4 *)a.part;
    int par = 0;
    if (a.n_ranks > 1) {
        __shared__ uint32_t ep;
        if (threadIdx.x == 0) ep = a.epoch[blockIdx.x] += 1; // only this block touches its counter
        __syncthreads();
        par = ep & 1;
        for (int s = 0; s < a.n_ranks; s++) {
            if (s == a.rank) continue;
            float4 *dst = (float4 *)(a.xbuf[s] + ((size_t)par * a.n_ranks + a.rank) * a.cap);
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) dst[i] = part[i];
        }
        ar_handshake(a, ep);
    }
    const float *own = a.xbuf[a.rank] + (size_t)par * a.n_ranks * a.cap; // the peers' pushes, slot by rank
    const bool norm = a.norm.xw != nullptr;
    const int e_norm = norm ? norm_exp(a.norm.ss[0], a.norm.n) : 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 sum = a.rank == 0 || a.n_ranks == 1 ? part[i] : __ldcg((const float4 *)own + i);
        for (int s = 1; s < a.n_ranks; s++)
            sum = ar_add4(sum, s == a.rank ? part[i] : __ldcg((const float4 *)(own + (size_t)s * a.cap) + i));
        float4 v = ar_add4(((const float4 *)a.x)[i], sum);
        ((float4 *)a.x)[i] = v;
        if (!norm) continue;
        // norm_out's work for features 4i..4i+3 (one row: count == norm.n); a partial covers
        // MATVEC_NORM_GROUP = 8 features, this lane's and its neighbour's (i even: the pair's
        // first), both in the loop together (n4 even)
        static_assert(MATVEC_NORM_GROUP == 8, "a partial is two lanes' four features");
        const float vs[4] = {v.x, v.y, v.z, v.w};
        float sq = 0.0f;
        for (int j = 0; j < 4; j++) {
            norm_out_feature(a.norm, 4 * i + j, vs[j]);
            sq += vs[j] * vs[j];
        }
        const float other = __shfl_xor_sync(__activemask(), sq, 1);
        if ((i & 1) == 0) a.norm.part[i / 2] = sq + other;
    }
}
