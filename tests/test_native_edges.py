"""The C site and ret hooks (emu/hotpath/edges.py): they settle the clean optimized hits
without Python, and every verdict is the one the Python hooks give."""

from __future__ import annotations

import ctypes
import subprocess
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from emu import hotpath
from emu.cpu import STATE_REGS, snapshots
from emu.designs import DESIGNS, Design, Trampoline
from emu.guestio import GuestIO
from emu.hotpath.edges import REDZONE_LAZY, START_REDZONE_STATUS
from emu.hotpath.write_log import native_hot_path
from emu.kernel.uprobes import x86
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.kernel.uprobes.regs import PtRegs
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession
from emu.violations import Check

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
TARGETS = str(SAMPLES / "probe_targets")
TRIG = str(SAMPLES / "trig")
ITERATIONS = 10
needs_c = pytest.mark.skipif(native_hot_path() is None, reason="the C extension is not in use (not built, or forced off)")
NOP10_RESTORE = "push %rcx; push %r11; push %rax; movq $336,%rax; syscall; pop %rax; pop %r11; pop %rcx"


def _nop10_variant(name: str, after_restore: str) -> Design:
    """The nop10 design with ``after_restore`` run between the trampoline's last pop and its ret."""
    return replace(DESIGNS["nop10"], name=name,
                   trampoline=Trampoline(f"{NOP10_RESTORE}; {after_restore}; ret $128; int3"))


BROKEN = {
    Check.REGS: _nop10_variant("bumps-rcx", "lea 1(%rcx),%rcx"),
    Check.REDZONE: _nop10_variant("flips-a-red-zone-byte", "notb 8(%rsp)"),
}


def _run(path: str, args: list[str], spec: str, design: str | Design, python_only: bool,
         consumer: Consumer | None = None) -> VerifySession:
    m = Machine(path, [path, *args], {}, RunOptions(design=design), GuestIO.captured())
    m.attach(spec, consumer)
    session = VerifySession(m)
    assert (session.tracker.edges is None) == (python_only or native_hot_path() is None)
    m.run()
    return session


def _verdicts(monkeypatch: pytest.MonkeyPatch, path: str, args: list[str], spec: str, design: str | Design,
              consumer: Consumer | None = None) -> tuple[tuple[int, list[tuple[str, int, str]]], ...]:
    """(transactions, violations) with the C hooks, then with Python hooks alone."""
    out = []
    for python_only in (False, True):
        if python_only:
            monkeypatch.setattr(hotpath, "native", None)
        session = _run(path, args, spec, design, python_only, consumer)
        out.append((session.transactions, [(v.kind.value, v.hit, v.summary) for v in session.violations]))
    return tuple(out)


@needs_c
@pytest.mark.parametrize(("design", "workload"), [("linux-6.18", "nop5"), ("nop10", "nop10")])
def test_clean_optimized_hits_are_settled_without_python(design: str, workload: str) -> None:
    session = _run(TRIG, [workload, "200"], f"uprobe:uprobe_target_{workload}", design, python_only=False)
    assert session.transactions == 200
    edges = session.tracker.edges
    assert edges is not None and edges.finished >= 190  # all but the INT3 hit and the first trampoline hits


