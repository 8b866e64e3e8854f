/* gen.c - the generation routes (/v1/completions, /v1/chat/completions, /v1/responses,
 * /v1/messages):
 * validate, build the prompt, submit one scheduler request per choice, then either wait for
 * all of them (a suspended connection, resumed by the scheduler's wake callback) and answer
 * once, or stream from a chunked response whose reader suspends the connection whenever no
 * output is ready.  What the bytes say is the protocol's row (api/api_proto.h): this file
 * drives every protocol the same way and never asks which one it serves.
 *
 * The suspend/resume handshake: the HTTP thread takes output and suspends under g->mu; the
 * wake callback flips g->suspended under g->mu and resumes outside it.  A wake that arrives
 * before the suspend finds its output already taken or still queued for the next take, so no
 * token is ever waited for twice and no connection sleeps with output pending. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "api/api_proto.h"
#include "http_guard.h"
#include "http_int.h"
#include "api/tool_force.h"
#include "base/timing.h"
#include "base/rng.h"

typedef struct gen_choice {
    sched_req *r;
    int prompt;        /* index into g->prompts */
    bytebuf text;         /* non-streaming: the whole text so far (echo included) */
    engine_result *tokens; /* non-streaming with logprobs */
    int n_tokens, cap_tokens;
    size_t text_offset; /* bytes of this choice already emitted (logprobs text_offset) */
    sched_finish finish;
    int stop_string; /* sched_output.stop_string */
    int prompt_tokens, cached_tokens, completion_tokens;
    /* chat: reasoning and tool calls split out of the text (NULL parser: all is content) */
    chat_parser *cp;
    chat_delta delta;   /* what the last feed decided */
    bytebuf reasoning;  /* non-streaming: the whole reasoning */
    chat_delta calls;   /* non-streaming: every tool call (only its calls are used) */
    char error[256];
    float *emb;         /* embeddings / rerank: the answer, taken with the finish */
    size_t n_emb;
} gen_choice;

typedef struct gen_prompt {
    int32_t *ids;
    int n_ids;
    char *echo; /* text to echo (completions with echo) */
    size_t echo_len;
} gen_prompt;

struct gen {
    http_req *hr;
    server *sv;
    const api_protocol *p; /* the protocol's row: parse, encode */
    api_request req;
    api_reply rep;         /* the reply as the row writes it (meta, vocabulary, stream state) */
    char id[48];
    gen_prompt *prompts;
    int n_prompts;
    gen_choice *ch;
    int n_ch, n_done;
    pthread_mutex_t mu;
    bool suspended;
    bytebuf out;      /* streaming: bytes not yet handed to MHD */
    bool out_done; /* streaming: [DONE] is in out */
    double t_first_ms; /* timing_now_ms() when the first completion token was taken; 0 = none yet */
    bool client_gone;  /* the client hung up, so cancelled choices mean 499 */
    peer_watch_entry *watch; /* tells us at once when the client hangs up (peer_watch.h) */
    bool think_in_prompt; /* chat: the rendered prompt ends inside <think> */
    /* gen_prepare's outcome, for gen_answer */
    bool failed;
    api_error fail;
    bool answering; /* gen_answer has started the stream or the wait */
    engine_embed emb; /* embeddings / rerank: how every choice is pooled */
    char ignored_tools[256]; /* req.ignored_tools as a header value: printable ASCII, bounded */
    gen *prev, *next;
};

static bool is_embedding(const api_protocol *p);

/* ---- ids and seeds ------------------------------------------------------------------------ */

/* Unpredictable enough for ids and default seeds; not for secrets. */
static uint64_t random_boot;
static pthread_once_t random_once = PTHREAD_ONCE_INIT;

static void random_init(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    random_boot = rng_splitmix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid());
}

static uint64_t next_random(void)
{
    static _Atomic uint64_t counter;
    pthread_once(&random_once, random_init);
    return rng_splitmix64(random_boot + atomic_fetch_add(&counter, 1));
}

/* ---- vocabulary bridge for the encoder -------------------------------------------------- */

static int vocab_bytes(void *ctx, int32_t id, char *buf, int cap)
{
    return tokenizer_token_bytes(ctx, id, true, buf, cap);
}

static api_vocab vocab_of(const gen *g)
{
    return (api_vocab){vocab_bytes, (void *)g->sv->sm.tok};
}

/* ---- prompt building -------------------------------------------------------------------- */

