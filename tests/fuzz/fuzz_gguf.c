/* fuzz_gguf.c - a hostile model file through everything inferd does with one at start-up:
 * gguf_open_memory and gguf_open (src/model/gguf.c) validation, every accessor,
 * tokenizer_load, the chat template detection and model_from_gguf.
 *
 * The input is the file itself (the seeds are real GGUFs from the model generator).  It must
 * never crash, hang or allocate out of proportion to its size: scripts/fuzz runs this target
 * with -malloc_limit_mb and -rss_limit_mb, which turn a huge allocation into a finding.
 *
 * Invariants: a refused file has an error message; an accepted one keeps gguf.h's promise
 * that every accessor is safe, which the target tests by reading every value and every byte
 * of every tensor (under ASan, from a buffer of exactly the input's size), and by checking
 * that lookups by name find what iteration finds. */
#include "fuzz_common.h"

#include <sys/mman.h>
#include <unistd.h>

#include "text/chat.h"
#include "model/gguf.h"
#include "model/model.h"
#include "text/tokenizer.h"

/* Array elements read per key: enough to cover every element type's path. */
#define FZ_MAX_ELEMS 64

static volatile uint64_t fz_sink; /* keeps the reads below from being optimised away */

static void check_kv(const gguf_file *f, int64_t i)
{
    const char *key = gguf_kv_key(f, i);
    FZ_CHECK(key != NULL);
    int64_t found = gguf_find_key(f, key);
    FZ_CHECK(found >= 0 && found < gguf_n_kv(f) && strcmp(gguf_kv_key(f, found), key) == 0);

    int64_t iv;
    uint64_t uv;
    double dv;
    size_t len;
    uint64_t sum = 0;
    if (gguf_kv_i64(f, i, &iv)) sum += (uint64_t)iv;
    if (gguf_kv_u64(f, i, &uv)) sum += uv;
    if (gguf_kv_f64(f, i, &dv)) sum += dv == dv;
    const char *s = gguf_kv_str(f, i, &len);
    for (size_t k = 0; s && k < len; k++) sum += (uint8_t)s[k];
    uint32_t u32;
    float f32;
    bool b;
    sum += gguf_get_u32(f, key, &u32) + gguf_get_i64(f, key, &iv) + gguf_get_f32(f, key, &f32) +
           gguf_get_bool(f, key, &b);
    s = gguf_get_str(f, key, &len);
    for (size_t k = 0; s && k < len; k++) sum += (uint8_t)s[k];

    if (gguf_kv_type(f, i) == GGUF_VT_ARRAY) {
        uint64_t n = gguf_arr_len(f, i);
        gguf_vtype t = gguf_arr_type(f, i);
        const uint8_t *raw = gguf_arr_data(f, i);
        size_t es = gguf_vtype_size(t);
        if (raw)
            for (uint64_t k = 0; k < n * es; k++) sum += raw[k];
        for (uint64_t j = 0; j < n && j < FZ_MAX_ELEMS; j++) {
            s = gguf_arr_str(f, i, j, &len);
            for (size_t k = 0; s && k < len; k++) sum += (uint8_t)s[k];
            sum += gguf_arr_f32(f, i, j, &f32) + gguf_arr_i64(f, i, j, &iv);
        }
        /* One past the end is refused, whatever the type. */
        FZ_CHECK(!gguf_arr_str(f, i, n, &len) && !gguf_arr_f32(f, i, n, &f32) && !gguf_arr_i64(f, i, n, &iv));
    }
    fz_sink += sum;
}

static void check_tensor(const gguf_file *f, int64_t i, const uint8_t *base, size_t size)
{
    const gguf_tensor *t = gguf_tensor_at(f, i);
    FZ_CHECK(t != NULL && t->name != NULL);
    FZ_CHECK(gguf_find_tensor(f, t->name) != NULL);
    FZ_CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
    const uint8_t *d = t->data;
    FZ_CHECK(d >= base + gguf_data_offset(f) && t->nbytes <= size && d + t->nbytes <= base + size);
    uint64_t sum = 0;
    for (size_t k = 0; k < t->nbytes; k++) sum += d[k];
    fz_sink += sum;
}

/* Every id of a hostile vocabulary's two ends through the streaming detokenizer, with exactly
 * the output room its contract asks for (tokenizer.h), and the whole-sequence decoder. */
