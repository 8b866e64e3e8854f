/* metrics.c - see metrics.h.  Names follow Prometheus conventions: *_total counters, base
 * units (seconds), cumulative histogram buckets with le labels. */
#include "metrics.h"

#include <stdatomic.h>
#include <stdlib.h>

#define STATUS_MIN 100
#define STATUS_MAX 599

struct metrics {
    _Atomic uint64_t by_status[STATUS_MAX - STATUS_MIN + 1];
    _Atomic uint64_t client_gone;
};

metrics *metrics_new(void) { return calloc(1, sizeof(metrics)); }
void metrics_free(metrics *m) { free(m); }

void metrics_count_status(metrics *m, int status)
{
    if (status >= STATUS_MIN && status <= STATUS_MAX)
        atomic_fetch_add_explicit(&m->by_status[status - STATUS_MIN], 1, memory_order_relaxed);
}

uint64_t metrics_status_count(const metrics *m, int status)
{
    if (status < STATUS_MIN || status > STATUS_MAX) return 0;
    return atomic_load_explicit(&m->by_status[status - STATUS_MIN], memory_order_relaxed);
}

void metrics_count_client_gone(metrics *m) { atomic_fetch_add_explicit(&m->client_gone, 1, memory_order_relaxed); }

static void gauge(bytebuf *o, const char *name, const char *help, const char *type, double v)
{
    bytebuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void histogram(bytebuf *o, const char *name, const char *help, const sched_hist *h)
{
    bytebuf_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SCHED_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        bytebuf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, sched_hist_bounds_ms[i] / 1000.0,
                    (unsigned long long)cum);
    }
    cum += h->counts[SCHED_HIST_BUCKETS];
    bytebuf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                (unsigned long long)cum, name, h->sum_ms / 1000.0, name, (unsigned long long)h->n);
}

