/* gpu_kernels.c - module loading and kernel lookup for the embedded fatbin. */
#include "gpu_kernels.h"

#include <stdio.h>
#include <string.h>

#include "gpu_shared.h"

/* Emitted by embed_fatbin.py (the fatbin nvcc built from src/gpu/kernels/inferd_kernels.cu). */
extern const unsigned char inferd_kernels_fatbin[];

static const struct {
    ggml_type type;
    const char *suffix;
} wtypes[GPU_N_WTYPES] = {
    {GGML_TYPE_F32, "f32"},   {GGML_TYPE_F16, "f16"},   {GGML_TYPE_BF16, "bf16"},
    {GGML_TYPE_Q4_0, "q4_0"}, {GGML_TYPE_Q8_0, "q8_0"}, {GGML_TYPE_Q4_K, "q4_k"},
    {GGML_TYPE_Q5_K, "q5_k"}, {GGML_TYPE_Q6_K, "q6_k"},
};

int gpu_wtype_index(ggml_type t)
{
    for (int i = 0; i < GPU_N_WTYPES; i++)
        if (wtypes[i].type == t) return i;
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

/* Names outlive the lookup: they are kept for error messages. */
static char names[GPU_N_WTYPES][2 * GPU_MATVEC_VARIANTS + 2][24];
static char mmq_names[GPU_N_WTYPES][2 * GPU_MMQ_VARIANTS][24];

unsigned gpu_mmq_smem(ggml_type t, int v)
{
    /* mmq.cuh: mmq_depth stages of raw weight rows and activation rows, then the row pointers */
    unsigned stages = MMQ_DEPTH(v), bm = 16u << v;
    return stages * ((unsigned)GPU_MMQ_ROWS * (unsigned)gpu_row_bytes(t, MMQ_KT) + bm * (MMQ_KT + 32) * 2u) +
           GPU_MMQ_ROWS * (unsigned)sizeof(void *); /* row pointers */
}

bool gpu_mmq_serves(const gpu_kernels *k, int wtype, int kdim)
{
    return wtype >= 0 && k->mmq[wtype][0].f && kdim % MMQ_KT == 0;
}

static bool is_block_quant(ggml_type t) { return t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16; }

static int lookup(gpu_kernels *k, gpu_fn *fn, const char *name, char *err, size_t errlen)
{
    fn->name = name;
    CU_CHECK(cu.cuModuleGetFunction(&fn->f, k->module, name), "loading the kernels");
    return 0;
}

int gpu_kernels_load(gpu_kernels *k, char *err, size_t errlen)
{
    CU_CHECK(cu.cuModuleLoadData(&k->module, inferd_kernels_fatbin), "loading the kernel fatbin");
    static const int rows[GPU_MATVEC_VARIANTS] = {1, 2, 4, 8};
    for (int t = 0; t < GPU_N_WTYPES; t++) {
        for (int v = 0; v < GPU_MATVEC_VARIANTS; v++) {
            char *mv = names[t][v], *glu = names[t][GPU_MATVEC_VARIANTS + v];
            snprintf(mv, sizeof names[t][0], "matvec_%s_%d", wtypes[t].suffix, rows[v]);
            snprintf(glu, sizeof names[t][0], "glu_%s_%d", wtypes[t].suffix, rows[v]);
            if (lookup(k, &k->matvec[t][v], mv, err, errlen) || lookup(k, &k->glu[t][v], glu, err, errlen))
                return -1;
        }
        char *dq = names[t][2 * GPU_MATVEC_VARIANTS], *em = names[t][2 * GPU_MATVEC_VARIANTS + 1];
        snprintf(dq, sizeof names[t][0], "dequant_f16_%s", wtypes[t].suffix);
        snprintf(em, sizeof names[t][0], "embed_%s", wtypes[t].suffix);
        if (lookup(k, &k->dequant_f16[t], dq, err, errlen) || lookup(k, &k->embed[t], em, err, errlen))
            return -1;
        for (int v = 0; is_block_quant(wtypes[t].type) && v < GPU_MMQ_VARIANTS; v++) {
            char *mm = mmq_names[t][v], *mg = mmq_names[t][GPU_MMQ_VARIANTS + v];
            snprintf(mm, sizeof mmq_names[t][0], "mmq_%s_%d", wtypes[t].suffix, 16 << v);
            snprintf(mg, sizeof mmq_names[t][0], "mmq_glu_%s_%d", wtypes[t].suffix, 16 << v);
            if (lookup(k, &k->mmq[t][v], mm, err, errlen) || lookup(k, &k->mmq_glu[t][v], mg, err, errlen)) return -1;
            /* the larger variants stage more than the default 48 KiB of shared memory */
            CU_CHECK(cu.cuFuncSetAttribute(k->mmq[t][v].f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           (int)gpu_mmq_smem(wtypes[t].type, v)), mm);
            CU_CHECK(cu.cuFuncSetAttribute(k->mmq_glu[t][v].f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           (int)gpu_mmq_smem(wtypes[t].type, v)), mg);
        }
    }
    struct {
        gpu_fn *fn;
        const char *name;
    } plain[] = {
        {&k->rmsnorm, "rmsnorm"},       {&k->qkv_post, "qkv_post"},
        {&k->hist_store, "hist_store"}, {&k->swiglu, "swiglu"},
        {&k->add_bias, "add_bias"},     {&k->mmq_reduce, "mmq_reduce"},
        {&k->attn_partial, "attn_partial"}, {&k->attn_partial_hd64, "attn_partial_hd64"},
        {&k->attn_partial_hd128, "attn_partial_hd128"}, {&k->attn_combine, "attn_combine"},
        {&k->flash_attn_hd64, "flash_attn_hd64"}, {&k->flash_attn_hd128, "flash_attn_hd128"},
        {&k->attn_decode_hd64, "attn_decode_hd64"}, {&k->attn_decode_hd128, "attn_decode_hd128"},
        {&k->attn_decode_combine, "attn_decode_combine"},
        {&k->sample_prep, "sample_prep"}, {&k->sample_adjust, "sample_adjust"},
        {&k->sample_reduce, "sample_reduce"}, {&k->sample, "sample"},
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (lookup(k, plain[i].fn, plain[i].name, err, errlen)) return -1;
    /* attn_decode stages more than the default 48 KiB of shared memory */
    CU_CHECK(cu.cuFuncSetAttribute(k->attn_decode_hd64.f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   (int)gpu_attn_decode_smem(64)), "attn_decode_hd64");
    CU_CHECK(cu.cuFuncSetAttribute(k->attn_decode_hd128.f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   (int)gpu_attn_decode_smem(128)), "attn_decode_hd128");
    return 0;
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

int gpu_launch_smem(const gpu_fn *fn, gpu_launch_dims d, unsigned smem, CUstream stream, void **args,
                    const char *what, char *err, size_t errlen)
{
    CUresult r = cu.cuLaunchKernel(fn->f, d.gx, d.gy ? d.gy : 1, d.gz ? d.gz : 1, d.bx, 1, 1, smem,
                                   stream, args, NULL);
    if (r != CUDA_SUCCESS) {
        char b[160];
        snprintf(err, errlen, "%s: launching %s (grid %ux%ux%u, block %u, %u bytes shared): %s", what, fn->name,
                 d.gx, d.gy ? d.gy : 1, d.gz ? d.gz : 1, d.bx, smem, cuda_api_strerror(r, b, sizeof b));
        return -1;
    }
    return 0;
}
