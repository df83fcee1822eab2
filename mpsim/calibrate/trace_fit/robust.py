"""A robust, non-negative linear fit of kernel times: ``t = sum_j c_j x_j`` with every ``c_j >= 0``.

Kernel times in a trace scatter: a kernel delayed by a concurrent copy, a collective held
up by a slow peer, timestamps rounded to whole microseconds. A least-squares fit lets a
few such kernels pull the line; the fit here minimises the sum of absolute *relative*
errors instead (a 7 us kernel and a 700 us one count alike per percent, and an outlier
counts by its size, not its square), by iteratively reweighted least squares.

Each coefficient is a physical cost (a latency, seconds per FLOP, seconds per byte) and
may not be negative, and some have a floor (a GEMM's FLOPs cannot run faster than the
peak). Rather than clamping, every subset of the features is fitted and the best fit
whose coefficients all respect their floors is kept, the others set to zero: with two
or three features that is a handful of small solves. A fit may use at most as many
terms as there are distinct points (two sizes cannot tell three costs apart). Numpy
only; deterministic.
"""

from __future__ import annotations

import itertools

import numpy as np

IRLS_ROUNDS = 60
# residuals below this share of the time count as this share: keeps the weights finite
RESIDUAL_FLOOR = 1e-4


def _l1_relative(design: np.ndarray) -> np.ndarray:
    """Coefficients minimising sum |design @ c - 1| (rows already divided by the measured time)."""
    weights = np.ones(design.shape[0])
    coefficients = np.linalg.lstsq(design, np.ones(design.shape[0]), rcond=None)[0]
    for _ in range(IRLS_ROUNDS):
        root = np.sqrt(weights)
        coefficients = np.linalg.lstsq(design * root[:, None], root, rcond=None)[0]
        residuals = np.abs(design @ coefficients - 1.0)
        weights = 1.0 / np.maximum(residuals, RESIDUAL_FLOOR)
    return coefficients


def fit_nonnegative(features: np.ndarray, seconds: np.ndarray, floors: list[float] | None = None,
                    max_terms: int | None = None, needs: dict[int, int] | None = None) -> np.ndarray:
    """Coefficients ``c >= 0`` with ``features @ c`` close to ``seconds`` in relative terms.

    ``features`` has one row per kernel and one column per cost term. Returns one
    coefficient per column; a column that could only enter with a coefficient at or
    below its floor (``floors``, default 0) gets zero. At most ``max_terms`` columns
    are used. ``needs`` maps a column to one it may only enter beside (an extra cost on
    top of another term is no cost without it).
    """
    features, seconds = np.asarray(features, dtype=float), np.asarray(seconds, dtype=float)
    if features.ndim != 2 or features.shape[0] != seconds.shape[0] or features.shape[0] == 0:
        raise ValueError("one row of features per measured time is needed")
    design = features / seconds[:, None]
    columns = features.shape[1]
    floor = np.zeros(columns) if floors is None else np.asarray(floors, dtype=float)
    most = columns if max_terms is None else max(1, min(columns, max_terms))
    best: tuple[float, tuple[int, ...], np.ndarray] | None = None
    for size in range(1, most + 1):
        for subset in itertools.combinations(range(columns), size):
            if needs and any(column in subset and needed not in subset for column, needed in needs.items()):
                continue
            part = design[:, subset]
            if np.linalg.matrix_rank(part) < size:
                continue
            coefficients = _l1_relative(part)
            if np.any(coefficients <= floor[list(subset)]):
                continue
            cost = float(np.sum(np.abs(part @ coefficients - 1.0)))
            if best is None or cost < best[0] - 1e-12:
                best = (cost, subset, coefficients)
    result = np.zeros(columns)
    if best is not None:
        result[list(best[1])] = best[2]
    return result
