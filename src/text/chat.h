/* chat.h - chat templates: turn a list of messages into the prompt text a model was trained
 * on.  GGUF files carry a Jinja template in tokenizer.chat_template, which the server runs
 * with jinja.h (chat_render_jinja_prompt); the named built-in families below, recognised by their
 * distinctive markers and rendered in C, are the fallback for files without a template. */
#ifndef INFERD_CHAT_H
#define INFERD_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "jinja.h"
#include "tokenizer.h" /* tok_span */

typedef enum chat_template_kind {
    CHAT_TMPL_CHATML = 0, /* <|im_start|>role\n...<|im_end|>\n  (Qwen, many fine-tunes; the fallback) */
    CHAT_TMPL_LLAMA2,     /* <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s> */
    CHAT_TMPL_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    CHAT_TMPL_MISTRAL,    /* [INST] ... [/INST] (v1-style, system folded into the first user turn) */
    CHAT_TMPL_ZEPHYR,     /* <|user|>\n...</s>\n<|assistant|>\n */
    CHAT_TMPL_GEMMA,      /* <start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n */
    CHAT_TMPL_PHI3,       /* <|user|>\n...<|end|>\n<|assistant|>\n */
    CHAT_TMPL_COUNT
} chat_template_kind;

typedef struct chat_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content; /* UTF-8 text */
} chat_msg;

/* What the server puts into every prompt. */
typedef struct chat_vars {
    bool add_generation_prompt; /* end with the opening of an assistant turn */
    const char *bos, *eos;      /* the model's BOS/EOS token texts (NULL = "") */
    /* Non-NULL: the length of a control token's text at s[0..n) (0: none), e.g.
     * tokenizer_control_at; the messages' control-token texts are then tokenized as text
     * (chat_prompt.plain).  NULL: the whole prompt counts as the template's
     * (--special-in-content). */
    size_t (*protect_at)(void *ctx, const char *s, size_t n);
    void *protect_ctx;
} chat_vars;

/* A rendered prompt: its text and the ranges of it where the request's messages wrote text
 * that must not become a control token (for tokenizer_encode_prompt). */
typedef struct chat_prompt {
    char *text; /* malloc'd, NUL-terminated */
    size_t len;
    tok_span *plain; /* malloc'd, sorted; NULL when none */
    size_t n_plain;
} chat_prompt;

void chat_prompt_free(chat_prompt *p);

/* Recognise a template family from a GGUF tokenizer.chat_template source (NULL -> ChatML). */
chat_template_kind chat_template_detect(const char *jinja_src);
/* Parse a --chat-template name ("chatml", "llama2", "llama3", "mistral", "zephyr", "gemma",
 * "phi3"); -1 when unknown. */
int chat_template_from_name(const char *name);
const char *chat_template_name(chat_template_kind kind);

/* Render messages into a malloc'd NUL-terminated prompt (caller frees). With
 * add_generation_prompt the text ends with the opening of an assistant turn.  bos/eos are the
 * model's BOS/EOS token texts (templates like Llama 2 write them literally; NULL = ""). The
 * rendered text is meant to be tokenized with special-token parsing on (except in the
 * messages' text: chat_render_prompt, tokenizer_encode_prompt) and without an extra BOS when
 * it already starts with one (tokenizer_prompt_bos decides that from the text, which also
 * covers a bos text that is empty or not the tokenizer's). Returns NULL when a message has an
 * unknown role (err says which). */
char *chat_render(chat_template_kind kind, const chat_msg *msgs, size_t n_msgs,
                  bool add_generation_prompt, const char *bos, const char *eos, char *err,
                  size_t errlen);
/* The same into a chat_prompt, whose plain spans are the messages' text (with vars->protect_at).
 * 0, or -1 with the reason in err. */
int chat_render_prompt(chat_template_kind kind, const chat_msg *msgs, size_t n_msgs, const chat_vars *vars,
                       chat_prompt *out, char *err, size_t errlen);
/* Renders the model's own Jinja template.  ctx_json is a JSON object of the request's
 * variables (messages, tools, chat_template_kwargs' members); bos_token, eos_token and
 * add_generation_prompt are the server's (vars): a member of ctx_json with one of these names
 * is ignored.  With vars->protect_at, out->plain spans are where a control token's text in the
 * request's data (messages, tools, chat_template_kwargs) ended up in the prompt, however the
 * template moved it; the same text written by the template (or bos_token and eos_token) stays
 * a control token.  0, or -1 with the template's message (raise_exception, a type error, a
 * limit) in err. */
int chat_render_jinja_prompt(const jinja_tmpl *t, const char *ctx_json, const chat_vars *vars, chat_prompt *out,
                             char *err, size_t errlen);

/* True when the family's rendered text begins with the BOS text (given a non-empty one). */
bool chat_template_has_bos(chat_template_kind kind);

#endif
