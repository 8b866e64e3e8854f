/* gguf.h - read-only view of a GGUF file (v2/v3) (the writer is synth/gguf_write.h).
 *
 * The reader validates the whole file up front (gguf_open) so that every accessor below is
 * safe: offsets, lengths and tensor extents have been checked against the mapping, and an
 * error names the field or tensor and the byte offset where the file went wrong.
 * Strings in GGUF are length-prefixed, not NUL-terminated: accessors return pointer+length. */
#ifndef INFERD_GGUF_H
#define INFERD_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ggml_types.h"

typedef enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
} gguf_vtype;

/* Bytes of one value of a fixed-size type; 0 for strings, arrays and unknown numbers. */
size_t gguf_vtype_size(uint32_t type);

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_tensor {
    const char *name; /* NUL-terminated copy owned by the gguf_file */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the fastest-varying (row length); unused dims = 1 */
    ggml_type type;
    uint64_t offset; /* relative to the start of the tensor data section */
    size_t nbytes;
    const void *data; /* points into the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Open + validate a view of the file over mmap: what the file's later changes reach (a
 * truncation makes a later read of the data SIGBUS), so for tools that read a file once (info,
 * mkmodel).  On failure returns NULL and writes a message into err. */
gguf_file *gguf_open(const char *path, char *err, size_t errlen);
/* The same over a copy of the file in memory of its own (anonymous, read-only), read at once:
 * what a server uses, so that replacing or truncating the file under a running process changes
 * nothing it serves.  Refused when the file changes while it is read.  The process's resident
 * memory is the file's size, as with a fully paged-in mapping; the page cache is let go. */
gguf_file *gguf_load(const char *path, char *err, size_t errlen);
/* For an engine that has copied the weights elsewhere (GPU memory): frees the tensor data of a
 * gguf_load copy and makes it unreadable; metadata stays.  Returns the bytes freed (0 for a
 * gguf_open view or a buffer). */
size_t gguf_drop_tensor_data(gguf_file *f);
/* Same over a caller-owned buffer (tests, fuzzing). The buffer must outlive the gguf_file. */
gguf_file *gguf_open_memory(const void *data, size_t size, char *err, size_t errlen);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
size_t gguf_alignment(const gguf_file *f);
size_t gguf_file_size(const gguf_file *f);
size_t gguf_data_offset(const gguf_file *f); /* file offset of the tensor data section */

/* Metadata key/values */
int64_t gguf_n_kv(const gguf_file *f);
int64_t gguf_find_key(const gguf_file *f, const char *key); /* index or -1 */
const char *gguf_kv_key(const gguf_file *f, int64_t i);     /* NUL-terminated copy */
gguf_vtype gguf_kv_type(const gguf_file *f, int64_t i);

/* Typed getters by key. Return false when the key is absent or of an incompatible type.
 * Integer getters accept any integer type whose value fits; get_f32 accepts float32/float64
 * and integers. */
bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
bool gguf_get_f32(const gguf_file *f, const char *key, float *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out);
/* Returns pointer into the mapping (not NUL-terminated) or NULL. */
const char *gguf_get_str(const gguf_file *f, const char *key, size_t *len);

/* Scalar values by index (for `inferd info`). */
bool gguf_kv_i64(const gguf_file *f, int64_t i, int64_t *out); /* any integer or bool */
bool gguf_kv_u64(const gguf_file *f, int64_t i, uint64_t *out);
bool gguf_kv_f64(const gguf_file *f, int64_t i, double *out);
const char *gguf_kv_str(const gguf_file *f, int64_t i, size_t *len);

/* Arrays */
gguf_vtype gguf_arr_type(const gguf_file *f, int64_t i);
uint64_t gguf_arr_len(const gguf_file *f, int64_t i);
/* Raw little-endian element data for numeric arrays (NULL for string arrays). */
const void *gguf_arr_data(const gguf_file *f, int64_t i);
/* Element j of a string array (O(1): the reader indexes string arrays at open). */
const char *gguf_arr_str(const gguf_file *f, int64_t i, uint64_t j, size_t *len);
/* Element j of a numeric array converted. false if out of range / not numeric. */
bool gguf_arr_f32(const gguf_file *f, int64_t i, uint64_t j, float *out);
bool gguf_arr_i64(const gguf_file *f, int64_t i, uint64_t j, int64_t *out);

/* Tensors */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */

#endif
