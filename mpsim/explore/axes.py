"""Sweep axes: which fields vary, over which values, and the points they expand to.

A sweep is a list of axes crossed as a grid. An axis is one field with its values
(``parallel.tp=1,2,4,8``), or several fields zipped together so that they vary in step
(``cluster.system=dgx-a100,dgx-h100`` with ``cluster.nodes=16,8``: two points, not four).

Values are written the way ``--set`` reads them (YAML scalars), separated by commas, or
as ranges:

* ``1..8``        -> 1, 2, 3, 4, 5, 6, 7, 8 (inclusive)
* ``2..16:2``     -> 2, 4, 6, ..., 16 (step)
* ``2^0..3``      -> 1, 2, 4, 8 (powers of a base, exponents inclusive)
* ``dgx-a100,dgx-h100``, ``true,false``, ``"400 Gb/s","800 Gb/s"``, ``[1,2],[3]``

In a scenario file, a top-level ``sweep:`` block does the same::

    sweep:
      parallel.tp: [1, 2, 4, 8]     # a list, or a string such as "1..8" or "2^0..3"
      parallel.pp: 2^0..3
      zip:                          # optional: these fields vary together, as one axis
        cluster.system: [dgx-a100, dgx-h100]
        cluster.nodes: [16, 8]

Points come out in a fixed order: the first axis varies slowest, as nested loops
written in the order the axes were given.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import yaml

from mpsim.errors import InputError
from mpsim.specs.yamlio import MAX_INTEGER_DIGITS, parse_yaml

Point = tuple[tuple[str, Any], ...]  # ((field, value), ...) in axis order

_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?::\s*(\d+)\s*)?$")
_POWERS = re.compile(r"^\s*(\d+)\s*\^\s*(\d+)\s*\.\.\s*(\d+)\s*$")
_FIELD = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$")
MAX_RANGE_VALUES = 10_000  # a typo like 1..1000000 should fail, not expand


@dataclass(frozen=True)
class Axis:
    """Fields that vary together, and their values: ``values[i]`` gives every field's i-th value."""

    fields: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]

    def __len__(self) -> int:
        return len(self.values)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets or quotes (``[1,2],[3]`` is two values)."""
    parts, depth, quote, current = [], 0, "", []
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts]


def _meant_as_range(text: str) -> bool:
    """Text with ``..`` between numbers or after a power that the range forms did not take
    (``2^a..3``, ``1..x``): a malformed range, not a value; a path such as ``file:../a.txt`` is not."""
    if text.count("..") != 1 or any(char in text for char in "/\\[]{},'\" "):
        return False
    left, right = text.split("..")
    return ":" not in left and ("^" in left or left[-1:].isdigit() or right[:1].isdigit())


def parse_values(text: str, label: str) -> list[Any]:
    """Values of one axis from text: a range, powers, or a comma-separated list of YAML scalars."""
    text = text.strip()
    powers = _POWERS.match(text)
    if powers:
        if any(len(group) > MAX_INTEGER_DIGITS for group in powers.groups()):
            raise InputError(f"range {text!r}: a number of more than {MAX_INTEGER_DIGITS} digits is out of range", label)
        base, low, high = (int(g) for g in powers.groups())
        if high < low:
            raise InputError(f"empty range {text!r}: the last exponent is below the first", label)
        if high - low + 1 > MAX_RANGE_VALUES:
            raise InputError(f"range {text!r} has more than {MAX_RANGE_VALUES} values", label)
        if base > 1 and high * math.log10(base) > MAX_INTEGER_DIGITS:
            raise InputError(f"range {text!r}: {base}^{high} has more than {MAX_INTEGER_DIGITS} digits", label)
        return [base ** e for e in range(low, high + 1)]
    span = _RANGE.match(text)
    if span:
        if any(len(group) > MAX_INTEGER_DIGITS for group in span.groups() if group):
            raise InputError(f"range {text!r}: a bound of more than {MAX_INTEGER_DIGITS} digits is out of range", label)
        low, high, step = int(span.group(1)), int(span.group(2)), int(span.group(3) or 1)
        if step <= 0 or high < low:
            raise InputError(f"empty range {text!r}: write LOW..HIGH or LOW..HIGH:STEP with LOW <= HIGH", label)
        if (high - low) // step + 1 > MAX_RANGE_VALUES:
            raise InputError(f"range {text!r} has more than {MAX_RANGE_VALUES} values", label)
        return list(range(low, high + 1, step))
    if _meant_as_range(text):
        raise InputError(f"range {text!r}: write LOW..HIGH, LOW..HIGH:STEP or BASE^LOW..HIGH with whole numbers",
                         label)
    values = []
    for part in _split_top_level(text):
        if not part:
            raise InputError(f"empty value in {text!r}", label)
        try:
            values.append(parse_yaml(part))
        except yaml.constructor.ConstructorError as exc:
            raise InputError(f"{part!r}: {exc.problem}", label) from None
        except yaml.YAMLError:
            values.append(part)
    return values


def _check_field(name: str, label: str) -> str:
    name = name.strip()
    if not _FIELD.match(name):
        raise InputError(f"{name!r} is not a field path like parallel.tp", label)
    return name


def parse_assignment(text: str) -> tuple[str, list[Any]]:
    """``parallel.tp=1,2,4`` -> ('parallel.tp', [1, 2, 4])."""
    label = f"--sweep {text}"
    if "=" not in text:
        raise InputError("expected FIELD=VALUES, e.g. parallel.tp=1,2,4,8 or parallel.pp=2^0..3", label)
    name, raw = text.split("=", 1)
    return _check_field(name, label), parse_values(raw, label)


def zipped(assignments: Iterable[tuple[str, list[Any]]], label: str) -> Axis:
    """One axis from several fields whose value lists have the same length."""
    pairs = list(assignments)
    lengths = {len(values) for _, values in pairs}
    if len(lengths) > 1:
        detail = ", ".join(f"{name} has {len(values)}" for name, values in pairs)
        raise InputError(f"zipped fields need the same number of values ({detail})", label)
    return Axis(tuple(name for name, _ in pairs), tuple(zip(*(values for _, values in pairs))))


def axes_from_args(grid: Iterable[str], zip_: Iterable[str] = ()) -> list[Axis]:
    """Axes from ``--sweep`` (one grid axis each) and ``--zip`` (all zipped into one axis)."""
    axes = [Axis((name,), tuple((v,) for v in values)) for name, values in map(parse_assignment, grid)]
    zip_pairs = [parse_assignment(text) for text in zip_]
    if zip_pairs:
        axes.append(zipped(zip_pairs, "--zip"))
    return axes


def _values_from_yaml(value: Any, label: str) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        return parse_values(value, label)
    return [value]


def axes_from_yaml(block: Any, label: str) -> list[Axis]:
    """Axes from a scenario file's ``sweep:`` block (see the module doc)."""
    if not isinstance(block, Mapping):
        raise InputError("sweep must be a mapping of field: values (and optionally zip: {field: values})", label)
    axes: list[Axis] = []
    for name, value in block.items():
        where = f"{label}: sweep.{name}"
        if name == "zip":
            if not isinstance(value, Mapping) or not value:
                raise InputError("zip must be a mapping of field: values", where)
            pairs = [(_check_field(str(k), where), _values_from_yaml(v, f"{where}.{k}")) for k, v in value.items()]
            axes.append(zipped(pairs, where))
        else:
            values = _values_from_yaml(value, where)
            axes.append(Axis((_check_field(str(name), where),), tuple((v,) for v in values)))
    return axes


