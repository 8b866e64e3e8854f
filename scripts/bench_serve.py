#!/usr/bin/env python3
"""bench_serve.py: an OpenAI-API load generator in the spirit of vLLM's benchmark_serving.

Sends N streaming requests (closed loop: at most C in flight; optionally Poisson arrivals at R req/s)
with set prompt/output lengths to any OpenAI-compatible server (inferd, vLLM, llama-server, ...) and
reports TTFT, TPOT, ITL, E2E latency (mean/median/p99) and request/token throughput, as a table and
optionally as one JSON object (--json OUT).  Python 3.11+ standard library only.

  python3 scripts/bench_serve.py --base-url http://127.0.0.1:8080/v1 --endpoint completions \\
      --token-prompts --prompt-tokens 512 --output-tokens 128 --num-requests 64 --concurrency 32

Definitions (as in vLLM):
  TTFT  time from sending the request to the first chunk carrying content (text / delta.content)
  ITL   gaps between successive content chunks (a chunk may carry several tokens)
  TPOT  per request: (E2E latency - TTFT) / (completion_tokens - 1)
  E2E   time from sending the request to the end of the stream ("data: [DONE]")
Output tokens come from the server's usage (stream_options.include_usage); every request asks for
exactly --output-tokens tokens (max_tokens + ignore_eos) and any other count is reported as a
mismatch.  Prompt lengths: --token-prompts sends token-id arrays (/v1/completions accepts them) of
exactly --prompt-tokens ids; text prompts are random common words, calibrated with the server's
POST /tokenize when it has one (inferd, vLLM, llama-server) and by a one-token-per-word heuristic
otherwise.  Every prompt is distinct (seeded), so prefix caches do not flatter a server.
Failed requests (HTTP errors, in-stream errors, resets, timeouts, streams without [DONE]) are
counted with their message; nothing is ever retried.  Exit status 0 when every counted request
completed, 1 when some failed, 2 on a usage/setup error.
"""
import argparse
import asyncio
import json
import math
import random
import ssl
import statistics
import sys
import time
import urllib.parse

WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they which "
    "one you were her all she there would their we him been has when who will more no if out so said "
    "what up its about into than them can only other new some could time these two may then do first "
    "any my now such like our over man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too little state "
    "good very make world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came right used "
    "take three small house river garden story morning water light green window table paper music city "
    "friend village summer winter market yellow orange forest mountain bridge letter cloud dinner "
    "kitchen school teacher doctor animal flower happy quiet simple strong young early large open"
).split()

PCTS = (50, 99)


class HTTPError(Exception):
    pass


# ---- a minimal asyncio HTTP/1.1 client (one connection per request, no retries) ----------------

async def _read_n(r, n, closed_msg):
    """Yield exactly n bytes from stream r in pieces; HTTPError(closed_msg) if it ends first."""
    while n:
        data = await r.read(min(n, 65536))
        if not data:
            raise HTTPError(closed_msg)
        n -= len(data)
        yield data


