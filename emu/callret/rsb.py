"""A return stack buffer model (opt-in ``--rsb N``): how many returns the CPU would predict.

Per thread (each thread's buffer is kept aside while another runs: a model of what the code
itself does to the predictor, not of a core shared by threads) a circular buffer of N return addresses: each ``call`` the
CPU executes writes its return address at the top and moves the top up; each ``ret`` moves it
down and compares the entry with where the ret really went: predicted or mispredicted. Like the
kernel's call-depth tracking (x86 callthunks) a count of valid entries is kept: a ``ret`` with
none left is an underflow (counted separately; the prediction is whatever stale entry the
circular buffer holds there, as on CPUs whose RSB wraps). What the CPU does not execute is not
seen: the kernel's emulated ``call`` (INT3 path) pushes the user stack but not the RSB, and
SYSRET/IRET are not returns. So a probe that unbalances calls and rets shows up as mispredicts
in the returns *after* it, up the call chain (see fixtures/rsb_shapes.S).

Mispredicts are counted per run and, attributed to the last probe hit before them, per hit;
``check`` reports the probed run's mispredicts minus the unprobed run's, per hit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emu.callret.tracker import CallRetTracker
from emu.errors import UsageError

DEFAULT_RSB_DEPTH = 16


def rsb_depth(text: str) -> int:
    """The ``--rsb N`` argument."""
    try:
        depth = int(text)
    except ValueError:
        depth = 0
    if depth < 1:
        raise UsageError(f"--rsb {text!r}: the RSB depth must be a positive number of entries")
    return depth


@dataclass
class RsbStats:
    depth: int
    calls: int = 0
    returns: int = 0
    predicted: int = 0
    mispredicted: int = 0
    underflows: int = 0
    per_hit: dict[str, list[int]] = field(default_factory=dict)  # probe -> mispredicts after each hit

    def to_json(self) -> dict[str, Any]:
        return {"depth": self.depth, "calls": self.calls, "returns": self.returns, "predicted": self.predicted,
                "mispredicted": self.mispredicted, "underflows": self.underflows, "per_hit": self.per_hit}


@dataclass(slots=True)
class _ThreadRsb:
    """A thread's buffer and the hit its mispredicts go to, while another thread runs."""

    entries: list[int]
    top: int
    valid: int
    hit_counts: list[int] | None


class RsbModel:
    def __init__(self, tracker: CallRetTracker, depth: int = DEFAULT_RSB_DEPTH) -> None:
        if depth < 1:
            raise ValueError("RSB depth must be at least 1")
        self.entries = [0] * depth
        self.top = 0  # index of the next free entry
        self.valid = 0
        self.stats = RsbStats(depth)
        self._hit_counts: list[int] | None = None  # the current hit's slot in per_hit
        self._others: dict[int, _ThreadRsb] = {}  # tid -> its buffer while it does not run
        tracker.on_call.append(self._call)
        tracker.on_ret.append(self._ret)
        tracker.on_switch.append(self._switch)

    def _switch(self, prev: int, nxt: int, prev_alive: bool) -> None:
        if prev_alive:
            self._others[prev] = _ThreadRsb(self.entries, self.top, self.valid, self._hit_counts)
        held = self._others.pop(nxt, None) or _ThreadRsb([0] * self.stats.depth, 0, 0, None)
        self.entries, self.top, self.valid, self._hit_counts = held.entries, held.top, held.valid, held.hit_counts

    def probe_hit(self, probe: str) -> None:
        """A probe was hit: later mispredicts are attributed to this hit."""
        counts = self.stats.per_hit.setdefault(probe, [])
        counts.append(0)
        self._hit_counts = counts

    def _call(self, _pc: int, ret_addr: int) -> None:
        self.stats.calls += 1
        n = len(self.entries)
        self.entries[self.top] = ret_addr
        self.top = (self.top + 1) % n
        self.valid = min(self.valid + 1, n)

    def _ret(self, _pc: int, target: int) -> None:
        s = self.stats
        s.returns += 1
        n = len(self.entries)
        self.top = (self.top - 1) % n
        if self.valid == 0:
            s.underflows += 1
        else:
            self.valid -= 1
        if self.entries[self.top] == target:
            s.predicted += 1
            return
        s.mispredicted += 1
        if self._hit_counts is not None:
            self._hit_counts[-1] += 1
