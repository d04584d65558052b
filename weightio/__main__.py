"""``python -m weightio``: the same as the ``weightio`` command.

The command line is an entry point, not a layer of the library: this module is the one place in
the ``weightio`` package that imports it (tests/test_architecture.py), and nothing imports this.
"""

from .cli import main

main(prog_name="weightio")
