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
    X(Q8_0, q8_0) X(Q4_K, q4_k) X(Q5_K, q5_k) X(Q6_K, q6_k) \
    X(Q4_1, q4_1) X(Q5_0, q5_0) X(Q5_1, q5_1) X(IQ4_NL, iq4_nl) \
    X(Q2_K, q2_k) X(Q3_K, q3_k) X(IQ4_XS, iq4_xs) X(IQ2_XXS, iq2_xxs) \
    X(IQ2_XS, iq2_xs) X(IQ2_S, iq2_s) X(IQ3_XXS, iq3_xxs) X(IQ3_S, iq3_s) \
    X(IQ1_S, iq1_s) X(IQ1_M, iq1_m) X(MXFP4, mxfp4)

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
    X(matvec_q6_k_8, glu_q6_k_8, Q6_K, 8) \
    X(matvec_q4_1_1, glu_q4_1_1, Q4_1, 1) \
    X(matvec_q4_1_2, glu_q4_1_2, Q4_1, 2) \
    X(matvec_q4_1_4, glu_q4_1_4, Q4_1, 4) \
    X(matvec_q4_1_8, glu_q4_1_8, Q4_1, 8) \
    X(matvec_q5_0_1, glu_q5_0_1, Q5_0, 1) \
    X(matvec_q5_0_2, glu_q5_0_2, Q5_0, 2) \
    X(matvec_q5_0_4, glu_q5_0_4, Q5_0, 4) \
    X(matvec_q5_0_8, glu_q5_0_8, Q5_0, 8) \
    X(matvec_q5_1_1, glu_q5_1_1, Q5_1, 1) \
    X(matvec_q5_1_2, glu_q5_1_2, Q5_1, 2) \
    X(matvec_q5_1_4, glu_q5_1_4, Q5_1, 4) \
    X(matvec_q5_1_8, glu_q5_1_8, Q5_1, 8) \
    X(matvec_iq4_nl_1, glu_iq4_nl_1, IQ4_NL, 1) \
    X(matvec_iq4_nl_2, glu_iq4_nl_2, IQ4_NL, 2) \
    X(matvec_iq4_nl_4, glu_iq4_nl_4, IQ4_NL, 4) \
    X(matvec_iq4_nl_8, glu_iq4_nl_8, IQ4_NL, 8) \
    X(matvec_q2_k_1, glu_q2_k_1, Q2_K, 1) \
    X(matvec_q2_k_2, glu_q2_k_2, Q2_K, 2) \
    X(matvec_q2_k_4, glu_q2_k_4, Q2_K, 4) \
    X(matvec_q2_k_8, glu_q2_k_8, Q2_K, 8) \
    X(matvec_q3_k_1, glu_q3_k_1, Q3_K, 1) \
    X(matvec_q3_k_2, glu_q3_k_2, Q3_K, 2) \
    X(matvec_q3_k_4, glu_q3_k_4, Q3_K, 4) \
    X(matvec_q3_k_8, glu_q3_k_8, Q3_K, 8) \
    X(matvec_iq4_xs_1, glu_iq4_xs_1, IQ4_XS, 1) \
    X(matvec_iq4_xs_2, glu_iq4_xs_2, IQ4_XS, 2) \
    X(matvec_iq4_xs_4, glu_iq4_xs_4, IQ4_XS, 4) \
    X(matvec_iq4_xs_8, glu_iq4_xs_8, IQ4_XS, 8) \
    X(matvec_iq2_xxs_1, glu_iq2_xxs_1, IQ2_XXS, 1) \
    X(matvec_iq2_xxs_2, glu_iq2_xxs_2, IQ2_XXS, 2) \
    X(matvec_iq2_xxs_4, glu_iq2_xxs_4, IQ2_XXS, 4) \
    X(matvec_iq2_xxs_8, glu_iq2_xxs_8, IQ2_XXS, 8) \
    X(matvec_iq2_xs_1, glu_iq2_xs_1, IQ2_XS, 1) \
    X(matvec_iq2_xs_2, glu_iq2_xs_2, IQ2_XS, 2) \
    X(matvec_iq2_xs_4, glu_iq2_xs_4, IQ2_XS, 4) \
    X(matvec_iq2_xs_8, glu_iq2_xs_8, IQ2_XS, 8) \
    X(matvec_iq2_s_1, glu_iq2_s_1, IQ2_S, 1) \
    X(matvec_iq2_s_2, glu_iq2_s_2, IQ2_S, 2) \
    X(matvec_iq2_s_4, glu_iq2_s_4, IQ2_S, 4) \
    X(matvec_iq2_s_8, glu_iq2_s_8, IQ2_S, 8) \
    X(matvec_iq3_xxs_1, glu_iq3_xxs_1, IQ3_XXS, 1) \
    X(matvec_iq3_xxs_2, glu_iq3_xxs_2, IQ3_XXS, 2) \
    X(matvec_iq3_xxs_4, glu_iq3_xxs_4, IQ3_XXS, 4) \
    X(matvec_iq3_xxs_8, glu_iq3_xxs_8, IQ3_XXS, 8) \
    X(matvec_iq3_s_1, glu_iq3_s_1, IQ3_S, 1) \
    X(matvec_iq3_s_2, glu_iq3_s_2, IQ3_S, 2) \
    X(matvec_iq3_s_4, glu_iq3_s_4, IQ3_S, 4) \
    X(matvec_iq3_s_8, glu_iq3_s_8, IQ3_S, 8) \
    X(matvec_iq1_s_1, glu_iq1_s_1, IQ1_S, 1) \
    X(matvec_iq1_s_2, glu_iq1_s_2, IQ1_S, 2) \
    X(matvec_iq1_s_4, glu_iq1_s_4, IQ1_S, 4) \
    X(matvec_iq1_s_8, glu_iq1_s_8, IQ1_S, 8) \
    X(matvec_iq1_m_1, glu_iq1_m_1, IQ1_M, 1) \
    X(matvec_iq1_m_2, glu_iq1_m_2, IQ1_M, 2) \
    X(matvec_iq1_m_4, glu_iq1_m_4, IQ1_M, 4) \
    X(matvec_iq1_m_8, glu_iq1_m_8, IQ1_M, 8) \
    X(matvec_mxfp4_1, glu_mxfp4_1, MXFP4, 1) \
    X(matvec_mxfp4_2, glu_mxfp4_2, MXFP4, 2) \
    X(matvec_mxfp4_4, glu_mxfp4_4, MXFP4, 4) \
    X(matvec_mxfp4_8, glu_mxfp4_8, MXFP4, 8)

