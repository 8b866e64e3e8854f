/* test_tokenizer.c - SPM and BPE tokenizers against llama.cpp's published vocab test vectors
 * and Hugging Face's ids for hf-texts.json (every vocabulary found in shared/vocab), BOS/EOS
 * defaults, NFC, the stories260K reference prompt, round trips, streaming detokenization,
 * special tokens and hostile input.
 *
 * With --npm-vocab DIR IDS.json (tests/text/vocab/run.py) it checks instead the vocabularies
 * made from npm packages' tokenizer.json files (Tekken, Gemma 3) against the reference ids in
 * IDS.json: every text with and without added specials, decoded back, round trips. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/file.h"
#include "text/chat.h"
#include "model/gguf.h"
#include "synth/gguf_write.h"
#include "base/utf8.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

static const char *shared_dir(void)
{
    const char *d = getenv("INFERD_SHARED_DIR");
    return d && *d ? d : INFERD_SHARED_DIR;
}

/* The vocabularies made from npm packages (--npm-vocab): their folder and reference ids. */
static const char *npm_vocab_dir, *npm_ids_path;

/* Where the ggml-vocab-NAME.gguf files are: shared/vocab, or the npm vocabularies' folder. */
static const char *vocab_dir(void)
{
    static char path[512];
    if (npm_vocab_dir)
        return npm_vocab_dir;
    snprintf(path, sizeof path, "%s/vocab", shared_dir());
    return path;
}

/* ---- the vocabularies in shared/vocab ----------------------------------------------------
 * Found by listing the folder, so a vocabulary added there is tested without editing this
 * file: ggml-vocab-NAME.gguf (the vocabulary) and ggml-vocab-NAME.gguf.inp/.out (llama.cpp's
 * vectors for it); either may come without the other. */

enum { MAX_VOCABS = 64 };

typedef struct vocab_entry {
    char name[64];
    bool has_gguf, has_vectors;
} vocab_entry;

static vocab_entry vocab_list[MAX_VOCABS];
static int n_vocab_list = -1; /* -1: not listed yet */

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const vocab_entry *)a)->name, ((const vocab_entry *)b)->name);
}

static vocab_entry *vocab_entry_for(const char *name, size_t len)
{
    if (len == 0 || len >= sizeof vocab_list[0].name)
        return NULL;
    for (int i = 0; i < n_vocab_list; i++)
        if (strlen(vocab_list[i].name) == len && memcmp(vocab_list[i].name, name, len) == 0)
            return &vocab_list[i];
    if (n_vocab_list == MAX_VOCABS)
        return NULL;
    vocab_entry *e = &vocab_list[n_vocab_list++];
    memcpy(e->name, name, len);
    e->name[len] = 0;
    return e;
}

static bool ends_with(const char *s, size_t n, const char *suffix, size_t *stem)
{
    size_t k = strlen(suffix);
    if (n < k || strcmp(s + n - k, suffix) != 0)
        return false;
    *stem = n - k;
    return true;
}

/* The vocabularies present, sorted by name (0 when the folder is missing). */
static int list_vocabs(void)
{
    if (n_vocab_list >= 0)
        return n_vocab_list;
    n_vocab_list = 0;
    DIR *d = opendir(vocab_dir());
    if (!d)
        return 0;
    static const char prefix[] = "ggml-vocab-";
    for (struct dirent *de; (de = readdir(d));) {
        const char *s = de->d_name;
        if (strncmp(s, prefix, sizeof prefix - 1) != 0)
            continue;
        s += sizeof prefix - 1;
        size_t n = strlen(s), stem;
        vocab_entry *e;
        if (ends_with(s, n, ".gguf", &stem) && (e = vocab_entry_for(s, stem)))
            e->has_gguf = true;
        else if (ends_with(s, n, ".gguf.inp", &stem) && (e = vocab_entry_for(s, stem)))
            e->has_vectors = true;
    }
    closedir(d);
    qsort(vocab_list, (size_t)n_vocab_list, sizeof vocab_list[0], cmp_entry);
    return n_vocab_list;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *read_file(const char *path, size_t *len)
{
    char err[128];
    return file_read_all(path, (size_t)1 << 30, len, err, sizeof err);
}

/* An opened vocabulary: the GGUF must stay open only during load. */
typedef struct vocab {
    tokenizer *tok;
    double load_ms;
} vocab;

static bool open_vocab(const char *path, vocab *v)
{
    char err[256];
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f)
        return false;
    double t0 = now_ms();
    v->tok = tokenizer_load(f, err, sizeof err);
    v->load_ms = now_ms() - t0;
    gguf_close(f);
    if (!v->tok)
        print_error("%s: %s\n", path, err);
    return v->tok != NULL;
}

static bool open_named_vocab(const char *name, vocab *v)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", vocab_dir(), name);
    return open_vocab(path, v);
}

/* Encode into a malloc'd array (checking the "call again with a larger buffer" contract). */
static int32_t *encode(const tokenizer *t, const char *s, size_t len, bool bos, bool special,
                       int *n_out)
{
    int32_t probe[1];
    int n = tokenizer_encode(t, s, len, bos, special, probe, 0);
    assert_true(n >= 0);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(tokenizer_encode(t, s, len, bos, special, ids, n), n);
    *n_out = n;
    return ids;
}

static char *decode(const tokenizer *t, const int32_t *ids, int n, size_t *len)
{
    size_t need = tokenizer_decode(t, ids, n, NULL, 0);
    char *buf = malloc(need + 1);
    assert_non_null(buf);
    assert_int_equal(tokenizer_decode(t, ids, n, buf, need + 1), need);
    assert_int_equal(buf[need], 0);
    *len = need;
    return buf;
}

/* ---- llama.cpp's vocab test vectors ----------------------------------------------------- */

/* Check every .inp case against its .out line; returns the number that matched. */
static int run_vectors(const char *name, const tokenizer *t, int *n_cases)
{
    char path[1024];
    size_t inp_len, out_len;
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.inp", vocab_dir(), name);
    char *inp = read_file(path, &inp_len);
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.out", vocab_dir(), name);
    char *out = read_file(path, &out_len);
    assert_non_null(inp);
    assert_non_null(out);

    static const char sep[] = "\n__ggml_vocab_test__\n";
    int matched = 0, cases = 0;
    char *in_cur = inp, *out_cur = out;
    for (;;) {
        char *end = strstr(in_cur, sep);
        if (!end)
            break;
        char *line_end = strchr(out_cur, '\n');
        assert_non_null(line_end);
        *line_end = 0;
        int32_t want[512];
        int n_want = 0;
        for (char *p = out_cur, *q; n_want < 512; p = q) {
            long v = strtol(p, &q, 10);
            if (q == p)
                break;
            want[n_want++] = (int32_t)v;
        }
        int n;
        int32_t *got = encode(t, in_cur, (size_t)(end - in_cur), false, false, &n);
        bool ok = n == n_want && memcmp(got, want, (size_t)n * sizeof *got) == 0;
        if (ok) {
            matched++;
        } else {
            print_error("%s case %d mismatch: input '%.*s'\n  want:%s\n  got: ", name, cases,
                        (int)(end - in_cur), in_cur, out_cur);
            for (int i = 0; i < n; i++)
                print_error(" %d", got[i]);
            print_error("\n");
        }
        free(got);
        cases++;
        in_cur = end + strlen(sep);
        out_cur = line_end + 1;
    }
    free(inp);
    free(out);
    *n_cases = cases;
    return matched;
}

static void test_vocab_vectors(void **state)
{
    (void)state;
    int total = 0, total_ok = 0, n_tested = 0;
    if (list_vocabs() == 0) {
        print_message("no ggml-vocab-* files under %s\n", vocab_dir());
        skip();
    }
    for (int k = 0; k < n_vocab_list; k++) {
        const vocab_entry *e = &vocab_list[k];
        if (!e->has_gguf || !e->has_vectors)
            continue; /* reported by the tests below */
        vocab v;
        assert_true(open_named_vocab(e->name, &v));
        int cases;
        int ok = run_vectors(e->name, v.tok, &cases);
        print_message("vocab %-13s %2d/%2d inputs match (n_vocab %d, load %.1f ms)\n", e->name,
                      ok, cases, tokenizer_n_vocab(v.tok), v.load_ms);
        assert_true(cases >= 40);
        total += cases;
        total_ok += ok;
        n_tested++;
        tokenizer_free(v.tok);
    }
    print_message("all %d vocabs with vectors: %d/%d inputs match\n", n_tested, total_ok, total);
    assert_int_equal(total_ok, total);
}

