"""Thread 1: put it back at the site's entry, step it one instruction at a time, and let the
patching thread's writes land between two of its instructions.

Every run starts from the same saved state: thread 1's registers, the stack around its rsp (with a
canary pattern over the red zone), the site bytes as the event found them, and the kernel's
bookkeeping. Guest writes anywhere else are undone from a log a memory-write hook keeps. A step
is one instruction; a ``syscall`` (the kernel's whole handling of it) and an INT3 trap with its
emulation or out-of-line step are one step each.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from emu.abi import RED_ZONE, Prot, Signal
from emu.cpu import GPRS, Reg, StopReason
from emu.disasm import cs64
from emu.errors import MemoryFault
from emu.kernel.exits import GuestExit, GuestKilled
from emu.kernel.uprobes.records import XOL_NAME
from emu.kernel.uprobes.sites import TRAMPOLINE_NAME
from emu.race.scenario import Scenario, Site

MAX_STEPS = 4096  # a slot page's worth of slots run one after another, and more; a loop in the region ends here
STACK_BELOW = 4096  # bytes below thread 1's entry rsp that its pushes or the kernel may write
STACK_ABOVE = 256
RSP_INDEX = GPRS.index(Reg.RSP)
RIP_INDEX = len(GPRS)
KERNEL_REGIONS = (TRAMPOLINE_NAME, XOL_NAME)


def canary(size: int) -> bytes:
    """A red-zone pattern no push of an address or a small register value reproduces."""
    return bytes((0xA5 ^ i) & 0xFF for i in range(size))


@dataclass(frozen=True)
class ThreadEnd:
    """How thread 1 finished one run."""

    steps: int  # instructions executed (the last one left the region, or faulted)
    rip: int
    regs: tuple[int, ...]  # Cpu.read_user_state order: 16 GPRs, rip, rflags
    red_zone: bytes
    signal: Signal | None = None
    detail: str = ""
    limit: bool = False
    path: tuple[int, ...] = ()  # where each executed instruction began
    last_insn: str = ""  # the last instruction thread 1 executed, as the bytes then in memory decode

    @property
    def last_at(self) -> int | None:
        return self.path[-1] if self.path else None


class ThreadRunner:
    """Runs thread 1 through the scenario's site under any split of the write sequence."""

    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        self.machine = scenario.machine
        self.cpu = scenario.machine.cpu
        self.mem = scenario.machine.mem
        rsp = scenario.entry[RSP_INDEX]
        self.red_zone_at = rsp - RED_ZONE
        self.mem.write(self.red_zone_at, canary(RED_ZONE))
        self.stack_at, self.stack = self._stack_window(rsp)
        self.code = [(a, self.mem.read(a, n)) for a, n in self._code_ranges()]
        self.undo: list[tuple[int, bytes]] = []
        self.path: list[int] = []
        self._hook = self.cpu.hooks.add_mem_write(self._log_write, 1, 0)

    def close(self) -> None:
        self.cpu.hooks.remove(self._hook)

    def __enter__(self) -> ThreadRunner:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state
    def _stack_window(self, rsp: int) -> tuple[int, bytes]:
        vma = self.mem.find(rsp - 1)
        assert vma is not None, "thread 1's stack is not mapped"
        low = max(vma.start, rsp - STACK_BELOW)
        high = min(vma.end, rsp + STACK_ABOVE)
        return low, self.mem.read(low, high - low)

    def _code_ranges(self) -> list[tuple[int, int]]:
        ranges = [(w.addr, len(w.old)) for w in self.sc.writes]
        return ranges + [(s.vaddr, s.length) for s in self.sc.sites]

    def _log_write(self, addr: int, size: int, _value: int) -> None:
        """Before each guest store outside the saved stack window: remember what it overwrites."""
        if self.stack_at <= addr < self.stack_at + len(self.stack):
            return
        with contextlib.suppress(MemoryFault):  # unmapped: the store faults, nothing to undo
            self.undo.append((addr, self.mem.read(addr, size)))

    def reset(self, writes_done: int) -> None:
        """Thread 1 at the site's entry, the first ``writes_done`` writes in place."""
        for addr, old in reversed(self.undo):
            self.mem.write(addr, old)
        self.undo.clear()
        self.path.clear()
        self.mem.write(self.stack_at, self.stack)
        for addr, code in self.code:
            self._write_code(addr, code)
        self.cpu.write_user_state(self.sc.entry, write_rip=True)
        self.machine.kernel.deferred.clear()
        self.machine.uprobes.return_instances.clear()  # a uretprobe's hijack of thread 1's return is per run
        self.apply(0, writes_done)

    def apply(self, start: int, end: int) -> None:
        """The patching thread performs writes ``start`` .. ``end - 1``; the kernel's state follows."""
        for write in self.sc.writes[start:end]:
            self._write_code(write.addr, write.new)
        self.sc.books[end].restore(self.machine.uprobes)

    def put_original(self, site: Site) -> None:
        self._write_code(site.vaddr, site.original)

    def _write_code(self, addr: int, data: bytes) -> None:
        self.mem.write(addr, data)
        self.mem.backend.flush_code(addr, addr + len(data))

    # ------------------------------------------------------------------ runs
    def run(self, writes_before: int, insns: int | None = None, writes_after: int | None = None) -> ThreadEnd:
        """One interleaving: ``writes_before`` writes, then thread 1 runs ``insns`` instructions, the
        patching thread performs the writes up to ``writes_after``, thread 1 runs to the end."""
        self.reset(writes_before)
        if insns is None or writes_after is None:
            return self.finish(self.sc.sites, 0)
        for done in range(insns):
            end = self._step(self.sc.sites, done)
            if end is not None:
                return end
        self.apply(writes_before, writes_after)
        return self.finish(self.sc.sites, insns)

    def reference(self) -> ThreadEnd:
        """The unprobed run: the same entry state over the original instruction."""
        self.reset(0)
        site = self.sc.site
        self.put_original(site)
        end = self.finish((site,), 0, kernel_regions=False)
        self.reset(0)
        return end

    def finish(self, sites: tuple[Site, ...], done: int, kernel_regions: bool = True) -> ThreadEnd:
        while done < MAX_STEPS:
            end = self._step(sites, done, kernel_regions)
            if end is not None:
                return end
            done += 1
        return self._end(done, limit=True, detail=f"still inside the site or trampoline after {MAX_STEPS} instructions")

    def _step(self, sites: tuple[Site, ...], done: int, kernel_regions: bool = True) -> ThreadEnd | None:
        """Execute one instruction; a ThreadEnd if thread 1 left the region or died."""
        start = self.cpu.read(Reg.RIP)
        self.path.append(start)
        try:
            reason = self.cpu.step(start)
            while self.machine.kernel.deferred:
                self.machine.kernel.deferred.pop(0)()
        except GuestKilled as kill:
            return self._end(done + 1, signal=kill.signal, detail=kill.detail)
        except GuestExit as ex:
            return self._end(done + 1, detail=f"the thread's process exited with status {ex.status}", limit=True)
        if reason is not StopReason.FINISHED:
            return self._fault(done + 1, reason)
        rip = self.cpu.read(Reg.RIP)
        if any(rip in s for s in sites) or (kernel_regions and self._in_kernel_region(rip)):
            return None
        if not self._executable(rip):
            return self._end(done + 1, signal=Signal.SIGSEGV, detail=f"execution of {rip:#x}, not executable")
        return self._end(done + 1)

    def _fault(self, steps: int, reason: StopReason) -> ThreadEnd:
        if reason is StopReason.INVALID_INSN:
            return self._end(steps, signal=Signal.SIGILL, detail="invalid opcode")
        bad = self.cpu.last_bad_access
        what = f"{bad.access.value} of {bad.address:#x}" if bad else reason.value
        return self._end(steps, signal=Signal.SIGSEGV, detail=what)

    def _in_kernel_region(self, rip: int) -> bool:
        vma = self.mem.find(rip)
        return vma is not None and vma.name in KERNEL_REGIONS

    def _executable(self, rip: int) -> bool:
        vma = self.mem.find(rip)
        return vma is not None and bool(vma.prot & Prot.EXEC)

    def _end(self, steps: int, signal: Signal | None = None, detail: str = "", limit: bool = False) -> ThreadEnd:
        regs = tuple(self.cpu.read_user_state())
        return ThreadEnd(steps, regs[RIP_INDEX], regs, self.mem.read(self.red_zone_at, RED_ZONE), signal, detail,
                         limit, tuple(self.path), self._insn_at(self.path[-1]) if self.path else "")

    def _insn_at(self, addr: int) -> str:
        """``call 0x13ff000 (e8 fb bf ff ff)``: what thread 1 found at ``addr``, torn or not."""
        try:
            code = self.mem.read(addr, 16)
        except MemoryFault:
            return "<unmapped>"
        for _addr, size, mnemonic, ops in cs64().disasm_lite(code, addr, 1):
            return f"{mnemonic} {ops}".strip() + f" ({code[:size].hex(' ')})"
        return f"<undecodable {code[:4].hex(' ')}>"
