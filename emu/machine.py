"""One emulated process: CPU, memory and kernel, built from an ELF as execve builds it
(emu/process/loading.py), probed (emu/attach.py) and run (emu/process/runloop.py); fork and execve make and
replace processes here. RunOptions, RunResult and Ending (emu/runtypes.py) and Attachment
(emu/attach.py) are importable from here too: users' scripts and the pytest plugin import them so."""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from emu import abi
from emu.abi import Prot
from emu.cpu import Cpu, Reg
from emu.designs import Design
from emu.disasm import describe_insn
from emu.errors import LoadError
from emu.guestio import GuestIO
from emu.hotpath.front import syscall_front
from emu.kernel.dispatch import Kernel
from emu.kernel.errno_ import SyscallError
from emu.kernel.fork import Family, fork_kernel_state, inherited
from emu.kernel.fs.namei import lookup
from emu.kernel.table import build_table
from emu.kernel.uprobes.consumers import Consumer
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.syscalls import uprobe_rows
from emu.kernel.vdso import adopt as adopt_vdso
from emu.process import layout, scripts
from emu.process.elf import LoadPlan, load_executable
from emu.process.icount import InsnCounter, make_counter
from emu.process.loader import LoadedImage
from emu.process.loading import (
    ProcessImage,
    executable,
    guest_head,
    install_stdio,
    load_process,
    replace_image,
    reset_registers,
)
from emu.process.memory import Memory
from emu.process.runloop import RunLoop
from emu.process.vma import Vma
from emu.runtypes import Budget, Ending, Outcome, RunOptions, RunResult

if TYPE_CHECKING:  # probes, their attachment and threads load on first use: a plain run of a binary needs none
    from collections.abc import Callable

    from emu.attach import Attachment, ProbeAttacher
    from emu.kernel.state import CloneArgs
    from emu.libprobes import LibraryProbe, LibraryProbes
    from emu.probes import ProbeSpec, ResolvedProbe, Resolver

__all__ = ["Attachment", "Ending", "Machine", "RunOptions", "RunResult"]


