"""The library of shipped input files: every scenario, model, system and accelerator a
name on the command line can refer to, with the one line that says what it is.

The files live in the data roots of :func:`mpsim.paths.data_roots` (``$MPSIM_PATH``, the
checkout, or ``mpsim/_data`` inside an installed wheel), in the folders below. The
``name`` and ``description`` fields of each file are read as they are, without
validating the rest of the file, so that listing the library stays fast and a broken
file still shows up under its own path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from mpsim.paths import KIND_DIRS, data_roots, display_path, normalize_name

# what ``mpsim list`` calls a kind -> the folders (under a data root) holding its files; the
# scenarios of published runs sit in their own folder beside the examples
LIST_FOLDERS: dict[str, tuple[str, ...]] = {
    "scenarios": (KIND_DIRS["scenario"], KIND_DIRS["scenario"] + "/published"),
    "models": (KIND_DIRS["model"],),
    "systems": (KIND_DIRS["system"],),
    "accelerators": (KIND_DIRS["accelerator"],),
}


@dataclass(frozen=True)
class ShippedFile:
    """One file of the library: the name it goes by, where it is, what it describes."""

    name: str
    path: Path
    description: str

    @property
    def file(self) -> str:
        """The path as a user types it (relative to the working directory or a data root)."""
        return display_path(self.path)


def _fields(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def shipped_files(kind: str) -> list[ShippedFile]:
    """The files of ``kind`` (a key of :data:`LIST_FOLDERS`), folder by folder, sorted by path
    within each; a file that an earlier data root already holds (same folder and name) is
    left out, as the loader would never reach it."""
    seen: set[str] = set()
    found: list[tuple[int, ShippedFile]] = []
    for root in data_roots():
        for order, folder in enumerate(LIST_FOLDERS[kind]):
            directory = root / folder
            if not directory.is_dir():
                continue
            for path in sorted(directory.glob("*.yaml")):
                key = f"{folder}/{normalize_name(path.stem)}"
                if key in seen:
                    continue
                seen.add(key)
                data = _fields(path)
                name = data.get("name") if isinstance(data.get("name"), str) else path.stem
                description = data.get("description")
                text = " ".join(description.split()) if isinstance(description, str) else ""
                if kind == "scenarios":
                    # a scenario is run by its file's name; its own name is a title, put before its description
                    title, name = name, normalize_name(path.stem)
                    text = f"{title}: {text}" if text else title
                found.append((order, ShippedFile(name=name, path=path, description=text)))
    return [item for _, item in sorted(found, key=lambda pair: (pair[0], pair[1].file))]


def scenario_suggestion(text: str) -> str:
    """``"did you mean FILE, ...?"`` for a scenario path or name that names no file: the
    shipped scenarios and the YAML files beside the given path whose names are closest."""
    from mpsim.errors import closest_names

    by_stem: dict[str, str] = {}
    folder = Path(text).parent
    beside = sorted(folder.glob("*.yaml")) if str(folder) not in ("", ".") and folder.is_dir() else []
    for path in beside + [item.path for item in shipped_files("scenarios")]:
        by_stem.setdefault(normalize_name(path.stem), display_path(path))
    close = closest_names(normalize_name(Path(text).stem), list(by_stem))
    return f"did you mean {', '.join(by_stem[stem] for stem in close)}?" if close else ""
