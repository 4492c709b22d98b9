"""The cost model: it recovers the costs a synthetic dataset was generated from, fails to when an event
the data depend on is hidden from it, keeps costs non-negative, and leans on the pooled prior only where
a CPU's rows cannot decide."""

from __future__ import annotations

import numpy as np
import pytest

from emu.bench.costmodel import EVENTS, CpuRows, Prior, Row, ShareRow, fit, fit_cpu, nnls, pooled_costs

RNG_SEED = 17
TRUE_NS = np.array([280.0, 600.0, 70.0, 5.0, 60.0, 40.0, 40.0, 0.4, 8.0, 0.7, 30.0])  # one per event


def synthetic(costs: np.ndarray, n_rows: int, seed: int = RNG_SEED, hide: str | None = None) -> list[Row]:
    """Rows whose times are exactly counts @ costs; ``hide``: that event's count is withheld from the rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_rows):
        counts = rng.integers(0, 3, len(EVENTS)).astype(float)
        counts[EVENTS.index("insn")] *= 6
        counts[EVENTS.index("byte")] *= 32
        if i == 0:  # the INT3-nop hit every CPU's table has: its pooling unit
            counts = np.array([1.0 if e in ("trap", "hit") else 0.0 for e in EVENTS])
        ns = float(counts @ costs)
        if hide is not None:
            counts[EVENTS.index(hide)] = 0.0
        rows.append(Row(f"r{i}", tuple(counts), ns, 0.01 * ns, unit=i == 0))
    return rows


def test_recovers_the_costs_it_was_generated_from() -> None:
    f = fit(synthetic(TRUE_NS, 30))
    assert np.allclose(f.costs, TRUE_NS, rtol=1e-6)
    assert f.rel_rms < 1e-9 and all(f.identified)


@pytest.mark.parametrize("hidden", ["trap", "iret", "mmap_lock"])
def test_negative_control_hiding_an_event_leaves_the_rows_unexplained(hidden: str) -> None:
    f = fit(synthetic(TRUE_NS, 30, hide=hidden))
    assert f.rel_rms > 0.01
    assert not np.allclose(f.costs, TRUE_NS, rtol=0.05)


def test_nnls_keeps_costs_non_negative_where_plain_least_squares_does_not() -> None:
    a = np.array([[1.0, 1.0], [1.0, 1.001], [1.0, 0.999]])
    b = np.array([1.0, 0.9, 1.1])  # plain least squares wants a large negative second cost
    plain = np.linalg.lstsq(a, b, rcond=None)[0]
    x = nnls(a, b)
    assert plain.min() < 0 and x.min() >= 0
    grad = a.T @ (b - a @ x)  # KKT: no improving direction among the clamped costs
    assert all(g <= 1e-9 for g, v in zip(grad, x, strict=True) if v == 0)


def test_a_prior_fills_what_few_rows_cannot_decide_and_says_so() -> None:
    rows = synthetic(TRUE_NS, 3)
    prior = Prior(tuple(TRUE_NS * 1.2), tuple(TRUE_NS * 0.5))
    f = fit(rows, prior)
    assert not all(f.identified)  # three rows, eleven events
    for r in rows:
        assert f.predict(r.counts)[0] == pytest.approx(r.ns, rel=0.03)
    unseen = np.zeros(len(EVENTS))
    unseen[EVENTS.index("single_step")] = 1.0
    assert f.predict(unseen)[1] > f.predict(rows[0].counts)[1] * 0.1  # the prior's width shows in the error bar


def test_rows_far_from_the_prior_win_over_it() -> None:
    costs = TRUE_NS.copy()
    costs[EVENTS.index("single_step")] *= 25  # a single step under a hypervisor
    rows = synthetic(costs, 30)
    f = fit(rows, Prior(tuple(TRUE_NS), tuple(TRUE_NS * 0.5)))
    assert f.cost("single_step") == pytest.approx(costs[EVENTS.index("single_step")], rel=0.05)


def test_pooling_carries_costs_across_cpus_in_units_of_their_int3_hit() -> None:
    fast, slow = synthetic(TRUE_NS, 30), synthetic(2 * TRUE_NS, 30, seed=3)
    unit_fast = fast[0].ns
    pooled = np.asarray(pooled_costs([CpuRows("fast", tuple(fast)), CpuRows("slow", tuple(slow))]))
    assert pooled * unit_fast == pytest.approx(TRUE_NS, rel=1e-6)  # the slow CPU is the fast one scaled
    few = CpuRows("slow-few", tuple(synthetic(2 * TRUE_NS, 4, seed=5)))
    f = fit_cpu(few, [CpuRows("fast", tuple(fast)), few])
    held = synthetic(2 * TRUE_NS, 12, seed=9)[4:]
    errors = [abs(f.predict(r.counts)[0] / r.ns - 1) for r in held]
    assert np.median(errors) < 0.25


def test_a_share_row_fixes_one_event_against_the_rest() -> None:
    counts = tuple(1.0 if e in ("syscall", "iret", "hit") else 0.0 for e in EVENTS)
    share = ShareRow("fix", counts, "iret", 0.4, 1.0).as_row()
    total = Row("fix", counts, 100.0, 1.0)
    sys_hit = Row("sys+hit", tuple(1.0 if e in ("syscall", "hit") else 0.0 for e in EVENTS), 60.0, 1.0)
    f = fit([total, share, sys_hit])
    assert f.cost("iret") == pytest.approx(40.0, rel=1e-6)
    no_share = fit([total, sys_hit])
    assert no_share.cost("iret") == pytest.approx(40.0, rel=1e-6)  # implied by the two rows too
    wrong = fit([total, ShareRow("fix", counts, "iret", 0.1, 1.0).as_row(), sys_hit])  # negative control
    assert wrong.rel_rms > 0.05 or wrong.cost("iret") < 30
