#!/usr/bin/env python3
"""Integration tests of inferd as a service: the real binary ($INFERD_BIN) on a free 127.0.0.1
port, stopped by its PID; helpers come from tests/server/http_integration.py.  Every wait is
bounded and no assertion depends on how fast the machine is.

usage: service_integration.py CASE
  notify     sd_notify over a fake $NOTIFY_SOCKET: STATUS= while loading, READY=1 only once
             GET /health answers 200, WATCHDOG=1 pings, SIGTERM with a stream in flight ->
             STOPPING=1, the stream ends cleanly, exit 0
  sighup     --log-file: rename the file, SIGHUP, new lines go to a new file
  reqlog     one log line per request with id/status/tokens/TTFT/total/finish (text and JSON)
  config     --config file with the command line overriding it
  badconfig  bad or unreadable config files: exit 78 with FILE:LINE: reason
  install    meson install --destdir: binary, unit, example config (kept on reinstall)
  unit       systemd-analyze verify on the generated unit (skipped without systemd-analyze)
Exit 0 = pass, 77 = skipped, anything else = failure."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
import http_integration as hi  # noqa: E402  (free_port, make_model, Server, request, check)

from http_integration import BIN, SKIP, Fail, Server, check, request  # noqa: E402

BUILD = os.environ.get("INFERD_BUILD_DIR", os.path.dirname(os.path.abspath(BIN)))
TMP = tempfile.mkdtemp(prefix="inferd-svc-")


def wait_for(what, fn, seconds=60, step=0.05):
    """Poll fn() until it returns something truthy; bounded."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(step)
    raise Fail(f"timed out after {seconds} s waiting for {what}")


# ---- notify -----------------------------------------------------------------------------------