/* Vectors whose vocabulary is not shared (qwen35): reported as skipped, not failed. */
static void test_vocab_vectors_without_gguf(void **state)
{
    (void)state;
    int missing = 0;
    for (int k = 0; k < list_vocabs(); k++) {
        const vocab_entry *e = &vocab_list[k];
        if (e->has_vectors && !e->has_gguf) {
            print_message("SKIPPED vocab %s: ggml-vocab-%s.gguf.inp/.out are shared but not "
                          "ggml-vocab-%s.gguf, so these vectors cannot be run\n",
                          e->name, e->name, e->name);
            missing++;
        } else if (e->has_gguf && !e->has_vectors) {
            print_message("vocab %s: no .inp/.out vectors (round trips and hostile input only)\n",
                          e->name);
        }
    }
    if (missing)
        skip();
}

/* ---- hf-texts.json: Hugging Face's ids ----------------------------------------------------
 * ids: encode without added specials, special tokens written in the text parsed (as POST
 * /tokenize does by default); ids_add_special: what HF's encode adds by default (BOS for
 * Llama 3, nothing for Qwen2), which is /tokenize with add_special. */

static cJSON *load_json(const char *rel);
static cJSON *load_json_path(const char *path);

/* The ids /tokenize gives for text: encode, then EOS where the vocabulary adds it. */
static int32_t *encode_like_tokenize(const tokenizer *t, const char *s, bool add_special, int *n)
{
    int32_t *ids = encode(t, s, strlen(s), add_special && tokenizer_add_bos(t), true, n);
    if (add_special && tokenizer_add_eos(t))
        ids[(*n)++] = tokenizer_eos(t); /* encode leaves room for one more */
    return ids;
}

static bool ids_equal(const int32_t *got, int n, const cJSON *want)
{
    if (!cJSON_IsArray(want) || cJSON_GetArraySize(want) != n)
        return false;
    for (int i = 0; i < n; i++)
        if (cJSON_GetArrayItem(want, i)->valueint != got[i])
            return false;
    return true;
}

static void print_ids(const char *what, const int32_t *ids, int n)
{
    print_error("  %s:", what);
    for (int i = 0; i < n; i++)
        print_error(" %d", ids[i]);
    print_error("\n");
}

/* A text decodes back to itself from its reference ids when none of them is a control token
 * (those render as nothing). */
static bool check_decodes_back(const char *name, const tokenizer *t, const char *text, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (tokenizer_is_control(t, ids[i]))
            return true;
    size_t len;
    char *back = decode(t, ids, n, &len);
    bool same = len == strlen(text) && memcmp(back, text, len) == 0;
    if (!same)
        print_error("%s: '%s' decodes back to '%s'\n", name, text, back);
    free(back);
    return same;
}

/* Every vocabulary of j's "expected" whose GGUF is in vocab_dir(): each text's ids with and
 * without added specials, and (with decode_back) the text decoded from its ids.  Returns the
 * number of vocabularies checked. */
static int check_reference_ids(const cJSON *j, bool decode_back)
{
    const cJSON *texts = cJSON_GetObjectItem(j, "texts"), *vocabs = cJSON_GetObjectItem(j, "expected");
    int n_texts = cJSON_GetArraySize(texts), checked = 0, bad = 0, n_vocabs = 0;
    assert_true(n_texts > 0);
    const cJSON *ve;
    cJSON_ArrayForEach(ve, vocabs)
    {
        vocab v;
        if (!open_named_vocab(ve->string, &v)) {
            print_message("SKIPPED reference ids for %s: no ggml-vocab-%s.gguf\n", ve->string, ve->string);
            continue;
        }
        const cJSON *want_plain = cJSON_GetObjectItem(ve, "ids");
        const cJSON *want_special = cJSON_GetObjectItem(ve, "ids_add_special");
        assert_int_equal(cJSON_GetArraySize(want_plain), n_texts);
        assert_int_equal(cJSON_GetArraySize(want_special), n_texts);
        int ok = 0, back_bad = 0;
        for (int i = 0; i < n_texts; i++) {
            const char *text = cJSON_GetStringValue(cJSON_GetArrayItem(texts, i));
            assert_non_null(text);
            for (int sp = 0; sp < 2; sp++) {
                int n;
                int32_t *got = encode_like_tokenize(v.tok, text, sp, &n);
                const cJSON *want = cJSON_GetArrayItem(sp ? want_special : want_plain, i);
                if (ids_equal(got, n, want)) {
                    ok++;
                    back_bad += decode_back && !sp && !check_decodes_back(ve->string, v.tok, text, got, n);
                } else {
                    char *w = cJSON_PrintUnformatted(want);
                    print_error("%s text %d%s mismatch: '%s'\n  want: %s\n", ve->string, i,
                                sp ? " (add_special)" : "", text, w);
                    print_ids("got", got, n);
                    free(w);
                    bad++;
                }
                checked++;
                free(got);
            }
        }
        print_message("reference ids %-10s %3d/%3d match (%d texts, with and without added specials; "
                      "n_vocab %d, load %.0f ms)\n", ve->string, ok, 2 * n_texts, n_texts, tokenizer_n_vocab(v.tok),
                      v.load_ms);
        if (decode_back)
            print_message("  %s: %d of the matching texts do not decode back\n", ve->string, back_bad);
        bad += back_bad;
        n_vocabs++;
        tokenizer_free(v.tok);
    }
    assert_int_equal(bad, 0);
    assert_true(n_vocabs == 0 || checked > 0);
    return n_vocabs;
}

/* --npm-vocab: the reference ids of the vocabularies made from npm packages (every one of
 * them must be there: tests/text/vocab/run.py made them). */
static void test_npm_reference_ids(void **state)
{
    (void)state;
    cJSON *j = load_json_path(npm_ids_path);
    if (!j)
        fail_msg("cannot read %s", npm_ids_path);
    int n_vocabs = check_reference_ids(j, true);
    assert_int_equal(n_vocabs, cJSON_GetArraySize(cJSON_GetObjectItem(j, "expected")));
    cJSON_Delete(j);
}

static void test_hf_texts(void **state)
{
    (void)state;
    cJSON *j = load_json("vocab/hf-texts.json");
    if (!j) {
        print_message("no %s/vocab/hf-texts.json\n", shared_dir());
        skip();
    }
    int n_vocabs = check_reference_ids(j, false);
    cJSON_Delete(j);
    if (n_vocabs == 0)
        skip();
}

/* The tokenizer of the GGUF w describes (w is freed); a load error fails the test, naming what. */
static tokenizer *tokenizer_from_writer(gguf_writer *w, const char *what)
{
    void *mem;
    size_t size;
    char err[256];
    assert_int_equal(gguf_writer_write_mem(w, &mem, &size), 0);
    gguf_writer_free(w);
    gguf_file *f = gguf_open_memory(mem, size, err, sizeof err);
    assert_non_null(f);
    tokenizer *t = tokenizer_load(f, err, sizeof err);
    if (!t) fail_msg("%s: %s", what, err);
    gguf_close(f); /* the tokenizer keeps copies of what it read */
    free(mem);
    return t;
}

/* A text and the ids it must encode to (parse_special on). */
typedef struct enc_case {
    const char *text;
    int32_t ids[12];
    int n;
} enc_case;

/* The ids of c->text (with BOS when bos), failing the test unless they are c's; the caller
 * frees them. */
static int32_t *expect_ids(const tokenizer *t, const enc_case *c, bool bos, int *n)
{
    int32_t *ids = encode(t, c->text, strlen(c->text), bos, true, n);
    if (*n != c->n || memcmp(ids, c->ids, (size_t)*n * sizeof *ids) != 0) {
        print_ids("got", ids, *n);
        fail_msg("'%s': %d ids, expected %d", c->text, *n, c->n);
    }
    return ids;
}

/* A writer holding a vocabulary: its kind, tokens and types, and the BOS/EOS/unknown ids. */
static gguf_writer *vocab_writer(const char *model, const char *const *toks, const int32_t *types, int n,
                                 const int32_t special[3])
{
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)special[0]);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)special[1]);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)special[2]);
    return w;
}

/* ---- WordPiece (BERT) -------------------------------------------------------------------- */

/* BERT's vocabulary as llama.cpp's converter writes it: word-initial pieces with "\u2581", the
 * "##" continuations without it.  Expectations are what transformers' BertTokenizer (lowercase)
 * gives for the same vocabulary. */
