"""`check` gives the same JSON verdicts with the C hot path and with the pure-Python one, each in its
own process as a user would run them (UPROBE_EMU_PURE_PYTHON=1 or not)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
REDZONE = str(SAMPLES / "redzone_probe")
SLOT = "lea -128(%rsp),%rsp; {}; push %rcx; push %r11; push %rax; mov $336,%eax; syscall"
# jmp-slots variants whose hits each break one thing: the frame above rsp, a flag, the red zone.
FLAWED = {"frame_store": ("movq $0, 8(%rsp); " + SLOT.format("nop")),
          "id_toggle": SLOT.format("pushf; xorl $0x200000,(%rsp); popf"),
          "redzone_store": SLOT.format("movq $7, 120(%rsp)")}
DESIGNS = "int3,linux-6.18," + ",".join(name.replace("_", "-") for name in FLAWED)
C_BUILT = importlib.util.find_spec("emu._hotpath") is not None


def _design_file(tmp_path: Path) -> Path:
    path = tmp_path / "flawed.py"
    lines = ["from dataclasses import replace", "from emu.designs import DESIGNS, Trampoline"]
    lines += [f"{name} = replace(DESIGNS['jmp-slots'], name={name.replace('_', '-')!r}, "
              f"trampoline=Trampoline({code!r}, layout='slots', slot_size=64))" for name, code in FLAWED.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _check(tmp_path: Path, design_file: Path, pure_python: bool) -> tuple[dict[str, Any], str]:
    """The JSON `check --details` writes, and the hot path `--version` names, in a fresh process."""
    env = os.environ | {"UPROBE_EMU_PURE_PYTHON": "1" if pure_python else "0"}  # one length: the guest sees it too
    out = tmp_path / f"check-{pure_python}.json"
    command = [sys.executable, "-m", "emu", "check", "--design-file", str(design_file), "--kernel", DESIGNS,
               "--details", "--json", str(out), REDZONE, "8"]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)
    version = subprocess.run([sys.executable, "-m", "emu", "--version"], env=env, check=True, capture_output=True,
                             text=True, timeout=60).stdout
    return json.loads(out.read_text()), version


@pytest.mark.skipif(not C_BUILT, reason="the C extension is not built here: there is only one implementation")
def test_check_verdicts_are_the_same_with_the_c_hot_path_and_without(tmp_path: Path) -> None:
    design_file = _design_file(tmp_path)
    native, native_version = _check(tmp_path, design_file, pure_python=False)
    python, python_version = _check(tmp_path, design_file, pure_python=True)
    assert "C extension" in native_version and "pure Python" in python_version  # two implementations ran
    designs = native["designs"]
    found = {kind for d in designs.values() for kind, count in d["violations"].items() if count}
    assert found == {"redzone", "regs", "memory"}  # the comparison covers each kind of verdict
    assert designs["frame-store"]["violations"]["memory"] and designs["id-toggle"]["violations"]["regs"]
    assert native == python
