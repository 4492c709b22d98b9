"""Native per-hit times on this machine: the trig sample run by the real kernel with a counting
perf uprobe (emu/native.py), as the cost model's rows for this CPU.

A row's time per hit is the difference between two run lengths of the child's CPU time
(user + system, where the kernel's probe handling is charged), so start-up and attaching
cancel out; the unprobed loop's own time per iteration is subtracted. The machine is shared,
so each length is run a few times and the median of the per-hit estimates is kept, with their
spread as the row's sigma.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from emu.bench.workloads import TRIG, WORKLOADS, Workload, _machine
from emu.errors import UsageError
from emu.native import NativeProbe, NativeUnavailable, available, run_native

# what the real 6.18 kernel here can run (it refuses the cs-prefixed nop10, spec 3.1)
NATIVE_WORKLOADS = ("syscall-count", "uprobe-nop", "uprobe-push", "uprobe-ret", "uprobe-nop5", "uretprobe-nop",
                    "uretprobe-push", "uretprobe-ret", "uretprobe-nop5", "usdt-nop", "usdt-nop5")
NATIVE_DESIGN = "linux-6.18"
TARGET_S = 0.05  # CPU seconds for the shorter run of a pair
REPEATS = 5


@dataclass(frozen=True, slots=True)
class NativeTime:
    workload: str
    ns: float  # per hit (per iteration for the baseline), unprobed loop subtracted
    sigma: float
    hits: int  # hits counted by the perf probe in the longest run (iterations for the baseline)
    iterations: int


def unavailable_reason() -> str | None:
    """Why this machine cannot time native hits, or None."""
    if not available("6.18"):
        return "needs root, the uprobe perf PMU and a Linux 6.18 kernel (the linux-6.18 design's native side)"
    if not os.path.exists(TRIG):
        return f"{TRIG} is missing (make -C fixtures)"
    return None


def _probes(workload: Workload) -> list[NativeProbe]:
    if workload.spec is None:
        return []
    from emu.diff import native_probe  # the differential tests' resolver: same site, same semaphore

    # an unprobed machine: one with the probe attached already holds its INT3, and libbpf's nop-combo
    # rule must see the file's nop1+nop5 to put a USDT probe on the nop5 (spec 3.8)
    machine, _ = _machine(NATIVE_DESIGN, Workload(workload.name, workload.trig, None), 1)
    return [native_probe(machine, workload.spec)]


def _cpu_s(workload: Workload, probes: list[NativeProbe], n: int) -> tuple[float, int]:
    run = run_native([TRIG, workload.trig, str(n)], probes)
    if run.returncode != 0:
        raise UsageError(f"native {workload.name}: trig exited {run.returncode}: {run.stderr.decode(errors='replace')}")
    return run.cpu_s, (run.counts[0] if run.counts else n)


def _calibrated(workload: Workload, probes: list[NativeProbe]) -> int:
    """Iterations for a run of about TARGET_S CPU seconds."""
    n = 2000
    while True:  # grow until a run is long enough for the CPU clock's resolution
        t, _ = _cpu_s(workload, probes, n)
        if t > 0.02 or n >= 1 << 26:
            break
        n *= 4
    return max(1000, int(n * TARGET_S / max(t, 1e-3)))


def _pair(workload: Workload, probes: list[NativeProbe], n: int) -> tuple[float, int]:
    """One estimate of the ns per iteration (runs of n and 3n), and the hits of the longer run."""
    short, _ = _cpu_s(workload, probes, n)
    long_, hits = _cpu_s(workload, probes, 3 * n)
    return (long_ - short) / (2 * n) * 1e9, hits


def measure_native(workloads: tuple[str, ...] = NATIVE_WORKLOADS, repeats: int = REPEATS) -> list[NativeTime]:
    """Time every workload natively; raises NativeUnavailable where this machine cannot.

    The repeats go round all workloads in turn, so a minute when the shared machine is slow
    spreads over every row instead of skewing one."""
    reason = unavailable_reason()
    if reason is not None:
        raise NativeUnavailable(reason)
    names = ("usermode-count", *workloads)
    plans = [(WORKLOADS[name], _probes(WORKLOADS[name])) for name in names]
    sizes = [_calibrated(w, p) for w, p in plans]
    estimates: list[list[float]] = [[] for _ in names]
    hits = [0] * len(names)
    for _ in range(repeats):
        for i, ((w, p), n) in enumerate(zip(plans, sizes, strict=True)):
            ns, hits[i] = _pair(w, p, n)
            estimates[i].append(ns)
    loop, loop_sd = _median_spread(estimates[0])
    out = []
    for i in range(1, len(names)):
        if plans[i][1] and hits[i] != 3 * sizes[i]:
            raise UsageError(f"native {names[i]}: the perf probe counted {hits[i]} hits in {3 * sizes[i]} iterations")
        ns, sd = _median_spread(estimates[i])
        out.append(NativeTime(names[i], ns - loop, (sd ** 2 + loop_sd ** 2) ** 0.5, hits[i], 3 * sizes[i]))
    return out


def _median_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), statistics.stdev(values) if len(values) > 1 else 0.0
