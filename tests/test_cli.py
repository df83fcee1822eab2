"""The command line: summary, JSON, trace and plot."""

from __future__ import annotations

import dataclasses
import json
import re

import mpsim.api
from mpsim.cli import main
from mpsim.results.report import format_summary
from tests.conftest import SCENARIOS

SCENARIO = str(SCENARIOS / "llama3_70b_32xh100.yaml")


def test_run_prints_summary(capsys):
    assert main(["run", SCENARIO]) == 0
    out = capsys.readouterr().out
    for fragment in ("step time", "MFU", "HFU", "bubble", "exposed comm", "memory", "tokens/s"):
        assert fragment in out


def test_json_has_documented_fields(capsys):
    assert main(["run", SCENARIO, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "tokens_per_s", "mfu", "hfu", "bubble_fraction", "exposed_tp_comm_s",
                "exposed_pp_comm_s", "exposed_dp_comm_s", "peak_memory_bytes", "out_of_memory", "ranks", "memory"):
        assert key in data
    assert len(data["ranks"]) == 4
    assert data["memory"][0]["peak_memory_bytes"] > 0


def test_trace_is_chrome_trace_json(tmp_path):
    path = tmp_path / "trace.json"
    assert main(["run", SCENARIO, "--trace", str(path)]) == 0
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1, 2, 3}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    assert any(e["cat"] == "forward" and e["name"] == "0F0" for e in slices)
    assert any(e["cat"] == "tp-comm" for e in slices)


