"""Which implementation of the hot path runs: the C extension ``emu._hotpath`` (built by ``pip install``
with the system compiler) or the pure-Python one beside each of its users.

The extension is used whenever it imports and was built for this interface. Setting
``UPROBE_EMU_PURE_PYTHON=1`` forces the Python implementation (CI runs the suite both ways, and
both must give the same verdicts). ``uprobe-emu --version`` says which one runs.

The extension calls Unicorn only through the public C API, by the addresses of the functions in the
library the ``unicorn`` package loaded (emu.cpu.native_function); it generates no machine code and
assumes nothing of the host CPU.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

ABI = 11  # the interface this Python side expects (HOTPATH_ABI in emu/hotpath_src/module.c)
FORCE_PYTHON_VARIABLE = "UPROBE_EMU_PURE_PYTHON"


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(FORCE_PYTHON_VARIABLE, "") not in ("", "0"):
        return None, f"{FORCE_PYTHON_VARIABLE} is set"
    try:
        _hotpath = importlib.import_module("emu._hotpath")
    except ImportError as err:
        return None, f"the C extension is not built ({err})"
    if getattr(_hotpath, "ABI", None) != ABI:
        return None, "the C extension was built for another version (reinstall the package)"
    return _hotpath, ""


native, why_python = _load()


def implementation() -> str:
    """One line for ``--version``: which hot path runs, and why Python if it is Python."""
    if native is not None:
        return "hot path: C extension (emu._hotpath)"
    return f"hot path: pure Python ({why_python})"

