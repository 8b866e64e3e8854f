/* tp_shard.c - see tp_shard.h. */
#include "tp_shard.h"

#include <stdio.h>
#include <string.h>

#include "model/model.h"

void tp_shape_from_model(const model *m, int kv_elem_bytes, tp_shape *out)
{
    const model_hparams *hp = &m->hp;
    const model_layer *l = &m->layers[0]; /* every layer has the same types in the files we load */
    *out = (tp_shape){
        .n_layer = hp->n_layer, .n_embd = hp->n_embd, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim, .n_ff = hp->n_ff, .n_vocab = hp->n_vocab, .tied_output = hp->tied_output,
        .wq = l->wq.type, .wk = l->wk.type, .wv = l->wv.type, .wo = l->wo.type,
        .w_gate = l->w_gate.type, .w_up = l->w_up.type, .w_down = l->w_down.type,
        .tok_embd = m->tok_embd.type, .output = m->output.type, .kv_elem_bytes = kv_elem_bytes,
    };
}

/* Bytes of `rows` rows of `n` inputs each; the callers have checked n is whole blocks. */
static size_t mat_bytes(ggml_type t, int64_t rows, int64_t n) { return (size_t)rows * ggml_row_bytes(t, n); }

/* Part r of `units` things split over n as evenly as possible: the first units % n parts take
 * one more.  Used for FFN blocks and vocabulary rows, where an uneven split only costs the
 * larger parts a little time (the all-reduce or the gather is the same size). */
static tp_range balanced(int units, int n, int r, int scale)
{
    int base = units / n, extra = units % n;
    int begin = r * base + (r < extra ? r : extra);
    int len = base + (r < extra ? 1 : 0);
    return (tp_range){begin * scale, (begin + len) * scale};
}

/* Weights of one layer held by a GPU with these ranges (or the whole layer for the full
 * ranges).  Norms are F32 vectors that every GPU holds. */
static size_t layer_bytes(const tp_shape *s, int q_heads, int kv_heads, int ffn, size_t *norms)
{
    int64_t hd = s->head_dim;
    *norms = 2 * (size_t)s->n_embd * sizeof(float); /* attn_norm, ffn_norm */
    return mat_bytes(s->wq, q_heads * hd, s->n_embd) + mat_bytes(s->wk, kv_heads * hd, s->n_embd) +
           mat_bytes(s->wv, kv_heads * hd, s->n_embd) + mat_bytes(s->wo, s->n_embd, q_heads * hd) +
           mat_bytes(s->w_gate, ffn, s->n_embd) + mat_bytes(s->w_up, ffn, s->n_embd) +
           mat_bytes(s->w_down, s->n_embd, ffn) + *norms;
}

static int check_shape(const tp_shape *s, char *err, size_t errlen)
{
    if (s->n_layer < 1 || s->n_embd < 1 || s->n_head < 1 || s->n_head_kv < 1 || s->head_dim < 1 ||
        s->n_ff < 1 || s->n_vocab < 1 || s->kv_elem_bytes < 1 || s->n_head % s->n_head_kv != 0) {
        snprintf(err, errlen, "model shape not supported for tensor parallelism (layers %d, embd %d, heads %d/%d kv, "
                 "head dim %d, ffn %d, vocab %d)", s->n_layer, s->n_embd, s->n_head, s->n_head_kv, s->head_dim,
                 s->n_ff, s->n_vocab);
        return -1;
    }
    const ggml_type all[] = {s->wq, s->wk, s->wv, s->wo, s->w_gate, s->w_up, s->w_down, s->tok_embd,
                             s->tied_output ? s->tok_embd : s->output};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!ggml_type_known(all[i]) || ggml_type_block_elems(all[i]) == 0) {
            snprintf(err, errlen, "weight type %d is unknown", (int)all[i]);
            return -1;
        }
    }
    return 0;
}