static void test_wordpiece(void **state)
{
    (void)state;
    static const char *const toks[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581hello", "\u2581world",
                                       "\u2581un", "aff", "able", "\u2581!", "\u2581,", "s", "\u2581the",
                                       "\u2581\u00e9t\u00e9", "\u2581\u4e2d", "\u2581$"};
    const int n_toks = (int)(sizeof toks / sizeof toks[0]);
    int32_t types[sizeof toks / sizeof toks[0]];
    for (int i = 0; i < n_toks; i++) types[i] = i < 5 ? 3 : 1;
    gguf_writer *w = vocab_writer("bert", toks, types, n_toks, (const int32_t[3]){2, 3, 1});
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true);
    tokenizer *t = tokenizer_from_writer(w, "bert");
    assert_true(tokenizer_add_bos(t) && tokenizer_add_eos(t));
    char desc[128];
    tokenizer_describe(t, desc, sizeof desc);
    assert_non_null(strstr(desc, "WordPiece"));
    static const enc_case cases[] = {
        {"Hello, World!", {2, 5, 11, 6, 10}, 5},          /* lowercased, punctuation split off */
        {"unaffable", {2, 7, 8, 9}, 4},                  /* greedy longest pieces */
        {"  hellos\tthe\n", {2, 5, 12, 13}, 4},          /* continuation; any whitespace separates */
        {"xyz hello qhello", {2, 1, 5, 1}, 4},           /* a word not covered whole is one [UNK] */
        {"hel\x01lo", {2, 5}, 2},                        /* control characters are dropped */
        {"\u00c9T\u00c9 \u4e2d$", {2, 14, 15, 16}, 4},   /* Latin-1 capitals lowercased; CJK, ASCII symbols alone */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n;
        free(expect_ids(t, &cases[c], true, &n));
    }
    const int32_t words[] = {2, 5, 11, 6, 12, 3};
    char out[64];
    tokenizer_decode(t, words, 6, out, sizeof out);
    assert_string_equal(out, "hello , worlds"); /* as llama.cpp joins WordPiece pieces */
    tokenizer_free(t);
}

/* ---- BOS/EOS defaults -------------------------------------------------------------------- */

/* A small BPE vocabulary with BOS/EOS tokens; add_bos < 0 leaves the key out. */
static tokenizer *bpe_with(const char *pre, int add_bos)
{
    static const char *const toks[] = {"a", "b", "ab", "<|begin_of_text|>", "<|end_of_text|>"};
    static const int32_t types[] = {1, 1, 1, 3, 3};
    static const char *const merges[] = {"a b"};
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (pre)
        gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 5);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, 5);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 3);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 4);
    if (add_bos >= 0)
        gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    return tokenizer_from_writer(w, pre ? pre : "(no pre)");
}

/* ---- SentencePiece-style BPE (tokenizer.ggml.model "gemma4") ---------------------------- */

/* A writer holding Gemma's layout: <pad> <eos> <bos> <unk>, the 256 <0xNN> byte tokens, then
 * the given tokens (their types in types, 0 = normal); scores -1000 as the converter writes. */
static gguf_writer *spbpe_writer(const char *const *toks, const int32_t *types, int n_toks)
{
    int n = 4 + 256 + n_toks;
    char **all = malloc((size_t)n * sizeof *all);
    int32_t *type = malloc((size_t)n * sizeof *type);
    float *score = malloc((size_t)n * sizeof *score);
    assert_true(all && type && score);
    static const char *const head[] = {"<pad>", "<eos>", "<bos>", "<unk>"};
    for (int i = 0; i < n; i++) {
        char buf[16];
        if (i < 4)
            snprintf(buf, sizeof buf, "%s", head[i]);
        else if (i < 260)
            snprintf(buf, sizeof buf, "<0x%02X>", i - 4);
        all[i] = strdup(i < 260 ? buf : toks[i - 260]);
        type[i] = i < 4 ? 3 : i < 260 ? 6 : (types && types[i - 260] ? types[i - 260] : 1);
        score[i] = -1000.0f;
    }
    gguf_writer *w = vocab_writer("gemma4", (const char *const *)all, type, n, (const int32_t[3]){2, 1, 3});
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", score, (uint64_t)n);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    for (int i = 0; i < n; i++)
        free(all[i]);
    free(all);
    free(type);
    free(score);
    return w;
}

/* Spaces become U+2581, merges go by rank (not by the scores, all equal), a character the
 * vocabulary lacks becomes its <0xNN> bytes, a user-defined token is matched in the text,
 * <bos> is always added (as llama.cpp does for Gemma 4), and decoding gives the text back. */
static void test_spbpe(void **state)
{
    (void)state;
    static const char *const toks[] = {"\u2581", "h", "e", "l", "o", "w", "r", "d", "ll", "he", "hell", "hello",
                                       "\u2581w", "or", "\u2581wor", "\u2581worl", "\u2581world", "el", "\n\n"};
    static const int32_t types[] = {[18] = 4}; /* "\n\n": user-defined */
    enum { FIRST = 260 };                       /* the id of toks[0] */
    /* "e l" is listed after "l l": "hell" comes from he + ll, never from h + el + l */
    static const char *const merges[] = {"l l", "h e", "he ll", "hell o", "\u2581 w", "o r", "\u2581w or",
                                         "\u2581wor l", "\u2581worl d", "e l"};
    gguf_writer *w = spbpe_writer(toks, types, 19);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 10);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    tokenizer *t = tokenizer_from_writer(w, "gemma4");
    assert_true(tokenizer_add_bos(t)); /* the key said false */
    char desc[256];
    tokenizer_describe(t, desc, sizeof desc);
    assert_non_null(strstr(desc, "SentencePiece-style BPE"));
    static const enc_case cases[] = {
        {"hello world", {FIRST + 11, FIRST + 16}, 2},
        {"hell", {FIRST + 10}, 1},
        {" world", {FIRST + 16}, 1},
        {"h\xC3\xA9llo", {FIRST + 1, 4 + 0xC3, 4 + 0xA9, FIRST + 8, FIRST + 4}, 5},
        {"hello\n\nworld", {FIRST + 11, FIRST + 18, FIRST + 5, FIRST + 13, FIRST + 3, FIRST + 7}, 6},
        {"<bos>hello", {2, FIRST + 11}, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n;
        int32_t *ids = expect_ids(t, &cases[c], false, &n);
        if (c < 5) { /* the ones without a control token decode back */
            size_t len;
            char *back = decode(t, ids, n, &len);
            assert_int_equal(len, strlen(cases[c].text));
            assert_memory_equal(back, cases[c].text, len);
            free(back);
        }
        free(ids);
    }
    tokenizer_free(t);

    /* merges are required, as for byte-level BPE */
    char err[256];
    void *mem;
    size_t size;
    w = spbpe_writer(toks, types, 19);
    assert_int_equal(gguf_writer_write_mem(w, &mem, &size), 0);
    gguf_writer_free(w);
    gguf_file *f = gguf_open_memory(mem, size, err, sizeof err);
    assert_null(tokenizer_load(f, err, sizeof err));
    assert_non_null(strstr(err, "tokenizer.ggml.merges is missing"));
    gguf_close(f);
    free(mem);
}

/* Special tokens are found in the text by one lookup per distinct length: thousands of them
 * sharing a first byte (Gemma's 6,300 starting with '<') cost no more than a few.  The bound
 * (15 s for 1M lookups, ~0.1-0.3 s here) is a guard against the old cost, not a speed target:
 * generous for a loaded machine and sanitizers; comparing each token in turn, as before, is
 * 6 billion comparisons. */
