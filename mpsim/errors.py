"""Errors a user can fix, reported as one line naming the file, the field and the fix.

Every problem with the input (a malformed file, a wrong unit, a layout a framework would
refuse) becomes an :class:`InputError`. The command line prints ``str(error)`` and exits
with code 2; nothing about the input is ever reported as a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class InputError(Exception):
    """A problem with the user's input: where it is (file, field) and what to do."""

    message: str
    file: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.file, self.field) if part)
        return f"{where}: {self.message}" if where else self.message


EXIT_INPUT_ERROR = 2
# The input is valid but the simulated job does not fit: some rank's peak memory is above
# its device's capacity (``mpsim run``, ``compare``), or no layout fits (``mpsim plan``).
# The step is still simulated and printed; scripts can tell it apart from success.
EXIT_OUT_OF_MEMORY = 3
# Stopped by Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention); sweeps and plans
# have saved every finished point to their results file and a rerun resumes
EXIT_INTERRUPTED = 130


def closest_names(name: str, known: list[str], n: int = 3) -> list[str]:
    """The entries of ``known`` closest to ``name`` by difflib's ratio, best first (none
    when nothing is close); a short name that is part of entries (``h100``) names those too."""
    import difflib

    names = list(dict.fromkeys(known))
    close = difflib.get_close_matches(name, names, n=n)
    if len(name) >= 3:
        close += [entry for entry in names if name.lower() in entry.lower() and entry not in close]
    return close[:n]


def did_you_mean(name: str, known: list[str], n: int = 3) -> str:
    """``"did you mean a, b?"`` naming the entries of ``known`` closest to ``name``, or ``""``
    when none is close: a typo gets its fix, not a list to read through."""
    close = closest_names(name, known, n)
    return f"did you mean {', '.join(close)}?" if close else ""
