"""What a pipeline stage does for one microbatch, whatever the model is made of.

A stage's work is four passes (forward, combined backward, input gradient, weight
gradient), each a tuple of blocks of ops, plus what it keeps in memory. Transformers
(``stages.py``) and layer stacks (``layer_stack.py``) are built into these same
structures from their own layers; :func:`unit_blocks` is the one place that turns a
layer's passes into blocks, with recompute and ZeRO-3's parameter gathers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from mpsim.schedules.actions import GATHERING
from mpsim.workload.blocks import LayerContext
from mpsim.workload.ops import Block, Op, Pass, collective, memory_op
from mpsim.workload.transformer import MLAShape, MoEShape


@dataclass(frozen=True)
class StageOptions:
    """Everything besides the layer shapes that decides a stage's work."""

    recompute: str
    vocab_local: int
    learned_positions: bool
    norm_params: int
    bias: bool
    tied_embeddings: bool
    mla: MLAShape | None
    moe: MoEShape | None
    # ZeRO-3 / FSDP: the parameters are sharded over the data-parallel ranks and gathered block by
    # block. Lower ZeRO stages shard only optimizer state and gradients, which change no op of a
    # stage, so layouts that differ only there share their stages (and the prices of their passes)
    shard_params: bool
    grad_bytes: int  # bytes per gradient element when reduced
    reshard_after_forward: bool = True  # with shard_params: gather the parameters again before the backward
    reshard_last_layer: bool = True  # with reshard_after_forward: the model's last layer too
    # with shard_params: reduce-scatter each backward's gradients; False: they accumulate unsharded and
    # are reduced once per step (FSDP under a pipeline, Layout.fsdp_pipelined)
    scatter_grads: bool = True
    # plain PyTorch: each backward adds every weight gradient into .grad (LayerContext.grad_accumulation_fused)
    accumulate_grads: bool = False
    # Megatron-Core's deferred LM-head weight gradients: the head stage's input-gradient pass is its
    # whole backward but the logits GEMM's weight gradient, its weight-gradient pass that GEMM alone
    # (mpsim/schedules/deferral.py)
    defer_head_wgrad: bool = False
    # fp8 runs: transformer layers on one pipeline rank over all its chunks (the model's layers
    # over the pipeline ranks), whose amaxes every chunk's reduction carries (fp8_scaling.py)
    rank_layers: float = 0.0
    # with recompute "full": the chunk's first this many layers recompute, the rest keep their
    # activations (Megatron's block method); None: every layer
    recompute_layers: int | None = None

    def layer_recompute(self, index: int) -> str:
        """The recompute of a chunk's ``index``-th transformer layer (from 0)."""
        if self.recompute_layers is not None and index >= self.recompute_layers:
            return "none"
        return self.recompute


@dataclass(frozen=True, eq=False)
class StageWork:
    """What one rank does for one model chunk and one microbatch, and what it keeps.

    Stages of equal work are one object (their builders are cached), and a StageWork
    compares and hashes by identity: it is a cheap dictionary key for "price this once".
    """

    layers: int
    has_embedding: bool
    has_head: bool
    forward: Pass
    backward: Pass  # combined input + weight gradient, recompute included
    backward_input: Pass  # recompute included
    backward_weight: Pass
    params: float  # dense parameters on one rank (embedding and head included)
    expert_params: float  # MoE expert parameters on one rank
    layer_params: float  # of all parameters, those of the transformer layers
    activation_bytes: float  # kept from F until B (or I), per microbatch
    weight_grad_buffer_bytes: float  # kept from I until W, per microbatch
    largest_layer_params: float  # the biggest unit ZeRO-3 gathers at once
    layer_activation_bytes: float  # of the activations, those of the transformer layers


# a pass's field of StageWork by its action kind
PASS_NAMES = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}


@dataclass(frozen=True)
class Workload:
    """Every stage's work plus the shapes the cost and memory models need."""

    stages: tuple[StageWork, ...]  # global stage order
    context: LayerContext
    vocab_padded: int
    p2p_bytes: float  # activation (or gradient) one rank sends to the next stage, per microbatch
    # per stage, what crosses the cut after it (its activation forward, the gradient back);
    # empty when every cut carries p2p_bytes (a transformer's layers all have one output size)
    cut_bytes: tuple[float, ...] = ()
    # FSDP resharding after the forward under a pipeline (Layout.fsdp_unsharding): per stage, the
    # same work with each pass gathering its parameters first, for the passes that do
    # (mpsim/schedules/unshard.py); empty otherwise
    unsharding: tuple[StageWork, ...] = ()

    def pass_of(self, stage: int, kind: str) -> Pass:
        """A stage's pass by the kind it is priced as: ``F``, ``B``, ``I``, ``W``, or one of the
        first three with ``+gather`` for the unsharding twin (``engine.core.duration_key``)."""
        works = self.unsharding if kind.endswith(GATHERING) else self.stages
        return getattr(works[stage], PASS_NAMES[kind.removesuffix(GATHERING)])

    def boundary_bytes(self, stage: int | None) -> float:
        """Bytes of one microbatch sent across the cut after ``stage`` (either way); the largest without one."""
        return self.cut_bytes[stage] if stage is not None and self.cut_bytes else self.p2p_bytes


# bytes per element of the parameters FSDP gathers and of the gradients autograd produces for them
# (bf16 mixed precision: FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16))
FSDP_PARAM_BYTES = 2


