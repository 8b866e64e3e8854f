/* tokenizer.c - SPM, byte-level BPE, SentencePiece-style BPE and WordPiece tokenizers over a
 * GGUF's tokenizer.ggml.* metadata.  (WordPiece, BERT's, is no merge engine: wpm_encode below.)
 *
 * The others share one merge engine: the text becomes a doubly linked list of symbols and
 * a max-heap of candidate adjacent pairs; the best pair is merged, its neighbours re-offered,
 * until no candidate is left.  They differ only in what a "candidate" is:
 *   SPM: two symbols whose concatenated text is a vocabulary token; best = highest score.
 *   BPE: two tokens listed in tokenizer.ggml.merges; best = lowest rank (earliest merge).
 * Byte-level BPE first cuts the text into pieces with the pre-tokenizer named by
 * tokenizer.ggml.pre (the reference regexes are hand-written as matchers below) and merges
 * within each piece only.  SentencePiece-style BPE (tokenizer.ggml.model "gemma4": Gemma's
 * tokenizer.json) lays the text out as SPM does (spaces as U+2581, one symbol per character,
 * <0xNN> tokens for characters the vocabulary lacks) and merges by rank as BPE does. */
#include "tokenizer.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/heap.h"
#include "base/utf8.h"
#include "unicode.h"

/* One character for segmentation.  An ill-formed byte is a character of its own here (as in
 * llama.cpp's tokenizer, which reads it as U+FFFD and moves on by one byte): pre-tokenizer
 * splits and SPM symbols then see the same input either way. */
static int decode_char(const char *s, size_t n, uint32_t *cp)
{
    int len = utf8_decode(s, n, cp);
    return *cp == UTF8_INVALID ? 1 : len;
}

enum { TOK_SPM, TOK_BPE, TOK_WPM, TOK_SPBPE };

/* tokenizer.ggml.token_type values */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

typedef enum pre_kind {
    PRE_DEFAULT,
    PRE_GPT2,
    PRE_LLAMA3,
    PRE_QWEN2,
    PRE_QWEN35,
    PRE_GPT4O,
    PRE_DEEPSEEK_LLM,
    PRE_DEEPSEEK3,
    PRE_FALCON,
    PRE_STARCODER,
    PRE_TEKKEN,
} pre_kind;

/* A tokenizer.ggml.pre name: the split rules it stands for and what the reference
 * implementations do for it beyond the split.  The names and the add_bos/ignore_merges
 * defaults are llama.cpp's (src/llama-vocab.cpp), which is what GGUF converters write; nfc is
 * the normalizer of the publisher's tokenizer.json, which the GGUF does not carry (llama.cpp
 * skips it).  A few older spellings inferd accepted stay readable ("gpt2" was written by
 * inferd's own mkmodel). */
typedef struct pre_info {
    const char *name;
    pre_kind kind;
    bool add_bos;       /* default when tokenizer.ggml.add_bos_token is absent */
    bool ignore_merges; /* a piece that is itself a token is taken whole (Llama 3) */
    bool nfc;           /* text is normalized to NFC before the split (Qwen2) */
} pre_info;

/* Open-addressing set of pairs (left id, right id) -> (rank, merged id). */
typedef struct pair_slot {
    int32_t left, right, rank, merged;
} pair_slot;

struct tokenizer {
    int kind;
    pre_kind pre;
    int32_t n_vocab;
    char *arena;       /* all token texts, each NUL-terminated */
    uint32_t *text_off;
    uint32_t *text_len;
    float *score;
    uint8_t *type;
    uint8_t *eog;
    uint8_t *shown; /* control tokens whose text output keeps (Harmony's markup); NULL: none */

    int32_t *map;      /* text -> id hash table (-1 = empty) */
    uint32_t map_mask;
    pair_slot *pairs;  /* BPE merges */
    uint32_t pair_mask;

    /* SPM: id of <0xNN>; BPE: id of the token for GPT-2's stand-in char of byte NN. */
    int32_t byte_id[256];
    int16_t cp_to_byte[324]; /* BPE: inverse of GPT-2's byte -> code point map, -1 elsewhere */

    /* Control and user-defined tokens (for parse_special): their own text -> id table, and
     * by first byte the distinct lengths they have, longest first.  A match at a position is
     * then one lookup per length, not one comparison per token: Gemma has 6,300 such tokens
     * starting with '<'. */
    int32_t *spec_map;
    uint32_t spec_mask;
    uint32_t *spec_lens;
    uint32_t spec_len_start[257];

    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix, ignore_merges, nfc;
    bool lowercase; /* WordPiece: tokenizer.ggml.normalizer.lowercase */
    int max_token_len; /* WordPiece: the longest token text, in bytes (its longest match) */
    /* For tokenizer_describe: the pre-tokenizer entry (BPE) and whether the add_bos/add_eos
     * flags came from the GGUF or from the defaults. */
    const pre_info *pre_info;
    bool add_bos_from_key, add_eos_from_key;
};

/* ---- small growable vectors ------------------------------------------------------------- */

typedef struct idvec {
    int32_t *v;
    size_t n, cap;
    bool oom;
} idvec;

static void idvec_push(idvec *a, int32_t id)
{
    if (a->oom)
        return;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) {
            a->oom = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
}

/* ---- hashing ------------------------------------------------------------------------------ */

static uint64_t hash_pair(int32_t a, int32_t b)
{
    uint64_t h = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 31);
}

static uint32_t table_size(size_t n)
{
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    return cap;
}

/* The id of text s[0..n) in a text -> id table (t->map or t->spec_map), or -1. */
static int32_t find_text(const tokenizer *t, const int32_t *map, uint32_t mask, const char *s, size_t n)
{
    if (n == 0)
        return -1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = map[i];
        if (id < 0)
            return -1;
        if (t->text_len[id] == n && memcmp(t->arena + t->text_off[id], s, n) == 0)
            return id;
    }
}

static int32_t lookup(const tokenizer *t, const char *s, size_t n)
{
    return find_text(t, t->map, t->map_mask, s, n);
}

static const pair_slot *find_pair(const tokenizer *t, int32_t a, int32_t b)
{
    if (!t->pairs || a < 0 || b < 0)
        return NULL;
    for (uint32_t i = (uint32_t)hash_pair(a, b) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const pair_slot *p = &t->pairs[i];
        if (p->left < 0)
            return NULL;
        if (p->left == a && p->right == b)
            return p;
    }
}

static const char *tok_text(const tokenizer *t, int32_t id)
{
    return t->arena + t->text_off[id];
}

/* ---- GPT-2 byte <-> code point map -------------------------------------------------------
 * Printable Latin-1 bytes stand for themselves; the other 68 bytes are given the code points
 * 256, 257, ... in byte order, so every byte has a visible, non-space stand-in. */

static bool byte_is_printable(int b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static uint32_t gpt2_byte_cp(int b)
{
    if (byte_is_printable(b))
        return (uint32_t)b;
    uint32_t n = 0;
    for (int i = 0; i < b; i++)
        n += !byte_is_printable(i);
    return 256 + n;
}

/* ---- loading ------------------------------------------------------------------------------ */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Index of a metadata array of the given element type, or -1 (absent); -2 on wrong type/length. */
static int64_t find_array(const gguf_file *f, const char *key, bool strings, uint64_t want_len,
                          char *err, size_t errlen)
{
    int64_t i = gguf_find_key(f, key);
    if (i < 0)
        return -1;
    if (gguf_kv_type(f, i) != GGUF_VT_ARRAY) {
        set_err(err, errlen, "tokenizer: %s is not an array", key);
        return -2;
    }
    bool is_str = gguf_arr_type(f, i) == GGUF_VT_STRING;
    if (is_str != strings) {
        set_err(err, errlen, "tokenizer: %s has element type %d, expected %s", key,
                (int)gguf_arr_type(f, i), strings ? "string" : "numeric");
        return -2;
    }
    if (want_len && gguf_arr_len(f, i) != want_len) {
        set_err(err, errlen, "tokenizer: %s has %llu entries, tokenizer.ggml.tokens has %llu", key,
                (unsigned long long)gguf_arr_len(f, i), (unsigned long long)want_len);
        return -2;
    }
    return i;
}

static int32_t get_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t dflt)
{
    int64_t v;
    if (!gguf_get_i64(f, key, &v))
        return dflt;
    /* Some converters write ids past the vocabulary (e.g. an unused padding id): treat those as
     * "no such token" rather than refusing an otherwise good model. */
    return (v >= 0 && v < n_vocab) ? (int32_t)v : -1;
}

static bool get_bool(const gguf_file *f, const char *key, bool dflt)
{
    bool v;
    return gguf_get_bool(f, key, &v) ? v : dflt;
}

