/* ngram.c - see ngram.h. */
#include "ngram.h"

#include <string.h>

int ngram_draft(const int32_t *toks, int n_toks, int k_max, int32_t *draft)
{
    if (k_max <= 0) return 0;
    for (int n = NGRAM_MAX; n >= NGRAM_MIN; n--) {
        if (n_toks < n + 1) continue;
        const int32_t *suffix = toks + n_toks - n;
        /* the latest occurrence that ends before the suffix itself and has a token after it:
         * recent context predicts best */
        for (int at = n_toks - n - 1; at >= 0; at--) {
            if (toks[at] != suffix[0] || memcmp(toks + at, suffix, (size_t)n * sizeof *toks) != 0) continue;
            int from = at + n, k = n_toks - from < k_max ? n_toks - from : k_max;
            memcpy(draft, toks + from, (size_t)k * sizeof *draft);
            return k;
        }
    }
    return 0;
}
