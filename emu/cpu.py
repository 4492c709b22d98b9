"""The one module that imports Unicorn: registers, memory, hooks and runs.

Register I/O goes through ``uc_reg_read``/``uc_reg_write`` (and their batch forms)
called directly with ctypes: the binding's ``reg_read`` costs ~1.9 us a call, the
raw call ~0.5 us (notes/peers-and-unicorn.md 4.2). Hooks are registered through
``uc_hook_add`` directly for the same reason; an exception raised inside a hook
stops the run and is re-raised by :meth:`Cpu.run`.
"""

from __future__ import annotations

import ctypes
import enum
import struct
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import unicorn
import unicorn.x86_const as x86
from unicorn.unicorn_py3.unicorn import uclib

from emu.abi import PAGE_SIZE, Prot

if TYPE_CHECKING:
    from emu.memory import SharedPages

# User-mode rflags as Linux keeps them (notes/linux-6.18-observed.md section 10): bit 1 and IF always
# set, IOPL 0 and no virtual-8086 bits; at CPL 3 the guest's popf/iret cannot change those, and a value
# the fake kernel writes for user mode gets the same treatment (the kernel never returns to user mode
# with interrupts off).
FLAGS_FIXED = 0x202  # bit 1 | IF
FLAGS_KERNEL_ONLY = 0x3000 | 0x20000 | 0x80000 | 0x100000  # IOPL, VM, VIF, VIP


def user_flags(value: int) -> int:
    """``value`` as user-mode rflags can hold it."""
    return (value & ~FLAGS_KERNEL_ONLY & 0xFFFFFFFF) | FLAGS_FIXED


# Linux's selectors (arch/x86/include/asm/segment.h): STAR[63:48] = __USER32_CS, so SYSRET loads
# SS = 0x2b (__USER_DS) and CS = 0x33 (__USER_CS) with RPL and DPL 3.
_MSR_EFER, _MSR_STAR, _EFER_SCE = 0xC0000080, 0xC0000081, 1
_STAR = 0x0023_0010 << 32
_SYSRETQ = b"\x48\x0f\x07"

# uc_reg_* bound again without argtypes: the binding's POINTER argtypes cost ~0.7 us of
# conversion per call on the syscall hot path; these take the arrays as plain pointers.
_raw = ctypes.CDLL(uclib._name, handle=uclib._handle)
_reg_read, _reg_write = _raw.uc_reg_read, _raw.uc_reg_write
_reg_read_batch, _reg_write_batch = _raw.uc_reg_read_batch, _raw.uc_reg_write_batch
_ctl = _raw.uc_ctl
for _f in (_reg_read, _reg_write, _reg_read_batch, _reg_write_batch, _ctl):
    _f.restype = ctypes.c_int
# UC_CTL_WRITE(UC_CTL_TB_REMOVE_CACHE, 2 arguments), as the binding encodes it
_CTL_REMOVE_CACHE = (unicorn.UC_CTL_IO_WRITE << 30) | (2 << 26) | unicorn.UC_CTL_TB_REMOVE_CACHE
_CTL_FLUSH_TB = (unicorn.UC_CTL_IO_WRITE << 30) | unicorn.UC_CTL_TB_FLUSH


class Reg(enum.IntEnum):
    """x86-64 registers the harness touches, valued as Unicorn's ids."""

    RAX = x86.UC_X86_REG_RAX
    RBX = x86.UC_X86_REG_RBX
    RCX = x86.UC_X86_REG_RCX
    RDX = x86.UC_X86_REG_RDX
    RSI = x86.UC_X86_REG_RSI
    RDI = x86.UC_X86_REG_RDI
    RBP = x86.UC_X86_REG_RBP
    RSP = x86.UC_X86_REG_RSP
    R8 = x86.UC_X86_REG_R8
    R9 = x86.UC_X86_REG_R9
    R10 = x86.UC_X86_REG_R10
    R11 = x86.UC_X86_REG_R11
    R12 = x86.UC_X86_REG_R12
    R13 = x86.UC_X86_REG_R13
    R14 = x86.UC_X86_REG_R14
    R15 = x86.UC_X86_REG_R15
    RIP = x86.UC_X86_REG_RIP
    RFLAGS = x86.UC_X86_REG_EFLAGS
    FS_BASE = x86.UC_X86_REG_FS_BASE
    GS_BASE = x86.UC_X86_REG_GS_BASE
    MXCSR = x86.UC_X86_REG_MXCSR
    FPCW = x86.UC_X86_REG_FPCW
    FPSW = x86.UC_X86_REG_FPSW  # the top-of-stack field (bits 13:11) included
    FPTAG = x86.UC_X86_REG_FPTAG  # the full tag word: two bits a physical register, 3 = empty
    CS = x86.UC_X86_REG_CS
    SS = x86.UC_X86_REG_SS
    DS = x86.UC_X86_REG_DS
    ES = x86.UC_X86_REG_ES
    FS = x86.UC_X86_REG_FS
    GS = x86.UC_X86_REG_GS
    CR0 = x86.UC_X86_REG_CR0


