"""The SimPy engine with a pipeline's repeated middle cut out, then put back.

The steady-state walk (``steady.py``) shows, bit for bit, where a step repeats itself: from
some layer on, each layer is the last one again, ``q`` microbatches on and one cycle
later. It shows it for the model without contention (each rank pair's link its own). The
SimPy engine, which shares links between the flows on them at the same moment, needs every
item evaluated; but while no link carries two flows at once the two models are the same
model (a flow alone takes exactly its priced time), and the repeated layers are the same
in both. This module uses that, and approximates nothing:

1. ``cut_out``: the walk, over the first part of each rank's list only (more if it finds no
   repeat there), finds the first layer that repeats the one before it (a "layer" here is
   the walk's period, which may be a block of several). The lists
   themselves, read as arrays, say how long the repeat lasts: item ``i + p`` is item ``i``
   with its microbatch ``q`` on (``p`` items per layer on the rank), in everything that
   decides a time, up to the cool-down. Those ``n`` layers, all but the last one in the
   run, are cut out of each rank's list and the items after them numbered ``n * q``
   microbatches down. What is left is a valid schedule with ``n * q`` fewer microbatches,
   in which the layer before the cut is followed by the layer after it, as in the step
   each repeated layer is followed by its image.
2. The SimPy engine runs the short schedule, contention and all.
3. The short run stands for the step if no link carried two flows before the layer after
   the cut had ended on every rank (``SharedLinks.first_shared_s``): until then the run is
   the walk's, so the layers around the cut are images of each other, flows included, and
   the step's cut-out layers are further images, none of whose flows meets another. After
   the cut, the short run does what the step does after its last repeated layer, ``n``
   cycles earlier. Otherwise, or where no repeat is found, the whole step runs.
4. ``_expand``: the step's timeline from the short run's records: those before the cut
   as they are, the cut-out layers as images of the layer before the cut (each one cycle
   later than the last, its items ``p`` further on, ``q`` microbatches up), the rest moved
   on by the ``n`` cycles.

Times agree with the full run's to rounding (an image's time is the short run's plus ``j``
cycles, where the full run adds the layers' durations one by one), and so a send wait or a
reduction no longer than rounding at the step's scale may be recorded in one and not the
other: ``tests/test_excise.py`` holds the two to each other on random contended inputs.
Overlapped pairs (DualPipe), actions that gather their parameters first (FSDP under a
pipeline, ``actions.Unsharding``) and reductions started by every action (ZeRO-2/3) are
not cut: the whole step runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mpsim.engine.core import EngineInput, cyclic_gc_paused, simulate, simulate_sharing
from mpsim.engine.longest_path import supports
from mpsim.engine.steady import first_repeat
from mpsim.engine.timeline import ActionRecord, SyncRecord, Timeline, TransferRecord
from mpsim.engine.uncontended import _same_transfer_times
from mpsim.schedules.actions import KINDS, Action, Schedule

FIRST_WINDOW = 32  # microbatches' worth of each rank's list walked first to find the repeat
_KIND = {kind: code for code, kind in enumerate(KINDS)}


@dataclass(frozen=True)
class Cut:
    """``layers`` layers cut out from item ``start[r]`` of each rank ``r``, ``items[r]`` items
    per layer, ``shift`` microbatches and ``cycle_s`` seconds per layer."""

    layers: int
    shift: int
    cycle_s: float
    items: tuple[int, ...]
    start: tuple[int, ...]

    def short(self, schedule: Schedule) -> Schedule:
        """``schedule`` with the layers cut out and the later microbatches numbered down."""
        down = self.layers * self.shift
        ranks = []
        for rank, actions in enumerate(schedule.actions):
            after = actions[self.start[rank] + self.layers * self.items[rank]:]
            ranks.append(actions[:self.start[rank]] + tuple(Action(a.stage, a.kind, a.microbatch - down)
                                                             for a in after))
        return replace(schedule, num_microbatches=schedule.num_microbatches - down, actions=tuple(ranks))

    def per_item(self, rank: int, values: list) -> list:
        """A value per item of the short run's ``rank`` as the step has it: the layer before the
        cut's values once more for each layer cut out (a wait, say, which the images repeat)."""
        begin, p = self.start[rank], self.items[rank]
        return values[:begin] + values[begin - p:begin] * self.layers + values[begin:]