static void test_many_specials(void **state)
{
    (void)state;
    enum { N_UNUSED = 6000 };
    char **toks = malloc((N_UNUSED + 2) * sizeof *toks);
    int32_t *types = malloc((N_UNUSED + 2) * sizeof *types);
    assert_true(toks && types);
    for (int i = 0; i < N_UNUSED; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "<unused%d>", i);
        toks[i] = strdup(buf);
        types[i] = i % 2 ? 4 : 3; /* user-defined and control alike */
    }
    toks[N_UNUSED] = strdup("<");
    toks[N_UNUSED + 1] = strdup("<<");
    types[N_UNUSED] = types[N_UNUSED + 1] = 0;
    static const char *const merges[] = {"< <"};
    gguf_writer *w = spbpe_writer((const char *const *)toks, types, N_UNUSED + 2);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    tokenizer *t = tokenizer_from_writer(w, "many specials");
    const int32_t first = 260, lt = first + N_UNUSED;

    /* longest match first: <unused12> is not <unused1> + "2>" */
    const char *text = "<unused12><unused1><<unused5999>x";
    int n;
    int32_t *ids = encode(t, text, strlen(text), false, true, &n);
    const int32_t want[] = {first + 12, first + 1, lt, first + 5999, 4 + 'x'};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    ids = encode(t, text, strlen(text), false, false, &n); /* not parsed: plain text */
    assert_true(n > 5);
    free(ids);

    /* The lookup itself, at every position of 1 MB of '<' (the encoder does this too); each
     * took 6,000 comparisons before. */
    size_t big = 1 << 20, found = 0;
    char *lts = malloc(big);
    assert_non_null(lts);
    memset(lts, '<', big);
    double t0 = now_ms();
    for (size_t i = 0; i < big; i++)
        found += tokenizer_control_at(t, lts + i, big - i);
    double ms = now_ms() - t0;
    print_message("1 MB of '<' against %d special tokens starting with '<': %.0f ms of lookups\n", N_UNUSED, ms);
    assert_int_equal(found, 0);
    assert_true(ms < 15000);
    memcpy(lts + big - 12, "<unused5999>", 12); /* user-defined: not a control token */
    memcpy(lts + big - 24, "<unused5996>", 12);
    assert_int_equal(tokenizer_control_at(t, lts + big - 24, 24), 12);
    assert_int_equal(tokenizer_control_at(t, lts + big - 12, 12), 0);
    ids = encode(t, lts + big - 65536, 65536, false, true, &n);
    assert_int_equal(n, (65536 - 24) / 2 + 2);
    assert_int_equal(ids[0], lt + 1);
    assert_int_equal(ids[n - 1], first + 5999);
    free(ids);
    free(lts);
    tokenizer_free(t);
    for (int i = 0; i < N_UNUSED + 2; i++)
        free(toks[i]);
    free(toks);
    free(types);
}

/* Tekken (Mistral Nemo, Small 3.x, Devstral): its pre-tokenizer's pieces against those of its
 * tokenizer.json regex, with Unicode's case classes (Lu/Lt upper, Ll lower, Lm/Lo and marks
 * both), as Python's `regex` module splits these texts (UCP_UPPER / UCP_LOWER in unicode_data.c)
 * (tests/text/gen_tekken_pieces.py writes this table).  Upper runs before lower ones stay
 * one word ("HELLOworld"), a title-case digraph starts one, every digit is its own piece,
 * '/' and line breaks end a symbol run, and there are no contractions. */
static void test_tekken_pieces(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        size_t lens[16]; /* the pieces' byte lengths, 0-terminated */
    } cases[] = {
        {"Hello World", {5, 6, 0}},
        {"HELLOworld and iPhone", {10, 4, 2, 5, 0}},
        {"ABC def GHI", {3, 4, 4, 0}},
        {"McDonald's don't I'M", {2, 6, 2, 4, 2, 2, 2, 0}},
        {"\303\211ric caf\303\251 \303\221AND\303\232 stra\303\237e", {5, 6, 8, 8, 0}},
        {"\307\205emal \307\204EMAL \307\206emal", {6, 7, 7, 0}},
        {"\312\260ello a\312\260\312\260", {6, 6, 0}},
        {"e\314\201E\314\201 \314\201x", {3, 3, 4, 0}},
        {"\346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202\255\343\202\271\343\203\210", {24, 0}},
        {"\354\225\210\353\205\225\355\225\230\354\204\270\354\232\224 \354\204\270\352\263\204", {15, 7, 0}},
        {"\331\205\330\261\330\255\330\250\330\247 \330\250\330\247\331\204\330\271\330\247\331\204\331\205", {10, 15, 0}},
        {"\340\244\250\340\244\256\340\244\270\340\245\215\340\244\244\340\245\207 \340\244\246\340\245\201\340\244\250\340\244\277\340\244\257\340\244\276", {18, 19, 0}},
        {"12345 3.14 x2y", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 0}},
        {"x/y//z\012", {1, 2, 2, 1, 1, 0}},
        {" !!!/\012\012", {7, 0}},
        {"a   b\012\012  c  ", {1, 2, 2, 2, 1, 2, 2, 0}},
        {"line\015\012next\015\012\015\012", {4, 2, 4, 4, 0}},
        {"foo/bar.baz\077q=1", {3, 4, 4, 2, 1, 1, 0}},
        {"\360\237\221\213 hi \360\237\216\211\360\237\216\211", {4, 3, 9, 0}},
        {"\011Tab\302\240nbsp \343\200\200wide", {4, 6, 1, 7, 0}},
        {"\316\221\316\222\316\223 \316\261\316\262\316\263 \316\243\316\257\317\203\317\205\317\206\316\277\317\202", {6, 7, 15, 0}},
        {"\307\210ubljana \307\211", {9, 3, 0}},
        {"  leading and trailing  ", {1, 8, 4, 9, 2, 0}},
        {"(x+y)*z == \042done\042", {2, 2, 2, 1, 3, 2, 4, 1, 0}},
    };
    tokenizer *t = bpe_with("tekken", -1);
    assert_true(tokenizer_add_bos(t)); /* llama.cpp's default for tekken */
    tokenizer_free(t);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t *ends = NULL;
        int n = tokenizer_pre_split("tekken", cases[i].text, strlen(cases[i].text), &ends);
        int want = 0;
        while (cases[i].lens[want]) want++;
        size_t off = 0;
        bool same = n == want;
        for (int p = 0; same && p < n; p++) {
            off += cases[i].lens[p];
            same = ends[p] == off;
        }
        if (!same) {
            for (int p = 0, lo = 0; p < n; lo = (int)ends[p], p++)
                print_message("  piece %d: \"%.*s\"\n", p, (int)ends[p] - lo, cases[i].text + lo);
            fail_msg("case %zu: %d pieces, expected %d", i, n, want);
        }
        free(ends);
    }
}

static void test_bos_defaults(void **state)
{
    (void)state;
    /* Without the key: llama.cpp's default per pre-tokenizer (src/llama-vocab.cpp). */
    static const struct {
        const char *pre;
        bool bos;
    } cases[] = {
        {"llama-bpe", true}, {"llama3", true}, {"llama-v3", true}, {"falcon3", true},
        {"qwen2", false},    {"gpt-2", false}, {"gpt2", false},    {"dbrx", false},
        {"smaug-bpe", false}, {"deepseek-llm", false}, {"deepseek-v3", false}, {"starcoder", false}, {"glm4", false},
        {"tekken", true}, {NULL, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tokenizer *t = bpe_with(cases[i].pre, -1);
        assert_int_equal(tokenizer_add_bos(t), cases[i].bos);
        assert_false(tokenizer_add_eos(t));
        char desc[512];
        tokenizer_describe(t, desc, sizeof desc);
        assert_non_null(strstr(desc, "no tokenizer.ggml.add_bos_token: default for pre-tokenizer"));
        tokenizer_free(t);
        /* The key, where present, decides. */
        t = bpe_with(cases[i].pre, !cases[i].bos);
        assert_int_equal(tokenizer_add_bos(t), !cases[i].bos);
        tokenizer_describe(t, desc, sizeof desc);
        assert_non_null(strstr(desc, "(tokenizer.ggml.add_bos_token)"));
        tokenizer_free(t);
    }

    /* The shared vocabularies: the Llama 3.1 file has no add_bos key, yet BOS is added. */
    static const struct {
        const char *name;
        bool bos;
    } real[] = {{"llama-bpe", true}, {"qwen2", false}, {"gpt-2", false}, {"llama-spm", true},
                {"phi-3", true}};
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
        vocab v;
        if (!open_named_vocab(real[i].name, &v)) {
            print_message("SKIPPED %s: no ggml-vocab-%s.gguf\n", real[i].name, real[i].name);
            continue;
        }
        char desc[512];
        tokenizer_describe(v.tok, desc, sizeof desc);
        print_message("%-10s %s\n", real[i].name, desc);
        assert_int_equal(tokenizer_add_bos(v.tok), real[i].bos);
        assert_false(tokenizer_add_eos(v.tok));
        tokenizer_free(v.tok);
    }
}

/* A Llama 3 prompt starts with exactly one <|begin_of_text|>: a plain text gets it added, a
 * chat prompt whose template writes it (or a text that writes it) does not get a second. */
