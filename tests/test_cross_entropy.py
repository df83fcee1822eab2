"""The LM head's loss, counted by hand for Llama 3 70B (128,256-token vocabulary padded to
129,024, a multiple of 128 x TP, at TP 8; 8,192 tokens a microbatch): Megatron's vocab-parallel
cross entropy, eager and fused (``training.cross_entropy_fusion``), from its
VocabParallelCrossEntropy, and PyTorch's ``cross_entropy`` under plain PyTorch layers, on an fp32
copy of the logits or on them as they are (``training.fp32_loss``)."""

from __future__ import annotations

from mpsim.resolve import resolve
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.embedding import CROSS_ENTROPY_BANDWIDTH_SHARE, FUSED_CROSS_ENTROPY_BANDWIDTH_SHARE
from mpsim.workload.ops import compute_ops
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"
TOKENS, TP, BF16 = 8192, 8, 2
VOCAB_LOCAL = 129024 // TP


def head(*overrides: str):
    scenario = load_scenario(LLAMA70, list(overrides)).scenario
    last = build_workload(scenario, resolve(scenario)).stages[-1]
    (forward,) = [block for block in last.forward if block.label == "lm head"]
    (backward,) = [block for block in last.backward if block.label == "lm head"]
    return forward.items, backward.items


def op(items, name: str):
    (found,) = [o for o in compute_ops(items) if o.name == name]
    return found


def reductions(items) -> list[float]:
    return [item.message_bytes for item in items if getattr(item, "kind", "") == "collective"
            and item.name.startswith("head.cross_entropy.all_reduce")]


def test_eager_cross_entropy_makes_a_pass_per_step():
    forward, backward = head("training.cross_entropy_fusion=false")
    logits = TOKENS * VOCAB_LOCAL
    # read the bf16 logits; cast (write 4), max (read 4), subtract (8), exp (8), sum (read 4), normalise (8)
    assert op(forward, "head.cross_entropy").bytes == logits * (BF16 + 4 + 4 + 8 + 8 + 4 + 8)
    # multiply the softmax in place (8), cast back (read 4, write 2)
    assert op(backward, "head.cross_entropy.grad").bytes == logits * (8 + 4 + BF16)
    # max, sum and target logit all-reduced one by one, 4 bytes a token each
    assert reductions(forward) == [TOKENS * 4] * 3


def test_fused_cross_entropy_makes_a_pass_per_compiled_function():
    forward, backward = head("training.cross_entropy_fusion=true")
    logits = TOKENS * VOCAB_LOCAL
    # read the bf16 logits; cast and max (write 4); subtract, exp and sum (read 4, write 4); normalise (8)
    assert op(forward, "head.cross_entropy").bytes == logits * (BF16 + 4 + 8 + 8)
    # read the softmax, write the product back into it and the bf16 gradient
    assert op(backward, "head.cross_entropy.grad").bytes == logits * (4 + 4 + BF16)
    # the target logit and the sum all-reduced as one tensor
    assert reductions(forward) == [TOKENS * 4, TOKENS * 8]


def test_fusing_the_cross_entropy_never_slows_the_step():
    def step(fused: bool) -> float:
        scenario = load_scenario(LLAMA70, [f"training.cross_entropy_fusion={str(fused).lower()}"]).scenario
        return simulate(scenario).timeline.step_time_s
    assert step(True) < step(False)


def test_the_switch_changes_nothing_but_the_cross_entropy():
    def ops(fused: bool) -> dict:
        scenario = load_scenario(LLAMA70, [f"training.cross_entropy_fusion={str(fused).lower()}"]).scenario
        found = {}
        for index, stage in enumerate(build_workload(scenario, resolve(scenario)).stages):
            for work in (stage.forward, stage.backward):
                for block in work:
                    for o in compute_ops(block.items):
                        found[(index, block.label, o.name)] = (o.bytes, o.flops, o.launches)
        return found
    eager, fused = ops(False), ops(True)
    assert eager.keys() == fused.keys()
    changed = {key[2] for key in eager if eager[key] != fused[key]}
    assert changed == {"head.cross_entropy", "head.cross_entropy.grad"}


def test_megatrons_cross_entropy_runs_at_its_measured_share_of_the_streaming_rate():
    eager_forward, eager_backward = head("training.cross_entropy_fusion=false")
    fused_forward, fused_backward = head("training.cross_entropy_fusion=true")
    shares = [op(items, name).bandwidth_share for items, name in (
        (eager_forward, "head.cross_entropy"), (eager_backward, "head.cross_entropy.grad"),
        (fused_forward, "head.cross_entropy"), (fused_backward, "head.cross_entropy.grad"))]
    assert shares == [*CROSS_ENTROPY_BANDWIDTH_SHARE, *FUSED_CROSS_ENTROPY_BANDWIDTH_SHARE]
    assert all(0 < share < 1 for share in shares)


def test_pytorch_layers_compute_pytorchs_cross_entropy():
    forward, backward = head("training.transformer_impl=pytorch")
    logits = TOKENS * VOCAB_LOCAL
    # cast to fp32 (read 2, write 4), log_softmax: three reads of the fp32 row and a write
    assert op(forward, "head.cross_entropy").bytes == logits * (BF16 + 4 + 3 * 4 + 4)
    # zero-fill the fp32 gradient (4), log_softmax's backward (three reads and a write), cast back (4 + 2)
    assert op(backward, "head.cross_entropy.grad").bytes == logits * (4 + 4 * 4 + 4 + BF16)
    assert op(forward, "head.cross_entropy").bandwidth_share == 1.0
    # on the bf16 logits as they are: no cast, every pass in bf16
    forward16, backward16 = head("training.transformer_impl=pytorch", "training.fp32_loss=false")
    assert op(forward16, "head.cross_entropy").bytes == logits * 4 * BF16
    assert op(backward16, "head.cross_entropy.grad").bytes == logits * 5 * BF16
    # the same three reductions over the vocabulary shards as Megatron's eager loss
    assert reductions(forward) == reductions(forward16) == [TOKENS * 4] * 3


def test_a_loss_in_bf16_is_a_shorter_step_and_keeps_half_the_softmax():
    def run(fp32: bool):
        scenario = load_scenario(LLAMA70, ["training.transformer_impl=pytorch",
                                           f"training.fp32_loss={str(fp32).lower()}"]).scenario
        last = build_workload(scenario, resolve(scenario)).stages[-1]
        return simulate(scenario).timeline.step_time_s, last.activation_bytes
    (fp32_step, fp32_kept), (bf16_step, bf16_kept) = run(True), run(False)
    assert bf16_step < fp32_step
    # the log-softmax kept for the backward, per microbatch: 4 bytes a logit against 2
    assert fp32_kept - bf16_kept == TOKENS * VOCAB_LOCAL * (4 - BF16)
