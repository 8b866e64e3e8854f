/* chat_parse_int.h - what chat_parse.c shares with the families parsed in a file of their own
 * (harmony.c): the parser's state and the bookkeeping of the calls it releases, so that every
 * family's calls get the same ids, the same gate (a function offered, parallel_tool_calls) and
 * the same streamed pieces.  Not for use outside src/text. */
#ifndef INFERD_CHAT_PARSE_INT_H
#define INFERD_CHAT_PARSE_INT_H

#include "chat_parse.h"
#include "json_reprint.h"

typedef enum pstate { ST_START, ST_REASON, ST_CONTENT, ST_CALL } pstate;

/* The look-ahead of a streamed call region: where it stands. */
typedef enum pview {
    PV_SEEK,    /* the region's first call: an object, an array of them, or the family's own shape */
    PV_ELEM,    /* before a call object (in an array: before its ',') */
    PV_HEADER,  /* {"name": "NAME", "arguments"|"parameters": { -- not yet all there */
    PV_MISTRAL, /* NAME[ARGS]{ */
    PV_DS,      /* <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{ */
    PV_ARGS,    /* the open call's arguments, re-printed as they come */
    PV_AFTER,   /* the arguments ended: the next object of an array */
    PV_OFF      /* nothing more to read ahead in this region (the CALL state decides) */
} pview;

/* A call opened ahead of its end. */
typedef struct live_call {
    int ord;      /* which call object of the region it is */
    int index;    /* its index as released */
    bytebuf sent; /* its argument fragments so far */
    bool closed;  /* its last piece went out */
} live_call;

struct chat_parser {
    chat_parse_opts o;
    pstate st;
    bytebuf buf;        /* text not yet released */
    bytebuf ws;         /* whitespace held between content and a possible call */
    bool content_begun; /* content (beyond whitespace) was released */
    bool skip_ws;       /* drop whitespace right after </think> */
    bool bare_json;     /* Llama 3: this call region began with a bare '{' */
    int n_calls;        /* released to the client */
    int n_seen;         /* recognised in the reply, dropped ones included (the markup's shape) */
    int n_dropped;
    uint64_t id_state;
    /* stream_calls: the look-ahead of the region in buf (reset whenever the CALL state consumes) */
    pview pv;
    size_t pv_pos;   /* how far into buf it has read */
    size_t pv_obj;   /* where the call object being read starts */
    bool pv_array;   /* the region is an array of call objects */
    bool pv_comma;   /* array: a ',' comes before the next object */
    int pv_ord;      /* the call object's ordinal in the region */
    int step_ord;    /* calls the CALL state completed in the region */
    json_reprint rp; /* the open call's arguments */
    bytebuf pv_out;  /* re-printed arguments not yet released (an incomplete UTF-8 tail) */
    live_call *live; /* the calls opened in the region */
    int n_live, cap_live;
    struct harmony *hm; /* CHAT_SYNTAX_HARMONY: its own state (harmony.c) */
};

/* Longest tail of s[0..n) that is a proper prefix of marker m. */
size_t chat_tail_prefix(const char *s, size_t n, const char *m);
/* A fresh call id: "call_" and 24 characters from the parser's seed. */
void chat_call_id(chat_parser *p, char *id, size_t cap);
/* True when the client may be handed a call of name: a function it offered, within
 * parallel_tool_calls. */
bool chat_call_admitted(const chat_parser *p, const char *name, size_t len);
/* Releases a whole call (partial: cut by max_tokens, its arguments as written) when the client
 * can act on it, else drops and counts it.  0, or -1 when memory ran out. */
int chat_call_add(chat_parser *p, chat_delta *d, const char *name, size_t name_len, const char *args, bool partial);
/* The entry a piece of streamed call index goes into (see chat_parse.c); NULL when out of memory. */
chat_tool_call *chat_call_piece(chat_delta *d, int index);
/* Appends s[0..n) to a piece's arguments; -1 when memory ran out. */
int chat_call_append(chat_tool_call *c, const char *s, size_t n);

/* Harmony (harmony.c): the same entry points as chat_parser_*, for a parser of that syntax. */
int harmony_new(chat_parser *p);
void harmony_free(chat_parser *p);
int harmony_feed(chat_parser *p, chat_delta *d);
int harmony_finish(chat_parser *p, chat_delta *d, bool cut);

#endif
