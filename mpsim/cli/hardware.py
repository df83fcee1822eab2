"""``mpsim hardware list`` and ``mpsim hardware show NAME``: the hardware library.

``list`` prints one line per accelerator and per system; ``show`` prints every number of
one of them with its unit, what it means for a collective (achieved bandwidth per link
level, the algorithm NCCL or the TPU runtime would use), and the file it came from, whose
comments give the source of each number.
"""

from __future__ import annotations

import argparse
import re

from mpsim.cli.common import add_csv_arg
from mpsim.errors import InputError, did_you_mean


def _gb(bytes_per_s: float) -> str:
    value = bytes_per_s / 1e9
    return f"{value:.0f} GB/s" if value >= 10 else f"{value:.2g} GB/s"


def _tflops(flops: float) -> str:
    return f"{flops / 1e12:g} TFLOP/s"


def _sweep_rates(sweep, seq: int) -> str:
    """A fused attention sweep's rates at ``seq`` tokens, in words."""
    def rate(backward: bool, causal: bool, fp8: bool = False) -> str:
        return _tflops(round(sweep.rate(seq, backward, causal, fp8=fp8), -11))

    if sweep.covers(False):
        text = f"forward {rate(False, False)} ({rate(False, True)} causal), backward {rate(True, False)}"
    else:
        text = f"causal mask only (unmasked calls at the fractions above): forward {rate(False, True)}, backward " \
               f"{rate(True, True)}"
    if sweep.fp8 is not None:
        text += f"; fp8 inputs, causal: forward {rate(False, True, True)}, backward {rate(True, True, True)}"
    return text


def _provenance(sweep) -> str | None:
    """Which of a sweep's points this part measured, in words; None where it measured them all."""
    blocks = [(f"heads of {sweep.head_dim}", sweep),
              *((f"heads of {other.head_dim}", other) for other in sweep.other_head_dims),
              *((("fp8 inputs", sweep.fp8),) if sweep.fp8 is not None else ())]
    if all(block.measured_lengths is None for _, block in blocks):
        return None
    if all(block.measured_lengths == () for _, block in blocks):
        return "not measured on this part: every rate inferred (the file's comments say from what)"
    words = []
    for name, block in blocks:
        measured = block.measured_lengths
        if measured is None:
            words.append(f"{name} at every length")
        elif not measured:
            words.append(f"{name} inferred")
        else:
            *rest, last = [f"{length:,}" for length in measured]
            words.append(f"{name} at {', '.join(rest) + ' and ' if rest else ''}{last} tokens only")
    return "measured on this part: " + ", ".join(words) + " (the file's comments say how the rest is inferred)"


def _accelerator_lines(acc) -> list[str]:
    from mpsim.units import format_bytes, format_seconds

    eff = acc.efficiency
    peaks = ", ".join(f"{dtype} {_tflops(value)}" for dtype, value in acc.peak_flops.items())
    fp8 = f" (fp8 {eff.gemm_fp8:.1%})" if eff.gemm_fp8 is not None else ""
    lines = [
        f"accelerator   {acc.name} ({acc.vendor}) - {acc.description.strip()}",
        f"peak (dense)  {peaks}",
        f"memory        {format_bytes(acc.memory.capacity)} at {_gb(acc.memory.bandwidth)}",
        f"compute units {acc.compute_units} (GEMM output tile {eff.gemm_tile[0]} x {eff.gemm_tile[1]})",
        f"efficiency    GEMM {eff.gemm:.1%}{fp8}, HBM {eff.memory:.0%}, attention forward "
        f"{eff.attention_forward:.0%} / backward {eff.attention_backward:.0%}"
        f"{' (where no sweep below applies)' if eff.attention_sweep is not None else ''}, kernel overhead "
        f"{format_seconds(eff.kernel_overhead)}",
    ]
    for index, sweep in enumerate(eff.attention_kernels()):
        heads = sorted([sweep.head_dim, *(other.head_dim for other in sweep.other_head_dims)])
        lengths = f"{sweep.seq_lengths[0]:,}-{sweep.seq_lengths[-1]:,} tokens"
        at = 8192 if sweep.seq_lengths[0] <= 8192 <= sweep.seq_lengths[-1] else sweep.seq_lengths[-1]
        picked = "the default" if index == 0 else "when picked"
        name = f" [training.attention_kernel: {sweep.id}, {picked}]" if sweep.id else ""
        rates = _sweep_rates(sweep, at)
        lines.append(f"{'attention' if index == 0 else '':<13} {sweep.kernel}{name}, rated over {lengths} at heads "
                     f"of {', '.join(map(str, heads))}; at {at:,} tokens, heads of {sweep.head_dim}: {rates}")
        provenance = _provenance(sweep)
        if provenance:
            lines.append(f"{'':<13} {provenance}")
    factors = (("GEMMs", eff.sustained_compute), ("fp8 GEMMs", eff.sustained_compute_fp8),
               ("attention", eff.sustained_attention))
    held = [(name, value) for name, value in factors if value is not None]
    if any(value < 1.0 for _, value in held):
        lines.append("under load    at the power limit, of the short-benchmark rate: "
                     + ", ".join(f"{name} {value:.1%}" for name, value in held))
    return lines


