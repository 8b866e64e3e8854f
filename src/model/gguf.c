/* gguf.c - the GGUF reader: map the file, validate all of it once, then serve lookups.
 *
 * Layout (little-endian):
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x  { string key | u32 vtype | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to `general.alignment` | tensor data (each tensor at an aligned offset)
 * A string is u64 length + bytes; an array value is u32 element type + u64 count + elements.
 *
 * Everything in the file is untrusted.  Every read goes through a bounds-checked cursor, every
 * count is compared with what the remaining bytes could possibly hold before anything is
 * allocated for it, and tensor sizes are computed with checked arithmetic.  Nothing touches
 * tensor data, so opening a multi-GB model costs only the metadata pages. */
#include "gguf.h"
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader loads little-endian values directly; port it before using a big-endian host"
#endif

#define GGUF_MAGIC "GGUF"
#define ALIGNMENT_KEY "general.alignment"
/* Smallest possible encodings: they bound the counts a file of a given size can claim. */
#define MIN_KV_BYTES (8 + 4 + 1)               /* empty key, type, 1-byte value */
#define MIN_TENSOR_INFO_BYTES (8 + 4 + 8 + 4 + 8) /* empty name, 1 dim, type, offset */

typedef struct gguf_kv {
    char *key;
    gguf_vtype type;
    gguf_vtype arr_type; /* arrays only */
    uint64_t arr_len;    /* arrays only */
    size_t val_off;      /* file offset of the value (for arrays: of the first element) */
    size_t *str_off;     /* string arrays: file offset of each element's length prefix */
} gguf_kv;

/* Names sorted for binary search.  Sorting (rather than hashing) keeps duplicate detection
 * O(n log n) whatever names a hostile file picks: crafted hash collisions cannot make it
 * quadratic. */
typedef struct name_entry {
    const char *name;
    int64_t i;  /* index of the key or tensor */
    size_t off; /* file offset of its key / tensor info, for error messages */
} name_entry;

typedef struct name_index {
    name_entry *e;
    int64_t n;
} name_index;

struct gguf_file {
    const uint8_t *base;
    size_t size;
    bool mapped; /* base came from mmap and must be unmapped */
    bool copied; /* ... of anonymous memory holding a copy of the file (gguf_load) */
    uint32_t version;
    size_t alignment;
    size_t data_off;
    int64_t n_kv;
    gguf_kv *kv;
    int64_t n_tensors;
    gguf_tensor *tensors;
    name_index key_index;
    name_index tensor_index;
};

/* ---- errors and the bounds-checked cursor ---------------------------------------------- */

typedef struct cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
    char *err;
    size_t errlen;
    char what[192]; /* the item being parsed, prefixed to every error */
} cursor;

