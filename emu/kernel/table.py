"""The syscall table: x86-64 number, name, handler, and how strace prints the arguments.

Argument kinds for tracing: d (int), u (unsigned), x (hex), fd, dirfd, path,
wbuf (bytes written: address then length in the next argument), rbuf (bytes read
back, length = the return value), oflags, prot, mflags, ptr, sig, how.
A number absent from the table is -ENOSYS and is recorded (dispatch.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from emu.kernel import fs, mm, net, process, signal

Handler = Callable[..., "int | None"]


@dataclass(frozen=True, slots=True)
class Row:
    nr: int
    name: str
    handler: Handler
    args: tuple[str, ...]
    note: str = ""
    raw: bool = False  # the handler reads and writes every register itself (no rax/rcx/r11 epilogue)


def _rows() -> tuple[Row, ...]:
    r = Row
    return (
        r(0, "read", fs.sys_read, ("fd", "rbuf", "u")),
        r(1, "write", fs.sys_write, ("fd", "wbuf", "u")),
        r(2, "open", fs.sys_open, ("path", "oflags", "mode")),
        r(3, "close", fs.sys_close, ("fd",)),
        r(4, "stat", fs.sys_stat, ("path", "ptr")),
        r(5, "fstat", fs.sys_fstat, ("fd", "ptr")),
        r(6, "lstat", fs.sys_lstat, ("path", "ptr")),
        r(8, "lseek", fs.sys_lseek, ("fd", "d", "whence")),
        r(9, "mmap", mm.sys_mmap, ("ptr", "u", "prot", "mflags", "fd", "x")),
        r(10, "mprotect", mm.sys_mprotect, ("ptr", "u", "prot")),
        r(11, "munmap", mm.sys_munmap, ("ptr", "u")),
        r(12, "brk", mm.sys_brk, ("ptr",)),
        r(13, "rt_sigaction", signal.sys_rt_sigaction, ("sig", "ptr", "ptr", "u")),
        r(14, "rt_sigprocmask", signal.sys_rt_sigprocmask, ("how", "ptr", "ptr", "u")),
        r(16, "ioctl", fs.sys_ioctl, ("fd", "x", "ptr")),
        r(17, "pread64", fs.sys_pread64, ("fd", "rbuf", "u", "d")),
        r(19, "readv", fs.sys_readv, ("fd", "ptr", "u")),
        r(20, "writev", fs.sys_writev, ("fd", "ptr", "u")),
        r(21, "access", fs.sys_access, ("path", "amode")),
        r(22, "pipe", fs.sys_pipe, ("ptr",)),
        r(24, "sched_yield", process.sys_sched_yield, ()),
        r(25, "mremap", mm.sys_mremap, ("ptr", "u", "u", "x", "ptr")),
        r(28, "madvise", mm.sys_madvise, ("ptr", "u", "d")),
        r(32, "dup", fs.sys_dup, ("fd",)),
        r(33, "dup2", fs.sys_dup2, ("fd", "fd")),
        r(35, "nanosleep", process.sys_nanosleep, ("ptr", "ptr")),
        r(39, "getpid", process.sys_getpid, ()),
        r(41, "socket", net.sys_no_network, ("d", "d", "d"), "no network in the sandbox"),
        r(42, "connect", net.sys_no_network, ("fd", "ptr", "u"), "no network in the sandbox"),
        r(49, "bind", net.sys_no_network, ("fd", "ptr", "u"), "no network in the sandbox"),
        r(53, "socketpair", net.sys_no_network, ("d", "d", "d", "ptr"), "no network in the sandbox"),
        r(60, "exit", process.sys_exit_group, ("d",), "single thread: the process ends"),
        r(62, "kill", signal.sys_kill, ("d", "sig")),
        r(63, "uname", process.sys_uname, ("ptr",)),
        r(72, "fcntl", fs.sys_fcntl, ("fd", "d", "x")),
        r(79, "getcwd", fs.sys_getcwd, ("ptr", "u")),
        r(80, "chdir", fs.sys_chdir, ("path",)),
        r(81, "fchdir", fs.sys_fchdir, ("fd",)),
        r(89, "readlink", fs.sys_readlink, ("path", "ptr", "u")),
        r(95, "umask", fs.sys_umask, ("mode",)),
        r(96, "gettimeofday", process.sys_gettimeofday, ("ptr", "ptr")),
        r(97, "getrlimit", process.sys_getrlimit, ("d", "ptr")),
        r(99, "sysinfo", process.sys_sysinfo, ("ptr",)),
        r(102, "getuid", process.sys_getuid, ()),
        r(104, "getgid", process.sys_getgid, ()),
        r(107, "geteuid", process.sys_getuid, ()),
        r(108, "getegid", process.sys_getgid, ()),
        r(110, "getppid", process.sys_getppid, ()),
        r(111, "getpgrp", process.sys_getpid, ()),
        r(121, "getpgid", process.sys_getpgid, ("d",)),
        r(131, "sigaltstack", signal.sys_sigaltstack, ("ptr", "ptr")),
        r(158, "arch_prctl", process.sys_arch_prctl, ("x", "x")),
        r(186, "gettid", process.sys_getpid, ()),
        r(200, "tkill", signal.sys_tkill, ("d", "sig")),
        r(201, "time", process.sys_time, ("ptr",)),
        r(202, "futex", process.sys_futex, ("ptr", "d", "d", "ptr")),
        r(204, "sched_getaffinity", process.sys_sched_getaffinity, ("d", "u", "ptr")),
        r(217, "getdents64", fs.sys_getdents64, ("fd", "ptr", "u")),
        r(218, "set_tid_address", process.sys_set_tid_address, ("ptr",)),
        r(228, "clock_gettime", process.sys_clock_gettime, ("d", "ptr")),
        r(229, "clock_getres", process.sys_clock_getres, ("d", "ptr")),
        r(230, "clock_nanosleep", process.sys_clock_nanosleep, ("d", "d", "ptr", "ptr")),
        r(231, "exit_group", process.sys_exit_group, ("d",)),
        r(234, "tgkill", signal.sys_tgkill, ("d", "d", "sig")),
        r(257, "openat", fs.sys_openat, ("dirfd", "path", "oflags", "mode")),
        r(262, "newfstatat", fs.sys_newfstatat, ("dirfd", "path", "ptr", "x")),
        r(267, "readlinkat", fs.sys_readlinkat, ("dirfd", "path", "ptr", "u")),
        r(269, "faccessat", fs.sys_faccessat_nf, ("dirfd", "path", "amode")),
        r(273, "set_robust_list", process.sys_set_robust_list, ("ptr", "u")),
        r(292, "dup3", fs.sys_dup3, ("fd", "fd", "oflags")),
        r(293, "pipe2", fs.sys_pipe2, ("ptr", "oflags")),
        r(302, "prlimit64", process.sys_prlimit64, ("d", "d", "ptr", "ptr")),
        r(318, "getrandom", process.sys_getrandom, ("ptr", "u", "x")),
        r(332, "statx", fs.sys_statx, ("dirfd", "path", "x", "x", "ptr")),
        r(334, "rseq", process.sys_rseq, ("ptr", "u", "x", "x")),
        r(439, "faccessat2", fs.sys_faccessat, ("dirfd", "path", "amode", "x")),
    )


ROWS: tuple[Row, ...] = _rows()


def build_table(extra: tuple[Row, ...] = ()) -> dict[int, Row]:
    """Number -> row; ``extra`` rows (e.g. a design's uprobe syscalls) override the base ones."""
    table = {row.nr: row for row in ROWS}
    table.update({row.nr: row for row in extra})
    return table


