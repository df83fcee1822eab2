"""From per-stage work to the seconds of each action.

Each pass of a stage (forward, combined backward, input-gradient, weight-gradient) is
priced op by op into an :class:`ActionCost`: its duration on the compute stream and the
segments inside it (compute ops, TP and CP collectives and how much of each hides under
compute, ZeRO-3 parameter gathers waited for). Stages that share their work share their
costs. Per-step costs (gradient buckets, optimizer, pipeline transfers) are in
``step.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mpsim.cost import shared_prices
from mpsim.cost.calibrated import calibrated_costs
from mpsim.cost.collectives import collective_time, gpu_group, p2p_time
from mpsim.cost.contention import end_beside, side_by_side_s
from mpsim.cost.compute import ComputeModel
from mpsim.cost.devices import RankDevice, pair_system, rank_devices
from mpsim.cost.dispatch import deduplicated_all_to_all_s
from mpsim.cost.groups import group_placements
from mpsim.cost.segments import BlockPart, Part, Segment, Segments, TemplateOp
from mpsim.schedules.actions import GATHERING
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.ops import Op, Overlap, Pass
from mpsim.workload.stage_work import Workload


@dataclass(frozen=True)
class ActionCost:
    """Seconds of one action and what they are made of."""

    duration_s: float
    compute_s: float
    tp_comm_s: float  # TP (and CP, EP) collectives inside the action
    tp_exposed_s: float  # of which not hidden under compute
    flops: float
    segments: Sequence[Segment]  # built when first read (segments.py)
    dp_exposed_s: float = 0.0  # waiting for ZeRO-3 parameter gathers
    async_dp: tuple[tuple[float, float, str], ...] = ()  # (ready fraction, seconds, label) on the DP stream
    exposed_by_group: tuple[tuple[str, float], ...] = ()  # exposed collective seconds per group (tp, cp, ep, ...)
    host_wait_s: float = 0.0  # the GPU idle, waiting for the host to launch the next kernel

    def exposed(self, *groups: str) -> float:
        """Exposed collective seconds of the named groups."""
        return sum(seconds for group, seconds in self.exposed_by_group if group in groups)


class _SlowedCompute:
    """A compute model whose ops take ``1 / speed`` times as long (a degraded device)."""

    def __init__(self, compute: ComputeModel, speed: float):
        self._compute, self._speed = compute, speed
        self.memory_bandwidth = compute.memory_bandwidth * speed

    def time(self, op: Op) -> float:
        return self._compute.time(op) / self._speed

    def pieces_time(self, op: Op, pieces: int) -> float:
        return self._compute.pieces_time(op, pieces) / self._speed


class CostModel:
    """Prices ops, collectives and passes for one scenario and layout.

    On a heterogeneous or degraded cluster each pipeline rank has its own device
    (``mpsim/cost/devices.py``): :meth:`on_rank` is the model that prices that rank's
    work, :meth:`between` the one that prices a send between two ranks. Without parts or
    faults both are this model itself.
    """

    def __init__(self, scenario: Scenario, layout: Layout, device: RankDevice | None = None):
        self.scenario = scenario
        self.layout = layout
        self.system = scenario.cluster.system if device is None else device.system
        # a calibration profile (scenario.calibration, docs/calibration.md) overrides the datasheet:
        # measured seconds per op, measured alpha-beta links (p2p through the system's scale-up
        # link, collectives in collective_s) and a fitted overhead per action (in price)
        self.calibration = calibrated_costs(scenario)
        if self.calibration is not None:
            self.system = self.calibration.system(self.system)
        self.compute = ComputeModel(self.system.accelerator, scenario.training.dtype, self.calibration,
                                    scenario.training.attention_kernel)
        self.compute_speed = 1.0 if device is None else device.compute_speed
        if self.compute_speed != 1.0:
            self.compute = _SlowedCompute(self.compute, self.compute_speed)  # type: ignore[assignment]
        self._devices: tuple[RankDevice, ...] | None = None
        self._rank_models: dict[int, CostModel] = {}
        self._pair_models: dict[tuple[int, int], CostModel] = {}
        self.placements = group_placements(layout)
        # share of the SMs a running collective takes from compute that overlaps it
        self.comm_sm_fraction = self.system.collective_sm_share()
        self._passes: dict[int, tuple[Pass, float, ActionCost]] = {}
        # seconds that depend on the scenario and layout alone, priced once per model (cost/step.py)
        self.per_step: dict[str, float] = {}
        # host seconds per kernel launch: a profile fitted from a trace measured the host's pace;
        # a measured profile's fitted per-action overhead already holds the framework's time,
        # so it is not charged twice
        if self.calibration is None:
            self.host_launch_forward_s = self.host_launch_backward_s = scenario.training.host_launch_interval
        else:  # forwards (Python, module by module) and backwards (the autograd engine) at their own pace
            self.host_launch_forward_s = self.calibration.host_launch_forward_s or 0.0
            self.host_launch_backward_s = self.calibration.host_launch_backward_s or 0.0

    def _rank_devices(self) -> tuple[RankDevice, ...] | None:
        """Each pipeline rank's device, or None when every rank is this model's healthy device."""
        scenario = self.scenario
        if scenario.cluster.parts is None and not scenario.faults.degraded:
            return None
        if self._devices is None:
            self._devices = rank_devices(scenario, self.layout)
        return self._devices

    def _healthy_base(self, device: RankDevice) -> bool:
        return device.part == 0 and device.compute_speed == 1.0 and device.system == self.scenario.cluster.system

    def on_rank(self, rank: int) -> "CostModel":
        """The model that prices pipeline rank ``rank``'s work (this one when it is a healthy base device)."""
        devices = self._rank_devices()
        if devices is None or self._healthy_base(devices[rank]):
            return self
        if rank not in self._rank_models:
            same = next((r for r in self._rank_models if devices[r] == devices[rank]), None)
            self._rank_models[rank] = self._rank_models[same] if same is not None else \
                CostModel(self.scenario, self.layout, devices[rank])
        return self._rank_models[rank]

    def between(self, rank_a: int, rank_b: int) -> "CostModel":
        """The model that prices a send or a two-rank collective between pipeline ranks ``rank_a`` and ``rank_b``."""
        devices = self._rank_devices()
        if devices is None:
            return self
        a, b = devices[rank_a], devices[rank_b]
        if a == b:
            return self.on_rank(rank_a)
        key = (min(rank_a, rank_b), max(rank_a, rank_b))
        if key not in self._pair_models:
            system = pair_system(a, b, self.scenario.cluster.between_parts)
            self._pair_models[key] = CostModel(self.scenario, self.layout, RankDevice(a.part, system, 1.0))
        return self._pair_models[key]

    def collective_s(self, op: Op) -> float:
        """Seconds of a collective op on its group."""
        assert op.collective is not None
        place = self.placements[op.group]
        if op.routing is not None:
            # DeepEP's kernels, not NCCL's all-to-all: a profile's fitted curves do not apply
            return deduplicated_all_to_all_s(op, gpu_group(place, self.system))
        measured = self.calibration.collective_s(op.collective, op.message_bytes, place.size) \
            if self.calibration is not None else None
        if measured is not None:
            return measured
        if op.collective == "send-recv":
            # a ring: every rank passes a block to its neighbour, size - 1 times
            return (place.size - 1) * p2p_time(op.message_bytes, place.nodes == 1, self.system)
        return collective_time(op.collective, op.message_bytes, place, self.system)

    def overlapped_s(self, compute_s: float, comm_s: float, overlap: Overlap | None = None) -> float:
        """Wall time of ``compute_s`` of work overlapped with a ``comm_s`` collective.

        Side by side (``overlap.chunks == 1``): the collective's kernels hold some SMs while
        it runs, so the compute beside it runs at ``1 - f`` of its speed until the
        collective ends. Pipelined in ``n`` pieces: the compute loses its ``f`` share for
        the whole time (Transformer Engine sets the SM margin aside for every piece), and
        the two stages' pieces follow each other, so the wall time is the first piece of
        one stage plus ``n - 1`` steps of the slower stage plus the last piece of the other
        (a ring exchange's first piece needs no communication: ``n - 1`` transfers feed
        the last ``n - 1`` computes). In steps (``overlap.piece_comm``): each piece of the
        compute runs side by side with its share of the collective, and the steps follow
        each other, so a transfer longer than its piece shows past it.
        """
        fraction = self.comm_sm_fraction
        if overlap is not None and overlap.comm_sms is not None:
            fraction = min(1.0, overlap.comm_sms / self.system.accelerator.compute_units)
        if overlap is not None and overlap.piece_comm:
            piece_s = compute_s / len(overlap.piece_comm)
            return sum(side_by_side_s(piece_s, comm_s * share, fraction) for share in overlap.piece_comm)
        chunks = overlap.chunks if overlap is not None else 1
        if chunks <= 1:
            return side_by_side_s(compute_s, comm_s, fraction)
        piece_s = compute_s / max(1e-12, 1.0 - fraction) / chunks
        if overlap.comm_first:
            return piece_s + (chunks - 1) * max(piece_s, comm_s / (chunks - 1))
        comm_piece_s = comm_s / chunks
        return piece_s + (chunks - 1) * max(piece_s, comm_piece_s) + comm_piece_s

    @property
    def weight_pass_slowdown(self) -> float:
        """How much slower a weight-gradient action runs than its ops (1 without a calibration profile)."""
        return self.calibration.weight_pass_slowdown if self.calibration is not None else 1.0

    def price(self, work: Pass, compute_scale: float = 1.0) -> ActionCost:
        """Duration and segments of a pass, its compute ops ``compute_scale`` times their own
        seconds (cached per pass object, and shared with other models while ``shared_prices.sharing``)."""
        cached = self._passes.get(id(work))
        if cached is not None and cached[0] is work and cached[1] == compute_scale:
            return cached[2]
        cost = self._price(work, compute_scale) if shared_prices.memo is None else \
            shared_prices.price(self, work, compute_scale)
        self._passes[id(work)] = (work, compute_scale, cost)
        return cost

    def _price(self, work: Pass, compute_scale: float) -> ActionCost:
        clock = compute = comm = exposed = flops = dp_wait = 0.0
        # The host launches the pass's kernels one after another, host_launch_forward_s apart in a
        # forward, host_launch_backward_s in the rest. After a synchronisation
        # (host_sync_between_passes) the pass starts with nothing queued, so no kernel starts
        # before its launch; otherwise the host is taken to run ahead, and only a pass whose
        # launches take longer than its kernels is held to the host's pace, until the host waits
        # for a kernel's result (Op.host_waits) and sets the pace from there.
        forward = any(block.category == "forward" for block in work)
        host = _Host(self.host_launch_forward_s if forward else self.host_launch_backward_s,
                     self.scenario.training.host_sync_between_passes)
        # such a pass is priced op by op where each block starts, not replayed
        in_place = host.paced or any(getattr(item, "host_waits", "") for block in work for item in block.items)

        by_group: dict[str, float] = {}
        previous_start = 0.0
        parts: list[Part] = []
        releases: list[tuple[float, float, str]] = []
        # ZeRO-3 / FSDP collectives in flight beside the blocks' compute, which they slow by the
        # SMs they hold (cost/contention.py): the next block's gather, prefetched when a block
        # starts, and the reduce-scatters of the blocks before, one after another on their stream
        share = self.comm_sm_fraction
        busy: list[tuple[float, float]] = []
        gather_s: dict[int, float] = {}
        scatter_free = 0.0
        # With the host ahead, a block's ops take the same time wherever the block starts, so a
        # stage's layers (one items tuple) are priced once and their steps replayed: the clock and
        # the totals advance by the same additions in the same order as pricing op by op would
        priced: dict[int, tuple[tuple, _BlockPrice]] = {}
        for position, block in enumerate(work):
            if block.gather is not None:
                # ZeRO-3 / FSDP: issued when the previous block started (prefetch)
                host.launch_ahead()
                seconds = gather_s.get(position)
                if seconds is None:
                    seconds = gather_s[position] = self.collective_s(block.gather)
                parts.append(Segment("dp", "dp-comm", f"{block.label} {block.gather.name}", previous_start, seconds))
                if previous_start + seconds > clock:
                    dp_wait += previous_start + seconds - clock
                    clock = previous_start + seconds
            previous_start = clock
            following = work[position + 1] if position + 1 < len(work) else None
            if share > 0 and following is not None and following.gather is not None:
                seconds = gather_s[position + 1] = self.collective_s(following.gather)
                busy.append((clock, clock + seconds))
            if in_place:
                # the host paces each op from where it is: priced in place, not replayed
                price, starts, clock_after = self._block_ops(block.items, clock, host, compute_scale)
            else:
                known = priced.get(id(block.items))
                if known is None or known[0] is not block.items:
                    known = priced[id(block.items)] = (block.items, self._block_ops(block.items, 0.0, _HOST_AHEAD,
                                                                                     compute_scale)[0])
                price = known[1]
                host.launch_ahead(price.launches)
                starts = []
                for step in price.steps:
                    starts.append(clock)
                    clock += step.span_s
            for step in price.steps:
                compute += step.compute_s
                comm += step.comm_s
                exposed += step.exposed_s
                flops += step.flops
                if step.group:
                    by_group[step.group] = by_group.get(step.group, 0.0) + step.exposed_s
            if in_place:
                clock = clock_after
            if busy:
                slowed = end_beside(previous_start, clock - previous_start, busy, share)
                dp_wait += slowed - clock
                clock = slowed
            parts.append(BlockPart(block.label, block.category, price.template, tuple(starts)))
            if block.release is not None:
                host.launch_ahead()
                seconds = self.collective_s(block.release)
                releases.append((clock, seconds, f"{block.label} {block.release.name}"))
                if share > 0:
                    scatter_free = max(clock, scatter_free) + seconds
                    busy.append((scatter_free - seconds, scatter_free))
        if not in_place and host.time_s > clock:
            # launch-bound: the GPU cannot finish the pass faster than the host launches it
            host.wait_s += host.time_s - clock
            clock = host.time_s
        if self.calibration is not None and self.calibration.action_overhead_s > 0:
            # the fitted fixed cost of one action in the framework (autograd, Python, p2p posting)
            overhead_s = self.calibration.action_overhead_s
            parts.append(Segment("compute", work[0].category if work else "forward", "action overhead",
                                 clock, overhead_s))
            clock += overhead_s
            compute += overhead_s
        async_dp = tuple((end / clock if clock > 0 else 1.0, seconds, label) for end, seconds, label in releases)
        return ActionCost(clock, compute, comm, exposed, flops, Segments(parts), dp_wait, async_dp,
                          tuple(sorted(by_group.items())), host.wait_s)

    def _block_ops(self, items: tuple, start: float, host: "_Host", compute_scale: float
                   ) -> tuple["_BlockPrice", list[float], float]:
        """One block's items run from ``start``: their steps (what each adds to the clock and the
        totals) and segment template, each item's start, and the clock after the last.

        ``host`` launches them: an op due at ``at`` starts at ``host.launch(at, launches)``."""
        clock = start
        steps: list[_Step] = []
        starts: list[float] = []
        template: list[TemplateOp] = []
        launches = 0
        for index, item in enumerate(items):
            if isinstance(item, Overlap):
                clock = host.launch(clock, item.comm.host_launches)
                launches += item.comm.host_launches
                starts.append(clock)
                comm_s = self.collective_s(item.comm)
                template.append(("tp", item.comm.name, index, 0.0, comm_s))
                busy = ops_s = item_flops = 0.0  # busy: the ops and any wait for their launches
                for op in item.compute:
                    busy = host.launch(clock + busy, op.host_launches) - clock
                    launches += op.host_launches
                    op_s = self.compute.pieces_time(op, item.chunks) * compute_scale
                    template.append(("compute", op.name, index, busy, op_s))
                    busy += op_s
                    ops_s += op_s
                    item_flops += op.flops
                span = self.overlapped_s(busy, comm_s, item)
                steps.append(_Step(span, ops_s, comm_s, max(0.0, span - busy), item_flops, item.comm.group))
            elif item.kind == "collective":
                clock = host.launch(clock, item.host_launches)
                launches += item.host_launches
                starts.append(clock)
                comm_s = self.collective_s(item)
                template.append(("tp", item.name, index, 0.0, comm_s))
                steps.append(_Step(comm_s, 0.0, comm_s, comm_s, 0.0, item.group))
            else:
                clock = host.launch(clock, item.host_launches)
                launches += item.host_launches
                starts.append(clock)
                op_s = self.compute.time(item) * compute_scale
                template.append(("compute", item.name, index, 0.0, op_s))
                steps.append(_Step(op_s, op_s, 0.0, 0.0, item.flops, ""))
            waits = "" if isinstance(item, Overlap) else item.host_waits
            if waits == "start":
                host.wait_for(clock)
            clock += steps[-1].span_s
            if waits == "end":
                host.wait_for(clock)
        return _BlockPrice(tuple(steps), tuple(template), launches), starts, clock


