#!/usr/bin/env python3
"""bench_grammar.py: decode throughput with every sequence constrained by a JSON schema vs none.

For each concurrency level, the same N prompts are sent twice to a running OpenAI-compatible
server (inferd; vLLM and llama-server accept the same body): once unconstrained and once with
response_format {"type": "json_schema"} of a 10-property nested schema (the shape of
tests/grammar/bench_mask.c, with an array of at least 16 event objects so that almost every
constrained output runs to max_tokens).  Both modes send temperature 1, ignore_eos and the same
max_tokens, and stream (stream_options.include_usage).  Standard library only; the HTTP client,
prompts and statistics are scripts/bench_serve.py's.

  python3 scripts/bench_grammar.py --base-url http://127.0.0.1:8080/v1 --concurrency 1,32

Measured per run (mode x concurrency), closed loop (at most C requests in flight):
  TPOT      per request: (last content chunk - first content chunk) / (completion_tokens - 1);
            p50/p99 over the requests, and the per-sequence rate 1000 / TPOT p50 (tok/s)
  out tok/s completion tokens of every request / the run's wall time (first request sent to the
            last stream's end): aggregate throughput over the busy window
  loss      (unconstrained - constrained) / unconstrained, of out tok/s and of the per-sequence
            rate (the issue's target: <= 10 %)
  srv ITL   the server's own mean inter-token latency over the run (inferd's /metrics:
            inferd_inter_token_latency_seconds sum / count, before vs after), a check that the
            client kept up: a TPOT well above it means the client, not the server, set the pace
A constrained request ends ("stop") when its grammar completes, so totals differ between the
modes; only rates are compared, and the finish reasons ("length" vs "stop") are printed.

Every constrained output is checked: one that finished "stop" must parse as JSON and (when
python3-jsonschema is importable) validate against the schema; one cut at max_tokens ("length")
must be a prefix of some JSON text.  Exit status 0 when every request completed and every
constrained output passed, 1 otherwise, 2 on a usage/setup error.  Besides the table, one JSON
object per measurement is printed on a line of its own (starting with '{').
"""
import asyncio
import json
import os
import re
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in scripts/ from the import below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import (HTTPError, Bench, base_parser, fmt, http_json, http_open, percentile, run_cli,  # noqa: E402
                         stream_request)

try:
    import jsonschema
except ImportError:
    jsonschema = None

# tests/grammar/bench_mask.c's schema (uuid, bounded strings, integer range, email, boolean,
# number, a small array, a nested object with a pattern, an enum) with every string bounded (the
# email a pattern instead of format "email", whose local part has no bound), an "events" array of
# objects in place of "created", at least 16 of them, and every property required.  A random-weight
# model spends ~30 tokens per event, so the grammar completes only after max_tokens (256) and the
# walk keeps cycling through keys, strings, numbers, enums and date-times rather than one long string.
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "[a-z0-9._]{1,24}@[a-z0-9]{1,16}\\.[a-z]{2,6}"},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
        "address": {"type": "object",
                    "properties": {"street": {"type": "string", "maxLength": 80},
                                   "city": {"type": "string", "maxLength": 40},
                                   "zip": {"type": "string", "pattern": "[0-9]{5}"}},
                    "required": ["street", "city"]},
        "role": {"enum": ["admin", "user", "guest"]},
        "events": {"type": "array", "minItems": 16, "maxItems": 1000,
                   "items": {"type": "object",
                             "properties": {"at": {"type": "string", "format": "date-time"},
                                            "kind": {"enum": ["login", "logout", "purchase", "refund"]},
                                            "amount": {"type": "integer", "minimum": 0, "maximum": 100000},
                                            "note": {"type": "string", "maxLength": 60}},
                             "required": ["at", "kind", "note"]}},
    },
    "required": ["id", "name", "age", "email", "active", "score", "tags", "address", "role", "events"],
    "additionalProperties": False,
}

MODES = ("unconstrained", "constrained")


# ---- checking the outputs -------------------------------------------------------------------------

_COMPLETIONS = ("", "0", "null", ":null", "rue", "ue", "e", "alse", "lse", "se", "ull", "ll", "l")


