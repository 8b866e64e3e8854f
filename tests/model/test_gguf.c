/* test_gguf.c - GGUF writer -> reader round trips, hostile files, and the real files in
 * ../shared (stories260K and the tokenizer vocabularies). */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/cli.h"
#include "model/gguf.h"
#include "synth/gguf_write.h"

/* ---- helpers ------------------------------------------------------------------------- */

typedef struct blob {
    uint8_t *p;
    size_t n;
} blob;

static blob serialise(gguf_writer *w)
{
    blob b;
    void *p;
    assert_int_equal(gguf_writer_write_mem(w, &p, &b.n), 0);
    b.p = p;
    gguf_writer_free(w);
    return b;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Opening must fail and the message must contain every fragment given. */
static void expect_refused(const blob *b, ...)
{
    char err[512];
    /* An exact-size copy, so that ASan sees any read past the end. */
    uint8_t *copy = malloc(b->n ? b->n : 1);
    memcpy(copy, b->p, b->n);
    gguf_file *f = gguf_open_memory(copy, b->n, err, sizeof err);
    if (f) {
        gguf_close(f);
        free(copy);
        fail_msg("hostile file was accepted");
    }
    va_list ap;
    va_start(ap, b);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        if (!strstr(err, frag)) fail_msg("error \"%s\" lacks \"%s\"", err, frag);
    va_end(ap);
    free(copy);
}

static gguf_file *open_blob(const blob *b)
{
    char err[512];
    gguf_file *f = gguf_open_memory(b->p, b->n, err, sizeof err);
    if (!f) fail_msg("open failed: %s", err);
    return f;
}

/* File offset of the length prefix of the first string `s` stored in the blob. */
static size_t find_string(const blob *b, const char *s)
{
    uint64_t len = strlen(s);
    for (size_t i = 0; i + 8 + len <= b->n; i++)
        if (memcmp(b->p + i, &len, 8) == 0 && memcmp(b->p + i + 8, s, len) == 0) return i;
    fail_msg("string '%s' not in blob", s);
    return 0;
}

static void put_u32(blob *b, size_t off, uint32_t v) { memcpy(b->p + off, &v, 4); }
static void put_u64(blob *b, size_t off, uint64_t v) { memcpy(b->p + off, &v, 8); }

/* Offsets of the fields of a tensor info found by name. */
typedef struct info_at {
    size_t name, n_dims, ne, type, offset;
} info_at;

static info_at locate_info(const blob *b, const char *name)
{
    info_at a;
    a.name = find_string(b, name);
    a.n_dims = a.name + 8 + strlen(name);
    uint32_t n_dims;
    memcpy(&n_dims, b->p + a.n_dims, 4);
    a.ne = a.n_dims + 4;
    a.type = a.ne + 8 * n_dims;
    a.offset = a.type + 4;
    return a;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    static char bufs[4][256];
    static int k;
    char *b = bufs[k++ & 3];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, sizeof bufs[0], f, ap);
    va_end(ap);
    return b;
}

/* A small model: two tensors and some metadata. */
static const int64_t NE_A[2] = {8, 3};
static const int64_t NE_B[1] = {64};

static gguf_writer *small_writer(void)
{
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.block_count", 2);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    const char *toks[] = {"<s>", "a", "bc"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    float a[24];
    for (int i = 0; i < 24; i++) a[i] = (float)i * 0.5f;
    gguf_writer_add_tensor(w, "tok.weight", GGML_TYPE_F32, 2, NE_A, a, sizeof a, false);
    uint8_t q[2 * 34];
    for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)(i * 7);
    gguf_writer_add_tensor(w, "blk.0.q", GGML_TYPE_Q8_0, 1, NE_B, q, sizeof q, false);
    return w;
}

/* ---- round trips ---------------------------------------------------------------------- */

