"""The bench page: per workload, what each hit costs under each design (traps, uprobe syscalls,
SYSRET and IRET exits, extra calls and rets, return mispredicts) as grouped bars, the bytes the
kernel copied, and beside them the published native rates of the designs' patches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from emu.report import svg
from emu.report.html import Page

if TYPE_CHECKING:
    from emu.bench import BenchResult

EVENTS = (("traps", "traps"), ("syscalls", "syscalls"), ("sysret", "SYSRET"), ("iret", "IRET"), ("calls", "calls"),
          ("rets", "rets"), ("rsb_mispredicts", "RSB misses"))
# The published native figures this page needs, from ../shared/notes/published-figures.md (kept here,
# small, until the project has one module of published figures). The 6.18 optimization's commit
# message (section 2; spec 7), M/s, as emu/bench.py's Markdown report uses them (the linux-6.18 design).
PUBLISHED_618 = {
    "uprobe-nop": 3.148, "uprobe-push": 2.976, "uprobe-ret": 1.068, "uprobe-nop5": 7.038,
    "uretprobe-nop": 2.109, "uretprobe-push": 2.035, "uretprobe-ret": 0.908, "uretprobe-nop5": 3.377,
    "syscall-count": 14.3,
}
# Section 3: the uretprobe syscall RFC on an i7-1165G7, M/s,
# (current INT3 return trampoline, with the syscall): the int3 and uretprobe-rfc designs.
PUBLISHED_RFC = {
    "uprobe-nop": (2.797, 2.841), "uprobe-push": (2.580, 2.666), "uprobe-ret": (1.001, 1.037),
    "uretprobe-nop": (1.373, 1.718), "uretprobe-push": (1.346, 1.658), "uretprobe-ret": (0.747, 0.853),
}
# Section 1: the red-zone fix, usdt workloads per CPU, M/s: (usdt-nop, usdt-nop5-base, usdt-nop5-fix),
# that is INT3, the linux-6.18 call trampoline and the jmp-slots design.
PUBLISHED_FIX = {"Skylake": (3.149, 6.422, 4.865), "Milan": (2.910, 3.443, 3.820),
                 "Sapphire Rapids": (1.896, 4.023, 3.693), "Bergamo": (3.393, 3.895, 3.849)}


def _probed(results: Sequence[BenchResult]) -> list[BenchResult]:
    return [r for r in results if r.accounting.traps or r.accounting.syscalls or r.accounting.copied]


def _ordered(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def events_figure(results: Sequence[BenchResult], workload: str, designs: Sequence[str]) -> svg.Bars:
    values = {(label, r.design): float(getattr(r.accounting, name)) for r in results if r.workload == workload
              for name, label in EVENTS}
    return svg.Bars([label for _, label in EVENTS], designs, values, " per hit")


def native_figure(workloads: Sequence[str]) -> svg.Bars | None:
    series = ("6.18 commit", "RFC: INT3 return", "RFC: uretprobe syscall")
    values: dict[tuple[str, str], float] = {}
    for w in workloads:
        if w in PUBLISHED_618:
            values[(w, series[0])] = PUBLISHED_618[w]
        if w in PUBLISHED_RFC:
            values[(w, series[1])], values[(w, series[2])] = PUBLISHED_RFC[w]
    shown = [w for w in workloads if any((w, s) in values for s in series)]
    present = [s for s in series if any((w, s) in values for w in shown)]
    return svg.Bars(shown, present, values, " M/s") if shown else None


def page(results: Sequence[BenchResult], command: str) -> Page:
    p = Page("uprobe-emu bench", command)
    designs = _ordered([r.design for r in results])
    p.para("Emulated rates measure the harness, not a CPU; the per-hit counts are exact and are what explains "
           "the native rates: fewer traps and exits, and calls that pair with rets, make a hit cheaper.")
    p.table(("design", "workload", "emulated M/s", "native 6.18 M/s", "insns", "traps", "syscalls", "sysret", "iret",
             "calls", "rets", "bytes copied", "RSB misses"),
            [(r.design, r.workload, f"{r.mean:.3f}", PUBLISHED_618.get(r.workload, "-"), *r.accounting.row()[:1],
              *r.accounting.row()[2:]) for r in results], numeric=tuple(range(2, 13)))
    probed = _probed(results)
    workloads = _ordered([r.workload for r in probed])
    for workload in workloads:
        p.heading(workload, 3)
        with p.row():
            p.figure(svg.grouped_bars(events_figure(probed, workload, designs), 560, 230, f"{workload}: events per hit"),
                     f"{workload}: per-hit events by design (probed run minus the unprobed one)", "bench-events",
                     workload=workload)
            native = native_figure([workload])
            if native is not None:
                p.figure(svg.grouped_bars(native, 330, 230, "published native M/s"),
                         "as published: the 6.18 nop5 optimization (linux-6.18); the uretprobe syscall RFC on an "
                         "i7-1165G7 (int3, uretprobe-rfc)", "bench-native", workload=workload)
    p.heading("Bytes copied; the red-zone fix as published", 2)
    with p.row():
        if probed:
            copied = svg.Bars(workloads, designs, {(r.workload, r.design): r.accounting.copied for r in probed}, " bytes")
            p.figure(svg.grouped_bars(copied, 450, 240, "bytes the kernel copied per hit"),
                     "bytes copied to or from user memory per hit", "bench-copied")
        _fix_figure(p)
    return p


def _fix_figure(p: Page) -> None:
    fix = svg.Bars(list(PUBLISHED_FIX), ("usdt-nop (INT3)", "nop5-base (linux-6.18)", "nop5-fix (jmp-slots)"),
                   {(cpu, s): v for cpu, row in PUBLISHED_FIX.items()
                    for s, v in zip(("usdt-nop (INT3)", "nop5-base (linux-6.18)", "nop5-fix (jmp-slots)"), row,
                                    strict=True)}, " M/s")
    p.figure(svg.grouped_bars(fix, 450, 240, "the red-zone fix: native M/s per CPU"),
             "usdt workloads as published with the jmp-slots fix: it loses against the call trampoline where IRET "
             "costs more than SYSRET, and stays ahead of INT3 everywhere", "bench-native-fix")
