"""Steady state: evaluate a pipeline's repeated middle once and jump over the rest.

After its warm-up, every shipped schedule repeats itself: a rank's list from some item
on is the same list again ``p`` items later with every microbatch moved up by ``q``
(1F1B: one forward and one backward, ``q = 1``). The recurrences of the longest path
(``longest_path.py``) are then the same recurrences, layer after layer; once the
pipeline is full, the times of one layer are those of the layer before plus a constant
cycle, until the cool-down begins.

This module finds that structure and uses it, without approximating anything:

1. ``_layers`` (once per schedule, cached): the ``q`` and, per rank, ``p`` and the
   run of items where item ``i + p`` is item ``i`` shifted by ``q`` microbatches, in
   everything that decides a time (duration key, remote inputs, outputs, last-backward
   marks). A schedule without such a run on every rank is evaluated in full.
2. Walk layer by layer: each rank runs up to its next layer boundary (or until it waits
   for an input). At each boundary the whole state that decides the future (each rank's
   relative position, clock, send and DP-stream times, each link's free time, each
   transfer in flight) is rebased to the latest clock and compared with the previous
   boundaries' (up to ``MAX_PERIOD`` back), bit for bit, transfers matched by microbatch
   shifted by ``q`` per layer. Rebased, two equal states run the same floating-point
   operations on the same numbers, so every later block of layers repeats too: no
   tolerance is involved. The state may repeat only every few layers: 1F1B on ``n``
   stages whose sends do not block repeats every ``n`` layers.
3. On a match, the blocks that are still images of the last one (the run's end decides
   how many) are skipped: positions move by ``p`` per layer, transfers in flight by
   ``q``, times by the block's cycle. The rest (the last steady layers and the cool-down)
   is evaluated as usual, and the step ends exactly as the full evaluation ends.

The result is a :class:`SteadyTimeline`: the step time, rank end times, final DP syncs,
pair syncs and optimizer steps of the full evaluation, and the records (actions,
transfers, per-action DP syncs, send waits) of every evaluated item; the skipped ones
are counted in ``skipped``, not listed, so metrics that sum over records need the full
timeline. ``full_timeline=True`` evaluates
every item (as ``simulate_fast`` does) for the plots and traces that need each record.
Where no exact period appears, the whole step is evaluated: the answer is always the
full evaluation's, to floating-point rounding (rebasing rounds differently than
absolute times do, by a few units in the last place).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mpsim.engine.core import EngineInput
from mpsim.engine.longest_path import Walk, _plan
from mpsim.engine.timeline import ActionRecord, SyncRecord, Timeline, TransferRecord


@dataclass
class SteadyTimeline(Timeline):
    """A timeline whose repeated middle may be left out: ``skipped`` holds, per skip,
    (blocks, microbatch shift per block, cycle seconds per block, items per rank per block),
    a block being the one or more layers of the period found."""

    skipped: list[tuple[int, int, float, tuple[int, ...]]] = field(default_factory=list)

    @property
    def skipped_items(self) -> int:
        """Items whose records were not produced (their times are implied by the cycle)."""
        return sum(layers * sum(items) for layers, _, _, items in self.skipped)


@dataclass(frozen=True)
class _Layers:
    """A schedule's repeated structure: microbatch shift, items per layer and matched run per rank."""

    shift: int  # q: microbatches a layer moves up
    items: tuple[int, ...]  # p per rank
    start: tuple[int, ...]  # a per rank: first item whose image p items later matches
    end: tuple[int, ...]  # e per rank: items in [a, e) match their images
    consumer: dict  # slot -> (rank, index) of the item that waits for it


def _shifted(a: tuple, b: tuple, q: int) -> bool:
    """Whether step ``b`` is step ``a`` with every microbatch moved up by ``q``, in all that decides a time."""
    if a[0] != b[0] or len(a[2]) != len(b[2]) or len(a[3]) != len(b[3]):
        return False
    for x, y in zip(a[2], b[2]):
        if x + q != y:
            return False
    for (g, consumer, consumer_stage, stage, _, last), (g2, consumer2, consumer_stage2, stage2, _, last2) in zip(
            a[3], b[3]):
        if consumer != consumer2 or consumer_stage != consumer_stage2 or stage != stage2 or last != last2:
            return False
        if (g + q if g >= 0 else -1) != g2:
            return False
    return True


_LAYERS: dict[int, tuple] = {}
MIN_LAYERS = 4  # a run shorter than this many layers cannot pay for the comparisons
MAX_PERIOD = 8  # layers: a state is compared with those of this many boundaries before it


