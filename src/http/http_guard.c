/* http_guard.c - see http_guard.h. */
#include "http_guard.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define INVALID "invalid_request_error"

int http_guard_target(const char *raw, api_error *e)
{
    for (const char *p = raw; (p = strchr(p, '%')) != NULL; p++) {
        if (p[1] == '0' && p[2] == '0') {
            api_error_set(e, 400, INVALID, NULL, "invalid_url",
                          "The request URL contains an encoded NUL byte (%%00).");
            return -1;
        }
    }
    return 0;
}

/* RFC 9110 §5.6.2: a field name is a token. */
static bool is_token(const char *s)
{
    if (!*s) return false;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alnum && !strchr("!#$%&'*+-.^_`|~", c)) return false;
    }
    return true;
}

/* What the header fields say about framing, gathered in one pass (MHD lists them in order). */
typedef struct framing {
    int n_cl, n_host;
    bool cl_differs;
    const char *cl;
    int n_te;        /* Transfer-Encoding field lines */
    int n_codings;   /* codings over all of them, in order */
    int n_chunked, last_chunked; /* how many are chunked, the index of the last one */
    bool te_unknown; /* a coding other than chunked */
    char bad_name[48]; /* first field name that is not a token ("" = none) */
} framing;

/* The codings of one Transfer-Encoding line, "a, b ,c" (empty list elements are allowed). */
static void scan_codings(framing *f, const char *v)
{
    while (*v) {
        while (*v == ' ' || *v == '\t' || *v == ',') v++;
        if (!*v) break;
        const char *end = v + strcspn(v, ",");
        const char *t = end;
        while (t > v && (t[-1] == ' ' || t[-1] == '\t')) t--;
        if (t - v == 7 && strncasecmp(v, "chunked", 7) == 0) {
            f->n_chunked++;
            f->last_chunked = f->n_codings;
        } else {
            f->te_unknown = true;
        }
        f->n_codings++;
        v = end;
    }
}

static enum MHD_Result collect(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    framing *f = cls;
    if (!is_token(key) && !f->bad_name[0]) {
        /* Printed into the message: keep it to printable ASCII. */
        if (!http_guard_printable(f->bad_name, sizeof f->bad_name, key))
            snprintf(f->bad_name, sizeof f->bad_name, "(empty)");
    }
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (f->n_cl++ && strcmp(f->cl, value) != 0) f->cl_differs = true;
        if (!f->cl) f->cl = value;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        f->n_te++;
        scan_codings(f, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
        f->n_host++;
    }
    return MHD_YES;
}

int http_guard_framing(struct MHD_Connection *conn, const char *version, api_error *e)
{
    framing f = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect, &f);
    const char *why = NULL;
    int status = 400;
    if (f.bad_name[0]) {
        api_error_set(e, 400, INVALID, NULL, "bad_request",
                      "Malformed header field name '%s' (no whitespace before the colon, RFC 9112 §5.1).",
                      f.bad_name);
        return -1;
    }
    if (f.n_cl && f.n_te) why = "both Content-Length and Transfer-Encoding are present";
    else if (f.cl_differs) why = "Content-Length is given more than once with different values";
    else if (f.n_chunked && f.last_chunked != f.n_codings - 1) why = "chunked is not the final transfer coding";
    else if (f.n_chunked > 1) why = "chunked is applied more than once";
    else if (f.te_unknown) {
        why = "the transfer coding is not implemented (only chunked is)";
        status = 501;
    } else if (f.n_te && !f.n_codings) why = "Transfer-Encoding is empty";
    else if (f.n_host > 1) why = "Host is given more than once";
    else if (!f.n_host && version && strcmp(version, MHD_HTTP_VERSION_1_0) != 0 &&
             strcmp(version, "HTTP/0.9") != 0 && version[0])
        why = "an HTTP/1.1 request must carry a Host header field";
    if (!why) return 0;
    api_error_set(e, status, INVALID, NULL, status == 501 ? "not_implemented" : "bad_request",
                  "Ambiguous or malformed request framing: %s (RFC 9112).", why);
    return -1;
}

/* given (blanks around it skipped: MHD keeps trailing ones) against key, in constant time in
 * the key's length. */
static bool key_matches(const char *given, const char *key)
{
    while (*given == ' ' || *given == '\t') given++;
    size_t gl = strlen(given), kl = strlen(key);
    while (gl && (given[gl - 1] == ' ' || given[gl - 1] == '\t')) gl--;
    unsigned char diff = (unsigned char)(gl != kl);
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)(key[i] ^ given[i < gl ? i : 0]);
    return diff == 0 && kl > 0;
}

bool http_guard_bearer(const char *h, const char *key)
{
    if (!h || strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t')) return false;
    return key_matches(h + 6, key);
}

bool http_guard_key(const char *h, const char *key) { return h && key_matches(h, key); }

size_t http_guard_printable(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; src[n] && n + 1 < cap; n++) dst[n] = (src[n] >= 0x20 && src[n] < 0x7f) ? src[n] : '?';
    dst[n] = 0;
    return n;
}
