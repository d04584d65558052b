"""``python -m weightio.cli``: the same as the ``weightio`` command."""

from . import main

main(prog_name="weightio")
