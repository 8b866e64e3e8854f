/* fuzz_tokenizer.c - src/text/tokenizer.c with real vocabularies: encode arbitrary bytes
 * (special-token parsing on and off), and detokenize arbitrary id sequences, out-of-range
 * ids included, through the whole-sequence decoder and the streaming one the scheduler uses.
 *
 * Vocabularies are loaded once: the shared GGUFs (stories260K, llama.cpp's vocab files and the
 * tiny gemma4, mistral and deepseek_v3 references' tokenizers, from $INFERD_SHARED_DIR or the compiled-in
 * ../shared) when present, and always two that
 * the project's model generator makes (llama and qwen2 families, trained on its built-in
 * text so they are the same on every machine).
 *
 * Input: vocabulary byte, flag byte (bit 0 parse special, bit 1 add BOS, bit 2 detokenize
 * instead of encode, bit 3 start of text, bits 4..6 a small buffer size), then the text, or
 * the ids as 3-byte groups.
 *
 * Invariants: every id is in the vocabulary and the count does not depend on the buffer
 * size; NFC is idempotent; without special tokens decode(encode(text)) gives the text (its NFC
 * form for the vocabularies that normalize) back byte for byte, minus
 * the bytes the vocabulary cannot represent at all (test_tokenizer's hostile-input rule) and
 * with SPM's space stand-in U+2581 read as the space it stands for;
 * the streaming detokenizer emits only valid UTF-8, never writes past the buffer size its
 * contract asks for, holds back at most 3 bytes, and equals the whole-sequence decode when
 * that is valid UTF-8; tokenizer_token_bytes truncates without overrunning. */
#include "fuzz_common.h"

#include <unistd.h>

#include "model/gguf.h"
#include "synth/mkmodel.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

#define FZ_MAX_VOCABS 16

typedef struct fz_vocab {
    tokenizer *t;
    bool representable[256]; /* the byte alone encodes and decodes back to itself */
    bool spm_space;          /* SPM: a literal U+2581 in the text is a space to the model */
} fz_vocab;

static fz_vocab vocabs[FZ_MAX_VOCABS];
static int n_vocabs;

static void add_vocab(tokenizer *t)
{
    fz_vocab *v = &vocabs[n_vocabs++];
    v->t = t;
    for (int b = 0; b < 256; b++) {
        char c = (char)b, out[8];
        int32_t ids[8];
        int n = tokenizer_encode(t, &c, 1, false, false, ids, 8);
        v->representable[b] = n > 0 && n <= 8 && tokenizer_decode(t, ids, n, out, sizeof out) == 1 && out[0] == c;
    }
    char out[8];
    int32_t ids[8];
    int n = tokenizer_encode(t, "\xE2\x96\x81", 3, false, false, ids, 8);
    v->spm_space = n > 0 && n <= 8 && tokenizer_decode(t, ids, n, out, sizeof out) == 1 && out[0] == ' ';
}

static void load_path(const char *path)
{
    char err[512];
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) return; /* absent: the shared folder is optional */
    tokenizer *t = tokenizer_load(f, err, sizeof err);
    gguf_close(f);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        abort();
    }
    add_vocab(t);
}

