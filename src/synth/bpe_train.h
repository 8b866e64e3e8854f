/* bpe_train.h - learn a byte-level BPE vocabulary (GPT-2 style) from text.
 *
 * Used by the model generator so that synthetic models carry a real, working tokenizer.
 * The text is split into words the way GPT-2's pre-tokenizer does (letters, digits and other
 * runs, each optionally led by one space; whitespace runs), then the most frequent adjacent
 * pair of symbols is merged repeatedly.  Training is deterministic: ties go to the pair with
 * the smallest (left id, right id).  Token texts use GPT-2's byte-to-unicode mapping, so
 * they can be written straight into tokenizer.ggml.tokens / tokenizer.ggml.merges. */
#ifndef INFERD_BPE_TRAIN_H
#define INFERD_BPE_TRAIN_H

#include <stddef.h>

typedef struct bpe_vocab {
    char **tokens;  /* n_tokens NUL-terminated texts: the 256 byte tokens (id = byte) first */
    int n_tokens;
    char **merges;  /* n_merges "left right" strings in rank order */
    int n_merges;
} bpe_vocab;

/* Learn until the vocabulary has max_tokens entries (>= 256), no pair occurs twice, or
 * max_merges merges were made.  Returns 0, or -1 when out of memory (out is then empty). */
int bpe_train(const char *text, size_t len, int max_tokens, int max_merges, bpe_vocab *out);
void bpe_vocab_free(bpe_vocab *v);

/* GPT-2's printable stand-in for byte b, UTF-8 encoded into out (>= 3 bytes); returns length. */
int bpe_byte_text(unsigned char b, char *out);

#endif
