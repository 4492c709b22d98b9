"""strace-style lines: ``openat(AT_FDCWD, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from emu import abi
from emu.kernel.errno_ import errno_name, errno_text
from emu.process.memory import Memory

MAX_STRING = 32
O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE; O_TMPFILE is this | O_DIRECTORY
# In the order strace 6.1 prints them (its xlat/open_mode_flags.in), so lines compare with real strace output.
_OFLAGS = (
    (abi.O_CREAT, "O_CREAT"), (abi.O_EXCL, "O_EXCL"), (abi.O_NOCTTY, "O_NOCTTY"), (abi.O_TRUNC, "O_TRUNC"),
    (abi.O_APPEND, "O_APPEND"), (abi.O_NONBLOCK, "O_NONBLOCK"), (0o4010000, "O_SYNC"), (0o10000, "O_DSYNC"),
    (0o40000, "O_DIRECT"), (0o100000, "O_LARGEFILE"), (abi.O_NOFOLLOW, "O_NOFOLLOW"), (0o1000000, "O_NOATIME"),
    (abi.O_CLOEXEC, "O_CLOEXEC"), (abi.O_PATH, "O_PATH"), (abi.O_TMPFILE, "O_TMPFILE"),
    (abi.O_DIRECTORY, "O_DIRECTORY"), (0o20000, "FASYNC"),
)
_ATFLAGS = (
    (abi.AT_SYMLINK_NOFOLLOW, "AT_SYMLINK_NOFOLLOW"), (abi.AT_REMOVEDIR, "AT_REMOVEDIR"),
    (abi.AT_SYMLINK_FOLLOW, "AT_SYMLINK_FOLLOW"), (0x800, "AT_NO_AUTOMOUNT"), (abi.AT_EMPTY_PATH, "AT_EMPTY_PATH"),
)
_STATX_SYNC = {0: "AT_STATX_SYNC_AS_STAT", 0x2000: "AT_STATX_FORCE_SYNC", 0x4000: "AT_STATX_DONT_SYNC"}
_STATX_MASK = (
    (0x7FF, "STATX_BASIC_STATS"), (0x1, "STATX_TYPE"), (0x2, "STATX_MODE"), (0x4, "STATX_NLINK"),
    (0x8, "STATX_UID"), (0x10, "STATX_GID"), (0x20, "STATX_ATIME"), (0x40, "STATX_MTIME"), (0x80, "STATX_CTIME"),
    (0x100, "STATX_INO"), (0x200, "STATX_SIZE"), (0x400, "STATX_BLOCKS"), (0x800, "STATX_BTIME"),
    (0x1000, "STATX_MNT_ID"), (0x2000, "STATX_DIOALIGN"),
)
_ARCH_PRCTL = {0x1001: "ARCH_SET_GS", 0x1002: "ARCH_SET_FS", 0x1003: "ARCH_GET_FS", 0x1004: "ARCH_GET_GS"}
_RLIMITS = ("RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_RSS",
            "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_AS", "RLIMIT_LOCKS", "RLIMIT_SIGPENDING",
            "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_RTPRIO", "RLIMIT_RTTIME")
_GRND = ((1, "GRND_NONBLOCK"), (2, "GRND_RANDOM"), (4, "GRND_INSECURE"))
_IOCTLS = {0x5401: "TCGETS", 0x5413: "TIOCGWINSZ", 0x540F: "TIOCGPGRP", 0x5421: "FIONBIO", 0x541B: "FIONREAD",
           0x5450: "FIONCLEX", 0x5451: "FIOCLEX"}
_FCNTL = {0: "F_DUPFD", 1: "F_GETFD", 2: "F_SETFD", 3: "F_GETFL", 4: "F_SETFL", 1030: "F_DUPFD_CLOEXEC"}
# Argument kinds by syscall name where the table row says less than strace shows (the rows stay as they are).
_KIND_OVERRIDES: dict[str, dict[int, str]] = {
    "newfstatat": {3: "atflags"},
    "statx": {2: "statxflags", 3: "statxmask"},
    "arch_prctl": {0: "arch"},
    "prlimit64": {1: "rlimit"},
    "getrlimit": {0: "rlimit"},
    "getrandom": {2: "grnd"},
    "ioctl": {1: "ioctl"},
    "fcntl": {1: "fcntl"},
    "faccessat2": {3: "atflags"},
}
_OPENS = frozenset({"open", "openat"})
_MFLAGS = (
    (abi.MAP_FIXED, "MAP_FIXED"), (abi.MAP_ANONYMOUS, "MAP_ANONYMOUS"), (abi.MAP_GROWSDOWN, "MAP_GROWSDOWN"),
    (abi.MAP_DENYWRITE, "MAP_DENYWRITE"), (abi.MAP_NORESERVE, "MAP_NORESERVE"), (abi.MAP_POPULATE, "MAP_POPULATE"),
    (abi.MAP_STACK, "MAP_STACK"), (abi.MAP_FIXED_NOREPLACE, "MAP_FIXED_NOREPLACE"),
)
_PROT = ((1, "PROT_READ"), (2, "PROT_WRITE"), (4, "PROT_EXEC"))
_HEX_RESULTS = frozenset({"mmap", "brk", "mremap"})


def quote(data: bytes, limit: int = MAX_STRING) -> str:
    out = []
    for byte in data[:limit]:
        ch = chr(byte)
        if ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch in "\"\\":
            out.append("\\" + ch)
        elif 32 <= byte < 127:
            out.append(ch)
        else:
            out.append(f"\\{byte:o}")
    return '"' + "".join(out) + '"' + ("..." if len(data) > limit else "")


def _flags(value: int, table: Sequence[tuple[int, str]], base: str | None) -> str:
    """``base|NAME|NAME|0x...``; a table entry matches when all of its bits are still set."""
    names = [base] if base else []
    rest = value
    for bits, name in table:
        if rest & bits == bits:
            names.append(name)
            rest &= ~bits
    if rest:
        names.append(hex(rest))
    return "|".join(names) or "0"


def _s32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _s64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _string(mem: Memory, addr: int) -> str:
    try:
        return quote(mem.read_cstring(addr, 4096), 4096)
    except Exception:
        return hex(addr)


def _buffer(mem: Memory, addr: int, size: int) -> str:
    try:
        return quote(mem.read(addr, min(size, MAX_STRING + 1)))
    except Exception:
        return hex(addr)


def _signal(value: int) -> str:
    try:
        return abi.Signal(value).name
    except ValueError:
        return str(value)


def _format_arg(kind: str, args: Sequence[int], i: int, mem: Memory, ret: int) -> str:
    value = args[i]
    simple: dict[str, Callable[[], str]] = {
        "d": lambda: str(_s64(value)),
        "u": lambda: str(value),
        "x": lambda: hex(value),
        "fd": lambda: str(_s32(value)),
        "dirfd": lambda: "AT_FDCWD" if _s32(value) == abi.AT_FDCWD else str(_s32(value)),
        "path": lambda: _string(mem, value),
        "wbuf": lambda: _buffer(mem, value, args[i + 1]),
        "rbuf": lambda: _buffer(mem, value, ret) if ret >= 0 else hex(value),
        "oflags": lambda: _oflags(value),
        "prot": lambda: _flags(value, _PROT, None if value else "PROT_NONE"),
        "mflags": lambda: _flags(value & ~0xF, _MFLAGS, _MAP_TYPES.get(value & 0xF, hex(value & 0xF))),
        "atflags": lambda: _flags(value & 0xFFFFFFFF, _ATFLAGS, None),
        "statxflags": lambda: _flags(value & 0xFFFFFFFF & ~0x6000, _ATFLAGS,
                                     _STATX_SYNC.get(value & 0x6000, hex(value & 0x6000))),
        "statxmask": lambda: _flags(value & 0xFFFFFFFF, _STATX_MASK, None),
        "arch": lambda: _ARCH_PRCTL.get(value, hex(value)),
        "rlimit": lambda: _RLIMITS[value] if value < len(_RLIMITS) else str(value),
        "grnd": lambda: _flags(value, _GRND, None),
        "ioctl": lambda: _IOCTLS.get(value & 0xFFFFFFFF, hex(value)),
        "fcntl": lambda: _FCNTL.get(value, str(value)),
        "ptr": lambda: "NULL" if value == 0 else hex(value),
        "sig": lambda: _signal(value),
        "how": lambda: {0: "SIG_BLOCK", 1: "SIG_UNBLOCK", 2: "SIG_SETMASK"}.get(value, str(value)),
        "amode": lambda: _flags(value, ((4, "R_OK"), (2, "W_OK"), (1, "X_OK")), None if value else "F_OK"),
        "mode": lambda: _mode(value),
        "whence": lambda: {0: "SEEK_SET", 1: "SEEK_CUR", 2: "SEEK_END"}.get(value, str(value)),
    }
    return simple.get(kind, simple["x"])()


_MAP_TYPES = {1: "MAP_SHARED", 2: "MAP_PRIVATE", 3: "MAP_SHARED_VALIDATE"}


def _oflags(value: int) -> str:
    value &= 0xFFFFFFFF
    access = ("O_RDONLY", "O_WRONLY", "O_RDWR", "O_ACCMODE")[value & abi.O_ACCMODE]
    return _flags(value & ~abi.O_ACCMODE, _OFLAGS, access)


def _mode(value: int) -> str:
    """strace's ``%#03o``: 0644, 000, 0755."""
    return (f"0{value:o}" if value else "0").rjust(3, "0")


def _kinds(name: str, kinds: Sequence[str], args: Sequence[int]) -> list[str]:
    shown = list(kinds)
    for i, kind in _KIND_OVERRIDES.get(name, {}).items():
        if i < len(shown):
            shown[i] = kind
    if name in _OPENS and "oflags" in shown:
        flags = args[shown.index("oflags")]
        if not flags & (abi.O_CREAT | O_TMPFILE_BIT) and shown[-1] == "mode":
            shown.pop()  # like strace: the mode is only meaningful (and only shown) when creating
    return shown


def format_call(name: str, kinds: Sequence[str], args: Sequence[int], ret: int, mem: Memory) -> str:
    shown = ", ".join(_format_arg(kind, args, i, mem, ret) for i, kind in enumerate(_kinds(name, kinds, args)))
    return f"{name}({shown}) = {format_result(name, ret)}"


def format_result(name: str, ret: int) -> str:
    if -4095 <= ret < 0:
        return f"-1 {errno_name(-ret)} ({errno_text(-ret)})"
    if name in _HEX_RESULTS:
        return hex(ret)
    return str(ret)