/* One-row QKV products with qkv_post in the epilogue (matvec_rope_args), every format:
 * X(matvec_rope_<suffix>, TYPE) */
#define GPU_MATVEC_ROPE_KERNELS(X) \
    X(matvec_rope_f32, F32) X(matvec_rope_f16, F16) X(matvec_rope_bf16, BF16) X(matvec_rope_q4_0, Q4_0) \
    X(matvec_rope_q8_0, Q8_0) X(matvec_rope_q4_k, Q4_K) X(matvec_rope_q5_k, Q5_K) X(matvec_rope_q6_k, Q6_K) \
    X(matvec_rope_q4_1, Q4_1) X(matvec_rope_q5_0, Q5_0) X(matvec_rope_q5_1, Q5_1) X(matvec_rope_iq4_nl, IQ4_NL) \
    X(matvec_rope_q2_k, Q2_K) X(matvec_rope_q3_k, Q3_K) X(matvec_rope_iq4_xs, IQ4_XS) X(matvec_rope_iq2_xxs, IQ2_XXS) \
    X(matvec_rope_iq2_xs, IQ2_XS) X(matvec_rope_iq2_s, IQ2_S) X(matvec_rope_iq3_xxs, IQ3_XXS) X(matvec_rope_iq3_s, IQ3_S) \
    X(matvec_rope_iq1_s, IQ1_S) X(matvec_rope_iq1_m, IQ1_M) X(matvec_rope_mxfp4, MXFP4)

/* One-row products over q8 activations on the integer units (kernels/dot_q8.cuh), the formats
 * they are written for (the batch-1 step's Q4_K_M matrices): plain, GLU, QKV with qkv_post:
 * X(matvec_dp4a_<suffix>, glu_dp4a_<suffix>, matvec_rope_dp4a_<suffix>, TYPE) */
#define GPU_MATVEC_DP4A_KERNELS(X) \
    X(matvec_dp4a_q4_k, glu_dp4a_q4_k, matvec_rope_dp4a_q4_k, Q4_K) \
    X(matvec_dp4a_q6_k, glu_dp4a_q6_k, matvec_rope_dp4a_q6_k, Q6_K)

