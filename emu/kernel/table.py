"""The syscall table: x86-64 number, name, handler, and how strace prints the arguments.

Argument kinds for tracing: d (int), u (unsigned), x (hex), fd, dirfd, path,
wbuf (bytes written: address then length in the next argument), rbuf (bytes read
back, length = the return value), oflags, prot, mflags, ptr, sig, how.
A number absent from the table is -ENOSYS and is recorded (dispatch.py).

Rows are in number order, as arch/x86/entry/syscalls/syscall_64.tbl; each handler lives in the
module of its family (the file-system families: emu/kernel/fs/__init__.py lists them).
Handlers of families a plain run rarely reaches (threads and futexes, perf events, sockets, polling,
the file system's names and attributes) are bound lazily: their module is imported on the first call, which keeps process start-up
short (benchmarks/overhead.py measures it against a bare Unicorn loader).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emu.kernel import fork, mm, pipe, process, signal
from emu.kernel.fs import dirs, fds, ioctl, mapped, open_, read_write, stat_, statfs, xattr

Handler = Callable[..., "int | None"]
W = "in-memory layer; --read-only: EROFS"  # the note of every call that changes the file system


class LazyHandler:
    """``emu.kernel.<module>.<name>``, imported on the first call and called directly from then on."""

    __slots__ = ("module", "name", "_fn")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name
        self._fn: Handler | None = None

    def resolve(self) -> Handler:
        if self._fn is None:
            self._fn = getattr(importlib.import_module(f"emu.kernel.{self.module}"), self.name)
        return self._fn

    def __call__(self, *args: Any) -> int | None:
        return self.resolve()(*args)

    def __repr__(self) -> str:
        return f"<lazy emu.kernel.{self.module}.{self.name}>"


def lazy(module: str, name: str) -> LazyHandler:
    return LazyHandler(module, name)


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
        r(0, "read", read_write.sys_read, ("fd", "rbuf", "u"), "an empty pipe another process writes: waits for it"),
        r(1, "write", read_write.sys_write, ("fd", "wbuf", "u"), "a full pipe: waits; no reader: SIGPIPE, EPIPE"),
        r(2, "open", open_.sys_open, ("path", "oflags", "mode")),
        r(3, "close", fds.sys_close, ("fd",)),
        r(4, "stat", stat_.sys_stat, ("path", "ptr")),
        r(5, "fstat", stat_.sys_fstat, ("fd", "ptr")),
        r(6, "lstat", stat_.sys_lstat, ("path", "ptr")),
        r(7, "poll", lazy("poll", "sys_poll"), ("ptr", "u", "d"), "waits for the other threads and processes"),
        r(8, "lseek", read_write.sys_lseek, ("fd", "d", "whence")),
        r(9, "mmap", mm.sys_mmap, ("ptr", "u", "prot", "mflags", "fd", "x")),
        r(10, "mprotect", mm.sys_mprotect, ("ptr", "u", "prot")),
        r(11, "munmap", mm.sys_munmap, ("ptr", "u")),
        r(12, "brk", mm.sys_brk, ("ptr",)),
        r(13, "rt_sigaction", signal.sys_rt_sigaction, ("sig", "ptr", "ptr", "u")),
        r(14, "rt_sigprocmask", signal.sys_rt_sigprocmask, ("how", "ptr", "ptr", "u")),
        Row(15, "rt_sigreturn", signal.sys_rt_sigreturn, (), "restores the frame of a signal handler", raw=True),
        r(16, "ioctl", ioctl.sys_ioctl, ("fd", "x", "ptr")),
        r(17, "pread64", read_write.sys_pread64, ("fd", "rbuf", "u", "d")),
        r(18, "pwrite64", read_write.sys_pwrite64, ("fd", "wbuf", "u", "d")),
        r(19, "readv", read_write.sys_readv, ("fd", "ptr", "u")),
        r(20, "writev", read_write.sys_writev, ("fd", "ptr", "u")),
        r(21, "access", open_.sys_access, ("path", "amode")),
        r(22, "pipe", pipe.sys_pipe, ("ptr",)),
        r(23, "select", lazy("poll", "sys_select"), ("d", "ptr", "ptr", "ptr", "ptr"), "waits for the others"),
        r(24, "sched_yield", process.sys_sched_yield, ()),
        r(25, "mremap", mm.sys_mremap, ("ptr", "u", "u", "x", "ptr")),
        r(26, "msync", mapped.sys_msync, ("ptr", "u", "x"), "shared mappings written back"),
        r(28, "madvise", mm.sys_madvise, ("ptr", "u", "d")),
        r(32, "dup", fds.sys_dup, ("fd",)),
        r(33, "dup2", fds.sys_dup2, ("fd", "fd")),
        r(34, "pause", lazy("procsig", "sys_pause"), (), "sleeps until a signal is handled"),
        r(35, "nanosleep", process.sys_nanosleep, ("ptr", "ptr")),
        r(36, "getitimer", lazy("procsig", "sys_getitimer"), ("d", "ptr"), "ITIMER_REAL on the virtual clock"),
        r(37, "alarm", lazy("procsig", "sys_alarm"), ("u",), "on the virtual clock"),
        r(38, "setitimer", lazy("procsig", "sys_setitimer"), ("d", "ptr", "ptr"), "ITIMER_REAL on the virtual clock"),
        r(39, "getpid", process.sys_getpid, ()),
        r(41, "socket", lazy("net", "sys_socket"), ("d", "d", "d"), "AF_UNIX inside the guest; no network"),
        r(42, "connect", lazy("net", "sys_connect"), ("fd", "ptr", "u"), "AF_UNIX names inside the guest only"),
        r(43, "accept", lazy("net", "sys_accept"), ("fd", "ptr", "ptr")),
        r(44, "sendto", lazy("net", "sys_sendto"), ("fd", "wbuf", "u", "x", "ptr", "u")),
        r(45, "recvfrom", lazy("net", "sys_recvfrom"), ("fd", "rbuf", "u", "x", "ptr", "ptr")),
        r(46, "sendmsg", lazy("net", "sys_sendmsg"), ("fd", "ptr", "x"), "SCM_RIGHTS passes descriptors"),
        r(47, "recvmsg", lazy("net", "sys_recvmsg"), ("fd", "ptr", "x")),
        r(48, "shutdown", lazy("net", "sys_shutdown"), ("fd", "d")),
        r(49, "bind", lazy("net", "sys_bind"), ("fd", "ptr", "u"), "AF_UNIX names inside the guest only"),
        r(50, "listen", lazy("net", "sys_listen"), ("fd", "d")),
        r(51, "getsockname", lazy("net", "sys_getsockname"), ("fd", "ptr", "ptr")),
        r(52, "getpeername", lazy("net", "sys_getpeername"), ("fd", "ptr", "ptr"), "ENOTSOCK on anything else"),
        r(53, "socketpair", lazy("net", "sys_socketpair"), ("d", "d", "d", "ptr"), "AF_UNIX"),
        r(54, "setsockopt", lazy("net", "sys_setsockopt"), ("fd", "d", "d", "ptr", "u")),
        r(55, "getsockopt", lazy("net", "sys_getsockopt"), ("fd", "d", "d", "ptr", "ptr")),
        r(56, "clone", lazy("threads", "sys_clone"), ("x", "ptr", "ptr", "ptr", "ptr"), "threads; a new process: fork.py"),
        r(57, "fork", fork.sys_fork, (), "a new process: fork.py"),
        r(58, "vfork", fork.sys_vfork, (), "the child runs first, in its own copy of memory"),
        r(59, "execve", fork.sys_execve, ("path", "ptr", "ptr")),
        r(60, "exit", lazy("threads", "sys_exit"), ("d",), "ends the thread; the last one ends the process"),
        r(61, "wait4", fork.sys_wait4, ("d", "ptr", "x", "ptr")),
        r(62, "kill", lazy("procsig", "sys_kill"), ("d", "sig"), "any process of the run"),
        r(63, "uname", process.sys_uname, ("ptr",)),
        r(72, "fcntl", fds.sys_fcntl, ("fd", "d", "x"), "F_SETPIPE_SZ/F_GETPIPE_SZ: pipe.py"),
        r(73, "flock", lazy("locks", "sys_flock"), ("fd", "x")),
        r(74, "fsync", fds.sys_fsync, ("fd",)),
        r(75, "fdatasync", fds.sys_fsync, ("fd",)),
        r(76, "truncate", lazy("fs.attrs", "sys_truncate"), ("path", "d"), W),
        r(77, "ftruncate", lazy("fs.attrs", "sys_ftruncate"), ("fd", "d"), W),
        r(79, "getcwd", dirs.sys_getcwd, ("ptr", "u")),
        r(80, "chdir", dirs.sys_chdir, ("path",)),
        r(81, "fchdir", dirs.sys_fchdir, ("fd",)),
        r(82, "rename", lazy("fs.names", "sys_rename"), ("path", "path"), W),
        r(83, "mkdir", lazy("fs.names", "sys_mkdir"), ("path", "mode"), W),
        r(84, "rmdir", lazy("fs.names", "sys_rmdir"), ("path",), W),
        r(85, "creat", open_.sys_creat, ("path", "mode")),
        r(86, "link", lazy("fs.names", "sys_link"), ("path", "path"), W),
        r(87, "unlink", lazy("fs.names", "sys_unlink"), ("path",), W),
        r(88, "symlink", lazy("fs.names", "sys_symlink"), ("path", "path"), W),
        r(89, "readlink", stat_.sys_readlink, ("path", "ptr", "u")),
        r(90, "chmod", lazy("fs.attrs", "sys_chmod"), ("path", "mode"), W),
        r(91, "fchmod", lazy("fs.attrs", "sys_fchmod"), ("fd", "mode"), W),
        r(92, "chown", lazy("fs.attrs", "sys_chown"), ("path", "d", "d"), W),
        r(93, "fchown", lazy("fs.attrs", "sys_fchown"), ("fd", "d", "d"), W),
        r(94, "lchown", lazy("fs.attrs", "sys_lchown"), ("path", "d", "d"), W),
        r(95, "umask", open_.sys_umask, ("mode",)),
        r(96, "gettimeofday", process.sys_gettimeofday, ("ptr", "ptr")),
        r(97, "getrlimit", process.sys_getrlimit, ("d", "ptr")),
        r(99, "sysinfo", process.sys_sysinfo, ("ptr",)),
        r(102, "getuid", process.sys_getuid, ()),
        r(104, "getgid", process.sys_getgid, ()),
        r(107, "geteuid", process.sys_getuid, ()),
        r(108, "getegid", process.sys_getgid, ()),
        r(109, "setpgid", lazy("procsig", "sys_setpgid"), ("d", "d")),
        r(110, "getppid", process.sys_getppid, ()),
        r(111, "getpgrp", lazy("procsig", "sys_getpgrp"), ()),
        r(115, "getgroups", process.sys_getgroups, ("d", "ptr")),
        r(121, "getpgid", lazy("procsig", "sys_getpgid"), ("d",)),
        r(130, "rt_sigsuspend", lazy("procsig", "sys_rt_sigsuspend"), ("ptr", "u"), "sleeps until a signal is handled"),
        r(131, "sigaltstack", signal.sys_sigaltstack, ("ptr", "ptr")),
        r(133, "mknod", lazy("fs.names", "sys_mknod"), ("path", "mode", "x"), "device nodes: EPERM"),
        r(137, "statfs", statfs.sys_statfs, ("path", "ptr"), "host values, ST_RDONLY added"),
        r(138, "fstatfs", statfs.sys_fstatfs, ("fd", "ptr"), "host values, ST_RDONLY added"),
        r(157, "prctl", process.sys_prctl, ("d", "x", "x", "x", "x"), "attributes remembered, no other effect"),
        r(158, "arch_prctl", process.sys_arch_prctl, ("x", "x")),
        r(186, "gettid", process.sys_gettid, ()),
        r(188, "setxattr", xattr.sys_setxattr, ("path", "path", "ptr", "u", "x"), W),
        r(189, "lsetxattr", xattr.sys_lsetxattr, ("path", "path", "ptr", "u", "x"), W),
        r(190, "fsetxattr", xattr.sys_fsetxattr, ("fd", "path", "ptr", "u", "x"), W),
        r(191, "getxattr", xattr.sys_getxattr, ("path", "path", "ptr", "u"), "host values"),
        r(192, "lgetxattr", xattr.sys_lgetxattr, ("path", "path", "ptr", "u"), "host values"),
        r(193, "fgetxattr", xattr.sys_fgetxattr, ("fd", "path", "ptr", "u"), "host values"),
        r(194, "listxattr", xattr.sys_listxattr, ("path", "ptr", "u"), "host values"),
        r(195, "llistxattr", xattr.sys_llistxattr, ("path", "ptr", "u"), "host values"),
        r(196, "flistxattr", xattr.sys_flistxattr, ("fd", "ptr", "u"), "host values"),
        r(197, "removexattr", xattr.sys_setxattr, ("path", "path"), W),
        r(198, "lremovexattr", xattr.sys_lsetxattr, ("path", "path"), W),
        r(199, "fremovexattr", xattr.sys_fsetxattr, ("fd", "path"), W),
        r(200, "tkill", signal.sys_tkill, ("d", "sig")),
        r(201, "time", process.sys_time, ("ptr",)),
        r(202, "futex", lazy("futex", "sys_futex"), ("ptr", "d", "d", "ptr", "ptr", "x")),
        r(203, "sched_setaffinity", process.sys_sched_setaffinity, ("d", "u", "ptr")),
        r(204, "sched_getaffinity", process.sys_sched_getaffinity, ("d", "u", "ptr")),
        r(213, "epoll_create", lazy("events", "sys_epoll_create"), ("d",)),
        r(217, "getdents64", dirs.sys_getdents64, ("fd", "ptr", "u")),
        r(218, "set_tid_address", process.sys_set_tid_address, ("ptr",)),
        r(221, "fadvise64", fds.sys_fadvise64, ("fd", "d", "d", "d"), "advice is checked, then ignored"),
        r(222, "timer_create", lazy("procsig", "sys_timer_create"), ("d", "ptr", "ptr"), "on the virtual clock"),
        r(223, "timer_settime", lazy("procsig", "sys_timer_settime"), ("d", "x", "ptr", "ptr")),
        r(224, "timer_gettime", lazy("procsig", "sys_timer_gettime"), ("d", "ptr")),
        r(225, "timer_getoverrun", lazy("procsig", "sys_timer_getoverrun"), ("d",)),
        r(226, "timer_delete", lazy("procsig", "sys_timer_delete"), ("d",)),
        r(228, "clock_gettime", process.sys_clock_gettime, ("d", "ptr")),
        r(229, "clock_getres", process.sys_clock_getres, ("d", "ptr")),
        r(230, "clock_nanosleep", process.sys_clock_nanosleep, ("d", "d", "ptr", "ptr")),
        r(231, "exit_group", process.sys_exit_group, ("d",)),
        r(232, "epoll_wait", lazy("events", "sys_epoll_wait"), ("fd", "ptr", "d", "d"), "waits for the others"),
        r(233, "epoll_ctl", lazy("events", "sys_epoll_ctl"), ("fd", "d", "fd", "ptr")),
        r(234, "tgkill", signal.sys_tgkill, ("d", "d", "sig")),
        r(247, "waitid", fork.sys_waitid, ("d", "d", "ptr", "x", "ptr")),
        r(257, "openat", open_.sys_openat, ("dirfd", "path", "oflags", "mode")),
        r(258, "mkdirat", lazy("fs.names", "sys_mkdirat"), ("dirfd", "path", "mode"), W),
        r(259, "mknodat", lazy("fs.names", "sys_mknodat"), ("dirfd", "path", "mode", "x"), "device nodes: EPERM"),
        r(260, "fchownat", lazy("fs.attrs", "sys_fchownat"), ("dirfd", "path", "d", "d", "atflags"), W),
        r(262, "newfstatat", stat_.sys_newfstatat, ("dirfd", "path", "ptr", "x")),
        r(263, "unlinkat", lazy("fs.names", "sys_unlinkat"), ("dirfd", "path", "atflags"), W),
        r(264, "renameat", lazy("fs.names", "sys_renameat"), ("dirfd", "path", "dirfd", "path"), W),
        r(265, "linkat", lazy("fs.names", "sys_linkat"), ("dirfd", "path", "dirfd", "path", "atflags"), W),
        r(266, "symlinkat", lazy("fs.names", "sys_symlinkat"), ("path", "dirfd", "path"), W),
        r(267, "readlinkat", stat_.sys_readlinkat, ("dirfd", "path", "ptr", "u")),
        r(268, "fchmodat", lazy("fs.attrs", "sys_fchmodat"), ("dirfd", "path", "mode"), W),
        r(269, "faccessat", open_.sys_faccessat_nf, ("dirfd", "path", "amode")),
        r(270, "pselect6", lazy("poll", "sys_pselect6"), ("d", "ptr", "ptr", "ptr", "ptr", "ptr"),
          "waits for the others"),
        r(271, "ppoll", lazy("poll", "sys_ppoll"), ("ptr", "u", "ptr", "ptr", "u"), "waits for the others"),
        r(273, "set_robust_list", process.sys_set_robust_list, ("ptr", "u")),
        r(280, "utimensat", lazy("fs.attrs", "sys_utimensat"), ("dirfd", "path", "ptr", "atflags"), W),
        r(281, "epoll_pwait", lazy("events", "sys_epoll_pwait"), ("fd", "ptr", "d", "d", "ptr", "u"),
          "waits for the others"),
        r(282, "signalfd", lazy("events", "sys_signalfd"), ("fd", "ptr", "u")),
        r(283, "timerfd_create", lazy("events", "sys_timerfd_create"), ("d", "x"), "on the virtual clock"),
        r(284, "eventfd", lazy("events", "sys_eventfd"), ("u",)),
        r(285, "fallocate", lazy("fs.attrs", "sys_fallocate"), ("fd", "x", "d", "d")),
        r(286, "timerfd_settime", lazy("events", "sys_timerfd_settime"), ("fd", "x", "ptr", "ptr")),
        r(287, "timerfd_gettime", lazy("events", "sys_timerfd_gettime"), ("fd", "ptr")),
        r(288, "accept4", lazy("net", "sys_accept4"), ("fd", "ptr", "ptr", "x")),
        r(289, "signalfd4", lazy("events", "sys_signalfd4"), ("fd", "ptr", "u", "x")),
        r(290, "eventfd2", lazy("events", "sys_eventfd2"), ("u", "x")),
        r(291, "epoll_create1", lazy("events", "sys_epoll_create1"), ("x",)),
        r(292, "dup3", fds.sys_dup3, ("fd", "fd", "oflags")),
        r(293, "pipe2", pipe.sys_pipe2, ("ptr", "oflags")),
        r(298, "perf_event_open", lazy("perf", "sys_perf_event_open"), ("ptr", "d", "d", "d", "x"),
          "the uprobe PMU only"),
        r(302, "prlimit64", process.sys_prlimit64, ("d", "d", "ptr", "ptr")),
        r(316, "renameat2", lazy("fs.names", "sys_renameat2"), ("dirfd", "path", "dirfd", "path", "x"), W),
        r(318, "getrandom", process.sys_getrandom, ("ptr", "u", "x")),
        r(332, "statx", stat_.sys_statx, ("dirfd", "path", "x", "x", "ptr")),
        r(334, "rseq", process.sys_rseq, ("ptr", "u", "x", "x")),
        r(435, "clone3", lazy("threads", "sys_clone3"), ("ptr", "u"), "threads; a new process: fork.py"),
        r(436, "close_range", fds.sys_close_range, ("fd", "fd", "x")),
        r(439, "faccessat2", open_.sys_faccessat, ("dirfd", "path", "amode", "x")),
        r(441, "epoll_pwait2", lazy("events", "sys_epoll_pwait2"), ("fd", "ptr", "d", "ptr", "ptr", "u"),
          "waits for the others"),
        r(462, "mseal", mm.sys_mseal, ("ptr", "u", "x"), "the RFC's uretprobe syscall in uretprobe-rfc"),
    )


ROWS: tuple[Row, ...] = _rows()


def build_table(extra: tuple[Row, ...] = ()) -> dict[int, Row]:
    """Number -> row; ``extra`` rows (e.g. a design's uprobe syscalls) override the base ones."""
    table = {row.nr: row for row in ROWS}
    table.update({row.nr: row for row in extra})
    return table


