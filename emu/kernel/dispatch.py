"""The syscall entry: snapshot the registers, dispatch by number, write the result back.

The errno boundary lives here: handlers raise SyscallError(errno) and this writes
-errno into rax. An unknown number is -ENOSYS and is recorded. On the way out the
fake kernel sets rcx = return address and r11 = rflags, as the CPU's ``syscall``
and the kernel's SYSRET do (spec 2.0); Unicorn does neither.
"""

from __future__ import annotations

import errno
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from emu.cpu import Cpu
from emu.cpumodel import DEFAULT_CPUS, CpuModel
from emu.errors import MapFailed
from emu.kernel.clock import VirtualClock
from emu.kernel.errno_ import SyscallError
from emu.kernel.family import FamilyOf
from emu.kernel.fs.fdtable import SharedFdTable
from emu.kernel.overlay import Overlay
from emu.kernel.rows import Row
from emu.kernel.sched import Scheduler
from emu.kernel.state import Brk, CloneArgs, PerfAttach, SignalState, Timer, default_memory_limit, host_rlimits
from emu.kernel.tasks import Task
from emu.kernel.vfs import Vfs
from emu.process.memory import Memory, UserFault
from emu.process.vma import Vma

SYSCALL_INSN_LEN = 2
REALTIME_START_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """Everything that makes a run deterministic and sandboxed; all of it injectable."""

    rootfs: str = "/"
    cwd: str | None = None  # default: the host's cwd when rootfs is "/", else "/"
    pid: int = 4242
    ppid: int = 4241
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    seed: int = 0
    realtime_start_ns: int = REALTIME_START_NS
    hostname: str = "uprobe-emu"
    cpus: int = DEFAULT_CPUS  # what sched_getaffinity, /proc/cpuinfo, /sys/devices/system/cpu and CPUID count
    read_only: bool = False  # True: every write to the file system is EROFS (no in-memory layer)
    memory_limit: int | None = field(default_factory=default_memory_limit)  # all processes' mappings; None: no cap


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the guest process is: what /proc/self and the id syscalls report."""

    pid: int
    ppid: int
    uid: int
    gid: int
    exe: str
    argv: tuple[bytes, ...]
    envp: tuple[bytes, ...]
    auxv: tuple[tuple[int, int], ...]


Tracer = Callable[[str], None]
ForkFn = Callable[["Kernel", "CloneArgs"], int]
ExecFn = Callable[[str, list[bytes], list[bytes]], None]


class Kernel:
    """One process's view of the kernel: files, memory syscalls, identity, time, signals."""

    def __init__(self, cpu: Cpu, mem: Memory, config: KernelConfig, table: dict[int, Row] | None = None) -> None:
        """``table``: number -> row (table.build_table(), which the machine passes); none: every
        syscall is -ENOSYS. It comes from outside so that this module imports no handler."""
        self.cpu = cpu
        self.mem = mem
        self.config = config
        self.table: dict[int, Row] = {} if table is None else table
        self.files: SharedFdTable = SharedFdTable()
        cwd = config.cwd or (os.getcwd() if config.rootfs == "/" else "/")
        self.clock = VirtualClock(config.realtime_start_ns)
        self.vfs = Vfs(config.rootfs, cwd)
        if not config.read_only:
            self.vfs.overlay = Overlay(self.vfs.host_path, self.clock.wall_ns)
        self.random = random.Random(config.seed)
        self.sched = Scheduler(Task(config.pid, SignalState()), self.clock, cpu.stop)
        self.rlimits = host_rlimits()
        self.brk = Brk(0, 0)
        self.shared_readonly: list[tuple[int, int, int]] = []  # MAP_SHARED of read-only fds: (start, end, inode)
        self.ident = Identity(config.pid, config.ppid, config.uid, config.gid, "", (), (), ())
        self.umask = 0o022
        self.next_inode = 1000
        self.counts: Counter[int] = Counter()
        self.unknown: Counter[int] = Counter()
        self.tracer: Tracer | None = None
        self.deferred: list[Callable[[], None]] = []
        self.syscall_log: list[tuple[str, tuple[int, ...], int]] | None = None  # for lockstep comparison
        self.exec_mmap_observers: list[Callable[[Vma], None]] = []
        # told of each signal frame: (the handler's restorer, the interrupted ip) when one is set up,
        # (None, the ip of the rt_sigreturn syscall) when it is taken down
        self.signal_frame_observers: list[Callable[[int | None, int], None]] = []
        self.perf_attach: PerfAttach | None = None  # set by the machine: uprobes for perf_event_open
        self.fork: ForkFn | None = None  # set by the machine: clone without CLONE_VM (a new process)
        self.exec: ExecFn | None = None  # set by the machine: execve (path, argv, envp)
        self.family: FamilyOf[Kernel] | None = None  # the run's processes (family.py), set by the machine
        self.cpu_model = CpuModel(config.cpus)
        self.affinity = self.cpu_model.affinity_mask()  # sched_setaffinity's mask (one for the process)
        self.pgid = config.pid  # process group (procsig.py): a fork inherits it, setpgid changes it
        self.sid = config.pid  # session (procsig.py): a fork inherits it, setsid makes a new one
        self.nice = 0  # setpriority's value (process.py): a fork inherits it; it changes no scheduling
        self.timers: dict[int, Timer] = {}  # alarm/setitimer and POSIX timers (procsig.py)
        # tid -> what undoes its open that waits (a FIFO's, for the other end: fifo.py) if it never completes
        self.open_waits: dict[int, Callable[[], None]] = {}
        self.prctl: dict[int, int] = {}  # prctl attributes set (process.sys_prctl)
        self.task_names: dict[int, bytes] = {}  # PR_SET_NAME, by tid

    @property
    def task(self) -> Task:
        """The running thread."""
        return self.sched.current

    @property
    def signals(self) -> SignalState:
        """The running thread's mask, pending set and alternate stack (the actions dict is shared)."""
        return self.sched.current.signals

    def add_rows(self, rows: tuple[Row, ...]) -> None:
        """Add (or override) syscall rows, e.g. a design's uprobe syscalls."""
        self.table.update({row.nr: row for row in rows})

    def defer(self, action: Callable[[], None]) -> None:
        """Stop the CPU and run ``action`` between instructions (e.g. one out-of-line step)."""
        self.deferred.append(action)
        self.cpu.stop()

    def name_of(self, nr: int) -> str:
        row = self.table.get(nr)
        return row.name if row else f"syscall_{nr:#x}"

    def on_syscall(self) -> None:
        """UC_HOOK_INSN(SYSCALL): rip is at the ``syscall`` instruction; Unicorn adds 2 afterwards."""
        entry = self.cpu.read_syscall()
        nr, a0, a1, a2, a3, a4, a5, rip, rflags, _rsp = entry
        self.counts[nr] += 1
        row = self.table.get(nr)
        if row is not None and row.raw:
            if self.tracer is not None:
                self.tracer(f"{row.name}() = ?")
            row.handler(self, nr, entry)
            return
        if row is None:
            self.unknown[nr] += 1
            ret = -errno.ENOSYS
        else:
            try:
                ret = row.handler(self, a0, a1, a2, a3, a4, a5) or 0
            except SyscallError as err:
                ret = -err.errno
            except UserFault:
                ret = -errno.EFAULT
            except MapFailed:
                ret = -errno.ENOMEM  # the host could not back the mapping (Unicorn out of memory)
        if self.tracer is not None:
            self._trace(nr, row, (a0, a1, a2, a3, a4, a5), ret)
        if self.syscall_log is not None:
            self.syscall_log.append((self.name_of(nr), (a0, a1, a2, a3, a4, a5), ret))
        # SYSRET: user rcx <- return address, r11 <- rflags (spec 2.0).
        self.cpu.write_syscall_return(ret, rip + SYSCALL_INSN_LEN, rflags)

    def _trace(self, nr: int, row: Row | None, args: tuple[int, ...], ret: int) -> None:
        from emu.kernel.strace import format_call, format_result  # only with --strace

        assert self.tracer is not None
        if row is None:
            shown = ", ".join(hex(a) for a in args)
            self.tracer(f"{self.name_of(nr)}({shown}) = {format_result('', ret)}")
        else:
            self.tracer(format_call(row.name, row.args, args, ret, self.mem))

    def trace_exit(self, name: str, status: int) -> None:
        if self.tracer is not None:
            self.tracer(f"{name}({status}) = ?")

    def syscall_counts(self) -> dict[str, int]:
        return {self.name_of(nr): n for nr, n in sorted(self.counts.items())}

    def unknown_syscalls(self) -> dict[str, int]:
        return {self.name_of(nr): n for nr, n in sorted(self.unknown.items())}