def simulate_excised(inp: EngineInput, first_window: int = FIRST_WINDOW) -> Timeline:
    """The SimPy engine's timeline of ``inp``, its repeated middle run once (module doc)."""
    with cyclic_gc_paused():  # as in the engine's own run: records by the hundred thousand
        return _excised(inp, first_window)


def _excised(inp: EngineInput, first_window: int) -> Timeline:
    cut = cut_out(inp, first_window)
    if cut is None:
        return simulate(inp)
    try:
        short, first_shared_s = simulate_sharing(replace(inp, schedule=cut.short(inp.schedule)))
    except RuntimeError:  # the short lists do not run: the whole step decides
        return simulate(inp)
    if first_shared_s < _after_cut_s(short, cut):
        return simulate(inp)
    expanded = _expand(short, cut, inp.schedule)
    return simulate(inp) if expanded is None else expanded


def cut_out(inp: EngineInput, first_window: int = FIRST_WINDOW) -> Cut | None:
    """The layers to cut out of ``inp``'s step (module doc, step 1), or None. The walk reads
    ``first_window`` microbatches' worth of each list first (at least four per stage)."""
    schedule = inp.schedule
    micro = schedule.num_microbatches
    window = max(first_window, 4 * schedule.num_stages)
    if window >= micro:
        return None  # a step this short has little to cut; the walk would read all of it
    if inp.action_buckets or any(type(item) is not Action for items in schedule.actions for item in items):
        return None
    if inp.transfer_links is not None and not _same_transfer_times(inp):
        return None
    plain = replace(inp, transfer_links=None)
    while True:
        head = tuple(actions[:-(-len(actions) * window // micro)] for actions in schedule.actions)
        part = replace(plain, schedule=replace(schedule, actions=head))
        if not supports(part):
            return None
        repeat = first_repeat(part, tuple(len(actions) for actions in schedule.actions))
        if repeat is not None:
            break
        window *= 4
        if window >= micro:
            return None
    q = repeat.shift
    layers = None
    for actions, p, after in zip(schedule.actions, repeat.items, repeat.position):
        if p == 0:
            if actions:
                return None  # a rank outside the repeat: nothing says how its items would move
            continue
        lasting = _repeating_until(actions, p, q, after - p)
        fits = (lasting - after) // p
        layers = fits if layers is None else min(layers, fits)
    if not layers or layers < 1:
        return None
    return Cut(layers, q, repeat.cycle_s, repeat.items, repeat.position)


def _repeating_until(actions: tuple, p: int, q: int, begin: int) -> int:
    """The first ``i >= begin`` whose item ``i + p`` is not item ``i`` with its microbatch ``q`` on
    in all that decides a time (stage, kind, and being the last backward of its stage on
    the rank, after which its gradients are reduced), as ``steady._layers`` compares items."""
    count = len(actions)
    stage = np.fromiter((a.stage for a in actions), dtype=np.int64, count=count)
    kind = np.fromiter((_KIND[a.kind] for a in actions), dtype=np.int64, count=count)
    micro = np.fromiter((a.microbatch for a in actions), dtype=np.int64, count=count)
    last = np.zeros(count, dtype=bool)
    backward = np.flatnonzero((kind == 1) | (kind == 3))
    if len(backward):
        # the last B or W of each stage: the first occurrence in the reversed order
        stages_reversed = stage[backward][::-1]
        _, first = np.unique(stages_reversed, return_index=True)
        last[backward[::-1][first]] = True
    same = ((stage[p:] == stage[:-p]) & (kind[p:] == kind[:-p]) & (micro[p:] == micro[:-p] + q)
            & (last[p:] == last[:-p]))
    broken = np.flatnonzero(~same[begin:])
    return begin + int(broken[0]) if len(broken) else count - p


def _after_cut_s(short: Timeline, cut: Cut) -> float:
    """When the layer after the cut had ended on every rank (in the short run)."""
    latest = 0.0
    for rank, records in enumerate(short.actions):
        if records:
            last = min(cut.start[rank] + cut.items[rank], len(records)) - 1
            latest = max(latest, records[last].end_s)
    return latest


def _expand(short: Timeline, cut: Cut, schedule: Schedule) -> Timeline | None:
    """The step's timeline from the short run's (module doc, step 4); None where a record of
    the short run does not sit where the cut puts it."""
    n, cycle_s = cut.layers, cut.cycle_s
    later_s = n * cycle_s
    timeline = Timeline(short.num_ranks, actions=[])
    first_after_s = []  # per rank: when its first item after the cut started, in the short run
    for rank, records in enumerate(short.actions):
        begin, p, items = cut.start[rank], cut.items[rank], schedule.actions[rank]
        if len(records) != len(items) - n * p or begin < p:
            return None
        out = records[:begin]
        for j in range(1, n + 1):
            out.extend(_later(r, items, j * p, j * cycle_s) for r in records[begin - p:begin])
        out.extend(_later(r, items, n * p, later_s) for r in records[begin:])
        timeline.actions.append(out)
        first_after_s.append(records[begin].start_s if begin < len(records) else float("inf"))
    # a transfer goes with its producing action: kept, repeated with the layer before the cut,
    # or moved on with the items after it
    index_of = [{r.action: r.index for r in records} for records in short.actions]
    for t in short.transfers:
        index = index_of[t.src_rank][t.action]
        begin, p, items = cut.start[t.src_rank], cut.items[t.src_rank], schedule.actions[t.src_rank]
        if index >= begin:
            timeline.transfers.append(TransferRecord(t.src_rank, t.dst_rank, items[index + n * p],
                                                     t.start_s + later_s, t.end_s + later_s))
            continue
        timeline.transfers.append(t)
        if index >= begin - p:
            timeline.transfers.extend(TransferRecord(t.src_rank, t.dst_rank, items[index + j * p],
                                                     t.start_s + j * cycle_s, t.end_s + j * cycle_s)
                                      for j in range(1, n + 1))
    # reductions and the step's end come after the cut: a stage's last backward is in the
    # cool-down, and there are no per-action reductions (``cut_out``)
    for s in short.syncs:
        if s.start_s < first_after_s[s.rank]:
            return None
        timeline.syncs.append(SyncRecord(s.rank, s.kind, s.label, s.start_s + later_s, s.end_s + later_s))
    timeline.send_waits = _send_waits(short, cut)
    timeline.rank_end_s = [t + later_s for t in short.rank_end_s]
    return timeline


def _later(r: ActionRecord, items: tuple, step: int, at_s: float) -> ActionRecord:
    """Record ``r`` as the item ``step`` further on, ``at_s`` later (the item itself is the
    step's own: the images' actions need not be built)."""
    return ActionRecord(r.rank, r.index + step, items[r.index + step], r.ready_s + at_s, r.start_s + at_s,
                        r.end_s + at_s, None if r.input_sent_s is None else r.input_sent_s + at_s)


def _send_waits(short: Timeline, cut: Cut) -> list:
    """Each wait of a rank for its own sends, placed with the item it came before.

    The engine records a wait before an item as ``(rank, previous end, ready)``, exactly
    where the item's ``ready_s`` passes the previous item's end, and one after the rank's
    last item; each is kept, repeated or moved on with its item.
    """
    n, cycle_s = cut.layers, cut.cycle_s
    later_s = n * cycle_s
    waits = []
    for rank, records in enumerate(short.actions):
        begin, p = cut.start[rank], cut.items[rank]
        end = 0.0
        for index, r in enumerate(records):
            if r.ready_s > end:
                if index >= begin:
                    waits.append((rank, end + later_s, r.ready_s + later_s))
                else:
                    waits.append((rank, end, r.ready_s))
                    if index >= begin - p:
                        waits.extend((rank, end + j * cycle_s, r.ready_s + j * cycle_s) for j in range(1, n + 1))
            end = r.end_s
    last_s = [records[-1].end_s if records else 0.0 for records in short.actions]
    for rank, begin, end in short.send_waits:
        if begin >= last_s[rank]:  # after the rank's last item (a wait before an item begins earlier)
            waits.append((rank, begin + later_s, end + later_s))
    return waits
