"""The pickles and small headers of a PyTorch checkpoint, read from a local mapping or by range.

A pickle's length is known only once it is lexed, so a local file's pickle is lexed over the
mapping (as ever) and a remote file's (`weightio._remote.RemoteFile`) over a window of its bytes
that grows (`WINDOW`, then `GROWTH` times larger) while the lexer stops for want of bytes —
a message saying the pickle runs past the end — up to where it must end or ``limits.header_bytes``.
Lexing is sequential, so any other error is the one the whole file gives; the last window is
lexed with the same bounds as a local file, so messages are the same too.

Legacy tar checkpoints interleave small pickles and element counts with storage data: those are
read ``exact`` (`read`), so that walking the storages fetches none of their bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._remote import BLOCK
from ...errors import CorruptFileError
from ...limits import Limits
from ..base import is_remote
from . import lexer

if TYPE_CHECKING:
    from ..base import AnyFile

__all__ = ["GROWTH", "WINDOW", "lex_pickle", "read"]

WINDOW = 64 << 10  # the first window of a remote pickle (one cache block): most checkpoints' pickles whole
GROWTH = 4  # each further window this many times the last
_TRUNCATED = ("runs past the end", "without a STOP", " remain")  # the lexer's words for bytes it lacked


def read(file: AnyFile, offset: int, length: int, what: str, *, exact: bool = False) -> bytes:
    """`file.read`; for a remote file and `exact`, these bytes alone in one request (not the cache
    blocks around them, which may be storage data) unless they lie in the first block."""
    if exact and is_remote(file) and length > 0 and BLOCK < offset + length <= file.size and offset >= 0:
        return file.gather([(offset, length)], what).tobytes()  # (the first block: sniffing fetched it)
    return file.read(offset, length, what)


def lex_pickle(file: AnyFile, start: int, stop: int, *, what: str, limits: Limits, exact: bool = False,
               window: int = WINDOW, collect: bool = False) -> tuple[int, bytes, Any]:
    """The pickle at `start`, which must end by `stop`: (the offset just past its STOP, its bytes,
    the lexer of `weightio.formats.pytorch.lexer.lex`)."""
    if not is_remote(file):
        data = memoryview(file.data)[:stop]  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
        lexed = lexer.lex(data, start, path=file.path, what=what, limits=limits, collect=collect)
        return lexed.pos, bytes(data[start:lexed.pos]), lexed
    limit = min(stop, start + limits.header_bytes)
    buf = b""
    while True:
        end = min(limit, start + window)
        if not exact and end < limit:  # to a cache block's end: the next block may be storage data
            end = max(start + len(buf) + 1, end // BLOCK * BLOCK)
        if end > start + len(buf):
            buf += read(file, start + len(buf), end - start - len(buf), what, exact=exact)
        final = end >= limit
        try:  # the last window with the local bounds: the same cap, the same messages
            lexed = lexer.lex(buf, 0, stop - start if final else None, path=file.path, what=what, limits=limits,
                              collect=collect)
        except CorruptFileError as e:
            if final or not any(words in e.message for words in _TRUNCATED):
                raise
            window *= GROWTH
            continue
        return start + lexed.pos, buf[: lexed.pos], lexed
