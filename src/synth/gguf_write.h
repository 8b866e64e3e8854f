/* gguf_write.h - a GGUF writer (version 3), for the synthetic-model maker and for tests that
 * build files (hostile ones included: it validates nothing).  The server only reads GGUF
 * (model/gguf.h). */
#ifndef INFERD_GGUF_WRITE_H
#define INFERD_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
/* Setting a key twice replaces the earlier value. Strings are copied. */
void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
void gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, size_t n);
void gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, size_t n);
void gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n);
/* Generic raw setter for tests that need any type (e.g. hostile files): */
void gguf_writer_set_raw(gguf_writer *w, const char *key, gguf_vtype type, gguf_vtype arr_type,
                         const void *data, size_t n_elems);
/* Tensor data is copied unless `borrow` is true (then it must outlive gguf_writer_write*). */
void gguf_writer_add_tensor(gguf_writer *w, const char *name, ggml_type type, uint32_t n_dims,
                            const int64_t *ne, const void *data, size_t nbytes, bool borrow);
/* Tensor whose bytes are produced at write time (multi-GB synthetic models never sit in
 * memory): `fill` is called with consecutive chunks; it must write exactly `len` bytes that
 * start at byte `off` of the tensor's data. */
typedef void (*gguf_fill_fn)(void *ctx, size_t off, void *dst, size_t len);
void gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, ggml_type type, uint32_t n_dims,
                                 const int64_t *ne, gguf_fill_fn fill, void *ctx);
/* Write the file (v3, alignment from general.alignment or 32). 0 on success. */
int gguf_writer_write_file(gguf_writer *w, const char *path, char *err, size_t errlen);
/* Serialise into a malloc'd buffer (caller frees). 0 on success. */
int gguf_writer_write_mem(gguf_writer *w, void **out, size_t *out_size);

#endif
