/* gpu_internal.h - state of the CUDA engine, shared by its two halves: gpu_engine.c (life
 * cycle, weights, the KV block pool, step planning, decode graphs) and gpu_forward.c (the forward
 * pass as a sequence of kernel launches over one packed token batch). */
#ifndef INFERD_GPU_INTERNAL_H
#define INFERD_GPU_INTERNAL_H

#include "engine/engine_impl.h"
#include "cuda_api.h"
#include "gpu_kernels.h"
#include "gpu_shared.h"

/* Decode steps of up to this many sequences replay a CUDA graph captured for the next power
 * of two. */
#define GPU_MAX_DECODE_BATCH 64
/* Matmuls over one row use the matvec kernels; over more, block-quantised and BF16 weights go
 * to the tensor-core mmq kernels (at 2-4 rows already faster than matvec's FP32 dot products),
 * F16 and F32 weights to matvec up to GPU_MATVEC_MAX_M rows and to cuBLAS beyond (F16 as it
 * lies, F32 in cuBLAS's FP32 product on TF32 tensor cores); no float weight is copied. */
#define GPU_MATVEC_MAX_M 4
/* A MoE layer's chunk of at most this many tokens takes the per-entry kernels (moe_glu,
 * moe_down: each entry reads its expert's rows); more, the grouped mmq launches (each chosen
 * expert's rows once for all its tokens).  gpu_forward.c: moe_chunk. */
#ifndef GPU_MOE_ENTRY_MAX_TOKENS
#define GPU_MOE_ENTRY_MAX_TOKENS 4
#endif
/* A chunk of at most GPU_MOE_NARROW_MAX_TOKENS tokens with at least GPU_MOE_NARROW_MIN_ENTRIES
 * entries (tokens x experts a token; not under det) takes the grouped launches on mmq_narrow
 * (kernels/mmq_narrow.cuh: tiles of at most MMQN_MAX_M entries of one expert, each chosen
 * expert's weights once for its entries, no k-split reduce) where the experts' formats have it.
 * Measured on the H100 against the per-entry kernels (<= 4 tokens) and grouped mmq (more):
 * at 16 entries (Qwen3-30B-A3B B=2, gpt-oss-20b B=4) the per-entry kernels win by 11 % and 6 %
 * (its three launches more and, for MXFP4, mma fragments decoded a byte at a time), from 32
 * (Qwen3 B=4, gpt-oss B=8) narrow wins, +12.5 % and +9 %, and up to 32 tokens it beats mmq's
 * 16-row tiles (+2-10 %); 24 is between the two measured points.  docs/benchmarks.md
 * "Batched MoE decode on mmq_narrow". */
#ifndef GPU_MOE_NARROW_MIN_ENTRIES
#define GPU_MOE_NARROW_MIN_ENTRIES 24
#endif
#ifndef GPU_MOE_NARROW_MAX_TOKENS
#define GPU_MOE_NARROW_MAX_TOKENS 32
#endif
/* (Experts whose rows are not whole 16-byte copies -- gpt-oss's 2,880 MXFP4 inputs, 1,530
 * bytes; GLM-4.5-Air's 1,408-wide Q8_0 down rows, 1,496 -- took the per-entry kernels up to 8
 * tokens while mmq staged them in 2-byte copies: gpt-oss-20b at batch 8 decoded 576.6 tok/s per
 * entry and 264.6 grouped on the H100.  mmq now stages them from the aligned address below in
 * 16-byte copies, and they share the threshold above; docs/benchmarks.md.) */
/* mmq's partial sums when it splits k (batched decode): splits * rows * features * 4 bytes */
#define GPU_MMQ_PART_BYTES ((size_t)24 << 20)
#define GPU_BLAS_WORKSPACE (32u << 20) /* preset, so cuBLAS allocates nothing inside graphs */
#define GPU_N_BUCKETS 7 /* 1 2 4 8 16 32 64 */
#define GPU_MAX_BIAS_PER_SEQ 1024

/* A weight matrix in device memory, in its GGUF form (rows padded to 32 inputs for float
 * formats whose row length is not a multiple of 32). */