def json_prefix_ok(text):
    """True when text is a prefix of some JSON text (an output cut at max_tokens).  Closes what
    is open: drops a dangling escape inside a string and closes the string, drops one trailing
    comma, finishes a literal/number/key with one of a few endings, then closes the brackets;
    only incomplete tails are removed, so an invalid prefix stays invalid."""
    stack, in_str, esc = [], False, 0
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc -= 1
                if esc == 0 and ch == "u" and text[i - 1] == "\\":
                    esc = 4  # \uXXXX
            elif ch == "\\":
                esc = 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}":
            if not stack or stack.pop() != ch:
                return False
    base = text
    if in_str:
        if esc:  # a dangling \ or \uXX: cut it
            base = base[:base.rfind("\\")]
        base += '"'
    else:
        base = base.rstrip()
        if base.endswith(","):
            base = base[:-1]
    closers = "".join(reversed(stack))
    for extra in _COMPLETIONS:
        try:
            json.loads(base + extra + closers)
            return True
        except ValueError:
            pass
    return False


def make_validator():
    if jsonschema is None:
        return None
    # the 2020-12 checker, as tests/server/http_integration.py's structured case uses it
    checker = getattr(jsonschema.Draft202012Validator, "FORMAT_CHECKER", None)
    return jsonschema.Draft202012Validator(SCHEMA, format_checker=checker)


def check_output(text, finish, validator):
    """None when the constrained output is fine, else why not."""
    if finish == "stop":
        try:
            value = json.loads(text)
        except ValueError as e:
            return f"finished 'stop' but is not JSON ({e}): {text[:200]!r}"
        if validator is not None:
            err = next(iter(validator.iter_errors(value)), None)
            if err is not None:
                return f"does not validate against the schema ({err.message[:200]}): {text[:200]!r}"
        return None
    if finish == "length":
        return None if json_prefix_ok(text) else f"cut at max_tokens but not a JSON prefix: {text[:300]!r}"
    return f"finish_reason {finish!r}: {text[:200]!r}"


# ---- the runs -------------------------------------------------------------------------------------

class GrammarBench(Bench):
    """bench_serve's Bench (model discovery, prompts) with one body per mode."""

    def body(self, prompt, mode="unconstrained", max_tokens=None):
        a = self.args
        b = {"model": self.model, "max_tokens": max_tokens or a.max_tokens, "stream": True,
             "stream_options": {"include_usage": True}, "temperature": a.temperature, "ignore_eos": True}
        if self.chat:
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if mode == "constrained":
            b["response_format"] = {"type": "json_schema",
                                    "json_schema": {"name": "record", "schema": SCHEMA, "strict": True}}
        return json.dumps(b).encode()

    async def metrics(self):
        """inferd's /metrics as {name: value} ({} for servers without it)."""
        async def get():
            resp = await http_open("GET", self.root + "/metrics", self.headers)
            try:
                return resp.status, await resp.body(1 << 22)
            finally:
                resp.close()
        try:
            status, raw = await asyncio.wait_for(get(), 30)
        except (OSError, HTTPError, asyncio.TimeoutError):
            return {}
        if status != 200:
            return {}
        return {m.group(1): float(m.group(2)) for m in
                re.finditer(r"^([a-z_]+) ([0-9.e+-]+)$", raw.decode("utf-8", "replace"), re.M)}

    async def run_bodies(self, bodies, concurrency):
        sem = asyncio.Semaphore(concurrency)

        async def one(body):
            async with sem:
                return await stream_request(self.url, self.headers, body, self.chat, self.args.timeout)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(b) for b in bodies))
        return results, time.perf_counter() - t0


