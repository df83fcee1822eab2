"""Loops compiled by numba where it is installed: one loader for every compiled loop.

A few of mpsim's inner loops (the longest-path evaluator of ``mpsim/engine/compiled.py``,
the zero-bubble list scheduler of ``mpsim/schedules/zb_list.py``) are written twice: as
plain Python over plain objects, the reference, and as a function over numpy arrays that
numba compiles into machine code. The array function does the same floating-point
operations in the same order, so both give the same numbers to the bit; the tests hold
them to that. numba is an optional extra (``pip install 'mpsim[fast]'``): without it
:func:`compiled` answers None and the callers run the reference.
"""

from __future__ import annotations

from collections.abc import Callable

_LOOPS: dict[str, Callable | None] = {}  # compiled once per process (importing numba takes a while)


def compiled(loop: Callable) -> Callable | None:
    """``loop`` compiled by numba, or None where numba is not installed."""
    if loop.__qualname__ not in _LOOPS:
        try:
            from numba import njit
        except ImportError:  # exercised where numba is not installed
            _LOOPS[loop.__qualname__] = None
        else:
            # cache=True keeps the machine code beside the loop's file: later processes load it
            _LOOPS[loop.__qualname__] = njit(cache=True, nogil=True)(loop)
    return _LOOPS[loop.__qualname__]
