"""The hardware library: every file loads, every number names its source, the commands print it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpsim.cli import main
from mpsim.errors import InputError
from mpsim.specs.catalog import accelerator_names, load_accelerator, load_system, system_names
from tests.conftest import ROOT, SCENARIOS, CliRun, run_in_process

HARDWARE = SCENARIOS.parent / "hardware"
FILES = sorted(HARDWARE.glob("*/*.yaml"))
SOURCES = (SCENARIOS.parent / "docs" / "hardware-sources.md").read_text()

# a YAML line whose value starts with a number, a quoted number or a list of numbers
NUMERIC_LINE = re.compile(r"""^\s*(-\s+)?(?!name:|description:|vendor:)[\w]+:\s*("?[-+]?\d|\[\s*\d)""")

ISSUE_ACCELERATORS = ["v100-sxm2-32gb", "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-pcie-80gb",
                      "h200-sxm-141gb", "b200", "gb200", "mi250x", "mi300x", "mi325x", "gaudi2", "gaudi3",
                      "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"]
ISSUE_SYSTEMS = ["dgx-a100", "dgx-h100", "hgx-h200", "hgx-b200", "gb200-nvl72", "mi300x-platform", "tpu-v4-4x4x8",
                 "tpu-v5p-8x8x8", "tpu-v5e-16x16", "tpu-v6e-16x16"]


def source_keys() -> set[str]:
    """Keys of the table in docs/hardware-sources.md (first column, comma-separated)."""
    keys = set()
    for line in SOURCES.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 2 and cells[1] and cells[1] not in ("key", "---"):
            keys.update(part.strip() for part in cells[1].split(","))
    return keys


def test_the_library_has_every_device_and_machine_of_the_issue():
    assert set(ISSUE_ACCELERATORS) <= set(accelerator_names())
    assert set(ISSUE_SYSTEMS) <= set(system_names())


