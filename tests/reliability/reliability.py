#!/usr/bin/env python3
"""Reliability tests of the real inferd binary ($INFERD_BIN); helpers (Server, run_bin, ...)
come from tests/server/http_integration.py.  Every wait is bounded; servers listen on
127.0.0.1 only and are stopped by PID.

usage: reliability.py CASE
  badmodel   truncated / corrupted / shape-mismatched / non-GGUF model files: `serve` exits 1
             with a message naming the problem, no sanitizer report, nothing left listening
  memory     -np / -c beyond the machine's memory: refused at start-up with the numbers (each
             KV buffer too big alone, and K + V together too big)
  valgrind   the server under valgrind memcheck serves completions (stream and not, chat, n x
             prompts, concurrent streams, a client hang-up, a bad request) and exits 0 on a
             SIGTERM with a stream running: no errors, no definite leaks
             (skipped in sanitizer builds: valgrind and ASan do not mix)
Exit 0 = pass, 77 = skipped, anything else = failure."""
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
import http_integration as hi  # noqa: E402

from http_integration import SKIP, TMP, Fail, Server, check, free_port, make_model, post, request, run_bin  # noqa: E402


# ---- bad model files ---------------------------------------------------------------------------

def patched(src, name, edit):
    """A copy of the GGUF file src, edited by edit(bytearray) in place."""
    data = bytearray(open(src, "rb").read())
    edit(data)
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def after(data, needle):
    """Offset just past the one occurrence of needle (a key or tensor name) in the file."""
    i = data.find(needle)
    check(i > 0 and data.find(needle, i + 1) < 0, f"{needle!r} not found once in the model file")
    return i + len(needle)


def set_u32_key(key, value):
    """Edit: the u32 metadata value of key (its name, then type 4 = u32, then the value)."""
    def edit(d):
        i = after(d, key.encode())
        check(struct.unpack_from("<I", d, i)[0] == 4, f"{key} is not a u32")
        struct.pack_into("<I", d, i + 4, value)
    return edit


def tensor_info(tensor, fmt, field_offset, value):
    """Edit: a field of a tensor's info (after its name: n_dims u32, dims u64 x n, type u32,
    offset u64); field_offset counts from the end of the name."""
    def edit(d):
        struct.pack_into(fmt, d, after(d, tensor.encode()) + field_offset, value)
    return edit


def port_closed(port):
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def expect_refused(path, *words, extra=()):
    """`serve -m path` must exit 1 (not a signal, not a hang) naming the problem."""
    port = free_port()
    r = run_bin("-m", path, "--host", "127.0.0.1", "--port", str(port), "--threads", "1", "--device", "cpu",
                *extra, timeout=120)
    what = f"{os.path.basename(path)} {' '.join(extra)}: exit {r.returncode}\n{r.stderr[-1500:]}"
    check(r.returncode == 1, "expected exit 1: " + what)
    for w in words:
        check(w in r.stderr, f"the error does not say {w!r}: " + what)
    for bad in ("AddressSanitizer", "runtime error:", "LeakSanitizer", "Segmentation"):
        check(bad not in r.stderr, "sanitizer/crash report: " + what)
    check(port_closed(port), f"something still listens on {port} after a failed start: " + what)
    line = [l for l in r.stderr.splitlines() if "error" in l]
    msg = line[-1].split(" error ", 1)[-1].rsplit(path + ": ", 1)[-1] if line else ""
    print(f"ok  {os.path.basename(path):<20} {msg[:150]}")


