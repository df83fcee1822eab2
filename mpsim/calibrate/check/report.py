"""The text report of ``mpsim validate`` (and the short one of ``mpsim calibrate``).

The validation report ends with one machine-readable line,
``median_abs_error_pct=<x> max_abs_error_pct=<y> schedules=<n>``: the step-time
errors over the held-out schedules (every schedule but the one the fit used).
"""

from __future__ import annotations

from mpsim.calibrate.check.compare import MULTIPLIER_RANGE, OVERHEAD_RANGE_S, step_errors
from mpsim.specs.calibration import CalibrationProfile
from mpsim.units import format_seconds


def _load(values) -> str:
    return "n/a" if not values else " / ".join(f"{v:.2f}" for v in values)


def machine_lines(profile: CalibrationProfile) -> list[str]:
    """Device, torch and how busy the machine was."""
    d, c = profile.device, profile.conditions
    share = "n/a" if c.foreign_cpu_share is None else f"{100 * c.foreign_cpu_share:.1f} %"
    slow = "n/a" if c.canary_slowdown is None else f"{c.canary_slowdown:.3f}x"
    lines = [f"device       {d.kind}: {d.name}; {d.ranks} rank(s) x {d.threads_per_rank} thread(s) on {d.cores} "
             f"core(s); torch {d.torch}, python {d.python}",
             f"machine load load average (1/5/15 min) {_load(c.load_average_before)} before, "
             f"{_load(c.load_average_after)} after; during kept measurements other processes used at most {share} "
             f"of the CPU and the speed canary ran at most {slow} its fastest time" + ("  BUSY: numbers suspect" if c.busy
                                                                                  else "")]
    return lines


def profile_lines(profile: CalibrationProfile) -> list[str]:
    """The fitted curves in one paragraph."""
    comp = profile.compute
    curve = comp.gemm_curve
    lines = [f"compute      {len(comp.gemm_points)} GEMMs, {len(comp.attention_points)} attention cores, "
             f"{len(comp.memory_points)} memory-bound ops measured ({comp.dtype})",
             f"  GEMM curve   up to {100 * curve.max_efficiency:.1f} % of {curve.peak_flops / 1e9:.0f} GFLOP/s, half "
             f"of that at {curve.half_efficiency_flops / 1e6:.2f} MFLOP (rms error {100 * curve.rms_error:.1f} %)",
             f"  attention    fused core at {100 * comp.attention_curve.forward_fraction:.1f} % of peak forward, "
             f"{100 * comp.attention_curve.backward_fraction:.1f} % backward",
             f"  streaming    {comp.memory_fit.bandwidth / 1e9:.2f} GB/s after "
             f"{format_seconds(comp.memory_fit.latency_s)}"
             f" per op (rms error {100 * comp.memory_fit.rms_error:.1f} %)"]
    split = comp.split_backward
    if split is not None:
        lines.append(f"  split bwd    one layer: B {format_seconds(split.full_s)}, I {format_seconds(split.input_s)} "
                     f"then W {format_seconds(split.weight_s)}: W on its own runs {split.weight_slowdown:.3f}x its "
                     f"share of B (spread {100 * split.spread:.1f} % over {split.samples} passes)")
    if profile.links is not None:
        p2p = profile.links.p2p
        lines.append(f"links        {profile.links.backend}: point-to-point {format_seconds(p2p.latency_s)} + bytes / "
                     f"{p2p.bandwidth / 1e9:.2f} GB/s")
        for fit in profile.links.collectives:
            size = (f" + bytes / {fit.bandwidth / 1e9:.2f} GB/s" if fit.bandwidth is not None
                    else " whatever the size (no growth over the sizes measured)")
            lines.append(f"  {fit.kind:<14} on {fit.ranks}: {format_seconds(fit.latency_s)}{size} "
                         f"(rms error {100 * fit.rms_error:.1f} %)")
    return lines


def fit_lines(fit, problems: list[str]) -> list[str]:
    verdict = "in range" if not problems else "OUT OF RANGE: " + "; ".join(problems)
    return [f"fit on {fit.fitted_on}: efficiency multiplier {fit.efficiency_multiplier:.3f} (sensible: "
            f"{MULTIPLIER_RANGE[0]}-{MULTIPLIER_RANGE[1]}), action overhead {fit.action_overhead_s * 1e3:.2f} ms "
            f"(sensible: {OVERHEAD_RANGE_S[0] * 1e3:.0f}-{OVERHEAD_RANGE_S[1] * 1e3:.0f} ms); per-action rms "
            f"error {fit.rms_error_pct:.1f} %: {verdict}"]