/* The batch-1 step's products that carry its RMSNorms (gpu_shared.h matvec_norm), the formats
 * of the common dense files and the low-bit ones (Q2_K, Q3_K_M: +3-4 % at batch 1 on the 8B
 * shape; IQ4_XS since its one-row products decode a word at a time: 48 registers for
 * glu_norm / matvec_res, where its 76 / 70 before had measured 7 % slower carried,
 * docs/benchmarks.md); a model with another format in a layer keeps the norm launches:
 * QKV with qkv_post reading the norm's input, gate/up the same, the residual product writing
 * it, and a plain product reading it (QKV of a layer whose qkv_post keeps its launch: q/k
 * norms, a gate, partial RoPE):
 * X(matvec_rope_norm_<suffix>, glu_norm_<suffix>, matvec_res_<suffix>, matvec_nin_<suffix>, TYPE) */
#define GPU_MATVEC_NORM_KERNELS(X) \
    X(matvec_rope_norm_f16, glu_norm_f16, matvec_res_f16, matvec_nin_f16, F16) \
    X(matvec_rope_norm_q4_0, glu_norm_q4_0, matvec_res_q4_0, matvec_nin_q4_0, Q4_0) \
    X(matvec_rope_norm_q5_0, glu_norm_q5_0, matvec_res_q5_0, matvec_nin_q5_0, Q5_0) \
    X(matvec_rope_norm_q8_0, glu_norm_q8_0, matvec_res_q8_0, matvec_nin_q8_0, Q8_0) \
    X(matvec_rope_norm_q4_k, glu_norm_q4_k, matvec_res_q4_k, matvec_nin_q4_k, Q4_K) \
    X(matvec_rope_norm_q5_k, glu_norm_q5_k, matvec_res_q5_k, matvec_nin_q5_k, Q5_K) \
    X(matvec_rope_norm_q6_k, glu_norm_q6_k, matvec_res_q6_k, matvec_nin_q6_k, Q6_K) \
    X(matvec_rope_norm_q2_k, glu_norm_q2_k, matvec_res_q2_k, matvec_nin_q2_k, Q2_K) \
    X(matvec_rope_norm_q3_k, glu_norm_q3_k, matvec_res_q3_k, matvec_nin_q3_k, Q3_K) \
    X(matvec_rope_norm_iq4_xs, glu_norm_iq4_xs, matvec_res_iq4_xs, matvec_nin_iq4_xs, IQ4_XS)

/* The batch-1 QKV product of a layer whose outputs have two formats, in one launch instead of
 * one a format (kernels/matvec.cuh; gpu_shared.h matvec_pair_args): llama-quantize's Q4_K_M
 * and Q5_K_M give V (and so the layer's last QKV output) Q6_K in about half the layers, and
 * that launch alone -- a few hundred rows, 64-128 blocks -- ran at 0.25-0.46 TB/s, ~7 us of
 * the 8B shape's ~95 us layer.  With qkv_post in the epilogue (no q/k norm) or the plain
 * NORM_IN product (q/k-norm layers):
 * X(matvec_rope_norm_<a>_<b>, matvec_nin_<a>_<b>, TYPE_A, TYPE_B) */
#define GPU_MATVEC_PAIR_KERNELS(X) \
    X(matvec_rope_norm_q4_k_q6_k, matvec_nin_q4_k_q6_k, Q4_K, Q6_K) \
    X(matvec_rope_norm_q5_k_q6_k, matvec_nin_q5_k_q6_k, Q5_K, Q6_K)
#define GPU_MATVEC_PAIR_COUNT_(a, b, TA, TB) +1
#define GPU_N_MATVEC_PAIRS (0 GPU_MATVEC_PAIR_KERNELS(GPU_MATVEC_PAIR_COUNT_))

/* The batch-1 step's input product of a DeltaNet layer over its carried norm and the norm's
 * FP16 remainder in one pass (matvec_args x_lo with matvec_norm; the formats whose two-row
 * products take the x_lo pass, gpu_forward.c lo_fusable): X(matvec_lo_nin_<suffix>, TYPE) */
#define GPU_MATVEC_LO_NORM_KERNELS(X) \
    X(matvec_lo_nin_f16, F16) X(matvec_lo_nin_q4_0, Q4_0) X(matvec_lo_nin_q8_0, Q8_0) X(matvec_lo_nin_q4_k, Q4_K) \
    X(matvec_lo_nin_q5_k, Q5_K) X(matvec_lo_nin_q6_k, Q6_K)

