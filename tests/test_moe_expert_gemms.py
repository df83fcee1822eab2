"""The local experts' GEMMs as Transformer Engine's GroupedLinear launches them
(``mpsim/workload/moe.py``, ``expert_gemms``; ``mpsim/cost/compute.py`` for GEMMs on several
streams): one cuBLASLt GEMM per expert over four streams, each a launch the host pays for, the fp8
casts in as many kernels as the recipe takes; or one grouped kernel."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.cost.compute import ComputeModel
from mpsim.resolve import resolve
from mpsim.simulate import simulate
from mpsim.results import summarize
from mpsim.specs import load_scenario
from mpsim.specs.catalog import load_accelerator
from mpsim.workload.blocks import CURRENT_SCALING_CAST_KERNELS
from mpsim.workload.moe import TE_GEMM_STREAMS
from mpsim.workload.ops import gemm
from tests.conftest import SCENARIOS
from tests.test_moe_host_sync import MIXTRAL, QWEN3

H100 = load_accelerator("h100-sxm-80gb")


def moe_forward_ops(*overrides: str) -> dict:
    """The MoE experts' ops of one layer's forward and backward, by name."""
    from mpsim.workload.embedding import padded_vocab
    from mpsim.workload.stages import build_stage, layer_context, stage_options
    scenario = load_scenario(MIXTRAL, list(overrides)).scenario
    layout = resolve(scenario)
    work = build_stage(layer_context(scenario, layout), 1, 0, False, False,
                       stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp)))
    return {item.name: item for blocks in (work.forward, work.backward) for block in blocks for item in block.items
            if getattr(item, "name", "").startswith("moe.experts")}


def step(*overrides: str):
    scenario = load_scenario(MIXTRAL, list(overrides)).scenario
    return summarize(simulate(scenario))


@pytest.mark.parametrize("recipe,casts", [("current", CURRENT_SCALING_CAST_KERNELS * 8), ("delayed", 1)])
def test_transformer_engine_launches_a_gemm_per_local_expert_and_casts_as_its_recipe_does(recipe, casts):
    ops = moe_forward_ops(*QWEN3, f"training.fp8_recipe={recipe}")  # 128 experts over EP 16: 8 local
    for name in ("moe.experts.fc1", "moe.experts.fc2", "moe.experts.fc1.dgrad", "moe.experts.fc2.dgrad",
                 "moe.experts.fc1.wgrad", "moe.experts.fc2.wgrad"):
        assert ops[name].launches == 8 and ops[name].streams == TE_GEMM_STREAMS, name
    # the permuted tokens and the activation's output arrive in bf16: cast by the GEMM that reads
    # them, with the transposed copy the weight gradient reuses; each output gradient cast too
    for name in ("moe.experts.fc1", "moe.experts.fc2", "moe.experts.fc1.dgrad", "moe.experts.fc2.dgrad"):
        assert ops[name].cast_bytes > 0 and ops[name].host_launches == 8 + casts, name
    assert ops["moe.experts.fc1.wgrad"].cast_bytes == 0 and ops["moe.experts.fc1.wgrad"].host_launches == 8


def test_a_grouped_kernel_or_other_layers_launch_one():
    grouped = moe_forward_ops(*QWEN3, "training.moe_grouped_gemm=grouped")
    assert grouped["moe.experts.fc1"].launches == 1 and grouped["moe.experts.fc1"].streams == 0
    # plain PyTorch's torch._grouped_mm, in bf16
    torch_ops = moe_forward_ops(*QWEN3, "training.dtype=bf16", "training.transformer_impl=pytorch")
    assert torch_ops["moe.experts.fc1"].launches == 1 and torch_ops["moe.experts.fc1"].host_launches == 1


def test_gemms_on_four_streams_run_four_at_a_time():
    compute = ComputeModel(H100, "bf16")
    overhead_s = H100.efficiency.kernel_overhead

    def on_streams(batch, m, n, k):
        return compute.time(replace(gemm("expert", m, n, k, batch=batch), launches=batch, streams=4))

    def batched(batch, m, n, k):
        return compute.time(gemm("expert", m, n, k, batch=batch))

    small = (128, 256, 1024)  # one tile of 128 x 256 on 132 SMs, its weights a fraction of a MB
    # eight small GEMMs, four at a time: the SMs they leave idle stay idle, and each stream runs
    # two, one after the other (a kernel overhead each)
    assert on_streams(8, *small) == pytest.approx(2 * batched(1, *small))
    assert batched(8, *small) < on_streams(8, *small) < 8 * batched(1, *small)
    # GEMMs whose tiles fill the SMs, or whose weights take longer to read than their tiles to
    # compute, go no faster than one kernel over all of them
    for shape in ((4096, 1536, 2048), (128, 1536, 2048)):
        assert on_streams(8, *shape) == pytest.approx(batched(8, *shape) + overhead_s)
    # four or fewer: one turn, each on its own stream, as fast as one kernel over them
    assert on_streams(3, *small) == pytest.approx(batched(3, *small))


@settings(max_examples=25, deadline=None)
@given(experts=st.integers(1, 40), streams=st.integers(1, 8), rows=st.sampled_from([64, 256, 1024, 4096]))
def test_more_streams_are_never_slower_and_one_stream_is_one_gemm_after_another(experts, streams, rows):
    compute = ComputeModel(H100, "bf16")
    base = gemm("expert", rows, 1536, 2048, batch=experts)
    one = gemm("expert", rows, 1536, 2048)
    priced = [compute.time(replace(base, launches=experts, streams=s)) for s in range(1, streams + 1)]
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(priced, priced[1:]))
    assert priced[0] == pytest.approx(experts * compute.time(one))


def test_fine_grained_experts_leave_the_gpu_waiting_for_the_host():
    """Qwen3-30B-A3B, 8 local experts of 768: the kernels after each layer's wait for the token
    counts are small, so the host's launches pace the pass; one grouped kernel per GEMM, or a
    faster host, gives a shorter step, and the host's wait is where the difference is."""
    # the host waits for the dispatch's counts; current scaling casts each expert's tensor in four kernels
    deepep = (*QWEN3, "training.moe_token_dispatcher=deepep", "training.fp8_recipe=current")
    multi = step(*deepep)
    grouped = step(*deepep, "training.moe_grouped_gemm=grouped")
    quick_host = step(*deepep, "training.host_launch_interval=5e-6")
    assert multi.host_wait_s > 0.15 * multi.step_time_s
    assert grouped.step_time_s < multi.step_time_s and quick_host.step_time_s < multi.step_time_s
    assert grouped.host_wait_s < multi.host_wait_s / 3
    # current scaling's per-expert casts: more kernels, more host time than delayed scaling's fused one
    delayed = step(*deepep, "training.fp8_recipe=delayed")
    current = step(*deepep, "training.fp8_recipe=current")
    assert current.host_wait_s > delayed.host_wait_s


