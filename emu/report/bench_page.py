"""The bench page: per workload, what each hit costs under each design (traps, uprobe syscalls,
SYSRET and IRET exits, extra calls and rets, return mispredicts) as grouped bars, the bytes the
kernel copied, and beside them the published native rates of the designs' patches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from emu.bench import published
from emu.report import svg
from emu.report.html import Page

if TYPE_CHECKING:
    from emu.bench.workloads import BenchResult

EVENTS = (("traps", "traps"), ("syscalls", "syscalls"), ("sysret", "SYSRET"), ("iret", "IRET"), ("calls", "calls"),
          ("rets", "rets"), ("rsb_mispredicts", "RSB misses"))


def _rates(cpu: str) -> dict[str, float]:
    return {f.label: f.mps for f in published.figures_of(cpu)}


# The published native figures beside the counts (emu/bench/published.py): the 6.18 commit's rates (the
# linux-6.18 design), the uretprobe syscall RFC on an i7-1165G7 as (INT3 return, with the syscall)
# (int3, uretprobe-rfc), and the red-zone fix's usdt table per CPU as (usdt-nop, nop5-base, nop5-fix)
# (int3, linux-6.18, jmp-slots).
PUBLISHED_618 = _rates("intel-6.18")
PUBLISHED_RFC = {label.removesuffix(" (current)"): (mps, _rates("i7-1165g7")[label.replace("current", "syscall")])
                 for label, mps in _rates("i7-1165g7").items() if label.endswith(" (current)") and label != "base (current)"}
PUBLISHED_FIX = {c.name: tuple(_rates(c.slug)[k] for k in ("usdt-nop", "usdt-nop5-base", "usdt-nop5-fix"))
                 for c in published.CPUS if c.slug in published.REDZONE_CPUS}


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