static bool str_eq(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

static bool str_in(const char *s, size_t n, const char *const *list)
{
    for (; *list; list++)
        if (str_eq(s, n, *list))
            return true;
    return false;
}

static const pre_info pre_infos[] = {
    {"default", PRE_DEFAULT, false, false, false},
    {"gpt-2", PRE_GPT2, false, false, false},
    {"gpt2", PRE_GPT2, false, false, false},
    {"mpt", PRE_GPT2, false, false, false},
    {"olmo", PRE_GPT2, false, false, false},
    {"jais", PRE_GPT2, false, false, false},
    {"trillion", PRE_GPT2, false, false, false},
    {"llama3", PRE_LLAMA3, true, true, false},
    {"llama-v3", PRE_LLAMA3, true, true, false},
    {"llama-bpe", PRE_LLAMA3, true, true, false},
    {"falcon3", PRE_LLAMA3, true, true, false},
    /* Llama 3's split without its BOS and whole-piece defaults */
    {"dbrx", PRE_LLAMA3, false, false, false},
    {"smaug-bpe", PRE_LLAMA3, false, false, false},
    {"chatglm-bpe", PRE_LLAMA3, false, false, false},
    {"glm4", PRE_LLAMA3, false, false, false}, /* GLM-4.5: llama.cpp's CHATGLM4, as chatglm-bpe */
    {"qwen2", PRE_QWEN2, false, false, true},
    {"qwen2.5", PRE_QWEN2, false, false, true},
    {"qwen-2.5", PRE_QWEN2, false, false, true},
    {"deepseek-r1-qwen", PRE_QWEN2, false, false, true}, /* Qwen2's tokenizer.json */
    {"stablelm2", PRE_QWEN2, false, false, false},
    {"hunyuan", PRE_QWEN2, false, false, false},
    {"qwen35", PRE_QWEN35, false, false, false},
    {"gpt-4o", PRE_GPT4O, false, false, false},
    {"o200k", PRE_GPT4O, false, false, false},
    {"llama4", PRE_GPT4O, false, false, false},
    {"tekken", PRE_TEKKEN, true, true, false}, /* Mistral Nemo, Small 3.x, Devstral, Ministral */
    {"deepseek-llm", PRE_DEEPSEEK_LLM, false, false, false},
    {"deepseek-v3", PRE_DEEPSEEK3, false, false, false}, /* DeepSeek V3, R1 */
    {"hunyuan-dense", PRE_DEEPSEEK3, false, false, false},
    {"joyai-llm", PRE_DEEPSEEK3, false, false, false},
    {"falcon", PRE_FALCON, false, false, false},
    {"starcoder", PRE_STARCODER, false, false, false},
    {"refact", PRE_STARCODER, false, false, false},
    {"command-r", PRE_STARCODER, false, false, false},
    {"smollm", PRE_STARCODER, false, false, false},
    {"codeshell", PRE_STARCODER, false, false, false},
    {"exaone", PRE_STARCODER, false, false, false},
    {"minerva-7b", PRE_STARCODER, false, false, false},
};

/* The entry for a name; a BPE vocabulary without the key is "default" (as in llama.cpp). */
static const pre_info *find_pre(const char *s, size_t n)
{
    if (!s)
        return &pre_infos[0];
    for (size_t i = 0; i < sizeof pre_infos / sizeof pre_infos[0]; i++)
        if (str_eq(s, n, pre_infos[i].name))
            return &pre_infos[i];
    return NULL;
}

/* Texts can repeat (DeepSeek adds user-defined copies of byte-level characters such as "ÿ"):
 * the first normal token keeps the text, so merges and byte lookups see the real vocabulary. */
static void map_insert(tokenizer *t, int32_t id)
{
    size_t len = t->text_len[id];
    if (len == 0)
        return;
    const char *s = tok_text(t, id);
    for (uint32_t h = (uint32_t)hash_bytes(s, len) & t->map_mask;; h = (h + 1) & t->map_mask) {
        int32_t old = t->map[h];
        if (old < 0) {
            t->map[h] = id;
            return;
        }
        if (t->text_len[old] == len && memcmp(tok_text(t, old), s, len) == 0) {
            if (t->type[old] != TT_NORMAL && t->type[id] == TT_NORMAL)
                t->map[h] = id;
            return;
        }
    }
}

static int load_vocab(tokenizer *t, const gguf_file *f, char *err, size_t errlen)
{
    int64_t ki = find_array(f, "tokenizer.ggml.tokens", true, 0, err, errlen);
    if (ki == -1)
        set_err(err, errlen, "tokenizer: tokenizer.ggml.tokens is missing");
    if (ki < 0)
        return -1;
    uint64_t n = gguf_arr_len(f, ki);
    if (n == 0 || n > (uint64_t)INT32_MAX / 4) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                (unsigned long long)n);
        return -1;
    }
    t->n_vocab = (int32_t)n;
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t len;
        if (!gguf_arr_str(f, ki, i, &len)) {
            set_err(err, errlen, "tokenizer: tokenizer.ggml.tokens[%llu] unreadable",
                    (unsigned long long)i);
            return -1;
        }
        total += len + 1;
    }
    if (total > UINT32_MAX) {
        set_err(err, errlen, "tokenizer: token texts total %zu bytes (too large)", total);
        return -1;
    }
    t->arena = malloc(total);
    t->text_off = malloc(n * sizeof *t->text_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->score = calloc(n, sizeof *t->score);
    t->type = malloc(n);
    t->eog = calloc(n, 1);
    t->map_mask = table_size(n) - 1;
    t->map = malloc(((size_t)t->map_mask + 1) * sizeof *t->map);
    if (!t->arena || !t->text_off || !t->text_len || !t->score || !t->type || !t->eog || !t->map) {
        set_err(err, errlen, "tokenizer: out of memory for %llu tokens", (unsigned long long)n);
        return -1;
    }
    memset(t->map, 0xFF, ((size_t)t->map_mask + 1) * sizeof *t->map);
    memset(t->type, TT_NORMAL, n);

    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gguf_arr_str(f, ki, i, &len);
        memcpy(t->arena + off, s, len);
        t->arena[off + len] = 0;
        t->text_off[i] = (uint32_t)off;
        t->text_len[i] = (uint32_t)len;
        off += len + 1;
        if (len == 0)
            continue;
    }
    int64_t ti = find_array(f, "tokenizer.ggml.token_type", false, n, err, errlen);
    if (ti == -2)
        return -1;
    for (uint64_t i = 0; ti >= 0 && i < n; i++) {
        int64_t v = TT_NORMAL;
        gguf_arr_i64(f, ti, i, &v);
        t->type[i] = (v >= TT_NORMAL && v <= TT_BYTE) ? (uint8_t)v : TT_NORMAL;
    }
    for (uint64_t i = 0; i < n; i++)
        map_insert(t, (int32_t)i);

    int64_t si = find_array(f, "tokenizer.ggml.scores", false, n, err, errlen);
    if (si == -2)
        return -1;
    for (uint64_t i = 0; si >= 0 && i < n; i++)
        gguf_arr_f32(f, si, i, &t->score[i]);

    return 0;
}

static int load_merges(tokenizer *t, const gguf_file *f, char *err, size_t errlen)
{
    int64_t mi = find_array(f, "tokenizer.ggml.merges", true, 0, err, errlen);
    if (mi == -1)
        set_err(err, errlen, "tokenizer: tokenizer.ggml.merges is missing (required for gpt2 BPE)");
    if (mi < 0)
        return -1;
    uint64_t n = gguf_arr_len(f, mi);
    if (n > (1u << 24)) { /* ranks are kept as exact floats */
        set_err(err, errlen, "tokenizer: tokenizer.ggml.merges has %llu entries (max 16777216)",
                (unsigned long long)n);
        return -1;
    }
    t->pair_mask = table_size(n) - 1;
    t->pairs = malloc(((size_t)t->pair_mask + 1) * sizeof *t->pairs);
    char *buf = malloc(4096);
    if (!t->pairs || !buf) {
        free(buf);
        set_err(err, errlen, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
        return -1;
    }
    memset(t->pairs, 0xFF, ((size_t)t->pair_mask + 1) * sizeof *t->pairs);
    for (uint64_t r = 0; r < n; r++) {
        size_t len;
        const char *s = gguf_arr_str(f, mi, r, &len);
        /* "left right": split at the first space after the first byte. */
        const char *sp = (s && len > 1) ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp || len - 1 > 4096)
            continue;
        size_t nl = (size_t)(sp - s), nr = len - nl - 1;
        int32_t a = lookup(t, s, nl), b = lookup(t, sp + 1, nr);
        memcpy(buf, s, nl);
        memcpy(buf + nl, sp + 1, nr);
        int32_t m = lookup(t, buf, nl + nr);
        if (a < 0 || b < 0 || m < 0)
            continue; /* a merge that cannot produce a token is unusable */
        uint32_t h = (uint32_t)hash_pair(a, b) & t->pair_mask;
        while (t->pairs[h].left >= 0 && !(t->pairs[h].left == a && t->pairs[h].right == b))
            h = (h + 1) & t->pair_mask;
        if (t->pairs[h].left >= 0)
            continue; /* duplicate: the first (lowest) rank wins */
        t->pairs[h] = (pair_slot){a, b, (int32_t)r, m};
    }
    free(buf);
    return 0;
}

static int cmp_special(const void *pa, const void *pb, void *ctx)
{
    const tokenizer *t = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    unsigned char fa = (unsigned char)tok_text(t, a)[0], fb = (unsigned char)tok_text(t, b)[0];
    if (fa != fb)
        return fa < fb ? -1 : 1;
    if (t->text_len[a] != t->text_len[b])
        return t->text_len[a] > t->text_len[b] ? -1 : 1;
    return a < b ? -1 : (a > b);
}

