/* stopstr.c - see stopstr.h.  Stop strings are few and short, and the held tail is never
 * longer than the longest of them plus one UTF-8 character, so plain scans are the right
 * tool here. */
#include "stopstr.h"

#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

bool stopstr_init(stopstr *m, const char *const *stops, int n)
{
    *m = (stopstr){0};
    if (n < 0 || n > STOPSTR_MAX) return false;
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        size_t len = strlen(stops[i]);
        char *copy = malloc(len + 1);
        if (!copy) {
            stopstr_free(m);
            return false;
        }
        memcpy(copy, stops[i], len + 1);
        m->stop[m->n_stop] = copy;
        m->stop_len[m->n_stop] = len;
        m->n_stop++;
    }
    return true;
}

void stopstr_free(stopstr *m)
{
    for (int i = 0; i < m->n_stop; i++) free(m->stop[i]);
    bytebuf_free(&m->held);
    *m = (stopstr){0};
}

/* Start of the earliest occurrence of any stop string in s[0..n), or n when there is none;
 * *which: the stop string found there. */
static size_t first_match(const stopstr *m, const char *s, size_t n, int *which)
{
    size_t best = n;
    for (int i = 0; i < m->n_stop; i++) {
        const char *hit = memmem(s, n, m->stop[i], m->stop_len[i]);
        if (hit && (size_t)(hit - s) < best) {
            best = (size_t)(hit - s);
            *which = i;
        }
    }
    return best;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of some stop string. */
static size_t longest_partial(const stopstr *m, const char *s, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < m->n_stop; i++) {
        size_t k = m->stop_len[i] - 1;
        if (k > n) k = n;
        for (; k > best; k--) {
            if (memcmp(s + n - k, m->stop[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

/* Releases held[0..n) into out and keeps the rest. */
static bool release(stopstr *m, size_t n, bytebuf *out)
{
    if (!utf8_append_valid(out, m->held.data, n)) return false;
    memmove(m->held.data, m->held.data + n, m->held.len - n);
    m->held.len -= n;
    if (m->held.data) m->held.data[m->held.len] = 0;
    return true;
}

bool stopstr_feed(stopstr *m, const char *text, size_t len, bytebuf *out, bool *oom)
{
    *oom = false;
    if (m->matched) return true;
    if (!bytebuf_append(&m->held, text, len)) {
        *oom = true;
        return false;
    }
    if (m->held.len == 0) return false;
    /* Everything before the held tail was checked already, so only the tail plus the new
     * text can contain a match (see stopstr.h). */
    size_t at = first_match(m, m->held.data, m->held.len, &m->matched_index);
    if (at < m->held.len) {
        m->matched = true;
        if (!release(m, at, out)) *oom = true;
        bytebuf_free(&m->held);
        return true;
    }
    size_t ready = m->held.len - longest_partial(m, m->held.data, m->held.len);
    ready = utf8_complete_prefix(m->held.data, ready);
    if (ready && !release(m, ready, out)) *oom = true;
    return false;
}

bool stopstr_flush(stopstr *m, bytebuf *out)
{
    if (m->matched || m->held.len == 0) return true;
    return release(m, m->held.len, out);
}
