"""Signals inside hits: for every instruction boundary of one hit (boundaries.py) and
every handler the program installs, one run of the whole program with a signal arriving exactly there,
classified against the unprobed program given the same signal at the site, with the verifiers' verdicts.

The signal arrives as Linux delivers one on a return to user mode: a code hook on the boundary's
address, at the right run of it, makes it pending (tkill) and the kernel builds the handler's frame on
the registers there before that instruction runs. During an out-of-line step the kernel holds signals
back and delivers them once the step is done, at the fixed-up ip (spec 4.4, uprobe_deny_signal): the
hook makes the signal pending and queues its delivery behind the step. The program takes the handler
mode as its first argument (as elf_samples/sig_race does).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from emu.abi import SI_TKILL, Signal
from emu.designs import Design, get_design
from emu.errors import EmuError, UsageError
from emu.guestio import GuestIO
from emu.kernel.signal import deliver_pending, send_to_self
from emu.lockstep import Observed, SyscallLog, first_divergence
from emu.machine import Attachment, Machine, RunOptions, RunResult
from emu.probes import ProbeKind, parse_spec
from emu.race.boundaries import Boundary, Role, trace_hit
from emu.race.explore import Describer, each_design
from emu.race.scenario import Site, site_of
from emu.race.signal_report import RunOutcome, SignalReport
from emu.runtypes import LIMITS
from emu.verify.session import VerifySession

SIGNAL = Signal.SIGUSR1


class Handler(enum.Enum):
    """What the program's handler does (elf_samples/sig_race): uses the stack and clobbers every
    caller-saved register, on the thread's stack or a sigaltstack, and returns or siglongjmps out."""

    STACK = "stack"
    ALTSTACK = "altstack"
    LONGJMP = "longjmp"


