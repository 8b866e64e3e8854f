#!/usr/bin/env python3
"""The table of test_tokenizer.c's test_tekken_pieces: each text with the byte lengths of the
pieces that Tekken's pre-tokenizer regex (Mistral's tokenizer.json, as llama.cpp quotes it)
splits it into, by Python's `regex` module (pip package `regex`: real \\p{Lu}/\\p{Ll}/...
classes, as Hugging Face tokenizers' Oniguruma has).  Usage: python3 gen_tekken_pieces.py"""
import regex
PAT = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
texts = [
    "Hello World", "HELLOworld and iPhone", "ABC def GHI", "McDonald's don't I'M",
    "Éric café ÑANDÚ straße", "\u01c5emal \u01c4EMAL \u01c6emal", "\u02b0ello a\u02b0\u02b0",
    "e\u0301E\u0301 \u0301x", "日本語のテキスト", "안녕하세요 세계", "مرحبا بالعالم", "नमस्ते दुनिया",
    "12345 3.14 x2y", "x/y//z\n", " !!!/\n\n", "a   b\n\n  c  ", "line\r\nnext\r\n\r\n",
    "foo/bar.baz?q=1", "👋 hi 🎉🎉", "\tTab\u00a0nbsp \u3000wide", "ΑΒΓ αβγ Σίσυφος",
    "ǈubljana ǉ", "  leading and trailing  ", "(x+y)*z == \"done\"",
]
def esc(t):
    out = ""
    for ch in t.encode("utf-8"):
        if 32 <= ch < 127 and ch not in (ord('"'), ord('\\'), ord('?')):
            out += chr(ch)
        else:
            out += "\\%03o" % ch
    return out
lines = []
for t in texts:
    b = t.encode("utf-8")
    spans = []
    pos = 0
    for m in regex.finditer(PAT, t):
        if m.start() > pos: spans.append(t[pos:m.start()])
        spans.append(m.group()); pos = m.end()
    if pos < len(t): spans.append(t[pos:])
    lens = [len(s.encode("utf-8")) for s in spans]
    assert sum(lens) == len(b)
    lines.append('        {"%s", {%s, 0}},' % (esc(t), ", ".join(map(str, lens))))
print("\n".join(lines))
