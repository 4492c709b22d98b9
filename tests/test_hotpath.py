"""Which hot path runs (the C extension or pure Python), and how a user learns it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types

import pytest
from conftest import REPO

from emu import hotpath
from emu.cpu import binding

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


# ------------------------------------------------------------------ the Unicorn the harness runs on
def test_the_installed_unicorn_is_in_the_tested_range() -> None:
    low, high = binding.TESTED_UNICORN
    assert low <= binding.unicorn_version() < high


@pytest.mark.parametrize("version", [(2, 1, 3), (2, 2, 0), (3, 0, 0), (1, 0, 3)])
def test_an_untested_unicorn_is_refused_in_one_line(version: tuple[int, int, int]) -> None:
    with pytest.raises(binding.UnsupportedUnicorn) as refused:
        binding.check_unicorn(version, environ={})
    message = str(refused.value)
    assert "\n" not in message and f"Unicorn {'.'.join(map(str, version))} is not supported" in message
    assert "pip install 'unicorn>=2.1.4,<2.2.0'" in message
    binding.check_unicorn(version, environ={binding.ANY_UNICORN_VARIABLE: "1"})  # the way past it, said in the line


def test_the_command_line_says_so_and_exits_2() -> None:
    """A library the check refuses, faked in a fresh interpreter: one line, status 2, no traceback."""
    code = ("import sys, unicorn.unicorn_py3.unicorn as binding; binding.uc_version = lambda: (2, 2, 0x02020000); "
            "from emu.cli import main; sys.exit(main(['run', 'elf_samples/hello_static']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Unicorn 2.2.0 is not supported" in proc.stderr
