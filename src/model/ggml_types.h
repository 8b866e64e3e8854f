/* ggml_types.h - tensor element types as GGUF numbers them, and their block geometry.
 *
 * The numeric values are part of the GGUF file format (tensor info `type` field) and must
 * never change.  Quantised types store weights in blocks: `ggml_type_block_elems()` weights
 * packed into `ggml_type_block_bytes()` bytes.  Rows of a weight matrix are always a whole
 * number of blocks. */
#ifndef INFERD_GGML_TYPES_H
#define INFERD_GGML_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_MXFP4 = 39, /* gpt-oss's experts */
    GGML_TYPE_COUNT = 40 /* one past the largest number we know the geometry of */
} ggml_type;

#define QK_K 256 /* weights per super-block of the K-quants */

/* Geometry of a type known to the GGUF format (even if we cannot compute with it).
 * Returns false for numbers that are not a known type: the file is then refused. */
bool ggml_type_known(uint32_t type);
/* Types the CPU engine can compute with: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K
 * Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4 IQ3_S IQ3_XXS IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S.  The GPU engine decodes a subset (gpu_kernel_names.h) and
 * refuses a model with any other, naming the tensor. */
bool ggml_type_supported(ggml_type type);
const char *ggml_type_name(ggml_type type);
/* Parse "q4_k", "Q4_K", "f16", ... ; returns -1 when unknown. */
int ggml_type_from_name(const char *name);
size_t ggml_type_block_elems(ggml_type type);
size_t ggml_type_block_bytes(ggml_type type);
/* Bytes of one row of n elements (n must be a multiple of the block size); 0 if not. */
size_t ggml_row_bytes(ggml_type type, int64_t n);

#endif
