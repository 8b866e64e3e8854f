/* gpu.h - the CUDA backend, as the backend registry (backend/) and the daemon see it.  Built
 * from gpu_engine.c with CUDA, from gpu_stub.c without: the same three answers either way. */
#ifndef INFERD_GPU_H
#define INFERD_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"
#include "model/arch.h"

/* The recipe features (model/arch.h) gpu_forward.c runs: pre-norm, sandwich-norm or (BERT)
 * post-LN blocks of full, sliding-window or bidirectional attention (q/k/v biases, the output
 * bias, per-head q/k norms and post-norms are read when the loader bound them, which it does
 * exactly when the recipe asks; per-head v norms: Gemma 4; q, k and v as row ranges of one fused
 * matrix: phi3) with RoPE over whole heads or their first rope.dimension_count dimensions,
 * LongRoPE's factors and attention factor included, and a SwiGLU, GeGLU (gate and up the halves
 * of one fused matrix: phi3) or erf-GELU MLP feed-forward, dense, a mixture of experts behind
 * the softmax top-k router (kernels/moe.cuh), Gemma 4's scaled one or GLM-4.5's sigmoid router
 * with its selection bias, with a shared expert gated (Qwen) or not (GLM-4.5), or dense and
 * experts side by side; the hybrids' layers, gpt-oss's extras and DeepSeek's latent attention
 * and expert groups below.  A model needing another (jina-bert-v2's ALiBi, ...) is refused when
 * the engine is created, by name, rather than run wrong (gpu_engine.c: check_model).  Here, not
 * in gpu_engine.c, so that builds without CUDA can test what the GPU accepts. */
#define GPU_FEATURES                                                                              \
    (ARCH_F_NORM_PRE | ARCH_F_NORM_SANDWICH | ARCH_F_ATTN_FULL | ARCH_F_ATTN_SLIDING | ARCH_F_QKV_BIAS | \
     ARCH_F_QK_NORM | ARCH_F_V_NORM | ARCH_F_FFN_GLU | ARCH_F_FFN_MOE | ARCH_F_FFN_GLU_MOE |                \
     ARCH_F_ROUTER_SOFTMAX_TOPK | ARCH_F_ROUTER_SCALED | ARCH_F_ACT_SILU | ARCH_F_ACT_GELU_TANH |            \
     ARCH_F_ATTN_OUT_BIAS | ARCH_F_NORM_POST_LN | ARCH_F_ATTN_BIDIR | ARCH_F_FFN_MLP | ARCH_F_ACT_GELU_ERF |  \
     ARCH_F_ROPE_LONGROPE | ARCH_F_FUSED_QKV | ARCH_F_FUSED_GATE_UP | ARCH_F_ROUTER_SIGMOID_BIAS |          \
     GPU_HYBRID_FEATURES | GPU_GPTOSS_FEATURES | GPU_MLA_FEATURES)

/* deepseek2's: multi-head latent attention (gpu_forward.c: attention_mla; the latent cache,
 * the absorbed query and the value up-projection as batched FP32 cuBLAS products, the
 * attention kernels over one KV head of latent rows) and the router's expert groups
 * (kernels/moe.cuh: moe_group_mask), in GPU_FEATURES since 2026-11-26.  On the H100 the
 * reference deepseek_v3 agrees 100 % top-1 with the CPU, compute-sanitizer clean; mkmodel's
 * K-quant files first gave 96-99 % against the exact CPU, which the CPU itself gives over the
 * weights as the GPU decodes them (Q4_K/Q6_K in FP16 arithmetic, kernels/quant.cuh; Q8_0 of
 * another seed too): near ties of those tiny files (the groups, 2 of 8 experts, flat logits),
 * not a kernel error.  Against that CPU the GPU agrees 99.31-100 % on 11 of 12 files and
 * 97.92 % on the 12th; counting the reference's near ties, 100 % and 99.65 %
 * (test_gpu_engine test_deepseek2_*, docs/mla-gpu.md). */
#define GPU_MLA_FEATURES (ARCH_F_ATTN_MLA | ARCH_F_EXPERT_GROUPS)

/* gpt-oss's extras (gpu_forward.c: attention sinks in every attention kernel, YaRN RoPE in
 * qkv_post_args, the top-k-then-softmax router with its bias, the experts' biases and their
 * clamped SwiGLU), in GPU_FEATURES since 2026-11-26.  On the H100 the reference gpt-oss.gguf
 * first gave 96.53 % top-1 against the CPU: not a kernel error but a router near tie (layer 0,
 * position 10 of the test's tokens, experts 6.6e-4 apart) that the FP16 rounding of its F32
 * weights decides, as the CPU over the same rounded weights does (97.22 %, the same positions);
 * against that CPU the GPU agrees 99.31 % (F32 and MXFP4 files), compute-sanitizer clean
 * (test_gpu_engine test_gptoss_*, gpu-check memcheck). */
#define GPU_GPTOSS_FEATURES (ARCH_F_ATTN_SINKS | ARCH_F_FFN_BIAS | ARCH_F_ACT_SWIGLU_CLAMP | ARCH_F_ROUTER_TOPK_SOFTMAX)

/* The hybrid families' features (kernels/deltanet.cuh, gated attention with partial RoPE, the
 * sigmoid-gated shared expert), in GPU_FEATURES since 2026-11-26: on the H100 the GPU's top-1
 * agreement with the CPU first missed 99 % (qwen3_5 98.96 %, qwen3_5_moe 96.18 %, qwen3_next
 * 97.92 %); not a kernel error (the delta rule kernels ported to C match the CPU's recurrence
 * to 2e-6, tests/cpu/test_deltanet_port.c) but the FP16 input of the DeltaNet's q/k/v and z
 * projections.  attention_linear now reads that input to about 22 bits (act_h plus its FP16
 * remainder act_lo, one more pass over Wqkv and Wgate): 99.31 / 99.65 / 99.31 % on the H100,
 * compute-sanitizer clean (test_gpu_engine test_hybrid_*, gpu-check memcheck).  Partial RoPE
 * and the shared expert serve phi3 and glm4moe too (GPU_FEATURES takes them all). */
#define GPU_HYBRID_FEATURES (ARCH_F_ATTN_LINEAR | ARCH_F_ATTN_OUT_GATE | ARCH_F_ROPE_PARTIAL | ARCH_F_SHARED_EXPERT)

/* NULL with a message when there is no usable GPU or CUDA support was not built. */
engine *engine_create_cuda(const model *m, const engine_config *cfg, char *err, size_t errlen);
/* true when the CUDA backend was built and a GPU answers. */
bool engine_cuda_available(void);
/* GPUs the CUDA driver sees; 0 with the reason in err when there is no driver, no GPU or no
 * CUDA backend in this build (never fails harder than that: tensor parallelism asks it before
 * anything else touches CUDA). */
int engine_cuda_device_count(char *err, size_t errlen);

#endif
