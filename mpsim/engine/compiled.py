"""The longest path compiled: the same recurrences over arrays, in machine code.

``longest_path.py`` evaluates the engine's recurrences item by item in Python, about
five microseconds an item, most of it the interpreter unpacking tuples. The recurrences
themselves are a handful of ``max`` and ``+`` per item, so once a schedule is turned into
arrays they compile (numba) into a loop of a few nanoseconds an item:

1. ``_compiled`` (once per schedule, cached): every item of every rank gets a row, in an
   order where each item comes after its rank's previous item and after the producers
   of its remote inputs (the order ``longest_path.Walk`` would visit them in; it depends
   only on the schedule, not on any time). A row holds the item's rank, its duration
   key's number, the slots of its remote inputs, and for each output sent to another
   rank the slot it fills, the link that carries it and its transfer key's number.
2. ``_evaluate_py`` (compiled by numba): per row, in that order, exactly the float operations of
   ``Walk.advance``: the rank's own sends first when sends block, then its inputs, then
   ``start + duration``; a send starts at ``max(producer end, link free)``.
3. In Python again: the DP streams (``dpstream.py``) fed in each rank's program order,
   the step's last send waits, pair syncs and the optimizer (``finish_step``), and,
   when asked for, the per-action records.

The times equal the Python walk's bit for bit (same operations on the same numbers, in
the same order per rank and per link, whatever the order of the rows). ``records=False``
returns a timeline with the step time, rank ends and syncs but no per-action or transfer
records, which is all a search that only ranks step times needs. It only reads a few rows
afterwards (each rank's last, those that feed a DP stream), so it need not evaluate the
others: its rows are ordered layer by layer as ``steady.py`` walks, and the loop jumps
over the periods of a pipeline's middle that repeat exactly (``compiled_steady.py``).
Its cost then follows the warm-up and cool-down, not the microbatches: a Megatron 1T
step on 3,072 GPUs takes a fraction of a millisecond at 64 microbatches per pipeline
(8,192 items) and about as long at 4,096 (524,288 items). Its times equal the full
evaluation's to rounding (the skipping rebases times; a few units in the last place).

numba is an optional extra (``pip install 'mpsim[fast]'``); without it ``available()``
is False and :func:`simulate_compiled` returns the Python walk's timeline. The SimPy
engine stays the judge of both (``tests/test_compiled.py``, ``tests/test_compiled_steady.py``).
"""

from __future__ import annotations

import math
from itertools import repeat

import numpy as np

from mpsim.engine.compiled_steady import RowPeriod, _evaluate_steady_py, row_period
from mpsim.engine.core import EngineInput, blocking_mode, finish_step
from mpsim.engine.dpstream import DPStreams
from mpsim.engine.longest_path import _plan, simulate_fast
from mpsim.engine.steady import SteadyTimeline, _Layers, _layers
from mpsim.engine.timeline import ActionRecord, Timeline, TransferRecord
from mpsim.jit import compiled as compiled_loop
from mpsim.schedules.actions import Schedule, flat


def _kernel(loop=None):
    """``loop`` (``_evaluate_py`` by default) compiled by numba, or None where numba is not installed."""
    return compiled_loop(loop or _evaluate_py)


def available() -> bool:
    """Whether the compiled loop can run here (numba installed)."""
    return _kernel() is not None