static int build_completion_prompts(gen *g, api_error *e)
{
    const tokenizer *tok = g->sv->sm.tok;
    g->n_prompts = g->req.n_prompts;
    if (!(g->prompts = calloc((size_t)g->n_prompts, sizeof *g->prompts))) goto oom;
    for (int i = 0; i < g->n_prompts; i++) {
        api_prompt *ap = &g->req.prompts[i];
        gen_prompt *gp = &g->prompts[i];
        if (ap->text) {
            gp->n_ids = tokenizer_encode_alloc(tok, ap->text, ap->text_len,
                                               tokenizer_prompt_bos(tok, ap->text, ap->text_len), true, &gp->ids);
            if (gp->n_ids < 0) goto oom;
        } else { /* token ids are used as given */
            gp->ids = ap->ids;
            gp->n_ids = ap->n_ids;
            ap->ids = NULL;
        }
        if (gp->n_ids == 0) {
            api_error_set(e, 400, "invalid_request_error", g->p->prompt_param, "invalid_value",
                          "Invalid '%s': it encodes to no tokens.", g->p->prompt_param);
            return -1;
        }
        if (ap->text && is_embedding(g->p) && tokenizer_add_eos(tok) && gp->ids[gp->n_ids - 1] != tokenizer_eos(tok)) {
            /* an input to embed is tokenized as /tokenize's add_special does: with EOS when the
             * vocabulary asks (BERT's [SEP]; Qwen3-Embedding's last-token pooling reads it) */
            int32_t *more = realloc(gp->ids, ((size_t)gp->n_ids + 1) * sizeof *more);
            if (!more) goto oom;
            gp->ids = more;
            gp->ids[gp->n_ids++] = tokenizer_eos(tok);
        }
        if (g->req.echo) {
            gp->echo = ap->text ? strdup(ap->text) : tokenizer_decode_alloc(tok, gp->ids, gp->n_ids, &gp->echo_len);
            if (!gp->echo) goto oom;
            if (ap->text) gp->echo_len = ap->text_len;
        }
    }
    return 0;
oom:
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory or tokenizer failure building the prompt");
    return -1;
}

/* The prompt text: the model's Jinja template with the request's variables, or the built-in
 * family for a model without one.  A template that refuses (raise_exception, a type error on
 * these messages) is the client's 400, with the template's own words. */
static size_t control_at(void *tok, const char *s, size_t n) { return tokenizer_control_at(tok, s, n); }

/* The prompt, with the spans where the messages wrote control-token texts (tokenized as text,
 * as OpenAI does, unless the operator chose --special-in-content). */
static int render_chat(const server *sv, const api_request *rq, const char *param, chat_prompt *p, api_error *e)
{
    char err[512] = "";
    bool tools = rq->tools_json && rq->tool_choice != API_TOOL_NONE;
    const jinja_tmpl *t = tools && sv->sm.jinja_tools ? sv->sm.jinja_tools : sv->sm.jinja;
    chat_vars v = {.add_generation_prompt = true, .bos = sv->bos_text, .eos = sv->eos_text};
    if (!sv->sm.special_in_content) v.protect_at = control_at, v.protect_ctx = (void *)sv->sm.tok;
    if (t) {
        /* Harmony: tools without a description, which gpt-oss's template would refuse */
        char *ctx = tools && sv->sm.syntax == CHAT_SYNTAX_HARMONY ? api_tmpl_ctx_describe_tools(rq->tmpl_ctx) : NULL;
        int rc = chat_render_jinja_prompt(t, ctx ? ctx : rq->tmpl_ctx, &v, p, err, sizeof err);
        free(ctx);
        if (rc == 0) return 0;
        /* param: the field the client sent its conversation in (Responses: input) */
        api_error_set(e, 400, "invalid_request_error", param, "invalid_value",
                      "The model's chat template refused these %s: %s", param, err[0] ? err : "no reason given");
        return -1;
    }
    if (chat_render_prompt(sv->sm.tmpl, rq->msgs, (size_t)rq->n_msgs, &v, p, err, sizeof err) == 0) return 0;
    api_error_set(e, 400, "invalid_request_error", param, "invalid_value",
                  "Invalid '%s': %s", param, err[0] ? err : "the chat template could not render them");
    return -1;
}

/* The rendered prompt as tokens: special tokens written by the template are parsed as such; no
 * BOS is added when the text already starts with it (written by the template: a message's BOS
 * text is text).  The count, or -1 with a 500 in e. */
static int encode_chat(const server *sv, const chat_prompt *p, int32_t **ids, api_error *e)
{
    bool add_bos = tokenizer_prompt_bos(sv->sm.tok, p->text, p->len) ||
                   (p->n_plain && p->plain[0].off == 0 && tokenizer_add_bos(sv->sm.tok));
    int n = tokenizer_encode_prompt(sv->sm.tok, p->text, p->len, add_bos, p->plain, p->n_plain, ids);
    if (n <= 0) api_error_set(e, 500, "server_error", NULL, NULL, "tokenizing the chat prompt failed");
    return n > 0 ? n : -1;
}

