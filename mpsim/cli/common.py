"""Arguments and helpers shared by several commands."""

from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the problem and where to look, no usage block."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _count(text: str, least: int) -> int:
    from mpsim.specs.yamlio import MAX_INTEGER_DIGITS

    text = text.strip()
    if len(text.lstrip("+-")) > MAX_INTEGER_DIGITS:
        raise argparse.ArgumentTypeError(f"{text[:20]}... is out of range")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _count(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return _count(text, 0)


def sample_count(text: str) -> int:
    """An argparse type: draws of the step, 1 to the sampler's limit."""
    from mpsim.reliability.sampling import MAX_SAMPLES

    count = positive_int(text)
    if count > MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"at most {MAX_SAMPLES} samples, got {count}")
    return count


def token_count(text: str) -> float:
    """An argparse type: a positive, finite number of tokens (1e12 notation accepted)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens such as 15.6e12, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number of tokens, got {text!r}")
    return value


def add_scenario_args(parser: argparse.ArgumentParser) -> None:
    """The scenario positional argument and repeatable ``--set FIELD=VALUE``."""
    from mpsim.cli.completion import complete_scenario, complete_scenario_field

    scenario = parser.add_argument("scenario", help="scenario file (or the name of a shipped one; see mpsim list "
                                                     "scenarios)")
    scenario.completer = complete_scenario  # type: ignore[attr-defined]
    override = parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                                   help="override any field, e.g. --set parallel.tp=4 (repeatable)")
    override.completer = complete_scenario_field  # type: ignore[attr-defined]


def add_csv_arg(parser: argparse.ArgumentParser, what: str = "the table") -> None:
    """``--csv FILE``: the rows of the printed table, machine-readable (``-``: standard output,
    in place of the table)."""
    parser.add_argument("--csv", metavar="FILE",
                        help=f"also write {what} as CSV: plain numbers in seconds, bytes and fractions, the unit in "
                             "each column name (- prints it in place of the table)")


def csv_to_stdout(args: argparse.Namespace) -> bool:
    """Whether ``--csv -`` asked for the CSV on standard output in place of the table."""
    return getattr(args, "csv", None) == "-"


def write_csv(path: str, columns: list[str], rows: list[dict]) -> None:
    """Write ``rows`` (dicts keyed by ``columns``) as CSV to ``path`` (``-``: standard output).
    A missing value is an empty cell; floats keep every digit (``repr``), so the file
    round-trips to the numbers the JSON output holds."""
    import csv

    def cell(value):
        if value is None:
            return ""
        if isinstance(value, float):
            return repr(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        return value

    def write(stream) -> None:
        writer = csv.DictWriter(stream, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({name: cell(row.get(name)) for name in columns})

    if path == "-":
        write(sys.stdout)
        return
    with open(path, "w", newline="", encoding="utf-8") as stream:
        write(stream)
    print(f"CSV written to {path}", file=sys.stderr)


# namespace attribute -> (option as the user wrote it, a picture?) for every file a command writes
OUTPUT_OPTIONS = {
    "plot": ("--plot", True), "memory_plot": ("--memory-plot", True), "heatmap": ("--heatmap", True),
    "pareto": ("--pareto", True), "breakdown": ("--breakdown", True), "scaling": ("--scaling", True),
    "trace": ("--trace", False), "memory_snapshot": ("--memory-snapshot", False), "out": ("--out", False),
    "output": ("-o/--output", False), "csv": ("--csv", False), "report": ("--report", False),
    "distribution_plot": ("--distribution-plot", True), "goodput_plot": ("--goodput-plot", True),
}


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output a command could not write: a folder, a missing
    folder, an unwritable one, or a picture format matplotlib lacks."""
    from mpsim.errors import InputError
    from mpsim.paths import check_writable

    if getattr(args, "csv", None) == "-" and getattr(args, "json", False):
        raise InputError("--json prints to standard output already; give --csv a file name", field="--csv")
    for attribute, (option, picture) in OUTPUT_OPTIONS.items():
        value = getattr(args, attribute, None)
        if isinstance(value, str) and value != "-":
            check_writable(value, option, picture)


def schedule_list(text: str) -> list[str]:
    """``--schedules A,B,...``: names of registered schedules, at least one, each known; a typo
    is an error, not a silently smaller list."""
    from mpsim.errors import InputError
    from mpsim.schedules import unknown_schedule

    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise InputError("no schedule named; e.g. --schedules 1f1b,interleaved-1f1b", field="--schedules")
    if "" in parts:
        raise InputError(f"an empty name in {text!r}", field="--schedules")
    for name in parts:
        problem = unknown_schedule(name)
        if problem:
            raise InputError(problem, field="--schedules")
    return parts


def no_layout_exit(records: list) -> int:
    """Exit code of a plan or sweep with no layout that ran and fits: out of memory (3) when
    some layout was valid but too big; an input error (one line naming the commonest reason)
    when every one was invalid."""
    from collections import Counter

    from mpsim.errors import EXIT_OUT_OF_MEMORY, InputError

    done = [r for r in records if r is not None]
    if any(r["status"] != "invalid" for r in done) or not done:
        return EXIT_OUT_OF_MEMORY
    reason, count = Counter(r.get("error", "") for r in done).most_common(1)[0]
    raise InputError(f"all {len(done):,} points are invalid; the commonest reason ({count:,}): {reason}")


def resized_by_system(scenario_path: str, overrides: list[str], scenario) -> str | None:
    """A note for stderr when ``--set cluster.system=...`` changed how many devices the job has.

    A scenario that counts its cluster in nodes keeps the node count when the system is
    swapped, and a node of another system may hold another number of devices (a TPU slice
    of 512 chips against a server of 8 GPUs): the what-if then runs a job of another size,
    which the summary shows but nothing points out.
    """
    swapped = [o for o in overrides if o.replace(" ", "").startswith("cluster.system=")]
    cluster = scenario.cluster
    if not swapped or cluster.num_devices is not None or cluster.parts is not None:
        return None
    from mpsim.specs import load_scenario

    try:
        before = load_scenario(scenario_path, [o for o in overrides if o not in swapped]).scenario.cluster
    except Exception:  # noqa: BLE001 - the note is a courtesy; the run reports any real error itself
        return None
    if before.devices == cluster.devices:
        return None
    return (f"note: {cluster.nodes} node(s) of {cluster.system.name} are {cluster.devices:,} devices "
            f"({cluster.system.devices_per_node} per node), where the scenario's {before.system.name} gave "
            f"{before.devices:,}; to keep {before.devices:,}, add --set cluster.nodes=null "
            f"--set cluster.num_devices={before.devices}")


def check_profile_path(path: str | None, option: str) -> None:
    """A calibration profile's file name: .yaml, .yml or .json, the names a scenario's
    ``calibration:`` reads as a file (another would be taken for the name of a shipped one)."""
    from pathlib import Path

    from mpsim.errors import InputError

    if path is not None and Path(path).suffix.lower() not in (".yaml", ".yml", ".json"):
        raise InputError(f"{path!r}: a calibration profile is written as .yaml or .json, the files a scenario's "
                         f"calibration: field reads", option)
