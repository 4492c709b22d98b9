"""Why a CPU stopped and what a faulting access touched, as Unicorn reports them (emu/cpu/engine.py
runs the CPU; the kernel turns these into signals)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import unicorn


class Access(enum.Enum):
    READ = "read"
    WRITE = "write"
    FETCH = "fetch"


@dataclass(frozen=True, slots=True)
class BadAccess:
    """What a faulting guest access touched (recorded by the invalid-memory hook)."""

    access: Access
    address: int
    size: int
    unmapped: bool


class StopReason(enum.Enum):
    FINISHED = "finished"  # reached `until`, or stopped by emu_stop
    INVALID_INSN = "invalid instruction"
    BAD_ACCESS = "bad memory access"
    OTHER = "other"


UC_ACCESS = {
    unicorn.UC_MEM_READ_UNMAPPED: (Access.READ, True),
    unicorn.UC_MEM_WRITE_UNMAPPED: (Access.WRITE, True),
    unicorn.UC_MEM_FETCH_UNMAPPED: (Access.FETCH, True),
    unicorn.UC_MEM_READ_PROT: (Access.READ, False),
    unicorn.UC_MEM_WRITE_PROT: (Access.WRITE, False),
    unicorn.UC_MEM_FETCH_PROT: (Access.FETCH, False),
}


FETCH_FAULTS = (unicorn.UC_ERR_FETCH_UNMAPPED, unicorn.UC_ERR_FETCH_PROT)


def stop_reason(errno: int) -> StopReason:
    """Why emu_start returned, from its error code."""
    if errno == unicorn.UC_ERR_INSN_INVALID:
        return StopReason.INVALID_INSN
    if errno in (
        unicorn.UC_ERR_READ_UNMAPPED, unicorn.UC_ERR_WRITE_UNMAPPED, unicorn.UC_ERR_FETCH_UNMAPPED,
        unicorn.UC_ERR_READ_PROT, unicorn.UC_ERR_WRITE_PROT, unicorn.UC_ERR_FETCH_PROT,
        unicorn.UC_ERR_READ_UNALIGNED, unicorn.UC_ERR_WRITE_UNALIGNED, unicorn.UC_ERR_FETCH_UNALIGNED,
    ):
        return StopReason.BAD_ACCESS
    return StopReason.OTHER
