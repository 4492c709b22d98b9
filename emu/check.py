"""`uprobe-emu check`: the unprobed reference, then each design with probes and verifiers, side by side."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from emu.callret.rsb import RsbModel, RsbStats
from emu.callret.tracker import CallRetTracker
from emu.designs import DESIGNS, known_designs
from emu.errors import EmuError, ProbeRefused, UsageError
from emu.guestio import GuestIO
from emu.lockstep import Observed, SyscallLog, first_divergence
from emu.machine import Machine, RunOptions, RunResult
from emu.probes import ProbeSpec, parse_spec, scan_specs
from emu.render import table
from emu.runtypes import LIMITS
from emu.verify.session import DEFAULT_VERIFIERS, Verifier, VerifySession
from emu.violations import Check, ViolationLog


@dataclass
class DesignReport:
    design: str
    hits: int
    violations: ViolationLog
    same_output: bool
    divergence: str | None
    exits: dict[str, int]
    refused: list[str] = field(default_factory=list)
    result: RunResult | None = None
    shstk: bool = False  # the shadow stack was on: Check.SHSTK counted
    rsb: RsbStats | None = None  # the probed run's RSB model (--rsb)
    rsb_reference: RsbStats | None = None  # the unprobed run's
    trace: Any = None  # what CheckRequest.tracer returned for this design's probed machine
    watch: Any = None  # what CheckRequest.watcher returned for it
    reference: RunResult | None = None  # the unprobed run's result
    error: str | None = None  # the design's run could not be made (the other designs still are)

    @property
    def limit(self) -> RunResult | None:
        """The first of the unprobed and the probed run that a limit (--max-insns, --timeout) stopped."""
        return next((r for r in (self.reference, self.result) if r is not None and r.ending in LIMITS), None)

    def count(self, kind: Check) -> int:
        return self.violations.of_kind(kind)

    @property
    def same_output_cell(self) -> str:
        return "failed" if self.error is not None else "yes" if self.same_output else "no"

    @property
    def rsb_extra(self) -> int | None:
        """Mispredicted returns the probes added: probed run minus unprobed run."""
        if self.rsb is None or self.rsb_reference is None:
            return None
        return self.rsb.mispredicted - self.rsb_reference.mispredicted

    @property
    def rsb_per_hit(self) -> float | None:
        extra = self.rsb_extra
        return None if extra is None else extra / self.hits if self.hits else 0.0

    def to_json(self) -> dict[str, Any]:
        kinds = (Check.REDZONE, Check.REGS, Check.RESUME, Check.MEMORY) + ((Check.SHSTK,) if self.shstk else ())
        out = self._json_base(kinds)
        if self.rsb is not None:
            out["rsb"] = {**self.rsb.to_json(), "reference_mispredicted":
                          self.rsb_reference.mispredicted if self.rsb_reference else None,
                          "extra_mispredicted": self.rsb_extra, "mispredicts_per_hit": self.rsb_per_hit}
        return out

    def _json_base(self, kinds: tuple[Check, ...]) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "violations": {k.value: self.count(k) for k in kinds},
            "same_output": self.same_output,
            "divergence": self.divergence,
            "exits": self.exits,
            "refused": self.refused,
            "error": self.error,
            "ending": self.result.ending.value if self.result else None,
            "message": self.result.message if self.result else None,
            "details": [v.to_json() for v in self.violations],
        } | ({"details_dropped": self.violations.dropped} if self.violations.dropped else {})


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
    shstk: bool = False  # a CET shadow stack in every probed run (emu/callret/shstk.py)
    rsb: int | None = None  # an RSB model of this depth in every run, the unprobed one too (emu/callret/rsb.py)
    tracer: Callable[[Machine], Any] | None = None  # called on each probed machine before its run (e.g. --html)
    watcher: Callable[[Machine, VerifySession], Any] | None = None  # as tracer, with the verifiers' session
    lenient: bool = False  # a given spec the design refuses is recorded in ``refused``, not an error
    raise_errors: bool = False  # a refused spec or a failed run raises, not a row (one design asked for: the plugin)


def designs_from(text: str) -> tuple[str, ...]:
    known = known_designs()
    if text == "all":
        return tuple(known)
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--kernel {text!r}: unknown design {', '.join(unknown)} (known: all, {', '.join(known)})")
    return names


def _observe(request: CheckRequest, design: str) -> tuple[Machine, GuestIO]:
    io = GuestIO.captured(request.stdin)
    options = dataclasses.replace(request.options, design=design)
    machine = Machine(request.binary, request.argv, request.env, options, io)
    arity = {row.name: len(row.args) for row in machine.kernel.table.values()}
    machine.kernel.syscall_log = SyscallLog(machine.kernel.sched, machine.mem, lambda name: arity.get(name, 6),
                                            lambda fd: _lists_mappings(machine, fd))
    return machine, io


def _lists_mappings(machine: Machine, fd: int) -> bool:
    from emu.kernel.procfs import MapsFile

    entry = machine.kernel.files.entries.get(fd)
    return entry is not None and isinstance(entry.file, MapsFile)


def _observed(machine: Machine, io: GuestIO, result: RunResult) -> Observed:
    assert machine.kernel.syscall_log is not None
    return Observed(bytes(io.out), bytes(io.err), result.exit_status, machine.kernel.syscall_log,
                    stopped=result.ending in LIMITS)


def _specs(request: CheckRequest, machine: Machine) -> list[ProbeSpec]:
    if request.specs:
        return [parse_spec(s) for s in request.specs]
    found = scan_specs(machine.resolver)
    if not found:
        raise UsageError(f"{request.binary}: no probe sites found (give some with -p)")
    return found


def run_design(request: CheckRequest, design: str, reference: tuple[Observed, RunResult],
               rsb_reference: RsbStats | None = None) -> DesignReport:
    """``design``'s probed run against the reference. A probe the design refuses, or a run the harness
    cannot make under it, is this design's row, not the end of the check; a probe no design can
    attach (a spec naming nothing) is the user's error."""
    if request.raise_errors:
        return _run_design(request, design, reference, rsb_reference)
    try:
        return _run_design(request, design, reference, rsb_reference)
    except UsageError as err:
        if not isinstance(err, ProbeRefused):
            raise
        return _failed(design, str(err), reference[1])
    except EmuError as err:
        return _failed(design, str(err), reference[1])


