"""Threads and probe transactions: a transaction belongs to the thread that hit the site, so another
thread's instructions can neither finish nor abandon it. While it is suspended, the exits other
threads cause are taken out of its count and their stores into its red zone are folded into its
``redzone_before``: they are not the probe's doing. One whose thread is about to run a signal
handler, or has exited, gets no verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from emu.verify.records import Transaction, others_folded_in

if TYPE_CHECKING:
    from emu.kernel.tasks import Task


class Tracker(Protocol):
    """What the thread watch needs of the transaction tracker (emu/verify/tracker.py)."""

    def put_aside(self) -> Transaction | None: ...
    def take_up(self, tx: Transaction) -> None: ...
    def exits_now(self) -> dict[str, int]: ...
    def redzone(self, base: int) -> bytes: ...


class ThreadWatch:
    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        # tid -> its transaction, while another thread runs, with the exit counts and its red zone then
        self._suspended: dict[int, tuple[Transaction, dict[str, int], bytes | None]] = {}

    def clear(self) -> None:
        self._suspended.clear()

    def switch(self, prev: Task, nxt: Task) -> None:
        """Scheduler observer: suspend ``prev``'s transaction, resume ``nxt``'s."""
        tracker = self._tracker
        tx = tracker.put_aside()
        if tx is not None and prev.alive:  # the red zone now, if its own writes reached it (else taken at its first)
            redzone = None if tx.redzone_before is None else tracker.redzone(tx.redzone_base)
            self._suspended[prev.tid] = (tx, tracker.exits_now(), redzone)
        held = self._suspended.pop(nxt.tid, None)
        if held is None or nxt.signals.pending & ~nxt.signals.mask:
            return  # nothing held, or a handler runs first: the thread does not resume from this hit here
        tx, exits, redzone = held
        now = self._tracker.exits_now()
        tx.exits_before = {k: tx.exits_before.get(k, 0) + now[k] - exits.get(k, 0) for k in now}
        if redzone is not None and tx.redzone_before is not None:
            current = self._tracker.redzone(tx.redzone_base)
            if current != redzone:  # another thread stored there: not this transaction's doing
                tx.redzone_before = others_folded_in(tx.redzone_before, redzone, current)
        self._tracker.take_up(tx)