def test_few_large_experts_keep_the_host_ahead():
    """Mixtral's experts (14,336 wide, 4 tokens in 8 picked per rank's expert): each GEMM is long,
    so the launches of one per expert cost no wait beyond the counts' read."""
    multi = step("parallel.ep=8", "training.transformer_impl=transformer_engine")
    grouped = step("parallel.ep=8", "training.transformer_impl=transformer_engine", "training.moe_grouped_gemm=grouped")
    assert multi.step_time_s == pytest.approx(grouped.step_time_s, rel=0.01)
    assert math.isclose(multi.host_wait_s, grouped.host_wait_s, rel_tol=0.05, abs_tol=1e-3)


def forward_names(*overrides: str) -> list[str]:
    from mpsim.workload.embedding import padded_vocab
    from mpsim.workload.stages import build_stage, layer_context, stage_options
    scenario = load_scenario(MIXTRAL, list(overrides)).scenario
    layout = resolve(scenario)
    work = build_stage(layer_context(scenario, layout), 1, 0, False, False,
                       stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp)))
    return [getattr(item, "name", "") for block in work.forward for item in block.items]


def test_each_dispatcher_permutes_where_megatron_core_does():
    def exchange(names):
        return [name for name in names if name in ("moe.permute", "moe.dispatch_all_to_all",
                                                   "moe.indices_to_multihot", "moe.sort_chunks")]
    # alltoall: permute, send, then regroup by local expert (Mixtral's 8 experts over EP 4: two each)
    assert exchange(forward_names("parallel.ep=4")) == ["moe.permute", "moe.dispatch_all_to_all", "moe.sort_chunks"]
    # one local expert: nothing to regroup
    assert exchange(forward_names("parallel.ep=8")) == ["moe.permute", "moe.dispatch_all_to_all"]
    # DeepEP: send the tokens, map the received indices, then permute; HybridEP permutes in its dispatch
    assert exchange(forward_names("training.moe_token_dispatcher=deepep")) == [
        "moe.dispatch_all_to_all", "moe.indices_to_multihot", "moe.permute"]
    assert exchange(forward_names("training.moe_token_dispatcher=hybridep")) == [
        "moe.dispatch_all_to_all", "moe.permute"]


