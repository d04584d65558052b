"""The pickle opcode table, as data: each opcode's argument kind, how many stack items it pops
and what the lexer knows about the value it pushes (protocols 0-5, from `pickletools.opcodes`).

Opcodes are named from the `pickle` module's constants (``pickle.LONG_BINPUT`` is ``b"r"``): the
byte values below (`LONG_BINPUT`, `BINGET`, …) are those, as ints, for the lexers' inner loops.
"""

from __future__ import annotations

import pickle

from ... import limits as _limits

__all__ = ["MAX_MARKS", "MAX_OBJECT_DEPTH", "MAX_OPCODES", "MAX_STACK", "MAX_WEAK_KEYS", "MEMO_SLACK", "OPCODE_NAMES"]

# The defaults of weightio.limits (pickle_opcodes, pickle_stack, nesting_depth), under the names
# the lexer's documentation uses:
MAX_OPCODES = _limits.DEFAULTS.pickle_opcodes  # per pickle; a state dict needs ~30 per tensor
MAX_STACK = _limits.DEFAULTS.pickle_stack  # items on the stack at once; picklers batch 1000 per APPENDS/SETITEMS
MAX_MARKS = _limits.DEFAULTS.nesting_depth  # nested MARKs; one per level of nesting of the pickled object
MAX_WEAK_KEYS = 10_000  # colliding keys cost ~0.4 s at 10 000, 40 s at 100 000
MAX_OBJECT_DEPTH = 5_000  # objects nest no deeper, whatever limits.nesting_depth says: CPython hashes nested
#                            tuples by unchecked C recursion (5 000 levels hash on a 512 KiB thread stack)
MEMO_SLACK = 256  # BINPUT indices (0-255) are always allowed
WIDE = 2**61 - 1  # CPython hashes an int as int % (2**61 - 1): below this, distinct ints never collide

# ----------------------------------------------------------------------------- the opcode table

# Argument kinds: a fixed byte count, or
U1, U4, S4, U8 = -1, -4, -5, -8  # a little-endian length of 1, 4 (signed: S4) or 8 bytes, then data
LINE, LINES2 = -10, -11  # one / two newline-terminated lines
TO_MARK = -1  # "pops": everything above the innermost MARK, and the mark

# Result tags: what the prepass knows about a value, enough to police dict keys and STACK_GLOBAL.
# STR: a str. SAFE: hashes safely (small int, None, bytes, containers, stand-ins). WEAK: hash chosen by the file.
STR, SAFE, WEAK = 0, 1, 2
# The lexer's stack and memo hold one int per value: its nesting depth times LEVEL, plus its tag
# (tags are < LEVEL, so the largest of several items is also the deepest). A leaf has depth 0.
LEVEL = 4
TAG_BITS = LEVEL - 1

# (opcode, name, argument, pops, result tag or None), from the protocol (pickletools.opcodes).
TABLE: tuple[tuple[bytes, str, int, int, int | None], ...] = (
    (b"(", "MARK", 0, 0, None),
    (b".", "STOP", 0, 1, None),
    (b"0", "POP", 0, 1, None),
    (b"1", "POP_MARK", 0, TO_MARK, None),
    (b"2", "DUP", 0, 0, None),
    (b"F", "FLOAT", LINE, 0, WEAK),
    (b"I", "INT", LINE, 0, None),
    (b"J", "BININT", 4, 0, SAFE),
    (b"K", "BININT1", 1, 0, SAFE),
    (b"L", "LONG", LINE, 0, None),
    (b"M", "BININT2", 2, 0, SAFE),
    (b"N", "NONE", 0, 0, SAFE),
    (b"P", "PERSID", LINE, 0, SAFE),
    (b"Q", "BINPERSID", 0, 1, SAFE),
    (b"R", "REDUCE", 0, 2, WEAK),
    (b"S", "STRING", LINE, 0, STR),
    (b"T", "BINSTRING", S4, 0, STR),
    (b"U", "SHORT_BINSTRING", U1, 0, STR),
    (b"V", "UNICODE", LINE, 0, STR),
    (b"X", "BINUNICODE", U4, 0, STR),
    (b"a", "APPEND", 0, 2, None),
    (b"b", "BUILD", 0, 1, None),
    (b"c", "GLOBAL", LINES2, 0, SAFE),
    (b"d", "DICT", 0, TO_MARK, SAFE),
    (b"}", "EMPTY_DICT", 0, 0, SAFE),
    (b"e", "APPENDS", 0, TO_MARK, None),
    (b"g", "GET", LINE, 0, None),
    (b"h", "BINGET", 1, 0, None),
    (b"i", "INST", LINES2, TO_MARK, WEAK),
    (b"j", "LONG_BINGET", 4, 0, None),
    (b"l", "LIST", 0, TO_MARK, SAFE),
    (b"]", "EMPTY_LIST", 0, 0, SAFE),
    (b"o", "OBJ", 0, TO_MARK, WEAK),
    (b"p", "PUT", LINE, 0, None),
    (b"q", "BINPUT", 1, 0, None),
    (b"r", "LONG_BINPUT", 4, 0, None),
    (b"s", "SETITEM", 0, 2, None),
    (b"t", "TUPLE", 0, TO_MARK, WEAK),
    (b")", "EMPTY_TUPLE", 0, 0, SAFE),
    (b"u", "SETITEMS", 0, TO_MARK, None),
    (b"G", "BINFLOAT", 8, 0, WEAK),
    (b"\x80", "PROTO", 1, 0, None),
    (b"\x81", "NEWOBJ", 0, 2, WEAK),
    (b"\x82", "EXT1", 1, 0, WEAK),
    (b"\x83", "EXT2", 2, 0, WEAK),
    (b"\x84", "EXT4", 4, 0, WEAK),
    (b"\x85", "TUPLE1", 0, 1, WEAK),
    (b"\x86", "TUPLE2", 0, 2, WEAK),
    (b"\x87", "TUPLE3", 0, 3, WEAK),
    (b"\x88", "NEWTRUE", 0, 0, SAFE),
    (b"\x89", "NEWFALSE", 0, 0, SAFE),
    (b"\x8a", "LONG1", U1, 0, None),
    (b"\x8b", "LONG4", S4, 0, None),
    (b"B", "BINBYTES", U4, 0, SAFE),
    (b"C", "SHORT_BINBYTES", U1, 0, SAFE),
    (b"\x8c", "SHORT_BINUNICODE", U1, 0, STR),
    (b"\x8d", "BINUNICODE8", U8, 0, STR),
    (b"\x8e", "BINBYTES8", U8, 0, SAFE),
    (b"\x8f", "EMPTY_SET", 0, 0, SAFE),
    (b"\x90", "ADDITEMS", 0, TO_MARK, None),
    (b"\x91", "FROZENSET", 0, TO_MARK, WEAK),
    (b"\x92", "NEWOBJ_EX", 0, 3, WEAK),
    (b"\x93", "STACK_GLOBAL", 0, 2, SAFE),
    (b"\x94", "MEMOIZE", 0, 0, None),
    (b"\x95", "FRAME", 8, 0, None),
    (b"\x96", "BYTEARRAY8", U8, 0, SAFE),
    (b"\x97", "NEXT_BUFFER", 0, 0, SAFE),
    (b"\x98", "READONLY_BUFFER", 0, 1, SAFE),
)