# What Linux hands a task at exec: start_thread() (rflags IF and the reserved bit, __USER_CS and
# __USER_DS in cs and ss, null data selectors, fs and gs bases 0) and the FPU's init state
# (fpstate_init_user: x87 control word 0x37f, every x87 register empty, MXCSR 0x1f80, xmm and ymm 0).
USER_CS, USER_DS = 0x33, 0x2B
EXEC_RFLAGS, EXEC_FCW, EXEC_MXCSR, EMPTY_TAGS = 0x202, 0x37F, 0x1F80, 0xFFFF
# Unicorn starts with CR0 = PE|ET. Linux runs with NE (an unmasked x87 exception is #MF, vector 16,
# rather than the legacy FERR# line, which Unicorn ignores) and MP (fwait honours TS).
CR0_MP, CR0_NE = 1 << 1, 1 << 5
EXEC_STATE: tuple[tuple[Reg, int], ...] = (
    (Reg.RFLAGS, EXEC_RFLAGS), (Reg.CS, USER_CS), (Reg.SS, USER_DS), (Reg.DS, 0), (Reg.ES, 0), (Reg.FS, 0),
    (Reg.GS, 0), (Reg.FS_BASE, 0), (Reg.GS_BASE, 0), (Reg.FPCW, EXEC_FCW), (Reg.FPSW, 0), (Reg.FPTAG, EMPTY_TAGS),
    (Reg.MXCSR, EXEC_MXCSR),
)
FXSAVE_SIZE = 512

GPRS: tuple[Reg, ...] = (
    Reg.RAX, Reg.RBX, Reg.RCX, Reg.RDX, Reg.RSI, Reg.RDI, Reg.RBP, Reg.RSP,
    Reg.R8, Reg.R9, Reg.R10, Reg.R11, Reg.R12, Reg.R13, Reg.R14, Reg.R15,
)

# The syscall snapshot: number, six arguments, then where, with which flags, and the stack.
SYSCALL_REGS: tuple[Reg, ...] = (
    Reg.RAX, Reg.RDI, Reg.RSI, Reg.RDX, Reg.R10, Reg.R8, Reg.R9, Reg.RIP, Reg.RFLAGS, Reg.RSP,
)


class Access(enum.Enum):
    READ = "read"
    WRITE = "write"
    FETCH = "fetch"


@dataclass(frozen=True, slots=True)
class BadAccess:
    """What a faulting guest access touched (recorded by the invalid-memory hook)."""

    access: Access
    address: int
    size: int
    unmapped: bool


class StopReason(enum.Enum):
    FINISHED = "finished"  # reached `until`, or stopped by emu_stop
    INVALID_INSN = "invalid instruction"
    BAD_ACCESS = "bad memory access"
    OTHER = "other"


_UC_ACCESS = {
    unicorn.UC_MEM_READ_UNMAPPED: (Access.READ, True),
    unicorn.UC_MEM_WRITE_UNMAPPED: (Access.WRITE, True),
    unicorn.UC_MEM_FETCH_UNMAPPED: (Access.FETCH, True),
    unicorn.UC_MEM_READ_PROT: (Access.READ, False),
    unicorn.UC_MEM_WRITE_PROT: (Access.WRITE, False),
    unicorn.UC_MEM_FETCH_PROT: (Access.FETCH, False),
}

_SYSCALL_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_CPUID_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_INTR_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p)
_CODE_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p)
_MEM_CB = ctypes.CFUNCTYPE(
    ctypes.c_bool, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
)

_HOOK_MEM_INVALID = (
    unicorn.UC_HOOK_MEM_READ_UNMAPPED | unicorn.UC_HOOK_MEM_WRITE_UNMAPPED | unicorn.UC_HOOK_MEM_FETCH_UNMAPPED
    | unicorn.UC_HOOK_MEM_READ_PROT | unicorn.UC_HOOK_MEM_WRITE_PROT | unicorn.UC_HOOK_MEM_FETCH_PROT
)


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


@dataclass(frozen=True, slots=True)
class HookHandle:
    """Returned by every ``add_*_hook``; pass it to :meth:`Cpu.remove_hook`."""

    value: int


class _Engines:
    """When Unicorn engines are closed. The binding closes an engine when its Uc is collected, which can
    happen inside a hook of another engine that is emulating (a forked child's machine dropped while
    its parent runs); uc_close there makes the running engine stop as if a hlt had run. So an engine
    whose Cpu is gone is closed only once no emulation is in progress."""

    running = 0  # emu_start calls in progress, across all engines (they nest: hooks run other engines)
    buried: list[unicorn.Uc] = []

    @classmethod
    def adopt(cls, owner: object, uc: unicorn.Uc) -> None:
        finalizer = getattr(uc, "_Uc__finalizer", None)  # the binding's close-on-collect (unicorn 2.1)
        if finalizer is None:
            return  # another binding: leave closing to it
        finalizer.detach()
        weakref.finalize(owner, cls.bury, uc)

    @classmethod
    def bury(cls, uc: unicorn.Uc) -> None:
        cls.buried.append(uc)
        if not cls.running:
            cls.close_buried()

    @classmethod
    def close_buried(cls) -> None:
        while cls.buried:
            uclib.uc_close(cls.buried.pop()._uch)


