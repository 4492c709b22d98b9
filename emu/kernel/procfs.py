"""/proc/self (and /proc/<pid>, /proc/thread-self) as the guest sees itself, never the host's."""

from __future__ import annotations

import errno
import re
import stat
import struct
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError
from emu.kernel.vfs import MemFile, OpenFile, StatInfo, synthetic_stat

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

_SELF = re.compile(r"^/proc/(self|thread-self|\d+)(/.*)?$")
_DIRS = ("", "/fd")
_LINKS = ("/exe", "/cwd", "/root")
_FD_LINK = re.compile(r"^/fd/(\d+)$")


def _normalize(path: str) -> str:
    parts: list[str] = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if parts:
                parts.pop()
        else:
            parts.append(comp)
    return "/" + "/".join(parts)


def canonical(k: Kernel, absolute: str) -> str | None:
    """``/proc/self/...`` with the pid spelled as the guest's own; None for everything else."""
    path = _normalize(absolute)
    match = _SELF.match(path)
    if match is None:
        return None
    who = match.group(1)
    if who.isdigit() and int(who) != k.ident.pid:
        return None
    return f"/proc/{k.ident.pid}{match.group(2) or ''}"


def _tail(k: Kernel, guest: str) -> str | None:
    prefix = f"/proc/{k.ident.pid}"
    if guest == prefix or guest.startswith(prefix + "/"):
        return guest[len(prefix):]
    return None


def readlink(k: Kernel, guest: str) -> str | None:
    tail = _tail(k, guest)
    if tail is None:
        return None
    if tail == "/exe":
        return k.ident.exe
    if tail == "/cwd":
        return k.vfs.cwd
    if tail == "/root":
        return "/"
    match = _FD_LINK.match(tail)
    if match:
        return k.files.file(int(match.group(1))).guest_path
    return None


def follow(k: Kernel, guest: str) -> str:
    """Resolve the magic links (exe, cwd, fd/N) the way open() follows them."""
    target = readlink(k, guest)
    if target is None or not target.startswith("/"):
        return guest
    return k.vfs.resolve(target)


def _content(k: Kernel, tail: str) -> bytes | None:
    if tail == "/maps":
        return k.mem.maps_text().encode()
    if tail == "/auxv":
        return b"".join(struct.pack("<QQ", key, value) for key, value in k.ident.auxv)
    if tail == "/cmdline":
        return b"".join(arg + b"\0" for arg in k.ident.argv)
    if tail == "/environ":
        return b"".join(env + b"\0" for env in k.ident.envp)
    if tail == "/comm":
        return k.ident.exe.rsplit("/", 1)[-1][:15].encode() + b"\n"
    if tail == "/status":
        return _status(k).encode()
    return None


def _status(k: Kernel) -> str:
    i = k.ident
    name = i.exe.rsplit("/", 1)[-1][:15]
    return (
        f"Name:\t{name}\nUmask:\t{k.umask:04o}\nState:\tR (running)\nTgid:\t{i.pid}\nNgid:\t0\n"
        f"Pid:\t{i.pid}\nPPid:\t{i.ppid}\nTracerPid:\t0\nUid:\t{i.uid}\t{i.uid}\t{i.uid}\t{i.uid}\n"
        f"Gid:\t{i.gid}\t{i.gid}\t{i.gid}\t{i.gid}\nThreads:\t1\n"
    )


def open_file(k: Kernel, guest: str) -> OpenFile | None:
    tail = _tail(k, guest)
    if tail is None:
        return None
    content = _content(k, tail)
    if content is None:
        raise SyscallError(errno.EISDIR if tail in _DIRS else errno.ENOENT)
    return MemFile(guest, content)


def stat_of(k: Kernel, guest: str) -> StatInfo | None:
    tail = _tail(k, guest)
    if tail is None:
        return None
    if tail in _DIRS:
        return synthetic_stat(stat.S_IFDIR | 0o555)
    if tail in _LINKS or _FD_LINK.match(tail):
        return synthetic_stat(stat.S_IFLNK | 0o777)
    if _content(k, tail) is not None:
        return synthetic_stat(stat.S_IFREG | 0o444)
    raise SyscallError(errno.ENOENT)
