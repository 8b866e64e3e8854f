/* quant.h - the GGUF/ggml weight formats on the CPU: half-precision conversions, bit-exact
 * dequantisation, dot products of a quantised row with a float vector, and quantisation
 * (used by the model generator and by tests).
 *
 * Supported: F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K.  Block layouts follow ggml:
 *   Q4_0  32 w: f16 d; 16 B nibbles (low nibbles = weights 0..15, high = 16..31); w = d*(q-8)
 *   Q8_0  32 w: f16 d; int8 q[32]; w = d*q
 *   Q4_K 256 w: f16 d, f16 dmin, 12 B packed 6-bit scales/mins (8 sub-blocks of 32), 128 B nibbles
 *   Q5_K 256 w: as Q4_K plus 32 B high bits
 *   Q6_K 256 w: 128 B low nibbles, 64 B high 2-bits, int8 scales[16], f16 d; w = d*sc*(q-32)
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