def case_badmodel():
    good = make_model()
    data = open(good, "rb").read()
    n = len(data)
    text = os.path.join(TMP, "notes.gguf")
    with open(text, "w") as f:
        f.write("This is a text file, not a model.\n" * 20)
    empty = os.path.join(TMP, "empty.gguf")
    open(empty, "w").close()
    folder = os.path.join(TMP, "folder.gguf")
    os.mkdir(folder)
    cases = [
        # truncated: in the tensor data, in the tensor infos, in the header
        (patched(good, "trunc-data.gguf", lambda d: d.__delitem__(slice(n // 2, None))), ["past end of file"]),
        (patched(good, "trunc-infos.gguf", lambda d: d.__delitem__(slice(after(d, b"output_norm.weight"), None))),
         ["output_norm.weight"]),
        (patched(good, "trunc-header.gguf", lambda d: d.__delitem__(slice(20, None))), ["metadata count", "truncated"]),
        # header bytes flipped
        (patched(good, "magic.gguf", lambda d: d.__setitem__(slice(0, 4), b"GGUX")), ["bad magic", "offset 0"]),
        (patched(good, "version.gguf", lambda d: struct.pack_into("<I", d, 4, 99)), ["version"]),
        (patched(good, "n-tensors.gguf", lambda d: struct.pack_into("<Q", d, 8, 1 << 40)), ["tensor count"]),
        (patched(good, "n-kv.gguf", lambda d: struct.pack_into("<Q", d, 16, 1 << 40)), ["metadata count"]),
        # tensor infos flipped: n_dims, type, data offset
        (patched(good, "n-dims.gguf", tensor_info("token_embd.weight", "<I", 0, 77)), ["token_embd.weight", "n_dims 77"]),
        (patched(good, "type.gguf", tensor_info("token_embd.weight", "<I", 4 + 16, 250)),
         ["token_embd.weight", "unknown tensor type 250"]),
        (patched(good, "offset.gguf", tensor_info("token_embd.weight", "<Q", 4 + 16 + 4, 1 << 50)),
         ["token_embd.weight", "past end of file"]),
        # tensors that do not match the metadata
        (patched(good, "n-embd.gguf", set_u32_key("llama.embedding_length", 96)),
         ["token_embd.weight", "expected shape [96, 1024]", "[64, 1024]"]),
        (patched(good, "vocab.gguf", set_u32_key("llama.vocab_size", 2048)), ["vocab_size 2048", "1024"]),
        (patched(good, "blocks.gguf", set_u32_key("llama.block_count", 3)), ["block_count 3"]),
        (patched(good, "ff.gguf", set_u32_key("llama.feed_forward_length", 256)), ["ffn", "256"]),
        # not GGUF at all
        (text, ["bad magic"]), (empty, ["empty file"]), (folder, ["not a regular file"]),
    ]
    # general.architecture of the wrong type (a u32: llama.context_length, of the same name
    # length, renamed onto it) is "the wrong type", not "missing"
    def wrong_type_arch(d):
        i = after(d, b"general.architecture") - len(b"general.architecture")
        d[i:i + 20] = b"general.architecturf"
        j = after(d, b"llama.context_length") - len(b"llama.context_length")
        d[j:j + 20] = b"general.architecture"
    cases.append((patched(good, "arch-type.gguf", wrong_type_arch), ["general.architecture", "wrong type"]))
    for path, words in cases:
        expect_refused(path, *words)
    # a FIFO opened for reading waits for a writer: it must be refused at once, not hang
    fifo = os.path.join(TMP, "fifo.gguf")
    os.mkfifo(fifo)
    t0 = time.time()
    expect_refused(fifo, "not a regular file")
    check(time.time() - t0 < 30, f"a FIFO model took {time.time() - t0:.1f} s to refuse")


# ---- memory ------------------------------------------------------------------------------------

def mem_total_mib():
    with open("/proc/meminfo") as f:
        return int(re.search(r"^MemTotal:\s+(\d+) kB", f.read(), re.M).group(1)) // 1024


def case_memory():
    model = make_model()
    # tiny: 2 layers x 2 KV heads x 16 dims x 4 bytes = 256 bytes of K (and of V) per token
    expect_refused(model, "cannot allocate the CPU buffers", "K cache alone 4194304.0 MiB", "lower -np or -c",
                   extra=("-np", "1024", "-c", "16777216"))
    # K and V each take 60 % of the memory: either fits alone, not both (calloc would have
    # "succeeded" with overcommit and the first real use would have killed the server).
    # Nothing is allocated for a refused configuration, so this touches no memory.
    ctx = int(mem_total_mib() * 0.6 * 1048576 / (1024 * 256))
    expect_refused(model, "cannot allocate the CPU buffers", "MiB in all", "MiB of memory",
                   extra=("-np", "1024", "-c", str(ctx)))
    # flag limits are refused before anything is loaded (usage error, exit 2)
    r = run_bin("-m", model, "-np", "100000", "-c", "100000", "--port", str(free_port()))
    check(r.returncode == 2 and "parallel" in r.stderr, f"-np 100000: {r.returncode} {r.stderr}")


# ---- valgrind ----------------------------------------------------------------------------------

def sanitizer_build():
    if os.environ.get("INFERD_SANITIZE") == "1":
        return True
    r = subprocess.run(["ldd", hi.BIN], capture_output=True, text=True, timeout=30)
    return "libasan" in r.stdout or "libubsan" in r.stdout


def case_valgrind():
    if sanitizer_build():
        print("SKIP: sanitizer build (valgrind and ASan do not mix)")
        return SKIP
    if not shutil.which("valgrind"):
        print("SKIP: valgrind is not installed (scripts/install-deps --test)")
        return SKIP
    vg_log = os.path.join(TMP, "valgrind.log")
    prefix = ["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=99",
              "--show-leak-kinds=definite", "--num-callers=30", f"--log-file={vg_log}"]
    s = Server(make_model(), "-np", "2", "-c", "128", "--http-threads", "2", "--device", "cpu",
               "--shutdown-timeout", "1", prefix=prefix, ready_s=240)
    try:
        p = s.port
        body = {"prompt": "Hello world", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        st, b = post(p, "/v1/completions", body, timeout=240)
        check(st == 200 and b["usage"]["completion_tokens"] == 6, f"completion: {st} {b}")
        streamed = hi.sse_events(request(p, "POST", "/v1/completions", dict(body, stream=True), timeout=240)[2].decode())
        check("".join(e["choices"][0]["text"] for e in streamed[:-1]) == b["choices"][0]["text"], "stream == whole")
        st, _, raw = request(p, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                             "max_tokens": 4, "stream": True, "ignore_eos": True}, timeout=240)
        check(st == 200 and hi.sse_events(raw.decode())[-2]["choices"][0]["finish_reason"] == "length", "chat stream")
        st, b = post(p, "/v1/completions", b'{"prompt": ', timeout=240)
        hi.check_error(b, st, 400)
        # several prompts x n with logprobs, echo and a stop string; then three at once (batched steps)
        st, b = post(p, "/v1/completions", {"prompt": ["Hello", "World"], "n": 2, "max_tokens": 4, "logprobs": 2,
                                            "echo": True, "stop": ["xyz"], "seed": 3}, timeout=240)
        check(st == 200 and len(b["choices"]) == 4, f"n x prompts: {st}")
        results = [None] * 3
        threads = [threading.Thread(target=hi.stream_text, args=(p, dict(body, prompt=f"Number {i}"), results, i))
                   for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        check(all(isinstance(r, str) for r in results), f"concurrent streams: {results}")
        # a client that hangs up mid-stream: its request is cancelled and freed
        sock = hi.open_stream(p, 100)
        sock.close()
        hi.wait_metric(p, "inferd_slots_running", 0, seconds=120)
        st, b = post(p, "/v1/completions", dict(body, max_tokens=2), timeout=240)
        check(st == 200, "serving after the hang-up")
        # SIGTERM with a stream running: it drains or is cut after --shutdown-timeout
        sock = hi.open_stream(p, 100)
        s.stop(expect_rc=0, wait_s=240)
        sock.close()
    except Fail:
        sys.stderr.write("--- server log tail ---\n" + s.tail())
        raise
    finally:
        s.kill()
        log = open(vg_log).read() if os.path.exists(vg_log) else ""
    summary = re.search(r"ERROR SUMMARY: (\d+) errors", log)
    check(summary and summary.group(1) == "0", f"valgrind errors:\n{log[-6000:]}")
    lost = re.search(r"definitely lost: ([\d,]+) bytes", log)
    check(not lost or lost.group(1) == "0", f"definite leaks:\n{log[-6000:]}")
    print("valgrind: " + "; ".join(l.split("== ", 1)[-1] for l in log.splitlines()
                                    if re.search(r"ERROR SUMMARY|definitely lost|in use at exit|total heap usage", l)))


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    hi.main(CASES)
