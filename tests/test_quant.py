"""weightio.quant: every block dequantizer, bit for bit, and the Q8_0/Q4_0/BF16 quantizers.

Three kinds of evidence: hand-built blocks whose values follow from the format definition on
paper (these run without the gguf package), a scalar transcription of ggml's C loops for the
types gguf-py cannot decode (Q8_1, Q8_K, Q1_0), and gguf.quants.dequantize / quantize on random
valid blocks for every type it handles.
"""

from __future__ import annotations

import gc
import os
import struct
import sys
import warnings
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightio import quant
from weightio.errors import UnsupportedDTypeError
from weightio.quant import QuantizedTensor, decoding, dequantize, quantize
from weightio.quant.kernels import KERNELS
from weightio.quant.types import TYPES, by_id, by_name

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from gen_gguf import scalar_reference  # noqa: E402  (the spec transcription the fixtures use)

F16_ONE, F16_HALF, F16_TWO, F16_QUARTER, F16_THREE = (struct.pack("<e", v) for v in (1.0, 0.5, 2.0, 0.25, 3.0))
GGUF_DEQUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS",
                      "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0",
                      "TQ2_0", "MXFP4", "NVFP4"]


def block(type_name: str, fields: dict[int, bytes]) -> np.ndarray:
    """One block of `type_name`: zero bytes with `fields` (offset -> bytes) written in."""
    raw = bytearray(by_name(type_name).type_size)
    for offset, value in fields.items():
        raw[offset:offset + len(value)] = value
    return np.frombuffer(bytes(raw), np.uint8)


def rep(byte: int, n: int) -> bytes:
    return bytes([byte]) * n


def random_blocks(rng: np.random.Generator, type_name: str, n: int) -> np.ndarray:
    """Valid random blocks: bit 6 of every odd byte cleared keeps every f16 (all at even offsets)
    and Q8_K's f32 scale finite; MXFP4's exponent stays moderate."""
    raw = rng.integers(0, 256, (n, by_name(type_name).type_size), dtype=np.uint8)
    raw[:, 1::2] &= 0xBF
    if type_name == "MXFP4":
        raw[:, 0] = rng.integers(100, 150, n)
    return raw


# ----------------------------------------------------------------------------- hand-built blocks