class Cpu:
    """One x86-64 CPU with its memory, as Unicorn provides it."""

    def __init__(self) -> None:
        self._uc = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)
        self._shared_pages: dict[int, SharedPages] = {}
        _Engines.adopt(self, self._uc)
        self._uch = self._uc._uch
        self._callbacks: dict[int, object] = {}
        self._keep: list[object] = []  # C callbacks handed to C hooks (raw_code_hook_address)
        self._hook_error: BaseException | None = None
        self._one = ctypes.c_uint64()
        self._one_ref = ctypes.byref(self._one)
        self._ret_batch = _RegBatch((Reg.RAX, Reg.RCX, Reg.R11))
        self._syscall_batch = _RegBatch(SYSCALL_REGS)
        self._gpr_batch = _RegBatch(GPRS + (Reg.RIP, Reg.RFLAGS))
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
        self.fast_front: Any = None  # the C syscall and interrupt front (_fast_front), made with the first hook
        self.fast_take_over: Callable[[], None] | None = None  # moves the front's state to Python (fastpath.py)
        self._counting = False  # the last run counted instructions (translated code carries the count hook)
        self.last_bad_access: BadAccess | None = None
        self.on_unmapped: Callable[[BadAccess], bool] | None = None  # True: mapped it, retry the access
        # Run before and after the syscall and interrupt handlers (add_syscall_hook); an exception
        # from a "before" observer stops the run as the handler's would, "after" ones catch their own.
        self.before_syscall: list[Callable[[], None]] = []
        self.after_syscall: list[Callable[[], None]] = []
        self.before_interrupt: list[Callable[[int], None]] = []
        self.after_interrupt: list[Callable[[int], None]] = []
        self._add_hook(_HOOK_MEM_INVALID, _MEM_CB(self._on_invalid_mem), 1, 0)
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
        uc.mem_map(0, PAGE_SIZE)
        try:
            uc.mem_write(0, _SYSRETQ)
            uc.reg_write(x86.UC_X86_REG_MSR, (_MSR_EFER, uc.reg_read(x86.UC_X86_REG_MSR, _MSR_EFER) | _EFER_SCE))
            uc.reg_write(x86.UC_X86_REG_MSR, (_MSR_STAR, _STAR))
            landing = 0x800  # SYSRET jumps to rcx; the run stops there, before fetching it
            uc.reg_write(x86.UC_X86_REG_RCX, landing)
            uc.reg_write(x86.UC_X86_REG_R11, FLAGS_FIXED)
            uc.emu_start(0, landing)
        finally:
            uc.mem_unmap(0, PAGE_SIZE)
        uc.reg_write(x86.UC_X86_REG_RCX, 0)
        uc.reg_write(x86.UC_X86_REG_R11, 0)
        uc.reg_write(x86.UC_X86_REG_RIP, 0)

    # ---------------------------------------------------------------- registers
    def read(self, reg: Reg) -> int:
        _reg_read(self._uch, reg, self._one_ref)
        return self._one.value

    def read_narrow(self, reg: Reg) -> int:
        """A register narrower than 64 bits (x87 words, MXCSR, selectors): Unicorn writes only its width."""
        self._one.value = 0
        _reg_read(self._uch, reg, self._one_ref)
        return self._one.value

    def write(self, reg: Reg, value: int) -> None:
        if reg == Reg.RFLAGS:
            value = user_flags(value)
        self._one.value = value & 0xFFFFFFFFFFFFFFFF
        _reg_write(self._uch, reg, self._one_ref)

    def batch_writer(self, regs: Sequence[Reg]) -> Callable[[Sequence[int]], None]:
        """A function writing ``regs`` in one C call. Writing RIP ends the translation block."""
        b = _RegBatch(regs)
        flags_at = list(regs).index(Reg.RFLAGS) if Reg.RFLAGS in regs else -1

        def write(values: Sequence[int]) -> None:
            for i, value in enumerate(values):
                b.values[i] = value & 0xFFFFFFFFFFFFFFFF
            if flags_at >= 0:
                b.values[flags_at] = user_flags(b.values[flags_at])
            _reg_write_batch(self._uch, b.ids, b.ptrs, b.count)

        return write

    def read_syscall(self) -> list[int]:
        """rax, rdi, rsi, rdx, r10, r8, r9, rip (at the ``syscall``), rflags, rsp: one C call."""
        b = self._syscall_batch
        _reg_read_batch(self._uch, b.ids, b.ptrs, b.count)
        return b.values[:]

    def write_syscall_return(self, rax: int, rcx: int, r11: int) -> None:
        b = self._ret_batch
        v = b.values
        v[0] = rax & 0xFFFFFFFFFFFFFFFF
        v[1] = rcx
        v[2] = r11
        _reg_write_batch(self._uch, b.ids, b.ptrs, b.count)

    def read_user_state(self) -> list[int]:
        """The 16 GPRs (in GPRS order), rip, rflags: one C call."""
        b = self._gpr_batch
        _reg_read_batch(self._uch, b.ids, b.ptrs, b.count)
        return b.values[:]

    def write_user_state(self, values: Sequence[int], write_rip: bool) -> None:
        """Inverse of read_user_state. rip is written only when asked: writing it ends the
        translation block (~10 us in Unicorn 2.1.4), so a resume at the natural next
        instruction must leave it alone."""
        b = self._gpr_batch if write_rip else self._norip_batch
        for i in range(16):
            b.values[i] = values[i] & 0xFFFFFFFFFFFFFFFF
        if write_rip:
            b.values[16] = values[16] & 0xFFFFFFFFFFFFFFFF
        b.values[b.count - 1] = (values[17] & ~FLAGS_KERNEL_ONLY & 0xFFFFFFFF) | FLAGS_FIXED  # user_flags, inline
        _reg_write_batch(self._uch, b.ids, b.ptrs, b.count)

    def read_extended(self) -> tuple[int, int, bytes, int]:
        """fs base, gs base, xmm0-15 (256 raw little-endian bytes), mxcsr, in one C call."""
        b = self._ext_batch
        _reg_read_batch(self._uch, b.ids, b.ptrs, b.count)
        raw = bytes(self._ext_buf)
        fs, gs, mxcsr = struct.unpack_from("<QQQ", raw)
        return fs, gs, raw[24:280], mxcsr

    def write_extended(self, state: tuple[int, int, bytes, int]) -> None:
        """Inverse of read_extended, in one C call (the binding's xmm writes cost ~15 us a set)."""
        fs, gs, xmm, mxcsr = state
        struct.pack_into("<QQQ", self._ext_buf, 0, fs, gs, mxcsr)
        ctypes.memmove(ctypes.addressof(self._ext_buf) + 24, xmm, 256)
        b = self._ext_batch
        _reg_write_batch(self._uch, b.ids, b.ptrs, b.count)

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
            _reg_read(self._uch, x86.UC_X86_REG_ST0 + i, self._wide)
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
            _reg_write(self._uch, x86.UC_X86_REG_ST0 + i, self._wide)
        self.write(Reg.FPTAG, sum((0 if abridged >> i & 1 else 3) << (2 * i) for i in range(8)))
        fs, gs, _xmm, _mxcsr = self.read_extended()
        self.write_extended((fs, gs, bytes(image[160:416]), mxcsr))

    def write_xmm(self, index: int, value: int) -> None:
        self._uc.reg_write(x86.UC_X86_REG_XMM0 + index, value)

    # ------------------------------------------------------------------ contexts
    def save_context(self, into: CpuContext | None = None) -> CpuContext:
        """Every register of the CPU (GPRs, rip, flags, fs/gs base, x87/SSE/AVX state), as Unicorn keeps
        it; ``into`` is reused (an update costs ~0.9 us, a new context ~3.6 us in Unicorn 2.1.4)."""
        if into is None:
            return CpuContext(self._uc.context_save())
        self._uc.context_update(into.raw)
        return into

    def restore_context(self, context: CpuContext) -> None:
        """Load a saved context (~0.9 us); memory and the translation cache are untouched."""
        self._uc.context_restore(context.raw)

    # ------------------------------------------------------------------- memory
    def mem_map(self, addr: int, size: int, prot: Prot) -> None:
        self._uc.mem_map(addr, size, int(prot))

    def mem_map_shared(self, addr: int, size: int, prot: Prot, pages: SharedPages, offset: int) -> None:
        """Map host memory other engines map too (MAP_SHARED); guest stores still fire the write hooks."""
        self._uc.mem_map_ptr(addr, size, int(prot), pages.address + offset)
        self._shared_pages[id(pages)] = pages  # alive as long as this engine may touch it

    def mem_unmap(self, addr: int, size: int) -> None:
        self._uc.mem_unmap(addr, size)

    def mem_protect(self, addr: int, size: int, prot: Prot) -> None:
        self._uc.mem_protect(addr, size, int(prot))

    def mem_read(self, addr: int, size: int) -> bytes:
        small = size <= PAGE_SIZE  # up to a page: one reused buffer
        buf = self._read_buf if small else ctypes.create_string_buffer(size)
        self._addr_arg.value = addr
        status = _mem_read_raw(self._uch, self._addr_arg, buf, size)
        if status != unicorn.UC_ERR_OK:
            raise unicorn.UcError(status)
        return self._read_view[:size].tobytes() if small else buf.raw

    def mem_write(self, addr: int, data: bytes) -> None:
        self._addr_arg.value = addr
        status = _mem_write_raw(self._uch, self._addr_arg, data if type(data) is bytes else bytes(data), len(data))
        if status != unicorn.UC_ERR_OK:
            raise unicorn.UcError(status)

    def flush_code(self, begin: int, end: int) -> None:
        """Drop translated code for [begin, end) so patched bytes and new hooks take effect.

        uc_ctl called directly: the binding's ctl_remove_cache costs ~20 us of argument encoding."""
        status = _ctl(self._uch, _CTL_REMOVE_CACHE, ctypes.c_uint64(begin), ctypes.c_uint64(end))
        if status != unicorn.UC_ERR_OK:
            raise unicorn.UcError(status)

    def step(self, begin: int) -> StopReason:
        """Execute exactly one instruction at ``begin``.

        Unicorn counts instructions only in code translated while counting, so the
        translation cache is dropped first: otherwise a jump into already translated
        code would run on past the one instruction.
        """
        _ctl(self._uch, _CTL_FLUSH_TB)
        return self.run(begin, count=1)

    # -------------------------------------------------------------------- hooks
    def _guard(self, fn: Callable[..., object], default: object = None) -> Callable[..., object]:
        def wrapper(*args: object) -> object:
            try:
                return fn(*args)
            except BaseException as exc:  # re-raised by run()
                hook_raised(self, exc)
                return default

        return wrapper

    def _add_hook(self, kind: int, cfunc: Any, begin: int, end: int, *extra: int, user_data: int | None = None) -> HookHandle:
        handle = ctypes.c_size_t()
        status = uclib.uc_hook_add(
            self._uch, ctypes.byref(handle), kind, ctypes.cast(cfunc, ctypes.c_void_p), user_data,
            ctypes.c_uint64(begin), ctypes.c_uint64(end), *[ctypes.c_int(e) for e in extra],
        )
        if status != unicorn.UC_ERR_OK:
            raise unicorn.UcError(status)
        self._callbacks[handle.value] = cfunc
        return HookHandle(handle.value)

    def remove_hook(self, hook: HookHandle) -> None:
        uclib.uc_hook_del(self._uch, ctypes.c_size_t(hook.value))
        self._callbacks.pop(hook.value, None)

    def add_syscall_hook(self, callback: Callable[[], None]) -> HookHandle:
        """``callback`` handles the syscall, with each of ``before_syscall`` run first and each of
        ``after_syscall`` after, in the same frame, whether it returned or raised (a raw hook of
        their own would cost a C callback per syscall)."""
        before, after = self.before_syscall, self.after_syscall
        front = self._fast_front()

        def on_syscall(_uc: object, _ud: object) -> None:  # one Python frame: the syscall hot path
            try:
                if front is not None and front.pending:
                    self._take_over()
                for observer in before:
                    observer()
                callback()
            except BaseException as exc:
                hook_raised(self, exc)
            for observer in after:
                observer()

        def after_only(_uc: object, _ud: object) -> None:  # a hit the C front handled, for Python to judge
            for observer in after:
                observer()

        cfunc = _SYSCALL_CB(on_syscall)
        if front is None:
            return self._add_hook(unicorn.UC_HOOK_INSN, cfunc, 1, 0, x86.UC_X86_INS_SYSCALL)
        # the C hook in front (emu/hotpath_src/fastsys.c) calls on_syscall for what it does not handle
        after_cfunc = _SYSCALL_CB(after_only)
        front.set_fallback(_address(cfunc), 0, _address(after_cfunc), 0)
        self._keep += [cfunc, after_cfunc]
        return self._add_hook(unicorn.UC_HOOK_INSN, ctypes.c_void_p(_hotpath_native().fastsys_syscall_hook), 1, 0,
                              x86.UC_X86_INS_SYSCALL, user_data=front.user_data)

    def _take_over(self) -> None:
        """The C front holds state Python must have before it handles anything (return instances)."""
        if self.fast_take_over is not None:
            self.fast_take_over()

    def _fast_front(self) -> Any:
        """The C hot path's FastSys in front of the syscall and interrupt hooks (one per CPU), or None
        with the pure-Python hot path. emu/kernel/uprobes/fastpath.py fills its tables."""
        native = _hotpath_native()
        if native is None:
            return None
        if self.fast_front is None:
            functions = tuple(native_function(name) for name in (
                "uc_reg_read_batch", "uc_reg_write_batch", "uc_reg_read", "uc_reg_write", "uc_mem_read",
                "uc_mem_write"))
            ids = (Reg.RAX, Reg.RIP, Reg.RFLAGS, Reg.RSP, Reg.RCX, Reg.R11)
            self.fast_front = native.FastSys(ctypes.cast(self._uch, ctypes.c_void_p).value, functions,
                                             tuple(int(i) for i in ids))
        return self.fast_front

    def add_cpuid_hook(self, answer: Callable[[int, int], tuple[int, int, int, int]]) -> HookHandle:
        """Answer every CPUID instruction with ``answer(eax, ecx)`` -> eax, ebx, ecx, edx (zero-extended
        into the 64-bit registers, as the instruction does) instead of Unicorn's built-in model."""
        batch = _RegBatch((Reg.RAX, Reg.RBX, Reg.RCX, Reg.RDX))

        def on_cpuid(_uc: object, _ud: object) -> int:
            try:
                _reg_read_batch(self._uch, batch.ids, batch.ptrs, batch.count)
                values = answer(batch.values[0] & 0xFFFFFFFF, batch.values[2] & 0xFFFFFFFF)
                for i in range(4):
                    batch.values[i] = values[i] & 0xFFFFFFFF
                _reg_write_batch(self._uch, batch.ids, batch.ptrs, batch.count)
            except BaseException as exc:
                hook_raised(self, exc)
            return 1  # skip Unicorn's own cpuid

        return self._add_hook(unicorn.UC_HOOK_INSN, _CPUID_CB(on_cpuid), 1, 0, x86.UC_X86_INS_CPUID)

    def add_interrupt_hook(self, callback: Callable[[int], None]) -> HookHandle:
        """As add_syscall_hook, with ``before_interrupt`` and ``after_interrupt``."""
        before, after = self.before_interrupt, self.after_interrupt
        front = self._fast_front()

        def on_interrupt(_uc: object, intno: int, _ud: object) -> None:
            try:
                if front is not None and front.pending:
                    self._take_over()
                for observer in before:
                    observer(intno)
                callback(intno)
            except BaseException as exc:
                hook_raised(self, exc)
            for observer in after:
                observer(intno)

        def after_only(_uc: object, intno: int, _ud: object) -> None:  # as add_syscall_hook's
            for observer in after:
                observer(intno)

        cfunc = _INTR_CB(on_interrupt)
        if front is None:
            return self._add_hook(unicorn.UC_HOOK_INTR, cfunc, 1, 0)
        after_cfunc = _INTR_CB(after_only)
        front.set_fallback(0, _address(cfunc), 0, _address(after_cfunc))
        self._keep += [cfunc, after_cfunc]
        return self._add_hook(unicorn.UC_HOOK_INTR, ctypes.c_void_p(_hotpath_native().fastsys_interrupt_hook), 1, 0,
                              user_data=front.user_data)

    def add_code_hook(self, callback: Callable[[int, int], None], begin: int, end: int) -> HookHandle:
        """Fires before each instruction in [begin, end] (inclusive; Unicorn's convention)."""
        guarded = self._guard(callback)
        return self._add_hook(
            unicorn.UC_HOOK_CODE, _CODE_CB(lambda _uc, addr, size, _ud: guarded(addr, size)), begin, end
        )

    def add_block_hook(self, callback: Callable[[int, int], None]) -> HookHandle:
        guarded = self._guard(callback)
        return self._add_hook(
            unicorn.UC_HOOK_BLOCK, _CODE_CB(lambda _uc, addr, size, _ud: guarded(addr, size)), 1, 0
        )

    def add_mem_write_hook(self, callback: Callable[[int, int, int], None], begin: int, end: int) -> HookHandle:
        guarded = self._guard(callback)

        def on_write(_uc: object, _access: int, addr: int, size: int, value: int, _ud: object) -> bool:
            guarded(addr, size, value)
            return True

        return self._add_hook(unicorn.UC_HOOK_MEM_WRITE, _MEM_CB(on_write), begin, end)

    def _on_invalid_mem(self, _uc: object, access: int, addr: int, size: int, _value: int, _ud: object) -> bool:
        kind, unmapped = _UC_ACCESS.get(access, (Access.READ, True))
        self.last_bad_access = BadAccess(kind, addr, size, unmapped)
        if unmapped and self.on_unmapped is not None:
            return self.on_unmapped(self.last_bad_access)
        return False

    # --------------------------------------------------------------------- runs
    def run(self, begin: int, timeout_us: int = 0, count: int = 0) -> StopReason:
        """Run from ``begin`` until stopped (or ``count`` instructions); re-raise any exception a hook raised.

        Unicorn counts through a code hook compiled into each translation block, so code translated by
        an uncounted run would not count: going from uncounted to counted drops the cache first
        (Unicorn itself flushes the other way). Counting costs ~12 ns an instruction (measured: a tight
        loop runs 13x slower), which is why single-threaded runs do not count, and why ``--json`` and
        ``--max-insns`` count per translated block instead (emu/icount.py) and use ``count`` only for
        the last few instructions before a limit."""
        self.last_bad_access = None
        if count and not self._counting:
            self._uc.ctl_flush_tb()  # type: ignore[attr-defined]
        self._counting = bool(count)
        _Engines.running += 1
        try:
            self._uc.emu_start(begin, 0xFFFFFFFFFFFFFFFF, timeout=timeout_us, count=count)
            reason = StopReason.FINISHED
        except unicorn.UcError as err:
            reason = _reason(err.errno)
        finally:
            _Engines.running -= 1
            if not _Engines.running and _Engines.buried:
                _Engines.close_buried()
        if self._hook_error is not None:
            exc, self._hook_error = self._hook_error, None
            raise exc
        return reason

    def stop(self) -> None:
        uclib.uc_emu_stop(self._uch)


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

    cpu.add_interrupt_hook(on_exception)
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


