"""``mpsim collective``: predicted time and bus bandwidth of one collective, as nccl-tests prints it.

Example::

    mpsim collective --system dgx-h100 --op all-reduce --ranks 16 --nodes 2 --size 1MB..1GB

Sizes follow nccl-tests: the buffer of an all-reduce, the gathered size of an all-gather
or reduce-scatter, the send buffer of an all-to-all; a range ``A..B`` doubles from A to
B like ``all_reduce_perf -b A -e B -f 2``. ``algbw`` is size over time; ``busbw`` scales
it by the collective's factor (all-reduce ``2(n-1)/n``, the others ``(n-1)/n``) so it
compares with a link's bandwidth.

The group sits on ``--nodes`` consecutive nodes from ``--first-node`` (0 by default), every
device of them when ``--ranks`` is left out, and
is priced by the same functions as the simulator's collectives; the header says how many
fat-tree levels it climbs and the oversubscription its traffic between nodes feels. In a
simulation a group stands for all its copies and is priced as the slowest; with
``--first-node`` one copy can be priced where it sits (e.g. one that straddles two leaf
groups).
"""

from __future__ import annotations

import argparse

from mpsim.cli.common import add_csv_arg, csv_to_stdout, write_csv
from mpsim.errors import InputError, did_you_mean

FLOAT_BYTES = 4  # nccl-tests' default type


