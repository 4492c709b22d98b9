"""strace-style lines: ``openat(AT_FDCWD, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from emu import abi
from emu.kernel.errno_ import errno_name, errno_text
from emu.memory import Memory

MAX_STRING = 32
_OFLAGS = (
    (abi.O_CREAT, "O_CREAT"), (abi.O_EXCL, "O_EXCL"), (abi.O_NOCTTY, "O_NOCTTY"), (abi.O_TRUNC, "O_TRUNC"),
    (abi.O_APPEND, "O_APPEND"), (abi.O_NONBLOCK, "O_NONBLOCK"), (abi.O_DIRECTORY, "O_DIRECTORY"),
    (abi.O_NOFOLLOW, "O_NOFOLLOW"), (abi.O_CLOEXEC, "O_CLOEXEC"), (abi.O_PATH, "O_PATH"),
)
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
    names = [base] if base else []
    rest = value
    for bit, name in table:
        if value & bit:
            names.append(name)
            rest &= ~bit
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
        "oflags": lambda: _flags(value & ~abi.O_ACCMODE, _OFLAGS,
                                 ("O_RDONLY", "O_WRONLY", "O_RDWR", "O_ACCMODE")[value & abi.O_ACCMODE]),
        "prot": lambda: _flags(value, _PROT, None if value else "PROT_NONE"),
        "mflags": lambda: _flags(value & ~0xF, _MFLAGS,
                                 {1: "MAP_SHARED", 2: "MAP_PRIVATE", 3: "MAP_SHARED_VALIDATE"}.get(value & 0xF, hex(value & 0xF))),
        "ptr": lambda: "NULL" if value == 0 else hex(value),
        "sig": lambda: _signal(value),
        "how": lambda: {0: "SIG_BLOCK", 1: "SIG_UNBLOCK", 2: "SIG_SETMASK"}.get(value, str(value)),
        "amode": lambda: _flags(value, ((4, "R_OK"), (2, "W_OK"), (1, "X_OK")), None if value else "F_OK"),
        "mode": lambda: f"0{value:o}",
        "whence": lambda: {0: "SEEK_SET", 1: "SEEK_CUR", 2: "SEEK_END"}.get(value, str(value)),
    }
    return simple.get(kind, simple["x"])()


def format_call(name: str, kinds: Sequence[str], args: Sequence[int], ret: int, mem: Memory) -> str:
    shown = ", ".join(_format_arg(kind, args, i, mem, ret) for i, kind in enumerate(kinds))
    return f"{name}({shown}) = {format_result(name, ret)}"


def format_result(name: str, ret: int) -> str:
    if -4095 <= ret < 0:
        return f"-1 {errno_name(-ret)} ({errno_text(-ret)})"
    if name in _HEX_RESULTS:
        return hex(ret)
    return str(ret)