static bool fail(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(cursor *c, const char *fmt, ...)
{
    if (!c->err || c->errlen == 0) return false;
    int n = snprintf(c->err, c->errlen, "%s%s", c->what, c->what[0] ? ": " : "");
    if (n < 0 || (size_t)n >= c->errlen) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

static void set_what(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_what(cursor *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->what, sizeof c->what, fmt, ap);
    va_end(ap);
}

/* A name from the file as it may appear in a message: at most 100 bytes, control bytes
 * replaced, so that a hostile name cannot garble the terminal or the log line. */
typedef struct shown_name {
    char s[101];
} shown_name;

static shown_name show(const char *name)
{
    shown_name out;
    size_t n = 0;
    for (; name[n] && n < sizeof out.s - 1; n++)
        out.s[n] = (unsigned char)name[n] < 0x20 || name[n] == 0x7f ? '?' : name[n];
    out.s[n] = '\0';
    return out;
}

static size_t remaining(const cursor *c) { return c->size - c->pos; }

static bool need(cursor *c, size_t n, const char *field)
{
    if (n <= remaining(c)) return true;
    return fail(c, "%s at offset %zu: needs %zu bytes but the file ends at %zu (truncated)", field,
                c->pos, n, c->size);
}

static bool read_bytes(cursor *c, void *dst, size_t n, const char *field)
{
    if (!need(c, n, field)) return false;
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return true;
}

static bool read_u32(cursor *c, uint32_t *v, const char *field) { return read_bytes(c, v, 4, field); }
static bool read_u64(cursor *c, uint64_t *v, const char *field) { return read_bytes(c, v, 8, field); }

/* A string: returns its offset and length after checking it lies inside the file. */
static bool read_str(cursor *c, size_t *off, uint64_t *len, const char *field)
{
    size_t at = c->pos;
    if (!read_u64(c, len, field)) return false;
    if (*len > remaining(c)) {
        c->pos = at;
        return fail(c, "%s at offset %zu: string length %llu extends past end of file (size %zu)",
                    field, at, (unsigned long long)*len, c->size);
    }
    *off = c->pos;
    c->pos += (size_t)*len;
    return true;
}

/* Names and keys become C strings, so an embedded NUL would silently change them. */
static char *copy_name(cursor *c, size_t off, uint64_t len, size_t at, const char *field)
{
    if (len == 0) {
        fail(c, "%s at offset %zu is empty", field, at);
        return NULL;
    }
    if (memchr(c->base + off, '\0', (size_t)len)) {
        fail(c, "%s at offset %zu contains a NUL byte", field, at);
        return NULL;
    }
    char *s = malloc((size_t)len + 1);
    if (!s) {
        fail(c, "%s at offset %zu: out of memory (%llu bytes)", field, at, (unsigned long long)len);
        return NULL;
    }
    memcpy(s, c->base + off, (size_t)len);
    s[len] = '\0';
    return s;
}

/* ---- name index ------------------------------------------------------------------------ */

static bool index_init(name_index *ix, int64_t n)
{
    ix->n = 0;
    ix->e = malloc((size_t)(n ? n : 1) * sizeof *ix->e);
    return ix->e != NULL;
}

static void index_free(name_index *ix) { free(ix->e); }

static void index_add(name_index *ix, const char *name, int64_t i, size_t off)
{
    ix->e[ix->n++] = (name_entry){name, i, off};
}

static int cmp_entry(const void *a, const void *b)
{
    const name_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* Sorts the index; returns a name that occurs twice (its later entry; *first = the earlier
 * index) or NULL. */
static const name_entry *index_sort(name_index *ix, int64_t *first)
{
    qsort(ix->e, (size_t)ix->n, sizeof *ix->e, cmp_entry);
    for (int64_t k = 1; k < ix->n; k++)
        if (strcmp(ix->e[k - 1].name, ix->e[k].name) == 0) {
            *first = ix->e[k - 1].i;
            return &ix->e[k];
        }
    return NULL;
}

static int64_t index_find(const name_index *ix, const char *name)
{
    if (!name) return -1;
    int64_t lo = 0, hi = ix->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ix->e[mid].name, name);
        if (c == 0) return ix->e[mid].i;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* ---- metadata values ------------------------------------------------------------------- */

size_t gguf_vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0; /* string, array, or not a type */
    }
}

static bool check_bools(cursor *c, size_t off, uint64_t n)
{
    for (uint64_t j = 0; j < n; j++)
        if (c->base[off + j] > 1)
            return fail(c, "bool value %u at offset %zu is neither 0 nor 1", c->base[off + j],
                        (size_t)(off + j));
    return true;
}

static bool parse_array(cursor *c, gguf_kv *kv)
{
    uint32_t at;
    size_t type_at = c->pos;
    if (!read_u32(c, &at, "array element type")) return false;
    size_t len_at = c->pos;
    if (!read_u64(c, &kv->arr_len, "array length")) return false;
    if (at == GGUF_VT_ARRAY) return fail(c, "arrays of arrays are not supported (offset %zu)", type_at);
    kv->arr_type = (gguf_vtype)at;
    kv->val_off = c->pos;
    if (at == GGUF_VT_STRING) {
        /* Each element takes at least its 8-byte length: bound the index before allocating. */
        if (kv->arr_len > remaining(c) / 8)
            return fail(c, "array length %llu at offset %zu: %llu strings cannot fit in the %zu bytes left",
                        (unsigned long long)kv->arr_len, len_at, (unsigned long long)kv->arr_len,
                        remaining(c));
        kv->str_off = malloc((size_t)(kv->arr_len ? kv->arr_len : 1) * sizeof *kv->str_off);
        if (!kv->str_off) return fail(c, "out of memory indexing %llu strings", (unsigned long long)kv->arr_len);
        for (uint64_t j = 0; j < kv->arr_len; j++) {
            size_t off;
            uint64_t len;
            kv->str_off[j] = c->pos;
            char field[48];
            snprintf(field, sizeof field, "array element %llu", (unsigned long long)j);
            if (!read_str(c, &off, &len, field)) return false;
        }
        return true;
    }
    size_t es = gguf_vtype_size(at);
    if (es == 0) return fail(c, "unknown array element type %u at offset %zu", at, type_at);
    if (kv->arr_len > remaining(c) / es)
        return fail(c, "array of %llu x %zu-byte elements at offset %zu extends past end of file (size %zu)",
                    (unsigned long long)kv->arr_len, es, kv->val_off, c->size);
    size_t bytes = (size_t)kv->arr_len * es;
    if (at == GGUF_VT_BOOL && !check_bools(c, c->pos, kv->arr_len)) return false;
    c->pos += bytes;
    return true;
}

static bool parse_value(cursor *c, gguf_kv *kv)
{
    uint32_t t;
    size_t type_at = c->pos;
    if (!read_u32(c, &t, "value type")) return false;
    kv->type = (gguf_vtype)t;
    kv->val_off = c->pos;
    if (t == GGUF_VT_ARRAY) return parse_array(c, kv);
    if (t == GGUF_VT_STRING) {
        size_t off;
        uint64_t len;
        return read_str(c, &off, &len, "string value");
    }
    size_t es = gguf_vtype_size(t);
    if (es == 0) return fail(c, "unknown value type %u at offset %zu", t, type_at);
    if (!need(c, es, "value")) return false;
    if (t == GGUF_VT_BOOL && !check_bools(c, c->pos, 1)) return false;
    c->pos += es;
    return true;
}

/* Loads an integer value of any width and sign: *neg tells whether it is below zero, in
 * which case *s holds it; otherwise *u does. */
static bool scalar_int(const gguf_file *f, gguf_vtype t, size_t off, int64_t *s, uint64_t *u, bool *neg)
{
    const uint8_t *p = f->base + off;
    int8_t i8; int16_t i16; int32_t i32; uint16_t u16; uint32_t u32;
    *s = 0;
    switch (t) {
    case GGUF_VT_UINT8: *u = p[0]; break;
    case GGUF_VT_UINT16: memcpy(&u16, p, 2); *u = u16; break;
    case GGUF_VT_UINT32: memcpy(&u32, p, 4); *u = u32; break;
    case GGUF_VT_UINT64: memcpy(u, p, 8); break;
    case GGUF_VT_INT8: memcpy(&i8, p, 1); *s = i8; break;
    case GGUF_VT_INT16: memcpy(&i16, p, 2); *s = i16; break;
    case GGUF_VT_INT32: memcpy(&i32, p, 4); *s = i32; break;
    case GGUF_VT_INT64: memcpy(s, p, 8); break;
    default: return false;
    }
    bool is_signed = t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
    *neg = is_signed && *s < 0;
    if (is_signed && !*neg) *u = (uint64_t)*s;
    return true;
}

static bool value_i64(const gguf_file *f, gguf_vtype t, size_t off, int64_t *out)
{
    int64_t s;
    uint64_t u;
    bool neg;
    if (!scalar_int(f, t, off, &s, &u, &neg)) return false;
    if (!neg && u > INT64_MAX) return false;
    *out = neg ? s : (int64_t)u;
    return true;
}

static bool value_f64(const gguf_file *f, gguf_vtype t, size_t off, double *out)
{
    if (t == GGUF_VT_FLOAT32) {
        float v;
        memcpy(&v, f->base + off, 4);
        *out = v;
        return true;
    }
    if (t == GGUF_VT_FLOAT64) {
        memcpy(out, f->base + off, 8);
        return true;
    }
    int64_t s;
    uint64_t u;
    bool neg;
    if (!scalar_int(f, t, off, &s, &u, &neg)) return false;
    *out = neg ? (double)s : (double)u;
    return true;
}

/* ---- the whole file -------------------------------------------------------------------- */

static bool parse_header(cursor *c, gguf_file *f, uint64_t *n_tensors, uint64_t *n_kv)
{
    char magic[4];
    if (!read_bytes(c, magic, 4, "magic")) return false;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0)
        return fail(c, "bad magic at offset 0: expected \"GGUF\", found bytes %02x %02x %02x %02x",
                    (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2], (uint8_t)magic[3]);
    if (!read_u32(c, &f->version, "version")) return false;
    if (f->version == 1)
        return fail(c, "GGUF version 1 (offset 4) is not supported: it used 32-bit counts; "
                       "re-convert the model to GGUF v3");
    if (f->version != 2 && f->version != 3) {
        if ((f->version & 0xffff) == 0 && f->version != 0)
            return fail(c, "GGUF version field at offset 4 reads %u: a big-endian file? only "
                           "little-endian GGUF is supported", f->version);
        return fail(c, "unsupported GGUF version %u at offset 4 (supported: 2, 3)", f->version);
    }
    size_t at = c->pos;
    if (!read_u64(c, n_tensors, "tensor count") || !read_u64(c, n_kv, "metadata count")) return false;
    /* Both tables share the remaining bytes: bound each, then their sum. */
    size_t left = remaining(c);
    if (*n_kv > left / MIN_KV_BYTES)
        return fail(c, "metadata count %llu at offset %zu cannot fit in the %zu bytes left",
                    (unsigned long long)*n_kv, at + 8, left);
    if (*n_tensors > (left - *n_kv * MIN_KV_BYTES) / MIN_TENSOR_INFO_BYTES)
        return fail(c, "tensor count %llu at offset %zu cannot fit in the %zu bytes left after "
                       "%llu metadata entries", (unsigned long long)*n_tensors, at, left,
                    (unsigned long long)*n_kv);
    return true;
}

