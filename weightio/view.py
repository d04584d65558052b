"""`TensorView`: one tensor of an open checkpoint, read only when asked for.

A view holds a reader, a name and a `TensorInfo`; it touches no tensor bytes until
`numpy()`, `raw()` or indexing. Those return read-only numpy arrays that are zero-copy views
of the file mapping whenever the stored bytes allow it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ._io import MappedFile
from ._memory import handed_over
from ._native import speedups
from ._remote import RemoteFile, RemoteImage
from .dtypes import PACKED, dtype_name, is_number, parse_dtype
from .errors import CorruptFileError, UnsupportedDTypeError, WeightioError
from .text import dims

if TYPE_CHECKING:
    from .formats.base import Reader
    from .records import TensorInfo

__all__ = ["TensorView", "stored_array"]


class TensorView:
    """A lazy, read-only handle on one stored tensor.

    Attributes:
        name: the tensor's name in its checkpoint.
        info: where and how the tensor is stored (`TensorInfo`).

    Example:
        >>> v = ckpt["encoder.weight"]            # doctest: +SKIP
        >>> v.shape, v.dtype                      # header only, no data read
        ((768, 768), dtype('float32'))
        >>> v[:2].sum()                           # reads two rows
    """

    __slots__ = ("name", "info", "_reader")

    def __init__(self, reader: Reader, name: str, info: TensorInfo) -> None:
        self._reader = reader
        self.name = name
        self.info = info

    @classmethod
    def _each(cls, reader: Reader, tensors: Iterable[tuple[str, TensorInfo]]) -> Iterator[tuple[str, TensorView]]:
        """``(name, TensorView(reader, name, info))`` for each ``(name, info)`` of `tensors`, made
        without a call of ``__init__`` per view (a fifth of listing 100k tensors)."""
        new = object.__new__
        for name, info in tensors:
            view = new(cls)
            view._reader, view.name, view.info = reader, name, info
            yield name, view

    # ------------------------------------------------------------------ header facts
    if TYPE_CHECKING:  # (what type checkers and the API reference see: the same property)
        @property
        def shape(self) -> tuple[int, ...]:
            """numpy-order shape (GGUF `ne` reversed)."""
            ...
    else:  # read in C, with no Python frame: a listing asks every view its shape
        shape = property(operator.attrgetter("info.shape"), doc="numpy-order shape (GGUF `ne` reversed).")

    @property
    def dtype(self) -> np.dtype:
        """The dtype `numpy()` returns: numbers in native byte order; float32 for quantized blocks;
        any other dtype (bytes, str, datetime, records of an ``.npy``) as stored, byte order included."""
        dtype = self.info.dtype
        return dtype if dtype.isnative or not is_number(dtype) else dtype.newbyteorder("=")

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies as stored (quantized and packed types: their real size)."""
        return self.info.nbytes

    @property
    def ggml_type(self) -> str | None:
        """The ggml block type (``"Q4_K"``, …) for block-quantized tensors, else None."""
        return self.info.ggml_type

    @property
    def ndim(self) -> int:
        return len(self.info.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.info.shape)

    @property
    def path(self) -> str:
        """The file this tensor is stored in."""
        return self._reader.path

    def __len__(self) -> int:
        if not self.info.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.info.shape[0]

    def __repr__(self) -> str:
        kind = self.info.ggml_type or dtype_name(self.info.dtype)
        return f"TensorView({self.name!r}, shape={dims(self.info.shape, '()')}, dtype={kind})"

    # ------------------------------------------------------------------ data
    def numpy(self) -> np.ndarray:
        """The tensor as a read-only numpy array.

        Zero-copy (a view of the file mapping) whenever dtype and byte order allow. It copies,
        and only then, for: big-endian numbers (converted to native order; the other dtypes of
        ``.npy`` files, bytes, str, datetime and records, keep their stored byte order, as
        ``numpy.load`` returns them), deflated `.npz` members
        (inflated once, then shared by every view) and block-quantized tensors (dequantized to
        float32). Strided torch tensors keep their strides.

        Data stored at an offset that is not a multiple of its itemsize (as in most ``.npz``
        files numpy writes) is still returned as a view, with ``flags.aligned == False``: numpy
        computes on it correctly. Backends that need aligned memory (torch) copy at transfer.
        """
        out = stored_array(self._reader, self.name, self.info)
        if out is not None:
            return out
        if self.info.ggml_type is not None:
            return self._dequantize(None)
        return _finish(self._stored())

    def raw(self) -> np.ndarray:
        """The stored bytes as a read-only 1-D ``uint8`` view (quantized blocks, packed types).

        For strided tensors, the bytes from the first to one past the last element.
        """
        start, stop = self.info.stored_range()
        buf = self._reader.buffer(self.name)
        if isinstance(buf, RemoteImage):  # a remote file: fetch exactly these bytes
            return buf.file.fetch(start, stop - start, f"tensor {self.name!r}")
        return buf[start:stop]

    def prefetch(self) -> int:
        """Start fetching the tensor's stored bytes now, when its file is remote (on the fetch
        pool, several requests in flight); the next `numpy()` or `raw()` takes them instead of
        asking. Returns the bytes asked for: 0 for a local file (its pages are mapped, not
        fetched), for bytes fetched or on their way already, or for a tensor whose read refuses
        (that read says why). Loops over many tensors fetch the next ones together
        (`weightio._streaming.reading_ahead`)."""
        where = self.stored_remote()
        return 0 if where is None else where[0].read_ahead(where[1], where[2], f"tensor {self.name!r}")

    def stored_remote(self) -> tuple[RemoteFile, int, int] | None:
        """``(remote file, offset, length)`` of the tensor's stored bytes; None for a local file or
        a tensor whose read refuses (that read says why)."""
        info = self.info
        if not getattr(self._reader.file, "remote", False) or info.dtype.hasobject:
            return None
        try:
            buf = self._reader.buffer(self.name)
        except WeightioError:
            return None
        if not isinstance(buf, RemoteImage):
            return None
        start, stop = info.stored_range()
        return buf.file, start, stop - start

    def __getitem__(self, key: Any) -> np.ndarray:
        """``view[a:b]``, ``view[:, a:b]``: the selected part as a read-only array.

        Only the bytes of the selected elements are read (the mapping is paged in lazily);
        conversions (byte order, alignment, dequantization) apply to the selection alone.
        """
        if self.info.ggml_type is not None:
            return self._dequantize(key)
        remote = self._remote_select(key)
        if remote is not None:
            return remote
        stored = self._stored()
        try:
            return _finish(stored[key])
        except SystemError:  # numpy cannot make a str of a code point past U+10FFFF (the scalar of a '<U' element)
            if not _has_text(stored.dtype):
                raise
            raise CorruptFileError("holds a character beyond U+10FFFF (not Unicode), which Python cannot hold in a "
                                   "str", path=self.path, tensor=self.name) from None

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def to(self, device: str = "numpy", dtype: Any = None, *, copy: bool = False) -> Any:
        """The tensor on `device`, cast to `dtype` when given.

        Args:
            device: ``"numpy"``, ``"torch"`` / ``"torch:cpu"``, ``"torch:cuda:N"``, ``"torch:mps"``,
                ``"jax[:gpu:N]"``, ``"cupy[:N]"``.
            dtype: any spelling `weightio.dtypes.parse_dtype` accepts (``"bf16"``, ``np.float16`` …).
            copy: in memory of its own (writable, never a view of the file), read with parallel
                ``pread``s (`weightio.devices.load_all`): faster than ``clone()`` of the view.
        """
        from . import devices

        try:
            return devices.place(self, device, None if dtype is None else parse_dtype(dtype), copy=copy)
        except UnsupportedDTypeError as e:  # the dtype tables know no file: name this tensor's
            if e.path is not None:
                raise
            raise UnsupportedDTypeError(e.message, path=self.path, tensor=self.name) from None

    # ------------------------------------------------------------------ internals
    def _stored(self) -> np.ndarray:
        """The stored elements as a numpy view, in stored byte order and alignment (zero-copy)."""
        info = self.info
        if info.dtype in PACKED:
            row = PACKED[info.dtype]
            raise UnsupportedDTypeError(
                f"dtype {row.safetensors} packs {8 // math.gcd(row.bits, 8)} elements per "
                f"{row.bits // math.gcd(row.bits, 8)} byte(s), which numpy cannot view; "
                "read the packed bytes with .raw()",
                path=self.path,
                tensor=self.name,
            )
        buf = self._reader.buffer(self.name)
        if info.dtype.hasobject:  # the reader refuses these in buffer(); never view bytes as pointers
            raise UnsupportedDTypeError("object arrays are never read", path=self.path, tensor=self.name)
        if isinstance(buf, RemoteImage):  # a remote file: fetch the tensor's bytes (and no others)
            start, stop = info.stored_range()
            buf = buf.file.fetch(start, stop - start, f"tensor {self.name!r}")
            if info.strides is None:
                return buf.view(info.dtype).reshape(info.shape)
            return np.ndarray(info.shape, info.dtype, buffer=buf, offset=info.offset - start, strides=info.strides)
        if info.strides is None:
            return buf[info.offset : info.offset + info.nbytes].view(info.dtype).reshape(info.shape)
        return np.ndarray(info.shape, info.dtype, buffer=buf, offset=info.offset, strides=info.strides)

    def _remote_select(self, key: Any) -> np.ndarray | None:
        """``self[key]`` of a tensor in a remote file, fetching only the selected bytes; None for a
        local file or an index that is not basic (the whole tensor is read, then indexed)."""
        info = self.info
        if info.dtype in PACKED or info.dtype.hasobject:
            return None  # _stored() says why it cannot
        buf = self._reader.buffer(self.name)
        if not isinstance(buf, RemoteImage):
            return None
        from ._select import plan

        selection = plan(info.shape, info.dtype, info.strides, key)
        if selection is None:
            return None
        raw = buf.file.gather([(info.offset + o, n) for o, n in selection.runs], f"tensor {self.name!r}")
        return _finish(selection.assemble(raw, info.dtype))

    def _dequantize(self, key: Any) -> np.ndarray:
        from . import quant

        raw = self.raw()  # first: a reader that cannot serve this tensor's bytes says why
        try:
            return quant.dequantize_stored(raw, self.info, key)
        except UnsupportedDTypeError as e:
            raise UnsupportedDTypeError(e.message, path=self.path, tensor=self.name) from None


