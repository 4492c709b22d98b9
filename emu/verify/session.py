"""Verifiers attached to one machine: track transactions, compute the reference, collect violations."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING

from emu.errors import UsageError
from emu.verify.checks import check_redzone, check_regs, check_resume
from emu.verify.expected import expected_outcome
from emu.verify.scratch import ScratchCpu
from emu.verify.transaction import Transaction, TransactionTracker
from emu.verify.violations import Violation

if TYPE_CHECKING:
    from emu.machine import Machine


class Verifier(enum.Enum):
    REDZONE = "redzone"
    REGS = "regs"
    RESUME = "resume"
    LOCKSTEP = "lockstep"


DEFAULT_VERIFIERS = (Verifier.REDZONE, Verifier.REGS, Verifier.RESUME)


def parse_verifiers(text: str) -> tuple[Verifier, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        return tuple(Verifier(n) for n in names)
    except ValueError:
        known = ", ".join(v.value for v in Verifier)
        raise UsageError(f"--verify {text!r}: unknown verifier (known: {known})") from None


class VerifySession:
    """Install before the run (after attaching probes); read ``violations`` after it."""

    def __init__(self, machine: Machine, verifiers: Iterable[Verifier] = DEFAULT_VERIFIERS) -> None:
        self.machine = machine
        self.enabled = frozenset(verifiers)
        self.violations: list[Violation] = []
        self.scratch = ScratchCpu(machine.mem)
        self.tracker = TransactionTracker(machine, machine.attachments, self._finished)

    @property
    def transactions(self) -> int:
        return self.tracker.count

    def _finished(self, tx: Transaction) -> None:
        exp = expected_outcome(tx, self.scratch)
        if Verifier.REGS in self.enabled:
            self.violations += check_regs(tx, exp)
        if Verifier.RESUME in self.enabled:
            self.violations += check_resume(tx, exp)
        if Verifier.REDZONE in self.enabled:
            self.violations += check_redzone(tx, exp, self.machine.describe_insn)
