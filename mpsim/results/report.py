"""The summary printed by ``mpsim run``, and the same as one JSON object."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from mpsim.results.memory import TIGHT_FIT_ADVICE, tight_fit
from mpsim.results.metrics import Summary
from mpsim.units import format_bytes, format_need, format_seconds

JSON_SCHEMA_VERSION = 1


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "-"


def stage_list(stages: tuple[int, ...], width: int = 12) -> str:
    """A rank's stages in ``width`` characters: all of them, or a run with a fixed step as its
    first two and its last (``0,16..112``), or as many whole numbers as fit and ``..``."""
    text = ",".join(map(str, stages))
    if len(text) <= width:
        return text
    step = stages[1] - stages[0]
    if all(b - a == step for a, b in zip(stages, stages[1:])):
        text = f"{stages[0]},{stages[1]}..{stages[-1]}"
        if len(text) <= width:
            return text
    kept = ""
    for number in map(str, stages):
        if len(kept) + len(number) + 3 > width:  # room for the comma and the ".."
            break
        kept += ("," if kept else "") + number
    return kept + ".."


def _memory_rows(summary: Summary) -> list[str]:
    memory = summary.memory
    shown = list(range(len(memory)))
    if len(memory) > 12:
        worst = max(range(len(memory)), key=lambda r: memory[r].peak_memory_bytes)
        shown = sorted({0, 1, len(memory) - 2, len(memory) - 1, worst})
    # a split backward (zero-bubble schedules) can peak with no forward in flight: the column
    # "held for W" shows the activations peak's part that deferred weight-gradient passes hold
    split = any(m.weight_grad_held_bytes > 0 for m in memory)
    held_for_w = lambda text: f" {text:>11}" if split else ""  # noqa: E731
    header = f"    {'rank':>4}  {'stages':<12} {'weights':>11} {'grads':>11} {'optimizer':>11} " \
             f"{'activations':>11} {'in flight':>9}{held_for_w('held for W')} {'buffers':>11} {'reserved':>10} " \
             f"{'fragment.':>10} {'total':>11}"
    rows = [header]
    previous = -1
    for r in shown:
        if r != previous + 1:
            rows.append("    ...")
        m = memory[r]
        stages = stage_list(m.stages)
        flag = "" if m.fits else f"  OUT OF MEMORY (largest: {m.largest_category})"
        rows.append(f"    {m.rank:>4}  {stages:<12} {format_bytes(m.weights_bytes):>11} {format_bytes(m.grads_bytes):>11} "
                    f"{format_bytes(m.optimizer_bytes):>11} {format_bytes(m.activations_peak_bytes):>11} "
                    f"{m.peak_in_flight:>9}{held_for_w(format_bytes(m.weight_grad_held_bytes))} "
                    f"{format_bytes(m.buffers_bytes):>11} "
                    f"{format_bytes(m.reserved_bytes):>10} {format_bytes(m.fragmentation_bytes):>10} "
                    f"{format_bytes(m.peak_memory_bytes):>11}{flag}")
        previous = r
    # a cluster of parts reserves per rank what its own part's devices and channels do
    ranks_of: dict[tuple, list[int]] = {}
    for m in memory:
        if m.reserved_parts:
            ranks_of.setdefault(tuple(m.reserved_parts), []).append(m.rank)
    for parts, ranks in ranks_of.items():
        which = "" if len(ranks_of) == 1 else f", rank{'s' if len(ranks) > 1 else ''} {stage_list(ranks)}"
        rows.append(f"    reserved per device{which}: " + " + ".join(f"{name} {format_bytes(size)}" for name, size in parts))
    return rows


def format_split(counts: tuple[int, ...] | list[int]) -> str:
    """Layers per stage with runs folded: ``5, 4 x 22, 5``."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ", ".join(f"{count} x {times}" if times > 2 else ", ".join([str(count)] * times) for count, times in runs)