static void test_round_trip_scalars(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_new();
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    uint32_t u32 = 4000000000u; int32_t i32 = -2000000000; float f32 = 1.5f; uint8_t bt = 1;
    uint64_t u64 = UINT64_MAX; int64_t i64 = INT64_MIN; double f64 = -2.25;
    gguf_writer_set_raw(w, "u8", GGUF_VT_UINT8, 0, &u8, 1);
    gguf_writer_set_raw(w, "i8", GGUF_VT_INT8, 0, &i8, 1);
    gguf_writer_set_raw(w, "u16", GGUF_VT_UINT16, 0, &u16, 1);
    gguf_writer_set_raw(w, "i16", GGUF_VT_INT16, 0, &i16, 1);
    gguf_writer_set_raw(w, "u32", GGUF_VT_UINT32, 0, &u32, 1);
    gguf_writer_set_raw(w, "i32", GGUF_VT_INT32, 0, &i32, 1);
    gguf_writer_set_raw(w, "f32", GGUF_VT_FLOAT32, 0, &f32, 1);
    gguf_writer_set_raw(w, "bool", GGUF_VT_BOOL, 0, &bt, 1);
    gguf_writer_set_raw(w, "str", GGUF_VT_STRING, 0, "a\0b", 3);
    gguf_writer_set_raw(w, "u64", GGUF_VT_UINT64, 0, &u64, 1);
    gguf_writer_set_raw(w, "i64", GGUF_VT_INT64, 0, &i64, 1);
    gguf_writer_set_raw(w, "f64", GGUF_VT_FLOAT64, 0, &f64, 1);
    gguf_writer_set_u32(w, "set.u32", 7);
    gguf_writer_set_u32(w, "set.u32", 8); /* replaces */
    gguf_writer_set_i32(w, "set.i32", -5);
    gguf_writer_set_u64(w, "set.u64", 1ull << 40);
    gguf_writer_set_bool(w, "set.bool", false);
    gguf_writer_set_str(w, "set.str", "hello");
    blob b = serialise(w);
    gguf_file *f = open_blob(&b);

    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_n_kv(f), 17);
    assert_int_equal(gguf_n_tensors(f), 0);
    const char *keys[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "u64", "i64", "f64"};
    const gguf_vtype types[] = {GGUF_VT_UINT8,  GGUF_VT_INT8,   GGUF_VT_UINT16, GGUF_VT_INT16,
                                GGUF_VT_UINT32, GGUF_VT_INT32,  GGUF_VT_FLOAT32, GGUF_VT_BOOL,
                                GGUF_VT_STRING, GGUF_VT_UINT64, GGUF_VT_INT64,  GGUF_VT_FLOAT64};
    for (int i = 0; i < 12; i++) {
        assert_int_equal(gguf_find_key(f, keys[i]), i);
        assert_string_equal(gguf_kv_key(f, i), keys[i]);
        assert_int_equal(gguf_kv_type(f, i), types[i]);
    }
    int64_t s; uint64_t u; double d; uint32_t v32; float x; bool bl; size_t len;
    assert_true(gguf_kv_u64(f, 0, &u)); assert_int_equal(u, 200);
    assert_true(gguf_kv_i64(f, 1, &s)); assert_int_equal(s, -100);
    assert_false(gguf_kv_u64(f, 1, &u)); /* negative */
    assert_true(gguf_kv_i64(f, 2, &s)); assert_int_equal(s, 60000);
    assert_true(gguf_kv_i64(f, 3, &s)); assert_int_equal(s, -30000);
    assert_true(gguf_get_u32(f, "u32", &v32)); assert_int_equal(v32, 4000000000u);
    assert_true(gguf_get_i64(f, "i32", &s)); assert_int_equal(s, -2000000000);
    assert_false(gguf_get_u32(f, "i32", &v32)); /* does not fit */
    assert_true(gguf_get_f32(f, "f32", &x)); assert_true(x == 1.5f);
    assert_false(gguf_get_u32(f, "f32", &v32));
    assert_true(gguf_get_bool(f, "bool", &bl)); assert_true(bl);
    assert_true(gguf_kv_i64(f, 7, &s)); assert_int_equal(s, 1);
    assert_false(gguf_get_i64(f, "bool", &s)); /* bool is not an integer to the typed getters */
    const char *str = gguf_get_str(f, "str", &len);
    assert_int_equal(len, 3);
    assert_memory_equal(str, "a\0b", 3);
    assert_null(gguf_get_str(f, "u8", &len));
    assert_true(gguf_kv_u64(f, 9, &u)); assert_true(u == UINT64_MAX);
    assert_false(gguf_get_i64(f, "u64", &s)); /* above INT64_MAX */
    assert_false(gguf_get_u32(f, "u64", &v32));
    assert_true(gguf_get_i64(f, "i64", &s)); assert_true(s == INT64_MIN);
    assert_true(gguf_kv_f64(f, 11, &d)); assert_true(d == -2.25);
    assert_true(gguf_get_f32(f, "f64", &x)); assert_true(x == -2.25f);
    assert_true(gguf_get_f32(f, "u16", &x)); assert_true(x == 60000.0f); /* ints convert */
    assert_true(gguf_get_u32(f, "set.u32", &v32)); assert_int_equal(v32, 8);
    assert_true(gguf_get_i64(f, "set.i32", &s)); assert_int_equal(s, -5);
    assert_true(gguf_get_i64(f, "set.u64", &s)); assert_int_equal(s, 1ll << 40);
    assert_true(gguf_get_bool(f, "set.bool", &bl)); assert_false(bl);
    str = gguf_get_str(f, "set.str", &len);
    assert_int_equal(len, 5);
    assert_memory_equal(str, "hello", 5);
    /* absent keys and out-of-range indices */
    assert_int_equal(gguf_find_key(f, "nope"), -1);
    assert_false(gguf_get_u32(f, "nope", &v32));
    assert_null(gguf_kv_key(f, 17));
    assert_null(gguf_kv_key(f, -1));
    assert_false(gguf_kv_i64(f, 99, &s));
    assert_int_equal(gguf_arr_len(f, 0), 0); /* not an array */
    assert_null(gguf_arr_data(f, 0));
    gguf_close(f);
    free(b.p);
}

