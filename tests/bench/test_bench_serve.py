#!/usr/bin/env python3
"""Tests of scripts/bench_serve.py (no timing thresholds: it also runs under ASan).

usage: test_bench_serve.py CASE
  inferd   the real server on a free 127.0.0.1 port (tests/server/http_integration.py's Server):
           12 streamed completions (token-id prompts) at concurrency 4 and a small chat run,
           the --json figures checked
  fake     a stdlib fake OpenAI server that splits SSE events across writes (CRLF lines), and one
           that fails in each way (HTTP error, in-stream error, missing [DONE], reset): every
           failure is counted with its message, nothing retried
Exit 0 = pass, 77 = skipped, anything else = failure."""
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

SRC = os.environ.get("INFERD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "server"))
import http_integration as hi  # noqa: E402  (Server, free_port, make_model, check, Fail, TMP)

BENCH = os.path.join(SRC, "scripts", "bench_serve.py")
check = hi.check


def bench(port, *args, expect_rc=0):
    out = os.path.join(hi.TMP, f"bench-{time.monotonic_ns()}.json")
    r = subprocess.run([sys.executable, BENCH, "--base-url", f"http://127.0.0.1:{port}/v1", "--timeout", "120",
                        "--json", out, *args], capture_output=True, text=True, timeout=600)
    sys.stdout.write(r.stdout)
    check(r.returncode == expect_rc, f"bench_serve rc {r.returncode} (expected {expect_rc}):\n{r.stdout}\n{r.stderr}")
    with open(out) as f:
        return json.load(f)


def check_run(d, n, out_tokens, prompt_tokens=None):
    check(d["completed"] == n and d["failed"] == 0, f"completed {d['completed']} failed {d['failed']}: {d['errors']}")
    check(d["output_token_mismatches"] == 0 and d["requests_without_usage"] == 0, "usage / output counts")
    for r in d["requests"]:
        check(r["ok"] and r["completion_tokens"] == out_tokens, f"request {r}")
        check(r["ttft_ms"] > 0 and r["latency_ms"] >= r["ttft_ms"], f"times {r}")
        if prompt_tokens is not None:
            check(r["prompt_tokens"] == prompt_tokens, f"prompt tokens {r['prompt_tokens']} != {prompt_tokens}")
    check(d["total_output_tokens"] == n * out_tokens, "total output tokens")
    for k in ("ttft_ms", "e2el_ms", "tpot_ms"):
        check(d[k]["n"] > 0 and d[k]["mean"] > 0 and d[k]["median"] > 0 and d[k]["p99"] > 0, f"{k} {d[k]}")
    # One ITL sample per gap between content chunks.  How many chunks a stream has is timing: the
    # server merges the tokens a slow reader has not yet taken into one chunk (a loaded CI machine
    # can get a 4-token reply in one), so the count is checked against the chunks, not against > 0.
    gaps = sum(max(r["chunks"] - 1, 0) for r in d["requests"] if r["ok"])
    check(d["itl_ms"]["n"] == gaps, f"itl samples {d['itl_ms']['n']} != chunk gaps {gaps}")
    check(gaps == 0 or (d["itl_ms"]["min"] >= 0 and d["itl_ms"]["p99"] >= d["itl_ms"]["median"]), f"itl {d['itl_ms']}")
    check(all(1 <= r["chunks"] <= out_tokens for r in d["requests"] if r["ok"]), "chunks per stream within 1..tokens")
    check(d["request_throughput"] > 0 and d["output_throughput"] > 0, "throughput")
    check(d["total_token_throughput"] > d["output_throughput"], "total token throughput counts prompts")
    check(d["max_inflight"] <= d["concurrency"], "concurrency cap")


def case_inferd():
    with hi.Server(hi.make_model(), "-np", "4") as s:
        d = bench(s.port, "--endpoint", "completions", "--token-prompts", "--num-requests", "12",
                  "--concurrency", "4", "--prompt-tokens", "16", "--output-tokens", "8", "--warmup", "1")
        check_run(d, 12, 8, prompt_tokens=16)
        check(d["model"] == "tiny.gguf" and "exact" in d["prompt_method"], f"model/prompts {d['model']} {d['prompt_method']}")
        # chat, text prompts calibrated with /tokenize, a two-level sweep with the TTFT ratio
        d = bench(s.port, "--endpoint", "chat", "--num-requests", "4", "--sweep-concurrency", "1,2", "--ttft-ratio",
                  "--prompt-tokens", "16", "--output-tokens", "4")
        check(len(d["sweep"]) == 2 and d["ttft_ratio"]["ratio"] > 0, f"sweep {d.get('ttft_ratio')}")
        for run in d["sweep"]:
            check_run(run, 4, 4)
        check("/tokenize" in d["prompt_method"], d["prompt_method"])
        # a server-side rejection is a counted failure with the server's message, rc 1
        d = bench(s.port, "--num-requests", "2", "--prompt-tokens", "8", "--output-tokens", "100000", expect_rc=1)
        check(d["failed"] == 2 and any("maximum context length" in m for m in d["errors"]), f"errors {d['errors']}")


# ---- a fake OpenAI server -----------------------------------------------------------------------

def sse_events(model, n):
    ev = [{"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}
          for i in range(n)]
    ev[-1]["choices"][0]["finish_reason"] = "length"
    ev.append({"id": "x", "object": "text_completion", "choices": [],
               "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}})
    return [b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in ev]


class Fake(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "split"

    def log_message(self, *a):
        pass

    def send_json(self, status, obj):
        b = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self.send_json(404, {"error": {"message": "no such route", "type": "x", "param": None, "code": None}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":
            return self.send_json(404, {"error": {"message": "no such route", "type": "x", "param": None, "code": None}})
        mode = Fake.mode
        n = body["max_tokens"]
        assert body["stream"] and body["stream_options"]["include_usage"] and body["ignore_eos"]
        if mode == "http500":
            return self.send_json(500, {"error": {"message": "engine on fire", "type": "server_error", "param": None, "code": None}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if mode == "nodone":
            self.send_header("Connection", "close")
            self.end_headers()
            for e in sse_events("m", n):
                self.wfile.write(e)
            self.close_connection = True
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(b):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
            self.wfile.flush()

        events = sse_events("m", n)
        if mode == "short":
            events[-1] = events[-1].replace(b'"completion_tokens": %d' % n, b'"completion_tokens": %d' % (n - 1))
        if mode == "error":
            events = events[:2] + [b'data: {"error": {"message": "slot lost", "type": "server_error"}}\r\n\r\n']
        if mode == "reset":
            chunk(events[0])
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.connection.close()
            self.close_connection = True
            return
        stream = b": a comment line\r\n\r\n" + b"".join(events) + b"data: [DONE]\r\n\r\n"
        # split everywhere: single bytes, across "data:", across CRLF, across JSON
        i, step = 0, 1
        while i < len(stream):
            chunk(stream[i:i + step])
            i += step
            step = step % 7 + 1
            if i < 40:
                time.sleep(0.001)
        chunk(b"")


def case_fake():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    port = srv.server_address[1]
    try:
        Fake.mode = "split"
        d = bench(port, "-n", "6", "-c", "3", "--prompt-tokens", "5", "--output-tokens", "6")
        check_run(d, 6, 6)
        check(d["model"] == "fake-model" and "heuristic" in d["prompt_method"], f"{d['model']} {d['prompt_method']}")
        check(all(r["chunks"] == 6 for r in d["requests"]), "every content chunk seen once")
        Fake.mode = "short"  # the server ignores ignore_eos: reported, not failed
        d = bench(port, "-n", "2", "--output-tokens", "4")
        check(d["completed"] == 2 and d["output_token_mismatches"] == 2 and d["mismatched_output_counts"] == [3], str(d))
        for mode, want in (("http500", "HTTP 500: engine on fire"), ("error", "in-stream error: slot lost"),
                           ("nodone", "stream ended without data: [DONE]"), ("reset", "")):
            Fake.mode = mode
            d = bench(port, "-n", "3", "-c", "2", "--output-tokens", "4", expect_rc=1)
            check(d["completed"] == 0 and d["failed"] == 3, f"{mode}: {d['completed']} completed")
            check(all(want in m for m in d["errors"]) and sum(d["errors"].values()) == 3, f"{mode}: {d['errors']}")
        # a server that is not there: a setup error, rc 2
        r = subprocess.run([sys.executable, BENCH, "--base-url", f"http://127.0.0.1:{hi.free_port()}/v1", "-n", "1"],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and "bench_serve:" in r.stderr, f"no server: rc {r.returncode} {r.stderr}")
    finally:
        srv.shutdown()
        srv.server_close()


CASES = {"inferd": case_inferd, "fake": case_fake}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(CASES)}")
    if sys.argv[1] == "inferd" and not os.path.exists(hi.BIN):
        sys.exit(f"INFERD_BIN {hi.BIN} does not exist")
    rc = 0
    try:
        CASES[sys.argv[1]]()
        print(f"PASS {sys.argv[1]}")
    except hi.Fail as e:
        print(f"FAIL {sys.argv[1]}: {e}")
        rc = 1
    finally:
        shutil.rmtree(hi.TMP, ignore_errors=True)
    sys.exit(rc)