def _system_lines(system) -> list[str]:
    from mpsim.cost.collectives import choose_algorithm
    from mpsim.cost.topology import place_ranks
    from mpsim.units import format_bytes, format_seconds

    up, out = system.scale_up, system.scale_out
    lines = [f"system        {system.name} - {' '.join(system.description.split())}",
             f"node          {system.devices_per_node} x {system.accelerator.name}"]
    fabric = f"scale-up      {up.name or up.topology}: {up.topology}, {_gb(up.bandwidth_per_device)} per device per " \
             f"direction"
    if up.links_per_device:
        fabric += f" over {up.links_per_device} links of {_gb(up.link_bandwidth)}"
    lines.append(fabric)
    lines.append(f"              achieved {up.efficiency:.1%} on large messages, {format_seconds(up.step_latency)} per "
                 f"step; curve n_1/2 {format_bytes(up.half_bandwidth_bytes)}, exponent {up.curve_exponent:g}")
    if up.topology != "torus":  # a TPU slice runs its own collectives (cost/torus.py)
        protocols = (f"NCCL's Simple and LL protocols, the node priced as {up.nccl_link.upper()}" if up.nccl_link
                     else "NCCL's algorithms in its Simple protocol only")
        lines.append(f"collectives   {protocols} (scale_up.nccl_link)")
    if up.torus is not None:
        wraps = ", ".join("wraps" if up.torus.wraps(axis) else "open" for axis in range(len(up.torus.dims)))
        lines.append(f"torus         {' x '.join(str(d) for d in up.torus.dims)} ({wraps})")
    if up.in_switch_reduction is not None:
        nvls = up.in_switch_reduction
        lines.append(f"in-switch     reduction (NVLS) from {nvls.min_devices} devices: {nvls.efficiency:.1%} of the link "
                     f"rate, {format_seconds(nvls.latency)}; curve n_1/2 {format_bytes(nvls.half_bandwidth_bytes)}, "
                     f"exponent {nvls.curve_exponent:g}")
    per_device = out.nic_bandwidth * out.nics_per_node / system.devices_per_node
    lines.append(f"scale-out     {out.name or out.topology}: {out.topology}, {out.nics_per_node} x "
                 f"{out.nic_bandwidth * 8 / 1e9:g} Gb/s per node = {_gb(per_device)} per device, achieved "
                 f"{out.efficiency:.0%}, {format_seconds(out.step_latency)} per step")
    for index, level in enumerate(out.levels):
        joins = f"{level.nodes} nodes" if level.nodes else "all nodes"
        lines.append(f"  level       {level.name}: joins {joins}, oversubscription {out.level_oversubscription(index):g}:1")
    if not out.levels:
        lines.append(f"  levels      one switch level, oversubscription {out.oversubscription:g}:1")
    lines.append(f"latency       {format_seconds(system.collective_base_latency)} per collective call; "
                 f"{system.collective_channels} SMs held by a running collective")
    # the devices of one node; with one device per node, the smallest group that has a peer: two nodes
    n = max(2, system.devices_per_node)
    where = "one node" if system.devices_per_node > 1 else "two nodes (one device each)"
    group = place_ranks(list(range(n)), system.devices_per_node)
    size = 2**30
    estimate = choose_algorithm("all-reduce", size, group, system)
    busbw = size / estimate.time_s * 2 * (n - 1) / n
    lines.append(f"all-reduce    1 GiB over {where}: {format_seconds(estimate.time_s)}, busbw {_gb(busbw)} "
                 f"({estimate.algorithm})")
    return lines


