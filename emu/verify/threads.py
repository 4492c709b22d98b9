"""Threads (emu/kernel/sched.py) and probe transactions.

Threads (emu/kernel/sched.py): a transaction belongs to the thread that hit the site. ``active``
is the running thread's; on a context switch it is suspended (the red-zone window closes) and the
next thread's suspended one, if any, becomes active again (the window reopens on its red zone),
so another thread's instructions can neither finish nor abandon it. What other threads do while
it is suspended is not the probe's doing: SYSRET/IRET exits they cause are taken out of its
count, and their stores into its red zone (legal, if rare: the red zone belongs to the probed
thread's interrupted code, but memory is shared) are folded into its ``redzone_before``, so
nothing is reported for them. A transaction whose thread is about to run a signal handler, or
has exited, gets no verdict (as for one thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from emu.verify.records import Suspended, Transaction, others_folded_in

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
        self._suspended: dict[int, Suspended] = {}  # tid -> its transaction, while another thread runs

    def clear(self) -> None:
        self._suspended.clear()

    def switch(self, prev: Task, nxt: Task) -> None:
        """Scheduler observer: suspend ``prev``'s transaction, resume ``nxt``'s (see the module doc)."""
        tracker = self._tracker
        tx = tracker.put_aside()
        if tx is not None and prev.alive:
            self._suspended[prev.tid] = Suspended(tx, tracker.exits_now(), self._redzone_if_touched(tx))
        held = self._suspended.pop(nxt.tid, None)
        if held is None:
            return
        if nxt.signals.pending & ~nxt.signals.mask:
            return  # a handler runs first: the thread does not resume from this hit here
        self._resume(held)

    def _resume(self, held: Suspended) -> None:
        tx = held.tx
        now = self._tracker.exits_now()
        tx.exits_before = {k: tx.exits_before.get(k, 0) + now[k] - held.exits.get(k, 0) for k in now}
        if held.redzone is not None and tx.redzone_before is not None:
            current = self._tracker.redzone(tx.redzone_base)
            if current != held.redzone:  # another thread stored there: not this transaction's doing
                tx.redzone_before = others_folded_in(tx.redzone_before, held.redzone, current)
        self._tracker.take_up(tx)

    def _redzone_if_touched(self, tx: Transaction) -> bytes | None:
        """The red zone at suspension, if the transaction's own writes already reached it (else its
        snapshot is taken at its first write, which already sees what other threads stored)."""
        return None if tx.redzone_before is None else self._tracker.redzone(tx.redzone_base)
