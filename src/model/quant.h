/* quant.h - the GGUF/ggml weight formats on the CPU: half-precision conversions, bit-exact
 * dequantisation, dot products of a quantised row with a float vector, and quantisation
 * (used by the model generator and by tests).
 *
 * Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * IQ4_NL, IQ4_XS, MXFP4, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S.  Block layouts
 * follow ggml:
 *   Q4_0  32 w: f16 d; 16 B nibbles (low nibbles = weights 0..15, high = 16..31); w = d*(q-8)
 *   Q4_1  32 w: f16 d, f16 m; nibbles as Q4_0; w = d*q + m
 *   Q5_0  32 w: f16 d; u32 qh (5th bit of weight j = bit j); nibbles as Q4_0; w = d*(q-16)
 *   Q5_1  32 w: f16 d, f16 m; qh as Q5_0; nibbles; w = d*q + m
 *   IQ4_NL 32 w: f16 d; nibbles as Q4_0 indexing a fixed 16-level grid; w = d*grid[q]
 *   MXFP4 32 w: E8M0 exponent byte e; nibbles as Q4_0, FP4 E2M1 codes; w = 2^(e-127)*fp4[q]
 *   Q8_0  32 w: f16 d; int8 q[32]; w = d*q
 *   Q4_K 256 w: f16 d, f16 dmin, 12 B packed 6-bit scales/mins (8 sub-blocks of 32), 128 B nibbles
 *   Q5_K 256 w: as Q4_K plus 32 B high bits
 *   Q6_K 256 w: 128 B low nibbles, 64 B high 2-bits, int8 scales[16], f16 d; w = d*sc*(q-32)
 *   Q2_K 256 w: 16 B (4-bit scale | 4-bit min << 4) per 16 w, 64 B 2-bit q, f16 d, f16 dmin;
 *               w = d*sc*q - dmin*m
 *   Q3_K 256 w: 32 B high-bit mask, 64 B 2-bit q, 12 B 16 packed 6-bit scales, f16 d;
 *               w = d*(sc-32)*(q - (high bit ? 0 : 4))
 *   IQ4_XS 256 w: f16 d, 8 six-bit scales (2 B high bits, 4 B low nibbles), 128 B nibbles
 *               per 32 w as IQ4_NL; w = d*(sc-32)*grid[q]
 *   IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S/IQ1_S/IQ1_M 256 w: groups of 8 (IQ3: 4) weights index
 *               a lookup grid (quant_grids.h, from gguf-py's constants) under 3- or 4-bit
 *               sub-block scales of an f16 d; signs per weight, or 7 bits per 8 with the 8th
 *               their parity (ksigns), or (IQ1) in the grid with a +-1/8 delta.  The fields are
 *               described at the block structs in quant.c.
 * Every decoder does ggml's dequantize_row_* arithmetic, so results are bit-identical to it and
 * to gguf-py's reference (tests/model/test_quant_vectors.c checks them against its output).
 */
#ifndef INFERD_QUANT_H
#define INFERD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "ggml_types.h"

float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f); /* round to nearest even, as ggml/IEEE */
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

/* Dequantise n elements (a multiple of the block size) starting at a block boundary. */
void quant_dequantize_row(ggml_type type, const void *src, float *dst, int64_t n);

/* sum_i w[i] * x[i] over one row of n weights; accumulates in float (blocks in order). */
float quant_dot_row(ggml_type type, const void *row, const float *x, int64_t n);

/* Quantise n floats into dst (ggml_row_bytes(type, n) bytes). Returns bytes written,
 * 0 if the type is unsupported or n is not a multiple of the block size.  Quality is that of
 * ggml's reference quantisers (no importance matrix); exactness is not required here, only
 * that dequantise(quantise(x)) approximates x and the blocks are valid. */
size_t quant_quantize_row(ggml_type type, const float *src, void *dst, int64_t n);

#endif
