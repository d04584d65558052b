"""The prepass's fast path for the state-dict entry ``torch.save`` writes once per tensor.

`.lexer` walks a pickle opcode by opcode (~175 ns each); a state dict of 100k tensors is
~3.2 million opcodes, ~32 per entry, all alike:

    key       BINUNICODE name  PUT
    value     GET _rebuild_tensor_v2  MARK
              MARK GET 'storage' GET <dtype>Storage  BINUNICODE key  PUT  GET location  INT numel
              TUPLE PUT  BINPERSID
              INT offset  <size tuple> PUT  <stride tuple> PUT  NEWFALSE|NEWTRUE
              GET OrderedDict  EMPTY_TUPLE  REDUCE PUT
              TUPLE PUT  REDUCE PUT

(PUT: BINPUT or LONG_BINPUT; GET: BINGET or LONG_BINGET; INT: BININT1, BININT2 or BININT; a
size or stride tuple: EMPTY_TUPLE, or one to three INTs and TUPLE1-3, or MARK, 4-64 INTs and
TUPLE, each but the empty one memoized.) `run` recognises that opcode sequence with two regular
expressions per entry (the two strings' lengths are read in between) and applies what the
general loop would do to the lexer's state: the same memo writes with the same depth-and-tag
items, the same two items pushed, the same opcode count. It never raises: wherever the general
loop could fail inside an entry — a GET of an unwritten slot, a LONG_BINPUT index past the memo
slack, a MARK over the nesting limit, a tuple deeper than the depth limit, a stack over its
limit at a check, the opcode limit — or where a GET reads a slot written earlier in the same
entry, it stops before that entry and the general loop runs it, raising what it raises. So the
fast path accepts exactly what the general loop accepts, in the same state (a differential test,
`tests/formats/test_pytorch_fast_paths.py`, runs both on torch.save files and mutations of them).
"""

from __future__ import annotations

import re
import struct
from typing import Any

__all__ = ["PUTS", "run"]

PUTS = frozenset(b"qr")  # BINPUT, LONG_BINPUT: what follows an entry's key (the lexer's cheap gate)

_PUT = rb"(?:q(.)|r(.{4}))"
_GET = rb"(?:h(.)|j(.{4}))"
_INT = rb"(?:K.|M..|J.{4})"
# A size or stride: EMPTY_TUPLE, or a memoized tuple of ints (captured whole, with its PUT).
_SHAPE = (rb"(\)|(?:" + _INT + rb"\x85|" + _INT * 2 + rb"\x86|" + _INT * 3 + rb"\x87|\((?:" + _INT
          + rb"){4,64}t)" + _PUT + rb")")
# After the key: PUT, GET the rebuild function, MARK MARK, GET 'storage', GET the storage type,
# and the storage key's opcode and length (its text follows).
_REST1 = re.compile(_PUT + _GET + rb"\(\(" + _GET + _GET + rb"(?:X(.{4})|\x8c(.))", re.DOTALL)
# After the storage key: its PUT, GET location, numel, TUPLE PUT BINPERSID, offset, size, stride,
# requires_grad, OrderedDict() (PUT), TUPLE PUT REDUCE PUT.
_REST2 = re.compile(_PUT + _GET + _INT + rb"t" + _PUT + rb"Q" + _INT + _SHAPE + _SHAPE + rb"[\x88\x89]" + _GET
                    + rb"\)R" + _PUT + rb"t" + _PUT + rb"R" + _PUT, re.DOTALL)
_INTS = re.compile(_INT, re.DOTALL)
# The same with every PUT a LONG_BINPUT and every GET a BINGET, as in any entry after the 256th
# memo write: fixed layouts around the integers, read with one struct each.
_WIDE_SHAPE = (rb"(\)|(?:" + _INT + rb"\x85|" + _INT * 2 + rb"\x86|" + _INT * 3 + rb"\x87|\((?:" + _INT
               + rb"){4,64}t)r(.{4}))")
# One expression for the whole entry: torch's storage keys are decimal, so the storage key's text
# is matched too (its length is checked against the digits matched).
_WIDE = re.compile(rb"r.{4}h.\(\(h.h.X.\x00\x00\x00([0-9]+)r.{4}h." + _INT + rb"tr(.{4})Q" + _INT + _WIDE_SHAPE
                   + _WIDE_SHAPE + rb"[\x88\x89]h.\)Rr.{4}tr.{4}Rr.{4}", re.DOTALL)