class _Compiled:
    """One schedule as arrays (module doc, step 1); ``periodic``: rows in layers, and where they repeat."""

    def __init__(self, schedule: Schedule, periodic: bool = False):
        plan = _plan(schedule)
        order = _visit_order(plan, _layers(schedule, plan) if periodic else None)
        rows = len(order)
        key_id: dict[tuple, int] = {}  # duration keys, numbered in order of first use
        transfer_id: dict[tuple[int, int], int] = {}  # (stage, consumer stage), numbered likewise
        link_id: dict[tuple[int, int], int] = {}
        self.rank = np.empty(rows, np.int64)
        self.key = np.empty(rows, np.int64)
        self.needs = np.full((rows, 2), -1, np.int64)
        self.gives = np.full((rows, 2), -1, np.int64)  # slot filled by each output sent to another rank
        self.link = np.full((rows, 2), -1, np.int64)
        self.transfer = np.full((rows, 2), -1, np.int64)
        self.row_of = [[0] * len(steps) for steps in plan]  # (rank, index) -> row
        for row, (rank, index) in enumerate(order):
            key, item, needs, outputs = plan[rank][index]
            self.row_of[rank][index] = row
            self.rank[row] = rank
            self.key[row] = key_id.setdefault(key, len(key_id))
            if len(needs) > 2 or len(outputs) > 2:
                raise ValueError(f"item {item} has more inputs or outputs than an overlapped pair")
            for j, slot in enumerate(needs):
                self.needs[row, j] = slot
            sent = [output for output in outputs if output[0] >= 0]  # outputs sent to another rank
            for j, (gives, consumer, consumer_stage, stage, _, _) in enumerate(sent):
                self.gives[row, j] = gives
                self.link[row, j] = link_id.setdefault((rank, consumer), len(link_id))
                self.transfer[row, j] = transfer_id.setdefault((stage, consumer_stage), len(transfer_id))
        self.keys = list(key_id)
        self.transfer_keys = list(transfer_id)
        # rows per duration key and sends per transfer key: the serial sum of a step's times
        # from the per-key values alone (``_on_exact_grid``)
        self.key_counts = np.bincount(self.key, minlength=len(self.keys)).astype(np.float64)
        self.transfer_counts = np.bincount(self.transfer[self.transfer >= 0],
                                           minlength=len(self.transfer_keys)).astype(np.float64)
        # for the records, per rank in program order: its rows and items; every send as
        # (row, output slot) with its source rank, consumer rank and producing action
        self.rank_rows = [np.array(rows, dtype=np.int64) for rows in self.row_of]
        self.rank_items = [[step[1] for step in steps] for steps in plan]
        sends = [(self.row_of[rank][index], j, rank, output[1], output[4]) for rank, steps in enumerate(plan)
                 for index, step in enumerate(steps)
                 for j, output in enumerate(o for o in step[3] if o[0] >= 0)]
        self.send_rows = np.array([s[0] for s in sends], dtype=np.int64)
        self.send_slots = np.array([s[1] for s in sends], dtype=np.int64)
        self.send_sources = [s[2] for s in sends]
        self.send_consumers = [s[3] for s in sends]
        self.send_actions = [s[4] for s in sends]
        self.num_links = len(link_id)
        self.slots = 2 * schedule.num_stages * schedule.num_microbatches
        self.plan = plan
        # per rank, (index, stage) of each stage's last backward: it queues the stage's gradient
        # reductions on the DP stream (actions that start their own, ZeRO-2/3, are found per input)
        self.last_backward = [[(index, output[3]) for index, step in enumerate(steps) for output in step[3]
                               if output[5]] for steps in plan]
        self.link_source = np.array([source for source, _ in link_id], dtype=np.int64)
        # per rank, its stages from the last: without overlap their reductions queue after its last item
        self.stages_last_first = [sorted({a.stage for a in flat(items)}, reverse=True) for items in schedule.actions]
        # where the rows repeat (compiled_steady.py), for the loop without records
        self.period: RowPeriod | None = row_period(schedule, plan, self.rank, self.key, self.needs, self.gives,
                                                   self.link, self.transfer, self.slots) if periodic else None
        self._feeds: dict[tuple, tuple] = {}  # (keys that queue reductions, overlap) -> (feeds, rows read)

    def feeds(self, queued_keys: frozenset, overlap: bool) -> tuple[list[list[tuple]], np.ndarray]:
        """Per rank, in program order, the items that feed its DP stream, as (index, duration key
        when it queues reductions of its own or None, stages whose gradients it finalizes); and,
        ascending, every row read after the loop (these feeds and each rank's last item)."""
        cached = self._feeds.get((queued_keys, overlap))
        if cached is not None:
            return cached
        feeds = []
        for rank, steps in enumerate(self.plan):
            mine = []
            if queued_keys:
                for index, (key, _, _, outputs) in enumerate(steps):
                    stages = [output[3] for output in outputs if output[5]] if overlap else []
                    if key in queued_keys or stages:
                        mine.append((index, key if key in queued_keys else None, stages))
            elif overlap:
                mine = [(index, None, [stage]) for index, stage in self.last_backward[rank]]
            feeds.append(mine)
        read = [self.row_of[rank][index] for rank, mine in enumerate(feeds) for index, _, _ in mine]
        read += [rows[-1] for rows in self.row_of if rows]
        cached = self._feeds[(queued_keys, overlap)] = (feeds, np.unique(np.array(read, dtype=np.int64)))
        return cached


