"""Signals in the middle of a probe hit: a handler runs, then rt_sigreturn puts the interrupted state
back and the hit goes on. The hit's transaction is set aside when the kernel builds a signal frame
over it and taken up again when that frame is returned from, so the verdict covers the whole hit,
the handler's own effects aside: exits the handler caused are taken out of the hit's count, and what
it stored into the hit's red zone is folded into the reference, as for another thread's stores
(threads.py). A hit whose frame is never returned from (a siglongjmp out of the handler, a handler
that exits) never resumes, which is the program's choice, not the design's: no verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from emu.verify.threads import Held, Tracker, set_aside, take_up

if TYPE_CHECKING:
    from emu.kernel.sched import Scheduler


class SignalWatch:
    def __init__(self, tracker: Tracker, sched: Scheduler) -> None:
        self._tracker, self._sched = tracker, sched
        self._frames: dict[int, list[Held | None]] = {}  # tid -> per signal frame on it, innermost last

    def clear(self) -> None:
        self._frames.clear()

    def frame(self, restorer: int | None, ip: int) -> None:
        """Kernel observer: a frame is built (``restorer`` given) over the state at ``ip``, or returned
        from (None)."""
        frames = self._frames.setdefault(self._sched.current.tid, [])
        if restorer is not None:
            frames.append(self._hold(ip))
        elif frames and (held := frames.pop()) is not None:
            take_up(self._tracker, held)

    def _hold(self, ip: int) -> Held | None:
        """The open hit set aside; none if it has not begun: the CPU stopped at the site before the
        probed instruction ran (a timer's stop, a signal injected there), and the hit starts afresh
        when the handler returns there."""
        tx = self._tracker.active
        if tx is not None and ip == tx.site:
            self._tracker.abandon()
            return None
        return set_aside(self._tracker)