# --- the numbers against the datasheets ---------------------------------------------------------------------
# Values as printed in shared/reference/hardware.md (sections 1.1-1.3, 2.1, 2.2, 3.2), which
# gathers the vendors' datasheets; where sources disagree, every printed value is listed and
# the file may use any of them. TFLOP/s are dense; memory in the units printed (GB, or GiB
# where the source says GiB); bandwidth in GB/s.
GB, GIB = 1e9, 2**30
DATASHEETS = {
    # name: ({dtype: TFLOP/s or (alternatives)}, (HBM, unit), HBM GB/s or (alternatives), SMs / CUs / MMEs / MXUs)
    "v100-sxm2-32gb": ({"fp32": (15, 15.7), "fp16": (125, 120)}, (32, GB), 900, 80),
    "a100-sxm-40gb": ({"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, (40, GB), 1555, 108),
    "a100-sxm-80gb": ({"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, (80, GB), 2039, 108),
    "h100-sxm-80gb": ({"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}, (80, GB), 3350,
                      132),
    "h100-pcie-80gb": ({"fp32": 51, "tf32": 378, "bf16": 756, "fp16": 756, "fp8": 1513}, (80, GB), (2000, 2040), 114),
    "h200-sxm-141gb": ({"fp32": 67, "tf32": 494.5, "bf16": 989, "fp16": 989, "fp8": 1979}, (141, GB), 4800, 132),
    "b200": ({"fp32": 80, "tf32": (1125, 1100), "bf16": 2250, "fp16": 2250, "fp8": 4500}, ((180, 192), GB), 8000,
             148),
    # hardware.md's 148 SMs are marked "inferred = B200"; the part's own 152 are VeOmni's (VEOMNI-986)
    "gb200": ({"fp32": (80, 90), "tf32": 1250, "bf16": 2500, "fp16": 2500, "fp8": 5000}, ((186, 192), GB), 8000,
              152),
    # a package of two GCDs; mpsim's device is one GCD, half of everything (one matmul runs on one GCD)
    "mi250x": ({"fp32": 95.7 / 2, "bf16": 383 / 2, "fp16": 383 / 2}, (128 / 2, GB), (3200 / 2, 3280 / 2), 220 // 2),
    "mi300x": ({"fp32": 163.4, "tf32": 653.7, "bf16": (1307.4, 1300), "fp16": (1307.4, 1300), "fp8": 2610},
               (192, GB), 5300, 304),
    "mi325x": ({"fp32": 163.4, "tf32": 653.7, "bf16": 1300, "fp16": 1300, "fp8": 2610}, (256, GB), 6000, 304),
    "gaudi2": ({"bf16": 432, "fp8": 865}, (96, GB), 2460, 2),
    "gaudi3": ({"fp32": 229, "tf32": 459, "bf16": (1677, 1835), "fp16": 459, "fp8": (1677, 1835)}, (128, GB),
               (3670, 3700), 8),
    "tpu-v4": ({"bf16": 275}, (32, GIB), 1200, 2 * 4),
    "tpu-v5e": ({"bf16": 197}, (16, GB), (819, 800 * GIB / GB), 4),
    "tpu-v5p": ({"bf16": 459, "fp8": 459}, (95, GIB), 2765, 2 * 4),
    "tpu-v6e": ({"bf16": 918, "fp8": 918}, (32, GB), 1638, 2),
    # not in hardware.md's datasheet sections: MLE-ACC's dense peaks, JSC-JUPITER's memory and SMs
    "gh200": ({"fp32": 67, "tf32": 494.5, "bf16": 989, "fp16": 989, "fp8": 1979}, (96, GB), 4000, 132),
}
PLACEHOLDERS = {"cpu-host"}  # no datasheet: replaced by a calibration


def alternatives(value) -> tuple[float, ...]:
    return value if isinstance(value, tuple) else (value,)


def matches_one(actual: float, printed, rel: float) -> bool:
    return any(actual == pytest.approx(v, rel=rel) for v in alternatives(printed))


def test_every_accelerator_has_a_datasheet_row():
    assert set(accelerator_names()) - PLACEHOLDERS == set(DATASHEETS)


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_accelerator_peaks_are_the_datasheets(name):
    peaks, _, _, _ = DATASHEETS[name]
    acc = load_accelerator(name)
    # no dtype the datasheet does not give (V100 has no bf16), none it gives left out
    assert set(acc.peak_flops) == set(peaks)
    for dtype, printed in peaks.items():
        # 1 %: the files keep the datasheet's digits, sources round differently (989 / 989.4)
        assert matches_one(acc.peak(dtype) / 1e12, printed, rel=0.01), (dtype, acc.peak(dtype), printed)


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_accelerator_memory_and_units_are_the_datasheets(name):
    _, (capacity, unit), bandwidth, units = DATASHEETS[name]
    acc = load_accelerator(name)
    # a capacity printed in GB may be read as GB or as GiB (what the device exposes), never more
    assert any(c * unit <= acc.memory.capacity <= c * GIB for c in alternatives(capacity)), acc.memory.capacity
    assert matches_one(acc.memory.bandwidth / 1e9, bandwidth, rel=0.01), acc.memory.bandwidth
    assert acc.compute_units == units


# where the datasheet's ratios hold: tf32 at half the 16-bit rate, fp8 at twice it
HALF_RATE_TF32 = ["a100-sxm-80gb", "a100-sxm-40gb", "h100-sxm-80gb", "h100-pcie-80gb", "h200-sxm-141gb", "gh200",
                  "b200", "gb200", "mi300x", "mi325x"]
DOUBLE_RATE_FP8 = ["h100-sxm-80gb", "h100-pcie-80gb", "h200-sxm-141gb", "gh200", "b200", "gb200", "mi300x",
                   "mi325x", "gaudi2"]


@pytest.mark.parametrize("name", HALF_RATE_TF32)
def test_tf32_runs_at_half_the_bf16_rate(name):
    acc = load_accelerator(name)
    assert acc.peak("tf32") == pytest.approx(acc.peak("bf16") / 2, rel=0.01)


@pytest.mark.parametrize("name", DOUBLE_RATE_FP8)
def test_fp8_runs_at_twice_the_bf16_rate(name):
    acc = load_accelerator(name)
    assert acc.peak("fp8") == pytest.approx(2 * acc.peak("bf16"), rel=0.01)


@pytest.mark.parametrize("name", sorted(n for n, (peaks, *_) in DATASHEETS.items() if {"bf16", "fp16"} <= set(peaks)))
def test_fp16_runs_at_the_bf16_rate_except_on_gaudi3(name):
    acc = load_accelerator(name)
    if name == "gaudi3":  # FP16 is not accelerated like BF16 on Gaudi 3 (MLE-ACC)
        assert acc.peak("fp16") < acc.peak("bf16") / 3
    else:
        assert acc.peak("fp16") == acc.peak("bf16")


# best measured bf16 matmul (MAMF, TFLOP/s; hardware.md 3.2); H200 has H100's BF16 MAMF; the 96 GB GH200's is
# its own sweep's (MLE-PR60), not hardware.md's 828.6 of the 900 W HBM3e part
MAMF_BF16 = {"a100-sxm-80gb": 271.2, "h100-sxm-80gb": 794.5, "h200-sxm-141gb": 794.5, "gh200": 821.0, "b200": 1745.0,
             "gb200": 1822.0, "mi300x": 668.4, "mi325x": 784.9, "gaudi2": 418.7, "gaudi3": 1243.0}
GEMM_FROM_ANOTHER_MEASUREMENT = {"a100-sxm-80gb"}  # a sustained 8192^3 GEMM, below the MAMF sweep's best


@pytest.mark.parametrize("name", sorted(MAMF_BF16))
def test_gemm_efficiency_reaches_the_best_measured_matmul_and_no_more(name):
    acc = load_accelerator(name)
    achieved = acc.efficiency.gemm * acc.peak("bf16") / 1e12
    assert achieved <= MAMF_BF16[name] * 1.005
    if name not in GEMM_FROM_ANOTHER_MEASUREMENT:
        assert achieved == pytest.approx(MAMF_BF16[name], rel=0.005)


# the best-measured streaming kernel that reads and writes on each part whose file carries a measurement
# (GB/s; the sources are the files' comments, docs/hardware-sources.md): efficiency.memory is its share
# of the datasheet bandwidth
STREAMING_GBPS = {"a100-sxm-40gb": 1400, "a100-sxm-80gb": 1725,
                  "h100-sxm-80gb": 3 * 4 * 2**30 / 4.1e-3 / 1e9,  # a vector add of 2^30 fp32 in 4.1 ms (SB-GPU)
                  "h100-pcie-80gb": 1832, "h200-sxm-141gb": 4377, "gh200": 3534.6, "b200": 7087, "mi300x": 4269,
                  "v100-sxm2-32gb": 810, "tpu-v6e": 1359.6,
                  "mi250x": 1399}  # an MI210's reading: one GCD of the same memory


@pytest.mark.parametrize("name", sorted(STREAMING_GBPS))
def test_memory_efficiency_is_the_best_measured_streaming_kernel(name):
    acc = load_accelerator(name)
    assert acc.efficiency.memory * acc.memory.bandwidth / 1e9 == pytest.approx(STREAMING_GBPS[name], rel=0.01)


# systems: (accelerator, devices per node, scale-up links per device x GB/s per link and direction,
# node scale-out in Gb/s as NICs x rate, or None where no source gives it)
SYSTEMS = {
    "dgx2-v100": ("v100-sxm2-32gb", 16, (6, 25), None),  # NVLink 2
    "dgx-a100": ("a100-sxm-80gb", 8, (12, 25), (8, 200)),  # NVLink 3, 8 HDR NICs
    "dgx-h100": ("h100-sxm-80gb", 8, (18, 25), (8, 400)),  # NVLink 4, 8 CX-7
    "h100-roce-clos": ("h100-sxm-80gb", 8, (18, 25), (8, 400)),  # HGX H100 board, one 400G RoCE NIC per GPU
    "hgx-h200": ("h200-sxm-141gb", 8, (18, 25), (8, 400)),
    "hgx-b200": ("b200", 8, (18, 50), (8, 400)),  # NVLink 5; 400 GB/s per node
    "gb200-nvl72": ("gb200", 72, (18, 50), (72, 400)),  # one CX-7 per GPU, 3.6 TB/s per rack
    "mi300x-platform": ("mi300x", 8, (7, 64), None),  # 128 GB/s per link both ways, 7 peers
    "mi325x-platform": ("mi325x", 8, (7, 64), None),
    # 21 of the 24 Ethernet ports go 3 to each of the 7 peers, the other 3 out of the node
    "gaudi2-hls": ("gaudi2", 8, (7, 3 * 100 / 8), (8, 3 * 100)),  # 100 GbE ports
    "gaudi3-hls": ("gaudi3", 8, (7, 3 * 200 / 8), (8, 3 * 200)),  # 200 GbE ports; 600 GB/s out of the node
    "h100-pcie-server": ("h100-pcie-80gb", 8, (1, 63), None),  # PCIe Gen5 x16
    "tpu-v4-4x4x8": ("tpu-v4", 4 * 4 * 8, (6, 45), None),  # ICI 4.5e10 B/s one way per link, 3D torus
    "tpu-v5p-8x8x8": ("tpu-v5p", 8 * 8 * 8, (6, 90), None),
    "tpu-v5e-16x16": ("tpu-v5e", 16 * 16, (4, 45), (32 * 2, 100)),  # 2 x 100 Gb/s per 8-chip host: 6.4 Tb/s
    "tpu-v6e-16x16": ("tpu-v6e", 16 * 16, (4, 90), None),
    "gh200-vista": ("gh200", 1, (18, 25), (1, 400)),  # one GPU per node (its NVLink unused), one NDR port
    "gh200-alps": ("gh200", 4, (3, 150), (4, 200)),  # six NVLink 4 links to each peer, one Slingshot NIC per GPU
    "gh200-jupiter": ("gh200", 4, (3, 150), (4, 200)),  # NVLink 4 pairs at 150 GB/s, 4x NDR200
}
SYSTEM_PLACEHOLDERS = {"local-cpu"}


def test_every_system_has_a_datasheet_row():
    assert set(system_names()) - SYSTEM_PLACEHOLDERS == set(SYSTEMS)


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_system_nodes_and_links_are_the_datasheets(name):
    accelerator, devices, (links, per_link), nics = SYSTEMS[name]
    system = load_system(name)
    assert system.accelerator.name == accelerator
    assert system.devices_per_node == devices
    assert system.scale_up.links_per_device == links
    assert system.scale_up.bandwidth_per_device == pytest.approx(links * per_link * 1e9, rel=1e-6)
    if nics is not None:
        count, gbps = nics
        out = system.scale_out
        assert out.nics_per_node * out.nic_bandwidth == pytest.approx(count * gbps * 1e9 / 8, rel=1e-6)


@pytest.mark.parametrize("name,min_devices", [("dgx-h100", 5), ("hgx-h200", 5), ("hgx-b200", 6),
                                              ("gb200-nvl72", 6), ("dgx-a100", None), ("dgx2-v100", None)])
def test_only_nvswitch_gen3_and_later_reduce_in_the_switch(name, min_devices):
    # NVLS from 5 GPUs on Hopper, 6 on Blackwell; NVSwitch gen2 (DGX A100) and gen1 cannot reduce
    nvls = load_system(name).scale_up.in_switch_reduction
    assert (nvls.min_devices if nvls is not None else None) == min_devices


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_every_number_has_a_source_comment(path):
    keys = source_keys()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not NUMERIC_LINE.match(line):
            continue
        assert "#" in line, f"{path.name}:{number}: a number without a source comment: {line.strip()}"
        comment = line.split("#", 1)[1]
        cited = "inferred" in comment or any(key in comment for key in keys)
        assert cited, f"{path.name}:{number}: the comment names no source key of docs/hardware-sources.md " \
                      f"and does not say 'inferred': {comment.strip()}"


def test_the_source_check_would_catch_a_bare_number(tmp_path):
    line = '  bandwidth_per_device: "300 GB/s"'
    assert NUMERIC_LINE.match(line)
    assert NUMERIC_LINE.match("  gemm_tile: [128, 256]   # x")
    assert NUMERIC_LINE.match("      nodes: 32")
    assert not NUMERIC_LINE.match("name: dgx-a100")


def test_hardware_list_prints_every_entry(capsys):
    assert main(["hardware", "list"]) == 0
    out = capsys.readouterr().out
    for name in ISSUE_ACCELERATORS + ISSUE_SYSTEMS:
        assert name in out


def test_hardware_show_system(capsys):
    assert main(["hardware", "show", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    for fragment in ("450 GB/s", "NVLS", "leaf: joins 32 nodes", "h100-sxm-80gb", "989.4 TFLOP/s",
                     "hardware/systems/dgx_h100.yaml", "(nvls)"):
        assert fragment in out, fragment


def test_hardware_show_says_which_attention_sweep_prices_the_kernels(capsys):
    assert main(["hardware", "show", "a100-sxm-80gb"]) == 0
    out = capsys.readouterr().out
    for fragment in ("FlashAttention-2 [training.attention_kernel: flash-attention-2, the default], rated over "
                     "512-16,384 tokens at heads of 64, 128",
                     "forward 223.8 TFLOP/s (202.6 TFLOP/s causal), backward 193.1 TFLOP/s",
                     "(where no sweep below applies)"):
        assert fragment in out, fragment
    assert main(["hardware", "show", "h100-sxm-80gb"]) == 0  # a second kernel, picked by name
    out = capsys.readouterr().out
    assert "[training.attention_kernel: cudnn, the default]" in out
    assert "[training.attention_kernel: flash-attention-2, when picked]" in out
    assert main(["hardware", "show", "b200"]) == 0  # a causal-only table, and fp8 inputs measured
    out = capsys.readouterr().out
    assert "causal mask only (unmasked calls at the fractions above): forward 1384.2 TFLOP/s, backward " \
           "994.9 TFLOP/s; fp8 inputs, causal: forward 1502.1 TFLOP/s, backward 1254.7 TFLOP/s" in out
    assert "[training.attention_kernel: sdpa-cudnn, when picked]" in out
    assert main(["hardware", "show", "v100-sxm2-32gb"]) == 0  # no sweep published: one fraction per pass
    out = capsys.readouterr().out
    assert "\nattention " not in out and "sweep" not in out


def test_hardware_show_marks_the_attention_rates_a_part_did_not_measure(capsys):
    assert main(["hardware", "show", "h200-sxm-141gb"]) == 0
    out = capsys.readouterr().out
    assert "measured on this part: heads of 128 at every length, heads of 64 inferred, fp8 inputs at every " \
           "length" in out  # cuDNN: heads of 64 from the H100's ratio
    assert "measured on this part: heads of 128 at 4,096 and 8,192 tokens only, heads of 64 inferred" in out  # FA2
    assert main(["hardware", "show", "gh200"]) == 0  # the H200's rates throughout
    assert capsys.readouterr().out.count("not measured on this part: every rate inferred") == 2
    assert main(["hardware", "show", "b200"]) == 0  # every point its own table's
    assert "measured on this part" not in capsys.readouterr().out


def test_inferred_fields_are_the_keys_whose_comment_says_inferred():
    text = """name: x
peak_flops:
  bf16: "100 TFLOP/s"      # DATASHEET
efficiency:
  gemm: 0.8                # inferred: the GPUs' typical fraction
  memory: 0.85             # VENDOR-CC: a planning figure; was inferred
  kernel_overhead: "2 us"  # Inferred: gap between kernels
  attention_sweep:         # inferred: another part's table
    head_dim: 128          # inferred as above
    other_head_dims:
      - head_dim: 64       # inferred
scale_out:
  levels:
    - name: leaf           # a leaf switch
      oversubscription: 2  # inferred: no source
"""
    from mpsim.cli.hardware import inferred_fields
    # the sweeps' points are left to measured_lengths; "was inferred" is a history, not a mark
    assert inferred_fields(text) == ["efficiency.gemm", "efficiency.kernel_overhead",
                                     "scale_out.levels.oversubscription"]


def test_hardware_show_names_the_inferred_numbers_of_each_file(capsys):
    assert main(["hardware", "show", "h100-sxm-80gb"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("inferred"))
    assert "hardware/accelerators/h100_sxm_80gb.yaml" in line
    for field in ("efficiency.sustained_compute", "efficiency.kernel_overhead"):
        assert field in line
    assert "efficiency.gemm," not in line  # the H100's MAMF is measured
    assert main(["hardware", "show", "a100-sxm-80gb"]) == 0  # every number read off a source
    assert "\ninferred" not in capsys.readouterr().out
    assert main(["hardware", "show", "dgx-h100"]) == 0  # the system's file and its accelerator's
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("inferred")]
    assert [line.split(":")[0] for line in lines] == ["inferred      in hardware/systems/dgx_h100.yaml",
                                                       "inferred      in hardware/accelerators/h100_sxm_80gb.yaml"]


def test_measured_lengths_must_be_lengths_of_the_sweep(tmp_path, capsys):
    text = (HARDWARE / "accelerators" / "h200_sxm_141gb.yaml").read_text()
    bad = tmp_path / "h200_bad.yaml"
    bad.write_text(text.replace("measured_lengths: [4096, 8192]", "measured_lengths: [4096, 6000]"))
    with pytest.raises(InputError) as caught:
        load_accelerator(str(bad))
    assert "measured_lengths must be some of seq_lengths" in str(caught.value)
    assert "other_attention_kernels" in str(caught.value)


def test_hardware_show_names_the_protocols_of_a_systems_collectives(capsys):
    assert main(["hardware", "show", "dgx-h100"]) == 0
    assert "NCCL's Simple and LL protocols, the node priced as NVLINK" in capsys.readouterr().out
    assert main(["hardware", "show", "h100-pcie-server"]) == 0
    assert "the node priced as PCI" in capsys.readouterr().out
    assert main(["hardware", "show", "gaudi3-hls"]) == 0  # HCCL: no LL
    assert "in its Simple protocol only" in capsys.readouterr().out
    assert main(["hardware", "show", "tpu-v5p-8x8x8"]) == 0  # not NCCL at all
    assert "\ncollectives " not in capsys.readouterr().out


def test_a_system_with_one_device_per_node_shows_the_network_not_its_empty_node(capsys):
    assert main(["hardware", "show", "gh200-vista"]) == 0
    shown = re.search(r"all-reduce +1 GiB over two nodes \(one device each\): .*busbw ([\d.]+) GB/s \(ring\)",
                      capsys.readouterr().out)
    # one NDR 400 link per node at 97 %: the bus bandwidth of two ranks is at most the link's 48.5 GB/s
    assert shown and 30 < float(shown.group(1)) <= 48.5
    assert main(["hardware", "list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("gh200-vista"))
    assert row.split()[3] == "none" and "50 GB/s" in row


def test_hardware_show_accelerator_and_torus(capsys):
    assert main(["hardware", "show", "tpu-v6e"]) == 0
    assert "256 x 256" in capsys.readouterr().out
    assert main(["hardware", "show", "tpu-v5p-8x8x8"]) == 0
    assert "8 x 8 x 8 (wraps, wraps, wraps)" in capsys.readouterr().out


def test_hardware_show_says_what_a_gpu_keeps_of_its_rate_at_the_power_limit(capsys):
    assert main(["hardware", "show", "h100-sxm-80gb"]) == 0
    out = capsys.readouterr().out
    assert "GEMM 80.3% (fp8 70.9%)" in out
    assert "under load    at the power limit, of the short-benchmark rate: GEMMs 86.7%, fp8 GEMMs 84.3%, " \
           "attention 89.9%" in out
    assert main(["hardware", "show", "a100-sxm-80gb"]) == 0  # no measurement under load: no line
    assert "under load" not in capsys.readouterr().out


def run_cli(*args: str, cwd: Path = ROOT) -> CliRun:
    return run_in_process(args, cwd)


def test_unknown_hardware_is_one_line_with_a_suggestion():
    result = run_cli("hardware", "show", "dgx-h1000")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "dgx-h100" in result.stderr and result.stderr.startswith("error: ")


SYSTEM = (HARDWARE / "systems" / "tpu_v4_4x4x8.yaml").read_text()
MESH = (HARDWARE / "systems" / "mi300x_platform.yaml").read_text()
BASE = """name: test
cluster:
  system: system.yaml
  nodes: 1
model: gpt3-175b
parallel:
  tp: 8
  pp: 1
  microbatch_size: 1
  global_batch_size: 8
"""


@pytest.mark.parametrize("text,fragments", [
    (SYSTEM.replace("dims: [4, 4, 8]", "dims: [4, 4, 4]"), ["torus.dims", "64 chips", "devices_per_node is 128"]),
    (SYSTEM.replace("topology: torus ", "topology: switch "), ["scale_up", "set topology: torus"]),
    (SYSTEM.replace("wraparound: true", "wraparound: [true, false]"), ["scale_up.torus", "2 flags for 3 axes"]),
    (MESH.replace("links_per_device: 7 ", "links_per_device: 3 "), ["full mesh of 8 devices", "at least 7 links"]),
    (SYSTEM.replace("  oversubscription", "  levels: [{name: a, nodes: 4}, {name: b, nodes: 2}]\n  oversubscription")
     if "oversubscription" in SYSTEM else
     SYSTEM.replace("  efficiency: 0.90", "  efficiency: 0.90\n  levels: [{name: a, nodes: 4}, {name: b, nodes: 2}]"),
     ["scale_out", "join more nodes as they go up"]),
])
def test_bad_system_file_is_one_clear_line(tmp_path, text, fragments):
    (tmp_path / "system.yaml").write_text(text)
    (tmp_path / "scenario.yaml").write_text(BASE)
    result = run_cli("run", "scenario.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("error: system.yaml: "), line
    for fragment in fragments:
        assert fragment in line, line
