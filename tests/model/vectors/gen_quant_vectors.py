#!/usr/bin/env python3
"""Writes the dequantisation vectors of tests/model/test_quant_vectors.c from gguf-py's reference.

For each type, <type>.bin holds N raw blocks followed by the N * block_size float32 values
gguf-py's dequantize gives for them (both little-endian); the test reads N from the size.
Blocks come from gguf-py's own quantize where it has one (Q4_1, Q5_0, Q5_1, MXFP4), and otherwise
(and in addition) are random bytes with crafted scale fields: ordinary scales, zero scales,
the largest finite and subnormal halves, negative scales.  The IQ1/IQ2/IQ3 types have no
quantizer in gguf-py: random bytes reach grid rows, sign patterns and sub-block scales across their ranges.

Usage: gen_quant_vectors.py PATH/TO/llama.cpp/gguf-py [OUTDIR]
(gguf-py is inside ../shared/peers/llama.cpp-*.tar.gz; needs numpy.)  The outputs are committed,
so CI needs neither numpy nor the tarball; rerun this only to change the vectors.
"""
import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
from gguf import quants  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402

OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261125)

# Byte offsets of the f16 scale fields that scale the block (d, and m / dmin where there is one).
HALF_FIELDS = {
    T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.IQ4_NL: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.IQ4_XS: [0],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0],
}
# Halves to plant: zero, the largest finite (+/-), the smallest subnormal, a subnormal, a
# negative ordinary value.
SPECIAL_HALVES = [0x0000, 0x7BFF, 0xFBFF, 0x0001, 0x03FF, 0xB800, 0x8000]


def random_half(n):
    """Random finite halves of moderate magnitude (exponent 2^-14 .. 2^2), either sign."""
    exp = rng.integers(1, 17, size=n)
    mant = rng.integers(0, 1024, size=n)
    sign = rng.integers(0, 2, size=n)
    return ((sign << 15) | (exp << 10) | mant).astype(np.uint16)


def crafted_blocks(qtype, n):
    _, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    fields = HALF_FIELDS[qtype]
    for off in fields:
        blocks[:, off:off + 2] = random_half(n).view(np.uint8).reshape(n, 2)
    # edge cases in the first blocks: each special half in each field in turn, all scale
    # fields zero together, and a block of all-zero bytes.
    row = 0
    for off in fields:
        for h in SPECIAL_HALVES:
            blocks[row, off:off + 2] = np.array([h], dtype=np.uint16).view(np.uint8)
            row += 1
    for off in fields:
        blocks[row, off:off + 2] = 0
    row += 1
    blocks[row, :] = 0
    row += 1
    # all quants at their extreme (every bit set) with ordinary scales
    blocks[row, :] = 0xFF
    for off in fields:
        blocks[row, off:off + 2] = np.array([0x3C00], dtype=np.uint16).view(np.uint8)
    return blocks


def quantized_blocks(cls, n_rows):
    bs = cls.block_size
    x = rng.standard_normal((n_rows, bs)).astype(np.float32)
    x[0] = 0.0                          # all-zero block: zero scale
    x[1] = 0.25                         # constant block
    x[2] *= 8000.0                      # near the top of the f16 range
    x[3] *= 1e-6                        # scales among the f16 subnormals
    x[4] = np.linspace(-1, 1, bs)       # an exact ramp
    return cls.quantize_blocks(x)


def write(qtype, blocks):
    cls = quants._type_traits[qtype]
    cls.init_grid()
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
    ref = cls.dequantize_blocks(blocks).astype("<f4")
    assert ref.shape == (blocks.shape[0], cls.block_size)
    assert np.isfinite(ref).all(), qtype.name  # compared bit for bit: keep NaN out
    path = os.path.join(OUT, qtype.name.lower() + ".bin")
    with open(path, "wb") as f:
        f.write(blocks.tobytes())
        f.write(ref.tobytes())
    print(f"{path}: {blocks.shape[0]} blocks")


for qtype in (T.Q4_1, T.Q5_0, T.Q5_1):
    cls = quants._type_traits[qtype]
    write(qtype, np.concatenate([quantized_blocks(cls, 16), crafted_blocks(qtype, 24)]))
for qtype in (T.IQ4_NL,):
    write(qtype, crafted_blocks(qtype, 32))


def mxfp4_blocks(n):
    """MXFP4's scale is one E8M0 byte: exponents across the range, with 0 and 1 (half scales
    2^-128 and 2^-127, float subnormals) and 2 (the smallest normal); above 250 the largest
    weight, 12 * 2^(e-128), would overflow."""
    blocks = rng.integers(0, 256, size=(n, 17), dtype=np.uint8)
    blocks[:, 0] = rng.integers(100, 151, size=n)
    blocks[:6, 0] = [0, 1, 2, 127, 200, 250]
    blocks[6, :] = 0
    return blocks


for qtype in (T.Q2_K, T.Q3_K, T.IQ4_XS):
    write(qtype, crafted_blocks(qtype, 20))
write(T.MXFP4, np.concatenate([quantized_blocks(quants.MXFP4, 16), mxfp4_blocks(24)]))


def iq1_m_blocks(n):
    """IQ1_M keeps its f16 d in the top nibbles of its four scale words (bytes 48..55, nibble k
    of d in word k): random and special halves planted there, the other bits random."""
    blocks = rng.integers(0, 256, size=(n, 56), dtype=np.uint8)
    halves = random_half(n)
    halves[:len(SPECIAL_HALVES)] = SPECIAL_HALVES
    words = blocks[:, 48:56].copy().view(np.uint16)
    for k in range(4):
        words[:, k] = (words[:, k] & 0x0FFF) | (((halves >> (4 * k)) & 0xF) << 12)
    blocks[:, 48:56] = words.view(np.uint8)
    blocks[-1, :48] = 0xFF  # every index and delta bit set
    return blocks


# (after the others, so that their vectors stay as they were)
for qtype in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S):
    write(qtype, crafted_blocks(qtype, 48))
write(T.IQ1_M, iq1_m_blocks(48))
