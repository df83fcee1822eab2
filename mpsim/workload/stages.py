"""From a transformer and a layout to the work of each pipeline stage (model chunk).

Stage ``k`` of ``pp * vpp`` holds ``layers_per_chunk[k]`` transformer layers; stage 0
also holds the embedding and the last stage the final norm, LM head and loss. When the
schedule runs several pipelines (``layout.chains``: the bidirectional DualPipe), each
chain's first stage holds an embedding and its last stage a head, and a stage's layers
are numbered from its chain's start (block ``k`` of every chain is the same layers). A layer
stack model (``kind: stack``) is built by ``layer_stack.py`` into the same structures
(``stage_work.py``). On MoE
models the first ``moe.dense_layers`` layers have a dense FFN. Stages with the same
contents share one :class:`StageWork` (a 126-layer model has a handful of distinct
stages), so costs are computed once per distinct stage.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from mpsim.specs.accelerator import BYTES_PER_ELEMENT
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.blocks import BlockWork, LayerContext
from mpsim.workload.embedding import embedding_block, head_block, padded_vocab
from mpsim.workload.fp8_scaling import amax_reduction, fp8_gemms
from mpsim.workload.ops import Block
from mpsim.workload.stage_work import StageOptions, StageWork, Workload, unit_blocks
from mpsim.workload.transformer import LayerWork, MLAShape, MoEShape, layer_work


def layer_context(scenario: Scenario, layout: Layout) -> LayerContext:
    """Per-rank layer shapes for a scenario's model and layout."""
    model, training = scenario.model, scenario.training
    gemm_bytes = BYTES_PER_ELEMENT[training.dtype]
    mla = model.mla
    return LayerContext(
        microbatch_size=layout.microbatch_size,
        seq_length=model.seq_length,
        hidden=model.hidden_size,
        heads=model.num_attention_heads,
        kv_heads=model.kv_heads if mla is None else model.num_attention_heads,
        head_dim=model.dim_per_head if mla is None else mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        ffn_hidden=model.ffn_hidden_size,
        gated_ffn=model.gated_ffn,
        tp=layout.tp,
        sequence_parallel=layout.sequence_parallel,
        flash_attention=training.attention == "flash",
        dropout=model.dropout > 0,
        rope=model.position_embedding == "rope",
        act_bytes=4 if gemm_bytes == 4 else 2,  # fp8 GEMMs keep bf16 activations
        gemm_in_bytes=gemm_bytes,
        wgrad_accumulate_bytes=training.grad_bytes,
        tp_overlap_backward=training.tp_comm_overlap_backward,
        tp_overlap_forward=training.tp_comm_overlap,
        fp8_attention=training.fp8_attention,
        fp8_current_scaling=training.fp8_recipe == "current",
        ffn_activation=model.ffn_activation,
        layers_impl=training.layers_impl,
        norm_kernel=training.norm_kernel_for(model.norm),
        norm_kind=model.norm,
        cross_entropy_fusion=training.cross_entropy_fusion,
        fp32_loss=training.fp32_loss,
        ub_sms=tuple(sorted(training.tp_comm_overlap_sms.items())),
        activation_fusion=training.bias_activation_fusion,
        separate_ffn_projections=training.separate_ffn_projections,
        v_head_dim=None if mla is None else mla.v_head_dim,
        cp=layout.cp,
        cp_comm=layout.cp_comm,
        ep=layout.ep,
        etp=layout.etp,
        moe_dispatcher=training.moe_token_dispatcher,
        moe_dispatch_fp8=training.moe_dispatch_fp8,
        moe_expert_gemms=training.moe_expert_gemms,
        cuda_graph_modules=tuple(sorted(set(training.cuda_graph_modules))),
        recompute_modules=scenario.parallel.selective_modules,
    )


@lru_cache(maxsize=256)
def build_stage(ctx: LayerContext, layers: int, dense_layers: int, has_embedding: bool, has_head: bool,
                options: StageOptions) -> StageWork:
    """Work of one model chunk (the first ``dense_layers`` of its layers have a dense FFN); cached."""
    dense = layer_work(ctx, options.mla, None, options.bias, options.norm_params)
    sparse = layer_work(ctx, options.mla, options.moe, options.bias, options.norm_params) if options.moe else dense
    works = [dense if i < dense_layers else sparse for i in range(layers)]
    parts: list[tuple[str, BlockWork | LayerWork]] = []
    if has_embedding:
        parts.append(("embedding", embedding_block(ctx, options.vocab_local, options.learned_positions)))
    parts += [(f"layer {i}", work) for i, work in enumerate(works)]
    deferred = has_head and options.defer_head_wgrad
    if has_head:
        parts.append(("lm head", head_block(ctx, options.vocab_local, options.norm_params,
                                            with_weights=not (options.tied_embeddings and has_embedding),
                                            defer_wgrad=deferred)))
    forward: list[Block] = []
    backward: list[Block] = []
    backward_input: list[Block] = []
    backward_weight: list[Block] = []
    # fp8: Transformer Engine reduces the amaxes after the chunk's last layer forward (before the
    # LM head's) and after its first layer's backward (before the embedding's)
    forward_amax, backward_amax = chunk_amax_reductions(ctx, works, options.rank_layers)
    params = expert = activation = w_buffer = 0.0
    layer_index = 0
    # the model's last layer (its backward comes right after the head's) may stay gathered
    last_layer = f"layer {layers - 1}" if has_head and not options.reshard_last_layer else None
    for label, work in parts:
        is_layer = isinstance(work, LayerWork)
        recompute = options.layer_recompute(layer_index) if is_layer else "none"
        layer_index += is_layer
        redo = {"full": work.forward, "selective": work.recompute_selective}.get(recompute, ())
        if recompute == "selective-op":
            redo = work.recompute_op
        unit = replace(options, reshard_after_forward=False) if label == last_layer else options
        fwd, bwd, bwd_in, bwd_w = unit_blocks(label, work.params + work.expert_params, work.forward, work.backward,
                                          work.backward_input, work.backward_weight, redo, unit,
                                          work.param_tensors)
        forward.append(fwd)
        if forward_amax is not None and label == f"layer {layers - 1}":
            forward.append(forward_amax)
        if backward_amax is not None and label == "layer 0":
            backward[:0] = [backward_amax]
            backward_input[:0] = [backward_amax]
        backward[:0] = list(bwd)  # the backward runs the parts in reverse
        if deferred and label != "lm head":
            # only the head's weight gradient waits: the other parts run their whole backward
            backward_input[:0] = list(bwd)
        else:
            backward_input[:0] = list(bwd_in)
            backward_weight[:0] = [bwd_w]
            w_buffer += work.weight_grad_buffer_bytes
        params += work.params
        expert += work.expert_params
        activation += work.activation_bytes(recompute) if is_layer else work.saved_bytes
    layer_total = sum(work.params + work.expert_params for work in works)
    largest = max([w.params + w.expert_params for w in works], default=0.0)
    layer_activation = sum(work.activation_bytes(options.layer_recompute(i)) for i, work in enumerate(works))
    return StageWork(layers, has_embedding, has_head, tuple(forward), tuple(backward), tuple(backward_input),
                     tuple(backward_weight), params, expert, layer_total, activation, w_buffer, largest,
                     layer_activation)


