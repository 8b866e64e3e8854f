/* tp_shard.c - see tp_shard.h. */
#include "tp_shard.h"

#include <stdio.h>
#include <stdlib.h>
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

/* ---- one GPU's view of the model ------------------------------------------------------- */

/* Elements [begin, end) of a vector (a bias) as a vector of its own: a view of its bytes. */
static model_tensor vector_part(const model_tensor *t, int begin, int end)
{
    model_tensor v = *t;
    if (!t->data) return v;
    v.data = (const char *)t->data + ggml_row_bytes(t->type, begin);
    v.ne0 = end - begin;
    v.row_bytes = ggml_row_bytes(t->type, v.ne0);
    return v;
}

/* Inputs [begin, end) of every row of t (whole blocks: the plan checked) copied into *dst,
 * which moves past them; the matrix of those columns. */
static model_tensor column_part(const model_tensor *t, int64_t begin, int64_t end, unsigned char **dst)
{
    model_tensor c = *t;
    const size_t skip = ggml_row_bytes(t->type, begin), rb = ggml_row_bytes(t->type, end - begin);
    for (int64_t i = 0; i < t->ne1; i++) memcpy(*dst + (size_t)i * rb, (const char *)t->data + (size_t)i * t->row_bytes + skip, rb);
    c.data = *dst;
    c.ne0 = end - begin;
    c.row_bytes = rb;
    *dst += (size_t)t->ne1 * rb;
    return c;
}

static size_t column_part_bytes(const model_tensor *t, int64_t begin, int64_t end)
{
    return (size_t)t->ne1 * ggml_row_bytes(t->type, end - begin);
}

/* What the view cannot split yet, by name. */
static int view_supported(const model *m, const tp_plan *p, char *err, size_t errlen)
{
    for (int l = 0; l < m->hp.n_layer; l++) {
        arch_features missing = arch_layer_features(&m->layers[l].recipe) & ~TP_FEATURES;
        if (missing) {
            snprintf(err, errlen, "tensor parallelism does not split %s yet (layer %d of %s; it splits the dense "
                     "llama / qwen2 / qwen3 families): use --tensor-parallel 1", arch_feature_name(missing & -missing),
                     l, m->desc->name);
            return -1;
        }
    }
    if (m->hp.n_expert || m->hp.n_embd_ple || m->hp.encoder || m->hp.n_kv_shared) {
        snprintf(err, errlen, "tensor parallelism splits dense decoder models only (%s has %s)", m->desc->name,
                 m->hp.n_expert ? "experts" : m->hp.encoder ? "an encoder" : m->hp.n_embd_ple ? "per-layer embeddings"
                                                                                  : "shared K/V layers");
        return -1;
    }
    if (p->kv_replicas > 1) {
        snprintf(err, errlen, "tensor parallelism over %d GPUs: the model's %d KV heads would be replicated (fewer KV "
                 "heads than GPUs), which the CUDA engine does not do yet; use at most %d GPUs", p->n_gpus,
                 m->hp.n_head_kv, m->hp.n_head_kv);
        return -1;
    }
    for (int l = 0; l < m->hp.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        if (L->head_dim != m->hp.head_dim || L->n_head_kv != m->hp.n_head_kv || L->n_ff != m->hp.n_ff ||
            L->wqkv.data || L->w_gate_up.data || !L->w_gate.data || !L->wv.data) {
            snprintf(err, errlen, "tensor parallelism: layer %d of %s has its own shape or fused projections, which "
                     "the split does not handle yet", l, m->desc->name);
            return -1;
        }
    }
    return 0;
}

int tp_view_make(const model *m, const tp_plan *p, int r, tp_view *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (r < 0 || r >= p->n_gpus) {
        snprintf(err, errlen, "tensor parallelism: rank %d is not in a plan of %d GPUs", r, p->n_gpus);
        return -1;
    }
    if (view_supported(m, p, err, errlen)) return -1;
    const tp_rank *k = &p->rank[r];
    const int hd = m->hp.head_dim, n_layer = m->hp.n_layer;
    const int q0 = k->q_heads.begin * hd, q1 = k->q_heads.end * hd;
    const int kv0 = k->kv_heads.begin * hd, kv1 = k->kv_heads.end * hd;
    const int f0 = k->ffn.begin, f1 = k->ffn.end;
    out->m = *m;
    out->m.mtp.bound = false; /* its layers are the n_layer that run: no MTP block (layers[n_layer]) */
    out->m.gguf = NULL;
    out->m.layers = malloc((size_t)n_layer * sizeof *out->m.layers);
    for (int l = 0; l < n_layer; l++)
        out->packed_bytes += column_part_bytes(&m->layers[l].wo, q0, q1) + column_part_bytes(&m->layers[l].w_down, f0, f1);
    out->packed = malloc(out->packed_bytes ? out->packed_bytes : 1);
    if (!out->m.layers || !out->packed) {
        tp_view_free(out);
        snprintf(err, errlen, "tensor parallelism: out of host memory for GPU %d's slices (%s)", r,
                 tp_bytes_text((double)out->packed_bytes, (char[32]){0}, 32));
        return -1;
    }
    unsigned char *dst = out->packed;
    size_t weights = 0;
    for (int l = 0; l < n_layer; l++) {
        const model_layer *F = &m->layers[l];
        model_layer *L = &out->m.layers[l];
        *L = *F;
        L->wq = model_tensor_rows(&F->wq, q0, q1 - q0);
        L->wk = model_tensor_rows(&F->wk, kv0, kv1 - kv0);
        L->wv = model_tensor_rows(&F->wv, kv0, kv1 - kv0);
        L->bq = vector_part(&F->bq, q0, q1);
        L->bk = vector_part(&F->bk, kv0, kv1);
        L->bv = vector_part(&F->bv, kv0, kv1);
        L->wo = column_part(&F->wo, q0, q1, &dst);
        L->w_gate = model_tensor_rows(&F->w_gate, f0, f1 - f0);
        L->w_up = model_tensor_rows(&F->w_up, f0, f1 - f0);
        L->w_down = column_part(&F->w_down, f0, f1, &dst);
        L->n_head_kv = k->kv_heads.end - k->kv_heads.begin;
        L->n_ff = f1 - f0;
        weights += L->wq.ne1 * L->wq.row_bytes + L->wk.ne1 * L->wk.row_bytes + L->wv.ne1 * L->wv.row_bytes +
                   L->wo.ne1 * L->wo.row_bytes + L->w_gate.ne1 * L->w_gate.row_bytes +
                   L->w_up.ne1 * L->w_up.row_bytes + L->w_down.ne1 * L->w_down.row_bytes;
    }
    out->m.hp.n_head = k->q_heads.end - k->q_heads.begin;
    out->m.hp.n_head_kv = k->kv_heads.end - k->kv_heads.begin;
    out->m.hp.n_ff = f1 - f0;
    out->m.weight_bytes = weights; /* the layers' matrices it holds (the globals are the full model's) */
    return 0;
}

void tp_view_free(tp_view *v)
{
    if (!v) return;
    free(v->m.layers);
    free(v->packed);
    memset(v, 0, sizeof *v);
}

void tp_view_drop_packed(tp_view *v)
{
    for (int l = 0; v->m.layers && l < v->m.hp.n_layer; l++) v->m.layers[l].wo.data = v->m.layers[l].w_down.data = NULL;
    free(v->packed);
    v->packed = NULL;
}