/* The plain one-row products of a single segment without matvec_body's segment walk
 * (kernels/matvec.cuh matvec_one_body: the same sums and bits, 4-warp blocks), for Q6_K: the
 * Q4_K_M files' LM head.  (Their residual products keep matvec_res, already as fast alone:
 * docs/benchmarks.md "The Q6_K LM head in one segment".)  X(matvec_one_<suffix>, TYPE) */
#define GPU_MATVEC_ONE_KERNELS(X) X(matvec_one_q6_k, Q6_K)

/* The wide models' one-row products over parts of k (kernels/matvec.cuh matvec_wide_body:
 * MATVEC_WIDE_ROWS rows a block, KS rows a warp, each warp over 1/KS of k, the parts met in
 * shared memory), for the formats and splits that measured faster than the one-row layout on
 * the shapes gpu_forward.c matvec_wide_split picks (Gemma 3 / 4 Q4_K_M; Q6_K halves only, its
 * quarters lost): X(matvec_wide<KS>_<suffix>, TYPE, KS) */
#define GPU_MATVEC_WIDE_KERNELS(X) \
    X(matvec_wide2_q4_k, Q4_K, 2) X(matvec_wide4_q4_k, Q4_K, 4) X(matvec_wide2_q6_k, Q6_K, 2)

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
    X(dequant_f16_q6_k, embed_q6_k, Q6_K) \
    X(dequant_f16_q4_1, embed_q4_1, Q4_1) \
    X(dequant_f16_q5_0, embed_q5_0, Q5_0) \
    X(dequant_f16_q5_1, embed_q5_1, Q5_1) \
    X(dequant_f16_iq4_nl, embed_iq4_nl, IQ4_NL) \
    X(dequant_f16_q2_k, embed_q2_k, Q2_K) \
    X(dequant_f16_q3_k, embed_q3_k, Q3_K) \
    X(dequant_f16_iq4_xs, embed_iq4_xs, IQ4_XS) \
    X(dequant_f16_iq2_xxs, embed_iq2_xxs, IQ2_XXS) \
    X(dequant_f16_iq2_xs, embed_iq2_xs, IQ2_XS) \
    X(dequant_f16_iq2_s, embed_iq2_s, IQ2_S) \
    X(dequant_f16_iq3_xxs, embed_iq3_xxs, IQ3_XXS) \
    X(dequant_f16_iq3_s, embed_iq3_s, IQ3_S) \
    X(dequant_f16_iq1_s, embed_iq1_s, IQ1_S) \
    X(dequant_f16_iq1_m, embed_iq1_m, IQ1_M) \
    X(dequant_f16_mxfp4, embed_mxfp4, MXFP4)

/* The mixture-of-experts products over the chosen experts' slices (kernels/moe.cuh), every
 * format: X(moe_glu_<suffix>, moe_matvec_<suffix>, moe_down_<suffix>, TYPE) */