static void test_round_trip_arrays(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_new();
    /* 8 bytes of pattern per element type, read back with the element's own width */
    static const gguf_vtype numeric[] = {GGUF_VT_UINT8,  GGUF_VT_INT8,  GGUF_VT_UINT16, GGUF_VT_INT16,
                                         GGUF_VT_UINT32, GGUF_VT_INT32, GGUF_VT_FLOAT32, GGUF_VT_BOOL,
                                         GGUF_VT_UINT64, GGUF_VT_INT64, GGUF_VT_FLOAT64};
    static const size_t width[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};
    uint8_t raw[5 * 8];
    for (size_t i = 0; i < sizeof raw; i++) raw[i] = (uint8_t)(i * 37 + 1);
    uint8_t bools[5] = {1, 0, 1, 1, 0};
    for (size_t k = 0; k < 11; k++)
        gguf_writer_set_raw(w, fmt("arr.%zu", k), GGUF_VT_ARRAY, numeric[k],
                            numeric[k] == GGUF_VT_BOOL ? bools : raw, 5);
    float fv[3] = {0.25f, -1.0f, 3e9f};
    int32_t iv[4] = {-1, 0, 1, INT32_MAX};
    const char *sv[] = {"", "x", "two words", "\xe2\x82\xac"};
    gguf_writer_set_arr_f32(w, "f", fv, 3);
    gguf_writer_set_arr_i32(w, "i", iv, 4);
    gguf_writer_set_arr_str(w, "s", sv, 4);
    gguf_writer_set_arr_str(w, "empty", sv, 0);
    blob b = serialise(w);
    gguf_file *f = open_blob(&b);

    for (size_t k = 0; k < 11; k++) {
        int64_t i = gguf_find_key(f, fmt("arr.%zu", k));
        assert_true(i >= 0);
        assert_int_equal(gguf_kv_type(f, i), GGUF_VT_ARRAY);
        assert_int_equal(gguf_arr_type(f, i), numeric[k]);
        assert_int_equal(gguf_arr_len(f, i), 5);
        const uint8_t *want = numeric[k] == GGUF_VT_BOOL ? bools : raw;
        assert_memory_equal(gguf_arr_data(f, i), want, 5 * width[k]);
        assert_null(gguf_arr_str(f, i, 0, NULL));
        int64_t v;
        assert_false(gguf_arr_i64(f, i, 5, &v)); /* out of range */
    }
    int64_t i = gguf_find_key(f, "f");
    float x;
    for (uint64_t j = 0; j < 3; j++) {
        assert_true(gguf_arr_f32(f, i, j, &x));
        assert_true(x == fv[j]);
    }
    assert_false(gguf_arr_f32(f, i, 3, &x));
    i = gguf_find_key(f, "i");
    int64_t v;
    for (uint64_t j = 0; j < 4; j++) {
        assert_true(gguf_arr_i64(f, i, j, &v));
        assert_int_equal(v, iv[j]);
    }
    assert_true(gguf_arr_f32(f, i, 0, &x));
    assert_true(x == -1.0f);
    i = gguf_find_key(f, "s");
    assert_int_equal(gguf_arr_type(f, i), GGUF_VT_STRING);
    assert_int_equal(gguf_arr_len(f, i), 4);
    assert_null(gguf_arr_data(f, i));
    for (uint64_t j = 0; j < 4; j++) {
        size_t len;
        const char *s = gguf_arr_str(f, i, j, &len);
        assert_non_null(s);
        assert_int_equal(len, strlen(sv[j]));
        assert_memory_equal(s, sv[j], len);
    }
    assert_null(gguf_arr_str(f, i, 4, NULL));
    assert_false(gguf_arr_i64(f, i, 0, &v));
    assert_int_equal(gguf_arr_len(f, gguf_find_key(f, "empty")), 0);
    gguf_close(f);
    free(b.p);
}

static void fill_pattern(void *ctx, size_t off, void *dst, size_t len)
{
    size_t *calls = ctx;
    (*calls)++;
    uint8_t *p = dst;
    for (size_t i = 0; i < len; i++) p[i] = (uint8_t)((off + i) * 131 >> 3);
}

static void check_tensors(gguf_file *f, size_t align, size_t fill_bytes)
{
    assert_int_equal(gguf_alignment(f), align);
    assert_int_equal(gguf_data_offset(f) % align, 0);
    assert_int_equal(gguf_n_tensors(f), 3);
    const gguf_tensor *a = gguf_find_tensor(f, "tok.weight");
    assert_non_null(a);
    assert_ptr_equal(a, gguf_tensor_at(f, 0));
    assert_int_equal(a->type, GGML_TYPE_F32);
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->ne[0], 8);
    assert_int_equal(a->ne[1], 3);
    assert_int_equal(a->ne[2], 1);
    assert_int_equal(a->ne[3], 1);
    assert_int_equal(a->nbytes, 96);
    assert_int_equal(a->offset, 0);
    for (int i = 0; i < 24; i++) {
        float v;
        memcpy(&v, (const uint8_t *)a->data + 4 * i, 4);
        assert_true(v == (float)i * 0.5f);
    }
    const gguf_tensor *q = gguf_find_tensor(f, "blk.0.q");
    assert_int_equal(q->type, GGML_TYPE_Q8_0);
    assert_int_equal(q->nbytes, 68);
    assert_int_equal(q->offset % align, 0);
    assert_true(q->offset >= 96);
    for (size_t i = 0; i < 68; i++) assert_int_equal(((const uint8_t *)q->data)[i], (uint8_t)(i * 7));
    const gguf_tensor *big = gguf_find_tensor(f, "big");
    assert_int_equal(big->nbytes, fill_bytes);
    assert_int_equal(big->offset % align, 0);
    const uint8_t *p = big->data;
    for (size_t i = 0; i < fill_bytes; i += 4093) assert_int_equal(p[i], (uint8_t)(i * 131 >> 3));
    assert_int_equal(p[fill_bytes - 1], (uint8_t)((fill_bytes - 1) * 131 >> 3));
    assert_null(gguf_find_tensor(f, "absent"));
    assert_null(gguf_tensor_at(f, 3));
}

