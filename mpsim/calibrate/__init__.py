"""Calibration against real PyTorch runs on the device at hand.

``mpsim calibrate`` measures the ops and links mpsim prices (PyTorch microbenchmarks,
torch.distributed transfers) and writes a calibration profile a scenario can name;
``mpsim validate`` also trains a small model with PyTorch's own pipeline schedules,
fits two parameters on one schedule and reports how well mpsim predicts the others.
See ``docs/calibration.md``.

The package has three parts, one subpackage each: ``measure`` (what runs under torch
on the device, and how a job is planned and started), ``fit`` (from raw measurements to a
profile) and ``check`` (prediction against measurement). ``runner`` drives them from
end to end. The profile's schema is ``mpsim/specs/calibration.py`` and the cost model
applies a profile (``mpsim/cost/calibrated.py``), so reading and using a profile never
needs torch or this package.
"""

from __future__ import annotations

INSTALL_HINT = "PyTorch is needed to measure this machine: pip install 'mpsim[calibrate]' (torch>=2.12)"


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
