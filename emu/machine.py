"""Builds a process from a LoadPlan (segments, interpreter, stack, auxv, brk) and runs it."""

from __future__ import annotations

import dataclasses
import enum
import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from emu import abi, layout
from emu.abi import SI_KERNEL, AuxType, Prot, Signal
from emu.cpu import Access, Cpu, Reg, StopReason
from emu.cpumodel import MIN_SIGSTKSZ
from emu.designs import DEFAULT_DESIGN, Design, get_design
from emu.disasm import insn_text
from emu.elf import FileId, LoadPlan, load_plan, plan_from_bytes
from emu.errors import EXIT_INSN_LIMIT, EXIT_TIMEOUT, EmuError, LoadError, MemoryFault, UsageError
from emu.guestio import GuestIO
from emu.icount import InsnCounter, make_counter
from emu.initstack import build_stack
from emu.kernel.dispatch import SYSCALL_INSN_LEN, Identity, Kernel, KernelConfig
from emu.kernel.errno_ import SyscallError, errno_name
from emu.kernel.exits import GuestBlocked, GuestExit, GuestKilled, PollOthers, ProcessSuspended, WouldBlock
from emu.kernel.fork import Family, exec_kernel_state, fork_kernel_state, inherited, wait_status
from emu.kernel.fs.fdtable import FdEntry
from emu.kernel.sched import DEFAULT_QUANTUM
from emu.kernel.signal import deliver, deliver_pending, handles
from emu.kernel.uprobes.consumers import Consumer, count_return
from emu.kernel.uprobes.core import Uprobe, Uprobes
from emu.kernel.uprobes.sites import usdt_combo_site
from emu.kernel.uprobes.syscalls import uprobe_rows
from emu.kernel.vdso import adopt as adopt_vdso
from emu.kernel.vdso import map_vdso
from emu.loader import LoadedImage, choose_bias, map_image
from emu.memory import Memory
from emu.vma import Vma

if TYPE_CHECKING:  # probes and threads load on first use: a plain run of a binary needs neither
    from emu.kernel.threads import CloneArgs
    from emu.libprobes import LibraryProbe, LibraryProbes
    from emu.probes import ProbeSpec, ResolvedProbe, Resolver

CLOCK_TICKS = 100
RSEQ_FEATURE_SIZE, RSEQ_ALIGN = 28, 32  # offsetofend(struct rseq, mm_cid) and its alignment
PROCESS_QUANTUM = 200_000  # instructions a process runs while another one is runnable
PROCESS_SLICE_NS = 4_000_000  # virtual time one such slice takes: a tick of CONFIG_HZ=250 (Debian)
MAX_SPURIOUS_STOPS = 10_000  # emu_start returning for no reason, per process, before it counts as a hlt

ILL_ILLOPN, FPE_INTDIV, SEGV_MAPERR, SEGV_ACCERR = 2, 1, 1, 2
# CPU exception vector -> the signal Linux sends for it in user mode, and the si_code (arch/x86/kernel/traps.c).
EXCEPTION_SIGNALS = {
    0: (Signal.SIGFPE, "divide error", FPE_INTDIV),
    1: (Signal.SIGTRAP, "debug trap", SI_KERNEL),
    3: (Signal.SIGTRAP, "breakpoint", SI_KERNEL),
    4: (Signal.SIGSEGV, "overflow", SI_KERNEL),
    5: (Signal.SIGSEGV, "bound range exceeded", SI_KERNEL),
    6: (Signal.SIGILL, "invalid opcode", ILL_ILLOPN),
    13: (Signal.SIGSEGV, "general protection", SI_KERNEL),
    16: (Signal.SIGFPE, "x87 floating-point error", SI_KERNEL),
    17: (Signal.SIGBUS, "alignment check", SI_KERNEL),
    19: (Signal.SIGFPE, "SIMD floating-point error", SI_KERNEL),
}


class _Wait(enum.Enum):
    """What a syscall that must wait does next (Machine._wait_for_others)."""

    RESTART = "restart it now"
    YIELD = "let another thread of the process run first"