/* Tensors, alignment and the chunked fill through memory and through a file. */
static void test_round_trip_tensors(void **state)
{
    (void)state;
    /* 2304 rows of 1024 floats = 9 MiB: the fill callback runs in 3 chunks */
    const int64_t ne_big[2] = {1024, 2304};
    const size_t big_bytes = 1024u * 2304u * 4u;
    size_t calls = 0;
    gguf_writer *w = small_writer();
    gguf_writer_add_tensor_fill(w, "big", GGML_TYPE_F32, 2, ne_big, fill_pattern, &calls);
    blob b = serialise(w);
    assert_int_equal(calls, 3);
    gguf_file *f = open_blob(&b);
    check_tensors(f, 32, big_bytes);
    assert_int_equal(gguf_file_size(f), b.n);
    gguf_close(f);
    free(b.p);

    char dir[] = "/tmp/test_gguf_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    w = small_writer();
    gguf_writer_set_u32(w, "general.alignment", 256);
    calls = 0;
    gguf_writer_add_tensor_fill(w, "big", GGML_TYPE_F32, 2, ne_big, fill_pattern, &calls);
    assert_int_equal(gguf_writer_write_file(w, path, err, sizeof err), 0);
    gguf_writer_free(w);
    f = gguf_open(path, err, sizeof err);
    if (!f) fail_msg("%s", err);
    check_tensors(f, 256, big_bytes);
    gguf_close(f);
    /* gguf_load: a copy that the file's truncation cannot reach (issue 36); its tensor data can
     * be let go while the metadata stays */
    f = gguf_load(path, err, sizeof err);
    if (!f) fail_msg("%s", err);
    assert_int_equal(truncate(path, 0), 0);
    check_tensors(f, 256, big_bytes);
    assert_true(gguf_drop_tensor_data(f) >= big_bytes - 2 * 4096);
    assert_int_equal(gguf_n_tensors(f), 3);
    assert_non_null(gguf_find_tensor(f, "big"));
    assert_int_equal(gguf_alignment(f), 256);
    gguf_close(f);
    assert_null(gguf_load(path, err, sizeof err));
    assert_non_null(strstr(err, "empty file"));
    /* only the final file remains: the temporary was renamed */
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') {
            assert_string_equal(e->d_name, "m.gguf");
            entries++;
        }
    closedir(d);
    assert_int_equal(entries, 1);
    unlink(path);
    /* a fill tensor whose shape is not whole blocks cannot be written */
    w = gguf_writer_new();
    const int64_t bad[1] = {33};
    gguf_writer_add_tensor_fill(w, "odd", GGML_TYPE_Q4_0, 1, bad, fill_pattern, &calls);
    assert_int_not_equal(gguf_writer_write_file(w, path, err, sizeof err), 0);
    assert_non_null(strstr(err, "'odd'"));
    assert_int_equal(access(path, F_OK), -1);
    gguf_writer_free(w);
    rmdir(dir);
}

static void test_version_2_accepted(void **state)
{
    (void)state;
    blob b = serialise(small_writer());
    put_u32(&b, 4, 2);
    gguf_file *f = open_blob(&b);
    assert_int_equal(gguf_version(f), 2);
    gguf_close(f);
    free(b.p);
}

/* ---- hostile files ---------------------------------------------------------------------- */

static void test_every_truncation_fails_cleanly(void **state)
{
    (void)state;
    blob b = serialise(small_writer());
    for (size_t n = 0; n < b.n; n++) {
        blob t = {b.p, n};
        expect_refused(&t, NULL);
    }
    /* the full file still opens */
    gguf_close(open_blob(&b));
    /* a truncated field is named, with its offset */
    info_at q = locate_info(&b, "blk.0.q");
    blob t = {b.p, q.ne + 3};
    expect_refused(&t, fmt("tensor 'blk.0.q' (info at offset %zu)", q.name),
                   fmt("dimension at offset %zu: needs 8 bytes but the file ends at %zu (truncated)", q.ne, q.ne + 3),
                   NULL);
    free(b.p);
}

static void test_bad_magic_and_version(void **state)
{
    (void)state;
    blob b = serialise(small_writer());
    memcpy(b.p, "GGML", 4);
    expect_refused(&b, "bad magic at offset 0", NULL);
    memcpy(b.p, "GGUF", 4);
    put_u32(&b, 4, 1);
    expect_refused(&b, "version 1", "not supported", NULL);
    put_u32(&b, 4, 4);
    expect_refused(&b, "unsupported GGUF version 4", NULL);
    put_u32(&b, 4, 3u << 24); /* a big-endian v3 file */
    expect_refused(&b, "big-endian", NULL);
    free(b.p);
}

static void test_counts_that_cannot_fit(void **state)
{
    (void)state;
    blob b = serialise(small_writer());
    uint64_t n_kv;
    memcpy(&n_kv, b.p + 16, 8);
    put_u64(&b, 16, UINT64_MAX / 2);
    expect_refused(&b, "metadata count", "offset 16", "cannot fit", NULL);
    put_u64(&b, 16, n_kv);
    put_u64(&b, 8, b.n / 32 + 1);
    expect_refused(&b, "tensor count", "offset 8", "cannot fit", NULL);
    free(b.p);
}

