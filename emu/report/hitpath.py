"""The path of one probe hit, instruction by instruction: site -> trampoline or slot -> the
kernel's entry (syscall or INT3) -> its exit (SYSRET or IRET) -> resume, for the check page's
sequence diagram.

A code hook on each site address opens a recording; a block hook appends the blocks run in the
kernel's user pages until execution is back in the guest's own code. Each site is followed until one
of its hits takes a non-INT3 path (or for two hits); the hooks are removed once every site is
done, so a long run pays for them only at its start. ``paths`` keeps the first hit of each path.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emu.disasm import cs64
from emu.kernel.uprobes.consumers import EntryPath
from emu.process.vma import KERNEL_SIDE

if TYPE_CHECKING:
    from emu.cpu import HookHandle
    from emu.kernel.uprobes.records import Uprobe
    from emu.kernel.uprobes.regs import PtRegs
    from emu.machine import Machine
    from emu.process.vma import Vma

MAX_HITS = 2  # hits followed per site: the designs that optimize do it on the first hit
MAX_STEPS = 64  # instructions kept per hit (a design that loops in its slot is cut short)
_ENDS_BLOCK = frozenset({"syscall", "int3", "call", "jmp", "ret", "iretq", "sysretq", "hlt", "ud2"})


@dataclass(frozen=True, slots=True)
class Step:
    address: int
    code: bytes
    text: str
    where: str  # "site", a kernel page's name, or "guest"


@dataclass(slots=True)
class HitPath:
    probe: str
    site: int
    steps: list[Step] = field(default_factory=list)
    path: str = "?"  # how the kernel was entered (emu.kernel.uprobes.consumers.EntryPath)
    kernel_at: int = -1  # the number of steps run before the kernel's handler chain
    exit: str = "none"  # "sysret", "iret" or "none" (an INT3 trap's return is not counted as either)
    resume: int = 0
    exits_before: Counter[str] = field(default_factory=Counter)


class HitTracer:
    """Install on a machine with its probes attached, before the run; read ``paths`` after it."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.paths: list[HitPath] = []
        self._sites: dict[int, str] = {}
        self._current: HitPath | None = None
        self._cs = cs64()
        self._pending: dict[int, int] = {}  # site -> hits it may still be followed for
        self._hooks: list[HookHandle] = []
        self._done = True
        machine.uprobes.chain_observers.append(self._on_chain)
        # A library's probes are placed when it is mapped; the machine's own observer runs first.
        machine.kernel.exec_mmap_observers.append(self._on_mmap)
        self._on_mmap(None)

    def _follow(self, sites: list[int]) -> None:
        """Hook ``sites`` (and, if not hooked yet, every block) until they are done."""
        if not sites:
            return
        cpu = self.machine.cpu
        if self._done:
            self._hooks.append(cpu.hooks.add_block(self._on_block))
            self._done = False
        for address in sites:
            self._pending[address] = MAX_HITS
            self._hooks.append(cpu.hooks.add_code(self._on_site, address, address))

    def _on_mmap(self, _vma: Vma | None) -> None:
        new = [att for att in self.machine.attachments if att.address not in self._sites]
        for att in new:
            self._sites[att.address] = att.resolved.spec.text
        self._follow([att.address for att in new])

    @property
    def finished(self) -> bool:
        """Every site was followed as far as wanted; the hooks are removed."""
        return self._done

    def where(self, address: int) -> str:
        """"site" for a probe site, the kernel page's name, else "guest"."""
        if address in self._sites:
            return "site"
        vma = self.machine.mem.find(address)
        return vma.name if vma is not None and vma.name in KERNEL_SIDE else "guest"

    def _on_site(self, address: int, _size: int) -> None:
        if self._done or self._current is not None or address not in self._pending:
            return
        self._current = HitPath(self._sites[address], address, exits_before=Counter(self.machine.uprobes.stats.exits))
        self._append(address, 16, one=True)

    def _on_block(self, address: int, size: int) -> None:
        current = self._current
        if current is None or self._done:
            return
        where = self.where(address)
        if where == "guest" or (where == "site" and current.kernel_at >= 0):
            self._finish(current, address)
        elif where != "site":  # the site's own block was recorded by the code hook
            self._append(address, size)

    def _on_chain(self, probe: Uprobe, _regs: PtRegs | None, path: EntryPath, after: bool) -> None:
        current = self._current
        if current is not None and not after and current.kernel_at < 0:
            current.path, current.kernel_at = path.value, len(current.steps)

    def _append(self, address: int, size: int, one: bool = False) -> None:
        current = self._current
        assert current is not None
        code = self.machine.mem.read(address, size)
        where = self.where(address)
        for addr, length, mnemonic, op_str in self._cs.disasm_lite(code, address):
            if len(current.steps) >= MAX_STEPS:
                return
            current.steps.append(Step(addr, code[addr - address : addr - address + length],
                                      f"{mnemonic} {op_str}".strip(), where))
            if one or mnemonic in _ENDS_BLOCK:
                return

    def _finish(self, current: HitPath, address: int) -> None:
        exits = Counter(self.machine.uprobes.stats.exits)
        exits.subtract(current.exits_before)
        current.exit = next((k for k in ("sysret", "iret") if exits[k] > 0), "none")
        current.resume = address
        self._current = None
        if not any(p.path == current.path for p in self.paths):
            self.paths.append(current)
        self._pending[current.site] -= 1
        if current.path != EntryPath.INT3.value or not self._pending[current.site]:
            del self._pending[current.site]
        if not self._pending:
            self._stop()

    def _stop(self) -> None:
        self._done = True
        for hook in self._hooks:
            self.machine.cpu.hooks.remove(hook)
        self._hooks = []
