"""``mpsim run``: simulate one training step of a scenario."""

from __future__ import annotations

import argparse
import gc
import sys

from mpsim.cli.common import add_scenario_args, non_negative_int, sample_count, token_count
from mpsim.errors import EXIT_OUT_OF_MEMORY, InputError


def _run(args: argparse.Namespace) -> int:
    from mpsim.engine.core import cyclic_gc_paused

    # a step of a million actions holds millions of records until the command ends, which the
    # cycle collector would walk again at every full collection (two thirds of the time); the
    # few cycles one step leaves behind wait for the end (the sampled steps do not: _whole_run)
    with cyclic_gc_paused():
        return _run_step(args)


def _run_step(args: argparse.Namespace) -> int:
    from mpsim.engine import simulate as engine_simulate
    from mpsim.results import summarize
    from mpsim.cli.common import resized_by_system
    from mpsim.results.report import placement_warning
    from mpsim.specs.layout import zero_sharding_note
    from mpsim.simulate import bubble_reference, simulate
    from mpsim.specs import load_scenario
    from mpsim.units import format_bytes

    _check_trace_options(args)
    _check_run_options(args)
    loaded = load_scenario(args.scenario, args.overrides)
    # by default the step's exactly repeated middle runs once and its images are put back
    # (mpsim/engine/excise.py); --full-timeline runs every action, the check of that shortcut
    engine = {"engine": engine_simulate} if args.full_timeline else {}
    try:
        _check_whole_run_inputs(args, loaded.scenario)  # before the step is simulated, not after
        result = simulate(loaded.scenario, loaded.path.parent if loaded.path else None, **engine)
        extras = _whole_run(args, result)
    except InputError as exc:
        if exc.field and exc.field.startswith("--"):  # a command-line option, not a field of the files
            raise
        raise loaded.origins.locate(exc) from None
    reference = bubble_reference(result, cut=not args.full_timeline)
    summary = summarize(result, reference)
    _print_summary(args, summary, extras)
    warning = placement_warning(result.layout, result.scenario.cluster.system)
    if warning:
        print(warning, file=sys.stderr)
    for note in (resized_by_system(args.scenario, args.overrides, loaded.scenario),
                 zero_sharding_note(result.scenario, result.layout),
                 _profile_links_note(args.overrides, result.scenario)):
        if note:
            print(note, file=sys.stderr)
    if args.trace:
        from mpsim.results.trace import chosen_mode, write_trace

        ops = not args.trace_actions_only
        mode, note = chosen_mode(result, ops, "compact" if args.trace_compact else "full" if args.trace_full else "auto")
        if note:
            print(f"note: {note}", file=sys.stderr)
        write_trace(result, args.trace, ops=ops, reference=reference, compact=mode == "compact")
        print(f"{mode} trace written to {args.trace} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.memory_plot:
        from mpsim.results.memory_views import plot_memory

        plot_memory(result, summary.memory, args.memory_plot)
        print(f"memory timeline written to {args.memory_plot}", file=sys.stderr)
    if args.memory_snapshot:
        from mpsim.results.memory_snapshot import write_memory_snapshot

        if not 0 <= args.memory_snapshot_rank < result.schedule.num_ranks:
            raise InputError(f"--memory-snapshot-rank must be 0..{result.schedule.num_ranks - 1}")
        write_memory_snapshot(result, summary.memory, args.memory_snapshot_rank, args.memory_snapshot)
        print(f"memory snapshot of rank {args.memory_snapshot_rank} written to {args.memory_snapshot} "
              f"(open it in https://pytorch.org/memory_viz)", file=sys.stderr)
    if args.report:
        from mpsim.results.html import write_run_report

        write_run_report(args.report, result, summary, reference)
        print(f"report written to {args.report} (open it in a browser; it needs no network)", file=sys.stderr)
    if args.plot:
        from mpsim.results.plot import plot_timeline

        plot_timeline(result, summary, args.plot, reference=reference)
        print(f"timeline written to {args.plot}", file=sys.stderr)
    if summary.out_of_memory:
        print(f"out of memory: the busiest rank peaks at {format_bytes(summary.peak_memory_bytes)} of "
              f"{format_bytes(summary.capacity_bytes)} (exit code {EXIT_OUT_OF_MEMORY})", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    return 0


def _check_run_options(args: argparse.Namespace) -> None:
    """Options of the step-time distribution and the goodput come with what they need."""
    if args.samples is None:
        for option, given in (("--seed", args.seed is not None), ("--distribution-plot", args.distribution_plot)):
            if given:
                raise InputError("needs --samples N to draw the step-time distribution", field=option)
    if args.goodput_plot and not args.goodput:  # before --tokens: the option given that asks for more
        raise InputError("needs --goodput (and --tokens T)", field="--goodput-plot")
    if args.tokens is not None and not args.goodput:
        raise InputError("needs --goodput", field="--tokens")
    if args.goodput and args.tokens is None:
        raise InputError("needs --tokens T, the tokens to train", field="--goodput")


def _profile_links_note(overrides: list[str], scenario) -> str | None:
    """A note when a link what-if meets a profile that prices collectives from its own fitted lines:
    those lines are the measured links, which the what-if does not reach."""
    from mpsim.results.metrics import profiled_collectives

    kinds = profiled_collectives(scenario.calibration)
    touched = [o.split("=", 1)[0] for o in overrides
               if o.replace(" ", "").startswith(("cluster.system.scale_up", "cluster.system.scale_out"))]
    if scenario.faults.slow_link:
        touched.append("faults.slow_link")
    if not kinds or not touched:
        return None
    return (f"note: the calibration profile prices {', '.join(kinds)} from the links it measured; "
            f"{', '.join(touched)} changes only what it does not price (other collectives, pipeline sends)")


def _check_whole_run_inputs(args: argparse.Namespace, scenario) -> None:
    """What --samples and --goodput need from the scenario (variations, reliability fields)."""
    if args.samples is not None:
        from mpsim.reliability.op_variation import op_cvs

        op_cvs(scenario)
    if args.goodput:
        from mpsim.reliability.goodput import check_goodput_inputs

        check_goodput_inputs(scenario, args.tokens)


def _whole_run(args: argparse.Namespace, result) -> dict:
    """The step-time distribution (--samples) and the run's expected length (--goodput), when asked for."""
    from mpsim.reliability.whole_run import whole_run

    if args.samples is None and not args.goodput:
        return {}
    # each sampled step's engine run leaves its cycles: collected as they come, not at the end
    paused = not gc.isenabled()
    gc.enable()
    try:
        asked = whole_run(result, args.samples, args.seed, args.tokens if args.goodput else None)
    finally:
        if paused:
            gc.disable()
    extras: dict = {}
    if asked.step_distribution is not None:
        extras["step_distribution"] = asked.step_distribution
    if asked.goodput is not None:
        extras["goodput"] = asked.goodput
    return extras


def _print_summary(args: argparse.Namespace, summary, extras: dict) -> None:
    """The summary, followed by the distribution and the goodput when they were asked for."""
    from mpsim.results import format_summary, summary_dict, summary_json

    if not extras:
        print(summary_json(summary) if args.json else format_summary(summary))
        return
    from mpsim.reliability import report

    distribution, run = extras.get("step_distribution"), extras.get("goodput")
    if args.json:
        import json

        fields = summary_dict(summary)
        if distribution is not None:
            fields["step_distribution"] = report.distribution_dict(distribution)
        if run is not None:
            fields["goodput"] = report.goodput_dict(run)
        print(json.dumps(fields, indent=2, sort_keys=False))
    else:
        parts = [format_summary(summary)]
        parts += [report.format_distribution(distribution)] if distribution is not None else []
        parts += [report.format_goodput(run)] if run is not None else []
        print("\n".join(parts))
    if args.distribution_plot:
        from mpsim.reliability.plots import plot_distribution

        plot_distribution(distribution, args.distribution_plot)
        print(f"step-time distribution written to {args.distribution_plot}", file=sys.stderr)
    if args.goodput_plot:
        from mpsim.reliability.plots import plot_goodput

        plot_goodput(run, args.goodput_plot)
        print(f"goodput written to {args.goodput_plot}", file=sys.stderr)


def _check_trace_options(args: argparse.Namespace) -> None:
    """The trace's form is asked for with the trace, and only one form at a time."""
    if args.trace_compact and args.trace_full:
        raise InputError("give --trace-compact or --trace-full, not both", field="--trace-full")
    for option, given in (("--trace-compact", args.trace_compact), ("--trace-full", args.trace_full)):
        if given and not args.trace:
            raise InputError("needs --trace FILE to write the trace to", field=option)


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``run`` to the command parser."""
    run = commands.add_parser("run", help="simulate one training step of a scenario")
    add_scenario_args(run)
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object (docs/json.md)")
    run.add_argument("--full-timeline", action="store_true",
                     help="run every action of the step through the event engine; by default a middle that "
                          "repeats exactly runs once and its repeats are put back, the same timeline to rounding "
                          "(docs/architecture.md)")
    run.add_argument("--trace", metavar="FILE",
                     help="write a Chrome/Perfetto trace JSON (gzip-compressed if FILE ends in .gz; docs/traces.md)")
    run.add_argument("--trace-actions-only", action="store_true", help="trace whole actions, not every op")
    run.add_argument("--trace-compact", action="store_true",
                     help="trace whole actions, communication as counters (chosen for large traces; docs/traces.md)")
    run.add_argument("--trace-full", action="store_true", help="trace every op, however large the trace")
    run.add_argument("--plot", metavar="FILE", help="write a timeline picture (.png, .svg, .pdf)")
    run.add_argument("--memory-plot", metavar="FILE", help="write memory per device over the step")
    run.add_argument("--memory-snapshot", metavar="FILE",
                     help="write a PyTorch memory snapshot (pickle) of one rank, for pytorch.org/memory_viz")
    run.add_argument("--memory-snapshot-rank", type=non_negative_int, default=0, metavar="RANK",
                     help="pipeline rank of --memory-snapshot (default 0)")
    run.add_argument("--report", metavar="FILE", help="write an interactive HTML report (one file, no network needed)")
    run.add_argument("--samples", type=sample_count, metavar="N",
                     help="draw N step times with op-time variation (variability.cv) and report the distribution "
                          "(docs/reliability.md)")
    run.add_argument("--seed", type=non_negative_int, metavar="S", help="seed of the --samples draws (default 0)")
    run.add_argument("--distribution-plot", metavar="FILE", help="write a histogram of the step-time distribution")
    run.add_argument("--goodput", action="store_true",
                     help="expected days to train --tokens with failures, checkpoints and restarts (reliability)")
    run.add_argument("--tokens", type=token_count, metavar="T",
                     help="tokens to train, for --goodput (e.g. 15.6e12); in the model's throughput unit: images of "
                          "an image model, audio seconds of a speech model")
    run.add_argument("--goodput-plot", metavar="FILE", help="write the run's expected time as a stacked bar")
    run.set_defaults(handler=_run)