# (type, block fields, expected values) — each expectation worked out from the block layout.
GOLDEN = [
    # Q4_0: y = (q - 8) * d; byte 0x9A: low nibble 0xA -> elements 0..15 = 2, high 9 -> 16..31 = 1
    ("Q4_0", {0: F16_ONE, 2: rep(0x9A, 16)}, [2.0] * 16 + [1.0] * 16),
    # Q4_1: y = q * d + m; d = 0.5, m = -1, byte 0x31 -> 1 * 0.5 - 1, 3 * 0.5 - 1
    ("Q4_1", {0: F16_HALF, 2: struct.pack("<e", -1.0), 4: rep(0x31, 16)}, [-0.5] * 16 + [0.5] * 16),
    # Q5_0: y = (q - 16) * d; qh bits 16..31 set give elements 16..31 their fifth bit
    ("Q5_0", {0: F16_TWO, 2: struct.pack("<I", 0xFFFF0000)}, [-32.0] * 16 + [0.0] * 16),
    # Q5_1: y = q * d + m; qh = 0x55555555 sets the fifth bit of even elements; nibbles 1 (low), 2 (high)
    ("Q5_1", {0: F16_ONE, 2: F16_HALF, 4: struct.pack("<I", 0x55555555), 8: rep(0x21, 16)},
     [17.5, 1.5] * 8 + [18.5, 2.5] * 8),
    # Q8_0 and Q8_1: y = qs * d
    ("Q8_0", {0: F16_QUARTER, 2: np.arange(-16, 16, dtype=np.int8).tobytes()}, [q / 4 for q in range(-16, 16)]),
    ("Q8_1", {0: F16_HALF, 2: struct.pack("<e", 99.0), 4: np.arange(-16, 16, dtype=np.int8).tobytes()},
     [q / 2 for q in range(-16, 16)]),
    # Q8_K: f32 d, then 256 int8 quants, then 16 int16 sums that do not matter
    ("Q8_K", {0: struct.pack("<f", 0.125), 4: np.arange(-128, 128, dtype=np.int8).tobytes(), 260: rep(0x7F, 32)},
     [q / 8 for q in range(-128, 128)]),
    # Q1_0: bit set -> +d, clear -> -d; 0x0F sets bits 0..3 of every byte
    ("Q1_0", {0: F16_THREE, 2: rep(0x0F, 16)}, ([3.0] * 4 + [-3.0] * 4) * 16),
    # Q2_K: every scale byte 0x21 (scale 1, min 2), d = 1, dmin = 0.5; qs byte 0xE4 holds the 2-bit
    # fields 0, 1, 2, 3 at shifts 0, 2, 4, 6, so the 32 elements at shift j are j * 1 - 0.5 * 2
    ("Q2_K", {0: rep(0x21, 16), 16: rep(0xE4, 64), 80: F16_ONE, 82: F16_HALF},
     ([-1.0] * 32 + [0.0] * 32 + [1.0] * 32 + [2.0] * 32) * 2),
    # Q3_K: all sixteen 6-bit scales 33 (low nibbles 1, high pairs 2 -> 0x11 and 0xAA), d = 1;
    # hmask all set means no -4: y = 2-bit field j
    ("Q3_K", {0: rep(0xFF, 32), 32: rep(0xE4, 64), 96: rep(0x11, 8) + rep(0xAA, 4), 108: F16_ONE},
     ([0.0] * 32 + [1.0] * 32 + [2.0] * 32 + [3.0] * 32) * 2),
    # ... and hmask clear subtracts 4 everywhere
    ("Q3_K", {32: rep(0xE4, 64), 96: rep(0x11, 8) + rep(0xAA, 4), 108: F16_ONE},
     ([-4.0] * 32 + [-3.0] * 32 + [-2.0] * 32 + [-1.0] * 32) * 2),
    # Q4_K: d = dmin = 1, every scale 2 and min 1 (bytes 0..3 = 2, 4..7 = 1, 8..11 = 0x12);
    # qs 0x53: low nibble 3 -> 2 * 3 - 1 = 5 for the first 32 of each 64, high 5 -> 9
    ("Q4_K", {0: F16_ONE, 2: F16_ONE, 4: rep(2, 4) + rep(1, 4) + rep(0x12, 4), 16: rep(0x53, 128)},
     ([5.0] * 32 + [9.0] * 32) * 4),
    # Q5_K: the same plus qh bit 0 of every byte: sub-block 0 gains 16 -> 2 * 19 - 1 = 37
    ("Q5_K", {0: F16_ONE, 2: F16_ONE, 4: rep(2, 4) + rep(1, 4) + rep(0x12, 4), 16: rep(1, 32),
              48: rep(0x53, 128)}, [37.0] * 32 + [9.0] * 32 + ([5.0] * 32 + [9.0] * 32) * 3),
    # Q6_K: d = 0.5, scales 2 -> 1 per unit; ql 0x21 (low 1, high 2), qh 0xFF (+48): q - 32 = 17, 18
    ("Q6_K", {0: rep(0x21, 128), 128: rep(0xFF, 64), 192: rep(2, 16), 208: F16_HALF},
     ([17.0] * 64 + [18.0] * 64) * 2),
    # IQ4_NL: y = d * kvalues[q]; nibbles 0 and 1 -> -127, -104
    ("IQ4_NL", {0: F16_ONE, 2: rep(0x10, 16)}, [-127.0] * 16 + [-104.0] * 16),
    # IQ4_XS: sub-scale ls = 33 (low nibbles 1, high pairs 2 -> 0x11, 0xAAAA): dl = d * (ls - 32) = 1
    ("IQ4_XS", {0: F16_ONE, 2: struct.pack("<H", 0xAAAA), 4: rep(0x11, 4), 8: rep(0x10, 128)},
     ([-127.0] * 16 + [-104.0] * 16) * 8),
    # TQ2_0: y = (q - 1) * d with the K-quant 2-bit order
    ("TQ2_0", {0: rep(0xE4, 64), 64: F16_ONE}, ([-1.0] * 32 + [0.0] * 32 + [1.0] * 32 + [2.0] * 32) * 2),
    # MXFP4: e = 129 -> scale 2^(129-128) = 2 on the doubled E2M1 table; codes 1 and 7 -> 1 * 2, 12 * 2
    ("MXFP4", {0: bytes([129]), 1: rep(0x71, 16)}, [2.0] * 16 + [24.0] * 16),
    # NVFP4: UE4M3 scales 0x38 (1.0), 0x40 (2.0), 0x00 and 0x7F (both 0), halved; codes 1 low, 7 high
    ("NVFP4", {0: bytes([0x38, 0x40, 0x00, 0x7F]), 4: rep(0x71, 32)},
     [0.5] * 8 + [6.0] * 8 + [1.0] * 8 + [12.0] * 8 + [0.0] * 32),
    # IQ2_XXS: grid point 0 is eight 8s; scale nibble 1 -> d * (0.5 + 1) * 0.25 = 0.375; 8 * 0.375 = 3
    ("IQ2_XXS", {0: F16_ONE, 2: (bytes(4) + struct.pack("<I", 1 << 28)) * 8}, [3.0] * 256),
    # IQ2_XS: grid 0, scales 0x10: the first 16 of a group get d * 0.5 * 0.25, the rest d * 1.5 * 0.25
    ("IQ2_XS", {0: F16_ONE, 66: rep(0x10, 8)}, ([1.0] * 16 + [3.0] * 16) * 8),
    # IQ2_S: as IQ2_XS, with explicit sign bytes: 0x01 negates the first element of each 8
    ("IQ2_S", {0: F16_ONE, 34: rep(0x01, 32), 74: rep(0x10, 8)},
     (([-1.0] + [1.0] * 7) * 2 + ([-3.0] + [3.0] * 7) * 2) * 8),
    # IQ3_XXS: grid point 0 is four 4s; scale nibble 1 -> d * 1.5 * 0.5 = 0.75; 4 * 0.75 = 3
    ("IQ3_XXS", {0: F16_ONE, 66: struct.pack("<I", 1 << 28) * 8}, [3.0] * 256),
    # IQ3_S: grid point 0 is four 1s; scale nibble 1 -> d * (1 + 2) = 3; sign byte 0xFF negates 8 elements
    ("IQ3_S", {0: F16_ONE, 74: rep(0xFF, 1), 106: rep(0x11, 4)}, [-3.0] * 8 + [3.0] * 248),
    # IQ1_S: grid point 0 is eight -1s; dl = d * (2 * 0 + 1), delta +0.125 -> -0.875; group 1 sets
    # the delta sign (bit 15) -> -1.125 and scale 1 (bits 12..14) -> dl = 3: -3.375
    ("IQ1_S", {0: F16_ONE, 36: struct.pack("<H", 0x9000)}, [-0.875] * 32 + [-3.375] * 32 + [-0.875] * 192),
    # IQ1_M: the f16 super-scale 1.0 = 0x3C00 lives in the top nibbles of the four scale words
    ("IQ1_M", {48: struct.pack("<4H", 0x0000, 0x0000, 0xC000, 0x3000)}, [-0.875] * 256),
]


