"""Debian's python3.11 USDT probes (semaphore-gated): emulated hit counts equal the real kernel's.

The native side attaches through perf_event_open on this machine's uprobe PMU with
ref_ctr_offset, so it needs root and the PMU; without them it is skipped, never failed.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from conftest import attach_exe, link_file_offset
from elftools.elf.elffile import ELFFile

from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.native import NativeProbe, run_native
from emu.native import available as native_available
from emu.probes import usdt_notes

PYTHON = "/usr/bin/python3.11"
PROBES = ("gc__start", "function__entry", "function__return", "line")
SCRIPT = "def f(n):\n    return n + 1\nimport gc\nt = 0\nfor i in range(20):\n    t = f(t)\ngc.collect()\nprint(t)\n"


pytestmark = [
    pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"{PYTHON} absent"),
    pytest.mark.slow,
]


def _emulated(script: Path) -> tuple[bytes, dict[str, int], list[int]]:
    io_ = GuestIO.captured()
    m = Machine(PYTHON, [PYTHON, str(script)], {}, RunOptions(), io_)
    atts = {name: attach_exe(m, f"usdt:python:{name}") for name in PROBES}
    semaphores = [a.resolved.semaphore for a in atts.values()]
    result = m.run()
    assert result.exit_status == 0
    after = [int.from_bytes(m.mem.read(s, 2), "little") for s in semaphores if s is not None]
    return bytes(io_.out), {name: a.consumer.hits for name, a in atts.items()}, after


def test_semaphores_are_raised_while_attached(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    out, counts, semaphores = _emulated(script)
    assert out == b"20\n"
    assert semaphores == [1, 1, 1, 1]
    assert counts["gc__start"] >= 1 and counts["line"] > counts["function__entry"] > 0


@pytest.mark.skipif(not native_available(), reason="needs root and the uprobe PMU")
def test_counts_equal_the_real_kernel(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    data = Path(PYTHON).read_bytes()
    elf = ELFFile(io.BytesIO(data))
    notes = {n.name: n for n in usdt_notes(elf) if n.provider == "python"}
    native = run_native(
        [PYTHON, str(script)],
        [NativeProbe(PYTHON, link_file_offset(PYTHON, notes[n].pc), False, link_file_offset(PYTHON, notes[n].semaphore))
         for n in PROBES],
        env={},
    )
    out, counts, _ = _emulated(script)
    assert (native.stdout, native.returncode) == (out, 0)
    assert counts == dict(zip(PROBES, native.counts, strict=True))
