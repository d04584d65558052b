"""PyTorch checkpoints (``torch.save``) without torch: the reader and the layers beneath it.

* `reader` — `PyTorchReader`; its module docstring is the format spec.
* `containers` — the zip, legacy raw-pickle and tar layouts; `stored_pickles.pickles` lists the
  pickles a file holds (for `weightio scan`).
* `lexer`, `opcodes` — the pickle prepass; `unpickler` — the allowlist unpickler;
  `allowlist` — the table of globals and the stand-ins they become (`rebuilds`: torch's
  rebuild functions; `refs`: the tensor and storage records they build, and `short_repr`);
  `inert` — the immutable kinds of object they are; `flatten` — nested objects to dotted names.
* `tar` — the strict tar walker of torch 0.1.x files.
"""

from .containers import MAGIC_NUMBER, PROTOCOL_VERSION, open_container
from .reader import PyTorchReader

__all__ = ["MAGIC_NUMBER", "PROTOCOL_VERSION", "PyTorchReader", "open_container"]
