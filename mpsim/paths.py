"""Where mpsim looks for hardware, model and scenario files referenced by name."""

from __future__ import annotations

import os
from pathlib import Path

from mpsim.errors import InputError

PACKAGE_DIR = Path(__file__).resolve().parent

# kind of reference -> folder under a data root
KIND_DIRS = {
    "accelerator": "hardware/accelerators",
    "system": "hardware/systems",
    "model": "scenarios/models",
    "scenario": "scenarios",
    "calibration": "hardware/calibration",
}


def data_roots() -> list[Path]:
    """Folders holding ``hardware/`` and ``scenarios/``: $MPSIM_PATH, the checkout, the installed copy."""
    roots: list[Path] = []
    for entry in os.environ.get("MPSIM_PATH", "").split(os.pathsep):
        if entry:
            roots.append(Path(entry))
    for candidate in (PACKAGE_DIR.parent, PACKAGE_DIR / "_data"):
        if (candidate / "hardware").is_dir() and candidate not in roots:
            roots.append(candidate)
    return roots


def display_path(path: Path) -> str:
    """A path as the user should read it: relative to the working directory or a data root."""
    path = path.resolve()
    try:
        bases = [Path.cwd()]
    except FileNotFoundError:  # the working folder was removed under us: name the file another way
        bases = []
    for base in [*bases, *data_roots()]:
        try:
            return str(path.relative_to(base.resolve()))
        except ValueError:
            continue
    return str(path)


def normalize_name(name: str) -> str:
    """Names compare without case, and '-', '_', ' ' are the same."""
    return name.lower().replace("_", "-").replace(" ", "-")


def read_text(path: Path) -> str:
    """A file's text; a missing, unreadable or non-UTF-8 file is an :class:`InputError` naming it."""
    label = display_path(path)
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise InputError("file not found", label) from None
    except IsADirectoryError:
        raise InputError("is a folder, not a file", label) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", label) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                         "save the file as UTF-8", label) from None


def picture_formats() -> list[str]:
    """File extensions matplotlib can write."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_writable(value: str, field: str, picture: bool = False) -> None:
    """Refuse, before any work, a file that could not be written: an empty name, a folder, a
    missing or unwritable folder, or (for a picture) a format matplotlib cannot draw. The
    command line checks its output options with it, the Python interface its writers."""
    if not value.strip():
        raise InputError("an empty file name", field=field)
    path = Path(value)
    if path.is_dir() or value.endswith(os.sep):
        raise InputError(f"{value} is a folder; give a file name inside it", field=field)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"folder {folder} does not exist; create it or write elsewhere", field=field)
    if not os.access(folder, os.W_OK):
        raise InputError(f"folder {folder} is not writable", field=field)
    if picture:
        suffix = path.suffix.lower().lstrip(".")
        formats = picture_formats()
        if suffix not in formats:
            raise InputError(f"cannot draw a {'.' + suffix if suffix else 'file without an extension'}; "
                             f"use one of {', '.join('.' + f for f in formats)}", field=field)
