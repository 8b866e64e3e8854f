/* chat.c - chat templates rendered in C.
 *
 * Each family reproduces what the model's official Jinja template produces for the three
 * standard roles.  Where the official templates differ on the system message:
 *   chatml, llama3, zephyr, phi3  own system turn
 *   llama2                        wrapped in <<SYS>> ... <</SYS>> inside the first [INST]
 *   mistral, gemma                folded into the first user turn ("system\n\nuser")
 * llama3 and gemma trim the content of every message, as their templates do (| trim);
 * llama2 strips user/assistant content (.strip()). */
#include "chat.h"

#include "base/bytebuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const tmpl_names[CHAT_TMPL_COUNT] = {
    [CHAT_TMPL_CHATML] = "chatml", [CHAT_TMPL_LLAMA2] = "llama2", [CHAT_TMPL_LLAMA3] = "llama3",
    [CHAT_TMPL_MISTRAL] = "mistral", [CHAT_TMPL_ZEPHYR] = "zephyr", [CHAT_TMPL_GEMMA] = "gemma",
    [CHAT_TMPL_PHI3] = "phi3",
};

chat_template_kind chat_template_detect(const char *src)
{
    if (!src) return CHAT_TMPL_CHATML;
    if (strstr(src, "<|im_start|>")) return CHAT_TMPL_CHATML;
    if (strstr(src, "<|start_header_id|>")) return CHAT_TMPL_LLAMA3;
    if (strstr(src, "[INST]")) return strstr(src, "<<SYS>>") ? CHAT_TMPL_LLAMA2 : CHAT_TMPL_MISTRAL;
    if (strstr(src, "<start_of_turn>")) return CHAT_TMPL_GEMMA;
    if (strstr(src, "<|user|>")) {
        if (strstr(src, "<|end|>")) return CHAT_TMPL_PHI3;
        if (strstr(src, "eos_token") || strstr(src, "</s>")) return CHAT_TMPL_ZEPHYR;
    }
    return CHAT_TMPL_CHATML;
}

int chat_template_from_name(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < CHAT_TMPL_COUNT; i++)
        if (strcmp(name, tmpl_names[i]) == 0) return i;
    return -1;
}

const char *chat_template_name(chat_template_kind kind)
{
    return (unsigned)kind < CHAT_TMPL_COUNT ? tmpl_names[kind] : "unknown";
}

bool chat_template_has_bos(chat_template_kind kind)
{
    return kind == CHAT_TMPL_LLAMA2 || kind == CHAT_TMPL_LLAMA3 || kind == CHAT_TMPL_MISTRAL ||
           kind == CHAT_TMPL_GEMMA;
}

/* ---- output helpers ---------------------------------------------------------------------- */
/* Appends the NUL-terminated arguments in order (the list ends with NULL). */
static void sb_cat(bytebuf *b, ...)
{
    va_list ap;
    va_start(ap, b);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        bytebuf_puts(b, s);
    va_end(ap);
}

/* Appends s without leading/trailing whitespace (Jinja's trim / Python's strip). */
static void sb_trimmed(bytebuf *b, const char *s)
{
    const char *end = s + strlen(s);
    while (s < end && strchr(" \t\n\r\f\v", *s)) s++;
    while (end > s && strchr(" \t\n\r\f\v", end[-1])) end--;
    bytebuf_append(b, s, (size_t)(end - s));
}

/* ---- roles -------------------------------------------------------------------------------- */
typedef enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } role;

static int role_parse(const char *r)
{
    if (!r) return -1;
    if (strcmp(r, "system") == 0) return ROLE_SYSTEM;
    if (strcmp(r, "user") == 0) return ROLE_USER;
    if (strcmp(r, "assistant") == 0) return ROLE_ASSISTANT;
    return -1;
}

/* Everything a family renderer needs; `sys` is the leading system message for the families
 * that fold it into the first user turn (NULL when there is none). */
typedef struct render_ctx {
    bytebuf out;
    const chat_msg *msgs;
    size_t n;
    bool gen;
    const char *bos, *eos;
    bytebuf plain; /* tok_span: where message text went (when vars->protect_at) */
    bool track;
} render_ctx;

/* A message's text (trimmed or as it is), its range remembered as plain text. */
static void put_content(render_ctx *c, const char *s, bool trim)
{
    size_t from = c->out.len;
    if (trim)
        sb_trimmed(&c->out, s);
    else
        sb_cat(&c->out, s, NULL);
    if (c->track && c->out.len > from) {
        tok_span sp = {from, c->out.len - from};
        bytebuf_append(&c->plain, (const char *)&sp, sizeof sp);
    }
}

/* Families with one delimited turn per message: prefix(role) content suffix. */
typedef struct turn_style {
    const char *names[3]; /* role names as the template writes them */
    const char *open, *mid, *close; /* open + name + mid + content + close */
    bool close_is_eos;              /* zephyr: the turn ends with the EOS text then "\n" */
    bool trim;
} turn_style;

