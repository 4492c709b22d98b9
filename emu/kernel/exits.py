"""How a guest's run ends: raised from inside a syscall or fault handler, caught by the machine."""

from __future__ import annotations

from emu.abi import Signal


class GuestExit(Exception):
    """exit/exit_group: the guest chose its status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"exit {status}")
        self.status = status & 0xFF


class GuestKilled(Exception):
    """A signal's default action killed the guest."""

    def __init__(self, signal: Signal, address: int | None, detail: str) -> None:
        super().__init__(f"killed by {signal.name}")
        self.signal = signal
        self.address = address
        self.detail = detail


class GuestBlocked(Exception):
    """The guest waits for something that can never happen (single thread, nothing else runs)."""