static bool parse_kvs(cursor *c, gguf_file *f)
{
    if (!index_init(&f->key_index, f->n_kv)) return fail(c, "out of memory for %lld keys", (long long)f->n_kv);
    for (int64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        size_t at = c->pos, off = 0;
        uint64_t len;
        set_what(c, "metadata %lld", (long long)i);
        if (!read_str(c, &off, &len, "key")) return false;
        if (!(kv->key = copy_name(c, off, len, at, "key"))) return false;
        set_what(c, "metadata %lld '%s' (at offset %zu)", (long long)i, show(kv->key).s, at);
        index_add(&f->key_index, kv->key, i, at);
        if (!parse_value(c, kv)) return false;
    }
    int64_t first;
    const name_entry *dup = index_sort(&f->key_index, &first);
    if (dup) {
        set_what(c, "metadata %lld '%s' (at offset %zu)", (long long)dup->i, show(dup->name).s, dup->off);
        return fail(c, "duplicate key (first defined by metadata %lld)", (long long)first);
    }
    c->what[0] = '\0';
    return true;
}

static bool parse_alignment(cursor *c, gguf_file *f)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = index_find(&f->key_index, ALIGNMENT_KEY);
    if (i < 0) return true;
    set_what(c, "metadata '" ALIGNMENT_KEY "' (value at offset %zu)", f->kv[i].val_off);
    int64_t a;
    if (!value_i64(f, f->kv[i].type, f->kv[i].val_off, &a)) return fail(c, "must be an integer");
    if (a <= 0 || a > (1 << 30) || (a & (a - 1)) != 0)
        return fail(c, "alignment %lld is not a non-zero power of two (at most 2^30)", (long long)a);
    f->alignment = (size_t)a;
    return true;
}