def _reason(errno: int) -> StopReason:
    if errno == unicorn.UC_ERR_INSN_INVALID:
        return StopReason.INVALID_INSN
    if errno in (
        unicorn.UC_ERR_READ_UNMAPPED, unicorn.UC_ERR_WRITE_UNMAPPED, unicorn.UC_ERR_FETCH_UNMAPPED,
        unicorn.UC_ERR_READ_PROT, unicorn.UC_ERR_WRITE_PROT, unicorn.UC_ERR_FETCH_PROT,
        unicorn.UC_ERR_READ_UNALIGNED, unicorn.UC_ERR_WRITE_UNALIGNED, unicorn.UC_ERR_FETCH_UNALIGNED,
    ):
        return StopReason.BAD_ACCESS
    return StopReason.OTHER


# ------------------------------------------------------------------ raw state (the verifiers' hot path)
# A probe transaction reads the whole user state at its start and end. One C call each way, raw
# bytes out, compared as bytes: decoding into registers happens only when something differs.

STATE_REGS: tuple[int, ...] = (
    (Reg.RIP, Reg.RSP) + tuple(r for r in GPRS if r != Reg.RSP)
    + (Reg.RFLAGS, Reg.FS_BASE, Reg.GS_BASE, Reg.MXCSR) + tuple(x86.UC_X86_REG_XMM0 + i for i in range(16))
    + (x86.UC_X86_REG_FPCW, x86.UC_X86_REG_FPSW, x86.UC_X86_REG_FPTAG) + tuple(x86.UC_X86_REG_ST0 + i for i in range(8))
)
"""rip and rsp first: everything a probe hit must leave as it was is then one slice of the snapshot."""
STATE_FLAGS_OFFSET = 8 * 17  # rip, rsp, the 15 other GPRs in GPRS order, then rflags
STATE_XMM_OFFSET = 8 * 21  # after rflags, fs base, gs base, mxcsr (8 bytes each); then xmm0-15
STATE_X87_OFFSET = STATE_XMM_OFFSET + 16 * 16  # x87 control, status and tag words (8 bytes each), then st0-7
STATE_BYTES = STATE_X87_OFFSET + 3 * 8 + 8 * 16  # (st registers: 10 bytes each, in 16)
STATE_OFFSETS: tuple[int, ...] = (tuple(8 * i for i in range(21)) + tuple(STATE_XMM_OFFSET + 16 * i for i in range(16))
                                  + tuple(STATE_X87_OFFSET + 8 * i for i in range(3))
                                  + tuple(STATE_X87_OFFSET + 24 + 16 * i for i in range(8)))
