"""The hooks of one engine: Python callbacks, raw ones (Unicorn's own arguments, no Python frame in
between) and C ones (the extension's, emu.hotpath), all registered through ``uc_hook_add``.

An exception raised inside a hook stops the run and is re-raised by Cpu.run: a guarded callback
catches it itself; a raw callback must catch its own and hand it to :meth:`Hooks.raised`.

The syscall and interrupt hooks have observers that run before and after the handler, in the same
frame (a raw hook of their own would cost a C callback per syscall), and may have a C front
(:class:`NativeFront`, which the engine's owner installs before adding them) that handles what it
can itself and calls the Python handler for everything else.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import unicorn
import unicorn.x86_const as x86

from emu.cpu import binding
from emu.cpu.binding import CODE_CB, CPUID_CB, EDGE_CB, INTR_CB, MEM_CB, SYSCALL_CB, callback_address
from emu.cpu.regs import Reg


@dataclass(frozen=True, slots=True)
class HookHandle:
    """Returned by every ``add_*``; pass it to :meth:`Hooks.remove`."""

    value: int


# Raw hooks: Unicorn calls them with its own arguments.
RawCodeHook = Callable[[object, int, int, object], None]  # (uc, address, size, user data)
RawWriteHook = Callable[[object, int, int, int, int, object], bool]  # (uc, access, address, size, value, user data)
_EVERYWHERE = (1, 0)  # Unicorn's begin > end: the hook covers the whole address space


@dataclass(slots=True)
class NativeFront:
    """C code in front of the syscall and interrupt hooks: Unicorn calls ``syscall_hook`` and
    ``interrupt_hook`` (C functions) with ``handle.user_data``; they handle what they can and call
    the Python handlers, whose C addresses ``handle.set_fallback`` gives them, for the rest. While
    ``handle.pending``, the front holds state that Python must have first: ``take_over`` moves it."""

    handle: Any
    syscall_hook: int
    interrupt_hook: int
    take_over: Callable[[], None] | None = None

    def before_python(self) -> None:
        """Python is about to handle a syscall or interrupt while the front holds state (pending)."""
        if self.take_over is not None:
            self.take_over()


def _front_parts(front: NativeFront | None) -> tuple[Any, Callable[[], None]]:
    """What a syscall or interrupt hook checks on every entry: the front's handle (None: no front), and
    what it calls while the handle says ``pending``."""
    if front is None:
        return None, lambda: None
    return front.handle, front.before_python


class Hooks:
    def __init__(self, handle: Any) -> None:
        self._uch = handle
        self._callbacks: dict[int, object] = {}
        self._kinds: dict[int, int] = {}  # handle -> the UC_HOOK_* bits it was added with
        self._keep: list[object] = []  # what C hooks point into or call (python_address, keep)
        self.error: BaseException | None = None  # raised in a hook, for Cpu.run to re-raise
        self.front: NativeFront | None = None  # in front of the syscall and interrupt hooks added after it is set
        # Run before and after the syscall and interrupt handlers (add_syscall); an exception from a
        # "before" observer stops the run as the handler's would, "after" ones catch their own.
        self.before_syscall: list[Callable[[], None]] = []
        self.after_syscall: list[Callable[[], None]] = []
        self.before_interrupt: list[Callable[[int], None]] = []
        self.after_interrupt: list[Callable[[int], None]] = []

    # ----------------------------------------------------------------- errors
    def raised(self, exc: BaseException) -> None:
        """For raw hooks: stop the run; Cpu.run re-raises ``exc`` (the first one, if several)."""
        if self.error is None:
            self.error = exc
        binding.emu_stop(self._uch)

    @property
    def failed(self) -> bool:
        """An exception a hook raised waits for Cpu.run to re-raise it (the run is stopping)."""
        return self.error is not None

    def guard(self, fn: Callable[..., object], default: object = None) -> Callable[..., object]:
        def wrapper(*args: object) -> object:
            try:
                return fn(*args)
            except BaseException as exc:  # re-raised by Cpu.run
                self.raised(exc)
                return default

        return wrapper

    # ------------------------------------------------------------ registration
    def add(self, kind: int, cfunc: Any, begin: int, end: int, *extra: int, user_data: int | None = None) -> HookHandle:
        """uc_hook_add of ``cfunc`` (a ctypes callback, or a C function's address as a c_void_p)."""
        handle = ctypes.c_size_t()
        status = binding.hook_add(
            self._uch, ctypes.byref(handle), kind, ctypes.cast(cfunc, ctypes.c_void_p), user_data,
            ctypes.c_uint64(begin), ctypes.c_uint64(end), *[ctypes.c_int(e) for e in extra],
        )
        if status != binding.OK:
            raise binding.UcError(status)
        self._callbacks[handle.value] = cfunc
        self._kinds[handle.value] = kind
        return HookHandle(handle.value)

    def remove(self, hook: HookHandle) -> None:
        binding.hook_del(self._uch, ctypes.c_size_t(hook.value))
        self._callbacks.pop(hook.value, None)
        self._kinds.pop(hook.value, None)

    def installed(self, kinds: int) -> int:
        """How many hooks added here (and not removed) have any of the UC_HOOK_* bits ``kinds``: a memory
        hook, say, which keeps every translated load and store on Unicorn's slow path while it exists."""
        return sum(1 for kind in self._kinds.values() if kind & kinds)

    def keep(self, owner: object) -> None:
        """Keep ``owner`` (whose buffers native hooks point into) alive as long as this engine."""
        self._keep.append(owner)

    def python_address(self, callback: RawCodeHook) -> int:
        """A C function pointer that calls ``callback`` (for a C hook that hands a hit to Python)."""
        cfunc = CODE_CB(callback)
        self._keep.append(cfunc)
        return callback_address(cfunc)

    # ---------------------------------------------------------- Python callbacks
    def add_code(self, callback: Callable[[int, int], None], begin: int, end: int) -> HookHandle:
        """Fires before each instruction in [begin, end] (inclusive; Unicorn's convention)."""
        guarded = self.guard(callback)
        return self.add(unicorn.UC_HOOK_CODE, CODE_CB(lambda _uc, addr, size, _ud: guarded(addr, size)), begin, end)

    def add_block(self, callback: Callable[[int, int], None]) -> HookHandle:
        guarded = self.guard(callback)
        return self.add(unicorn.UC_HOOK_BLOCK, CODE_CB(lambda _uc, addr, size, _ud: guarded(addr, size)), *_EVERYWHERE)

    def add_mem_write(self, callback: Callable[[int, int, int], None], begin: int, end: int) -> HookHandle:
        guarded = self.guard(callback)

        def on_write(_uc: object, _access: int, addr: int, size: int, value: int, _ud: object) -> bool:
            guarded(addr, size, value)
            return True

        return self.add(unicorn.UC_HOOK_MEM_WRITE, MEM_CB(on_write), begin, end)

    def add_translation(self, callback: Callable[[int, int, int], None]) -> HookHandle:
        """``callback(address, size, instructions)`` for each block Unicorn translates from now on."""
        def on_edge(_uc: object, block: Any, _previous: object, _ud: object) -> None:
            tb = block.contents
            callback(tb.pc, tb.size, tb.icount)

        return self.add(unicorn.UC_HOOK_EDGE_GENERATED, EDGE_CB(on_edge), *_EVERYWHERE)

    def add_cpuid(self, answer: Callable[[int, int], tuple[int, int, int, int]]) -> HookHandle:
        """Answer every CPUID instruction with ``answer(eax, ecx)`` -> eax, ebx, ecx, edx (zero-extended
        into the 64-bit registers, as the instruction does) instead of Unicorn's built-in model."""
        ids = (ctypes.c_int * 4)(Reg.RAX, Reg.RBX, Reg.RCX, Reg.RDX)
        values = (ctypes.c_uint64 * 4)()
        base = ctypes.addressof(values)
        ptrs = (ctypes.c_void_p * 4)(*[base + 8 * i for i in range(4)])

        def on_cpuid(_uc: object, _ud: object) -> int:
            try:
                binding.reg_read_batch(self._uch, ids, ptrs, 4)
                answers = answer(values[0] & 0xFFFFFFFF, values[2] & 0xFFFFFFFF)
                for i in range(4):
                    values[i] = answers[i] & 0xFFFFFFFF
                binding.reg_write_batch(self._uch, ids, ptrs, 4)
            except BaseException as exc:
                self.raised(exc)
            return 1  # skip Unicorn's own cpuid

        return self.add(unicorn.UC_HOOK_INSN, CPUID_CB(on_cpuid), 1, 0, x86.UC_X86_INS_CPUID)

    # ------------------------------------------------- the syscall and interrupt hooks
    def add_syscall(self, callback: Callable[[], None]) -> HookHandle:
        """``callback`` handles the syscall, with each of ``before_syscall`` run first and each of
        ``after_syscall`` after, whether it returned or raised."""
        before, after = self.before_syscall, self.after_syscall
        front = self.front
        handle, take_over = _front_parts(front)

        def on_syscall(_uc: object, _ud: object) -> None:  # one Python frame: the syscall hot path
            try:
                if handle is not None and handle.pending:
                    take_over()
                for observer in before:
                    observer()
                callback()
            except BaseException as exc:
                self.raised(exc)
            for observer in after:
                observer()

        def after_only(_uc: object, _ud: object) -> None:  # a hit the C front handled, for Python to judge
            for observer in after:
                observer()

        cfunc = SYSCALL_CB(on_syscall)
        if front is None:
            return self.add(unicorn.UC_HOOK_INSN, cfunc, 1, 0, x86.UC_X86_INS_SYSCALL)
        after_cfunc = SYSCALL_CB(after_only)
        front.handle.set_fallback(callback_address(cfunc), 0, callback_address(after_cfunc), 0)
        self._keep += [cfunc, after_cfunc]
        return self.add(unicorn.UC_HOOK_INSN, ctypes.c_void_p(front.syscall_hook), 1, 0,
                        x86.UC_X86_INS_SYSCALL, user_data=front.handle.user_data)

    def add_interrupt(self, callback: Callable[[int], None]) -> HookHandle:
        """As add_syscall, with ``before_interrupt`` and ``after_interrupt``."""
        before, after = self.before_interrupt, self.after_interrupt
        front = self.front
        handle, take_over = _front_parts(front)

        def on_interrupt(_uc: object, intno: int, _ud: object) -> None:
            try:
                if handle is not None and handle.pending:
                    take_over()
                for observer in before:
                    observer(intno)
                callback(intno)
            except BaseException as exc:
                self.raised(exc)
            for observer in after:
                observer(intno)

        def after_only(_uc: object, intno: int, _ud: object) -> None:  # as add_syscall's
            for observer in after:
                observer(intno)

        cfunc = INTR_CB(on_interrupt)
        if front is None:
            return self.add(unicorn.UC_HOOK_INTR, cfunc, *_EVERYWHERE)
        after_cfunc = INTR_CB(after_only)
        front.handle.set_fallback(0, callback_address(cfunc), 0, callback_address(after_cfunc))
        self._keep += [cfunc, after_cfunc]
        return self.add(unicorn.UC_HOOK_INTR, ctypes.c_void_p(front.interrupt_hook), *_EVERYWHERE,
                        user_data=front.handle.user_data)

    # ------------------------------------------------------------------ raw hooks
    def add_raw_code(self, callback: RawCodeHook, begin: int, end: int) -> HookHandle:
        return self.add(unicorn.UC_HOOK_CODE, CODE_CB(callback), begin, end)

    def add_raw_block(self, callback: RawCodeHook) -> HookHandle:
        """Before each block runs, ``callback(uc, address, size, user data)``."""
        return self.add(unicorn.UC_HOOK_BLOCK, CODE_CB(callback), *_EVERYWHERE)

    def add_raw_mem_write(self, callback: RawWriteHook, begin: int, end: int) -> HookHandle:
        return self.add(unicorn.UC_HOOK_MEM_WRITE, MEM_CB(callback), begin, end)

    def add_raw_mem_read(self, callback: RawWriteHook, begin: int, end: int) -> HookHandle:
        """Called after each read, with the value read (same arguments as a write hook)."""
        return self.add(unicorn.UC_HOOK_MEM_READ_AFTER, MEM_CB(callback), begin, end)

    # ------------------------------------------------------------------- C hooks
    def add_native_code(self, function: int, user_data: int, begin: int, end: int) -> HookHandle:
        """A code hook whose callback is the C function at ``function`` (Unicorn's signature; the C
        extension's, emu.hotpath), called with ``user_data``: it never enters Python."""
        return self.add(unicorn.UC_HOOK_CODE, ctypes.c_void_p(function), begin, end, user_data=user_data)

    def add_native_block(self, function: int, user_data: int) -> HookHandle:
        return self.add(unicorn.UC_HOOK_BLOCK, ctypes.c_void_p(function), *_EVERYWHERE, user_data=user_data)

    def add_native_mem_write(self, function: int, user_data: int, begin: int, end: int) -> HookHandle:
        return self.add(unicorn.UC_HOOK_MEM_WRITE, ctypes.c_void_p(function), begin, end, user_data=user_data)

    def add_native_translation(self, function: int, user_data: int) -> HookHandle:
        """As add_translation, calling ``function(uc, uc_tb *new, uc_tb *previous, user_data)``."""
        return self.add(unicorn.UC_HOOK_EDGE_GENERATED, ctypes.c_void_p(function), *_EVERYWHERE, user_data=user_data)
