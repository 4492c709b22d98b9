"""Process syscalls: identity, exit_group, time, uname, limits, randomness, arch_prctl, and the per-thread
registrations every libc start-up makes (set_tid_address, set_robust_list, rseq); clone and exit: threads.py."""

from __future__ import annotations

import errno
import os
import struct
from typing import TYPE_CHECKING

from emu.abi import Prot, signed32
from emu.cpu import Reg
from emu.cpumodel import MAX_CPUS
from emu.kernel.cputime import cpu_clock_kind, cpu_ns
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestExit, WouldBlock
from emu.kernel.state import RLIMIT_STACK

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

ARCH_SET_GS, ARCH_SET_FS, ARCH_GET_FS, ARCH_GET_GS = 0x1001, 0x1002, 0x1003, 0x1004
CLOCK_IDS = range(0, 12)
RSEQ_SIG_MIN_LEN = 32
CPUMASK_SIZE = MAX_CPUS // 8  # bytes of a cpumask with NR_CPUS bits (Linux 6.18 here answers 32)
SYSINFO_FORMAT = "<q3Q6QHH4xQQI"  # uptime loads[3] totalram..freeswap procs pad (pad) totalhigh freehigh mem_unit
SYSINFO_SIZE = 112
SYSINFO_TOTALRAM = 4 << 30

def sys_exit_group(k: Kernel, status: int, *_: int) -> int:
    raise GuestExit(status)


def sys_getpid(k: Kernel, *_: int) -> int:
    return k.ident.pid


def sys_getppid(k: Kernel, *_: int) -> int:
    return k.ident.ppid


def sys_getuid(k: Kernel, *_: int) -> int:
    return k.ident.uid


def sys_getgid(k: Kernel, *_: int) -> int:
    return k.ident.gid


def sys_getgroups(k: Kernel, size: int, addr: int, *_: int) -> int:
    """Supplementary groups: the host's when the guest runs as the host user (as uid/gid default), else none."""
    groups = os.getgroups() if (k.ident.uid, k.ident.gid) == (os.getuid(), os.getgid()) else []
    size = size & 0xFFFFFFFF
    if size == 0:
        return len(groups)
    if size > 1 << 16 or size < len(groups):
        raise SyscallError(errno.EINVAL)
    k.mem.write_user(addr, struct.pack(f"<{len(groups)}I", *groups))
    return len(groups)


PRIO_PROCESS = 0
NICE_MIN, NICE_MAX = -20, 19


def _own_process(k: Kernel, which: int, who: int) -> None:
    """getpriority/setpriority of another process, group or user are not modelled: ESRCH, as for no match."""
    if which not in (0, 1, 2):  # PRIO_PROCESS, PRIO_PGRP, PRIO_USER
        raise SyscallError(errno.EINVAL)
    if which != PRIO_PROCESS or signed32(who) not in (0, k.ident.pid):
        raise SyscallError(errno.ESRCH)


def sys_getpriority(k: Kernel, which: int, who: int, *_: int) -> int:
    """The raw system call returns 20 - nice (1..40); glibc turns it back into the nice value."""
    _own_process(k, which, who)
    return 20 - k.nice


def sys_setpriority(k: Kernel, which: int, who: int, nice: int, *_: int) -> int:
    _own_process(k, which, who)
    value = min(max(signed32(nice), NICE_MIN), NICE_MAX)
    if value < k.nice and k.ident.uid != 0:  # raising the priority needs CAP_SYS_NICE
        raise SyscallError(errno.EACCES)
    k.nice = value
    return 0


def sys_gettid(k: Kernel, *_: int) -> int:
    return k.task.tid


def sys_set_tid_address(k: Kernel, addr: int, *_: int) -> int:
    k.task.clear_child_tid = addr  # cleared (and its futex woken) when the thread exits: threads.sys_exit
    return k.task.tid


def sys_set_robust_list(k: Kernel, head: int, length: int, *_: int) -> int:
    if length != 24:
        raise SyscallError(errno.EINVAL)
    k.task.robust_list = head  # walked by nobody: a thread exits holding no robust mutex here
    return 0


def sys_rseq(k: Kernel, addr: int, length: int, flags: int, sig: int, *_: int) -> int:
    """Register (or with flags=1 unregister) the rseq area; cpu_id fields say CPU 0."""
    if flags & ~1:
        raise SyscallError(errno.EINVAL)
    if flags & 1:
        if k.task.rseq is None or k.task.rseq[0] != addr:
            raise SyscallError(errno.EINVAL)
        k.task.rseq = None
        return 0
    if k.task.rseq is not None:
        raise SyscallError(errno.EBUSY if k.task.rseq == (addr, length, sig) else errno.EINVAL)
    if addr % 32 or length < RSEQ_SIG_MIN_LEN:
        raise SyscallError(errno.EINVAL)
    k.mem.write_user(addr, struct.pack("<II", 0, 0))  # cpu_id_start, cpu_id
    k.task.rseq = (addr, length, sig)
    return 0