"""Where each of STATE_REGS lies in a snapshot."""

# Bound through PyDLL: these calls keep the GIL (releasing and taking it back costs more than they
# do; they never call back into Python). No argtypes: their conversion costs more than the call;
# a size goes as a C int, sign-extended to size_t (no single copy comes near 2 GiB).
_gil_held = ctypes.PyDLL(uclib._name, handle=uclib._handle)
_state_read_batch, _mem_read_raw, _mem_write_raw = (
    _gil_held.uc_reg_read_batch, _gil_held.uc_mem_read, _gil_held.uc_mem_write)
_state_read_batch.restype = _mem_read_raw.restype = _mem_write_raw.restype = ctypes.c_int


class RawState:
    """Reads and writes :data:`STATE_REGS` of one CPU as :data:`STATE_BYTES` raw little-endian bytes
    (xmm registers 16 bytes each), and small memory ranges, each in one C call without argument
    conversion (the binding's reads cost 2-4 times more)."""

    def __init__(self, cpu: Cpu) -> None:
        self._uch = cpu._uch
        self._buf = ctypes.create_string_buffer(STATE_BYTES)
        base = ctypes.addressof(self._buf)
        offsets = STATE_OFFSETS
        n = len(STATE_REGS)
        self._all = ((ctypes.c_int * n)(*STATE_REGS), (ctypes.c_void_p * n)(*[base + o for o in offsets]), n)
        keep = [i for i in range(n) if STATE_REGS[i] != Reg.RIP]
        self._no_rip = (
            (ctypes.c_int * (n - 1))(*[STATE_REGS[i] for i in keep]),
            (ctypes.c_void_p * (n - 1))(*[base + offsets[i] for i in keep]),
            n - 1,
        )
        self._mem_bufs: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._addr_arg = ctypes.c_uint64()
        self._word = ctypes.c_uint64()
        self._word_ref = ctypes.byref(self._word)

    def read(self) -> bytes:
        ids, ptrs, n = self._all
        _state_read_batch(self._uch, ids, ptrs, n)
        return self._buf.raw

    def write(self, raw: bytes, write_rip: bool) -> None:
        """Inverse of :meth:`read`. As for :meth:`Cpu.write_user_state`, rip only when asked."""
        ctypes.memmove(self._buf, raw, STATE_BYTES)
        ids, ptrs, n = self._all if write_rip else self._no_rip
        _reg_write_batch(self._uch, ids, ptrs, n)

    def u64(self, addr: int) -> int | None:
        """The 8-byte little-endian word at ``addr``; None if unmapped."""
        self._addr_arg.value = addr
        if _mem_read_raw(self._uch, self._addr_arg, self._word_ref, 8) != unicorn.UC_ERR_OK:
            return None
        return self._word.value

    def mem(self, addr: int, size: int) -> bytes | None:
        """``size`` bytes at ``addr`` (one reused buffer per size: for the few fixed sizes the verifiers
        read); None if any byte is unmapped."""
        buf = self._mem_bufs.get(size)
        if buf is None:
            buf = self._mem_bufs[size] = ctypes.create_string_buffer(size)
        self._addr_arg.value = addr
        if _mem_read_raw(self._uch, self._addr_arg, buf, size) != unicorn.UC_ERR_OK:
            return None
        return buf.raw


