#!/usr/bin/env python3
"""Integration tests of the grammar's bounds (issue 36): hostile grammars against the real
inferd on 127.0.0.1 (started and stopped by PID, helpers from http_integration.py).

usage: grammar_limits.py CASE      (CASE: bombs shutdown tools)
Exit 0 = pass, 77 = skipped, anything else = failure.  Every wait is bounded; the bounds are
stated in each case."""
import json
import os
import re
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_integration as hi  # noqa: E402
from http_integration import Server, check, check_error, make_model, post  # noqa: E402

PATTERN_BOMB = "^x((a{0,8}){0,8}){0,8}b$"
# Each took minutes on one thread before (123 s, 142 s, > 10 min): the scheduler's, which every
# running request waits for, or an HTTP worker's.
BOMBS = [
    {"response_format": {"type": "json_schema",
                         "json_schema": {"name": "bomb", "schema": {"type": "string", "pattern": PATTERN_BOMB}}}},
    {"guided_regex": "x((((((a{0,8}){0,8}){0,8}){0,8}){0,8}){0,8}){0,8}b"},
    {"grammar": 'root ::= ((("a"{0,8}){0,8}){0,8}) "b"'},
]
PLAIN = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "ignore_eos": True}


def bomb_model():
    """Tiny random weights over the real Qwen2 vocabulary when ../shared has it (151k tokens: a
    first mask walks them all, as in the issue's report), else the tiny model's 1k."""
    vocab = os.path.join(hi.SHARED, "vocab", "ggml-vocab-qwen2.gguf")
    return make_model("qwen2.gguf", "--vocab", vocab) if os.path.exists(vocab) else make_model()


def chat(port, extra, timeout):
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 16, "temperature": 1.0, "seed": 7}
    body.update(extra)
    return post(port, "/v1/chat/completions", body, timeout=timeout)


def plain_latency(port, n):
    """The median of n plain 4-token chats, one after another (each bounded by 60 s)."""
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        st, b = post(port, "/v1/chat/completions", PLAIN, timeout=60)
        check(st == 200, f"plain chat: {st} {b}")
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def case_bombs():
    """The bombs finish (each within 120 s; they take about a second in a release build) and,
    while they run, a plain chat's median latency stays under three times its solo median plus
    1.5 s (before, the plain chat took 64 s). The slack is for what batching honestly costs: the
    plain chat's steps also carry six masked rows, and a sanitizer build masks 151k tokens slowly
    (release: 50 ms solo, 55 ms beside; ASan in CI: 0.66 s solo, 1.84 s beside, with CI's other
    tests sharing the two cores). A stall of the scheduler thread is seconds at least.
    Three samples each: a sanitizer build over the 151k vocabulary takes seconds per chat."""
    with Server(bomb_model(), "-np", "8") as s:  # a free slot for the plain chat: no queueing
        plain_latency(s.port, 1)  # warm-up
        solo = plain_latency(s.port, 3)
        results = [None] * (2 * len(BOMBS))

        def run(i):
            try:
                results[i] = chat(s.port, BOMBS[i % len(BOMBS)], timeout=120)
            except OSError as e:
                results[i] = e
        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(results))]
        for t in threads:
            t.start()
        time.sleep(0.2)  # in flight: compiling, masking, decoding
        loaded = plain_latency(s.port, 3)
        for t in threads:
            t.join(timeout=120)
        print(f"plain chat median: solo {solo * 1000:.0f} ms, beside {len(results)} bombs {loaded * 1000:.0f} ms")
        check(loaded < 3 * solo + 1.5, f"plain chat beside the bombs: {loaded:.3f} s vs {solo:.3f} s alone")
        for i, r in enumerate(results):
            check(isinstance(r, tuple), f"bomb {i} did not answer within 120 s: {r!r}")
            st, b = r
            check(st == 200, f"bomb {i}: {st} {b}")
            ch = b["choices"][0]
            text = ch["message"]["content"]
            check(ch["finish_reason"] in ("stop", "length"), f"bomb {i}: {ch}")
            if i % len(BOMBS) == 0 and ch["finish_reason"] == "stop":
                value = json.loads(text)
                check(value.startswith("x") and value.endswith("b") and set(value[1:-1]) <= {"a"},
                      f"bomb {i}: {text!r} is not in the pattern's language")


