"""`uprobe-emu bench`: the kernel's bench_trigger workloads (spec 7) emulated, with per-hit accounting.

Rates are emulated hits per second (they measure the harness, not a CPU); the accounting
is exact: what each design makes the CPU and the kernel do per hit, counted as deltas
against the same workload run without probes.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emu.callret.rsb import RsbModel
from emu.callret.tracker import CallRetTracker
from emu.disasm import cs64
from emu.errors import UsageError
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Consumer
from emu.machine import Machine, RunOptions
from emu.render import table

TRIG = str(Path(__file__).resolve().parent.parent.parent / "elf_samples" / "trig")
KERNEL_PAGES = frozenset({"[uprobes-trampoline]", "[uprobes]"})
NR_UPROBE_SYSCALLS = (335, 336, 462)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    trig: str  # argument of the trig sample
    spec: str | None  # probe spec, None for the baselines


def _workloads() -> dict[str, Workload]:
    targets = {"nop": "uprobe_target_nop", "push": "uprobe_target_push", "ret": "uprobe_target_ret",
               "nop5": "uprobe_target_nop5", "nop10": "uprobe_target_nop10"}
    rows = [Workload("usermode-count", "usermode-count", None), Workload("syscall-count", "syscall-count", None)]
    for kind in ("uprobe", "uretprobe"):
        rows += [Workload(f"{kind}-{t}", t, f"{kind}:{sym}") for t, sym in targets.items()]
    rows += [Workload("usdt-nop", "usdt-nop", "usdt:trig:usdt_1"), Workload("usdt-nop5", "usdt-nop5", "usdt:trig:usdt_2"),
             Workload("usdt-nop10", "usdt-nop10", "usdt:trig:usdt_3")]
    return {w.name: w for w in rows}


WORKLOADS = _workloads()

@dataclass
class Accounting:
    """Per-hit costs (deltas against the unprobed run of the same workload)."""

    insns: float = 0.0
    kernel_page_insns: float = 0.0
    traps: float = 0.0
    syscalls: float = 0.0
    sysret: float = 0.0
    iret: float = 0.0
    calls: float = 0.0
    rets: float = 0.0
    copied: float = 0.0
    rsb_mispredicts: float = 0.0
    single_steps: float = 0.0  # out-of-line steps: a second trap (#DB) each
    uret_returns: float = 0.0  # returns through the uretprobe trampoline
    mmap_locks: float = 0.0  # mmap_lock acquisitions the fake kernel makes on the hit's path

    def values(self) -> tuple[float, ...]:
        return (self.insns, self.kernel_page_insns, self.traps, self.syscalls, self.sysret, self.iret,
                self.calls, self.rets, self.copied, self.rsb_mispredicts, self.single_steps, self.uret_returns,
                self.mmap_locks)

    def row(self) -> tuple[str, ...]:
        return tuple(f"{v:.2f}".rstrip("0").rstrip(".") for v in self.values())


ACCOUNTING_HEADER = ("insns", "in-kernel-pages", "traps", "syscalls", "sysret", "iret", "calls", "rets", "bytes",
                     "rsb-miss", "steps", "uret-returns", "mmap-locks")
RSB_DEPTH = 16


@dataclass
class BenchResult:
    design: str
    workload: str
    rates: list[float]  # M hits/s, one per run
    hits_per_iteration: float
    accounting: Accounting = field(default_factory=Accounting)

    @property
    def mean(self) -> float:
        return statistics.mean(self.rates)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.rates) if len(self.rates) > 1 else 0.0

    def line(self) -> str:
        """The kernel bench's format: ``uprobe-nop5    :    0.183 ± 0.002M/s``."""
        return f"{self.workload:<15}: {self.mean:8.3f} ± {self.stdev:.3f}M/s"

    def to_json(self) -> dict[str, Any]:
        return {"rates_mps": self.rates, "mean_mps": self.mean, "stdev_mps": self.stdev,
                "accounting_per_hit": dict(zip(ACCOUNTING_HEADER, self.accounting.values(), strict=True))}