def parse_handlers(text: str) -> tuple[Handler, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        chosen = tuple(dict.fromkeys(Handler(n) for n in names))
    except ValueError:
        known = ", ".join(h.value for h in Handler)
        raise UsageError(f"--handler {text!r}: unknown handler (known: {known})") from None
    if not chosen:
        raise UsageError("--handler needs at least one of: " + ", ".join(h.value for h in Handler))
    return chosen


@dataclass(frozen=True)
class Target:
    """The program, the probe and which of its hits the signal lands in."""

    binary: str
    spec: str
    hit: int = 2  # the first hit of an optimizing design traps and optimizes; the second takes its path
    args: tuple[str, ...] = ()  # the guest's arguments after the handler mode
    env: dict[str, str] = field(default_factory=dict)
    options: RunOptions = field(default_factory=RunOptions)

    def argv(self, handler: Handler) -> list[str]:
        return [self.binary, handler.value, *self.args]

    @property
    def returns(self) -> bool:
        return parse_spec(self.spec).kind is ProbeKind.URETPROBE


class _Injector:
    """A code hook on one boundary's address: on its ``occurrence``-th run, the signal arrives."""

    def __init__(self, machine: Machine, boundary: Boundary) -> None:
        self.machine, self.boundary = machine, boundary
        self.runs = 0
        self.sent = False
        self.delivered_at: int | None = None  # where the kernel built the handler's frame
        machine.cpu.hooks.add_code(self, boundary.address, boundary.address)
        machine.kernel.signal_frame_observers.append(self._frame)

    def __call__(self, _addr: int, _size: int) -> None:
        self.runs += 1
        if self.runs != self.boundary.occurrence:
            return
        self.sent = True
        kernel = self.machine.kernel
        if self.boundary.stepping:  # spec 4.4: pending through the step, delivered after it
            kernel.signals.pending |= 1 << (SIGNAL - 1)
            kernel.signals.pending_code[SIGNAL] = SI_TKILL
            kernel.deferred.append(functools.partial(deliver_pending, kernel))  # runs after the step's action
        else:
            send_to_self(kernel, SIGNAL, SI_TKILL)  # acted on before the boundary's instruction runs

    def _frame(self, restorer: int | None, ip: int) -> None:
        if restorer is not None and self.sent and self.delivered_at is None:
            self.delivered_at = ip


@dataclass
class _Run:
    observed: Observed | None
    result: RunResult | None
    session: VerifySession | None = None
    injector: _Injector | None = None
    error: str | None = None


def _machine(target: Target, design: Design, handler: Handler) -> tuple[Machine, GuestIO]:
    io = GuestIO.captured()
    machine = Machine(target.binary, target.argv(handler), target.env,
                      dataclasses.replace(target.options, design=design), io)
    arity = {row.name: len(row.args) for row in machine.kernel.table.values()}
    machine.kernel.syscall_log = SyscallLog(machine.kernel.sched, machine.mem, lambda name: arity.get(name, 6))
    return machine, io


def _attach(machine: Machine, spec: str) -> Attachment:
    attachment = machine.attach(spec)
    if not isinstance(attachment, Attachment):
        raise UsageError(f"{spec}: probes in shared libraries are not supported by the signal explorer")
    return attachment


def _run(target: Target, design: Design, handler: Handler, probed: bool, at: Boundary | None) -> _Run:
    """One run of the program, probed (with the verifiers) or not, with the signal at ``at`` (None: no signal)."""
    machine, io = _machine(target, design, handler)
    session = injector = None
    try:
        if probed:
            _attach(machine, target.spec)
        # The verifiers' hooks see the thread reach the boundary first; at the site, the frame the kernel
        # builds there drops the hit they opened, which begins afresh after the handler (verify/signals.py).
        if probed:
            session = VerifySession(machine)
        if at is not None:
            injector = _Injector(machine, at)
        result = machine.run()
    except UsageError:
        raise
    except EmuError as err:
        return _Run(None, None, session, injector, error=str(err))
    if session is not None:
        session.finish(result.message or result.ending.value, killed=result.signal is not None)
    assert machine.kernel.syscall_log is not None
    observed = Observed(bytes(io.out), bytes(io.err), result.exit_status, machine.kernel.syscall_log,
                        stopped=result.ending in LIMITS)
    return _Run(observed, result, session, injector)


def _outcome(run: _Run, reference: _Run, describe: Describer, baseline: RunOutcome | None = None) -> RunOutcome:
    """``run`` against ``reference`` (the unprobed program), with its verdicts; those the probed run
    without a signal (``baseline``) also has are not the signal's doing."""
    delivered = None
    if run.injector is not None and run.injector.delivered_at is not None:
        delivered = describe(run.injector.delivered_at)
    verdicts = _verdicts(run.session)
    if run.error is not None or run.result is None or run.observed is None:
        return RunOutcome("harness error", verdicts, run.error or "no result", delivered, baseline)
    result = run.result
    if result.ending in LIMITS:
        return RunOutcome("harness error", verdicts, f"stopped: {result.message or result.ending.value}",
                          delivered, baseline)
    if result.signal is not None:
        return RunOutcome(f"killed by {result.signal.name}", verdicts, result.message or "", delivered, baseline)
    assert reference.observed is not None
    differs = first_divergence(reference.observed, run.observed)
    return RunOutcome("same output" if differs is None else "differs", verdicts, differs or "", delivered, baseline)


def _verdicts(session: VerifySession | None) -> dict[str, list[str]]:
    """Verifier -> the distinct summaries of what it flagged."""
    found: dict[str, set[str]] = {}
    for v in session.violations if session is not None else ():
        found.setdefault(v.kind.value, set()).add(v.summary)
    return {kind: sorted(summaries) for kind, summaries in found.items()}


class _References:
    """The unprobed runs the probed ones are compared with, made once for every design."""

    def __init__(self, target: Target, site: int) -> None:
        self.target, self.site = target, site
        self._with_signal: dict[Handler, _Run] = {}
        self._quiet: dict[Handler, _Run] = {}

    def with_signal(self, handler: Handler, design: Design) -> _Run:
        """The signal at the site's ``hit``-th run: where a hit would have started."""
        if handler not in self._with_signal:
            at = Boundary(0, self.site, self.target.hit, Role.SITE, "site")
            self._with_signal[handler] = self._checked(_run(self.target, design, handler, False, at), handler)
        return self._with_signal[handler]

    def quiet(self, handler: Handler, design: Design) -> _Run:
        if handler not in self._quiet:
            self._quiet[handler] = self._checked(_run(self.target, design, handler, False, None), handler)
        return self._quiet[handler]

    def _checked(self, run: _Run, handler: Handler) -> _Run:
        if run.observed is None or run.result is None or run.result.ending in LIMITS:
            why = run.error or (run.result.message if run.result else None) or "no result"
            raise UsageError(f"the unprobed run with handler {handler.value} failed: {why}")
        return run


def hit_boundaries(target: Target, design: Design, handler: Handler = Handler.STACK,
                   ) -> tuple[Site, Describer, tuple[Boundary, ...]]:
    """The probed site, how addresses read, and every boundary of ``target``'s hit under ``design``."""
    machine, _io = _machine(target, design, handler)
    site = site_of(design, target.spec, _attach(machine, target.spec).uprobe)
    describe = Describer(machine)
    return site, describe, trace_hit(machine, site, target.hit, target.returns, describe)


def explore_signals(target: Target, design: str | Design, handlers: Sequence[Handler],
                    references: _References | None = None) -> SignalReport:
    """Every boundary of ``target``'s hit under ``design``, one run per boundary and handler."""
    chosen = get_design(design)
    site, describe, boundaries = hit_boundaries(target, chosen, handlers[0])
    refs = references or _References(target, site.vaddr)
    report = SignalReport(chosen.name, target.spec, f"{target.spec} at {site.vaddr:#x}", target.hit, SIGNAL.name,
                          boundaries, tuple(h.value for h in handlers))
    first = handlers[0]
    report.baseline = _outcome(_run(target, chosen, first, True, None), refs.quiet(first, chosen), describe)
    for handler in handlers:
        reference = refs.with_signal(handler, chosen)
        for boundary in boundaries:
            run = _run(target, chosen, handler, True, boundary)
            report.add(boundary, handler.value, _outcome(run, reference, describe, report.baseline))
    return report


def explore_signal_designs(target: Target, designs: Sequence[str | Design],
                           handlers: Sequence[Handler]) -> list[SignalReport]:
    """``explore_signals`` under each design; a design whose kernel refuses the probe gets a report
    saying so (every design refusing it is the caller's error)."""
    site = _site_address(target)
    references = _References(target, site)
    return each_design(designs, lambda d: explore_signals(target, d, handlers, references),
                       lambda name, why: SignalReport.refusal(name, target.spec, target.hit, SIGNAL.name, why))


def _site_address(target: Target) -> int:
    machine, _io = _machine(target, get_design("int3"), Handler.STACK)
    return machine.resolver.resolve(parse_spec(target.spec)).address
