"""Physical quantities written as strings in input files.

Inside mpsim every quantity is a float in an SI base unit: seconds, bytes, FLOP,
FLOP/s, bytes/s. In YAML files a value may carry its unit, the way datasheets print
it: ``"900 GB/s"``, ``"80 GiB"``, ``"2.5 us"``, ``"989 TFLOP/s"``, ``"200 Gb/s"``.

Conventions (the ones datasheets and nccl-tests use):

* ``GB`` is 10^9 bytes, ``GiB`` is 2^30 bytes; ``B`` is a byte, ``b`` a bit, so
  ``"400 Gb/s"`` (a NIC) is 50e9 bytes/s.
* A bare number means the SI base unit of the field.
* A unit of the wrong dimension is an error, never a silent conversion: ``"80 GB"``
  where a bandwidth is expected is rejected.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BeforeValidator

Dimension = Literal["bytes", "bandwidth", "time", "flops", "flop_rate"]

_SI_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BIN_PREFIX = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}

# base unit -> (dimension, factor to SI base)
_BASE_UNITS: dict[str, tuple[Dimension, float]] = {
    "B": ("bytes", 1.0),
    "b": ("bytes", 0.125),
    "B/s": ("bandwidth", 1.0),
    "Bps": ("bandwidth", 1.0),
    "b/s": ("bandwidth", 0.125),
    "bps": ("bandwidth", 0.125),
    "FLOP": ("flops", 1.0),
    "FLOPs": ("flops", 1.0),
    "FLOP/s": ("flop_rate", 1.0),
    "FLOPS": ("flop_rate", 1.0),
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}

_EXAMPLES: dict[Dimension, str] = {
    "bytes": "'80 GiB'",
    "bandwidth": "'900 GB/s' or '400 Gb/s'",
    "time": "'2.5 us'",
    "flops": "'3.1 TFLOP'",
    "flop_rate": "'989 TFLOP/s'",
}

_NUMBER_UNIT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([^\s\d].*)?\s*$")


def _unit_factor(unit: str) -> tuple[Dimension, float] | None:
    unit = unit.strip()
    if unit in _TIME_UNITS:
        return "time", _TIME_UNITS[unit]
    if unit in _BASE_UNITS:
        return _BASE_UNITS[unit]
    for prefix, factor in _BIN_PREFIX.items():
        if unit.startswith(prefix) and unit[len(prefix):] in _BASE_UNITS:
            dim, base = _BASE_UNITS[unit[len(prefix):]]
            return dim, factor * base
    for prefix, factor in _SI_PREFIX.items():
        if prefix and unit.startswith(prefix) and unit[len(prefix):] in _BASE_UNITS:
            dim, base = _BASE_UNITS[unit[len(prefix):]]
            return dim, factor * base
    return None


def parse_quantity(value: object, dimension: Dimension) -> float:
    """Parse ``value`` (number or string with unit) into the SI base unit of ``dimension``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a {dimension} such as {_EXAMPLES[dimension]}, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if not match:
            raise ValueError(f"expected a {dimension} such as {_EXAMPLES[dimension]}, got {value!r}")
        number = float(match.group(1))
        unit = (match.group(2) or "").strip()
        if unit:
            found = _unit_factor(unit)
            if found is None:
                raise ValueError(
                    f"unknown unit {unit!r} in {value!r}; expected a {dimension} such as "
                    f"{_EXAMPLES[dimension]}"
                )
            dim, factor = found
            if dim != dimension:
                raise ValueError(
                    f"{value!r} is a {dim}, but a {dimension} is expected here "
                    f"(such as {_EXAMPLES[dimension]})"
                )
            number *= factor
    else:
        raise ValueError(f"expected a {dimension} such as {_EXAMPLES[dimension]}, got {value!r}")
    if not math.isfinite(number):
        raise ValueError(f"expected a finite {dimension}, got {value!r}")
    if number < 0:
        # no size, rate or duration is below zero; said here, in the user's own units, before a
        # field's bound would report the number converted to bytes or seconds
        raise ValueError(f"a {dimension} cannot be negative, got {value!r}")
    return number


def _validator(dimension: Dimension):
    def parse(value: object) -> float:
        return parse_quantity(value, dimension)

    return BeforeValidator(parse)


Bytes = Annotated[float, _validator("bytes")]
Bandwidth = Annotated[float, _validator("bandwidth")]
Seconds = Annotated[float, _validator("time")]
Flops = Annotated[float, _validator("flops")]
FlopRate = Annotated[float, _validator("flop_rate")]


def format_bytes(n: float) -> str:
    """Bytes as a short human string in binary units (the way memory is usually read)."""
    for unit, factor in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{n:.0f} B"


def format_need(need_bytes: float, capacity_bytes: float) -> str:
    """``need of capacity`` in binary units; where a need over the capacity rounds to the same
    figure ("80.00 GiB of 80.00 GiB"), the excess is named too, so the line reads as a failure."""
    need, capacity = format_bytes(need_bytes), format_bytes(capacity_bytes)
    if need_bytes > capacity_bytes and need == capacity:
        return f"{need} of {capacity} ({format_bytes(need_bytes - capacity_bytes)} over)"
    return f"{need} of {capacity}"


def format_seconds(t: float) -> str:
    """Seconds as a short human string."""
    if abs(t) >= 1.0:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"
