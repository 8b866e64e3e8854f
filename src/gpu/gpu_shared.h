/* gpu_shared.h - plain structs shared by the host code (C) and the kernels (CUDA C++).
 * Only fixed-width fields, laid out identically by both compilers. */
#ifndef INFERD_GPU_SHARED_H
#define INFERD_GPU_SHARED_H

#include <stdbool.h>
#include <stdint.h>

#define GPU_MAX_TOP 20 /* == ENGINE_MAX_TOP_LOGPROBS */

#ifdef __CUDACC__
typedef __half gpu_half;
#define GPU_HOST_DEVICE __host__ __device__
#else
typedef uint16_t gpu_half;
#define GPU_HOST_DEVICE
#endif

/* The K/V caches are a pool of blocks of GPU_KV_BLOCK positions (== ENGINE_KV_BLOCK).  Each
 * layer that computes K/V has its own region of them (gpu_layer.kc / vc), laid out
 * [block][kv_head][GPU_KV_BLOCK][hd] in the layer's own shape (Gemma 4's full and sliding
 * layers differ): the engine passes the region with n_layer 1, layer 0; the formula's layer
 * terms serve the kernel tests' layouts.  Token t belongs to sequence seq[t], whose block
 * table is tables[seq[t] * table_width ...]: position p is row p % GPU_KV_BLOCK of block
 * tables[...][p / GPU_KV_BLOCK] in every layer's region. */
#define GPU_KV_BLOCK 32
static inline GPU_HOST_DEVICE size_t gpu_kv_offset(int32_t block, int n_layer, int layer, int n_kv, int kvh, int row,
                                                   int hd)
{
    return ((((size_t)block * n_layer + layer) * n_kv + kvh) * GPU_KV_BLOCK + row) * hd;
}

/* The batch-1 step's RMSNorm carried by the products on either side of it instead of a launch
 * of its own (kernels/matvec.cuh: NORM_IN, NORM_OUT).  W fp16(rmsnorm(x) w) is
 * rsqrt(mean(x^2) + eps) W fp16(x w): the scalar can wait until a consumer's dot products are
 * done, so no block waits on a reduction before its weights stream.  The product that adds
 * into the residual stream x (O, down: matvec_res_<type>) also writes the next norm's input
 * xw = fp16(x w c) and one sum of squares per block of 8 features into part; the product after
 * the norm (QKV: matvec_rope_norm_<type>, gate/up: glu_norm_<type>) reads xw as its x, sums
 * part in a fixed order (every block the same bits: no atomics) and multiplies its sums by
 * rsqrt(sum / n + eps) / c.  c, a power of two of about 2^-6 / rms from the sum of squares of
 * the norm before (ss[0]; the current sum is not known until the producer's last block is
 * done), keeps x w c inside FP16's range (residual streams carry values in the hundreds and
 * thousands, which x w alone could take past 65,504).  ss: the step's sums of squares, one a
 * norm; a consumer writes its own at ss[1] (the next producer's and consumer's ss[0]). */
enum { NORM_NONE, NORM_IN, NORM_OUT }; /* a product's part in a carried norm */
/* Features per partial sum of squares: the rows of one matvec block (kernels/matvec.cuh
 * MATVEC_WARPS, which asserts it), so NORM_OUT's block b writes part[b]; norm_prep the same */
#define MATVEC_NORM_GROUP 8
#define MATVEC_NORM_PARTS(n) (((n) + MATVEC_NORM_GROUP - 1) / MATVEC_NORM_GROUP)
/* A DeltaNet layer's input product reads its norm to ~22 bits (gpu_forward.c attention_linear:
 * act_lo): where the norm is carried, its producer also writes xw's FP16 remainder, scaled by
 * 2^MATVEC_NORM_LO_SHIFT (exact) so that it stays a normal FP16 number where xw's values are
 * (xw holds x w c, about 2^-6 |x w| / rms: an unscaled remainder of ~2^-17 would be subnormal);
 * the consumer scales its sums back (matvec_lo_nin_*).  11: a remainder is at most half an ulp
 * of xw, so at most 2^4 * 2^11 below FP16's largest xw. */
#define MATVEC_NORM_LO_SHIFT 11
typedef struct matvec_norm {
    const float *w; /* NORM_OUT: the next norm's weight [n] */
    gpu_half *xw;   /* NORM_OUT: written, NORM_IN: read as x */
    gpu_half *xw_lo; /* NORM_OUT: written where set, xw's remainder times 2^MATVEC_NORM_LO_SHIFT */
    float *part;    /* [n_part]: NORM_OUT writes it, NORM_IN sums it (n_part: the producer's) */
    float *ss;      /* [0]: the norm before's sum of squares, [1]: NORM_IN writes its own */
    int n, n_part;  /* the norm's width; partials, MATVEC_NORM_PARTS(n) */
    float eps;
} matvec_norm;

/* qkv_post: per token, per-head RMSNorm of q and k (qwen3), RoPE, and the K/V stores through
 * the token's block table (the packed prefill's scatter).  Grid (tokens, n_head + n_kv), or
 * (tokens, n_head) in a layer that reads another layer's K/V (Gemma 4's shared K/V): queries
 * only. */
typedef struct qkv_post_args {
    float *q, *k;
    const float *v;
    const float *q_norm, *k_norm; /* [hd] or NULL */
    gpu_half *kc, *vc;
    const int32_t *seq, *pos, *tables;
    const float *freq_div; /* [hd/2] or NULL (LongRoPE: the short or long factors, by context) */
    float rope_base, pos_scale, eps;
    int neox, n_head, n_kv, hd, n_layer, layer, table_width;
    int v_norm; /* 1: each head of v RMS-normed without a weight before its store (Gemma 4) */
    /* dimensions of a head that RoPE turns (partial RoPE: the first n_rot; frequencies over
     * n_rot, NeoX pairs (i, i + n_rot/2)); 0: hd */
    int n_rot;
    /* YaRN (the CPU's cpu_rope_apply): pair i's frequency blends base^(-2i/dims) / yarn_factor
     * into itself by ramp(i) = clamp((i - yarn_low) / (yarn_high - yarn_low), 0, 1) when
     * yarn_factor > 0.  mscale: cos and sin times this (0: not scaled; the CPU's attn_factor),
     * which is YaRN's magnitude scale (gpt-oss) and LongRoPE's attention factor (phi3) alike */
    float yarn_factor, yarn_low, yarn_high, mscale;
    int no_rope; /* 1: no rotary embedding at all (bert: absolute positions): rope_* unused */
} qkv_post_args;

