"""benchmarks/hopper_layer.py: one Llama 3.1 8B layer priced against the same layer timed on an H200."""

from __future__ import annotations

from tests.conftest import benchmark_error_line, load_benchmark

# mean absolute error (percent) of the four readings when this check was added (docs/accuracy.md);
# a regression guard: the test fails when it grows more than one point past it
DOCUMENTED_MEAN_ABS_ERROR_PCT = 1.95


def _module():
    return load_benchmark("hopper_layer")


def test_every_layer_reading_is_priced_and_the_error_stays_at_its_documented_value(capsys):
    last, mean_abs = benchmark_error_line(_module(), capsys)
    # two sequence lengths, forward and forward + backward each
    assert last.startswith("rows=4 ")
    assert mean_abs <= DOCUMENTED_MEAN_ABS_ERROR_PCT + 1.0


def test_a_longer_sequence_costs_more_than_twice_the_layer():
    # the attention's quadratic share: 8k tokens take more than twice 4k, measured and predicted
    module = _module()
    by_label = {row["label"]: row for row in module.rows()}
    for kind in ("forward", "forward+backward"):
        short, long = by_label[f"llama8b.layer.s4096 {kind}"], by_label[f"llama8b.layer.s8192 {kind}"]
        assert long["measured_s"] > 2 * short["measured_s"]
        assert long["predicted_s"] > 2 * short["predicted_s"]
