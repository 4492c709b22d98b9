"""The store watch (emu/hotpath/store_watch.py): what a hit stores is seen from a code hook over the
code the hit runs, with no memory hook at all; what it cannot follow is said, not missed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import unicorn
from conftest import python_hot_path_forced
from keystone import KS_ARCH_X86, KS_MODE_64, Ks

from emu.abi import Prot
from emu.cpu import Cpu, RawState, Reg
from emu.guestio import GuestIO
from emu.hotpath.store_watch import StoreWatch
from emu.hotpath.write_log import WriteLog, entries
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession

CODE, ELSEWHERE, DATA = 0x10000, 0x20000, 0x80000
SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
MEMORY_HOOKS = (unicorn.UC_HOOK_MEM_READ | unicorn.UC_HOOK_MEM_WRITE | unicorn.UC_HOOK_MEM_FETCH
                | unicorn.UC_HOOK_MEM_READ_AFTER)


def _asm(text: str, at: int) -> bytes:
    return bytes(Ks(KS_ARCH_X86, KS_MODE_64).asm(text, at)[0])


def _watched(code: str, elsewhere: str = "ret", exits_free: bool = False) -> tuple[Cpu, WriteLog, StoreWatch]:
    """A CPU running ``code`` at CODE (watched) that may call ``elsewhere`` at ELSEWHERE (not watched),
    with rsp in the data page and a transaction open whose red zone is the 128 bytes below it."""
    cpu = Cpu()
    cpu.mem_map(CODE, 0x1000, Prot.READ | Prot.EXEC)
    cpu.mem_map(ELSEWHERE, 0x1000, Prot.READ | Prot.EXEC)
    cpu.mem_map(DATA, 0x1000, Prot.READ | Prot.WRITE)
    cpu.mem_write(CODE, _asm(code, CODE) + b"\xf4")
    cpu.mem_write(ELSEWHERE, _asm(elsewhere, ELSEWHERE))
    cpu.write(Reg.RSP, DATA + 0x800)
    log = WriteLog()
    watch = StoreWatch(cpu, log, RawState(cpu).mem)
    watch.watch(CODE, CODE + 0x1000, exits_free=exits_free)
    cpu.hooks.keep(watch)
    log.start(DATA + 0x800 - 128, snapshot_wanted=True)
    return cpu, log, watch


@pytest.fixture(params=["C", "Python"])
def hot_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with python_hot_path_forced(monkeypatch) if request.param == "Python" else contextlib.nullcontext():
        yield request.param


def _run(cpu: Cpu, watch: StoreWatch) -> None:
    cpu.run(CODE)
    watch.complete()


@pytest.mark.usefixtures("hot_path")
def test_a_call_out_of_the_watched_code_is_noted_as_leaving() -> None:
    cpu, log, watch = _watched(f"push rax; call {ELSEWHERE:#x}; pop rax", "mov qword ptr [rsp + 64], rbx; ret")
    _run(cpu, watch)
    assert log.left == (CODE + 1, ELSEWHERE)  # after the push (1 byte): the call
    stores = [(pc, addr) for pc, addr, _size, _value, _old in entries(log.take()[0])]
    assert stores == [(CODE, DATA + 0x7F8), (CODE + 1, DATA + 0x7F0)]  # the store out there is not seen


@pytest.mark.usefixtures("hot_path")
@pytest.mark.parametrize(("rax", "left"), [(0, True), (1, False)])
def test_a_conditional_branch_out_leaves_only_when_taken(rax: int, left: bool) -> None:
    cpu, log, watch = _watched(f"test rax, rax; jz {ELSEWHERE:#x}; nop", "hlt")
    cpu.write(Reg.RAX, rax)
    _run(cpu, watch)
    assert (log.left is not None) == left


@pytest.mark.usefixtures("hot_path")
def test_an_indirect_jump_out_is_judged_by_where_it_goes() -> None:
    load = f"mov rax, {ELSEWHERE:#x}"
    cpu, log, watch = _watched(f"{load}; jmp rax")
    cpu.mem_write(ELSEWHERE, b"\xf4")
    _run(cpu, watch)
    assert log.left == (CODE + len(_asm(load, CODE)), ELSEWHERE)


@pytest.mark.usefixtures("hot_path")
def test_the_out_of_line_step_s_branches_are_the_kernel_s() -> None:
    cpu, log, watch = _watched(f"call {ELSEWHERE:#x}", exits_free=True)
    _run(cpu, watch)
    assert log.left is None


@pytest.mark.usefixtures("hot_path")
def test_stores_the_text_does_not_tell_are_noted_unseen() -> None:
    cpu, log, watch = _watched("mov rbp, rsp; enter 16, 1; leave")  # a nesting level: pushes rbp's frame too
    _run(cpu, watch)
    assert log.unseen == (1, CODE + 3)


@pytest.mark.usefixtures("hot_path")
def test_rewritten_code_is_decoded_again() -> None:
    """A kernel rewrite of watched code (an XOL slot, a new slot) drops its translation; the watch must
    not keep the old instruction's formulas: the negative control is the first run's store."""
    cpu, log, watch = _watched("mov qword ptr [rsp - 8], rax")
    _run(cpu, watch)
    cpu.mem_write(CODE, _asm("mov qword ptr [rsp - 16], rax", CODE) + b"\xf4")
    cpu.flush_code(CODE, CODE + 0x1000)
    log.take()
    _run(cpu, watch)
    assert [addr for _pc, addr, *_ in entries(log.take()[0])] == [DATA + 0x7F0]


@pytest.mark.parametrize("python", [False, True])
def test_a_verified_run_adds_no_memory_hook(monkeypatch: pytest.MonkeyPatch, python: bool) -> None:
    """No hook over memory, so nothing the program does outside a hit pays for the verifiers."""
    path = str(SAMPLES / "probe_targets")
    with python_hot_path_forced(monkeypatch) if python else contextlib.nullcontext():
        m = Machine(path, [path], {}, RunOptions(design="linux-6.18"), GuestIO.captured())
        m.attach("uprobe:t_nop5")
        session = VerifySession(m)
        m.run()
    assert session.transactions > 0
    assert m.cpu.hooks.installed(MEMORY_HOOKS) == 0