class Response:
    def __init__(self, reader, writer, status, reason, headers):
        self.reader, self.writer = reader, writer
        self.status, self.reason, self.headers = status, reason, headers

    async def chunks(self):
        """Yield the body as it arrives (de-chunked), in pieces of whatever size the socket gives."""
        r = self.reader
        te = self.headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            while True:
                line = await r.readline()
                if not line:
                    raise HTTPError("connection closed inside a chunked body")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise HTTPError(f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                async for data in _read_n(r, size, "connection closed inside a chunk"):
                    yield data
                if (await r.readexactly(2)) != b"\r\n":
                    raise HTTPError("chunk not followed by CRLF")
        elif "content-length" in self.headers:
            async for data in _read_n(r, int(self.headers["content-length"]),
                                      "connection closed before Content-Length bytes"):
                yield data
        else:
            while data := await r.read(65536):
                yield data

    async def body(self, limit=1 << 20):
        out = bytearray()
        async for c in self.chunks():
            out += c
            if len(out) > limit:
                break
        return bytes(out)

    def close(self):
        try:
            self.writer.close()
        except Exception:
            pass


async def http_open(method, url, headers=None, body=None):
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https"):
        raise HTTPError(f"unsupported URL scheme in {url}")
    port = u.port or (443 if u.scheme == "https" else 80)
    ctx = ssl.create_default_context() if u.scheme == "https" else None
    reader, writer = await asyncio.open_connection(u.hostname, port, ssl=ctx, limit=1 << 22)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    host = u.hostname if u.port is None else f"{u.hostname}:{u.port}"
    h = {"Host": host, "User-Agent": "bench_serve.py", "Accept": "*/*", "Connection": "close"}
    if body is not None:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    try:
        writer.write(head.encode("latin-1") + (body or b""))
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise HTTPError(f"bad status line {status_line[:80]!r}" if status_line else "connection closed before a response")
        hdrs = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise HTTPError("connection closed inside the response headers")
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        return Response(reader, writer, int(parts[1]), parts[2].strip() if len(parts) > 2 else "", hdrs)
    except BaseException:
        writer.close()
        raise


def error_message(status, raw):
    try:
        e = json.loads(raw)
        if isinstance(e, dict) and isinstance(e.get("error"), dict):
            return f"HTTP {status}: {e['error'].get('message')}"
        if isinstance(e, dict) and "error" in e:
            return f"HTTP {status}: {e['error']}"
    except ValueError:
        pass
    return f"HTTP {status}: {raw[:300].decode('utf-8', 'replace').strip()}"


async def http_json(method, url, headers, obj=None, timeout=60):
    """A small non-streaming JSON request: (status, parsed body or None, raw)."""
    async def go():
        resp = await http_open(method, url, headers, None if obj is None else json.dumps(obj).encode())
        try:
            raw = await resp.body()
        finally:
            resp.close()
        try:
            return resp.status, json.loads(raw), raw
        except ValueError:
            return resp.status, None, raw
    return await asyncio.wait_for(go(), timeout)


# ---- one benchmark request ------------------------------------------------------------------------

class Result:
    __slots__ = ("ok", "error", "start", "ttft", "latency", "itl", "chunks", "prompt_tokens",
                 "completion_tokens", "usage_seen", "finish_reason", "last", "text")

    def __init__(self):
        self.ok, self.error = False, None
        self.start = self.ttft = self.latency = None
        self.last = None  # time from sending the request to the last chunk carrying content
        self.text = []  # the content pieces as they came (joined: the whole output)
        self.itl, self.chunks = [], 0
        self.prompt_tokens = self.completion_tokens = None
        self.usage_seen, self.finish_reason = False, None


def chunk_content(obj, chat):
    """The content a streamed chunk carries (text, delta.content or delta.reasoning_content)."""
    out = ""
    finish = None
    for ch in obj.get("choices") or ():
        if not isinstance(ch, dict):
            continue
        if chat:
            d = ch.get("delta") or {}
            out += (d.get("content") or "") + (d.get("reasoning_content") or "") + (d.get("reasoning") or "")
        else:
            out += ch.get("text") or ""
        finish = ch.get("finish_reason") or finish
    return out, finish


async def stream_request(url, headers, body, chat, timeout):
    res = Result()
    res.start = time.perf_counter()
    resp = None

    async def go():
        nonlocal resp
        resp = await http_open("POST", url, headers, body)
        if resp.status != 200:
            res.error = error_message(resp.status, await resp.body(65536))
            return
        buf = b""
        data_lines = []
        last = None
        done = False
        async for piece in resp.chunks():
            now = time.perf_counter()
            buf += piece
            # split complete lines; an event ends at a blank line (SSE; LF or CRLF)
            while not done:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line, buf = buf[:nl].rstrip(b"\r"), buf[nl + 1:]
                if line.startswith(b"data:"):
                    v = line[5:]
                    data_lines.append(v[1:] if v.startswith(b" ") else v)
                    continue
                if line or not data_lines:
                    continue  # comments, other fields, stray blank lines
                data, data_lines = b"\n".join(data_lines), []
                if data.strip() == b"[DONE]":
                    done = True
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    res.error = f"unparseable SSE data {data[:200]!r}"
                    return
                if not isinstance(obj, dict):
                    continue
                if obj.get("error"):
                    e = obj["error"]
                    res.error = "in-stream error: " + str(e.get("message") if isinstance(e, dict) else e)
                    return
                u = obj.get("usage")
                if isinstance(u, dict):
                    res.usage_seen = True
                    res.prompt_tokens = u.get("prompt_tokens")
                    res.completion_tokens = u.get("completion_tokens")
                text, fin = chunk_content(obj, chat)
                res.finish_reason = fin or res.finish_reason
                if text:
                    res.chunks += 1
                    res.text.append(text)
                    if last is None:
                        res.ttft = now - res.start
                    else:
                        res.itl.append(now - last)
                    last = now
            if done:
                break
        if not done:
            res.error = "stream ended without data: [DONE]"
            return
        res.latency = time.perf_counter() - res.start
        res.last = None if last is None else last - res.start
        if res.ttft is None:
            res.error = "stream carried no content"
            return
        if res.completion_tokens is None:
            res.completion_tokens = res.chunks  # no usage chunk: one token per content chunk (estimate)
        res.ok = True

    try:
        await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        res.error = f"timed out after {timeout:g} s"
    except (OSError, HTTPError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        if resp:
            resp.close()
    if not res.ok and not res.error:
        res.error = "failed"
    return res


# ---- prompts --------------------------------------------------------------------------------------

class Prompts:
    """Builds distinct prompts of about P tokens; exact with --token-prompts or /tokenize."""

    def __init__(self, args, root_url, headers, model):
        self.args, self.root, self.headers, self.model = args, root_url, headers, model
        self.method = None
        self.pool = None
        self.word_cost = {}

    async def tokenize(self, text, special):
        body = {"content": text, "prompt": text, "model": self.model,
                "add_special": special, "add_special_tokens": special}
        try:
            st, obj, _ = await http_json("POST", self.root + "/tokenize", self.headers, body, timeout=30)
        except (OSError, HTTPError, asyncio.TimeoutError, ValueError):
            return None
        if st != 200 or not isinstance(obj, dict) or not isinstance(obj.get("tokens"), list):
            return None
        toks = obj["tokens"]
        return [t["id"] if isinstance(t, dict) else t for t in toks]

    async def setup(self, vocab_hint):
        a = self.args
        have_tok = a.tokenizer != "off" and (await self.tokenize("hello world", False)) is not None
        if a.token_prompts:
            if have_tok:
                ids = await self.tokenize(" ".join(WORDS), False)
                self.pool = sorted(set(ids))
                self.method = "token ids (sampled from /tokenize of common words): exact"
            else:
                v = a.vocab_size or vocab_hint
                lo, hi = (min(100, v // 10), v) if v else (1000, 20000)
                self.pool = range(lo, hi)
                self.method = f"token ids sampled from [{lo}, {hi}) (no /tokenize): exact"
        elif have_tok:
            self.method = "text calibrated with POST /tokenize"
            costs = await asyncio.gather(*(self.tokenize(" " + w, False) for w in WORDS))
            self.word_cost = {w: max(1, len(c or [0])) for w, c in zip(WORDS, costs)}
        else:
            self.method = "text, heuristic one token per word (no /tokenize)"

    def _words(self, rng, target, single=False):
        pool = [w for w in WORDS if self.word_cost.get(w, 1) == 1] if single else WORDS
        out, n = [], 0
        while n < target:
            w = rng.choice(pool or WORDS)
            out.append(w)
            n += self.word_cost.get(w, 1)
        return out

    async def make(self, index):
        a = self.args
        rng = random.Random(f"{a.seed}-{index}")
        P = a.prompt_tokens
        if self.pool is not None:
            return rng.choices(self.pool, k=P) if not isinstance(self.pool, range) else \
                [rng.randrange(self.pool.start, self.pool.stop) for _ in range(P)]
        words = self._words(rng, P)
        if not self.word_cost:
            return " ".join(words)
        # exact fit with the server's tokenizer (special tokens included): a few bounded adjustments
        best = None
        for _ in range(12):
            text = " ".join(words)
            ids = await self.tokenize(text, True)
            if ids is None:
                return text
            n = len(ids)
            if n <= P and (best is None or n > best[0]):
                best = (n, text)
            if n == P:
                break
            if n > P:
                del words[-max(1, (n - P) // 2):]
            else:
                words += self._words(rng, P - n, single=True)
            if not words:
                break
        return best[1] if best else " ".join(words[:1])


# ---- statistics -----------------------------------------------------------------------------------

def percentile(xs, p):
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        return None
    k = (len(s) - 1) * p / 100.0
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def dist(xs, scale=1000.0):
    """mean/median/p99 (and std/min/max) in ms."""
    if not xs:
        return {"mean": None, "median": None, "p99": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(xs) * scale, "median": percentile(xs, 50) * scale,
            "p99": percentile(xs, 99) * scale, "std": (statistics.pstdev(xs) * scale),
            "min": min(xs) * scale, "max": max(xs) * scale, "n": len(xs)}


def summarize(results, duration, args, concurrency, max_inflight):
    ok = [r for r in results if r.ok]
    bad = [r for r in results if not r.ok]
    out_toks = sum(r.completion_tokens or 0 for r in ok)
    in_toks = sum(r.prompt_tokens or 0 for r in ok)
    tpot = [(r.latency - r.ttft) / (r.completion_tokens - 1) for r in ok if (r.completion_tokens or 0) > 1]
    itl = [x for r in ok for x in r.itl]
    errors = {}
    for r in bad:
        errors[r.error] = errors.get(r.error, 0) + 1
    mism = [r.completion_tokens for r in ok if r.completion_tokens != args.output_tokens]
    no_usage = sum(1 for r in ok if not r.usage_seen)
    return {
        "concurrency": concurrency,
        "request_rate": None if math.isinf(args.request_rate) else args.request_rate,
        "max_inflight": max_inflight,
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(bad),
        "errors": errors,
        "duration_s": duration,
        "total_input_tokens": in_toks,
        "total_output_tokens": out_toks,
        "mean_prompt_tokens": (in_toks / len(ok)) if ok else None,
        "output_token_mismatches": len(mism),
        "mismatched_output_counts": sorted(set(mism))[:20],
        "requests_without_usage": no_usage,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": out_toks / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_toks + out_toks) / duration if duration > 0 else 0.0,
        "ttft_ms": dist([r.ttft for r in ok]),
        "tpot_ms": dist(tpot),
        "itl_ms": dist(itl),
        "e2el_ms": dist([r.latency for r in ok]),
        "requests": [{"ok": r.ok, "error": r.error, "start_s": r.start, "ttft_ms": r.ttft and r.ttft * 1e3,
                      "latency_ms": r.latency and r.latency * 1e3, "prompt_tokens": r.prompt_tokens,
                      "completion_tokens": r.completion_tokens, "chunks": r.chunks,
                      "finish_reason": r.finish_reason} for r in results],
    }


def fmt(v, nd=2):
    return "n/a" if v is None else f"{v:.{nd}f}"


def print_table(s, title):
    W = 50
    line = lambda k, v: print(f"{k:<{W - 12}}{v:>12}")
    print(f"{' ' + title + ' ':=^{W}}")
    line("Successful requests:", s["completed"])
    line("Failed requests:", s["failed"])
    line("Max concurrency (limit / observed):", f"{s['concurrency']}/{s['max_inflight']}")
    if s["request_rate"] is not None:
        line("Request rate (req/s, Poisson):", fmt(s["request_rate"]))
    line("Benchmark duration (s):", fmt(s["duration_s"]))
    line("Total input tokens:", s["total_input_tokens"])
    line("Total generated tokens:", s["total_output_tokens"])
    line("Request throughput (req/s):", fmt(s["request_throughput"]))
    line("Output token throughput (tok/s):", fmt(s["output_throughput"]))
    line("Total token throughput (tok/s):", fmt(s["total_token_throughput"]))
    for key, name, long in (("ttft_ms", "TTFT", "Time to First Token"),
                            ("tpot_ms", "TPOT", "Time per Output Token (excl. 1st token)"),
                            ("itl_ms", "ITL", "Inter-token Latency"),
                            ("e2el_ms", "E2EL", "End-to-end Latency")):
        print(f"{long:-^{W}}")
        d = s[key]
        line(f"Mean {name} (ms):", fmt(d["mean"]))
        line(f"Median {name} (ms):", fmt(d["median"]))
        line(f"P99 {name} (ms):", fmt(d["p99"]))
    print("=" * W)
    if s["output_token_mismatches"]:
        print(f"WARNING: {s['output_token_mismatches']} request(s) did not generate exactly the requested "
              f"tokens (got {s['mismatched_output_counts']}); the server may not honour ignore_eos")
    if s["requests_without_usage"]:
        print(f"WARNING: {s['requests_without_usage']} request(s) had no usage chunk; their output tokens "
              "were estimated from the number of content chunks")
    for msg, n in sorted(s["errors"].items(), key=lambda kv: -kv[1])[:10]:
        print(f"FAILED x{n}: {msg}")


SWEEP_HEAD = (f"{'conc':>5} {'ok':>5} {'fail':>4} {'dur_s':>8} {'req/s':>8} {'out_tok/s':>10} {'tot_tok/s':>10} "
              f"{'TTFT_med':>9} {'TTFT_p99':>9} {'TPOT_med':>9} {'TPOT_p99':>9} {'ITL_med':>8} {'ITL_p99':>8} "
              f"{'E2E_med':>9}")


def sweep_row(s):
    return (f"{s['concurrency']:>5} {s['completed']:>5} {s['failed']:>4} {s['duration_s']:>8.2f} "
            f"{s['request_throughput']:>8.2f} {s['output_throughput']:>10.1f} {s['total_token_throughput']:>10.1f} "
            f"{fmt(s['ttft_ms']['median']):>9} {fmt(s['ttft_ms']['p99']):>9} {fmt(s['tpot_ms']['median']):>9} "
            f"{fmt(s['tpot_ms']['p99']):>9} {fmt(s['itl_ms']['median']):>8} {fmt(s['itl_ms']['p99']):>8} "
            f"{fmt(s['e2el_ms']['median']):>9}")


# ---- the benchmark --------------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        base = args.base_url.rstrip("/")
        self.base = base
        self.root = base[:-3] if base.endswith("/v1") else base
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.chat = args.endpoint == "chat"
        self.url = base + ("/chat/completions" if self.chat else "/completions")
        self.next_index = 0

    def body(self, prompt):
        a = self.args
        b = {"model": self.model, "max_tokens": a.output_tokens, "stream": True,
             "stream_options": {"include_usage": True}, "temperature": a.temperature}
        if not a.no_ignore_eos:
            b["ignore_eos"] = True
        if self.chat:
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        b.update(a.extra_body)
        return json.dumps(b).encode()

    async def setup(self):
        a = self.args
        st, obj, raw = await http_json("GET", self.base + "/models", self.headers, timeout=a.timeout)
        vocab = None
        if st == 200 and isinstance(obj, dict) and obj.get("data"):
            m0 = obj["data"][0]
            self.model = a.model or m0.get("id")
            meta = m0.get("meta") if isinstance(m0.get("meta"), dict) else {}
            vocab = meta.get("n_vocab")
        elif a.model:
            self.model = a.model
        else:
            raise HTTPError(f"GET {self.base}/models: {error_message(st, raw)} (pass --model)")
        self.prompts = Prompts(a, self.root, self.headers, self.model)
        await self.prompts.setup(vocab)

    async def prompts_for(self, n):
        """The next n prompts (made 8 at a time: token prompts cost a /tokenize each)."""
        first = self.next_index
        self.next_index += n
        sem = asyncio.Semaphore(8)

        async def one(i):
            async with sem:
                return await self.prompts.make(i)
        return await asyncio.gather(*(one(first + i) for i in range(n)))

    async def make_bodies(self, n):
        return [self.body(p) for p in await self.prompts_for(n)]

    async def run(self, n, concurrency, rate):
        bodies = await self.make_bodies(n)
        sem = asyncio.Semaphore(concurrency)
        rng = random.Random(f"{self.args.seed}-arrivals-{self.next_index}")
        inflight = 0
        peak = 0

        async def one(body):
            nonlocal inflight, peak
            async with sem:
                inflight += 1
                peak = max(peak, inflight)
                try:
                    return await stream_request(self.url, self.headers, body, self.chat, self.args.timeout)
                finally:
                    inflight -= 1

        t0 = time.perf_counter()
        tasks = []
        next_at = t0
        for b in bodies:
            if not math.isinf(rate):
                next_at += rng.expovariate(rate)
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(b)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        for r in results:
            r.start -= t0
        return results, duration, peak


def base_parser(doc):
    """An argument parser with the module docstring as help and the options every benchmark
    against a server takes (--base-url, --model)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(doc.split("\n\n")[1:]))
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="the server's OpenAI base URL (default %(default)s)")
    p.add_argument("--model", help="model name to send (default: the first id of GET /v1/models)")
    return p


def parse_args(argv):
    p = base_parser(__doc__)
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--num-requests", "-n", type=int, default=100, help="requests per run (default %(default)s)")
    p.add_argument("--concurrency", "-c", type=int, default=8, help="most requests in flight (default %(default)s)")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="Poisson arrivals at this many req/s (seeded), still capped by --concurrency (default: all at once)")
    p.add_argument("--sweep-concurrency", help="comma-separated levels, e.g. 1,4,16: one run per level, one summary row each")
    p.add_argument("--ttft-ratio", action="store_true",
                   help="with --sweep-concurrency: print median TTFT(max level or 4)/TTFT(level 1)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128, help="max_tokens (with ignore_eos: exactly this many)")
    p.add_argument("--token-prompts", action="store_true", help="send prompts as token-id arrays (completions only): exact lengths")
    p.add_argument("--tokenizer", choices=("auto", "off"), default="auto", help="use the server's POST /tokenize (auto) or not")
    p.add_argument("--vocab-size", type=int, help="token id range for --token-prompts when the server has no /tokenize")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (for servers that reject it)")
    p.add_argument("--extra-body", type=json.loads, default={}, help="JSON object merged into every request body")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=0, help="requests sent first and not counted")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request limit in seconds (default %(default)s)")
    p.add_argument("--json", metavar="OUT", help="write every figure as one JSON object to OUT ('-' for stdout)")
    p.add_argument("--quiet", action="store_true", help="no table (with --json -)")
    a = p.parse_args(argv)
    if a.num_requests < 1 or a.concurrency < 1 or a.prompt_tokens < 1 or a.output_tokens < 1 or a.warmup < 0:
        p.error("--num-requests, --concurrency, --prompt-tokens, --output-tokens must be >= 1")
    if not (a.request_rate > 0):
        p.error("--request-rate must be > 0")
    if a.token_prompts and a.endpoint == "chat":
        p.error("--token-prompts needs --endpoint completions")
    if not isinstance(a.extra_body, dict):
        p.error("--extra-body must be a JSON object")
    a.levels = [a.concurrency]
    if a.sweep_concurrency:
        try:
            a.levels = [int(x) for x in a.sweep_concurrency.split(",") if x.strip()]
        except ValueError:
            p.error("--sweep-concurrency takes integers, e.g. 1,4,16")
        if not a.levels or min(a.levels) < 1:
            p.error("--sweep-concurrency levels must be >= 1")
    if a.ttft_ratio and 1 not in a.levels:
        p.error("--ttft-ratio needs level 1 in --sweep-concurrency")
    return a


async def main_async(a):
    b = Bench(a)
    await b.setup()
    say = (lambda *x: None) if a.quiet else (lambda *x: print(*x, flush=True))
    say(f"bench_serve: {b.url} model={b.model} endpoint={a.endpoint} prompt~{a.prompt_tokens} tok "
        f"({b.prompts.method}), output={a.output_tokens} tok, n={a.num_requests}, levels={a.levels}, "
        f"rate={'inf' if math.isinf(a.request_rate) else a.request_rate}")
    report = {"base_url": a.base_url, "model": b.model, "endpoint": a.endpoint,
              "prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens, "prompt_method": b.prompts.method,
              "token_prompts": a.token_prompts, "num_requests": a.num_requests, "seed": a.seed,
              "temperature": a.temperature, "ignore_eos": not a.no_ignore_eos, "warmup": a.warmup}
    if a.warmup:
        wr, _, _ = await b.run(a.warmup, min(a.warmup, max(a.levels)), math.inf)
        wf = [r.error for r in wr if not r.ok]
        say(f"warm-up: {a.warmup - len(wf)}/{a.warmup} completed" + (f"; first error: {wf[0]}" if wf else ""))
        report["warmup_failed"] = len(wf)
    runs = []
    for c in a.levels:
        results, duration, peak = await b.run(a.num_requests, c, a.request_rate)
        s = summarize(results, duration, a, c, peak)
        runs.append(s)
        if not a.quiet:
            print_table(s, f"Serving Benchmark Result (concurrency {c})")
    if len(runs) > 1 and not a.quiet:
        print(SWEEP_HEAD + "   (ms)")
        for s in runs:
            print(sweep_row(s))
    if len(runs) == 1:
        report.update(runs[0])
    else:
        report["sweep"] = runs
    if a.ttft_ratio:
        one = next(s for s in runs if s["concurrency"] == 1)
        other = next((s for s in runs if s["concurrency"] == 4), max(runs, key=lambda s: s["concurrency"]))
        t1, tk = one["ttft_ms"]["median"], other["ttft_ms"]["median"]
        ratio = tk / t1 if t1 and tk else None
        report["ttft_ratio"] = {"concurrency": other["concurrency"], "ttft_median_ms_c1": t1,
                                "ttft_median_ms": tk, "ratio": ratio}
        say(f"TTFT ratio: median TTFT(c={other['concurrency']}) / TTFT(c=1) = {fmt(tk)} / {fmt(t1)} ms = {fmt(ratio, 3)}")
    if a.json:
        text = json.dumps(report, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    return 0 if all(s["failed"] == 0 for s in runs) else 1


def run_cli(name, parse, run_async, argv=None):
    """A benchmark's entry point: parse argv, run run_async(args); a network failure is exit 2
    with one line on stderr, ^C exit 130."""
    a = parse(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(run_async(a))
    except (OSError, HTTPError, asyncio.TimeoutError) as e:
        print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv=None):
    return run_cli("bench_serve", parse_args, main_async, argv)


if __name__ == "__main__":
    sys.exit(main())
