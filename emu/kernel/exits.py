"""How a guest's run ends: raised from inside a syscall or fault handler, caught by the machine."""

from __future__ import annotations

from emu.abi import SI_KERNEL, Signal


class GuestExit(Exception):
    """exit/exit_group: the guest chose its status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"exit {status}")
        self.status = status & 0xFF


class GuestKilled(Exception):
    """A signal the kernel forces on the guest (a fault, force_sig): fatal unless a handler catches it.

    ``code``/``si_addr`` fill the handler's siginfo (SI_KERNEL unless a fault says otherwise);
    ``resume_ip`` is where the interrupted context continues (None: where the CPU stopped)."""

    def __init__(self, signal: Signal, address: int | None, detail: str, code: int = SI_KERNEL,
                 si_addr: int = 0, resume_ip: int | None = None) -> None:
        super().__init__(f"killed by {signal.name}")
        self.signal = signal
        self.address = address
        self.detail = detail
        self.code = code
        self.si_addr = si_addr
        self.resume_ip = resume_ip


class GuestBlocked(Exception):
    """The guest waits for something that can never happen (single thread, nothing else runs)."""


class WouldBlock(GuestBlocked):
    """The syscall must wait for another process (wait4 on a running child, an empty pipe another
    process writes): the machine restarts it once another process has run (-ERESTARTSYS style).

    ``on``: the kernel objects (a pipe, a socket) whose change may end the wait, so a process that
    changes one of them lets the waiter run soon (family.FamilyOf.notify); ``until``: the virtual time at
    which the wait ends anyway (a poll's timeout, a timer), when nothing else can make progress."""

    def __init__(self, detail: str, on: tuple[object, ...] = (), until: int | None = None) -> None:
        super().__init__(detail)
        self.on = on
        self.until = until


class PollOthers(WouldBlock):
    """A non-blocking check (wait4 with WNOHANG) that found nothing yet: the other processes run
    first; if they changed something the syscall is restarted, otherwise it returns ``result``."""

    def __init__(self, detail: str, result: int) -> None:
        super().__init__(detail)
        self.result = result


class ProcessSuspended(Exception):
    """A process that is not the first one blocked with nothing else able to run, or used up its time
    slice while others could run: it is suspended (a blocked syscall will be restarted) and control
    goes back to the process that ran it."""

    def __init__(self, detail: str, wait: WouldBlock | None = None) -> None:
        super().__init__(detail)
        self.wait = wait  # None: preempted (it made progress and can go on)
