"""A calibration profile is refused by a scenario whose accelerator is not the device it was measured on.

The profiles here are written by hand (no measurement): only their ``device`` block
matters to the check. The device names are the ones real parts report: the profiler
traces of A100 runs (``NVIDIA A100-SXM4-80GB``, and ``NVIDIA A100-PG509-200``, an
A100 40 GB SXM4 board) and ``torch.cuda.get_device_name()`` of an H100 SXM.
"""

from __future__ import annotations

import pytest

from mpsim.cli import main
from mpsim.errors import InputError
from mpsim.specs import load_scenario
from mpsim.specs.calibration import (AttentionCurve, CalibrationProfile, ComputeProfile, DeviceInfo, GemmCurve,
                                     StreamFit, write_profile)
from mpsim.specs.catalog import load_accelerator
from tests.conftest import SCENARIOS

VALIDATION = SCENARIOS / "validation_2xcpu.yaml"
H100_SCENARIO = SCENARIOS / "llama3_70b_32xh100.yaml"  # dgx-h100: h100-sxm-80gb
A100_SCENARIO = SCENARIOS / "gpt3_175b_64xa100.yaml"  # dgx-a100: a100-sxm-80gb
CPU_NAME = "AMD EPYC 9R14 96-Core Processor"


def profile_of(kind: str, name: str) -> CalibrationProfile:
    """A small, valid profile measured on a ``kind`` device called ``name``."""
    dtype = "fp32" if kind == "cpu" else "bf16"
    peak = 1.66e11 if kind == "cpu" else 3.12e14
    compute = ComputeProfile(dtype=dtype, gemm_curve=GemmCurve(peak_flops=peak, max_efficiency=0.5,
                                                               half_efficiency_flops=1e6),
                             attention_curve=AttentionCurve(forward_fraction=0.3, backward_fraction=0.25),
                             memory_fit=StreamFit(bandwidth=1e10, latency_s=1e-6))
    return CalibrationProfile(description=f"made by hand for a {name}", device=DeviceInfo(kind=kind, name=name),
                              compute=compute)


@pytest.fixture
def cpu_profile(tmp_path):
    path = tmp_path / "cpu_profile.yaml"
    write_profile(profile_of("cpu", CPU_NAME), path)
    return path


def test_a_cpu_profile_on_an_h100_scenario_is_refused_with_one_line(cpu_profile, capsys):
    code = main(["run", str(H100_SCENARIO), "--set", f"calibration={cpu_profile}"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error:")
    # names where calibration was given, the profile's device and the scenario's accelerator
    assert "--set calibration=" in err and CPU_NAME in err and "h100-sxm-80gb" in err and "cpu device" in err


def test_the_refusal_names_the_scenario_files_calibration_field(cpu_profile, tmp_path):
    scenario = tmp_path / "h100_job.yaml"
    scenario.write_text("calibration: cpu_profile.yaml\n" + H100_SCENARIO.read_text())
    with pytest.raises(InputError) as info:
        load_scenario(scenario)
    error = info.value
    assert error.file is not None and error.file.endswith("h100_job.yaml") and error.field == "calibration"
    assert "cpu_profile.yaml" in error.message and "h100-sxm-80gb" in error.message
    # the fix: the accelerator file that describes a CPU host
    assert "cpu_host.yaml" in error.message


def test_a_matching_profile_is_accepted(cpu_profile, tmp_path):
    loaded = load_scenario(VALIDATION, [f"calibration={cpu_profile}"]).scenario
    assert loaded.calibration.device.name == CPU_NAME
    write_profile(profile_of("cuda", "NVIDIA A100-SXM4-80GB"), tmp_path / "a100.yaml")
    assert load_scenario(A100_SCENARIO, [f"calibration={tmp_path / 'a100.yaml'}"]).scenario.calibration is not None
    write_profile(profile_of("cuda", "NVIDIA A100-PG509-200"), tmp_path / "pg509.yaml")
    forty = load_scenario(A100_SCENARIO, ["cluster.system.accelerator=a100-sxm-40gb",
                                          f"calibration={tmp_path / 'pg509.yaml'}"]).scenario
    assert forty.cluster.system.accelerator.name == "a100-sxm-40gb"


def test_a_profile_of_the_other_a100_is_refused_and_the_matching_file_named(tmp_path):
    write_profile(profile_of("cuda", "NVIDIA A100-PG509-200"), tmp_path / "pg509.yaml")
    with pytest.raises(InputError) as info:
        load_scenario(A100_SCENARIO, [f"calibration={tmp_path / 'pg509.yaml'}"])
    assert "a100_sxm_40gb.yaml" in info.value.message and "a100-sxm-80gb" in info.value.message


def test_a_profile_of_a_device_no_file_describes_says_where_to_add_its_name(tmp_path):
    write_profile(profile_of("cuda", "NVIDIA GeForce RTX 4090"), tmp_path / "rtx.yaml")
    with pytest.raises(InputError) as info:
        load_scenario(H100_SCENARIO, [f"calibration={tmp_path / 'rtx.yaml'}"])
    message = info.value.message
    assert "no accelerator file lists" in message and "device_names" in message and "h100_sxm_80gb.yaml" in message


@pytest.mark.parametrize("accelerator, kind, name, matches", [
    ("a100-sxm-80gb", "cuda", "NVIDIA A100-SXM4-80GB", True),
    ("a100-sxm-80gb", "cuda", "nvidia a100-sxm4-80gb", True),  # case does not matter
    ("a100-sxm-80gb", "cuda", " NVIDIA  A100-SXM4-80GB ", True),  # nor padding
    ("a100-sxm-80gb", "cuda", "NVIDIA A100-PG509-200", False),  # the 40 GB board
    ("a100-sxm-80gb", "cuda", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", False),  # a slice is not the part
    ("a100-sxm-40gb", "cuda", "NVIDIA A100-PG509-200", True),
    ("a100-sxm-40gb", "cuda", "NVIDIA A100-SXM4-40GB", True),
    ("a100-sxm-40gb", "cuda", "NVIDIA A100-SXM4-80GB", False),
    ("h100-sxm-80gb", "cuda", "NVIDIA H100 80GB HBM3", True),
    ("h100-sxm-80gb", "cuda", "NVIDIA H100 PCIe", False),
    ("h100-pcie-80gb", "cuda", "NVIDIA H100 PCIe", True),
    ("cpu-host", "cpu", CPU_NAME, True),
    ("cpu-host", "cuda", "NVIDIA A100-SXM4-80GB", False),  # a GPU profile never prices the host's cores
    ("a100-sxm-80gb", "cpu", "NVIDIA A100-SXM4-80GB", False),  # nor a CPU one a GPU, whatever its name
    ("gb200", "cuda", "NVIDIA GB200", True),
    ("gb200", "cuda", "NVIDIA B200", False),  # the HGX part at 1,000 W is another accelerator file
    ("b200", "cuda", "NVIDIA GB200", False),
    ("gh200", "cuda", "NVIDIA GH200 120GB", True),
    ("mi300x", "cuda", "AMD Instinct MI300X", False),  # no name cited for it yet: nothing is accepted
])
def test_device_name_patterns(accelerator, kind, name, matches):
    assert load_accelerator(accelerator).matches_device(kind, name) is matches


def test_patterns_are_shell_patterns():
    spec = load_accelerator("a100-sxm-80gb").model_copy(update={"device_names": ["NVIDIA A100-SXM4-80GB*"]})
    assert spec.matches_device("cuda", "NVIDIA A100-SXM4-80GB MIG 1g.10gb")
    assert not spec.matches_device("cuda", "NVIDIA A100-SXM4-40GB")
