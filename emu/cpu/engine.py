"""One x86-64 CPU with its memory, as Unicorn provides it: registers, contexts, memory, runs.

Its hooks are :attr:`Cpu.hooks` (emu/cpu/hooks.py); the whole-state snapshots of the verifiers are
emu/cpu/state.py. Register and memory I/O goes through Unicorn's C functions directly
(emu/cpu/binding.py).
"""

from __future__ import annotations

import ctypes
import struct
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import unicorn
import unicorn.x86_const as x86

from emu import hotpath
from emu.abi import PAGE_SIZE, Prot, page_down
from emu.cpu import binding
from emu.cpu.hooks import Hooks
from emu.cpu.pages import PageTable, install_tlb_fill
from emu.cpu.regs import (
    CR0_MP,
    CR0_NE,
    EXEC_STATE,
    FLAGS_FIXED,
    FLAGS_KERNEL_ONLY,
    FXSAVE_SIZE,
    GPRS,
    SYSCALL_REGS,
    Reg,
    user_flags,
)
from emu.cpu.stops import FETCH_FAULTS, UC_ACCESS, Access, BadAccess, StopReason, stop_reason


class HostPages(Protocol):
    """Host memory mapped into engines (MAP_SHARED, emu/process/vma.py's HostPages): its address."""

    address: int

# Linux's selectors (arch/x86/include/asm/segment.h): STAR[63:48] = __USER32_CS, so SYSRET loads
# SS = 0x2b (__USER_DS) and CS = 0x33 (__USER_CS) with RPL and DPL 3.
_MSR_EFER, _MSR_STAR, _EFER_SCE = 0xC0000080, 0xC0000081, 1
_STAR = 0x0023_0010 << 32
_SYSRETQ = b"\x48\x0f\x07"


class _RegBatch:
    """Preallocated buffers for one fixed list of registers (one C call per read or write)."""

    def __init__(self, regs: Sequence[Reg]) -> None:
        n = len(regs)
        self.count = n
        self.ids = (ctypes.c_int * n)(*regs)
        self.values = (ctypes.c_uint64 * n)()
        base = ctypes.addressof(self.values)
        self.ptrs = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])


@dataclass(frozen=True, slots=True)
class CpuContext:
    """A saved CPU state (Unicorn's uc_context): one per guest thread."""

    raw: Any




class _Engines:
    """When Unicorn engines are closed. The binding closes an engine when its Uc is collected, which can
    happen inside a hook of another engine that is emulating (a forked child's machine dropped while
    its parent runs); uc_close there makes the running engine stop as if a hlt had run. So an engine
    whose Cpu is gone is closed only once no emulation is in progress."""

    running = 0  # emu_start calls in progress, across all engines (they nest: hooks run other engines)
    buried: list[Any] = []

    @classmethod
    def adopt(cls, owner: object, uc: Any) -> None:
        finalizer = getattr(uc, "_Uc__finalizer", None)  # the binding's close-on-collect (unicorn 2.1)
        if finalizer is None:
            return  # another binding: leave closing to it
        finalizer.detach()
        weakref.finalize(owner, cls.bury, uc)

    @classmethod
    def bury(cls, uc: Any) -> None:
        cls.buried.append(uc)
        if not cls.running:
            cls.close_buried()

    @classmethod
    def close_buried(cls) -> None:
        while cls.buried:
            binding.close(cls.buried.pop()._uch)