static void test_prompt_bos_once(void **state)
{
    (void)state;
    vocab v;
    if (!open_named_vocab("llama-bpe", &v))
        skip();
    const tokenizer *t = v.tok;
    const int32_t bos = 128000;
    assert_int_equal(tokenizer_bos(t), bos);

    const char *plain = "Hello world";
    assert_true(tokenizer_prompt_bos(t, plain, strlen(plain)));
    int n;
    int32_t *ids = encode(t, plain, strlen(plain), tokenizer_prompt_bos(t, plain, strlen(plain)),
                          true, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], bos);
    assert_int_equal(ids[1], 9906);
    assert_int_equal(ids[2], 1917);
    free(ids);

    size_t len;
    const char *bos_text = tokenizer_token_text(t, bos, &len);
    char bos_buf[64];
    snprintf(bos_buf, sizeof bos_buf, "%.*s", (int)len, bos_text);
    chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hello world"}};
    char err[128];
    char *chat = chat_render(CHAT_TMPL_LLAMA3, msgs, 2, true, bos_buf, "<|eot_id|>", err, sizeof err);
    assert_non_null(chat);
    assert_memory_equal(chat, "<|begin_of_text|>", 17); /* the template writes it */
    bool add = tokenizer_prompt_bos(t, chat, strlen(chat));
    assert_false(add);
    ids = encode(t, chat, strlen(chat), add, true, &n);
    int n_bos = 0;
    for (int i = 0; i < n; i++)
        n_bos += ids[i] == bos;
    assert_int_equal(ids[0], bos);
    assert_int_equal(n_bos, 1);
    free(ids);
    free(chat);

    /* A template that does not write it (ChatML here) gets it from the vocabulary. */
    chat = chat_render(CHAT_TMPL_CHATML, msgs, 2, true, bos_buf, "<|eot_id|>", err, sizeof err);
    assert_true(tokenizer_prompt_bos(t, chat, strlen(chat)));
    free(chat);
    /* No BOS vocabulary: never. */
    tokenizer_free(v.tok);
    if (!open_named_vocab("qwen2", &v))
        skip();
    assert_false(tokenizer_prompt_bos(v.tok, plain, strlen(plain)));
    tokenizer_free(v.tok);
}

/* ---- NFC ----------------------------------------------------------------------------------
 * Expected forms from Python's unicodedata.normalize("NFC", ...); unicode.c was also checked
 * against it for every code point, its NFD and 200k random mark sequences when written. */

static void test_nfc(void **state)
{
    (void)state;
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"e\xCC\x81", "\xC3\xA9"},
        {"cafe\xCC\x81 nai\xCC\x88ve", "caf\xC3\xA9 na\xC3\xAFve"},
        {"a\xCC\x81\xCC\x96", "\xC3\xA1\xCC\x96"},        /* reordered: below mark first */
        {"a\xCC\x96\xCC\x81", "\xC3\xA1\xCC\x96"},        /* not blocked by the lower class */
        {"\xE2\x84\xAB", "\xC3\x85"},                     /* singleton: ANGSTROM SIGN */
        {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"},     /* composition exclusion */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* Hangul L V T */
        {"\xEA\xB0\x80\xE1\x86\xA8", "\xEA\xB0\x81"},     /* Hangul LV + T */
        {"\xE1\xB8\x8B\xCC\xA3", "\xE1\xB8\x8D\xCC\x87"}, /* d: dot above + below */
        {"\xC3\x85\xCC\x81", "\xC7\xBA"},                 /* composite + mark */
        {"\xCD\x84", "\xCC\x88\xCC\x81"},                 /* non-starter decomposition */
        {"e\xCC\x81\xCC\x81", "\xC3\xA9\xCC\x81"},        /* second acute is blocked */
        {"A\xCC\x8A\xFF\xCC\x8A", "\xC3\x85\xFF\xCC\x8A"}, /* an invalid byte stays, blocks */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        size_t len;
        assert_int_equal(unicode_nfc(cases[i].in, strlen(cases[i].in), &out, &len), 0);
        assert_non_null(out);
        assert_int_equal(len, strlen(cases[i].want));
        assert_memory_equal(out, cases[i].want, len);
        free(out);
        /* NFC is idempotent: the result is left alone, without a copy. */
        assert_int_equal(unicode_nfc(cases[i].want, strlen(cases[i].want), &out, &len), 0);
        assert_null(out);
    }
    static const char *const unchanged[] = {"plain ASCII", "caf\xC3\xA9 \xED\x95\x9C\xEA\xB5\xAD",
                                            "\xE1\x84\x80\xCC\x81\xE1\x85\xA1", "\xCC\x81", ""};
    for (size_t i = 0; i < sizeof unchanged / sizeof unchanged[0]; i++) {
        char *out = (char *)1;
        size_t len;
        assert_int_equal(unicode_nfc(unchanged[i], strlen(unchanged[i]), &out, &len), 0);
        assert_null(out);
        assert_int_equal(len, strlen(unchanged[i]));
    }

    /* The issue's text: Qwen2 normalizes (Hugging Face's ids), Llama 3 does not. */
    const char *text = "cafe\xCC\x81 nai\xCC\x88ve";
    static const int32_t want_qwen2[] = {924, 58858, 94880, 586};
    vocab v;
    int n;
    if (open_named_vocab("qwen2", &v)) {
        assert_true(tokenizer_normalizes_nfc(v.tok));
        int32_t *ids = encode(v.tok, text, strlen(text), false, true, &n);
        assert_int_equal(n, 4);
        assert_memory_equal(ids, want_qwen2, sizeof want_qwen2);
        free(ids);
        tokenizer_free(v.tok);
    } else {
        print_message("SKIPPED the Qwen2 NFC check: no ggml-vocab-qwen2.gguf\n");
    }
    if (open_named_vocab("llama-bpe", &v)) {
        assert_false(tokenizer_normalizes_nfc(v.tok));
        int32_t *ids = encode(v.tok, text, strlen(text), false, true, &n);
        assert_int_equal(n, 7); /* the combining marks stay separate characters */
        free(ids);
        tokenizer_free(v.tok);
    }
}

/* ---- round trips -------------------------------------------------------------------------- */

static const char *const roundtrip_texts[] = {
    "Hello world",
    " leading space and trailing space ",
    "  two leading spaces",
    "tabs\tand\nnew\r\nlines\n\n",
    "Grüße aus Köln, ça va? Ελληνικά, русский текст, עברית, العربية",
    "日本語のテキストと中文字符，한국어도 있습니다。",
    "emoji 🦙🚀👩‍👩‍👧 flags 🇫🇷 and math ∑∫√∞ ≠ ≤",
    "numbers 1234567890 3.14159 1,000,000 ١٢٣ ⅷ",
    "code: for (int i = 0; i < n; ++i) { x += a[i] * b[i]; } // done",
    "it's, I'll, we've, they're, 'D'M'LL",
    "combining: e\xCC\x81 a\xCC\x8A n\xCC\x83 and zero\xE2\x80\x8Bwidth",
    "\xF0\x9D\x94\x98\xF0\x9D\x94\xAB\xF0\x9D\x94\xA6 astral letters",
};

static void check_roundtrip(const char *name, const tokenizer *t, const char *text,
                            size_t text_len)
{
    /* A normalizing tokenizer gives back the NFC form of the text. */
    char *nfc = NULL;
    size_t len = text_len;
    if (tokenizer_normalizes_nfc(t))
        assert_int_equal(unicode_nfc(text, text_len, &nfc, &len), 0);
    const char *want = nfc ? nfc : text;
    int n;
    int32_t *ids = encode(t, text, text_len, false, false, &n);
    size_t dlen;
    char *back = decode(t, ids, n, &dlen);
    if (dlen != len || memcmp(back, want, len) != 0)
        print_error("%s: round trip of '%.*s' gave '%s'\n", name, (int)text_len, text, back);
    assert_int_equal(dlen, len);
    assert_memory_equal(back, want, len);
    free(back);

    /* With BOS in front the decoded text is the same: control tokens render as nothing. */
    int32_t *with_bos = encode(t, text, text_len, true, false, &n);
    back = decode(t, with_bos, n, &dlen);
    assert_int_equal(dlen, len);
    assert_memory_equal(back, want, len);
    free(back);
    free(with_bos);
    free(ids);
    free(nfc);
}

/* Calls fn with every shared vocabulary that has a .gguf; skips when there is none. */
static void for_each_vocab(void (*fn)(const char *name, const tokenizer *t, void *ctx), void *ctx)
{
    int n = 0;
    for (int k = 0; k < list_vocabs(); k++) {
        if (!vocab_list[k].has_gguf)
            continue;
        vocab v;
        assert_true(open_named_vocab(vocab_list[k].name, &v));
        fn(vocab_list[k].name, v.tok, ctx);
        tokenizer_free(v.tok);
        n++;
    }
    if (n == 0) {
        print_message("no ggml-vocab-*.gguf under %s\n", vocab_dir());
        skip();
    }
}

static void roundtrip_vocab(const char *name, const tokenizer *t, void *ctx)
{
    (void)ctx;
    for (size_t i = 0; i < sizeof roundtrip_texts / sizeof roundtrip_texts[0]; i++)
        check_roundtrip(name, t, roundtrip_texts[i], strlen(roundtrip_texts[i]));
}

