/* words.h - a vocabulary of whole English words for a synthetic model (`mkmodel --words`).
 *
 * A model with random weights samples tokens about at random; over a byte-level BPE
 * vocabulary learned from source code that is mojibake ("ip�ipodelip�").  With --words the
 * tokenizer is trained on a text made of whole words only (the most frequent lowercase words of
 * a given text, e.g. the README), so each of them becomes one token " word", and the LM head
 * favours those tokens: the output reads as words, so a first run shows at a glance that the
 * server works. */
#ifndef INFERD_SYNTH_WORDS_H
#define INFERD_SYNTH_WORDS_H

#include <stdbool.h>
#include <stddef.h>

#define WORDS_MIN_LEN 2
#define WORDS_MAX_LEN 16

typedef struct words_list {
    char **word; /* n lowercase ASCII words, most frequent first (ties: alphabetical) */
    int *freq;
    int n;
    char **sorted; /* the same words in strcmp order, for words_has */
} words_list;

/* The at most max_words most frequent words of text: runs of WORDS_MIN_LEN..WORDS_MAX_LEN
 * lowercase ASCII letters standing alone (no letter, digit or '_' either side, so identifiers
 * such as api_key or utf8 do not count), outside lines that start with '#' (comments).  0, or -1 when out of memory (out is then empty). */
int words_collect(const char *text, size_t len, int max_words, words_list *out);
void words_free(words_list *l);

/* The tokenizer's training text: " w" for every word, repeated by its frequency (at least
 * twice, at most 10 times: BPE merges only pairs seen twice, and frequent words come first).
 * NUL-terminated, caller frees; NULL when out of memory. */
char *words_corpus(const words_list *l, size_t *len);

/* Whether the n bytes at w are one of the words. */
bool words_has(const words_list *l, const char *w, size_t n);

#endif
