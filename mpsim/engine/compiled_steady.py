"""The compiled loop's steady state: one period of rows evaluated, the repeated ones jumped.

``compiled.py`` visits a schedule's items as rows in a fixed order. For the loop without
records it orders them layer by layer, as ``steady.py`` walks, so that in a periodic
schedule the rows repeat too: past the warm-up, row ``R + P`` is row ``R`` again with
every microbatch moved up by ``q`` (same rank, same duration key, same link and transfer
key, input and output slots plus ``q``), where ``q`` and the items per rank of one layer
come from ``steady.py`` and ``P`` is their sum. Between row ``R`` and row ``R + 1`` the
whole state that decides the future is small: each rank's clock and sends-done time, each
link's free time, and the arrival of every slot produced before and consumed after (the
*live* slots). So the method of ``steady.py`` carries over to the arrays:

1. ``row_period`` (once per schedule, cached by the caller): the longest run of rows
   whose image ``P`` rows later matches, the boundaries ``B_k = B_0 + k P`` inside it,
   and the slots live at ``B_0``; it keeps only the boundaries at which the live slots
   are exactly those of ``B_0`` moved up by ``k q`` (checked on every slot's producer and
   consumer rows). A run shorter than ``steady.MIN_LAYERS`` periods is not used.
2. ``_evaluate_steady_py`` (compiled by numba): the loop of ``compiled.py`` without
   records. At each boundary it subtracts the latest clock from every time in the state
   (and adds it to an offset) and compares the state with those of the last
   ``MAX_CYCLICITY`` boundaries, bit for bit, live slots paired by position (a state may
   repeat only every few periods: uniform stages with transfers settle into a pattern
   over several layers). A send or link free no later than its rank's
   clock cannot delay anything (every later time is a max with a time past that clock),
   so it compares as "none", not by value. Equal rebased states run the same operations
   on the same numbers over image rows, so every later period repeats them exactly.
3. On a match ``j`` boundaries back it jumps over as many whole repetitions of those ``j``
   periods as fit before the last boundary: the live slots' times move to their slots plus
   the skipped periods times ``q``, the offset grows by as many repetitions, and the rows
   after it (the last periods and the cool-down) are evaluated as usual, their start and
   end stored as relative time plus offset.

Only ``records=False`` skips, and only where no row that is read afterwards (each rank's
last row, the rows that feed the DP streams) lies in the skipped periods: the caller
passes the last boundary it allows. Its times are taken on a power-of-two grid fine
enough that every time of the step is exact (``compiled._on_exact_grid``: each moves by
under 2^-54 of the step's serial sum), so that states which repeat in exact arithmetic
repeat bit for bit, where sums like 0.1 s would round differently as the clock grows.
Nothing else is approximated: the times are the full evaluation's to that grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpsim.engine.steady import MIN_LAYERS, _layers


# how many boundaries back a state is looked for: a steady state may repeat only every few
# periods (uniform stages with transfers settle into a pattern over several layers)
MAX_CYCLICITY = 32


@dataclass(frozen=True)
class RowPeriod:
    """Where a schedule's rows repeat (module doc, step 1)."""

    first_row: int  # B_0: the first boundary
    rows: int  # P: rows per period
    shift: int  # q: microbatches a period moves up
    boundaries: int  # K: boundaries B_0 .. B_K lie in the repeated run
    live: np.ndarray  # slots live at B_0, ascending; at B_k they are these plus k q
    rank_rows: tuple[int, ...]  # rows of each rank in one period


def _first_difference(a_lo, a_hi, b_lo, b_hi) -> int:
    """The first k >= 0 where membership in [a_lo, a_hi] and in [b_lo, b_hi] differs, over
    all pairs (an interval with hi < lo is empty); a large number where none does."""
    never = np.iinfo(np.int64).max
    a_lo, b_lo = np.maximum(a_lo, 0), np.maximum(b_lo, 0)
    a_empty, b_empty = a_hi < a_lo, b_hi < b_lo
    first = np.full(a_lo.shape, never, np.int64)
    first = np.where(a_empty & ~b_empty, b_lo, first)
    first = np.where(~a_empty & b_empty, a_lo, first)
    both = ~a_empty & ~b_empty
    first = np.where(both & (a_hi != b_hi), np.minimum(a_hi, b_hi) + 1, first)
    first = np.where(both & (a_lo != b_lo), np.minimum(a_lo, b_lo), first)
    return int(first.min()) if first.size else never


