"""PyTorch checkpoints (``torch.save``) without torch, through weightio's allowlist unpickler.

**Zip format** (torch >= 1.6, the default): a ZIP archive (rules in `weightio.formats._zip`) whose
members share one prefix (the file's stem when it was saved, or ``archive``)::

    <prefix>/data.pkl          the pickled object. A tensor is a call of a torch rebuild function
                               on a storage, given by the persistent id
                               ("storage", <storage class>, key, location, numel)
    <prefix>/data/<key>        one STORED record per storage: numel * itemsize raw bytes, at a
                               64-byte aligned offset (torch pads the local header's extra field)
    <prefix>/byteorder         "little" or "big" (absent: little)
    <prefix>/version           the format version ("3\\n"); torch reads versions 1 to 10
    <prefix>/.format_version, .storage_alignment, .data/serialization_id: informational

Records are found as torch finds them: the prefix is the first central-directory entry's folder,
names are compared with ASCII case folded, and names that fold equal are refused
(`containers.ZipContainer`).

**Legacy raw-pickle format** (``torch.save(..., _use_new_zipfile_serialization=False)``), five
pickles back to back, then the storages::

    pickle   the magic number 0x1950a86a20f9469cfc6c
    pickle   the protocol version 1001
    pickle   sys_info: {"protocol_version", "little_endian", "type_sizes"}
    pickle   the object; persistent ids ("storage", <storage class>, root key, location, numel,
             view) where view is None or (view key, element offset, numel)
    pickle   the storage keys, in the order their data follows
    per key  int64 element count (little-endian), then count * itemsize bytes (little-endian)

**Legacy tar format** (torch 0.1.x; archive rules in `.tar`): any file that Python's ``tarfile``
opens, as ``torch.load`` decides (`weightio.formats.sniff.opens_as_tar`), four members::

    sys_info   pickle   as above (protocol_version 1000)
    pickle     pickle   the object; persistent ids: the key (str of an int) of a tensor
    tensors    pickle   count; per tensor: pickle (key, storage key, tensor class), then int32
                        ndim, 4 bytes of padding, ndim int64 sizes, ndim int64 strides, int64 offset
    storages   pickle   count; per storage: pickle (key, location, storage class), int64 element
                        count, the data; then pickle [(view key, root key, offset, numel), ...]

Any other pickle (``pickle.dump`` of a dict of numpy arrays, say) is read as one object.

Tensors are views of the one file mapping: a zip record, or a span of a legacy file. A view
with a storage offset or non-contiguous strides (transposed, sliced, step-sliced) keeps its
byte strides; names that share a storage share memory. A ``byteorder`` of "big" gives
big-endian dtypes (``numpy()`` converts; ``raw()`` is the stored bytes). Deflated records
(which torch never writes) are inflated on first use, bounded by the record's size.

Checked before any tensor is exposed, each failure a `CorruptFileError` naming the file and the
tensor: the storage record exists; it holds exactly numel * itemsize bytes (the numel a pickle
claims is never trusted, CVE-2026-24747); a storage key always has one dtype and size; offset,
sizes and strides are non-negative ints (at most 64 dims) and the view's last element lies
inside its storage; ``byteorder`` is "little" or "big"; legacy storages are laid out exactly as
listed, with nothing after them.

Quantized, sparse and meta tensors, and dtypes numpy has no type for (complex32, bits16, …),
are listed with their shape; reading them raises `UnsupportedDTypeError` naming the tensor.
TorchScript archives (a ``constants.pkl`` record, beside ``code/``) hold code and raise `FormatError`.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, cast

import numpy as np

from ..._gc import collector_paused
from ...errors import CorruptFileError, FormatError, UnsupportedDTypeError, WeightioError
from ...limits import exceeded
from ...records import new_info
from ...text import dims, number
from .. import _zip
from ..base import MAX_NDIM, Reader, TensorInfo, is_remote
from ..base import unknown_globals as current_unknown_globals
from . import unpickler
from .allowlist import NumpyArray
from .containers import Container, Span, open_container
from .flatten import flatten
from .inert import Token
from .legacy_tensors import LegacyTensor
from .placeholders import KEY as PLACEHOLDERS_KEY
from .refs import NestedRef, StorageRef, TensorRef, short_repr
from .torch_dtypes import ITEMSIZES, NUMPY_DTYPES, PER_BYTE, QUANTIZED_DTYPES, itemsize

__all__ = ["PyTorchReader"]

_NODE_BUDGET = 4  # flattening visits at most this many entries per byte of pickle (+ a floor)
_NODE_FLOOR = 100_000
_MAX_VIEW_BYTES = (1 << 63) - 1  # numpy's (and torch's) bound on one array's size
_HUGE = 1 << 256  # past any real offset, size or stride (torch's are int64); such ints may not even print


class PyTorchReader(Reader):
    """A PyTorch checkpoint: zip, legacy raw-pickle or legacy tar format (see the module docstring).

    Nested checkpoints are flattened to dotted names (``model_state_dict.conv1.weight``,
    ``optimizer.state.0.exp_avg``); their non-tensor leaves (epoch, loss, args …) are
    `metadata` under the same dotted names.

    With ``unknown_globals="placeholder"`` (default: the mode of `weightio.formats.base.unknown_globals`,
    "refuse"), a global off the allowlist becomes an inert placeholder instead of an
    `UnsafePickleError` (`.placeholders`); those replaced are listed in
    ``metadata["weightio.placeholders"]``.

    Attributes:
        container: ``"zip"``, ``"legacy"``, ``"tar"`` or ``"pickle"``.
        placeholders: the dotted names of the globals replaced by placeholders, in the order met.
    """

    format = "pytorch"

    def __init__(self, source: Any, *, unknown_globals: str | None = None) -> None:
        super().__init__(source)
        self.unknown_globals = current_unknown_globals() if unknown_globals is None else unknown_globals
        self.placeholders: list[str] = []
        self._unreadable: dict[str, str] = {}  # name -> why numpy() cannot serve it
        self._own: dict[str, np.ndarray] = {}  # name -> its own bytes (numpy arrays pickled inline)
        self._deflated: dict[str, _zip.ZipMember] = {}  # name -> the deflated record holding it
        self._inflated: dict[str, np.ndarray] = {}  # record name -> inflated bytes
        self._lock = threading.Lock()
        with collector_paused():  # the parse builds objects per tensor that all survive (see weightio._gc)
            self._validate(self._read)

    def _read(self) -> None:
        limits = self.limits
        with unpickler.placeholders(self.unknown_globals) as registry:
            container = open_container(self.file, limits)
        self.container = container.kind
        self._check_crc = container.check_crc
        # a remote zip's storage records are checked against their local headers when first read
        self._verify = container.kind == "zip" and is_remote(self.file)
        stem = os.path.splitext(os.path.basename(self.path))[0] or "tensor"
        budget = _NODE_BUDGET * container.pickle_bytes + _NODE_FLOOR
        try:
            tensors, self.metadata = flatten(container.root, budget=budget, root_name=stem,
                                                       max_depth=limits.nesting_depth,
                                                       max_name_bytes=limits.name_bytes)
        except WeightioError as e:
            raise type(e)(e.problem, path=self.path, advice=e.advice) from None
        if registry is not None and registry.classes:
            self.placeholders = registry.replaced
            if PLACEHOLDERS_KEY in tensors or PLACEHOLDERS_KEY in self.metadata:
                raise CorruptFileError(f"the checkpoint holds an entry named {PLACEHOLDERS_KEY!r}, the key weightio "
                                       "lists replaced globals under", path=self.path)
            self.metadata[PLACEHOLDERS_KEY] = list(self.placeholders)
        if len(tensors) > limits.tensors:
            raise exceeded("tensor count", len(tensors), "tensors", limits.tensors, path=self.path, unit="")
        builder = _Builder(container)
        for name, leaf in tensors.items():
            if type(leaf) is NestedRef:
                self._add_nested(builder, name, leaf, tensors)
                continue
            info, why, record = builder.build(name, leaf)
            self.tensors[name] = info
            if why:
                self._unreadable[name] = why
            if record is not None:
                self._deflated[name] = record
            if isinstance(leaf, NumpyArray):
                self._own[name] = _own_bytes(cast("np.ndarray", leaf.array))  # (built: `.flatten.is_tensor`)

    def _add(self, name: str, info: TensorInfo, why: str | None, record: _zip.ZipMember | None) -> None:
        self.tensors[name] = info
        if why:
            self._unreadable[name] = why
        if record is not None:
            self._deflated[name] = record

    def _add_nested(self, builder: _Builder, name: str, ref: NestedRef, listed: dict[str, Any]) -> None:
        """A strided nested tensor's components, ``name[0]``, ``name[1]`` …: views of its buffer's storage."""
        buffer = ref.buffer
        if (type(buffer) is not TensorRef or buffer.kind != "dense" or type(buffer.offset) is not int or buffer.offset
                or _ints(buffer.size) is None or len(buffer.size) != 1 or _ints(buffer.stride) != (1,)):
            raise CorruptFileError(f"nested tensor buffer {short_repr(buffer)} is not a flat tensor at storage "
                                   "offset 0 (torch writes one)", path=self.path, tensor=name)
        count = self.limits.tensors - len(self.tensors)
        sizes = self._int_rows(builder, name, "sizes", ref.sizes, count)
        strides = self._int_rows(builder, name, "strides", ref.strides, count)
        offsets = self._int_rows(builder, name, "storage offsets", ref.offsets, count, flat=True)
        if not len(sizes) == len(strides) == len(offsets) or any(
                len(a) != len(b) for a, b in zip(sizes, strides, strict=True)):
            raise CorruptFileError(f"nested tensor sizes ({len(sizes)} rows), strides ({len(strides)} rows) and "
                                   f"storage offsets ({len(offsets)}) do not match", path=self.path, tensor=name)
        for i, (size, stride, offset) in enumerate(zip(sizes, strides, offsets, strict=True)):
            part = f"{name}[{i}]"
            if part in listed or part in self.metadata or part in self.tensors:
                raise FormatError(f"two entries flatten to the same name {part!r}; weightio cannot list both",
                                  path=self.path)
            if len(part.encode("utf-8")) > self.limits.name_bytes:
                raise exceeded("a flattened name of", len(part.encode("utf-8")), "name_bytes",
                               self.limits.name_bytes, path=self.path, unit=" bytes")
            view = TensorRef(buffer.storage, offset, tuple(size), tuple(stride), buffer.dtype, "dense", "",
                             buffer.metadata)
            self._add(part, *builder.build(part, view))

    def _int_rows(self, builder: _Builder, name: str, what: str, ref: Any, most: int, flat: bool = False) -> list:
        """The values of a nested tensor's int64 sizes/strides (rows of at most MAX_NDIM) or offsets.

        Each must be contiguous, as torch requires (``NestedTensorImpl``: "nested_sizes.is_contiguous()";
        it reads offsets as if they were): then every value read lies in the file, where a broadcast
        (stride 0) view of one int64 would make a million components out of a file of a kilobyte."""
        info, why, record = builder.build(f"{name} ({what})", ref) if type(ref) is TensorRef else (None, "", None)
        shape = info.shape if info is not None else ()
        if (why is not None or info is None or info.dtype.newbyteorder("=") != np.dtype(np.int64)
                or len(shape) != 2 - flat or info.strides is not None):  # (no info: why is "")
            raise CorruptFileError(f"nested tensor {what} {short_repr(ref)} is not a contiguous {2 - flat}-D int64 "
                                   "tensor (torch requires one)", path=self.path, tensor=name)
        if shape[0] > most or (not flat and shape[1] > MAX_NDIM):
            raise exceeded(f"nested tensor components ({what} {_dims(shape)})", shape[0], "tensors", most,
                           path=self.path, tensor=name, unit="")
        if record is None and self._verify:  # a remote file: its image holds only the bytes ensured
            start, stop = info.stored_range()
            _zip.verify_range(self.file, start, stop)
            self.file.ensure(start, stop - start, f"nested tensor {what}")
        data = self._record_bytes(record) if record is not None else self.file.data
        return np.ndarray(shape, info.dtype, data, info.offset, info.strides).tolist()

    def _record_bytes(self, record: _zip.ZipMember) -> np.ndarray:
        """A deflated record's bytes, inflated once (within limits.inflated_bytes)."""
        limit = self.limits.inflated_bytes
        if limit is not None and record.size > limit:
            raise exceeded(f"deflated record {record.name!r} inflates to", record.size, "inflated_bytes", limit,
                           path=self.path)
        with self._lock:
            data = self._inflated.get(record.name)
            if data is None:
                data = self._inflated[record.name] = _zip.inflate(self.file, record, check_crc=self._check_crc)
        return data

    def buffer(self, name: str) -> np.ndarray:
        """The mapping; a numpy array's own pickled bytes; or a deflated record, inflated once.

        Raises:
            UnsupportedDTypeError: quantized, sparse and meta tensors, and dtypes numpy lacks.
        """
        why = self._unreadable.get(name)
        if why is not None:
            raise UnsupportedDTypeError(why, path=self.path, tensor=name)
        own = self._own.get(name)
        if own is not None:
            return own
        record = self._deflated.get(name)
        try:
            if record is None:
                if self._verify:
                    _zip.verify_range(self.file, *self.tensors[name].stored_range())
                return self.file.data
            return self._record_bytes(record)
        except WeightioError as e:
            raise type(e)(e.problem, path=self.path, tensor=name, advice=e.advice) from None

    def close(self) -> None:
        self._inflated = {}
        self._own = {}
        super().close()