/* Multi-head latent attention (kernels/mla.cuh, deepseek2).  mla_post: per token, each head's
 * RoPE part of the query, rope(q_raw[t][h][nope..]) into q[t][h][lat..] (the absorbed query's
 * tail; its latent part is the wk_b product's), and the latent cache row, [rmsnorm(kv[:lat]) *
 * kv_norm | rope(kv[lat:])] in FP16 at the token's position (one KV head of lat + n_rot, no V).
 * rope: the positions, block tables and RoPE parameters as qkv_post takes them (hd = n_rot =
 * the rotated width; eps the norm's). */
typedef struct mla_post_args {
    const float *q_raw; /* [t][n_head][nope + n_rot]: the query projection's heads */
    float *q;           /* [t][n_head][lat + n_rot] */
    const float *kv;    /* [t][lat + n_rot]: wkv_a's output */
    const float *kv_norm;
    gpu_half *kc;
    qkv_post_args rope;
    int n_head, nope, lat;
} mla_post_args;
/* mla_decode_q and mla_decode_value (kernels/mla.cuh): a step of at most GPU_MLA_SMALL_T tokens
 * (decode) forms the absorbed query and the value product in one launch each, for heads of
 * GPU_MLA_NOPE non-RoPE query dims and latents of GPU_MLA_FLASH_V (every DeepSeek V2 / V3 GGUF);
 * GPU_MLA_ABS_THREADS threads a block, GPU_MLA_ABS_ROWS rows of wk_b / GPU_MLA_VAL_ROWS of wv_b
 * each. */
#define GPU_MLA_SMALL_T 64
#define GPU_MLA_NOPE 128
#define GPU_MLA_ABS_THREADS 256
#define GPU_MLA_ABS_ROWS 32
#define GPU_MLA_VAL_ROWS 16
/* The widest latent row (kv_lora_rank + n_rot) the attention kernels take: DeepSeek V2/V3's
 * 512 + 64 (attn_partial_wide: head_dims over 256 up to this, a multiple of 8). */
#define GPU_MLA_MAX_ROW 576
/* The latent rows the flash kernel takes (flash_attn_mla): every deepseek2 GGUF's (V2, V2-Lite,
 * V3, R1, Kimi K2) latent of 512 and RoPE key of 64; V is the latent, the row's first 512. */
#define GPU_MLA_FLASH_ROW 576
#define GPU_MLA_FLASH_V 512

/* Gated DeltaNet (kernels/deltanet.cuh).  One sequence of a step: its first packed token, its
 * token count and its recurrent-state slot. */
typedef struct gpu_ssm_seq {
    int32_t first, n, state;
} gpu_ssm_seq;

#define GPU_SSM_MAX_TAPS 8  /* conv kernel taps */
#define GPU_SSM_MAX_D 256   /* q/k/v head width (state_size) */
#define GPU_SSM_WARPS 8     /* delta_rule: rows of the state split over 8 warps */
#define GPU_SSM_CHUNK 64    /* tokens per chunk of the chunked prefill */
#define GPU_SSM_CONV_SEGS 16 /* ssm_conv: runs of a prompt's tokens side by side (one warp each) */
#define GPU_SSM_COLS 16     /* delta_chunk_state: state columns per block */
#define GPU_SSM_NORM_WARPS 8 /* ssm_qk_norm / ssm_out_norm: heads a block, a warp each */
#define GPU_SSM_STEP_MAX_D 128 /* delta_step (a decode step's delta rule + output norm): the widest head */

/* One linear layer over a step's sequences.  mix [t][chan] holds the q, k and v channels
 * (q heads at 0, k heads at k_heads*d, v heads at 2*k_heads*d); a state slot holds, per linear
 * layer, the conv window [(taps-1) x chan] at conv_off then the delta states [v heads][d][d]
 * (S[i][j]: k index i, v index j) at delta_off, slot_stride floats per slot. */
typedef struct ssm_args {
    const gpu_ssm_seq *seqs;
    float *mix, *state, *out; /* out: [t][v_heads * d], the delta rule's */
    const float *conv_w;      /* [chan][taps] */
    const float *beta, *g;    /* [t][v_heads]: sigmoid(b), log of the decay */
    long long slot_stride, conv_off, delta_off;
    int chan, taps, d, k_heads, v_heads, grouped;
} ssm_args;

/* The gates' inputs and parameters (ssm_gates, ssm_conv_step): b and a the raw projections
 * [t][v_heads] (turned into beta and g in place), or with `fused` one projection raw
 * [t][2 * v_heads] grouped per k head (its v heads' b, then their a: qwen3next) read from raw
 * into b and a. */
typedef struct ssm_gate_args {
    float *b, *a;
    const float *raw, *A, *dt_bias;
    int fused, v_heads, k_heads;
} ssm_gate_args;

/* matvec_<type>_<rows>: for each segment s, y_s[m][n] (+)= sum_k W_s[n][k] x[m][k] (+ bias_s[n])
 * with W_s rounded to FP16 as the cuBLAS path does (so both paths compute the same products).
 * Segments (Q, K and V of one layer) share the input and the weight format and run in one
 * launch.  glu_<type>_<rows>: y[m][n] = fp16(silu(W_0 x) * (W_1 x)) into yh (gate/up). */
#define MATVEC_MAX_SEG 4 /* a DeltaNet layer's one-token q/k/v, z, beta and alpha */
#define MATVEC_LO_ROWS 2 /* matvec_args.x_lo: weight rows a warp */
/* matvec_one_<type> (kernels/matvec.cuh matvec_one_body): warps (rows) a block */
#define MATVEC_ONE_WARPS 4
/* matvec_wide<KS>_<type> (kernels/matvec.cuh matvec_wide_body): warps and rows a block */
#define MATVEC_WIDE_WARPS 4
#define MATVEC_WIDE_ROWS 4
/* Q6_K super-blocks are 210 bytes in GGUF, which leaves most of them only 2-byte aligned; on
 * the GPU each is stored in a 224-byte slot (same bytes, zero tail) so every load is 16 bytes. */