def test_plot_writes_png(tmp_path):
    path = tmp_path / "timeline.png"
    assert main(["run", SCENARIO, "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_set_override_changes_result(capsys):
    main(["run", SCENARIO, "--json"])
    base = json.loads(capsys.readouterr().out)["step_time_s"]
    main(["run", SCENARIO, "--json", "--set", "parallel.global_batch_size=32"])
    assert json.loads(capsys.readouterr().out)["step_time_s"] > base


def test_a_system_swap_that_resizes_the_job_says_so(capsys):
    # 8 nodes of dgx-a100 are 64 GPUs; 8 "nodes" of a 512-chip TPU v5p slice are 4,096 chips
    gpt3 = str(SCENARIOS / "gpt3_175b_64xa100.yaml")
    assert main(["run", gpt3, "--json", "--set", "cluster.system=tpu-v5p-8x8x8"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["devices"] == 4096
    [note] = [line for line in captured.err.splitlines() if line.startswith("note:")]
    assert "4,096 devices" in note and "gave 64" in note and "cluster.num_devices=64" in note
    # the remedy the note gives keeps the job's size, and then there is nothing to say
    assert main(["run", gpt3, "--json", "--set", "cluster.system=tpu-v5p-8x8x8", "--set", "cluster.nodes=null",
                 "--set", "cluster.num_devices=64"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["devices"] == 64 and "note:" not in captured.err
    # a swap between systems with the same node size changes nothing about the size
    assert main(["run", gpt3, "--json", "--set", "cluster.system=dgx-h100"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_zero_with_one_data_parallel_rank_shards_nothing(capsys):
    # Llama 3 70B here runs TP 8 x PP 4 x DP 1: a ZeRO shard is one rank, so every stage is
    # the plain layout (same step, optimizer and memory), and the command says why
    assert main(["run", SCENARIO, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    for stage in (1, 2, 3):
        assert main(["run", SCENARIO, "--json", "--set", f"parallel.zero_stage={stage}"]) == 0
        captured = capsys.readouterr()
        sharded = json.loads(captured.out)
        for key in ("step_time_s", "optimizer_s", "peak_memory_bytes", "zero_stage"):
            assert sharded[key] == plain[key], (stage, key)
        assert f"note: ZeRO-{stage} shards over" in captured.err and "dp x cp = 1" in captured.err
    # with data parallelism to shard over, ZeRO-3 does shard: less memory
    # (exit code 3 where a layout does not fit: the step is still simulated and printed)
    assert main(["run", SCENARIO, "--json", "--set", "parallel.pp=2", "--set", "parallel.dp=2"]) in (0, 3)
    two = json.loads(capsys.readouterr().out)
    assert main(["run", SCENARIO, "--json", "--set", "parallel.pp=2", "--set", "parallel.dp=2",
                 "--set", "parallel.zero_stage=3"]) in (0, 3)
    captured = capsys.readouterr()
    assert json.loads(captured.out)["zero_stage"] == 3 and "note: ZeRO" not in captured.err
    assert json.loads(captured.out)["peak_memory_bytes"] < two["peak_memory_bytes"]


def test_long_stage_lists_and_notes_are_shortened_whole():
    from mpsim.explore.sweep import short_note
    from mpsim.results.report import stage_list

    # a run with a fixed step keeps its ends; other lists keep whole numbers only
    assert stage_list((0, 16, 32, 48, 64, 80, 96, 112)) == "0,16..112"
    assert stage_list((14, 30, 46, 62)) == "14,30,46,62"
    assert stage_list((1, 5, 9, 200, 3000, 40000)) == "1,5,9,200.."
    note = "invalid: " + "word " * 60
    short = short_note(note)
    assert len(short) <= 160 and short.endswith(" ...") and short[:-4].endswith("word")
    assert short_note("invalid: short") == "invalid: short"


def test_hfu_below_mfu_says_why(capsys):
    # Llama 3 70B at 8K with no recompute: causal attention runs half of the score matrix
    assert main(["run", SCENARIO, "--set", "parallel.recompute=none"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if "HFU" in line]
    assert "below MFU" in line
    assert main(["run", SCENARIO, "--set", "parallel.recompute=full"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if "HFU" in line]
    assert "below MFU" not in line  # full recompute adds more than causal attention saves
    # Deep Speech 2 counts 0.25 % more model FLOPs than its kernels run: the note follows the printed figures
    assert main(["run", str(SCENARIOS / "deepspeech2_8xa100.yaml")]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if "HFU" in line]
    mfu, hfu = (float(line.split(name)[1].split("%")[0]) for name in ("MFU", "HFU"))
    assert hfu <= mfu < hfu + 0.2 and ("below MFU" in line) == (hfu < mfu)
    # an HFU below the MFU by less than the printed digit says nothing; one a digit below says why
    summary = mpsim.api.simulate(str(SCENARIOS / "deepspeech2_8xa100.yaml")).summary
    for mfu_frac, hfu_frac, noted in ((0.2514, 0.2506, False), (0.2514, 0.2504, True)):
        text = format_summary(dataclasses.replace(summary, mfu=mfu_frac, hfu=hfu_frac))
        [line] = [line for line in text.splitlines() if "HFU" in line]
        assert ("below MFU" in line) == noted, line


def test_a_step_of_hours_says_so(capsys):
    # a what-if far from a real run: 1,024 sequences of 32,768 tokens a step on 64 V100s (about 2.4 h)
    assert main(["run", str(SCENARIOS / "gpt3_175b_64xa100.yaml"), "--set", "cluster.system=dgx-2",
                 "--set", "training.dtype=fp16", "--set", "parallel.global_batch_size=1024",
                 "--set", "model.seq_length=32768"]) in (0, 3)
    [line] = [line for line in capsys.readouterr().out.splitlines() if "step time" in line]
    assert re.search(r"step time +[0-9.]+ s \([0-9.]+ h\)", line)
    assert main(["run", SCENARIO]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if "step time" in line]
    assert " h)" not in line


def test_a_calibration_profile_is_named_and_a_link_what_if_it_absorbs_is_noted(tmp_path, capsys):
    # a profile fitted from an A100 trace extract prices the collectives it saw from its own lines;
    # the summary says a profile priced the step, and a slow NVLink what-if is told it does not reach them
    profile = tmp_path / "a100.yaml"
    trace = SCENARIOS.parent / "tests" / "data" / "traces" / "recsys16_step551.json.gz"
    assert main(["calibrate", "--from-trace", str(trace), "--system", "dgx-a100", "--accelerator", "a100-sxm-80gb",
                 "-o", str(profile)]) == 0
    capsys.readouterr()
    megatron = str(SCENARIOS / "megatron_22b_8xa100.yaml")
    assert main(["run", megatron, "--json", "--set", f"calibration={profile}"]) == 0
    assert "NVIDIA A100-SXM4-80GB" in json.loads(capsys.readouterr().out)["calibration"]
    assert main(["run", megatron, "--set", f"calibration={profile}", "--set", "faults.slow_link=0:nvlink@0.01"]) == 0
    captured = capsys.readouterr()
    assert "  calibration  a profile fitted from profiler traces on NVIDIA A100-SXM4-80GB" in captured.out
    assert "note: the calibration profile prices" in captured.err and "faults.slow_link" in captured.err
    assert main(["run", megatron, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"] is None


def test_fsdp_under_a_pipeline_with_more_chunks_than_torch_keeps_gathered_is_priced_not_noted(capsys):
    # torch's pipeline runtime keeps three of a rank's chunks gathered (parallel.fsdp_gathered_chunks):
    # with four the window frees and gathers them again, which the step and the memory now take in:
    # without resharding after the forward the weights are sharded between the passes (over 8 ranks:
    # the shard and three gathered chunks of four hold less than every chunk whole)
    base = ["run", SCENARIO, "--json", "--set", "parallel.pp=2", "--set", "parallel.dp=8", "--set", "cluster.nodes=16",
            "--set", "parallel.zero_stage=3", "--set", "parallel.schedule=interleaved-1f1b", "--set", "parallel.vpp=4",
            "--set", "parallel.reshard_after_forward=false"]
    assert main(base) in (0, 3)
    out, err = capsys.readouterr()
    assert "note: FSDP" not in err
    windowed = json.loads(out)
    assert main([*base, "--set", "parallel.fsdp_gathered_chunks=null"]) in (0, 3)
    every_chunk = json.loads(capsys.readouterr().out)
    assert windowed["peak_memory_bytes"] < every_chunk["peak_memory_bytes"]
    # a window of no chunks is refused in one line naming the field
    assert main([*base, "--set", "parallel.fsdp_gathered_chunks=0"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "parallel.fsdp_gathered_chunks" in line and "greater than 0" in line