/* A small model from the project's generator, written to a temporary file and read back. */
static void load_generated(model_arch arch)
{
    mkmodel_config cfg;
    if (!mkmodel_preset("tiny", &cfg)) abort();
    mkmodel_set_arch(&cfg, arch);
    cfg.n_embd = 32, cfg.n_layer = 1, cfg.n_head = 2, cfg.n_head_kv = 1, cfg.n_ff = 32;
    cfg.n_ctx = 64, cfg.n_vocab = 600, cfg.ftype = MKMODEL_F32, cfg.head_dim = 0;
    size_t corpus_len;
    char *corpus = mkmodel_corpus("/nonexistent", 1 << 16, &corpus_len); /* the built-in text */
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/fuzz_tokenizer_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) abort();
    close(fd);
    char err[512];
    if (mkmodel_write(&cfg, corpus, corpus_len, path, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: mkmodel: %s\n", err);
        abort();
    }
    free(corpus);
    load_path(path);
    unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *dir = getenv("INFERD_SHARED_DIR");
    if (!dir || !*dir) dir = INFERD_SHARED_DIR;
    static const char *const files[] = {
        "models/stories260K.gguf",          "vocab/ggml-vocab-gpt-2.gguf",
        "vocab/ggml-vocab-llama-spm.gguf",  "vocab/ggml-vocab-deepseek-llm.gguf",
        "vocab/ggml-vocab-falcon.gguf",     "vocab/ggml-vocab-starcoder.gguf",
        "vocab/ggml-vocab-phi-3.gguf",      "vocab/ggml-vocab-llama-bpe.gguf",
        "vocab/ggml-vocab-qwen2.gguf",
        "reference/gemma4.gguf",            /* SentencePiece-style BPE (tokenizer.ggml.model gemma4) */
        "reference/mistral.gguf",           /* byte-level BPE with the Tekken pre-tokenizer */
        "reference/deepseek_v3.gguf",       /* byte-level BPE with the deepseek-v3 pre-tokenizer */
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        load_path(path);
    }
    load_generated(MODEL_ARCH_LLAMA);
    load_generated(MODEL_ARCH_QWEN2);
    fprintf(stderr, "fuzz_tokenizer: %d vocabularies (shared folder %s)\n", n_vocabs, dir);
    return 0;
}

/* Whole-sequence decode into a malloc'd buffer (NUL-terminated); *len its length. */
static char *decode_all(const tokenizer *t, const int32_t *ids, int n, size_t *len)
{
    size_t need = tokenizer_decode(t, ids, n, NULL, 0);
    char *buf = malloc(need + 1);
    if (!buf) abort();
    FZ_CHECK(tokenizer_decode(t, ids, n, buf, need + 1) == need);
    *len = need;
    return buf;
}

/* Streams ids through detok_feed/flush with exactly the buffer its contract asks for. */
static char *stream_all(const tokenizer *t, const int32_t *ids, int n, bool start, size_t *len)
{
    detok_stream ds;
    detok_init(&ds, t, start);
    size_t cap = 64, used = 0;
    char *acc = malloc(cap);
    for (int i = 0; i <= n; i++) {
        int need = i < n ? tokenizer_token_bytes(t, ids[i], false, NULL, 0) : 0;
        int bcap = (need > 0 ? need : 0) + 16;
        char *buf = malloc((size_t)bcap);
        if (!buf || !acc) abort();
        int w = i < n ? detok_feed(&ds, ids[i], buf, bcap) : detok_flush(&ds, buf, bcap);
        FZ_CHECK(w >= 0 && w <= bcap);
        FZ_CHECK(fz_utf8_valid(buf, (size_t)w));
        FZ_CHECK(ds.n_pending >= 0 && ds.n_pending <= 3);
        if (used + (size_t)w > cap) acc = realloc(acc, cap = 2 * (used + (size_t)w));
        if (!acc) abort();
        memcpy(acc + used, buf, (size_t)w);
        used += (size_t)w;
        free(buf);
    }
    FZ_CHECK(ds.n_pending == 0);
    *len = used;
    return acc;
}

/* Decoded and streamed text of ids agree whenever the decoded text is valid UTF-8. */
static void check_detok(const tokenizer *t, const int32_t *ids, int n, bool start)
{
    size_t dlen, slen;
    char *dec = decode_all(t, ids, n, &dlen);
    char *str = stream_all(t, ids, n, start, &slen);
    if (start && fz_utf8_valid(dec, dlen)) FZ_CHECK(slen == dlen && memcmp(str, dec, dlen) == 0);
    free(dec);
    free(str);
}

