#!/usr/bin/env python3
"""bench_kv.py: the paged-KV / prefix-cache targets against a running OpenAI-compatible server.

Prompts are token-id arrays sent to /v1/completions (inferd and llama-server accept them), so
lengths are exact.  Every scenario streams and measures TTFT (request sent -> first content
chunk) and wall time; standard library only.

  multiturn  a chat of --history tokens, then the next turn adds --turn tokens: TTFT of the
             cold first request vs the next turn (target: next <= 10 % of cold)
  shared     --requests requests of one --system-tokens prefix + --distinct distinct tokens, all
             at once: wall time, request throughput, prompt tokens computed (inferd's /metrics)
             and cached_tokens (run it against --no-prefix-cache too: target >= 3x)
  capacity   --requests requests with prompt lengths uniform in [--min-len, --max-len], all at
             once: the most sequences running at once (inferd_slots_running, sampled) vs what
             one slot per request of --ctx tokens would allow in the same KV memory
             (inferd_kv_tokens_capacity / ctx), and the failures (target: 3x, none)

  python3 scripts/bench_kv.py --base-url http://127.0.0.1:8080 multiturn --history 8192 --turn 50
"""
import argparse
import http.client
import json
import random
import re
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor


def conn(base):
    u = urllib.parse.urlparse(base)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=3600)


def metrics(base):
    """inferd's /metrics as {name: value}; {} for servers without it."""
    try:
        c = conn(base)
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) ([0-9.e+-]+)$", text, re.M)}
    except OSError:
        return {}


def complete(base, prompt, max_tokens):
    """One streamed completion: {ttft, e2e, status, cached, text} (cached: None when not reported)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    out = {"ttft": None, "status": 0, "cached": None, "text": ""}
    c = conn(base)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    out["status"] = r.status
    if r.status != 200:
        out["error"] = r.read().decode(errors="replace")[:200]
        out["e2e"] = time.perf_counter() - t0
        return out
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices") or []:
            # The first token's chunk, text or not: llama-server streams empty text for
            # tokens of the synthetic models' vocabularies.
            if "text" in ch and out["ttft"] is None:
                out["ttft"] = time.perf_counter() - t0
            out["text"] += ch.get("text") or ""
        u = ev.get("usage")
        if u:
            out["cached"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    out["e2e"] = time.perf_counter() - t0
    return out


def tokens(rng, n, vocab):
    return [rng.randrange(100, vocab) for _ in range(n)]


def multiturn(a):
    rng = random.Random(f"{a.seed}-multiturn")  # scenarios share no prefix
    history = tokens(rng, a.history, a.vocab)
    complete(a.base_url, tokens(rng, 64, a.vocab), 2)  # warm the server
    cold = complete(a.base_url, history, a.output_tokens)
    nxt = complete(a.base_url, history + tokens(rng, a.turn, a.vocab), a.output_tokens)
    ratio = nxt["ttft"] / cold["ttft"]
    print(f"multiturn: history {a.history} tokens, turn +{a.turn}: TTFT cold {cold['ttft'] * 1000:.1f} ms, "
          f"next turn {nxt['ttft'] * 1000:.1f} ms = {ratio * 100:.1f} % of cold (target <= 10 %); "
          f"cached_tokens {nxt['cached']}")
    return {"cold_ttft_s": cold["ttft"], "next_ttft_s": nxt["ttft"], "ratio": ratio, "cached": nxt["cached"]}


def run_all(a, prompts):
    before = metrics(a.base_url)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts)) as ex:
        res = list(ex.map(lambda p: complete(a.base_url, p, a.output_tokens), prompts))
    wall = time.perf_counter() - t0
    after = metrics(a.base_url)
    return res, wall, before, after


def shared(a):
    rng = random.Random(f"{a.seed}-shared")  # scenarios share no prefix
    system = tokens(rng, a.system_tokens, a.vocab)
    prompts = [system + tokens(rng, a.distinct, a.vocab) for _ in range(a.requests)]
    res, wall, before, after = run_all(a, prompts)
    ok = [r for r in res if r["status"] == 200]
    computed = after.get("inferd_prompt_tokens_total", 0) - before.get("inferd_prompt_tokens_total", 0)
    cached = sum(r["cached"] or 0 for r in ok)
    print(f"shared: {a.requests} x ({a.system_tokens} shared + {a.distinct}) tokens, {len(ok)} ok in {wall:.2f} s = "
          f"{len(ok) / wall:.2f} req/s; prompt tokens computed {computed:.0f} (target <= "
          f"{a.system_tokens + a.requests * 128}), cached {cached}; TTFT median "
          f"{statistics.median(r['ttft'] for r in ok) * 1000:.0f} ms")
    return {"wall_s": wall, "req_per_s": len(ok) / wall, "computed": computed, "cached": cached,
            "failed": len(res) - len(ok)}


def capacity(a):
    rng = random.Random(f"{a.seed}-capacity")  # scenarios share no prefix
    prompts = [tokens(rng, rng.randint(a.min_len, a.max_len), a.vocab) for _ in range(a.requests)]
    peak = [0.0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], metrics(a.base_url).get("inferd_slots_running", 0))
            time.sleep(0.05)

    th = threading.Thread(target=sample)
    th.start()
    try:
        res, wall, before, after = run_all(a, prompts)
    finally:
        done.set()
        th.join()
    failed = [r for r in res if r["status"] != 200 or r["ttft"] is None]
    kv_tokens = after.get("inferd_kv_tokens_capacity", 0)
    per_slot = kv_tokens / a.ctx if a.ctx else 0
    print(f"capacity: {a.requests} requests of {a.min_len}..{a.max_len} tokens in {wall:.2f} s; peak running "
          f"{peak[0]:.0f} vs {per_slot:.1f} slots of {a.ctx} in the same {kv_tokens:.0f} KV tokens "
          f"({peak[0] / per_slot if per_slot else 0:.1f}x, target >= 3x); failed {len(failed)}; preemptions "
          f"{after.get('inferd_preemptions_total', 0) - before.get('inferd_preemptions_total', 0):.0f}")
    return {"peak_running": peak[0], "per_slot_equivalent": per_slot, "failed": len(failed)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080", help="server root (not /v1)")
    p.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below this")
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    sub = p.add_subparsers(dest="scenario", required=True)
    m = sub.add_parser("multiturn")
    m.add_argument("--history", type=int, default=8192)
    m.add_argument("--turn", type=int, default=50)
    s = sub.add_parser("shared")
    s.add_argument("--requests", type=int, default=64)
    s.add_argument("--system-tokens", type=int, default=2000)
    s.add_argument("--distinct", type=int, default=100)
    c = sub.add_parser("capacity")
    c.add_argument("--requests", type=int, default=256)
    c.add_argument("--min-len", type=int, default=128)
    c.add_argument("--max-len", type=int, default=8192)
    c.add_argument("--ctx", type=int, default=8192 + 16, help="the per-slot context today's design would need")
    a = p.parse_args(argv)
    out = {"multiturn": multiturn, "shared": shared, "capacity": capacity}[a.scenario](a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    return 1 if out.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
