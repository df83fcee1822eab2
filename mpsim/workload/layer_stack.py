"""From a layer stack and a layout to the work of each pipeline stage.

The stack's units (top-level layers and block repetitions, ``mpsim/specs/stack.py``)
are dealt out to the model chunks by ``layout.layers_per_chunk``; each unit becomes one
labelled block of ops per pass, exactly as a transformer layer does, so the cost model,
the engine, the memory report and the trace treat both model kinds alike. Recompute
applies to units without an embedding or a loss (the transformer's layers):
``selective`` re-runs attention cores, ``full`` keeps only the unit's input. A linear
layer tied to an embedding holds no weights of its own when both sit on the same stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from mpsim.specs.accelerator import BYTES_PER_ELEMENT
from mpsim.specs.layers import EmbeddingLayer, LinearLayer, numel
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.specs.stack import LayerStackSpec, stack_units, tied_embedding
from mpsim.specs.stack_tp import plan_tensor_parallel
from mpsim.workload.blocks import BlockWork, LayerContext
from mpsim.workload.layers import StackEnv, layer_work, local_elements, tokens_of
from mpsim.workload.stage_work import StageOptions, StageWork, Workload, unit_blocks


@dataclass(frozen=True)
class UnitWork:
    """One pipeline unit on one rank for one microbatch: its layers' work joined in order."""

    label: str
    work: BlockWork
    is_layer: bool  # recompute applies (no embedding, no loss)
    has_embedding: bool
    has_loss: bool
    input_bytes: float  # what full recompute keeps: the unit's input on this rank
    output_bytes: float  # the activation a pipeline cut after this unit sends, before TP scatter
    embeddings: tuple[str, ...] = ()  # names of its embedding layers
    tied: tuple[tuple[str, float], ...] = ()  # (embedding name, params) of its tied linear layers


def stack_env(scenario: Scenario, layout: Layout) -> StackEnv:
    """Per-rank options of a scenario's layer stack."""
    training = scenario.training
    gemm_bytes = BYTES_PER_ELEMENT[training.dtype]
    return StackEnv(microbatch_size=layout.microbatch_size, tp=layout.tp, sequence_parallel=layout.sequence_parallel,
                    flash_attention=training.attention == "flash", act_bytes=4 if gemm_bytes == 4 else 2,
                    gemm_in_bytes=gemm_bytes, wgrad_accumulate_bytes=training.grad_bytes,
                    tp_overlap_backward=training.tp_comm_overlap_backward,
                    tp_overlap_forward=training.tp_comm_overlap,
                    layers_impl=training.layers_impl, cross_entropy_fusion=training.cross_entropy_fusion,
                    fp32_loss=training.fp32_loss, norm_kernel=training.norm_kernel)


def _join(pieces: list[BlockWork]) -> BlockWork:
    """Layers in a row: forwards in order, backwards in reverse, the rest summed."""
    reverse = pieces[::-1]
    return BlockWork(
        forward=tuple(item for p in pieces for item in p.forward),
        backward=tuple(item for p in reverse for item in p.backward),
        backward_input=tuple(item for p in reverse for item in p.backward_input),
        backward_weight=tuple(item for p in reverse for item in p.backward_weight),
        recompute_selective=tuple(item for p in pieces for item in p.recompute_selective),
        params=sum(p.params for p in pieces), saved_bytes=sum(p.saved_bytes for p in pieces),
        selective_saved_bytes=sum(p.selective_saved_bytes for p in pieces),
        weight_grad_buffer_bytes=sum(p.weight_grad_buffer_bytes for p in pieces),
        param_tensors=tuple(n for p in reverse for n in p.param_tensors))


@lru_cache(maxsize=64)
def unit_works(stack: LayerStackSpec, env: StackEnv) -> tuple[UnitWork, ...]:
    """Every unit of the stack on one rank (cached: a stack of repeated blocks has few distinct units)."""
    plan = plan_tensor_parallel(stack, env.tp, env.sequence_parallel)
    works = []
    for index, (unit, modes) in enumerate(zip(stack_units(stack), plan)):
        pieces = [layer_work(env, placed, mode, first=index == 0 and i == 0)
                  for i, (placed, mode) in enumerate(zip(unit.layers, modes))]
        tied = tuple((p.layer.tie, piece.params) for p, piece in zip(unit.layers, pieces)
                     if isinstance(p.layer, LinearLayer) and p.layer.tie)
        embeddings = tuple(p.layer.name or "" for p in unit.layers if isinstance(p.layer, EmbeddingLayer))
        works.append(UnitWork(unit.label, _join(pieces), not (unit.has_embedding or unit.has_loss),
                              unit.has_embedding, unit.has_loss,
                              float(local_elements(env, unit.in_shape, "whole") * env.act_bytes),
                              float(env.microbatch_size * numel(unit.out_shape) * env.act_bytes), embeddings, tied))
    return tuple(works)


