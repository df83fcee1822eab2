"""Throughput in the model's own unit: tokens for language models, images, audio seconds, samples.

A step processes ``global_batch_size`` samples. What a sample is comes from the model
spec, never from the scenario's name: a transformer's sample is a sequence of
``seq_length`` tokens (tokens/s); a layer stack says it with ``sample_kind`` (a
``sequence`` of ``tokens_per_sample`` tokens, an ``image``, ``audio`` of
``audio_seconds_per_sample`` seconds, or a plain ``sample``). The JSON field
``tokens_per_s`` keeps its meaning for every model (samples times tokens per sample);
``throughput_unit`` and ``throughput_per_s`` carry the rate a person should read.

The same helpers read a sweep or plan record (``summary_metrics``), where records
written before the unit was recorded count tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

TOKENS = "tokens"


@dataclass(frozen=True)
class ThroughputUnit:
    """What the throughput of a model counts, and how many of it one sample holds."""

    name: str  # plural: "tokens", "images", "samples" or "audio seconds"
    per_sample: float

    def rate_name(self) -> str:
        """``tokens/s``, ``images/s``, ..."""
        return f"{self.name}/s"


def throughput_unit(model: Any) -> ThroughputUnit:
    """The unit of a model spec (transformer or layer stack)."""
    if getattr(model, "kind", "transformer") != "stack":
        return ThroughputUnit(TOKENS, float(model.seq_length))
    kind = model.sample_kind or ("sequence" if model.tokens_per_sample > 1 else "sample")
    if kind == "sequence":
        return ThroughputUnit(TOKENS, float(model.tokens_per_sample))
    if kind == "image":
        return ThroughputUnit("images", 1.0)
    if kind == "audio" and model.audio_seconds_per_sample is not None:
        return ThroughputUnit("audio seconds", float(model.audio_seconds_per_sample))
    return ThroughputUnit("samples", 1.0)


def record_rate(metrics: Mapping[str, Any]) -> tuple[float, str]:
    """(throughput per second, its unit) of a sweep or plan record's metrics."""
    if "throughput_per_s" in metrics:
        return metrics["throughput_per_s"], metrics["throughput_unit"]
    return metrics["tokens_per_s"], TOKENS


def rate_heading(units: Iterable[str]) -> str:
    """A column or axis name for rates in ``units``: ``images/s`` when they agree, else ``throughput/s``."""
    distinct = sorted(set(units))
    return f"{distinct[0]}/s" if len(distinct) == 1 else "throughput/s"