/* A counter with one line per drafter (sched_spec, off excluded). */
static void by_proposer(bytebuf *o, const char *name, const char *help, const uint64_t *counts)
{
    bytebuf_printf(o, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (int i = SCHED_SPEC_OFF + 1; i < SCHED_SPEC_COUNT; i++)
        bytebuf_printf(o, "%s{proposer=\"%s\"} %llu\n", name, sched_spec_name((sched_spec)i),
                       (unsigned long long)counts[i]);
}

void metrics_render(const metrics *m, const metrics_view *v, bytebuf *o)
{
    bytebuf_puts(o, "# HELP inferd_http_requests_total HTTP requests answered, by status code.\n"
                 "# TYPE inferd_http_requests_total counter\n");
    for (int s = STATUS_MIN; s <= STATUS_MAX; s++) {
        uint64_t n = metrics_status_count(m, s);
        if (n) bytebuf_printf(o, "inferd_http_requests_total{code=\"%d\"} %llu\n", s, (unsigned long long)n);
    }
    gauge(o, "inferd_client_gone_total",
          "Generations cancelled because their client closed the connection before they finished.", "counter",
          (double)atomic_load_explicit(&m->client_gone, memory_order_relaxed));
    gauge(o, "inferd_ready", "1 when the model is loaded and requests are served.", "gauge", v->ready);
    const sched_stats *st = v->st;
    if (!st) return;
    gauge(o, "inferd_prompt_tokens_total", "Prompt tokens prefilled.", "counter",
          (double)st->prompt_tokens_total);
    gauge(o, "inferd_generated_tokens_total", "Tokens generated.", "counter",
          (double)st->generated_tokens_total);
    gauge(o, "inferd_scheduler_steps_total", "Engine steps run.", "counter", (double)st->steps);
    gauge(o, "inferd_queue_depth", "Requests waiting for a slot.", "gauge", st->queue_depth);
    gauge(o, "inferd_slots_total", "Most sequences running at once (--parallel).", "gauge", st->n_slots);
    gauge(o, "inferd_slots_running", "Sequences running now.", "gauge", st->slots_used);
    gauge(o, "inferd_kv_tokens_used", "Positions held by running sequences.", "gauge", (double)st->kv_tokens_used);
    gauge(o, "inferd_kv_tokens_capacity", "Tokens the KV block pool can hold.", "gauge",
          (double)st->kv_blocks_total * ENGINE_KV_BLOCK);
    gauge(o, "inferd_kv_blocks_total", "Blocks in the KV pool.", "gauge", st->kv_blocks_total);
    gauge(o, "inferd_kv_blocks_used", "KV blocks referenced by running sequences.", "gauge", st->kv_blocks_used);
    gauge(o, "inferd_kv_blocks_cached", "KV blocks unreferenced but kept by the prefix cache (evictable).", "gauge",
          st->kv_blocks_cached);
    gauge(o, "inferd_kv_blocks_free", "KV blocks holding nothing.", "gauge", st->kv_blocks_free);
    gauge(o, "inferd_kv_swa_blocks_total", "Blocks in the sliding-window layers' KV pool (0: the model has none).",
          "gauge", st->kv_swa_blocks_total);
    gauge(o, "inferd_kv_swa_blocks_used", "Sliding KV blocks held by running sequences (their windows).", "gauge",
          st->kv_swa_blocks_used);
    gauge(o, "inferd_kv_swa_blocks_cached", "Sliding KV blocks let go but kept by the prefix cache (evictable).",
          "gauge", st->kv_swa_blocks_cached);
    gauge(o, "inferd_kv_swa_blocks_free", "Sliding KV blocks holding nothing.", "gauge", st->kv_swa_blocks_free);
    gauge(o, "inferd_state_slots_total", "Recurrent-state slots of a hybrid model (0 for others).", "gauge",
          st->state_slots_total);
    gauge(o, "inferd_state_slots_running", "Recurrent-state slots held by running sequences.", "gauge",
          st->state_slots_running);
    gauge(o, "inferd_state_snapshots", "Recurrent-state slots holding a prefix snapshot (evictable).", "gauge",
          st->state_snapshots);
    gauge(o, "inferd_prefix_cache_lookup_tokens_total", "Prompt tokens looked up in the prefix cache.", "counter",
          (double)st->prefix_lookup_tokens);
    gauge(o, "inferd_prefix_cache_hit_tokens_total", "Prompt tokens read from the prefix cache instead of computed.",
          "counter", (double)st->prefix_hit_tokens);
    gauge(o, "inferd_prefix_cache_hit_ratio", "Hit tokens / lookup tokens since start.", "gauge",
          st->prefix_lookup_tokens ? (double)st->prefix_hit_tokens / (double)st->prefix_lookup_tokens : 0.0);
    gauge(o, "inferd_preemptions_total", "Running sequences sent back to wait (KV blocks ran out).", "counter",
          (double)st->preemptions);
    gauge(o, "inferd_spec_draft_tokens_total", "Tokens drafted and verified by speculative decoding.", "counter",
          (double)st->spec_draft_tokens);
    gauge(o, "inferd_spec_accepted_tokens_total", "Drafted tokens the target model accepted.", "counter",
          (double)st->spec_accepted_tokens);
    gauge(o, "inferd_spec_verify_steps_total", "Decode steps of a sequence that verified drafted tokens.", "counter",
          (double)st->spec_verifies);
    by_proposer(o, "inferd_spec_proposer_draft_tokens_total", "Tokens drafted and verified, by proposer (--speculative).",
                st->spec_proposer_draft);
    by_proposer(o, "inferd_spec_proposer_accepted_tokens_total", "Drafted tokens accepted, by proposer (--speculative).",
                st->spec_proposer_accepted);
    static const char *const finish_names[5] = {"none", "stop", "length", "cancelled", "error"};
    bytebuf_puts(o, "# HELP inferd_requests_finished_total Choices finished, by reason.\n"
                 "# TYPE inferd_requests_finished_total counter\n");
    for (int i = 1; i < 5; i++)
        bytebuf_printf(o, "inferd_requests_finished_total{reason=\"%s\"} %llu\n", finish_names[i],
                    (unsigned long long)st->requests_finished[i]);
    histogram(o, "inferd_time_to_first_token_seconds", "Submit to first token.", &st->ttft);
    histogram(o, "inferd_inter_token_latency_seconds", "Time between consecutive tokens of a request.",
              &st->itl);
}