static void test_string_and_array_lengths(void **state)
{
    (void)state;
    blob b = serialise(small_writer());
    size_t key = find_string(&b, "llama.block_count");
    put_u64(&b, key, 1ull << 40);
    expect_refused(&b, "metadata 1", fmt("key at offset %zu", key), "string length 1099511627776",
                   "past end of file", NULL);
    free(b.p);

    b = serialise(small_writer());
    size_t val = find_string(&b, "general.architecture") + 8 + 20 + 4;
    put_u64(&b, val, b.n);
    expect_refused(&b, "'general.architecture'", fmt("string value at offset %zu", val), NULL);
    free(b.p);

    /* string array: claimed count larger than the bytes could hold */
    b = serialise(small_writer());
    size_t arr = find_string(&b, "tokenizer.ggml.tokens") + 8 + 21 + 4;
    put_u64(&b, arr + 4, 1ull << 61);
    expect_refused(&b, "'tokenizer.ggml.tokens'", "strings cannot fit", NULL);
    /* one element's length past the end */
    put_u64(&b, arr + 4, 3);
    size_t el = find_string(&b, "bc");
    put_u64(&b, el, 1ull << 33);
    expect_refused(&b, "'tokenizer.ggml.tokens'", fmt("array element 2 at offset %zu", el),
                   "past end of file", NULL);
    free(b.p);

    /* numeric array: count * width past the end, including a product that would wrap */
    gguf_writer *w = gguf_writer_new();
    float v[4] = {0};
    gguf_writer_set_arr_f32(w, "scores", v, 4);
    b = serialise(w);
    size_t cnt = find_string(&b, "scores") + 8 + 6 + 4 + 4;
    put_u64(&b, cnt, 5);
    expect_refused(&b, "'scores'", "array of 5 x 4-byte elements", "past end of file", NULL);
    put_u64(&b, cnt, (UINT64_MAX / 4) + 2);
    expect_refused(&b, "'scores'", "past end of file", NULL);
    free(b.p);
}

static void test_bad_values(void **state)
{
    (void)state;
    uint32_t x = 0;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_raw(w, "weird", (gguf_vtype)13, 0, &x, 0);
    blob b = serialise(w);
    expect_refused(&b, "'weird'", "unknown value type 13", NULL);
    free(b.p);

    w = gguf_writer_new();
    gguf_writer_set_raw(w, "nested", GGUF_VT_ARRAY, GGUF_VT_ARRAY, NULL, 2);
    b = serialise(w);
    expect_refused(&b, "'nested'", "arrays of arrays", NULL);
    free(b.p);

    w = gguf_writer_new();
    gguf_writer_set_raw(w, "arr", GGUF_VT_ARRAY, (gguf_vtype)77, NULL, 2);
    b = serialise(w);
    expect_refused(&b, "'arr'", "unknown array element type 77", NULL);
    free(b.p);

    uint8_t two = 2;
    w = gguf_writer_new();
    gguf_writer_set_raw(w, "flag", GGUF_VT_BOOL, 0, &two, 1);
    b = serialise(w);
    expect_refused(&b, "'flag'", "bool value 2", NULL);
    free(b.p);

    w = gguf_writer_new();
    gguf_writer_set_u32(w, "a.x", 1);
    gguf_writer_set_u32(w, "a.y", 2);
    b = serialise(w);
    size_t y = find_string(&b, "a.y");
    b.p[y + 8 + 2] = 'x';
    expect_refused(&b, "metadata 1 'a.x'", fmt("at offset %zu", y), "duplicate key", NULL);
    b.p[y + 8 + 1] = '\0';
    expect_refused(&b, "metadata 1", "contains a NUL byte", NULL);
    put_u64(&b, y, 0);
    expect_refused(&b, "metadata 1", fmt("key at offset %zu is empty", y), NULL);
    free(b.p);

    /* control bytes of a hostile name never reach the message */
    w = gguf_writer_new();
    gguf_writer_set_u32(w, "k\x1b[2J1", 1);
    gguf_writer_set_u32(w, "k\x1b[2J2", 2);
    b = serialise(w);
    y = find_string(&b, "k\x1b[2J2");
    b.p[y + 8 + 5] = '1';
    expect_refused(&b, "metadata 1 'k?[2J1'", "duplicate key", NULL);
    free(b.p);
}

static void test_alignment_key(void **state)
{
    (void)state;
    const uint32_t bad[] = {0, 48, 1u << 31};
    for (size_t i = 0; i < 3; i++) {
        gguf_writer *w = small_writer();
        gguf_writer_set_u32(w, "general.alignment", bad[i]);
        blob b = serialise(w);
        expect_refused(&b, "'general.alignment'", fmt("alignment %u is not a non-zero power of two", bad[i]), NULL);
        free(b.p);
    }
    gguf_writer *w = small_writer();
    gguf_writer_set_f32(w, "general.alignment", 32.0f);
    blob b = serialise(w);
    expect_refused(&b, "'general.alignment'", "must be an integer", NULL);
    free(b.p);
    /* 1 is a power of two: no padding at all */
    w = small_writer();
    gguf_writer_set_u32(w, "general.alignment", 1);
    b = serialise(w);
    gguf_file *f = open_blob(&b);
    assert_int_equal(gguf_alignment(f), 1);
    assert_int_equal(gguf_find_tensor(f, "blk.0.q")->offset, 96);
    gguf_close(f);
    free(b.p);
}

