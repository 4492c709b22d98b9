"""Building a process's image from a LoadPlan, as execve does (fs/exec.c, fs/binfmt_elf.c): the
[stack], the executable and its interpreter, brk, the vDSO, the strings and auxv on the stack, the
standard streams; and exec's replacement of one image by another."""

from __future__ import annotations

import errno
import os
import stat
from typing import NamedTuple

from emu import abi
from emu.abi import AuxType, Prot
from emu.cpu import Cpu, Reg
from emu.errors import EmuError, LoadError
from emu.guestio import GuestIO
from emu.kernel.dispatch import Identity, Kernel
from emu.kernel.errno_ import SyscallError
from emu.kernel.fork import exec_kernel_state
from emu.kernel.fs.fdtable import FdEntry
from emu.kernel.fs.layer import MAY_EXEC, permitted
from emu.kernel.hostframe import host_frame
from emu.kernel.overlay import Inode
from emu.kernel.vdso import map_vdso
from emu.process import layout
from emu.process.elf import FileId, LoadPlan, load_plan, plan_from_bytes
from emu.process.initstack import build_stack
from emu.process.layout import Layout
from emu.process.loader import LoadedImage, choose_bias, map_image
from emu.process.memory import Memory
from emu.process.scripts import HEAD, host_head
from emu.runtypes import RunOptions

CLOCK_TICKS = 100
RSEQ_FEATURE_SIZE, RSEQ_ALIGN = 28, 32  # offsetofend(struct rseq, mm_cid) and its alignment


class ProcessImage(NamedTuple):
    """What one execve left in memory: the images, the vDSO and the initial stack pointer.

    A NamedTuple, not a frozen dataclass: making a dataclass costs about a millisecond of every
    run's start-up, a NamedTuple a fifth of that."""

    path: str  # the executable's host path
    exe: LoadedImage
    interp: LoadedImage | None
    vdso: int
    entry_sp: int

    @property
    def entry(self) -> int:
        """Where the first instruction runs: the interpreter's entry, or the executable's."""
        return self.interp.entry if self.interp else self.exe.entry


def load_process(kernel: Kernel, mem: Memory, lay: Layout, path: str, plan: LoadPlan, argv: list[str],
                 envp: list[str], options: RunOptions) -> ProcessImage:
    """Map everything a new process needs; the kernel's brk and identity (auxv, argv) are set too."""
    # The stack first, so an image that collides with it is refused rather than overwritten.
    map_stack(mem, lay, path, argv, envp)
    exe, interp = load_images(kernel, mem, lay, path, plan, options)
    vdso = map_vdso(mem, kernel.clock)
    entry_sp = build_initial_stack(kernel, mem, lay, path, exe, interp, vdso, argv, envp)
    return ProcessImage(path, exe, interp, vdso, entry_sp)


def replace_image(kernel: Kernel, mem: Memory, lay: Layout, host: str, plan: LoadPlan, argv: list[bytes],
                  envp: list[bytes], options: RunOptions) -> ProcessImage:
    """The new image in place of the old one (fs/exec.c): the old mappings go, the kernel state an
    exec resets is reset, and the new image is loaded in the new layout."""
    exec_kernel_state(kernel)
    mem.unmap_all()
    mem.mmap_base = lay.mmap_base
    return load_process(kernel, mem, lay, host, plan, [os.fsdecode(a) for a in argv],
                        [os.fsdecode(e) for e in envp], options)


def executable(kernel: Kernel, guest: str) -> tuple[str, LoadPlan]:
    """The file execve loads: a regular file with an execute bit the caller may use (EACCES), and
    an ELF (ENOEXEC). One the guest wrote is loaded from the guest's layer, named by its path."""
    info = kernel.vfs.lstat(guest)
    if not stat.S_ISREG(info.mode) or not permitted(kernel, info, MAY_EXEC):
        raise SyscallError(errno.EACCES)
    node = kernel.vfs.backing(guest)
    try:
        if not isinstance(node, Inode):
            return node, load_plan(node)
        if node.content_from is not None:
            return node.content_from, load_plan(node.content_from)
        host = kernel.vfs.host_path(guest)  # never opened: it only names the image
        ident = FileId(host, (os.major(node.dev), os.minor(node.dev)), node.ino)
        return host, plan_from_bytes(bytes(node.data), ident)
    except EmuError:
        raise SyscallError(errno.ENOEXEC) from None


def guest_head(kernel: Kernel, guest: str) -> bytes:
    """The first bytes of a file execve is asked to run (a "#!" line, or an ELF header): a regular file
    with an execute bit the caller may use (EACCES)."""
    info = kernel.vfs.lstat(guest)
    if not stat.S_ISREG(info.mode) or not permitted(kernel, info, MAY_EXEC):
        raise SyscallError(errno.EACCES)
    node = kernel.vfs.backing(guest)
    if not isinstance(node, Inode):
        return host_head(node)
    if node.content_from is not None:
        return host_head(node.content_from)
    return bytes(node.data[:HEAD])


def reset_registers(cpu: Cpu, entry_sp: int) -> None:
    """Every register as exec leaves it (cpu.EXEC_STATE), on the new stack."""
    cpu.load_exec_state()
    cpu.write(Reg.RSP, entry_sp)


def install_stdio(kernel: Kernel, io: GuestIO) -> None:
    for fd, stream in enumerate((io.stdin, io.stdout, io.stderr)):
        flags = abi.O_RDONLY if fd == 0 else abi.O_WRONLY
        kernel.files.put(fd, FdEntry(stream, flags, False))


