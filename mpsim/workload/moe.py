"""The mixture-of-experts feed-forward block on one rank (Megatron-style token dispatch).

A router scores every token against every expert and keeps the top k. Tokens are
permuted by destination and sent to the expert-parallel ranks that hold their experts
(all-to-all over the EP group), optionally gathered over the expert tensor-parallel
group, run through each local expert's FC1/activation/FC2 as one grouped GEMM, and
sent back (a second all-to-all) to be un-permuted and weighted. Shared experts (every
token) run as a dense tensor-parallel MLP beside them.

The experts' activation and FC1 take the form the dense FFN's would (``ffn_activation``):
Megatron's fused kernel, its operators, or, in plain PyTorch with two projections
(torchtitan's ``GroupedExperts``: ``w1``, ``w3`` and ``w2``, each one tensor over the
experts, run by ``torch._grouped_mm``), a grouped GEMM for the gate and one for the value,
whose input gradients autograd sums.

Load imbalance is an input: the busiest expert-parallel rank receives
``load_imbalance`` times the mean number of tokens (at most ``capacity_factor`` times,
when a capacity is set and extra tokens are dropped); the busiest rank sets the pace.
Padded to capacity (Megatron-Core's drop-and-pad), every rank carries ``capacity_factor``
times the mean. Otherwise the host reads how many tokens go where once in every layer's
forward, and waits for the GPU to get there (:func:`host_sync`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mpsim.workload.blocks import (BlockWork, LayerContext, bias_dropout_add, bias_dropout_add_grad, linear,
                                   param_tensors)
from mpsim.workload.graphs import captured_ops, graphed_block
from mpsim.workload.norms import norm, norm_grad, norm_saved_bytes
from mpsim.workload.mlp import activation_ops, fc1_gemms, ffn_activation, mlp_items
from mpsim.workload.ops import Item, Op, Routing, collective, memory_op

# Transformer Engine's GroupedLinear launches its per-expert GEMMs round-robin over this many
# compute streams (num_compute_streams in transformer_engine/common/util/multi_stream.cpp, fixed
# in every 2.x release)
TE_GEMM_STREAMS = 4
# fp8 casts of the experts' inputs and output gradients in GroupedLinear (split_quantize,
# transformer_engine/pytorch/csrc/extensions/cast.cpp, TE 2.5-2.20): under delayed scaling one
# fused multi_cast_transpose launch per this many tensors (kMaxTensorsPerKernel in
# common/transpose/multi_cast_transpose.cu); under current scaling no fused kernel exists and
# each expert's tensor is quantized on its own (blocks.CURRENT_SCALING_CAST_KERNELS)
TE_MULTI_CAST_TENSORS = 64
# Kernels Megatron-Core launches around the experts (megatron/core/transformer/moe/ at d98e8a6,
# with Transformer Engine's fused router and permutation, as NVIDIA's recipes run them; the
# router's default auxiliary load-balancing loss):
# - the router after its GEMM: the fused score-and-top-k kernel, the auxiliary loss's scores, the
#   tokens per expert, the fused loss (a memset and two kernels) and two for its logging; in the
#   backward the top-k's and the scores' gradients, the loss's, the loss scaler's two and the sum
#   of the logits' two gradients
ROUTER_FORWARD_LAUNCHES = 8
ROUTER_BACKWARD_LAUNCHES = 6
# - the fused permutation (three passes building the row map, then the permute kernel; one
#   kernel back), and before it the alltoall dispatcher's six kernels counting tokens per rank
PERMUTE_LAUNCHES = 4
ALLTOALL_PREPROCESS_LAUNCHES = 6
# - with several local experts the alltoall dispatcher regroups the tokens it receives by expert
#   (sort_chunks_by_idxs: a map and the sort) and back after them (the split sizes' copy and the
#   two again); one kernel each in the backward
SORT_CHUNKS_LAUNCHES = 2
UNSORT_CHUNKS_LAUNCHES = 3
# - DeepEP under the flex dispatcher: the received indices made a map by PyTorch's operators
#   (_DeepepManager._indices_to_multihot): two zero fills, the mask, the masked indices (a
#   count, the indices, the gather), the row numbers, the mask's sum, repeat_interleave (a
#   cumulative sum, its total read back, the fill), two index_put, the masked probabilities
#   (three again) and the cast to bool
INDICES_TO_MULTIHOT_LAUNCHES = 17
# DeepEP's fp8 dispatch carries a float32 scale per 128 elements of each token (DeepSeek-V3's
# fine-grained 1 x 128 activation quantization, technical report Sec. 3.3.2)
FP8_SCALE_BLOCK = 128


@dataclass(frozen=True)
class MoEShape:
    """Routing and expert sizes of a MoE layer."""

    num_experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int
    capacity_factor: float | None
    load_imbalance: float
    router_groups: int = 1  # group-limited routing: groups of experts, of which each token picks
    router_group_topk: int = 1  # this many (1 and 1: any expert)
    padded: bool = False  # every expert's tokens padded to its capacity (TrainingOptions.moe_pad_to_capacity)

    @property
    def imbalance(self) -> float:
        """Tokens of the busiest rank over the mean, after capacity drops; padded, every rank's
        experts carry their whole capacity."""
        if self.capacity_factor is not None:
            return self.capacity_factor if self.padded else min(self.load_imbalance, self.capacity_factor)
        return self.load_imbalance


def host_sync(ctx: LayerContext, moe: MoEShape, routing: Op, permute: Op, dispatch: Op) -> tuple[Op, Op, Op]:
    """The forward's routing, permutation and dispatch ops, the host's wait for the token
    counts marked.

    A dispatch that does not pad every expert to its capacity sends and receives as many
    tokens as the router picked, a number the host must read before it can size the
    all-to-all and the experts' GEMMs. So it waits for the GPU once in every MoE layer's
    forward (and its recompute), and the kernels after run at the host's pace until it gets
    ahead again (``Op.host_waits``). Where each framework waits:

    * Megatron-Core's alltoall dispatcher (``MoEAlltoAllTokenDispatcher.preprocess`` and
      ``_maybe_dtoh_and_synchronize``, megatron/core/transformer/moe/token_dispatcher.py at
      d98e8a6). With EP or expert TP above 1 the counts are copied as permutation 1 begins
      and read before the all-to-all ("before_ep_alltoall"): the host, having launched the
      permutation, waits for the GPU to start it. A capacity that drops tokens makes it read
      them before the permutation ("before_permutation_1"), and with one rank and no
      capacity it reads them when the dispatch returns ("before_finish"): the host waits for
      the routing's or the permutation's end.
    * DeepEP (deep_ep Buffer.dispatch in csrc/legacy/buffer.hpp at dd758ca): the host spins
      until the notify kernel at the dispatch's start has written the received counts, unless
      a worst-case size is given, which Megatron-Core does not (fused_a2a.py: "the CPU will
      wait for GPU's signal to arrive"), then launches the dispatch itself: it waits for the
      end of what precedes it. Under Megatron-Core it then waits again, for the dispatch's
      end: its flex dispatcher turns the received expert indices into a map with boolean-mask
      indexing (``_DeepepManager._indices_to_multihot``), which reads a count back as PyTorch
      runs it; the permutation follows the dispatch.
    * HybridEP (``_HybridEPManager``, the same file) permutes inside its dispatch and hands the
      experts counts on the GPU, which ``TEGroupedMLP`` reads with ``.tolist()``
      (megatron/core/transformer/moe/experts.py): the host waits for the dispatch's end.
    * Plain PyTorch (torchtitan's expert parallel ``_token_dispatch``): the split sizes go to
      the host before the tokens' all-to-all, after the local sort, with EP above 1 only; one
      rank's experts take their offsets on the GPU.
    """
    if moe.padded or (ctx.layers_impl == "pytorch" and ctx.moe_dispatcher != "deepep" and ctx.ep == 1):
        return routing, permute, dispatch  # sizes fixed by the capacity, or kept on the GPU: nothing to read
    if ctx.moe_dispatcher == "hybridep" or (ctx.moe_dispatcher == "deepep" and ctx.layers_impl != "pytorch"):
        return routing, permute, replace(dispatch, host_waits="end")
    if ctx.moe_dispatcher == "deepep" or ctx.layers_impl == "pytorch":
        return routing, replace(permute, host_waits="end"), dispatch
    if moe.capacity_factor is not None:
        return replace(routing, host_waits="end"), permute, dispatch
    if ctx.ep > 1 or ctx.etp > 1:
        if "moe_preprocess" in ctx.cuda_graph_modules:
            # the counts' copy ends the captured preprocessing: the host, having launched the
            # graph, waits for all of it (the permutation included)
            return routing, replace(permute, host_waits="end"), dispatch
        return routing, replace(permute, host_waits="start"), dispatch
    return routing, replace(permute, host_waits="end"), dispatch


def expert_gemms(ctx: LayerContext, ops: tuple[Op, ...], experts: int) -> tuple[Op, ...]:
    """The local experts' GEMMs as the run launches them (``TrainingOptions.moe_grouped_gemm``).

    Multi-stream, as Transformer Engine's GroupedLinear runs them by default: one cuBLASLt GEMM
    per expert (``multi_stream_cublas_gemm`` in common/gemm/cublaslt_gemm.cu), four streams
    running four at a time, each GEMM a launch the host pays for (its own heuristic query and
    descriptors); the fp8 casts before them as the recipe runs them. Grouped: one kernel for all.
    """
    if ctx.moe_expert_gemms != "multi-stream":
        return ops
    def casts(op: Op) -> int:
        return op.cast_launches * experts if ctx.fp8_current_scaling else math.ceil(experts / TE_MULTI_CAST_TENSORS)
    return tuple(replace(op, launches=experts, streams=TE_GEMM_STREAMS, cast_launches=casts(op))
                 if op.kind == "gemm" else op for op in ops)


def moe_block(ctx: LayerContext, moe: MoEShape, bias: bool, norm_params: int) -> BlockWork:
    """The MoE half of a layer on one rank."""
    h, e = ctx.hidden, ctx.act_bytes
    tokens = ctx.norm_tokens  # routing works on the sequence-parallel shard
    local_experts = moe.num_experts // ctx.ep
    routed = tokens * moe.top_k * moe.imbalance * ctx.etp  # tokens this rank's experts process
    per_expert = max(1, math.ceil(routed / local_experts))
    activation = ffn_activation(ctx)  # the experts' FFN as the dense FFN's would run
    ffn_local = moe.expert_ffn // ctx.etp
    fc1_width = ffn_local * activation.up_projections

    megatron = ctx.layers_impl != "pytorch"
    alltoall = megatron and ctx.moe_dispatcher == "alltoall"
    router, router_dgrad, router_wgrad = linear(ctx, "moe.router", tokens, moe.num_experts, h, fp8=False)
    routing = memory_op("moe.topk", tokens * moe.num_experts * 4 * 3,
                        launches=ROUTER_FORWARD_LAUNCHES if megatron else 1)
    routing_grad = memory_op("moe.topk.grad", tokens * moe.num_experts * 4 * 3,
                             launches=ROUTER_BACKWARD_LAUNCHES if megatron else 1)
    hybridep = ctx.moe_dispatcher == "hybridep"  # its permutation a kernel of its dispatch's
    permute = memory_op("moe.permute", routed * h * e * 2, launches=(
        PERMUTE_LAUNCHES + (ALLTOALL_PREPROCESS_LAUNCHES if alltoall else 0) if megatron and not hybridep else 1))
    permute_grad = replace(permute, launches=1)
    unpermute = memory_op("moe.unpermute", routed * h * e * 2)
    # the received tokens regrouped by local expert, and back: each moves them once
    sort: list[Item] = []
    unsort: list[Item] = []
    if alltoall and local_experts > 1:
        sort = [memory_op("moe.sort_chunks", routed * h * e * 2, launches=SORT_CHUNKS_LAUNCHES)]
        unsort = [memory_op("moe.unsort_chunks", routed * h * e * 2, launches=UNSORT_CHUNKS_LAUNCHES)]
    sort_grad = [replace(op, launches=1) for op in sort]
    unsort_grad = [replace(op, launches=1) for op in unsort]
    send = tokens * moe.top_k * h * e * moe.imbalance
    # DeepEP sends a token once per node and GPU it reaches (the routing prices that), and may
    # dispatch it in fp8 (1 byte per element plus a scale per 128); the combine and both
    # gradients travel in bf16
    deduplicated = Routing(moe.num_experts, moe.top_k, moe.router_groups, moe.router_group_topk) \
        if ctx.moe_dispatcher in ("deepep", "hybridep") else None
    dispatched = tokens * moe.top_k * (h + 4 * math.ceil(h / FP8_SCALE_BLOCK)) * moe.imbalance \
        if ctx.moe_dispatch_fp8 else send
    dispatch = collective("moe.dispatch_all_to_all", "all-to-all", "ep", dispatched, deduplicated)
    combine = collective("moe.combine_all_to_all", "all-to-all", "ep", send, deduplicated)
    dispatch_grad = collective("moe.dispatch_all_to_all.grad", "all-to-all", "ep", send, deduplicated)
    combine_grad = collective("moe.combine_all_to_all.grad", "all-to-all", "ep", send, deduplicated)
    gather: list[Item] = []
    scatter: list[Item] = []
    if ctx.etp > 1:
        gathered = routed * h * e
        gather = [collective("moe.etp_all_gather", "all-gather", "etp", gathered)]
        scatter = [collective("moe.etp_reduce_scatter", "reduce-scatter", "etp", gathered)]
    gathered_tokens = per_expert * local_experts
    # one grouped GEMM, or the gate's and the value's, whose input gradients are summed before the tokens go back
    # the experts' inputs arrive in bf16 (the permuted tokens; the activation, Megatron's own
    # kernel, not Transformer Engine's): an fp8 GEMM casts them itself
    fc1, fc1_dgrad, fc1_wgrad = (expert_gemms(ctx, ops, local_experts) for ops in fc1_gemms(
        ctx, "moe.experts", per_expert, ffn_local, activation, batch=local_experts, input_cast=True,
        in_sequence_parallel=False))
    fc2, fc2_dgrad, fc2_wgrad = expert_gemms(ctx, linear(ctx, "moe.experts.fc2", per_expert, h, ffn_local,
                                                         batch=local_experts, input_cast=True,
                                                         in_sequence_parallel=False), local_experts)
    act, act_grad = activation_ops("moe.experts.act", gathered_tokens * ffn_local, e, activation)

    routing_fwd, permute_fwd, dispatch_fwd = host_sync(ctx, moe, routing, permute, dispatch)
    if ctx.moe_dispatcher == "deepep" and megatron:
        # the flex dispatcher permutes what arrived, after the indices became a map (int64
        # indices and fp32 probabilities, each moved about four times: traffic that hardly counts)
        multihot = memory_op("moe.indices_to_multihot", tokens * moe.top_k * (8 + 4) * 4,
                             launches=INDICES_TO_MULTIHOT_LAUNCHES)
        exchange: list[Item] = [dispatch_fwd, multihot, permute_fwd]
    elif hybridep:
        exchange = [dispatch_fwd, permute_fwd]
    else:
        exchange = [permute_fwd, dispatch_fwd]
    routed_fwd: list[Item] = [router, routing_fwd, *exchange, *gather, *sort, *fc1, act, fc2, *scatter,
                              *unsort, combine, unpermute]
    routed_in: list[Item] = [unpermute, combine_grad, *unsort_grad, *gather, fc2_dgrad, act_grad, *fc1_dgrad,
                             *scatter, *sort_grad, dispatch_grad, permute_grad, routing_grad, router_dgrad]
    routed_w: list[Item] = [fc2_wgrad, *fc1_wgrad, router_wgrad]
    routed_b: list[Item] = [unpermute, combine_grad, *unsort_grad, *gather, fc2_dgrad, fc2_wgrad, act_grad,
                            *fc1_dgrad, *fc1_wgrad, *scatter, *sort_grad, dispatch_grad, permute_grad, routing_grad,
                            router_dgrad, router_wgrad]

    shared_f: list[Item] = []
    shared_b: list[Item] = []
    shared_i: list[Item] = []
    shared_w: list[Item] = []
    shared_params = shared_saved = shared_wbuf = 0.0
    if moe.shared_ffn:
        shared_f, shared_b, shared_i, shared_w, shared_params, shared_saved, shared_wbuf, _ = mlp_items(
            ctx, "moe.shared", moe.shared_ffn // ctx.tp)

    head = [norm(ctx, "moe.norm")]
    tail = [bias_dropout_add(ctx, "moe.bda")]
    grad_head = bias_dropout_add_grad(ctx, "moe.bda")
    norm_in, norm_w = norm_grad(ctx, "moe.norm")
    local, mask = ctx.norm_tokens, 1 if ctx.dropout else 0
    expert_params = local_experts * (h * fc1_width + ffn_local * h)
    dense_params = h * moe.num_experts + shared_params + norm_params * h + (h if bias else 0)
    # the router, the experts' weights, the shared expert's two (or three), the norm, the output bias.
    # Megatron keeps each local expert's weights apart (TEGroupedMLP's weight0..n, SequentialMLP);
    # plain PyTorch's grouped experts hold each weight of all of them in one tensor (torchtitan)
    expert_fc1 = activation.fc1_tensors(h * fc1_width)
    if ctx.layers_impl == "pytorch":
        expert_tensors = (*(local_experts * part for part in expert_fc1), local_experts * ffn_local * h)
    else:
        expert_tensors = (*expert_fc1, ffn_local * h) * local_experts
    shared_width = moe.shared_ffn // ctx.tp if moe.shared_ffn else 0
    shared_fc1 = shared_width * activation.up_projections
    shared_tensors = (*activation.fc1_tensors(h * shared_fc1), shared_width * h) if shared_width else ()
    tensors = (h * moe.num_experts, *expert_tensors, *shared_tensors, *(h,) * norm_params, *((h,) if bias else ()))
    # the experts' input, and what their activation keeps (FC2's input among it)
    saved = (2 * local * h * e + tokens * moe.num_experts * 4 + gathered_tokens * h * e
             + gathered_tokens * ffn_local * e * activation.saved + shared_saved + local * h * mask
             + norm_saved_bytes(ctx))
    wbuf = (gathered_tokens * (h + fc1_width + ffn_local + h) * e + tokens * (h + moe.num_experts) * e
            + shared_wbuf)
    work = BlockWork(
        forward=(*head, *routed_fwd, *shared_f, *tail),
        backward=(*grad_head, *shared_b, *routed_b, *norm_in, *norm_w),
        backward_input=(*grad_head, *shared_i, *routed_in, *norm_in),
        backward_weight=(*shared_w, *routed_w, *norm_w),
        params=float(dense_params), expert_params=float(expert_params), saved_bytes=float(saved),
        weight_grad_buffer_bytes=float(wbuf), param_tensors=param_tensors(*tensors),
        # Megatron-Core's recompute modules: the pre-MLP norm, a module of its own in a MoE layer,
        # drops its output (the router's and the dispatch's input); moe_act drops the experts'
        # activation output (FC2's input)
        recompute_parts=(("layernorm", tuple(head), float(local * h * e)),
                         ("moe_act", (act,), float(gathered_tokens * ffn_local * e)),
                         # moe: a checkpoint of the whole MoE module (its input kept), dispatch,
                         # the host's wait for the counts and combine included; shared_experts:
                         # of the shared experts alone
                         ("moe", (*routed_fwd, *shared_f), float(saved - 2 * local * h * e - local * h * mask
                                                                 - norm_saved_bytes(ctx))),
                         ("shared_experts", tuple(shared_f), float(shared_saved))))
    # per-layer CUDA graphs (workload/graphs.py): the whole block padded to capacity, or its norm,
    # router and shared experts (TransformerLayer._forward_mlp up to MoELayer.router), with the
    # alltoall dispatcher's preprocessing and permutation where moe_preprocess is captured too
    if "moe" in ctx.cuda_graph_modules:
        return graphed_block(work)
    if "moe_router" in ctx.cuda_graph_modules:
        preprocess = [permute_fwd, permute_grad] if alltoall and "moe_preprocess" in ctx.cuda_graph_modules else []
        return graphed_block(work, captured_ops(head, router, routing_fwd, routing_grad, router_dgrad, router_wgrad,
                                                norm_in, norm_w, shared_f, shared_b, shared_i, shared_w, preprocess))
    return work
