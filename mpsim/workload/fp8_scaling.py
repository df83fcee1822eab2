"""Transformer Engine's delayed scaling: the amax reduction after every fp8 forward and backward.

(Under current scaling, ``training.fp8_recipe: current``, none of this runs: each tensor's amax
is taken as it is cast, priced with the casts in ``blocks.linear``, and only the shards that
sequence parallelism gathers have their amaxes all-reduced, in ``blocks.gathered_gemm``.)

An fp8 GEMM needs a scale for each operand, and Transformer Engine's ``DelayedScaling``
recipe takes it from the largest magnitudes (amaxes) seen in earlier iterations. Every
rank holding a shard or a replica of a tensor must use the same scale, so the amaxes are
reduced across the ranks that share the weights: Megatron-Core hands its
``fp8_autocast`` the amax reduction group, tensor x data x context parallel
(``parallel_state.get_amax_reduction_group(with_context_parallel=True)``,
``transformer_block.py``, core_r0.9.0).

When that happens, in Transformer Engine 1.11 (``fp8.py``, ``module/base.py``):

* every fp8 module appends its amax row to one global buffer per direction, once: the
  buffer holds every fp8 module on the rank, of all its model chunks (the recipe and
  the group make the key, and they are the same for every chunk). A module of ``g``
  GEMMs holds ``3 g`` forward amaxes (input, weight, output) and ``2 g`` backward ones;
* at the exit of the outermost ``fp8_autocast`` (Megatron-Core opens one around each
  model chunk's transformer layers, for every microbatch) the forward buffer is
  concatenated (``torch.cat``: one kernel per 128 inputs, PyTorch's
  ``CAT_ARRAY_BATCH_SIZE``), all-reduced with MAX over the group (``async_op=False``:
  the compute stream waits for it) and handed to one fused kernel that rolls the amax
  histories and computes the new scales
  (``fused_amax_and_scale_update_after_reduction``);
* the backward does the same with the backward buffer in the backward of the chunk's
  first fp8 module (``reduce_and_update_bwd_fp8_tensors``), the last to run.

So each model chunk's forward and backward end with a latency-bound all-reduce of a few
kilobytes over a group that spans nodes at scale: 75 us per pass over 512 H100s (the
tree in NCCL's LL protocol, ``cost/nccl.py``).
Weights kept in fp8 (``training.fp8_params``) are reduced once more after the optimizer
step, once a step, which is left out. The fused update reads and writes each tensor's
amax history (``fp8_amax_history_len`` entries, 1,024 in NeMo's recipes: a few MB per
rank, about a microsecond), priced here as the launch it mostly is. Transformer stages
(``stages.py``) get the reductions; a layer stack's fp8 run is priced without them.
"""

from __future__ import annotations

from math import ceil

from mpsim.workload.blocks import AMAX_BYTES, LayerContext
from mpsim.workload.ops import Block, Item, Op, Overlap, collective, memory_op

# Transformer Engine 1.11, module/base.py (init_fp8_meta_tensors): amaxes per GEMM
FORWARD_AMAXES_PER_GEMM = 3  # input, weight, output
BACKWARD_AMAXES_PER_GEMM = 2  # output gradient, input gradient
CAT_INPUTS_PER_LAUNCH = 128  # PyTorch's CatArrayBatchedCopy (aten/src/ATen/native/cuda/Shape.cu)


def fp8_gemms(items: tuple[Item, ...]) -> tuple[int, int]:
    """(GEMMs, GEMM ops) of a pass that run in fp8 through Transformer Engine. A batched op
    counts each of its matrices among the GEMMs (a grouped linear holds one GEMM per local
    expert) and once among the ops, which stand for the modules holding them (at most:
    ``LayerNormMLP`` holds two)."""
    gemms = ops_count = 0
    for item in items:
        ops: tuple[Op, ...] = item.compute if isinstance(item, Overlap) else (item,)
        for op in ops:
            if op.kind == "gemm" and op.dtype == "" and op.shape is not None:
                gemms += op.shape[0]
                ops_count += 1
    return gemms, ops_count


def amax_reduction(ctx: LayerContext, category: str, rank_gemms: int, modules: int) -> Block | None:
    """The block that ends a chunk's forward (``category`` "forward") or backward: concatenate the
    rank's amaxes of that direction, all-reduce them over the amax group, update the scales.

    ``rank_gemms``: fp8 GEMMs on the rank, every chunk; ``modules``: the Transformer Engine
    modules holding them (the concatenation's inputs). None outside fp8 runs.
    """
    if not ctx.fp8 or ctx.fp8_current_scaling or rank_gemms <= 0:
        return None  # current scaling takes each tensor's amax as it casts it (blocks.linear)
    per_gemm = FORWARD_AMAXES_PER_GEMM if category == "forward" else BACKWARD_AMAXES_PER_GEMM
    amax_bytes = float(rank_gemms * per_gemm * AMAX_BYTES)
    direction = "forward" if category == "forward" else "backward"
    items = (
        memory_op(f"fp8 {direction} amax concat", 2 * amax_bytes,
                  launches=max(1, ceil(modules / CAT_INPUTS_PER_LAUNCH))),
        collective(f"fp8 {direction} amax all-reduce", "all-reduce", "amax", amax_bytes),
        # reads the reduced amaxes, writes the history's newest row, the scales and their inverses
        memory_op(f"fp8 {direction} amax and scale update", 4 * amax_bytes),
    )
    return Block("fp8 amax", category, items)
