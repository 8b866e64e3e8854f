// allreduce.cuh - the tensor-parallel residual add (gpu_shared.h gpu_ar_args): the ranks'
// partial products of a row-split matrix summed, in rank order on every rank (so every GPU
// holds the same bits of x afterwards), and added into the residual stream; for two or more
// ranks by a one-shot exchange over NVLink peer memory instead of an NCCL all-reduce and an add
// launch after it (a decode step has two a layer: NCCL's took ~6.7 us each at one row on two
// H100s, most of it latency).  Two ways to know a peer's push has landed: flags (every block
// pushes plain floats, then signals a flag and waits for the peer's: a release that waits for
// the pushes' NVLink round trip, then the flag's one-way trip) and, for the small sums of
// decode steps, LL lines (NCCL's low-latency protocol: each 8-byte word carries a float and the
// launch's epoch, stored in one piece, so a reader polls its own words until they carry the
// epoch: one one-way trip, no fence, no flag).
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

// A 16-byte LL line: floats a and b, each beside epoch e, stored in one 16-byte access (a peer
// sees each 8-byte {float, epoch} half whole, as NCCL's LL protocol relies on)
__device__ __forceinline__ void ar_ll_store(uint4 *p, float a, float b, uint32_t e)
{
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(__float_as_uint(a)), "r"(e),
                 "r"(__float_as_uint(b)), "r"(e)
                 : "memory");
}