#define GPU_Q6K_BLOCK 224
typedef struct matvec_seg {
    const uint8_t *w; /* n rows of row_bytes */
    float *y;         /* [m][ldy] */
    const float *bias; /* [n] or NULL */
    int n, ldy;
} matvec_seg;

#define GPU_AR_MAX_RANKS 8 /* == TP_MAX_GPUS (gpu_ar_args below) */
/* matvec_<type>_1 under tensor parallelism, one token, one segment (gpu_forward.c
 * residual_add_split): each row's sum, besides y, pushed as the LL word {sum, epoch} into every
 * other rank's LL lines of this rank (gpu_ar_args' layout), at the epoch and parity the tp_add
 * launch after it takes (its LL counter + 1).  That launch then pushes nothing and only waits
 * (gpu_ar_args.pushed): the words cross NVLink while the product's last blocks run, not after
 * the sum's launch has started and read the partials back.  epoch NULL: no push. */
typedef struct matvec_ll_push {
    float *xbuf[GPU_AR_MAX_RANKS];   /* rank s's exchange buffer (gpu_ar_args.xbuf) */
    const uint32_t *epoch;           /* this rank's first LL counter (gpu_ar_args.epoch + GPU_AR_BLOCKS) */
    unsigned long long cap, ll_cap;  /* gpu_ar_args' */
    int rank, n_ranks;
} matvec_ll_push;

typedef struct matvec_args {
    matvec_seg seg[MATVEC_MAX_SEG];
    int n_seg;
    int k, m, ldx;      /* inputs per row (multiple of 32), activation rows, x row stride */
    int accumulate;     /* 1: y += W x (residual) */
    unsigned long long row_bytes;
    const gpu_half *x;  /* [m][ldx] */
    gpu_half *yh;       /* glu output [m][ldy of seg 0] */
    /* mmq only, with a k split (grid z > 1): partial sums [split][m][part_ld], one row per
     * feature with each segment's features padded to 16 (glu: gate's, then up's) */
    float *part;
    int part_ld;
    int split_chunks;   /* 32-input chunks per split: a multiple of MMQ_KT / 32 */
    /* mmq only, the grouped launch of a MoE layer (kernels/moe.cuh): grid y walks tiles
     * [3] = (expert, first row, end row) instead of blocks of rows (expert -1: nothing to
     * do), each segment's weights offset by expert * expert_bytes; activation row m is read
     * from row x_rows[m] / x_div of x when x_rows is set (a token's k entries share its row). */
    const int32_t *tiles;
    const int32_t *x_rows;
    int x_div;
    unsigned long long expert_bytes;
    /* the dp4a kernels only (kernels/matvec_q8.cuh, one activation row): x quantised per 32
     * inputs, xq[k] int8 and xd[k / 32] (scale, sum) pairs */
    const int8_t *xq;
    const float *xd;
    /* glu: the activation (glu_gelu: GeGLU, gelu_tanh(gate) * up (Gemma); glu_limit > 0: the
     * clamped SwiGLU with glu_alpha; else SiLU), and the gate and up biases (segments 0 and 1's
     * bias, before the activation), per expert when bias_ids is set: row m's are bias +
     * bias_ids[x_rows ? x_rows[m] : m] * bias_stride */
    float glu_limit, glu_alpha;
    int glu_gelu;
    const int32_t *bias_ids;
    long long bias_stride;
    matvec_norm norm; /* matvec_rope_norm_*, glu_norm_*, matvec_res_*, matvec_nin_*, matvec_lo_nin_* only */
    /* matvec_res_* only: y += sigmoid(res_gate[0]) * W x (NULL: y += W x), as shexp_add adds a
     * sigmoid-gated shared expert (qwen35moe, qwen3next; the logit moe_router_norm's) */
    const float *res_gate;
    /* matvec_<type>_2 only, m == 1, no accumulate: a second FP16 input row (act_lo, x's
     * rounding remainder) read as activation row 1, whose sums the epilogue adds to row 0's in
     * segments below lo_segs: y = W x + W x_lo in one pass over W, the same bits as the two
     * products one after the other (y = W x, then y += W x_lo); the other segments' y = W x.
     * mmq_narrow_lo_<type>: the m rows of x_lo (ldx apart) beside x's, the same meaning */
    const gpu_half *x_lo;
    int lo_segs;
    /* (the launch then takes MATVEC_LO_ROWS weight rows a warp: matvec.cuh matvec_lo_body) */
    matvec_ll_push push; /* matvec_<type>_1 only (one row, one segment): above */
    /* the first grid row (blockIdx.y) of these args: 0, but for the second format of a pair
     * launch (matvec_pair_args below), whose blocks follow the first's */
    int block0;
} matvec_args;

/* matvec_rope_<type>: the QKV product of one token (m == 1) with qkv_post in its epilogue, for
 * models with no q/k norm (the batch-1 step: one launch a layer fewer).  Segment s of mv is
 * role0 + s (MATVEC_Q, _K, _V: the launch's segments are consecutive outputs of Q, K, V), each
 * a whole number of heads.  A block's 8 warps take the 4 RoPE pairs of one head (NeoX:
 * features i..i+3 and their partners i + hd/2), rotate them as qkv_post does and write Q to
 * its y, K and V as FP16 into the cache (post's fields; its q/k/v pointers are unused). */
enum { MATVEC_Q = 1, MATVEC_K, MATVEC_V };
typedef struct matvec_rope_args {
    matvec_args mv;
    qkv_post_args post;
    int role0;
} matvec_rope_args;

/* A batch-1 QKV product over two weight formats in one launch (gpu_kernel_names.h
 * GPU_MATVEC_PAIR_KERNELS: the Q4_K_M / Q5_K_M files' layers whose V rows are Q6_K): grid rows
 * below b's block0 run a's outputs in the first format, the rest b's in the second. */
typedef struct matvec_pair_args {
    matvec_args a, b;
} matvec_pair_args;
typedef struct matvec_rope_pair_args {
    matvec_rope_args a, b;
} matvec_rope_pair_args;