@lru_cache(maxsize=256)
def build_stack_stage(units: tuple[UnitWork, ...], options: StageOptions) -> StageWork:
    """Work of one model chunk made of ``units`` (cached: equal chunks share their work and costs)."""
    embeddings = {name for unit in units for name in unit.embeddings}
    forward, backward, backward_input, backward_weight = [], [], [], []
    params = activation = w_buffer = layer_params = layer_activation = largest = 0.0
    layer_index = 0
    # the model's last layer, when the loss is on this stage, may stay gathered for its backward
    layers = [index for index, unit in enumerate(units) if unit.is_layer]
    held_layer = layers[-1] if layers and any(u.has_loss for u in units) and not options.reshard_last_layer else None
    for index, unit in enumerate(units):
        work = unit.work
        # a head tied to an embedding on this stage reads the embedding's table
        unit_params = work.params - sum(p for name, p in unit.tied if name in embeddings)
        recompute = options.layer_recompute(layer_index) if unit.is_layer else "none"
        layer_index += unit.is_layer
        redo = {"full": work.forward, "selective": work.recompute_selective}.get(recompute, ())
        fwd, bwd, bwd_in, bwd_w = unit_blocks(unit.label, unit_params, work.forward, work.backward,
                                          work.backward_input, work.backward_weight, redo,
                                          replace(options, reshard_after_forward=False) if index == held_layer else options,
                                          work.param_tensors)
        forward.append(fwd)
        backward[:0] = list(bwd)
        backward_input[:0] = list(bwd_in)
        backward_weight[:0] = [bwd_w]
        kept = work.saved_bytes
        if unit.is_layer and recompute == "full":
            kept = unit.input_bytes
        elif unit.is_layer and recompute == "selective":
            kept = work.saved_bytes - work.selective_saved_bytes
        params += unit_params
        activation += kept
        w_buffer += work.weight_grad_buffer_bytes
        if unit.is_layer:
            layer_params += unit_params
            layer_activation += kept
            largest = max(largest, unit_params)
    return StageWork(len(units), any(u.has_embedding for u in units), any(u.has_loss for u in units),
                     tuple(forward), tuple(backward), tuple(backward_input), tuple(backward_weight), params, 0.0,
                     layer_params, activation, w_buffer, largest, layer_activation)


def stack_options(scenario: Scenario, layout: Layout, unsharding: bool = False) -> StageOptions:
    """The stage options a stack uses (recompute and ZeRO); the transformer-only ones stay empty
    (``unsharding``: of its passes that gather their parameters first)."""
    return StageOptions(recompute=scenario.parallel.recompute, vocab_local=0, learned_positions=False, norm_params=0,
                        bias=False, tied_embeddings=False, mla=None, moe=None,
                        shard_params=layout.state_zero_stage >= 3 or unsharding,
                        grad_bytes=scenario.training.grad_bytes, reshard_after_forward=layout.reshard_after_forward,
                        reshard_last_layer=layout.reshard_last_layer,
                        scatter_grads=not unsharding,
                        accumulate_grads=scenario.training.layers_impl == "pytorch",
                        recompute_layers=scenario.parallel.recompute_num_layers)


def widest_context(stack: LayerStackSpec, env: StackEnv) -> LayerContext:
    """The context of the largest input a TP all-gather re-assembles (what sequence parallelism buffers)."""
    best = (1, 1)
    for unit, modes in zip(stack_units(stack), plan_tensor_parallel(stack, env.tp, env.sequence_parallel)):
        for placed, mode in zip(unit.layers, modes):
            if mode in ("column", "heads") and len(placed.in_shape) >= 1:
                rows, width = tokens_of(placed.in_shape), placed.in_shape[-1]
                if rows * width > best[0] * best[1]:
                    best = (rows, width)
    return env.context(*best)


def build_stack_workload(scenario: Scenario, layout: Layout, unsharding: bool = False) -> Workload:
    """Per-stage work of a layer stack for every model chunk of the layout (``unsharding``: with
    every pass gathering its parameters first)."""
    stack = scenario.model
    assert isinstance(stack, LayerStackSpec)
    env = stack_env(scenario, layout)
    units = unit_works(stack, env)
    options = stack_options(scenario, layout, unsharding)
    stages, outputs, cuts = [], [], []
    chains = layout.stage_chains
    scatter = scenario.training.pp_scatter_gather or layout.sequence_parallel
    for stage, count in enumerate(layout.layers_per_chunk):
        # a stage's units start after those of the earlier stages of its chain (chains.py)
        first = sum(layout.layers_per_chunk[chains.first(stage):stage])
        stages.append(build_stack_stage(units[first:first + count], options))
        first += count
        # what the stage's last unit outputs crosses the cut to the next stage of its chain
        outputs.append(float(units[first - 1].output_bytes / (layout.tp if scatter else 1)))
        if 0 < first < len(units):
            cuts.append(outputs[-1])
    # each cut sends its own activation; p2p_bytes is the largest, for what needs one size
    p2p = max(cuts, default=units[-1].output_bytes / (layout.tp if scatter else 1))
    vocab = tied_embedding(stack).num_embeddings if stack.tied_embeddings else 0
    return Workload(tuple(stages), widest_context(stack, env), vocab, float(p2p), tuple(outputs))


def stack_model_flops_per_sample(stack: LayerStackSpec) -> float:
    """Model FLOPs of one sample (forward + backward, no recompute), the transformer's convention.

    The backward of a layer with weights is twice its forward (input and weight
    gradients), as for the transformer's 3x; a custom layer uses its own backward FLOPs.
    """
    from mpsim.specs.layers import CustomLayer
    from mpsim.workload.layers import forward_flops_per_sample

    total = 0.0
    for unit in stack_units(stack):
        for placed in unit.layers:
            forward = forward_flops_per_sample(placed)
            layer = placed.layer
            if isinstance(layer, CustomLayer) and layer.backward_flops is not None:
                total += forward + layer.backward_flops
            else:
                total += 3 * forward
    return total
