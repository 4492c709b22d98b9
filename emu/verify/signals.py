"""Signals in the middle of a probe hit: a handler runs, then rt_sigreturn puts the interrupted state
back and the hit goes on. The hit's transaction is set aside when the kernel builds a signal frame
over it and taken up again when that frame is returned from, so the verdict covers the whole hit,
the handler's own effects aside: exits the handler caused are taken out of the hit's count, and what
it stored into the hit's red zone is folded into the reference, as for another thread's stores
(threads.py). A hit whose frame is never returned from (a siglongjmp out of the handler, a handler
that exits) never resumes, which is the program's choice, not the design's: no verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

from emu.verify.threads import Held, Tracker, set_aside, take_up

if TYPE_CHECKING:
    from emu.kernel.sched import Scheduler

T = TypeVar("T")


class FrameStacks(Generic[T]):
    """Per thread, what a watch set aside for each signal frame on it, innermost last (a frame never
    returned from, by a siglongjmp, leaves its entry behind: nothing takes it up)."""

    def __init__(self, sched: Scheduler) -> None:
        self._sched = sched
        self._frames: dict[int, list[T]] = {}

    def clear(self) -> None:
        self._frames.clear()

    def push(self, item: T) -> None:
        self._frames.setdefault(self._sched.current.tid, []).append(item)

    def pop(self, default: T) -> T:
        """The running thread's innermost frame's item (``default`` if it has none)."""
        frames = self._frames.get(self._sched.current.tid)
        return frames.pop() if frames else default


class SignalWatch:
    def __init__(self, tracker: Tracker, sched: Scheduler) -> None:
        self._tracker = tracker
        self._frames: FrameStacks[Held | None] = FrameStacks(sched)

    def clear(self) -> None:
        self._frames.clear()

    def frame(self, restorer: int | None, ip: int) -> None:
        """Kernel observer: a frame is built (``restorer`` given) over the state at ``ip``, or returned
        from (None)."""
        if restorer is not None:
            self._frames.push(self._hold(ip))
        elif (held := self._frames.pop(None)) is not None:
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