def _layers(schedule, plan, lengths: tuple[int, ...] | None = None) -> _Layers | None:
    """The repeated structure of ``schedule`` (module doc, step 1), or None; cached per schedule.

    ``lengths``: where the lists are the first part of a step's, each rank's whole length
    (its items per layer follow from that, not from the part)."""
    cached = _LAYERS.get(id(schedule))
    if cached is not None and cached[0] is schedule:
        return cached[1]
    found = None
    micro = schedule.num_microbatches
    candidates = []
    for q in (1, 2, schedule.num_ranks, schedule.num_stages, 2 * schedule.num_ranks, 2 * schedule.num_stages):
        if q not in candidates and 0 < q * MIN_LAYERS <= micro:
            candidates.append(q)
    for q in candidates:
        items, start, end = [], [], []
        for rank, steps in enumerate(plan):
            count = len(steps)
            total = count if lengths is None else lengths[rank]
            if (total * q) % micro:
                break
            p = total * q // micro
            if p == 0:
                items.append(0), start.append(0), end.append(0)
                continue
            best = (0, 0)
            run_start = 0
            for i in range(count - p):
                if not _shifted(steps[i], steps[i + p], q):
                    if i - run_start > best[1] - best[0]:
                        best = (run_start, i)
                    run_start = i + 1
            if count - p - run_start > best[1] - best[0]:
                best = (run_start, count - p)
            if best[1] - best[0] < MIN_LAYERS * p:
                break
            items.append(p), start.append(best[0]), end.append(best[1])
        else:
            consumer = {}
            for rank, steps in enumerate(plan):
                for index, step in enumerate(steps):
                    for slot in step[2]:
                        consumer[slot] = (rank, index)
            found = _Layers(q, tuple(items), tuple(start), tuple(end), consumer)
            break
    if len(_LAYERS) > 64:
        _LAYERS.clear()
    _LAYERS[id(schedule)] = (schedule, found)
    return found


class _Marks:
    """How many records of each list were already moved to absolute time."""

    def __init__(self, timeline: Timeline):
        self.actions = [len(records) for records in timeline.actions]
        self.transfers, self.syncs, self.send_waits = (len(timeline.transfers), len(timeline.syncs),
                                                       len(timeline.send_waits))

    def settle(self, timeline: Timeline, offset_s: float) -> None:
        """Add ``offset_s`` to the times of every record appended since the last call."""
        if offset_s != 0.0:
            o = offset_s
            for rank, records in enumerate(timeline.actions):
                for i in range(self.actions[rank], len(records)):
                    r = records[i]
                    records[i] = ActionRecord(r.rank, r.index, r.action, r.ready_s + o, r.start_s + o, r.end_s + o,
                                              None if r.input_sent_s is None else r.input_sent_s + o)
            transfers = timeline.transfers
            for i in range(self.transfers, len(transfers)):
                t = transfers[i]
                transfers[i] = TransferRecord(t.src_rank, t.dst_rank, t.action, t.start_s + o, t.end_s + o)
            syncs = timeline.syncs
            for i in range(self.syncs, len(syncs)):
                s = syncs[i]
                syncs[i] = SyncRecord(s.rank, s.kind, s.label, s.start_s + o, s.end_s + o)
            waits = timeline.send_waits
            for i in range(self.send_waits, len(waits)):
                rank, begin, end = waits[i]
                waits[i] = (rank, begin + o, end + o)
        self.__init__(timeline)


def _shift_times(walk: Walk, live: set[int], by_s: float) -> None:
    """Move every time of the state that decides the future by ``by_s`` seconds."""
    walk.clock_s[:] = [t + by_s for t in walk.clock_s]
    walk.sends_done_s[:] = [t + by_s for t in walk.sends_done_s]
    walk.dp.free_s[:] = [t + by_s for t in walk.dp.free_s]
    for link, t in walk.link_free_s.items():
        walk.link_free_s[link] = t + by_s
    arrival_s, sent_s = walk.arrival_s, walk.sent_s
    for slot in live:
        arrival_s[slot] += by_s
        sent_s[slot] += by_s


def _full(inp: EngineInput) -> SteadyTimeline:
    """Every item evaluated (``simulate_fast``'s timeline, with nothing skipped)."""
    num_ranks = inp.schedule.num_ranks
    walk = Walk(inp, _plan(inp.schedule), SteadyTimeline(num_ranks, actions=[[] for _ in range(num_ranks)]))
    walk.advance()
    return walk.finish()


@dataclass(frozen=True)
class Repeat:
    """The first layer the walk found to repeat the one before it, exactly: each rank's
    position after it, its items per layer, the microbatch shift and the cycle per layer."""

    position: tuple[int, ...]
    items: tuple[int, ...]
    shift: int
    cycle_s: float


def first_repeat(inp: EngineInput, lengths: tuple[int, ...] | None = None) -> Repeat | None:
    """Where the walk of ``inp`` first finds a layer that repeats the one before (module doc,
    step 2), without going on; None if it finds none. ``inp``'s lists may be the first part
    of a longer step's (``lengths``: the whole lists' lengths): a rank that waits for an item
    left out stops, and cannot repeat."""
    plan = _plan(inp.schedule)
    layers = _layers(inp.schedule, plan, lengths)
    if layers is None:
        return None
    found = _walk(inp, plan, layers, stop_at_repeat=True)
    return found if isinstance(found, Repeat) else None


