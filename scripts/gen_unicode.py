#!/usr/bin/env python3
"""Generate src/text/unicode_data.c: Unicode general-category classes per code point.

Reads UnicodeData.txt (Debian package `unicode-data`, /usr/share/unicode/UnicodeData.txt) and
writes a sorted table of code point ranges, each with the class bits the tokenizers' pre-split
rules need (\\p{L}, \\p{N}, \\p{P}, \\p{S}, \\p{M}, \\s, controls).  Unassigned code points get 0.

Usage: scripts/gen_unicode.py [UnicodeData.txt] > src/text/unicode_data.c
       scripts/gen_unicode.py --nfc > src/text/unicode_nfc_data.c
       scripts/gen_unicode.py --case [UnicodeData.txt] > src/text/unicode_case_data.c

--case writes the letters' case classes (Lu and Lt upper, Ll lower: the Tekken pre-tokenizer's
\\p{Lu}\\p{Lt} and \\p{Ll}) from the same UnicodeData.txt.

--nfc writes the tables of NFC normalization (canonical decompositions, canonical combining
classes, primary composites) from Python's own `unicodedata` module, so it needs no data file;
the Unicode version is that of the Python that runs it (written into the output).

Only the Python standard library is used; the generated files are committed so that building
inferd does not need the data files.
"""
import sys
import unicodedata

# Must match the UCP_* bits in src/text/unicode.h.
LETTER, NUMBER, PUNCT, SYMBOL, MARK, SPACE, CONTROL = 1, 2, 4, 8, 16, 32, 64
CASE_UPPER, CASE_LOWER = 1, 2  # UCP_CASE_*

MAJOR = {"L": LETTER, "N": NUMBER, "P": PUNCT, "S": SYMBOL, "M": MARK, "C": CONTROL, "Z": 0}

# White_Space (PropList.txt) is exactly the Z* separators plus these C0/C1 controls; deriving it
# here keeps the generator to one input file.
EXTRA_SPACE = [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85]


def read_categories(path):
    cats = {}
    first = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(";")
            if len(fields) < 3:
                continue
            cp, name, cat = int(fields[0], 16), fields[1], fields[2]
            if name.endswith(", First>"):
                first = cp
                continue
            if name.endswith(", Last>"):
                for c in range(first, cp + 1):
                    cats[c] = cat
                first = None
                continue
            cats[cp] = cat
    return cats


def class_bits(cat):
    if cat is None:
        return 0
    bits = MAJOR[cat[0]]
    if cat[0] == "Z":
        bits |= SPACE
    if cat in ("Cs", "Co", "Cn"):  # surrogates/private use are not "control" for our purposes
        bits &= ~CONTROL
    return bits


# Hangul syllables decompose and compose by arithmetic (unicode.c), not by table.
HANGUL_S_BASE, HANGUL_S_COUNT = 0xAC00, 11172
HANGUL_V = (0x1161, 0x1175)  # vowel jamo: compose after a leading consonant
HANGUL_T = (0x11A8, 0x11C2)  # trailing consonants: compose after an LV syllable


def canonical_decomposition(cp):
    """The full (recursive) canonical decomposition of cp, or None when it has none."""
    d = unicodedata.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    out = []
    for part in d.split():
        c = int(part, 16)
        out += canonical_decomposition(c) or [c]
    return out


def ranges_of(values):
    """[(lo, hi, value)] for the runs of equal nonzero values in a {cp: value} dict."""
    out = []
    for cp in sorted(values):
        v = values[cp]
        if out and out[-1][1] == cp - 1 and out[-1][2] == v:
            out[-1] = (out[-1][0], cp, v)
        else:
            out.append((cp, cp, v))
    return out


def write_ranges(w, ctype, name, count, values):
    """A C table `name` of {lo, hi, value} for the runs of values, and its length `count`."""
    w("const %s %s[] = {\n" % (ctype, name))
    for lo, hi, v in ranges_of(values):
        w("    {0x%05X, 0x%05X, %d},\n" % (lo, hi, v))
    w("};\n")
    w("const size_t %s = sizeof(%s) / sizeof(%s[0]);\n" % (count, name, name))