static int build_specials(tokenizer *t)
{
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        n += (t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->text_len[i] > 0;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    t->spec_mask = table_size(n) - 1;
    t->spec_map = malloc(((size_t)t->spec_mask + 1) * sizeof *t->spec_map);
    t->spec_lens = malloc((n ? n : 1) * sizeof *t->spec_lens);
    if (!ids || !t->spec_map || !t->spec_lens) {
        free(ids);
        return -1;
    }
    memset(t->spec_map, 0xFF, ((size_t)t->spec_mask + 1) * sizeof *t->spec_map);
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->text_len[i] > 0)
            ids[n++] = i;
    qsort_r(ids, n, sizeof *ids, cmp_special, t);
    size_t n_lens = 0, j = 0;
    for (int c = 0; c < 256; c++) {
        t->spec_len_start[c] = (uint32_t)n_lens;
        for (; j < n && (unsigned char)tok_text(t, ids[j])[0] == c; j++) {
            uint32_t len = t->text_len[ids[j]];
            if (n_lens == t->spec_len_start[c] || t->spec_lens[n_lens - 1] != len)
                t->spec_lens[n_lens++] = len;
            /* a repeated text keeps its lowest id (sorted first) */
            const char *s = tok_text(t, ids[j]);
            uint32_t h = (uint32_t)hash_bytes(s, len) & t->spec_mask;
            while (t->spec_map[h] >= 0 && !(t->text_len[t->spec_map[h]] == len && memcmp(tok_text(t, t->spec_map[h]), s, len) == 0))
                h = (h + 1) & t->spec_mask;
            if (t->spec_map[h] < 0)
                t->spec_map[h] = ids[j];
        }
    }
    t->spec_len_start[256] = (uint32_t)n_lens;
    free(ids);
    return 0;
}

static void build_byte_ids(tokenizer *t)
{
    memset(t->cp_to_byte, 0xFF, sizeof t->cp_to_byte);
    for (int b = 0; b < 256; b++) {
        char buf[8];
        int n;
        if (t->kind != TOK_BPE) {
            n = snprintf(buf, sizeof buf, "<0x%02X>", b);
        } else {
            uint32_t cp = gpt2_byte_cp(b);
            t->cp_to_byte[cp] = (int16_t)b;
            n = utf8_encode(cp, buf);
        }
        t->byte_id[b] = lookup(t, buf, (size_t)n);
    }
}

/* Harmony (gpt-oss's o200k_harmony vocabulary, recognised by its control tokens <|channel|> and
 * <|message|>): <|end|> ends a message, not the turn -- the reply goes on with the next message
 * -- while <|return|> (the answer is done) and <|call|> (a tool must run) end generation, as
 * llama.cpp has them; and the markup tokens are the reply's structure (which channel, which
 * recipient), so output text keeps them for the reply's parser (text/harmony.c), as llama.cpp
 * keeps them.  They stay control tokens otherwise: never matched in a message's text, never
 * allowed by a grammar.  0, or -1 when memory ran out. */
static int mark_harmony(tokenizer *t)
{
    static const char *const markup[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", NULL};
    static const char *const ends[] = {"<|return|>", "<|call|>", NULL};
    int32_t ch = lookup(t, "<|channel|>", 11), msg = lookup(t, "<|message|>", 11);
    if (ch < 0 || msg < 0 || t->type[ch] != TT_CONTROL || t->type[msg] != TT_CONTROL) return 0;
    if (!(t->shown = calloc((size_t)t->n_vocab, 1))) return -1;
    for (int k = 0; markup[k]; k++) {
        int32_t id = lookup(t, markup[k], strlen(markup[k]));
        if (id < 0 || t->type[id] != TT_CONTROL) continue;
        t->shown[id] = 1;
        t->eog[id] = 0;
        if (t->eot == id) t->eot = -1;
    }
    for (int k = 0; ends[k]; k++) {
        int32_t id = lookup(t, ends[k], strlen(ends[k]));
        if (id >= 0) t->eog[id] = 1;
    }
    return 0;
}

static void mark_eog(tokenizer *t)
{
    /* Chat models end a turn with one of these even when the GGUF names only the EOS. */
    static const char *const turn_end[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                           "<EOT>", NULL};
    static const char *const gen_end[] = {"<|endoftext|>", "<|eom_id|>", "<|end_of_text|>", NULL};
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->type[i] != TT_CONTROL && t->type[i] != TT_USER)
            continue;
        const char *s = tok_text(t, i);
        size_t n = t->text_len[i];
        if (str_in(s, n, turn_end)) {
            if (t->eot < 0)
                t->eot = i;
            t->eog[i] = 1;
        } else if (str_in(s, n, gen_end)) {
            t->eog[i] = 1;
        }
    }
    int32_t ids[3] = {t->eos, t->eot, t->eom};
    for (int k = 0; k < 3; k++)
        if (ids[k] >= 0)
            t->eog[ids[k]] = 1;
}

tokenizer *tokenizer_load(const gguf_file *f, char *err, size_t errlen)
{
    size_t mlen;
    const char *model = gguf_get_str(f, "tokenizer.ggml.model", &mlen);
    if (!model) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.model is missing");
        return NULL;
    }
    int kind;
    if (str_eq(model, mlen, "llama"))
        kind = TOK_SPM;
    else if (str_eq(model, mlen, "gpt2"))
        kind = TOK_BPE;
    else if (str_eq(model, mlen, "bert"))
        kind = TOK_WPM;
    else if (str_eq(model, mlen, "gemma4"))
        kind = TOK_SPBPE;
    else {
        set_err(err, errlen,
                "tokenizer: tokenizer.ggml.model '%.*s' is not supported ('llama' = SPM, 'gpt2' = byte-level "
                "BPE, 'gemma4' = SentencePiece-style BPE, 'bert' = WordPiece)",
                (int)(mlen > 64 ? 64 : mlen), model);
        return NULL;
    }
    size_t plen = 0;
    const char *pres = gguf_get_str(f, "tokenizer.ggml.pre", &plen);
    const pre_info *pi = kind == TOK_BPE ? find_pre(pres, plen) : NULL;
    if (kind == TOK_BPE && !pi) {
        set_err(err, errlen, "tokenizer: pre-tokenizer tokenizer.ggml.pre = '%.*s' is not supported",
                (int)(plen > 64 ? 64 : plen), pres);
        return NULL;
    }

    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, errlen, "tokenizer: out of memory");
        return NULL;
    }
    t->kind = kind;
    t->pre = pi ? pi->kind : PRE_DEFAULT;
    t->pre_info = pi;
    if (load_vocab(t, f, err, errlen) < 0 ||
        ((kind == TOK_BPE || kind == TOK_SPBPE) && load_merges(t, f, err, errlen) < 0))
        goto fail;
    if (build_specials(t) < 0) {
        set_err(err, errlen, "tokenizer: out of memory");
        goto fail;
    }
    build_byte_ids(t);

    bool spm = kind == TOK_SPM;
    int32_t n = t->n_vocab;
    t->bos = get_id(f, "tokenizer.ggml.bos_token_id", n, spm && n > 1 ? 1 : -1);
    t->eos = get_id(f, "tokenizer.ggml.eos_token_id", n, spm && n > 2 ? 2 : -1);
    t->eot = get_id(f, "tokenizer.ggml.eot_token_id", n, -1);
    t->eom = get_id(f, "tokenizer.ggml.eom_token_id", n, -1);
    t->unk = get_id(f, "tokenizer.ggml.unknown_token_id", n, spm ? 0 : -1);
    t->pad = get_id(f, "tokenizer.ggml.padding_token_id", n, -1);
    /* Converters write add_bos/add_eos only where the tokenizer config states them (Llama 3's
     * does not, yet its tokenizer adds <|begin_of_text|>): without the key, SPM adds BOS and
     * BPE does what the pre-tokenizer's entry says. */
    bool v;
    t->add_bos_from_key = gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &v);
    t->add_bos = (t->add_bos_from_key ? v : spm || kind == TOK_WPM || (pi && pi->add_bos)) && t->bos >= 0;
    /* Gemma 4 always starts with <bos>, whatever the key says (llama.cpp overrides it too). */
    if (kind == TOK_SPBPE)
        t->add_bos = t->bos >= 0;
    t->add_eos_from_key = gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &v);
    t->add_eos = (t->add_eos_from_key && v) && t->eos >= 0;
    t->add_space_prefix = get_bool(f, "tokenizer.ggml.add_space_prefix", spm);
    t->ignore_merges = pi && pi->ignore_merges;
    t->lowercase = kind == TOK_WPM && get_bool(f, "tokenizer.ggml.normalizer.lowercase", true);
    for (int32_t i = 0; i < n; i++)
        if ((int)t->text_len[i] > t->max_token_len) t->max_token_len = (int)t->text_len[i];
    t->nfc = pi && pi->nfc;
    mark_eog(t);
    if (mark_harmony(t) < 0) {
        set_err(err, errlen, "tokenizer: out of memory");
        goto fail;
    }
    return t;
fail:
    tokenizer_free(t);
    return NULL;
}

void tokenizer_free(tokenizer *t)
{
    if (!t)
        return;
    free(t->arena);
    free(t->text_off);
    free(t->text_len);
    free(t->score);
    free(t->type);
    free(t->eog);
    free(t->shown);
    free(t->map);
    free(t->pairs);
    free(t->spec_map);
    free(t->spec_lens);
    free(t);
}