@pytest.mark.parametrize("type_name,fields,expected", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_hand_built_block_decodes_as_the_format_defines(type_name, fields, expected):
    raw = block(type_name, fields)
    np.testing.assert_array_equal(dequantize(raw, type_name), np.array(expected, np.float32))


def test_tq1_0_places_each_base3_digit_where_ggml_does():
    # byte 0xFF holds the digits 2,2,2,2,2 (t = ((u8)(b * 3^i) * 3) >> 8); zero bytes hold 0s.
    # qs[0] feeds elements 0, 32, 64, 96, 128; qs[32] feeds 160, 176, …; qh[1] feeds 241, 245, 249, 253.
    raw = block("TQ1_0", {0: b"\xff", 32: b"\xff", 49: b"\xff", 52: F16_TWO})
    expected = np.full(256, -2.0, np.float32)
    expected[[0, 32, 64, 96, 128, 160, 176, 192, 208, 224, 241, 245, 249, 253]] = 2.0
    np.testing.assert_array_equal(dequantize(raw, "TQ1_0"), expected)


def test_iq_grids_and_signs_select_the_documented_points():
    # iq2xxs_grid[1] = 0x080808080808082b: element 0 is 43. Sign index 1 -> ksigns 0x81 negates
    # elements 0 and 7 of that 8 (parity bit). Scale nibble 1 -> 0.375.
    a1 = struct.pack("<I", (1 << 28) | 1)
    raw = block("IQ2_XXS", {0: F16_ONE, 2: bytes([1, 0, 0, 0]) + a1})
    values = dequantize(raw, "IQ2_XXS")
    np.testing.assert_array_equal(values[:8], np.array([-43, 8, 8, 8, 8, 8, 8, -8], np.float32) * 0.375)
    np.testing.assert_array_equal(values[8:32], np.full(24, 3.0, np.float32))


@pytest.mark.parametrize("type_name", ["Q8_1", "Q8_K", "Q1_0"])
def test_types_gguf_py_cannot_decode_match_the_scalar_transcription(type_name):
    rng = np.random.default_rng(7)
    raw = random_blocks(rng, type_name, 40)
    expected = scalar_reference(type_name, raw, 1).reshape(-1)
    assert np.array_equal(dequantize(raw, type_name).view(np.uint32), expected.view(np.uint32))


# ----------------------------------------------------------------------------- against gguf-py


@pytest.mark.parametrize("type_name", GGUF_DEQUANTIZABLE)
def test_every_type_is_bit_identical_to_gguf_py(type_name):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(zlib.crc32(type_name.encode()))
    raw = random_blocks(rng, type_name, 96)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(-1)
    got = dequantize(raw, type_name)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_blocks_property_against_gguf_py(data):
    gguf = pytest.importorskip("gguf")
    type_name = data.draw(st.sampled_from(GGUF_DEQUANTIZABLE))
    seed = data.draw(st.integers(0, 2**32 - 1))
    raw = random_blocks(np.random.default_rng(seed), type_name, data.draw(st.integers(1, 20)))
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(-1)
    assert np.array_equal(dequantize(raw, type_name).view(np.uint32), expected.view(np.uint32))


def test_every_block_type_in_the_table_has_a_kernel():
    kernels = {t.name for t in TYPES if t.quantized and t.removed is None}
    assert kernels == set(KERNELS)
    assert all(quant.supported(name) for name in KERNELS)
    assert quant.supported("F16") and not quant.supported("Q4_0_4_4") and not quant.supported("NOPE")


# ----------------------------------------------------------------------------- the driver


def test_the_dequantizing_pool_grows_to_the_threads_asked_for_and_no_further(monkeypatch):
    from weightio import _threads

    monkeypatch.setattr(_threads, "_pools", {})  # (a pool of this test's own)
    n_blocks = 8 * quant.THREADED_CHUNK_ELEMENTS // by_name("Q8_0").block_size  # enough for 4 threads
    raw = random_blocks(np.random.default_rng(5), "Q8_0", n_blocks)
    expected = dequantize(raw, "Q8_0", threads=1)
    assert "dequant" not in _threads._pools  # (one thread: no pool)
    assert np.array_equal(dequantize(raw, "Q8_0", threads=2), expected)
    two, size = _threads._pools["dequant"]
    assert size == 2 and two._max_workers == 2
    assert np.array_equal(dequantize(raw, "Q8_0", threads=4), expected)
    four, size = _threads._pools["dequant"]
    assert four is not two and size == 4 and four._max_workers == 4
    assert two.submit(int).result() == 0  # a caller still holding the smaller pool (another thread) may go on
    replaced = set(two._threads)
    del two
    gc.collect()
    for thread in replaced:  # forgotten and collected: its threads end
        thread.join(10)
        assert not thread.is_alive()
    assert np.array_equal(dequantize(raw, "Q8_0", threads=3), expected)
    assert _threads._pools["dequant"] == (four, 4)  # fewer threads asked for: the larger pool serves
    assert _threads.shared_pool("dequant", 8) is four  # (without grow: the pool as made)
    four.shutdown()


@pytest.mark.parametrize("type_name", ["Q4_K", "IQ2_XS", "Q8_0"])
def test_threaded_chunks_equal_one_pass(type_name, monkeypatch):
    rng = np.random.default_rng(3)
    n_blocks = 4 * quant.THREADED_CHUNK_ELEMENTS // by_name(type_name).block_size + 7  # two threads, ragged end
    raw = random_blocks(rng, type_name, n_blocks)
    assert decoding._worker_count(4, n_blocks * by_name(type_name).block_size) == 2
    one = dequantize(raw, type_name, threads=1)
    many = dequantize(raw, type_name, threads=4)
    monkeypatch.setattr(decoding, "CHUNK_ELEMENTS", 10**9)
    whole = dequantize(raw, type_name, threads=1)
    assert np.array_equal(one.view(np.uint32), many.view(np.uint32))
    assert np.array_equal(one.view(np.uint32), whole.view(np.uint32))


def test_dequantizing_uses_the_cpus_of_the_affinity_mask_by_default(monkeypatch):
    monkeypatch.setattr(decoding, "_threads", None)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3, 7}, raising=False)  # (taskset -c 2,3,7)
    many = 100 * 2 * quant.THREADED_CHUNK_ELEMENTS
    assert decoding._worker_count(None, many) == 3
    assert decoding._worker_count(5, many) == 5  # (an explicit count is kept)
    decoding.set_threads(2)
    assert decoding._worker_count(None, many) == 2


