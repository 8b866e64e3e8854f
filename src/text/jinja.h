/* jinja.h - a sandboxed Jinja2 interpreter for chat templates.
 *
 * Renders the `tokenizer.chat_template` of a GGUF (a Hugging Face chat template) the way
 * transformers' apply_chat_template does with Python jinja2: trim_blocks and lstrip_blocks on,
 * the loopcontrols extension (break/continue), an immutable sandbox (no list/dict mutation),
 * `tojson` as json.dumps(ensure_ascii=False) with Python's ", " / ": " separators, and the
 * globals raise_exception(msg) and strftime_now(fmt).
 *
 * Sandboxed: a template can read only the context it is given and write only its output; no
 * file, no environment, no clock except strftime_now.  Every render is bounded in output
 * size, evaluation steps (loop iterations and bytes compared or searched included), nesting
 * depth (of the template and of the values it compares or prints), memory and wall-clock time,
 * and fails with a message instead of growing without end.
 *
 * A parsed template is immutable: several threads may render it at once. */
#ifndef INFERD_JINJA_H
#define INFERD_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct jinja_tmpl jinja_tmpl;

typedef struct jinja_opts {
    size_t max_output;  /* bytes of rendered text (0: 8 MiB) */
    size_t max_memory;  /* bytes of the render's arena (0: 64 MiB) */
    uint64_t max_steps; /* evaluation steps, loop iterations included (0: 10 million) */
    int max_depth;      /* nesting of expressions, blocks, macro calls and of the values that
                         * ==, <, in, sort, unique, repr and tojson walk (0: 200) */
    unsigned max_ms;    /* wall-clock milliseconds (0: 2000): steps count bytes compared and
                         * searched too, so this is a last resort that a template meets only on a
                         * very slow machine */
    /* strftime_now's clock: NULL = the local time at the call (tests pass a fixed date). */
    const struct tm *now;
    /* Provenance of protected text (jinja_render): when set, every string of the context is
     * searched with protect_at (the length of a protected text beginning at s[0..n), 0 for
     * none), except the values of the top-level names in trusted (NULL-terminated: the
     * caller's own variables), and the render reports where such text ended up in the output,
     * through whatever the template did with it (concatenation, slicing, tojson...).  A chat
     * prompt protects control-token texts: those a message wrote are tokenized as text, those
     * the template itself wrote are control tokens. */
    size_t (*protect_at)(void *ctx, const char *s, size_t n);
    void *protect_ctx;
    const char *const *trusted;
} jinja_opts;

/* A byte range of a render's output. */
typedef struct jinja_span {
    size_t off, len;
} jinja_span;

typedef struct jinja_result {
    char *text; /* malloc'd, NUL-terminated */
    size_t len;
    jinja_span *protected_at; /* malloc'd, sorted, not overlapping; NULL when none */
    size_t n_protected;
} jinja_result;

/* Parses a template source (not necessarily NUL-terminated).  NULL with a message in err
 * ("line N: ...") when the source is not a template this interpreter understands. */
jinja_tmpl *jinja_parse(const char *src, size_t len, char *err, size_t errlen);
void jinja_free(jinja_tmpl *t);

/* Renders with the variables of a JSON object (its members become the template's globals:
 * messages, tools, add_generation_prompt, bos_token, ...).  Returns the malloc'd,
 * NUL-terminated text (its length in *out_len when non-NULL), or NULL with a message in err:
 * the template's raise_exception("..."), a type error ("can only concatenate str (not
 * \"dict\") to str"), a limit, or a context that is not a JSON object.  opts may be NULL. */
char *jinja_render_json(const jinja_tmpl *t, const char *ctx_json, size_t ctx_len,
                        const jinja_opts *opts, size_t *out_len, char *err, size_t errlen);
/* The same, with the spans of protected text (opts->protect_at) in the result: 0, or -1 with a
 * message in err (the result is then empty).  The caller frees res->text and res->protected_at. */
int jinja_render(const jinja_tmpl *t, const char *ctx_json, size_t ctx_len, const jinja_opts *opts,
                 jinja_result *res, char *err, size_t errlen);

/* True when the template's source mentions the name as an identifier (e.g. "tools",
 * "enable_thinking"): lets the caller know what a template can use without rendering. */
int jinja_mentions(const jinja_tmpl *t, const char *name);

#endif
