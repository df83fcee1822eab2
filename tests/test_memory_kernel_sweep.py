"""benchmarks/memory_kernel_sweep.py prices a published sweep of PyTorch's and Megatron's memory-bound
kernels (out of sample, but for the shares of Megatron's cross entropy and of the eager RMSNorm, which
come from their largest shapes)."""

from __future__ import annotations

import pytest

from mpsim.workload.embedding import CROSS_ENTROPY_BANDWIDTH_SHARE, FUSED_CROSS_ENTROPY_BANDWIDTH_SHARE
from mpsim.workload.norms import EAGER_RMSNORM_BANDWIDTH_SHARE, NATIVE_NORM_BANDWIDTH_SHARE
from tests.conftest import dispatch_counter, load_benchmark


def test_every_row_is_priced_with_a_line_per_family(capsys):
    module = load_benchmark("memory_kernel_sweep")
    module.main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("rows=113 mean_abs_error_pct=")
    for label, count in (("A100 layer_norm huggingface forward", 5), ("A100 rms_norm huggingface backward", 6),
                         ("H100 relu_squared torch forward", 8), ("H100 megatron_swiglu torch backward", 6),
                         ("H100 megatron_cross_entropy megatron-fused backward", 6),
                         ("A100 cross_entropy huggingface full", 6),
                         ("H100 fused_add_rms_norm huggingface backward", 6)):
        assert any(line.startswith(f"{label}: rows={count} ") for line in lines), label


def test_a_backward_timed_with_its_forward_is_the_difference():
    module = load_benchmark("memory_kernel_sweep")
    table = module.rows()
    row = next(r for r in table if r["kernel"] == "megatron_cross_entropy" and r["provider"] == "megatron-unfused"
               and r["mode"] == "backward" and r["x_value"] == "131072")
    # the published medians: 21.2467 ms forward and backward, 15.8124 ms forward alone
    assert module.measured_s(row, table) * 1e3 == pytest.approx(21.2467 - 15.8124, abs=1e-3)
    # a backward timed alone is its own row
    alone = next(r for r in table if r["kernel"] == "relu_squared" and r["mode"] == "backward")
    assert module.measured_s(alone, table) == pytest.approx(float(alone["median_ms"]) * 1e-3)


def test_the_eager_rmsnorm_shares_are_the_sweeps_own():
    shares = load_benchmark("memory_kernel_sweep").largest_shape_shares()
    forward, backward = EAGER_RMSNORM_BANDWIDTH_SHARE
    assert shares["A100 rms_norm huggingface forward"] == pytest.approx(forward, abs=0.005)
    assert shares["A100 rms_norm huggingface backward"] == pytest.approx(backward, abs=0.005)


def test_the_native_norm_shares_are_the_sweeps_best_reading():
    """PyTorch's nn.LayerNorm and nn.RMSNorm at the sweep's widest row: the best part's share (LayerNorm's
    forward ran on an A100 and an H100), the rule FUSED_NORM_BANDWIDTH_SHARE follows."""
    shares = load_benchmark("memory_kernel_sweep").largest_shape_shares()
    layernorm, rmsnorm = NATIVE_NORM_BANDWIDTH_SHARE["layernorm"], NATIVE_NORM_BANDWIDTH_SHARE["rmsnorm"]
    best_forward = max(shares["A100 layer_norm huggingface forward"], shares["H100 layer_norm huggingface forward"])
    assert best_forward == pytest.approx(layernorm[0], abs=5e-4)
    assert shares["H100 layer_norm huggingface backward"] == pytest.approx(layernorm[1], abs=5e-4)
    assert shares["H100 megatron_rms_norm torch forward"] == pytest.approx(rmsnorm[0], abs=5e-4)
    assert shares["H100 megatron_rms_norm torch backward"] == pytest.approx(rmsnorm[1], abs=5e-4)


