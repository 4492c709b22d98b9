"""The oracle: a case is a finding under a design when its probed run differs from its unprobed
run (the function's registers, flags, sp and read-back red-zone bytes, or how the program ended)
or a verifier (red zone, registers, resume; emu/verify) reports a violation."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from emu.errors import UsageError
from emu.fuzz import layout as L
from emu.fuzz.case import CASE_REGS, Case
from emu.fuzz.codegen import program
from emu.fuzz.runner import CaseRunner, Outcome

_RUNNERS: dict[tuple[str, int | None], CaseRunner] = {}


@dataclass(frozen=True, slots=True)
class Verdict:
    """One case under one design and layout (``aslr``: the ASLR seed, None for off).
    ``expected``/``actual`` (the decoded outputs of the unprobed and probed runs) are filled only
    for findings: decoding costs more than a clean case."""

    design: str
    finding: bool
    differs: bool  # the program's own outputs differ (observable natively), not just a verifier
    expected: dict[str, Any]
    actual: dict[str, Any]
    differences: tuple[str, ...] = ()
    violations: tuple[str, ...] = field(default=())
    aslr: int | None = None

    def summary(self) -> str:
        parts = list(self.differences[:3]) + list(self.violations[:3])
        return "; ".join(parts) if parts else "no difference"

    def to_json(self) -> dict[str, Any]:
        return {"design": self.design, "finding": self.finding, "differs": self.differs,
                "expected": self.expected, "actual": self.actual, "differences": list(self.differences),
                "violations": list(self.violations), "aslr": self.aslr}


def runner_for(design: str, aslr: int | None = None) -> CaseRunner:
    """This process's reusable runner for ``design`` laid out from ``aslr`` (built on first use)."""
    runner = _RUNNERS.get((design, aslr))
    if runner is None:
        runner = _RUNNERS[design, aslr] = CaseRunner(design, aslr)
    return runner


def decode(outcome: Outcome, case: Case) -> dict[str, Any]:
    """The result blocks as named fields, one dict per call."""
    calls = []
    for call in range(L.CALLS):
        block = outcome.results[call * L.BLOCK : (call + 1) * L.BLOCK]
        regs = struct.unpack_from("<15Q", block, L.BLOCK_REGS)
        fields: dict[str, Any] = {("r" + r if not r.startswith("r") else r): hex(v) for r, v in zip(CASE_REGS, regs,
                                                                                                    strict=True)}
        fields["flags"] = hex(struct.unpack_from("<H", block, L.BLOCK_FLAGS)[0])
        fields["sp_delta"] = struct.unpack_from("<q", block, L.BLOCK_SP_DELTA)[0]
        for i, store in enumerate(case.stores):
            at = L.BLOCK_READS + 16 * i
            fields[f"read rsp-{store.offset}/{store.size}"] = block[at : at + store.size][::-1].hex()
        calls.append(fields)
    return {"ending": outcome.ending, "status": outcome.status, "message": outcome.message, "calls": calls}


def differences(expected: dict[str, Any], actual: dict[str, Any]) -> tuple[str, ...]:
    out = [f"{key}: expected {expected[key]}, found {actual[key]}"
           for key in ("ending", "status") if expected[key] != actual[key]]
    for n, (want, got) in enumerate(zip(expected["calls"], actual["calls"], strict=True), start=1):
        out += [f"call {n} {key}: expected {want[key]}, found {got[key]}" for key in want if want[key] != got[key]]
    return tuple(out)


def check_case(case: Case, design: str, reference: Outcome | None = None, aslr: int | None = None) -> Verdict:
    """Run ``case`` unprobed and probed under ``design``; a finding if they differ or a verifier objects.

    ``reference``: the unprobed outcome when the caller already has it (it does not depend on the design,
    but comes from a process of the same layout). ``aslr``: lay the process out from this ASLR seed."""
    runner = runner_for(design, aslr)
    prog = program(case)
    ref = reference if reference is not None else runner.reference(case, prog)
    if ref.ending != "exited" or ref.status != 0:
        raise UsageError(f"case {case.seed}:{case.index} fails unprobed: {ref.message or ref.status}")
    got, violations = runner.probed(case, prog)
    if got == ref and not violations:
        return Verdict(runner.design, False, False, {}, {}, aslr=runner.aslr)  # decoded only when someone will read it
    expected, actual = decode(ref, case), decode(got, case)
    diffs = differences(expected, actual)
    return Verdict(runner.design, bool(diffs or violations), bool(diffs), expected, actual, diffs, tuple(violations),
                   runner.aslr)


def reference_outcome(case: Case, design: str, aslr: int | None = None) -> Outcome:
    runner = runner_for(design, aslr)
    return runner.reference(case, program(case))