def case_shutdown():
    """SIGTERM while bombs compile and decode: the process exits within --shutdown-timeout (2 s)
    plus the 2 s that clients get to read their last bytes and 4 s of slack (8 s in all; before,
    a worker held MHD_stop_daemon for over ten minutes)."""
    s = Server(bomb_model(), "-np", "4", "--http-threads", "4", "--shutdown-timeout", "2")
    try:
        outcomes = []

        def run(extra):
            try:
                st, _, raw = hi.request(s.port, "POST", "/v1/chat/completions",
                                        dict(PLAIN, max_tokens=200, temperature=1.0, **extra), timeout=30)
                outcomes.append((st, raw[-120:]))
            except OSError as e:
                outcomes.append(e)
        # and one that runs on: two letters to choose from, the end only after 'b'
        long_bomb = {"guided_regex": "x(((a|c){0,8}){0,8}){0,8}b", "stream": True}
        for i in range(8):
            threading.Thread(target=run, args=((BOMBS + [long_bomb])[i % 4],), daemon=True).start()
        time.sleep(0.5)
        t0 = time.monotonic()
        s.terminate()
        try:
            rc = s.proc.wait(timeout=8)
        except hi.subprocess.TimeoutExpired:
            raise hi.Fail("the server did not exit within 8 s of SIGTERM during the bombs")
        print(f"exited {time.monotonic() - t0:.2f} s after SIGTERM, status {rc}")
        time.sleep(0.5)  # the clients read what the drain sent them
        for o in outcomes:
            print("  ", o)
        check(len(outcomes) == 8 and all(isinstance(o, tuple) and o[0] in (200, 503) for o in outcomes),
              f"every bomb answered (done, or cut by the shutdown): {outcomes}")
        s.log.close()
        s.check_log()
        check(rc == 0, f"exit status {rc}:\n{s.tail()}")
    finally:
        s.kill()


def case_tools():
    """Forced tool calls: a function name that is call markup is a 400 (it used to end the call
    early, so "required" came back as text); a forced call's arguments have at most single spaces
    for whitespace; a tool set over the grammar's rule limit and a grammar that matches nothing
    are 400s (they were 500s or an error after the prompt)."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    with Server(make_model(), "-np", "2") as s:
        bad = json.loads(json.dumps(weather))
        bad["function"]["name"] = 'x"}\n</tool_call>'
        st, b = post(s.port, "/v1/chat/completions", {"messages": ask, "tools": [bad], "tool_choice": "required"})
        check_error(b, st, 400, "tools")
        for seed in range(4):
            st, b = post(s.port, "/v1/chat/completions", {"messages": ask, "tools": [weather], "tool_choice": "required",
                                                          "max_tokens": 200, "temperature": 1.0, "seed": seed})
            check(st == 200, f"forced call: {st} {b}")
            ch = b["choices"][0]
            check(ch["finish_reason"] == "tool_calls", f"forced call: {ch}")
            args = ch["message"]["tool_calls"][0]["function"]["arguments"]
            # the layout between tokens: the string values blanked (the random model may write
            # two spaces inside a city's name, which is content, not layout)
            layout = re.sub(r'"(?:[^"\\]|\\.)*"', '""', args)
            check(json.loads(args)["city"] is not None and "\n" not in layout and "  " not in layout,
                  f"forced call arguments with layout: {args!r}")
        # 40 functions of 150 enum-valued properties: over the grammar's 20000 rules together
        props = {f"p{k}": {"enum": [f"v{k}a", f"v{k}b"]} for k in range(150)}
        many = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
            "type": "object", "properties": props, "required": list(props)}}} for i in range(40)]
        st, b = post(s.port, "/v1/chat/completions", {"messages": ask, "tools": many, "tool_choice": "required"})
        check_error(b, st, 400, "tools")
        st, b = post(s.port, "/v1/chat/completions", {"messages": ask, "grammar": 'root ::= "a" x\nx ::= [^\\x00-\\U0010FFFF]'})
        check_error(b, st, 400, "grammar")
        check("matches no string" in b["error"]["message"], f"the reason: {b}")


if __name__ == "__main__":
    hi.main({name[5:]: fn for name, fn in globals().items() if name.startswith("case_")})