# ``--csv`` columns: accelerator rows fill the first group, system rows the second (and name
# their accelerator); the numbers are the ones the two printed tables show, in plain units
CSV_COLUMNS = ["kind", "name", "vendor", "peak_flops_per_s", "memory_bytes", "memory_bandwidth_bytes_per_s",
               "gemm_efficiency", "accelerator", "devices_per_node", "scale_up", "scale_up_bytes_per_s",
               "scale_out_bytes_per_s_per_device"]


def accelerator_rows() -> list[dict]:
    """One row per accelerator: its dense bf16 (else fp16, else best) peak, memory and GEMM efficiency."""
    from mpsim.specs.catalog import accelerator_names, load_accelerator

    rows = []
    for name in accelerator_names():
        acc = load_accelerator(name)
        peak = acc.peak_flops.get("bf16") or acc.peak_flops.get("fp16") or max(acc.peak_flops.values())
        rows.append({"kind": "accelerator", "name": acc.name, "vendor": acc.vendor, "peak_flops_per_s": peak,
                     "memory_bytes": acc.memory.capacity, "memory_bandwidth_bytes_per_s": acc.memory.bandwidth,
                     "gemm_efficiency": acc.efficiency.gemm})
    return rows


def system_rows() -> list[dict]:
    """One row per system: its node, scale-up fabric and scale-out bandwidth per device."""
    from mpsim.specs.catalog import load_system, system_names

    rows = []
    for name in system_names():
        system = load_system(name)
        up, out = system.scale_up, system.scale_out
        extra = " +NVLS" if up.in_switch_reduction else ""
        if up.torus is not None:
            extra = " " + "x".join(str(d) for d in up.torus.dims)
        share = out.nic_bandwidth * out.nics_per_node / system.devices_per_node
        alone = system.devices_per_node == 1  # no peer in the node: its scale-up fabric carries nothing
        rows.append({"kind": "system", "name": system.name, "accelerator": system.accelerator.name,
                     "devices_per_node": system.devices_per_node, "scale_up": "none" if alone else up.topology + extra,
                     "scale_up_bytes_per_s": 0.0 if alone else up.bandwidth_per_device,
                     "scale_out_bytes_per_s_per_device": share})
    return rows


def _list(args: argparse.Namespace) -> int:
    from mpsim.cli.common import csv_to_stdout, write_csv

    accelerators, systems = accelerator_rows(), system_rows()
    if not csv_to_stdout(args):
        print(f"{'accelerator':18s} {'vendor':8s} {'bf16/fp16':>15s} {'memory':>9s} {'HBM':>10s} {'GEMM eff':>9s}")
        for row in accelerators:
            print(f"{row['name']:18s} {row['vendor']:8s} {_tflops(row['peak_flops_per_s']):>15s} "
                  f"{row['memory_bytes'] / 2**30:5.0f} GiB {_gb(row['memory_bandwidth_bytes_per_s']):>10s} "
                  f"{row['gemm_efficiency']:9.1%}")
        print()
        print(f"{'system':18s} {'accelerator':16s} {'per node':>8s} {'scale-up':>30s} {'scale-out per device':>22s}")
        for row in systems:
            up = row['scale_up'] + (' ' + _gb(row['scale_up_bytes_per_s']) if row['scale_up_bytes_per_s'] else '')
            print(f"{row['name']:18s} {row['accelerator']:16s} {row['devices_per_node']:8d} {up:>30s} "
                  f"{_gb(row['scale_out_bytes_per_s_per_device']):>22s}")
    if args.csv:
        write_csv(args.csv, CSV_COLUMNS, accelerators + systems)
    return 0


def _is_accelerator_file(path) -> bool:
    """Whether a hardware file describes an accelerator (its peak FLOP/s) rather than a system."""
    from mpsim.specs.yamlio import read_yaml

    tree = read_yaml(path)
    return isinstance(tree, dict) and "peak_flops" in tree and "accelerator" not in tree