static void test_roundtrip(void **state)
{
    (void)state;
    for_each_vocab(roundtrip_vocab, NULL);
}

/* ---- stories260K: the reference prompt -------------------------------------------------- */

static cJSON *load_json_path(const char *path)
{
    size_t len;
    char *txt = read_file(path, &len);
    if (!txt)
        return NULL;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    return j;
}

/* A JSON file under the shared folder. */
static cJSON *load_json(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", shared_dir(), rel);
    return load_json_path(path);
}

static bool open_stories(vocab *v)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", shared_dir());
    return open_vocab(path, v);
}

static void test_stories260k_prompt(void **state)
{
    (void)state;
    vocab v;
    cJSON *ref = load_json("vectors/stories260K-greedy.json");
    if (!ref || !open_stories(&v)) {
        print_message("stories260K.gguf or stories260K-greedy.json missing under %s\n",
                      shared_dir());
        cJSON_Delete(ref);
        skip();
    }
    const tokenizer *t = v.tok;
    assert_int_equal(tokenizer_n_vocab(t), 512);
    assert_int_equal(tokenizer_bos(t), 1);
    assert_int_equal(tokenizer_eos(t), 2);
    assert_true(tokenizer_add_bos(t));
    assert_true(tokenizer_is_eog(t, 2));
    assert_true(tokenizer_is_control(t, 1));

    int checked = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(ref, "cases"))
    {
        const char *prompt = cJSON_GetStringValue(cJSON_GetObjectItem(c, "prompt"));
        cJSON *want = cJSON_GetObjectItem(c, "prompt_tokens");
        assert_non_null(prompt);
        int n;
        int32_t *ids = encode(t, prompt, strlen(prompt), true, false, &n);
        assert_int_equal(n, cJSON_GetArraySize(want));
        for (int i = 0; i < n; i++)
            assert_int_equal(ids[i], cJSON_GetArrayItem(want, i)->valueint);
        free(ids);

        /* The whole greedy sequence decodes to run.c's output (which strips the first piece's
         * space and appends a newline) whenever that output has no skipped bytes. */
        cJSON *seq = cJSON_GetObjectItem(c, "sequence_tokens");
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(c, "stdout_text"));
        int ns = cJSON_GetArraySize(seq);
        int32_t *all = malloc((size_t)ns * sizeof *all);
        for (int i = 0; i < ns; i++)
            all[i] = cJSON_GetArrayItem(seq, i)->valueint;
        size_t dlen;
        char *dec = decode(t, all, ns, &dlen);
        if (text && strlen(text) == dlen + 1) {
            assert_memory_equal(dec, text, dlen);
            checked++;
        }
        free(dec);
        free(all);
    }
    print_message("stories260K: %d cases' full sequences decoded to run.c's text\n", checked);
    assert_true(checked >= 1);

    int n;
    int32_t *ids = encode(t, "", 0, true, false, &n);
    assert_int_equal(n, 1); /* empty prompt = [BOS] */
    assert_int_equal(ids[0], 1);
    free(ids);
    cJSON_Delete(ref);
    tokenizer_free(v.tok);
}

/* ---- streaming detokenizer --------------------------------------------------------------- */

static void test_detok_stream(void **state)
{
    (void)state;
    vocab v;
    if (!open_stories(&v))
        skip();
    const tokenizer *t = v.tok;
    /* 世, 界 and 🙂 are not in the 512-token vocabulary: they become 3 + 3 + 4 byte tokens. */
    const char *text = "Lily saw é, 世界 and 🙂!";
    int n;
    int32_t *ids = encode(t, text, strlen(text), true, false, &n);
    int byte_tokens = 0;
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *s = tokenizer_token_text(t, ids[i], &len);
        byte_tokens += len == 6 && strncmp(s, "<0x", 3) == 0;
    }
    assert_int_equal(byte_tokens, 3 + 3 + 4);

    detok_stream ds;
    detok_init(&ds, t, true);
    char all[256], chunk[64];
    size_t total = 0;
    int held = 0;
    for (int i = 0; i < n; i++) {
        int w = detok_feed(&ds, ids[i], chunk, sizeof chunk);
        assert_true(w >= 0);
        assert_true(utf8_valid(chunk, (size_t)w)); /* never half a character */
        held += w == 0 && i > 0;
        memcpy(all + total, chunk, (size_t)w);
        total += (size_t)w;
    }
    total += (size_t)detok_flush(&ds, all + total, 16);
    assert_int_equal(total, strlen(text));
    assert_memory_equal(all, text, total); /* SPM's added leading space is dropped */
    assert_int_equal(held, 2 + 2 + 3); /* every byte but a character's last is held */

    /* An unfinished sequence left at the end becomes one U+FFFD on flush (a maximal subpart);
     * an impossible byte is replaced at once. */
    int32_t e4 = tokenizer_find(t, "<0xE4>"), ff = tokenizer_find(t, "<0xFF>");
    int32_t b8 = tokenizer_find(t, "<0xB8>");
    assert_true(e4 >= 0 && ff >= 0 && b8 >= 0);
    detok_init(&ds, t, false);
    assert_int_equal(detok_feed(&ds, e4, chunk, sizeof chunk), 0);
    assert_int_equal(detok_feed(&ds, b8, chunk, sizeof chunk), 0);
    assert_int_equal(detok_flush(&ds, chunk, sizeof chunk), 3);
    assert_memory_equal(chunk, "\xEF\xBF\xBD", 3);
    assert_int_equal(detok_feed(&ds, ff, chunk, sizeof chunk), 3);
    assert_memory_equal(chunk, "\xEF\xBF\xBD", 3);
    /* A lead byte followed by a non-continuation: the lead is replaced, the rest kept. */
    int32_t a = tokenizer_find(t, "<0x41>");
    assert_int_equal(detok_feed(&ds, e4, chunk, sizeof chunk), 0);
    assert_int_equal(detok_feed(&ds, a, chunk, sizeof chunk), 4);
    assert_memory_equal(chunk, "\xEF\xBF\xBD" "A", 4);
    assert_int_equal(detok_flush(&ds, chunk, sizeof chunk), 0);

    /* Token bytes: byte tokens, the U+2581 space, control tokens only when asked. */
    char buf[16];
    assert_int_equal(tokenizer_token_bytes(t, a, false, buf, sizeof buf), 1);
    assert_int_equal(buf[0], 'A');
    assert_int_equal(tokenizer_token_bytes(t, 1, false, buf, sizeof buf), 0);
    assert_int_equal(tokenizer_token_bytes(t, 1, true, buf, sizeof buf), 3);
    assert_memory_equal(buf, "<s>", 3);
    assert_int_equal(tokenizer_token_bytes(t, tokenizer_n_vocab(t), false, buf, sizeof buf), -1);
    assert_int_equal(tokenizer_token_bytes(t, -5, false, buf, sizeof buf), -1);
    free(ids);
    tokenizer_free(v.tok);
}

/* Streaming with byte-level BPE: the bytes of one character are spread over tokens. */
static void test_detok_stream_bpe(void **state)
{
    (void)state;
    vocab v;
    if (!open_named_vocab("gpt-2", &v))
        skip();
    const char *text = "naïve 🦙 ★ résumé 日本";
    int n;
    int32_t *ids = encode(v.tok, text, strlen(text), false, false, &n);
    detok_stream ds;
    detok_init(&ds, v.tok, true);
    char all[128], chunk[64];
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int w = detok_feed(&ds, ids[i], chunk, sizeof chunk);
        assert_true(utf8_valid(chunk, (size_t)w));
        memcpy(all + total, chunk, (size_t)w);
        total += (size_t)w;
    }
    total += (size_t)detok_flush(&ds, all + total, 16);
    assert_int_equal(total, strlen(text));
    assert_memory_equal(all, text, total); /* no space stripping for BPE */
    free(ids);
    tokenizer_free(v.tok);
}

/* ---- special tokens ---------------------------------------------------------------------- */

