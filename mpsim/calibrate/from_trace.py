"""``mpsim calibrate --from-trace``: read profiler traces, fit a profile, report held-out errors.

The traces must all come from one device model, and the accelerator that prices the
datasheet model must be that device (its file's ``device_names``): the system's own
accelerator unless ``--accelerator`` names another, as when a system file describes the
80 GB part and the trace ran on the 40 GB one.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from typing import Callable

from mpsim.errors import InputError


def _say_to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def read_traces(paths: list[str], say: Callable[[str], None]):
    """Every trace named by ``paths`` (files or folders of ranks), with a line on stderr per file read."""
    from mpsim.traces.read import load_trace, trace_files

    if not paths:
        raise InputError("no trace file given", field="--from-trace")
    files = trace_files(paths)
    traces = []
    for number, path in enumerate(files, 1):
        try:
            size_mb = os.path.getsize(path) / 1e6
        except OSError:
            raise InputError("no such trace file", path) from None
        say(f"reading trace {number}/{len(files)}: {path} ({size_mb:.1f} MB)")
        started = time.monotonic()
        trace = load_trace(path)
        say(f"  {len(trace.kernels)} kernels on {trace.device_name or 'an unnamed device'} "
            f"in {time.monotonic() - started:.1f} s")
        traces.append(trace)
    return traces


def accelerator_for(traces, system, accelerator_name: str | None):
    """The accelerator spec that prices the traces' device, checked against the device's name."""
    from mpsim.specs.catalog import load_accelerator
    from mpsim.specs.loader import matching_accelerator_files

    names = sorted({t.device_name for t in traces if t.device_name})
    unnamed = [t.source for t in traces if not t.device_name]
    if unnamed:
        raise InputError("the trace does not name its GPU (no deviceProperties): the profile cannot say what it "
                         "was measured on", unnamed[0])
    if len(names) > 1:
        raise InputError(f"the traces ran on different devices ({', '.join(names)}); fit one device at a time",
                         field="--from-trace")
    accelerator = load_accelerator(accelerator_name) if accelerator_name else system.accelerator
    if not accelerator.matches_device("cuda", names[0]):
        matching = matching_accelerator_files("cuda", names[0])
        hint = (f"name a matching one with --accelerator ({', '.join(matching)})" if matching
                else "add the device's name to device_names of the accelerator file that describes it")
        raise InputError(f"the traces ran on {names[0]!r}, which {accelerator.name} does not describe; {hint}",
                         field="--accelerator" if accelerator_name else "--system")
    return accelerator


def calibrate_from_traces(paths: list[str], system_name: str, accelerator_name: str | None = None,
                          say: Callable[[str], None] = _say_to_stderr):
    """The :class:`~mpsim.calibrate.trace_fit.build.TraceFitResult` of the traces at ``paths``."""
    from mpsim.calibrate.trace_fit.build import build_profile
    from mpsim.calibrate.trace_fit.samples import trace_samples
    from mpsim.specs.catalog import load_system

    system = load_system(system_name)
    traces = read_traces(paths, say)
    accelerator = accelerator_for(traces, system, accelerator_name)
    say("fitting GEMMs, collectives, memory-bound kernels and launch gaps")
    samples = trace_samples(traces)
    created = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    return build_profile(samples, [t.source for t in traces], traces[0].device_name, traces[0].device_sms,
                         system_name, system, accelerator, created=created)


def run_from_trace(args) -> int:
    """The command: fit, write the profile (or print it), and report on stderr."""
    import yaml

    from mpsim.calibrate.trace_fit.build import format_trace_fit
    from mpsim.specs.calibration import write_profile

    if not args.system:
        raise InputError("required with --from-trace: the system whose accelerator and links give the datasheet "
                         "prices (e.g. dgx-a100)", field="--system")
    if getattr(args, "scenario", None):
        raise InputError("--from-trace fits a profile from traces alone; drop the scenario", field="--from-trace")
    result = calibrate_from_traces(args.from_trace, args.system, args.accelerator)
    for line in format_trace_fit(result.profile):
        _say_to_stderr(line)
    if args.out:
        write_profile(result.profile, args.out)
        _say_to_stderr(f"profile written to {args.out}; name it from a scenario as `calibration: {args.out}`")
    else:
        print(yaml.safe_dump(result.profile.model_dump(mode="json", exclude_none=True), sort_keys=False, width=120),
              end="")
    return 0
