/* gpu_kernels.h - the kernels of the embedded fatbin, looked up by name, and one checked
 * launch helper so that every launch failure names its kernel and what it was doing. */
#ifndef INFERD_GPU_KERNELS_H
#define INFERD_GPU_KERNELS_H

#include <stddef.h>

#include "model/ggml_types.h"
#include "cuda_api.h"
#include "gpu_kernel_names.h"

/* moe_route_sort's most dynamic shared memory (kernels/moe.cuh: its routing warps' scores, then
 * the sort's ids and counts; gpu_forward.c moe_chunk): what a launch may take without an attribute,
 * 48 KiB with its static part (moe_sort_block's 256 bytes) */
#define GPU_MOE_ROUTE_SORT_SMEM (47u * 1024u)

/* Weight formats the kernels decode (GPU_WEIGHT_TYPES), in the order of the tables below:
 * GPU_WT_F32, GPU_WT_F16, ... and their count GPU_N_WTYPES. */
#define GPU_WT_INDEX(TYPE, suffix) GPU_WT_##TYPE,
enum { GPU_WEIGHT_TYPES(GPU_WT_INDEX) GPU_N_WTYPES };
#undef GPU_WT_INDEX
/* Index of a weight format in the tables, -1 when the kernels do not handle it. */
int gpu_wtype_index(ggml_type t);

/* Bytes of a row of k inputs of format t as the kernels read it (GGUF layout, except Q6_K
 * blocks in GPU_Q6K_BLOCK slots). */
size_t gpu_row_bytes(ggml_type t, int k);
/* Copy rows GGUF rows of format t (src_row_bytes apart, k_src inputs each) into the kernels'
 * layout for k >= k_src inputs: gpu_row_bytes(t, k) apart, zero-filled past the data. */
void gpu_pack_rows(ggml_type t, int k, const void *src, size_t src_row_bytes, int k_src, void *dst,
                   size_t rows);

#define GPU_MATVEC_VARIANTS 4 /* 1, 2, 4, 8 activation rows per block */
#define GPU_SAMPLE_PARTS 32   /* vocabulary slices reduced in parallel per sampled row */

typedef struct gpu_fn {
    CUfunction f;
    const char *name;
    /* launched with programmatic dependent launch while *pdl (its gpu_kernels' pdl_on) holds:
     * kernels/common.cuh, pdl_enter */
    const bool *pdl;
} gpu_fn;

#define GPU_MMQ_VARIANTS 3 /* 16, 32, 64 activation rows per block */
#define GPU_MMQ_THREADS 256
#define GPU_MMQ_ROWS 128   /* weight rows per block: 16 per warp (glu: 64 features of gate and up) */