def write_nfc(out):
    decomp, ccc, pairs = {}, {}, []
    for cp in range(0x110000):
        if HANGUL_S_BASE <= cp < HANGUL_S_BASE + HANGUL_S_COUNT:
            continue
        c = unicodedata.combining(chr(cp))
        if c:
            ccc[cp] = c
        d = canonical_decomposition(cp)
        if d is None:
            continue
        decomp[cp] = d
        # A primary composite: a two-part mapping that NFC keeps (composition exclusions,
        # singletons and non-starter decompositions are exactly those NFC maps away).
        parts = unicodedata.decomposition(chr(cp)).split()
        if len(parts) == 2 and unicodedata.normalize("NFC", chr(cp)) == chr(cp):
            pairs.append((int(parts[0], 16), int(parts[1], 16), cp))
    pairs.sort()

    # Code points whose presence can make NFC change a text: those NFC itself changes, the
    # non-starters (reordering), and every second half of a composition (Hangul V/T included).
    touch = {cp: 1 for cp in ccc}
    for cp in decomp:
        if unicodedata.normalize("NFC", chr(cp)) != chr(cp):
            touch[cp] = 1
    for _, second, _ in pairs:
        touch[second] = 1
    for lo, hi in (HANGUL_V, HANGUL_T):
        for cp in range(lo, hi + 1):
            touch[cp] = 1

    w = out.write
    w("/* unicode_nfc_data.c - GENERATED by scripts/gen_unicode.py --nfc from Python's unicodedata\n")
    w(" * (Unicode %s). Do not edit.\n" % unicodedata.unidata_version)
    w(" * Tables of NFC normalization; Hangul syllables are left to arithmetic in unicode.c. */\n")
    w('#include "unicode.h"\n\n')
    w("const char unicode_nfc_version[] = \"%s\";\n\n" % unicodedata.unidata_version)
    w("/* Canonical combining class, for the code points where it is not 0. */\n")
    write_ranges(w, "unicode_ccc_range", "unicode_ccc", "unicode_n_ccc", ccc)
    w("\n")
    w("/* Full canonical decompositions: unicode_decomp[i] expands to unicode_decomp_cps[off..+len). */\n")
    w("const unicode_decomp_entry unicode_decomp[] = {\n")
    flat = []
    for cp in sorted(decomp):
        w("    {0x%05X, %d, %d},\n" % (cp, len(flat), len(decomp[cp])))
        flat += decomp[cp]
    w("};\n")
    w("const size_t unicode_n_decomp = sizeof(unicode_decomp) / sizeof(unicode_decomp[0]);\n")
    w("const uint32_t unicode_decomp_cps[] = {\n")
    for i in range(0, len(flat), 8):
        w("    " + ", ".join("0x%05X" % c for c in flat[i:i + 8]) + ",\n")
    w("};\n\n")
    w("/* Primary composites, sorted by (first, second). */\n")
    w("const unicode_comp_pair unicode_comp[] = {\n")
    for a, b, c in pairs:
        w("    {0x%05X, 0x%05X, 0x%05X},\n" % (a, b, c))
    w("};\n")
    w("const size_t unicode_n_comp = sizeof(unicode_comp) / sizeof(unicode_comp[0]);\n\n")
    w("/* Code points that can make NFC change a text (see unicode_nfc). */\n")
    w("const unicode_cp_range unicode_nfc_touch[] = {\n")
    for lo, hi, _ in ranges_of(touch):
        w("    {0x%05X, 0x%05X},\n" % (lo, hi))
    w("};\n")
    w("const size_t unicode_n_nfc_touch = sizeof(unicode_nfc_touch) / sizeof(unicode_nfc_touch[0]);\n")


def write_case(out, cats):
    case = {cp: CASE_UPPER if cat in ("Lu", "Lt") else CASE_LOWER
            for cp, cat in cats.items() if cat in ("Lu", "Lt", "Ll")}
    w = out.write
    w("/* unicode_case_data.c - GENERATED by scripts/gen_unicode.py --case from UnicodeData.txt. Do not\n")
    w(" * edit.  The cased letters' ranges (sorted), UCP_CASE_UPPER (Lu, Lt) or UCP_CASE_LOWER (Ll). */\n")
    w('#include "unicode.h"\n\n')
    write_ranges(w, "unicode_range", "unicode_case_ranges", "unicode_n_case_ranges", case)


def main():
    if sys.argv[1:] == ["--nfc"]:
        write_nfc(sys.stdout)
        return
    if sys.argv[1:2] == ["--case"]:
        write_case(sys.stdout, read_categories(sys.argv[2] if len(sys.argv) > 2 else "/usr/share/unicode/UnicodeData.txt"))
        return
    path = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode/UnicodeData.txt"
    cats = read_categories(path)
    flags = [class_bits(cats.get(cp)) for cp in range(0x110000)]
    for cp in EXTRA_SPACE:
        flags[cp] |= SPACE

    ranges = []
    start = 0
    for cp in range(1, 0x110001):
        if cp == 0x110000 or flags[cp] != flags[start]:
            ranges.append((start, cp - 1, flags[start]))
            start = cp

    out = sys.stdout
    out.write("/* unicode_data.c - GENERATED by scripts/gen_unicode.py from UnicodeData.txt. Do not edit.\n")
    out.write(" * Code point ranges (covering U+0000..U+10FFFF, sorted) with UCP_* class bits. */\n")
    out.write('#include "unicode.h"\n\n')
    out.write("const unicode_range unicode_ranges[] = {\n")
    for lo, hi, fl in ranges:
        out.write("    {0x%05X, 0x%05X, %d},\n" % (lo, hi, fl))
    out.write("};\n")
    out.write("const size_t unicode_n_ranges = sizeof(unicode_ranges) / sizeof(unicode_ranges[0]);\n\n")
    out.write("const uint8_t unicode_latin1[256] = {\n")
    for row in range(0, 256, 16):
        out.write("    " + ", ".join("%d" % flags[c] for c in range(row, row + 16)) + ",\n")
    out.write("};\n")


if __name__ == "__main__":
    main()
