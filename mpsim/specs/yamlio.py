"""YAML as mpsim reads it: the safe loader, made strict where silence would change a run.

Plain YAML keeps the last of two equal keys in a mapping without a word, and turns a
mistyped number of any length into an integer; a scenario or hardware file that did either
would run something other than what its author meant. Every input file and every
``--set`` value is parsed here, and a syntax error becomes one :class:`InputError` line
with the file, line and column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mpsim.errors import InputError
from mpsim.paths import display_path, read_text

# The longest integer an input may spell out: 2^63 has 19 digits, more than any count,
# size or rate a scenario can hold; longer ones are typing accidents (and Python refuses
# to convert strings past 4,300 digits at all).
MAX_INTEGER_DIGITS = 19


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, stricter where silence would change a run.

    A key given twice in one mapping is an error (plain YAML keeps the last one without a
    word), and so is an integer longer than :data:`MAX_INTEGER_DIGITS` digits.
    """

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: SafeLoader reports it below
                continue
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' given twice (lines {first} and {key_node.start_mark.line + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INTEGER_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {digits} digits is out of range (at most {MAX_INTEGER_DIGITS})",
                node.start_mark)
        return super().construct_yaml_int(node)


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
StrictLoader.add_constructor("tag:yaml.org,2002:map", StrictLoader.construct_yaml_map)


def parse_yaml(text: str) -> Any:
    """YAML text to Python values with :class:`StrictLoader`."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}{problem}"


def read_yaml(path: Path) -> Any:
    """Parse a YAML (or JSON) file; a syntax error names the line."""
    text = read_text(path)
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        raise InputError(f"malformed YAML: {_yaml_problem(exc)}", display_path(path)) from None
