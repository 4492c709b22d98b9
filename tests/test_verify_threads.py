"""Verifiers on a multi-threaded guest: transactions, shadow stacks and RSB models per thread.

elf_samples/threads (fixtures/threads.c): worker threads call probed() (a nop5 site) and pass
the USDT site thr:tick on every iteration. Small scheduler quanta preempt threads inside
trampolines, slots and kernel-side code; the verdicts must be those of a run that never
preempts inside a transaction (a quantum larger than the whole run).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from emu import cli
from emu.abi import RED_ZONE
from emu.check import CheckRequest, DesignReport, run_check
from emu.cpu import STATE_BYTES
from emu.designs import DESIGNS as DESIGNS_TABLE
from emu.designs import Trampoline
from emu.guestio import GuestIO
from emu.kernel.sched import Scheduler
from emu.kernel.state import SignalState
from emu.kernel.tasks import Task, TaskState
from emu.kernel.uprobes.records import Uprobe
from emu.lockstep import Observed, SyscallLog, first_divergence
from emu.machine import Machine, RunOptions
from emu.verify.records import ProbeSite, Transaction, others_folded_in
from emu.verify.session import Verifier, VerifySession
from emu.verify.tracker import TransactionTracker
from emu.violations import Check

THREADS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "threads")
SPECS = ("uprobe:probed", "usdt:thr:tick")
DESIGNS = ("int3", "uretprobe-rfc", "linux-6.18", "jmp-slots", "nop10")
CLEAN = ("int3", "uretprobe-rfc", "jmp-slots", "nop10")
WHOLE_RUN = 10**9  # a quantum no slice reaches: each thread runs until it blocks or exits
THREADS_ARGS = ("3", "60")


def check(quantum: int, seed: int | None) -> dict[str, DesignReport]:
    request = CheckRequest(THREADS, [THREADS, *THREADS_ARGS], {}, specs=SPECS, designs=DESIGNS,
                           options=RunOptions(sched_quantum=quantum, sched_seed=seed), shstk=True, rsb=16)
    return {r.design: r for r in run_check(request)}


def redzone_hits(report: DesignReport) -> Counter[str]:
    """Per probe: how many hits had a red-zone violation (each hit counted once)."""
    return Counter(probe for probe, _hit in {(v.probe, v.hit) for v in report.violations if v.kind is Check.REDZONE})


@pytest.fixture(scope="module")
def unpreempted() -> dict[str, DesignReport]:
    return check(WHOLE_RUN, None)


@pytest.mark.parametrize(("quantum", "seed"), [(7, None), (13, 5), (50, 11)])
def test_preempted_threads_get_the_unpreempted_verdicts(quantum: int, seed: int | None,
                                                        unpreempted: dict[str, DesignReport]) -> None:
    reports = check(quantum, seed)
    for design in DESIGNS:
        report, calm = reports[design], unpreempted[design]
        assert report.result is not None and calm.result is not None
        assert report.result.switches > 10 * calm.result.switches, design  # preempted all the time
        assert report.hits == calm.hits == 2 * 3 * 60, design
        assert report.same_output, f"{design}: {report.divergence}"
        assert report.rsb_extra == calm.rsb_extra, design
    for design in CLEAN:
        assert reports[design].violations == [], design  # no redzone, regs, resume nor #CP
    clobbering = reports["linux-6.18"]
    assert {v.kind for v in clobbering.violations} == {Check.REDZONE}
    assert redzone_hits(clobbering) == redzone_hits(unpreempted["linux-6.18"])
    assert sum(redzone_hits(clobbering).values()) == 2 * (3 * 60 - 1)  # every optimized hit; the first is INT3


def test_unpreempted_run_is_clean_but_for_618s_red_zone(unpreempted: dict[str, DesignReport]) -> None:
    # the shadow stack of a new thread starts empty at clone: start_thread's frames never meet main's
    for design in CLEAN:
        assert unpreempted[design].violations == [], design
    assert {v.kind for v in unpreempted["linux-6.18"].violations} == {Check.REDZONE}


def test_other_threads_red_zone_stores_are_not_the_probes() -> None:
    before = bytes(range(8))
    at_suspend = bytes([0, 1, 2, 3, 9, 9, 6, 7])  # the probed thread's own stores at 4 and 5
    resumed = bytes([0, 0xAA, 2, 3, 9, 0xBB, 6, 7])  # another thread stored at 1 and over the probe's at 5
    assert others_folded_in(before, at_suspend, resumed) == bytes([0, 0xAA, 2, 3, 4, 0xBB, 6, 7])
    assert others_folded_in(before, at_suspend, at_suspend) == before


def _tracker_with_open_transaction() -> tuple[TransactionTracker, Transaction]:
    m = Machine(THREADS, [THREADS], {}, RunOptions(), GuestIO.captured())
    tracker = VerifySession(m).tracker
    rsp = m.entry_sp - 4096  # a red zone inside [stack], as a thread's would be on its own stack
    m.mem.write(rsp - RED_ZONE, bytes(RED_ZONE))
    m.uprobes.stats.exits["sysret"] = 3  # exits before the hit, by any thread
    nop5 = b"\x0f\x1f\x44\x00\x00"
    at = ProbeSite("uprobe:probed", cast(Uprobe, None), 0x401B70, nop5, True, 0x401B70 + 5, 0)
    tx = Transaction(at, 1, bytes(8) + rsp.to_bytes(8, "little") + bytes(STATE_BYTES - 16), {"sysret": 3})
    tracker.active = tx
    return tracker, tx


def test_a_transaction_waits_for_its_thread_and_ignores_the_others() -> None:
    tracker, tx = _tracker_with_open_transaction()
    first, second = Task(1, SignalState()), Task(2, SignalState())
    tx.redzone_before = bytes(RED_ZONE)  # the probed thread's own code has written there: snapshot taken
    tracker.machine.mem.write(tx.redzone_base + 8, b"\x11")  # ... that write
    tracker.threads.switch(first, second)
    assert tracker.active is None  # the second thread cannot finish (nor abandon) the first one's hit
    tracker.machine.uprobes.stats.exits["sysret"] = 10  # the second thread's own probe hits: 7 exits
    tracker.machine.mem.write(tx.redzone_base, b"\x22")  # and a store of its into the first one's red zone
    tracker.threads.switch(second, first)
    assert tracker.active is tx
    assert tx.exits_before == {"sysret": 10}  # as if the 7 had come before: they do not count for this hit
    assert tx.redzone_before == b"\x22" + bytes(RED_ZONE - 1)  # the other thread's store is the reference


def test_an_exit_ends_a_suspended_transaction_without_verdict_a_pending_signal_does_not() -> None:
    """A signal pending for the thread switched in runs its handler first: the hit is taken up, and set
    aside again when the kernel builds the signal's frame over it (emu/verify/signals.py)."""
    tracker, tx = _tracker_with_open_transaction()
    first, second = Task(1, SignalState()), Task(2, SignalState())
    tracker.threads.switch(first, second)
    first.signals.pending = 1 << 9  # SIGUSR1's bit, unblocked: delivered as the thread is switched in
    tracker.threads.switch(second, first)
    assert tracker.active is tx
    tracker.signals.frame(0x401000, 0x401234)  # the handler's frame is built: the hit waits for its sigreturn
    assert tracker.active is None
    tracker.signals.frame(None, 0x401234)
    assert tracker.active is tx  # the same hit, now taken to be the running (second) thread's, which exits
    second.state = TaskState.EXITED
    tracker.threads.switch(second, first)
    assert tracker.active is None and tracker.count == 0


