"""A linear cost model of a probe hit: time per hit = sum over counted events of count x cost.

The counts are the emulator's exact per-hit accounting (emu/bench/workloads.py); the per-event costs are
fitted per CPU from measured rows (native runs on this machine, published tables elsewhere) by
weighted non-negative least squares. A CPU rarely has as many independent rows as there are
events, so every per-CPU fit is regularised towards a *pooled* prior: the costs fitted on all
CPUs' rows together, each CPU's rows expressed in units of its own INT3-nop hit (the one path
every table measures), scaled back by that CPU's INT3-nop time. An event the CPU's rows cannot
separate keeps the pooled cost, and its prior width shows up in the prediction's error bar.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from emu.bench.workloads import Accounting

EVENTS: tuple[str, ...] = ("trap", "single_step", "syscall", "sysret", "iret", "hit", "uret_return", "insn",
                           "rsb_miss", "byte", "mmap_lock")
EVENT_HELP = {
    "trap": "INT3 #BP into the kernel and back (probe or INT3 return trampoline)",
    "single_step": "out-of-line step: the #DB trap and the XOL slot",
    "syscall": "SYSCALL entry (uprobe syscalls and the baseline's getpgid)",
    "sysret": "exit by SYSRET",
    "iret": "exit by IRET (a syscall that cannot SYSRET)",
    "hit": "the consumer chain and the probe lookup, once per hit",
    "uret_return": "a return instance: hijack at entry, unwinding at return",
    "insn": "extra user-mode instructions (trampoline, slot, stepped)",
    "rsb_miss": "extra mispredicted returns (16-entry RSB model)",
    "byte": "bytes the kernel copied from or to user memory",
    "mmap_lock": "mmap_lock acquisitions on the hit's path",
}
PRIOR_SPREAD = 0.5  # a pooled cost is a guess for one CPU to within +-50%
MIN_SIGMA = 0.02  # rows are never trusted to better than 2% (published tables without a +-)
ROBUST_PASSES = 30
IDENTIFIED = 0.5  # an event is "fitted" when the rows shrink its prior sd below this fraction


def counts_of(acc: Accounting, probed: bool) -> tuple[float, ...]:
    """The model's event vector of one emulated per-hit accounting."""
    values = {"trap": acc.traps, "single_step": acc.single_steps, "syscall": acc.syscalls, "sysret": acc.sysret,
              "iret": acc.iret, "hit": 1.0 if probed else 0.0, "uret_return": acc.uret_returns, "insn": acc.insns,
              "rsb_miss": acc.rsb_mispredicts, "byte": acc.copied, "mmap_lock": acc.mmap_locks}
    return tuple(max(float(values[e]), 0.0) for e in EVENTS)


BASELINE_SYSCALL = tuple(1.0 if e in ("syscall", "sysret") else 0.0 for e in EVENTS)
"""The syscall baseline per iteration: one getpgid, entered by SYSCALL and left by SYSRET (spec 2.0)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One measured configuration: its event counts per hit, and its time per hit (ns) with a 1-sigma."""

    label: str
    counts: tuple[float, ...]
    ns: float
    sigma: float
    unit: bool = False  # an INT3-nop hit: the CPU's pooling unit

    @staticmethod
    def from_rate(label: str, counts: tuple[float, ...], mps: float, err_mps: float | None, unit: bool = False) -> Row:
        ns = 1e3 / mps
        rel = max((err_mps or 0.0) / mps, MIN_SIGMA)
        return Row(label, counts, ns, rel * ns, unit)


@dataclass(frozen=True, slots=True)
class ShareRow:
    """A published share of one configuration's time spent in one event: a homogeneous linear constraint."""

    label: str
    counts: tuple[float, ...]
    event: str
    share: float  # 0..1
    scale_ns: float  # the constraint's 1-sigma, in ns

    def as_row(self) -> Row:
        k = EVENTS.index(self.event)
        a = tuple(self.share * c - (c if i == k else 0.0) for i, c in enumerate(self.counts))
        return Row(f"{self.label} {self.event} share", a, 0.0, self.scale_ns)