_WIDE_HEAD = struct.Struct("<xIxBxxxBxBxB").unpack_from  # p1, g_fn, g_s, g_ty, the storage key's length
_WIDE2_HEAD = struct.Struct("<xIxB").unpack_from  # p2, g_loc
_WIDE2_TAIL = struct.Struct("<xxBxxxIxxIxxI")  # g_od, p4, p5, p6: the last 22 bytes
_U32 = struct.Struct("<I").unpack_from
_TUPLE_OPS = {0x85: 3, 0x86: 4, 0x87: 5}  # TUPLE1-3: their INTs, the opcode, its PUT
GROWTH = 2 * 64 + 16  # the most an entry adds to the stack at any point: its bound on the stack check
_FIXED_OPS = 23  # opcodes of an entry after its key, less those of its size and stride tuples


def _shape_ops(shape: bytes, short_put: bytes | None) -> int:
    """Opcodes of a size or stride tuple as matched: EMPTY_TUPLE, or INTs, the tuple opcode, its PUT."""
    if shape == b")":
        return 1
    core = len(shape) - (2 if short_put is not None else 5)  # the tuple opcode's end
    ops = _TUPLE_OPS.get(shape[core - 1])
    if ops is not None:
        return ops
    return len(_INTS.findall(shape, 1, core - 1)) + 3  # MARK, the INTs, TUPLE, PUT


def _generic(data: Any, pos: int) -> tuple | None:
    """One entry after its key, any PUT and GET form: (its end, puts, gets, opcodes) or None."""
    m = _REST1.match(data, pos)
    if m is None:
        return None
    p1a, p1b, fa, fb, sa, sb, ta, tb, xa, xb = m.groups()
    m2 = _REST2.match(data, m.end() + (_U32(xa)[0] if xa is not None else xb[0]))
    if m2 is None:
        return None
    (p2a, p2b, la, lb, p3a, p3b, shape, psa, psb, stride, pda, pdb,
     oa, ob, p4a, p4b, p5a, p5b, p6a, p6b) = m2.groups()
    u32 = _U32
    return (m2.end(),
            p1a[0] if p1a is not None else u32(p1b)[0], p2a[0] if p2a is not None else u32(p2b)[0],
            p3a[0] if p3a is not None else u32(p3b)[0],
            -1 if shape == b")" else psa[0] if psa is not None else u32(psb)[0],
            -1 if stride == b")" else pda[0] if pda is not None else u32(pdb)[0],
            p4a[0] if p4a is not None else u32(p4b)[0], p5a[0] if p5a is not None else u32(p5b)[0],
            p6a[0] if p6a is not None else u32(p6b)[0],
            fa[0] if fa is not None else u32(fb)[0], sa[0] if sa is not None else u32(sb)[0],
            ta[0] if ta is not None else u32(tb)[0], la[0] if la is not None else u32(lb)[0],
            oa[0] if oa is not None else u32(ob)[0],
            _FIXED_OPS + _shape_ops(shape, psa) + _shape_ops(stride, pda))


def _made(t_fn: int, t_s: int, t_ty: int, t_loc: int, t_od: int, sh: int, sd: int) -> tuple[int, int, int, int]:
    """The items an entry makes from the items its GETs read (and its size and stride: `sh`, `sd`),
    as the general loop makes them: (storage tuple, OrderedDict(), the arguments tuple, the tensor)."""
    storage = (max(t_s, t_ty, 0, t_loc, 1) | 3) + 3  # TUPLE of (storage, type, key, location, numel)
    od = (max(t_od, 1) | 3) - 1  # OrderedDict(): REDUCE of the class and an EMPTY_TUPLE
    args = (max((storage | 3) - 2, 1, sh, sd, od) | 3) + 3  # TUPLE of BINPERSID's storage, offset, ...
    return storage, od, args, (max(args, t_fn) | 3) - 1  # REDUCE