def _log(calls: list[tuple[int, str, int]]) -> SyscallLog:
    current = SimpleNamespace(tid=0)
    log = SyscallLog(cast(Scheduler, SimpleNamespace(current=current)))
    for tid, name, ret in calls:
        current.tid = tid
        log.append((name, (), ret))
    return log


def test_lockstep_compares_threads_not_their_interleaving() -> None:
    reference = _log([(1, "clone", 2), (2, "write", 5), (1, "futex", 0), (2, "exit", 0), (1, "exit_group", 0)])
    interleaved = _log([(1, "clone", 2), (1, "futex", -11), (1, "futex", 0), (2, "write", 5), (2, "exit", 0),
                        (1, "exit_group", 0)])
    assert first_divergence(Observed(b"", b"", 0, reference), Observed(b"", b"", 0, interleaved)) is None
    wrong = _log([(1, "clone", 2), (2, "write", 4), (2, "exit", 0), (1, "exit_group", 0)])
    found = first_divergence(Observed(b"", b"", 0, reference), Observed(b"", b"", 0, wrong))
    assert found == "thread 2: syscall #1: unprobed write = 5, probed write = 4"


def test_negative_control_preempted_trampoline_forgetting_pop_r11() -> None:
    # optimized hits lose r11, whichever thread runs when, and nothing else is reported
    broken = replace(DESIGNS_TABLE["linux-6.18"], name="forgets-pop-r11", trampoline=Trampoline(
        "push %rcx; push %r11; push %rax; movq $336,%rax; syscall; pop %rax; lea 8(%rsp),%rsp; pop %rcx; ret; int3"))
    m = Machine(THREADS, [THREADS, *THREADS_ARGS], {}, RunOptions(design=broken, sched_quantum=7), GuestIO.captured())
    m.attach(SPECS[0])
    session = VerifySession(m, (Verifier.REGS, Verifier.RESUME))
    m.run()
    assert session.transactions == 3 * 60
    # r11 comes back holding rflags (the syscall's copy): a hit whose r11 held that value already
    # looks clean (a third of them here, preempted or not); the others must all be caught
    assert len(session.violations) > (3 * 60 - 1) // 2
    assert all(v.kind is Check.REGS and set(v.detail["registers"]) == {"r11"} for v in session.violations)


def test_check_command_on_the_threads_sample(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["check", "--strict", "--kernel", "int3,jmp-slots", "--shstk", "--sched-quantum", "13",
                       "--sched-seed", "2", "-p", SPECS[0], "-p", SPECS[1], THREADS, *THREADS_ARGS])
    out = capsys.readouterr().out
    assert status == 0, out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:3]}
    assert set(rows) == {"int3", "jmp-slots"}
    assert all(row[1] == str(2 * 3 * 60) and row[2:7] == ["0"] * 5 and row[7] == "yes"
               for row in rows.values())


def test_a_frame_built_at_the_site_itself_drops_the_hit_that_has_not_begun() -> None:
    """The CPU stopped at the site after its hook opened the hit but before the probed instruction ran (a
    timer's exact stop): the handler returns to the site, where the hit starts afresh. Set aside instead
    (the negative control, a frame at any other address), the old hit would come back at sigreturn."""
    tracker, tx = _tracker_with_open_transaction()
    tracker.signals.frame(0x401000, tx.site)
    tracker.signals.frame(None, 0x401234)
    assert tracker.active is None
    tracker.active = tx
    tracker.signals.frame(0x401000, tx.site + 5)
    tracker.signals.frame(None, 0x401234)
    assert tracker.active is tx