@dataclass(frozen=True, slots=True)
class Prior:
    mean: tuple[float, ...]  # ns per event
    width: tuple[float, ...]  # 1-sigma, ns


@dataclass(frozen=True, slots=True)
class Fit:
    costs: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    identified: tuple[bool, ...]  # determined by the rows rather than by the prior
    rel_rms: float  # the rows' relative residual, root mean square

    def predict(self, counts: Sequence[float] | np.ndarray) -> tuple[float, float]:
        """Time per hit (ns) and its 1-sigma: the costs' covariance plus the fit's own residual."""
        a = np.asarray(counts, dtype=float)
        ns = float(a @ np.asarray(self.costs))
        var = float(a @ np.asarray(self.cov) @ a)
        return ns, float(np.sqrt(max(var, 0.0) + (self.rel_rms * ns) ** 2))

    def cost(self, event: str) -> float:
        return self.costs[EVENTS.index(event)]


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        grad = a.T @ (b - a @ x)
        candidates = np.where(~passive & (grad > 1e-10 * max(1.0, float(np.abs(grad).max(initial=0.0)))))[0]
        if not candidates.size:
            break
        passive[candidates[np.argmax(grad[candidates])]] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
            x[~passive] = 0.0
    return x


def fit(rows: Sequence[Row], prior: Prior | None = None) -> Fit:
    """Weighted NNLS of the rows, regularised towards ``prior`` when given (a MAP estimate).

    The prior is robust: where the rows pull a cost further than its width from the prior mean, the
    width grows to that distance and the fit is redone, so a CPU whose event costs many times the
    pooled value (a single step under a hypervisor) is fitted from its rows, not talked out of it."""
    a = np.array([r.counts for r in rows], dtype=float).reshape(len(rows), len(EVENTS))
    b = np.array([r.ns for r in rows])
    w = 1.0 / np.array([r.sigma for r in rows])
    if prior is None:
        x = nnls(a * w[:, None], b * w)
        cov = _covariance(a * w[:, None], x) * _residual_scale(a, b, w, x)
        return Fit(_floats(x), _rows(cov), _identified_plain(a), _rel_rms(a, b, x))
    mean, width = np.asarray(prior.mean), np.asarray(prior.width)
    for _ in range(ROBUST_PASSES):
        aw = np.vstack([a * w[:, None], np.diag(1 / width)])
        x = nnls(aw, np.concatenate([b * w, mean / width]))
        wider = np.maximum(width, 2 * np.abs(x - mean))  # at most a half-sigma pull where the rows disagree
        if np.allclose(wider, width, rtol=1e-3):
            break
        width = wider
    cov = _covariance(aw, x)
    data_info = (a * w[:, None]).T @ (a * w[:, None])
    post_sd = np.sqrt(np.diag(np.linalg.pinv(data_info + np.diag(width ** -2.0))))
    identified = tuple(bool(sd < IDENTIFIED * wd) for sd, wd in zip(post_sd, width, strict=True))
    return Fit(_floats(x), _rows(cov), identified, _rel_rms(a, b, x))