/* moe_route: each of n tokens' k experts and their weights from its router logits [n][n_expert].
 * Scores: softmax over the logits, or (sigmoid) each logit's sigmoid, or (topk_first: gpt-oss's
 * ARCH_ROUTER_TOPK_SOFTMAX) the logits themselves; the k best of score + bias[x] (bias NULL:
 * none; it only chooses: GLM-4.5's exp_probs_b), ties to the lower id; the weights are the
 * chosen scores (topk_first: exp(logit - the max logit), so that with norm they are the softmax
 * over the chosen), renormalised to sum 1 (norm) and times scale, then times expert_scale[id]
 * (Gemma 4; NULL: none).  The CPU's cpu_moe_route / _scored / _topk_softmax. */
typedef struct moe_route_args {
    const float *logits, *bias, *expert_scale;
    int n_expert, k, sigmoid, topk_first, norm;
    int n_group, topk_group; /* expert groups (DeepSeek; n_group <= 1: none), the best kept */
    float scale;
    int32_t *ids;
    float *weights;
} moe_route_args;
/* moe_glu_<type> / moe_matvec_<type> / moe_down_<type> (kernels/moe.cuh): one block row per
 * entry e (a token's j-th choice), over expert ids[e]'s slice of the 3-D weights (w0: gate or
 * down, w1: up): glu: yh[e][n] = fp16(act(W0 x + b0, W1 x + b1)), matvec: y[e][n] = W0 x,
 * x = row e / x_div.  moe_glu routes first: every block takes its token's choice from
 * route (moe_route's bits, its logits row e / route.k) and blocks of grid y 0 write ids and
 * weights (route.ids, route.weights) for the launches after it.  moe_down: grid (rows / R, tokens), the
 * down product of every choice of the token and their weighted sum (moe_combine's) in one:
 * y[t][n] (+)= sum_j weights[t k + j] * (W0_{ids[t k + j]} x[t k + j] + b0[ids][n]) (b0 the
 * experts' down biases, NULL: none; accumulate: added), k = route.k. */
typedef struct moe_mv_args {
    const uint8_t *w0, *w1;
    unsigned long long expert_bytes, row_bytes;
    const int32_t *ids;
    const gpu_half *x;
    int x_div, ldx, k, n, ldy;
    gpu_half *yh;
    float *y;
    /* glu: the activation as matvec_args says, and the experts' gate and up biases [expert][n]
     * (b0, b1; NULL: none), added before it */
    float glu_limit, glu_alpha;
    const float *b0, *b1;
    moe_route_args route; /* moe_glu: what to route; moe_down: route.k and route.weights */
    int accumulate;       /* moe_down */
    matvec_norm norm;     /* moe_glu_norm_* (NORM_IN), moe_down_res_* (NORM_OUT) only */
    /* moe_glu_norm_* only, where sh0 is set: a shared expert's gate and up (sh0, sh1: sh_n rows
     * of the experts' format, k and row_bytes) in the grid's last column x, unrouted, its
     * fp16(silu(gate) * up) into sh_yh [sh_n]: the batch-1 step's shared GLU without a launch of
     * its own (gpu_forward.c shexp_in_experts) */
    const uint8_t *sh0, *sh1;
    gpu_half *sh_yh;
    int sh_n;
} moe_mv_args;
/* moe_glu's dynamic shared memory for n_expert experts, k chosen: the scores and choice
 * values, the expert groups' scores (n_group; DeepSeek V3), then the chosen ids and weights */
#define GPU_MOE_GLU_SMEM(n_expert, k, n_group) ((unsigned)(2 * (n_expert) + (n_group) + 2 * (k)) * 4u)
/* moe_down: the rows of a block (a warp a row, every choice of it); no shared memory.  Its
 * partial sums of squares (moe_down_res) are then matvec_res's, one per MATVEC_NORM_GROUP rows */
#define GPU_MOE_DOWN_ROWS 8
/* moe_sort groups at most this many entries (tokens x k) in one launch; the forward pass
 * takes a longer step's MoE layers in chunks of tokens.  Its shared memory holds the ids and
 * the experts' offsets: (entries + experts) * 4 bytes, at most 48 KiB. */
#define GPU_MOE_MAX_ENTRIES 8192
#define GPU_MOE_ROUTER_TOKENS 8 /* moe_router's tokens per block (kernels/moe.cuh) */
#define GPU_MOE_MAX_EXPERTS 2048

/* mmq: inputs per pipeline stage (one super-block of every weight row), and the stages in
 * flight of variant v (16 << v activation rows per block) for a format of rb bytes per stage
 * row: 64-row blocks keep two, so that two blocks (16 warps) fit a multiprocessor -- measured
 * 7-10 % faster on prompts than one block of 128 rows and three stages; BF16 (512 bytes a
 * stage row, the only format over 320) keeps two everywhere, as three 32-row stages would
 * pass the 227 KiB of shared memory a block may have.  16- and 32-row blocks keep three only
 * where three still let two blocks share a multiprocessor (the H100's 228 KiB, 1 KiB reserved
 * a block; at the stride of rows whose stages start 16-byte aligned): Q8_0's 272-byte stage
 * rows at three stages of 32 rows took 157 KiB, one block a multiprocessor, as did Q5_K, Q6_K,
 * Q4_1, Q5_0, Q5_1, MXFP4 and IQ4_XS's (docs/benchmarks.md "The dense Q8_0 products' waves").
 * MMQ_SMEM: a block's bytes at d stages of variant v and w bytes a staged weight row (128
 * weight rows, the activation rows of MMQ_KT + 32 halves, then 128 row pointers). */
#define MMQ_KT 256
#define MMQ_SM_SMEM (228 * 1024)
#define MMQ_SMEM(d, v, w) ((d) * (128 * (w) + (16 << (v)) * (MMQ_KT + 32) * 2) + 128 * 8)
#define MMQ_DEPTH(v, rb) \
    ((v) >= 2 || (rb) > 320 || 2 * (MMQ_SMEM(3, v, MMQ_WSTRIDE(rb, 0)) + 1024) > MMQ_SM_SMEM ? 2 : 3)
