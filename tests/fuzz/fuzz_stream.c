/* fuzz_stream.c - stop strings across token boundaries (src/sched/stopstr.c) and the UTF-8
 * rules of the output (base/utf8.c, base/bytebuf.c), checked against what they promise rather than
 * only for crashes.
 *
 * Input: a flag byte (number of stop strings, 0..4), that many NUL-terminated stop strings,
 * then pieces of completion text, each a length byte (0..31) and the bytes.
 *
 * Invariants, for any bytes:
 *   - the output is valid UTF-8 after every step and NUL-terminated when non-empty;
 *   - a match is reported exactly when some stop string occurs in the text fed so far (never
 *     missed, never early), and further input is then ignored;
 *   - the matcher never holds back more than the longest stop string + one partial character;
 *   - with valid stop strings that do not contain U+FFFD, the output never contains one.
 * And when the text and stop strings are valid UTF-8, exactly: output + held = text fed so
 * far, and on a match the output is the text before the earliest-starting occurrence. */
#include "fuzz_common.h"

#include "sched/stopstr.h"
#include "base/bytebuf.h"
#include "base/utf8.h"

#define FZ_MAX_PIECE 31

/* Checks utf8.c's three functions against the reference definition in fuzz_common.h. */
static void check_utf8(const char *s, size_t n)
{
    bool valid = fz_utf8_valid(s, n);
    FZ_CHECK(utf8_valid(s, n) == valid);

    size_t p = utf8_complete_prefix(s, n);
    FZ_CHECK(p <= n && n - p <= 3);
    if (valid) FZ_CHECK(p == n);
    if (p < n) {
        /* What is held back is a lead byte and fewer continuation bytes than it announces. */
        unsigned char lead = (unsigned char)s[p];
        size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
        FZ_CHECK(lead >= 0xC2 && lead <= 0xF4 && n - p < want);
        for (size_t i = p + 1; i < n; i++) FZ_CHECK(((unsigned char)s[i] & 0xC0) == 0x80);
    }

    bytebuf b = {0};
    FZ_CHECK(utf8_append_valid(&b, s, n));
    FZ_CHECK(fz_utf8_valid(b.data, b.len));
    if (b.len) FZ_CHECK(b.data[b.len] == 0);
    if (valid) FZ_CHECK(b.len == n && (n == 0 || memcmp(b.data, s, n) == 0));
    size_t took;
    char *t = bytebuf_take(&b, &took);
    /* NULL only when nothing was appended (an empty append still makes ""). */
    FZ_CHECK(b.len == 0 && (t != NULL || took == 0) && (!t || t[took] == 0));
    free(t);
    bytebuf_free(&b);
}

/* Start of the earliest-starting occurrence of any stop string in s[0..n), or n if none. */
static size_t earliest_stop(char *const *stops, int n_stops, const char *s, size_t n)
{
    size_t best = n;
    for (int i = 0; i < n_stops; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0) continue;
        const char *hit = memmem(s, n, stops[i], l);
        if (hit && (size_t)(hit - s) < best) best = (size_t)(hit - s);
    }
    return best;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    int n_stops = fz_u8(&in) % (STOPSTR_MAX + 1);
    char *stops[STOPSTR_MAX] = {0};
    size_t max_stop = 0;
    bool stops_valid = true, stops_clean = true;
    for (int i = 0; i < n_stops; i++) {
        size_t l;
        const char *f = fz_field(&in, &l);
        stops[i] = fz_strndup(f, l);
        l = strlen(stops[i]);
        if (l > max_stop) max_stop = l;
        stops_valid = stops_valid && fz_utf8_valid(stops[i], l);
        stops_clean = stops_clean && !memmem(stops[i], l, "\xEF\xBF\xBD", 3);
    }
    check_utf8((const char *)in.p, in.n);

    /* The whole text first, to know whether the exact invariants apply. */
    char *text = malloc(in.n + 1);
    size_t text_len = 0;
    fz_in scan = in;
    while (scan.n) {
        size_t l = fz_u8(&scan) % (FZ_MAX_PIECE + 1);
        if (l > scan.n) l = scan.n;
        memcpy(text + text_len, scan.p, l);
        text_len += l;
        scan.p += l;
        scan.n -= l;
    }
    bool exact = stops_valid && fz_utf8_valid(text, text_len);

    stopstr m;
    FZ_CHECK(stopstr_init(&m, (const char *const *)stops, n_stops));
    bytebuf out = {0};
    size_t fed = 0;
    bool matched = false;
    while (in.n) {
        size_t l = fz_u8(&in) % (FZ_MAX_PIECE + 1);
        if (l > in.n) l = in.n;
        const char *piece = (const char *)in.p;
        in.p += l;
        in.n -= l;
        size_t before = out.len;
        bool oom = true;
        bool hit = stopstr_feed(&m, piece, l, &out, &oom);
        FZ_CHECK(!oom);
        if (matched) {
            FZ_CHECK(hit && out.len == before); /* ignored after the match */
            continue;
        }
        fed += l;
        size_t at = earliest_stop(stops, n_stops, text, fed);
        FZ_CHECK(hit == (at < fed));
        FZ_CHECK(fz_utf8_valid(out.data, out.len));
        if (out.len) FZ_CHECK(out.data[out.len] == 0);
        if (hit) {
            matched = true;
            if (exact) FZ_CHECK(out.len == at && (at == 0 || memcmp(out.data, text, at) == 0));
        } else {
            FZ_CHECK(m.held.len <= (max_stop ? max_stop - 1 : 0) + 3);
            if (exact)
                FZ_CHECK(out.len + m.held.len == fed && (out.len == 0 || memcmp(out.data, text, out.len) == 0) &&
                         (m.held.len == 0 || memcmp(m.held.data, text + out.len, m.held.len) == 0));
        }
    }
    size_t before = out.len;
    FZ_CHECK(stopstr_flush(&m, &out));
    if (matched) FZ_CHECK(out.len == before);
    FZ_CHECK(fz_utf8_valid(out.data, out.len));
    if (exact && !matched) FZ_CHECK(out.len == text_len && (text_len == 0 || memcmp(out.data, text, text_len) == 0));
    if (stops_valid && stops_clean)
        for (int i = 0; i < n_stops; i++)
            if (stops[i][0]) FZ_CHECK(!memmem(out.data ? out.data : "", out.len, stops[i], strlen(stops[i])));

    stopstr_free(&m);
    bytebuf_free(&out);
    free(text);
    for (int i = 0; i < n_stops; i++) free(stops[i]);
    return 0;
}
