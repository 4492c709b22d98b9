"""Verifiers attached to one machine: track transactions, compute the reference, collect violations."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from emu.abi import Signal
from emu.callret.models import CallRetModels
from emu.cpu.effects import Prepared, ReferenceCache
from emu.cpu.scratch import ScratchCpu
from emu.disasm import insn_text
from emu.errors import UsageError
from emu.verify.checks.memory import check_memory, check_unseen
from emu.verify.checks.redzone import check_redzone
from emu.verify.checks.regs import check_consumer_view, check_regs
from emu.verify.checks.resume import check_fired, check_left, check_resume
from emu.verify.expected import expected_outcome, matches_exactly, reference_input
from emu.verify.records import ProbeSite, Transaction, violation
from emu.verify.returns import ReturnWatch
from emu.verify.tracker import TransactionTracker
from emu.violations import Check, Repeats, Violation, ViolationLog

if TYPE_CHECKING:
    from emu.machine import Machine


Verifier = Check  # a verifier goes by the kind of violation it reports

DEFAULT_VERIFIERS = (Verifier.REDZONE, Verifier.REGS, Verifier.RESUME, Verifier.MEMORY)


def parse_verifiers(text: str) -> tuple[Verifier, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        return tuple(Verifier(n) for n in names)
    except ValueError:
        known = ", ".join(v.value for v in Verifier)
        raise UsageError(f"--verify {text!r}: unknown verifier (known: {known})") from None


class VerifySession:
    """Install before the run (after attaching probes); read ``violations`` after it.

    Every process of the run is verified: each child forked gets a session of its own (``children``)
    that adds to this one's ``violations``, each of its violations saying its pid. A process that
    execs goes on being verified in its new image."""

    def __init__(self, machine: Machine, verifiers: Iterable[Verifier] = DEFAULT_VERIFIERS,
                 shstk: bool = False, rsb: int | None = None, parent: VerifySession | None = None) -> None:
        """``shstk`` (or Verifier.SHSTK) adds a shadow stack; ``rsb`` an RSB model of that depth;
        ``parent``: the run's first session, for a forked child's."""
        self.machine, self._rsb_depth = machine, rsb
        self.enabled = frozenset(verifiers) | ({Verifier.SHSTK} if shstk else frozenset())
        # Looked at on every checked hit: plain bools (an Enum's hash is a Python call).
        self._redzone, self._regs, self._resume, self._memory = (
            v in self.enabled for v in (Verifier.REDZONE, Verifier.REGS, Verifier.RESUME, Verifier.MEMORY))
        self.pid = 0 if parent is None else machine.kernel.ident.pid  # what this session's violations say
        self.violations: ViolationLog = ViolationLog() if parent is None else parent.violations
        self.children: list[VerifySession] = []  # the run's first session's: one per process forked since
        self.child_observers: list[Callable[[VerifySession], None]] = []  # each child's session, once made
        self.tracker = TransactionTracker(machine, machine.attachments, self._finished)
        self._rebind_due = False
        machine.attacher.library_observers.append(self._library_installed)
        self.references = ReferenceCache(ScratchCpu(machine.mem), self.tracker.raw.mem)
        self.tracker.prepare = self._prepare
        self.returns = ReturnWatch(machine, self.tracker.raw, self._report, self._regs, self._resume)
        self._judged: dict[int, list[Violation]] = {}  # slot -> the violations of the hit C compares hits with
        if self.tracker.edges is not None and self.tracker.edges.repeats is not None:
            self.violations.pull_from(self._repeated)
        models = CallRetModels(machine, Verifier.SHSTK in self.enabled, rsb, lambda v: self._report([v]))
        self.shadow_stack, self.rsb = models.shadow_stack, models.rsb
        machine.exec_observers.append(self._new_image)
        if parent is None:
            machine.fork_observers.append(self._forked)  # (every process's forks: the list is the run's)

    def _forked(self, child: Machine) -> None:
        """A process of the run forked: its child is verified from its first instruction, as fork returns."""
        session = VerifySession(child, self.enabled, rsb=self._rsb_depth, parent=self)
        self.children.append(session)
        for observer in self.child_observers:
            observer(session)

    def _library_installed(self, _attachment: object) -> None:
        """A library probe installed as ld.so (or dlopen) maps the library: its sites are watched from
        the next instruction on, with one rebind however many probes the mapping installs."""
        if not self._rebind_due:
            self._rebind_due = True
            self.machine.kernel.defer(self._watch_libraries)

    def _watch_libraries(self) -> None:
        self._rebind_due = False
        self.tracker.bind(self.machine.attachments)

    def rebind(self) -> None:
        """Forget the violations so far and watch the machine's current attachments (for a caller
        that re-attaches probes between runs of one process, like the fuzzer)."""
        self.violations.clear()
        self.tracker.bind(self.machine.attachments, forget_hits=True)

    def _new_image(self) -> None:
        """execve: the new image's probes are watched from its first instruction; returns under way in
        the old image never come back (its stack is gone), which is the program's doing, not the design's."""
        self.tracker.new_image()
        self.returns.new_image()

    def finish(self, ending: str, killed: bool = False) -> None:
        """The run is over (``ending``: how, in words; ``killed``: by a signal). A hit still open,
        or the last one abandoned as a signal ended the run, never resumed, which the original
        instruction alone would have (a trampoline that traps, faults or exits): a ``resume``
        violation, never "no verdict, so clean"."""
        for child in self.children:
            child.finish(*_how_it_ended(child.machine, ending))
        if Verifier.RESUME not in self.enabled:
            return
        self.returns.finish(ending)
        opened = self.tracker.opened()
        tx = self.tracker.active if opened is not None else self.tracker.lost if killed else None
        if tx is None:
            return
        self._report([violation(Check.RESUME, tx, f"never resumed: the run ended inside the hit ({ending})",
                                ending=ending)])

    @property
    def transactions(self) -> int:
        """Hits that got a verdict, in every process of the run."""
        return self.tracker.count + sum(child.tracker.count for child in self.children)

    def _prepare(self, tx: Transaction | None, at: ProbeSite, start_raw: bytes) -> Prepared | None:
        """The reference of a hit whose instruction is about to run: from ``start_raw``, or ``tx``'s
        start with what its consumers changed (None: they moved ip, no instruction runs)."""
        raw = start_raw if tx is None or tx.chain is None else reference_input(tx)
        return None if raw is None else self.references.prepare(at.address, at.original, raw)

    def _describe(self, pc: int) -> str:
        """Machine.describe_insn, reading the code in one C call (a design that breaks something
        does it on every hit, and each violation names its writer)."""
        code = self.tracker.raw.mem(pc, 16)
        text = None if code is None else insn_text(code, pc)
        return self.machine.describe_insn(pc) if text is None else text

    def _repeated(self) -> Repeats:
        """The hits C found to repeat a judged one (emu/hotpath/repeats.py), as runs of hits that repeat
        the same one, with its violations."""
        repeats = self.tracker.edges.repeats if self.tracker.edges is not None else None
        held = [] if repeats is None else repeats.take()
        runs: Repeats = []
        for slot, hit in zip(held[::2], held[1::2], strict=True):
            template = self._judged[slot]
            if runs and runs[-1][0] is template:
                runs[-1][1].append(hit)
            else:
                runs.append((template, [hit]))
        return runs

    def _report(self, found: list[Violation]) -> None:
        self.violations += self._tagged(found)

    def _tagged(self, found: list[Violation]) -> list[Violation]:
        """``found`` as a forked process's violations (each says its pid)."""
        return [v.in_process(self.pid) for v in found] if self.pid and found else found

    def _finished(self, tx: Transaction) -> None:
        found = self._tagged(self._judge(tx))
        self.violations += found
        if found and all(v.kind is Check.REDZONE for v in found) and self.tracker.repeatable(tx):
            assert self.tracker.edges is not None and self.tracker.edges.repeats is not None
            self._judged[self.tracker.edges.repeats.arm()] = found

    def _judge(self, tx: Transaction) -> list[Violation]:
        found: list[Violation] = []
        effect = None if tx.prepared is None else tx.prepared.effect
        if self._resume:
            found += check_fired(tx) + check_left(tx)
        if self._memory:
            found += check_unseen(tx, self._describe)
        if tx.chain is None and effect is not None and not tx.outside and effect.settles(tx):
            return found  # the common case of a hit that is not a NOP, settled from the cache
        exp = expected_outcome(tx, self.references)
        if self._memory:
            found += check_memory(tx, exp, self.tracker.raw.mem, self.machine.mem, self._describe)
        if self._regs:
            found += check_consumer_view(tx)
        if matches_exactly(tx, exp):
            return found
        if self._regs:
            found += check_regs(tx, exp)
        if self._resume:
            found += check_resume(tx, exp)
        if self._redzone:
            found += check_redzone(tx, exp, self._describe)
        return found


def _how_it_ended(machine: Machine, run_ending: str) -> tuple[str, bool]:
    """A forked process's ending in words, and whether a signal killed it; ``run_ending`` if it outlived the run."""
    entry = machine.family.procs.get(machine.kernel.ident.pid)
    status = None if entry is None else entry.status
    if status is None:
        return run_ending, False
    if status & 0x7F:
        return f"killed by {Signal(status & 0x7F).name}", True
    return f"exited {status >> 8}", False
