"""The records of a probe hit: the watched site, the transaction (from the site until the guest
resumes) and the guest's stores during it. The tracker makes them; the checks read them."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING

from emu.abi import RED_ZONE
from emu.cpu.state import RAW_RSP, ExtendedState, decode_extended, decode_state
from emu.hotpath.write_log import entries as log_entries
from emu.kernel.uprobes.consumers import EntryPath
from emu.kernel.uprobes.records import Uprobe
from emu.kernel.uprobes.regs import PtRegs
from emu.violations import Check, Violation

if TYPE_CHECKING:
    from emu.cpu.effects import Prepared

RSP_INDEX = 7  # in Cpu.read_user_state() order, which the checks use
RIP_INDEX = 16
_QWORD = struct.Struct("<Q")
GuestWrite = tuple[int, int, int, int]  # a logged store: pc, address, size, value
Evidence = tuple[tuple[str, object], ...]  # a violation's detail, as items


@dataclass(slots=True)
class ProbeSite:
    """A watched probe site: what every transaction there shares."""

    name: str  # the probe spec's text
    uprobe: Uprobe
    address: int
    original: bytes
    nop: bool  # a NOP-class instruction (its whole effect is ip += length)
    next: int  # the address right after it: where the guest resumes, in the common case
    index: int  # in the tracker's SiteCounters


class Transaction:
    """One probe hit; ``start_raw``/``end_raw`` are RawState snapshots, decoded on first use. Built in a
    hook on every hit, so the constructor sets only what every hit needs; the rest are class defaults."""

    prepared: Prepared | None = None  # its reference, taken before the instruction ran (not for a NOP)
    logged: tuple[bytes, ...] = ()  # raw WriteLog entries of the guest's stores into the window
    unrecorded = False  # more stores than the log holds: some guest stores are not in guest_writes
    chain: tuple[PtRegs, PtRegs] | None = None  # pt_regs before and after the consumers
    path: EntryPath | None = None
    end_addr = end_rsp = 0
    end_raw = redzone_after = b""
    redzone_before: bytes | None = None  # read before the first write that reaches it; None: untouched
    redzone_changed = False  # a write reached it that may have changed it
    exits_after: Mapping[str, int] = MappingProxyType({})
    outside = False  # a store landed outside the red zone and the scratch below it (the memory check)
    kernel_stores: tuple[tuple[int, bytes, bytes], ...] = ()  # (address, old, new) of the kernel's writes there
    unseen: tuple[int, int] = (0, 0)  # instructions whose stores the watch could not follow, and the first's pc
    left: tuple[int, int] | None = None  # (pc, target) of the first transfer out of the watched code

    def __init__(self, at: ProbeSite, hit: int, start_raw: bytes, exits_before: Mapping[str, int]) -> None:
        self.at, self.site, self.nop, self.hit, self.start_raw = at, at.address, at.nop, hit, start_raw
        self.start_rsp = rsp = _QWORD.unpack_from(start_raw, RAW_RSP)[0]
        self.redzone_base = rsp - RED_ZONE
        self.exits_before = exits_before

    @property
    def probe(self) -> str:
        return self.at.name

    @cached_property
    def start_state(self) -> list[int]:
        return decode_state(self.start_raw)

    @cached_property
    def start_ext(self) -> ExtendedState:
        return decode_extended(self.start_raw)

    @cached_property
    def end_state(self) -> list[int]:
        """Where the guest resumed, with the state it resumed with."""
        state = decode_state(self.end_raw)
        state[RIP_INDEX] = self.end_addr
        state[RSP_INDEX] = self.end_rsp
        return state

    @cached_property
    def end_ext(self) -> ExtendedState:
        return decode_extended(self.end_raw)

    @cached_property
    def exits(self) -> dict[str, int]:
        """SYSRET/IRET exits the kernel took during the transaction."""
        before, now = self.exits_before, self.exits_after
        return {k: now[k] - before.get(k, 0) for k in now if now[k] != before.get(k, 0)}


def guest_writes(logged: tuple[bytes, ...], base: int, before: bytes | None, nop: bool) -> list[GuestWrite]:
    """The guest's stores into the red zone at ``base``, in order; for a NOP, not those that stored what
    it held ``before`` (they leave no difference of their own)."""
    out = []
    for chunk in logged:
        for pc, addr, size, value, _old in log_entries(chunk):
            offset = addr - base
            if offset + size <= 0 or offset >= RED_ZONE:
                continue
            if not (nop and before is not None and 0 <= offset <= RED_ZONE - size
                    and (value & ((1 << 8 * size) - 1)).to_bytes(size, "little") == before[offset : offset + size]):
                out.append((pc, addr, size, value))
    return out


Finished = Callable[[Transaction], None]
Prepare = Callable[["Transaction | None", "ProbeSite", bytes], "Prepared | None"]  # (tx or None, site, start snapshot)


def others_folded_in(before: bytes, suspended: bytes, resumed: bytes) -> bytes:
    """The reference ``before`` with the bytes other threads changed while the probed one was suspended
    (``suspended`` -> ``resumed``) taken as they left them."""
    return bytes(r if r != s else b for b, s, r in zip(before, suspended, resumed, strict=True))


def violation(kind: Check, tx: Transaction, summary: str, **detail: object) -> Violation:
    """A violation of ``tx``'s hit."""
    return Violation(kind, tx.probe, tx.site, summary, dict(detail), tx.hit)


def path_name(tx: Transaction) -> str:
    return tx.path._value_ if tx.path else "?"  # not .value: a Python-level descriptor, on every violation