static bool contains(const int32_t *ids, int n, int32_t id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

static void test_special_tokens(void **state)
{
    (void)state;
    vocab v;
    if (!open_named_vocab("phi-3", &v))
        skip();
    const tokenizer *t = v.tok;
    int32_t user = tokenizer_find(t, "<|user|>"), end = tokenizer_find(t, "<|end|>");
    int32_t asst = tokenizer_find(t, "<|assistant|>");
    assert_true(user >= 0 && end >= 0 && asst >= 0);
    assert_true(tokenizer_is_eog(t, end));
    assert_int_equal(tokenizer_eot(t), end);
    assert_true(tokenizer_is_eog(t, tokenizer_eos(t)));
    assert_false(tokenizer_is_eog(t, user));
    assert_int_equal(tokenizer_find(t, "no such token text"), -1);

    const char *chat = "<|user|>\nHi there<|end|>\n<|assistant|>";
    int n;
    int32_t *ids = encode(t, chat, strlen(chat), true, true, &n);
    assert_int_equal(ids[0], tokenizer_bos(t));
    assert_int_equal(ids[1], user);
    assert_int_equal(ids[n - 1], asst);
    assert_true(contains(ids, n, end));
    /* The text between specials is tokenized exactly as on its own. */
    int m;
    int32_t *mid = encode(t, "\nHi there", 9, false, false, &m);
    assert_memory_equal(ids + 2, mid, (size_t)m * sizeof *mid);
    assert_int_equal(ids[2 + m], end);
    free(mid);
    free(ids);

    ids = encode(t, chat, strlen(chat), false, false, &n);
    assert_false(contains(ids, n, user));
    assert_false(contains(ids, n, end));
    assert_false(contains(ids, n, asst));
    size_t dlen;
    char *back = decode(t, ids, n, &dlen);
    assert_string_equal(back, chat); /* rendered as plain text it survives intact */
    free(back);
    free(ids);
    tokenizer_free(v.tok);

    /* BPE: <|endoftext|> is one control token only when specials are parsed. */
    if (!open_named_vocab("gpt-2", &v))
        skip();
    const char *s = "a<|endoftext|>b";
    ids = encode(v.tok, s, strlen(s), false, true, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 50256);
    free(ids);
    ids = encode(v.tok, s, strlen(s), false, false, &n);
    assert_true(n > 3);
    assert_false(contains(ids, n, 50256));
    free(ids);
    tokenizer_free(v.tok);
}

/* ---- hostile input ------------------------------------------------------------------------ */

static double encode_ms(const tokenizer *t, const char *s, size_t len, bool special, int *n)
{
    double t0 = now_ms();
    *n = tokenizer_encode(t, s, len, false, special, NULL, 0);
    return now_ms() - t0;
}

/* Does a lone byte b encode to something that decodes back to it? */
static bool byte_representable(const tokenizer *t, unsigned char b)
{
    char c = (char)b, out[8];
    int32_t ids[8];
    int n = tokenizer_encode(t, &c, 1, false, false, ids, 8);
    return n > 0 && n <= 8 && tokenizer_decode(t, ids, n, out, sizeof out) == 1 && out[0] == c;
}

static void hostile_vocab(const char *name, const tokenizer *t, void *ctx)
{
    char *buf = ctx;
    const size_t big = 1 << 20;
    static const char junk[] = "ok\xFF\xFE\xC0\x80 \xED\xA0\x80 \xF4\x90\x80\x80 \xE4\xB8 "
                               "\0nul\0 \xF0\x9F\x98 end\xC3";
    size_t junk_len = sizeof junk - 1;
    /* a combining-mark run that NFC must reorder: one long run of non-starters */
    static const char *const fills[] = {"a", " ", "7", "\xC3\xA9", "<", "\xFF", "\xCC\x81\xCC\x96"};
    /* Invalid UTF-8 and NULs round-trip byte for byte (byte fallback / byte-level BPE),
     * except bytes the vocabulary has no token for at all (Falcon lacks C0, C1, F5..FF):
     * those are dropped. */
    char kept[sizeof junk];
    size_t n_kept = 0;
    for (size_t i = 0; i < junk_len; i++)
        if (byte_representable(t, (unsigned char)junk[i]))
            kept[n_kept++] = junk[i];
    int n;
    int32_t *ids = encode(t, junk, junk_len, false, false, &n);
    size_t dlen;
    char *back = decode(t, ids, n, &dlen);
    assert_int_equal(dlen, n_kept);
    assert_memory_equal(back, kept, n_kept);
    free(back);
    free(ids);
    if (n_kept == junk_len)
        check_roundtrip(name, t, junk, junk_len);
    assert_int_equal(tokenizer_encode(t, NULL, 0, false, false, NULL, 0), 0);
    assert_int_equal(tokenizer_encode(t, NULL, 5, false, false, NULL, 0), -1);

    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
        size_t fl = strlen(fills[f]), len = big / fl * fl;
        for (size_t i = 0; i < len; i += fl)
            memcpy(buf + i, fills[f], fl);
        /* Linear-ish: a quadratic pass over 1 MB would take many minutes, so a loose bound
         * catches it without timing the tokenizer (no speed targets in unit tests: CI runs
         * on loaded machines and under sanitizers; the sizes are printed for reading). */
        bool coded = byte_representable(t, (unsigned char)fills[f][0]);
        double t_small = encode_ms(t, buf, len / 16 / fl * fl, true, &n);
        assert_true(n >= 0 && (!coded || n > 0)); /* unknown token or nothing */
        double t_big = encode_ms(t, buf, len, true, &n);
        assert_true(n >= 0 && (!coded || n > 0)); /* unknown token or nothing */
        print_message("%-12s 1 MB of '%s': %6.1f ms (64 KB: %5.1f ms), %d tokens\n", name,
                      fills[f][0] == '\xFF' ? "\\xFF" : fills[f], t_big, t_small, n);
        assert_true(t_big < 60000);
    }
}

static void test_hostile_input(void **state)
{
    (void)state;
    char *buf = malloc(1 << 20);
    assert_non_null(buf);
    for_each_vocab(hostile_vocab, buf);
    free(buf);
}

/* ---- loading ------------------------------------------------------------------------------ */

static tokenizer *load_mem(gguf_writer *w, char *err, size_t errlen)
{
    void *mem;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, &mem, &size), 0);
    gguf_file *f = gguf_open_memory(mem, size, err, errlen);
    assert_non_null(f);
    tokenizer *t = tokenizer_load(f, err, errlen);
    gguf_close(f);
    free(mem);
    return t;
}

static void test_load_refusals(void **state)
{
    (void)state;
    static const char *const toks[] = {"a", "b", "ab"};
    static const char *const merges[] = {"a b"};
    char err[256];

    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "t5");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    assert_null(load_mem(w, err, sizeof err));
    assert_non_null(strstr(err, "'t5' is not supported"));
    gguf_writer_set_str(w, "tokenizer.ggml.model", "bert"); /* WordPiece: no merges, no scores needed */
    tokenizer *wp = load_mem(w, err, sizeof err);
    if (!wp) fail_msg("bert: %s", err);
    int32_t one[4];
    assert_int_equal(tokenizer_encode(wp, "ab b", 4, false, false, one, 4), 0 + 2); /* "ab" "b" (no \u2581 forms: [UNK]s) */
    tokenizer_free(wp);

    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    assert_null(load_mem(w, err, sizeof err)); /* no merges */
    assert_non_null(strstr(err, "tokenizer.ggml.merges"));

    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "no-such-pre");
    assert_null(load_mem(w, err, sizeof err));
    assert_non_null(strstr(err, "no-such-pre"));

    gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
    static const float scores[] = {0, 0};
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, 2);
    assert_null(load_mem(w, err, sizeof err));
    assert_non_null(strstr(err, "tokenizer.ggml.scores"));

    static const float scores3[] = {0, 0, 0};
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores3, 3);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 99); /* out of range: no BOS */
    tokenizer *t = load_mem(w, err, sizeof err);
    assert_non_null(t);
    assert_int_equal(tokenizer_bos(t), -1);
    int32_t ids[4];
    assert_int_equal(tokenizer_encode(t, "ab", 2, true, false, ids, 4), 1);
    assert_int_equal(ids[0], 2); /* merged through "a b" */
    tokenizer_free(t);
    gguf_writer_free(w);

    w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    assert_null(load_mem(w, err, sizeof err));
    assert_non_null(strstr(err, "tokenizer.ggml.tokens"));
    gguf_writer_free(w);
}