/* Bytes a weight row takes in an mmq (or mmq_narrow) stage buffer, for a format of rb bytes
 * per stage row and rows of row_bytes: rb where every row's stage starts on a 16-byte boundary
 * (rb and row_bytes multiples of 16), else room for the 16-byte chunks that cover rb bytes from
 * the aligned address at or below the stage's start (at most (rb + 15) / 16 + 1 of them:
 * Q3_K's 110 bytes take 128, Q8_0's 272 at k 1,408 take 288; mmq.cuh: mmq_stage_weights). */
#define MMQ_WSTRIDE_SHIFTED(rb) (((rb) + 30) / 16 * 16)
#define MMQ_WSTRIDE(rb, row_bytes) ((rb) % 16 == 0 && (row_bytes) % 16 == 0 ? (rb) : MMQ_WSTRIDE_SHIFTED(rb))

/* mmq_narrow (kernels/mmq_narrow.cuh, products of 1..MMQN_MAX_M rows: --deterministic's from
 * one, the default engine's from two): the stages each warp keeps in flight for a format of rb
 * bytes per stage row, its most warps per block, and the longest rows it takes (the partial
 * sums of every split of a block's tiles stay in its shared memory: at most 2 * k / MMQ_KT *
 * 512 bytes). */
#define MMQN_MAX_M 8
#define MMQN_DEPTH(rb) ((rb) > 320 ? 2 : 3)
#define MMQN_WARPS 8
#define MMQN_MAX_K 16384

#define GPU_ATT_GB_HD512 4 /* attn_partial_hd512's most query heads per block */
typedef struct attn_args {
    const float *q; /* [t][n_head][hd] */
    const gpu_half *kc, *vc;
    const int32_t *seq, *pos, *tables; /* as in qkv_post_args */
    int n_layer, layer, n_head, n_kv, table_width, hd;
    int gb;      /* query heads per block (a divisor of n_head/n_kv, at most 8; at head_dim 512
                    at most GPU_ATT_GB_HD512) */
    int n_split; /* grid z: key ranges per query (split-K), enough for the longest */
    int window;  /* the layer's sliding window, 0: full (gpu_attn_first_key) */
    float scale; /* 1/sqrt(hd), or of query_pre_attn_scalar */
    float *part_o;  /* [t][n_head][n_split][hd] */
    float *part_ml; /* [t][n_head][n_split][2] */
    /* grid x index -> packed token, or NULL: token = grid x index (the decode graphs) */
    const int32_t *tok_list;
    /* attn_decode (kernels/attn_decode.cuh) only: its key splits (attn_split_chunk) and the
     * FP16 output, [t][n_head][hd], written by attn_decode_combine or, for a token of one
     * split, by attn_decode itself.  Its partials are indexed by grid x, not by t. */
    int max_split;
    /* attn_decode (head_dim 64-256) only: nonzero when every token's keys before its own
     * position were written by earlier steps (one decode token per sequence, causal), so that
     * only its own key's tile depends on the grid ahead (the QKV product or qkv_post, which
     * writes it and the query): the kernel then streams its first K/V tiles before waiting for
     * that grid (kernels/common.cuh: pdl_wait), and gpu_launch_decode launches it with PDL
     * even inside a decode graph.  0: it waits first, as every kernel does. */
    int old_kv;
    /* head_dim 256 only: the split count every token of the grid takes when all see long
     * contexts, fewer than max_split when the batch alone fills the GPU
     * (gpu_attn_dec_batch_split; = max_split under --deterministic); a token's own count is
     * gpu_attn_dec_token_split.  And [grid x][n_kv] arrival counters of the splits, zero between
     * launches: the last split of a (token, KV head) to finish merges them (and sets its counter
     * back to 0); NULL: the partials are left for attn_decode_combine, as always below 256. */
    int batch_split;
    unsigned *counts;
    gpu_half *out;
    /* each query head's sink logit [n_head] (ARCH_ATTN_SINKS), or NULL: the kernels that write
     * a head's output add exp(sink - max) to its softmax's denominator */
    const float *sinks;
} attn_args;

/* flash_attn_hd<64|128|256|512> and flash_attn_mla (hd GPU_MLA_FLASH_ROW: latent rows, one KV
 * head whose rows are K and, their first GPU_MLA_FLASH_V columns, V; the output's other columns
 * are not written) (kernels/flash_attn.cuh): prompt tokens on the tensor cores.
 * A tile is up to gpu_flash_q_tokens() consecutive packed tokens of one sequence with
 * consecutive positions, at most GPU_FA_TILE_ROWS(hd) (token, query head) rows; grid (tiles,
 * n_kv, GPU_FA_TILE_ROWS(hd) / GPU_FA_BLOCK_ROWS(hd)), GPU_FA_THREADS(hd) threads,
 * gpu_flash_smem(hd) bytes of dynamic shared memory.  scale = log2(e) / sqrt(hd): the softmax
 * runs in base 2. */
#define GPU_FA_ROWS 64 /* (token, query head) rows per block, and per tile below head_dim 512 */
/* Head_dim 512: a lane's FP32 O accumulator for 16 rows x 512 dims would alone be 256
 * registers, so two warps share each 16 rows, each accumulating half the output dims, and a
 * block takes 32 of the tile's rows (blockIdx.z), which keeps its shared memory under the
 * 227 KiB limit.  A tile may have up to 8 such blocks (a block past the tile's rows exits at
 * once), so that the tiles the packer cuts for a model's other layers (Gemma 4's sliding
 * ones: 32 tokens of 2 heads) need not shrink to 64 rows of the 512 layers' 8 heads. */
/* The latent rows have no V tile (V is the K tile's first 512 columns), which leaves room for
 * 64 rows' Q fragments (8 warps): each K tile serves 4 tokens of 16 heads, not 2. */
