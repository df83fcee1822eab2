"""Reading scenario files: YAML, references by name or path, ``--set`` overrides.

A scenario names its parts (``system: dgx-a100``, ``model: gpt3-175b``) or points at
files (``model: models/my_model.yaml``); the loader resolves each reference into the
tree, remembers which file every subtree came from, applies ``--set a.b=value``
overrides, and validates the whole tree with pydantic. Any problem becomes one
:class:`InputError` line naming the file and the field.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from mpsim.errors import InputError, did_you_mean
from mpsim.paths import KIND_DIRS, data_roots, display_path, normalize_name
from mpsim.specs.hf import from_hf_config, looks_like_hf
from mpsim.specs.profile_device import check_profile_device
from mpsim.specs.scenario import Scenario
from mpsim.specs.yamlio import parse_yaml, read_yaml

Path_ = tuple[str, ...]

# where a string stands for another file, and what kind of file it names
REFERENCE_FIELDS: dict[Path_, str] = {
    ("cluster", "system"): "system",
    ("cluster", "system", "accelerator"): "accelerator",
    ("cluster", "parts", "#", "system"): "system",  # "#": each item of the list (a heterogeneous cluster)
    ("cluster", "parts", "#", "system", "accelerator"): "accelerator",
    ("model",): "model",
    ("calibration",): "calibration",
}


@dataclass
class Origins:
    """Which file (or ``--set``) each subtree of the config came from."""

    sources: dict[Path_, str] = field(default_factory=dict)
    # subtrees written inside another file's tree (the fields beside ``base:``): where that
    # file's own root is, so a field is named by its path in that file
    roots: dict[Path_, Path_] = field(default_factory=dict)

    def file_for(self, path: Path_) -> tuple[str, Path_]:
        """The source of ``path`` and the path relative to that source."""
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.sources:
                root = self.roots.get(path[:cut], path[:cut])
                return self.sources[path[:cut]], path[len(root):]
        return "", path

    def locate(self, error: InputError) -> InputError:
        """Fill in the file of an error that names only a dotted field of the scenario."""
        if error.file or not error.field:
            return error
        path = tuple(error.field.split("."))
        source, rest = self.file_for(path)
        named = source is not None and source.startswith("--set ")  # the --set already names the field
        return InputError(error.message, source or None, ".".join(rest) or (None if named else error.field))


@dataclass
class LoadedScenario:
    """A validated scenario and where its parts came from."""

    scenario: Scenario
    origins: Origins
    path: Path | None = None


def _index(kind: str) -> dict[str, Path]:
    """Every file of a kind in the data roots, by normalized stem and by its ``name``."""
    files: list[tuple[Path, int]] = []
    for root in data_roots():
        folder = root / KIND_DIRS[kind]
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                try:
                    files.append((path, path.stat().st_mtime_ns))
                except OSError:
                    continue
    return dict(_index_of(tuple(files)))


@lru_cache(maxsize=64)
def _index_of(files: tuple[tuple[Path, int], ...]) -> tuple[tuple[str, Path], ...]:
    """The index of these files as they were at these modification times: each file is parsed
    once (finding a reference would otherwise read every file of its kind)."""
    found: dict[str, Path] = {}
    for path, _ in files:
        found.setdefault(normalize_name(path.stem), path)
        try:
            data = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, OSError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            found.setdefault(normalize_name(data["name"]), path)
    return tuple(found.items())


def available(kind: str) -> list[str]:
    """Names a reference of ``kind`` may use."""
    return sorted({normalize_name(p.stem) for p in _index(kind).values()})


def find_reference(ref: str, kind: str, relative_to: Path | None) -> Path:
    """Resolve a name or path to a file; unknown names list the known ones."""
    ref = ref.removeprefix("hf:")
    looks_like_path = ref.endswith((".yaml", ".yml", ".json")) or "/" in ref
    if looks_like_path:
        candidates = [Path(ref)]
        if relative_to is not None:
            candidates.insert(0, relative_to / ref)
        candidates += [root / ref for root in data_roots()]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        raise InputError(f"{kind} file {ref!r} not found")
    index = _index(kind)
    key = normalize_name(ref)
    if key in index:
        return index[key]
    hint = did_you_mean(key, list(index)) or f"known: {', '.join(available(kind))}"
    raise InputError(f"unknown {kind} {ref!r}; {hint}")


def _get(tree: Any, path: Path_) -> Any:
    for key in path:
        if isinstance(tree, list) and key.isdigit() and int(key) < len(tree):
            tree = tree[int(key)]
            continue
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _merge(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` laid over it, nested mappings merged key by key."""
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def _resolve_at(tree: dict, path: Path_, origins: Origins, base_dirs: dict[Path_, Path]) -> None:
    """Replace a reference at ``path`` by the file it names (in place).

    A reference is a name or path, or a mapping with ``base: NAME`` and fields that
    override the named file's (``model: {base: llama3-405b, seq_length: 131072}``).
    """
    parent = _get(tree, path[:-1]) if len(path) > 1 else tree
    if not isinstance(parent, dict):
        return
    value = parent.get(path[-1])
    changes: dict = {}
    if isinstance(value, dict) and isinstance(value.get("base"), str):
        changes = {k: v for k, v in value.items() if k != "base"}
        value = value["base"]
    if not isinstance(value, str):
        return
    kind = REFERENCE_FIELDS[tuple("#" if key.isdigit() else key for key in path)]
    source, rel = origins.file_for(path)
    source_root = path[:len(path) - len(rel)]
    base = None
    for cut in range(len(path), -1, -1):
        if path[:cut] in base_dirs:
            base = base_dirs[path[:cut]]
            break
    try:
        file = find_reference(value, kind, base)
    except InputError as exc:
        raise InputError(exc.message, source or None, ".".join(rel) or None) from None
    data = read_yaml(file)
    if not isinstance(data, dict):
        raise InputError(f"a {kind} file must be a mapping of fields, got {type(data).__name__}",
                         display_path(file))
    if kind == "model" and looks_like_hf(data):
        name = str(data.get("_name_or_path") or file.parent.name or file.stem).split("/")[-1]
        data = from_hf_config(data, name, display_path(file))
    parent[path[-1]] = _merge(data, changes)
    origins.sources[path] = display_path(file)
    for key in changes:  # fields set beside ``base`` belong to the referencing file
        origins.sources[(*path, key)] = source
        origins.roots[(*path, key)] = source_root
    base_dirs[path] = file.parent


