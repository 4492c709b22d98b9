"""A signal in the middle of a hit: under linux-6.18 the uprobe syscall returns into the trampoline,
so a signal the consumer raises is delivered there (rip right after the syscall, as the real kernel
delivers most SIGALRMs of a busy probed loop). The handler runs, rt_sigreturn puts the trampoline's
state back, and the hit goes on: the verdict must be the one the hit earns without the signal."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from emu.designs import DESIGNS, NOP5_TRAMPOLINE, Design
from emu.guestio import GuestIO
from emu.kernel.signal import send_to_self
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession
from emu.verify.signals import SignalWatch
from emu.violations import Check

SIG_HITS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "sig_hits")
SIGUSR1 = 10


def _run(design: str | Design, signals: bool) -> tuple[VerifySession, bytes]:
    io = GuestIO.captured()
    m = Machine(SIG_HITS, [SIG_HITS, "6"], {}, RunOptions(design=design, timeout_s=60), io)

    def raise_usr1(_hit: Hit) -> None:
        send_to_self(m.kernel, SIGUSR1)  # delivered as the kernel returns to user mode

    m.attach("uprobe:leaf_site", Consumer(handler=raise_usr1 if signals else lambda _hit: None))
    session = VerifySession(m)
    result = m.run()
    session.finish(result.message or result.ending.value, killed=result.signal is not None)
    return session, bytes(io.out)


def _found(session: VerifySession) -> set[tuple[str, int, str]]:
    return {(v.kind.value, v.hit, v.summary) for v in session.violations}


@pytest.mark.parametrize("design", ["linux-6.18", "jmp-slots", "int3"])
def test_a_signal_inside_a_hit_changes_no_verdict(design: str) -> None:
    with_signals, out = _run(design, signals=True)
    without, _ = _run(design, signals=False)
    assert out.endswith(b"handled=6\n")  # every hit raised one, and the handler ran
    assert _found(with_signals) == _found(without)
    assert with_signals.transactions == without.transactions == 6


def test_without_the_signal_watch_the_handler_looks_like_a_broken_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: the hit set aside for nothing, the handler's entry taken for its resume."""
    monkeypatch.setattr(SignalWatch, "frame", lambda self, restorer, ip: None)
    session, _ = _run("linux-6.18", signals=True)
    kinds = {v.kind for v in session.violations}
    assert Check.RESUME in kinds and Check.REGS in kinds


def test_a_flaw_after_the_syscall_is_found_after_the_handler_returns() -> None:
    """The trampoline clobbers r10 in its epilogue, after the signal's handler has run and returned."""
    assert isinstance(NOP5_TRAMPOLINE, str) and "pop %r11" in NOP5_TRAMPOLINE
    base = DESIGNS["linux-6.18"]
    assert base.trampoline is not None
    flawed = replace(base, name="epilogue-r10", trampoline=replace(
        base.trampoline, code=NOP5_TRAMPOLINE.replace("pop %r11", "mov $0x5a, %r10; pop %r11")))
    session, _ = _run(flawed, signals=True)
    regs = [v for v in session.violations if v.kind is Check.REGS]
    assert regs and all("r10 expected" in v.summary for v in regs)
