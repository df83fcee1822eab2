"""From a model and a layout to the work of each pipeline stage (model chunk).

Stage ``k`` of ``pp * vpp`` holds ``layers_per_chunk[k]`` transformer layers; stage 0
also holds the embedding and the last stage the final norm, LM head and loss. Stages
with the same contents share one :class:`StageWork` (a 126-layer model has a handful of
distinct stages), so costs are computed once per distinct stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from mpsim.specs.accelerator import BYTES_PER_ELEMENT
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.embedding import embedding_passes, head_passes, padded_vocab
from mpsim.workload.memory import (embedding_activation_bytes, head_activation_bytes, layer_activation_bytes,
                                   layer_weight_grad_buffer_bytes)
from mpsim.workload.ops import Block, Pass
from mpsim.workload.transformer import LayerContext, LayerPasses, layer_params, layer_passes


@dataclass(frozen=True)
class StageWork:
    """What one rank does for one model chunk and one microbatch, and what it keeps."""

    layers: int
    has_embedding: bool
    has_head: bool
    forward: Pass
    backward: Pass  # combined input + weight gradient, recompute included
    backward_input: Pass  # recompute included
    backward_weight: Pass
    params: float  # parameters on one rank
    layer_params: float  # of which transformer layers
    activation_bytes: float  # kept from F until B (or I), per microbatch
    weight_grad_buffer_bytes: float  # kept from I until W, per microbatch


@dataclass(frozen=True)
class Workload:
    """Every stage's work plus the shapes the cost and memory models need."""

    stages: tuple[StageWork, ...]  # global stage order
    context: LayerContext
    vocab_padded: int
    p2p_bytes: float  # activation (or gradient) one rank sends to the next stage, per microbatch


def layer_context(scenario: Scenario, layout: Layout) -> LayerContext:
    """Per-rank layer shapes for a scenario's model and layout."""
    model, training = scenario.model, scenario.training
    gemm_bytes = BYTES_PER_ELEMENT[training.dtype]
    return LayerContext(
        microbatch_size=layout.microbatch_size,
        seq_length=model.seq_length,
        hidden=model.hidden_size,
        heads=model.num_attention_heads,
        kv_heads=model.kv_heads,
        head_dim=model.dim_per_head,
        ffn_hidden=model.ffn_hidden_size,
        gated_ffn=model.gated_ffn,
        tp=layout.tp,
        sequence_parallel=layout.sequence_parallel,
        flash_attention=training.attention == "flash",
        dropout=model.dropout > 0,
        rope=model.position_embedding == "rope",
        act_bytes=4 if gemm_bytes == 4 else 2,  # fp8 GEMMs keep bf16 activations
        gemm_in_bytes=gemm_bytes,
        wgrad_accumulate_bytes=4 if training.fp32_grad_accumulation else 2,
        tp_overlap_backward=training.tp_comm_overlap_backward,
    )


def _layer_blocks(passes: LayerPasses, index: int, recompute: str
                  ) -> tuple[Block, tuple[Block, ...], tuple[Block, ...], Block]:
    """(forward, backward, backward_input, backward_weight) blocks of one layer.

    Recompute re-runs the forward (full) or the attention core (selective) just before the
    layer's backward, as Megatron's per-layer checkpointing does.
    """
    label = f"layer {index}"
    redo = {"full": passes.forward, "selective": passes.recompute_selective}.get(recompute, ())
    before = (Block(label, "recompute", redo),) if redo else ()
    return (Block(label, "forward", passes.forward),
            before + (Block(label, "backward", passes.backward),),
            before + (Block(label, "backward", passes.backward_input),),
            Block(label, "weight-grad", passes.backward_weight))


@lru_cache(maxsize=256)
def build_stage(ctx: LayerContext, layers: int, has_embedding: bool, has_head: bool,
                recompute: str, vocab_local: int, learned_positions: bool, norm_params: int, bias: bool,
                tied_embeddings: bool) -> StageWork:
    """Work of one model chunk; cached because most chunks of a model are alike."""
    layer = layer_passes(ctx)
    forward: list[Block] = []
    backward: list[Block] = []
    backward_input: list[Block] = []
    backward_weight: list[Block] = []
    params = 0.0
    activation = 0.0
    if has_embedding:
        emb = embedding_passes(ctx, learned_positions)
        forward.append(Block("embedding", "forward", emb.forward))
        params += vocab_local * ctx.hidden + (ctx.seq_length * ctx.hidden if learned_positions else 0)
        activation += embedding_activation_bytes(ctx)
    for i in range(layers):
        fwd, bwd, bwd_in, bwd_w = _layer_blocks(layer, i, recompute)
        forward.append(fwd)
        backward[:0] = list(bwd)  # backward runs the layers in reverse
        backward_input[:0] = list(bwd_in)
        backward_weight[:0] = [bwd_w]
    per_layer_params = layer_params(ctx, 2 if norm_params == 2 else 1, bias)
    layer_total = per_layer_params * layers
    params += layer_total
    activation += layer_activation_bytes(ctx, recompute) * layers
    w_buffer = layer_weight_grad_buffer_bytes(ctx) * layers
    if has_head:
        head = head_passes(ctx, vocab_local)
        forward.append(Block("lm head", "forward", head.forward))
        backward.insert(0, Block("lm head", "backward", head.backward))
        backward_input.insert(0, Block("lm head", "backward", head.backward_input))
        backward_weight.insert(0, Block("lm head", "weight-grad", head.backward_weight))
        params += norm_params * ctx.hidden
        if not (tied_embeddings and has_embedding):
            params += vocab_local * ctx.hidden  # untied, or a tied copy on the last stage
        activation += head_activation_bytes(ctx, vocab_local)
    if has_embedding:
        emb = embedding_passes(ctx, learned_positions)
        backward.append(Block("embedding", "backward", emb.backward))
        backward_input.append(Block("embedding", "backward", emb.backward_input))
        backward_weight.append(Block("embedding", "weight-grad", emb.backward_weight))
    return StageWork(layers, has_embedding, has_head, tuple(forward), tuple(backward), tuple(backward_input),
                     tuple(backward_weight), params, layer_total, activation, w_buffer)


def build_workload(scenario: Scenario, layout: Layout) -> Workload:
    """Per-stage work for every model chunk of the layout."""
    ctx = layer_context(scenario, layout)
    model = scenario.model
    vocab = padded_vocab(model.vocab_size, layout.tp)
    stages = []
    last = layout.num_stages - 1
    for stage, layers in enumerate(layout.layers_per_chunk):
        stages.append(build_stage(
            ctx, layers, stage == 0, stage == last, scenario.parallel.recompute, vocab // layout.tp,
            model.position_embedding == "learned", 2 if model.norm == "layernorm" else 1, model.linear_bias,
            model.tied_embeddings))
    scatter = scenario.training.pp_scatter_gather or layout.sequence_parallel
    p2p = ctx.tokens * ctx.hidden * ctx.act_bytes / (layout.tp if scatter else 1)
    return Workload(tuple(stages), ctx, vocab, float(p2p))
