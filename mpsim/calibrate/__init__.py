"""Calibration against real PyTorch runs on the device at hand.

``mpsim calibrate`` measures the ops and links mpsim prices (PyTorch microbenchmarks,
torch.distributed transfers) and writes a calibration profile a scenario can name;
``mpsim validate`` also trains a small model with PyTorch's own pipeline schedules,
fits two parameters on one schedule and reports how well mpsim predicts the others.
See ``docs/calibration.md``.

Modules that need torch (``torch_model``, ``timing``, ``opbench``, ``commbench``,
``pipeline``, ``tp_check``, ``worker``) run only inside the measurement workers; the
profile, the fits, the job launcher and the reports are plain Python, so a profile can
be read and used without torch. This package's ``__init__`` imports nothing, because the
scenario model imports the profile format from here.
"""

from __future__ import annotations

INSTALL_HINT = "PyTorch is needed to measure this machine: pip install 'mpsim[calibrate]' (torch>=2.4)"


def require_torch() -> str:
    """The installed torch version; InputError with the install command when there is none."""
    import importlib.util

    from mpsim.errors import InputError

    if importlib.util.find_spec("torch") is None:
        raise InputError(INSTALL_HINT)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"