static void check_detok(const tokenizer *t)
{
    int nv = tokenizer_n_vocab(t);
    detok_stream ds;
    detok_init(&ds, t, true);
    for (int32_t id = 0; id < nv && id < 512; id++) {
        int32_t tok = id < 256 ? id : nv - 1 - (id - 256);
        int need = tokenizer_token_bytes(t, tok, false, NULL, 0);
        FZ_CHECK(need >= 0);
        size_t len;
        FZ_CHECK(tokenizer_token_text(t, tok, &len) != NULL || len == 0);
        int cap = need + 16;
        char *buf = malloc((size_t)cap);
        if (!buf) abort();
        int w = detok_feed(&ds, tok, buf, cap);
        FZ_CHECK(w >= 0 && w <= cap && fz_utf8_valid(buf, (size_t)w));
        free(buf);
    }
    char tail[16];
    int w = detok_flush(&ds, tail, sizeof tail);
    FZ_CHECK(w >= 0 && fz_utf8_valid(tail, (size_t)w));
}

/* What the server does with the file next: its tokenizer and chat template.  The text to
 * encode is the file's own last bytes, so the fuzzer can make it match the vocabulary. */
static void check_tokenizer(const gguf_file *f, const uint8_t *data, size_t size)
{
    size_t len;
    const char *tmpl = gguf_get_str(f, "tokenizer.chat_template", &len);
    if (tmpl) {
        char *src = fz_strndup(tmpl, len);
        FZ_CHECK((unsigned)chat_template_detect(src) < CHAT_TMPL_COUNT);
        free(src);
    }
    char err[256] = "";
    tokenizer *t = tokenizer_load(f, err, sizeof err);
    if (!t) {
        FZ_CHECK(err[0] != 0);
        return;
    }
    static const char text[] = "Hello <s> world\n\xC3\xA9\xFF 123";
    size_t tail = size < 128 ? size : 128;
    for (int pass = 0; pass < 2; pass++) {
        const char *s = pass ? (const char *)data + size - tail : text;
        size_t n_s = pass ? tail : sizeof text - 1;
        int32_t ids[64];
        int n = tokenizer_encode(t, s, n_s, true, pass == 0, ids, 64);
        FZ_CHECK(n >= 0);
        for (int k = 0; k < n && k < 64; k++) FZ_CHECK(ids[k] >= 0 && ids[k] < tokenizer_n_vocab(t));
        char out[256];
        tokenizer_decode(t, ids, n < 64 ? n : 64, out, sizeof out);
    }
    check_detok(t);
    tokenizer_free(t);
}

/* The server opens model files by path (mmap): the same bytes through gguf_open must get
 * the same verdict, and the same message behind the "PATH: " prefix. */
static void check_open_by_path(const uint8_t *data, size_t size, bool accepted, const char *mem_err)
{
    int fd = memfd_create("fuzz_gguf", MFD_CLOEXEC);
    if (fd < 0) return; /* no memfd here: nothing to compare */
    FZ_CHECK(write(fd, data, size) == (ssize_t)size);
    char path[64], err[512] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    gguf_file *f = gguf_open(path, err, sizeof err);
    close(fd);
    FZ_CHECK((f != NULL) == (accepted && size > 0));
    if (!f && size > 0) {
        size_t pl = strlen(path);
        FZ_CHECK(strncmp(err, path, pl) == 0 && strncmp(err + pl, ": ", 2) == 0 &&
                 strncmp(err + pl + 2, mem_err, strlen(mem_err)) == 0); /* mem_err may be cut */
    }
    gguf_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256] = "";
    gguf_file *f = gguf_open_memory(data, size, err, sizeof err);
    check_open_by_path(data, size, f != NULL, err);
    if (!f) {
        FZ_CHECK(err[0] != 0);
        return 0;
    }
    FZ_CHECK(gguf_version(f) == 2 || gguf_version(f) == 3);
    size_t align = gguf_alignment(f);
    FZ_CHECK(align > 0 && (align & (align - 1)) == 0);
    FZ_CHECK(gguf_data_offset(f) <= size && gguf_file_size(f) == size);
    /* A key the file does not have is not found (the fuzzer can write any key, this one too). */
    static const char probe[] = "\x01no such key";
    bool has_probe = false;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        check_kv(f, i);
        has_probe = has_probe || strcmp(gguf_kv_key(f, i), probe) == 0;
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) check_tensor(f, i, data, size);
    FZ_CHECK(has_probe || gguf_find_key(f, probe) == -1);
    check_tokenizer(f, data, size);

    model *m = model_from_gguf(f, err, sizeof err); /* takes f, also on failure */
    if (m) {
        FZ_CHECK(m->hp.n_layer >= 1 && m->hp.n_embd >= 1 && m->hp.n_vocab >= 1);
        model_free(m);
    } else {
        FZ_CHECK(err[0] != 0);
    }
    return 0;
}