class _Host:
    """The CPU thread that launches a pass's kernels, ``launch_s`` apart.

    ``time_s`` is when it has launched everything so far, on the pass's clock. While it runs
    ahead of the GPU an op starts when the GPU is ready for it; once ``paced`` (the pass began
    after a synchronisation, or the host waited for a kernel's result) no op starts before
    its launch, and ``wait_s`` adds up what the GPU idles for them.
    """

    def __init__(self, launch_s: float, paced: bool):
        self.launch_s = launch_s
        self.paced = paced
        self.time_s = 0.0
        self.wait_s = 0.0

    def launch(self, at: float, launches: int = 1) -> float:
        """Start of the next op, due at ``at`` on the GPU, once its ``launches`` kernels are
        launched (its first starts after its last launch: the host pays all before it runs ahead)."""
        self.time_s += self.launch_s * launches
        if self.paced and self.time_s > at:
            self.wait_s += self.time_s - at
            return self.time_s
        return at

    def launch_ahead(self, launches: int = 1) -> None:
        """Launches that no op on the clock waits for (a prefetched gather, a block replayed)."""
        self.time_s += self.launch_s * launches

    def wait_for(self, gpu_s: float) -> None:
        """The host waits until the GPU reaches ``gpu_s`` on the pass's clock (``Op.host_waits``)
        and goes on from there, with nothing queued beyond what it had launched."""
        self.time_s = max(self.time_s, gpu_s)
        self.paced = True