def test_shape_and_argument_errors():
    raw = block("Q8_0", {0: F16_ONE})
    assert dequantize(np.concatenate([raw, raw]), "q8_0", (2, 32)).shape == (2, 32)
    with pytest.raises(ValueError, match="35 bytes are not whole Q8_0 blocks of 34 bytes"):
        dequantize(np.zeros(35, np.uint8), "Q8_0")
    with pytest.raises(ValueError, match=r"hold 32 elements, not shape \(4, 32\)"):
        dequantize(raw, "Q8_0", (4, 32))
    with pytest.raises(UnsupportedDTypeError, match="unknown ggml type 'Q9_9'"):
        dequantize(raw, "Q9_9")
    with pytest.raises(UnsupportedDTypeError, match="Q4_0_4_4: row-interleaved Q4_0 repacking"):
        dequantize(np.zeros(18, np.uint8), "Q4_0_4_4")
    with pytest.raises(ValueError, match="threads must be a positive int"):
        quant.set_threads(0)


def test_plain_types_convert_to_float32():
    values = np.array([1.5, -2.0, 0.25], np.float32)
    assert dequantize(values.astype("<f2").view(np.uint8), "F16").tolist() == [1.5, -2.0, 0.25]
    assert dequantize(values.astype(ml_dtypes.bfloat16).view(np.uint8), "BF16").tolist() == [1.5, -2.0, 0.25]
    assert dequantize(np.array([-3, 4], "<i8").view(np.uint8), "I64").tolist() == [-3.0, 4.0]