# a ``key: value  # comment`` line of a hardware file (a list item's first key too)
_KEYED_LINE = re.compile(r"^(\s*)(- )?([A-Za-z_]\w*):([^#]*)(#.*)?$")
# where a file's attention sweeps sit: their points' provenance has a line of its own
_SWEEP_KEYS = ("attention_sweep", "other_attention_kernels")


def inferred_fields(text: str) -> list[str]:
    """The fields of a hardware file whose comment calls them inferred (derived, not read off a
    source), by their dotted path; the attention sweeps' points left to ``measured_lengths``."""
    open_keys: list[tuple[int, str]] = []  # the mappings and lists the current line sits in
    found = []
    for line in text.splitlines():
        match = _KEYED_LINE.match(line)
        if match is None:
            continue
        indent = len(match.group(1)) + (2 if match.group(2) else 0)
        while open_keys and open_keys[-1][0] >= indent:
            open_keys.pop()
        path = [key for _, key in open_keys] + [match.group(3)]
        if not match.group(4).strip():
            open_keys.append((indent, match.group(3)))
        comment = (match.group(5) or "#")[1:].strip().lower()
        if comment.startswith("inferred") and not any(key in path for key in _SWEEP_KEYS):
            found.append(".".join(path))
    return found


def _inferred_lines(*paths) -> list[str]:
    """``hardware show``'s lines naming each file's inferred fields (none for a file without any,
    or a path that is None: an accelerator described outside the library)."""
    from mpsim.paths import display_path

    lines = []
    for path in paths:
        fields = inferred_fields(path.read_text(encoding="utf-8")) if path is not None else []
        if fields:
            lines.append(f"inferred      in {display_path(path)}: {', '.join(fields)} (derived from other figures, "
                         f"as each comment says)")
    return lines


def _file_line(path) -> str:
    """The closing line of ``hardware show``: the file, whose comments source its numbers."""
    from mpsim.paths import display_path

    return f"\nfile          {display_path(path)} (the source of every number, measured or inferred, in its comments)"


def _show(args: argparse.Namespace) -> int:
    from mpsim.specs.catalog import accelerator_file, load_accelerator, load_system, system_file

    try:
        path = system_file(args.name)
    except InputError:
        path = None
    if path is not None and path.is_file() and _is_accelerator_file(path):
        path = None  # a path to an accelerator file: shown below
    if path is not None:
        system = load_system(args.name)
        print("\n".join(_system_lines(system)))
        print()
        print("\n".join(_accelerator_lines(system.accelerator)))
        for line in _inferred_lines(path, _accelerator_path(system.accelerator.name)):
            print(line)
        print(_file_line(path))
        return 0
    try:
        path = accelerator_file(args.name)
    except InputError:
        from mpsim.paths import normalize_name
        from mpsim.specs.catalog import accelerator_names, system_names

        known = system_names() + accelerator_names()
        hint = did_you_mean(normalize_name(args.name), known) or "see `mpsim hardware list`"
        raise InputError(f"no system or accelerator named {args.name!r}; {hint}", field="NAME") from None
    print("\n".join(_accelerator_lines(load_accelerator(args.name))))
    for line in _inferred_lines(path):
        print(line)
    print(_file_line(path))
    return 0


def _accelerator_path(name: str):
    """The library file of the accelerator a system names (None for one described elsewhere)."""
    from mpsim.specs.catalog import accelerator_file

    try:
        path = accelerator_file(name)
    except InputError:
        return None
    return path if path.is_file() else None


def _complete_hardware(prefix: str, **_) -> list[str]:
    from mpsim.cli.completion import names_completer

    return names_completer("system")(prefix) + names_completer("accelerator")(prefix)


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``hardware list`` and ``hardware show`` to the command parser."""
    hardware = commands.add_parser("hardware", help="list or show the accelerators and systems of the hardware library")
    actions = hardware.add_subparsers(dest="hardware_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="one line per accelerator and system")
    add_csv_arg(listing, "both tables as one (a kind column says which)")
    listing.set_defaults(handler=_list)
    show = actions.add_parser("show", help="every number of one accelerator or system")
    name = show.add_argument("name", metavar="NAME", help="accelerator or system name (or file)")
    name.completer = _complete_hardware  # type: ignore[attr-defined]
    show.set_defaults(handler=_show)