def row_period(schedule, plan, rank: np.ndarray, key: np.ndarray, needs: np.ndarray, gives: np.ndarray,
               link: np.ndarray, transfer: np.ndarray, slots: int) -> RowPeriod | None:
    """The repeated run of a schedule's rows (module doc, step 1), or None where there is none."""
    layers = _layers(schedule, plan)
    if layers is None:
        return None
    q, period = layers.shift, sum(layers.items)
    rows = rank.shape[0]
    if period == 0 or rows <= period:
        return None
    now, later = slice(0, rows - period), slice(period, rows)
    image = (rank[now] == rank[later]) & (key[now] == key[later]) & (link[now] == link[later]).all(axis=1) \
        & (transfer[now] == transfer[later]).all(axis=1)
    for columns in (needs, gives):
        moved = np.where(columns[now] >= 0, columns[now] + q, -1)
        image &= (moved == columns[later]).all(axis=1)
    # the longest run of rows with an image
    edges = np.diff(np.concatenate(([0], image.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if not starts.size:
        return None
    longest = int(np.argmax(ends - starts))
    first_row, run_end = int(starts[longest]), int(ends[longest])
    # boundary B_k compares its state with B_(k-1)'s and may stand for every later one while the
    # rows of the period before it have images: B_k <= run_end
    boundaries = (run_end - first_row) // period
    # slot s is live at B_k when its producer row < B_k <= its consumer row: for k in [lo, hi]
    producer = np.full(slots, -1, np.int64)
    consumer = np.full(slots, rows, np.int64)  # a slot nobody reads stays live to the end
    row_index = np.arange(rows, dtype=np.int64)
    for j in range(gives.shape[1]):
        sent = gives[:, j] >= 0
        producer[gives[sent, j]] = row_index[sent]
    for j in range(needs.shape[1]):
        read = needs[:, j] >= 0
        consumer[needs[read, j]] = row_index[read]
    lo = (producer - first_row) // period + 1
    hi = (consumer - first_row) // period
    lo[producer < 0], hi[producer < 0] = 1, 0  # a slot no row sends is never live
    # live(B_(k+1)) must be live(B_k) moved up by q: slot s at k against slot s + q at k + 1
    empty = np.ones(q, np.int64)
    lo_ext, hi_ext = np.concatenate((empty, lo, empty)), np.concatenate((empty - 1, hi, empty - 1))
    same_until = _first_difference(lo_ext[:slots + q], hi_ext[:slots + q], lo_ext[q:] - 1, hi_ext[q:] - 1)
    boundaries = min(boundaries, same_until)
    if boundaries < MIN_LAYERS:
        return None
    live = np.flatnonzero((producer >= 0) & (producer < first_row) & (consumer >= first_row)).astype(np.int64)
    rank_rows = np.bincount(rank[first_row:first_row + period], minlength=schedule.num_ranks)
    return RowPeriod(first_row, period, q, boundaries, live, tuple(rank_rows.tolist()))


def _evaluate_steady_py(rank, key, needs, gives, link, transfer, link_source, duration_s, transfer_s, num_ranks,
                        slots, blocking, first_row, period_rows, boundaries, shift, live):
    """``compiled._evaluate_py`` without records, jumping over repeated periods (module doc, steps 2-3).

    ``boundaries`` < 2 evaluates every row. Returns each row's absolute start and end (rows
    skipped are left unset), each rank's clock and sends-done time, the periods skipped and
    the cycle (seconds per period, their mean where the state repeats every few periods).
    """
    rows = rank.shape[0]
    num_links = link_source.shape[0]
    start = np.empty(rows)
    end = np.empty(rows)
    clock = np.zeros(num_ranks)
    sends_done = np.zeros(num_ranks)
    link_free = np.full(num_links, -np.inf)
    arrival = np.empty(slots)  # every slot is written before it is read (the rows' order says so)
    live_count = live.shape[0]
    depth = MAX_CYCLICITY
    # the states at the last ``depth`` boundaries, rebased, newest in slot k % depth, with each
    # boundary's base (the seconds from the boundary before it)
    last_clock = np.zeros((depth, num_ranks))
    last_sends = np.zeros((depth, num_ranks))
    last_links = np.zeros((depth, num_links))
    last_arrival = np.zeros((depth, live_count))
    last_base = np.zeros(depth)
    offset = 0.0
    skipped = 0
    cycle = 0.0
    k = 0
    boundary = first_row if boundaries >= 2 else -1
    row = 0
    while row < rows:
        if row == boundary:
            base = clock.max()
            moved = k * shift
            for r in range(num_ranks):
                clock[r] -= base
                sends_done[r] -= base
            for lk in range(num_links):
                link_free[lk] -= base
            for i in range(live_count):
                arrival[live[i] + moved] -= base
            offset += base
            # the state j boundaries back, for the smallest j it equals (0: none)
            period = 0
            for j in range(1, min(k, depth) + 1):
                old = (k - j) % depth
                same = True
                for r in range(num_ranks):
                    busy, was_busy = sends_done[r] > clock[r], last_sends[old, r] > last_clock[old, r]
                    if clock[r] != last_clock[old, r] or busy != was_busy or \
                            (busy and sends_done[r] != last_sends[old, r]):
                        same = False
                        break
                if same:
                    for lk in range(num_links):
                        r = link_source[lk]
                        busy, was_busy = link_free[lk] > clock[r], last_links[old, lk] > last_clock[old, r]
                        if busy != was_busy or (busy and link_free[lk] != last_links[old, lk]):
                            same = False
                            break
                if same:
                    for i in range(live_count):
                        if arrival[live[i] + moved] != last_arrival[old, i]:
                            same = False
                            break
                if same:
                    period = j
                    break
            groups = (boundaries - k) // period if period > 0 else 0
            if groups > 0:
                # the last ``period`` bases are one repetition's seconds
                repeat_s = base
                for j in range(1, period):
                    repeat_s += last_base[(k - j) % depth]
                skipped = groups * period
                cycle = repeat_s / period
                jump = skipped * shift
                for i in range(live_count):
                    last_arrival[0, i] = arrival[live[i] + moved]
                for i in range(live_count):
                    arrival[live[i] + moved + jump] = last_arrival[0, i]
                offset += groups * repeat_s
                row += skipped * period_rows
                boundary = -1
                continue
            slot_k = k % depth
            for r in range(num_ranks):
                last_clock[slot_k, r] = clock[r]
                last_sends[slot_k, r] = sends_done[r]
            for lk in range(num_links):
                last_links[slot_k, lk] = link_free[lk]
            for i in range(live_count):
                last_arrival[slot_k, i] = arrival[live[i] + moved]
            last_base[slot_k] = base
            k += 1
            boundary = first_row + k * period_rows if k <= boundaries else -1
        r = rank[row]
        now = clock[r]
        if blocking > 0 and sends_done[r] > now and (blocking == 1 or needs[row, 0] >= 0 or needs[row, 1] >= 0):
            now = sends_done[r]
        for j in range(2):
            slot = needs[row, j]
            if slot >= 0 and arrival[slot] > now:
                now = arrival[slot]
        start[row] = now + offset
        now = now + duration_s[key[row]]
        end[row] = now + offset
        for j in range(2):
            slot = gives[row, j]
            if slot >= 0:
                free = link_free[link[row, j]]
                begin = now if free < now else free
                finish = begin + transfer_s[transfer[row, j]]
                link_free[link[row, j]] = finish
                arrival[slot] = finish
                if finish > sends_done[r]:
                    sends_done[r] = finish
        clock[r] = now
        row += 1
    for r in range(num_ranks):
        clock[r] += offset
        sends_done[r] += offset
    return start, end, clock, sends_done, skipped, cycle
