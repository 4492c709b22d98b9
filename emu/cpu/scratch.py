"""What Unicorn itself does with an instruction, asked on a scratch CPU of its own; and ScratchCpu,
which runs a probed site's original instruction for real: the reference a probe hit must match.

ScratchCpu runs on every hit of a probe on an instruction that is not a NOP, so it is built for its
cost: the state goes in and out as raw bytes in one C call each, Unicorn stops after one instruction
by itself (``count``), and only the pages an earlier execution at the same site used are brought up
to date beforehand; any other page is unmapped, so that a first touch faults it in fresh from the
guest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from emu.abi import PAGE_SIZE, U64, Prot, page_down
from emu.cpu.engine import Cpu
from emu.cpu.regs import Reg
from emu.cpu.state import RawState
from emu.cpu.stops import Access, BadAccess, StopReason


class GuestPages(Protocol):
    """The guest's memory as the scratch CPU copies it (emu/process/memory.py's Memory)."""

    def find(self, addr: int) -> object | None: ...

    def read(self, addr: int, size: int) -> bytes: ...

_PROBE_CODE, _PROBE_DATA = 0x10000, 0x20000


def instructions_run(codes: Sequence[bytes]) -> list[bool]:
    """For each machine-code snippet (one instruction, typically), whether Unicorn runs it to its end
    without an exception, on a scratch CPU in Linux's exec state. Memory operands written as (%rsp)
    reach a 64-byte aligned scratch page; rax = 3 and rdx = 0 (XCR0, for xsave), rcx = 0."""
    cpu = Cpu()
    cpu.mem_map(_PROBE_CODE, PAGE_SIZE, Prot.READ | Prot.EXEC)
    cpu.mem_map(_PROBE_DATA, 2 * PAGE_SIZE, Prot.READ | Prot.WRITE)
    raised: list[int] = []

    def on_exception(intno: int) -> None:
        raised.append(intno)
        cpu.stop()

    cpu.hooks.add_interrupt(on_exception)
    results = []
    for code in codes:
        raised.clear()
        cpu.load_exec_state()
        cpu.mem_write(_PROBE_CODE, code + b"\xf4")  # hlt after it: a run past the end shows
        for reg, value in ((Reg.RSP, _PROBE_DATA + PAGE_SIZE), (Reg.RAX, 3), (Reg.RDX, 0), (Reg.RCX, 0)):
            cpu.write(reg, value)
        cpu.flush_code(_PROBE_CODE, _PROBE_CODE + PAGE_SIZE)
        reason = cpu.run(_PROBE_CODE, count=1)
        results.append(reason is StopReason.FINISHED and not raised and cpu.read(Reg.RIP) == _PROBE_CODE + len(code))
    return results


def unicorn_cpuid(queries: Sequence[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """What Unicorn's own CPU model answers to each (eax, ecx), with no CPUID hook in the way."""
    cpu = Cpu()
    cpu.mem_map(_PROBE_CODE, PAGE_SIZE, Prot.READ | Prot.EXEC)
    cpu.mem_write(_PROBE_CODE, b"\x0f\xa2")  # cpuid
    answers = []
    for leaf, subleaf in queries:
        cpu.write(Reg.RAX, leaf)
        cpu.write(Reg.RCX, subleaf)
        cpu.run(_PROBE_CODE, count=1)
        answers.append((cpu.read(Reg.RAX), cpu.read(Reg.RBX), cpu.read(Reg.RCX), cpu.read(Reg.RDX)))
    return answers

MAX_PAGES = 8  # an instruction touching more pages than this (at one site, over time) starts afresh


class Reference(NamedTuple):
    """The state after the instruction (a RawState snapshot, rip included), and its memory accesses."""

    raw: bytes
    stores: tuple[tuple[int, bytes], ...] = ()  # (address, bytes stored there), in order
    faulted: bool = False
    reads: tuple[tuple[int, bytes], ...] | None = ()  # (address, bytes read there), in order; None: not all known


@dataclass(slots=True)
class _Page:
    guest: bytes  # the guest's bytes this copy was made from
    patched: tuple[int, bytes] | None  # the site whose original bytes it holds, if any
    stored: list[tuple[int, int]] = field(default_factory=list)  # (offset, end) the scratch's own stores changed