typedef struct gpu_kernels {
    CUmodule module;
    /* every kernel loaded by gpu_kernels_load (cuda_func_load), not at its first launch: a
     * tensor-parallel GPU must not stop mid-step to load one (loading may wait for the context
     * to go idle, while its NCCL kernel waits for the other GPUs).  Set before the load. */
    bool load_all;
    /* Programmatic dependent launch: pdl, the GPU takes it (sm_90 on; set by the load); pdl_on,
     * launches use it now: pdl, but off while a decode graph is captured (gpu_engine.c:
     * decode_graph).  On the H100 it takes the launch gaps out of eager steps (a verification
     * of 5 positions on the 8B shape 4.31 ms against 4.61) but slowed the graphs' batch-1 steps
     * (8B 3.29 ms against 3.08, the 1B shape 0.87 against 0.81: docs/benchmarks.md), whose
     * launches the graph already chains. */
    bool pdl, pdl_on;
    int n_sm; /* the device's multiprocessors (gpu_launch_decode: a grid that fits one wave) */
    gpu_fn matvec[GPU_N_WTYPES][GPU_MATVEC_VARIANTS];
    gpu_fn glu[GPU_N_WTYPES][GPU_MATVEC_VARIANTS];
    gpu_fn matvec_rope[GPU_N_WTYPES]; /* one-row QKV with qkv_post fused (matvec_rope_args) */
    /* one-row products over q8 activations (kernels/dot_q8.cuh; f == NULL for the formats
     * without): plain, GLU, QKV with qkv_post */
    gpu_fn matvec_dp4a[GPU_N_WTYPES], glu_dp4a[GPU_N_WTYPES], matvec_rope_dp4a[GPU_N_WTYPES];
    /* the batch-1 products that carry its RMSNorms (gpu_shared.h matvec_norm; f == NULL for the
     * formats without): QKV with qkv_post, gate/up, the residual product, a plain product
     * reading the norm (QKV without qkv_post); and norm_prep below */
    gpu_fn matvec_rope_norm[GPU_N_WTYPES], glu_norm[GPU_N_WTYPES], matvec_res[GPU_N_WTYPES], matvec_nin[GPU_N_WTYPES];
    /* a DeltaNet layer's input product over the carried norm and its remainder
     * (GPU_MATVEC_LO_NORM_KERNELS; f == NULL for the other formats) */
    gpu_fn matvec_lo_nin[GPU_N_WTYPES];
    /* the batch-1 QKV products over two formats (GPU_MATVEC_PAIR_KERNELS), pair i's formats
     * pair_wtype[i]: gpu_matvec_pair finds one */
    gpu_fn matvec_rope_norm_pair[GPU_N_MATVEC_PAIRS], matvec_nin_pair[GPU_N_MATVEC_PAIRS];
    int pair_wtype[GPU_N_MATVEC_PAIRS][2];
    /* the wide models' one-row products over parts of k (GPU_MATVEC_WIDE_KERNELS), [type][KS / 2
     * - 1] for KS 2 and 4 (f == NULL for the formats and splits without) */
    gpu_fn matvec_wide[GPU_N_WTYPES][2];
    /* the plain one-row products of a single segment (GPU_MATVEC_ONE_KERNELS: MATVEC_ONE_WARPS
     * rows a block; f == NULL for the formats without) */
    gpu_fn matvec_one[GPU_N_WTYPES];
    /* tensor-core products on block-quantised and BF16 weights (f == NULL for F16 and F32,
     * which go to cuBLAS); [type][variant], dynamic shared memory gpu_mmq_smem(type, variant) */
    gpu_fn mmq[GPU_N_WTYPES][GPU_MMQ_VARIANTS];
    gpu_fn mmq_glu[GPU_N_WTYPES][GPU_MMQ_VARIANTS];
    gpu_fn mmq_reduce;
    /* products of 1..MMQN_MAX_M rows with mmq's sums, one launch (f == NULL where mmq has
     * none; also a MoE layer's grouped experts over a few tokens); dynamic shared memory
     * gpu_mmqn_smem */
    gpu_fn mmq_narrow[GPU_N_WTYPES], mmq_narrow_glu[GPU_N_WTYPES];
    gpu_fn mmq_narrow_lo[GPU_N_WTYPES]; /* act_lo in the same pass (GPU_MMQ_NARROW_LO_KERNELS; f NULL: none) */
    gpu_fn dequant_f16[GPU_N_WTYPES];
    gpu_fn embed[GPU_N_WTYPES];
    gpu_fn rmsnorm, rmsnorm_q8, norm_prep, post_norm_add, quantize_q8, quantize_q8_mma, qkv_post, hist_store, swiglu, geglu, geglu_rows, to_f16, to_f32_rows;
    gpu_fn softcap, scale_f32, add_bias;
    gpu_fn tp_add; /* tensor parallelism's residual add over the ranks' partials (kernels/allreduce.cuh) */
    gpu_fn tp_gather; /* the vocabulary-split LM head's hand-over of its logits to rank 0 (kernels/allreduce.cuh) */
    gpu_fn layernorm, gelu_erf; /* encoders (BERT): post-LN and the MLP's exact GELU */
    gpu_fn attn_partial, attn_partial_hd64, attn_partial_hd128, attn_partial_hd512, attn_partial_wide, attn_combine;
    gpu_fn mla_post; /* multi-head latent attention's query tail and cache row (kernels/mla.cuh) */
    /* a decode step's absorbed query (with mla_post's work) and value product, one launch each */
    gpu_fn mla_decode_q, mla_decode_value;
    /* prompt tiles on the tensor cores (gpu_flash_q_tokens): launched by gpu_launch_flash */
    gpu_fn flash_attn_hd64, flash_attn_hd128, flash_attn_hd256, flash_attn_hd512, flash_attn_mla;
    /* decode tokens on the tensor cores (gpu_attn_decode_serves): gpu_attn_dec_warps(hd) warps,
     * gpu_attn_decode_smem(hd) bytes of dynamic shared memory; attn_decode_combine only for
     * a launch with no arrival counters (gpu_attnbench's comparison) */
    gpu_fn attn_decode_hd64, attn_decode_hd128, attn_decode_hd256, attn_decode_combine;
    /* deepseek2's latent rows (kernels/attn_mla.cuh): grid y the head groups, GPU_ATT_MLA_WARPS
     * warps, gpu_attn_decode_mla_smem() bytes; it merges its splits itself (attn_args.counts,
     * which it needs whenever a token has more than one split) */
    gpu_fn attn_decode_mla;
    gpu_fn sample_prep, sample_adjust, sample_reduce, sample;
    /* mixture of experts (kernels/moe.cuh): [type] products over the chosen experts' slices,
     * the router, the grouping by expert, the weighted combine */
    gpu_fn moe_glu[GPU_N_WTYPES], moe_matvec[GPU_N_WTYPES], moe_down[GPU_N_WTYPES];
    gpu_fn moe_router, moe_router_norm, moe_route, moe_sort, moe_route_sort, moe_combine;
    /* the batch-1 MoE products that carry its norms (GPU_MOE_NORM_KERNELS; f == NULL for the
     * formats without): gate/up reading the norm, the down product writing the next one */
    gpu_fn moe_glu_norm[GPU_N_WTYPES], moe_down_res[GPU_N_WTYPES];
    /* the hybrid families (kernels/deltanet.cuh): gated DeltaNet, the attention's output gate,
     * the shared expert's gated add */
    gpu_fn ssm_conv, ssm_qk_norm, ssm_gates, delta_rule, ssm_out_norm, split_qgate, gate_heads, shexp_add;
    gpu_fn delta_chunk_prep, delta_chunk_state, delta_chunk_out; /* prompts: the chunked form */
    gpu_fn ssm_conv_step, delta_step; /* decode steps: the conv, norms and gates; the rule and output norm */
} gpu_kernels;