/* ---- accessors ---------------------------------------------------------------------------- */

int tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
int32_t tokenizer_eot(const tokenizer *t) { return t->eot; }
bool tokenizer_add_bos(const tokenizer *t) { return t->add_bos; }
bool tokenizer_add_eos(const tokenizer *t) { return t->add_eos; }
bool tokenizer_normalizes_nfc(const tokenizer *t) { return t->nfc; }

size_t tokenizer_describe(const tokenizer *t, char *buf, size_t cap)
{
    const char *pre = t->pre_info ? t->pre_info->name : NULL;
    char kind[96], bos[160];
    static const char *const kind_names[] = {[TOK_SPM] = "SPM", [TOK_BPE] = "byte-level BPE", [TOK_WPM] = "WordPiece",
                                             [TOK_SPBPE] = "SentencePiece-style BPE"};
    snprintf(kind, sizeof kind, "%s, %d tokens%s%s%s", kind_names[t->kind],
             (int)t->n_vocab, pre ? ", pre-tokenizer '" : "", pre ? pre : "", pre ? "'" : "");
    if (t->bos < 0) {
        snprintf(bos, sizeof bos, "no BOS token");
    } else {
        size_t len = 0;
        const char *text = tokenizer_token_text(t, t->bos, &len);
        char why[96];
        if (t->add_bos_from_key)
            snprintf(why, sizeof why, "tokenizer.ggml.add_bos_token");
        else
            snprintf(why, sizeof why, "no tokenizer.ggml.add_bos_token: default for %s%s%s",
                     pre ? "pre-tokenizer '" : kind_names[t->kind], pre ? pre : "", pre ? "'" : "");
        snprintf(bos, sizeof bos, "BOS %.*s %s to text prompts (%s)", (int)(len > 40 ? 40 : len),
                 text, t->add_bos ? "added" : "not added", why);
    }
    int n = snprintf(buf, cap, "%s; %s; EOS %s (%s); NFC normalization %s", kind, bos,
                     t->add_eos ? "added" : "not added",
                     t->add_eos_from_key ? "tokenizer.ggml.add_eos_token" : "default",
                     t->nfc ? "on (the publisher's tokenizer normalizes)" : "off");
    return n < 0 ? 0 : (size_t)n;
}

bool tokenizer_is_eog(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

bool tokenizer_is_control(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->type[id] == TT_CONTROL || t->type[id] == TT_UNKNOWN);
}

/* The special token id of a or b whose kind or text differs; -1 when none. */
static int32_t special_mismatch(const tokenizer *a, const tokenizer *b)
{
    for (int32_t id = 0; id < a->n_vocab; id++) {
        bool ca = tokenizer_is_control(a, id), cb = tokenizer_is_control(b, id);
        if (!ca && !cb) continue;
        if (ca != cb || a->text_len[id] != b->text_len[id] ||
            memcmp(tok_text(a, id), tok_text(b, id), a->text_len[id]) != 0)
            return id;
    }
    return -1;
}

bool tokenizer_compatible(const tokenizer *a, const tokenizer *b, char *why, size_t cap)
{
    if (a->n_vocab != b->n_vocab) {
        snprintf(why, cap, "the target's vocabulary has %d tokens, the draft's %d", a->n_vocab, b->n_vocab);
        return false;
    }
    const struct {
        const char *name;
        int32_t ta, tb;
    } ids[] = {{"BOS", a->bos, b->bos}, {"EOS", a->eos, b->eos}, {"EOT", a->eot, b->eot},
               {"adds BOS", a->add_bos, b->add_bos}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        if (ids[i].ta == ids[i].tb) continue;
        snprintf(why, cap, "%s differs: target %d, draft %d", ids[i].name, (int)ids[i].ta, (int)ids[i].tb);
        return false;
    }
    int32_t id = special_mismatch(a, b);
    if (id >= 0) {
        snprintf(why, cap, "special token %d differs: target %s \"%.*s\", draft %s \"%.*s\"", (int)id,
                 tokenizer_is_control(a, id) ? "control" : "normal", (int)(a->text_len[id] < 64 ? a->text_len[id] : 64),
                 tok_text(a, id), tokenizer_is_control(b, id) ? "control" : "normal",
                 (int)(b->text_len[id] < 64 ? b->text_len[id] : 64), tok_text(b, id));
        return false;
    }
    return true;
}

int32_t tokenizer_find(const tokenizer *t, const char *s)
{
    return s ? lookup(t, s, strlen(s)) : -1;
}

const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = t->text_len[id];
    return tok_text(t, id);
}

/* ---- the merge engine --------------------------------------------------------------------- */

typedef struct symbol {
    uint32_t off, len; /* bytes of the working buffer */
    int32_t prev, next, id;
} symbol;

/* A candidate merge of sym[left] with its successor.  No right index is kept: while left's
 * length is unchanged its successor is the same symbol, so a size check finds stale entries. */
typedef struct bigram {
    float score; /* higher merges first: SPM token score, BPE -rank (exact below 2^24) */
    int32_t left, id;
    uint32_t size; /* left.len + right.len when offered */
} bigram;

static bool bigram_before(const bigram *a, const bigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

HEAP_DEFINE(bigram_heap, bigram, bigram_before)

typedef struct merger {
    const tokenizer *t;
    const char *buf;
    symbol *sym;
    bigram_heap heap;
    bool oom;
} merger;

/* SPM merges only into tokens sentencepiece itself would produce. */
static bool spm_usable(const tokenizer *t, int32_t id)
{
    return id >= 0 && (t->type[id] == TT_NORMAL || t->type[id] == TT_USER);
}

static void offer_pair(merger *m, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const tokenizer *t = m->t;
    const symbol *a = &m->sym[l], *b = &m->sym[r];
    bigram g = {0, l, -1, a->len + b->len};
    if (t->kind == TOK_SPM) {
        g.id = lookup(t, m->buf + a->off, g.size);
        if (!spm_usable(t, g.id))
            return;
        g.score = t->score[g.id];
    } else {
        const pair_slot *p = find_pair(t, a->id, b->id);
        if (!p)
            return;
        g.id = p->merged;
        g.score = -(float)p->rank;
    }
    if (!bigram_heap_push(&m->heap, g)) m->oom = true;
}

/* Merge the symbols first..last (a linked run) as far as the vocabulary allows. */
static void merge_run(merger *m, int32_t first, int32_t count)
{
    m->heap.n = 0;
    for (int32_t i = first; i + 1 < first + count; i++)
        offer_pair(m, i, i + 1);
    while (m->heap.n > 0 && !m->oom) {
        bigram g = bigram_heap_pop(&m->heap);
        symbol *a = &m->sym[g.left];
        if (a->len == 0 || a->next < 0 || a->len + m->sym[a->next].len != g.size)
            continue; /* one side was merged since this pair was offered */
        symbol *b = &m->sym[a->next];
        a->len += b->len;
        a->id = g.id;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0)
            m->sym[b->next].prev = g.left;
        offer_pair(m, a->prev, g.left);
        offer_pair(m, g.left, a->next);
    }
}

/* Lay out symbols[first..first+count) over buf[off..), one per UTF-8 character (SPM) or per
 * byte (BPE), linked in order. */
static void make_symbols(merger *m, int32_t first, uint32_t off, uint32_t end, bool per_byte)
{
    int32_t i = first;
    const tokenizer *t = m->t;
    while (off < end) {
        uint32_t cp;
        int n = per_byte ? 1 : decode_char(m->buf + off, end - off, &cp);
        symbol *s = &m->sym[i];
        s->off = off;
        s->len = (uint32_t)n;
        s->prev = i == first ? -1 : i - 1;
        s->next = off + n < end ? i + 1 : -1;
        if (per_byte)
            s->id = t->byte_id[(unsigned char)m->buf[off]];
        else {
            s->id = lookup(t, m->buf + off, (size_t)n);
            if (!spm_usable(t, s->id))
                s->id = -1;
        }
        off += (uint32_t)n;
        i++;
    }
}

/* Emit the merged symbols of a run: SPM (and SentencePiece-style BPE) characters with no
 * token fall back to <0xNN> byte tokens, and to the unknown token when even those are missing. */
static void emit_run(merger *m, int32_t first, idvec *out)
{
    const tokenizer *t = m->t;
    for (int32_t i = first; i >= 0; i = m->sym[i].next) {
        const symbol *s = &m->sym[i];
        if (s->id >= 0) {
            idvec_push(out, s->id);
            continue;
        }
        for (uint32_t k = 0; k < s->len; k++) {
            int32_t b = t->kind != TOK_BPE ? t->byte_id[(unsigned char)m->buf[s->off + k]] : -1;
            if (b >= 0)
                idvec_push(out, b);
            else if (t->unk >= 0)
                idvec_push(out, t->unk);
            if (b < 0 && t->kind == TOK_BPE)
                break; /* one unknown per unmappable BPE symbol */
        }
    }
}

/* ---- SPM ---------------------------------------------------------------------------------- */