static void test_bad_tensor_shapes(void **state)
{
    (void)state;
    blob b = serialise(small_writer());
    info_at a = locate_info(&b, "tok.weight");
    char who[128];
    snprintf(who, sizeof who, "tensor 'tok.weight' (info at offset %zu)", a.name);
    put_u32(&b, a.n_dims, 5);
    expect_refused(&b, who, fmt("n_dims 5 at offset %zu", a.n_dims), NULL);
    put_u32(&b, a.n_dims, 0);
    expect_refused(&b, who, "n_dims 0", NULL);
    put_u32(&b, a.n_dims, 2);
    put_u64(&b, a.ne + 8, 0);
    expect_refused(&b, who, fmt("ne[1] = 0 at offset %zu must be positive", a.ne + 8), NULL);
    put_u64(&b, a.ne + 8, (uint64_t)-3);
    expect_refused(&b, who, "ne[1] = -3", NULL);
    put_u64(&b, a.ne, 1ull << 32);
    put_u64(&b, a.ne + 8, 1ull << 32);
    expect_refused(&b, who, "element count overflows at ne[1]", NULL);
    /* fits in elements, but the byte size wraps */
    put_u64(&b, a.ne, 1ull << 31);
    put_u64(&b, a.ne + 8, 1ull << 31);
    expect_refused(&b, who, "byte size overflows", NULL);
    put_u64(&b, a.ne, 8);
    put_u64(&b, a.ne + 8, 3);
    put_u32(&b, a.type, 99);
    expect_refused(&b, who, fmt("unknown tensor type 99 at offset %zu", a.type), NULL);
    put_u32(&b, a.type, 4); /* retired Q4_2 */
    expect_refused(&b, who, "unknown tensor type 4", NULL);
    put_u32(&b, a.type, GGML_TYPE_Q4_K);
    expect_refused(&b, who, "ne[0] = 8 is not a multiple of the Q4_K block size 256", NULL);
    free(b.p);
}

static void test_bad_tensor_placement(void **state)
{
    (void)state;
    blob b = serialise(small_writer());
    info_at q = locate_info(&b, "blk.0.q");
    gguf_file *f = open_blob(&b);
    size_t data_off = gguf_data_offset(f);
    gguf_close(f);
    char who[128];
    snprintf(who, sizeof who, "tensor 'blk.0.q' (info at offset %zu)", q.name);
    put_u64(&b, q.offset, 100);
    expect_refused(&b, who, fmt("data offset 100 (field at %zu) is not a multiple of the alignment 32", q.offset), NULL);
    put_u64(&b, q.offset, 64); /* tok.weight is [0, 96) */
    expect_refused(&b, "tensor 'blk.0.q'", fmt("data [%zu, %zu) overlaps tensor 'tok.weight' [%zu, %zu)",
                                               data_off + 64, data_off + 132, data_off, data_off + 96), NULL);
    put_u64(&b, q.offset, 128);
    expect_refused(&b, "tensor 'blk.0.q'", fmt("data [%zu, %zu) extends past end of file (size %zu)",
                                               data_off + 128, data_off + 196, b.n), NULL);
    put_u64(&b, q.offset, UINT64_MAX - 31);
    expect_refused(&b, "tensor 'blk.0.q'", "extends past end of file", NULL);
    /* the file ends right after the tensor infos */
    blob t = {b.p, q.offset + 8};
    expect_refused(&t, "past end of file", NULL);
    free(b.p);

    /* duplicate tensor names */
    gguf_writer *w = gguf_writer_new();
    float v[4] = {0};
    const int64_t ne[1] = {4};
    gguf_writer_add_tensor(w, "t.a", GGML_TYPE_F32, 1, ne, v, sizeof v, true);
    gguf_writer_add_tensor(w, "t.b", GGML_TYPE_F32, 1, ne, v, sizeof v, true);
    b = serialise(w);
    size_t n = find_string(&b, "t.b");
    b.p[n + 8 + 2] = 'a';
    expect_refused(&b, fmt("tensor 't.a' (info at offset %zu)", n), "duplicate tensor name (first used by tensor 0)", NULL);
    free(b.p);
}

/* Random corruption must only ever produce clean refusals (run under ASan/UBSan in CI). */
static void test_random_corruption(void **state)
{
    (void)state;
    blob good = serialise(small_writer());
    uint8_t *p = malloc(good.n);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int refused = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(p, good.p, good.n);
        for (int k = 0; k < 1 + iter % 4; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t at = (size_t)(rng % good.n);
            p[at] = (uint8_t)(rng >> 40);
        }
        char err[256];
        gguf_file *f = gguf_open_memory(p, good.n, err, sizeof err);
        if (!f) {
            assert_true(err[0] != '\0');
            refused++;
            continue;
        }
        /* accepted: walk everything the accessors expose */
        for (int64_t i = 0; i < gguf_n_kv(f); i++)
            for (uint64_t j = 0; j < gguf_arr_len(f, i); j++) {
                size_t len = 0;
                const char *s = gguf_arr_str(f, i, j, &len);
                if (s) assert_true((const uint8_t *)s + len <= p + good.n);
            }
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            assert_true((const uint8_t *)t->data + t->nbytes <= p + good.n);
        }
        gguf_close(f);
    }
    assert_true(refused > 100);
    free(p);
    free(good.p);
}