def test_the_plain_activation_shares_are_the_sweeps_own():
    """SwiGLU over torch.chunk's halves and squared ReLU in PyTorch's operators run at the shares the
    sweep's widest rows reached (the chunked backward over the 12 elements a column the benchmark moved)."""
    from mpsim.workload.mlp import PLAIN_FFN_ACTIVATIONS

    shares = load_benchmark("memory_kernel_sweep").largest_shape_shares()
    for family, name in (("megatron_swiglu", "swiglu"), ("relu_squared", "squared_relu")):
        forward, backward = PLAIN_FFN_ACTIVATIONS[name].bandwidth_share
        assert shares[f"H100 {family} torch forward"] == pytest.approx(forward, abs=5e-4)
        assert shares[f"H100 {family} torch backward"] == pytest.approx(backward, abs=5e-4)


def test_the_cross_entropy_shares_are_the_sweeps_own():
    """The shares mpsim prices Megatron's cross entropy at are what its kernels reached on an H100 at the
    sweep's largest vocabulary, over the bytes mpsim counts for them."""
    shares = load_benchmark("memory_kernel_sweep").largest_shape_shares()
    for provider, (forward, backward) in (("megatron-unfused", CROSS_ENTROPY_BANDWIDTH_SHARE),
                                          ("megatron-fused", FUSED_CROSS_ENTROPY_BANDWIDTH_SHARE)):
        assert shares[f"H100 megatron_cross_entropy {provider} forward"] == pytest.approx(forward, abs=0.005)
        assert shares[f"H100 megatron_cross_entropy {provider} backward"] == pytest.approx(backward, abs=0.005)
    # a plain elementwise pair of kernels streams: the shares leave them at the streaming rate
    assert shares["H100 relu_squared torch forward"] > 0.9


def test_pytorchs_cross_entropy_streams_its_passes_over_a_vocabulary_wide_row():
    """Out of sample: torch.nn.CrossEntropyLoss on fp32 logits, forward and forward + backward, on an A100,
    priced as mpsim prices PyTorch's loss (three reads and a write of each row each way) at the
    streaming rate, from 32,768 logits a row up (narrower rows keep the row on chip)."""
    module = load_benchmark("memory_kernel_sweep")
    table = module.rows()
    model = module.ComputeModel(module.load_accelerator("a100-sxm-80gb"), "bf16")
    checked = 0
    for row in table:
        if row["kernel"] == "cross_entropy" and int(row["x_value"]) >= 32768:
            predicted = sum(model.time(o) for o in module.priced_ops(row))
            assert predicted == pytest.approx(module.measured_s(row, table), rel=0.07), row
            checked += 1
    assert checked == 6


def test_the_add_and_norm_bytes_are_what_pytorch_dispatches():
    """The benchmark's NaiveAddRMSNorm on fp32 input, counted the way tests/test_eager_norm.py counts
    torchtitan's RMSNorm: every tensor as large as the input that a dispatched kernel reads or writes."""
    torch = pytest.importorskip("torch")
    tokens, hidden = 64, 256

    weight = torch.nn.Parameter(torch.ones(hidden))

    def naive_add_rms_norm(hidden_states, residual):  # the benchmark's module, as a function
        dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32) + residual.to(torch.float32)
        residual = hidden_states
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + 1e-6)
        return weight * hidden_states.to(dtype), residual.to(dtype)

    x, r = (torch.randn(tokens, hidden, requires_grad=True) for _ in range(2))
    with dispatch_counter(tokens * hidden) as forward:
        y, s = naive_add_rms_norm(x, r)
    grads = (torch.randn_like(y), torch.randn_like(s))
    with dispatch_counter(tokens * hidden) as backward:
        torch.autograd.backward((y, s), grads)
    module = load_benchmark("memory_kernel_sweep")
    elements = tokens * hidden
    assert (forward.bytes / elements, forward.kernels) == module.ADD_RMSNORM_FP32[0]
    assert (backward.bytes / elements, backward.kernels) == module.ADD_RMSNORM_FP32[1]
