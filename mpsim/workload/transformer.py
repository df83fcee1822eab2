"""One transformer layer on one rank: an attention block and a feed-forward block.

The feed-forward block is a dense MLP, or a mixture of experts on MoE layers. The layer
is the unit pipeline stages are made of; its passes are the blocks' passes in order
(the backward runs the blocks in reverse), and what it keeps for the backward pass
depends on the recompute policy:

* ``none``: every tensor the blocks save;
* ``selective``: all but the attention core's (its forward is re-run; Korthikanti et
  al. 2022);
* ``full``: only the layer's input (the whole forward is re-run).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from mpsim.workload.attention import MLAShape, attention_block
from mpsim.workload.blocks import BlockWork, LayerContext
from mpsim.workload.graphs import graphed_block
from mpsim.workload.mlp import mlp_block
from mpsim.workload.moe import MoEShape, moe_block
from mpsim.workload.ops import Item

__all__ = ["LayerContext", "LayerWork", "MLAShape", "MoEShape", "layer_work"]


@dataclass(frozen=True)
class LayerWork:
    """What one rank runs and keeps for one layer and one microbatch."""

    attention: BlockWork
    ffn: BlockWork
    layer_input_bytes: float  # what full recompute keeps
    recompute_modules: tuple[str, ...] = ("core_attn",)  # what selective recompute runs again

    @cached_property  # one tuple per layer: its twins in a stage share it (and its price)
    def forward(self) -> tuple[Item, ...]:
        return self.attention.forward + self.ffn.forward

    @cached_property
    def recompute_selective(self) -> tuple[Item, ...]:
        """What selective recompute runs again before the backward: the attention core
        (core_attn) and the parts of Megatron-Core's other recompute modules, in forward order."""
        core = self.attention.recompute_selective if "core_attn" in self.recompute_modules else ()
        return core + tuple(item for block in (self.attention, self.ffn) for module, items, _ in block.recompute_parts
                            if module in self.recompute_modules for item in items)

    @property
    def selective_dropped_bytes(self) -> float:
        """Bytes selective recompute spares the forward from keeping."""
        core = self.attention.selective_saved_bytes if "core_attn" in self.recompute_modules else 0.0
        return core + sum(dropped for block in (self.attention, self.ffn)
                          for module, _, dropped in block.recompute_parts if module in self.recompute_modules)

    @cached_property  # one tuple per layer, as the passes
    def recompute_op(self) -> tuple[Item, ...]:
        """What op-level selective recompute runs again (``mpsim/workload/op_recompute.py``)."""
        if self.attention.recompute_op is None or self.ffn.recompute_op is None:
            raise ValueError("op-level selective recompute needs dense layers with standard attention "
                             "(specs/layout_checks.py refuses the others)")
        return self.attention.recompute_op + self.ffn.recompute_op

    @cached_property  # one tuple per layer: its twins in a stage share it (and its price)
    def backward(self) -> tuple[Item, ...]:
        return self.ffn.backward + self.attention.backward

    @cached_property  # one tuple per layer: its twins in a stage share it (and its price)
    def backward_input(self) -> tuple[Item, ...]:
        return self.ffn.backward_input + self.attention.backward_input

    @cached_property  # one tuple per layer: its twins in a stage share it (and its price)
    def backward_weight(self) -> tuple[Item, ...]:
        return self.ffn.backward_weight + self.attention.backward_weight

    @property
    def params(self) -> float:
        """Dense parameters on this rank."""
        return self.attention.params + self.ffn.params

    @property
    def param_tensors(self) -> tuple[float, ...]:
        return self.ffn.param_tensors + self.attention.param_tensors

    @property
    def expert_params(self) -> float:
        return self.attention.expert_params + self.ffn.expert_params

    @property
    def weight_grad_buffer_bytes(self) -> float:
        return self.attention.weight_grad_buffer_bytes + self.ffn.weight_grad_buffer_bytes

    def activation_bytes(self, recompute: str) -> float:
        """Bytes kept from this layer's forward until its backward, per microbatch."""
        if recompute == "full":
            return self.layer_input_bytes
        if recompute == "selective-op":
            return self.attention.op_saved_bytes + self.ffn.op_saved_bytes
        saved = self.attention.saved_bytes + self.ffn.saved_bytes
        if recompute == "selective":
            saved -= self.selective_dropped_bytes
        return saved


@lru_cache(maxsize=64)
def layer_work(ctx: LayerContext, mla: MLAShape | None = None, moe: MoEShape | None = None, bias: bool = True,
               norm_params: int = 2) -> LayerWork:
    """Decompose one layer on one rank (cached: a model has few distinct layers)."""
    attention = attention_block(ctx, mla, bias, norm_params)
    ffn = moe_block(ctx, moe, bias, norm_params) if moe is not None else mlp_block(ctx, bias, norm_params)
    # per-layer CUDA graphs (a MoE block marks its own captured parts)
    if "attn" in ctx.cuda_graph_modules:
        attention = graphed_block(attention)
    if moe is None and "mlp" in ctx.cuda_graph_modules:
        ffn = graphed_block(ffn)
    return LayerWork(attention, ffn, float(ctx.norm_tokens * ctx.hidden * ctx.act_bytes), ctx.recompute_modules)