def stored_array(reader: Reader, name: str, info: TensorInfo) -> np.ndarray | None:
    """`TensorView.numpy()` of a tensor numpy views as it is stored (a number in native byte
    order, or any dtype `numpy()` keeps as stored, in a local buffer): the common case, on
    the shortest path (`VarBuilder.get` takes it too). None for any other tensor, which the caller
    serves the general way (the same array, or the refusal). The reader's `buffer` is asked (its
    refusals and the file's changed-file check), except in C, once the element view is cached, for
    a reader whose `buffer` is `Reader.buffer` (refuses nothing): `mapped_slice` checks the file itself."""
    # one unpacking (a field read by name costs more); every field of `TensorInfo`, in order
    dtype, shape, offset, nbytes, strides, ggml_type = info
    kind = _KINDS.get(dtype)
    if kind is None:
        kind = _kind(dtype)
        if len(_KINDS) < 1024:  # (bounded: records and strings of .npy files bring dtypes without end)
            _KINDS[dtype] = kind
            if kind == _ELEMENTS:
                ELEMENT_SIZES[dtype] = dtype.itemsize
    file = reader.file
    if not kind or ggml_type is not None or strides is not None or file.remote:
        return None  # (a remote file's bytes are fetched by the general path)
    if kind == _ELEMENTS and type(file) is MappedFile and _mapped_slice is not None:
        plain = PLAIN_READERS.get(type(reader))
        if plain is None:
            plain = PLAIN_READERS[type(reader)] = _plain_buffer(type(reader))
        size = dtype.itemsize
        if plain and not offset % size:
            # in C: the changed-file check, then one array over the cached element view (numpy's C API);
            # None where that view is not made yet or the check fails (the way below says why)
            start = offset // size
            out = _mapped_slice(file, dtype, start, start + nbytes // size, shape)
            if out is not None:
                return out
    buf = reader.buffer(name)
    if type(buf) is not np.ndarray:
        return None
    size = dtype.itemsize
    if kind == _ELEMENTS and not offset % size:
        typed = file.elements(buf, dtype)  # (not remote: returned above)
        if typed is not None:
            offset //= size
            flat = typed[offset : offset + nbytes // size]
            return flat if len(shape) == 1 else flat.reshape(shape)  # (a 1-D tensor is the slice itself)
    out = np.ndarray(shape, dtype, buffer=buf, offset=offset)
    if out.flags.writeable:  # (every reader's buffer is read-only; this keeps it so whatever it is)
        out.flags.writeable = False
    return out


_VIEW, _ELEMENTS = 1, 2  # how `stored_array` views a dtype (0: it does not)
_KINDS: dict[np.dtype, int] = {}
ELEMENT_SIZES: dict[np.dtype, int] = {}  # dtype -> itemsize, of the dtypes viewed as stored elements
PLAIN_READERS: dict[type, bool] = {}  # reader class -> whether its `buffer` is `Reader.buffer` (refuses nothing)
_mapped_slice = getattr(speedups, "mapped_slice", None)


def _plain_buffer(cls: type) -> bool:
    from .formats.base import Reader

    return getattr(cls, "buffer", None) is Reader.buffer


def plain_get_py(plain: tuple, name: Any, shape: Any) -> np.ndarray | None:
    """`VarBuilder.get` of ``head + name`` stored under that name, on numpy as stored, when its
    stored shape is `shape` (a tuple of ints): `stored_array`'s view, the request recorded. None for
    any other request, which the caller serves the general way (or refuses). `plain` is a cursor's
    ``(placed, readers, usage.stamps, usage.plain, ELEMENT_SIZES, PLAIN_READERS, MappedFile, usage,
    head)`` (the builder's, made once, and the cursor's prefix): a name's info, reader index and
    serial come from `placed` (`Checkpoint._placed`, empty until the first request, which the
    general way serves), and the request is counted at its serial (`Usage.plain_hit`). The C
    `plain_get` does the same, taking the cached element views `stored_array` made and leaving the
    rest to this way."""
    if type(name) is not str or not name or type(shape) is not tuple:
        return None
    placed, readers, _, _, _, _, _, usage, head = plain
    full = head + name
    found = placed.get(full)
    if type(found) is not tuple or len(found) != 3:
        return None
    info, at, serial = found
    # (the map's own triples always hold a reader's index and a serial within the record: as C checks)
    if (type(at) is not int or not 0 <= at < len(readers) or type(serial) is not int
            or not 0 <= serial < len(usage.plain) // 24):
        return None
    if info.shape != shape:
        return None
    for d in shape:  # (equal to the stored ints; a bool, float or numpy int goes the general way)
        if type(d) is not int:
            return None
    out = stored_array(readers[at], full, info)
    if out is not None:
        usage.plain_hit(serial)
    return out


plain_get: Any = getattr(speedups, "plain_get", None) or plain_get_py


def _kind(dtype: np.dtype) -> int:
    if (dtype in PACKED or dtype.hasobject or not dtype.itemsize or dtype.subdtype is not None
            or (not dtype.isnative and is_number(dtype))):
        return 0
    return _ELEMENTS if dtype.fields is None else _VIEW


def _has_text(dtype: np.dtype) -> bool:
    """Whether `dtype` (a record's fields and sub-arrays included) holds numpy str ('U') elements."""
    if dtype.subdtype is not None:
        return _has_text(dtype.subdtype[0])
    if dtype.fields is not None:
        return any(_has_text(field[0]) for field in dtype.fields.values())
    return dtype.kind == "U"


def _finish(arr: np.ndarray) -> np.ndarray:
    """Make a stored-order view safe to hand out: numbers in native byte order, read-only."""
    if not isinstance(arr, np.ndarray):  # an integer index into a 0-d/1-d view gives a scalar
        return arr
    if not arr.dtype.isnative and is_number(arr.dtype):
        arr = handed_over(arr.astype(arr.dtype.newbyteorder("=")))  # (a copy for this call alone)
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr
