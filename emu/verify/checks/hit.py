"""What every check's violation carries of its hit."""

from __future__ import annotations

from emu.verify.records import Transaction
from emu.verify.violations import Check, Violation

Evidence = tuple[tuple[str, object], ...]  # a violation's detail, as items


def violation(kind: Check, tx: Transaction, summary: str, **detail: object) -> Violation:
    return Violation(kind, tx.probe, tx.site, summary, dict(detail), tx.hit)


def path_name(tx: Transaction) -> str:
    return tx.path._value_ if tx.path else "?"  # not .value: a Python-level descriptor, on every violation
