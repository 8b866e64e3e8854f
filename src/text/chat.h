/* chat.h - chat templates: turn a list of messages into the prompt text a model was trained
 * on.  GGUF files carry a Jinja template in tokenizer.chat_template, which the server runs
 * with jinja.h (chat_render_jinja); the named built-in families below, recognised by their
 * distinctive markers and rendered in C, are the fallback for files without a template. */
#ifndef INFERD_CHAT_H
#define INFERD_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "jinja.h"

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

/* Recognise a template family from a GGUF tokenizer.chat_template source (NULL -> ChatML). */
chat_template_kind chat_template_detect(const char *jinja_src);
/* Parse a --chat-template name ("chatml", "llama2", "llama3", "mistral", "zephyr", "gemma",
 * "phi3"); -1 when unknown. */
int chat_template_from_name(const char *name);
const char *chat_template_name(chat_template_kind kind);

/* Render messages into a malloc'd NUL-terminated prompt (caller frees). With
 * add_generation_prompt the text ends with the opening of an assistant turn.  bos/eos are the
 * model's BOS/EOS token texts (templates like Llama 2 write them literally; NULL = ""). The
 * rendered text is meant to be tokenized with special-token parsing on and without an extra
 * BOS when it already starts with one (tokenizer_prompt_bos decides that from the text, which
 * also covers a bos text that is empty or not the tokenizer's). Returns NULL when a message
 * has an unknown role (err says which). */
char *chat_render(chat_template_kind kind, const chat_msg *msgs, size_t n_msgs,
                  bool add_generation_prompt, const char *bos, const char *eos, char *err,
                  size_t errlen);
/* Renders the model's own Jinja template.  ctx_json is a JSON object of the request's
 * variables (messages, tools, chat_template_kwargs' members); bos_token, eos_token and
 * add_generation_prompt are the server's: a member of ctx_json with one of these names is
 * ignored.  NULL with the template's message (raise_exception, a type error, a limit) in err. */
char *chat_render_jinja(const jinja_tmpl *t, const char *ctx_json, bool add_generation_prompt,
                        const char *bos, const char *eos, char *err, size_t errlen);

/* True when the family's rendered text begins with the BOS text (given a non-empty one). */
bool chat_template_has_bos(chat_template_kind kind);

#endif