/* A 150k-token BPE vocabulary with 150k merges loads without anything quadratic. */
static void test_load_speed(void **state)
{
    (void)state;
    enum { N = 150000 };
    char **toks = malloc(N * sizeof *toks), **merges = malloc(N * sizeof *merges);
    assert_non_null(toks);
    assert_non_null(merges);
    for (int i = 0; i < N; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "t%dx", i);
        toks[i] = strdup(buf);
        snprintf(buf, sizeof buf, "t%dx t%dx", i / 2, i / 3);
        merges[i] = strdup(buf);
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, N);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, N);
    void *mem;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, &mem, &size), 0);
    char err[256];
    gguf_file *f = gguf_open_memory(mem, size, err, sizeof err);
    assert_non_null(f);
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_ms();
        tokenizer *t = tokenizer_load(f, err, sizeof err);
        double ms = now_ms() - t0;
        assert_non_null(t);
        assert_int_equal(tokenizer_n_vocab(t), N);
        assert_int_equal(tokenizer_find(t, "t149999x"), 149999);
        best = ms < best ? ms : best;
        tokenizer_free(t);
    }
    print_message("150k vocab + 150k merges: tokenizer_load %.1f ms (best of 3)\n", best);
    /* Not a speed target (those live in benchmarks): a guard against a quadratic load only.
     * ~tens of ms in release; a loaded 2-core machine running the sanitizer build took 1.2 s,
     * while anything quadratic in 150k entries (2e10 steps) takes minutes. */
    assert_true(best < 20000);
    gguf_close(f);
    free(mem);
    gguf_writer_free(w);
    for (int i = 0; i < N; i++) {
        free(toks[i]);
        free(merges[i]);
    }
    free(toks);
    free(merges);
}

/* The pieces tokenizer_pre_split makes by pre-tokenizer `pre`, against those of the reference
 * regexes run by Python's `regex` module (scripts/gen_pre_splits.py -> tests/text/data/<file>). */
static void check_pre_split_file(const char *pre, const char *file)
{
    char err[256], path[1024];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/tests/text/data/%s", INFERD_SOURCE_DIR, file);
    char *json = file_read_all(path, (size_t)1 << 20, &len, err, sizeof err);
    if (!json) fail_msg("%s", err);
    cJSON *root = cJSON_ParseWithLength(json, len);
    free(json);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    assert_true(cJSON_GetArraySize(cases) > 100);
    int checked = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "ends");
        size_t *ends = NULL;
        int n = tokenizer_pre_split(pre, text, strlen(text), &ends);
        bool same = n == cJSON_GetArraySize(want);
        for (int i = 0; same && i < n; i++) same = ends[i] == (size_t)cJSON_GetArrayItem(want, i)->valuedouble;
        if (!same) {
            char got[512] = "";
            for (int i = 0, k = 0; i < n && k < 480; i++) k += snprintf(got + k, sizeof got - (size_t)k, " %zu", ends[i]);
            free(ends);
            fail_msg("\"%s\": pieces end at%s; the regex's: %s", text, got, cJSON_PrintUnformatted(want));
        }
        free(ends);
        checked++;
    }
    assert_int_equal(checked, cJSON_GetArraySize(cases));
    cJSON_Delete(root);
}

/* gpt-4o / o200k (gpt-oss, Llama 4), over 115 texts: case splits, contractions on their word,
 * marks and Lm/Lo on both sides of a case change, digit triples, slashes after punctuation,
 * line breaks. */
static void test_pre_split_gpt4o(void **state)
{
    (void)state;
    check_pre_split_file("gpt-4o", "pre_gpt4o.json");
    size_t *ends = NULL;
    assert_int_equal(tokenizer_pre_split("no-such-pre", "x", 1, &ends), -1);
    assert_null(ends);
}

/* deepseek-v3 (DeepSeek V3, R1), over 139 texts: its three regexes in sequence (digit triples,
 * then CJK ideograph and kana runs, then the rest), so "漢字kanji" and "12ab34" split at every
 * class change; one ASCII punctuation mark before ASCII letters (".com", "'s") but not before
 * others (".é"); a mark or space before a word; full-width forms, emoji, NEL, controls. */
static void test_pre_split_deepseek_v3(void **state)
{
    (void)state;
    check_pre_split_file("deepseek-v3", "pre_deepseek_v3.json");
}

/* ../shared/reference's DeepSeek V3 model (a 384-token vocabulary converted by llama.cpp,
 * tokenizer.ggml.pre = "deepseek-v3") loads, and its text round-trips through its tokens. */
static void test_deepseek_v3_vocab(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/reference/deepseek_v3.gguf", shared_dir());
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        print_message("skipping: %s not found\n", path);
        skip();
    }
    fclose(probe);
    vocab v;
    assert_true(open_vocab(path, &v)); /* it was refused: "pre-tokenizer ... is not supported" */
    const char *text = "Hello, world! 東京 123456 .com\n";
    int32_t *ids = NULL;
    int n = tokenizer_encode_alloc(v.tok, text, strlen(text), false, false, &ids);
    assert_true(n > 0);
    size_t len = 0;
    char *back = tokenizer_decode_alloc(v.tok, ids, n, &len);
    assert_non_null(back);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(back, text, len);
    free(back);
    free(ids);
    tokenizer_free(v.tok);
}


/* A Harmony vocabulary (gpt-oss's o200k_harmony; here the tiny one of ../shared/reference's
 * gpt-oss model, converted by llama.cpp): <|end|> ends a message, not generation; <|return|>
 * ends it; the markup tokens are control tokens that output text keeps (the reply's parser
 * reads them), while a message's text still cannot become one. */
static void test_harmony_vocab(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/reference/gpt-oss.gguf", shared_dir());
    vocab v;
    if (!open_vocab(path, &v)) {
        print_message("skipping: %s not found\n", path);
        skip();
    }
    const tokenizer *t = v.tok;
    int32_t end = tokenizer_find(t, "<|end|>"), ret = tokenizer_find(t, "<|return|>"), ch = tokenizer_find(t, "<|channel|>");
    int32_t msg = tokenizer_find(t, "<|message|>"), start = tokenizer_find(t, "<|start|>"), im_end = tokenizer_find(t, "<|im_end|>");
    assert_true(end >= 0 && ret >= 0 && ch >= 0 && msg >= 0 && start >= 0);
    assert_false(tokenizer_is_eog(t, end));
    assert_true(tokenizer_is_eog(t, ret));
    assert_true(tokenizer_is_eog(t, tokenizer_eos(t)));
    assert_true(tokenizer_is_eog(t, im_end)); /* not Harmony's: as before */
    assert_true(tokenizer_is_control(t, ch) && tokenizer_is_control(t, end));
    /* output text keeps the markup, not the other control tokens */
    int32_t ids[] = {ch, tokenizer_find(t, "a"), msg, tokenizer_find(t, "b"), end, start, im_end, ret};
    char out[128];
    size_t n = tokenizer_decode(t, ids, 8, out, sizeof out);
    assert_int_equal(n, strlen("<|channel|>a<|message|>b<|end|><|start|>"));
    assert_string_equal(out, "<|channel|>a<|message|>b<|end|><|start|>");
    detok_stream ds;
    detok_init(&ds, t, false);
    char piece[64];
    assert_int_equal(detok_feed(&ds, ch, piece, sizeof piece), 11);
    assert_memory_equal(piece, "<|channel|>", 11);
    assert_int_equal(detok_feed(&ds, im_end, piece, sizeof piece), 0);
    /* a message's "<|channel|>" is text; the template's is the control token */
    int32_t *enc = NULL;
    tok_span plain = {0, 11};
    int k = tokenizer_encode_prompt(t, "<|channel|><|channel|>", 22, false, &plain, 1, &enc);
    assert_true(k > 2);
    assert_int_equal(enc[k - 1], ch);
    for (int i = 0; i < k - 1; i++) assert_int_not_equal(enc[i], ch);
    free(enc);
    tokenizer_free(v.tok);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--npm-vocab") == 0) {
        npm_vocab_dir = argv[2];
        npm_ids_path = argv[3];
        const struct CMUnitTest npm_tests[] = {
            cmocka_unit_test(test_npm_reference_ids),
            cmocka_unit_test(test_roundtrip),
            cmocka_unit_test(test_hostile_input),
        };
        return cmocka_run_group_tests_name("npm vocabularies", npm_tests, NULL, NULL);
    }
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--npm-vocab DIR IDS.json]\n", argv[0]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_vectors),
        cmocka_unit_test(test_vocab_vectors_without_gguf),
        cmocka_unit_test(test_hf_texts),
        cmocka_unit_test(test_pre_split_gpt4o),
        cmocka_unit_test(test_pre_split_deepseek_v3),
        cmocka_unit_test(test_deepseek_v3_vocab),
        cmocka_unit_test(test_bos_defaults),
        cmocka_unit_test(test_tekken_pieces),
        cmocka_unit_test(test_spbpe),
        cmocka_unit_test(test_many_specials),
        cmocka_unit_test(test_wordpiece),
        cmocka_unit_test(test_prompt_bos_once),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_stories260k_prompt),
        cmocka_unit_test(test_detok_stream),
        cmocka_unit_test(test_detok_stream_bpe),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_hostile_input),
        cmocka_unit_test(test_load_refusals),
        cmocka_unit_test(test_load_speed),
        cmocka_unit_test(test_harmony_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
