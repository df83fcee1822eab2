"""Cross-field rules a real framework enforces, and the layout they resolve to.

Pydantic checks each field on its own; this module checks the combinations that
Megatron-LM refuses at start-up (TP must divide the heads, the global batch must split
into microbatches over DP, ...). Each violation is an :class:`InputError` naming the
field to change and how.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.errors import InputError
from mpsim.specs.scenario import Scenario

ORDER_DIMS = ("tp", "dp", "pp")


@dataclass(frozen=True)
class Layout:
    """The resolved parallel layout: every derived number filled in."""

    tp: int
    pp: int
    dp: int
    vpp: int
    microbatch_size: int
    global_batch_size: int
    num_microbatches: int
    layers_per_chunk: tuple[int, ...]  # in global stage order, pp*vpp entries
    devices: int
    devices_per_node: int
    order: tuple[str, ...]  # innermost first
    sequence_parallel: bool

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages (model chunks) over all ranks."""
        return self.pp * self.vpp

    def stride(self, dim: str) -> int:
        """Distance in global rank between neighbours along ``dim``."""
        stride = 1
        for name in self.order:
            if name == dim:
                return stride
            stride *= getattr(self, name)
        raise KeyError(dim)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0 and d <= 64)


def resolve_layout(scenario: Scenario) -> Layout:
    """Check the plan against the model and cluster; return the resolved layout."""
    plan, model = scenario.parallel, scenario.model
    system = scenario.cluster.system
    devices = scenario.cluster.devices
    tp, pp, vpp = plan.tp, plan.pp, plan.vpp

    def fail(field: str, message: str) -> InputError:
        return InputError(message, field=field)

    if model.num_attention_heads % tp:
        raise fail("parallel.tp", f"tp={tp} does not divide model.num_attention_heads={model.num_attention_heads}; "
                                  f"use one of {_divisors(model.num_attention_heads)}")
    if model.kv_heads % tp:
        raise fail("parallel.tp", f"tp={tp} does not divide the model's {model.kv_heads} key/value heads "
                                  f"(num_query_groups); use one of {_divisors(model.kv_heads)}")
    if model.ffn_hidden_size % tp:
        raise fail("parallel.tp", f"tp={tp} does not divide model.ffn_hidden_size={model.ffn_hidden_size}")
    if plan.sequence_parallel and model.seq_length % tp:
        raise fail("parallel.sequence_parallel",
                   f"sequence parallelism splits the sequence over tp={tp}, but seq_length={model.seq_length} "
                   f"is not divisible by it")
    if tp > system.devices_per_node and not plan.allow_tp_across_nodes:
        raise fail("parallel.tp", f"tp={tp} spans more than one {system.name} node ({system.devices_per_node} devices); "
                                  f"lower tp or set parallel.allow_tp_across_nodes: true")
    if tp <= system.devices_per_node and system.devices_per_node % tp and not plan.allow_tp_across_nodes:
        raise fail("parallel.tp", f"tp={tp} does not divide the {system.devices_per_node} devices of a node, so some "
                                  f"TP groups would straddle two nodes; use one of {_divisors(system.devices_per_node)}")

    if devices % (tp * pp):
        raise fail("parallel", f"tp x pp = {tp} x {pp} = {tp * pp} does not divide the cluster's {devices} devices")
    dp = plan.dp if plan.dp is not None else devices // (tp * pp)
    if tp * pp * dp != devices:
        raise fail("parallel.dp", f"tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp}, but the cluster has "
                                  f"{devices} devices; set dp={devices // (tp * pp)} or omit it")

    per_step = dp * plan.microbatch_size
    if plan.global_batch_size % per_step:
        raise fail("parallel.global_batch_size",
                   f"global_batch_size={plan.global_batch_size} is not divisible by dp x microbatch_size = "
                   f"{dp} x {plan.microbatch_size} = {per_step}")
    num_microbatches = plan.global_batch_size // per_step

    num_chunks = pp * vpp
    if plan.layers_per_stage is None:
        if model.num_layers % num_chunks:
            raise fail("parallel.pp", f"{model.num_layers} layers do not split evenly over pp x vpp = {num_chunks} "
                                      f"model chunks; change pp/vpp or give parallel.layers_per_stage")
        layers = (model.num_layers // num_chunks,) * num_chunks
    else:
        layers = tuple(plan.layers_per_stage)
        if len(layers) != num_chunks:
            raise fail("parallel.layers_per_stage", f"has {len(layers)} entries, needs pp x vpp = {num_chunks}")
        if any(n < 0 for n in layers):
            raise fail("parallel.layers_per_stage", "layer counts must be >= 0")
        if sum(layers) != model.num_layers:
            raise fail("parallel.layers_per_stage",
                       f"sums to {sum(layers)} layers, but the model has num_layers={model.num_layers}")

    order = tuple(plan.order.split("-"))
    if sorted(order) != sorted(ORDER_DIMS):
        raise fail("parallel.order", f"{plan.order!r} must name each of {', '.join(ORDER_DIMS)} once, "
                                     f"innermost first, e.g. 'tp-dp-pp'")
    if scenario.training.dtype not in scenario.cluster.system.accelerator.peak_flops:
        raise fail("training.dtype", f"{scenario.training.dtype} has no peak_flops entry for "
                                     f"{scenario.cluster.system.accelerator.name}; use one of "
                                     f"{', '.join(scenario.cluster.system.accelerator.peak_flops)}")

    return Layout(
        tp=tp, pp=pp, dp=dp, vpp=vpp,
        microbatch_size=plan.microbatch_size,
        global_batch_size=plan.global_batch_size,
        num_microbatches=num_microbatches,
        layers_per_chunk=layers,
        devices=devices,
        devices_per_node=system.devices_per_node,
        order=order,
        sequence_parallel=plan.sequence_parallel and tp > 1,
    )
