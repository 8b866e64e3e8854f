/* gguf_write.c - the GGUF writer (version 3).
 *
 * Metadata and tensor infos are serialised into one buffer; tensor data follows, each tensor
 * padded to the alignment.  Data is streamed to the output (never assembled in memory when
 * writing a file), and tensors with a fill callback are produced chunk by chunk, so a
 * multi-GB synthetic model needs only one chunk of memory.  Files are written to a temporary
 * name and renamed, so a reader never sees a half-written model.
 *
 * The writer does not validate what it is given: tests use it to build hostile files. */
#include "gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILL_CHUNK_BYTES (4u << 20)

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    bool oom; /* sticky: reported by the write functions */
} wbuf;

typedef struct wkv {
    char *key;
    uint32_t type;
    wbuf value; /* the serialised value: everything after the type field */
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data; /* NULL for fill tensors */
    void *owned;      /* copy of data when not borrowed */
    size_t nbytes;
    gguf_fill_fn fill;
    void *fill_ctx;
    uint64_t offset; /* assigned at write time */
} wtensor;

struct gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    bool oom;
};

/* ---- byte buffer ----------------------------------------------------------------------- */

static void wbuf_put(wbuf *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void wbuf_u32(wbuf *b, uint32_t v) { wbuf_put(b, &v, 4); }
static void wbuf_u64(wbuf *b, uint64_t v) { wbuf_put(b, &v, 8); }

static void wbuf_str(wbuf *b, const char *s, size_t len)
{
    wbuf_u64(b, len);
    wbuf_put(b, s, len);
}

/* ---- building ---------------------------------------------------------------------------- */

gguf_writer *gguf_writer_new(void) { return calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].value.p);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].owned);
    }
    free(w->kv);
    free(w->tensors);
    free(w);
}

static bool grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return true;
    size_t c = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, c * elem);
    if (!p) return false;
    *arr = p;
    *cap = c;
    return true;
}

/* The entry for `key` with its value emptied, ready to be (re)written; NULL on OOM. */
static wkv *kv_slot(gguf_writer *w, const char *key, uint32_t type)
{
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            w->kv[i].type = type;
            w->kv[i].value.len = 0;
            return &w->kv[i];
        }
    char *k = strdup(key);
    if (!k || !grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv)) {
        free(k);
        w->oom = true;
        return NULL;
    }
    wkv *kv = &w->kv[w->n_kv++];
    *kv = (wkv){.key = k, .type = type};
    return kv;
}

/* Semantics of the raw setter, by type:
 *   scalar       `data` points to one value of that type (n_elems is ignored)
 *   STRING       `data` holds n_elems bytes (they may contain NUL)
 *   ARRAY        arr_type scalar: n_elems values; arr_type STRING: `data` is n_elems C strings
 *   anything else (unknown types, arrays of arrays): only the type tags and the count are
 *                written, so that a reader's refusal of them can be tested. */
void gguf_writer_set_raw(gguf_writer *w, const char *key, gguf_vtype type, gguf_vtype arr_type,
                         const void *data, size_t n_elems)
{
    wkv *kv = kv_slot(w, key, type);
    if (!kv) return;
    wbuf *b = &kv->value;
    if (type == GGUF_VT_STRING) {
        wbuf_str(b, data, n_elems);
    } else if (type == GGUF_VT_ARRAY) {
        wbuf_u32(b, arr_type);
        wbuf_u64(b, n_elems);
        if (arr_type == GGUF_VT_STRING) {
            const char *const *v = data;
            for (size_t j = 0; j < n_elems; j++) wbuf_str(b, v[j], strlen(v[j]));
        } else if (gguf_vtype_size(arr_type) && n_elems) {
            if (n_elems > SIZE_MAX / gguf_vtype_size(arr_type)) b->oom = true;
            else wbuf_put(b, data, n_elems * gguf_vtype_size(arr_type));
        }
    } else {
        wbuf_put(b, data, gguf_vtype_size(type));
    }
    if (b->oom) w->oom = true;
}

void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    gguf_writer_set_raw(w, key, GGUF_VT_UINT32, 0, &v, 1);
}

void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    gguf_writer_set_raw(w, key, GGUF_VT_INT32, 0, &v, 1);
}

void gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v)
{
    gguf_writer_set_raw(w, key, GGUF_VT_UINT64, 0, &v, 1);
}

void gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    gguf_writer_set_raw(w, key, GGUF_VT_FLOAT32, 0, &v, 1);
}

void gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v;
    gguf_writer_set_raw(w, key, GGUF_VT_BOOL, 0, &b, 1);
}