class NotifySocket:
    """The systemd side of sd_notify: an AF_UNIX datagram socket; every message is kept with
    its arrival order.  on_message(msg) runs on the receiving thread as each one arrives."""

    def __init__(self, on_message=None):
        self.path = os.path.join(TMP, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages = []
        self.lock = threading.Lock()
        self.on_message = on_message
        self.done = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done:
            try:
                data = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.on_message:
                self.on_message(data)
            with self.lock:
                self.messages.append(data)

    def snapshot(self):
        with self.lock:
            return list(self.messages)

    def index(self, prefix):
        """Position of the first message starting with prefix, else None."""
        for i, m in enumerate(self.snapshot()):
            if m.startswith(prefix):
                return i
        return None

    def close(self):
        self.done = True
        self.thread.join(timeout=5)
        self.sock.close()


def case_notify():
    model = hi.make_model("long.gguf", "--n-ctx", "8192")
    port = hi.free_port()
    health_at_ready = []

    def on_message(msg):
        # READY=1 promises a serving server: ask right away, before anything else happens.
        if msg == "READY=1":
            try:
                health_at_ready.append(request(port, "GET", "/health", timeout=30)[0])
            except OSError as e:
                health_at_ready.append(str(e))

    ns = NotifySocket(on_message)
    env = dict(os.environ, NOTIFY_SOCKET=ns.path, WATCHDOG_USEC="400000")
    env.pop("WATCHDOG_PID", None)
    log_path = os.path.join(TMP, "notify.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([BIN, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port),
                                 "--threads", "1", "-np", "2", "-c", "8192", "--shutdown-timeout", "120"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for("READY=1", lambda: ns.index("READY=1") is not None or proc.poll() is not None, 120)
        check(proc.poll() is None, "server exited before READY=1:\n" + open(log_path).read()[-2000:])
        msgs = ns.snapshot()
        ready = ns.index("READY=1")
        check(any(m.startswith("STATUS=loading") for m in msgs[:ready]), f"STATUS= while loading: {msgs}")
        check(any(m.startswith("STATUS=warming up") for m in msgs[:ready]), f"STATUS= for the warm-up: {msgs}")
        wait_for("the /health check made on READY=1", lambda: health_at_ready, 60)
        check(health_at_ready[0] == 200, f"/health when READY=1 arrived: {health_at_ready[0]}")
        # The daemon's own GET /health got its 200 before READY=1 (its access-log line may come
        # later: MHD logs a request once the response is out, on another thread).
        text = open(log_path).read()
        check(re.search(r"ready in \S+ \(GET /health answered 200\)", text),
              "the self-check is reported in the ready line:\n" + text[-2000:])
        wait_for("STATUS=serving", lambda: ns.index("STATUS=serving") is not None, 30)

        # watchdog pings (every 200 ms for WATCHDOG_USEC=400000); the wedged-step case is
        # tests/sched/test_heartbeat.c
        wait_for("2 WATCHDOG=1 pings", lambda: ns.snapshot().count("WATCHDOG=1") >= 2, 60)
        sock = hi.open_stream(port, 1500)
        n = ns.snapshot().count("WATCHDOG=1")
        wait_for("a WATCHDOG=1 ping after a stream started", lambda: ns.snapshot().count("WATCHDOG=1") > n, 60)

        # SIGTERM with the stream in flight
        os.kill(proc.pid, signal.SIGTERM)
        wait_for("STOPPING=1", lambda: ns.index("STOPPING=1") is not None, 60)
        body = hi.read_stream_to_end(sock, 120)
        sock.close()
        check("data: [DONE]" in body, f"stream end: {body[-300:]!r}")
        check('"finish_reason":"length"' in body or '"code":"shutting_down"' in body,
              f"stream completed or was cleanly cancelled: {body[-300:]!r}")
        rc = proc.wait(timeout=180)
        hi.check_no_sanitizer_report(open(log_path, errors="replace").read(), "the server log")
        check(rc == 0, f"exit code {rc} after SIGTERM:\n" + open(log_path).read()[-2000:])
        msgs = ns.snapshot()
        check(msgs.index("STOPPING=1") > msgs.index("READY=1"), "STOPPING=1 after READY=1")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        ns.close()


# ---- sighup -----------------------------------------------------------------------------------

def completion(port, max_tokens=3, **extra):
    body = {"prompt": "Hello world", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra}
    st, out = hi.post(port, "/v1/completions", body)
    check(st == 200, f"completion: {st} {out}")
    return out


def case_sighup():
    log = os.path.join(TMP, "inferd.log")
    rotated = log + ".1"
    with Server(hi.make_model(), "--log-file", log) as s:
        first = completion(s.port)["id"]
        wait_for("the first request line", lambda: first in open(log).read(), 30)
        os.rename(log, rotated)
        os.kill(s.proc.pid, signal.SIGHUP)
        wait_for("a new log file after SIGHUP", lambda: os.path.exists(log), 30)
        wait_for("the reopen line", lambda: "log file reopened" in open(log).read(), 30)
        second = completion(s.port)["id"]
        wait_for("the second request line in the new file", lambda: second in open(log).read(), 30)
        check(s.proc.poll() is None, "SIGHUP does not stop the server")
    old, new = open(rotated).read(), open(log).read()
    check(first in old and second not in old, "the rotated file has the old lines only")
    check(first not in new and second in new, "the new file has the new lines only")
    check("stopped" in new, "shutdown logged to the new file")


# ---- reqlog -----------------------------------------------------------------------------------

def three_requests(port):
    """A whole completion, a streamed chat and a bad request; returns their ids and usage."""
    whole = completion(port, max_tokens=4)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps({
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True}),
        headers={"Content-Type": "application/json"})
    events = hi.sse_events(c.getresponse().read().decode())
    c.close()
    usage = [e for e in events if isinstance(e, dict) and e.get("usage")][-1]
    st, bad = hi.post(port, "/v1/completions", {"prompt": "x", "max_tokens": -1})
    check(st == 400, f"bad request: {st}")
    return whole, usage, events[0]["id"]


def case_reqlog():
    for fmt in ("text", "json"):
        with Server(hi.make_model(), "--log-format", fmt) as s:
            whole, stream_usage, stream_id = three_requests(s.port)
        lines = open(s.log_path).read().splitlines()
        if fmt == "json":
            parsed = [json.loads(line) for line in lines if line.strip()]  # every line parses
            reqs = [p for p in parsed if p["msg"] == "request"]
        else:
            reqs = []
            for line in lines:
                m = re.match(r"\S+ (\w+)\s+request (.*)$", line)
                if m and "status=" in m.group(2):
                    fields = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', m.group(2)))
                    reqs.append({k: (v.strip('"') if not re.fullmatch(r"-?[0-9.]+", v) else float(v))
                                 for k, v in fields.items()})

        def one(req_id):
            found = [r for r in reqs if r.get("id") == req_id]
            check(len(found) == 1, f"{fmt}: exactly one line for {req_id}, got {found}")
            return found[0]

        r = one(whole["id"])
        check(r["status"] == 200 and r["path"] == "/v1/completions", f"{fmt}: {r}")
        check(r["prompt_tokens"] == whole["usage"]["prompt_tokens"], f"{fmt}: prompt_tokens {r}")
        check(r["completion_tokens"] == 4 and r["finish"] == "length", f"{fmt}: {r}")
        check(0 <= r["ttft_ms"] <= r["total_ms"], f"{fmt}: ttft/total {r}")
        r = one(stream_id)
        check(r["status"] == 200 and r["completion_tokens"] == stream_usage["usage"]["completion_tokens"],
              f"{fmt}: stream {r}")
        check(r["prompt_tokens"] == stream_usage["usage"]["prompt_tokens"], f"{fmt}: stream prompt {r}")
        bad = [r for r in reqs if r.get("status") == 400]
        check(len(bad) == 1 and bad[0]["completion_tokens"] == 0 and "max_tokens" in bad[0].get("error", ""),
              f"{fmt}: the 400 line names its error {bad}")
        check(bad[0]["ttft_ms"] in (None, "-") and bad[0]["finish"] in (None, "-"), f"{fmt}: no ttft/finish {bad}")
        check(any(r.get("path") == "/health" and "id" not in r for r in reqs), f"{fmt}: plain request lines")
        text = "\n".join(lines)
        check("inferd " in text and "starting" in text and "ready in" in text, f"{fmt}: start-up summary")


# ---- config -----------------------------------------------------------------------------------

def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def case_config():
    conf = write("good.conf", "# test\nparallel = 3\nport = 1\nmodel-alias = from-file\nlog-format = json\n")
    # Server passes --port/--host itself: the command line wins over `port = 1`
    with Server(hi.make_model(), "--config", conf, "--log-format", "text") as s:
        st, _, body = request(s.port, "GET", "/v1/models")
        check(st == 200 and json.loads(body)["data"][0]["id"] == "from-file", f"alias from the file: {body}")
    text = open(s.log_path).read()
    check("parallel=3" in text and f"port={s.port}" in text, "file value and command-line override logged")
    check(not text.lstrip().startswith("{"), "--log-format text on the command line beat json in the file")
    check(f"config file: {conf}" in text, "the config file is named in the start-up line")


def case_badconfig():
    model = hi.make_model()
    cases = [
        ("bad1.conf", "port = 8080\n\nbogus = 1\n", ":3: unknown key 'bogus'"),
        ("bad2.conf", "# x\nparallel = many\n", ":2: option 'parallel': 'many' is not an integer"),
        ("bad3.conf", "just words\n", ":1: expected 'key = value'"),
    ]
    for name, text, want in cases:
        path = write(name, text)
        r = hi.run_bin("-m", model, "--port", str(hi.free_port()), "--config", path)
        check(r.returncode == 78, f"{name}: exit {r.returncode}, want 78: {r.stderr}")
        check(path + want in r.stderr, f"{name}: stderr {r.stderr!r} lacks {path + want!r}")
    missing = os.path.join(TMP, "missing.conf")
    r = hi.run_bin("-m", model, "--config", missing)
    check(r.returncode == 78 and missing in r.stderr and "cannot open" in r.stderr, f"missing: {r.stderr}")
    r = hi.run_bin("-m", model, "--config", TMP)  # a directory
    check(r.returncode == 78 and TMP in r.stderr, f"directory: {r.returncode} {r.stderr}")


# ---- install and unit -------------------------------------------------------------------------

def build_options():
    meson = shutil.which("meson")
    if not meson:
        return None, None
    out = subprocess.run([meson, "introspect", "--buildoptions", BUILD], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return meson, {o["name"]: o["value"] for o in json.loads(out)}


def case_install():
    meson, opts = build_options()
    if not meson:
        print("SKIP: meson is not on PATH")
        return SKIP
    prefix = opts["prefix"]

    def under(p):
        return os.path.join(prefix, p)  # an absolute p stays as it is

    dest = os.path.join(TMP, "destdir")
    bindir, sysconf = under(opts["bindir"]), under(opts["sysconfdir"])
    unitdir = opts["systemdunitdir"] or os.path.join(prefix, "lib/systemd/system")
    docdir = os.path.join(under(opts["datadir"]), "doc", "inferd")

    def install():
        r = subprocess.run([meson, "install", "-C", BUILD, "--destdir", dest, "--no-rebuild"],
                           capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, f"meson install failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")

    install()
    exe = dest + os.path.join(bindir, "inferd")
    unit = dest + os.path.join(unitdir, "inferd.service")
    conf = dest + os.path.join(sysconf, "inferd", "inferd.conf")
    for path in (exe, unit, conf, dest + os.path.join(docdir, "README.md"),
                 dest + os.path.join(docdir, "inferd.conf.example")):
        check(os.path.isfile(path), f"not installed: {path}")
    check(os.access(exe, os.X_OK), "the binary is executable")
    text = open(unit).read()
    check(f"ExecStart={os.path.join(bindir, 'inferd')} serve --config ${{CREDENTIALS_DIRECTORY}}/inferd.conf" in text,
          f"ExecStart names the installed binary: {text}")
    check(f"LoadCredential=inferd.conf:{os.path.join(sysconf, 'inferd', 'inferd.conf')}\n" in text, "config path")
    check("@" not in re.sub(r"#.*", "", text), "every @VAR@ substituted")
    check(open(conf).read() == open(os.path.join(hi.SRC, "config", "inferd.conf")).read(), "example config")
    # it may come to hold api-key: readable by the owner and the group only
    check(os.stat(conf).st_mode & 0o777 == 0o640, f"config mode {oct(os.stat(conf).st_mode & 0o777)}, expected 0640")
    # a reinstall keeps the administrator's edits
    with open(conf, "a") as f:
        f.write("port = 9999\n")
    install()
    check(open(conf).read().endswith("port = 9999\n"), "reinstall overwrote the edited config")


def case_unit():
    sa = shutil.which("systemd-analyze")
    if not sa:
        print("SKIP: systemd-analyze is not installed (scripts/install-deps --test installs systemd)")
        return SKIP
    built = os.path.join(BUILD, "inferd.service")
    text = open(built).read()
    for want in ("Type=notify", "NotifyAccess=main", "WatchdogSec=", "DynamicUser=yes", "ProtectSystem=strict",
                 "ProtectHome=yes", "PrivateTmp=yes", "NoNewPrivileges=yes", "DevicePolicy=closed",
                 "DeviceAllow=char-nvidia-frontend rw", "ReadOnlyPaths=", "LimitMEMLOCK=", "LoadCredential="):
        check(re.search(r"^" + re.escape(want), text, re.M), f"the unit lacks {want}")
    # verify checks that ExecStart's binary exists: point a copy at the binary just built
    unit_dir = os.path.join(TMP, "unit")
    os.makedirs(unit_dir)
    copy = os.path.join(unit_dir, "inferd.service")
    with open(copy, "w") as f:
        f.write(re.sub(r"^ExecStart=\S+", "ExecStart=" + os.path.abspath(BIN), text, flags=re.M))
    r = subprocess.run([sa, "verify", copy], capture_output=True, text=True, timeout=120)
    out = (r.stdout + r.stderr).strip()
    check(r.returncode == 0 and not out, f"systemd-analyze verify (rc {r.returncode}):\n{out}")
    # and it does catch a broken unit (so the clean result above means something)
    with open(copy, "w") as f:
        f.write(text.replace("Type=notify", "Type=notify\nNoSuchSetting=1"))
    r = subprocess.run([sa, "verify", copy], capture_output=True, text=True, timeout=120)
    check("NoSuchSetting" in r.stdout + r.stderr, "verify reports unknown settings")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    hi.main(CASES, TMP)