def hook_failed(cpu: Cpu) -> bool:
    """True while an exception a hook raised waits for :meth:`Cpu.run` to re-raise it (the run is stopping)."""
    return cpu._hook_error is not None


def flush_all_code(cpu: Cpu) -> None:
    """Drop every translated block, so that a hook added now sees code translated before it."""
    cpu._uc.ctl_flush_tb()  # type: ignore[attr-defined]


# Raw hooks: the callback is called by Unicorn with Unicorn's own arguments, with no Python frame in
# between (the verifiers' hooks fire on every probe hit, where each frame costs). It must catch its
# own exceptions and hand them to hook_raised, which stops the run; Cpu.run re-raises them.
RawCodeHook = Callable[[object, int, int, object], None]  # (uc, address, size, user data)
RawWriteHook = Callable[[object, int, int, int, int, object], bool]  # (uc, access, address, size, value, user data)


def add_raw_code_hook(cpu: Cpu, callback: RawCodeHook, begin: int, end: int) -> HookHandle:
    return cpu._add_hook(unicorn.UC_HOOK_CODE, _CODE_CB(callback), begin, end)


def add_raw_mem_write_hook(cpu: Cpu, callback: RawWriteHook, begin: int, end: int) -> HookHandle:
    return cpu._add_hook(unicorn.UC_HOOK_MEM_WRITE, _MEM_CB(callback), begin, end)


