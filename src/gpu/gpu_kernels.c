/* gpu_kernels.c - module loading and kernel lookup for the embedded fatbin. */
#include "gpu_kernels.h"

#include <stdio.h>
#include <string.h>

#include "gpu_shared.h"

/* Emitted by embed_fatbin.py (the fatbin nvcc built from src/gpu/kernels/inferd_kernels.cu). */
extern const unsigned char inferd_kernels_fatbin[];

/* The formats of GPU_WEIGHT_TYPES, by index. */
#define GPU_WT_GGML(TYPE, suffix) GGML_TYPE_##TYPE,
static const ggml_type wtypes[GPU_N_WTYPES] = {GPU_WEIGHT_TYPES(GPU_WT_GGML)};
#undef GPU_WT_GGML

int gpu_wtype_index(ggml_type t)
{
    for (int i = 0; i < GPU_N_WTYPES; i++)
        if (wtypes[i] == t) return i;
    return -1;
}

size_t gpu_row_bytes(ggml_type t, int k)
{
    if (t == GGML_TYPE_Q6_K) return (size_t)(k / 256) * GPU_Q6K_BLOCK;
    return ggml_row_bytes(t, k);
}

void gpu_pack_rows(ggml_type t, int k, const void *src, size_t src_row_bytes, int k_src, void *dst,
                   size_t rows)
{
    size_t drb = gpu_row_bytes(t, k);
    const unsigned char *s = src;
    unsigned char *d = dst;
    memset(d, 0, drb * rows);
    for (size_t r = 0; r < rows; r++, s += src_row_bytes, d += drb) {
        if (t != GGML_TYPE_Q6_K) {
            memcpy(d, s, ggml_row_bytes(t, k_src));
            continue;
        }
        size_t bb = ggml_row_bytes(t, 256);
        for (int b = 0; b < k_src / 256; b++) memcpy(d + (size_t)b * GPU_Q6K_BLOCK, s + (size_t)b * bb, bb);
    }
}

unsigned gpu_mmq_smem(ggml_type t, int v, size_t row_bytes)
{
    /* mmq.cuh: mmq_depth stages of raw weight rows (MMQ_WSTRIDE bytes each) and activation
     * rows, then the row pointers */
    unsigned rb = (unsigned)gpu_row_bytes(t, MMQ_KT);
    _Static_assert(GPU_MMQ_ROWS == 128 && sizeof(void *) == 8, "gpu_shared.h: MMQ_SMEM");
    return (unsigned)MMQ_SMEM(MMQ_DEPTH(v, (int)rb), v, (unsigned)MMQ_WSTRIDE(rb, row_bytes));
}

unsigned gpu_mmqn_smem(ggml_type t, int warps, int items, size_t row_bytes)
{
    /* mmq_narrow.cuh: per warp its stages of 16 rows (MMQ_WSTRIDE bytes each) and 16 row
     * pointers, then 16 x 8 partial sums per item */
    unsigned rb = (unsigned)gpu_row_bytes(t, MMQ_KT);
    return (unsigned)warps * (MMQN_DEPTH(rb) * 16u * (unsigned)MMQ_WSTRIDE(rb, row_bytes) + 16u * (unsigned)sizeof(void *)) +
           (unsigned)items * 16u * 8u * (unsigned)sizeof(float);
}

bool gpu_mmq_serves(const gpu_kernels *k, int wtype, int kdim)
{
    /* A k past whole 256-input stages: the blocks of 32 inputs (or BF16's single ones) end
     * mid-stage, which mmq.cuh stages and multiplies in part; a super-block format's rows never
     * do.  (This was off for a day: test_mmq_partial_stage's failures on the H100 were the
     * test's own, its NaN poison uploaded with cuMemcpyHtoD still landing after dequant_f16 or
     * the kernel had written, on a stream that did not wait for it; docs/benchmarks.md.) */
    if (wtype < 0 || !k->mmq[wtype][0].f || kdim % 32 != 0) return false;
    return kdim % MMQ_KT == 0 || ggml_type_block_elems(wtypes[wtype]) <= 32;
}

