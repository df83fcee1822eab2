"""The base class of every input model: strict, immutable, unknown fields rejected."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Strict pydantic model: a misspelt field is an error, not a silently ignored key."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, validate_default=True)
