"""The LM head's vocab-parallel cross entropy, eager and fused (``training.cross_entropy_fusion``),
counted by hand from Megatron's VocabParallelCrossEntropy for Llama 3 70B (128,256-token
vocabulary padded to 129,024, a multiple of 128 x TP, at TP 8; 8,192 tokens a microbatch)."""

from __future__ import annotations

from mpsim.resolve import resolve
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
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