typedef struct gpu_matrix {
    CUdeviceptr d;
    ggml_type type;
    int wtype; /* gpu_wtype_index(type) */
    int k, n;  /* padded inputs per row, outputs */
    size_t row_bytes;
    CUdeviceptr h16; /* block-quantised rows mmq cannot serve: resident FP16 copy [n][k] for cuBLAS,
                        or 0 (dequantised per use) */
    int n_expert;    /* a MoE layer's 3-D expert tensor: n_expert matrices one after the other, */
    size_t expert_bytes; /* expert_bytes apart (n * row_bytes); 1 and the whole matrix otherwise */
} gpu_matrix;

typedef struct gpu_layer {
    CUdeviceptr attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm; /* F32 vectors or 0 */
    CUdeviceptr attn_post_norm, ffn_post_norm;                 /* sandwich-norm layers only */
    /* the attention output's bias (BERT, gpt-oss); encoders (BERT): the MLP's biases, the post-LN weights
     * and biases after each block */
    CUdeviceptr bo, b_up, b_down, attn_out_norm, attn_out_norm_b, ffn_out_norm, ffn_out_norm_b;
    gpu_matrix wq, wk, wv, wo, w_gate, w_up, w_down; /* absent ones (d == 0) per the recipe */
    /* multi-head latent attention (deepseek2, mla): the query's LoRA pair and its norm (or wq),
     * the latent's projection and norm, and the per-head wk_b, wv_b in F32 [n_head][out][in]
     * (gpu_engine.c: F32_MATRICES) */
    gpu_matrix wq_a, wq_b, wkv_a;
    CUdeviceptr q_a_norm, kv_a_norm, wk_b, wv_b;
    bool mla;
    gpu_matrix ple_gate, ple_proj; /* Gemma 4's per-layer embedding: [n_embd -> P], [P -> n_embd] */
    CUdeviceptr ple_post_norm;
    CUdeviceptr router; /* MoE: the router (ffn_gate_inp) in F32, [n_expert][n_embd], or 0; the
                           scaled router (Gemma 4) with ffn_gate_inp.scale / sqrt(n_embd) folded in */
    CUdeviceptr exp_probs_b; /* the sigmoid router's selection bias [n_expert] (GLM-4.5), or 0 */
    bool router_sigmoid;     /* ARCH_ROUTER_SIGMOID_BIAS: sigmoid scores, not softmax */
    int n_group;             /* the router's expert groups (ARCH_FFN_EXPERT_GROUPS: DeepSeek), 0: none */
    /* MoE: the experts (3-D); Gemma 4's fused ffn_gate_up_exps is uploaded once and gate and
     * up are views of its two halves (an expert's rows: gate's, then up's; expert_bytes the
     * pair's) */
    gpu_matrix ffn_gate_exps, ffn_up_exps, ffn_down_exps, ffn_gate_up_exps;
    /* Gemma 4's experts beside the dense GLU (ARCH_FFN_GLU_MOE): each expert's output scale
     * [n_expert], the experts' input norm and the two branches' output norms */
    CUdeviceptr expert_scale, ffn_pre_norm_2, ffn_post_norm_1, ffn_post_norm_2;
    /* gpt-oss: the attention output's bias [n_embd], each head's sink logit [n_head]
     * (ARCH_ATTN_OUT_BIAS, ARCH_ATTN_SINKS), the router's bias [n_expert] and the experts'
     * biases [n_expert][n_ff_exp] (gate, up) and [n_expert][n_embd] (down) (ARCH_FFN_BIAS) */
    CUdeviceptr attn_sinks, ffn_gate_inp_b, ffn_gate_exps_b, ffn_up_exps_b, ffn_down_exps_b; /* (bo: above) */
    bool topk_first;   /* the router's softmax over the chosen logits (ARCH_ROUTER_TOPK_SOFTMAX) */
    bool swiglu_clamp; /* the experts' GLU is the clamped SwiGLU (ARCH_ACT_SWIGLU_CLAMP) */
    /* the hybrid families: the shared expert (its gate in F32, [1][n_embd], or 0) and the
     * gated DeltaNet's projections, conv taps (F32 [chan][taps]), A, dt bias and output norm */
    gpu_matrix ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
    CUdeviceptr ffn_gate_inp_shexp;
    gpu_matrix ssm_qkv, ssm_gate, ssm_beta, ssm_alpha, ssm_ba, ssm_out;
    CUdeviceptr ssm_conv1d, ssm_a, ssm_dt, ssm_norm;
    /* from the model_layer: its window (0: full), RoPE (rope_freqs: the model's factors, or
     * LongRoPE's short or long ones as model_rope_freqs picks them for the engine's context, or
     * 0 where this layer does without) and activation */
    int window;
    float rope_base, rope_scale;
    CUdeviceptr rope_freqs;
    bool geglu, v_norm;
    bool post_ln; /* x = LayerNorm(x + block(x)) (ARCH_NORM_POST_LN): the block reads fp16(x) */
    bool mlp;     /* down(gelu_erf(up x + b_up)) + b_down (ARCH_FFN_MLP) */
    bool gated; /* attn_q gives [query | gate] per head (ARCH_ATTN_OUT_GATE) */
    int n_rot;  /* partial RoPE's dimensions, 0: the whole head */
    int lin;    /* its index among the linear layers' states, -1: an attention layer */
    /* its shapes (Gemma 4's full and sliding layers differ): head_dim, kv heads, the q and k/v
     * row widths, the FFN width padded to 32 (the wider of the dense FFN's and the shared
     * expert's: both run through the same buffers) */
    int hd, n_kv, d_q, d_kv, d_ff;
    /* its decode tokens take attn_decode (gpu_attn_decode_serves its shape), else attn_partial:
     * per layer, so that Gemma 4's sliding layers (head_dim 256) keep the tensor-core kernel
     * beside full layers of 512, which it does not serve */
    bool att_dec;
    bool has_out_scale; /* layer_output_scale: the residual stream times out_scale after the layer */
    float out_scale;
    /* the K/V this layer attends to: its own region of the caches, or its kv_source's (Gemma 4's
     * shared K/V: kv_own false, no K/V computed); each region [block][n_kv][GPU_KV_BLOCK][hd].
     * A linear (gated DeltaNet) layer has none: kv_own false, kc = vc = 0. */
    CUdeviceptr kc, vc;
    bool kv_own;
    /* those K/V are in the sliding layers' pool (docs/sliding-kv.md): the region holds that
     * pool's blocks and the layer reads and writes it through the sliding block tables */
    bool kv_swa;
} gpu_layer;