int tp_plan_make(const tp_shape *s, int n, tp_plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (n < 1 || n > TP_MAX_GPUS) {
        snprintf(err, errlen, "tensor parallelism over %d GPUs: the number of GPUs must be 1 to %d (one host)", n,
                 TP_MAX_GPUS);
        return -1;
    }
    if (check_shape(s, err, errlen)) return -1;
    /* Query heads: whole heads per GPU, and the same number on every GPU (attention is the
     * step's critical path; an uneven split would leave the others waiting at the all-reduce). */
    if (s->n_head % n != 0) {
        char divisors[64] = "";
        size_t o = 0;
        for (int d = 1; d <= TP_MAX_GPUS && o < sizeof divisors; d++)
            if (s->n_head % d == 0) o += (size_t)snprintf(divisors + o, sizeof divisors - o, "%s%d", o ? ", " : "", d);
        snprintf(err, errlen, "tensor parallelism over %d GPUs: the model's %d attention heads do not split into "
                 "whole heads per GPU (%d does not divide %d; GPU counts that do: %s)", n, s->n_head, n, s->n_head,
                 divisors);
        return -1;
    }
    int q_per = s->n_head / n, group = s->n_head / s->n_head_kv; /* query heads per KV head */
    /* KV heads: either split (N divides n_head_kv: whole KV heads per GPU, each held once) or
     * replicated (n_head_kv divides N: every GPU's query heads fall in one KV group, and that
     * KV head is held by the N / n_head_kv GPUs of the group).  Anything else would leave a GPU
     * with query heads of two groups, one of them shared only in part. */
    if (s->n_head_kv % n != 0 && n % s->n_head_kv != 0) {
        snprintf(err, errlen, "tensor parallelism over %d GPUs: the model's %d KV heads can be neither split "
                 "(%d does not divide %d) nor replicated evenly (%d does not divide %d): the query heads of one GPU "
                 "would need KV heads held in part by others", n, s->n_head_kv, n, s->n_head_kv, s->n_head_kv, n);
        return -1;
    }
    out->n_gpus = n;
    out->kv_replicas = s->n_head_kv >= n ? 1 : n / s->n_head_kv;
    /* Row splits of quantised matrices must land on whole blocks of their inputs. */
    int64_t q_cols = (int64_t)q_per * s->head_dim;
    size_t wo_blk = ggml_type_block_elems(s->wo), down_blk = ggml_type_block_elems(s->w_down);
    if (n > 1 && q_cols % (int64_t)wo_blk != 0) {
        snprintf(err, errlen, "tensor parallelism over %d GPUs: each GPU's part of the attention output projection "
                 "is %d heads x %d = %lld inputs, not a whole number of %s blocks (%zu inputs); use fewer GPUs or "
                 "a model whose attn_output is Q8_0/F16", n, q_per, s->head_dim, (long long)q_cols,
                 ggml_type_name(s->wo), wo_blk);
        return -1;
    }
    if (s->n_ff % (int)down_blk != 0) {
        snprintf(err, errlen, "ffn size %d is not a whole number of %s blocks (%zu)", s->n_ff,
                 ggml_type_name(s->w_down), down_blk);
        return -1;
    }
    int ffn_units = s->n_ff / (int)down_blk;
    if (ffn_units < n) {
        snprintf(err, errlen, "tensor parallelism over %d GPUs: the FFN's %d hidden units are %d %s blocks of %zu, "
                 "fewer than one block per GPU; use at most %d GPUs", n, s->n_ff, ffn_units,
                 ggml_type_name(s->w_down), down_blk, ffn_units);
        return -1;
    }
    if (s->n_vocab < n) {
        snprintf(err, errlen, "tensor parallelism over %d GPUs: a vocabulary of %d tokens", n, s->n_vocab);
        return -1;
    }

    /* The whole model, as one GPU holds it. */
    size_t norms = 0;
    size_t whole_layer = layer_bytes(s, s->n_head, s->n_head_kv, s->n_ff, &norms);
    size_t head_bytes = mat_bytes(s->tok_embd, s->n_vocab, s->n_embd) +
                        (s->tied_output ? 0 : mat_bytes(s->output, s->n_vocab, s->n_embd));
    size_t out_norm = (size_t)s->n_embd * sizeof(float);
    out->total_weight_bytes = (size_t)s->n_layer * whole_layer + head_bytes + out_norm;
    out->total_kv_bytes_per_token = (size_t)s->n_layer * 2 * s->n_head_kv * s->head_dim * s->kv_elem_bytes;

    for (int r = 0; r < n; r++) {
        tp_rank *k = &out->rank[r];
        k->q_heads = (tp_range){r * q_per, (r + 1) * q_per};
        /* The KV heads its query heads read: head h reads KV head h / group. */
        k->kv_heads = (tp_range){k->q_heads.begin / group, (k->q_heads.end - 1) / group + 1};
        k->ffn = balanced(ffn_units, n, r, (int)down_blk);
        k->vocab = balanced(s->n_vocab, n, r, 1);
        int n_kv = k->kv_heads.end - k->kv_heads.begin, n_ffn = k->ffn.end - k->ffn.begin;
        int n_voc = k->vocab.end - k->vocab.begin;
        size_t l_norms = 0;
        size_t lb = layer_bytes(s, q_per, n_kv, n_ffn, &l_norms);
        k->weight_bytes = (size_t)s->n_layer * lb + mat_bytes(s->tok_embd, n_voc, s->n_embd) +
                          (s->tied_output ? 0 : mat_bytes(s->output, n_voc, s->n_embd)) + out_norm;
        /* Held by others too: the norms everywhere; a replicated KV head's K/V weights. */
        size_t kv_w = mat_bytes(s->wk, (int64_t)n_kv * s->head_dim, s->n_embd) +
                      mat_bytes(s->wv, (int64_t)n_kv * s->head_dim, s->n_embd);
        k->replicated_bytes = (size_t)s->n_layer * (l_norms + (out->kv_replicas > 1 ? kv_w : 0)) + out_norm;
        k->kv_bytes_per_token = (size_t)s->n_layer * 2 * n_kv * s->head_dim * s->kv_elem_bytes;
    }
    return 0;
}

const char *tp_bytes_text(double bytes, char *buf, size_t cap)
{
    const double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
    if (bytes >= gib) snprintf(buf, cap, "%.2f GiB", bytes / gib);
    else snprintf(buf, cap, "%.1f MiB", bytes / mib);
    return buf;
}

const char *tp_plan_describe_rank(const tp_plan *p, int r, char *buf, size_t cap)
{
    if (r < 0 || r >= p->n_gpus) {
        snprintf(buf, cap, "GPU %d: not in the plan", r);
        return buf;
    }
    const tp_rank *k = &p->rank[r];
    char w[32];
    snprintf(buf, cap, "GPU %d: heads %d-%d, kv heads %d-%d%s, ffn %d-%d, vocab %d-%d, weights %s, "
             "KV cache %.1f KiB/token", r, k->q_heads.begin, k->q_heads.end - 1, k->kv_heads.begin,
             k->kv_heads.end - 1, p->kv_replicas > 1 ? " (replicated)" : "", k->ffn.begin, k->ffn.end - 1,
             k->vocab.begin, k->vocab.end - 1, tp_bytes_text((double)k->weight_bytes, w, sizeof w),
             (double)k->kv_bytes_per_token / 1024.0);
    return buf;
}
