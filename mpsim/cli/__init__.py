"""Command line: argument parsing and printing only; the work happens in the library.

Each subcommand lives in its own module with ``register(commands)`` that adds its
parser and handler; ``main.py`` lists the modules.
"""

from mpsim.cli.main import main

__all__ = ["main"]