static bool checked_mul(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static bool parse_tensor_info(cursor *c, gguf_file *f, int64_t i)
{
    gguf_tensor *t = &f->tensors[i];
    size_t at = c->pos, off = 0;
    uint64_t len;
    set_what(c, "tensor %lld", (long long)i);
    if (!read_str(c, &off, &len, "name")) return false;
    char *name = copy_name(c, off, len, at, "name");
    if (!name) return false;
    t->name = name;
    set_what(c, "tensor '%s' (info at offset %zu)", show(name).s, at);
    index_add(&f->tensor_index, name, i, at);

    size_t dims_at = c->pos;
    if (!read_u32(c, &t->n_dims, "n_dims")) return false;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return fail(c, "n_dims %u at offset %zu is outside 1..%d", t->n_dims, dims_at, GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        uint64_t ne;
        size_t ne_at = c->pos;
        if (!read_u64(c, &ne, "dimension")) return false;
        if (ne == 0 || ne > INT64_MAX)
            return fail(c, "ne[%u] = %lld at offset %zu must be positive", d, (long long)ne, ne_at);
        if (!checked_mul(n_elems, ne, &n_elems) || n_elems > INT64_MAX)
            return fail(c, "element count overflows at ne[%u] (offset %zu)", d, ne_at);
        t->ne[d] = (int64_t)ne;
    }
    uint32_t type;
    size_t type_at = c->pos;
    if (!read_u32(c, &type, "type")) return false;
    if (!ggml_type_known(type)) return fail(c, "unknown tensor type %u at offset %zu", type, type_at);
    t->type = (ggml_type)type;
    size_t be = ggml_type_block_elems(t->type);
    if (t->ne[0] % (int64_t)be != 0)
        return fail(c, "ne[0] = %lld is not a multiple of the %s block size %zu", (long long)t->ne[0],
                    ggml_type_name(t->type), be);
    uint64_t nbytes;
    if (!checked_mul(n_elems / be, ggml_type_block_bytes(t->type), &nbytes) || nbytes > SIZE_MAX)
        return fail(c, "byte size overflows");
    t->nbytes = (size_t)nbytes;
    size_t off_at = c->pos;
    if (!read_u64(c, &t->offset, "data offset")) return false;
    if (t->offset % f->alignment != 0)
        return fail(c, "data offset %llu (field at %zu) is not a multiple of the alignment %zu",
                    (unsigned long long)t->offset, off_at, f->alignment);
    return true;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Extents are checked in offset order so that overlap needs only neighbour comparisons. */
static bool check_extents(cursor *c, gguf_file *f)
{
    const gguf_tensor **order = malloc((size_t)(f->n_tensors ? f->n_tensors : 1) * sizeof *order);
    if (!order) return fail(c, "out of memory sorting %lld tensors", (long long)f->n_tensors);
    for (int64_t i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_by_offset);
    bool ok = true;
    for (int64_t k = 0; k < f->n_tensors && ok; k++) {
        const gguf_tensor *t = order[k];
        set_what(c, "tensor '%s'", show(t->name).s);
        uint64_t start, end;
        if (__builtin_add_overflow((uint64_t)f->data_off, t->offset, &start) ||
            __builtin_add_overflow(start, (uint64_t)t->nbytes, &end)) {
            ok = fail(c, "data offset %llu + %zu bytes extends past end of file (size %zu)",
                      (unsigned long long)t->offset, t->nbytes, f->size);
        } else if (end > f->size) {
            ok = fail(c, "data [%llu, %llu) extends past end of file (size %zu)",
                      (unsigned long long)start, (unsigned long long)end, f->size);
        } else if (k > 0 && order[k - 1]->offset + order[k - 1]->nbytes > t->offset) {
            const gguf_tensor *p = order[k - 1];
            ok = fail(c, "data [%llu, %llu) overlaps tensor '%s' [%llu, %llu)",
                      (unsigned long long)start, (unsigned long long)end, show(p->name).s,
                      (unsigned long long)(f->data_off + p->offset),
                      (unsigned long long)(f->data_off + p->offset + p->nbytes));
        }
    }
    free(order);
    c->what[0] = '\0';
    return ok;
}

static bool parse_tensors(cursor *c, gguf_file *f)
{
    if (!index_init(&f->tensor_index, f->n_tensors))
        return fail(c, "out of memory for %lld tensors", (long long)f->n_tensors);
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (!parse_tensor_info(c, f, i)) return false;
    int64_t first;
    const name_entry *dup = index_sort(&f->tensor_index, &first);
    if (dup) {
        set_what(c, "tensor '%s' (info at offset %zu)", show(dup->name).s, dup->off);
        return fail(c, "duplicate tensor name (first used by tensor %lld)", (long long)first);
    }
    c->what[0] = '\0';
    /* The data section starts at the next aligned offset; a file without tensors may end
     * before it. */
    size_t pad = (f->alignment - c->pos % f->alignment) % f->alignment;
    if (f->n_tensors > 0 && pad > remaining(c))
        return fail(c, "tensor data section at offset %zu starts past end of file (size %zu)",
                    c->pos + pad, c->size);
    f->data_off = c->pos + (pad <= remaining(c) ? pad : remaining(c));
    if (!check_extents(c, f)) return false;
    for (int64_t i = 0; i < f->n_tensors; i++)
        f->tensors[i].data = f->base + f->data_off + f->tensors[i].offset;
    return true;
}

static gguf_file *parse(const uint8_t *base, size_t size, bool mapped, char *err, size_t errlen)
{
    cursor c = {.base = base, .size = size, .err = err, .errlen = errlen};
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        fail(&c, "out of memory");
        return NULL;
    }
    f->base = base;
    f->size = size;
    uint64_t n_tensors = 0, n_kv = 0;
    bool ok = parse_header(&c, f, &n_tensors, &n_kv);
    if (ok) {
        /* Counts are bounded by the file size above, so these allocations are too. */
        f->kv = calloc((size_t)(n_kv ? n_kv : 1), sizeof *f->kv);
        f->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *f->tensors);
        ok = f->kv && f->tensors ? true : fail(&c, "out of memory for the file's tables");
    }
    if (ok) {
        /* Counts grow as entries are parsed so that gguf_close frees exactly what exists. */
        f->n_kv = (int64_t)n_kv;
        f->n_tensors = (int64_t)n_tensors;
        ok = parse_kvs(&c, f) && parse_alignment(&c, f) && parse_tensors(&c, f);
    }
    f->mapped = mapped;
    if (!ok) {
        f->mapped = false; /* the caller owns the mapping until we succeed */
        gguf_close(f);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open_memory(const void *data, size_t size, char *err, size_t errlen)
{
    if (errlen) err[0] = '\0';
    return parse(data, size, false, err, errlen);
}

/* Turns "msg" into "path: msg" in place, truncating the message if the buffer is short. */
static void prefix_path(char *err, size_t errlen, const char *path)
{
    size_t n = strlen(path) + 2;
    if (errlen <= n + 1) return;
    size_t len = strnlen(err, errlen - 1);
    if (len > errlen - n - 1) len = errlen - n - 1;
    memmove(err + n, err, len);
    err[n + len] = '\0';
    memcpy(err, path, n - 2);
    memcpy(err + n - 2, ": ", 2);
}

/* Reads the whole regular file at fd into memory of its own, then checks that the file did not
 * change while it was read (a copy that is half old, half new is refused). */
static void *read_copy(int fd, const struct stat *st, char *err, size_t errlen)
{
    size_t size = (size_t)st->st_size;
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        snprintf(err, errlen, "cannot allocate %zu bytes to read the model into: %s", size, strerror(errno));
        return NULL;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    size_t done = 0;
    while (done < size) {
        size_t want = size - done < ((size_t)1 << 30) ? size - done : (size_t)1 << 30;
        ssize_t r = pread(fd, (char *)mem + done, want, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r < 0) snprintf(err, errlen, "read: %s", strerror(errno));
            else snprintf(err, errlen, "the file shrank to %zu bytes while it was read (it is being replaced?)", done);
            munmap(mem, size);
            return NULL;
        }
        done += (size_t)r;
    }
    struct stat now;
    if (fstat(fd, &now) != 0 || now.st_size != st->st_size || now.st_mtim.tv_sec != st->st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != st->st_mtim.tv_nsec) {
        snprintf(err, errlen, "the file changed while it was read (it is being replaced?)");
        munmap(mem, size);
        return NULL;
    }
    /* The copy is what counts now: the page cache need not hold the file a second time. */
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    mprotect(mem, size, PROT_READ);
    return mem;
}

/* gguf_open (a mapping of the file) and gguf_load (copy: a copy in memory of its own). */
static gguf_file *open_path(const char *path, bool copy, char *err, size_t errlen)
{
    if (errlen) err[0] = '\0';
    struct stat st;
    char why[128];
    int fd = file_open_regular(path, &st, why, sizeof why);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, why);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        close(fd);
        snprintf(err, errlen, "%s: empty file (a GGUF header is 24 bytes)", path);
        return NULL;
    }
    void *mem;
    if (copy) {
        mem = read_copy(fd, &st, err, errlen);
        close(fd);
        if (!mem) {
            prefix_path(err, errlen, path);
            return NULL;
        }
    } else {
        mem = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd); /* the mapping keeps the file alive */
        if (mem == MAP_FAILED) {
            snprintf(err, errlen, "%s: mmap: %s", path, strerror(errno));
            return NULL;
        }
        /* Metadata is read front to back once; tensor data is paged in later by whoever uses it. */
        madvise(mem, size, MADV_SEQUENTIAL);
    }
    gguf_file *f = parse(mem, size, true, err, errlen);
    if (!f) {
        prefix_path(err, errlen, path);
        munmap(mem, size);
        return NULL;
    }
    if (!copy) madvise(mem, size, MADV_NORMAL);
    f->copied = copy;
    return f;
}

