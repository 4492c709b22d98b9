"""Runs one original instruction for real on a scratch CPU: the reference a probed site must match."""

from __future__ import annotations

from dataclasses import dataclass, field

from emu.abi import PAGE_SIZE, Prot, page_down
from emu.cpu import BadAccess, Cpu, StopReason
from emu.memory import Memory

ExtendedState = tuple[int, int, bytes, int]  # fs base, gs base, xmm0-15 raw, mxcsr


@dataclass(frozen=True, slots=True)
class Reference:
    """Registers after the instruction (read_user_state order), extended state, and its memory writes."""

    state: list[int]
    extended: ExtendedState
    writes: dict[int, int] = field(default_factory=dict)  # address -> byte value
    faulted: bool = False


class ScratchCpu:
    """One reusable CPU. Pages are copied from the guest on first touch and dropped after each
    instruction; the probe site gets its original bytes back (the guest's copy holds the patch)."""

    def __init__(self, mem: Memory) -> None:
        self.mem = mem
        self.cpu = Cpu()
        self.cpu.on_unmapped = self._fault_in
        self.cpu.add_mem_write_hook(self._record, 1, (1 << 64) - 1)
        self._pages: list[int] = []
        self._writes: dict[int, int] = {}
        self._site = 0
        self._original = b""

    def execute(self, site: int, original: bytes, state: list[int], extended: ExtendedState) -> Reference:
        self._site, self._original, self._writes = site, original, {}
        self.cpu.write_user_state(state, write_rip=True)
        self.cpu.write_extended(extended)
        try:
            reason = self.cpu.step(site)
            return Reference(self.cpu.read_user_state(), self.cpu.read_extended(), self._writes,
                             reason is not StopReason.FINISHED)
        finally:
            for page in self._pages:
                self.cpu.mem_unmap(page, PAGE_SIZE)
            self._pages.clear()

    def _fault_in(self, bad: BadAccess) -> bool:
        page = page_down(bad.address)
        if self.mem.find(page) is None or page in self._pages:
            return False
        self.cpu.mem_map(page, PAGE_SIZE, Prot.READ | Prot.WRITE | Prot.EXEC)
        self.cpu.mem_write(page, self.mem.read(page, PAGE_SIZE))
        self._pages.append(page)
        for i, byte in enumerate(self._original):
            if page <= self._site + i < page + PAGE_SIZE:
                self.cpu.mem_write(self._site + i, bytes([byte]))
        return True

    def _record(self, addr: int, size: int, value: int) -> None:
        for i in range(size):
            self._writes[addr + i] = (value >> (8 * i)) & 0xFF
