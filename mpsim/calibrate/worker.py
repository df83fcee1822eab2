"""One rank of a calibration / validation job: ``python -m mpsim.calibrate.worker CONFIG RANK``.

The parent (``mpsim/calibrate/launch.py``) writes a JSON job file and starts one such
process per rank with the allocator and thread settings of
``mpsim.calibrate.machine.worker_environment``. Each rank:

1. takes one thread (and on CPU one core of its own), joins the process group with a
   timeout, so a send without its receive fails the job instead of hanging it;
2. runs the phases the job names, all ranks in lock step: ``ops`` (every compute op,
   all ranks at once, since that is how the cores are loaded during training),
   ``links`` (point-to-point and collectives), ``pipeline`` (each PyTorch schedule:
   warm-up steps, then measured steps), ``tp`` (the DTensor MLP check);
3. writes ``rank<N>.json`` into the job's folder.

Measurements taken while other processes used more than the job's limit of the machine
are repeated (a few times at most) and every kept number carries the foreign CPU share
it was taken under.
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

from mpsim.calibrate.machine import cpu_name, cpu_sample, load_average, process_cpu_s

MAX_TRIES = 3  # measurements of one op taken while the machine was busy, before keeping the quietest


class LoadGuard:
    """The share of the machine other processes used since :meth:`start`, agreed by all ranks.

    ``wait_budget_s`` is how long, over the whole job, the ranks may pause (all together)
    for a busy machine to quiet down before they measure again.
    """

    def __init__(self, device: torch.device, limit: float, wait_budget_s: float):
        self.device = device
        self.limit = limit
        self.wait_left_s = wait_budget_s
        self.before = None
        self.own_before = 0.0

    def start(self) -> None:
        self.before, self.own_before = cpu_sample(), process_cpu_s()

    def share(self) -> float:
        after, own = cpu_sample(), process_cpu_s() - self.own_before
        if self.before is None or after is None:
            return 0.0
        ours = torch.tensor([own], dtype=torch.float64, device=self.device)
        dist.all_reduce(ours)  # every rank's own CPU time
        total = after.total_s - self.before.total_s
        foreign = 0.0 if total <= 0 else max(0.0, (after.busy_s - self.before.busy_s - ours.item()) / total)
        agreed = torch.tensor([foreign], dtype=torch.float64, device=self.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # one decision for all ranks
        return agreed.item()

    def wait_for_quiet(self, window_s: float = 1.0) -> None:
        """Pause every rank until other processes use at most the limit, or the wait budget is spent."""
        while self.wait_left_s > 0:
            self.start()
            time.sleep(window_s)
            self.wait_left_s -= window_s
            if self.share() <= self.limit:
                return


def quietest(measure, guard: LoadGuard, limit: float):
    """``measure()`` until other processes stayed under ``limit`` (a few tries); the quietest result and its share."""
    best = None
    for _ in range(MAX_TRIES):
        dist.barrier()
        guard.start()
        value = measure()
        share = guard.share()
        if best is None or share < best[1]:
            best = (value, share)
        if share <= limit:
            break
        guard.wait_for_quiet()
    return best


def run_ops(job: dict, device: torch.device, kind: str, guard: LoadGuard) -> list[dict]:
    from mpsim.calibrate.opbench import bench_op

    results = []
    for record in job["ops"]:
        measured, share = quietest(lambda: bench_op(record, device, kind), guard, job["foreign_limit"])
        results.append({**measured.as_dict(), "foreign_cpu_share": share})
    return results


def run_pipelines(job: dict, rank: int, device: torch.device, kind: str, guard: LoadGuard, clock) -> dict:
    from mpsim.calibrate.pipeline import PipelineJob, PipelineRunner, torch_schedule_class
    from mpsim.calibrate.torch_model import ModelShape

    spec = job["pipeline"]
    shape = ModelShape(**spec["shape"])
    limit = job["foreign_limit"]
    out: dict = {}
    for entry in spec["schedules"]:
        name = entry["name"]
        if torch_schedule_class(name) is None:
            out[name] = {"skipped": f"torch {torch.__version__} has no {name} schedule"}
            continue
        runner = PipelineRunner(PipelineJob(name, shape, entry["layers_per_chunk"], entry["stage_to_rank"],
                                            spec["microbatches"], spec["microbatch_size"], spec["seed"]),
                                rank, device, clock)
        for _ in range(spec["warmup_steps"]):
            runner.step()
        kept, shares = [], []
        while len(kept) < spec["steps"] and len(shares) < spec["steps"] * MAX_TRIES:
            guard.start()
            step = runner.step()
            share = guard.share()
            shares.append(share)
            step["foreign_cpu_share"] = share
            if share <= limit:
                kept.append(step)
            else:
                guard.wait_for_quiet()
        del runner
        out[name] = {"steps": kept, "attempt_shares": shares}
    return out


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
        from mpsim.calibrate.timing import make_clock

        guard = LoadGuard(device, job["foreign_limit"], job.get("wait_budget_s", 0.0))
        clock = make_clock(kind)
        phases = job["phases"]
        if "ops" in phases:
            result["ops"] = run_ops(job, device, kind, guard)
        if "links" in phases:
            from mpsim.calibrate.commbench import bench_links

            repeats = job.get("links", {}).get("repeats", 15)
            links, share = quietest(lambda: bench_links(rank, world, device, kind, repeats), guard,
                                    job["foreign_limit"])
            result["links"] = {**links, "foreign_cpu_share": share}
        if "pipeline" in phases:
            result["pipeline"] = run_pipelines(job, rank, device, kind, guard, clock)
        if "tp" in phases and world >= 2:
            from mpsim.calibrate.tp_check import run_tp_check

            tp, share = quietest(lambda: run_tp_check(job["tp"], rank, world, device, kind), guard,
                                 job["foreign_limit"])
            result["tp"] = {**tp, "foreign_cpu_share": share}
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