gguf_file *gguf_open(const char *path, char *err, size_t errlen) { return open_path(path, false, err, errlen); }
gguf_file *gguf_load(const char *path, char *err, size_t errlen) { return open_path(path, true, err, errlen); }

size_t gguf_drop_tensor_data(gguf_file *f)
{
    if (!f || !f->copied) return 0;
    long page = sysconf(_SC_PAGESIZE);
    size_t pg = page > 0 ? (size_t)page : 4096;
    size_t from = (f->data_off + pg - 1) / pg * pg, to = f->size / pg * pg;
    if (to <= from) return 0;
    /* Freed, and unreadable: a late reader faults at once instead of reading zeros. */
    madvise((void *)(f->base + from), to - from, MADV_DONTNEED);
    mprotect((void *)(f->base + from), to - from, PROT_NONE);
    return to - from;
}

void gguf_close(gguf_file *f)
{
    if (!f) return;
    if (f->kv)
        for (int64_t i = 0; i < f->n_kv; i++) {
            free(f->kv[i].key);
            free(f->kv[i].str_off);
        }
    if (f->tensors)
        for (int64_t i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    index_free(&f->key_index);
    index_free(&f->tensor_index);
    if (f->mapped) munmap((void *)f->base, f->size);
    free(f);
}

/* ---- accessors ------------------------------------------------------------------------- */

uint32_t gguf_version(const gguf_file *f) { return f->version; }
size_t gguf_alignment(const gguf_file *f) { return f->alignment; }
size_t gguf_file_size(const gguf_file *f) { return f->size; }
size_t gguf_data_offset(const gguf_file *f) { return f->data_off; }
int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
int64_t gguf_find_key(const gguf_file *f, const char *key) { return index_find(&f->key_index, key); }

static const gguf_kv *kv_at(const gguf_file *f, int64_t i)
{
    return i >= 0 && i < f->n_kv ? &f->kv[i] : NULL;
}

const char *gguf_kv_key(const gguf_file *f, int64_t i)
{
    const gguf_kv *kv = kv_at(f, i);
    return kv ? kv->key : NULL;
}

gguf_vtype gguf_kv_type(const gguf_file *f, int64_t i)
{
    const gguf_kv *kv = kv_at(f, i);
    return kv ? kv->type : (gguf_vtype)-1;
}

bool gguf_kv_i64(const gguf_file *f, int64_t i, int64_t *out)
{
    const gguf_kv *kv = kv_at(f, i);
    if (!kv) return false;
    if (kv->type == GGUF_VT_BOOL) {
        *out = f->base[kv->val_off];
        return true;
    }
    return value_i64(f, kv->type, kv->val_off, out);
}

bool gguf_kv_u64(const gguf_file *f, int64_t i, uint64_t *out)
{
    const gguf_kv *kv = kv_at(f, i);
    if (!kv) return false;
    if (kv->type == GGUF_VT_BOOL) {
        *out = f->base[kv->val_off];
        return true;
    }
    int64_t s;
    uint64_t u;
    bool neg;
    if (!scalar_int(f, kv->type, kv->val_off, &s, &u, &neg) || neg) return false;
    *out = u;
    return true;
}

bool gguf_kv_f64(const gguf_file *f, int64_t i, double *out)
{
    const gguf_kv *kv = kv_at(f, i);
    return kv && value_f64(f, kv->type, kv->val_off, out);
}

static const char *str_at(const gguf_file *f, size_t off, size_t *len)
{
    uint64_t n;
    memcpy(&n, f->base + off, 8);
    if (len) *len = (size_t)n;
    return (const char *)f->base + off + 8;
}

const char *gguf_kv_str(const gguf_file *f, int64_t i, size_t *len)
{
    const gguf_kv *kv = kv_at(f, i);
    if (!kv || kv->type != GGUF_VT_STRING) return NULL;
    return str_at(f, kv->val_off, len);
}

bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    int64_t i = gguf_find_key(f, key), v;
    if (i < 0 || !value_i64(f, f->kv[i].type, f->kv[i].val_off, &v) || v < 0 || v > UINT32_MAX) {
        /* a uint64 above INT64_MAX cannot fit either */
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    int64_t i = gguf_find_key(f, key);
    return i >= 0 && value_i64(f, f->kv[i].type, f->kv[i].val_off, out);
}

bool gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    int64_t i = gguf_find_key(f, key);
    double v;
    if (i < 0 || !value_f64(f, f->kv[i].type, f->kv[i].val_off, &v)) return false;
    *out = (float)v;
    return true;
}