def sys_uname(k: Kernel, buf: int, *_: int) -> int:
    fields = ("Linux", k.config.hostname, "6.18.0-uprobe-emu", "#1 SMP PREEMPT_DYNAMIC", "x86_64", "(none)")
    k.mem.write_user(buf, b"".join(f.encode()[:64].ljust(65, b"\0") for f in fields))
    return 0


def sys_arch_prctl(k: Kernel, code: int, addr: int, *_: int) -> int:
    if code == ARCH_SET_FS:
        k.cpu.write(Reg.FS_BASE, addr)
    elif code == ARCH_SET_GS:
        k.cpu.write(Reg.GS_BASE, addr)
    elif code in (ARCH_GET_FS, ARCH_GET_GS):
        reg = Reg.FS_BASE if code == ARCH_GET_FS else Reg.GS_BASE
        k.mem.write_user(addr, struct.pack("<Q", k.cpu.read(reg)))
    else:
        raise SyscallError(errno.EINVAL)  # including ARCH_SHSTK_*: no CET here (spec 3.7)
    return 0


def sys_prlimit64(k: Kernel, pid: int, resource: int, new: int, old: int, *_: int) -> int:
    if pid not in (0, k.ident.pid):
        raise SyscallError(errno.ESRCH)
    if resource not in k.rlimits:
        raise SyscallError(errno.EINVAL)
    if old:
        k.mem.write_user(old, struct.pack("<QQ", *k.rlimits[resource]))
    if new:
        soft, hard = struct.unpack("<QQ", k.mem.read_user(new, 16))
        if soft > hard or hard > k.rlimits[resource][1]:
            raise SyscallError(errno.EINVAL if soft > hard else errno.EPERM)
        k.rlimits[resource] = (soft, hard)
        if resource == RLIMIT_STACK:
            k.mem.stack_limit = soft  # how far [stack] may grow from now on
    return 0


def sys_getrlimit(k: Kernel, resource: int, old: int, *_: int) -> int:
    return sys_prlimit64(k, 0, resource, 0, old)


def sys_getrandom(k: Kernel, buf: int, count: int, flags: int, *_: int) -> int:
    if flags & ~7:
        raise SyscallError(errno.EINVAL)
    count = min(count, 1 << 25)
    k.mem.check_user(buf, count, Prot.WRITE)
    k.mem.write_user(buf, k.random.randbytes(count))
    return count


