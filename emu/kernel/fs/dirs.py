"""The working directory and directory listings: getcwd, chdir, fchdir, getdents64."""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel.errno_ import SyscallError
from emu.kernel.fs.namei import getname, lookup, stat_path
from emu.kernel.fs.read_write import MAX_IO

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


def sys_getcwd(k: Kernel, buf: int, size: int, *_: int) -> int:
    data = os.fsencode(k.vfs.cwd) + b"\0"
    if size < len(data):
        raise SyscallError(errno.ERANGE)
    k.mem.write_user(buf, data)
    return len(data)


def sys_chdir(k: Kernel, path_addr: int, *_: int) -> int:
    guest = lookup(k, abi.AT_FDCWD & 0xFFFFFFFF, getname(k, path_addr))
    if not stat.S_ISDIR(stat_path(k, guest).mode):
        raise SyscallError(errno.ENOTDIR)
    k.vfs.cwd = guest
    return 0


def sys_fchdir(k: Kernel, fd: int, *_: int) -> int:
    file = k.files.file(signed32(fd))
    if not file.is_directory:
        raise SyscallError(errno.ENOTDIR)
    k.vfs.cwd = file.guest_path
    return 0


def sys_getdents64(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    entry = k.files.get(signed32(fd))
    if entry.flags & abi.O_PATH:
        raise SyscallError(errno.EBADF)
    count = min(count & 0xFFFFFFFF, MAX_IO)
    k.mem.check_user(buf, count, abi.Prot.WRITE)
    data = entry.file.getdents(count)
    k.mem.write_user(buf, data)
    return len(data)
