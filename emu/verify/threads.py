"""Threads and probe transactions: a transaction belongs to the thread that hit the site, so another
thread's instructions can neither finish nor abandon it. While it is suspended, the exits other
threads cause are taken out of its count and their stores into its red zone are folded into its
``redzone_before``: they are not the probe's doing. One whose thread has exited gets no verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from emu.verify.records import Transaction, others_folded_in

if TYPE_CHECKING:
    from emu.kernel.tasks import Task


class Tracker(Protocol):
    """What the thread watch needs of the transaction tracker (emu/verify/tracker.py)."""

    @property
    def active(self) -> Transaction | None: ...
    def put_aside(self) -> Transaction | None: ...
    def take_up(self, tx: Transaction) -> None: ...
    def abandon(self) -> None: ...
    def exits_now(self) -> dict[str, int]: ...
    def redzone(self, base: int) -> bytes: ...


Held = tuple[Transaction, dict[str, int], bytes | None]  # a hit set aside, the exit counts and its red zone then


def set_aside(tracker: Tracker) -> Held | None:
    """The running thread's open transaction, set aside with what taking it up again needs."""
    tx = tracker.put_aside()
    if tx is None:
        return None
    redzone = None if tx.redzone_before is None else tracker.redzone(tx.redzone_base)  # (else taken at its first write)
    return tx, tracker.exits_now(), redzone


def take_up(tracker: Tracker, held: Held) -> None:
    """``held``'s transaction open again, without the exits and red-zone stores others made meanwhile."""
    tx, exits, redzone = held
    now = tracker.exits_now()
    tx.exits_before = {k: tx.exits_before.get(k, 0) + now[k] - exits.get(k, 0) for k in now}
    if redzone is not None and tx.redzone_before is not None:
        current = tracker.redzone(tx.redzone_base)
        if current != redzone:  # another thread (or a signal handler) stored there: not this transaction's doing
            tx.redzone_before = others_folded_in(tx.redzone_before, redzone, current)
    tracker.take_up(tx)


class ThreadWatch:
    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        self._suspended: dict[int, Held] = {}  # tid -> its transaction, while another thread runs

    def clear(self) -> None:
        self._suspended.clear()

    def switch(self, prev: Task, nxt: Task) -> None:
        """Scheduler observer: suspend ``prev``'s transaction, resume ``nxt``'s (a signal it then runs a
        handler for sets it aside again: signals.py)."""
        held = set_aside(self._tracker)
        if held is not None and prev.alive:
            self._suspended[prev.tid] = held
        resumed = self._suspended.pop(nxt.tid, None)
        if resumed is not None:
            take_up(self._tracker, resumed)