def test_hybridep_sends_as_deepep_and_skips_its_index_map():
    deepep = step("training.moe_token_dispatcher=deepep")
    hybridep = step("training.moe_token_dispatcher=hybridep")
    assert hybridep.exposed_ep_comm_s == pytest.approx(deepep.exposed_ep_comm_s, rel=1e-9)
    assert hybridep.step_time_s < deepep.step_time_s


def test_hybridep_under_plain_pytorch_is_one_line_and_exit_code_2(tmp_path):
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "mpsim", "run", str(MIXTRAL), "--set",
                             "training.moe_token_dispatcher=hybridep", "--set", "training.transformer_impl=pytorch",
                             "--set", "parallel.tp=1", "--set", "parallel.sequence_parallel=false"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.moe_token_dispatcher" in lines[0] and "Traceback" not in result.stderr


def test_a_dense_linear_quantizes_as_transformer_engines_current_scaling_does():
    from mpsim.workload.blocks import CURRENT_SCALING_CAST_WITH_AMAX_KERNELS
    llama = SCENARIOS / "llama3_70b_32xh100.yaml"

    def dense_ops(recipe):
        scenario = load_scenario(llama, ["training.dtype=fp8", f"training.fp8_recipe={recipe}"]).scenario
        layout = resolve(scenario)
        from mpsim.workload.embedding import padded_vocab
        from mpsim.workload.stages import build_stage, layer_context, stage_options
        work = build_stage(layer_context(scenario, layout), 1, 0, False, False,
                           stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp)))
        found = {}
        for blocks in (work.forward, work.backward):
            for block in blocks:
                for item in block.items:
                    for op in ([item.comm, *item.compute] if hasattr(item, "comm") else [item]):
                        found.setdefault(op.name, op)
        return found

    current, delayed = dense_ops("current"), dense_ops("delayed")
    # QKV's input comes from the norm, which wrote its amax: the scale and the cast
    assert current["attn.qkv"].cast_launches == CURRENT_SCALING_CAST_WITH_AMAX_KERNELS
    # the attention core's bf16 output and every output gradient: zero the amax, find it, scale, cast
    assert current["attn.proj"].cast_launches == CURRENT_SCALING_CAST_KERNELS
    assert current["mlp.fc2.dgrad"].cast_launches == CURRENT_SCALING_CAST_KERNELS
    # delayed scaling casts with its amax inside one kernel
    assert {delayed[name].cast_launches for name in ("attn.qkv", "attn.proj", "mlp.fc2.dgrad")} == {1}
