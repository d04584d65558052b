"""Write the libFuzzer dictionaries in ``dicts/``: one per harness of ``fuzz.py``.

A dictionary gives the mutator the tokens a format is made of (magic numbers, field names, type
codes, boundary numbers), which random bit flips would take a long time to spell. The tokens
are kept here as Python bytes, so that they can be read and reviewed; run this script after
changing them::

    python tests/fuzz/make_dicts.py
"""

from __future__ import annotations

import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


# Counts and lengths a forged file would claim: 2^31, 2^32, 2^63, 2^64 - 1, …
NUMBERS = [u64(2**31), u64(2**32), u64(2**63), u64(2**64 - 1), u32(2**31), u32(2**32 - 1), u64(0), u32(0)]

SAFETENSORS_CODES = ("BOOL U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ I16 U16 F16 BF16 I32 U32 F32 C64 "
                     "F64 I64 U64 F4 F6_E2M3 F6_E3M2").split()
JSON = [b'"dtype"', b'"shape"', b'"data_offsets"', b'"__metadata__"', b"{", b"}", b"[", b"]", b":", b",", b"[]",
        b"{}", b"0", b"-1", b"1.5", b"1e300", b"18446744073709551616", b"9223372036854775807", b"NaN",
        b"Infinity", b"true", b"null", b'"\\u0000"', b'"\\ud800"', b" " * 8]
SAFETENSORS = JSON + [b'"%s"' % code.encode() for code in SAFETENSORS_CODES] + [u64(8), u64(100_000_001)]

NPY = [b"\x93NUMPY", b"\x01\x00", b"\x02\x00", b"\x03\x00", b"'descr'", b"'fortran_order'", b"'shape'", b"True",
       b"False", b"()", b"(0,)", b"(1,)", b",)", b", ", b"{", b"}", b"\n", b"'<f4'", b"'>f8'", b"'<i8'", b"'|b1'",
       b"'|u1'", b"'<c16'", b"'<f2'", b"'|O'", b"'<U3'", b"'|V8'", b"'<M8[s]'", b"[('a', '<f4')]", b"-1",
       b"2**62", b"1_0", b"0x10", b"\\x00",
       # the descriptor grammar of records, strings and datetimes (weightio.formats.npy_descr), Python 2 longs
       b"'|S3'", b"'>U3'", b"'<M8[D]'", b"'>m8[ns]'", b"'|V7'", b"('', '|V7')", b"('a', '<f4', (2,))",
       b"[('p', [('x', '<f4')])]", b"(('t', 'n'), '<f4')", b"[('o', '|O')]", b"('o', '|O', (2,))", b"[]",
       b"'|S2147483647'", b"'|S0'", b"'S999999999999'", b"(2**20, 2**20)", b"L", b"2L", b"(2L, 3L)",
       b"{'names': ['a'], 'formats': ['<f4'], 'offsets': [-4]}"]
ZIP = [b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07", b"PK\x07\x08",
       b"\x01\x00\x10\x00", b"\x01\x00\x18\x00", b"\x08\x00", b"\x00\x00", b"\x2d\x00", b"\x14\x00",
       b"\xff\xff\xff\xff", b"\xff\xff", b"\x00\x08"] + NUMBERS  # signatures, ZIP64 extra, methods, flags
NPZ = ZIP + NPY + [b".npy", b"/", b"../", b"a.npy"]

PICKLE_OPCODES = [b"\x80\x02", b"\x80\x04", b"\x80\x05", b"\x95", b"\x94", b"\x93", b"(", b"t", b"R", b"Q", b"q\x00",
                  b"r\x00\x00\x00\x00", b"h\x00", b"j\x00\x00\x00\x00", b"}", b"]", b")", b"\x85", b"\x86", b"\x87",
                  b"u", b"s", b"a", b"e", b"b", b".", b"0", b"1", b"2", b"K", b"M", b"J", b"\x8a", b"\x8b", b"X",
                  b"\x8c", b"U", b"T", b"B", b"C", b"\x8e", b"\x8d", b"G", b"F", b"I", b"L", b"V", b"S", b"\x88",
                  b"\x89", b"N", b"c", b"i", b"o", b"\x81", b"\x92", b"\x90", b"\x91", b"\x96", b"\x97", b"\x98",
                  b"P", b"p", b"g", b"d", b"l", b"\x82", b"\x83", b"\x84", b"\xff\xff\xff\x7f", b"\xff" * 8]
