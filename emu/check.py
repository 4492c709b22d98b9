"""`uprobe-emu check`: the unprobed reference, then each design with probes and verifiers, side by side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emu.designs import DESIGNS
from emu.errors import UsageError
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions, RunResult
from emu.probes import ProbeSpec, parse_spec, scan_specs
from emu.render import table
from emu.verify.lockstep import Observed, first_divergence
from emu.verify.session import DEFAULT_VERIFIERS, Verifier, VerifySession
from emu.verify.violations import Check, Violation


@dataclass
class DesignReport:
    design: str
    hits: int
    violations: list[Violation]
    same_output: bool
    divergence: str | None
    exits: dict[str, int]
    refused: list[str] = field(default_factory=list)
    result: RunResult | None = None

    def count(self, kind: Check) -> int:
        return sum(1 for v in self.violations if v.kind is kind)

    def to_json(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "violations": {k.value: self.count(k) for k in (Check.REDZONE, Check.REGS, Check.RESUME)},
            "same_output": self.same_output,
            "divergence": self.divergence,
            "exits": self.exits,
            "refused": self.refused,
            "details": [v.to_json() for v in self.violations],
        }


@dataclass(frozen=True, slots=True)
class CheckRequest:
    binary: str
    argv: list[str]
    env: dict[str, str]
    specs: tuple[str, ...] = ()
    designs: tuple[str, ...] = tuple(DESIGNS)
    verifiers: tuple[Verifier, ...] = DEFAULT_VERIFIERS
    options: RunOptions = field(default_factory=RunOptions)
    stdin: bytes = b""


def designs_from(text: str) -> tuple[str, ...]:
    if text == "all":
        return tuple(DESIGNS)
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in DESIGNS]
    if unknown or not names:
        raise UsageError(f"--kernel {text!r}: unknown design {', '.join(unknown)} (known: all, {', '.join(DESIGNS)})")
    return names


def _observe(request: CheckRequest, design: str, probes: bool) -> tuple[Machine, GuestIO]:
    io = GuestIO.captured(request.stdin)
    options = RunOptions(**{**_fields(request.options), "design": design})
    machine = Machine(request.binary, request.argv, request.env, options, io)
    machine.kernel.syscall_log = []
    return machine, io


def _fields(options: RunOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in options.__dataclass_fields__}


def _observed(machine: Machine, io: GuestIO, result: RunResult) -> Observed:
    assert machine.kernel.syscall_log is not None
    return Observed(bytes(io.out), bytes(io.err), result.exit_status, machine.kernel.syscall_log)


def _specs(request: CheckRequest, machine: Machine) -> list[ProbeSpec]:
    if request.specs:
        return [parse_spec(s) for s in request.specs]
    found = scan_specs(machine.resolver)
    if not found:
        raise UsageError(f"{request.binary}: no probe sites found (give some with -p)")
    return found


def run_design(request: CheckRequest, design: str, reference: Observed) -> DesignReport:
    machine, io = _observe(request, design, probes=True)
    refused: list[str] = []
    for spec in _specs(request, machine):
        try:
            machine.attach(spec)
        except UsageError as err:
            if request.specs:
                raise
            refused.append(str(err))  # e.g. a nop10 the design's kernel refuses (-ENOTSUPP)
    session = VerifySession(machine, request.verifiers)
    result = machine.run()
    divergence = first_divergence(reference, _observed(machine, io, result))
    hits = sum(int(p["hits"]) for p in result.probes)
    return DesignReport(design, hits, session.violations, divergence is None, divergence, result.exits, refused, result)


def run_check(request: CheckRequest) -> list[DesignReport]:
    machine, io = _observe(request, request.designs[0], probes=False)
    reference = _observed(machine, io, machine.run())
    return [run_design(request, design, reference) for design in request.designs]


def check_table(reports: Sequence[DesignReport]) -> str:
    header = ("design", "hits", "redzone", "regs", "resume", "same output", "sysret", "iret")
    rows = [header]
    for r in reports:
        rows.append((r.design, str(r.hits), str(r.count(Check.REDZONE)), str(r.count(Check.REGS)),
                     str(r.count(Check.RESUME)), "yes" if r.same_output else "no",
                     str(r.exits.get("sysret", 0)), str(r.exits.get("iret", 0))))
    return table(rows)
