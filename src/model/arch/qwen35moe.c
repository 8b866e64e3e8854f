/* qwen35moe.c - Qwen3.5 MoE (35B-A3B, 122B-A10B, 397B-A17B): qwen35's layers with a
 * mixture-of-experts feed-forward (softmax top-k, renormalised, as qwen3moe) plus a shared
 * expert scaled by sigmoid(ffn_gate_inp_shexp·x). */
#include "model/arch.h"

const arch_desc arch_qwen35moe = {
    .name = "qwen35moe",
    .keys = arch_dense_keys,
    .more_keys = {arch_moe_keys, arch_shexp_keys, arch_hybrid_keys},
    .globals = arch_dense_globals,
    .layer_tensors = arch_qwen35_layer_tensors,
    .rope = ARCH_ROPE_NEOX,
    ARCH_HYBRID_PATTERN(ARCH_FFN_MOE, ARCH_FFN_SHARED_EXPERT | ARCH_FFN_SHEXP_GATE),
};