class ScratchCpu:
    """One reusable CPU. A page is copied from the guest when first touched, and brought up to date
    before a later execution at a site that used it last time: written again only if the guest's
    bytes changed, else only where the scratch's own stores changed it. The probe site gets its
    original bytes back (the guest's copy holds the patch)."""

    def __init__(self, mem: GuestPages) -> None:
        self.mem = mem
        self.cpu = Cpu()
        self.raw = RawState(self.cpu)
        self.cpu.on_unmapped = self._fault_in
        self.cpu.hooks.add_raw_mem_write(self._record, 1, U64)
        self.cpu.hooks.add_raw_mem_read(self._record_read, 1, U64)
        self._pages: dict[int, _Page] = {}  # mapped here
        self._site_pages: dict[tuple[int, bytes], frozenset[int]] = {}  # pages the last execution there used
        self._faulted: set[int] = set()
        self._stores: list[tuple[int, int, int]] = []  # (address, size, value) of this execution
        self._loads: list[tuple[int, bytes]] = []
        self._loads_known = True  # every load's value was reported (Unicorn reports up to 8 bytes)
        self._site: tuple[int, bytes] = (0, b"")

    def execute(self, site: int, original: bytes, raw: bytes) -> Reference:
        """Run ``original`` at ``site`` from the RawState snapshot ``raw`` (its rip is ignored)."""
        key = self._site = (site, original)
        code = frozenset({page_down(site), page_down(site + len(original) - 1)})  # fetched, not faulted in
        predicted = self._site_pages.get(key, frozenset()) | code
        self._prepare(predicted)
        self._stores, self._loads, self._loads_known, self._faulted = [], [], True, set()
        self.raw.write(raw, write_rip=False)
        reason = self.cpu.run(site, count=1)
        used = predicted | self._faulted
        self._site_pages[key] = used if len(used) <= MAX_PAGES else frozenset(self._faulted)
        faulted = reason is not StopReason.FINISHED and not self._next_fetch_failed(site)
        reads = tuple(self._loads) if self._loads_known else None
        return Reference(self.raw.read(), self._take_stores(), faulted, reads)

    def _next_fetch_failed(self, site: int) -> bool:
        """The run stopped at a fetch of the instruction after the one run (its page is not mapped here)."""
        bad = self.cpu.last_bad_access
        return bad is not None and bad.access is Access.FETCH and self.cpu.read(Reg.RIP) != site

    def _prepare(self, predicted: frozenset[int]) -> None:
        """Map exactly the predicted pages, each holding the guest's bytes now (a page the guest no
        longer maps is left out: touching it faults, as in the guest)."""
        for page in [p for p in self._pages if p not in predicted]:
            self._unmap(page)
        for page in predicted:
            if self.mem.find(page) is None:
                if page in self._pages:
                    self._unmap(page)
            else:
                self._copy(page)

    def _unmap(self, page: int) -> None:
        self.cpu.mem_unmap(page, PAGE_SIZE)
        del self._pages[page]

    def _site_on(self, page: int) -> tuple[int, bytes] | None:
        site, original = self._site
        return self._site if page_down(site) <= page <= page_down(site + len(original) - 1) else None

    def _copy(self, page: int) -> None:
        """Bring the page up to date with the guest, mapping it if needed."""
        data = self.mem.read(page, PAGE_SIZE)
        held = self._pages.get(page)
        patched = self._site_on(page)
        if held is not None and held.guest == data and held.patched == patched:
            for lo, hi in held.stored:  # only what the scratch's stores changed
                self.cpu.mem_write(page + lo, data[lo:hi])
            if held.stored and patched is not None:
                self.cpu.flush_code(page, page + PAGE_SIZE)
            held.stored.clear()
            return
        if held is None:
            self.cpu.mem_map(page, PAGE_SIZE, Prot.READ | Prot.WRITE | Prot.EXEC)
        if patched is None:
            self.cpu.mem_write(page, data)  # no code runs here: nothing translated to drop
        else:
            site, original = patched
            buf = bytearray(data)
            for i, byte in enumerate(original):
                if page <= site + i < page + PAGE_SIZE:
                    buf[site + i - page] = byte
            self.cpu.mem_write(page, bytes(buf))
            self.cpu.flush_code(page, page + PAGE_SIZE)  # uc_mem_write leaves code translated from the old bytes
        self._pages[page] = _Page(data, patched)

    def _fault_in(self, bad: BadAccess) -> bool:
        page = page_down(bad.address)
        if self.mem.find(page) is None or page in self._pages:
            return False
        self._faulted.add(page)
        self._copy(page)
        return True

    def _record(self, _uc: object, _access: int, addr: int, size: int, value: int, _ud: object) -> bool:
        """Raw write hook: the instruction's stores (taken apart after the run)."""
        self._stores.append((addr, size, value))
        return True

    def _record_read(self, _uc: object, _access: int, addr: int, size: int, value: int, _ud: object) -> bool:
        """Raw read hook (after the read): what the instruction loaded."""
        if size > 8:
            self._loads_known = False
        else:
            self._loads.append((addr, (value & ((1 << 8 * size) - 1)).to_bytes(size, "little")))
        return True

    def _take_stores(self) -> tuple[tuple[int, bytes], ...]:
        """This execution's stores; each page they changed remembers where."""
        for addr, size, _value in self._stores:
            for page in {page_down(addr), page_down(addr + size - 1)}:
                held = self._pages.get(page)
                if held is not None:
                    held.stored.append((max(addr - page, 0), min(addr + size - page, PAGE_SIZE)))
        return tuple((addr, (value & ((1 << 8 * size) - 1)).to_bytes(size, "little")) for addr, size, value in self._stores)
