"""Minimal static-ELF loader + fake kernel on bare Unicorn: the baseline for overhead.py.

This is what a user would write with the stock Unicorn binding and nothing else:
map the PT_LOAD segments, build an initial stack (argc/argv/envp/auxv with
AT_PHDR, AT_PHENT, AT_PHNUM, AT_PAGESZ, AT_ENTRY, AT_RANDOM), and answer the few
syscalls a glibc ``-static`` binary makes with ``uc.reg_read``/``uc.reg_write``:
brk, arch_prctl(ARCH_SET_FS), set_tid_address, set_robust_list, rseq (-ENOSYS),
prlimit64, readlink, getrandom, mprotect, newfstatat, write, writev, getpid,
exit, exit_group. Anything else is -ENOSYS. No dynamic binaries, no threads.

ELF headers are parsed with ``struct`` (no pyelftools import), capstone is
imported only for ``--count``.

    python3 benchmarks/bare_loader.py [--count] [--prime] [--timing] [--virtual-tlb] PROG [ARGS...]

The guest's stdout/stderr go to fds 1/2 and the exit status is the guest's.
``--timing`` prints one JSON line on stderr (init/run seconds, instructions); ``--virtual-tlb`` runs
Unicorn in its virtual-TLB mode with data pages kept non-executable (BareProcess.virtual_tlb).
"""

from __future__ import annotations

import os
import struct
import sys
import time
from collections.abc import Callable

import unicorn
from unicorn import x86_const as x86

PAGE = 0x1000
STACK_TOP = 0x7FFFFFFFF000
STACK_SIZE = 8 << 20
PIE_BASE = 0x555555554000

ENOSYS, EBADF, EINVAL, EFAULT = 38, 9, 22, 14
ARCH_SET_FS = 0x1002
AT_PHDR, AT_PHENT, AT_PHNUM, AT_PAGESZ, AT_ENTRY, AT_RANDOM = 3, 4, 5, 6, 9, 25
PT_LOAD, PT_INTERP, PT_PHDR = 1, 3, 6
MASK64 = (1 << 64) - 1


def page_down(x: int) -> int:
    return x & ~(PAGE - 1)


def page_up(x: int) -> int:
    return (x + PAGE - 1) & ~(PAGE - 1)


def prime() -> unicorn.Uc:
    """A throwaway Uc that has run code. Keep the returned object alive (docs/unicorn.md section 1:
    the first Uc of a process runs hot code 2-3x slower; a live primer takes that hit)."""
    uc = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)
    uc.mem_map(0x1000, 0x1000)
    uc.mem_write(0x1000, b"\x90\x90")
    uc.emu_start(0x1000, 0x1002)
    return uc