bool gpu_dp4a_serves(const gpu_kernels *k, int wtype, int kdim)
{
    return wtype >= 0 && k->matvec_dp4a[wtype].f && kdim % 256 == 0;
}

int gpu_matvec_pair(const gpu_kernels *k, int ta, int tb)
{
    for (int i = 0; i < GPU_N_MATVEC_PAIRS; i++)
        if (k->pair_wtype[i][0] == ta && k->pair_wtype[i][1] == tb && k->matvec_rope_norm_pair[i].f) return i;
    return -1;
}

static int lookup(gpu_kernels *k, gpu_fn *fn, const char *name, char *err, size_t errlen)
{
    fn->name = name;
    fn->pdl = &k->pdl_on;
    CU_CHECK(cu.cuModuleGetFunction(&fn->f, k->module, name), "loading the kernels");
    if (k->load_all && cuda_func_load) CU_CHECK(cuda_func_load(fn->f), name);
    return 0;
}

/* A row of the per-format lists of gpu_kernel_names.h: two kernels (the plain product and its
 * GLU twin, or dequant and embed; the dp4a rows' third: their QKV product), their format, and
 * the activation rows per block (the wide rows: their k split). */
typedef struct format_row {
    const char *name[4];
    int wtype, rows;
} format_row;
#define FORMAT_ROW(a, b, TYPE, rows) {{#a, #b}, GPU_WT_##TYPE, rows},
#define FORMAT_ROW_NO_ROWS(a, b, TYPE) {{#a, #b}, GPU_WT_##TYPE, 0},
static const format_row matvec_rows[] = {GPU_MATVEC_KERNELS(FORMAT_ROW)};
static const format_row dequant_rows[] = {GPU_DEQUANT_KERNELS(FORMAT_ROW_NO_ROWS)};
#define FORMAT_ROW_ONE(a, TYPE) {{#a, NULL}, GPU_WT_##TYPE, 1},
static const format_row rope_rows[] = {GPU_MATVEC_ROPE_KERNELS(FORMAT_ROW_ONE)};
#undef FORMAT_ROW_ONE
#define FORMAT_ROW_DP4A(a, b, c, TYPE) {{#a, #b, #c}, GPU_WT_##TYPE, 1},
static const format_row dp4a_rows[] = {GPU_MATVEC_DP4A_KERNELS(FORMAT_ROW_DP4A)};
#undef FORMAT_ROW_DP4A
#define FORMAT_ROW_NORM(a, b, c, d, TYPE) {{#a, #b, #c, #d}, GPU_WT_##TYPE, 1},
static const format_row norm_rows[] = {GPU_MATVEC_NORM_KERNELS(FORMAT_ROW_NORM)};
#undef FORMAT_ROW_NORM
#define FORMAT_ROW_ONE(a, TYPE) {{#a, NULL}, GPU_WT_##TYPE, 1},
static const format_row lo_norm_rows[] = {GPU_MATVEC_LO_NORM_KERNELS(FORMAT_ROW_ONE)};
#undef FORMAT_ROW_ONE
#define FORMAT_ROW_WIDE(a, TYPE, KS) {{#a, NULL}, GPU_WT_##TYPE, KS},
static const format_row wide_rows[] = {GPU_MATVEC_WIDE_KERNELS(FORMAT_ROW_WIDE)};
#undef FORMAT_ROW_WIDE
#define FORMAT_ROW_ONE_SEG(a, TYPE) {{#a, NULL}, GPU_WT_##TYPE, 1},
static const format_row one_rows[] = {GPU_MATVEC_ONE_KERNELS(FORMAT_ROW_ONE_SEG)};
#undef FORMAT_ROW_ONE_SEG
#define FORMAT_ROW_MOE_NORM(a, b, TYPE) {{#a, #b}, GPU_WT_##TYPE, 0},
static const format_row moe_norm_rows[] = {GPU_MOE_NORM_KERNELS(FORMAT_ROW_MOE_NORM)};
#undef FORMAT_ROW_MOE_NORM
static const format_row mmq_rows[] = {GPU_MMQ_KERNELS(FORMAT_ROW)};
#define FORMAT_ROW_MOE(a, b, c, TYPE) {{#a, #b, #c}, GPU_WT_##TYPE, 0},
static const format_row moe_rows[] = {GPU_MOE_KERNELS(FORMAT_ROW_MOE)};
#undef FORMAT_ROW_MOE
static const format_row narrow_rows[] = {GPU_MMQ_NARROW_KERNELS(FORMAT_ROW_NO_ROWS)};
#define FORMAT_ROW_ONE(a, TYPE) {{#a, NULL}, GPU_WT_##TYPE, 1},
static const format_row narrow_lo_rows[] = {GPU_MMQ_NARROW_LO_KERNELS(FORMAT_ROW_ONE)};
#undef FORMAT_ROW_ONE
#undef FORMAT_ROW
#undef FORMAT_ROW_NO_ROWS