class Ending(enum.Enum):
    EXITED = "exited"
    KILLED = "killed"
    INSN_LIMIT = "insn-limit"
    TIMEOUT = "timeout"
    BLOCKED = "blocked"


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How to build and run one process."""

    kernel: KernelConfig = field(default_factory=KernelConfig)
    exe_base: int | None = None  # where an ET_DYN executable goes (default: 0x555555554000 with an interpreter)
    interp_base: int | None = None
    max_insns: int | None = None
    timeout_s: float | None = None
    count_insns: bool = False
    strace: Callable[[str], None] | None = None
    design: str | Design = DEFAULT_DESIGN  # a name, or a Design object (validated when the machine is built)
    sched_quantum: int = DEFAULT_QUANTUM  # instructions a thread runs before the next one gets the CPU
    sched_seed: int | None = None  # random preemption: slice lengths and the next thread drawn from this seed
    aslr: int | None = None  # --aslr SEED: randomize the layout as Linux does (emu/layout.py); None: ASLR off


@dataclass(frozen=True, slots=True)
class RunResult:
    ending: Ending
    exit_status: int
    signal: Signal | None
    message: str | None
    insns: int | None
    syscalls: dict[str, int]
    unknown_syscalls: dict[str, int]
    wall_s: float
    probes: tuple[dict[str, Any], ...] = ()
    exits: dict[str, int] = field(default_factory=dict)
    threads: int = 1  # threads the process had over the run (the main one included)
    switches: int = 0  # context switches between them

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_status": self.exit_status,
            "signal": self.signal.name if self.signal else None,
            "ending": self.ending.value,
            "message": self.message,
            "insns": self.insns,
            "syscalls": self.syscalls,
            "unknown_syscalls": self.unknown_syscalls,
            "wall_s": round(self.wall_s, 6),
            "probes": list(self.probes),
            "exits": self.exits,
            "threads": self.threads,
            "switches": self.switches,
        }


@dataclass(eq=False)
class Attachment:
    """One attached probe spec: where it landed and its consumer (the hit counts live there)."""

    resolved: ResolvedProbe
    consumer: Consumer
    uprobe: Uprobe
    machine: Machine
    library: bool = False  # installed on behalf of a LibraryProbe (summarized there)

    @property
    def address(self) -> int:
        return self.uprobe.vaddr

    def detach(self) -> None:
        self.machine.uprobes.detach(self.uprobe, self.consumer)

    def summary(self) -> dict[str, Any]:
        from emu.probes import ProbeKind

        up = self.machine.uprobes
        hits = self.consumer.ret_hits if self.resolved.spec.kind is ProbeKind.URETPROBE else self.consumer.hits
        return {
            "spec": self.resolved.spec.text,
            "address": self.address,
            "hits": hits,
            "paths": dict(self.consumer.paths),
            "optimized": up.is_optimized(self.uprobe),
        }


class Machine:
    """One emulated process: CPU, memory, kernel; built from an ELF path, run once."""

    def __init__(self, path: str, argv: list[str], env: dict[str, str] | list[str],
                 options: RunOptions | None = None, io: GuestIO | None = None) -> None:
        self.options = options or RunOptions()
        self.io = io or GuestIO.captured()
        self.cpu = Cpu()
        self.execs = 0  # how many execve the process made (each draws a new layout with --aslr)
        self.layout = layout.for_seed(self.options.aslr)
        self.mem = Memory(self.cpu, self.layout.mmap_base)
        self.kernel = Kernel(self.cpu, self.mem, self.options.kernel)
        self.kernel.tracer = self.options.strace
        self.kernel.sched.configure(self.options.sched_quantum, self.options.sched_seed)
        self.path = path
        plan = load_plan(path)
        envp = [f"{k}={v}" for k, v in env.items()] if isinstance(env, dict) else list(env)
        # The stack first, so an image that collides with it is refused rather than overwritten.
        self._map_stack(argv, envp)
        self.exe, self.interp = self._load(plan)
        self.vdso = map_vdso(self.mem, self.kernel.clock)
        self.entry_sp = self._build_stack(argv, envp)
        self._install_stdio()
        self.counter: InsnCounter | None = (
            make_counter(self.cpu, self.options.max_insns) if self.options.count_insns or self.options.max_insns else None
        )
        self.design: Design = get_design(self.options.design)
        self.uprobes = Uprobes(self.cpu, self.mem, self.design, self.kernel.defer)
        self._resolver: Resolver | None = None  # made on first use (resolver)
        self.family = Family()
        self._first = True  # the process the run started with (the others are its descendants)
        self._wire()

    def _wire(self) -> None:
        """Connect CPU, kernel and uprobes (shared by a new process and a forked one)."""
        self.uprobes.task = self.kernel.task.uprobe
        self.uprobes.pid = self.kernel.ident.pid
        self._counted = False  # the last slice ran with an instruction count (several threads)
        self._stalls = 0  # syscalls restarted in a row with no slice run in between (a thread deadlock past a bound)
        self._signalled = False  # another process sent a signal: act on it before running on
        self._process_slice = False  # the last slice was counted because another process could run
        self._waiting = False  # stopped in a syscall that waits: it restarts when the process runs on
        self.spurious_stops = 0  # emu_start returns with nothing to report (see _spurious_stop)
        self.kernel.add_rows(uprobe_rows(self.uprobes))
        self.attachments: list[Attachment] = []
        self._libraries: LibraryProbes | None = None  # made by the first library probe (libraries)
        self.kernel.exec_mmap_observers.append(self._library_mmap)
        self.kernel.perf_attach = self._perf_attach
        self.kernel.fork = self._fork
        self.kernel.exec = self._exec
        self.kernel.family = self.family
        self.cpu.hooks.add_syscall(self.kernel.on_syscall)
        self.cpu.hooks.add_interrupt(self._on_interrupt)
        self.cpu.hooks.add_cpuid(self.kernel.cpu_model.cpuid)
        self.cpu.on_unmapped = lambda bad: self.mem.grow_stack(bad.address)  # the stack grows on demand

    @classmethod
    def _forked(cls, parent: Machine, pid: int, args: CloneArgs) -> Machine:
        """The child of a fork: a copy of ``parent``'s memory (less the VM_DONTCOPY mappings), kernel
        state and registers at the ``syscall``, returning 0 (fork.py explains the process model)."""
        self = cls.__new__(cls)
        self.options, self.io, self.path = parent.options, parent.io, parent.path
        self.cpu = Cpu()
        self.mem = Memory(self.cpu)
        parent.mem.copy_to(self.mem, inherited(parent.design))
        config = dataclasses.replace(parent.kernel.config, pid=pid, ppid=parent.kernel.ident.pid)
        self.kernel = Kernel(self.cpu, self.mem, config)
        self.kernel.sched.configure(self.options.sched_quantum, self.options.sched_seed)
        fork_kernel_state(parent.kernel, self.kernel, args)
        adopt_vdso(self.mem, self.kernel.clock)
        self.exe, self.interp, self.entry_sp, self.vdso = parent.exe, parent.interp, parent.entry_sp, parent.vdso
        self.layout, self.execs = parent.layout, parent.execs
        self.counter = None
        self.design = parent.design
        self.uprobes = Uprobes(self.cpu, self.mem, self.design, self.kernel.defer)
        self.uprobes.probes = dict(parent.uprobes.probes)  # uprobes live on the inode: the copied text keeps them
        if self.design.trampoline is not None and self.design.trampoline.inherited_on_fork:
            self.uprobes.sites.inherit(parent.uprobes.sites)
        self._resolver, self.family, self._first = parent._resolver, parent.family, False
        self._wire()
        self.libraries.probes = parent.libraries.probes  # one list per inode: later mappings in the child get them too
        if self.kernel.task.uprobe.return_instances and parent.uprobes.xol is not None:
            self.uprobes.get_xol_area()  # dup_xol_work: the returns go through [uprobes] slot 0
        self._copy_registers(parent, args)
        return self

    def _copy_registers(self, parent: Machine, args: CloneArgs) -> None:
        from emu.kernel.threads import CLONE_SETTLS

        # every register, the x87, SSE and AVX state and the segments included (fpu_clone copies the FPU)
        self.cpu.restore_context(parent.cpu.save_context())
        state = parent.cpu.read_user_state()
        rip = state[16] + 2  # the parent's rip is at its syscall instruction
        state[0], state[2], state[11], state[16] = 0, rip, state[17], rip  # rax = 0; rcx, r11 as after SYSRET
        if args.stack:
            state[7] = args.stack
        self.cpu.write_user_state(state, write_rip=True)
        if args.flags & CLONE_SETTLS:
            self.cpu.write(Reg.FS_BASE, args.tls)
        self.kernel.task.pc = rip

    # ------------------------------------------------------------- processes
    def _fork(self, k: Kernel, args: CloneArgs) -> int:
        from emu.kernel.threads import CLONE_VFORK

        pid = self.family.new_pid()
        self.family.add(pid, self.kernel.ident.pid, Machine._forked(self, pid, args))
        if args.flags & CLONE_VFORK:  # the parent waits until the child has run (exec'd, exited or blocked)
            self.kernel.defer(lambda: self.family.run(pid))
        return pid

    def _exec(self, path: str, argv: list[bytes], envp: list[bytes]) -> None:
        """execve: check the file now (errors go to the caller), replace the image before the next instruction."""
        from emu.kernel.fs.namei import lookup

        host, plan = self._executable(lookup(self.kernel, abi.AT_FDCWD & 0xFFFFFFFF, path))
        self.kernel.defer(lambda: self._replace_image(host, plan, argv, envp))

    def _executable(self, guest: str) -> tuple[str, LoadPlan]:
        """The file execve loads: a regular file with an execute bit the caller may use (EACCES), and
        an ELF (ENOEXEC). One the guest wrote is loaded from the guest's layer, named by its path."""
        from emu.kernel.fs.layer import MAY_EXEC, permitted
        from emu.kernel.overlay import Inode

        info = self.kernel.vfs.lstat(guest)
        if not stat.S_ISREG(info.mode) or not permitted(self.kernel, info, MAY_EXEC):
            raise SyscallError(errno.EACCES)
        node = self.kernel.vfs.backing(guest)
        try:
            if not isinstance(node, Inode):
                return node, load_plan(node)
            if node.content_from is not None:
                return node.content_from, load_plan(node.content_from)
            host = self.kernel.vfs.host_path(guest)  # never opened: it only names the image
            ident = FileId(host, (os.major(node.dev), os.minor(node.dev)), node.ino)
            return host, plan_from_bytes(bytes(node.data), ident)
        except EmuError:
            raise SyscallError(errno.ENOEXEC) from None

    def _replace_image(self, host: str, plan: LoadPlan, argv: list[bytes], envp: list[bytes]) -> None:
        """The new image in place of the old one (fs/exec.c): the old mappings and probes go; probes
        by spec on a file the new image maps (the executable, or later its libraries) install there."""
        exec_kernel_state(self.kernel)
        self.mem.unmap_all()
        self.execs += 1
        self.layout = layout.for_seed(self.options.aslr, self.execs)
        self.mem.mmap_base = self.layout.mmap_base
        self.path = host
        self._map_stack([os.fsdecode(a) for a in argv], [os.fsdecode(e) for e in envp])
        self.exe, self.interp = self._load(plan)
        self.vdso = map_vdso(self.mem, self.kernel.clock)
        self.entry_sp = self._build_stack([os.fsdecode(a) for a in argv], [os.fsdecode(e) for e in envp])
        self._fold_fast()  # the old image's hits, before its statistics go
        self.uprobes = Uprobes(self.cpu, self.mem, self.design, self.kernel.defer)
        self.uprobes.task = self.kernel.task.uprobe
        self.uprobes.pid = self.kernel.ident.pid
        self.kernel.add_rows(uprobe_rows(self.uprobes))
        self._resolver = None
        for vma in self.mem:  # uprobe_mmap on the new image's text: probes by spec on that file install
            if vma.prot & Prot.EXEC:
                for observer in self.kernel.exec_mmap_observers:
                    observer(vma)
        self._reset_registers()
        self.cpu.write(Reg.RIP, self.interp.entry if self.interp else self.exe.entry)

    def resume(self) -> bool:
        """Run this (non-first) process until it ends, blocks or is preempted; True if it made progress."""
        before = sum(self.kernel.counts.values())
        timeout_us = int(self.options.timeout_s * 1e6) if self.options.timeout_s else 0
        try:
            ending, status, signal, _message = self._run_until_end(self.kernel.task.pc, timeout_us,
                                                                  time.perf_counter())
        except ProcessSuspended as suspended:
            wake = self._wake_time(suspended.wait) if suspended.wait is not None else None
            self.family.set_waiting(self.kernel.ident.pid, suspended.wait, wake)
            if suspended.wait is None:
                return True  # preempted: it ran a slice
            self.family.note_wake(wake)
            return sum(self.kernel.counts.values()) - before >= 2  # more than the restarted syscall
        self._end_process(ending, status, signal)
        return True

    def signal_arrived(self) -> None:
        self._signalled = True

    def _act_on_signals(self) -> None:
        """Before running on: signals another process sent and timers that fired are acted on as at a
        return to user mode (a handler frame on the interrupted state, or death)."""
        if not (self._signalled or self.kernel.timers):
            return  # the common case: nothing to do, and procsig is not even imported
        from emu.kernel.procsig import acting_signal, fire_timers

        fired = fire_timers(self.kernel) if self.kernel.timers else False
        if not (self._signalled or fired):
            return
        self._signalled = False
        task = self.kernel.sched.current
        if not task.signals.pending & ~task.signals.mask:
            return
        rip = task.pc
        if self._waiting and acting_signal(self.kernel) is not None:
            # it sleeps in a syscall about to be restarted: the signal interrupts it (EINTR), then acts
            rip += SYSCALL_INSN_LEN
            self.cpu.write_syscall_return(-errno.EINTR, rip, self.cpu.read(Reg.RFLAGS))
            self._waiting = False
        self.cpu.write(Reg.RIP, rip)
        deliver_pending(self.kernel)  # may raise GuestKilled: the caller's loop ends the process
        self._run_deferred()
        task.pc = self.cpu.read(Reg.RIP)

    def _share_cpu(self) -> None:
        """At the end of a slice: let the other processes run if one can (or one this process woke
        waits further down the call stack); a process that is not the first is suspended for that."""
        family = self.family
        if self._process_slice:  # virtual time goes on while processes share the CPU (timeouts come)
            self.kernel.clock.advance(PROCESS_SLICE_NS)
        woke, family.preempt = family.preempt or family.due(self.kernel.clock.elapsed), False
        pid = self.kernel.ident.pid
        if not (woke or family.runnable_others(pid)):
            return
        if not self._first:
            raise ProcessSuspended("preempted")
        family.run_others(pid)

    def _end_process(self, ending: Ending, status: int, signal: Signal | None) -> None:
        self.kernel.files.close_all()
        self.family.ended(self.kernel.ident.pid, wait_status(ending is Ending.EXITED, status, signal))

    # --------------------------------------------------------------- probes
    @property
    def libraries(self) -> LibraryProbes:
        """Probes by spec on shared libraries (libprobes.py loads with the first one)."""
        if self._libraries is None:
            from emu.libprobes import LibraryProbes

            self._libraries = LibraryProbes(self)
        return self._libraries

    def library_probes(self) -> list[LibraryProbe]:
        return self._libraries.probes if self._libraries is not None else []

    def _library_mmap(self, vma: Vma) -> None:
        """uprobe_mmap for library probes (registered with the kernel before any other observer, as always)."""
        if self._libraries is not None:
            self._libraries.on_exec_mmap(vma)

    @property
    def resolver(self) -> Resolver:
        """Symbols and USDT notes of the executable (probes.py loads only when a probe or a caller needs them)."""
        if self._resolver is None:
            from emu.probes import Resolver

            self._resolver = Resolver(self.exe)
        return self._resolver

    def attach(self, spec: str | ProbeSpec, consumer: Consumer | None = None) -> Attachment | LibraryProbe:
        """Attach a probe spec (uprobe:SYM+OFF, uretprobe:SYM, usdt:PROV:NAME, uprobe:0xADDR, uprobe:PATH:SYM).

        A spec naming another file (a shared library) is installed whenever that file is mapped
        executable, like the kernel's uprobe_mmap; it returns a LibraryProbe."""
        from emu.probes import ProbeKind, parse_spec

        parsed = parse_spec(spec) if isinstance(spec, str) else spec
        consumer = consumer or Consumer()
        if parsed.kind is ProbeKind.URETPROBE and consumer.ret_handler is None:
            consumer.ret_handler = count_return
        if parsed.path is not None and not self._is_exe(parsed.path):
            return self.libraries.add(parsed, consumer)
        resolved = self.resolver.resolve(dataclasses.replace(parsed, path=None))
        return self.attach_resolved(resolved, consumer, (self.exe, self.interp))

    def _perf_attach(self, path: str, offset: int, retprobe: bool, ref_ctr_offset: int,
                     consumer: Consumer) -> Callable[[], None]:
        """The uprobe PMU's attach by file offset: installed now where the file is mapped, and
        whenever it is mapped later (as the kernel's uprobes live on the inode)."""
        from emu.kernel.fs.namei import lookup
        from emu.probes import ProbeKind, ProbeSpec

        guest = lookup(self.kernel, abi.AT_FDCWD & 0xFFFFFFFF, path)
        host = self.kernel.vfs.host_path(guest)
        try:
            st = os.stat(host)
        except OSError:
            raise SyscallError(errno.ENOENT) from None
        ident = ((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)
        for image in (self.exe, self.interp):
            if image is not None and (image.plan.file.dev, image.plan.file.inode) == ident:
                vaddr = image.vaddr_of_offset(offset)
                if vaddr is None:
                    raise SyscallError(errno.EINVAL)
                ref = image.vaddr_of_offset(ref_ctr_offset) if ref_ctr_offset else None
                uprobe = self.uprobes.attach(vaddr, consumer, ref, self._file_bytes(vaddr, (image,)))
                return lambda: self.uprobes.detach(uprobe, consumer)
        try:
            plan = load_plan(host)
        except EmuError:
            raise SyscallError(errno.EINVAL) from None
        kind = ProbeKind.URETPROBE if retprobe else ProbeKind.UPROBE
        spec = ProbeSpec(f"{kind.value}:{guest}+{offset:#x}", kind, path=guest)
        return self.libraries.add_offset(spec, plan, offset, ref_ctr_offset, consumer).detach

    def _is_exe(self, path: str) -> bool:
        return os.path.realpath(path) == os.path.realpath(self.path) or path == self.kernel.ident.exe

    def attach_resolved(self, resolved: ResolvedProbe, consumer: Consumer,
                        images: tuple[LoadedImage | None, ...]) -> Attachment:
        parsed = resolved.spec
        address = self._usdt_site(resolved) if resolved.usdt else resolved.address
        vma = self.mem.find(address)
        if vma is None or not vma.prot & Prot.EXEC:
            raise UsageError(f"{parsed.text}: address {address:#x} is not in an executable mapping")
        try:
            uprobe = self.uprobes.attach(address, consumer, resolved.semaphore, self._file_bytes(address, images))
        except SyscallError as err:
            raise UsageError(f"{parsed.text}: the kernel refuses the instruction at {address:#x}: "
                             f"{self.describe_insn(address)} (-{errno_name(err.errno)}, {err.errno})") from None
        attachment = Attachment(resolved, consumer, uprobe, self)
        self.attachments.append(attachment)
        return attachment

    def _file_bytes(self, address: int, images: tuple[LoadedImage | None, ...]) -> bytes | None:
        """The instruction bytes as the file has them (the kernel analyzes those, not memory's)."""
        for image in images:
            if image is not None:
                code = self.resolver.bytes_at(image, address - image.bias, 16)
                if code:
                    return code
        return None

    def _usdt_site(self, resolved: ResolvedProbe) -> int:
        return usdt_combo_site(self.mem.read(resolved.address, 16), resolved.address, self.design)

    # -------------------------------------------------------------- building
    def _load(self, plan: LoadPlan) -> tuple[LoadedImage, LoadedImage | None]:
        interp_plan = self._interp_plan(plan) if plan.interp else None
        exe_base = self.options.exe_base
        if exe_base is None and plan.is_dyn and interp_plan is not None:
            exe_base = self.layout.pie_base
        exe = map_image(self.mem, plan, choose_bias(self.mem, plan, exe_base), name=self._guest_exe_path())
        interp = None
        if interp_plan is not None:
            interp = map_image(self.mem, interp_plan, choose_bias(self.mem, interp_plan, self.options.interp_base),
                               name=self._interp_guest)
        for image in (exe, interp):
            if image is not None and image.entry >= abi.TASK_SIZE:
                # load_elf_binary: BAD_ADDR(elf_entry) fails the execve with EINVAL
                raise LoadError(image.plan.file.path, f"entry point {image.entry:#x} is outside the user address space")
        # load_elf_binary: a static PIE's brk moves out of the mmap area (emu/layout.py)
        moved = plan.is_dyn and interp_plan is None
        brk = layout.MOVED_BRK if moved else abi.page_up(exe.end)
        if self.layout.randomized:  # a page's gap unless moved, then arch_randomize_brk
            brk += self.layout.brk_gap + (0 if moved else abi.PAGE_SIZE)
        self.kernel.brk.start = self.kernel.brk.current = brk
        return exe, interp

    def _interp_plan(self, plan: LoadPlan) -> LoadPlan:
        assert plan.interp is not None
        try:
            guest = self.kernel.vfs.resolve(plan.interp)
        except SyscallError:
            raise LoadError(plan.file.path, f"interpreter {plan.interp} not found under {self.kernel.vfs.root}") from None
        interp = load_plan(self.kernel.vfs.host_path(guest))
        self._interp_guest = guest
        if interp.interp is not None:
            raise LoadError(interp.file.path, "an interpreter cannot itself have an interpreter")
        return interp

    def _map_stack(self, argv: list[str], envp: list[str]) -> None:
        """[stack] as setup_arg_pages leaves it: the strings' pages plus 128 KiB (emu/layout.py)."""
        bottom = layout.strings_bottom([os.fsencode(a) for a in argv], [os.fsencode(e) for e in envp],
                                       os.fsencode(self.path))
        top = self.layout.stack_top
        shift = abi.STACK_TOP - top  # the strings are copied at STACK_TOP, then the stack moves down
        start = layout.initial_stack_start(max(bottom, abi.STACK_TOP - abi.STACK_SIZE), top=abi.STACK_TOP) - shift
        self.mem.map(start, top - start, Prot.READ | Prot.WRITE, name="[stack]")

    def _build_stack(self, argv: list[str], envp: list[str]) -> int:
        exe = self.exe
        # create_elf_tables' order (notes/linux-6.18-observed.md section 9): ARCH_DLINFO first
        aux = [
            (AuxType.AT_SYSINFO_EHDR, self.vdso),
            (AuxType.AT_MINSIGSTKSZ, MIN_SIGSTKSZ),
            (AuxType.AT_HWCAP, self.kernel.cpu_model.hwcap),
            (AuxType.AT_PAGESZ, abi.PAGE_SIZE),
            (AuxType.AT_CLKTCK, CLOCK_TICKS),
            (AuxType.AT_PHDR, exe.phdr),
            (AuxType.AT_PHENT, exe.plan.phentsize),
            (AuxType.AT_PHNUM, exe.plan.phnum),
            (AuxType.AT_BASE, self.interp.bias + self.interp.plan.low if self.interp else 0),
            (AuxType.AT_FLAGS, 0),
            (AuxType.AT_ENTRY, exe.entry),
            (AuxType.AT_UID, self.kernel.ident.uid),
            (AuxType.AT_EUID, self.kernel.ident.uid),
            (AuxType.AT_GID, self.kernel.ident.gid),
            (AuxType.AT_EGID, self.kernel.ident.gid),
            (AuxType.AT_SECURE, 0),
            (AuxType.AT_RANDOM, 0),
            (AuxType.AT_HWCAP2, self.kernel.cpu_model.hwcap2),
            (AuxType.AT_EXECFN, 0),
            (AuxType.AT_PLATFORM, 0),
            (AuxType.AT_RSEQ_FEATURE_SIZE, RSEQ_FEATURE_SIZE),
            (AuxType.AT_RSEQ_ALIGN, RSEQ_ALIGN),
        ]
        bargv = [os.fsencode(a) for a in argv]
        benv = [os.fsencode(e) for e in envp]
        stack = build_stack(self.layout.stack_top, bargv, benv, os.fsencode(self.path), aux,
                            self.kernel.random.randbytes(16), align_pad=self.layout.align_pad)
        self.mem.write(stack.sp, stack.data)
        ident = self.kernel.ident
        exe_guest = self._guest_exe_path()
        self.kernel.ident = Identity(ident.pid, ident.ppid, ident.uid, ident.gid, exe_guest,
                                     tuple(bargv), tuple(benv), stack.auxv)
        return stack.sp

    def _guest_exe_path(self) -> str:
        real = os.path.realpath(self.path)
        root = self.kernel.vfs.root
        if root == "/":
            return real
        return "/" + os.path.relpath(real, root) if real.startswith(root + "/") else real

    def _install_stdio(self) -> None:
        for fd, stream in enumerate((self.io.stdin, self.io.stdout, self.io.stderr)):
            flags = abi.O_RDONLY if fd == 0 else abi.O_WRONLY
            self.kernel.files.put(fd, FdEntry(stream, flags, False))

    # --------------------------------------------------------------- running
    def _on_interrupt(self, intno: int) -> None:
        if intno == 3 and self.uprobes.handle_int3():
            return
        signal, what, code = EXCEPTION_SIGNALS.get(intno, (Signal.SIGSEGV, f"exception {intno}", SI_KERNEL))
        if intno in (16, 19):  # math_error: the si_code names the unmasked exception pending
            from emu.kernel.fpu import exception_code

            code = exception_code(self.cpu, intno) or SI_KERNEL
        rip = self.cpu.read(Reg.RIP)
        at = rip - 1 if intno == 3 else rip  # int3 traps after its byte; the message names the int3
        raise GuestKilled(signal, at, what, code=code, si_addr=0 if code == SI_KERNEL else rip, resume_ip=rip)

    def run(self) -> RunResult:
        start = time.perf_counter()
        entry = self.interp.entry if self.interp else self.exe.entry
        self._reset_registers()
        self.family.add(self.kernel.ident.pid, self.kernel.ident.ppid, self, running=True)
        timeout_us = int(self.options.timeout_s * 1e6) if self.options.timeout_s else 0
        ending, status, signal, message = self._run_until_end(entry, timeout_us, start)
        self._end_process(ending, status, signal)
        self._run_orphans()
        probes = tuple(a.summary() for a in self.attachments if not a.library) + tuple(
            lib.summary() for lib in self.library_probes())
        return RunResult(
            ending=ending,
            exit_status=status,
            signal=signal,
            message=message,
            insns=self.counter.total if self.counter else None,
            syscalls=self.kernel.syscall_counts(),
            unknown_syscalls=self.kernel.unknown_syscalls(),
            wall_s=time.perf_counter() - start,
            probes=probes,
            exits=dict(self.uprobes.stats.exits),
            threads=len(self.kernel.sched.tasks),
            switches=self.kernel.sched.switches,
        )

    def _run_orphans(self) -> None:
        """Children still running once the first process is gone run to their end; when all of them
        wait, time moves on to the first timeout among them."""
        while True:
            if self.family.run_others(self.kernel.ident.pid):
                continue
            wake = self.family.take_wake(None)
            if wake is None:
                return
            self.kernel.clock.advance(max(0, wake - self.kernel.clock.elapsed))

    def run_from(self, pc: int, timeout_s: float = 0.0) -> tuple[Ending, int, Signal | None, str | None]:
        """Run from ``pc`` with the registers and memory as they are until the guest exits or dies, and
        keep its files open: a caller that resets registers and memory itself can run the same
        process again (the fuzzer reuses one process for thousands of cases)."""
        return self._run_until_end(pc, int(timeout_s * 1e6), time.perf_counter())

    def _reset_registers(self) -> None:
        """Every register as exec leaves it (cpu.EXEC_STATE), on the new stack."""
        self.cpu.load_exec_state()
        self.cpu.write(Reg.RSP, self.entry_sp)

    def _run_until_end(self, entry: int, timeout_us: int, start: float) -> tuple[Ending, int, Signal | None, str | None]:
        sched = self.kernel.sched
        sched.current.pc = entry
        yield_first = False
        while True:
            try:
                if self._signalled or self.kernel.timers:
                    self._act_on_signals()
                self._waiting = False
                if yield_first:
                    yield_first = False
                    self._switch(yielding=True)
                reason = self._run_slices(sched.current.pc, timeout_us, start)
                signal = self._fault_signal(reason)
                if signal is None and self._slice_ended(timeout_us, start):
                    self._stalls = 0
                    self._switch()
                    self._share_cpu()
                    continue
            except GuestExit as ex:
                self.kernel.trace_exit("exit_group", ex.status)
                return Ending.EXITED, ex.status, None, None
            except GuestKilled as kill:
                signal = kill
            except WouldBlock as wait:
                self._waiting = True  # until the restarted syscall runs (a signal may interrupt it)
                ended = self._wait_for_others(wait)
                if isinstance(ended, _Wait):
                    yield_first = ended is _Wait.YIELD
                    continue
                return ended
            except GuestBlocked as blocked:
                return Ending.BLOCKED, 128 + Signal.SIGKILL, None, f"guest blocked forever: {blocked}"
            if signal is None:
                if self._spurious_stop(timeout_us, start):
                    continue
                return self._stopped(timeout_us, start)
            if not self._to_handler(signal):
                return self._killed(signal.signal, signal.address, signal.detail)
            sched.current.pc = self.cpu.read(Reg.RIP)

    def _wait_for_others(self, wait: WouldBlock) -> _Wait | tuple[Ending, int, Signal | None, str | None]:
        """A syscall that must wait for another process or thread: it is restarted once they have run
        (or, for a poll, answered); a deadlock ends the run (or suspends a process that is not the first)."""
        sched = self.kernel.sched
        family, pid = self.family, self.kernel.ident.pid
        after = self.cpu.read(Reg.RIP)
        sched.current.pc = after - SYSCALL_INSN_LEN
        polling = isinstance(wait, PollOthers)  # it does not sleep: the others get one slice each
        ends = family.ends
        family.set_waiting(pid, wait, self.kernel.clock.elapsed if polling else self._wake_time(wait))
        try:
            progressed = family.run_others(pid)
        finally:
            family.set_waiting(pid, None)
        if progressed and not (polling and family.ends == ends):
            return _Wait.RESTART
        if isinstance(wait, PollOthers):  # no process ended: the poll's answer stands
            self.kernel.cpu.write_syscall_return(wait.result, after, self.cpu.read(Reg.RFLAGS))
            sched.current.pc = after
            return _Wait.RESTART
        if sched.threaded and self._stalls < 2 * len(sched.live()):
            self._stalls += 1  # bounded: fruitless retries with nothing else running are a deadlock
            return _Wait.YIELD
        if not self._first:
            raise ProcessSuspended(str(wait), wait)
        until = family.take_wake(self._wake_time(wait))
        if until is not None:  # everyone waits, some with a timeout: time moves on to the first one
            self.kernel.clock.advance(max(0, until - self.kernel.clock.elapsed))
            return _Wait.RESTART
        return Ending.BLOCKED, 128 + Signal.SIGKILL, None, f"guest blocked forever: {wait}"

    def _wake_time(self, wait: WouldBlock) -> int | None:
        """When the wait ends by itself: its own timeout or the process's first timer, if earlier."""
        from emu.kernel.procsig import next_expiry

        times = [t for t in (wait.until, next_expiry(self.kernel) if self.kernel.timers else None) if t is not None]
        return min(times) if times else None

    def _slice_ended(self, timeout_us: int, start: float) -> bool:
        """Did the CPU stop at a scheduling point: a syscall asked for a switch, or a counted slice ran out?

        Unicorn reports a hlt and the end of a counted slice alike (rip after the hlt, or at the next
        instruction), so while several threads run a hlt is taken for the end of a slice: only an
        uncounted (single-thread) run reports hlt as Linux does (#GP, SIGSEGV)."""
        if self.kernel.sched.switch_requested:
            return True
        if not self._counted or self.counter is not None and self.counter.hit_limit:
            return False
        return not (timeout_us and time.perf_counter() - start >= timeout_us / 1e6 * 0.99)

    def _switch(self, yielding: bool = False) -> None:
        """Save the running thread, load the next one (sched.py decides which), deliver its pending signals."""
        sched = self.kernel.sched
        sched.switch_requested = False
        current = sched.current
        nxt = sched.pick_next(yielding)
        if nxt is not current:
            if current.alive:
                current.context = self.cpu.save_context(current.context)
            assert nxt.context is not None
            self.cpu.restore_context(nxt.context)
            sched.current = nxt
            self.uprobes.task = nxt.uprobe
            sched.switches += 1
            for observer in sched.switch_observers:
                observer(current, nxt)
        for reg, value in nxt.resume_regs.items():
            self.cpu.write(reg, value)
        nxt.resume_regs.clear()
        if nxt.signals.pending & ~nxt.signals.mask:
            self.cpu.write(Reg.RIP, nxt.pc)
            deliver_pending(self.kernel)
            self._run_deferred()
            nxt.pc = self.cpu.read(Reg.RIP)

    def _to_handler(self, sig: GuestKilled) -> bool:
        """force_sig: a caught, unblocked signal runs the guest's handler; anything else kills."""
        from emu.kernel.sigframe import SigInfo

        signo = int(sig.signal)
        if not handles(self.kernel, signo):
            return False
        info = SigInfo(signo, sig.code, addr=sig.si_addr)
        try:
            deliver(self.kernel, signo, info, sig.resume_ip)
        except GuestKilled:
            return False
        return True

    def _fault_signal(self, reason: StopReason) -> GuestKilled | None:
        rip = self.cpu.read(Reg.RIP)
        if reason is StopReason.INVALID_INSN:
            return GuestKilled(Signal.SIGILL, rip, "invalid opcode", code=ILL_ILLOPN, si_addr=rip)
        if reason is not StopReason.BAD_ACCESS:
            return None
        bad = self.cpu.last_bad_access
        if bad is None:
            return GuestKilled(Signal.SIGSEGV, rip, "bad memory access", code=SI_KERNEL)
        state = "unmapped" if bad.unmapped else "protected"
        what = {Access.READ: "read of", Access.WRITE: "write to", Access.FETCH: "execution of"}[bad.access]
        code = SEGV_MAPERR if bad.unmapped else SEGV_ACCERR
        return GuestKilled(Signal.SIGSEGV, rip, f"{what} {state} {bad.address:#x}", code=code, si_addr=bad.address)

    def _spurious_stop(self, timeout_us: int, start: float) -> bool:
        """Unicorn can return from emu_start with nothing to report: no limit, no timeout, no hlt just
        run (seen rarely after a stop request raced with the end of an earlier run). The guest then
        simply goes on; only a hlt is the #GP Linux raises (bounded, so a stuck engine still ends)."""
        if self.counter is not None and self.counter.hit_limit:
            return False
        if timeout_us and time.perf_counter() - start >= timeout_us / 1e6 * 0.99:
            return False
        rip = self.cpu.read(Reg.RIP)
        try:
            after_hlt = self.mem.read(rip - 1, 1) == b"\xf4"
        except MemoryFault:
            after_hlt = False
        self.spurious_stops += 1
        return not after_hlt and self.spurious_stops <= MAX_SPURIOUS_STOPS

    def _stopped(self, timeout_us: int, start: float) -> tuple[Ending, int, Signal | None, str | None]:
        if self.counter is not None and self.counter.hit_limit:
            return (Ending.INSN_LIMIT, EXIT_INSN_LIMIT, None,
                    f"stopped after {self.counter.total} instructions (--max-insns {self.options.max_insns})")
        if timeout_us and time.perf_counter() - start >= timeout_us / 1e6 * 0.99:
            return Ending.TIMEOUT, EXIT_TIMEOUT, None, f"stopped after {self.options.timeout_s} s (--timeout)"
        # Unicorn stops on hlt; in user mode Linux raises #GP for it.
        return self._killed(Signal.SIGSEGV, self.cpu.read(Reg.RIP), "general protection")

    def _run_slices(self, pc: int, timeout_us: int, start: float) -> StopReason:
        """Run the current thread until something other than a deferred kernel action (an XOL step)
        stops the CPU; with several threads, for at most one scheduler slice of instructions.

        Slices are counted exactly (Unicorn's count), not per block as --json is: races are found by
        preempting a thread inside a probe site (small quanta, tests/test_uprobe_race.py), which
        block granularity cannot do; and a block hook in every process would cost more than the
        count where the hooks are Python."""
        sched = self.kernel.sched
        while True:
            remaining = 0
            if timeout_us:
                remaining = max(1, timeout_us - int((time.perf_counter() - start) * 1e6))
            count = sched.slice_length()
            self._process_slice = (not count and len(self.family.procs) > 1  # (the usual case: one process)
                                   and self.family.runnable_others(self.kernel.ident.pid))
            if self._process_slice:
                count = PROCESS_QUANTUM
            self._counted = count > 0
            fast = self.uprobes.fast
            if fast is not None:  # the C hot path takes counting-only hits while nothing watches them
                fast.sync(self.kernel.tracer is not None)
            run = self.cpu.run if self.counter is None else self.counter.run
            try:
                reason = run(pc, timeout_us=remaining, count=count)
            finally:
                self._fold_fast()
            sched.current.pc = self.cpu.read(Reg.RIP)
            if not self.kernel.deferred or reason is not StopReason.FINISHED or self._at_limit():
                return reason
            self._run_deferred()
            pc = sched.current.pc = self.cpu.read(Reg.RIP)
            if sched.switch_requested:
                return reason

    def _at_limit(self) -> bool:
        return self.counter is not None and self.counter.hit_limit

    def _fold_fast(self) -> None:
        """What the C hot path counted goes into the statistics and the syscall counts (fastpath.py)."""
        if self.uprobes.fast is not None:
            self.uprobes.fast.fold(self.kernel.counts)

    def _run_deferred(self) -> None:
        while self.kernel.deferred:
            self.kernel.deferred.pop(0)()

    def _killed(self, signal: Signal, address: int | None, detail: str) -> tuple[Ending, int, Signal, str]:
        where = ""
        if address is not None:
            where = f" at {address:#x}: {self.describe_insn(address)}"
        message = f"killed by {signal.name}{where} ({detail})"
        if self.options.strace:
            self.options.strace(f"+++ killed by {signal.name} +++")
        return Ending.KILLED, 128 + signal, signal, message

    def describe_insn(self, address: int) -> str:
        try:
            code = self.mem.read(address, 16)
        except Exception:
            return "<unmapped>"
        return insn_text(code, address) or f"<undecodable {code[:4].hex()}>"
