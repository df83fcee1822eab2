"""The zero-bubble list scheduler over arrays, for numba to compile (``zb_list.py``).

The same loop as ``zb_list._ListScheduler``, step for step, on numpy arrays and plain
numbers, so that numba can compile it (``mpsim/jit.py``): a stage's inputs that have not
been placed are NaN instead of None, each stage's pending weight gradients a queue in a
row of an array, and the reference's heap of stage free times one (time, order of
arrival) pair per stage, scanned for the earliest: a stage is in the reference's heap at
most once, so the pairs are its entries, and the keys are distinct, so the scan picks the
stage ``heapq`` pops (a few dozen stages: the scan costs less than a heap's bookkeeping).
Every float operation is the reference's, in the reference's order. Nothing here may call
back into Python objects.
"""

from __future__ import annotations

import numpy as np

KIND_CODES = ("F", "I", "W")  # rows of duration_s and change; codes in the action arrays
FORWARD, INPUT_GRAD, WEIGHT_GRAD = 0, 1, 2
DONE, STALLED = 0, 1  # the loop's status


def list_schedule_arrays(duration_s, change, held, transfer_s, m, cap, ahead, weight_gap, forward_guard):
    """The heuristic for one setting of the knobs (``zb_list._ListScheduler.run``).

    ``duration_s`` and ``change`` are (3, pp): per kind (F, I, W) and stage, an action's
    seconds and what it adds to the stage's activations; ``held`` what a forward holds;
    ``ahead`` -1 for no cap. Returns (status, kinds, microbatches, counts, first start,
    last end, most pending, most held, most memory), the action arrays (pp, 3m) with
    ``counts`` filled per stage.
    """
    pp = held.shape[0]
    f_end = np.full((pp, m), np.nan)
    i_end = np.full((pp, m), np.nan)
    next_f = np.zeros(pp, dtype=np.int64)
    next_i = np.zeros(pp, dtype=np.int64)
    queue = np.zeros((pp, m), dtype=np.int64)  # pending weight gradients, in order
    queue_head = np.zeros(pp, dtype=np.int64)
    queue_tail = np.zeros(pp, dtype=np.int64)
    kinds = np.zeros((pp, 3 * m), dtype=np.int64)
    microbatches = np.zeros((pp, 3 * m), dtype=np.int64)
    counts = np.zeros(pp, dtype=np.int64)
    last_kind = np.full(pp, -1, dtype=np.int64)
    idle = np.zeros(pp)
    most_idle = 0.0
    first_start = np.full(pp, np.nan)
    last_end = np.zeros(pp)
    most_pending = np.zeros(pp, dtype=np.int64)
    most_held = np.zeros(pp, dtype=np.int64)
    memory = np.zeros(pp)
    most_memory = np.zeros(pp)
    # every stage free at 0, in stage order (the reference's first heap)
    free_t = np.zeros(pp)
    free_o = np.arange(pp, dtype=np.int64)
    waiting = np.ones(pp, dtype=np.bool_)  # the stage has an entry (a stage whose lists are done has none)
    order = pp
    idle_pops = 0
    soon = np.zeros(2)
    while True:
        # the earliest (time, order): the stage the reference's heap pops
        stage = -1
        for other_stage in range(pp):
            if waiting[other_stage] and (stage < 0 or free_t[other_stage] < free_t[stage] or (
                    free_t[other_stage] == free_t[stage] and free_o[other_stage] < free_o[stage])):
                stage = other_stage
        if stage < 0:
            break
        waiting[stage] = False
        now = free_t[stage]
        if next_i[stage] == m:  # the weight gradients left, back to back
            for position in range(queue_head[stage], queue_tail[stage]):
                kinds[stage, counts[stage]] = WEIGHT_GRAD
                microbatches[stage, counts[stage]] = queue[stage, position]
                counts[stage] += 1
                last_end[stage] += duration_s[WEIGHT_GRAD, stage]
            queue_head[stage] = queue_tail[stage]
            continue
        nf, ni = next_f[stage], next_i[stage]
        i_at = np.nan
        if ni < nf:
            if stage == pp - 1:
                i_at = f_end[stage, ni]
            else:
                end = i_end[stage + 1, ni]
                if end == end:
                    i_at = end + transfer_s
        pending = nf - ni
        f_open = nf < m and memory[stage] + held[stage] <= cap and (
            ahead < 0 or pending < 2 * (pp - 1 - stage) + 1 + ahead)
        f_at = np.nan
        if nf < m:
            if stage == 0:
                f_at = 0.0
            else:
                end = f_end[stage - 1, nf]
                if end == end:
                    f_at = end + transfer_s
        i_known, f_known = i_at == i_at, f_at == f_at
        i_ready = i_known and i_at <= now
        guard = forward_guard * duration_s[FORWARD, stage]
        f_ready = f_open and f_known and f_at <= now and not (ni == 0 and i_known and now < i_at and i_at < now + guard)
        kind, mb = -1, -1
        at = now
        if f_ready and (last_kind[stage] == INPUT_GRAD or not i_ready):
            kind, mb = FORWARD, nf
        elif i_ready:
            kind, mb = INPUT_GRAD, ni
        else:
            count = 0
            if i_known and i_at > now:
                soon[count] = i_at
                count += 1
            if f_open and f_known and f_at > now:
                soon[count] = f_at
                count += 1
            if queue_tail[stage] > queue_head[stage]:
                blocked = nf < m and not f_open and f_known and f_at <= now
                gap = np.inf
                if count > 0:
                    nearest = soon[0]
                    if count > 1 and soon[1] < nearest:
                        nearest = soon[1]
                    gap = nearest - now
                worst = idle[stage] + gap > most_idle
                if blocked or worst or gap >= weight_gap * duration_s[WEIGHT_GRAD, stage]:
                    kind, mb = WEIGHT_GRAD, queue[stage, queue_head[stage]]
                    queue_head[stage] += 1
            if kind < 0:  # wait: wake at the next known arrival, or when another stage moves on
                # the earliest time after now at which another stage is free (NaN: none)
                other = np.nan
                for other_stage in range(pp):
                    if waiting[other_stage] and free_t[other_stage] > now and (
                            other != other or free_t[other_stage] < other):
                        other = free_t[other_stage]
                later = count > 0 or other == other
                idle_pops = 0 if later else idle_pops + 1
                if idle_pops > pp + 1:  # every stage waits at the same moment for another: a bug
                    return STALLED, kinds, microbatches, counts, first_start, last_end, most_pending, most_held, \
                        most_memory
                wake = now
                if later:
                    wake = np.inf
                    for position in range(count):
                        if soon[position] < wake:
                            wake = soon[position]
                    if other == other and other < wake:
                        wake = other
                if next_i[stage] > 0 or next_f[stage] > 0:
                    idle[stage] += wake - now
                    most_idle = max(most_idle, idle[stage])
                at = wake
        if kind >= 0:  # place (stage, kind, mb) from now
            end = now + duration_s[kind, stage]
            if first_start[stage] != first_start[stage]:
                first_start[stage] = now
            last_end[stage] = end
            if kind != WEIGHT_GRAD:
                last_kind[stage] = kind
            kinds[stage, counts[stage]] = kind
            microbatches[stage, counts[stage]] = mb
            counts[stage] += 1
            memory[stage] += change[kind, stage]
            if kind == FORWARD:
                f_end[stage, mb] = end
                next_f[stage] = mb + 1
                pending = next_f[stage] - next_i[stage]
                most_pending[stage] = max(most_pending[stage], pending)
                most_held[stage] = max(most_held[stage], pending + queue_tail[stage] - queue_head[stage])
                most_memory[stage] = max(most_memory[stage], memory[stage])
            elif kind == INPUT_GRAD:
                i_end[stage, mb] = end
                next_i[stage] = mb + 1
                queue[stage, queue_tail[stage]] = mb
                queue_tail[stage] += 1
            at = end
        order += 1
        free_t[stage], free_o[stage], waiting[stage] = at, order, True
    return DONE, kinds, microbatches, counts, first_start, last_end, most_pending, most_held, most_memory
