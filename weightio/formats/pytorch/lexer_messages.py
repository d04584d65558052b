"""The prepass lexer's error messages (`.lexer`): each names the opcode, its offset, and the
limit or rule it breaks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ... import limits as _limits
from .opcodes import MAX_OBJECT_DEPTH, OPCODE_NAMES

if TYPE_CHECKING:
    from ...errors import WeightioError

__all__ = ["Messages"]


class Messages:
    """What `.lexer._Lexer` raises, built from its state (memo writes so far, its limits)."""

    fail: Callable[[str], WeightioError]
    puts: int
    max_opcodes: int
    max_stack: int
    max_marks: int
    max_depth: int

    def _memo_bomb(self, index: int, op: int, at: int) -> Exception:
        return self.fail(f"{OPCODE_NAMES[op]} at offset {at} writes memo slot {index:,} after only {self.puts:,} "
                         "memo writes (a memory bomb: CPython sizes its memo array by the largest index)")

    def _overrun(self, op: int, at: int, n: int, remaining: int) -> Exception:
        return self.fail(f"{OPCODE_NAMES[op]} at offset {at} claims {n:,} bytes but only {max(remaining, 0):,} remain")

    def _underflow(self, op: int, at: int) -> Exception:
        return self.fail(f"{OPCODE_NAMES[op]} at offset {at} pops more than the stack holds")

    def _truncated(self, op: int, at: int) -> Exception:
        return self.fail(f"{OPCODE_NAMES[op]} at offset {at} runs past the end of the pickle")

    def _limits(self, ops: int) -> Exception:
        if ops > self.max_opcodes:
            return self.fail(f"more than {self.max_opcodes:,} opcodes in one pickle {_limits.hint('pickle_opcodes')}")
        return self.fail(f"more than {self.max_stack:,} items on the pickle stack {_limits.hint('pickle_stack')}")

    def _too_nested(self, op: int, at: int) -> Exception:
        why = _limits.hint("nesting_depth") if self.max_depth < MAX_OBJECT_DEPTH else \
            "(no pickle may nest deeper: CPython would hash or compare it by unchecked C recursion)"
        return self.fail(f"the pickled object nests deeper than {self.max_depth:,} levels ({OPCODE_NAMES[op]} at "
                         f"offset {at}) {why}")

    def _too_deep(self, at: int) -> Exception:
        return self.fail(f"more than {self.max_marks:,} nested MARKs (offset {at}) {_limits.hint('nesting_depth')}")

    def _unset(self, index: int, op: int, at: int) -> Exception:
        return self.fail(f"{OPCODE_NAMES[op]} at offset {at} reads memo slot {index:,}, which was never written")