static void render_turns(render_ctx *c, const turn_style *st, const char *lead)
{
    sb_cat(&c->out, lead, NULL);
    for (size_t i = 0; i < c->n; i++) {
        int r = role_parse(c->msgs[i].role);
        sb_cat(&c->out, st->open, st->names[r], st->mid, NULL);
        put_content(c, c->msgs[i].content, st->trim);
        if (st->close_is_eos) sb_cat(&c->out, c->eos, NULL);
        sb_cat(&c->out, st->close, NULL);
    }
    if (c->gen) sb_cat(&c->out, st->open, st->names[ROLE_ASSISTANT], st->mid, NULL);
}

/* Llama 2, Mistral v1 and Gemma alternate user/assistant after an optional system message,
 * which lands inside the first user turn.  `sys_wrap` formats it (with %s for the text). */
typedef struct alt_style {
    const char *user_open, *user_close;           /* around user content */
    const char *asst_open, *asst_close;           /* around assistant content (before eos) */
    bool asst_eos;                                /* assistant turn followed by the EOS text */
    bool bos_each_user;                           /* llama2: BOS before every [INST] */
    const char *sys_before, *sys_after;           /* around the system text in the first turn */
    const char *gen;                              /* generation prompt ("" when implicit) */
    bool trim;
} alt_style;

static void render_alternating(render_ctx *c, const alt_style *st)
{
    size_t i = 0;
    const char *sys = NULL;
    if (c->n > 0 && role_parse(c->msgs[0].role) == ROLE_SYSTEM) {
        sys = c->msgs[0].content;
        i = 1;
    }
    if (!st->bos_each_user) sb_cat(&c->out, c->bos, NULL);
    bool first_user = true;
    for (; i < c->n; i++) {
        int r = role_parse(c->msgs[i].role);
        if (r == ROLE_ASSISTANT) {
            sb_cat(&c->out, st->asst_open, NULL);
            put_content(c, c->msgs[i].content, st->trim);
            sb_cat(&c->out, st->asst_close, st->asst_eos ? c->eos : "", NULL);
            continue;
        }
        /* user (a later system message is rendered as a user turn: none of these templates
         * has a place for it) */
        if (st->bos_each_user) sb_cat(&c->out, c->bos, NULL);
        sb_cat(&c->out, st->user_open, NULL);
        if (first_user && sys) {
            sb_cat(&c->out, st->sys_before, NULL);
            put_content(c, sys, st->trim);
            sb_cat(&c->out, st->sys_after, NULL);
        }
        first_user = false;
        put_content(c, c->msgs[i].content, st->trim);
        sb_cat(&c->out, st->user_close, NULL);
    }
    if (first_user && sys) { /* only a system message: still show it to the model */
        if (st->bos_each_user) sb_cat(&c->out, c->bos, NULL);
        sb_cat(&c->out, st->user_open, st->sys_before, NULL);
        put_content(c, sys, false);
        sb_cat(&c->out, st->sys_after, st->user_close, NULL);
    }
    if (c->gen) sb_cat(&c->out, st->gen, NULL);
}

static const turn_style chatml_style = {
    {"system", "user", "assistant"}, "<|im_start|>", "\n", "<|im_end|>\n", false, false};
static const turn_style llama3_style = {
    {"system", "user", "assistant"}, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
    false, true};
static const turn_style zephyr_style = {
    {"system", "user", "assistant"}, "<|", "|>\n", "\n", true, false};
static const turn_style phi3_style = {
    {"system", "user", "assistant"}, "<|", "|>\n", "<|end|>\n", false, false};

static const alt_style llama2_style = {
    .user_open = "[INST] ", .user_close = " [/INST]", .asst_open = " ", .asst_close = " ",
    .asst_eos = true, .bos_each_user = true, .sys_before = "<<SYS>>\n",
    .sys_after = "\n<</SYS>>\n\n", .gen = "", .trim = true};
static const alt_style mistral_style = {
    .user_open = "[INST] ", .user_close = " [/INST]", .asst_open = "", .asst_close = "",
    .asst_eos = true, .bos_each_user = false, .sys_before = "", .sys_after = "\n\n", .gen = "",
    .trim = false};
static const alt_style gemma_style = {
    .user_open = "<start_of_turn>user\n", .user_close = "<end_of_turn>\n",
    .asst_open = "<start_of_turn>model\n", .asst_close = "<end_of_turn>\n", .asst_eos = false,
    .bos_each_user = false, .sys_before = "", .sys_after = "\n\n",
    .gen = "<start_of_turn>model\n", .trim = true};