def _visit_order(plan: list[list[tuple]], layers: _Layers | None = None) -> list[tuple[int, int]]:
    """(rank, index) of every item in an order that respects each rank's program order and
    every remote input (``Walk.advance``'s order: it parks a rank on a missing input).

    With ``layers`` (``steady._layers``), in passes as ``simulate_steady`` walks: each rank up
    to its next layer boundary, then the rest; a pipeline's repeated layers then give
    repeated runs of rows (``compiled_steady.py``). Any such order gives the same times.
    """
    passes: list = []
    if layers is not None:
        start, end, p = layers.start, layers.end, layers.items
        layer = 0
        while all(start[r] + layer * p[r] <= end[r] for r in range(len(plan)) if p[r]):
            passes.append([start[r] + layer * p[r] if p[r] else 0 for r in range(len(plan))])
            layer += 1
    passes.append(None)
    produced = set()
    position = [0] * len(plan)
    order = []
    for limits in passes:
        runnable = list(range(len(plan) - 1, -1, -1))
        parked: dict[int, int] = {}
        while runnable:
            rank = runnable.pop()
            steps = plan[rank]
            count = len(steps) if limits is None else min(len(steps), limits[rank])
            index = position[rank]
            while index < count:
                _, _, needs, outputs = steps[index]
                missing = next((slot for slot in needs if slot not in produced), -1)
                if missing >= 0:
                    parked[missing] = rank
                    break
                order.append((rank, index))
                for output in outputs:
                    gives = output[0]
                    if gives >= 0:
                        produced.add(gives)
                        if gives in parked:
                            runnable.append(parked.pop(gives))
                index += 1
            position[rank] = index
    stuck = [rank for rank, steps in enumerate(plan) if position[rank] < len(steps)]
    if stuck:
        rank = stuck[0]
        raise RuntimeError(f"simulation stalled: rank {rank} never ran {plan[rank][position[rank]][1]}")
    return order


def _evaluate_py(rank, key, needs, gives, link, transfer, duration_s, transfer_s, num_ranks, num_links, slots,
                 blocking):
    """The recurrences of ``Walk.advance`` over rows (module doc, step 2); compiled below."""
    rows = rank.shape[0]
    ready = np.empty(rows)
    start = np.empty(rows)
    end = np.empty(rows)
    input_sent = np.full(rows, np.nan)
    wait_from = np.full(rows, np.nan)  # a wait for the rank's own sends: from here to ready
    tx_start = np.full((rows, 2), np.nan)
    tx_end = np.full((rows, 2), np.nan)
    clock = np.zeros(num_ranks)
    sends_done = np.zeros(num_ranks)
    link_free = np.full(num_links, -np.inf)
    arrival = np.zeros(slots)
    sent = np.zeros(slots)
    for row in range(rows):
        r = rank[row]
        now = clock[r]
        if blocking > 0 and sends_done[r] > now and (blocking == 1 or needs[row, 0] >= 0 or needs[row, 1] >= 0):
            wait_from[row] = now
            now = sends_done[r]
        ready[row] = now
        for j in range(2):
            slot = needs[row, j]
            if slot >= 0:
                if arrival[slot] > now:
                    now = arrival[slot]
                if math.isnan(input_sent[row]) or sent[slot] > input_sent[row]:
                    input_sent[row] = sent[slot]
        start[row] = now
        now = now + duration_s[key[row]]
        end[row] = now
        for j in range(2):
            slot = gives[row, j]
            if slot >= 0:
                free = link_free[link[row, j]]
                begin = now if free < now else free
                finish = begin + transfer_s[transfer[row, j]]
                link_free[link[row, j]] = finish
                sent[slot] = now
                arrival[slot] = finish
                tx_start[row, j] = begin
                tx_end[row, j] = finish
                if finish > sends_done[r]:
                    sends_done[r] = finish
        clock[r] = now
    return ready, start, end, input_sent, wait_from, tx_start, tx_end, clock, sends_done