def schedule_table(outcome) -> list[str]:
    lines = [f"{'schedule':<18}{'vpp':>4}{'measured step':>15}{'spread':>8}{'noise':>7}{'predicted':>12}{'error':>9}"
             f"{'actions |err| median':>22}{'max':>8}{'steps':>7}{'busy':>6}{'canary':>8}"]
    for check in outcome.checks:
        med, worst = check.action_error_summary()
        name = check.name + ("" if check.held_out else " (fit)")
        lines.append(f"{name:<18}{check.vpp:>4}{format_seconds(check.measured_step_s):>15}"
                     f"{100 * check.measured_spread:>7.1f}%{100 * check.median_excess:>6.1f}%"
                     f"{format_seconds(check.predicted_step_s):>12}"
                     f"{check.error_pct:>+8.1f}%{med:>21.1f}%{worst:>7.1f}%"
                     f"{len(check.steps):>4}/{check.attempts:<2}{100 * check.max_foreign_share:>5.0f}%"
                     f"{check.max_slowdown:>7.2f}x")
        if check.disturbed_steps:
            lines.append(f"  {check.disturbed_steps} of the kept steps were measured while the machine was disturbed "
                         f"(--allow-busy kept the least disturbed of their tries)")
        if check.order_problem:
            lines.append(f"  order differs from mpsim's: {check.order_problem}")
    for name, why in outcome.skipped.items():
        lines.append(f"{name:<18} not run: {why}")
    return lines


def miss_lines(outcome) -> list[str]:
    """Per schedule and rank: where the measured step differs from the predicted one."""
    lines = ["where the step differs, per rank, measured - predicted: inside its actions / in its waits for a "
             "receive / the rest (framework time between actions, own sends):"]
    for check in outcome.checks:
        parts = [f"rank {rank} {miss.actions_s * 1e3:+.1f} / {miss.receive_waits_s * 1e3:+.1f} / "
                 f"{miss.rest_s * 1e3:+.1f} ms" for rank, miss in enumerate(check.miss_by_rank())]
        lines.append(f"  {check.name:<16} " + "; ".join(parts))
    return lines


def action_lines(outcome, limit: int = 4) -> list[str]:
    """Per schedule and action kind: median predicted vs measured, and the worst actions."""
    lines = ["per-action error by kind (median predicted / measured; worst action):"]
    for check in outcome.checks:
        kinds: dict[str, list] = {}
        for error in check.actions:
            kinds.setdefault(error.kind, []).append(error)
        parts = []
        for kind, errors in sorted(kinds.items()):
            errors.sort(key=lambda e: e.error_pct)
            mid = errors[len(errors) // 2]
            worst = max(errors, key=lambda e: abs(e.error_pct))
            parts.append(f"{kind} {mid.predicted_s * 1e3:.1f}/{mid.measured_s * 1e3:.1f} ms (worst {worst.label} on "
                         f"rank {worst.rank} {worst.error_pct:+.0f} %)")
        lines.append(f"  {check.name:<16} " + "; ".join(parts[:limit + 2]))
    return lines


def tp_lines(widths) -> list[str]:
    """One line per MLP width of the TP check (the model's own first)."""
    if not widths:
        return ["TP check     not run (needs 2 ranks or more)"]
    first = widths[0]
    lines = [f"TP check     MLP block, {first.tokens} tokens, forward+backward, TP=1 against TP={first.tp} split the "
             f"Megatron way (and through DTensor, whose own overhead mpsim does not model):"]
    for tp in widths:
        line = (f"  hidden {tp.hidden:>5}, FFN {tp.ffn_hidden:>5}: TP=1 {format_seconds(tp.measured_single_s)}, "
                f"TP={tp.tp} {format_seconds(tp.measured_split_s)}: measured speed-up {tp.measured_speedup:.3f}, "
                f"predicted {tp.predicted_speedup:.3f} ({format_seconds(tp.predicted_single_s)} / "
                f"{format_seconds(tp.predicted_split_s)}), error {tp.error_pct:+.1f} %")
        if tp.measured_dtensor_s is not None:
            line += (f"; DTensor {format_seconds(tp.measured_dtensor_s)} (speed-up {tp.dtensor_speedup:.3f}, "
                     f"{format_seconds(tp.dtensor_overhead_s)} over the written-out split)")
        lines.append(line)
    return lines


def format_validation(outcome) -> str:
    """The whole validation report; the last line is the machine-readable summary."""
    lines = ["mpsim validate: predicted against measured, PyTorch pipeline schedules on this machine"]
    lines += machine_lines(outcome.profile)
    lines += profile_lines(outcome.profile)
    lines += fit_lines(outcome.fit, outcome.fit_problems)
    lines += ["", "step time = first rank's start of schedule.step() to the last action's end (no optimizer); "
                  "error = (predicted - measured) / measured"]
    lines += schedule_table(outcome)
    lines += [""] + miss_lines(outcome) + [""] + action_lines(outcome) + [""] + tp_lines(outcome.tp_widths)
    med, worst, count = step_errors(outcome.checks)
    lines.append(f"median_abs_error_pct={med:.2f} max_abs_error_pct={worst:.2f} schedules={count}")
    return "\n".join(lines)


def format_calibration(profile: CalibrationProfile, fit_problems: list[str] | None = None) -> str:
    """The short report of ``mpsim calibrate``: machine, fitted curves and the in-job fit."""
    fit = fit_lines(profile.fit, fit_problems or []) if profile.fit is not None else []
    return "\n".join(["mpsim calibrate: " + (profile.description or "profile"), *machine_lines(profile),
                      *profile_lines(profile), *fit])