def _own_bytes(array: np.ndarray) -> np.ndarray:
    base = array
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base.reshape(-1).view(np.uint8)


# ----------------------------------------------------------------------------- tensors


# torch dtypes numpy holds one element per item of: the common, fast case of `_Builder._dense`.
_PLAIN = frozenset(n for n, d in NUMPY_DTYPES.items() if n not in QUANTIZED_DTYPES
                   and n != "float4_e2m1fn_x2")


class _Builder:
    """Turns what the pickle describes into checked `TensorInfo`s (errors name the tensor)."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.path = container.path
        self.big = container.byteorder == "big"
        self._spans: dict[int, Span] = {}

    def fail(self, name: str, message: str) -> CorruptFileError:
        return CorruptFileError(message, path=self.path, tensor=name)

    def build(self, name: str, leaf: Any) -> tuple[TensorInfo, str | None, _zip.ZipMember | None]:
        """(info, why it cannot be read or None, the deflated record holding it or None)."""
        if type(leaf) is TensorRef and leaf.kind == "dense":
            return self._dense(name, leaf)
        if isinstance(leaf, NumpyArray):
            a = cast("np.ndarray", leaf.array)  # (built: `.flatten` lists a NumpyArray as a tensor only then)
            strides = None if a.flags.c_contiguous else a.strides
            return TensorInfo(a.dtype, a.shape, 0, a.nbytes, strides), None, None
        if isinstance(leaf, StorageRef):  # a bare storage: a 1-D tensor of its elements
            return self._dense(name, TensorRef(leaf, 0, (leaf.view_numel,), (1,)))
        if isinstance(leaf, LegacyTensor):  # torch.FloatTensor() + BUILD; never built: torch's empty tensor
            if leaf.storage is None:
                return TensorInfo(NUMPY_DTYPES[leaf.torch_dtype], (0,), 0, 0), None, None
            return self._dense(name, leaf)
        return self._listed_only(name, leaf), leaf.note, None

    def _dense(self, name: str, ref: TensorRef) -> tuple[TensorInfo, str | None, _zip.ZipMember | None]:
        """A tensor over a storage: its view checked against the storage's bytes."""
        storage = ref.storage
        if type(storage) is not StorageRef:
            raise self.fail(name, f"its storage is {short_repr(storage)}, not a torch storage")
        torch_dtype = storage.dtype if ref.dtype is None else self._dtype(name, ref)
        offset, size, stride = ref.offset, ref.size, ref.stride
        if type(offset) is not int or type(size) is not tuple or type(stride) is not tuple:
            offset, size, stride = self._geometry(name, ref)
        numel, last, contiguous = _extent(size, stride, offset)
        if numel < 0:  # a dimension that is not a non-negative int: say which
            self._geometry(name, ref)
            raise self.fail(name, f"malformed view (offset {short_repr(offset)}, size "
                                  f"{short_repr(size)}, stride {short_repr(stride)})")
        span = self._spans.get(id(storage)) or self._span(name, storage)
        size_of, storage_size = ITEMSIZES[torch_dtype], ITEMSIZES[storage.dtype]
        start = span.offset + storage.view_offset * storage_size
        if torch_dtype in PER_BYTE:  # several elements per byte: listed only (quantized), bounded in bytes
            return self._packed(name, ref, torch_dtype, start, storage.view_numel * storage_size, span)
        if numel and (last + 1) * size_of > storage.view_numel * storage_size:
            raise self.fail(name, f"view ({_geometry_text(offset, size, stride)}) reaches element "
                                  f"{number(last, grouping=True)} of a "
                                  f"{number(storage.view_numel * storage_size // size_of, grouping=True)}-element "
                                  f"storage {short_repr(storage.key)}")
        if numel * size_of > _MAX_VIEW_BYTES:  # inside its storage, yet (stride 0: broadcast) of any size
            raise self.fail(name, f"view of {number(numel, grouping=True)} elements (size {_dims(size)}, stride "
                                  f"{_dims(stride)}) is too large for an array ({_MAX_VIEW_BYTES:,} bytes at most)")
        if not numel and math.prod(d for d in size if d) * size_of > _MAX_VIEW_BYTES:
            # torch holds an empty tensor of any other dimensions; numpy cannot shape one: listed, not read
            why = (f"empty view of size {_dims(size)}: numpy cannot shape an array whose non-zero dimensions "
                   "reach 2^63 bytes")
            return self._info(torch_dtype, size, stride, start, 0), why, span.record
        if torch_dtype in _PLAIN and not ref.metadata and not self.big:  # the common case
            dtype = NUMPY_DTYPES[torch_dtype]
            strides = None if contiguous else tuple(s * size_of for s in stride)
            return new_info((dtype, size, start + offset * size_of if numel else start, numel * size_of, strides,
                             None)), None, span.record
        info = self._info(torch_dtype, size, stride, start + offset * size_of if numel else start, numel * size_of)
        return info, self._unreadable_reason(torch_dtype, ref), span.record

    def _packed(self, name: str, ref: TensorRef, torch_dtype: str, start: int, storage_bytes: int,
                span: Span) -> tuple[TensorInfo, str | None, _zip.ZipMember | None]:
        """A view of a sub-byte dtype (quint4x2, quint2x4), several elements per byte: contiguous, it
        takes torch's layout (each row rounded up to whole bytes); else element k lies in byte
        k // per_byte. Listed only (quantized), with its bytes checked against the storage's."""
        per_byte = PER_BYTE[torch_dtype]
        offset, size, stride = self._geometry(name, ref)
        numel, last, contiguous = _extent(size, stride, offset)
        first = offset // per_byte
        if not numel:
            end = first
        elif contiguous and size:
            end = first + math.prod(size[:-1]) * -(-size[-1] // per_byte)
        else:
            end = last // per_byte + 1
        if end > storage_bytes:
            raise self.fail(name, f"view ({_geometry_text(offset, size, stride)}) of {torch_dtype} ({per_byte} "
                                  f"elements per byte) needs {number(end, grouping=True)} bytes of a "
                                  f"{number(storage_bytes, grouping=True)}-byte storage {short_repr(ref.storage.key)}")
        info = self._info(torch_dtype, size, stride, start + first, end - first)
        return info, self._unreadable_reason(torch_dtype, ref), span.record

    def _info(self, torch_dtype: str, size: tuple, stride: tuple, offset: int, nbytes: int) -> TensorInfo:
        dtype = NUMPY_DTYPES.get(torch_dtype) or np.dtype(f"V{itemsize(torch_dtype)}")
        if self.big and dtype.itemsize > 1:
            dtype = dtype.newbyteorder(">")
        if torch_dtype == "float4_e2m1fn_x2":  # listed as fp4 elements, as safetensors does
            return new_info((dtype, size[:-1] + (2 * size[-1],) if size else (2,), offset, nbytes, None, None))
        if _contiguous(size, stride):
            return new_info((dtype, size, offset, nbytes, None, None))
        return new_info((dtype, size, offset, nbytes, tuple(s * dtype.itemsize for s in stride), None))

    def _unreadable_reason(self, torch_dtype: str, ref: TensorRef) -> str | None:
        if torch_dtype not in NUMPY_DTYPES:
            return f"torch dtype {torch_dtype} has no numpy equivalent; convert it in torch before saving"
        if torch_dtype in QUANTIZED_DTYPES:
            return f"quantized tensor ({torch_dtype}); dequantize it in torch (.dequantize()) before saving"
        if torch_dtype == "float4_e2m1fn_x2" and not _contiguous(_ints(ref.size) or (), _ints(ref.stride) or ()):
            return "non-contiguous float4_e2m1fn_x2 tensor; make it contiguous in torch before saving"
        flags = ref.metadata if isinstance(ref.metadata, dict) else {}
        if flags.get("conj") or flags.get("neg"):
            return "tensor has its conjugate/negative bit set; call .resolve_conj()/.resolve_neg() before saving"
        return None

    def _dtype(self, name: str, ref: TensorRef) -> str:
        if not isinstance(ref.dtype, Token) or ref.dtype.kind != "dtype":
            raise self.fail(name, f"dtype {short_repr(ref.dtype)} is not a torch dtype")
        return ref.dtype.value

    def _geometry(self, name: str, ref: TensorRef) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        offset, size, stride = ref.offset, _ints(ref.size), _ints(ref.stride)
        if type(offset) is not int or size is None or stride is None:
            raise self.fail(name, f"offset {short_repr(offset)}, size {short_repr(ref.size)} and "
                                  f"stride {short_repr(ref.stride)} must be an int and tuples of ints")
        if len(size) != len(stride) or len(size) > MAX_NDIM:
            raise self.fail(name, f"size {short_repr(size)} and stride {short_repr(stride)} must "
                                  f"have the same length, at most {MAX_NDIM}")
        if max(map(abs, (offset, *size, *stride))) >= _HUGE:  # not a tensor's; such a number may not print
            raise self.fail(name, f"offset, size or stride beyond 256 bits (offset {short_repr(offset)}, "
                                  f"size {short_repr(size)}, stride {short_repr(stride)})")
        if offset < 0 or min(size, default=0) < 0 or min(stride, default=0) < 0:
            raise self.fail(name, f"negative offset, size or stride ({_geometry_text(offset, size, stride, False)})")
        return offset, size, stride

    def _span(self, name: str, storage: StorageRef) -> Span:
        try:
            span = self.container.locate(storage)
        except CorruptFileError as e:
            raise self.fail(name, e.message) from None
        self._spans[id(storage)] = span
        return span

    def _listed_only(self, name: str, ref: TensorRef) -> TensorInfo:
        """Quantized/sparse/meta/other tensors: shape and dtype, no readable bytes."""
        if ref.kind == "quantized":
            info, _, _ = self._dense(name, ref)
            return info
        size = _ints(ref.size)
        if size is None or len(size) > MAX_NDIM or min(size, default=0) < 0:
            raise self.fail(name, f"size {short_repr(ref.size)} is not a tuple of non-negative ints")
        torch_dtype = ref.dtype.value if isinstance(ref.dtype, Token) and ref.dtype.kind == "dtype" else (
            ref.dtype if isinstance(ref.dtype, str) else "uint8")
        if torch_dtype not in ITEMSIZES:
            raise self.fail(name, f"dtype {short_repr(ref.dtype)} is not a torch dtype")
        numel = math.prod(size) if max(size, default=0) <= _MAX_VIEW_BYTES else None  # then < 2^(63*64)
        # torch's sizes are int64, and dense (meta) storage sizes too ("Storage size calculation overflowed");
        # a sparse tensor's logical size may exceed any storage
        dense_bytes = 0 if numel is None or ref.kind == "sparse" else numel * ITEMSIZES[torch_dtype]
        if numel is None or dense_bytes > _MAX_VIEW_BYTES:
            count = "a dimension of 2^63 or more" if numel is None else f"{number(numel, grouping=True)} elements"
            raise self.fail(name, f"size {_dims(size)} ({count} of {torch_dtype}) is too large for any tensor "
                                  f"(torch refuses more than {_MAX_VIEW_BYTES:,} bytes)")
        dtype = NUMPY_DTYPES.get(torch_dtype) or np.dtype(f"V{itemsize(torch_dtype)}")
        return TensorInfo(dtype, size, 0, 0)


def _dims(shape: tuple[int, ...], limit: int = 200) -> str:
    """A size or stride as torch writes it, each number bounded (`weightio.text`), the whole cut to `limit`."""
    text = dims(shape, "()")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _geometry_text(offset: int, size: tuple[int, ...], stride: tuple[int, ...], grouping: bool = True) -> str:
    return f"offset {number(offset, grouping=grouping)}, size {_dims(size)}, stride {_dims(stride)}"


def _ints(value: Any) -> tuple[int, ...] | None:
    """`value` as a tuple when it is a tuple or list of ints (bools and floats are not), else None."""
    if type(value) is not tuple:
        if not isinstance(value, (tuple, list)):
            return None
        value = tuple(value)
    for v in value:
        if type(v) is not int:
            return None
    return value


def _contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """C-contiguous: each stride is the product of the later sizes (size-1 dims don't matter)."""
    expected = 1
    for d, s in zip(reversed(size), reversed(stride), strict=False):
        if d == 0:
            return True
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def _extent(size: tuple, stride: tuple, offset: int) -> tuple[int, int, bool]:
    """(numel, index of the last element, C-contiguous) of a view — or numel -1 when a size or
    stride is not a non-negative int below `_HUGE`, or their lengths differ (the caller reports it).

    Matrices and vectors, most of any checkpoint, are worked out without the loop (a third of
    the index's time at 500 tensors); `_extent_loop` is the definition they agree with."""
    if len(size) == 2 == len(stride):
        d0, d1 = size
        s0, s1 = stride
        if (type(d0) is int and type(d1) is int and type(s0) is int and type(s1) is int and 0 <= d0 < _HUGE
                and 0 <= d1 < _HUGE and 0 <= s0 < _HUGE and 0 <= s1 < _HUGE and 0 <= offset < _HUGE):
            numel = d0 * d1
            return (numel, offset + (d0 - 1) * s0 + (d1 - 1) * s1,
                    (d1 == 1 or s1 == 1) and (d0 == 1 or s0 == d1) or numel == 0)
    elif len(size) == 1 == len(stride):
        d0, s0 = size[0], stride[0]
        if type(d0) is int and type(s0) is int and 0 <= d0 < _HUGE and 0 <= s0 < _HUGE and 0 <= offset < _HUGE:
            return d0, offset + (d0 - 1) * s0, d0 == 1 or s0 == 1 or d0 == 0
    return _extent_loop(size, stride, offset)


def _extent_loop(size: tuple, stride: tuple, offset: int) -> tuple[int, int, bool]:
    """`_extent` of any view, dimension by dimension."""
    if len(size) != len(stride) or len(size) > MAX_NDIM or not 0 <= offset < _HUGE:
        return -1, 0, False
    numel, last, expected, contiguous = 1, offset, 1, True
    for d, s in zip(reversed(size), reversed(stride), strict=False):
        if type(d) is not int or type(s) is not int or not (0 <= d < _HUGE and 0 <= s < _HUGE):
            return -1, 0, False
        if d != 1 and s != expected:
            contiguous = False
        numel *= d
        expected *= d
        last += (d - 1) * s
    return numel, last, contiguous or numel == 0