class _Tally:
    """Instructions, calls and rets executed, and how many ran in the kernel's pages (a block hook)."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.insns = self.kernel = self.calls = self.rets = 0
        self._cache: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._cs = cs64()
        machine.cpu.hooks.add_block(self._on_block)

    def _on_block(self, addr: int, size: int) -> None:
        key = (addr, size)
        info = self._cache.get(key)
        if info is None:
            code = self.machine.mem.read(addr, size)
            insns = list(self._cs.disasm_lite(code, addr))
            last = insns[-1][2] if insns else ""
            info = (len(insns), int(last == "call"), int(last in ("ret", "retq")))
            self._cache[key] = info
        n, call, ret = info
        self.insns += n
        self.calls += call
        self.rets += ret
        vma = self.machine.mem.find(addr)
        if vma is not None and vma.name in KERNEL_PAGES:
            self.kernel += n


def _machine(design: str, workload: Workload, iterations: int) -> tuple[Machine, Consumer | None]:
    m = Machine(TRIG, [TRIG, workload.trig, str(iterations)], {}, RunOptions(design=design), GuestIO.captured())
    consumer = None
    if workload.spec:
        consumer = Consumer()
        m.attach(workload.spec, consumer)
    return m, consumer


def supported(design: str, workload: Workload) -> bool:
    try:
        _machine(design, workload, 1)
    except UsageError:
        return False  # e.g. a nop10 site the design's kernel refuses (-ENOTSUPP)
    return True


def _hits(workload: Workload, consumer: Consumer | None, iterations: int) -> int:
    if consumer is None:
        return iterations
    return consumer.ret_hits if workload.spec and workload.spec.startswith("uretprobe") else consumer.hits


def _timed(design: str, workload: Workload, iterations: int) -> tuple[float, int]:
    m, consumer = _machine(design, workload, iterations)
    start = time.perf_counter()
    result = m.run()
    elapsed = time.perf_counter() - start
    if result.exit_status != 0:
        raise UsageError(f"{workload.name} under {design}: the guest failed ({result.message or result.exit_status})")
    return elapsed, _hits(workload, consumer, iterations)


def measure(design: str, workload: Workload, duration_s: float, runs: int) -> BenchResult:
    startup, _ = _timed(design, workload, 0)
    probe_n = 2000
    t, _ = _timed(design, workload, probe_n)
    per_iter = max((t - startup) / probe_n, 1e-9)
    iterations = max(1000, int(duration_s / per_iter))
    rates = []
    hits = 0
    for _ in range(runs):
        elapsed, hits = _timed(design, workload, iterations)
        rates.append(max(hits, iterations if not workload.spec else hits) / max(elapsed - startup, 1e-9) / 1e6)
    return BenchResult(design, workload.name, rates, hits / iterations, account(design, workload))


@dataclass(frozen=True, slots=True)
class LoopTally:
    """What a run of the loop executed: instructions, calls, rets, RSB mispredicts, syscalls of any kind."""

    insns: int
    calls: int
    rets: int
    mispredicted: int
    syscalls: int


@functools.cache
def unprobed(trig: str, iterations: int) -> LoopTally:
    """The loop without probes: it runs the same under every design (nothing is patched), so it is run once."""
    m, _ = _machine("linux-6.18", Workload(trig, trig, None), iterations)
    t = _Tally(m)
    rsb = RsbModel(CallRetTracker(m), RSB_DEPTH)
    m.run()
    return LoopTally(t.insns, t.calls, t.rets, rsb.stats.mispredicted, sum(m.kernel.counts.values()))


def account(design: str, workload: Workload, iterations: int = 200) -> Accounting:
    """Per-hit deltas: probed run minus the same workload unprobed (first, INT3-only hit excluded by
    differencing two probed runs of different lengths)."""
    def tally(n: int) -> tuple[_Tally, Machine, int, RsbModel]:
        m, consumer = _machine(design, workload, n)
        t = _Tally(m)
        rsb = RsbModel(CallRetTracker(m), RSB_DEPTH)
        m.run()
        return t, m, _hits(workload, consumer, n), rsb

    short, long_ = iterations, iterations * 2
    (a, ma, ha, ra), (b, mb, hb, rb) = tally(short), tally(long_)
    ua, ub = unprobed(workload.trig, short), unprobed(workload.trig, long_)
    hits = max(hb - ha, 1)

    def per(x: float, y: float) -> float:
        return (y - x) / hits

    sa, sb = ma.uprobes.stats, mb.uprobes.stats
    sys_a = sum(ma.kernel.counts[nr] for nr in NR_UPROBE_SYSCALLS)
    sys_b = sum(mb.kernel.counts[nr] for nr in NR_UPROBE_SYSCALLS)
    return Accounting(
        insns=per(a.insns - ua.insns, b.insns - ub.insns),
        kernel_page_insns=per(a.kernel, b.kernel),
        traps=per(sa.traps, sb.traps),
        syscalls=per(sys_a, sys_b),
        sysret=per(sa.exits["sysret"], sb.exits["sysret"]),
        iret=per(sa.exits["iret"], sb.exits["iret"]),
        calls=per(a.calls - ua.calls, b.calls - ub.calls),
        rets=per(a.rets - ua.rets, b.rets - ub.rets),
        copied=per(sa.copied, sb.copied),
        rsb_mispredicts=per(ra.stats.mispredicted - ua.mispredicted, rb.stats.mispredicted - ub.mispredicted),
        single_steps=per(sa.xol_steps, sb.xol_steps),
        uret_returns=per(sa.ret_hits, sb.ret_hits),
        mmap_locks=per(sa.mmap_locks, sb.mmap_locks),
    )


def workloads_from(text: str) -> list[Workload]:
    if text == "all":
        return list(WORKLOADS.values())
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise UsageError(f"--workload {text!r}: unknown {', '.join(unknown)} (known: all, {', '.join(WORKLOADS)})")
    return [WORKLOADS[n] for n in names]


def run_bench(designs: Sequence[str], workloads: Sequence[Workload], duration_s: float, runs: int) -> list[BenchResult]:
    results = []
    for design in designs:
        for workload in workloads:
            if supported(design, workload):
                results.append(measure(design, workload, duration_s, runs))
    return results


def results_table(results: Sequence[BenchResult]) -> str:
    rows: list[tuple[str, ...]] = [("design", "workload", "M/s", *ACCOUNTING_HEADER)]
    for r in results:
        rows.append((r.design, r.workload, f"{r.mean:.3f}±{r.stdev:.3f}", *r.accounting.row()))
    return table(rows)