void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    gguf_writer_set_raw(w, key, GGUF_VT_STRING, 0, v, strlen(v));
}

void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, size_t n)
{
    gguf_writer_set_raw(w, key, GGUF_VT_ARRAY, GGUF_VT_STRING, v, n);
}

void gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, size_t n)
{
    gguf_writer_set_raw(w, key, GGUF_VT_ARRAY, GGUF_VT_FLOAT32, v, n);
}

void gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n)
{
    gguf_writer_set_raw(w, key, GGUF_VT_ARRAY, GGUF_VT_INT32, v, n);
}

static wtensor *tensor_slot(gguf_writer *w, const char *name, ggml_type type, uint32_t n_dims,
                            const int64_t *ne)
{
    char *nm = strdup(name);
    if (!nm || !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors)) {
        free(nm);
        w->oom = true;
        return NULL;
    }
    wtensor *t = &w->tensors[w->n_tensors++];
    *t = (wtensor){.name = nm, .type = type, .n_dims = n_dims};
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    return t;
}

void gguf_writer_add_tensor(gguf_writer *w, const char *name, ggml_type type, uint32_t n_dims,
                            const int64_t *ne, const void *data, size_t nbytes, bool borrow)
{
    if (n_dims > GGUF_MAX_DIMS) n_dims = GGUF_MAX_DIMS; /* ne[] cannot hold more */
    wtensor *t = tensor_slot(w, name, type, n_dims, ne);
    if (!t) return;
    t->nbytes = nbytes;
    t->data = data;
    if (!borrow && nbytes) {
        t->owned = malloc(nbytes);
        if (!t->owned) {
            w->oom = true;
            return;
        }
        memcpy(t->owned, data, nbytes);
        t->data = t->owned;
    }
}

void gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, ggml_type type, uint32_t n_dims,
                                 const int64_t *ne, gguf_fill_fn fill, void *ctx)
{
    if (n_dims > GGUF_MAX_DIMS) n_dims = GGUF_MAX_DIMS;
    wtensor *t = tensor_slot(w, name, type, n_dims, ne);
    if (!t) return;
    t->fill = fill;
    t->fill_ctx = ctx;
    /* Size from the shape; an impossible shape gives 0 and is reported when writing. */
    size_t rows = 1;
    for (uint32_t d = 1; d < n_dims; d++)
        if (ne[d] <= 0 || __builtin_mul_overflow(rows, (size_t)ne[d], &rows)) rows = 0;
    if (__builtin_mul_overflow(ggml_row_bytes(type, ne[0]), rows, &t->nbytes)) t->nbytes = 0;
}

/* ---- layout and output ------------------------------------------------------------------- */

/* general.alignment when it is a usable power of two; otherwise the default (the key is
 * still written as given, so invalid alignments reach the reader's checks). */
static size_t writer_alignment(const gguf_writer *w)
{
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        if (strcmp(kv->key, "general.alignment") != 0) continue;
        uint64_t a = 0;
        size_t n = gguf_vtype_size(kv->type);
        if (kv->type == GGUF_VT_FLOAT32 || kv->type == GGUF_VT_FLOAT64 || n == 0 || kv->value.len < n)
            break;
        memcpy(&a, kv->value.p, n); /* little-endian: the low bytes are the value */
        if (a != 0 && a <= (1u << 30) && (a & (a - 1)) == 0) return (size_t)a;
        break;
    }
    return GGUF_DEFAULT_ALIGNMENT;
}

static size_t pad_to(size_t off, size_t align) { return (align - off % align) % align; }

/* Header, metadata and tensor infos; assigns tensor offsets. Returns the total file size. */
static size_t serialise_head(gguf_writer *w, wbuf *b, size_t align)
{
    wbuf_put(b, "GGUF", 4);
    wbuf_u32(b, 3);
    wbuf_u64(b, w->n_tensors);
    wbuf_u64(b, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        wbuf_str(b, w->kv[i].key, strlen(w->kv[i].key));
        wbuf_u32(b, w->kv[i].type);
        wbuf_put(b, w->kv[i].value.p, w->kv[i].value.len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        t->offset = off;
        off += t->nbytes + pad_to(t->nbytes, align);
        wbuf_str(b, t->name, strlen(t->name));
        wbuf_u32(b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) wbuf_u64(b, (uint64_t)t->ne[d]);
        wbuf_u32(b, t->type);
        wbuf_u64(b, t->offset);
    }
    if (w->n_tensors == 0) return b->len;
    size_t data_start = b->len + pad_to(b->len, align);
    /* The last tensor is not padded: the file ends with its data. */
    const wtensor *last = &w->tensors[w->n_tensors - 1];
    return data_start + (size_t)last->offset + last->nbytes;
}

/* Where bytes go: a file descriptor or a memory buffer. */
typedef struct sink {
    int fd;       /* -1 for memory */
    uint8_t *mem; /* memory sink */
    size_t pos;
    uint8_t *chunk; /* staging buffer for fill tensors written to a file */
    int error;      /* errno of the first failure */
} sink;

static void sink_put(sink *s, const void *src, size_t n)
{
    if (s->error) return;
    if (s->fd < 0) {
        if (n) memcpy(s->mem + s->pos, src, n);
        s->pos += n;
        return;
    }
    const uint8_t *p = src;
    while (n > 0) {
        ssize_t k = write(s->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            s->error = k < 0 ? errno : EIO;
            return;
        }
        p += k;
        n -= (size_t)k;
        s->pos += (size_t)k;
    }
}

static void sink_zeros(sink *s, size_t n)
{
    static const uint8_t zeros[64];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        sink_put(s, zeros, k);
        n -= k;
    }
}

