"""Memory over time: a plot per rank, and PyTorch's memory-snapshot format.

Both come from the engine's timeline: activations are allocated when a forward starts
and freed when the backward that consumes them ends (``memory.activation_timeline``);
model state, buffers and reserved memory are resident for the whole step.

The snapshot is a pickle in the layout ``torch.cuda.memory._snapshot()`` produces (a
``segments`` list and per-device ``device_traces`` of ``alloc`` / ``free_requested`` /
``free_completed`` events), so it opens in PyTorch's memory viewer
(pytorch.org/memory_viz) like a recording of a real run.
"""

from __future__ import annotations

import pickle

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mpsim.results.memory import RankMemory, _activation_deltas, activation_timeline  # noqa: E402
from mpsim.schedules.actions import parts  # noqa: E402
from mpsim.simulate import SimulationResult  # noqa: E402

GiB = 2.0**30


def plot_memory(result: SimulationResult, memory: list[RankMemory], path: str, ranks: list[int] | None = None) -> None:
    """Memory per device over the step, one line per pipeline rank, labelled at its end."""
    timeline = result.timeline
    shown = ranks if ranks is not None else list(range(timeline.num_ranks))
    if ranks is None and len(shown) > 8:
        shown = sorted({0, 1, len(shown) // 2, len(shown) - 2, len(shown) - 1,
                        max(range(len(memory)), key=lambda r: memory[r].peak_memory_bytes)})
    step = timeline.step_time_s
    scale, unit = (1.0, "s") if step >= 1 else (1e3, "ms")
    fig, ax = plt.subplots(figsize=(12, 5.5))
    cmap = plt.get_cmap("viridis")
    for position, rank in enumerate(shown):
        m = memory[rank]
        resident = m.peak_memory_bytes - m.activations_peak_bytes
        points = activation_timeline(timeline, result.workload, rank)
        times = [t * scale for t, _ in points] + [step * scale]
        values = [(resident + level) / GiB for _, level in points] + [(resident + points[-1][1]) / GiB]
        color = cmap(position / max(1, len(shown) - 1))
        ax.step(times, values, where="post", color=color, linewidth=1.4)
        peak_index = max(range(len(values)), key=values.__getitem__)
        ax.annotate(f"rank {rank}: peak {values[peak_index]:.1f} GiB", (times[peak_index], values[peak_index]),
                    textcoords="offset points", xytext=(4 + 90 * (position % 3), 4), fontsize=8, color=color)
    capacity = memory[0].capacity_bytes / GiB
    ax.axhline(capacity, color="#C44E52", linestyle="--", linewidth=1)
    ax.text(0, capacity, f" capacity {capacity:.0f} GiB", color="#C44E52", va="bottom", fontsize=8)
    ax.set_xlim(0, step * scale)
    ax.set_ylim(0, max(capacity, max(m.peak_memory_bytes for m in memory) / GiB) * 1.1)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("memory per device (GiB)")
    ax.set_title(f"{result.scenario.name}: memory per device over one step\n(model state, buffers and reserved "
                 f"memory are the floor; activations rise with each forward and fall with its backward)",
                 fontsize=9, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=150 if not path.endswith(".svg") else fig.dpi)
    plt.close(fig)


def memory_snapshot(result: SimulationResult, memory: list[RankMemory], rank: int) -> dict:
    """A PyTorch memory snapshot of one pipeline rank's device over the simulated step."""
    m = memory[rank]
    frames = lambda name: [{"filename": "mpsim", "line": 0, "name": name}]  # noqa: E731
    resident = [("weights", m.weights_bytes), ("gradients", m.grads_bytes), ("optimizer state", m.optimizer_bytes),
                ("communication buffers", m.buffers_bytes),
                *(((f"reserved: {name}", size) for name, size in m.reserved_parts) if m.reserved_parts
                  else (("reserved", m.reserved_bytes),))]
    address = 0
    blocks = []
    for name, size in resident:
        if size > 0:
            blocks.append({"address": address, "size": int(size), "requested_size": int(size),
                           "state": "active_allocated", "frames": frames(name)})
            address += int(size)
    trace = []
    live: dict[tuple, list[dict]] = {}
    for record in result.timeline.actions[rank]:
        for action in parts(record.action):
            delta, _ = _activation_deltas(result.workload.stages[action.stage], action.kind)
            key = (action.stage, action.microbatch)
            if delta > 0:
                name = f"{'weight-grad buffers' if action.kind == 'I' else 'activations'} stage {action.stage} " \
                       f"microbatch {action.microbatch}"
                event = {"action": "alloc", "addr": address, "size": int(delta), "stream": 0,
                         "time_us": int(record.start_s * 1e6), "frames": frames(name)}
                address += int(delta)
                trace.append(event)
                live.setdefault(key, []).append(event)
            elif delta < 0:
                freed = -delta
                while freed > 0 and live.get(key):
                    alloc = live[key].pop(0)
                    freed -= alloc["size"]
                    for what in ("free_requested", "free_completed"):
                        trace.append({"action": what, "addr": alloc["addr"], "size": alloc["size"], "stream": 0,
                                      "time_us": int(record.end_s * 1e6), "frames": alloc["frames"]})
    segment = {"device": 0, "address": 0, "total_size": address, "allocated_size": address, "active_size": address,
               "requested_size": address, "stream": 0, "segment_type": "large", "blocks": blocks}
    return {"segments": [segment], "device_traces": [trace]}


def write_memory_snapshot(result: SimulationResult, memory: list[RankMemory], rank: int, path: str) -> None:
    """Write ``memory_snapshot`` as a pickle (what torch.cuda.memory._dump_snapshot writes)."""
    with open(path, "wb") as handle:
        pickle.dump(memory_snapshot(result, memory, rank), handle)
