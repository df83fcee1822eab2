"""Every kind of bad input gives one clear line naming the file and field, and exit code 2.

The commands run in this process (``tests/conftest.py``: ``run_in_process``); the last
tests start real ``python -m mpsim`` processes, for what only a process shows.
"""

from __future__ import annotations

import re

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, CliRun, run_in_process

BASE = """name: test
cluster:
  system: dgx-a100
  nodes: 1
model: gpt3-175b
parallel:
  tp: 8
  pp: 1
  microbatch_size: 1
  global_batch_size: 8
  schedule: 1f1b
"""

SYSTEM = (SCENARIOS.parent / "hardware" / "systems" / "dgx_a100.yaml").read_text()


def run_cli(*args: str, cwd: Path) -> CliRun:
    return run_in_process(args, cwd)


def run_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpsim", *args], capture_output=True, text=True, cwd=cwd)


CASES = [
    # (id, scenario text or None for BASE, extra args, expected fragments of the one line)
    ("missing field", BASE.replace("  global_batch_size: 8\n", ""), [], ["parallel.global_batch_size",
                                                                        "required"]),
    ("unknown field", BASE.replace("  tp: 8", "  tpp: 8"), [], ["parallel.tpp", "unknown field", "tp"]),
    ("malformed yaml", BASE + "  : [oops\n", [], ["malformed YAML", "line"]),
    ("not a mapping", "- a\n- b\n", [], ["must be a mapping"]),
    ("tp not dividing heads", BASE.replace("tp: 8", "tp: 5"), ["--set", "cluster.nodes=5"],
     ["parallel.tp", "does not divide", "num_attention_heads=96"]),
    # the sizes it suggests split the key/value heads too (Llama 3 70B: 64 query heads, 8 key/value)
    ("tp suggestion fits the kv heads", BASE.replace("tp: 8", "tp: 3").replace("model: gpt3-175b", "model: llama3-70b"),
     ["--set", "cluster.nodes=3"], ["parallel.tp", "num_attention_heads=64", "use one of 1, 2, 4, 8"]),
    # a model file's own check that fails on a value a --set put into it names the --set too
    ("model check after --set", BASE, ["--set", "model.hidden_size=12287"],
     ["gpt3_175b.yaml", "not divisible by num_attention_heads", "(with --set model.hidden_size=12287)"]),
    # a list item given by --set is named with its list, and a negative quantity in the user's unit
    ("list item of a --set", BASE, ["--set", "faults.slow_gpu=[{rank: 1, speed: 2}]"],
     ["--set faults.slow_gpu=", ": slow_gpu.0.speed: ", "less than or equal to 1"]),
    ("negative bandwidth in a --set", BASE, ["--set", "cluster.system.scale_out.nic_bandwidth=-400 Gb/s"],
     ["scale_out.nic_bandwidth", "a bandwidth cannot be negative, got '-400 Gb/s'"]),
    # a bare rank says which GPU but not how slow; a GPU named twice has two speeds
    ("slow GPU without a speed", BASE, ["--set", "faults.slow_gpu=3"],
     ["faults.slow_gpu=3", "3 is not a rank with its speed: write '12@0.5'"]),
    ("slow GPU twice", BASE, ["--set", "faults.slow_gpu=[3@0.5, 3@0.7]"], ["rank 3 is given twice"]),
    # Megatron-Core's microbatch groups: its interleaved schedule only, between pp and the microbatches,
    # with no short last group
    ("microbatch groups without interleaving", BASE + "  microbatch_group_size: 8\n", [],
     ["scenario.yaml: parallel.microbatch_group_size", "interleaved-1f1b", "parallel.schedule is 1f1b"]),
    ("microbatch groups below pp", BASE.replace("tp: 8", "tp: 2").replace("pp: 1", "pp: 4\n  vpp: 2").replace(
        "schedule: 1f1b", "schedule: interleaved-1f1b") + "  microbatch_group_size: 2\n", [],
     ["parallel.microbatch_group_size", "must lie between pp (4) and the microbatches per pipeline (8)"]),
    ("microbatch groups with a short last group", BASE.replace("tp: 8", "tp: 2").replace("pp: 1", "pp: 4\n  vpp: 2")
     .replace("schedule: 1f1b", "schedule: interleaved-1f1b") + "  microbatch_group_size: 6\n", [],
     ["parallel.microbatch_group_size", "last group of 2 microbatches, fewer than pp (4)"]),
    ("tp across nodes", BASE.replace("tp: 8", "tp: 16").replace("nodes: 1", "nodes: 2"), [],
     ["parallel.tp", "more than one", "allow_tp_across_nodes"]),
    ("too few devices", BASE.replace("pp: 1", "pp: 2"), [], ["parallel", "does not divide the cluster's 8 devices"]),
    ("dp mismatch", BASE.replace("pp: 1", "pp: 1\n  dp: 2"), [], ["parallel.dp", "cluster has 8 devices"]),
    ("batch not divisible", BASE.replace("global_batch_size: 8", "global_batch_size: 7"), ["--set", "parallel.tp=4"],
     ["parallel.global_batch_size", "not divisible", "dp=2 is the cluster's 1 node x 8 = 8 devices over tp x cp x pp = 4"]),
    # a what-if on another system says how its nodes make the device count
    ("batch not divisible on another system", BASE, ["--set", "cluster.system=gb200-nvl72"],
     ["dp=9 is the cluster's 1 node x 72 = 72 devices over tp x cp x pp = 8"]),
    ("batch not divisible, dp given", BASE.replace("global_batch_size: 8", "global_batch_size: 7"),
     ["--set", "parallel.tp=4", "--set", "parallel.dp=2"], ["parallel.global_batch_size", "= 2 x 1 = 2"]),
    ("unknown schedule", BASE.replace("schedule: 1f1b", "schedule: zigzag"), [],
     ["parallel.schedule", "unknown schedule 'zigzag'", "1f1b"]),
    ("layers not splitting", BASE.replace("pp: 1", "pp: 5"), ["--set", "cluster.nodes=5"],
     ["parallel.pp", "96 layers do not split evenly"]),
    ("layers_per_stage wrong sum", BASE.replace("pp: 1", "pp: 1\n  layers_per_stage: [95]"), [],
     ["parallel.layers_per_stage", "sums to 95"]),
    ("vpp without interleaved", BASE.replace("pp: 1", "pp: 1\n  vpp: 2"), [], ["parallel.schedule", "vpp"]),
    ("negative tp", BASE.replace("tp: 8", "tp: -8"), [], ["parallel.tp", "greater than 0"]),
    ("wrong type", BASE.replace("tp: 8", "tp: eight"), [], ["parallel.tp", "whole number", "'eight'"]),
    # a count written as a decimal or as text is refused, not read as the number it rounds to
    ("count as a decimal", BASE.replace("tp: 8", "tp: 8.0"), [], ["parallel.tp", "whole number, got 8.0"]),
    ("count as text", BASE.replace("tp: 8", 'tp: "8"'), [], ["parallel.tp", "whole number, got the text '8'"]),
    ("count in a list as a decimal", BASE.replace("pp: 1", "pp: 1\n  layers_per_stage: [96.0]"), [],
     ["parallel.layers_per_stage", "whole number, got 96.0"]),
    ("count as a decimal in a --set", BASE, ["--set", "parallel.microbatch_size=1.0"],
     ["parallel.microbatch_size", "whole number, got 1.0"]),
    ("unknown system", BASE.replace("system: dgx-a100", "system: dgx-a1000"), [],
     ["cluster.system", "unknown system 'dgx-a1000'", "dgx-a100"]),
    ("unknown model", BASE.replace("model: gpt3-175b", "model: gpt5"), [], ["model", "unknown model 'gpt5'"]),
    ("bad --set", BASE, ["--set", "parallel.tp"], ["--set parallel.tp", "FIELD=VALUE"]),
    ("unknown recompute", BASE.replace("schedule: 1f1b", "schedule: 1f1b\n  recompute: some"), [],
     ["parallel.recompute", "selective"]),
    ("unsupported dtype", BASE + "training:\n  dtype: fp8\n", [], ["training.dtype", "fp8", "a100"]),
    ("bad order", BASE.replace("schedule: 1f1b", "schedule: 1f1b\n  order: tp-pp"), [],
     ["parallel.order", "each of tp, cp, dp, pp"]),
    # PyTorch's loss in bf16 exists only under plain PyTorch layers; Megatron's fused one only under Megatron's
    ("bf16 loss under Megatron's layers", BASE + "training:\n  fp32_loss: false\n", [],
     ["training.fp32_loss", "transformer_impl local", "always on an fp32 copy"]),
    ("fused cross entropy under PyTorch's layers",
     BASE + "training:\n  transformer_impl: pytorch\n  cross_entropy_fusion: true\n", [],
     ["training.cross_entropy_fusion", "needs Megatron's layers", "PyTorch's cross_entropy"]),
    ("missing scenario file", None, ["does/not/exist.yaml"], ["does/not/exist.yaml", "not found"]),
    ("missing schedule file", BASE.replace("schedule: 1f1b", "schedule: file:nope.txt"), [],
     ["parallel.schedule", "nope.txt", "not found"]),
]