def sys_clock_gettime(k: Kernel, clock: int, ts: int, *_: int) -> int:
    """The virtual clock, or the process's CPU time for a CPU clock (cputime.py)."""
    kind = cpu_clock_kind(k, clock)
    if kind is not None:
        ns = cpu_ns(k, kind)
    elif clock in CLOCK_IDS:
        ns = k.clock.now(realtime=clock in (0, 5, 8, 11))
    else:
        raise SyscallError(errno.EINVAL)
    k.mem.write_user(ts, struct.pack("<qq", ns // 10**9, ns % 10**9))
    return 0


def sys_clock_getres(k: Kernel, clock: int, ts: int, *_: int) -> int:
    if cpu_clock_kind(k, clock) is None and clock not in CLOCK_IDS:
        raise SyscallError(errno.EINVAL)
    if ts:
        k.mem.write_user(ts, struct.pack("<qq", 0, 1))
    return 0


def sys_gettimeofday(k: Kernel, tv: int, tz: int, *_: int) -> int:
    ns = k.clock.now(realtime=True)
    if tv:
        k.mem.write_user(tv, struct.pack("<qq", ns // 10**9, (ns % 10**9) // 1000))
    if tz:
        k.mem.write_user(tz, struct.pack("<ii", 0, 0))
    return 0


def sys_time(k: Kernel, tloc: int, *_: int) -> int:
    seconds = k.clock.now(realtime=True) // 10**9
    if tloc:
        k.mem.write_user(tloc, struct.pack("<q", seconds))
    return seconds


def _sleep(k: Kernel, req: int) -> int:
    sec, nsec = struct.unpack("<qq", k.mem.read_user(req, 16))
    if sec < 0 or not 0 <= nsec < 10**9:
        raise SyscallError(errno.EINVAL)
    return sleep_for(k, sec * 10**9 + nsec)


def sleep_for(k: Kernel, ns: int) -> int:
    """Virtual time. Alone (the other threads aside) sleeping is instant: the clock jumps. With other
    processes or timers the sleeper waits until the clock reaches its wake time, which it does when
    every process waits (the first wake time) or as the others run their time slices (fork.py)."""
    task = k.task
    others = k.family is not None and k.family.has_others(k.ident.pid)
    if not others and not k.timers:
        k.clock.advance(ns)  # other threads get the CPU
        return sys_sched_yield(k)
    now = k.clock.elapsed
    if task.wake_at is None:
        task.wake_at = now + ns
    if now >= task.wake_at:
        task.wake_at = None
        return 0
    raise WouldBlock(f"sleep until {task.wake_at} ns", (task,), task.wake_at)


def sys_nanosleep(k: Kernel, req: int, rem: int, *_: int) -> int:
    return _sleep(k, req)


def sys_clock_nanosleep(k: Kernel, clock: int, flags: int, req: int, rem: int, *_: int) -> int:
    if clock not in CLOCK_IDS:
        raise SyscallError(errno.EINVAL)
    if flags & 1:  # TIMER_ABSTIME
        sec, nsec = struct.unpack("<qq", k.mem.read_user(req, 16))
        target = sec * 10**9 + nsec
        now = k.clock.now(realtime=clock in (0, 5, 8, 11))
        return sleep_for(k, max(0, target - now)) if k.task.wake_at is None else sleep_for(k, 0)
    return _sleep(k, req)


def _affinity_target(k: Kernel, pid: int) -> None:
    """The process itself or one of its threads (the mask is kept per process here)."""
    if pid not in (0, k.ident.pid) and pid not in k.sched.tasks:
        raise SyscallError(errno.ESRCH)


def sys_sched_getaffinity(k: Kernel, pid: int, size: int, mask: int, *_: int) -> int:
    _affinity_target(k, pid)
    cpus = k.cpu_model.cpus
    if size * 8 < cpus or size % 8:
        raise SyscallError(errno.EINVAL)
    written = min(size, CPUMASK_SIZE)  # the kernel copies cpumask_size() bytes at most, and says how many
    k.mem.write_user(mask, k.affinity.to_bytes(written, "little"))
    return written


def sys_sched_setaffinity(k: Kernel, pid: int, size: int, mask: int, *_: int) -> int:
    """Keep the CPUs of ``mask`` that exist; none of them is EINVAL (sched_setaffinity's cpumask_and).
    Every thread still runs on the one emulated CPU: the mask is only what the process is told."""
    _affinity_target(k, pid)
    wanted = int.from_bytes(k.mem.read_user(mask, min(size, CPUMASK_SIZE)), "little") & k.cpu_model.affinity_mask()
    if not wanted:
        raise SyscallError(errno.EINVAL)
    k.affinity = wanted
    return 0


def sys_sched_yield(k: Kernel, *_: int) -> int:
    if k.sched.threaded:
        k.sched.request_switch()
    return 0


PR_SET_PDEATHSIG, PR_GET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE = 1, 2, 3, 4
PR_SET_NAME, PR_GET_NAME, PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 15, 16, 36, 37
PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 38, 39


def sys_prctl(k: Kernel, option: int, arg2: int, *_: int) -> int:
    """The process attributes programs set and read back (timeout turns dumping off, Python names
    threads); each is remembered per process and has no other effect here."""
    flags = k.prctl
    if option in (PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS):
        if option == PR_SET_DUMPABLE and arg2 > 1 or option == PR_SET_PDEATHSIG and arg2 > 64:
            raise SyscallError(errno.EINVAL)
        flags[option] = arg2
        return 0
    if option in (PR_GET_DUMPABLE, PR_GET_NO_NEW_PRIVS):
        return flags.get(option - 1, 1 if option == PR_GET_DUMPABLE else 0)
    if option in (PR_GET_PDEATHSIG, PR_GET_CHILD_SUBREAPER):
        k.mem.write_user(arg2, struct.pack("<i", flags.get(option - 1, 0)))
        return 0
    if option == PR_SET_NAME:
        k.task_names[k.task.tid] = k.mem.read_cstring(arg2, 4096)[:15]
        return 0
    if option == PR_GET_NAME:
        name = k.task_names.get(k.task.tid, os.path.basename(k.ident.exe).encode()[:15])
        k.mem.write_user(arg2, name.ljust(16, b"\0"))
        return 0
    raise SyscallError(errno.EINVAL)


def sys_sysinfo(k: Kernel, info: int, *_: int) -> int:
    """struct sysinfo: a 4 GiB machine, half free, no swap, one process, no load (loads are what
    glibc's getloadavg() reports). mem_unit (offset 104, after 4 bytes of padding) must be 1:
    glibc multiplies the sizes by it (get_phys_pages, sort's buffer size)."""
    uptime = k.clock.now(realtime=False) // 10**9
    total = SYSINFO_TOTALRAM
    blob = struct.pack(SYSINFO_FORMAT, uptime, 0, 0, 0, total, total // 2, 0, 0, 0, 0, 1, 0, 0, 0, 1)
    k.mem.write_user(info, blob.ljust(SYSINFO_SIZE, b"\0"))
    return 0
