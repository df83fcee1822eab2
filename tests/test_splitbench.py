"""The split-backward measurement runs PyTorch's own split and times what it claims to."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
_backward = pytest.importorskip("torch.distributed.pipelining._backward")
if not hasattr(_backward, "stage_backward_input"):
    pytest.skip(f"torch {torch.__version__} has no split backward (stage_backward_input, first in torch 2.5)",
                allow_module_level=True)

from mpsim.calibrate.measure.splitbench import SplitBackward  # noqa: E402
from mpsim.calibrate.measure.torch_model import ModelShape  # noqa: E402

TINY = ModelShape(layers=3, hidden=64, heads=4, ffn_hidden=256, vocab=128, seq_length=16)


def _grads(bench: SplitBackward) -> list:
    return [p.grad.clone() for p in bench.params]


def test_input_then_weight_pass_gives_the_full_backwards_weight_gradients():
    bench = SplitBackward(TINY, torch.device("cpu"), "cpu")
    for p in bench.params:
        p.grad.zero_()
    bench.full_s()
    full = _grads(bench)
    for p in bench.params:
        p.grad.zero_()
    bench.split_s()
    split = _grads(bench)
    assert any(g.abs().sum() > 0 for g in full)
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_measurement_is_three_positive_medians():
    bench = SplitBackward(TINY, torch.device("cpu"), "cpu")
    measured = bench.measure(pairs=3)
    assert set(measured) == {"full_s", "input_s", "weight_s"}
    assert all(seconds > 0 for seconds in measured.values())
    assert bench.chunk.embedding is None and bench.chunk.head is None  # a middle layer: I and W both do work
