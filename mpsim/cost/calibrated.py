"""Seconds from a calibration profile, for the cost model to use instead of the datasheet.

:class:`CalibratedCosts` answers the questions ``mpsim/cost/compute.py`` and
``mpsim/cost/actions.py`` ask, from measurements:

* a compute op: its measured seconds when the profile has that exact op (GEMM shape and
  operand layout, attention FLOPs, memory op name and bytes), else the profile's fitted
  curve (GEMM efficiency against FLOPs, the fused attention's fraction of peak, the
  per-name or overall streaming fit). Every op is then divided by the fitted
  ``efficiency_multiplier`` when the profile carries a fit from a real training job.
* a weight-gradient action (``W``): its ops' seconds times the measured slowdown of
  a weight-gradient pass run on its own (``compute.split_backward``), when measured.
* a collective: the alpha-beta fit of that kind on that group size; other group sizes
  scale the fit with the ring algorithm's step count and volume.
* point-to-point transfers: mpsim prices them from the system's scale-up link, so
  :meth:`CalibratedCosts.system` returns the system with that link replaced by the
  measured latency and bandwidth (the rest of the system file is kept).

A profile fitted from profiler traces (``source: trace``) covers less. GEMMs are priced
by shape from the fit of their math mode (``compute.gemm_fits``: the kernel time plus
the gap the trace showed between queued kernels), memory-bound ops from its streaming
fit plus the same gap, collectives from the lines of their kind on a known group size;
each only up to the largest size it was fitted on (``max_flops``, ``max_bytes``).
Everything else falls back to the datasheet model of the scenario's accelerator, op by
op: larger GEMMs and transfers, the optimizer step's streaming, attention (no trace here
has it), GEMMs in a dtype the trace did not run (a bf16 scenario priced with a tf32 fit
would be a guess), point-to-point sends when the trace's sends had no size, and
collective kinds it did not see. A measured profile always has those parts, so nothing
changes for it.
"""

from __future__ import annotations

from mpsim.cost.compute import ComputeModel
from mpsim.specs.calibration import CalibrationProfile, CollectiveFit


def gemm_layout(name: str, batch: int) -> str:
    """How a framework lays out the operands of the mpsim GEMM called ``name``.

    nn.Linear's forward multiplies by the transposed weight, its input gradient by the
    weight as stored, its weight gradient by the transposed output gradient. The speed
    of a CPU GEMM depends on this, so measured points are keyed by it.
    """
    if batch > 1:
        return "batched"
    if name.endswith(".dgrad"):
        return "dgrad"
    if name.endswith(".wgrad"):
        return "wgrad"
    return "forward"


def ring_terms(kind: str, ranks: int) -> tuple[float, float]:
    """(latency steps, bytes moved per byte of message) of a ring collective on ``ranks``."""
    n = ranks
    if kind == "all-reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    return float(n - 1), (n - 1) / n