def resolve_references(tree: dict, origins: Origins, base_dirs: dict[Path_, Path]) -> None:
    """Resolve every string reference in the tree, outermost first."""
    for path in sorted(REFERENCE_FIELDS, key=len):
        if "#" not in path:
            _resolve_at(tree, path, origins, base_dirs)
            continue
        at = path.index("#")
        items = _get(tree, path[:at])
        for index in range(len(items) if isinstance(items, list) else 0):
            _resolve_at(tree, (*path[:at], str(index), *path[at + 1:]), origins, base_dirs)


def override_label(text: str, width: int = 80) -> str:
    """How a ``--set`` is named in a message; a very long one is cut, so the message stays one line."""
    return f"--set {text if len(text) <= width else text[:width] + '...'}"


def parse_override(text: str) -> tuple[Path_, Any]:
    """``a.b=value`` -> (('a', 'b'), value parsed as YAML)."""
    label = override_label(text)
    if "=" not in text:
        raise InputError("expected FIELD=VALUE, e.g. parallel.tp=4", label)
    key, raw = text.split("=", 1)
    path = tuple(part for part in key.strip().split(".") if part)
    if not path:
        raise InputError("empty field name", label)
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.constructor.ConstructorError as exc:
        raise InputError(exc.problem or "malformed value", label) from None
    except yaml.YAMLError:
        value = raw
    return path, value


def _list_index(items: list, key: str, here: Path_, label: str) -> int:
    """The item of a list that a ``--set`` path names by its number (``cluster.parts.1.nodes``)."""
    if not key.isdigit() or int(key) >= len(items):
        raise InputError(f"{'.'.join(here[:-1])} is a list of {len(items)} item(s): give an item's number from 0 "
                         f"to {len(items) - 1}, not {key!r}", label)
    return int(key)


def apply_override(tree: dict, path: Path_, value: Any, origins: Origins, base_dirs: dict[Path_, Path],
                   label: str) -> None:
    """Set ``path`` in the tree to ``value``, resolving references on the way down; a number
    in the path is an item of a list (``cluster.parts.0.nodes=16``)."""
    node: Any = tree
    for depth, key in enumerate(path[:-1]):
        here = path[: depth + 1]
        if isinstance(node, list):
            child = node[_list_index(node, key, here, label)]
        else:
            if tuple("#" if k.isdigit() else k for k in here) in REFERENCE_FIELDS and isinstance(node.get(key), str):
                _resolve_at(tree, here, origins, base_dirs)
            child = node.get(key)
            if child is None:
                child = node[key] = {}
        if not isinstance(child, (dict, list)):
            raise InputError(f"{'.'.join(here)} is a value, not a group of fields", label)
        node = child
    if isinstance(node, list):
        node[_list_index(node, path[-1], path, label)] = value
    else:
        node[path[-1]] = value
    origins.sources[path] = label


