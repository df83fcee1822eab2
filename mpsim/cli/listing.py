"""``mpsim list KIND``: what the library ships, one line each, so a name can be found
without opening folders.

KIND is ``scenarios``, ``models``, ``systems`` or ``accelerators``. Each row is the name
a command takes (a model's, system's or accelerator's own ``name``; a scenario's file name,
its own name, a title, leading its description), the file, and its description, cut to
one line in the table; ``--json`` prints the same rows as a list of objects and ``--csv`` as CSV, both
with the whole description.
"""

from __future__ import annotations

import argparse
import json

from mpsim.cli.common import add_csv_arg, csv_to_stdout, write_csv
from mpsim.errors import InputError, did_you_mean

COLUMNS = ["name", "file", "description"]
# the table's description column is cut here (the JSON and CSV keep all of it)
DESCRIPTION_WIDTH = 90


def listing_rows(kind: str) -> list[dict[str, str]]:
    """The rows of ``mpsim list KIND``."""
    from mpsim.specs.shipped import LIST_FOLDERS, shipped_files

    if kind not in LIST_FOLDERS:
        hint = did_you_mean(kind, list(LIST_FOLDERS)) or f"use one of {', '.join(LIST_FOLDERS)}"
        raise InputError(f"unknown kind {kind!r}; {hint}", field="KIND")
    return [{"name": item.name, "file": item.file, "description": item.description} for item in shipped_files(kind)]


def one_line(text: str, width: int = DESCRIPTION_WIDTH) -> str:
    """The description cut at a word to at most ``width`` characters, '...' marking the cut
    (full stops are no guide: "et al." and "Sec. 3" are not the ends of sentences)."""
    if len(text) <= width:
        return text
    cut = text[:width - 3]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ,;:") + "..."


def _list(args: argparse.Namespace) -> int:
    from mpsim.explore.tables import render_table

    rows = listing_rows(args.kind)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not csv_to_stdout(args):
        body = [[row["name"], row["file"], one_line(row["description"])] for row in rows]
        print(render_table(COLUMNS, body, indent=""))
    if args.csv:
        write_csv(args.csv, COLUMNS, rows)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``list`` to the command parser."""
    from mpsim.specs.shipped import LIST_FOLDERS

    parser = commands.add_parser("list", help="list the shipped scenarios, models, systems or accelerators",
                                 description="List the shipped files of one kind: the name to use, the file and "
                                             "what it describes.")
    kind = parser.add_argument("kind", metavar="KIND", help=f"one of {', '.join(LIST_FOLDERS)}")
    kind.completer = lambda prefix, **_: [k for k in LIST_FOLDERS if k.startswith(prefix)]  # type: ignore[attr-defined]
    parser.add_argument("--json", action="store_true",
                        help="print a list of objects (name, file, whole description)")
    add_csv_arg(parser, "the rows (with the whole description)")
    parser.set_defaults(handler=_list)
