/* tokenize_reply.c - see tokenize_reply.h. */
#include "tokenize_reply.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

#include "api_encode.h"

/* A piece as a JSON string, escaped by cJSON one item at a time: no tree of the whole reply
 * is ever built (a tree per token was what made /tokenize amplify memory). */
static void json_string(bytebuf *out, const char *s)
{
    cJSON *item = cJSON_CreateString(s);
    char *text = item ? cJSON_PrintUnformatted(item) : NULL;
    if (text) bytebuf_puts(out, text);
    else out->failed = true;
    cJSON_free(text);
    cJSON_Delete(item);
}

void tokenize_reply(const tokenizer *tok, const int32_t *ids, int n, bool pieces, bytebuf *out)
{
    bytebuf_puts(out, "{\"tokens\":[");
    for (int i = 0; i < n && bytebuf_ok(out); i++) {
        if (i) bytebuf_puts(out, ",");
        if (!pieces) {
            bytebuf_printf(out, "%d", (int)ids[i]);
            continue;
        }
        char buf[256];
        int bl = tokenizer_token_bytes(tok, ids[i], true, buf, (int)sizeof buf);
        char *clean = api_utf8_sanitize(buf, bl < 0 ? 0 : bl > 256 ? 256 : (size_t)bl, NULL);
        if (!clean) {
            out->failed = true;
            break;
        }
        bytebuf_printf(out, "{\"id\":%d,\"piece\":", (int)ids[i]);
        json_string(out, clean);
        bytebuf_puts(out, "}");
        free(clean);
    }
    bytebuf_puts(out, "]}");
}
