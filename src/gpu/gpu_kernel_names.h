/* gpu_kernel_names.h - every kernel of the fatbin by its literal name, and the weight formats
 * they come in: the one list both sides read (plain macros, for C and CUDA alike).
 *
 * kernels/matvec.cuh and kernels/mmq.cuh define one extern "C" __global__ function per row of
 * the per-format lists below (the other kernels are defined under their literal names), and
 * gpu_kernels.c looks every row up by the same names, so `grep matvec_q4_k_1` finds the row,
 * and the row is both the kernel's definition and its lookup.  A new weight format is a row in
 * GPU_WEIGHT_TYPES and its rows in each list; tests/gpu/test_gpu_kernel_names.c checks that
 * every format has every variant, named as the lists' comments say, and gpu_kernels_load
 * refuses a table with a hole. */
#ifndef INFERD_GPU_KERNEL_NAMES_H
#define INFERD_GPU_KERNEL_NAMES_H

/* The weight formats, in the order of gpu_kernels' [format] index: X(TYPE, suffix) is
 * GGML_TYPE_<TYPE> on the host and T_<TYPE> in the kernels (kernels/quant.cuh; the same
 * numbers). */
#define GPU_WEIGHT_TYPES(X) \
    X(F32, f32) X(F16, f16) X(BF16, bf16) X(Q4_0, q4_0)   \
    X(Q8_0, q8_0) X(Q4_K, q4_k) X(Q5_K, q5_k) X(Q6_K, q6_k)

/* One-row products, every format, 1, 2, 4 and 8 activation rows per block:
 * X(matvec_<suffix>_<rows>, glu_<suffix>_<rows>, TYPE, rows) */
#define GPU_MATVEC_KERNELS(X) \
    X(matvec_f32_1, glu_f32_1, F32, 1)    \
    X(matvec_f32_2, glu_f32_2, F32, 2)    \
    X(matvec_f32_4, glu_f32_4, F32, 4)    \
    X(matvec_f32_8, glu_f32_8, F32, 8)    \
    X(matvec_f16_1, glu_f16_1, F16, 1)    \
    X(matvec_f16_2, glu_f16_2, F16, 2)    \
    X(matvec_f16_4, glu_f16_4, F16, 4)    \
    X(matvec_f16_8, glu_f16_8, F16, 8)    \
    X(matvec_bf16_1, glu_bf16_1, BF16, 1) \
    X(matvec_bf16_2, glu_bf16_2, BF16, 2) \
    X(matvec_bf16_4, glu_bf16_4, BF16, 4) \
    X(matvec_bf16_8, glu_bf16_8, BF16, 8) \
    X(matvec_q4_0_1, glu_q4_0_1, Q4_0, 1) \
    X(matvec_q4_0_2, glu_q4_0_2, Q4_0, 2) \
    X(matvec_q4_0_4, glu_q4_0_4, Q4_0, 4) \
    X(matvec_q4_0_8, glu_q4_0_8, Q4_0, 8) \
    X(matvec_q8_0_1, glu_q8_0_1, Q8_0, 1) \
    X(matvec_q8_0_2, glu_q8_0_2, Q8_0, 2) \
    X(matvec_q8_0_4, glu_q8_0_4, Q8_0, 4) \
    X(matvec_q8_0_8, glu_q8_0_8, Q8_0, 8) \
    X(matvec_q4_k_1, glu_q4_k_1, Q4_K, 1) \
    X(matvec_q4_k_2, glu_q4_k_2, Q4_K, 2) \
    X(matvec_q4_k_4, glu_q4_k_4, Q4_K, 4) \
    X(matvec_q4_k_8, glu_q4_k_8, Q4_K, 8) \
    X(matvec_q5_k_1, glu_q5_k_1, Q5_K, 1) \
    X(matvec_q5_k_2, glu_q5_k_2, Q5_K, 2) \
    X(matvec_q5_k_4, glu_q5_k_4, Q5_K, 4) \
    X(matvec_q5_k_8, glu_q5_k_8, Q5_K, 8) \
    X(matvec_q6_k_1, glu_q6_k_1, Q6_K, 1) \
    X(matvec_q6_k_2, glu_q6_k_2, Q6_K, 2) \
    X(matvec_q6_k_4, glu_q6_k_4, Q6_K, 4) \
    X(matvec_q6_k_8, glu_q6_k_8, Q6_K, 8)

/* One-row QKV products with qkv_post in the epilogue (matvec_rope_args), every format:
 * X(matvec_rope_<suffix>, TYPE) */
