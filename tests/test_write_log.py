"""The red-zone write log: the machine-code hook and its Python stand-in record the same stores."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import machine_code_refused

from emu.abi import Prot
from emu.cpu import Cpu, Reg
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession
from emu.verify.write_log import WriteLog, classify, entries

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
CODE, DATA = 0x10000, 0x80000
# mov %rax,0x80108; mov %rax,0x80200; movb $0x7f,0x80101; hlt
STORES = bytes.fromhex("48890425" "08010800" "48890425" "00020800" "c6042501010800" "7f" "f4")




def _stores_on_a_cpu(log: WriteLog) -> tuple[list[tuple[int, int, int, int, int]], bytes, bool]:
    cpu = Cpu()
    cpu.mem_map(CODE, 0x1000, Prot.READ | Prot.WRITE | Prot.EXEC)
    cpu.mem_map(DATA, 0x1000, Prot.READ | Prot.WRITE)
    cpu.mem_write(DATA + 0x100, bytes(range(128)))
    cpu.mem_write(DATA + 0x200, OUTSIDE_OLD.to_bytes(8, "little"))
    cpu.mem_write(CODE, STORES)
    window = DATA + 0x100

    def python_hook(_uc: object, _access: int, addr: int, size: int, value: int, _ud: object) -> bool:
        if classify(addr, size, window) == 2:  # as the tracker's stand-in does
            log.record(cpu.read(Reg.RIP), addr, size, value, cpu.mem_read(addr, size))
            return True
        if log.snapshot_pending:
            log.set_snapshot(cpu.mem_read(window, 128))
        log.record(cpu.read(Reg.RIP), addr, size, value)
        return True

    _hook, native = log.add_hook(cpu, DATA, DATA + 0xFFF, python_hook)
    log.start(window, snapshot_wanted=True)
    cpu.write(Reg.RAX, 0x1122334455667788)
    cpu.run(CODE)
    assert log.count == 3 and log.outside == 1  # the store at DATA + 0x200 is outside the window
    raw, overflowed = log.take()
    assert log.count == 0 and log.outside == 0 and not overflowed
    return entries(raw), log.snapshot(), native


OUTSIDE_OLD = 0x0123456789ABCDEF
# (pc, address, size, value, old): the bytes an outside store overwrote, 0 for one into the window
EXPECTED = [(CODE, DATA + 0x108, 8, 0x1122334455667788, 0),
            (CODE + 8, DATA + 0x200, 8, 0x1122334455667788, OUTSIDE_OLD),
            (CODE + 16, DATA + 0x101, 1, 0x7F, 0)]


def test_the_machine_code_hook_logs_each_store_and_the_window_before_the_first() -> None:
    logged, snapshot, native = _stores_on_a_cpu(WriteLog())
    assert native, "this host maps executable memory: the machine-code hook is expected"
    assert logged == EXPECTED
    assert snapshot == bytes(range(128))  # taken before the first store landed


@pytest.mark.usefixtures("no_machine_code")
def test_the_python_stand_in_logs_the_same() -> None:
    logged, snapshot, native = _stores_on_a_cpu(WriteLog())
    assert not native
    assert logged == EXPECTED and snapshot == bytes(range(128))


def test_a_full_log_counts_on_and_says_so() -> None:
    log = WriteLog(capacity=2)
    cpu = Cpu()
    cpu.mem_map(CODE, 0x1000, Prot.READ | Prot.WRITE | Prot.EXEC)
    cpu.mem_map(DATA, 0x1000, Prot.READ | Prot.WRITE)
    cpu.mem_write(CODE, STORES)
    log.add_hook(cpu, DATA, DATA + 0xFFF, lambda *_: True)
    log.start(DATA, snapshot_wanted=False)
    cpu.run(CODE)
    raw, overflowed = log.take()
    assert overflowed and len(entries(raw)) == 2


def _verdicts(design: str) -> list[tuple[int, int, str, str, str]]:
    path = str(SAMPLES / "probe_targets")
    m = Machine(path, [path], {}, RunOptions(design=design), GuestIO.captured())
    m.attach("uprobe:t_nop5")
    session = VerifySession(m)
    m.run()
    return [(v.hit, v.detail["offset"], v.detail["old"], v.detail["new"], v.detail["writer"]) for v in session.violations]


def test_verdicts_with_the_machine_code_hook_match_the_python_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    native = _verdicts("linux-6.18")
    with machine_code_refused(monkeypatch):
        python = _verdicts("linux-6.18")
    assert native and native == python


def test_a_window_that_cannot_be_read_gives_no_snapshot() -> None:
    log = WriteLog()
    cpu = Cpu()
    cpu.mem_map(CODE, 0x1000, Prot.READ | Prot.WRITE | Prot.EXEC)
    cpu.mem_map(DATA, 0x1000, Prot.READ | Prot.WRITE)
    cpu.mem_write(CODE, bytes.fromhex("48890425" "08000800" "f4"))  # mov %rax,0x80008; hlt
    log.add_hook(cpu, DATA, DATA + 0xFFF, lambda *_: True)
    log.start(DATA - 64, snapshot_wanted=True)  # the window starts on the unmapped page below
    cpu.run(CODE)
    assert log.count == 1 and log.snapshot() is None
