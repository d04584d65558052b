"""The allowlist unpickler: how weightio reads the pickles inside PyTorch checkpoints.

A pickle is a program for a small stack machine; ``pickle.load`` runs it, and its ``GLOBAL`` /
``REDUCE`` opcodes import and call anything. weightio never does. Every pickle goes through
two steps:

1. `prepass` — a lexer over the opcode stream, written from the pickle protocol (protocols
   0-5, the opcode table in `.opcodes`), that refuses a pickle before CPython sees it when:

   * an opcode instantiates or resolves code by other means than a named global: ``INST``,
     ``OBJ``, ``EXT1/2/4`` (the copyreg registry), ``NEWOBJ_EX`` -> `UnsafePickleError`;
   * an opcode needs what a checkpoint cannot provide: ``PERSID`` (text persistent ids),
     ``NEXT_BUFFER`` / ``READONLY_BUFFER`` (protocol-5 out-of-band buffers) -> `CorruptFileError`;
   * an argument runs past the bytes present — CPython allocates a ``BINBYTES8`` of 2**40 bytes
     before it notices the data is missing;
   * a memo index exceeds the number of memo writes so far (+256) — CPython sizes its memo
     array by the largest index, so ``LONG_BINPUT 0x7fffffff`` alone asks for 32 GiB;
   * the stack machine goes wrong: popping below a ``MARK``, ``PROTO`` anywhere but first,
     anything but exactly one object left at ``STOP``, more than `MAX_STACK` items,
     `MAX_MARKS` nested marks or `MAX_OPCODES` opcodes;
   * an object nests deeper than ``limits.nesting_depth`` (1000) levels, by any opcode that
     nests: every stack item and memo slot carries a depth; ``TUPLE``/``TUPLE1-3``, ``LIST``,
     ``DICT``, ``FROZENSET`` give their deepest item's depth + 1, ``REDUCE``/``NEWOBJ`` and
     ``BINPERSID`` their deepest operand's, and ``APPEND(S)``, ``SETITEM(S)``, ``ADDITEMS``,
     ``BUILD`` raise their target's to its new item's + 1. One-item tuples nest without a
     ``MARK``, and CPython hashes a tuple (a dict key, a set member) by recursing in C with no
     depth check: a 200 000-deep one crashes the process. The bound is exact for tuples and
     frozensets, which cannot change after they are built (and no stand-in builds one from a
     mutable container's items, see `.allowlist`); a list or dict memoized, nested, then
     filled through ``BINGET`` can be deeper than its slot says, which is harmless to
     CPython (hashing one fails at once; ``repr`` and ``==`` check their depth) and is bounded
     again by `.flatten`, which walks iteratively;
   * ``STACK_GLOBAL`` takes operands that are not strings -> `UnsafePickleError`;
   * more than `MAX_WEAK_KEYS` dict keys or set members have a hash the file can choose
     (integers of 2**61 and more, floats, tuples, results of calls): CPython's dict
     degrades to quadratic time on colliding keys, and only ``str``/``bytes`` hashes are
     randomized. Checkpoint keys are strings and small integers.

2. `Unpickler` — CPython's C unpickler, whose ``find_class`` returns stand-ins for an exact
   ``(module, name)`` allowlist (`.allowlist.ALLOWLIST`) and never imports, and whose
   ``persistent_load`` hands storage ids to the container's resolver. Stand-ins record what the
   pickle describes; none calls torch, numpy's pickle support or anything the file names. Any
   other global raises `UnsafePickleError` naming ``module.name``.

`.unpickler.load` runs both; `.flatten.flatten` then names what it built.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, cast

from ... import limits as _limits
from ...errors import CorruptFileError, UnsafePickleError, WeightioError
from . import entries as _entries
from .lexer_messages import Messages
from .opcodes import (
    ARG,
    BINGET,
    BINPERSID,
    BINPUT,
    BINUNICODE,
    CALLS,
    CHUNK,
    LEVEL,
    LINE,
    LONG_BINGET,
    LONG_BINPUT,
    MARK,
    MAX_MARKS,
    MAX_OBJECT_DEPTH,
    MAX_OPCODES,
    MAX_STACK,
    MAX_WEAK_KEYS,
    MEMO_SLACK,
    MEMOIZE,
    NESTS,
    OP,
    OPCODE_NAMES,
    POP,
    POPS,
    PUSH_ONLY,
    REFUSED_CORRUPT,
    REFUSED_UNSAFE,
    REFUSED_WHY,
    S4,
    SAFE,
    SHORT_BINUNICODE,
    STEP,
    STOP,
    STR,
    TAG,
    TAG_BITS,
    TO_MARK,
    TUPLE,
    TUPLE1,
    TUPLE2,
    U8,
    WEAK,
    WIDE,
)

__all__ = ["MAX_MARKS", "MAX_OBJECT_DEPTH", "MAX_OPCODES", "MAX_STACK", "MAX_WEAK_KEYS", "lex", "prepass"]

_U32 = struct.Struct("<I")


def _chunk_size(max_opcodes: int, max_stack: int) -> int:
    """Opcodes between limit checks: the stack grows by at most one item per opcode, so checking
    every ``min(1024, limits)`` opcodes keeps the overshoot below the limit itself."""
    return max(1, min(CHUNK, max_opcodes, max_stack))


# ----------------------------------------------------------------------------- prepass


class _Lexer(Messages):
    """One pass over one pickle: the checks listed in the module docstring."""

    def __init__(self, data: Any, start: int, end: int, fail: Callable[[str], WeightioError],
                 limits: _limits.Limits) -> None:
        self.data, self.pos, self.end, self.fail = data, start, end, fail
        self.max_opcodes, self.max_stack = limits.pickle_opcodes, limits.pickle_stack
        self.max_marks = limits.nesting_depth
        self.max_depth = min(limits.nesting_depth, MAX_OBJECT_DEPTH)  # a ceiling: see .opcodes
        self.stack: list[int] = []  # per item: depth * LEVEL + tag (see .opcodes)
        self.marks: list[int] = []  # the enclosing fences, innermost last
        self.fence = 0  # stack length at the innermost MARK
        self.memo: dict[int, int] = {}
        self.puts = 0
        self.weak_keys = 0
        self.ops = 0
        self.globals: list[tuple[str, str]] = []  # GLOBAL/INST arguments, for scan
        self.refusals: list[WeightioError] | None = None  # scan: refused constructs, noted not raised
        self.text8: list[int] = []  # offsets of 8-bit strings (Python 2) and of FRAMEs: see .py2_strings
        self.frame_end = 0  # where the last FRAME's bytes end (from the pickle's start)

    def run(self) -> int:
        """Check the pickle starting at ``start``; return the offset just past its STOP.

        The opcodes torch pickles are made of are handled inline, in order of frequency (this
        loop is most of the cost of opening a checkpoint); the rest go through `_special`.
        `data` ends where the pickle must end, so reading past it raises IndexError. The inline
        paths leave stack underflow below a MARK to CPython, which refuses it at the same
        opcode; up to that opcode this model and CPython's stack agree, which is all the
        key-hash and depth accounting needs.

        Items are ``depth * LEVEL + tag`` with tags below LEVEL (= 4), so the largest of some
        items is the deepest, ``(item | 3) + 3`` a tuple (tag WEAK = 2) one level above it,
        ``(item | 3) - 1`` a call's result (WEAK) at its level and ``(item | 3) - 2`` a storage
        (SAFE = 1). The literals are spelled out: this loop is hot.
        """
        data, stack, marks, memo = self.data, self.stack, self.marks, self.memo
        push_only, calls, step_table, tag_table = PUSH_ONLY, CALLS, STEP, TAG
        push, u32 = stack.append, _U32.unpack_from
        first = pos = self.pos
        fence = puts = 0  # stack length at the innermost MARK; memo writes so far
        last = pos  # the opcode being decoded, for error messages
        max_stack, max_marks = self.max_stack, self.max_marks
        deepest = self.max_depth * LEVEL + TAG_BITS  # the largest item allowed
        size = _chunk_size(self.max_opcodes, max_stack)
        string, rounds, skip, cap = STR, 0, 0, -(-self.max_opcodes // size)
        entry, entry_gate, slack = _entries.run, _entries.PUTS, MEMO_SLACK
        try:
            while rounds < cap:
                if not skip and len(stack) > max_stack:  # (a chunk entered by the fast path: checked by it)
                    raise self._limits(rounds * size)
                for i in range(skip, size):
                    op = data[pos]
                    last = pos
                    if op == LONG_BINPUT:
                        (index,) = u32(data, pos + 1)
                        if index > puts + MEMO_SLACK:
                            self.puts = puts
                            raise self._memo_bomb(index, op, pos - first)
                        memo[index] = stack[-1]
                        puts += 1
                        pos += 5
                    elif op == BINGET:
                        tag = memo.get(data[pos + 1])
                        if tag is None:
                            raise self._unset(data[pos + 1], op, pos - first)
                        push(tag)
                        pos += 2
                    elif op in push_only:
                        push(tag_table[op])
                        pos += step_table[op]
                    elif op == LONG_BINGET:
                        (index,) = u32(data, pos + 1)
                        tag = memo.get(index)
                        if tag is None:
                            raise self._unset(index, op, pos - first)
                        push(tag)
                        pos += 5
                    elif op == BINUNICODE:
                        (n,) = u32(data, pos + 1)
                        pos += 5 + n
                        push(string)
                        if data[pos] in entry_gate:  # maybe a state-dict entry's key: see .entries
                            pos, ran, puts = entry(data, pos, cap * size - rounds * size - i - 1, stack, memo, puts,
                                                   len(marks), max_marks, max_stack, deepest, slack)
                            if ran:
                                rounds, skip = divmod(rounds * size + i + 1 + ran, size)
                                break
                    elif op == MARK:
                        if len(marks) >= max_marks:
                            raise self._too_deep(pos - first)
                        marks.append(fence)
                        fence = len(stack)
                        pos += 1
                    elif op == TUPLE:
                        if not marks:
                            raise self.fail(f"TUPLE at offset {pos - first} has no MARK to pop to")
                        items = stack[fence:]
                        item = (max(items) | 3) + 3 if items else 2
                        if item > deepest:
                            raise self._too_nested(op, pos - first)
                        del stack[fence:]
                        fence = marks.pop()
                        push(item)
                        pos += 1
                    elif op in calls:  # REDUCE, NEWOBJ: WEAK, as deep as its operands
                        item = stack.pop()
                        top = stack[-1]
                        stack[-1] = ((item if item > top else top) | 3) - 1
                        pos += 1
                    elif op == TUPLE2:
                        item = stack.pop()
                        top = stack[-1]
                        item = ((item if item > top else top) | 3) + 3
                        if item > deepest:
                            raise self._too_nested(op, pos - first)
                        stack[-1] = item
                        pos += 1
                    elif op == BINPERSID:  # SAFE, as deep as the id
                        stack[-1] = (stack[-1] | 3) - 2
                        pos += 1
                    elif op == TUPLE1:
                        item = (stack[-1] | 3) + 3
                        if item > deepest:
                            raise self._too_nested(op, pos - first)
                        stack[-1] = item
                        pos += 1
                    elif op == BINPUT or op == MEMOIZE:
                        memo[data[pos + 1] if op == BINPUT else len(memo)] = stack[-1]
                        puts += 1
                        pos += 2 if op == BINPUT else 1
                    elif op == SHORT_BINUNICODE:
                        pos += 2 + data[pos + 1]
                        push(string)
                    elif op == STOP:
                        self._stop(pos - first)
                        return pos + 1
                    elif op == POP and len(stack) > fence:  # of an item; popping a MARK is special
                        del stack[-1]
                        pos += 1
                    else:
                        self.fence, self.puts = fence, puts
                        self._special(op, pos, first)
                        pos, fence, puts = self.pos, self.fence, self.puts
                else:
                    rounds, skip = rounds + 1, 0
        except (IndexError, struct.error):  # off the end of the data, or of the stack
            if last < len(data):
                self._argument(data[last], last, first)  # raises if that opcode's argument runs past the end
            if pos >= len(data):
                raise self.fail(f"the pickle ends at offset {pos - first} without a STOP opcode (truncated?)") from None
            raise self._underflow(data[last], last - first) from None
        raise self._limits(self.max_opcodes + 1)

    def _put_at(self, index: int, op: int, at: int) -> None:
        if len(self.stack) <= self.fence:
            raise self._underflow(op, at)
        if index > self.puts + MEMO_SLACK:
            raise self._memo_bomb(index, op, at)
        self.puts += 1
        self.memo[index] = self.stack[-1]

    def _nest(self, op: int, taken: list[int], tag: int, at: int) -> int:
        """The item an opcode pushes: `tag`, as deep as `taken` (+1 for a container of them)."""
        extra = NESTS.get(op)
        if extra is None or not taken:
            return tag
        depth = (max(taken) >> 2) + extra
        if depth > self.max_depth:
            raise self._too_nested(op, at)
        return depth * LEVEL + tag

    def _fill(self, taken: list[int], op: int, at: int) -> None:
        """APPEND(S), SETITEM(S), ADDITEMS, BUILD put `taken` into the item below them."""
        if not taken:
            return
        target = self.stack[-1]
        depth = (max(taken) >> 2) + 1
        if depth > target >> 2:
            if depth > self.max_depth:
                raise self._too_nested(op, at)
            self.stack[-1] = depth * LEVEL + (target & TAG_BITS)

    def _stop(self, at: int) -> None:
        if self.marks:
            self._refuse(self.fail(f"STOP at offset {at} with a MARK still open"))
        elif len(self.stack) != 1:
            self._refuse(self.fail(f"STOP at offset {at} leaves {len(self.stack)} objects on the stack, not 1"))

    def _fence(self) -> int:
        return self.fence

    def _pop(self, n: int, op: int, at: int) -> list[int]:
        stack = self.stack
        if len(stack) - self._fence() < n:
            raise self._underflow(op, at)
        taken = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return taken

    def _pop_mark(self, op: int, at: int) -> list[int]:
        if not self.marks:
            raise self.fail(f"{OPCODE_NAMES[op]} at offset {at} has no MARK to pop to")
        taken = self.stack[self.fence:]
        del self.stack[self.fence:]
        self.fence = self.marks.pop()
        return taken

    def _count_keys(self, items: list[int]) -> None:
        self.weak_keys += [item & TAG_BITS for item in items].count(WEAK)
        if self.weak_keys > MAX_WEAK_KEYS:
            raise self.fail(f"more than {MAX_WEAK_KEYS:,} dict keys or set members whose hash the file can "
                            "choose (integers >= 2**61, floats, tuples): refused to avoid hash flooding")

    def _argument(self, op: int, pos: int, first: int) -> tuple[int, int]:
        """(start, end) of the opcode's argument data; checks it lies inside the pickle."""
        kind = cast(int, ARG[op])  # a valid opcode: `_special` refuses the others before any argument is read
        data, end = self.data, self.end
        if kind >= 0:
            stop = pos + 1 + kind
        elif kind >= U8:  # counted: a length prefix of -kind bytes, then the data
            width = -kind if kind != S4 else 4
            if pos + 1 + width > end:
                raise self._truncated(op, pos - first)
            n = int.from_bytes(data[pos + 1: pos + 1 + width], "little", signed=kind == S4)
            if n < 0:
                raise self.fail(f"{OPCODE_NAMES[op]} at offset {pos - first} has a negative length {n}")
            if n > end - (pos + 1 + width):
                raise self._overrun(op, pos - first, n, end - (pos + 1 + width))
            return pos + 1 + width, pos + 1 + width + n
        else:  # newline-terminated line(s)
            stop = pos + 1
            for _ in range(1 if kind == LINE else 2):
                newline = _find_newline(data, stop, end)
                if newline < 0:
                    raise self._truncated(op, pos - first)
                stop = newline + 1
            return pos + 1, stop
        if stop > end:
            raise self._truncated(op, pos - first)
        return pos + 1, stop

    # -- the opcodes that need more than the generic path ------------------------------------
    def _special(self, op: int, pos: int, first: int) -> None:
        at = pos - first
        if ARG[op] is None:
            raise self.fail(f"invalid opcode {op:#04x} at offset {at}")
        if op in REFUSED_UNSAFE:
            self._refuse(UnsafePickleError(f"opcode {OPCODE_NAMES[op]} at offset {at} builds objects without naming "
                                           "an allowlisted global; refused"))
        elif op in REFUSED_CORRUPT:
            self._refuse(self.fail(f"opcode {OPCODE_NAMES[op]} at offset {at} is not used by checkpoints "
                                   f"({REFUSED_WHY[OPCODE_NAMES[op]]})"))
        start, stop = self._argument(op, pos, first)
        self.pos = stop
        handler = _HANDLERS.get(op)
        if handler is not None:
            handler(self, op, start, stop, at)
            return
        self._effect(op, at)

    def _refuse(self, error: WeightioError) -> None:
        """A construct the loader refuses: raise it, or (scan) note it and keep lexing."""
        if self.refusals is None:
            raise error
        self.refusals.append(error)

    def _effect(self, op: int, at: int) -> None:
        """Generic stack effect from the table: pop, then push the result tag (if any)."""
        n = POPS[op]
        taken = self._pop_mark(op, at) if n == TO_MARK else self._pop(n, op, at)
        tag = TAG[op]
        if tag is not None:
            self.stack.append(self._nest(op, taken, tag, at))

    def _mark(self, op: int, start: int, stop: int, at: int) -> None:
        if len(self.marks) >= self.max_marks:
            raise self._too_deep(at)
        self.marks.append(self.fence)
        self.fence = len(self.stack)

    def _proto(self, op: int, start: int, stop: int, at: int) -> None:
        if at != 0:
            raise self.fail(f"PROTO at offset {at} is not the first opcode")
        if self.data[start] > 5:
            raise self.fail(f"pickle protocol {self.data[start]} is not supported (0-5 are)")

    def _frame(self, op: int, start: int, stop: int, at: int) -> None:
        n = int.from_bytes(self.data[start:stop], "little")
        if n > self.end - stop:
            raise self.fail(f"FRAME at offset {at} claims {n:,} bytes but only {self.end - stop:,} remain")
        if at < self.frame_end:  # pickle's own Python unpickler refuses it; CPython's C one reads on
            raise self.fail(f"FRAME at offset {at} begins inside the frame that ends at offset {self.frame_end}")
        self.frame_end = at + 1 + (stop - start) + n  # (offsets count from the pickle's start, as `at` does)
        self.text8.append(at)

    def _string8(self, op: int, start: int, stop: int, at: int) -> None:
        """STRING, BINSTRING, SHORT_BINSTRING: noted, for `.py2_strings` to decode as torch does."""
        self.text8.append(at)
        self.stack.append(STR)

    def _pop_one(self, op: int, start: int, stop: int, at: int) -> None:
        if len(self.stack) > self.fence:
            self.stack.pop()
        elif self.marks:  # CPython's POP drops the innermost mark when nothing is above it
            self.fence = self.marks.pop()
        else:
            raise self._underflow(op, at)

    def _dup(self, op: int, start: int, stop: int, at: int) -> None:
        (tag,) = self._pop(1, op, at)
        self.stack += (tag, tag)

    def _put(self, op: int, start: int, stop: int, at: int) -> None:
        if op == OP["MEMOIZE"]:
            index = len(self.memo)
        elif op == OP["PUT"]:
            index = self._decimal(start, stop - 1, op, at)
        else:
            index = int.from_bytes(self.data[start:stop], "little")
        self._put_at(index, op, at)

    def _get(self, op: int, start: int, stop: int, at: int) -> None:
        if op == OP["GET"]:
            index = self._decimal(start, stop - 1, op, at)
        else:
            index = int.from_bytes(self.data[start:stop], "little")
        tag = self.memo.get(index)
        if tag is None:
            raise self._unset(index, op, at)
        self.stack.append(tag)

    def _decimal(self, start: int, stop: int, op: int, at: int) -> int:
        text = bytes(self.data[start:stop])
        if not 0 < len(text) <= 20 or not text.isdigit():
            raise self.fail(f"{OPCODE_NAMES[op]} at offset {at} has a malformed index {text[:24]!r}")
        return int(text)

    def _int(self, op: int, start: int, stop: int, at: int) -> None:
        """Protocol-0 INT/LONG and LONG1/LONG4: tag by size (a wide int's hash can be chosen)."""
        n = stop - start
        if op in (OP["INT"], OP["LONG"]):
            text = bytes(self.data[start:stop]).strip().rstrip(b"L")
            try:
                wide = len(text) > 24 or abs(int(text)) >= WIDE
            except ValueError:
                wide = False  # CPython refuses it
        else:
            wide = n > 8 or (n == 8 and abs(int.from_bytes(self.data[start:stop], "little", signed=True)) >= WIDE)
        self.stack.append(WEAK if wide else SAFE)

    def _build(self, op: int, start: int, stop: int, at: int) -> None:
        taken = self._pop(1, op, at)
        self._require_target(op, at)
        self._fill(taken, op, at)

    def _global(self, op: int, start: int, stop: int, at: int) -> None:
        module, name = bytes(self.data[start: stop - 1]).split(b"\n", 1)
        self.globals.append((module.decode("utf-8", "replace"), name.decode("utf-8", "replace")))
        if op == OP["INST"]:
            self._effect(op, at)
        else:
            self.stack.append(SAFE)

    def _stack_global(self, op: int, start: int, stop: int, at: int) -> None:
        tags = self._pop(2, op, at)
        if tags != [STR, STR]:
            self._refuse(UnsafePickleError(f"STACK_GLOBAL at offset {at} takes operands that are not strings; "
                                           "refused"))
        self.stack.append(SAFE)

    def _keys(self, op: int, start: int, stop: int, at: int) -> None:
        """SETITEM(S), DICT, ADDITEMS, FROZENSET, APPEND(S): police the keys they insert."""
        name = OPCODE_NAMES[op]
        if name == "SETITEM":
            taken = self._pop(2, op, at)
            self._count_keys(taken[:1])
            self._require_target(op, at)
            self._fill(taken, op, at)
        elif name == "APPEND":
            taken = self._pop(1, op, at)
            self._require_target(op, at)
            self._fill(taken, op, at)
        else:
            taken = self._pop_mark(op, at)
            keys = taken if name in ("ADDITEMS", "FROZENSET") else taken[0::2] if name in ("SETITEMS", "DICT") else []
            self._count_keys(keys)
            if name in ("DICT", "FROZENSET"):
                self.stack.append(self._nest(op, taken, SAFE if name == "DICT" else WEAK, at))
            else:  # APPENDS, SETITEMS, ADDITEMS act on the container below the mark
                self._require_target(op, at)
                self._fill(taken, op, at)

    def _require_target(self, op: int, at: int) -> None:
        if len(self.stack) <= self._fence():
            raise self._underflow(op, at)


