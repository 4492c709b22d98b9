"""The red-zone write log, as the store watch fills it: the C watch and its Python twin record the same stores."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from conftest import python_hot_path_forced

from emu.abi import Prot
from emu.cpu import Cpu, RawState, Reg
from emu.guestio import GuestIO
from emu.hotpath.store_watch import StoreWatch
from emu.hotpath.write_log import WriteLog, entries, native_hot_path
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
CODE, DATA = 0x10000, 0x80000
# mov %rax,0x80108; mov %rax,0x80200; movb $0x7f,0x80101; hlt
STORES = bytes.fromhex("48890425" "08010800" "48890425" "00020800" "c6042501010800" "7f" "f4")




def _cpu(code: bytes) -> Cpu:
    cpu = Cpu()
    cpu.mem_map(CODE, 0x1000, Prot.READ | Prot.WRITE | Prot.EXEC)
    cpu.mem_map(DATA, 0x1000, Prot.READ | Prot.WRITE)
    cpu.mem_write(CODE, code)
    return cpu


def _hooked(log: WriteLog, cpu: Cpu) -> StoreWatch:
    """A store watch over the code page logging into ``log`` (C or its Python twin)."""
    watch = StoreWatch(cpu, log, RawState(cpu).mem)
    watch.watch(CODE, CODE + 0x1000)
    cpu.hooks.keep(watch)
    return watch


def _stores_on_a_cpu(log: WriteLog) -> tuple[list[tuple[int, int, int, int, int]], bytes | None, bool]:
    cpu = _cpu(STORES)
    cpu.mem_write(DATA + 0x100, bytes(range(128)))
    cpu.mem_write(DATA + 0x200, OUTSIDE_OLD.to_bytes(8, "little"))
    watch = _hooked(log, cpu)
    log.start(DATA + 0x100, snapshot_wanted=True)
    cpu.write(Reg.RAX, 0x1122334455667788)
    cpu.run(CODE)
    assert log.count == 3 and log.outside == 1  # the store at DATA + 0x200 is outside the window
    watch.complete()  # what each store wrote, read now that they have run
    raw, overflowed = log.take()
    assert log.count == 0 and log.outside == 0 and not overflowed
    return entries(raw), log.snapshot(), watch.native


OUTSIDE_OLD = 0x0123456789ABCDEF
# (pc, address, size, value, old): the bytes an outside store overwrote, 0 for one into the window
EXPECTED = [(CODE, DATA + 0x108, 8, 0x1122334455667788, 0),
            (CODE + 8, DATA + 0x200, 8, 0x1122334455667788, OUTSIDE_OLD),
            (CODE + 16, DATA + 0x101, 1, 0x7F, 0)]


def test_the_c_hook_logs_each_store_and_the_window_before_the_first() -> None:
    logged, snapshot, native = _stores_on_a_cpu(WriteLog())
    assert native == (native_hot_path() is not None)
    assert logged == EXPECTED
    assert snapshot == bytes(range(128))  # taken before the first store landed


@pytest.mark.usefixtures("python_hot_path")
def test_the_python_stand_in_logs_the_same() -> None:
    logged, snapshot, native = _stores_on_a_cpu(WriteLog())
    assert not native
    assert logged == EXPECTED and snapshot == bytes(range(128))


def test_a_full_log_counts_on_and_says_so() -> None:
    log = WriteLog(capacity=2)
    cpu = _cpu(STORES)
    _hooked(log, cpu)
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


def test_verdicts_with_the_c_hook_match_the_python_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    native = _verdicts("linux-6.18")
    with python_hot_path_forced(monkeypatch):
        python = _verdicts("linux-6.18")
    assert native and native == python


@pytest.mark.parametrize("python", [False, True])
def test_a_window_that_cannot_be_read_gives_no_snapshot(monkeypatch: pytest.MonkeyPatch, python: bool) -> None:
    log = WriteLog()
    cpu = _cpu(bytes.fromhex("48890425" "08000800" "f4"))  # mov %rax,0x80008; hlt
    with python_hot_path_forced(monkeypatch) if python else contextlib.nullcontext():
        _hooked(log, cpu)
    log.start(DATA - 64, snapshot_wanted=True)  # the window starts on the unmapped page below
    cpu.run(CODE)
    assert log.count == 1 and log.snapshot() is None


@pytest.mark.parametrize("python", [False, True])
def test_a_closed_log_logs_nothing(monkeypatch: pytest.MonkeyPatch, python: bool) -> None:
    """The watch stays for the whole run: between transactions it must log nothing."""
    log = WriteLog()
    cpu = _cpu(STORES)
    with python_hot_path_forced(monkeypatch) if python else contextlib.nullcontext():
        _hooked(log, cpu)
    log.start(DATA + 0x100, snapshot_wanted=True)
    log.close()
    cpu.run(CODE)
    assert log.count == 0 and log.outside == 0 and log.snapshot_pending
    log.start(DATA + 0x100, snapshot_wanted=True)  # the negative control: open, the same stores are logged
    cpu.run(CODE)
    assert log.count == 3 and log.outside == 1
