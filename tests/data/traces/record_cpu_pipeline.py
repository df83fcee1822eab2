"""Record the CPU pipeline traces ``tests/test_trace_validate.py`` reads.

Two ranks over gloo, one thread and one core each (with the allocator settings of
``mpsim validate``'s workers), run the validation model of
``scenarios/validation_2xcpu.yaml`` (8 layers, 4 microbatches of one sequence) with
``torch.distributed.pipelining`` under ``torch.profiler`` (CPU activities, shapes
recorded, a wait/warm-up/active schedule so that ``ProfilerStep#N`` ranges appear), and
export each rank's Chrome trace. Two schedules, for the two ways PyTorch annotates its
passes:

- ``gpipe``: ``ScheduleGPipe`` wraps each pass in ``record_function("Forward {i}")`` /
  ``("Backward {i}")`` (no stage in the name: one stage per rank);
- ``1f1b``: mpsim's 1F1B order (``mpsim schedule 1f1b``, the text form torch reads)
  loaded into PyTorch's schedule runtime (``_PipelineScheduleRuntime._load_csv``, the
  way torch runs a schedule from a CSV file), which names each action
  ``PP:{stage}{F|B}{i}``. PyTorch's own ``Schedule1F1B`` annotates nothing, and
  ``ScheduleInterleaved1F1B`` with one stage per rank runs one more warm-up forward
  on the first rank than 1F1B does.

The files are trimmed to what a pass comparison needs (the trace's metadata, the step
ranges, the annotations and the process and thread names), rounded to whole
microseconds and gzipped, so each stays a few kilobytes. Times differ from run to run;
the structure (steps, annotation names, their nesting) does not.

Run from the repository root: ``python tests/data/traces/record_cpu_pipeline.py``.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from mpsim.calibrate.measure.jobs import model_shape
from mpsim.calibrate.measure.machine import worker_environment
from mpsim.calibrate.measure.torch_model import ModelShape, batch, build_chunk, lm_loss
from mpsim.resolve import resolve
from mpsim.schedules import build_schedule
from mpsim.specs import load_scenario

HERE = Path(__file__).resolve().parent
SCENARIO = HERE.parents[2] / "scenarios" / "validation_2xcpu.yaml"
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": _PipelineScheduleRuntime}
WAIT, WARMUP, ACTIVE = 1, 1, 3  # profiler schedule: ProfilerStep#2..#4 are recorded
SEED = 1234
KEEP_CATEGORIES = {"user_annotation"}


def _run(rank: int, world: int, port: int, spec: dict, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})  # one core per rank, as mpsim validate runs them
    dist.init_process_group("gloo", rank=rank, world_size=world)
    shape = ModelShape(**spec["shape"])
    device = torch.device("cpu")
    for name, cls in SCHEDULES.items():
        chunk = build_chunk(shape, spec["layers_per_chunk"], rank, SEED, device)
        stage = PipelineStage(chunk, rank, world, device)
        target = stage if cls is ScheduleGPipe else [stage]
        schedule = cls(target, n_microbatches=spec["microbatches"], loss_fn=lm_loss, scale_grads=False)
        if cls is _PipelineScheduleRuntime:
            order = os.path.join(out_dir, f"{name}.csv")
            if rank == 0:
                with open(order, "w") as handle:
                    handle.write(spec["orders"][name])
            dist.barrier()
            schedule._load_csv(order)
        ids, targets = batch(shape, spec["microbatches"] * spec["microbatch_size"], SEED, device)
        args = (ids,) if rank == 0 else ()
        kwargs = {"target": targets} if rank == world - 1 else {}
        profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                         schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE))
        with profile:
            for _ in range(WAIT + WARMUP + ACTIVE):
                dist.barrier()
                schedule.step(*args, return_outputs=False, **kwargs)
                profile.step()
        profile.export_chrome_trace(os.path.join(out_dir, f"{name}_rank{rank}.json"))
        dist.barrier()
    dist.destroy_process_group()


def trim(trace: dict) -> dict:
    """The trace's metadata with only the step ranges, annotations and naming events kept (idempotent)."""
    events = []
    for event in trace.get("traceEvents", []):
        keep = event.get("ph") == "M" or event.get("cat") in KEEP_CATEGORIES \
            or str(event.get("name", "")).startswith("ProfilerStep#")
        if not keep:
            continue
        event = {k: v for k, v in event.items() if k != "args" or event.get("ph") == "M"}
        for key in ("ts", "dur"):
            if isinstance(event.get(key), float):
                event[key] = round(event[key])
        events.append(event)
    # the recording machine's temporary file name and the run's random id say nothing about the run
    kept = {k: v for k, v in trace.items() if k not in ("traceEvents", "trace_id")}
    kept["traceName"] = "trace.json"
    kept["traceEvents"] = events
    return kept


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    scenario = load_scenario(SCENARIO).scenario
    layout = resolve(scenario)
    spec = {"shape": model_shape(scenario), "layers_per_chunk": list(layout.layers_per_chunk),
            "microbatches": layout.num_microbatches, "microbatch_size": layout.microbatch_size,
            "orders": {"1f1b": build_schedule("1f1b", layout.pp, 1, layout.num_microbatches).to_text()}}
    world = layout.pp
    # the workers' allocator and thread settings of mpsim validate (read when a process starts)
    os.environ.update(worker_environment(1))
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_run, args=(world, _free_port(), spec, out_dir), nprocs=world, join=True)
        for name in SCHEDULES:
            for rank in range(world):
                with open(os.path.join(out_dir, f"{name}_rank{rank}.json")) as handle:
                    trace = trim(json.load(handle))
                target = HERE / f"cpu_pipeline_{name}_rank{rank}.json.gz"
                # mtime=0: the same events give the same bytes
                with gzip.GzipFile(target, "wb", mtime=0) as handle:
                    handle.write(json.dumps(trace, separators=(",", ":")).encode())
                print(f"{target.name}: {target.stat().st_size} bytes, {len(trace['traceEvents'])} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