#define GPU_MOE_KERNELS(X) \
    X(moe_glu_f32, moe_matvec_f32, moe_down_f32, F32)    \
    X(moe_glu_f16, moe_matvec_f16, moe_down_f16, F16)    \
    X(moe_glu_bf16, moe_matvec_bf16, moe_down_bf16, BF16) \
    X(moe_glu_q4_0, moe_matvec_q4_0, moe_down_q4_0, Q4_0) \
    X(moe_glu_q8_0, moe_matvec_q8_0, moe_down_q8_0, Q8_0) \
    X(moe_glu_q4_k, moe_matvec_q4_k, moe_down_q4_k, Q4_K) \
    X(moe_glu_q5_k, moe_matvec_q5_k, moe_down_q5_k, Q5_K) \
    X(moe_glu_q6_k, moe_matvec_q6_k, moe_down_q6_k, Q6_K) \
    X(moe_glu_q4_1, moe_matvec_q4_1, moe_down_q4_1, Q4_1) \
    X(moe_glu_q5_0, moe_matvec_q5_0, moe_down_q5_0, Q5_0) \
    X(moe_glu_q5_1, moe_matvec_q5_1, moe_down_q5_1, Q5_1) \
    X(moe_glu_iq4_nl, moe_matvec_iq4_nl, moe_down_iq4_nl, IQ4_NL) \
    X(moe_glu_q2_k, moe_matvec_q2_k, moe_down_q2_k, Q2_K) \
    X(moe_glu_q3_k, moe_matvec_q3_k, moe_down_q3_k, Q3_K) \
    X(moe_glu_iq4_xs, moe_matvec_iq4_xs, moe_down_iq4_xs, IQ4_XS) \
    X(moe_glu_iq2_xxs, moe_matvec_iq2_xxs, moe_down_iq2_xxs, IQ2_XXS) \
    X(moe_glu_iq2_xs, moe_matvec_iq2_xs, moe_down_iq2_xs, IQ2_XS) \
    X(moe_glu_iq2_s, moe_matvec_iq2_s, moe_down_iq2_s, IQ2_S) \
    X(moe_glu_iq3_xxs, moe_matvec_iq3_xxs, moe_down_iq3_xxs, IQ3_XXS) \
    X(moe_glu_iq3_s, moe_matvec_iq3_s, moe_down_iq3_s, IQ3_S) \
    X(moe_glu_iq1_s, moe_matvec_iq1_s, moe_down_iq1_s, IQ1_S) \
    X(moe_glu_iq1_m, moe_matvec_iq1_m, moe_down_iq1_m, IQ1_M) \
    X(moe_glu_mxfp4, moe_matvec_mxfp4, moe_down_mxfp4, MXFP4)

/* The batch-1 MoE layer's products that carry its RMSNorms (gpu_shared.h matvec_norm), the
 * formats of the common MoE files (another format in an expert tensor keeps the norm launches):
 * gate/up reading the feed-forward norm's input, the down product and combine writing the next
 * layer's: X(moe_glu_norm_<suffix>, moe_down_res_<suffix>, TYPE) */
#define GPU_MOE_NORM_KERNELS(X) \
    X(moe_glu_norm_f16, moe_down_res_f16, F16) \
    X(moe_glu_norm_q4_0, moe_down_res_q4_0, Q4_0) \
    X(moe_glu_norm_q8_0, moe_down_res_q8_0, Q8_0) \
    X(moe_glu_norm_q4_k, moe_down_res_q4_k, Q4_K) \
    X(moe_glu_norm_q5_k, moe_down_res_q5_k, Q5_K) \
    X(moe_glu_norm_q6_k, moe_down_res_q6_k, Q6_K) \
    X(moe_glu_norm_mxfp4, moe_down_res_mxfp4, MXFP4)

/* Tensor-core products on the weights as stored, the block-quantised formats and BF16 (F16
 * goes to cuBLAS as it lies, F32 to cuBLAS's FP32 product), 16, 32 and 64 activation rows per
 * block: X(mmq_<suffix>_<rows>, mmq_glu_<suffix>_<rows>, TYPE, rows) */
