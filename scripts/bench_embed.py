#!/usr/bin/env python3
"""bench_embed.py: embedding throughput of an OpenAI-compatible server, and what a burst of
embeddings does to a chat stream running beside it (issue 29's speed targets).

  python3 scripts/bench_embed.py --base-url http://127.0.0.1:8080/v1 --vocab 151000 \\
      --inputs 512 --tokens 128 --concurrency 32 --chat-tokens 128 --json OUT.json

1. Baseline TPOT: one streamed /v1/completions (a token prompt of --chat-prompt ids, exactly
   --chat-tokens generated with ignore_eos) alone, --chat-reps times; its median TPOT.
2. The burst: --inputs distinct inputs of exactly --tokens random token ids, --batch per
   /v1/embeddings request, at most --concurrency requests in flight (closed loop), while (with
   --chat-tokens > 0) chat streams like the baseline's run back to back beside it; reports
   embeddings/s (inputs over the burst's wall time), request latency (mean/p50/p99), and the
   TPOT of the chats that ran entirely inside the burst against the baseline.
Token-id inputs make the count exact on any server (inferd, llama-server, vLLM take them).
Python 3.8+ standard library only; nothing is retried; exit status 1 when a request failed.

TPOT = (end of the stream - first content chunk) / (completion_tokens - 1), as in vLLM.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor


def conn(base):
    u = urllib.parse.urlparse(base)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600), u.path.rstrip("/")


def post_json(base, path, body, key):
    c, prefix = conn(base)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    try:
        c.request("POST", prefix + path, json.dumps(body), h)
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}: {data[:200]!r}")
        return json.loads(data)
    finally:
        c.close()


def chat_tpot(base, key, prompt, n_tokens):
    """One streamed completion; its TPOT in ms and its (start, end) times."""
    c, prefix = conn(base)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    body = {"prompt": prompt, "max_tokens": n_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    done = 0
    try:
        c.request("POST", prefix + "/completions", json.dumps(body), h)
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"chat: HTTP {r.status}: {r.read()[:200]!r}")
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                done = ev["usage"]["completion_tokens"]
            if ev.get("choices") and ev["choices"][0].get("text") and first is None:
                first = time.perf_counter()
    finally:
        c.close()
    end = time.perf_counter()
    if first is None or done < 2:
        raise RuntimeError(f"chat: {done} tokens streamed")
    return (end - first) * 1000.0 / (done - 1), t0, end


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="ends in /v1")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--vocab", type=int, required=True, help="token ids are drawn from [100, vocab)")
    ap.add_argument("--inputs", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per input")
    ap.add_argument("--batch", type=int, default=1, help="inputs per /v1/embeddings request")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--chat-tokens", type=int, default=128, help="0: no chat stream")
    ap.add_argument("--chat-prompt", type=int, default=128)
    ap.add_argument("--chat-reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=4, help="embedding requests before measuring")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the results as one JSON object here")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ids = lambda n: [rng.randrange(100, a.vocab) for _ in range(n)]
    chat_prompt = ids(a.chat_prompt)
    out = {"inputs": a.inputs, "tokens": a.tokens, "batch": a.batch, "concurrency": a.concurrency}

    for _ in range(a.warmup):
        post_json(a.base_url, "/embeddings", {"input": [ids(a.tokens) for _ in range(a.batch)]}, a.api_key)
    if a.chat_tokens:
        base = [chat_tpot(a.base_url, a.api_key, chat_prompt, a.chat_tokens)[0] for _ in range(a.chat_reps)]
        out["tpot_alone_ms"] = statistics.median(base)
        print(f"chat alone: TPOT {out['tpot_alone_ms']:.2f} ms (median of {a.chat_reps})")

    requests = []
    left = a.inputs
    while left > 0:
        n = min(a.batch, left)
        requests.append([ids(a.tokens) for _ in range(n)])
        left -= n
    lat, failures = [], []
    stop = threading.Event()
    chats = []

    def chat_loop():
        while not stop.is_set():
            try:
                chats.append(chat_tpot(a.base_url, a.api_key, chat_prompt, a.chat_tokens))
            except Exception as e:  # noqa: BLE001 (reported, not retried)
                failures.append(f"chat: {e}")
                return

    def one(inputs):
        t = time.perf_counter()
        try:
            r = post_json(a.base_url, "/embeddings", {"input": inputs}, a.api_key)
            if len(r["data"]) != len(inputs):
                raise RuntimeError(f"{len(r['data'])} embeddings for {len(inputs)} inputs")
        except Exception as e:  # noqa: BLE001
            failures.append(str(e))
            return
        lat.append((time.perf_counter() - t) * 1000.0)

    chatter = threading.Thread(target=chat_loop) if a.chat_tokens else None
    if chatter:
        chatter.start()
        time.sleep(0.2)  # the stream is running before the burst
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.concurrency) as pool:
        list(pool.map(one, requests))
    t1 = time.perf_counter()
    stop.set()
    if chatter:
        chatter.join()
    wall = t1 - t0
    out.update({"wall_s": wall, "embeddings_per_s": a.inputs / wall, "tokens_per_s": a.inputs * a.tokens / wall,
                "latency_ms": {"mean": statistics.mean(lat) if lat else None, "p50": pct(lat, 50), "p99": pct(lat, 99)},
                "failed": len(failures)})
    print(f"embeddings: {a.inputs} inputs x {a.tokens} tokens, {a.batch} per request, concurrency {a.concurrency}: "
          f"{out['embeddings_per_s']:.1f} embeddings/s ({out['tokens_per_s']:.0f} tok/s) in {wall:.2f} s; "
          f"latency mean {out['latency_ms']['mean'] or 0:.1f} p50 {out['latency_ms']['p50']:.1f} "
          f"p99 {out['latency_ms']['p99']:.1f} ms")
    if a.chat_tokens:
        inside = [tp for tp, s, e in chats if s >= t0 - 0.25 and e <= t1 + 0.25] or [tp for tp, _, _ in chats]
        if inside:
            out["tpot_during_ms"] = statistics.median(inside)
            out["tpot_ratio"] = out["tpot_during_ms"] / out["tpot_alone_ms"]
            print(f"chat during the burst: TPOT {out['tpot_during_ms']:.2f} ms (median of {len(inside)}), "
                  f"ratio {out['tpot_ratio']:.2f} (target <= 1.20)")
    for f in failures[:5]:
        print(f"FAILED: {f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
