"""Memory per rank: model state (weights, gradients, optimizer) and activations.

Activations follow the tensors each block saves for its backward pass (see
``attention.py``, ``mlp.py``, ``moe.py``), which for a GPT layer with GeLU, full
multi-head attention and dropout gives exactly Korthikanti et al. 2022, Table 2:
``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes with TP, ``34*s*b*h/t`` with TP + SP +
selective recompute, ``2*s*b*h`` (``/t`` with SP) with full recompute.

Model state under ZeRO (Rajbhandari et al. 2020) shards over the ``shard`` data-parallel
ranks: stage 1 the optimizer state, stage 2 also the gradients, stage 3 (FSDP full
shard) also the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.workload.transformer import LayerContext, layer_work

# optimizer state per parameter: fp32 master weight + Adam m and v, or bf16 m and v only
OPTIMIZER_BYTES_PER_PARAM = {"adam": 12, "adam-bf16": 4}


def layer_activation_bytes(ctx: LayerContext, recompute: str) -> float:
    """Bytes one dense MHA/GQA layer keeps from its forward until its backward, per microbatch."""
    return layer_work(ctx).activation_bytes(recompute)


@dataclass(frozen=True)
class ModelStateBytes:
    """Weights, gradients and optimizer state of the parameters one rank holds."""

    params: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def model_state_bytes(params: float, *, weight_bytes: int = 2, grad_bytes: int = 4, zero_stage: int = 0,
                      shard: int = 1, optimizer: str = "adam") -> ModelStateBytes:
    """Mixed-precision training state of ``params`` parameters, sharded per ZeRO stage over ``shard`` ranks."""
    optimizer_bytes = params * OPTIMIZER_BYTES_PER_PARAM[optimizer] / (shard if zero_stage >= 1 else 1)
    grads = params * grad_bytes / (shard if zero_stage >= 2 else 1)
    weights = params * weight_bytes / (shard if zero_stage >= 3 else 1)
    return ModelStateBytes(params, weights, grads, optimizer_bytes)
