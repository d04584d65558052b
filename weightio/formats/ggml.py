"""Files of the ggml era, before GGUF: llama.cpp's ``ggml`` (unversioned), ``ggmf`` v1 and ``ggjt``
v1-v3, whisper.cpp's models (``ggml-base.en.bin`` …) and the ggml repository's examples.

llama.cpp's layout (``llama.cpp``/``llama.h`` up to commit 468ea24, August 2023; candle
``quantized/ggml_file.rs``), all little-endian::

    u32      magic           'ggml' 0x67676d6c, 'ggmf' 0x67676d66 or 'ggjt' 0x67676a74
                             (as bytes: "lmgg", "fmgg", "tjgg")
    u32      version         ggmf: 1; ggjt: 1, 2 or 3; absent for 'ggml'
    u32[7]   hparams         n_vocab, n_embd, n_mult, n_head, n_layer, n_rot, ftype
    vocab[n_vocab]:          (no count prefix)
      u32      len
      u8[len]  text          (UTF-8, not NUL-terminated)
      f32      score         ggmf and ggjt only
    tensors, until the end of the file:
      u32      n_dims        1..4
      u32      name_len
      u32      ggml_type     the ids of weightio.quant.types, with the block sizes of the file's era
      u32      ne[n_dims]    ne[0] varies fastest: numpy shape = reversed(ne)
      u8[name_len] name
      padding  ggjt only: zeros to the next multiple of 32 (absolute file offset)
      data     the tensor's bytes

whisper.cpp's layout (its loader ``whisper_model_load`` in ``src/whisper.cpp`` is the spec; its
converters ``models/convert-pt-to-ggml.py`` and ``convert-h5-to-ggml.py`` and its
``whisper-quantize`` write it), all little-endian, no alignment anywhere::

    u32      magic           'ggml' (bytes "lmgg"), no version
    i32[11]  hparams         n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
                             n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype
                             (ftype = file type + 1000 * quantization version)
    i32      n_mel           mel filter bank: rows (the converters write n_mels)
    i32      n_fft           columns (201 for whisper's 400-point FFT)
    f32[n_mel * n_fft]       the filters, row-major (openai/whisper's ``mel_filters.npz``)
    i32      n_vocab         tokens stored (fewer than hparams' n_vocab: whisper.cpp names the
                             special tokens itself)
    vocab[n_vocab]:          u32 len, u8[len] bytes (byte-level BPE: not always whole UTF-8)
    tensors, until the end of the file: as llama.cpp's, but n_dims may be 0 (0..4)

The ggml repository's examples (gpt-2, gpt-j, …) write the 'ggml' magic, model-specific int32
hparams, an int32 vocabulary count, the vocabulary without scores and whisper's tensor records;
their ``ftype`` carries the quantization version as whisper's does.

**Telling the 'ggml' layouts apart.** Nothing in the file names its program, so `GGMLReader(path)`
decides by structure, always in this order: (1) llama.cpp's layout, as before whisper support; (2)
whisper.cpp's. A layout is accepted only when its whole structure parses, tensor records included,
exactly to the end of the file. When neither does, the file is judged by what its first bytes
claim: whisper.cpp's when its filter bank has as many rows as the hparams' ``n_mels`` (``i32`` at
offset 48 equals the one at 40, and is positive); else llama.cpp's when the file ends inside
llama's 28 bytes of hparams, or they are llama's (ftype 0-18, n_head > 0, n_rot * n_head = n_embd);
the claimed layout's own error is raised (`CorruptFileError` naming what is wrong, or
`UnsupportedDTypeError`). A file that claims neither raises `FormatError`, naming the magic, what
stopped each layout, and how to read the ggml examples' layout, which cannot be recognised (its
hparams are the model's): ``GGMLReader(path, hparams=("n_vocab", "n_ctx", "n_embd", "n_head",
"n_layer", "ftype"), vocab_count=True)``. 'ggmf' and 'ggjt' files are llama.cpp's alone.

Block layouts changed twice while these files were written, and the type ids did not:

| era | files (qnt: quantization version) | Q4_0 / Q4_1 | Q5_0 / Q5_1 | Q8_0 |
|---|---|---|---|---|
| 1 (to May 2023) | ggml, ggmf, ggjt v1; qnt 0 | f32 scales, interleaved nibbles (20 / 24 B) | interleaved | f32 36 B |
| 2 (llama.cpp #1405) | ggjt v2; qnt 1 | f32 scales, split nibbles (20 / 24 B) | as today | f32 36 B |
| 3 (llama.cpp #1508) | ggjt v3; qnt 2 | as today (GGUF) | as today | as today |

whisper.cpp and the examples fold the quantization version (ggml's ``GGML_QNT_VERSION``, 2 since
May 2023) into ``ftype``: ``ftype // 1000`` (``GGML_QNT_VERSION_FACTOR``) is 0, 1 or 2, era 1, 2
or 3; F32/F16-only files write a bare ftype of 0 or 1. This reader reads every tensor of era 3
(K-quants included: they appeared in June 2023, with today's layouts), F32 and F16 tensors of
every era, and era 2's Q5_0/Q5_1. Other quantized tensors of older files are listed with their
type, and reading them raises `UnsupportedDTypeError` naming the change that made their layout
obsolete (llama.cpp and whisper.cpp themselves stopped loading them). Q4_2 and Q4_3 (removed in
spring 2023) are refused the same way.

Metadata of llama.cpp files: ``ggml.magic`` (``"ggml"``, ``"ggmf"``, ``"ggjt"``), ``ggml.version``,
one ``ggml.<hparam>`` per hyperparameter, ``ggml.tokens`` (a lazily decoded string array, see
`weightio.formats.gguf.GGUFArray`) and, for ggmf/ggjt, ``ggml.scores``. Of whisper.cpp files:
``ggml.magic``, ``ggml.version`` (0), ``ggml.layout`` (``"whisper"``), ``whisper.<hparam>`` for the
first ten hparams, ``whisper.ftype`` (``ftype % 1000``, as whisper.cpp uses it) and
``whisper.qnt_version`` (``ftype // 1000``), ``whisper.n_mel``, ``whisper.n_fft``,
``whisper.mel_filters`` (a FLOAT32 `GGUFArray` of ``n_mel * n_fft`` values: a view of the file,
read when used, never copied at open; ``.numpy().reshape(n_mel, n_fft)``) and ``whisper.tokens``
(lazily decoded like ``ggml.tokens``; ``raw_strings()`` gives each token's bytes).

Rules enforced here (`CorruptFileError`): every length and count is checked against the bytes
left before it is used (negative whisper counts included); `weightio.limits` bound the header
(hparams, filters and vocabulary: ``header_bytes``), the tensor count and the name length; names
are UTF-8, non-empty and unique; 1 to 4 dims (whisper: 0 to 4) whose non-zero ones multiply to
less than 2^60 (numpy's limit, empty tensors included); rows are whole blocks; data ends inside
the file. A type id whose size is unknown stops the walk with `UnsupportedDTypeError`, since
nothing after it can be located.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .._remote import BLOCK
from ..errors import CorruptFileError, FormatError, UnsupportedDTypeError, WeightioError
from ..limits import exceeded
from ..quant.types import GGMLType, by_id
from .base import Reader, TensorInfo, is_remote
from .gguf import MAX_ELEMENTS, GGUFArray, GGUFValueType
from .gguf_arrays import walk_fetching

if TYPE_CHECKING:
    from .._remote import RemoteFile

__all__ = ["GGMLReader", "LLAMA_HPARAMS", "WHISPER_HPARAMS"]

_MAGICS = {b"lmgg": "ggml", b"fmgg": "ggmf", b"tjgg": "ggjt"}
_VERSIONS = {"ggmf": (1,), "ggjt": (1, 2, 3)}
LLAMA_HPARAMS = ("n_vocab", "n_embd", "n_mult", "n_head", "n_layer", "n_rot", "ftype")
WHISPER_HPARAMS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
                   "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype")
_EXAMPLES_HINT = ("the ggml examples' layout (gpt-2, gpt-j, …: the model's own hparams) is read with "
                  "weightio.formats.ggml.GGMLReader(path, hparams=(\"n_vocab\", \"n_ctx\", \"n_embd\", \"n_head\", "
                  "\"n_layer\", \"ftype\"), vocab_count=True), naming that model's hparams")
_ALIGN = 32  # ggjt tensor data alignment
_FIRST_GUESS = 48  # bytes of a tensor header fetched from a remote file at first (then: the longest one so far)
_MAX_DIMS = 4
_U32 = struct.Struct("<I")
_TENSOR_HEAD = struct.Struct("<III")  # n_dims, name_len, ggml_type
_WHISPER_HEAD = struct.Struct("<11i")  # WHISPER_HPARAMS
_I32 = struct.Struct("<i")
_FILTERS = struct.Struct("<ii")  # n_mel, n_fft
_QNT_FACTOR = 1000  # ggml's GGML_QNT_VERSION_FACTOR: ftype = file type + 1000 * quantization version
_QNT_VERSIONS = (0, 1, 2)  # ggml's GGML_QNT_VERSION has been 2 since May 2023
_LLAMA_FTYPES = range(19)  # llama_ftype 0 (ALL_F32) .. 18 (MOSTLY_Q6_K)

# Sizes of the block types whose layout changed, per era (block elements, bytes); other ids
# keep the GGUF-era sizes of weightio.quant.types.
_OLD_SIZES = {
    1: {2: (32, 20), 3: (32, 24), 4: (16, 10), 5: (16, 12), 6: (32, 22), 7: (32, 24), 8: (32, 36)},
    2: {2: (32, 20), 3: (32, 24), 6: (32, 22), 7: (32, 24), 8: (32, 36)},
}
_OLD_LAYOUT = {  # (era, type id) -> what changed since, for the error message
    (1, 2): "interleaved nibbles and a float32 scale (llama.cpp #1405 split the nibbles, #1508 made the scale f16)",
    (1, 3): "interleaved nibbles and float32 scales (llama.cpp #1405 split the nibbles, #1508 made the scales f16)",
    (1, 6): "interleaved nibbles (llama.cpp #1405 split them in ggjt v2)",
    (1, 7): "interleaved nibbles (llama.cpp #1405 split them in ggjt v2)",
    (1, 8): "a float32 scale (llama.cpp #1508 made it f16 in ggjt v3)",
    (2, 2): "a float32 scale (llama.cpp #1508 made it f16 in ggjt v3)",
    (2, 3): "float32 scales (llama.cpp #1508 made them f16 in ggjt v3)",
    (2, 8): "a float32 scale (llama.cpp #1508 made it f16 in ggjt v3)",
}
_LLAMA_FIX = ("weightio reads quantized legacy tensors in today's layouts only (ggjt v3, and ggjt v2 Q5_0/Q5_1): "
              "re-convert the model to GGUF with a current llama.cpp")
_WHISPER_FIX = ("weightio reads quantized whisper.cpp tensors in today's layouts only (quantization version 2, and "
                "version 1's Q5_0/Q5_1): quantize the F16 model again with a current whisper.cpp (whisper-quantize)")
_ERA_TYPES = {1: (0, 1, 2, 3, 4, 5, 6, 7, 8), 2: (0, 1, 2, 3, 6, 7, 8)}  # ids files of that era can hold


class GGMLReader(Reader):
    """A validated file of the ggml era. See the module docstring.

    Args:
        path: the file.
        hparams: names of the int32 hyperparameters after the magic, for the ggml examples'
            layout. Default: llama.cpp's seven, and for an unversioned 'ggml' file whichever of
            llama.cpp's and whisper.cpp's layouts it is (the module docstring says how).
        vocab_count: whether an int32 vocabulary size precedes the vocabulary (ggml examples).

    Attributes:
        magic: ``"ggml"``, ``"ggmf"`` or ``"ggjt"``.
        version: the file version (0 for unversioned 'ggml').
        layout: ``"llama"``, ``"whisper"`` or ``"examples"``: whose layout the file has.
        era: 1, 2 or 3: which block layouts the file's quantized tensors use.
    """

    format = "ggml"
    _unpack: Callable[[struct.Struct, int, str], tuple]  # the file's `unpack`, or `_remote_unpack`
    _bytes: Callable[[int, int, str], bytes]  # the file's `read`, or `_remote_bytes`

    def __init__(self, path: Any, *, hparams: Sequence[str] | None = None, vocab_count: bool = False) -> None:
        super().__init__(path)
        self._old: dict[str, str] = {}
        self._min_dims = 1
        self.layout = "examples" if vocab_count else "llama"
        file = self.file
        # Tensor headers are read through _unpack/_bytes: the file's own for a local file; for a
        # remote one, exact ranges (see _remote_bytes), so that no tensor data is fetched with them.
        self._unpack, self._bytes = file.unpack, file.read
        self._hi = file.size  # the image (file.data) holds bytes up to here: all of a local file
        self._guess, self._head = _FIRST_GUESS, 0  # the length to fetch a header with; where it starts
        if is_remote(file):
            self._unpack, self._bytes = self._remote_unpack, self._remote_bytes
            self._hi = min(file.size, BLOCK)
            self._spare = (0, b"")  # the last header range fetched: (offset, bytes)
        self._validate(self._read, None if hparams is None else tuple(hparams), vocab_count)

    def _fail(self, message: str, tensor: str | None = None) -> CorruptFileError:
        return CorruptFileError(message, path=self.path, tensor=tensor)

    def _u32(self, pos: int, what: str) -> int:
        return self.file.unpack(_U32, pos, what)[0]

    def _read(self, hparams: tuple[str, ...] | None, vocab_count: bool) -> None:
        pos = self._read_magic()
        self.file.ensure(0, min(self.file.size, 64), "the hparams")  # the block of the magic: nothing fetched
        if hparams is None and not vocab_count and self.magic == "ggml":
            self._read_unversioned(pos)
        else:
            self._read_llama(pos, hparams or LLAMA_HPARAMS, vocab_count)

    def _read_llama(self, pos: int, hparams: tuple[str, ...], vocab_count: bool) -> None:
        """llama.cpp's layout (and the ggml examples' with `vocab_count`), from the first hparam."""
        values = []
        for name in hparams:
            values.append(self._u32(pos, f"hparam {name}"))
            pos += 4
        self.metadata.update({"ggml.magic": self.magic, "ggml.version": self.version})
        self.metadata.update({f"ggml.{name}": value for name, value in zip(hparams, values, strict=True)})
        self.era = self._era(dict(zip(hparams, values, strict=True)), vocab_count)
        n_vocab = self.metadata.get("ggml.n_vocab", 0)
        if vocab_count:
            n_vocab = self._u32(pos, "the vocabulary size")
            pos += 4
        scored = self.magic != "ggml"
        self.metadata["ggml.tokens"], scores, pos = self._read_vocab(pos, n_vocab, scored=scored)
        if scored:
            self.metadata["ggml.scores"] = scores
        self._read_tensors(pos)

    def _read_tensors(self, pos: int) -> None:
        while pos < self.file.size:
            if len(self.tensors) >= self.limits.tensors:  # the format has no count: stop at the limit
                raise exceeded("tensor count", len(self.tensors) + 1, "tensors", self.limits.tensors,
                               path=self.path, unit="")
            pos = self._read_tensor(pos)

    def _read_unversioned(self, pos: int) -> None:
        """llama.cpp's layout, else whisper.cpp's; else the error of the layout the file claims."""
        failed: dict[str, WeightioError] = {}
        attempts = (("llama", lambda: self._read_llama(pos, LLAMA_HPARAMS, False)),
                    ("whisper", lambda: self._read_whisper(pos)))
        for layout, parse in attempts:
            self.layout = layout
            try:
                parse()
                return
            except WeightioError as e:
                failed[layout] = e
                self.metadata.clear()
                self.tensors.clear()
                self._old.clear()
        claimed = self._claimed_layout()
        if claimed is not None:
            raise failed[claimed]
        raise FormatError(
            "an unversioned 'ggml' file (magic 0x67676d6c, bytes 'lmgg') in a layout weightio does not know: "
            f"as llama.cpp's layout, {_reason(failed['llama'])}; as whisper.cpp's, {_reason(failed['whisper'])}. "
            f"weightio reads llama.cpp's and whisper.cpp's layouts by themselves; {_EXAMPLES_HINT}", path=self.path)

    def _claimed_layout(self) -> str | None:
        """The layout a file that none parses claims by its first bytes (module docstring)."""
        size, data = self.file.size, self.file.data
        if size >= 56:
            n_mels, _, n_mel = struct.unpack_from("<3i", data, 40)  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
            if n_mel == n_mels > 0:
                return "whisper"
        if size < 32:
            return "llama"  # it ends inside llama's hparams: truncated before any layout can be told
        _, n_embd, _, n_head, _, n_rot, ftype = struct.unpack_from("<7I", data, 4)  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
        return "llama" if ftype in _LLAMA_FTYPES and n_head and n_rot * n_head == n_embd else None

    def _read_whisper(self, pos: int) -> None:
        """whisper.cpp's layout, from the first hparam (module docstring)."""
        values = dict(zip(WHISPER_HPARAMS, self.file.unpack(_WHISPER_HEAD, pos, "whisper's 11 hparams"), strict=True))
        pos += _WHISPER_HEAD.size
        ftype = values.pop("ftype")
        if ftype < 0:
            raise self._fail(f"whisper hparam ftype is negative ({ftype})")
        qnt = ftype // _QNT_FACTOR
        if qnt not in _QNT_VERSIONS:
            raise FormatError(f"whisper hparam ftype {ftype} names quantization version {qnt}; weightio knows "
                              f"versions {', '.join(map(str, _QNT_VERSIONS))} (a newer whisper.cpp?)", path=self.path)
        self.era, self._min_dims = qnt + 1, 0
        self.metadata.update({"ggml.magic": self.magic, "ggml.version": self.version, "ggml.layout": "whisper"})
        self.metadata.update({f"whisper.{k}": v for k, v in values.items()})
        self.metadata.update({"whisper.ftype": ftype % _QNT_FACTOR, "whisper.qnt_version": qnt})
        pos = self._read_filters(pos)
        n_vocab = self.file.unpack(_I32, pos, "whisper's vocabulary size")[0]
        if n_vocab < 0:
            raise self._fail(f"whisper's vocabulary size at offset {pos} is negative ({n_vocab})")
        self.metadata["whisper.tokens"], _, pos = self._read_vocab(pos + 4, n_vocab, scored=False)
        self._read_tensors(pos)

    def _read_filters(self, pos: int) -> int:
        """The mel filter bank: a lazily read FLOAT32 array over the file (nothing copied)."""
        n_mel, n_fft = self.file.unpack(_FILTERS, pos, "the mel filters' n_mel and n_fft")
        if n_mel < 0 or n_fft < 0:
            raise self._fail(f"the mel filters at offset {pos} have a negative size (n_mel {n_mel}, n_fft {n_fft})")
        pos += _FILTERS.size
        nbytes = 4 * n_mel * n_fft
        if nbytes > self.file.size - pos:
            raise self._fail(f"mel filters of {n_mel} x {n_fft} float32 ({nbytes} bytes from offset {pos}) run past "
                             f"the end of the file ({self.file.size} bytes)")
        self.metadata.update({"whisper.n_mel": n_mel, "whisper.n_fft": n_fft})
        self.metadata["whisper.mel_filters"] = GGUFArray.numbers(GGUFValueType.FLOAT32, self.file, n_mel * n_fft,
                                                                 np.dtype("<f4"), pos)
        return pos + nbytes

    def _read_magic(self) -> int:
        magic = self.file.read(0, min(4, self.file.size), "the magic")
        if magic not in _MAGICS:
            raise FormatError(f"not a legacy ggml file (magic {magic!r})", path=self.path)
        self.magic = _MAGICS[magic]
        if self.magic == "ggml":
            self.version = 0
            return 4
        self.version = self._u32(4, "the version")
        if self.version not in _VERSIONS[self.magic]:
            known = ", ".join(map(str, _VERSIONS[self.magic]))
            raise FormatError(f"{self.magic} version {self.version} is not supported ({known} are)", path=self.path)
        return 8

    def _era(self, hparams: dict[str, int], vocab_count: bool) -> int:
        if vocab_count:  # ggml examples: the quantization version is folded into ftype
            era = hparams.get("ftype", 0) // _QNT_FACTOR + 1
            if era not in (1, 2, 3):
                raise self._fail(f"ftype {hparams.get('ftype')} names quantization version {era - 1} (0-2 exist)")
            return era
        return self.version if self.magic == "ggjt" else 1

    def _read_vocab(self, pos: int, n_vocab: int, *, scored: bool) -> tuple[GGUFArray, GGUFArray | None, int]:
        """`n_vocab` length-prefixed tokens (each followed by an f32 score when `scored`): the lazy
        token array, the scores (None unless `scored`), and the position after them."""
        entry = 8 if scored else 4
        if n_vocab * entry > self.file.size - pos:
            raise self._fail(f"a vocabulary of {n_vocab} entries cannot fit in the {self.file.size - pos} bytes left")
        limit = self.limits.header_bytes  # magic, hparams and vocabulary: everything before the first tensor
        if pos + n_vocab * entry > limit:
            raise exceeded(f"the header length (magic, hparams and {n_vocab} vocabulary entries, at least)",
                           pos + n_vocab * entry, "header_bytes", limit, path=self.path)
        gap = entry  # between one token's text and the next one's: [score] + length
        if self._hi < self.file.size:  # a remote file: fetched as walked
            starts = array("q")
            pos, hi = walk_fetching(self.file, pos, n_vocab, _U32, self._hi, min(self.file.size, limit),
                                    extra=entry - 4, starts=starts, what="the vocabulary")
            self._hi = max(self._hi, hi)
        else:
            starts, pos = self._walk_vocab(pos, n_vocab, entry)
        if pos > self.file.size:
            raise self._fail("the vocabulary runs past the end of the file")
        if pos > limit:
            raise exceeded("the header length (through the vocabulary)", pos, "header_bytes", limit, path=self.path)
        scores = self._scores(starts, pos) if scored else None
        return GGUFArray.strings(self.file, starts, pos - (entry - 4), gap), scores, pos

    def _walk_vocab(self, pos: int, n_vocab: int, entry: int) -> tuple[array, int]:
        buf, starts = memoryview(self.file.data), array("q")  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
        for _ in range(n_vocab):
            if pos + 4 > self.file.size:
                raise self._fail("the vocabulary runs past the end of the file")
            (n,) = _U32.unpack_from(buf, pos)
            starts.append(pos + 4)
            pos += 4 + n + (entry - 4)
        return starts, pos

    def _scores(self, starts: array, end: int) -> GGUFArray:
        """Each score sits just before the next token's length prefix (the last one at the end)."""
        where = np.append(np.frombuffer(starts, np.int64)[1:] - 8, end - 4) if len(starts) else np.zeros(0, np.int64)
        raw = self.file.data[where[:, None] + np.arange(4)] if len(where) else np.zeros((0, 4), np.uint8)
        return GGUFArray.from_array(GGUFValueType.FLOAT32, raw.reshape(-1).view("<f4"))

    def _read_tensor(self, pos: int) -> int:
        start = self._head = pos
        n_dims, name_len, type_id = self._unpack(_TENSOR_HEAD, pos, "a tensor header")
        pos += _TENSOR_HEAD.size
        if not self._min_dims <= n_dims <= _MAX_DIMS:
            raise self._fail(f"a tensor at offset {pos - 12} has {n_dims} dimensions "
                             f"({self._min_dims} to {_MAX_DIMS} allowed)")
        ne = struct.unpack("<" + "I" * n_dims, self._bytes(pos, 4 * n_dims, "tensor dimensions"))
        pos += 4 * n_dims
        name = self._name(pos, name_len)
        pos += name_len
        self._guess = max(self._guess, pos - start)  # a remote file's next header is fetched this long
        if self.magic == "ggjt":
            pos += -pos % _ALIGN
        info = self._info(name, ne[::-1], type_id, pos)
        if info.offset + info.nbytes > self.file.size:
            raise self._fail(f"data at {info.offset}..{info.offset + info.nbytes} runs past the end of the file "
                             f"({self.file.size} bytes)", name)
        self.tensors[name] = info
        return info.offset + info.nbytes

    def _name(self, pos: int, length: int) -> str:
        if length > self.limits.name_bytes and pos + length <= self.file.size:  # past the end: read() says so
            raise exceeded(f"the length of the tensor name at offset {pos}:", length, "name_bytes",
                           self.limits.name_bytes, path=self.path)
        raw = self._bytes(pos, length, "a tensor name")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._fail(f"a tensor name at offset {pos} is not valid UTF-8 ({raw[:40]!r}: {e.reason})") from None
        if not name:
            raise self._fail(f"the tensor name at offset {pos} is empty")
        if name in self.tensors:
            raise self._fail("tensor name appears twice", name)
        return name

    def _remote_unpack(self, fmt: struct.Struct, pos: int, what: str) -> tuple:
        if pos < 0 or pos + fmt.size > self.file.size:
            return self.file.unpack(fmt, pos, what)  # its error
        return fmt.unpack(self._remote_bytes(pos, fmt.size, what))

    def _remote_bytes(self, pos: int, length: int, what: str) -> bytes:
        """Bytes of a tensor header of a remote file: from what is fetched already, else fetched exactly
        (as long as the previous header, so that one request usually brings the whole header, and no
        tensor data)."""
        if pos < 0 or length < 0 or pos + length > self.file.size:
            return self.file.read(pos, length, what)  # its error
        if pos + length <= self._hi:
            return self.file.data[pos:pos + length].tobytes()
        at, spare = self._spare
        if at <= pos and pos + length <= at + len(spare):
            return spare[pos - at:pos - at + length]
        fetch = min(self.file.size - pos, max(length, self._guess - (pos - self._head)))
        spare = cast("RemoteFile", self.file).gather([(pos, fetch)], what).tobytes()  # (a remote file: see __init__)
        self._spare = (pos, spare)
        return spare[:length]

    def _info(self, name: str, shape: tuple[int, ...], type_id: int, start: int) -> TensorInfo:
        t = self._type(name, type_id)
        if math.prod(d for d in shape if d) >= MAX_ELEMENTS:
            raise self._fail(f"dimensions {list(shape[::-1])} overflow a 64-bit element count (numpy needs the "
                             "product of the non-zero dimensions below 2^60)", name)
        row = shape[-1] if shape else 1  # whisper's records may be 0-d: one element
        if row % t.block_size:
            raise self._fail(f"rows of {row} elements are not whole {t.name} blocks of {t.block_size}", name)
        nbytes = math.prod(shape[:-1]) * t.row_bytes(row)
        if t.dtype is None:  # quantized (what `t.quantized` says, which mypy cannot narrow `t.dtype` by)
            return TensorInfo(np.dtype("<f4"), shape, start, nbytes, None, t.name)
        return TensorInfo(t.dtype, shape, start, nbytes)

    def _type(self, name: str, type_id: int) -> GGMLType:
        """The type with this era's block size; old layouts are remembered for `buffer` to refuse."""
        t = by_id(type_id)
        if t is None or (self.era in _ERA_TYPES and type_id not in _ERA_TYPES[self.era]):
            raise UnsupportedDTypeError(f"ggml type {type_id} is unknown in {self._describe()} files; its size is "
                                        "unknown, so the tensors after it cannot be located", path=self.path,
                                        tensor=name)
        old = _OLD_SIZES.get(self.era, {}).get(type_id)
        if old is None:
            return t
        if (self.era, type_id) in _OLD_LAYOUT:
            fix = _WHISPER_FIX if self.layout == "whisper" else _LLAMA_FIX
            change = _OLD_LAYOUT[self.era, type_id]
            self._old[name] = f"{self._describe()} files store {t.name} blocks with {change}; {fix}"
        elif t.removed is not None:
            self._old[name] = t.removed
        return GGMLType(t.id, t.name, old[0], old[1], None, t.removed)

    def _describe(self) -> str:
        if self.layout == "whisper":
            return f"whisper.cpp (quantization version {self.era - 1})"
        return self.magic if self.magic == "ggml" else f"{self.magic} v{self.version}"

    def buffer(self, name: str) -> np.ndarray:
        reason = self._old.get(name)
        if reason is not None:
            raise UnsupportedDTypeError(reason, path=self.path, tensor=name)
        return self.file.data


def _reason(error: WeightioError) -> str:
    """What stopped one layout, for the message that lists them all."""
    return error.message if error.tensor is None else f"tensor {error.tensor!r}: {error.message}"
