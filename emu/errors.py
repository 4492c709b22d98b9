"""One root exception for every harness error, and the exit statuses the CLI uses.

A *guest* error (an errno, a fatal signal) is not an exception: it is part of the
run's result. These exceptions are the harness's own: bad input, misuse, limits.
"""

from __future__ import annotations

EXIT_HARNESS_ERROR = 2
"""Bad input or misuse: one line on stderr, no traceback."""
EXIT_INSN_LIMIT = 101
"""The run (all its processes) ran past ``--max-insns``. Not 124-127: those are GNU timeout's."""
EXIT_TIMEOUT = 102
"""The run ran past ``--timeout``."""


def one_line(text: str) -> str:
    """``text`` with control characters (newlines, tabs, undecodable bytes) escaped, so it prints on one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class EmuError(Exception):
    """Root of every error the harness raises on purpose. ``str()`` of one is always a single line."""

    exit_status = EXIT_HARNESS_ERROR

    def __str__(self) -> str:
        return one_line(super().__str__())


class LoadError(EmuError):
    """The binary (or its interpreter) cannot be loaded; the message names the file."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class UsageError(EmuError):
    """The caller asked for something that cannot be done (bad option, bad spec)."""


class ProbeRefused(UsageError):
    """The kernel design refuses to probe the instruction a spec resolved to (as Linux's
    uprobe_register would, with the errno): a verdict on the design, not a mistake in the spec."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


class MemoryFault(EmuError):
    """The harness itself touched guest memory that is not mapped (a kernel bug, not a guest fault)."""


class MapFailed(MemoryFault):
    """The memory backend refused to map a range (typically: too large for the host)."""


class PatchMismatch(EmuError):
    """``Memory.patch`` found other bytes than the caller expected (the kernel's verify step failed)."""