/* Where each per-step input lives in the staging buffer, copied in parts so a step moves
 * only what it uses: everything up to the used logit_bias entries (or, with constrained rows,
 * up to their allowed-token masks), and the used rows of the block tables (last: the full
 * layers', then, with a sliding pool, the sliding layers', same width).  Decode
 * graphs read these fixed addresses.  ftiles (flash tiles, int32 pairs) and dtok (tokens for
 * the split-K kernel) say how attention takes the step's tokens (gpu_attn_plan). */
typedef struct gpu_inputs {
    size_t tok, pos, kpos, slot, seq, rows, lidx, dtok, ftiles, sseq, schunk, bias, mask, tables, tables_swa, bytes;
} gpu_inputs;

/* How attention takes a step's tokens (pack_step): n_tiles flash tiles listed at in.ftiles
 * (every span of >= 2 tokens, when the shape has a flash kernel), and n_dec tokens through
 * split-K: those listed at in.dtok, or, when !dec_listed, tokens 0..n_dec-1 (the decode graphs,
 * which are captured that way); n_split key splits in the layers that take attn_decode
 * (gpu_layer.att_dec: its max_split, g->att_max_split), n_split_part in those that take
 * attn_partial (ATT_MAX_SPLIT): the same count where every layer takes one kernel. */
typedef struct gpu_attn_plan {
    int n_tiles, n_dec, n_split, n_split_part;
    bool dec_listed;
    /* every decode token is its sequence's only token of the step and sees keys up to its own
     * position: its other keys' K/V come from earlier steps (attn_args.old_kv) */
    bool old_kv;
    int n_ssm; /* sequences listed at in.sseq for the linear (gated DeltaNet) layers */
    /* their chunks of GPU_SSM_CHUNK tokens listed at in.schunk: the chunked delta rule (a
     * prompt step); 0: token by token (the decode graphs) */
    int n_chunks;
} gpu_attn_plan;