#define GPU_MATVEC_ROPE_KERNELS(X) \
    X(matvec_rope_f32, F32) X(matvec_rope_f16, F16) X(matvec_rope_bf16, BF16) X(matvec_rope_q4_0, Q4_0) \
    X(matvec_rope_q8_0, Q8_0) X(matvec_rope_q4_k, Q4_K) X(matvec_rope_q5_k, Q5_K) X(matvec_rope_q6_k, Q6_K)

/* Dequantisation to FP16 (the cuBLAS path of prompt products) and the embedding gather, every
 * format: X(dequant_f16_<suffix>, embed_<suffix>, TYPE) */
#define GPU_DEQUANT_KERNELS(X) \
    X(dequant_f16_f32, embed_f32, F32)    \
    X(dequant_f16_f16, embed_f16, F16)    \
    X(dequant_f16_bf16, embed_bf16, BF16) \
    X(dequant_f16_q4_0, embed_q4_0, Q4_0) \
    X(dequant_f16_q8_0, embed_q8_0, Q8_0) \
    X(dequant_f16_q4_k, embed_q4_k, Q4_K) \
    X(dequant_f16_q5_k, embed_q5_k, Q5_K) \
    X(dequant_f16_q6_k, embed_q6_k, Q6_K)

/* The mixture-of-experts products over the chosen experts' slices (kernels/moe.cuh), every
 * format: X(moe_glu_<suffix>, moe_matvec_<suffix>, TYPE) */
#define GPU_MOE_KERNELS(X) \
    X(moe_glu_f32, moe_matvec_f32, F32)    \
    X(moe_glu_f16, moe_matvec_f16, F16)    \
    X(moe_glu_bf16, moe_matvec_bf16, BF16) \
    X(moe_glu_q4_0, moe_matvec_q4_0, Q4_0) \
    X(moe_glu_q8_0, moe_matvec_q8_0, Q8_0) \
    X(moe_glu_q4_k, moe_matvec_q4_k, Q4_K) \
    X(moe_glu_q5_k, moe_matvec_q5_k, Q5_K) \
    X(moe_glu_q6_k, moe_matvec_q6_k, Q6_K)

/* Tensor-core products on the quantised blocks, the block-quantised formats (float formats
 * use cuBLAS), 16, 32 and 64 activation rows per block:
 * X(mmq_<suffix>_<rows>, mmq_glu_<suffix>_<rows>, TYPE, rows) */
#define GPU_MMQ_KERNELS(X) \
    X(mmq_q4_0_16, mmq_glu_q4_0_16, Q4_0, 16) \
    X(mmq_q4_0_32, mmq_glu_q4_0_32, Q4_0, 32) \
    X(mmq_q4_0_64, mmq_glu_q4_0_64, Q4_0, 64) \
    X(mmq_q8_0_16, mmq_glu_q8_0_16, Q8_0, 16) \
    X(mmq_q8_0_32, mmq_glu_q8_0_32, Q8_0, 32) \
    X(mmq_q8_0_64, mmq_glu_q8_0_64, Q8_0, 64) \
    X(mmq_q4_k_16, mmq_glu_q4_k_16, Q4_K, 16) \
    X(mmq_q4_k_32, mmq_glu_q4_k_32, Q4_K, 32) \
    X(mmq_q4_k_64, mmq_glu_q4_k_64, Q4_K, 64) \
    X(mmq_q5_k_16, mmq_glu_q5_k_16, Q5_K, 16) \
    X(mmq_q5_k_32, mmq_glu_q5_k_32, Q5_K, 32) \
    X(mmq_q5_k_64, mmq_glu_q5_k_64, Q5_K, 64) \
    X(mmq_q6_k_16, mmq_glu_q6_k_16, Q6_K, 16) \
    X(mmq_q6_k_32, mmq_glu_q6_k_32, Q6_K, 32) \
    X(mmq_q6_k_64, mmq_glu_q6_k_64, Q6_K, 64)

/* The kernels of no weight format (gpu_kernels' field of the same name): X(name) */
#define GPU_PLAIN_KERNELS(X) \
    X(rmsnorm) X(qkv_post) X(hist_store) X(swiglu) X(geglu) X(softcap) X(scale_f32) \
    X(add_bias) X(mmq_reduce) X(attn_partial) X(attn_partial_hd64)               \
    X(attn_partial_hd128) X(attn_combine) X(flash_attn_hd64) X(flash_attn_hd128) \
    X(attn_decode_hd64) X(attn_decode_hd128) X(attn_decode_combine)               \
    X(sample_prep) X(sample_adjust) X(sample_reduce) X(sample)                  \
    X(moe_router) X(moe_route) X(moe_sort) X(moe_combine)

#endif