static int spm_encode(const tokenizer *t, const char *s, size_t n, bool prefix, idvec *out)
{
    if (n == 0)
        return 0;
    static const char space_mark[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* U+2581 */
    size_t cap = 3 * (n + 1);
    char *buf = malloc(cap);
    symbol *sym = malloc((n + 1) * sizeof *sym);
    if (!buf || !sym) {
        free(buf);
        free(sym);
        return -1;
    }
    size_t len = 0;
    if (prefix) {
        memcpy(buf, space_mark, 3);
        len = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(buf + len, space_mark, 3);
            len += 3;
        } else {
            buf[len++] = s[i];
        }
    }
    merger m = {.t = t, .buf = buf, .sym = sym};
    make_symbols(&m, 0, 0, (uint32_t)len, false);
    int32_t count = 0;
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        count++;
    merge_run(&m, 0, count);
    emit_run(&m, 0, out);
    bigram_heap_free(&m.heap);
    free(buf);
    free(sym);
    return m.oom ? -1 : 0;
}

/* ---- BPE pre-tokenizers --------------------------------------------------------------------
 * The text is decoded once into code points with their class bits; a pre-tokenizer is a list
 * of stages, each one a matcher standing for one reference regex.  A stage runs over every
 * piece of the previous stage the way a regex "find all" does: matches become pieces, and so
 * does the unmatched text between them.  Matchers return the match length in code points at
 * position i (0 = no match there) and look no further than the piece end. */

typedef struct cptext {
    uint32_t *cp;
    uint16_t *fl;
    uint32_t *off; /* byte offset of each code point, plus the end */
    size_t n;
    /* memo of the last whitespace run, so that "\s+$" stays linear on long runs */
    size_t run_lo, run_hi;
} cptext;

typedef size_t (*match_fn)(cptext *c, size_t i, size_t end);

typedef struct span {
    uint32_t lo, hi;
} span;

typedef struct spanvec {
    span *v;
    size_t n, cap;
    bool oom;
} spanvec;

