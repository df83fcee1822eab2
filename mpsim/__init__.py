"""mpsim: a discrete-event simulator for model-parallel training.

The main path (see docs/architecture.md): a scenario file -> ``specs.load_scenario``
-> ``simulate.simulate`` -> ``results.summarize``. In a notebook the same path is
``mpsim.load``, ``mpsim.simulate``, ``mpsim.compare``, ``mpsim.sweep`` and ``mpsim.plan``
(``mpsim/api/``, docs/api.md)::

    import mpsim
    result = mpsim.simulate("llama3-70b-32xh100", {"cluster.system": "dgx-a100"})

They are imported on first use, so ``import mpsim`` itself loads nothing else.
"""

import sys

__version__ = "0.1.0"

API = ("load", "simulate", "compare", "sweep", "plan")
__all__ = ["__version__", *API]


def __getattr__(name: str):
    """``mpsim.load`` and the other functions of the interface, imported when first asked for."""
    if name in API:
        from mpsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'mpsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])


class _Package(type(sys)):
    """The package's own module type, for one name it shares with a module.

    ``mpsim.simulate`` is the interface's function, and ``mpsim/simulate.py`` is the main
    path's module. Python sets a package's attribute to each submodule it imports, which
    would replace the function with the module the first time anything imported it; a
    property on the module's type takes precedence over that attribute, so the name stays
    the function. ``from mpsim.simulate import ...`` still finds the module by its full name.
    """

    @property
    def simulate(self):
        from mpsim.api import simulate

        return simulate

    @simulate.setter
    def simulate(self, value) -> None:
        # the import system stores the submodule here; it stays reachable as sys.modules["mpsim.simulate"]
        if not (isinstance(value, type(sys)) and value.__name__ == f"{__name__}.simulate"):
            raise AttributeError("mpsim.simulate is the interface's function and cannot be replaced")


sys.modules[__name__].__class__ = _Package
