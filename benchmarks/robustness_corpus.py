"""A corpus of bad inputs, each with the exit code and the words its one line must hold.

Every case is a command line run in an empty folder holding the case's files. A bad input
must give exit code 2 and one line on standard error that names where the problem is (the
file, the ``--set`` or the option) and what it is; a job that does not fit in memory exit
code 3; a good input exit code 0. ``benchmarks/robustness.py`` runs every case in a
subprocess with a time limit; ``tests/test_robustness.py`` runs them in-process.

Cases are built from a small base scenario (Megatron's 22B on one DGX A100 node, TP 8) and a
data-parallel one, the shipped hardware and model files, and files written per case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASE = """name: corpus base
cluster:
  system: dgx-a100
  nodes: 1
model: megatron-22b
parallel:
  tp: 8
  pp: 1
  microbatch_size: 1
  global_batch_size: 8
  schedule: 1f1b
  recompute: full
"""
DP_BASE = BASE.replace("nodes: 1", "nodes: 2").replace("  pp: 1\n", "  pp: 1\n  dp: 2\n").replace(
    "global_batch_size: 8", "global_batch_size: 16")
SCHEDULE = "# ranks: 2\n0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1\n"
HF_LLAMA = """{"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
 "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
 "rms_norm_eps": 1e-5, "hidden_act": "silu"}"""


@dataclass(frozen=True)
class Case:
    """One input: the command line, the files it needs, what must come out."""

    id: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]  # fragments of the error line (exit 2/3); empty for a success
    exit: int = 2
    files: dict[str, bytes] = field(default_factory=dict)


def _text(name: str, text: str) -> dict[str, bytes]:
    return {name: text.encode()}


def _run_set(case_id: str, setting: str, *expect: str, base: str = BASE, exit: int = 2) -> Case:
    return Case(case_id, ("run", "s.yaml", "--set", setting), expect or (setting.split("=", 1)[0],), exit,
                _text("s.yaml", base))


def _scenario(case_id: str, text: str | bytes, *expect: str, extra: tuple[str, ...] = ()) -> Case:
    data = text if isinstance(text, bytes) else text.encode()
    return Case(case_id, ("run", "s.yaml", *extra), expect, 2, {"s.yaml": data})


# --set FIELD=VALUE on the base scenario: (field, bad values); each line must name the field
SET_CASES: list[tuple[str, tuple[str, ...]]] = [
    ("parallel.tp", ("true", "0", "-1", "5", "four", "99999999999999999999999", ".inf", "[1, 2]", "{a: 1}", "8.0",
                     "'8'")),
    ("parallel.pp", ("0", "false", "7", "1000")),
    ("parallel.dp", ("0", "3", "yes")),
    ("parallel.microbatch_size", ("yes", "0", "3", "1.5")),
    ("parallel.global_batch_size", ("0", "-5", "1000000000")),
    # a kernel the A100 file does not carry (cudnn is the Hopper files'), an empty name, a list
    ("training.attention_kernel", ("cudnn", "''", "[flash-attention-2]")),
    ("parallel.schedule", ("nope", "1f1bb", "''")),
    ("parallel.vpp", ("0", "3")),
    ("parallel.recompute", ("sometimes", "1")),
    ("parallel.recompute_num_layers", ("0", "-2", "abc", "1.5")),
    # Megatron-Core's layout strings: a stray letter, the loss not last, a chunk count or layer
    # sum that does not match the base run's one chunk of its layers
    ("parallel.layers_per_stage", ("'Et*2|x|L'", "'Et*4|L|t'", "'Et*2|t*2L'", "'Et*3L'", "atuo")),
    # Megatron-Core's microbatch groups: not a size, and a size on a schedule that has none (1f1b)
    ("parallel.microbatch_group_size", ("0", "-4", "big", "8")),
    ("parallel.cp", ("0", "5")),
    ("parallel.sequence_parallel", ("maybe", "2")),
    ("model.num_layers", ("40000000", "0", "true")),
    ("model.hidden_size", ("100000000", "0")),
    ("model.num_attention_heads", ("0", "7")),
    ("model.seq_length", ("0", "100000000")),
    ("model.vocab_size", ("0", "-1")),
    ("model.dropout", ("1.5", ".nan")),
    ("model.ffn_type", ("geluu",)),
    ("training.dtype", ("fp64",)),
    ("training.grad_reduce_bucket_bytes", ("'80 GB/s'", "-1", "'lots'")),
    ("training.memory_reserved", ("abc",)),
    ("training.transformer_impl", ("megatron", "true")),
    ("training.norm_kernel", ("maybe", "true", "operators")),  # operators: the base model's norm is not RMSNorm
    ("training.ffn_projections", ("maybe", "separate")),  # separate: the base run's layers are Megatron's
    # current scaling on a bf16 run; no such recipe
    ("training.fp8_recipe", ("current", "sometimes")),
    # DeepEP on a dense model; an fp8 dispatch without DeepEP
    ("training.moe_token_dispatcher", ("deepep", "nccl")),
    ("training.moe_dispatch_fp8", ("true", "fast")),
    # padding to capacity on a dense model (no capacity); not a switch
    ("training.moe_pad_to_capacity", ("true", "often")),
    # not one of true, false and with-receive
    ("training.pp_send_blocking", ("maybe", "2")),
    ("cluster.nodes", ("0", "1073741824", "0.5", "1.0")),
    ("cluster.system", ("nope-system",)),
    ("cluster.system.accelerator", ("nope-gpu",)),
    ("cluster.system.accelerator.efficiency.gemm", ("1.5", "0", ".nan", ".inf", "true")),
    ("cluster.system.accelerator.efficiency.gemm_tile", ("[0, 128]", "[-128, 128]", "[128]")),
    ("cluster.system.accelerator.efficiency.gemm_tile_k", ("0", "-64")),
    ("cluster.system.accelerator.memory.bandwidth", ("'-3 TB/s'", "'80 GiB'", ".inf", "'inf GB/s'")),
    ("cluster.system.accelerator.memory.capacity", ("'0 GiB'",)),
    ("cluster.system.accelerator.compute_units", ("0",)),
    ("cluster.system.collective_channels", ("100000",)),
    ("cluster.system.scale_up.bandwidth_per_device", ("'300 GB'", ".nan")),
    ("cluster.system.scale_up.efficiency", ("1.8",)),
    ("cluster.system.scale_out.oversubscription", (".inf", "0.5")),
    ("nme", ("x",)),
]


# the same on the data-parallel base, where a batch must split over the replicas
DP_SET_CASES: list[tuple[str, tuple[str, ...]]] = [
    ("parallel.global_batch_size", ("7", "17")),
    ("training.grad_reduce_bucket_bytes", ("'1 B'", "'10 B'")),
]


def _set_cases() -> list[Case]:
    cases = []
    for name, values in SET_CASES:
        for value in values:
            cases.append(_run_set(f"set {name}={value}", f"{name}={value}", name.split(".")[-1]))
    for name, values in DP_SET_CASES:
        for value in values:
            cases.append(_run_set(f"dp set {name}={value}", f"{name}={value}", name.split(".")[-1], base=DP_BASE))
    # a layer count of full recompute where the scenario recomputes only the attention core
    cases.append(_run_set("set recompute_num_layers with selective recompute", "parallel.recompute_num_layers=2",
                          "recompute_num_layers", base=BASE.replace("recompute: full", "recompute: selective")))
    # torchtitan's per-op policy on a GPT layer, whose biased projections run as addmm
    cases.append(_run_set("set selective-op recompute on biased projections", "parallel.recompute=selective-op",
                          "parallel.recompute", "linear_bias"))
    return cases


def _file_cases() -> list[Case]:
    accelerator = (ROOT / "hardware" / "accelerators" / "a100_sxm_80gb.yaml").read_text()
    system = (ROOT / "hardware" / "systems" / "dgx_a100.yaml").read_text()
    model = (ROOT / "scenarios" / "models" / "gpt3_175b.yaml").read_text()
    with_system = BASE.replace("system: dgx-a100", "system: sys.yaml")
    with_model = BASE.replace("model: megatron-22b", "model: m.yaml")
    with_accelerator = system.replace("accelerator: a100-sxm-80gb", "accelerator: acc.yaml")
    cases = [
        _scenario("scenario not UTF-8", b"name: x\n\xff\xfe: 1\n", "s.yaml", "not UTF-8"),
        _scenario("scenario key twice", BASE + "name: again\n", "s.yaml", "'name' given twice"),
        _scenario("scenario empty", "", "s.yaml", "mapping"),
        _scenario("scenario a list", "- a\n- b\n", "s.yaml", "mapping"),
        _scenario("scenario bad YAML", BASE + "  : [oops\n", "s.yaml", "malformed YAML"),
        _scenario("scenario tab indent", BASE.replace("  tp: 8", "\ttp: 8"), "s.yaml", "malformed YAML"),
        _scenario("scenario without model", BASE.replace("model: megatron-22b\n", ""), "model", "required"),
        _scenario("scenario without cluster", BASE.split("model:")[0].split("cluster:")[0] + "model: megatron-22b\n"
                  + BASE.split("model: megatron-22b\n")[1], "cluster", "required"),
        _scenario("scenario look-alike key", BASE.replace("name:", "n\u0430me:"), "non-ASCII", "name"),
        _scenario("scenario unknown field", BASE.replace("  tp: 8", "  tpp: 8"), "tpp", "did you mean"),
        _scenario("scenario huge integer", BASE.replace("tp: 8", "tp: " + "9" * 5000), "out of range"),
        _scenario("scenario bool tp", BASE.replace("tp: 8", "tp: true"), "parallel.tp", "boolean"),
        _scenario("scenario yes microbatch", BASE.replace("microbatch_size: 1", "microbatch_size: yes"),
                  "microbatch_size", "boolean"),
        _scenario("scenario decimal tp", BASE.replace("tp: 8", "tp: 8.0"), "parallel.tp", "whole number"),
        _scenario("scenario text microbatch", BASE.replace("microbatch_size: 1", "microbatch_size: '1'"),
                  "microbatch_size", "whole number"),
        _scenario("scenario missing model file", BASE.replace("model: megatron-22b", "model: nothere.yaml"),
                  "nothere.yaml"),
        _scenario("scenario unknown model name", BASE.replace("model: megatron-22b", "model: gpt-7"), "gpt-7"),
        _scenario("scenario layout over cluster", BASE.replace("  pp: 1", "  pp: 1\n  dp: 4"), "dp"),
        _scenario("scenario model base unknown field",
                  BASE.replace("model: megatron-22b", "model:\n  base: megatron-22b\n  num_layerz: 4"),
                  "s.yaml", "model.num_layerz", "did you mean"),
        _scenario("scenario model base bad value",
                  BASE.replace("model: megatron-22b", "model:\n  base: megatron-22b\n  num_layers: -4"),
                  "s.yaml", "model.num_layers"),
        _scenario("scenario null parallel", BASE.split("parallel:")[0] + "parallel:\n", "parallel"),
        Case("model file bad field", ("run", "s.yaml"), ("m.yaml", "num_layers"), 2,
             {"s.yaml": with_model.encode(), "m.yaml": model.replace("num_layers: 96", "num_layers: -96").encode()}),
        Case("model file unknown field", ("run", "s.yaml"), ("m.yaml", "hiden_size"), 2,
             {"s.yaml": with_model.encode(), "m.yaml": model.replace("hidden_size:", "hiden_size:").encode()}),
        Case("model file not UTF-8", ("run", "s.yaml"), ("m.yaml", "not UTF-8"), 2,
             {"s.yaml": with_model.encode(), "m.yaml": b"name: x\n\xc3\x28: 1\n"}),
        Case("model file key twice", ("run", "s.yaml"), ("m.yaml", "twice"), 2,
             {"s.yaml": with_model.encode(), "m.yaml": (model + "num_layers: 2\n").encode()}),
        Case("system file bad efficiency", ("run", "s.yaml"), ("sys.yaml", "efficiency"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": system.replace("efficiency: 0.80", "efficiency: 1.8").encode()}),
        Case("system file wrong unit", ("run", "s.yaml"), ("sys.yaml", "bandwidth_per_device"), 2,
             {"s.yaml": with_system.encode(),
              "sys.yaml": system.replace('bandwidth_per_device: "300 GB/s"', 'bandwidth_per_device: "300 GB"').encode()}),
        Case("system file channels over SMs", ("run", "s.yaml"), ("sys.yaml", "collective_channels"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": _set_key(system, "collective_channels", "1000")}),
        Case("accelerator file negative tile", ("run", "s.yaml"), ("acc.yaml", "gemm_tile"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": with_accelerator.encode(),
              "acc.yaml": accelerator.replace("gemm_tile: [128, 256]", "gemm_tile: [-128, 256]").encode()}),
        Case("accelerator file zero tile k", ("run", "s.yaml"), ("acc.yaml", "gemm_tile_k"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": with_accelerator.encode(),
              "acc.yaml": _set_key(accelerator, "  gemm_tile_k", "0")}),
        Case("accelerator file infinite bandwidth", ("run", "s.yaml"), ("acc.yaml", "bandwidth"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": with_accelerator.encode(),
              "acc.yaml": _set_key(accelerator, "  bandwidth", ".inf")}),
        Case("accelerator file nan memory efficiency", ("run", "s.yaml"), ("acc.yaml", "memory"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": with_accelerator.encode(),
              "acc.yaml": _set_key(accelerator, "  memory", ".nan", after="efficiency:")}),
        Case("accelerator file head-size series short", ("run", "s.yaml"),
             ("acc.yaml", "other_head_dims (head_dim 64).forward", "5 values for 6"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": with_accelerator.encode(),
              "acc.yaml": accelerator.replace('forward: ["147.0 TFLOP/s", ', 'forward: [').encode()}),
        Case("accelerator file head size twice", ("run", "s.yaml"), ("acc.yaml", "repeats a head dimension"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": with_accelerator.encode(),
              "acc.yaml": accelerator.replace("- head_dim: 64", "- head_dim: 128").encode()}),
        Case("accelerator file sweep forward without backward", ("run", "s.yaml"),
             ("acc.yaml", "attention_sweep", "go together"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": with_accelerator.encode(),
              "acc.yaml": accelerator.replace('    backward: ["146.1', '    # backward: ["146.1').encode()}),
        Case("accelerator file causal-only sweep without its backward", ("run", "s.yaml"),
             ("acc.yaml", "backward_causal is needed"), 2,
             {"s.yaml": with_system.encode(), "sys.yaml": with_accelerator.encode(),
              "acc.yaml": accelerator.replace('    backward: ["146.1', '    # backward: ["146.1')
              .replace('    forward: ["169.2', '    # forward: ["169.2')
              .replace('        forward: ["147.0', '        # forward: ["147.0').encode()}),
    ]
    return cases


def _set_key(text: str, key: str, value: str, after: str | None = None) -> bytes:
    """``text`` with the first line starting ``key:`` (after the line starting ``after``) set to ``value``."""
    lines = text.splitlines()
    start = 0 if after is None else next(i for i, line in enumerate(lines) if line.startswith(after))
    for i in range(start, len(lines)):
        if lines[i].startswith(key + ":"):
            lines[i] = f"{key}: {value}"
            return ("\n".join(lines) + "\n").encode()
    raise KeyError(key)


def _hf_cases() -> list[Case]:
    import json

    good = json.loads(HF_LLAMA)
    scenario = BASE.replace("model: megatron-22b", "model: config.json").replace("tp: 8", "tp: 8\n  cp: 1")

    def hf(case_id: str, config: dict | str, *expect: str) -> Case:
        text = config if isinstance(config, str) else json.dumps(config)
        return Case(case_id, ("run", "s.yaml"), ("config.json", *expect), 2,
                    {"s.yaml": scenario.encode(), "config.json": text.encode()})

    def without(key: str) -> dict:
        return {k: v for k, v in good.items() if k != key}

    cases = [hf(f"hf config without {key}", without(key), key)
             for key in ("num_attention_heads", "hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")]
    cases += [
        hf("hf config zero heads", {**good, "num_attention_heads": 0}, "num_attention_heads"),
        hf("hf config string hidden", {**good, "hidden_size": "4096"}, "hidden_size"),
        hf("hf config bool layers", {**good, "num_hidden_layers": True}, "num_hidden_layers"),
        hf("hf config zero kv heads", {**good, "num_key_value_heads": 0}, "num_key_value_heads"),
        hf("hf config unknown type", {**good, "model_type": "gpt-neo-x"}, "model_type"),
        hf("hf config unknown activation", {**good, "hidden_act": "sigmoid"}, "hidden_act"),
        hf("hf mixtral without experts", {**good, "model_type": "mixtral", "num_experts_per_tok": 2},
           "num_local_experts"),
        hf("hf deepseek without routed experts", {**good, "model_type": "deepseek_v3"}, "n_routed_experts"),
        hf("hf config not JSON", "{model_type: llama, oops", "malformed"),
        hf("hf config float heads", {**good, "num_attention_heads": 32.5}, "num_attention_heads"),
    ]
    return cases


def _schedule_cases() -> list[Case]:
    def check(case_id: str, text: bytes | str, *expect: str) -> Case:
        data = text if isinstance(text, bytes) else text.encode()
        return Case(case_id, ("schedule", "p.txt"), ("p.txt", *expect), 2, {"p.txt": data})

    return [
        check("schedule file not UTF-8", b"0F0 \xff\n", "not UTF-8"),
        check("schedule file unknown action", SCHEDULE.replace("0B1", "0X1"), "line"),
        check("schedule file missing backward", "0F0\n", "0B0", "missing"),
        check("schedule file action twice", SCHEDULE.replace("0F1 0B0", "0F0 0B0"), "0F0 appears 2 times"),
        check("schedule file empty", "", "p.txt"),
        check("schedule file backward before forward", "0B0 0F0\n", "deadlock"),
        Case("schedule pp 0", ("schedule", "1f1b", "--pp", "0", "--microbatches", "4"), ("--pp", "1 or more")),
        Case("schedule microbatches 0", ("schedule", "1f1b", "--pp", "4", "--microbatches", "0"),
             ("--microbatches", "1 or more")),
        Case("schedule microbatches huge", ("schedule", "1f1b", "--pp", "4", "--microbatches", "100000000"),
             ("microbatches", "fewer microbatches")),
        Case("schedule pp huge digits", ("schedule", "1f1b", "--pp", "9" * 40, "--microbatches", "4"),
             ("--pp", "out of range")),
        Case("schedule unknown name", ("schedule", "1f1bb", "--pp", "4", "--microbatches", "8"), ("1f1bb",)),
        Case("schedule missing file", ("schedule", "file:nothere.txt"), ("nothere.txt", "not found")),
        Case("schedule without sizes", ("schedule", "1f1b"), ("--pp",)),
        Case("schedule vpp negative", ("schedule", "1f1b", "--pp", "4", "--vpp", "-2", "--microbatches", "8"),
             ("--vpp",)),
    ]


def _cli_cases() -> list[Case]:
    base = _text("s.yaml", BASE)

    def run(case_id: str, *args: str, expect: tuple[str, ...], exit: int = 2, files: dict | None = None) -> Case:
        return Case(case_id, args, expect, exit, base if files is None else files)

    plan = ("plan", "gpt3-175b", "--cluster", "dgx-a100")
    return [
        run("run missing scenario", "run", "nothere.yaml", expect=("nothere.yaml", "not found")),
        run("run scenario is a folder", "run", ".", expect=(".",)),
        run("set without equals", "run", "s.yaml", "--set", "parallel.tp", expect=("FIELD=VALUE",)),
        run("set empty field", "run", "s.yaml", "--set", "=4", expect=("empty field",)),
        run("set into a value", "run", "s.yaml", "--set", "parallel.tp.x=4", expect=("parallel.tp",)),
        run("set huge integer", "run", "s.yaml", "--set", "parallel.tp=" + "9" * 5000, expect=("out of range",)),
        run("plot unknown format", "run", "s.yaml", "--plot", "x.xyz", expect=("--plot", ".xyz")),
        run("plot no extension", "run", "s.yaml", "--plot", "timeline", expect=("--plot", "extension")),
        run("plot missing folder", "run", "s.yaml", "--plot", "nodir/x.png", expect=("--plot", "does not exist")),
        run("plot is a folder", "run", "s.yaml", "--plot", ".", expect=("--plot", "folder")),
        run("memory plot bad format", "run", "s.yaml", "--memory-plot", "m.nope", expect=("--memory-plot", ".nope")),
        run("trace missing folder", "run", "s.yaml", "--trace", "nodir/t.json", expect=("--trace", "does not exist")),
        run("trace is a folder", "run", "s.yaml", "--trace", ".", expect=("--trace", "folder")),
        run("snapshot missing folder", "run", "s.yaml", "--memory-snapshot", "no/s.pickle",
            expect=("--memory-snapshot",)),
        run("snapshot rank negative", "run", "s.yaml", "--memory-snapshot-rank", "-1", expect=("--memory-snapshot-rank",)),
        run("snapshot rank too high", "run", "s.yaml", "--memory-snapshot", "s.pickle", "--memory-snapshot-rank", "9",
            expect=("--memory-snapshot-rank",)),
        run("run out of memory", "run", "s.yaml", "--set", "parallel.recompute=none", "--set",
            "parallel.microbatch_size=8", "--set", "parallel.global_batch_size=64", expect=("out of memory",), exit=3),
        run("unknown command", "runn", "s.yaml", expect=("runn",)),
        run("unknown option", "run", "s.yaml", "--fast", expect=("--fast",)),
        run("compare empty schedules", "compare", "s.yaml", "--schedules", ",", expect=("--schedules",)),
        run("compare unknown schedule", "compare", "s.yaml", "--schedules", "1f1b,nope", expect=("nope",)),
        run("compare plot missing folder", "compare", "s.yaml", "--schedules", "1f1b", "--plot", "no/x.png",
            expect=("--plot",)),
        run("sweep top negative", "sweep", "s.yaml", "--sweep", "parallel.pp=1,2", "--top", "-1", expect=("--top",)),
        run("sweep typo field", "sweep", "s.yaml", "--sweep", "parallel.tpp=4,8", expect=("tpp",)),
        run("sweep empty range", "sweep", "s.yaml", "--sweep", "parallel.tp=5..1", expect=("range",)),
        run("sweep huge range", "sweep", "s.yaml", "--sweep", "parallel.tp=1..100000000", expect=("range",)),
        run("sweep huge power", "sweep", "s.yaml", "--sweep", "parallel.tp=2^1..999999", expect=("range",)),
        run("sweep range digits", "sweep", "s.yaml", "--sweep", "parallel.tp=1.." + "9" * 30, expect=("range",)),
        run("sweep nothing", "sweep", "s.yaml", expect=("nothing to sweep",)),
        run("sweep out missing folder", "sweep", "s.yaml", "--sweep", "parallel.pp=1,2", "--out", "no/r.jsonl",
            expect=("--out",)),
        run("sweep workers zero", "sweep", "s.yaml", "--sweep", "parallel.pp=1,2", "--workers", "0",
            expect=("--workers",)),
        run("plan devices zero", *plan, "--devices", "0", "--global-batch", "8", expect=("--devices",)),
        run("plan devices huge", *plan, "--devices", "1073741824", "--global-batch", "1536", expect=("devices",)),
        run("plan global batch zero", *plan, "--devices", "8", "--global-batch", "0", expect=("--global-batch",)),
        run("plan unknown schedule", *plan, "--devices", "64", "--global-batch", "64", "--schedules", "1f1b,nope",
            expect=("nope",)),
        run("plan top zero", *plan, "--devices", "64", "--global-batch", "64", "--top", "0", expect=("--top",)),
        run("plan zero stages bad", *plan, "--devices", "64", "--global-batch", "64", "--zero-stages", "5",
            expect=("--zero-stages",)),
        run("plan unknown model", "plan", "gpt-7", "--cluster", "dgx-a100", "--devices", "8", "--global-batch", "8",
            expect=("gpt-7",)),
        run("plan unknown cluster", "plan", "gpt3-175b", "--cluster", "dgx-z", "--devices", "8", "--global-batch", "8",
            expect=("dgx-z",)),
        run("plan missing devices", *plan, "--global-batch", "8", expect=("--devices",)),
        run("plan nothing fits", *plan, "--devices", "8", "--global-batch", "8", expect=(), exit=3),
        run("plan every layout invalid", *plan, "--devices", "64", "--global-batch", "1000000000",
            expect=("invalid",)),
        run("hardware show unknown", "hardware", "show", "h1000", expect=("h1000",)),
        run("hardware show accelerator file", "hardware", "show",
            str(ROOT / "hardware" / "accelerators" / "h100_sxm_80gb.yaml"), expect=(), exit=0),
        run("collective unknown op", "collective", "--op", "all-scatter", "--system", "dgx-a100", "--ranks", "8",
            expect=("all-scatter",)),
        run("collective zero ranks", "collective", "--system", "dgx-a100", "--ranks", "0", expect=("--ranks",)),
        run("collective unknown system", "collective", "--system", "dgx-z", "--ranks", "8", expect=("dgx-z",)),
        run("collective bad size", "collective", "--system", "dgx-a100", "--ranks", "8", "--size", "1 GB/s",
            expect=("--size",)),
        run("import-torch unknown module", "import-torch", "nomodule:Model", "--input-shape", "1,16",
            expect=("nomodule",)),
        run("import-torch missing file", "import-torch", "nofile.py:make", "--input-shape", "1,16",
            expect=("nofile.py",)),
        run("run sweep block", "run", "s.yaml", expect=(), exit=0,
            files=_text("s.yaml", BASE + "sweep:\n  parallel.pp: [1, 2]\n")),
        run("run base ok", "run", "s.yaml", expect=(), exit=0),
        # reports, traces, listings and CSV files
        run("report missing output", "report", "s.yaml", expect=("-o",)),
        run("report missing folder", "report", "s.yaml", "-o", "nodir/r.html", expect=("-o/--output", "does not exist")),
        run("report is a folder", "report", "s.yaml", "-o", ".", expect=("-o/--output", "folder")),
        run("report missing scenario", "report", "nothere.yaml", "-o", "r.html", expect=("nothere.yaml",)),
        run("run report missing folder", "run", "s.yaml", "--report", "no/r.html", expect=("--report",)),
        run("compare report missing folder", "compare", "s.yaml", "--schedules", "1f1b", "--report", "no/r.html",
            expect=("--report",)),
        run("sweep report missing folder", "sweep", "s.yaml", "--sweep", "parallel.pp=1,2", "--report", "no/r.html",
            expect=("--report",)),
        run("report out of memory", "report", "s.yaml", "-o", "r.html", "--set", "parallel.recompute=none", "--set",
            "parallel.microbatch_size=8", "--set", "parallel.global_batch_size=64", expect=(), exit=3),
        run("trace compact and full", "run", "s.yaml", "--trace", "t.json", "--trace-compact", "--trace-full",
            expect=("--trace",)),
        run("trace compact without trace", "run", "s.yaml", "--trace-compact", expect=("--trace",)),
        run("trace gzip ok", "run", "s.yaml", "--trace", "t.json.gz", expect=(), exit=0),
        run("list unknown kind", "list", "acelerators", expect=("acelerators", "did you mean")),
        run("csv missing folder", "compare", "s.yaml", "--schedules", "1f1b", "--csv", "no/c.csv", expect=("--csv",)),
        run("csv to stdout with json", "compare", "s.yaml", "--schedules", "1f1b", "--csv", "-", "--json",
            expect=("--csv",)),
        # variability, goodput, degraded parts
        run("samples zero", "run", "s.yaml", "--samples", "0", expect=("--samples",)),
        run("samples without variation", "run", "s.yaml", "--samples", "5", expect=("s.yaml", "variability.cv")),
        run("seed negative", "run", "s.yaml", "--samples", "5", "--seed", "-1", expect=("--seed",)),
        run("variation negative", "run", "s.yaml", "--set", "variability.cv.gemm=-1", expect=("variability.cv.gemm",)),
        run("distribution plot without samples", "run", "s.yaml", "--distribution-plot", "d.png",
            expect=("--distribution-plot", "--samples")),
        run("goodput without tokens", "run", "s.yaml", "--goodput", expect=("--goodput", "--tokens")),
        run("tokens without goodput", "run", "s.yaml", "--tokens", "1e12", expect=("--tokens", "--goodput")),
        run("goodput without storage", "run", "s.yaml", "--goodput", "--tokens", "1e12",
            expect=("s.yaml", "reliability.storage_bandwidth")),
        run("slow gpu rank outside", "run", "s.yaml", "--set", "faults.slow_gpu=99@0.5", expect=("faults.slow_gpu", "99")),
        run("slow gpu speed above one", "run", "s.yaml", "--set", "faults.slow_gpu=1@1.5", expect=("faults.slow_gpu",)),
        run("slow gpu malformed", "run", "s.yaml", "--set", "faults.slow_gpu=abc", expect=("faults.slow_gpu", "abc")),
        run("slow gpu ok", "run", "s.yaml", "--set", "faults.slow_gpu=1@0.5", expect=(), exit=0),
    ]


def _calibration_cases() -> list[Case]:
    scenario = BASE + "calibration: prof.yaml\n"

    def profile(case_id: str, text: bytes | str, *expect: str) -> Case:
        data = text if isinstance(text, bytes) else text.encode()
        return Case(case_id, ("run", "s.yaml"), expect, 2, {"s.yaml": scenario.encode(), "prof.yaml": data})

    header = "format: mpsim-calibration/1\n"
    return [
        profile("profile missing", b"", "prof.yaml"),
        profile("profile not a mapping", "- 1\n- 2\n", "prof.yaml"),
        profile("profile wrong format", "format: mpsim-calibration/9\ndevice: {}\ncompute: {}\n", "prof.yaml",
                "format"),
        profile("profile without device", header + "compute: {}\n", "prof.yaml", "device"),
        profile("profile not UTF-8", b"format: \xff\n", "prof.yaml", "not UTF-8"),
        profile("profile key twice", header + header, "prof.yaml", "twice"),
        profile("profile bad YAML", header + "device: [\n", "prof.yaml", "malformed YAML"),
        profile("profile unknown field", header + "devise: {}\n", "prof.yaml", "devise"),
        Case("profile file absent", ("run", "s.yaml"), ("nothere.yaml",), 2,
             _text("s.yaml", BASE + "calibration: nothere.yaml\n")),
    ]


def cases() -> list[Case]:
    """Every case of the corpus, ids unique."""
    every = _set_cases() + _file_cases() + _hf_cases() + _schedule_cases() + _calibration_cases() + _cli_cases()
    every += _trace_cases()
    ids = [case.id for case in every]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    return every


def write_files(case: Case, folder: Path) -> None:
    for name, data in case.files.items():
        (folder / name).write_bytes(data)


def judge(case: Case, exit_code: int | None, stderr: str) -> str:
    """clean, traceback, hang or accepted (a bad input taken as good, or the wrong line)."""
    if exit_code is None:
        return "hang"
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if exit_code != case.exit:
        return "accepted" if exit_code == 0 else "wrong-exit"
    if case.exit == 2:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        error_lines = [line for line in lines if line.startswith("error:")]
        if len(error_lines) != 1 or not all(fragment in error_lines[0] for fragment in case.expect):
            return "wrong-line"
    elif case.exit == 3 and case.expect and not all(fragment in stderr for fragment in case.expect):
        return "wrong-line"
    return "clean"


def _trace_cases() -> list[Case]:
    """``mpsim trace summary`` on broken profiler traces: one line naming the file."""
    import gzip
    import json

    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
              "args": {"correlation": 1, "stream": 7, "device": 0}}
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}
    good = json.dumps({"traceEvents": [step, kernel]}).encode()
    cpu_only = json.dumps({"traceEvents": [step]}).encode()

    def summary(case_id: str, name: str, data: bytes, *expect: str, extra: tuple[str, ...] = ()) -> Case:
        return Case(case_id, ("trace", "summary", name, *extra), (name, *expect), 2, {name: data})

    return [
        summary("trace truncated gzip", "t.json.gz", gzip.compress(good, mtime=0)[:30], "truncated"),
        summary("trace not JSON", "t.json", b"{not json", "not valid JSON"),
        summary("trace without traceEvents", "t.json", b'{"schemaVersion": 1}', "traceEvents"),
        summary("trace without GPU kernels", "t.json", cpu_only, "no GPU kernels"),
        summary("trace step absent", "t.json", good, "--step", "ProfilerStep#7", extra=("--step", "7")),
    ]