static void span_push(spanvec *a, size_t lo, size_t hi)
{
    if (a->oom)
        return;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        span *v = realloc(a->v, cap * sizeof *v);
        if (!v) {
            a->oom = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (span){(uint32_t)lo, (uint32_t)hi};
}

#define L_ UCP_LETTER
#define N_ UCP_NUMBER
#define S_ UCP_SPACE

static bool is_other(unsigned f, unsigned letters)
{
    return !(f & (letters | N_ | S_));
}

static bool is_crlf(uint32_t cp)
{
    return cp == '\r' || cp == '\n';
}

static size_t run_of(const cptext *c, size_t i, size_t end, unsigned mask)
{
    size_t j = i;
    while (j < end && (c->fl[j] & mask))
        j++;
    return j - i;
}

static size_t run_of_other(const cptext *c, size_t i, size_t end, unsigned letters)
{
    size_t j = i;
    while (j < end && is_other(c->fl[j], letters))
        j++;
    return j - i;
}

static size_t run_in(const cptext *c, size_t i, size_t end, bool (*in)(uint32_t))
{
    size_t j = i;
    while (j < end && in(c->cp[j]))
        j++;
    return j - i;
}

/* 's|'t|'re|'ve|'m|'ll|'d (ASCII case-insensitively for the Llama 3 family) */
static size_t match_contraction(const cptext *c, size_t i, size_t end, bool icase)
{
    if (i + 1 >= end || c->cp[i] != '\'')
        return 0;
    uint32_t a = c->cp[i + 1], b = i + 2 < end ? c->cp[i + 2] : 0;
    if (icase) {
        a = (a >= 'A' && a <= 'Z') ? a + 32 : a;
        b = (b >= 'A' && b <= 'Z') ? b + 32 : b;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at a whitespace position: a run keeps its last character for the next piece
 * unless it reaches the end. */
static size_t match_space_run(const cptext *c, size_t i, size_t end)
{
    size_t n = run_of(c, i, end, S_);
    return (i + n == end || n == 1) ? n : n - 1;
}

/* \s*[\r\n]+|\s+(?!\S)|\s+ at a whitespace position: \s*[\r\n]+ ends at the last line break
 * of the run, if it has one. */
static size_t match_breaks_or_space(const cptext *c, size_t i, size_t end)
{
    size_t n = run_of(c, i, end, S_);
    for (size_t k = i + n; k > i; k--)
        if (is_crlf(c->cp[k - 1]))
            return k - i;
    return match_space_run(c, i, end);
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(cptext *c, size_t i, size_t end)
{
    size_t n = match_contraction(c, i, end, false);
    if (n)
        return n;
    size_t j = i + (c->cp[i] == ' ' && i + 1 < end);
    unsigned f = c->fl[j];
    if (f & L_)
        return j - i + run_of(c, j, end, L_);
    if (f & N_)
        return j - i + run_of(c, j, end, N_);
    if (is_other(f, L_))
        return j - i + run_of_other(c, j, end, L_);
    return match_space_run(c, i, end);
}

/*  ?[^\s LETTERS \p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+, with '/' among the characters
 * after the run when `slash` (Tekken): what the Llama 3 line's rules try after words and
 * digits. */
static size_t match_symbols_or_space(const cptext *c, size_t i, size_t end, unsigned letters, bool slash)
{
    size_t j = i + (c->cp[i] == ' ' && i + 1 < end && is_other(c->fl[i + 1], letters));
    if (is_other(c->fl[j], letters)) {
        j += run_of_other(c, j, end, letters);
        while (j < end && (is_crlf(c->cp[j]) || (slash && c->cp[j] == '/')))
            j++;
        return j - i;
    }
    return match_breaks_or_space(c, i, end);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?LETTERS+|\p{N}{1,max}|
 *  ?[^\s LETTERS \p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * LETTERS is \p{L} (Llama 3, Qwen2) or [\p{L}\p{M}] (Qwen3.5). */
static size_t match_llama3_like(const cptext *c, size_t i, size_t end, size_t max_digits,
                                unsigned letters)
{
    size_t n = match_contraction(c, i, end, true);
    if (n)
        return n;
    unsigned f = c->fl[i];
    if (f & letters)
        return run_of(c, i, end, letters);
    if (!(f & (L_ | N_)) && !is_crlf(c->cp[i]) && i + 1 < end && (c->fl[i + 1] & letters))
        return 1 + run_of(c, i + 1, end, letters);
    if (f & N_) /* bounded: measuring the whole run at every 3rd digit would be quadratic */
        return run_of(c, i, i + max_digits < end ? i + max_digits : end, N_);
    return match_symbols_or_space(c, i, end, letters, false);
}

static size_t match_llama3(cptext *c, size_t i, size_t end)
{
    return match_llama3_like(c, i, end, 3, L_);
}

static size_t match_qwen2(cptext *c, size_t i, size_t end)
{
    return match_llama3_like(c, i, end, 1, L_);
}

static size_t match_qwen35(cptext *c, size_t i, size_t end)
{
    return match_llama3_like(c, i, end, 1, L_ | UCP_MARK);
}

/* The case-split pre-tokenizers, gpt-4o / o200k (gpt-oss, Llama 4) and Tekken (Mistral):
 *   [^\r\n\p{L}\p{N}]?UPPER*LOWER+SUFFIX|[^\r\n\p{L}\p{N}]?UPPER+LOWER*SUFFIX|\p{N}{1,D}|
 *    ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with UPPER = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and LOWER = [\p{Ll}\p{Lm}\p{Lo}\p{M}] (Lm, Lo and
 * marks are in both), so "HelloWorld" is two pieces.  gpt-4o: SUFFIX = (?i:'s|'t|'re|'ve|'m|'ll|'d)?
 * (a contraction stays on its word), D = 3; Tekken: no suffix, D = 1.  The classes are Unicode's
 * (UCP_UPPER / UCP_LOWER), as Hugging Face's regex has them; llama.cpp approximates them by
 * ASCII ([^a-z] / [^A-Z]). */
#define CASED_UPPER(f) (((f) & UCP_MARK) || (((f) & L_) && !((f) & UCP_LOWER)))
#define CASED_LOWER(f) (((f) & UCP_MARK) || (((f) & L_) && !((f) & UCP_UPPER)))

static size_t run_upper(const cptext *c, size_t i, size_t end)
{
    size_t j = i;
    while (j < end && CASED_UPPER(c->fl[j]))
        j++;
    return j - i;
}

static size_t run_lower(const cptext *c, size_t i, size_t end)
{
    size_t j = i;
    while (j < end && CASED_LOWER(c->fl[j]))
        j++;
    return j - i;
}

/* UPPER*LOWER+ (lower_required) or UPPER+LOWER* at i, as a backtracking regex matches them:
 * the longest UPPER run, giving back from its end until LOWER+ can follow. */
static size_t match_cased_word(const cptext *c, size_t i, size_t end, bool lower_required)
{
    size_t up = run_upper(c, i, end);
    if (!lower_required)
        return up ? up + run_lower(c, i + up, end) : 0;
    for (size_t k = up + 1; k-- > 0;) {
        size_t low = run_lower(c, i + k, end);
        if (low)
            return k + low;
    }
    return 0;
}

static size_t match_cased(cptext *c, size_t i, size_t end, bool contractions, size_t max_digits)
{
    unsigned f = c->fl[i];
    bool prefix = !(f & (L_ | N_)) && !is_crlf(c->cp[i]) && i + 1 < end;
    for (int alt = 0; alt < 2; alt++) {
        /* with the optional prefix character first, then without it */
        for (size_t p = prefix ? 1 : 0; p != (size_t)-1; p--) {
            size_t n = match_cased_word(c, i + p, end, alt == 0);
            if (n)
                return p + n + (contractions ? match_contraction(c, i + p + n, end, true) : 0);
        }
    }
    if (f & N_)
        return run_of(c, i, i + max_digits < end ? i + max_digits : end, N_);
    return match_symbols_or_space(c, i, end, L_, true);
}

static size_t match_gpt4o(cptext *c, size_t i, size_t end)
{
    return match_cased(c, i, end, true, 3);
}

static size_t match_tekken(cptext *c, size_t i, size_t end)
{
    return match_cased(c, i, end, false, 1);
}

static bool is_falcon_punct_extra(uint32_t cp, bool backtick)
{
    return cp == '$' || cp == '+' || cp == '<' || cp == '=' || cp == '>' || cp == '^' ||
           cp == '~' || cp == '|' || (backtick && cp == '`');
}

static size_t match_punct_run(const cptext *c, size_t i, size_t end, bool backtick)
{
    size_t j = i;
    while (j < end && ((c->fl[j] & UCP_PUNCT) || is_falcon_punct_extra(c->cp[j], backtick)))
        j++;
    return j - i;
}

/* [\p{P}\$\+<=>\^~\|`]+ (falcon) and [\p{P}\$\+<=>\^~\|]+ (default) */
static size_t match_punct_falcon(cptext *c, size_t i, size_t end)
{
    return match_punct_run(c, i, end, true);
}

static size_t match_punct_default(cptext *c, size_t i, size_t end)
{
    return match_punct_run(c, i, end, false);
}

static bool is_ascii_digit(uint32_t cp)
{
    return cp >= '0' && cp <= '9';
}

/* [0-9][0-9][0-9] */
static size_t match_3digits(cptext *c, size_t i, size_t end)
{
    return (i + 3 <= end && is_ascii_digit(c->cp[i]) && is_ascii_digit(c->cp[i + 1]) &&
            is_ascii_digit(c->cp[i + 2])) ? 3 : 0;
}

/* \p{N} */
static size_t match_one_number(cptext *c, size_t i, size_t end)
{
    (void)end;
    return (c->fl[i] & N_) ? 1 : 0;
}

/* \p{N}+ */
static size_t match_numbers(cptext *c, size_t i, size_t end)
{
    return run_of(c, i, end, N_);
}

/* DeepSeek LLM: [\r\n] */
static size_t match_crlf(cptext *c, size_t i, size_t end)
{
    (void)end;
    return is_crlf(c->cp[i]) ? 1 : 0;
}

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

static bool in_ranges(uint32_t cp, const cp_range *r, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (cp >= r[k].lo && cp <= r[k].hi)
            return true;
    return false;
}

/* The cased-letter class of DeepSeek LLM's second split regex. */
static bool is_deepseek_letter(uint32_t cp)
{
    static const cp_range r[] = {
        {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
        {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
        {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
        {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
        {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
        {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
        {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
        {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
        {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
        {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
        {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
        {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
        {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
        {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
        {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
        {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
        {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
    };
    if (cp < 0x80)
        return (cp | 32) >= 'a' && (cp | 32) <= 'z';
    return in_ranges(cp, r, sizeof r / sizeof r[0]);
}

/* [!-/:-~！-／：-～‘-‟　-。] */
static bool is_deepseek_punct(uint32_t cp)
{
    static const cp_range r[] = {{0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F},
                                 {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}};
    return in_ranges(cp, r, sizeof r / sizeof r[0]);
}

/* [一-龥ࠀ-一가-퟿] */
static bool is_deepseek_cjk(uint32_t cp)
{
    static const cp_range r[] = {{0x0800, 0x4E00}, {0x4E00, 0x9FA5}, {0xAC00, 0xD7FF}};
    return in_ranges(cp, r, sizeof r / sizeof r[0]);
}

/* \s?CLASS+ */
static size_t match_space_then(const cptext *c, size_t i, size_t end, bool (*in)(uint32_t))
{
    if ((c->fl[i] & S_) && i + 1 < end && in(c->cp[i + 1]))
        return 1 + run_in(c, i + 1, end, in);
    return run_in(c, i, end, in);
}

static size_t match_deepseek_letters(cptext *c, size_t i, size_t end)
{
    return match_space_then(c, i, end, is_deepseek_letter);
}

static size_t match_deepseek_punct(cptext *c, size_t i, size_t end)
{
    return match_space_then(c, i, end, is_deepseek_punct);
}

static size_t match_deepseek_cjk(cptext *c, size_t i, size_t end)
{
    return run_in(c, i, end, is_deepseek_cjk);
}

/* \p{N}{1,3} */
static size_t match_number_triple(cptext *c, size_t i, size_t end)
{
    return (c->fl[i] & N_) ? run_of(c, i, i + 3 < end ? i + 3 : end, N_) : 0;
}

/* [一-龥぀-ゟ゠-ヿ]: CJK ideographs, hiragana, katakana */
static bool is_deepseek3_cjk(uint32_t cp)
{
    static const cp_range r[] = {{0x3040, 0x309F}, {0x30A0, 0x30FF}, {0x4E00, 0x9FA5}};
    return in_ranges(cp, r, sizeof r / sizeof r[0]);
}

static size_t match_deepseek3_cjk(cptext *c, size_t i, size_t end)
{
    return run_in(c, i, end, is_deepseek3_cjk);
}

static bool is_ascii_punct(uint32_t cp)
{
    return cp < 0x80 && (unicode_flags(cp) & (UCP_PUNCT | UCP_SYMBOL));
}

static bool is_ascii_letter(uint32_t cp)
{
    return (cp | 32) >= 'a' && (cp | 32) <= 'z';
}

/* DeepSeek V3's third split regex, tried in this order:
 *   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+    one ASCII punctuation mark and ASCII letters
 *   [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+                   a word, with a space (or mark...) before it
 *    ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+      punctuation, line breaks, spaces
 * A mark is in both classes of the word rule, so a word starting with one is just the run. */
static size_t match_deepseek3(cptext *c, size_t i, size_t end)
{
    const unsigned word = L_ | UCP_MARK, punct = UCP_PUNCT | UCP_SYMBOL;
    unsigned f = c->fl[i];
    if (is_ascii_punct(c->cp[i]) && i + 1 < end && is_ascii_letter(c->cp[i + 1]))
        return 1 + run_in(c, i + 1, end, is_ascii_letter);
    if (f & word)
        return run_of(c, i, end, word);
    if (!(f & punct) && !is_crlf(c->cp[i]) && i + 1 < end && (c->fl[i + 1] & word))
        return 1 + run_of(c, i + 1, end, word);
    size_t j = i + (c->cp[i] == ' ' && i + 1 < end && (c->fl[i + 1] & punct));
    if (c->fl[j] & punct) {
        j += run_of(c, j, end, punct);
        return j - i + run_in(c, j, end, is_crlf);
    }
    return (f & S_) ? match_breaks_or_space(c, i, end) : 0;
}

/* \s+$ : the whitespace run from i must reach the end of the piece.  Tried at every position of
 * a long run, so the run's extent is remembered instead of rescanned. */
static size_t match_trailing_space(cptext *c, size_t i, size_t end)
{
    if (!(c->fl[i] & S_))
        return 0;
    if (!(i >= c->run_lo && i < c->run_hi)) {
        c->run_lo = i;
        c->run_hi = i + run_of(c, i, end, S_);
    }
    return c->run_hi == end ? end - i : 0;
}

typedef struct pre_stages {
    match_fn fn[6];
    int n;
} pre_stages;

static pre_stages stages_for(pre_kind k)
{
    switch (k) {
    case PRE_GPT2:
        return (pre_stages){{match_gpt2}, 1};
    case PRE_LLAMA3:
        return (pre_stages){{match_llama3}, 1};
    case PRE_QWEN2:
        return (pre_stages){{match_qwen2}, 1};
    case PRE_QWEN35:
        return (pre_stages){{match_qwen35}, 1};
    case PRE_GPT4O:
        return (pre_stages){{match_gpt4o}, 1};
    case PRE_TEKKEN:
        return (pre_stages){{match_tekken}, 1};
    case PRE_DEEPSEEK_LLM:
        return (pre_stages){{match_crlf, match_deepseek_letters, match_deepseek_punct,
                             match_trailing_space, match_deepseek_cjk, match_numbers}, 6};
    case PRE_DEEPSEEK3:
        return (pre_stages){{match_number_triple, match_deepseek3_cjk, match_deepseek3}, 3};
    case PRE_FALCON:
        return (pre_stages){{match_punct_falcon, match_gpt2, match_3digits}, 3};
    case PRE_STARCODER:
        return (pre_stages){{match_one_number, match_gpt2}, 2};
    case PRE_DEFAULT:
    default:
        return (pre_stages){{match_punct_default, match_gpt2, match_numbers, match_3digits}, 4};
    }
}

static void split_stage(cptext *c, const spanvec *in, match_fn fn, spanvec *out)
{
    out->n = 0;
    for (size_t p = 0; p < in->n; p++) {
        size_t end = in->v[p].hi, gap = in->v[p].lo, i = gap;
        c->run_lo = c->run_hi = 0;
        while (i < end) {
            size_t n = fn(c, i, end);
            if (n == 0) {
                i++;
                continue;
            }
            if (gap < i)
                span_push(out, gap, i);
            span_push(out, i, i + n);
            i += n;
            gap = i;
        }
        if (gap < end)
            span_push(out, gap, end);
    }
}

/* The pieces of c by pre-tokenizer k, in *a (b: scratch). */
static int pre_split(pre_kind k, cptext *c, spanvec *a, spanvec *b)
{
    span_push(a, 0, c->n);
    pre_stages st = stages_for(k);
    for (int s = 0; s < st.n; s++) {
        split_stage(c, a, st.fn[s], b);
        spanvec tmp = *a;
        *a = *b;
        *b = tmp;
    }
    return a->oom || b->oom ? -1 : 0;
}

static int cptext_init(cptext *c, const char *s, size_t n)
{
    c->cp = malloc((n + 1) * sizeof *c->cp);
    c->fl = malloc((n + 1) * sizeof *c->fl);
    c->off = malloc((n + 1) * sizeof *c->off);
    if (!c->cp || !c->fl || !c->off)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = decode_char(s + i, n - i, &cp);
        c->cp[k] = cp;
        c->fl[k] = (uint16_t)unicode_flags(cp); /* an invalid byte is "other", like U+FFFD */
        c->off[k] = (uint32_t)i;
        k++;
        i += (size_t)len;
    }
    c->off[k] = (uint32_t)n;
    c->n = k;
    return 0;
}

static void cptext_free(cptext *c)
{
    free(c->cp);
    free(c->fl);
    free(c->off);
}

/* Whole-piece lookup for vocabularies that skip merges when the piece is itself a token. */
static int32_t lookup_byte_level(const tokenizer *t, const char *s, size_t n, char *scratch)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)utf8_encode(gpt2_byte_cp((unsigned char)s[i]), scratch + k);
    return lookup(t, scratch, k);
}

static int bpe_encode(const tokenizer *t, const char *s, size_t n, idvec *out)
{
    if (n == 0)
        return 0;
    cptext c = {0};
    spanvec a = {0}, b = {0};
    merger m = {.t = t, .buf = s};
    char *scratch = t->ignore_merges ? malloc(2 * n) : NULL;
    m.sym = malloc(n * sizeof *m.sym);
    int rc = -1;
    if (cptext_init(&c, s, n) < 0 || !m.sym || (t->ignore_merges && !scratch))
        goto done;

    if (pre_split(t->pre, &c, &a, &b) < 0)
        goto done;

    for (size_t p = 0; p < a.n && !m.oom; p++) {
        uint32_t lo = c.off[a.v[p].lo], hi = c.off[a.v[p].hi];
        if (t->ignore_merges) {
            int32_t id = lookup_byte_level(t, s + lo, hi - lo, scratch);
            if (id >= 0) {
                idvec_push(out, id);
                continue;
            }
        }
        /* Symbols are indexed by byte offset so runs never overlap. */
        make_symbols(&m, (int32_t)lo, lo, hi, true);
        merge_run(&m, (int32_t)lo, (int32_t)(hi - lo));
        emit_run(&m, (int32_t)lo, out);
    }
    rc = m.oom ? -1 : 0;
done:
    cptext_free(&c);
    free(a.v);
    free(b.v);
    free(m.sym);
    bigram_heap_free(&m.heap);
    free(scratch);
    return rc;
}

/* ---- encode ------------------------------------------------------------------------------- */

/* Longest control/user-defined token whose text starts at s[0..n), or -1. */
static int32_t special_at(const tokenizer *t, const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    for (uint32_t k = t->spec_len_start[c]; k < t->spec_len_start[c + 1]; k++) {
        int32_t id = t->spec_lens[k] <= n ? find_text(t, t->spec_map, t->spec_mask, s, t->spec_lens[k]) : -1;
        if (id >= 0)
            return id;
    }
    return -1;
}

bool tokenizer_prompt_bos(const tokenizer *t, const char *text, size_t len)
{
    return t->add_bos && !(text && len > 0 && special_at(t, text, len) == t->bos);
}

/* ---- WordPiece (BERT) ------------------------------------------------------------------------
 * As BERT's BasicTokenizer and llama.cpp's WPM: whitespace separates words; every punctuation
 * character (and ASCII symbol, and CJK ideograph) is a word of its own; control characters and
 * U+FFFD are dropped; letters are lowercased when the normalizer says so.  Each word, as
 * "\u2581word" (how converters store a word-initial piece; "##" continuations lose the "##"),
 * is covered greedily by the longest vocabulary token at each point; a word that cannot be
 * covered whole is [UNK]. */

static bool wpm_alone(uint32_t cp, unsigned f)
{
    return (f & UCP_PUNCT) || (cp < 0x7F && (f & UCP_SYMBOL)) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
           (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2FA1F) || (cp >= 0xF900 && cp <= 0xFAFF);
}

/* Lowercase of cp: ASCII, Latin-1, Greek and Cyrillic capitals (what BERT vocabularies hold). */
static uint32_t wpm_lower(uint32_t cp)
{
    if ((cp >= 'A' && cp <= 'Z') || (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) || (cp >= 0x391 && cp <= 0x3AB) ||
        (cp >= 0x410 && cp <= 0x42F))
        return cp + 32;
    if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
    return cp;
}

static int wpm_word(const tokenizer *t, const char *w, size_t n, idvec *out)
{
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        size_t j = n - i > (size_t)t->max_token_len ? i + (size_t)t->max_token_len : n;
        int32_t id = -1;
        for (; j > i && (id = lookup(t, w + i, j - i)) < 0; j--) {}
        if (id < 0) { /* the word cannot be covered: one [UNK] for all of it */
            out->n = start;
            idvec_push(out, t->unk >= 0 ? t->unk : 0);
            return 0;
        }
        idvec_push(out, id);
        i = j;
    }
    return 0;
}

static int wpm_encode(const tokenizer *t, const char *s, size_t n, idvec *out)
{
    char *word = malloc(n * 2 + 8); /* "\u2581" + each character lowercased (at most 4 bytes for 4) */
    if (!word) return -1;
    size_t len = 0;
    for (size_t i = 0; i <= n;) {
        uint32_t cp = 0;
        int cl = i < n ? decode_char(s + i, n - i, &cp) : 0;
        unsigned f = i < n ? unicode_flags(cp) : UCP_SPACE;
        bool alone = i < n && wpm_alone(cp, f);
        if ((f & UCP_SPACE) || alone) { /* the word so far ends */
            if (len) wpm_word(t, word, len, out);
            len = 0;
        }
        if (i < n && !(f & UCP_SPACE) && !(f & UCP_CONTROL) && cp != 0 && cp != 0xFFFD && cp != UTF8_INVALID) {
            if (!len) memcpy(word, "\xE2\x96\x81", 3), len = 3;
            len += (size_t)utf8_encode(t->lowercase ? wpm_lower(cp) : cp, word + len);
            if (alone) {
                wpm_word(t, word, len, out);
                len = 0;
            }
        }
        i += cl ? (size_t)cl : 1;
    }
    free(word);
    return out->oom ? -1 : 0;
}

static int encode_fragment(const tokenizer *t, const char *s, size_t n, idvec *out)
{
    if (t->kind == TOK_WPM)
        return wpm_encode(t, s, n, out);
    if (t->kind == TOK_SPM || t->kind == TOK_SPBPE) /* the same layout; offer_pair differs */
        return spm_encode(t, s, n, t->add_space_prefix, out);
    if (!t->nfc)
        return bpe_encode(t, s, n, out);
    /* Special tokens are matched in the text as written, the rest normalized first (as the
     * tokenizers library does with added tokens). */
    char *norm;
    size_t norm_len;
    if (unicode_nfc(s, n, &norm, &norm_len) < 0)
        return -1;
    int rc = bpe_encode(t, norm ? norm : s, norm_len, out);
    free(norm);
    return rc;
}

size_t tokenizer_control_at(const tokenizer *t, const char *s, size_t n)
{
    int32_t id = n ? special_at(t, s, n) : -1;
    return id >= 0 && t->type[id] == TT_CONTROL ? t->text_len[id] : 0;
}

/* Where special tokens are matched: everywhere (parse_special), nowhere, or everywhere but at
 * the start of a control token inside one of the plain spans. */
typedef struct special_rule {
    bool parse;
    const tok_span *plain;
    size_t n_plain;
} special_rule;

/* Whether the control/user token id found at offset i may be a token there. */
static bool special_allowed(const tokenizer *t, const special_rule *r, size_t *k, size_t i, int32_t id)
{
    while (*k < r->n_plain && r->plain[*k].off + r->plain[*k].len <= i)
        (*k)++;
    bool in_plain = *k < r->n_plain && r->plain[*k].off <= i;
    return !in_plain || t->type[id] != TT_CONTROL;
}

static int encode_rule(const tokenizer *t, const char *text, size_t len, bool add_bos,
                       const special_rule *r, int32_t *out, int cap)
{
    if (!t || (!text && len > 0) || len > (size_t)UINT32_MAX / 4)
        return -1;
    idvec v = {0};
    if (add_bos && t->bos >= 0)
        idvec_push(&v, t->bos);

    /* Text between special tokens is encoded on its own.  Every such fragment starts the text
     * or follows a special token, so SPM gives each one its space prefix (as llama.cpp does). */
    size_t frag = 0, k = 0;
    int rc = 0;
    for (size_t i = 0; r->parse && i < len && rc == 0;) {
        int32_t id = special_at(t, text + i, len - i);
        if (id < 0 || !special_allowed(t, r, &k, i, id)) {
            i++;
            continue;
        }
        if (frag < i)
            rc = encode_fragment(t, text + frag, i - frag, &v);
        idvec_push(&v, id);
        i += t->text_len[id];
        frag = i;
    }
    if (rc == 0 && frag < len)
        rc = encode_fragment(t, text + frag, len - frag, &v);

    int n = -1;
    if (rc == 0 && !v.oom && v.n <= (size_t)INT_MAX) {
        n = (int)v.n;
        if (out && cap > 0 && n > 0)
            memcpy(out, v.v, (size_t)(n < cap ? n : cap) * sizeof *out);
    }
    free(v.v);
    return n;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool add_bos,
                     bool parse_special, int32_t *out, int cap)
{
    special_rule r = {.parse = parse_special};
    return encode_rule(t, text, len, add_bos, &r, out, cap);
}

/* ---- decode ------------------------------------------------------------------------------- */

/* Bounded output: counts every byte, stores those that fit. */
typedef struct sink {
    char *buf;
    size_t cap, n;
    bool skip_space; /* drop the next byte if it is a space (SPM's added prefix) */
} sink;

static void sink_put(sink *k, const char *p, size_t len)
{
    if (len && k->skip_space) {
        k->skip_space = false;
        if (p[0] == ' ') {
            p++;
            len--;
        }
    }
    for (size_t i = 0; i < len; i++, k->n++)
        if (k->n < k->cap)
            k->buf[k->n] = p[i];
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* BPE: is id the token the encoder uses for a single byte?  DeepSeek stores some of those as
 * user-defined tokens ("ÿ" for byte FF); they must still decode to the byte. */
static bool is_byte_symbol(const tokenizer *t, int32_t id)
{
    uint32_t cp;
    size_t n = t->text_len[id];
    if (n == 0 || utf8_decode(tok_text(t, id), n, &cp) != (int)n || cp >= 324)
        return false;
    return t->cp_to_byte[cp] >= 0 && t->byte_id[t->cp_to_byte[cp]] == id;
}

static void render_token(const tokenizer *t, int32_t id, bool render_special, sink *k)
{
    const char *s = tok_text(t, id);
    size_t n = t->text_len[id];
    int type = t->type[id];
    if (type == TT_CONTROL || type == TT_UNKNOWN) {
        if (render_special || (t->shown && t->shown[id]))
            sink_put(k, s, n);
        return;
    }
    if (type == TT_USER && !(t->kind == TOK_BPE && is_byte_symbol(t, id))) {
        sink_put(k, s, n); /* added tokens are stored as written */
        return;
    }
    if (t->kind != TOK_BPE) { /* SPM's bytes and both's "\u2581" word starts */
        if (type == TT_BYTE && n == 6 && hex_digit(s[3]) >= 0 && hex_digit(s[4]) >= 0) {
            char b = (char)(hex_digit(s[3]) * 16 + hex_digit(s[4]));
            sink_put(k, &b, 1);
            return;
        }
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                sink_put(k, " ", 1);
                i += 3;
            } else {
                sink_put(k, s + i, 1);
                i++;
            }
        }
        return;
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = decode_char(s + i, n - i, &cp);
        if (cp < sizeof t->cp_to_byte / sizeof t->cp_to_byte[0] && t->cp_to_byte[cp] >= 0) {
            char b = (char)t->cp_to_byte[cp];
            sink_put(k, &b, 1);
        } else {
            sink_put(k, s + i, (size_t)len); /* not a byte stand-in: keep as written */
        }
        i += (size_t)len;
    }
}

int tokenizer_token_bytes(const tokenizer *t, int32_t id, bool render_special, char *buf, int cap)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return -1;
    sink k = {buf, cap > 0 && buf ? (size_t)cap : 0, 0, false};
    render_token(t, id, render_special, &k);
    return k.n > INT_MAX ? INT_MAX : (int)k.n;
}

static bool strips_prefix(const tokenizer *t)
{
    return (t->kind == TOK_SPM && t->add_space_prefix) || t->kind == TOK_WPM;
}

size_t tokenizer_decode(const tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap)
{
    sink k = {buf, buf ? cap : 0, 0, strips_prefix(t)};
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            continue;
        render_token(t, ids[i], false, &k); /* empty pieces (BOS...) leave the strip armed */
    }
    if (buf && cap > 0)
        buf[k.n < cap ? k.n : cap - 1] = 0;
    return k.n;
}

static int encode_rule_alloc(const tokenizer *t, const char *text, size_t len, bool add_bos,
                             const special_rule *r, int32_t **out)
{
    *out = NULL;
    /* A token covers at least one byte (plus BOS), so len + 8 fits SPM and BPE alike; the
     * second pass is for a vocabulary that would break that. */
    int cap = (int)(len < (size_t)1 << 28 ? len : (size_t)1 << 28) + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? encode_rule(t, text, len, add_bos, r, ids, cap) : -1;
    if (n > cap) {
        int32_t *more = realloc(ids, (size_t)n * sizeof *ids);
        if (!more) {
            free(ids);
            return -1;
        }
        ids = more;
        n = encode_rule(t, text, len, add_bos, r, ids, n);
    }
    if (n < 0) {
        free(ids);
        return -1;
    }
    *out = ids;
    return n;
}

int tokenizer_encode_alloc(const tokenizer *t, const char *text, size_t len, bool add_bos,
                           bool parse_special, int32_t **out)
{
    special_rule r = {.parse = parse_special};
    return encode_rule_alloc(t, text, len, add_bos, &r, out);
}

int tokenizer_encode_prompt(const tokenizer *t, const char *text, size_t len, bool add_bos,
                            const tok_span *plain, size_t n_plain, int32_t **out)
{
    special_rule r = {.parse = true, .plain = plain, .n_plain = n_plain};
    return encode_rule_alloc(t, text, len, add_bos, &r, out);
}

char *tokenizer_decode_alloc(const tokenizer *t, const int32_t *ids, int n, size_t *len)
{
    size_t cap = (size_t)(n > 0 ? n : 0) * 16 + 16; /* most pieces are short: one pass */
    char *text = malloc(cap);
    if (!text) return NULL;
    *len = tokenizer_decode(t, ids, n, text, cap);
    if (*len >= cap) {
        free(text);
        cap = *len + 1;
        if (!(text = malloc(cap))) return NULL;
        *len = tokenizer_decode(t, ids, n, text, cap);
    }
    return text;
}

/* ---- streaming detokenizer ---------------------------------------------------------------- */

void detok_init(detok_stream *s, const tokenizer *t, bool first_is_start_of_text)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->first = first_is_start_of_text && strips_prefix(t);
}

int detok_feed(detok_stream *s, int32_t id, char *out, int cap)
{
    const tokenizer *t = s->t;
    if (!t || id < 0 || id >= t->n_vocab || cap <= 0)
        return 0;
    size_t piece = t->text_len[id] + 8; /* rendered bytes never exceed the text (+ a byte) */
    size_t total = (size_t)s->n_pending + piece;
    char stackbuf[512];
    char *data = total <= sizeof stackbuf ? stackbuf : malloc(total);
    if (!data)
        return 0;
    memcpy(data, s->pending, (size_t)s->n_pending);
    sink k = {data + s->n_pending, piece, 0, s->first};
    render_token(t, id, false, &k);
    s->first = k.skip_space; /* still armed only if the piece was empty */
    size_t n = (size_t)s->n_pending + (k.n < piece ? k.n : piece);
    size_t done = utf8_complete_prefix(data, n);
    int w = (int)utf8_copy_valid(data, done, out, (size_t)cap);
    s->n_pending = (int)(n - done);
    memcpy(s->pending, data + done, (size_t)s->n_pending);
    if (data != stackbuf)
        free(data);
    return w;
}

int detok_flush(detok_stream *s, char *out, int cap)
{
    int w = cap > 0 ? (int)utf8_copy_valid(s->pending, (size_t)s->n_pending, out, (size_t)cap) : 0;
    s->n_pending = 0;
    return w;
}

int tokenizer_pre_split(const char *pre, const char *text, size_t len, size_t **ends)
{
    *ends = NULL;
    const pre_info *info = find_pre(pre, strlen(pre));
    if (!info)
        return -1;
    cptext c = {0};
    spanvec a = {0}, b = {0};
    int n = -1;
    if (cptext_init(&c, text, len) == 0 && pre_split(info->kind, &c, &a, &b) == 0 && a.n <= INT_MAX &&
        (*ends = malloc((a.n + 1) * sizeof **ends)) != NULL) {
        for (size_t p = 0; p < a.n; p++)
            (*ends)[p] = c.off[a.v[p].hi];
        n = (int)a.n;
    }
    cptext_free(&c);
    free(a.v);
    free(b.v);
    return n;
}