#define GPU_MMQ_KERNELS(X) \
    X(mmq_bf16_16, mmq_glu_bf16_16, BF16, 16) \
    X(mmq_bf16_32, mmq_glu_bf16_32, BF16, 32) \
    X(mmq_bf16_64, mmq_glu_bf16_64, BF16, 64) \
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
    X(mmq_q6_k_64, mmq_glu_q6_k_64, Q6_K, 64) \
    X(mmq_q4_1_16, mmq_glu_q4_1_16, Q4_1, 16) \
    X(mmq_q4_1_32, mmq_glu_q4_1_32, Q4_1, 32) \
    X(mmq_q4_1_64, mmq_glu_q4_1_64, Q4_1, 64) \
    X(mmq_q5_0_16, mmq_glu_q5_0_16, Q5_0, 16) \
    X(mmq_q5_0_32, mmq_glu_q5_0_32, Q5_0, 32) \
    X(mmq_q5_0_64, mmq_glu_q5_0_64, Q5_0, 64) \
    X(mmq_q5_1_16, mmq_glu_q5_1_16, Q5_1, 16) \
    X(mmq_q5_1_32, mmq_glu_q5_1_32, Q5_1, 32) \
    X(mmq_q5_1_64, mmq_glu_q5_1_64, Q5_1, 64) \
    X(mmq_iq4_nl_16, mmq_glu_iq4_nl_16, IQ4_NL, 16) \
    X(mmq_iq4_nl_32, mmq_glu_iq4_nl_32, IQ4_NL, 32) \
    X(mmq_iq4_nl_64, mmq_glu_iq4_nl_64, IQ4_NL, 64) \
    X(mmq_q2_k_16, mmq_glu_q2_k_16, Q2_K, 16) \
    X(mmq_q2_k_32, mmq_glu_q2_k_32, Q2_K, 32) \
    X(mmq_q2_k_64, mmq_glu_q2_k_64, Q2_K, 64) \
    X(mmq_q3_k_16, mmq_glu_q3_k_16, Q3_K, 16) \
    X(mmq_q3_k_32, mmq_glu_q3_k_32, Q3_K, 32) \
    X(mmq_q3_k_64, mmq_glu_q3_k_64, Q3_K, 64) \
    X(mmq_iq4_xs_16, mmq_glu_iq4_xs_16, IQ4_XS, 16) \
    X(mmq_iq4_xs_32, mmq_glu_iq4_xs_32, IQ4_XS, 32) \
    X(mmq_iq4_xs_64, mmq_glu_iq4_xs_64, IQ4_XS, 64) \
    X(mmq_iq2_xxs_16, mmq_glu_iq2_xxs_16, IQ2_XXS, 16) \
    X(mmq_iq2_xxs_32, mmq_glu_iq2_xxs_32, IQ2_XXS, 32) \
    X(mmq_iq2_xxs_64, mmq_glu_iq2_xxs_64, IQ2_XXS, 64) \
    X(mmq_iq2_xs_16, mmq_glu_iq2_xs_16, IQ2_XS, 16) \
    X(mmq_iq2_xs_32, mmq_glu_iq2_xs_32, IQ2_XS, 32) \
    X(mmq_iq2_xs_64, mmq_glu_iq2_xs_64, IQ2_XS, 64) \
    X(mmq_iq2_s_16, mmq_glu_iq2_s_16, IQ2_S, 16) \
    X(mmq_iq2_s_32, mmq_glu_iq2_s_32, IQ2_S, 32) \
    X(mmq_iq2_s_64, mmq_glu_iq2_s_64, IQ2_S, 64) \
    X(mmq_iq3_xxs_16, mmq_glu_iq3_xxs_16, IQ3_XXS, 16) \
    X(mmq_iq3_xxs_32, mmq_glu_iq3_xxs_32, IQ3_XXS, 32) \
    X(mmq_iq3_xxs_64, mmq_glu_iq3_xxs_64, IQ3_XXS, 64) \
    X(mmq_iq3_s_16, mmq_glu_iq3_s_16, IQ3_S, 16) \
    X(mmq_iq3_s_32, mmq_glu_iq3_s_32, IQ3_S, 32) \
    X(mmq_iq3_s_64, mmq_glu_iq3_s_64, IQ3_S, 64) \
    X(mmq_iq1_s_16, mmq_glu_iq1_s_16, IQ1_S, 16) \
    X(mmq_iq1_s_32, mmq_glu_iq1_s_32, IQ1_S, 32) \
    X(mmq_iq1_s_64, mmq_glu_iq1_s_64, IQ1_S, 64) \
    X(mmq_iq1_m_16, mmq_glu_iq1_m_16, IQ1_M, 16) \
    X(mmq_iq1_m_32, mmq_glu_iq1_m_32, IQ1_M, 32) \
    X(mmq_iq1_m_64, mmq_glu_iq1_m_64, IQ1_M, 64) \
    X(mmq_mxfp4_16, mmq_glu_mxfp4_16, MXFP4, 16) \
    X(mmq_mxfp4_32, mmq_glu_mxfp4_32, MXFP4, 32) \
    X(mmq_mxfp4_64, mmq_glu_mxfp4_64, MXFP4, 64)

/* Products of 1..MMQN_MAX_M activation rows with mmq's sums (kernels/mmq_narrow.cuh: --deterministic's
 * from one row, the default engine's from two), the formats of GPU_MMQ_KERNELS:
 * X(mmq_narrow_<suffix>, mmq_narrow_glu_<suffix>, TYPE) */
