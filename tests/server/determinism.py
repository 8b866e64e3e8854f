#!/usr/bin/env python3
"""Deterministic serving (issue 32): with --deterministic, the same request gives bit-identical
tokens and logprobs whatever else the server is doing.  Starts the real inferd on 127.0.0.1
(stopped by PID; helpers from http_integration.py) and runs the same N requests (N prompts,
each greedy and seeded at temperature > 0) three times under different loads:

  alone     one request at a time on server A (prefix cache on: each prompt's blocks cold the
            first time; prompts share a 64-token prefix, so most start from a warm prefix)
  together  all 2N at once on server A: batches of up to -np rows, whole prompts from the cache
            (a prompt of whole blocks recomputes only its last token)
  mixed     server B (--no-prefix-cache, -b 16: every prompt prefilled in chunks of 16 beside the
            others' decode rows, fewer slots than requests so they queue, a KV pool small enough
            that running sequences are preempted and recomputed), all 2N at once, staggered,
            with long noise requests in between

and asserts every request's choice (text, tokens, token_logprobs, top_logprobs) is the same in
all three; that /v1/models and every response carry the "_det" system_fingerprint; and the
documented rule for n > 1 (choice i of a request with seed s samples as a request with seed
s + i does).

usage: determinism.py CASE        CASE: cpu (the tiny model, CI)
                                        | cpu_hybrid (../shared/reference/qwen3_5.gguf, CI)
                                        | gpu (INFERD_DET_MODEL, INFERD_TEST_SERVE_ARGS="--device cuda")
                                        | control (the gpu case without --deterministic: reports
                                          how many requests differ, asserts nothing about them)
env: INFERD_DET_MODEL (a GGUF; default: mkmodel's tiny), INFERD_DET_PROMPTS (N, default 16),
     INFERD_DET_KV_MB (server B's --kv-cache-size, default 1),
     INFERD_DET_TOKENS (tokens generated per request, default 12), INFERD_DET_SLOTS (server A's
     -np, default 2N).  Exit 0 = pass, 77 = skipped.  Every wait is bounded: requests 300 s each,
     a run's threads 600 s together."""
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_integration as hi  # noqa: E402
from http_integration import Server, check, make_model, post, request  # noqa: E402

N = int(os.environ.get("INFERD_DET_PROMPTS", "16"))
GEN = int(os.environ.get("INFERD_DET_TOKENS", "12"))
SLOTS = int(os.environ.get("INFERD_DET_SLOTS", str(2 * N)))
# Server B's KV pool in MiB: small enough that its sequences outgrow it and are preempted
# (recomputed later), large enough for any one request.
KV_MB = os.environ.get("INFERD_DET_KV_MB", "1")
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
         "under pale moonlight and the river keeps its own counsel about stones and time").split()


def prompt_texts():
    """N texts: a shared opening for half of them (prefix-cache hits between different prompts),
    then words of a per-prompt random walk (the same on every run of the test)."""
    shared = " ".join(WORDS * 3)
    out = []
    for i in range(N):
        rng = random.Random(1000 + i)
        words = " ".join(rng.choice(WORDS) for _ in range(60 + 7 * i))
        out.append((shared + " " if i % 2 == 0 else "") + f"Item {i}: " + words)
    return out


