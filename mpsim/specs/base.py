"""The base class of every input model: strict, immutable, unknown fields rejected.

YAML is generous in ways that change a run without a word: ``tp: true`` and
``microbatch_size: yes`` are booleans, which plain pydantic accepts as the integer 1,
``tp: 8.0`` and ``tp: "8"`` are a float and a text, which it accepts as 8, and ``.inf``
or ``.nan`` are floats. Every spec refuses them: a boolean only where the field is a
boolean, a whole-number field (a count, a size of a parallel group) only a whole number
written as one, and only finite numbers.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _accepts_bool(annotation: Any) -> bool:
    """Whether a field's type admits ``True``/``False`` as themselves (bool, Any, or a union with either)."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _accepts_bool(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(_accepts_bool(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return any(isinstance(arg, bool) for arg in typing.get_args(annotation))
    return False


def _whole_numbers(annotation: Any) -> bool | None:
    """Whether a field holds whole numbers only: True for ``int`` (or ``int | None``), None for a
    list or tuple of them (each item is checked), False for anything else."""
    if annotation is int:
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _whole_numbers(args[0])
    if origin is typing.Union or origin is types.UnionType:
        # None and names (Literal) beside one kind of numbers: the numbers are still whole, but a
        # text may be one of the names, so only the items of a list are checked then
        names = any(typing.get_origin(arg) is typing.Literal for arg in args)
        kinds = [_whole_numbers(arg) for arg in args
                 if arg is not type(None) and typing.get_origin(arg) is not typing.Literal]
        if len(kinds) != 1 or (kinds[0] is True and names):
            return False
        return kinds[0]
    if origin in (list, tuple) and args and all(arg is int or arg is Ellipsis or _whole_numbers(arg) is True
                                                for arg in args):
        return None
    return False


def _not_whole(value: Any) -> str | None:
    """What is wrong with ``value`` as a whole number written as one, if anything."""
    if isinstance(value, float):
        return f"expected a whole number, got {value!r} (write it without a decimal point)"
    if isinstance(value, str):
        return f"expected a whole number, got the text {value!r}"
    return None


# (model class, field name) -> _whole_numbers of its annotation: validation runs per field, and
# reading an annotation's typing structure each time would cost more than the check
_WHOLE: dict[tuple[type, str], bool | None] = {}


class Spec(BaseModel):
    """Strict pydantic model: a misspelt field is an error, not a silently ignored key."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, validate_default=True,
                              allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name) if info.field_name is not None else None
        if field is None:
            return value
        if isinstance(value, bool) and not _accepts_bool(field.annotation):
            raise ValueError(f"expected {_kind(field.annotation)}, got the boolean {str(value).lower()}")
        key = (cls, info.field_name)
        if key not in _WHOLE:
            _WHOLE[key] = _whole_numbers(field.annotation)
        whole = _WHOLE[key]
        if whole is not False:
            items = [value] if whole else (value if isinstance(value, (list, tuple)) else [])
            for item in items:
                problem = _not_whole(item)
                if problem:
                    raise ValueError(problem)
        return value


def _kind(annotation: Any) -> str:
    """A few words for what a field holds, for the message."""
    text = str(annotation)
    if "int" in text:
        return "a whole number"
    if "float" in text:
        return "a number"
    if "str" in text or "Literal" in text:
        return "a name"
    return "a value of the field's type"