def _stdout_writer(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class BareProcess:
    """One static x86-64 ELF process on a bare ``Uc``."""

    def __init__(self, path: str, argv: list[str], envp: list[str], out: Callable[[int, bytes], None] | None = None,
                 pid: int = 4242) -> None:
        self.uc = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)
        self.path = os.path.abspath(path)
        self.out = out if out is not None else _stdout_writer  # out(fd, bytes)
        self.pid = pid
        self.exit_status: int | None = None
        self.syscalls = 0
        self.insns = 0
        self.mapped: set[int] = set()
        self._load(argv, envp)
        self.uc.hook_add(unicorn.UC_HOOK_INSN, self._on_syscall, None, 1, 0, x86.UC_X86_INS_SYSCALL)

    # ------------------------------------------------------------------ loading
    def _map(self, addr: int, size: int) -> None:
        lo, hi = page_down(addr), page_up(addr + size)
        pages = range(lo, hi, PAGE)
        if not any(p in self.mapped for p in pages):
            self.uc.mem_map(lo, hi - lo, unicorn.UC_PROT_ALL)
        else:
            for p in pages:
                if p not in self.mapped:
                    self.uc.mem_map(p, PAGE, unicorn.UC_PROT_ALL)
        self.mapped.update(pages)

    def _load(self, argv: list[str], envp: list[str]) -> None:
        with open(self.path, "rb") as fh:
            data = fh.read()
        if data[:4] != b"\x7fELF" or data[4] != 2 or struct.unpack_from("<H", data, 18)[0] != 62:
            raise SystemExit(f"{self.path}: not an x86-64 ELF64 file")
        e_type, = struct.unpack_from("<H", data, 16)
        e_entry, e_phoff = struct.unpack_from("<QQ", data, 24)
        e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
        base = PIE_BASE if e_type == 3 else 0
        phdr, end = 0, 0
        for i in range(e_phnum):
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _align = struct.unpack_from(
                "<IIQQQQQQ", data, e_phoff + i * e_phentsize)
            if p_type == PT_INTERP:
                raise SystemExit(f"{self.path}: dynamic binaries are not supported by the bare loader")
            if p_type == PT_PHDR:
                phdr = base + p_vaddr
            if p_type != PT_LOAD:
                continue
            va = base + p_vaddr
            self._map(va, p_memsz)
            self.uc.mem_write(va, data[p_offset:p_offset + p_filesz])
            end = max(end, va + p_memsz)
            if not phdr and p_offset <= e_phoff < p_offset + p_filesz:
                phdr = va + e_phoff - p_offset
        self.entry = base + e_entry
        self.brk = page_up(end)

        self._map(STACK_TOP - STACK_SIZE, STACK_SIZE)
        strings = bytearray()
        top = STACK_TOP - 16

        def put(b: bytes) -> int:
            strings[:0] = b
            return top - len(strings)

        arg_ptrs = [put(a.encode() + b"\0") for a in reversed(argv)][::-1]
        env_ptrs = [put(e.encode() + b"\0") for e in reversed(envp)][::-1]
        random_at = put(os.urandom(16))
        self.uc.mem_write(top - len(strings), bytes(strings))
        auxv = [(AT_PHDR, phdr), (AT_PHENT, e_phentsize), (AT_PHNUM, e_phnum), (AT_PAGESZ, PAGE),
                (AT_ENTRY, self.entry), (AT_RANDOM, random_at), (0, 0)]
        words = [len(argv), *arg_ptrs, 0, *env_ptrs, 0, *[x for kv in auxv for x in kv]]
        sp = (top - len(strings) - 8 * len(words)) & ~0xF
        self.uc.mem_write(sp, struct.pack(f"<{len(words)}Q", *words))
        self.uc.reg_write(x86.UC_X86_REG_RSP, sp)

    # ------------------------------------------------------------- fake kernel
    def _on_syscall(self, uc: unicorn.Uc, _user_data: object) -> None:
        self.syscalls += 1
        nr = uc.reg_read(x86.UC_X86_REG_RAX)
        if nr == 39:  # getpid: the hot path of getpid_loop, nothing else to do
            uc.reg_write(x86.UC_X86_REG_RAX, self.pid)
            return
        a0 = uc.reg_read(x86.UC_X86_REG_RDI)
        a1 = uc.reg_read(x86.UC_X86_REG_RSI)
        a2 = uc.reg_read(x86.UC_X86_REG_RDX)
        a3 = uc.reg_read(x86.UC_X86_REG_R10)
        ret = -ENOSYS
        if nr == 1:  # write
            if a0 in (1, 2):
                self.out(a0, bytes(uc.mem_read(a1, a2)))
                ret = a2
            else:
                ret = -EBADF
        elif nr == 20:  # writev
            ret = 0
            for i in range(a2):
                base, length = struct.unpack("<QQ", uc.mem_read(a1 + 16 * i, 16))
                if length:
                    self.out(a0, bytes(uc.mem_read(base, length)))
                ret += length
        elif nr == 12:  # brk
            if a0 > self.brk:
                self._map(self.brk, a0 - self.brk)
                self.brk = page_up(a0)
            ret = self.brk
        elif nr == 158:  # arch_prctl
            if a0 == ARCH_SET_FS:
                uc.reg_write(x86.UC_X86_REG_FS_BASE, a1)
                ret = 0
            else:
                ret = -EINVAL
        elif nr in (60, 231):  # exit, exit_group
            self.exit_status = a0 & 0xFF
            uc.emu_stop()
            ret = 0
        elif nr == 218:  # set_tid_address
            ret = self.pid
        elif nr in (10, 273):  # mprotect, set_robust_list
            ret = 0
        elif nr == 302:  # prlimit64: report an 8 MiB stack / unlimited for anything else
            if a3:
                uc.mem_write(a3, struct.pack("<QQ", 8 << 20 if a1 == 3 else MASK64, MASK64))
            ret = 0
        elif nr == 89:  # readlink: only /proc/self/exe matters
            target = self.path.encode()[:a2]
            uc.mem_write(a1, target)
            ret = len(target)
        elif nr == 318:  # getrandom
            uc.mem_write(a0, os.urandom(a1))
            ret = a1
        elif nr == 262:  # newfstatat: a zeroed stat (not a tty, so stdout is fully buffered)
            uc.mem_write(a2, bytes(144))
            ret = 0
        uc.reg_write(x86.UC_X86_REG_RAX, ret & MASK64)

    # ------------------------------------------------------------------ running
    def virtual_tlb(self) -> None:
        """Unicorn's virtual-TLB mode, with a fill hook that keeps EXEC off the pages the program loads
        from and stores to (a fetch gets read+exec, a load or store read+write): the fastest stores a
        bare-Unicorn user can get from Unicorn 2.1.4 (its default mode keeps every store slow)."""

        def fill(_uc: unicorn.Uc, vaddr: int, access: int, entry: object, _data: object) -> bool:
            entry.paddr = vaddr  # type: ignore[attr-defined]
            fetch = access == unicorn.UC_MEM_FETCH
            entry.perms = unicorn.UC_PROT_READ | (unicorn.UC_PROT_EXEC if fetch else unicorn.UC_PROT_WRITE)  # type: ignore[attr-defined]
            return True

        self.uc.ctl_set_tlb_mode(unicorn.UC_TLB_VIRTUAL)  # type: ignore[attr-defined]  # (not in the type stubs)
        self.uc.hook_add(unicorn.UC_HOOK_TLB_FILL, fill)

    def count_insns(self) -> None:
        """Count executed instructions exactly: a block hook plus a capstone decode per block."""
        import capstone

        cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        cache: dict[tuple[int, int], int] = {}

        def on_block(uc: unicorn.Uc, addr: int, size: int, _ud: object) -> None:
            n = cache.get((addr, size))
            if n is None:
                code = bytes(uc.mem_read(addr, size))
                n = cache[(addr, size)] = sum(1 for _ in cs.disasm_lite(code, addr)) or 1
            self.insns += n

        self.uc.hook_add(unicorn.UC_HOOK_BLOCK, on_block)

    def run(self) -> int:
        """Run to exit_group; return the guest's exit status."""
        try:
            self.uc.emu_start(self.entry, MASK64)
        except unicorn.UcError as err:
            rip = self.uc.reg_read(x86.UC_X86_REG_RIP)
            raise RuntimeError(f"{err} at rip={rip:#x}") from None
        if self.exit_status is None:
            rip = self.uc.reg_read(x86.UC_X86_REG_RIP)
            raise RuntimeError(f"emulation stopped without exit at rip={rip:#x}")
        return self.exit_status


def main(argv: list[str]) -> int:
    flags = {"--count": False, "--prime": False, "--timing": False, "--virtual-tlb": False}
    while argv and argv[0] in flags:
        flags[argv.pop(0)] = True
    if not argv:
        sys.stderr.write(__doc__ or "")
        return 2
    primer = prime() if flags["--prime"] else None
    t0 = time.perf_counter()
    proc = BareProcess(argv[0], argv, [f"{k}={v}" for k, v in os.environ.items()])
    if flags["--virtual-tlb"]:
        proc.virtual_tlb()
    if flags["--count"]:
        proc.count_insns()
    t1 = time.perf_counter()
    status = proc.run()
    t2 = time.perf_counter()
    if flags["--timing"]:
        import json

        sys.stderr.write(json.dumps({"init_s": t1 - t0, "run_s": t2 - t1, "syscalls": proc.syscalls,
                                     "insns": proc.insns if flags["--count"] else None}) + "\n")
    del primer
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