typedef struct gpu_engine {
    engine base;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    cublasHandle_t blas;
    bool have_blas;
    gpu_kernels k;

    /* weights */
    CUdeviceptr wbuf;
    size_t wbytes;
    gpu_layer *layers;
    gpu_matrix tok_embd, output;
    CUdeviceptr output_norm, rope_freqs;
    CUdeviceptr rope_factors_short, rope_factors_long; /* LongRoPE (phi3), or 0 */
    /* Gemma 4's per-layer embeddings (n_embd_ple > 0): the token table [n_vocab][n_layer * P],
     * the projection of the embeddings and its norm [P] */
    gpu_matrix ple_tok_embd, ple_model_proj;
    CUdeviceptr ple_proj_norm;
    /* an encoder's embedding stage: the absolute position table (bert; absent: rotary), token
     * type 0's row and the LayerNorm after their sum */
    gpu_matrix pos_embd;
    CUdeviceptr tok_types, embd_norm, embd_norm_b;
    /* bidirectional attention (ARCH_ATTN_BIDIR): every token sees its whole sequence, so the
     * attention kernels read in.kpos (each token's sequence's last position in the step) as
     * the position that bounds its keys, where a causal model's read in.pos */
    bool bidir;

    /* KV block pools: kv_blocks + 1 blocks (the last takes decode padding's writes) and, with
     * sliding layers in their own pool (docs/sliding-kv.md), kv_blocks_swa + 1 more for those;
     * and the token history per row: n_slots + 1 rows (the last for padding).  hist_len: how
     * many of a row's history entries the device holds for its current sequence.  Each layer
     * that computes K/V has its own region of kc and vc (gpu_layer.kc/vc: blocks of its own
     * shape, as many as its pool has), so one block is a range per layer of its pool. */
    CUdeviceptr kc, vc, hist;
    size_t kv_bytes;       /* both caches, both pools */
    size_t block_bytes;    /* one block of one cache: every full layer with K/V of its own */
    int kv_caches;         /* 2 (K and V), or 1: latent rows (MLA), whose keys are their values */
    size_t block_bytes_swa, swa_bytes; /* the same for the sliding layers; their pool, both caches */
    int table_width;              /* blocks of one sequence's table */
    int *hist_len;

    /* activations, sized for cap_tokens tokens and cap_rows logits rows */
    int cap_tokens, cap_rows;
    int d_embd, d_q, d_kv, d_ff; /* row widths (d_ff padded to 32) */
    CUdeviceptr x;               /* residual stream, f32 [t][n_embd] */
    CUdeviceptr act_h, ff_h;     /* matmul inputs, f16: normed x / attention out, SwiGLU out */
    CUdeviceptr act_lo;          /* a linear or latent-attention layer's normed x less act_h, f16
                                    (attention_linear, attention_mla) */
    CUdeviceptr q, kk, vv;       /* projections, f32 */
    CUdeviceptr gate, up;        /* cuBLAS path only: f32 gate/up before SwiGLU (0 when unused) */
    CUdeviceptr post;            /* sandwich-norm models only: a block's output before its norm and
                                    residual add, f32 [t][n_embd] (0 when unused) */
    CUdeviceptr mmq_part;        /* mmq split-k partial sums, mmq_part_bytes */
    /* MoE layers only (0 otherwise), for moe_chunk tokens at a time (moe_chunk * k entries):
     * the normed activations in f32 [cap_tokens][n_embd] (the router's input), router
     * logits f32 [cap_tokens][n_expert], the chosen ids and weights [entries], the
     * grouping (sorted entries, each entry's sorted position, the tiles), the experts' SwiGLU
     * output f16 [entries][d_ff_exp] and down output f32 [entries][n_embd] */
    CUdeviceptr moe_xf, moe_logits, moe_ids, moe_w, moe_sorted, moe_pos, moe_tiles, moe_h, moe_y;
    /* MXFP4 experts (not --deterministic) only: the q8 rows of a narrow chunk's products
     * (kernels/mmq_narrow.cuh quantize_q8_mma): int8 [tokens][2 d_embd] then [entries][2 d_ff_exp],
     * and their scales, f32 [tokens][d_embd / 32] then [entries][d_ff_exp / 32] */
    CUdeviceptr moe_q8, moe_q8s;
    int moe_chunk, d_ff_exp;
    /* GeGLU experts (Gemma 4) only: the chosen experts' gate and up in f32 [entries][d_ff_exp],
     * and the experts' sum before its norm, f32 [cap_tokens][n_embd] */
    CUdeviceptr moe_g, moe_u, moe_out;
    /* per-layer embeddings only: every layer's inputs f32 [cap_tokens][n_layer * P], the token
     * table's rows f32 (same shape), one layer's gate f32 [cap_tokens][P] and its gelu(gate) *
     * input f16 [cap_tokens][ple_ld] (ple_ld: P padded to 32, the padding kept zero) */
    CUdeviceptr ple, ple_tok, ple_g, ple_h;
    int ple_ld;
    size_t mmq_part_bytes;
    /* Hybrid models (0 otherwise).  The recurrent states: n_states + 1 slots (the last takes
     * decode padding's updates) of slot_floats, per linear layer the conv window
     * [(taps-1) x ssm_chan] then the delta states [v heads][d][d] (the CPU engine's layout);
     * state_len: the positions each slot holds (host).  Activations: the q/k/v channels, the
     * output gate z, beta and log decay per v head (raw: qwen3next's fused projection), the
     * delta rule's output; a gated attention's [query | gate] rows; the shared expert's gate
     * logits and output. */
    CUdeviceptr state;
    size_t slot_floats, layer_floats, conv_floats;
    int ssm_chan, *state_len;
    CUdeviceptr ssm_mix, ssm_z, ssm_b, ssm_g, ssm_raw, ssm_o, qg, sh_logit, sh_y;
    CUdeviceptr ssm_u, ssm_w, ssm_gc; /* the chunked form's U (then v_new), W, cumulative decay */
    /* latent attention only (0 otherwise): the query projection's heads f32 [t][n_head][nope +
     * n_rot] (then the value heads [t][n_head][v]) and the compressed query f32 [t][q_lora]
     * before its norm */
    CUdeviceptr mla_q, mla_qa;
    int n_sm;                    /* multiprocessors: mmq sizes its k splits to fill them */
    CUdeviceptr wdq, blas_ws, part_o, part_ml;
    CUdeviceptr att_counts;      /* attn_decode's arrival counters (attn_args.counts), or 0 */
    CUdeviceptr w16;             /* FP16 copies of the quantised matrices cuBLAS multiplies, or 0 */
    CUdeviceptr x_f32;           /* the activations of an F32 matrix's cuBLAS product in FP32, */
    int x_f32_k;                 /* up to this many inputs a row (the widest F32 matrix's) */
    size_t w16_bytes;
    CUdeviceptr xl_h, logits, work, counts, parts, sout;
    int att_splits;              /* the attn_decode layers' most splits of a decode query */
    int att_splits_part;         /* the attn_partial layers' (the partial buffers hold the larger) */
    bool att_decode;             /* every attention layer's decode tokens take attn_decode */
    bool att_dec_any;            /* some layer's do (gpu_layer.att_dec) */
    int att_max_split;           /* their key splits (gpu_attn_dec_split_for), else attn_partial's */
    int att_window;              /* the sliding layers' window (their key spans split apart), 0: none */
    int fa_q_tokens;             /* tokens per flash tile (gpu_flash_q_tokens), 0: no flash kernel
                                    (nor under det: every token takes the split-K decode kernel) */
    /* engine_config.deterministic: one matmul path for every row count (mmq where it serves the
     * weight format, else matvec; never cuBLAS), k splits fixed per weight shape, no fused
     * one-token epilogues, no flash tiles: a row's sums then never depend on the batch. */
    bool det;
    /* One-row products over q8 activations (kernels/dot_q8.cuh) for the formats that have them:
     * not under det (batch sizes would then differ by more than the order of sums), nor in
     * MoE or hybrid models (a router's or DeltaNet's input read to 8 bits moves their choices
     * and state).  xq, xd: the row quantised (int8 per input and its int8 remainder, a (scale,
     * sum) pair per 32: kernels/common.cuh q8_block_store), by rmsnorm_q8 or quantize_q8. */
    bool dp4a;
    CUdeviceptr xq, xd;
    /* The batch-1 step's RMSNorms carried by its products instead of launches of their own
     * (gpu_shared.h matvec_norm; gpu_norms_carried says where).  norm_h: a norm's input
     * fp16(x w c) [n_embd]; norm_part: the residual product's sums of squares, one per 8
     * features (moe_down_res's too); norm_ss: the step's sums of squares, norm_prep's and one per norm of a layer
     * [1 + 2 n_layer]; norm_lo: a DeltaNet layer's norm input's remainder (matvec_norm xw_lo)
     * [n_embd], in hybrids only. */
    bool norm_carry;
    CUdeviceptr norm_h, norm_part, norm_ss, norm_lo;
    size_t wdq_bytes;

    /* per-step inputs: pinned host staging + device copy, and results */
    gpu_inputs in;
    CUdeviceptr in_d;
    unsigned char *in_h;
    gpu_sample_out *out_h;
    /* engine_decode_rounds's staging (gpu_decode_rounds), grown on first use: every round's
     * packed inputs (pinned and on the device, rounds_in_cap bytes each) and every round's
     * samples (rounds_out_cap rows each side) */
    unsigned char *rounds_in_h;
    CUdeviceptr rounds_in_d, rounds_out_d;
    gpu_sample_out *rounds_out_h;
    size_t rounds_in_cap, rounds_out_cap;
    int mask_words; /* ceil(n_vocab / 32): one row of gpu_inputs.mask */
    int *row_of_seq; /* per sequence of the step (cap_rows): its logits row, or -1 */

    /* decode graphs per batch bucket: [0] for any context, [1] for steps whose every token
     * sees keys of one split (a grid one split deep: attn_decode writes its output; att_dec_any only) */
    CUgraphExec graphs[2][GPU_N_BUCKETS];
    /* Tensor parallelism (gpu_tp.c): this GPU's rank among the shards (-1: one GPU, the whole
     * model), its NCCL communicator (set before the first step), and the partial sums of the
     * two row-split products of a layer (Wo, Wdown) before their all-reduce, f32 [cap_tokens][n_embd].
     * Every rank runs the whole step; only rank 0 brings results back. */
    int tp_rank;
    void *tp_comm;
    CUdeviceptr tp_part;
    /* The one-shot all-reduce over NVLink peer memory (gpu_tp.c peer_exchange; kernels/
     * allreduce.cuh): the exchange buffers, flags and counters of every rank as this GPU
     * addresses them, filled in once; ar.n_ranks 0 where the GPUs cannot reach each other's
     * memory (NCCL then).  Sums of at most ar.cap floats take it. */
    gpu_ar_args ar;
    /* The LM head split by vocabulary (gpu_tp.c split_lm_head; tp_vocab1 0: each rank runs the
     * whole LM head): in a step's LM head this rank multiplies the output's rows [tp_vocab0,
     * tp_vocab1) into those columns of rank 0's logits (tp_logits0: a peer pointer on the other
     * ranks), tp_gather hands them over, and rank 0 alone samples.  Rank 0's LM heads after a
     * step (every-token logits) take the whole matrix, which every rank still holds. */
    int tp_vocab0, tp_vocab1;
    CUdeviceptr tp_logits0;
    /* A step's progress, for gpu_tp.c's watchdog (read from its thread): tp_phase (gpu_tp_phase),
     * the all-reduces this GPU's host enqueued in the step in hand (tp_sent; a decode graph's are
     * in the graph, not counted), and those the GPU finished, written by the stream itself
     * after each eager all-reduce into pinned host memory (tp_done; NULL where the driver
     * cannot write it).  tp_capturing: a decode graph is being captured (no marks in it). */
    int tp_phase, tp_sent;
    volatile uint32_t *tp_done;
    bool tp_capturing;
    /* Set by the first CUDA failure inside a step: the context is then unusable, and every
     * later step reports ENGINE_FATAL with this message. */
    char failed[320];
} gpu_engine;