def _fsdp(label: str, params: float, options: StageOptions) -> tuple:
    """(gather, release) collectives of a block under ZeRO-3 / FSDP, or (None, None)."""
    if not options.shard_params or params <= 0:
        return None, None
    return (collective(f"{label}.fsdp_all_gather_params", "all-gather", "zero", params * FSDP_PARAM_BYTES),
            collective(f"{label}.fsdp_reduce_scatter_grads", "reduce-scatter", "zero", params * options.grad_bytes))


@lru_cache(maxsize=256)
def fsdp_copies(params: float, grad_bytes: int) -> tuple[Op, Op]:
    """The copies FSDP2 runs on the compute stream around a unit's collectives.

    After the all-gather, ``split_with_sizes_copy`` copies the gathered flat buffer into each
    parameter's own tensor (read and write every gathered byte); before the reduce-scatter,
    ``_chunk_cat`` copies the unit's gradients into one flat buffer of the reduce dtype,
    widening bf16 to fp32 on the way (``foreach_all_gather_copy_out`` and ``foreach_reduce``,
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). The copies into the gather's
    input and out of the scatter's output move the rank's shard, 1/N of it, and are left out.
    """
    return (memory_op("fsdp_all_gather_copy_out", params * FSDP_PARAM_BYTES * 2),
            memory_op("fsdp_reduce_scatter_copy_in", params * (FSDP_PARAM_BYTES + grad_bytes)))


# the items of a layer with FSDP's copies around them, one tuple for every twin layer (a pass
# prices a tuple once): ids of the original tuple and of the copies -> (them, with the copies)
_WITH_COPIES: dict[tuple[int, int, int], tuple[tuple, Op | None, Op | None, tuple]] = {}


def _around(items: tuple, before: Op | None, after: Op | None) -> tuple:
    """``items`` with ``before`` ahead of them and ``after`` behind (either may be None)."""
    if before is None and after is None:
        return items
    key = (id(items), id(before), id(after))
    found = _WITH_COPIES.get(key)
    if found is not None and found[0] is items and found[1] is before and found[2] is after:
        return found[3]
    if len(_WITH_COPIES) >= 4096:
        _WITH_COPIES.clear()
    wrapped = (*((before,) if before is not None else ()), *items, *((after,) if after is not None else ()))
    # the entry holds the objects, so their ids name them while it lives
    _WITH_COPIES[key] = (items, before, after, wrapped)
    return wrapped


def accumulate_grads(label: str, param_tensors: tuple[float, ...], options: StageOptions) -> tuple[Op, ...]:
    """Autograd's AccumulateGrad under plain PyTorch: each parameter tensor's fresh gradient
    added into ``.grad`` (read both, write the sum), one kernel per tensor per backward.

    Every backward pays it, as a loop that keeps ``.grad`` allocated between steps does
    (``zero_grad(set_to_none=False)``, or no reset, as the validation runs); with PyTorch's
    default ``set_to_none=True`` a step's first microbatch takes its gradient without a
    kernel, so mpsim charges one microbatch's adds too many per step there.
    """
    if not options.accumulate_grads:
        return ()
    return tuple(memory_op(f"{label}.accumulate_grad", 3.0 * elements * options.grad_bytes)
                 for elements in param_tensors if elements > 0)


def unit_blocks(label: str, params: float, forward, backward, backward_input, backward_weight, redo,
                options: StageOptions, param_tensors: tuple[float, ...] = ()
                ) -> tuple[Block, tuple[Block, ...], tuple[Block, ...], Block]:
    """(forward, backward, backward_input, backward_weight) blocks of one layer, head or embedding.

    Recompute re-runs the forward (full) or the attention core (selective) just before the
    backward, as Megatron's per-layer checkpointing does. Under ZeRO-3 the parameters are
    gathered for the forward and, when FSDP reshards after the forward (its default), again
    for the backward; with ``reshard_after_forward`` off they stay gathered from the forward
    to the backward, which gathers nothing (the memory report holds them meanwhile). The
    gradients are scattered after the backward that completes them, unless
    ``scatter_grads`` is off (reduced once per step instead).
    """
    gather, release = _fsdp(label, params, options)
    if not options.scatter_grads:
        release = None
    again = gather if options.reshard_after_forward else None
    accumulate = accumulate_grads(label, param_tensors, options)
    if accumulate:  # otherwise the layer's own tuples, which its twins share (a pass prices them once)
        backward, backward_weight = (*backward, *accumulate), (*backward_weight, *accumulate)
    copy_out, copy_in = fsdp_copies(params, options.grad_bytes) if gather is not None else (None, None)

    def block(category: str, items: tuple, gathers: Op | None, releases: Op | None = None) -> Block:
        """A block with FSDP's copy after its gather and before its reduce-scatter."""
        return Block(label, category, _around(items, copy_out if gathers is not None else None,
                                              copy_in if releases is not None else None), gathers, releases)

    fwd = block("forward", forward, gather)
    if redo:
        first = block("recompute", redo, again)
        bwd = (first, block("backward", backward, None, release))
        bwd_in = (first, block("backward", backward_input, None))
    else:
        bwd = (block("backward", backward, again, release),)
        bwd_in = (block("backward", backward_input, again),)
    return fwd, bwd, bwd_in, block("weight-grad", backward_weight, again, release)
