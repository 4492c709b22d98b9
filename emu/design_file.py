"""Loading users' designs from a Python file (`--design-file FILE.py`).

The file is ordinary Python that builds ``emu.designs.Design`` objects; every Design bound
at module level (or listed in a module-level ``DESIGNS`` sequence) is validated and
registered under its name, in the order the file defines them.
"""

from __future__ import annotations

import os
import runpy
import traceback
from collections.abc import Iterable

from emu.designs import BUILTIN, Design, DesignError, register, shape_problems


def _found(namespace: dict[str, object]) -> list[Design]:
    candidates: list[object] = list(namespace.values())
    listed = namespace.get("DESIGNS")
    if isinstance(listed, list | tuple):
        candidates += list(listed)
    unique: dict[int, Design] = {}
    for value in candidates:
        if isinstance(value, Design) and not any(value is b for b in BUILTIN):  # `base = DESIGNS[...]` is a reference
            unique.setdefault(id(value), value)
    return list(unique.values())


def _where(path: str, err: BaseException) -> str:
    """``path:line`` of the deepest frame of ``err`` inside the design file."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(path)]
    return f"{path}:{frames[-1].lineno}" if frames else path


def _label(design: Design) -> str:
    return repr(design.name) if isinstance(design.name, str) else "(unnamed)"


def load_design_file(path: str) -> list[Design]:
    """Run ``path``, then validate and register the designs it defines. DesignError (one line) if anything is wrong."""
    if not os.path.isfile(path):
        raise DesignError(f"--design-file {path}: no such file")
    try:
        namespace = runpy.run_path(path, run_name="uprobe_emu_design")
    except SyntaxError as err:
        raise DesignError(f"{path}:{err.lineno}: syntax error: {err.msg}") from None
    except SystemExit as err:  # the file's own sys.exit() must not end the tool (with its status) unnoticed
        raise DesignError(f"{_where(path, err)}: the design file called sys.exit({err.code!r})") from None
    except Exception as err:  # the user's code: report where it failed, in one line
        raise DesignError(f"{_where(path, err)}: {type(err).__name__}: {err}") from None
    designs = _found(namespace)
    if not designs:
        raise DesignError(f"{path}: defines no Design (build one with emu.designs.Design(...))")
    for design in designs:  # types and sizes before anything else looks at a field
        shape = shape_problems(design)
        if shape:
            raise DesignError(f"{path}: design {_label(design)}: " + "; ".join(shape))
    names = [d.name for d in designs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DesignError(f"{path}: two designs are named {', '.join(map(repr, duplicates))}")
    return [register(d, os.path.abspath(path)) for d in designs]


def load_design_files(paths: Iterable[str]) -> list[Design]:
    return [design for path in paths for design in load_design_file(path)]