/* The variant index of r's activation rows per block when the smallest of n variants has
 * `first` (1, 2, 4, 8 -> 0..3; 16, 32, 64 -> 0..2); -1 with a message for any other count. */
static int variant_of(const format_row *r, int first, int n, char *err, size_t errlen)
{
    for (int v = 0; v < n; v++)
        if (r->rows == first << v) return v;
    snprintf(err, errlen, "loading the kernels: %s: no variant of %d rows", r->name[0], r->rows);
    return -1;
}

/* Every format has every matvec, glu, dequant, embed and MoE variant: a table with a hole is an
 * error at load, not a NULL function at the first launch. */
static int check_complete(const gpu_kernels *k, char *err, size_t errlen)
{
    for (int t = 0; t < GPU_N_WTYPES; t++) {
        bool ok = k->dequant_f16[t].f && k->embed[t].f && k->matvec_rope[t].f && k->moe_glu[t].f &&
                  k->moe_matvec[t].f && k->moe_down[t].f;
        for (int v = 0; v < GPU_MATVEC_VARIANTS; v++) ok = ok && k->matvec[t][v].f && k->glu[t][v].f;
        if (!ok) {
            snprintf(err, errlen, "loading the kernels: gpu_kernel_names.h lacks a kernel of %s",
                     ggml_type_name(wtypes[t]));
            return -1;
        }
    }
    return 0;
}