def _rate(value: float) -> str:
    """A rate with three significant digits at least: 12,345 or 2.41 (images/s of a large model are small)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _throughput(s: Summary) -> str:
    """Throughput in the model's unit (results/throughput.py): tokens/s, images/s, samples/s, audio seconds/s."""
    devices = max(1, s.devices)
    text = f"{s.throughput_unit}/s {_rate(s.throughput_per_s)} total, {_rate(s.throughput_per_s / devices)} per device"
    if s.throughput_unit == "audio seconds":  # the samples too: that is what the batch size counts
        text += f" ({_rate(s.global_batch_size / s.step_time_s)} samples/s)"
    return text


def _recompute_text(s: Summary) -> str:
    """The layout line's recompute, where a layer recomputes anything."""
    if s.recompute == "none" or (s.recompute == "selective" and not s.recompute_modules):
        return ""
    if s.recompute == "selective":
        return f"; recompute {', '.join(s.recompute_modules)}"
    return f"; recompute {s.recompute}"


def _graphs_text(s: Summary) -> str:
    """The layout line's per-layer CUDA graphs, where any are captured."""
    return f"; CUDA graphs of {', '.join(s.cuda_graph_modules)}" if s.cuda_graph_modules else ""


def format_summary(summary: Summary) -> str:
    """Human-readable summary of a simulated step."""
    s = summary
    step = s.step_time_s
    ranks = s.ranks
    n = len(ranks)
    mean = lambda attr: sum(getattr(r, attr) for r in ranks) / n  # noqa: E731
    vpp = f" (vpp {s.vpp})" if s.vpp > 1 else ""
    cp = f" x CP {s.cp}" if s.cp > 1 else ""
    extras = "".join(f"; {text}" for text in (f"EP {s.ep}" if s.ep > 1 else "",
                                               f"ZeRO-{s.zero_stage}" if s.zero_stage else "") if text)
    lines = [
        s.scenario,
        f"  cluster      {s.devices} x {s.accelerator} ({s.system})",
        *([f"  calibration  {s.calibration}"] if s.calibration else []),
        f"  layout       TP {s.tp}{cp} x PP {s.pp}{vpp} x DP {s.dp}{extras}; {s.num_microbatches} microbatch{'es' if s.num_microbatches != 1 else ''} of "
        f"{s.microbatch_size} per pipeline; schedule {s.schedule}"
        f"{f' in groups of {s.microbatch_group_size}' if s.microbatch_group_size else ''}"
        f"{', forward and backward paired (combined 1F1B)' if s.combined_1f1b else ''}"
        f"{_recompute_text(s)}{_graphs_text(s)}",
        *([f"  stages       layers per stage {format_split(s.layers_per_stage)} ({s.layer_split} split)"]
          if len(s.layers_per_stage) > 1 else []),
        f"  step time    {format_seconds(step)}{f' ({step / 3600:.2f} h)' if step >= 3600 else ''}   {_throughput(s)}",
        *([f"    a step of a long run: {format_seconds(s.cross_step_overlap_s)} of the step alone "
           f"({format_seconds(step + s.cross_step_overlap_s)}) run under the neighbouring steps "
           f"(training.optimizer_post_validation)"] if s.cross_step_overlap_s > 0 else []),
        f"  throughput   {s.model_tflops_per_device:.1f} model TFLOP/s per device   MFU {100 * s.mfu:.1f} %   "
        f"HFU {100 * s.hfu:.1f} %"
        # below MFU when causal attention skips more score blocks than recompute adds work (said
        # only where the printed figures differ)
        + (" (below MFU: the model's FLOP count includes work its kernels skip, such as the masked "
           "half of causal attention)" if round(100 * s.hfu, 1) < round(100 * s.mfu, 1) else ""),
        f"  bubble       {100 * s.bubble_fraction:.1f} % of the pipeline time ({format_seconds(s.bubble_s)} idle per "
        f"rank; Zero Bubble's rate {100 * s.bubble_rate_zb:.1f} %)",
        f"    by cause: schedule fill/drain {format_seconds(s.bubble_schedule_s)}, stage imbalance "
        f"{format_seconds(s.bubble_imbalance_s)}"
        + (f", other-stage waits not split {format_seconds(mean('idle_stage_wait_s'))}"
           if mean("idle_stage_wait_s") > 0 else "")
        + f", pipeline transfers {format_seconds(mean('idle_transfer_s'))}, own sends {format_seconds(mean('idle_send_s'))}",
        f"  exposed comm TP {format_seconds(s.exposed_tp_comm_s)} ({_pct(s.exposed_tp_comm_s, step)}), "
        + (f"CP {format_seconds(s.exposed_cp_comm_s)} ({_pct(s.exposed_cp_comm_s, step)}), "
           if s.exposed_cp_comm_s > 0 else "")
        # the MoE token all-to-alls over EP and the expert-TP gathers of the routed tokens
        + (f"{'EP all-to-all' if s.ep > 1 else 'expert TP'} {format_seconds(s.exposed_ep_comm_s)} "
           f"({_pct(s.exposed_ep_comm_s, step)}), "
           if s.exposed_ep_comm_s > 0 else "") +
        f"PP {format_seconds(s.exposed_pp_comm_s)} ({_pct(s.exposed_pp_comm_s, step)}), "
        f"DP {format_seconds(s.exposed_dp_comm_s)} ({_pct(s.exposed_dp_comm_s, step)}); "
        f"optimizer step {format_seconds(s.optimizer_s)}",
        *([f"  host         the GPU waited {format_seconds(s.host_wait_s)} ({_pct(s.host_wait_s, step)}) per rank for "
           f"kernel launches (training.host_launch_interval)"] if s.host_wait_s > 0 else []),
        f"  memory       peak {format_bytes(s.peak_memory_bytes)} of {format_bytes(s.capacity_bytes)} per device",
        *_memory_rows(s),
    ]
    oom = [m for m in s.memory if not m.fits]
    fullest = max(s.memory, key=lambda m: m.peak_memory_bytes / m.capacity_bytes, default=None)
    if fullest is not None and tight_fit(fullest.peak_memory_bytes, fullest.capacity_bytes,
                                         fullest.fragmentation_bytes):
        free = fullest.capacity_bytes - fullest.peak_memory_bytes
        lines.append(f"  note: rank {fullest.rank} leaves {format_bytes(free)} free "
                     f"({100 * free / fullest.peak_memory_bytes:.1f} % of its peak); {TIGHT_FIT_ADVICE}")
    if oom:
        worst = max(oom, key=lambda m: m.peak_memory_bytes)
        lines.append(f"  WARNING: out of memory on {len(oom)} of {len(s.memory)} pipeline ranks; rank {worst.rank} "
                     f"needs {format_need(worst.peak_memory_bytes, worst.capacity_bytes)} "
                     f"(largest: {worst.largest_category})")
        if s.split_within_budget is False:
            lines.append("  note: layers_per_stage: auto found no split of the layers within the memory budget; "
                         "this is the fastest split, with what overflows")
    return "\n".join(lines)


