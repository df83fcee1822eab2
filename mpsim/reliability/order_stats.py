"""The slowest of n data-parallel replicas, drawn from one replica's distribution by order statistics.

A synchronous step ends when the last replica's gradients arrive, so the job's step is
the maximum of the replicas' steps. The simulation runs one replica (the symmetry
collapse); if the n replicas are independent with the same distribution function F, their
maximum has distribution function F^n. Drawing from it needs no n-fold simulation:
with U uniform on (0, 1), F^-1(U^(1/n)) has exactly the maximum's distribution (inverse
transform). Near the top the quantile is taken from the upper tail 1 - U^(1/n),
computed as -expm1(log(U) / n) so that it keeps its digits when n is in the thousands.

F itself is estimated from the simulated replica samples: their own distribution as far
as they reach (the quantiles the replica's percentiles are read from), and beyond the
largest of them, where the maximum of thousands of replicas sits, the tail of a lognormal
fitted to them (mean and standard deviation of their logarithms), never below that largest
sample. Taking both from one F keeps every quantile of the maximum at or above the
replica's; a lognormal for the whole of F did not, where the samples' tail is heavier than
a lognormal's. Samples that are all equal give a distribution of that one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

_STANDARD_NORMAL = NormalDist()


def open_uniform(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` uniform draws strictly inside (0, 1): 53-bit integers offset by half a step."""
    return (rng.integers(0, 2**53, count, dtype=np.int64).astype(np.float64) + 0.5) / 2.0**53


@dataclass(frozen=True)
class Lognormal:
    """A lognormal distribution: log X is normal with mean ``mu`` and standard deviation ``sigma``."""

    mu: float
    sigma: float

    @classmethod
    def fit(cls, samples: np.ndarray) -> Lognormal:
        """The lognormal whose log-mean and log-standard deviation are the samples' (ddof 1)."""
        logs = np.log(samples)
        return cls(float(logs.mean()), float(logs.std(ddof=1)))

    def upper_quantile(self, tail: np.ndarray) -> np.ndarray:
        """The value exceeded with probability ``tail`` (each in (0, 1))."""
        z = np.array([-_STANDARD_NORMAL.inv_cdf(float(t)) for t in tail])
        return np.exp(self.mu + self.sigma * z)


@dataclass(frozen=True)
class PointMass:
    """Every draw is ``value``: a replica whose samples never varied."""

    value: float

    def upper_quantile(self, tail: np.ndarray) -> np.ndarray:
        return np.full(len(tail), self.value)


@dataclass(frozen=True)
class Spliced:
    """The samples' own distribution up to their largest, a fitted lognormal's tail beyond it."""

    samples: tuple[float, ...]  # sorted
    tail_fit: Lognormal

    @classmethod
    def fit(cls, samples: np.ndarray) -> Spliced:
        return cls(tuple(sorted(float(v) for v in samples)), Lognormal.fit(samples))

    def upper_quantile(self, tail: np.ndarray) -> np.ndarray:
        """The value exceeded with probability ``tail``: the samples' quantile (numpy's linear one,
        as the percentiles of a sample set are read) where ``tail`` is at least one sample's share,
        else the lognormal's, never below the largest sample."""
        values = np.asarray(self.samples)
        tail = np.asarray(tail, dtype=float)
        inside = tail >= 1.0 / len(values)
        out = np.empty(len(tail))
        out[inside] = np.quantile(values, 1.0 - tail[inside])
        if not inside.all():
            out[~inside] = np.maximum(values[-1], self.tail_fit.upper_quantile(tail[~inside]))
        return out


def replica_distribution(samples: np.ndarray) -> Spliced | PointMass:
    """F of one replica estimated from its samples (see the module doc)."""
    if len(samples) == 0:
        raise ValueError("no samples")
    if np.all(samples == samples[0]):
        return PointMass(float(samples[0]))
    if len(samples) < 2:
        raise ValueError("a varying distribution needs at least two samples")
    return Spliced.fit(samples)


def max_of_replicas(distribution, replicas: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """``draws`` values of the maximum of ``replicas`` independent draws from ``distribution``.

    ``distribution`` has ``upper_quantile(tail)``; each draw is F^-1(U^(1/n)), exact for
    independent replicas.
    """
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    tail = -np.expm1(np.log(open_uniform(rng, draws)) / replicas)  # 1 - U^(1/n), accurate near 0
    return distribution.upper_quantile(tail)


@dataclass(frozen=True)
class Percentiles:
    """Mean and percentiles of a set of step times, in seconds."""

    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    min_s: float
    max_s: float

    @classmethod
    def of(cls, values: np.ndarray) -> Percentiles:
        if len(values) and np.all(values == values[0]):  # exactly that value, without summation rounding
            value = float(values[0])
            return cls(value, value, value, value, value, value)
        p50, p90, p99 = (float(v) for v in np.percentile(values, [50, 90, 99]))
        return cls(float(np.mean(values)), p50, p90, p99, float(np.min(values)), float(np.max(values)))

    def as_dict(self) -> dict[str, float]:
        return {"mean_s": self.mean_s, "p50_s": self.p50_s, "p90_s": self.p90_s, "p99_s": self.p99_s,
                "min_s": self.min_s, "max_s": self.max_s}

