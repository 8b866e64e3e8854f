/* tokenize_reply.c - see tokenize_reply.h. */
#include "tokenize_reply.h"

#include <stdlib.h>

#include "api_encode.h"

/* s is valid UTF-8 without NUL (api_utf8_sanitize): only quotes, backslashes and control
 * characters need escaping. */
static void json_string(sbuf *out, const char *s, size_t len)
{
    sbuf_puts(out, "\"");
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c != '"' && c != '\\' && c >= 0x20) continue;
        sbuf_append(out, s + run, i - run);
        if (c == '"' || c == '\\') sbuf_printf(out, "\\%c", c);
        else sbuf_printf(out, "\\u%04x", c);
        run = i + 1;
    }
    sbuf_append(out, s + run, len - run);
    sbuf_puts(out, "\"");
}

void tokenize_reply(const tokenizer *tok, const int32_t *ids, int n, bool pieces, sbuf *out)
{
    sbuf_puts(out, "{\"tokens\":[");
    for (int i = 0; i < n && sbuf_ok(out); i++) {
        if (i) sbuf_puts(out, ",");
        if (!pieces) {
            sbuf_printf(out, "%d", (int)ids[i]);
            continue;
        }
        char buf[256];
        int bl = tokenizer_token_bytes(tok, ids[i], true, buf, (int)sizeof buf);
        size_t clean_len = 0;
        char *clean = api_utf8_sanitize(buf, bl < 0 ? 0 : bl > 256 ? 256 : (size_t)bl, &clean_len);
        if (!clean) {
            out->failed = true;
            break;
        }
        sbuf_printf(out, "{\"id\":%d,\"piece\":", (int)ids[i]);
        json_string(out, clean, clean_len);
        sbuf_puts(out, "}");
        free(clean);
    }
    sbuf_puts(out, "]}");
}
