"""The published figures and this machine's native times as cost-model rows, per CPU, with the
fits, predictions and validations the bench report and ``bench --predict`` show.

Counts come from the emulator (emu/bench/workloads.py), figures from emu/bench/published.py, native times from
emu/bench/native.py; the model is emu/bench/costmodel.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from emu.bench import published as pub
from emu.bench.costmodel import BASELINE_SYSCALL, CpuRows, Fit, Row, ShareRow, counts_of, fit_cpu
from emu.bench.native import NATIVE_DESIGN, NativeTime
from emu.bench.workloads import WORKLOADS, Workload, account, supported, unprobed
from emu.errors import UsageError

NATIVE_CPU = "native"
UNIT_WORKLOADS = ("uprobe-nop", "usdt-nop")  # the INT3 + emulated nop hit: every table has one


class Counts:
    """Emulated per-hit event counts, computed once per (design, workload) in a process."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[float, ...] | None] = {}

    def of(self, design: str, workload: str) -> tuple[float, ...] | None:
        """None: the design's kernel refuses the workload's probe site."""
        key = (design, workload)
        if key not in self._cache:
            self._cache[key] = self._count(design, WORKLOADS[workload])
        return self._cache[key]

    def _count(self, design: str, workload: Workload) -> tuple[float, ...] | None:
        if workload.spec is None:
            return _baseline(workload)
        if not supported(design, workload):
            return None
        return counts_of(account(design, workload, iterations=50), probed=True)


def _baseline(workload: Workload) -> tuple[float, ...]:
    """An unprobed loop's events per iteration beyond the user-mode loop: its syscalls (SYSRET out)."""
    n = 100
    extra = [(unprobed(w, 2 * n).syscalls - unprobed(w, n).syscalls) / n for w in (workload.trig, "usermode-count")]
    per = extra[0] - extra[1]
    return tuple(per * c for c in BASELINE_SYSCALL)


@dataclass(frozen=True, slots=True)
class Sources:
    """Every CPU's rows, and where each row came from."""

    cpus: tuple[CpuRows, ...]
    figure_of: dict[tuple[str, str], pub.Figure]  # (cpu, row label) -> the published figure

    def cpu(self, slug: str) -> CpuRows:
        for c in self.cpus:
            if c.cpu == slug:
                return c
        known = ", ".join(c.cpu for c in self.cpus)
        raise UsageError(f"unknown CPU {slug!r} (known: {known})")

    def others(self, slug: str) -> list[CpuRows]:
        return [c for c in self.cpus if c.cpu != slug]


def _share_rows(slug: str, counts: Counts, rows: Sequence[Row]) -> list[Row]:
    out = []
    unit = sum(r.ns for r in rows if r.unit) / max(1, sum(1 for r in rows if r.unit))
    for share in pub.SHARES:
        if share.cpu != slug:
            continue
        fig = pub.figure(slug, share.label)
        c = counts.of(fig.design, fig.workload)
        if c is not None:
            out.append(ShareRow(share.label, c, share.event, share.percent / 100, 0.03 * unit).as_row())
    return out


def published_rows(slug: str, counts: Counts) -> tuple[CpuRows, dict[tuple[str, str], pub.Figure]]:
    rows, where = [], {}
    for fig in pub.figures_of(slug):
        c = counts.of(fig.design, fig.workload)
        if c is None:
            continue
        rows.append(Row.from_rate(fig.label, c, fig.mps, fig.err, unit=fig.workload in UNIT_WORKLOADS))
        where[(slug, fig.label)] = fig
    return CpuRows(slug, tuple(rows + _share_rows(slug, counts, rows))), where


def native_rows(times: Sequence[NativeTime], counts: Counts) -> CpuRows:
    rows = []
    for t in times:
        c = counts.of(NATIVE_DESIGN, t.workload)
        if c is not None:
            rows.append(Row(t.workload, c, t.ns, max(t.sigma, 0.02 * t.ns), t.workload in UNIT_WORKLOADS))
    return CpuRows(NATIVE_CPU, tuple(rows))


def sources(counts: Counts, native: Sequence[NativeTime] | None) -> Sources:
    cpus, where = [], {}
    for c in pub.CPUS:
        rows, w = published_rows(c.slug, counts)
        cpus.append(rows)
        where.update(w)
    if native:
        cpus.append(native_rows(native, counts))
    return Sources(tuple(cpus), where)


def cpu_fit(src: Sources, slug: str) -> Fit:
    target = src.cpu(slug)
    return fit_cpu(target, [*src.others(slug), target])


# ------------------------------------------------------------------ validations
@dataclass(frozen=True, slots=True)
class HeldOut:
    cpu: str
    label: str
    measured_ns: float
    predicted_ns: float
    sigma_ns: float

    @property
    def error(self) -> float:
        """Relative error of the predicted rate (= of the time) against the measured one."""
        return self.predicted_ns / self.measured_ns - 1


def held_out(src: Sources, slug: str, drop: Sequence[str], label: str) -> HeldOut:
    """Predict row ``label`` of ``slug`` from a fit without the rows named in ``drop`` (which include it)."""
    target = src.cpu(slug)
    row = next(r for r in target.rows if r.label == label)
    kept = CpuRows(slug, tuple(r for r in target.rows if r.label not in drop))
    ns, sd = fit_cpu(kept, [*src.others(slug), kept]).predict(row.counts)
    return HeldOut(slug, label, row.ns, ns, sd)


def leave_one_out(src: Sources, slug: str) -> list[HeldOut]:
    """Every measured row of one CPU predicted without itself (share constraints on it dropped with it)."""
    target = src.cpu(slug)
    return [held_out(src, slug, with_shares(r.label), r.label) for r in target.rows if r.ns > 0]


def with_shares(label: str) -> tuple[str, ...]:
    """A row's label and those of the published shares of its time (dropped together when it is held out)."""
    return (label, *(f"{s.label} {s.event} share" for s in pub.SHARES if s.label == label))


@dataclass(frozen=True, slots=True)
class ChangeCheck:
    change: pub.Change
    with_share: bool  # the held-out figure's published time share kept in the fit
    predicted: float  # percent
    sigma: float  # percent


def check_change(src: Sources, change: pub.Change, with_share: bool) -> ChangeCheck | None:
    """The published change predicted with its 'after' figure held out (its share kept or not)."""
    target = src.cpu(change.cpu)
    labels = {r.label for r in target.rows}
    if change.before not in labels or change.after not in labels:
        return None
    drop = (change.after,) if with_share else with_shares(change.after)
    h = held_out(src, change.cpu, drop, change.after)
    before = next(r for r in target.rows if r.label == change.before).ns
    pct = (before / h.predicted_ns - 1) * 100
    sigma = before / h.predicted_ns ** 2 * h.sigma_ns * 100
    return ChangeCheck(change, with_share, pct, sigma)


# ------------------------------------------------------------------ predictions
@dataclass(frozen=True, slots=True)
class Prediction:
    design: str
    workload: str
    mps: float
    err_mps: float


def predict(src: Sources, slug: str, designs: Sequence[str], workloads: Sequence[Workload],
            counts: Counts) -> list[Prediction]:
    f = cpu_fit(src, slug)
    out = []
    for design in designs:
        for w in workloads:
            c = counts.of(design, w.name)
            if c is None or not any(c):
                continue  # refused by the design, or nothing to cost (the user-mode loop)
            ns, sd = f.predict(c)
            out.append(Prediction(design, w.name, 1e3 / ns, 1e3 / ns * sd / ns))
    return out