def _covariance(aw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The costs' covariance from the weighted design matrix (and prior rows). A cost clamped at zero keeps
    its curvature's variance: it could still be above zero, and a prediction using it must say so."""
    del x  # the same curvature whichever costs the bound made active
    return np.linalg.pinv(aw.T @ aw)


def _rel_rms(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> float:
    measured = b != 0  # share constraints have no time of their own
    rel = (a @ x - b)[measured] / b[measured]
    return float(np.sqrt(np.mean(rel ** 2))) if rel.size else 0.0


def _floats(x: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in x)


def _rows(m: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(_floats(r) for r in m)


def _identified_plain(a: np.ndarray) -> tuple[bool, ...]:
    """Without a prior, event k is determined iff its unit vector lies in the row space of ``a``."""
    _, s, vt = np.linalg.svd(a)
    basis = vt[: int((s > 1e-9 * max(s.max(initial=0.0), 1.0)).sum())]
    return tuple(bool(np.linalg.norm(basis[:, k]) > 1 - 1e-6) for k in range(a.shape[1]))


def _residual_scale(a: np.ndarray, b: np.ndarray, w: np.ndarray, x: np.ndarray) -> float:
    dof: int = a.shape[0] - int(np.linalg.matrix_rank(a))
    if dof <= 0:
        return 1.0
    return max(float(np.sum(((a @ x - b) * w) ** 2)) / dof, 1.0)


# ------------------------------------------------------------------ pooling across CPUs
@dataclass(frozen=True, slots=True)
class CpuRows:
    """One CPU's measured rows (and share constraints, as rows with ns == 0)."""

    cpu: str
    rows: tuple[Row, ...]

    @property
    def has_unit(self) -> bool:
        return any(r.unit for r in self.rows)

    @property
    def unit_ns(self) -> float:
        """The pooling unit: the mean INT3-nop hit time of the rows."""
        units = [r.ns for r in self.rows if r.unit]
        return sum(units) / len(units)

    def without(self, index: int) -> CpuRows:
        return CpuRows(self.cpu, self.rows[:index] + self.rows[index + 1:])


def pooled_costs(cpus: Sequence[CpuRows]) -> tuple[float, ...]:
    """Costs in units of each CPU's INT3-nop hit, fitted on the rows of every CPU that has one."""
    rows = [Row(r.label, r.counts, r.ns / c.unit_ns, r.sigma / c.unit_ns) for c in cpus if c.has_unit for r in c.rows]
    return fit(rows).costs


def scale_to(pooled: Sequence[float], rows: Sequence[Row]) -> float:
    """A CPU's unit when it has no INT3-nop row: the scale of the pooled costs that best fits its rows."""
    p = np.asarray(pooled)
    num = sum(r.ns * float(np.dot(r.counts, p)) / r.sigma ** 2 for r in rows)
    den = sum(float(np.dot(r.counts, p)) ** 2 / r.sigma ** 2 for r in rows)
    return num / den if den > 0 else 1.0


def prior_for(pooled: Sequence[float], unit_ns: float, all_rows: Sequence[Row]) -> Prior:
    """The pooled costs scaled to one CPU, each +-PRIOR_SPREAD, with a width floor so that an event the pool
    put at zero may still take a tenth of the largest event's cost at the largest count it appears with.
    (The floor also keeps every width positive.)"""
    # with nothing pooled (no CPU with an INT3-nop row), a ridge towards zero on the scale of the rows
    top = max(pooled) * unit_ns or max((r.ns for r in all_rows), default=1.0)
    mean, width = [], []
    for k, p in enumerate(pooled):
        most = max((r.counts[k] for r in all_rows), default=1.0) or 1.0
        m = p * unit_ns
        mean.append(m)
        width.append(PRIOR_SPREAD * max(m, 0.1 * top / most))
    return Prior(tuple(mean), tuple(width))


def fit_cpu(target: CpuRows, pool: Sequence[CpuRows]) -> Fit:
    """One CPU's costs: its rows, regularised towards the pool's costs scaled to its INT3-nop time."""
    pooled = pooled_costs(pool)
    unit = target.unit_ns if target.has_unit else scale_to(pooled, target.rows)
    every = [r for c in pool for r in c.rows] + list(target.rows)
    return fit(target.rows, prior_for(pooled, unit, every))


def leave_one_out(target: CpuRows, others: Sequence[CpuRows]) -> list[tuple[Row, float, float]]:
    """Each measured row of ``target`` predicted from a fit without it: (row, predicted ns, 1-sigma)."""
    out = []
    for i, row in enumerate(target.rows):
        if row.ns == 0:
            continue  # a share constraint, not a measurement
        kept = target.without(i)
        ns, sd = fit_cpu(kept, [*others, kept]).predict(row.counts)
        out.append((row, ns, sd))
    return out