def parse_sizes(text: str) -> list[float]:
    """``64MB``, ``1MB,8MB`` or ``1MB..1GB`` (doubling) -> sizes in bytes."""
    from mpsim.units import parse_quantity

    def one(part: str) -> float:
        try:
            size = parse_quantity(part.strip(), "bytes")
        except ValueError as exc:
            raise InputError(str(exc), field="--size") from None
        if size <= 0:
            raise InputError(f"sizes must be positive, got {part.strip()!r}", field="--size")
        return size

    if ".." in text:
        low_text, high_text = text.split("..", 1)
        low, high = one(low_text), one(high_text)
        if high < low:
            raise InputError(f"range {text!r} ends below its start", field="--size")
        sizes = []
        size = low
        while size <= high * (1 + 1e-9):
            sizes.append(size)
            size *= 2
        return sizes
    return [one(part) for part in text.split(",") if part.strip()]


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor of ``kind`` on ``ranks`` ranks."""
    return 2 * (ranks - 1) / ranks if kind == "all-reduce" else (ranks - 1) / ranks


def _positive_int(text: str | None, flag: str) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"expected a whole number, got {text!r}", field=flag) from None
    if value <= 0:
        raise InputError(f"must be at least 1, got {value}", field=flag)
    return value


def _nonnegative_int(text: str | None, flag: str) -> int:
    if text is None:
        return 0
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"expected a whole number, got {text!r}", field=flag) from None
    if value < 0:
        raise InputError(f"must be 0 or more, got {value}", field=flag)
    return value


def _run(args: argparse.Namespace) -> int:
    from mpsim.cost.collectives import KINDS, algorithm_estimates, choose_algorithm
    from mpsim.cost.topology import place_ranks
    from mpsim.specs.catalog import load_system

    if args.op not in KINDS:
        hint = did_you_mean(args.op, list(KINDS)) or f"use one of {', '.join(KINDS)}"
        raise InputError(f"unknown collective {args.op!r}; {hint}", field="--op")
    try:
        system = load_system(args.system, args.overrides)
    except InputError as exc:
        # an unknown name says which option it came from; a problem inside the file names the file
        raise (InputError(exc.message, field="--system") if exc.file is None and exc.field is None else exc) from None
    per_node_max = system.devices_per_node
    given = _positive_int(args.nodes, "--nodes")
    # without --ranks, every device of the --nodes, as an nccl-tests run over whole nodes
    ranks = _positive_int(args.ranks, "--ranks") or (given or 0) * per_node_max
    if not ranks:
        raise InputError("give --ranks (the ranks in the group), --nodes (every device of that many nodes) "
                         "or both", field="--ranks")
    nodes = given or -(-ranks // per_node_max)
    if ranks % nodes:
        if given:
            raise InputError(f"{ranks} ranks do not split evenly over {nodes} nodes", field="--nodes")
        raise InputError(f"{ranks} ranks do not split evenly over the {nodes} {system.name} nodes of "
                         f"{per_node_max} devices that hold them; give a rank count that divides {per_node_max} or "
                         f"is a multiple of it, or --nodes", field="--ranks")
    per_node = ranks // nodes
    if per_node > per_node_max:
        raise InputError(f"{per_node} ranks per node, but a {system.name} node has {per_node_max} devices; "
                         f"use --nodes {-(-ranks // per_node_max)} or more", field="--nodes")
    first = _nonnegative_int(args.first_node, "--first-node")
    sizes = parse_sizes(args.size)
    members = [(first + node) * per_node_max + i for node in range(nodes) for i in range(per_node)]
    place = place_ranks(members, per_node_max)

    redop = "sum" if args.op in ("all-reduce", "reduce-scatter") else "none"
    rows = []
    for size in sizes:
        if args.algorithm:
            options = {e.algorithm: e for e in algorithm_estimates(args.op, size, place, system)}
            if args.algorithm not in options:
                raise InputError(f"{args.algorithm!r} does not apply here; available: {', '.join(options)}",
                                 field="--algorithm")
            estimate = options[args.algorithm]
        else:
            estimate = choose_algorithm(args.op, size, place, system)
        time_s = estimate.time_s
        algbw = size / time_s if time_s > 0 else 0.0  # one rank: nothing to do
        busbw = algbw * bus_factor(args.op, ranks) if ranks > 1 else 0.0
        rows.append({"size_bytes": size, "count_elements": size / FLOAT_BYTES, "type": "float", "redop": redop,
                     "time_s": time_s, "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": busbw,
                     "algorithm": estimate.algorithm, "protocol": estimate.protocol})
    if not csv_to_stdout(args):
        _print_table(args, system, ranks, nodes, per_node, first, place, rows)
    if args.csv:
        write_csv(args.csv, CSV_COLUMNS, rows)
    return 0


# ``--csv`` columns: the table's, in seconds and bytes per second (the table prints us and GB/s)
CSV_COLUMNS = ["size_bytes", "count_elements", "type", "redop", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s",
               "algorithm", "protocol"]


def _print_table(args: argparse.Namespace, system, ranks: int, nodes: int, per_node: int, first: int, place,
                 rows: list[dict]) -> None:
    """The nccl-tests style table: a header on where the group sits, then one line per size."""
    from mpsim.cost.collectives import levels_of, network_taper_of

    where = f" from node {first}" if first else ""
    print(f"# mpsim collective: {args.op} on {system.name}, {ranks} ranks on {nodes} node"
          f"{'s' if nodes > 1 else ''}{where} ({per_node} per node)")
    if nodes > 1:
        climbed = levels_of(place, system)
        levels = system.scale_out.levels
        crossed = ("one switch level joins all nodes" if climbed is None else
                   "inside one leaf group" if climbed == 0 else
                   f"crosses the uplinks of {', '.join(level.name for level in levels[:climbed])}")
        print(f"# network: {crossed}; oversubscription felt {network_taper_of(place, system):g}:1")
    print(f"# {'size':>12s} {'count':>12s} {'type':>6s} {'redop':>6s} {'time':>10s} {'algbw':>8s} {'busbw':>8s}  algorithm")
    print(f"# {'(B)':>12s} {'(elements)':>12s} {'':>6s} {'':>6s} {'(us)':>10s} {'(GB/s)':>8s} {'(GB/s)':>8s}")
    for row in rows:
        print(f"  {row['size_bytes']:12.0f} {row['count_elements']:12.0f} {row['type']:>6s} {row['redop']:>6s} "
              f"{row['time_s'] * 1e6:10.2f} {row['algbw_bytes_per_s'] / 1e9:8.2f} "
              f"{row['busbw_bytes_per_s'] / 1e9:8.2f}  {_algorithm_protocol(row)}")


def _algorithm_protocol(row: dict) -> str:
    """The algorithm, and NCCL's protocol where it is not Simple ("tree/LL"), as NCCL's logs write them."""
    return row["algorithm"] if row["protocol"] in ("Simple", "") else f"{row['algorithm']}/{row['protocol']}"


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``collective`` to the command parser."""
    parser = commands.add_parser("collective", help="predicted time and bus bandwidth of a collective (nccl-tests units)")
    system = parser.add_argument("--system", required=True, help="system name or file (see `mpsim list systems`)")
    from mpsim.cli.completion import names_completer

    system.completer = names_completer("system")  # type: ignore[attr-defined]
    parser.add_argument("--op", default="all-reduce", help="all-reduce, all-gather, reduce-scatter or all-to-all")
    parser.add_argument("--ranks", help="ranks in the group (default: every device of --nodes)")
    parser.add_argument("--nodes", help="nodes the ranks spread over (default: as few as fit --ranks)")
    parser.add_argument("--first-node", help="index of the first of those nodes on the network (default 0)")
    parser.add_argument("--size", default="1MB..1GB", help="size, list (a,b) or doubling range (a..b), e.g. 1MiB..1GiB")
    parser.add_argument("--algorithm", help="force an algorithm (ring, tree, nvls, ...) like NCCL_ALGO")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field of the system, e.g. --set scale_out.oversubscription=2")
    add_csv_arg(parser)
    parser.set_defaults(handler=_run)
