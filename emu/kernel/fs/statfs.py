"""statfs, fstatfs (fs/statfs.c): the host's values with ST_RDONLY set as the sandbox mounts them;
procfs and pipes as the kernel's own file systems."""

from __future__ import annotations

import ctypes
import os
import struct
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel import procfs
from emu.kernel.files import STATFS_SIZE, SYS_FSTATFS, SYS_STATFS, Device, HostFile, Stream, host_syscall
from emu.kernel.fs.namei import getname, lookup
from emu.kernel.overlay_files import OverlayFile
from emu.kernel.pipe import PipeEnd

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


ST_RDONLY = 1  # statfs f_flags: the sandbox mounts everything read-only


ST_NOSUID, ST_NODEV = 2, 4


PROC_SUPER_MAGIC, PIPEFS_MAGIC = 0x9FA0, 0x50495045


STATFS_FLAGS_OFFSET = 88  # f_flags in struct statfs (x86-64)


def _synthetic_statfs(magic: int, flags: int = ST_RDONLY | ST_NOSUID | ST_NODEV) -> bytes:
    """struct statfs of a kernel-made file system (procfs, pipefs, tmpfs): no blocks, 255-byte names."""
    return struct.pack("<qqqqqqqiiqqq4q", magic, 4096, 0, 0, 0, 0, 0, 0, 0, 255, 4096, flags, 0, 0, 0, 0)


def _host_statfs(target: int | str, read_only: bool = True) -> bytes:
    """The host's struct statfs (120 bytes), with ST_RDONLY set when the sandbox mounts it read-only."""
    buf = ctypes.create_string_buffer(STATFS_SIZE)
    if isinstance(target, int):
        host_syscall(SYS_FSTATFS, target, buf)
    else:
        host_syscall(SYS_STATFS, os.fsencode(target), buf)
    raw = bytearray(buf.raw)
    (flags,) = struct.unpack_from("<q", raw, STATFS_FLAGS_OFFSET)
    struct.pack_into("<q", raw, STATFS_FLAGS_OFFSET, flags | ST_RDONLY if read_only else flags & ~ST_RDONLY)
    return bytes(raw)


def sys_statfs(k: Kernel, path_addr: int, buf: int, *_: int) -> int:
    guest = lookup(k, abi.AT_FDCWD & 0xFFFFFFFF, getname(k, path_addr))
    k.mem.write_user(buf, _statfs_of(k, guest))
    return 0


def _statfs_of(k: Kernel, guest: str) -> bytes:
    if procfs.stat_of(k, guest) is not None:
        return _synthetic_statfs(PROC_SUPER_MAGIC)
    host = k.vfs.host_of(guest)
    while host is None:  # a name only the guest's layer holds: the file system of its nearest host directory
        guest = guest.rpartition("/")[0] or "/"
        host = k.vfs.host_of(guest)
    return _host_statfs(host, k.vfs.overlay is None)


def sys_fstatfs(k: Kernel, fd: int, buf: int, *_: int) -> int:
    file = k.files.file(signed32(fd))
    if isinstance(file, OverlayFile):
        data = _statfs_of(k, file.guest_path.rpartition("/")[0] or "/")  # its directory's file system
    elif isinstance(file, HostFile):
        data = _host_statfs(file.fd, k.vfs.overlay is None)
    elif isinstance(file, Device) and file.host_path is not None:
        data = _host_statfs(file.host_path)
    elif file.host_fd() is not None:
        data = _host_statfs(file.host_fd())  # type: ignore[arg-type]
    else:
        data = _synthetic_statfs(PIPEFS_MAGIC if isinstance(file, PipeEnd | Stream) else PROC_SUPER_MAGIC)
    k.mem.write_user(buf, data)
    return 0