@pytest.mark.parametrize(("design", "spec"), [
    ("linux-6.18", "uprobe:t_nop5"), ("nop10", "uprobe:t_nop10"), ("jmp-slots", "uprobe:t_nop5"),
    ("int3", "uprobe:t_push"), ("linux-6.18", "uprobe:t_ret"), ("nop10", "uprobe:t_jne"),
])
def test_verdicts_match_the_python_hooks(monkeypatch: pytest.MonkeyPatch, design: str, spec: str) -> None:
    native, python = _verdicts(monkeypatch, TARGETS, [str(ITERATIONS)], spec, design)
    assert native == python
    assert native[0] >= ITERATIONS


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_trampoline_is_handed_to_python_and_caught(monkeypatch: pytest.MonkeyPatch, kind: Check) -> None:
    native, python = _verdicts(monkeypatch, TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", BROKEN[kind])
    assert native == python
    caught = [hit for found, hit, _ in native[1] if found == kind.value]
    assert sorted(set(caught)) == list(range(2, ITERATIONS + 1))  # every trampoline hit (hit 1 is INT3)


@needs_c
def test_a_consumer_that_changes_registers_is_never_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    def change(hit: Hit) -> None:
        hit.regs.cx ^= 1  # a consumer's change: expected, not a violation

    session = _run(TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", "nop10", False, Consumer(handler=change))
    assert session.tracker.edges is not None and session.tracker.edges.finished == 0
    native, python = _verdicts(monkeypatch, TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", "nop10", Consumer(handler=change))
    assert native == python and native[1] == []


@needs_c
@pytest.mark.parametrize("bug", ["stray-store", "flags"])
def test_an_emulation_bug_at_a_cached_site_is_handed_to_python_and_caught(monkeypatch: pytest.MonkeyPatch,
                                                                          bug: str) -> None:
    """A site that is not a NOP, settled from the cached reference in C while the kernel
    emulates it right; from the hit the emulation goes wrong (harmlessly for the program), every
    hit is reported as without the C."""
    original = x86._push
    seen: Counter[int] = Counter()

    def push(up: x86.ProbedProcess, regs: PtRegs, value: int) -> None:
        seen[id(up)] += 1
        original(up, regs, value)
        if seen[id(up)] > ITERATIONS // 2 and bug == "stray-store":
            up.mem.write_user(regs.sp - 16, bytes([seen[id(up)]]))  # below the pushed word, new each hit
        elif seen[id(up)] > ITERATIONS // 2:
            regs.flags ^= 0x10  # AF

    monkeypatch.setattr(x86, "_push", push)
    session = _run(TRIG, ["push", str(ITERATIONS)], "uprobe:uprobe_target_push", "int3", python_only=False)
    assert session.tracker.edges is not None and session.tracker.edges.finished >= ITERATIONS // 2 - 2  # settled in C
    seen.clear()
    native, python = _verdicts(monkeypatch, TRIG, ["push", str(ITERATIONS)], "uprobe:uprobe_target_push", "int3")
    assert native == python and native[0] == ITERATIONS
    kinds = {kind for kind, _, _ in native[1]}
    assert kinds == {(Check.REDZONE if bug == "stray-store" else Check.REGS).value}
    assert {hit for _, hit, _ in native[1]} == set(range(ITERATIONS // 2 + 1, ITERATIONS + 1))


@needs_c
def test_a_hit_whose_evidence_repeats_a_judged_one_gets_its_verdict_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux 6.18's uretprobe leaves the same two red-zone runs changed, the same way, on every hit:
    Python judges one, C gives the rest its violations (emu/hotpath/repeats.py). The report is the
    one the Python hooks give, hit for hit."""
    args, spec = ["nop5", "30"], "uretprobe:uprobe_target_nop5"
    session = _run(TRIG, args, spec, "linux-6.18", python_only=False)
    assert session.tracker.edges is not None and session.tracker.edges.finished >= 25
    native, python = _verdicts(monkeypatch, TRIG, args, spec, "linux-6.18")
    assert native == python
    per_hit = Counter(hit for _, hit, _ in native[1])
    assert set(per_hit) == set(range(2, 31)) and all(per_hit[hit] == 2 for hit in range(3, 31))


TWO_SITES = r"""
#include <stdlib.h>
void site_a(void), site_b(void);
__asm__(".text\n.balign 16\n.globl site_a\n.type site_a,@function\nsite_a:\n .byte 0x0f,0x1f,0x44,0,0\n ret\n"
        ".balign 16\n.globl site_b\n.type site_b,@function\nsite_b:\n .byte 0x0f,0x1f,0x44,0,0\n ret\n");
int main(int argc, char **argv)
{
    for (long i = 0, n = atol(argv[1]); i < n; i++) {
        site_a();
        site_b();
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two nop5 functions called in turn (built here: gcc builds the C extension too)."""
    where = tmp_path_factory.mktemp("two_sites")
    (where / "two_sites.c").write_text(TWO_SITES)
    subprocess.run(["gcc", "-O1", "-static", "-no-pie", "-o", str(where / "two_sites"), str(where / "two_sites.c")],
                   check=True)
    return str(where / "two_sites")


@needs_c
def test_two_sites_that_take_turns_each_repeat_their_own_verdict(two_sites: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each site's judged hit is kept apart (a memo slot a site), so hits at two sites in turn are
    each judged once; the report is the Python hooks' report."""
    def verdicts(python_only: bool) -> tuple[int, list[tuple[int, int, str]]]:
        if python_only:
            monkeypatch.setattr(hotpath, "native", None)
        m = Machine(two_sites, [two_sites, "30"], {}, RunOptions(design="linux-6.18"), GuestIO.captured())
        m.attach("uretprobe:site_a")
        m.attach("uretprobe:site_b")
        session = VerifySession(m)
        m.run()
        edges = session.tracker.edges
        return (0 if edges is None else edges.finished), [(v.address, v.hit, v.summary) for v in session.violations]

    (settled, native), (_, python) = verdicts(False), verdicts(True)
    assert native == python and len({site for site, _, _ in native}) == 2
    assert settled >= 50  # of 60 hits: all but each site's INT3 hit and first judged hits


@needs_c
def test_a_hit_whose_evidence_differs_is_judged_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a trampoline that stores the program's callee-saved registers into the red zone
    leaves different bytes there on every hit; C repeats no verdict, and each hit is reported as the
    Python hooks report it."""
    stores = "; ".join(f"movb %{reg}, {8 + i}(%rsp)" for i, reg in enumerate(("bl", "r12b", "r13b", "r14b", "bpl")))
    design = _nop10_variant("stores-callee-saved", stores)
    session = _run(TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", design, python_only=False)
    assert session.tracker.edges is not None and session.tracker.edges.finished == 0
    native, python = _verdicts(monkeypatch, TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", design)
    assert native == python
    per_hit = [tuple(summary for _, hit, summary in native[1] if hit == n) for n in range(2, ITERATIONS + 1)]
    assert all(per_hit) and len(set(per_hit)) == len(per_hit)  # a red-zone verdict on every hit, none alike


def test_an_execution_of_a_detached_site_is_not_a_hit() -> None:
    """The site hook counts every execution of the site; one the tracker finds detached is taken
    back (hit numbers in reports count hits of the attached probe)."""
    m = Machine(TARGETS, [TARGETS, str(ITERATIONS)], {}, RunOptions(design="linux-6.18"), GuestIO.captured())
    m.attach("uprobe:t_nop5").detach()  # the site runs its own nop5 from the start
    session = VerifySession(m)
    m.run()
    assert session.transactions == 0
    assert session.tracker._counters.hits(0) <= 1  # at most the last one, still open when the run ended


# Whole-CPU snapshots (emu/cpu/snapshots.py): checked before use, and the same verdicts without them.
SNAPSHOT_FLAWS = {
    "xmm0": _nop10_variant("clears-xmm0", "pxor %xmm0,%xmm0"),
    "st0": _nop10_variant("pushes-the-x87-stack", "fld1"),
    "mxcsr": _nop10_variant("changes-mxcsr", "push %rax; stmxcsr (%rsp); xorl $0x8000,(%rsp); ldmxcsr (%rsp); pop %rax"),
    "id-flag": _nop10_variant("toggles-id", "pushf; xorl $0x200000,(%rsp); popf"),
    "df": _nop10_variant("sets-df", "std"),
    "fs-base-untouched": DESIGNS["nop10"],  # the control: nothing changes, nothing is flagged
}


def test_a_snapshot_that_misreads_a_register_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from emu.cpu import Cpu

    assert (found := snapshots.context_snapshots(Cpu())) is not None and found.word_count > 0  # this Unicorn passes
    reads = snapshots._context_reg_read

    def misreads_st7(context: object, reg: int, into: ctypes.Array[ctypes.c_char]) -> int:
        status = int(reads(context, reg, into))
        if reg == STATE_REGS[-1]:
            ctypes.memset(into, 0x11, 1)
        return status

    monkeypatch.setattr(snapshots, "_checked", [])
    monkeypatch.setattr(snapshots, "_context_reg_read", misreads_st7)
    assert snapshots.context_snapshots(Cpu()) is None


@needs_c
@pytest.mark.parametrize("flaw", list(SNAPSHOT_FLAWS))
def test_verdicts_are_the_same_with_and_without_snapshots(monkeypatch: pytest.MonkeyPatch, flaw: str) -> None:
    design = SNAPSHOT_FLAWS[flaw]
    with_snapshots = _run(TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", design, python_only=False)
    assert with_snapshots.tracker.edges is not None and with_snapshots.tracker.edges.snapshots
    monkeypatch.setattr(snapshots, "_checked", [None])  # as where the check fails: registers are read
    without = _run(TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", design, python_only=False)
    assert without.tracker.edges is not None and not without.tracker.edges.snapshots
    seen = [[(v.kind.value, v.hit, v.summary) for v in s.violations] for s in (with_snapshots, without)]
    assert seen[0] == seen[1] and with_snapshots.transactions == without.transactions == ITERATIONS
    flagged = {hit for kind, hit, _ in seen[0] if kind == Check.REGS.value}
    if flaw == "fs-base-untouched":
        assert seen[0] == []
    else:  # the first trampoline hit at least (one that leaves what the last one left changes nothing)
        assert 2 in flagged


@needs_c
def test_the_snapshot_compare_looks_at_the_register_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The words compared hold every register but rip, rsp and rflags (compared apart), a few hundred
    bytes of the whole snapshot. The control: a design that flips r10 on every hit is flagged on the
    hits C judges only while the compare looks at those bytes; rflags is compared apart all the same."""
    from emu.cpu import Cpu

    found = snapshots.context_snapshots(Cpu())
    assert found is not None and 16 * 16 < found.register_bytes < found.size // 4

    def flagged(design: Design) -> int:
        session = _run(TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", design, python_only=False)
        assert session.tracker.edges is not None and session.tracker.edges.snapshots
        return len({v.hit for v in session.violations if v.kind is Check.REGS})

    flips_r10 = _nop10_variant("flips-r10", "not %r10")
    assert flagged(flips_r10) == flagged(SNAPSHOT_FLAWS["id-flag"]) == ITERATIONS - 1  # every trampoline hit
    blind = snapshots.Layout([0, 0], found.rip_offset, found.rsp_offset)  # one word, no byte of it compared
    monkeypatch.setattr(snapshots, "_checked", [blind])
    assert flagged(flips_r10) < ITERATIONS // 2  # the few Python judges itself
    assert flagged(SNAPSHOT_FLAWS["id-flag"]) == ITERATIONS - 1


@needs_c
def test_a_nop_site_copies_the_red_zone_only_once_a_store_reaches_it() -> None:
    """At a NOP-class site the site hook does not copy the red zone; the write log copies it before
    the first guest store into it, and a hit no store reached settles in C. The control: a store
    into it is still flagged on every trampoline hit."""
    clean = _run(TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", "nop10", python_only=False)
    edges = clean.tracker.edges
    assert edges is not None and edges.words[START_REDZONE_STATUS] == REDZONE_LAZY and not edges.has_start_redzone
    assert clean.violations == [] and edges.finished >= ITERATIONS - 2  # settled in C
    broken = _run(TARGETS, [str(ITERATIONS)], "uprobe:t_nop10", BROKEN[Check.REDZONE], python_only=False)
    assert {v.hit for v in broken.violations if v.kind is Check.REDZONE} == set(range(2, ITERATIONS + 1))
