"""On a machine with NVIDIA GPUs: validate, record a profiler trace of the same job, calibrate from it.

The one script to run where a GPU is at hand (it needs torch with CUDA and at least one
visible GPU; it refuses to run otherwise). Three figures come out:

1. ``mpsim validate --device cuda`` on the validation model (``scenarios/validation_2xcpu.yaml``
   on the GPUs, bf16, one pipeline rank per GPU): the measured GPipe step and mpsim's
   prediction after its fit on 1F1B (``validate_step_error_pct``).
2. The same GPipe job run again under ``torch.profiler`` (CPU and CUDA activities),
   each rank's Kineto trace written to ``OUT/trace/``: its measured step
   (``trace_step_ms``, ProfilerStep span, slowest rank, median over steps).
3. ``mpsim calibrate --from-trace OUT/trace --system SYSTEM`` on those traces, and the
   job simulated with that profile, lined up with the trace as ``mpsim validate --trace``
   does (``trace_calibrated_step_error_pct``).

Last line: ``validate_step_error_pct=<a> trace_step_ms=<b> trace_calibrated_step_error_pct=<c>``.
Usage: ``python benchmarks/gpu_trace_check.py [--system hgx-h200] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

SEED = 1234
WAIT, WARMUP, ACTIVE = 1, 1, 5  # profiler schedule: five recorded steps


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _record(rank: int, world: int, port: int, spec: dict, out_dir: str) -> None:
    """One rank of the GPipe job under the profiler (spawned once per GPU)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from mpsim.calibrate.measure.torch_model import ModelShape, batch, build_chunk, lm_loss

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    shape = ModelShape(**spec["shape"])
    chunk = build_chunk(shape, spec["layers_per_chunk"], rank, SEED, device)
    stage = PipelineStage(chunk, rank, world, device)
    schedule = ScheduleGPipe(stage, n_microbatches=spec["microbatches"], loss_fn=lm_loss, scale_grads=False)
    ids, targets = batch(shape, spec["microbatches"] * spec["microbatch_size"], SEED, device)
    args = (ids,) if rank == 0 else ()
    kwargs = {"target": targets} if rank == world - 1 else {}
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    profile = torch.profiler.profile(activities=activities, record_shapes=True,
                                     schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE))
    with profile:
        for _ in range(WAIT + WARMUP + ACTIVE):
            dist.barrier()
            schedule.step(*args, return_outputs=False, **kwargs)
            torch.cuda.synchronize()
            profile.step()
    profile.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.json"))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="hgx-h200", help="hardware file of the GPUs (default hgx-h200)")
    parser.add_argument("--out", default="gpu_trace_check", help="folder for the profiles and traces")
    args = parser.parse_args()

    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("error: no CUDA device is visible; this check needs a GPU", file=sys.stderr)
        return 2
    from mpsim.calibrate.check.compare import with_profile
    from mpsim.calibrate.from_trace import calibrate_from_traces
    from mpsim.calibrate.measure.jobs import MeasureSettings, model_shape
    from mpsim.calibrate.runner import fit_plan, validate
    from mpsim.resolve import resolve
    from mpsim.simulate import simulate
    from mpsim.specs.calibration import write_profile
    from mpsim.traces.compare import compare_traces
    from mpsim.traces.read import load_traces

    out = Path(args.out)
    (out / "trace").mkdir(parents=True, exist_ok=True)
    say = (lambda text: print(text, file=sys.stderr, flush=True))
    world = torch.cuda.device_count()

    say(f"1/3 mpsim validate --device cuda --schedules gpipe on {world} GPU(s) ...")
    outcome = validate("cuda", ["gpipe"], MeasureSettings(warmup_steps=1, steps=5), system=args.system,
                       ranks=world, say=say)
    write_profile(outcome.profile, out / "validate_profile.yaml")
    gpipe = next(check for check in outcome.checks if check.name == "gpipe")
    validate_error = gpipe.error_pct
    say(f"    GPipe: measured {1e3 * gpipe.measured_step_s:.2f} ms, predicted {1e3 * gpipe.predicted_step_s:.2f} ms "
        f"({validate_error:+.1f} %)")

    say("2/3 the same job under torch.profiler ...")
    scenario = fit_plan("cuda", world, system=args.system, schedules=["gpipe"]).variants["gpipe"]
    layout = resolve(scenario)
    spec = {"shape": model_shape(scenario), "layers_per_chunk": list(layout.layers_per_chunk),
            "microbatches": layout.num_microbatches, "microbatch_size": layout.microbatch_size}
    mp.spawn(_record, args=(world, _free_port(), spec, str(out / "trace")), nprocs=world, join=True)

    say("3/3 calibrating from the traces and predicting the traced step ...")
    fitted = calibrate_from_traces([str(out / "trace")], args.system, say=say)
    write_profile(fitted.profile, out / "trace_profile.yaml")
    result = simulate(with_profile(scenario, fitted.profile))
    comparison = compare_traces(load_traces([str(out / "trace")]), result)
    say(f"    traced step {1e3 * comparison.measured_step_s:.2f} ms, predicted {1e3 * comparison.predicted_step_s:.2f} "
        f"ms with the trace's profile")
    print(f"validate_step_error_pct={validate_error:.2f} trace_step_ms={1e3 * comparison.measured_step_s:.3f} "
          f"trace_calibrated_step_error_pct={comparison.step_error_pct:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
