"""Block dequantizers: one small vectorized function per ggml block family.

Every kernel has the signature ``kernel(b, out)``: ``b`` is a ``(n, type_size)`` uint8 array of
``n`` blocks (rows of the file mapping, never written), ``out`` a C-contiguous
``(n, block_size)`` float32 array it fills. The layouts are ggml's block structs
(``ggml-common.h``, all fields little-endian) and the formulas its ``dequantize_row_*``
functions (``ggml-quants.c``); byte ranges below are ``[start:end)`` within one block.

Results are bit-identical to ggml (and to ``gguf.quants.dequantize``): every value is computed
with the same float32 operations in the same order as the C code — e.g. Q4_K is
``(d * sc) * q - (dmin * m)``, never a fused or reassociated form. Integer work (unpacking
nibbles, bit planes, grid lookups, signs) is done on uint8/int8 arrays in long loops (strided
block fields are copied contiguous first; shifts run on 64-bit words where numpy has SIMD for
them), and each kernel ends by converting the integers into ``out`` and scaling them in place.

Conventions used by several families:

* split nibbles: a 32-element block with 16 bytes ``qs`` holds element ``j`` in the low nibble
  of ``qs[j]`` and element ``j + 16`` in its high nibble;
* bit ``k`` of a byte array is ``(a[k // 8] >> (k % 8)) & 1`` (``numpy.unpackbits`` with
  ``bitorder="little"``);
* a sign bit set means the element is negated. Negating before or after a multiplication gives
  the same float, so signs are applied to small integers before the float pass.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import grids

__all__ = ["KERNELS", "Kernel"]

Kernel = Callable[[np.ndarray, np.ndarray], None]

_F16 = np.dtype("<f2")
_F32 = np.dtype("<f4")
_U16 = np.dtype("<u2")
_U32 = np.dtype("<u4")
_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)  # four 2-bit fields per byte

# ksigns_iq2xs[i]: seven stored sign bits plus an eighth that makes the count of set bits even.
_KSIGNS = np.array([i | (bin(i).count("1") & 1) << 7 for i in range(128)], dtype=np.uint8)
_KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
_KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # 2x E2M1


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The f16 field at byte `at` of every block, as an (n, 1) float32 column."""
    return b[:, at:at + 2].view(_F16).astype(np.float32)


def _split_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) uint8 in split order: the low nibbles, then the high ones."""
    qs = np.ascontiguousarray(qs)  # block fields are strided: a copy makes the loops below long
    q = np.empty((qs.shape[0], 2, 16), np.uint8)
    np.bitwise_and(qs, 15, out=q[:, 0])
    np.right_shift(qs, 4, out=q[:, 1])
    return q.reshape(qs.shape[0], 32)


def _bits(a: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 8k) uint8 bits, least significant bit of each byte first."""
    return np.unpackbits(a, axis=1, bitorder="little")


def _fields_2bit(qs: np.ndarray, groups: int) -> np.ndarray:
    """(n, 32 * groups) bytes -> (n, groups * 128) 2-bit fields, as ggml's K-quant loops order them:
    for each 32-byte group, the fields at shift 0 of its 32 bytes, then shift 2, 4 and 6."""
    return _bit_planes(qs.reshape(qs.shape[0], groups, 32), 2)


def _bit_planes(src: np.ndarray, width: int) -> np.ndarray:
    """(n, g, 32) bytes -> (n, g * (8 // width) * 32): for each group, its `width`-bit fields at
    shift 0, then at the next shift, … (the plane order of ggml's K-quant and hmask loops).

    One scalar shift per plane over the whole chunk: numpy runs those as long SIMD loops, where a
    broadcast shift (n, g, 1, 32) >> (1, 1, planes, 1) would run 32-element inner loops.
    """
    src = np.ascontiguousarray(src)
    n, groups, _ = src.shape
    planes = 8 // width
    q = np.empty((n, groups, planes, 32), np.uint8)
    for k in range(planes):
        np.right_shift(src, width * k, out=q[:, :, k])
    q &= (1 << width) - 1
    return q.reshape(n, groups * planes * 32)


