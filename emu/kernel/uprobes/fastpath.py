"""The optimized-site syscalls when nothing can change a register.

When every consumer of the probe only counts (no handler, no ret_handler) and no
shadow stack is modelled, sys_uprobe's pt_regs round trip (spec 2.1) writes
back exactly what it read. What remains observable is: the hit, the saved words read
from the stack, and the exit (SYSRET into the trampoline for call designs: rax = 0,
rcx = ip, r11 = flags; IRET to probe+5 for jmp slots with rax/rcx/r11/rsp restored).
These functions do only that, and return False whenever the full path is needed
(an error, a fault, a consumer that looks at registers).
"""

from __future__ import annotations

import struct

from emu.abi import RED_ZONE
from emu.cpu import Reg
from emu.designs import SiteMode
from emu.kernel.uprobes.consumers import Path
from emu.kernel.uprobes.core import Uprobes
from emu.memory import UserFault

U64 = (1 << 64) - 1
_IRET_REGS = (Reg.RAX, Reg.RCX, Reg.R11, Reg.RSP, Reg.RIP)


class FastPaths:
    def __init__(self, up: Uprobes) -> None:
        self.up = up
        self.write_iret = up.cpu.batch_writer(_IRET_REGS)
        self.insn_len = 10 if up.design.sites is SiteMode.LEA_CALL_NOP10 else 5

    def _counting_only(self, vaddr: int, path: Path) -> bool:
        """Count the hit if no consumer can change a register; observers hear of it with regs=None
        (nothing changed). False: the full path must run."""
        up = self.up
        if up.shadow_stack is not None:
            return False
        probe = up.probes.get(vaddr)
        if probe is None:
            return True  # no uprobe there any more: the trampoline just returns (spec 3.6)
        for consumer in probe.consumers:
            if consumer.handler is not None or consumer.ret_handler is not None:
                return False
        for observer in up.chain_observers:
            observer(probe, None, path, False)
        for consumer in probe.consumers:
            if consumer.enabled:
                consumer.hits += 1
                consumer.paths[path.value] = consumer.paths.get(path.value, 0) + 1
        for observer in up.chain_observers:
            observer(probe, None, path, True)
        return True

    def call(self, entry: list[int]) -> bool:
        """sys_uprobe for the call designs (6.18 nop5, nop10). ``entry``: the dispatcher's register snapshot."""
        up = self.up
        rip, flags, sp = entry[7], entry[8], entry[9]
        ip = rip + 2
        if not up.sites.in_trampoline(ip):
            return False
        try:
            raw = up.mem.read_user(sp, 32)
        except UserFault:
            return False
        retaddr = struct.unpack_from("<Q", raw, 24)[0]
        if not self._counting_only((retaddr - self.insn_len) & U64, Path.CALL):
            return False
        up.stats.copied += 64  # the words are read and written back unchanged
        up.stats.exits["sysret"] += 1
        up.cpu.write_syscall_return(0, ip, flags)  # SYSRET: rcx <- ip, r11 <- flags; the trampoline pops the rest
        return True

    def slot(self, entry: list[int]) -> bool:
        """sys_uprobe for jmp slots: IRET to probe+5 with rax/rcx/r11/rsp as they were at the site."""
        up = self.up
        rip, sp = entry[7], entry[9]
        vaddr = up.sites.probe_of_slot(rip + 2)
        if vaddr is None:
            return False
        try:
            raw = up.mem.read_user(sp, 24)
        except UserFault:
            return False
        if not self._counting_only(vaddr, Path.JMP):
            return False
        ax, r11, cx = struct.unpack("<3Q", raw)
        up.stats.copied += 24
        up.stats.exits["iret"] += 1
        # Unicorn adds 2 to rip once the syscall hook returns
        self.write_iret((ax, cx, r11, sp + 24 + RED_ZONE, vaddr + 5 - 2))
        return True