def test_inf_and_nan_scales_decode_to_inf_and_nan_without_warnings():
    inf, nan = struct.pack("<e", float("inf")), struct.pack("<e", float("nan"))
    raw = np.concatenate([block("Q8_0", {0: inf, 2: rep(1, 32)}), block("Q8_0", {0: nan, 2: rep(1, 32)}),
                          block("Q8_0", {0: inf})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = dequantize(raw, "Q8_0")
    assert np.isposinf(values[:32]).all() and np.isnan(values[32:64]).all() and np.isnan(values[64:]).all()


def test_type_table_geometry():
    assert by_id(12).name == "Q4_K" and by_id(12).block_size == 256 and by_id(12).type_size == 144
    assert by_id(9).type_size == 36  # ggml's f16 Q8_1, not gguf-py's stale 40
    assert by_id(30).dtype == np.dtype(ml_dtypes.bfloat16) and not by_id(30).quantized
    assert by_id(4).removed.startswith("Q4_2 was removed") and by_id(36).removed is not None
    assert by_id(42) is None and by_name("q5_k").id == 13 and by_name(5) is None


def test_type_table_agrees_with_gguf_py():
    gguf = pytest.importorskip("gguf")
    for qtype, (block_size, type_size) in gguf.GGML_QUANT_SIZES.items():
        t = by_id(int(qtype))
        assert t.name == qtype.name
        if t.name != "Q8_1":  # gguf-py keeps the 2023 float-scale size (40)
            assert (t.block_size, t.type_size) == (block_size, type_size)


# ----------------------------------------------------------------------------- quantizers


def test_q8_0_rounds_half_away_from_zero_like_c():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 0.5, -0.5, 1.5]  # d = 1, so q = roundf(x): 127, 1, -1, 2
    q = quantize(x, "Q8_0")
    assert q.blocks.tobytes()[:2] == F16_ONE
    assert q.blocks[0, 2:6].view(np.int8).tolist() == [127, 1, -1, 2]
    assert q.numpy().tolist() == [[127.0, 1.0, -1.0, 2.0] + [0.0] * 28]


def test_q4_0_scale_is_the_signed_largest_magnitude_over_minus_8():
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 16] = -8.0, 8.0, 4.0  # first largest magnitude wins: d = -8 / -8 = 1
    q = quantize(x, "Q4_0")
    assert q.blocks[0, :2].tobytes() == F16_ONE
    # q = min(15, trunc(x / d + 8.5)): -8 -> 0, 8 -> 15 (clamped from 16), 0 -> 8, 4 -> 12
    assert q.blocks[0, 2] == 0 | (12 << 4) and q.blocks[0, 3] == 15 | (8 << 4)


