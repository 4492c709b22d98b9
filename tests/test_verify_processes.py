"""The verifiers follow every process of a run: a child forked and an image exec'd are verified as the
run's first process is, each violation saying its process; a clean design stays clean in all of them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import sample

from emu.check import CheckRequest, DesignReport, run_check
from emu.designs import DESIGNS, JMP_SLOT, Design
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession
from emu.violations import Check, Violation

REDZONE = sample("redzone_probe")
FORKS = sample("forks")
SITE = f"uprobe:{REDZONE}:rz_nop5_site"  # by file: it installs in whichever process maps the program
RDX_CLOBBERING_RETURN = "push %rax; push %rcx; push %r11; movq $335,%rax; syscall; pop %r11; pop %rcx; mov $0x5a,%rdx; ret; int3"


def _check(argv: list[str], design: str) -> DesignReport:
    (report,) = run_check(CheckRequest(argv[0], argv, {}, specs=(SITE,), designs=(design,)))
    return report


def _redzone(report: DesignReport) -> list[Violation]:
    return [v for v in report.violations if v.kind is Check.REDZONE]


@pytest.fixture(scope="module")
def direct() -> DesignReport:
    """linux-6.18's trampoline pushes into the red zone: the program run directly, the verdict to match."""
    return _check([REDZONE, "6"], "linux-6.18")


@pytest.mark.parametrize("script, pid", [(f"exec {REDZONE} 6", False), (f"{REDZONE} 6; true", True)])
def test_a_program_a_shell_runs_is_verified_as_if_run_directly(direct: DesignReport, script: str, pid: bool) -> None:
    """``exec`` runs the program in the shell's own process (a new image); ``; true`` makes the shell
    fork a child for it first: the same violations either way, the child's saying its pid."""
    report = _check(["/bin/sh", "-c", script], "linux-6.18")
    found = _redzone(report)
    assert [(v.address, v.hit, v.summary) for v in found] == [(v.address, v.hit, v.summary) for v in _redzone(direct)]
    assert found and all(bool(v.pid) is pid for v in found)
    assert all((f"pid {v.pid})" in v.line()) is pid for v in found)
    assert report.exits == direct.exits and report.hits == direct.hits == 6  # every process's exits counted
    assert report.violations.hits_flagged(Check.REDZONE) == direct.violations.hits_flagged(Check.REDZONE)


@pytest.mark.parametrize("script", [f"exec {REDZONE} 6", f"{REDZONE} 6; true"])
def test_a_clean_design_stays_clean_in_every_process(script: str) -> None:
    report = _check(["/bin/sh", "-c", script], "jmp-slots")
    assert report.violations == [] and report.hits == 6 and report.same_output
    assert report.exits == {"iret": 5}  # the first hit traps, the five after it take the slot


def _verified(argv: list[str], design: str | Design, spec: str) -> tuple[VerifySession, int]:
    m = Machine(argv[0], argv, {}, RunOptions(design=design), GuestIO.captured())
    m.attach(spec)
    session = VerifySession(m)
    result = m.run()
    session.finish(result.message or result.ending.value, killed=result.signal is not None)
    return session, result.exit_status


def test_a_forked_child_s_returns_are_verified() -> None:
    """forker() forks and returns in both processes: the child returns through the trampoline too."""
    base = DESIGNS["linux-6.18"]
    flawed = replace(base, name="ret-rdx", uretprobe=replace(base.uretprobe, code=RDX_CLOBBERING_RETURN))
    session, _ = _verified([FORKS, "retfork"], flawed, "uretprobe:forker")
    regs = [v for v in session.violations if v.kind is Check.REGS]
    assert {bool(v.pid) for v in regs} == {False, True}, regs  # the parent's return and the child's
    assert all("rdx expected" in v.line() for v in regs)
    clean, status = _verified([FORKS, "retfork"], base, "uretprobe:forker")
    assert clean.violations == [] and status == 0
    assert [child.returns.count for child in clean.children] == [1] and clean.returns.count == 1


def test_a_child_killed_inside_a_hit_never_resumed() -> None:
    """A slot that traps kills the process inside the hit: a child's hit, too, never resumed."""
    base = DESIGNS["jmp-slots"]
    assert base.trampoline is not None
    trapping = replace(base, name="slot-trap", trampoline=replace(base.trampoline, code=f"int3; {JMP_SLOT.split('; ', 1)[1]}"))
    session, _ = _verified(["/bin/sh", "-c", f"{REDZONE} 6; true"], trapping, SITE)
    resume = [v for v in session.violations if v.kind is Check.RESUME]
    assert resume and all(v.pid and "never resumed" in v.summary and "SIGTRAP" in v.summary for v in resume), resume
    clean, _ = _verified(["/bin/sh", "-c", f"{REDZONE} 6; true"], base, SITE)
    assert clean.violations == [] and len(clean.children) == 1


@pytest.mark.parametrize("forget", [False, True])
def test_a_rebind_keeps_each_site_s_hit_count_unless_told_to_forget(forget: bool) -> None:
    """A library mapped or an image exec'd rebinds the watched sites: a site watched before goes on with
    its hit numbers; the fuzzer, re-running one process, starts them anew."""
    session, _ = _verified([REDZONE, "6"], "linux-6.18", "uprobe:rz_nop5_site")
    tracker = session.tracker
    (at,) = tracker._by_site.values()
    assert tracker._counters.hits(at.index) == 6
    tracker.bind(session.machine.attachments, forget_hits=forget)
    (again,) = tracker._by_site.values()
    assert tracker._counters.hits(again.index) == (0 if forget else 6)
