"""PyTorch interop: import a ``torch.nn.Module`` as a layer stack.

Everything here runs on the meta device: shapes and FLOPs without memory or compute, so
a 22B-parameter model costs nothing to inspect. PyTorch is optional (the ``calibrate``
extra); nothing outside this package imports it.
"""

from __future__ import annotations

from mpsim.errors import InputError

INSTALL_HINT = "PyTorch is needed to import a model: pip install 'mpsim[calibrate]' (torch>=2.12)"


def require_torch():
    """The ``torch`` module, or an :class:`InputError` saying how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError(INSTALL_HINT) from None
    return torch