OPCODE_NAMES = {code[0]: name for code, name, *_ in TABLE}
# Opcodes that build objects from a class without naming it in a GLOBAL the allowlist sees.
REFUSED_UNSAFE = frozenset(c for c, n in OPCODE_NAMES.items()
                           if n in ("INST", "OBJ", "EXT1", "EXT2", "EXT4", "NEWOBJ_EX"))
# How much deeper than its deepest operand an opcode's result is: 1 for the containers built
# from the items popped (TUPLE*, LIST, DICT, FROZENSET, and INST/OBJ, refused), 0 for results
# that hold their operands (a call's result, a persistent id's storage, a buffer).
NESTS = {c: 1 for c, n in OPCODE_NAMES.items()
         if n in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST", "DICT", "FROZENSET", "INST", "OBJ")}
NESTS.update({c: 0 for c, n in OPCODE_NAMES.items()
              if n in ("REDUCE", "NEWOBJ", "NEWOBJ_EX", "BINPERSID", "READONLY_BUFFER")})
# Opcodes a checkpoint has no use for and that need outside state (text ids, out-of-band buffers).
REFUSED_CORRUPT = frozenset(c for c, n in OPCODE_NAMES.items() if n in ("PERSID", "NEXT_BUFFER", "READONLY_BUFFER"))
REFUSED_WHY = {
    "PERSID": "text persistent ids; torch writes BINPERSID, and cannot load protocol-0 checkpoints either",
    "NEXT_BUFFER": "protocol-5 out-of-band buffers",
    "READONLY_BUFFER": "protocol-5 out-of-band buffers",
}

# Per-opcode arrays for the lexer's inner loop (index: opcode byte).
ARG: list[int | None] = [None] * 256
POPS = [0] * 256
TAG: list[int | None] = [None] * 256
for _code, _name, _arg, _pops, _tag in TABLE:
    ARG[_code[0]] = _arg
    POPS[_code[0]] = _pops
    TAG[_code[0]] = _tag

# Opcodes the lexer's inline paths handle from the table: a fixed-size argument, then push
# one tagged leaf (PUSH_ONLY).
PUSH_ONLY = frozenset(
    c for c, n in OPCODE_NAMES.items()
    if n in ("BININT", "BININT1", "BININT2", "NONE", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "BINFLOAT",
             "NEWTRUE", "NEWFALSE", "EMPTY_SET")
)
CALLS = frozenset(c for c, n in OPCODE_NAMES.items() if n in ("REDUCE", "NEWOBJ"))  # pop 2, push 1 no deeper
STEP = [1 + a if isinstance(a, int) and a >= 0 else 0 for a in ARG]  # opcode + fixed argument
CHUNK = 1024  # opcodes between checks of the stack size and opcode count (fewer under small limits)
OP = {name: code for code, name in OPCODE_NAMES.items()}

# The opcodes the lexer's inner loop tests one by one, as the ints indexing bytes gives.
MARK = pickle.MARK[0]
STOP = pickle.STOP[0]
POP = pickle.POP[0]
TUPLE = pickle.TUPLE[0]
PROTO = pickle.PROTO[0]
BINUNICODE = pickle.BINUNICODE[0]
SHORT_BINUNICODE = pickle.SHORT_BINUNICODE[0]
BINGET = pickle.BINGET[0]
LONG_BINGET = pickle.LONG_BINGET[0]
BINPUT = pickle.BINPUT[0]
LONG_BINPUT = pickle.LONG_BINPUT[0]
MEMOIZE = pickle.MEMOIZE[0]
TUPLE1 = pickle.TUPLE1[0]
TUPLE2 = pickle.TUPLE2[0]
TUPLE3 = pickle.TUPLE3[0]
BINPERSID = pickle.BINPERSID[0]