def _shift_up(bits: np.ndarray, k: int) -> np.ndarray:
    """`bits <<= k` for a contiguous uint8 array whose values stay below 256 >> k, done on 64-bit
    words (numpy has SIMD shifts for those, not for bytes); no bit crosses into the next byte."""
    words = bits.reshape(-1).view(np.uint64) if bits.size % 8 == 0 else None
    if words is None:
        bits <<= k
    else:
        words <<= np.uint64(k)
    return bits


def _scale_times_int(q: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
    """out = float32(q) * scale, with `q` (n, g, k) integers and `scale` (n, g) float32 per group.

    Converting first and scaling in place is faster than one mixed-type broadcast multiply, which
    numpy runs through its casting buffer in short inner loops; the float results are the same.
    """
    n, g = scale.shape
    np.copyto(out.reshape(q.shape), q, casting="unsafe")
    out.reshape(n, g, -1)[...] *= scale.reshape(n, g, 1)


def _flip_signs(q: np.ndarray, sign_bits: np.ndarray) -> np.ndarray:
    """int8 `q` with the elements whose sign bit (0/1, same shape) is set negated."""
    mask = sign_bits.view(np.int8)
    np.negative(mask, out=mask)  # 0 or -1: two's complement negation is (q ^ -1) - (-1)
    q = np.bitwise_xor(q, mask, out=q)
    return np.subtract(q, mask, out=q)


# ----------------------------------------------------------------------------- 32-element blocks


def q4_0(b: np.ndarray, out: np.ndarray) -> None:
    """Q4_0, 18 bytes: d f16 [0:2), qs[16] [2:18). y = (q - 8) * d."""
    q = _split_nibbles(b[:, 2:18]).view(np.int8)
    q -= 8
    _scale_times_int(q, _f16(b, 0), out)


def q4_1(b: np.ndarray, out: np.ndarray) -> None:
    """Q4_1, 20 bytes: d f16 [0:2), m f16 [2:4), qs[16] [4:20). y = q * d + m."""
    _scale_times_int(_split_nibbles(b[:, 4:20]), _f16(b, 0), out)
    out += _f16(b, 2)


def _q5(b: np.ndarray, qh_at: int) -> np.ndarray:
    """The 5-bit quants of Q5_0/Q5_1: split nibbles of qs[16] plus bit i of the u32 qh."""
    q = _split_nibbles(b[:, qh_at + 4:qh_at + 20])
    q |= _shift_up(_bits(b[:, qh_at:qh_at + 4]), 4)
    return q


def q5_0(b: np.ndarray, out: np.ndarray) -> None:
    """Q5_0, 22 bytes: d f16 [0:2), qh[4] [2:6), qs[16] [6:22). y = (q - 16) * d."""
    q = _q5(b, 2).view(np.int8)
    q -= 16
    _scale_times_int(q, _f16(b, 0), out)


def q5_1(b: np.ndarray, out: np.ndarray) -> None:
    """Q5_1, 24 bytes: d f16 [0:2), m f16 [2:4), qh[4] [4:8), qs[16] [8:24). y = q * d + m."""
    _scale_times_int(_q5(b, 4), _f16(b, 0), out)
    out += _f16(b, 2)


def q8_0(b: np.ndarray, out: np.ndarray) -> None:
    """Q8_0, 34 bytes: d f16 [0:2), qs i8[32] [2:34). y = qs * d."""
    _scale_times_int(b[:, 2:34].view(np.int8), _f16(b, 0), out)


def q8_1(b: np.ndarray, out: np.ndarray) -> None:
    """Q8_1, 36 bytes: d f16 [0:2), s f16 [2:4) (= d * sum(qs), not needed), qs i8[32] [4:36). y = qs * d."""
    _scale_times_int(b[:, 4:36].view(np.int8), _f16(b, 0), out)


def _nibble_pairs(table: np.ndarray) -> np.ndarray:
    """For every byte, (table[low nibble], table[high nibble]) packed as two int8 in a uint16, so one
    `np.take` decodes both nibbles of a byte (much faster than two lookups)."""
    x = np.arange(256)
    return np.stack([table[x & 15], table[x >> 4]], axis=1).astype(np.int8).view(np.uint16).reshape(256)


def _lookup_split(qs: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 2, 16) int8: the table values of the low nibbles, then of the high
    nibbles (split order), as a transposed view of one lookup."""
    both = np.take(pairs, qs, mode="clip").view(np.int8).reshape(*qs.shape, 2)
    return np.swapaxes(both, -1, -2)


_IQ4NL_PAIRS = _nibble_pairs(_KVALUES_IQ4NL)
_MXFP4_PAIRS = _nibble_pairs(_KVALUES_MXFP4)


def iq4_nl(b: np.ndarray, out: np.ndarray) -> None:
    """IQ4_NL, 18 bytes: d f16 [0:2), qs[16] [2:18). y = d * kvalues_iq4nl[q] (a 16-level non-linear grid)."""
    _scale_times_int(_lookup_split(b[:, 2:18], _IQ4NL_PAIRS), _f16(b, 0), out)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) as float32 (ggml_e8m0_to_fp32_half): halved, since the E2M1 table is doubled."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return bits.view(np.float32)


def mxfp4(b: np.ndarray, out: np.ndarray) -> None:
    """MXFP4, 17 bytes: e u8 [0:1) (E8M0 shared exponent), qs[16] [1:17) (E2M1 codes).
    y = kvalues_mxfp4[q] * 2^(e - 128)."""
    _scale_times_int(_lookup_split(b[:, 1:17], _MXFP4_PAIRS), _e8m0_half(b[:, 0:1]), out)


def _ue4m3_half_table() -> np.ndarray:
    """ggml_ue4m3_to_fp32(x) * 0.5 for every byte x: unsigned E4M3 (bias 7, bit 7 ignored);
    0x00 and 0x7F (the NaN code) give 0."""
    x = np.arange(256)
    exp, man = (x >> 3) & 15, (x & 7).astype(np.float64)
    raw = np.where(exp == 0, man * 2.0**-9, (1 + man / 8) * 2.0 ** (exp - 7))
    return np.where((x == 0) | (x == 0x7F), 0.0, raw * 0.5).astype(np.float32)  # exact: few mantissa bits


_UE4M3_HALF = _ue4m3_half_table()


def nvfp4(b: np.ndarray, out: np.ndarray) -> None:
    """NVFP4, 36 bytes per 64: d u8[4] [0:4) (UE4M3 scale per 16), qs[32] [4:36): sub-block s uses
    qs[8s:8s+8], split nibbles. y = kvalues_mxfp4[q] * ue4m3(d[s]) / 2."""
    n = b.shape[0]
    q = np.swapaxes(np.take(_MXFP4_PAIRS, b[:, 4:36].reshape(n, 4, 8), mode="clip").view(np.int8)
                    .reshape(n, 4, 8, 2), -1, -2)
    _scale_times_int(q, np.take(_UE4M3_HALF, b[:, 0:4], mode="clip"), out)


def q1_0(b: np.ndarray, out: np.ndarray) -> None:
    """Q1_0, 18 bytes per 128: d f16 [0:2), qs[16] [2:18) (one bit per element). y = bit ? d : -d."""
    q = _bits(b[:, 2:18]).view(np.int8)
    q += q
    q -= 1
    _scale_times_int(q, _f16(b, 0), out)


# ----------------------------------------------------------------------------- K-quants (256 elements)


def q2_k(b: np.ndarray, out: np.ndarray) -> None:
    """Q2_K, 84 bytes: scales[16] [0:16) (low nibble scale, high nibble min, per 16 elements),
    qs[64] [16:80) (2-bit quants), d f16 [80:82), dmin f16 [82:84).
    y = (d * (sc & 15)) * q - (dmin * (sc >> 4))."""
    scales = b[:, 0:16]
    dl = _f16(b, 80) * (scales & 15)
    ml = _f16(b, 82) * (scales >> 4)
    _scale_times_int(_fields_2bit(b[:, 16:80], 2), dl, out)
    out.reshape(-1, 16, 16)[...] -= ml[:, :, None]


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's sixteen 6-bit scales from 12 bytes: low 4 bits from s[0:8] (low nibbles, then high
    nibbles), high 2 bits from the 2-bit fields of s[8:12]; as int8 minus 32."""
    n = s.shape[0]
    low = np.concatenate([s[:, 0:8] & 15, s[:, 0:8] >> 4], axis=1)
    high = np.right_shift(s[:, 8:12].reshape(n, 1, 4), _SHIFT_2BIT.reshape(1, 4, 1)) & 3
    scale = (low | (high.reshape(n, 16) << 4)).view(np.int8)
    scale -= 32
    return scale


def q3_k(b: np.ndarray, out: np.ndarray) -> None:
    """Q3_K, 110 bytes: hmask[32] [0:32), qs[64] [32:96), scales[12] [96:108), d f16 [108:110).
    q = 2-bit quant - (hmask bit set ? 0 : 4) in -4..3; y = (d * (scale - 32)) * q. The hmask bit of
    element e is bit (e // 32) of hmask[e % 32]."""
    n = b.shape[0]
    q = _fields_2bit(b[:, 32:96], 2)
    high = _bit_planes(b[:, 0:32].reshape(n, 1, 32), 1)  # bit k of hmask[l] -> element 32k + l
    q |= _shift_up(high, 2)
    q = q.view(np.int8)
    q -= 4
    _scale_times_int(q, _f16(b, 108) * _q3_k_scales(b[:, 96:108]), out)


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for all j: eight 6-bit scales and eight 6-bit mins packed in 12 bytes."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def _q4_k_like(b: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    """y = (d * sc[j]) * q - (dmin * m[j]) for the 32-element sub-block j of Q4_K/Q5_K."""
    sc, m = _k4_scales(b[:, 4:16])
    _scale_times_int(q, _f16(b, 0) * sc, out)
    out.reshape(-1, 8, 32)[...] -= (_f16(b, 2) * m)[:, :, None]


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 256): per 32-byte chunk, its low nibbles then its high nibbles."""
    n = qs.shape[0]
    q = np.empty((n, 4, 2, 32), np.uint8)
    chunks = np.ascontiguousarray(qs).reshape(n, 4, 32)
    np.bitwise_and(chunks, 15, out=q[:, :, 0])
    np.right_shift(chunks, 4, out=q[:, :, 1])
    return q.reshape(n, 256)


def q4_k(b: np.ndarray, out: np.ndarray) -> None:
    """Q4_K, 144 bytes: d f16 [0:2), dmin f16 [2:4), scales[12] [4:16), qs[128] [16:144); element
    64c + l is the low nibble of qs[32c + l] (l < 32), element 64c + 32 + l its high nibble."""
    _q4_k_like(b, _k_nibbles(b[:, 16:144]), out)


def q5_k(b: np.ndarray, out: np.ndarray) -> None:
    """Q5_K, 176 bytes: d, dmin, scales[12] as Q4_K, qh[32] [16:48), qs[128] [48:176);
    q = Q4_K's nibble + 16 * bit (e // 32) of qh[e % 32]."""
    n = b.shape[0]
    q = _k_nibbles(b[:, 48:176])
    high = _bit_planes(b[:, 16:48].reshape(n, 1, 32), 1)  # bit j of qh[l] -> element 32j + l
    q |= _shift_up(high, 4)
    _q4_k_like(b, q, out)


def _q6_high_table() -> np.ndarray:
    """For every qh byte: its four 2-bit fields as Q6_K high bits minus the bias, ((f << 4) - 32) as
    int8, packed in a uint32 (one lookup replaces three passes of shifts and masks)."""
    x = np.arange(256)
    fields = np.stack([((x >> (2 * k)) & 3) * 16 - 32 for k in range(4)], axis=1)
    return fields.astype(np.int8).view(np.uint32).reshape(256)


_Q6_HIGH = _q6_high_table()


def q6_k(b: np.ndarray, out: np.ndarray) -> None:
    """Q6_K, 210 bytes: ql[128] [0:128), qh[64] [128:192), scales i8[16] [192:208), d f16 [208:210).
    Per 128-element half h: low 4 bits from ql[64h:64h+64] (low nibbles give elements 0..63,
    high nibbles 64..127), high 2 bits from the 2-bit fields of qh[32h:32h+32];
    y = (d * scale[e // 16]) * (q - 32)."""
    n = b.shape[0]
    q: np.ndarray = np.empty((n, 2, 2, 64), np.uint8)  # re-viewed as int8 below
    ql = b[:, 0:128].reshape(n, 2, 64)
    np.bitwise_and(ql, 15, out=q[:, :, 0])
    np.right_shift(ql, 4, out=q[:, :, 1])
    q = q.view(np.int8).reshape(n, 2, 4, 32)
    # (n, 2, 32, 4) lookups, viewed in element order (half, field, byte)
    high = np.take(_Q6_HIGH, b[:, 128:192], mode="clip").view(np.int8).reshape(n, 2, 32, 4).transpose(0, 1, 3, 2)
    np.add(q, high, out=q)  # low nibble + (high << 4) - 32: -32..31, no carries between the parts
    _scale_times_int(q, _f16(b, 208) * b[:, 192:208].view(np.int8), out)


def q8_k(b: np.ndarray, out: np.ndarray) -> None:
    """Q8_K, 292 bytes: d f32 [0:4), qs i8[256] [4:260), bsums i16[16] [260:292) (not needed). y = d * qs."""
    _scale_times_int(b[:, 4:260].view(np.int8), b[:, 0:4].view(_F32), out)


# ----------------------------------------------------------------------------- ternary


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits(qs: np.ndarray, powers: int) -> np.ndarray:
    """(n, k) bytes each holding base-3 digits scaled to 0..255 -> (n, powers, k) trits 0..2:
    t = ((u8)(byte * 3^i) * 3) >> 8 (the multiply wraps to a byte)."""
    x = np.multiply(qs[:, None, :], _POW3[:powers].reshape(1, powers, 1), dtype=np.uint8).astype(np.uint16)
    x *= 3
    x >>= 8
    return x.astype(np.int8)


def tq1_0(b: np.ndarray, out: np.ndarray) -> None:
    """TQ1_0, 54 bytes: qs[48] [0:48), qh[4] [48:52), d f16 [52:54). Elements 0..159: trit i of
    qs[m] (m < 32) is element 32i + m; 160..239: trit i of qs[32 + m] is 160 + 16i + m; 240..255:
    trit i of qh[j] is 240 + 4i + j. y = (t - 1) * d."""
    n = b.shape[0]
    t = np.concatenate([_trits(b[:, 0:32], 5).reshape(n, 160), _trits(b[:, 32:48], 5).reshape(n, 80),
                        _trits(b[:, 48:52], 4).reshape(n, 16)], axis=1)
    t -= 1
    _scale_times_int(t, _f16(b, 52), out)


def tq2_0(b: np.ndarray, out: np.ndarray) -> None:
    """TQ2_0, 66 bytes: qs[64] [0:64) (2-bit fields, K-quant order), d f16 [64:66). y = (q - 1) * d."""
    q = _fields_2bit(b[:, 0:64], 2).view(np.int8)
    q -= 1
    _scale_times_int(q, _f16(b, 64), out)


# ----------------------------------------------------------------------------- i-quants (grids)


_IQ2XXS = np.array(grids.IQ2XXS_GRID, dtype=np.uint64)
_IQ2XS = np.array(grids.IQ2XS_GRID, dtype=np.uint64)
_IQ2S = np.array(grids.IQ2S_GRID, dtype=np.uint64)
_IQ3XXS = np.array(grids.IQ3XXS_GRID, dtype=np.uint32)
_IQ3S = np.array(grids.IQ3S_GRID, dtype=np.uint32)
_IQ1S = np.array(grids.IQ1S_GRID, dtype=np.uint64)


def _grid(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The grid points `index` selects, as (n, elements) bytes (byte j of a word = element j)."""
    return np.take(table, index, mode="clip").view(np.uint8).reshape(index.shape[0], -1)


def _ksign_bits(idx7: np.ndarray) -> np.ndarray:
    """(n, k) 7-bit sign indices -> (n, 8k) sign bits through ksigns_iq2xs."""
    return _bits(np.take(_KSIGNS, idx7, mode="clip"))


def iq2_xxs(b: np.ndarray, out: np.ndarray) -> None:
    """IQ2_XXS, 66 bytes: d f16 [0:2), then per 32-element group g a u32 pair (a0, a1) at 2 + 8g:
    the bytes of a0 index iq2xxs_grid (8 elements each); a1 holds four 7-bit sign indices (bits
    7l..7l+6) and the scale (bits 28..31). y = d * (0.5 + scale) * 0.25 * grid * sign."""
    n = b.shape[0]
    a = b[:, 2:66].reshape(n, 8, 8)
    a1 = a[:, :, 4:8].copy().view(_U32).reshape(n, 8)
    db = _f16(b, 0) * (np.float32(0.5) + (a1 >> 28).astype(np.float32)) * np.float32(0.25)
    signs = ((a1[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127).astype(np.uint8)
    q = _grid(_IQ2XXS, a[:, :, 0:4].reshape(n, 32)).view(np.int8)
    _scale_times_int(_flip_signs(q, _ksign_bits(signs.reshape(n, 32))), db, out)


def _iq2_scales(d: np.ndarray, s: np.ndarray) -> np.ndarray:
    """IQ2_XS/IQ2_S: eight bytes of two 4-bit scales -> (n, 16) d * (0.5 + s) * 0.25, one per 16 elements."""
    nib = np.empty((s.shape[0], 8, 2), np.uint8)
    np.bitwise_and(s, 15, out=nib[:, :, 0])
    np.right_shift(s, 4, out=nib[:, :, 1])
    return d * (np.float32(0.5) + nib.reshape(-1, 16).astype(np.float32)) * np.float32(0.25)


def iq2_xs(b: np.ndarray, out: np.ndarray) -> None:
    """IQ2_XS, 74 bytes: d f16 [0:2), qs u16[32] [2:66) (9-bit index into iq2xs_grid, 7-bit sign
    index), scales[8] [66:74) (low nibble for the first 16 elements of a group, high for the rest)."""
    v = b[:, 2:66].view(_U16)
    q = _grid(_IQ2XS, v & 511).view(np.int8)
    _scale_times_int(_flip_signs(q, _ksign_bits((v >> 9).astype(np.uint8))), _iq2_scales(_f16(b, 0), b[:, 66:74]), out)


def iq2_s(b: np.ndarray, out: np.ndarray) -> None:
    """IQ2_S, 82 bytes: d f16 [0:2), qs[32] [2:34) (low 8 index bits), signs[32] [34:66) (one bit per
    element), qh[8] [66:74) (2 high index bits per qs byte: qh[g] >> 2l), scales[8] [74:82) as IQ2_XS."""
    n = b.shape[0]
    high = np.right_shift(b[:, 66:74].reshape(n, 8, 1), _SHIFT_2BIT.reshape(1, 1, 4)) & 3
    index = b[:, 2:34].astype(np.uint16) | (high.reshape(n, 32).astype(np.uint16) << 8)
    q = _grid(_IQ2S, index).view(np.int8)
    _scale_times_int(_flip_signs(q, _bits(b[:, 34:66])), _iq2_scales(_f16(b, 0), b[:, 74:82]), out)


def iq3_xxs(b: np.ndarray, out: np.ndarray) -> None:
    """IQ3_XXS, 98 bytes: d f16 [0:2), qs[64] [2:66) (indices into iq3xxs_grid, 4 elements each),
    then per group g a u32 at 66 + 4g: four 7-bit sign indices and the scale (bits 28..31).
    y = d * (0.5 + scale) * 0.5 * grid * sign."""
    n = b.shape[0]
    w = b[:, 66:98].view(_U32)
    db = _f16(b, 0) * (np.float32(0.5) + (w >> 28).astype(np.float32)) * np.float32(0.5)
    signs = ((w[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127).astype(np.uint8)
    q = _grid(_IQ3XXS, b[:, 2:66]).view(np.int8)
    _scale_times_int(_flip_signs(q, _ksign_bits(signs.reshape(n, 32))), db, out)


def iq3_s(b: np.ndarray, out: np.ndarray) -> None:
    """IQ3_S, 110 bytes: d f16 [0:2), qs[64] [2:66) (low 8 index bits into iq3s_grid), qh[8] [66:74)
    (9th bit of index k of group g: qh[g] >> k), signs[32] [74:106) (one bit per element), scales[4]
    [106:110) (a nibble per group). y = d * (1 + 2 * scale) * grid * sign."""
    n = b.shape[0]
    index = b[:, 2:66].astype(np.uint16) | (_bits(b[:, 66:74]).astype(np.uint16) << 8)
    q = _grid(_IQ3S, index).view(np.int8)
    nib = np.empty((n, 4, 2), np.uint8)
    np.bitwise_and(b[:, 106:110], 15, out=nib[:, :, 0])
    np.right_shift(b[:, 106:110], 4, out=nib[:, :, 1])
    db = _f16(b, 0) * (1 + 2 * nib.reshape(n, 8))
    _scale_times_int(_flip_signs(q, _bits(b[:, 74:106])), db, out)


def _iq1_eighths() -> np.ndarray:
    """iq1s_grid with the delta folded in, in eighths: entry idx | (negative delta) << 11 holds the
    eight int8 values 8 * grid + (-1 or +1), i.e. 8 * (grid + delta) for delta = +-1/8."""
    grid = _IQ1S.view(np.int8).reshape(-1, 8).astype(np.int16) * 8
    both = np.concatenate([grid + 1, grid - 1]).astype(np.int8)
    return np.ascontiguousarray(both).view(np.uint64).reshape(-1)


_IQ1_EIGHTHS = _iq1_eighths()


def _iq1(index: np.ndarray, negative_delta: np.ndarray, dl: np.ndarray, out: np.ndarray) -> None:
    """y = dl * (grid + delta), delta = -0.125 where `negative_delta` else 0.125 (one grid point and
    delta per 8 elements, one dl per 32 (IQ1_S) or 16 (IQ1_M) elements).

    Computed as (dl * 0.125) * (8 * (grid + delta)): both products are the same real number, and
    dl * 0.125 is exact (dl >= 2^-24), so the float32 result is ggml's bit for bit, while the table
    lookup yields the integers 8 * (grid + delta) directly.
    """
    n = index.shape[0]
    key = index | (negative_delta.astype(np.uint16) << 11)
    q = np.take(_IQ1_EIGHTHS, key, mode="clip").view(np.int8).reshape(n, -1)
    _scale_times_int(q, dl * np.float32(0.125), out)


def iq1_s(b: np.ndarray, out: np.ndarray) -> None:
    """IQ1_S, 50 bytes: d f16 [0:2), qs[32] [2:34) (low 8 index bits into iq1s_grid), qh u16[8]
    [34:50) per group: 3 high index bits per qs byte (bits 3l..3l+2), the scale (bits 12..14), the
    delta sign (bit 15). y = d * (2 * scale + 1) * (grid + delta)."""
    n = b.shape[0]
    w = b[:, 34:50].view(_U16)
    high = (w[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    index = b[:, 2:34].astype(np.uint16) | (high.reshape(n, 32) << 8)
    dl = _f16(b, 0) * (2 * ((w >> 12) & 7) + 1)
    _iq1(index, np.repeat(w >= 0x8000, 4, axis=1), dl, out)


def iq1_m(b: np.ndarray, out: np.ndarray) -> None:
    """IQ1_M, 56 bytes: qs[32] [0:32), qh[16] [32:48) (a nibble per 8 elements: 3 high index bits and
    the delta sign, low nibble of qh[2g] first), sc u16[4] [48:56): twelve low bits hold sixteen 3-bit
    scales (one per 16 elements), the top nibbles of the four words the f16 super-scale d."""
    n = b.shape[0]
    sc = b[:, 48:56].view(_U16)
    top = sc >> 12
    d = (top[:, 0] | top[:, 1] << 4 | top[:, 2] << 8 | top[:, 3] << 12).astype(np.uint16).view(_F16)
    scale = (sc[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    dl = d.astype(np.float32).reshape(n, 1) * (2 * scale.reshape(n, 16) + 1)
    nib: np.ndarray = np.empty((n, 16, 2), np.uint8)  # reshaped to (n, 32) below
    np.bitwise_and(b[:, 32:48], 15, out=nib[:, :, 0])
    np.right_shift(b[:, 32:48], 4, out=nib[:, :, 1])
    nib = nib.reshape(n, 32)
    index = b[:, 0:32].astype(np.uint16) | ((nib & 7).astype(np.uint16) << 8)
    _iq1(index, nib >= 8, dl, out)


def iq4_xs(b: np.ndarray, out: np.ndarray) -> None:
    """IQ4_XS, 136 bytes: d f16 [0:2), scales_h u16 [2:4) (2 high bits per group), scales_l[4] [4:8)
    (a low nibble per group), qs[128] [8:136) (16 bytes per group, split nibbles into kvalues_iq4nl).
    y = (d * (ls - 32)) * kvalues_iq4nl[q]."""
    n = b.shape[0]
    low = np.empty((n, 4, 2), np.uint8)
    np.bitwise_and(b[:, 4:8], 15, out=low[:, :, 0])
    np.right_shift(b[:, 4:8], 4, out=low[:, :, 1])
    high = (b[:, 2:4].view(_U16) >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
    ls = (low.reshape(n, 8) | (high.astype(np.uint8) << 4)).view(np.int8)
    ls -= 32
    _scale_times_int(_lookup_split(b[:, 8:136].reshape(n, 8, 16), _IQ4NL_PAIRS), _f16(b, 0) * ls, out)


KERNELS: dict[str, Kernel] = {
    "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "Q8_0": q8_0, "Q8_1": q8_1,
    "Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k, "Q8_K": q8_k,
    "IQ2_XXS": iq2_xxs, "IQ2_XS": iq2_xs, "IQ2_S": iq2_s, "IQ3_XXS": iq3_xxs, "IQ3_S": iq3_s,
    "IQ1_S": iq1_s, "IQ1_M": iq1_m, "IQ4_NL": iq4_nl, "IQ4_XS": iq4_xs,
    "TQ1_0": tq1_0, "TQ2_0": tq2_0, "MXFP4": mxfp4, "NVFP4": nvfp4, "Q1_0": q1_0,
}
