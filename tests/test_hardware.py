"""The hardware library: every file loads, every number names its source, the commands print it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpsim.cli import main
from mpsim.specs.catalog import accelerator_names, load_accelerator, load_system, system_names
from tests.conftest import SCENARIOS

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


@pytest.mark.parametrize("name", accelerator_names())
def test_every_accelerator_loads(name):
    acc = load_accelerator(name)
    assert acc.compute_units > 0 and acc.memory.capacity > 0
    assert 0 < acc.efficiency.gemm <= 1


@pytest.mark.parametrize("name", system_names())
def test_every_system_loads(name):
    system = load_system(name)
    assert system.scale_up.bandwidth_per_device > 0
    if system.scale_up.torus is not None:
        assert system.scale_up.torus.chips == system.devices_per_node


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


def test_hardware_show_accelerator_and_torus(capsys):
    assert main(["hardware", "show", "tpu-v6e"]) == 0
    assert "256 x 256" in capsys.readouterr().out
    assert main(["hardware", "show", "tpu-v5p-8x8x8"]) == 0
    assert "8 x 8 x 8 (wraps, wraps, wraps)" in capsys.readouterr().out


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpsim", *args], capture_output=True, text=True, cwd=cwd)


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