def run_bad_scenario(tmp_path: Path, case, runner) -> None:
    _, text, extra, fragments = case
    args = list(extra)
    if text is not None:
        path = tmp_path / "scenario.yaml"
        path.write_text(text)
        args.insert(0, str(path))
    result = runner("run", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_scenario(tmp_path, case):
    run_bad_scenario(tmp_path, case, run_cli)


# What only a process shows: the console entry's exit code, and nothing printed besides the
# one line (a warning raised at import, an interpreter's traceback). One case of each kind:
# a field the loader refuses, a layout rule, a file that is not there.
PROCESS_CASES = ["missing field", "tp not dividing heads", "missing scenario file"]


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in PROCESS_CASES],
                         ids=[c[0] for c in CASES if c[0] in PROCESS_CASES])
def test_bad_scenario_in_a_process_of_its_own(tmp_path, case):
    run_bad_scenario(tmp_path, case, run_process)


@pytest.mark.parametrize("edit,fragments", [
    (lambda s: s.replace('bandwidth_per_device: "300 GB/s"', 'bandwidth_per_device: "300 GB"'),
     ["scale_up.bandwidth_per_device", "is a bytes"]),
    (lambda s: s.replace('bandwidth_per_device: "300 GB/s"', 'bandwidth_per_device: "-300 GB/s"'),
     ["scale_up.bandwidth_per_device", "a bandwidth cannot be negative, got '-300 GB/s'"]),
    (lambda s: s.replace("efficiency: 0.80", "efficiency: 1.8"), ["scale_up.efficiency", "less than or equal"]),
])
def test_bad_hardware_file_names_that_file(tmp_path, edit, fragments):
    (tmp_path / "system.yaml").write_text(edit(SYSTEM))
    (tmp_path / "scenario.yaml").write_text(BASE.replace("system: dgx-a100", "system: system.yaml"))
    result = run_cli("run", "scenario.yaml", cwd=tmp_path)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert line.startswith("error: system.yaml: "), line
    for fragment in fragments:
        assert fragment in line, line