def placement_warning(layout, system) -> str | None:
    """One line for stderr about how the job sits on the system's scale-up domains, or None.

    The conditions are the cost layer's (:func:`mpsim.cost.topology.placement_warnings`);
    several are joined into the one line.
    """
    from mpsim.cost.groups import group_placements
    from mpsim.cost.topology import placement_warnings

    found = placement_warnings(layout.devices, layout.devices_per_node, system.name, group_placements(layout))
    return f"warning: {'; '.join(found)}" if found else None


def summary_dict(summary: Summary) -> dict[str, Any]:
    """The summary as plain JSON-ready data (fields documented in docs/json.md)."""
    data = asdict(summary)
    data["schema_version"] = JSON_SCHEMA_VERSION
    for rank, memory in zip(data["ranks"], summary.ranks):
        rank["idle_s"] = memory.idle_s
    for entry, memory in zip(data["memory"], summary.memory):
        entry["model_state_bytes"] = memory.model_state_bytes
        entry["peak_memory_bytes"] = memory.peak_memory_bytes
        entry["fits"] = memory.fits
        entry["largest_category"] = memory.largest_category
        entry["stages"] = list(memory.stages)
    data["layers_per_stage"] = list(summary.layers_per_stage)
    return data


def summary_json(summary: Summary) -> str:
    """The summary as one JSON object."""
    return json.dumps(summary_dict(summary), indent=2, sort_keys=False)