#define GPU_MMQ_NARROW_KERNELS(X) \
    X(mmq_narrow_bf16, mmq_narrow_glu_bf16, BF16) \
    X(mmq_narrow_q4_0, mmq_narrow_glu_q4_0, Q4_0) \
    X(mmq_narrow_q8_0, mmq_narrow_glu_q8_0, Q8_0) \
    X(mmq_narrow_q4_k, mmq_narrow_glu_q4_k, Q4_K) \
    X(mmq_narrow_q5_k, mmq_narrow_glu_q5_k, Q5_K) \
    X(mmq_narrow_q6_k, mmq_narrow_glu_q6_k, Q6_K) \
    X(mmq_narrow_q4_1, mmq_narrow_glu_q4_1, Q4_1) \
    X(mmq_narrow_q5_0, mmq_narrow_glu_q5_0, Q5_0) \
    X(mmq_narrow_q5_1, mmq_narrow_glu_q5_1, Q5_1) \
    X(mmq_narrow_iq4_nl, mmq_narrow_glu_iq4_nl, IQ4_NL) \
    X(mmq_narrow_q2_k, mmq_narrow_glu_q2_k, Q2_K) \
    X(mmq_narrow_q3_k, mmq_narrow_glu_q3_k, Q3_K) \
    X(mmq_narrow_iq4_xs, mmq_narrow_glu_iq4_xs, IQ4_XS) \
    X(mmq_narrow_iq2_xxs, mmq_narrow_glu_iq2_xxs, IQ2_XXS) \
    X(mmq_narrow_iq2_xs, mmq_narrow_glu_iq2_xs, IQ2_XS) \
    X(mmq_narrow_iq2_s, mmq_narrow_glu_iq2_s, IQ2_S) \
    X(mmq_narrow_iq3_xxs, mmq_narrow_glu_iq3_xxs, IQ3_XXS) \
    X(mmq_narrow_iq3_s, mmq_narrow_glu_iq3_s, IQ3_S) \
    X(mmq_narrow_iq1_s, mmq_narrow_glu_iq1_s, IQ1_S) \
    X(mmq_narrow_iq1_m, mmq_narrow_glu_iq1_m, IQ1_M) \
    X(mmq_narrow_mxfp4, mmq_narrow_glu_mxfp4, MXFP4)

/* mmq_narrow's act_lo form (kernels/mmq_narrow.cuh LO: a plain product over x and its FP16
 * remainder x_lo in one pass over the weights, the bits of the two passes; gpu_forward.c
 * narrow_lo), for the formats that the latent-attention and DeltaNet input products take in the
 * usual quantisations (Q4_K_M / Q5_K_M / Q6_K / Q8_0 files; others take two launches):
 * X(mmq_narrow_lo_<suffix>, TYPE) */
#define GPU_MMQ_NARROW_LO_KERNELS(X) \
    X(mmq_narrow_lo_q4_k, Q4_K) X(mmq_narrow_lo_q5_k, Q5_K) X(mmq_narrow_lo_q6_k, Q6_K) X(mmq_narrow_lo_q8_0, Q8_0)

/* The kernels of no weight format (gpu_kernels' field of the same name): X(name) */
#define GPU_PLAIN_KERNELS(X) \
    X(rmsnorm) X(rmsnorm_q8) X(norm_prep) X(post_norm_add) X(quantize_q8) X(quantize_q8_mma) X(qkv_post) X(hist_store) X(swiglu) X(geglu) X(geglu_rows) X(to_f16) X(to_f32_rows) \
    X(softcap) X(scale_f32) X(add_bias) X(layernorm) X(gelu_erf) X(mmq_reduce) X(attn_partial) X(attn_partial_hd64) \
    X(attn_partial_hd128) X(attn_partial_hd512) X(attn_partial_wide) X(attn_combine) X(mla_post) X(mla_decode_q) X(mla_decode_value)      \
    X(flash_attn_hd64) X(flash_attn_hd128) \
    X(flash_attn_hd256) X(flash_attn_hd512) X(flash_attn_mla)                                      \
    X(attn_decode_hd64) X(attn_decode_hd128) X(attn_decode_hd256) X(attn_decode_mla) X(attn_decode_combine)               \
    X(sample_prep) X(sample_adjust) X(sample_reduce) X(sample)                  \
    X(moe_router) X(moe_router_norm) X(moe_route) X(moe_sort) X(moe_route_sort) X(moe_combine) \
    X(ssm_conv) X(ssm_qk_norm) X(ssm_gates) X(delta_rule) X(ssm_out_norm) X(ssm_conv_step) X(delta_step) \
    X(split_qgate) X(gate_heads) X(shexp_add) X(tp_add) X(tp_gather) X(delta_chunk_prep) X(delta_chunk_state)   \
    X(delta_chunk_out)

#endif
