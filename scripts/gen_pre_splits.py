#!/usr/bin/env python3
"""Write tests/text/data/pre_<name>.json: a pre-tokenizer's pieces of many texts, by the regex
itself (the third-party `regex` module, which has \\p{..} classes and the same backtracking as
the Hugging Face tokenizers' Oniguruma), for tests/text/test_tokenizer.c to check
tokenizer_pre_split against.  Each case: {"text": ..., "ends": [byte offset of each piece's end]}.

Usage: scripts/gen_pre_splits.py gpt-4o [hf-texts.json] > tests/text/data/pre_gpt4o.json
The texts are the ones below plus, when given, ../shared/vocab/hf-texts.json's; the output is
committed, so neither the module nor the file is needed to build or test.
"""
import json
import sys

import regex

PATTERNS = {
    # tokenizer.json of GPT-4o / o200k (gpt-oss, Llama 4)
    "gpt-4o": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
              r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
              r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

TEXTS = [
    "HelloWorld", "helloWorld", "HELLOworld", "HTTPServer", "iPhone", "McDonald's", "DON'T", "don't stop",
    "I'm here, you're there; we'll see. They'd've", "She'S", "'s alone", " 'tis", "x'", "O'Neil",
    "path/to/file\n\n/next", "a//b\r\n/c", "  leading", "trailing   ", "\t\ttabs\tand spaces \n", "\n\n\n",
    " \n \n x", "12345678", "3.14159", "1,000,000", "v1.2.3-rc4", "x²+y³", "٣٤٥٦", "①②③④",
    "Ǆemal ǅemal ǆemal", "ΑΒΓαβγ ΣΊΣΥΦΟΣ", "Привет Мир", "日本語のテキスト", "한국어 텍스트", "مرحبا بالعالم",
    "नमस्ते दुनिया", "ประเทศไทย", "e\u0301te\u0301", "\u0301abc", "A\u0301B\u0301c", "ℌello ℍELLO",
    "ʰello ʰELLO", "ǅx", "emoji 😀😀 ok 👍🏽!", "<|start|>assistant<|channel|>final<|message|>Hi",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "def f(x):\n    return x**2  # square\n",
    "a\u00a0b\u2003c\u3000d", "mixedCASEWordsAndNUMBERS123abcDEF", "ALLCAPS'S", "camelCase'll",
    "!!!???...", " !!", "  !!", "a\r\rb", "end with space ", "Ω≈ç√∫", "\u200bzero\u200bwidth",
    "\x01\x02ctrl", "ﬁnance ﬂow", "İstanbul ıi", "ẞtraße", "Ⅻ roman ⅻ", "x" * 3 + "Y" * 3 + "z" * 3,
]


def ends_of(pattern, text):
    ends, pos = [], 0
    for m in regex.finditer(pattern, text):
        if m.start() > pos:  # unmatched text between matches is a piece of its own
            ends.append(len(text[:m.start()].encode("utf-8")))
        ends.append(len(text[:m.end()].encode("utf-8")))
        pos = m.end()
    if pos < len(text):
        ends.append(len(text.encode("utf-8")))
    return ends


def main():
    name = sys.argv[1]
    texts = list(TEXTS)
    if len(sys.argv) > 2:
        texts += json.load(open(sys.argv[2], encoding="utf-8"))["texts"]
    cases = [{"text": t, "ends": ends_of(PATTERNS[name], t)} for t in texts if t]
    json.dump({"pre": name, "cases": cases}, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
