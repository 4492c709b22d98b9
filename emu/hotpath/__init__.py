"""Which implementation of the hot path runs: the C extension ``emu._hotpath`` (built by ``pip install``
with the system compiler) or the pure-Python one beside each of its users.

The extension is used whenever it imports and was built for this interface. Setting
``UPROBE_EMU_PURE_PYTHON=1`` forces the Python implementation (CI runs the suite both ways, and
both must give the same verdicts). ``uprobe-emu --version`` says which one runs.

The extension calls Unicorn only through the public C API, by the addresses of the functions in the
library the ``unicorn`` package loaded (emu.cpu.native_function); it generates no machine code and
assumes nothing of the host CPU.

It is also where the structs and enum values C and Python share are declared: it exports them
(LAYOUTS, ENUMS) and the Python side reads them from here (struct_layout, constant), whichever hot
path runs.
"""

from __future__ import annotations

import ctypes
import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")

ABI = 14  # the interface this Python side expects (HOTPATH_ABI in emu/hotpath_src/module.c)
FORCE_PYTHON_VARIABLE = "UPROBE_EMU_PURE_PYTHON"


def _built() -> tuple[ModuleType | None, str]:
    """The extension if it is built for this interface (whether or not it runs), else why not."""
    try:
        module = importlib.import_module("emu._hotpath")
    except ImportError as err:
        return None, f"the C extension is not built ({err})"
    if getattr(module, "ABI", None) != ABI:
        return None, "the C extension was built for another version (reinstall the package)"
    return module, ""


_BUILT, _NOT_BUILT = _built()
if os.environ.get(FORCE_PYTHON_VARIABLE, "") not in ("", "0"):
    native, why_python = None, f"{FORCE_PYTHON_VARIABLE} is set"
else:
    native, why_python = _BUILT, _NOT_BUILT
LAYOUTS: dict[str, dict[str, int]] = dict(getattr(_BUILT, "LAYOUTS", {}))
ENUMS: dict[str, int] = dict(getattr(_BUILT, "ENUMS", {}))


class LayoutError(ImportError):
    """Python names a field the extension's struct does not have: the extension is of another source."""


def struct_layout(struct: str, fields: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The byte offset of each field of a struct C and Python share, and its size ("sizeof"): as the
    extension exports them (offsetof: the C struct is their one declaration) whenever it is built, so
    that a buffer Python lays out is one its C hooks can read even where Python runs the hot path; or,
    with no extension, ``fields`` (name, bytes) one after the other, for Python alone."""
    exported = LAYOUTS.get(struct)
    if exported is not None:
        missing = [name for name, _size in fields if name not in exported]
        if missing:
            raise LayoutError(f"struct {struct} of the C extension has no {', '.join(missing)}: reinstall the package")
        return dict(exported)
    offsets, at = {}, 0
    for name, size in fields:
        offsets[name] = at
        at += size
    offsets["sizeof"] = at
    return offsets


def check_ctypes_layout(struct: str, mirror: type[ctypes.Structure], renamed: dict[str, str] | None = None) -> None:
    """A struct Python declares with ctypes (its fields typed) lies as the extension's, field by field
    (``renamed``: a C name for a ctypes field whose name differs); LayoutError if not."""
    exported = LAYOUTS.get(struct)
    if exported is None:
        return
    c_name = {name: (renamed or {}).get(name, name) for name, *_ in mirror._fields_}
    wrong = [name for name, c in c_name.items() if c in exported and getattr(mirror, name).offset != exported[c]]
    if wrong or ctypes.sizeof(mirror) != exported["sizeof"]:
        raise LayoutError(f"struct {struct} of the C extension is not laid out as {mirror.__name__} "
                          f"({', '.join(wrong) or 'its size'}): reinstall the package")


def constant(name: str, default: int) -> int:
    """The value of the C enum constant ``name``, as the extension exports it whenever it is built (the
    enum is its one declaration); ``default``, Python's own value, without the extension."""
    if _BUILT is None:
        return default
    if name not in ENUMS:
        raise LayoutError(f"the C extension exports no constant {name}: reinstall the package")
    return ENUMS[name]


def in_c_order(values: dict[T, str]) -> tuple[T, ...]:
    """The keys of ``values`` (each mapped to a C enum constant's name) ordered by the constants' values,
    which must be 0, 1, 2 ...: a tuple a C index picks from. Without the extension, the dict's order."""
    index = {key: constant(name, i) for i, (key, name) in enumerate(values.items())}
    if sorted(index.values()) != list(range(len(index))):
        raise LayoutError(f"C constants {', '.join(values.values())} are not 0..{len(values) - 1}")
    return tuple(sorted(index, key=index.__getitem__))


def words(layout: dict[str, int], names: str) -> tuple[int, ...]:
    """The word index of each of the space-separated ``names`` in ``layout``."""
    return tuple(layout[name] // 8 for name in names.split())


def implementation() -> str:
    """One line for ``--version``: which hot path runs, and why Python if it is Python."""
    if native is not None:
        return "hot path: C extension (emu._hotpath)"
    return f"hot path: pure Python ({why_python})"