#define GPU_FA_BLOCK_ROWS(hd) ((hd) > 256 && (hd) != GPU_MLA_FLASH_ROW ? 32 : GPU_FA_ROWS)
#define GPU_FA_TILE_ROWS(hd) ((hd) > 256 ? 8 * 32 : GPU_FA_ROWS)
#define GPU_FA_DSPLIT(hd) ((hd) > 256 ? 2 : 1)
#define GPU_FA_THREADS(hd) (GPU_FA_BLOCK_ROWS(hd) / 16 * GPU_FA_DSPLIT(hd) * 32)
/* The shared memory: K and V tiles of GPU_KV_BLOCK keys, double-buffered, rows padded by 8
 * halves; at head_dim >= 256 also the Q fragments of the block's rows (FP16 hi + lo: 64 KiB),
 * since a lane's FP32 O accumulator (16 rows x 256 dims a warp) alone takes 128 registers and
 * Q as many again.  (133,120 bytes at 256, 198,656 at 512: one block a multiprocessor; over
 * 48 KiB needs the opt-in attribute, gpu_kernels.c.) */
#define GPU_FA_Q_SMEM(hd) ((hd) >= 256 ? GPU_FA_BLOCK_ROWS(hd) / 16 * ((hd) / 16) * 2 * 32 * 16 : 0)
/* K and V tiles, double-buffered; the latent rows' K tiles alone (222,208 bytes at 64 rows) */
#define GPU_FA_KV_TILES(hd) ((hd) == GPU_MLA_FLASH_ROW ? 2 : 4)
#define gpu_flash_smem(hd) ((unsigned)(GPU_FA_KV_TILES(hd) * GPU_KV_BLOCK * ((hd) + 8) * 2 + GPU_FA_Q_SMEM(hd)))
typedef struct flash_args {
    const float *q; /* [t][n_head][hd] */
    const gpu_half *kc, *vc;
    const int32_t *seq, *pos, *tables; /* as in qkv_post_args */
    const int32_t *tiles;              /* [tile][2]: first packed token, tokens */
    gpu_half *out;                     /* [t][n_head][hd] */
    int n_layer, layer, n_head, n_kv, table_width;
    int window; /* the layer's sliding window, 0: full (gpu_attn_first_key) */
    float scale;
    const float *sinks; /* [n_head] sink logits (natural base), or NULL: as attn_args */
} flash_args;

/* The keys a query at position pos sees: first..pos, first = 0 or, in a layer with a sliding
 * window, pos - window + 1.  The kernels walk them from gpu_attn_key0, first rounded down to
 * a KV block (a tile of 32 keys stays in one block), and mask the keys before first; the
 * blocks before key0 are never read.  So a sliding layer's decode reads its window and at
 * most one block more, whatever the context. */
static inline GPU_HOST_DEVICE int gpu_attn_first_key(int pos, int window)
{
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}
static inline GPU_HOST_DEVICE int gpu_attn_key0(int pos, int window)
{
    return gpu_attn_first_key(pos, window) / GPU_KV_BLOCK * GPU_KV_BLOCK;
}
/* The keys walked for a query at pos (from key0): what the key splits are cut from. */
static inline GPU_HOST_DEVICE int gpu_attn_span(int pos, int window) { return pos + 1 - gpu_attn_key0(pos, window); }

/* Tokens per flash tile for this shape (all query heads of a KV group in one block), or 0
 * when the flash kernel does not apply (another head size, a group over GPU_FA_TILE_ROWS heads):
 * then every token takes attn_partial. */
static inline GPU_HOST_DEVICE int gpu_flash_q_tokens(int n_head, int n_kv, int hd)
{
    if ((hd != 64 && hd != 128 && hd != 256 && hd != 512 && hd != GPU_MLA_FLASH_ROW) || n_kv <= 0 || n_head % n_kv)
        return 0;
    return GPU_FA_TILE_ROWS(hd) / (n_head / n_kv);
}

/* Keys per split for a query that sees n_keys keys, at most max_split splits: a function of
 * n_keys alone for a given engine (max_split is fixed per kernel), so a token's attention is
 * computed the same way whatever it is batched with.  A multiple of GPU_KV_BLOCK, so each
 * warp's tile of 32 keys lies in one block. */
#define ATT_CHUNK_MIN 128
#define ATT_MAX_SPLIT 32     /* attn_partial's splits */
#define GPU_ATT_DEC_SPLIT 64 /* attn_decode's most (head_dim 256; up to 128 at most GPU_ATT_DEC_SPLIT_NARROW) */
#define GPU_ATT_DEC_SPLIT_NARROW 32 /* of 16/32/64/128 the best over both head_dim-128 shapes (docs/benchmarks.md) */
#define GPU_ATT_DEC_COMBINE_SG 4 /* attn_decode_combine's threads: this many x hd */
static inline GPU_HOST_DEVICE int attn_split_chunk(int n_keys, int max_split)
{
    int c = (n_keys + max_split - 1) / max_split;
    c = (c + GPU_KV_BLOCK - 1) / GPU_KV_BLOCK * GPU_KV_BLOCK;
    return c < ATT_CHUNK_MIN ? ATT_CHUNK_MIN : c;
}
static inline GPU_HOST_DEVICE int attn_chunk(int n_keys) { return attn_split_chunk(n_keys, ATT_MAX_SPLIT); }

/* Key splits (attention grid depth) that a query seeing n_keys keys uses. */
static inline GPU_HOST_DEVICE int gpu_attn_splits_for(int n_keys, int max_split)
{
    int c = attn_split_chunk(n_keys, max_split);
    return (n_keys + c - 1) / c;
}
static inline GPU_HOST_DEVICE int gpu_attn_splits(int n_keys) { return gpu_attn_splits_for(n_keys, ATT_MAX_SPLIT); }

/* attn_split_chunk rounds to whole KV blocks, so the splits of a key count are not monotone
 * in it (8,192 keys take 32 of 32 splits, 8,320 only 29): a grid sized from the longest span
 * alone can miss a shorter span's last splits.  Every count up to ctx needs at most
 * min(max_split, ceil(ctx / ATT_CHUNK_MIN)), since a chunk is never under ATT_CHUNK_MIN keys
 * nor under 1/max_split of its span: the partial buffers and the decode graphs are sized by it. */
static inline GPU_HOST_DEVICE int gpu_attn_max_splits_for(int ctx, int max_split)
{
    int s = (ctx + ATT_CHUNK_MIN - 1) / ATT_CHUNK_MIN;
    return s < max_split ? s : max_split;
}
static inline GPU_HOST_DEVICE int gpu_attn_max_splits(int ctx) { return gpu_attn_max_splits_for(ctx, ATT_MAX_SPLIT); }

