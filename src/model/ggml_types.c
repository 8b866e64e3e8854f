/* ggml_types.c - names and block geometry of the ggml tensor types.
 *
 * One table, indexed by the on-disk type number.  A zero block size marks a number that is
 * not a type (ggml retired 4, 5, 31..33 and 36..38): files using them are refused. */
#include "ggml_types.h"

#include <limits.h>
#include <strings.h>

typedef struct type_traits {
    const char *name;
    uint32_t block_elems; /* weights per block (1 for plain scalar types) */
    uint32_t block_bytes; /* bytes per block */
} type_traits;

/* Byte counts follow ggml's block structs; the sums spell out the fields so they can be
 * checked against ggml-common.h at a glance. */
static const type_traits TRAITS[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32] = {"F32", 1, 4},
    [GGML_TYPE_F16] = {"F16", 1, 2},
    [GGML_TYPE_Q4_0] = {"Q4_0", 32, 2 + 16},
    [GGML_TYPE_Q4_1] = {"Q4_1", 32, 2 + 2 + 16},
    [GGML_TYPE_Q5_0] = {"Q5_0", 32, 2 + 4 + 16},
    [GGML_TYPE_Q5_1] = {"Q5_1", 32, 2 + 2 + 4 + 16},
    [GGML_TYPE_Q8_0] = {"Q8_0", 32, 2 + 32},
    [GGML_TYPE_Q8_1] = {"Q8_1", 32, 2 + 2 + 32},
    [GGML_TYPE_Q2_K] = {"Q2_K", QK_K, 16 + 64 + 2 + 2},
    [GGML_TYPE_Q3_K] = {"Q3_K", QK_K, 32 + 64 + 12 + 2},
    [GGML_TYPE_Q4_K] = {"Q4_K", QK_K, 2 + 2 + 12 + 128},
    [GGML_TYPE_Q5_K] = {"Q5_K", QK_K, 2 + 2 + 12 + 32 + 128},
    [GGML_TYPE_Q6_K] = {"Q6_K", QK_K, 128 + 64 + 16 + 2},
    [GGML_TYPE_Q8_K] = {"Q8_K", QK_K, 4 + 256 + 32},
    [GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", QK_K, 2 + 64},
    [GGML_TYPE_IQ2_XS] = {"IQ2_XS", QK_K, 2 + 64 + 8},
    [GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", QK_K, 2 + 96},
    [GGML_TYPE_IQ1_S] = {"IQ1_S", QK_K, 2 + 32 + 16},
    [GGML_TYPE_IQ4_NL] = {"IQ4_NL", 32, 2 + 16},
    [GGML_TYPE_IQ3_S] = {"IQ3_S", QK_K, 2 + 64 + 8 + 32 + 4},
    [GGML_TYPE_IQ2_S] = {"IQ2_S", QK_K, 2 + 64 + 8 + 8},
    [GGML_TYPE_IQ4_XS] = {"IQ4_XS", QK_K, 2 + 2 + 4 + 128},
    [GGML_TYPE_I8] = {"I8", 1, 1},
    [GGML_TYPE_I16] = {"I16", 1, 2},
    [GGML_TYPE_I32] = {"I32", 1, 4},
    [GGML_TYPE_I64] = {"I64", 1, 8},
    [GGML_TYPE_F64] = {"F64", 1, 8},
    [GGML_TYPE_IQ1_M] = {"IQ1_M", QK_K, 32 + 16 + 8},
    [GGML_TYPE_BF16] = {"BF16", 1, 2},
    [GGML_TYPE_TQ1_0] = {"TQ1_0", QK_K, 48 + 4 + 2},
    [GGML_TYPE_TQ2_0] = {"TQ2_0", QK_K, 64 + 2},
    [GGML_TYPE_MXFP4] = {"MXFP4", 32, 1 + 16},
};

bool ggml_type_known(uint32_t type)
{
    return type < GGML_TYPE_COUNT && TRAITS[type].block_elems != 0;
}

bool ggml_type_supported(ggml_type type)
{
    switch (type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS:
    case GGML_TYPE_MXFP4:
    case GGML_TYPE_IQ2_XXS:
    case GGML_TYPE_IQ2_XS:
    case GGML_TYPE_IQ2_S:
    case GGML_TYPE_IQ3_XXS:
    case GGML_TYPE_IQ3_S:
    case GGML_TYPE_IQ1_S:
    case GGML_TYPE_IQ1_M:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

const char *ggml_type_name(ggml_type type)
{
    return ggml_type_known((uint32_t)type) ? TRAITS[type].name : "unknown";
}

int ggml_type_from_name(const char *name)
{
    if (!name) return -1;
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (TRAITS[t].name && strcasecmp(TRAITS[t].name, name) == 0) return t;
    return -1;
}

size_t ggml_type_block_elems(ggml_type type)
{
    return ggml_type_known((uint32_t)type) ? TRAITS[type].block_elems : 0;
}

size_t ggml_type_block_bytes(ggml_type type)
{
    return ggml_type_known((uint32_t)type) ? TRAITS[type].block_bytes : 0;
}

size_t ggml_row_bytes(ggml_type type, int64_t n)
{
    size_t be = ggml_type_block_elems(type);
    if (be == 0 || n < 0 || (uint64_t)n % be != 0) return 0;
    uint64_t blocks = (uint64_t)n / be;
    size_t bb = ggml_type_block_bytes(type);
    if (blocks > SIZE_MAX / bb) return 0; /* would not fit in memory anyway */
    return (size_t)(blocks * bb);
}