_COMPILED: dict[tuple[int, bool], tuple[Schedule, _Compiled]] = {}


def _compiled(schedule: Schedule, periodic: bool = False) -> _Compiled:
    """The arrays of ``schedule``, cached. The loop with records visits rows in ``Walk``'s order; the
    one without them in layers (``periodic``), which costs finding the layers and only it uses."""
    cached = _COMPILED.get((id(schedule), periodic))
    if cached is not None and cached[0] is schedule:
        return cached[1]
    if len(_COMPILED) > 64:  # keep the cache small, as longest_path does
        _COMPILED.clear()
    compiled = _Compiled(schedule, periodic)
    _COMPILED[(id(schedule), periodic)] = (schedule, compiled)
    return compiled


def simulate_compiled(inp: EngineInput, records: bool = True) -> Timeline:
    """The longest-path timeline of ``inp`` from the compiled loop (module doc).

    Only for inputs ``longest_path.supports``; without numba, ``simulate_fast``'s timeline.
    ``records=False`` leaves the per-action, transfer and per-action send-wait records out
    (step time, rank ends and syncs are complete), and jumps over the repeated middle of a
    pipeline where it repeats exactly (``compiled_steady.py``): it returns a
    :class:`~mpsim.engine.SteadyTimeline` whose ``skipped`` says what was jumped over.
    """
    evaluate = _kernel()
    if evaluate is None:
        return simulate_fast(inp)
    schedule = inp.schedule
    c = _compiled(schedule, periodic=not records)
    duration_s = np.array([inp.action_s[key] for key in c.keys], dtype=np.float64)
    transfer_s = np.array([inp.transfer_s.get(key, 0.0) for key in c.transfer_keys], dtype=np.float64)
    num_ranks = schedule.num_ranks
    action_buckets = inp.action_buckets
    queued_keys = frozenset(key for key in c.keys if action_buckets.get(key)) if action_buckets else frozenset()
    feeds, read_rows = c.feeds(queued_keys, bool(inp.overlap_grad_sync))
    if not records:
        return _without_records(inp, c, duration_s, transfer_s, feeds, read_rows)
    ready, start, end, input_sent, wait_from, tx_start, tx_end, clock, sends_done = evaluate(
        c.rank, c.key, c.needs, c.gives, c.link, c.transfer, duration_s, transfer_s, num_ranks,
        c.num_links, c.slots, blocking_mode(inp))
    timeline = Timeline(num_ranks, actions=[[] for _ in range(num_ranks)])
    _records(timeline, c, ready, start, end, input_sent, tx_start, tx_end)
    if inp.send_blocking:
        waits = np.flatnonzero(~np.isnan(wait_from))
        timeline.send_waits.extend(zip(c.rank[waits].tolist(), wait_from[waits].tolist(), ready[waits].tolist()))
    _finish(inp, timeline, c, feeds, start, end, clock.tolist(), sends_done.tolist())
    return timeline


_NO_SLOTS = np.empty(0, np.int64)  # the live slots of a loop without boundaries


