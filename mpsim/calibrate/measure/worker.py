"""One rank of a calibration / validation job: ``python -m mpsim.calibrate.measure.worker CONFIG RANK``.

The parent (``mpsim/calibrate/measure/launch.py``) writes a JSON job file and starts one such
process per rank with the allocator and thread settings of
``mpsim.calibrate.measure.machine.worker_environment``. Each rank:

1. takes one thread (and on CPU one core of its own), joins the process group with a
   timeout, so a send without its receive fails the job instead of hanging it;
2. runs the phases the job names, all ranks in lock step (``mpsim/calibrate/measure/phases.py``):
   ``links`` (point-to-point and collectives), ``ops`` (every compute op, all ranks at
   once, since that is how the cores are loaded during training) interleaved with
   ``pipeline`` (each PyTorch schedule: warm-up steps, then measured steps), then
   ``tp`` (the MLP tensor-parallel check at several widths);
3. writes ``rank<N>.json`` into the job's folder.

A measurement taken while the machine was disturbed (other processes over the job's
share of the CPU, or the speed canary slowed: ``mpsim/calibrate/measure/guard.py``) is taken
again after the ranks pause, a few times at most, and every kept number carries the
disturbance it was taken under, its slowdown restated at the end against the fastest the
speed canary ran in the whole job.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from mpsim.calibrate.measure.guard import LoadGuard, rebase_slowdowns
from mpsim.calibrate.measure.machine import cpu_name, load_average
from mpsim.calibrate.measure.phases import run_measurements
from mpsim.calibrate.measure.progress import ProgressWriter


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    rank = int(argv[1])
    world, kind = job["world"], job["device"]
    folder = Path(job["folder"])
    threads = job.get("threads", 1)
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # denormal floats are 10-100x slower on x86: keep them out of timings
    if kind == "cpu" and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) >= world * threads:  # one core (or one set) of its own per rank
            os.sched_setaffinity(0, set(cores[rank * threads:(rank + 1) * threads]))
    if kind == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    backend = "nccl" if kind == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=job["timeout_s"]),
                            **({"device_id": device} if kind == "cuda" else {}))
    result: dict = {"rank": rank, "load_average_before": load_average(), "started_s": time.time(),
                    "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
                    "device_name": torch.cuda.get_device_name(device) if kind == "cuda" else cpu_name()}
    try:
        from mpsim.calibrate.measure.timing import make_clock

        say = ProgressWriter(folder, rank)
        guard = LoadGuard(device, kind, job["foreign_limit"], job.get("wait_budget_s", 0.0),
                          job.get("keep_disturbed", False), say=say)
        clock = make_clock(kind)
        began = time.monotonic()
        result.update(run_measurements(job, rank, world, device, kind, guard, clock, say))
        # every slowdown against the fastest the canary ran in the whole job (the same on every rank)
        rebase_slowdowns(result, guard.canary.fastest_s)
        result["canary_fastest_s"] = guard.canary.fastest_s
        result["measure_s"] = time.monotonic() - began  # waits for a quiet machine included
        result["wait_left_s"] = guard.wait_left_s
        result["load_average_after"] = load_average()
        dist.barrier()
    except Exception as exc:  # reported by the parent as one line; the traceback goes to the log
        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        (folder / f"rank{rank}.json").write_text(json.dumps(result))
        if dist.is_initialized():
            dist.destroy_process_group()
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
