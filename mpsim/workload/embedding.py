"""The embedding on the first pipeline stage and the LM head + loss on the last.

With vocabularies of 128K-256K tokens the logits GEMM and the vocab-parallel cross
entropy are a large share of the last stage, which is why real runs give the first and
last stages fewer layers. Both are split over TP by vocabulary (Megatron's
VocabParallelEmbedding and vocab-parallel cross entropy).
"""

from __future__ import annotations

from mpsim.workload.blocks import BlockWork, LayerContext, column_backward, linear, param_tensors
from mpsim.workload.norms import norm, norm_grad
from mpsim.workload.ops import Item, Op, collective, memory_op

# Megatron's vocab-parallel cross entropy (VocabParallelCrossEntropy) works on an fp32 copy of
# the logits, bytes per logit beyond reading the bf16 logits. Eager, each step is a pass over
# the [tokens, vocab/tp] buffer: the cast writes it (4), the max reads it (4), the subtraction
# and the exponential each read and write it in place (8 + 8), the sum reads it (4) and the
# normalisation reads and writes it (8). The backward multiplies the saved softmax by the loss
# gradient in place (8), and the cast back to the logits' dtype reads it (4) and writes the
# gradient (counted with the logits' dtype).
CROSS_ENTROPY_FWD_BYTES_PER_LOGIT = 36
CROSS_ENTROPY_BWD_BYTES_PER_LOGIT = 12
# Fused (--cross-entropy-loss-fusion; megatron/core/fusions/fused_cross_entropy.py), the same
# steps run as three compiled functions, one pass each: cast and max (write 4), subtract,
# exponential and sum (read 4, write 4), normalise (read 4, write 4); the backward as one
# function that reads the softmax, writes the product back into it (the function updates it in
# place) and writes the gradient in the logits' dtype.
FUSED_CROSS_ENTROPY_FWD_BYTES_PER_LOGIT = 20
FUSED_CROSS_ENTROPY_BWD_BYTES_PER_LOGIT = 8
# The share of the streaming rate these kernels reach over those bytes, (forward, backward), as
# published: Liger-Kernel's sweep of Megatron-Core's own functions on an H100 (LIGER-BENCH in
# docs/hardware-sources.md), bf16 logits, tensor parallelism 1, 8,192 tokens, at its largest
# vocabulary (131,072) where the per-kernel overheads weigh least: the bytes above at the part's
# streaming rate over the measured time less those overheads (python
# benchmarks/memory_kernel_sweep.py prints them; tests/test_memory_kernel_sweep.py holds these to
# it). The eager steps' row reductions (max, sum over the vocabulary) and the compiled functions'
# split reductions do not stream; the eager pass over the same bytes is the faster per byte. Taken
# as the code's on every accelerator, as no other part's sweep of these functions was found (the
# eager RMSNorm's shares, read the same way on an A100, price an H100 chain of the same operators
# within about a tenth: mpsim/workload/norms.py).
CROSS_ENTROPY_BANDWIDTH_SHARE = (0.83, 0.89)
FUSED_CROSS_ENTROPY_BANDWIDTH_SHARE = (0.64, 0.54)
# PyTorch's own loss, F.cross_entropy, in elements of the dtype it runs in per logit (fp32 after
# a cast when the logits are upcast first, as torchtitan's model and Hugging Face's own loss do:
# the cast reads the logits and writes fp32, its backward the reverse). Forward: log_softmax,
# whose kernel for rows too wide to hold in shared memory (aten/src/ATen/native/cuda/SoftMax.cu,
# cunn_SoftMaxForward) reads the row three times (max, sum of exponentials, the output pass) and
# writes it once (4); nll_loss reads one logit per token. The sweep below reads three passes at
# 32,768 fp32 logits a row and more (128 KB); narrower rows (16,384 and fewer) ran as kernels
# that keep the row on chip, which language-model vocabularies in fp32 do not get. Backward:
# nll_loss's backward zero-fills the gradient (1) and scatters one value per token;
# log_softmax's backward (cunn_SoftMaxBackward) sums the incoming gradient over the row, then
# reads it and the output and writes the gradient (4). Liger-Kernel's A100 sweep of
# torch.nn.CrossEntropyLoss on fp32 logits runs these bytes at the streaming rate
# (benchmarks/memory_kernel_sweep.py), so no share below it.
TORCH_CROSS_ENTROPY_FWD_ELEMENTS_PER_LOGIT = 4
TORCH_CROSS_ENTROPY_BWD_ELEMENTS_PER_LOGIT = 5
CROSS_ENTROPY_IMPLEMENTATIONS = ("megatron", "megatron_fused", "pytorch")


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Vocabulary padded the way Megatron does (to a multiple of 128 x tp)."""
    step = multiple * tp
    return -(-vocab // step) * step


def _table_grad(ctx: LayerContext, label: str, rows: int) -> tuple[Op, ...]:
    """The weight gradient of an embedding table of ``rows`` rows on one TP rank.

    Autograd's embedding backward (``embedding_dense_backward``) zeroes a dense gradient of
    the whole table and scatters the token gradients into their rows. Plain PyTorch then
    adds it into ``.grad`` (AccumulateGrad, :func:`stage_work.accumulate_grads`), at the
    gradient dtype. Megatron fuses gradient accumulation into its linear layers' GEMMs, not
    into the embedding's: the dense gradient comes in the parameter's dtype and Megatron's
    backward hook adds the whole table into ``main_grad`` (``param.main_grad.add_(param.grad.data)``
    in ``DistributedDataParallel._make_backward_post_hook``), reading both and writing the sum.
    """
    e, table, tokens = ctx.act_bytes, rows * ctx.hidden, ctx.tokens * ctx.hidden
    if not ctx.grad_accumulation_fused:
        acc = ctx.wgrad_accumulate_bytes
        return (memory_op(f"{label}.wgrad.zero", table * acc), memory_op(f"{label}.wgrad", tokens * (e + 2 * acc)))
    return (memory_op(f"{label}.wgrad.zero", table * e), memory_op(f"{label}.wgrad", tokens * 2 * e),
            memory_op(f"{label}.wgrad.main_grad_add", table * (e + 2 * ctx.wgrad_accumulate_bytes)))


def embedding_block(ctx: LayerContext, vocab_local: int, learned_positions: bool) -> BlockWork:
    """Token (and position) embedding lookup on one TP rank."""
    elems = ctx.tokens * ctx.hidden
    e = ctx.act_bytes
    forward: list[Item] = [memory_op("embedding.lookup", 2 * elems * e)]
    if learned_positions:
        forward.append(memory_op("embedding.positions", 3 * elems * e))
    backward_input: list[Item] = []
    if ctx.tp > 1:
        kind = "reduce-scatter" if ctx.sequence_parallel else "all-reduce"
        forward.append(collective(f"embedding.{kind.replace('-', '_')}", kind, "tp", ctx.activation_message))
        if ctx.sequence_parallel:
            backward_input.append(collective("embedding.grad_all_gather", "all-gather", "tp",
                                             ctx.activation_message))
    if ctx.dropout:
        local = ctx.norm_tokens * ctx.hidden
        forward.append(memory_op("embedding.dropout", local * (2 * e + 1)))
        backward_input.insert(0, memory_op("embedding.dropout.grad", local * (2 * e + 1)))
    backward_weight = list(_table_grad(ctx, "embedding", vocab_local))
    if learned_positions:
        backward_weight += _table_grad(ctx, "embedding.positions", ctx.seq_length)
    params = vocab_local * ctx.hidden + (ctx.seq_length * ctx.hidden if learned_positions else 0)
    saved = ctx.norm_tokens * ctx.hidden if ctx.dropout else 0  # the dropout mask
    tensors = (vocab_local * ctx.hidden, *((ctx.seq_length * ctx.hidden,) if learned_positions else ()))
    return BlockWork(tuple(forward), tuple(backward_input + backward_weight), tuple(backward_input),
                     tuple(backward_weight), params=float(params), saved_bytes=float(saved),
                     param_tensors=param_tensors(*tensors))


def cross_entropy_ops(name: str, n_logits: float, logit_bytes: int, implementation: str,
                      fp32: bool = True) -> tuple[Op, Op]:
    """The loss over ``n_logits`` logits on one rank, (forward, backward), as ``implementation``
    runs it: Megatron's vocab-parallel cross entropy eager (``megatron``) or fused
    (``megatron_fused``), or PyTorch's ``cross_entropy`` (``pytorch``) on an fp32 copy of the
    logits or, without ``fp32``, on the logits as they are."""
    if implementation == "megatron_fused":
        forward_share, backward_share = FUSED_CROSS_ENTROPY_BANDWIDTH_SHARE
        return (memory_op(name, n_logits * (logit_bytes + FUSED_CROSS_ENTROPY_FWD_BYTES_PER_LOGIT), launches=3,
                          bandwidth_share=forward_share),
                memory_op(f"{name}.grad", n_logits * (logit_bytes + FUSED_CROSS_ENTROPY_BWD_BYTES_PER_LOGIT),
                          bandwidth_share=backward_share))
    if implementation == "megatron":
        forward_share, backward_share = CROSS_ENTROPY_BANDWIDTH_SHARE
        return (memory_op(name, n_logits * (logit_bytes + CROSS_ENTROPY_FWD_BYTES_PER_LOGIT), launches=6,
                          bandwidth_share=forward_share),
                memory_op(f"{name}.grad", n_logits * (logit_bytes + CROSS_ENTROPY_BWD_BYTES_PER_LOGIT), launches=2,
                          bandwidth_share=backward_share))
    if implementation != "pytorch":
        raise ValueError(f"cross entropy implementation {implementation!r}: one of {CROSS_ENTROPY_IMPLEMENTATIONS}")
    loss_bytes = 4 if fp32 else logit_bytes
    # the fp32 cast each way unless the loss runs on the logits as they are: (bytes per logit, kernels)
    cast = (logit_bytes + 4, 1) if loss_bytes != logit_bytes else (0, 0)
    # forward: cast, log_softmax, nll_loss; backward: zero-fill, scatter, log_softmax's, the cast's
    forward = n_logits * (cast[0] + TORCH_CROSS_ENTROPY_FWD_ELEMENTS_PER_LOGIT * loss_bytes)
    backward = n_logits * (cast[0] + TORCH_CROSS_ENTROPY_BWD_ELEMENTS_PER_LOGIT * loss_bytes)
    return (memory_op(name, forward, launches=2 + cast[1]),
            memory_op(f"{name}.grad", backward, launches=3 + cast[1]))


def cross_entropy_implementation(layers_impl: str, fusion: bool) -> str:
    """Whose loss the run computes: PyTorch's under plain PyTorch layers, else Megatron's."""
    if layers_impl == "pytorch":
        return "pytorch"
    return "megatron_fused" if fusion else "megatron"


def loss_items(name: str, rows: int, n_logits: float, logit_bytes: int, implementation: str, fp32: bool,
               tp: int) -> tuple[list[Item], Op, float]:
    """The loss over ``rows`` rows of ``n_logits`` logits on this rank (classes split over ``tp``):
    (forward items, backward op, bytes kept for the backward: the log-softmax)."""
    forward, grad = cross_entropy_ops(name, n_logits, logit_bytes, implementation, fp32)
    items: list[Item] = [forward]
    if tp > 1:
        # max, sum of exponentials and target logit are all-reduced over the vocab shards (as
        # torchtitan's loss_parallel does for PyTorch's loss); Megatron's fused path all-reduces the
        # last two as one tensor
        reductions = (("max", 1), ("target_and_sum", 2)) if implementation == "megatron_fused" \
            else (("max", 1), ("sum", 1), ("target", 1))
        items += [collective(f"{name}.all_reduce_{what}", "all-reduce", "tp", rows * 4 * count)
                  for what, count in reductions]
    return items, grad, n_logits * (4 if fp32 or implementation != "pytorch" else logit_bytes)


def head_block(ctx: LayerContext, vocab_local: int, norm_params: int, with_weights: bool,
               defer_wgrad: bool = False) -> BlockWork:
    """Final norm, logits GEMM and vocab-parallel cross entropy on one TP rank.

    ``with_weights`` is False when the LM head shares the embedding's table on this rank.
    ``defer_wgrad`` (Megatron-Core's deferred embedding weight gradients,
    ``mpsim/schedules/deferral.py``): the input-gradient pass is everything but the logits
    GEMM's weight gradient, the final norm's parameter gradients included, and the
    weight-gradient pass that GEMM alone, after its input is gathered again under sequence
    parallelism; what waits between them is the logits' gradient and the GEMM's input.
    """
    tokens, e = ctx.tokens, ctx.act_bytes
    logits, dgrad, wgrad = linear(ctx, "head.logits", tokens, vocab_local, ctx.hidden, fp8=False)
    gather = None
    forward: list[Item] = [norm(ctx, "head.norm")]
    if ctx.tp > 1 and ctx.sequence_parallel:
        gather = collective("head.all_gather", "all-gather", "tp", ctx.activation_message)
        forward.append(gather)
    implementation = cross_entropy_implementation(ctx.layers_impl, ctx.cross_entropy_fusion)
    loss, ce_grad, softmax_bytes = loss_items("head.cross_entropy", tokens, tokens * vocab_local, e, implementation,
                                              ctx.fp32_loss, ctx.tp)
    forward += [logits, *loss]
    combined, input_only, weight_only = column_backward(ctx, "head.logits", dgrad, wgrad, gather)
    norm_in, norm_w = norm_grad(ctx, "head.norm")
    params = norm_params * ctx.hidden + (vocab_local * ctx.hidden if with_weights else 0)
    # final norm input, LM-head input (as the norm hands it over: 1/tp of the tokens under
    # sequence parallelism, gathered again for the weight gradient) and the softmax the cross
    # entropy keeps
    saved = 2 * ctx.norm_tokens * ctx.hidden * e + softmax_bytes
    # kept for a split backward's weight pass: the logits GEMM's input as it arrives (1/tp of the
    # tokens under sequence parallelism, gathered again there) and the logits' gradient
    wbuf = (ctx.norm_tokens * ctx.hidden + tokens * vocab_local) * e
    tensors = (*(ctx.hidden,) * norm_params, *((vocab_local * ctx.hidden,) if with_weights else ()))
    if defer_wgrad:
        backward_input, backward_weight = (ce_grad, *input_only, *norm_in, *norm_w), tuple(weight_only)
    else:
        backward_input, backward_weight = (ce_grad, *input_only, *norm_in), (*weight_only, *norm_w)
    return BlockWork(tuple(forward), (ce_grad, *combined, *norm_in, *norm_w), backward_input,
                     backward_weight, params=float(params), saved_bytes=float(saved),
                     weight_grad_buffer_bytes=float(wbuf), param_tensors=param_tensors(*tensors))