def _without_records(inp: EngineInput, c: _Compiled, duration_s: np.ndarray, transfer_s: np.ndarray,
                     feeds: list[list[tuple]], read_rows: np.ndarray) -> SteadyTimeline:
    """The step without records, the repeated periods that no read row lies in jumped over."""
    num_ranks = inp.schedule.num_ranks
    period = c.period
    boundaries = 0
    if period is not None:
        # skipping starts at the second boundary at the earliest, and the last boundary may not
        # pass the first row read afterwards from there on (skipped rows have no times)
        after = int(np.searchsorted(read_rows, period.first_row + period.rows))
        first_read = int(read_rows[after]) if after < read_rows.size else len(c.rank)
        boundaries = min(period.boundaries, (first_read - period.first_row) // period.rows)
    if boundaries < 2:
        first_row, period_rows, shift, live = 0, 1, 0, _NO_SLOTS
    else:
        first_row, period_rows, shift, live = period.first_row, period.rows, period.shift, period.live
        duration_s, transfer_s = _on_exact_grid(c, duration_s, transfer_s)
    start, end, clock, sends_done, skipped, cycle_s = _kernel(_evaluate_steady_py)(
        c.rank, c.key, c.needs, c.gives, c.link, c.transfer, c.link_source, duration_s, transfer_s, num_ranks,
        c.slots, blocking_mode(inp), first_row, period_rows, boundaries, shift, live)
    timeline = SteadyTimeline(num_ranks, actions=[[] for _ in range(num_ranks)])
    if skipped:
        timeline.skipped.append((skipped, shift, cycle_s, period.rank_rows))
    _finish(inp, timeline, c, feeds, start, end, clock.tolist(), sends_done.tolist())
    return timeline


def _on_exact_grid(c: _Compiled, duration_s: np.ndarray, transfer_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Durations and transfer times rounded to the finest power-of-two grid on which every time
    of the step is exact in float64.

    Equal states are recognised bit for bit (``compiled_steady.py``), but a sum of times
    like 0.1 s rounds differently as the clock grows, so a schedule whose exact times
    repeat (uniform stages, say) may never show two equal states in floating point. On a
    grid of ``2^-g`` seconds with every time below ``2^(53-g)``, sums, differences and
    maxima of grid times are exact, and the times repeat as the exact ones do. The bound
    is the serial sum of every row's duration and transfers (no time of the step exceeds
    it); each value moves by at most half a grid step, ``2^-54`` of that sum, so the step
    time moves by at most the number of rows on its longest path times that: below 1e-9
    of it for any schedule mpsim builds (``tests/test_compiled_steady.py``).
    """
    bound = float(duration_s @ c.key_counts + (transfer_s @ c.transfer_counts if transfer_s.size else 0.0))
    if not bound > 0 or not np.isfinite(bound):
        return duration_s, transfer_s
    scale = 2.0 ** (52 - math.ceil(math.log2(bound)))
    return np.round(duration_s * scale) / scale, np.round(transfer_s * scale) / scale


def _records(timeline: Timeline, c: _Compiled, ready: np.ndarray, start: np.ndarray, end: np.ndarray,
             input_sent: np.ndarray, tx_start: np.ndarray, tx_end: np.ndarray) -> None:
    """The per-action records in each rank's program order, and the transfers (built column-wise:
    one ``tolist`` per column and rank, one tuple per record)."""
    for rank, rows in enumerate(c.rank_rows):
        sent = [None if value != value else value for value in input_sent[rows].tolist()]  # NaN: no remote input
        timeline.actions[rank].extend(map(ActionRecord._make, zip(
            repeat(rank), range(len(rows)), c.rank_items[rank], ready[rows].tolist(), start[rows].tolist(),
            end[rows].tolist(), sent)))
    begins = tx_start[c.send_rows, c.send_slots].tolist()
    ends = tx_end[c.send_rows, c.send_slots].tolist()
    timeline.transfers.extend(map(TransferRecord._make, zip(c.send_sources, c.send_consumers, c.send_actions,
                                                            begins, ends)))


def _finish(inp: EngineInput, timeline: Timeline, c: _Compiled, feeds: list[list[tuple]], start: np.ndarray,
            end: np.ndarray, clock: list, sends_done: list) -> None:
    """DP streams in program order, the last send waits, pair syncs and the optimizer (as ``Walk.finish``).

    Only the rows that feed a DP stream (``feeds``, from ``_Compiled.feeds``) and each rank's
    last row are read out of the arrays (as Python floats, so the records hold the same
    numbers the Python walk's do).
    """
    dp = DPStreams(timeline, inp.schedule.num_ranks, inp.grad_buckets)
    action_buckets, overlap = inp.action_buckets, inp.overlap_grad_sync
    for rank, steps in enumerate(c.plan):
        rows = c.row_of[rank]
        for index, key, stages in feeds[rank]:
            row = rows[index]
            begin, finish = float(start[row]), float(end[row])
            if key is not None:
                dp.add(rank, action_buckets[key], begin, finish, f"{steps[index][1]}")
            for stage in stages:
                dp.add_stage(rank, stage, begin, finish)
        last_end = float(end[rows[-1]]) if steps else 0.0
        if inp.send_blocking and sends_done[rank] > clock[rank]:
            timeline.send_waits.append((rank, clock[rank], sends_done[rank]))
        if not overlap:
            for stage in c.stages_last_first[rank]:
                dp.add_stage(rank, stage, last_end, last_end)
        dp.close(rank, last_end)
    finish_step(inp, timeline, dp.grad_done)
