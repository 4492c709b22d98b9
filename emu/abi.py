"""x86-64 Linux facts in one place: page size, red zone, signals, auxv tags, mmap flags."""

from __future__ import annotations

import enum

PAGE_SIZE = 0x1000
PAGE_MASK = ~(PAGE_SIZE - 1)
U64 = (1 << 64) - 1  # a 64-bit register's or address's mask
RED_ZONE = 128
TASK_SIZE = 0x7FFFFFFFF000

# Deterministic layout, as Linux lays out a process with ASLR off.
PIE_BASE = 0x555555554000  # ELF_ET_DYN_BASE
MMAP_BASE = 0x7FFFF7FFF000  # TASK_SIZE - 128 MiB gap, rounded
STACK_TOP = 0x7FFFFFFFF000
STACK_SIZE = 8 << 20  # RLIMIT_STACK default; mapped whole, Unicorn cannot grow it


def page_down(addr: int) -> int:
    return addr & PAGE_MASK


def page_up(addr: int) -> int:
    return (addr + PAGE_SIZE - 1) & PAGE_MASK


class Prot(enum.IntFlag):
    NONE = 0
    READ = 1
    WRITE = 2
    EXEC = 4


class Signal(enum.IntEnum):
    SIGHUP = 1
    SIGINT = 2
    SIGQUIT = 3
    SIGILL = 4
    SIGTRAP = 5
    SIGABRT = 6
    SIGBUS = 7
    SIGFPE = 8
    SIGKILL = 9
    SIGUSR1 = 10
    SIGSEGV = 11
    SIGUSR2 = 12
    SIGPIPE = 13
    SIGALRM = 14
    SIGTERM = 15
    SIGSTKFLT = 16
    SIGCHLD = 17
    SIGCONT = 18
    SIGSTOP = 19
    SIGTSTP = 20
    SIGTTIN = 21
    SIGTTOU = 22
    SIGURG = 23
    SIGXCPU = 24
    SIGXFSZ = 25
    SIGVTALRM = 26
    SIGPROF = 27
    SIGWINCH = 28
    SIGIO = 29
    SIGPWR = 30
    SIGSYS = 31


# Signals whose default action is to ignore them (the rest terminate, or stop).
DEFAULT_IGNORED = frozenset({Signal.SIGCHLD, Signal.SIGCONT, Signal.SIGURG, Signal.SIGWINCH})


def signed64(value: int) -> int:
    """A long argument: the 64-bit register read as signed."""
    return value - (1 << 64) if value >= 1 << 63 else value


def signed32(value: int) -> int:
    """An int argument: the register's low 32 bits, signed (the kernel never sees the upper half)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


# si_code of a signal's siginfo (include/uapi/asm-generic/siginfo.h): who sent it.
SI_USER, SI_KERNEL, SI_TKILL = 0, 0x80, -6


class AuxType(enum.IntEnum):
    AT_NULL = 0
    AT_PHDR = 3
    AT_PHENT = 4
    AT_PHNUM = 5
    AT_PAGESZ = 6
    AT_BASE = 7
    AT_FLAGS = 8
    AT_ENTRY = 9
    AT_UID = 11
    AT_EUID = 12
    AT_GID = 13
    AT_EGID = 14
    AT_PLATFORM = 15
    AT_HWCAP = 16
    AT_CLKTCK = 17
    AT_SECURE = 23
    AT_RANDOM = 25
    AT_HWCAP2 = 26
    AT_RSEQ_FEATURE_SIZE = 27
    AT_RSEQ_ALIGN = 28
    AT_EXECFN = 31
    AT_SYSINFO_EHDR = 33
    AT_MINSIGSTKSZ = 51


# mmap(2) flags
MAP_SHARED = 0x01
MAP_PRIVATE = 0x02
MAP_FIXED = 0x10
MAP_ANONYMOUS = 0x20
MAP_GROWSDOWN = 0x100
MAP_DENYWRITE = 0x800
MAP_NORESERVE = 0x4000
MAP_POPULATE = 0x8000
MAP_STACK = 0x20000
MAP_FIXED_NOREPLACE = 0x100000

MREMAP_MAYMOVE = 1
MREMAP_FIXED = 2
MREMAP_DONTUNMAP = 4

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_REMOVEDIR = 0x200
AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000

# open(2) flags
O_ACCMODE = 0o3
O_RDONLY = 0o0
O_WRONLY = 0o1
O_RDWR = 0o2
O_CREAT = 0o100
O_EXCL = 0o200
O_NOCTTY = 0o400
O_TRUNC = 0o1000
O_APPEND = 0o2000
O_NONBLOCK = 0o4000
O_DIRECTORY = 0o200000
O_NOFOLLOW = 0o400000
O_CLOEXEC = 0o2000000
O_PATH = 0o10000000
O_TMPFILE = 0o20200000

# Syscall numbers of the two uprobe syscalls (and the RFC's number), spec 2.
NR_URETPROBE = 335
NR_UPROBE = 336
NR_URETPROBE_RFC = 462