class Cpu:
    """One x86-64 CPU with its memory, as Unicorn provides it."""

    def __init__(self) -> None:
        self._uc = binding.new_engine()
        self._shared_pages: dict[int, HostPages] = {}
        _Engines.adopt(self, self._uc)
        self._uch = self._uc._uch
        self.hooks = Hooks(self._uch)
        # Each page enters the TLB with its mapping's permissions (emu/cpu/pages.py says why); a fault
        # reaches _on_invalid_mem through a hook the fill arms over the faulting page alone.
        self._uc.ctl_set_tlb_mode(unicorn.UC_TLB_VIRTUAL)
        self._fault_cb = binding.MEM_CB(self._on_invalid_mem)
        self.pages = PageTable(self._uch, binding.callback_address(self._fault_cb))
        install_tlb_fill(self.hooks, self.pages, hotpath.native)  # (read now: tests switch it)
        self._one = ctypes.c_uint64()
        self._one_ref = ctypes.byref(self._one)
        self._ret_batch = _RegBatch((Reg.RAX, Reg.RCX, Reg.R11))
        self._syscall_batch = _RegBatch(SYSCALL_REGS)
        self._gpr_batch = _RegBatch(GPRS + (Reg.RIP, Reg.RFLAGS))
        self._rip_batch = _RegBatch((Reg.RIP,))
        self._read_buf = ctypes.create_string_buffer(PAGE_SIZE)
        self._read_view = memoryview(self._read_buf).cast("B")
        self._addr_arg = ctypes.c_uint64()  # reused: a new one per call costs
        self._norip_batch = _RegBatch(GPRS + (Reg.RFLAGS,))
        # fs base, gs base, mxcsr (8 bytes each) then xmm0-15 (16 bytes each), one buffer
        ext_ids = (Reg.FS_BASE, Reg.GS_BASE, Reg.MXCSR) + tuple(x86.UC_X86_REG_XMM0 + i for i in range(16))
        self._ext_buf = ctypes.create_string_buffer(24 + 16 * 16)
        self._ext_batch = _RegBatch(ext_ids)  # type: ignore[arg-type]
        base = ctypes.addressof(self._ext_buf)
        for i in range(len(ext_ids)):
            self._ext_batch.ptrs[i] = base + (8 * i if i < 3 else 24 + 16 * (i - 3))
        self._counting = False  # the last run counted instructions (translated code carries the count hook)
        self.last_bad_access: BadAccess | None = None
        self.on_unmapped: Callable[[BadAccess], bool] | None = None  # True: mapped it, retry the access
        # (begin, end) of code that may have changed: dropped from the translation cache, mapped, unmapped
        self.code_observers: list[Callable[[int, int], None]] = []
        self._wide = ctypes.create_string_buffer(32)  # one x87 or xmm register (fxsave_image)
        self._enter_user_mode()  # before the exec state is saved: a saved context carries the CPL
        self._exec_context = self._linux_exec_state()

    def _linux_exec_state(self) -> CpuContext:
        """Put the registers as Linux leaves them at exec (EXEC_STATE; GPRs, xmm, ymm and the x87 stack
        are Unicorn's zeros) and keep that context for load_exec_state."""
        self.write(Reg.CR0, self.read(Reg.CR0) | CR0_MP | CR0_NE)
        for reg, value in EXEC_STATE:
            self.write(reg, value)
        return self.save_context()

    def load_exec_state(self) -> None:
        """Every register as a freshly exec'd task has it (fs/exec.c: fpu_flush_thread, start_thread),
        rip 0 and rsp 0 included: the caller sets those."""
        self.restore_context(self._exec_context)

    def _enter_user_mode(self) -> None:
        """Drop to CPL 3 the way Linux first does, with a SYSRET (rflags <- r11 = 0x202).

        Unicorn starts at CPL 0, where popf and iret may clear IF and set IOPL and cli/hlt run; at
        CPL 3 the CPU itself keeps IF and IOPL as Linux user mode has them and cli, hlt, in and out
        fault (#GP, SIGSEGV), at no cost per instruction. Unicorn's syscall hook replaces the
        syscall instruction (no switch back to CPL 0) and its interrupt hook runs before any IDT
        lookup, so the CPU stays in user mode for good: a saved context carries the CPL with it.
        SYSRET reads no descriptor table, so none is needed. The stub runs from page 0, unmapped
        before anything else is mapped."""
        uc = self._uc
        self.mem_map(0, PAGE_SIZE, Prot.READ | Prot.WRITE | Prot.EXEC)
        try:
            uc.mem_write(0, _SYSRETQ)
            uc.reg_write(x86.UC_X86_REG_MSR, (_MSR_EFER, uc.reg_read(x86.UC_X86_REG_MSR, _MSR_EFER) | _EFER_SCE))
            uc.reg_write(x86.UC_X86_REG_MSR, (_MSR_STAR, _STAR))
            landing = 0x800  # SYSRET jumps to rcx; the run stops there, before fetching it
            uc.reg_write(x86.UC_X86_REG_RCX, landing)
            uc.reg_write(x86.UC_X86_REG_R11, FLAGS_FIXED)
            uc.emu_start(0, landing)
        finally:
            self.mem_unmap(0, PAGE_SIZE)
        uc.reg_write(x86.UC_X86_REG_RCX, 0)
        uc.reg_write(x86.UC_X86_REG_R11, 0)
        uc.reg_write(x86.UC_X86_REG_RIP, 0)

    # ---------------------------------------------------------------- registers
    def read(self, reg: Reg) -> int:
        binding.reg_read(self._uch, reg, self._one_ref)
        return self._one.value

    def read_narrow(self, reg: Reg) -> int:
        """A register narrower than 64 bits (x87 words, MXCSR, selectors): Unicorn writes only its width."""
        self._one.value = 0
        binding.reg_read(self._uch, reg, self._one_ref)
        return self._one.value

    def write(self, reg: Reg, value: int) -> None:
        if reg == Reg.RFLAGS:
            value = user_flags(value)
        self._one.value = value & 0xFFFFFFFFFFFFFFFF
        binding.reg_write(self._uch, reg, self._one_ref)

    def resume_at(self, rip: int) -> None:
        """Set rip from a hook that runs between translation blocks: an interrupt hook.

        Unicorn 2.1.4's uc_reg_write of rip asks for the next exit not to sync the pc, and only an exit
        from inside a block clears that request. From an interrupt hook no such exit follows, so every
        memory hook and every fault for the rest of the run (until some in-block hook writes rip) would
        read the rip of its block's start, not of its instruction: a guest's SIGSEGV handler would see
        the wrong rip, and the verifiers would name the wrong writer. uc_reg_write_batch leaves that
        request alone, and between blocks nothing has to stop the sync. A hook inside a block (code,
        memory) must keep using ``write``: there the exit that follows would restore the pc over a
        batch write."""
        b = self._rip_batch
        b.values[0] = rip & 0xFFFFFFFFFFFFFFFF
        binding.reg_write_batch(self._uch, b.ids, b.ptrs, 1)

    def batch_writer(self, regs: Sequence[Reg]) -> Callable[[Sequence[int]], None]:
        """A function writing ``regs`` in one C call. Writing RIP ends the translation block."""
        b = _RegBatch(regs)
        flags_at = list(regs).index(Reg.RFLAGS) if Reg.RFLAGS in regs else -1

        def write(values: Sequence[int]) -> None:
            for i, value in enumerate(values):
                b.values[i] = value & 0xFFFFFFFFFFFFFFFF
            if flags_at >= 0:
                b.values[flags_at] = user_flags(b.values[flags_at])
            binding.reg_write_batch(self._uch, b.ids, b.ptrs, b.count)

        return write

    def read_syscall(self) -> list[int]:
        """rax, rdi, rsi, rdx, r10, r8, r9, rip (at the ``syscall``), rflags, rsp: one C call."""
        b = self._syscall_batch
        binding.reg_read_batch(self._uch, b.ids, b.ptrs, b.count)
        return b.values[:]

    def write_syscall_return(self, rax: int, rcx: int, r11: int) -> None:
        b = self._ret_batch
        v = b.values
        v[0] = rax & 0xFFFFFFFFFFFFFFFF
        v[1] = rcx
        v[2] = r11
        binding.reg_write_batch(self._uch, b.ids, b.ptrs, b.count)

    def read_user_state(self) -> list[int]:
        """The 16 GPRs (in GPRS order), rip, rflags: one C call."""
        b = self._gpr_batch
        binding.reg_read_batch(self._uch, b.ids, b.ptrs, b.count)
        return b.values[:]

    def write_user_state(self, values: Sequence[int], write_rip: bool) -> None:
        """Inverse of read_user_state. rip is written only when asked: writing it ends the
        translation block, so a resume at the natural next instruction must leave it alone."""
        b = self._gpr_batch if write_rip else self._norip_batch
        for i in range(16):
            b.values[i] = values[i] & 0xFFFFFFFFFFFFFFFF
        if write_rip:
            b.values[16] = values[16] & 0xFFFFFFFFFFFFFFFF
        b.values[b.count - 1] = (values[17] & ~FLAGS_KERNEL_ONLY & 0xFFFFFFFF) | FLAGS_FIXED  # user_flags, inline
        binding.reg_write_batch(self._uch, b.ids, b.ptrs, b.count)

    def read_extended(self) -> tuple[int, int, bytes, int]:
        """fs base, gs base, xmm0-15 (256 raw little-endian bytes), mxcsr, in one C call."""
        b = self._ext_batch
        binding.reg_read_batch(self._uch, b.ids, b.ptrs, b.count)
        raw = bytes(self._ext_buf)
        fs, gs, mxcsr = struct.unpack_from("<QQQ", raw)
        return fs, gs, raw[24:280], mxcsr

    def write_extended(self, state: tuple[int, int, bytes, int]) -> None:
        """Inverse of read_extended, in one C call (the binding's xmm writes convert each argument)."""
        fs, gs, xmm, mxcsr = state
        struct.pack_into("<QQQ", self._ext_buf, 0, fs, gs, mxcsr)
        ctypes.memmove(ctypes.addressof(self._ext_buf) + 24, xmm, 256)
        b = self._ext_batch
        binding.reg_write_batch(self._uch, b.ids, b.ptrs, b.count)

    def fxsave_image(self) -> bytearray:
        """The x87 and SSE state as the 512-byte FXSAVE64 image (what a signal frame's fpstate holds):
        control, status and abridged tag words, MXCSR, st0-7, xmm0-15. The last-instruction and operand
        pointers read 0 (Unicorn keeps none); MXCSR_MASK is 0xffff, as Unicorn's own fxsave stores it."""
        image = bytearray(FXSAVE_SIZE)
        tags = self.read_narrow(Reg.FPTAG)
        abridged = sum(1 << i for i in range(8) if (tags >> (2 * i)) & 3 != 3)
        struct.pack_into("<HHB", image, 0, self.read_narrow(Reg.FPCW), self.read_narrow(Reg.FPSW), abridged)
        struct.pack_into("<II", image, 24, self.read_narrow(Reg.MXCSR), 0xFFFF)
        for i in range(8):
            binding.reg_read(self._uch, x86.UC_X86_REG_ST0 + i, self._wide)
            image[32 + 16 * i : 42 + 16 * i] = self._wide.raw[:10]
        image[160:416] = self.read_extended()[2]
        return image

    def load_fxsave_image(self, image: bytes) -> None:
        """Inverse of fxsave_image (rt_sigreturn); MXCSR bits the CPU does not have are the caller's check."""
        fcw, fsw, abridged = struct.unpack_from("<HHB", image, 0)
        (mxcsr,) = struct.unpack_from("<I", image, 24)
        self.write(Reg.FPCW, fcw)
        self.write(Reg.FPSW, fsw)  # sets the top of stack first: st(i) below are relative to it
        for i in range(8):
            ctypes.memmove(self._wide, bytes(image[32 + 16 * i : 42 + 16 * i]), 10)
            binding.reg_write(self._uch, x86.UC_X86_REG_ST0 + i, self._wide)
        self.write(Reg.FPTAG, sum((0 if abridged >> i & 1 else 3) << (2 * i) for i in range(8)))
        fs, gs, _xmm, _mxcsr = self.read_extended()
        self.write_extended((fs, gs, bytes(image[160:416]), mxcsr))

    def read_raw(self, reg: int, into: ctypes.Array[ctypes.c_char]) -> None:
        """Register ``reg`` into ``into`` as Unicorn stores it (any width: an xmm register is 16 bytes)."""
        binding.reg_read(self._uch, reg, into)

    def write_raw(self, reg: int, value: ctypes.Array[ctypes.c_char]) -> None:
        """Inverse of read_raw (no user-mode rule applies: for checks on a CPU that is not running)."""
        binding.reg_write(self._uch, reg, value)

    def write_xmm(self, index: int, value: int) -> None:
        self._uc.reg_write(x86.UC_X86_REG_XMM0 + index, value)

    # ------------------------------------------------------------------ contexts
    def save_context(self, into: CpuContext | None = None) -> CpuContext:
        """Every register of the CPU (GPRs, rip, flags, fs/gs base, x87/SSE/AVX state), as Unicorn keeps
        it; ``into`` is reused (an update is cheaper than a new context)."""
        if into is None:
            return CpuContext(self._uc.context_save())
        self._uc.context_update(into.raw)
        return into

    def restore_context(self, context: CpuContext) -> None:
        """Load a saved context; memory and the translation cache are untouched."""
        self._uc.context_restore(context.raw)

    # ------------------------------------------------------------------- memory
    # Unicorn flushes the TLB when it maps or unmaps; the page table follows every change.
    def mem_map(self, addr: int, size: int, prot: Prot) -> None:
        self._uc.mem_map(addr, size, int(prot))
        self.pages.set(addr, addr + size, int(prot))
        self._code_changed(addr, addr + size)

    def _code_changed(self, begin: int, end: int) -> None:
        for observer in self.code_observers:
            observer(begin, end)

    def mem_map_shared(self, addr: int, size: int, prot: Prot, pages: HostPages, offset: int) -> None:
        """Map host memory other engines map too (MAP_SHARED); guest stores still fire the write hooks."""
        self._uc.mem_map_ptr(addr, size, int(prot), pages.address + offset)
        self.pages.set(addr, addr + size, int(prot))
        self._code_changed(addr, addr + size)
        self._shared_pages[id(pages)] = pages  # alive as long as this engine may touch it

    def mem_unmap(self, addr: int, size: int) -> None:
        self._uc.mem_unmap(addr, size)  # it drops the range's code while the table still shows it
        self.pages.set(addr, addr + size, None)
        self._code_changed(addr, addr + size)
        self._drop_grants()

    def _drop_grants(self) -> None:
        """Unicorn fills the TLB for a fetch of a range it drops code from, whatever the range holds
        (emu/cpu/pages.py): an entry that lets a data page run must not stay in the TLB."""
        if self.pages.take_granted():
            binding.ctl(self._uch, binding.CTL_FLUSH_TLB)

    def mem_protect(self, addr: int, size: int, prot: Prot) -> None:
        """mprotect. Unicorn flushes its TLB only when a page's writability changes, so this flushes it
        every time. Where EXEC goes, the range's translated code goes first, while the table still lets
        Unicorn find it (emu/cpu/pages.py): it would run on from the cache where a jump must fault, and
        stores made while the page is not executable invalidate nothing, so once EXEC comes back the
        page must run what it holds then."""
        if self.pages.takes_exec(addr, addr + size, int(prot)):
            self.flush_code(addr, addr + size)
        self._uc.mem_protect(addr, size, int(prot))
        self.pages.set(addr, addr + size, int(prot))
        self.pages.take_granted()
        binding.ctl(self._uch, binding.CTL_FLUSH_TLB)

    def mem_read(self, addr: int, size: int) -> bytes:
        small = size <= PAGE_SIZE  # up to a page: one reused buffer
        buf = self._read_buf if small else ctypes.create_string_buffer(size)
        self._addr_arg.value = addr
        status = binding.mem_read(self._uch, self._addr_arg, buf, size)
        if status != unicorn.UC_ERR_OK:
            raise binding.UcError(status)
        return self._read_view[:size].tobytes() if small else buf.raw

    def mem_write(self, addr: int, data: bytes) -> None:
        self._addr_arg.value = addr
        status = binding.mem_write(self._uch, self._addr_arg, data if type(data) is bytes else bytes(data), len(data))
        if status != unicorn.UC_ERR_OK:
            raise binding.UcError(status)

    def flush_code(self, begin: int, end: int) -> None:
        """Drop translated code for [begin, end) so patched bytes and new hooks take effect.

        uc_ctl called directly: the binding's ctl_remove_cache encodes its arguments in Python."""
        status = binding.ctl(self._uch, binding.CTL_REMOVE_CACHE, ctypes.c_uint64(begin), ctypes.c_uint64(end))
        if status != unicorn.UC_ERR_OK:
            raise binding.UcError(status)
        self._drop_grants()
        self._code_changed(begin, end)

    def step(self, begin: int) -> StopReason:
        """Execute exactly one instruction at ``begin``.

        Unicorn counts instructions only in code translated while counting, so the
        translation cache is dropped first: otherwise a jump into already translated
        code would run on past the one instruction.
        """
        binding.ctl(self._uch, binding.CTL_FLUSH_TB)
        return self.run(begin, count=1)

    # ------------------------------------------------------------------- faults
    def _on_invalid_mem(self, _uc: object, access: int, addr: int, size: int, _value: int, _ud: object) -> bool:
        kind, unmapped = UC_ACCESS.get(access, (Access.READ, True))
        self.last_bad_access = BadAccess(kind, addr, size, unmapped)
        if unmapped and self.on_unmapped is not None and self.on_unmapped(self.last_bad_access):
            self.pages.disarm(addr)  # mapped now: its stores may take the fast path again
            return True
        return False

    # --------------------------------------------------------------------- runs
    def run(self, begin: int, timeout_us: int = 0, count: int = 0) -> StopReason:
        """Run from ``begin`` until stopped (or ``count`` instructions); re-raise any exception a hook raised.

        Unicorn counts through a code hook compiled into each translation block, so code translated by
        an uncounted run would not count: going from uncounted to counted drops the cache first
        (Unicorn itself flushes the other way). Counting calls a hook at every instruction (a tight
        loop runs an order of magnitude slower), which is why single-threaded runs do not count, and
        why ``--json``, ``--max-insns``, the clock and long time slices count per translated block
        instead (emu/process/icount.py) and use ``count`` only for the last few instructions before a limit.

        A fetch from an unmapped page goes to ``on_unmapped`` after the run stops (emu/cpu/pages.py:
        no hook hears of it); if that maps it, an uncounted run goes on from there. A counted run
        reports the fault instead (a run that starts again counts again): with ``count`` 1, a fetch
        fault at another address than ``begin`` is the next instruction's, after the one ran."""
        self.last_bad_access = None
        if count and not self._counting:
            self.flush_all_code()
        self._counting = bool(count)
        reason = self._emulate(begin, timeout_us, count)
        while (not count and reason is StopReason.BAD_ACCESS and (bad := self.last_bad_access) is not None
               and bad.access is Access.FETCH and bad.unmapped and self.on_unmapped is not None
               and self.on_unmapped(bad)):
            reason = self._emulate(self.read(Reg.RIP), timeout_us, count)  # mapped now: fetch it again
        hooks = self.hooks
        if hooks.error is not None:
            exc, hooks.error = hooks.error, None
            raise exc
        return reason

    def _emulate(self, begin: int, timeout_us: int, count: int) -> StopReason:
        """One uc_emu_start; what stopped it (a fetch that faulted: the fault, in last_bad_access)."""
        _Engines.running += 1
        try:
            self._uc.emu_start(begin, 0xFFFFFFFFFFFFFFFF, timeout=timeout_us, count=count)
            reason = StopReason.FINISHED
        except binding.UcError as err:
            code = getattr(err, "errno", -1)
            reason = stop_reason(code)
            if code in FETCH_FAULTS and self.last_bad_access is None:
                self.last_bad_access = self._fetch_fault()
        finally:
            _Engines.running -= 1
            if self.pages.after_run():  # a fill let an access through that must fault next time too
                binding.ctl(self._uch, binding.CTL_FLUSH_TLB)
            if not _Engines.running and _Engines.buried:
                _Engines.close_buried()
        return reason

    def _fetch_fault(self) -> BadAccess:
        """A fetch fault stops the CPU at its instruction, with no hook told (emu/cpu/pages.py): the first
        byte it could not fetch is there, or where the instruction crosses into the next page (an
        instruction spans two pages at most)."""
        rip = self.read(Reg.RIP)
        addr = rip if not self.pages.perms_at(rip) & Prot.EXEC else page_down(rip) + PAGE_SIZE
        return BadAccess(Access.FETCH, addr, 1, unmapped=self.pages.perms_at(addr) == 0)

    def stop(self) -> None:
        binding.emu_stop(self._uch)

    def flush_all_code(self) -> None:
        """Drop every translated block, so that a hook added now sees code translated before it."""
        binding.ctl(self._uch, binding.CTL_FLUSH_TB)

    @property
    def handle(self) -> Any:
        """The ``uc_engine *``, as a ctypes object (for a call into C)."""
        return self._uch




# ------------------------------------------------------------------ raw state (the verifiers' hot path)
