"""The native benchmark figures published with the kernel patches this project models, as data.

Every record names the table it was copied from (published-figures.md in the project's
reference notes, section numbers below) and the design and bench workload it measures, so the
report can set it beside the emulated per-hit counts and the cost model can fit it. Rates are
M hits/s, single thread, the kernel's ``bench`` tool; ``err`` is the published ± where one was given.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Source(Enum):
    """Which published table a figure comes from (sections of published-figures.md)."""

    REDZONE_FIX = "published-figures.md §1: red-zone fix, per-CPU usdt table"
    LINUX_618 = "published-figures.md §2 / spec §7: the 6.18 nop5-optimization commit message"
    URETPROBE_RFC_INTEL = "published-figures.md §3: uretprobe syscall RFC, Intel i7-1165G7 table"
    URETPROBE_RFC_AMD = "published-figures.md §3: uretprobe syscall RFC, AMD Ryzen 7 5700U table"
    RSB = "published-figures.md §4: BPF trampoline return-stack balance thread"
    THIS_PROJECT = "published-figures.md §5: this project's machines, counting perf uprobe"


@dataclass(frozen=True, slots=True)
class Cpu:
    slug: str  # what --predict takes
    name: str
    source: Source


@dataclass(frozen=True, slots=True)
class Figure:
    """One published rate: ``label`` as published, measured on ``cpu`` with ``design`` running ``workload``."""

    cpu: str
    label: str
    design: str
    workload: str
    mps: float
    err: float | None
    source: Source


@dataclass(frozen=True, slots=True)
class Change:
    """A published relative change between two figures of one CPU (``percent`` as posted)."""

    cpu: str
    label: str
    before: str  # Figure.label of the base
    after: str
    percent: float
    source: Source


@dataclass(frozen=True, slots=True)
class Share:
    """A published share of one figure's time spent in one event (the fix's ``iret%``)."""

    cpu: str
    label: str  # Figure.label whose time it splits
    event: str  # cost-model event name
    percent: float
    source: Source


@dataclass(frozen=True, slots=True)
class RsbFigure:
    """A BPF trampoline rate of §4, with the rsb_shapes sample shape that mirrors it (None: no shape)."""

    label: str
    shape: str | None
    mps_low: float
    mps_high: float
    source: Source = Source.RSB


REDZONE_CPUS = ("skylake", "milan", "sapphire-rapids", "bergamo")

CPUS: tuple[Cpu, ...] = (
    Cpu("skylake", "Intel Skylake", Source.REDZONE_FIX),
    Cpu("milan", "AMD Milan", Source.REDZONE_FIX),
    Cpu("sapphire-rapids", "Intel Sapphire Rapids", Source.REDZONE_FIX),
    Cpu("bergamo", "AMD Bergamo", Source.REDZONE_FIX),
    Cpu("intel-6.18", "Intel (the 6.18 commit's machine)", Source.LINUX_618),
    Cpu("i7-1165g7", "Intel 11th Gen Core i7-1165G7", Source.URETPROBE_RFC_INTEL),
    Cpu("ryzen7-5700u", "AMD Ryzen 7 5700U", Source.URETPROBE_RFC_AMD),
)


def _redzone() -> list[Figure]:
    table = {  # usdt-nop, usdt-nop5-base, usdt-nop5-fix
        "skylake": (3.149, 6.422, 4.865), "milan": (2.910, 3.443, 3.820),
        "sapphire-rapids": (1.896, 4.023, 3.693), "bergamo": (3.393, 3.895, 3.849),
    }
    rows = []
    for cpu, (nop, base, fix) in table.items():
        rows += [Figure(cpu, "usdt-nop", "int3", "usdt-nop", nop, None, Source.REDZONE_FIX),
                 Figure(cpu, "usdt-nop5-base", "linux-6.18", "usdt-nop5", base, None, Source.REDZONE_FIX),
                 Figure(cpu, "usdt-nop5-fix", "jmp-slots", "usdt-nop5", fix, None, Source.REDZONE_FIX)]
    return rows


def _linux_618() -> list[Figure]:
    # §2 gives uprobe-nop, uprobe-nop5 and uprobe-ret; the commit message's other rows are quoted in spec §7
    table = {"uprobe-nop": 3.148, "uprobe-push": 2.976, "uprobe-ret": 1.068, "uprobe-nop5": 7.038,
             "uretprobe-nop": 2.109, "uretprobe-push": 2.035, "uretprobe-ret": 0.908, "uretprobe-nop5": 3.377,
             "syscall-count": 14.3}
    return [Figure("intel-6.18", w, "linux-6.18", w, v, None, Source.LINUX_618) for w, v in table.items()]


def _rfc(cpu: str, source: Source, rows: dict[str, tuple[float, float, float, float]]) -> list[Figure]:
    """``rows``: workload -> (current, ±, with the syscall, ±); 'base' is the syscall baseline."""
    out = []
    for label, (cur, cur_err, new, new_err) in rows.items():
        workload = "syscall-count" if label == "base" else label
        out += [Figure(cpu, f"{label} (current)", "int3", workload, cur, cur_err, source),
                Figure(cpu, f"{label} (syscall)", "uretprobe-rfc", workload, new, new_err, source)]
    return out


FIGURES: tuple[Figure, ...] = (
    *_redzone(),
    *_linux_618(),
    *_rfc("i7-1165g7", Source.URETPROBE_RFC_INTEL, {
        "base": (15.173, 0.052, 15.704, 0.076), "uprobe-nop": (2.797, 0.090, 2.841, 0.008),
        "uprobe-push": (2.580, 0.007, 2.666, 0.029), "uprobe-ret": (1.001, 0.003, 1.037, 0.008),
        "uretprobe-nop": (1.373, 0.002, 1.718, 0.010), "uretprobe-push": (1.346, 0.002, 1.658, 0.008),
        "uretprobe-ret": (0.747, 0.001, 0.853, 0.004)}),
    *_rfc("ryzen7-5700u", Source.URETPROBE_RFC_AMD, {
        "base": (5.702, 0.003, 5.669, 0.004), "uprobe-nop": (1.505, 0.011, 1.539, 0.001),
        "uprobe-push": (1.388, 0.008, 1.385, 0.003), "uprobe-ret": (0.825, 0.001, 0.819, 0.001),
        "uretprobe-nop": (0.782, 0.001, 0.889, 0.001), "uretprobe-push": (0.750, 0.001, 0.846, 0.001),
        "uretprobe-ret": (0.544, 0.001, 0.594, 0.000)}),
)

CHANGES: tuple[Change, ...] = (
    Change("skylake", "nop5-change", "usdt-nop5-base", "usdt-nop5-fix", -24.3, Source.REDZONE_FIX),
    Change("milan", "nop5-change", "usdt-nop5-base", "usdt-nop5-fix", +11.0, Source.REDZONE_FIX),
    Change("sapphire-rapids", "nop5-change", "usdt-nop5-base", "usdt-nop5-fix", -8.2, Source.REDZONE_FIX),
    Change("bergamo", "nop5-change", "usdt-nop5-base", "usdt-nop5-fix", -1.2, Source.REDZONE_FIX),
    *(Change(cpu, w, f"{w} (current)", f"{w} (syscall)", pct, source)
      for cpu, source, changes in (("i7-1165g7", Source.URETPROBE_RFC_INTEL, (25, 23, 14)),
                                   ("ryzen7-5700u", Source.URETPROBE_RFC_AMD, (13, 12, 9)))
      for w, pct in zip(("uretprobe-nop", "uretprobe-push", "uretprobe-ret"), changes, strict=True)),
)

SHARES: tuple[Share, ...] = tuple(
    Share(cpu, "usdt-nop5-fix", "iret", pct, Source.REDZONE_FIX)
    for cpu, pct in (("skylake", 39.1), ("milan", 24.3), ("sapphire-rapids", 24.9), ("bergamo", 24.5)))

RSB_FIGURES: tuple[RsbFigure, ...] = (
    RsbFigure("fexit, original shape (call, add rsp 8)", "a", 76, 76),
    RsbFigure("fexit, intermediate fix", "b", 84, 86),
    RsbFigure("fexit, calls and rets paired", "c", 137, 137),
    RsbFigure("fentry", None, 130, 130),
    RsbFigure("livepatch via the BPF trampoline, before", None, 99, 99),
    RsbFigure("livepatch via the BPF trampoline, after", None, 200, 200),
    RsbFigure("livepatch with return thunks, before", None, 58, 58),
    RsbFigure("livepatch with return thunks, after", None, 52, 52),
)

# §5: a counting perf uprobe on this project's machines (the same consumer the native fit uses)
THIS_PROJECT: tuple[Figure, ...] = (
    Figure("this-project", "optimized nop5", "linux-6.18", "uprobe-nop5", 1.63, None, Source.THIS_PROJECT),
    Figure("this-project", "INT3", "linux-6.18", "uprobe-nop", 1.26, None, Source.THIS_PROJECT),
)


def cpu(slug: str) -> Cpu | None:
    return next((c for c in CPUS if c.slug == slug), None)


def figures_of(slug: str) -> list[Figure]:
    return [f for f in FIGURES if f.cpu == slug]


def figure(slug: str, label: str) -> Figure:
    return next(f for f in FIGURES if f.cpu == slug and f.label == label)
