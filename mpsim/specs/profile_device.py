"""A calibration profile belongs to the device it was measured on.

A profile holds one device's measured times. Applied to a scenario on another part it
would price that part as the measured one: a profile of two CPU cores makes an H100
step take hours. So a profile records its device (``device.kind``, the torch device
kind, and ``device.name``, what the device reported), every accelerator file says
which devices it describes (``device_kind`` and ``device_names``, case-insensitive
shell patterns), and loading a scenario whose accelerator does not match its
profile's device fails with one line. That line names where ``calibration:`` was
written, the profile's device and the scenario's accelerator, and how to fix it: the
accelerator files that do match the device, or, where none does, the file to add the
device's name to.
"""

from __future__ import annotations

from typing import Callable

from mpsim.errors import InputError
from mpsim.specs.scenario import Scenario

FieldPath = tuple[str, ...]


def check_profile_device(scenario: Scenario, written_at: tuple[str, FieldPath], profile_file: str,
                         file_for: Callable[[FieldPath], tuple[str, FieldPath]],
                         matching_files: Callable[[str, str], list[str]]) -> None:
    """Refuse ``scenario.calibration`` when it was measured on a device other than the scenario's accelerator.

    ``written_at`` is where ``calibration:`` was written (the source and the field's path
    in it, as the loader's origins give it), ``profile_file`` the profile's file, and
    ``file_for`` the loader's lookup of which file a field came from, and ``matching_files``
    the loader's search of the accelerator files for a device (``loader.matching_accelerator_files``).
    """
    profile = scenario.calibration
    if profile is None:
        return
    source, field = written_at
    on_command_line = source.startswith("--set ")  # the label already names the field
    field_name = None if on_command_line else (".".join(field) or "calibration")
    cluster = scenario.cluster
    if cluster.parts:
        systems = [(("cluster", "parts", str(i), "system", "accelerator"), part.system)
                   for i, part in enumerate(cluster.parts)]
    else:
        systems = [(("cluster", "system", "accelerator"), cluster.system)]
    device = profile.device
    for path, system in systems:
        accelerator = system.accelerator
        if accelerator.matches_device(device.kind, device.name):
            continue
        accelerator_file = file_for(path)[0] or accelerator.name
        matching = matching_files(device.kind, device.name)
        if matching:
            fix = (f"use a system whose accelerator is {' or '.join(matching)}, or a profile measured on "
                   f"{accelerator.name}")
        else:
            fix = (f"no accelerator file lists that device; if it is {accelerator.name}, add its name to device_names "
                   f"in {accelerator_file}")
        reports = (f" reporting {', '.join(repr(p) for p in accelerator.device_names)}" if accelerator.device_names
                   else " with no device_names")
        raise InputError(f"profile {profile_file or '(written inline)'} was measured on {device.kind} device "
                         f"{device.name!r}, not on the scenario's accelerator {accelerator.name} ({accelerator_file}: "
                         f"a {accelerator.device_kind} part{reports}); {fix}", source or None, field_name)