static int build_chat_prompt(gen *g, api_error *e)
{
    chat_prompt p;
    if (render_chat(g->sv, &g->req, g->p->prompt_param, &p, e) != 0) return -1;
    const char *text = p.text;
    size_t len = p.len;
    /* A reply that starts inside a <think> the prompt opened (DeepSeek R1 distills). */
    g->think_in_prompt = len >= 8 && (memcmp(text + len - 8, "<think>\n", 8) == 0 || memcmp(text + len - 7, "<think>", 7) == 0);
    g->n_prompts = 1;
    g->prompts = calloc(1, sizeof *g->prompts);
    int n = g->prompts ? encode_chat(g->sv, &p, &g->prompts[0].ids, e) : -1;
    chat_prompt_free(&p);
    if (n < 0) {
        if (!g->prompts) api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    g->prompts[0].n_ids = n;
    return 0;
}

int gen_prompt_tokens(const server *sv, const api_request *rq, api_error *e)
{
    chat_prompt p;
    if (render_chat(sv, rq, "messages", &p, e) != 0) return -1;
    int32_t *ids = NULL;
    int n = encode_chat(sv, &p, &ids, e);
    chat_prompt_free(&p);
    free(ids);
    return n;
}

/* Resolve max_tokens and refuse what cannot fit a slot before any work is done. */
static int check_context(gen *g, api_error *e)
{
    int ctx = g->sv->sm.ctx_per_slot;
    const char *param = g->p->prompt_param;
    /* --default-max-tokens: the limit of a chat that sets none (agents such as the Codex CLI never
     * do), never more than the context leaves; completions have OpenAI's 16 already */
    int def = g->sv->cfg.default_max_tokens, room = g->n_prompts ? ctx - g->prompts[0].n_ids : 0;
    if (!g->req.max_tokens && def > 0 && room > 0) g->req.max_tokens = def < room ? def : room;
    for (int i = 0; i < g->n_prompts; i++) {
        int n = g->prompts[i].n_ids;
        int max = g->req.max_tokens ? g->req.max_tokens : ctx - n; /* chat: up to the context */
        if (n >= ctx || (long)n + max > ctx) {
            api_error_set(e, 400, "invalid_request_error", param, "context_length_exceeded",
                          "This model's maximum context length is %d tokens. However, you requested %ld "
                          "tokens (%d in the %s, %d for the completion). Please reduce the length of the "
                          "%s or the completion.", ctx, (long)n + (max > 0 ? max : 1), n, param,
                          max > 0 ? max : 1, param);
            return -1;
        }
    }
    return 0;
}

/* ---- scheduler side --------------------------------------------------------------------- */

static void on_wake(void *ctx)
{
    gen *g = ctx;
    pthread_mutex_lock(&g->mu);
    bool resume = g->suspended;
    g->suspended = false;
    pthread_mutex_unlock(&g->mu);
    if (resume) MHD_resume_connection(g->hr->conn);
}

static void submit_error(int rc, const gen *g, api_error *e)
{
    switch (rc) {
    case SCHED_E_QUEUE_FULL:
        api_error_set(e, 429, "rate_limit_error", NULL, "queue_full",
                      "The server is busy: its request queue is full. Retry later.");
        break;
    case SCHED_E_SHUTDOWN:
        api_error_set(e, 503, "unavailable_error", NULL, "shutting_down", "The server is shutting down.");
        break;
    case SCHED_E_TOO_LONG:
        api_error_set(e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                      "The prompt plus max_tokens exceeds the context of %d tokens.", g->sv->sm.ctx_per_slot);
        break;
    default:
        api_error_set(e, 400, "invalid_request_error", NULL, NULL, "The scheduler refused the request.");
    }
}

/* All of a request's choices are admitted, or none: places for every one are reserved first,
 * so a busy server answers 429 without starting (and then cancelling) some of them.  More
 * choices than the server can ever hold is a 400: retrying cannot help.  An embedding request
 * is one place however many inputs it has (its inputs hold a row for one step each and nothing
 * after): the last input takes it, the others ride on it (sched_params.shares_place), so the
 * queue limit counts requests as --queue-size says. */
static int submit_all(gen *g, api_error *e)
{
    api_request *rq = &g->req;
    int per_prompt = rq->n;
    sched *s = g->sv->sm.s;
    bool embed = is_embedding(g->p);
    int places = embed ? 1 : g->n_ch;
    if (places > sched_capacity(s)) {
        api_error_set(e, 400, "invalid_request_error", "n", "invalid_value",
                      "The request asks for %d choices; this server holds at most %d requests at once "
                      "(--parallel plus --queue-size).", g->n_ch, sched_capacity(s));
        return -1;
    }
    int rc = sched_reserve(s, places);
    if (rc != SCHED_OK) {
        submit_error(rc, g, e);
        return -1;
    }
    for (int i = 0; i < g->n_ch; i++) {
        gen_choice *c = &g->ch[i];
        gen_prompt *gp = &g->prompts[i / per_prompt];
        c->prompt = i / per_prompt;
        sched_params p = {
            .prompt = gp->ids,
            .n_prompt = gp->n_ids,
            .max_tokens = rq->max_tokens ? rq->max_tokens : g->sv->sm.ctx_per_slot - gp->n_ids,
            .sp = rq->sp,
            .n_stop = rq->n_stop,
            .ignore_eos = rq->ignore_eos,
            .no_speculative = !rq->speculative,
            .want_logprobs = rq->logprobs >= 0,
            .id = g->id,
            .reserved = !embed || i == g->n_ch - 1,
            .shares_place = embed && i < g->n_ch - 1,
            .grammar = rq->grammar, /* compiled once, shared by every choice */
            .embed = embed ? &g->emb : NULL,
        };
        /* n choices of one prompt must differ: each gets its own seed. */
        p.sp.seed = rq->has_seed ? rq->sp.seed + (uint64_t)(i % per_prompt) : next_random();
        for (int k = 0; k < rq->n_stop; k++) p.stop[k] = rq->stop[k];
        rc = sched_submit(s, &p, on_wake, g, &c->r);
        if (rc == SCHED_OK) continue;
        c->r = NULL;
        sched_unreserve(s, embed ? 1 : g->n_ch - i); /* the submitted ones are cancelled by gen_finish */
        submit_error(rc, g, e);
        return -1;
    }
    return 0;
}

/* Keeps a non-streamed choice's tokens (for its logprobs): the first batch is adopted as it
 * is, later ones are appended. */
static void push_tokens(gen_choice *c, sched_output *o)
{
    if (!c->tokens) {
        c->tokens = o->tokens;
        c->n_tokens = c->cap_tokens = o->n_tokens;
        o->tokens = NULL;
        o->n_tokens = 0;
        return;
    }
    int n = o->n_tokens;
    if (c->n_tokens + n > c->cap_tokens) {
        int cap = c->cap_tokens ? c->cap_tokens : 16;
        while (cap < c->n_tokens + n) cap *= 2;
        engine_result *p = realloc(c->tokens, (size_t)cap * sizeof *p);
        if (!p) return; /* logprobs then miss tokens; the text is unaffected */
        c->tokens = p;
        c->cap_tokens = cap;
    }
    memcpy(c->tokens + c->n_tokens, o->tokens, (size_t)n * sizeof *o->tokens);
    c->n_tokens += n;
}

static void record_finish(gen *g, gen_choice *c, const sched_output *o)
{
    c->prompt_tokens = o->prompt_tokens;
    c->cached_tokens = o->cached_tokens;
    c->completion_tokens = o->completion_tokens;
    if (o->finish == SCHED_FINISH_NONE) return;
    c->finish = o->finish;
    c->stop_string = o->stop_string;
    if (o->finish == SCHED_FINISH_ERROR) snprintf(c->error, sizeof c->error, "%s", o->error);
    g->n_done++;
}

static api_usage usage_of(const gen *g)
{
    api_usage u = {0};
    for (int i = 0; i < g->n_ch; i++) {
        const gen_choice *c = &g->ch[i];
        if (i % g->req.n == 0) { /* each prompt counts once */
            u.prompt_tokens += c->prompt_tokens;
            u.cached_tokens += c->cached_tokens;
        }
        u.completion_tokens += c->completion_tokens;
    }
    return u;
}

/* The first choice that failed, as an API error; false when none did. */
static bool failure_of(const gen *g, api_error *e)
{
    for (int i = 0; i < g->n_ch; i++) {
        const gen_choice *c = &g->ch[i];
        if (c->finish == SCHED_FINISH_ERROR) {
            api_error_set(e, 500, "server_error", NULL, "engine_error", "Generation failed: %s", c->error);
            return true;
        }
        if (c->finish == SCHED_FINISH_CANCELLED && g->client_gone) {
            /* nginx's 499: the reply goes nowhere, but logs and metrics must not blame us */
            api_error_set(e, 499, "invalid_request_error", NULL, "client_closed_request",
                          "The client closed the connection before the response was ready.");
            return true;
        }
        if (c->finish == SCHED_FINISH_CANCELLED) {
            api_error_set(e, 503, "unavailable_error", NULL, "shutting_down",
                          "The request was cancelled because the server is shutting down.");
            return true;
        }
    }
    return false;
}

void gen_summarize(const gen *g, gen_summary *out)
{
    api_usage u = g->ch ? usage_of(g) : (api_usage){0};
    *out = (gen_summary){.id = g->id, .prompt_tokens = u.prompt_tokens, .cached_tokens = u.cached_tokens,
                         .completion_tokens = u.completion_tokens,
                         .ttft_ms = g->t_first_ms ? g->t_first_ms - g->hr->t_start : NAN};
    /* The worst outcome of any choice; a choice still running now is being cancelled (the
     * connection closed before it finished). */
    int worst = -1;
    static const sched_finish rank[] = {SCHED_FINISH_STOP, SCHED_FINISH_LENGTH, SCHED_FINISH_CANCELLED,
                                        SCHED_FINISH_ERROR};
    for (int i = 0; i < g->n_ch; i++) {
        sched_finish f = g->ch[i].r && g->ch[i].finish == SCHED_FINISH_NONE ? SCHED_FINISH_CANCELLED : g->ch[i].finish;
        for (int k = 0; k < 4; k++)
            if (rank[k] == f && k > worst) worst = k;
    }
    out->finish = worst >= 0 ? sched_finish_name(rank[worst]) : NULL;
}

/* ---- streaming ---------------------------------------------------------------------------- */

/* The first bytes: each choice's opening (the assistant role, the echoed prompt), or the
 * protocol's own (response.created). */
static void emit_openers(gen *g)
{
    api_span echo[API_MAX_CHOICES] = {{0}};
    for (int i = 0; i < g->n_ch && i < API_MAX_CHOICES; i++) {
        gen_choice *c = &g->ch[i];
        echo[i] = (api_span){g->prompts[c->prompt].echo, g->prompts[c->prompt].echo_len};
        c->text_offset += echo[i].len;
    }
    g->p->open(&g->rep, echo, g->n_ch);
}

static void stream_close(gen *g)
{
    api_error e;
    bool failed = failure_of(g, &e);
    api_usage u = usage_of(g);
    bool truncated = false;
    for (int i = 0; i < g->n_ch; i++) truncated = truncated || g->ch[i].finish == SCHED_FINISH_LENGTH;
    api_end end = {.usage = &u, .failed = failed ? &e : NULL, .truncated = truncated};
    g->p->close(&g->rep, &end);
    g->out_done = true;
}

/* ---- chat replies through chat_parse -------------------------------------------------------- */

/* A parser per choice when the reply may hold tool calls (tools offered, the family's markup
 * known) or <think> blocks, and always for a family whose every reply is structured by its
 * markup (Harmony's channels). */
static int start_parsers(gen *g)
{
    const server_model *sm = &g->sv->sm;
    bool tools = g->req.tools_json && g->req.tool_choice != API_TOOL_NONE && sm->syntax != CHAT_SYNTAX_NONE;
    if (!tools && !sm->reasoning && !chat_syntax_structured(sm->syntax)) return 0;
    for (int i = 0; i < g->n_ch; i++) {
        /* the client gets calls to what it offered, one when it asked for no parallel calls */
        chat_parse_opts po = {.syntax = sm->syntax, .tools = tools, .reasoning = sm->reasoning,
                              .in_reasoning = sm->reasoning && g->think_in_prompt, .id_seed = next_random(),
                              .names = (const char *const *)g->req.tool_names, .n_names = g->req.n_tools,
                              .max_calls = g->req.parallel_tool_calls ? 0 : 1,
                              .stream_calls = g->req.stream};
        if (!(g->ch[i].cp = chat_parser_new(&po))) return -1;
    }
    return 0;
}

/* "tool_calls" replaces "stop" when the reply called tools (OpenAI's finish reason). */
static const char *finish_reason_of(const gen_choice *c, sched_finish f)
{
    const char *r = api_finish_reason(f);
    if (r && f == SCHED_FINISH_STOP && c->cp && chat_parser_n_calls(c->cp) > 0) return "tool_calls";
    return r;
}

/* Hands one choice's new output to the protocol: as its parser split it when the choice has
 * one (content, reasoning, the calls it completed), else the text as it came. */
static void stream_output(gen *g, int i, const sched_output *o)
{
    gen_choice *c = &g->ch[i];
    api_delta d = {.index = i, .text = o->text, .text_len = o->text_len, .text_offset = c->text_offset,
                   .tokens = o->tokens, .n_tokens = o->n_tokens, .finish_reason = finish_reason_of(c, o->finish),
                   .stop_string = o->stop_string,
                   .usage = {o->prompt_tokens, o->cached_tokens, o->completion_tokens}};
    if (c->cp) {
        const chat_delta *cd = &c->delta;
        d.text = cd->content.data;
        d.text_len = cd->content.len;
        d.reasoning = cd->reasoning.data;
        d.reasoning_len = cd->reasoning.len;
        d.calls = cd->calls;
        d.n_calls = cd->n_calls;
    }
    g->p->delta(&g->rep, &d);
    c->text_offset += d.text_len;
}

/* Keeps what one feed decided for the whole reply. */
static void keep_delta(gen_choice *c)
{
    chat_delta *d = &c->delta;
    bytebuf_append(&c->text, d->content.data ? d->content.data : "", d->content.len);
    bytebuf_append(&c->reasoning, d->reasoning.data ? d->reasoning.data : "", d->reasoning.len);
    for (int k = 0; k < d->n_calls; k++) {
        chat_delta *all = &c->calls;
        if (all->n_calls == all->cap_calls) {
            int cap = all->cap_calls ? all->cap_calls * 2 : 4;
            chat_tool_call *nc = realloc(all->calls, (size_t)cap * sizeof *nc);
            if (!nc) {
                c->text.failed = true;
                return;
            }
            all->calls = nc;
            all->cap_calls = cap;
        }
        all->calls[all->n_calls++] = d->calls[k];
    }
    d->n_calls = 0; /* the calls' strings now belong to c->calls */
}

static void parse_output(gen *g, int i, sched_output *o)
{
    gen_choice *c = &g->ch[i];
    chat_delta_clear(&c->delta);
    int rc = chat_parser_feed(c->cp, o->text ? o->text : "", o->text_len, &c->delta);
    if (rc == 0 && o->finish != SCHED_FINISH_NONE) {
        /* cut by max_tokens inside a call: a partial call, never its markup as content */
        rc = o->finish == SCHED_FINISH_LENGTH ? chat_parser_cut(c->cp, &c->delta) : chat_parser_finish(c->cp, &c->delta);
        if (chat_parser_n_dropped(c->cp))
            log_info("%s: dropped %d tool call(s) the client cannot use (a function not offered, arguments not a "
                     "JSON object, or more than parallel_tool_calls allows)", g->id, chat_parser_n_dropped(c->cp));
    }
    if (rc != 0) {
        c->text.failed = true;
        g->out.failed = g->out.failed || g->req.stream;
        return;
    }
    if (g->req.stream) {
        stream_output(g, i, o);
    } else {
        keep_delta(c);
        if (g->req.logprobs >= 0 && o->n_tokens) push_tokens(c, o);
    }
}

/* Take whatever the scheduler has for every running choice. Call with g->mu held. */
static void collect(gen *g)
{
    for (int i = 0; i < g->n_ch; i++) {
        gen_choice *c = &g->ch[i];
        sched_output o = {0};
        if (c->finish != SCHED_FINISH_NONE || !c->r || !sched_req_take(c->r, &o)) continue;
        if (!g->t_first_ms && o.completion_tokens > 0) g->t_first_ms = timing_now_ms();
        if (c->cp) {
            parse_output(g, i, &o);
        } else if (g->req.stream) {
            stream_output(g, i, &o);
        } else {
            bytebuf_append(&c->text, o.text ? o.text : "", o.text_len);
            if (g->req.logprobs >= 0 && o.n_tokens) push_tokens(c, &o);
        }
        if (o.embedding) { /* the choice keeps the answer */
            c->emb = o.embedding;
            c->n_emb = o.n_embedding;
            o.embedding = NULL;
        }
        record_finish(g, c, &o);
        sched_output_clear(&o);
    }
    if (g->req.stream && g->n_done == g->n_ch && !g->out_done) stream_close(g);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gen *g = cls;
    pthread_mutex_lock(&g->mu);
    if (g->out.len == 0 && !g->out_done) collect(g);
    if (!bytebuf_ok(&g->out)) {
        pthread_mutex_unlock(&g->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (g->out.len == 0) {
        ssize_t r = 0;
        if (g->out_done) {
            r = MHD_CONTENT_READER_END_OF_STREAM;
        } else { /* nothing yet: sleep until the scheduler wakes us (no polling) */
            g->suspended = true;
            MHD_suspend_connection(g->hr->conn);
        }
        pthread_mutex_unlock(&g->mu);
        return r;
    }
    size_t n = g->out.len < max ? g->out.len : max;
    memcpy(buf, g->out.data, n);
    bytebuf_consume(&g->out, n);
    pthread_mutex_unlock(&g->mu);
    return (ssize_t)n;
}

static enum MHD_Result start_stream(gen *g)
{
    emit_openers(g);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, g, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (g->hr->ignored_tools) MHD_add_response_header(resp, HTTP_HEADER_IGNORED_TOOLS, g->hr->ignored_tools);
    g->hr->status = 200;
    enum MHD_Result r = MHD_queue_response(g->hr->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return r;
}

/* ---- whole responses ---------------------------------------------------------------------- */

/* A refused or failed request, in the protocol's error shape. */
static enum MHD_Result reply_error(gen *g, const api_error *e)
{
    return http_reply_error_body(g->hr, e, g->p->error(e));
}

static enum MHD_Result reply_whole(gen *g)
{
    api_error e;
    if (failure_of(g, &e)) return reply_error(g, &e);
    /* n_ch >= 1 (validated n); the bound also tells the optimiser the size is sane. */
    api_choice *ac = g->n_ch > 0 ? calloc((size_t)g->n_ch, sizeof *ac) : NULL;
    if (!ac) return http_reply_json(g->hr, 500, NULL);
    for (int i = 0; i < g->n_ch; i++) {
        gen_choice *c = &g->ch[i];
        ac[i] = (api_choice){
            .index = i,
            .text = c->text.data ? c->text.data : "",
            .text_len = c->text.len,
            .tokens = c->tokens,
            .n_tokens = c->n_tokens,
            .logprobs = g->req.logprobs >= 0,
            .text_offset = g->prompts[c->prompt].echo_len,
            .finish_reason = finish_reason_of(c, c->finish),
            .stop_string = c->stop_string,
            /* what the choice's parser split out (none without a parser) */
            .reasoning = c->reasoning.data,
            .reasoning_len = c->reasoning.len,
            .calls = c->calls.calls,
            .n_calls = c->calls.n_calls,
            .content_null = c->text.len == 0 && c->calls.n_calls > 0,
            .embedding = c->emb,
            .n_embedding = c->n_emb,
        };
        if (is_embedding(g->p) && !c->emb) { /* a finish without its answer: memory ran out */
            free(ac);
            return http_reply_json(g->hr, 500, NULL);
        }
    }
    api_usage u = usage_of(g);
    char *json = g->p->whole(&g->rep, ac, g->n_ch, &u);
    free(ac);
    return http_reply_json(g->hr, 200, json);
}

static int conn_fd(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The client hung up: cancel what still runs, queued, prefilling or generating.  The
 * cancelled finishes wake the connection once more; its reply then goes nowhere.  Call with
 * g->mu held. */
static void client_left(gen *g)
{
    if (g->client_gone || g->n_done == g->n_ch) return;
    log_info("%s: client went away; cancelling", g->id);
    g->client_gone = true;
    metrics_count_client_gone(g->sv->metrics);
    for (int i = 0; i < g->n_ch; i++)
        if (g->ch[i].r && g->ch[i].finish == SCHED_FINISH_NONE) sched_req_cancel(g->ch[i].r);
}

/* The peer watch's notice (its thread): the connection is suspended, or about to be, and MHD
 * would not see the close until it next writes. */
static void on_peer_gone(void *ctx)
{
    gen *g = ctx;
    pthread_mutex_lock(&g->mu);
    client_left(g);
    pthread_mutex_unlock(&g->mu);
}

static enum MHD_Result wait_or_reply(gen *g)
{
    pthread_mutex_lock(&g->mu);
    collect(g);
    bool done = g->n_done == g->n_ch;
    /* the watch's notice, checked again on each wake in case the socket could not be watched */
    int fd = conn_fd(g->hr->conn);
    if (!done && fd >= 0 && peer_watch_closed(fd)) client_left(g);
    if (!done) {
        g->suspended = true;
        MHD_suspend_connection(g->hr->conn);
    }
    pthread_mutex_unlock(&g->mu);
    return done ? reply_whole(g) : MHD_YES;
}

/* ---- life cycle --------------------------------------------------------------------------- */

static gen *gen_new(http_req *hr, const api_protocol *p)
{
    gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->hr = hr;
    g->sv = hr->sv;
    g->p = p;
    pthread_mutex_init(&g->mu, NULL);
    snprintf(g->id, sizeof g->id, "%s%016llx%08llx",
             p->id_prefix,
             (unsigned long long)next_random(), (unsigned long long)(next_random() & 0xffffffffu));
    server *sv = g->sv;
    pthread_mutex_lock(&sv->mu);
    g->next = sv->gens;
    if (sv->gens) sv->gens->prev = g;
    sv->gens = g;
    sv->n_gens++;
    pthread_mutex_unlock(&sv->mu);
    hr->g = g;
    return g;
}

/* ---- embeddings and rerank ---------------------------------------------------------------- */

static bool is_embedding(const api_protocol *p) { return p->kind == API_EMBEDDINGS || p->kind == API_RERANK; }

/* An embedding model's server answers embeddings (or rerank) only; a text model's answers
 * completions, and embeddings or rerank too when started with --pooling.  Each refusal says
 * which. */
static int check_model_serves(const gen *g, api_error *e)
{
    const int pooling = g->sv->sm.pooling;
    const api_kind k = g->p->kind;
    if (k == API_EMBEDDINGS && (pooling < 0 || pooling == ENGINE_POOL_RANK)) {
        api_error_set(e, 400, "invalid_request_error", "model", "model_not_supported",
                      "This server's model does not serve embeddings: it %s. Start inferd on an embedding model, "
                      "or with --pooling mean, cls or last.",
                      pooling < 0 ? "generates text" : "is a reranker (/v1/rerank)");
        return -1;
    }
    if (k == API_RERANK && pooling != ENGINE_POOL_RANK) {
        api_error_set(e, 400, "invalid_request_error", "model", "model_not_supported",
                      "This server's model does not rerank: it %s. Start inferd with --pooling rank on a reranker "
                      "such as Qwen3-Reranker.",
                      pooling < 0 ? "generates text" : "serves embeddings (/v1/embeddings)");
        return -1;
    }
    if (!is_embedding(g->p) && !g->sv->sm.text) {
        api_error_set(e, 400, "invalid_request_error", "model", "model_not_supported",
                      "This server's model %s (pooling %s): it answers %s, not %s.",
                      pooling == ENGINE_POOL_RANK ? "is a reranker" : "is an embedding model",
                      engine_pooling_name((engine_pooling)pooling),
                      pooling == ENGINE_POOL_RANK ? "/v1/rerank" : "/v1/embeddings", g->p->name);
        return -1;
    }
    return 0;
}

/* Each input runs whole in one step: at most --batch-tokens (an encoder: its positions); the
 * dimensions asked for are at most the model's; and how every input is pooled. */
static int check_embedding(gen *g, api_error *e)
{
    const server_model *sm = &g->sv->sm;
    const char *param = g->p->prompt_param;
    for (int i = 0; i < g->n_prompts; i++) {
        if (g->prompts[i].n_ids > sm->max_batch_tokens) {
            api_error_set(e, 400, "invalid_request_error", param, "context_length_exceeded",
                          "Invalid '%s': item %d has %d tokens, more than the %d one input may have here (each "
                          "runs whole in one batch: --batch-tokens).", param, i, g->prompts[i].n_ids,
                          sm->max_batch_tokens);
            return -1;
        }
    }
    const int d = g->req.dimensions;
    if (d && sm->pooling == ENGINE_POOL_NONE) {
        api_error_set(e, 400, "invalid_request_error", "dimensions", "invalid_value",
                      "Invalid 'dimensions': this server returns every token's embedding (pooling none), which is "
                      "not truncated.");
        return -1;
    }
    if (d > sm->card.n_embd) {
        api_error_set(e, 400, "invalid_request_error", "dimensions", "invalid_value",
                      "Invalid 'dimensions': %d is more than this model's %d.", d, sm->card.n_embd);
        return -1;
    }
    g->req.dims_centred = sm->dims_centred;
    g->emb = (engine_embed){.pooling = (engine_pooling)sm->pooling, .normalize = sm->pooling != ENGINE_POOL_NONE,
                            .rank_ids = {sm->rank_ids[0], sm->rank_ids[1]}};
    return 0;
}

static int out_of_memory(api_error *e)
{
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

/* Hosted tools (web_search, ...) the request offered: a 400 under --hosted-tools refuse, else
 * set aside with a log line and a header naming them, so that an agent whose defaults include
 * one (the Codex CLI) still runs, and its operator can see what its model was not offered. */
static int hosted_tools(gen *g, api_error *e)
{
    if (g->sv->cfg.refuse_hosted_tools) {
        api_error_set(e, 400, "invalid_request_error", "tools", "unsupported_parameter",
                      "Hosted tools are not supported by this server: %s (it runs function tools only).",
                      g->req.ignored_tools);
        return -1;
    }
    /* The types are the client's text, of any length and any bytes: as a header value they
     * are kept to printable ASCII and a bound (MHD drops a value with CR or LF, and one longer
     * than its connection's memory pool cost the whole reply: the connection was closed
     * unanswered). */
    char *h = g->ignored_tools;
    const size_t cap = sizeof g->ignored_tools, n = http_guard_printable(h, cap, g->req.ignored_tools);
    if (g->req.ignored_tools[n]) memcpy(h + cap - 4, "...", 4); /* cut */
    log_info("%s: ignoring hosted tools this server cannot run: %s", g->id, h);
    g->hr->ignored_tools = h;
    return 0;
}

/* Everything before the answer: the body parsed, the prompt built, the choices submitted.
 * Runs on a prep thread: no MHD call here. */
static int prepare(gen *g, api_error *e)
{
    const http_req *hr = g->hr;
    const api_protocol *p = g->p;
    const char *body = hr->body.data ? hr->body.data : "";
    if (check_model_serves(g, e) != 0) return -1;
    if (p->parse(body, hr->body.len, tokenizer_n_vocab(g->sv->sm.tok), &g->req, &g->rep.state, e) != 0) return -1;
    bool chat = p->messages;
    if (g->req.ignored_tools && hosted_tools(g, e) != 0) return -1;
    int rc = chat ? tool_force_apply(&g->req, g->sv->sm.syntax, e) : 0;
    if (rc == 0) rc = chat ? build_chat_prompt(g, e) : build_completion_prompts(g, e);
    if (rc == 0) rc = check_context(g, e);
    if (rc == 0 && is_embedding(p)) rc = check_embedding(g, e);
    if (rc != 0) {
        if (p->rename_error) p->rename_error(e);
        return -1;
    }
    g->rep.rq = &g->req;
    g->rep.meta = (api_meta){.kind = p->kind, .id = g->id, .model = g->sv->sm.alias, .fingerprint = g->sv->sm.fingerprint,
                             .created = (long long)time(NULL),
                             .usage_null = g->req.stream && g->req.include_usage};
    /* --always-include-usage: as if every streamed request had asked for it (vLLM's
     * --enable-force-include-usage), for clients that never send stream_options */
    if (g->sv->cfg.always_include_usage && g->req.stream) g->req.include_usage = g->rep.meta.usage_null = true;
    g->rep.vocab = vocab_of(g);
    g->rep.out = &g->out;
    g->rep.embd_width = g->sv->sm.pooling == ENGINE_POOL_NONE ? g->sv->sm.card.n_embd : 0;
    g->n_ch = g->n_prompts * g->req.n;
    if (!(g->ch = calloc((size_t)g->n_ch, sizeof *g->ch))) return out_of_memory(e);
    for (int i = 0; i < g->n_ch; i++) { /* echo text leads each choice's text */
        gen_prompt *gp = &g->prompts[i / g->req.n];
        if (!g->req.stream && gp->echo) bytebuf_append(&g->ch[i].text, gp->echo, gp->echo_len);
    }
    if (chat && start_parsers(g) != 0) return out_of_memory(e);
    if (submit_all(g, e) != 0) return -1;
    log_debug("%s: %d choice(s), prompt %d tokens, stream=%d", g->id, g->n_ch, g->prompts[0].n_ids,
              g->req.stream);
    return 0;
}

void gen_prepare(http_req *hr, const api_protocol *p)
{
    gen *g = gen_new(hr, p);
    if (g && prepare(g, &g->fail) != 0) g->failed = true;
}

enum MHD_Result gen_answer(http_req *hr)
{
    gen *g = hr->g;
    if (!g) return http_reply_json(hr, 500, NULL); /* gen_new ran out of memory */
    if (g->failed) return reply_error(g, &g->fail);
    if (g->answering) return wait_or_reply(g); /* woken up by the scheduler */
    g->answering = true;
    /* From here the connection waits suspended while the requests queue and prefill: a client
     * that leaves is noticed by the watch, not by the first token's wake-up. */
    int fd = conn_fd(hr->conn);
    if (fd >= 0) g->watch = peer_watch_add(g->sv->watch, fd, on_peer_gone, g);
    return g->req.stream ? start_stream(g) : wait_or_reply(g);
}

void gen_finish(gen *g)
{
    server *sv = g->sv;
    peer_watch_remove(sv->watch, g->watch); /* no notice can run for g after this */
    pthread_mutex_lock(&sv->mu); /* unlink first: gen_resume_all must not see a dying gen */
    if (g->prev) g->prev->next = g->next;
    else sv->gens = g->next;
    if (g->next) g->next->prev = g->prev;
    pthread_mutex_unlock(&sv->mu);
    for (int i = 0; i < g->n_ch; i++) {
        gen_choice *c = &g->ch[i];
        if (c->r) {
            sched_req_cancel(c->r); /* no-op when it already finished */
            sched_req_release(c->r);
        }
        bytebuf_free(&c->text);
        free(c->tokens);
        chat_parser_free(c->cp);
        chat_delta_free(&c->delta);
        chat_delta_free(&c->calls);
        bytebuf_free(&c->reasoning);
        free(c->emb);
    }
    free(g->ch);
    for (int i = 0; i < g->n_prompts; i++) {
        free(g->prompts[i].ids);
        free(g->prompts[i].echo);
    }
    free(g->prompts);
    api_request_free(&g->req);
    if (g->p->free_state) g->p->free_state(g->rep.state);
    bytebuf_free(&g->out);
    pthread_mutex_destroy(&g->mu);
    pthread_mutex_lock(&sv->mu);
    if (--sv->n_gens == 0) pthread_cond_broadcast(&sv->idle);
    pthread_mutex_unlock(&sv->mu);
    g->hr->g = NULL;
    free(g);
}

void gen_resume_all(server *sv)
{
    pthread_mutex_lock(&sv->mu);
    for (gen *g = sv->gens; g; g = g->next) on_wake(g);
    pthread_mutex_unlock(&sv->mu);
}