def add_native_mem_write_hook(cpu: Cpu, function: int, user_data: int, begin: int, end: int) -> HookHandle:
    """A write hook whose callback is the C function at ``function`` (Unicorn's signature; the C
    extension's, emu.hotpath), called with ``user_data``: it never enters Python."""
    return cpu._add_hook(unicorn.UC_HOOK_MEM_WRITE, ctypes.c_void_p(function), begin, end, user_data=user_data)


def add_native_code_hook(cpu: Cpu, function: int, user_data: int, begin: int, end: int) -> HookHandle:
    """As add_native_mem_write_hook, for a code hook."""
    return cpu._add_hook(unicorn.UC_HOOK_CODE, ctypes.c_void_p(function), begin, end, user_data=user_data)


def raw_code_hook_address(cpu: Cpu, callback: RawCodeHook) -> int:
    """A C function pointer that calls ``callback`` (for a C hook that hands a hit to Python);
    it lives as long as ``cpu``."""
    cfunc = _CODE_CB(callback)
    cpu._keep.append(cfunc)
    return _address(cfunc)


def _address(cfunc: ctypes._FuncPointer) -> int:
    """The C address of a ctypes callback (the caller keeps it alive)."""
    address = ctypes.cast(cfunc, ctypes.c_void_p).value
    assert address is not None
    return address