def chunk_amax_reductions(ctx: LayerContext, works: list[LayerWork], rank_layers: float
                          ) -> tuple[Block | None, Block | None]:
    """The forward and backward amax reductions that end a chunk of ``works`` in an fp8 run
    (None, None otherwise): the rank's amaxes, its ``rank_layers`` layers at this chunk's mean
    count of fp8 GEMMs per layer."""
    if not ctx.fp8 or not works or rank_layers <= 0:
        return None, None
    gemms, ops = (sum(counts) for counts in zip(*(fp8_gemms(work.forward) for work in works)))
    scale = rank_layers / len(works)
    rank_gemms, modules = round(gemms * scale), round(ops * scale)
    return (amax_reduction(ctx, "forward", rank_gemms, modules),
            amax_reduction(ctx, "backward", rank_gemms, modules))


def stage_options(scenario: Scenario, layout: Layout, vocab: int, unsharding: bool = False) -> StageOptions:
    """The non-shape inputs of every stage of a scenario (``unsharding``: of its passes that
    gather their parameters first, ``Workload.unsharding``)."""
    model, training = scenario.model, scenario.training
    moe = None
    if model.moe is not None:
        moe = MoEShape(model.moe.num_experts, model.moe.top_k, model.moe.expert_ffn_hidden_size,
                       model.moe.shared_ffn, model.moe.capacity_factor, model.moe.load_imbalance,
                       model.moe.router_groups or 1, model.moe.router_group_topk or 1,
                       training.moe_pad_to_capacity)
    mla = None
    if model.mla is not None:
        mla = MLAShape(model.mla.q_lora_rank, model.mla.kv_lora_rank, model.mla.qk_nope_head_dim,
                       model.mla.qk_rope_head_dim, model.mla.v_head_dim)
    return StageOptions(
        recompute=scenario.parallel.recompute, vocab_local=vocab // layout.tp,
        learned_positions=model.position_embedding == "learned", norm_params=2 if model.norm == "layernorm" else 1,
        bias=model.linear_bias, tied_embeddings=model.tied_embeddings, mla=mla, moe=moe,
        shard_params=layout.state_zero_stage >= 3 or unsharding, grad_bytes=training.grad_bytes,
        reshard_after_forward=layout.reshard_after_forward, reshard_last_layer=layout.reshard_last_layer,
        scatter_grads=not unsharding,
        accumulate_grads=training.layers_impl == "pytorch",
        defer_head_wgrad=training.defer_embedding_wgrad,
        rank_layers=sum(layout.layers_per_chunk) / layout.pp if training.dtype == "fp8" else 0.0,
        recompute_layers=scenario.parallel.recompute_num_layers)


def build_transformer_workload(scenario: Scenario, layout: Layout, unsharding: bool = False) -> Workload:
    """Per-stage work for every model chunk of a transformer's layout (``unsharding``: with
    every pass gathering its parameters first)."""
    ctx = layer_context(scenario, layout)
    vocab = padded_vocab(scenario.model.vocab_size, layout.tp)
    options = stage_options(scenario, layout, vocab, unsharding)
    dense_total = scenario.model.moe.dense_layers if scenario.model.moe else scenario.model.num_layers
    stages = []
    chains = layout.stage_chains
    # within one workload the context and options are fixed: a stage of the same shape is the
    # same object, found here without hashing both again (build_stage's cache hashes them)
    built: dict[tuple, StageWork] = {}
    first = 0  # index of the stage's first layer in the model (from the start of its chain)
    for stage, layers in enumerate(layout.layers_per_chunk):
        start = chains.first(stage)
        if stage == start:
            first = 0
        dense = max(0, min(layers, dense_total - first))
        shape = (layers, dense, stage == start, stage == chains.last(stage))
        work = built.get(shape)
        if work is None:
            work = built[shape] = build_stage(ctx, *shape, options)
        stages.append(work)
        first += layers
    scatter = scenario.training.pp_scatter_gather or layout.sequence_parallel
    p2p = ctx.tokens * ctx.hidden * ctx.act_bytes / (layout.tp if scatter else 1)
    return Workload(tuple(stages), ctx, vocab, float(p2p))