def check_axes(axes: list[Axis]) -> None:
    """Every axis has values, no field is swept twice, and no value names a schedule or a
    system that does not exist: a misspelled name is a typo in the sweep, not a point that
    turns out invalid (as a layout that does not divide the heads does)."""
    seen: set[str] = set()
    for axis in axes:
        if not axis.values:
            raise InputError(f"sweep axis {', '.join(axis.fields)} has no values")
        for index, name in enumerate(axis.fields):
            if name in seen:
                raise InputError(f"{name} is swept twice; give each field once", "--sweep")
            seen.add(name)
            for values in axis.values:
                _check_name(name, values[index])


def _check_name(field: str, value: Any) -> None:
    """A swept schedule or system name that nothing is registered under."""
    if field == "parallel.schedule" and isinstance(value, str) and not value.startswith("file:"):
        from mpsim.schedules import unknown_schedule

        problem = unknown_schedule(value, files=True)
        if problem:
            raise InputError(problem, f"--sweep {field}")
    if field == "cluster.system" and isinstance(value, str):
        from mpsim.specs.loader import find_reference

        try:  # the names every command takes: a system's own name, its file's, or a path
            find_reference(value, "system", None)
        except InputError as exc:
            raise InputError(exc.message, f"--sweep {field}") from None


def expand(axes: list[Axis]) -> list[Point]:
    """Every point of the grid, first axis slowest."""
    check_axes(axes)
    points = []
    for combo in itertools.product(*(axis.values for axis in axes)):
        point: list[tuple[str, Any]] = []
        for axis, values in zip(axes, combo):
            point.extend(zip(axis.fields, values))
        points.append(tuple(point))
    return points


def override_text(name: str, value: Any) -> str:
    """``--set`` text that reads back as ``value`` (JSON is YAML, so non-strings go as JSON)."""
    if isinstance(value, str):
        try:
            if yaml.safe_load(value) == value:
                return f"{name}={value}"
        except yaml.YAMLError:
            pass
    return f"{name}={json.dumps(value)}"