def cpu_handle(cpu: Cpu) -> Any:
    """The ``uc_engine *`` of ``cpu``, as a ctypes object (for a call into C)."""
    return cpu._uch


def _hotpath_native() -> Any:
    """The C extension, or None (emu.hotpath loads it on first use: a run without hooks never does)."""
    from emu import hotpath

    return hotpath.native


def native_function(name: str) -> int:
    """The address of one of libunicorn's public functions (for C that calls it)."""
    address = ctypes.cast(getattr(_raw, name), ctypes.c_void_p).value
    assert address is not None
    return address


def add_raw_mem_read_hook(cpu: Cpu, callback: RawWriteHook, begin: int, end: int) -> HookHandle:
    """Called after each read, with the value read (same arguments as a write hook)."""
    return cpu._add_hook(unicorn.UC_HOOK_MEM_READ_AFTER, _MEM_CB(callback), begin, end)


def hook_raised(cpu: Cpu, exc: BaseException) -> None:
    """For raw hooks: stop the run; :meth:`Cpu.run` re-raises ``exc`` (the first one, if several)."""
    if cpu._hook_error is None:
        cpu._hook_error = exc
    uclib.uc_emu_stop(cpu._uch)


# Block counting (emu/icount.py): a block hook, and a hook on each new translation (UC_HOOK_EDGE_GENERATED
# reports every block Unicorn has just translated, with its instruction count).
class _TranslatedBlock(ctypes.Structure):
    _fields_ = [("pc", ctypes.c_uint64), ("icount", ctypes.c_uint16), ("size", ctypes.c_uint16)]  # uc_tb


_TB_PTR = ctypes.POINTER(_TranslatedBlock)
_EDGE_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _TB_PTR, _TB_PTR, ctypes.c_void_p)


def add_raw_block_hook(cpu: Cpu, callback: RawCodeHook) -> HookHandle:
    """Before each block runs, ``callback(uc, address, size, user data)`` (as add_raw_code_hook)."""
    return cpu._add_hook(unicorn.UC_HOOK_BLOCK, _CODE_CB(callback), 1, 0)


def add_native_block_hook(cpu: Cpu, function: int, user_data: int) -> HookHandle:
    """As add_native_code_hook, before each block."""
    return cpu._add_hook(unicorn.UC_HOOK_BLOCK, ctypes.c_void_p(function), 1, 0, user_data=user_data)


def add_translation_hook(cpu: Cpu, callback: Callable[[int, int, int], None]) -> HookHandle:
    """``callback(address, size, instructions)`` for each block Unicorn translates from now on."""
    def on_edge(_uc: object, block: Any, _previous: object, _ud: object) -> None:
        tb = block.contents
        callback(tb.pc, tb.size, tb.icount)

    return cpu._add_hook(unicorn.UC_HOOK_EDGE_GENERATED, _EDGE_CB(on_edge), 1, 0)


def add_native_translation_hook(cpu: Cpu, function: int, user_data: int) -> HookHandle:
    """As add_translation_hook, calling ``function(uc, uc_tb *new, uc_tb *previous, user_data)``."""
    return cpu._add_hook(unicorn.UC_HOOK_EDGE_GENERATED, ctypes.c_void_p(function), 1, 0, user_data=user_data)


def keep_alive(cpu: Cpu, owner: object) -> None:
    """Keep ``owner`` (whose buffers native hooks point into) alive as long as ``cpu``."""
    cpu._keep.append(owner)
