"""uprobe_race (spec section 6, #8): threads call the probed function while others attach and detach
a uprobe with a USDT semaphore through perf_event_open. Every attach succeeds, nothing crashes, the
semaphore ends at 0, under every design and every interleaving tried."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from conftest import sample, symtab_address

from emu.designs import DESIGNS
from emu.guestio import GuestIO
from emu.kernel.sched import Scheduler
from emu.kernel.tasks import Task
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.sites import TRAMPOLINE_NAME
from emu.machine import Ending, Machine, RunOptions
from emu.native import available as native_available

RACE = sample("uprobe_race")
EXPECTED = b"threads=4 attaches=80 failed=0 calls=6000 semaphore=0\n"
INTERLEAVINGS = [(20_000, None), (200, 1), (31, 2), (5, 3)]  # (quantum, seed)


def _symbol(name: str) -> int:
    return symtab_address(RACE, name)


def _machine(design: str, quantum: int, seed: int | None) -> Machine:
    return Machine(RACE, [RACE], {}, RunOptions(design=design, sched_quantum=quantum, sched_seed=seed),
                   GuestIO.captured())


@pytest.mark.parametrize("quantum,seed", INTERLEAVINGS)
@pytest.mark.parametrize("design", list(DESIGNS))
def test_uprobe_race(design: str, quantum: int, seed: int | None) -> None:
    machine = _machine(design, quantum, seed)
    result = machine.run()
    assert (result.ending, result.exit_status, bytes(machine.io.out)) == (Ending.EXITED, 0, EXPECTED), result.message
    assert machine.uprobes.probes == {}  # every close() detached
    sema = _symbol("race_sema_semaphore")  # a non-PIE static sample: the link address is the address
    assert machine.mem.read(sema, 2) == b"\0\0"
    site = machine.resolver.symbols["uprobe_test"][0]
    assert machine.mem.read(site, 5) == bytes.fromhex("0f1f440000")  # the original nop5 is back


@pytest.mark.parametrize("design", ["int3", "linux-6.18", "jmp-slots"])
def test_small_slices_make_the_threads_really_race(design: str) -> None:
    """With short slices the calls overlap the attached windows: some calls are probe hits."""
    machine = _machine(design, 31, 2)
    assert machine.run().exit_status == 0
    stats = machine.uprobes.stats
    assert stats.traps > 0
    if design != "int3":
        assert stats.optimized > 0 and sum(stats.exits.values()) > 0  # the optimized path was taken too


@pytest.mark.parametrize("design", ["linux-6.18", "jmp-slots"])
def test_a_thread_parked_in_the_trampoline_survives_the_detach(design: str) -> None:
    """Spec 3.6: a thread preempted inside the trampoline (or slot) while the probe is detached and the
    site restored finds no uprobe when it reaches the syscall, and simply returns."""
    survived = 0
    for seed in range(1, 9):
        machine = _machine(design, 5, seed)
        sched, up = machine.kernel.sched, machine.uprobes
        parked: dict[int, bool] = {}
        through = [0]  # threads that were parked in the trampoline across the detach
        pick = sched.pick_next

        def pick_and_watch(yielding: bool = False, *, pick: Callable[[bool], Task] = pick, sched: Scheduler = sched,
                           up: Uprobes = up, parked: dict[int, bool] = parked, machine: Machine = machine,
                           through: list[int] = through) -> Task:
            current = sched.current
            vma = machine.mem.find(current.pc)
            if current.alive and vma is not None and vma.name == TRAMPOLINE_NAME:
                parked[current.tid] = bool(up.probes)
            chosen = pick(yielding)
            if parked.pop(chosen.tid, False) and not up.probes:
                through[0] += 1
            return chosen

        sched.pick_next = pick_and_watch  # type: ignore[method-assign]
        assert machine.run().exit_status == 0
        survived += through[0]
        if survived:
            break  # found (deterministically, for the same seeds every time)
    assert survived > 0


@pytest.mark.skipif(not native_available(), reason="needs root and the uprobe PMU")
def test_same_output_natively() -> None:
    """Fewer attaches than the emulated runs: each real perf_event_open registration takes ~0.1 s here."""
    args = ["2", "2000", "5"]
    native = subprocess.run([RACE, *args], capture_output=True, env={}, timeout=60)
    emulated = Machine(RACE, [RACE, *args], {}, RunOptions(sched_quantum=50, sched_seed=1), GuestIO.captured())
    assert emulated.run().exit_status == 0
    expected = b"threads=2 attaches=5 failed=0 calls=2000 semaphore=0\n"
    assert (native.returncode, native.stdout) == (0, expected) == (0, bytes(emulated.io.out))
