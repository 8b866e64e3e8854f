/* fuzz_jinja.c - the Jinja interpreter (src/text/jinja.c) on arbitrary templates and
 * contexts.
 *
 * Input: a flag byte, then NUL-separated fields: the template source, the JSON context.
 * Flags pick small limits (so that the fuzzer reaches them quickly) and a fixed clock.
 *
 * Invariants: a template that does not parse and a render that fails both say why (a
 * non-empty message); a render's output respects max_output and its reported length; the
 * same template renders the same context twice to the same bytes (no hidden state); with
 * flag 16, the context's "<|...|>" texts are followed (protect_at, as a chat prompt's control
 * tokens are) and the spans reported lie inside the output, sorted and apart, and the render
 * is the same text as without. */
#include "fuzz_common.h"

#include "text/jinja.h"

/* "<|" up to the next "|>" (at most 32 bytes), as a control token's text. */
static size_t marker_at(void *ctx, const char *s, size_t n)
{
    (void)ctx;
    if (n < 4 || s[0] != '<' || s[1] != '|') return 0;
    for (size_t i = 2; i + 1 < n && i < 32; i++)
        if (s[i] == '|' && s[i + 1] == '>') return i + 2;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    size_t sl, cl;
    const char *src = fz_field(&in, &sl);
    const char *ctx = fz_field(&in, &cl);
    char err[256] = "";
    jinja_tmpl *t = jinja_parse(src, sl, err, sizeof err);
    if (!t) {
        FZ_CHECK(err[0] != 0);
        return 0;
    }
    FZ_CHECK(jinja_mentions(t, "messages") == 0 || jinja_mentions(t, "messages") == 1);
    static const struct tm now = {.tm_year = 126, .tm_mday = 15, .tm_hour = 12};
    jinja_opts o = {
        .max_output = flags & 1 ? 256 : 1 << 16,
        .max_memory = flags & 2 ? 1 << 18 : 8 << 20,
        .max_steps = flags & 4 ? 1000 : 200000,
        .max_depth = flags & 8 ? 16 : 100,
        .now = &now,
    };
    /* An empty context field stands for an empty object. */
    const char *c = cl ? ctx : "{}";
    size_t n1 = 0, n2 = 0;
    char *out = jinja_render_json(t, c, cl ? cl : 2, &o, &n1, err, sizeof err);
    if (!out) {
        FZ_CHECK(err[0] != 0);
    } else {
        FZ_CHECK(n1 <= o.max_output && out[n1] == 0);
        fz_touch(out, n1);
        char err2[256];
        char *again = jinja_render_json(t, c, cl ? cl : 2, &o, &n2, err2, sizeof err2);
        FZ_CHECK(again && n2 == n1 && memcmp(again, out, n1) == 0);
        free(again);
        if (flags & 16) {
            static const char *const trusted[] = {"bos_token", NULL};
            o.protect_at = marker_at;
            o.trusted = trusted;
            jinja_result r;
            /* following marks costs steps: a render near the limit may now fail, never differ */
            if (jinja_render(t, c, cl ? cl : 2, &o, &r, err2, sizeof err2) == 0) {
                FZ_CHECK(r.len == n1 && memcmp(r.text, out, n1) == 0);
                for (size_t i = 0; i < r.n_protected; i++) {
                    FZ_CHECK(r.protected_at[i].len > 0 && r.protected_at[i].off + r.protected_at[i].len <= r.len);
                    FZ_CHECK(i == 0 || r.protected_at[i].off > r.protected_at[i - 1].off + r.protected_at[i - 1].len);
                }
                free(r.text);
                free(r.protected_at);
            } else {
                FZ_CHECK(err2[0] != 0);
            }
        }
    }
    free(out);
    jinja_free(t);
    return 0;
}
