"""emu_start can return with nothing to report; the guest must simply go on (only a hlt is #GP)."""

from __future__ import annotations

import gc
from pathlib import Path

from emu.abi import Prot
from emu.cpu import Cpu
from emu.cpu.engine import _Engines
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions

HELLO = str(Path(__file__).resolve().parent.parent / "elf_samples" / "hello_static")


def test_a_stop_with_no_reason_does_not_kill_the_guest() -> None:
    m = Machine(HELLO, [HELLO], {}, RunOptions(), GuestIO.captured())
    stops: list[int] = []

    def stop_once(addr: int, _size: int) -> None:
        if not stops:
            stops.append(addr)
            m.cpu.stop()  # as a stale stop request would: no syscall, no fault, no limit

    m.cpu.hooks.add_code(stop_once, m.exe.entry, m.exe.entry)
    result = m.run()
    assert stops and result.exit_status == 0 and bytes(m.io.out).startswith(b"hello")
    assert m.spurious_stops == 1


def test_an_engine_collected_during_emulation_is_closed_after_it() -> None:
    outer = Cpu()
    outer.mem_map(0x1000, 0x1000, Prot.READ | Prot.WRITE | Prot.EXEC)
    outer.mem_write(0x1000, b"\x90\xf4")  # nop; hlt
    seen = []

    def drop_another(_addr: int, _size: int) -> None:
        Cpu()  # created and collected inside a hook of the running engine
        gc.collect()
        seen.append(len(_Engines.buried))

    outer.hooks.add_code(drop_another, 0x1000, 0x1000)
    outer.run(0x1000)
    assert len(seen) == 1 and seen[0] >= 1 and _Engines.buried == []  # buried while outer ran, closed after