bool gguf_get_bool(const gguf_file *f, const char *key, bool *out)
{
    int64_t i = gguf_find_key(f, key);
    if (i < 0 || f->kv[i].type != GGUF_VT_BOOL) return false;
    *out = f->base[f->kv[i].val_off] != 0;
    return true;
}

const char *gguf_get_str(const gguf_file *f, const char *key, size_t *len)
{
    return gguf_kv_str(f, gguf_find_key(f, key), len);
}

static const gguf_kv *arr_at(const gguf_file *f, int64_t i)
{
    const gguf_kv *kv = kv_at(f, i);
    return kv && kv->type == GGUF_VT_ARRAY ? kv : NULL;
}

gguf_vtype gguf_arr_type(const gguf_file *f, int64_t i)
{
    const gguf_kv *kv = arr_at(f, i);
    return kv ? kv->arr_type : (gguf_vtype)-1;
}

uint64_t gguf_arr_len(const gguf_file *f, int64_t i)
{
    const gguf_kv *kv = arr_at(f, i);
    return kv ? kv->arr_len : 0;
}

const void *gguf_arr_data(const gguf_file *f, int64_t i)
{
    const gguf_kv *kv = arr_at(f, i);
    return kv && kv->arr_type != GGUF_VT_STRING ? f->base + kv->val_off : NULL;
}