def summarize(results, duration, model, concurrency, mode, max_tokens, validator, before, after):
    ok = [r for r in results if r.ok]
    errors = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    tpot = [(r.last - r.ttft) / (r.completion_tokens - 1) * 1e3 for r in ok if (r.completion_tokens or 0) > 1]
    finish = {}
    for r in ok:
        finish[r.finish_reason] = finish.get(r.finish_reason, 0) + 1
    invalid = []
    if mode == "constrained":
        for r in ok:
            why = check_output("".join(r.text), r.finish_reason, validator)
            if why:
                invalid.append(why)
    toks = sum(r.completion_tokens or 0 for r in ok)
    p50 = percentile(tpot, 50)
    key = "inferd_inter_token_latency_seconds_"
    n_itl = after.get(key + "count", 0) - before.get(key + "count", 0)
    srv_itl = (after[key + "sum"] - before[key + "sum"]) / n_itl * 1e3 if n_itl > 0 else None
    return {
        "bench": "grammar", "model": model, "concurrency": concurrency, "mode": mode,
        "schema": "json_schema" if mode == "constrained" else None, "max_tokens": max_tokens,
        "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "duration_s": duration, "output_tokens": toks,
        "mean_completion_tokens": toks / len(ok) if ok else None,
        "output_tok_s": toks / duration if duration > 0 else 0.0,
        "tpot_ms_p50": p50, "tpot_ms_p99": percentile(tpot, 99),
        "tpot_ms_mean": sum(tpot) / len(tpot) if tpot else None,
        "seq_tok_s_p50": 1e3 / p50 if p50 else None,
        "ttft_ms_p50": percentile([r.ttft * 1e3 for r in ok], 50),
        "server_itl_ms_mean": srv_itl,
        "finish_reasons": finish,
        "checked": len(ok) if mode == "constrained" else 0,
        "invalid": len(invalid),
        "schema_validated": mode == "constrained" and validator is not None,
        "errors": errors,
        "_invalid_examples": invalid[:3],
    }


def loss_pct(base, new):
    return None if not base or new is None else 100.0 * (base - new) / base


HEAD = (f"{'conc':>5} {'mode':<14} {'ok':>4} {'fail':>4} {'length':>6} {'stop':>5} {'mean_tok':>8} "
        f"{'out_tok/s':>10} {'TPOT_p50':>9} {'TPOT_p99':>9} {'srv_ITL':>8} {'seq_tok/s':>9} {'loss_out':>8} {'loss_seq':>8} "
        f"{'loss_srv':>8} {'invalid':>7}")


def row(s):
    f = s["finish_reasons"]
    lo = s.get("loss_output_tok_s_pct")
    ls = s.get("loss_seq_tok_s_pct")
    lv = s.get("loss_server_itl_pct")
    return (f"{s['concurrency']:>5} {s['mode']:<14} {s['completed']:>4} {s['failed']:>4} {f.get('length', 0):>6} "
            f"{f.get('stop', 0):>5} {fmt(s['mean_completion_tokens'], 1):>8} {fmt(s['output_tok_s'], 1):>10} "
            f"{fmt(s['tpot_ms_p50'], 3):>9} {fmt(s['tpot_ms_p99'], 3):>9} {fmt(s['server_itl_ms_mean'], 3):>8} "
            f"{fmt(s['seq_tok_s_p50'], 1):>9} "
            f"{'' if lo is None else f'{lo:.1f}%':>8} {'' if ls is None else f'{ls:.1f}%':>8} "
            f"{'' if lv is None else f'{lv:.1f}%':>8} "
            f"{s['invalid'] if s['mode'] == 'constrained' else '':>7}")


def parse_args(argv):
    p = base_parser(__doc__)
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--concurrency", "-c", default="1,32", help="comma-separated levels (default %(default)s)")
    p.add_argument("--num-requests", "-n", type=int, default=0,
                   help="requests per mode and level (default: 2 x the level, at least 8)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens of every request (default %(default)s)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length, about (default %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=-1,
                   help="uncounted requests per mode before each level, at its concurrency (default: the level)")
    p.add_argument("--tokenizer", choices=("auto", "off"), default="auto", help="use the server's POST /tokenize (auto) or not")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="per-request limit in seconds (default %(default)s)")
    p.add_argument("--json", metavar="OUT", help="also write every measurement to OUT as JSON lines")
    a = p.parse_args(argv)
    try:
        a.levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    except ValueError:
        p.error("--concurrency takes integers, e.g. 1,32")
    if not a.levels or min(a.levels) < 1 or a.num_requests < 0 or a.max_tokens < 2 or a.prompt_tokens < 1:
        p.error("levels >= 1, --num-requests >= 0, --max-tokens >= 2, --prompt-tokens >= 1")
    # what bench_serve's Bench and Prompts read
    a.token_prompts, a.vocab_size, a.output_tokens = False, None, a.max_tokens
    return a


