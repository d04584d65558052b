"""The ``descr`` of an ``.npy`` header, and the Python 2 integer suffix: parsed here, never eval'd.

numpy writes ``descr`` with ``numpy.lib.format.dtype_to_descr`` (a type string, or
``dtype.descr`` for a record) and reads it back with ``descr_to_dtype``. The grammar::

    descr    := TYPESTR | fields
    TYPESTR  := [<>|=] code [size] ['[' unit ']']     '<f4' '|b1' '|S3' '<U3' '<M8[ns]' '>m8[s]' '|V8' '|O'
    fields   := '[' field, ... ']'
    field    := (name, descr) | (name, descr, shape)   shape: an int or a tuple of ints (a sub-array)
    name     := str | (title: str, name: str)

Fields lie one after another, as ``dtype.descr`` lists them: an aligned or padded record writes
its gaps as fields named ``''`` of a void type without fields (``('', '|V7')``; a sub-array of
one, ``('', '|V8', (2,))``, too), which take their room and are not fields (numpy's rule in
``descr_to_dtype``). So offsets are never read from the
file: they are the running sum of the itemsizes, and cannot be negative, overlap or point
outside the record.

Rules enforced here, beyond numpy's (which hands every string to ``numpy.dtype``):

* a type string is one type code with an optional byte order, size and unit: comma strings
  (``'f4,f4'``) and the deprecated ``'a'`` code never reach ``numpy.dtype``;
* records nest at most `MAX_DEPTH` levels, sub-arrays have at most `MAX_SUBARRAY_NDIM`
  non-negative int dimensions, names are str (titles too);
* every itemsize is computed with Python ints first and must fit numpy's C ``int``
  (`MAX_ITEMSIZE`), and an element of 0 bytes (``'|V0'``, ``[]``, a record of empty fields) is
  refused: such an array holds no data, and weightio does not serve it (numpy.save writes it and
  numpy.load reads it; it was never readable here);
* a descr that holds the object type ``'O'`` anywhere (a field, a nested field, a sub-array)
  gives a dtype with ``hasobject``: its data is a pickle, which the reader never loads and
  refuses when the array is read (see `weightio.formats.numpy`).

Every refusal is an `UnsupportedDTypeError` naming the descr.

Python 2 wrote ``long`` integers with an ``L`` suffix (``'shape': (2L, 3L)``). numpy reads such
headers of format versions 1.0 and 2.0 only (3.0 came after Python 2), and only after the
header failed to parse as it is: it then drops every name token ``L`` that directly follows a
number token and parses again (``numpy/lib/format.py``, ``_filter_header``). `strip_long_suffixes`
applies that rule.
"""

from __future__ import annotations

import io
import re
import tokenize
from typing import Any

import numpy as np

from ..errors import UnsupportedDTypeError
from ..text import describe

__all__ = ["MAX_DEPTH", "MAX_ITEMSIZE", "MAX_SUBARRAY_NDIM", "descr_dtype", "strip_long_suffixes"]

MAX_DEPTH = 32  # records within records; numpy's own writers never go past a few
MAX_SUBARRAY_NDIM = 32  # numpy's NPY_MAXDIMS for a field's sub-array is 64; no real file comes near
MAX_ITEMSIZE = (1 << 31) - 1  # numpy keeps a dtype's itemsize in a C int
# One type code with an optional byte order, size and unit ('<f4', '|O', '<M8[s]'): what numpy writes.
# Comma and sub-array strings are never plain, and numpy 2 warns on the 'a' (bytes) code, so
# neither reaches np.dtype (a DeprecationWarning must not escape a reader).
TYPESTR = re.compile(r"[<>|=]?(?!a)[A-Za-z?][A-Za-z0-9_]*(\[\w+\])?")
_KINDS = frozenset("biufcSUVMmO")  # numbers, bytes, str, void, datetime, timedelta, object


def descr_dtype(descr: Any, path: str, tensor: str | None) -> np.dtype:
    """The dtype numpy's ``descr_to_dtype`` makes of `descr`, validated as described above.

    Raises:
        UnsupportedDTypeError: `descr` is no descriptor numpy writes, or one this reader bounds.
    """
    if isinstance(descr, str):
        dtype = _typestr(descr, descr, path, tensor)
    elif isinstance(descr, list):
        dtype = _record(descr, descr, 1, path, tensor)
    else:
        raise UnsupportedDTypeError(f"descr {describe(descr)} is not a dtype descriptor (a type string such as "
                                    "'<f4' or a list of record fields)", path=path, tensor=tensor)
    if dtype.itemsize == 0:
        raise UnsupportedDTypeError(f"descr {describe(descr)} has elements of 0 bytes (an array that holds no data), "
                                    "which weightio does not read", path=path, tensor=tensor)
    return dtype