/* The block tables (device) layer L reads and writes its K/V through: its pool's. */
static inline CUdeviceptr gpu_layer_tables(const gpu_engine *g, const gpu_layer *L)
{
    return g->in_d + (L->kv_swa ? g->in.tables_swa : g->in.tables);
}

/* A CUDA engine on one GPU (cfg->device) for model m, which under tensor parallelism is rank
 * tp_rank's view of the model (model/tp_shard.h; -1: the whole model, no tensor parallelism). */
engine *gpu_engine_create(const model *m, const engine_config *cfg, int tp_rank, char *err, size_t errlen);
/* Destroys g's decode graphs (gpu_tp.c: before the NCCL communicators they captured, whose
 * destruction waits for every graph that holds them). */
void gpu_drop_graphs(gpu_engine *g);
/* The tensor-parallel engine over cfg->tensor_parallel GPUs (gpu_tp.c). */
engine *gpu_tp_create(const model *m, const engine_config *cfg, char *err, size_t errlen);
/* Where a tensor-parallel rank's step is (gpu_engine.tp_phase). */
typedef enum {
    GPU_TP_IDLE,
    GPU_TP_PACKING,
    GPU_TP_EAGER,   /* enqueuing the eager forward pass (a prompt or mixed step) */
    GPU_TP_GRAPH,   /* capturing or launching a decode graph */
    GPU_TP_WAITING, /* everything enqueued: waiting for the stream */
} gpu_tp_phase;
/* x += the ranks' partial products in tp_part (count floats: rows of n_embd), summed in rank
 * order: the one-shot exchange where it is set up and count fits, else an NCCL all-reduce and
 * the add; with norm (one row, a carried norm: gpu_shared.h matvec_norm), the next norm's input
 * and partials too, as the residual product of one GPU writes them; pushed: the product before
 * pushed this rank's LL words (gpu_tp_ll_push said yes for count).  Launches only. */