def __getattr__(name: str) -> Any:
    """``from emu.machine import Attachment`` works as it always did, and loads attach.py only then."""
    if name == "Attachment":
        from emu.attach import Attachment  # attach.py loads with the first probe (a plain run attaches none)

        return Attachment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        self.kernel = Kernel(self.cpu, self.mem, self.options.kernel, build_table())
        self.kernel.tracer = self.options.strace
        self.kernel.sched.configure(self.options.sched_quantum, self.options.sched_seed)
        envp = [f"{k}={v}" for k, v in env.items()] if isinstance(env, dict) else list(env)
        path, argv = _program(path, argv)
        self.image: ProcessImage = load_process(self.kernel, self.mem, self.layout, path, load_executable(path), argv, envp,
                                                self.options)
        install_stdio(self.kernel, self.io)
        self.counter: InsnCounter | None = self._new_counter()
        self.budget = Budget(self.options.timeout_s, self.options.max_insns)  # Machine.run starts it anew
        self.design: Design = self.options.kernel_design
        self.uprobes = Uprobes(self.cpu, self.mem, self.design, self.kernel.defer)
        self.family = Family()
        self.fork_observers: list[Callable[[Machine], None]] = []  # each child forked, once built (and its own)
        self.exec_observers: list[Callable[[], None]] = []  # this process's new images, once their probes are in
        self.forked: list[Machine] = []  # every process forked in the run (the list is the run's)
        self._wire(first=True)

    def _wire(self, first: bool) -> None:
        """Connect CPU, kernel, uprobes, the probes and the run loop (shared by a new process and a
        forked one); ``first``: the process the run started with (the others are its descendants)."""
        self._wire_uprobes()
        self.run_loop = RunLoop(self, first)
        self._attacher: ProbeAttacher | None = None  # made by the first probe (attacher)
        self.kernel.exec_mmap_observers.append(self._library_mmap)
        self.kernel.perf_attach = self._perf_attach
        self.kernel.fork = self._fork
        self.kernel.exec = self._exec
        self.kernel.family = self.family
        self.cpu.hooks.front = syscall_front(self.cpu)  # before the hooks it stands in front of
        self.cpu.hooks.add_syscall(self.kernel.on_syscall)
        self.cpu.hooks.add_interrupt(self.run_loop.on_interrupt)
        self.cpu.hooks.add_cpuid(self.kernel.cpu_model.cpuid)
        self.cpu.on_unmapped = lambda bad: self.mem.grow_stack(bad.address)  # the stack grows on demand

    def _wire_uprobes(self) -> None:
        """The uprobes of this image serve the current task and own the uprobe syscalls' rows."""
        self.uprobes.task = self.kernel.task.uprobe
        self.uprobes.pid = self.kernel.ident.pid
        self.kernel.add_rows(uprobe_rows(self.uprobes))

    # ------------------------------------------------------------- the image
    @property
    def path(self) -> str:
        """The executable's host path (the last execve's)."""
        return self.image.path

    @property
    def exe(self) -> LoadedImage:
        return self.image.exe

    @property
    def interp(self) -> LoadedImage | None:
        return self.image.interp

    @property
    def vdso(self) -> int:
        return self.image.vdso

    @property
    def entry_sp(self) -> int:
        return self.image.entry_sp

    def _new_counter(self) -> InsnCounter | None:
        """The process's instruction counter, if the run counts (--json, --max-insns)."""
        options = self.options
        return make_counter(self.cpu, options.max_insns) if options.count_insns or options.max_insns else None

    # ------------------------------------------------------------- processes
    @classmethod
    def _forked(cls, parent: Machine, pid: int, args: CloneArgs) -> Machine:
        """The child of a fork: a copy of ``parent``'s memory (less the VM_DONTCOPY mappings), kernel
        state and registers at the ``syscall``, returning 0 (fork.py explains the process model)."""
        self = cls.__new__(cls)
        self.options, self.io = parent.options, parent.io
        self.cpu = Cpu()
        self.mem = Memory(self.cpu)
        parent.mem.copy_to(self.mem, inherited(parent.design))
        config = dataclasses.replace(parent.kernel.config, pid=pid, ppid=parent.kernel.ident.pid)
        self.kernel = Kernel(self.cpu, self.mem, config, build_table())
        self.kernel.sched.configure(self.options.sched_quantum, self.options.sched_seed)
        fork_kernel_state(parent.kernel, self.kernel, args)
        adopt_vdso(self.mem, self.kernel.clock)
        self.image, self.layout, self.execs = parent.image, parent.layout, parent.execs
        self.counter = self._new_counter()  # the run's --max-insns counts every process's instructions
        self.budget = parent.budget  # one budget for every process of the run
        self.design = parent.design
        self.uprobes = Uprobes(self.cpu, self.mem, self.design, self.kernel.defer)
        self.uprobes.probes = dict(parent.uprobes.probes)  # uprobes live on the inode: the copied text keeps them
        if self.design.trampoline is not None and self.design.trampoline.inherited_on_fork:
            self.uprobes.sites.inherit(parent.uprobes.sites)
        self.family = parent.family
        self._wire(first=False)
        self.attacher.inherit(parent.attacher)
        if self.kernel.task.uprobe.return_instances and parent.uprobes.xol is not None:
            self.uprobes.get_xol_area()  # dup_xol_work: the returns go through [uprobes] slot 0
        self._copy_registers(parent, args)
        self.fork_observers, self.exec_observers, self.forked = parent.fork_observers, [], parent.forked
        self.forked.append(self)
        for observer in self.fork_observers:
            observer(self)
        return self

    def _copy_registers(self, parent: Machine, args: CloneArgs) -> None:
        from emu.kernel.threads import CLONE_SETTLS  # threads.py loads with the first clone (a plain run never forks)

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

    def _fork(self, k: Kernel, args: CloneArgs) -> int:
        from emu.kernel.threads import CLONE_VFORK  # threads.py loads with the first clone (a plain run never forks)

        pid = self.family.new_pid()
        self.family.add(pid, self.kernel.ident.pid, Machine._forked(self, pid, args))
        if args.flags & CLONE_VFORK:  # the parent waits until the child has run (exec'd, exited or blocked)
            self.kernel.defer(lambda: self.family.run(pid))
        return pid

    def _exec(self, path: str, argv: list[bytes], envp: list[bytes]) -> None:
        """execve: check the file now (errors go to the caller), replace the image before the next
        instruction; a "#!" script runs its interpreter (emu/process/scripts.py)."""
        kernel = self.kernel

        def guest(name: str) -> str:
            return lookup(kernel, abi.AT_FDCWD & 0xFFFFFFFF, name)

        program, args = scripts.resolve(path, [os.fsdecode(a) for a in argv], lambda p: guest_head(kernel, guest(p)))
        host, plan = executable(kernel, guest(program))
        argv = [os.fsencode(a) for a in args]
        kernel.defer(lambda: self._replace_image(host, plan, argv, envp))

    def _replace_image(self, host: str, plan: LoadPlan, argv: list[bytes], envp: list[bytes]) -> None:
        """The new image in place of the old one (emu/process/loading.py): the old probes go; probes by spec on
        a file the new image maps (the executable, or later its libraries) install there."""
        self.execs += 1
        self.layout = layout.for_seed(self.options.aslr, self.execs)
        self.image = replace_image(self.kernel, self.mem, self.layout, host, plan, argv, envp, self.options)
        self.run_loop.fold_fast()  # the old image's hits, into the statistics the new image keeps
        old = self.uprobes
        self.uprobes = Uprobes(self.cpu, self.mem, self.design, self.kernel.defer)
        self._wire_uprobes()
        self.uprobes.follow(old)
        if self._attacher is not None:
            self._attacher.new_image()
        for vma in self.mem:  # uprobe_mmap on the new image's text: probes by spec on that file install
            if vma.prot & Prot.EXEC:
                for observer in self.kernel.exec_mmap_observers:
                    observer(vma)
        reset_registers(self.cpu, self.entry_sp)
        self.cpu.write(Reg.RIP, self.image.entry)
        for new_image in self.exec_observers:
            new_image()

    # family.Process: how the other processes of the run drive this one
    def resume(self) -> bool:
        """Run this (non-first) process until it ends, blocks or is preempted; True if it made progress."""
        return self.run_loop.resume()

    def signal_arrived(self) -> None:
        self.run_loop.signal_arrived()

    # --------------------------------------------------------------- probes (emu/attach.py)
    @property
    def attacher(self) -> ProbeAttacher:
        """The process's probes and the ways to attach them (attach.py loads with the first probe)."""
        if self._attacher is None:
            from emu.attach import ProbeAttacher  # attach.py loads with the first probe (a plain run attaches none)

            self._attacher = ProbeAttacher(self)
        return self._attacher

    @property
    def attachments(self) -> list[Attachment]:
        """The probe specs attached to the executable (and to libraries, marked ``library``)."""
        return self._attacher.attachments if self._attacher is not None else []

    @property
    def libraries(self) -> LibraryProbes:
        """Probes by spec on shared libraries (libprobes.py loads with the first one)."""
        return self.attacher.libraries

    def library_probes(self) -> list[LibraryProbe]:
        return self._attacher.library_probes() if self._attacher is not None else []

    @property
    def resolver(self) -> Resolver:
        """Symbols and USDT notes of the executable (probes.py loads only when a probe or a caller needs them)."""
        return self.attacher.resolver

    def attach(self, spec: str | ProbeSpec, consumer: Consumer | None = None) -> Attachment | LibraryProbe:
        """Attach a probe spec (uprobe:SYM+OFF, uretprobe:SYM, usdt:PROV:NAME, uprobe:0xADDR, uprobe:PATH:SYM);
        one on a shared library returns a LibraryProbe (ProbeAttacher.attach)."""
        return self.attacher.attach(spec, consumer)

    def attach_resolved(self, resolved: ResolvedProbe, consumer: Consumer,
                        images: tuple[LoadedImage | None, ...]) -> Attachment:
        return self.attacher.attach_resolved(resolved, consumer, images)

    def _perf_attach(self, path: str, offset: int, retprobe: bool, ref_ctr_offset: int,
                     consumer: Consumer) -> Callable[[], None]:
        return self.attacher.perf_attach(path, offset, retprobe, ref_ctr_offset, consumer)

    def _library_mmap(self, vma: Vma) -> None:
        if self._attacher is not None:  # no attacher, no library probes
            self._attacher.library_mmap(vma)

    # --------------------------------------------------------------- running (emu/process/runloop.py)
    def run(self) -> RunResult:
        start = time.perf_counter()
        self.budget = Budget(self.options.timeout_s, self.options.max_insns, start)
        reset_registers(self.cpu, self.entry_sp)
        self.family.add(self.kernel.ident.pid, self.kernel.ident.ppid, self, running=True)
        ending, status, signal, message = self.run_loop.run_first(self.image.entry)
        return RunResult(
            ending=ending,
            exit_status=status,
            signal=signal,
            message=message,
            insns=self.counter.total if self.counter else None,
            syscalls=self.kernel.syscall_counts(),
            unknown_syscalls=self.kernel.unknown_syscalls(),
            wall_s=time.perf_counter() - start,
            probes=self._attacher.summaries() if self._attacher is not None else (),
            exits=self._exits(),
            threads=len(self.kernel.sched.tasks),
            switches=self.kernel.sched.switches,
        )

    def _exits(self) -> dict[str, int]:
        """How hits left the kernel, in every process of the run (each keeps its statistics through execve)."""
        exits: Counter[str] = Counter()
        for process in (self, *self.forked):
            exits.update(process.uprobes.stats.exits)
        return dict(exits)

    def run_from(self, pc: int, timeout_s: float = 0.0) -> Outcome:
        """Run from ``pc`` with the registers and memory as they are until the guest exits or dies, and
        keep its files open: a caller that resets registers and memory itself can run the same
        process again (the fuzzer reuses one process for thousands of cases). Each call has a budget of
        its own: ``timeout_s`` and the options' --max-insns."""
        self.budget = Budget(timeout_s, self.options.max_insns)
        return self.run_loop.run_until_end(pc)

    @property
    def spurious_stops(self) -> int:
        """How often emu_start returned with nothing to report (RunLoop._spurious_stop)."""
        return self.run_loop.spurious_stops

    def describe_insn(self, address: int) -> str:
        return describe_insn(self.mem, address)


def _program(path: str, argv: list[str]) -> tuple[str, list[str]]:
    """The program a run starts with: ``path``, or the interpreter of a "#!" script (as execve would)."""
    try:
        return scripts.resolve(path, argv, scripts.host_head)
    except SyscallError as err:
        raise LoadError(path, f"a script execve would refuse ({errno.errorcode.get(err.errno, err.errno)})") from None