def test_plan_names_the_pinned_field_that_no_layout_can_take(tmp_path):
    # a --set that breaks a model rule: the plan says which rule, not "check --devices"
    result = run_cli("plan", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "512",
                     "--set", "parallel.tp=3", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --set parallel.tp: no layout with the --set values: tp=3 does not divide")
    # only sizes that split the 32 query heads, the 8 key/value heads and the FFN are offered
    assert line.endswith("use one of 1, 2, 4, 8")


def test_a_plan_where_nothing_can_run_does_not_blame_memory(tmp_path):
    # V100s have no bf16: every layout is invalid, and the one error line says why
    result = run_cli("plan", "llama3-8b", "--cluster", "dgx-2", "--devices", "16", "--global-batch", "64", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no layout fits in memory" not in result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert re.search(r"all [0-9,]+ points are invalid", line) and "bf16 has no peak_flops entry" in line


@pytest.mark.parametrize("extra, fragment", [
    # a pinned schedule that --schedules leaves out would silently narrow the search to nothing
    (["--set", "parallel.schedule=zbv", "--schedules", "1f1b"],
     "--schedules: does not include zbv, which --set parallel.schedule pins"),
    # what pricing the whole run needs is checked before the search, and named by plan's own option
    (["--tokens", "1e12"], "--tokens needs reliability.storage_bandwidth"),
])
def test_plan_refuses_before_searching(tmp_path, extra, fragment):
    result = run_cli("plan", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "512",
                     *extra, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stdout == ""  # nothing of a search was printed
    [line] = result.stderr.strip().splitlines()
    assert fragment in line


def test_plan_find_with_an_unknown_name_is_one_line(tmp_path):
    result = run_cli("plan", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "512",
                     "--find", "tpp=8", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --find tpp=8: no layout has a 'tpp'") and "did you mean tp" in line


@pytest.mark.parametrize("args, line", [
    (["nosuchfile.txt"], "error: nosuchfile.txt: schedule file not found"),
    (["zbv", "--pp", "4", "--microbatches", "8"], "error: zbv: zbv runs exactly 2 chunk(s) per rank; set --vpp to 2"),
    (["zbx", "--pp", "4", "--microbatches", "8"], "error: zbx: unknown schedule 'zbx'; did you mean zbv?"),
])
def test_schedule_command_names_the_real_problem(tmp_path, args, line):
    result = run_cli("schedule", *args, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == line


@pytest.mark.parametrize("option, value", [("--system", "dgx-a100"), ("--accelerator", "a100-sxm-40gb")])
def test_calibrate_refuses_trace_options_without_a_trace(tmp_path, option, value):
    # measuring this machine would ignore them silently (20 s of measurement, a CPU profile)
    result = run_cli("calibrate", option, value, "-o", str(tmp_path / "x.yaml"), cwd=tmp_path)
    assert result.returncode == 2 and not (tmp_path / "x.yaml").exists()
    assert result.stderr.strip() == f"error: {option}: only with --from-trace: measuring this machine prices its own device"


def test_a_profile_is_written_only_where_a_scenario_can_read_it(tmp_path):
    trace = Path(__file__).resolve().parent / "data" / "traces" / "recsys16_step551.json.gz"
    result = run_cli("calibrate", "--from-trace", str(trace), "--system", "dgx-a100", "--accelerator", "a100-sxm-80gb",
                     "-o", str(tmp_path / "x.txt"), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --out: ") and "written as .yaml or .json" in line
    assert not (tmp_path / "x.txt").exists()