def _find_newline(data: Any, start: int, end: int) -> int:
    if isinstance(data, (bytes, bytearray)):
        return data.find(b"\n", start, end)
    while start < end:  # a memoryview of the mapping: search it in bounded pieces
        piece = bytes(data[start: min(end, start + (1 << 16))])
        i = piece.find(b"\n")
        if i >= 0:
            return start + i
        start += len(piece)
    return -1


_HANDLERS: dict[int, Callable[..., None]] = {
    OP["MARK"]: _Lexer._mark,
    OP["PROTO"]: _Lexer._proto,
    OP["FRAME"]: _Lexer._frame,
    OP["STRING"]: _Lexer._string8, OP["BINSTRING"]: _Lexer._string8, OP["SHORT_BINSTRING"]: _Lexer._string8,
    OP["POP"]: _Lexer._pop_one,
    OP["DUP"]: _Lexer._dup,
    OP["PUT"]: _Lexer._put, OP["BINPUT"]: _Lexer._put, OP["LONG_BINPUT"]: _Lexer._put, OP["MEMOIZE"]: _Lexer._put,
    OP["GET"]: _Lexer._get, OP["BINGET"]: _Lexer._get, OP["LONG_BINGET"]: _Lexer._get,
    OP["INT"]: _Lexer._int, OP["LONG"]: _Lexer._int, OP["LONG1"]: _Lexer._int, OP["LONG4"]: _Lexer._int,
    OP["GLOBAL"]: _Lexer._global, OP["INST"]: _Lexer._global,
    OP["BUILD"]: _Lexer._build,
    OP["STACK_GLOBAL"]: _Lexer._stack_global,
    **{OP[n]: _Lexer._keys for n in ("SETITEM", "SETITEMS", "DICT", "ADDITEMS", "FROZENSET", "APPEND", "APPENDS")},
}