/* attn_decode's splits for an engine (its max_split), from the device's SM count (gpu_engine.c
 * asks once): as many as one token's blocks (n_kv x splits, one a multiprocessor: 128-144 KiB of
 * shared memory each) fill one wave of the n_sm multiprocessors.  Head_dim 256 (the fused merge):
 * n_sm / n_kv, at most GPU_ATT_DEC_SPLIT (16 for Gemma 3's 8 KV heads on the H100's 132, 33 for
 * Qwen3.5's 4).  Up to 128 (attn_decode_combine): the largest power of two up to
 * GPU_ATT_DEC_SPLIT_NARROW that fits (16 for 8 KV heads, 32 for 2; 64 for 2, which would fill
 * 128 SMs, measured slower on the 1.5B shape than 32: the merge then reads twice the partials).
 * A constant of the engine, so a token's result still depends on its own keys only. */
static inline GPU_HOST_DEVICE int gpu_attn_dec_split_for(int n_sm, int n_kv, int hd)
{
    if (hd < 256) {
        int s = GPU_ATT_DEC_SPLIT_NARROW;
        while (s > 1 && s * n_kv > n_sm) s /= 2;
        return s;
    }
    int s = n_kv > 0 ? n_sm / n_kv : 1;
    return s < 1 ? 1 : s > GPU_ATT_DEC_SPLIT ? GPU_ATT_DEC_SPLIT : s;
}

/* Head_dim 256: the splits of a grid of B decode tokens when the batch fills the GPU by itself:
 * n_kv x B x splits ~ one wave (8 tokens of 8 KV heads: 2).  Under --deterministic (det)
 * max_split itself, so that a token's splits never depend on its batch (docs/determinism.md).
 * (Up to head_dim 128 the kernel takes max_split whatever this says.) */
static inline GPU_HOST_DEVICE int gpu_attn_dec_batch_split(int n_sm, int n_kv, int B, int max_split, bool det)
{
    if (det || B <= 1) return max_split;
    int s = n_kv > 0 ? n_sm / (n_kv * B) : 1;
    return s < 1 ? 1 : s > max_split ? max_split : s;
}

/* A token's most splits: the batch's count, but never chunks of more than
 * GPU_ATT_DEC_CHUNK_MAX keys while max_split allows (a long context beside short ones keeps
 * its splits: 32k keys take 16 whatever the batch).  batch_split == max_split gives max_split,
 * so a B=1 grid, or any grid under --deterministic, splits by the token's own keys only.  Never
 * more than max_split, so the partial buffers and grids sized by max_split hold every token
 * (gpu_attn_splits_for grows with its max_split). */
#define GPU_ATT_DEC_CHUNK_MAX 2048
static inline GPU_HOST_DEVICE int gpu_attn_dec_token_split(int span, int max_split, int batch_split)
{
    int s = (span + GPU_ATT_DEC_CHUNK_MAX - 1) / GPU_ATT_DEC_CHUNK_MAX;
    if (s < batch_split) s = batch_split;
    return s > max_split ? max_split : s;
}

/* attn_decode's block: warps, each streaming its KV blocks through a ring of
 * gpu_attn_dec_stages [32 keys][hd] K + V tiles in dynamic shared memory (gpu_attn_decode_smem
 * bytes): 4 warps of 2 tiles up to head_dim 128 (128 KiB); 4 of one at 256 (128 KiB, and 16 KiB
 * more for the query fragments, which do not fit in registers beside the 256-wide O; of 2x2,
 * 3x2 and 4x1 the best on the H100, docs/benchmarks.md). */
#define GPU_ATT_DEC_WARPS 4
#define GPU_ATT_DEC_STAGES 2
#define gpu_attn_dec_warps(hd) GPU_ATT_DEC_WARPS
#define gpu_attn_dec_stages(hd) ((hd) >= 256 ? 1 : GPU_ATT_DEC_STAGES)
#define GPU_ATT_DEC_Q_SMEM(hd) ((hd) >= 256 ? (hd) / 16 * 2 * 32 * 16 : 0)
#define gpu_attn_decode_smem(hd)                                                                             \
    ((unsigned)(gpu_attn_dec_warps(hd) * gpu_attn_dec_stages(hd) * 2 * GPU_KV_BLOCK * (hd) * 2 +             \
                GPU_ATT_DEC_Q_SMEM(hd)))

/* Whether decode tokens take attn_decode (tensor cores; kernels/attn_decode.cuh): head_dim 64,
 * 128 or 256 and at most 16 query heads per KV head (one mma M tile); or deepseek2's latent rows
 * of 512 + 64 (attn_decode_mla, kernels/attn_mla.cuh: one KV head, any number of query heads in
 * groups of GPU_ATT_MLA_HEADS).  Otherwise attn_partial. */
static inline GPU_HOST_DEVICE bool gpu_attn_decode_serves(int n_head, int n_kv, int hd)
{
    if (hd == GPU_MLA_FLASH_ROW) return n_kv == 1 && n_head > 0;
    return (hd == 64 || hd == 128 || hd == 256) && n_kv > 0 && n_head % n_kv == 0 && n_head / n_kv <= 16;
}

/* attn_decode_mla (kernels/attn_mla.cuh): a block takes one token, GPU_ATT_MLA_HEADS query heads
 * (one mma M tile; a short last group is padded with zero rows) and one key split.  Its
 * GPU_ATT_MLA_WARPS warps share every latent tile: warp w forms S over a quarter of the 576
 * dims, the partial S are summed through shared memory, and warp w accumulates O for dims
 * 128 w .. 128 w + 127 of the 512.  Dynamic shared memory: two [32][576] tiles, the warps'
 * partial S and the query's fragments (FP16 hi + lo).  The head groups take the place of
 * attn_decode's KV heads (grid y, the arrival counters). */
