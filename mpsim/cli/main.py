"""The ``mpsim`` entry point: builds the parser from the command modules and runs one."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from typing import Sequence

from mpsim.cli.common import Parser, check_output_paths
from mpsim.errors import EXIT_INPUT_ERROR, EXIT_INTERRUPTED, InputError

# one module per subcommand, each with register(commands)
COMMAND_MODULES = ["mpsim.cli.run", "mpsim.cli.report", "mpsim.cli.compare", "mpsim.cli.schedule", "mpsim.cli.hardware", "mpsim.cli.collective", "mpsim.cli.sweep", "mpsim.cli.plan", "mpsim.cli.calibrate", "mpsim.cli.validate", "mpsim.cli.import_torch", "mpsim.cli.listing", "mpsim.cli.trace"]


def build_parser() -> argparse.ArgumentParser:
    """The ``mpsim`` argument parser."""
    parser = Parser(prog="mpsim", description="Simulate model-parallel training before you run it.")
    parser.add_argument("--version", action="version", version=f"mpsim {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


def version() -> str:
    """The running code's version (``mpsim.__version__``; the installed metadata may lag an
    editable checkout)."""
    import mpsim

    return mpsim.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mpsim`` console script."""
    from mpsim.cli.completion import enable

    parser = build_parser()
    enable(parser)
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminate) if _main_thread() else None
    try:
        check_output_paths(args)
        return args.handler(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM outside the commands that save their progress
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate(signum, frame) -> None:
    """SIGTERM stops a command the way Ctrl-C does: sweeps and plans keep every finished
    point, stop their workers and exit; nothing is left running."""
    raise KeyboardInterrupt


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