def prompt_ids(port):
    """Token prompts of lengths that matter: whole KV blocks (32, 64, 96: a cached prompt then
    recomputes its last token alone), one past a block, and odd lengths."""
    lengths = [32, 33, 64, 65, 96, 47, 80, 128, 127, 160, 41, 100, 192, 31, 70, 150]
    ids = []
    for i, text in enumerate(prompt_texts()):
        st, tok = post(port, "/tokenize", {"content": text, "add_special": True})
        check(st == 200, f"/tokenize: {st} {tok}")
        want = lengths[i % len(lengths)] + 32 * (i // len(lengths) % 2)
        toks = tok["tokens"]
        while len(toks) < want:  # a short tokenization: repeat it (still a fixed prompt)
            toks = toks + tok["tokens"][1:]
        ids.append(toks[:want])
    return ids


def bodies(ids):
    """Per prompt: greedy, and seeded at temperature 0.9 with top_p and top_k."""
    out = []
    for i, p in enumerate(ids):
        base = {"prompt": p, "max_tokens": GEN, "ignore_eos": True, "logprobs": 3}
        out.append(dict(base, temperature=0))
        out.append(dict(base, temperature=0.9, top_p=0.95, top_k=40, seed=7000 + i))
    return out


def choice_of(st, b, what):
    check(st == 200, f"{what}: {st} {b}")
    ch = b["choices"][0]
    return {"text": ch["text"], "logprobs": ch["logprobs"], "finish": ch["finish_reason"],
            "fingerprint": b.get("system_fingerprint"), "cached": b["usage"]["prompt_tokens_details"]["cached_tokens"]}


def run_all(port, reqs, together, stagger_s=0.0, noise=()):
    """The requests one after another, or all at once (threads) with noise requests interleaved;
    returns their choices in order."""
    results = [None] * len(reqs)

    def one(i, body):
        try:
            if stagger_s:
                time.sleep(stagger_s * (i % 7))
            st, b = post(port, "/v1/completions", body, timeout=300)
            results[i] = choice_of(st, b, f"request {i}")
        except Exception as e:  # reported below
            results[i] = e

    if not together:
        for i, body in enumerate(reqs):
            one(i, body)
    else:
        threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(reqs)]
        noise_threads = [threading.Thread(target=post, args=(port, "/v1/completions", b), kwargs={"timeout": 300})
                         for b in noise]
        all_noise = list(noise_threads)
        for k, t in enumerate(threads):
            t.start()
            if noise_threads and k % 4 == 0:
                noise_threads.pop().start()
        for t in noise_threads:
            t.start()
        deadline = time.time() + 600
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.time()))
        for t in all_noise:  # noise requests end with their server at the latest
            t.join(timeout=max(1.0, deadline - time.time()))
    for i, r in enumerate(results):
        check(isinstance(r, dict), f"request {i}: {r!r}")
    return results


def compare(runs, reqs, strict):
    """Each request's choice in every run against the first run's; returns how many differ."""
    names = list(runs)
    first = runs[names[0]]
    differ = 0
    for i in range(len(reqs)):
        for name in names[1:]:
            a, b = first[i], runs[name][i]
            same = (a["text"], a["logprobs"], a["finish"]) == (b["text"], b["logprobs"], b["finish"])
            if not same:
                differ += 1
                kind = "greedy" if reqs[i]["temperature"] == 0 else "seeded"
                la, lb = a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]
                k = next((j for j in range(min(len(la), len(lb))) if la[j] != lb[j] or
                          a["logprobs"]["tokens"][j] != b["logprobs"]["tokens"][j]), None)
                msg = (f"request {i} ({kind}, {len(reqs[i]['prompt'])} prompt tokens): run '{name}' differs from "
                       f"'{names[0]}' first at token {k}: {a['logprobs']['tokens'][k:k + 3] if k is not None else ''} "
                       f"{la[k] if k is not None else ''} vs {b['logprobs']['tokens'][k:k + 3] if k is not None else ''} "
                       f"{lb[k] if k is not None else ''}")
                check(not strict, msg)
                print(msg)
    return differ


def models_meta(port):
    st, _, raw = request(port, "GET", "/v1/models")
    check(st == 200, f"/v1/models: {st}")
    return json.loads(raw)["data"][0]["meta"]