const char *gguf_arr_str(const gguf_file *f, int64_t i, uint64_t j, size_t *len)
{
    const gguf_kv *kv = arr_at(f, i);
    if (!kv || kv->arr_type != GGUF_VT_STRING || j >= kv->arr_len) return NULL;
    return str_at(f, kv->str_off[j], len);
}

/* Offset of numeric element j, or 0 (never a valid element offset) when there is none. */
static size_t arr_elem(const gguf_file *f, int64_t i, uint64_t j)
{
    const gguf_kv *kv = arr_at(f, i);
    if (!kv || j >= kv->arr_len || gguf_vtype_size(kv->arr_type) == 0) return 0;
    return kv->val_off + (size_t)j * gguf_vtype_size(kv->arr_type);
}

bool gguf_arr_f32(const gguf_file *f, int64_t i, uint64_t j, float *out)
{
    size_t off = arr_elem(f, i, j);
    double v;
    if (!off || !value_f64(f, f->kv[i].arr_type, off, &v)) return false;
    *out = (float)v;
    return true;
}

bool gguf_arr_i64(const gguf_file *f, int64_t i, uint64_t j, int64_t *out)
{
    size_t off = arr_elem(f, i, j);
    if (!off) return false;
    if (f->kv[i].arr_type == GGUF_VT_BOOL) {
        *out = f->base[off];
        return true;
    }
    return value_i64(f, f->kv[i].arr_type, off, out);
}

int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i)
{
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    return gguf_tensor_at(f, index_find(&f->tensor_index, name));
}