__device__ __forceinline__ uint4 ar_ll_load(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// Rank dst's LL lines that rank src pushes into at parity par: [2][n_ranks][ll_cap / 2] lines
// after the flags' slots in dst's exchange buffer (two lines a float4)
__device__ __forceinline__ uint4 *ar_ll_lines(const gpu_ar_args &a, int dst, int par, int src)
{
    return ll_lines_at(a.xbuf[dst], a.n_ranks, a.cap, a.ll_cap, par, src);
}

// How long a block waits for a peer before it traps: a peer that never comes (its rank failed,
// or took another path) would otherwise hold this GPU forever, past the engine's step watchdog
// (gpu_tp.c, 30 s), which can revoke NCCL's waits but not a kernel's; the trap fails the step
// with a CUDA error instead.
#define AR_SPIN_LIMIT_NS 10000000000ull

// A wait's k-th poll (t0: 0 at its start): every 1024th reads the clock, and traps past the limit
__device__ __forceinline__ void ar_spin_limit(unsigned k, uint64_t &t0)
{
    if (k % 1024) return;
    const uint64_t t = ar_now_ns();
    if (!t0) t0 = t;
    else if (t - t0 > AR_SPIN_LIMIT_NS) __trap();
}

// Float4 i of a peer's LL push of epoch e (lines: ar_ll_lines(a, rank, par, peer)), once both
// its lines carry e; a peer that never pushes traps as ar_handshake does
__device__ __forceinline__ float4 ar_ll_wait(const uint4 *lines, int i, uint32_t e)
{
    uint4 lo, hi;
    uint64_t t0 = 0;
    for (unsigned k = 1;; k++) {
        lo = ar_ll_load(lines + 2 * i), hi = ar_ll_load(lines + 2 * i + 1);
        if (lo.y == e && lo.w == e && hi.y == e && hi.w == e) break;
        ar_spin_limit(k, t0);
    }
    return make_float4(__uint_as_float(lo.x), __uint_as_float(lo.z), __uint_as_float(hi.x), __uint_as_float(hi.z));
}

// The peers' signals for this block's slice: thread s < n_ranks (s != rank) releases this
// block's pushes to rank s (its flag [block][rank] = e) and waits until rank s has given its
// own (>= e: a peer may already be one launch further, never two; see gpu_ar_args).
__device__ __forceinline__ void ar_handshake(const gpu_ar_args &a, uint32_t e)
{
    __syncthreads(); // every thread's pushes issued before the release below
    const int s = threadIdx.x;
    if (s < a.n_ranks && s != a.rank) {
        // the release store alone orders the block's pushes before the flag (cumulative over
        // the barrier above): no fence.sc.sys before it, which waited for their round trip twice
        ar_store_release(a.flags[s] + blockIdx.x * GPU_AR_MAX_RANKS + a.rank, e);
        const uint32_t *mine = a.flags[a.rank] + blockIdx.x * GPU_AR_MAX_RANKS + s;
        uint64_t t0 = 0;
        for (unsigned i = 1; (int)(ar_load_acquire(mine) - e) < 0; i++) ar_spin_limit(i, t0);
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(GPU_AR_THREADS) tp_add(gpu_ar_args a)
{
    pdl_enter();
    const int n4 = a.count / 4, stride = gridDim.x * blockDim.x;
    const float4 *part = (const float4 *)a.part;
    const bool ll = a.n_ranks > 1 && a.ll; // grid GPU_AR_LL_BLOCKS (gpu_ar_args)
    int par = 0;
    uint32_t ep = 0;
    if (a.n_ranks > 1) {
        __shared__ uint32_t sep;
        // only this block touches its counter; the LL launches count apart (their own grid)
        if (threadIdx.x == 0) sep = a.epoch[(ll ? GPU_AR_BLOCKS : 0) + blockIdx.x] += 1;
        __syncthreads();
        ep = sep;
        par = ep & 1;
        for (int s = 0; s < a.n_ranks; s++) {
            if (s == a.rank) continue;
            if (ll) {
                if (a.pushed) continue; // the product before stored these words (matvec_ll_push)
                uint4 *dst = ar_ll_lines(a, s, par, a.rank);
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
                    const float4 v = part[i];
                    ar_ll_store(dst + 2 * i, v.x, v.y, ep);
                    ar_ll_store(dst + 2 * i + 1, v.z, v.w, ep);
                }
                continue;
            }
            float4 *dst = (float4 *)(a.xbuf[s] + ((size_t)par * a.n_ranks + a.rank) * a.cap);
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) dst[i] = part[i];
        }
        if (!ll) ar_handshake(a, ep);
    }
    const float *own = a.xbuf[a.rank] + (size_t)par * a.n_ranks * a.cap; // the peers' pushes, slot by rank
    const bool norm = a.norm.xw != nullptr;
    const int e_norm = norm ? norm_exp(a.norm.ss[0], a.norm.n) : 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 sum = part[i]; // in rank order on every rank: (p0 + p1) + p2 ...
        for (int s = 0; s < a.n_ranks; s++) {
            const float4 p = s == a.rank ? part[i]
                             : ll        ? ar_ll_wait(ar_ll_lines(a, a.rank, par, s), i, ep)
                                         : __ldcg((const float4 *)(own + (size_t)s * a.cap) + i);
            sum = s == 0 ? p : ar_add4(sum, p);
        }
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
        // the lanes of this warp in this pass, named (an LL wait may have left them apart, and
        // __activemask() names only those that happen to be together)
        const int lane = threadIdx.x & 31, left = n4 - (i - lane);
        const float other = __shfl_xor_sync(left >= 32 ? 0xffffffffu : (1u << left) - 1u, sq, 1);
        if ((i & 1) == 0) a.norm.part[i / 2] = sq + other;
    }
}

// The LM head split by vocabulary (gpu_forward.c lm_head): each rank's product stored its rows'
// logits straight into rank 0's logits (peer stores; the launch before this one), and only rank
// 0 samples.  Rank r > 0 signals rank 0 (tp_gather's flag row, slot r, with its own counter)
// once its stores are visible system-wide; rank 0 waits for every other rank's signal.  A rank
// cannot signal twice before rank 0 waits once: its next LM head comes after the next step's
// sums, which rank 0 joins only after it sampled.  One thread.
extern "C" __global__ void tp_gather(gpu_ar_args a)
{
    pdl_enter();
    if (threadIdx.x) return;
    const uint32_t e = a.epoch[GPU_AR_BLOCKS + GPU_AR_LL_BLOCKS] += 1;
    uint32_t *row = a.flags[0] + GPU_AR_BLOCKS * GPU_AR_MAX_RANKS;
    if (a.rank > 0) {
        __threadfence_system(); // the LM head's peer stores (the kernel before) ahead of the signal
        ar_store_release(row + a.rank, e);
        return;
    }
    uint64_t t0 = 0;
    for (int s = 1; s < a.n_ranks; s++)
        for (unsigned i = 1; (int)(ar_load_acquire(row + s) - e) < 0; i++) ar_spin_limit(i, t0);
}
