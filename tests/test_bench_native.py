"""The cost model's native rows: this machine's real kernel timed through counting perf uprobes, and the
model fitted on them. Skipped only where the host cannot run perf uprobes on a 6.18 kernel."""

from __future__ import annotations

import math

import pytest

from emu.bench.costmodel import EVENTS
from emu.bench.model import NATIVE_CPU, Counts, Sources, cpu_fit, leave_one_out, native_rows
from emu.bench.native import NativeTime, measure_native, unavailable_reason

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"native perf uprobes unavailable: {REASON}")
WORKLOADS = ("syscall-count", "uprobe-nop", "uprobe-nop5", "uretprobe-nop")


@pytest.fixture(scope="module")
def native() -> list[NativeTime]:
    return measure_native(WORKLOADS, repeats=2)


def test_every_iteration_is_a_counted_hit(native: list[NativeTime]) -> None:
    assert [t.workload for t in native] == list(WORKLOADS)
    for t in native:
        assert t.hits == t.iterations > 0  # the baseline's "hits" are its iterations
        assert t.ns > 0 and t.sigma >= 0


def test_native_rows_fit_and_each_is_predicted_without_itself(native: list[NativeTime]) -> None:
    counts = Counts()
    rows = native_rows(native, counts)
    assert [r.label for r in rows.rows] == list(WORKLOADS) and rows.has_unit
    trap = EVENTS.index("trap")
    assert [r.counts[trap] for r in rows.rows] == [0, 1, 0, 1]  # nop5 is optimized after its first hit
    src = Sources((rows,), {})  # pooled over this machine alone: the published CPUs are the report's test
    f = cpu_fit(src, NATIVE_CPU)
    assert all(c >= 0 for c in f.costs)
    loo = leave_one_out(src, NATIVE_CPU)
    assert [h.label for h in loo] == list(WORKLOADS)
    assert all(math.isfinite(h.error) and h.sigma_ns > 0 for h in loo)
