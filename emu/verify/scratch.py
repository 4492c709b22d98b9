"""Runs one original instruction for real on a scratch CPU: the reference a probed site must match."""

from __future__ import annotations

from dataclasses import dataclass, field

from emu.abi import PAGE_SIZE, Prot, page_down
from emu.cpu import BadAccess, Cpu, RawState, StopReason
from emu.memory import Memory
from emu.verify.state import ExtendedState, decode_extended, decode_state, encode_state

KEPT_PAGES = 8  # pages kept mapped between instructions (mapping one costs more than copying it)


@dataclass(frozen=True, slots=True)
class Reference:
    """Registers after the instruction (read_user_state order), extended state, and its memory writes."""

    state: list[int]
    extended: ExtendedState
    writes: dict[int, int] = field(default_factory=dict)  # address -> byte value
    faulted: bool = False


class ScratchCpu:
    """One reusable CPU. Pages are copied from the guest on first touch, and again before each
    later instruction while they stay mapped here (the most recently used KEPT_PAGES); the probe
    site gets its original bytes back (the guest's copy holds the patch)."""

    def __init__(self, mem: Memory) -> None:
        self.mem = mem
        self.cpu = Cpu()
        self.raw = RawState(self.cpu)
        self.cpu.on_unmapped = self._fault_in
        self.cpu.add_mem_write_hook(self._record, 1, (1 << 64) - 1)
        # Stops before the second instruction: Cpu.step would drop every translated block first.
        self.cpu.add_code_hook(self._count, 1, (1 << 64) - 1)
        self._executed = 0
        self._pages: list[int] = []  # mapped here, least recently used first
        self._copied: dict[int, bytes] = {}  # page -> the guest's bytes last copied, while it holds them
        self._used: set[int] = set()
        self._writes: dict[int, int] = {}
        self._site = 0
        self._original = b""

    def execute(self, site: int, original: bytes, state: list[int], extended: ExtendedState) -> Reference:
        if (site, original) != (self._site, self._original):
            for page in {page_down(self._site), page_down(self._site + len(self._original) - 1)}:
                self._copied.pop(page, None)  # it holds the last site's original bytes: copy it again
        self._site, self._original, self._writes = site, original, {}
        self._refresh()
        self.raw.write(encode_state(state, extended), write_rip=True)
        try:
            self._executed = 0
            reason = self.cpu.run(site)
            raw = self.raw.read()
            return Reference(decode_state(raw), decode_extended(raw), self._writes, reason is not StopReason.FINISHED)
        finally:
            self._trim()

    def _refresh(self) -> None:
        """Bring the kept pages up to date with the guest (or drop those it no longer maps)."""
        self._used = set()
        for page in list(self._pages):
            if self.mem.find(page) is None:
                self._drop(page)
            else:
                self._copy(page)

    def _trim(self) -> None:
        """Keep the pages this instruction used, most recent last, up to KEPT_PAGES."""
        self._pages = [p for p in self._pages if p not in self._used] + [p for p in self._pages if p in self._used]
        while len(self._pages) > KEPT_PAGES:
            self._drop(self._pages[0])

    def _drop(self, page: int) -> None:
        self.cpu.mem_unmap(page, PAGE_SIZE)
        self._pages.remove(page)
        self._copied.pop(page, None)

    def _copy(self, page: int) -> None:
        """Copy the guest's page, with the site's original bytes put back, unless this one holds
        that already (rewriting a page of code, even with the same bytes, makes Unicorn translate
        it again)."""
        data = self.mem.read(page, PAGE_SIZE)
        if self._copied.get(page) == data:
            return
        self.cpu.mem_write(page, data)
        self._copied[page] = data
        for i, byte in enumerate(self._original):
            if page <= self._site + i < page + PAGE_SIZE:
                self.cpu.mem_write(self._site + i, bytes([byte]))
        self.cpu.flush_code(page, page + PAGE_SIZE)  # uc_mem_write leaves code translated from the old bytes

    def _fault_in(self, bad: BadAccess) -> bool:
        page = page_down(bad.address)
        if self.mem.find(page) is None or page in self._pages:
            return False
        self.cpu.mem_map(page, PAGE_SIZE, Prot.READ | Prot.WRITE | Prot.EXEC)
        self._pages.append(page)
        self._used.add(page)
        self._copy(page)
        return True

    def _count(self, _addr: int, _size: int) -> None:
        self._executed += 1
        if self._executed > 1:
            self.cpu.stop()

    def _record(self, addr: int, size: int, value: int) -> None:
        page = addr & ~(PAGE_SIZE - 1)
        self._used.add(page)
        self._copied.pop(page, None)  # no longer the guest's bytes (a store across pages: both, below)
        self._copied.pop((addr + size - 1) & ~(PAGE_SIZE - 1), None)
        for i in range(size):
            self._writes[addr + i] = (value >> (8 * i)) & 0xFF