class _HostAhead(_Host):
    """The host when it runs ahead of the GPU: every op starts when it is due."""

    def launch(self, at: float, launches: int = 1) -> float:
        return at

    def wait_for(self, gpu_s: float) -> None:
        pass


_HOST_AHEAD = _HostAhead(0.0, False)


@dataclass(frozen=True)
class _Step:
    """What one item of a block adds to a pass once it starts: its span, totals and the exposed
    seconds it adds to its collective's group ("" for a compute op)."""

    span_s: float
    compute_s: float
    comm_s: float
    exposed_s: float
    flops: float
    group: str


@dataclass(frozen=True)
class _BlockPrice:
    """A block's steps and segment template (``CostModel._block_ops``), and its kernel launches."""

    steps: tuple[_Step, ...]
    template: tuple[TemplateOp, ...]
    launches: int


def stage_costs(workload: Workload, model: CostModel, stage_to_rank: tuple[int, ...] | list[int]
                ) -> dict[tuple[int, str], ActionCost]:
    """(stage, kind) -> ActionCost for every stage and action kind, each stage priced on the
    device of its pipeline rank (``CostModel.on_rank``)."""
    costs: dict[tuple[int, str], ActionCost] = {}
    # stages of equal work on one device share one object (the workload builds one StageWork per
    # kind of stage; it is looked up by identity, which spares hashing all of its passes per stage)
    priced: dict[tuple[int, bool, int], tuple[ActionCost, ...]] = {}
    for stage, work in enumerate(workload.stages):
        here = model.on_rank(stage_to_rank[stage])
        found = priced.get((id(work), stage > 0, id(here)))
        if found is None:
            # the first stage has no input gradient to produce, so nothing is split there: its W
            # is the whole backward (torch.distributed.pipelining runs it that way)
            found = priced[(id(work), stage > 0, id(here))] = (
                here.price(work.forward), here.price(work.backward), here.price(work.backward_input),
                here.price(work.backward_weight, here.weight_pass_slowdown if stage > 0 else 1.0))
        costs[(stage, "F")], costs[(stage, "B")], costs[(stage, "I")], costs[(stage, "W")] = found
        if workload.unsharding:
            # the passes that gather the stage's parameters first (mpsim/schedules/unshard.py); a
            # weight-gradient pass never does
            gathering = workload.unsharding[stage]
            key = (id(gathering), stage > 0, id(here))
            found = priced.get(key)
            if found is None:
                found = priced[key] = (here.price(gathering.forward), here.price(gathering.backward),
                                       here.price(gathering.backward_input))
            for kind, cost in zip("FBI", found):
                costs[(stage, kind + GATHERING)] = cost
    return costs