static void check_encode(const fz_vocab *v, const char *text, size_t len, uint8_t flags)
{
    const tokenizer *t = v->t;
    bool special = flags & 1, bos = flags & 2;
    int small = (flags >> 4) & 7;
    int32_t *ids = malloc((size_t)(small ? small : 1) * sizeof *ids);
    int n = tokenizer_encode(t, text, len, bos, special, ids, small);
    FZ_CHECK(n >= 0);
    if (n > small) {
        free(ids);
        ids = malloc((size_t)n * sizeof *ids);
        FZ_CHECK(tokenizer_encode(t, text, len, bos, special, ids, n) == n);
    }
    for (int i = 0; i < n; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(t));
    char *nfc = NULL;
    size_t nfc_len = len;
    FZ_CHECK(unicode_nfc(text, len, &nfc, &nfc_len) == 0);
    if (nfc) { /* normalizing again changes nothing */
        char *again;
        size_t again_len;
        FZ_CHECK(unicode_nfc(nfc, nfc_len, &again, &again_len) == 0 && again == NULL);
    }
    if (tokenizer_normalizes_nfc(t) && nfc) { /* the text the tokenizer actually splits */
        text = nfc;
        len = nfc_len;
    }
    if (!special) {
        char *kept = malloc(len + 1);
        size_t n_kept = 0;
        for (size_t i = 0; i < len; i++) {
            if (v->spm_space && len - i >= 3 && memcmp(text + i, "\xE2\x96\x81", 3) == 0) {
                kept[n_kept++] = ' '; /* SPM writes spaces as U+2581: the two are one token */
                i += 2;
            } else if (v->representable[(uint8_t)text[i]]) {
                kept[n_kept++] = text[i];
            }
        }
        size_t dlen;
        char *dec = decode_all(t, ids, n, &dlen);
        FZ_CHECK(dlen == n_kept && memcmp(dec, kept, n_kept) == 0);
        free(dec);
        free(kept);
    }
    check_detok(t, ids, n, true);
    free(ids);
    free(nfc);
}

static void check_ids(const fz_vocab *v, fz_in *in, uint8_t flags)
{
    const tokenizer *t = v->t;
    int nv = tokenizer_n_vocab(t);
    int n = (int)(in->n / 3);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    for (int i = 0; i < n; i++) {
        uint32_t b0 = fz_u8(in), b1 = fz_u8(in), b2 = fz_u8(in);
        /* Mostly ids near the vocabulary (a few past either end); else any 32-bit value. */
        ids[i] = b2 < 0xC0 ? (int32_t)((b0 | b1 << 8 | b2 << 16) % (uint32_t)(nv + 8)) - 4
                           : (int32_t)(b0 << 24 | b1 << 16 | b2 << 8 | b0);
    }
    int small = (flags >> 4) & 7;
    for (int i = 0; i < n && i < 16; i++) {
        bool rs = flags & 1;
        char big[4096];
        int full = tokenizer_token_bytes(t, ids[i], rs, big, sizeof big);
        FZ_CHECK(full == -1 ? ids[i] < 0 || ids[i] >= nv : full >= 0 && full <= (int)sizeof big);
        char *part = malloc(small ? (size_t)small : 1);
        FZ_CHECK(tokenizer_token_bytes(t, ids[i], rs, small ? part : NULL, small) == full);
        if (full > 0 && small) FZ_CHECK(memcmp(part, big, (size_t)(full < small ? full : small)) == 0);
        free(part);
        size_t tl;
        const char *txt = tokenizer_token_text(t, ids[i], &tl);
        FZ_CHECK((txt == NULL) == (ids[i] < 0 || ids[i] >= nv));
        if (txt) fz_touch(txt, tl);
        (void)tokenizer_is_eog(t, ids[i]);
        (void)tokenizer_is_control(t, ids[i]);
    }
    check_detok(t, ids, n, flags & 8);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (n_vocabs == 0) return 0;
    fz_in in = {data, size};
    const fz_vocab *v = &vocabs[fz_u8(&in) % n_vocabs];
    uint8_t flags = fz_u8(&in);
    if (flags & 4)
        check_ids(v, &in, flags);
    else
        check_encode(v, (const char *)in.p, in.n, flags);
    return 0;
}
