/* fuzz_chat.c - chat templates (src/text/chat.c): every family with arbitrary messages,
 * BOS/EOS texts and template sources.
 *
 * Input: a template byte, a flag byte, then NUL-separated fields: BOS text, EOS text, a Jinja
 * source for chat_template_detect, a --chat-template name, then role/content pairs.  A role
 * field of 0 or 1 bytes picks one of system/user/assistant/NULL; longer ones are used as is.
 *
 * Invariants: a known template with known roles always renders; an unknown role is refused
 * with a message; every message's (trimmed) content appears in the prompt (in order, except
 * in the families that move the system message into the first user turn); with a generation
 * prompt the text ends with the family's opening of an assistant turn. */
#include "fuzz_common.h"

#include "text/chat.h"

#define FZ_MAX_MSGS 64

static const char *const known_roles[] = {"system", "user", "assistant", NULL};

/* Jinja's trim: the renderers may trim, so only the trimmed text is sure to appear. */
static const char *trimmed(const char *s, size_t *len)
{
    const char *end = s + strlen(s);
    while (s < end && strchr(" \t\n\r\f\v", *s)) s++;
    while (end > s && strchr(" \t\n\r\f\v", end[-1])) end--;
    *len = (size_t)(end - s);
    return s;
}

/* How each family opens the assistant turn it asks the model to write ("" = implicit). */
static const char *generation_prompt(chat_template_kind k)
{
    switch (k) {
    case CHAT_TMPL_CHATML: return "<|im_start|>assistant\n";
    case CHAT_TMPL_LLAMA3: return "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case CHAT_TMPL_ZEPHYR:
    case CHAT_TMPL_PHI3: return "<|assistant|>\n";
    case CHAT_TMPL_GEMMA: return "<start_of_turn>model\n";
    default: return "";
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t kind_byte = fz_u8(&in), flags = fz_u8(&in);
    /* Mostly a real family; now and then an out-of-range value, which must be refused. */
    int kind = kind_byte < 0xF0 ? kind_byte % CHAT_TMPL_COUNT : kind_byte;
    size_t l;
    const char *f = fz_field(&in, &l);
    char *bos = fz_strndup(f, l);
    f = fz_field(&in, &l);
    char *eos = fz_strndup(f, l);
    f = fz_field(&in, &l);
    char *src = fz_strndup(f, l);
    f = fz_field(&in, &l);
    char *name = fz_strndup(f, l);

    FZ_CHECK((unsigned)chat_template_detect(src) < CHAT_TMPL_COUNT);
    int by_name = chat_template_from_name(name);
    FZ_CHECK(by_name == -1 || (by_name >= 0 && by_name < CHAT_TMPL_COUNT &&
                               strcmp(chat_template_name((chat_template_kind)by_name), name) == 0));

    chat_msg msgs[FZ_MAX_MSGS];
    char *owned[2 * FZ_MAX_MSGS];
    size_t n = 0, n_owned = 0;
    bool roles_ok = true;
    while (in.n && n < FZ_MAX_MSGS) {
        f = fz_field(&in, &l);
        const char *role;
        if (l <= 1) {
            role = known_roles[(l ? (uint8_t)f[0] : 0) % 4];
        } else {
            role = owned[n_owned++] = fz_strndup(f, l);
        }
        bool known = false;
        for (int r = 0; r < 3; r++) known = known || (role && strcmp(role, known_roles[r]) == 0);
        roles_ok = roles_ok && known;
        f = fz_field(&in, &l);
        char *content = owned[n_owned++] = fz_strndup(f, l);
        msgs[n++] = (chat_msg){role, content};
    }

    bool gen = flags & 1;
    char err[256] = "";
    char *out = chat_render((chat_template_kind)kind, msgs, n, gen, flags & 2 ? NULL : bos,
                            flags & 4 ? NULL : eos, err, sizeof err);
    if (kind >= CHAT_TMPL_COUNT || !roles_ok) {
        FZ_CHECK(out == NULL && err[0] != 0);
    } else {
        FZ_CHECK(out != NULL);
        size_t out_len = strlen(out), pos = 0;
        /* Llama 2, Mistral and Gemma place a leading system message inside the first user
         * turn, wherever that is: only those keep order loosely. */
        bool ordered = kind != CHAT_TMPL_LLAMA2 && kind != CHAT_TMPL_MISTRAL && kind != CHAT_TMPL_GEMMA;
        for (size_t i = 0; i < n; i++) {
            if (!ordered) pos = 0;
            size_t cl;
            const char *c = trimmed(msgs[i].content, &cl);
            const char *hit = cl ? memmem(out + pos, out_len - pos, c, cl) : out + pos;
            FZ_CHECK(hit != NULL);
            pos = (size_t)(hit - out) + cl;
        }
        const char *g = generation_prompt((chat_template_kind)kind);
        size_t gl = strlen(g);
        if (gen) FZ_CHECK(out_len >= gl && memcmp(out + out_len - gl, g, gl) == 0);
    }
    free(out);
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(bos);
    free(eos);
    free(src);
    free(name);
    return 0;
}