int gpu_kernels_load(gpu_kernels *k, char *err, size_t errlen)
{
    CU_CHECK(cu.cuModuleLoadData(&k->module, inferd_kernels_fatbin), "loading the kernel fatbin");
    /* programmatic dependent launch: Hopper on (the kernels' griddepcontrol is sm_90's) */
    CUdevice dev;
    int major = 0;
    CU_CHECK(cu.cuCtxGetDevice(&dev), "loading the kernels");
    CU_CHECK(cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "loading the kernels");
    k->pdl = k->pdl_on = major >= 9;
    CU_CHECK(cu.cuDeviceGetAttribute(&k->n_sm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "loading the kernels");
    for (size_t i = 0; i < sizeof matvec_rows / sizeof matvec_rows[0]; i++) {
        const format_row *r = &matvec_rows[i];
        int v = variant_of(r, 1, GPU_MATVEC_VARIANTS, err, errlen);
        if (v < 0 || lookup(k, &k->matvec[r->wtype][v], r->name[0], err, errlen) ||
            lookup(k, &k->glu[r->wtype][v], r->name[1], err, errlen))
            return -1;
    }
    for (size_t i = 0; i < sizeof rope_rows / sizeof rope_rows[0]; i++)
        if (lookup(k, &k->matvec_rope[rope_rows[i].wtype], rope_rows[i].name[0], err, errlen)) return -1;
    /* the rows of some formats only: the dp4a products, the norms' products, the one-segment
     * products (NULL: no kernel) */
    const struct {
        const format_row *rows;
        size_t n;
        gpu_fn *fn[4];
    } partial[] = {
        {dp4a_rows, sizeof dp4a_rows / sizeof dp4a_rows[0], {k->matvec_dp4a, k->glu_dp4a, k->matvec_rope_dp4a}},
        {norm_rows, sizeof norm_rows / sizeof norm_rows[0], {k->matvec_rope_norm, k->glu_norm, k->matvec_res, k->matvec_nin}},
        {lo_norm_rows, sizeof lo_norm_rows / sizeof lo_norm_rows[0], {k->matvec_lo_nin}},
        {one_rows, sizeof one_rows / sizeof one_rows[0], {k->matvec_one}},
        {moe_norm_rows, sizeof moe_norm_rows / sizeof moe_norm_rows[0], {k->moe_glu_norm, k->moe_down_res}}};
    for (size_t l = 0; l < sizeof partial / sizeof partial[0]; l++)
        for (size_t i = 0; i < partial[l].n; i++) {
            const format_row *r = &partial[l].rows[i];
            for (int j = 0; j < 4 && partial[l].fn[j]; j++)
                if (lookup(k, &partial[l].fn[j][r->wtype], r->name[j], err, errlen)) return -1;
        }
    static const struct {
        const char *rope, *nin;
        int ta, tb;
    } pair_rows[] = {
#define PAIR_ROW(rope, nin, TA, TB) {#rope, #nin, GPU_WT_##TA, GPU_WT_##TB},
        GPU_MATVEC_PAIR_KERNELS(PAIR_ROW)
#undef PAIR_ROW
    };
    for (int i = 0; i < GPU_N_MATVEC_PAIRS; i++) {
        k->pair_wtype[i][0] = pair_rows[i].ta, k->pair_wtype[i][1] = pair_rows[i].tb;
        if (lookup(k, &k->matvec_rope_norm_pair[i], pair_rows[i].rope, err, errlen) ||
            lookup(k, &k->matvec_nin_pair[i], pair_rows[i].nin, err, errlen))
            return -1;
    }
    for (size_t i = 0; i < sizeof wide_rows / sizeof wide_rows[0]; i++) /* rows: the row's KS */
        if (lookup(k, &k->matvec_wide[wide_rows[i].wtype][wide_rows[i].rows / 2 - 1], wide_rows[i].name[0], err,
                   errlen))
            return -1;
    for (size_t i = 0; i < sizeof dequant_rows / sizeof dequant_rows[0]; i++) {
        const format_row *r = &dequant_rows[i];
        if (lookup(k, &k->dequant_f16[r->wtype], r->name[0], err, errlen) ||
            lookup(k, &k->embed[r->wtype], r->name[1], err, errlen))
            return -1;
    }
    for (size_t i = 0; i < sizeof moe_rows / sizeof moe_rows[0]; i++) {
        const format_row *r = &moe_rows[i];
        if (lookup(k, &k->moe_glu[r->wtype], r->name[0], err, errlen) ||
            lookup(k, &k->moe_matvec[r->wtype], r->name[1], err, errlen) ||
            lookup(k, &k->moe_down[r->wtype], r->name[2], err, errlen))
            return -1;
    }
    for (size_t i = 0; i < sizeof mmq_rows / sizeof mmq_rows[0]; i++) {
        const format_row *r = &mmq_rows[i];
        int v = variant_of(r, 16, GPU_MMQ_VARIANTS, err, errlen);
        if (v < 0) return -1;
        gpu_fn *mm = &k->mmq[r->wtype][v], *mg = &k->mmq_glu[r->wtype][v];
        if (lookup(k, mm, r->name[0], err, errlen) || lookup(k, mg, r->name[1], err, errlen)) return -1;
        /* the larger variants stage more than the default 48 KiB of shared memory; the most:
         * rows not 16-byte aligned (row_bytes 1) */
        int smem = (int)gpu_mmq_smem(wtypes[r->wtype], v, 1);
        CU_CHECK(cu.cuFuncSetAttribute(mm->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), mm->name);
        CU_CHECK(cu.cuFuncSetAttribute(mg->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), mg->name);
    }
    for (size_t i = 0; i < sizeof narrow_rows / sizeof narrow_rows[0]; i++) {
        const format_row *r = &narrow_rows[i];
        gpu_fn *fn[2] = {&k->mmq_narrow[r->wtype], &k->mmq_narrow_glu[r->wtype]};
        /* the most a launch asks (gpu_forward.c: MMQN_WARPS warps, k <= MMQN_MAX_K; rows not
         * 16-byte aligned: row_bytes 1) */
        int smem = (int)gpu_mmqn_smem(wtypes[r->wtype], MMQN_WARPS, 2 * MMQN_MAX_K / MMQ_KT, 1);
        for (int j = 0; j < 2; j++) {
            if (lookup(k, fn[j], r->name[j], err, errlen)) return -1;
            CU_CHECK(cu.cuFuncSetAttribute(fn[j]->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), fn[j]->name);
        }
    }
    for (size_t i = 0; i < sizeof narrow_lo_rows / sizeof narrow_lo_rows[0]; i++) {
        /* a plain launch's items hold two tiles of partials each: the same most as the glu's */
        const format_row *r = &narrow_lo_rows[i];
        gpu_fn *fn = &k->mmq_narrow_lo[r->wtype];
        int smem = (int)gpu_mmqn_smem(wtypes[r->wtype], MMQN_WARPS, 2 * MMQN_MAX_K / MMQ_KT, 1);
        if (lookup(k, fn, r->name[0], err, errlen)) return -1;
        CU_CHECK(cu.cuFuncSetAttribute(fn->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), fn->name);
    }
#define PLAIN_ROW(name) {&k->name, #name},
    struct {
        gpu_fn *fn;
        const char *name;
    } plain[] = {GPU_PLAIN_KERNELS(PLAIN_ROW)};
#undef PLAIN_ROW
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (lookup(k, plain[i].fn, plain[i].name, err, errlen)) return -1;
    /* attn_decode stages more than the default 48 KiB of shared memory */
    const gpu_fn *dec[] = {&k->attn_decode_hd64, &k->attn_decode_hd128, &k->attn_decode_hd256};
    for (int i = 0; i < 3; i++)
        CU_CHECK(cu.cuFuncSetAttribute(dec[i]->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       (int)gpu_attn_decode_smem(64 << i)),
                 dec[i]->name);
    CU_CHECK(cu.cuFuncSetAttribute(k->attn_decode_mla.f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   (int)gpu_attn_decode_mla_smem()),
             k->attn_decode_mla.name);
    /* flash_attn at head_dim 256, 512 and the latent rows too (their Q fragments beside the K/V
     * tiles: gpu_shared.h) */
    const struct {
        const gpu_fn *fn;
        int hd;
    } wide[] = {{&k->flash_attn_hd256, 256}, {&k->flash_attn_hd512, 512}, {&k->flash_attn_mla, GPU_MLA_FLASH_ROW}};
    for (int i = 0; i < 3; i++)
        CU_CHECK(cu.cuFuncSetAttribute(wide[i].fn->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       (int)gpu_flash_smem(wide[i].hd)),
                 wide[i].fn->name);
    return check_complete(k, err, errlen);
}

void gpu_kernels_unload(gpu_kernels *k)
{
    if (k->module) cu.cuModuleUnload(k->module);
    k->module = NULL;
}

int gpu_launch(const gpu_fn *fn, gpu_launch_dims d, CUstream stream, void **args, const char *what,
               char *err, size_t errlen)
{
    return gpu_launch_smem(fn, d, 0, stream, args, what, err, errlen);
}

int gpu_launch_flash(const gpu_kernels *k, const flash_args *a, int hd, unsigned n_tiles, CUstream stream,
                     const char *what, char *err, size_t errlen)
{
    const gpu_fn *fn = hd == 64    ? &k->flash_attn_hd64
                       : hd == 128 ? &k->flash_attn_hd128
                       : hd == 256 ? &k->flash_attn_hd256
                       : hd == 512 ? &k->flash_attn_hd512
                       : hd == GPU_MLA_FLASH_ROW ? &k->flash_attn_mla
                                   : NULL;
    if (!fn) {
        snprintf(err, errlen, "%s: no flash attention kernel for head_dim %d", what, hd);
        return -1;
    }
    flash_args arg = *a; /* the launch copies its parameters */
    void *args[] = {&arg};
    const gpu_launch_dims d = {n_tiles, (unsigned)a->n_kv, GPU_FA_TILE_ROWS(hd) / GPU_FA_BLOCK_ROWS(hd),
                               GPU_FA_THREADS(hd)};
    return gpu_launch_smem(fn, d, gpu_flash_smem(hd), stream, args, what, err, errlen);
}

int gpu_launch_decode(const gpu_kernels *k, const attn_args *a, int hd, unsigned n, CUstream stream, const char *what,
                      char *err, size_t errlen)
{
    attn_args arg = *a; /* the launch copies its parameters */
    void *args[] = {&arg};
    if (hd == GPU_MLA_FLASH_ROW) /* latent rows: a block per head group (kernels/attn_mla.cuh) */
        return gpu_launch_smem(&k->attn_decode_mla,
                               (gpu_launch_dims){n, (unsigned)gpu_attn_mla_groups(a->n_head), (unsigned)a->n_split,
                                                 GPU_ATT_MLA_WARPS * 32},
                               gpu_attn_decode_mla_smem(), stream, args, what, err, errlen);
    const gpu_fn *fn = hd == 64    ? &k->attn_decode_hd64
                       : hd == 128 ? &k->attn_decode_hd128
                       : hd == 256 ? &k->attn_decode_hd256
                                   : NULL;
    if (!fn) {
        snprintf(err, errlen, "%s: no decode attention kernel for head_dim %d", what, hd);
        return -1;
    }
    /* With a->old_kv the kernel issues its first tiles before waiting for the grid ahead, so it
     * launches with PDL even while a decode graph is captured (pdl_on off: PDL on every kernel
     * slowed those graphs, gpu_kernels.h): its blocks take the SMs that the QKV product's last
     * wave leaves and load K/V while it ends.  Only where the whole grid is one wave of one
     * block a multiprocessor (a block over half of its 228 KiB of shared memory: head_dim >=
     * 128), the batch-1 grids: then no early block can pile up on the first SMs to drain nor
     * hold back a block queued behind it.  (The 8B shape's B=8 step lost 2.4 % with the early
     * launch of its 1,024 blocks and the whole ring ahead together: docs/benchmarks.md.) */
    const gpu_launch_dims d = {n, (unsigned)a->n_kv, (unsigned)a->n_split, (unsigned)gpu_attn_dec_warps(hd) * 32};
    gpu_fn early = *fn;
    if (a->old_kv && gpu_attn_decode_smem(hd) > (114u << 10) && (long)n * a->n_kv * a->n_split <= k->n_sm)
        early.pdl = &k->pdl;
    return gpu_launch_smem(&early, d,
                           gpu_attn_decode_smem(hd), stream, args, what, err, errlen);
}

const gpu_fn *gpu_attn_partial_fn(const gpu_kernels *k, int hd)
{
    if (hd > 256 && hd != 512) return &k->attn_partial_wide; /* latent rows (MLA) */
    return hd == 64 ? &k->attn_partial_hd64 : hd == 128 ? &k->attn_partial_hd128 : hd == 512 ? &k->attn_partial_hd512 : &k->attn_partial;
}

int gpu_launch_smem(const gpu_fn *fn, gpu_launch_dims d, unsigned smem, CUstream stream, void **args,
                    const char *what, char *err, size_t errlen)
{
    /* with PDL (kernels/common.cuh: pdl_enter; gpu_kernels.pdl_on) the launch may begin before
     * the kernel ahead of it on the stream ends; each kernel waits for it before reading anything */
    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                              .value.programmaticStreamSerializationAllowed = 1};
    CUlaunchConfig cfg = {.gridDimX = d.gx, .gridDimY = d.gy ? d.gy : 1, .gridDimZ = d.gz ? d.gz : 1, .blockDimX = d.bx,
                          .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = smem, .hStream = stream,
                          .attrs = &attr, .numAttrs = fn->pdl && *fn->pdl ? 1 : 0};
    CUresult r = cu.cuLaunchKernelEx(&cfg, fn->f, args, NULL);
    if (r != CUDA_SUCCESS) {
        char b[160];
        snprintf(err, errlen, "%s: launching %s (grid %ux%ux%u, block %u, %u bytes shared): %s", what, fn->name,
                 d.gx, d.gy ? d.gy : 1, d.gz ? d.gz : 1, d.bx, smem, cuda_api_strerror(r, b, sizeof b));
        return -1;
    }
    return 0;
}