int chat_render_prompt(chat_template_kind kind, const chat_msg *msgs, size_t n_msgs, const chat_vars *v,
                       chat_prompt *out, char *err, size_t errlen)
{
    *out = (chat_prompt){0};
    if ((unsigned)kind >= CHAT_TMPL_COUNT) {
        snprintf(err, errlen, "unknown chat template %d", (int)kind);
        return -1;
    }
    for (size_t i = 0; i < n_msgs; i++) {
        if (role_parse(msgs[i].role) < 0) {
            snprintf(err, errlen, "messages[%zu]: unknown role '%s' (system, user, assistant)",
                     i, msgs[i].role ? msgs[i].role : "(null)");
            return -1;
        }
        if (!msgs[i].content) {
            snprintf(err, errlen, "messages[%zu]: content missing", i);
            return -1;
        }
    }
    render_ctx c = {.msgs = msgs, .n = n_msgs, .gen = v->add_generation_prompt,
                    .bos = v->bos ? v->bos : "", .eos = v->eos ? v->eos : "", .track = v->protect_at != NULL};
    bytebuf_append(&c.out, "", 0); /* an empty rendering is "", not NULL */
    switch (kind) {
    case CHAT_TMPL_CHATML: render_turns(&c, &chatml_style, ""); break;
    case CHAT_TMPL_LLAMA3: render_turns(&c, &llama3_style, c.bos); break;
    case CHAT_TMPL_ZEPHYR: render_turns(&c, &zephyr_style, ""); break;
    case CHAT_TMPL_PHI3: render_turns(&c, &phi3_style, ""); break;
    case CHAT_TMPL_LLAMA2: render_alternating(&c, &llama2_style); break;
    case CHAT_TMPL_MISTRAL: render_alternating(&c, &mistral_style); break;
    case CHAT_TMPL_GEMMA: render_alternating(&c, &gemma_style); break;
    default: break;
    }
    if (!bytebuf_ok(&c.out) || !bytebuf_ok(&c.plain)) {
        bytebuf_free(&c.out);
        bytebuf_free(&c.plain);
        snprintf(err, errlen, "out of memory rendering the chat template");
        return -1;
    }
    out->n_plain = c.plain.len / sizeof(tok_span);
    out->plain = (tok_span *)bytebuf_take(&c.plain, NULL);
    out->text = bytebuf_take(&c.out, &out->len);
    return 0;
}

char *chat_render(chat_template_kind kind, const chat_msg *msgs, size_t n_msgs,
                  bool add_generation_prompt, const char *bos, const char *eos, char *err,
                  size_t errlen)
{
    chat_vars v = {.add_generation_prompt = add_generation_prompt, .bos = bos, .eos = eos};
    chat_prompt p;
    return chat_render_prompt(kind, msgs, n_msgs, &v, &p, err, errlen) == 0 ? p.text : NULL;
}

void chat_prompt_free(chat_prompt *p)
{
    free(p->text);
    free(p->plain);
    *p = (chat_prompt){0};
}

/* ---- the model's Jinja template ---------------------------------------------------------- */

static void json_escaped(bytebuf *b, const char *s)
{
    bytebuf_puts(b, "\"");
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            bytebuf_append(b, e, 2);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            bytebuf_puts(b, e);
        } else {
            bytebuf_append(b, (const char *)&c, 1);
        }
    }
    bytebuf_puts(b, "\"");
}

int chat_render_jinja_prompt(const jinja_tmpl *t, const char *ctx_json, const chat_vars *v, chat_prompt *out,
                             char *err, size_t errlen)
{
    *out = (chat_prompt){0};
    /* The request's variables first, ours last: the renderer's JSON reader lets a later
     * duplicate key win, so chat_template_kwargs cannot turn the generation prompt off or
     * rewrite the special-token texts. */
    const char *ctx = ctx_json ? ctx_json : "{}";
    size_t n = strlen(ctx);
    while (n && (ctx[n - 1] == ' ' || ctx[n - 1] == '\n')) n--;
    if (!n || ctx[n - 1] != '}') {
        snprintf(err, errlen, "the template's variables are not a JSON object");
        return -1;
    }
    bytebuf b = {0};
    bytebuf_append(&b, ctx, n - 1);
    const char *open = strchr(ctx, '{');
    bool empty = !open || open + 1 + strspn(open + 1, " \n") == ctx + n - 1;
    bytebuf_puts(&b, empty ? "" : ",");
    bytebuf_puts(&b, v->add_generation_prompt ? "\"add_generation_prompt\":true,\"bos_token\":"
                                              : "\"add_generation_prompt\":false,\"bos_token\":");
    json_escaped(&b, v->bos);
    bytebuf_puts(&b, ",\"eos_token\":");
    json_escaped(&b, v->eos);
    bytebuf_puts(&b, "}");
    if (!bytebuf_ok(&b)) {
        bytebuf_free(&b);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* Control-token texts in the request's strings are followed to the output; ours are not. */
    static const char *const ours[] = {"bos_token", "eos_token", NULL};
    jinja_opts o = {.protect_at = v->protect_at, .protect_ctx = v->protect_ctx, .trusted = ours};
    jinja_result r;
    int rc = jinja_render(t, b.data, b.len, &o, &r, err, errlen);
    bytebuf_free(&b);
    if (rc != 0) return -1;
    out->text = r.text;
    out->len = r.len;
    out->n_plain = r.n_protected;
    if (r.n_protected && !(out->plain = malloc(r.n_protected * sizeof *out->plain))) {
        free(r.protected_at);
        chat_prompt_free(out);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < r.n_protected; i++) out->plain[i] = (tok_span){r.protected_at[i].off, r.protected_at[i].len};
    free(r.protected_at);
    return 0;
}