def _known_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names at ``loc``; where a field is one of several models (a transformer or a layer stack),
    the fields of every model that can be there."""
    current: list[Any] = [model]
    for key in loc:
        following = []
        for owner in current:
            info = owner.model_fields.get(str(key))
            if info is None:
                continue
            annotation = info.annotation
            following += [c for c in (annotation, *getattr(annotation, "__args__", ()))
                          if isinstance(c, type) and issubclass(c, BaseModel)]
        if not following:
            return []
        current = following
    return list(dict.fromkeys(name for owner in current for name in owner.model_fields))


def validation_error(exc: ValidationError, origins: Origins, root: type[BaseModel] = Scenario) -> InputError:
    """One line from pydantic's error list: the first problem, its file and field."""
    # an unknown key first: a misspelt or look-alike key is usually why a required one is missing
    errors = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
    first = errors[0]
    loc = tuple(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        message = "required field is missing"
    elif first["type"] == "extra_forbidden":
        key, known = loc[-1], _known_fields(root, loc[:-1])
        # a look-alike letter (Cyrillic a for Latin a) is matched as a wildcard
        close = difflib.get_close_matches("".join(ch if ch.isascii() else "." for ch in key), known, n=1)
        foreign = next((ch for ch in key if not ch.isascii()), None)
        message = "unknown field" + (f": it contains the non-ASCII character '{foreign}' (U+{ord(foreign):04X})"
                                     if foreign else "")
        if close:
            message += f"; did you mean '{close[0]}'?"
        elif known and not foreign:
            message += f"; known fields: {', '.join(known)}"
    elif "input" in first and first["type"] not in ("value_error", "assertion_error"):
        shown = repr(first["input"])
        message = f"{message} (got {shown if len(shown) <= 60 else shown[:60] + '...'})"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    source, rest = origins.file_for(loc)
    # a file's own check that failed on a value a --set put into it: name the --set too
    changed = sorted({src for key, src in origins.sources.items()
                      if key[:len(loc)] == loc and len(key) > len(loc) and src.startswith("--set ")})
    if source and not source.startswith("--set ") and changed:
        message += f" (with {', '.join(changed)})"
    return InputError(message, source or None, _field_text(loc, rest) or None)


def _field_text(loc: Path_, rest: Path_) -> str:
    """``rest`` (the end of ``loc``) as a dotted field path, list items by their index as in
    ``--set`` paths; one that starts inside a list names the list first (``slow_gpu.0.rank``,
    not ``0.rank``)."""
    parts = list(rest)
    if parts and parts[0].isdigit() and len(loc) > len(rest):
        parts.insert(0, loc[len(loc) - len(rest) - 1])
    return ".".join(parts)


def read_scenario_file(path: str | Path) -> tuple[Path, dict]:
    """Find a scenario (a path or the name of a shipped one) and read its tree."""
    file = Path(path)
    if not file.is_file():
        try:
            file = find_reference(str(path), "scenario", None)
        except InputError:
            from mpsim.specs.shipped import scenario_suggestion

            hint = scenario_suggestion(str(path))
            raise InputError("scenario file not found" + (f"; {hint}" if hint else ""), str(path)) from None
    tree = read_yaml(file)
    if not isinstance(tree, dict):
        raise InputError("a scenario file must be a mapping of fields (name, cluster, model, parallel)",
                         display_path(file))
    return file, tree


def scenario_from_tree(tree: dict, file: Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    """Apply ``--set`` overrides to a scenario tree read from ``file``, resolve references, validate."""
    origins = Origins({(): display_path(file)})
    base_dirs: dict[Path_, Path] = {(): file.parent}
    parsed = [(parse_override(text), override_label(text)) for text in overrides]
    for (opath, value), olabel in parsed:
        apply_override(tree, opath, value, origins, base_dirs, olabel)
    # where ``calibration:`` was written (the scenario file or a --set), before the
    # reference is replaced by the profile file's own tree
    calibration_source = origins.file_for(("calibration",))
    resolve_references(tree, origins, base_dirs)
    try:
        scenario = Scenario.model_validate(tree)
    except ValidationError as exc:
        raise validation_error(exc, origins) from None
    check_profile_device(scenario, calibration_source, origins.sources.get(("calibration",), ""),
                         origins.file_for, matching_accelerator_files)
    return LoadedScenario(scenario, origins, file)


# A scenario file may carry the axes ``mpsim sweep`` runs it over (docs/explore.md); every
# other command simulates the scenario itself and leaves the block alone.
SWEEP_KEY = "sweep"


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    """Load, resolve, override and validate a scenario file (without its ``sweep:`` block)."""
    file, tree = read_scenario_file(path)
    tree = {key: value for key, value in tree.items() if key != SWEEP_KEY}
    return scenario_from_tree(tree, file, overrides)


def matching_accelerator_files(kind: str, name: str) -> list[str]:
    """Accelerator files (shipped and on $MPSIM_PATH) that describe a ``kind`` device named ``name``."""
    from mpsim.specs.accelerator import AcceleratorSpec

    found = []
    for path in sorted(set(_index("accelerator").values())):
        try:
            accelerator = AcceleratorSpec.model_validate(read_yaml(path))
        except (InputError, ValidationError, TypeError):
            continue  # a broken file is reported when a scenario names it
        if accelerator.matches_device(kind, name):
            found.append(display_path(path))
    return found
