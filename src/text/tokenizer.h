/* tokenizer.h - text <-> token ids from a GGUF's tokenizer.ggml.* metadata.
 *
 * Two families:
 *   SPM  (tokenizer.ggml.model = "llama"): score-driven merges over UTF-8 characters, spaces
 *        written as U+2581, a leading space added to the text, byte fallback tokens <0xNN>.
 *   BPE  (tokenizer.ggml.model = "gpt2"): byte-level BPE; the text is first split by the
 *        pre-tokenizer named in tokenizer.ggml.pre (gpt2, llama3/llama-bpe, qwen2, deepseek-llm,
 *        deepseek-v3, falcon, starcoder, ...), then each piece is merged by merge rank.  The Qwen2
 *        pre-tokenizers normalize the text to NFC first, as Qwen's own tokenizer does.
 * Special/control tokens are matched in the text only when parse_special is true.
 *
 * A tokenizer is immutable after load and safe to share between threads. */
#ifndef INFERD_TOKENIZER_H
#define INFERD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct tokenizer tokenizer;

tokenizer *tokenizer_load(const gguf_file *f, char *err, size_t errlen);
void tokenizer_free(tokenizer *t);

int tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t); /* -1 when none */
int32_t tokenizer_eos(const tokenizer *t);
int32_t tokenizer_eot(const tokenizer *t); /* end-of-turn (e.g. <|eot_id|>, <|im_end|>), or -1 */
/* Whether "add special tokens" puts BOS in front / EOS at the end: tokenizer.ggml.add_bos_token
 * and add_eos_token, and where a GGUF lacks them the defaults of the reference implementation
 * for its kind: SPM adds BOS; BPE adds BOS for the Llama 3 pre-tokenizers (llama-bpe, llama3,
 * ...) only; nothing adds EOS.  False when the vocabulary has no such token. */
bool tokenizer_add_bos(const tokenizer *t);
bool tokenizer_add_eos(const tokenizer *t);
/* Whether a prompt text (encoded with parse_special) gets BOS put in front: when the vocabulary
 * adds BOS and the text does not already begin with it, written by a chat template (Llama 3's,
 * Gemma's, ...) or by the user, so that a prompt starts with exactly one BOS. */
bool tokenizer_prompt_bos(const tokenizer *t, const char *text, size_t len);
/* Whether text is normalized to NFC before it is split (the Qwen2 pre-tokenizers, whose
 * published tokenizer does so; the GGUF does not say it). */
bool tokenizer_normalizes_nfc(const tokenizer *t);
/* One line for the start-up log: kind, pre-tokenizer, whether BOS/EOS are added and why,
 * NFC.  Returns the length it needed (snprintf-style). */
size_t tokenizer_describe(const tokenizer *t, char *buf, size_t cap);
/* End of generation: EOS, EOT and any other token the vocabulary marks as ending a turn (a
 * Harmony vocabulary, gpt-oss's: <|return|> and <|call|>, not <|end|>, which ends a message). */
bool tokenizer_is_eog(const tokenizer *t, int32_t id);
/* Control/special tokens (not rendered in output text). */
bool tokenizer_is_control(const tokenizer *t, int32_t id);
/* Whether b drafts for a: speculative decoding's draft model must propose the token ids the
 * target reads.  The same vocabulary size, the same BOS, EOS and EOT ids and BOS rule, and the
 * same text and kind at every special (control) token of either.  false with what differs in
 * why (one line naming the first difference; a is called "target", b "draft"). */
bool tokenizer_compatible(const tokenizer *a, const tokenizer *b, char *why, size_t cap);
/* Id of a token whose text is exactly s (e.g. "<|im_start|>"), or -1. */
int32_t tokenizer_find(const tokenizer *t, const char *s);

/* Encode text. Writes at most cap ids; returns the number of ids the full encoding has
 * (call again with a larger buffer when it exceeds cap), or -1 on error. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool add_bos,
                     bool parse_special, int32_t *out, int cap);

/* A byte range of a text. */
typedef struct tok_span {
    size_t off, len;
} tok_span;

/* tokenizer_encode_alloc with parse_special, except that no control token (<|im_start|>,
 * <|eot_id|>, ...) begins inside the spans plain[0..n_plain) (sorted by offset, not
 * overlapping): its text there is encoded as text.  For a chat prompt, whose spans are where the
 * request's messages wrote such text; user-defined tokens (<think>, <tool_call>) are matched
 * everywhere, as Hugging Face's tokenizers and llama.cpp match them. */
int tokenizer_encode_prompt(const tokenizer *t, const char *text, size_t len, bool add_bos,
                            const tok_span *plain, size_t n_plain, int32_t **out);
/* The length of the control token's text at s[0..n) (the longest), or 0 when none begins there. */
size_t tokenizer_control_at(const tokenizer *t, const char *s, size_t n);

/* The raw vocabulary string of a token (as stored, e.g. "▁the" or "Ġthe"). */
const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len);

/* The bytes a token stands for in output text: SPM U+2581 -> ' ', <0xNN> -> byte NN,
 * byte-level BPE mapping undone; control tokens give "" unless render_special, except the
 * markup of a Harmony vocabulary (<|start|>, <|channel|>, <|message|>, <|constrain|>, <|end|>),
 * which is the reply's structure and stays in output text (and in tokenizer_decode).  Returns the
 * number of bytes (may exceed cap: then only cap were written); -1 for an invalid id. */
int tokenizer_token_bytes(const tokenizer *t, int32_t id, bool render_special, char *buf, int cap);

/* Decode a whole sequence into buf (NUL-terminated when it fits); returns the byte length.
 * SPM: the leading space of the first token is dropped when skip_leading_space. */
/* The pre-tokenizer named `pre` (a tokenizer.ggml.pre value) applied to text[0..len): the
 * number of pieces, each one's end as a byte offset in *ends (malloc'd; the caller frees), or
 * -1 for a name this tokenizer does not know or out of memory.  What the BPE merges then run
 * over, piece by piece: tests check it against the regex it implements. */
int tokenizer_pre_split(const char *pre, const char *text, size_t len, size_t **ends);

size_t tokenizer_decode(const tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap);

/* The same two into memory of their own: tokenizer_encode_alloc returns the count and a
 * malloc'd array in *out (NULL for none), or -1; tokenizer_decode_alloc a malloc'd
 * NUL-terminated text and its length in *len, or NULL when memory ran out. */
int tokenizer_encode_alloc(const tokenizer *t, const char *text, size_t len, bool add_bos,
                           bool parse_special, int32_t **out);
char *tokenizer_decode_alloc(const tokenizer *t, const int32_t *ids, int n, size_t *len);

/* Streaming detokenizer: feed ids one by one; it returns only complete UTF-8 characters and
 * holds back an incomplete trailing sequence until later bytes complete it (or flush). */
typedef struct detok_stream {
    const tokenizer *t;
    bool first;      /* SPM: drop the leading space of the very first piece */
    char pending[8]; /* incomplete UTF-8 tail */
    int n_pending;
} detok_stream;

void detok_init(detok_stream *s, const tokenizer *t, bool first_is_start_of_text);
/* Appends the newly completed text of `id` to out (malloc'd growable buffer semantics are the
 * caller's: out must have room for at least 16 + token length bytes; returns bytes written). */
int detok_feed(detok_stream *s, int32_t id, char *out, int cap);
/* Emit what is still pending (invalid/incomplete bytes become U+FFFD). */
int detok_flush(detok_stream *s, char *out, int cap);

#endif