def simulate_steady(inp: EngineInput, full_timeline: bool = False) -> SteadyTimeline:
    """The longest-path timeline of ``inp`` with its repeated middle skipped where exact (module doc)."""
    schedule = inp.schedule
    plan = _plan(schedule)
    layers = None if full_timeline else _layers(schedule, plan)
    if layers is None:
        return _full(inp)
    timeline = _walk(inp, plan, layers)
    if any(records and records[-1].index != len(plan[r]) - 1 for r, records in enumerate(timeline.actions)):
        return _full(inp)  # a rank whose last item was skipped: its end is not a record
    return timeline


def _walk(inp: EngineInput, plan, layers: _Layers, stop_at_repeat: bool = False) -> SteadyTimeline | Repeat | None:
    """Walk layer by layer, skipping repeated layers (or, ``stop_at_repeat``, returning the first
    repeat found; None if there is none)."""
    schedule = inp.schedule
    num_ranks = schedule.num_ranks
    timeline = SteadyTimeline(num_ranks, actions=[[] for _ in range(num_ranks)])
    walk = Walk(inp, plan, timeline)
    q, p, start, end, consumer = layers.shift, layers.items, layers.start, layers.end, layers.consumer
    marks = _Marks(timeline)
    position = walk.position
    live: set[int] = set()
    offset_s = 0.0
    history: list[tuple] = []  # (state, positions, seconds since the boundary before) at the last boundaries
    layer = 0
    while all(start[r] + layer * p[r] <= end[r] for r in range(num_ranks) if p[r]):
        ran_from = list(position)
        walk.advance([start[r] + layer * p[r] if p[r] else 0 for r in range(num_ranks)])
        # the slots the items just run produced (a step's outputs lead with their slot, -1 for none)
        live.update(output[0] for r in range(num_ranks) for step in plan[r][ran_from[r]:position[r]]
                    for output in step[3] if output[0] >= 0)
        # a slot stays live until its consumer has run (a consumer past the lists walked, when
        # they are the first part of a step's: ``first_repeat``, keeps it live)
        live = {slot for slot in live if slot not in consumer or position[consumer[slot][0]] <= consumer[slot][1]}
        marks.settle(timeline, offset_s)
        base_s = max(walk.clock_s)
        _shift_times(walk, live, -base_s)
        offset_s += base_s
        clock_s = walk.clock_s
        # a send, link or DP stream free before its rank's clock cannot delay anything the rank
        # does later (each later time is a max with a time past that clock): None, not its value
        state = (tuple(position[r] - layer * p[r] for r in range(num_ranks)), tuple(clock_s),
                 tuple(t if t > clock_s[r] else None for r, t in enumerate(walk.sends_done_s)),
                 tuple(t if t > clock_s[r] else None for r, t in enumerate(walk.dp.free_s)),
                 tuple(sorted((link, t if t > clock_s[link[0]] else None) for link, t in walk.link_free_s.items())),
                 tuple((slot - layer * q, walk.arrival_s[slot], walk.sent_s[slot]) for slot in sorted(live)))
        history.append((state, list(position), base_s))
        del history[:-(MAX_PERIOD + 1)]  # this boundary and the MAX_PERIOD before it
        layer += 1
        # the state may repeat the last boundary's (a period of one layer) or one a few layers
        # back, when the layers alternate (1F1B with sends that do not block, say)
        period = next((k for k in range(1, len(history)) if history[-1 - k][0] == state), None)
        if period is None:
            continue
        # the last ``period`` layers repeat the ones before: skip their images while the run
        # lasts, keeping the last to evaluate (so that every rank still ends on a record of its own)
        before = history[-1 - period][1]
        ran = [r for r in range(num_ranks) if position[r] > before[r]]
        if any(before[r] < start[r] for r in ran):
            continue
        per_block = tuple(position[r] - before[r] for r in range(num_ranks))
        shift = period * q
        cycle_s = sum(entry[2] for entry in history[-period:])  # the seconds the block's layers took
        if stop_at_repeat:
            return Repeat(tuple(position), per_block, shift, cycle_s)
        skip = min(((end[r] - position[r]) // per_block[r] for r in range(num_ranks) if per_block[r]), default=0)
        if skip < 1:
            continue
        for r in range(num_ranks):
            position[r] += skip * per_block[r]
        arrival_s, sent_s = walk.arrival_s, walk.sent_s
        moved = {slot + skip * shift: (arrival_s[slot], sent_s[slot]) for slot in live}
        for slot, (arrival, sent) in moved.items():
            arrival_s[slot], sent_s[slot] = arrival, sent
        live = set(moved)
        offset_s += skip * cycle_s
        layer += skip * period
        history.clear()
        timeline.skipped.append((skip, shift, cycle_s, per_block))
    if stop_at_repeat:
        return None
    marks.settle(timeline, offset_s)
    _shift_times(walk, live, offset_s)
    walk.advance()
    return walk.finish()