/* ---- scale ---------------------------------------------------------------------------- */

/* A 150k-token vocabulary opens quickly and its strings are indexed. */
static void test_large_vocab(void **state)
{
    (void)state;
    enum { N = 150000 };
    char **toks = malloc(N * sizeof *toks);
    for (int i = 0; i < N; i++) {
        toks[i] = malloc(16);
        snprintf(toks[i], 16, "tok%d", i);
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, N);
    blob b = serialise(w);
    double t0 = now_s();
    gguf_file *f = open_blob(&b);
    double dt = now_s() - t0;
    print_message("open of a %d-string vocabulary: %.2f ms\n", N, dt * 1e3);
    assert_true(dt < 0.5);
    int64_t k = gguf_find_key(f, "tokenizer.ggml.tokens");
    for (int i = 0; i < N; i += 997) {
        size_t len;
        const char *s = gguf_arr_str(f, k, (uint64_t)i, &len);
        assert_int_equal(len, strlen(toks[i]));
        assert_memory_equal(s, toks[i], len);
    }
    gguf_close(f);
    free(b.p);
    for (int i = 0; i < N; i++) free(toks[i]);
    free(toks);
}

/* Opening touches metadata only: a 4 GiB (sparse) model opens in milliseconds. */
static void test_large_file_opens_fast(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    float v[256] = {0};
    const int64_t ne[2] = {256, 1};
    gguf_writer_add_tensor(w, "w0", GGML_TYPE_F32, 2, ne, v, sizeof v, true);
    gguf_writer_add_tensor(w, "w1", GGML_TYPE_F32, 2, ne, v, sizeof v, true);
    blob b = serialise(w);
    /* grow both tensors to 2 GiB (256 x 2^21 floats) and extend the file sparsely */
    const uint64_t rows = 1u << 21, bytes = 256 * 4 * rows;
    info_at a0 = locate_info(&b, "w0"), a1 = locate_info(&b, "w1");
    put_u64(&b, a0.ne + 8, rows);
    put_u64(&b, a1.ne + 8, rows);
    put_u64(&b, a1.offset, bytes);
    char path[] = "/tmp/test_gguf_big_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t data_off = b.n - 2 * sizeof v;
    assert_int_equal(write(fd, b.p, data_off), (ssize_t)data_off);
    if (ftruncate(fd, (off_t)(data_off + 2 * bytes)) != 0) {
        close(fd);
        unlink(path);
        free(b.p);
        skip();
    }
    close(fd);
    char err[512];
    double t0 = now_s();
    gguf_file *f = gguf_open(path, err, sizeof err);
    double dt = now_s() - t0;
    unlink(path);
    if (!f) fail_msg("%s", err);
    print_message("open of a 4 GiB model: %.3f ms\n", dt * 1e3);
    assert_true(dt < 0.25);
    assert_int_equal(gguf_find_tensor(f, "w1")->nbytes, bytes);
    assert_int_equal(gguf_file_size(f), data_off + 2 * bytes);
    gguf_close(f);
    free(b.p);
}

/* ---- real files ------------------------------------------------------------------------- */

static const char *shared_dir(void)
{
    const char *d = getenv("INFERD_SHARED_DIR");
    return d && *d ? d : INFERD_SHARED_DIR;
}

static void test_stories260k(void **state)
{
    (void)state;
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", shared_dir());
    if (access(path, R_OK) != 0) {
        print_message("skipping: %s is absent\n", path);
        skip();
    }
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) fail_msg("%s", err);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), 32);
    size_t len;
    const char *arch = gguf_get_str(f, "general.architecture", &len);
    assert_int_equal(len, 5);
    assert_memory_equal(arch, "llama", 5);
    uint32_t v;
    assert_true(gguf_get_u32(f, "llama.embedding_length", &v)); assert_int_equal(v, 64);
    assert_true(gguf_get_u32(f, "llama.block_count", &v)); assert_int_equal(v, 5);
    assert_true(gguf_get_u32(f, "llama.attention.head_count", &v)); assert_int_equal(v, 8);
    assert_true(gguf_get_u32(f, "llama.attention.head_count_kv", &v)); assert_int_equal(v, 4);
    assert_true(gguf_get_u32(f, "llama.feed_forward_length", &v)); assert_int_equal(v, 172);
    assert_true(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &v)); assert_int_equal(v, 1);
    float eps;
    assert_true(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps));
    assert_true(eps > 0.9e-5f && eps < 1.1e-5f);
    bool add_bos;
    assert_true(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos));
    assert_true(add_bos);
    int64_t tk = gguf_find_key(f, "tokenizer.ggml.tokens");
    assert_int_equal(gguf_arr_len(f, tk), 512);
    const char *s = gguf_arr_str(f, tk, 1, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "<s>", 3);
    s = gguf_arr_str(f, tk, 3, &len);
    assert_memory_equal(s, "<0x00>", 6);
    assert_int_equal(gguf_arr_type(f, gguf_find_key(f, "tokenizer.ggml.scores")), GGUF_VT_FLOAT32);

    /* 5 layers x 9 tensors + embedding + final norm; output is tied */
    assert_int_equal(gguf_n_tensors(f), 47);
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    assert_int_equal(t->type, GGML_TYPE_F32);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    t = gguf_find_tensor(f, "blk.4.attn_k.weight");
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 32);
    t = gguf_find_tensor(f, "blk.0.ffn_down.weight");
    assert_int_equal(t->ne[0], 172);
    assert_int_equal(t->ne[1], 64);
    assert_null(gguf_find_tensor(f, "output.weight"));
    size_t total = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        t = gguf_tensor_at(f, i);
        total += t->nbytes;
        assert_int_equal((gguf_data_offset(f) + t->offset) % 32, 0);
    }
    assert_int_equal(total, 260032 * 4);
    /* RMS norm weights of a trained model are not all zero */
    t = gguf_find_tensor(f, "output_norm.weight");
    float w0;
    memcpy(&w0, t->data, 4);
    assert_true(w0 != 0.0f && w0 == w0);
    gguf_close(f);
}