def test_bf16_rounds_to_nearest_even_and_keeps_nan():
    x = np.array([[1.0, np.float32(1 + 2**-8), np.float32(1 + 3 * 2**-8), np.nan]], np.float32)
    bits = quantize(x, "BF16").blocks.view("<u2").tolist()[0]
    assert bits[:3] == [0x3F80, 0x3F80, 0x3F82] and (bits[3] & 0x7F80) == 0x7F80 and bits[3] & 0x7F


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "BF16", "F16"])
def test_quantizers_are_byte_identical_to_gguf_py(type_name):
    gguf = pytest.importorskip("gguf")
    x = np.random.default_rng(11).standard_normal((16, 96)).astype(np.float32)
    x[0, :32] = 0  # an all-zero block: d = 0, no division
    expected = gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name])
    got = quantize(x, type_name)
    assert got.blocks.tobytes() == np.ascontiguousarray(expected).tobytes()
    assert got.shape == (16, 96) and got.nbytes == expected.nbytes


def test_quantized_tensor_round_trip_and_errors():
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    q = quantize(x, "Q8_0")
    assert isinstance(q, QuantizedTensor) and q.ggml_type == "Q8_0" and q.shape == (2, 32) and q.nbytes == 68
    assert np.abs(np.asarray(q) - x).max() <= 1 / 127 / 2 + 1e-7  # Q8_0 error is at most d/2
    with pytest.raises(UnsupportedDTypeError, match="rows of 30 elements are not whole Q8_0 blocks of 32"):
        quantize(np.zeros((2, 30), np.float32), "Q8_0")
    with pytest.raises(UnsupportedDTypeError, match="cannot quantize to 'Q4_K'"):
        quantize(x, "Q4_K")
    with pytest.raises(UnsupportedDTypeError, match="cannot quantize a <U1 array"):
        quantize(np.array(["a"]), "Q8_0")


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_dequantizing_still_works_in_a_forked_child():
    import multiprocessing

    rng = np.random.default_rng(5)
    raw = random_blocks(rng, "Q4_K", 4 * quant.THREADED_CHUNK_ELEMENTS // 256)
    expected = dequantize(raw, "Q4_K", threads=2)  # the thread pool now exists in this process
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() of a multi-threaded process
        with multiprocessing.get_context("fork").Pool(1) as pool:
            got = pool.apply_async(_dequantize_in_child, (raw,)).get(timeout=60)
    assert got == expected.tobytes()


def _dequantize_in_child(raw: np.ndarray) -> bytes:
    return dequantize(raw, "Q4_K", threads=2).tobytes()


# In a fresh process: whether an allocation of 12 MiB (glibc maps one that large on its own until
# its mmap threshold is raised past it) lies in the process's heap, before and after `step`. Each is
# kept: freeing a block mapped on its own would raise the threshold itself.
_HEAP_PROBE = """
import os, sys
import numpy as np
kept = []
def in_heap():
    a = np.empty(12 << 20, np.uint8)
    kept.append(a)
    at = a.__array_interface__["data"][0]
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("[heap]"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= at < hi:
                return True
    return False
before = in_heap()
if before:  # (something at start-up freed a block this large already: nothing to show)
    print("raised at start")
    sys.exit()
exec(sys.argv[1])
print(before, in_heap())
"""


def _heap_probe(step: str, **env: str) -> str:
    import subprocess

    # (the caller's malloc settings and preloaded allocators left out: each would fix the thresholds)
    clean = {k: v for k, v in os.environ.items()
             if not (k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD"))}
    out = subprocess.run([sys.executable, "-c", _HEAP_PROBE, step], capture_output=True, text=True, timeout=120,
                         env={**clean, **env})
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "raised at start":
        pytest.skip("this Python's start-up raised malloc's threshold already")
    return out.stdout.strip()


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


@pytest.mark.skipif(not (sys.platform.startswith("linux") and _glibc() and sys.maxsize > 2**32),
                    reason="64-bit glibc's malloc thresholds")
def test_dequantizing_keeps_its_temporaries_in_the_heap():
    """A dequantization raises glibc's mmap threshold past its chunks' temporaries: a block of 12 MiB
    was mapped on its own before the first one, and comes from the heap after it (without this, the
    same kernels made fresh pages for every chunk in some processes: Q6_K 2.4x slower)."""
    step = "from weightio import quant; quant.dequantize(np.zeros(34 * 8, np.uint8), 'Q8_0')"
    assert _heap_probe(step) == "False True"
    assert _heap_probe("from weightio.quant import quantize; quantize(np.zeros((2, 64), np.float32), 'Q8_0')") \
        == "False True"
    # thresholds the user fixed are left as they are
    assert _heap_probe(step, MALLOC_MMAP_THRESHOLD_="131072") == "False False"
