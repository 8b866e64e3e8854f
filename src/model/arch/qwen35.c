/* qwen35.c - Qwen3.5 / Qwen3.6 (dense): the hybrid stack of arch/hybrid.c, three gated-DeltaNet
 * layers (a recurrent state per sequence instead of K/V) to one full-attention layer whose
 * heads carry an output gate, QK norm and RoPE (NeoX) on the first rope.dimension_count
 * dimensions (MRoPE sections with one text position are plain RoPE); a SwiGLU feed-forward.
 * An MTP head that a file may keep is not bound (only block_count layers are). */
#include "model/arch.h"

const arch_desc arch_qwen35 = {
    .name = "qwen35",
    .keys = arch_dense_keys,
    .more_keys = {arch_hybrid_keys},
    .globals = arch_dense_globals,
    .layer_tensors = arch_qwen35_layer_tensors,
    .rope = ARCH_ROPE_NEOX,
    ARCH_HYBRID_PATTERN(ARCH_FFN_GLU, 0),
};