def det_session(model, deterministic):
    flag = ["--deterministic"] if deterministic else []
    ctx = str(max(1024, 512 + GEN + 64))
    runs = {}
    with Server(model, "-np", str(SLOTS), "-c", ctx, "--queue-size", "1024", *flag, ready_s=600) as a:
        meta = models_meta(a.port)
        fp = meta.get("system_fingerprint")
        if deterministic:
            check(meta.get("deterministic") is True and isinstance(fp, str) and fp.endswith("_det"),
                  f"/v1/models meta: {meta}")
        else:
            check(meta.get("deterministic") is False and fp is None, f"/v1/models meta without the flag: {meta}")
        reqs = bodies(prompt_ids(a.port))
        t0 = time.time()
        runs["alone"] = run_all(a.port, reqs, together=False)
        runs["together"] = run_all(a.port, reqs, together=True)
        print(f"server A: {len(reqs)} requests alone, then together: {time.time() - t0:.1f} s")
        cached = sum(1 for r in runs["together"] if r["cached"] > 0)
        check(cached >= len(reqs) // 2, f"only {cached} of {len(reqs)} requests read cached blocks the second time")
        for name in runs:
            check(all(r["fingerprint"] == fp for r in runs[name]), f"a response's system_fingerprint is not {fp!r}")
        if deterministic:
            # n > 1: choice i of seed s samples as seed s + i alone (docs/determinism.md)
            seeded = dict(reqs[1], n=2)
            st, b = post(a.port, "/v1/completions", seeded)
            check(st == 200 and len(b["choices"]) == 2, f"n=2: {st} {b}")
            st, alone = post(a.port, "/v1/completions", dict(reqs[1], seed=reqs[1]["seed"] + 1))
            check(st == 200, f"seed + 1: {st}")
            got = b["choices"][1]
            check((got["text"], got["logprobs"]) == (alone["choices"][0]["text"], alone["choices"][0]["logprobs"]),
                  "choice 1 of n=2 with seed s differs from the request with seed s + 1")
            check(b["choices"][0]["text"] == runs["alone"][1]["text"], "choice 0 of n=2 differs from n=1")
    noise = [{"prompt": " ".join(WORDS * 8), "max_tokens": 2 * GEN, "temperature": 1.0, "ignore_eos": True}
             for _ in range(max(2, N // 4))]
    slots_b = str(max(2, SLOTS // 2))  # fewer than the requests: they queue
    with Server(model, "-np", slots_b, "-c", ctx, "-b", "16", "--no-prefix-cache", "--queue-size", "1024",
                "--kv-cache-size", KV_MB, *flag, ready_s=600) as b:
        t0 = time.time()
        runs["mixed"] = run_all(b.port, reqs, together=True, stagger_s=0.05, noise=noise)
        preempted = hi.metric(b.port, "inferd_preemptions_total")
        print(f"server B (-b 16, -np {slots_b}, no prefix cache, --kv-cache-size {KV_MB}, {len(noise)} noise "
              f"requests): {time.time() - t0:.1f} s, {preempted:.0f} preemptions")
        check(all(r["cached"] == 0 for r in runs["mixed"]), "server B read cached blocks")
    differ = compare(runs, reqs, strict=deterministic)
    greedy_texts = {r["text"] for r, q in zip(runs["alone"], reqs) if q["temperature"] == 0}
    check(len(greedy_texts) > 1, "different prompts gave one text: the comparison would prove nothing")
    print(f"{'deterministic' if deterministic else 'default'}: {len(reqs)} requests x {len(runs)} runs "
          f"({N} prompts, greedy and seeded, {GEN} tokens), {differ} of {len(reqs) * (len(runs) - 1)} "
          f"comparisons differ")
    return differ


def model_path():
    return os.environ.get("INFERD_DET_MODEL") or make_model()


def case_cpu():
    det_session(model_path(), True)


def case_cpu_hybrid():
    """The same on a hybrid (gated DeltaNet) reference file: state slots instead of K/V for three
    layers of four, prefix hits through state snapshots."""
    path = os.path.join(hi.SHARED, "reference", "qwen3_5.gguf")
    if not os.path.exists(path):
        print(f"SKIP: {path} not found")
        return hi.SKIP
    det_session(os.environ.get("INFERD_DET_MODEL") or path, True)


def case_gpu():
    if "cuda" not in hi.SERVE_ARGS:
        print("SKIP: the gpu case runs with INFERD_TEST_SERVE_ARGS=--device cuda")
        return hi.SKIP
    det_session(model_path(), True)


def case_control():
    det_session(model_path(), False)


if __name__ == "__main__":
    hi.main({"cpu": case_cpu, "cpu_hybrid": case_cpu_hybrid, "gpu": case_gpu, "control": case_control})
