"""Every import in mpsim points down the chain of layers that docs/architecture.md draws.

Each module of ``mpsim/`` belongs to one layer (its top-level package or module); a layer
may import only the layers below it, and no two packages or modules may import each
other. Imports are read with ``ast``, so an import inside a function counts the same as
one at the top of a file: a lazy import is still a dependency, only a later one.

``LAYERS`` is the one list of layers, bottom first; docs/architecture.md's table of
layers must show the same order, and the test below checks that it does.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mpsim"

# Bottom first. Names on one line form one layer: they may import each other (but not
# in a cycle). Everything a layer imports must be on its own line or above it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "units", "paths", "jit"),  # the input-error type, units, where data files live, compiled loops
    ("schedules",),  # schedules as data: plain numbers in, action lists out
    ("specs",),  # typed input: hardware, model, plan, scenario, calibration profile; the layout rules
    ("workload",),  # a model as ops per rank and stage, with memory
    ("cost",),  # seconds of ops, collectives, actions and step parts; a calibration profile applied
    ("engine",),  # the SimPy engine and the longest-path evaluator: action lists with durations -> timeline
    ("balance",),  # layers_per_stage: auto, priced with the cost model
    ("resolve",),  # the main path's layout step: specs' rules, then balancing
    ("simulate",),  # the main path: scenario -> timeline
    ("results",),  # metrics, reports, traces and plots of a simulation
    ("reliability",),  # step-time distributions from op-time variation; failures, checkpoints and goodput
    ("traces",),  # PyTorch profiler (Kineto) traces of real GPU runs: kernels, shapes, collectives, summaries
    ("torchio",),  # PyTorch modules on the meta device as layer stacks (optional)
    ("explore",),  # sweeps and the layout planner
    ("calibrate",),  # measuring a real device with PyTorch, fitting a profile, checking predictions
    ("api",),  # the Python interface: load, simulate, compare, sweep, plan
    ("mpsim",),  # the package itself: the version, and the interface's names imported on first use
    ("cli",),  # the command line
    ("__main__",),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


@dataclass(frozen=True)
class Import:
    """One ``import`` of an mpsim module by another."""

    file: str  # repository path of the importing file
    line: int
    source: str  # dotted name of the importing module
    target: str  # dotted name of the imported module


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    """``mpsim.cost.actions`` -> ``cost``; ``mpsim`` (the package's own ``__init__``) -> ``mpsim``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports_of(module: str, path: Path, modules: dict[str, Path], code: str | None = None) -> list[Import]:
    """Every mpsim module the file at ``path`` (or ``code``, as if it were there) imports, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if code is None else code, str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from mpsim.pkg import submodule` depends on the submodule itself
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            if target == "mpsim" or target.startswith("mpsim."):
                while target not in modules and "." in target:  # `import mpsim.cost.actions.x` style names
                    target = target.rpartition(".")[0]
                if target != module:
                    found.append(Import(str(path.relative_to(ROOT)), node.lineno, module, target))
    return found


def every_import() -> list[Import]:
    modules = all_modules()
    return [found for module, path in modules.items() for found in imports_of(module, path, modules)]


def test_every_module_belongs_to_a_layer():
    unknown = sorted({layer_of(module) for module in all_modules()} - set(RANK))
    assert not unknown, f"add {unknown} to LAYERS in tests/test_layers.py and to docs/architecture.md"


def test_every_import_points_down():
    upward = [f"{i.file}:{i.line}: {layer_of(i.source)} imports {i.target} ({layer_of(i.target)}, a higher layer)"
              for i in every_import() if RANK[layer_of(i.target)] > RANK[layer_of(i.source)]]
    assert not upward, "\n".join(upward)


def test_no_two_packages_import_each_other():
    edges: dict[tuple[str, str], Import] = {}
    for i in every_import():
        pair = (layer_of(i.source), layer_of(i.target))
        if pair[0] != pair[1]:
            edges.setdefault(pair, i)
    both = [f"{a} <-> {b}: {edges[(a, b)].file}:{edges[(a, b)].line} and {edges[(b, a)].file}:{edges[(b, a)].line}"
            for a, b in sorted(edges) if a < b and (b, a) in edges]
    assert not both, "\n".join(both)


def test_no_module_imports_itself_through_others():
    graph: dict[str, dict[str, Import]] = {}
    for i in every_import():
        graph.setdefault(i.source, {}).setdefault(i.target, i)
    cycles = []
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target, found in sorted(graph.get(module, {}).items()):
            if state.get(target) == "open":
                loop = path[path.index(target):] + [target] if target in path else [module, target]
                cycles.append(" -> ".join(loop) + f" (last at {found.file}:{found.line})")
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def documented_layers() -> list[str]:
    """The layer column of docs/architecture.md's table, top to bottom as written."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    names = []
    for row in table.splitlines():
        cell = row.split("|")[1].strip() if row.startswith("|") else ""
        names += re.findall(r"`mpsim/([A-Za-z_]+)(?:/|\.py)`", cell)
    return names


def test_the_architecture_document_lists_the_layers_in_the_same_order():
    expected = [name for names in LAYERS for name in names if name not in ("mpsim", "__main__")]
    assert documented_layers() == expected


@pytest.mark.parametrize("source,target", [("specs", "balance"), ("cost", "calibrate"), ("schedules", "engine")])
def test_a_lazy_upward_import_is_seen(source, target):
    # an import inside a function is the kind that slipped in before
    code = f"def price():\n    from mpsim.{target} import something\n"
    modules = {**all_modules(), f"mpsim.{source}.probe": PACKAGE / source / "probe.py"}
    found = imports_of(f"mpsim.{source}.probe", PACKAGE / source / "probe.py", modules, code)
    assert [i.target for i in found] == [f"mpsim.{target}"] and RANK[target] > RANK[source]
