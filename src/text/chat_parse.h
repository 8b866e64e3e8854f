/* chat_parse.h - a model's reply split the way the OpenAI chat API returns it: reasoning
 * (<think> blocks, as reasoning_content), content, and tool calls in the markup of the model's
 * family, turned into {id, name, arguments} with arguments a JSON string.
 *
 * Streaming: feed the text pieces as the detokenizer releases them; each feed appends to a
 * chat_delta what is now decided.  Text that may be the start of a marker ("<tool", "[TOOL_")
 * is held back until the next piece decides it, as stop strings are, so raw markup never
 * reaches content.  A tool call is released whole once its closing markup (or the end of its
 * JSON) arrives -- or, with chat_parse_opts.stream_calls, as it is written: its id and name
 * first, then its arguments in fragments (see chat_tool_call).  chat_parser_finish releases
 * what is still held at the end of generation.
 *
 * Harmony (gpt-oss, harmony.c) is a format of its own: the reply is a sequence of messages, each
 * a header (channel, recipient) and a body; analysis goes to reasoning, final and commentary
 * without a recipient to content, a message to functions.NAME is a call of NAME (see harmony.c).
 *
 * Pure text processing: no model, no sockets; the same output split at any byte boundary
 * gives the same concatenated result. */
#ifndef INFERD_CHAT_PARSE_H
#define INFERD_CHAT_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/bytebuf.h"

typedef enum chat_syntax {
    CHAT_SYNTAX_NONE = 0,    /* no tool-call markup known: everything is content */
    CHAT_SYNTAX_HERMES,      /* Hermes, Qwen 2.5, Qwen 3: <tool_call>{"name", "arguments"}</tool_call> */
    CHAT_SYNTAX_LLAMA3,      /* Llama 3.x: a bare {"name", "parameters"} reply, or after <|python_tag|> */
    CHAT_SYNTAX_MISTRAL,     /* [TOOL_CALLS][{"name", "arguments"}, ...] or [TOOL_CALLS]name[ARGS]{...} */
    CHAT_SYNTAX_DEEPSEEK_V3, /* <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name ```json ...``` */
    CHAT_SYNTAX_HARMONY,     /* gpt-oss: messages on channels, <|channel|>analysis<|message|>...<|end|>,
                              * calls <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...} */
    CHAT_SYNTAX_COUNT
} chat_syntax;

/* The family's tool-call syntax, recognised from the markup its chat template writes. */
chat_syntax chat_syntax_detect(const char *template_src);
const char *chat_syntax_name(chat_syntax s);
/* True when the template writes <think> blocks or Harmony's analysis channel (reasoning models). */
bool chat_template_thinks(const char *template_src);
/* True when every reply of the family is structured by its markup (Harmony's channels), not
 * only its tool calls and reasoning: such a reply always goes through a parser. */
bool chat_syntax_structured(chat_syntax s);

typedef struct chat_parse_opts {
    chat_syntax syntax;
    bool tools;        /* parse tool calls (the request offered tools and tool_choice is not "none") */
    bool reasoning;    /* split <think>...</think> into reasoning */
    bool in_reasoning; /* the prompt already opened <think> (the reply starts inside it) */
    uint64_t id_seed;  /* tool-call ids: "call_" + 24 characters derived from it (never the model's) */
    /* What the client may be handed: calls to these names only (NULL: any name), at most
     * max_calls of them (0: any number; 1 for parallel_tool_calls false).  A call outside these,
     * or whose arguments are not a JSON object, is dropped (chat_parser_n_dropped). */
    const char *const *names;
    int n_names;
    int max_calls;
    /* Release each call as it is written rather than whole (a streamed reply).  A call opens
     * once its name is complete and its arguments object has begun -- in every family: the
     * call object's "name" written first and its "arguments"/"parameters" right after
     * (Hermes, Llama 3, Mistral's JSON), Mistral's name[ARGS]{, DeepSeek's name line and
     * ```json {.  A call written otherwise (the arguments first, or as a JSON string) is
     * released whole when it completes, as without this flag.  The fragments re-print the
     * model's JSON as the whole call's arguments are printed, so they add up to exactly the
     * arguments a non-streamed reply has.  What cannot be taken back: a call whose JSON breaks
     * after it opened ends there (its markup is dropped, never content), where a non-streamed
     * reply would drop it or give it back as text. */
    bool stream_calls;
} chat_parse_opts;

/* A tool call, or (stream_calls) one piece of one: the first piece of a call carries its id
 * and name, later pieces NULL for both; arguments is the piece's fragment ("" when none), and
 * the fragments of one index, in order, concatenate to the call's arguments.  last marks the
 * call's final piece.  Without stream_calls every entry is a whole call (last true). */
typedef struct chat_tool_call {
    int index; /* 0, 1, ... in the order of the reply */
    char *id;
    char *name;
    char *arguments; /* JSON text (or its next fragment) */
    bool last;
} chat_tool_call;

/* What one feed decided: text to append to content and reasoning, calls (or call pieces). */
typedef struct chat_delta {
    bytebuf content, reasoning;
    chat_tool_call *calls;
    int n_calls, cap_calls;
} chat_delta;

void chat_delta_clear(chat_delta *d); /* empties it for the next feed */
void chat_delta_free(chat_delta *d);

typedef struct chat_parser chat_parser;

chat_parser *chat_parser_new(const chat_parse_opts *o);
void chat_parser_free(chat_parser *p);
/* 0, or -1 when memory ran out. */
int chat_parser_feed(chat_parser *p, const char *s, size_t n, chat_delta *d);
int chat_parser_finish(chat_parser *p, chat_delta *d);
/* The same for a reply cut short (max_tokens): a call still being written is released as a
 * partial call -- its name, and its arguments as far as they were written, which may not be
 * complete JSON -- so that the client sees a call cut off (finish_reason "length"), never its
 * markup as content.  A call cut before its name was complete is dropped.  (stream_calls: a
 * call already open gets its last piece: what was held of its arguments, as written.) */
int chat_parser_cut(chat_parser *p, chat_delta *d);
/* Tool calls released (or opened) so far (finish_reason "tool_calls" when > 0). */
int chat_parser_n_calls(const chat_parser *p);
/* Calls recognised in the reply but not released (see chat_parse_opts.names). */
int chat_parser_n_dropped(const chat_parser *p);

/* Forced tool calls (tool_choice "required" or a named function) are enforced by a grammar:
 * this describes what the model must emit for the family, for the grammar engine to compile.
 * prefix / suffix: the literal markup around the call(s); names: the allowed function names;
 * the arguments of each must validate against its parameters schema (JSON text, "{}" when
 * absent).  The body between prefix and suffix is the family's call object:
 * {"name": <one of names>, "<args_key>": <object matching the schema of that name>}, or, for a
 * family that writes the name in markup (args_key NULL: DeepSeek, Harmony), the name, then
 * after_name, then the arguments object. */
typedef struct chat_forced_call {
    const char *prefix, *suffix, *args_key;
    bool array;             /* Mistral: a JSON array of call objects */
    const char *after_name; /* args_key NULL: the markup between the name and the arguments */
} chat_forced_call;

/* The markup of a family's forced call; false when the family has none (CHAT_SYNTAX_NONE). */
bool chat_forced_call_shape(chat_syntax s, chat_forced_call *out);
/* The markup a family's reply writes before its final answer, for a grammar that constrains
 * the answer (a JSON schema): Harmony's <|channel|>final<|message|> (the prompt ends with
 * <|start|>assistant, so the reply opens its message's header itself), "" for the families
 * whose answer is the reply's text. */
const char *chat_answer_prefix(chat_syntax s);

#endif