static void test_vocab_files(void **state)
{
    (void)state;
    char dir[1024], path[2048], err[512];
    snprintf(dir, sizeof dir, "%s/vocab", shared_dir());
    DIR *d = opendir(dir);
    if (!d) {
        print_message("skipping: %s is absent\n", dir);
        skip();
    }
    int opened = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".gguf") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        gguf_file *f = gguf_open(path, err, sizeof err);
        if (!f) fail_msg("%s", err);
        int64_t k = gguf_find_key(f, "tokenizer.ggml.tokens");
        assert_true(k >= 0);
        uint64_t len = gguf_arr_len(f, k);
        assert_true(len > 1000);
        size_t sl;
        assert_non_null(gguf_arr_str(f, k, len - 1, &sl));
        assert_non_null(gguf_get_str(f, "tokenizer.ggml.model", &sl));
        gguf_close(f);
        opened++;
    }
    closedir(d);
    assert_true(opened >= 1);
    print_message("%d vocabulary files opened\n", opened);
}

static void test_open_errors(void **state)
{
    (void)state;
    char err[512];
    assert_null(gguf_open("/nonexistent/x.gguf", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/x.gguf"));
    assert_null(gguf_open("/tmp", err, sizeof err));
    assert_non_null(strstr(err, "not a regular file"));
    char path[] = "/tmp/test_gguf_empty_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    assert_null(gguf_open(path, err, sizeof err));
    assert_non_null(strstr(err, "empty file"));
    /* a bad file's message carries the path and the parser's reason */
    FILE *fp = fopen(path, "wb");
    fwrite("GGUF\x01\0\0\0", 1, 8, fp);
    fclose(fp);
    assert_null(gguf_open(path, err, sizeof err));
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "version 1"));
    unlink(path);
}

/* `inferd info`: exit 0 on a valid model, 1 with the reader's message on a broken one.
 * Its stdout/stderr go to a file so that the output can be checked. */
static int run_info(const char *model, bool all, char *out, size_t outlen)
{
    char log[] = "/tmp/test_gguf_info_XXXXXX";
    int fd = mkstemp(log);
    assert_true(fd >= 0);
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2);
    dup2(fd, 1);
    dup2(fd, 2);
    char *argv[] = {"info", (char *)model, all ? "--all" : NULL, NULL};
    int rc = cli_info(all ? 3 : 2, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    ssize_t n = pread(fd, out, outlen - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(log);
    return rc;
}

static void test_info_command(void **state)
{
    (void)state;
    static char out[1 << 16];
    char path[] = "/tmp/test_gguf_m_XXXXXX";
    int fd = mkstemp(path);
    blob b = serialise(small_writer());
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    assert_int_equal(run_info(path, false, out, sizeof out), 0);
    assert_non_null(strstr(out, "version: 3"));
    assert_non_null(strstr(out, "general.architecture"));
    assert_non_null(strstr(out, "[str x 3] [\"<s>\", \"a\", \"bc\"]"));
    assert_non_null(strstr(out, "blk.0.q"));
    assert_non_null(strstr(out, "[8, 3]"));
    assert_non_null(strstr(out, "total: 2 tensors, 88 elements, 164 bytes"));
    /* cut inside the tensor data: exit 1 and the reason */
    assert_int_equal(ftruncate(fd, (off_t)b.n - 1), 0);
    close(fd);
    assert_int_equal(run_info(path, true, out, sizeof out), 1);
    assert_non_null(strstr(out, "tensor 'blk.0.q'"));
    assert_non_null(strstr(out, "extends past end of file"));
    unlink(path);
    free(b.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_scalars),
        cmocka_unit_test(test_round_trip_arrays),
        cmocka_unit_test(test_round_trip_tensors),
        cmocka_unit_test(test_version_2_accepted),
        cmocka_unit_test(test_every_truncation_fails_cleanly),
        cmocka_unit_test(test_bad_magic_and_version),
        cmocka_unit_test(test_counts_that_cannot_fit),
        cmocka_unit_test(test_string_and_array_lengths),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_alignment_key),
        cmocka_unit_test(test_bad_tensor_shapes),
        cmocka_unit_test(test_bad_tensor_placement),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_large_file_opens_fast),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_vocab_files),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_info_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
