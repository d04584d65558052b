"""The dtype table and dtype-name parsing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from weightio.dtypes import TABLE, by_numpy, by_safetensors, by_torch, dtype_name, parse_dtype
from weightio.errors import UnsupportedDTypeError

SAFETENSORS_CODES = ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64",
                     "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "F4"]


def test_every_safetensors_dtype_has_a_row():
    assert sorted(row.safetensors for row in TABLE) == sorted(SAFETENSORS_CODES)
    for code in SAFETENSORS_CODES:
        row = by_safetensors(code)
        assert row.bits in (4, 6, 8, 16, 32, 64)
        assert row.packed == (row.bits < 8)
        if not row.packed:
            assert row.numpy.itemsize * 8 == row.bits


@pytest.mark.parametrize("spelling,expected", [
    ("bf16", ml_dtypes.bfloat16), ("bfloat16", ml_dtypes.bfloat16), ("BF16", ml_dtypes.bfloat16),
    ("torch.bfloat16", ml_dtypes.bfloat16), ("fp16", np.float16), ("half", np.float16), ("float32", np.float32),
    ("f32", np.float32), ("F8_E4M3", ml_dtypes.float8_e4m3fn), ("fp8", ml_dtypes.float8_e4m3fn),
    ("float8_e5m2", ml_dtypes.float8_e5m2), ("int64", np.int64), ("long", np.int64), (np.float64, np.float64),
    (np.dtype("int8"), np.int8), ("complex128", np.complex128),
])
def test_parse_dtype_spellings(spelling, expected):
    assert parse_dtype(spelling) == np.dtype(expected)


@pytest.mark.parametrize("bad", ["float128x", "object", "U5", "notatype", ",", "f4,,", "(1,", "(-1,)f4", "\udcff"])
def test_parse_dtype_rejects_non_numeric(bad):
    with pytest.raises(UnsupportedDTypeError, match="unknown dtype"):
        parse_dtype(bad)


def test_lookups_by_name_and_byte_order():
    assert by_numpy(np.dtype(">f4")).safetensors == "F32"
    assert by_torch("torch.float8_e4m3fn").safetensors == "F8_E4M3"
    assert dtype_name(np.dtype(">i4")) == ">int32" and dtype_name(np.dtype("<f2")) == "float16"
    with pytest.raises(UnsupportedDTypeError, match="unknown safetensors dtype 'F128'"):
        by_safetensors("F128")
    with pytest.raises(UnsupportedDTypeError, match="dtype complex128 has no safetensors/torch equivalent"):
        by_numpy(np.dtype(np.complex128))


@pytest.mark.parametrize("dtype,number,name", [
    (np.dtype(ml_dtypes.bfloat16).newbyteorder(">"), True, ">bfloat16"),  # big-endian torch files
    (np.dtype(ml_dtypes.float8_e4m3fn), True, "float8_e4m3fn"), (np.dtype(">f4"), True, ">float32"),
    (np.dtype("|S3"), False, "S3"), (np.dtype(">U3"), False, ">U3"), (np.dtype("|V2"), False, "V2"),
    (np.dtype(">M8[ns]"), False, ">datetime64[ns]"), (np.dtype("O"), False, "object"),
    (np.dtype([("a", "<f4"), ("b", "|S2", (2,))]), False, "[('a', '<f4'), ('b', '|S2', (2,))]"),
])
def test_is_number_and_dtype_name_of_numpys_other_dtypes(dtype, number, name):
    from weightio.dtypes import is_number

    assert is_number(dtype) is number and dtype_name(dtype) == name