class CalibratedCosts:
    """Lookups into one profile; built once per cost model."""

    def __init__(self, profile: CalibrationProfile, datasheet: ComputeModel | None = None):
        """``datasheet``: the scenario's :class:`~mpsim.cost.compute.ComputeModel` without a
        profile, which prices what the profile does not cover (None: everything must be covered)."""
        self.profile = profile
        self.datasheet = datasheet
        self.dtype = datasheet.dtype if datasheet is not None else compute_dtype(profile)
        compute = profile.compute
        fit = profile.fit
        self.efficiency_multiplier = fit.efficiency_multiplier if fit is not None else 1.0
        self.action_overhead_s = fit.action_overhead_s if fit is not None else 0.0
        # a weight-gradient pass run on its own, as the framework runs it, over its ops (splitbench.py)
        split = compute.split_backward
        self.weight_pass_slowdown = split.weight_slowdown if split is not None else 1.0
        self._gemm = {(tuple(p.shape), p.layout): p.seconds for p in compute.gemm_points}
        self._attention = {(p.direction, round(p.flops)): p.seconds for p in compute.attention_points if p.fused}
        self._memory = {(p.name, round(p.bytes)): p.seconds for p in compute.memory_points}
        self._gemm_fits = {fit.dtype: fit for fit in compute.gemm_fits}
        # a trace-fitted kernel is its duration; between dependent kernels the device idles
        # for the gap the trace showed between queued kernels (else the datasheet's overhead)
        launch = compute.launch
        self.kernel_gap_s = launch.queued_gap_s if launch is not None and launch.queued_gap_s is not None else (
            datasheet.overhead_s if datasheet is not None else 0.0)
        # the host's launch pace in the traced run (None: the profile did not see it, and its
        # fitted per-action overhead, if any, holds the framework's time instead)
        # per pass kind where the trace told its forward and backward threads apart, else pooled
        pooled = launch.host_interval_s if launch is not None else None
        self.host_launch_forward_s = (launch.host_interval_forward_s if launch is not None else None) or pooled
        self.host_launch_backward_s = (launch.host_interval_backward_s if launch is not None else None) or pooled
        # streaming bandwidth as the job sees it (the optimizer step is priced with it)
        if compute.memory_fit is not None and compute.memory_fit.max_bytes is None:
            self.stream_bandwidth = compute.memory_fit.bandwidth * self.efficiency_multiplier
        else:
            self.stream_bandwidth = self._need_datasheet("the streaming bandwidth").memory_bandwidth

    def _need_datasheet(self, what: str) -> ComputeModel:
        if self.datasheet is None:
            raise ValueError(f"the calibration profile has no {what} and no datasheet model was given")
        return self.datasheet

    def measured_s(self, op) -> float:
        """Seconds of a compute op as the microbenchmarks saw it (before the in-job multiplier)."""
        compute = self.profile.compute
        if op.kind == "gemm":
            batch = op.shape[0] if op.shape else 1
            exact = self._gemm.get((tuple(op.shape), gemm_layout(op.name, batch))) if op.shape else None
            if exact is not None:
                return exact
            if compute.gemm_curve is not None:
                bandwidth = compute.memory_fit.bandwidth if compute.memory_fit is not None else \
                    self._need_datasheet("streaming bandwidth").memory_bandwidth
                return max(compute.gemm_curve.seconds(op.flops), op.bytes / bandwidth)
            fit = self._gemm_fits.get(op.dtype or self.dtype)
            if fit is not None and op.shape is not None and not op.cast_bytes and fit.covers(op.flops):
                return fit.seconds(*op.shape) + self.kernel_gap_s
            return self._need_datasheet(f"GEMM fit for {op.dtype or self.dtype}").time(op)
        if op.kind == "attention":
            exact = self._attention.get((op.direction, round(op.flops)))
            if exact is not None:
                return exact
            curve = compute.attention_curve
            if curve is None or compute.gemm_curve is None:
                return self._need_datasheet("attention curve").time(op)
            fraction = curve.forward_fraction if op.direction == "forward" else curve.backward_fraction
            return op.flops / (compute.gemm_curve.peak_flops * fraction)
        if op.kind == "memory":
            exact = self._memory.get((op.name, round(op.bytes)))
            if exact is not None:
                return exact
            fit = compute.memory_by_name.get(op.name, compute.memory_fit)
            if fit is None or not fit.covers(op.bytes):
                return self._need_datasheet("memory-bound fit").time(op)
            seconds = fit.seconds(op.bytes)
            # a trace's streaming fit is kernel time: add the gap between kernels as for its GEMMs
            return seconds + self.kernel_gap_s if self.profile.source == "trace" else seconds
        raise ValueError(f"{op.name} is a {op.kind}, not a compute op")

    def op_seconds(self, op) -> float:
        """Seconds of a compute op inside a training step."""
        return self.measured_s(op) / self.efficiency_multiplier

    def p2p_s(self, message_bytes: float) -> float | None:
        """One point-to-point send of ``message_bytes``; None when the profile did not measure sends."""
        if message_bytes <= 0 or self.profile.links is None:
            return 0.0
        p2p = self.profile.links.p2p
        return p2p.seconds(message_bytes) if p2p is not None else None

    def _collective_fit(self, kind: str, ranks: int) -> CollectiveFit | None:
        """The fit of ``kind`` on the nearest group size (larger first), then the one fitted on the most
        kernels (a trace may hold one kind under several NCCL algorithms); fits of unknown groups price nothing."""
        fits = [f for f in (self.profile.links.collectives if self.profile.links else [])
                if f.kind == kind and f.ranks is not None]
        if not fits:
            return None
        return min(fits, key=lambda f: (abs(f.ranks - ranks), -f.ranks, -(f.kernels + len(f.points)),
                                        f.algorithm or "", f.protocol or ""))

    def collective_s(self, kind: str, message_bytes: float, ranks: int) -> float | None:
        """Seconds of a collective on ``ranks`` ranks; None when the profile cannot price it (the
        datasheet model then does)."""
        if self.profile.links is None:
            return None
        if ranks <= 1 or message_bytes <= 0:
            return 0.0
        fit = self._collective_fit(kind, ranks)
        if kind in ("send-recv", "all-to-all") and (fit is None or fit.ranks != ranks):
            p2p = self.p2p_s(message_bytes if kind == "send-recv" else message_bytes / ranks)
            return None if p2p is None else (ranks - 1) * p2p
        if fit is None:
            steps, volume = ring_terms(kind, ranks)
            p2p = self.p2p_s(volume * message_bytes / steps)
            return None if p2p is None else steps * p2p
        if not fit.covers(message_bytes):
            return None  # beyond the sizes a trace showed: the datasheet prices it
        if fit.ranks == ranks:
            return fit.seconds(message_bytes)
        steps, volume = ring_terms(kind, ranks)
        steps0, volume0 = ring_terms(kind, fit.ranks)
        bytes_s = message_bytes * volume / volume0 / fit.bandwidth if fit.bandwidth is not None else 0.0
        return fit.latency_s * steps / steps0 + bytes_s

    def system(self, system):
        """``system`` with its scale-up link set to the measured point-to-point latency and bandwidth.

        mpsim prices a pipeline send inside a node as the collective base latency plus
        one step latency plus bytes over the scale-up bandwidth; setting those to
        (0, latency, bandwidth) makes it the measured alpha-beta line.
        """
        if self.profile.links is None or self.profile.links.p2p is None:
            return system
        p2p = self.profile.links.p2p
        up = system.scale_up
        wanted = {"topology": "switch", "bandwidth_per_device": p2p.bandwidth, "efficiency": 1.0,
                  "step_latency": p2p.latency_s, "half_bandwidth_bytes": 0.0, "links_per_device": None,
                  "in_switch_reduction": None, "torus": None}
        up = up.model_copy(update={k: v for k, v in wanted.items() if k in type(up).model_fields})
        return system.model_copy(update={"scale_up": up, "collective_base_latency": 0.0})


def compute_dtype(profile: CalibrationProfile) -> str:
    """The dtype a profile's compute was measured in."""
    return profile.compute.dtype


def calibrated_costs(scenario) -> CalibratedCosts | None:
    """The calibrated costs of a scenario that names a profile (with the datasheet model of its
    accelerator for what the profile does not cover), else None."""
    profile = getattr(scenario, "calibration", None)
    if profile is None:
        return None
    datasheet = ComputeModel(scenario.cluster.system.accelerator, scenario.training.dtype,
                             attention_kernel=scenario.training.attention_kernel)
    return CalibratedCosts(profile, datasheet)
