"""The optimized-site syscall when nothing can change a register.

When every consumer of the probe only counts (no handler, no ret_handler) and no
shadow stack is modelled, sys_uprobe's pt_regs round trip (spec 2.1) writes
back exactly what it read. What remains observable is: the hit, the saved words read
from the stack, and the exit: SYSRET into the trampoline (rax = 0, rcx = ip, r11 = flags)
for the 'trampoline' exit, or straight to the site's next instruction with the saved
registers and rsp restored (IRET; SYSRET also sets rcx and r11). This does only that, and
returns False whenever the full path is needed (an error, a fault, a consumer that looks
at registers).
"""

from __future__ import annotations

import struct

from emu.cpu import Reg
from emu.kernel.uprobes.consumers import Path
from emu.kernel.uprobes.core import Uprobes
from emu.memory import UserFault

U64 = (1 << 64) - 1
SAVED_REG = {name: Reg[f"R{name.upper()}" if len(name) == 2 and not name[1].isdigit() else name.upper()]
             for name in ("ax", "bx", "cx", "dx", "si", "di", "bp", "r8", "r9", "r10", "r11", "r12", "r13", "r14",
                          "r15")}


class FastPaths:
    def __init__(self, up: Uprobes) -> None:
        self.up = up
        handler, patch = up.design.handler, up.design.patch
        self.enabled = handler is not None and patch is not None and "flags" not in handler.saved
        if handler is None or patch is None or not self.enabled:
            return
        self.handler, self.patch = handler, patch
        self.saved_fmt = f"<{len(handler.saved)}Q"
        self.path = Path.CALL if patch.branch == "call" else Path.JMP
        self.branch_end = len(patch.prefix_bytes) + 5
        self.by_slot = handler.probe_from == "slot"
        self.words = len(handler.saved) + (0 if self.by_slot else 1)  # + the call's return address
        # SYSCALL itself left rcx = ip and r11 = flags; the saved words then override what the design restores
        direct = [Reg.RCX, Reg.R11] + [SAVED_REG[n] for n in handler.saved] + [Reg.RSP, Reg.RIP]
        if handler.exit == "sysret":
            direct += [Reg.RCX, Reg.R11]  # written last: SYSRET's rcx and r11 win over the restored ones
        self.write_direct = up.cpu.batch_writer(direct)

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

    def uprobe(self, entry: list[int]) -> bool:
        """sys_uprobe on the fast path. ``entry``: the dispatcher's register snapshot (rip, flags, sp at 7-9)."""
        if not self.enabled:
            return False
        up, handler, words = self.up, self.handler, self.words
        rip, flags, sp = entry[7], entry[8], entry[9]
        ip = rip + 2
        vaddr = up.sites.probe_of_slot(ip) if self.by_slot else None
        if vaddr is None if self.by_slot else not up.sites.in_trampoline(ip):
            return False
        try:
            raw = up.mem.read_user(sp + handler.saved_offset, 8 * words)
        except UserFault:
            return False
        if vaddr is None:
            vaddr = (struct.unpack_from("<Q", raw, 8 * len(handler.saved))[0] - self.branch_end) & U64
        if not self._counting_only(vaddr, self.path):
            return False  # the full path looks the trampoline up again, and counts that lookup
        if not self.by_slot:
            up.stats.mmap_locks += 1  # the lookup Uprobes.in_trampoline counts on the full path
        if handler.exit == "trampoline":
            up.stats.copied += 16 * words  # the words are read and written back unchanged
            up.stats.exits["sysret"] += 1
            up.cpu.write_syscall_return(0, ip, flags)  # SYSRET: rcx <- ip, r11 <- flags; the trampoline pops the rest
            return True
        up.stats.copied += 8 * words
        next_ip = vaddr + self.patch.length
        values = [ip, flags, *struct.unpack_from(self.saved_fmt, raw), sp + handler.saved_offset + 8 * words + handler.sp_skip,
                  next_ip - 2]
        if handler.exit == "sysret":
            values += [next_ip, flags]
        up.stats.exits["iret" if handler.exit == "iret" else "sysret"] += 1
        self.write_direct(values)  # Unicorn adds 2 to rip once the syscall hook returns
        return True
