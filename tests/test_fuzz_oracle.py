"""The oracle and the shrinker: linux-6.18 is caught fast and shrinks small; the fixed designs stay clean."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from emu.errors import UsageError
from emu.fuzz import check_case, fuzz_cases, generate
from emu.fuzz.case import FLAGS_BASE, Case, Store, StoreKind
from emu.fuzz.findings import shrink_finding
from emu.fuzz.shrink import shrink

CLEAN_DESIGNS = ("jmp-slots", "nop10", "int3", "uretprobe-rfc")
ZERO_REGS = (0,) * 15
TRAP_FLAG = 0x100


def first_finding(seed: int, design: str, limit: int) -> tuple[Case, object] | None:
    for index in range(limit):
        case = generate(seed, index)
        verdict = check_case(case, design)
        if verdict.finding:
            return case, verdict
    return None


@pytest.mark.parametrize("seed", [0, 5])
def test_linux_618_is_found_within_50_cases_and_shrinks_to_at_most_3_stores(seed: int) -> None:
    found = first_finding(seed, "linux-6.18", 50)
    assert found is not None
    case, verdict = found
    small, small_verdict = shrink_finding(case, verdict)  # type: ignore[arg-type]
    assert small_verdict.finding and len(small.stores) <= 3
    assert small.origin == {"seed": seed, "index": case.index, "stores": len(case.stores)}


def test_a_red_zone_store_under_a_618_nop5_reads_back_the_trampolines_push() -> None:
    case = Case(0, 0, "nop5", "nop1", (Store(8, 8, StoreKind.MOV, 0x1122334455667788),), ZERO_REGS, FLAGS_BASE)
    verdict = check_case(case, "linux-6.18")
    assert verdict.differs
    assert any("call 2 read rsp-8/8: expected 1122334455667788" in d for d in verdict.differences)
    assert not any(d.startswith("call 1") for d in verdict.differences)  # the first hit traps: still intact
    assert any(v.startswith("redzone:") for v in verdict.violations)
    assert not check_case(case, "jmp-slots").finding


@pytest.mark.parametrize("design", CLEAN_DESIGNS)
def test_the_fixed_designs_have_no_finding_in_300_cases(design: str) -> None:
    bad = [i for i in range(300) if check_case(generate(1, i), design).finding]
    assert bad == []


def test_shrink_removes_stores_and_simplifies_what_does_not_matter() -> None:
    stores = (Store(100, 4, StoreKind.MOV, 0xDEADBEEF), Store(24, 8, StoreKind.MOV, 0xFFFF_FFFF_FFFF_FFFF),
              Store(40, 16, StoreKind.MOVAPS, 3), Store(7, 1, StoreKind.SETCC, 0, "e"))
    case = Case(4, 9, "nop5", "nop5", stores, tuple(range(1, 16)), FLAGS_BASE | 0x41, uretprobe=True)

    def needs_a_qword_near_rsp(c: Case) -> bool:
        return any(s.size == 8 and s.offset <= 32 for s in c.stores)

    small = shrink(case, needs_a_qword_near_rsp)
    assert small.stores == (Store(8, 8, StoreKind.MOV, 0),)
    assert small.regs == ZERO_REGS and small.flags == FLAGS_BASE
    assert small.entry == "nop1" and not small.uretprobe and small.action is None
    assert small.origin["stores"] == 4


def test_shrink_keeps_the_finding_observable_when_it_was() -> None:
    case = next(c for c in (generate(2, i) for i in range(200)) if check_case(c, "linux-6.18").differs)
    verdict = check_case(case, "linux-6.18")
    small, small_verdict = shrink_finding(case, verdict)
    assert small_verdict.differs and 1 <= len(small.stores) <= 3
    assert len(small.stores) <= len(case.stores)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=fuzz_cases())
def test_library_use_jmp_slots_keeps_every_generated_function_intact(case: Case) -> None:
    assert not check_case(case, "jmp-slots").finding


@settings(max_examples=10, deadline=None)
@given(case=fuzz_cases(sites=("nop5",), max_stores=2))
def test_library_use_linux_618_breaks_every_plain_nop5_site(case: Case) -> None:
    verdict = check_case(case, "linux-6.18")
    assert verdict.finding
    assert any(v.startswith("redzone:") for v in verdict.violations)


@pytest.mark.parametrize("trap", ["int3", "jmp ."])
def test_a_hit_that_never_resumes_is_a_resume_violation_of_the_case(trap: str) -> None:
    """Negative control for the runner: a slot that traps (the guest dies) or spins (the runner
    stops it) leaves its hit open, and the verifiers, not only the changed results, say so (a
    jmp-slots slot runs only at the nop5 sites it optimizes)."""
    from dataclasses import replace

    from emu.designs import JMP_SLOT, forget_user_designs, get_design, register

    base = get_design("jmp-slots")
    assert base.trampoline is not None
    slot_tail = JMP_SLOT.split("; ", 1)[1]  # room in the 16-byte slot: the lea goes, the hit never gets that far
    name = f"jmp-slots-{'trap' if trap == 'int3' else 'spin'}"
    register(replace(base, name=name, trampoline=replace(base.trampoline, code=f"{trap}; {slot_tail}")))
    try:
        optimized = [case for case in map(lambda i: generate(3, i), range(40)) if case.site.startswith("nop5")][:4]
        verdicts = [check_case(case, name) for case in optimized]
    finally:
        forget_user_designs()
    assert len(verdicts) == 4 and all(v.finding for v in verdicts)
    assert all(any("never resumed" in line for line in v.violations) for v in verdicts), verdicts[0].violations


def test_the_unmutated_slot_resumes_every_hit() -> None:
    assert not any("never resumed" in line for i in range(5) for line in check_case(generate(3, i), "jmp-slots").violations)


def test_a_case_that_sets_the_trap_flag_dies_as_on_linux_and_leaves_the_next_case_untouched() -> None:
    """popfq with TF set traps after the next instruction (SIGTRAP); the reused process then starts the
    next case from exec's registers, not with TF still set from the last one."""
    fine = generate(0, 0)
    before = check_case(fine, "linux-6.18")
    with pytest.raises(UsageError, match=r"fails unprobed: killed by SIGTRAP at 0x[0-9a-f]+: .*\(debug trap\)"):
        check_case(fine.with_(flags=fine.flags | TRAP_FLAG), "linux-6.18")
    after = check_case(fine, "linux-6.18")
    assert after == before