PICKLE_GLOBALS = [b"ctorch._utils\n_rebuild_tensor_v2\n", b"ctorch._utils\n_rebuild_parameter\n",
                  b"ctorch\nFloatStorage\n", b"ccollections\nOrderedDict\n", b"cbuiltins\neval\n", b"cos\nsystem\n",
                  b"cnumpy.core.multiarray\n_reconstruct\n", b"cnumpy\ndtype\n", b"cnumpy\nndarray\n",
                  b"\x8c\x0ctorch._utils\x94", b"\x8c\x12_rebuild_tensor_v2\x94", b"\x8c\x05torch\x94",
                  b"\x8c\x0cFloatStorage\x94", b"\x8c\x0bHalfStorage\x94", b"\x8c\x0bLongStorage\x94",
                  b"\x8c\x0bcollections\x94", b"\x8c\x0bOrderedDict\x94", b"\x8c\x07storage\x94", b"\x8c\x03cpu\x94",
                  b"\x8c\x010\x94", b"X\x07\x00\x00\x00storage", b"X\x03\x00\x00\x00cpu", b"\x8c\x06cuda:0"]
# Issue 12, classes 2, 3 and 5: opcodes that nest without MARK, BUILD/NEWOBJ on globals, memo sharing.
PICKLE_NESTING = [b"\x85" * 8, b"\x85" * 64, b"\x86" * 16, b")\x85", b"N\x85\x85\x85\x85", b"(h\x00tq\x000",
                  b"]h\x00aq\x000", b"}K\x00h\x00sq\x000", b"\x8f(h\x00\x90", b"(h\x00\x91", b"h\x00" * 16,
                  b"j\x00\x00\x00\x00" * 8, b"N}\x86b", b"}b", b"N}X\x0c\x00\x00\x00__defaults__)s\x86b",
                  b"X\x05\x00\x00\x00value", b"X\x0e\x00\x00\x00allowlisted_as", b")\x81",
                  b"cargparse\nNamespace\n", b"\x8c\x08argparse\x94\x8c\tNamespace\x94\x93", b"cnumpy\ndtype\n)\x81",
                  b"ccollections\nOrderedDict\n}b", b"ctorch\nfloat32\n", b"ctorch\nSize\n", b"K\x07" * 16]
# Issue 13: nested tensors, sub-byte quantized storages, legacy tensor classes + BUILD, Python 2 strings.
PICKLE_ISSUE13 = [b"ctorch._utils\n_rebuild_nested_tensor\n", b"\x8c\x16_rebuild_nested_tensor\x94",
                  b"ctorch._utils\n_rebuild_qtensor\n", b"ctorch\nQUInt4x2Storage\n", b"ctorch\nQUInt2x4Storage\n",
                  b"ctorch\nper_tensor_affine\n", b"ctorch\nIntStorage\n", b"ctorch\nTensor\n",
                  b"ctorch\nFloatTensor\n", b"ctorch\nLongTensor\n", b"ctorch.cuda\nFloatTensor\n", b")R", b"tb",
                  b"U\x07storage", b"U\x03cpu", b"U\x010", b"T\x00\x01\x00\x00", b"S'", b"'\n", b"\xc3\xa9",
                  b"\xff\xfe", b"\x95\x00\x00\x00\x00\x00\x00\x00\x00"]
PICKLE = PICKLE_OPCODES + PICKLE_GLOBALS + PICKLE_NESTING + PICKLE_ISSUE13
PYTORCH_ZIP = ZIP + PICKLE + [b"data.pkl", b"archive/", b"archive/data.pkl", b"archive/data/0", b"archive/byteorder",
                              b"archive/version", b"little", b"big", b"3\n", b"data/", b"constants.pkl",
                              b".format_version"]
PYTORCH_LEGACY = PICKLE + [b"\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.", b"M\xe9\x03.", b"\x8c\x10protocol_version",
                           b"\x8c\rlittle_endian", b"\x8c\ntype_sizes", b"\x8c\x05short", b"\x8c\x03int",
                           b"\x8c\x04long", b"L119547037146038801333356L\n", b"I1001\n", u64(1)] + NUMBERS
PYTORCH_TAR = PYTORCH_LEGACY + [b"ustar\x00", b"ustar  ", b"00", b"0000644\x00", b"00000000000\x00",
                                b"\x80\x00\x00\x00", b"sys_info", b"pickle", b"tensors", b"storages", b"path=",
                                b"size=", b"30 path=", b"\n", b"x", b"g", b"5", b"\x00" * 8, b" " * 8]
# The differential harness: every container's tokens, names that differ only in case, v7/GNU tar headers.
PYTORCH_DIFFERENTIAL = PYTORCH_ZIP + PYTORCH_TAR + NPZ + [b"DATA.PKL", b"archive/DATA.PKL", b"ARCHIVE/", b"DATA/0",
                                                         b"Data.pkl", b"data.PKL", b".debug_pkl", b"PK\x06\x06",
                                                         b"PK\x06\x07", b"PK\x05\x06", b"\x80\x03B", b"GNU.sparse",
                                                         b"hdrcharset=BINARY", b"././@LongLink", b"L", b"K", b"S"]