def load_images(kernel: Kernel, mem: Memory, lay: Layout, path: str, plan: LoadPlan,
                options: RunOptions) -> tuple[LoadedImage, LoadedImage | None]:
    """The executable and its interpreter mapped, and brk placed after them (load_elf_binary)."""
    interp = interpreter(kernel, plan) if plan.interp else None
    exe_base = options.exe_base
    if exe_base is None and plan.is_dyn and interp is not None:
        exe_base = lay.pie_base
    exe = map_image(mem, plan, choose_bias(mem, plan, exe_base), name=guest_exe_path(kernel, path))
    interp_image = None
    if interp is not None:
        interp_plan, interp_guest = interp
        interp_image = map_image(mem, interp_plan, choose_bias(mem, interp_plan, options.interp_base), name=interp_guest)
    for image in (exe, interp_image):
        if image is not None and image.entry >= abi.TASK_SIZE:
            # load_elf_binary: BAD_ADDR(elf_entry) fails the execve with EINVAL
            raise LoadError(image.plan.file.path, f"entry point {image.entry:#x} is outside the user address space")
    # load_elf_binary: a static PIE's brk moves out of the mmap area (emu/process/layout.py)
    moved = plan.is_dyn and interp is None
    brk = layout.MOVED_BRK if moved else abi.page_up(exe.end)
    if lay.randomized:  # a page's gap unless moved, then arch_randomize_brk
        brk += lay.brk_gap + (0 if moved else abi.PAGE_SIZE)
    kernel.brk.start = kernel.brk.current = brk
    return exe, interp_image


def interpreter(kernel: Kernel, plan: LoadPlan) -> tuple[LoadPlan, str]:
    """The PT_INTERP file's plan and its guest path (found under the guest's root)."""
    assert plan.interp is not None
    try:
        guest = kernel.vfs.resolve(plan.interp)
    except SyscallError:
        raise LoadError(plan.file.path, f"interpreter {plan.interp} not found under {kernel.vfs.root}") from None
    interp = load_plan(kernel.vfs.host_path(guest))
    if interp.interp is not None:
        raise LoadError(interp.file.path, "an interpreter cannot itself have an interpreter")
    return interp, guest


def map_stack(mem: Memory, lay: Layout, path: str, argv: list[str], envp: list[str]) -> None:
    """[stack] as setup_arg_pages leaves it: the strings' pages plus 128 KiB (emu/process/layout.py)."""
    bottom = layout.strings_bottom([os.fsencode(a) for a in argv], [os.fsencode(e) for e in envp], os.fsencode(path))
    top = lay.stack_top
    shift = abi.STACK_TOP - top  # the strings are copied at STACK_TOP, then the stack moves down
    start = layout.initial_stack_start(max(bottom, abi.STACK_TOP - abi.STACK_SIZE), top=abi.STACK_TOP) - shift
    mem.map(start, top - start, Prot.READ | Prot.WRITE, name="[stack]")


def build_initial_stack(kernel: Kernel, mem: Memory, lay: Layout, path: str, exe: LoadedImage,
                        interp: LoadedImage | None, vdso: int, argv: list[str], envp: list[str]) -> int:
    """argc, argv, envp, auxv and the strings written on [stack] (create_elf_tables); the stack pointer."""
    # create_elf_tables' order (docs/linux-6.18-observed.md section 9): ARCH_DLINFO first
    aux = [
        (AuxType.AT_SYSINFO_EHDR, vdso),
        (AuxType.AT_MINSIGSTKSZ, host_frame().minsigstksz),  # grows with the frame's XSAVE area
        (AuxType.AT_HWCAP, kernel.cpu_model.hwcap),
        (AuxType.AT_PAGESZ, abi.PAGE_SIZE),
        (AuxType.AT_CLKTCK, CLOCK_TICKS),
        (AuxType.AT_PHDR, exe.phdr),
        (AuxType.AT_PHENT, exe.plan.phentsize),
        (AuxType.AT_PHNUM, exe.plan.phnum),
        (AuxType.AT_BASE, interp.bias + interp.plan.low if interp else 0),
        (AuxType.AT_FLAGS, 0),
        (AuxType.AT_ENTRY, exe.entry),
        (AuxType.AT_UID, kernel.ident.uid),
        (AuxType.AT_EUID, kernel.ident.uid),
        (AuxType.AT_GID, kernel.ident.gid),
        (AuxType.AT_EGID, kernel.ident.gid),
        (AuxType.AT_SECURE, 0),
        (AuxType.AT_RANDOM, 0),
        (AuxType.AT_HWCAP2, kernel.cpu_model.hwcap2),
        (AuxType.AT_EXECFN, 0),
        (AuxType.AT_PLATFORM, 0),
        (AuxType.AT_RSEQ_FEATURE_SIZE, RSEQ_FEATURE_SIZE),
        (AuxType.AT_RSEQ_ALIGN, RSEQ_ALIGN),
    ]
    bargv = [os.fsencode(a) for a in argv]
    benv = [os.fsencode(e) for e in envp]
    stack = build_stack(lay.stack_top, bargv, benv, os.fsencode(path), aux,
                        kernel.random.randbytes(16), align_pad=lay.align_pad)
    mem.write(stack.sp, stack.data)
    ident = kernel.ident
    kernel.ident = Identity(ident.pid, ident.ppid, ident.uid, ident.gid, guest_exe_path(kernel, path),
                            tuple(bargv), tuple(benv), stack.auxv)
    return stack.sp


def guest_exe_path(kernel: Kernel, path: str) -> str:
    """The executable's path as the guest sees it (relative to --root)."""
    real = os.path.realpath(path)
    root = kernel.vfs.root
    if root == "/":
        return real
    return "/" + os.path.relpath(real, root) if real.startswith(root + "/") else real