/* Whether the mmq kernels multiply a matrix of format index wtype with kdim inputs per row
 * (block-quantised or BF16; whole 256-input stages, or any multiple of 32 for the formats of
 * 32-input blocks, whose last stage may be partial). */
bool gpu_mmq_serves(const gpu_kernels *k, int wtype, int kdim);

/* Whether the dp4a kernels multiply a matrix of format index wtype with kdim inputs per row
 * (their formats, whole 256-input super-blocks). */
bool gpu_dp4a_serves(const gpu_kernels *k, int wtype, int kdim);

/* The pair kernels' index (matvec_rope_norm_pair / matvec_nin_pair) for formats ta then tb,
 * or -1 where there is none. */
int gpu_matvec_pair(const gpu_kernels *k, int ta, int tb);

/* Load the embedded fatbin into the current context and resolve every kernel. */
int gpu_kernels_load(gpu_kernels *k, char *err, size_t errlen);
void gpu_kernels_unload(gpu_kernels *k);

typedef struct gpu_launch_dims {
    unsigned gx, gy, gz; /* grid */
    unsigned bx;         /* threads per block (1-D blocks) */
} gpu_launch_dims;

/* Dynamic shared memory of mmq variant v on format t, for rows of row_bytes (rows not
 * 16-byte aligned stage wider: MMQ_WSTRIDE). */
unsigned gpu_mmq_smem(ggml_type t, int v, size_t row_bytes);
/* ... of an mmq_narrow block of `warps` warps over `items` (tile, gate/up, split) items, rows
 * of row_bytes. */
unsigned gpu_mmqn_smem(ggml_type t, int warps, int items, size_t row_bytes);

/* Launch fn on stream with the kernel's parameters in args; -1 with "<what>: <kernel>: ..."
 * in err when the launch is refused. */
int gpu_launch(const gpu_fn *fn, gpu_launch_dims d, CUstream stream, void **args, const char *what,
               char *err, size_t errlen);
/* ... with smem bytes of dynamic shared memory. */
int gpu_launch_smem(const gpu_fn *fn, gpu_launch_dims d, unsigned smem, CUstream stream, void **args,
                    const char *what, char *err, size_t errlen);

/* flash_attn over n_tiles tiles x a->n_kv KV heads: the kernel of head_dim hd (one that
 * gpu_flash_q_tokens() serves; -1 with an error otherwise) with its shared memory. */
struct flash_args;
int gpu_launch_flash(const gpu_kernels *k, const struct flash_args *a, int hd, unsigned n_tiles, CUstream stream,
                     const char *what, char *err, size_t errlen);
/* attn_decode over n tokens x a->n_kv KV heads x a->n_split splits: the kernel of head_dim hd
 * (gpu_attn_decode_serves; -1 with an error otherwise) with its warps and shared memory. */
struct attn_args;
int gpu_launch_decode(const gpu_kernels *k, const struct attn_args *a, int hd, unsigned n, CUstream stream,
                      const char *what, char *err, size_t errlen);
/* attn_partial's kernel for head_dim hd (the generic one where no specialised one exists). */
const gpu_fn *gpu_attn_partial_fn(const gpu_kernels *k, int hd);

#endif
