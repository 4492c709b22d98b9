"""Which hot path runs (the C extension or pure Python), and how a user learns it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types

import pytest

from emu import hotpath

FORCED = os.environ.get(hotpath.FORCE_PYTHON_VARIABLE, "") not in ("", "0")


def _version(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "emu", "--version"], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True)
    return out.stdout.strip()


def test_the_extension_is_built_by_the_install() -> None:
    if FORCED:
        assert hotpath.native is None and "UPROBE_EMU_PURE_PYTHON" in hotpath.why_python
    else:
        assert hotpath.native is not None, hotpath.why_python
        assert hotpath.native.ABI == hotpath.ABI


def test_version_names_the_hot_path() -> None:
    assert _version({hotpath.FORCE_PYTHON_VARIABLE: "1"}).endswith(
        "(hot path: pure Python (UPROBE_EMU_PURE_PYTHON is set))")
    if not FORCED:
        assert _version({hotpath.FORCE_PYTHON_VARIABLE: "0"}).endswith("(hot path: C extension (emu._hotpath))")


def test_a_module_built_for_another_interface_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hotpath.FORCE_PYTHON_VARIABLE, raising=False)
    monkeypatch.setitem(sys.modules, "emu._hotpath", types.SimpleNamespace(ABI=hotpath.ABI + 1))
    try:
        reloaded = importlib.reload(hotpath)
        assert reloaded.native is None
        assert "built for another version" in reloaded.implementation()
    finally:
        monkeypatch.undo()
        importlib.reload(hotpath)
