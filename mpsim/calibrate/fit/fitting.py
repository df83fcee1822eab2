"""Least-squares fits behind a calibration profile (numpy only).

Every fit here is a straight line ``t = a + b x`` through measured points, with two
choices made for timing data:

* the error is weighed relative to each point (a 10 us op and a 100 ms op count the
  same per percent), since the profile is used across sizes that differ by 1000x;
* the intercept is kept non-negative: a negative latency fits curvature, not physics,
  and would predict impossible times for small messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LineFit:
    """``t = intercept + slope * x`` and its root-mean-square relative error."""

    intercept: float
    slope: float
    rms_error: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(x: list[float], t: list[float], relative: bool = True) -> LineFit:
    """Fit ``t = a + b x`` (a >= 0, b >= 0) to the points, errors relative to ``t`` by default."""
    xs, ts = np.asarray(x, dtype=float), np.asarray(t, dtype=float)
    if len(xs) == 0:
        raise ValueError("no points to fit")
    weights = 1.0 / ts if relative else np.ones_like(ts)
    if len(xs) == 1 or np.ptp(xs) == 0:
        a, b = 0.0, float(np.median(ts / xs)) if np.all(xs > 0) else 0.0
    else:
        design = np.stack([weights, xs * weights], axis=1)
        (a, b), *_ = np.linalg.lstsq(design, ts * weights, rcond=None)
        if a < 0:  # through the origin instead
            a = 0.0
            b = float(np.sum(xs * ts * weights**2) / np.sum((xs * weights) ** 2))
        if b < 0:  # no size dependence at all: a constant
            a, b = float(np.sum(ts * weights**2) / np.sum(weights**2)), 0.0
    predicted = a + b * xs
    rms = float(np.sqrt(np.mean(((predicted - ts) / ts) ** 2)))
    return LineFit(float(a), float(b), rms)


def alpha_beta(sizes_bytes: list[float], seconds: list[float]) -> tuple[float, float, float]:
    """(latency_s, bandwidth bytes/s, rms relative error) of ``t = latency + bytes / bandwidth``."""
    line = fit_line(sizes_bytes, seconds)
    bandwidth = 1.0 / line.slope if line.slope > 0 else math.inf
    return line.intercept, bandwidth, line.rms_error


def gemm_curve(flops: list[float], seconds: list[float], peak_flops: float) -> tuple[float, float, float]:
    """(max_efficiency, half_efficiency_flops, rms error) of ``t = (F + F_half) / (peak * e_max)``.

    The line ``t = a + F / r`` is the same curve with ``e_max = r / peak`` and
    ``F_half = a * r``: the fixed cost ``a`` is worth ``F_half`` FLOPs of work.
    """
    line = fit_line(flops, seconds)
    rate = 1.0 / line.slope
    return rate / peak_flops, line.intercept * rate, line.rms_error


@dataclass(frozen=True)
class ActionFitResult:
    """``measured = predicted / efficiency_multiplier`` over a schedule's actions."""

    efficiency_multiplier: float
    rms_error_pct: float
    points: int


def fit_actions(predicted_s: list[float], measured_s: list[float]) -> ActionFitResult:
    """Fit a speed multiplier to (predicted, measured) action times, least squares through the origin.

    ``predicted_s`` are sums of microbenchmarked op times, ``measured_s`` the same actions
    timed inside the training job. No intercept: a fit schedule whose actions come in
    two sizes (a forward and a backward about twice as long) cannot tell a fixed cost
    per action from a multiplier, and a free intercept swings by several milliseconds
    either way from one run to the next. The fixed cost per action is measured instead
    (the gaps between actions, ``mpsim/calibrate/check/measured.py``).
    """
    products = sum(p * m for p, m in zip(predicted_s, measured_s))
    if products <= 0:
        raise ValueError("no positive action times to fit")
    slope = products / sum(p * p for p in predicted_s)
    rms = math.sqrt(sum(((slope * p - m) / m) ** 2 for p, m in zip(predicted_s, measured_s)) / len(measured_s))
    return ActionFitResult(1.0 / slope, 100 * rms, len(measured_s))


def weight_slowdown(full_s: float, input_s: float, weight_s: float) -> float:
    """``W`` run on its own over its share of a full backward, ``W / (B - I)``."""
    share = full_s - input_s
    if share <= 0:
        raise ValueError(f"a full backward ({full_s:.3g} s) no longer than its input gradient ({input_s:.3g} s)")
    return weight_s / share