#define GPU_ATT_MLA_HEADS 16
#define GPU_ATT_MLA_WARPS 4
#define gpu_attn_mla_groups(n_head) (((n_head) + GPU_ATT_MLA_HEADS - 1) / GPU_ATT_MLA_HEADS)
#define gpu_attn_decode_mla_smem()                                                                 \
    ((unsigned)(2 * GPU_KV_BLOCK * GPU_MLA_FLASH_ROW * 2 + GPU_ATT_MLA_WARPS * 32 * 16 * 4 +           \
                GPU_MLA_FLASH_ROW / 16 * 2 * 32 * 16))
/* The blocks per token attn_decode's heuristics count (gpu_attn_dec_split_for, _batch_split): a
 * layer's KV heads, or its latent rows' head groups. */
static inline GPU_HOST_DEVICE int gpu_attn_dec_units(int n_head, int n_kv, int hd)
{
    return hd == GPU_MLA_FLASH_ROW ? gpu_attn_mla_groups(n_head) : n_kv;
}

/* One logits row of a step: which packed token it comes from and how to sample it. */
typedef struct gpu_sample_row {
    int32_t token_index; /* row of the packed activations */
    int32_t slot;
    int32_t hist_end; /* tokens of the slot's history so far (position of the last one + 1) */
    int32_t want;     /* 1: sample a token; 0: logits only / padding */
    float temperature, top_p, min_p;
    int32_t top_k;
    float repeat_penalty, presence_penalty, frequency_penalty;
    int32_t penalty_last_n; /* -1: whole history */
    int32_t n_top;          /* < 0: no logprobs */
    int32_t bias_off, n_bias;
    int32_t mask_row; /* < 0: unconstrained; else the row of sample_args.mask to apply */
    uint64_t seed;
} gpu_sample_row;

typedef struct gpu_bias {
    int32_t id;
    float val;
} gpu_bias;

typedef struct gpu_sample_out {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[GPU_MAX_TOP];
    float top_logprobs[GPU_MAX_TOP];
} gpu_sample_out;


/* The tensor-parallel residual add (kernels/allreduce.cuh tp_add): x += the ranks' partial
 * products summed in rank order, and, for one row where the batch-1 step carries its norms,
 * the next norm's input and partials as a NORM_OUT product writes them (norm.xw non-NULL).
 * n_ranks 1: part already holds the sum (NCCL's all-reduce ran before).  n_ranks > 1: a
 * one-shot all-reduce over NVLink peer memory: every block pushes its slice of part into each
 * peer's exchange buffer, slot [parity][rank] of cap floats, then signals that peer's flag
 * [block][rank] with its epoch (release, system scope) and waits for the peers' flags in its
 * own; two parities, so that a push of epoch e + 2 cannot meet a peer still reading epoch e
 * (it would have had to pass epoch e + 1's signals, which the peer gives only after e).  The
 * grid is always GPU_AR_BLOCKS blocks (each block's epoch counter advances once a launch, the
 * same on every rank).  ll (count <= ll_cap): LL lines instead of slots and flags -- each float
 * pushed as an 8-byte word beside the launch's epoch into the peer's lines [parity][rank]
 * (after the slots in its exchange buffer), and read back once its words carry the epoch: no
 * flag, no fence, twice the bytes.  An LL launch's grid is always GPU_AR_LL_BLOCKS blocks of
 * GPU_AR_LL_THREADS, with counters of its own (epoch[GPU_AR_BLOCKS + block]); the parity
 * argument above holds for it as for the flags (a peer's push of epoch e + 1 comes from a
 * launch that starts only after its launch of epoch e ended). */
#define GPU_AR_BLOCKS 64
#define GPU_AR_THREADS 512
#define GPU_AR_LL_BLOCKS 32
#define GPU_AR_LL_THREADS 256
/* a rank's flags: a row of GPU_AR_MAX_RANKS a block, then tp_gather's row; its launch counters:
 * a block's, an LL block's, then tp_gather's */
#define GPU_AR_FLAG_WORDS ((GPU_AR_BLOCKS + 1) * GPU_AR_MAX_RANKS)
#define GPU_AR_EPOCH_WORDS (GPU_AR_BLOCKS + GPU_AR_LL_BLOCKS + 1)
/* floats of a rank's exchange buffer: the slots, then the LL lines (two floats' room a float) */
#define GPU_AR_XBUF_FLOATS(n_ranks, cap, ll_cap) (2 * (size_t)(n_ranks) * ((cap) + 2 * (size_t)(ll_cap)))
typedef struct gpu_ar_args {
    float *x;                              /* [count]: += the sum */
    const float *part;                     /* this rank's partial products [count] */
    float *xbuf[GPU_AR_MAX_RANKS];         /* rank s's exchange buffer (GPU_AR_XBUF_FLOATS; peer pointers) */
    uint32_t *flags[GPU_AR_MAX_RANKS];     /* rank s's flags [GPU_AR_FLAG_WORDS] */
    uint32_t *epoch;                       /* this rank's [GPU_AR_EPOCH_WORDS] launch counters */
    unsigned long long cap;                /* floats a slot */
    unsigned long long ll_cap;             /* floats a rank's LL lines hold (a multiple of 4) */
    int count, rank, n_ranks;              /* count: floats, a multiple of 8 */
    int ll;                                /* 1: this launch takes the LL lines (count <= ll_cap) */
    int ll_max;                            /* the host's: the most floats a sum takes the LL lines for */
    int pushed;                            /* ll: the product before pushed this rank's words (matvec_ll_push) */
    matvec_norm norm;                      /* one row: the next carried norm (xw NULL: none) */
} gpu_ar_args;

typedef struct sample_args {
    const float *logits; /* [rows][n_vocab] raw */
    float *work;         /* [rows][n_vocab] processed logits (scratch) */
    int32_t *counts;     /* [rows][n_vocab] zero on entry and on exit (penalty counting) */
    const gpu_sample_row *rows;
    const gpu_bias *bias; /* rows' logit_bias entries, at rows[i].bias_off */
    const int32_t *hist; /* [slot][ctx] */
    const uint32_t *mask; /* [mask rows][mask_words]: allowed-token bits (engine_seq.allowed) */
    int mask_words;
    int ctx, n_vocab;
    float *parts; /* [rows][n_parts][3]: per-slice best value, its id (bits), sum of exp */
    int n_parts;
    gpu_sample_out *out;
} sample_args;

#endif