def _failed(design: str, error: str, reference: RunResult) -> DesignReport:
    return DesignReport(design, 0, ViolationLog(), False, None, {}, reference=reference, error=error)


def _run_design(request: CheckRequest, design: str, reference: tuple[Observed, RunResult],
                rsb_reference: RsbStats | None) -> DesignReport:
    machine, io = _observe(request, design)
    refused: list[str] = []
    for spec in _specs(request, machine):
        try:
            machine.attach(spec)
        except UsageError as err:
            if request.specs and not request.lenient and (request.raise_errors or not isinstance(err, ProbeRefused)):
                raise
            refused.append(str(err))  # e.g. a nop10 the design's kernel refuses (-ENOTSUPP)
    session = VerifySession(machine, request.verifiers, shstk=request.shstk, rsb=request.rsb)
    trace = request.tracer(machine) if request.tracer is not None else None
    watch = request.watcher(machine, session) if request.watcher is not None else None
    result = machine.run()
    session.finish(result.message or result.ending.value, killed=result.signal is not None)
    divergence = first_divergence(reference[0], _observed(machine, io, result))
    hits = sum(int(p["hits"]) for p in result.probes)
    return DesignReport(design, hits, session.violations, divergence is None, divergence, result.exits, refused, result,
                        shstk=session.shadow_stack is not None, rsb=session.rsb.stats if session.rsb else None,
                        rsb_reference=rsb_reference, trace=trace, watch=watch, reference=reference[1])


def run_check(request: CheckRequest) -> list[DesignReport]:
    machine, io = _observe(request, request.designs[0])
    model = RsbModel(CallRetTracker(machine), request.rsb) if request.rsb is not None else None
    result = machine.run()
    reference = _observed(machine, io, result), result
    rsb_reference = model.stats if model else None
    return [run_design(request, design, reference, rsb_reference) for design in request.designs]


def check_table(reports: Sequence[DesignReport]) -> str:
    """One row a design; ``shstk`` (violations) and ``rsb miss/hit`` (mispredicted returns the probes
    added over the unprobed run, per hit) columns appear when those models were on."""
    shstk = any(r.shstk for r in reports)
    rsb = any(r.rsb is not None for r in reports)
    refused = any(r.refused for r in reports)
    header = ("design", "hits", "redzone", "regs", "resume", "memory") + (("shstk",) if shstk else ()) + (
        "same output", "sysret", "iret") + (("rsb miss/hit",) if rsb else ()) + (("refused",) if refused else ())
    rows: list[tuple[str, ...]] = [header]
    for r in reports:
        row: tuple[str, ...] = (r.design, str(r.hits), str(r.count(Check.REDZONE)), str(r.count(Check.REGS)),
                                str(r.count(Check.RESUME)), str(r.count(Check.MEMORY)))
        if shstk:
            row += (str(r.count(Check.SHSTK)) if r.shstk else "-",)
        row += (r.same_output_cell, str(r.exits.get("sysret", 0)), str(r.exits.get("iret", 0)))
        if rsb:
            per_hit = r.rsb_per_hit
            row += (f"{per_hit:.2f}" if per_hit is not None else "-",)
        if refused:
            row += (str(len(r.refused)),)
        rows.append(row)
    return table(rows)