int gpu_tp_residual_add(gpu_engine *g, size_t count, const matvec_norm *norm, bool pushed, const char *what,
                        char *err, size_t errlen);
/* Whether a sum of count floats takes the LL lines (then *p is the product's push of its rows
 * into them, gpu_shared.h matvec_ll_push, and the sum is called with pushed) */
bool gpu_tp_ll_push(const gpu_engine *g, size_t count, matvec_ll_push *p);
/* After a vocabulary-split LM head's product: rank r > 0 signals that its logits are in rank 0's,
 * rank 0 waits for every rank's signal (kernels/allreduce.cuh tp_gather).  Launches only. */
int gpu_tp_gather(gpu_engine *g, const char *what, char *err, size_t errlen);

/* Run the forward pass of n_tokens packed tokens (inputs already in in_d), attention as ap
 * says, and sample n_rows logits rows (logits into g->logits, samples into g->sout).
 * Launches only: no synchronisation, so it can be captured into a graph. */
int gpu_forward(gpu_engine *g, int n_tokens, int n_rows, const gpu_attn_plan *ap, char *err, size_t errlen);
/* Whether g's batch-1 steps carry their RMSNorms in the products (gpu_forward.c), set once
 * into g->norm_carry when the buffers are sized (after det, dp4a and the kernels are known). */
bool gpu_norms_carried(const gpu_engine *g);
/* W -> FP16 row-major [n][k] at dst (the form cuBLAS multiplies); launches only. */
int gpu_dequant_f16(gpu_engine *g, const gpu_matrix *w, CUdeviceptr dst, const char *what, char *err,
                    size_t errlen);
/* Whether layer L's feed-forward over T rows is one fused kernel (mmq's or matvec's glu); if
 * not, it needs the FP32 gate/up buffers. */
bool gpu_ffn_fused(const gpu_engine *g, const gpu_layer *L, int T);
/* ... for any gate and up pair (a shared expert's). */
bool gpu_glu_fused(const gpu_engine *g, const gpu_matrix *gate, const gpu_matrix *up, int T);
/* LM head over n rows of final activations gathered by the int list at in_d + in.lidx + first. */
int gpu_forward_logits_rows(gpu_engine *g, int first, int n, char *err, size_t errlen);
/* The output norm over n rows of x from row `first`, in place (FP32): a sequence's final
 * hidden states (engine_seq.hidden), after every LM head of the step has read x. */
int gpu_forward_hidden_rows(gpu_engine *g, int first, int n, char *err, size_t errlen);

#endif