def _typestr(text: str, descr: Any, path: str, tensor: str | None) -> np.dtype:
    def unsupported(why: str) -> UnsupportedDTypeError:
        where = "" if text is descr else f" (in descr {describe(descr)})"
        return UnsupportedDTypeError(f"dtype {text!r}{where} {why}", path=path, tensor=tensor)

    if not TYPESTR.fullmatch(text):
        raise unsupported("is not a numpy type string")
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError):
        raise unsupported("is not a numpy dtype (or its itemsize does not fit numpy's C int)") from None
    if dtype.kind not in _KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise unsupported("is not a plain numpy dtype")
    return dtype


def _record(fields: list, descr: Any, depth: int, path: str, tensor: str | None) -> np.dtype:
    """A record dtype from its field list, built as numpy builds it (names, formats, offsets)."""
    if depth > MAX_DEPTH:
        raise UnsupportedDTypeError(f"descr nests records more than {MAX_DEPTH} deep", path=path, tensor=tensor)
    names, titles, formats, offsets = [], [], [], []
    offset = 0
    for index, field in enumerate(fields):
        name, dtype = _field(field, index, descr, depth, path, tensor)
        # numpy's padding rule, on the field's dtype after its sub-array shape: ('', '|V8', (2,))
        # is 16 bytes of padding to numpy.load, not a field named ''
        if not (name == "" and dtype.type is np.void and dtype.names is None):
            title, name = name if isinstance(name, tuple) else (None, name)
            names.append(name)
            titles.append(title)
            formats.append(dtype)
            offsets.append(offset)
        offset += dtype.itemsize
        if offset > MAX_ITEMSIZE:
            raise UnsupportedDTypeError(f"descr {describe(descr)} makes records of more than {MAX_ITEMSIZE:,} bytes "
                                        "(numpy keeps itemsizes in a C int)", path=path, tensor=tensor)
    try:
        return np.dtype({"names": names, "formats": formats, "titles": titles, "offsets": offsets, "itemsize": offset})
    except (TypeError, ValueError) as e:  # names repeated, a title equal to a name …
        raise UnsupportedDTypeError(f"descr {describe(descr)} is not a valid record: {e}", path=path,
                                    tensor=tensor) from None


def _field(field: Any, index: int, descr: Any, depth: int, path: str, tensor: str | None) -> tuple[Any, np.dtype]:
    def unsupported(why: str) -> UnsupportedDTypeError:
        return UnsupportedDTypeError(f"field {index} of descr {describe(descr)}: {why}", path=path, tensor=tensor)

    if not isinstance(field, tuple) or len(field) not in (2, 3):
        raise unsupported(f"{describe(field)} is not (name, descr) or (name, descr, shape)")
    name, inner = field[0], field[1]
    if not (isinstance(name, str) or (isinstance(name, tuple) and len(name) == 2
                                      and all(isinstance(part, str) for part in name))):
        raise unsupported(f"the name {describe(name)} is not a str (or a (title, name) pair of str)")
    if isinstance(inner, str):
        dtype = _typestr(inner, descr, path, tensor)
    elif isinstance(inner, list):
        dtype = _record(inner, descr, depth + 1, path, tensor)
    else:
        raise unsupported(f"{describe(inner)} is not a type string or a list of fields")
    if len(field) == 3:
        dtype = _subarray(dtype, field[2], unsupported)
    return name, dtype


def _subarray(dtype: np.dtype, shape: Any, unsupported: Any) -> np.dtype:
    dims = (shape,) if type(shape) is int else shape
    if (not isinstance(dims, tuple) or len(dims) > MAX_SUBARRAY_NDIM
            or not all(type(d) is int and d >= 0 for d in dims)):
        raise unsupported(f"the sub-array shape {describe(shape)} is not at most {MAX_SUBARRAY_NDIM} "
                          "non-negative ints")
    count = 1
    for d in dims:
        count *= d
        if count * dtype.itemsize > MAX_ITEMSIZE:
            raise unsupported(f"the sub-array shape {describe(shape)} makes fields of more than {MAX_ITEMSIZE:,} "
                              "bytes (numpy keeps itemsizes in a C int)")
    try:
        return np.dtype((dtype, shape))
    except (TypeError, ValueError) as e:
        raise unsupported(f"numpy refuses the sub-array ({e})") from None


def strip_long_suffixes(text: str) -> str | None:
    """`text` without the ``L`` of Python 2 long literals (``(2L, 3L)`` -> ``(2, 3)``), by numpy's
    rule: a name token that is exactly ``L`` right after a number token goes. None when `text`
    does not even tokenize (the caller reports the original parse error)."""
    lines = io.StringIO(text).readlines()  # the lines tokenize numbers (str.splitlines also breaks at \x0c, \x85 …)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    cuts = []
    previous = None
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if previous == tokenize.NUMBER and token.type == tokenize.NAME and token.string == "L":
                (row, col), (_, end) = token.start, token.end
                cuts.append((starts[row - 1] + col, starts[row - 1] + end))
            previous = token.type
    except (tokenize.TokenError, SyntaxError):  # IndentationError is a SyntaxError
        return None
    if not cuts:
        return None
    pieces, at = [], 0
    for begin, end in cuts:
        pieces.append(text[at:begin])
        at = end
    return "".join(pieces) + text[at:]
