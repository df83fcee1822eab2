"""LSTM, GRU and plain RNN layers as the kernels cuDNN runs for them.

A recurrent layer over ``T`` steps does two kinds of matrix work per direction:

* the input projection ``x_t W_ih`` for all steps at once, one large GEMM of
  ``batch * T`` rows (it does not depend on the recurrence);
* the recurrent projection ``h_{t-1} W_hh``, ``T`` small dependent GEMMs of ``batch``
  rows each, which is why recurrent layers run far below a GPU's peak: each step is a
  ``batch x hidden`` by ``hidden x gates*hidden`` product that cannot start before the
  previous step ends.

The recurrence is priced as one op carrying all ``T`` steps' FLOPs and bytes at the
efficiency of a single step's GEMM (its tile waves on the SMs); the kernel launch
overhead is counted once, as cuDNN's persistent kernels keep the weights on chip. The
gate nonlinearities and cell update are elementwise passes over the gate pre-activations.
The backward mirrors it: the recurrent input gradient (again ``T`` dependent steps),
the input-projection gradient, and both weight gradients as single GEMMs over all steps
(``dW_hh = sum_t dgates_t^T h_{t-1}``). Gates: LSTM 4, GRU 3, RNN 1 (Hochreiter and
Schmidhuber 1997; Cho et al. 2014; cuDNN's RNN documentation).
"""

from __future__ import annotations

from mpsim.specs.layers import RecurrentLayer
from mpsim.workload.blocks import BlockWork, param_tensors
from mpsim.workload.ops import Item, Op, gemm, memory_op


def _steps(name: str, steps: int, rows: int, width: int, depth: int, in_bytes: int, out_bytes: int) -> Op:
    """``steps`` dependent GEMMs of shape (rows x depth) @ (depth x width), as one op."""
    one = gemm(name, rows, width, depth, in_bytes=in_bytes, out_bytes=out_bytes)
    return Op(name, "gemm", flops=steps * one.flops, bytes=steps * one.bytes, shape=one.shape)


def recurrent_work(env, label: str, layer: RecurrentLayer, in_shape: tuple[int, ...]) -> BlockWork:
    """A (possibly deep, possibly bidirectional) recurrent layer on one rank, for one microbatch."""
    steps, features = in_shape
    b, e, w = env.microbatch_size, env.act_bytes, env.gemm_in_bytes
    hidden, gates, directions = layer.hidden_size, layer.gates, layer.directions
    rows = b * steps
    # the weight gradients accumulate in their GEMMs, or are written fresh for autograd to add
    acc, fresh = ((env.wgrad_accumulate_bytes, 0) if env.grad_accumulation_fused
                  else (0, env.wgrad_accumulate_bytes))
    forward: list[Item] = []
    backward: list[Item] = []
    backward_input: list[Item] = []
    backward_weight: list[Item] = []
    params = saved = buffer = 0
    tensors: list[float] = []
    for depth in range(layer.num_layers):
        inputs = features if depth == 0 else hidden * directions
        fwd_layer: list[Item] = []
        bwd_in_layer: list[Item] = []
        bwd_w_layer: list[Item] = []
        for direction in range(directions):
            name = f"{label}.l{depth}{'.reverse' if direction else ''}"
            width = gates * hidden
            fwd_layer += [gemm(f"{name}.input_proj", rows, width, inputs, in_bytes=w, out_bytes=e),
                          _steps(f"{name}.recurrence", steps, b, width, hidden, w, e),
                          # gate nonlinearities and state update: read the gates and the previous
                          # state, write the new state and output
                          memory_op(f"{name}.cell", rows * hidden * e * (gates + 3))]
            bwd_in_layer += [memory_op(f"{name}.cell.grad", rows * hidden * e * (gates + 4)),
                             _steps(f"{name}.recurrence.dgrad", steps, b, hidden, width, w, e),
                             gemm(f"{name}.input_proj.dgrad", rows, inputs, width, in_bytes=w, out_bytes=e)]
            bwd_w_layer += [gemm(f"{name}.input_proj.wgrad", inputs, width, rows, in_bytes=w, out_bytes=fresh,
                                 accumulate_bytes=acc),
                            gemm(f"{name}.recurrence.wgrad", hidden, width, rows, in_bytes=w, out_bytes=fresh,
                                 accumulate_bytes=acc)]
            params += width * (inputs + hidden) + (2 * width if layer.bias else 0)  # PyTorch keeps b_ih and b_hh
            tensors += [width * inputs, width * hidden, *([width, width] if layer.bias else [])]
            # the input, the gate activations and the hidden (and cell) state of every step
            saved += rows * (inputs + width + 2 * hidden) * e
            buffer += rows * (inputs + hidden + width) * e  # what the weight gradients read
        forward += fwd_layer
        backward[:0] = bwd_in_layer + bwd_w_layer  # the backward runs the layers in reverse
        backward_input[:0] = bwd_in_layer
        backward_weight[:0] = bwd_w_layer
    return BlockWork(tuple(forward), tuple(backward), tuple(backward_input), tuple(backward_weight),
                     params=float(params), saved_bytes=float(saved), weight_grad_buffer_bytes=float(buffer),
                     param_tensors=param_tensors(*tensors))