def run(data: Any, pos: int, budget: int, stack: list[int], memo: dict[int, int], puts: int, marks: int,
        max_marks: int, max_stack: int, deepest: int, slack: int) -> tuple[int, int, int]:
    """Apply the entries starting at `pos`, the first with its key already pushed; return (position,
    opcodes run, memo writes so far) after the last applied (opcodes run 0: none applied).

    `budget` is the opcodes left before the lexer's opcode limit; `marks` the open MARKs."""
    if marks + 2 > max_marks or deepest < 6:  # both MARKs of an entry, a tuple of ints: leave it to the loop
        return pos, 0, puts
    u32, tuple_ops, wide, head, head2, tail = (_U32, _TUPLE_OPS, _WIDE.match, _WIDE_HEAD, _WIDE2_HEAD,
                                              _WIDE2_TAIL.unpack_from)
    items: dict[tuple[int, ...], tuple[int, int, int, int]] = {}  # the GETs' items -> the items made
    ran = 0
    key = 0  # opcodes of the entry's key: the first one's is pushed already
    start = pos
    end = len(data)
    while True:
        m = wide(data, pos)
        if m is not None and len(m.group(1)) == (fields := head(data, pos))[4]:
            p1, g_fn, g_s, g_ty, n = fields
            p2, g_loc = head2(data, pos + 18 + n)
            after = m.end()
            g_od, p4, p5, p6 = tail(data, after - 22)
            _, p3b, shape, psb, stride, pdb = m.groups()
            p3 = u32(p3b)[0]
            p_sh = -1 if psb is None else u32(psb)[0]
            p_sd = -1 if pdb is None else u32(pdb)[0]
            ops = (_FIXED_OPS + (1 if psb is None else tuple_ops.get(shape[-6]) or _shape_ops(shape, None))
                   + (1 if pdb is None else tuple_ops.get(stride[-6]) or _shape_ops(stride, None)))
        else:
            entry = _generic(data, pos)
            if entry is None:
                break
            after, p1, p2, p3, p_sh, p_sd, p4, p5, p6, g_fn, g_s, g_ty, g_loc, g_od, ops = entry
        ops += key
        if ran + ops > budget or len(stack) + GROWTH > max_stack:
            break
        if p1 in (g_fn, g_s, g_ty, g_loc, g_od) or g_loc == p2 or g_od in (p2, p3, p_sh, p_sd):
            break  # a GET of a slot this entry wrote: the loop reads it in order
        t_fn, t_s, t_ty, t_loc, t_od = (memo.get(g_fn), memo.get(g_s), memo.get(g_ty), memo.get(g_loc),
                                        memo.get(g_od))
        if t_fn is None or t_s is None or t_ty is None or t_loc is None or t_od is None:
            break
        sh = 1 if p_sh < 0 else 6  # EMPTY_TUPLE, or a tuple of ints (SAFE items, one level down)
        sd = 1 if p_sd < 0 else 6
        made = items.get((t_fn, t_s, t_ty, t_loc, t_od, sh, sd))
        if made is None:
            made = items[t_fn, t_s, t_ty, t_loc, t_od, sh, sd] = _made(t_fn, t_s, t_ty, t_loc, t_od, sh, sd)
        storage, od, args, value = made
        limit = puts + slack
        if (storage > deepest or args > deepest or p1 > limit or p2 > limit or p3 > limit or p_sh > limit
                or p_sd > limit or p4 > limit or p5 > limit or p6 > limit):
            break  # the loop raises (a LONG_BINPUT index is checked against the writes before it: the
            #        largest against the writes before the entry is stricter)
        memo[p1] = 0
        memo[p2] = 0
        memo[p3] = storage
        puts += 6
        if p_sh >= 0:
            memo[p_sh] = sh
            puts += 1
        if p_sd >= 0:
            memo[p_sd] = sd
            puts += 1
        memo[p4] = od
        memo[p5] = args
        memo[p6] = value
        if key:
            stack.append(0)  # the key (a str)
        stack.append(value)
        ran += ops
        start = pos = after
        key = 1
        if pos + 5 > end:
            break
        op = data[pos]  # the next entry's key: BINUNICODE or SHORT_BINUNICODE
        if op == 0x58:
            pos += 5 + _U32(data, pos + 1)[0]
        elif op == 0x8C:
            pos += 2 + data[pos + 1]
        else:
            break
        if pos >= end or data[pos] not in PUTS:
            break
    return start, ran, puts
