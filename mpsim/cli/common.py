"""Arguments and helpers shared by several commands."""

from __future__ import annotations

import argparse


def add_scenario_args(parser: argparse.ArgumentParser) -> None:
    """The scenario positional argument and repeatable ``--set FIELD=VALUE``."""
    parser.add_argument("scenario", help="scenario file (or the name of a shipped one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any field, e.g. --set parallel.tp=4 (repeatable)")