static void sink_fill(sink *s, const wtensor *t)
{
    for (size_t off = 0; off < t->nbytes && !s->error; off += FILL_CHUNK_BYTES) {
        size_t len = t->nbytes - off < FILL_CHUNK_BYTES ? t->nbytes - off : FILL_CHUNK_BYTES;
        if (s->fd < 0) {
            t->fill(t->fill_ctx, off, s->mem + s->pos, len);
            s->pos += len;
        } else {
            t->fill(t->fill_ctx, off, s->chunk, len);
            sink_put(s, s->chunk, len);
        }
    }
}

static void emit(gguf_writer *w, const wbuf *head, size_t align, sink *s)
{
    sink_put(s, head->p, head->len);
    if (w->n_tensors) sink_zeros(s, pad_to(head->len, align));
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        if (t->fill) sink_fill(s, t);
        else sink_put(s, t->data, t->nbytes);
        if (i + 1 < w->n_tensors) sink_zeros(s, pad_to(t->nbytes, align));
    }
}

/* Fill tensors whose shape gives no size cannot be produced. */
static const wtensor *unsizable_fill(const gguf_writer *w)
{
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].fill && w->tensors[i].nbytes == 0) return &w->tensors[i];
    return NULL;
}

int gguf_writer_write_mem(gguf_writer *w, void **out, size_t *out_size)
{
    if (w->oom || unsizable_fill(w)) return -1;
    size_t align = writer_alignment(w);
    wbuf head = {0};
    size_t total = serialise_head(w, &head, align);
    uint8_t *mem = head.oom ? NULL : malloc(total ? total : 1);
    if (!mem) {
        free(head.p);
        return -1;
    }
    sink s = {.fd = -1, .mem = mem};
    emit(w, &head, align, &s);
    free(head.p);
    *out = mem;
    *out_size = total;
    return 0;
}

int gguf_writer_write_file(gguf_writer *w, const char *path, char *err, size_t errlen)
{
    const wtensor *bad = unsizable_fill(w);
    if (bad) {
        snprintf(err, errlen, "%s: tensor '%s': shape is not a whole number of %s blocks", path,
                 bad->name, ggml_type_name((ggml_type)bad->type));
        return -1;
    }
    if (w->oom) {
        snprintf(err, errlen, "%s: out of memory while building the file", path);
        return -1;
    }
    size_t align = writer_alignment(w);
    wbuf head = {0};
    serialise_head(w, &head, align);
    int rc = -1;
    size_t n = strlen(path);
    char *tmp = malloc(n + 16);
    sink s = {.fd = -1};
    if (!tmp || head.oom || !(s.chunk = malloc(FILL_CHUNK_BYTES))) {
        snprintf(err, errlen, "%s: out of memory while building the file", path);
        goto out;
    }
    snprintf(tmp, n + 16, "%s.tmp.XXXXXX", path);
    s.fd = mkstemp(tmp);
    if (s.fd < 0) {
        snprintf(err, errlen, "%s: cannot create temporary file: %s", path, strerror(errno));
        goto out;
    }
    emit(w, &head, align, &s);
    if (!s.error && fchmod(s.fd, 0644) != 0) s.error = errno;
    if (!s.error && fsync(s.fd) != 0) s.error = errno;
    if (close(s.fd) != 0 && !s.error) s.error = errno;
    s.fd = -1;
    if (!s.error && rename(tmp, path) != 0) s.error = errno;
    if (s.error) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(s.error));
        unlink(tmp);
    } else {
        rc = 0;
    }
out:
    free(tmp);
    free(s.chunk);
    free(head.p);
    return rc;
}
