#!/usr/bin/env python3
"""Write tests/text/data/pre_<name>.json: a pre-tokenizer's pieces of many texts, by the regex
itself (the third-party `regex` module, which has \\p{..} classes and the same backtracking as
the Hugging Face tokenizers' Oniguruma), for tests/text/test_tokenizer.c to check
tokenizer_pre_split against.  Each case: {"text": ..., "ends": [byte offset of each piece's end]}.

A pre-tokenizer of several regexes (DeepSeek V3) splits each piece of one by the next, as
Hugging Face's Sequence of Splits and llama.cpp's regex list do.

Usage: scripts/gen_pre_splits.py gpt-4o [hf-texts.json] > tests/text/data/pre_gpt4o.json
       scripts/gen_pre_splits.py deepseek-v3 ../shared/vocab/hf-texts.json > tests/text/data/pre_deepseek_v3.json
The texts are the ones below plus, when given, ../shared/vocab/hf-texts.json's; the output is
committed, so neither the module nor the file is needed to build or test.
"""
import json
import sys

import regex

PATTERNS = {
    # tokenizer.json of GPT-4o / o200k (gpt-oss, Llama 4)
    "gpt-4o": [r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
              r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
              r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    # tokenizer.json of DeepSeek V3 / R1 (llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM)
    "deepseek-v3": [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
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

# more texts for one pre-tokenizer: its own classes' edges (the shared ones keep the committed
# files of the others as they are)
EXTRA_TEXTS = {
    "deepseek-v3": [
        "東京タワーとスカイツリー", "ひらがなカタカナ漢字kanji混在", "中文，标点。“引号”", "龥龦 ゟ゠ヿ・ー",
        "가나다 ㄱㄴ 한글", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３", ".com .NET 's 'S ''s", "a.b.c-d_e@f.org",
        "x.éa ,éa .aé", "--flag=value /usr/bin", "1234567 ١٢٣٤٥ 12ab34", "\u0301\u0301x \u0301 \u0301.",
        " \u0301word", "\tword\u00a0word", "price: $100.00!!\r\n\r\nok", "a \n\n b", "  \r\n  ", "x\u0085y",
        "🙂🙂a 👍🏽. ok", "\x1f\x1ftext", "\u200d\u200dab", "((a)) [b] {c}", "©2024 ™x", "½¼ x²",
    ],
}


def ends_of(patterns, text):
    """Each regex splits each piece of the one before: its matches and the unmatched text between
    them are pieces.  Returns the pieces' end offsets in bytes."""
    pieces = [text]
    for pattern in patterns:
        split = []
        for piece in pieces:
            pos = 0
            for m in regex.finditer(pattern, piece):
                if m.start() > pos:  # unmatched text between matches is a piece of its own
                    split.append(piece[pos:m.start()])
                split.append(piece[m.start():m.end()])
                pos = m.end()
            if pos < len(piece):
                split.append(piece[pos:])
        pieces = split
    ends, at = [], 0
    for piece in pieces:
        at += len(piece.encode("utf-8"))
        ends.append(at)
    return ends


def main():
    name = sys.argv[1]
    texts = list(TEXTS) + EXTRA_TEXTS.get(name, [])
    if len(sys.argv) > 2:
        texts += json.load(open(sys.argv[2], encoding="utf-8"))["texts"]
    cases = [{"text": t, "ends": ends_of(PATTERNS[name], t)} for t in texts if t]
    json.dump({"pre": name, "cases": cases}, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
