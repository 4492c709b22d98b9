"""The violation log stays bounded on a design that breaks something on every hit, and counts
exactly what it no longer keeps."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from emu import violations as violations_module
from emu.check import CheckRequest, run_check
from emu.commands.check import more_help
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession
from emu.violations import Check, Repeats, Violation, ViolationLog

TRIG = str(Path(__file__).resolve().parent.parent / "elf_samples" / "trig")
BROKEN = ("linux-6.18", "nop5", "uretprobe:uprobe_target_nop5")  # every hit leaves two red-zone runs changed


def _violation(kind: Check, site: int, hit: int) -> Violation:
    return Violation(kind, "uprobe:f", site, f"{kind.value} at hit {hit}", {}, hit)


TEMPLATE = [_violation(Check.REDZONE, 0x10, 1), _violation(Check.REGS, 0x20, 1)]


def _held_back(hits: list[int], template: list[Violation] = TEMPLATE) -> Repeats:
    """A source's answer: hit 1's violations, and the hits held back since the last call."""
    taken = hits[:]
    hits.clear()
    return [(template, taken)] if taken else []


def test_violations_held_back_join_before_anything_reads_or_adds() -> None:
    held: list[int] = []
    log = ViolationLog()
    log.pull_from(lambda: _held_back(held))
    held += [2, 3]
    log.append(_violation(Check.RESUME, 0x10, 4))
    assert [(v.kind, v.hit) for v in log] == [(Check.REDZONE, 2), (Check.REGS, 2), (Check.REDZONE, 3),
                                              (Check.REGS, 3), (Check.RESUME, 4)]  # held back ones first
    held.append(5)
    assert len(log) == 7 and log.of_kind(Check.REDZONE) == 3 and log.hits_flagged(Check.REGS) == Counter({0x20: 3})
    held.append(6)
    log.clear()
    assert list(log) == [] and held == []  # cleared with the log


def test_processes_share_one_log_each_violation_saying_its_own() -> None:
    """Each process's session holds its repeats back in a source of its own; a site's flagged hits are
    counted per process (hit 2 of the first process and hit 2 of a child are two hits)."""
    first, child = [2], [2, 3]
    log = ViolationLog()
    log.pull_from(lambda: _held_back(first))
    log.pull_from(lambda: _held_back(child, [v.in_process(5000) for v in TEMPLATE]))
    assert [(v.hit, v.pid) for v in log if v.kind is Check.REDZONE] == [(2, 0), (2, 5000), (3, 5000)]
    assert log.hits_flagged(Check.REDZONE) == Counter({0x10: 3})
    assert log[2].line() == "redzone: uprobe:f at 0x10 (hit 2, pid 5000): redzone at hit 1"
    assert "pid" not in log[0].to_json() and log[2].to_json()["pid"] == 5000


@pytest.mark.parametrize("listened", [False, True])
def test_held_back_violations_past_the_kept_ones_count_as_whole_ones(listened: bool) -> None:
    """Past the kept violations, held-back hits are only counted, exactly as whole violations would
    be; a listener still gets every one."""
    held, heard = list(range(2, 40)), list[Violation]()
    log = ViolationLog(kept=5)
    if listened:
        log.listeners.append(heard.append)
    log.pull_from(lambda: _held_back(held))
    whole = ViolationLog(kept=5)
    whole += [v.at_hit(hit) for hit in range(2, 40) for v in TEMPLATE]
    assert log == whole and log.total == whole.total == 76 and log.dropped == 71
    for kind in Check:
        assert log.of_kind(kind) == whole.of_kind(kind) and log.hits_flagged(kind) == whole.hits_flagged(kind)
    assert len(heard) == (76 if listened else 0)


def test_a_report_s_first_few_leave_the_repeats_unmade() -> None:
    """A run of repeats is kept as one part, made whole only when the whole log is read."""
    held = list(range(2, 1002))
    log = ViolationLog()
    log.pull_from(lambda: _held_back(held))
    whole = [v.at_hit(hit) for hit in range(2, 1002) for v in TEMPLATE]
    assert len(log) == 2000 and log[:3] == whole[:3] and log[:0] == []
    assert len(log._parts) == 1  # still the run: nothing made but the three read
    assert log[1999] == whole[-1] and list(log) == whole and len(log._parts) == 2000


def test_the_log_keeps_the_first_and_counts_the_rest() -> None:
    log, seen = ViolationLog(kept=3), list[Violation]()
    log.listeners.append(seen.append)
    found = [_violation(kind, site, hit) for hit in range(1, 6) for site, kind in
             ((0x10, Check.REDZONE), (0x10, Check.REDZONE), (0x20, Check.REGS))]
    log += found
    assert list(log) == found[:3] and len(log) == 3 and log[-1] is found[2]
    assert log.total == 15 and log.dropped == 12 and bool(log)
    assert (log.of_kind(Check.REDZONE), log.of_kind(Check.REGS), log.of_kind(Check.RESUME)) == (10, 5, 0)
    assert log.hits_flagged(Check.REDZONE) == Counter({0x10: 5})  # two violations, one hit: one flagged hit
    assert log.hits_flagged(Check.REGS) == Counter({0x20: 5})
    assert seen == found
    assert log != found[:3] and ViolationLog.of(found[:3]) == found[:3]  # a log that dropped some is not a list
    assert "only counts the rest" in more_help(log) and more_help(ViolationLog.of(found)) == "--details shows all"
    log.clear()
    assert not log and log.total == 0 and log.hits_flagged(Check.REDZONE) == Counter()


def _session(n: int) -> VerifySession:
    design, workload, spec = BROKEN
    m = Machine(TRIG, [TRIG, workload, str(n)], {}, RunOptions(design=design), GuestIO.captured())
    m.attach(spec)
    session = VerifySession(m)
    m.run()
    return session


def test_a_long_broken_run_keeps_a_bounded_log_with_exact_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _session(300).violations
    assert whole.dropped == 0 and whole.total == 600  # the control: kept whole, two per hit
    monkeypatch.setattr(violations_module, "KEPT", 50)
    bounded = _session(300).violations
    assert len(bounded) == 50 and bounded.total == whole.total and bounded.dropped == 550
    assert list(bounded) == list(whole)[:50]
    assert bounded.of_kind(Check.REDZONE) == whole.of_kind(Check.REDZONE) == 600
    by_hits = Counter(a for a, _hit in {(v.address, v.hit) for v in whole if v.kind is Check.REDZONE})
    assert bounded.hits_flagged(Check.REDZONE) == whole.hits_flagged(Check.REDZONE) == by_hits


def test_check_reports_what_it_did_not_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(violations_module, "KEPT", 10)
    design, workload, spec = BROKEN
    request = CheckRequest(TRIG, [TRIG, workload, "40"], {}, specs=(spec,), designs=(design,))
    report = run_check(request)[0]
    assert report.count(Check.REDZONE) == 80 and len(report.violations) == 10
    out = report.to_json()
    assert out["violations"]["redzone"] == 80 and len(out["details"]) == 10 and out["details_dropped"] == 70