def prepass(data: Any, start: int = 0, end: int | None = None, *, path: str | None = None,
            what: str = "the pickle", limits: _limits.Limits | None = None) -> int:
    """Check the pickle at ``data[start:]``; return the offset just past its STOP opcode.

    `data` is anything indexable by int (bytes, a memoryview of the file mapping).

    Raises:
        CorruptFileError: malformed, truncated, or over a resource limit (`weightio.limits`: the
            current ones unless `limits` is given).
        UnsafePickleError: an opcode that builds objects outside the allowlist's view.
    """
    return lex(data, start, end, path=path, what=what, limits=limits).pos


def lex(data: Any, start: int = 0, end: int | None = None, *, path: str | None = None, what: str = "the pickle",
        collect: bool = False, limits: _limits.Limits | None = None) -> _Lexer:
    """Run the prepass; return the lexer (``.pos`` is just past STOP, ``.globals`` the GLOBAL and
    INST arguments). With `collect`, refused constructs are gathered in ``.refusals`` instead of
    raised (what `weightio.safety.scan` reports); resource and structure errors still raise."""
    def fail(message: str) -> CorruptFileError:
        return CorruptFileError(f"{what}: {message}", path=path)

    limits = limits or _limits.current()
    # a pickle is header: lexing stops at limits.header_bytes, so no newline search or argument length
    # runs through the data after it, however large the file
    stop = len(data) if end is None else end
    end = min(stop, start + limits.header_bytes)
    capped = end < stop
    if end != len(data):
        data = memoryview(data)[:end]  # the lexer relies on reads past the end failing
    lexer = _Lexer(data, start, len(data), fail, limits)
    refusals: list[WeightioError] = []
    if collect:
        lexer.refusals = refusals
    try:
        lexer.pos = lexer.run()
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{what}: {e.message}", path=path) from None
    except CorruptFileError as e:
        if not (capped and ("runs past the end" in e.message or "without a STOP" in e.message)):
            raise
        raise fail(f"no STOP opcode within its first {limits.header_bytes} bytes "
                   f"{_limits.hint('header_bytes')}") from None
    if collect:
        lexer.refusals = [e if isinstance(e, CorruptFileError) else UnsafePickleError(f"{what}: {e.message}", path=path)
                          for e in refusals]
    return lexer