async def main_async(a):
    b = GrammarBench(a)
    await b.setup()
    validator = make_validator()
    # compile check: a refused schema is a setup error, not a benchmark
    probe = json.loads(b.body("x", "constrained", 2))
    probe["stream"] = False
    del probe["stream_options"]
    st, _, raw = await http_json("POST", b.url, b.headers, probe, timeout=a.timeout)
    if st != 200:
        raise HTTPError(f"the server refused the schema: {raw[:300].decode('utf-8', 'replace')}")
    print(f"bench_grammar: {b.url} model={b.model} endpoint={a.endpoint} prompt~{a.prompt_tokens} tok "
          f"({b.prompts.method}), max_tokens={a.max_tokens}, temperature={a.temperature:g}, levels={a.levels}", flush=True)
    print("schema check: " + ("outputs that finish 'stop' are validated with python3-jsonschema (Draft 2020-12), "
                              "those cut at max_tokens are checked to be JSON prefixes" if validator else
                              "SKIPPED: python3-jsonschema is not importable; outputs are only parsed as JSON"), flush=True)
    out = []
    for c in a.levels:
        n = a.num_requests or max(8, 2 * c)
        prompts = await b.prompts_for(n)
        w = c if a.warmup < 0 else a.warmup
        if w:
            wp = await b.prompts_for(w)
            for mode in MODES:
                wr, _ = await b.run_bodies([b.body(p, mode) for p in wp], c)
                bad = [r.error for r in wr if not r.ok]
                if bad:
                    print(f"warm-up ({mode}, concurrency {c}): {len(bad)}/{w} failed; first: {bad[0]}", flush=True)
        level = {}
        for mode in MODES:
            before = await b.metrics()
            results, duration = await b.run_bodies([b.body(p, mode) for p in prompts], c)
            after = await b.metrics()
            level[mode] = summarize(results, duration, b.model, c, mode, a.max_tokens, validator, before, after)
        u, k = level["unconstrained"], level["constrained"]
        k["loss_output_tok_s_pct"] = loss_pct(u["output_tok_s"], k["output_tok_s"])
        k["loss_seq_tok_s_pct"] = loss_pct(u["seq_tok_s_p50"], k["seq_tok_s_p50"])
        ui, ki = u["server_itl_ms_mean"], k["server_itl_ms_mean"]
        k["loss_server_itl_pct"] = loss_pct(1e3 / ui, 1e3 / ki) if ui and ki else None
        out += [u, k]
    print(f"\n{' constrained (json_schema) vs unconstrained decode ':=^{len(HEAD)}}")
    print(HEAD + "   (TPOT, ITL in ms)")
    for s in out:
        print(row(s))
    print("loss_out: aggregate output tok/s lost; loss_seq: per-sequence tok/s (1000 / TPOT p50) lost; "
          "loss_srv: the same from the server's mean ITL; target <= 10 %")
    rc = 0
    for s in out:
        srv, mean = s["server_itl_ms_mean"], s["tpot_ms_mean"]
        if srv and mean and mean > 1.1 * srv:
            print(f"NOTE ({s['mode']}, concurrency {s['concurrency']}): client TPOT mean {mean:.3f} ms is more than 10 % "
                  f"above the server's ITL mean {srv:.3f} ms: the client may be setting the pace")
        stops = s["finish_reasons"].get("stop", 0)
        if s["mode"] == "constrained" and stops > s["completed"] // 4:
            print(f"NOTE (concurrency {s['concurrency']}): {stops}/{s['completed']} constrained requests completed their "
                  "grammar before max_tokens; the rates still compare, the totals do not")
        for msg, cnt in sorted(s["errors"].items(), key=lambda kv: -kv[1])[:5]:
            print(f"FAILED x{cnt} ({s['mode']}, concurrency {s['concurrency']}): {msg}")
        for why in s.pop("_invalid_examples"):
            print(f"INVALID ({s['mode']}, concurrency {s['concurrency']}): {why}")
        if s["failed"] or s["invalid"]:
            rc = 1
    for s in out:
        print(json.dumps(s))
    if a.json:
        with open(a.json, "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in out)
    if rc:
        print("bench_grammar: FAILED: " + ", ".join(
            f"{s['mode']}@{s['concurrency']}: {s['failed']} failed, {s['invalid']} invalid" for s in out
            if s["failed"] or s["invalid"]))
    return rc


def main(argv=None):
    return run_cli("bench_grammar", parse_args, main_async, argv)


if __name__ == "__main__":
    sys.exit(main())