# The placeholder harness: unknown globals, module state keys, the training objects' stand-ins.
PYTORCH_PLACEHOLDER = PYTORCH_ZIP + PYTORCH_LEGACY + [
    b"cevil\nNet\n", b"c__main__\nModel\n", b"ctorch.nn.modules.linear\nLinear\n", b"\x8c\x04evil\x94\x8c\x01f\x94\x93",
    b")\x81", b"}b", b"N}\x86b", b"\x8c\x0b_parameters", b"\x8c\x08_buffers", b"\x8c\x08_modules",
    b"\x8c\x1b_non_persistent_buffers_set", b"\x8c\x06module", b"(\x8c\x06moduleQ",
    b"ctorch._tensor\n_rebuild_from_type_v2\n", b"comegaconf.dictconfig\nDictConfig\n)\x81",
    b"comegaconf.nodes\nAnyNode\n)\x81", b"\x8c\x08_content", b"\x8c\x04_val", b"cdatetime\ndatetime\n",
    b"cdatetime\ntimedelta\n", b"ctorch.torch_version\nTorchVersion\n", b"cpathlib\nPosixPath\n",
    b"ccollections\ndefaultdict\n", b"ctransformers.trainer_utils\nIntervalStrategy\n", b"\x82\x01", b"o", b"i"]

GGML_TYPE_IDS = [u32(i) for i in (*range(13), 14, 15, 16, 20, 23, 24, 29, 30, 31, 34, 35, 39, 40, 41)]
GGUF = [b"GGUF", b"FUGG", u32(1), u32(2), u32(3), u32(3 << 24), b"general.alignment", b"general.architecture",
        b"split.count", b"split.no", b"tokenizer.ggml.tokens", u64(17) + b"general.alignment", u64(5) + b"split",
        u32(9) + u32(8), u32(9) + u32(9), u32(9) + u32(4), b"\xff" * 4] + GGML_TYPE_IDS + NUMBERS
# whisper.cpp: n_mels / n_mel (80, 128), n_fft 201, vocabulary sizes, ftype with quantization version 2,
# int32 -1 counts, and its tensor names
WHISPER = [u32(80), u32(128), u32(201), u32(51864), u32(51865), u32(50257), u32(1500), u32(448), u32(2002),
           u32(2007), u32(1008), u32(3002), b"encoder.conv1.bias", b"decoder.token_embedding.weight",
           b"encoder.positional_embedding", b"<|endoftext|>"]
GGML = [b"lmgg", b"fmgg", b"tjgg", u32(1), u32(2), u32(3), u32(4), u32(1000), u32(2000), u32(32), u32(256),
        b"\x00\x00\x80\x3f"] + GGML_TYPE_IDS + NUMBERS + WHISPER

# Names that writers must refuse or escape, and text a terminal acts on (the cli_convert harness).
HOSTILE_TEXT = [b"../", b"/", b"..", b"\x1b[", b"\x1b]0;", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae", b"\xed\xa0\x80",
                b"\\ud800", b"__metadata__", b"\\u001b"]
DICTS = {"safetensors": SAFETENSORS, "npy": NPY, "npz": NPZ, "pytorch_zip": PYTORCH_ZIP,
         "pytorch_legacy": PYTORCH_LEGACY, "pytorch_tar": PYTORCH_TAR, "gguf": GGUF, "ggml": GGML,
         "cli_convert": SAFETENSORS + NPZ + GGUF + PYTORCH_ZIP + HOSTILE_TEXT,
         "pytorch_differential": PYTORCH_DIFFERENTIAL, "pytorch_placeholder": PYTORCH_PLACEHOLDER,
         # where msgspec's typed decode may differ: the metadata first or not, a '}' in its strings, -0, 1.0
         "safetensors_differential": SAFETENSORS + [b'{"__metadata__":{', b'"}"', b'"a:b"', b"-0", b"1.0", b"1E2",
                                                    b'"x":1,']}


def quote(token: bytes) -> str:
    """A token in libFuzzer's dictionary syntax: a C-like string with \\xNN escapes."""
    out = []
    for byte in token:
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\x{byte:02X}")
    return '"' + "".join(out) + '"'


def main() -> None:
    (HERE / "dicts").mkdir(exist_ok=True)
    for name, tokens in DICTS.items():
        lines = [f"# libFuzzer dictionary for the {name} harness (written by make_dicts.py; edit that).", ""]
        lines += [f"t{i}={quote(token)}" for i, token in enumerate(dict.fromkeys(tokens))]
        (HERE / "dicts" / f"{name}.dict").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
