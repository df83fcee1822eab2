"""The base class of every input model: strict, immutable, unknown fields rejected.

YAML is generous in ways that change a run without a word: ``tp: true`` and
``microbatch_size: yes`` are booleans, which plain pydantic accepts as the integer 1, and
``.inf`` or ``.nan`` are floats. Every spec refuses them: a boolean only where the field
is a boolean, and only finite numbers.
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


class Spec(BaseModel):
    """Strict pydantic model: a misspelt field is an error, not a silently ignored key."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, validate_default=True,
                              allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _accepts_bool(field.annotation):
                raise ValueError(f"expected {_kind(field.annotation)}, got the boolean {str(value).lower()}")
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
